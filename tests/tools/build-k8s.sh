#!/usr/bin/env bash
# Builds the real Kubernetes components the real-Kubernetes tests run (tests/real_*.rs) from
# their Go modules at the versions pinned in tests/realk8s/*/go.mod, into a cache outside the
# repository, and prints one line per Kubernetes version: the version and the directory holding
# its binaries. A second run with the same pins (and the same leafkubelet source) reuses the
# binaries.
#
#   tests/tools/build-k8s.sh [1.35] [1.37]     the versions named (default both), and what they share
#
# (.ci/run builds 1.35 first, so the tests that need only it start while 1.37 compiles.)
#
#   kube-apiserver, kube-controller-manager  k8s.io/kubernetes, one module per version:
#                                            tests/realk8s/k8s (1.35), tests/realk8s/k8s-1.37
#   etcd                                     go.etcd.io/etcd/server/v3 (tests/realk8s/etcd)
#   leafkubelet                              our small kubelet on the kubelet's streaming code,
#                                            one source (tests/realk8s/k8s/cmd/leafkubelet)
#                                            built with each version's go.mod (-modfile); 1.36
#                                            moved that code, so streaming_137.go (tag k8s137)
#                                            replaces streaming_135.go
#   metrics-server                           sigs.k8s.io/metrics-server (tests/realk8s/metrics-server)
#   proxy-server, proxy-agent                sigs.k8s.io/apiserver-network-proxy (tests/realk8s/konnectivity)
#                                            against Kubernetes 1.35's libraries
#                                            (tests/tools/align-go-pins.sh), so compiled once
#
# Cache: $RELAYLET_K8S_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/relaylet/k8s. Nothing built
# lands in the repository. A component that does not build stops this script with Go's error.
set -euo pipefail
command -v go >/dev/null || {
  echo "build-k8s.sh: Go is needed to build the real Kubernetes components (go.dev/dl; this project's machines have Go 1.26)" >&2
  exit 1
}
root="$(cd "$(dirname "$0")/../.." && pwd)"
src="$root/tests/realk8s"
# Go's compiler and linker with the collector off until a process holds 3 GiB: less CPU (etcd
# from an empty build cache: 141 -> 126 CPU-s; every Go build of a cold .ci/run: 2,368 -> 2,174),
# in memory this machine has (two at once). Neither setting is part of Go's build cache keys.
# Also build-node.sh.
export GOGC="${GOGC:-off}" GOMEMLIMIT="${GOMEMLIMIT:-3GiB}"
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(1.35 1.37)
for v in "${versions[@]}"; do
  case "$v" in
    1.35 | 1.37) ;;
    *)
      echo "build-k8s.sh: no Kubernetes $v here: 1.35 or 1.37" >&2
      exit 2
      ;;
  esac
done
cache="${RELAYLET_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/relaylet/k8s}"
# Runs at once take turns per output (build() below), not per cache: two runs building the same
# binary would race for it (seen: `mv: cannot stat .../etcd.tmp`), but a test asking for 1.35,
# already built, must not wait for another run compiling 1.37 (seen: a lane of .ci/run idle for
# the 8 minutes 1.37 took).
mkdir -p "$cache"

etcd_version="$(cd "$src/etcd" && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)"
ms_version="$(cd "$src/metrics-server" && go list -m -f '{{.Version}}' sigs.k8s.io/metrics-server)"
[ -n "$etcd_version" ] && [ -n "$ms_version" ] || {
  echo "build-k8s.sh: cannot read the pinned versions from $src/*/go.mod" >&2
  exit 1
}
ms_pins="$(cat "$src/metrics-server/go.mod" "$src/metrics-server/go.sum" | sha256sum | cut -c1-16)"
ms="$cache/metrics-server-$ms_version-$ms_pins/bin"
etcd_pins="$(cat "$src/etcd/go.mod" "$src/etcd/go.sum" | sha256sum | cut -c1-16)"
etcd_bin="$cache/etcd-$etcd_version-$etcd_pins/bin"

# build DIR DEST OUT PKG [LDFLAGS [GOFLAGS...]]: go build in DIR unless DEST/OUT exists.
# No DWARF, neither compiled (-dwarf=false) nor linked (-w): nobody debugs these binaries, and
# it is compile time and build cache a cold run would spend. Stack traces do not need it.
# No -trimpath: with it Go's build cache keys a replaced module's packages by the version
# required, not the one built, so konnectivity, aligned with Kubernetes 1.35's libraries by
# replacements (tests/tools/align-go-pins.sh), would compile them again.
build() {
  local dir="$1" dest="$2" out="$3" pkg="$4" ldflags="${5:-}"
  shift 5 || shift $#
  [ ! -x "$dest/$out" ] || return 0
  (
    flock 8
    # Another run may have built it while this one waited.
    [ ! -x "$dest/$out" ] || exit 0
    echo "build-k8s.sh: building $out ($pkg${*:+ $*})" >&2
    # -s -w: no symbol table or DWARF (panics still print stacks); shorter links, smaller files.
    (cd "$dir" && go build -gcflags=all=-dwarf=false "$@" -ldflags "-s -w $ldflags" -o "$dest/$out.tmp" "$pkg")
    mv "$dest/$out.tmp" "$dest/$out"
  ) 8>"$dest/.$out.lock"
}

# link TARGET LINK: LINK points at TARGET, replaced in one rename so a run reading it meanwhile
# never finds it missing.
link() {
  [ "$(readlink "$2" 2>/dev/null)" != "$1" ] || return 0
  ln -sfn "$1" "$2.$$" && mv -Tf "$2.$$" "$2"
}

# konnectivity builds against Kubernetes 1.35's libraries; say so when a pin changed without
# realigning it (it still builds, compiling those libraries again).
"$root/tests/tools/align-go-pins.sh" --check "$src/konnectivity" || true
mkdir -p "$ms" "$etcd_bin"
build "$src/metrics-server" "$ms" metrics-server sigs.k8s.io/metrics-server/cmd/metrics-server
# etcd, one build for both Kubernetes versions.
build "$src/etcd" "$etcd_bin" etcd . ""

# kubernetes MODDIR [TAG]: one Kubernetes version's components, from the go.mod in MODDIR;
# leafkubelet's source is always tests/realk8s/k8s, built with MODDIR's go.mod and TAG.
kubernetes() {
  local moddir="$1" tag="${2:-}"
  local modfile="$moddir/go.mod" sumfile="$moddir/go.sum"
  local version
  version="$(cd "$src/k8s" && go list -modfile="$modfile" -m -f '{{.Version}}' k8s.io/kubernetes)"
  [ -n "$version" ] || {
    echo "build-k8s.sh: cannot read the pinned Kubernetes version from $modfile" >&2
    exit 1
  }
  # The upstream components are keyed by the pins alone, leafkubelet by its source as well, so
  # changing leafkubelet does not relink kube-apiserver.
  local pins ours
  pins="$(cat "$modfile" "$sumfile" | sha256sum | cut -c1-16)"
  ours="$({ echo "$version $tag"; cat "$sumfile"; find "$src/k8s" -name '*.go' -print0 | sort -z | xargs -0 cat; } | sha256sum | cut -c1-16)"
  local bin="$cache/$version-$pins/bin" own="$cache/leafkubelet-$ours/bin"
  mkdir -p "$bin" "$own"
  local minor="${version#v1.}"
  minor="${minor%%.*}"
  local version_flags="-X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
  local mod=(-modfile="$modfile")
  build "$src/k8s" "$bin" kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$version_flags" "${mod[@]}"
  build "$src/k8s" "$bin" kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$version_flags" "${mod[@]}"
  build "$src/k8s" "$own" leafkubelet ./cmd/leafkubelet "$version_flags" "${mod[@]}" ${tag:+-tags "$tag"}
  # The tests' view of this version: links to every binary, in a directory keyed by all of
  # them, so checkouts with different leafkubelet sources (or pins) never swap each other's.
  local view
  view="$cache/view-$version-$(echo "$bin $own $ms $konn $etcd_bin" | sha256sum | cut -c1-16)/bin"
  mkdir -p "$view"
  local b
  for b in kube-apiserver kube-controller-manager; do link "$bin/$b" "$view/$b"; done
  link "$etcd_bin/etcd" "$view/etcd"
  link "$own/leafkubelet" "$view/leafkubelet"
  link "$ms/metrics-server" "$view/metrics-server"
  link "$konn/proxy-server" "$view/proxy-server"
  link "$konn/proxy-agent" "$view/proxy-agent"
  echo "build-k8s.sh: kubernetes $version, etcd $etcd_version, metrics-server $ms_version" >&2
  echo "$version $view"
}

# The Kubernetes network proxy (konnectivity): its proxy server and agent, for the test of
# leaves behind NAT (issue 30). Self-contained: its own pin (tests/realk8s/konnectivity), cache
# directory; kubernetes() links them into each version's directory.
konn_dir="$src/konnectivity"
konn_version="$(cd "$konn_dir" && go list -m -f '{{.Version}}' sigs.k8s.io/apiserver-network-proxy)"
[ -n "$konn_version" ] || {
  echo "build-k8s.sh: cannot read the konnectivity pin from $konn_dir/go.mod" >&2
  exit 1
}
konn_pins="$(cat "$konn_dir/go.mod" "$konn_dir/go.sum" | sha256sum | cut -c1-16)"
konn="$cache/konnectivity-$konn_version-$konn_pins/bin"
mkdir -p "$konn"
build "$konn_dir" "$konn" proxy-server sigs.k8s.io/apiserver-network-proxy/cmd/server
build "$konn_dir" "$konn" proxy-agent sigs.k8s.io/apiserver-network-proxy/cmd/agent
echo "build-k8s.sh: konnectivity (apiserver-network-proxy) $konn_version" >&2

for v in "${versions[@]}"; do
  case "$v" in
    1.35) kubernetes "$src/k8s" ;;
    1.37) kubernetes "$src/k8s-1.37" k8s137 ;;
  esac
done
