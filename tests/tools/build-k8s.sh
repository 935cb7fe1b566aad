#!/usr/bin/env bash
# Builds the real Kubernetes components the real-Kubernetes tests run (tests/real_*.rs) from
# their Go modules at the versions pinned in tests/realk8s/*/go.mod, into a cache outside the
# repository, and prints the directory holding the binaries on its last line. A second run with
# the same pins (and the same leafkubelet source) reuses the binaries.
#
#   kube-apiserver, kube-controller-manager  k8s.io/kubernetes (tests/realk8s/k8s/go.mod)
#   etcd                                     go.etcd.io/etcd/server/v3 (tests/realk8s/etcd)
#   leafkubelet                              our small kubelet on the kubelet's streaming code
#   metrics-server                           sigs.k8s.io/metrics-server (tests/realk8s/metrics-server)
#   proxy-server, proxy-agent                sigs.k8s.io/apiserver-network-proxy (tests/realk8s/konnectivity)
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
cache="${RELAYLET_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/relaylet/k8s}"

k8s_version="$(cd "$src/k8s" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
etcd_version="$(cd "$src/etcd" && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)"
ms_version="$(cd "$src/metrics-server" && go list -m -f '{{.Version}}' sigs.k8s.io/metrics-server)"
[ -n "$k8s_version" ] && [ -n "$etcd_version" ] && [ -n "$ms_version" ] || {
  echo "build-k8s.sh: cannot read the pinned versions from $src/*/go.mod" >&2
  exit 1
}
# The upstream components are keyed by the pins alone, leafkubelet by its source as well, so
# changing leafkubelet does not relink kube-apiserver.
pins="$(cat "$src/k8s/go.mod" "$src/k8s/go.sum" "$src/etcd/go.mod" "$src/etcd/go.sum" | sha256sum | cut -c1-16)"
ours="$({ cat "$src/k8s/go.sum"; find "$src/k8s" -name '*.go' -print0 | sort -z | xargs -0 cat; } | sha256sum | cut -c1-16)"
ms_pins="$(cat "$src/metrics-server/go.mod" "$src/metrics-server/go.sum" | sha256sum | cut -c1-16)"
bin="$cache/$k8s_version-etcd-$etcd_version-$pins/bin"
own="$cache/leafkubelet-$ours/bin"
ms="$cache/metrics-server-$ms_version-$ms_pins/bin"

build() {
  local dir="$1" dest="$2" out="$3" pkg="$4" ldflags="${5:-}"
  if [ ! -x "$dest/$out" ]; then
    echo "build-k8s.sh: building $out ($pkg)" >&2
    (cd "$dir" && go build -trimpath -ldflags "$ldflags" -o "$dest/$out.tmp" "$pkg")
    mv "$dest/$out.tmp" "$dest/$out"
  fi
}

mkdir -p "$bin" "$own" "$ms"
minor="${k8s_version#v1.}"
minor="${minor%%.*}"
version_flags="-X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
build "$src/etcd" "$bin" etcd .
build "$src/k8s" "$bin" kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$version_flags"
build "$src/k8s" "$bin" kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$version_flags"
build "$src/k8s" "$own" leafkubelet ./cmd/leafkubelet "$version_flags"
ln -sf "$own/leafkubelet" "$bin/leafkubelet"
build "$src/metrics-server" "$ms" metrics-server sigs.k8s.io/metrics-server/cmd/metrics-server
ln -sf "$ms/metrics-server" "$bin/metrics-server"

# The Kubernetes network proxy (konnectivity): its proxy server and agent, for the test of
# leaves behind NAT (issue 30). Self-contained: its own pin (tests/realk8s/konnectivity), cache
# directory and links.
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
ln -sf "$konn/proxy-server" "$bin/proxy-server"
ln -sf "$konn/proxy-agent" "$bin/proxy-agent"
echo "build-k8s.sh: konnectivity (apiserver-network-proxy) $konn_version" >&2

echo "build-k8s.sh: kubernetes $k8s_version, etcd $etcd_version, metrics-server $ms_version" >&2
echo "$bin"
