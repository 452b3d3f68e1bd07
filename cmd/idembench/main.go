// SPDX-License-Identifier: Apache-2.0

// Command idembench puts HTTP load on an idemsvc and checks what it answers.
//
// Usage:
//
//	idembench [--url http://127.0.0.1:8080] [--api-key KEY] [--concurrency 64]
//	          [--duration 10s] [--mix begin] [--replay-keys 1000] [--rate 0]
//	          [--answer-bytes 0]
//
// The API key may also come from the environment variable IDEMSVC_API_KEY;
// without one, requests carry no Authorization header (an idemsvc without
// tenants). Each of --concurrency workers sends one request at a time, for
// --duration. On each turn a worker does one operation of --mix:
//
//	begin   begin on a new key: one request, expecting 201
//	cycle   begin on a new key, then complete it with the lease token and a
//	        small response: two requests (201, 200) make one cycle
//	replay  begin on one of --replay-keys keys completed during a warm-up,
//	        expecting 200 and the stored 1 KiB body
//	hot     begin on one key held for the whole run: the warm-up acquires
//	        it for worker 0 with an owner and a one-hour lease; worker 0
//	        begins it again with that owner (201, the same lease), every
//	        other worker without an owner (409)
//	pay     POST /pay, with a JSON body and a new Idempotency-Key header,
//	        expecting 201: an application's endpoint made idempotent (by
//	        the Go SDK's middleware, say), not idemsvc's; --url is the
//	        application's, and pay goes alone in the mix
//
// With --answer-bytes N, cycle completes and the replay keys are completed
// with a JSON answer of N bytes (a page of orders, as
// internal/answer makes it) instead of their small and 1 KiB
// bodies: the cost of storing and replaying answers of a size.
//
// --mix takes one name, or weights such as begin=1,cycle=1,replay=2: each
// turn picks an operation at random in those proportions (a name without a
// weight weighs 1). Keys are unique to each run: they start with a random
// prefix.
//
// With --rate, the load is an open loop: turns are due at that many a
// second, whatever the answers' pace, and the --concurrency workers (each
// one connection) take them in order. Latencies count from when each turn
// was due, so a service that falls behind the schedule shows it in its
// latencies; the report adds how late the turns started (the lag), which
// grows when every worker is busy.
//
// The report gives requests/s (and cycles/s), the p50, p90, p99, p99.9 and maximum
// latency of each operation, the responses by status, and the errors:
// statuses other than the expected ones, and requests that got no reply.
// It also tallies acquisitions per key: every key idembench begins more
// than once (the replay keys and the hot key) must have been acquired once
// only, by the warm-up; a 201 that hands out a second lease on one of them
// is printed as an ERROR line. Keys of begin and cycle are begun once each,
// so they cannot be acquired twice.
//
// idembench exits with status 1 when the load cannot start (the first
// begin, or the warm-up, fails), when a key was acquired more than once, or
// when a replay lacked the stored body; other errors are reported, with
// status 0. An interrupt ends the load early and still prints the report.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	// The load allocates little that lives long: trade memory for less GC.
	debug.SetGCPercent(400)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "idembench:", err)
		os.Exit(1)
	}
}

// config is what the flags say.
type config struct {
	url         *url.URL
	apiKey      string
	concurrency int
	duration    time.Duration
	mix         mix
	replayKeys  int
	rate        float64 // turns a second; 0 for a closed loop
	answerBytes int     // the size of the JSON answers stored; 0 for the small defaults
}

// run parses args, puts the load on, and writes the report to stdout. It
// returns an error when the load could not start or when a key was
// acquired more than once.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	cfg, err := parseFlags(args)
	if err != nil {
		return err
	}
	b := newBench(cfg)
	if err := b.warmUp(ctx); err != nil {
		return err
	}
	r := b.load(ctx)
	r.write(stdout)
	if n := len(r.violations); n > 0 {
		return fmt.Errorf("%d keys acquired more than once", n)
	}
	if r.bad > 0 {
		return fmt.Errorf("%d replays did not return the stored response", r.bad)
	}
	return nil
}

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("idembench", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	rawURL := fs.String("url", "http://127.0.0.1:8080", "base URL of the idemsvc")
	apiKey := fs.String("api-key", "", "API key, sent as a bearer token (default $IDEMSVC_API_KEY)")
	concurrency := fs.Int("concurrency", 64, "workers, each with one request in flight")
	duration := fs.Duration("duration", 10*time.Second, "how long to put the load on")
	rawMix := fs.String("mix", "begin", "operations: begin, cycle, replay, hot, pay, or weights like begin=1,cycle=1,replay=2")
	replayKeys := fs.Int("replay-keys", 1000, "keys completed during the warm-up for replay")
	rate := fs.Float64("rate", 0, "open loop: turns a second, due on a schedule (0: a closed loop)")
	answerBytes := fs.Int("answer-bytes", 0, "cycle and replay store JSON answers of this many bytes (0: small defaults; at least 64)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *apiKey == "" {
		*apiKey = os.Getenv("IDEMSVC_API_KEY") // not a flag default, which -h would print
	}
	u, err := url.Parse(*rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return config{}, fmt.Errorf("--url %q: want http://host:port or https://host:port, with a path or not", *rawURL)
	}
	if strings.ContainsFunc(*apiKey, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return config{}, errors.New("--api-key: the key has a control character, which no HTTP header can carry")
	}
	m, err := parseMix(*rawMix)
	if err != nil {
		return config{}, fmt.Errorf("--mix: %w", err)
	}
	switch {
	case *concurrency < 1:
		return config{}, errors.New("--concurrency must be at least 1")
	case *duration <= 0:
		return config{}, errors.New("--duration must be positive")
	case *replayKeys < 1:
		return config{}, errors.New("--replay-keys must be at least 1")
	case *rate < 0:
		return config{}, errors.New("--rate must not be negative")
	case *answerBytes != 0 && (*answerBytes < 64 || *answerBytes > 1<<20-1024):
		return config{}, errors.New("--answer-bytes must be 0, or 64 to 1047552 (under the stored-response limit)")
	case m.has(opPay) && m.total() != m[opPay]:
		return config{}, errors.New("--mix: pay calls an application, not idemsvc: it goes alone")
	case m.has(opHot) && *duration >= hotLease-time.Minute:
		return config{}, fmt.Errorf("--duration must be under %v with hot: the hot key's lease would run out", hotLease-time.Minute)
	}
	return config{url: u, apiKey: *apiKey, concurrency: *concurrency, duration: *duration, mix: m,
		replayKeys: *replayKeys, rate: *rate, answerBytes: *answerBytes}, nil
}

// An op is what a worker does on one turn.
type op int

const (
	opBegin op = iota
	opCycle
	opReplay
	opHot
	opPay
	numOps
)

var opNames = [numOps]string{"begin", "cycle", "replay", "hot", "pay"}

// mix is the weight of each op.
type mix [numOps]int

func (m *mix) has(o op) bool { return m[o] > 0 }

func (m *mix) total() int {
	t := 0
	for _, w := range m {
		t += w
	}
	return t
}

// parseMix reads "begin", or "begin=1,cycle=1,replay=2".
func parseMix(s string) (mix, error) {
	var m mix
	for part := range strings.SplitSeq(s, ",") {
		name, weight, hasWeight := strings.Cut(strings.TrimSpace(part), "=")
		o := op(slices.Index(opNames[:], name))
		if o < 0 {
			return mix{}, fmt.Errorf("unknown operation %q (want begin, cycle, replay, hot or pay)", name)
		}
		w := 1
		if hasWeight {
			var err error
			if w, err = strconv.Atoi(weight); err != nil || w < 0 {
				return mix{}, fmt.Errorf("weight of %s: %q is not a whole number", name, weight)
			}
		}
		m[o] += w
	}
	if m.total() == 0 {
		return mix{}, errors.New("no operation has a weight")
	}
	return m, nil
}

func (m mix) String() string {
	var parts []string
	for o, w := range m {
		if w > 0 {
			parts = append(parts, opNames[o]+"="+strconv.Itoa(w))
		}
	}
	return strings.Join(parts, ",")
}
