// SPDX-License-Identifier: Apache-2.0

package statemachine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"
	"unsafe"
)

// Stored is a record as a store keeps it, lease token included. Times are
// milliseconds since the Unix epoch on the store's clock.
type Stored struct {
	state       State
	recovered   bool
	retryable   bool
	attempt     int64
	created     int64
	updated     int64
	lease       int64 // lease expiry
	expires     int64 // end of retention
	retention   int64 // seconds
	token       Token
	call        [8]byte // the last Extend call, to recognise a re-sent one
	owner       string
	fingerprint string
	key         string
	errMsg      string
	response    string // EncodeResponse's form; empty while in progress
}

// The record layout of internal/lua/record.lua: a fixed head, four
// length-prefixed strings, then the response to the end.
const (
	recordVersion  = 1
	fixedHeadBytes = 4 + 4 + 4*8 + 4 + 16 + 8
)

// ErrCorrupt is a stored record that does not decode.
var ErrCorrupt = errors.New("statemachine: corrupt record")

// DecodeStored parses a record written by the Lua scripts. A head without
// a response (as complete, fail and extend reply) decodes with none.
func DecodeStored(raw string) (Stored, error) {
	var s Stored
	if len(raw) < fixedHeadBytes || raw[0] != recordVersion {
		return s, ErrCorrupt
	}
	s.state = State(raw[1])
	s.recovered = raw[2] == 1
	s.retryable = raw[3] == 1
	s.attempt = int64(bigEndian(raw[4:8]))
	s.created = int64(bigEndian(raw[8:16]))
	s.updated = int64(bigEndian(raw[16:24]))
	s.lease = int64(bigEndian(raw[24:32]))
	s.expires = int64(bigEndian(raw[32:40]))
	s.retention = int64(bigEndian(raw[40:44]))
	copy(s.token[:], raw[44:60])
	copy(s.call[:], raw[60:68])
	rest := raw[fixedHeadBytes:]
	var ok bool
	if s.owner, rest, ok = cutString(rest, 2); !ok {
		return s, ErrCorrupt
	}
	if s.fingerprint, rest, ok = cutString(rest, 2); !ok {
		return s, ErrCorrupt
	}
	if s.key, rest, ok = cutString(rest, 2); !ok {
		return s, ErrCorrupt
	}
	if s.errMsg, rest, ok = cutString(rest, 4); !ok {
		return s, ErrCorrupt
	}
	s.response = rest
	return s, nil
}

// SetResponse gives a record decoded from its head alone the response
// read apart (redisstore reads a large record's response after its
// script), without copying the two into one string.
func (s *Stored) SetResponse(response string) { s.response = response }

// bigEndian reads an unsigned big-endian integer of up to 8 bytes from s,
// without copying it to a []byte.
func bigEndian(s string) uint64 {
	var v uint64
	for i := 0; i < len(s); i++ {
		v = v<<8 | uint64(s[i])
	}
	return v
}

// cutString splits a string with a big-endian length prefix of n bytes off s.
func cutString(s string, n int) (value, rest string, ok bool) {
	if len(s) < n {
		return "", s, false
	}
	size := int(bigEndian(s[:n]))
	if len(s)-n < size {
		return "", s, false
	}
	return s[n : n+size], s[n+size:], true
}

// EncodeResponse returns the response's form inside a record: flags u8,
// status u16, header count u32, each header's name and value with u32
// lengths, then the body as stored. Flags: bit 0 the body was sent
// base64-encoded; bits 1-2 the body's encoding in the record (compress.go:
// identity or zstd: bodies of at least compressFrom bytes may be
// compressed, Limits.CompressBodiesFrom); bit 3 the body is a reference
// to the blob store (Ref) instead: its size u64, SHA-256 (32 bytes),
// encoding with a u8 length, and the object key to the end. A zero
// Response is the empty string.
func EncodeResponse(r *Response, compressFrom int) string {
	if r.IsZero() {
		return ""
	}
	size := 1 + 2 + 4 + len(r.Body) + len(r.Zstd)
	if r.Ref != nil {
		size += 8 + 32 + 1 + len(r.Ref.Encoding) + len(r.Ref.Object)
	}
	for name, value := range r.Headers {
		size += 8 + len(name) + len(value)
	}
	if r.Zstd == "" && len(r.Body) >= compressFrom {
		size += zstdOverhead(len(r.Body)) // room for an attempt that does not shrink it
	}
	b := make([]byte, 1, size)
	b = binary.BigEndian.AppendUint16(b, uint16(r.StatusCode))
	b = binary.BigEndian.AppendUint32(b, uint32(len(r.Headers)))
	for _, name := range slices.Sorted(maps.Keys(r.Headers)) {
		b = binary.BigEndian.AppendUint32(b, uint32(len(name)))
		b = append(b, name...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(r.Headers[name])))
		b = append(b, r.Headers[name]...)
	}
	if ref := r.Ref; ref != nil {
		b = binary.BigEndian.AppendUint64(b, uint64(ref.Size))
		b = append(b, ref.SHA256[:]...)
		b = append(b, byte(len(ref.Encoding)))
		b = append(b, ref.Encoding...)
		b = append(b, ref.Object...)
		b[0] = flagRef
	} else if r.Zstd != "" { // compressed already
		b = append(b, r.Zstd...)
		b[0] = encodingZstd
	} else {
		var encoding byte
		b, encoding = appendBody(b, r.Body, compressFrom)
		b[0] = encoding
	}
	if r.Base64 {
		b[0] |= flagBase64
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// StoredSize is what a response counts against a tenant's stored_bytes,
// as the contract counts it: the body after decoding (as sent, whether the
// record keeps it compressed or not), plus header names and values. A
// tenant's budget is then the same on every store and does not move with
// how well its answers compress.
func StoredSize(form string, r *Response) int64 {
	if form == "" {
		return 0
	}
	n := int(r.BodySize())
	if r.Ref != nil { // kept in the blob store, counted as sent
		n += int(r.Ref.Size)
	}
	for name, value := range r.Headers {
		n += len(name) + len(value)
	}
	return int64(n)
}

// decodeResponse decodes EncodeResponse's form; a compressed body may
// decode to at most maxBody bytes. With stream, a compressed body of
// StreamBodiesFrom bytes or more is left compressed (Response.Zstd), its
// declared size checked.
func decodeResponse(s string, maxBody int, stream bool) (Response, error) {
	var r Response
	if s == "" {
		return r, nil
	}
	if len(s) < 7 {
		return r, ErrCorrupt
	}
	r.Base64 = s[0]&flagBase64 != 0
	r.StatusCode = int(bigEndian(s[1:3]))
	n := int(bigEndian(s[3:7]))
	rest := s[7:]
	if n > 0 {
		r.Headers = make(map[string]string, min(n, len(rest)/8))
	}
	for range n {
		name, after, ok := cutString(rest, 4)
		if !ok {
			return r, ErrCorrupt
		}
		value, after, ok := cutString(after, 4)
		if !ok {
			return r, ErrCorrupt
		}
		r.Headers[name] = value
		rest = after
	}
	if s[0]&flagRef != 0 {
		if len(rest) < 8+32+1 {
			return r, ErrCorrupt
		}
		ref := &BodyRef{Size: int64(bigEndian(rest[:8]))}
		copy(ref.SHA256[:], rest[8:40])
		encoding, object, ok := cutString(rest[40:], 1)
		if !ok || object == "" {
			return r, ErrCorrupt
		}
		ref.Encoding, ref.Object = encoding, object
		r.Ref = ref
		return r, nil
	}
	switch s[0] & encodingMask {
	case encodingIdentity:
		r.Body = rest
	case encodingZstd:
		if stream {
			size, err := frameSize(rest, maxBody)
			if err != nil {
				return r, err
			}
			if size >= StreamBodiesFrom {
				r.Zstd, r.ZstdSize = rest, size
				return r, nil
			}
		}
		body, err := decompressBody(rest, maxBody)
		if err != nil {
			return r, err
		}
		r.Body = body
	default:
		return r, fmt.Errorf("%w: unknown body encoding %d", ErrCorrupt, s[0]&encodingMask>>1)
	}
	return r, nil
}

// Lease returns the lease of an in-progress record.
func (s *Stored) Lease() Lease {
	return Lease{
		Token:     s.token.String(),
		Attempt:   s.attempt,
		ExpiresAt: msTime(s.lease),
		Recovered: s.recovered,
	}
}

// Record returns the public view of s at time now, with its response if
// withResponse, its body decoded to at most maxBody bytes.
func (s *Stored) Record(tenant string, now int64, withResponse bool, maxBody int) (Record, error) {
	return s.record(tenant, now, withResponse, maxBody, false)
}

// RecordStreamed is Record with its response, a long compressed body left
// compressed (Response.Zstd) for a caller that decodes it as it writes it.
func (s *Stored) RecordStreamed(tenant string, now int64, maxBody int) (Record, error) {
	return s.record(tenant, now, true, maxBody, true)
}

func (s *Stored) record(tenant string, now int64, withResponse bool, maxBody int, stream bool) (Record, error) {
	r := Record{
		Tenant:      tenant,
		Key:         s.key,
		State:       s.state,
		Attempt:     s.attempt,
		Owner:       s.owner,
		Fingerprint: s.fingerprint,
		CreatedAt:   msTime(s.created),
		UpdatedAt:   msTime(s.updated),
		ExpiresAt:   msTime(s.expires),
		Retention:   time.Duration(s.retention) * time.Second,
		Retryable:   s.retryable,
		Error:       s.errMsg,
	}
	if s.state == StateInProgress {
		r.LeaseExpiresAt = msTime(s.lease)
		r.LeaseExpired = s.lease <= now
	}
	if withResponse {
		resp, err := decodeResponse(s.response, maxBody, stream)
		if err != nil {
			return Record{}, fmt.Errorf("statemachine: a record of tenant %s: %w", tenant, err) // no client key: errors are logged
		}
		r.Response = resp
	}
	return r, nil
}

func msTime(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

// Acquired answers a Begin, on either store, that holds the lease of s.
func Acquired(tenant string, s *Stored, now int64) (BeginResult, error) {
	rec, err := s.Record(tenant, now, false, 0)
	return BeginResult{Acquired: true, Lease: s.Lease(), Record: rec}, err
}

// Busy is the error of a Begin that meets s in progress under a live
// lease at time now: ErrInProgress, saying which attempt holds the key.
func Busy(s *Stored, now int64) error {
	return &InProgressError{Attempt: s.attempt, LeaseExpiresAt: msTime(s.lease),
		Since: msTime(s.updated), Now: msTime(now)}
}

// Replay answers a Begin on the finished record s, its body decoded to at
// most maxBody bytes.
func Replay(tenant string, s *Stored, now int64, maxBody int) (BeginResult, error) {
	rec, err := s.Record(tenant, now, true, maxBody)
	return BeginResult{Record: rec}, err
}

// ReplayStreamed is Replay with a long compressed body left compressed
// (Response.Zstd) for a caller that decodes it as it writes it.
func ReplayStreamed(tenant string, s *Stored, now int64, maxBody int) (BeginResult, error) {
	rec, err := s.RecordStreamed(tenant, now, maxBody)
	return BeginResult{Record: rec}, err
}

// HeadPrefixes is the number of length-prefixed strings in a record's head.
const HeadPrefixes = 4

// HeadLength reads the length of the record head at the start of raw, as
// far as raw holds it: the whole head's length and true, or false and how
// many bytes are known to belong to the head so far.
func HeadLength(raw string) (int, bool) {
	at := fixedHeadBytes
	for _, prefix := range [HeadPrefixes]int{2, 2, 2, 4} {
		if len(raw) < at+prefix {
			return at + prefix, false
		}
		at += prefix + int(bigEndian(raw[at:at+prefix]))
	}
	return at, len(raw) >= at
}
