// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/logbuf"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

func TestMain(m *testing.M) {
	if os.Getenv("IDEMSVC_TEST_RUN_MAIN") == "1" {
		main() // the test binary stands in for idemsvc: see TestSIGTERM
		return
	}
	limitMemory = func(int64, []string) int64 { return 0 }
	redistest.Main(m)
}

func TestConfig(t *testing.T) {
	env := []string{"IDEMSVC_LISTEN=:9000", "IDEMSVC_REDIS_WAIT_REPLICAS=2", "IDEMSVC_REDIS_CLUSTER_ADDRS=a:1, b:2,", "PATH=/bin"}
	c, err := parseConfig([]string{"--listen", "127.0.0.1:9001"}, env)
	if err != nil {
		t.Fatal(err)
	}
	if c.listen != "127.0.0.1:9001" {
		t.Errorf("listen = %q: the flag overrides the variable", c.listen)
	}
	if c.redisWaitReplicas != 2 || c.redisWaitTimeout != time.Second {
		t.Errorf("wait = %d, %v", c.redisWaitReplicas, c.redisWaitTimeout)
	}
	if strings.Join(c.redisClusterAddrs, "|") != "a:1|b:2" {
		t.Errorf("cluster addrs = %q", c.redisClusterAddrs)
	}
	if !c.usesRedis() {
		t.Error("usesRedis = false")
	}
	if c.maxConnections != 10000 {
		t.Errorf("max connections = %d, want the default 10000", c.maxConnections)
	}

	c, err = parseConfig(nil, []string{"IDEMSVC_MAX_CONNECTIONS=5", "IDEMSVC_MAX_KEY_BYTES=64", "IDEMSVC_DEFAULT_LEASE_MS=5000", "IDEMSVC_REDIS_ULR=redis://x:1", "IDEMSVC_API_KEY=k"})
	if err != nil {
		t.Fatal(err)
	}
	if c.limits.MaxKeyBytes != 64 || c.limits.DefaultLease != 5*time.Second || c.maxRequestBytes != 2<<20 || c.maxConnections != 5 {
		t.Errorf("limits = %+v, max request %d", c.limits, c.maxRequestBytes)
	}
	// A URL scheme in capitals still asks for TLS.
	if _, err := parseConfig(nil, []string{"IDEMSVC_REDIS_URL=REDISS://x:1", "IDEMSVC_REDIS_TLS_CA_FILE=ca.pem", "IDEMSVC_INSECURE_NO_AUTH=true"}); err != nil {
		t.Errorf("REDISS:// with a CA file: %v", err)
	}
	if c, err := parseConfig(nil, []string{"IDEMSVC_TRUSTED_PROXIES=10.1.0.0/16, 192.0.2.7,::1"}); err != nil ||
		fmt.Sprint(c.trustedProxies) != "[10.1.0.0/16 192.0.2.7/32 ::1/128]" {
		t.Errorf("trusted proxies = %v, %v", c.trustedProxies, err)
	}
	if strings.Join(c.unknownVars, ",") != "IDEMSVC_REDIS_ULR" {
		t.Errorf("unknown variables = %q, want the misspelt one only", c.unknownVars)
	}

	// A value that is not a number is one error, not a second about its range.
	if _, err := parseConfig(nil, []string{"IDEMSVC_MAX_CONNECTIONS=many"}); err == nil || strings.Contains(err.Error(), "\n") ||
		!strings.Contains(err.Error(), "IDEMSVC_MAX_CONNECTIONS") {
		t.Errorf("a non-numeric value: %v; want one error naming the variable", err)
	}

	// Development mode listens on loopback unless told where to listen.
	for _, tt := range []struct {
		args, env []string
		want      string
	}{
		{nil, nil, "127.0.0.1:8080"},
		{nil, []string{"IDEMSVC_LISTEN=:8080"}, ":8080"},
		{[]string{"--listen", ":9000"}, nil, ":9000"},
		{[]string{"--tenants-file", "t.yaml"}, nil, ":8080"},
		{nil, []string{"IDEMSVC_REDIS_URL=redis://x:1", "IDEMSVC_INSECURE_NO_AUTH=true"}, ":8080"},
	} {
		if c, err := parseConfig(tt.args, tt.env); err != nil || c.listen != tt.want {
			t.Errorf("parseConfig(%q, %q): listen %q, %v; want %s", tt.args, tt.env, c.listen, err, tt.want)
		}
	}

	// Neither an error nor the usage shows a value from the environment.
	secretEnv := []string{"IDEMSVC_REDIS_PASSWORD=hunter2", "IDEMSVC_REDIS_URL=redis://:hunter2@h:1", "IDEMSVC_REDIS_WAIT_REPLICAS=hunter2"}
	for _, args := range [][]string{{"--bogus"}, {"-h"}, nil} {
		if _, err := parseConfig(args, secretEnv); err == nil || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("parseConfig(%q) = %v; want an error without the secret", args, err)
		}
	}

	for name, tt := range map[string]struct{ args, env []string }{
		"not a number":               {env: []string{"IDEMSVC_REDIS_WAIT_REPLICAS=two"}},
		"two backends":               {args: []string{"--redis-url", "redis://x:1", "--redis-cluster-addrs", "y:1"}},
		"sentinel alone":             {env: []string{"IDEMSVC_REDIS_SENTINEL_ADDRS=s:26379"}},
		"unknown flag":               {args: []string{"--redis"}},
		"bad log level":              {args: []string{"--log-level", "loud"}},
		"negative replicas":          {args: []string{"--redis-wait-replicas", "-1"}},
		"argument":                   {args: []string{"serve"}},
		"default lease over the max": {env: []string{"IDEMSVC_DEFAULT_LEASE_MS=7200000"}},
		"key bytes":                  {args: []string{"--max-key-bytes", "0"}},
		"no connections":             {env: []string{"IDEMSVC_MAX_CONNECTIONS=0"}},
		"certificate without key":    {env: []string{"IDEMSVC_TLS_CERT_FILE=c.pem"}},
		"client CA without TLS":      {env: []string{"IDEMSVC_TLS_CLIENT_CA_FILE=ca.pem"}},
		"redis-tls for one node":     {env: []string{"IDEMSVC_REDIS_URL=redis://x:1", "IDEMSVC_REDIS_TLS=true"}},
		"redis CA without TLS":       {env: []string{"IDEMSVC_REDIS_URL=redis://x:1", "IDEMSVC_REDIS_TLS_CA_FILE=ca.pem"}},
		"redis key without cert":     {env: []string{"IDEMSVC_REDIS_URL=rediss://x:1", "IDEMSVC_REDIS_TLS_KEY_FILE=k.pem"}},
		"a proxy that is no address": {env: []string{"IDEMSVC_TRUSTED_PROXIES=10.0.0.0/8,proxy.local"}},
		"redis password, no redis":   {env: []string{"IDEMSVC_REDIS_PASSWORD=x"}},
		"redis-tls, no redis":        {env: []string{"IDEMSVC_REDIS_TLS=true"}},
	} {
		if _, err := parseConfig(tt.args, tt.env); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestRefusesRedisWithoutTenants(t *testing.T) {
	var logs syncBuffer
	err := run(t.Context(), nil, []string{"IDEMSVC_REDIS_URL=redis://127.0.0.1:1", "IDEMSVC_TENANT_FILE=tenants.yaml"}, &logs, nil)
	if err == nil || !strings.Contains(err.Error(), "--insecure-no-auth") {
		t.Fatalf("run = %v, want a refusal naming --insecure-no-auth", err)
	}
	// The misspelt variable that caused it is named first.
	if !strings.Contains(logs.String(), `"variable":"IDEMSVC_TENANT_FILE"`) {
		t.Errorf("the misspelt IDEMSVC_TENANT_FILE is not named:\n%s", logs.String())
	}
}

// A rediss:// URL that asks to skip certificate checks is refused.
func TestRedisSkipVerifyRefused(t *testing.T) {
	err := run(t.Context(), []string{"--insecure-no-auth"}, []string{"IDEMSVC_REDIS_URL=rediss://127.0.0.1:1?skip_verify=true"}, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "skip_verify is refused") {
		t.Fatalf("run = %v, want skip_verify refused", err)
	}
}

func TestRedisURLErrorHidesPassword(t *testing.T) {
	err := run(t.Context(), []string{"--insecure-no-auth"}, []string{"IDEMSVC_REDIS_URL=redis://user:hunter2@host:notaport"}, io.Discard, nil)
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("run = %v, want an error without the password", err)
	}
}

// instance is idemsvc started by run in this process.
type instance struct {
	url  string
	logs *syncBuffer
	stop context.CancelFunc
	done chan error
}

func start(t *testing.T, args, env []string) *instance {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	logs := &syncBuffer{}
	in := &instance{logs: logs, stop: cancel, done: make(chan error, 1)}
	urls := make(chan string, 1)
	listening := func(url string) { urls <- url }
	go func() {
		in.done <- run(ctx, append([]string{"--listen", "127.0.0.1:0"}, args...), env, logs, listening)
	}()
	t.Cleanup(func() {
		cancel()
		<-in.done
	})
	select {
	case in.url = <-urls:
	case err := <-in.done:
		in.done <- err // for the cleanup
		t.Fatalf("run = %v before listening; logs:\n%s", err, logs.String())
	case <-time.After(10 * time.Second):
		t.Fatalf("not listening within 10 s; logs:\n%s", logs.String())
	}
	return in
}

// waitListening reads the address from the "listening" log line of an
// idemsvc run as a process of its own (one run in this process tells it
// to start through run's listening).
func waitListening(t testing.TB, lines func() []string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, line := range lines() {
			var entry struct{ Msg, Addr string }
			if json.Unmarshal([]byte(line), &entry) == nil && entry.Msg == "listening" {
				return entry.Addr
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no listening line in the logs:\n%s", strings.Join(lines(), "\n"))
	return ""
}

func post(t testing.TB, url, apiKey, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("POST %s: %v", url, err)
		return 0, nil
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Errorf("POST %s: decode: %v", url, err)
	}
	return resp.StatusCode, out
}

func TestMemoryStoreDevelopmentMode(t *testing.T) {
	in := start(t, nil, nil)
	if code, body := post(t, in.url+"/v1/begin", "", `{"key":"k"}`); code != http.StatusCreated {
		t.Fatalf("begin = %d %v", code, body)
	}
	logs := in.logs.String()
	for _, warning := range []string{"NO REDIS CONFIGURED", "NO AUTHENTICATION"} {
		if !strings.Contains(logs, warning) {
			t.Errorf("no %q warning in the logs:\n%s", warning, logs)
		}
	}
}

func TestRedisWithTenants(t *testing.T) {
	tenants := idemtest.TenantsFile(t, idemtest.Tenant{Name: "payments", Key: "s3cret-key"})
	backends := map[string]func(t *testing.T) []string{
		"standalone": func(t *testing.T) []string {
			return []string{"IDEMSVC_REDIS_URL=redis://" + redistest.SharedServer(t).Addr()}
		},
		"cluster": func(t *testing.T) []string {
			return []string{"IDEMSVC_REDIS_CLUSTER_ADDRS=" + strings.Join(redistest.SharedCluster(t).Addrs(), ",")}
		},
		"sentinel": func(t *testing.T) []string {
			st := redistest.NewSentinel(t)
			return []string{
				"IDEMSVC_REDIS_SENTINEL_ADDRS=" + strings.Join(st.Addrs(), ","),
				"IDEMSVC_REDIS_SENTINEL_MASTER=" + st.MasterName(),
			}
		},
	}
	for name, env := range backends {
		t.Run(name, func(t *testing.T) {
			in := start(t, []string{"--tenants-file", tenants}, env(t))
			key := fmt.Sprintf(`{"key":"cmd-%s-%d"}`, name, time.Now().UnixNano())
			if code, body := post(t, in.url+"/v1/begin", "s3cret-key", key); code != http.StatusCreated {
				t.Fatalf("begin = %d %v", code, body)
			}
			if code, _ := post(t, in.url+"/v1/begin", "wrong-key", key); code != http.StatusUnauthorized {
				t.Errorf("begin with a wrong key = %d", code)
			}
			resp, err := http.Get(in.url + "/readyz")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("readyz = %d", resp.StatusCode)
			}
			if logs := in.logs.String(); strings.Contains(logs, "s3cret-key") || !strings.Contains(logs, "IDEMSVC_REDIS_WAIT_REPLICAS is 0") {
				t.Errorf("logs leak the key or lack the WAIT warning:\n%s", logs)
			}
			if logs := in.logs.String(); !strings.Contains(logs, `"mode":"`+name+`"`) {
				t.Errorf("logs do not name the Redis mode %s:\n%s", name, logs)
			}
		})
	}
}

// TestGracefulShutdown ends run's context while a waiter and a request are
// in flight: both get their answer, and run returns nil.
func TestGracefulShutdown(t *testing.T) {
	in := start(t, nil, nil)
	if code, _ := post(t, in.url+"/v1/begin", "", `{"key":"held"}`); code != http.StatusCreated {
		t.Fatal("begin did not acquire")
	}
	var wg sync.WaitGroup
	codes := make([]int, 4)
	for i := range codes {
		wg.Go(func() {
			codes[i], _ = post(t, in.url+"/v1/begin", "", `{"key":"held","wait_ms":30000}`)
		})
	}
	// Shut down once every waiter waits (or after 10 s: the answers tell).
	idemtest.Poll(10*time.Second, func() bool {
		return idemtest.Metric(t, in.url, "idemsvc_waiters", "") >= float64(len(codes))
	})
	in.stop()
	select {
	case err := <-in.done:
		in.done <- err // for the cleanup
		if err != nil {
			t.Fatalf("run = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after its context ended")
	}
	wg.Wait()
	for i, code := range codes {
		if code != http.StatusConflict {
			t.Errorf("waiter %d got %d, want 409 (answered at shutdown)", i, code)
		}
	}
	if _, err := http.Get(in.url + "/healthz"); err == nil {
		t.Error("still serving after shutdown")
	}
}

// TestSIGTERM runs idemsvc as a process and stops it with SIGTERM: it exits
// with status 0.
func TestSIGTERM(t *testing.T) {
	cmd := exec.Command(os.Args[0], "--listen", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "IDEMSVC_TEST_RUN_MAIN=1")
	logs := &syncBuffer{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() }) // no-op once it exited
	url := "http://" + waitListening(t, logs.lines)
	if code, _ := post(t, url+"/v1/begin", "", `{"key":"k"}`); code != http.StatusCreated {
		t.Fatalf("begin = %d", code)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit: %v, want status 0\n%s", err, logs.String())
	}
	if !strings.Contains(logs.String(), `"msg":"stopped"`) {
		t.Errorf("no stopped line:\n%s", logs.String())
	}
}

// syncBuffer is the log's output of a server under test.
type syncBuffer struct{ logbuf.Buffer }

func (b *syncBuffer) lines() []string { return strings.Split(b.String(), "\n") }

// logged reports whether a line of the log has the level and a message
// that begins with msg.
func (b *syncBuffer) logged(level, msg string) bool {
	for _, line := range b.lines() {
		var l struct{ Level, Msg string }
		if json.Unmarshal([]byte(line), &l) == nil && l.Level == level && strings.HasPrefix(l.Msg, msg) {
			return true
		}
	}
	return false
}

func TestLogWriter(t *testing.T) {
	out := &syncBuffer{}
	w := newLogWriter(out, 10*time.Millisecond)
	fmt.Fprintln(w, "first")
	deadline := time.Now().Add(5 * time.Second)
	for out.String() != "first\n" { // written by the periodic flush
		if time.Now().After(deadline) {
			t.Fatalf("the line was not written out: %q", out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	big := strings.Repeat("x", logBufferBytes)
	fmt.Fprintln(w, big)
	fmt.Fprintln(w, "last")
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), "first\n"+big+"\nlast\n"; got != want {
		t.Errorf("wrote %d bytes, want %d, in order", len(got), len(want))
	}
}

// failingOnce fails its first write, then keeps what it is given.
type failingOnce struct {
	syncBuffer
	failed bool
}

func (f *failingOnce) Write(p []byte) (int, error) {
	if !f.failed {
		f.failed = true
		return 0, errors.New("disk full")
	}
	return f.syncBuffer.Write(p)
}

// One failed write does not silence the log; a warning is written at once.
func TestLogWriterAfterAnError(t *testing.T) {
	out := &failingOnce{}
	w := newLogWriter(out, time.Hour)
	log := slog.New(flushingHandler{slog.NewTextHandler(w, nil), w})
	log.Info("lost")
	w.Flush() // the output refuses this batch
	log.Info("kept")
	log.Warn("urgent")
	if got := out.String(); !strings.Contains(got, "msg=kept") || !strings.Contains(got, "msg=urgent") || strings.Contains(got, "msg=lost") {
		t.Fatalf("written after a failed write, without waiting for the interval: %q", got)
	}
	if err := w.Close(); err == nil {
		t.Error("Close does not report the failed write")
	}
}

// go-redis's messages are logged once prefixed, Sentinel's routine news at
// info and the rest at warn.
func TestRedisLogger(t *testing.T) {
	var out syncBuffer
	l := redisLogger{slog.New(slog.NewJSONHandler(&out, nil))}
	l.Printf(t.Context(), "redis: connection pool: failed to dial after %d attempts", 5)
	l.Printf(t.Context(), "sentinel: new master=%q addr=%q", "idem", "10.0.0.5:6379")
	got := out.String()
	for _, want := range []string{
		`"level":"WARN","msg":"redis client: connection pool: failed to dial after 5 attempts"`,
		`"level":"INFO","msg":"redis client: sentinel: new master=\"idem\" addr=\"10.0.0.5:6379\""`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("no %s in:\n%s", want, got)
		}
	}
}
