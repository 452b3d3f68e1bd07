#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Measures failover availability: runs TestFailoverAvailability (a 3-master
# Cluster and a Sentinel setup, 2 replicas per master; a master killed,
# then one paused) several times and prints, per topology, fault and
# prober, the medians of
#   promotion: from the fault to a replica reporting role:master,
#   recovery:  from the promotion to the first successful begin,
#   outage:    from the last successful begin before the fault to the
#              first after it,
# with "none" for runs where no begin succeeded within the test's wait
# (20 s after the promotion; the master stays down that long).
#
#   benchmarks/failover.sh [runs] [go test flags...]
#
# Runs without the race detector unless -race is given. The machine's load
# is printed before and after: the figures stretch with it. FAILOVER_LOG=file
# keeps the test's whole output there.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
shift || true
if [ -n "${FAILOVER_LOG:-}" ]; then
  log=$FAILOVER_LOG
else
  log=$(mktemp)
  trap 'rm -f "$log"' EXIT
fi
echo "load before: $(uptime)"
go test -count="$runs" -run '^TestFailoverAvailability$' -v "$@" ./internal/redisstore/ >"$log" 2>&1 ||
  echo "(some runs failed the contract's bound; their figures are included)"
echo "load after:  $(uptime)"
grep -o 'failover: .*' "$log" | python3 -c '
import re, statistics, sys
groups = {}
for line in sys.stdin:
    f = dict(re.findall(r"(\w+)=(\S+)", line))
    key = (f["topology"], f["fault"], f["via"], f["wait"])
    groups.setdefault(key, []).append(f)
def med(values):
    secs = [float(v[:-1]) for v in values if v != "none"]
    none = len(values) - len(secs)
    if not secs:
        return "none (%d of %d)" % (none, len(values))
    s = "%.2f s" % statistics.median(secs)
    return s + (" (none in %d of %d)" % (none, len(values)) if none else "")
print("| topology | fault | via | WAIT | runs | promotion | recovery | outage |")
print("|---|---|---|---|---|---|---|---|")
for key in sorted(groups):
    g = groups[key]
    print("| %s | %s | %s | %s | %d | %s | %s | %s |" % (key + (len(g),
        med([x["promotion"] for x in g]), med([x["recovery"] for x in g]), med([x["outage"] for x in g]))))
'
