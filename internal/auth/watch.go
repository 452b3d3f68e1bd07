// SPDX-License-Identifier: Apache-2.0

package auth

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	// fsnotify is the file-change notifier the Go ecosystem settled on
	// (inotify on Linux, kqueue, ReadDirectoryChangesW), kept by the
	// fsnotify organisation; the poll below covers file systems it misses.
	"github.com/fsnotify/fsnotify"
)

// Reload outcomes, as Watch reports them.
const (
	Reloaded  = "reloaded"  // a changed file is in force
	Unchanged = "unchanged" // read again, same bytes
	Refused   = "refused"   // unreadable or invalid; the tenants before stay
)

// WatchOptions tune Watch; the zero value is the service's behaviour.
type WatchOptions struct {
	// Poll is how often the file is read again even without a change
	// notice [4s]; with the notices, a change takes effect within
	// moments, and without them within Poll.
	Poll time.Duration
	// Report is told of each reading but the periodic ones that found the
	// same bytes: its outcome, and the error of a refused file.
	Report func(outcome string, err error)
}

// settle is how long Watch waits after a change notice before reading, so
// that a file written in several steps is read once, whole.
const settle = 100 * time.Millisecond

// Watch keeps k in step with the tenants file at path until ctx ends. It
// reads the file again when it changes on disk (written in place, replaced
// by a rename, or a Kubernetes Secret whose symlinks are swapped: the
// file's directory is watched, not the file), on every value from reload
// (e.g. SIGHUP) and every opts.Poll. A file that cannot be read or is
// invalid is refused and the tenants in force stay. data is the content k
// was built from.
func Watch(ctx context.Context, path string, k *Keyring, data []byte, reload <-chan os.Signal, opts WatchOptions) {
	if opts.Poll <= 0 {
		opts.Poll = 4 * time.Second
	}
	report := opts.Report
	if report == nil {
		report = func(string, error) {}
	}
	var changed <-chan fsnotify.Event
	var watchErrs <-chan error
	if w, err := fsnotify.NewWatcher(); err == nil {
		defer w.Close()
		if err := w.Add(filepath.Dir(path)); err == nil {
			changed, watchErrs = w.Events, w.Errors
		}
	}
	poll := time.NewTicker(opts.Poll)
	defer poll.Stop()
	settled := time.NewTimer(settle)
	settled.Stop()
	var refused []byte // the content last refused, not reported again unless asked
	failing := false   // the last reading reported was refused
	read := func(quietIfSame bool) {
		next, err := os.ReadFile(path)
		if err != nil {
			failing = true
			report(Refused, fmt.Errorf("tenants file: %w", err))
			return
		}
		if bytes.Equal(next, data) {
			// A file repaired back to the content in force is reported,
			// so that what said it was refused is cleared.
			if !quietIfSame || failing {
				report(Unchanged, nil)
			}
			refused, failing = nil, false
			return
		}
		if quietIfSame && refused != nil && bytes.Equal(next, refused) {
			return
		}
		nk, err := Parse(next)
		if err != nil {
			refused, failing = next, true
			report(Refused, fmt.Errorf("tenants file %s: %w", path, err))
			return
		}
		refused, failing = nil, false
		k.Replace(nk)
		data = next
		report(Reloaded, nil)
	}
	// What changed between the reading of data and the watch's start
	// would have no notice: read now.
	read(true)
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
			settled.Reset(settle)
		case <-watchErrs:
			// A lost notice (queue overflow): read now rather than wait for the poll.
			settled.Reset(settle)
		case <-settled.C:
			read(true)
		case <-poll.C:
			read(true)
		case <-reload:
			read(false)
		}
	}
}
