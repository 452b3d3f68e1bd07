// SPDX-License-Identifier: Apache-2.0

package encodecheck

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

type inner struct {
	Code  *int              `json:"code,omitempty"`
	Names map[string]string `json:"names,omitempty"`
}

type when struct{ time.Time }

type record struct {
	Key    string  `json:"key"`
	Note   *string `json:"note,omitempty"`
	Count  int64   `json:"count"`
	Done   *bool   `json:"done,omitempty"`
	At     when    `json:"at"`
	Inner  *inner  `json:"inner,omitempty"`
	Hidden string  `json:"-"`
}

// encodeAll writes every field, as a faithful hand-written encoder does.
func encodeAll(r record) []byte {
	return fmt.Appendf(nil, `{"key":%q,"note":%q,"count":%d,"done":%t,"at":%q,"inner":{"code":%d,"names":{%q:%q}}}`,
		r.Key, *r.Note, r.Count, *r.Done, r.At.Format(time.RFC3339Nano), *r.Inner.Code,
		firstKey(r.Inner.Names), r.Inner.Names[firstKey(r.Inner.Names)])
}

func firstKey(m map[string]string) string {
	for k := range m {
		return k
	}
	return ""
}

// recorder is a testing.TB that keeps what a check reports.
type recorder struct {
	testing.TB
	errors []string
	fatal  bool
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	r.fatal = true
}
func (r *recorder) Fatal(args ...any) { r.Errorf("%s", fmt.Sprint(args...)) }

func TestFilledSetsEveryField(t *testing.T) {
	r := Filled[record](t)
	if r.Key == "" || r.Note == nil || r.Count == 0 || r.Done == nil || !*r.Done || r.At.IsZero() ||
		r.Inner == nil || r.Inner.Code == nil || len(r.Inner.Names) != 1 || r.Hidden == "" {
		t.Fatalf("not every field is set: %+v", r)
	}
	if *r.Note == r.Key || int64(*r.Inner.Code) == r.Count {
		t.Errorf("two fields hold the same value: %+v", r)
	}
}

func TestCheckPassesAFaithfulEncoder(t *testing.T) {
	r := Filled[record](t)
	Check(t, r, encodeAll(r))
}

// The check fails for an encoder that leaves out a field, top-level or
// nested, or writes one field's value under another's name.
func TestCheckFailsAnEncoderThatDrifts(t *testing.T) {
	r := Filled[record](t)
	full := string(encodeAll(r))
	for _, tt := range []struct {
		name, encoded, report string
	}{
		{"optional field left out", strings.Replace(full, fmt.Sprintf(`"note":%q,`, *r.Note), "", 1), "record.note"},
		{"nested field left out", strings.Replace(full, fmt.Sprintf(`"code":%d,`, *r.Inner.Code), "", 1), "record.inner.code"},
		{"a value changed", strings.Replace(full, `"key":"record.Key-`, `"key":"record.Kez-`, 1), "round-trip"},
		{"not JSON", full[:len(full)-1], "no JSON"},
	} {
		rec := &recorder{TB: t}
		Check(rec, r, []byte(tt.encoded))
		if len(rec.errors) == 0 || !strings.Contains(strings.Join(rec.errors, "\n"), tt.report) {
			t.Errorf("%s: reported %q, want a report naming %q", tt.name, rec.errors, tt.report)
		}
	}
}

func TestFilledRawMessageIsJSON(t *testing.T) {
	var raw json.RawMessage
	f := filler{t: t}
	f.fill(reflect.ValueOf(&raw).Elem(), "raw")
	if !json.Valid(raw) {
		t.Errorf("a filled json.RawMessage is not JSON: %s", raw)
	}
}
