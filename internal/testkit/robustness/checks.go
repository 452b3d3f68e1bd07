// SPDX-License-Identifier: Apache-2.0

package robustness

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Violations counts breaches of each invariant; Examples describes the
// first few of each.
type Violations struct {
	LostCompletions   int // an acknowledged outcome later not replayed
	DoubleCompletions int // two attempts of one key both acknowledged as finished
	AttemptOrder      int // attempts not strictly increasing
	SupersededToken   int // a 200 for a token after a later attempt was acquired
	Unexpected        int // a 500 or another answer the contract does not allow
	Examples          []string
	// Keys are the keys with a violation.
	Keys map[string]bool
	// LostAcks are the return times of the acknowledgements later lost.
	LostAcks []int64
}

// Total returns the number of violations.
func (v Violations) Total() int {
	return v.LostCompletions + v.DoubleCompletions + v.AttemptOrder + v.SupersededToken + v.Unexpected
}

const maxExamples = 20

func (v *Violations) note(key, format string, args ...any) {
	if v.Keys == nil {
		v.Keys = map[string]bool{}
	}
	v.Keys[key] = true
	if len(v.Examples) < maxExamples {
		v.Examples = append(v.Examples, fmt.Sprintf(format, args...))
	}
}

// byKey groups operations by key, each group in call order.
func byKey(ops []Op) map[string][]Op {
	m := map[string][]Op{}
	for _, op := range ops {
		m[op.Key] = append(m[op.Key], op)
	}
	for _, g := range m {
		sort.SliceStable(g, func(i, j int) bool { return g[i].Call < g[j].Call })
	}
	return m
}

// acknowledged reports whether op is an acknowledged final outcome: a
// complete, or a terminal fail, answered 200.
func acknowledged(op Op) bool {
	return op.Out.Result == Finished && (op.In.Kind == Complete || op.In.Kind == Fail && !op.In.Retryable)
}

// CheckInvariants checks the history against the promises that need no
// model: no acknowledged outcome is lost, at most one attempt of a key is
// acknowledged as finished, attempts strictly increase, no 200 answers a
// token after a later attempt was acquired, and no answer is a 500 or
// outside the contract.
func CheckInvariants(ops []Op) Violations {
	var v Violations
	for key, g := range byKey(ops) {
		checkKey(&v, key, g)
	}
	return v
}

func checkKey(v *Violations, key string, g []Op) {
	for _, op := range g {
		if op.Out.Result == Unexpected {
			v.Unexpected++
			v.note(key, "unexpected answer: %s", op)
		}
	}

	// The first acknowledged outcome, and whether a later begin saw
	// another.
	var first *Op
	for i := range g {
		if acknowledged(g[i]) && (first == nil || g[i].Return < first.Return) {
			first = &g[i]
		}
	}
	if first != nil {
		for _, op := range g {
			if op.In.Kind != Begin || op.Call <= first.Return || op.Out.Result == Unknown || op.Out.Result == Mismatch || op.Out.Result == Unexpected {
				continue
			}
			want := ReplayCompleted
			if first.In.Kind == Fail {
				want = ReplayFailed
			}
			if op.Out.Result != want || op.Out.Attempt != first.Out.Attempt || op.Out.Body != first.In.Body {
				v.LostCompletions++
				v.LostAcks = append(v.LostAcks, first.Return)
				v.note(key, "lost acknowledged outcome: %s acknowledged by\n    %s\n  then\n    %s", key, first, op)
				break
			}
		}
	}

	// At most one attempt acknowledged as finished.
	finished := map[int64]Op{}
	for _, op := range g {
		if acknowledged(op) {
			finished[op.Out.Attempt] = op
		}
	}
	if len(finished) > 1 {
		v.DoubleCompletions++
		var lines []string
		for _, op := range finished {
			lines = append(lines, op.String())
		}
		slices.Sort(lines)
		v.note(key, "two attempts acknowledged as finished: %s\n    %s", key, strings.Join(lines, "\n    "))
	}

	// Each token has one attempt, and attempts grow with Redis's clock of
	// their acquisition and with real time.
	type acq struct {
		op  Op
		now int64
	}
	var acqs []acq
	seen := map[string]int64{}
	for _, op := range g {
		if op.Out.Result != Acquired {
			continue
		}
		if a, ok := seen[op.Out.Token]; ok {
			if a != op.Out.Attempt {
				v.AttemptOrder++
				v.note(key, "one token, two attempts (%d, %d): %s", a, op.Out.Attempt, op)
			}
			continue
		}
		seen[op.Out.Token] = op.Out.Attempt
		acqs = append(acqs, acq{op, op.Out.LeaseExp - op.In.LeaseMs})
	}
	for i := range acqs {
		for j := range acqs {
			a, b := acqs[i], acqs[j]
			earlier := a.now < b.now || a.op.Return < b.op.Call
			if i != j && earlier && a.op.Out.Attempt >= b.op.Out.Attempt {
				v.AttemptOrder++
				v.note(key, "attempts not increasing: %s\n    %s\n  then\n    %s", key, a.op, b.op)
			}
		}
	}

	// No 200 for a token once a later attempt was acquired.
	for _, op := range g {
		if op.In.Kind == Begin || (op.Out.Result != Finished && op.Out.Result != Extended) {
			continue
		}
		for _, a := range acqs {
			if a.op.Out.Attempt > op.Out.Attempt && a.op.Return < op.Call {
				v.SupersededToken++
				v.note(key, "200 for a superseded token: %s\n    %s\n  after\n    %s", key, op, a.op)
				break
			}
		}
	}
}

// unknownSpan bounds how long after its call a call with an unknown
// outcome can take effect. It is far longer than any fault lasts (a
// paused Redis runs the scripts in its buffers when it resumes) plus
// idemsvc's and the traffic's timeouts.
const unknownSpan = 30 * time.Second

// Linearizability is the outcome of checking every key against Model.
type Linearizability struct {
	Keys    int
	Illegal []string // keys whose history no order explains
	// TimedOut are keys the checker could not decide in time.
	TimedOut []string
	// Visualization is the HTML file that shows the failing keys.
	Visualization string
}

// OK reports whether every key was shown linearizable.
func (l Linearizability) OK() bool { return len(l.Illegal) == 0 && len(l.TimedOut) == 0 }

// porcupineOps turns the history into porcupine operations. An operation
// with an unknown outcome may take effect at any time after its call up
// to unknownSpan later, so it returns then (or at the end of the
// history), in a row of its own.
func porcupineOps(ops []Op, clients int) []porcupine.Operation {
	var end int64
	for _, op := range ops {
		end = max(end, op.Return)
	}
	out := make([]porcupine.Operation, 0, len(ops))
	extra := clients
	for _, op := range ops {
		p := porcupine.Operation{ClientId: op.Client, Input: op.In, Output: op.Out, Call: op.Call, Return: op.Return, Metadata: op.Key}
		if op.Out.Result == Unknown {
			p.Return = min(end+1, op.Call+int64(unknownSpan))
			p.ClientId = extra
			extra++
		}
		out = append(out, p)
	}
	return out
}

// CheckLinearizable checks each key's history against Model, with timeout
// per key. When a key fails, it writes porcupine's visualization of the
// failing keys into dir.
//
// Calls with an unknown outcome make the search exponential, so each key
// is first checked without them, then with only the first call of each
// chain of retries, and only then whole. Dropping calls with an unknown
// outcome is sound in one direction: if the history without them is
// linearizable, so is the whole history, where they take effect last as
// no-ops. Only the whole history can show a key non-linearizable.
//
// A key in broken (one that broke an invariant) cannot be linearizable,
// since the invariants follow from the model: it is checked whole, for
// the visualization, and counted non-linearizable even if the check times
// out.
func CheckLinearizable(ops []Op, broken map[string]bool, clients int, timeout time.Duration, dir string) (Linearizability, error) {
	var l Linearizability
	model := Model.ToModel()
	var bad []porcupine.Operation
	for key, g := range byKey(ops) {
		l.Keys++
		res := porcupine.Unknown
		for _, reduced := range [][]Op{withoutUnknown(g), firstOfRetries(g)} {
			if broken[key] {
				break
			}
			if len(reduced) < len(g) && porcupine.CheckOperationsTimeout(model, porcupineOps(reduced, clients), timeout/4) == porcupine.Ok {
				res = porcupine.Ok
				break
			}
		}
		if res != porcupine.Ok {
			to := timeout
			if broken[key] {
				to = timeout / 4
			}
			res = porcupine.CheckOperationsTimeout(model, porcupineOps(g, clients), to)
			if res == porcupine.Unknown && broken[key] {
				res = porcupine.Illegal
			}
		}
		switch res {
		case porcupine.Illegal:
			l.Illegal = append(l.Illegal, key)
			bad = append(bad, porcupineOps(g, clients)...)
		case porcupine.Unknown:
			l.TimedOut = append(l.TimedOut, key)
		}
	}
	slices.Sort(l.Illegal)
	slices.Sort(l.TimedOut)
	if len(bad) == 0 {
		return l, nil
	}
	_, info := porcupine.CheckOperationsVerbose(model, bad, timeout)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return l, fmt.Errorf("artifact directory: %w", err)
	}
	l.Visualization = filepath.Join(dir, "linearizability.html")
	if err := porcupine.VisualizePath(model, info, l.Visualization); err != nil {
		return l, fmt.Errorf("visualize: %w", err)
	}
	return l, nil
}

func withoutUnknown(g []Op) []Op {
	out := make([]Op, 0, len(g))
	for _, op := range g {
		if op.Out.Result != Unknown {
			out = append(out, op)
		}
	}
	return out
}

// firstOfRetries drops the retries of a call with an unknown outcome
// that are themselves unknown: same client, same call.
func firstOfRetries(g []Op) []Op {
	out := make([]Op, 0, len(g))
	type call struct {
		client       int
		kind         Kind
		owner, token string
	}
	last := map[int]call{}
	for _, op := range g {
		c := call{op.Client, op.In.Kind, op.In.Owner, op.In.Token}
		prev, seen := last[op.Client]
		last[op.Client] = c
		if op.Out.Result == Unknown && seen && prev == c && (c.owner != "" || c.token != "") {
			continue
		}
		out = append(out, op)
	}
	return out
}

// Recovery is the time from a fault to the first definite answer for
// every key it disturbed.
type Recovery struct {
	Fault    Fault
	Affected int           // keys that got no definite answer after the fault
	Worst    time.Duration // until the last of them got one again
	// Unrecovered keys got no definite answer before the next fault or
	// the end of the run; Worst then counts to that point.
	Unrecovered int
}

// MeasureAvailability computes each fault's recovery time from the
// history: for each key that got an unknown answer to a call made after
// the fault (and before the next) and was called again, the time from
// the fault until a call to that key got a definite answer again. Calls
// still running at end, when the traffic stopped, are left out.
func MeasureAvailability(ops []Op, faults []Fault, end int64) []Recovery {
	sort.SliceStable(faults, func(i, j int) bool { return faults[i].At < faults[j].At })
	groups := byKey(ops)
	out := make([]Recovery, 0, len(faults))
	for i, f := range faults {
		until := end
		if i+1 < len(faults) {
			until = faults[i+1].At
		}
		r := Recovery{Fault: f}
		for _, g := range groups {
			disturbed, calledAgain := false, false
			recovered := int64(-1)
			for _, op := range g {
				if op.Call < f.At || op.Call >= until || op.Return >= end {
					continue
				}
				calledAgain = disturbed
				if op.Out.Result == Unknown {
					disturbed = true
				} else if disturbed && op.Out.Result != Unexpected {
					recovered = op.Return
					break
				}
			}
			// A key nobody called again after its unknown answer tells
			// nothing about recovery.
			if !disturbed || !calledAgain {
				continue
			}
			r.Affected++
			if recovered < 0 {
				r.Unrecovered++
				recovered = until
			}
			r.Worst = max(r.Worst, time.Duration(recovered-f.At))
		}
		out = append(out, r)
	}
	return out
}

// keepsAcknowledged names the faults that cannot by themselves lose a
// write Redis acknowledged: they touch idemsvc, the network between
// idemsvc and Redis, or a replica whose master stays.
var keepsAcknowledged = map[string]bool{
	"kill-idemsvc": true, "pause-idemsvc": true,
	"latency": true, "reset": true, "black-hole": true,
	"kill-replica": true, "pause-replica": true,
}

// Blame attributes each lost acknowledgement to a fault that can lose one:
// the last one that began at most window before it (a fault in progress,
// such as a replica cut off), or else the first one after it (such as a
// restart).
func Blame(lostAcks []int64, faults []Fault, window time.Duration) map[string]int {
	faults = slices.DeleteFunc(slices.Clone(faults), func(f Fault) bool { return keepsAcknowledged[f.Name] })
	out := map[string]int{}
	for _, at := range lostAcks {
		name := "none"
		for _, f := range faults {
			if f.At <= at && at-f.At <= int64(window) {
				name = f.Name
			}
		}
		if name == "none" {
			for _, f := range faults {
				if f.At > at {
					name = f.Name
					break
				}
			}
		}
		out[name]++
	}
	return out
}
