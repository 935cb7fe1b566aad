#!/usr/bin/env bash
# Checks the shipped configuration, the one the image builds (the product crate alone, release):
# it builds and lints cleanly on its own, and links neither the sim, the sandbox and benchmark
# crate, nor any test-only crate.
set -euo pipefail
cd "$(dirname "$0")/../.."

cargo clippy -p relaylet --lib --bins -- -D warnings
cargo build -p relaylet --bin relaylet

forbidden='^(relaylet-sim|relaylet-dev|tokio-tungstenite|tungstenite|proptest|prometheus-parse|tempfile) '
found="$(cargo tree -p relaylet -e normal --prefix none | grep -E "$forbidden" | sort -u || true)"
if [ -n "$found" ]; then
  echo "check-shipped: the shipped build links test-only crates:" >&2
  echo "$found" >&2
  exit 1
fi
echo "check-shipped: the shipped build is clean and links no test-only crate"
