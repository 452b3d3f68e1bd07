// SPDX-License-Identifier: Apache-2.0

package idem

import (
	"time"

	"github.com/idemsvc/idemsvc/clients/go/millitime"
)

// MilliTime is an instant of the API: RFC 3339 in UTC with millisecond
// precision. See package millitime.
type MilliTime = millitime.Time

// NewMilliTime returns t as a MilliTime in UTC, truncated to the millisecond.
func NewMilliTime(t time.Time) MilliTime { return millitime.New(t) }
