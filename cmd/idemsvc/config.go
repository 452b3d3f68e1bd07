package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"
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
	redisPassword       string
	redisWaitReplicas   int
	redisWaitTimeout    time.Duration
	redisTimeout        time.Duration
	tenantsFile         string
	insecureNoAuth      bool
	logLevel            slog.Level
}

// parseConfig reads env (KEY=value entries, as os.Environ gives them) and
// then args.
func parseConfig(args, env []string) (config, error) {
	vars := make(map[string]string)
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "IDEMSVC_") {
			vars[k] = v
		}
	}
	fs := flag.NewFlagSet("idemsvc", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var problems []error
	str := func(name, def, usage string) *string {
		v := def
		if e, ok := vars[envName(name)]; ok {
			v = e
		}
		return fs.String(name, v, usage+" ("+envName(name)+")")
	}
	integer := func(name string, def int, usage string) *int {
		v := def
		if e, ok := vars[envName(name)]; ok {
			n, err := strconv.Atoi(e)
			if err != nil {
				problems = append(problems, fmt.Errorf("%s: %q is not an integer", envName(name), e))
			}
			v = n
		}
		return fs.Int(name, v, usage+" ("+envName(name)+")")
	}
	boolean := func(name string, usage string) *bool {
		v := false
		if e, ok := vars[envName(name)]; ok {
			b, err := strconv.ParseBool(e)
			if err != nil {
				problems = append(problems, fmt.Errorf("%s: %q is not a boolean", envName(name), e))
			}
			v = b
		}
		return fs.Bool(name, v, usage+" ("+envName(name)+")")
	}
	listen := str("listen", ":8080", "address to serve on")
	redisURL := str("redis-url", "", "one Redis node: redis://[user:pass@]host:port[/db], rediss:// for TLS")
	cluster := str("redis-cluster-addrs", "", "comma-separated seed nodes of a Redis Cluster")
	sentinels := str("redis-sentinel-addrs", "", "comma-separated Sentinel addresses")
	master := str("redis-sentinel-master", "", "the master name Sentinel manages")
	password := str("redis-password", "", "password for Cluster or Sentinel-managed Redis")
	waitReplicas := integer("redis-wait-replicas", 0, "replicas that must confirm each transition")
	waitTimeout := integer("redis-wait-timeout-ms", 1000, "how long to wait for them before answering 503")
	timeout := integer("redis-timeout-ms", 1000, "how long one store operation may take before answering 503")
	tenants := str("tenants-file", "", "the tenants file (YAML)")
	insecure := boolean("insecure-no-auth", "serve Redis without tenants: every call acts as tenant default")
	level := str("log-level", "info", "debug, info, warn or error; requests are logged at info")
	if err := fs.Parse(args); err != nil {
		return config{}, fmt.Errorf("%w\n%s", err, usage(fs))
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected argument %q\n%s", fs.Arg(0), usage(fs))
	}
	c := config{
		listen:              *listen,
		redisURL:            *redisURL,
		redisClusterAddrs:   list(*cluster),
		redisSentinelAddrs:  list(*sentinels),
		redisSentinelMaster: *master,
		redisPassword:       *password,
		redisWaitReplicas:   *waitReplicas,
		redisWaitTimeout:    time.Duration(*waitTimeout) * time.Millisecond,
		redisTimeout:        time.Duration(*timeout) * time.Millisecond,
		tenantsFile:         *tenants,
		insecureNoAuth:      *insecure,
	}
	if err := c.logLevel.UnmarshalText([]byte(*level)); err != nil {
		problems = append(problems, fmt.Errorf("log-level: %q is not debug, info, warn or error", *level))
	}
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
	if c.redisWaitReplicas < 0 {
		problems = append(problems, errors.New("redis-wait-replicas must be 0 or more"))
	}
	if c.redisWaitTimeout <= 0 || c.redisTimeout <= 0 {
		problems = append(problems, errors.New("redis-wait-timeout-ms and redis-timeout-ms must be positive"))
	}
	return c, errors.Join(problems...)
}

// usesRedis reports whether a Redis store is configured.
func (c *config) usesRedis() bool {
	return c.redisURL != "" || len(c.redisClusterAddrs) > 0 || len(c.redisSentinelAddrs) > 0
}

// envName is the environment variable of a flag: redis-url is IDEMSVC_REDIS_URL.
func envName(flagName string) string {
	return "IDEMSVC_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func list(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

func usage(fs *flag.FlagSet) string {
	var b strings.Builder
	b.WriteString("usage: idemsvc [flags]; each flag is also an environment variable\n")
	fs.SetOutput(&b)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	return b.String()
}
