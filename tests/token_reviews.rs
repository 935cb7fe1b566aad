//! New bearer tokens cost the root apiserver a TokenReview each, so strangers must not be able to
//! make it review without bound: a refused token is remembered, and new tokens have a budget of
//! reviews (past it, 429). A sandbox of its own: the flood drains the budget that other tests'
//! tokens would need.

use relaylet_dev::testkit as support;

use std::time::Duration;

use relaylet_dev::sandbox::Settings;
use support::{Env, RT, env};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// Connections at once, and new tokens each sends.
const TASKS: u64 = 20;
const PER_TASK: u64 = 30;

/// Only turns a hang into a failure; nothing is measured against it.
const HANG: Duration = Duration::from_secs(60);

async fn connect(e: &Env) -> std::io::Result<TlsStream<TcpStream>> {
    e.connect_kubelet_api(None).await
}

fn get(path: &str, extra: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: relaylet\r\nConnection: close\r\n{extra}\r\n")
}

/// Sends a request and reads the answer to its end (the server closes); its status code and
/// the whole answer.
async fn request(tls: &mut TlsStream<TcpStream>, head: &str) -> (u16, String) {
    tls.write_all(head.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(HANG, tls.read_to_end(&mut buf))
        .await
        .expect("an answer");
    let text = String::from_utf8_lossy(&buf).into_owned();
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, text)
}

/// Asserts that `answer` is a Failure Status with exactly `code`, `reason` and `message`.
#[track_caller]
fn assert_status(answer: &str, code: u16, reason: &str, message: &str) {
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    let status: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|err| panic!("a Status: {err}: {answer}"));
    assert_eq!(
        (
            status["code"].as_u64(),
            status["reason"].as_str(),
            status["message"].as_str(),
        ),
        (Some(u64::from(code)), Some(reason), Some(message)),
        "{answer}"
    );
}

/// A bearer token the root cluster refused is remembered (one TokenReview, however often it is
/// sent), and new tokens have a budget of reviews: a flood of made-up tokens gets 429s instead
/// of a flood of TokenReviews at the root apiserver.
#[test]
fn made_up_tokens_cost_the_root_apiserver_few_reviews() {
    let e = env(Settings::default);
    let reviews = || {
        e.sandbox
            .root
            .api
            .requests("POST", "/apis/authentication.k8s.io/v1/tokenreviews")
    };
    RT.block_on(async {
        let before = reviews();
        for _ in 0..5 {
            let mut tls = connect(e).await.unwrap();
            let (code, body) = request(
                &mut tls,
                &get("/healthz", "Authorization: Bearer made-up-once\r\n"),
            )
            .await;
            assert_eq!(code, 401, "{body}");
        }
        assert_eq!(reviews() - before, 1, "a refused token is reviewed once");

        let before = reviews();
        let tasks: Vec<_> = (0..TASKS)
            .map(|task| {
                tokio::spawn(async move {
                    let mut codes = Vec::new();
                    for i in 0..PER_TASK {
                        let mut tls = connect(e).await.unwrap();
                        let token = format!("made-up-{task}-{i}");
                        let (code, body) = request(
                            &mut tls,
                            &get("/healthz", &format!("Authorization: Bearer {token}\r\n")),
                        )
                        .await;
                        if code == 429 {
                            assert_status(
                                &body,
                                429,
                                "TooManyRequests",
                                "too many new bearer tokens to review (more than 20 a second); try again later",
                            );
                        } else {
                            assert_eq!(code, 401, "{body}");
                        }
                        codes.push(code);
                    }
                    codes
                })
            })
            .collect();
        let mut throttled = 0;
        for task in tasks {
            throttled += task.await.unwrap().iter().filter(|c| **c == 429).count() as u64;
        }
        // 600 new tokens sent as fast as 20 connections allow: all of them would be reviewed
        // only if they took longer than (600 - 50) / 20 = 27.5 s.
        assert!(throttled > 0, "{} new tokens at once were all reviewed", TASKS * PER_TASK);
        assert_eq!(
            reviews() - before + throttled,
            TASKS * PER_TASK,
            "every token not throttled cost exactly one review"
        );
    });
}
