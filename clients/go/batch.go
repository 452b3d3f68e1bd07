// SPDX-License-Identifier: Apache-2.0

package idem

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// BeginBatchResult is one begin's outcome in a batch: what Begin would
// have returned for it.
type BeginBatchResult struct {
	BeginResult
	Err error // an *Error, as Begin's (ErrInProgress, ErrFingerprintMismatch, ...)
}

// BeginBatch begins every item in one call (POST /v1/begin/batch), for a
// queue consumer's batch of messages: at most the service's batch size
// (100 by default). Results come in the items' order. Items never wait:
// Wait must be zero. An item without an Owner gets one made up, kept when
// the call is retried, so that a retry gets the same leases. The error is
// the whole call's (unreachable, a 400 for the batch); each item's own
// problem is in its result.
func (c *Client) BeginBatch(ctx context.Context, items []BeginParams) ([]BeginBatchResult, error) {
	body := BeginBatchRequest{Items: make([]BeginBatchItem, len(items))}
	for i, p := range items {
		if p.Owner == "" {
			p.Owner = newOwner()
		}
		b, err := json.Marshal(BeginRequest{Key: p.Key, Owner: &p.Owner, Tenant: c.tenant,
			Fingerprint: nonEmpty(p.Fingerprint), LeaseMs: millis(p.Lease),
			RetentionS: seconds(p.Retention), WaitMs: millis(p.Wait)})
		if err != nil {
			return nil, fmt.Errorf("idem: begin batch: %w", err)
		}
		body.Items[i] = b
	}
	results, err := c.batch(ctx, "begin batch", func(ctx context.Context) (*http.Response, []byte, *BatchResponse, error) {
		r, err := c.api.BeginBatchWithResponse(ctx, body)
		if err != nil {
			return nil, nil, nil, err
		}
		return r.HTTPResponse, r.Body, r.JSON200, nil
	}, len(items))
	if err != nil {
		return nil, err
	}
	out := make([]BeginBatchResult, len(items))
	for i, r := range results {
		switch r.Status {
		case http.StatusCreated:
			out[i].Lease = new(BeginAcquired)
			err = json.Unmarshal(r.Body, out[i].Lease)
		case http.StatusOK:
			out[i].Replay = new(BeginReplay)
			err = json.Unmarshal(r.Body, out[i].Replay)
		default:
			out[i].Err = itemError(r)
		}
		if err != nil {
			return nil, fmt.Errorf("idem: begin batch: result %d: %w", i, err)
		}
	}
	return out, nil
}

// FinishParams are one finish of a batch: a complete with Response, or,
// when Fail is set, a fail.
type FinishParams struct {
	Key       string
	Token     string // the lease token of the attempt
	Response  Response
	Retention time.Duration // complete: zero keeps the begin's
	Fail      *FailParams
}

// FinishBatchResult is one finish's outcome in a batch: what Complete or
// Fail would have returned for it.
type FinishBatchResult struct {
	FinishResult
	Err error // an *Error, as Complete's or Fail's (ErrLeaseLost, ErrNotFound, ...)
}

// FinishBatch completes or fails every item in one call (POST
// /v1/finish/batch). Results come in the items' order. Retrying it is
// safe: the same token finishing again gets the same result. The error is
// the whole call's; each item's own problem is in its result.
func (c *Client) FinishBatch(ctx context.Context, items []FinishParams) ([]FinishBatchResult, error) {
	body := FinishBatchRequest{Items: make([]FinishBatchItem, len(items))}
	for i, p := range items {
		var v any
		if p.Fail == nil {
			v = struct {
				Kind string `json:"kind"`
				CompleteRequest
			}{"complete", CompleteRequest{Key: p.Key, LeaseToken: p.Token, Response: p.Response.stored(),
				RetentionS: seconds(p.Retention), Tenant: c.tenant}}
		} else {
			retryable := !p.Fail.Terminal
			v = struct {
				Kind string `json:"kind"`
				FailRequest
			}{"fail", FailRequest{Key: p.Key, LeaseToken: p.Token, Retryable: &retryable,
				Error: nonEmpty(shortMessage(p.Fail.Error)), Response: p.Fail.Response.stored(), Tenant: c.tenant}}
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("idem: finish batch: %w", err)
		}
		body.Items[i] = b
	}
	results, err := c.batch(ctx, "finish batch", func(ctx context.Context) (*http.Response, []byte, *BatchResponse, error) {
		r, err := c.api.FinishBatchWithResponse(ctx, body)
		if err != nil {
			return nil, nil, nil, err
		}
		return r.HTTPResponse, r.Body, r.JSON200, nil
	}, len(items))
	if err != nil {
		return nil, err
	}
	out := make([]FinishBatchResult, len(items))
	for i, r := range results {
		if r.Status != http.StatusOK {
			out[i].Err = itemError(r)
			continue
		}
		if err := json.Unmarshal(r.Body, &out[i].FinishResult); err != nil {
			return nil, fmt.Errorf("idem: finish batch: result %d: %w", i, err)
		}
	}
	return out, nil
}

// batch makes one batch call, retried as every call is, and checks that
// it has one result per item.
func (c *Client) batch(ctx context.Context, op string, do func(ctx context.Context) (*http.Response, []byte, *BatchResponse, error), n int) ([]BatchResult, error) {
	var out *BatchResponse
	err := c.call(ctx, op, c.callTimeout, func(ctx context.Context) (*http.Response, []byte, error) {
		resp, body, r, err := do(ctx)
		out = r
		return resp, body, err
	})
	if err != nil {
		return nil, err
	}
	if out == nil || len(out.Results) != n {
		return nil, &opError{op, fmt.Errorf("an answer without one result per item")}
	}
	return out.Results, nil
}

// itemError is the *Error of an item's problem.
func itemError(r BatchResult) error {
	var p Problem
	if err := json.Unmarshal(r.Body, &p); err != nil || p.Type == "" {
		p = Problem{Status: r.Status, Title: http.StatusText(r.Status), Detail: "an answer idemsvc does not document"}
	}
	e := &Error{StatusCode: r.Status, Problem: p}
	if p.LeaseExpiresAt != nil {
		e.RetryAfter = max(time.Second, time.Until(p.LeaseExpiresAt.Time).Round(time.Second))
	}
	return e
}
