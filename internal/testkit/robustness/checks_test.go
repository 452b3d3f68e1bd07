// SPDX-License-Identifier: Apache-2.0

package robustness

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// t0 is Redis's clock (Unix ms) at the start of the hand-made histories.
const t0 = 1_800_000_000_000

// op builds an operation called at t0+call ms and answered at t0+ret ms.
func op(client int, call, ret int64, in Input, out Output) Op {
	in.CallMs, out.RetMs = t0+call, t0+ret
	return Op{Key: "k", Client: client, In: in, Out: out, Call: call * 1e6, Return: ret * 1e6}
}

// acquire is a begin with a 500 ms lease that acquired at t0+at.
func acquire(client int, call, at, ret int64, owner, token string, attempt int64, recovered bool) Op {
	return op(client, call, ret, Input{Kind: Begin, Owner: owner, LeaseMs: 500},
		Output{Result: Acquired, Status: 201, Attempt: attempt, Token: token, LeaseExp: t0 + at + 500, Recovered: recovered})
}

func complete(client int, call, at, ret int64, token, body string, attempt int64) Op {
	return op(client, call, ret, Input{Kind: Complete, Token: token, Body: body},
		Output{Result: Finished, Status: 200, Attempt: attempt, At: t0 + at})
}

func replay(client int, call, ret int64, attempt int64, body string) Op {
	return op(client, call, ret, Input{Kind: Begin, LeaseMs: 500},
		Output{Result: ReplayCompleted, Status: 200, Attempt: attempt, Body: body})
}

func TestCheckers(t *testing.T) {
	tests := []struct {
		name string
		ops  []Op
		// want: which invariant counts are non-zero, and linearizability.
		lost, double, order, superseded, unexpected bool
		linearizable                                bool
	}{
		{
			name: "complete then replay",
			ops: []Op{
				acquire(0, 0, 1, 2, "o1", "A", 1, false),
				op(1, 3, 4, Input{Kind: Begin, LeaseMs: 500}, Output{Result: InProgress, Status: 409, Attempt: 1, LeaseExp: t0 + 501}),
				complete(0, 10, 11, 12, "A", "b1", 1),
				replay(1, 20, 21, 1, "b1"),
			},
			linearizable: true,
		},
		{
			name: "takeover after expiry, fenced complete, late complete of an expired lease",
			ops: []Op{
				acquire(0, 0, 1, 2, "", "A", 1, false),
				acquire(1, 600, 601, 602, "", "B", 2, true),
				op(0, 610, 612, Input{Kind: Complete, Token: "A", Body: "a"}, Output{Result: LeaseLost, Status: 409}),
				op(1, 1200, 1202, Input{Kind: Complete, Token: "B", Body: "b"}, Output{Result: Finished, Status: 200, Attempt: 2, At: t0 + 1201}),
				replay(0, 1300, 1301, 2, "b"),
			},
			linearizable: true,
		},
		{
			name: "unknown begin retried by its owner, unknown complete retried with its token",
			ops: []Op{
				op(0, 0, 3000, Input{Kind: Begin, Owner: "o1", LeaseMs: 500}, Output{Result: Unknown}),
				acquire(0, 100, 90, 101, "o1", "A", 1, false),
				op(0, 200, 3000, Input{Kind: Complete, Token: "A", Body: "b"}, Output{Result: Unknown}),
				complete(0, 300, 250, 301, "A", "b", 1),
				replay(1, 400, 401, 1, "b"),
			},
			linearizable: true,
		},
		{
			name: "fingerprint refused",
			ops: []Op{
				op(0, 0, 2, Input{Kind: Begin, Fingerprint: "x", LeaseMs: 500},
					Output{Result: Acquired, Status: 201, Attempt: 1, Token: "A", LeaseExp: t0 + 501}),
				op(1, 3, 4, Input{Kind: Begin, Fingerprint: "y", LeaseMs: 500}, Output{Result: Mismatch, Status: 422}),
			},
			linearizable: true,
		},
		{
			name: "acknowledged completion lost",
			ops: []Op{
				acquire(0, 0, 1, 2, "", "A", 1, false),
				complete(0, 10, 11, 12, "A", "b1", 1),
				acquire(1, 20, 21, 22, "", "B", 1, false),
			},
			lost: true, order: true,
		},
		{
			name: "two attempts completed",
			ops: []Op{
				acquire(0, 0, 1, 2, "", "A", 1, false),
				acquire(1, 600, 601, 602, "", "B", 2, true),
				complete(1, 610, 611, 612, "B", "b", 2),
				complete(0, 620, 621, 622, "A", "a", 1),
			},
			double: true, superseded: true, lost: false,
		},
		{
			name: "attempt repeated",
			ops: []Op{
				acquire(0, 0, 1, 2, "", "A", 1, false),
				acquire(1, 600, 601, 602, "", "B", 1, true),
			},
			order: true,
		},
		{
			name: "takeover of a live lease",
			ops: []Op{
				acquire(0, 0, 1, 2, "", "A", 1, false),
				acquire(1, 200, 201, 202, "", "B", 2, true),
			},
		},
		{
			name: "in progress after the lease ran out",
			ops: []Op{
				acquire(0, 0, 1, 2, "", "A", 1, false),
				op(1, 1000, 1001, Input{Kind: Begin, LeaseMs: 500}, Output{Result: InProgress, Status: 409, Attempt: 1, LeaseExp: t0 + 501}),
			},
		},
		{
			name: "same owner locked out",
			ops: []Op{
				acquire(0, 0, 1, 2, "o1", "A", 1, false),
				op(0, 10, 11, Input{Kind: Begin, Owner: "o1", LeaseMs: 500}, Output{Result: InProgress, Status: 409, Attempt: 1, LeaseExp: t0 + 501}),
			},
		},
		{
			name: "fingerprint ignored",
			ops: []Op{
				op(0, 0, 2, Input{Kind: Begin, Fingerprint: "x", LeaseMs: 500},
					Output{Result: Acquired, Status: 201, Attempt: 1, Token: "A", LeaseExp: t0 + 501}),
				op(1, 600, 602, Input{Kind: Begin, Fingerprint: "y", LeaseMs: 500},
					Output{Result: Acquired, Status: 201, Attempt: 2, Token: "B", LeaseExp: t0 + 1101, Recovered: true}),
			},
		},
		{
			name: "replay of another response",
			ops: []Op{
				acquire(0, 0, 1, 2, "", "A", 1, false),
				complete(0, 10, 11, 12, "A", "b1", 1),
				replay(1, 20, 21, 1, "other"),
			},
			lost: true,
		},
		{
			name: "a 500",
			ops: []Op{
				op(0, 0, 2, Input{Kind: Begin, LeaseMs: 500}, Output{Result: Unexpected, Status: 500}),
			},
			unexpected: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := CheckInvariants(tt.ops)
			for _, c := range []struct {
				name      string
				got, want bool
			}{
				{"lost completions", v.LostCompletions > 0, tt.lost},
				{"double completions", v.DoubleCompletions > 0, tt.double},
				{"attempt order", v.AttemptOrder > 0, tt.order},
				{"superseded token", v.SupersededToken > 0, tt.superseded},
				{"unexpected answers", v.Unexpected > 0, tt.unexpected},
			} {
				if c.got != c.want {
					t.Errorf("%s found: %t, want %t (%+v)", c.name, c.got, c.want, v)
				}
			}
			dir := t.TempDir()
			lin, err := CheckLinearizable(tt.ops, nil, 2, 10*time.Second, dir)
			if err != nil {
				t.Fatal(err)
			}
			if lin.OK() != tt.linearizable {
				t.Errorf("linearizable: %t, want %t (%+v)", lin.OK(), tt.linearizable, lin)
			}
			if !tt.linearizable {
				if _, err := os.Stat(filepath.Join(dir, "linearizability.html")); err != nil {
					t.Errorf("no visualization of the failing key: %v", err)
				}
			}
		})
	}
}

func TestMeasureAvailability(t *testing.T) {
	ops := []Op{
		op(0, 0, 1, Input{Kind: Begin}, Output{Result: Acquired}),
		op(0, 1100, 1200, Input{Kind: Begin}, Output{Result: Unknown}),
		op(0, 1300, 1400, Input{Kind: Begin}, Output{Result: Unknown}),
		op(0, 2400, 2500, Input{Kind: Begin}, Output{Result: InProgress}),
	}
	faults := []Fault{{Name: "kill-master", At: 1000 * 1e6}}
	got := MeasureAvailability(ops, faults, 5000*1e6)
	if len(got) != 1 || got[0].Affected != 1 || got[0].Worst != 1500*time.Millisecond || got[0].Unrecovered != 0 {
		t.Fatalf("recoveries %+v, want one key recovered 1.5s after the fault", got)
	}
}

func TestBlame(t *testing.T) {
	faults := []Fault{{Name: "replica-lag-kill", At: 10e9}, {Name: "black-hole", At: 45e9}, {Name: "restart-redis", At: 60e9}}
	got := Blame([]int64{11e9, 12e9, 50e9}, faults, 10*time.Second)
	if got["replica-lag-kill"] != 2 || got["restart-redis"] != 1 || len(got) != 2 {
		t.Fatalf("blame %v, want 2 on the fault in progress and 1 on the restart after the ack, none on the black hole", got)
	}
}
