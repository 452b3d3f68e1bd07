#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The whole path a caller feels, measured side by side with its baselines:
#
#   benchmarks/caller-load.sh [runs]      (default 3; make load-sdk)
#
# Everything runs on this machine, on a Redis of its own. Each run puts, for
# DURATION seconds (default 10) each, these loads in pairs, each pair's
# order alternating from run to run as the machine's other load drifts:
#
#   begin, cycle, replay  idemsvc's begin on new keys, begin + complete, and
#                         begin of a completed key (a 1 KiB replay), at
#                         concurrency 64, beside barechi (benchmarks/barechi),
#                         the bare chi handler that runs the same scripts;
#   pay64, pay1           payapp (benchmarks/payapp), a tiny service whose
#                         POST /pay answers 201, behind idem.Middleware with
#                         the SDK's defaults, beside the same app alone, at
#                         concurrency 64 and 1, a new Idempotency-Key each;
#   proxy64, proxy1       the same app alone (direct_), beside it behind idemproxy
#                         (cmd/idemproxy) with its defaults, at concurrency
#                         64 and 1, a new Idempotency-Key each;
#   open                  begin on an open loop (idembench --rate, 128
#                         connections) at OPEN_SHARE (default 0.8) of this
#                         run's closed-loop barechi begins/s, on idemsvc and
#                         on barechi.
#
# idemsvc runs as shipped: tenants file, JSON logs at info (to a file). For
# each load the script gives requests/s (cycles/s for cycle), p50 and p99,
# and CPU µs per request (per cycle) of the application, of the server
# (idemsvc or barechi), of Redis and of idembench, from /proc; then the
# medians over the runs, and the medians of the per-run ratios:
#
#   - idemsvc over barechi, for begin, cycle and replay;
#   - the SDK's client CPU per call: (app CPU behind the middleware - app CPU
#     alone) / 2, a request making two calls (begin, complete);
#   - what idemproxy adds to the app alone: p50 and p99, and idemproxy's
#     CPU per request;
#   - the open loop: whether idemsvc kept to the schedule, and its p99 over
#     barechi's.
#
# SDK_BASE=REV adds, to pay64 and pay1, the same app built with the SDK
# of git revision REV (from a temporary worktree), beside the others: a
# change to the SDK, measured side by side.
#
# SVC_BASE=REV adds, to begin, cycle and replay, the same load on idemsvc
# built from git revision REV, beside the others: a change to idemsvc,
# measured side by side.
#
# LOADS picks some of the pairs (comma-separated names from the list
# above; default all). The open loop needs begin.
#
# PROFILE=1 adds CPU profiles of the application behind the middleware
# under pay64, and of idemsvc under pay64, begin, cycle and replay, taken with net/http/pprof listeners added at
# build time (go build -overlay; the source is not changed).
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/lib.sh
runs=${1:-3}
duration=${DURATION:-10}
open_share=${OPEN_SHARE:-0.8}
loads=${LOADS:-begin,cycle,replay,pay64,pay1,proxy64,proxy1,open}
case ",$loads," in
*,open,*) case ",$loads," in *,begin,*) ;; *) echo "LOADS: open needs begin, whose rate it takes" >&2 && exit 1 ;; esac ;;
esac

workdirs caller-load

echo "building idemsvc, barechi, payapp, idemproxy and idembench"
overlay=()
if [ -n "${PROFILE:-}" ]; then
  # A pprof listener at $BENCH_PPROF, for idemsvc and payapp alike.
  pprof_overlay cmd/idemsvc benchmarks/payapp
  overlay=(-overlay "$dir/overlay.json")
fi
go build "${overlay[@]}" -o "$results/idemsvc" ./cmd/idemsvc
go build "${overlay[@]}" -o "$results/payapp" ./benchmarks/payapp
go build -o "$dir/barechi" ./benchmarks/barechi
go build -o "$dir/idemproxy" ./cmd/idemproxy
if [ -n "${SDK_BASE:-}" ]; then
  git worktree add -q --detach "$dir/base" "$SDK_BASE"
  mkdir -p "$dir/base/benchmarks/payapp"
  cp benchmarks/payapp/main.go "$dir/base/benchmarks/payapp/"
  (cd "$dir/base" && go build -o "$results/payapp-base" ./benchmarks/payapp)
  git worktree remove --force "$dir/base"
fi
if [ -n "${SVC_BASE:-}" ]; then
  git worktree add -q --detach "$dir/svcbase" "$SVC_BASE"
  (cd "$dir/svcbase" && go build -o "$results/idemsvc-base" ./cmd/idemsvc)
  git worktree remove --force "$dir/svcbase"
fi
go build -o "$dir/idembench" ./cmd/idembench

start_redis
bench_tenant

idemsvc_port=$(free_port) idemsvc_pprof=$(free_port)
BENCH_PPROF=127.0.0.1:$idemsvc_pprof "$results/idemsvc" --listen "127.0.0.1:$idemsvc_port" --redis-url "$redis_url" \
  --tenants-file "$dir/tenants.yaml" --log-level info 2>>"$dir/idemsvc.log" &
idemsvc_pid=$!
pids+=("$idemsvc_pid")
wait_http "http://127.0.0.1:$idemsvc_port/readyz"

svcbase_pid=
if [ -n "${SVC_BASE:-}" ]; then
  svcbase_port=$(free_port)
  "$results/idemsvc-base" --listen "127.0.0.1:$svcbase_port" --redis-url "$redis_url" \
    --tenants-file "$dir/tenants.yaml" --log-level info 2>>"$dir/idemsvc.log" &
  svcbase_pid=$!
  pids+=("$svcbase_pid")
  wait_http "http://127.0.0.1:$svcbase_port/readyz"
fi

barechi_port=$(free_port)
"$dir/barechi" --listen "127.0.0.1:$barechi_port" --redis-url "$redis_url" 2>"$dir/barechi.log" &
barechi_pid=$!
pids+=("$barechi_pid")
wait_http "http://127.0.0.1:$barechi_port/"

alone_port=$(free_port)
"$results/payapp" --listen "127.0.0.1:$alone_port" 2>"$dir/alone.log" &
alone_pid=$!
pids+=("$alone_pid")
wait_http "http://127.0.0.1:$alone_port/"

sdk_port=$(free_port) sdk_pprof=$(free_port)
BENCH_PPROF=127.0.0.1:$sdk_pprof "$results/payapp" --listen "127.0.0.1:$sdk_port" \
  --idemsvc "http://127.0.0.1:$idemsvc_port" 2>"$dir/sdk.log" &
sdk_pid=$!
pids+=("$sdk_pid")
wait_http "http://127.0.0.1:$sdk_port/"

proxy_port=$(free_port)
"$dir/idemproxy" --listen "127.0.0.1:$proxy_port" --upstream "http://127.0.0.1:$alone_port" \
  --idemsvc-url "http://127.0.0.1:$idemsvc_port" 2>"$dir/idemproxy.log" &
proxy_pid=$!
pids+=("$proxy_pid")
wait_http "http://127.0.0.1:$proxy_port/healthz"

base_pid=
if [ -n "${SDK_BASE:-}" ]; then
  base_port=$(free_port)
  "$results/payapp-base" --listen "127.0.0.1:$base_port" --idemsvc "http://127.0.0.1:$idemsvc_port" 2>"$dir/base.log" &
  base_pid=$!
  pids+=("$base_pid")
  wait_http "http://127.0.0.1:$base_port/"
fi

# load LABEL PORT APP_PID SERVER_PID MIX CONCURRENCY [RATE]: one idembench
# run on a flushed Redis. The report goes to $results/LABEL-RUN.txt; a line
# of figures to $dir/figures: requests/s (cycles/s for a cycle mix), p50
# and p99 in ms, CPU µs per request (per cycle) of the application (0 when
# none), the server, Redis and idembench, and the share of the machine's
# CPU that other processes took meanwhile (high values mean the figures
# are not to be trusted).
load() {
  local label=$1 port=$2 app=$3 server=$4 mix=$5 concurrency=$6 rate=${7:-0}
  local report=$results/$label-$run.txt
  redis-cli -p "$redis_port" flushall sync >/dev/null
  : >"$dir/idemsvc.log" # as shipped it logs every request; keep the file small
  local a0=0 a1=0 s0 s1 r0 r1 m0 m1 status=0
  [ "$app" != 0 ] && a0=$(cpu_ticks "$app")
  s0=$(cpu_ticks "$server")
  r0=$(cpu_ticks "$redis_pid")
  m0=$(machine_ticks)
  TIMEFORMAT='%U %S'
  { time "$dir/idembench" --url "http://127.0.0.1:$port" --mix "$mix" --concurrency "$concurrency" \
    --rate "$rate" --duration "${duration}s" >"$report" 2>"$dir/idembench.err" || status=$?; } 2>"$dir/time"
  [ "$app" != 0 ] && a1=$(cpu_ticks "$app")
  s1=$(cpu_ticks "$server")
  r1=$(cpu_ticks "$redis_pid")
  m1=$(machine_ticks)
  if [ "$status" != 0 ]; then
    cat "$report" "$dir/idembench.err"
    echo "idembench failed: $label" >&2
    exit 1
  fi
  local unit=requests/s op=$mix
  [ "$mix" = cycle ] && unit=cycles/s
  local per_s n
  per_s=$(awk -v u="$unit" '$1 == u { print $2 }' "$report")
  n=$(awk -v u="$unit" '$1 == u { gsub(/\(/, "", $3); print $3 }' "$report")
  # shellcheck disable=SC2046 # the percentiles are words
  echo "$label" "$per_s" $(awk -v op="$op" '$1 == op { print $4, $6; exit }' "$report") \
    "$(per_request $((a1 - a0)) "$n")" "$(per_request $((s1 - s0)) "$n")" "$(per_request $((r1 - r0)) "$n")" \
    "$(awk -v n="$n" '{ printf "%.1f\n", ($1 + $2) * 1e6 / n }' "$dir/time")" \
    "$(awk -v m0="$m0" -v m1="$m1" -v ours=$((a1 - a0 + s1 - s0 + r1 - r0)) -v hz="$clk_tck" '{
      split(m0, a, " "); split(m1, b, " ")
      other = (b[1] - a[1]) - ours - ($1 + $2) * hz
      printf "%.0f\n", (other > 0 ? 100 * other / (b[2] - a[2]) : 0) }' "$dir/time")" >>"$dir/figures"
  local errors
  errors=$(awk '$1 == "errors:" { print $2 }' "$report")
  [ "$errors" = none ] || echo "  $label: errors: $errors (see $report)"
}

# picked NAME: whether LOADS names NAME.
picked() { case ",$loads," in *",$1,"*) return 0 ;; esac; return 1; }

# pair NAME A B [C]: runs the loads A, B (and C) (words for load), in
# that order in odd runs and the other way round in even ones, if LOADS
# names NAME.
pair() {
  picked "$1" || return 0
  shift
  local l order=()
  for l in "$@"; do
    [ -n "$l" ] || continue
    if [ $((run % 2)) = 1 ]; then order+=("$l"); else order=("$l" "${order[@]}"); fi
  done
  # shellcheck disable=SC2086 # the load's words
  for l in "${order[@]}"; do load $l; done
}
base() { if [ -n "$base_pid" ]; then echo "base_pay$1 $base_port $base_pid $idemsvc_pid pay $1"; fi; }
svcbase() { if [ -n "$svcbase_pid" ]; then echo "svcbase_$1 $svcbase_port 0 $svcbase_pid $1 64"; fi; }

columns=(per_s p50_ms p99_ms app_us srv_us redis_us gen_us other%)
fmt_row() { printf '%-16s %9s %8s %8s %8s %8s %9s %8s %7s\n' "$@"; }

: >"$dir/figures"
for run in $(seq "$runs"); do
  pair begin "bare_begin $barechi_port 0 $barechi_pid begin 64" "idemsvc_begin $idemsvc_port 0 $idemsvc_pid begin 64" "$(svcbase begin)"
  pair cycle "bare_cycle $barechi_port 0 $barechi_pid cycle 64" "idemsvc_cycle $idemsvc_port 0 $idemsvc_pid cycle 64" "$(svcbase cycle)"
  pair replay "bare_replay $barechi_port 0 $barechi_pid replay 64" "idemsvc_replay $idemsvc_port 0 $idemsvc_pid replay 64" "$(svcbase replay)"
  pair pay64 "alone_pay64 $alone_port $alone_pid $idemsvc_pid pay 64" "sdk_pay64 $sdk_port $sdk_pid $idemsvc_pid pay 64" "$(base 64)"
  pair pay1 "alone_pay1 $alone_port $alone_pid $idemsvc_pid pay 1" "sdk_pay1 $sdk_port $sdk_pid $idemsvc_pid pay 1" "$(base 1)"
  pair proxy64 "direct_pay64 $alone_port $alone_pid $idemsvc_pid pay 64" "proxy_pay64 $proxy_port $proxy_pid $idemsvc_pid pay 64"
  pair proxy1 "direct_pay1 $alone_port $alone_pid $idemsvc_pid pay 1" "proxy_pay1 $proxy_port $proxy_pid $idemsvc_pid pay 1"
  rate=$(awk -v r="$run" -v s="$open_share" '$1 == "bare_begin" { n++; if (n == r) printf "%.0f\n", $2 * s }' "$dir/figures")
  pair open "bare_open $barechi_port 0 $barechi_pid begin 128 $rate" "idemsvc_open $idemsvc_port 0 $idemsvc_pid begin 128 $rate"
  echo
  echo "run $run of $runs (open loop at $rate/s; load $(cut -d' ' -f1-3 /proc/loadavg))"
  fmt_row "" "${columns[@]}"
  # shellcheck disable=SC2086 # the figures are words
  awk -v n="$run" '{ seen[$1]++ } seen[$1] == n' "$dir/figures" | sort | while read -r line; do fmt_row $line; done
done

labels=(bare_begin idemsvc_begin bare_cycle idemsvc_cycle bare_replay idemsvc_replay
  alone_pay64 sdk_pay64 alone_pay1 sdk_pay1 direct_pay64 proxy_pay64 direct_pay1 proxy_pay1 bare_open idemsvc_open)
[ -n "$base_pid" ] && labels+=(base_pay64 base_pay1)
[ -n "$svcbase_pid" ] && labels+=(svcbase_begin svcbase_cycle svcbase_replay)
# column LABEL N: the median over the runs of LABEL's Nth column.
column() { awk -v l="$1" -v c="$2" '$1 == l { print $c }' "$dir/figures" | median; }
# ratio A B N [OP]: the median over the runs of A's Nth column OP B's (/ by
# default, or -), each run's pair measured side by side.
ratio() {
  paste <(awk -v l="$1" -v c="$3" '$1 == l { print $c }' "$dir/figures") \
    <(awk -v l="$2" -v c="$3" '$1 == l { print $c }' "$dir/figures") |
    awk -v op="${4:-/}" '{ printf "%.4f\n", op == "-" ? $1 - $2 : $1 / $2 }' | median
}
echo
echo "medians of $runs runs, ${duration}s each"
fmt_row "" "${columns[@]}"
for label in "${labels[@]}"; do
  cols=()
  for c in $(seq 2 $((${#columns[@]} + 1))); do cols+=("$(column "$label" "$c")"); done
  fmt_row "$label" "${cols[@]}"
done
echo
echo "medians of the per-run ratios (idemsvc / barechi unless said):"
for op in begin cycle replay; do
  picked "$op" || continue
  awk -v op="$op" -v r="$(ratio "idemsvc_$op" "bare_$op" 2)" -v cpu="$(ratio "idemsvc_$op" "bare_$op" 6)" \
    'BEGIN { printf "  %-7s %.3f of the throughput, %.2fx the server CPU\n", op, r, cpu }'
done
for c in 64 1; do
  picked "pay$c" || continue
  awk -v c="$c" -v r="$(ratio "sdk_pay$c" "alone_pay$c" 2)" -v app="$(ratio "sdk_pay$c" "alone_pay$c" 5 -)" \
    -v p50="$(ratio "sdk_pay$c" "alone_pay$c" 3 -)" -v alone="$(column "alone_pay$c" 5)" \
    'BEGIN { printf "  pay at concurrency %s, behind the middleware / alone: %.3f of the throughput, +%.2f ms at p50; app CPU %.1f µs/request alone, +%.1f µs behind the middleware, %.1f µs per SDK call\n", c, r, p50, alone, app, app / 2 }'
done
for c in 64 1; do
  picked "proxy$c" || continue
  awk -v c="$c" -v r="$(ratio "proxy_pay$c" "direct_pay$c" 2)" -v p50="$(ratio "proxy_pay$c" "direct_pay$c" 3 -)" \
    -v p99="$(ratio "proxy_pay$c" "direct_pay$c" 4 -)" -v cpu="$(column "proxy_pay$c" 5)" \
    'BEGIN { printf "  pay at concurrency %s, behind idemproxy / alone: %.3f of the throughput, +%.2f ms at p50, +%.2f ms at p99; idemproxy CPU %.1f µs/request\n", c, r, p50, p99, cpu }'
done
if [ -n "$svcbase_pid" ]; then
  for op in begin cycle replay; do
    picked "$op" || continue
    awk -v op="$op" -v r="$(ratio "svcbase_$op" "bare_$op" 2)" -v cpu="$(ratio "svcbase_$op" "bare_$op" 6)" -v rev="$SVC_BASE" \
      'BEGIN { printf "  %-7s idemsvc of %s: %.3f of the throughput, %.2fx the server CPU\n", op, rev, r, cpu }'
  done
fi
if [ -n "$base_pid" ]; then
  for c in 64 1; do
    picked "pay$c" || continue
    awk -v c="$c" -v r="$(ratio "sdk_pay$c" "base_pay$c" 2)" -v app="$(ratio "sdk_pay$c" "base_pay$c" 5 -)" \
      -v base="$(ratio "base_pay$c" "alone_pay$c" 5 -)" -v rev="$SDK_BASE" \
      'BEGIN { printf "  pay at concurrency %s, this SDK / the SDK of %s: %.3f of the throughput, %+.1f µs of app CPU per request (%.1f µs per SDK call there)\n", c, rev, r, app, base / 2 }'
  done
fi
picked open && awk -v rate="$(column bare_open 2)" -v got="$(ratio idemsvc_open bare_open 2)" -v p99="$(ratio idemsvc_open bare_open 4)" \
  -v bare="$(column bare_open 4)" -v idem="$(column idemsvc_open 4)" -v share="$open_share" \
  'BEGIN { printf "  open loop at %.0f%% of barechi'"'"'s closed-loop begins/s: idemsvc served %.3f of barechi'"'"'s rate; p99 %.2f ms against %.2f ms, %.2fx\n", 100 * share, got, idem, bare, p99 }'
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "full reports: $results"

if [ -n "${PROFILE:-}" ]; then
  # profile NAME PPROF_PORT BINARY LOAD...: a CPU profile of the process
  # serving pprof at PPROF_PORT while the load runs.
  profile() {
    local name=$1 port=$2 bin=$3
    shift 3
    (sleep 1 && curl -s -o "$results/$name.cpu.pprof" "http://127.0.0.1:$port/debug/pprof/profile?seconds=$seconds") &
    local curl_pid=$!
    load "$@"
    wait "$curl_pid"
    go tool pprof -top -nodecount=60 "$results/$bin" "$results/$name.cpu.pprof" >"$results/$name.top.txt" 2>/dev/null
    go tool pprof -top -cum -nodecount=150 "$results/$bin" "$results/$name.cpu.pprof" >"$results/$name.cum.txt" 2>/dev/null
    echo "$name, top of the profile:"
    sed -n '5,20p' "$results/$name.top.txt"
  }
  echo
  echo "profiling payapp behind the middleware under pay64, and idemsvc under pay64, begin, cycle and replay"
  run=profile
  seconds=$((duration > 3 ? duration - 2 : 1))
  (sleep 1 && curl -s -o "$results/idemsvc-pay64.cpu.pprof" "http://127.0.0.1:$idemsvc_pprof/debug/pprof/profile?seconds=$seconds") &
  idemsvc_curl=$!
  profile payapp-pay64 "$sdk_pprof" payapp sdk_pay64 "$sdk_port" "$sdk_pid" "$idemsvc_pid" pay 64
  wait "$idemsvc_curl"
  go tool pprof -top -cum -nodecount=150 "$results/idemsvc" "$results/idemsvc-pay64.cpu.pprof" >"$results/idemsvc-pay64.cum.txt" 2>/dev/null
  for mix in begin cycle replay; do
    profile "idemsvc-$mix" "$idemsvc_pprof" idemsvc "idemsvc_$mix" "$idemsvc_port" 0 "$idemsvc_pid" "$mix" 64
  done
  echo "profiles (NAME.cpu.pprof, NAME.top.txt, NAME.cum.txt), and the binaries for go tool pprof, in $results"
fi
