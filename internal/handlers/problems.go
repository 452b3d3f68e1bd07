package handlers

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemsvc/idemsvc/internal/api"
	"github.com/idemsvc/idemsvc/internal/quota"
	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// ProblemBaseURI prefixes every problem type; the last path segment is the
// kind's name.
const ProblemBaseURI = "https://idemsvc.dev/problems/"

// problemKind is one kind of error the API answers with.
type problemKind struct {
	name   string
	status int
	title  string
}

// The kinds of problem, one per contract error.
var (
	kindInvalid          = problemKind{"invalid-request", http.StatusBadRequest, "Invalid request"}
	kindUnauthorized     = problemKind{"unauthorized", http.StatusUnauthorized, "Unauthorized"}
	kindForbidden        = problemKind{"forbidden", http.StatusForbidden, "Forbidden"}
	kindNotFound         = problemKind{"not-found", http.StatusNotFound, "Not found"}
	kindMethod           = problemKind{"method-not-allowed", http.StatusMethodNotAllowed, "Method not allowed"}
	kindMediaType        = problemKind{"unsupported-media-type", http.StatusUnsupportedMediaType, "Unsupported media type"}
	kindTooLarge         = problemKind{"too-large", http.StatusRequestEntityTooLarge, "Too large"}
	kindInProgress       = problemKind{"in-progress", http.StatusConflict, "In progress"}
	kindLeaseLost        = problemKind{"lease-lost", http.StatusConflict, "Lease lost"}
	kindFingerprint      = problemKind{"fingerprint-mismatch", http.StatusUnprocessableEntity, "Fingerprint mismatch"}
	kindRateLimited      = problemKind{"rate-limited", http.StatusTooManyRequests, "Rate limited"}
	kindQuotaExceeded    = problemKind{"quota-exceeded", http.StatusTooManyRequests, "Quota exceeded"}
	kindStoreUnavailable = problemKind{"store-unavailable", http.StatusServiceUnavailable, "Store unavailable"}
	kindInternal         = problemKind{"internal", http.StatusInternalServerError, "Internal error"}
)

// errorKinds maps the errors of the store and of request decoding to their
// problem kinds: the one table from Go errors to HTTP answers. The first
// entry the error matches wins.
var errorKinds = []struct {
	err  error
	kind problemKind
}{
	{statemachine.ErrInvalid, kindInvalid},
	{api.ErrBadRequest, kindInvalid},
	{errUnauthorized, kindUnauthorized},
	{errForbidden, kindForbidden},
	{statemachine.ErrNotFound, kindNotFound},
	{errNoRoute, kindNotFound},
	{errNoTenant, kindNotFound},
	{errMethod, kindMethod},
	{errMediaType, kindMediaType},
	{statemachine.ErrTooLarge, kindTooLarge},
	{errTooLargeBody, kindTooLarge},
	{statemachine.ErrInProgress, kindInProgress},
	{statemachine.ErrLeaseLost, kindLeaseLost},
	{statemachine.ErrFingerprintMismatch, kindFingerprint},
	{quota.ErrRateLimited, kindRateLimited},
	{quota.ErrQuotaExceeded, kindQuotaExceeded},
	{statemachine.ErrStoreUnavailable, kindStoreUnavailable},
}

// Errors of the HTTP layer; each has its row in errorKinds.
var (
	errUnauthorized = errors.New("a valid API key is required")
	errForbidden    = errors.New("forbidden")
	errNoRoute      = errors.New("no such path")
	errNoTenant     = errors.New("no such tenant")
	errMethod       = errors.New("the path does not take this method")
	errMediaType    = errors.New("the request body must be application/json")
	errTooLargeBody = errors.New("too large")
)

// badField is a bad request naming the request field at fault, as the
// strict decoder reports one.
func badField(field, format string, args ...any) error {
	return &api.FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// kindOf finds err's problem kind; anything unknown is internal.
func kindOf(err error) problemKind {
	for _, row := range errorKinds {
		if errors.Is(err, row.err) {
			return row.kind
		}
	}
	return kindInternal
}

// storeRetryAfter is the Retry-After of a 503: the store is usually back,
// or a replica promoted, within a second or two.
const storeRetryAfter = "1"

// writeProblem answers err as an RFC 9457 problem detail.
func writeProblem(w http.ResponseWriter, r *http.Request, err error) {
	kind := kindOf(err)
	p := api.Problem{
		Type:   ProblemBaseURI + kind.name,
		Title:  kind.title,
		Status: kind.status,
		Detail: detail(kind, err),
	}
	h := w.Header()
	var field *api.FieldError
	var invalid *statemachine.InvalidError
	var inProgress *statemachine.InProgressError
	var limit *quota.Error
	switch {
	case errors.As(err, &limit):
		h.Set("Retry-After", limitRetryAfter(limit))
	case errors.As(err, &field) && field.Field != "":
		p.Field = &field.Field
	case errors.As(err, &invalid):
		p.Field = &invalid.Field
	case errors.As(err, &inProgress):
		p.Attempt = &inProgress.Attempt
		expires := api.NewMilliTime(inProgress.LeaseExpiresAt)
		p.LeaseExpiresAt = &expires
		h.Set("Retry-After", wholeSeconds(inProgress.RetryIn()))
	}
	switch kind {
	case kindUnauthorized:
		h.Set("WWW-Authenticate", `Bearer realm="idemsvc"`)
	case kindStoreUnavailable:
		h.Set("Retry-After", storeRetryAfter)
	}
	if info := infoFrom(r.Context()); info != nil {
		info.outcome = kind.name
		info.err = err
	}
	h.Set("Content-Type", "application/problem+json")
	w.WriteHeader(kind.status)
	_ = json.NewEncoder(w).Encode(p) // the client went away; nothing else to do
}

// detail explains err without internals: a 500 or 503 says what happened,
// not which connection failed how.
func detail(kind problemKind, err error) string {
	var field *api.FieldError
	var invalid *statemachine.InvalidError
	var inProgress *statemachine.InProgressError
	var limit *quota.Error
	switch {
	case kind == kindInternal:
		return "an unexpected error; it has been logged"
	case kind == kindStoreUnavailable:
		return "the store cannot be reached or did not answer in time; the call may or may not have taken effect, and a retry with the same owner or lease token is safe"
	case errors.As(err, &limit):
		return limit.Detail
	case errors.As(err, &field):
		return field.Error()
	case errors.As(err, &invalid):
		return invalid.Field + ": " + invalid.Reason
	case errors.As(err, &inProgress):
		return fmt.Sprintf("attempt %d holds the lease until %s", inProgress.Attempt,
			inProgress.LeaseExpiresAt.UTC().Format("2006-01-02T15:04:05.000Z"))
	case kind == kindTooLarge:
		return afterKind(err.Error(), "too large: ")
	case kind == kindNotFound && errors.Is(err, statemachine.ErrNotFound):
		return "no record for this key: it never existed, expired or was deleted"
	case kind == kindLeaseLost:
		return "the lease token is not the current attempt's: the lease was taken over or the attempt finished another way"
	case kind == kindFingerprint:
		return "the key was used with a different fingerprint"
	}
	return err.Error()
}

// afterKind is the part of an error message after its kind's name, which
// the problem's title already says, and after the layers' prefixes.
func afterKind(msg, kind string) string {
	if i := strings.Index(msg, kind); i >= 0 {
		return msg[i+len(kind):]
	}
	return msg
}

// wholeSeconds is d in whole seconds, rounded up, at least 1.
func wholeSeconds(d time.Duration) string {
	s := math.Ceil(d.Seconds())
	if s < 1 {
		s = 1
	}
	return strconv.FormatInt(int64(s), 10)
}

// ConnectionProblem is the complete HTTP/1.1 answer, a problem detail, to
// a request that net/http refused before any handler could see it: a
// malformed request (400), headers over the limit (431), an unknown
// transfer coding (501). detail is net/http's own fixed text. The
// connection is closed after it.
func ConnectionProblem(status int, detail string) []byte {
	kind := kindInvalid
	if status == http.StatusRequestHeaderFieldsTooLarge {
		kind = kindTooLarge
	}
	body, _ := json.Marshal(api.Problem{Type: ProblemBaseURI + kind.name, Title: kind.title, Status: status, Detail: detail})
	return fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nCache-Control: no-store\r\nConnection: close\r\n"+
		"Content-Length: %d\r\nContent-Type: application/problem+json\r\n\r\n%s", status, http.StatusText(status), len(body), body)
}
