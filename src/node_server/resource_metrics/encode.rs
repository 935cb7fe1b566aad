//! A virtual node's usage in the kubelet's two shapes: `/metrics/resource` (Prometheus text with
//! sample timestamps, what metrics-server scrapes) and `/stats/summary`.

use std::fmt::Write;

use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use super::node_stats::{ContainerUsage, NodeUsage, PodUsage};

/// The Content-Type kubelets answer `/metrics/resource` with.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Milliseconds since the epoch, the sample timestamp of the text format.
fn millis(t: Timestamp) -> i64 {
    t.as_millisecond()
}

/// Escapes a label value for the Prometheus text format.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// `/metrics/resource` in the kubelet's format (Prometheus text 0.0.4 with sample timestamps).
/// `scrape_error` is set when the leaf could not be read; then only that gauge is reported.
pub fn encode_resource_metrics(usage: Option<&NodeUsage>) -> String {
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, samples: &[(String, String, i64)]| {
        let _ = writeln!(out, "# HELP {name} [STABLE] {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, value, ts) in samples {
            let _ = writeln!(out, "{name}{labels} {value} {ts}");
        }
    };
    let Some(usage) = usage else {
        let _ = writeln!(
            out,
            "# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise"
        );
        let _ = writeln!(out, "# TYPE resource_scrape_error gauge");
        let _ = writeln!(out, "resource_scrape_error 1");
        return out;
    };
    let container_labels = |p: &PodUsage, c: &ContainerUsage| {
        format!(
            "{{container=\"{}\",namespace=\"{}\",pod=\"{}\"}}",
            escape(&c.name),
            escape(&p.namespace),
            escape(&p.name)
        )
    };
    let pod_labels = |p: &PodUsage| {
        format!(
            "{{namespace=\"{}\",pod=\"{}\"}}",
            escape(&p.namespace),
            escape(&p.name)
        )
    };
    let per_container = |f: &dyn Fn(&ContainerUsage) -> Option<String>| {
        let mut v = Vec::new();
        for p in &usage.pods {
            for c in &p.containers {
                if let Some(value) = f(c) {
                    v.push((container_labels(p, c), value, millis(p.timestamp)));
                }
            }
        }
        v
    };
    family(
        "container_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the container in core-seconds",
        &per_container(&|c| Some(c.cpu_seconds.to_string())),
    );
    family(
        "container_memory_working_set_bytes",
        "gauge",
        "Current working set of the container in bytes",
        &per_container(&|c| Some(c.memory_bytes.to_string())),
    );
    family(
        "container_start_time_seconds",
        "gauge",
        "Start time of the container since unix epoch in seconds",
        &per_container(&|c| {
            c.start_time
                .map(|t| (t.as_millisecond() as f64 / 1000.0).to_string())
        }),
    );
    let ts = millis(usage.timestamp);
    family(
        "node_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the node in core-seconds",
        &[(String::new(), usage.cpu_seconds.to_string(), ts)],
    );
    family(
        "node_memory_working_set_bytes",
        "gauge",
        "Current working set of the node in bytes",
        &[(String::new(), usage.memory_bytes.to_string(), ts)],
    );
    let per_pod = |f: &dyn Fn(&PodUsage) -> String| {
        usage
            .pods
            .iter()
            .map(|p| (pod_labels(p), f(p), millis(p.timestamp)))
            .collect::<Vec<_>>()
    };
    family(
        "pod_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the pod in core-seconds",
        &per_pod(&|p| p.cpu_seconds().to_string()),
    );
    family(
        "pod_memory_working_set_bytes",
        "gauge",
        "Current working set of the pod in bytes",
        &per_pod(&|p| p.memory_bytes().to_string()),
    );
    let _ = writeln!(
        out,
        "# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise"
    );
    let _ = writeln!(out, "# TYPE resource_scrape_error gauge");
    let _ = writeln!(out, "resource_scrape_error 0");
    out
}

/// `/stats/summary` in the kubelet's `stats/v1alpha1` Summary shape (the fields metrics-server
/// and `kubectl top` consumers read).
pub fn summary(usage: &NodeUsage) -> serde_json::Value {
    let time = usage.timestamp.to_string();
    let cpu = |cores: f64, seconds: f64, time: &str| {
        json!({
            "time": time,
            "usageNanoCores": (cores * 1e9).round() as u64,
            "usageCoreNanoSeconds": (seconds * 1e9).round() as u64,
        })
    };
    let memory = |bytes: u64, time: &str| json!({ "time": time, "workingSetBytes": bytes, "usageBytes": bytes });
    let pods: Vec<serde_json::Value> = usage
        .pods
        .iter()
        .map(|p| {
            let time = p.timestamp.to_string();
            let containers: Vec<serde_json::Value> = p
                .containers
                .iter()
                .map(|c| {
                    json!({
                        "name": c.name,
                        "startTime": c.start_time.map(|t| t.to_string()),
                        "cpu": cpu(c.cpu_cores, c.cpu_seconds, &time),
                        "memory": memory(c.memory_bytes, &time),
                    })
                })
                .collect();
            json!({
                "podRef": { "name": p.name, "namespace": p.namespace, "uid": p.uid },
                "startTime": p.start_time.map(|t| t.to_string()),
                "containers": containers,
                "cpu": cpu(p.cpu_cores(), p.cpu_seconds(), &time),
                "memory": memory(p.memory_bytes(), &time),
            })
        })
        .collect();
    json!({
        "node": {
            "nodeName": usage.node,
            "cpu": cpu(usage.cpu_cores, usage.cpu_seconds, &time),
            "memory": memory(usage.memory_bytes, &time),
        },
        "pods": pods,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
