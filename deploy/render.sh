#!/usr/bin/env bash
# Renders deploy/relaylet.yaml, the plain manifests for users without Helm: the chart with its
# default values, release "relaylet" in namespace "relaylet". tests/it/chart.rs fails when the
# file and the chart drift apart; run this after changing the chart.
#   deploy/render.sh           rewrite deploy/relaylet.yaml
#   deploy/render.sh --stdout  print what the file should hold
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
helm="${HELM:-$root/target/tools/helm}"
[ -x "$helm" ] || helm="$(command -v helm)" || {
  echo "render.sh: no helm (run tests/tools/install.sh or set HELM)" >&2
  exit 1
}

render() {
  cat <<'HEADER'
# relaylet: plain manifests, rendered from charts/relaylet with its default values by
# deploy/render.sh (do not edit by hand). Install:
#   kubectl create namespace relaylet
#   kubectl apply -f deploy/relaylet.yaml
# then register leaf clusters with deploy/make-leaf-secret.sh (see the README, "Install into real clusters").
HEADER
  # Not installed by Helm: drop the label that would tell Helm (and people) otherwise, and
  # the `helm test` hook (--skip-tests).
  "$helm" template relaylet "$root/charts/relaylet" --namespace relaylet --skip-tests |
    sed '/app.kubernetes.io\/managed-by: Helm/d'
}

if [ "${1:-}" = "--stdout" ]; then
  render
else
  render >"$root/deploy/relaylet.yaml.tmp"
  mv "$root/deploy/relaylet.yaml.tmp" "$root/deploy/relaylet.yaml"
fi
