// SPDX-License-Identifier: Apache-2.0

package idem

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// TestResultBodyMembers holds resultBody to every member of the bodies a
// batch result may have, with the same type (or its pointer), so that the
// one-pass decoding loses none.
func TestResultBodyMembers(t *testing.T) {
	have := map[string]reflect.Type{}
	rt := reflect.TypeFor[resultBody]()
	for i := range rt.NumField() {
		f := rt.Field(i)
		if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" {
			have[name] = f.Type
		}
	}
	for _, body := range []reflect.Type{reflect.TypeFor[BeginAcquired](), reflect.TypeFor[BeginReplay](),
		reflect.TypeFor[FinishResult](), reflect.TypeFor[Problem]()} {
		for i := range body.NumField() {
			f := body.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			got, ok := have[name]
			switch {
			case !ok:
				t.Errorf("resultBody has no %q, a member of %s", name, body.Name())
			case name == "status":
			case got != f.Type && got != reflect.PointerTo(f.Type) && reflect.PointerTo(got) != f.Type:
				t.Errorf("resultBody's %q is a %s, %s's a %s", name, got, body.Name(), f.Type)
			}
		}
	}
}

// twoPass is the batch answer's decoding before decodeBatch: the results'
// bodies as json.RawMessage, then each body as its own type.
func twoPass(t *testing.T, answer string) []any {
	t.Helper()
	var r BatchResponse
	if err := json.Unmarshal([]byte(answer), &r); err != nil {
		t.Fatal(err)
	}
	var out []any
	for _, res := range r.Results {
		var v any
		var err error
		switch res.Status {
		case 201:
			a := new(BeginAcquired)
			err, v = json.Unmarshal(res.Body, a), a
		case 200:
			if strings.Contains(string(res.Body), `"expires_at"`) {
				var f FinishResult
				err, v = json.Unmarshal(res.Body, &f), f
			} else {
				r := new(BeginReplay)
				err, v = json.Unmarshal(res.Body, r), r
			}
		default:
			var p Problem
			if err := json.Unmarshal(res.Body, &p); err != nil || p.Type == "" {
				p = Problem{Status: res.Status, Title: "?", Detail: "an answer idemsvc does not document"}
			}
			v = p
		}
		if err != nil {
			v = err.Error()
		}
		out = append(out, v)
	}
	return out
}

// onePass is the same through decodeBatch and batchResult's methods.
func onePass(t *testing.T, answer string) []any {
	t.Helper()
	rs, err := decodeBatch([]byte(answer))
	if err != nil {
		t.Fatal(err)
	}
	var out []any
	for i := range rs {
		r := &rs[i]
		var v any
		var err error
		switch r.Status {
		case 201:
			v, err = r.acquired()
		case 200:
			if strings.Contains(answer, `"expires_at"`) {
				v, err = r.finished()
			} else {
				v, err = r.replay()
			}
		default:
			var e *Error
			errors.As(r.err(), &e)
			p := e.Problem
			if p.Detail == "an answer idemsvc does not document" {
				p.Title = "?"
			}
			v = p
		}
		if err != nil {
			v = "error"
		}
		out = append(out, v)
	}
	return out
}

// TestDecodeBatch decodes answers in one pass as in two.
func TestDecodeBatch(t *testing.T) {
	for name, answer := range map[string]string{
		"begin": `{"results":[
			{"status":201,"body":{"status":"acquired","key":"a","lease_token":"00ff","attempt":2,"recovered":true,"lease_expires_at":"2026-11-27T22:00:00.123Z"}},
			{"status":200,"body":{"status":"completed","key":"b","attempt":1,"completed_at":"2026-11-27T22:00:01.000Z","response":{"status_code":201,"headers":{"a":"b"},"body":"pa\"id","body_encoding":"text"}}},
			{"status":200,"body":{"status":"failed","key":"c","attempt":3,"failed_at":"2026-11-27T22:00:01.000Z","error":"declined","response":{}}},
			{"status":409,"body":{"type":"https://idemsvc.dev/problems/in-progress","title":"In progress","status":409,"detail":"d","code":"in-progress","attempt":4,"lease_expires_at":"2026-11-27T22:00:09.000Z"}},
			{"status":400,"body":{"type":"https://idemsvc.dev/problems/invalid","title":"Invalid","status":400,"detail":"d","code":"invalid","field":"items[4].key","instance":"/i"}},
			{"status":502,"body":null},
			{"status":502,"body":"a gateway's page"},
			{"status":503,"body":{"type":"","status":"x"}}
		]}`,
		"finish": `{"results":[
			{"status":200,"body":{"status":"completed","key":"a","attempt":1,"completed_at":"2026-11-27T22:00:01.000Z","expires_at":"2026-11-28T22:00:01.000Z"}},
			{"status":200,"body":{"status":"failed","key":"b","attempt":1,"failed_at":"2026-11-27T22:00:01.000Z","expires_at":"2026-11-28T22:00:01.000Z","retryable":false}},
			{"status":409,"body":{"type":"https://idemsvc.dev/problems/lease-lost","title":"Lease lost","status":409,"detail":"d","code":"lease-lost"}}
		]}`,
		"fallback": `{"results":[
			{"status":201,"body":{"status":"acquired","key":"a","lease_token":"00ff","attempt":1,"lease_expires_at":"2026-11-27T22:00:00.123Z"}},
			{"status":409,"body":{"type":"https://idemsvc.dev/problems/in-progress","title":"In progress","status":409,"response":5}}
		]}`,
		"a record's status as a number": `{"results":[{"status":201,"body":{"status":201,"key":"a"}}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			want, got := twoPass(t, answer), onePass(t, answer)
			for i := range want {
				if s, ok := want[i].(string); ok && s != "" {
					want[i] = "error"
				}
			}
			if !reflect.DeepEqual(want, got) {
				w, _ := json.Marshal(want)
				g, _ := json.Marshal(got)
				t.Errorf("one pass:\n%s\ntwo passes:\n%s", g, w)
			}
		})
	}
}
