#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# begin -> complete -> replayed begin against idemsvc, with curl and POSIX
# sh and sed only (no jq).
#
#   IDEMSVC_URL=http://127.0.0.1:8080 IDEMSVC_API_KEY=... sh begin-complete-replay.sh
#
# IDEMSVC_URL defaults to http://127.0.0.1:8080; IDEMSVC_API_KEY is sent as a
# bearer token when set (through curl's standard input, not its command
# line, so that ps does not show it). Each run uses a new key. Exits 0 when
# the replayed begin gives back the completed response, 1 otherwise.
set -eu

url=${IDEMSVC_URL:-http://127.0.0.1:8080}
url=${url%/}
rand=$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')
key="polyglot-sh-$(date +%s)-$$-$rand"
owner="sh-$rand"
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
trap 'exit 1' HUP INT TERM

fail() {
	printf 'begin-complete-replay.sh: %s\n' "$*" >&2
	exit 1
}

# post PATH JSON: POSTs JSON to $url/v1/PATH, leaves the answer's body in
# $tmp and prints its HTTP status.
post() {
	if [ -n "${IDEMSVC_API_KEY:-}" ]; then
		printf 'Authorization: Bearer %s\n' "$IDEMSVC_API_KEY" |
			curl -sS -o "$tmp" -w '%{http_code}' -H @- \
				-H 'Content-Type: application/json' --data-binary "$2" "$url/v1/$1"
	else
		curl -sS -o "$tmp" -w '%{http_code}' \
			-H 'Content-Type: application/json' --data-binary "$2" "$url/v1/$1"
	fi
}

# A JSON string, and whatever precedes the member looked for: complete
# strings and the characters between them, so that a name is matched only
# where a member name can be, never inside a string.
json_str='"[^"\\]*\(\\.[^"\\]*\)*"'
json_before='^[^"]*\('"$json_str"'[^"]*\)*'

# field NAME: the value of the JSON string member NAME in $tmp, still
# JSON-escaped. NAME must occur once.
field() {
	sed -n 's/'"$json_before"'"'"$1"'"[[:space:]]*:[[:space:]]*"\([^"\\]*\(\\.[^"\\]*\)*\)".*/\3/p' "$tmp"
}

# number NAME: the value of the JSON integer member NAME in $tmp.
number() {
	sed -n 's/'"$json_before"'"'"$1"'"[[:space:]]*:[[:space:]]*\(-\{0,1\}[0-9][0-9]*\).*/\3/p' "$tmp"
}

printf 'key:      %s\n' "$key"

# 1. begin: the key is new, so this caller acquires it.
status=$(post begin "{\"key\":\"$key\",\"owner\":\"$owner\"}") || fail "begin: cannot reach idemsvc at $url"
[ "$status" = 201 ] || fail "begin: HTTP $status, want 201: $(cat "$tmp")"
[ "$(field status)" = acquired ] || fail "begin: not acquired: $(cat "$tmp")"
token=$(field lease_token)
[ -n "$token" ] || fail "begin: no lease_token in $(cat "$tmp")"
printf 'begin:    %s acquired, attempt %s\n' "$status" "$(number attempt)"

# 2. The operation runs here (say it created a charge); then complete
# stores its response. body_json is the body as a JSON string's contents.
body="{\"charge_id\":\"ch_$rand\",\"amount\":1000}"
body_json=$(printf '%s' "$body" | sed 's/\\/\\\\/g; s/"/\\"/g')
response="{\"status_code\":201,\"headers\":{\"Content-Type\":\"application/json\"},\"body\":\"$body_json\"}"
status=$(post complete "{\"key\":\"$key\",\"lease_token\":\"$token\",\"response\":$response}") ||
	fail "complete: cannot reach idemsvc at $url"
[ "$status" = 200 ] || fail "complete: HTTP $status, want 200: $(cat "$tmp")"
[ "$(field status)" = completed ] || fail "complete: not completed: $(cat "$tmp")"
printf 'complete: %s completed\n' "$status"

# 3. A duplicate begins the same key: it must not run the operation again
# but get the stored response back.
status=$(post begin "{\"key\":\"$key\"}") || fail "replay: cannot reach idemsvc at $url"
[ "$status" = 200 ] || fail "replay: HTTP $status, want 200 with the stored response: $(cat "$tmp")"
[ "$(field status)" = completed ] || fail "replay: status is not completed: $(cat "$tmp")"
got_body=$(field body)
[ "$got_body" = "$body_json" ] || fail "replay: body $got_body, want $body_json"
got_code=$(number status_code)
[ "$got_code" = 201 ] || fail "replay: status_code $got_code, want 201"
[ "$(field Content-Type)" = application/json ] || fail "replay: no Content-Type: application/json header: $(cat "$tmp")"
printf 'replay:   %s completed, response %s %s\n' "$status" "$got_code" "$body"
echo "ok: the replayed begin gave back the completed response"
