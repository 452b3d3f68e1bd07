// SPDX-License-Identifier: Apache-2.0

package robustness

import (
	"fmt"
	"math"

	"github.com/anishathalye/porcupine"
)

// phase is the state of a record in the model.
type phase uint8

const (
	absent phase = iota
	inProgress
	completed
	failedTerminal
	released // failed retryably: the next begin acquires
)

var phaseNames = [...]string{"absent", "in_progress", "completed", "failed", "released"}

func (p phase) String() string { return phaseNames[p] }

// never is a lease expiry not yet bounded from above.
const never = math.MaxInt64

// clockSlack absorbs the rounding of Redis's clock and the wall clock to
// whole milliseconds.
const clockSlack = 1

// record is the model of one key's record. Lease expiry is known only
// within [leaseLo, leaseHi] after a call with an unknown outcome acquired
// or extended it; token is "" when an acquisition's token is unknown.
// nowLB is a lower bound of Redis's clock at the last operation
// linearized: operations take effect in the order of Redis's clock.
type record struct {
	phase       phase
	attempt     int64
	token       string
	owner       string
	fingerprint string
	leaseLo     int64
	leaseHi     int64
	body        string
	nowLB       int64
}

// Model is the porcupine model of one key's record, partitioned by key.
// Its Step follows the contract (and begin.lua, complete.lua, fail.lua,
// extend.lua): each definite answer must be one the record could give at
// some moment of the call, and an unknown answer may or may not have
// taken effect.
var Model = porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var order []string
		for _, op := range history {
			k := op.Metadata.(string)
			if _, ok := byKey[k]; !ok {
				order = append(order, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(order))
		for _, k := range order {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() []any { return []any{record{}} },
	Step: func(state, input, output any) []any {
		s, in, out := state.(record), input.(Input), output.(Output)
		if out.Result == Unknown {
			return append([]any{s}, effects(s, in)...)
		}
		if next, ok := step(s, in, out); ok {
			return []any{next}
		}
		return nil
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(Input), output.(Output)
		return describe(in, out)
	},
	DescribeState: func(state any) string {
		s := state.(record)
		hi := "?"
		if s.leaseHi != never {
			hi = fmt.Sprint(s.leaseHi % 100000)
		}
		return fmt.Sprintf("%s attempt=%d token=%.8s owner=%s fp=%s lease=[%d,%s] body=%s now>=%d",
			s.phase, s.attempt, s.token, s.owner, s.fingerprint, s.leaseLo%100000, hi, s.body, s.nowLB%100000)
	},
	DescribeOperationMetadata: func(info any) string { return fmt.Sprint(info) },
}

func describe(in Input, out Output) string {
	var call string
	switch in.Kind {
	case Begin:
		call = fmt.Sprintf("begin(owner=%s fp=%s lease=%d wait=%d)", in.Owner, in.Fingerprint, in.LeaseMs, in.WaitMs)
	case Complete:
		call = fmt.Sprintf("complete(%.8s, %s)", in.Token, in.Body)
	case Fail:
		call = fmt.Sprintf("fail(%.8s, retryable=%t, %s)", in.Token, in.Retryable, in.Body)
	case Extend:
		call = fmt.Sprintf("extend(%.8s, %d)", in.Token, in.LeaseMs)
	}
	switch out.Result {
	case Acquired, Extended, InProgress:
		return fmt.Sprintf("%s -> %s attempt=%d token=%.8s exp=%d recovered=%t", call, out.Result, out.Attempt, out.Token, out.LeaseExp%100000, out.Recovered)
	case ReplayCompleted, ReplayFailed, Finished:
		return fmt.Sprintf("%s -> %s attempt=%d at=%d body=%s", call, out.Result, out.Attempt, out.At%100000, out.Body)
	}
	return fmt.Sprintf("%s -> %s %d %s", call, out.Result, out.Status, out.Detail)
}

// mismatch reports whether a begin with fingerprint fp is refused by the
// record: both carry a fingerprint and they differ.
func (s record) mismatch(fp string) bool {
	return s.phase != absent && fp != "" && s.fingerprint != "" && s.fingerprint != fp
}

// after returns s with nowLB raised to at least t.
func (s record) after(t int64) record {
	s.nowLB = max(s.nowLB, t)
	return s
}

// effects returns the states a call with an unknown outcome may have
// left, besides leaving the record unchanged.
func effects(s record, in Input) []any {
	t := max(s.nowLB, in.CallMs) // the earliest the call can take effect
	switch in.Kind {
	case Begin:
		if s.mismatch(in.Fingerprint) {
			return nil
		}
		var next record
		switch s.phase {
		case absent:
			next = record{phase: inProgress, attempt: 1, fingerprint: in.Fingerprint}
		case released, inProgress:
			if s.phase == inProgress {
				// A takeover happens once the lease has run out.
				t = max(t, s.leaseLo)
			}
			next = s
			next.phase, next.attempt, next.body = inProgress, s.attempt+1, ""
			if in.Fingerprint != "" {
				next.fingerprint = in.Fingerprint
			}
		default:
			return nil
		}
		next.token, next.owner = "", in.Owner
		next.leaseLo, next.leaseHi, next.nowLB = t+in.LeaseMs, never, t
		return []any{next}
	case Complete, Fail:
		if s.phase != inProgress || (s.token != "" && s.token != in.Token) {
			return nil
		}
		next := s.after(t)
		next.token, next.body = in.Token, in.Body
		switch {
		case in.Kind == Complete:
			next.phase = completed
		case in.Retryable:
			next.phase, next.body = released, ""
		default:
			next.phase = failedTerminal
		}
		return []any{next}
	case Extend:
		if s.phase != inProgress || (s.token != "" && s.token != in.Token) {
			return nil
		}
		next := s.after(t)
		next.token = in.Token
		next.leaseLo, next.leaseHi = t+in.LeaseMs, never
		return []any{next}
	}
	return nil
}

// step applies a call with a definite answer to s, or reports that the
// record could not have given that answer.
func step(s record, in Input, out Output) (record, bool) {
	call := max(s.nowLB, in.CallMs) // the earliest the call can take effect
	switch in.Kind {
	case Begin:
		return stepBegin(s, in, out, call)
	case Complete, Fail:
		return stepFinish(s, in, out, call)
	case Extend:
		return stepExtend(s, in, out, call)
	}
	return s, false
}

func stepBegin(s record, in Input, out Output, call int64) (record, bool) {
	switch out.Result {
	case Mismatch:
		return s.after(call), s.mismatch(in.Fingerprint)
	case ReplayCompleted, ReplayFailed:
		want := completed
		if out.Result == ReplayFailed {
			want = failedTerminal
		}
		ok := s.phase == want && !s.mismatch(in.Fingerprint) && s.attempt == out.Attempt && s.body == out.Body
		return s.after(call), ok
	case InProgress:
		// Someone else's lease is live at some moment of the call.
		ok := s.phase == inProgress && !s.mismatch(in.Fingerprint) && s.attempt == out.Attempt &&
			(in.Owner == "" || in.Owner != s.owner) &&
			s.leaseLo <= out.LeaseExp && out.LeaseExp <= s.leaseHi && out.LeaseExp+clockSlack > call
		next := s.after(call)
		next.leaseLo, next.leaseHi = out.LeaseExp, out.LeaseExp
		return next, ok
	case Acquired:
	default:
		return s, false
	}
	if s.mismatch(in.Fingerprint) {
		return s, false
	}
	// The same owner begins its live lease again: the same lease back.
	if s.phase == inProgress && in.Owner != "" && in.Owner == s.owner && s.attempt == out.Attempt &&
		(s.token == "" || s.token == out.Token) &&
		s.leaseLo <= out.LeaseExp && out.LeaseExp <= s.leaseHi && out.LeaseExp+clockSlack > call {
		next := s.after(call)
		next.token, next.leaseLo, next.leaseHi = out.Token, out.LeaseExp, out.LeaseExp
		return next, true
	}
	// A new acquisition, made at Redis time now.
	now := out.LeaseExp - in.LeaseMs
	if now+clockSlack < call || now > out.RetMs+clockSlack || out.Token == s.token && s.token != "" {
		return s, false
	}
	var ok bool
	switch s.phase {
	case absent:
		ok = out.Attempt == 1 && !out.Recovered
	case released:
		ok = out.Attempt == s.attempt+1 && !out.Recovered
	case inProgress:
		ok = out.Attempt == s.attempt+1 && out.Recovered && s.leaseLo <= now+clockSlack
	}
	next := record{phase: inProgress, attempt: out.Attempt, token: out.Token, owner: in.Owner,
		fingerprint: s.fingerprint, leaseLo: out.LeaseExp, leaseHi: out.LeaseExp, nowLB: max(s.nowLB, now)}
	if s.phase == absent || in.Fingerprint != "" {
		next.fingerprint = in.Fingerprint
	}
	return next, ok
}

func stepFinish(s record, in Input, out Output, call int64) (record, bool) {
	target := completed
	switch {
	case in.Kind == Complete:
	case in.Retryable:
		target = released
	default:
		target = failedTerminal
	}
	switch out.Result {
	case Finished:
		if s.attempt != out.Attempt {
			return s, false
		}
		if out.At > out.RetMs+clockSlack {
			return s, false
		}
		if s.phase == inProgress && (s.token == "" || s.token == in.Token) && out.At+clockSlack >= s.nowLB {
			next := s.after(out.At)
			next.phase, next.token, next.body = target, in.Token, in.Body
			if target == released {
				next.body = ""
			}
			return next, true
		}
		// A retry of the call that finished the attempt.
		sameBody := s.body == in.Body || target == released
		return s.after(call), s.phase == target && s.token == in.Token && sameBody
	case LeaseLost:
		ok := s.phase != absent && (s.token != in.Token || s.token == "" ||
			(in.Kind == Complete && s.phase != inProgress && s.phase != completed) ||
			(in.Kind == Fail && s.phase == completed))
		return s.after(call), ok
	case NotFound:
		return s.after(call), s.phase == absent
	}
	return s, false
}

func stepExtend(s record, in Input, out Output, call int64) (record, bool) {
	switch out.Result {
	case Extended:
		now := out.LeaseExp - in.LeaseMs
		ok := s.phase == inProgress && (s.token == "" || s.token == in.Token) && s.attempt == out.Attempt &&
			now+clockSlack >= call && now <= out.RetMs+clockSlack
		next := s.after(now)
		next.token, next.leaseLo, next.leaseHi = in.Token, out.LeaseExp, out.LeaseExp
		return next, ok
	case LeaseLost:
		ok := s.phase != absent && (s.token != in.Token || s.token == "" || s.phase != inProgress)
		return s.after(call), ok
	case NotFound:
		return s.after(call), s.phase == absent
	}
	return s, false
}
