package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/testpki"
)

// servedName is the common name of the certificate a new connection to
// url's host is served, with the CA pool roots.
func servedName(t *testing.T, url string, roots *x509.CertPool, client ...tls.Certificate) (string, error) {
	t.Helper()
	conn, err := tls.Dial("tcp", strings.TrimPrefix(url, "https://"), &tls.Config{RootCAs: roots, Certificates: client})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	// TLS 1.3 reports a refused client certificate only on the first read.
	_ = conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := conn.Read(make([]byte, 1)); err != nil && !errors.Is(err, errTimeout(err)) {
		return "", err
	}
	return conn.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
}

// errTimeout returns err when it is a timeout, so that errors.Is accepts it.
func errTimeout(err error) error {
	var te interface{ Timeout() bool }
	if errors.As(err, &te) && te.Timeout() {
		return err
	}
	return nil
}

// With a certificate and key, idemsvc serves HTTPS only, TLS 1.2 and up,
// and serves renewed files to new connections without a restart; a
// renewal caught half-way (a new certificate, the old key) keeps the files
// in force and is logged.
func TestHTTPS(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "idemsvc test CA")
	caFile := ca.Write(t, dir, "ca")
	certFile, keyFile := ca.Issue(t, "first").Write(t, dir, "idemsvc")
	in := start(t, nil, []string{"IDEMSVC_TLS_CERT_FILE=" + certFile, "IDEMSVC_TLS_KEY_FILE=" + keyFile})
	if !strings.HasPrefix(in.url, "https://") {
		t.Fatalf("idemsvc serves %s, want https", in.url)
	}
	if strings.Contains(in.logs.String(), "TLS is off") {
		t.Error("idemsvc warns that TLS is off while serving HTTPS")
	}

	client, err := idem.New(in.url, idem.WithTLSFiles(caFile, "", ""))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Begin(t.Context(), idem.BeginParams{Key: "over-tls"}); err != nil {
		t.Fatalf("begin over HTTPS: %v", err)
	}
	resp, err := http.Get("http://" + strings.TrimPrefix(in.url, "https://") + "/v1/status/over-tls")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain HTTP to the HTTPS port = %d, want 400", resp.StatusCode)
		}
	}
	old := &tls.Config{RootCAs: ca.Pool(), MaxVersion: tls.VersionTLS11}
	if conn, err := tls.Dial("tcp", strings.TrimPrefix(in.url, "https://"), old); err == nil {
		conn.Close()
		t.Error("a TLS 1.1 client was served")
	}
	if _, err := servedName(t, in.url, x509.NewCertPool()); err == nil {
		t.Error("a client without the CA accepted the certificate")
	}
	if code := healthcheck(nil, []string{"IDEMSVC_LISTEN=" + strings.TrimPrefix(in.url, "https://"),
		"IDEMSVC_TLS_CERT_FILE=" + certFile, "IDEMSVC_TLS_KEY_FILE=" + keyFile}, t.Output()); code != 0 {
		t.Errorf("healthcheck over HTTPS = %d", code)
	}

	// Renewed half-way: the new certificate does not match the old key.
	renewed := ca.Issue(t, "renewed")
	testpki.WriteFile(t, certFile, renewed.CertPEM)
	waitFor(t, "the half-renewed files to be refused in the log", func() bool {
		if name, err := servedName(t, in.url, ca.Pool()); err != nil || name != "first" {
			t.Fatalf("during a half-done renewal idemsvc serves %q, %v; want the first certificate", name, err)
		}
		return strings.Contains(in.logs.String(), "the changed certificate files do not load")
	})
	testpki.WriteFile(t, keyFile, renewed.KeyPEM)
	deadline := time.Now().Add(30 * time.Second)
	for {
		name, err := servedName(t, in.url, ca.Pool())
		if err != nil {
			t.Fatal(err)
		}
		if name == "renewed" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the renewed certificate was not served within 30 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := client.Status(t.Context(), "over-tls", false); err != nil {
		t.Errorf("status after the renewal: %v", err)
	}
}

// With a client CA, idemsvc serves only clients whose certificate that CA
// signed; the SDK presents one from files.
func TestHTTPSClientCertificates(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "idemsvc test CA")
	caFile := ca.Write(t, dir, "ca")
	certFile, keyFile := ca.Issue(t, "idemsvc").Write(t, dir, "idemsvc")
	clientCert, clientKey := ca.Issue(t, "caller").Write(t, dir, "caller")
	stranger := testpki.NewCA(t, "another CA").Issue(t, "stranger")
	env := []string{"IDEMSVC_TLS_CERT_FILE=" + certFile, "IDEMSVC_TLS_KEY_FILE=" + keyFile, "IDEMSVC_TLS_CLIENT_CA_FILE=" + caFile}
	in := start(t, nil, env)

	if _, err := servedName(t, in.url, ca.Pool()); err == nil {
		t.Error("a client without a certificate was served")
	}
	if _, err := servedName(t, in.url, ca.Pool(), stranger.TLS(t)); err == nil {
		t.Error("a client whose certificate another CA signed was served")
	}
	client, err := idem.New(in.url, idem.WithTLSFiles(caFile, clientCert, clientKey))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Begin(t.Context(), idem.BeginParams{Key: "mutual"}); err != nil {
		t.Fatalf("begin with a client certificate: %v", err)
	}
	if _, err := idem.New(in.url, idem.WithTLSFiles(caFile, clientCert, "")); err == nil {
		t.Error("New accepted a client certificate without its key")
	}
	if code := healthcheck(nil, append(env, "IDEMSVC_LISTEN="+strings.TrimPrefix(in.url, "https://")), t.Output()); code != 0 {
		t.Errorf("healthcheck with client certificates required = %d", code)
	}
}

// Without TLS, idemsvc says at start that keys cross the network in clear.
func TestPlainHTTPWarns(t *testing.T) {
	in := start(t, nil, nil)
	if !strings.Contains(in.logs.String(), "TLS is off: API keys and stored responses cross the network in clear") {
		t.Errorf("no warning that TLS is off:\n%s", in.logs.String())
	}
}
