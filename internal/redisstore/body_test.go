// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"encoding/binary"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemsvc/idemsvc/internal/answer"
	"github.com/idemsvc/idemsvc/internal/redisstore"
	sm "github.com/idemsvc/idemsvc/internal/statemachine"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// TestBodiesReplayByteForByte: on every store, a body of any size and kind,
// around the compression threshold and far above it, compressible or not,
// replays byte for byte through begin and through status with the
// response, and Complete and Fail report what the record holds: on Redis,
// less than the body for a JSON answer of 1 KiB or more, the body itself
// otherwise; on the memory store, which keeps bodies as sent, the body.
func TestBodiesReplayByteForByte(t *testing.T) {
	type body struct {
		name   string
		data   string
		shrunk bool // kept compressed: StoredBytes well under the body's size
	}
	var cases []body
	for _, n := range []int{64, 512, 1023, 1024, 1025, 2000, 16 << 10, 256 << 10, 256<<10 + 1, 1<<20 - 64} {
		cases = append(cases, body{"json-" + strconv.Itoa(n), answer.JSON(n, uint64(n)), n >= 1024})
	}
	for _, n := range []int{1024, 16 << 10, 1<<20 - 64} {
		cases = append(cases, body{"random-" + strconv.Itoa(n), answer.Incompressible(n, uint64(n)), false})
	}
	cases = append(cases, body{"empty", "", false}, body{"zeros-256KiB", strings.Repeat("\x00", 256<<10), true}, body{"zeros-1MiB", strings.Repeat("\x00", 1<<20-64), true})
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) sm.Store) {
		store := open(t)
		_, memory := store.(*sm.MemoryStore) // keeps bodies as sent, so that replays share them
		for _, c := range cases {
			c.shrunk = c.shrunk && !memory
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
				// stored_bytes counts the body as sent; the record in Redis
				// holds it compressed when that shrinks it.
				headers := int64(len("Content-Type") + len("application/json"))
				if rec.StoredBytes-headers != int64(len(c.data)) {
					t.Errorf("%s: StoredBytes %d for a body of %d bytes", c.name, rec.StoredBytes, len(c.data))
				}
				if rs, ok := store.(*redisstore.Store); ok {
					n := redisstore.ClientOf(rs).StrLen(ctx, redisstore.Key(s.tenant, s.key)).Val()
					if c.shrunk && n >= int64(len(c.data)) || !c.shrunk && n < int64(len(c.data)) {
						t.Errorf("%s: the record holds %d bytes for a body of %d (kept compressed: %v)", c.name, n, len(c.data), c.shrunk)
					}
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

// TestRecordsOldAndDamaged: on Redis, a record written before compression
// (a long body as sent) replays, and a record whose compressed body is
// damaged answers a corrupt record's error on begin and on status with the
// response, while status without it and listing, which never read the
// body, still answer.
func TestRecordsOldAndDamaged(t *testing.T) {
	client := redistest.SharedServer(t).Client(t)
	store := redisstore.New(client, redisstore.Options{})
	tenant := idemtest.Unique("codec")
	body := answer.JSON(16<<10, 9)
	// put completes key with body, then replaces the record's response
	// with response unless it is empty, and returns what was stored.
	put := func(key, response string) string {
		t.Helper()
		res, err := store.Begin(ctx, tenant, sm.BeginRequest{Key: key})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.Complete(ctx, tenant, sm.CompleteRequest{Key: key, Token: res.Lease.Token, Response: sm.Response{StatusCode: 200, Body: body}}); err != nil {
			t.Fatal(err)
		}
		raw, err := client.Get(ctx, redisstore.Key(tenant, key)).Result()
		if err != nil {
			t.Fatal(err)
		}
		head, ok := sm.HeadLength(raw)
		if !ok || raw[head]&6 != 2 {
			t.Fatal("a 16 KiB JSON answer is not stored compressed")
		}
		if response != "" {
			raw = raw[:head] + response
			if err := client.Set(ctx, redisstore.Key(tenant, key), raw, redis.KeepTTL).Err(); err != nil {
				t.Fatal(err)
			}
		}
		return raw[head:]
	}
	put("old", oldForm(body))
	res, err := store.Begin(ctx, tenant, sm.BeginRequest{Key: "old"})
	if err != nil || res.Acquired || res.Record.Response.Body != body || res.Record.Response.Headers["Content-Type"] != "application/json" {
		t.Errorf("replay of a record written before compression: %v, %d bytes", err, len(res.Record.Response.Body))
	}

	damaged := []byte(put("sound", ""))
	damaged[len(damaged)-5] ^= 0xff
	put("damaged", string(damaged))
	if _, err := store.Begin(ctx, tenant, sm.BeginRequest{Key: "damaged"}); !errors.Is(err, sm.ErrCorrupt) {
		t.Errorf("replay of a damaged record: %v, want a corrupt record", err)
	}
	if _, err := store.Status(ctx, tenant, "damaged", true); !errors.Is(err, sm.ErrCorrupt) {
		t.Errorf("status with the response of a damaged record: %v, want a corrupt record", err)
	}
	if rec, err := store.Status(ctx, tenant, "damaged", false); err != nil || rec.State != sm.StateCompleted {
		t.Errorf("status without the response of a damaged record: %v, %v", rec.State, err)
	}
	listed := map[string]bool{}
	for req := (sm.ListRequest{State: sm.StateCompleted}); ; {
		page, err := store.List(ctx, tenant, req)
		if err != nil {
			t.Fatalf("listing: %v", err)
		}
		for _, r := range page.Records {
			listed[r.Key] = true
		}
		if req.Cursor = page.NextCursor; req.Cursor == "" {
			break
		}
	}
	if len(listed) != 3 {
		t.Errorf("listed %v, want old, sound and damaged", listed)
	}
}

// oldForm is a response's form as idemsvc wrote it before compression:
// flags 0, status 200, one Content-Type header, the body as sent.
func oldForm(body string) string {
	b := []byte{0}
	b = binary.BigEndian.AppendUint16(b, 200)
	b = binary.BigEndian.AppendUint32(b, 1)
	for _, s := range []string{"Content-Type", "application/json"} {
		b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	return string(append(b, body...))
}
