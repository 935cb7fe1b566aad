//! The Helm chart (`charts/relaylet`) and the plain manifests (`deploy/`), checked the way a
//! cluster and relaylet itself would check them.
//!
//! `helm lint --strict` and `helm template` run over the default values and every value set in
//! `charts/relaylet/ci/`; every rendered object must deserialize into its typed Kubernetes API
//! object (k8s-openapi, or the CRD shapes below) *and serialize back to exactly what was
//! rendered*, so a misspelt or misplaced field fails instead of being dropped silently. Then the
//! objects must fit together (selectors, ports, volumes, RBAC bindings), grant exactly the
//! permissions relaylet's code uses, and configure the real `relaylet` binary so that its own
//! `check-config` accepts the result. Bad value sets must be refused by `values.schema.json`.
//!
//! The monitoring objects (ServiceMonitor or PodMonitor, PrometheusRule, the Grafana dashboard's
//! ConfigMap) are checked here as objects; what their queries mean is `monitoring.rs`'s.
//!
//! The same checks cover `deploy/`: the plain manifests must be the chart's default render, the
//! leaf-side RBAC must grant exactly what relaylet relays, and `make-leaf-secret.sh` (driven by
//! the real kubectl, offline) must mint a kubeconfig that relaylet's own loader accepts.

use base64::Engine as _;
use relaylet_dev::testkit::scratch::Scratch;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, EnvVar, Namespace, Pod, PodSpec, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{
    self as rbac, ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

const RELEASE: &str = "relaylet";
const NAMESPACE: &str = "relaylet";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn chart() -> PathBuf {
    repo().join("charts/relaylet")
}

fn helm() -> PathBuf {
    relaylet_sim::tools::helm().expect("helm 4 (installed by tests/tools/install.sh)")
}

/// A value set: values files from `charts/relaylet/ci/` and extra helm flags.
#[derive(Debug, Clone)]
struct ValueSet {
    name: &'static str,
    file: Option<PathBuf>,
    flags: Vec<String>,
}

impl ValueSet {
    fn defaults() -> ValueSet {
        ValueSet {
            name: "default",
            file: None,
            flags: Vec::new(),
        }
    }

    fn ci(name: &'static str) -> ValueSet {
        let file = chart().join("ci").join(format!("{name}-values.yaml"));
        assert!(file.exists(), "{} is missing", file.display());
        ValueSet {
            name,
            file: Some(file),
            flags: Vec::new(),
        }
    }

    fn with(mut self, flags: &[&str]) -> ValueSet {
        self.flags.extend(flags.iter().map(|f| f.to_string()));
        self
    }

    fn args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(file) = &self.file {
            args.push("--values".to_string());
            args.push(file.display().to_string());
        }
        args.extend(self.flags.iter().cloned());
        args
    }

    /// The values file as JSON, for comparing rendered objects with what the user asked for.
    fn file_values(&self) -> Value {
        let file = self.file.as_ref().expect("a ci value set");
        let text = std::fs::read_to_string(file).unwrap();
        serde_saphyr::from_str(&text).unwrap()
    }
}

/// Every value set in `charts/relaylet/ci/` plus the defaults; the test fails when a file is
/// added there without being listed here.
fn value_sets() -> Vec<ValueSet> {
    let sets = vec![
        ValueSet::defaults(),
        ValueSet::ci("cert-manager"),
        ValueSet::ci("existing-secret"),
        ValueSet::ci("network-policy"),
        ValueSet::ci("single-replica"),
        ValueSet::ci("openshift"),
        ValueSet::ci("sidecar"),
        ValueSet::ci("external-identity"),
        ValueSet::ci("host-network"),
        ValueSet::ci("monitoring"),
    ];
    let on_disk: BTreeSet<PathBuf> = std::fs::read_dir(chart().join("ci"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let listed: BTreeSet<PathBuf> = sets.iter().filter_map(|s| s.file.clone()).collect();
    assert_eq!(on_disk, listed, "every ci value set is tested");
    sets
}

fn run_helm(args: &[String]) -> Output {
    // No cluster: lint, template and client dry runs must not need one.
    Command::new(helm())
        .args(args)
        .env("KUBECONFIG", "/nonexistent")
        .env(
            "HELM_CACHE_HOME",
            std::env::temp_dir().join("relaylet-helm-cache"),
        )
        .env(
            "HELM_CONFIG_HOME",
            std::env::temp_dir().join("relaylet-helm-config"),
        )
        .env(
            "HELM_DATA_HOME",
            std::env::temp_dir().join("relaylet-helm-data"),
        )
        .output()
        .expect("running helm")
}

/// `helm template` of the chart, or helm's error output.
fn template(values: &ValueSet) -> Result<String, String> {
    let mut args: Vec<String> = ["template", RELEASE]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(chart().display().to_string());
    args.extend(["--namespace".to_string(), NAMESPACE.to_string()]);
    args.extend(values.args());
    let out = run_helm(&args);
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).to_string())
    }
}

/// `helm lint --strict` of the chart, or helm's output.
fn lint(values: &ValueSet) -> Result<(), String> {
    let mut args = vec!["lint".to_string(), "--strict".to_string()];
    args.push(chart().display().to_string());
    args.extend(["--namespace".to_string(), NAMESPACE.to_string()]);
    args.extend(values.args());
    let out = run_helm(&args);
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The documents of a multi-document YAML stream, as JSON values.
fn documents(yaml: &str) -> Vec<Value> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).expect("rendered YAML parses");
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

/// Where two JSON values first differ, as a path (`/spec/template/...`), or `None`.
fn first_difference(rendered: &Value, typed: &Value, path: &str) -> Option<String> {
    match (rendered, typed) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            keys.into_iter().find_map(|k| match (a.get(k), b.get(k)) {
                (Some(x), Some(y)) => first_difference(x, y, &format!("{path}/{k}")),
                _ => Some(format!("{path}/{k}")),
            })
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(i, (x, y))| first_difference(x, y, &format!("{path}/{i}"))),
        (a, b) if a == b => None,
        _ => Some(path.to_string()),
    }
}

/// Deserializes `doc` into `T` and insists that serializing it back gives `doc` again: a field
/// the type does not know (a typo, a wrong level of indentation) would be dropped and fail here.
fn exact<T: DeserializeOwned + Serialize>(doc: &Value) -> T {
    let what = format!(
        "{} {}",
        doc["kind"].as_str().unwrap_or("?"),
        doc["metadata"]["name"].as_str().unwrap_or("?")
    );
    let typed: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{what} does not fit its API type: {e}\n{doc:#}"));
    let back = serde_json::to_value(&typed).unwrap();
    if let Some(path) = first_difference(doc, &back, "") {
        panic!("{what}: {path} is not a field of the API type, or has the wrong shape\n{doc:#}");
    }
    typed
}

/// cert-manager.io/v1 Certificate: the fields the chart may use, as in cert-manager's CRD.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Certificate {
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: CertificateSpec,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CertificateSpec {
    secret_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    common_name: Option<String>,
    dns_names: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    renew_before: Option<String>,
    usages: Vec<KeyUsage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    private_key: Option<CertificatePrivateKey>,
    issuer_ref: IssuerRef,
}

/// The key usages cert-manager accepts that a TLS server certificate may carry.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
enum KeyUsage {
    #[serde(rename = "server auth")]
    ServerAuth,
    #[serde(rename = "digital signature")]
    DigitalSignature,
    #[serde(rename = "key encipherment")]
    KeyEncipherment,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CertificatePrivateKey {
    algorithm: KeyAlgorithm,
    size: u32,
    rotation_policy: RotationPolicy,
}

#[derive(Debug, Serialize, Deserialize)]
enum KeyAlgorithm {
    #[serde(rename = "RSA")]
    Rsa,
    #[serde(rename = "ECDSA")]
    Ecdsa,
    Ed25519,
}

#[derive(Debug, Serialize, Deserialize)]
enum RotationPolicy {
    Never,
    Always,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct IssuerRef {
    name: String,
    kind: String,
    group: String,
}

/// monitoring.coreos.com/v1 ServiceMonitor: the fields the chart may use.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ServiceMonitor {
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: ServiceMonitorSpec,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ServiceMonitorSpec {
    #[serde(skip_serializing_if = "Option::is_none")]
    namespace_selector: Option<NamespaceSelector>,
    selector: LabelSelector,
    endpoints: Vec<MonitorEndpoint>,
}

/// monitoring.coreos.com/v1 PodMonitor: the fields the chart may use.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PodMonitor {
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: PodMonitorSpec,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PodMonitorSpec {
    #[serde(skip_serializing_if = "Option::is_none")]
    namespace_selector: Option<NamespaceSelector>,
    selector: LabelSelector,
    pod_metrics_endpoints: Vec<MonitorEndpoint>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct NamespaceSelector {
    match_names: Vec<String>,
}

/// A ServiceMonitor's endpoint or a PodMonitor's podMetricsEndpoint (the same fields here).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct MonitorEndpoint {
    port: String,
    path: String,
    scheme: Scheme,
    interval: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    scrape_timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    relabelings: Option<Vec<RelabelConfig>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    metric_relabelings: Option<Vec<RelabelConfig>>,
}

/// prometheus-operator's RelabelConfig.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RelabelConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    source_labels: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    separator: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    target_label: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    regex: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    modulo: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    replacement: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    action: Option<String>,
}

/// monitoring.coreos.com/v1 PrometheusRule: alerting rules only.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PrometheusRule {
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: PrometheusRuleSpec,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PrometheusRuleSpec {
    groups: Vec<RuleGroup>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleGroup {
    name: String,
    rules: Vec<AlertRule>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct AlertRule {
    alert: String,
    expr: String,
    #[serde(rename = "for")]
    for_: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

impl PrometheusRule {
    fn alerts(&self) -> impl Iterator<Item = &AlertRule> {
        self.spec.groups.iter().flat_map(|g| &g.rules)
    }

    fn alert(&self, name: &str) -> Option<&AlertRule> {
        self.alerts().find(|a| a.alert == name)
    }
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "lowercase")]
enum Scheme {
    Http,
    Https,
}

/// A rendered release, every object typed.
#[derive(Debug, Default)]
struct Rendered {
    deployments: Vec<Deployment>,
    services: Vec<Service>,
    service_accounts: Vec<ServiceAccount>,
    secrets: Vec<Secret>,
    namespaces: Vec<Namespace>,
    cluster_roles: Vec<ClusterRole>,
    cluster_role_bindings: Vec<ClusterRoleBinding>,
    roles: Vec<Role>,
    role_bindings: Vec<RoleBinding>,
    pdbs: Vec<PodDisruptionBudget>,
    network_policies: Vec<NetworkPolicy>,
    certificates: Vec<Certificate>,
    service_monitors: Vec<ServiceMonitor>,
    pod_monitors: Vec<PodMonitor>,
    prometheus_rules: Vec<PrometheusRule>,
    config_maps: Vec<ConfigMap>,
    /// The `helm test` hook (`templates/tests/`).
    test_pods: Vec<Pod>,
    crds: Vec<CustomResourceDefinition>,
    /// Every object's metadata, for checks that apply to all.
    metas: Vec<(String, ObjectMeta)>,
}

impl Rendered {
    fn parse(yaml: &str) -> Rendered {
        let mut r = Rendered::default();
        for doc in documents(yaml) {
            let api_version = doc["apiVersion"].as_str().unwrap_or_default().to_string();
            let kind = doc["kind"].as_str().unwrap_or_default().to_string();
            let meta: ObjectMeta = serde_json::from_value(doc["metadata"].clone())
                .unwrap_or_else(|e| panic!("{kind}: bad metadata: {e}"));
            r.metas.push((kind.clone(), meta));
            match (api_version.as_str(), kind.as_str()) {
                ("apps/v1", "Deployment") => r.deployments.push(exact(&doc)),
                ("v1", "Service") => r.services.push(exact(&doc)),
                ("v1", "ServiceAccount") => r.service_accounts.push(exact(&doc)),
                ("v1", "Secret") => r.secrets.push(exact(&doc)),
                ("v1", "Namespace") => r.namespaces.push(exact(&doc)),
                ("rbac.authorization.k8s.io/v1", "ClusterRole") => {
                    r.cluster_roles.push(exact(&doc))
                }
                ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                    r.cluster_role_bindings.push(exact(&doc))
                }
                ("rbac.authorization.k8s.io/v1", "Role") => r.roles.push(exact(&doc)),
                ("rbac.authorization.k8s.io/v1", "RoleBinding") => {
                    r.role_bindings.push(exact(&doc))
                }
                ("policy/v1", "PodDisruptionBudget") => r.pdbs.push(exact(&doc)),
                ("networking.k8s.io/v1", "NetworkPolicy") => r.network_policies.push(exact(&doc)),
                ("cert-manager.io/v1", "Certificate") => r.certificates.push(exact(&doc)),
                ("monitoring.coreos.com/v1", "ServiceMonitor") => {
                    r.service_monitors.push(exact(&doc))
                }
                ("monitoring.coreos.com/v1", "PodMonitor") => r.pod_monitors.push(exact(&doc)),
                ("monitoring.coreos.com/v1", "PrometheusRule") => {
                    r.prometheus_rules.push(exact(&doc))
                }
                ("v1", "ConfigMap") => r.config_maps.push(exact(&doc)),
                ("v1", "Pod") => r.test_pods.push(exact(&doc)),
                ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => r.crds.push(exact(&doc)),
                other => panic!("unexpected object {other:?}"),
            }
        }
        r
    }

    fn render(values: &ValueSet) -> Rendered {
        let yaml = template(values)
            .unwrap_or_else(|e| panic!("helm template ({}) failed: {e}", values.name));
        Rendered::parse(&yaml)
    }

    fn deployment(&self) -> &Deployment {
        assert_eq!(self.deployments.len(), 1, "one Deployment");
        &self.deployments[0]
    }

    fn pod(&self) -> &PodSpec {
        self.deployment()
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
    }

    /// relaylet's own container (the first; extraContainers come after it).
    fn container(&self) -> &Container {
        let c = &self.pod().containers[0];
        assert_eq!(c.name, "relaylet", "relaylet's container comes first");
        c
    }

    /// Every container of the pod, init containers included.
    fn all_containers(&self) -> impl Iterator<Item = &Container> {
        let pod = self.pod();
        pod.init_containers
            .iter()
            .flatten()
            .chain(pod.containers.iter())
    }

    fn pod_labels(&self) -> BTreeMap<String, String> {
        self.deployment()
            .spec
            .as_ref()
            .unwrap()
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default()
    }

    fn env(&self, name: &str) -> Option<&EnvVar> {
        self.container()
            .env
            .iter()
            .flatten()
            .find(|e| e.name == name)
    }

    fn env_value(&self, name: &str) -> Option<&str> {
        self.env(name).and_then(|e| e.value.as_deref())
    }

    fn container_port(&self, name: &str) -> i32 {
        self.container()
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("container port {name}"))
            .container_port
    }

    /// Every permission granted to relaylet's ServiceAccount, as
    /// `(namespace or "*", apiGroup, resource, resourceName or "", verb)`.
    fn permissions(&self) -> BTreeSet<Grant> {
        let sa = self.service_account_name();
        let ours = |subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| {
            subjects.iter().flatten().any(|s| {
                s.kind == "ServiceAccount"
                    && s.name == sa
                    && s.namespace.as_deref() == Some(NAMESPACE)
            })
        };
        let mut grants = BTreeSet::new();
        for binding in &self.cluster_role_bindings {
            if !ours(&binding.subjects) {
                continue;
            }
            assert_eq!(binding.role_ref.kind, "ClusterRole");
            let role = self
                .cluster_roles
                .iter()
                .find(|r| r.metadata.name.as_deref() == Some(binding.role_ref.name.as_str()))
                .unwrap_or_else(|| panic!("ClusterRole {} is rendered", binding.role_ref.name));
            add_grants(&mut grants, "*", role.rules.iter().flatten());
        }
        for binding in &self.role_bindings {
            if !ours(&binding.subjects) {
                continue;
            }
            let ns = binding.metadata.namespace.clone().unwrap();
            assert_eq!(binding.role_ref.kind, "Role");
            let role = self
                .roles
                .iter()
                .find(|r| {
                    r.metadata.name.as_deref() == Some(binding.role_ref.name.as_str())
                        && r.metadata.namespace.as_deref() == Some(ns.as_str())
                })
                .unwrap_or_else(|| panic!("Role {ns}/{} is rendered", binding.role_ref.name));
            add_grants(&mut grants, &ns, role.rules.iter().flatten());
        }
        grants
    }

    /// The ServiceAccount the pods run as (rendered by the chart or not).
    fn service_account_name(&self) -> String {
        self.pod()
            .service_account_name
            .clone()
            .expect("the pod names its ServiceAccount")
    }

    /// Whether any RBAC object is rendered.
    /// Every subject of every (Cluster)RoleBinding.
    fn binding_subjects(&self) -> impl Iterator<Item = &rbac::Subject> {
        self.cluster_role_bindings
            .iter()
            .flat_map(|b| b.subjects.iter().flatten())
            .chain(
                self.role_bindings
                    .iter()
                    .flat_map(|b| b.subjects.iter().flatten()),
            )
    }

    fn has_rbac(&self) -> bool {
        !(self.cluster_roles.is_empty()
            && self.cluster_role_bindings.is_empty()
            && self.roles.is_empty()
            && self.role_bindings.is_empty())
    }
}

type Grant = (String, String, String, String, String);

fn add_grants<'a>(
    grants: &mut BTreeSet<Grant>,
    namespace: &str,
    rules: impl Iterator<Item = &'a PolicyRule>,
) {
    for rule in rules {
        assert!(
            rule.non_resource_urls.is_none(),
            "no non-resource URLs: {rule:?}"
        );
        let names: Vec<String> = match &rule.resource_names {
            Some(names) => names.clone(),
            None => vec![String::new()],
        };
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for name in &names {
                    for verb in &rule.verbs {
                        grants.insert((
                            namespace.to_string(),
                            group.clone(),
                            resource.clone(),
                            name.clone(),
                            verb.clone(),
                        ));
                    }
                }
            }
        }
    }
}

fn grant(ns: &str, group: &str, resource: &str, name: &str, verbs: &[&str]) -> Vec<Grant> {
    verbs
        .iter()
        .map(|v| {
            (
                ns.to_string(),
                group.to_string(),
                resource.to_string(),
                name.to_string(),
                v.to_string(),
            )
        })
        .collect()
}

/// What relaylet's code calls in the root cluster (src/virtual_node, src/replicas/,
/// src/routing/pod_index.rs, src/leaf/mod.rs, src/node_server/auth.rs, src/lib.rs), with these values.
fn expected_permissions(
    webhook: bool,
    cluster_ca: bool,
    leader: bool,
    pod_sync: bool,
    tokens: bool,
    leaf_ns: &str,
) -> BTreeSet<Grant> {
    let mut g = Vec::new();
    g.extend(grant(
        "*",
        "",
        "nodes",
        "",
        &["get", "list", "watch", "create", "patch", "delete"],
    ));
    g.extend(grant("*", "", "nodes/status", "", &["patch"]));
    g.extend(grant("*", "", "pods", "", &["get", "list", "watch"]));
    if pod_sync {
        // src/pod_sync: the pods' status written, a deleted pod removed once its copy is gone.
        g.extend(grant("*", "", "pods/status", "", &["update"]));
        g.extend(grant("*", "", "pods", "", &["delete"]));
        // src/pod_sync/copied.rs: what the pods name, read by name to copy it into the leaf.
        g.extend(grant("*", "", "configmaps", "", &["get"]));
        g.extend(grant("*", "", "secrets", "", &["get"]));
        // src/pod_sync/leaf_events.rs: the leaf's Events about a copy, told on its pod.
        g.extend(grant("*", "events.k8s.io", "events", "", &["create"]));
        if tokens {
            // src/pod_sync/tokens.rs: each pod's tokens, bound to it.
            g.extend(grant("*", "", "serviceaccounts/token", "", &["create"]));
        }
    }
    if webhook {
        g.extend(grant(
            "*",
            "authentication.k8s.io",
            "tokenreviews",
            "",
            &["create"],
        ));
        g.extend(grant(
            "*",
            "authorization.k8s.io",
            "subjectaccessreviews",
            "",
            &["create"],
        ));
    }
    g.extend(grant(
        "kube-node-lease",
        "coordination.k8s.io",
        "leases",
        "",
        &["get", "create", "patch", "delete"],
    ));
    if leader {
        // The leader Lease and one presence Lease per replica (named after its pod); a Lease
        // that breaks the replica rules gets an Event (src/replicas/ignored.rs). The pods the
        // rules ask about (src/replicas/live_pods.rs) are read with the pods rule above.
        g.extend(grant(
            NAMESPACE,
            "coordination.k8s.io",
            "leases",
            "",
            &["create", "get", "list", "update", "delete"],
        ));
        g.extend(grant(NAMESPACE, "events.k8s.io", "events", "", &["create"]));
        // The published assignment (src/replicas/published.rs), read and written by name.
        g.extend(grant(
            NAMESPACE,
            "",
            "configmaps",
            "relaylet-assignment",
            &["get", "list", "watch", "update"],
        ));
        g.extend(grant(NAMESPACE, "", "configmaps", "", &["create"]));
    }
    // Watched; patched to write a renewed leaf token back (src/virtual_node/credential_renewal.rs).
    g.extend(grant(
        leaf_ns,
        "",
        "secrets",
        "",
        &["list", "watch", "patch"],
    ));
    g.extend(grant(leaf_ns, "events.k8s.io", "events", "", &["create"]));
    // src/virtual_node/leaf_rows.rs: the row beside each leaf Secret.
    g.extend(grant(
        leaf_ns,
        "relaylet.io",
        "leafclusters",
        "",
        &["list", "create", "patch", "delete"],
    ));
    if cluster_ca {
        g.extend(grant(
            "kube-system",
            "",
            "configmaps",
            "extension-apiserver-authentication",
            &["get", "list", "watch"],
        ));
    }
    g.into_iter().collect()
}

/// A monitor made in the release namespace selects there; one made elsewhere names it.
fn check_monitor_namespace(meta: &ObjectMeta, selector: Option<&NamespaceSelector>, set: &str) {
    match meta.namespace.as_deref() {
        Some(NAMESPACE) => assert!(selector.is_none(), "{set}: {:?}", meta.name),
        Some(_) => assert_eq!(
            selector.map(|s| s.match_names.as_slice()),
            Some([NAMESPACE.to_string()].as_slice()),
            "{set}: {:?} in {:?}",
            meta.name,
            meta.namespace
        ),
        None => panic!("{set}: {:?} has no namespace", meta.name),
    }
}

fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    assert!(
        selector.match_expressions.is_none(),
        "plain label selectors"
    );
    let wanted = selector.match_labels.clone().unwrap_or_default();
    !wanted.is_empty() && wanted.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// What every value set must render: a secure, self-consistent release.
fn check_invariants(r: &Rendered, set: &str) {
    check_test_hook(r, set);
    // Every object is ours and lands in a definite namespace.
    for (kind, meta) in &r.metas {
        let labels = meta.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get("app.kubernetes.io/name").map(String::as_str),
            Some("relaylet"),
            "{set}: {kind} {:?} carries the chart's labels",
            meta.name
        );
        let cluster_scoped = matches!(
            kind.as_str(),
            "ClusterRole" | "ClusterRoleBinding" | "CustomResourceDefinition"
        );
        assert_eq!(
            meta.namespace.is_none(),
            cluster_scoped,
            "{set}: {kind} {:?} namespace",
            meta.name
        );
    }
    for kind in [
        "Deployment",
        "Service",
        "ServiceAccount",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "Certificate",
    ] {
        for (_, meta) in r.metas.iter().filter(|(k, _)| k == kind) {
            assert_eq!(meta.namespace.as_deref(), Some(NAMESPACE), "{set}: {kind}");
        }
    }

    // The pod: non-root, read-only, no capabilities, seccomp, the chart's service account.
    let pod = r.pod();
    let psc = pod.security_context.as_ref().unwrap();
    assert_eq!(psc.run_as_non_root, Some(true), "{set}");
    // Given, never root; or left to the platform (OpenShift assigns one from a range).
    assert_ne!(psc.run_as_user, Some(0), "{set}");
    assert_ne!(psc.run_as_group, Some(0), "{set}");
    assert_eq!(
        psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
        Some("RuntimeDefault"),
        "{set}"
    );
    // The ServiceAccount the pods run as is the one rendered, if the chart makes one.
    match r.service_accounts.as_slice() {
        [] => {}
        [sa] => assert_eq!(
            sa.metadata.name,
            Some(r.service_account_name()),
            "{set}: the pods run as the ServiceAccount rendered"
        ),
        more => panic!("{set}: {} ServiceAccounts", more.len()),
    }
    assert_eq!(
        pod.automount_service_account_token,
        Some(true),
        "{set}: needs its token"
    );
    let c = r.container();
    let csc = c.security_context.as_ref().unwrap();
    assert_eq!(csc.read_only_root_filesystem, Some(true), "{set}");
    assert_eq!(csc.allow_privilege_escalation, Some(false), "{set}");
    assert_eq!(csc.privileged, Some(false), "{set}");
    let caps = csc.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop, Some(vec!["ALL".to_string()]), "{set}");
    assert!(caps.add.is_none(), "{set}");
    let resources = c.resources.as_ref().unwrap();
    assert!(
        resources
            .requests
            .as_ref()
            .is_some_and(|r| r.contains_key("cpu"))
    );
    assert!(
        resources
            .limits
            .as_ref()
            .is_some_and(|l| l.contains_key("memory"))
    );

    // The env: each name once; identity and address from the downward API.
    let env = c.env.as_ref().unwrap();
    let names: BTreeSet<&str> = env.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names.len(), env.len(), "{set}: duplicate env names");
    let field = |name: &str| {
        r.env(name)
            .and_then(|e| e.value_from.as_ref())
            .and_then(|f| f.field_ref.as_ref())
            .map(|f| f.field_path.clone())
    };
    assert_eq!(
        field("LEAF_NODE_IP").as_deref(),
        Some("status.podIP"),
        "{set}"
    );
    assert_eq!(field("POD_NAME").as_deref(), Some("metadata.name"), "{set}");
    assert_eq!(
        field("POD_NAMESPACE").as_deref(),
        Some("metadata.namespace"),
        "{set}"
    );
    assert!(
        r.env_value("PREFERRED-ADDRESS-TYPE").is_some(),
        "{set}: Kosmos' dashed name"
    );

    // Ports and probes agree with the env relaylet reads.
    let kubelet_port = r.container_port("kubelet");
    assert_eq!(
        r.env_value("NODE_SERVER_PORT"),
        Some(kubelet_port.to_string().as_str()),
        "{set}"
    );
    let metrics_port = r.container_port("metrics");
    assert!(
        r.env_value("METRICS_ADDR")
            .is_some_and(|a| a.ends_with(&format!(":{metrics_port}"))),
        "{set}"
    );
    // Liveness on the metrics port's /livez (the kubelet port's /healthz needs credentials, like
    // a kubelet's); readiness on the metrics port's /readyz, which also turns false while
    // shutting down.
    let get = c
        .liveness_probe
        .as_ref()
        .unwrap()
        .http_get
        .as_ref()
        .unwrap();
    assert_eq!(get.path.as_deref(), Some("/livez"), "{set}");
    assert_eq!(
        get.port,
        IntOrString::String("metrics".to_string()),
        "{set}"
    );
    assert_eq!(get.scheme.as_deref(), Some("HTTP"), "{set}");
    let get = c
        .readiness_probe
        .as_ref()
        .unwrap()
        .http_get
        .as_ref()
        .unwrap();
    assert_eq!(get.path.as_deref(), Some("/readyz"), "{set}");
    assert_eq!(
        get.port,
        IntOrString::String("metrics".to_string()),
        "{set}"
    );
    assert_eq!(get.scheme.as_deref(), Some("HTTP"), "{set}");
    // A startup probe, when on, waits for /livez, never for readiness (a replica awaiting its
    // CSR's approval must not be restarted).
    if let Some(startup) = &c.startup_probe {
        let get = startup.http_get.as_ref().unwrap();
        assert_eq!(get.path.as_deref(), Some("/livez"), "{set}");
        assert_eq!(
            get.port,
            IntOrString::String("metrics".to_string()),
            "{set}"
        );
    }
    // In the node's network, the ports are the node's: declared (so two replicas never share a
    // node), clear of the node's kubelet and daemons (10248-10259), and cluster DNS still works.
    if pod.host_network == Some(true) {
        assert_eq!(
            pod.dns_policy.as_deref(),
            Some("ClusterFirstWithHostNet"),
            "{set}"
        );
        for port in c.ports.iter().flatten() {
            assert_eq!(port.host_port, Some(port.container_port), "{set}");
        }
        let first = r.container_port("kubelet");
        let last = first
            + r.env_value("NODE_PORTS")
                .and_then(|n| n.parse::<i32>().ok())
                .unwrap();
        assert!(
            last < 10248 || first > 10259,
            "{set}: kubelet ports {first}-{last} clear of the node's own"
        );
        let metrics = r.container_port("metrics");
        assert!(
            !(10248..=10259).contains(&metrics) && !(first..=last).contains(&metrics),
            "{set}: metrics port {metrics}"
        );
    } else {
        assert!(pod.dns_policy.is_none(), "{set}");
        for port in c.ports.iter().flatten() {
            assert!(port.host_port.is_none(), "{set}");
        }
    }
    // relaylet drains sessions before the kubelet kills the pod.
    let grace: u64 = r
        .env_value("SHUTDOWN_GRACE_PERIOD")
        .and_then(|g| g.strip_suffix('s'))
        .and_then(|g| g.parse().ok())
        .unwrap_or_else(|| panic!("{set}: SHUTDOWN_GRACE_PERIOD in seconds"));
    let termination = pod.termination_grace_period_seconds.unwrap_or(30) as u64;
    // The hand-over of the virtual nodes (at most 9 s) comes before the grace period.
    assert!(
        grace + 20 <= termination,
        "{set}: hand-over, grace {grace}s and settling within termination {termination}s"
    );

    // Mounts and volumes match; every file relaylet is told to read is in a mounted volume.
    let volumes: BTreeMap<String, &k8s_openapi::api::core::v1::Volume> = pod
        .volumes
        .iter()
        .flatten()
        .map(|v| (v.name.clone(), v))
        .collect();
    let mounts = c.volume_mounts.clone().unwrap_or_default();
    let mounted: BTreeSet<String> = r
        .all_containers()
        .flat_map(|c| c.volume_mounts.iter().flatten())
        .map(|m| m.name.clone())
        .collect();
    assert_eq!(
        mounted,
        volumes.keys().cloned().collect::<BTreeSet<_>>(),
        "{set}: every volume mounted by some container, every mount backed"
    );
    let names: Vec<&str> = r.all_containers().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names.iter().collect::<BTreeSet<_>>().len(),
        names.len(),
        "{set}: container names are unique: {names:?}"
    );
    for var in [
        "APISERVER_CERT_LOCATION",
        "APISERVER_KEY_LOCATION",
        "APISERVER_CA_CERT_LOCATION",
    ] {
        let Some(path) = r.env_value(var) else {
            continue;
        };
        let (dir, file) = path.rsplit_once('/').unwrap();
        let mount = mounts
            .iter()
            .find(|m| m.mount_path == dir)
            .unwrap_or_else(|| panic!("{set}: {var}={path} is in no mounted volume"));
        assert_eq!(mount.read_only, Some(true), "{set}");
        assert!(
            mount.sub_path.is_none(),
            "{set}: subPath mounts never see rotations"
        );
        let volume = volumes[&mount.name];
        let items = volume
            .secret
            .as_ref()
            .and_then(|s| s.items.clone())
            .or_else(|| volume.config_map.as_ref().and_then(|c| c.items.clone()))
            .unwrap_or_default();
        assert!(
            items.iter().any(|i| i.path == file),
            "{set}: {var}: volume {} has no {file}",
            mount.name
        );
    }

    // The Service, PDB, NetworkPolicy and ServiceMonitor select these pods and name real ports.
    let pod_labels = r.pod_labels();
    assert!(selector_matches(
        &r.deployment().spec.as_ref().unwrap().selector,
        &pod_labels
    ));
    assert_eq!(r.services.len(), 1, "{set}: one Service");
    let service = &r.services[0];
    let sspec = service.spec.as_ref().unwrap();
    let sel = sspec.selector.clone().unwrap();
    assert!(!sel.is_empty() && sel.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
    let port_names: BTreeSet<String> = c
        .ports
        .iter()
        .flatten()
        .filter_map(|p| p.name.clone())
        .collect();
    for port in sspec.ports.iter().flatten() {
        match &port.target_port {
            Some(IntOrString::String(name)) => assert!(port_names.contains(name), "{set}"),
            other => panic!("{set}: Service targets ports by name, not {other:?}"),
        }
    }
    for pdb in &r.pdbs {
        let spec = pdb.spec.as_ref().unwrap();
        assert!(
            selector_matches(spec.selector.as_ref().unwrap(), &pod_labels),
            "{set}"
        );
        assert!(
            spec.min_available.is_none(),
            "{set}: maxUnavailable works at any scale"
        );
    }
    for np in &r.network_policies {
        let spec = np.spec.as_ref().unwrap();
        assert!(
            selector_matches(spec.pod_selector.as_ref().unwrap(), &pod_labels),
            "{set}"
        );
        for rule in spec.ingress.iter().flatten() {
            for port in rule.ports.iter().flatten() {
                match &port.port {
                    Some(IntOrString::String(name)) => assert!(port_names.contains(name)),
                    // A numbered port only as the start of the kubelet port range (endPort
                    // cannot go with a named port).
                    Some(IntOrString::Int(number)) => {
                        assert_eq!(*number, r.container_port("kubelet"), "{set}");
                        assert!(port.end_port.is_some(), "{set}: a range");
                    }
                    None => panic!("{set}: NetworkPolicy rules name their ports"),
                }
            }
        }
    }
    let service_labels = service.metadata.labels.clone().unwrap_or_default();
    let service_ports: BTreeSet<String> = sspec
        .ports
        .iter()
        .flatten()
        .filter_map(|p| p.name.clone())
        .collect();
    for sm in &r.service_monitors {
        assert!(
            selector_matches(&sm.spec.selector, &service_labels),
            "{set}"
        );
        for ep in &sm.spec.endpoints {
            assert!(service_ports.contains(&ep.port), "{set}: {}", ep.port);
        }
        check_monitor_namespace(&sm.metadata, sm.spec.namespace_selector.as_ref(), set);
    }
    // Monitoring: a PodMonitor selects the pods and scrapes a port they name; never both
    // monitors (every pod would be scraped twice); every object lands in the release namespace
    // or says where.
    assert!(
        r.service_monitors.is_empty() || r.pod_monitors.is_empty(),
        "{set}: a ServiceMonitor and a PodMonitor"
    );
    for pm in &r.pod_monitors {
        assert!(
            selector_matches(&pm.spec.selector, &r.pod_labels()),
            "{set}"
        );
        for ep in &pm.spec.pod_metrics_endpoints {
            assert_eq!(
                r.container_port(&ep.port),
                r.container_port("metrics"),
                "{set}"
            );
        }
        check_monitor_namespace(&pm.metadata, pm.spec.namespace_selector.as_ref(), set);
    }
    for rule in &r.prometheus_rules {
        assert!(rule.alerts().count() > 0, "{set}: an empty PrometheusRule");
        for alert in rule.alerts() {
            assert!(
                alert.labels.contains_key("severity"),
                "{set}: {}",
                alert.alert
            );
            // Only this install's series: the namespace label its monitor gives them.
            assert!(
                alert.expr.contains(&format!("namespace=\"{NAMESPACE}\"")),
                "{set}: {}: {}",
                alert.alert,
                alert.expr
            );
            for key in ["summary", "description", "runbook_url"] {
                assert!(
                    alert.annotations.get(key).is_some_and(|v| !v.is_empty()),
                    "{set}: {} has no {key}",
                    alert.alert
                );
            }
        }
    }
    for cm in &r.config_maps {
        for (key, json) in cm.data.iter().flatten() {
            assert!(key.ends_with(".json"), "{set}: {key}");
            let dashboard: Value = serde_json::from_str(json)
                .unwrap_or_else(|e| panic!("{set}: {key} is not JSON: {e}"));
            assert!(
                dashboard["panels"]
                    .as_array()
                    .is_some_and(|p| !p.is_empty())
            );
        }
    }

    // RBAC: nothing wildcard, no Secrets cluster-wide, every binding resolves.
    let rules = r
        .cluster_roles
        .iter()
        .flat_map(|cr| cr.rules.iter().flatten())
        .chain(r.roles.iter().flat_map(|role| role.rules.iter().flatten()));
    for rule in rules {
        let words = rule
            .api_groups
            .iter()
            .flatten()
            .chain(rule.resources.iter().flatten())
            .chain(rule.verbs.iter())
            .chain(rule.resource_names.iter().flatten());
        for w in words {
            assert!(!w.contains('*'), "{set}: wildcard in {rule:?}");
        }
    }
    // Cluster-wide, a Secret is only ever read by name, and only to run the pods that name it.
    let pod_sync = r.env_value("LEAF_POD_SYNC") != Some("false");
    for cr in &r.cluster_roles {
        for rule in cr.rules.iter().flatten() {
            if rule.resources.iter().flatten().any(|res| res == "secrets") {
                assert!(
                    pod_sync && rule.verbs == ["get"],
                    "{set}: no cluster-wide Secret access but get with podSync: {rule:?}"
                );
            }
        }
    }
    // RBAC (unless rbac.create=false) is bound to the ServiceAccount the pods run as, and to
    // nothing else.
    if r.has_rbac() {
        let sa = r.service_account_name();
        for subject in r.binding_subjects() {
            assert_eq!(
                (
                    subject.kind.as_str(),
                    subject.name.as_str(),
                    subject.namespace.as_deref()
                ),
                ("ServiceAccount", sa.as_str(), Some(NAMESPACE)),
                "{set}"
            );
        }
        assert!(!r.permissions().is_empty(), "{set}");
    }
    // With leader election, relaylet finds its peers by the Deployment's own selector (a
    // replica Lease counts only for a Running pod it selects), which selects its pods; a
    // single replica is told none (relaylet refuses one it cannot use).
    let selector = r.env_value("REPLICA_SELECTOR");
    if r.env_value("LEADER_ELECT") == Some("true") {
        let selector = relaylet::config::ReplicaSelector::parse(selector.unwrap_or_default())
            .unwrap_or_else(|e| panic!("{set}: REPLICA_SELECTOR: {e}"));
        let deployment_selector = r.deployment().spec.as_ref().unwrap().selector.clone();
        assert_eq!(
            Some(selector.0.clone()),
            deployment_selector.match_labels,
            "{set}: REPLICA_SELECTOR is the Deployment's selector"
        );
        assert!(
            selector
                .0
                .iter()
                .all(|(k, v)| r.pod_labels().get(k) == Some(v)),
            "{set}: REPLICA_SELECTOR selects the chart's pods"
        );
    } else {
        assert_eq!(
            selector, None,
            "{set}: no REPLICA_SELECTOR without election"
        );
    }
}

#[test]
fn every_value_set_lints_and_renders_into_exact_typed_objects() {
    for set in value_sets() {
        lint(&set).unwrap_or_else(|e| panic!("helm lint ({}): {e}", set.name));
        let r = Rendered::render(&set);
        check_invariants(&r, set.name);
    }
}

/// The LeafCluster CRD (the row per leaf) holds exactly the status relaylet writes
/// (`model::leaf_row::LeafStatus`): every field in the schema, every printer column on one of
/// them; `crds.install=false` renders none, `crds.keep=false` lets `helm uninstall` delete it.
#[test]
fn the_leafcluster_crd_describes_the_status_relaylet_writes() {
    use relaylet::model::leaf_row::{self, LeafStatus};
    let r = Rendered::render(&ValueSet::defaults());
    assert_eq!(r.crds.len(), 1, "one CRD by default");
    let crd = &r.crds[0];
    assert_eq!(crd.spec.group, leaf_row::GROUP);
    assert_eq!(crd.spec.names.kind, leaf_row::KIND);
    assert_eq!(crd.spec.names.plural, leaf_row::PLURAL);
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some(format!("{}.{}", leaf_row::PLURAL, leaf_row::GROUP).as_str())
    );
    assert_eq!(
        crd.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("helm.sh/resource-policy"))
            .map(String::as_str),
        Some("keep")
    );
    let version = &crd.spec.versions[0];
    assert_eq!(version.name, leaf_row::VERSION);
    let schema = version
        .schema
        .as_ref()
        .unwrap()
        .open_api_v3_schema
        .as_ref()
        .unwrap();
    let status = &schema.properties.as_ref().unwrap()["status"];
    let in_schema: BTreeSet<String> = status
        .properties
        .as_ref()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    let full = LeafStatus {
        ready: "True".into(),
        reason: "LeafReady".into(),
        message: "m".into(),
        leaf: Some("a".into()),
        version: Some("v1.35.0".into()),
        node: Some("relaylet-a".into()),
        served_by: Some("relaylet-0".into()),
        pods: Some(1),
        credential_expires: Some("2031-01-01T00:00:00Z".into()),
        secret_resource_version: Some("1".into()),
    };
    let written: BTreeSet<String> = serde_json::to_value(&full)
        .unwrap()
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(
        in_schema, written,
        "the CRD's status schema and LeafStatus differ"
    );
    let columns: Vec<(String, String)> = version
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| (c.name.to_uppercase(), c.json_path.clone()))
        .collect();
    let names: Vec<&str> = columns.iter().map(|(n, _)| n.as_str()).collect();
    // The columns issue 58 asks for, in its order.
    assert_eq!(
        names,
        [
            "READY",
            "REASON",
            "VERSION",
            "NODE",
            "SERVED-BY",
            "PODS",
            "CREDENTIAL-EXPIRES",
            "AGE",
            "MESSAGE"
        ]
    );
    for (name, path) in &columns {
        let field = path.strip_prefix(".status.");
        assert!(
            path == ".metadata.creationTimestamp" || field.is_some_and(|f| written.contains(f)),
            "column {name} reads {path}, which relaylet never writes"
        );
    }
    let none = Rendered::render(&ValueSet::defaults().with(&["--set", "crds.install=false"]));
    assert!(none.crds.is_empty());
    let loose = Rendered::render(&ValueSet::defaults().with(&["--set", "crds.keep=false"]));
    assert!(loose.crds[0].metadata.annotations.is_none());
}

#[test]
fn defaults_are_ha_and_grant_exactly_what_relaylet_calls() {
    let r = Rendered::render(&ValueSet::defaults());
    // Monitoring is opt-in: nothing that needs the Prometheus operator or Grafana.
    assert!(r.service_monitors.is_empty() && r.pod_monitors.is_empty());
    assert!(r.prometheus_rules.is_empty() && r.config_maps.is_empty());
    let spec = r.deployment().spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(2));
    let rolling = spec
        .strategy
        .as_ref()
        .unwrap()
        .rolling_update
        .as_ref()
        .unwrap();
    assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(0)));
    let anti = r
        .pod()
        .affinity
        .as_ref()
        .unwrap()
        .pod_anti_affinity
        .as_ref()
        .unwrap();
    let preferred = anti
        .preferred_during_scheduling_ignored_during_execution
        .as_ref()
        .unwrap();
    assert_eq!(
        preferred[0].pod_affinity_term.topology_key,
        "kubernetes.io/hostname"
    );
    assert!(selector_matches(
        preferred[0]
            .pod_affinity_term
            .label_selector
            .as_ref()
            .unwrap(),
        &r.pod_labels()
    ));
    assert_eq!(r.pdbs.len(), 1);
    assert_eq!(
        r.pdbs[0].spec.as_ref().unwrap().max_unavailable,
        Some(IntOrString::Int(1))
    );
    assert_eq!(r.env_value("LEADER_ELECT"), Some("true"));
    assert_eq!(r.env_value("LEAF_SPARE_CONNECTION"), Some("true"));
    assert_eq!(r.env_value("EXTEND_WEBSOCKETS_TO_KUBELET"), Some("true"));
    assert_eq!(r.env_value("LEAF_MAX_PODS"), Some("150000"));
    assert_eq!(r.env_value("LEAF_MAX_NODES"), Some("5000"));
    assert_eq!(r.env_value("LEAF_POD_SYNC"), Some("true"));
    assert!(
        r.env("LEAF_POD_ROOT_APISERVER").is_none(),
        "tokens stay the leaf's"
    );
    assert_eq!(r.env_value("LEAF_POD_MATCH"), Some("root-uid"));
    assert!(r.env("LEAF_POD_MARKER").is_none());
    assert_eq!(r.env_value("AUTH_MODE"), Some("webhook"));
    assert_eq!(r.env_value("PREFERRED-ADDRESS-TYPE"), Some("InternalDNS"));
    assert_eq!(r.env_value("NODE_SERVER_PORT"), Some("10250"));
    let node_ports = relaylet::config::DEFAULT_NODE_PORTS.to_string();
    assert_eq!(r.env_value("NODE_PORTS"), Some(node_ports.as_str()));
    // The serving certificate is generated at start and the client CA read from the cluster.
    assert!(r.env("APISERVER_CERT_LOCATION").is_none());
    assert!(r.env("APISERVER_CA_CERT_LOCATION").is_none());
    assert!(r.pod().volumes.is_none());
    assert!(r.certificates.is_empty() && r.service_monitors.is_empty());
    assert!(r.network_policies.is_empty() && r.secrets.is_empty());
    assert_eq!(
        r.permissions(),
        expected_permissions(true, true, true, true, false, NAMESPACE)
    );

    // The escape hatches add nothing by default; the pod is what it always was, plus the
    // priority class of a cluster-critical add-on.
    let pod = r.pod();
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-cluster-critical")
    );
    assert_eq!(pod.containers.len(), 1);
    assert!(pod.init_containers.is_none() && pod.topology_spread_constraints.is_none());
    assert!(pod.host_network.is_none() && pod.dns_policy.is_none());
    assert_eq!(r.service_accounts.len(), 1);
    assert_eq!(r.service_account_name(), RELEASE);
    let psc = pod.security_context.as_ref().unwrap();
    assert_eq!(
        (psc.run_as_user, psc.run_as_group, psc.fs_group),
        (Some(65532), Some(65532), None)
    );
    let c = r.container();
    assert!(c.env_from.is_none() && c.startup_probe.is_none());
    let csc = c.security_context.as_ref().unwrap();
    assert_eq!(csc.run_as_non_root, Some(true));
    assert!(csc.run_as_user.is_none());
    let readiness = c.readiness_probe.as_ref().unwrap();
    assert_eq!(
        (
            readiness.period_seconds,
            readiness.timeout_seconds,
            readiness.failure_threshold
        ),
        (Some(10), Some(3), Some(3))
    );
    let liveness = c.liveness_probe.as_ref().unwrap();
    assert_eq!(
        (
            liveness.initial_delay_seconds,
            liveness.period_seconds,
            liveness.timeout_seconds,
            liveness.failure_threshold
        ),
        (Some(10), Some(20), Some(5), Some(6))
    );
}

#[test]
fn cert_manager_issues_the_mounted_certificate_for_the_service_name() {
    let set = ValueSet::ci("cert-manager");
    let values = set.file_values();
    let r = Rendered::render(&set);
    assert_eq!(r.certificates.len(), 1);
    let cert = &r.certificates[0].spec;
    let volume = r
        .pod()
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "serving-cert")
        .unwrap();
    assert_eq!(
        volume.secret.as_ref().unwrap().secret_name.as_deref(),
        Some(cert.secret_name.as_str())
    );
    assert_eq!(
        r.env_value("APISERVER_CERT_LOCATION"),
        Some("/etc/relaylet/serving/tls.crt")
    );
    assert_eq!(
        r.env_value("APISERVER_KEY_LOCATION"),
        Some("/etc/relaylet/serving/tls.key")
    );
    let service = r.services[0].metadata.name.clone().unwrap();
    assert!(
        cert.dns_names
            .contains(&format!("{service}.{NAMESPACE}.svc"))
    );
    for extra in values["servingCert"]["certManager"]["extraDnsNames"]
        .as_array()
        .unwrap()
    {
        assert!(
            cert.dns_names
                .iter()
                .any(|n| Some(n.as_str()) == extra.as_str())
        );
    }
    assert!(cert.usages.contains(&KeyUsage::ServerAuth));
    let issuer = &values["servingCert"]["certManager"]["issuerRef"];
    assert_eq!(Some(cert.issuer_ref.name.as_str()), issuer["name"].as_str());
    assert_eq!(Some(cert.issuer_ref.kind.as_str()), issuer["kind"].as_str());

    assert_eq!(r.service_monitors.len(), 1);
    let sm_labels = r.service_monitors[0].metadata.labels.clone().unwrap();
    for (k, v) in values["metrics"]["serviceMonitor"]["labels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(sm_labels.get(k).map(String::as_str), v.as_str());
    }
    let sm = &r.service_monitors[0];
    let want = &values["metrics"]["serviceMonitor"];
    assert_eq!(sm.metadata.namespace.as_deref(), want["namespace"].as_str());
    let endpoint = &sm.spec.endpoints[0];
    assert_eq!(endpoint.scheme, Scheme::Http);
    assert_eq!(endpoint.port, "metrics");
    assert_eq!(
        endpoint.scrape_timeout.as_deref(),
        want["scrapeTimeout"].as_str()
    );
    assert_eq!(endpoint.interval, "30s", "the default interval");
    for (field, got) in [
        ("relabelings", &endpoint.relabelings),
        ("metricRelabelings", &endpoint.metric_relabelings),
    ] {
        let given: Vec<RelabelConfig> = serde_json::from_value(want[field].clone()).unwrap();
        assert_eq!(got.as_ref(), Some(&given), "{field}");
    }
    assert!(r.pod_monitors.is_empty());

    let anti = r
        .pod()
        .affinity
        .as_ref()
        .unwrap()
        .pod_anti_affinity
        .as_ref()
        .unwrap();
    assert!(
        anti.required_during_scheduling_ignored_during_execution
            .is_some()
    );
    assert!(
        anti.preferred_during_scheduling_ignored_during_execution
            .is_none()
    );
}

#[test]
fn monitoring_renders_the_pod_monitor_rules_and_dashboard_as_the_values_say() {
    let set = ValueSet::ci("monitoring");
    let values = set.file_values();
    let r = Rendered::render(&set);
    let want = &values["metrics"];

    assert!(r.service_monitors.is_empty());
    assert_eq!(r.pod_monitors.len(), 1);
    let pm = &r.pod_monitors[0];
    assert_eq!(pm.metadata.namespace.as_deref(), Some("monitoring"));
    assert_eq!(
        pm.metadata
            .labels
            .as_ref()
            .unwrap()
            .get("release")
            .map(String::as_str),
        Some("prometheus")
    );
    let endpoint = &pm.spec.pod_metrics_endpoints[0];
    assert_eq!(endpoint.port, "metrics");
    assert_eq!(endpoint.path, "/metrics");
    assert_eq!(
        Some(endpoint.interval.as_str()),
        want["podMonitor"]["interval"].as_str()
    );
    assert_eq!(
        endpoint.scrape_timeout.as_deref(),
        want["podMonitor"]["scrapeTimeout"].as_str()
    );
    for (field, got) in [
        ("relabelings", &endpoint.relabelings),
        ("metricRelabelings", &endpoint.metric_relabelings),
    ] {
        let given: Vec<RelabelConfig> =
            serde_json::from_value(want["podMonitor"][field].clone()).unwrap();
        assert_eq!(got.as_ref(), Some(&given), "{field}");
    }

    assert_eq!(r.prometheus_rules.len(), 1);
    let rule = &r.prometheus_rules[0];
    let tuned = &want["prometheusRule"];
    assert_eq!(rule.metadata.namespace.as_deref(), Some("monitoring"));
    assert_eq!(
        rule.metadata
            .labels
            .as_ref()
            .unwrap()
            .get("release")
            .map(String::as_str),
        Some("prometheus")
    );
    // Turned off, and only that one.
    assert!(rule.alert("RelayletAbsent").is_none());
    assert_eq!(rule.alerts().count(), 12);
    for alert in rule.alerts() {
        assert_eq!(
            alert.labels.get("team").map(String::as_str),
            Some("platform")
        );
        assert!(
            alert.annotations["runbook_url"]
                .starts_with("https://docs.example.com/relaylet/docs/operations.md#"),
            "{}",
            alert.annotations["runbook_url"]
        );
    }
    let leaf = rule.alert("RelayletLeafUnreachable").unwrap();
    assert_eq!(leaf.for_, "10m");
    assert_eq!(leaf.labels["severity"], "critical");
    let sessions = rule.alert("RelayletSessionFailures").unwrap();
    assert_eq!(sessions.for_, "15m");
    assert!(sessions.expr.contains(") > 0.25"), "{}", sessions.expr);
    assert!(sessions.expr.ends_with(">= 5"), "{}", sessions.expr);
    let latency = rule.alert("RelayletUpgradeLatencyHigh").unwrap();
    assert_eq!(
        (latency.for_.as_str(), latency.labels["severity"].as_str()),
        ("30m", "info")
    );
    assert!(
        latency.expr.starts_with("histogram_quantile(0.95,"),
        "{}",
        latency.expr
    );
    assert!(latency.expr.ends_with("> 1.5"), "{}", latency.expr);
    let expiry = rule.alert("RelayletServingCertificateExpiring").unwrap();
    assert!(expiry.expr.ends_with("- time() < 86400"), "{}", expiry.expr);
    // What the values leave alone keeps the defaults.
    let root = rule.alert("RelayletRootUnreachable").unwrap();
    assert_eq!(
        (root.for_.as_str(), root.labels["severity"].as_str()),
        ("5m", "critical")
    );
    assert_eq!(tuned["alerts"]["rootUnreachable"], Value::Null);

    assert_eq!(r.config_maps.len(), 1);
    let cm = &r.config_maps[0];
    let dash = &values["dashboards"];
    assert_eq!(cm.metadata.namespace.as_deref(), Some("monitoring"));
    let labels = cm.metadata.labels.as_ref().unwrap();
    assert_eq!(
        labels.get("grafana_dashboard_relaylet").map(String::as_str),
        Some("yes")
    );
    assert_eq!(labels.get("team").map(String::as_str), Some("platform"));
    assert!(!labels.contains_key("grafana_dashboard"));
    assert_eq!(
        cm.metadata
            .annotations
            .as_ref()
            .unwrap()
            .get("grafana_folder")
            .map(String::as_str),
        dash["annotations"]["grafana_folder"].as_str()
    );
    // The dashboard is the file the chart ships, whole.
    let shipped = std::fs::read_to_string(chart().join("dashboards/relaylet.json")).unwrap();
    assert_eq!(
        cm.data.as_ref().unwrap()["relaylet.json"],
        shipped.trim_end(),
        "the ConfigMap carries charts/relaylet/dashboards/relaylet.json"
    );

    // The defaults: the sidecar's own label, the release namespace.
    let r = Rendered::render(&ValueSet::defaults().with(&["--set", "dashboards.enabled=true"]));
    let cm = &r.config_maps[0];
    assert_eq!(cm.metadata.namespace.as_deref(), Some(NAMESPACE));
    assert_eq!(
        cm.metadata
            .labels
            .as_ref()
            .unwrap()
            .get("grafana_dashboard")
            .map(String::as_str),
        Some("1")
    );
    let r = Rendered::render(&ValueSet::defaults().with(&[
        "--set",
        "metrics.prometheusRule.enabled=true",
        "--set",
        "metrics.podMonitor.enabled=true",
    ]));
    assert_eq!(
        r.prometheus_rules[0].metadata.namespace.as_deref(),
        Some(NAMESPACE)
    );
    assert_eq!(r.prometheus_rules[0].alerts().count(), 13);
    assert_eq!(
        r.pod_monitors[0].metadata.namespace.as_deref(),
        Some(NAMESPACE)
    );
    assert!(r.pod_monitors[0].spec.namespace_selector.is_none());
    assert!(
        r.pod_monitors[0].spec.pod_metrics_endpoints[0]
            .scrape_timeout
            .is_none()
    );

    // Not both monitors: every pod would be scraped twice and every sum doubled.
    let both = ValueSet::defaults().with(&[
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.podMonitor.enabled=true",
    ]);
    let err = template(&both).expect_err("a ServiceMonitor and a PodMonitor rendered");
    assert!(err.contains("enable one, not both"), "{err}");
}

#[test]
fn existing_secrets_x509_and_leaf_clusters_from_values() {
    let set = ValueSet::ci("existing-secret");
    let values = set.file_values();
    let r = Rendered::render(&set);
    let volume = |name: &str| {
        r.pod()
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == name)
            .unwrap_or_else(|| panic!("volume {name}"))
            .clone()
    };
    assert_eq!(
        volume("serving-cert").secret.unwrap().secret_name,
        values["servingCert"]["secret"]["name"]
            .as_str()
            .map(String::from)
    );
    assert!(r.certificates.is_empty());

    // x509: no reviews needed, only the listed certificate names are served; the client CA
    // comes from the given ConfigMap, not kube-system.
    assert_eq!(r.env_value("AUTH_MODE"), Some("x509"));
    assert_eq!(
        r.env_value("X509_ALLOWED_USERS"),
        Some("kube-apiserver-kubelet-client")
    );
    let key = values["auth"]["clientCA"]["key"].as_str().unwrap();
    assert_eq!(
        r.env_value("APISERVER_CA_CERT_LOCATION"),
        Some(format!("/etc/relaylet/client-ca/{key}").as_str())
    );
    assert_eq!(
        volume("client-ca").config_map.unwrap().name,
        values["auth"]["clientCA"]["configMap"].as_str().unwrap()
    );
    let leaf_ns = values["leafSecretNamespace"].as_str().unwrap();
    assert_eq!(r.env_value("LEAF_SECRET_NAMESPACE"), Some(leaf_ns));
    assert_eq!(r.env_value("LEAF_POD_SYNC"), Some("false"));
    assert_eq!(
        r.env_value("LEAF_POD_MATCH"),
        values["leafPods"]["match"].as_str()
    );
    assert_eq!(
        r.env_value("LEAF_POD_MARKER"),
        values["leafPods"]["marker"].as_str()
    );
    assert_eq!(
        r.permissions(),
        expected_permissions(false, false, true, false, false, leaf_ns)
    );

    let port = values["nodeServer"]["port"].as_i64().unwrap();
    assert_eq!(i64::from(r.container_port("kubelet")), port);
    assert_eq!(
        r.env_value("PREFERRED-ADDRESS-TYPE"),
        values["nodeServer"]["preferredAddressType"].as_str()
    );
    assert!(
        r.container()
            .image
            .as_deref()
            .unwrap()
            .ends_with(values["image"]["digest"].as_str().unwrap())
    );

    // One labelled Secret per leaf, holding exactly the kubeconfig given.
    let leaves = values["leafClusters"].as_array().unwrap();
    assert_eq!(r.secrets.len(), leaves.len());
    for leaf in leaves {
        let name = leaf["name"].as_str().unwrap();
        let secret = r
            .secrets
            .iter()
            .find(|s| {
                s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("relaylet.io/leaf-cluster"))
                    .map(String::as_str)
                    == Some(name)
            })
            .unwrap_or_else(|| panic!("Secret for leaf {name}"));
        assert_eq!(secret.metadata.namespace.as_deref(), Some(leaf_ns));
        let data = secret.data.as_ref().unwrap();
        assert_eq!(
            data["kubeconfig"].0,
            leaf["kubeconfig"].as_str().unwrap().as_bytes()
        );
        let annotations = secret.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            annotations.get("relaylet.io/node-name").map(String::as_str),
            leaf["nodeName"].as_str()
        );
        assert_eq!(
            annotations
                .get("relaylet.io/node-taints")
                .map(String::as_str),
            leaf["nodeTaints"].as_str()
        );
        match leaf["namespaceMap"].as_object() {
            Some(map) => {
                let mut got: Vec<&str> = annotations["relaylet.io/namespace-map"]
                    .split(',')
                    .collect();
                got.sort();
                let mut want: Vec<String> = map
                    .iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap()))
                    .collect();
                want.sort();
                assert_eq!(got, want);
                // And relaylet reads it as the map it is.
                let parsed = relaylet::model::counterpart::NamespaceMap::parse(
                    &annotations["relaylet.io/namespace-map"],
                )
                .unwrap();
                for (root, leaf_ns) in map {
                    assert_eq!(parsed.leaf_namespace(root), leaf_ns.as_str());
                }
            }
            None => assert!(!annotations.contains_key("relaylet.io/namespace-map")),
        }
        match leaf["nodeLabels"].as_object() {
            Some(labels) => {
                let mut got: Vec<String> = annotations["relaylet.io/node-labels"]
                    .split(',')
                    .map(String::from)
                    .collect();
                let mut want: Vec<String> = labels
                    .iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap()))
                    .collect();
                got.sort();
                want.sort();
                assert_eq!(got, want);
            }
            None => assert!(!annotations.contains_key("relaylet.io/node-labels")),
        }
    }
}

#[test]
fn leaf_bounds_are_positive_counts() {
    for flags in [
        ["--set", "leafBounds.maxPods=0"],
        ["--set", "leafBounds.maxNodes=-1"],
        ["--set", "leafBounds.maxNodes=many"],
        ["--set", "leafBounds.maxPod=10"],
    ] {
        let set = ValueSet::defaults().with(&flags);
        let err = template(&set).expect_err(&format!("helm template accepted {flags:?}"));
        assert!(err.contains("/leafBounds"), "{flags:?}: {err}");
    }
}

#[test]
fn network_policy_opens_the_kubelet_port_to_the_control_plane_only() {
    let set = ValueSet::ci("network-policy");
    let values = set.file_values();
    let r = Rendered::render(&set);
    assert_eq!(r.env_value("LEAF_SPARE_CONNECTION"), Some("false"));
    assert_eq!(r.env_value("EXTEND_WEBSOCKETS_TO_KUBELET"), Some("false"));
    assert_eq!(r.env_value("LEAF_MAX_PODS"), Some("20000"));
    assert_eq!(r.env_value("LEAF_MAX_NODES"), Some("100"));
    assert_eq!(r.env_value("STREAM_IDLE_TIMEOUT"), Some("1h30m"));
    assert_eq!(r.network_policies.len(), 1);
    let spec = r.network_policies[0].spec.as_ref().unwrap();
    assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
    let rules = spec.ingress.as_ref().unwrap();
    let rule_for = |port: IntOrString| {
        rules
            .iter()
            .find(|rule| {
                rule.ports
                    .iter()
                    .flatten()
                    .any(|p| p.port == Some(port.clone()))
            })
            .unwrap_or_else(|| panic!("a rule for port {port:?}"))
    };
    // The kubelet port and the per-virtual-node ports above it, as one range.
    let kubelet_port = r.container_port("kubelet");
    let kubelet = rule_for(IntOrString::Int(kubelet_port));
    let ports = kubelet.ports.as_ref().unwrap();
    assert_eq!(ports.len(), 1, "only the kubelet ports");
    // As many as relaylet searches for a node's own port: the same value (2,000 in this set).
    assert_eq!(r.env_value("NODE_PORTS"), Some("2000"));
    assert_eq!(ports[0].end_port, Some(kubelet_port + 2000));
    let from = kubelet
        .from
        .as_ref()
        .expect("kubelet port never open to all");
    let cidrs: Vec<&str> = from
        .iter()
        .filter_map(|p| p.ip_block.as_ref())
        .map(|b| b.cidr.as_str())
        .collect();
    let want: Vec<&str> = values["networkPolicy"]["controlPlaneCIDRs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(cidrs, want);
    let extra = values["networkPolicy"]["extraKubeletFrom"]
        .as_array()
        .unwrap();
    assert_eq!(from.len(), want.len() + extra.len());
    for peer in extra {
        assert!(
            from.iter()
                .any(|p| serde_json::to_value(p).unwrap() == *peer)
        );
    }
    let metrics = rule_for(IntOrString::String("metrics".to_string()));
    let metrics_from: Vec<Value> = metrics
        .from
        .iter()
        .flatten()
        .map(|p| serde_json::to_value(p).unwrap())
        .collect();
    assert_eq!(
        metrics_from,
        *values["networkPolicy"]["metricsFrom"].as_array().unwrap()
    );
    assert_eq!(
        r.deployment().spec.as_ref().unwrap().replicas,
        values["replicaCount"].as_i64().map(|n| n as i32)
    );
}

#[test]
fn a_single_replica_has_no_election_and_no_disruption_budget() {
    let r = Rendered::render(&ValueSet::ci("single-replica"));
    assert_eq!(r.deployment().spec.as_ref().unwrap().replicas, Some(1));
    assert_eq!(r.env_value("LEADER_ELECT"), Some("false"));
    assert!(r.pdbs.is_empty());
    assert_eq!(
        r.env_value("LEAF_POD_ROOT_APISERVER"),
        Some("https://203.0.113.10:6443")
    );
    assert_eq!(
        r.permissions(),
        expected_permissions(true, true, false, true, true, NAMESPACE)
    );
}

/// OpenShift's restricted-v2 SCC assigns the UID, GID and fsGroup: the value set removes the
/// chart's, and everything else the SCC asks for stays.
#[test]
fn the_openshift_set_leaves_the_user_to_the_platform_and_keeps_the_rest() {
    let set = ValueSet::ci("openshift");
    let yaml = template(&set).unwrap();
    for field in ["runAsUser", "runAsGroup", "fsGroup"] {
        assert!(!yaml.contains(field), "{field} rendered:\n{yaml}");
    }
    let r = Rendered::parse(&yaml);
    let psc = r.pod().security_context.as_ref().unwrap();
    assert_eq!(
        (psc.run_as_user, psc.run_as_group, psc.fs_group),
        (None, None, None)
    );
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(
        psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
        Some("RuntimeDefault")
    );
    let csc = r.container().security_context.as_ref().unwrap();
    assert_eq!(csc.run_as_non_root, Some(true));
    assert!(csc.run_as_user.is_none() && csc.run_as_group.is_none());
    assert_eq!(csc.read_only_root_filesystem, Some(true));
    assert_eq!(csc.allow_privilege_escalation, Some(false));
    assert_eq!(
        csc.capabilities.as_ref().and_then(|c| c.drop.clone()),
        Some(vec!["ALL".to_string()])
    );
}

/// The sidecar set: a konnectivity server beside relaylet with its Secret mounted, an init
/// container, extra env and envFrom, a volume both containers mount, tuned probes and a startup
/// probe, spread constraints, and `global` from a parent chart.
#[test]
fn extra_containers_volumes_env_probes_and_spread_render_as_given() {
    let set = ValueSet::ci("sidecar");
    let values = set.file_values();
    let r = Rendered::render(&set);
    let pod = r.pod();
    // The extra containers come after relaylet's, exactly as given, with their mounts.
    assert_eq!(pod.containers.len(), 2);
    let sidecar = serde_json::to_value(&pod.containers[1]).unwrap();
    assert_eq!(sidecar, values["extraContainers"][0]);
    let sidecar_mounts: Vec<&str> = pod.containers[1]
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.name.as_str())
        .collect();
    assert_eq!(sidecar_mounts, ["konnectivity-certs", "konnectivity-run"]);
    let init = serde_json::to_value(pod.init_containers.as_ref().unwrap()).unwrap();
    assert_eq!(init, values["initContainers"]);
    // The extra volumes after the chart's (none here), as given.
    let volumes = serde_json::to_value(pod.volumes.as_ref().unwrap()).unwrap();
    assert_eq!(volumes, values["extraVolumes"]);
    // relaylet's own mount of one of them, and its read-only root stays.
    let c = r.container();
    let mounts = serde_json::to_value(c.volume_mounts.as_ref().unwrap()).unwrap();
    assert_eq!(mounts, values["extraVolumeMounts"]);
    assert_eq!(
        c.security_context
            .as_ref()
            .unwrap()
            .read_only_root_filesystem,
        Some(true)
    );
    // extraEnv after the chart's env, envFrom as given.
    let env = c.env.as_ref().unwrap();
    let extra = values["extraEnv"].as_array().unwrap();
    let tail = serde_json::to_value(&env[env.len() - extra.len()..]).unwrap();
    assert_eq!(tail, values["extraEnv"]);
    assert_eq!(
        r.env_value("LEAF_SECRET_LABEL"),
        Some("example.com/relaylet-leaf")
    );
    assert_eq!(
        serde_json::to_value(c.env_from.as_ref().unwrap()).unwrap(),
        values["extraEnvFrom"]
    );
    // Probe timing from the values; what they ask stays the chart's (check_invariants).
    let timing = |probe: &k8s_openapi::api::core::v1::Probe| {
        let mut v = serde_json::to_value(probe).unwrap();
        v.as_object_mut().unwrap().remove("httpGet");
        v
    };
    assert_eq!(
        timing(c.readiness_probe.as_ref().unwrap()),
        values["readinessProbe"]
    );
    assert_eq!(
        timing(c.liveness_probe.as_ref().unwrap()),
        values["livenessProbe"]
    );
    let mut startup = values["startupProbe"].clone();
    startup.as_object_mut().unwrap().remove("enabled");
    // timeoutSeconds comes from the chart's default.
    startup["timeoutSeconds"] = 3.into();
    assert_eq!(timing(c.startup_probe.as_ref().unwrap()), startup);
    // A spread constraint without a selector selects the chart's pods; one with a selector
    // keeps it.
    let spread = pod.topology_spread_constraints.as_ref().unwrap();
    assert_eq!(spread.len(), 2);
    assert_eq!(spread[0].topology_key, "topology.kubernetes.io/zone");
    assert!(selector_matches(
        spread[0].label_selector.as_ref().unwrap(),
        &r.pod_labels()
    ));
    assert_eq!(
        spread[0].label_selector.as_ref().unwrap().match_labels,
        r.deployment().spec.as_ref().unwrap().selector.match_labels
    );
    assert_eq!(
        serde_json::to_value(&spread[1]).unwrap(),
        values["topologySpreadConstraints"][1]
    );
    // The workload identity annotation on the ServiceAccount.
    assert_eq!(
        r.service_accounts[0]
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("iam.gke.io/gcp-service-account"))
            .map(String::as_str),
        values["serviceAccount"]["annotations"]["iam.gke.io/gcp-service-account"].as_str()
    );
}

/// extraEnv cannot override what the chart sets from its (schema-checked) values: AUTH_MODE
/// through extraEnv would otherwise turn authentication off, which the chart never allows.
#[test]
fn extra_env_may_not_replace_the_charts_own() {
    for name in ["AUTH_MODE", "LEAF_NODE_IP", "NODE_SERVER_PORT", "RUST_LOG"] {
        let set = ValueSet::defaults().with(&[
            "--set",
            &format!("extraEnv[0].name={name}"),
            "--set",
            "extraEnv[0].value=x",
        ]);
        let err = template(&set).expect_err(&format!("extraEnv {name} accepted"));
        assert!(
            err.contains(&format!("extraEnv: {name} is set by the chart")),
            "{name}: {err}"
        );
    }
    // A variable the chart does not set is fine.
    let r = Rendered::render(&ValueSet::defaults().with(&[
        "--set",
        "extraEnv[0].name=RUST_BACKTRACE",
        "--set-string",
        "extraEnv[0].value=1",
    ]));
    assert_eq!(r.env_value("RUST_BACKTRACE"), Some("1"));
}

/// serviceAccount.create=false: no ServiceAccount, the pods and every binding name the given
/// one; rbac.create=false: no RBAC object at all, the pods still run as the account.
#[test]
fn an_existing_service_account_and_no_rbac() {
    let set = ValueSet::ci("external-identity");
    let values = set.file_values();
    let given = values["serviceAccount"]["name"].as_str().unwrap();
    let r = Rendered::render(&set);
    assert!(r.service_accounts.is_empty(), "no ServiceAccount made");
    assert_eq!(r.service_account_name(), given);
    // The same grants as the defaults, to the given account (permissions() follows the pod's).
    assert_eq!(
        r.permissions(),
        expected_permissions(true, true, true, true, false, NAMESPACE)
    );
    let subjects: BTreeSet<&str> = r.binding_subjects().map(|s| s.name.as_str()).collect();
    assert_eq!(subjects, BTreeSet::from([given]));
    assert!(
        r.pod().priority_class_name.is_none(),
        "priorityClassName \"\""
    );

    for r in [
        Rendered::render(&set.clone().with(&["--set", "rbac.create=false"])),
        Rendered::render(&ValueSet::defaults().with(&["--set", "rbac.create=false"])),
    ] {
        assert!(!r.has_rbac(), "rbac.create=false renders no RBAC");
        assert!(r.permissions().is_empty());
        check_invariants(&r, "rbac.create=false");
    }
    let r = Rendered::render(&set.with(&["--set", "rbac.create=false"]));
    assert!(r.service_accounts.is_empty());
    assert_eq!(r.service_account_name(), given);
    // Without creating it, the default name is the release's full name.
    let r = Rendered::render(&ValueSet::defaults().with(&["--set", "serviceAccount.create=false"]));
    assert!(r.service_accounts.is_empty());
    assert_eq!(r.service_account_name(), RELEASE);
    assert!(r.has_rbac());
    // A name given while creating names the ServiceAccount made.
    let r = Rendered::render(&ValueSet::defaults().with(&["--set", "serviceAccount.name=vk"]));
    assert_eq!(r.service_accounts[0].metadata.name.as_deref(), Some("vk"));
    assert_eq!(r.service_account_name(), "vk");
    check_invariants(&r, "serviceAccount.name=vk");
}

/// hostNetwork: the node's network and DNS policy, ports declared as host ports and moved off
/// the node's kubelet, the NetworkPolicy on those ports; ports that would collide are refused.
#[test]
fn host_network_moves_relaylet_onto_the_nodes_ports() {
    let set = ValueSet::ci("host-network");
    let values = set.file_values();
    let r = Rendered::render(&set);
    let pod = r.pod();
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.dns_policy.as_deref(), Some("ClusterFirstWithHostNet"));
    // relaylet learns its address from status.podIP, which is the node's IP here.
    assert_eq!(
        r.env("LEAF_NODE_IP")
            .and_then(|e| e.value_from.as_ref())
            .and_then(|f| f.field_ref.as_ref())
            .map(|f| f.field_path.as_str()),
        Some("status.podIP")
    );
    let port = values["nodeServer"]["port"].as_i64().unwrap() as i32;
    let node_ports = values["nodeServer"]["nodePorts"].as_i64().unwrap() as i32;
    assert_eq!(r.container_port("kubelet"), port);
    assert_eq!(
        r.env_value("NODE_SERVER_PORT"),
        Some(port.to_string().as_str())
    );
    let metrics = values["metrics"]["port"].as_i64().unwrap() as i32;
    assert_eq!(r.container_port("metrics"), metrics);
    assert_eq!(
        r.env_value("METRICS_ADDR"),
        Some(format!("0.0.0.0:{metrics}").as_str())
    );
    for p in r.container().ports.iter().flatten() {
        assert_eq!(p.host_port, Some(p.container_port));
    }
    // The NetworkPolicy follows the ports.
    let np = r.network_policies[0].spec.as_ref().unwrap();
    let kubelet_rule = np
        .ingress
        .iter()
        .flatten()
        .flat_map(|rule| rule.ports.iter().flatten())
        .find(|p| p.port == Some(IntOrString::Int(port)))
        .expect("a rule for the kubelet ports");
    assert_eq!(kubelet_rule.end_port, Some(port + node_ports));
    let text = notes(&set);
    assert!(
        text.contains(&format!("kubelet ports {port}-{}", port + node_ports)),
        "{text}"
    );

    // Collisions with the node's own ports, or between relaylet's, never render.
    for (flags, says) in [
        (&["--set", "hostNetwork=true"][..], "overlap 10248-10259"),
        (
            &[
                "--set",
                "hostNetwork=true",
                "--set",
                "nodeServer.port=9000",
                "--set",
                "nodeServer.nodePorts=1248",
            ][..],
            "overlap 10248-10259",
        ),
        (
            &[
                "--set",
                "hostNetwork=true",
                "--set",
                "nodeServer.port=10300",
                "--set",
                "metrics.port=10255",
            ][..],
            "metrics.port 10255 is one of the node's own ports",
        ),
        (
            &[
                "--set",
                "hostNetwork=true",
                "--set",
                "nodeServer.port=10300",
                "--set",
                "metrics.port=10400",
            ][..],
            "metrics.port 10400 is in the kubelet ports 10300-11300",
        ),
    ] {
        let err =
            template(&ValueSet::defaults().with(flags)).expect_err(&format!("rendered {flags:?}"));
        assert!(err.contains(says), "{flags:?}: {err}");
    }
    // The same ports off the host network are the defaults and fine.
    let r = Rendered::render(&ValueSet::defaults().with(&["--set", "hostNetwork=false"]));
    assert!(r.pod().host_network.is_none());
}

/// As a subchart: Helm hands every subchart `global` (helm/helm#10392), which a schema with
/// `additionalProperties: false` at its root must accept.
#[test]
fn the_chart_works_as_a_subchart_with_globals() {
    let dir = Scratch::new("subchart");
    let parent = dir.0.join("platform");
    std::fs::create_dir_all(parent.join("charts")).unwrap();
    std::fs::create_dir_all(parent.join("templates")).unwrap();
    let out = Command::new("cp")
        .arg("-r")
        .arg(chart())
        .arg(parent.join("charts"))
        .output()
        .unwrap();
    assert!(out.status.success());
    std::fs::write(
        parent.join("Chart.yaml"),
        "apiVersion: v2\nname: platform\nversion: 1.0.0\ndependencies:\n  - name: relaylet\n    version: 0.1.0\n",
    )
    .unwrap();
    std::fs::write(
        parent.join("values.yaml"),
        "global:\n  imageRegistry: registry.example.com\nrelaylet:\n  replicaCount: 3\n",
    )
    .unwrap();
    let parent = parent.display().to_string();
    let out = run_helm(&[
        "lint".to_string(),
        "--strict".to_string(),
        "--with-subcharts".to_string(),
        parent.clone(),
        "--namespace".to_string(),
        NAMESPACE.to_string(),
    ]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run_helm(&[
        "template".to_string(),
        RELEASE.to_string(),
        parent,
        "--namespace".to_string(),
        NAMESPACE.to_string(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = Rendered::parse(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(r.deployment().spec.as_ref().unwrap().replicas, Some(3));
    check_invariants(&r, "subchart");
    // Unknown top-level keys are still refused.
    let err = template(&ValueSet::defaults().with(&["--set", "globals.imageRegistry=x"]))
        .expect_err("an unknown top-level key");
    assert!(err.contains("globals"), "{err}");
}

/// The `helm test` hook, when rendered: a hook Pod that runs `relaylet check` as relaylet's own
/// pod runs (ServiceAccount, image, both securityContexts, nodeSelector and tolerations), is
/// selected by none of relaylet's selectors, and passes the values relaylet itself gets, which
/// the binary's own parser reads back.
fn check_test_hook(r: &Rendered, set: &str) {
    let pod = match r.test_pods.as_slice() {
        [] => return,
        [pod] => pod,
        more => panic!("{set}: {} test Pods", more.len()),
    };
    let meta = &pod.metadata;
    let annotations = meta.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get("helm.sh/hook").map(String::as_str),
        Some("test"),
        "{set}"
    );
    assert_eq!(
        annotations
            .get("helm.sh/hook-delete-policy")
            .map(String::as_str),
        Some("before-hook-creation,hook-succeeded"),
        "{set}"
    );
    let labels = meta.labels.clone().unwrap_or_default();
    let deployment_selector = r.deployment().spec.as_ref().unwrap().selector.clone();
    assert!(
        !selector_matches(&deployment_selector, &labels),
        "{set}: the Deployment's selector"
    );
    for pdb in &r.pdbs {
        let selector = pdb.spec.as_ref().unwrap().selector.clone().unwrap();
        assert!(
            !selector_matches(&selector, &labels),
            "{set}: the PDB's selector"
        );
    }
    for policy in &r.network_policies {
        let selector = policy.spec.as_ref().unwrap().pod_selector.clone();
        assert!(
            !selector_matches(&selector.unwrap_or_default(), &labels),
            "{set}: the NetworkPolicy's selector"
        );
    }
    let spec = pod.spec.as_ref().unwrap();
    let main = r.pod();
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"), "{set}");
    assert_eq!(
        spec.service_account_name, main.service_account_name,
        "{set}"
    );
    assert_eq!(spec.automount_service_account_token, Some(true), "{set}");
    assert_eq!(spec.security_context, main.security_context, "{set}");
    assert_eq!(spec.node_selector, main.node_selector, "{set}");
    assert_eq!(spec.tolerations, main.tolerations, "{set}");
    assert_eq!(spec.image_pull_secrets, main.image_pull_secrets, "{set}");
    assert!(
        spec.host_network.is_none() && spec.priority_class_name.is_none(),
        "{set}"
    );
    let [c] = spec.containers.as_slice() else {
        panic!("{set}: one container in the test Pod");
    };
    let relaylet = r.container();
    assert_eq!(c.image, relaylet.image, "{set}");
    assert_eq!(c.image_pull_policy, relaylet.image_pull_policy, "{set}");
    assert_eq!(c.security_context, relaylet.security_context, "{set}");
    assert!(
        c.command.is_none(),
        "{set}: the image's entrypoint, relaylet"
    );
    let resources = c.resources.as_ref().unwrap();
    assert!(
        resources
            .requests
            .as_ref()
            .is_some_and(|r| r.contains_key("cpu")),
        "{set}"
    );
    assert!(
        resources
            .limits
            .as_ref()
            .is_some_and(|l| l.contains_key("memory")),
        "{set}"
    );
    let args = c.args.clone().unwrap_or_default();
    assert_eq!(args.first().map(String::as_str), Some("check"), "{set}");
    let parsed = relaylet::cli::CheckArgs::parse(&args[1..])
        .unwrap_or_else(|e| panic!("{set}: relaylet check refuses the hook's args: {e}"));
    assert_eq!(parsed.namespace.as_deref(), Some(NAMESPACE), "{set}");
    if let Some(replicas) = r.env_value("REPLICA_SELECTOR") {
        assert_eq!(parsed.selector, replicas, "{set}: relaylet's own selector");
    }
    let want_labels: BTreeMap<String, String> = parsed
        .selector
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(Some(want_labels), deployment_selector.match_labels, "{set}");
    assert_eq!(
        parsed.leaf_namespace.as_deref(),
        Some(r.env_value("LEAF_SECRET_NAMESPACE").unwrap_or(NAMESPACE)),
        "{set}"
    );
    assert_eq!(
        parsed.leaf_label,
        r.env_value("LEAF_SECRET_LABEL")
            .unwrap_or("relaylet.io/leaf-cluster"),
        "{set}"
    );
    assert_eq!(
        Some(parsed.node_name_prefix.as_str()),
        r.env_value("NODE_NAME_PREFIX"),
        "{set}"
    );
}

/// `helmTest`: on by default with its timeout and resources, each value rendered; off, no Pod
/// and no Event reading; the leaf label and namespace relaylet watches are the hook's too.
#[test]
fn the_helm_test_hook_follows_its_values_and_relaylets() {
    let r = Rendered::render(&ValueSet::defaults());
    let pod = r.test_pods.first().expect("a test Pod by default");
    assert_eq!(pod.metadata.name.as_deref(), Some("relaylet-test"));
    let c = &pod.spec.as_ref().unwrap().containers[0];
    let args = c.args.clone().unwrap();
    let parsed = relaylet::cli::CheckArgs::parse(&args[1..]).unwrap();
    assert_eq!(parsed.timeout, std::time::Duration::from_secs(120));
    let quantity = |q: &str| k8s_openapi::apimachinery::pkg::api::resource::Quantity(q.into());
    let resources = c.resources.clone().unwrap();
    assert_eq!(
        resources.requests,
        Some(BTreeMap::from([
            ("cpu".into(), quantity("10m")),
            ("memory".into(), quantity("16Mi"))
        ]))
    );
    assert_eq!(
        resources.limits,
        Some(BTreeMap::from([("memory".into(), quantity("64Mi"))]))
    );

    let tuned = Rendered::render(&ValueSet::defaults().with(&[
        "--set",
        "helmTest.timeout=45s",
        "--set",
        "helmTest.resources.requests.cpu=20m",
        "--set",
        "helmTest.resources.limits.memory=48Mi",
        "--set",
        "leafSecretNamespace=leaves",
        "--set",
        "nodeNamePrefix=vk-",
        "--set",
        "nodeSelector.kubernetes\\.io/os=linux",
        "--set",
        "tolerations[0].key=infra",
        "--set",
        "tolerations[0].operator=Exists",
        "--set",
        "image.pullPolicy=Always",
    ]));
    check_invariants(&tuned, "helmTest tuned");
    let c = &tuned.test_pods[0].spec.as_ref().unwrap().containers[0];
    let parsed = relaylet::cli::CheckArgs::parse(&c.args.clone().unwrap()[1..]).unwrap();
    assert_eq!(parsed.timeout, std::time::Duration::from_secs(45));
    assert_eq!(parsed.leaf_namespace.as_deref(), Some("leaves"));
    assert_eq!(parsed.node_name_prefix, "vk-");
    assert_eq!(c.image_pull_policy.as_deref(), Some("Always"));
    let resources = c.resources.clone().unwrap();
    assert_eq!(resources.requests.unwrap()["cpu"], quantity("20m"));
    assert_eq!(resources.limits.unwrap()["memory"], quantity("48Mi"));
    let spec = tuned.test_pods[0].spec.as_ref().unwrap();
    assert_eq!(
        spec.node_selector
            .clone()
            .unwrap()
            .get("kubernetes.io/os")
            .map(String::as_str),
        Some("linux")
    );
    assert_eq!(
        spec.tolerations.clone().unwrap()[0].key.as_deref(),
        Some("infra")
    );
    // The hook reads the LeafCluster rows beside the leaf Secrets, as relaylet's own
    // ServiceAccount (which lists them there anyway).
    assert!(tuned.permissions().contains(&(
        "leaves".to_string(),
        "relaylet.io".to_string(),
        "leafclusters".to_string(),
        String::new(),
        "list".to_string()
    )));

    // The sidecar set watches another label (extraEnv LEAF_SECRET_LABEL): so does the hook.
    let sidecar = Rendered::render(&ValueSet::ci("sidecar"));
    let c = &sidecar.test_pods[0].spec.as_ref().unwrap().containers[0];
    let parsed = relaylet::cli::CheckArgs::parse(&c.args.clone().unwrap()[1..]).unwrap();
    assert_eq!(parsed.leaf_label, "example.com/relaylet-leaf");

    let off = Rendered::render(&ValueSet::defaults().with(&["--set", "helmTest.enabled=false"]));
    assert!(off.test_pods.is_empty());
    assert_eq!(
        off.permissions(),
        expected_permissions(true, true, true, true, false, NAMESPACE),
        "off: the hook asks for no rights of its own"
    );
}

#[test]
fn bad_values_are_refused_by_the_schema() {
    let cases: &[(&[&str], &str)] = &[
        (&["--set", "nodeServer.port=0"], "/nodeServer/port"),
        (&["--set", "nodeServer.port=70000"], "/nodeServer/port"),
        (&["--set", "nodeServer.port=https"], "/nodeServer/port"),
        (&["--set", "nodeServer.prot=10250"], "prot"),
        (
            &["--set", "nodeServer.preferredAddressType=Banana"],
            "preferredAddressType",
        ),
        (&["--set", "auth.mode=none"], "/auth/mode"),
        (&["--set", "auth.mode=x509"], "x509AllowedUsers"),
        (
            &["--set", "networkPolicy.enabled=true"],
            "controlPlaneCIDRs",
        ),
        (&["--set", "servingCert.mode=secret"], "/servingCert"),
        (&["--set", "stream.idleTimeout=4 hours"], "idleTimeout"),
        (
            &["--set", "podSync.rootApiserver=http://10.0.0.1:6443"],
            "rootApiserver",
        ),
        (
            &[
                "--set",
                "leafClusters[0].name=Leaf_A",
                "--set",
                "leafClusters[0].kubeconfig=x",
            ],
            "/leafClusters/0/name",
        ),
        (
            &[
                "--set",
                "auth.clientCA.configMap=a",
                "--set",
                "auth.clientCA.secret=b",
            ],
            "clientCA",
        ),
        // The escape hatches are checked too.
        (
            &["--set", "serviceAccount.create=maybe"],
            "/serviceAccount/create",
        ),
        (
            &["--set", "serviceAccount.name=Relay_Let"],
            "/serviceAccount/name",
        ),
        (&["--set", "serviceAccount.nmae=x"], "nmae"),
        (&["--set", "rbac.create=yes"], "/rbac/create"),
        (&["--set", "rbac.enabled=false"], "enabled"),
        (&["--set", "hostNetwork=yes"], "/hostNetwork"),
        // Monitoring.
        (
            &["--set", "metrics.podMonitor.scrapeTimeout=10 seconds"],
            "/metrics/podMonitor/scrapeTimeout",
        ),
        (
            &["--set", "metrics.serviceMonitor.interval=1.5m"],
            "/metrics/serviceMonitor/interval",
        ),
        (
            &[
                "--set",
                "metrics.serviceMonitor.relabelings[0].action=rename",
            ],
            "/metrics/serviceMonitor/relabelings/0/action",
        ),
        (
            &["--set", "metrics.podMonitor.namespace=Monitoring"],
            "/metrics/podMonitor/namespace",
        ),
        (
            &[
                "--set",
                "metrics.prometheusRule.alerts.leafUnreachable.for=5 minutes",
            ],
            "/metrics/prometheusRule/alerts/leafUnreachable/for",
        ),
        (
            &[
                "--set",
                "metrics.prometheusRule.alerts.sessionFailures.ratio=2",
            ],
            "/metrics/prometheusRule/alerts/sessionFailures/ratio",
        ),
        (
            &[
                "--set",
                "metrics.prometheusRule.alerts.upgradeLatency.quantile=1",
            ],
            "/metrics/prometheusRule/alerts/upgradeLatency/quantile",
        ),
        (
            &[
                "--set",
                "metrics.prometheusRule.alerts.leaderNotOne.threshold=2",
            ],
            "threshold",
        ),
        (
            &["--set", "metrics.prometheusRule.alertLabels.severity=page"],
            "invalid propertyName 'severity'",
        ),
        (
            &["--set", "metrics.prometheusRule.docsUrl=docs/operations.md"],
            "/metrics/prometheusRule/docsUrl",
        ),
        (
            &["--set", "dashboards.labelValue=not one"],
            "/dashboards/labelValue",
        ),
        (&["--set", "dashboards.folder=x"], "folder"),
        (
            &["--set", "priorityClassName=Critical_Pods"],
            "/priorityClassName",
        ),
        (
            &["--set", "podSecurityContext.runAsUser=-1"],
            "/podSecurityContext/runAsUser",
        ),
        (&["--set", "podSecurityContext.runAsUsr=1000"], "runAsUsr"),
        (
            &["--set", "securityContext.capabilities.drop=ALL"],
            "/securityContext/capabilities/drop",
        ),
        (
            &["--set", "securityContext.readOnlyRootFs=true"],
            "readOnlyRootFs",
        ),
        (
            &["--set", "livenessProbe.periodSeconds=0"],
            "/livenessProbe/periodSeconds",
        ),
        // A liveness probe's successThreshold must be 1; the handler is the chart's.
        (
            &["--set", "livenessProbe.successThreshold=2"],
            "successThreshold",
        ),
        (&["--set", "readinessProbe.httpGet.path=/x"], "httpGet"),
        (
            &["--set", "startupProbe.enabled=on"],
            "/startupProbe/enabled",
        ),
        (&["--set", "startupProbe.exec.command={true}"], "exec"),
        (
            &["--set", "topologySpreadConstraints[0].maxSkew=1"],
            "topologyKey",
        ),
        (
            &[
                "--set",
                "topologySpreadConstraints[0].maxSkew=1",
                "--set",
                "topologySpreadConstraints[0].topologyKey=zone",
                "--set",
                "topologySpreadConstraints[0].whenUnsatisfiable=Sometimes",
            ],
            "whenUnsatisfiable",
        ),
        (&["--set", "extraEnv[0].value=x"], "/extraEnv/0"),
        (
            &[
                "--set",
                "extraEnv[0].name=A",
                "--set",
                "extraEnv[0].value=1",
            ],
            "/extraEnv/0/value",
        ),
        (&["--set", "extraEnvFrom[0]=x"], "/extraEnvFrom/0"),
        (
            &["--set", "extraVolumes[0].emptyDir=null"],
            "/extraVolumes/0",
        ),
        (&["--set", "extraVolumeMounts[0].name=data"], "mountPath"),
        (
            &[
                "--set",
                "extraVolumeMounts[0].name=data",
                "--set",
                "extraVolumeMounts[0].mountPath=data",
            ],
            "/extraVolumeMounts/0/mountPath",
        ),
        (&["--set", "extraContainers[0].name=sidecar"], "image"),
        (
            &[
                "--set",
                "initContainers[0].name=Init_1",
                "--set",
                "initContainers[0].image=busybox",
            ],
            "/initContainers/0/name",
        ),
        (&["--set", "global=shared"], "/global"),
        (&["--set", "helmTest.timeout=soon"], "/helmTest/timeout"),
        (&["--set", "helmTest.image=busybox"], "image"),
        (&["--set", "helmTest.enabled=yes"], "/helmTest/enabled"),
    ];
    for (flags, mentions) in cases {
        let set = ValueSet::defaults().with(flags);
        let err = template(&set).expect_err(&format!("helm template accepted {flags:?}"));
        assert!(err.contains(mentions), "{flags:?}: {err}");
        let err = lint(&set).expect_err(&format!("helm lint accepted {flags:?}"));
        assert!(err.contains(mentions), "{flags:?}: {err}");
    }
}

/// Runs the real binary's `check-config` with exactly the container's environment, the
/// downward API fields resolved as the kubelet would resolve them.
fn check_config(r: &Rendered, pod_ip: &str) -> Output {
    let c = r.container();
    assert_eq!(
        c.args.as_deref(),
        Some(["serve".to_string()].as_slice()),
        "the container runs `relaylet serve`"
    );
    assert!(c.command.is_none(), "the image's entrypoint is relaylet");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_relaylet"));
    cmd.arg("check-config").env_clear();
    for var in c.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            (Some(v), None) => v.clone(),
            (None, Some(from)) => {
                let path = &from.field_ref.as_ref().expect("only fieldRefs").field_path;
                match path.as_str() {
                    "status.podIP" => pod_ip.to_string(),
                    "metadata.name" => "relaylet-5d8f9c7b6-x2x7q".to_string(),
                    "metadata.namespace" => NAMESPACE.to_string(),
                    other => panic!("unexpected downward API field {other}"),
                }
            }
            other => panic!(
                "env {} is neither a value nor a fieldRef: {other:?}",
                var.name
            ),
        };
        cmd.env(&var.name, value);
    }
    cmd.output().expect("running relaylet check-config")
}

#[test]
fn relaylet_accepts_the_environment_every_value_set_renders() {
    for set in value_sets() {
        let r = Rendered::render(&set);
        for pod_ip in ["10.0.0.7", "fd00:10:244::7"] {
            let out = check_config(&r, pod_ip);
            assert!(
                out.status.success(),
                "{} ({pod_ip}): {}",
                set.name,
                String::from_utf8_lossy(&out.stderr)
            );
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(stdout.starts_with("configuration ok"), "{stdout}");
            assert!(stdout.contains(pod_ip), "{stdout}");
        }
    }
}

#[test]
fn relaylet_rejects_bad_values_the_schema_cannot_see_or_was_told_to_skip() {
    // A zero duration matches the schema's pattern; only relaylet knows it is meaningless.
    let r = Rendered::render(&ValueSet::defaults().with(&["--set", "stream.idleTimeout=0s"]));
    let out = check_config(&r, "10.0.0.7");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("STREAM_IDLE_TIMEOUT"), "{stderr}");

    // A bad port rendered with the schema switched off still never starts.
    let r = Rendered::render(&ValueSet::defaults().with(&[
        "--skip-schema-validation",
        "--set",
        "nodeServer.port=70000",
    ]));
    let out = check_config(&r, "10.0.0.7");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("NODE_SERVER_PORT"), "{stderr}");
}

#[test]
fn plain_manifests_are_the_chart_rendered_with_default_values() {
    let out = Command::new("bash")
        .arg(repo().join("deploy/render.sh"))
        .arg("--stdout")
        .env("HELM", helm())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let on_disk = std::fs::read_to_string(repo().join("deploy/relaylet.yaml")).unwrap();
    assert!(
        on_disk == String::from_utf8(out.stdout).unwrap(),
        "deploy/relaylet.yaml is out of date: run deploy/render.sh"
    );
    assert!(
        !on_disk.contains("managed-by: Helm"),
        "plain manifests are not Helm's"
    );
    let r = Rendered::parse(&on_disk);
    check_invariants(&r, "deploy/relaylet.yaml");
}

/// What relaylet calls in a leaf (src/leaf, src/relay, src/virtual_node,
/// src/node_server/resource_metrics, and with pod sync src/pod_sync).
fn leaf_permissions(pod_sync: bool) -> BTreeSet<Grant> {
    let mut want = Vec::new();
    want.extend(grant("*", "", "pods", "", &["get", "list", "watch"]));
    for sub in ["pods/exec", "pods/attach", "pods/portforward"] {
        want.extend(grant("*", "", sub, "", &["get", "create"]));
    }
    want.extend(grant("*", "", "pods/log", "", &["get"]));
    want.extend(grant("*", "", "nodes", "", &["get", "list", "watch"]));
    want.extend(grant("*", "metrics.k8s.io", "pods", "", &["get", "list"]));
    if pod_sync {
        want.extend(grant("*", "", "pods", "", &["create", "patch", "delete"]));
        want.extend(grant("*", "", "pods/ephemeralcontainers", "", &["patch"]));
        want.extend(grant("*", "", "namespaces", "", &["get", "create"]));
        want.extend(grant("*", "", "serviceaccounts", "", &["get", "create"]));
        want.extend(grant("*", "", "events", "", &["list", "watch"]));
        for copied in ["configmaps", "secrets"] {
            want.extend(grant(
                "*",
                "",
                copied,
                "",
                &["get", "list", "create", "patch", "delete"],
            ));
        }
    }
    want.into_iter().collect()
}

#[test]
fn leaf_rbac_grants_exactly_the_calls_relaylet_makes() {
    for (file, pod_sync) in [
        ("deploy/leaf-rbac.yaml", true),
        ("deploy/leaf-rbac-exec-only.yaml", false),
    ] {
        let text = std::fs::read_to_string(repo().join(file)).unwrap();
        check_leaf_rbac(&text, &leaf_permissions(pod_sync), file);
    }
}

/// The one namespaced right of a leaf manifest: relaylet's account may request its own tokens
/// (the renewal of the token in its leaf Secret), nothing else, in its own namespace.
fn check_token_role(r: &Rendered, ns: &str, sa_name: &str, file: &str) {
    let role = r
        .roles
        .iter()
        .find(|role| role.metadata.name.as_deref() == Some("relaylet-leaf-token"))
        .unwrap_or_else(|| panic!("{file}: no Role relaylet-leaf-token"));
    assert_eq!(role.metadata.namespace.as_deref(), Some(ns), "{file}");
    let mut grants = BTreeSet::new();
    add_grants(&mut grants, ns, role.rules.iter().flatten());
    assert_eq!(
        grants,
        grant(ns, "", "serviceaccounts/token", sa_name, &["create"])
            .into_iter()
            .collect(),
        "{file}"
    );
    let binding = r
        .role_bindings
        .iter()
        .find(|b| b.role_ref.name == "relaylet-leaf-token")
        .unwrap_or_else(|| panic!("{file}: no RoleBinding of relaylet-leaf-token"));
    assert_eq!(binding.metadata.namespace.as_deref(), Some(ns), "{file}");
    assert_eq!(binding.role_ref.kind, "Role");
    let subjects: Vec<_> = binding
        .subjects
        .iter()
        .flatten()
        .map(|s| (s.kind.as_str(), s.name.as_str(), s.namespace.as_deref()))
        .collect();
    assert_eq!(subjects, [("ServiceAccount", sa_name, Some(ns))], "{file}");
}

fn check_leaf_rbac(text: &str, want: &BTreeSet<Grant>, file: &str) {
    let r = Rendered::parse(text);
    assert_eq!(r.namespaces.len(), 1);
    let ns = r.namespaces[0].metadata.name.clone().unwrap();
    let sa = &r.service_accounts[0];
    assert_eq!(sa.metadata.namespace.as_deref(), Some(ns.as_str()));
    let sa_name = sa.metadata.name.clone().unwrap();

    assert_eq!(r.cluster_role_bindings.len(), 1);
    let binding = &r.cluster_role_bindings[0];
    let subject = &binding.subjects.as_ref().unwrap()[0];
    assert_eq!(
        (
            subject.kind.as_str(),
            subject.name.as_str(),
            subject.namespace.as_deref()
        ),
        ("ServiceAccount", sa_name.as_str(), Some(ns.as_str()))
    );
    check_token_role(&r, &ns, &sa_name, file);
    assert_eq!((r.roles.len(), r.role_bindings.len()), (1, 1), "{file}");
    let mut grants = BTreeSet::new();
    let role = r
        .cluster_roles
        .iter()
        .find(|cr| cr.metadata.name.as_deref() == Some(binding.role_ref.name.as_str()))
        .unwrap();
    add_grants(&mut grants, "*", role.rules.iter().flatten());
    assert_eq!(&grants, want, "{file}");
    for (_, group, resource, name, verb) in &grants {
        assert!(
            ![group, resource, name, verb]
                .iter()
                .any(|w| w.contains('*'))
        );
    }

    // The long-lived token belongs to that ServiceAccount.
    assert_eq!(r.secrets.len(), 1);
    let token = &r.secrets[0];
    assert_eq!(
        token.type_.as_deref(),
        Some("kubernetes.io/service-account-token")
    );
    assert_eq!(token.metadata.namespace.as_deref(), Some(ns.as_str()));
    assert_eq!(
        token
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("kubernetes.io/service-account.name")),
        Some(&sa_name)
    );
    // make-leaf-secret.sh reads exactly this Secret.
    let script = std::fs::read_to_string(repo().join("deploy/make-leaf-secret.sh")).unwrap();
    let token_name = token.metadata.name.clone().unwrap();
    assert!(script.contains(&format!("-n {ns} get secret {token_name}")));
}

#[test]
fn make_leaf_secret_refuses_bad_arguments_before_touching_a_cluster() {
    let script = repo().join("deploy/make-leaf-secret.sh");
    let run = |args: &[&str]| {
        Command::new("bash")
            .arg(&script)
            .args(args)
            // No kubeconfig and no kubectl: any cluster call would fail differently.
            .env("KUBECONFIG", "/nonexistent")
            .env("PATH", "/usr/bin:/bin")
            .output()
            .unwrap()
    };
    let help = run(&["--help"]);
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("--leaf-context"));
    for (args, says) in [
        (&["--name", "leaf-1"][..], "--leaf-context is required"),
        (&["--leaf-context", "kind-leaf"][..], "--name is required"),
        (
            &["--leaf-context", "kind-leaf", "--name", "Leaf_1"][..],
            "not a DNS label",
        ),
        (
            &["--leaf-context", "kind-leaf", "--name", "leaf-1", "--bogus"][..],
            "unknown argument",
        ),
    ] {
        let out = run(args);
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

/// The release notes `helm install` prints, rendered without a cluster.
fn notes(values: &ValueSet) -> String {
    let mut args: Vec<String> = ["install", RELEASE].iter().map(|s| s.to_string()).collect();
    args.push(chart().display().to_string());
    args.extend(
        ["--namespace", NAMESPACE, "--dry-run=client"]
            .iter()
            .map(|s| s.to_string()),
    );
    args.extend(values.args());
    let out = run_helm(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let start = text.find("NOTES:").expect("release notes");
    text[start..].to_string()
}

#[test]
fn notes_give_the_apiserver_flag_with_the_configured_type_first() {
    for address_type in ["InternalDNS", "InternalIP", "Hostname"] {
        let set = ValueSet::defaults().with(&[
            "--set",
            &format!("nodeServer.preferredAddressType={address_type}"),
        ]);
        let text = notes(&set);
        let flag = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("--kubelet-preferred-address-types="))
            .expect("the flag");
        let types: Vec<&str> = flag.split(',').collect();
        assert_eq!(types[0], address_type);
        let mut all = types.clone();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 5, "every address type once: {flag}");
        let rendered = Rendered::render(&set);
        assert_eq!(
            rendered.env_value("PREFERRED-ADDRESS-TYPE"),
            Some(address_type)
        );
    }
}

/// Runs make-leaf-secret.sh with the real kubectl 1.35 against `kubeconfig`, printing instead
/// of applying (`--dry-run`) and with the token from a file, so no cluster is needed.
fn make_leaf_secret(kubeconfig: &Path, token_file: &Path, extra: &[&str]) -> Output {
    let kubectl = relaylet_sim::tools::kubectl("1.35").expect("kubectl 1.35");
    Command::new("bash")
        .arg(repo().join("deploy/make-leaf-secret.sh"))
        .args(["--leaf-context", "leaf-a", "--name", "leaf-a", "--dry-run"])
        .arg("--token-file")
        .arg(token_file)
        .args(extra)
        .env("KUBECONFIG", kubeconfig)
        .env("KUBECTL", &kubectl.path)
        .output()
        .unwrap()
}

/// `--proxy-url` and the proxy's TLS files: the minted kubeconfig names the proxy, the Secret
/// carries the files under the keys relaylet reads, and relaylet builds the leaf from them.
#[tokio::test]
async fn make_leaf_secret_names_a_proxy_and_carries_its_tls_files() {
    let dir = Scratch::new("leaf-secret-proxy");
    let ca = rcgen::generate_simple_self_signed(vec!["leaf-a.example.com".to_string()]).unwrap();
    let kubeconfig = dir.0.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: a\n  cluster:\n    server: https://leaf-a.example.com:6443\n    certificate-authority-data: {}\nusers:\n- name: admin\n  user:\n    token: t\ncontexts:\n- name: leaf-a\n  context:\n    cluster: a\n    user: admin\ncurrent-context: leaf-a\n",
            base64::engine::general_purpose::STANDARD.encode(ca.cert.pem())
        ),
    )
    .unwrap();
    let token_file = dir.0.join("token");
    std::fs::write(&token_file, "service-account-token\n").unwrap();
    let proxy_ca = dir.0.join("proxy-ca.pem");
    std::fs::write(&proxy_ca, ca.cert.pem()).unwrap();
    let client_key = dir.0.join("client.key");
    std::fs::write(&client_key, ca.signing_key.serialize_pem()).unwrap();
    let url = "https://konnectivity.relaylet.svc:8090";
    let args = |with_key: bool| {
        let mut args = vec![
            "--proxy-url".to_string(),
            url.to_string(),
            "--proxy-ca".to_string(),
            proxy_ca.display().to_string(),
            "--proxy-client-cert".to_string(),
            proxy_ca.display().to_string(),
        ];
        if with_key {
            args.extend([
                "--proxy-client-key".to_string(),
                client_key.display().to_string(),
            ]);
        }
        args
    };
    let half = args(false);
    let half: Vec<&str> = half.iter().map(String::as_str).collect();
    let out = make_leaf_secret(&kubeconfig, &token_file, &half);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("go together"));
    let out = make_leaf_secret(&kubeconfig, &token_file, &["--proxy-url", "ftp://p:21"]);
    assert!(!out.status.success());
    let out = make_leaf_secret(&kubeconfig, &token_file, &["--proxy-url", url]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs --proxy-ca"));

    let whole = args(true);
    let whole: Vec<&str> = whole.iter().map(String::as_str).collect();
    let out = make_leaf_secret(&kubeconfig, &token_file, &whole);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = Rendered::parse(&String::from_utf8(out.stdout).unwrap());
    let data = r.secrets[0].data.clone().unwrap();
    assert_eq!(data["proxy-ca.crt"].0, ca.cert.pem().as_bytes());
    assert_eq!(data["proxy-client.crt"].0, ca.cert.pem().as_bytes());
    assert_eq!(
        data["proxy-client.key"].0,
        ca.signing_key.serialize_pem().as_bytes()
    );
    let minted = String::from_utf8(data["kubeconfig"].0.clone()).unwrap();
    let parsed = kube::config::Kubeconfig::from_yaml(&minted).unwrap();
    relaylet::leaf::kubeconfig::check(&parsed).expect("a kubeconfig leaf Secrets may carry");
    assert_eq!(relaylet::leaf::proxy_url(&parsed), Some(url));
    let tls = relaylet::leaf::ProxyTls {
        ca: Some(data["proxy-ca.crt"].0.clone()),
        client_cert: Some(data["proxy-client.crt"].0.clone()),
        client_key: Some(data["proxy-client.key"].0.clone()),
    };
    let proxy = relaylet::leaf::LeafProxy::new(url, &tls).expect("relaylet sets the proxy up");
    assert_eq!(proxy.url.to_string(), "konnectivity.relaylet.svc:8090");
}

#[tokio::test]
async fn make_leaf_secret_mints_a_kubeconfig_relaylet_accepts() {
    let dir = Scratch::new("leaf-secret");
    // The user's own leaf kubeconfig: CA as a file, an admin token of their own.
    let ca = rcgen::generate_simple_self_signed(vec!["leaf-a.example.com".to_string()]).unwrap();
    let ca_pem = ca.cert.pem();
    std::fs::write(dir.0.join("ca.pem"), &ca_pem).unwrap();
    let kubeconfig = dir.0.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: a\n  cluster:\n    server: https://leaf-a.example.com:6443\n    certificate-authority: {}\nusers:\n- name: admin\n  user:\n    token: personal-admin-token\ncontexts:\n- name: leaf-a\n  context:\n    cluster: a\n    user: admin\ncurrent-context: leaf-a\n",
            dir.0.join("ca.pem").display()
        ),
    )
    .unwrap();
    let token_file = dir.0.join("token");
    std::fs::write(
        &token_file,
        "eyJhbGciOiJSUzI1NiJ9.service-account-token.sig\n",
    )
    .unwrap();

    let out = make_leaf_secret(
        &kubeconfig,
        &token_file,
        &[
            "--namespace",
            "relaylet-leaves",
            "--node-labels",
            "topology.kubernetes.io/region=eu-west-1",
            "--node-taints",
            "",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        !stdout.contains("personal-admin-token"),
        "the user's credentials never leave"
    );
    let r = Rendered::parse(&stdout);
    assert_eq!(r.secrets.len(), 1);
    let secret = &r.secrets[0];
    assert_eq!(
        secret.metadata.name.as_deref(),
        Some("relaylet-leaf-leaf-a")
    );
    assert_eq!(
        secret.metadata.namespace.as_deref(),
        Some("relaylet-leaves")
    );
    assert_eq!(
        secret
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("relaylet.io/leaf-cluster"))
            .map(String::as_str),
        Some("leaf-a")
    );
    let annotations = secret.metadata.annotations.clone().unwrap();
    assert_eq!(
        annotations["relaylet.io/node-labels"],
        "topology.kubernetes.io/region=eu-west-1"
    );
    assert_eq!(annotations["relaylet.io/node-taints"], "");
    assert!(!annotations.contains_key("relaylet.io/node-name"));

    let minted = String::from_utf8(secret.data.as_ref().unwrap()["kubeconfig"].0.clone()).unwrap();
    assert!(!minted.contains("personal-admin-token"));
    let parsed: Value = serde_saphyr::from_str(&minted).unwrap();
    assert_eq!(
        parsed["clusters"][0]["cluster"]["server"],
        "https://leaf-a.example.com:6443"
    );
    let ca_data: k8s_openapi::ByteString = serde_json::from_value(
        parsed["clusters"][0]["cluster"]["certificate-authority-data"].clone(),
    )
    .unwrap();
    assert_eq!(ca_data.0, ca_pem.as_bytes(), "the CA file is inlined");
    assert_eq!(
        parsed["users"][0]["user"]["token"],
        "eyJhbGciOiJSUzI1NiJ9.service-account-token.sig"
    );
    // It is data only, as a leaf Secret's kubeconfig must be (the user's had a CA file).
    let as_kube_reads_it = kube::config::Kubeconfig::from_yaml(&minted).unwrap();
    relaylet::leaf::kubeconfig::check(&as_kube_reads_it)
        .expect("a kubeconfig leaf Secrets may carry");
    // relaylet's own loader accepts it.
    relaylet::leaf::Leaf::from_kubeconfig(
        "leaf-a",
        "relaylet-leaf-a",
        &minted,
        &relaylet::ops::Metrics::new(),
        true,
    )
    .await
    .expect("relaylet loads the minted kubeconfig");

    // A loopback server is flagged, and --leaf-server replaces it.
    let local = dir.0.join("local-kubeconfig");
    std::fs::write(
        &local,
        std::fs::read_to_string(&kubeconfig)
            .unwrap()
            .replace("https://leaf-a.example.com:6443", "https://127.0.0.1:40123"),
    )
    .unwrap();
    let out = make_leaf_secret(&local, &token_file, &[]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("loopback"));
    let out = make_leaf_secret(
        &local,
        &token_file,
        &["--leaf-server", "https://leaf-a.internal:6443"],
    );
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("loopback"));
    let r = Rendered::parse(&String::from_utf8(out.stdout).unwrap());
    let minted =
        String::from_utf8(r.secrets[0].data.as_ref().unwrap()["kubeconfig"].0.clone()).unwrap();
    assert!(minted.contains("server: https://leaf-a.internal:6443"));
}

/// A replica that is not ready never blocks a drain, and the memory limit follows every cap
/// unless one is given; the caps reach relaylet's env.
#[test]
fn drains_are_never_blocked_and_memory_follows_every_cap() {
    let r = Rendered::render(&ValueSet::defaults());
    assert_eq!(r.pdbs.len(), 1);
    assert_eq!(
        r.pdbs[0]
            .spec
            .as_ref()
            .unwrap()
            .unhealthy_pod_eviction_policy
            .as_deref(),
        Some("AlwaysAllow")
    );
    let memory_limit = |r: &Rendered| {
        r.container()
            .resources
            .as_ref()
            .unwrap()
            .limits
            .as_ref()
            .unwrap()["memory"]
            .0
            .clone()
    };
    // 64 MiB + KiB: 3072 connections x 48 + 1024 handshakes x 16 + 64 large heads x 128 +
    // 4096 sessions x 48 + 1024 log streams x 48 = 417,792 KiB (408 MiB).
    assert_eq!(memory_limit(&r), "472Mi");
    assert_eq!(r.env_value("MAX_SESSIONS"), Some("4096"));
    assert_eq!(r.env_value("MAX_SESSIONS_PER_USER"), Some("4096"));
    assert_eq!(r.env_value("MAX_CONNECTIONS"), Some("3072"));
    assert_eq!(r.env_value("MAX_PENDING_HANDSHAKES"), Some("1024"));
    assert_eq!(r.env_value("MAX_UNAUTHENTICATED_CONNECTIONS"), Some("256"));
    assert_eq!(
        r.env_value("MAX_UNAUTHENTICATED_CONNECTIONS_PER_CLIENT"),
        Some("32")
    );
    assert_eq!(
        r.env_value("MAX_UNAUTHENTICATED_CONNECTIONS_PER_USER"),
        Some("16")
    );
    assert_eq!(r.env_value("MAX_LARGE_HEAD_CONNECTIONS"), Some("64"));
    assert_eq!(r.env_value("MAX_LOG_STREAMS"), Some("1024"));
    assert_eq!(r.env_value("MAX_LOG_STREAMS_PER_USER"), Some("1024"));
    // The namespace shares: a quarter of the totals unless set.
    assert_eq!(r.env_value("MAX_SESSIONS_PER_NAMESPACE"), Some("1024"));
    assert_eq!(r.env_value("MAX_LOG_STREAMS_PER_NAMESPACE"), Some("256"));
    // Every cap moves it: 12,288 more sessions x 48 KiB = 576 MiB more.
    let r = Rendered::render(&ValueSet::defaults().with(&["--set", "limits.maxSessions=16384"]));
    assert_eq!(memory_limit(&r), "1048Mi");
    assert_eq!(r.env_value("MAX_SESSIONS"), Some("16384"));
    assert_eq!(r.env_value("MAX_SESSIONS_PER_NAMESPACE"), Some("4096"));
    let r = Rendered::render(&ValueSet::defaults().with(&["--set", "limits.maxLogStreams=2048"]));
    assert_eq!(memory_limit(&r), "520Mi");
    let r = Rendered::render(&ValueSet::defaults().with(&["--set", "limits.maxConnections=4096"]));
    assert_eq!(memory_limit(&r), "520Mi");
    let r = Rendered::render(
        &ValueSet::defaults().with(&["--set", "limits.maxLargeHeadConnections=128"]),
    );
    assert_eq!(memory_limit(&r), "480Mi");
    let r = Rendered::render(
        &ValueSet::defaults().with(&["--set", "limits.maxPendingHandshakes=2048"]),
    );
    assert_eq!(memory_limit(&r), "488Mi");
    // A share given is kept.
    let r = Rendered::render(&ValueSet::defaults().with(&[
        "--set",
        "limits.maxSessionsPerNamespace=100",
        "--set",
        "limits.maxLogStreamsPerNamespace=10",
    ]));
    assert_eq!(r.env_value("MAX_SESSIONS_PER_NAMESPACE"), Some("100"));
    assert_eq!(r.env_value("MAX_LOG_STREAMS_PER_NAMESPACE"), Some("10"));
    let r = Rendered::render(&ValueSet::defaults().with(&["--set", "resources.limits.memory=1Gi"]));
    assert_eq!(memory_limit(&r), "1Gi", "a limit given is kept");
    // What relaylet reads from that env is what the chart says.
    let env: BTreeMap<String, String> = r
        .container()
        .env
        .iter()
        .flatten()
        .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
        .chain([("LEAF_NODE_IP".to_string(), "10.0.0.1".to_string())])
        .collect();
    let config = relaylet::config::Config::from_lookup(|name| env.get(name).cloned())
        .expect("the chart's env is a valid configuration");
    assert_eq!(config.limits.sessions, 4096);
    assert_eq!(config.limits.pending_handshakes, 1024);
    assert_eq!(config.limits.sessions_per_namespace, 1024);
    assert_eq!(config.limits.log_streams_per_namespace, 256);
    assert_eq!(config.limits.unauthenticated_connections_per_user, 16);
    assert_eq!(config.limits.large_head_connections, 64);
    assert_eq!(config.node_ports, relaylet::config::DEFAULT_NODE_PORTS);
}

#[test]
fn notes_say_how_to_add_a_leaf_and_what_metrics_server_needs() {
    let text = notes(&ValueSet::defaults());
    assert!(
        text.contains("kubectl --context <leaf-context> apply -f deploy/leaf-rbac.yaml"),
        "{text}"
    );
    assert!(text.contains("relaylet.io/root-pod-uid"), "{text}");
    // Every leaf needs the marker policy, with the syncer's identity in its ConfigMap.
    assert!(
        text.contains("kubectl --context <leaf-context> apply -f deploy/leaf-marker-policy.yaml")
            && text.contains("ConfigMap relaylet-leaf-marker-syncers"),
        "{text}"
    );
    assert!(text.contains("--kubelet-insecure-tls"), "{text}");
    let text = notes(&ValueSet::ci("network-policy"));
    assert!(text.contains("networkPolicy.extraKubeletFrom"), "{text}");
}
