# SPDX-License-Identifier: Apache-2.0
# Sourced by the scripts that need a program from Debian's packages.

# apt_install PACKAGE... installs Debian packages; without apt-get it says
# what to install and fails.
apt_install() {
  if ! command -v apt-get >/dev/null; then
    echo "$* not found, and no apt-get to install it with: install $* from your system's packages (or Docker, for Redis), then run this again" >&2
    exit 1
  fi
  echo "$* not found: installing it from Debian's packages" >&2
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

# ensure_tools installs what the scripts and make itself need and a fresh
# machine may lack: make, git, gcc (cgo, for the race detector) and curl.
ensure_tools() {
  local missing=() tool
  for tool in make git gcc curl; do
    command -v "$tool" >/dev/null || missing+=("$tool")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    apt_install "${missing[@]}"
  fi
}

# ensure_versitygw builds versitygw (an S3-compatible server, Apache-2.0)
# at VERSITYGW_VERSION into a cache directory of that version, unless it is
# there already, and sets VERSITYGW_BIN to it.
VERSITYGW_VERSION=v1.8.0
ensure_versitygw() {
  local dir="${XDG_CACHE_HOME:-$HOME/.cache}/idemsvc-tools/versitygw-$VERSITYGW_VERSION"
  VERSITYGW_BIN="$dir/versitygw"
  if [ ! -x "$VERSITYGW_BIN" ]; then
    echo "versitygw $VERSITYGW_VERSION not found: building it with go install (a few minutes, once)" >&2
    mkdir -p "$dir"
    GOBIN="$dir" go install "github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION"
  fi
}
