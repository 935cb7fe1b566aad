//! A real metrics-server (built from its module by `tests/tools/build-k8s.sh`) for one cluster,
//! installed as its upstream manifests install it: its own ServiceAccount and token, the
//! `system:metrics-server` ClusterRole, the auth-delegator and authentication-reader bindings,
//! and the `v1beta1.metrics.k8s.io` APIService, so the cluster's kube-apiserver aggregates it
//! and `kubectl top` reads it. It scrapes every Node at the address the apiserver itself would
//! dial (the cluster's `--kubelet-preferred-address-types`, the Node's status port).
//!
//! On loopback the APIService names an `ExternalName` Service (`localhost`): the aggregator
//! dials an ExternalName's host directly, where a ClusterIP would need kube-proxy. The
//! aggregator verifies metrics-server's serving certificate for
//! `metrics-server.kube-system.svc` against the cluster CA given as the APIService's caBundle.

use std::time::Duration;

use super::harness::{ControlPlane, Process, free_port, wait_until};

/// metrics-server's shortest `--metric-resolution`; it must exceed `--kubelet-request-timeout`
/// (10 s by default), hence [`KUBELET_REQUEST_TIMEOUT`].
pub const RESOLUTION: &str = "10s";
pub const KUBELET_REQUEST_TIMEOUT: &str = "5s";

/// How metrics-server authenticates to kubelets and checks their certificates.
pub struct Scraping {
    /// Present a client certificate from the cluster CA (leafkubelet, like a kubelet without
    /// webhook authentication, accepts nothing else); otherwise metrics-server's
    /// ServiceAccount token, as the upstream manifests run it.
    pub client_certificate: bool,
    /// Verify kubelet serving certificates against the cluster CA; otherwise
    /// `--kubelet-insecure-tls` (what docs/operations.md, "kubectl top", tells users of
    /// relaylet's self-signed certificate).
    pub verify_kubelets: bool,
}

const RBAC: &str = r#"apiVersion: v1
kind: ServiceAccount
metadata: {name: metrics-server, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:metrics-server"}
rules:
- apiGroups: [""]
  resources: [nodes/metrics]
  verbs: [get]
- apiGroups: [""]
  resources: [pods, nodes]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:metrics-server"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:metrics-server"}
subjects: [{kind: ServiceAccount, name: metrics-server, namespace: kube-system}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "metrics-server:system:auth-delegator"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:auth-delegator"}
subjects: [{kind: ServiceAccount, name: metrics-server, namespace: kube-system}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: metrics-server-auth-reader, namespace: kube-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: extension-apiserver-authentication-reader}
subjects: [{kind: ServiceAccount, name: metrics-server, namespace: kube-system}]
"#;

impl ControlPlane {
    /// Starts metrics-server for this cluster and registers it with the apiserver. The process
    /// is killed when the returned handle is dropped.
    pub fn start_metrics_server(&self, scraping: Scraping) -> Process {
        use base64::Engine;
        self.kubectl_stdin_ok(&["apply", "-f", "-"], Some(RBAC));
        let token = self.kubectl_ok(&[
            "create",
            "token",
            "metrics-server",
            "-n",
            "kube-system",
            "--duration=24h",
        ]);
        let dir = self.dir.join("metrics-server");
        std::fs::create_dir_all(&dir).expect("metrics-server dir");
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).expect("writing a metrics-server file");
            path.display().to_string()
        };
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let own_kubeconfig = write(
            "kubeconfig",
            &format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: metrics-server\n  user:\n    token: {}\ncontexts:\n- name: c\n  context: {{cluster: c, user: metrics-server}}\ncurrent-context: c\n",
                self.url,
                b64(&self.ca.cert_pem()),
                token.trim()
            ),
        );
        let serving = self
            .ca
            .issue_server(&["127.0.0.1", "localhost", "metrics-server.kube-system.svc"])
            .expect("metrics-server serving certificate");
        let port = free_port();
        let mut args = vec![
            format!("--secure-port={port}"),
            "--bind-address=127.0.0.1".to_string(),
            format!("--tls-cert-file={}", write("tls.crt", &serving.cert_pem)),
            format!(
                "--tls-private-key-file={}",
                write("tls.key", &serving.key_pem)
            ),
            format!("--kubeconfig={own_kubeconfig}"),
            format!("--authentication-kubeconfig={own_kubeconfig}"),
            format!("--authorization-kubeconfig={own_kubeconfig}"),
            format!(
                "--kubelet-preferred-address-types={}",
                self.preferred_address_types()
            ),
            "--kubelet-use-node-status-port".to_string(),
            format!("--metric-resolution={RESOLUTION}"),
            format!("--kubelet-request-timeout={KUBELET_REQUEST_TIMEOUT}"),
            format!("--cert-dir={}", dir.display()),
            "--v=2".to_string(),
        ];
        if scraping.verify_kubelets {
            args.push(format!(
                "--kubelet-certificate-authority={}",
                self.dir.join("ca.crt").display()
            ));
        } else {
            args.push("--kubelet-insecure-tls".to_string());
        }
        if scraping.client_certificate {
            let client = self
                .ca
                .issue_client("metrics-server", &[])
                .expect("metrics-server client certificate");
            args.push(format!(
                "--kubelet-client-certificate={}",
                write("kubelet-client.crt", &client.cert_pem)
            ));
            args.push(format!(
                "--kubelet-client-key={}",
                write("kubelet-client.key", &client.key_pem)
            ));
        }
        let mut process = Process::spawn(
            "metrics-server",
            &self.dir,
            &self.version.bin_dir().join("metrics-server"),
            &args,
        );
        wait_until(
            &format!("{} metrics-server listening", self.name),
            Duration::from_secs(60),
            &mut [&mut process],
            || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        );
        let registration = format!(
            r#"apiVersion: v1
kind: Service
metadata: {{name: metrics-server, namespace: kube-system}}
spec:
  type: ExternalName
  externalName: localhost
  ports: [{{name: https, port: {port}, protocol: TCP}}]
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {{name: v1beta1.metrics.k8s.io}}
spec:
  group: metrics.k8s.io
  version: v1beta1
  groupPriorityMinimum: 100
  versionPriority: 100
  caBundle: {}
  service: {{name: metrics-server, namespace: kube-system, port: {port}}}
"#,
            b64(&self.ca.cert_pem())
        );
        self.kubectl_stdin_ok(&["apply", "-f", "-"], Some(&registration));
        process
    }
}
