#!/usr/bin/env bash
# Builds relaylet's container image from the repository's Dockerfile, unchanged, with podman,
# saves it as a docker-archive and prints its size (issue 38, step 1):
#
#   podman build --runtime runc --network host -t localhost/relaylet:dev --build-arg VERSION=<crate version> .
#   -> ${RELAYLET_IMAGE_CACHE:-~/.cache/relaylet/image}/relaylet.tar   (docker-archive, for `ctr -n k8s.io images import`)
#
# `build-image.sh arm64` builds the linux/arm64 image instead (for tests/tools/release.sh):
# `--platform linux/arm64`, the Dockerfile's build stage cross-compiling on this machine, tagged
# localhost/relaylet:dev-arm64 and saved to relaylet-arm64.tar beside the other. It needs the
# toolchain's aarch64-unknown-linux-gnu standard library (rustup target add). Its runtime base
# is made with `mmdebstrap --arch=arm64` and tagged gcr.io/distroless/cc-debian12:nonroot-arm64;
# the name the FROM line gives then becomes a manifest list of both bases (amd64 tagged
# :nonroot-amd64, as distroless tags them), which a build without --platform reads as the amd64
# image, so the amd64 build stays as it was.
#
# No container registry is reachable here, so the two images the Dockerfile's FROM lines name
# are made locally from Debian 12's packages (mmdebstrap) and tagged under those exact names:
#
#   gcr.io/distroless/cc-debian12:nonroot      what distroless/cc-debian12 holds: libc6, libgcc-s1,
#                                              libgomp1, libstdc++6, libssl3, base-files, netbase,
#                                              tzdata, the CA bundle, root/nobody/nonroot (65532)
#                                              users; USER 65532, no shell, no package manager
#   docker.io/library/rust:1.95-slim-bookworm  bookworm with gcc, libc6-dev, ca-certificates and the
#                                              host's Rust toolchain of that version, laid out as
#                                              the official image has it (/usr/local/cargo,
#                                              /usr/local/rustup)
#
# They are made once: a run skips a base image when its tag exists with the image id and recipe
# hash recorded in the cache. Installs podman and mmdebstrap with apt when missing. Runs take
# turns (flock on the cache's lock). Keeps one build of the image: the image it replaces is
# removed, and so are dangling images.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cache="${RELAYLET_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/relaylet/image}"
arch="${1:-amd64}"
runtime_base=gcr.io/distroless/cc-debian12:nonroot
case "$arch" in
  amd64) image=localhost/relaylet:dev suffix="" ;;
  arm64) image=localhost/relaylet:dev-arm64 suffix=-arm64 ;;
  *)
    echo "build-image.sh: unknown architecture '$arch' (amd64 or arm64)" >&2
    exit 2
    ;;
esac
say() { echo "build-image.sh: $*" >&2; }
fail() {
  say "$*"
  exit 1
}

mkdir -p "$cache"
exec 9>"$cache/.build.lock"
flock 9

# --- tools -------------------------------------------------------------------------------------
if ! command -v podman >/dev/null || ! command -v mmdebstrap >/dev/null || ! command -v runc >/dev/null; then
  [ "$(id -u)" = 0 ] || fail "podman, mmdebstrap and runc are needed (apt-get install podman mmdebstrap runc, as root)"
  say "installing podman, mmdebstrap and runc with apt"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=300 update -qq || fail "apt-get update failed: Debian's packages are not reachable"
  apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends podman mmdebstrap runc uidmap fuse-overlayfs \
    conmon containernetworking-plugins ca-certificates >/dev/null ||
    fail "apt-get install podman mmdebstrap runc failed"
fi
# podman's default ulimits (nofile 1048576) are above what this machine's containers may set;
# an empty list keeps the caller's. Set once, leaving every other setting of the file alone.
conf=/etc/containers/containers.conf
if ! grep -Eq '^[[:space:]]*default_ulimits[[:space:]]*=[[:space:]]*\[\][[:space:]]*$' "$conf" 2>/dev/null; then
  [ -w "$(dirname "$conf")" ] || [ -w "$conf" ] || fail "cannot write $conf (default_ulimits = [] is needed)"
  say "setting default_ulimits = [] in $conf"
  touch "$conf"
  if grep -Eq '^[[:space:]]*default_ulimits[[:space:]]*=' "$conf"; then
    sed -i -E 's/^[[:space:]]*default_ulimits[[:space:]]*=.*$/default_ulimits = []/' "$conf"
  elif grep -Eq '^[[:space:]]*\[containers\]' "$conf"; then
    sed -i -E '0,/^[[:space:]]*\[containers\]/s//[containers]\ndefault_ulimits = []/' "$conf"
  else
    printf '\n[containers]\ndefault_ulimits = []\n' >>"$conf"
  fi
fi
podman=(podman --runtime runc)

# --- the versions the Dockerfile asks for -------------------------------------------------------
rust_version="$(sed -n -E 's/^ARG RUST_VERSION=([0-9.]+)$/\1/p' "$root/Dockerfile")"
[ -n "$rust_version" ] || fail "no 'ARG RUST_VERSION=' in $root/Dockerfile"
builder_base="docker.io/library/rust:$rust_version-slim-bookworm"
if ! grep -qxF "FROM --platform=\$BUILDPLATFORM docker.io/library/rust:\${RUST_VERSION}-slim-bookworm AS build" "$root/Dockerfile" ||
  ! grep -qxF "FROM --platform=\$TARGETPLATFORM $runtime_base" "$root/Dockerfile"; then
  fail "the Dockerfile's FROM lines are not the ones this script makes ($builder_base, $runtime_base)"
fi
crate_version="$(sed -n -E '/^\[package\]/,/^\[/s/^version = "([^"]+)"$/\1/p' "$root/Cargo.toml" | head -n1)"
[ -n "$crate_version" ] || fail "no package version in $root/Cargo.toml"

# The host's toolchain of that version (no toolchain can be downloaded here).
sysroot=""
for rustc in "rustc +$rust_version.0" "rustc +$rust_version" rustc; do
  # shellcheck disable=SC2086 # the toolchain argument is split on purpose
  if v="$($rustc --version 2>/dev/null)" && [[ "$v" == "rustc $rust_version."* ]]; then
    # shellcheck disable=SC2086
    sysroot="$($rustc --print sysroot)"
    break
  fi
done
[ -n "$sysroot" ] && [ -x "$sysroot/bin/cargo" ] ||
  fail "a Rust $rust_version toolchain (rustc and cargo) is needed on this machine to make $builder_base"
sysroot="$(readlink -f "$sysroot")"
toolchain_version="$("$sysroot/bin/rustc" --version)"
# The targets whose standard library the toolchain holds (the builder base copies them all).
toolchain_targets="$(find "$sysroot/lib/rustlib" -mindepth 2 -maxdepth 2 -name lib -printf '%h\n' | xargs -rn1 basename | sort | tr '\n' ' ')"
if [ "$arch" = arm64 ] && [[ " $toolchain_targets " != *" aarch64-unknown-linux-gnu "* ]]; then
  fail "the Rust $rust_version toolchain has no aarch64-unknown-linux-gnu standard library (rustup target add aarch64-unknown-linux-gnu --toolchain $rust_version.0)"
fi

mirrors=(
  "deb http://deb.debian.org/debian bookworm main"
  "deb http://deb.debian.org/debian bookworm-updates main"
  "deb http://deb.debian.org/debian-security bookworm-security main"
)

# The recipe of each base image: this script's text from here to the end of the base images'
# section, and what it takes from the host.
recipe_text="$(sed -n '/^# --- base images/,/^# --- end of base images/p' "$0")"

# stamp_file NAME: where the recipe hash and image id of base image NAME are recorded.
stamp_file() { echo "$cache/base-$(echo "$1" | tr '/:' '__').recipe"; }
# fresh NAME HASH: true when image NAME exists and is the one made by the recipe HASH.
fresh() {
  local id
  id="$(podman image inspect --format '{{.Id}}' "$1" 2>/dev/null)" || return 1
  [ -f "$(stamp_file "$1")" ] && [ "$(cat "$(stamp_file "$1")")" = "$2 $id" ]
}
# stamp NAME HASH: records that image NAME was made by the recipe HASH.
stamp() {
  local id
  id="$(podman image inspect --format '{{.Id}}' "$1")"
  echo "$2 $id" >"$(stamp_file "$1")"
}

# --- base images ---------------------------------------------------------------------------------
work="$cache/work"
cleanup() { rm -rf "$work"; }
trap cleanup EXIT

# The runtime base, as distroless builds it: the packages' files unpacked (no maintainer
# scripts run), the CA bundle made from the certificates, users written by hand.
# make_runtime_base ARCH TAG: the base for Debian architecture ARCH (amd64, arm64) as TAG
# (unpacking runs nothing, so a foreign architecture needs no emulator).
runtime_packages=(base-files netbase tzdata ca-certificates libc6 libgcc-s1 libgomp1 libstdc++6 libssl3)
make_runtime_base() {
  local base_arch="$1" tag="$2"
  rm -rf "$work" && mkdir -p "$work"
  # mmdebstrap resolves, downloads and checks the packages' signatures; only the listed ones
  # are unpacked into the image (their dependencies, e.g. debconf and perl, are left out).
  mmdebstrap --quiet --variant=extract --skip=cleanup/apt/cache --arch="$base_arch" \
    --include="$(IFS=,; echo "${runtime_packages[*]}")" bookworm "$work/staging" "${mirrors[@]}"
  local rootfs="$work/rootfs" pkg deb
  mkdir -p "$rootfs"
  for pkg in "${runtime_packages[@]}"; do
    deb="$(find "$work/staging/var/cache/apt/archives" -name "${pkg}_*.deb" | head -n1)"
    [ -n "$deb" ] || fail "mmdebstrap did not download $pkg"
    dpkg-deb --extract "$deb" "$rootfs"
    mkdir -p "$rootfs/var/lib/dpkg/status.d"
    dpkg-deb --field "$deb" >"$rootfs/var/lib/dpkg/status.d/$pkg"
  done
  # The CA bundle update-ca-certificates would write (all of Mozilla's certificates).
  mkdir -p "$rootfs/etc/ssl/certs"
  find "$rootfs/usr/share/ca-certificates" -name '*.crt' -print0 | sort -z | xargs -0 cat \
    >"$rootfs/etc/ssl/certs/ca-certificates.crt"
  [ -s "$rootfs/etc/ssl/certs/ca-certificates.crt" ] || fail "empty CA bundle"
  cat >"$rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
  cat >"$rootfs/etc/group" <<'EOF'
root:x:0:
nobody:x:65534:
tty:x:5:
staff:x:50:
nonroot:x:65532:
EOF
  printf 'passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\nethers: files\nrpc: files\n' \
    >"$rootfs/etc/nsswitch.conf"
  mkdir -p "$rootfs/root" "$rootfs/home/nonroot" "$rootfs/tmp"
  chmod 0700 "$rootfs/root" "$rootfs/home/nonroot"
  chmod 1777 "$rootfs/tmp"
  chown 65532:65532 "$rootfs/home/nonroot"
  # No shell, no package manager, no scripts; no documentation.
  rm -rf "$rootfs"/usr/share/{doc,man,info,lintian,bug} "$rootfs/usr/sbin/update-ca-certificates" \
    "$rootfs"/{bin,usr/bin}/{sh,bash,dash} "$rootfs"/usr/bin/{dpkg,apt}* "$rootfs/etc/update-motd.d"
  local found
  found="$(find "$rootfs" \( -name sh -o -name bash -o -name dash -o -name busybox -o -name 'dpkg*' -o -name 'apt-get' \) -not -type d -print)"
  [ -z "$found" ] || fail "the runtime base would hold a shell or package manager: $found"
  tar --numeric-owner --sort=name -C "$rootfs" -c . | "${podman[@]}" import --arch "$base_arch" \
    --change 'USER 65532:65532' --change 'WORKDIR /home/nonroot' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
    - "$tag" >/dev/null
  rm -rf "$work"
}

# The builder base: what rust:*-slim-bookworm holds (bookworm, gcc, libc6-dev, ca-certificates,
# the toolchain under /usr/local), with the host's toolchain for x86_64 only (rustc, cargo,
# rust-std; no docs, clippy or rustfmt).
make_builder_base() {
  rm -rf "$work" && mkdir -p "$work"
  local rootfs="$work/rootfs"
  mmdebstrap --quiet --variant=minbase --include=gcc,libc6-dev,ca-certificates \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    bookworm "$rootfs" "${mirrors[@]}"
  local name="$rust_version.0-x86_64-unknown-linux-gnu"
  local tc="$rootfs/usr/local/rustup/toolchains/$name"
  mkdir -p "$tc" "$rootfs/usr/local/cargo/bin"
  tar -C "$sysroot" -c \
    --exclude=./share --exclude=./bin/clippy-driver --exclude=./bin/cargo-clippy \
    --exclude=./bin/rustfmt --exclude=./bin/cargo-fmt --exclude='./bin/rust-gdb*' \
    --exclude=./bin/rust-lldb --exclude=./libexec . | tar -C "$tc" -x
  [ -x "$tc/bin/cargo" ] && [ -x "$tc/bin/rustc" ] || fail "copying the toolchain from $sysroot"
  local tool
  for tool in cargo rustc rustdoc; do
    ln -s "../../rustup/toolchains/$name/bin/$tool" "$rootfs/usr/local/cargo/bin/$tool"
  done
  tar --numeric-owner -C "$rootfs" -c . | "${podman[@]}" import \
    --change 'ENV RUSTUP_HOME=/usr/local/rustup' --change 'ENV CARGO_HOME=/usr/local/cargo' \
    --change 'ENV PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change "ENV RUST_VERSION=$rust_version.0" \
    - "$builder_base" >/dev/null
  rm -rf "$work"
}
# --- end of base images --------------------------------------------------------------------------

runtime_hash="$(printf '%s\n%s\n' "$recipe_text" runtime | sha256sum | cut -c1-16)"
builder_hash="$(printf '%s\n%s\n%s\n%s\n' "$recipe_text" "$toolchain_version" "$sysroot" "$toolchain_targets" | sha256sum | cut -c1-16)"
# (Once an arm64 build made the manifest list below, the amd64 base's name resolves through it
# to the amd64 image, for this check and for the amd64 build alike.)
if ! fresh "$runtime_base" "$runtime_hash"; then
  say "making $runtime_base from Debian 12's packages"
  start=$SECONDS
  make_runtime_base amd64 "$runtime_base"
  stamp "$runtime_base" "$runtime_hash"
  say "made $runtime_base in $((SECONDS - start)) s"
fi
if [ "$arch" = arm64 ]; then
  arm64_base="$runtime_base-arm64"
  arm64_hash="$(printf '%s\n%s\n' "$recipe_text" runtime-arm64 | sha256sum | cut -c1-16)"
  if ! fresh "$arm64_base" "$arm64_hash"; then
    say "making $arm64_base from Debian 12's arm64 packages"
    start=$SECONDS
    make_runtime_base arm64 "$arm64_base"
    stamp "$arm64_base" "$arm64_hash"
    say "made $arm64_base in $((SECONDS - start)) s"
  fi
  # The FROM line's name as a manifest list of both bases, made again on every arm64 build
  # (seconds; the images in it, on which the build's cache keys, stay the same).
  amd64_id="$(podman image inspect --format '{{.Id}}' "$runtime_base")"
  podman tag "$amd64_id" "$runtime_base-amd64"
  named_id="$(podman images --no-trunc --format '{{.ID}}' "$runtime_base" | head -n1)"
  if [ "${named_id#sha256:}" = "${amd64_id#sha256:}" ]; then
    podman untag "$amd64_id" "$runtime_base"
  else
    podman manifest rm "$runtime_base" >/dev/null
  fi
  podman manifest create "$runtime_base" >/dev/null
  podman manifest add "$runtime_base" "containers-storage:$runtime_base-amd64" >/dev/null
  podman manifest add "$runtime_base" "containers-storage:$arm64_base" >/dev/null
fi
if ! fresh "$builder_base" "$builder_hash"; then
  say "making $builder_base from Debian 12's packages and $toolchain_version"
  start=$SECONDS
  make_builder_base
  stamp "$builder_base" "$builder_hash"
  say "made $builder_base in $((SECONDS - start)) s"
fi

# --- the image -----------------------------------------------------------------------------------
# The build stage downloads crates from crates.io (host network). It uses a registry cache of
# its own, so it never races a cargo on the host for the same files, refreshed from the host's
# on every build: crates the host's cargo fetched since the last build (a new dependency; .ci/run
# runs clippy first) are then found here, and the build stage goes to the network only for what
# the host never fetched. (Its base trusts Debian's CAs only, so behind a TLS-inspecting proxy
# that fetch fails: "SSL certificate problem: self-signed certificate in certificate chain".)
registry="$cache/cargo-registry"
host_registry="${CARGO_HOME:-$HOME/.cargo}/registry"
mkdir -p "$registry"
if [ -d "$host_registry" ]; then
  cp -a -u "$host_registry/index" "$host_registry/cache" "$registry/" 2>/dev/null || true
fi
# Another architecture: --platform, and the building machine's platform as BUILDPLATFORM for the
# build stage's FROM (podman 4.3 does not set it; newer podman and docker buildx do, the same).
platform=()
if [ "$arch" != amd64 ]; then
  platform=(--platform "linux/$arch" --build-arg "BUILDPLATFORM=linux/$(podman info --format '{{.Host.Arch}}')")
fi
say "podman build ${platform[*]:+${platform[*]} }-t $image --build-arg VERSION=$crate_version ($root)"
start=$SECONDS
log="$cache/build$suffix.log"
"${podman[@]}" build --runtime runc --network host --pull=never "${platform[@]}" \
  --volume "$registry:/usr/local/cargo/registry" \
  -t "$image" --build-arg "VERSION=$crate_version" "$root" 2>&1 | tee "$log"
# podman stopped by a signal may exit 0 without tagging: only a build that tagged the image counts.
grep -qxF "Successfully tagged $image" "$log" || fail "podman build did not tag $image (its output is in $log)"
say "built $image in $((SECONDS - start)) s"
new_id="$(podman image inspect --format '{{.Id}}' "$image")"
# Keep one build per architecture: remove dangling images (the image this build replaced, the
# layers of builds before it) but not the steps of this build or of the other architecture's
# last one, the cache of the next builds.
mapfile -t keep < <(cat "$cache"/build*.log 2>/dev/null |
  grep -oE '^--> (Using cache )?[0-9a-f]{11,64}$' | awk '{print $NF}')
removed=1
while [ "$removed" = 1 ]; do
  removed=0
  for id in $(podman images --quiet --no-trunc --filter dangling=true); do
    id="${id#sha256:}"
    current=0
    for k in "${keep[@]}"; do [[ "$id" == "$k"* ]] && current=1; done
    if [ "$current" = 0 ] && podman rmi "$id" >/dev/null 2>&1; then removed=1; fi
  done
done
archive="$cache/relaylet$suffix.tar"
if [ ! -f "$archive" ] || [ "$(cat "$archive.id" 2>/dev/null)" != "$new_id" ]; then
  rm -f "$archive.tmp" "$archive.id"
  podman save --format docker-archive -o "$archive.tmp" "$image"
  mv "$archive.tmp" "$archive"
  echo "$new_id" >"$archive.id"
fi
size="$(podman image inspect --format '{{.Size}}' "$image")"
say "saved $image ($new_id) to $archive"
echo "$image $new_id $size bytes ($((size / 1024 / 1024)) MiB), archive $archive ($(($(stat -c %s "$archive") / 1024 / 1024)) MiB)"
