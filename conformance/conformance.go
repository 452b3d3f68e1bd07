// SPDX-License-Identifier: Apache-2.0

// Package conformance runs cases.json, the middleware behaviour that every
// entry point shares, against an entry point served in front of the
// conformance app (README.md). Go tests use it for the Go middleware and
// idemproxy; the TypeScript tests read the same cases.
package conformance

import (
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

//go:embed cases.json
var casesJSON []byte

// Case is one behaviour: requests in order and what each must get.
type Case struct {
	Name  string `json:"name"`
	Rule  string `json:"rule"`
	Steps []Step `json:"steps"`
	// Calls is how many times the app ran once every step is done.
	Calls int `json:"calls"`
	// Idemsvc "down": the entry point cannot reach idemsvc.
	Idemsvc string `json:"idemsvc"`
	// Scoped: the entry point is configured with a scope, the end user
	// named by the request's X-User header.
	Scoped bool `json:"scoped"`
}

// Step is one request.
type Step struct {
	Method string  `json:"method"`
	Path   string  `json:"path"`
	Key    *string `json:"key"`
	// Headers are request headers besides the key.
	Headers      map[string]string `json:"headers"`
	Body         string            `json:"body"`
	BodyBytes    int               `json:"body_bytes"`
	WithPrevious bool              `json:"with_previous"`
	DelayMS      int               `json:"delay_ms"`
	Expect       Expect            `json:"expect"`
}

// Expect is what a step's answer must be.
type Expect struct {
	// Status is a number, or "any" (a connection error counts too).
	Status        json.RawMessage    `json:"status"`
	Headers       map[string]*string `json:"headers"`
	Body          *string            `json:"body"`
	BodyOf        *int               `json:"body_of"`
	BodyBytes     *int               `json:"body_bytes"`
	Problem       string             `json:"problem"`
	RetryAfterMax *int               `json:"retry_after_max"`
}

// Cases are the cases of cases.json.
func Cases() ([]Case, error) {
	var doc struct {
		Cases []Case `json:"cases"`
	}
	if err := json.Unmarshal(casesJSON, &doc); err != nil {
		return nil, fmt.Errorf("conformance: cases.json: %w", err)
	}
	return doc.Cases, nil
}

// Target is an entry point under test.
type Target struct {
	// URL is the entry point in front of the app; DownURL the same in front
	// of the same app, but with an idemsvc that cannot be reached; ScopedURL
	// the same with a scope: the end user named by the X-User header.
	URL, DownURL, ScopedURL string
	// Runs tells how many times the app ran so far; it fails t when it
	// cannot tell.
	Runs func(t *testing.T) int
}

// Run runs every case against target, each as a subtest.
func Run(t *testing.T, target Target) {
	t.Helper()
	cases, err := Cases()
	if err != nil {
		t.Fatal(err)
	}
	var prefix [6]byte
	_, _ = rand.Read(prefix[:])
	for i, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			base := target.URL
			if c.Idemsvc == "down" {
				base = target.DownURL
			}
			if c.Scoped {
				base = target.ScopedURL
			}
			key := fmt.Sprintf("conf-%x-%d", prefix, i)
			before := target.Runs(t)
			answers := runSteps(t, base, key, c.Steps)
			for j, s := range c.Steps {
				check(t, j, s, answers[j], answers)
			}
			if got := target.Runs(t) - before; got != c.Calls {
				t.Errorf("the app ran %d times, want %d (%s)", got, c.Calls, c.Rule)
			}
		})
	}
}

// answer is a step's answer, or the error that stood for it.
type answer struct {
	status int
	header http.Header
	body   []byte
	err    error
}

// runSteps sends the steps, each after every earlier one finished unless
// it runs with the previous one, and returns their answers.
func runSteps(t *testing.T, base, key string, steps []Step) []answer {
	answers := make([]answer, len(steps))
	var running sync.WaitGroup
	var started time.Time
	for i, s := range steps {
		if s.WithPrevious {
			time.Sleep(time.Until(started.Add(time.Duration(s.DelayMS) * time.Millisecond)))
		} else {
			running.Wait()
		}
		started = time.Now()
		running.Add(1)
		go func() {
			defer running.Done()
			answers[i] = send(base, key, s)
		}()
	}
	running.Wait()
	return answers
}

// client sends the steps; a fresh one per process keeps connections to
// every entry point.
var client = &http.Client{Timeout: 20 * time.Second}

func send(base, key string, s Step) answer {
	body := []byte(s.Body)
	if s.BodyBytes > 0 {
		body = bytes.Repeat([]byte("x"), s.BodyBytes)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, s.Method, base+s.Path, bytes.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	for name, value := range s.Headers {
		req.Header.Set(name, value)
	}
	if s.Key != nil {
		// Under a lower-case name: http.Transport resends a request whose
		// Header map has an "Idempotency-Key" entry when its connection
		// breaks, and each step is sent once. Field names are
		// case-insensitive: the header goes out all the same.
		req.Header["idempotency-key"] = []string{expandKey(*s.Key, key)}
	}
	req.GetBody = nil // nor is a body rewound to be sent again
	resp, err := client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

// keyPattern is {key}, or {key:N}: the case's key padded to N bytes.
var keyPattern = regexp.MustCompile(`\{key(?::(\d+))?\}`)

func expandKey(value, key string) string {
	return keyPattern.ReplaceAllStringFunc(value, func(m string) string {
		n, _ := strconv.Atoi(keyPattern.FindStringSubmatch(m)[1])
		return key + strings.Repeat("k", max(0, n-len(key)))
	})
}

func check(t *testing.T, i int, s Step, a answer, all []answer) {
	t.Helper()
	e := s.Expect
	where := fmt.Sprintf("step %d (%s %s)", i, s.Method, s.Path)
	if string(e.Status) == `"any"` {
		return
	}
	if a.err != nil {
		t.Errorf("%s: %v", where, a.err)
		return
	}
	if want, _ := strconv.Atoi(string(e.Status)); a.status != want {
		t.Errorf("%s: status %d, want %d; body %.300q", where, a.status, want, a.body)
	}
	for name, want := range e.Headers {
		got, ok := a.header[http.CanonicalHeaderKey(name)]
		switch {
		case want == nil && ok:
			t.Errorf("%s: header %s: %q, want none", where, name, got)
		case want != nil && strings.Join(got, ", ") != *want:
			t.Errorf("%s: header %s: %q, want %q", where, name, got, *want)
		}
	}
	if e.Body != nil && string(a.body) != *e.Body {
		t.Errorf("%s: body %.300q, want %q", where, a.body, *e.Body)
	}
	if e.BodyOf != nil && !bytes.Equal(a.body, all[*e.BodyOf].body) {
		t.Errorf("%s: body %.300q, want step %d's %.300q", where, a.body, *e.BodyOf, all[*e.BodyOf].body)
	}
	if e.BodyBytes != nil && len(a.body) != *e.BodyBytes {
		t.Errorf("%s: body of %d bytes, want %d", where, len(a.body), *e.BodyBytes)
	}
	if e.Problem != "" {
		var p struct {
			Type   string `json:"type"`
			Code   string `json:"code"`
			Status int    `json:"status"`
		}
		if ct := a.header.Get("Content-Type"); ct != "application/problem+json" {
			t.Errorf("%s: Content-Type %q, want application/problem+json", where, ct)
		} else if err := json.Unmarshal(a.body, &p); err != nil || !strings.HasSuffix(p.Type, "/problems/"+e.Problem) || p.Code != e.Problem || p.Status != a.status {
			t.Errorf("%s: problem %.300q, want the kind %s", where, a.body, e.Problem)
		}
	}
	if e.RetryAfterMax != nil {
		n, err := strconv.Atoi(a.header.Get("Retry-After"))
		if err != nil || n < 0 || n > *e.RetryAfterMax {
			t.Errorf("%s: Retry-After %q, want 0 to %d seconds", where, a.header.Get("Retry-After"), *e.RetryAfterMax)
		}
	}
}

// App is the conformance app of README.md, for Go entry points.
type App struct {
	runs atomic.Int64

	mu        sync.Mutex
	runsByKey map[string]int64 // the runs of each key header
}

// Runs is how many requests the app handled.
func (a *App) Runs(*testing.T) int { return int(a.runs.Load()) }

// LargeBytes is the size of /large's body: over idemsvc's 1 MiB
// stored-response limit.
const LargeBytes = 1572864

func (a *App) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	a.runs.Add(1)
	a.mu.Lock()
	if a.runsByKey == nil {
		a.runsByKey = make(map[string]int64)
	}
	key := r.Header.Get("Idempotency-Key")
	a.runsByKey[key]++
	run := a.runsByKey[key]
	a.mu.Unlock()
	route, arg, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	switch route {
	case "answer":
		status, _ := strconv.Atoi(arg)
		answerRun(w, status, run)
	case "slow":
		ms, _ := strconv.Atoi(arg)
		time.Sleep(time.Duration(ms) * time.Millisecond)
		answerRun(w, http.StatusCreated, run)
	case "binary":
		body := make([]byte, 260)
		for i := range 256 {
			body[i] = byte(i)
		}
		body[256], body[257], body[258], body[259] = byte(run>>24), byte(run>>16), byte(run>>8), byte(run)
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(body)
	case "large":
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write(bytes.Repeat([]byte("a"), LargeBytes))
	case "crash":
		panic(http.ErrAbortHandler) // the connection breaks, with no answer
	default:
		http.NotFound(w, r)
	}
}

func answerRun(w http.ResponseWriter, status int, run int64) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/things/1")
	w.Header().Set("X-Run", strconv.FormatInt(run, 10))
	w.WriteHeader(status)
	_, _ = fmt.Fprintf(w, `{"run":%d}`, run)
}

// Hex is a random hex string of n bytes, for names unique to a run.
func Hex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
