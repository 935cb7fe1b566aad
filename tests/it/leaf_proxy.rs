//! Leaves that relaylet cannot dial, reached through the proxy their kubeconfig names
//! (`proxy-url`). Each leaf's `server` here is `<leaf>.behind-nat.invalid`, a name that resolves
//! nowhere, and only its proxy (the test kit's, `sandbox::leaf_proxy`) knows where that apiserver is:
//! so the virtual Node going Ready proves that the API client goes through the proxy, and every
//! kubectl session proves it for the stream client. leaf-1 is behind an HTTP CONNECT proxy with
//! Basic credentials, leaf-2 behind CONNECT over TLS that requires a client certificate (as a
//! konnectivity server in mTLS mode), leaf-3 behind SOCKS5 with user and password, leaf-4
//! behind a CONNECT proxy that the refusal test turns off and on.

use relaylet_dev::testkit as support;
use support::port_forward::PortForward;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use base64::Engine;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, PostParams};
use relaylet_dev::sandbox::leaf_proxy::{HTTP_PROXY_CREDENTIALS, LeafProxyKind};
use relaylet_dev::sandbox::{RELAYLET_NAMESPACE, Settings};
use support::{Env, RT, Run, describe, env, kubectls, text, wait_until};

/// Only turns a hang into a failure; nothing is measured against it.
const HANG: Duration = Duration::from_secs(60);

fn settings() -> Settings {
    Settings {
        leaves: ["leaf-1", "leaf-2", "leaf-3", "leaf-4"]
            .map(String::from)
            .to_vec(),
        leaf_proxies: BTreeMap::from([
            ("leaf-1".to_string(), LeafProxyKind::Http),
            ("leaf-2".to_string(), LeafProxyKind::Https),
            ("leaf-3".to_string(), LeafProxyKind::Socks5),
            ("leaf-4".to_string(), LeafProxyKind::Http),
        ]),
        metrics_resolution: None,
        ..Settings::default()
    }
}

fn e() -> &'static Env {
    env(settings)
}

/// The newest kubectl (WebSocket first) and the oldest (SPDY only).
fn two_kubectls() -> Vec<relaylet_sim::tools::Kubectl> {
    let all = kubectls();
    vec![all[0].clone(), all[all.len() - 1].clone()]
}

#[test]
fn exec_logs_and_port_forward_work_through_every_kind_of_proxy() {
    let e = e();
    for (leaf, pod) in [
        ("leaf-1", "demo-1"),
        ("leaf-2", "demo-2"),
        ("leaf-3", "demo-3"),
    ] {
        let before = e.sandbox.proxies[leaf].tunnels();
        for k in two_kubectls() {
            let out = Run::new(
                &k,
                &e.kubeconfig,
                &[
                    "exec",
                    "-i",
                    pod,
                    "--",
                    "sh",
                    "-c",
                    "cat; echo done; exit 3",
                ],
            )
            .stdin(b"through the proxy\n")
            .output();
            let what = format!("{leaf}: {}", describe(&k, &out));
            assert_eq!(text(&out.stdout), "through the proxy\ndone\n", "{what}");
            assert_eq!(out.status.code(), Some(3), "{what}");

            let out = Run::new(&k, &e.kubeconfig, &["logs", pod, "--tail=1"]).output();
            assert!(
                text(&out.stdout).starts_with(&format!("{pod} tick ")),
                "{leaf}: {}",
                describe(&k, &out)
            );
            assert_eq!(port_forward_get(&k, e, pod), format!("hello from {pod}\n"));
        }
        assert!(
            e.sandbox.proxies[leaf].tunnels() > before,
            "{leaf}: the sessions opened no tunnel through the proxy"
        );
    }
}

/// `kubectl logs -f` streams through the proxy as lines come.
#[test]
fn logs_follow_streams_through_a_proxy() {
    let e = e();
    let k = kubectls().pop().unwrap();
    let mut cmd = Run::new(&k, &e.kubeconfig, &["logs", "-f", "demo-2"]).command();
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null());
    let mut child = cmd.spawn().expect("kubectl logs -f runs");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut ticks = Vec::new();
    for _ in 0..3 {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        ticks.push(line);
    }
    let _ = child.kill();
    let _ = child.wait();
    // The demo pod prints a tick a second: three distinct lines arrived while following.
    assert!(
        ticks.iter().all(|l| l.starts_with("demo-2 tick ")),
        "{ticks:?}"
    );
}

/// Runs `kubectl port-forward` to `pod`'s port 8080 and GETs through it once: the body.
fn port_forward_get(k: &relaylet_sim::tools::Kubectl, e: &Env, pod: &str) -> String {
    let forward = PortForward::start(Run::new(
        k,
        &e.kubeconfig,
        &["port-forward", &format!("pod/{pod}"), ":8080"],
    ));
    let mut body = None;
    wait_until("the port-forward answers", HANG, || {
        body = forward.body().filter(|b| !b.is_empty());
        body.is_some()
    });
    body.unwrap_or_default()
}

/// The leaf's TLS runs end to end through the tunnel: every tunnel starts with a TLS handshake
/// record, and no request, path or credential of relaylet's crosses the proxy in plaintext.
#[test]
fn the_proxies_see_only_tls() {
    let e = e();
    // At least one session through each, so there is something to look at.
    for pod in ["demo-1", "demo-2", "demo-3"] {
        let k = kubectls().pop().unwrap();
        let out = Run::new(&k, &e.kubeconfig, &["exec", pod, "--", "true"]).output();
        assert_eq!(out.status.code(), Some(0), "{}", describe(&k, &out));
    }
    for leaf in ["leaf-1", "leaf-2", "leaf-3"] {
        let proxy = &e.sandbox.proxies[leaf];
        let first = proxy.first_bytes();
        assert!(!first.is_empty(), "{leaf}: no tunnel");
        for bytes in first {
            // 0x16 0x03: a TLS handshake record (the ClientHello).
            assert_eq!(&bytes[..2], &[0x16, 0x03], "{leaf}: {bytes:?}");
            let seen = String::from_utf8_lossy(&bytes);
            for plain in ["HTTP/1.1", "/api", "exec", "Authorization"] {
                assert!(!seen.contains(plain), "{leaf}: {plain:?} in {seen:?}");
            }
        }
    }
    // The HTTP proxy got the URL's credentials, percent-decoded, as Basic.
    let (user, password) = HTTP_PROXY_CREDENTIALS;
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let authorizations = e.sandbox.proxies["leaf-1"].authorizations();
    assert!(!authorizations.is_empty());
    assert!(
        authorizations
            .iter()
            .all(|a| *a == format!("Basic {basic}")),
        "{authorizations:?}"
    );
}

/// A proxy that refuses CONNECT (a konnectivity server with no agent for the leaf) is a kubectl
/// error naming the proxy and the leaf, never a hang or an exit 0; and the leaf comes back with
/// the proxy.
#[test]
fn a_refusing_proxy_is_an_error_naming_the_proxy_and_the_leaf() {
    let e = e();
    let proxy = &e.sandbox.proxies["leaf-4"];
    let k = kubectls().pop().unwrap();
    proxy.refuse(Some((503, "currently no tunnels available")));
    let out = Run::new(&k, &e.kubeconfig, &["exec", "demo-4", "--", "echo", "hi"]).output();
    let stderr = text(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{}", describe(&k, &out));
    let expected = format!(
        "proxy {} refused CONNECT to leaf-4's apiserver: 503 Refused: currently no tunnels available",
        proxy.addr
    );
    assert!(stderr.contains(&expected), "{}", describe(&k, &out));
    assert!(
        !stderr.contains("pa@ss") && !stderr.contains("pa%40ss"),
        "{stderr}"
    );

    proxy.refuse(None);
    let mut last = String::new();
    wait_until("exec through the proxy works again", HANG, || {
        let out = Run::new(&k, &e.kubeconfig, &["exec", "demo-4", "--", "echo", "back"]).output();
        last = describe(&k, &out);
        out.status.code() == Some(0) && text(&out.stdout) == "back\n"
    });
}

/// The control: the same leaf kubeconfig without `proxy-url` cannot reach the leaf, and says
/// why; with it, the same client works.
#[test]
fn without_its_proxy_url_the_leaf_is_unreachable_with_a_clear_error() {
    let e = e();
    RT.block_on(async {
        let kubeconfig = leaf_kubeconfig(e, "leaf-1").await;
        let proxy_line = kubeconfig
            .lines()
            .find(|l| l.trim_start().starts_with("proxy-url:"))
            .expect("the sandbox leaf Secret names a proxy")
            .to_string();
        let direct = kubeconfig.replace(&format!("{proxy_line}\n"), "");
        let metrics = relaylet::ops::Metrics::default();
        for (yaml, through_proxy) in [(&direct, false), (&kubeconfig, true)] {
            let leaf = relaylet::leaf::Leaf::from_kubeconfig("leaf-1", "n", yaml, &metrics, false)
                .await
                .unwrap();
            let got = leaf
                .client()
                .list_metadata::<Pod>(None, &ListParams::default())
                .await;
            if through_proxy {
                assert!(got.is_ok(), "{got:?}");
            } else {
                let err = relaylet::leaf::error_chain(&got.unwrap_err());
                assert!(
                    err.contains(
                        "cannot connect to leaf leaf-1's apiserver at leaf-1.behind-nat.invalid:"
                    ),
                    "{err}"
                );
            }
        }
    });
}

/// The leaf Secret's kubeconfig as the sandbox wrote it.
async fn leaf_kubeconfig(e: &Env, leaf: &str) -> String {
    let secrets: Api<Secret> = Api::namespaced(e.root_client().await, RELAYLET_NAMESPACE);
    let secret = secrets.get(&format!("leaf-{leaf}")).await.unwrap();
    String::from_utf8(secret.data.unwrap()["kubeconfig"].0.clone()).unwrap()
}

/// Creates a leaf Secret and returns the note of relaylet's refusal Event.
async fn refused(e: &Env, name: &str, kubeconfig: &str, keys: &[(&str, &[u8])]) -> String {
    let mut data = BTreeMap::from([(
        "kubeconfig".to_string(),
        ByteString(kubeconfig.as_bytes().to_vec()),
    )]);
    for (key, value) in keys {
        data.insert(key.to_string(), ByteString(value.to_vec()));
    }
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(RELAYLET_NAMESPACE.into()),
            labels: Some(BTreeMap::from([(
                "relaylet.io/leaf-cluster".to_string(),
                name.to_string(),
            )])),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    };
    let client = e.root_client().await;
    Api::<Secret>::namespaced(client.clone(), RELAYLET_NAMESPACE)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let events: Api<Event> = Api::namespaced(client, RELAYLET_NAMESPACE);
    tokio::time::timeout(HANG, async {
        loop {
            let list = events.list(&ListParams::default()).await.unwrap();
            if let Some(note) = list.items.into_iter().find_map(|ev| {
                (ev.regarding.as_ref()?.name.as_deref() == Some(name)
                    && ev.reason.as_deref() == Some("LeafSecretRefused"))
                .then(|| ev.note.unwrap_or_default())
            }) {
                return note;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no LeafSecretRefused Event on Secret {name}"))
}

/// A proxy's credentials follow the rules of every leaf credential: inline only. A `proxy-url`
/// that names a file (or any scheme but http, https and socks5) is refused, and so is an
/// https proxy without its CA in the Secret, or half a client certificate; nothing quotes the
/// URL's password.
#[test]
fn leaf_secret_rules_apply_to_the_proxy() {
    let e = e();
    RT.block_on(async {
        let kubeconfig = leaf_kubeconfig(e, "leaf-1").await;
        let proxy_line = kubeconfig
            .lines()
            .find(|l| l.trim_start().starts_with("proxy-url:"))
            .unwrap()
            .to_string();
        let with_proxy = |url: &str| kubeconfig.replace(&proxy_line, &format!("    proxy-url: \"{url}\""));

        let note = refused(e, "proxy-file", &with_proxy("file:///var/run/secrets/canary"), &[]).await;
        assert_eq!(
            note,
            "kubeconfig cluster \"leaf-1\": proxy-url is not allowed in a leaf Secret (only http://, https:// and socks5:// proxies are supported); leaf Secrets carry inline credentials only"
        );
        let note = refused(e, "proxy-no-ca", &with_proxy("https://u:canary@127.0.0.1:1"), &[]).await;
        assert!(note.contains("needs the CA that verifies it"), "{note}");
        assert!(!note.contains("canary"), "{note}");
        let note = refused(
            e,
            "proxy-half-cert",
            &with_proxy("https://127.0.0.1:1"),
            &[("proxy-ca.crt", e.sandbox.root.ca.cert_pem().as_bytes()), ("proxy-client.crt", e.sandbox.root.ca.cert_pem().as_bytes())],
        )
        .await;
        assert!(note.contains("give both or neither"), "{note}");
        for name in ["proxy-file", "proxy-no-ca", "proxy-half-cert"] {
            assert!(e.sandbox.relaylet.registry.by_node(&format!("relaylet-{name}")).is_none());
        }
    });
}
