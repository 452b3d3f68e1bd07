// SPDX-License-Identifier: Apache-2.0

package robustness

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// shortRun is the traffic time of the run in make test.
const shortRun = 60 * time.Second

// TestRobustness runs scenarios and fails on any safety violation in a
// scenario that promises safety. By default it runs cluster-wait1 and
// standalone-blob (every body in a blob store, which a failpoint restarts)
// for shortRun each. ROBUSTNESS_DURATION (such as 10m) runs every scenario, or
// those named in ROBUSTNESS_SCENARIOS (comma-separated), sharing the time
// between them. It ends with one summary line.
func TestRobustness(t *testing.T) {
	scenarios := Scenarios()
	d := shortRun
	names := []string{"cluster-wait1", "standalone-blob"}
	if v := os.Getenv("ROBUSTNESS_DURATION"); v != "" {
		total, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("ROBUSTNESS_DURATION=%q: %v", v, err)
		}
		names = nil
		for _, sc := range scenarios {
			names = append(names, sc.Name)
		}
		if v := os.Getenv("ROBUSTNESS_SCENARIOS"); v != "" {
			names = strings.Split(v, ",")
		}
		d = total / time.Duration(len(names))
	}
	var summaries []Summary
	for _, sc := range scenarios {
		if !slices.Contains(names, sc.Name) {
			continue
		}
		t.Run(sc.Name, func(t *testing.T) {
			s := RunScenario(t, sc, d)
			Report(t, s)
			summaries = append(summaries, s)
			switch {
			case s.Violations.Unexpected > 0:
				t.Errorf("%s: %d answers outside the contract", sc.Name, s.Violations.Unexpected)
			case !sc.ExpectLoss && !s.Safe():
				t.Errorf("%s: safety violated; see the examples above and %s", sc.Name, s.Artifacts)
			}
		})
	}
	t.Log(summaryLine(summaries))
}

// summaryLine totals the scenarios on one line: the safety figures of the
// scenarios that promise safety, the measured losses of those that do
// not, and the slowest recovery from a fault.
func summaryLine(ss []Summary) string {
	var ops, acked, faults, blobReplays int
	var v Violations
	var worst Recovery
	var worstIn string
	lin, keys, undecided := true, 0, 0
	var losses []string
	for _, s := range ss {
		ops += s.Ops
		acked += s.Acknowledged
		faults += s.Faults
		blobReplays += s.BlobReplays
		if w := s.Worst(); w.Worst > worst.Worst {
			worst, worstIn = w, s.Scenario
		}
		if s.ExpectLoss {
			losses = append(losses, fmt.Sprintf("%s lost %d of %d acknowledged (%d non-linearizable keys)",
				s.Scenario, s.Violations.LostCompletions, s.Acknowledged, len(s.Lin.Illegal)))
			v.Unexpected += s.Violations.Unexpected
			continue
		}
		keys += s.Lin.Keys
		undecided += len(s.Lin.TimedOut)
		lin = lin && len(s.Lin.Illegal) == 0
		v.LostCompletions += s.Violations.LostCompletions
		v.DoubleCompletions += s.Violations.DoubleCompletions
		v.AttemptOrder += s.Violations.AttemptOrder
		v.SupersededToken += s.Violations.SupersededToken
		v.Unexpected += s.Violations.Unexpected
	}
	line := fmt.Sprintf("ROBUSTNESS SUMMARY: %d scenarios, %d operations, %d acknowledged completions, %d faults; "+
		"violations: lost=%d double-complete=%d attempt-order=%d superseded-token=%d unexpected/500=%d; "+
		"every key linearizable: %t (%d keys, %d undecided); replays from the blob store checked against their SHA-256: %d; "+
		"worst recovery from a fault: %.1fs (%s, %s)",
		len(ss), ops, acked, faults, v.LostCompletions, v.DoubleCompletions, v.AttemptOrder, v.SupersededToken,
		v.Unexpected, lin, keys, undecided, blobReplays, worst.Worst.Seconds(), worstIn, worst.Fault.Name)
	if len(losses) > 0 {
		line += "; expected by Redis's design: " + strings.Join(losses, ", ")
	}
	return line
}
