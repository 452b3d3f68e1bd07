#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Counts the CPU instructions idemsvc and barechi (the bare chi handler that
# runs the same scripts) spend per request, with valgrind's callgrind:
# unlike CPU time, the count hardly depends on what else the machine is
# doing, so a change of a few percent shows where loads on this shared
# machine, noisy by 15% and more, cannot tell it from noise.
#
#   benchmarks/http-instructions.sh [seconds]      (default 20; make load-instructions)
#
# For each load (begin on new keys, begin + complete, begin of a completed
# key with a 1 KiB body, and the last two with a 16 KiB JSON answer:
# cycle16k, replay16k) and each server, it starts the server under
# callgrind on a Redis of its own, warms it up uninstrumented, then counts
# the instructions of every thread of the server, the Go runtime's
# included, while idembench puts the load on at concurrency 4 for
# `seconds`, and prints instructions per request (per cycle for cycle) and
# the ratio to barechi's. idemsvc runs as shipped: tenants file, JSON logs
# at info, metrics.
#
# What it does not count: the kernel's work for the process (the system
# calls of the two sockets, about a third of either server's CPU time in
# the loads of caller-load.sh, and alike for both) and Redis's. So the
# ratio of instructions is larger than the ratio of CPU time: it measures
# the servers' own code.
#
# KEEP=DIR keeps callgrind's files there, as SERVER-LOAD.callgrind with the
# binaries, for callgrind_annotate (instructions per function).
#
# SVC_ENV='NAME=value ...' runs idemsvc (not barechi) with these
# variables: SVC_ENV=IDEMSVC_ACCESS_LOG=errors, say, or GOGC=100;
# SVC_BASE_ENV likewise the build of SVC_BASE. SVC_BASE=HEAD with either
# compares two settings of one build in one run.
#
# SVC_BASE=REV adds idemsvc built from git revision REV, counted the same
# way: a change to idemsvc, measured to the instruction. Each count comes
# from one run; the same binary and load give the same count to within
# about 1% (the scheduler's and the collector's timing vary).
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/lib.sh
seconds=${1:-20}
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 1; }

workdirs http-instructions
echo "building idemsvc, barechi and idembench"
go build -o "$dir/idemsvc" ./cmd/idemsvc
go build -o "$dir/barechi" ./benchmarks/barechi
go build -o "$dir/idembench" ./cmd/idembench
servers=(barechi idemsvc)
if [ -n "${SVC_BASE:-}" ]; then
  git worktree add -q --detach "$dir/svcbase" "$SVC_BASE"
  built=0
  (cd "$dir/svcbase" && go build -o "$dir/idemsvc-base" ./cmd/idemsvc) || built=$?
  git worktree remove --force "$dir/svcbase"
  [ "$built" = 0 ] || exit "$built"
  servers+=(idemsvc-base)
fi
start_redis
bench_tenant
# The servers' logs go to a folder of their own: idemsvc watches the
# tenants file's folder, and a log written there would wake that watch
# at every write, as no deployment's log does.
mkdir -p "$dir/logs"

# count SERVER MIX: sets counted to the instructions per request (per
# cycle) of SERVER under a load of MIX. (Not in a subshell: the server's
# PID must reach pids, and a failure must stop the script.)
count() {
  local server=$1 load=$2 mix port vg_pid args=() envs=() up=0 answer=()
  mix=${load%16k}
  [ "$mix" != "$load" ] && answer=(--answer-bytes 16384)
  port=$(free_port)
  case $server in
  barechi) args=(--redis-url "$redis_url") ;;
  *)
    args=(--redis-url "$redis_url" --tenants-file "$dir/tenants.yaml" --log-level info)
    if [ "$server" = idemsvc ]; then
      read -r -a envs <<<"${SVC_ENV:-}"
    else
      read -r -a envs <<<"${SVC_BASE_ENV:-}"
    fi
    ;;
  esac
  rm -f "$dir"/cg.out.*
  # Go's asynchronous preemption signals would only slow valgrind down;
  # the runtime reads the clock with RDTSCP where the CPU has it, which
  # valgrind before 3.20 does not know (SIGILL at start).
  env "${envs[@]}" GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$dir/cg.out.%p" \
    "$dir/$server" --listen "127.0.0.1:$port" "${args[@]}" >>"$dir/logs/$server.log" 2>&1 &
  vg_pid=$!
  pids+=("$vg_pid")
  for _ in $(seq 300); do curl -s -o /dev/null "http://127.0.0.1:$port/" && up=1 && break; sleep 0.1; done
  [ "$up" = 1 ] || { echo "$server did not come up under valgrind (see $dir/logs/$server.log)" >&2; return 1; }
  local bench=("$dir/idembench" --url "http://127.0.0.1:$port" --mix "$mix" --concurrency 4 --replay-keys 16 "${answer[@]}")
  "${bench[@]}" --duration 3s >/dev/null # warm-up: pools, caches, valgrind's translations
  callgrind_control -i on "$vg_pid" >"$dir/control.log" 2>&1 || { cat "$dir/control.log" >&2; return 1; }
  "${bench[@]}" --duration "${seconds}s" >"$dir/report"
  callgrind_control -i off "$vg_pid" >>"$dir/control.log" 2>&1
  callgrind_control -d "$vg_pid" >>"$dir/control.log" 2>&1
  kill "$vg_pid"
  wait "$vg_pid" 2>/dev/null || true
  local unit=requests total n
  [ "$mix" = cycle ] && unit=cycles
  n=$(awk -v u="$unit/s" '$1 == u { gsub(/[()]/, "", $3); print $3; exit }' "$dir/report")
  if grep -q -E '^(errors: [0-9]|ERROR)' "$dir/report" || [ -z "$n" ] || [ "$n" = 0 ]; then
    echo "$server, $load: idembench failed:" >&2
    cat "$dir/report" >&2
    return 1
  fi
  if [ -n "${KEEP:-}" ]; then
    mkdir -p "$KEEP"
    cp "$dir/$server" "$KEEP/"
    cat "$dir"/cg.out.*.1 >"$KEEP/$server-$load.callgrind"
  fi
  total=$(cat "$dir"/cg.out.* | awk '$1 == "totals:" { s += $2 } END { print s + 0 }')
  [ "$total" -gt 0 ] || { echo "$server, $load: callgrind counted nothing:" >&2; cat "$dir/control.log" >&2; return 1; }
  counted=$((total / n))
}

printf '%-8s %14s %14s' load "barechi" "idemsvc"
[ -n "${SVC_BASE:-}" ] && printf ' %14s' "idemsvc@$SVC_BASE"
printf '   instructions per request (cycle), and idemsvc over barechi\n'
for mix in ${LOADS:-begin cycle replay cycle16k replay16k}; do
  declare -A got=()
  for server in "${servers[@]}"; do
    count "$server" "$mix"
    got[$server]=$counted
  done
  printf '%-8s %14d %14d' "$mix" "${got[barechi]}" "${got[idemsvc]}"
  [ -n "${SVC_BASE:-}" ] && printf ' %14d' "${got[idemsvc-base]}"
  awk -v b="${got[barechi]}" -v i="${got[idemsvc]}" 'BEGIN { printf "   %.3fx", i / b }'
  [ -n "${SVC_BASE:-}" ] && awk -v i="${got[idemsvc]}" -v s="${got[idemsvc-base]}" \
    'BEGIN { printf ", this idemsvc over the base: %.3fx", i / s }'
  echo
  unset got
done
