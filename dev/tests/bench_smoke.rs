//! Smoke test of `relaylet-dev bench`: runs the real program (with `--smoke`: every figure on tiny
//! sizes) and checks that it prints every figure as one well-formed JSON object per line, with
//! positive values on every route that applies and ratios consistent with them.

use std::process::Stdio;
use std::time::Duration;

const FIGURES: [&str; 11] = [
    "exec_stdout_throughput",
    "portforward_throughput",
    "logs_follow_throughput",
    "exec_rtt_p50",
    "exec_rtt_p99",
    "exec_setup_rate",
    "cpu_per_gib",
    "floor_cpu_per_gib",
    "system_cpu_per_gib",
    "after_close_rss_growth",
    "after_close_fd_growth",
];

/// One benchmark at a time: each loads the two cores, and their waits are for events, not
/// for each other.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs `relaylet-dev bench args` in its turn; its stdout and stderr. Fails if it fails, and
/// after `within` (which only turns a hang into a failure).
async fn bench(args: &[&str], within: Duration) -> (String, String) {
    let _turn = TURN.lock().await;
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_relaylet-dev"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start relaylet-dev bench");
    let output = tokio::time::timeout(within, child.wait_with_output())
        .await
        .expect("bench finished in time")
        .expect("bench output");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "bench failed: {stderr}");
    (String::from_utf8_lossy(&output.stdout).into_owned(), stderr)
}

/// The figures of `stdout`: every line that starts an object is one, well-formed (the target
/// lines are plain text).
fn json_rows(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .filter(|line| line.starts_with('{'))
        .map(|line| serde_json::from_str(line).expect("a JSON object per line"))
        .collect()
}

#[tokio::test]
async fn bench_smoke_prints_every_figure_as_json() {
    let (stdout, stderr) = bench(&["bench", "--smoke", "--json"], Duration::from_secs(240)).await;
    assert!(stderr.contains("cores"), "no core count in {stderr}");
    assert!(
        stdout.lines().all(|l| l.starts_with('{')),
        "only figures on stdout: {stdout}"
    );
    let rows = json_rows(&stdout);
    let row = |name: &str| {
        rows.iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("no figure {name} in {rows:?}"))
    };
    for name in FIGURES {
        let r = row(name);
        for field in ["unit", "direct", "limit", "relayed", "ratio", "n"] {
            assert!(r.get(field).is_some(), "{name} lacks {field}");
        }
    }
    for name in &FIGURES[..6] {
        let r = row(name);
        for route in ["direct", "limit", "relayed"] {
            assert!(
                r[route].as_f64().expect("a number") > 0.0,
                "{name} {route}: {r}"
            );
        }
        let (limit, relayed) = (r["limit"].as_f64().unwrap(), r["relayed"].as_f64().unwrap());
        let expected = if r["unit"] == "us" {
            limit / relayed
        } else {
            relayed / limit
        };
        let ratio = r["ratio"].as_f64().expect("ratio");
        assert!(
            (ratio - expected).abs() < 0.01 * expected.max(1.0),
            "{name}: {r}"
        );
    }
    let cpu = row("cpu_per_gib");
    assert!(cpu["direct"].is_null() && cpu["relayed"].as_f64().unwrap() > 0.0);
    // The floor: direct = its TCP part, limit = crypto + TCP, relayed = relaylet's cost, and
    // ratio = floor / relaylet.
    let floor = row("floor_cpu_per_gib");
    let (tcp, total) = (
        floor["direct"].as_f64().expect("tcp part"),
        floor["limit"].as_f64().expect("floor"),
    );
    assert!(tcp > 0.0 && total > tcp, "{floor}");
    assert_eq!(floor["relayed"], cpu["relayed"]);
    let expected = total / cpu["relayed"].as_f64().unwrap();
    let ratio = floor["ratio"].as_f64().expect("ratio");
    assert!((ratio - expected).abs() < 0.01, "{floor}");
    // Whole-system CPU: every route costs the client and the leaf; ratio = (direct + floor) /
    // relayed.
    let system = row("system_cpu_per_gib");
    for route in ["direct", "limit", "relayed"] {
        assert!(system[route].as_f64().expect("a number") > 0.0, "{system}");
    }
    assert!(system["ratio"].as_f64().expect("ratio") > 0.0, "{system}");
    let memory = rows
        .iter()
        .find(|r| {
            r["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("idle_session_memory_"))
        })
        .expect("an idle-session memory figure");
    assert!(memory["ratio"].is_null() && memory["relayed"].as_f64().unwrap() > 0.0);
    assert_eq!(row("after_close_fd_growth")["unit"], "fds");
}

/// `bench --smoke --only fleet`: a fleet of four sim leaves, every fleet figure as a JSON line
/// with a value that can be one (times, memory and writes positive, the replica share at least
/// the even share, one replica watching each leaf), and the target lines after.
#[tokio::test]
async fn fleet_smoke_prints_every_fleet_figure() {
    let (stdout, _) = bench(
        &["bench", "--smoke", "--json", "--only", "fleet"],
        Duration::from_secs(240),
    )
    .await;
    let rows = json_rows(&stdout);
    let value = |name: &str| {
        rows.iter()
            .find(|r| r["name"] == name)
            .and_then(|r| r["value"].as_f64())
            .unwrap_or_else(|| panic!("no figure {name} in {stdout}"))
    };
    for name in [
        "fleet_time_to_all_ready",
        "fleet_memory_per_leaf",
        "fleet_cpu_per_idle_leaf_hour",
        "fleet_root_writes_per_leaf_minute",
        "fleet_rss_after_pods_deleted_vs_before",
    ] {
        assert!(value(name) > 0.0, "{name} in {stdout}");
    }
    assert!(value("fleet_max_replica_share_vs_even") >= 1.0, "{stdout}");
    // Counted from the leaf apiservers' open watches by client address: once the Nodes are
    // spread, each leaf is watched by exactly the replica that serves it (0 would mean the
    // watches were not matched to any replica, above 1 a leaf watched twice).
    assert_eq!(value("fleet_replicas_watching_each_leaf"), 1.0, "{stdout}");
    assert!(
        stdout.contains("fleet_memory_per_leaf_pod <= 1024 B:"),
        "{stdout}"
    );
}

/// `bench --smoke --only podsync`: pods run through relaylet's pod sync against the same pods
/// run in the leaf directly; every figure as a JSON line (both routes' latencies positive, each
/// synced pod created and deleted once in the leaf, no failed reconcile), and the target lines.
#[tokio::test]
async fn podsync_smoke_prints_every_pod_sync_figure() {
    let (stdout, _) = bench(
        &["bench", "--smoke", "--json", "--only", "podsync"],
        Duration::from_secs(240),
    )
    .await;
    let rows = json_rows(&stdout);
    let row = |name: &str| {
        rows.iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("no figure {name} in {stdout}"))
    };
    let relayed = |name: &str| row(name)["relayed"].as_f64().unwrap();
    for name in [
        "podsync_start_p50",
        "podsync_start_p99",
        "podsync_delete_p50",
        "podsync_delete_p99",
        "podsync_1000_pods_all_running",
    ] {
        let direct = row(name)["direct"].as_f64().unwrap();
        assert!(direct > 0.0 && relayed(name) > 0.0, "{name} in {stdout}");
        let ratio = row(name)["ratio"].as_f64().unwrap();
        // The figures are printed to three decimals: a ratio of small ones (0.544 s / 0.139 s)
        // can be off by that rounding, not more.
        let expected = relayed(name) / direct;
        let rounding = expected * (0.0005 / direct + 0.0005 / relayed(name)) + 0.001;
        assert!((ratio - expected).abs() <= rounding, "{name} in {stdout}");
    }
    // Relaylet writes a synced pod's status at least once, and its copy is made and ended once.
    assert!(relayed("podsync_root_writes_per_pod") >= 1.0, "{stdout}");
    assert_eq!(relayed("podsync_leaf_creates_per_pod"), 1.0, "{stdout}");
    assert_eq!(relayed("podsync_leaf_deletes_per_pod"), 1.0, "{stdout}");
    assert_eq!(relayed("podsync_sync_errors"), 0.0, "{stdout}");
    // The heap in use is read from relaylet's metrics: a figure for both routes.
    for route in ["direct", "relayed"] {
        assert!(
            row("podsync_heap_per_pod")[route].is_number(),
            "{route} in {stdout}"
        );
    }
    for row in [
        "podsync_overhead_p50",
        "podsync_overhead_p99",
        "podsync_1000_pods_all_running",
        "podsync_memory_per_pod",
        "podsync_root_writes_per_pod",
        "podsync_delete_overhead_p99",
    ] {
        assert!(
            stdout.contains(&format!("- {row} <= ")),
            "{row} in {stdout}"
        );
    }
}

/// `bench --only kubelet-path` on real Kubernetes 1.37 (the components of
/// `tests/tools/build-k8s.sh`): one JSON object per combination of relaylet and the leaf kubelet
/// declaring `ExtendWebSocketsToKubelet` and per process on the path, each with a positive CPU
/// cost, and a positive throughput per combination.
#[tokio::test]
async fn bench_smoke_measures_the_kubelet_path_on_real_kubernetes() {
    let (stdout, _) = bench(
        &["bench", "--smoke", "--json", "--only", "kubelet-path"],
        Duration::from_secs(600),
    )
    .await;
    assert!(
        stdout.lines().all(|l| l.starts_with('{')),
        "only figures on stdout: {stdout}"
    );
    let rows = json_rows(&stdout);
    for relaylet in ["declared", "not declared"] {
        for kubelet in ["declared", "not declared"] {
            let of =
                |r: &&serde_json::Value| r["relaylet"] == relaylet && r["leaf_kubelet"] == kubelet;
            for process in [
                "root apiserver",
                "relaylet",
                "leaf apiserver",
                "leaf kubelet",
                "kubectl",
            ] {
                let row = rows
                    .iter()
                    .filter(of)
                    .find(|r| r["process"] == process)
                    .unwrap_or_else(|| {
                        panic!("no {process} row for {relaylet}/{kubelet}: {rows:?}")
                    });
                assert!(row["cpu_s_per_gib"].as_f64().unwrap_or(0.0) > 0.0, "{row}");
            }
            let throughput = rows
                .iter()
                .filter(of)
                .find(|r| r.get("throughput_mib_s").is_some())
                .unwrap_or_else(|| panic!("no throughput for {relaylet}/{kubelet}: {rows:?}"));
            assert!(
                throughput["throughput_mib_s"].as_f64().unwrap_or(0.0) > 0.0,
                "{throughput}"
            );
        }
    }
}
