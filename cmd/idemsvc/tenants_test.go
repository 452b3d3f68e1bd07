// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
)

// writeFileAtomically replaces path by a rename, as deployment tools do.
func writeFileAtomically(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// tenantsFile is the tenants file of tenant payments with keys.
func tenantsFile(keys ...string) string {
	return idemtest.TenantsYAML(idemtest.Tenant{Name: "payments", Key: keys[0], MoreKeys: keys[1:]})
}

// waitFor polls cond for up to 10 s (the contract's bound is 5 s; the rest
// is margin for a busy machine).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	idemtest.Eventually(t, 10*time.Second, what, cond)
}

// TestRotateKeyWithoutRestart: a caller switches from an old API key to a
// new one while the tenants file is changed under a running idemsvc, and
// no request fails; an invalid file is refused and the keys in force stay;
// SIGHUP reads the file again.
func TestRotateKeyWithoutRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tenants.yaml")
	writeFileAtomically(t, path, tenantsFile("old-key"))
	in := start(t, []string{"--tenants-file", path}, nil)
	begin := func(key string) int {
		code, _ := post(t, in.url+"/v1/begin", key, fmt.Sprintf(`{"key":"k-%d"}`, time.Now().UnixNano()))
		return code
	}

	// A caller begins without pause, with whichever key it holds.
	var current atomic.Value
	current.Store("old-key")
	var sent, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			sent.Add(1)
			if code := begin(current.Load().(string)); code != http.StatusCreated {
				failed.Add(1)
				t.Errorf("begin during the rotation = %d", code)
			}
		}
	})

	writeFileAtomically(t, path, tenantsFile("old-key", "new-key"))
	waitFor(t, "the new key is accepted", func() bool { return begin("new-key") == http.StatusCreated })
	current.Store("new-key")
	writeFileAtomically(t, path, tenantsFile("new-key"))
	waitFor(t, "the old key is refused", func() bool { return begin("old-key") == http.StatusUnauthorized })
	close(stop)
	wg.Wait()
	if failed.Load() != 0 || sent.Load() < 10 {
		t.Fatalf("%d of %d begins failed during the rotation", failed.Load(), sent.Load())
	}
	t.Logf("%d begins during the rotation, none failed", sent.Load())

	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "SIGHUP reads the file", func() bool {
		return strings.Contains(in.logs.String(), "tenants file read again: unchanged")
	})

	writeFileAtomically(t, path, "tenants:\n  - name: payments\n    api_key_sha256: [\"new-key\"]\n")
	waitFor(t, "the invalid file is refused", func() bool {
		return strings.Contains(get(t, in.url+"/metrics"), "\nidemsvc_tenants_file_invalid 1\n")
	})
	waitFor(t, "an error is logged for the invalid file", func() bool {
		return in.logs.logged("ERROR", "tenants file refused")
	})
	if strings.Contains(in.logs.String(), `[\"new-key\"]`) || strings.Contains(in.logs.String(), `"new-key"`) {
		t.Errorf("the refused value is logged:\n%s", in.logs.String())
	}
	if code := begin("new-key"); code != http.StatusCreated {
		t.Errorf("begin with the key in force after an invalid file = %d", code)
	}
	// Repaired back to the content in force: nothing to reload, but the
	// file is valid again.
	writeFileAtomically(t, path, tenantsFile("new-key"))
	waitFor(t, "the repaired file clears the invalid metric", func() bool {
		return strings.Contains(get(t, in.url+"/metrics"), "\nidemsvc_tenants_file_invalid 0\n")
	})
	if metrics := get(t, in.url+"/metrics"); !strings.Contains(metrics, `idemsvc_tenants_reloads_total{result="refused"} 1`) ||
		!strings.Contains(metrics, `idemsvc_tenants_reloads_total{result="reloaded"} 2`) {
		t.Errorf("reload counts:\n%s", grepLines(metrics, "idemsvc_tenants"))
	}
}

func grepLines(text, prefix string) string {
	var out []string
	for line := range strings.Lines(text) {
		if strings.HasPrefix(line, prefix) {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return strings.Join(out, "\n")
}
