#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs idemsvc's scripts straight through redis-benchmark: the ceiling that
# the Go benchmarks of internal/redisstore are compared against. Same
# concurrency (64 clients, no pipelining) on a Redis of its own.
#
#   benchmarks/redis-baseline.sh [requests]
#
# Prints requests/s and Redis's µs per EVALSHA for begin on new keys, begin
# on a completed key with a 1 KiB body, and complete.
set -euo pipefail
cd "$(dirname "$0")/.."
requests=${1:-200000}
clients=64

dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no --dir "$dir" \
  --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
cleanup() {
  [ -f "$dir/redis.pid" ] && kill "$(cat "$dir/redis.pid")" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
cli() { redis-cli -p "$port" "$@"; }
until cli ping >/dev/null 2>&1; do sleep 0.1; done

load() { cli script load "$(cat internal/lua/record.lua "internal/lua/$1.lua")"; }
begin=$(load begin)
complete=$(load complete)
token=TTTTTTTTTTTTTTTT # any 16 bytes
body=$(head -c 1024 /dev/zero | tr '\0' 'x')

# run NAME ARGS...: one redis-benchmark run, then its figures.
run() {
  local name=$1
  shift
  cli config resetstat >/dev/null
  local rps
  rps=$(redis-benchmark -p "$port" -c "$clients" -n "$requests" -q "$@" | tr '\r' '\n' | tail -1 |
    sed -E 's/.*: ([0-9.]+) requests per second.*/\1/')
  local usec
  usec=$(cli info commandstats | sed -nE 's/^cmdstat_evalsha:.*usec_per_call=([0-9.]+).*/\1/p')
  printf '%-28s %10s req/s %6s redis-µs/call\n' "$name" "$rps" "$usec"
}

run "begin (new key)" -r 100000000 evalsha "$begin" 1 'idem:{bench:__rand_int__}' "$token" "" "" 30000 86400 'order-__rand_int__'

cli evalsha "$begin" 1 'idem:{bench:done}' "$token" "" "" 30000 86400 done >/dev/null
cli evalsha "$complete" 1 'idem:{bench:done}' "$token" "$body" "" >/dev/null
run "begin (completed, 1 KiB)" evalsha "$begin" 1 'idem:{bench:done}' "$token" "" "" 30000 86400 done

# complete needs in-progress records: begin 3x as many random keys of a
# keyspace 5x the requests (95% of it), then complete random keys of it
# (about 10% of the completes repeat a key and take the retried-call path).
space=$((requests * 5))
redis-benchmark -p "$port" -c "$clients" -n $((space * 3)) -r "$space" -q \
  evalsha "$begin" 1 'idem:{bench:c:__rand_int__}' "$token" "" "" 3600000 86400 'c-__rand_int__' >/dev/null
run "complete" -r "$space" evalsha "$complete" 1 'idem:{bench:c:__rand_int__}' "$token" '{"id":"ch_1","amount":1200}' ""
