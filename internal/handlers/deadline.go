// SPDX-License-Identifier: Apache-2.0

package handlers

import (
	"errors"
	"net/http"
	"time"

	"github.com/idemsvc/idemsvc/internal/api"
	"github.com/idemsvc/idemsvc/internal/httpserve"
	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// A large answer (a replay or a status with its stored response) gets a
// write deadline of its own, from when it starts being written: long
// enough for a client that reads at MinClientRate, short enough that a
// client that does not read lets go of the answer and its connection.
// Small answers fit in the socket buffers and need none.
const (
	DefaultWriteDeadlineBase = 5 * time.Second
	DefaultMinClientRate     = 1 << 20 // bytes per second
	// largeAnswer is the stored response size, body plus headers, from
	// which an answer gets its own deadline.
	largeAnswer = 64 << 10
)

// writeDeadline is how long an answer that carries r may take to write;
// zero for a small one.
func (s *Service) writeDeadline(r *api.StoredResponse) time.Duration {
	size := 0
	for name, value := range r.Headers {
		size += len(name) + len(value)
	}
	if r.Body != nil {
		if size+6*len(*r.Body) < largeAnswer { // small even if all escaped
			return 0
		}
		size += api.JSONStringLen(*r.Body)
	}
	if size < largeAnswer {
		return 0
	}
	return s.writeDeadlineBase + time.Duration(float64(size)/float64(s.minClientRate)*float64(time.Second))
}

// setWriteDeadline gives the rest of the answer d to be written. The
// deadline stays on the connection after the answer; http.Server sets the
// next one when it reads the next request, if its WriteTimeout is set, as
// idemsvc's is.
func setWriteDeadline(w http.ResponseWriter, d time.Duration) {
	// An error means the connection cannot take a deadline (an
	// httptest.ResponseRecorder); the server's WriteTimeout still holds.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(d))
}

// replayAnswer is a replay written under its own deadline, if it has one,
// and giving back its tenant's read slot once written, if it holds one.
// With body, that is the response's body, kept compressed, decoded as it
// is written (streamedBody).
type replayAnswer struct {
	api.BeginReplayResponse
	deadline time.Duration
	release  func()
	body     *streamedBody
}

func (a replayAnswer) VisitBeginResponse(w http.ResponseWriter) error {
	if a.release != nil {
		defer a.release()
	}
	if a.body != nil {
		return a.body.write(w, a.BeginReplayResponse.WriteWithBody)
	}
	if a.deadline > 0 {
		setWriteDeadline(w, a.deadline)
	}
	return a.BeginReplayResponse.VisitBeginResponse(w)
}

// statusAnswer is a status written under its own deadline, if it has one,
// and giving back its tenant's read slot once written, if it holds one.
type statusAnswer struct {
	api.StatusResponse
	deadline time.Duration
	release  func()
	body     *streamedBody
}

func (a statusAnswer) VisitGetStatusResponse(w http.ResponseWriter) error {
	if a.release != nil {
		defer a.release()
	}
	if a.body != nil {
		return a.body.write(w, a.StatusResponse.WriteWithBody)
	}
	if a.deadline > 0 {
		setWriteDeadline(w, a.deadline)
	}
	return a.StatusResponse.VisitGetStatusResponse(w)
}

// streamedBodyBytes is the memory an answer holds while it decodes a
// compressed body as it writes it: the decoder's state (a window of at
// most 256 KiB, about 260 KB in use for the 64 KiB of idemsvc's frames)
// and the buffers of the encoding; counted in the body budget.
const streamedBodyBytes = 320 << 10

// streamedBody is a replayed body kept compressed in its record, decoded
// as its answer is written: through one decoder of bounded window, never
// whole (statemachine.Response.OpenBody).
type streamedBody struct {
	s    *Service
	resp *statemachine.Response
}

// streamed returns the streamedBody of r, if its body is kept compressed
// and long (statemachine.StreamBodiesFrom).
func (s *Service) streamed(r *statemachine.Response) *streamedBody {
	if r.Zstd == "" || r.Body != "" {
		return nil
	}
	return &streamedBody{s: s, resp: r}
}

// write writes an answer with the body, under a write deadline that grows
// with what is written: the base, plus the bytes written so far at the
// clients' minimum rate (the escaped length of a body is not known before
// it is decoded). A body that fails to decode (a damaged record) cuts the
// answer off unfinished: a broken answer, never a whole wrong one.
func (b *streamedBody) write(w http.ResponseWriter, with func(http.ResponseWriter, *api.BodyStream) error) error {
	b.s.bodies.Hold(streamedBodyBytes)
	defer b.s.bodies.GiveBytes(streamedBodyBytes, httpserve.Claim{})
	rc := b.resp.OpenBody()
	defer rc.Close()
	pw := &pacedWriter{ResponseWriter: w, rc: http.NewResponseController(w), start: time.Now(),
		base: b.s.writeDeadlineBase, rate: float64(b.s.minClientRate)}
	err := with(pw, &api.BodyStream{R: rc, Base64: b.resp.Base64})
	if errors.Is(err, api.ErrBodyRead) {
		b.s.log.Error("a stored body failed to decode as it was replayed; the answer was cut off", "error", err)
		panic(http.ErrAbortHandler)
	}
	return err
}

// pacedWriter moves the connection's write deadline on as an answer is
// written: start + base + the bytes written at rate.
type pacedWriter struct {
	http.ResponseWriter
	rc    *http.ResponseController
	start time.Time
	base  time.Duration
	rate  float64 // bytes per second
	n     int64
}

func (p *pacedWriter) Write(b []byte) (int, error) {
	p.n += int64(len(b))
	// An error means the connection cannot take a deadline (an
	// httptest.ResponseRecorder); the server's WriteTimeout still holds.
	_ = p.rc.SetWriteDeadline(p.start.Add(p.base + time.Duration(float64(p.n)/p.rate*float64(time.Second))))
	return p.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (p *pacedWriter) Unwrap() http.ResponseWriter { return p.ResponseWriter }
