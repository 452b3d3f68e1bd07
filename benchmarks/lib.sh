# SPDX-License-Identifier: Apache-2.0
# Helpers shared by the load scripts in this folder; sourced, not run.

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_http URL [CA_FILE]: until something answers HTTP there.
wait_http() {
  for _ in $(seq 100); do
    if [ -n "${2:-}" ]; then
      curl -s -o /dev/null --cacert "$2" "$1" 2>/dev/null && return 0
    fi
    curl -s -o /dev/null "$1" && return 0
    sleep 0.1
  done
  echo "nothing answers at $1" >&2
  return 1
}

clk_tck=$(getconf CLK_TCK)
# cpu_ticks PID: the user and system CPU ticks the process has used.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# machine_ticks: busy and total CPU ticks of the whole machine.
machine_ticks() { awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat; }
# per_request TICKS REQUESTS: CPU µs per request.
per_request() { awk -v t="$1" -v n="$2" -v hz="$clk_tck" 'BEGIN { printf "%.1f\n", n ? t * 1e6 / hz / n : 0 }'; }

# median: of the numbers on stdin; "-" when there are none.
median() {
  sort -g | awk '{ v[NR] = $1 }
    END { if (NR == 0 || v[1] == "-") print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# start_redis: a redis-server of the script's own on a free port, keeping
# nothing on disk, in $dir; sets redis_port, redis_pid and redis_url, and
# adds the PID to pids.
start_redis() {
  redis_port=$(free_port)
  redis-server --bind 127.0.0.1 --port "$redis_port" --save '' --appendonly no --daemonize no \
    --dir "$dir" --logfile "$dir/redis.log" &
  redis_pid=$!
  pids+=("$redis_pid")
  local tries=0
  until redis-cli -p "$redis_port" ping >/dev/null 2>&1; do
    if ! kill -0 "$redis_pid" 2>/dev/null || [ $((tries += 1)) -gt 100 ]; then
      echo "redis-server did not come up (see $dir/redis.log)" >&2
      return 1
    fi
    sleep 0.1
  done
  redis_url=redis://127.0.0.1:$redis_port
}

# bench_tenant: the tenants file $dir/tenants.yaml, with one tenant,
# "bench", whose new API key goes to IDEMSVC_API_KEY.
bench_tenant() {
  local api_key
  api_key=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  printf 'tenants:\n  - name: bench\n    api_key_sha256: ["%s"]\n' \
    "$(printf %s "$api_key" | sha256sum | cut -d' ' -f1)" >"$dir/tenants.yaml"
  export IDEMSVC_API_KEY=$api_key
}

# workdirs NAME: $dir, a scratch folder removed at exit, and $results, a
# folder for the reports that stays; the processes in $pids are ended at
# exit.
workdirs() {
  dir=$(mktemp -d)
  results=$(mktemp -d -t "$1.XXXXXX")
  pids=()
  trap cleanup EXIT
}

cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$dir"
}

# pprof_overlay PACKAGE_DIR...: $dir/overlay.json, a go build -overlay file
# that adds to each main package a net/http/pprof listener at $BENCH_PPROF
# (none when it is unset); the source is not changed.
pprof_overlay() {
  cat >"$dir/pprof.go" <<'GO'
package main

import (
	"net/http"
	_ "net/http/pprof"
	"os"
)

func init() {
	if addr := os.Getenv("BENCH_PPROF"); addr != "" {
		go func() { _ = http.ListenAndServe(addr, nil) }()
	}
}
GO
  local replace="" pkg
  for pkg in "$@"; do
    replace+="${replace:+, }\"$PWD/$pkg/zz_bench_pprof.go\": \"$dir/pprof.go\""
  done
  printf '{"Replace": {%s}}\n' "$replace" >"$dir/overlay.json"
}
