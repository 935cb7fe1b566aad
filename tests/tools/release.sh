#!/usr/bin/env bash
# Makes the artifacts of a relaylet release (issue 58, part 6). Run on demand by whoever cuts a
# release, never by .ci/run:
#
#   tests/tools/release.sh [OUT]     OUT defaults to ${RELAYLET_RELEASE_DIR:-target/release-artifacts}
#
# Into OUT (made if missing; never committed), for version V of Cargo.toml (= the chart's
# appVersion) and the image repository R of the chart's values.yaml (image.repository):
#
#   relaylet-V-linux-amd64.docker.tar   the image for linux/amd64, tagged R:V-amd64 (docker-archive:
#   relaylet-V-linux-arm64.docker.tar   `docker load`, `podman load`, `ctr images import`), and for
#                                       linux/arm64, tagged R:V-arm64, both built from the
#                                       Dockerfile by tests/tools/build-image.sh (arm64
#                                       cross-compiled on this machine, see that script)
#   relaylet-V.oci.tar                  both, as the manifest list R:V (an OCI archive,
#                                       `skopeo copy --all oci-archive:... docker://...`)
#   relaylet-V.cdx.json                 the SBOM of the shipped crate's Rust dependencies
#                                       (CycloneDX JSON by cargo-cyclonedx; no dev-dependencies,
#                                       no build-dependencies, no relaylet-dev/relaylet-sim)
#   relaylet-V.tgz                      `helm package charts/relaylet`
#   LICENSE, CHANGELOG.md               the repository's
#   SHA256SUMS                          of the files above
#
# Checks on the way: the arm64 binary runs `help` under qemu-user (qemu-aarch64-static, with the
# arm64 image's own glibc) and says what the amd64 image's binary says; the SBOM names every
# crate `cargo tree -e normal --target all -p relaylet` names; the chart packages
# with the crate's version. Ends with a summary; any failure stops it with a message naming the
# step and a non-zero exit.
#
# Installs what it needs when missing: podman, mmdebstrap (build-image.sh), qemu-user-static
# (apt), the toolchain's aarch64-unknown-linux-gnu standard library (rustup), cargo-cyclonedx at
# a pinned version (crates.io, into ~/.cache/relaylet/tools), helm (tests/tools/install.sh).
# The images are built in podman's store and build-image.sh's cache as a test run builds them
# (RELAYLET_IMAGE_CACHE, CONTAINERS_STORAGE_CONF move them).
set -euo pipefail
set -o errtrace
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-${RELAYLET_RELEASE_DIR:-$root/target/release-artifacts}}"
tools="${RELAYLET_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/relaylet/tools}"
cyclonedx_version=0.5.9
started=$SECONDS

current="starting"
say() { echo "release.sh: $*" >&2; }
fail() {
  say "FAILED in step '$current': $*"
  exit 1
}
trap 'say "FAILED in step '"'"'$current'"'"': command exited $? at line $LINENO (output above)"' ERR
step() {
  current="$1"
  say "--- $1 ($((SECONDS - started)) s)"
}
mib() { echo "$(($1 / 1024 / 1024)) MiB"; }

step "version"
version="$(sed -n -E '/^\[package\]/,/^\[/s/^version = "([^"]+)"$/\1/p' "$root/Cargo.toml" | head -n1)"
[ -n "$version" ] || fail "no package version in Cargo.toml"
app_version="$(sed -n -E 's/^appVersion: "?([^"]+)"?$/\1/p' "$root/charts/relaylet/Chart.yaml")"
[ "$app_version" = "$version" ] ||
  fail "Cargo.toml says $version, charts/relaylet/Chart.yaml's appVersion $app_version: make them one"
repository="$(sed -n -E '/^image:/,/^[^ ]/s/^  repository: *"?([^" ]+)"?$/\1/p' "$root/charts/relaylet/values.yaml")"
[ -n "$repository" ] || fail "no image.repository in charts/relaylet/values.yaml"
grep -q "^## \[$version\]" "$root/CHANGELOG.md" 2>/dev/null ||
  fail "CHANGELOG.md has no '## [$version]' section"
[[ "$(head -n 3 "$root/LICENSE" 2>/dev/null)" == *"Apache License"* ]] ||
  fail "LICENSE is missing or not the Apache License"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
say "relaylet $version, image $repository, into $out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# --- tools ---------------------------------------------------------------------------------------
step "tools"
if ! command -v qemu-aarch64-static >/dev/null; then
  [ "$(id -u)" = 0 ] || fail "qemu-user-static is needed (apt-get install qemu-user-static, as root)"
  say "installing qemu-user-static with apt"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=300 update -qq || fail "apt-get update failed: Debian's packages are not reachable"
  apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends qemu-user-static >/dev/null ||
    fail "apt-get install qemu-user-static failed"
fi
rust_version="$(sed -n -E 's/^ARG RUST_VERSION=([0-9.]+)$/\1/p' "$root/Dockerfile")"
if command -v rustup >/dev/null; then
  # The image's toolchain is the host's (build-image.sh copies it); add arm64's std to it.
  rustup target add aarch64-unknown-linux-gnu --toolchain "$rust_version.0" >&2 ||
    fail "rustup target add aarch64-unknown-linux-gnu --toolchain $rust_version.0 failed"
fi
bash "$root/tests/tools/install.sh" >&2
helm="${RELAYLET_TOOLS_DIR:-$root/target/tools}/helm"
[ -x "$helm" ] || fail "no helm at $helm after tests/tools/install.sh"

# --- the images ----------------------------------------------------------------------------------
declare -A image_id image_size archive_size
for arch in amd64 arm64; do
  step "image linux/$arch (tests/tools/build-image.sh $arch)"
  bash "$root/tests/tools/build-image.sh" "$arch" | tee "$work/build-image-$arch.out" >&2
  line="$(tail -n1 "$work/build-image-$arch.out")"
  # build-image.sh's last line: "<tag> <image id> <size> bytes ..."; tag the id it built (another
  # build may move its dev tag meanwhile).
  id="$(echo "$line" | awk '{print $2}')"
  [[ "$id" =~ ^(sha256:)?[0-9a-f]{64}$ ]] || fail "build-image.sh $arch printed no image id: $line"
  image_id[$arch]="$id"
  got="$(podman image inspect --format '{{.Architecture}}' "$id")"
  [ "$got" = "$arch" ] || fail "the $arch build is an image for $got"
  podman tag "$id" "$repository:$version-$arch"
  archive="$out/relaylet-$version-linux-$arch.docker.tar"
  rm -f "$archive"
  podman save --format docker-archive -o "$archive" "$repository:$version-$arch"
  image_size[$arch]="$(podman image inspect --format '{{.Size}}' "$id")"
  archive_size[$arch]="$(stat -c %s "$archive")"
  say "$repository:$version-$arch: ${image_size[$arch]} bytes, $archive"
done

step "the manifest list $repository:$version"
podman manifest rm "$repository:$version" >/dev/null 2>&1 || true
podman manifest create "$repository:$version" >/dev/null
for arch in amd64 arm64; do
  podman manifest add "$repository:$version" "containers-storage:$repository:$version-$arch" >/dev/null
done
oci="$out/relaylet-$version.oci.tar"
rm -f "$oci"
podman manifest push --quiet --all "$repository:$version" "oci-archive:$oci:$repository:$version" >&2
oci_size="$(stat -c %s "$oci")"

step "the arm64 binary under qemu"
mkdir -p "$work/arm64"
cid="$(podman create --platform linux/arm64 "${image_id[arm64]}" 2>/dev/null)"
podman export "$cid" | tar -x -C "$work/arm64"
podman rm "$cid" >/dev/null
binary="$work/arm64/usr/local/bin/relaylet"
machine="$(od -An -tx1 -j18 -N2 "$binary" | tr -d ' ')"
[ "$machine" = b700 ] || fail "the arm64 image's binary is not an aarch64 ELF (e_machine $machine)"
[ -e "$work/arm64/lib/ld-linux-aarch64.so.1" ] || [ -L "$work/arm64/lib/ld-linux-aarch64.so.1" ] ||
  fail "the arm64 image has no arm64 dynamic loader (lib/ld-linux-aarch64.so.1): its runtime base is not the arm64 one"
# -L: the arm64 image's own dynamic loader and glibc.
arm64_help="$(qemu-aarch64-static -L "$work/arm64" "$binary" help 2>&1)" ||
  fail "the arm64 binary's help under qemu failed: $arm64_help"
arm64_line="$(echo "$arm64_help" | sed -n 1p)"
amd64_help="$(podman --runtime runc run --rm --network none "${image_id[amd64]}" help 2>&1)" ||
  fail "the amd64 image's help failed: $amd64_help"
[ "$arm64_help" = "$amd64_help" ] ||
  fail "the arm64 and amd64 binaries' help differ:$(diff <(echo "$amd64_help") <(echo "$arm64_help") || true)"

# --- the SBOM ------------------------------------------------------------------------------------
step "SBOM (cargo-cyclonedx $cyclonedx_version)"
cyclonedx="$tools/cargo-cyclonedx-$cyclonedx_version/bin/cargo-cyclonedx"
if [ ! -x "$cyclonedx" ]; then
  say "installing cargo-cyclonedx $cyclonedx_version from crates.io into $tools"
  cargo install --locked --quiet --version "$cyclonedx_version" --root "$tools/cargo-cyclonedx-$cyclonedx_version" \
    --target-dir "$work/cargo-cyclonedx" cargo-cyclonedx >&2 || fail "cargo install cargo-cyclonedx $cyclonedx_version failed"
fi
# cargo-cyclonedx reads `cargo metadata`, whose resolve is the whole workspace's: features
# unified with the tests' and the dev crates' (kube's `ws` brought tungstenite into relaylet's
# SBOM). So it runs on a copy of the repository's tracked files where the workspace is the shipped
# crate alone, without its dev-dependencies (the copy's lock file keeps every version).
mkdir -p "$work/sbom"
git -C "$root" ls-files -z | (cd "$root" && tar --null -T - -c) | tar -x -C "$work/sbom"
sed -i -E 's/^members = \[.*\]$/members = ["."]/' "$work/sbom/Cargo.toml"
awk '/^\[dev-dependencies\]/ {skip = 1; next} /^\[/ {skip = 0} !skip' "$work/sbom/Cargo.toml" >"$work/sbom/Cargo.toml.new"
mv "$work/sbom/Cargo.toml.new" "$work/sbom/Cargo.toml"
# Its timestamp is the commit's (SOURCE_DATE_EPOCH); the copy's path in its references is
# written as /relaylet.
(cd "$work/sbom" && SOURCE_DATE_EPOCH="$(git -C "$root" log -1 --format=%ct)" "$cyclonedx" cyclonedx -q \
  --format json --spec-version 1.5 --target all --no-build-deps --override-filename "relaylet-$version.cdx" >&2)
sbom="$out/relaylet-$version.cdx.json"
sed "s|file://$work/sbom|file:///relaylet|g" "$work/sbom/relaylet-$version.cdx.json" >"$sbom"
sbom_crates="$(python3 -c '
import json, sys
bom = json.load(open(sys.argv[1]))
print("\n".join(sorted("%s %s" % (c["name"], c["version"]) for c in bom.get("components", []))))' "$sbom")"
# What cargo compiles into the binary, by its own feature resolver, for every target.
tree_crates="$(cd "$root" && cargo tree --quiet --locked -e normal --target all -p relaylet --prefix none |
  awk '$1 != "relaylet" {print $1, substr($2, 2)}' | sort -u)"
missing="$(comm -23 <(echo "$tree_crates") <(echo "$sbom_crates"))"
[ -z "$missing" ] || fail "crates of cargo tree -e normal --target all -p relaylet missing from the SBOM: $missing"
# cargo metadata's resolve may still list an optional dependency cargo's feature resolver leaves
# out; the SBOM keeps it (it says more, never less) and the summary names it.
extra="$(comm -13 <(echo "$tree_crates") <(echo "$sbom_crates") | paste -sd, - | sed 's/,/, /g')"
sbom_count="$(echo "$sbom_crates" | grep -c .)"
tree_count="$(echo "$tree_crates" | grep -c .)"
sbom_format="$(python3 -c 'import json, sys; b = json.load(open(sys.argv[1])); print(b["bomFormat"], b["specVersion"], "JSON")' "$sbom")"

# --- the chart -----------------------------------------------------------------------------------
step "helm package charts/relaylet"
"$helm" lint "$root/charts/relaylet" >&2
chart="$("$helm" package "$root/charts/relaylet" --destination "$out" | sed -n -E 's/^Successfully packaged chart and saved it to: //p')"
[ -f "$chart" ] || fail "helm package printed no chart file"
[ "$(basename "$chart")" = "relaylet-$version.tgz" ] || fail "the chart's version is not $version: $chart"

# --- repository files, sums ----------------------------------------------------------------------
step "LICENSE, CHANGELOG.md, SHA256SUMS"
cp "$root/LICENSE" "$root/CHANGELOG.md" "$out/"
(cd "$out" && sha256sum "relaylet-$version-linux-amd64.docker.tar" "relaylet-$version-linux-arm64.docker.tar" \
  "relaylet-$version.oci.tar" "relaylet-$version.cdx.json" "relaylet-$version.tgz" LICENSE CHANGELOG.md >SHA256SUMS)

current="summary"
cat <<EOF
relaylet $version release artifacts in $out ($((SECONDS - started)) s)
  image linux/amd64  $repository:$version-amd64  ${image_size[amd64]} bytes ($(mib "${image_size[amd64]}")), relaylet-$version-linux-amd64.docker.tar $(mib "${archive_size[amd64]}")
  image linux/arm64  $repository:$version-arm64  ${image_size[arm64]} bytes ($(mib "${image_size[arm64]}")), relaylet-$version-linux-arm64.docker.tar $(mib "${archive_size[arm64]}")
  both (manifest list $repository:$version)  relaylet-$version.oci.tar $(mib "$oci_size")
  arm64 help under qemu-aarch64-static: $arm64_line
  SBOM: relaylet-$version.cdx.json, $sbom_format, $sbom_count crates (cargo tree -e normal --target all -p relaylet: $tree_count, all in it${extra:+; also listed: $extra})
  chart: $(basename "$chart")
  LICENSE, CHANGELOG.md, SHA256SUMS
EOF
