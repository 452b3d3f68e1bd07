// SPDX-License-Identifier: Apache-2.0

package statemachine_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/idemsvc/idemsvc/internal/idemtest/answer"
	sm "github.com/idemsvc/idemsvc/internal/statemachine"
)

// TestBodiesReplayByteForByte: on every store, a body of any size and kind,
// around the compression threshold and far above it, compressible or not,
// replays byte for byte through begin and through status with the
// response, and Complete and Fail report what the record holds: less than
// the body for a JSON answer over the threshold, the body itself otherwise.
func TestBodiesReplayByteForByte(t *testing.T) {
	type body struct {
		name   string
		data   string
		shrunk bool // kept compressed: StoredBytes well under the body's size
	}
	var cases []body
	for _, n := range []int{64, 512, 1023, 1024, 1025, 2000, 16 << 10, 256 << 10, 1<<20 - 64} {
		cases = append(cases, body{"json-" + strconv.Itoa(n), answer.JSON(n, uint64(n)), n >= 1024})
	}
	for _, n := range []int{1024, 16 << 10, 1<<20 - 64} {
		cases = append(cases, body{"random-" + strconv.Itoa(n), answer.Incompressible(n, uint64(n)), false})
	}
	cases = append(cases, body{"empty", "", false}, body{"zeros-1MiB", strings.Repeat("\x00", 1<<20-64), true})
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) sm.Store) {
		store := open(t)
		for _, c := range cases {
			for _, fail := range []bool{false, true} {
				s := newSubject(t, store)
				s.mustBegin(sm.BeginRequest{})
				resp := sm.Response{StatusCode: 200, Headers: map[string]string{"Content-Type": "application/json"}, Body: c.data, Base64: fail}
				var rec sm.Record
				var err error
				if fail {
					rec, err = store.Fail(ctx, s.tenant, sm.FailRequest{Key: s.key, Token: s.lease.Token, Error: "declined", Response: resp})
				} else {
					rec, err = store.Complete(ctx, s.tenant, sm.CompleteRequest{Key: s.key, Token: s.lease.Token, Response: resp})
				}
				if err != nil {
					t.Fatalf("%s: finish: %v", c.name, err)
				}
				headers := int64(len("Content-Type") + len("application/json"))
				if c.shrunk && rec.StoredBytes-headers > int64(len(c.data))*7/8 || !c.shrunk && rec.StoredBytes-headers != int64(len(c.data)) {
					t.Errorf("%s: StoredBytes %d for a body of %d bytes", c.name, rec.StoredBytes, len(c.data))
				}
				res := s.mustBegin(sm.BeginRequest{})
				if got := res.Record.Response; res.Acquired || got.Body != c.data || got.Base64 != fail || got.Headers["Content-Type"] != "application/json" {
					t.Fatalf("%s: the replay differs (%d bytes of %d)", c.name, len(got.Body), len(c.data))
				}
				if got := s.status().Response; got.Body != c.data {
					t.Fatalf("%s: status with the response differs (%d bytes of %d)", c.name, len(got.Body), len(c.data))
				}
			}
		}
	})
}
