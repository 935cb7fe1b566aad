//! `AUTH_MODE=x509` authorizes by name: the root client CA signs every real node's kubelet
//! client certificate (and whatever else its signers approve), so relaylet in that mode serves
//! only the certificate CNs listed in `X509_ALLOWED_USERS`, and refuses to start without them;
//! the others are held to the small head of connections not authorized yet.

use relaylet_dev::testkit as support;

use std::collections::BTreeMap;

use relaylet_dev::sandbox::Settings;
use relaylet_sim::cluster::APISERVER_KUBELET_CLIENT;
use support::{RT, env};

fn settings() -> Settings {
    Settings {
        env: BTreeMap::from([
            ("AUTH_MODE".to_string(), "x509".to_string()),
            (
                "X509_ALLOWED_USERS".to_string(),
                APISERVER_KUBELET_CLIENT.to_string(),
            ),
        ]),
        ..Settings::default()
    }
}

#[test]
fn only_the_allowed_certificates_are_served() {
    let e = env(settings);
    let apiserver = e.kubelet_client_identity();
    // A real node's kubelet client certificate: signed by the same CA, in system:nodes.
    let kubelet = e
        .sandbox
        .root
        .ca
        .issue_client("system:node:worker-1", &["system:nodes"])
        .unwrap();
    let path = "/containerLogs/default/demo-1/main?tailLines=1";
    RT.block_on(async {
        let tls = e.kubelet_api_tls(Some(&apiserver));
        let got = support::metrics::https_get(e.sandbox.relaylet.addr, tls, path, &[]).await;
        assert_eq!(got.status, 200, "{}", got.body);

        let tls = e.kubelet_api_tls(Some(&kubelet));
        let got = support::metrics::https_get(e.sandbox.relaylet.addr, tls, path, &[]).await;
        assert_eq!(got.status, 403, "{}", got.body);
        assert_eq!(
            got.body,
            "user \"system:node:worker-1\" is not allowed: AUTH_MODE=x509 serves only the users in X509_ALLOWED_USERS"
        );
    });
}

/// The head is read before the request is authorized, so a name not on the list gets only the
/// small head (and the small budget of connections not authorized yet), however valid its
/// certificate; the allowed apiserver's connections read large heads.
#[test]
fn names_not_on_the_list_get_only_the_small_head() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let e = env(settings);
    let apiserver = e.kubelet_client_identity();
    let kubelet = e
        .sandbox
        .root
        .ca
        .issue_client("system:node:worker-1", &["system:nodes"])
        .unwrap();
    let request = format!(
        "GET /containerLogs/default/demo-1/main?tailLines=1 HTTP/1.1\r\nHost: relaylet\r\nConnection: close\r\nX-Big: {}\r\n\r\n",
        "x".repeat(20 * 1024)
    );
    let answer = |identity| {
        let request = request.clone();
        async move {
            let mut tls = e.connect_kubelet_api(Some(identity)).await.unwrap();
            tls.write_all(request.as_bytes()).await.unwrap();
            let mut got = Vec::new();
            let read = tokio::time::timeout(
                std::time::Duration::from_secs(60),
                tls.read_to_end(&mut got),
            );
            let _ = read.await.expect("an answer");
            String::from_utf8_lossy(&got).into_owned()
        }
    };
    RT.block_on(async {
        let got = answer(&apiserver).await;
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
        let got = answer(&kubelet).await;
        assert!(got.starts_with("HTTP/1.1 431"), "{got}");
    });
}

#[test]
fn x509_mode_without_an_allow_list_does_not_start() {
    let err = relaylet::config::Config::from_lookup(|name| match name {
        "LEAF_NODE_IP" => Some("10.0.0.1".to_string()),
        "AUTH_MODE" => Some("x509".to_string()),
        _ => None,
    })
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("list the certificate CNs that may call in X509_ALLOWED_USERS"),
        "{err}"
    );
}
