// SPDX-License-Identifier: Apache-2.0

package statemachine_test

import (
	"testing"
	"time"

	sm "github.com/idemsvc/idemsvc/internal/statemachine"
)

// A 409 says to retry after about as long as the attempt has run, at least
// a second, and no later than the lease's end.
func TestInProgressRetryIn(t *testing.T) {
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		age, leaseLeft, want time.Duration
	}{
		{300 * time.Millisecond, 30 * time.Second, time.Second},
		{1500 * time.Millisecond, 28 * time.Second, 1500 * time.Millisecond},
		{10 * time.Second, 20 * time.Second, 10 * time.Second},
		{25 * time.Second, 5 * time.Second, 5 * time.Second},
		{0, 200 * time.Millisecond, 200 * time.Millisecond},
	} {
		e := &sm.InProgressError{Since: now.Add(-tt.age), Now: now, LeaseExpiresAt: now.Add(tt.leaseLeft)}
		if got := e.RetryIn(); got != tt.want {
			t.Errorf("attempt %v old, lease %v left: RetryIn = %v, want %v", tt.age, tt.leaseLeft, got, tt.want)
		}
	}
}
