//! relaylet's serving certificates from the root cluster's `kubernetes.io/kubelet-serving`
//! signer (issue 17), against a real root kube-apiserver that verifies kubelet serving
//! certificates (`--kubelet-certificate-authority` = its cluster CA, as CIS 1.2.5 asks) with
//! the real kube-controller-manager signing approved CSRs:
//! - `servingCert.mode=csr` with approval by hand: not ready and no Node until an administrator
//!   approves the CSR named in `/readyz` (a denied one is named as denied, and relaylet asks
//!   again); then exec, logs and port-forward work;
//! - the control: the same apiserver refuses relaylet's self-signed certificate
//!   (`servingCert.mode=generate`) with its x509 error;
//! - relaylet's own approver (`servingCert.csr.approver=true`), replicas as Pods with bound
//!   tokens: renewal under an open session, a CSR for a foreign IP left pending, and a replica
//!   failover without one x509 error.
//!
//! Each test builds its own clusters; they take turns.

use relaylet_dev::testkit as support;
use relaylet_dev::testkit::metrics as metrics_support;
use relaylet_dev::testkit::realk8s::harness::{self, K8s};
use relaylet_dev::testkit::realk8s::world;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use support::{Background, Run, describe, text};
use world::{Setup, World};

const VIRTUAL_NODE: &str = "relaylet-leaf-1";
const LABEL: &str = "app.kubernetes.io/managed-by=relaylet";

fn turn() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// relaylet's CSRs, oldest first.
fn csrs(w: &World) -> Vec<String> {
    w.root
        .kubectl_ok(&[
            "get",
            "csr",
            "-l",
            LABEL,
            "--sort-by=.metadata.creationTimestamp",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ])
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

fn csr_field(w: &World, name: &str, path: &str) -> String {
    w.root
        .kubectl_ok(&["get", "csr", name, "-o", &format!("jsonpath={path}")])
}

fn metrics_addr(w: &World, i: usize) -> std::net::SocketAddr {
    w.replicas.lock().expect("replicas")[i]
        .as_ref()
        .expect("replica running")
        .running
        .metrics_addr
}

fn readyz(w: &World, i: usize) -> metrics_support::Got {
    let addr = metrics_addr(w, i);
    w.runtime
        .block_on(metrics_support::http_get(addr, "/readyz"))
}

fn metric(w: &World, i: usize, name: &str, labels: &[(&str, &str)]) -> f64 {
    let addr = metrics_addr(w, i);
    let got = w
        .runtime
        .block_on(metrics_support::http_get(addr, "/metrics"));
    metrics_support::count(&metrics_support::parse(&got.body), name, labels)
}

/// CSRs the approvers of both replicas refused.
fn refused_total(w: &World) -> f64 {
    (0..2)
        .map(|i| {
            metric(
                w,
                i,
                "relaylet_csr_approver_decisions_total",
                &[("decision", "refused")],
            )
        })
        .sum()
}

/// The certificate replica `i` serves, verified as the root apiserver verifies it: against the
/// cluster CA, for the replica's IP.
fn served_certificate(w: &World, i: usize) -> Vec<u8> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(w.root.ca.cert_pem().as_bytes()) {
        roots.add(cert.expect("CA PEM")).expect("CA");
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let addr = w.kubelet_addr(i);
    w.runtime.block_on(async {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connect to relaylet's kubelet port");
        let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
        let stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
            .connect(name, tcp)
            .await
            .expect("relaylet's certificate verifies against the cluster CA for its pod IP");
        stream
            .get_ref()
            .1
            .peer_certificates()
            .expect("a certificate")[0]
            .to_vec()
    })
}

use rustls::pki_types::pem::PemObject;

/// `kubectl exec demo -- echo <word>` with `version`.
fn exec_echo(w: &World, version: &str, word: &str) -> std::process::Output {
    let k = support::kubectl(version);
    Run::new(
        &k,
        w.root_kubeconfig(),
        &["exec", "demo", "--", "echo", word],
    )
    .output()
}

fn assert_exec_works(w: &World, version: &str, word: &str) {
    let k = support::kubectl(version);
    let out = exec_echo(w, version, word);
    assert!(out.status.success(), "{}", describe(&k, &out));
    assert_eq!(
        text(&out.stdout),
        format!("{word}\n"),
        "{}",
        describe(&k, &out)
    );
}

/// A PEM request shaped like relaylet's for `ip`, as another party might make it.
fn request_for(name: &str, ip: &str) -> String {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params
        .subject_alt_names
        .push(rcgen::SanType::IpAddress(ip.parse().expect("ip")));
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("system:node:{name}"));
    params
        .serialize_request(&key)
        .and_then(|r| r.pem())
        .expect("CSR")
}

fn csr_manifest(name: &str, request_pem: &str) -> String {
    use base64::Engine;
    serde_json::json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {
            "request": base64::engine::general_purpose::STANDARD.encode(request_pem),
            "signerName": "kubernetes.io/kubelet-serving",
            "usages": ["digital signature", "server auth"],
        },
    })
    .to_string()
}

/// With approval by hand, a replica is not ready and writes no Node until the CSR named in
/// its readiness reason is approved; then the verifying apiserver accepts it for exec (SPDY and
/// WebSocket), logs and port-forward.
#[test]
fn csr_mode_approved_by_hand_passes_a_verifying_apiserver() {
    let _turn = turn();
    let w = World::start(Setup {
        verify_kubelet_certificates: true,
        chart_values: &["servingCert.mode=csr"],
        wait_for_nodes: false,
        root_version: K8s::V1_37,
        leaf_version: K8s::V1_35,
        ..Setup::default()
    });
    let csr = support::eventually_some("relaylet creates its CSR", || csrs(&w).into_iter().next());
    assert_eq!(
        csr_field(
            &w,
            &csr,
            "{.spec.signerName} {.spec.usages} {.spec.username}"
        ),
        r#"kubernetes.io/kubelet-serving ["digital signature","server auth"] system:serviceaccount:relaylet:relaylet"#
    );
    let ready = readyz(&w, 0);
    assert_eq!(ready.status, 503, "{}", ready.body);
    assert!(
        ready.body.contains(&format!(
            "serving certificate: CSR {csr} awaits approval (kubectl certificate approve {csr})"
        )),
        "{}",
        ready.body
    );
    assert_eq!(
        metric(&w, 0, "relaylet_serving_certificate_csr_pending", &[]),
        1.0
    );
    // No presence without a certificate: no Node points at an address that would fail TLS.
    let nodes = w.root.kubectl_ok(&["get", "nodes", "-o", "name"]);
    assert!(!nodes.contains(VIRTUAL_NODE), "{nodes}");

    // A denied CSR is an error naming it; relaylet asks again.
    w.root.kubectl_ok(&["certificate", "deny", &csr]);
    let reason = support::eventually_some("readiness names the denial", || {
        let got = readyz(&w, 0);
        got.body
            .contains(&format!(
                "serving certificate: CSR {csr} was denied: KubectlDeny"
            ))
            .then_some(got)
    });
    assert_eq!(reason.status, 503, "{}", reason.body);
    let csr = support::eventually_some("relaylet asks again", || {
        csrs(&w).into_iter().find(|name| *name != csr)
    });

    // The administrator approves, as the log, NOTES and docs/install.md say.
    w.root.kubectl_ok(&["certificate", "approve", &csr]);
    w.wait_for_nodes(&["leaf-1"]);
    w.sync_pod("leaf-1", "default", "demo");
    support::eventually_some("the replica turns ready", || {
        (readyz(&w, 0).status == 200).then_some(())
    });
    assert_eq!(
        metric(&w, 0, "relaylet_serving_certificates_issued_total", &[]),
        1.0
    );
    let expiry = metric(
        &w,
        0,
        "relaylet_serving_certificate_expiration_timestamp_seconds",
        &[],
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    assert!(expiry > now, "expires at {expiry}, now {now}");

    assert_exec_works(&w, "1.27", "spdy");
    assert_exec_works(&w, "1.35", "websocket");
    w.wait_for_log_lines("leaf-1", "default", "demo", 2);
    let k = support::kubectl("1.35");
    let out = Run::new(&k, w.root_kubeconfig(), &["logs", "demo", "--tail=1"]).output();
    assert!(out.status.success(), "{}", describe(&k, &out));
    assert!(
        text(&out.stdout).starts_with("tick "),
        "{}",
        describe(&k, &out)
    );
    for body in world::port_forward_answers(&k, w.root_kubeconfig(), "demo", 2) {
        assert!(body.ends_with("hello from default/demo\n"), "{body:?}");
    }
}

/// The control: the same verifying apiserver refuses relaylet's self-signed certificate, and
/// kubectl shows the apiserver's x509 error.
#[test]
fn generate_mode_fails_against_a_verifying_apiserver_with_its_x509_error() {
    let _turn = turn();
    let w = World::start(Setup {
        verify_kubelet_certificates: true,
        root_version: K8s::V1_37,
        leaf_version: K8s::V1_35,
        ..Setup::default()
    });
    w.sync_pod("leaf-1", "default", "demo");
    for version in ["1.27", "1.35"] {
        let k = support::kubectl(version);
        let out = exec_echo(&w, version, "refused");
        assert!(!out.status.success(), "{}", describe(&k, &out));
        let err = text(&out.stderr);
        assert!(
            err.contains("x509: certificate signed by unknown authority"),
            "{}",
            describe(&k, &out)
        );
    }
    let k = support::kubectl("1.35");
    let out = Run::new(&k, w.root_kubeconfig(), &["logs", "demo"]).output();
    assert!(!out.status.success(), "{}", describe(&k, &out));
    assert!(
        text(&out.stderr).contains("x509: certificate signed by unknown authority"),
        "{}",
        describe(&k, &out)
    );
}

/// relaylet's approver, two replicas as Pods with bound tokens and certificates renewed every
/// few seconds (10-minute certificates renewed 597 s before they end): a session open across a
/// renewal goes on, new connections get the new certificate, a CSR made with relaylet's own
/// token for an IP that is not its pod's stays pending, and a failover of the Node's replica
/// shows no x509 error.
#[test]
fn the_approver_renewal_and_failover_in_csr_mode() {
    let _turn = turn();
    let w = World::start(Setup {
        verify_kubelet_certificates: true,
        chart_values: &[
            "servingCert.mode=csr",
            "servingCert.csr.approver=true",
            "servingCert.csr.expiration=10m",
            "servingCert.csr.renewBefore=597s",
        ],
        replicas: 2,
        replica_pods: true,
        root_version: K8s::V1_37,
        leaf_version: K8s::V1_35,
        ..Setup::default()
    });
    w.sync_pod("leaf-1", "default", "demo");
    for i in 0..2 {
        support::eventually_some("both replicas ready", || {
            (readyz(&w, i).status == 200).then_some(())
        });
    }
    let writer = w.writer_of(VIRTUAL_NODE);
    let standby = 1 - writer;

    // Renewal under an open session: the pod waits for a file the test makes after it.
    let go = w.dir.path().join("go");
    let script = format!(
        "echo start; while [ ! -e {} ]; do sleep 0.1; done; echo end",
        go.display()
    );
    let k = support::kubectl("1.35");
    let session = Background::spawn(
        Run::new(
            &k,
            w.root_kubeconfig(),
            &["exec", "demo", "--", "sh", "-c", &script],
        ),
        "exec across a renewal",
    );
    assert_eq!(
        session.next_line(Duration::from_secs(60)).as_deref(),
        Some("start")
    );
    let before = served_certificate(&w, writer);
    let issued = metric(
        &w,
        writer,
        "relaylet_serving_certificates_issued_total",
        &[],
    );
    support::eventually_some("the Node's replica renews its certificate", || {
        (metric(
            &w,
            writer,
            "relaylet_serving_certificates_issued_total",
            &[],
        ) > issued)
            .then_some(())
    });
    let after = served_certificate(&w, writer);
    assert_ne!(before, after, "new connections get the renewed certificate");
    std::fs::write(&go, "").expect("go file");
    let ended = session.finish(Duration::from_secs(60));
    assert_eq!(ended.code, Some(0), "{ended:?}");
    assert_eq!(ended.stdout, "start\nend\n", "{ended:?}");
    assert_exec_works(&w, "1.35", "renewed");

    // A CSR made with relaylet-0's own token for a foreign IP is refused (left pending), one
    // by another requester is left alone.
    let kubeconfig = w.dir.path().join("relaylet-0.kubeconfig");
    std::fs::write(&kubeconfig, w.replica_kubeconfig(0)).expect("kubeconfig");
    let refused_before = refused_total(&w);
    let forged = csr_manifest("forged-by-relaylet", &request_for("relaylet-0", "10.9.9.9"));
    let out = std::process::Command::new(harness::kubectl_path())
        .args(["create", "-f", "-"])
        .env("KUBECONFIG", &kubeconfig)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(forged.as_bytes())?;
            child.wait_with_output()
        })
        .expect("kubectl create");
    assert!(out.status.success(), "{}", text(&out.stderr));
    w.root.kubectl_stdin_ok(
        &["create", "-f", "-"],
        Some(&csr_manifest(
            "someone-elses",
            &request_for("relaylet-0", "127.0.0.2"),
        )),
    );
    support::eventually_some("the approver refuses the forged CSR", || {
        (refused_total(&w) > refused_before).then_some(())
    });
    assert_eq!(
        csr_field(&w, "forged-by-relaylet", "{.status.conditions}"),
        ""
    );

    // Failover: the standby has its own certificate before it may write the Node.
    assert_eq!(readyz(&w, standby).status, 200);
    let standby_ip = w.replica_ip(standby).to_string();
    w.stop_replica(writer);
    let mut failures = Vec::new();
    let mut moved_and_worked = 0;
    for _ in 0..600 {
        let out = exec_echo(&w, "1.35", "failover");
        if out.status.success() {
            if w.node_address(VIRTUAL_NODE) == standby_ip {
                moved_and_worked += 1;
                if moved_and_worked == 3 {
                    break;
                }
            }
        } else {
            failures.push(text(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        moved_and_worked, 3,
        "the Node never moved to the standby: {failures:?}"
    );
    assert!(
        failures.iter().all(|f| !f.contains("x509")),
        "x509 errors during the hand-over: {failures:?}"
    );
    assert_eq!(csr_field(&w, "someone-elses", "{.status.conditions}"), "");
}
