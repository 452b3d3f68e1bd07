// SPDX-License-Identifier: Apache-2.0

package idem

import (
	"math"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// The RFC 8785 JSON Canonicalization Scheme (JCS), for the middleware's
// fingerprint of a JSON body. It is written here because the SDK module
// may require only the standard library and the oapi-codegen runtime (lint
// enforces it), and encoding/json cannot produce it: it neither sorts
// members by UTF-16 code units nor formats numbers as ECMAScript does, and
// it silently replaces invalid UTF-8 and lone surrogates. The TypeScript
// SDK's canonicalJson (clients/ts/src/jcs.ts) is the same function; the
// vectors in conformance/fingerprints.json hold both to it.

// maxJSONDepth bounds the nesting canonicalJSON follows; a deeper text is
// taken as raw bytes, so that a body of a million '[' costs no deep stack.
const maxJSONDepth = 128

// canonicalJSON returns the JCS form of the JSON text b, and false when b
// is not one I-JSON value (RFC 7493) that JCS writes exactly: a syntax
// error, invalid UTF-8, a lone surrogate, a member name repeated in an
// object, a number that a float64 does not hold exactly as written (see
// exactNumber), or nesting deeper than maxJSONDepth. Such a body is taken
// as raw bytes, so that two requests that mean different things (accounts
// 9007199254740993 and 9007199254740992) never share a fingerprint.
func canonicalJSON(b []byte) ([]byte, bool) {
	p := jcsParser{in: b, out: make([]byte, 0, len(b))}
	p.skipSpace()
	if !p.value(0) {
		return nil, false
	}
	p.skipSpace()
	if p.pos != len(p.in) {
		return nil, false
	}
	return p.out, true
}

type jcsParser struct {
	in      []byte
	pos     int
	out     []byte
	scratch []byte // an object's members while they are put in order
	str     []byte // the string last decoded
}

func (p *jcsParser) skipSpace() {
	for p.pos < len(p.in) {
		switch p.in[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// value appends the canonical form of the value at pos to out.
func (p *jcsParser) value(depth int) bool {
	if p.pos >= len(p.in) {
		return false
	}
	switch c := p.in[p.pos]; {
	case c == '{':
		return depth < maxJSONDepth && p.object(depth+1)
	case c == '[':
		return depth < maxJSONDepth && p.array(depth+1)
	case c == '"':
		var ok bool
		if p.str, ok = p.decodeString(p.str[:0]); ok {
			p.out = appendJCSString(p.out, p.str)
		}
		return ok
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	default:
		for _, lit := range []string{"true", "false", "null"} {
			if len(p.in)-p.pos >= len(lit) && string(p.in[p.pos:p.pos+len(lit)]) == lit {
				p.pos += len(lit)
				p.out = append(p.out, lit...)
				return true
			}
		}
		return false
	}
}

func (p *jcsParser) array(depth int) bool {
	p.pos++ // [
	p.out = append(p.out, '[')
	p.skipSpace()
	if p.pos < len(p.in) && p.in[p.pos] == ']' {
		p.pos++
		p.out = append(p.out, ']')
		return true
	}
	for {
		p.skipSpace()
		if !p.value(depth) {
			return false
		}
		p.skipSpace()
		if p.pos >= len(p.in) {
			return false
		}
		switch p.in[p.pos] {
		case ',':
			p.pos++
			p.out = append(p.out, ',')
		case ']':
			p.pos++
			p.out = append(p.out, ']')
			return true
		default:
			return false
		}
	}
}

// member is an object member: its name, and where out holds it written
// ("name":value).
type member struct {
	name       string
	start, end int
}

func (p *jcsParser) object(depth int) bool {
	p.pos++ // {
	base := len(p.out)
	p.out = append(p.out, '{')
	p.skipSpace()
	if p.pos < len(p.in) && p.in[p.pos] == '}' {
		p.pos++
		p.out = append(p.out, '}')
		return true
	}
	// Members are written as they come; the object is rewritten in order
	// only when they came in another order (or a name came twice, which
	// refuses the text).
	var members []member
	inOrder := true
	for {
		p.skipSpace()
		if p.pos >= len(p.in) || p.in[p.pos] != '"' {
			return false
		}
		var ok bool
		if p.str, ok = p.decodeString(p.str[:0]); !ok {
			return false
		}
		name := string(p.str)
		p.skipSpace()
		if p.pos >= len(p.in) || p.in[p.pos] != ':' {
			return false
		}
		p.pos++
		p.skipSpace()
		if len(members) > 0 {
			p.out = append(p.out, ',')
			inOrder = inOrder && compareUTF16(members[len(members)-1].name, name) < 0
		}
		start := len(p.out)
		p.out = appendJCSString(p.out, p.str)
		p.out = append(p.out, ':')
		if !p.value(depth) {
			return false
		}
		members = append(members, member{name: name, start: start, end: len(p.out)})
		p.skipSpace()
		if p.pos >= len(p.in) {
			return false
		}
		if p.in[p.pos] == '}' {
			p.pos++
			break
		}
		if p.in[p.pos] != ',' {
			return false
		}
		p.pos++
	}
	if !inOrder {
		// Sorted by UTF-16 code units; a name that repeats is no I-JSON.
		p.scratch = append(p.scratch[:0], p.out[base:]...)
		slices.SortFunc(members, func(a, b member) int { return compareUTF16(a.name, b.name) })
		p.out = append(p.out[:base], '{')
		for i, m := range members {
			if i > 0 {
				if members[i-1].name == m.name {
					return false
				}
				p.out = append(p.out, ',')
			}
			p.out = append(p.out, p.scratch[m.start-base:m.end-base]...)
		}
	}
	p.out = append(p.out, '}')
	return true
}

// compareUTF16 orders a and b by their UTF-16 code units, as RFC 8785
// sorts member names: as code points, except that a character beyond the
// BMP (a surrogate pair, whose first unit is 0xD800-0xDBFF) sorts before
// U+E000 to U+FFFF.
func compareUTF16(a, b string) int {
	for a != "" && b != "" {
		ra, na := utf8.DecodeRuneInString(a)
		rb, nb := utf8.DecodeRuneInString(b)
		if ra != rb {
			ua, ub := firstUnit(ra), firstUnit(rb)
			if ua == ub { // two surrogate pairs with one first unit
				ua, ub = ra, rb
			}
			if ua < ub {
				return -1
			}
			return 1
		}
		a, b = a[na:], b[nb:]
	}
	return len(a) - len(b)
}

// firstUnit is the first UTF-16 code unit of r.
func firstUnit(r rune) rune {
	if r > 0xffff {
		return 0xd800 + (r-0x10000)>>10
	}
	return r
}

// decodeString reads the string at pos ('"') and appends it to b, its
// escapes decoded; it refuses control characters, invalid UTF-8 and lone
// surrogates.
func (p *jcsParser) decodeString(b []byte) ([]byte, bool) {
	p.pos++ // "
	for p.pos < len(p.in) {
		c := p.in[p.pos]
		switch {
		case c == '"':
			p.pos++
			return b, true
		case c < 0x20:
			return b, false
		case c == '\\':
			if p.pos+1 >= len(p.in) {
				return b, false
			}
			e := p.in[p.pos+1]
			p.pos += 2
			switch e {
			case '"', '\\', '/':
				b = append(b, e)
			case 'b':
				b = append(b, '\b')
			case 'f':
				b = append(b, '\f')
			case 'n':
				b = append(b, '\n')
			case 'r':
				b = append(b, '\r')
			case 't':
				b = append(b, '\t')
			case 'u':
				r, ok := p.hex4()
				if !ok {
					return b, false
				}
				if utf16.IsSurrogate(r) {
					// A high surrogate followed by an escaped low one.
					if r >= 0xdc00 || p.pos+1 >= len(p.in) || p.in[p.pos] != '\\' || p.in[p.pos+1] != 'u' {
						return b, false
					}
					p.pos += 2
					lo, ok := p.hex4()
					if !ok || lo < 0xdc00 || lo > 0xdfff {
						return b, false
					}
					r = utf16.DecodeRune(r, lo)
				}
				b = utf8.AppendRune(b, r)
			default:
				return b, false
			}
		case c < utf8.RuneSelf:
			b = append(b, c)
			p.pos++
		default:
			r, size := utf8.DecodeRune(p.in[p.pos:])
			if r == utf8.RuneError && size == 1 {
				return b, false
			}
			b = append(b, p.in[p.pos:p.pos+size]...)
			p.pos += size
		}
	}
	return b, false
}

func (p *jcsParser) hex4() (rune, bool) {
	if p.pos+4 > len(p.in) {
		return 0, false
	}
	var r rune
	for _, c := range p.in[p.pos : p.pos+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	p.pos += 4
	return r, true
}

// number reads the number at pos (RFC 8259's grammar) and appends it as
// ECMAScript's Number.prototype.toString writes it.
func (p *jcsParser) number() bool {
	start := p.pos
	if p.in[p.pos] == '-' {
		p.pos++
	}
	intDigits := 1
	switch {
	case p.pos < len(p.in) && p.in[p.pos] == '0':
		p.pos++
	default:
		if intDigits = p.digits(); intDigits == 0 {
			return false
		}
	}
	if p.pos < len(p.in) && p.in[p.pos] == '.' {
		p.pos++
		if p.digits() == 0 {
			return false
		}
	}
	if p.pos < len(p.in) && (p.in[p.pos] == 'e' || p.in[p.pos] == 'E') {
		p.pos++
		if p.pos < len(p.in) && (p.in[p.pos] == '+' || p.in[p.pos] == '-') {
			p.pos++
		}
		if p.digits() == 0 {
			return false
		}
	}
	lit := p.in[start:p.pos]
	digits := len(lit)
	if lit[0] == '-' {
		digits--
	}
	if intDigits == digits && digits <= 15 {
		// An integer of up to 15 digits is exact in a float64 and written
		// as it is; -0 is 0.
		if string(lit) == "-0" {
			lit = lit[1:]
		}
		p.out = append(p.out, lit...)
		return true
	}
	f, err := strconv.ParseFloat(string(lit), 64)
	if err != nil || math.IsInf(f, 0) || !exactNumber(lit, f) {
		return false
	}
	p.out = appendESNumber(p.out, f)
	return true
}

// exactNumber reports whether f, read from the JSON number lit, is exactly
// the number lit writes, so that JCS's form of it (f's shortest digits)
// means what lit means: lit's significant digits and exponent are f's
// shortest ones. It is false for an integer beyond 2^53 that a float64
// rounds (9007199254740993), more significant digits than a float64 keeps
// (0.10000000000000001), a non-zero number that underflows to 0 (1e-400)
// and one that overflows. A zero, in any spelling, is exact.
func exactNumber(lit []byte, f float64) bool {
	var buf [32]byte
	digits, exp := buf[:0], 0
	i := 0
	if lit[0] == '-' {
		i++
	}
	point := false
	for ; i < len(lit) && lit[i] != 'e' && lit[i] != 'E'; i++ {
		switch {
		case lit[i] == '.':
			point = true
		case len(digits) > 0 || lit[i] != '0': // leading zeros dropped
			digits = append(digits, lit[i])
			if point {
				exp--
			}
		case point:
			exp--
		}
	}
	if len(digits) == 0 {
		return true // a zero
	}
	if i < len(lit) {
		x, err := strconv.Atoi(string(lit[i+1:]))
		if err != nil {
			return false // an exponent beyond int: no float64 is that number
		}
		exp += x
	}
	for digits[len(digits)-1] == '0' {
		digits = digits[:len(digits)-1]
		exp++
	}
	if f == 0 {
		return false // underflow
	}
	// f's shortest digits, d.ddde±x: the number is ddd × 10^(x-len(ddd)+1).
	var sbuf [32]byte
	mant, x, _ := cutByte(strconv.AppendFloat(sbuf[:0], math.Abs(f), 'e', -1, 64), 'e')
	var short [32]byte
	shortest := short[:0]
	for _, c := range mant {
		if c != '.' {
			shortest = append(shortest, c)
		}
	}
	fexp, _ := strconv.Atoi(string(x))
	return string(digits) == string(shortest) && exp == fexp-len(shortest)+1
}

func (p *jcsParser) digits() int {
	n := 0
	for p.pos < len(p.in) && p.in[p.pos] >= '0' && p.in[p.pos] <= '9' {
		p.pos++
		n++
	}
	return n
}

// appendESNumber appends f as ECMAScript's Number::toString (ECMA-262,
// 6.1.6.1.20) writes it, as RFC 8785 requires: the shortest digits that
// read back as f (strconv's), placed in plain notation for exponents from
// -7 to 20 and in exponential notation ("1e+21", "1.5e-7") beyond.
func appendESNumber(out []byte, f float64) []byte {
	if f == 0 {
		return append(out, '0') // -0 too
	}
	if f < 0 {
		out = append(out, '-')
		f = -f
	}
	var buf [32]byte
	e := strconv.AppendFloat(buf[:0], f, 'e', -1, 64) // d[.ddd]e±xx
	mant, exp, _ := cutByte(e, 'e')
	digits := make([]byte, 0, len(mant))
	for _, c := range mant {
		if c != '.' {
			digits = append(digits, c)
		}
	}
	x, _ := strconv.Atoi(string(exp))
	k, n := len(digits), x+1 // the value is 0.digits × 10^n
	switch {
	case k <= n && n <= 21:
		out = append(out, digits...)
		for range n - k {
			out = append(out, '0')
		}
	case 0 < n && n <= 21:
		out = append(out, digits[:n]...)
		out = append(out, '.')
		out = append(out, digits[n:]...)
	case -6 < n && n <= 0:
		out = append(out, "0."...)
		for range -n {
			out = append(out, '0')
		}
		out = append(out, digits...)
	default:
		out = append(out, digits[0])
		if k > 1 {
			out = append(out, '.')
			out = append(out, digits[1:]...)
		}
		out = append(out, 'e')
		if n-1 >= 0 {
			out = append(out, '+')
		}
		out = strconv.AppendInt(out, int64(n-1), 10)
	}
	return out
}

func cutByte(b []byte, sep byte) (before, after []byte, found bool) {
	for i, c := range b {
		if c == sep {
			return b[:i], b[i+1:], true
		}
	}
	return b, nil, false
}

// appendJCSString appends s as a JSON string as RFC 8785 (and
// JSON.stringify) writes it: '"' and '\' escaped, control characters as
// \b \t \n \f \r or \u00xx, everything else as it is.
func appendJCSString(out, s []byte) []byte {
	const hex = "0123456789abcdef"
	out = append(out, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '"', '\\':
			out = append(out, '\\', c)
		case '\b':
			out = append(out, '\\', 'b')
		case '\t':
			out = append(out, '\\', 't')
		case '\n':
			out = append(out, '\\', 'n')
		case '\f':
			out = append(out, '\\', 'f')
		case '\r':
			out = append(out, '\\', 'r')
		default:
			if c < 0x20 {
				out = append(out, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			} else {
				out = append(out, c)
			}
		}
	}
	return append(out, '"')
}
