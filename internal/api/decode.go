package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// FieldError reports a request body that does not fit the API: an unknown,
// repeated or mistyped field, or a body that is not a JSON object. Field is
// the member's path as the API names it ("response.headers"), empty for the
// body as a whole.
type FieldError struct {
	Field  string
	Reason string
}

// ErrBadRequest is what every *FieldError matches with errors.Is.
var ErrBadRequest = errors.New("bad request")

// Is makes errors.Is(err, ErrBadRequest) hold.
func (e *FieldError) Is(target error) bool { return target == ErrBadRequest }

func (e *FieldError) Error() string {
	if e.Field == "" {
		return "request body: " + e.Reason
	}
	return e.Field + ": " + e.Reason
}

// The request bodies decode strictly: member names match exactly (not case
// insensitively as encoding/json would), unknown and repeated members are
// errors, and so is a body that is not an object.

// UnmarshalJSON decodes a begin request strictly.
func (r *BeginRequest) UnmarshalJSON(b []byte) error {
	*r = BeginRequest{}
	return decodeObject(b, func(name []byte) any {
		switch string(name) {
		case "key":
			return &r.Key
		case "fingerprint":
			return &r.Fingerprint
		case "owner":
			return &r.Owner
		case "lease_ms":
			return &r.LeaseMs
		case "retention_s":
			return &r.RetentionS
		case "wait_ms":
			return &r.WaitMs
		case "tenant":
			return &r.Tenant
		}
		return nil
	})
}

// UnmarshalJSON decodes a complete request strictly.
func (r *CompleteRequest) UnmarshalJSON(b []byte) error {
	*r = CompleteRequest{}
	return decodeObject(b, func(name []byte) any {
		switch string(name) {
		case "key":
			return &r.Key
		case "lease_token":
			return &r.LeaseToken
		case "response":
			return &r.Response
		case "retention_s":
			return &r.RetentionS
		case "tenant":
			return &r.Tenant
		}
		return nil
	})
}

// UnmarshalJSON decodes a fail request strictly.
func (r *FailRequest) UnmarshalJSON(b []byte) error {
	*r = FailRequest{}
	return decodeObject(b, func(name []byte) any {
		switch string(name) {
		case "key":
			return &r.Key
		case "lease_token":
			return &r.LeaseToken
		case "retryable":
			return &r.Retryable
		case "error":
			return &r.Error
		case "response":
			return &r.Response
		case "tenant":
			return &r.Tenant
		}
		return nil
	})
}

// UnmarshalJSON decodes an extend request strictly.
func (r *ExtendRequest) UnmarshalJSON(b []byte) error {
	*r = ExtendRequest{}
	return decodeObject(b, func(name []byte) any {
		switch string(name) {
		case "key":
			return &r.Key
		case "lease_token":
			return &r.LeaseToken
		case "lease_ms":
			return &r.LeaseMs
		case "tenant":
			return &r.Tenant
		}
		return nil
	})
}

// UnmarshalJSON decodes a response to store strictly.
func (r *StoredResponse) UnmarshalJSON(b []byte) error {
	*r = StoredResponse{}
	return decodeObject(b, func(name []byte) any {
		switch string(name) {
		case "status_code":
			return &r.StatusCode
		case "headers":
			return &r.Headers
		case "body":
			return &r.Body
		case "body_encoding":
			return &r.BodyEncoding
		}
		return nil
	})
}

// maxFields bounds the members an object may have; no request has more.
const maxFields = 8

var (
	errNotObject = &FieldError{Reason: "must be a JSON object"}
	errSyntax    = &FieldError{Reason: "is not valid JSON"}
)

// decodeObject decodes the JSON object in b, member by member, into the
// destinations field returns for their names (nil for an unknown name). It
// finds the members in one pass over b and hands each value to decodePlain
// or, for anything beyond its plain cases, to encoding/json, which checks it.
func decodeObject(b []byte, field func(name []byte) any) error {
	i := skipSpace(b, 0)
	if i == len(b) || b[i] != '{' {
		return errNotObject
	}
	var seen [maxFields]any // the destinations filled so far
	n := 0
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return end(b, i+1)
	}
	for {
		nameEnd, ok := skipString(b, i)
		if !ok {
			return errSyntax
		}
		name := b[i+1 : nameEnd-1]
		if bytes.IndexByte(name, '\\') >= 0 {
			var unquoted string
			if err := json.Unmarshal(b[i:nameEnd], &unquoted); err != nil {
				return errSyntax
			}
			name = []byte(unquoted)
		}
		i = skipSpace(b, nameEnd)
		if i == len(b) || b[i] != ':' {
			return errSyntax
		}
		i = skipSpace(b, i+1)
		valueEnd, ok := skipValue(b, i)
		if !ok {
			return errSyntax
		}
		dst := field(name)
		if dst == nil {
			return &FieldError{Field: string(name), Reason: "is not a known field"}
		}
		for _, s := range seen[:n] {
			if s == dst {
				return &FieldError{Field: string(name), Reason: "appears more than once"}
			}
		}
		seen[n] = dst // n < maxFields: every name is known and distinct
		n++
		if !decodePlain(b[i:valueEnd], dst) {
			if err := strictStrings(b[i:valueEnd], dst); err != nil {
				return &FieldError{Field: string(name), Reason: err.Error()}
			}
			if err := json.Unmarshal(b[i:valueEnd], dst); err != nil {
				return fieldError(string(name), err)
			}
		}
		i = skipSpace(b, valueEnd)
		switch {
		case i < len(b) && b[i] == ',':
			i = skipSpace(b, i+1)
		case i < len(b) && b[i] == '}':
			return end(b, i+1)
		default:
			return errSyntax
		}
	}
}

// strictStrings refuses what encoding/json would accept by changing it:
// invalid UTF-8 or a lone surrogate escape, which it replaces with U+FFFD
// (so a replay would not be byte for byte), and a null where a map holds
// strings, which it turns into "".
func strictStrings(v []byte, dst any) error {
	switch dst.(type) {
	case *string, **string, **BodyEncoding, *map[string]string:
	default:
		return nil // an object checks its own members
	}
	if !utf8.Valid(v) || loneSurrogate(v) {
		return errors.New("is not valid UTF-8 (a binary body goes as base64)")
	}
	if _, ok := dst.(*map[string]string); ok {
		var raw map[string]json.RawMessage
		if json.Unmarshal(v, &raw) == nil {
			for _, value := range raw {
				if len(value) == 0 || value[0] != '"' {
					return errors.New("a value is not a string")
				}
			}
		}
	}
	return nil
}

// loneSurrogate reports whether JSON text v holds a \u escape of a UTF-16
// surrogate that is not part of a pair. Backslashes appear in valid JSON
// only inside strings, so every one starts an escape.
func loneSurrogate(v []byte) bool {
	hex4 := func(i int) (rune, bool) {
		if i+6 > len(v) || v[i] != '\\' || v[i+1] != 'u' {
			return 0, false
		}
		var r rune
		for _, c := range v[i+2 : i+6] {
			switch {
			case '0' <= c && c <= '9':
				r = r<<4 | rune(c-'0')
			case 'a' <= c && c <= 'f':
				r = r<<4 | rune(c-'a'+10)
			case 'A' <= c && c <= 'F':
				r = r<<4 | rune(c-'A'+10)
			default:
				return 0, false
			}
		}
		return r, true
	}
	for i := 0; i < len(v); i++ {
		if v[i] != '\\' {
			continue
		}
		r, ok := hex4(i)
		switch {
		case !ok:
			i++ // a short escape: skip the escaped character
		case 0xD800 <= r && r < 0xDC00:
			low, ok := hex4(i + 6)
			if !ok || low < 0xDC00 || low > 0xDFFF {
				return true
			}
			i += 11
		case 0xDC00 <= r && r <= 0xDFFF:
			return true
		default:
			i += 5
		}
	}
	return false
}

// decodePlain decodes the commonest values without reflection, as
// encoding/json would: a string (see plainString) into a string or a
// pointer to one, an object of such strings into a map, and an
// integer of up to 18 digits, written plainly, into an *int or *int64 field. It
// reports false for anything else, which encoding/json then decodes.
// Unlike encoding/json it never merges into what dst holds: it sets a new
// map or pointer, which is the same only because decodeObject hands it
// zeroed destinations, each at most once.
func decodePlain(v []byte, dst any) bool {
	switch d := dst.(type) {
	case *string:
		s, ok := plainString(v)
		if ok {
			*d = s
		}
		return ok
	case **string:
		s, ok := plainString(v)
		if ok {
			*d = &s
		}
		return ok
	case **BodyEncoding:
		s, ok := plainString(v)
		if ok {
			e := BodyEncoding(s)
			*d = &e
		}
		return ok
	case *map[string]string:
		m, ok := plainStringMap(v)
		if ok {
			*d = m
		}
		return ok
	case **int64:
		n, ok := plainInt(v)
		if ok {
			*d = &n
		}
		return ok
	case **int:
		n, ok := plainInt(v)
		if i := int(n); ok && int64(i) == n {
			*d = &i
			return true
		}
		return false
	}
	return false
}

// plainString decodes a JSON string of valid UTF-8 whose escapes are the
// short ones (\n, \", ...) or \u escapes outside the surrogate range. It
// reports false for anything else (a surrogate pair, invalid UTF-8, which
// encoding/json replaces, or not a string at all).
func plainString(v []byte) (string, bool) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return "", false
	}
	inner := v[1 : len(v)-1]
	i := 0
	for i < len(inner) && inner[i] >= 0x20 && inner[i] < utf8.RuneSelf && inner[i] != '\\' && inner[i] != '"' {
		i++
	}
	if i == len(inner) {
		return string(inner), true
	}
	var s strings.Builder
	s.Grow(len(inner))
	s.Write(inner[:i])
	for i < len(inner) {
		switch c := inner[i]; {
		case c == '\\' && i+1 < len(inner):
			e, n := unescape(inner[i+1:])
			if n == 0 {
				return "", false
			}
			s.WriteRune(e)
			i += 1 + n
		case c < 0x20 || c == '"' || c == '\\':
			return "", false
		case c < utf8.RuneSelf:
			s.WriteByte(c)
			i++
		default:
			r, size := utf8.DecodeRune(inner[i:])
			if r == utf8.RuneError && size == 1 {
				return "", false
			}
			s.Write(inner[i : i+size])
			i += size
		}
	}
	return s.String(), true
}

// unescape decodes the escape at the start of b, which follows a
// backslash: the character and the bytes it took, or 0 bytes when it is
// not one plainString decodes.
func unescape(b []byte) (rune, int) {
	switch b[0] {
	case '"', '\\', '/':
		return rune(b[0]), 1
	case 'b':
		return '\b', 1
	case 'f':
		return '\f', 1
	case 'n':
		return '\n', 1
	case 'r':
		return '\r', 1
	case 't':
		return '\t', 1
	case 'u':
		if len(b) < 5 {
			return 0, 0
		}
		var r rune
		for _, c := range b[1:5] {
			switch {
			case '0' <= c && c <= '9':
				c -= '0'
			case 'a' <= c && c <= 'f':
				c -= 'a' - 10
			case 'A' <= c && c <= 'F':
				c -= 'A' - 10
			default:
				return 0, 0
			}
			r = r<<4 | rune(c)
		}
		if utf16.IsSurrogate(r) {
			return 0, 0
		}
		return r, 5
	}
	return 0, 0
}

// plainStringMap decodes a JSON object whose names and values are all
// plain strings (see plainString); a repeated name keeps its last value.
func plainStringMap(v []byte) (map[string]string, bool) {
	if len(v) == 0 || v[0] != '{' {
		return nil, false
	}
	m := make(map[string]string)
	i := skipSpace(v, 1)
	if i < len(v) && v[i] == '}' {
		return m, i+1 == len(v)
	}
	for {
		nameEnd, ok := skipString(v, i)
		if !ok {
			return nil, false
		}
		name, ok := plainString(v[i:nameEnd])
		if i = skipSpace(v, nameEnd); !ok || i == len(v) || v[i] != ':' {
			return nil, false
		}
		i = skipSpace(v, i+1)
		valueEnd, ok := skipString(v, i)
		if !ok {
			return nil, false
		}
		value, ok := plainString(v[i:valueEnd])
		if !ok {
			return nil, false
		}
		m[name] = value
		switch i = skipSpace(v, valueEnd); {
		case i < len(v) && v[i] == ',':
			i = skipSpace(v, i+1)
		case i+1 == len(v) && v[i] == '}':
			return m, true
		default:
			return nil, false
		}
	}
}

// plainInt parses a JSON integer of 1 to 18 digits, with an optional minus
// and no leading zero.
func plainInt(v []byte) (int64, bool) {
	digits := v
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || len(digits) > 18 || (digits[0] == '0' && len(digits) > 1) {
		return 0, false
	}
	var n int64
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if len(digits) < len(v) {
		n = -n
	}
	return n, true
}

// end checks that nothing but space follows the object.
func end(b []byte, i int) error {
	if skipSpace(b, i) != len(b) {
		return errSyntax
	}
	return nil
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the end of the JSON string starting at b[i].
func skipString(b []byte, i int) (int, bool) {
	if i >= len(b) || b[i] != '"' {
		return 0, false
	}
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1, true
		}
	}
	return 0, false
}

// skipValue returns the end of the JSON value starting at b[i]. It finds
// the value's extent only; encoding/json checks its content.
func skipValue(b []byte, i int) (int, bool) {
	if i >= len(b) {
		return 0, false
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				end, ok := skipString(b, i)
				if !ok {
					return 0, false
				}
				i = end
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1, true
				}
			}
			i++
		}
		return 0, false
	}
	start := i
	for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\t' && b[i] != '\n' && b[i] != '\r' {
		i++
	}
	return i, i > start
}

// fieldError names the field whose value failed to decode.
func fieldError(name string, err error) error {
	var fe *FieldError
	if errors.As(err, &fe) {
		if fe.Field != "" {
			name += "." + fe.Field
		}
		return &FieldError{Field: name, Reason: fe.Reason}
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field != "" {
			name += "." + te.Field
		}
		return &FieldError{Field: name, Reason: "must be " + jsonKind(te.Type.Kind())}
	}
	var syntax *json.SyntaxError
	if errors.As(err, &syntax) {
		return errSyntax
	}
	return &FieldError{Field: name, Reason: fmt.Sprintf("is not valid: %v", err)}
}

// jsonKind names the JSON value a Go kind decodes from.
func jsonKind(k reflect.Kind) string {
	switch k {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int64, reflect.Int32:
		return "an integer"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return "of another type"
}
