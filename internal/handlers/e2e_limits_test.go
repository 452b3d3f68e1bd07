// SPDX-License-Identifier: Apache-2.0

package handlers_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/statemachine"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
)

// limitsFixture is what a bad request is aimed at: a released key, which
// any valid begin would acquire, and a key in progress whose holder's
// complete, fail or extend would change it. Both keys are 255 bytes long,
// the longest a key may be.
type limitsFixture struct {
	released string
	held     string
	token    string
}

// padKey pads key with "k" to n bytes.
func padKey(key string, n int) string { return key + strings.Repeat("k", n-len(key)) }

func newLimitsFixture(c *caller) limitsFixture {
	c.t.Helper()
	f := limitsFixture{released: padKey(idemtest.Unique("released")+"/", 255), held: padKey(idemtest.Unique("held")+"/", 255)}
	l := c.acquire(idem.BeginRequest{Key: f.released, Fingerprint: ptr("fp-1")})
	c.mustFail(idem.FailRequest{Key: f.released, LeaseToken: l.LeaseToken, Retryable: ptr(true)})
	f.token = c.acquire(idem.BeginRequest{Key: f.held, Owner: ptr("req-1")}).LeaseToken
	return f
}

// answer is an HTTP answer as the generated client or a raw request got it.
type answer struct {
	resp *http.Response
	body []byte
}

// Every bad input of the contract's limits table gets its 4xx problem,
// naming the field at fault, and changes no record.
func TestE2EBadInput(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	type row struct {
		name   string
		send   func(c *caller, f limitsFixture) answer
		status int
		kind   string
		field  string // the problem's field member; "" for none
	}
	begin := func(req func(f limitsFixture) idem.BeginRequest) func(c *caller, f limitsFixture) answer {
		return func(c *caller, f limitsFixture) answer {
			r := c.begin(req(f))
			return answer{r.HTTPResponse, r.Body}
		}
	}
	complete := func(req func(f limitsFixture) idem.CompleteRequest) func(c *caller, f limitsFixture) answer {
		return func(c *caller, f limitsFixture) answer {
			r := c.complete(req(f))
			return answer{r.HTTPResponse, r.Body}
		}
	}
	fail := func(req func(f limitsFixture) idem.FailRequest) func(c *caller, f limitsFixture) answer {
		return func(c *caller, f limitsFixture) answer {
			r := c.fail(req(f))
			return answer{r.HTTPResponse, r.Body}
		}
	}
	extend := func(req func(f limitsFixture) idem.ExtendRequest) func(c *caller, f limitsFixture) answer {
		return func(c *caller, f limitsFixture) answer {
			r := c.extend(req(f))
			return answer{r.HTTPResponse, r.Body}
		}
	}
	// raw sends what the client cannot express. In body, %[1]s, %[2]s and
	// %[3]s stand for the released key, the held key and its token, as
	// JSON strings.
	raw := func(method, path, contentType, body string) func(c *caller, f limitsFixture) answer {
		return func(c *caller, f limitsFixture) answer {
			text := body
			if strings.Contains(body, "%[") {
				text = fmt.Sprintf(body, jsonText(f.released), jsonText(f.held), jsonText(f.token))
			}
			resp, b := c.e.raw(c.t, method, path, contentType, strings.NewReader(text))
			return answer{resp, b}
		}
	}
	const json = "application/json"
	beginWith := func(mod func(r *idem.BeginRequest)) func(c *caller, f limitsFixture) answer {
		return begin(func(f limitsFixture) idem.BeginRequest {
			r := idem.BeginRequest{Key: f.released}
			mod(&r)
			return r
		})
	}
	completeWith := func(resp idem.StoredResponse) func(c *caller, f limitsFixture) answer {
		return complete(func(f limitsFixture) idem.CompleteRequest {
			return idem.CompleteRequest{Key: f.held, LeaseToken: f.token, Response: &resp}
		})
	}
	// bigBegin is a valid begin of the released key padded with whitespace
	// to size bytes; chunked hides its length from the server.
	bigBegin := func(size int, chunked bool) func(c *caller, f limitsFixture) answer {
		return func(c *caller, f limitsFixture) answer {
			head := `{"key":` + jsonText(f.released)
			body := head + strings.Repeat(" ", size-len(head)-1) + "}"
			var r io.Reader = strings.NewReader(body)
			if chunked {
				r = io.MultiReader(r)
			}
			resp, b := c.e.raw(c.t, http.MethodPost, "/v1/begin", json, r)
			return answer{resp, b}
		}
	}
	statusRaw := func(query string) func(c *caller, f limitsFixture) answer {
		return func(c *caller, f limitsFixture) answer {
			resp, b := c.e.raw(c.t, http.MethodGet, "/v1/status?"+query, "", nil)
			return answer{resp, b}
		}
	}

	rows := []row{
		// key
		{"begin: empty key", beginWith(func(r *idem.BeginRequest) { r.Key = "" }), 400, "invalid-request", "key"},
		{"begin: missing key", raw("POST", "/v1/begin", json, `{"owner":"req-9"}`), 400, "invalid-request", "key"},
		{"begin: key of 256 bytes", beginWith(func(r *idem.BeginRequest) { r.Key += "x" }), 400, "invalid-request", "key"},
		{"begin: key with a space", beginWith(func(r *idem.BeginRequest) { r.Key = "order 1" }), 400, "invalid-request", "key"},
		{"begin: key with a tab", beginWith(func(r *idem.BeginRequest) { r.Key = "order\t1" }), 400, "invalid-request", "key"},
		{"begin: key with a NUL", beginWith(func(r *idem.BeginRequest) { r.Key = "order\x001" }), 400, "invalid-request", "key"},
		{"begin: key with DEL", beginWith(func(r *idem.BeginRequest) { r.Key = "order\x7f1" }), 400, "invalid-request", "key"},
		{"begin: key with non-ASCII", beginWith(func(r *idem.BeginRequest) { r.Key = "ordér-1" }), 400, "invalid-request", "key"},
		{"begin: key not a string", raw("POST", "/v1/begin", json, `{"key":17}`), 400, "invalid-request", "key"},
		{"complete: key of 256 bytes", complete(func(f limitsFixture) idem.CompleteRequest {
			return idem.CompleteRequest{Key: f.held + "x", LeaseToken: f.token}
		}), 400, "invalid-request", "key"},
		{"status: key of 256 bytes", statusRaw("key=" + strings.Repeat("s", 256)), 400, "invalid-request", "key"},
		{"status: key with a space", statusRaw("key=order%201"), 400, "invalid-request", "key"},
		{"status: no key", statusRaw("include_response=true"), 400, "invalid-request", "key"},
		{"status: include_response not a boolean", func(c *caller, f limitsFixture) answer {
			return statusRaw("key="+url.QueryEscape(f.held)+"&include_response=maybe")(c, f)
		}, 400, "invalid-request", "include_response"},
		{"delete: empty key", func(c *caller, f limitsFixture) answer {
			r := c.del(idem.DeleteKeyParams{Key: ""})
			return answer{r.HTTPResponse, r.Body}
		}, 400, "invalid-request", "key"},
		{"delete: key of 256 bytes", func(c *caller, f limitsFixture) answer {
			r := c.del(idem.DeleteKeyParams{Key: f.held + "x"})
			return answer{r.HTTPResponse, r.Body}
		}, 400, "invalid-request", "key"},

		// fingerprint, owner
		{"begin: fingerprint of 257 bytes", beginWith(func(r *idem.BeginRequest) { r.Fingerprint = ptr(strings.Repeat("f", 257)) }), 400, "invalid-request", "fingerprint"},
		{"begin: owner of 257 bytes", beginWith(func(r *idem.BeginRequest) { r.Owner = ptr(strings.Repeat("o", 257)) }), 400, "invalid-request", "owner"},

		// lease_ms, retention_s, wait_ms
		{"begin: lease_ms 99", beginWith(func(r *idem.BeginRequest) { r.LeaseMs = ptr[int64](99) }), 400, "invalid-request", "lease_ms"},
		{"begin: lease_ms 3600001", beginWith(func(r *idem.BeginRequest) { r.LeaseMs = ptr[int64](3600001) }), 400, "invalid-request", "lease_ms"},
		{"begin: lease_ms 0", beginWith(func(r *idem.BeginRequest) { r.LeaseMs = ptr[int64](0) }), 400, "invalid-request", "lease_ms"},
		{"begin: lease_ms -1", beginWith(func(r *idem.BeginRequest) { r.LeaseMs = ptr[int64](-1) }), 400, "invalid-request", "lease_ms"},
		{"begin: lease_ms not an integer", raw("POST", "/v1/begin", json, `{"key":%[1]s,"lease_ms":100.5}`), 400, "invalid-request", "lease_ms"},
		{"begin: lease_ms a string", raw("POST", "/v1/begin", json, `{"key":%[1]s,"lease_ms":"1000"}`), 400, "invalid-request", "lease_ms"},
		{"begin: retention_s 0", beginWith(func(r *idem.BeginRequest) { r.RetentionS = ptr[int64](0) }), 400, "invalid-request", "retention_s"},
		{"begin: retention_s 2592001", beginWith(func(r *idem.BeginRequest) { r.RetentionS = ptr[int64](2592001) }), 400, "invalid-request", "retention_s"},
		{"begin: wait_ms -1", beginWith(func(r *idem.BeginRequest) { r.WaitMs = ptr[int64](-1) }), 400, "invalid-request", "wait_ms"},
		{"begin: wait_ms 30001", beginWith(func(r *idem.BeginRequest) { r.WaitMs = ptr[int64](30001) }), 400, "invalid-request", "wait_ms"},
		{"extend: lease_ms 99", extend(func(f limitsFixture) idem.ExtendRequest {
			return idem.ExtendRequest{Key: f.held, LeaseToken: f.token, LeaseMs: ptr[int64](99)}
		}), 400, "invalid-request", "lease_ms"},
		{"extend: lease_ms 3600001", extend(func(f limitsFixture) idem.ExtendRequest {
			return idem.ExtendRequest{Key: f.held, LeaseToken: f.token, LeaseMs: ptr[int64](3600001)}
		}), 400, "invalid-request", "lease_ms"},
		{"extend: lease_ms 0", extend(func(f limitsFixture) idem.ExtendRequest {
			return idem.ExtendRequest{Key: f.held, LeaseToken: f.token, LeaseMs: ptr[int64](0)}
		}), 400, "invalid-request", "lease_ms"},
		{"complete: retention_s 0", complete(func(f limitsFixture) idem.CompleteRequest {
			return idem.CompleteRequest{Key: f.held, LeaseToken: f.token, RetentionS: ptr[int64](0)}
		}), 400, "invalid-request", "retention_s"},
		{"complete: retention_s 2592001", complete(func(f limitsFixture) idem.CompleteRequest {
			return idem.CompleteRequest{Key: f.held, LeaseToken: f.token, RetentionS: ptr[int64](2592001)}
		}), 400, "invalid-request", "retention_s"},

		// the request body
		{"begin: body over 2 MiB", bigBegin(2*mib+1, false), 413, "too-large", ""},
		{"begin: chunked body over 2 MiB", bigBegin(2*mib+1, true), 413, "too-large", ""},
		{"begin: invalid JSON", raw("POST", "/v1/begin", json, `{"key":%[1]s`), 400, "invalid-request", ""},
		{"begin: trailing garbage", raw("POST", "/v1/begin", json, `{"key":%[1]s} x`), 400, "invalid-request", ""},
		{"begin: two JSON values", raw("POST", "/v1/begin", json, `{"key":%[1]s}{"key":%[1]s}`), 400, "invalid-request", ""},
		{"begin: empty body", raw("POST", "/v1/begin", json, ``), 400, "invalid-request", ""},
		{"begin: body not an object", raw("POST", "/v1/begin", json, `[%[1]s]`), 400, "invalid-request", ""},
		{"begin: null body", raw("POST", "/v1/begin", json, `null`), 400, "invalid-request", ""},
		{"begin: unknown field", raw("POST", "/v1/begin", json, `{"key":%[1]s,"colour":"red"}`), 400, "invalid-request", "colour"},
		{"begin: unknown field of 2,000 bytes, clipped", raw("POST", "/v1/begin", json, `{"key":%[1]s,"`+strings.Repeat("c", 2000)+`":1}`),
			400, "invalid-request", strings.Repeat("c", 255) + "…"},
		{"begin: field name in another case", raw("POST", "/v1/begin", json, `{"Key":%[1]s}`), 400, "invalid-request", "Key"},
		{"begin: field name in another case after key", raw("POST", "/v1/begin", json, `{"key":%[1]s,"Lease_ms":1000}`), 400, "invalid-request", "Lease_ms"},
		{"begin: field given twice", raw("POST", "/v1/begin", json, `{"key":%[1]s,"key":%[2]s}`), 400, "invalid-request", "key"},
		{"complete: unknown field of the response", raw("POST", "/v1/complete", json,
			`{"key":%[2]s,"lease_token":%[3]s,"response":{"status":201}}`), 400, "invalid-request", "response.status"},
		{"complete: response not an object", raw("POST", "/v1/complete", json,
			`{"key":%[2]s,"lease_token":%[3]s,"response":"created"}`), 400, "invalid-request", "response"},

		// the response to store
		{"complete: status_code 99", completeWith(idem.StoredResponse{StatusCode: ptr(99)}), 400, "invalid-request", "response.status_code"},
		{"complete: status_code 600", completeWith(idem.StoredResponse{StatusCode: ptr(600)}), 400, "invalid-request", "response.status_code"},
		{"complete: status_code 0", completeWith(idem.StoredResponse{StatusCode: ptr(0)}), 400, "invalid-request", "response.status_code"},
		{"complete: a header value that is a number", raw("POST", "/v1/complete", json,
			`{"key":%[2]s,"lease_token":%[3]s,"response":{"headers":{"X-Count":3}}}`), 400, "invalid-request", "response.headers"},
		{"complete: a header value that is a list", raw("POST", "/v1/complete", json,
			`{"key":%[2]s,"lease_token":%[3]s,"response":{"headers":{"Vary":["a","b"]}}}`), 400, "invalid-request", "response.headers"},
		{"complete: a null header value", raw("POST", "/v1/complete", json,
			`{"key":%[2]s,"lease_token":%[3]s,"response":{"headers":{"X-A":null}}}`), 400, "invalid-request", "response.headers"},
		{"complete: a text body with a lone surrogate", raw("POST", "/v1/complete", json,
			`{"key":%[2]s,"lease_token":%[3]s,"response":{"body":"a\ud800b"}}`), 400, "invalid-request", "response.body"},
		{"complete: a text body that is not UTF-8", raw("POST", "/v1/complete", json,
			"{\"key\":%[2]s,\"lease_token\":%[3]s,\"response\":{\"body\":\"caf\xe9\"}}"), 400, "invalid-request", "response.body"},
		{"complete: a header value with CR LF", raw("POST", "/v1/complete", json,
			`{"key":%[2]s,"lease_token":%[3]s,"response":{"headers":{"X-A":"a\r\nSet-Cookie: b"}}}`), 400, "invalid-request", "response.headers"},
		{"complete: a header value with NUL", raw("POST", "/v1/complete", json,
			`{"key":%[2]s,"lease_token":%[3]s,"response":{"headers":{"X-A":"a\u0000b"}}}`), 400, "invalid-request", "response.headers"},
		{"complete: an empty header name", raw("POST", "/v1/complete", json,
			`{"key":%[2]s,"lease_token":%[3]s,"response":{"headers":{"":"a"}}}`), 400, "invalid-request", "response.headers"},
		{"complete: a header name with a space", raw("POST", "/v1/complete", json,
			`{"key":%[2]s,"lease_token":%[3]s,"response":{"headers":{"X A":"a"}}}`), 400, "invalid-request", "response.headers"},
		{"fail: a header name with a colon", raw("POST", "/v1/fail", json,
			`{"key":%[2]s,"lease_token":%[3]s,"retryable":false,"response":{"headers":{"X:A":"a"}}}`), 400, "invalid-request", "response.headers"},
		{"complete: 101 headers", completeWith(idem.StoredResponse{Headers: manyHeaders(101)}), 400, "invalid-request", "response.headers"},
		{"fail: 101 empty headers", fail(func(f limitsFixture) idem.FailRequest {
			h := manyHeaders(101)
			for name := range h {
				h[name] = ""
			}
			return idem.FailRequest{Key: f.held, LeaseToken: f.token, Retryable: ptr(false), Response: &idem.StoredResponse{Headers: h}}
		}), 400, "invalid-request", "response.headers"},
		{"complete: body_encoding hex", completeWith(idem.StoredResponse{Body: ptr("cafe"), BodyEncoding: ptr(idem.BodyEncoding("hex"))}), 400, "invalid-request", "response.body_encoding"},
		{"complete: bad base64", completeWith(idem.StoredResponse{Body: ptr("not base64!"), BodyEncoding: ptr(idem.BodyEncodingBase64)}), 400, "invalid-request", "response.body"},
		{"fail: status_code 600", fail(func(f limitsFixture) idem.FailRequest {
			return idem.FailRequest{Key: f.held, LeaseToken: f.token, Retryable: ptr(false), Response: &idem.StoredResponse{StatusCode: ptr(600)}}
		}), 400, "invalid-request", "response.status_code"},
		{"fail: bad base64", fail(func(f limitsFixture) idem.FailRequest {
			return idem.FailRequest{Key: f.held, LeaseToken: f.token, Retryable: ptr(false),
				Response: &idem.StoredResponse{Body: ptr("%%%"), BodyEncoding: ptr(idem.BodyEncodingBase64)}}
		}), 400, "invalid-request", "response.body"},
		{"fail: retryable not a boolean", raw("POST", "/v1/fail", json, `{"key":%[2]s,"lease_token":%[3]s,"retryable":"no"}`), 400, "invalid-request", "retryable"},

		// lease_token
		{"complete: missing lease_token", raw("POST", "/v1/complete", json, `{"key":%[2]s,"response":{"body":"x"}}`), 400, "invalid-request", "lease_token"},
		{"complete: empty lease_token", complete(func(f limitsFixture) idem.CompleteRequest {
			return idem.CompleteRequest{Key: f.held, Response: &idem.StoredResponse{Body: ptr("x")}}
		}), 400, "invalid-request", "lease_token"},
		{"fail: missing lease_token", raw("POST", "/v1/fail", json, `{"key":%[2]s,"retryable":false}`), 400, "invalid-request", "lease_token"},
		{"extend: missing lease_token", raw("POST", "/v1/extend", json, `{"key":%[2]s,"lease_ms":60000}`), 400, "invalid-request", "lease_token"},

		// method, path, content type
		{"GET /v1/begin", raw("GET", "/v1/begin", "", ""), 405, "method-not-allowed", ""},
		{"PUT /v1/complete", raw("PUT", "/v1/complete", json, `{"key":%[2]s,"lease_token":%[3]s}`), 405, "method-not-allowed", ""},
		{"DELETE /v1/status", func(c *caller, f limitsFixture) answer {
			return raw("DELETE", "/v1/status?key="+url.QueryEscape(f.held), "", "")(c, f)
		}, 405, "method-not-allowed", ""},
		{"POST /v1/keys", raw("POST", "/v1/keys", json, `{"key":%[2]s}`), 405, "method-not-allowed", ""},
		{"GET /v1/unknown", raw("GET", "/v1/unknown", "", ""), 404, "not-found", ""},
		{"POST /v1/begin/now", raw("POST", "/v1/begin/now", json, `{"key":%[1]s}`), 404, "not-found", ""},
		{"GET /", raw("GET", "/", "", ""), 404, "not-found", ""},
		{"begin: text/plain", raw("POST", "/v1/begin", "text/plain", `{"key":%[1]s}`), 415, "unsupported-media-type", ""},
		{"begin: no content type", raw("POST", "/v1/begin", "", `{"key":%[1]s}`), 415, "unsupported-media-type", ""},
		{"complete: form content type", raw("POST", "/v1/complete", "application/x-www-form-urlencoded", `{"key":%[2]s,"lease_token":%[3]s}`), 415, "unsupported-media-type", ""},
		{"complete: application/jsonx", raw("POST", "/v1/complete", "application/jsonx", `{"key":%[2]s,"lease_token":%[3]s}`), 415, "unsupported-media-type", ""},
	}

	forEachBackend(t, func(t *testing.T, b backend) {
		e := startOn(t, b.Open(t))
		for _, r := range rows {
			t.Run(r.name, func(t *testing.T) {
				t.Parallel()
				c := e.as(t, "")
				f := newLimitsFixture(c)
				released, held := c.snapshot(f.released), c.snapshot(f.held)
				a := r.send(c, f)
				p := requireProblem(t, a.resp, a.body, r.status, r.kind)
				requireField(t, p, r.field)
				if got := c.snapshot(f.released); got != released {
					t.Fatalf("the released record changed:\n%s\n%s", released, got)
				}
				if got := c.snapshot(f.held); got != held {
					t.Fatalf("the record in progress changed:\n%s\n%s", held, got)
				}
				// The fixture still works: the refusal left nothing behind.
				c.mustComplete(idem.CompleteRequest{Key: f.held, LeaseToken: f.token})
				if l := c.acquire(idem.BeginRequest{Key: f.released}); l.Attempt != 2 {
					t.Fatalf("begin of the released key: attempt %d, want 2", l.Attempt)
				}
			})
		}
	})
}

// The bounds of every limit are inside it.
func TestE2ELimitsInclusive(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	forEachBackend(t, func(t *testing.T, b backend) {
		e := startOn(t, b.Open(t))
		for _, r := range []struct {
			name string
			req  idem.BeginRequest
		}{
			{"key of 255 bytes", idem.BeginRequest{Key: padKey(idemtest.Unique("bound"), 255)}},
			{"key of one byte", idem.BeginRequest{}}, // the key is set below
			{"fingerprint of 256 bytes", idem.BeginRequest{Fingerprint: ptr(strings.Repeat("f", 256))}},
			{"owner of 256 bytes", idem.BeginRequest{Owner: ptr(strings.Repeat("o", 256))}},
			{"lease_ms 100", idem.BeginRequest{LeaseMs: ptr[int64](100)}},
			{"lease_ms 3600000", idem.BeginRequest{LeaseMs: ptr[int64](3600000)}},
			{"retention_s 1", idem.BeginRequest{RetentionS: ptr[int64](1)}},
			{"retention_s 2592000", idem.BeginRequest{RetentionS: ptr[int64](2592000)}},
			{"wait_ms 0", idem.BeginRequest{WaitMs: ptr[int64](0)}},
			{"wait_ms 30000", idem.BeginRequest{WaitMs: ptr[int64](30000)}},
		} {
			t.Run(r.name, func(t *testing.T) {
				t.Parallel()
				c := e.as(t, "")
				req := r.req
				switch {
				case r.name == "key of one byte":
					// Few keys are this short: forget it first so that the
					// begin finds it new whatever ran before.
					req.Key = "~"
					if d := c.del(idem.DeleteKeyParams{Key: req.Key}); d.StatusCode() != http.StatusNoContent {
						t.Fatalf("delete: %d %s", d.StatusCode(), d.Body)
					}
				case req.Key == "":
					req.Key = idemtest.Unique("bound")
				}
				c.acquire(req)
			})
		}
		for _, code := range []int{100, 599} {
			t.Run(fmt.Sprintf("status_code %d", code), func(t *testing.T) {
				t.Parallel()
				c := e.as(t, "")
				key := idemtest.Unique("bound")
				l := c.acquire(idem.BeginRequest{Key: key})
				c.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: l.LeaseToken, Response: &idem.StoredResponse{StatusCode: &code}})
				if r := c.begin(idem.BeginRequest{Key: key}); *r.JSON200.Response.StatusCode != code {
					t.Fatalf("replay: %s", r.Body)
				}
			})
		}
		t.Run("a hundred headers", func(t *testing.T) {
			t.Parallel()
			c := e.as(t, "")
			key := idemtest.Unique("bound")
			l := c.acquire(idem.BeginRequest{Key: key})
			c.mustComplete(idem.CompleteRequest{Key: key, LeaseToken: l.LeaseToken, Response: &idem.StoredResponse{Headers: manyHeaders(100)}})
			if r := c.begin(idem.BeginRequest{Key: key}); len(r.JSON200.Response.Headers) != 100 {
				t.Fatalf("replay: %d headers", len(r.JSON200.Response.Headers))
			}
		})
		t.Run("content type with parameters", func(t *testing.T) {
			t.Parallel()
			resp, body := e.raw(t, http.MethodPost, "/v1/begin", "application/json; charset=utf-8",
				jsonBody(t, idem.BeginRequest{Key: idemtest.Unique("ct")}))
			requireJSON(t, resp, body, http.StatusCreated)
		})
		t.Run("a body of exactly 2 MiB", func(t *testing.T) {
			t.Parallel()
			key := idemtest.Unique("big")
			head := `{"key":` + jsonText(key)
			body := head + strings.Repeat(" ", 2*mib-len(head)-1) + "}"
			resp, b := e.raw(t, http.MethodPost, "/v1/begin", "application/json", bytes.NewReader([]byte(body)))
			requireJSON(t, resp, b, http.StatusCreated)
		})
	})
}

// A 405 names the methods the path takes (RFC 9110, Allow).
func TestE2EMethodNotAllowedNamesAllowed(t *testing.T) {
	e := startOn(t, statemachine.NewMemoryStore(statemachine.DefaultLimits()))
	for path, want := range map[string]string{"/v1/begin": "POST", "/v1/status": "GET, HEAD", "/v1/keys": "GET, HEAD, DELETE"} {
		resp, _ := e.raw(t, http.MethodPut, path, "application/json", strings.NewReader("{}"))
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != want {
			t.Errorf("PUT %s = %d, Allow %q; want 405, Allow %q", path, resp.StatusCode, resp.Header.Get("Allow"), want)
		}
	}
}

// Every GET route answers HEAD with the GET's status and headers and no
// body (RFC 9110).
func TestE2EHeadOnGetRoutes(t *testing.T) {
	e := startOn(t, statemachine.NewMemoryStore(statemachine.DefaultLimits()))
	if resp, _ := e.raw(t, http.MethodPost, "/v1/begin", "application/json", strings.NewReader(`{"key":"headed"}`)); resp.StatusCode != http.StatusCreated {
		t.Fatalf("begin = %d", resp.StatusCode)
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics", "/v1/status?key=headed", "/v1/status?key=absent", "/v1/keys?state=in_progress"} {
		get, _ := e.raw(t, http.MethodGet, path, "", nil)
		head, body := e.raw(t, http.MethodHead, path, "", nil)
		if head.StatusCode != get.StatusCode || head.Header.Get("Content-Type") != get.Header.Get("Content-Type") || len(body) != 0 {
			t.Errorf("HEAD %s = %d %q, %d body bytes; GET = %d %q", path, head.StatusCode, head.Header.Get("Content-Type"), len(body),
				get.StatusCode, get.Header.Get("Content-Type"))
		}
	}
}

// Strict edges: a header that must be one, given twice, is 400; API
// answers are never cached; a body cut short gets a 400 that names no
// socket address.
func TestE2EStrictEdges(t *testing.T) {
	e := startOn(t, statemachine.NewMemoryStore(statemachine.DefaultLimits()))
	body := `{"key":"strict"}`
	for _, header := range []string{"Authorization", "Content-Type"} {
		req, _ := http.NewRequest(http.MethodPost, e.url+"/v1/begin", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Add(header, "Bearer a")
		req.Header.Add(header, "application/json")
		resp, err := e.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var p struct{ Detail string }
		if resp.StatusCode != http.StatusBadRequest || json.Unmarshal(raw, &p) != nil ||
			p.Detail != "the "+header+" header is given more than once; send it once" {
			t.Errorf("two %s headers: %d %s", header, resp.StatusCode, raw)
		}
	}
	for _, c := range []struct{ method, path, body string }{
		{http.MethodPost, "/v1/begin", body},
		{http.MethodGet, "/v1/status?key=strict&include_response=true", ""},
		{http.MethodPost, "/v1/begin", `{"key":`},
	} {
		resp, _ := e.raw(t, c.method, c.path, "application/json", strings.NewReader(c.body))
		if resp.Header.Get("Cache-Control") != "no-store" {
			t.Errorf("%s %s = %d, Cache-Control %q", c.method, c.path, resp.StatusCode, resp.Header.Get("Cache-Control"))
		}
	}

	// A body that stalls until the server's read deadline: the error names
	// both ends of the socket, and the answer must not.
	svc := handlers.New(handlers.Config{Store: statemachine.NewMemoryStore(statemachine.DefaultLimits())})
	srv := httptest.NewUnstartedServer(svc)
	srv.Config.ReadTimeout = 300 * time.Millisecond
	srv.Start()
	t.Cleanup(srv.Close)
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/begin HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"key\":")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadRequest || strings.Contains(string(raw), "127.0.0.1") || strings.Contains(string(raw), "tcp") {
		t.Errorf("a stalled body: %d %s", resp.StatusCode, raw)
	}
}

// manyHeaders returns n distinct headers with empty values.
func manyHeaders(n int) map[string]string {
	h := make(map[string]string, n)
	for i := range n {
		h[fmt.Sprintf("X-%d", i)] = ""
	}
	return h
}
