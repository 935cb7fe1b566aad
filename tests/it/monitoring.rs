//! The monitoring the chart ships, checked against what it monitors. The PrometheusRule the
//! chart renders (`metrics.prometheusRule`) passes `promtool check rules` and the promtool unit
//! tests in `tests/monitoring/alerts-test.yaml`, which fire every alert and keep every alert
//! quiet at least once (and a rule broken on purpose fails them); every series the rules and
//! the Grafana dashboard (`dashboards.enabled`) query is one relaylet exports: its `Metrics`
//! registry, whose names the sandbox's real `/metrics` endpoint is held to; every alert has a
//! row in docs/operations.md ("Alerts") and links sections the docs have.
//!
//! promtool is Prometheus' own, built from the Go module proxy at the version pinned in
//! `tests/tools/build-promtool.sh` into a cache outside the repository (`.ci/run` builds it
//! first), or the binary `$RELAYLET_PROMTOOL` names. Without it these tests fail, saying how to
//! get it.

use relaylet_dev::testkit as support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use relaylet_dev::sandbox::Settings;
use serde_json::{Value, json};
use support::RT;
use support::metrics::http_get;
use support::scratch::Scratch;

const NAMESPACE: &str = "relaylet";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The one object `template` of the chart renders with `flags` (release "relaylet" in namespace
/// "relaylet"), as JSON.
fn render(template: &str, flags: &[&str]) -> Value {
    let helm = relaylet_sim::tools::helm().expect("helm 4 (installed by tests/tools/install.sh)");
    let tmp = std::env::temp_dir();
    let out = Command::new(helm)
        .args(["template", "relaylet"])
        .arg(repo().join("charts/relaylet"))
        .args(["--namespace", NAMESPACE, "--show-only", template])
        .args(flags)
        .env("KUBECONFIG", "/nonexistent")
        .env("HELM_CACHE_HOME", tmp.join("relaylet-helm-cache"))
        .env("HELM_CONFIG_HOME", tmp.join("relaylet-helm-config"))
        .env("HELM_DATA_HOME", tmp.join("relaylet-helm-data"))
        .output()
        .expect("running helm");
    assert!(
        out.status.success(),
        "helm template {template} {flags:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&String::from_utf8_lossy(&out.stdout)).expect("YAML");
    let mut docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
    assert_eq!(docs.len(), 1, "{template} renders one object");
    docs.remove(0)
}

/// The PrometheusRule as the chart ships it by default (only turned on).
fn shipped_rule() -> Value {
    render(
        "templates/prometheusrule.yaml",
        &["--set", "metrics.prometheusRule.enabled=true"],
    )
}

/// The Grafana dashboard as the chart's ConfigMap carries it.
fn shipped_dashboard() -> Value {
    let cm = render(
        "templates/dashboards.yaml",
        &["--set", "dashboards.enabled=true"],
    );
    let json = cm["data"]["relaylet.json"]
        .as_str()
        .expect("the ConfigMap holds relaylet.json");
    serde_json::from_str(json).expect("the dashboard is JSON")
}

/// Every alerting rule of a PrometheusRule.
fn alerts(rule: &Value) -> Vec<&Value> {
    rule["spec"]["groups"]
        .as_array()
        .expect("spec.groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .collect()
}

/// promtool: `$RELAYLET_PROMTOOL`, or built (once, then cached) by tests/tools/build-promtool.sh.
fn promtool() -> PathBuf {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(path) = std::env::var_os("RELAYLET_PROMTOOL") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "RELAYLET_PROMTOOL={} is not a file",
            path.display()
        );
        return path;
    }
    let script = repo().join("tests/tools/build-promtool.sh");
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .expect("running bash");
    assert!(
        out.status.success(),
        "promtool is needed to test the chart's alerts, and {} could not build it ({}):\n{}\n\
         Install Go 1.26 (go.dev/dl) so the script builds it from the Go module proxy, or set \
         RELAYLET_PROMTOOL to a promtool 3.x binary.",
        script.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let path = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
    assert!(path.is_file(), "build-promtool.sh printed {stdout:?}");
    path
}

/// Writes `rule`'s groups as the rules file promtool reads (JSON is YAML) and the unit tests
/// beside it, and runs `promtool args...` there.
fn promtool_on(rule: &Value, dir: &Path, args: &[&str]) -> Output {
    let groups = json!({ "groups": rule["spec"]["groups"] });
    std::fs::write(
        dir.join("rules.yaml"),
        serde_json::to_string_pretty(&groups).unwrap(),
    )
    .unwrap();
    std::fs::copy(
        repo().join("tests/monitoring/alerts-test.yaml"),
        dir.join("alerts-test.yaml"),
    )
    .unwrap();
    Command::new(promtool())
        .args(args)
        .current_dir(dir)
        .output()
        .expect("running promtool")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn the_shipped_alerts_pass_promtool_and_their_unit_tests() {
    let rule = shipped_rule();
    let names: BTreeSet<String> = alerts(&rule)
        .iter()
        .map(|a| a["alert"].as_str().expect("an alerting rule").to_string())
        .collect();
    assert_eq!(names.len(), 13, "{names:?}");
    let dir = Scratch::new("promtool-rules");

    let check = promtool_on(&rule, &dir.0, &["check", "rules", "rules.yaml"]);
    let said = text(&check);
    assert!(check.status.success(), "promtool check rules:\n{said}");
    assert!(
        said.contains(&format!("SUCCESS: {} rules found", names.len())),
        "{said}"
    );

    let test = promtool_on(&rule, &dir.0, &["test", "rules", "alerts-test.yaml"]);
    let said = text(&test);
    assert!(test.status.success(), "promtool test rules:\n{said}");
    assert!(said.contains("SUCCESS"), "{said}");

    // Every alert the chart ships is tested both ways, and the tests name no other alert.
    let tests: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(repo().join("tests/monitoring/alerts-test.yaml")).unwrap(),
    )
    .unwrap();
    let mut fires = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for case in tests["tests"].as_array().unwrap() {
        for check in case["alert_rule_test"].as_array().unwrap() {
            let name = check["alertname"].as_str().unwrap().to_string();
            if check["exp_alerts"]
                .as_array()
                .is_some_and(|a| !a.is_empty())
            {
                fires.insert(name);
            } else {
                quiet.insert(name);
            }
        }
    }
    assert_eq!(
        fires, names,
        "an alert no test fires, or a test of no alert"
    );
    assert_eq!(
        quiet, names,
        "an alert no test keeps quiet, or a test of no alert"
    );
}

#[test]
fn a_broken_rule_fails_its_promtool_test() {
    let mut rule = shipped_rule();
    let mut broken = 0;
    for group in rule["spec"]["groups"].as_array_mut().unwrap() {
        for alert in group["rules"].as_array_mut().unwrap() {
            if alert["alert"] == "RelayletLeafUnreachable" {
                // A probe that answered, read as one that did not.
                alert["expr"] = json!(alert["expr"].as_str().unwrap().replace("== 0", "== 1"));
                broken += 1;
            }
        }
    }
    assert_eq!(broken, 1);
    let dir = Scratch::new("promtool-broken");
    let out = promtool_on(&rule, &dir.0, &["test", "rules", "alerts-test.yaml"]);
    let said = text(&out);
    assert!(
        !out.status.success(),
        "the unit tests passed a broken rule:\n{said}"
    );
    assert!(
        said.contains("alertname: RelayletLeafUnreachable"),
        "{said}"
    );
    assert!(
        !said.contains("alertname: RelayletRootUnreachable"),
        "{said}"
    );
}

/// The metric names `expr` (PromQL, or a Grafana variable's query) reads: identifiers that start
/// with `relaylet_` or `process_`, outside quoted strings and Grafana's `$variables`.
fn series_in(expr: &str) -> BTreeSet<String> {
    let bytes = expr.as_bytes();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if matches!(c, b'"' | b'\'' | b'`') {
            i += 1;
            while i < bytes.len() && bytes[i] != c {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c.is_ascii_alphabetic() || c == b'_' || c == b':' {
            let start = i;
            while i < bytes.len()
                && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] == b':')
            {
                i += 1;
            }
            let word = &expr[start..i];
            let variable = start > 0 && bytes[start - 1] == b'$';
            if !variable && (word.starts_with("relaylet_") || word.starts_with("process_")) {
                names.insert(word.to_string());
            }
        } else {
            i += 1;
        }
    }
    names
}

/// Every query of a Grafana dashboard: its panels' targets (rows' panels too) and its
/// variables' queries, each with where it is.
fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    fn panels(list: &Value, out: &mut Vec<(String, String)>) {
        for panel in list.as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or("?");
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    out.push((format!("panel {title:?}"), expr.to_string()));
                }
            }
            panels(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&dashboard["panels"], &mut out);
    for var in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let name = var["name"].as_str().unwrap_or("?");
        for query in [&var["definition"], &var["query"], &var["query"]["query"]] {
            if let Some(q) = query.as_str() {
                out.push((format!("variable ${name}"), q.to_string()));
            }
        }
    }
    out
}

/// The names in `queries` (where, expression) that are not in `exported`, with where.
fn unknown_series(
    queries: &[(String, String)],
    exported: &BTreeSet<String>,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut unknown: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (place, expr) in queries {
        for name in series_in(expr) {
            if !exported.contains(&name) {
                unknown.entry(name).or_default().insert(place.clone());
            }
        }
    }
    unknown
}

/// What the sandbox's relaylet serves on `/metrics` (its real operations port).
fn scrape() -> String {
    let e = support::env(Settings::default);
    let got = RT.block_on(http_get(e.sandbox.relaylet.metrics_addr, "/metrics"));
    assert_eq!(got.status, 200, "{}", got.body);
    got.body
}

/// The value of the unlabelled sample `name` in exposition `text`.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

#[test]
fn the_series_reader_finds_names_and_leaves_strings_and_variables() {
    let expr = r#"sum by (leaf) (rate(relaylet_sessions_totl{result=~"relaylet_in_a_string", pod=~"$pod"}[$__rate_interval])) / on() group_left process_cpu_seconds_total"#;
    assert_eq!(
        series_in(expr).into_iter().collect::<Vec<_>>(),
        ["process_cpu_seconds_total", "relaylet_sessions_totl"]
    );
    let exported: BTreeSet<String> = relaylet::ops::Metrics::new()
        .series()
        .iter()
        .cloned()
        .collect();
    let unknown = unknown_series(&[("here".to_string(), expr.to_string())], &exported);
    assert_eq!(
        unknown.keys().collect::<Vec<_>>(),
        ["relaylet_sessions_totl"],
        "a misspelt series is caught, a real one is not"
    );
}

#[test]
fn every_series_the_rules_and_the_dashboard_query_is_one_relaylet_exports() {
    let exported: BTreeSet<String> = relaylet::ops::Metrics::new()
        .series()
        .iter()
        .cloned()
        .collect();

    // The list is what the real endpoint serves: the sandbox's relaylet, with its two leaves
    // registered and served, writes only names from it, the process series among them.
    let e = support::env(Settings::default);
    let leaves = e.sandbox.leaves.len() as f64;
    let mut body = String::new();
    support::wait_until(
        "both leaves registered and served",
        Duration::from_secs(60),
        || {
            body = scrape();
            sample(&body, "relaylet_virtual_nodes_registered") == Some(leaves)
                && sample(&body, "relaylet_virtual_nodes_served") == Some(leaves)
        },
    );
    let mut served = BTreeSet::new();
    for line in body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        assert!(
            exported.contains(name),
            "/metrics serves {name}, which Metrics::series() does not name"
        );
        served.insert(name.to_string());
    }
    for name in [
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "relaylet_root_reachable",
        "relaylet_leaf_reachable",
        "relaylet_leader",
    ] {
        assert!(served.contains(name), "{name} not served:\n{body}");
    }

    // The rules and the dashboard, as the chart ships them.
    let rule = shipped_rule();
    let mut queries: Vec<(String, String)> = alerts(&rule)
        .iter()
        .map(|a| {
            (
                format!("alert {}", a["alert"].as_str().unwrap_or("?")),
                a["expr"].as_str().expect("expr").to_string(),
            )
        })
        .collect();
    let dashboard = dashboard_queries(&shipped_dashboard());
    assert!(dashboard.len() > 30, "{dashboard:?}");
    queries.extend(dashboard.iter().cloned());
    let unknown = unknown_series(&queries, &exported);
    assert!(
        unknown.is_empty(),
        "queried but not exported by relaylet: {unknown:#?}\nexported: {exported:#?}"
    );

    // The dashboard shows what it is for.
    let shown: BTreeSet<String> = dashboard.iter().flat_map(|(_, q)| series_in(q)).collect();
    for name in [
        "relaylet_sessions_active",
        "relaylet_sessions_total",
        "relaylet_relayed_bytes_total",
        "relaylet_leaf_reachable",
        "relaylet_virtual_nodes_served",
        "relaylet_virtual_nodes_registered",
        "relaylet_virtual_node_takeovers_total",
        "relaylet_leaf_secret_refusals_total",
        "relaylet_limit_refusals_total",
        "process_resident_memory_bytes",
    ] {
        assert!(shown.contains(name), "the dashboard has no panel on {name}");
    }
}

/// GitHub's anchor for a Markdown heading.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn every_alert_has_its_row_in_the_docs_and_links_sections_they_have() {
    let rule = shipped_rule();
    let docs_url = "https://github.com/relaylet/relaylet/blob/main/docs/";
    let operations = std::fs::read_to_string(repo().join("docs/operations.md")).unwrap();
    for alert in alerts(&rule) {
        let name = alert["alert"].as_str().unwrap();
        assert!(
            operations.contains(&format!("| `{name}` |")),
            "docs/operations.md has no row for {name}"
        );
        for (key, value) in alert["annotations"].as_object().unwrap() {
            let value = value.as_str().unwrap();
            let links: Vec<&str> = value
                .split_whitespace()
                .filter_map(|w| w.strip_prefix(docs_url))
                .collect();
            if key == "runbook_url" || key == "description" {
                assert!(!links.is_empty(), "{name}: {key} links no section: {value}");
            }
            for link in links {
                let (file, anchor) = link.split_once('#').expect("a section");
                let text = std::fs::read_to_string(repo().join("docs").join(file))
                    .unwrap_or_else(|e| panic!("{name}: docs/{file}: {e}"));
                let anchors: BTreeSet<String> = text
                    .lines()
                    .filter(|l| l.starts_with('#'))
                    .map(|l| slug(&l.trim_start_matches('#').replace('`', "")))
                    .collect();
                assert!(
                    anchors.contains(anchor),
                    "{name}: docs/{file} has no section #{anchor}"
                );
            }
        }
    }
}
