// SPDX-License-Identifier: Apache-2.0

package idem

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
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
	buf := bodies.Get().(*[]byte)
	body := appendBatch((*buf)[:0], len(items), func(b []byte, i int) []byte {
		p := &items[i]
		owner := p.Owner
		if owner == "" {
			owner = newOwner()
		}
		return appendBeginRequest(b, &BeginRequest{Key: p.Key, Owner: &owner, Tenant: c.tenant,
			Fingerprint: nonEmpty(p.Fingerprint), LeaseMs: millis(p.Lease),
			RetentionS: seconds(p.Retention), WaitMs: millis(p.Wait)})
	})
	results, err := c.batch(ctx, "begin batch", c.fastURI(func(f *fastPath) string { return f.uris.beginBatch }),
		c.api.ClientInterface.BeginBatchWithBody, body, len(items))
	putBody(buf, body)
	if err != nil {
		return nil, err
	}
	out := make([]BeginBatchResult, len(items))
	for i := range results {
		r := &results[i]
		switch r.Status {
		case http.StatusCreated:
			out[i].Lease, err = r.acquired()
		case http.StatusOK:
			out[i].Replay, err = r.replay()
		default:
			out[i].Err = r.err()
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
	buf := bodies.Get().(*[]byte)
	body := appendBatch((*buf)[:0], len(items), func(b []byte, i int) []byte {
		p := &items[i]
		if p.Fail == nil {
			return appendCompleteItem(b, &CompleteRequest{Key: p.Key, LeaseToken: p.Token, Response: p.Response.stored(),
				RetentionS: seconds(p.Retention), Tenant: c.tenant})
		}
		retryable := !p.Fail.Terminal
		return appendFailItem(b, &FailRequest{Key: p.Key, LeaseToken: p.Token, Retryable: &retryable,
			Error: nonEmpty(shortMessage(p.Fail.Error)), Response: p.Fail.Response.stored(), Tenant: c.tenant})
	})
	results, err := c.batch(ctx, "finish batch", c.fastURI(func(f *fastPath) string { return f.uris.finishBatch }),
		c.api.ClientInterface.FinishBatchWithBody, body, len(items))
	putBody(buf, body)
	if err != nil {
		return nil, err
	}
	out := make([]FinishBatchResult, len(items))
	for i := range results {
		r := &results[i]
		if r.Status != http.StatusOK {
			out[i].Err = r.err()
			continue
		}
		if out[i].FinishResult, err = r.finished(); err != nil {
			return nil, fmt.Errorf("idem: finish batch: result %d: %w", i, err)
		}
	}
	return out, nil
}

// appendBatch appends a batch's body, {"items": [...]}, with item
// appending the body of item i.
func appendBatch(b []byte, n int, item func(b []byte, i int) []byte) []byte {
	b = append(b, `{"items":[`...)
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = item(b, i)
	}
	return append(b, "]}"...)
}

// appendCompleteItem and appendFailItem append a finish batch's item: its
// single call's body with "kind" first, as encoding/json writes
// struct{Kind string; CompleteRequest}. The body's "{" becomes the ","
// after "kind" (its key is never omitted, so it is never empty).
func appendCompleteItem(b []byte, r *CompleteRequest) []byte {
	b = append(b, `{"kind":"complete"`...)
	at := len(b)
	b = appendCompleteRequest(b, r)
	b[at] = ','
	return b
}

func appendFailItem(b []byte, r *FailRequest) []byte {
	b = append(b, `{"kind":"fail"`...)
	at := len(b)
	b = appendFailRequest(b, r)
	b[at] = ','
	return b
}

// fastURI is the fast path's URI of a batch call, "" without a fast path.
func (c *Client) fastURI(uri func(*fastPath) string) string {
	if c.fast == nil {
		return ""
	}
	return uri(c.fast)
}

// withBody is a generated client's call of an operation with a body ready.
type withBody func(ctx context.Context, contentType string, body io.Reader, reqEditors ...RequestEditorFn) (*http.Response, error)

// batch posts body, retried as every call is (on the fast path to uri,
// else through the generated client's call), and decodes the answer's
// results, checking that it has one per item.
func (c *Client) batch(ctx context.Context, op, uri string, slow withBody, body []byte, n int) ([]batchResult, error) {
	ans := answers.Get().(*bytes.Buffer)
	defer putAnswer(ans)
	var status int
	var json200 bool
	err := c.call(ctx, op, c.callTimeout, func(ctx context.Context) (*http.Response, []byte, error) {
		var resp *http.Response
		var err error
		if uri != "" {
			resp, err = c.fast.send(ctx, uri, body)
		} else {
			resp, err = slow(ctx, "application/json", bytes.NewReader(body))
		}
		if err != nil {
			return nil, nil, err
		}
		ans.Reset()
		_, err = ans.ReadFrom(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			return nil, nil, err
		}
		status = resp.StatusCode
		json200 = status == http.StatusOK && strings.Contains(resp.Header.Get("Content-Type"), "json")
		return resp, ans.Bytes(), nil
	})
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK || !json200 {
		return nil, &opError{op, fmt.Errorf("an answer without one result per item")}
	}
	results, err := decodeBatch(ans.Bytes())
	if err != nil {
		return nil, &opError{op, err}
	}
	if len(results) != n {
		return nil, &opError{op, fmt.Errorf("an answer without one result per item")}
	}
	return results, nil
}

// answers are the buffers of batch answers, kept for the next calls
// unless they grew past maxPooledAnswer.
var answers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

const maxPooledAnswer = 1 << 20

func putAnswer(b *bytes.Buffer) {
	if b.Cap() <= maxPooledAnswer {
		answers.Put(b)
	}
}

func putBody(buf *[]byte, body []byte) {
	if cap(body) <= maxPooledBody {
		*buf = body
		bodies.Put(buf)
	}
}

// batchResult is one result of a batch's answer. The answer is decoded in
// one pass: each result's body into one struct holding the members of
// every body a result may have (BeginAcquired, BeginReplay, FinishResult,
// Problem), which the result's status then sorts out. (Decoding the
// results as json.RawMessage, then each body again, took two passes over
// every item and a copy of it.) An answer that does not decode so is
// decoded as before, the generated types taking each body (raw).
type batchResult struct {
	Status int        `json:"status"`
	Body   resultBody `json:"body"`
	raw    json.RawMessage
}

// resultBody holds the members of every body a batch result may have.
// The members two bodies share have one type that fits both: status is a
// string in a record and a number in a problem. batch_test.go checks that
// it has every member of each body.
type resultBody struct {
	Attempt        *Attempt       `json:"attempt"`
	Code           string         `json:"code"`
	CompletedAt    *Timestamp     `json:"completed_at"`
	Detail         string         `json:"detail"`
	Error          *string        `json:"error"`
	ExpiresAt      Timestamp      `json:"expires_at"`
	FailedAt       *Timestamp     `json:"failed_at"`
	Field          *string        `json:"field"`
	Instance       *string        `json:"instance"`
	Key            Key            `json:"key"`
	LeaseExpiresAt *Timestamp     `json:"lease_expires_at"`
	LeaseToken     LeaseToken     `json:"lease_token"`
	Recovered      bool           `json:"recovered"`
	Response       StoredResponse `json:"response"`
	Retryable      *bool          `json:"retryable"`
	Status         stringOrInt    `json:"status"`
	Title          string         `json:"title"`
	Type           string         `json:"type"`
}

// stringOrInt is a status member: a record's state or a problem's HTTP
// status.
type stringOrInt struct {
	s     string
	n     int
	isInt bool
}

func (v *stringOrInt) UnmarshalJSON(b []byte) error {
	switch {
	case len(b) > 0 && b[0] == '"':
		*v = stringOrInt{}
		if bytes.IndexByte(b, '\\') < 0 {
			v.s = string(b[1 : len(b)-1]) // (encoding/json checked it is a string)
			return nil
		}
		return json.Unmarshal(b, &v.s)
	case string(b) == "null":
		return nil
	}
	n, err := strconv.Atoi(string(b))
	if err != nil {
		return &json.UnmarshalTypeError{Value: "number " + string(b), Type: reflect.TypeFor[int]()}
	}
	*v = stringOrInt{n: n, isInt: true}
	return nil
}

// errStatusType is a record's status given as a number.
var errStatusType = errors.New("json: cannot unmarshal number into Go struct field .status of type string")

// decodeBatch decodes a batch's answer, in one pass when it can.
func decodeBatch(answer []byte) ([]batchResult, error) {
	var a struct {
		Results []batchResult `json:"results"`
	}
	if err := json.Unmarshal(answer, &a); err == nil {
		return a.Results, nil
	}
	var slow BatchResponse
	if err := json.Unmarshal(answer, &slow); err != nil {
		return nil, err
	}
	out := make([]batchResult, len(slow.Results))
	for i, r := range slow.Results {
		out[i] = batchResult{Status: r.Status, raw: r.Body}
	}
	return out, nil
}

func (r *batchResult) acquired() (*BeginAcquired, error) {
	out := new(BeginAcquired)
	if r.raw != nil {
		return out, json.Unmarshal(r.raw, out)
	}
	b := &r.Body
	if b.Status.isInt {
		return nil, errStatusType
	}
	*out = BeginAcquired{Key: b.Key, LeaseToken: b.LeaseToken, Recovered: b.Recovered,
		Status: BeginAcquiredStatus(b.Status.s)}
	if b.Attempt != nil {
		out.Attempt = *b.Attempt
	}
	if b.LeaseExpiresAt != nil {
		out.LeaseExpiresAt = *b.LeaseExpiresAt
	}
	return out, nil
}

func (r *batchResult) replay() (*BeginReplay, error) {
	out := new(BeginReplay)
	if r.raw != nil {
		return out, json.Unmarshal(r.raw, out)
	}
	b := &r.Body
	if b.Status.isInt {
		return nil, errStatusType
	}
	*out = BeginReplay{CompletedAt: b.CompletedAt, Error: b.Error, FailedAt: b.FailedAt, Key: b.Key,
		Response: b.Response, Status: FinishedState(b.Status.s)}
	if b.Attempt != nil {
		out.Attempt = *b.Attempt
	}
	return out, nil
}

func (r *batchResult) finished() (FinishResult, error) {
	var out FinishResult
	if r.raw != nil {
		return out, json.Unmarshal(r.raw, &out)
	}
	b := &r.Body
	if b.Status.isInt {
		return out, errStatusType
	}
	out = FinishResult{CompletedAt: b.CompletedAt, ExpiresAt: b.ExpiresAt, FailedAt: b.FailedAt, Key: b.Key,
		Retryable: b.Retryable, Status: FinishedState(b.Status.s)}
	if b.Attempt != nil {
		out.Attempt = *b.Attempt
	}
	return out, nil
}

// err is the *Error of an item's problem.
func (r *batchResult) err() error {
	var p Problem
	if r.raw != nil {
		if err := json.Unmarshal(r.raw, &p); err != nil {
			p = Problem{}
		}
	} else if b := &r.Body; b.Status.isInt || b.Status == (stringOrInt{}) {
		p = Problem{Attempt: b.Attempt, Code: b.Code, Detail: b.Detail, Field: b.Field, Instance: b.Instance,
			LeaseExpiresAt: b.LeaseExpiresAt, Status: b.Status.n, Title: b.Title, Type: b.Type}
	}
	if p.Type == "" {
		p = Problem{Status: r.Status, Title: http.StatusText(r.Status), Detail: "an answer idemsvc does not document"}
	}
	e := &Error{StatusCode: r.Status, Problem: p}
	if p.LeaseExpiresAt != nil {
		e.RetryAfter = max(time.Second, time.Until(p.LeaseExpiresAt.Time).Round(time.Second))
	}
	return e
}
