// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
)

func TestRunAgainstIdemsvc(t *testing.T) {
	srv := idemtest.Serve(t, handlers.Config{})

	for _, mix := range []string{"begin", "cycle", "replay", "hot", "begin=1,cycle=1,replay=2,hot=1"} {
		t.Run(mix, func(t *testing.T) {
			var out bytes.Buffer
			err := run(context.Background(), []string{
				"--url", srv.URL, "--concurrency", "8", "--duration", "1s",
				"--mix", mix, "--replay-keys", "50",
			}, &out)
			report := out.String()
			if err != nil {
				t.Fatalf("run: %v\n%s", err, report)
			}
			m := regexp.MustCompile(`requests/s +[0-9.]+ +\(([0-9]+) requests\)`).FindStringSubmatch(report)
			if m == nil {
				t.Fatalf("no request count in the report:\n%s", report)
			}
			if n, _ := strconv.Atoi(m[1]); n == 0 {
				t.Errorf("no requests done:\n%s", report)
			}
			for _, want := range []string{"errors: none", "correctness: OK"} {
				if !strings.Contains(report, want) {
					t.Errorf("report lacks %q:\n%s", want, report)
				}
			}
			if strings.Contains(report, "ERROR") {
				t.Errorf("report has an ERROR:\n%s", report)
			}
			if strings.Contains(mix, "cycle") && !strings.Contains(report, "cycles/s") {
				t.Errorf("report lacks cycles/s:\n%s", report)
			}
		})
	}
}

// grantAll is a broken service that acquires every begin.
func grantAll(w http.ResponseWriter, r *http.Request) {
	var tok [16]byte
	rand.Read(tok[:])
	w.Header().Set("Content-Type", "application/json")
	switch r.URL.Path {
	case "/v1/begin":
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"status":"acquired","attempt":1,"lease_token":%q}`, hex.EncodeToString(tok[:]))
	case "/v1/complete":
		fmt.Fprint(w, `{"status":"completed","attempt":1}`)
	default:
		http.NotFound(w, r)
	}
}

func TestRunCatchesDoubleAcquisition(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(grantAll))
	defer srv.Close()

	for _, mix := range []string{"hot", "replay"} {
		t.Run(mix, func(t *testing.T) {
			var out bytes.Buffer
			err := run(context.Background(), []string{
				"--url", srv.URL, "--concurrency", "4", "--duration", "200ms",
				"--mix", mix, "--replay-keys", "5",
			}, &out)
			if err == nil || !strings.Contains(err.Error(), "acquired more than once") {
				t.Errorf("run returned %v, want an error about keys acquired more than once", err)
			}
			if !strings.Contains(out.String(), "ERROR:") {
				t.Errorf("report lacks an ERROR line:\n%s", out.String())
			}
		})
	}
}

func TestParseFlagsRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--mix", "frobnicate"},
		{"--mix", "begin=x"},
		{"--mix", "begin=0"},
		{"--concurrency", "0"},
		{"--url", "127.0.0.1:8080"},
		{"--url", "http://127.0.0.1:8080/?tenant=a"},
		{"--url", "http://user:pass@127.0.0.1:8080"},
		{"--api-key", "k3y\r\nX-Injected: 1"},
		{"--mix", "hot", "--duration", "2h"},
		{"--mix", "pay,begin"},
		{"--rate", "-1"},
	} {
		// parseFlags, not run: run against no idemsvc fails anyway.
		if _, err := parseFlags(args); err == nil {
			t.Errorf("parseFlags(%q) succeeded", args)
		}
	}
}

func TestParseMix(t *testing.T) {
	m, err := parseMix("begin=1,cycle=1,replay=2")
	if err != nil {
		t.Fatal(err)
	}
	if want := (mix{opBegin: 1, opCycle: 1, opReplay: 2}); m != want {
		t.Errorf("got %v, want %v", m, want)
	}
	if m, _ := parseMix("hot, begin"); m != (mix{opBegin: 1, opHot: 1}) {
		t.Errorf("hot, begin: got %v", m)
	}
}

func TestHistogramQuantiles(t *testing.T) {
	var h histogram
	for i := 1; i <= 1000; i++ {
		h.record(time.Duration(i) * time.Microsecond)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 500 * time.Microsecond}, {0.99, 990 * time.Microsecond}, {1, time.Millisecond}} {
		got := h.quantile(c.q)
		if diff := got - c.want; diff < -c.want/100 || diff > c.want/100 {
			t.Errorf("quantile(%v) = %v, want %v within 1%%", c.q, got, c.want)
		}
	}
	if h.max != time.Millisecond {
		t.Errorf("max = %v", h.max)
	}
}

// TestPayCallsAnApplication puts the pay load on a service behind the Go
// SDK's middleware: every request carries a new key, so the handler runs
// once for each, and each gets the handler's 201.
func TestPayCallsAnApplication(t *testing.T) {
	svc := idemtest.Serve(t, handlers.Config{})
	client, err := idem.New(svc.URL)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	app := httptest.NewServer(idem.Middleware(client, idem.MiddlewareOptions{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	})))
	t.Cleanup(app.Close)

	var out bytes.Buffer
	if err := run(t.Context(), []string{"--url", app.URL, "--concurrency", "4", "--duration", "1s", "--mix", "pay"}, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	m := regexp.MustCompile(`\npay +([0-9]+) .* 201:([0-9]+)\n`).FindStringSubmatch(out.String())
	if m == nil || m[1] != m[2] || !strings.Contains(out.String(), "errors: none") {
		t.Fatalf("want every pay answered 201:\n%s", out.String())
	}
	if n, _ := strconv.ParseInt(m[1], 10, 64); runs.Load() != n+1 { // and the warm-up's
		t.Errorf("the handler ran %d times for %d pays and the warm-up", runs.Load(), n)
	}
}

// TestOpenLoopTakesTheScheduledTurns: at --rate 200 for 1 s, exactly the
// 200 turns due within the load are taken, however fast the service is.
func TestOpenLoopTakesTheScheduledTurns(t *testing.T) {
	svc := idemtest.Serve(t, handlers.Config{})
	var out bytes.Buffer
	if err := run(t.Context(), []string{"--url", svc.URL, "--concurrency", "4", "--duration", "1s", "--rate", "200"}, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	for _, want := range []string{"200.0 turns/s scheduled (200 taken)", "(200 requests)", "lag_ms", "errors: none"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}
