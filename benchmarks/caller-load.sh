#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The whole path a caller feels, measured side by side with its baselines:
#
#   benchmarks/caller-load.sh [runs]      (default 5; make load-sdk)
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
#   express               the Express app (benchmarks/expressapp), POST
#                         /pay answering 201 as payapp does, alone, behind
#                         the TypeScript SDK's Express middleware (clients/ts,
#                         built) with its defaults, and behind
#                         express-idempotency on this Redis (an in-process
#                         library, the peer), at concurrency 64, a new
#                         Idempotency-Key each; and behind the middleware
#                         on a client with coalesce (coalesce_express);
#   tsclient              the TypeScript SDK's client alone
#                         (benchmarks/expressapp/client-cpu.mjs): begin +
#                         complete on new keys, 16 at a time, its CPU per call
#                         by process.cpuUsage;
#   open                  begin on an open loop (idembench --rate, 128
#                         connections), each server at OPEN_SHARE (default
#                         0.8) of its own closed-loop begins/s of this run
#                         (idemsvc of idemsvc_begin, barechi of bare_begin).
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
#   - the Express app behind the SDK's middleware over the app alone and
#     over the app behind the in-process library, and the app's CPU per SDK
#     call; the client's own CPU per call (tsclient);
#   - the open loop: each server's scheduled and served rate, p99 and
#     p99.9, whether it kept the schedule (served at least 99% of the
#     scheduled turns, with no turn started over 100 ms late), and idemsvc's
#     p99 over barechi's.
#
# SDK_BASE=REV adds, to pay64 and pay1, the same app built with the SDK
# of git revision REV (from a temporary worktree), beside the others: a
# change to the SDK, measured side by side.
#
# TS_SDK_BASE=REV adds, to express and tsclient, the same Express app and
# client with the TypeScript SDK of git revision REV (built in a temporary
# worktree), beside the others.
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
# build time (go build -overlay; the source is not changed); and, with
# express picked, a node --cpu-prof profile of the Express app behind the
# TypeScript SDK's middleware under the express load.
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/lib.sh
runs=${1:-5}
duration=${DURATION:-10}
open_share=${OPEN_SHARE:-0.8}
loads=${LOADS:-begin,cycle,replay,pay64,pay1,proxy64,proxy1,express,tsclient,open}
# picked NAME: whether LOADS names NAME.
picked() { case ",$loads," in *",$1,"*) return 0 ;; esac; return 1; }
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
express=benchmarks/expressapp
sdk_dist=$PWD/clients/ts/dist
if picked express || picked tsclient; then
  echo "building the TypeScript SDK, installing the Express app's packages"
  clients/ts/scripts/deps.sh >/dev/null
  (cd clients/ts && npm run --silent build)
  lock=$(sha256sum "$express/package-lock.json" | cut -d' ' -f1)
  if [ "$(cat "$express/node_modules/.package-lock.sha256" 2>/dev/null)" != "$lock" ]; then
    (cd "$express" && npm ci --no-audit --no-fund >/dev/null)
    echo "$lock" >"$express/node_modules/.package-lock.sha256"
  fi
  if [ -n "${TS_SDK_BASE:-}" ]; then
    git worktree add -q --detach "$dir/tsbase" "$TS_SDK_BASE"
    ln -s "$PWD/clients/ts/node_modules" "$dir/tsbase/clients/ts/node_modules"
    (cd "$dir/tsbase/clients/ts" && npx tsc -p tsconfig.json)
    cp -r "$dir/tsbase/clients/ts/dist" "$results/ts-base-dist"
    git worktree remove --force "$dir/tsbase"
  fi
fi

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

# node_app VAR MODE ARGS...: the Express app in MODE on a free port, its
# port in VAR_port and its PID in VAR_pid.
node_app() {
  local var=$1 port
  shift
  port=$(free_port)
  node "$express/app.mjs" --listen "127.0.0.1:$port" "$@" 2>"$dir/$var.log" &
  pids+=("$!")
  printf -v "${var}_port" %s "$port"
  printf -v "${var}_pid" %s "$!"
  wait_http "http://127.0.0.1:$port/"
}
tsbase_pid= ex_alone_port= ex_alone_pid= ex_sdk_port= ex_sdk_pid= ex_lib_port= ex_lib_pid= ex_co_port= ex_co_pid=
if picked express; then
  node_app ex_alone alone
  node_app ex_sdk sdk "http://127.0.0.1:$idemsvc_port" "$sdk_dist"
  node_app ex_co sdk-coalesce "http://127.0.0.1:$idemsvc_port" "$sdk_dist"
  node_app ex_lib lib "$redis_url"
  if [ -n "${TS_SDK_BASE:-}" ]; then node_app tsbase sdk "http://127.0.0.1:$idemsvc_port" "$results/ts-base-dist"; fi
  # A warm-up of each, not counted: V8 compiles and optimizes the hot
  # code in the first thousands of requests, whose CPU would otherwise
  # weigh on the first run's figures.
  for port in "$ex_alone_port" "$ex_sdk_port" "$ex_co_port" "$ex_lib_port" ${tsbase_port:+"$tsbase_port"}; do
    "$dir/idembench" --url "http://127.0.0.1:$port" --mix pay --concurrency 64 --duration 3s >/dev/null 2>&1 || true
  done
fi

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
  if [ "$rate" != 0 ]; then
    # The open loop: scheduled and served rate, p99, p99.9, lag p99 and max.
    # shellcheck disable=SC2046 # the figures are words
    echo "$label" "$rate" "$per_s" $(awk -v op="$op" '$1 == op { print $6, $7; exit }' "$report") \
      $(awk '$1 == "lag_ms" { print $5, $7 }' "$report") >>"$dir/open"
  fi
  local errors
  errors=$(awk '$1 == "errors:" { print $2 }' "$report")
  [ "$errors" = none ] || echo "  $label: errors: $errors (see $report)"
}

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
# tsclient LABEL SDK_DIST [coalesce]: the TypeScript client's CPU per call
# on idemsvc (benchmarks/expressapp/client-cpu.mjs), to $dir/tsclient.
tsclient() {
  redis-cli -p "$redis_port" flushall sync >/dev/null
  # shellcheck disable=SC2046 # the figures are words
  echo "$1" $(node "$express/client-cpu.mjs" "http://127.0.0.1:$idemsvc_port" "$2" "$duration" ${3:+"$3"}) >>"$dir/tsclient"
}
base() { if [ -n "$base_pid" ]; then echo "base_pay$1 $base_port $base_pid $idemsvc_pid pay $1"; fi; }
svcbase() { if [ -n "$svcbase_pid" ]; then echo "svcbase_$1 $svcbase_port 0 $svcbase_pid $1 64"; fi; }

columns=(per_s p50_ms p99_ms app_us srv_us redis_us gen_us other%)
fmt_row() { printf '%-16s %9s %8s %8s %8s %8s %9s %8s %7s\n' "$@"; }

: >"$dir/figures"
: >"$dir/open"
: >"$dir/tsclient"
# own_rate LABEL: OPEN_SHARE of LABEL's closed-loop rate in this run.
own_rate() { awk -v l="$1" -v r="$run" -v s="$open_share" '$1 == l { n++; if (n == r) printf "%.0f\n", $2 * s }' "$dir/figures"; }
for run in $(seq "$runs"); do
  pair begin "bare_begin $barechi_port 0 $barechi_pid begin 64" "idemsvc_begin $idemsvc_port 0 $idemsvc_pid begin 64" "$(svcbase begin)"
  # Each server's open loop at OPEN_SHARE of its own closed-loop begins/s of
  # this run, right after they were measured: the machine drifts less between.
  bare_rate=$(own_rate bare_begin) idemsvc_rate=$(own_rate idemsvc_begin)
  pair open "bare_open $barechi_port 0 $barechi_pid begin 128 $bare_rate" "idemsvc_open $idemsvc_port 0 $idemsvc_pid begin 128 $idemsvc_rate"
  pair cycle "bare_cycle $barechi_port 0 $barechi_pid cycle 64" "idemsvc_cycle $idemsvc_port 0 $idemsvc_pid cycle 64" "$(svcbase cycle)"
  pair replay "bare_replay $barechi_port 0 $barechi_pid replay 64" "idemsvc_replay $idemsvc_port 0 $idemsvc_pid replay 64" "$(svcbase replay)"
  pair pay64 "alone_pay64 $alone_port $alone_pid $idemsvc_pid pay 64" "sdk_pay64 $sdk_port $sdk_pid $idemsvc_pid pay 64" "$(base 64)"
  pair pay1 "alone_pay1 $alone_port $alone_pid $idemsvc_pid pay 1" "sdk_pay1 $sdk_port $sdk_pid $idemsvc_pid pay 1" "$(base 1)"
  pair proxy64 "direct_pay64 $alone_port $alone_pid $idemsvc_pid pay 64" "proxy_pay64 $proxy_port $proxy_pid $idemsvc_pid pay 64"
  pair express "alone_express $ex_alone_port $ex_alone_pid $idemsvc_pid pay 64" "sdk_express $ex_sdk_port $ex_sdk_pid $idemsvc_pid pay 64" \
    "lib_express $ex_lib_port $ex_lib_pid $redis_pid pay 64" "coalesce_express $ex_co_port $ex_co_pid $idemsvc_pid pay 64" "$(if [ -n "$tsbase_pid" ]; then echo "base_express $tsbase_port $tsbase_pid $idemsvc_pid pay 64"; fi)"
  if picked tsclient; then
    tsclient tsclient "$sdk_dist"
    tsclient coalesce_tsclient "$sdk_dist" coalesce
    if [ -n "${TS_SDK_BASE:-}" ]; then tsclient base_tsclient "$results/ts-base-dist"; fi
  fi
  pair proxy1 "direct_pay1 $alone_port $alone_pid $idemsvc_pid pay 1" "proxy_pay1 $proxy_port $proxy_pid $idemsvc_pid pay 1"
  echo
  echo "run $run of $runs (open loop at $bare_rate/s on barechi, $idemsvc_rate/s on idemsvc; load $(cut -d' ' -f1-3 /proc/loadavg))"
  fmt_row "" "${columns[@]}"
  # shellcheck disable=SC2086 # the figures are words
  awk -v n="$run" '{ seen[$1]++ } seen[$1] == n' "$dir/figures" | sort | while read -r line; do fmt_row $line; done
done

labels=(bare_begin idemsvc_begin bare_cycle idemsvc_cycle bare_replay idemsvc_replay
  alone_pay64 sdk_pay64 alone_pay1 sdk_pay1 direct_pay64 proxy_pay64 direct_pay1 proxy_pay1
  alone_express sdk_express coalesce_express lib_express bare_open idemsvc_open)
[ -n "$tsbase_pid" ] && labels+=(base_express)
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
if picked express; then
  awk -v r="$(ratio sdk_express alone_express 2)" -v lib="$(ratio sdk_express lib_express 2)" \
    -v libr="$(ratio lib_express alone_express 2)" -v app="$(ratio sdk_express alone_express 5 -)" \
    -v alone="$(column alone_express 5)" -v p50="$(ratio sdk_express alone_express 3 -)" \
    'BEGIN { printf "  Express at concurrency 64, behind the TS middleware / alone: %.3f of the throughput (the in-process library: %.3f); behind the middleware / behind the library: %.3f; +%.2f ms at p50; app CPU %.1f µs/request alone, +%.1f µs behind the middleware, %.1f µs per SDK call\n", r, libr, lib, p50, alone, app, app / 2 }'
  awk -v r="$(ratio coalesce_express alone_express 2)" -v lib="$(ratio coalesce_express lib_express 2)" -v sdk="$(ratio coalesce_express sdk_express 2)" \
    'BEGIN { printf "  Express behind the TS middleware on a client with coalesce / alone: %.3f of the throughput; / behind the library: %.3f; / without coalesce: %.3f\n", r, lib, sdk }'
  # The CPU of each process per request, and their sum: on a machine of
  # few cores, the sum bounds the requests/s (the library's server is
  # Redis itself, counted once).
  echo "  CPU µs per request, medians (app, idemsvc, Redis, idembench; total):"
  for label in alone_express sdk_express coalesce_express lib_express base_express; do
    [ "$label" != base_express ] || [ -n "$tsbase_pid" ] || continue
    awk -v l="$label" '$1 == l { srv = (l == "lib_express" || l == "alone_express") ? 0 : $6
      printf "%.1f %.1f %.1f %.1f %.1f\n", $5, srv, $7, $8, $5 + srv + $7 + $8 }' "$dir/figures" |
      sort -t' ' -k5 -g | awk -v l="$label" '{ row[NR] = $0 } END { if (NR) { split(row[int((NR + 1) / 2)], f, " ")
        printf "    %-17s app %7.1f  idemsvc %7.1f  redis %6.1f  idembench %6.1f  total %7.1f (the run of the median total)\n", l, f[1], f[2], f[3], f[4], f[5] } }'
  done
  if [ -n "$tsbase_pid" ]; then
    awk -v r="$(ratio sdk_express base_express 2)" -v app="$(ratio sdk_express base_express 5 -)" -v base="$(ratio base_express alone_express 2)" -v rev="$TS_SDK_BASE" \
      'BEGIN { printf "  Express, this SDK / the SDK of %s: %.3f of the throughput, %+.1f µs of app CPU per request (that SDK: %.3f of the app alone)\n", rev, r, app, base }'
  fi
fi
if picked tsclient; then
  # shellcheck disable=SC2016 # awk's fields
  tscol() { awk -v l="$1" -v c="$2" '$1 == l { print $c }' "$dir/tsclient" | median; }
  echo "  the TS client alone, begin + complete on new keys, 16 in flight: $(tscol tsclient 3) µs of CPU per call (process.cpuUsage), $(tscol tsclient 4) calls/s"
  echo "  the TS client alone with coalesce: $(tscol coalesce_tsclient 3) µs of CPU per call, $(tscol coalesce_tsclient 4) calls/s"
  if [ -n "${TS_SDK_BASE:-}" ]; then
    echo "  the TS client of $TS_SDK_BASE: $(tscol base_tsclient 3) µs of CPU per call, $(tscol base_tsclient 4) calls/s"
  fi
fi
if picked open; then
  echo
  echo "the open loop, each server at $open_share of its own closed-loop begins/s (per run: scheduled/s, served/s, p99, p99.9, lag p99 and max in ms; kept: served >= 99% of the schedule and no turn over 100 ms late):"
  for server in bare idemsvc; do
    awk -v l="${server}_open" '$1 == l { kept = ($3 >= 0.99 * $2 && $7 < 100) ? "kept" : "NOT kept"
      printf "  %-12s %8s %9s %8s %8s %8s %8s  %s\n", l, $2, $3, $4, $5, $6, $7, kept }' "$dir/open"
  done
  ocol() { awk -v l="$1" -v c="$2" '$1 == l { print $c }' "$dir/open" | median; }
  kept=$(awk '$1 == "idemsvc_open" && !($3 >= 0.99 * $2 && $7 < 100) { n++ } END { print n + 0 }' "$dir/open")
  p99=$(paste <(awk '$1 == "idemsvc_open" { print $4 }' "$dir/open") <(awk '$1 == "bare_open" { print $4 }' "$dir/open") |
    awk '{ printf "%.4f\n", $1 / $2 }' | median)
  echo "  medians: barechi at $(ocol bare_open 2)/s, p99 $(ocol bare_open 4) ms, p99.9 $(ocol bare_open 5) ms;" \
    "idemsvc at $(ocol idemsvc_open 2)/s, p99 $(ocol idemsvc_open 4) ms, p99.9 $(ocol idemsvc_open 5) ms;" \
    "idemsvc's p99 / barechi's (per run) ${p99}x; idemsvc fell behind the schedule in $kept of $runs runs"
fi
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
  if picked express; then
    # node --cpu-prof writes its profile when the app exits (on SIGTERM).
    port=$(free_port)
    node --cpu-prof --cpu-prof-dir="$results/express-prof" "$express/app.mjs" --listen "127.0.0.1:$port" \
      sdk "http://127.0.0.1:$idemsvc_port" "$sdk_dist" 2>"$dir/express-prof.log" &
    prof_pid=$!
    pids+=("$prof_pid")
    wait_http "http://127.0.0.1:$port/"
    load sdk_express "$port" "$prof_pid" "$idemsvc_pid" pay 64
    kill "$prof_pid"
    wait "$prof_pid" || true
    node "$express/cpuprofile-top.mjs" "$results"/express-prof/*.cpuprofile 40 clients/ts >"$results/express.top.txt"
    echo "the Express app behind the TS middleware under express, top of its profile (wall time: writev includes the waits for the CPU):"
    sed -n '1,25p' "$results/express.top.txt"
    echo "profile and its summary: $results/express-prof, $results/express.top.txt"
  fi
fi
