#!/usr/bin/env bash
# Checks the shipped configuration, the one the image builds (the product crate alone, release):
# it lints cleanly on its own (clippy type-checks every line; the image, which `.ci/run` builds
# next, compiles and links it, so a debug build here would only cost a cold run minutes), and
# links neither the sim, the sandbox and benchmark crate, nor any test-only crate.
set -euo pipefail
cd "$(dirname "$0")/../.."

cargo clippy -p relaylet --lib --bins -- -D warnings

forbidden='^(relaylet-sim|relaylet-dev|tokio-tungstenite|tungstenite|proptest|prometheus-parse|tempfile) '
found="$(cargo tree -p relaylet -e normal --prefix none | grep -E "$forbidden" | sort -u || true)"
if [ -n "$found" ]; then
  echo "check-shipped: the shipped build links test-only crates:" >&2
  echo "$found" >&2
  exit 1
fi
echo "check-shipped: the shipped build is clean and links no test-only crate"
