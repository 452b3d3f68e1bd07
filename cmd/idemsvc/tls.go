// SPDX-License-Identifier: Apache-2.0

package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// tlsRecheck is how often, at most, a TLS handshake checks whether the
// certificate files changed. Renewed files reach new connections within it.
const tlsRecheck = 5 * time.Second

// servingTLS is the TLS configuration of idemsvc's listener, built from
// its files and built again when a handshake finds that they changed (a
// renewed certificate, say), so renewals need no restart. A change that
// does not load (a certificate renewed before its key, say) keeps the
// configuration in force and is logged.
type servingTLS struct {
	certFile, keyFile, clientCAFile string
	log                             *slog.Logger

	mu      sync.Mutex
	checked time.Time
	stamp   string // the files' sizes and modification times
	current *tls.Config
}

// newServingTLS loads the files; an error means idemsvc cannot serve.
func newServingTLS(certFile, keyFile, clientCAFile string, log *slog.Logger) (*servingTLS, error) {
	s := &servingTLS{certFile: certFile, keyFile: keyFile, clientCAFile: clientCAFile, log: log}
	stamp, err := s.stampFiles()
	if err != nil {
		return nil, err
	}
	if s.current, err = s.load(); err != nil {
		return nil, err
	}
	s.stamp, s.checked = stamp, time.Now()
	return s, nil
}

// Config is the listener's configuration: every handshake takes the
// current files' configuration.
func (s *servingTLS) Config() *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		GetConfigForClient: s.forClient,
	}
}

func (s *servingTLS) forClient(*tls.ClientHelloInfo) (*tls.Config, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if time.Since(s.checked) < tlsRecheck {
		return s.current, nil
	}
	s.checked = time.Now()
	stamp, err := s.stampFiles()
	if err != nil || stamp == s.stamp {
		if err != nil {
			s.log.Error("TLS: cannot read the certificate files; serving the ones loaded before", "error", err.Error())
		}
		return s.current, nil
	}
	cfg, err := s.load()
	if err != nil {
		s.log.Error("TLS: the changed certificate files do not load; serving the ones loaded before", "error", err.Error())
		return s.current, nil
	}
	s.stamp, s.current = stamp, cfg
	s.log.Info("TLS: certificate files loaded again")
	return cfg, nil
}

// load builds the configuration from the files.
func (s *servingTLS) load() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(s.certFile, s.keyFile)
	if err != nil {
		return nil, fmt.Errorf("tls-cert-file and tls-key-file: %w", err)
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		// HTTP/1.1 only: the connection cap, the write deadlines of
		// streamed replays and the bounded memory hold per connection.
		NextProtos: []string{"http/1.1"},
	}
	if s.clientCAFile != "" {
		pool, err := certPool(s.clientCAFile)
		if err != nil {
			return nil, fmt.Errorf("tls-client-ca-file: %w", err)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// stampFiles says which version of the files is on disk.
func (s *servingTLS) stampFiles() (string, error) {
	stamp := ""
	for _, name := range []string{s.certFile, s.keyFile, s.clientCAFile} {
		if name == "" {
			continue
		}
		fi, err := os.Stat(name) // follows symlinks, as Kubernetes swaps Secret files
		if err != nil {
			return "", err
		}
		stamp += fmt.Sprintf("%d.%d;", fi.Size(), fi.ModTime().UnixNano())
	}
	return stamp, nil
}

// certPool reads the PEM certificates of file.
func certPool(file string) (*x509.CertPool, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, errors.New(file + " holds no PEM certificate")
	}
	return pool, nil
}

// redisTLS is the TLS configuration of connections to Redis: the CA file's
// certificates (the system's when none is given), and a client
// certificate when one is given. Certificates are always verified.
func redisTLS(cfg *config) (*tls.Config, error) {
	t := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.redisTLSCAFile != "" {
		pool, err := certPool(cfg.redisTLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("redis-tls-ca-file: %w", err)
		}
		t.RootCAs = pool
	}
	if cfg.redisTLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.redisTLSCertFile, cfg.redisTLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("redis-tls-cert-file and redis-tls-key-file: %w", err)
		}
		t.Certificates = []tls.Certificate{cert}
	}
	return t, nil
}
