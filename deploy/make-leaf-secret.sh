#!/usr/bin/env bash
# Registers a leaf cluster with relaylet: mints a kubeconfig for the leaf's relaylet-leaf
# ServiceAccount (deploy/leaf-rbac.yaml) from a context of your own leaf kubeconfig, and
# creates the labelled Secret that relaylet watches in the root cluster.
#
# The kubeconfig carries only the ServiceAccount's token and the leaf's CA, never your own
# credentials. The token goes from kubectl to a private temporary file to the Secret; it is
# never printed or passed on a command line.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: make-leaf-secret.sh --leaf-context CONTEXT --name LEAF [options]

  --leaf-context CONTEXT  kubeconfig context of the leaf cluster (required)
  --name LEAF             leaf cluster name: a DNS label; the virtual node is relaylet-LEAF (required)
  --root-context CONTEXT  kubeconfig context of the root cluster (default: current context)
  --namespace NS          root namespace relaylet watches for leaf Secrets (default: relaylet)
  --leaf-server URL       leaf apiserver URL as relaylet's pods reach it (default: the context's)
  --node-name NAME        virtual node name (annotation relaylet.io/node-name)
  --node-labels K=V,...   extra virtual node labels (annotation relaylet.io/node-labels)
  --node-taints SPEC      taints replacing the default, key[=value]:Effect,... ("" for none)
  --proxy-url URL         reach the leaf through this proxy (kubeconfig proxy-url): http://,
                          https:// or socks5://, e.g. the konnectivity server beside relaylet
  --proxy-ca FILE         PEM CA that verifies an https:// proxy (Secret key proxy-ca.crt)
  --proxy-client-cert FILE, --proxy-client-key FILE
                          PEM client certificate and key for an https:// proxy (Secret keys
                          proxy-client.crt, proxy-client.key)
  --apply-rbac            first apply deploy/leaf-rbac.yaml to the leaf cluster
  --token-file FILE       use this ServiceAccount token (e.g. from `kubectl create token
                          relaylet-leaf -n relaylet --duration=...`) instead of the long-lived
                          relaylet-leaf-token Secret's
  --dry-run               print the Secret (with the token!) instead of applying it
  -h, --help              this text

Uses kubectl ($KUBECTL if set) and the kubeconfig in $KUBECONFIG (or ~/.kube/config).
EOF
}

die() {
  echo "make-leaf-secret.sh: $*" >&2
  exit 1
}

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
leaf_context=""
root_context=""
name=""
namespace="relaylet"
leaf_server=""
node_name=""
node_labels=""
node_taints=""
set_taints=false
apply_rbac=false
dry_run=false
token_file=""
proxy_url=""
proxy_ca=""
proxy_client_cert=""
proxy_client_key=""

while [ $# -gt 0 ]; do
  case "$1" in
    --leaf-context) leaf_context="${2:?--leaf-context needs a value}"; shift 2 ;;
    --root-context) root_context="${2:?--root-context needs a value}"; shift 2 ;;
    --name) name="${2:?--name needs a value}"; shift 2 ;;
    --namespace) namespace="${2:?--namespace needs a value}"; shift 2 ;;
    --leaf-server) leaf_server="${2:?--leaf-server needs a value}"; shift 2 ;;
    --node-name) node_name="${2:?--node-name needs a value}"; shift 2 ;;
    --node-labels) node_labels="${2:?--node-labels needs a value}"; shift 2 ;;
    --node-taints)
      [ $# -ge 2 ] || die "--node-taints needs a value (\"\" for none)"
      node_taints="$2"; set_taints=true; shift 2 ;;
    --apply-rbac) apply_rbac=true; shift ;;
    --proxy-url) proxy_url="${2:?--proxy-url needs a value}"; shift 2 ;;
    --proxy-ca) proxy_ca="${2:?--proxy-ca needs a value}"; shift 2 ;;
    --proxy-client-cert) proxy_client_cert="${2:?--proxy-client-cert needs a value}"; shift 2 ;;
    --proxy-client-key) proxy_client_key="${2:?--proxy-client-key needs a value}"; shift 2 ;;
    --token-file) token_file="${2:?--token-file needs a value}"; shift 2 ;;
    --dry-run) dry_run=true; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done

[ -n "$leaf_context" ] || { usage >&2; die "--leaf-context is required"; }
[ -n "$name" ] || { usage >&2; die "--name is required"; }
if ! [[ "$name" =~ ^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$ ]]; then
  die "--name $name is not a DNS label (lowercase letters, digits, '-', at most 63)"
fi
case "$proxy_url" in
  "" | http://* | https://* | socks5://*) ;;
  *) die "--proxy-url must start with http://, https:// or socks5://" ;;
esac
if [ -n "$proxy_ca$proxy_client_cert$proxy_client_key" ]; then
  case "$proxy_url" in
    https://*) ;;
    *) die "--proxy-ca and --proxy-client-* are for an https:// --proxy-url" ;;
  esac
fi
case "$proxy_url" in
  https://*) [ -n "$proxy_ca" ] || die "an https:// --proxy-url needs --proxy-ca" ;;
esac
if { [ -n "$proxy_client_cert" ] && [ -z "$proxy_client_key" ]; } ||
  { [ -z "$proxy_client_cert" ] && [ -n "$proxy_client_key" ]; }; then
  die "--proxy-client-cert and --proxy-client-key go together"
fi
for f in "$proxy_ca" "$proxy_client_cert" "$proxy_client_key"; do
  [ -z "$f" ] || [ -r "$f" ] || die "cannot read $f"
done
kubectl="${KUBECTL:-kubectl}"
command -v "$kubectl" >/dev/null || die "$kubectl is not on PATH (or set KUBECTL)"

leaf=("$kubectl" --context "$leaf_context")
root=("$kubectl")
if [ -n "$root_context" ]; then
  root=("$kubectl" --context "$root_context")
fi

if $apply_rbac; then
  "${leaf[@]}" apply -f "$here/leaf-rbac.yaml" >&2
fi

token_b64=""
if [ -n "$token_file" ]; then
  [ -r "$token_file" ] || die "cannot read --token-file $token_file"
  token_b64="$(tr -d '[:space:]' <"$token_file" | base64 | tr -d '\n')"
else
  # The token controller fills the token Secret in asynchronously after it is created.
  for _ in $(seq 1 30); do
    token_b64="$("${leaf[@]}" -n relaylet get secret relaylet-leaf-token \
      -o 'jsonpath={.data.token}' 2>/dev/null || true)"
    [ -n "$token_b64" ] && break
    sleep 1
  done
fi
[ -n "$token_b64" ] || die "no token in relaylet/relaylet-leaf-token in context $leaf_context (apply deploy/leaf-rbac.yaml first, or pass --apply-rbac)"

view=("$kubectl" config view --raw --minify --flatten --context "$leaf_context")
if [ -z "$leaf_server" ]; then
  leaf_server="$("${view[@]}" -o 'jsonpath={.clusters[0].cluster.server}')"
fi
[ -n "$leaf_server" ] || die "context $leaf_context names no server; pass --leaf-server"
case "$leaf_server" in
  https://127.* | https://localhost* | https://\[::1\]*)
    echo "make-leaf-secret.sh: warning: $leaf_server is a loopback address; relaylet's pods cannot reach it (pass --leaf-server)" >&2 ;;
esac
# Trust the CA that the leaf kubeconfig trusts; else the cluster CA the token Secret carries.
ca_b64="$("${view[@]}" -o 'jsonpath={.clusters[0].cluster.certificate-authority-data}')"
if [ -z "$ca_b64" ] && [ -z "$token_file" ]; then
  ca_b64="$("${leaf[@]}" -n relaylet get secret relaylet-leaf-token -o 'jsonpath={.data.ca\.crt}')"
fi
[ -n "$ca_b64" ] || die "no CA for the leaf apiserver in context $leaf_context or the token Secret"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
umask 077
{
  echo "apiVersion: v1"
  echo "kind: Config"
  echo "clusters:"
  echo "  - name: $name"
  echo "    cluster:"
  echo "      server: $leaf_server"
  echo "      certificate-authority-data: $ca_b64"
  [ -z "$proxy_url" ] || echo "      proxy-url: $proxy_url"
  echo "users:"
  echo "  - name: relaylet-leaf"
  echo "    user:"
  printf '      token: %s\n' "$(printf '%s' "$token_b64" | base64 -d)"
  echo "contexts:"
  echo "  - name: $name"
  echo "    context:"
  echo "      cluster: $name"
  echo "      user: relaylet-leaf"
  echo "current-context: $name"
} >"$work/kubeconfig"

proxy_files=()
[ -z "$proxy_ca" ] || proxy_files+=(--from-file=proxy-ca.crt="$proxy_ca")
[ -z "$proxy_client_cert" ] || proxy_files+=(--from-file=proxy-client.crt="$proxy_client_cert")
[ -z "$proxy_client_key" ] || proxy_files+=(--from-file=proxy-client.key="$proxy_client_key")
"${root[@]}" -n "$namespace" create secret generic "relaylet-leaf-$name" \
  --from-file=kubeconfig="$work/kubeconfig" ${proxy_files[@]+"${proxy_files[@]}"} \
  --dry-run=client -o yaml >"$work/secret.yaml"
"$kubectl" label --local -f "$work/secret.yaml" -o yaml \
  "relaylet.io/leaf-cluster=$name" >"$work/labelled.yaml"
annotations=()
[ -n "$node_name" ] && annotations+=("relaylet.io/node-name=$node_name")
[ -n "$node_labels" ] && annotations+=("relaylet.io/node-labels=$node_labels")
$set_taints && annotations+=("relaylet.io/node-taints=$node_taints")
if [ ${#annotations[@]} -gt 0 ]; then
  "$kubectl" annotate --local -f "$work/labelled.yaml" -o yaml "${annotations[@]}" >"$work/final.yaml"
else
  cp "$work/labelled.yaml" "$work/final.yaml"
fi

if $dry_run; then
  cat "$work/final.yaml"
else
  "${root[@]}" apply -f "$work/final.yaml" >&2
  echo "leaf cluster $name registered: Secret $namespace/relaylet-leaf-$name" >&2
fi
