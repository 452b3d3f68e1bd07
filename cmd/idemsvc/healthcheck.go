// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"

	"github.com/idemsvc/idemsvc/internal/cli"
)

// healthcheck asks the idemsvc that the same configuration (IDEMSVC_*
// variables and flags) describes, on this host, whether it is alive (GET
// /healthz), for a container's HEALTHCHECK: distroless images have no shell
// or curl. It returns the process's exit status: 0 when it answered 200.
//
// Over HTTPS it accepts only the certificate of tls-cert-file, whatever
// names that certificate holds, and presents it as its client certificate
// when tls-client-ca-file asks for one, so the probe passes only where that
// CA signed it.
func healthcheck(args, env []string, out io.Writer) int {
	cfg, err := parseConfig(args, env)
	if err != nil {
		fmt.Fprintf(out, "idemsvc healthcheck: %v\n", err)
		return 1
	}
	var tlsConfig *tls.Config
	if cfg.tlsCertFile != "" {
		if tlsConfig, err = selfTLS(&cfg); err != nil {
			fmt.Fprintf(out, "idemsvc healthcheck: %v\n", err)
			return 1
		}
	}
	if err := cli.CheckHealth(cfg.listen, tlsConfig); err != nil {
		fmt.Fprintf(out, "idemsvc healthcheck: %v\n", err)
		return 1
	}
	return 0
}

// selfTLS trusts exactly the certificate idemsvc serves with.
func selfTLS(cfg *config) (*tls.Config, error) {
	own, err := tls.LoadX509KeyPair(cfg.tlsCertFile, cfg.tlsKeyFile)
	if err != nil {
		return nil, fmt.Errorf("tls-cert-file and tls-key-file: %w", err)
	}
	t := &tls.Config{
		MinVersion: tls.VersionTLS12,
		// The chain and names are not verified: the peer must present the
		// very certificate of tls-cert-file instead, checked below.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 || !bytes.Equal(cs.PeerCertificates[0].Raw, own.Certificate[0]) {
				return errors.New("the server does not present tls-cert-file's certificate")
			}
			return nil
		},
	}
	if cfg.tlsClientCAFile != "" {
		t.Certificates = []tls.Certificate{own}
	}
	return t, nil
}
