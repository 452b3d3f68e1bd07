// SPDX-License-Identifier: Apache-2.0

package statemachine

import (
	"crypto/rand"
	"encoding/hex"
	"math"
	"strings"
	"time"
)

// Limits bound what a request may carry. Zero fields take DefaultLimits'.
type Limits struct {
	MaxKeyBytes         int
	MaxFingerprintBytes int
	MaxOwnerBytes       int
	MinLease            time.Duration
	MaxLease            time.Duration
	DefaultLease        time.Duration
	MinRetention        time.Duration
	MaxRetention        time.Duration
	DefaultRetention    time.Duration
	// MaxResponseBytes bounds a stored response: body, header names and values.
	MaxResponseBytes int
	// CompressBodiesFrom is the length from which a stored body is kept
	// zstd-compressed, when that saves at least an eighth of it
	// (compress.go); math.MaxInt keeps every body as sent, as idemsvc did
	// before it compressed, for the benchmarks that compare.
	CompressBodiesFrom int
	// MaxResponseHeaders bounds the header fields of a stored response:
	// each costs a replay work of its own, whatever its size.
	MaxResponseHeaders int
	// MaxErrorBytes bounds the error message of a failure.
	MaxErrorBytes int
	// MaxWait bounds how long a begin may wait for an attempt in progress.
	MaxWait time.Duration
}

// maxPrefixed is the longest key, owner or fingerprint a record can hold:
// record.lua prefixes them with a 16-bit length.
const maxPrefixed = 1<<16 - 1

// DefaultLimits returns the limits of the contract.
func DefaultLimits() Limits {
	return Limits{
		MaxKeyBytes:         255,
		MaxFingerprintBytes: 256,
		MaxOwnerBytes:       256,
		MinLease:            100 * time.Millisecond,
		MaxLease:            time.Hour,
		DefaultLease:        30 * time.Second,
		MinRetention:        time.Second,
		MaxRetention:        30 * 24 * time.Hour,
		DefaultRetention:    24 * time.Hour,
		MaxResponseBytes:    1 << 20,
		CompressBodiesFrom:  compressMinBytes,
		MaxResponseHeaders:  100,
		MaxErrorBytes:       1024,
		MaxWait:             30 * time.Second,
	}
}

// WithDefaults fills zero fields from DefaultLimits and caps the lengths at
// what a record can hold.
func (l Limits) WithDefaults() Limits {
	d := DefaultLimits()
	fill := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}
	fillD := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	fill(&l.MaxKeyBytes, d.MaxKeyBytes)
	fill(&l.MaxFingerprintBytes, d.MaxFingerprintBytes)
	fill(&l.MaxOwnerBytes, d.MaxOwnerBytes)
	fill(&l.MaxResponseBytes, d.MaxResponseBytes)
	fill(&l.CompressBodiesFrom, d.CompressBodiesFrom)
	fill(&l.MaxResponseHeaders, d.MaxResponseHeaders)
	fill(&l.MaxErrorBytes, d.MaxErrorBytes)
	l.MaxKeyBytes = min(l.MaxKeyBytes, maxPrefixed)
	l.MaxOwnerBytes = min(l.MaxOwnerBytes, maxPrefixed)
	l.MaxFingerprintBytes = min(l.MaxFingerprintBytes, maxPrefixed)
	fillD(&l.MinLease, d.MinLease)
	fillD(&l.MaxLease, d.MaxLease)
	fillD(&l.DefaultLease, d.DefaultLease)
	fillD(&l.MinRetention, d.MinRetention)
	fillD(&l.MaxRetention, d.MaxRetention)
	fillD(&l.DefaultRetention, d.DefaultRetention)
	fillD(&l.MaxWait, d.MaxWait)
	l.DefaultLease = l.DefaultLease.Truncate(time.Millisecond)
	l.DefaultRetention = l.DefaultRetention.Truncate(time.Second)
	return l
}

// Token is a lease token in its stored form.
type Token [16]byte

// String returns the token as the API shows it.
func (t Token) String() string { return hex.EncodeToString(t[:]) }

// CheckKey validates the tenant and the client's key of any request.
func (l *Limits) CheckKey(tenant, key string) error {
	if err := CheckTenant(tenant); err != nil {
		return err
	}
	if len(key) == 0 || len(key) > l.MaxKeyBytes {
		return invalid("key", "must be 1 to %d bytes", l.MaxKeyBytes)
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return invalid("key", "may hold only visible ASCII (0x21-0x7E)")
		}
	}
	return nil
}

// ErrStatusCode refuses a response's status code outside 100–599. A
// store takes 0 for "none"; the API, which can say none by leaving the
// code out, refuses a 0 it is given with this error too.
var ErrStatusCode error = &InvalidError{Field: "response.status_code", Reason: "must be 100 to 599"}

// CheckTenant checks a tenant's name: [a-z0-9_-]{1,64}. It is the one
// statement of the rule: auth checks the names of the tenants file and
// of requests with it.
func CheckTenant(tenant string) error {
	if len(tenant) == 0 || len(tenant) > 64 {
		return invalid("tenant", "must be 1 to 64 characters")
	}
	for i := 0; i < len(tenant); i++ {
		c := tenant[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return invalid("tenant", "may hold only a-z, 0-9, _ and -")
		}
	}
	return nil
}

// CheckBegin validates req and returns its lease and retention with
// defaults applied, and the token the attempt gets if the Begin acquires.
func (l *Limits) CheckBegin(tenant string, req *BeginRequest) (lease, retention time.Duration, tok Token, err error) {
	if err := l.CheckKey(tenant, req.Key); err != nil {
		return 0, 0, tok, err
	}
	if len(req.Fingerprint) > l.MaxFingerprintBytes {
		return 0, 0, tok, invalid("fingerprint", "must be at most %d bytes", l.MaxFingerprintBytes)
	}
	if len(req.Owner) > l.MaxOwnerBytes {
		return 0, 0, tok, invalid("owner", "must be at most %d bytes", l.MaxOwnerBytes)
	}
	if lease, err = l.checkLease(req.Lease); err != nil {
		return 0, 0, tok, err
	}
	if retention, err = l.checkRetention(req.Retention); err != nil {
		return 0, 0, tok, err
	}
	if retention == 0 {
		retention = l.DefaultRetention
	}
	tok, err = beginToken(req)
	return lease, retention, tok, err
}

// The API gives durations as counts of a unit, absent or not. A request's
// counts are checked here, by the same rules as the store's requests, so
// that every limit is stated once.

// Lease is a request's lease_ms: 0 (the default lease) when absent, or an
// error naming lease_ms when out of range.
func (l *Limits) Lease(ms *int64) (time.Duration, error) {
	if ms == nil {
		return 0, nil
	}
	d, ok := count(*ms, time.Millisecond)
	if !ok || d == 0 {
		return 0, invalid("lease_ms", "must be %d to %d", l.MinLease.Milliseconds(), l.MaxLease.Milliseconds())
	}
	return l.checkLease(d)
}

// Retention is a request's retention_s: 0 (the record's own, or the
// default) when absent, or an error naming retention_s when out of range.
func (l *Limits) Retention(s *int64) (time.Duration, error) {
	if s == nil {
		return 0, nil
	}
	d, ok := count(*s, time.Second)
	if !ok || d == 0 {
		return 0, invalid("retention_s", "must be %d to %d", int64(l.MinRetention.Seconds()), int64(l.MaxRetention.Seconds()))
	}
	return l.checkRetention(d)
}

// Wait is a begin's wait_ms: 0 when absent, or an error naming wait_ms when
// over MaxWait.
func (l *Limits) Wait(ms *int64) (time.Duration, error) {
	if ms == nil {
		return 0, nil
	}
	d, ok := count(*ms, time.Millisecond)
	if !ok || d > l.MaxWait {
		return 0, invalid("wait_ms", "must be 0 to %d", l.MaxWait.Milliseconds())
	}
	return d, nil
}

// count is n units, if that is 0 or more and fits a Duration.
func count(n int64, unit time.Duration) (time.Duration, bool) {
	if n < 0 || n > math.MaxInt64/int64(unit) {
		return 0, false
	}
	return time.Duration(n) * unit, true
}

// checkLease validates a lease, defaulting zero.
func (l *Limits) checkLease(d time.Duration) (time.Duration, error) {
	if d == 0 {
		return l.DefaultLease, nil
	}
	if d < l.MinLease || d > l.MaxLease {
		return 0, invalid("lease_ms", "must be %d to %d", l.MinLease.Milliseconds(), l.MaxLease.Milliseconds())
	}
	return d.Truncate(time.Millisecond), nil
}

// checkRetention validates a retention; zero stays zero ("keep the current one").
func (l *Limits) checkRetention(d time.Duration) (time.Duration, error) {
	if d != 0 && (d < l.MinRetention || d > l.MaxRetention) {
		return 0, invalid("retention_s", "must be %d to %d", int64(l.MinRetention.Seconds()), int64(l.MaxRetention.Seconds()))
	}
	return d.Truncate(time.Second), nil
}

// CheckFinish validates a Complete or Fail and returns the parsed token.
func (l *Limits) CheckFinish(tenant, key, tok string, retention time.Duration, resp *Response, errMsg string) (Token, error) {
	if err := l.CheckKey(tenant, key); err != nil {
		return Token{}, err
	}
	t, err := parseToken(tok)
	if err != nil {
		return Token{}, err
	}
	if _, err := l.checkRetention(retention); err != nil {
		return Token{}, err
	}
	if resp.StatusCode != 0 && (resp.StatusCode < 100 || resp.StatusCode > 599) {
		return Token{}, ErrStatusCode
	}
	if len(errMsg) > l.MaxErrorBytes {
		return Token{}, invalid("error", "must be at most %d bytes", l.MaxErrorBytes)
	}
	if len(resp.Headers) > l.MaxResponseHeaders {
		return Token{}, invalid("response.headers", "must hold at most %d header fields", l.MaxResponseHeaders)
	}
	size := int(resp.BodySize())
	for name, value := range resp.Headers {
		if !isFieldName(name) {
			return Token{}, invalid("response.headers", "a header name must be an HTTP field name (RFC 9110 token characters)")
		}
		if strings.ContainsAny(value, "\r\n\x00") {
			return Token{}, invalid("response.headers", "a header value must not hold CR, LF or NUL")
		}
		size += len(name) + len(value)
	}
	if size > l.MaxResponseBytes {
		return Token{}, sizeError(size, l.MaxResponseBytes)
	}
	return t, nil
}

// isFieldName reports whether name is an HTTP field name: a non-empty token
// of RFC 9110 (letters, digits and !#$%&'*+-.^_`|~).
func isFieldName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// CheckExtend validates an Extend and returns the parsed token and the lease.
func (l *Limits) CheckExtend(tenant string, req *ExtendRequest) (Token, time.Duration, error) {
	if err := l.CheckKey(tenant, req.Key); err != nil {
		return Token{}, 0, err
	}
	t, err := parseToken(req.Token)
	if err != nil {
		return Token{}, 0, err
	}
	lease, err := l.checkLease(req.Lease)
	return t, lease, err
}

// NewToken returns a random lease token in Lease.Token's form, for
// BeginRequest.Token.
func NewToken() string {
	var t Token
	rand.Read(t[:])
	return t.String()
}

// beginToken is the token a Begin acquires with: req's, or a random one.
func beginToken(req *BeginRequest) (Token, error) {
	if req.Token == "" {
		var t Token
		rand.Read(t[:])
		return t, nil
	}
	return parseToken(req.Token)
}

func parseToken(s string) (Token, error) {
	var t Token
	if s == "" {
		return t, invalid("lease_token", "is required")
	}
	if len(s) != 2*len(t) {
		return t, invalid("lease_token", "is not a lease token of idemsvc")
	}
	if _, err := hex.Decode(t[:], []byte(s)); err != nil {
		return t, invalid("lease_token", "is not a lease token of idemsvc")
	}
	return t, nil
}
