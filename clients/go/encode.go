// SPDX-License-Identifier: Apache-2.0

package idem

import (
	"slices"
	"strconv"
	"unicode/utf8"
)

// The bodies of the hot calls, written as encoding/json writes the
// generated request types: the same fields in the same order, the same
// omissions and the same string escaping, byte for byte, without
// encoding/json's reflection, which took 6% of a calling service's CPU
// under load (make load-sdk). encode_test.go checks every field against
// json.Marshal.

func appendBeginRequest(b []byte, r *BeginRequest) []byte {
	o := jsonObject{b: b}
	o.start()
	o.optString("fingerprint", r.Fingerprint)
	o.string("key", r.Key)
	o.optInt("lease_ms", r.LeaseMs)
	o.optString("owner", r.Owner)
	o.optInt("retention_s", r.RetentionS)
	o.optString("tenant", r.Tenant)
	o.optInt("wait_ms", r.WaitMs)
	return o.end()
}

func appendCompleteRequest(b []byte, r *CompleteRequest) []byte {
	o := jsonObject{b: b}
	o.start()
	o.string("key", r.Key)
	o.string("lease_token", r.LeaseToken)
	o.response(r.Response)
	o.optInt("retention_s", r.RetentionS)
	o.optString("tenant", r.Tenant)
	return o.end()
}

func appendFailRequest(b []byte, r *FailRequest) []byte {
	o := jsonObject{b: b}
	o.start()
	o.optString("error", r.Error)
	o.string("key", r.Key)
	o.string("lease_token", r.LeaseToken)
	o.response(r.Response)
	if r.Retryable != nil {
		o.name("retryable")
		o.b = strconv.AppendBool(o.b, *r.Retryable)
	}
	o.optString("tenant", r.Tenant)
	return o.end()
}

func appendExtendRequest(b []byte, r *ExtendRequest) []byte {
	o := jsonObject{b: b}
	o.start()
	o.string("key", r.Key)
	o.optInt("lease_ms", r.LeaseMs)
	o.string("lease_token", r.LeaseToken)
	o.optString("tenant", r.Tenant)
	return o.end()
}

// jsonObject appends one JSON object's members to b.
type jsonObject struct {
	b      []byte
	filled bool // a member was written: the next needs a comma
}

func (o *jsonObject) start()      { o.b = append(o.b, '{') }
func (o *jsonObject) end() []byte { return append(o.b, '}') }

// name writes a member's name, which needs no escaping.
func (o *jsonObject) name(n string) {
	if o.filled {
		o.b = append(o.b, ',')
	}
	o.filled = true
	o.b = append(o.b, '"')
	o.b = append(o.b, n...)
	o.b = append(o.b, '"', ':')
}

func (o *jsonObject) string(n, v string) {
	o.name(n)
	o.b = appendJSONString(o.b, v)
}

func (o *jsonObject) optString(n string, v *string) {
	if v != nil {
		o.string(n, *v)
	}
}

func (o *jsonObject) optInt(n string, v *int64) {
	if v != nil {
		o.name(n)
		o.b = strconv.AppendInt(o.b, *v, 10)
	}
}

// response writes a StoredResponse member, if any: body, body_encoding,
// headers (by name, as encoding/json sorts a map's keys) and status_code.
func (o *jsonObject) response(r *StoredResponse) {
	if r == nil {
		return
	}
	o.name("response")
	in := jsonObject{b: o.b}
	in.start()
	in.optString("body", r.Body)
	if r.BodyEncoding != nil {
		in.string("body_encoding", string(*r.BodyEncoding))
	}
	if ref := r.BodyRef; ref != nil { // replays carry it; a request never sets it
		in.name("body_ref")
		ro := jsonObject{b: in.b}
		ro.start()
		ro.string("sha256", ref.Sha256)
		size := ref.SizeBytes
		ro.optInt("size_bytes", &size)
		ro.string("url", ref.Url)
		in.b = ro.end()
	}
	if len(r.Headers) > 0 {
		in.name("headers")
		names := make([]string, 0, len(r.Headers))
		for name := range r.Headers {
			names = append(names, name)
		}
		slices.Sort(names)
		in.b = append(in.b, '{')
		for i, name := range names {
			if i > 0 {
				in.b = append(in.b, ',')
			}
			in.b = appendJSONString(in.b, name)
			in.b = append(in.b, ':')
			in.b = appendJSONString(in.b, r.Headers[name])
		}
		in.b = append(in.b, '}')
	}
	if r.StatusCode != nil {
		in.name("status_code")
		in.b = strconv.AppendInt(in.b, int64(*r.StatusCode), 10)
	}
	o.b = in.end()
}

const hexDigits = "0123456789abcdef"

// jsonSafe holds the ASCII bytes a JSON string carries as they are.
var jsonSafe = func() (safe [utf8.RuneSelf]bool) {
	for c := ' '; c < utf8.RuneSelf; c++ {
		safe[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return safe
}()

// appendJSONString appends s as a JSON string, escaped as encoding/json
// escapes it by default: ", \ and control characters; <, > and & (for
// HTML); U+2028 and U+2029 (for JavaScript); and each byte of invalid
// UTF-8 as U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	done := 0 // s[:done] is in b
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf && jsonSafe[c] {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			var esc string
			switch {
			case c == '"':
				esc = `\"`
			case c == '\\':
				esc = `\\`
			case c == '\n':
				esc = `\n`
			case c == '\r':
				esc = `\r`
			case c == '\t':
				esc = `\t`
			case c == '\b':
				esc = `\b`
			case c == '\f':
				esc = `\f`
			default: // other control characters, <, > and &
				b = append(b, s[done:i]...)
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
				i++
				done = i
				continue
			}
			b = append(b, s[done:i]...)
			b = append(b, esc...)
			i++
			done = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[done:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[done:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		done = i
	}
	b = append(b, s[done:]...)
	return append(b, '"')
}
