// SPDX-License-Identifier: Apache-2.0

package handlers

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemsvc/idemsvc/internal/api"
	"github.com/idemsvc/idemsvc/internal/blob"
	"github.com/idemsvc/idemsvc/internal/httpserve"
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
	kindBlobUnavailable  = problemKind{"blob-unavailable", http.StatusServiceUnavailable, "Blob unavailable"}
	kindInternal         = problemKind{"internal", http.StatusInternalServerError, "Internal error"}
)

// errorKinds maps the errors of the store, the limits and the HTTP layer to
// their problem kinds and fixed details: the one table from Go errors to
// HTTP answers. The first row the error matches wins. An error that says
// more than its row (which field, which limit, which attempt) has a
// Detail method, and its detail wins.
var errorKinds = []struct {
	err    error
	kind   problemKind
	detail string
}{
	{statemachine.ErrInvalid, kindInvalid, "the request does not fit the API"},
	{errUnauthorized, kindUnauthorized, "a valid API key is required"},
	{errForbidden, kindForbidden, "this API key acts for its own tenant only"},
	{statemachine.ErrNotFound, kindNotFound, "no record for this key: it never existed, expired or was deleted"},
	{errNoRoute, kindNotFound, "no such path"},
	{errNoTenant, kindNotFound, "no such tenant"},
	{errMethod, kindMethod, "the path does not take this method"},
	{errMediaType, kindMediaType, "the request body must be application/json"},
	{statemachine.ErrTooLarge, kindTooLarge, "too large"},
	{statemachine.ErrInProgress, kindInProgress, "another attempt holds the lease"},
	{statemachine.ErrLeaseLost, kindLeaseLost, "the lease token is not the current attempt's: the lease was taken over or the attempt finished another way"},
	{statemachine.ErrFingerprintMismatch, kindFingerprint, "the key was used with a different fingerprint"},
	{quota.ErrRateLimited, kindRateLimited, "over the tenant's begin rate"},
	{quota.ErrQuotaExceeded, kindQuotaExceeded, "over the tenant's quota"},
	{statemachine.ErrNoRoom, kindStoreUnavailable, "the store keeps its remaining memory for the outcomes of operations already running, so no new operation starts now; this call changed nothing: retry after Retry-After"},
	{statemachine.ErrEvicting, kindStoreUnavailable, "the store may drop records under memory pressure, so no new operation starts now; this call changed nothing: retry after Retry-After"},
	{statemachine.ErrOverloaded, kindStoreUnavailable, "idemsvc has as many calls to its store in flight as it allows; this call did not take effect: retry after Retry-After"},
	{httpserve.ErrOverBudget, kindStoreUnavailable, "idemsvc holds as many request bodies as its memory budget allows; this call did not take effect: retry after Retry-After"},
	{blob.ErrMissing, kindBlobUnavailable, "the stored body is missing from the blob store; the record is unchanged and its operation does not run again"},
	{blob.ErrCorrupt, kindBlobUnavailable, "the stored body in the blob store does not match its SHA-256; the record is unchanged and its operation does not run again"},
	{blob.ErrUnavailable, kindBlobUnavailable, "the blob store of large responses cannot be reached; nothing changed: retry after Retry-After"},
	{errBlobConflict, kindInvalid, "a retried complete of this attempt sent another body than its first try"},
	{statemachine.ErrStoreUnavailable, kindStoreUnavailable, "the store cannot be reached or did not answer in time; the call may or may not have taken effect, and a retry with the same owner or lease token is safe"},
}

// internalDetail is the detail of every error the table does not know.
const internalDetail = "an unexpected error; it has been logged"

// ProblemTypes maps the type URI of every kind of problem the service
// answers with to the kind's status: the kinds of the table above, and
// internal for every error it does not know.
func ProblemTypes() map[string]int {
	types := map[string]int{ProblemBaseURI + kindInternal.name: kindInternal.status}
	for _, row := range errorKinds {
		types[ProblemBaseURI+row.kind.name] = row.kind.status
	}
	return types
}

// Errors of the HTTP layer; each has its row in errorKinds.
var (
	errUnauthorized = errors.New("unauthorized")
	errForbidden    = errors.New("forbidden")
	errNoRoute      = errors.New("no such path")
	errNoTenant     = errors.New("no such tenant")
	errMethod       = errors.New("method not allowed")
	errMediaType    = errors.New("unsupported media type")
)

// noTenantError names the tenant an admin asked for that the tenants file
// does not list.
type noTenantError struct{ tenant string }

func (e *noTenantError) Error() string { return "no such tenant: " + e.tenant }
func (e *noTenantError) Detail() string {
	return strconv.Quote(e.tenant) + " is not in the tenants file"
}
func (e *noTenantError) Is(target error) bool { return target == errNoTenant }

// duplicateHeaderError is a request with two of a header that must be
// one, which would leave it to chance which one counts.
type duplicateHeaderError struct{ name string }

func (e *duplicateHeaderError) Error() string { return "the " + e.name + " header is given twice" }
func (e *duplicateHeaderError) Detail() string {
	return "the " + e.name + " header is given more than once; send it once"
}
func (e *duplicateHeaderError) Is(target error) bool { return target == statemachine.ErrInvalid }

// badField is a bad request naming the request field at fault.
func badField(field, format string, args ...any) error {
	return &statemachine.InvalidError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// bodyTooLarge is a request body over limit bytes.
func bodyTooLarge(limit int64) error {
	return &statemachine.TooLargeError{What: "the request body", Limit: limit}
}

// problemOf finds err's problem kind and detail: the error's own detail
// when it has one, its row's otherwise; anything unknown is internal.
func problemOf(err error) (problemKind, string) {
	for _, row := range errorKinds {
		if !errors.Is(err, row.err) {
			continue
		}
		var d interface{ Detail() string }
		var limit *quota.Error
		switch {
		case row.kind == kindStoreUnavailable:
			return row.kind, row.detail // never which connection failed how
		case errors.As(err, &limit):
			return row.kind, limit.Detail
		case errors.As(err, &d):
			return row.kind, d.Detail()
		}
		return row.kind, row.detail
	}
	return kindInternal, internalDetail
}

// A request whose caller left before its answer is logged at info with
// this status (nginx's "client closed request") and outcome, not as the
// error its end in the store may have come to.
const (
	statusClientGone  = 499
	outcomeClientGone = "client-gone"
)

// storeRetryAfter is the Retry-After of a 503: the store is usually back,
// or a replica promoted, within a second or two. It is 1 or 2 at random
// (Retry-After is whole seconds), so that callers refused together do not
// all come back together.
func storeRetryAfter() string {
	if rand.N(2) == 0 {
		return "1"
	}
	return "2"
}

// writeProblem answers err as an RFC 9457 problem detail.
func writeProblem(w http.ResponseWriter, r *http.Request, err error) {
	kind, detail := problemOf(err)
	gone := (kind.status >= 500 || kind == kindInProgress) && r.Context().Err() != nil
	if gone {
		// The caller left (a waiting begin, say, whose client gave up), or
		// half-closed its connection: what the call came to (a 503 for a
		// store call cut short, a 409 for a wait cut short) is no fault,
		// and is logged as client-gone. The answer is still written, for
		// a client that half-closed and still reads. A request refused
		// for itself keeps its outcome.
		if info := infoFrom(r.Context()); info != nil && info.status == 0 {
			info.status, info.outcome, info.err = statusClientGone, outcomeClientGone, err
		}
	}
	p := api.Problem{
		Type:   ProblemBaseURI + kind.name,
		Code:   kind.name,
		Title:  kind.title,
		Status: kind.status,
		Detail: clip(detail, maxDetailChars),
	}
	h := w.Header()
	var invalid *statemachine.InvalidError
	var inProgress *statemachine.InProgressError
	var limit *quota.Error
	switch {
	case errors.As(err, &limit):
		h.Set("Retry-After", limitRetryAfter(limit))
	case errors.As(err, &invalid) && invalid.Field != "":
		field := clip(invalid.Field, maxFieldChars)
		p.Field = &field
	case errors.As(err, &inProgress):
		p.Attempt = &inProgress.Attempt
		expires := api.NewMilliTime(inProgress.LeaseExpiresAt)
		p.LeaseExpiresAt = &expires
		h.Set("Retry-After", wholeSeconds(inProgress.RetryIn()))
	}
	switch kind {
	case kindUnauthorized:
		h.Set("WWW-Authenticate", `Bearer realm="idemsvc"`)
	case kindStoreUnavailable, kindBlobUnavailable:
		h.Set("Retry-After", storeRetryAfter())
	}
	if info := infoFrom(r.Context()); info != nil && !gone {
		info.outcome = kind.name
		info.err = err
	}
	h.Set("Content-Type", "application/problem+json")
	w.WriteHeader(kind.status)
	_ = json.NewEncoder(w).Encode(p) // the client went away; nothing else to do
}

// The longest detail and field a problem carries, in characters, as
// api/openapi.yaml states: a detail may quote a field name the caller
// sent, of any length.
const (
	maxDetailChars = 1024
	maxFieldChars  = 256
)

// clip is s cut to at most n characters, ending in "…" when cut.
func clip(s string, n int) string {
	if len(s) <= n { // n bytes are at most n characters
		return s
	}
	chars := 0
	for i := range s {
		if chars == n-1 {
			return strings.ToValidUTF8(s[:i], "") + "…"
		}
		chars++
	}
	return s
}

// wholeSeconds is d in whole seconds, rounded up, at least 1.
func wholeSeconds(d time.Duration) string {
	s := math.Ceil(d.Seconds())
	if s < 1 {
		s = 1
	}
	return strconv.FormatInt(int64(s), 10)
}
