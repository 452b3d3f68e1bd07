// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	idem "github.com/idemsvc/idemsvc/clients/go"
	answers "github.com/idemsvc/idemsvc/internal/answer"
	"github.com/idemsvc/idemsvc/internal/blob"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/s3test"
)

// blobPrefix is the prefix of every object the tests' idemsvc writes.
const blobPrefix = "idem"

// blobEnv is idemsvc over a store and a blob store on srv.
type blobEnv struct {
	*env
	srv *s3test.Server
	st  *blob.Store
}

func startBlob(t *testing.T, b backend, srv *s3test.Server) *blobEnv {
	t.Helper()
	srv.Setenv(t)
	st, err := blob.Open(context.Background(), blob.Config{URL: srv.URL(blobPrefix), Timeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	e := start(t, handlers.Config{Store: b.Open(t), Blob: &handlers.BlobConfig{Store: st, SpoolDir: t.TempDir()}})
	return &blobEnv{env: e, srv: srv, st: st}
}

// redisBackends are the standalone Redis and the Cluster.
func redisBackends() []backend { return idemtest.Backends()[1:] }

func randomBody(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// streamComplete completes key with body as POST /v1/complete/stream.
func (e *env) streamComplete(t *testing.T, key, token string, status int, headers map[string]string, body []byte) (*http.Response, []byte) {
	t.Helper()
	h, _ := json.Marshal(headers)
	return e.raw(t, http.MethodPost, "/v1/complete/stream", "application/octet-stream", bytes.NewReader(body),
		"Idem-Key", key, "Idem-Lease-Token", token, "Idem-Response-Status", strconv.Itoa(status), "Idem-Response-Headers", string(h))
}

// replayBody begins key again and returns the body its replay carries:
// inline, or fetched from its body_ref.
func (e *env) replayBody(t *testing.T, key string) (*idem.BeginReplay, []byte) {
	t.Helper()
	c := e.as(t, "")
	r := c.begin(idem.BeginRequest{Key: key})
	if r.StatusCode() != http.StatusOK || r.JSON200 == nil {
		t.Fatalf("replay of %s: %d %s", key, r.StatusCode(), clipBody(r.Body))
	}
	rep := r.JSON200
	resp := rep.Response
	switch {
	case resp.BodyRef != nil:
		if resp.Body != nil {
			t.Fatal("a replay with both body and body_ref")
		}
		hr, b := e.raw(t, http.MethodGet, resp.BodyRef.Url, "", nil)
		if hr.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %s", resp.BodyRef.Url, hr.StatusCode, clipBody(b))
		}
		sum := sha256.Sum256(b)
		if got, want := hr.Header.Get("Repr-Digest"), "sha-256=:"+base64.StdEncoding.EncodeToString(sum[:])+":"; got != want {
			t.Fatalf("Repr-Digest %s, want %s", got, want)
		}
		if fmt.Sprintf("%x", sum) != resp.BodyRef.Sha256 || int64(len(b)) != resp.BodyRef.SizeBytes {
			t.Fatalf("body_ref %+v does not describe the %d bytes fetched", resp.BodyRef, len(b))
		}
		return rep, b
	case resp.Body == nil:
		return rep, nil
	case resp.BodyEncoding != nil && *resp.BodyEncoding == idem.BodyEncodingBase64:
		b, err := base64.StdEncoding.DecodeString(*resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return rep, b
	}
	return rep, []byte(*resp.Body)
}

func clipBody(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "…"
	}
	return string(b)
}

// objects lists the keys of the objects under the tests' prefix whose
// key contains part.
func (e *blobEnv) objects(t *testing.T, part string) []string {
	t.Helper()
	out, err := e.srv.Client().ListObjectsV2(context.Background(), &s3.ListObjectsV2Input{Bucket: aws.String(s3test.Bucket), Prefix: aws.String(blobPrefix + "/")})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, o := range out.Contents {
		if strings.Contains(*o.Key, part) {
			keys = append(keys, *o.Key)
		}
	}
	return keys
}

func keyHash(key string) string { return fmt.Sprintf("%x", sha256.Sum256([]byte(key))) }

// A large answer completes as a stream and replays byte for byte: 1 KiB
// inline in its record, 1 MiB from the blob store but inline in the
// replay, 40 MiB by reference; on a Redis node and on a Cluster.
func TestE2EBlobReplaysByteForByte(t *testing.T) {
	srv := s3test.New(t)
	for _, b := range redisBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := startBlob(t, b, srv)
			c := e.as(t, "")
			for _, size := range []int{1 << 10, 1 << 20, 40 << 20} {
				key := fmt.Sprintf("blob-replay-%s-%d-%d", b.Name, size, time.Now().UnixNano())
				lease := c.acquire(idem.BeginRequest{Key: key})
				body := randomBody(size)
				hr, out := e.streamComplete(t, key, lease.LeaseToken, 201, map[string]string{"Content-Type": "application/octet-stream"}, body)
				if hr.StatusCode != http.StatusOK {
					t.Fatalf("%d bytes: complete %d %s", size, hr.StatusCode, out)
				}
				rep, got := e.replayBody(t, key)
				if !bytes.Equal(got, body) {
					t.Fatalf("%d bytes: replayed %d bytes, not the same", size, len(got))
				}
				if rep.Response.StatusCode == nil || *rep.Response.StatusCode != 201 || rep.Response.Headers["Content-Type"] != "application/octet-stream" {
					t.Fatalf("%d bytes: replayed %+v", size, rep.Response)
				}
				objs := e.objects(t, keyHash(key))
				switch {
				case size <= 64<<10 && len(objs) != 0:
					t.Fatalf("%d bytes went to the blob store: %v", size, objs)
				case size > 64<<10 && (len(objs) != 1 || !strings.HasPrefix(objs[0], blobPrefix+"/default/") || !strings.HasSuffix(objs[0], "/"+keyHash(key)+"/"+lease.LeaseToken)):
					t.Fatalf("%d bytes: objects %v", size, objs)
				case size > 1<<20 && rep.Response.BodyRef == nil:
					t.Fatalf("%d bytes replayed without body_ref", size)
				case size <= 1<<20 && rep.Response.BodyRef != nil:
					t.Fatalf("%d bytes replayed by reference, not inline", size)
				}
				if strings.Contains(strings.Join(objs, ","), key) {
					t.Fatalf("the record key appears in an object key: %v", objs)
				}
			}
			// A JSON complete whose compressed body is over the
			// threshold goes to the blob store too, and replays as it
			// was sent.
			key := fmt.Sprintf("blob-json-%s-%d", b.Name, time.Now().UnixNano())
			lease := c.acquire(idem.BeginRequest{Key: key})
			text := base64.StdEncoding.EncodeToString(randomBody(75000)) + "é"
			c.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: lease.LeaseToken, Response: &idem.StoredResponse{Body: &text}})
			if objs := e.objects(t, keyHash(key)); len(objs) != 1 {
				t.Fatalf("a JSON complete of %d bytes: objects %v", len(text), objs)
			}
			rep, got := e.replayBody(t, key)
			if string(got) != text || rep.Response.BodyEncoding == nil || *rep.Response.BodyEncoding != idem.BodyEncodingText {
				t.Fatalf("a JSON complete replayed as %d bytes, %v", len(got), rep.Response.BodyEncoding)
			}
		})
	}
}

// The threshold compares the body's size compressed, as the record would
// keep it: a JSON answer of 256 KiB (51 KB compressed) stays in its
// record, compressed, whether sent in JSON or streamed; one of 1 MiB (204
// KB compressed) and random bytes of 100 KB go to the blob store. A
// terminal fail's response goes the same way (a retryable one is not
// stored), and a fenced fail's object is deleted. Every one replays byte
// for byte; on a Redis node and a Cluster.
func TestE2EBlobCompressedThreshold(t *testing.T) {
	srv := s3test.New(t)
	for _, b := range redisBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := startBlob(t, b, srv)
			c := e.as(t, "")
			for _, tt := range []struct {
				name     string
				body     []byte
				streamed bool
				fail     bool
				byRef    bool
			}{
				{"json 256 KiB", []byte(answers.JSON(256<<10, 1)), false, false, false},
				{"json 256 KiB streamed", []byte(answers.JSON(256<<10, 2)), true, false, false},
				{"json 256 KiB streamed, not UTF-8", append([]byte(answers.JSON(256<<10, 3)), 0xff), true, false, false},
				{"json 1 MiB", []byte(answers.JSON(1<<20-4096, 4)), false, false, true},
				{"json 1 MiB streamed", []byte(answers.JSON(1<<20, 5)), true, false, true},
				{"random 100 KB streamed", randomBody(100_000), true, false, true},
				{"json 256 KiB, a terminal fail", []byte(answers.JSON(256<<10, 6)), false, true, false},
				{"json 1 MiB, a terminal fail", []byte(answers.JSON(1<<20-4096, 7)), false, true, true},
			} {
				key := fmt.Sprintf("blob-threshold-%s-%d", b.Name, time.Now().UnixNano())
				lease := c.acquire(idem.BeginRequest{Key: key})
				text := string(tt.body)
				switch {
				case tt.streamed:
					if hr, out := e.streamComplete(t, key, lease.LeaseToken, 200, nil, tt.body); hr.StatusCode != http.StatusOK {
						t.Fatalf("%s: complete %d %s", tt.name, hr.StatusCode, out)
					}
				case tt.fail:
					c.mustFail(idem.FailRequest{Key: key, LeaseToken: lease.LeaseToken, Retryable: ptr(false), Error: ptr("declined"),
						Response: &idem.StoredResponse{Body: &text, StatusCode: ptr(402)}})
				default:
					c.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: lease.LeaseToken, Response: &idem.StoredResponse{Body: &text}})
				}
				if objs := e.objects(t, keyHash(key)); (len(objs) == 1) != tt.byRef || len(objs) > 1 {
					t.Fatalf("%s: objects %v, want by reference: %v", tt.name, objs, tt.byRef)
				}
				rep, got := e.replayBody(t, key)
				if !bytes.Equal(got, tt.body) {
					t.Fatalf("%s: replayed %d bytes, not the %d sent", tt.name, len(got), len(tt.body))
				}
				if tt.fail && (rep.Status != idem.FinishedStateFailed || rep.Response.StatusCode == nil || *rep.Response.StatusCode != 402) {
					t.Fatalf("%s: replayed as %s %+v", tt.name, rep.Status, rep.Response.StatusCode)
				}
			}

			// A retryable fail stores no response: nothing is uploaded.
			key := fmt.Sprintf("blob-retryable-%s-%d", b.Name, time.Now().UnixNano())
			lease := c.acquire(idem.BeginRequest{Key: key})
			text := base64.StdEncoding.EncodeToString(randomBody(200_000))
			c.mustFail(idem.FailRequest{Key: key, LeaseToken: lease.LeaseToken, Response: &idem.StoredResponse{Body: &text}})
			if objs := e.objects(t, keyHash(key)); len(objs) != 0 {
				t.Fatalf("a retryable fail uploaded %v", objs)
			}

			// A terminal fail fenced by a takeover is refused, and its
			// object deleted.
			key = fmt.Sprintf("blob-fenced-fail-%s-%d", b.Name, time.Now().UnixNano())
			old := c.acquire(idem.BeginRequest{Key: key, LeaseMs: ptr(int64(100))})
			time.Sleep(150 * time.Millisecond)
			if taken := c.acquire(idem.BeginRequest{Key: key}); !taken.Recovered {
				t.Fatal("no takeover")
			}
			r := c.fail(idem.FailRequest{Key: key, LeaseToken: old.LeaseToken, Retryable: ptr(false), Response: &idem.StoredResponse{Body: &text}})
			requireProblem(t, r.HTTPResponse, r.Body, http.StatusConflict, "lease-lost")
			idemtest.Eventually(t, 10*time.Second, "the fenced fail's object deleted", func() bool {
				return len(e.objects(t, old.LeaseToken)) == 0
			})
		})
	}
}

// The reply to a complete is lost: the caller completes again with the
// same token, which is safe: the same answer, one object, the same replay.
func TestE2EBlobLostCompleteReply(t *testing.T) {
	srv := s3test.New(t)
	for _, b := range redisBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := startBlob(t, b, srv)
			c := e.as(t, "")
			key := fmt.Sprintf("blob-lost-%s-%d", b.Name, time.Now().UnixNano())
			lease := c.acquire(idem.BeginRequest{Key: key})
			body := randomBody(3 << 20)
			first, a := e.streamComplete(t, key, lease.LeaseToken, 200, nil, body)
			again, b2 := e.streamComplete(t, key, lease.LeaseToken, 200, nil, body)
			if first.StatusCode != 200 || again.StatusCode != 200 || !bytes.Equal(a, b2) {
				t.Fatalf("complete %d %s, again %d %s", first.StatusCode, a, again.StatusCode, b2)
			}
			if objs := e.objects(t, keyHash(key)); len(objs) != 1 {
				t.Fatalf("objects %v", objs)
			}
			if _, got := e.replayBody(t, key); !bytes.Equal(got, body) {
				t.Fatal("replay differs")
			}
		})
	}
}

// A complete fenced by a takeover is refused, and its object is deleted.
func TestE2EBlobFencedComplete(t *testing.T) {
	srv := s3test.New(t)
	for _, b := range redisBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := startBlob(t, b, srv)
			c := e.as(t, "")
			key := fmt.Sprintf("blob-fenced-%s-%d", b.Name, time.Now().UnixNano())
			old := c.acquire(idem.BeginRequest{Key: key, LeaseMs: ptr(int64(100))})
			time.Sleep(150 * time.Millisecond)
			taken := c.acquire(idem.BeginRequest{Key: key})
			if !taken.Recovered {
				t.Fatal("no takeover")
			}
			hr, out := e.streamComplete(t, key, old.LeaseToken, 200, nil, randomBody(512<<10))
			requireProblem(t, hr, out, http.StatusConflict, "lease-lost")
			idemtest.Eventually(t, 10*time.Second, "the fenced complete's object deleted", func() bool {
				return len(e.objects(t, old.LeaseToken)) == 0
			})
			// The holder completes, and the record stays in progress until then.
			body := randomBody(256 << 10)
			if hr, out := e.streamComplete(t, key, taken.LeaseToken, 200, nil, body); hr.StatusCode != 200 {
				t.Fatalf("complete %d %s", hr.StatusCode, out)
			}
			if _, got := e.replayBody(t, key); !bytes.Equal(got, body) {
				t.Fatal("replay differs")
			}
		})
	}
}

// A missing object and a corrupted one never replay a wrong body nor run
// the operation again: 503 blob-unavailable, the key stays completed.
func TestE2EBlobMissingAndCorrupt(t *testing.T) {
	srv := s3test.New(t)
	for _, b := range redisBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := startBlob(t, b, srv)
			c := e.as(t, "")
			complete := func(name string, size int) (string, []byte, string) {
				key := fmt.Sprintf("blob-%s-%s-%d", name, b.Name, time.Now().UnixNano())
				lease := c.acquire(idem.BeginRequest{Key: key})
				body := randomBody(size)
				if hr, out := e.streamComplete(t, key, lease.LeaseToken, 200, nil, body); hr.StatusCode != 200 {
					t.Fatalf("complete %d %s", hr.StatusCode, out)
				}
				objs := e.objects(t, keyHash(key))
				if len(objs) != 1 {
					t.Fatalf("objects %v", objs)
				}
				return key, body, objs[0]
			}
			requireCompleted := func(key string) {
				t.Helper()
				r := c.status(idem.GetStatusParams{Key: key})
				if r.JSON200 == nil || r.JSON200.State != idem.StateCompleted {
					t.Fatalf("status %d %s", r.StatusCode(), r.Body)
				}
			}
			before := idemtest.Metric(t, e.url, "idemsvc_blob_unavailable_total", `reason="missing"`)

			// Missing, replayed inline (under 1 MiB): the begin answers 503.
			key, _, obj := complete("missing-small", 300<<10)
			if _, err := srv.Client().DeleteObject(bg, &s3.DeleteObjectInput{Bucket: aws.String(s3test.Bucket), Key: &obj}); err != nil {
				t.Fatal(err)
			}
			r := c.begin(idem.BeginRequest{Key: key})
			requireProblem(t, r.HTTPResponse, r.Body, http.StatusServiceUnavailable, "blob-unavailable")
			if r.HTTPResponse.Header.Get("Retry-After") == "" {
				t.Fatal("no Retry-After")
			}
			requireCompleted(key)

			// Missing, replayed by reference: the body's fetch answers 503.
			key, _, obj = complete("missing-large", 2<<20)
			if _, err := srv.Client().DeleteObject(bg, &s3.DeleteObjectInput{Bucket: aws.String(s3test.Bucket), Key: &obj}); err != nil {
				t.Fatal(err)
			}
			rep := c.begin(idem.BeginRequest{Key: key})
			if rep.JSON200 == nil || rep.JSON200.Response.BodyRef == nil {
				t.Fatalf("begin %d %s", rep.StatusCode(), clipBody(rep.Body))
			}
			hr, out := e.raw(t, http.MethodGet, rep.JSON200.Response.BodyRef.Url, "", nil)
			requireProblem(t, hr, out, http.StatusServiceUnavailable, "blob-unavailable")
			requireCompleted(key)
			if after := idemtest.Metric(t, e.url, "idemsvc_blob_unavailable_total", `reason="missing"`); after < before+2 {
				t.Fatalf("idemsvc_blob_unavailable_total{reason=missing} %v, was %v", after, before)
			}

			// Corrupted below the store's API (same size, one byte
			// changed): the stream is cut off before its end, and the
			// next fetch answers 503 until the object is sound again.
			key, body, obj := complete("corrupt", 2<<20)
			path := srv.ObjectPath(obj)
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			data[len(data)-10] ^= 0xff
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
			url := "/v1/keys/body?key=" + key
			resp, err := e.http.Get(e.url + url)
			if err != nil {
				t.Fatal(err)
			}
			got, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if rerr == nil || len(got) >= len(body) {
				t.Fatalf("a corrupt body was delivered: %d of %d bytes, %v", len(got), len(body), rerr)
			}
			hr, out = e.raw(t, http.MethodGet, url, "", nil)
			requireProblem(t, hr, out, http.StatusServiceUnavailable, "blob-unavailable")
			requireCompleted(key)
			data[len(data)-10] ^= 0xff // repaired
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
			if _, got := e.replayBody(t, key); !bytes.Equal(got, body) {
				t.Fatal("the repaired object replays another body")
			}

			// Replaced through the API by other bytes of the same size:
			// its stored checksum tells at once.
			key, body, obj = complete("replaced", 2<<20)
			other := randomBody(len(body))
			if _, err := srv.Client().PutObject(bg, &s3.PutObjectInput{Bucket: aws.String(s3test.Bucket), Key: &obj, Body: bytes.NewReader(other),
				ChecksumAlgorithm: "SHA256"}); err != nil {
				t.Fatal(err)
			}
			hr, out = e.raw(t, http.MethodGet, "/v1/keys/body?key="+key, "", nil)
			requireProblem(t, hr, out, http.StatusServiceUnavailable, "blob-unavailable")
			requireCompleted(key)
		})
	}
}

// The blob store down at complete: 503 with Retry-After and the key stays
// in progress; the retry within the lease, once it is back, stores it.
// Down at replay: 503, then the replay once it is back.
func TestE2EBlobStoreDown(t *testing.T) {
	srv := s3test.New(t)
	for _, b := range redisBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := startBlob(t, b, srv)
			c := e.as(t, "")
			key := fmt.Sprintf("blob-down-%s-%d", b.Name, time.Now().UnixNano())
			lease := c.acquire(idem.BeginRequest{Key: key, LeaseMs: ptr(int64(60000))})
			body := randomBody(2 << 20)
			srv.Stop(t)
			hr, out := e.streamComplete(t, key, lease.LeaseToken, 200, nil, body)
			requireProblem(t, hr, out, http.StatusServiceUnavailable, "blob-unavailable")
			if hr.Header.Get("Retry-After") == "" {
				t.Fatal("no Retry-After")
			}
			if rec := c.record(key); rec.State != idem.StateInProgress {
				t.Fatalf("state %s after a complete the blob store refused", rec.State)
			}
			srv.Start(t)
			if hr, out := e.streamComplete(t, key, lease.LeaseToken, 200, nil, body); hr.StatusCode != 200 {
				t.Fatalf("retried complete %d %s", hr.StatusCode, out)
			}
			srv.Stop(t)
			hr, out = e.raw(t, http.MethodGet, "/v1/keys/body?key="+key, "", nil)
			requireProblem(t, hr, out, http.StatusServiceUnavailable, "blob-unavailable")
			if rec := c.record(key); rec.State != idem.StateCompleted {
				t.Fatalf("state %s", rec.State)
			}
			srv.Start(t)
			if _, got := e.replayBody(t, key); !bytes.Equal(got, body) {
				t.Fatal("replay differs")
			}
		})
	}
}

// DELETE /v1/keys deletes the record's object.
func TestE2EBlobDeleteKey(t *testing.T) {
	srv := s3test.New(t)
	e := startBlob(t, redisBackends()[0], srv)
	c := e.as(t, "")
	key := fmt.Sprintf("blob-delete-%d", time.Now().UnixNano())
	lease := c.acquire(idem.BeginRequest{Key: key})
	if hr, out := e.streamComplete(t, key, lease.LeaseToken, 200, nil, randomBody(1<<20)); hr.StatusCode != 200 {
		t.Fatalf("complete %d %s", hr.StatusCode, out)
	}
	if len(e.objects(t, keyHash(key))) != 1 {
		t.Fatal("no object")
	}
	if r := c.del(idem.DeleteKeyParams{Key: key}); r.StatusCode() != http.StatusNoContent {
		t.Fatalf("delete %d", r.StatusCode())
	}
	idemtest.Eventually(t, 10*time.Second, "the deleted record's object deleted", func() bool {
		return len(e.objects(t, keyHash(key))) == 0
	})
}

// Without a blob store the streamed complete keeps the stored-response
// limit (1 MiB) and stores inline.
func TestE2EStreamCompleteWithoutBlobStore(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		e := startOn(t, b.Open(t))
		c := e.as(t, "")
		key := fmt.Sprintf("stream-inline-%d", time.Now().UnixNano())
		lease := c.acquire(idem.BeginRequest{Key: key})
		// Sent without a length (chunked), so that idemsvc reads it to the
		// limit before it answers, rather than answer at once and close
		// the connection on a client still sending.
		hr, out := e.raw(t, http.MethodPost, "/v1/complete/stream", "application/octet-stream", io.MultiReader(bytes.NewReader(randomBody(1<<20+1))),
			"Idem-Key", key, "Idem-Lease-Token", lease.LeaseToken)
		requireProblem(t, hr, out, http.StatusRequestEntityTooLarge, "too-large")
		body := randomBody(700 << 10)
		if hr, out := e.streamComplete(t, key, lease.LeaseToken, 202, map[string]string{"X-A": "b"}, body); hr.StatusCode != 200 {
			t.Fatalf("complete %d %s", hr.StatusCode, out)
		}
		rep, got := e.replayBody(t, key)
		if !bytes.Equal(got, body) || *rep.Response.StatusCode != 202 || rep.Response.Headers["X-A"] != "b" {
			t.Fatalf("replay %+v, %d bytes", rep.Response.StatusCode, len(got))
		}
		hr, out = e.raw(t, http.MethodPost, "/v1/complete/stream", "application/json", strings.NewReader("{}"), "Idem-Key", key, "Idem-Lease-Token", lease.LeaseToken)
		requireProblem(t, hr, out, http.StatusUnsupportedMediaType, "unsupported-media-type")
	})
}

// A takeover deletes what the attempts before it uploaded without
// completing (a caller that crashed between its upload and its complete),
// and a delete of a record in progress deletes its attempt's object.
func TestE2EBlobTakeoverAndDeleteInProgress(t *testing.T) {
	srv := s3test.New(t)
	e := startBlob(t, redisBackends()[0], srv)
	c := e.as(t, "")
	put := func(key, token string) {
		t.Helper()
		body := randomBody(100 << 10)
		obj := e.st.ObjectKey("default", key, blob.ExpiryDay(time.Now(), 24*time.Hour), token)
		if err := e.st.Put(bg, obj, bytes.NewReader(body), int64(len(body)), sha256.Sum256(body)); err != nil {
			t.Fatal(err)
		}
	}
	key := fmt.Sprintf("blob-takeover-%d", time.Now().UnixNano())
	old := c.acquire(idem.BeginRequest{Key: key, LeaseMs: ptr(int64(100))})
	put(key, old.LeaseToken)            // uploaded, then the caller crashed
	time.Sleep(1100 * time.Millisecond) // past the lease, and a second past the upload (objects' times are whole seconds)
	taken := c.acquire(idem.BeginRequest{Key: key})
	if !taken.Recovered {
		t.Fatal("no takeover")
	}
	idemtest.Eventually(t, 10*time.Second, "the earlier attempt's object deleted", func() bool {
		return len(e.objects(t, old.LeaseToken)) == 0
	})
	put(key, taken.LeaseToken)
	time.Sleep(1100 * time.Millisecond)
	if r := c.del(idem.DeleteKeyParams{Key: key}); r.StatusCode() != http.StatusNoContent {
		t.Fatalf("delete %d", r.StatusCode())
	}
	idemtest.Eventually(t, 10*time.Second, "the deleted attempt's object deleted", func() bool {
		return len(e.objects(t, keyHash(key))) == 0
	})
}
