#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Measures idemsvc over HTTP with idembench and compares it with barechi, a
# bare chi handler that runs the same begin script (benchmarks/barechi).
# Everything runs on this machine, on a Redis of its own:
#
#   benchmarks/http-load.sh [runs]      (default 3)
#
# Each run puts, for DURATION seconds (default 10) at CONCURRENCY (default
# 64): begin on new keys on idemsvc, cycles (begin + complete) on idemsvc,
# and begin on new keys on barechi; Redis is flushed before each. idemsvc
# runs as shipped: tenants file, JSON logs at info (to a file). The script
# prints each run's figures and the medians over the runs: requests/s,
# cycles/s, latency percentiles, the CPU time per request of the server, of
# Redis and of idembench (from /proc and the shell's time), which shows where
# the machine's cores went, and the share of the CPU that other processes
# took meanwhile (high values mean the figures are not to be trusted).
#
# LIMITS=1 adds, to each run, the cost of tenant limits on the same build:
# begin and cycle loads on a second idemsvc whose tenant has limits high
# enough never to refuse (rate taken from Redis in batches, as shipped),
# and begin loads on a third built with one Redis call per begin
# (RateBatch 1, through go build -overlay), each beside the first idemsvc,
# which has no limits.
#
# TLS=1 adds, to each run, begin and cycle loads on a second idemsvc that
# serves HTTPS (a self-signed certificate made with openssl, which idembench
# trusts through SSL_CERT_FILE), each beside the same load on the first,
# which serves plain HTTP: the cost of TLS to callers.
#
# PROFILE=1 adds, after the runs, one more begin and one more cycle load on
# an idemsvc built with a net/http/pprof listener (added at build time with
# go build -overlay; the source is not changed) and saves their CPU
# profiles and `go tool pprof -top` summaries next to the reports.
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/lib.sh
runs=${1:-3}
duration=${DURATION:-10}
concurrency=${CONCURRENCY:-64}

workdirs http-load

echo "building idemsvc, barechi and idembench"
go build -o "$dir/idemsvc" ./cmd/idemsvc
go build -o "$dir/barechi" ./benchmarks/barechi
go build -o "$dir/idembench" ./cmd/idembench

start_redis
bench_tenant
# The same tenant with limits that never refuse (LIMITS=1).
{ printf 'defaults:\n  limits: {begins_per_s: 10000000, burst: 10000000, stored_bytes: 1125899906842624, waiters: 10000000}\n'
  cat "$dir/tenants.yaml"; } >"$dir/tenants-limits.yaml"

# start_idemsvc BINARY [TENANTS_FILE]: serves on $idemsvc_port; its PID is
# $idemsvc_pid. Logs are appended, so that load can empty the file while it
# is open.
start_idemsvc() {
  idemsvc_port=$(free_port)
  "$1" --listen "127.0.0.1:$idemsvc_port" --redis-url "$redis_url" \
    --tenants-file "${2:-$dir/tenants.yaml}" --log-level info "${@:3}" 2>>"$dir/idemsvc.log" &
  idemsvc_pid=$!
  pids+=("$idemsvc_pid")
  local scheme=http
  [ "$#" -gt 2 ] && scheme=https
  wait_http "$scheme://127.0.0.1:$idemsvc_port/readyz" "$dir/tls.crt"
}
start_idemsvc "$dir/idemsvc"
if [ -n "${TLS:-}" ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=127.0.0.1 \
    -addext subjectAltName=IP:127.0.0.1 -keyout "$dir/tls.key" -out "$dir/tls.crt" 2>/dev/null
  main_port=$idemsvc_port main_pid=$idemsvc_pid
  start_idemsvc "$dir/idemsvc" "$dir/tenants.yaml" --tls-cert-file "$dir/tls.crt" --tls-key-file "$dir/tls.key"
  tls_port=$idemsvc_port tls_pid=$idemsvc_pid
  idemsvc_port=$main_port idemsvc_pid=$main_pid
fi
if [ -n "${LIMITS:-}" ]; then
  main_port=$idemsvc_port main_pid=$idemsvc_pid
  start_idemsvc "$dir/idemsvc" "$dir/tenants-limits.yaml"
  limits_port=$idemsvc_port limits_pid=$idemsvc_pid
  sed 's/DefaultRateBatch     = 64/DefaultRateBatch     = 1/' internal/quota/quota.go >"$dir/quota-percall.go"
  grep -q 'DefaultRateBatch     = 1$' "$dir/quota-percall.go"
  printf '{"Replace": {"%s": "%s"}}\n' "$PWD/internal/quota/quota.go" "$dir/quota-percall.go" >"$dir/overlay-percall.json"
  go build -overlay "$dir/overlay-percall.json" -o "$dir/idemsvc-percall" ./cmd/idemsvc
  start_idemsvc "$dir/idemsvc-percall" "$dir/tenants-limits.yaml"
  percall_port=$idemsvc_port percall_pid=$idemsvc_pid
  idemsvc_port=$main_port idemsvc_pid=$main_pid
fi
barechi_port=$(free_port)
"$dir/barechi" --listen "127.0.0.1:$barechi_port" --redis-url "$redis_url" 2>"$dir/barechi.log" &
barechi_pid=$!
pids+=("$barechi_pid")
wait_http "http://127.0.0.1:$barechi_port/"


# load NAME PORT SERVER_PID MIX [SCHEME]: one idembench run on a flushed
# Redis, over http unless SCHEME says https. The
# report goes to $results/NAME.txt; the CPU µs per request of the server,
# Redis and idembench, and the share of the machine's CPU that other
# processes took meanwhile, to $results/NAME.cpu.
load() {
  local name=$1 port=$2 server=$3 mix=$4 scheme=${5:-http}
  redis-cli -p "$redis_port" flushall sync >/dev/null
  : >"$dir/idemsvc.log" # as shipped it logs every request; keep the file small
  local s0 r0 m0 s1 r1 m1 status=0
  s0=$(cpu_ticks "$server")
  r0=$(cpu_ticks "$redis_pid")
  m0=$(machine_ticks)
  TIMEFORMAT='%U %S'
  { time SSL_CERT_FILE="$dir/tls.crt" "$dir/idembench" --url "$scheme://127.0.0.1:$port" --mix "$mix" --concurrency "$concurrency" \
    --duration "${duration}s" >"$results/$name.txt" 2>"$dir/idembench.err" || status=$?; } 2>"$dir/time"
  s1=$(cpu_ticks "$server")
  r1=$(cpu_ticks "$redis_pid")
  m1=$(machine_ticks)
  if [ "$status" != 0 ]; then
    cat "$results/$name.txt" "$dir/idembench.err"
    echo "idembench failed: $name" >&2
    exit 1
  fi
  local n
  n=$(awk '$1 == "requests/s" { gsub(/\(/, "", $3); print $3 }' "$results/$name.txt")
  echo "$(per_request $((s1 - s0)) "$n") $(per_request $((r1 - r0)) "$n")" \
    "$(awk -v n="$n" '{ printf "%.1f\n", ($1 + $2) * 1e6 / n }' "$dir/time")" \
    "$(awk -v m0="$m0" -v m1="$m1" -v ours=$((s1 - s0 + r1 - r0)) -v hz="$clk_tck" '{
      split(m0, a, " "); split(m1, b, " ")
      other = (b[1] - a[1]) - ours - ($1 + $2) * hz
      share = other > 0 ? 100 * other / (b[2] - a[2]) : 0
      printf "%.0f\n", share }' "$dir/time")" >"$results/$name.cpu"
}
# row NAME OP: an operation's p50, p90, p99 and max.
row() { awk -v op="$2" '$1 == op { print $4, $5, $6, $8 }' "$results/$1.txt"; }
total() { awk -v what="$2" '$1 == what { print $2 }' "$results/$1.txt"; }
errors() { awk '$1 == "errors:" { print $2 }' "$results/$1.txt"; }

# Per-run figures go to $dir/figures, one line per label.
record() { echo "$*" >>"$dir/figures"; }
columns=(req/s cycles/s p50_ms p90_ms p99_ms max_ms srv_us/req redis_us/req gen_us/req other_cpu%)
fmt_row() { printf '%-23s %9s %9s %7s %7s %7s %7s %10s %12s %10s %10s\n' "$@"; }

for run in $(seq "$runs"); do
  if [ -z "${LIMITS:-}" ]; then
    load "idemsvc-begin-$run" "$idemsvc_port" "$idemsvc_pid" begin
    load "idemsvc-cycle-$run" "$idemsvc_port" "$idemsvc_pid" cycle
  elif [ $((run % 2)) = 1 ]; then
    # Each load with limits right beside the same load without, in an order
    # that alternates from run to run, as the machine's other load drifts.
    load "idemsvc-begin-$run" "$idemsvc_port" "$idemsvc_pid" begin
    load "limits-begin-$run" "$limits_port" "$limits_pid" begin
    load "percall-begin-$run" "$percall_port" "$percall_pid" begin
    load "idemsvc-cycle-$run" "$idemsvc_port" "$idemsvc_pid" cycle
    load "limits-cycle-$run" "$limits_port" "$limits_pid" cycle
  else
    load "percall-begin-$run" "$percall_port" "$percall_pid" begin
    load "limits-begin-$run" "$limits_port" "$limits_pid" begin
    load "idemsvc-begin-$run" "$idemsvc_port" "$idemsvc_pid" begin
    load "limits-cycle-$run" "$limits_port" "$limits_pid" cycle
    load "idemsvc-cycle-$run" "$idemsvc_port" "$idemsvc_pid" cycle
  fi
  if [ -n "${TLS:-}" ]; then
    load "tls-begin-$run" "$tls_port" "$tls_pid" begin https
    load "tls-cycle-$run" "$tls_port" "$tls_pid" cycle https
  fi
  load "barechi-begin-$run" "$barechi_port" "$barechi_pid" begin
  b=idemsvc-begin-$run c=idemsvc-cycle-$run bare=barechi-begin-$run
  record idemsvc_begin "$(total "$b" requests/s)" - "$(row "$b" begin)" "$(cat "$results/$b.cpu")"
  for op in cycle.begin cycle.complete cycle; do
    record "idemsvc_$op" "$(total "$c" requests/s)" "$(total "$c" cycles/s)" "$(row "$c" "$op")" "$(cat "$results/$c.cpu")"
  done
  record barechi_begin "$(total "$bare" requests/s)" - "$(row "$bare" begin)" "$(cat "$results/$bare.cpu")"
  lines=5 limit_errors=""
  if [ -n "${LIMITS:-}" ]; then
    lb=limits-begin-$run pb=percall-begin-$run lc=limits-cycle-$run
    record limits_begin "$(total "$lb" requests/s)" - "$(row "$lb" begin)" "$(cat "$results/$lb.cpu")"
    record percall_begin "$(total "$pb" requests/s)" - "$(row "$pb" begin)" "$(cat "$results/$pb.cpu")"
    record limits_cycle "$(total "$lc" requests/s)" "$(total "$lc" cycles/s)" "$(row "$lc" cycle)" "$(cat "$results/$lc.cpu")"
    lines=8 limit_errors=", limits begin $(errors "$lb"), per-call begin $(errors "$pb"), limits cycle $(errors "$lc")"
  fi
  if [ -n "${TLS:-}" ]; then
    tb=tls-begin-$run tc=tls-cycle-$run
    record tls_begin "$(total "$tb" requests/s)" - "$(row "$tb" begin)" "$(cat "$results/$tb.cpu")"
    record tls_cycle "$(total "$tc" requests/s)" "$(total "$tc" cycles/s)" "$(row "$tc" cycle)" "$(cat "$results/$tc.cpu")"
    lines=$((lines + 2)) limit_errors="$limit_errors, TLS begin $(errors "$tb"), TLS cycle $(errors "$tc")"
  fi
  echo
  echo "run $run of $runs (errors: idemsvc begin $(errors "$b"), cycle $(errors "$c"), barechi begin $(errors "$bare")$limit_errors; load $(cut -d' ' -f1-3 /proc/loadavg))"
  fmt_row "" "${columns[@]}"
  # shellcheck disable=SC2086 # the figures are words
  tail -n "$lines" "$dir/figures" | while read -r label rest; do fmt_row "$label" $rest; done
done

# column LABEL N: the median of the figures' Nth column for LABEL.
column() { awk -v l="$1" -v c="$2" '$1 == l { print $c }' "$dir/figures" | median; }
echo
echo "medians of $runs runs, ${duration}s each, concurrency $concurrency"
fmt_row "" "${columns[@]}"
labels=(idemsvc_begin idemsvc_cycle.begin idemsvc_cycle.complete idemsvc_cycle barechi_begin)
[ -n "${LIMITS:-}" ] && labels+=(limits_begin percall_begin limits_cycle)
[ -n "${TLS:-}" ] && labels+=(tls_begin tls_cycle)
for label in "${labels[@]}"; do
  cols=()
  for c in $(seq 2 $((${#columns[@]} + 1))); do cols+=("$(column "$label" "$c")"); done
  fmt_row "$label" "${cols[@]}"
done
awk -v a="$(column idemsvc_begin 2)" -v b="$(column barechi_begin 2)" \
  'BEGIN { printf "idemsvc begin / barechi begin: %.1f%% of the requests/s\n", 100 * a / b }'
# ratio A B N: the median over the runs of A's figure in column N over
# B's, each run's pair measured side by side.
ratio() {
  paste <(awk -v l="$1" -v c="$3" '$1 == l { print $c }' "$dir/figures") \
    <(awk -v l="$2" -v c="$3" '$1 == l { print $c }' "$dir/figures") |
    awk '{ printf "%.4f\n", $1 / $2 }' | median
}
if [ -n "${TLS:-}" ]; then
  for pair in "tls_begin idemsvc_begin begin over HTTPS" "tls_cycle idemsvc_cycle cycle over HTTPS"; do
    read -r a b what <<<"$pair"
    awk -v r="$(ratio "$a" "$b" 2)" -v cpu="$(ratio "$a" "$b" 8)" -v gen="$(ratio "$a" "$b" 10)" -v what="$what" \
      'BEGIN { printf "%s / over HTTP: %.1f%% of the requests/s, %.1f%% of the idemsvc CPU and %.1f%% of the caller CPU per request\n", what, 100 * r, 100 * cpu, 100 * gen }'
  done
fi
if [ -n "${LIMITS:-}" ]; then
  # The requests/s, and the idemsvc CPU per request, which the machine's
  # other load disturbs less.
  for pair in "limits_begin idemsvc_begin begin with limits (batched)" \
    "percall_begin idemsvc_begin begin with limits (one Redis call per begin)" \
    "limits_cycle idemsvc_cycle cycle with limits"; do
    read -r a b what <<<"$pair"
    awk -v r="$(ratio "$a" "$b" 2)" -v cpu="$(ratio "$a" "$b" 8)" -v redis="$(ratio "$a" "$b" 9)" -v what="$what" \
      'BEGIN { printf "%s / without: %.1f%% of the requests/s, %.1f%% of the idemsvc CPU and %.1f%% of the Redis CPU per request\n", what, 100 * r, 100 * cpu, 100 * redis }'
  done
fi
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "full reports: $results"

if [ -n "${PROFILE:-}" ]; then
  echo
  echo "profiling idemsvc"
  pprof_overlay cmd/idemsvc
  go build -overlay "$dir/overlay.json" -o "$results/idemsvc-pprof" ./cmd/idemsvc
  kill "$idemsvc_pid"
  wait "$idemsvc_pid" 2>/dev/null || true
  pprof_port=$(free_port)
  BENCH_PPROF=127.0.0.1:$pprof_port start_idemsvc "$results/idemsvc-pprof"
  for mix in begin cycle; do
    (sleep 1 && curl -s -o "$results/idemsvc-$mix.cpu.pprof" \
      "http://127.0.0.1:$pprof_port/debug/pprof/profile?seconds=$((duration > 3 ? duration - 2 : 1))") &
    curl_pid=$!
    load "profiled-$mix" "$idemsvc_port" "$idemsvc_pid" "$mix"
    wait "$curl_pid"
    go tool pprof -top -nodecount=60 "$results/idemsvc-pprof" "$results/idemsvc-$mix.cpu.pprof" \
      >"$results/idemsvc-$mix.top.txt" 2>/dev/null
    go tool pprof -top -cum -nodecount=100 "$results/idemsvc-pprof" "$results/idemsvc-$mix.cpu.pprof" \
      >"$results/idemsvc-$mix.cum.txt" 2>/dev/null
    echo "$mix: $(total "profiled-$mix" requests/s) req/s while profiled; top of the profile:"
    sed -n '5,25p' "$results/idemsvc-$mix.top.txt"
  done
  echo "profiles, and the binary for go tool pprof, in $results"
fi
