// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"context"
	"crypto/rand"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemsvc/idemsvc/internal/answer"
	"github.com/idemsvc/idemsvc/internal/lua"
	"github.com/idemsvc/idemsvc/internal/redisstore"
	sm "github.com/idemsvc/idemsvc/internal/statemachine"
)

// A large record (a 1 MiB binary body, a head over 1 KiB) replays and
// reads byte for byte on every backend, and is deleted; on Redis the
// scripts send its head only, never the whole record.
func TestLargeRecordReadsWhole(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) sm.Store) {
		s := newSubject(t, open(t))
		body := make([]byte, 1<<20-4096)
		_, _ = rand.Read(body)
		owner, fp := strings.Repeat("o", 256), strings.Repeat("f", 256)
		s.mustBegin(sm.BeginRequest{Owner: owner, Fingerprint: fp})
		resp := sm.Response{StatusCode: 500, Headers: map[string]string{"X-A": "b"}, Body: string(body), Base64: true}
		if _, err := s.store.Fail(ctx, s.tenant, sm.FailRequest{Key: s.key, Token: s.lease.Token, Error: strings.Repeat("e", 1024), Response: resp}); err != nil {
			t.Fatal(err)
		}
		replay := s.mustBegin(sm.BeginRequest{Owner: "another", Fingerprint: fp})
		if replay.Acquired || replay.Record.Response.Body != string(body) || replay.Record.Error != strings.Repeat("e", 1024) ||
			replay.Record.Response.Headers["X-A"] != "b" || !replay.Record.Response.Base64 {
			t.Fatalf("replay: acquired %v, body of %d bytes, want the stored record", replay.Acquired, len(replay.Record.Response.Body))
		}
		if rec := s.status(); rec.Response.Body != string(body) || rec.Owner != owner {
			t.Errorf("status: body of %d bytes, want the stored one", len(rec.Response.Body))
		}
		if rec, err := s.store.Status(ctx, s.tenant, s.key, false); err != nil || rec.Response.Body != "" || rec.Fingerprint != fp {
			t.Errorf("status without the response: %v, %d bytes of body", err, len(rec.Response.Body))
		}
		if err := s.store.Delete(ctx, s.tenant, s.key); err != nil {
			t.Fatal(err)
		}
		if s.status() != nil {
			t.Error("deleted record still there")
		}
	})
	forEachRedis(t, func(t *testing.T, client redis.UniversalClient) {
		s := newSubject(t, redisstore.New(client, redisstore.Options{}))
		s.mustBegin(sm.BeginRequest{})
		if _, err := s.complete(answer.Incompressible(1<<20-64, 1)); err != nil { // kept as sent: it does not compress
			t.Fatal(err)
		}
		v, err := lua.Plain.Status.Run(ctx, client, []string{redisstore.Key(s.tenant, s.key)}).Slice()
		if err != nil {
			t.Fatal(err)
		}
		if len(v) != 4 || len(v[2].(string)) > 2048 || v[3].(int64) < 1<<20-64 {
			t.Errorf("status.lua sent %d parts, a record of %d bytes of %v: want the head only", len(v), len(v[2].(string)), v[3])
		}
	})
}

// deleteOnRead deletes a record the first time its response is read,
// between the script and the read.
type deleteOnRead struct {
	client redis.UniversalClient
	key    string
	done   atomic.Bool
}

func (d *deleteOnRead) DialHook(next redis.DialHook) redis.DialHook { return next }
func (d *deleteOnRead) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}
func (d *deleteOnRead) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() == "getrange" && d.done.CompareAndSwap(false, true) {
			if err := d.client.Del(ctx, d.key).Err(); err != nil {
				return err
			}
		}
		return next(ctx, cmds)
	}
}

// A record that changes between the script and the reading of its
// response is never answered half read: the begin runs again, and finds
// the key free.
func TestLargeRecordChangedWhileRead(t *testing.T) {
	forEachRedis(t, func(t *testing.T, client redis.UniversalClient) {
		s := newSubject(t, redisstore.New(client, redisstore.Options{Timeout: 5 * time.Second}))
		s.mustBegin(sm.BeginRequest{})
		if _, err := s.complete(answer.Incompressible(1<<20-64, 1)); err != nil { // kept as sent: it does not compress
			t.Fatal(err)
		}
		client.AddHook(&deleteOnRead{client: client, key: redisstore.Key(s.tenant, s.key)})
		res := s.mustBegin(sm.BeginRequest{})
		if !res.Acquired {
			t.Errorf("begin after the record went: a replay of %d bytes, want acquired", len(res.Record.Response.Body))
		}
	})
}
