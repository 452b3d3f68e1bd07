// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
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

// Long answers kept compressed (from StreamBodiesFrom on) are decoded as
// they are written: a 256 KiB and a 1 MiB JSON answer, text full of
// escapes and multi-byte characters whose cuts fall everywhere, and
// random bytes sent as base64, replay byte for byte through begin, status
// with the response and GET /v1/keys/body (with their SHA-256), on a
// Redis node and a Cluster; the records hold them compressed.
func TestE2ELongCompressedAnswers(t *testing.T) {
	t.Parallel()
	escapes := strings.Repeat(`é "q" \ €😀 <tab>	a/b `+"\x01\n", 40000)[:900<<10]
	for _, b := range limitedBackends()[1:3] { // redis, cluster
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			store, _ := b.open(t)
			e := startOn(t, store)
			c := e.as(t, "")
			for name, body := range map[string]string{
				"json 256 KiB": answers.JSON(256<<10, 1),
				"json 1 MiB":   answers.JSON(1<<20-512, 2),
				"escapes":      escapes,
				"base64":       strings.Repeat(answers.Incompressible(1000, 3)+"\xff\x00", 300),
			} {
				sent, encoding := body, idem.BodyEncodingText
				if name == "base64" {
					sent, encoding = base64.StdEncoding.EncodeToString([]byte(body)), idem.BodyEncodingBase64
				}
				l := c.acquire(idem.BeginRequest{Key: idemtest.Unique("long")})
				c.mustComplete(idem.CompleteRequest{Key: l.Key, LeaseToken: l.LeaseToken,
					Response: &idem.StoredResponse{Body: &sent, BodyEncoding: &encoding, StatusCode: ptr(201)}})
				r := c.begin(idem.BeginRequest{Key: l.Key})
				if r.StatusCode() != http.StatusOK || r.JSON200 == nil || r.JSON200.Response.Body == nil || *r.JSON200.Response.Body != sent ||
					r.JSON200.Response.BodyEncoding == nil || *r.JSON200.Response.BodyEncoding != encoding {
					t.Fatalf("%s: replay %d, not byte for byte", name, r.StatusCode())
				}
				if rec := c.record(l.Key); rec.Response == nil || rec.Response.Body == nil || *rec.Response.Body != sent {
					t.Fatalf("%s: status with the response: not byte for byte", name)
				}
				resp, got := e.raw(t, http.MethodGet, "/v1/keys/body?key="+url.QueryEscape(l.Key), "", nil)
				sum := sha256.Sum256([]byte(body))
				if resp.StatusCode != http.StatusOK || string(got) != body || resp.Header.Get("Repr-Digest") != "sha-256=:"+base64.StdEncoding.EncodeToString(sum[:])+":" {
					t.Fatalf("%s: GET /v1/keys/body: %d, %d bytes, %s", name, resp.StatusCode, len(got), resp.Header.Get("Repr-Digest"))
				}
			}
		})
	}
	// The record keeps a 1 MiB JSON answer compressed.
	srv := redistest.SharedServer(t)
	rdb := srv.Client(t)
	e := startOn(t, redisstore.New(rdb, redisstore.Options{}))
	c := e.as(t, "")
	json := answers.JSON(1<<20-512, 4)
	l := c.acquire(idem.BeginRequest{Key: idemtest.Unique("kept")})
	c.mustComplete(idem.CompleteRequest{Key: l.Key, LeaseToken: l.LeaseToken, Response: &idem.StoredResponse{Body: &json}})
	if n := rdb.StrLen(context.Background(), redisstore.Key("default", l.Key)).Val(); n > int64(len(json))/3 {
		t.Errorf("the record of a 1 MiB JSON answer holds %d bytes, want it compressed", n)
	}
}

// A long compressed body damaged in Redis is never replayed whole: the
// replay and the status are cut off before their end (the body decodes as
// it is written, so its damage is found on the way), GET /v1/keys/body
// answers 500 before a byte (it decodes the body for its SHA-256 first),
// and status without the response still answers.
func TestE2EDamagedLongCompressedRecord(t *testing.T) {
	t.Parallel()
	srv := redistest.SharedServer(t)
	rdb := srv.Client(t)
	e := startOn(t, redisstore.New(rdb, redisstore.Options{}))
	c := e.as(t, "")
	json := answers.JSON(512<<10, 8)
	l := c.acquire(idem.BeginRequest{Key: idemtest.Unique("damaged-long")})
	c.mustComplete(idem.CompleteRequest{Key: l.Key, LeaseToken: l.LeaseToken, Response: &idem.StoredResponse{Body: &json}})
	rkey := redisstore.Key("default", l.Key)
	raw, err := rdb.Get(context.Background(), rkey).Bytes()
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)-1000] ^= 0xff // inside the compressed body, near its end
	if err := rdb.Set(context.Background(), rkey, raw, redis.KeepTTL).Err(); err != nil {
		t.Fatal(err)
	}
	for _, req := range []func() (*http.Response, error){
		func() (*http.Response, error) {
			return e.http.Post(e.url+"/v1/begin", "application/json", strings.NewReader(`{"key":"`+l.Key+`"}`))
		},
		func() (*http.Response, error) {
			return e.http.Get(e.url + "/v1/status?include_response=true&key=" + url.QueryEscape(l.Key))
		},
	} {
		resp, err := req()
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil {
			t.Errorf("%s: %d bytes read whole, want the answer cut off", resp.Request.URL.Path, len(got))
		}
		if strings.Contains(string(got), json[len(json)-100:]) {
			t.Errorf("%s: the body's end was sent", resp.Request.URL.Path)
		}
	}
	resp, body := e.raw(t, http.MethodGet, "/v1/keys/body?key="+url.QueryEscape(l.Key), "", nil)
	requireProblem(t, resp, body, http.StatusInternalServerError, "internal")
	if s := c.status(idem.GetStatusParams{Key: l.Key}); s.StatusCode() != http.StatusOK {
		t.Errorf("status without the response: %d %s", s.StatusCode(), s.Body)
	}
}
