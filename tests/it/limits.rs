//! Connection and session caps: past them a caller gets a 503 `metav1.Status` naming the cap,
//! and relaylet keeps serving everyone else.

use relaylet_dev::testkit as support;

use std::collections::BTreeMap;
use std::time::Duration;

use relaylet_dev::sandbox::Settings;
use support::{RT, env};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

fn settings() -> Settings {
    Settings {
        env: BTreeMap::from([
            ("MAX_CONNECTIONS_PER_CLIENT".to_string(), "6".to_string()),
            ("MAX_SESSIONS".to_string(), "2".to_string()),
            ("MAX_LOG_STREAMS".to_string(), "3".to_string()),
            ("MAX_LOG_STREAMS_PER_USER".to_string(), "2".to_string()),
            // The calls here are all in one namespace: its share is the whole (the shares
            // have tests/it/namespace_caps.rs).
            ("MAX_SESSIONS_PER_NAMESPACE".to_string(), "2".to_string()),
            ("MAX_LOG_STREAMS_PER_NAMESPACE".to_string(), "3".to_string()),
        ]),
        ..Settings::default()
    }
}

async fn connect(e: &support::Env) -> TlsStream<TcpStream> {
    e.connect_kubelet_api(Some(&e.kubelet_client_identity()))
        .await
        .unwrap()
}

/// Only turns a hang into a failure; nothing is measured against it.
const HANG: Duration = Duration::from_secs(60);

/// Sends `head` and returns the response head (and whatever body arrived with it).
async fn send(tls: &mut TlsStream<TcpStream>, head: &str) -> String {
    tls.write_all(head.as_bytes())
        .await
        .expect("send the request");
    let mut buf = vec![0u8; 8192];
    let n = tokio::time::timeout(HANG, tls.read(&mut buf))
        .await
        .expect("an answer")
        .unwrap_or(0);
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// Asserts that `answer` is a 503 whose Status body says exactly `message`.
#[track_caller]
fn assert_503(answer: &str, message: &str) {
    assert!(
        answer.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{answer}"
    );
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    let status: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|err| panic!("a Status: {err}: {answer}"));
    assert_eq!(
        (
            status["code"].as_u64(),
            status["reason"].as_str(),
            status["message"].as_str()
        ),
        (Some(503), Some("ServiceUnavailable"), Some(message)),
        "{answer}"
    );
}

/// Sends `head` on fresh connections until the answer starts with `expected` (a slot freed
/// by a close is seen once relaylet has noticed the close); the answer.
async fn until_answered(e: &support::Env, head: &str, expected: &str) -> String {
    let tries = async {
        loop {
            let mut tls = connect(e).await;
            let answer = send(&mut tls, head).await;
            if answer.starts_with(expected) {
                return answer;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(HANG, tries)
        .await
        .unwrap_or_else(|_| panic!("never answered {expected:?}"))
}

const HEALTH: &str = "GET /healthz HTTP/1.1\r\nHost: relaylet\r\n\r\n";

fn ws_exec(command: &str) -> String {
    support::raw_http::get_head(
        &format!("/exec/default/demo-1/main?command=sh&command=-c&command={command}&output=1"),
        support::raw_http::WS_V4_UPGRADE,
    )
}

/// The tests count against shared caps (connections from one address): one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn caps_answer_503_and_relaylet_stays_up() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let e = env(settings);
    RT.block_on(async {
        // Connections from one client address.
        let mut held = Vec::new();
        for _ in 0..6 {
            let mut tls = connect(e).await;
            assert!(send(&mut tls, HEALTH).await.starts_with("HTTP/1.1 200"));
            held.push(tls);
        }
        let mut extra = connect(e).await;
        let answer = send(&mut extra, HEALTH).await;
        assert_503(
            &answer,
            "127.0.0.1 has its maximum of 6 open connections (MAX_CONNECTIONS_PER_CLIENT); try again later",
        );
        // Closing them frees the slots.
        drop(held);
        drop(extra);
        until_answered(e, HEALTH, "HTTP/1.1 200").await;

        // Streaming sessions in total.
        let mut sessions = Vec::new();
        for _ in 0..2 {
            let mut tls = connect(e).await;
            let answer = send(&mut tls, &ws_exec("sleep%2030")).await;
            assert!(answer.starts_with("HTTP/1.1 101"), "{answer}");
            sessions.push(tls);
        }
        let mut third = connect(e).await;
        let answer = send(&mut third, &ws_exec("true")).await;
        assert_503(
            &answer,
            "relaylet is relaying its maximum of 2 streams (MAX_SESSIONS); try again later",
        );
        // Closing a session frees its slot.
        drop(sessions.pop());
        until_answered(e, &ws_exec("true"), "HTTP/1.1 101").await;
    });
}

/// `containerLogs` streams are capped like exec sessions, total and per user: a user with only
/// `pods/log` cannot hold thousands of `logs -f` streams (each a caller and a leaf connection).
#[test]
fn log_streams_are_capped_in_total_and_per_user() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let e = env(settings);
    const FOLLOW: &str =
        "GET /containerLogs/default/demo-1/main?follow=true HTTP/1.1\r\nHost: relaylet\r\n\r\n";
    RT.block_on(async {
        let before = log_stream_refusals(e).await;
        // The apiserver's identity holds its two followed logs ...
        let mut follows = Vec::new();
        for _ in 0..2 {
            let mut tls = connect(e).await;
            let answer = send(&mut tls, FOLLOW).await;
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            follows.push(tls);
        }
        let mut third = connect(e).await;
        let answer = send(&mut third, FOLLOW).await;
        assert_503_text(
            &answer,
            &format!(
                "user {:?} has its maximum of 2 open log streams (MAX_LOG_STREAMS_PER_USER); try again later",
                relaylet_sim::cluster::APISERVER_KUBELET_CLIENT
            ),
        );
        // ... another user one more, and then the total is reached.
        let other = e
            .sandbox
            .root
            .ca
            .issue_client("log-reader", &["system:masters"])
            .expect("certificate");
        let other_connect = || async {
            e.connect_kubelet_api(Some(&other)).await.expect("connect")
        };
        let mut fourth = other_connect().await;
        let answer = send(&mut fourth, FOLLOW).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let mut fifth = other_connect().await;
        let answer = send(&mut fifth, FOLLOW).await;
        assert_503_text(
            &answer,
            "relaylet is streaming its maximum of 3 logs (MAX_LOG_STREAMS); try again later",
        );
        let after = log_stream_refusals(e).await;
        assert_eq!(after - before, 2.0);
        // A stream that ends gives its place back.
        drop(follows.pop());
        until_answered(e, FOLLOW, "HTTP/1.1 200").await;
    });
}

/// relaylet's count of log streams refused at a cap.
async fn log_stream_refusals(e: &support::Env) -> f64 {
    let got = support::metrics::http_get(e.sandbox.relaylet.metrics_addr, "/metrics").await;
    let scrape = support::metrics::parse(&got.body);
    support::metrics::count(
        &scrape,
        "relaylet_limit_refusals_total",
        &[("cap", "log_streams")],
    )
}

/// Asserts that `answer` is a 503 whose body is `message` in the kubelet's plain text (how
/// `containerLogs` refusals are written, see `status::as_kubelet_text`).
#[track_caller]
fn assert_503_text(answer: &str, message: &str) {
    assert!(
        answer.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{answer}"
    );
    assert!(answer.contains(message), "{answer}");
}
