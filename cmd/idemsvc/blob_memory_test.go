// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
	"github.com/idemsvc/idemsvc/internal/testkit/s3test"
)

// TestBlobBoundedMemory runs the idemsvc binary with a blob store
// (versitygw) and holds its resident set under the contract's 300 MB
// while a 40 MiB answer completes as a stream and replays, and while
// slowReaders clients hold a replay of 32 MiB without reading it.
func TestBlobBoundedMemory(t *testing.T) {
	const (
		apiKey      = "blob-memory-key"
		largeBody   = 40 << 20
		slowBody    = 32 << 20
		slowReaders = 300
	)
	bin := idemtest.Binary(t, "IDEMSVC_TEST_BINARY", "idemsvc")
	srv := s3test.New(t)
	tenants := idemtest.TenantsFile(t, idemtest.Tenant{Name: "t", Key: apiKey, Limits: "{read_bytes_per_s: 1099511627776}"})
	env := append([]string{"IDEMSVC_TENANTS_FILE=" + tenants, "IDEMSVC_REDIS_URL=redis://" + redistest.SharedServer(t).Addr(),
		// 300 fetches at once, each reading its record first: all run
		// at once, none refused as overload (IDEMSVC_REDIS_MAX_IN_FLIGHT).
		"IDEMSVC_REDIS_MAX_IN_FLIGHT=300", "IDEMSVC_REDIS_TIMEOUT_MS=30000",
		"IDEMSVC_BLOB_URL=" + srv.URL("mem"), "IDEMSVC_BLOB_SPOOL_DIR=" + t.TempDir(), "HOME=" + t.TempDir()}, srv.Env()...)
	p := startBinary(t, bin, env)
	url := "http://" + p.addr
	client := &http.Client{}

	complete := func(key string, body []byte) {
		t.Helper()
		code, lease := post(t, url+"/v1/begin", apiKey, `{"key":"`+key+`","lease_ms":600000}`)
		if code != 201 {
			t.Fatalf("begin = %d %v", code, lease)
		}
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/complete/stream", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+apiKey)
		req.Header.Set("Content-Type", "application/octet-stream")
		req.Header.Set("Idem-Key", key)
		req.Header.Set("Idem-Lease-Token", lease["lease_token"].(string))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("complete = %d %s", resp.StatusCode, out)
		}
	}

	t.Run("40 MiB complete and replay", func(t *testing.T) {
		body := make([]byte, largeBody)
		rand.Read(body)
		key := fmt.Sprintf("blob-mem-%d", time.Now().UnixNano())
		complete(key, body)
		req, _ := http.NewRequest(http.MethodGet, url+"/v1/keys/body?key="+key, nil)
		req.Header.Set("Authorization", "Bearer "+apiKey)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		n, err := io.Copy(h, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || n != largeBody || !bytes.Equal(h.Sum(nil), sha256Of(body)) {
			t.Fatalf("replay: %d, %d bytes, %v", resp.StatusCode, n, err)
		}
		rss, peak := p.memory(t)
		t.Logf("a %d MiB answer completed and replayed: VmRSS %.0f MB, VmHWM %.0f MB (at start %.0f MB)", largeBody>>20, rss/1e6, peak/1e6, p.startRSS/1e6)
		if peak > rssBound {
			t.Errorf("VmHWM = %.0f MB, want under %.0f MB", peak/1e6, rssBound/1e6)
		}
	})

	t.Run("40 MiB through the Go middleware", func(t *testing.T) {
		c, err := idem.New(url, idem.WithAPIKey(apiKey))
		if err != nil {
			t.Fatal(err)
		}
		var runs atomic.Int32
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.Header().Set("Content-Type", "application/octet-stream")
			w.WriteHeader(http.StatusCreated)
			rng := mrand.NewChaCha8([32]byte{1})
			buf := make([]byte, 64<<10)
			for range largeBody / len(buf) {
				rng.Read(buf)
				if _, err := w.Write(buf); err != nil {
					return
				}
			}
		})
		want := sha256.New()
		rng := mrand.NewChaCha8([32]byte{1})
		buf := make([]byte, 64<<10)
		for range largeBody / len(buf) {
			rng.Read(buf)
			want.Write(buf)
		}
		svc := httptest.NewServer(idem.Middleware(c, idem.MiddlewareOptions{MaxStreamedBodyBytes: 64 << 20, Unscoped: true})(handler))
		defer svc.Close()
		key := fmt.Sprintf(`"mw-%d"`, time.Now().UnixNano())
		for i, replayed := range []string{"", "true"} {
			req, _ := http.NewRequest(http.MethodPost, svc.URL+"/orders", strings.NewReader(`{"n":1}`))
			req.Header.Set("Idempotency-Key", key)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			h := sha256.New()
			n, err := io.Copy(h, resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusCreated || n != largeBody || !bytes.Equal(h.Sum(nil), want.Sum(nil)) {
				t.Fatalf("answer %d: %d, %d bytes, %v", i, resp.StatusCode, n, err)
			}
			if got := resp.Header.Get(idem.ReplayedHeader); got != replayed || resp.Header.Get(idem.BodyOmittedHeader) != "" {
				t.Fatalf("answer %d: %s %q", i, idem.ReplayedHeader, got)
			}
		}
		if runs.Load() != 1 {
			t.Fatalf("the handler ran %d times", runs.Load())
		}
		rss, peak := p.memory(t)
		t.Logf("a %d MiB answer through the Go middleware, stored and replayed: idemsvc VmRSS %.0f MB, VmHWM %.0f MB", largeBody>>20, rss/1e6, peak/1e6)
		if peak > rssBound {
			t.Errorf("VmHWM = %.0f MB, want under %.0f MB", peak/1e6, rssBound/1e6)
		}
	})

	t.Run("slow readers of a 32 MiB replay", func(t *testing.T) {
		body := make([]byte, slowBody)
		rand.Read(body)
		key := fmt.Sprintf("blob-slow-%d", time.Now().UnixNano())
		complete(key, body)
		request := "GET /v1/keys/body?key=" + key + " HTTP/1.1\r\nHost: idemsvc\r\nAuthorization: Bearer " + apiKey + "\r\n\r\n"
		conns := make([]net.Conn, slowReaders)
		defer func() {
			for _, c := range conns {
				if c != nil {
					c.Close()
				}
			}
		}()
		var wg sync.WaitGroup
		var mu sync.Mutex
		statuses := map[string]int{}
		var firstRefusal string
		for i := range conns {
			c, err := net.Dial("tcp", p.addr)
			if err != nil {
				t.Fatal(err)
			}
			conns[i] = c
			wg.Go(func() {
				_ = c.SetDeadline(time.Now().Add(60 * time.Second))
				_, _ = io.WriteString(c, request)
				status := make([]byte, len("HTTP/1.1 200"))
				_, err := io.ReadFull(c, status)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					statuses["no answer"]++
				} else {
					statuses[string(status[9:])]++
				}
				if err == nil && string(status[9:]) != "200" && firstRefusal == "" {
					rest := make([]byte, 1024)
					n, _ := c.Read(rest)
					firstRefusal = string(rest[:n])
				}
			})
		}
		wg.Wait()
		if firstRefusal != "" {
			t.Logf("the first refusal: %s", firstRefusal)
		}
		// Each reads a little now and then, far slower than the body
		// comes: its answer waits on the socket, not in idemsvc.
		for range 3 {
			time.Sleep(time.Second)
			buf := make([]byte, 1024)
			for _, c := range conns {
				_ = c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
				_, _ = c.Read(buf)
			}
		}
		rss, peak := p.memory(t)
		t.Logf("%d clients slowly reading a replay of %d MiB: answers %v; VmRSS %.0f MB, VmHWM %.0f MB (at start %.0f MB)",
			slowReaders, slowBody>>20, statuses, rss/1e6, peak/1e6, p.startRSS/1e6)
		if statuses["200"] != slowReaders {
			t.Errorf("answers %v, want %d 200s", statuses, slowReaders)
		}
		if peak > rssBound {
			t.Errorf("VmHWM = %.0f MB, want under %.0f MB", peak/1e6, rssBound/1e6)
		}
	})
}

func sha256Of(b []byte) []byte {
	s := sha256.Sum256(b)
	return s[:]
}
