// SPDX-License-Identifier: Apache-2.0

package handlers

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/internal/quota"
)

// A tenant holds at most its slots at once; the reads past them wait for
// one, and those past the waiters' bound, or not allowed to wait, are
// refused at once with rate-limited; other tenants are not held up; a
// tenant's entry goes with its last read.
func TestReadSlots(t *testing.T) {
	r := newReadSlots(2)
	ctx := context.Background()
	var held, most atomic.Int64
	var wg sync.WaitGroup
	var refused atomic.Int64
	for range 2 + readSlotWaiters*2 {
		wg.Go(func() {
			release, err := r.acquire(ctx, "reader", true)
			if err != nil {
				refused.Add(1)
				return
			}
			n := held.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			time.Sleep(20 * time.Millisecond)
			held.Add(-1)
			release()
		})
	}
	// Meanwhile another tenant gets its slot at once, and a read that may
	// not wait is refused.
	time.Sleep(5 * time.Millisecond)
	release, err := r.acquire(ctx, "other", false)
	if err != nil {
		t.Fatalf("another tenant refused: %v", err)
	}
	release()
	if _, err := r.acquire(ctx, "reader", false); !isReadsInFlight(err) {
		t.Errorf("a read that may not wait past the slots: %v, want refused", err)
	}
	wg.Wait()
	if most.Load() != 2 {
		t.Errorf("%d reads at once, want the 2 slots", most.Load())
	}
	if refused.Load() != 0 {
		t.Errorf("%d refused within the waiters' bound", refused.Load())
	}
	if len(r.of) != 0 {
		t.Errorf("%d tenants kept after their reads", len(r.of))
	}

	// Past the waiters' bound, refused at once; a wait is over after
	// readSlotWait.
	hold := make([]func(), 2)
	for i := range hold {
		if hold[i], err = r.acquire(ctx, "reader", true); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	errs := make(chan error, readSlotWaiters*2+1)
	for range readSlotWaiters*2 + 1 {
		go func() {
			_, err := r.acquire(ctx, "reader", true)
			errs <- err
		}()
	}
	if err := <-errs; !isReadsInFlight(err) || time.Since(start) > readSlotWait/2 {
		t.Errorf("past the waiters' bound: %v after %v, want refused at once", err, time.Since(start))
	}
	for range readSlotWaiters * 2 {
		if err := <-errs; !isReadsInFlight(err) {
			t.Errorf("a wait over: %v, want refused", err)
		}
	}
	if time.Since(start) < readSlotWait {
		t.Errorf("waits refused after %v, want %v", time.Since(start), readSlotWait)
	}
	for _, release := range hold {
		release()
	}
	if len(r.of) != 0 {
		t.Errorf("%d tenants kept after their reads", len(r.of))
	}
}

func isReadsInFlight(err error) bool {
	var e *quota.Error
	return errors.As(err, &e) && e.Limit == quota.LimitReadsInFlight && errors.Is(err, quota.ErrRateLimited)
}
