// SPDX-License-Identifier: Apache-2.0

package auth

import (
	"errors"
	"fmt"
	"math"
)

// Quota is what a tenant may use, as the tenants file gives it under
// `limits`. A zero field is no limit. A tenant's own `limits` replace the
// `defaults` as a whole: a field it leaves out is unlimited for it.
type Quota struct {
	// BeginsPerS is the sustained begin rate, and Burst the begins
	// allowed at once on top of an idle period.
	BeginsPerS int64
	Burst      int64
	// StoredBytes bounds the response bytes (body after decoding, header
	// names and values) that the tenant's completes and terminal fails
	// stored and that are still within their retention.
	StoredBytes int64
	// Waiters bounds the tenant's begins waiting (wait_ms) at once on an
	// attempt in progress.
	Waiters int64
	// InProgress bounds the attempts the tenant holds at once: leases not
	// yet completed, failed or expired.
	InProgress int64
	// ReadBytesPerS is the tenant's read budget on each idemsvc instance:
	// stored response bytes replayed or read with a status per second.
	// Unlike the other limits, 0 (absent) is the default budget
	// (quota.DefaultReadBytesPerS), not none.
	ReadBytesPerS int64
}

// limitsFile is `limits` in the tenants file: absent fields are nil. The
// values are read as floats so that a fraction is refused, not truncated.
type limitsFile struct {
	BeginsPerS  *float64 `yaml:"begins_per_s"`
	Burst       *float64 `yaml:"burst"`
	StoredBytes *float64 `yaml:"stored_bytes"`
	Waiters     *float64 `yaml:"waiters"`
	InProgress  *float64 `yaml:"in_progress"`
	ReadBytes   *float64 `yaml:"read_bytes_per_s"`
}

// Bounds of the values, to keep the arithmetic on them far from overflow.
const (
	maxRate        = 10_000_000
	maxStoredBytes = 1 << 50 // 1 PiB
	maxWaiters     = 10_000_000
	maxInProgress  = 10_000_000
	maxReadBytes   = 1 << 40 // 1 TiB/s
)

// IsZero reports whether l limits nothing.
func (l Quota) IsZero() bool { return l == Quota{} }

// limits validates f: a limit given must be positive (leave it out for no
// limit), and a burst needs a rate. A rate without a burst gets a burst of
// one second's worth.
func (f *limitsFile) limits() (Quota, error) {
	var errs []error
	get := func(name string, v *float64, max int64) int64 {
		if v == nil {
			return 0
		}
		if *v < 1 || *v > float64(max) || *v != math.Trunc(*v) {
			errs = append(errs, fmt.Errorf("limits: %s must be a whole number from 1 to %d (leave it out for no limit)", name, max))
			return 0
		}
		return int64(*v)
	}
	l := Quota{
		BeginsPerS:    get("begins_per_s", f.BeginsPerS, maxRate),
		Burst:         get("burst", f.Burst, maxRate),
		StoredBytes:   get("stored_bytes", f.StoredBytes, maxStoredBytes),
		Waiters:       get("waiters", f.Waiters, maxWaiters),
		InProgress:    get("in_progress", f.InProgress, maxInProgress),
		ReadBytesPerS: get("read_bytes_per_s", f.ReadBytes, maxReadBytes),
	}
	if err := errors.Join(errs...); err != nil {
		return Quota{}, err
	}
	if l.Burst > 0 && l.BeginsPerS == 0 {
		return Quota{}, errors.New("limits: burst needs begins_per_s")
	}
	if l.BeginsPerS > 0 && l.Burst == 0 {
		l.Burst = l.BeginsPerS
	}
	return l, nil
}
