// SPDX-License-Identifier: Apache-2.0

package api

import (
	"time"

	"github.com/idemsvc/idemsvc/clients/go/millitime"
)

// MilliTime is the API's instant: RFC 3339 in UTC with millisecond
// precision, from the leaf package the Go client shares.
type MilliTime = millitime.Time

// NewMilliTime returns t as a MilliTime in UTC, truncated to the millisecond.
func NewMilliTime(t time.Time) MilliTime { return millitime.New(t) }
