// SPDX-License-Identifier: Apache-2.0

package robustness

import (
	"fmt"
	"sort"
	"sync"
	"time"
)

// Kind is the API call an operation made.
type Kind uint8

// The calls the traffic makes.
const (
	Begin Kind = iota
	Complete
	Fail
	Extend
)

func (k Kind) String() string {
	switch k {
	case Begin:
		return "begin"
	case Complete:
		return "complete"
	case Fail:
		return "fail"
	case Extend:
		return "extend"
	}
	return fmt.Sprintf("kind(%d)", k)
}

// Result is what an answer said, decoded from its status and body.
type Result uint8

// The answers the traffic can get.
const (
	// Unknown: no definite answer (timeout, broken connection, 503): the
	// call may or may not have taken effect.
	Unknown Result = iota
	Acquired
	ReplayCompleted
	ReplayFailed
	InProgress
	Mismatch
	Finished // complete or fail stored (or a retry of the call that stored it)
	Extended
	LeaseLost
	NotFound
	// Unexpected: any other answer, such as a 500 or a 400; a violation.
	Unexpected
)

var resultNames = [...]string{"unknown", "acquired", "replay-completed", "replay-failed", "in-progress",
	"mismatch", "finished", "extended", "lease-lost", "not-found", "unexpected"}

func (r Result) String() string {
	if int(r) < len(resultNames) {
		return resultNames[r]
	}
	return fmt.Sprintf("result(%d)", r)
}

// Input is what an operation sent.
type Input struct {
	Kind        Kind
	Owner       string
	Fingerprint string
	LeaseMs     int64
	WaitMs      int64
	Token       string // complete, fail, extend
	Body        string // the response complete or fail stores
	Retryable   bool   // fail
	// CallMs is the wall clock at the call, in Unix ms. idemsvc and Redis
	// run on this host, so it bounds Redis's clock at the operation.
	CallMs int64
}

// Output is what an operation got back.
type Output struct {
	Result    Result
	Status    int // HTTP status; 0 when none arrived
	Attempt   int64
	Token     string
	Recovered bool
	// LeaseExp is lease_expires_at (acquired, extended, in progress), in
	// Unix ms of Redis's clock.
	LeaseExp int64
	// At is completed_at or failed_at, in Unix ms of Redis's clock.
	At   int64
	Body string // the replayed response body
	// Detail describes an unknown or unexpected answer, for reports.
	Detail string
	RetMs  int64
}

// Op is one recorded call: what it sent, what it got and when. Call and
// Return are nanoseconds since the run started.
type Op struct {
	Key      string
	Client   int
	Instance int
	In       Input
	Out      Output
	Call     int64
	Return   int64
}

func (op Op) String() string {
	return fmt.Sprintf("%s %s(owner=%q fp=%q token=%.8s lease=%d body=%q) -> %s status=%d attempt=%d token=%.8s exp=%d at=%d body=%q %s",
		op.Key, op.In.Kind, op.In.Owner, op.In.Fingerprint, op.In.Token, op.In.LeaseMs, op.In.Body,
		op.Out.Result, op.Out.Status, op.Out.Attempt, op.Out.Token, op.Out.LeaseExp, op.Out.At, op.Out.Body, op.Out.Detail)
}

// Fault is one injected failure.
type Fault struct {
	Name string
	At   int64 // ns since the run started
}

// Recorder collects operations and faults from concurrent clients.
type Recorder struct {
	start time.Time

	mu     sync.Mutex
	ops    []Op
	faults []Fault
}

// NewRecorder starts a history whose times count from now.
func NewRecorder() *Recorder { return &Recorder{start: time.Now()} }

// Now returns the time since the run started, on the monotonic clock.
func (r *Recorder) Now() int64 { return int64(time.Since(r.start)) }

// Add records an operation.
func (r *Recorder) Add(op Op) {
	r.mu.Lock()
	r.ops = append(r.ops, op)
	r.mu.Unlock()
}

// AddFault records a fault injected now.
func (r *Recorder) AddFault(name string) {
	r.mu.Lock()
	r.faults = append(r.faults, Fault{Name: name, At: r.Now()})
	r.mu.Unlock()
}

// History returns the operations and faults recorded so far, operations
// in call order.
func (r *Recorder) History() ([]Op, []Fault) {
	r.mu.Lock()
	ops := append([]Op(nil), r.ops...)
	faults := append([]Fault(nil), r.faults...)
	r.mu.Unlock()
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
	return ops, faults
}
