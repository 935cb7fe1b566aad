//! relaylet's kubelet port is at least as closed as a real kubelet's: every caller authenticates
//! (client certificate from the root's client CA, or a bearer token via TokenReview), every call
//! is authorized with a SubjectAccessReview, streaming calls need `create` whatever the method,
//! the serving certificate rotates without a restart, and hostile input gets a clear answer.

use relaylet_dev::testkit as support;

use std::time::Duration;

use relaylet_dev::sandbox::Settings;
use relaylet_sim::apiserver::{Rule, UserInfo};
use relaylet_sim::tls::{Ca, Identity};
use support::raw_http::{WS_V4_UPGRADE, get_head};
use support::{Env, RT, env};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

fn settings() -> Settings {
    Settings {
        root_rules: vec![
            Rule::user("viewer")
                .verbs(&["get"])
                .api_groups(&[""])
                .resources(&["nodes/proxy"]),
            Rule::user("operator")
                .verbs(&["get", "create"])
                .api_groups(&[""])
                .resources(&["nodes/proxy"]),
            // Fine-grained kubelet authorization (1.36): healthz and pods on their own ...
            Rule::user("prober")
                .verbs(&["get"])
                .api_groups(&[""])
                .resources(&["nodes/healthz", "nodes/pods"]),
            // ... or through nodes/proxy, the fallback older RBAC relies on.
            Rule::user("legacy-monitor")
                .verbs(&["get"])
                .api_groups(&[""])
                .resources(&["nodes/proxy"]),
            Rule::user("config-reader")
                .verbs(&["get"])
                .api_groups(&[""])
                .resources(&["nodes/configz"]),
            // A group rule: every authenticated user, certificate or token, may read metrics.
            Rule::group("system:authenticated")
                .verbs(&["get"])
                .api_groups(&[""])
                .resources(&["nodes/metrics"]),
        ],
        root_tokens: vec![
            ("viewer-token".into(), UserInfo::new("viewer", &[])),
            ("operator-token".into(), UserInfo::new("operator", &[])),
        ],
        ..Settings::default()
    }
}

/// Only turns a hang into a failure; nothing is measured against it.
const HANG: Duration = Duration::from_secs(60);

/// The `metav1.Status` body of an answer read by [`request`].
fn status_body(answer: &str) -> serde_json::Value {
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body)
        .unwrap_or_else(|| panic!("no body: {answer}"));
    serde_json::from_str(body).unwrap_or_else(|err| panic!("a Status body: {err}: {answer}"))
}

/// Asserts that `answer` is a Failure Status with exactly `code`, `reason` and `message`.
#[track_caller]
fn assert_status(answer: &str, code: u16, reason: &str, message: &str) {
    let status = status_body(answer);
    assert_eq!(
        (
            status["kind"].as_str(),
            status["status"].as_str(),
            status["code"].as_u64(),
            status["reason"].as_str(),
            status["message"].as_str(),
        ),
        (
            Some("Status"),
            Some("Failure"),
            Some(u64::from(code)),
            Some(reason),
            Some(message),
        ),
        "{answer}"
    );
}

/// A TLS connection to relaylet trusting the root CA (which signed its serving certificate).
async fn connect(e: &Env, identity: Option<&Identity>) -> std::io::Result<TlsStream<TcpStream>> {
    e.connect_kubelet_api(identity).await
}

/// Sends a raw HTTP/1.1 request and reads the whole answer (the server closes or the body ends).
async fn request(tls: &mut TlsStream<TcpStream>, head: &str) -> (u16, String) {
    let (code, text, _) = request_keeping_rest(tls, head).await;
    (code, text)
}

/// Like [`request`]; after a 101 also returns the bytes that arrived behind the response head
/// (the first frames of the upgraded protocol may come in the same read).
async fn request_keeping_rest(
    tls: &mut TlsStream<TcpStream>,
    head: &str,
) -> (u16, String, Vec<u8>) {
    tls.write_all(head.as_bytes()).await.unwrap();
    tls.flush().await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        // The bound only turns a hang into a failure: every answer ends (a close, a complete
        // body or a 101) long before it.
        let read = tokio::time::timeout(HANG, tls.read(&mut chunk))
            .await
            .unwrap_or_else(|_| panic!("no end of the answer within {HANG:?}: {buf:?}"));
        match read {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if let Some(end) = find(&buf, b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                    if head.starts_with("http/1.1 101") {
                        break;
                    }
                    let length = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse::<usize>().ok());
                    if length.is_some_and(|len| buf.len() >= end + 4 + len) {
                        break;
                    }
                }
            }
        }
    }
    let rest = find(&buf, b"\r\n\r\n")
        .map(|end| buf[end + 4..].to_vec())
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, text, rest)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A TLS connection to virtual node `node`'s own kubelet port (node-level paths are served
/// there), presenting `identity` if given.
async fn connect_node(
    e: &Env,
    node: &str,
    identity: Option<&Identity>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let port = e
        .sandbox
        .relaylet
        .node_ports
        .addr_of(node)
        .expect("the node's own kubelet port");
    let tcp = TcpStream::connect(port).await?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("server name");
    tokio_rustls::TlsConnector::from(e.kubelet_api_tls(identity))
        .connect(name, tcp)
        .await
}

fn get(path: &str, extra: &str) -> String {
    get_head(path, &format!("Connection: close\r\n{extra}"))
}

fn ws_exec(token: &str) -> String {
    get_head(
        "/exec/default/demo-1/main?command=echo&command=hi&output=1",
        &format!("Authorization: Bearer {token}\r\n{WS_V4_UPGRADE}"),
    )
}

/// What a caller without a certificate or token is told (token review is on in the sandbox).
const NO_CREDENTIALS: &str = "no credentials: present a client certificate signed by the root cluster's client CA or a bearer token";

#[test]
fn no_credentials_is_401() {
    let e = env(settings);
    RT.block_on(async {
        let mut tls = connect(e, None).await.unwrap();
        let (code, body) = request(
            &mut tls,
            &get("/exec/default/demo-1/main?command=true&output=1", ""),
        )
        .await;
        assert_eq!(code, 401, "{body}");
        assert_status(&body, 401, "Unauthorized", NO_CREDENTIALS);
        // /healthz too, like a kubelet's (the pod's probes use the metrics port).
        let mut tls = connect(e, None).await.unwrap();
        let (code, body) = request(&mut tls, &get("/healthz", "")).await;
        assert_eq!(code, 401, "{body}");
        assert_status(&body, 401, "Unauthorized", NO_CREDENTIALS);
    });
}

#[test]
fn a_certificate_from_another_ca_fails_the_handshake() {
    let e = env(settings);
    RT.block_on(async {
        let stranger = Ca::new("someone-else").unwrap();
        let id = stranger
            .issue_client("kube-apiserver-kubelet-client", &["system:masters"])
            .unwrap();
        let result = async {
            let mut tls = connect(e, Some(&id)).await?;
            // TLS 1.3 reports a rejected client certificate on the first read.
            tls.write_all(get("/healthz", "").as_bytes()).await?;
            let mut buf = [0u8; 64];
            tls.read(&mut buf).await
        }
        .await;
        // The server's verifier does not know the issuer: a fatal `unknown_ca` alert.
        let err = result.expect_err("a foreign client certificate must not get through");
        let alert = err
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .cloned();
        assert_eq!(
            alert,
            Some(rustls::Error::AlertReceived(
                rustls::AlertDescription::UnknownCA
            )),
            "{err:?}"
        );
    });
}

#[test]
fn a_valid_certificate_without_rbac_is_403_naming_user_verb_and_resource() {
    let e = env(settings);
    RT.block_on(async {
        let id = e
            .sandbox
            .root
            .ca
            .issue_client("eve", &["developers"])
            .unwrap();
        let mut tls = connect(e, Some(&id)).await.unwrap();
        let (code, body) = request(&mut tls, &get("/containerLogs/default/demo-1/main", "")).await;
        assert_eq!(code, 403, "{body}");
        // containerLogs answers in the kubelet's plain text: the Status message alone.
        assert_eq!(
            body.split_once("\r\n\r\n").map(|(_, b)| b),
            Some("user \"eve\" cannot get resource \"nodes/proxy\""),
            "{body}"
        );
    });
}

#[test]
fn get_nodes_proxy_is_not_enough_to_exec_over_websocket() {
    let e = env(settings);
    RT.block_on(async {
        // Logs are a GET: the viewer may read them ...
        let mut tls = connect(e, None).await.unwrap();
        let (code, body) = request(
            &mut tls,
            &get(
                "/containerLogs/default/demo-1/main?tailLines=1",
                "Authorization: Bearer viewer-token\r\n",
            ),
        )
        .await;
        assert_eq!(code, 200, "{body}");
        // ... but a WebSocket exec, also a GET, needs create.
        let mut tls = connect(e, None).await.unwrap();
        let (code, body) = request(&mut tls, &ws_exec("viewer-token")).await;
        assert_eq!(code, 403, "{body}");
        assert_status(
            &body,
            403,
            "Forbidden",
            "user \"viewer\" cannot create resource \"nodes/proxy\"",
        );
        // An unknown token is 401.
        let mut tls = connect(e, None).await.unwrap();
        let (code, body) = request(&mut tls, &ws_exec("made-up-token")).await;
        assert_eq!(code, 401, "{body}");
        assert_status(
            &body,
            401,
            "Unauthorized",
            "the bearer token was not accepted by the root cluster (TokenReview)",
        );
    });
}

#[test]
fn an_allowed_token_execs_over_websocket() {
    use futures::StreamExt;
    let e = env(settings);
    RT.block_on(async {
        let mut tls = connect(e, None).await.unwrap();
        let (code, head, rest) = request_keeping_rest(&mut tls, &ws_exec("operator-token")).await;
        assert_eq!(code, 101, "{head}");
        assert!(
            head.to_lowercase()
                .contains("sec-websocket-protocol: v4.channel.k8s.io"),
            "{head}"
        );
        let mut ws = tokio_tungstenite::WebSocketStream::from_partially_read(
            tls,
            rest,
            tokio_tungstenite::tungstenite::protocol::Role::Client,
            None,
        )
        .await;
        let mut stdout = Vec::new();
        let mut status = String::new();
        while let Some(Ok(msg)) = tokio::time::timeout(HANG, ws.next())
            .await
            .expect("the exec ends")
        {
            let data = msg.into_data();
            match data.first() {
                Some(1) => stdout.extend_from_slice(&data[1..]),
                Some(3) => status.push_str(&String::from_utf8_lossy(&data[1..])),
                _ => {}
            }
        }
        assert_eq!(stdout, b"hi\n");
        assert!(status.contains("\"Success\""), "{status}");
    });
}

#[test]
fn a_rotated_serving_certificate_is_served_on_the_next_handshake() {
    let e = env(settings);
    RT.block_on(async {
        let served =
            |tls: &TlsStream<TcpStream>| tls.get_ref().1.peer_certificates().unwrap()[0].clone();
        let before = served(&connect(e, None).await.unwrap());
        let fresh = e.sandbox.root.ca.issue_server(&["127.0.0.1"]).unwrap();
        // Rotate like cert-manager: write the new pair in place.
        std::fs::write(e.sandbox.files().join("tls.key"), &fresh.key_pem).unwrap();
        std::fs::write(e.sandbox.files().join("tls.crt"), &fresh.cert_pem).unwrap();
        let after = served(&connect(e, None).await.unwrap());
        assert_ne!(before, after);
        assert_eq!(after, fresh.cert_der);
    });
}

#[test]
fn hostile_requests_get_clear_answers_and_the_server_stays_up() {
    let e = env(settings);
    let admin = e.kubelet_client_identity();
    RT.block_on(async {
        let ask = |head: String| {
            let admin = admin.clone();
            async move {
                let mut tls = connect(e, Some(&admin)).await.unwrap();
                request(&mut tls, &head).await
            }
        };
        // 10,000 command arguments: a 100 KB URI, refused by the HTTP layer (URIs are capped at
        // 64 KiB) before anything is parsed.
        let many = "command=x&".repeat(10_000);
        let (code, body) = ask(get(
            &format!("/exec/default/demo-1/main?{many}output=1"),
            "",
        ))
        .await;
        assert_eq!(code, 414, "{body}");
        // 5,000 fit in a URI and, like on a kubelet, are not refused for their number: the call
        // gets as far as the upgrade check.
        let many = "command=x&".repeat(5_000);
        let (code, body) = ask(get(
            &format!("/exec/default/demo-1/main?{many}output=1"),
            "",
        ))
        .await;
        assert_eq!(code, 400, "{body}");
        assert!(body.contains("needs a streaming upgrade"), "{body}");
        // A 100 KiB header: within what the HTTP layer reads (128 KiB), over the 64 KiB the
        // header lines may add up to.
        let (code, body) = ask(get(
            "/healthz",
            &format!("X-Big: {}\r\n", "a".repeat(100 * 1024)),
        ))
        .await;
        assert_eq!(code, 431, "{body}");
        // Each header counts name + value + 4: host, connection and x-big.
        let bytes = (4 + 8 + 4) + (10 + 5 + 4) + (5 + 100 * 1024 + 4);
        assert_status(
            &body,
            431,
            "Unknown",
            &format!("request headers are {bytes} bytes; at most 65536 allowed"),
        );
        // A 200 KiB header, over what the HTTP layer reads: hyper's own bare 431, or, when
        // the server closes with the rest of the head unread, a reset that loses it.
        let big = get(
            "/healthz",
            &format!("X-Big: {}\r\n", "a".repeat(200 * 1024)),
        );
        match raw_answer(e, &admin, &big).await {
            Ok(answer) => assert!(
                answer.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
                "{answer}"
            ),
            Err(err) => assert!(
                matches!(
                    err.kind(),
                    std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
                ),
                "{err:?}"
            ),
        }
        // 500 headers: more than the 100 the HTTP layer parses, in one small head it reads
        // whole, so always its bare 431.
        let headers: String = (0..500).map(|i| format!("X-H{i}: v\r\n")).collect();
        let answer = raw_answer(e, &admin, &get("/healthz", &headers))
            .await
            .expect("an answer");
        assert!(
            answer.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
            "{answer}"
        );
        // Path tricks.
        for path in [
            "/exec/default/..%2F..%2Fetc/main?command=ls&output=1",
            "/exec/default/demo-1/%2E%2E?command=ls&output=1",
            "/containerLogs/default/demo-1",
        ] {
            let (code, body) = ask(get(path, "")).await;
            assert_eq!(code, 400, "{path}: {body}");
        }
        let (code, _) = ask(get("/healthz", "")).await;
        assert_eq!(code, 200, "still serving");
    });
}

/// Sends `head` and reads until the server closes; the error if the connection fails.
async fn raw_answer(e: &Env, identity: &Identity, head: &str) -> std::io::Result<String> {
    let mut tls = connect(e, Some(identity)).await?;
    tls.write_all(head.as_bytes()).await?;
    tls.flush().await?;
    let mut answer = Vec::new();
    tokio::time::timeout(HANG, tls.read_to_end(&mut answer))
        .await
        .expect("the server closes")?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

/// Random paths, queries and headers never crash a connection: every request gets a status line.
#[test]
fn random_requests_always_get_an_answer() {
    let e = env(settings);
    let admin = e.kubelet_client_identity();
    let mut seed: u64 = 0x5eed_1234_abcd_0001;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    const PIECES: [&str; 16] = [
        "exec",
        "attach",
        "portForward",
        "containerLogs",
        "default",
        "demo-1",
        "main",
        "%00",
        "%2F",
        "..",
        "",
        "a.b",
        "%ff",
        "UPPER",
        "x-y",
        "🙂",
    ];
    const KEYS: [&str; 10] = [
        "command",
        "input",
        "output",
        "tty",
        "port",
        "tailLines",
        "follow",
        "sinceTime",
        "limitBytes",
        "tail",
    ];
    RT.block_on(async {
        for case in 0..150 {
            let segments = 1 + next() % 5;
            let mut path = String::new();
            for _ in 0..segments {
                path.push('/');
                path.push_str(PIECES[(next() % PIECES.len() as u64) as usize]);
            }
            let mut query = String::new();
            for _ in 0..(next() % 6) {
                query.push_str(&format!("{}={}&", KEYS[(next() % KEYS.len() as u64) as usize], PIECES[(next() % PIECES.len() as u64) as usize]));
            }
            let extra = if next() % 2 == 0 { "Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n" } else { "" };
            let head = get(&format!("{path}?{query}"), extra).replace("Connection: close\r\n", if extra.is_empty() { "Connection: close\r\n" } else { "" });
            let mut tls = connect(e, Some(&admin)).await.unwrap();
            let (code, body) = request(&mut tls, &head).await;
            // Only the answers relaylet gives on purpose: a 101, a 200 (logs), a refusal of the
            // request, or the pod's absence; never a 500 or a closed connection. Every refusal
            // is a Status whose code and reason agree with the HTTP status (containerLogs
            // answers in the kubelet's plain text instead).
            assert!(
                [101, 200, 400, 403, 404, 405, 414].contains(&code),
                "case {case} {head:?}: {code} {body}"
            );
            if code >= 400 && !path.starts_with("/containerLogs") {
                let status = status_body(&body);
                let reason = match code {
                    400 => "BadRequest",
                    403 => "Forbidden",
                    404 => "NotFound",
                    405 => "MethodNotAllowed",
                    _ => "RequestEntityTooLarge",
                };
                assert_eq!(
                    (status["code"].as_u64(), status["reason"].as_str()),
                    (Some(u64::from(code)), Some(reason)),
                    "case {case} {head:?}: {body}"
                );
            }
        }
        let mut tls = connect(e, Some(&admin)).await.unwrap();
        assert_eq!(request(&mut tls, &get("/healthz", "")).await.0, 200);
    });
}

/// A client that opens a connection and dribbles (or sends nothing) is cut by the server (the
/// handshake or header timeout), without holding anything else up. The 60 s bounds only stop
/// a failing test; what is asserted is the server's close.
#[test]
fn slow_clients_are_cut() {
    let e = env(settings);
    RT.block_on(async {
        let silent = async {
            let mut tcp = TcpStream::connect(e.sandbox.relaylet.addr).await.unwrap();
            let mut buf = [0u8; 16];
            tokio::time::timeout(Duration::from_secs(60), tcp.read(&mut buf)).await
        };
        let dribbling = async {
            let mut tls = connect(e, None).await.unwrap();
            tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                .await
                .unwrap();
            let mut buf = [0u8; 256];
            // One header byte per second, each well within any per-read timeout, until the
            // server ends the connection (true) or 60 bytes went unanswered (false).
            for _ in 0..60 {
                if tls.write_all(b"X").await.is_err() {
                    return true;
                }
                // A close, or an error answer (408) before it.
                if tokio::time::timeout(Duration::from_secs(1), tls.read(&mut buf))
                    .await
                    .is_ok()
                {
                    return true;
                }
            }
            false
        };
        let (silent, dribbler_cut) = tokio::join!(silent, dribbling);
        assert!(
            matches!(silent, Ok(Ok(0)) | Ok(Err(_))),
            "silent connection closed: {silent:?}"
        );
        assert!(dribbler_cut, "a dribbling client was never cut");
        // Meanwhile, normal callers are served.
        let admin = e.kubelet_client_identity();
        let mut tls = connect(e, Some(&admin)).await.unwrap();
        assert_eq!(request(&mut tls, &get("/healthz", "")).await.0, 200);
    });
}

/// A caller without rights learns nothing about pods: whether the pod exists, its UID or its
/// node, the answer is the same 403 (the kubelet authorizes before it looks anything up).
#[test]
fn a_caller_without_rights_learns_nothing_about_pods() {
    let e = env(settings);
    let nobody = e
        .sandbox
        .root
        .ca
        .issue_client("nobody", &["outsiders"])
        .unwrap();
    RT.block_on(async {
        let spdy = "Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n";
        let mut answers = Vec::new();
        for path in [
            "/exec/default/demo-1/main?command=true&output=1",
            "/exec/default/no-such-pod/main?command=true&output=1",
            "/exec/default/demo-1/00000000-0000-0000-0000-000000000000/main?command=true&output=1",
            "/exec/kube-system/not-on-a-virtual-node/main?command=true&output=1",
        ] {
            let mut tls = connect(e, Some(&nobody)).await.unwrap();
            let (code, body) = request(&mut tls, &get(path, spdy)).await;
            assert_eq!(code, 403, "{path}: {body}");
            answers.push(body);
        }
        for body in &answers[1..] {
            assert_eq!(
                status_body(body),
                status_body(&answers[0]),
                "every refusal reads the same"
            );
        }
        // Names no node and no UID.
        assert_status(
            &answers[0],
            403,
            "Forbidden",
            "user \"nobody\" cannot create resource \"nodes/proxy\"",
        );
    });
}

/// Methods the kubelet does not serve are a 405 Status before anything reaches the leaf; an
/// upgrade over HTTP/1.0 is a 400; axum's own 405 has a Status body too.
#[test]
fn unserved_methods_and_http_1_0_upgrades_are_refused_with_a_status() {
    let e = env(settings);
    let admin = e.kubelet_client_identity();
    RT.block_on(async {
        let ask = |head: String| {
            let admin = admin.clone();
            async move {
                let mut tls = connect(e, Some(&admin)).await.unwrap();
                request(&mut tls, &head).await
            }
        };
        for (path, allowed) in [
            ("/exec/default/demo-1/main?command=ls&output=1", "GET or POST"),
            ("/attach/default/demo-1/main?output=1", "GET or POST"),
            ("/portForward/default/demo-1?port=8080", "GET or POST"),
            ("/containerLogs/default/demo-1/main", "GET"),
        ] {
            for method in ["PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT"] {
                let head = get(path, "Content-Length: 0\r\n").replacen("GET", method, 1);
                let (code, body) = ask(head).await;
                assert_eq!(code, 405, "{method} {path}: {body}");
                // A Status for the upgrade calls; the kubelet's plain text for containerLogs,
                // which the root apiserver shows as the message.
                let form_ok = if path.starts_with("/containerLogs") {
                    body.contains("content-type: text/plain") && !body.contains("\"kind\"")
                } else {
                    body.contains("\"kind\":\"Status\"")
                        && body.contains("\"reason\":\"MethodNotAllowed\"")
                };
                assert!(
                    form_ok && body.contains(&format!("{method} is not served")),
                    "{method} {path}: {body}"
                );
                assert!(body.contains(&format!("use {allowed}")), "{body}");
            }
            let (code, _) = ask(get(path, "").replacen("GET", "HEAD", 1)).await;
            assert_eq!(code, 405, "HEAD {path}");
        }
        // axum's routing 405.
        let (code, body) = ask(get("/healthz", "Content-Length: 0\r\n").replacen("GET", "POST", 1)).await;
        assert_eq!(code, 405, "{body}");
        assert!(body.contains("\"kind\":\"Status\""), "{body}");
        // Authentication comes before routing, as in the kubelet's filter chain: a caller
        // without credentials learns nothing of the routes.
        let mut stranger = connect(e, None).await.unwrap();
        let (code, body) = request(
            &mut stranger,
            &get("/healthz", "Content-Length: 0\r\n").replacen("GET", "POST", 1),
        )
        .await;
        assert_eq!(code, 401, "{body}");
        assert!(body.contains("\"reason\":\"Unauthorized\""), "{body}");
        // An upgrade HTTP/1.0 cannot carry.
        let head = get(
            "/exec/default/demo-1/main?command=ls&output=1",
            "Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n",
        )
        .replace("HTTP/1.1", "HTTP/1.0")
        .replace("Connection: close\r\n", "");
        let (code, body) = ask(head).await;
        assert_eq!(code, 400, "{body}");
        assert!(body.contains("HTTP/1.1"), "{body}");
    });
}

/// Certificate callers are in `system:authenticated`, like token callers: a group rule applies
/// to both.
#[test]
fn certificate_callers_get_group_rules_for_system_authenticated() {
    let e = env(settings);
    RT.block_on(async {
        let eve = e
            .sandbox
            .root
            .ca
            .issue_client("eve", &["developers"])
            .unwrap();
        // Node-level paths are served on each virtual node's own port.
        let mut tls = connect_node(e, "relaylet-leaf-1", Some(&eve))
            .await
            .unwrap();
        let (code, body) = request(&mut tls, &get("/metrics", "")).await;
        assert_eq!(code, 200, "{body}");
        assert!(body.contains("# TYPE relaylet_"), "{body}");
    });
}

/// Node-level paths are authorized like a 1.36 kubelet's (`KubeletFineGrainedAuthz`, GA):
/// `/healthz` needs `nodes/healthz` and `/pods` `nodes/pods`, each with `nodes/proxy` as the
/// fallback; a neighbouring fine-grained right (`nodes/configz`) does not open them.
#[test]
fn node_paths_are_authorized_fine_grained_with_the_proxy_fallback() {
    let e = env(settings);
    RT.block_on(async {
        let ask = |user: &'static str, path: &'static str| async move {
            let id = e.sandbox.root.ca.issue_client(user, &[]).unwrap();
            let mut tls = connect_node(e, "relaylet-leaf-1", Some(&id)).await.unwrap();
            request(&mut tls, &get(path, "")).await
        };
        for user in ["prober", "legacy-monitor"] {
            for path in ["/healthz", "/pods"] {
                let (code, body) = ask(user, path).await;
                assert_eq!(code, 200, "{user} {path}: {body}");
            }
        }
        for path in ["/healthz", "/pods"] {
            let (code, body) = ask("config-reader", path).await;
            assert_eq!(code, 403, "{path}: {body}");
            let sub = &path[1..];
            assert!(
                body.contains(&format!(
                    "cannot get resource \\\"nodes/{sub}\\\" or \\\"nodes/proxy\\\""
                )),
                "{body}"
            );
        }
        // /healthz on the shared port, which serves both virtual nodes: against every node.
        let id = e.sandbox.root.ca.issue_client("prober", &[]).unwrap();
        let mut tls = connect(e, Some(&id)).await.unwrap();
        let (code, body) = request(&mut tls, &get("/healthz", "")).await;
        assert_eq!(code, 200, "{body}");
    });
}

/// A certificate with two CNs is refused: Go's x509 (the root apiserver) reads the last as the
/// user, another parser the first, and two readers must never see two users. Here the first
/// CN has rights and the last has none.
#[test]
fn a_certificate_with_two_common_names_is_refused() {
    let e = env(settings);
    let two = e
        .sandbox
        .root
        .ca
        .issue_client_with_names(&["operator", "nobody"], &[])
        .unwrap();
    RT.block_on(async {
        let mut tls = connect(e, Some(&two)).await.unwrap();
        let (code, body) = request(
            &mut tls,
            &get("/containerLogs/default/demo-1/main?tailLines=1", ""),
        )
        .await;
        assert_eq!(code, 401, "{body}");
        assert!(
            body.contains("more than one common name (CN): which one is the user is ambiguous"),
            "{body}"
        );
    });
}

/// The node-level paths of the shared port say nothing before authorization, not even how many
/// virtual nodes there are.
#[test]
fn node_paths_on_the_shared_port_say_nothing_before_authorization() {
    let e = env(settings);
    let nobody = e
        .sandbox
        .root
        .ca
        .issue_client("nobody", &["outsiders"])
        .unwrap();
    RT.block_on(async {
        // (`/metrics` is not among them: every authenticated user may read it here.)
        for path in ["/pods", "/stats/summary", "/healthz"] {
            let mut tls = connect(e, Some(&nobody)).await.unwrap();
            let (code, body) = request(&mut tls, &get(path, "")).await;
            assert_eq!(code, 403, "{path}: {body}");
            assert!(!body.contains("virtual nodes"), "{path}: {body}");
        }
    });
}

/// On a virtual node's own port only that node's pods exist, as on a kubelet: a pod of the
/// other virtual node gets the same 404 as a pod that does not exist, even for the root
/// apiserver's own identity (which is what its node proxy calls with). And looking up pods the
/// node does not run costs the root apiserver nothing.
#[test]
fn a_nodes_port_serves_only_its_own_pods_and_unknown_pods_cost_nothing() {
    let e = env(settings);
    let admin = e.kubelet_client_identity();
    RT.block_on(async {
        let logs = |pod: &str| {
            get(
                &format!("/containerLogs/default/{pod}/main?tailLines=1"),
                "",
            )
        };
        let mut tls = connect_node(e, "relaylet-leaf-1", Some(&admin))
            .await
            .unwrap();
        let (code, body) = request(&mut tls, &logs("demo-1")).await;
        assert_eq!(code, 200, "its own pod: {body}");

        // (Only the pods asked about: the sandbox's relaylet reads its own pods meanwhile.)
        let gets = || {
            ["demo-2", "ghost-1", "ghost-2", "ghost-3"]
                .into_iter()
                .map(|pod| {
                    e.sandbox
                        .root
                        .api
                        .requests("GET", &format!("/api/v1/namespaces/default/pods/{pod}"))
                })
                .sum::<u64>()
        };
        let before = gets();
        let asks: Vec<_> = ["demo-2", "ghost-1", "ghost-2", "ghost-3"]
            .into_iter()
            .map(|pod| {
                let admin = admin.clone();
                tokio::spawn(async move {
                    let mut tls = connect_node(e, "relaylet-leaf-1", Some(&admin))
                        .await
                        .unwrap();
                    let (code, body) = request(&mut tls, &logs(pod)).await;
                    (pod, code, body)
                })
            })
            .collect();
        for ask in asks {
            let (pod, code, body) = ask.await.unwrap();
            assert_eq!(code, 404, "{pod}: {body}");
            // containerLogs refusals are the kubelet's plain text.
            assert!(
                body.contains(&format!(
                    "pod default/{pod} does not exist on node relaylet-leaf-1"
                )),
                "{pod}: {body}"
            );
        }
        assert_eq!(
            gets() - before,
            0,
            "no pod was fetched from the root apiserver"
        );
        // The other node's port serves it.
        let mut tls = connect_node(e, "relaylet-leaf-2", Some(&admin))
            .await
            .unwrap();
        let (code, body) = request(&mut tls, &logs("demo-2")).await;
        assert_eq!(code, 200, "{body}");
    });
}
