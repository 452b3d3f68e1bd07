// SPDX-License-Identifier: Apache-2.0

package idem

import (
	"context"
	"encoding/base64"
	"fmt"
	"iter"
	"net/http"
	"time"
	"unicode/utf8"
)

// Response is what an operation produced, as idemsvc stores and replays
// it byte for byte. Every part is optional.
type Response struct {
	StatusCode int // 0: none
	Headers    map[string]string
	Body       []byte
}

// stored encodes r for the API: a body that is not UTF-8 goes as base64.
func (r Response) stored() *StoredResponse {
	out := &StoredResponse{Headers: r.Headers}
	if r.StatusCode != 0 {
		out.StatusCode = &r.StatusCode
	}
	if r.Body != nil {
		body, enc := string(r.Body), BodyEncodingText
		if !utf8.Valid(r.Body) {
			body, enc = base64.StdEncoding.EncodeToString(r.Body), BodyEncodingBase64
		}
		out.Body, out.BodyEncoding = &body, &enc
	}
	return out
}

// Decode returns the stored response with its body decoded.
func (s StoredResponse) Decode() (Response, error) {
	r := Response{Headers: s.Headers}
	if s.StatusCode != nil {
		r.StatusCode = *s.StatusCode
	}
	if s.Body == nil {
		return r, nil
	}
	if s.BodyEncoding != nil && *s.BodyEncoding == BodyEncodingBase64 {
		b, err := base64.StdEncoding.DecodeString(*s.Body)
		if err != nil {
			return r, fmt.Errorf("idem: stored body: %w", err)
		}
		r.Body = b
		return r, nil
	}
	r.Body = []byte(*s.Body)
	return r, nil
}

// BeginParams are a begin's parameters. Zero values take the service's
// defaults (a 30 s lease, a day's retention, no wait).
type BeginParams struct {
	Key         string
	Fingerprint string
	// Owner identifies the caller's attempt: a begin retried with the same
	// owner gets the same lease. Begin makes one up when it is empty.
	Owner     string
	Lease     time.Duration
	Retention time.Duration
	// Wait holds the begin while another caller's attempt is in progress,
	// up to this long, to answer with its outcome instead of ErrInProgress.
	Wait time.Duration
}

// BeginResult is either a lease to run the operation under, or the stored
// outcome of a finished attempt to replay.
type BeginResult struct {
	Lease  *BeginAcquired // acquired: run the operation, then complete or fail
	Replay *BeginReplay   // completed or terminally failed: do not run it
}

// Begin starts an attempt for p.Key. A key in progress elsewhere answers an
// *Error matching ErrInProgress, with Problem.LeaseExpiresAt and RetryAfter.
func (c *Client) Begin(ctx context.Context, p BeginParams) (BeginResult, error) {
	if p.Owner == "" {
		p.Owner = newOwner()
	}
	body := BeginRequest{Key: p.Key, Owner: &p.Owner, Tenant: c.tenant,
		Fingerprint: nonEmpty(p.Fingerprint), LeaseMs: millis(p.Lease),
		RetentionS: seconds(p.Retention), WaitMs: millis(p.Wait)}
	var out BeginResult
	err := c.call(ctx, "begin", c.callTimeout+p.Wait, func(ctx context.Context) (*http.Response, []byte, error) {
		r, err := c.begin(ctx, body)
		if err != nil {
			return nil, nil, err
		}
		out = BeginResult{Lease: r.JSON201, Replay: r.JSON200}
		return r.HTTPResponse, r.Body, nil
	})
	return out, err
}

// Complete stores resp as the outcome of the attempt holding token.
func (c *Client) Complete(ctx context.Context, key, token string, resp Response, retention time.Duration) (FinishResult, error) {
	var out FinishResult
	err := c.completeInto(ctx, key, token, resp, retention, &out)
	return out, err
}

// completeInto is Complete, with idemsvc's answer decoded into out, or
// not at all when out is nil (Do and Middleware have no use for it).
func (c *Client) completeInto(ctx context.Context, key, token string, resp Response, retention time.Duration, out *FinishResult) error {
	body := CompleteRequest{Key: key, LeaseToken: token, Response: resp.stored(),
		RetentionS: seconds(retention), Tenant: c.tenant}
	return c.call(ctx, "complete", c.callTimeout, func(ctx context.Context) (*http.Response, []byte, error) {
		r, err := c.complete(ctx, body, out != nil)
		if err != nil {
			return nil, nil, err
		}
		if out != nil && r.JSON200 != nil {
			*out = *r.JSON200
		}
		return r.HTTPResponse, r.Body, nil
	})
}

// FailParams describe a failed attempt.
type FailParams struct {
	// Terminal stores the failure for begin to replay; otherwise the key is
	// released and the next begin runs the operation again.
	Terminal bool
	// Error is a short message for operators; only its first 1 KiB is
	// sent, as idemsvc refuses a longer one.
	Error    string
	Response Response // what to replay for a terminal failure
}

// maxErrorBytes is the longest failure message idemsvc takes.
const maxErrorBytes = 1024

// shortMessage cuts msg to maxErrorBytes, at a character boundary.
func shortMessage(msg string) string {
	if len(msg) <= maxErrorBytes {
		return msg
	}
	cut := maxErrorBytes
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut]
}

// Fail ends the attempt holding token with a failure.
func (c *Client) Fail(ctx context.Context, key, token string, p FailParams) (FinishResult, error) {
	retryable := !p.Terminal
	body := FailRequest{Key: key, LeaseToken: token, Retryable: &retryable,
		Error: nonEmpty(shortMessage(p.Error)), Response: p.Response.stored(), Tenant: c.tenant}
	var out FinishResult
	err := c.call(ctx, "fail", c.callTimeout, func(ctx context.Context) (*http.Response, []byte, error) {
		r, err := c.fail(ctx, body)
		if err != nil {
			return nil, nil, err
		}
		if r.JSON200 != nil {
			out = *r.JSON200
		}
		return r.HTTPResponse, r.Body, nil
	})
	return out, err
}

// Extend pushes the lease of the attempt holding token to now + lease.
func (c *Client) Extend(ctx context.Context, key, token string, lease time.Duration) (Lease, error) {
	body := ExtendRequest{Key: key, LeaseToken: token, LeaseMs: millis(lease), Tenant: c.tenant}
	var out Lease
	err := c.call(ctx, "extend", c.callTimeout, func(ctx context.Context) (*http.Response, []byte, error) {
		r, err := c.extend(ctx, body)
		if err != nil {
			return nil, nil, err
		}
		if r.JSON200 != nil {
			out = *r.JSON200
		}
		return r.HTTPResponse, r.Body, nil
	})
	return out, err
}

// Status reads key's record; ErrNotFound when there is none.
func (c *Client) Status(ctx context.Context, key string, includeResponse bool) (StatusRecord, error) {
	params := &GetStatusParams{Key: key, Tenant: c.tenant}
	if includeResponse {
		params.IncludeResponse = &includeResponse
	}
	var out StatusRecord
	err := c.call(ctx, "status", c.callTimeout, func(ctx context.Context) (*http.Response, []byte, error) {
		r, err := c.api.GetStatusWithResponse(ctx, params)
		if err != nil {
			return nil, nil, err
		}
		if r.JSON200 != nil {
			out = *r.JSON200
		}
		return r.HTTPResponse, r.Body, nil
	})
	return out, err
}

// ListParams selects the records Keys lists.
type ListParams struct {
	State     State         // required: StateInProgress, StateCompleted or StateFailed
	OlderThan time.Duration // only records whose last transition is at least this old
	PageSize  int           // records per call, 1–1000; 0 is the server's default (100)
}

// Keys lists the client's tenant's records in one state, without their
// responses, fetching a page per call as the loop goes on. A record that
// exists for the whole listing comes at least once. The loop ends at the
// first error, which it yields; a cursor that can no longer be followed
// (a Redis node restarted or failed over) is an ErrInvalid, and the
// listing may be started again.
func (c *Client) Keys(ctx context.Context, p ListParams) iter.Seq2[StatusRecord, error] {
	return func(yield func(StatusRecord, error) bool) {
		params := &ListKeysParams{State: p.State, Tenant: c.tenant}
		if s := int32(p.OlderThan / time.Second); s > 0 {
			params.OlderThanS = &s
		}
		if p.PageSize > 0 {
			n := int32(min(p.PageSize, 1<<20))
			params.Limit = &n
		}
		for {
			var page KeyList
			err := c.call(ctx, "list", c.callTimeout, func(ctx context.Context) (*http.Response, []byte, error) {
				r, err := c.api.ListKeysWithResponse(ctx, params)
				if err != nil {
					return nil, nil, err
				}
				if r.JSON200 != nil {
					page = *r.JSON200
				}
				return r.HTTPResponse, r.Body, nil
			})
			if err != nil {
				yield(StatusRecord{}, err)
				return
			}
			for _, rec := range page.Items {
				if !yield(rec, nil) {
					return
				}
			}
			if page.NextCursor == nil || *page.NextCursor == "" {
				return
			}
			params.Cursor = page.NextCursor
		}
	}
}

// Delete forgets key's record; deleting an absent record is no error.
func (c *Client) Delete(ctx context.Context, key string) error {
	params := &DeleteKeyParams{Key: key, Tenant: c.tenant}
	return c.call(ctx, "delete", c.callTimeout, func(ctx context.Context) (*http.Response, []byte, error) {
		r, err := c.api.DeleteKeyWithResponse(ctx, params)
		if err != nil {
			return nil, nil, err
		}
		return r.HTTPResponse, r.Body, nil
	})
}

// Usage reports tenants' usage against their limits: the client's tenant
// (WithTenant's, or its key's), or, for an admin key without WithTenant,
// every tenant. Begins per second and rejections are those of the idemsvc
// instance that answered; stored bytes, waiters and attempts in progress
// are shared by every instance.
func (c *Client) Usage(ctx context.Context) ([]TenantUsage, error) {
	var out []TenantUsage
	err := c.call(ctx, "usage", c.callTimeout, func(ctx context.Context) (*http.Response, []byte, error) {
		r, err := c.api.GetUsageWithResponse(ctx, &GetUsageParams{Tenant: c.tenant})
		if err != nil {
			return nil, nil, err
		}
		if r.JSON200 != nil {
			out = r.JSON200.Tenants
		}
		return r.HTTPResponse, r.Body, nil
	})
	return out, err
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func millis(d time.Duration) *int64 {
	if d <= 0 {
		return nil
	}
	ms := d.Milliseconds()
	return &ms
}

func seconds(d time.Duration) *int64 {
	if d <= 0 {
		return nil
	}
	s := int64((d + time.Second - 1) / time.Second) // a part of a second counts as one
	return &s
}
