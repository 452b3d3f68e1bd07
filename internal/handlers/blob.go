// SPDX-License-Identifier: Apache-2.0

package handlers

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemsvc/idemsvc/internal/api"
	"github.com/idemsvc/idemsvc/internal/blob"
	"github.com/idemsvc/idemsvc/internal/httpserve"
	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// Defaults of the large responses (Config.Blob).
const (
	DefaultBlobThreshold  = 64 << 10
	DefaultMaxStoredBytes = 64 << 20
)

// BlobConfig is the blob store of large responses.
type BlobConfig struct {
	Store *blob.Store
	// Threshold is the body size over which a stored body goes to Store
	// rather than into its record (0: DefaultBlobThreshold; negative:
	// every non-empty body).
	Threshold int64
	// MaxStoredBytes bounds a body stored by POST /v1/complete/stream
	// (default DefaultMaxStoredBytes).
	MaxStoredBytes int64
	// SpoolDir holds a streamed body while it arrives, before its upload
	// (default os.TempDir()).
	SpoolDir string
}

// errBlobConflict is a retried complete of an attempt whose object holds
// another body.
var errBlobConflict = errors.New("handlers: another body under the attempt's object")

// blobs is the Service's part for large responses; nil without a store.
type blobs struct {
	BlobConfig
	// bad holds the objects found not to match their SHA-256 by this
	// instance: the next replay of one checks it whole before it streams
	// a byte, and answers 503 until the object is sound.
	mu  sync.Mutex
	bad map[string]struct{}

	unavailable *prometheus.CounterVec
	deleted     prometheus.Counter
}

// maxBad bounds the objects remembered as bad; past it the set starts
// over (a forgotten bad object is cut off again at its end, never
// delivered whole).
const maxBad = 10000

func newBlobs(cfg *BlobConfig, reg prometheus.Registerer) *blobs {
	if cfg == nil || cfg.Store == nil {
		return nil
	}
	b := &blobs{BlobConfig: *cfg, bad: make(map[string]struct{})}
	switch {
	case b.Threshold == 0:
		b.Threshold = DefaultBlobThreshold
	case b.Threshold < 0:
		b.Threshold = 0
	}
	if b.MaxStoredBytes <= 0 {
		b.MaxStoredBytes = DefaultMaxStoredBytes
	}
	if b.SpoolDir == "" {
		b.SpoolDir = os.TempDir()
	}
	b.unavailable = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idemsvc_blob_unavailable_total",
		Help: "Stored bodies of the blob store that could not be served or stored, by reason: missing, corrupt (not matching their SHA-256) or unreachable.",
	}, []string{"reason"})
	for _, r := range []string{"missing", "corrupt", "unreachable"} {
		b.unavailable.WithLabelValues(r)
	}
	b.deleted = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "idemsvc_blob_deleted_total",
		Help: "Objects of the blob store deleted at once: of refused completes and deleted records.",
	})
	reg.MustRegister(b.unavailable, b.deleted)
	return b
}

// count counts a blob error by its reason.
func (b *blobs) count(err error) {
	switch {
	case errors.Is(err, blob.ErrMissing):
		b.unavailable.WithLabelValues("missing").Inc()
	case errors.Is(err, blob.ErrCorrupt):
		b.unavailable.WithLabelValues("corrupt").Inc()
	case errors.Is(err, blob.ErrUnavailable):
		b.unavailable.WithLabelValues("unreachable").Inc()
	}
}

func (b *blobs) markBad(object string, bad bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !bad {
		delete(b.bad, object)
		return
	}
	if len(b.bad) >= maxBad {
		clear(b.bad)
	}
	b.bad[object] = struct{}{}
}

func (b *blobs) isBad(object string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.bad[object]
	return ok
}

// deleteSoon deletes an object the record does not name, detached from
// the request that found it so (whose caller may be gone).
func (b *blobs) deleteSoon(object string) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if b.Store.Delete(ctx, object) == nil {
			b.deleted.Inc()
		}
	}()
}

// deleteAttempts deletes, in the background, the objects of key's
// attempts other than keep's written before now: after a takeover (keep
// is the new lease's token), or a delete of a record in progress (keep is
// ""). Objects written since (by a later attempt) are left alone.
func (b *blobs) deleteAttempts(tenant, key, keep string) {
	before := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		n, _ := b.Store.DeleteAttempts(ctx, tenant, key, keep, before)
		b.deleted.Add(float64(n))
	}()
}

// streamBuffer is the buffer a streamed body passes through, taken from
// the body budget while held.
const streamBuffer = 32 << 10

// CompleteStream stores the attempt's response, its body the request's
// own stream: into the blob store first when it is over the threshold,
// then the complete.
func (s *Service) CompleteStream(ctx context.Context, req api.CompleteStreamRequestObject) (api.CompleteStreamResponseObject, error) {
	p := req.Params
	t, err := tenant(ctx, p.IdemTenant)
	if err != nil {
		return nil, err
	}
	resp, err := streamedResponse(p.IdemResponseStatus, p.IdemResponseHeaders)
	if err != nil {
		return nil, err
	}
	retention, err := s.bounds.Retention(p.IdemRetentionS)
	if err != nil {
		return nil, err
	}
	creq := statemachine.CompleteRequest{Key: p.IdemKey, Token: p.IdemLeaseToken, Response: resp, Retention: retention}
	claim := httpserve.Claim{Tenant: t, Finish: true}
	if s.blobs == nil {
		// Without a blob store the body goes into the record: read under
		// the body budget, within the stored-response limit.
		limit := int64(s.bounds.MaxResponseBytes)
		body, taken, err := s.bodies.ReadBody(ctx, io.LimitReader(req.Body, limit+1), -1, limit, claim)
		defer s.bodies.Give(taken, claim)
		if err != nil {
			return nil, streamReadError(err)
		}
		if int64(len(body)) > limit {
			return nil, bodyTooLarge(limit)
		}
		setBody(&creq.Response, body)
		return s.completeWith(ctx, t, &creq)
	}
	rec, err := s.store.Status(ctx, t, creq.Key, false)
	if err != nil {
		return nil, err
	}
	if rec.State != statemachine.StateInProgress {
		// Finished: a retried complete answers as the store does (the
		// same result for the same token, lease-lost otherwise), and its
		// body is not needed.
		return s.completeWith(ctx, t, &creq)
	}
	if err := s.bodies.TakeBytes(ctx, 2*streamBuffer, claim); err != nil {
		return nil, err
	}
	defer s.bodies.GiveBytes(2*streamBuffer, claim)
	sp, err := s.blobs.spool(req.Body)
	if sp != nil {
		defer sp.close()
	}
	if err != nil {
		return nil, err
	}
	if sp.size <= s.blobs.Threshold {
		body := make([]byte, sp.size)
		if _, err := sp.f.ReadAt(body, 0); err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("handlers: read a spooled body: %w", err)
		}
		setBody(&creq.Response, body)
		return s.completeWith(ctx, t, &creq)
	}
	if s.mayKeep(&creq.Response, sp.size) {
		// Compressed from the spool through one buffer: kept in the
		// record, compressed, if that is within the threshold.
		if err := s.bodies.TakeBytes(ctx, compressorBytes+s.blobs.Threshold, claim); err != nil {
			return nil, err
		}
		kept, err := s.keepCompressed(&creq.Response, sp.size, func(c *statemachine.Compressor) (bool, error) {
			return sp.compress(c)
		})
		s.bodies.GiveBytes(compressorBytes+s.blobs.Threshold, claim)
		if err != nil {
			return nil, err
		}
		if kept {
			return s.completeWith(ctx, t, &creq)
		}
	}
	if creq.Retention == 0 {
		creq.Retention = rec.Retention
	}
	return s.complete(ctx, t, &creq, io.NewSectionReader(sp.f, 0, sp.size), sp.size, sp.sum)
}

// compressorBytes is the memory a Compressor holds besides its frame,
// counted in the body budget while it runs.
const compressorBytes = 512 << 10

// mayKeep reports whether a body of size bytes for r, over the blob
// threshold, may still stay in the record: it fits the record's limit, and
// the record would compress it.
func (s *Service) mayKeep(r *statemachine.Response, size int64) bool {
	total := size
	for name, value := range r.Headers {
		total += int64(len(name) + len(value))
	}
	return total <= int64(s.bounds.MaxResponseBytes) && size >= int64(s.bounds.CompressBodiesFrom)
}

// keepCompressed compresses a body of size bytes (write gives it to the
// Compressor, and says whether it is UTF-8 text) into at most the blob
// threshold: within it, r keeps the frame (Response.Zstd), and the body
// stays in the record, compressed; past it, false, and the body goes to
// the blob store. The threshold compares the body's compressed size, as
// the record would keep it, not its size as sent.
func (s *Service) keepCompressed(r *statemachine.Response, size int64, write func(*statemachine.Compressor) (text bool, err error)) (bool, error) {
	c := statemachine.NewCompressor(size, int(s.blobs.Threshold))
	defer c.Close()
	text, err := write(c)
	if err != nil {
		return false, err
	}
	frame, ok := c.Frame()
	if !ok {
		return false, nil
	}
	r.Zstd, r.ZstdSize = frame, size
	if r.Body == "" {
		r.Base64 = !text
	}
	return true, nil
}

// keepJSON decides where a body sent in JSON goes: true when it stays in
// the record (compressed once here, the frame in r.Zstd, when it is over
// the threshold as sent), false when it goes to the blob store.
func (s *Service) keepJSON(r *statemachine.Response) bool {
	size := int64(len(r.Body))
	if s.blobs == nil || size <= s.blobs.Threshold {
		return true
	}
	if !s.mayKeep(r, size) {
		return false
	}
	kept, _ := s.keepCompressed(r, size, func(c *statemachine.Compressor) (bool, error) {
		_, _ = c.WriteString(r.Body) // an error is the frame past the threshold: Frame says so
		return true, nil
	})
	return kept
}

// upload writes a body to the blob store under the attempt's object and
// makes r name it; then finish stores the transition that names it. A
// refused transition deletes the object.
func (s *Service) upload(ctx context.Context, t, key, token string, retention time.Duration, r *statemachine.Response,
	body io.ReadSeeker, size int64, sum [32]byte, finish func() (statemachine.Record, error)) (statemachine.Record, error) {
	ref := &statemachine.BodyRef{
		Object: s.blobs.Store.ObjectKey(t, key, blob.ExpiryDay(time.Now(), retention), token),
		Size:   size,
		SHA256: sum,
	}
	if err := s.blobs.Store.Put(ctx, ref.Object, body, size, sum); err != nil {
		s.blobs.count(err)
		if errors.Is(err, blob.ErrExists) {
			return statemachine.Record{}, errBlobConflict
		}
		if errors.Is(err, blob.ErrCorrupt) { // the bytes changed on their way: not the caller's fault
			return statemachine.Record{}, fmt.Errorf("handlers: upload: %w", errors.Join(blob.ErrUnavailable, err))
		}
		return statemachine.Record{}, err
	}
	r.Body, r.Base64, r.Ref, r.Zstd, r.ZstdSize = "", false, ref, "", 0
	rec, err := finish()
	if err != nil && !errors.Is(err, statemachine.ErrStoreUnavailable) {
		// Refused (fenced, lease lost, gone, invalid): no record names
		// the object. (An unknown outcome keeps it: the transition may
		// have been stored.)
		s.blobs.deleteSoon(ref.Object)
	}
	return rec, err
}

// complete uploads a complete's body, then stores the complete.
func (s *Service) complete(ctx context.Context, t string, creq *statemachine.CompleteRequest, body io.ReadSeeker, size int64, sum [32]byte) (api.FinishResponse, error) {
	rec, err := s.upload(ctx, t, creq.Key, creq.Token, creq.Retention, &creq.Response, body, size, sum, func() (statemachine.Record, error) {
		return s.store.Complete(ctx, t, *creq)
	})
	if err != nil {
		return api.FinishResponse{}, err
	}
	return s.completed(ctx, t, creq, &rec), nil
}

// retention is the retention of the attempt in progress of key, for the
// expiry day of its object; ok false, with the record, when it is not in
// progress (a retried call, answered as the store answers it).
func (s *Service) retention(ctx context.Context, t, key string) (time.Duration, bool, error) {
	rec, err := s.store.Status(ctx, t, key, false)
	if err != nil {
		return 0, false, err
	}
	return rec.Retention, rec.State == statemachine.StateInProgress, nil
}

// completeByRef stores a JSON complete whose body goes to the blob store:
// its body there first, then the complete.
func (s *Service) completeByRef(ctx context.Context, t string, creq *statemachine.CompleteRequest) (api.CompleteResponseObject, error) {
	if creq.Retention == 0 {
		retention, inProgress, err := s.retention(ctx, t, creq.Key)
		if err != nil {
			return nil, err
		}
		if !inProgress {
			return s.completeWith(ctx, t, creq) // answered as a retried complete is
		}
		creq.Retention = retention
	}
	body := creq.Response.Body
	return s.complete(ctx, t, creq, strings.NewReader(body), int64(len(body)), sha256.Sum256([]byte(body)))
}

// failByRef stores a terminal fail whose response's body goes to the blob
// store, as completeByRef does a complete's.
func (s *Service) failByRef(ctx context.Context, t string, freq *statemachine.FailRequest) (api.FailResponseObject, error) {
	retention := freq.Retention
	if retention == 0 {
		r, inProgress, err := s.retention(ctx, t, freq.Key)
		if err != nil {
			return nil, err
		}
		if !inProgress {
			rec, err := s.store.Fail(ctx, t, *freq) // answered as a retried fail is
			if err != nil {
				return nil, err
			}
			return s.failed(ctx, t, freq, &rec), nil
		}
		retention = r
	}
	body := freq.Response.Body
	rec, err := s.upload(ctx, t, freq.Key, freq.Token, retention, &freq.Response, strings.NewReader(body), int64(len(body)), sha256.Sum256([]byte(body)),
		func() (statemachine.Record, error) { return s.store.Fail(ctx, t, *freq) })
	if err != nil {
		return nil, err
	}
	return s.failed(ctx, t, freq, &rec), nil
}

// completeWith stores a complete and answers it.
func (s *Service) completeWith(ctx context.Context, t string, creq *statemachine.CompleteRequest) (api.FinishResponse, error) {
	rec, err := s.store.Complete(ctx, t, *creq)
	if err != nil {
		return api.FinishResponse{}, err
	}
	return s.completed(ctx, t, creq, &rec), nil
}

// streamReadError is the error of a streamed body that could not be read.
func streamReadError(err error) error {
	if errors.Is(err, httpserve.ErrOverBudget) {
		return err
	}
	return badField("", "could not be read in full (the connection stalled or broke)")
}

// setBody makes body the response's, base64 in JSON replays unless it is
// UTF-8 text.
func setBody(r *statemachine.Response, body []byte) {
	r.Body = string(body)
	r.Base64 = !utf8.Valid(body)
}

// streamedResponse is the response a streamed complete's headers describe,
// without its body.
func streamedResponse(status *int, headers *string) (statemachine.Response, error) {
	var r statemachine.Response
	if status != nil {
		if *status < 100 || *status > 599 {
			return r, badField("Idem-Response-Status", "must be 100 to 599")
		}
		r.StatusCode = *status
	}
	if headers != nil && *headers != "" {
		if err := json.Unmarshal([]byte(*headers), &r.Headers); err != nil {
			return r, badField("Idem-Response-Headers", "must be a JSON object of header names to string values")
		}
	}
	return r, nil
}

// spooled is a streamed body written to a temporary file as it arrived,
// with its size and SHA-256.
type spooled struct {
	f    *os.File
	size int64
	sum  [32]byte
}

func (sp *spooled) close() {
	sp.f.Close()
	os.Remove(sp.f.Name())
}

// spool writes body to a temporary file through one buffer, up to
// MaxStoredBytes (413 beyond).
func (b *blobs) spool(body io.Reader) (*spooled, error) {
	f, err := os.CreateTemp(b.SpoolDir, "idemsvc-body-")
	if err != nil {
		return nil, fmt.Errorf("handlers: spool a body: %w", err)
	}
	sp := &spooled{f: f}
	h := sha256.New()
	buf := make([]byte, streamBuffer)
	n, err := io.CopyBuffer(io.MultiWriter(f, h), io.LimitReader(body, b.MaxStoredBytes+1), buf)
	if err != nil {
		var wErr *os.PathError
		if errors.As(err, &wErr) {
			return sp, fmt.Errorf("handlers: spool a body: %w", err)
		}
		return sp, streamReadError(err)
	}
	if n > b.MaxStoredBytes {
		return sp, bodyTooLarge(b.MaxStoredBytes)
	}
	sp.size = n
	h.Sum(sp.sum[:0])
	return sp, nil
}

// compress writes the spooled body to c through one buffer, and reports
// whether it is UTF-8 text. A body whose frame passes c's limit stops
// there (false, nil from keepCompressed's Frame).
func (sp *spooled) compress(c *statemachine.Compressor) (text bool, err error) {
	buf := make([]byte, streamBuffer)
	text, carry := true, 0
	for at := int64(0); at < sp.size; {
		n, err := sp.f.ReadAt(buf[carry:], at)
		if err != nil && !errors.Is(err, io.EOF) {
			return false, fmt.Errorf("handlers: read a spooled body: %w", err)
		}
		if n == 0 {
			return false, fmt.Errorf("handlers: read a spooled body: %w", io.ErrUnexpectedEOF)
		}
		at += int64(n)
		if _, werr := c.Write(buf[carry : carry+n]); werr != nil {
			return text, nil // past the limit
		}
		n += carry
		cut := n
		if at < sp.size { // a UTF-8 sequence cut at the buffer's end is checked whole next time
			cut = completeRunes(buf[:n])
		}
		text = text && utf8.Valid(buf[:cut])
		carry = copy(buf, buf[cut:n])
	}
	return text, nil
}

// completeRunes is the length of the prefix of b that ends with a whole
// UTF-8 sequence (or an invalid byte), at least len(b)-3.
func completeRunes(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if utf8.FullRune(b[i:]) {
				return len(b)
			}
			return i
		}
	}
	return len(b)
}

// bodyRef is how a replay names a body kept in the blob store.
func bodyRef(ref *statemachine.BodyRef, key, tenant string) *api.BodyRef {
	u := "/v1/keys/body?key=" + url.QueryEscape(key)
	if tenant != "" {
		u += "&tenant=" + url.QueryEscape(tenant)
	}
	return &api.BodyRef{SizeBytes: ref.Size, Sha256: hex.EncodeToString(ref.SHA256[:]), Url: u}
}

// resolve makes a replayed response with a body in the blob store fit a
// JSON answer: a body within the stored-response limit is fetched, checked
// whole and put inline, as it would have been stored without a blob
// store; a larger one is named by reference (out.BodyRef).
func (s *Service) resolve(ctx context.Context, r *statemachine.Response) error {
	if r.Ref == nil || s.blobs == nil || r.Ref.Size > int64(s.bounds.MaxResponseBytes) {
		return nil
	}
	size := r.Ref.Size
	if err := s.bodies.TakeBytes(ctx, size, httpserve.Claim{Finish: true}); err != nil {
		return err
	}
	defer s.bodies.GiveBytes(size, httpserve.Claim{Finish: true})
	rc, err := s.openBody(ctx, r.Ref)
	if err != nil {
		return err
	}
	defer rc.Close()
	body := make([]byte, size)
	if _, err := io.ReadFull(rc, body); err != nil {
		return s.bodyFailed(r.Ref, err)
	}
	if _, err := rc.Read(make([]byte, 1)); err != io.EOF { // the check at the end
		return s.bodyFailed(r.Ref, err)
	}
	setBody(r, body)
	r.Ref = nil
	return nil
}

// openBody opens a stored object; a known-bad one is first read whole and
// checked, so that it is served again only once it is sound.
func (s *Service) openBody(ctx context.Context, ref *statemachine.BodyRef) (io.ReadCloser, error) {
	if s.blobs.isBad(ref.Object) {
		rc, err := s.blobs.Store.Get(ctx, ref.Object, ref.Size, ref.SHA256)
		if err != nil {
			return nil, s.bodyFailed(ref, err)
		}
		_, err = io.CopyBuffer(io.Discard, rc, make([]byte, streamBuffer))
		rc.Close()
		if err != nil {
			return nil, s.bodyFailed(ref, err)
		}
		s.blobs.markBad(ref.Object, false)
	}
	rc, err := s.blobs.Store.Get(ctx, ref.Object, ref.Size, ref.SHA256)
	if err != nil {
		return nil, s.bodyFailed(ref, err)
	}
	return rc, nil
}

// bodyFailed counts a stored body that could not be read, remembers a bad
// one, and returns err as a blob error.
func (s *Service) bodyFailed(ref *statemachine.BodyRef, err error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		err = fmt.Errorf("handlers: %w", errors.Join(blob.ErrCorrupt, err))
	}
	if !errors.Is(err, blob.ErrMissing) && !errors.Is(err, blob.ErrCorrupt) && !errors.Is(err, blob.ErrUnavailable) {
		err = fmt.Errorf("handlers: %w", errors.Join(blob.ErrUnavailable, err))
	}
	s.blobs.count(err)
	if errors.Is(err, blob.ErrCorrupt) {
		s.blobs.markBad(ref.Object, true)
	}
	return err
}

// GetBody streams a finished record's stored body.
func (s *Service) GetBody(ctx context.Context, req api.GetBodyRequestObject) (api.GetBodyResponseObject, error) {
	p := req.Params
	t, err := tenant(ctx, p.Tenant)
	if err != nil {
		return nil, err
	}
	if s.quota != nil { // a read, counted as a replay is
		if lim := s.keyring.Quota(t); !s.quota.CanRead(t, lim) {
			return nil, s.quota.ReadRefused(t, lim)
		}
	}
	rec, err := s.store.Status(statemachine.WithStreamedBodies(ctx), t, p.Key, true)
	if err != nil {
		return nil, err
	}
	if rec.State == statemachine.StateInProgress {
		return nil, fmt.Errorf("handlers: body of a record in progress: %w", statemachine.ErrNotFound)
	}
	r := &rec.Response
	if body := s.streamed(r); body != nil {
		// Kept compressed: decoded twice, through one buffer each time,
		// once for the SHA-256 its header gives, then as it is written.
		s.bodies.Hold(streamedBodyBytes)
		sum, err := body.sum()
		s.bodies.GiveBytes(streamedBodyBytes, httpserve.Claim{})
		if err != nil {
			return nil, err
		}
		setOutcome(ctx, t, "found")
		if s.quota != nil {
			s.quota.Read(t, s.keyring.Quota(t), r.ZstdSize)
		}
		return bodyAnswer{s: s, size: r.ZstdSize, sum: sum, body: r.OpenBody(), held: streamedBodyBytes}, nil
	}
	setOutcome(ctx, t, "found")
	if r.Ref == nil || s.blobs == nil {
		if s.quota != nil {
			s.quota.Read(t, s.keyring.Quota(t), int64(len(r.Body)))
		}
		sum := sha256.Sum256([]byte(r.Body))
		return bodyAnswer{s: s, size: int64(len(r.Body)), sum: sum, inline: r.Body}, nil
	}
	if s.quota != nil {
		s.quota.Read(t, s.keyring.Quota(t), r.Ref.Size)
	}
	rc, err := s.openBody(ctx, r.Ref)
	if err != nil {
		return nil, err
	}
	return bodyAnswer{s: s, size: r.Ref.Size, sum: r.Ref.SHA256, ref: r.Ref, body: rc}, nil
}

// sum decodes the body through one buffer and returns its SHA-256.
func (b *streamedBody) sum() ([32]byte, error) {
	var sum [32]byte
	rc := b.resp.OpenBody()
	defer rc.Close()
	h := sha256.New()
	if _, err := io.CopyBuffer(h, rc, make([]byte, streamBuffer)); err != nil {
		return sum, fmt.Errorf("handlers: a stored body: %w", err)
	}
	h.Sum(sum[:0])
	return sum, nil
}

// bodyAnswer writes a stored body: inline, or streamed from the blob
// store through one buffer, cut off before its end if it fails its check.
type bodyAnswer struct {
	s      *Service
	size   int64
	sum    [32]byte
	inline string
	ref    *statemachine.BodyRef // of a body in the blob store
	body   io.ReadCloser
	held   int64 // the memory body holds besides the buffer, counted in the body budget
}

func (a bodyAnswer) VisitGetBodyResponse(w http.ResponseWriter) error {
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", fmt.Sprint(a.size))
	h.Set("Repr-Digest", "sha-256=:"+base64.StdEncoding.EncodeToString(a.sum[:])+":")
	h.Set("Cache-Control", "no-store")
	if a.size >= largeAnswer {
		setWriteDeadline(w, a.s.writeDeadlineBase+time.Duration(float64(a.size)/float64(a.s.minClientRate)*float64(time.Second)))
	}
	if a.body == nil {
		w.WriteHeader(http.StatusOK)
		_, err := io.WriteString(w, a.inline)
		return err
	}
	defer a.body.Close()
	// The buffer is memory the answer holds: counted in the body budget,
	// so that many slow readers make new bodies wait, not memory grow.
	a.s.bodies.Hold(streamBuffer + a.held)
	defer a.s.bodies.GiveBytes(streamBuffer+a.held, httpserve.Claim{})
	w.WriteHeader(http.StatusOK)
	buf := make([]byte, streamBuffer)
	for {
		n, err := a.body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return nil // the client left
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			if a.ref != nil {
				a.s.bodyFailed(a.ref, err)
			} else {
				a.s.log.Error("a stored body failed to decode as it was sent; the answer was cut off", "error", err)
			}
			// Cut the answer off short of its Content-Length: the client
			// sees a broken answer, never a whole wrong one.
			panic(http.ErrAbortHandler)
		}
	}
}

// deleteObjects deletes the objects of a deleted record: the one its
// response named, or those its attempts in progress may have written.
func (s *Service) deleteObjects(t string, rec *statemachine.Record) {
	switch {
	case s.blobs == nil || rec == nil:
	case rec.Response.Ref != nil:
		s.blobs.deleteSoon(rec.Response.Ref.Object)
	case rec.State == statemachine.StateInProgress:
		s.blobs.deleteAttempts(t, rec.Key, "")
	}
}

// completeStreamPath takes a body that is a stream of raw bytes.
const completeStreamPath = "/v1/complete/stream"

// streamBody lets a streamed complete's body through, unread: the handler
// streams it under its own bounds. It must be application/octet-stream,
// and it gets the time to arrive at the clients' minimum rate.
func (s *Service) streamBody(next http.Handler, w http.ResponseWriter, r *http.Request) {
	if ct := headerValue(r.Header, "Content-Type"); ct != "application/octet-stream" {
		writeProblem(w, r, errMediaType)
		return
	}
	limit := int64(s.bounds.MaxResponseBytes)
	if s.blobs != nil {
		limit = s.blobs.MaxStoredBytes
	}
	if r.ContentLength > limit {
		writeProblem(w, r, bodyTooLarge(limit))
		return
	}
	size := r.ContentLength
	if size < 0 {
		size = limit
	}
	d := s.writeDeadlineBase + time.Duration(float64(size)/float64(s.minClientRate)*float64(time.Second))
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(d))
	_ = rc.SetWriteDeadline(time.Now().Add(2 * d)) // the upload, then the answer
	next.ServeHTTP(w, r)
}
