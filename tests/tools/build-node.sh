#!/usr/bin/env bash
# Builds what a real Kubernetes node needs in the real-node tests (tests/real_node*.rs), into a
# cache outside the repository, and prints one line: the kubelet's version and the directory
# holding the node's parts. A second run with the same pins reuses them.
#
#   containerd, runc, CNI plugins   Debian's packages (containerd 1.6, runc 1.1, plugins 1.1),
#                                   installed with apt when missing
#   kubelet, kube-scheduler         k8s.io/kubernetes/cmd/{kubelet,kube-scheduler} at the version
#                                   pinned in tests/realk8s/kubelet/go.mod (the same Kubernetes
#                                   as tests/realk8s/k8s; a module of its own, so its extra sums
#                                   never change the pins, and the cache, of the control plane);
#                                   the scheduler places the chart's pods on a real root node
#   pause.tar, busybox.tar          images without a registry: one-layer docker-archives made
#                                   here (our static pause from tests/realk8s/kubelet/cmd/pause;
#                                   Debian's static busybox), imported with `ctr images import`
#
# Cache: $RELAYLET_K8S_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/relaylet/k8s (build-k8s.sh's).
set -euo pipefail
command -v go >/dev/null || {
  echo "build-node.sh: Go is needed to build the kubelet (this project's machines have Go 1.26)" >&2
  exit 1
}
root="$(cd "$(dirname "$0")/../.." && pwd)"
src="$root/tests/realk8s/kubelet"
# The Go collector off until 3 GiB, as in build-k8s.sh (less CPU, the same cache keys).
export GOGC="${GOGC:-off}" GOMEMLIMIT="${GOMEMLIMIT:-3GiB}"
cache="${RELAYLET_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/relaylet/k8s}"
mkdir -p "$cache"
exec 9>"$cache/.node.lock"
flock 9

# The runtime from Debian's packages.
missing=()
command -v containerd >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
[ -x /bin/busybox ] && /bin/busybox --list | grep -qx httpd || missing+=(busybox-static)
if [ ${#missing[@]} -gt 0 ]; then
  echo "build-node.sh: installing ${missing[*]} (apt)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y \
    --no-install-recommends "${missing[@]}" >&2 || {
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 update >&2
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y \
      --no-install-recommends "${missing[@]}" >&2
  }
fi
# busybox-static replaces busybox; the static one is what goes into an image.
file -b /bin/busybox 2>/dev/null | grep -q "statically linked" || {
  echo "build-node.sh: /bin/busybox is not the static busybox (install busybox-static)" >&2
  exit 1
}

version="$(cd "$src" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
[ -n "$version" ] || {
  echo "build-node.sh: cannot read the pinned Kubernetes version from $src/go.mod" >&2
  exit 1
}
key="$({ cat "$src/go.mod" "$src/go.sum" "$src/cmd/pause/main.go" "$0"; sha256sum /bin/busybox; } | sha256sum | cut -c1-16)"
out="$cache/node-$version-$key"
if [ ! -f "$out/.done" ]; then
  mkdir -p "$out"
  minor="${version#v1.}"
  minor="${minor%%.*}"
  for cmd in kubelet kube-scheduler; do
    echo "build-node.sh: building $cmd $version" >&2
    # No -trimpath, as build-k8s.sh builds the control plane: the packages they share are
    # then compiled once.
    (cd "$src" && go build -gcflags=all=-dwarf=false \
      -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean" \
      -o "$out/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd")
    mv "$out/$cmd.tmp" "$out/$cmd"
  done

  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  # image NAME ROOTFS CONFIG_JSON: a docker-archive of one layer, localhost/NAME:relaylet.
  image() {
    local name="$1" rootfs="$2" config="$3" dir="$work/$1"
    mkdir -p "$dir"
    tar -C "$rootfs" --owner=0 --group=0 --numeric-owner --sort=name --mtime=@0 -cf "$dir/layer.tar" .
    local diff
    diff="$(sha256sum "$dir/layer.tar" | cut -d' ' -f1)"
    printf '{"architecture":"amd64","os":"linux","config":%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
      "$config" "$diff" >"$dir/config.json"
    local id
    id="$(sha256sum "$dir/config.json" | cut -d' ' -f1)"
    mv "$dir/config.json" "$dir/$id.json"
    printf '[{"Config":"%s.json","RepoTags":["localhost/%s:relaylet"],"Layers":["layer.tar"]}]' \
      "$id" "$name" >"$dir/manifest.json"
    tar -C "$dir" -cf "$out/$name.tar.tmp" manifest.json "$id.json" layer.tar
    mv "$out/$name.tar.tmp" "$out/$name.tar"
  }

  echo "build-node.sh: building the pause and busybox images" >&2
  mkdir -p "$work/pause-root"
  (cd "$src" && CGO_ENABLED=0 go build -trimpath -gcflags=all=-dwarf=false -ldflags "-s -w" -o "$work/pause-root/pause" ./cmd/pause)
  image pause "$work/pause-root" '{"Entrypoint":["/pause"],"User":"65535:65535"}'

  bb="$work/busybox-root"
  mkdir -p "$bb/bin" "$bb/etc" "$bb/tmp" "$bb/www" "$bb/root"
  chmod 1777 "$bb/tmp"
  cp /bin/busybox "$bb/bin/busybox"
  for applet in $(/bin/busybox --list); do
    [ "$applet" = busybox ] || ln -s busybox "$bb/bin/$applet"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$bb/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\n' >"$bb/etc/group"
  echo "hello from a real container" >"$bb/www/index.html"
  image busybox "$bb" '{"Env":["PATH=/bin"],"Cmd":["/bin/sh"]}'
  touch "$out/.done"
fi
echo "build-node.sh: kubelet $version, $(containerd --version | cut -d' ' -f3), $(runc --version | head -1)" >&2
echo "$version $out"
