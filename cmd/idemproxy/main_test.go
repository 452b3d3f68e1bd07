// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/conformance"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

func TestMain(m *testing.M) {
	limitMemory = func(int64, []string) int64 { return 0 }
	redistest.Main(m)
}

// nodeApp is conformance/app.mjs run by Node: an upstream in another
// language than idemproxy, which counts the requests that reach it.
type nodeApp struct{ URL string }

func startNodeApp(t *testing.T) *nodeApp {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node not found: install Node.js (make test does) to run idemproxy's tests against a Node upstream")
	}
	cmd := exec.Command(node, filepath.Join("..", "..", "conformance", "app.mjs"))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	port, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	if err != nil || !ok {
		t.Fatalf("conformance/app.mjs: %q, %v", line, err)
	}
	return &nodeApp{URL: "http://127.0.0.1:" + port}
}

// runs is how many requests reached the app.
func (a *nodeApp) runs(t *testing.T) int {
	t.Helper()
	resp, err := http.Get(a.URL + "/__calls")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	n, err := strconv.Atoi(string(b))
	if err != nil {
		t.Fatalf("/__calls: %q", b)
	}
	return n
}

// serveProxy serves idemproxy with the flags given, in front of upstream,
// until the test ends.
func serveProxy(t *testing.T, idemsvcURL, upstream string, flags ...string) string {
	t.Helper()
	cfg, err := parseConfig(append([]string{"--listen", "127.0.0.1:0", "--upstream", upstream, "--idemsvc-url", idemsvcURL}, flags...), nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := newProxy(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	servers, err := listen(cfg, p, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	for _, srv := range servers {
		go func() { _ = srv.Serve() }()
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(ctx)
		})
	}
	return "http://" + servers[0].Addr().String()
}

// closedURL is a loopback URL where nothing listens.
func closedURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return "http://" + l.Addr().String()
}

// idemproxy behaves as every entry point must (conformance/cases.json), in
// front of a Node upstream, on the memory store and on Redis.
func TestConformance(t *testing.T) {
	app := startNodeApp(t)
	for _, b := range idemtest.Backends()[:2] {
		t.Run(b.Name, func(t *testing.T) {
			svc := idemtest.Serve(t, handlers.Config{Store: b.Open(t)})
			conformance.Run(t, conformance.Target{
				URL:       serveProxy(t, svc.URL, app.URL),
				DownURL:   serveProxy(t, closedURL(t), app.URL),
				ScopedURL: serveProxy(t, svc.URL, app.URL, "--scope-header", "x-user"),
				Runs:      app.runs,
			})
		})
	}
}

// 50 concurrent duplicates reach the upstream once, and every one of them
// gets the same status and body: the first from the upstream, the others
// replayed once it answered (they wait, as IDEMPROXY_WAIT_MS says).
func TestConcurrentDuplicatesReachTheUpstreamOnce(t *testing.T) {
	app := startNodeApp(t)
	svc := idemtest.Serve(t, handlers.Config{Store: idemtest.Backends()[1].Open(t)})
	url := serveProxy(t, svc.URL, app.URL, "--wait-ms", "10000")
	before := app.runs(t)
	type answer struct {
		status   int
		body     string
		replayed bool
	}
	answers := make([]answer, 50)
	var wg sync.WaitGroup
	key := `"dup-` + conformance.Hex(8) + `"`
	for i := range answers {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, url+"/slow/300", strings.NewReader(`{"amount":5}`))
			req.Header.Set("Idempotency-Key", key)
			req.GetBody = nil // sent once
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			answers[i] = answer{resp.StatusCode, string(b), resp.Header.Get("Idempotent-Replayed") == "true"}
		})
	}
	wg.Wait()
	if n := app.runs(t) - before; n != 1 {
		t.Errorf("the upstream ran %d times, want 1", n)
	}
	replays := 0
	for i, a := range answers {
		if a.status != http.StatusCreated || a.body != `{"run":1}` {
			t.Errorf("client %d: %d %q, want 201 {\"run\":1}", i, a.status, a.body)
		}
		if a.replayed {
			replays++
		}
	}
	if replays != len(answers)-1 {
		t.Errorf("%d replays, want %d", replays, len(answers)-1)
	}
}

// /healthz answers while idemproxy serves, and /metrics counts requests by
// outcome; with an admin listener, both paths go to the upstream instead.
func TestHealthAndMetrics(t *testing.T) {
	app := startNodeApp(t)
	svc := idemtest.Serve(t, handlers.Config{})
	url := serveProxy(t, svc.URL, app.URL)
	post := func(key string) int {
		req, _ := http.NewRequest(http.MethodPost, url+"/answer/201", strings.NewReader("x"))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	key := conformance.Hex(8)
	for _, want := range []int{201, 201, 400} {
		k := key
		if want == 400 {
			k = ""
		}
		if got := post(k); got != want {
			t.Fatalf("POST: %d, want %d", got, want)
		}
	}
	if resp, err := http.Get(url + "/answer/200"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET through: %v %v", resp, err)
	}
	resp, err := http.Get(url + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: %v %v", resp, err)
	}
	for _, want := range []string{
		`idemproxy_requests_total{outcome="executed",status="201"} 1`,
		`idemproxy_requests_total{outcome="replayed",status="201"} 1`,
		`idemproxy_requests_total{outcome="refused",status="400"} 1`,
		`idemproxy_requests_total{outcome="passed",status="200"} 1`,
		`idemproxy_upstream_duration_seconds_count 2`,
	} {
		if got := metrics(t, url); !strings.Contains(got, want+"\n") {
			t.Errorf("/metrics has no %s:\n%s", want, grep(got, "idemproxy_"))
		}
	}

	admin := serveProxy(t, svc.URL, app.URL, "--admin-listen", "127.0.0.1:0")
	resp, err = http.Get(admin + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound { // the app's answer
		t.Errorf("/healthz with an admin listener: %d, want the upstream's 404", resp.StatusCode)
	}
}

func metrics(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func grep(text, prefix string) string {
	var out bytes.Buffer
	for line := range strings.Lines(text) {
		if strings.HasPrefix(line, prefix) {
			out.WriteString(line)
		}
	}
	return out.String()
}

// A misconfiguration is refused at start, naming the variable.
func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{nil, "IDEMPROXY_UPSTREAM is required"},
		{[]string{"IDEMPROXY_UPSTREAM=localhost:3000"}, "IDEMPROXY_UPSTREAM"},
		{[]string{"IDEMPROXY_UPSTREAM=http://app:3000", "IDEMPROXY_WAIT_MS=soon"}, "IDEMPROXY_WAIT_MS"},
		{[]string{"IDEMPROXY_UPSTREAM=http://app:3000", "IDEMPROXY_METHODS= , "}, "IDEMPROXY_METHODS"},
		{[]string{"IDEMPROXY_UPSTREAM=http://app:3000", "IDEMPROXY_KEY_HEADER=Idempotency Key"}, "IDEMPROXY_KEY_HEADER"},
		{[]string{"IDEMPROXY_UPSTREAM=http://app:3000", "IDEMPROXY_STORE_HEADERS=Content-Type,set-cookie"}, "IDEMPROXY_STORE_HEADERS"},
		{[]string{"IDEMPROXY_UPSTREAM=http://app:3000", "IDEMPROXY_UPSTREAM_TIMEOUT_MS=0"}, "IDEMPROXY_UPSTREAM_TIMEOUT_MS"},
		{[]string{"IDEMPROXY_UPSTREAM=http://app:3000", "IDEMPROXY_SCOPE_HEADER=X User"}, "IDEMPROXY_SCOPE_HEADER"},
		{[]string{"IDEMPROXY_UPSTREAM=http://app:3000", "IDEMPROXY_SCOPE_HEADER=X-User", "IDEMPROXY_UNSCOPED=true"}, "IDEMPROXY_UNSCOPED"},
		{[]string{"IDEMPROXY_UPSTREAM=http://app:3000", "IDEMPROXY_LEGACY_FINGERPRINTS=maybe"}, "IDEMPROXY_LEGACY_FINGERPRINTS"},
	} {
		_, err := parseConfig(nil, tc.env)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error naming %s", tc.env, err, tc.want)
		}
	}
	cfg, err := parseConfig([]string{"--wait-ms", "250"}, []string{"IDEMPROXY_UPSTREAM=http://app:3000", "IDEMPROXY_WAIT_MS=9", "IDEMPROXY_METHODS=post,put"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.middleware.Wait != 250*time.Millisecond || strings.Join(cfg.middleware.Methods, ",") != "POST,PUT" || cfg.listen != ":8081" {
		t.Errorf("config %+v: the flag wins over the variable, methods are upper-cased, listen defaults to :8081", cfg)
	}
	if cfg.middleware.Scope != nil || cfg.middleware.Unscoped || cfg.middleware.NoLegacyFingerprints || cfg.middleware.CredentialSecret != nil {
		t.Errorf("config %+v: by default, credentials in the fingerprint, and legacy fingerprints after a mismatch", cfg.middleware)
	}
	cfg, err = parseConfig(nil, []string{"IDEMPROXY_UPSTREAM=http://app:3000", "IDEMPROXY_SCOPE_HEADER=x-user",
		"IDEMPROXY_CREDENTIAL_COOKIES=session, sid", "IDEMPROXY_CREDENTIAL_SECRET=s3", "IDEMPROXY_LEGACY_FINGERPRINTS=false"})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Header.Set("X-User", "alice")
	if m := cfg.middleware; m.Scope == nil || m.Scope(r) != "alice" || strings.Join(m.CredentialCookies, ",") != "session,sid" ||
		string(m.CredentialSecret) != "s3" || !m.NoLegacyFingerprints {
		t.Errorf("config %+v: the variables of scope and credentials not applied", m)
	}
	cfg, err = parseConfig(nil, []string{"IDEMPROXY_UPSTREAM=http://app:3000", "IDEMPROXY_UNSCOPED=true"})
	if err != nil || !cfg.middleware.Unscoped {
		t.Errorf("IDEMPROXY_UNSCOPED=true: %+v, %v", cfg.middleware, err)
	}
}

// The healthcheck subcommand passes against a serving idemproxy and fails
// against a closed port.
func TestHealthcheck(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	env := []string{"IDEMPROXY_UPSTREAM=http://127.0.0.1:1", "IDEMPROXY_LISTEN=" + addr}
	done := make(chan error, 1)
	go func() { done <- run(ctx, nil, env, io.Discard) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	idemtest.Eventually(t, 5*time.Second, "idemproxy healthcheck passes", func() bool {
		return healthcheck(nil, env, io.Discard) == 0
	})
	var out bytes.Buffer
	if code := healthcheck(nil, []string{"IDEMPROXY_UPSTREAM=http://x", "IDEMPROXY_LISTEN=" + strings.TrimPrefix(closedURL(t), "http://")}, &out); code == 0 {
		t.Error("healthcheck passed against a closed port")
	}
}

// An upstream's 103 Early Hints is not taken for its answer: the answer
// that follows it is stored and replayed.
func TestInformationalAnswerIsNotStored(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":1}`))
	}))
	t.Cleanup(upstream.Close)
	svc := idemtest.Serve(t, handlers.Config{})
	url := serveProxy(t, svc.URL, upstream.URL)
	key := conformance.Hex(8)
	for i := range 2 {
		req, _ := http.NewRequest(http.MethodPost, url+"/things", strings.NewReader("x"))
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || string(b) != `{"id":1}` || (resp.Header.Get("Idempotent-Replayed") == "true") != (i == 1) {
			t.Errorf("request %d: %d %q replayed %q, want 201 {\"id\":1}", i, resp.StatusCode, b, resp.Header.Get("Idempotent-Replayed"))
		}
	}
}

// A keyed request without a body reaches the upstream once even when the
// upstream breaks its reused connection after reading it: http.Transport
// would send such a request again, since it carries an Idempotency-Key.
func TestKeyedRequestIsNotResent(t *testing.T) {
	var mu sync.Mutex
	hits := map[string]int{}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits[r.URL.Path]++
		mu.Unlock()
		if r.URL.Path == "/break" {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(upstream.Close)
	svc := idemtest.Serve(t, handlers.Config{})
	url := serveProxy(t, svc.URL, upstream.URL)
	post := func(path string) int {
		req, _ := http.NewRequest(http.MethodPost, url+path, nil)
		req.Header.Set("Idempotency-Key", conformance.Hex(8))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	post("/warm") // leaves a connection to the upstream idle, to be reused
	if got := post("/break"); got != http.StatusBadGateway {
		t.Errorf("POST /break: %d, want 502", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if hits["/break"] != 1 {
		t.Errorf("the upstream got /break %d times, want 1", hits["/break"])
	}
}

// The upstream sees what it would without idemproxy: the Host asked for,
// and the Forwarded and X-Forwarded-* headers of the caller's proxies, the
// caller's address added to X-Forwarded-For.
func TestForwardedHeadersAreKept(t *testing.T) {
	seen := make(chan *http.Request, 2)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r
	}))
	t.Cleanup(upstream.Close)
	url := serveProxy(t, idemtest.Serve(t, handlers.Config{}).URL, upstream.URL)

	req, _ := http.NewRequest(http.MethodGet, url+"/x", nil)
	req.Host = "shop.example"
	req.Header.Set("X-Forwarded-For", "203.0.113.7")
	req.Header.Set("X-Forwarded-Proto", "https")
	req.Header.Set("Forwarded", "for=203.0.113.7;proto=https")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	got := <-seen
	if got.Host != "shop.example" || got.Header.Get("X-Forwarded-For") != "203.0.113.7, 127.0.0.1" ||
		got.Header.Get("X-Forwarded-Proto") != "https" || got.Header.Get("Forwarded") != "for=203.0.113.7;proto=https" {
		t.Errorf("upstream saw Host %q, headers %v", got.Host, got.Header)
	}

	req, _ = http.NewRequest(http.MethodGet, url+"/x", nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	got = <-seen
	if got.Header.Get("X-Forwarded-For") != "127.0.0.1" || got.Header.Get("X-Forwarded-Proto") != "http" ||
		got.Header.Get("X-Forwarded-Host") != strings.TrimPrefix(url, "http://") {
		t.Errorf("without proxies before it, upstream saw headers %v", got.Header)
	}
}

// A caller that leaves does not release the key: the upstream's answer,
// which comes later, is stored, and the caller's retry gets it; meanwhile a
// retry gets 409. An upstream slower than the upstream timeout gets 504,
// and the key is released.
func TestCallerLeavingAndUpstreamTimeout(t *testing.T) {
	app := startNodeApp(t)
	svc := idemtest.Serve(t, handlers.Config{})
	url := serveProxy(t, svc.URL, app.URL, "--upstream-timeout-ms", "1500")
	post := func(key, path string, timeout time.Duration) (int, string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+path, strings.NewReader("x"))
		req.Header["idempotency-key"] = []string{key} // sent once: see conformance.send
		req.GetBody = nil
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	before := app.runs(t)
	key := conformance.Hex(8)
	if _, _, err := post(key, "/slow/800", 200*time.Millisecond); err == nil {
		t.Fatal("the caller did not time out")
	}
	if status, _, err := post(key, "/slow/800", 5*time.Second); err != nil || status != http.StatusConflict {
		t.Errorf("retry while the upstream runs: %d %v, want 409", status, err)
	}
	idemtest.Eventually(t, 5*time.Second, "the late answer replayed", func() bool {
		status, body, err := post(key, "/slow/800", 5*time.Second)
		return err == nil && status == http.StatusCreated && body == `{"run":1}`
	})
	if n := app.runs(t) - before; n != 1 {
		t.Errorf("the upstream ran %d times, want 1", n)
	}

	key = conformance.Hex(8)
	for i := range 2 {
		if status, _, err := post(key, "/slow/3000", 10*time.Second); err != nil || status != http.StatusGatewayTimeout {
			t.Errorf("request %d to a slow upstream: %d %v, want 504", i, status, err)
		}
	}
	if n := app.runs(t) - before; n != 3 {
		t.Errorf("the upstream ran %d times in all, want 3: a 504 releases the key", n)
	}
}

// post sends a POST with the key and the headers given (name, value, ...),
// sent once, and returns its status, body and Idempotent-Replayed.
func post(t *testing.T, url, key, body string, headers ...string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header["idempotency-key"] = []string{key} // sent once: see conformance.send
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	req.GetBody = nil
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header.Get("Idempotent-Replayed")
}

// bob, sending alice's key and request, never gets alice's answer: without
// a scope header the credentials (Authorization, and the cookies named)
// tell them apart, and with one each runs the upstream once; only
// IDEMPROXY_UNSCOPED hands alice's answer to bob.
func TestUsersNeverShareAnswers(t *testing.T) {
	app := startNodeApp(t)
	svc := idemtest.Serve(t, handlers.Config{})
	for _, tc := range []struct {
		name       string
		flags      []string
		alice, bob []string
		bobStatus  int
		bobBody    string
	}{
		{"a bearer token", nil,
			[]string{"Authorization", "Bearer alice"}, []string{"Authorization", "Bearer bob"}, 422, ""},
		{"a session cookie named", []string{"--credential-cookies", "session"},
			[]string{"Cookie", "theme=dark; session=alice"}, []string{"Cookie", "theme=dark; session=bob"}, 422, ""},
		{"a scope header", []string{"--scope-header", "X-User"},
			[]string{"X-User", "alice"}, []string{"X-User", "bob"}, 201, `{"run":2}`},
		{"unscoped", []string{"--unscoped"},
			[]string{"Authorization", "Bearer alice"}, []string{"Authorization", "Bearer bob"}, 201, `{"run":1}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := serveProxy(t, svc.URL, app.URL, tc.flags...) + "/answer/201"
			key := conformance.Hex(8)
			if status, body, _ := post(t, url, key, `{"a":1}`, tc.alice...); status != 201 || body != `{"run":1}` {
				t.Fatalf("alice: %d %q", status, body)
			}
			status, body, replayed := post(t, url, key, `{"a":1}`, tc.bob...)
			if status != tc.bobStatus || tc.bobBody != "" && body != tc.bobBody {
				t.Errorf("bob: %d %q, want %d %q", status, body, tc.bobStatus, tc.bobBody)
			}
			if tc.name != "unscoped" && (body == `{"run":1}` || replayed != "") {
				t.Errorf("bob got alice's answer: %q, replayed %q", body, replayed)
			}
			if status, body, replayed := post(t, url, key, `{"a":1}`, tc.alice...); status != 201 || body != `{"run":1}` || replayed != "true" {
				t.Errorf("alice again: %d %q %q, want her answer replayed", status, body, replayed)
			}
		})
	}
}

// A record stored by an earlier idemproxy, under the fingerprint without a
// version (method, path, query, raw body), still replays; with
// IDEMPROXY_LEGACY_FINGERPRINTS=false it gets 422.
func TestRecordsOfEarlierVersionsReplay(t *testing.T) {
	app := startNodeApp(t)
	svc := idemtest.Serve(t, handlers.Config{})
	client, err := idem.New(svc.URL)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	body := `{ "amount": 100 }`
	sum := sha256.Sum256([]byte("POST\x00/answer/201?\x00" + body))
	key := conformance.Hex(8)
	res, err := client.Begin(ctx, idem.BeginParams{Key: key, Fingerprint: "sha256:" + hex.EncodeToString(sum[:])})
	if err != nil || res.Lease == nil {
		t.Fatalf("begin: %+v, %v", res, err)
	}
	if _, err := client.Complete(ctx, key, res.Lease.LeaseToken, idem.Response{StatusCode: 201, Body: []byte(`{"stored":"before"}`)}, 0); err != nil {
		t.Fatal(err)
	}
	url := serveProxy(t, svc.URL, app.URL)
	status, got, replayed := post(t, url+"/answer/201", key, body, "Authorization", "Bearer alice", "Content-Type", "application/json")
	if status != 201 || got != `{"stored":"before"}` || replayed != "true" {
		t.Errorf("%d %q replayed %q, want the record stored before replayed", status, got, replayed)
	}
	strict := serveProxy(t, svc.URL, app.URL, "--legacy-fingerprints=false")
	if status, got, _ := post(t, strict+"/answer/201", key, body); status != http.StatusUnprocessableEntity {
		t.Errorf("IDEMPROXY_LEGACY_FINGERPRINTS=false: %d %q, want 422", status, got)
	}
}
