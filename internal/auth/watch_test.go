// SPDX-License-Identifier: Apache-2.0

package auth

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// watched runs Watch on a tenants file holding key for tenant a, and
// returns the file's path, the keyring, a channel that stands for SIGHUP
// and the outcomes reported so far.
func watched(t *testing.T, poll time.Duration) (string, *Keyring, chan os.Signal, func() []string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tenants.yaml")
	writeTenants(t, path, tenantsWith("old-key"))
	k, data, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var outcomes []string
	hup := make(chan os.Signal, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Watch(ctx, path, k, data, hup, WatchOptions{Poll: poll, Report: func(outcome string, err error) {
			mu.Lock()
			defer mu.Unlock()
			outcomes = append(outcomes, outcome)
		}})
	}()
	t.Cleanup(func() { cancel(); <-done })
	return path, k, hup, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), outcomes...)
	}
}

func tenantsWith(keys ...string) string {
	s := "tenants:\n  - name: a\n    api_key_sha256: ["
	for i, k := range keys {
		if i > 0 {
			s += ", "
		}
		s += `"` + Digest(k) + `"`
	}
	return s + "]\n"
}

func writeTenants(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// eventually waits up to 3 s (the contract allows 5) for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(3 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within 3 s: %s", what)
		}
	}
}

func knows(k *Keyring, key string) func() bool {
	return func() bool { _, ok := k.Lookup(key); return ok }
}

// A file written in place, then replaced by a rename, takes effect by the
// change notice alone (the poll is an hour); an invalid one is refused and
// the tenants before stay.
func TestWatchFollowsTheFile(t *testing.T) {
	path, k, _, outcomes := watched(t, time.Hour)

	writeTenants(t, path, tenantsWith("old-key", "new-key"))
	eventually(t, "the key added in place works", knows(k, "new-key"))

	tmp := path + ".tmp"
	writeTenants(t, tmp, tenantsWith("new-key"))
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the key removed by a rename is refused", func() bool { return !knows(k, "old-key")() })

	writeTenants(t, path, "tenants: [")
	eventually(t, "the invalid file is refused", func() bool {
		o := outcomes()
		return len(o) > 0 && o[len(o)-1] == Refused
	})
	if !knows(k, "new-key")() {
		t.Error("the tenants in force were dropped for an invalid file")
	}
}

// Kubernetes mounts a Secret's file as a symlink through ..data, and swaps
// ..data to update it: the file itself never changes.
func TestWatchFollowsSymlinkSwaps(t *testing.T) {
	dir := t.TempDir()
	for _, v := range []string{"v1", "v2"} {
		if err := os.Mkdir(filepath.Join(dir, v), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	writeTenants(t, filepath.Join(dir, "v1", "tenants.yaml"), tenantsWith("old-key"))
	writeTenants(t, filepath.Join(dir, "v2", "tenants.yaml"), tenantsWith("new-key"))
	if err := os.Symlink("v1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "tenants.yaml")
	if err := os.Symlink(filepath.Join("..data", "tenants.yaml"), path); err != nil {
		t.Fatal(err)
	}
	k, data, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); Watch(ctx, path, k, data, nil, WatchOptions{Poll: time.Hour}) }()
	t.Cleanup(func() { cancel(); <-done })

	if err := os.Symlink("v2", filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the swapped Secret is in force", knows(k, "new-key"))
}

// SIGHUP reads the file at once, and says so even when it is unchanged;
// without notices the poll still finds a change.
func TestWatchOnSignalAndPoll(t *testing.T) {
	_, k, hup, outcomes := watched(t, 50*time.Millisecond)
	hup <- os.Interrupt
	eventually(t, "the signal's reading is reported", func() bool {
		o := outcomes()
		return len(o) == 1 && o[0] == Unchanged
	})
	if !knows(k, "old-key")() {
		t.Error("the key is gone after an unchanged reading")
	}
}
