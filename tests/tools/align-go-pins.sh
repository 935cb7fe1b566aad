#!/usr/bin/env bash
# Aligns a tool's Go module (tests/realk8s/konnectivity) with the pinned Kubernetes 1.35 module
# (tests/realk8s/k8s): every module both builds use is replaced by the version Kubernetes 1.35
# builds with, so the tool compiles against the control plane's libraries and Go's build cache
# holds them once (client-go, apimachinery, grpc, ...: konnectivity alone took about 2.5
# CPU-minutes at its own pins). The tool itself stays at its pin; only its libraries move, and
# only to what the 1.35 control plane runs. Run after changing either pin:
#
#   tests/tools/align-go-pins.sh tests/realk8s/konnectivity
#   tests/tools/align-go-pins.sh --check tests/realk8s/konnectivity   (exit 1 when not aligned)
#
# Not for metrics-server: v0.8.0 built so (k8s.io/apiserver 0.35.4 for its 0.33.2) left
# `kubectl top pod` in a root cluster empty for 150 s in tests/real/k8s.rs and
# tests/real/k8s_nat.rs (the leaves' top worked; cause not found); at its own pins they pass.
#
# The replacements sit between the two marker lines at the end of the module's go.mod.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
check=0
if [ "${1:-}" = --check ]; then
  check=1
  shift
fi
dir="$(cd "${1:?usage: align-go-pins.sh [--check] MODULE_DIR}" && pwd)"
begin="// --- aligned with tests/realk8s/k8s by tests/tools/align-go-pins.sh"
end="// --- end of aligned versions"

# selected DIR: "path version" of every module in DIR's build list, replacements applied.
selected() { (cd "$1" && go list -m -f '{{.Path}} {{with .Replace}}{{.Version}}{{else}}{{.Version}}{{end}}' all) | sort; }
# differing: modules both use at different versions: "path ours kubernetes".
differing() { join <(selected "$dir") <(selected "$root/tests/realk8s/k8s") | awk '$2 != $3'; }

if [ "$check" = 1 ]; then
  off="$(differing)"
  [ -z "$off" ] && exit 0
  echo "align-go-pins.sh: $dir builds $(echo "$off" | wc -l) modules at other versions than Kubernetes 1.35 (run tests/tools/align-go-pins.sh $dir):" >&2
  echo "$off" | head -5 >&2
  exit 1
fi

# Start from the tool's own pins (no earlier alignment), then replace what differs; a module
# replaced may bring others in at other versions, so repeat until nothing differs.
sed -i "\#^$begin\$#,\#^$end\$#d" "$dir/go.mod"
(cd "$dir" && go mod tidy)
replaced=""
for _ in 1 2 3 4; do
  off="$(differing)"
  [ -n "$off" ] || break
  replaced="$(printf '%s\n%s\n' "$replaced" "$(echo "$off" | awk '{ print $1 " " $3 }')" | grep . | sort -u -k1,1)"
  sed -i "\#^$begin\$#,\#^$end\$#d" "$dir/go.mod"
  {
    echo "$begin"
    echo "replace ("
    echo "$replaced" | awk '{ print "\t" $1 " => " $1 " " $2 }'
    echo ")"
    echo "$end"
  } >>"$dir/go.mod"
  (cd "$dir" && go mod tidy)
done
left="$(differing)"
[ -z "$left" ] || {
  echo "align-go-pins.sh: still differing after alignment:" >&2
  echo "$left" >&2
  exit 1
}
echo "align-go-pins.sh: $dir: $(echo "$replaced" | grep -c .) modules replaced by Kubernetes 1.35's versions"
