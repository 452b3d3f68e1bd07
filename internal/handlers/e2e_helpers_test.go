// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/auth"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/statemachine"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// problemBase prefixes every problem type the contract names.
const problemBase = "https://idemsvc.dev/problems/"

// backend is a store the tests run against.
type backend = idemtest.Backend

// forEachBackend runs test on the memory store. The HTTP layer is the same
// over every store, whose rules internal/redisstore tests on all three;
// TestE2EEveryEndpointOnRedis runs each endpoint on Redis and a Cluster.
func forEachBackend(t *testing.T, test func(t *testing.T, b backend)) {
	t.Helper()
	b := idemtest.Backends()[0]
	t.Run(b.Name, func(t *testing.T) {
		t.Parallel()
		test(t, b)
	})
}

// env is one idemsvc instance listening on a real port.
type env struct {
	url  string
	svc  *handlers.Service
	http *http.Client
}

// start serves handlers.New(cfg) on a port of its own until the test ends.
func start(t testing.TB, cfg handlers.Config) *env {
	t.Helper()
	s := idemtest.Serve(t, cfg)
	transport := http.DefaultTransport.(*http.Transport).Clone() // the test's own, to tune
	t.Cleanup(transport.CloseIdleConnections)
	return &env{url: s.URL, svc: s.Service, http: &http.Client{Transport: transport}}
}

// startOn serves a store without authentication: every call acts as the
// admin of tenant "default".
func startOn(t *testing.T, store statemachine.Store) *env {
	t.Helper()
	return start(t, handlers.Config{Store: store})
}

// client is the generated client of e, sending apiKey as a bearer token
// (none when empty).
func (e *env) client(t *testing.T, apiKey string) *idem.ClientWithResponses {
	t.Helper()
	opts := []idem.ClientOption{idem.WithHTTPClient(e.http)}
	if apiKey != "" {
		opts = append(opts, idem.WithRequestEditorFn(func(_ context.Context, r *http.Request) error {
			r.Header.Set("Authorization", "Bearer "+apiKey)
			return nil
		}))
	}
	c, err := idem.NewClientWithResponses(e.url, opts...)
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	return c
}

// as returns a caller of e for test t with apiKey.
func (e *env) as(t *testing.T, apiKey string) *caller {
	return &caller{t: t, c: e.client(t, apiKey), e: e, apiKey: apiKey}
}

// raw sends a request the generated client cannot express. header holds
// extra request headers as name, value pairs.
func (e *env) raw(t *testing.T, method, path, contentType string, body io.Reader, header ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, e.url+path, body)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := e.http.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return resp, b
}

// caller makes the calls of one test through the generated client and fails
// the test when a call does not get an HTTP answer.
type caller struct {
	t      *testing.T
	c      *idem.ClientWithResponses
	e      *env
	apiKey string
}

var bg = context.Background()

func (c *caller) check(err error) {
	c.t.Helper()
	if err != nil {
		c.t.Fatalf("request: %v", err)
	}
}

func (c *caller) begin(req idem.BeginRequest) *idem.BeginResponse {
	c.t.Helper()
	r, err := c.c.BeginWithResponse(bg, req)
	c.check(err)
	return r
}

// acquire begins req and requires the caller to acquire the key.
func (c *caller) acquire(req idem.BeginRequest) *idem.BeginAcquired {
	c.t.Helper()
	r := c.begin(req)
	if r.StatusCode() != http.StatusCreated || r.JSON201 == nil {
		c.t.Fatalf("begin %q: got %d %s, want 201", req.Key, r.StatusCode(), r.Body)
	}
	return r.JSON201
}

func (c *caller) complete(req idem.CompleteRequest) *idem.CompleteResponse {
	c.t.Helper()
	r, err := c.c.CompleteWithResponse(bg, req)
	c.check(err)
	return r
}

// mustComplete completes and requires 200.
func (c *caller) mustComplete(req idem.CompleteRequest) *idem.FinishResult {
	c.t.Helper()
	r := c.complete(req)
	if r.StatusCode() != http.StatusOK || r.JSON200 == nil {
		c.t.Fatalf("complete %q: got %d %s, want 200", req.Key, r.StatusCode(), r.Body)
	}
	return r.JSON200
}

func (c *caller) fail(req idem.FailRequest) *idem.FailResponse {
	c.t.Helper()
	r, err := c.c.FailWithResponse(bg, req)
	c.check(err)
	return r
}

// mustFail fails the attempt and requires 200.
func (c *caller) mustFail(req idem.FailRequest) *idem.FinishResult {
	c.t.Helper()
	r := c.fail(req)
	if r.StatusCode() != http.StatusOK || r.JSON200 == nil {
		c.t.Fatalf("fail %q: got %d %s, want 200", req.Key, r.StatusCode(), r.Body)
	}
	return r.JSON200
}

func (c *caller) extend(req idem.ExtendRequest) *idem.ExtendResponse {
	c.t.Helper()
	r, err := c.c.ExtendWithResponse(bg, req)
	c.check(err)
	return r
}

func (c *caller) status(params idem.GetStatusParams) *idem.GetStatusResponse {
	c.t.Helper()
	r, err := c.c.GetStatusWithResponse(bg, &params)
	c.check(err)
	return r
}

// record reads key's record (with its response) and requires 200.
func (c *caller) record(key string) *idem.StatusRecord {
	c.t.Helper()
	r := c.status(idem.GetStatusParams{Key: key, IncludeResponse: ptr(true)})
	if r.StatusCode() != http.StatusOK || r.JSON200 == nil {
		c.t.Fatalf("status %q: got %d %s, want 200", key, r.StatusCode(), r.Body)
	}
	return r.JSON200
}

// requireAbsent requires GET /v1/status to answer 404 not-found for key.
func (c *caller) requireAbsent(key string) {
	c.t.Helper()
	r := c.status(idem.GetStatusParams{Key: key})
	requireProblem(c.t, r.HTTPResponse, r.Body, http.StatusNotFound, "not-found")
}

func (c *caller) del(params idem.DeleteKeyParams) *idem.DeleteKeyResponse {
	c.t.Helper()
	r, err := c.c.DeleteKeyWithResponse(bg, &params)
	c.check(err)
	return r
}

// snapshot is key's record as GET /v1/status?include_response=true shows
// it (the tenant's query parameter when given), or "absent": compared
// before and after a call that must change nothing.
func (c *caller) snapshot(key string, tenant ...string) string {
	c.t.Helper()
	params := idem.GetStatusParams{Key: key, IncludeResponse: ptr(true)}
	if len(tenant) > 0 {
		params.Tenant = &tenant[0]
	}
	r := c.status(params)
	switch r.StatusCode() {
	case http.StatusOK:
		return string(r.Body)
	case http.StatusNotFound:
		return "absent"
	}
	c.t.Fatalf("status %q: got %d %s", key, r.StatusCode(), r.Body)
	return ""
}

// requireProblem checks that an answer is the problem of kind with status
// and returns it.
func requireProblem(t *testing.T, resp *http.Response, body []byte, status int, kind string) idem.Problem {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("got %d %s, want %d %s", resp.StatusCode, body, status, kind)
	}
	ct := resp.Header.Get("Content-Type")
	if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json; body %s", ct, body)
	}
	var p idem.Problem
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatalf("problem %s: %v", body, err)
	}
	if p.Type != problemBase+kind {
		t.Fatalf("type %q, want %q; body %s", p.Type, problemBase+kind, body)
	}
	if p.Code != kind {
		t.Fatalf("code %q, want %q; body %s", p.Code, kind, body)
	}
	if p.Status != status {
		t.Fatalf("status member %d, want %d", p.Status, status)
	}
	if p.Title == "" || p.Detail == "" {
		t.Fatalf("problem without title or detail: %s", body)
	}
	// The bounds api/openapi.yaml states.
	if n := utf8.RuneCountInString(p.Detail); n > 1024 {
		t.Fatalf("detail of %d characters, over 1,024", n)
	}
	if p.Field != nil && utf8.RuneCountInString(*p.Field) > 256 {
		t.Fatalf("field of %d characters, over 256", utf8.RuneCountInString(*p.Field))
	}
	return p
}

// requireField checks the problem's field member: absent when want is "".
func requireField(t *testing.T, p idem.Problem, want string) {
	t.Helper()
	got := ""
	if p.Field != nil {
		got = *p.Field
		if got == "" {
			t.Fatalf("field member present but empty")
		}
	}
	if got != want {
		t.Fatalf("field %q, want %q (detail %q)", got, want, p.Detail)
	}
}

// requireRetryAfter checks a Retry-After of whole seconds in [lo, hi].
func requireRetryAfter(t *testing.T, resp *http.Response, lo, hi int) {
	t.Helper()
	v := resp.Header.Get("Retry-After")
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		t.Fatalf("Retry-After %q, want seconds in [%d, %d]", v, lo, hi)
	}
}

// requireJSON checks an answer's status and that it is application/json.
func requireJSON(t *testing.T, resp *http.Response, body []byte, status int) {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("got %d %s, want %d", resp.StatusCode, body, status)
	}
	ct := resp.Header.Get("Content-Type")
	if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
		t.Fatalf("Content-Type %q, want application/json", ct)
	}
}

var milliRE = regexp.MustCompile(`^"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"$`)

// members decodes a JSON object's members.
func members(t *testing.T, body []byte) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("not a JSON object: %s: %v", body, err)
	}
	return m
}

// requireMembers checks that a JSON object has exactly the named members,
// and that those ending in "_at" are times in the contract's layout.
func requireMembers(t *testing.T, body []byte, names ...string) map[string]json.RawMessage {
	t.Helper()
	m := members(t, body)
	var got []string
	for name, v := range m {
		got = append(got, name)
		if strings.HasSuffix(name, "_at") && !milliRE.Match(v) {
			t.Errorf("%s = %s: not RFC 3339 UTC with milliseconds", name, v)
		}
	}
	slices.Sort(got)
	want := slices.Clone(names)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("members %v, want %v; body %s", got, want, body)
	}
	return m
}

func ptr[T any](v T) *T { return &v }

// awaitLeaseExpired waits until the status of key shows its lease ran out.
func (c *caller) awaitLeaseExpired(key string) {
	c.t.Helper()
	idemtest.Eventually(c.t, 5*time.Second, "lease of "+key+" expired", func() bool {
		rec := c.record(key)
		return rec.LeaseExpired != nil && *rec.LeaseExpired
	})
}

// sameTime reports whether two API times are the same instant.
func sameTime(a, b idem.MilliTime) bool { return a.Equal(b.Time) }

// responseJSON is a stored response as its JSON object.
func responseJSON(t *testing.T, r idem.StoredResponse) string {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// jsonText is s as a JSON string.
func jsonText(s string) string {
	b, _ := json.Marshal(s) // a string always marshals
	return string(b)
}

// jsonBody marshals v for a raw request.
func jsonBody(t *testing.T, v any) *bytes.Reader {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.NewReader(b)
}

// Tenants of the authenticated tests: two tenants and an admin.
const (
	keyPayments = "sk-payments-9b1c0e"
	keyBilling  = "sk-billing-41d7aa"
	keyOps      = "sk-ops-admin-77f2c3"
)

// tenantsKeyring is the keyring of a tenants file with payments, billing
// and the admin tenant ops.
func tenantsKeyring(t *testing.T) *auth.Keyring {
	t.Helper()
	return idemtest.Keyring(t, idemtest.Tenant{Name: "payments", Key: keyPayments},
		idemtest.Tenant{Name: "billing", Key: keyBilling}, idemtest.Tenant{Name: "ops", Key: keyOps, Admin: true})
}

// metricValue reads the value of an unlabelled metric from /metrics.
func (e *env) metricValue(t *testing.T, name string) float64 {
	t.Helper()
	return idemtest.Metric(t, e.url, name, "")
}
