// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
	"github.com/idemsvc/idemsvc/internal/testkit/s3test"
)

// TestLargeAnswerThroughBlobStore: a 40 MiB upstream answer passes
// idemproxy, is stored by idemsvc in its blob store (versitygw) as it
// streams, and replays byte for byte, the upstream run once; the idemsvc
// binary's resident set stays under the contract's 300 MB meanwhile.
func TestLargeAnswerThroughBlobStore(t *testing.T) {
	const size = 40 << 20
	srv := s3test.New(t)
	bin := filepath.Join(t.TempDir(), "idemsvc")
	if out, err := exec.Command("go", "build", "-o", bin, "../idemsvc").CombinedOutput(); err != nil {
		t.Fatalf("go build idemsvc: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(bin)
	cmd.Env = append([]string{"IDEMSVC_LISTEN=" + addr, "IDEMSVC_INSECURE_NO_AUTH=true", "HOME=" + t.TempDir(),
		"IDEMSVC_REDIS_URL=redis://" + redistest.SharedServer(t).Addr(),
		"IDEMSVC_BLOB_URL=" + srv.URL("proxy"), "IDEMSVC_BLOB_SPOOL_DIR=" + t.TempDir()}, srv.Env()...)
	if err := redistest.StartChild(cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	idemsvcURL := "http://" + addr
	idemtest.Eventually(t, 20*time.Second, "idemsvc serving", func() bool {
		resp, err := http.Get(idemsvcURL + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})

	var runs atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.Copy(w, io.LimitReader(mrand.NewChaCha8([32]byte{2}), size))
	}))
	defer upstream.Close()
	want := sha256.New()
	_, _ = io.Copy(want, io.LimitReader(mrand.NewChaCha8([32]byte{2}), size))

	proxy := serveProxy(t, idemsvcURL, upstream.URL, "--max-streamed-body-bytes", strconv.Itoa(64<<20), "--unscoped")
	key := fmt.Sprintf(`"proxy-blob-%d"`, time.Now().UnixNano())
	for i, replayed := range []string{"", "true"} {
		req, _ := http.NewRequest(http.MethodPost, proxy+"/exports", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		n, err := io.Copy(h, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusCreated || n != size || !bytes.Equal(h.Sum(nil), want.Sum(nil)) {
			t.Fatalf("answer %d: %d, %d bytes, %v", i, resp.StatusCode, n, err)
		}
		if got := resp.Header.Get("Idempotent-Replayed"); got != replayed || resp.Header.Get("Idempotent-Body-Omitted") != "" {
			t.Fatalf("answer %d: Idempotent-Replayed %q, Idempotent-Body-Omitted %q", i, got, resp.Header.Get("Idempotent-Body-Omitted"))
		}
	}
	if runs.Load() != 1 {
		t.Fatalf("the upstream ran %d times", runs.Load())
	}
	_, peak := idemtest.Memory(t, cmd.Process.Pid)
	t.Logf("a %d MiB answer through idemproxy, stored and replayed: idemsvc VmHWM %.0f MB", size>>20, peak/1e6)
	if peak > 300e6 {
		t.Errorf("idemsvc VmHWM = %.0f MB, want under 300 MB", peak/1e6)
	}
}
