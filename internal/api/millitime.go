package api

import (
	"time"

	idem "github.com/idemsvc/idemsvc/clients/go"
)

// MilliTime is the API's instant: RFC 3339 in UTC with millisecond
// precision. The Go client defines it; server and client share it.
type MilliTime = idem.MilliTime

// NewMilliTime returns t as a MilliTime in UTC, truncated to the millisecond.
func NewMilliTime(t time.Time) MilliTime { return idem.NewMilliTime(t) }
