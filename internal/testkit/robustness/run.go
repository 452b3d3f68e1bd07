// SPDX-License-Identifier: Apache-2.0

package robustness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Settings of a run.
const (
	instances    = 3
	clients      = 12
	activeKeys   = 12
	beginsPerKey = 20
	// quiet is the time between two faults.
	quiet = 2 * time.Second
	// settle is how long traffic runs after the last fault, so that every
	// disturbed key gets answers again.
	settle = 4 * time.Second
	// retryFor bounds the retries of one call; longer than a Cluster
	// failover takes.
	retryFor = 25 * time.Second
	// checkTimeout bounds the linearizability check of one key.
	checkTimeout = 20 * time.Second
)

// Summary is the outcome of one scenario.
type Summary struct {
	Scenario     string
	ExpectLoss   bool
	Duration     time.Duration
	Ops          int
	Unknown      int
	Acknowledged int // completes and terminal fails answered 200
	Faults       int
	Violations   Violations
	Lin          Linearizability
	Recoveries   []Recovery
	// LostBy counts lost acknowledged outcomes by the fault blamed.
	LostBy    map[string]int
	Artifacts string
	// BlobReplays counts the replays of a Blob scenario: bodies read
	// back from the blob store, checked whole against their SHA-256 by
	// idemsvc and against the stored body by the checks.
	BlobReplays int
}

// Worst returns the slowest recovery from a fault.
func (s Summary) Worst() Recovery {
	var w Recovery
	for _, r := range s.Recoveries {
		if r.Worst > w.Worst {
			w = r
		}
	}
	return w
}

// Safe reports whether the run found no safety violation: no invariant
// broken and no key shown non-linearizable. A key the checker could not
// decide in time is reported, not counted as a violation.
func (s Summary) Safe() bool { return s.Violations.Total() == 0 && len(s.Lin.Illegal) == 0 }

// Line describes the scenario on one line.
func (s Summary) Line() string {
	lin := "all"
	switch {
	case len(s.Lin.Illegal) > 0:
		lin = fmt.Sprintf("NO(%d illegal, %d undecided)", len(s.Lin.Illegal), len(s.Lin.TimedOut))
	case len(s.Lin.TimedOut) > 0:
		lin = fmt.Sprintf("no-illegal(%d undecided)", len(s.Lin.TimedOut))
	}
	v := s.Violations
	w := s.Worst()
	return fmt.Sprintf("%s: ops=%d unknown=%d acknowledged=%d faults=%d lost=%d double=%d attempt-order=%d superseded=%d unexpected=%d linearizable=%s keys=%d blob-replays-sha256-checked=%d worst-recovery=%.1fs(%s)",
		s.Scenario, s.Ops, s.Unknown, s.Acknowledged, s.Faults, v.LostCompletions, v.DoubleCompletions, v.AttemptOrder,
		v.SupersededToken, v.Unexpected, lin, s.Lin.Keys, s.BlobReplays, w.Worst.Seconds(), w.Fault.Name)
}

// RunScenario starts the scenario's topology and three idemsvc
// processes, runs traffic for d while injecting its failpoints one after
// another, and checks the history.
func RunScenario(t *testing.T, sc Scenario, d time.Duration) Summary {
	top := sc.Start(t)
	env := append(top.Env, fmt.Sprintf("IDEMSVC_REDIS_WAIT_REPLICAS=%d", sc.WaitReplicas))
	insts := StartInstances(t, instances, env)
	fps := append(top.Failpoints, instanceFailpoints(&insts)...)
	targets := make([]string, len(insts))
	for i, in := range insts {
		targets[i] = in.URL()
	}

	rec := NewRecorder()
	tr := &Traffic{Rec: rec, Targets: targets, Clients: clients, Keys: activeKeys, BeginsPerKey: beginsPerKey,
		RetryFor: retryFor, Seed: uint64(time.Now().UnixNano())}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { tr.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	time.Sleep(quiet)
	end := time.Now().Add(d)
	for i := 0; time.Now().Before(end); i++ {
		fp := fps[i%len(fps)]
		start := time.Now()
		fp.Inject(t, rec)
		t.Logf("%s: %s took %.1fs", sc.Name, fp.Name, time.Since(start).Seconds())
		time.Sleep(quiet)
	}
	time.Sleep(settle)
	stopped := rec.Now()
	cancel()
	<-done

	ops, faults := rec.History()
	s := Summary{Scenario: sc.Name, ExpectLoss: sc.ExpectLoss, Duration: d, Ops: len(ops), Faults: len(faults)}
	for _, op := range ops {
		if op.Out.Result == Unknown {
			s.Unknown++
		}
		if acknowledged(op) {
			s.Acknowledged++
		}
		if sc.Blob && (op.Out.Result == ReplayCompleted || op.Out.Result == ReplayFailed) && op.Out.Body != "" {
			s.BlobReplays++
		}
	}
	s.Violations = CheckInvariants(ops)
	s.LostBy = Blame(s.Violations.LostAcks, faults, 10*time.Second)
	s.Recoveries = MeasureAvailability(ops, faults, stopped)
	s.Artifacts = artifactDir(t, sc.Name)
	lin, err := CheckLinearizable(ops, s.Violations.Keys, clients, checkTimeout, s.Artifacts)
	if err != nil {
		t.Errorf("%s: %v", sc.Name, err)
	}
	s.Lin = lin
	if !s.Safe() || !s.Lin.OK() {
		if err := writeHistory(filepath.Join(s.Artifacts, "history.txt"), ops, faults); err != nil {
			t.Errorf("%s: %v", sc.Name, err)
		}
	}
	return s
}

// artifactDir is where a run's visualizations and histories go:
// $ROBUSTNESS_ARTIFACTS/<scenario>, or a new temporary directory.
func artifactDir(t *testing.T, name string) string {
	if base := os.Getenv("ROBUSTNESS_ARTIFACTS"); base != "" {
		return filepath.Join(base, name)
	}
	dir, err := os.MkdirTemp("", "idemsvc-robustness-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func writeHistory(path string, ops []Op, faults []Fault) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("artifact directory: %w", err)
	}
	var b strings.Builder
	for _, f := range faults {
		fmt.Fprintf(&b, "%12.3fs fault %s\n", float64(f.At)/1e9, f.Name)
	}
	for _, op := range ops {
		fmt.Fprintf(&b, "%12.3fs..%.3fs c%d i%d %s\n", float64(op.Call)/1e9, float64(op.Return)/1e9, op.Client, op.Instance, op)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("write history: %w", err)
	}
	return nil
}

// Report logs each scenario's figures, the examples of its violations and
// where its artifacts are.
func Report(t *testing.T, s Summary) {
	t.Log(s.Line())
	counts := map[string]int{}
	var names []string
	for _, r := range s.Recoveries {
		if counts[r.Fault.Name] == 0 {
			names = append(names, r.Fault.Name)
		}
		counts[r.Fault.Name]++
	}
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s x%d", n, counts[n]))
	}
	t.Logf("  faults: %s", strings.Join(parts, ", "))
	if len(s.LostBy) > 0 {
		t.Logf("  lost acknowledged outcomes by fault: %v", s.LostBy)
	}
	for _, r := range s.Recoveries {
		if r.Affected > 0 {
			t.Logf("  %s at %.1fs: %d keys disturbed, all answered again after %.1fs (%d not before the next fault)",
				r.Fault.Name, float64(r.Fault.At)/1e9, r.Affected, r.Worst.Seconds(), r.Unrecovered)
		}
	}
	for _, e := range s.Violations.Examples {
		t.Log("  violation: " + e)
	}
	if len(s.Lin.Illegal) > 0 {
		t.Logf("  non-linearizable keys: %v; visualization: %s; history: %s", s.Lin.Illegal,
			s.Lin.Visualization, filepath.Join(s.Artifacts, "history.txt"))
	}
	if len(s.Lin.TimedOut) > 0 {
		t.Logf("  keys the checker could not decide within %v: %v", checkTimeout, s.Lin.TimedOut)
	}
}
