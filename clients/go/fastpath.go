// SPDX-License-Identifier: Apache-2.0

package idem

import (
	"context"
	"net/http"
	"net/url"
	"sync"
)

// fastPath makes the calls of an operation's path (begin, complete, fail,
// extend) without building an http.Request: their head is written ready
// once, and only their JSON body is written per call (encode.go). Answers are still
// parsed by the generated client (ParseBeginResponse and the like), and
// internal/clienttest checks that idemsvc receives the same requests this
// way as through the generated client.
type fastPath struct {
	wire *wire
	head []byte // Host, User-Agent, Authorization and Content-Type lines
	uris struct{ begin, complete, fail, extend, beginBatch, finishBatch string }
}

// newFastPath prepares the calls to server, the generated client's base URL
// (ending in "/"), with auth as the Authorization header ("" for none).
func newFastPath(w *wire, server, auth string) *fastPath {
	base, _ := url.Parse(server) // New parsed it already
	f := &fastPath{wire: w}
	uri := func(path string) string {
		ref, _ := base.Parse("." + path) // as the generated client resolves it
		return ref.RequestURI()
	}
	f.uris.begin, f.uris.complete = uri("/v1/begin"), uri("/v1/complete")
	f.uris.fail, f.uris.extend = uri("/v1/fail"), uri("/v1/extend")
	f.uris.beginBatch, f.uris.finishBatch = uri("/v1/begin/batch"), uri("/v1/finish/batch")
	head := "Host: " + base.Host + "\r\nUser-Agent: " + userAgent + "\r\nContent-Type: application/json\r\n"
	if auth != "" {
		head += "Authorization: " + auth + "\r\n"
	}
	f.head = []byte(head)
	return f
}

// post sends the JSON body that encode appends to uri.
func (f *fastPath) post(ctx context.Context, uri string, encode func([]byte) []byte) (*http.Response, error) {
	buf := bodies.Get().(*[]byte)
	body := encode((*buf)[:0])
	resp, err := f.send(ctx, uri, body)
	putBody(buf, body)
	return resp, err
}

// send sends body, ready, to uri.
func (f *fastPath) send(ctx context.Context, uri string, body []byte) (*http.Response, error) {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return f.wire.send(ctx, &request{method: http.MethodPost, uri: uri, head: f.head, requestID: id, body: body, resend: true})
}

// bodies are the buffers of request bodies, kept for the next calls unless
// they grew past maxPooledBody (a large stored response).
var bodies = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

const maxPooledBody = 64 << 10

func (c *Client) begin(ctx context.Context, body BeginRequest) (*BeginResponse, error) {
	if c.fast == nil {
		return c.api.BeginWithResponse(ctx, body)
	}
	resp, err := c.fast.post(ctx, c.fast.uris.begin, func(b []byte) []byte { return appendBeginRequest(b, &body) })
	if err != nil {
		return nil, err
	}
	return ParseBeginResponse(resp)
}

// complete decodes the answer's record only when decode is set; an error
// answer's problem is always decoded.
func (c *Client) complete(ctx context.Context, body CompleteRequest, decode bool) (*CompleteResponse, error) {
	if c.fast == nil {
		return c.api.CompleteWithResponse(ctx, body)
	}
	resp, err := c.fast.post(ctx, c.fast.uris.complete, func(b []byte) []byte { return appendCompleteRequest(b, &body) })
	if err != nil {
		return nil, err
	}
	if b, ok := resp.Body.(*bodyReader); ok && !decode && resp.StatusCode < 300 {
		return &CompleteResponse{Body: b.data, HTTPResponse: resp}, nil
	}
	return ParseCompleteResponse(resp)
}

func (c *Client) fail(ctx context.Context, body FailRequest) (*FailResponse, error) {
	if c.fast == nil {
		return c.api.FailWithResponse(ctx, body)
	}
	resp, err := c.fast.post(ctx, c.fast.uris.fail, func(b []byte) []byte { return appendFailRequest(b, &body) })
	if err != nil {
		return nil, err
	}
	return ParseFailResponse(resp)
}

func (c *Client) extend(ctx context.Context, body ExtendRequest) (*ExtendResponse, error) {
	if c.fast == nil {
		return c.api.ExtendWithResponse(ctx, body)
	}
	resp, err := c.fast.post(ctx, c.fast.uris.extend, func(b []byte) []byte { return appendExtendRequest(b, &body) })
	if err != nil {
		return nil, err
	}
	return ParseExtendResponse(resp)
}
