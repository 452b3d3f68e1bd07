// SPDX-License-Identifier: Apache-2.0

package idem

import (
	"encoding/json"
	"testing"

	"github.com/idemsvc/idemsvc/clients/go/encodecheck"
)

// strings escape every way encoding/json escapes.
var strings_ = []string{"", "plain", `q"uo\te`, "ctl\x00\x01\x1f\x7f", "\b\f\n\r\t", "<a href=x>&amp;</a>",
	"caf\u00e9 \u4e16\u754c \U0001F600", "\u2028\u2029", "bad \xff\xfe utf-8 \xe2\x82", "end\\"}

func ptr[T any](v T) *T { return &v }

// requests are the hot calls' bodies with every optional field absent,
// and set, to each kind of string.
func requests() []any {
	out := []any{&BeginRequest{}, &CompleteRequest{}, &FailRequest{}, &ExtendRequest{},
		&CompleteRequest{Response: &StoredResponse{}}, &CompleteRequest{Response: &StoredResponse{Headers: map[string]string{}}}}
	for _, s := range strings_ {
		enc := BodyEncodingBase64
		resp := &StoredResponse{Body: &s, BodyEncoding: &enc, StatusCode: ptr(201),
			Headers: map[string]string{"Z": s, "a": "1", s: "k", "Content-Type": "text/plain"}}
		out = append(out,
			&BeginRequest{Key: s, Fingerprint: &s, LeaseMs: ptr[int64](30000), Owner: &s, RetentionS: ptr[int64](-1), Tenant: &s, WaitMs: ptr[int64](0)},
			&CompleteRequest{Key: s, LeaseToken: s, Response: resp, RetentionS: ptr[int64](86400), Tenant: &s},
			&FailRequest{Error: &s, Key: s, LeaseToken: s, Response: resp, Retryable: ptr(false), Tenant: &s},
			&FailRequest{Key: s, LeaseToken: s, Retryable: ptr(true)},
			&ExtendRequest{Key: s, LeaseMs: ptr[int64](1 << 40), LeaseToken: s, Tenant: &s},
		)
	}
	return out
}

// TestRequestBodiesAreEncodingJSONs: the hot calls' bodies are byte for
// byte what json.Marshal makes of the generated types.
func TestRequestBodiesAreEncodingJSONs(t *testing.T) {
	for _, r := range requests() {
		want, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		var got []byte
		switch r := r.(type) {
		case *BeginRequest:
			got = appendBeginRequest(nil, r)
		case *CompleteRequest:
			got = appendCompleteRequest(nil, r)
		case *FailRequest:
			got = appendFailRequest(nil, r)
		case *ExtendRequest:
			got = appendExtendRequest(nil, r)
		}
		if string(got) != string(want) {
			t.Errorf("%T:\n got %s\nwant %s", r, got, want)
		}
	}
}

func FuzzAppendJSONString(f *testing.F) {
	for _, s := range strings_ {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, _ := json.Marshal(s)
		if got := appendJSONString(nil, s); string(got) != string(want) {
			t.Fatalf("%q: got %s, want %s", s, got, want)
		}
	})
}

func BenchmarkBeginBody(b *testing.B) {
	r := &BeginRequest{Key: "order-8e03978e-40d5", Owner: ptr("idem-go-0123456789abcdef0123456789abcdef"),
		Fingerprint: ptr("sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"), LeaseMs: ptr[int64](30000)}
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 512)
		for b.Loop() {
			buf = appendBeginRequest(buf[:0], r)
		}
	})
}

// TestBatchBodiesAreEncodingJSONs: the batch calls' bodies are byte for
// byte what json.Marshal made of them, item by item, then the envelope.
func TestBatchBodiesAreEncodingJSONs(t *testing.T) {
	var begins []*BeginRequest
	var finishes []any
	for _, r := range requests() {
		switch r := r.(type) {
		case *BeginRequest:
			begins = append(begins, r)
		case *CompleteRequest:
			if r.Key != "" {
				finishes = append(finishes, r)
			}
		case *FailRequest:
			if r.Key != "" {
				finishes = append(finishes, r)
			}
		}
	}
	marshal := func(v any) []byte {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var beginItems []BeginBatchItem
	for _, r := range begins {
		beginItems = append(beginItems, marshal(r))
	}
	got := appendBatch(nil, len(begins), func(b []byte, i int) []byte { return appendBeginRequest(b, begins[i]) })
	if want := marshal(BeginBatchRequest{Items: beginItems}); string(got) != string(want) {
		t.Errorf("begin batch:\n got %s\nwant %s", got, want)
	}
	var finishItems []FinishBatchItem
	for _, r := range finishes {
		switch r := r.(type) {
		case *CompleteRequest:
			finishItems = append(finishItems, marshal(struct {
				Kind string `json:"kind"`
				CompleteRequest
			}{"complete", *r}))
		case *FailRequest:
			finishItems = append(finishItems, marshal(struct {
				Kind string `json:"kind"`
				FailRequest
			}{"fail", *r}))
		}
	}
	got = appendBatch(nil, len(finishes), func(b []byte, i int) []byte {
		if r, ok := finishes[i].(*CompleteRequest); ok {
			return appendCompleteItem(b, r)
		}
		return appendFailItem(b, finishes[i].(*FailRequest))
	})
	if want := marshal(FinishBatchRequest{Items: finishItems}); string(got) != string(want) {
		t.Errorf("finish batch:\n got %s\nwant %s", got, want)
	}
	if got := appendBatch(nil, 0, nil); string(got) != `{"items":[]}` {
		t.Errorf("an empty batch: %s", got)
	}
}

// TestRequestBodiesCarryEveryField: each hot call's body holds every field
// of its generated request type, set by reflection, so that a field added
// to api/openapi.yaml cannot be left out of encode.go while the examples
// above, which hold today's fields, still pass.
func TestRequestBodiesCarryEveryField(t *testing.T) {
	begin := encodecheck.Filled[BeginRequest](t)
	encodecheck.Check(t, begin, appendBeginRequest(nil, &begin))
	complete := encodecheck.Filled[CompleteRequest](t)
	encodecheck.Check(t, complete, appendCompleteRequest(nil, &complete))
	fail := encodecheck.Filled[FailRequest](t)
	encodecheck.Check(t, fail, appendFailRequest(nil, &fail))
	extend := encodecheck.Filled[ExtendRequest](t)
	encodecheck.Check(t, extend, appendExtendRequest(nil, &extend))
}
