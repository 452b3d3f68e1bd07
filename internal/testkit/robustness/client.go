// SPDX-License-Identifier: Apache-2.0

package robustness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"
)

// client calls idemsvc over plain HTTP. It decodes answers itself rather
// than through the generated SDK, since it must see every status and body
// as sent, including those the contract does not allow.
type client struct {
	http   *http.Client
	apiKey string
}

func newClient(apiKey string, timeout time.Duration) *client {
	return &client{
		apiKey: apiKey,
		http: &http.Client{
			Timeout: timeout,
			Transport: &http.Transport{
				MaxIdleConnsPerHost: 8,
				DialContext:         (&net.Dialer{Timeout: time.Second}).DialContext,
			},
		},
	}
}

// wire is the union of the answer bodies the traffic reads.
type wire struct {
	Status         any    `json:"status"`
	Type           string `json:"type"`
	Attempt        int64  `json:"attempt"`
	LeaseToken     string `json:"lease_token"`
	LeaseExpiresAt string `json:"lease_expires_at"`
	Recovered      bool   `json:"recovered"`
	CompletedAt    string `json:"completed_at"`
	FailedAt       string `json:"failed_at"`
	Detail         string `json:"detail"`
	Response       *struct {
		Body string `json:"body"`
	} `json:"response"`
}

// errNotSent marks a call that never reached idemsvc (the connection was
// refused), so it cannot have taken effect.
var errNotSent = errors.New("not sent")

// call sends one request to base and decodes the answer into an Output.
// It returns errNotSent when the request certainly never arrived.
func (c *client) call(ctx context.Context, base string, in Input, key string) (Output, error) {
	var path string
	body := map[string]any{"key": key}
	switch in.Kind {
	case Begin:
		path = "/v1/begin"
		body["lease_ms"] = in.LeaseMs
		if in.Owner != "" {
			body["owner"] = in.Owner
		}
		if in.Fingerprint != "" {
			body["fingerprint"] = in.Fingerprint
		}
		if in.WaitMs > 0 {
			body["wait_ms"] = in.WaitMs
		}
	case Complete:
		path = "/v1/complete"
		body["lease_token"] = in.Token
		body["response"] = map[string]any{"status_code": 200, "body": in.Body}
	case Fail:
		path = "/v1/fail"
		body["lease_token"] = in.Token
		body["retryable"] = in.Retryable
		body["error"] = "injected"
		if !in.Retryable {
			body["response"] = map[string]any{"status_code": 422, "body": in.Body}
		}
	case Extend:
		path = "/v1/extend"
		body["lease_token"] = in.Token
		body["lease_ms"] = in.LeaseMs
	}
	data, err := json.Marshal(body)
	if err != nil {
		return Output{}, fmt.Errorf("encode request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, bytes.NewReader(data))
	if err != nil {
		return Output{}, fmt.Errorf("request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.apiKey)
	resp, err := c.http.Do(req)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return Output{}, errNotSent
		}
		return Output{Result: Unknown, Detail: shorten(err.Error())}, nil
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return Output{Result: Unknown, Status: resp.StatusCode, Detail: shorten(err.Error())}, nil
	}
	return decode(in.Kind, resp.StatusCode, raw), nil
}

func shorten(s string) string {
	if len(s) > 160 {
		return s[:160]
	}
	return s
}

// decode classifies an answer by its status and problem type.
func decode(kind Kind, status int, raw []byte) Output {
	out := Output{Status: status, Result: Unexpected}
	var w wire
	if err := json.Unmarshal(raw, &w); err != nil {
		out.Detail = "undecodable body: " + shorten(string(raw))
		return out
	}
	out.Attempt, out.Token, out.Recovered = w.Attempt, w.LeaseToken, w.Recovered
	out.LeaseExp = millis(w.LeaseExpiresAt)
	if w.Response != nil {
		out.Body = w.Response.Body
	}
	problem := w.Type[strings.LastIndexByte(w.Type, '/')+1:]
	state, _ := w.Status.(string)
	switch {
	case status == http.StatusServiceUnavailable && (problem == "store-unavailable" || problem == "blob-unavailable"):
		out.Result = Unknown
	case kind == Begin && status == http.StatusCreated && state == "acquired":
		out.Result = Acquired
	case kind == Begin && status == http.StatusOK && state == "completed":
		out.Result, out.At = ReplayCompleted, millis(w.CompletedAt)
	case kind == Begin && status == http.StatusOK && state == "failed":
		out.Result, out.At = ReplayFailed, millis(w.FailedAt)
	case kind == Begin && status == http.StatusConflict && problem == "in-progress":
		out.Result = InProgress
	case kind == Begin && status == http.StatusUnprocessableEntity && problem == "fingerprint-mismatch":
		out.Result = Mismatch
	case kind == Complete && status == http.StatusOK && state == "completed":
		out.Result, out.At = Finished, millis(w.CompletedAt)
	case kind == Fail && status == http.StatusOK && state == "failed":
		out.Result, out.At = Finished, millis(w.FailedAt)
	case kind == Extend && status == http.StatusOK:
		out.Result = Extended
	case kind != Begin && status == http.StatusConflict && problem == "lease-lost":
		out.Result = LeaseLost
	case kind != Begin && status == http.StatusNotFound && problem == "not-found":
		out.Result = NotFound
	}
	if out.Result == Unexpected || out.Result == Unknown {
		out.Detail = shorten(string(raw))
	}
	return out
}

// millis parses an RFC 3339 time into Unix ms; 0 when absent.
func millis(s string) int64 {
	if s == "" {
		return 0
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return -1
	}
	return t.UnixMilli()
}
