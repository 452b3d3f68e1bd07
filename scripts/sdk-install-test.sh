#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# "Installing the SDKs" (docs/sdks.md), tried as a new user would: each SDK
# is installed into a scratch project in a temporary folder by the
# page's own commands (the shell blocks after <!-- install: go -->,
# <!-- install: ts --> and <!-- install: python -->, run as they are),
# the project is built, and it runs a begin, a complete and a replay
# against an idemsvc built from the checkout, on its in-memory store. IDEMSVC, the checkout the commands
# install from, is a copy of this one's files as a fresh clone has them
# (with their changes not yet committed): no node_modules or dist, and
# this checkout's are left alone. Run by scripts/test.sh (make test).
set -euo pipefail
cd "$(dirname "$0")/.."

work=$(mktemp -d)
idemsvc_pid=""
cleanup() {
  if [ -n "$idemsvc_pid" ]; then
    kill "$idemsvc_pid" 2>/dev/null || true
    wait "$idemsvc_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# install_block NAME: the shell block of docs/sdks.md marked <!-- install: NAME -->.
install_block() {
  awk -v mark="<!-- install: $1 -->" '
    $0 == mark { found = 1; next }
    found && !open && /^```sh$/ { open = 1; next }
    open && /^```$/ { exit }
    open { print }' docs/sdks.md
}

# run_block NAME DIR: the block run in DIR by bash, stopping at the first
# failing command, as a reader pasting it would see it fail.
run_block() {
  local commands
  commands=$(install_block "$1")
  if [ -z "$commands" ]; then
    echo "docs/sdks.md has no block marked <!-- install: $1 -->" >&2
    exit 1
  fi
  echo "== $1: the commands of docs/sdks.md, in a scratch project:"
  sed 's/^/   /' <<<"$commands"
  (cd "$2" && bash -euo pipefail -c "$commands")
}

# check NAME OUTPUT: the scratch program's output says it acquired,
# completed and then got the stored answer back.
check() {
  local want="acquired attempt 1
completed
replayed 201 {\"charge\":\"ch_1\"}"
  if [ "$2" != "$want" ]; then
    printf '%s: the scratch program printed:\n%s\nwant:\n%s\n' "$1" "$2" "$want" >&2
    exit 1
  fi
  echo "$1: begin, complete and replay through the installed SDK: ok"
}

export IDEMSVC=$work/checkout
mkdir "$IDEMSVC"
git ls-files -z --cached --others --exclude-standard | xargs -0 sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh |
  tar --null -T - -cf - | tar -xf - -C "$IDEMSVC"

# idemsvc, from the checkout, on a free loopback port (memory store, no
# tenants: development mode).
go build -o "$work/idemsvc" ./cmd/idemsvc
IDEMSVC_LISTEN=127.0.0.1:0 "$work/idemsvc" 2>"$work/idemsvc.log" &
idemsvc_pid=$!
addr=""
for _ in $(seq 100); do
  addr=$(sed -n '/"msg":"listening"/s/.*"addr":"\([^"]*\)".*/\1/p' "$work/idemsvc.log")
  [ -n "$addr" ] && break
  kill -0 "$idemsvc_pid" 2>/dev/null || break
  sleep 0.1
done
if [ -z "$addr" ]; then
  echo "idemsvc did not come up:" >&2
  cat "$work/idemsvc.log" >&2
  exit 1
fi
export IDEMSVC_URL=http://$addr

# The Go SDK. The scratch module is outside any workspace: GOWORK=off keeps
# a GOWORK of the caller's environment out.
mkdir "$work/go"
(cd "$work/go" && go mod init example.com/scratch >/dev/null 2>&1)
cat >"$work/go/main.go" <<'EOF'
package main

import (
	"context"
	"fmt"
	"log"
	"os"

	idem "github.com/idemsvc/idemsvc/clients/go"
)

func main() {
	ctx := context.Background()
	client, err := idem.New(os.Getenv("IDEMSVC_URL"))
	if err != nil {
		log.Fatal(err)
	}
	key := "install-go/" + os.Getenv("RUN")
	first, err := client.Begin(ctx, idem.BeginParams{Key: key})
	if err != nil || first.Lease == nil {
		log.Fatalf("begin: %+v, %v", first, err)
	}
	fmt.Println("acquired attempt", first.Lease.Attempt)
	if _, err := client.Complete(ctx, key, first.Lease.LeaseToken,
		idem.Response{StatusCode: 201, Body: []byte(`{"charge":"ch_1"}`)}, 0); err != nil {
		log.Fatal(err)
	}
	fmt.Println("completed")
	again, err := client.Begin(ctx, idem.BeginParams{Key: key})
	if err != nil || again.Replay == nil {
		log.Fatalf("begin again: %+v, %v", again, err)
	}
	stored, err := again.Replay.Response.Decode()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("replayed", stored.StatusCode, string(stored.Body))
}
EOF
GOWORK=off run_block go "$work/go"
(cd "$work/go" && GOWORK=off go build -o scratch .)
check "Go SDK" "$(RUN=$$ "$work/go/scratch")"

# The TypeScript SDK.
mkdir "$work/ts"
(cd "$work/ts" && npm init -y >/dev/null)
cat >"$work/ts/index.mjs" <<'EOF'
import { IdemClient, decodeResponse } from '@idemsvc/client';

const idem = new IdemClient({ baseUrl: process.env.IDEMSVC_URL });
const key = `install-ts/${process.env.RUN}`;
const first = await idem.begin({ key });
if (first.status !== 'acquired') throw new Error(`begin: ${JSON.stringify(first)}`);
console.log('acquired attempt', first.attempt);
await idem.complete({ key, lease_token: first.lease_token, response: { status_code: 201, body: '{"charge":"ch_1"}' } });
console.log('completed');
const again = await idem.begin({ key });
if (again.status !== 'completed') throw new Error(`begin again: ${JSON.stringify(again)}`);
const stored = decodeResponse(again.response);
console.log('replayed', stored.statusCode, Buffer.from(stored.body).toString());
EOF
run_block ts "$work/ts"
check "TypeScript SDK" "$(cd "$work/ts" && RUN=$$ node index.mjs)"

# The Python SDK, on Debian's Python 3 (python3-venv; the system's
# setuptools and wheel for a build without a package index: scripts/test.sh
# installs them).
mkdir "$work/python"
cat >"$work/python/main.py" <<'EOF'
import os

from idemsvc import Acquired, Client, Replay, Response

client = Client(os.environ["IDEMSVC_URL"])
key = "install-python/" + os.environ["RUN"]
first = client.begin(key)
if not isinstance(first, Acquired):
    raise SystemExit(f"begin: {first!r}")
print("acquired attempt", first.attempt)
client.complete(key, first.lease_token, Response(status_code=201, body=b'{"charge":"ch_1"}'))
print("completed")
again = client.begin(key)
if not isinstance(again, Replay) or again.status != "completed":
    raise SystemExit(f"begin again: {again!r}")
print("replayed", again.response.status_code, (again.response.body or b"").decode())
EOF
PATH="/usr/bin:$PATH" run_block python "$work/python"
check "Python SDK" "$(cd "$work/python" && RUN=$$ .venv/bin/python main.py)"
