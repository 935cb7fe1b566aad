//! New bearer tokens cost the root apiserver a TokenReview each, so strangers must not be able to
//! make it review without bound: a refused token is remembered, and new tokens have a budget of
//! reviews per source address (past it, 429), so a flood from one address never refuses another
//! address's valid token. A sandbox of its own: the floods drain budgets.

use relaylet_dev::testkit as support;

use std::time::Duration;

use relaylet_dev::sandbox::Settings;
use relaylet_sim::apiserver::UserInfo;
use support::{Env, RT, env};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// Connections at once, and new tokens each sends.
const TASKS: u64 = 20;
const PER_TASK: u64 = 30;

/// Only turns a hang into a failure; nothing is measured against it.
const HANG: Duration = Duration::from_secs(60);

/// Valid tokens of a scraper (metrics-server, Prometheus) that another address sends.
const SCRAPER_TOKENS: usize = 5;

fn scraper_token(i: usize) -> String {
    format!("scraper-token-{i}")
}

fn settings() -> Settings {
    Settings {
        root_tokens: (0..SCRAPER_TOKENS)
            .map(|i| {
                (
                    scraper_token(i),
                    UserInfo::new(
                        "system:serviceaccount:monitoring:scraper",
                        &["system:masters"],
                    ),
                )
            })
            .collect(),
        ..Settings::default()
    }
}

/// Where the second test's flood comes from.
const FLOODER: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 3));

/// The tests count the root's TokenReviews and drain budgets: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A connection to relaylet's kubelet API from 127.0.0.1.
async fn connect(e: &Env) -> std::io::Result<TlsStream<TcpStream>> {
    e.connect_kubelet_api(None).await
}

/// A connection to relaylet's kubelet API from `source` (another loopback address).
async fn connect_from(e: &Env, source: std::net::IpAddr) -> std::io::Result<TlsStream<TcpStream>> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(std::net::SocketAddr::new(source, 0))?;
    let tcp = socket.connect(e.sandbox.relaylet.addr).await?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("server name");
    tokio_rustls::TlsConnector::from(e.kubelet_api_tls(None))
        .connect(name, tcp)
        .await
}

fn get(path: &str, extra: &str) -> String {
    support::raw_http::get_head(path, &format!("Connection: close\r\n{extra}"))
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
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let e = env(settings);
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
                                "too many new bearer tokens from 127.0.0.1 to review (more than 20 a second); try again later",
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

/// A flood of made-up tokens from one address takes that address's budget, never another's:
/// while 127.0.0.3 is being refused, a scraper at 127.0.0.2 presenting new valid tokens is
/// served each one. (The flood comes from an address no other test uses: the sandbox is shared,
/// and its budget for 127.0.0.1 must be whole whichever test runs first.)
#[test]
fn a_token_flood_from_one_address_never_refuses_another_addresss_valid_token() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let e = env(settings);
    static THROTTLED: AtomicBool = AtomicBool::new(false);
    static DONE: AtomicBool = AtomicBool::new(false);
    RT.block_on(async {
        let flood: Vec<_> = (0..TASKS)
            .map(|task| {
                tokio::spawn(async move {
                    let mut i = 0;
                    while !DONE.load(Ordering::Relaxed) {
                        i += 1;
                        let Ok(mut tls) = connect_from(e, FLOODER).await else {
                            continue;
                        };
                        let token = format!("flood-{task}-{i}");
                        let (code, _) = request(
                            &mut tls,
                            &get("/healthz", &format!("Authorization: Bearer {token}\r\n")),
                        )
                        .await;
                        if code == 429 {
                            THROTTLED.store(true, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        tokio::time::timeout(HANG, async {
            while !THROTTLED.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the flood is refused");
        let scraper: std::net::IpAddr = [127, 0, 0, 2].into();
        let mut codes = Vec::new();
        for i in 0..SCRAPER_TOKENS {
            let mut tls = connect_from(e, scraper)
                .await
                .expect("connect from 127.0.0.2");
            let (code, body) = request(
                &mut tls,
                &get(
                    "/healthz",
                    &format!("Authorization: Bearer {}\r\n", scraper_token(i)),
                ),
            )
            .await;
            codes.push((code, body));
        }
        DONE.store(true, Ordering::Relaxed);
        for task in flood {
            task.await.unwrap();
        }
        for (i, (code, body)) in codes.iter().enumerate() {
            assert_eq!(
                *code, 200,
                "the scraper's new token {i} during the flood: {body}"
            );
        }
    });
}
