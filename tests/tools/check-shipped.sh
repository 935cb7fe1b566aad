#!/usr/bin/env bash
# Checks the shipped configuration, the one the image builds (`--no-default-features`): it
# builds and lints cleanly on its own, and links neither the sim nor any test-only crate.
set -euo pipefail
cd "$(dirname "$0")/../.."

cargo clippy -p relaylet --no-default-features --lib --bins -- -D warnings
cargo build -p relaylet --no-default-features --bin relaylet

forbidden='^(relaylet-sim|tokio-tungstenite|tungstenite|proptest|prometheus-parse) '
found="$(cargo tree -p relaylet --no-default-features -e normal --prefix none | grep -E "$forbidden" | sort -u || true)"
if [ -n "$found" ]; then
  echo "check-shipped: the shipped build links test-only crates:" >&2
  echo "$found" >&2
  exit 1
fi
echo "check-shipped: the shipped build is clean and links no test-only crate"
