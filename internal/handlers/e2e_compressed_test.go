// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemsvc/idemsvc/clients/go"
	answers "github.com/idemsvc/idemsvc/internal/answer"
	"github.com/idemsvc/idemsvc/internal/auth"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/redisstore"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// Over HTTP, a 16 KiB JSON answer (kept compressed) and 16 KiB of random
// bytes (kept as sent) replay byte for byte through begin and status, and
// the tenant's stored bytes count each body as sent, on every store, as
// the contract counts them (compression saves Redis memory, not budget).
func TestE2ECompressedAnswers(t *testing.T) {
	t.Parallel()
	for _, b := range limitedBackends()[:3] { // memory, redis, cluster
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			tenant, key := idemtest.Unique("zstd"), "sk-"+idemtest.Unique("z")
			keyring, err := auth.Parse(fmt.Appendf(nil, "tenants:\n  - name: %s\n    api_key_sha256: [%q]\n    limits: {stored_bytes: 10000000}\n", tenant, auth.Digest(key)))
			if err != nil {
				t.Fatal(err)
			}
			store, limiter := b.open(t)
			e := start(t, handlers.Config{Store: store, Keyring: keyring, Limiter: limiter})
			c := e.as(t, key)
			sdk, err := idem.New(e.url, idem.WithAPIKey(key))
			if err != nil {
				t.Fatal(err)
			}
			stored := func() int64 {
				u, err := sdk.Usage(context.Background())
				if err != nil || len(u) != 1 {
					t.Fatalf("usage: %v, %v", u, err)
				}
				return u[0].StoredBytes
			}
			waitStored := func(what string, ok func(int64) bool) int64 {
				var n int64
				idemtest.Eventually(t, 5*time.Second, what, func() bool { n = stored(); return ok(n) })
				return n
			}

			json := answers.JSON(16<<10, 7)
			l := c.acquire(idem.BeginRequest{Key: idemtest.Unique("json")})
			c.mustComplete(idem.CompleteRequest{Key: l.Key, LeaseToken: l.LeaseToken, Response: &idem.StoredResponse{Body: &json}})
			afterJSON := waitStored("the JSON answer's bytes", func(n int64) bool { return n > 0 })
			if afterJSON != 16<<10 {
				t.Errorf("a 16 KiB JSON answer counts %d stored bytes, want its size as sent", afterJSON)
			}
			r := c.begin(idem.BeginRequest{Key: l.Key})
			if r.StatusCode() != http.StatusOK || r.JSON200 == nil || r.JSON200.Response.Body == nil || *r.JSON200.Response.Body != json {
				t.Fatalf("replay of the JSON answer: %d, not byte for byte", r.StatusCode())
			}
			if rec := c.record(l.Key); rec.Response == nil || rec.Response.Body == nil || *rec.Response.Body != json {
				t.Fatal("status with the response: not the JSON answer byte for byte")
			}

			random := answers.Incompressible(16<<10, 7)
			b64, enc := base64.StdEncoding.EncodeToString([]byte(random)), idem.BodyEncodingBase64
			l = c.acquire(idem.BeginRequest{Key: idemtest.Unique("random")})
			c.mustComplete(idem.CompleteRequest{Key: l.Key, LeaseToken: l.LeaseToken, Response: &idem.StoredResponse{Body: &b64, BodyEncoding: &enc}})
			waitStored("the random body's bytes", func(n int64) bool { return n == afterJSON+16<<10 })
			r = c.begin(idem.BeginRequest{Key: l.Key})
			if r.StatusCode() != http.StatusOK || r.JSON200 == nil || r.JSON200.Response.Body == nil || *r.JSON200.Response.Body != b64 {
				t.Fatalf("replay of the random body: %d, not byte for byte", r.StatusCode())
			}
		})
	}
}

// A record whose compressed body was damaged in Redis is never replayed:
// begin and status with the response answer 500 internal, status without
// the response still answers, and nothing panics.
func TestE2EDamagedCompressedRecord(t *testing.T) {
	t.Parallel()
	srv := redistest.SharedServer(t)
	rdb := srv.Client(t)
	e := startOn(t, redisstore.New(rdb, redisstore.Options{}))
	c := e.as(t, "")
	json := answers.JSON(16<<10, 8)
	l := c.acquire(idem.BeginRequest{Key: idemtest.Unique("damaged")})
	c.mustComplete(idem.CompleteRequest{Key: l.Key, LeaseToken: l.LeaseToken, Response: &idem.StoredResponse{Body: &json}})
	rkey := redisstore.Key("default", l.Key)
	raw, err := rdb.Get(context.Background(), rkey).Bytes()
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) > len(json)/2 {
		t.Fatalf("the record holds %d bytes: the answer is not compressed", len(raw))
	}
	raw[len(raw)-100] ^= 0xff // inside the compressed body
	if err := rdb.Set(context.Background(), rkey, raw, redis.KeepTTL).Err(); err != nil {
		t.Fatal(err)
	}
	r := c.begin(idem.BeginRequest{Key: l.Key})
	requireProblem(t, r.HTTPResponse, r.Body, http.StatusInternalServerError, "internal")
	s := c.status(idem.GetStatusParams{Key: l.Key, IncludeResponse: ptr(true)})
	requireProblem(t, s.HTTPResponse, s.Body, http.StatusInternalServerError, "internal")
	if s := c.status(idem.GetStatusParams{Key: l.Key}); s.StatusCode() != http.StatusOK {
		t.Errorf("status without the response: %d %s", s.StatusCode(), s.Body)
	}
}
