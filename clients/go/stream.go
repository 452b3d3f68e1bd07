// SPDX-License-Identifier: Apache-2.0

package idem

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"strconv"
	"time"
)

// ErrBodyMismatch is a streamed stored body whose bytes do not match its
// SHA-256: the stream is broken, never to be taken as the answer.
var ErrBodyMismatch = errors.New("idem: stored body does not match its SHA-256")

// CompleteStream completes the attempt with a response whose body is
// streamed from body (POST /v1/complete/stream): up to idemsvc's
// IDEMSVC_MAX_STORED_BYTES (64 MiB by default) with a blob store, without
// ever holding it whole. A body that is an io.Seeker is sent again from
// its start when a try fails with 503 (the blob store down, say) within
// the retry budget; any other is sent once.
func (c *Client) CompleteStream(ctx context.Context, key, token string, status int, headers map[string]string, body io.Reader, retention time.Duration) (FinishResult, error) {
	params := &CompleteStreamParams{IdemKey: key, IdemLeaseToken: token, IdemTenant: c.tenant}
	if status != 0 {
		params.IdemResponseStatus = &status
	}
	if len(headers) > 0 {
		b, err := json.Marshal(headers)
		if err != nil {
			return FinishResult{}, fmt.Errorf("idem: complete: headers: %w", err)
		}
		h := asciiJSON(b)
		params.IdemResponseHeaders = &h
	}
	if retention > 0 {
		s := int64(retention / time.Second)
		params.IdemRetentionS = &s
	}
	seeker, canRetry := body.(io.Seeker)
	var out FinishResult
	tries := 0
	err := c.call(ctx, "complete", c.callTimeout+10*time.Minute, func(ctx context.Context) (*http.Response, []byte, error) {
		if tries++; tries > 1 {
			if !canRetry {
				return nil, nil, &finalError{errors.New("the body was sent once and cannot be sent again")}
			}
			if _, err := seeker.Seek(0, io.SeekStart); err != nil {
				return nil, nil, err
			}
		}
		resp, err := c.api.ClientInterface.CompleteStreamWithBody(ctx, params, "application/octet-stream", io.NopCloser(body))
		if err != nil && !canRetry {
			// Sent in part, or its source failed: it cannot be sent again.
			return nil, nil, &finalError{&unreachableError{err}}
		}
		if err != nil {
			return nil, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if err != nil {
			return nil, nil, err
		}
		if resp.StatusCode == http.StatusOK {
			_ = json.Unmarshal(b, &out)
		}
		return resp, b, nil
	})
	return out, err
}

// asciiJSON escapes the non-ASCII characters of a JSON text as \uXXXX, so
// that it travels in an HTTP header field.
func asciiJSON(b []byte) string {
	out := make([]byte, 0, len(b))
	for _, r := range string(b) {
		switch {
		case r < 0x80:
			out = append(out, byte(r))
		case r > 0xffff:
			r -= 0x10000
			out = fmt.Appendf(out, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
		default:
			out = fmt.Appendf(out, `\u%04x`, r)
		}
	}
	return string(out)
}

// OpenBody streams the stored body of a finished key (GET /v1/keys/body),
// checked against its SHA-256 (a replay's BodyRef): the reader fails with
// ErrBodyMismatch, rather than ending, when the bytes are not the stored
// ones. A 503 (the blob store down, the object missing) is ErrUnavailable.
func (c *Client) OpenBody(ctx context.Context, key string) (io.ReadCloser, int64, error) {
	resp, err := c.api.ClientInterface.GetBody(ctx, &GetBodyParams{Key: key, Tenant: c.tenant})
	if err != nil {
		return nil, 0, &opError{"body", &unreachableError{err}}
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		e := &Error{StatusCode: resp.StatusCode, Problem: problemOf(resp, b)}
		if s, perr := strconv.Atoi(resp.Header.Get("Retry-After")); perr == nil && s > 0 {
			e.RetryAfter = time.Duration(s) * time.Second
		}
		return nil, 0, within(key, &opError{"body", e})
	}
	v := &checked{body: resp.Body, left: resp.ContentLength, hash: sha256.New()}
	if d := resp.Header.Get("Repr-Digest"); len(d) > len("sha-256=::") {
		v.want = d[len("sha-256=:") : len(d)-1]
	}
	return v, resp.ContentLength, nil
}

// checked reads a body and checks its SHA-256 (Repr-Digest) at its end.
type checked struct {
	body io.ReadCloser
	left int64
	hash hash.Hash
	want string // base64, as Repr-Digest gives it
}

func (v *checked) Read(p []byte) (int, error) {
	n, err := v.body.Read(p)
	v.hash.Write(p[:n])
	v.left -= int64(n)
	if err == io.EOF {
		if v.left != 0 || (v.want != "" && v.want != base64.StdEncoding.EncodeToString(v.hash.Sum(nil))) {
			return n, ErrBodyMismatch
		}
	}
	return n, err
}

func (v *checked) Close() error { return v.body.Close() }

// errStreamTooLarge ends a stream whose body passed its bound.
var errStreamTooLarge = errors.New("idem: the streamed body is over MaxStreamedBodyBytes")

// bodyStream stores an answer's body as it is written: a CompleteStream
// reading from a pipe that the handler's writes feed, so that the handler
// goes at idemsvc's pace and nothing is held.
type bodyStream struct {
	pw      *io.PipeWriter
	written int64
	max     int64
	broken  bool
	done    chan struct{}
	err     error
}

func startStream(ctx context.Context, c *Client, key, token string, status int, headers map[string]string, retention time.Duration, max int64) *bodyStream {
	pr, pw := io.Pipe()
	s := &bodyStream{pw: pw, max: max, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		_, s.err = c.CompleteStream(ctx, key, token, status, headers, pr, retention)
		pr.CloseWithError(errors.New("idem: the complete ended"))
	}()
	return s
}

// write passes b on; past max, or once the complete ended, the stream is
// broken and b goes nowhere (the caller still gets it).
func (s *bodyStream) write(b []byte) {
	if s.broken {
		return
	}
	if s.written += int64(len(b)); s.written > s.max {
		s.broken = true
		s.pw.CloseWithError(errStreamTooLarge)
		<-s.done
		s.err = errStreamTooLarge
		return
	}
	if _, err := s.pw.Write(b); err != nil {
		s.broken = true
	}
}

// finish ends the body and returns the complete's outcome.
func (s *bodyStream) finish() error {
	if !s.broken {
		s.pw.Close()
	}
	<-s.done
	return s.err
}

// writeStreamedReplay answers with a stored response whose body idemsvc
// keeps by reference: status and headers, then the body as it comes. A
// body that cannot be fetched gets 503 before anything is written; one
// that fails its check midway cuts the answer off.
func writeStreamedReplay(ctx context.Context, w http.ResponseWriter, c *Client, key string, replay *BeginReplay) {
	body, size, err := c.OpenBody(ctx, key)
	if err != nil {
		writeBeginError(w, err)
		return
	}
	defer body.Close()
	resp := replay.Response
	for name, value := range resp.Headers {
		w.Header().Set(name, value)
	}
	w.Header().Set(ReplayedHeader, "true")
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	status := http.StatusOK
	if resp.StatusCode != nil {
		status = *resp.StatusCode
	}
	w.WriteHeader(status)
	if _, err := io.CopyBuffer(w, body, make([]byte, 32<<10)); err != nil && !errors.Is(err, http.ErrHandlerTimeout) {
		// A broken or wrong body: never completed as if whole.
		panic(http.ErrAbortHandler)
	}
}
