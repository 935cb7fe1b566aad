//! relaylet's operations surface, end to end: real kubectl sessions through the root apiserver
//! stand-in move the Prometheus counters on `METRICS_ADDR`; every session logs a start and an
//! end line with the right fields and never a token; `/metrics` on the kubelet port is behind
//! `nodes/metrics` authorization; `/livez` and `/readyz` answer.

use relaylet_dev::testkit as support;
use relaylet_dev::testkit::metrics as metrics_support;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use metrics_support::{count, histogram_count, http_get, https_get, parse, value};
use relaylet::config::LogFormat;
use relaylet_dev::sandbox::Settings;
use relaylet_sim::apiserver::auth::UserInfo;
use support::{Env, RT, Run, describe, text, wait_until};

/// Only turns a hang into a failure; nothing is measured against it.
const HANG: Duration = Duration::from_secs(60);

const TOKEN: &str = "s3cret-token-for-the-log-test-7f3a9c";
const TOKEN_USER: &str = "token-user";

/// Every log line this module's relaylet wrote.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn captured() -> &'static Captured {
    static LOG: OnceLock<Captured> = OnceLock::new();
    LOG.get_or_init(Captured::default)
}

/// The module's sandbox, its relaylet logging into [`captured`] (and nowhere else).
fn env(settings: fn() -> Settings) -> &'static Env {
    support::env_logged(settings, || {
        let writer = captured().clone();
        relaylet::ops::telemetry::dispatch(LogFormat::Json, move || writer.clone())
    })
}

fn settings() -> Settings {
    Settings {
        root_tokens: vec![(
            TOKEN.to_string(),
            UserInfo::new(TOKEN_USER, &["system:masters"]),
        )],
        ..Settings::default()
    }
}

fn log_lines() -> Vec<serde_json::Value> {
    let bytes = captured().0.lock().unwrap().clone();
    text(&bytes)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn scrape() -> prometheus_parse::Scrape {
    let e = env(settings);
    let got = RT.block_on(http_get(e.sandbox.relaylet.metrics_addr, "/metrics"));
    assert_eq!(got.status, 200, "{}", got.body);
    assert!(got.content_type.starts_with("application/openmetrics-text"));
    parse(&got.body)
}

fn kubectl() -> relaylet_sim::tools::Kubectl {
    support::kubectl("1.35")
}

/// Held by the tests that count exec sessions exactly or add some: they share one relaylet.
static EXEC_COUNTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn sessions_move_the_counters_and_log_one_line_at_each_end() {
    let _counting = EXEC_COUNTS.lock().unwrap_or_else(|p| p.into_inner());
    let e = env(settings);
    let k = kubectl();
    let exec = [("kind", "exec"), ("leaf", "leaf-1")];
    let logs = [("kind", "containerLogs"), ("leaf", "leaf-2")];
    let before = scrape();

    let out = Run::new(
        &k,
        &e.kubeconfig,
        &[
            "exec",
            "-i",
            "demo-1",
            "-c",
            "main",
            "--",
            "sh",
            "-c",
            "read line; echo relayed-bytes",
        ],
    )
    // Stdin, so bytes go to the leaf whatever the framing: over WebSocket (proxied by the root
    // since relaylet declares ExtendWebSocketsToKubelet) kubectl sends nothing else.
    .stdin(b"ping\n")
    .output();
    assert_eq!(
        text(&out.stdout),
        "relayed-bytes\n",
        "{}",
        describe(&k, &out)
    );
    let out = Run::new(&k, &e.kubeconfig, &["logs", "demo-2", "--tail=1"]).output();
    assert!(
        text(&out.stdout).contains("demo-2 tick"),
        "{}",
        describe(&k, &out)
    );

    // The session end is recorded when relaylet's side of the splice finishes, a moment after
    // kubectl has its answer.
    let mut after = scrape();
    wait_until("both sessions end", HANG, || {
        after = scrape();
        count(&after, "relaylet_sessions_active", &exec) == 0.0
            && count(&after, "relaylet_sessions_active", &logs) == 0.0
    });
    let delta = |name: &str, labels: &[(&str, &str)]| {
        count(&after, name, labels) - count(&before, name, labels)
    };
    // The leaf sent the exit status: completed, whichever side's close relaylet saw first.
    let mut l = exec.to_vec();
    l.push(("result", "completed"));
    assert_eq!(
        delta("relaylet_sessions_total", &l),
        1.0,
        "one exec session on leaf-1 completed"
    );
    for bad in [
        "client_closed",
        "leaf_lost",
        "shutdown",
        "idle_timeout",
        "rejected",
        "upgrade_failed",
    ] {
        let mut l = exec.to_vec();
        l.push(("result", bad));
        assert_eq!(delta("relaylet_sessions_total", &l), 0.0, "{bad}");
    }
    let mut l = logs.to_vec();
    l.push(("result", "completed"));
    assert_eq!(
        delta("relaylet_sessions_total", &l),
        1.0,
        "one log session on leaf-2"
    );
    assert_eq!(count(&after, "relaylet_sessions_active", &exec), 0.0);
    assert_eq!(count(&after, "relaylet_sessions_active", &logs), 0.0);
    // "relayed-bytes\n" inside stream frames, plus the log line.
    assert!(
        delta(
            "relaylet_relayed_bytes_total",
            &[("direction", "to_client")]
        ) >= 14.0
    );
    assert!(delta("relaylet_relayed_bytes_total", &[("direction", "to_leaf")]) > 0.0);
    let latency = |s: &prometheus_parse::Scrape| {
        histogram_count(s, "relaylet_upgrade_latency_seconds", &[("kind", "exec")])
    };
    assert_eq!(latency(&after) - latency(&before), 1);
    assert!(
        delta("relaylet_auth_decisions_total", &[("decision", "allowed")]) >= 2.0,
        "both calls were authorized"
    );

    // The log: one start and one end line for the exec, with the fields an operator needs.
    let lines = log_lines();
    let session_lines = |event: &str| -> Vec<serde_json::Value> {
        lines
            .iter()
            .filter(|l| l["event"] == event && l["verb"] == "exec" && l["pod"] == "demo-1")
            .cloned()
            .collect()
    };
    assert_eq!(session_lines("session_start").len(), 1, "{lines:#?}");
    let ends = session_lines("session_end");
    assert_eq!(ends.len(), 1, "{lines:#?}");
    let end = &ends[0];
    assert_eq!(end["namespace"], "default");
    assert_eq!(end["container"], "main");
    assert_eq!(end["leaf"], "leaf-1");
    assert_eq!(end["node"], "relaylet-leaf-1");
    assert!(
        end["user"].as_str().is_some_and(|u| !u.is_empty()),
        "the root apiserver's kubelet client identity: {end}"
    );
    assert!(
        end["bytes_to_client"].as_u64().is_some_and(|b| b >= 14),
        "{end}"
    );
    assert!(end["bytes_to_leaf"].as_u64().is_some(), "{end}");
    assert!(end["duration_ms"].as_u64().is_some(), "{end}");
    assert_eq!(end["result"], "completed", "{end}");
}

/// relaylet dials the next leaf connection while a session runs, so the next session's
/// upgrade goes out on a connection that is already open (`src/leaf/warm_connector.rs`).
#[test]
fn the_next_session_takes_the_spare_leaf_connection() {
    let _counting = EXEC_COUNTS.lock().unwrap_or_else(|p| p.into_inner());
    let e = env(settings);
    let k = kubectl();
    let spare = [("leaf", "leaf-2"), ("source", "spare")];
    let before = scrape();
    for n in 0..2 {
        let word = format!("session-{n}");
        let out = Run::new(&k, &e.kubeconfig, &["exec", "demo-2", "--", "echo", &word]).output();
        assert_eq!(
            text(&out.stdout),
            format!("{word}\n"),
            "{}",
            describe(&k, &out)
        );
    }
    let after = scrape();
    let used = count(&after, "relaylet_leaf_connections_total", &spare)
        - count(&before, "relaylet_leaf_connections_total", &spare);
    assert!(
        used >= 1.0,
        "no exec on leaf-2 was served by the spare connection"
    );
}

#[test]
fn a_token_caller_is_logged_by_name_and_the_token_never() {
    let e = env(settings);
    let tls = e.sandbox.root.ca.client_config(None).expect("client TLS");
    let auth = format!("Bearer {TOKEN}");
    let got = RT.block_on(https_get(
        e.sandbox.relaylet.addr,
        tls,
        "/containerLogs/default/demo-1/main?tailLines=1",
        &[("authorization", auth.as_str())],
    ));
    assert_eq!(got.status, 200, "{}", got.body);
    assert!(got.body.contains("demo-1 tick"), "{}", got.body);
    wait_until(
        &format!("a session_end line for {TOKEN_USER}"),
        HANG,
        || {
            log_lines().iter().any(|l| {
                l["event"] == "session_end"
                    && l["user"] == TOKEN_USER
                    && l["verb"] == "containerLogs"
                    && l["pod"] == "demo-1"
                    && l["result"] == "completed"
            })
        },
    );
    let all = text(&captured().0.lock().unwrap());
    assert!(!all.contains(TOKEN), "the token leaked into the log");
    assert!(!all.to_ascii_lowercase().contains("authorization"));
}

#[test]
fn kubelet_port_metrics_need_nodes_metrics_and_health_answers() {
    let e = env(settings);
    let ca = &e.sandbox.root.ca;
    let node_addr = e
        .sandbox
        .relaylet
        .node_ports
        .addr_of("relaylet-leaf-1")
        .expect("leaf-1's node has its own port");
    let before = scrape();

    let mallory = ca.issue_client("mallory", &[]).unwrap();
    let got = RT.block_on(https_get(
        node_addr,
        ca.client_config(Some(&mallory)).unwrap(),
        "/metrics",
        &[],
    ));
    assert_eq!(got.status, 403, "{}", got.body);
    assert!(got.body.contains("nodes/metrics"), "{}", got.body);

    let admin = ca.issue_client("ops-admin", &["system:masters"]).unwrap();
    let admin_tls = ca.client_config(Some(&admin)).unwrap();
    let got = RT.block_on(https_get(node_addr, admin_tls.clone(), "/metrics", &[]));
    assert_eq!(got.status, 200, "{}", got.body);
    assert!(value(&parse(&got.body), "relaylet_leader", &[]).is_some());

    // The shared port serves two virtual nodes: it cannot say whose metrics are meant.
    let got = RT.block_on(https_get(
        e.sandbox.relaylet.addr,
        admin_tls,
        "/metrics/resource",
        &[],
    ));
    assert_eq!(got.status, 404, "{}", got.body);
    assert!(got.body.contains("own kubelet port"), "{}", got.body);

    let after = scrape();
    let denied = [("decision", "denied")];
    assert_eq!(
        count(&after, "relaylet_auth_decisions_total", &denied)
            - count(&before, "relaylet_auth_decisions_total", &denied),
        1.0
    );

    let metrics = e.sandbox.relaylet.metrics_addr;
    assert_eq!(RT.block_on(http_get(metrics, "/livez")).status, 200);
    assert_eq!(RT.block_on(http_get(metrics, "/healthz")).status, 200);
    let mut ready = RT.block_on(http_get(metrics, "/readyz"));
    wait_until("ready", HANG, || {
        ready = RT.block_on(http_get(metrics, "/readyz"));
        ready.status == 200
    });
    assert_eq!(ready.body, "ok");
    // Ready needs one reachable leaf; the probe (every 5 s) may not have reported both yet.
    let mut s = scrape();
    wait_until("the probe reports both leaves", HANG, || {
        s = scrape();
        ["leaf-1", "leaf-2"]
            .iter()
            .all(|leaf| value(&s, "relaylet_leaf_reachable", &[("leaf", leaf)]).is_some())
    });
    assert_eq!(value(&s, "relaylet_leader", &[]), Some(1.0));
    assert_eq!(value(&s, "relaylet_root_reachable", &[]), Some(1.0));
    assert_eq!(
        value(&s, "relaylet_leaf_reachable", &[("leaf", "leaf-1")]),
        Some(1.0)
    );
    assert_eq!(
        value(&s, "relaylet_leaf_reachable", &[("leaf", "leaf-2")]),
        Some(1.0)
    );
}
