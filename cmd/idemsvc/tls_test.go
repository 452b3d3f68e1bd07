// SPDX-License-Identifier: Apache-2.0

package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
	"github.com/idemsvc/idemsvc/internal/testkit/testpki"
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
	resp, err := http.Get("http://" + strings.TrimPrefix(in.url, "https://") + "/v1/status?key=over-tls")
	if err != nil {
		t.Fatalf("plain HTTP to the HTTPS port: %v, want a 400", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("plain HTTP to the HTTPS port = %d %s, want a 400 problem", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	old := &tls.Config{RootCAs: ca.Pool(), MaxVersion: tls.VersionTLS11}
	if conn, err := tls.Dial("tcp", strings.TrimPrefix(in.url, "https://"), old); err == nil {
		conn.Close()
		t.Error("a TLS 1.1 client was served")
	}
	if _, err := servedName(t, in.url, x509.NewCertPool()); err == nil {
		t.Error("a client without the CA accepted the certificate")
	}
	idemtest.Eventually(t, 5*time.Second, "the failed handshake in the log", func() bool {
		return strings.Contains(in.logs.String(), `"msg":"TLS handshake failed"`)
	})
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
	// The console is served on the same listener, to the same clients:
	// its page, its script and the API it calls.
	browser := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool(),
		Certificates: []tls.Certificate{ca.Issue(t, "operator").TLS(t)}}}}
	for _, path := range []string{"/console/", "/console/console.js", "/v1/usage"} {
		resp, err := browser.Get(in.url + path)
		if err != nil {
			t.Fatalf("GET %s with a client certificate: %v", path, err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK || (path != "/v1/usage" && resp.Header.Get("Content-Security-Policy") == "") {
			t.Errorf("GET %s with a client certificate: %d %v", path, resp.StatusCode, resp.Header)
		}
	}
	if _, err := (&http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}).Get(in.url + "/console/"); err == nil {
		t.Error("the console was served to a client without a certificate")
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

// idemsvc reaches Redis over TLS as an ACL user, presenting a client
// certificate and verifying Redis's, in all three modes; without any one
// of them it is refused and answers 503.
func TestRedisTLS(t *testing.T) {
	sec := redistest.NewSecurity(t)
	tenants := idemtest.TenantsFile(t, idemtest.Tenant{Name: "payments", Key: "tls-key"})
	settings := map[string]string{
		"IDEMSVC_REDIS_TLS_CA_FILE":   sec.CAFile,
		"IDEMSVC_REDIS_TLS_CERT_FILE": sec.ClientCertFile,
		"IDEMSVC_REDIS_TLS_KEY_FILE":  sec.ClientKeyFile,
		"IDEMSVC_REDIS_USERNAME":      sec.Username,
		"IDEMSVC_REDIS_PASSWORD":      sec.Password,
		"IDEMSVC_TENANTS_FILE":        tenants,
	}
	env := func(more ...string) []string {
		var out []string
		for k, v := range settings {
			out = append(out, k+"="+v)
		}
		return append(out, more...)
	}
	cycle := func(t *testing.T, in *instance) {
		t.Helper()
		key := fmt.Sprintf(`{"key":"tls-%d","owner":"o"}`, time.Now().UnixNano())
		code, begun := post(t, in.url+"/v1/begin", "tls-key", key)
		if code != http.StatusCreated {
			t.Fatalf("begin = %d %v", code, begun)
		}
		complete := fmt.Sprintf(`{"key":%q,"lease_token":%q,"response":{"status_code":201,"body":"paid"}}`, begun["key"], begun["lease_token"])
		if code, body := post(t, in.url+"/v1/complete", "tls-key", complete); code != http.StatusOK {
			t.Fatalf("complete = %d %v", code, body)
		}
		if code, body := post(t, in.url+"/v1/begin", "tls-key", key); code != http.StatusOK || body["status"] != "completed" {
			t.Fatalf("replay = %d %v", code, body)
		}
		if code, body := readyz(t, in.url); code != http.StatusOK {
			t.Errorf("readyz = %d %s", code, body)
		}
		if strings.Contains(in.logs.String(), sec.Password) {
			t.Error("the logs hold the Redis password")
		}
	}

	t.Run("standalone", func(t *testing.T) {
		addr := redistest.NewSecureServer(t, sec).Addr()
		url := "IDEMSVC_REDIS_URL=rediss://" + addr
		cycle(t, start(t, nil, env(url)))
		cycle(t, start(t, nil, env("IDEMSVC_REDIS_URL=REDISS://"+addr))) // schemes are case-insensitive

		// Without the client certificate, the CA or the password, Redis
		// or idemsvc refuses the connection: 503, never a served call.
		for name, change := range map[string]map[string]string{
			"no client certificate": {"IDEMSVC_REDIS_TLS_CERT_FILE": "", "IDEMSVC_REDIS_TLS_KEY_FILE": ""},
			"the system's CAs":      {"IDEMSVC_REDIS_TLS_CA_FILE": ""},
			"a wrong password":      {"IDEMSVC_REDIS_PASSWORD": "wrong"},
		} {
			saved := maps.Clone(settings)
			maps.Copy(settings, change)
			in := start(t, nil, env(url, "IDEMSVC_REDIS_TIMEOUT_MS=300"))
			settings = saved
			if code, body := post(t, in.url+"/v1/begin", "tls-key", `{"key":"refused"}`); code != http.StatusServiceUnavailable {
				t.Errorf("%s: begin = %d %v, want 503", name, code, body)
			}
		}
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.NewClusterWith(t, redistest.ClusterOptions{Security: sec})
		cycle(t, start(t, nil, env("IDEMSVC_REDIS_TLS=true", "IDEMSVC_REDIS_CLUSTER_ADDRS="+c.Addrs()[0])))
	})
	t.Run("sentinel", func(t *testing.T) {
		st := redistest.NewSentinelWith(t, redistest.SentinelOptions{Security: sec})
		cycle(t, start(t, nil, env("IDEMSVC_REDIS_TLS=true",
			"IDEMSVC_REDIS_SENTINEL_ADDRS="+strings.Join(st.Addrs(), ","), "IDEMSVC_REDIS_SENTINEL_MASTER="+st.MasterName())))
	})
}
