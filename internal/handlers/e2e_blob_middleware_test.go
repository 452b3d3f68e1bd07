// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/testkit/s3test"
)

// A caller that leaves while the Go middleware streams a large answer to
// it and to idemsvc breaks its connection: the handler stops at its
// failed write, so what it wrote is cut short. Nothing of it is stored
// and the attempt fails retryably, the contract's rule for a broken
// connection; a retry then runs the handler again and stores its whole
// answer.
func TestE2EMiddlewareStreamCallerLeaves(t *testing.T) {
	const answer = 16 << 20
	e := startBlob(t, redisBackends()[0], s3test.New(t))
	c, err := idem.New(e.url)
	if err != nil {
		t.Fatal(err)
	}
	handlerDone := make(chan int64, 2)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusCreated)
		chunk := []byte(strings.Repeat("x", 64<<10))
		var wrote int64
		for wrote < answer {
			if _, err := w.Write(chunk); err != nil {
				break
			}
			wrote += int64(len(chunk))
		}
		handlerDone <- wrote
	})
	svc := httptest.NewServer(idem.Middleware(c, idem.MiddlewareOptions{MaxStreamedBodyBytes: 64 << 20, Unscoped: true})(handler))
	defer svc.Close()
	key := fmt.Sprintf("mw-leaves-%d", time.Now().UnixNano())
	post := func() *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, svc.URL+"/exports", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", `"`+key+`"`)
		req.Header.Set("Content-Type", "application/json")
		resp, err := (&http.Client{Transport: &http.Transport{}}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}

	resp := post()
	if _, err := io.CopyN(io.Discard, resp.Body, 2<<20); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close() // before its end: the connection is closed
	select {
	case wrote := <-handlerDone:
		if wrote >= answer {
			t.Fatalf("the handler wrote its whole answer (%d bytes) to a caller that left", wrote)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the handler did not stop after its caller left")
	}
	// The middleware fails the attempt retryably once the handler returns.
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := c.Status(context.Background(), key, false)
		if errors.Is(err, idem.ErrNotFound) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if st.State == idem.StateCompleted {
			t.Fatalf("a cut-short answer was stored: %+v", st)
		}
		if st.State == idem.StateFailed && st.Retryable != nil && *st.Retryable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the attempt is still %s: %+v", st.State, st)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// The retry runs the handler again, and its whole answer is stored.
	resp = post()
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || n != answer || resp.StatusCode != http.StatusCreated || resp.Header.Get(idem.ReplayedHeader) != "" {
		t.Fatalf("the retry: %d, %d bytes, %v", resp.StatusCode, n, err)
	}
	if wrote := <-handlerDone; wrote != answer {
		t.Fatalf("the retry's handler wrote %d bytes", wrote)
	}
	_, body := e.replayBody(t, key)
	if len(body) != answer {
		t.Fatalf("stored %d bytes, want %d", len(body), answer)
	}
}
