package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
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
	return decodeObject(b, func(name string) any {
		switch name {
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
	return decodeObject(b, func(name string) any {
		switch name {
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
	return decodeObject(b, func(name string) any {
		switch name {
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
	return decodeObject(b, func(name string) any {
		switch name {
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
	return decodeObject(b, func(name string) any {
		switch name {
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
// finds the members in one pass over b and hands each value to
// encoding/json, which checks it.
func decodeObject(b []byte, field func(name string) any) error {
	i := skipSpace(b, 0)
	if i == len(b) || b[i] != '{' {
		return errNotObject
	}
	var seen [maxFields]string
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
		var name string
		if raw := b[i+1 : nameEnd-1]; bytes.IndexByte(raw, '\\') < 0 {
			name = string(raw)
		} else if err := json.Unmarshal(b[i:nameEnd], &name); err != nil {
			return errSyntax
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
			return &FieldError{Field: name, Reason: "is not a known field"}
		}
		for _, s := range seen[:n] {
			if s == name {
				return &FieldError{Field: name, Reason: "appears more than once"}
			}
		}
		seen[n] = name // n < maxFields: every name is known and distinct
		n++
		if err := json.Unmarshal(b[i:valueEnd], dst); err != nil {
			return fieldError(name, err)
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
