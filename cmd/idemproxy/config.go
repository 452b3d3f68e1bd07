// SPDX-License-Identifier: Apache-2.0

package main

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/cli"
	"github.com/idemsvc/idemsvc/internal/httpserve"
)

// config is idemproxy's configuration: each setting is a flag and an
// environment variable (vars below); a flag overrides the variable.
type config struct {
	listen      string
	adminListen string
	upstream    *url.URL
	idemsvcURL  string
	apiKey      string
	caFile      string
	certFile    string
	keyFile     string
	// upstreamTimeout bounds a keyed request's wait for the upstream's
	// answer: past it, 504, and the key is released.
	upstreamTimeout time.Duration
	middleware      idem.MiddlewareOptions
	// scopeHeader names the header the scope is read from (canonical
	// form), or is empty.
	scopeHeader string
	// The edge, as idemsvc's: the connections served at once, the bytes
	// of keyed request bodies held at once, and how long a request may
	// take to arrive, body included.
	maxConnections       int
	maxBodyBytesInFlight int64
	readTimeout          time.Duration
}

// vars maps each flag to its environment variable. idemsvc's address and
// credentials are named as every client of idemsvc names them.
var vars = map[string]string{
	"listen":                   "IDEMPROXY_LISTEN",
	"admin-listen":             "IDEMPROXY_ADMIN_LISTEN",
	"upstream":                 "IDEMPROXY_UPSTREAM",
	"methods":                  "IDEMPROXY_METHODS",
	"key-header":               "IDEMPROXY_KEY_HEADER",
	"key-optional":             "IDEMPROXY_KEY_OPTIONAL",
	"wait-ms":                  "IDEMPROXY_WAIT_MS",
	"store-headers":            "IDEMPROXY_STORE_HEADERS",
	"max-body-bytes":           "IDEMPROXY_MAX_BODY_BYTES",
	"max-streamed-body-bytes":  "IDEMPROXY_MAX_STREAMED_BODY_BYTES",
	"upstream-timeout-ms":      "IDEMPROXY_UPSTREAM_TIMEOUT_MS",
	"max-connections":          "IDEMPROXY_MAX_CONNECTIONS",
	"max-body-bytes-in-flight": "IDEMPROXY_MAX_BODY_BYTES_IN_FLIGHT",
	"read-timeout-ms":          "IDEMPROXY_READ_TIMEOUT_MS",
	"scope-header":             "IDEMPROXY_SCOPE_HEADER",
	"credential-cookies":       "IDEMPROXY_CREDENTIAL_COOKIES",
	"credential-secret":        "IDEMPROXY_CREDENTIAL_SECRET",
	"unscoped":                 "IDEMPROXY_UNSCOPED",
	"legacy-fingerprints":      "IDEMPROXY_LEGACY_FINGERPRINTS",
	"idemsvc-url":              "IDEMSVC_URL",
	"idemsvc-api-key":          "IDEMSVC_API_KEY",
	"ca-file":                  "IDEMSVC_CA_FILE",
	"client-cert-file":         "IDEMSVC_CLIENT_CERT_FILE",
	"client-key-file":          "IDEMSVC_CLIENT_KEY_FILE",
}

// parseConfig reads args and then, for every flag args did not set, env
// (KEY=value entries, as os.Environ gives them).
func parseConfig(args, env []string) (config, error) {
	fs := flag.NewFlagSet("idemproxy", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	listen := fs.String("listen", ":8081", "address to serve on")
	admin := fs.String("admin-listen", "", "address to serve /healthz and /metrics on (default: listen, where those two paths are then idemproxy's own)")
	upstream := fs.String("upstream", "", "the service made idempotent, as an http:// or https:// URL (required)")
	methods := fs.String("methods", "POST,PATCH", "comma-separated methods made idempotent; others pass through")
	keyHeader := fs.String("key-header", "Idempotency-Key", "the request header with the idempotency key")
	optional := fs.Bool("key-optional", false, "let requests of those methods without a key through, not idempotent (default: 400)")
	waitMS := fs.Int("wait-ms", 0, "how long a duplicate waits for the request in flight before 409")
	storeHeaders := fs.String("store-headers", "Content-Type,Content-Language,Location,ETag,Last-Modified", "comma-separated response headers stored and replayed")
	maxBody := fs.Int64("max-body-bytes", 1<<20, "largest request body of a request with a key; larger ones get 413")
	maxStreamed := fs.Int64("max-streamed-body-bytes", 0, "with an idemsvc that keeps large bodies in a blob store (IDEMSVC_BLOB_URL): store upstream answers over 1 MiB up to this size, streamed to idemsvc as they pass (0: store them without their body)")
	upstreamTimeout := fs.Int("upstream-timeout-ms", 60000, "how long a request with a key may wait for the upstream's answer; then 504, and the key is released")
	maxConns := fs.Int("max-connections", httpserve.DefaultMaxConnections, "connections served at once; past it the one idle longest is closed, or else a new one gets 503")
	bodiesInFlight := fs.Int64("max-body-bytes-in-flight", defaultMaxBodyBytesInFlight, "bytes of keyed request bodies held at once (each counted twice: read, and copied by the middleware); past it a body waits briefly, then 503")
	readTimeoutMS := fs.Int("read-timeout-ms", int(httpserve.DefaultReadTimeout.Milliseconds()), "how long a request may take to arrive, body included; then the connection is closed")
	scopeHeader := fs.String("scope-header", "", "the request header naming the end user, set by the authenticating gateway in front (which must drop it from callers' requests): keys are scoped to it")
	credentialCookies := fs.String("credential-cookies", "", "comma-separated cookies that identify the caller beside Authorization; without a scope header, a keyed digest of them joins the fingerprint")
	credentialSecret := fs.String("credential-secret", "", "the key of the credentials' digest, the same on every replica (default: the idemsvc API key)")
	unscoped := fs.Bool("unscoped", false, "neither scope keys nor digest credentials: only when one caller uses this service's tenant")
	legacy := fs.Bool("legacy-fingerprints", true, "after a fingerprint mismatch, begin again with the fingerprint of earlier versions (no version prefix), so that their records replay until they expire")
	idemsvcURL := fs.String("idemsvc-url", "http://localhost:8080", "idemsvc's base URL")
	apiKey := fs.String("idemsvc-api-key", "", "the API key of this service's tenant at idemsvc")
	caFile := fs.String("ca-file", "", "PEM CA that signs idemsvc's certificate (default: the system's)")
	certFile := fs.String("client-cert-file", "", "PEM client certificate presented to idemsvc")
	keyFile := fs.String("client-key-file", "", "PEM key of client-cert-file")
	fs.VisitAll(func(f *flag.Flag) { f.Usage += " (" + vars[f.Name] + ")" })
	if err := fs.Parse(args); err != nil {
		return config{}, fmt.Errorf("%w\n%s", err, cli.Usage(fs, "usage: idemproxy [flags]; each flag is also the environment variable named"))
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected argument %q\n%s", fs.Arg(0), cli.Usage(fs, "usage: idemproxy [flags]; each flag is also the environment variable named"))
	}
	setByFlag := make(map[string]bool)
	fs.Visit(func(f *flag.Flag) { setByFlag[f.Name] = true })
	environ := make(map[string]string)
	for _, kv := range env {
		if name, value, ok := strings.Cut(kv, "="); ok {
			environ[name] = value
		}
	}
	for name, v := range vars {
		if value, ok := environ[v]; ok && !setByFlag[name] {
			if err := fs.Set(name, value); err != nil {
				return config{}, fmt.Errorf("%s: %w", v, err)
			}
		}
	}

	cfg := config{listen: *listen, adminListen: *admin, idemsvcURL: *idemsvcURL, apiKey: *apiKey,
		caFile: *caFile, certFile: *certFile, keyFile: *keyFile, maxConnections: *maxConns,
		maxBodyBytesInFlight: *bodiesInFlight, readTimeout: time.Duration(*readTimeoutMS) * time.Millisecond}
	if *upstream == "" {
		return config{}, fmt.Errorf("IDEMPROXY_UPSTREAM is required: the URL of the service to make idempotent\n%s", cli.Usage(fs, "usage: idemproxy [flags]; each flag is also the environment variable named"))
	}
	u, err := url.Parse(*upstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return config{}, fmt.Errorf("IDEMPROXY_UPSTREAM %q: want an http:// or https:// URL with a host", *upstream)
	}
	cfg.upstream = u
	if *maxStreamed < 0 {
		return config{}, fmt.Errorf("IDEMPROXY_MAX_STREAMED_BODY_BYTES must be 0 or more")
	}
	if *waitMS < 0 || *maxBody <= 0 || *upstreamTimeout <= 0 {
		return config{}, fmt.Errorf("IDEMPROXY_WAIT_MS must be 0 or more, and IDEMPROXY_MAX_BODY_BYTES and IDEMPROXY_UPSTREAM_TIMEOUT_MS more than 0")
	}
	cfg.upstreamTimeout = time.Duration(*upstreamTimeout) * time.Millisecond
	if *maxConns < 1 || *readTimeoutMS < 1 {
		return config{}, fmt.Errorf("IDEMPROXY_MAX_CONNECTIONS and IDEMPROXY_READ_TIMEOUT_MS must be more than 0")
	}
	// A keyed body counts twice, and its buffer doubles as it grows.
	if *bodiesInFlight < 4**maxBody {
		return config{}, fmt.Errorf("IDEMPROXY_MAX_BODY_BYTES_IN_FLIGHT must be at least 4 times IDEMPROXY_MAX_BODY_BYTES")
	}
	cfg.middleware = idem.MiddlewareOptions{
		KeyHeader:    *keyHeader,
		Methods:      cli.List(strings.ToUpper(*methods)),
		Optional:     *optional,
		Headers:      cli.List(*storeHeaders),
		Wait:         time.Duration(*waitMS) * time.Millisecond,
		MaxBodyBytes: *maxBody,
		// An answer over the stored limit streams to idemsvc as it
		// passes, held nowhere (0: stored without its body).
		MaxStreamedBodyBytes: *maxStreamed,

		CredentialCookies:    cli.List(*credentialCookies),
		Unscoped:             *unscoped,
		NoLegacyFingerprints: !*legacy,
	}
	if *credentialSecret != "" {
		cfg.middleware.CredentialSecret = []byte(*credentialSecret)
	}
	if *scopeHeader != "" {
		if !validHeaderName(*scopeHeader) {
			return config{}, fmt.Errorf("IDEMPROXY_SCOPE_HEADER %q is not a header name", *scopeHeader)
		}
		if *unscoped {
			return config{}, fmt.Errorf("IDEMPROXY_SCOPE_HEADER and IDEMPROXY_UNSCOPED=true contradict each other: set one")
		}
		name := http.CanonicalHeaderKey(*scopeHeader)
		cfg.scopeHeader = name
		// Read once: a request with the header twice gets 400 (oneScope).
		cfg.middleware.Scope = func(r *http.Request) string { return r.Header.Get(name) }
	}
	if len(cfg.middleware.Methods) == 0 {
		return config{}, fmt.Errorf("IDEMPROXY_METHODS names no method")
	}
	if !validHeaderName(cfg.middleware.KeyHeader) {
		return config{}, fmt.Errorf("IDEMPROXY_KEY_HEADER %q is not a header name", cfg.middleware.KeyHeader)
	}
	for _, name := range cfg.middleware.Headers {
		if !validHeaderName(name) || slices.Contains(unstorable, http.CanonicalHeaderKey(name)) {
			return config{}, fmt.Errorf("IDEMPROXY_STORE_HEADERS: %q cannot be stored and replayed (not a header name, a connection's own header, or a cookie that would go to whoever reuses the key)", name)
		}
	}
	return cfg, nil
}

// defaultMaxBodyBytesInFlight is IDEMPROXY_MAX_BODY_BYTES_IN_FLIGHT's
// default (see docs/configuration.md, "Bounded memory").
const defaultMaxBodyBytesInFlight = 64 << 20

// unstorable are the answer headers that describe one connection or one
// caller, never to be replayed.
var unstorable = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Te", "Trailer",
	"Upgrade", "Content-Length", "Set-Cookie", "Proxy-Authenticate", "Www-Authenticate"}

// validHeaderName reports whether s is an HTTP field name (a token).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c > 0x7e || c <= ' ' || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, c) {
			return false
		}
	}
	return http.CanonicalHeaderKey(s) != ""
}
