#!/usr/bin/env bash
# Builds promtool, Prometheus' rule checker and rule unit-test runner, at the version pinned
# here from the Go module proxy, into a cache outside the repository, and prints its path.
# tests/it/monitoring.rs runs it on the rules the chart renders (metrics.prometheusRule);
# .ci/run builds it first in the background, beside the real Kubernetes components. A second
# run with the same pin prints the path at once; runs at once take turns (the second waits).
#
# Cache: $RELAYLET_TOOLS_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/relaylet/tools. Nothing built
# lands in the repository. A build that fails stops this script with Go's error.
set -euo pipefail
# Prometheus 3.16.0: its Go module tags v3.MM.P as v0.3MM.P.
version=v0.316.0
command -v go >/dev/null || {
  echo "build-promtool.sh: Go is needed to build promtool $version (go.dev/dl; this project's machines have Go 1.26)" >&2
  exit 1
}
cache="${RELAYLET_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/relaylet/tools}"
dest="$cache/promtool-$version"
mkdir -p "$dest"
if [ ! -x "$dest/promtool" ]; then
  (
    flock 8
    # Another run may have built it while this one waited.
    [ -x "$dest/promtool" ] && exit 0
    echo "build-promtool.sh: building promtool $version (github.com/prometheus/prometheus/cmd/promtool)" >&2
    rm -rf "$dest/bin.tmp"
    # As build-k8s.sh: the collector off below 3 GiB, no DWARF, no symbol table. The toolchain
    # is this machine's (no download of another).
    # `promtool --version` says the release (v0.3MM.P is 3.MM.P).
    release="${version#v0.}"
    release="${release:0:1}.$((10#${release:1:2})).${release#*.}"
    GOBIN="$dest/bin.tmp" GOTOOLCHAIN=local GOGC="${GOGC:-off}" GOMEMLIMIT="${GOMEMLIMIT:-3GiB}" \
      go install -gcflags=all=-dwarf=false \
      -ldflags "-s -w -X github.com/prometheus/common/version.Version=$release" \
      "github.com/prometheus/prometheus/cmd/promtool@$version"
    mv "$dest/bin.tmp/promtool" "$dest/promtool"
    rm -rf "$dest/bin.tmp"
  ) 8>"$dest/.lock"
fi
echo "build-promtool.sh: $("$dest/promtool" --version 2>&1 | sed -n 1p)" >&2
echo "$dest/promtool"
