// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"sort"
	"strings"
	"time"

	"github.com/idemsvc/idemsvc/internal/blob"
	"github.com/idemsvc/idemsvc/internal/cli"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/httpserve"
	"github.com/idemsvc/idemsvc/internal/redisstore"
	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// config is idemsvc's configuration: each setting is an environment
// variable IDEMSVC_<NAME> and a flag --<name> of the same name in kebab
// case; a flag overrides the variable.
type config struct {
	listen              string
	redisURL            string
	redisClusterAddrs   []string
	redisSentinelAddrs  []string
	redisSentinelMaster string
	redisUsername       string
	redisPassword       string
	redisTLS            bool
	redisTLSCAFile      string
	redisTLSCertFile    string
	redisTLSKeyFile     string
	tlsCertFile         string
	tlsKeyFile          string
	tlsClientCAFile     string
	trustedProxies      []netip.Prefix
	redisWaitReplicas   int
	redisAllowEviction  bool
	redisReserveBytes   int64
	redisWaitTimeout    time.Duration
	redisMaxInFlight    int
	redisTimeout        time.Duration
	tenantsFile         string
	insecureNoAuth      bool
	logLevel            slog.Level
	accessLog           handlers.AccessLog
	limits              statemachine.Limits
	maxRequestBytes     int64
	// maxBodyBytesInFlight bounds the request bodies held at once.
	maxBodyBytesInFlight int64
	maxWait              time.Duration
	maxBatch             int
	// readsInFlight bounds each tenant's large answers in flight.
	readsInFlight  int
	maxConnections int
	// blobURL (s3://bucket/prefix) keeps large stored bodies in an
	// S3-compatible store; blobThreshold and maxStoredBytes bound them.
	blobURL        string
	blobThreshold  int64
	maxStoredBytes int64
	blobTLSCAFile  string
	blobSpoolDir   string
	// console serves the operators' console under /console/.
	console bool
	// unknownVars are IDEMSVC_* variables that name no setting: typos,
	// most likely, reported at start.
	unknownVars []string
}

// otherVars are IDEMSVC_* variables that belong to idemsvc's clients and
// tests, not to the service.
var otherVars = []string{"IDEMSVC_URL", "IDEMSVC_API_KEY", "IDEMSVC_CA_FILE", "IDEMSVC_CLIENT_CERT_FILE", "IDEMSVC_CLIENT_KEY_FILE", "IDEMSVC_TEST_"}

// parseConfig reads args and then, for every flag args did not set, env
// (KEY=value entries, as os.Environ gives them). Flags keep their built-in
// defaults, so usage never prints a value from the environment, such as a
// password.
// devListen is where development mode listens unless told otherwise.
const devListen = "127.0.0.1:8080"

func parseConfig(args, env []string) (config, error) {
	d := statemachine.DefaultLimits()
	fs := flag.NewFlagSet("idemsvc", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	listen := fs.String("listen", ":8080", "address to serve on ("+devListen+" in development mode: no Redis, no tenants)")
	redisURL := fs.String("redis-url", "", "one Redis node: redis://[user:pass@]host:port[/db], rediss:// for TLS")
	cluster := fs.String("redis-cluster-addrs", "", "comma-separated seed nodes of a Redis Cluster")
	sentinels := fs.String("redis-sentinel-addrs", "", "comma-separated Sentinel addresses")
	master := fs.String("redis-sentinel-master", "", "the master name Sentinel manages")
	username := fs.String("redis-username", "", "ACL user of every Redis node (a redis-url's own user wins)")
	password := fs.String("redis-password", "", "password of every Redis node (a redis-url's own password wins)")
	redisTLS := fs.Bool("redis-tls", false, "TLS to Cluster and Sentinel nodes (rediss:// says it for redis-url)")
	redisCA := fs.String("redis-tls-ca-file", "", "PEM file of the CA that signs Redis's certificates (default: the system's)")
	redisCert := fs.String("redis-tls-cert-file", "", "PEM client certificate presented to Redis")
	redisKey := fs.String("redis-tls-key-file", "", "PEM key of redis-tls-cert-file")
	tlsCert := fs.String("tls-cert-file", "", "PEM certificate (chain) to serve HTTPS with; renewed files are picked up")
	tlsKey := fs.String("tls-key-file", "", "PEM key of tls-cert-file")
	tlsClientCA := fs.String("tls-client-ca-file", "", "PEM CA file: require client certificates it signed")
	proxies := fs.String("trusted-proxies", "", "comma-separated addresses or CIDRs of proxies whose X-Forwarded-For names the client in the log")
	waitReplicas := fs.Int("redis-wait-replicas", 0, "replicas that must confirm each transition")
	allowEviction := fs.Bool("redis-allow-eviction", false, "serve on a Redis whose maxmemory-policy may drop records")
	reserve := fs.Int64("redis-reserve-bytes", redisstore.DefaultReserveBytes,
		"free memory under maxmemory each Redis master keeps for the outcomes of operations in flight; below it, begins that would start one there get 503 (0: none)")
	waitTimeout := fs.Int("redis-wait-timeout-ms", 1000, "how long to wait for them before answering 503")
	timeout := fs.Int("redis-timeout-ms", 1000, "how long one store operation may take before answering 503")
	maxInFlight := fs.Int("redis-max-in-flight", redisstore.DefaultMaxInFlight,
		"scripts run on Redis at a time; past it calls queue, and a begin, status or delete that joins a queue standing for 100 ms gets 503 within 5 ms")
	tenants := fs.String("tenants-file", "", "the tenants file (YAML)")
	insecure := fs.Bool("insecure-no-auth", false, "serve Redis without tenants: every call acts as tenant default")
	level := fs.String("log-level", "info", "debug, info, warn or error; requests are logged at info")
	accessLog := fs.String("access-log", "all", "all, errors or off: which requests get a line in the log (errors: answers of 400 and above)")
	maxKey := fs.Int("max-key-bytes", d.MaxKeyBytes, "longest key")
	maxRequest := fs.Int64("max-request-bytes", handlers.DefaultMaxBodyBytes, "largest request body")
	maxResponse := fs.Int("max-response-bytes", d.MaxResponseBytes, "largest stored response: body after decoding, plus headers")
	maxHeaders := fs.Int("max-response-headers", d.MaxResponseHeaders, "most header fields of a stored response")
	maxLease := fs.Int64("max-lease-ms", d.MaxLease.Milliseconds(), "longest lease")
	defaultLease := fs.Int64("default-lease-ms", d.DefaultLease.Milliseconds(), "lease of a begin without lease_ms")
	maxRetention := fs.Int64("max-retention-s", int64(d.MaxRetention/time.Second), "longest retention")
	defaultRetention := fs.Int64("default-retention-s", int64(d.DefaultRetention/time.Second), "retention of a record when no call gave retention_s")
	maxWait := fs.Int64("max-wait-ms", handlers.DefaultMaxWait.Milliseconds(), "longest wait_ms")
	maxBatch := fs.Int("max-batch", handlers.DefaultMaxBatch, "most items of a batch call")
	readsInFlight := fs.Int("reads-in-flight", handlers.DefaultReadsInFlight(), "large stored responses (64 KiB or more) each tenant may have in flight at once on this instance, replays and statuses together (default: half of GOMAXPROCS, at least 1)")
	maxConns := fs.Int("max-connections", httpserve.DefaultMaxConnections, "concurrent connections served; past it the one idle longest is closed, or else a new one gets 503")
	bodiesInFlight := fs.Int64("max-body-bytes-in-flight", handlers.DefaultMaxBodyBytesInFlight, "bytes of request bodies held at once; past it a body waits briefly, then 503")
	blobURL := fs.String("blob-url", "", "s3://bucket[/prefix]: keep stored bodies over blob-threshold-bytes in this S3-compatible store (endpoint, region and credentials from the standard AWS variables)")
	blobThreshold := fs.Int64("blob-threshold-bytes", handlers.DefaultBlobThreshold, "with blob-url: stored bodies over this size go to the blob store")
	maxStored := fs.Int64("max-stored-bytes", handlers.DefaultMaxStoredBytes, "with blob-url: largest body of a streamed complete (POST /v1/complete/stream)")
	blobCA := fs.String("blob-tls-ca-file", "", "PEM file of the CA that signs the blob store's certificates (default: the system's)")
	blobSpool := fs.String("blob-spool-dir", "", "with blob-url: where a streamed body is written while it arrives, before its upload (default: the system's temporary directory)")
	consoleOn := fs.String("console", "on", "on or off: serve the operators' console at /console/")
	fs.VisitAll(func(f *flag.Flag) { f.Usage += " (" + envName(f.Name) + ")" })

	if err := fs.Parse(args); err != nil {
		return config{}, fmt.Errorf("%w\n%s", err, cli.Usage(fs, "usage: idemsvc [flags]; each flag is also an environment variable"))
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected argument %q\n%s", fs.Arg(0), cli.Usage(fs, "usage: idemsvc [flags]; each flag is also an environment variable"))
	}
	var problems []error
	setByFlag := make(map[string]bool)
	fs.Visit(func(f *flag.Flag) { setByFlag[f.Name] = true })
	known := make(map[string]string) // variable -> flag
	fs.VisitAll(func(f *flag.Flag) { known[envName(f.Name)] = f.Name })
	var unknown []string
	for _, kv := range env {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, "IDEMSVC_") {
			continue
		}
		flagName, isKnown := known[name]
		switch {
		case !isKnown && !isOtherVar(name):
			unknown = append(unknown, name)
		case isKnown && !setByFlag[flagName]:
			if err := fs.Set(flagName, value); err != nil {
				// The value is not quoted: it may be a secret.
				problems = append(problems, fmt.Errorf("%s: not a valid value for --%s", name, flagName))
			}
		}
	}
	sort.Strings(unknown)

	c := config{
		listen:               *listen,
		redisURL:             *redisURL,
		redisClusterAddrs:    cli.List(*cluster),
		redisSentinelAddrs:   cli.List(*sentinels),
		redisSentinelMaster:  *master,
		redisUsername:        *username,
		redisPassword:        *password,
		redisTLS:             *redisTLS,
		redisTLSCAFile:       *redisCA,
		redisTLSCertFile:     *redisCert,
		redisTLSKeyFile:      *redisKey,
		tlsCertFile:          *tlsCert,
		tlsKeyFile:           *tlsKey,
		tlsClientCAFile:      *tlsClientCA,
		redisWaitReplicas:    *waitReplicas,
		redisAllowEviction:   *allowEviction,
		redisReserveBytes:    *reserve,
		redisWaitTimeout:     time.Duration(*waitTimeout) * time.Millisecond,
		redisTimeout:         time.Duration(*timeout) * time.Millisecond,
		redisMaxInFlight:     *maxInFlight,
		tenantsFile:          *tenants,
		insecureNoAuth:       *insecure,
		maxRequestBytes:      *maxRequest,
		maxBodyBytesInFlight: *bodiesInFlight,
		maxWait:              time.Duration(*maxWait) * time.Millisecond,
		maxBatch:             *maxBatch,
		readsInFlight:        *readsInFlight,
		maxConnections:       *maxConns,
		unknownVars:          unknown,
		console:              *consoleOn != "off",
		blobURL:              *blobURL,
		blobThreshold:        *blobThreshold,
		maxStoredBytes:       *maxStored,
		blobTLSCAFile:        *blobCA,
		blobSpoolDir:         *blobSpool,
	}
	if *consoleOn != "on" && *consoleOn != "off" {
		problems = append(problems, fmt.Errorf("console: %q is neither on nor off", *consoleOn))
	}
	// Development mode (no Redis, no tenants: every call accepted) listens
	// on loopback only, unless told where to listen.
	listenGiven := setByFlag["listen"]
	for _, kv := range env {
		listenGiven = listenGiven || strings.HasPrefix(kv, "IDEMSVC_LISTEN=")
	}
	if !listenGiven && !c.usesRedis() && c.tenantsFile == "" {
		c.listen = devListen
	}
	c.limits = d
	c.limits.MaxKeyBytes = *maxKey
	c.limits.MaxResponseBytes = *maxResponse
	c.limits.MaxResponseHeaders = *maxHeaders
	c.limits.MaxLease = time.Duration(*maxLease) * time.Millisecond
	c.limits.DefaultLease = time.Duration(*defaultLease) * time.Millisecond
	c.limits.MaxRetention = time.Duration(*maxRetention) * time.Second
	c.limits.DefaultRetention = time.Duration(*defaultRetention) * time.Second
	for _, p := range cli.List(*proxies) {
		prefix, err := netip.ParsePrefix(p)
		if addr, aerr := netip.ParseAddr(p); aerr == nil {
			prefix, err = addr.Prefix(addr.BitLen())
		}
		if err != nil {
			problems = append(problems, fmt.Errorf("trusted-proxies: %q is neither an address nor a CIDR", p))
			continue
		}
		c.trustedProxies = append(c.trustedProxies, prefix.Masked())
	}
	if err := c.logLevel.UnmarshalText([]byte(*level)); err != nil {
		problems = append(problems, fmt.Errorf("log-level: %q is not debug, info, warn or error", *level))
	}
	var err error
	if c.accessLog, err = handlers.ParseAccessLog(*accessLog); err != nil {
		problems = append(problems, fmt.Errorf("access-log: %q is not all, errors or off", *accessLog))
	}
	if len(problems) == 0 { // a value that did not parse is not checked again as its zero
		problems = c.check()
	}
	return c, errors.Join(problems...)
}

// check reports settings that cannot work together.
func (c *config) check() []error {
	var problems []error
	backends := 0
	for _, set := range []bool{c.redisURL != "", len(c.redisClusterAddrs) > 0, len(c.redisSentinelAddrs) > 0} {
		if set {
			backends++
		}
	}
	if backends > 1 {
		problems = append(problems, errors.New("give one of redis-url, redis-cluster-addrs and redis-sentinel-addrs"))
	}
	if len(c.redisSentinelAddrs) > 0 && c.redisSentinelMaster == "" {
		problems = append(problems, errors.New("redis-sentinel-addrs needs redis-sentinel-master"))
	}
	if (c.tlsCertFile == "") != (c.tlsKeyFile == "") {
		problems = append(problems, errors.New("tls-cert-file and tls-key-file go together"))
	}
	if c.tlsClientCAFile != "" && c.tlsCertFile == "" {
		problems = append(problems, errors.New("tls-client-ca-file needs tls-cert-file and tls-key-file"))
	}
	if (c.redisTLSCertFile == "") != (c.redisTLSKeyFile == "") {
		problems = append(problems, errors.New("redis-tls-cert-file and redis-tls-key-file go together"))
	}
	if c.redisTLS && c.redisURL != "" {
		problems = append(problems, errors.New("redis-tls is for Cluster and Sentinel: give redis-url as rediss://host:port for TLS to one node"))
	}
	if (c.redisTLSCAFile != "" || c.redisTLSCertFile != "") && !c.redisTLS && !c.redisURLTLS() {
		problems = append(problems, errors.New("redis-tls-ca-file and redis-tls-cert-file need TLS to Redis: a rediss:// redis-url, or redis-tls"))
	}
	if !c.usesRedis() && (c.redisUsername != "" || c.redisPassword != "" || c.redisTLS || c.redisTLSCAFile != "" || c.redisTLSCertFile != "") {
		problems = append(problems, errors.New("redis-username, redis-password and the redis-tls settings need a Redis: redis-url, redis-cluster-addrs or redis-sentinel-addrs"))
	}
	if c.redisWaitReplicas < 0 {
		problems = append(problems, errors.New("redis-wait-replicas must be 0 or more"))
	}
	if c.blobURL != "" {
		if _, _, err := blob.ParseURL(c.blobURL); err != nil {
			problems = append(problems, errors.New("blob-url must be s3://bucket[/prefix]"))
		}
		if c.blobThreshold < 0 || c.blobThreshold > int64(c.limits.MaxResponseBytes) {
			problems = append(problems, fmt.Errorf("blob-threshold-bytes must be 0 to max-response-bytes (%d)", c.limits.MaxResponseBytes))
		}
		if c.maxStoredBytes < int64(c.limits.MaxResponseBytes) {
			problems = append(problems, fmt.Errorf("max-stored-bytes must be at least max-response-bytes (%d)", c.limits.MaxResponseBytes))
		}
	} else if c.blobTLSCAFile != "" || c.blobSpoolDir != "" {
		problems = append(problems, errors.New("blob-tls-ca-file and blob-spool-dir need blob-url"))
	}
	if c.redisWaitTimeout <= 0 || c.redisTimeout <= 0 {
		problems = append(problems, errors.New("redis-wait-timeout-ms and redis-timeout-ms must be positive"))
	}
	if c.redisReserveBytes < 0 {
		problems = append(problems, errors.New("redis-reserve-bytes must be 0 or more"))
	}
	if c.redisMaxInFlight < 1 || c.redisMaxInFlight > 100_000 {
		problems = append(problems, errors.New("redis-max-in-flight must be 1 to 100000"))
	}
	l := &c.limits
	switch {
	case l.MaxKeyBytes < 1 || l.MaxKeyBytes > 1<<16-1:
		problems = append(problems, errors.New("max-key-bytes must be 1 to 65535"))
	case c.maxRequestBytes < 1024 || l.MaxResponseBytes < 1:
		problems = append(problems, errors.New("max-request-bytes must be at least 1024 and max-response-bytes positive"))
	case l.MaxResponseHeaders < 1:
		problems = append(problems, errors.New("max-response-headers must be positive"))
	case l.MaxLease < l.MinLease || l.DefaultLease < l.MinLease || l.DefaultLease > l.MaxLease:
		problems = append(problems, fmt.Errorf("leases: need %d <= default-lease-ms <= max-lease-ms", l.MinLease.Milliseconds()))
	case l.MaxRetention < l.MinRetention || l.DefaultRetention < l.MinRetention || l.DefaultRetention > l.MaxRetention:
		problems = append(problems, errors.New("retention: need 1 <= default-retention-s <= max-retention-s"))
	case c.maxWait <= 0:
		problems = append(problems, errors.New("max-wait-ms must be positive"))
	case c.maxBatch <= 0:
		problems = append(problems, errors.New("max-batch must be positive"))
	case c.readsInFlight <= 0:
		problems = append(problems, errors.New("reads-in-flight must be positive"))
	case c.maxConnections < 1:
		problems = append(problems, errors.New("max-connections must be positive"))
	case c.maxBodyBytesInFlight < 6*c.maxRequestBytes:
		// A body counts twice (read, and decoded), and its buffer doubles
		// as it grows: room for the old and the new, 3 times its size,
		// within one tenant's share, half the budget.
		problems = append(problems, errors.New("max-body-bytes-in-flight must be at least 6 times max-request-bytes"))
	}
	return problems
}

// redisURLTLS reports whether redis-url asks for TLS (rediss://, in any
// case, as URL schemes are).
func (c *config) redisURLTLS() bool {
	scheme, _, _ := strings.Cut(c.redisURL, "://")
	return strings.EqualFold(scheme, "rediss")
}

// usesRedis reports whether a Redis store is configured.
func (c *config) usesRedis() bool {
	return c.redisURL != "" || len(c.redisClusterAddrs) > 0 || len(c.redisSentinelAddrs) > 0
}

func isOtherVar(name string) bool {
	for _, other := range otherVars {
		if name == other || strings.HasSuffix(other, "_") && strings.HasPrefix(name, other) {
			return true
		}
	}
	return false
}

// envName is the environment variable of a flag: redis-url is IDEMSVC_REDIS_URL.
func envName(flagName string) string {
	return "IDEMSVC_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// storeTimeout is how long one store call may take (WAIT included), or 0
// on the in-memory store: a begin's limit calls and store call share it.
func (c *config) storeTimeout() time.Duration {
	if !c.usesRedis() {
		return 0
	}
	if c.redisWaitReplicas > 0 {
		return c.redisTimeout + c.redisWaitTimeout
	}
	return c.redisTimeout
}
