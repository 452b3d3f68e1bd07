// SPDX-License-Identifier: Apache-2.0

package idem

import (
	"context"
	crand "crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"mime"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"time"
)

// Client calls idemsvc. Every call is retried on network errors, 503
// answers and 429 answers (a tenant over its limits), with exponential
// backoff and jitter, honouring Retry-After, until the retry budget or the
// context ends; retries are safe because a begin carries an owner and
// complete and fail carry the lease token. A Retry-After beyond the budget
// is not waited for: the call returns the error at once.
type Client struct {
	api         *ClientWithResponses
	fast        *fastPath // nil when calls go through WithHTTP's client or a proxy
	tenant      *string
	callTimeout time.Duration
	retryBudget time.Duration
	minBackoff  time.Duration
	maxBackoff  time.Duration
	// credentialKey keys the middleware's digest of its callers'
	// credentials, derived from the API key (see credentialKey).
	credentialKey []byte
}

// Option configures a Client.
type Option func(*clientConfig)

type clientConfig struct {
	apiKey      string
	httpClient  HttpRequestDoer
	tls         *tls.Config
	tlsFiles    *tlsFiles
	tenant      string
	callTimeout time.Duration
	retryBudget time.Duration
}

// WithAPIKey sends key as the bearer token of every call.
func WithAPIKey(key string) Option { return func(c *clientConfig) { c.apiKey = key } }

// WithHTTP sends calls through hc (an *http.Client, say) instead of the
// default, a transport of the SDK's own that makes each call on the
// caller's goroutine over a pool of keep-alive connections (up to 128
// idle). With an *http.Client, give its transport room for idle
// connections: http.DefaultTransport keeps 2 per host, so a service under
// load would open and close a connection per call.
func WithHTTP(hc HttpRequestDoer) Option { return func(c *clientConfig) { c.httpClient = hc } }

// WithTLS has the default client use cfg for HTTPS: a private CA in
// RootCAs, a client certificate in Certificates. It does not apply to a
// client given by WithHTTP.
func WithTLS(cfg *tls.Config) Option { return func(c *clientConfig) { c.tls = cfg } }

// WithTLSFiles is WithTLS from PEM files: caFile, the CA that signs
// idemsvc's certificate ("" for the system's), and certFile and keyFile,
// a client certificate for an idemsvc that requires one ("" for none).
// New reports files that do not load.
func WithTLSFiles(caFile, certFile, keyFile string) Option {
	return func(c *clientConfig) { c.tlsFiles = &tlsFiles{caFile, certFile, keyFile} }
}

type tlsFiles struct{ ca, cert, key string }

// load builds the TLS configuration the files describe.
func (f *tlsFiles) load() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.ca != "" {
		data, err := os.ReadFile(f.ca)
		if err != nil {
			return nil, fmt.Errorf("idem: CA file: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(data) {
			return nil, fmt.Errorf("idem: CA file %s holds no PEM certificate", f.ca)
		}
	}
	if f.cert != "" || f.key != "" {
		cert, err := tls.LoadX509KeyPair(f.cert, f.key)
		if err != nil {
			return nil, fmt.Errorf("idem: client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// WithTenant acts for tenant; only an admin API key may name another tenant.
func WithTenant(tenant string) Option { return func(c *clientConfig) { c.tenant = tenant } }

// WithCallTimeout bounds each HTTP request (default 10 s, plus a begin's
// wait); zero keeps the default.
func WithCallTimeout(d time.Duration) Option { return func(c *clientConfig) { c.callTimeout = d } }

// WithRetryBudget bounds the time spent retrying one call (default 15 s).
// Zero turns retries off.
func WithRetryBudget(d time.Duration) Option { return func(c *clientConfig) { c.retryBudget = d } }

// Defaults of the options.
const (
	DefaultCallTimeout = 10 * time.Second
	DefaultRetryBudget = 15 * time.Second
)

// New returns a client of the idemsvc at baseURL, e.g.
// "https://idemsvc:8443" (or "http://idemsvc:8080" where idemsvc serves
// plain HTTP).
func New(baseURL string, opts ...Option) (*Client, error) {
	cfg := clientConfig{callTimeout: DefaultCallTimeout, retryBudget: DefaultRetryBudget}
	for _, opt := range opts {
		opt(&cfg)
	}
	if cfg.callTimeout <= 0 {
		cfg.callTimeout = DefaultCallTimeout
	}
	if cfg.tlsFiles != nil {
		t, err := cfg.tlsFiles.load()
		if err != nil {
			return nil, err
		}
		cfg.tls = t
	}
	if cfg.httpClient == nil {
		hc, err := defaultHTTP(baseURL, cfg.tls)
		if err != nil {
			return nil, err
		}
		cfg.httpClient = hc
	}
	auth := ""
	if cfg.apiKey != "" {
		if !validHeaderValue(cfg.apiKey) {
			return nil, errors.New("idem: the API key has a control character (a line end read from a file, say), which no HTTP header can carry")
		}
		auth = "Bearer " + cfg.apiKey
	}
	apiOpts := []ClientOption{WithHTTPClient(cfg.httpClient), WithRequestEditorFn(func(ctx context.Context, req *http.Request) error {
		req.Header.Set("User-Agent", userAgent)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		if id, ok := ctx.Value(requestIDKey{}).(string); ok && validHeaderValue(id) {
			req.Header.Set("X-Request-Id", id)
		}
		return nil
	})}
	api, err := NewClientWithResponses(baseURL, apiOpts...)
	if err != nil {
		return nil, fmt.Errorf("idem: %w", err)
	}
	c := &Client{api: api, callTimeout: cfg.callTimeout, retryBudget: cfg.retryBudget,
		minBackoff: 50 * time.Millisecond, maxBackoff: 2 * time.Second, credentialKey: credentialKey([]byte(cfg.apiKey))}
	if w, ok := cfg.httpClient.(*wire); ok {
		c.fast = newFastPath(w, api.ClientInterface.(*APIClient).Server, auth)
	}
	if cfg.tenant != "" {
		c.tenant = &cfg.tenant
	}
	return c, nil
}

// Version is this SDK's version, sent in the User-Agent of every call.
const Version = "0.1.0"

const userAgent = "idemsvc-go/" + Version

// defaultHTTP is the client that calls go through without WithHTTP: the
// SDK's own transport (wire), or, when the environment names a proxy for
// baseURL (HTTPS_PROXY, say), http.DefaultTransport's settings with room
// for 64 idle connections to idemsvc, enough for a busy service's calls in
// flight to reuse their connections instead of leaving sockets in
// TIME_WAIT.
func defaultHTTP(baseURL string, tlsConfig *tls.Config) (HttpRequestDoer, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("idem: %q is not an http:// or https:// URL", baseURL)
	}
	proxy, err := http.ProxyFromEnvironment(&http.Request{URL: u})
	if err != nil {
		return nil, fmt.Errorf("idem: proxy: %w", err)
	}
	if proxy == nil {
		return newWire(u, tlsConfig), nil
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 256
	t.MaxIdleConnsPerHost = 64
	if tlsConfig != nil {
		t.TLSClientConfig = tlsConfig
	}
	return &http.Client{Transport: t}, nil
}

type requestIDKey struct{}

// WithRequestID returns ctx carrying a request id that the calls made with
// it send as X-Request-Id, so that idemsvc's log lines can be matched with
// the caller's; an id with a control character is not sent. Middleware
// passes the incoming request's on by itself.
func WithRequestID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, requestIDKey{}, id)
}

// API returns the generated client underneath, for calls without retries.
func (c *Client) API() *ClientWithResponses { return c.api }

// The errors of calls, tested with errors.Is. An answer of idemsvc is an
// *Error, which matches the sentinel of its kind.
var (
	ErrInvalid             = errors.New("idem: invalid request")
	ErrUnauthorized        = errors.New("idem: unauthorized")
	ErrForbidden           = errors.New("idem: forbidden")
	ErrNotFound            = errors.New("idem: not found")
	ErrTooLarge            = errors.New("idem: too large")
	ErrInProgress          = errors.New("idem: in progress")
	ErrLeaseLost           = errors.New("idem: lease lost")
	ErrFingerprintMismatch = errors.New("idem: fingerprint mismatch")
	// ErrUnavailable is a 503, or idemsvc could not be reached, until the
	// retry budget ran out. The call may or may not have taken effect.
	ErrUnavailable = errors.New("idem: unavailable")
	// ErrRateLimited is a begin refused with 429: the tenant is over its
	// begin rate or its concurrent waiters, until the retry budget ran out.
	ErrRateLimited = errors.New("idem: rate limited")
	// ErrQuotaExceeded is a begin refused with 429: the tenant is over its
	// stored-bytes budget, and the begin would have run the operation.
	// Keys already finished still replay.
	ErrQuotaExceeded = errors.New("idem: quota exceeded")
)

var kinds = map[string]struct {
	err   error
	title string // as idemsvc titles the kind
}{
	"invalid-request":        {ErrInvalid, "Invalid request"},
	"unauthorized":           {ErrUnauthorized, "Unauthorized"},
	"forbidden":              {ErrForbidden, "Forbidden"},
	"not-found":              {ErrNotFound, "Not found"},
	"too-large":              {ErrTooLarge, "Too large"},
	"in-progress":            {ErrInProgress, "In progress"},
	"lease-lost":             {ErrLeaseLost, "Lease lost"},
	"fingerprint-mismatch":   {ErrFingerprintMismatch, "Fingerprint mismatch"},
	"blob-unavailable":       {ErrUnavailable, "Blob unavailable"},
	"store-unavailable":      {ErrUnavailable, "Store unavailable"},
	"rate-limited":           {ErrRateLimited, "Rate limited"},
	"quota-exceeded":         {ErrQuotaExceeded, "Quota exceeded"},
	"method-not-allowed":     {ErrInvalid, "Method not allowed"},
	"unsupported-media-type": {ErrInvalid, "Unsupported media type"},
	"internal":               {nil, "Internal error"}, // matches no sentinel error
}

// Error is a problem idemsvc answered.
type Error struct {
	StatusCode int
	Problem    Problem
	RetryAfter time.Duration // from the Retry-After header, if any
}

func (e *Error) Error() string {
	return fmt.Sprintf("%d %s: %s", e.StatusCode, e.Problem.Title, e.Problem.Detail)
}

// Kind is the problem's kind: its code, or the last path segment of its
// type URI when it has no code (an idemsvc older than codes).
func (e *Error) Kind() string {
	if e.Problem.Code != "" {
		return e.Problem.Code
	}
	t := e.Problem.Type
	for i := len(t) - 1; i >= 0; i-- {
		if t[i] == '/' {
			return t[i+1:]
		}
	}
	return t
}

// Is makes errors.Is(err, ErrInProgress) and the like hold.
func (e *Error) Is(target error) bool {
	if k, ok := kinds[e.Kind()]; ok {
		return k.err == target
	}
	return e.StatusCode == http.StatusServiceUnavailable && target == ErrUnavailable
}

// call runs one API call until it succeeds, fails for good, or the retry
// budget or ctx ends. do makes one HTTP exchange, bounded by timeout, and
// returns its response and body.
func (c *Client) call(ctx context.Context, op string, timeout time.Duration, do func(ctx context.Context) (*http.Response, []byte, error)) error {
	deadline := time.Now().Add(c.retryBudget)
	for attempt := 0; ; attempt++ {
		callCtx, cancel := ctx, noCancel
		if d, ok := ctx.Deadline(); !ok || time.Until(d) > timeout {
			callCtx, cancel = context.WithTimeout(ctx, timeout)
		}
		resp, body, err := do(callCtx)
		cancel()
		var wait time.Duration
		var final *finalError
		switch {
		case err != nil && ctx.Err() != nil:
			return &opError{op, ctx.Err()}
		case errors.As(err, &final):
			return &opError{op, final.err}
		case err != nil:
			err = &opError{op, &unreachableError{err}}
		case resp.StatusCode < 300:
			return nil
		default:
			e := &Error{StatusCode: resp.StatusCode, Problem: problemOf(resp, body)}
			if s, perr := strconv.Atoi(resp.Header.Get("Retry-After")); perr == nil && s > 0 {
				e.RetryAfter = time.Duration(s) * time.Second
				wait = e.RetryAfter
			}
			err = &opError{op, e}
			if e.StatusCode != http.StatusServiceUnavailable && e.StatusCode != http.StatusTooManyRequests {
				return err
			}
		}
		if wait == 0 {
			wait = c.backoff(attempt)
		}
		if time.Now().Add(wait).After(deadline) {
			return err
		}
		if err := sleep(ctx, wait); err != nil {
			return &opError{op, err}
		}
	}
}

// finalError is a try's error that call does not try again after, and
// returns as it is: the body of a streamed complete, say, which could be
// sent only once.
type finalError struct{ err error }

func (e *finalError) Error() string { return e.err.Error() }
func (e *finalError) Unwrap() error { return e.err }

// noCancel is the cancel of a context that call did not make.
var noCancel context.CancelFunc = func() {}

// opError is a call that failed: "idem: begin: 409 In progress: ...".
type opError struct {
	op  string // "begin", or "do \"key\": begin" where Do made the call
	err error
}

func (e *opError) Error() string { return "idem: " + e.op + ": " + e.err.Error() }
func (e *opError) Unwrap() error { return e.err }

// within names the Do of key as where a call's err happened, once
// prefixed: "idem: do \"k\": begin: ...".
func within(key string, err error) error {
	if oe, ok := err.(*opError); ok { // the call's own error, not one wrapping it
		return &opError{fmt.Sprintf("do %q: %s", key, oe.op), oe.err}
	}
	return &opError{fmt.Sprintf("do %q", key), err}
}

// unreachableError is a call that got no answer from idemsvc.
type unreachableError struct{ err error }

func (e *unreachableError) Error() string        { return "unavailable: " + e.err.Error() }
func (e *unreachableError) Unwrap() error        { return e.err }
func (e *unreachableError) Is(target error) bool { return target == ErrUnavailable }

// problemOf is the problem detail an error answer carries: every error
// idemsvc answers is application/problem+json. Anything else (a proxy's
// page, say) becomes a problem of its status.
func problemOf(resp *http.Response, body []byte) Problem {
	var p Problem
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "application/problem+json" &&
		json.Unmarshal(body, &p) == nil && p.Type != "" {
		return p
	}
	return Problem{Status: resp.StatusCode, Title: http.StatusText(resp.StatusCode),
		Detail: "an answer idemsvc does not document"}
}

// backoff is a full-jitter exponential delay for the attempt'th retry.
func (c *Client) backoff(attempt int) time.Duration {
	d := c.maxBackoff
	if attempt < 16 {
		d = min(c.minBackoff<<attempt, c.maxBackoff)
	}
	return d/2 + rand.N(d/2+1)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// newOwner is a random owner for a begin, so that its retries get the
// lease it may already have been given.
func newOwner() string {
	var b [16]byte
	_, _ = crand.Read(b[:]) // crypto/rand.Read does not fail
	return "idem-go-" + hex.EncodeToString(b[:])
}
