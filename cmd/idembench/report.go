// SPDX-License-Identifier: Apache-2.0

package main

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// report is what the workers of one run saw, merged.
type report struct {
	cfg        config
	elapsed    time.Duration
	rows       [numRows]rowStats
	lag        histogram // open loop: how late turns started
	errs       map[errKey]*errCount
	bad        int
	violations []string // one ERROR line per key acquired more than once
	tallied    string   // what the acquisition tally covered
}

// maxViolations bounds the ERROR lines printed.
const maxViolations = 20

func (b *bench) report(workers []*worker, elapsed time.Duration) *report {
	r := &report{cfg: b.cfg, elapsed: elapsed, errs: make(map[errKey]*errCount)}
	for i := range r.rows {
		r.rows[i].statuses = make(map[int]int64)
	}
	for _, w := range workers {
		for i := range w.rows {
			r.rows[i].hist.merge(&w.rows[i].hist)
			for status, n := range w.rows[i].statuses {
				r.rows[i].statuses[status] += n
			}
		}
		for k, e := range w.errs {
			if have := r.errs[k]; have != nil {
				have.n += e.n
			} else {
				r.errs[k] = &errCount{n: e.n, first: e.first}
			}
		}
		r.bad += w.bad
		r.lag.merge(&w.lag)
	}

	var tallied []string
	if b.cfg.mix.has(opReplay) {
		for i := range b.replayAcq {
			if n := b.replayAcq[i].Load(); n > 1 {
				r.violations = append(r.violations, fmt.Sprintf("replay key %q acquired %d times", b.replayKey(i), n))
			}
		}
		tallied = append(tallied, fmt.Sprintf("%d replay keys begun %d more times", len(b.replayAcq), r.rows[rowReplay].count()))
	}
	if b.cfg.mix.has(opHot) {
		if n := b.hotAcq.Load(); n > 1 {
			r.violations = append(r.violations, fmt.Sprintf("hot key %q acquired %d times", b.hotKey, n))
		}
		tallied = append(tallied, fmt.Sprintf("the hot key begun %d more times", r.rows[rowHot].count()))
	}
	if len(tallied) == 0 {
		r.tallied = "every key was begun once"
	} else {
		r.tallied = "of the keys the warm-up acquired, " + strings.Join(tallied, " and ")
	}
	return r
}

// count is the number of requests of a row, answered or not; of whole
// cycles for the cycle row.
func (s *rowStats) count() int64 {
	if len(s.statuses) == 0 {
		return int64(s.hist.n)
	}
	var n int64
	for _, c := range s.statuses {
		n += c
	}
	return n
}

func (r *report) write(out io.Writer) {
	secs := r.elapsed.Seconds()
	var requests int64
	for i := range r.rows {
		if row(i) != rowCycle {
			requests += r.rows[i].count()
		}
	}
	fmt.Fprintf(out, "idembench %s  mix %s  concurrency %d  elapsed %.3fs\n",
		r.cfg.url, r.cfg.mix, r.cfg.concurrency, secs)
	if r.cfg.rate > 0 {
		fmt.Fprintf(out, "open loop  %10.1f turns/s scheduled (%d taken); latencies from each turn's due time\n",
			r.cfg.rate, r.lag.n)
		fmt.Fprintf(out, "lag_ms     p50 %.3f  p99 %.3f  max %.3f  (how late turns started)\n",
			ms(r.lag.quantile(0.50)), ms(r.lag.quantile(0.99)), ms(r.lag.max))
	}
	fmt.Fprintf(out, "requests/s %10.1f  (%d requests)\n", float64(requests)/secs, requests)
	if r.cfg.mix.has(opCycle) {
		cycles := r.rows[rowCycle].count()
		fmt.Fprintf(out, "cycles/s   %10.1f  (%d cycles)\n", float64(cycles)/secs, cycles)
	}

	fmt.Fprintf(out, "\n%-15s %9s %10s %8s %8s %8s %8s %8s  %s\n",
		"operation", "count", "per_s", "p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms", "statuses")
	for i := range r.rows {
		s := &r.rows[i]
		n := s.count()
		if n == 0 {
			continue
		}
		h := &s.hist
		fmt.Fprintf(out, "%-15s %9d %10.1f %8.3f %8.3f %8.3f %8.3f %8.3f  %s\n",
			rowNames[i], n, float64(n)/secs,
			ms(h.quantile(0.50)), ms(h.quantile(0.90)), ms(h.quantile(0.99)), ms(h.quantile(0.999)), ms(h.max),
			statuses(s.statuses))
	}

	keys := slices.SortedFunc(maps.Keys(r.errs), func(a, b errKey) int {
		return cmp.Or(cmp.Compare(a.row, b.row), cmp.Compare(a.status, b.status))
	})
	var errors int64
	for _, e := range r.errs {
		errors += e.n
	}
	if errors == 0 {
		fmt.Fprintln(out, "\nerrors: none")
	} else {
		fmt.Fprintf(out, "\nerrors: %d\n", errors)
		for _, k := range keys {
			e := r.errs[k]
			what := "no reply"
			if k.status != 0 {
				what = "status " + strconv.Itoa(k.status)
			}
			fmt.Fprintf(out, "  %-15s %-10s %9d  first: %s\n", rowNames[k.row], what, e.n, e.first)
		}
	}

	fmt.Fprintf(out, "acquisitions: %s\n", r.tallied)
	for i, v := range r.violations {
		if i == maxViolations {
			fmt.Fprintf(out, "ERROR: and %d more keys acquired more than once\n", len(r.violations)-i)
			break
		}
		fmt.Fprintln(out, "ERROR:", v)
	}
	if r.bad > 0 {
		fmt.Fprintf(out, "ERROR: %d replays did not return the stored response\n", r.bad)
	}
	if len(r.violations) == 0 && r.bad == 0 {
		fmt.Fprintln(out, "correctness: OK, no key acquired more than once")
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// statuses lists counts by status, "201:1200 409:3"; "failed" counts
// requests without a reply.
func statuses(m map[int]int64) string {
	var parts []string
	for _, status := range slices.Sorted(maps.Keys(m)) {
		name := strconv.Itoa(status)
		if status == 0 {
			name = "failed"
		}
		parts = append(parts, name+":"+strconv.FormatInt(m[status], 10))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}
