// SPDX-License-Identifier: Apache-2.0

package handlers

import (
	"net/http"
	"time"

	"github.com/idemsvc/idemsvc/internal/api"
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
type replayAnswer struct {
	api.BeginReplayResponse
	deadline time.Duration
	release  func()
}

func (a replayAnswer) VisitBeginResponse(w http.ResponseWriter) error {
	if a.release != nil {
		defer a.release()
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
}

func (a statusAnswer) VisitGetStatusResponse(w http.ResponseWriter) error {
	if a.release != nil {
		defer a.release()
	}
	if a.deadline > 0 {
		setWriteDeadline(w, a.deadline)
	}
	return a.StatusResponse.VisitGetStatusResponse(w)
}
