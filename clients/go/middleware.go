// SPDX-License-Identifier: Apache-2.0

package idem

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// MiddlewareOptions configure Middleware. Zero values take the defaults.
type MiddlewareOptions struct {
	// KeyHeader names the request header with the idempotency key
	// (default "Idempotency-Key").
	KeyHeader string
	// Methods are the methods made idempotent (default POST and PATCH),
	// taken in upper case. A request of any other method runs every time,
	// key or not, except one that spells a handled method in other case
	// (post), which gets 400.
	Methods []string
	// Optional lets requests of those methods without a key through, not
	// idempotent; by default they get 400.
	Optional bool
	// Headers lists the response headers stored and replayed (default
	// Content-Type, Content-Language, Location, ETag, Last-Modified);
	// others reach only the first caller.
	Headers []string
	// Lease, Retention and Wait are as in DoOptions; Wait (default 0) is
	// how long a duplicate waits for the attempt in progress before 409.
	Lease     time.Duration
	Retention time.Duration
	Wait      time.Duration
	// MaxBodyBytes bounds the request body read for the fingerprint
	// (default 1 MiB); a larger one gets 413.
	MaxBodyBytes int64
	// MaxStoredBodyBytes bounds the answer's body held to be stored
	// (default 1 MiB, idemsvc's default max-response-bytes). A larger body
	// is sent to the caller as the handler writes it, and stored without
	// it: its replays carry the status and headers, an empty body and
	// "Idempotent-Body-Omitted: true". Memory per request stays bounded.
	MaxStoredBodyBytes int
	// MaxStreamedBodyBytes, when idemsvc keeps large bodies in a blob
	// store (IDEMSVC_BLOB_URL), stores answers whose body is over
	// MaxStoredBodyBytes whole: from the write that crosses it, the body
	// goes to the caller and to idemsvc (POST /v1/complete/stream) as the
	// handler writes it, never held, up to this many bytes (at most
	// idemsvc's IDEMSVC_MAX_STORED_BYTES, 64 MiB by default); its replays
	// stream it back. A body past it is stored without its body, as
	// above. 0 (the default) streams nothing.
	MaxStreamedBodyBytes int64
	// Budget bounds the begin, retries included, before the middleware
	// gives up and answers 503 (default 2 s plus Wait): on a request path,
	// fail closed fast rather than hold the caller while idemsvc or Redis
	// is down.
	Budget time.Duration

	// Scope names the end user a request acts for: a stable subject from
	// the application's authentication (a user or account id, not a token
	// that rotates), read from the request (set by the authentication in
	// front of the middleware). It is part of the stored key, so another
	// user's request with the same key is another record: it never
	// receives, waits on or is refused because of this user's. Requests
	// for which it returns "" (anonymous ones) share one scope, and the
	// credentials' digest joins their fingerprint, as without a Scope.
	// Recommended wherever end users send keys.
	Scope func(r *http.Request) string
	// CredentialCookies names the cookies that identify the caller, beside
	// the Authorization header. Without a Scope, a keyed digest of these
	// credentials is part of the fingerprint: another caller's request with
	// the same key gets 422, never the stored answer. (They are not part of
	// the key: a retry after a token refresh gets 422, not a second run.)
	// A request without credentials adds nothing.
	CredentialCookies []string
	// CredentialSecret keys that digest (default: the client's API key).
	// Give every replica of a service the same one; give one explicitly to
	// keep fingerprints across an API key rotation.
	CredentialSecret []byte
	// Unscoped turns the scope and the credentials' digest off: any caller
	// that knows a key and its request gets its stored answer. Only for
	// APIs whose tenant at idemsvc has one caller (a service calling
	// another). Middleware panics when Scope is set too.
	Unscoped bool
	// NoLegacyFingerprints stops the lookup of a record stored with the
	// fingerprint of the SDK's earlier versions (method, path, query and
	// raw body, no credentials) after a mismatch. The lookup reads the
	// record without acquiring it, and replays it when it holds that
	// fingerprint, so that records stored before an upgrade replay until
	// they expire (a day, by default), to any caller with the same key and
	// request, as they did before it.
	NoLegacyFingerprints bool
}

// DefaultMiddlewareBudget is MiddlewareOptions.Budget's default.
const DefaultMiddlewareBudget = 2 * time.Second

// ReplayedHeader marks a response replayed from idemsvc.
const ReplayedHeader = "Idempotent-Replayed"

// Middleware makes an HTTP handler idempotent, per the Idempotency-Key
// header draft (draft-ietf-httpapi-idempotency-key-header). A request of
// a configured method (POST, PATCH) with the key header runs the handler at
// most once per key: a duplicate gets the stored response byte for byte,
// with "Idempotent-Replayed: true". The header's value is a Structured
// Field String ("abc"), or for compatibility a bare abc (the same key); an
// empty, malformed or over-long key gets 400. The fingerprint is a SHA-256
// of the method, path, query and body (a JSON body in its RFC 8785
// canonical form, so member order and whitespace do not matter), so reusing
// a key for another request gets 422; a duplicate of a request still
// running gets 409 with Retry-After. A 5xx, 408 or 429 from the handler
// fails the attempt retryably, so a retry runs it again. An answer too large to store is
// stored without its body: its replays carry the status and headers, an
// empty body and "Idempotent-Body-Omitted: true". When idemsvc cannot be
// reached the middleware fails closed with 503.
//
// Keys are scoped to the end user: by Scope, part of the stored key; without
// one, by a keyed digest of the caller's credentials (the Authorization
// header and CredentialCookies) in the fingerprint. Either way another
// user's request with the same key never gets this user's answer. Unscoped
// turns both off; it panics together with Scope, which it contradicts.
func Middleware(c *Client, opts MiddlewareOptions) func(http.Handler) http.Handler {
	if opts.Scope != nil && opts.Unscoped {
		panic("idem: MiddlewareOptions.Scope and Unscoped contradict each other: set one")
	}
	if opts.KeyHeader == "" {
		opts.KeyHeader = "Idempotency-Key"
	}
	if opts.Headers == nil {
		opts.Headers = []string{"Content-Type", "Content-Language", "Location", "ETag", "Last-Modified"}
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = 1 << 20
	}
	if opts.MaxStoredBodyBytes <= 0 {
		opts.MaxStoredBodyBytes = 1 << 20
	}
	if opts.Lease <= 0 {
		opts.Lease = DefaultLease
	}
	if opts.Methods == nil {
		opts.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	// Methods are case-sensitive, and requests name them in upper case: a
	// configured "post" would otherwise refuse every POST as a variant.
	methods := make([]string, len(opts.Methods))
	for i, m := range opts.Methods {
		methods[i] = strings.ToUpper(m)
	}
	opts.Methods = methods
	if opts.Budget <= 0 {
		opts.Budget = DefaultMiddlewareBudget
	}
	credKey := c.credentialKey
	if opts.CredentialSecret != nil {
		credKey = credentialKey(opts.CredentialSecret)
	}
	scoped := opts.Scope != nil
	allowed := make([]string, len(opts.Headers))
	for i, h := range opts.Headers {
		allowed[i] = http.CanonicalHeaderKey(h)
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !slices.Contains(opts.Methods, r.Method) {
				if m, ok := caseVariant(opts.Methods, r.Method); ok {
					writeProblem(w, http.StatusBadRequest, "invalid-request",
						"method names are case-sensitive (RFC 9110): "+strconv.Quote(r.Method)+" is not "+m, 0)
					return
				}
				next.ServeHTTP(w, r) // not made idempotent: runs every time
				return
			}
			values := r.Header.Values(opts.KeyHeader)
			if len(values) == 0 {
				if !opts.Optional {
					writeProblem(w, http.StatusBadRequest, "invalid-request", "the "+opts.KeyHeader+" header is required", 0)
					return
				}
				next.ServeHTTP(w, r)
				return
			}
			key, ok := parseKey(values)
			if !ok {
				writeProblem(w, http.StatusBadRequest, "invalid-request",
					"the "+opts.KeyHeader+" header must be one non-empty Structured Field String of at most 255 characters, such as \"8e03978e\"", 0)
				return
			}
			withCredentials := !opts.Unscoped
			if scoped {
				scope := opts.Scope(r)
				withCredentials = scope == ""
				if key, ok = scopedKey(scope, key); !ok {
					writeProblem(w, http.StatusBadRequest, "invalid-request", "idempotency key: key must be visible ASCII (0x21-0x7E)", 0)
					return
				}
			}
			body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, opts.MaxBodyBytes))
			if err != nil {
				if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
					writeProblem(w, http.StatusRequestEntityTooLarge, "too-large", "the request body is too large to be made idempotent", 0)
				} else {
					writeProblem(w, http.StatusBadRequest, "invalid-request", "the request body could not be read", 0)
				}
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			ctx := r.Context()
			if id := r.Header.Get("X-Request-Id"); id != "" {
				ctx = WithRequestID(ctx, id)
				r = r.WithContext(ctx)
			}
			var credentials []byte
			if withCredentials {
				credentials = credentialDigest(r, credKey, opts.CredentialCookies)
			}
			params := BeginParams{Key: key, Fingerprint: fingerprint(r, body, credentials),
				Lease: opts.Lease, Retention: opts.Retention, Wait: opts.Wait}
			beginCtx, cancel := context.WithTimeout(ctx, opts.Budget+opts.Wait)
			res, err := c.Begin(beginCtx, params)
			if errors.Is(err, ErrFingerprintMismatch) && !opts.NoLegacyFingerprints && !scoped {
				// Perhaps a record stored before fingerprints had a version
				// (a scoped key never had one).
				legacyAnswer(beginCtx, w, c, key, legacyFingerprint(r, body))
				cancel()
				return
			}
			cancel()
			if err != nil {
				writeBeginError(w, err)
				return
			}
			if res.Replay != nil {
				writeReplay(r.Context(), w, c, key, res.Replay)
				return
			}
			rec := &recorder{header: make(http.Header), w: w, limit: opts.MaxStoredBodyBytes}
			var streamed bool
			_, _ = c.run(r.Context(), key, res.Lease, DoOptions{Lease: opts.Lease, Retention: opts.Retention, omitBody: true, streamed: &streamed},
				func(ctx context.Context) (Response, error) {
					if opts.MaxStreamedBodyBytes > 0 {
						rec.stream = func(status int, headers map[string]string) *bodyStream {
							return startStream(context.WithoutCancel(ctx), c, key, res.Lease.LeaseToken, status, headers, opts.Retention, opts.MaxStreamedBodyBytes)
						}
						rec.allowed = allowed
					}
					next.ServeHTTP(rec, r.WithContext(ctx))
					if rec.status == 0 && r.Context().Err() != nil {
						// The caller went away and the handler gave up
						// without an answer: nothing to replay.
						rec.abortStream(r.Context().Err())
						return Response{}, fmt.Errorf("the request was cancelled: %w", r.Context().Err())
					}
					if rec.streamed != nil && rec.broken == nil && r.Context().Err() != nil {
						rec.broken = r.Context().Err() // the caller left
					}
					if rec.streamed != nil && rec.broken != nil {
						// The caller's connection broke while the answer
						// streamed: what the handler wrote after may be
						// cut short, so nothing is stored and the attempt
						// fails retryably, as for any broken connection.
						rec.abortStream(rec.broken)
						return Response{}, fmt.Errorf("the caller's connection broke while the answer streamed: %w", rec.broken)
					}
					if rec.streamed != nil {
						// Stored by the stream, unless it failed: past
						// its bound, stored without the body; else the
						// attempt fails, retryably.
						err := rec.streamed.finish()
						switch {
						case err == nil:
							streamed = true
							return rec.stored(allowed), nil
						case !errors.Is(err, errStreamTooLarge):
							return Response{}, fmt.Errorf("the streamed answer could not be stored: %w", err)
						}
						rec.streaming = true // stored without its body
					}
					resp := rec.stored(allowed)
					if retryAgain(resp.StatusCode) {
						return resp, fmt.Errorf("the handler answered %d", resp.StatusCode)
					}
					return resp, nil
				})
			// The handler ran: its caller gets its response, whether or not
			// storing it worked; a duplicate then runs it again or gets 409.
			rec.writeTo(w)
		})
	}
}

// caseVariant finds the handled method that method spells in other case
// (post for POST). HTTP methods are case-sensitive, so post is not POST;
// but a server behind may take it as POST, and passed through it would
// run without its key. It is refused instead.
func caseVariant(methods []string, method string) (string, bool) {
	for _, m := range methods {
		if strings.EqualFold(m, method) {
			return m, true
		}
	}
	return "", false
}

// retryAgain reports whether an answer is not to be stored, so that a
// retry runs the handler again: a server error, 408 Request Timeout and
// 429 Too Many Requests say the request may succeed later.
func retryAgain(status int) bool {
	return status >= 500 || status == http.StatusRequestTimeout || status == http.StatusTooManyRequests
}

// maxKeyBytes is idemsvc's longest key.
const maxKeyBytes = 255

// parseKey reads the key header's values: one Structured Field String
// (RFC 8941: "abc", with \" and \\ escapes, printable ASCII), or a bare
// token, accepted as the same key for compatibility. An empty key, a
// malformed string, several values and an over-long key are refused.
func parseKey(values []string) (string, bool) {
	if len(values) != 1 {
		return "", false
	}
	v := strings.TrimSpace(values[0])
	if !strings.HasPrefix(v, `"`) {
		return v, v != "" && len(v) <= maxKeyBytes && !strings.ContainsAny(v, "\",\\")
	}
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			if i+1 == len(v) || (v[i+1] != '"' && v[i+1] != '\\') {
				return "", false
			}
			i++
			b.WriteByte(v[i])
		case c == '"':
			key := b.String()
			return key, i == len(v)-1 && key != "" && len(key) <= maxKeyBytes
		case c < 0x20 || c > 0x7e:
			return "", false
		default:
			b.WriteByte(c)
		}
	}
	return "", false // no closing quote
}

func writeBeginError(w http.ResponseWriter, err error) {
	var e *Error
	switch {
	case errors.Is(err, ErrInProgress):
		retry := 1
		if errors.As(err, &e) && e.RetryAfter > 0 {
			retry = int(e.RetryAfter.Seconds())
		}
		writeProblem(w, http.StatusConflict, "in-progress", "a request with this idempotency key is in progress", retry)
	case errors.Is(err, ErrFingerprintMismatch):
		writeProblem(w, http.StatusUnprocessableEntity, "fingerprint-mismatch", "the idempotency key was used for another request", 0)
	case errors.As(err, &e) && (errors.Is(err, ErrRateLimited) || errors.Is(err, ErrQuotaExceeded)):
		// Over this service's limits at idemsvc: the handler did not run.
		writeProblem(w, http.StatusTooManyRequests, e.Kind(), "this service is over its limits at the idempotency service", max(1, int(e.RetryAfter.Seconds())))
	case errors.Is(err, ErrInvalid) && errors.As(err, &e):
		writeProblem(w, http.StatusBadRequest, "invalid-request", "idempotency key: "+e.Problem.Detail, 0)
	case errors.Is(err, ErrUnauthorized), errors.Is(err, ErrForbidden):
		// A misconfigured API key: retrying will not help.
		writeProblem(w, http.StatusInternalServerError, "internal", "the idempotency service refused this service's credentials", 0)
	default:
		// Fail closed: without idemsvc, nothing may run.
		writeProblem(w, http.StatusServiceUnavailable, "store-unavailable", "the idempotency service cannot be reached", 1)
	}
}

// legacyAnswer answers a request whose fingerprint key's record does not
// hold: with the record's stored answer when it holds legacy, the request's
// fingerprint of the SDK's earlier versions, and 422 otherwise. It reads
// the record without acquiring it, so the legacy fingerprint never gets
// into a new record (where it would replay to any caller): a record that
// expired since the begin is not begun again.
func legacyAnswer(ctx context.Context, w http.ResponseWriter, c *Client, key, legacy string) {
	rec, err := c.Status(ctx, key, true)
	if err != nil && !errors.Is(err, ErrNotFound) {
		writeBeginError(w, err)
		return
	}
	if err != nil || rec.Fingerprint == nil || *rec.Fingerprint != legacy {
		writeBeginError(w, ErrFingerprintMismatch)
		return
	}
	var stored StoredResponse
	if rec.Response != nil {
		stored = *rec.Response
	}
	switch {
	case rec.State == StateCompleted:
		writeReplay(ctx, w, c, key, &BeginReplay{Attempt: rec.Attempt, Key: rec.Key, Status: FinishedStateCompleted, Response: stored})
	case rec.State == StateFailed && rec.Retryable != nil && !*rec.Retryable:
		writeReplay(ctx, w, c, key, &BeginReplay{Attempt: rec.Attempt, Key: rec.Key, Status: FinishedStateFailed, Response: stored, Error: rec.Error})
	case rec.State == StateInProgress:
		retry := 1
		if rec.LeaseExpiresAt != nil {
			retry = max(1, int(math.Ceil(time.Until(rec.LeaseExpiresAt.Time).Seconds())))
		}
		writeProblem(w, http.StatusConflict, "in-progress", "a request with this idempotency key is in progress", retry)
	default: // a retryable failure: a new attempt would acquire it
		writeBeginError(w, ErrFingerprintMismatch)
	}
}

// writeReplay answers with a stored response; a body kept by reference
// (BodyRef) is streamed from idemsvc, checked against its SHA-256.
func writeReplay(ctx context.Context, w http.ResponseWriter, c *Client, key string, replay *BeginReplay) {
	if replay.Response.BodyRef != nil {
		writeStreamedReplay(ctx, w, c, key, replay)
		return
	}
	resp, err := replay.Response.Decode()
	if err != nil {
		writeProblem(w, http.StatusInternalServerError, "internal", "the stored response cannot be decoded", 0)
		return
	}
	if replay.Status == FinishedStateFailed && resp.StatusCode == 0 {
		// A failure stored without a response: the operation ran, and its
		// outcome is unknown here.
		w.Header().Set(ReplayedHeader, "true")
		writeProblem(w, http.StatusInternalServerError, "internal", "the first request with this idempotency key failed", 0)
		return
	}
	for name, value := range resp.Headers {
		w.Header().Set(name, value)
	}
	w.Header().Set(ReplayedHeader, "true")
	status := resp.StatusCode
	if status == 0 {
		status = http.StatusOK
	}
	w.WriteHeader(status)
	_, _ = w.Write(resp.Body)
}

func writeProblem(w http.ResponseWriter, status int, kind, detail string, retryAfter int) {
	WriteProblem(w, status, kind, detail, retryAfter)
}

// WriteProblem answers with an RFC 9457 problem detail as idemsvc and the
// middleware write them: type https://idemsvc.dev/problems/<kind>, code
// kind, the kind's title, and Retry-After when retryAfter (seconds) is
// positive. An empty kind is a problem that only its status describes:
// type about:blank, the status's text as title and, in kebab case, as
// code ("bad-gateway").
func WriteProblem(w http.ResponseWriter, status int, kind, detail string, retryAfter int) {
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	}
	p := Problem{Type: "https://idemsvc.dev/problems/" + kind, Code: kind, Title: kinds[kind].title, Status: status, Detail: detail}
	if kind == "" || p.Title == "" {
		p.Type, p.Title = "about:blank", http.StatusText(status)
		if kind == "" {
			p.Code = strings.ToLower(strings.ReplaceAll(p.Title, " ", "-"))
		}
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(p)
}

// recorder captures a handler's response. A body over limit is not held:
// from the write that crosses it, the answer goes to w as it is written,
// and it is stored without its body.
type recorder struct {
	header    http.Header
	status    int
	body      bytes.Buffer
	w         http.ResponseWriter
	limit     int
	streaming bool // the answer is going to w as it is written
	sent      bool // writeTo ran
	// stream, when set, starts storing a body over limit as it is
	// written (MaxStreamedBodyBytes); streamed is that stream.
	stream   func(status int, headers map[string]string) *bodyStream
	streamed *bodyStream
	allowed  []string
	// broken is the first error of a write to the caller.
	broken error
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	// A 1xx (103 Early Hints, say) is informational: the answer follows.
	if r.status == 0 && code >= 200 {
		r.status = code
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	if !r.streaming && r.body.Len()+len(b) > r.limit {
		r.streaming = true
		if r.stream != nil && !retryAgain(r.status) {
			resp := r.stored(r.allowed)
			delete(resp.Headers, BodyOmittedHeader)
			r.streamed = r.stream(resp.StatusCode, resp.Headers)
			r.streamed.write(r.body.Bytes())
		}
		r.writeTo(r.w)
		r.body = bytes.Buffer{}
	}
	if r.streaming {
		if r.streamed != nil {
			r.streamed.write(b)
		}
		n, err := r.w.Write(b)
		if err != nil && r.broken == nil {
			r.broken = err
		}
		return n, err
	}
	return r.body.Write(b)
}

// abortStream ends a stream under way with err: nothing is stored by it.
func (r *recorder) abortStream(err error) {
	if r.streamed != nil {
		r.streamed.pw.CloseWithError(err)
		<-r.streamed.done
	}
}

// stored is the response to store: the status, the allowed headers, the body.
func (r *recorder) stored(allowed []string) Response {
	status := r.status
	if status == 0 {
		status = http.StatusOK
	}
	// The body is not cloned: the recorder is done with it once stored.
	resp := Response{StatusCode: status, Body: r.body.Bytes()}
	for _, name := range allowed {
		// Several fields of one name are one field, their values joined.
		if v := strings.Join(r.header.Values(name), ", "); v != "" {
			if resp.Headers == nil {
				resp.Headers = make(map[string]string)
			}
			resp.Headers[name] = v
		}
	}
	if r.streaming {
		if resp.Headers == nil {
			resp.Headers = make(map[string]string)
		}
		resp.Headers[BodyOmittedHeader] = "true"
	}
	return resp
}

// writeTo sends the captured response to the caller, once.
func (r *recorder) writeTo(w http.ResponseWriter) {
	if r.sent {
		return
	}
	r.sent = true
	for name, values := range r.header {
		w.Header()[name] = values
	}
	status := r.status
	if status == 0 {
		status = http.StatusOK
	}
	w.WriteHeader(status)
	if _, err := w.Write(r.body.Bytes()); err != nil && r.broken == nil {
		r.broken = err
	}
}
