//! containerLogs against the kubelet stand-in: every PodLogOptions field with kubelet
//! semantics, follow streaming, previous instances and the kubelet's error answers — through
//! kube-rs' kubelet log API and raw HTTPS.

use crate::kubelet_support as support;

use std::time::Duration;

use futures::AsyncBufReadExt;
use futures::StreamExt;
use http_body_util::BodyExt;
use kube::api::LogParams;
use kube::core::kubelet_debug::KubeletDebugParams;
use support::{Harness, pod, shell_container};
use tokio::time::timeout;

const T: Duration = Duration::from_secs(20);

const SCRIPT: &str =
    "for i in 1 2 3 4 5; do echo line$i; done; sleep 0.3; echo oops >&2; sleep 1000";

async fn harness(test: &str) -> Harness {
    support::init_crypto();
    let h = Harness::start(test).await;
    h.kubelet
        .run_pod(pod("logs", vec![shell_container("main", SCRIPT)]))
        .await
        .unwrap();
    // Wait until the container wrote everything.
    timeout(T, async {
        loop {
            let (_, body) = h.get("/containerLogs/default/logs/main").await;
            if body.contains("oops") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap();
    h
}

async fn logs(h: &Harness, query: &str) -> (u16, String) {
    let (code, body) = h
        .get(&format!("/containerLogs/default/logs/main?{query}"))
        .await;
    (code.as_u16(), body)
}

const ALL: &str = "line1\nline2\nline3\nline4\nline5\noops\n";

#[tokio::test]
async fn options_select_and_shape_the_log() {
    let h = harness("logs-options").await;
    timeout(T, async {
        assert_eq!(logs(&h, "").await, (200, ALL.to_string()));
        assert_eq!(logs(&h, "tailLines=2").await.1, "line5\noops\n");
        assert_eq!(logs(&h, "tailLines=0").await.1, "");
        assert_eq!(logs(&h, "tailLines=100").await.1, ALL);
        // The legacy `tail` parameter, and `tail=all`.
        assert_eq!(logs(&h, "tail=1").await.1, "oops\n");
        assert_eq!(logs(&h, "tailLines=1&tail=all").await.1, ALL);
        assert_eq!(logs(&h, "limitBytes=8").await.1, "line1\nli");
        assert_eq!(logs(&h, "stream=Stderr").await.1, "oops\n");
        assert_eq!(logs(&h, "stream=Stdout").await.1, &ALL[..ALL.len() - 5]);
        assert_eq!(logs(&h, "stream=All&tailLines=1").await.1, "oops\n");
        assert_eq!(logs(&h, "sinceSeconds=3600").await.1, ALL);
        assert_eq!(logs(&h, "sinceTime=2000-01-01T00:00:00Z").await.1, ALL);
        assert_eq!(logs(&h, "sinceTime=2999-01-01T00:00:00Z").await.1, "");

        // Timestamps: fixed-width RFC 3339 in UTC, one space, the line.
        let (_, stamped) = logs(&h, "timestamps=true").await;
        let lines: Vec<&str> = stamped.lines().collect();
        assert_eq!(lines.len(), 6);
        let mut previous = String::new();
        for (line, want) in lines.iter().zip(ALL.lines()) {
            let (ts, rest) = line.split_once(' ').unwrap();
            assert_eq!(rest, want);
            assert_eq!(ts.len(), "2026-11-21T19:55:01.123456789Z".len(), "{ts}");
            assert!(ts.ends_with('Z') && ts.as_bytes()[19] == b'.', "{ts}");
            assert!(*ts >= *previous, "timestamps go forward");
            previous = ts.to_string();
        }
        // sinceTime just after the fifth line keeps only what came later (oops, 0.3 s later).
        let fifth = lines[4].split_once(' ').unwrap().0;
        let (_, later) = logs(&h, &format!("sinceTime={}", bump(fifth))).await;
        assert_eq!(later, "oops\n");
        // timestamps with a byte limit cut inside the prefix like the kubelet does.
        assert_eq!(logs(&h, "timestamps=1&limitBytes=4").await.1, &stamped[..4]);
    })
    .await
    .unwrap();
}

/// A timestamp 1 µs later than `ts` (RFC 3339, nine fraction digits).
fn bump(ts: &str) -> String {
    let (head, frac) = ts.trim_end_matches('Z').split_once('.').unwrap();
    let nanos: u64 = frac.parse::<u64>().unwrap() + 1000;
    assert!(nanos < 1_000_000_000, "test timing edge");
    format!("{head}.{nanos:09}Z")
}

#[tokio::test]
async fn bad_options_and_unknown_targets_answer_like_the_kubelet() {
    let h = harness("logs-errors").await;
    timeout(T, async {
        let decode = (400, r#"{"message": "Unable to decode query."}"#.to_string());
        let invalid = (422, r#"{"message": "Invalid request."}"#.to_string());
        assert_eq!(logs(&h, "tailLines=abc").await, decode);
        assert_eq!(logs(&h, "limitBytes=1.5").await, decode);
        assert_eq!(logs(&h, "sinceTime=yesterday").await, decode);
        assert_eq!(logs(&h, "tailLines=-1").await, invalid);
        assert_eq!(logs(&h, "tail=-3").await, invalid);
        assert_eq!(logs(&h, "limitBytes=0").await, invalid);
        assert_eq!(logs(&h, "sinceSeconds=0").await, invalid);
        assert_eq!(
            logs(&h, "sinceSeconds=10&sinceTime=2026-01-01T00:00:00Z").await,
            invalid
        );
        assert_eq!(logs(&h, "stream=Both").await, invalid);
        assert_eq!(logs(&h, "stream=Stdout&tailLines=3").await, invalid);
        assert_eq!(
            logs(&h, "previous=true").await,
            (
                400,
                "previous terminated container \"main\" in pod \"logs\" not found".to_string()
            )
        );
        let (code, body) = h.get("/containerLogs/default/nope/main").await;
        assert_eq!(
            (code.as_u16(), body.as_str()),
            (404, "pod \"nope\" does not exist")
        );
        let (code, body) = h.get("/containerLogs/default/logs/nope").await;
        assert_eq!(
            (code.as_u16(), body.as_str()),
            (404, "container \"nope\" not found in pod \"logs\"")
        );
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn kube_rs_reads_logs_and_previous_after_restart() {
    let h = harness("logs-kube").await;
    timeout(T, async {
        let client = h.kube_client().await;
        let params = || KubeletDebugParams {
            name: "logs",
            namespace: "default",
            pod_uid: None,
        };
        let read = |lp: LogParams| {
            let client = client.clone();
            async move {
                let params = params();
                let mut lines = client
                    .kubelet_node_logs(&params, "main", &lp)
                    .await
                    .unwrap()
                    .lines();
                let mut out = Vec::new();
                while let Some(line) = lines.next().await {
                    out.push(line.unwrap());
                }
                out
            }
        };
        assert_eq!(
            read(LogParams {
                tail_lines: Some(3),
                ..Default::default()
            })
            .await,
            ["line4", "line5", "oops"]
        );
        assert_eq!(read(LogParams::default()).await.len(), 6);

        h.kubelet
            .restart_container("default", "logs", "main")
            .await
            .unwrap();
        assert_eq!(
            h.kubelet
                .container_status("default", "logs", "main")
                .unwrap()
                .restart_count,
            1
        );
        // The old instance is `previous` now; the new one writes its own log.
        assert_eq!(
            read(LogParams {
                previous: true,
                ..Default::default()
            })
            .await,
            ["line1", "line2", "line3", "line4", "line5", "oops"]
        );
        loop {
            let now = read(LogParams {
                tail_lines: Some(1),
                ..Default::default()
            })
            .await;
            if now == ["oops"] {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let err = client
            .kubelet_node_logs(&params(), "missing", &LogParams::default())
            .await;
        assert!(err.is_err());
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn follow_streams_lines_as_written_and_ends_with_the_process() {
    support::init_crypto();
    let h = Harness::start("logs-follow").await;
    // The process writes tick<i> only once the test creates file <i>: lines come when the test
    // says, and the process cannot end before the test lets it.
    let gates = std::env::temp_dir().join(format!("logs-follow-{}", std::process::id()));
    std::fs::create_dir_all(&gates).expect("gate directory");
    let open_gate = |i: usize| std::fs::write(gates.join(i.to_string()), b"").expect("gate");
    h.kubelet
        .run_pod(pod(
            "ticker",
            vec![shell_container(
                "main",
                &format!(
                    "for i in 0 1 2 3 4; do while [ ! -e {dir}/$i ]; do sleep 0.01; done; echo tick$i; done",
                    dir = gates.display()
                ),
            )],
        ))
        .await
        .unwrap();
    timeout(T, async {
        let resp = h
            .request("GET", "/containerLogs/default/ticker/main?follow=true", &[])
            .await;
        assert_eq!(resp.status(), 200);
        let mut body = resp.into_body().into_data_stream();
        let mut seen = String::new();
        // Streamed as written, not collected until the end: each line arrives while the
        // process still waits for the next gate.
        for i in 0..5 {
            open_gate(i);
            let line = format!("tick{i}\n");
            while !seen.ends_with(&line) {
                let chunk = body
                    .next()
                    .await
                    .unwrap_or_else(|| panic!("the stream ended before {line:?}: {seen:?}"))
                    .unwrap();
                seen.push_str(std::str::from_utf8(&chunk).unwrap());
            }
            if i < 4 {
                assert!(
                    h.kubelet
                        .container_status("default", "ticker", "main")
                        .unwrap()
                        .running,
                    "the process waits for gate {}",
                    i + 1
                );
            }
        }
        // The stream ends with the process.
        while let Some(chunk) = body.next().await {
            seen.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        }
        assert_eq!(seen, "tick0\ntick1\ntick2\ntick3\ntick4\n");
        assert!(
            !h.kubelet
                .container_status("default", "ticker", "main")
                .unwrap()
                .running
        );
        // Following an exited container returns what it wrote and ends.
        let (code, all) = h
            .get("/containerLogs/default/ticker/main?follow=true&tailLines=2")
            .await;
        assert_eq!((code.as_u16(), all.as_str()), (200, "tick3\ntick4\n"));
    })
    .await
    .unwrap();
    let _ = std::fs::remove_dir_all(&gates);
}

#[tokio::test]
async fn follow_sends_before_the_process_ends_and_logs_are_cri_files() {
    let h = harness("logs-files").await;
    timeout(T, async {
        let resp = h
            .request("GET", "/containerLogs/default/logs/main?follow=1", &[])
            .await;
        let mut body = resp.into_body();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert!(first.starts_with(b"line1\n"));
        drop(body);
        // The log lives where the kubelet keeps it, in CRI format.
        let file = h.data_dir.join("pods/default_logs_uid-logs/main/0.log");
        let text = std::fs::read_to_string(file).unwrap();
        let first_line = text.lines().next().unwrap();
        let parts: Vec<&str> = first_line.splitn(4, ' ').collect();
        assert_eq!(&parts[1..], ["stdout", "F", "line1"]);
        assert!(text.contains(" stderr F oops\n"));
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn long_and_unterminated_lines_survive_the_cri_format() {
    let h = Harness::start("logs-partial").await;
    // A 40 000-byte line (split into partial records on disk) and an unterminated last line.
    let script = "head -c 40000 /dev/zero | tr '\\0' x; echo; printf tail-without-newline";
    h.kubelet
        .run_pod(pod("partial", vec![shell_container("main", script)]))
        .await
        .unwrap();
    timeout(T, async {
        let path = "/containerLogs/default/partial/main?follow=true";
        let (code, body) = h.get(path).await;
        assert_eq!(code.as_u16(), 200);
        let expected = format!("{}\ntail-without-newline", "x".repeat(40000));
        assert_eq!(body.len(), expected.len());
        assert!(body == expected);
        let file = h
            .data_dir
            .join("pods/default_partial_uid-partial/main/0.log");
        let text = std::fs::read_to_string(file).unwrap();
        let tags: Vec<&str> = text.lines().map(|l| l.split(' ').nth(2).unwrap()).collect();
        assert_eq!(tags, ["P", "P", "F", "P"]);
    })
    .await
    .unwrap();
}
