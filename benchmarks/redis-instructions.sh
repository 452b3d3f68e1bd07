#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Counts the CPU instructions Redis spends per EVALSHA of idemsvc's scripts,
# with valgrind's callgrind: unlike time, the count does not depend on what
# else the machine is doing, so two versions of a script compare exactly.
#
#   benchmarks/redis-instructions.sh [calls]      (default 10000)
#
# For each path (begin on new keys, begin on a completed key with a 1 KiB
# body, complete) it starts a Redis of its own under callgrind, prepares the
# records uninstrumented, counts the instructions of `calls` script calls
# from redis-benchmark (4 clients), and prints instructions per call. An
# EVALSHA of `return 1` with the same arguments is printed too: the part of
# every call that no script can save.
set -euo pipefail
cd "$(dirname "$0")/.."
calls=${1:-10000}
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 1; }

dir=$(mktemp -d)
vg_pid=
cleanup() {
  [ -n "$vg_pid" ] && kill "$vg_pid" 2>/dev/null && wait "$vg_pid" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT

token=TTTTTTTTTTTTTTTT # any 16 bytes
body=$(head -c 1024 /dev/zero | tr '\0' 'x')
script() { cat internal/lua/record.lua "internal/lua/$1.lua"; }

# count NAME SETUP... -- ARGS...: runs SETUP (a shell function, may be
# empty) against a fresh Redis under callgrind, then counts `calls`
# redis-benchmark calls of ARGS.
count() {
  local name=$1 setup=$2
  shift 2
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  rm -f "$dir"/cg.out.*
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$dir/cg.out.%p" \
    redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no --dir "$dir" \
    --logfile "$dir/redis.log" >/dev/null 2>&1 &
  vg_pid=$!
  until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.2; done
  begin=$(redis-cli -p "$port" script load "$(script begin)")
  complete=$(redis-cli -p "$port" script load "$(script complete)")
  noop=$(redis-cli -p "$port" script load 'return 1')
  [ -n "$setup" ] && "$setup"
  callgrind_control -i on "$vg_pid" >/dev/null 2>&1
  eval "redis-benchmark -p $port -c 4 -n $calls -q $*" >/dev/null
  callgrind_control -i off "$vg_pid" >/dev/null 2>&1
  callgrind_control -d "$vg_pid" >/dev/null 2>&1
  kill "$vg_pid"
  wait "$vg_pid" 2>/dev/null || true
  vg_pid=
  local total
  total=$(cat "$dir"/cg.out.* | awk '$1 == "totals:" { s += $2 } END { print s }')
  printf '%-28s %8d instructions/call\n' "$name" $((total / calls))
}

new_key="-r 100000000 evalsha \$begin 1 'idem:{bench:__rand_int__}' $token '' '' 30000 86400 'order-__rand_int__'"
count "EVALSHA of return 1" "" "-r 100000000 evalsha \$noop 1 'idem:{bench:__rand_int__}' $token '' '' 30000 86400 'order-__rand_int__'"
count "begin (new key)" "" "$new_key"

completed() {
  redis-cli -p "$port" evalsha "$begin" 1 'idem:{bench:done}' "$token" "" "" 30000 86400 done >/dev/null
  redis-cli -p "$port" evalsha "$complete" 1 'idem:{bench:done}' "$token" "$body" "" >/dev/null
}
count "begin (completed, 1 KiB)" completed "evalsha \$begin 1 'idem:{bench:done}' $token '' '' 30000 86400 done"

# complete on in-progress records: begin 3x calls keys of a space of 2x
# calls (95% of it), then complete random keys of it (about a fifth repeat
# a key and take the retried-call path).
space=$((calls * 2))
in_progress() {
  redis-benchmark -p "$port" -c 8 -n $((space * 3)) -r "$space" -q \
    evalsha "$begin" 1 'idem:{bench:c:__rand_int__}' "$token" "" "" 3600000 86400 'c-__rand_int__' >/dev/null
}
count "complete" in_progress "-r $space evalsha \$complete 1 'idem:{bench:c:__rand_int__}' $token '{\"id\":\"ch_1\",\"amount\":1200}' ''"
