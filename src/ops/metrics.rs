//! relaylet's own Prometheus metrics: what operators watch to trust it.
//!
//! One [`Metrics`] per running relaylet (tests run several in one process, so nothing is
//! global), and beside its `relaylet_*` families the `process_*` series every Prometheus client
//! library exports (memory, CPU, file descriptors), read from `/proc/self` at each scrape. Families are cheap to update: counters and gauges are relaxed atomics; a labelled
//! child is looked up once per session, never per relayed chunk. Served in the OpenMetrics text
//! format on `METRICS_ADDR` and, behind `nodes/metrics` authorization, on the kubelet port.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry};

/// Labels of one session family: `kind` is exec, attach, portforward or containerLogs.
pub type SessionLabels = [(&'static str, String); 2];
/// Labels of a finished session.
pub type ResultLabels = [(&'static str, String); 3];
/// A single label.
pub type OneLabel = [(&'static str, String); 1];
/// Labels of a connection to a leaf: `leaf` and `source` (`spare` or `dialed`).
pub type LeafConnectionLabels = [(&'static str, String); 2];

/// The Content-Type of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Every metric relaylet exports. Cheap to clone (the families are shared).
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    /// The `process_*` series, unprefixed as every client library names them.
    process: Arc<Registry>,
    /// The name of every series the two registries can export (see [`Metrics::series`]).
    series: Arc<Vec<String>>,
    /// Open sessions by kind and leaf.
    pub sessions_active: Family<SessionLabels, Gauge>,
    /// Finished sessions by kind, leaf and result (see `relay` for the results).
    pub sessions: Family<ResultLabels, Counter>,
    /// Bytes relayed by direction (`to_leaf`, `to_client`), counted as they move.
    pub bytes: Family<OneLabel, Counter>,
    /// From the call reaching the relay to the leaf's answer (101 or error), by kind.
    pub upgrade_latency: Family<OneLabel, Histogram>,
    /// 1 when the last probe of a leaf's apiserver succeeded.
    pub leaf_reachable: Family<OneLabel, Gauge>,
    /// 1 when the last probe of the root apiserver succeeded.
    pub root_reachable: Gauge,
    /// Failed writes of virtual Nodes (`kind="node"`), their Leases (`kind="lease"`) and the
    /// leaves' `LeafCluster` rows (`kind="leaf_row"`) and renewals of leaf tokens
    /// (`kind="leaf_credential"`).
    pub node_write_errors: Family<OneLabel, Counter>,
    /// Writes of a held virtual Node that found it changed since this replica last read or
    /// wrote it (409 on its resourceVersion): not errors, the Node is read again.
    pub node_write_conflicts: Counter,
    /// 1 while this replica is the elected leader.
    pub leader: Gauge,
    /// Authentication and authorization outcomes on the kubelet port, by `decision`
    /// (`allowed`, `denied`, `unauthenticated`, `error`).
    pub auth_decisions: Family<OneLabel, Counter>,
    /// Connections the stream clients opened to leaves, by leaf and by whether the spare
    /// connection served it (`source="spare"`) or the session had to dial (`"dialed"`).
    pub leaf_connections: Family<LeafConnectionLabels, Counter>,
    /// Calls refused because their root pod's leaf pod did not prove to be its counterpart, by
    /// leaf and reason (see `counterpart`). Per-pod detail is in the log, not in labels.
    pub counterpart_refusals: Family<LeafConnectionLabels, Counter>,
    /// Rounds in which the leader looked for this install's Nodes whose leaf is gone.
    pub orphan_checks: Counter,
    /// Connections and streams refused at a cap, by `cap` (`connections`,
    /// `unauthenticated_connections`, `handshakes`, `sessions`, `log_streams`).
    pub limit_refusals: Family<OneLabel, Counter>,
    /// `SERVING_CERT_MODE=csr`: 1 while this replica's CSR waits for approval and signing.
    pub serving_cert_pending: Gauge,
    /// `SERVING_CERT_MODE=csr`: certificates issued to this replica (the first and renewals).
    pub serving_cert_issued: Counter,
    /// `SERVING_CERT_MODE=csr`: when the served certificate expires (Unix seconds).
    pub serving_cert_expiry: Gauge,
    /// The CSR approver's decisions on CSRs relaylet's identity made, by `decision`
    /// (`approved`, `refused`).
    pub csr_approver_decisions: Family<OneLabel, Counter>,
    /// Leaf Secrets refused (never registered), by `reason` (see `leaf::refusal`).
    pub leaf_secret_refusals: Family<OneLabel, Counter>,
    /// Virtual nodes this replica writes now (their Node's `relaylet.io/served-by`).
    pub virtual_nodes_served: Gauge,
    /// Virtual nodes of the leaves this replica has registered: every replica registers every
    /// leaf, so across replicas the served nodes add up to this.
    pub virtual_nodes_registered: Gauge,
    /// Leaves whose watches this replica runs now: those of the Nodes it serves, is taking
    /// over or is handing over (each leaf is watched by one replica).
    pub leaves_served: Gauge,
    /// Virtual nodes this replica took over (created, taken from a replica gone, or handed
    /// back to it).
    pub virtual_node_takeovers: Counter,

    // Leaf bounds: what a leaf sent past relaylet's limits.
    /// Answers read from a leaf past a limit (`watch_line`, `body`, `error_body`), and times a
    /// leaf held more pods or nodes than relaylet keeps (`pods`, `nodes`), by leaf and limit.
    pub leaf_limits_exceeded: Family<LeafConnectionLabels, Counter>,

    /// Writes of replica Leases (presence or leader) that break the replica rules and are not
    /// counted, by `reason` (see `replicas::identity`).
    pub ignored_leases: Family<OneLabel, Counter>,

    /// Pod sync: what was done for pods, by `action` (`leaf_create`, `leaf_patch`,
    /// `leaf_delete`, `root_status`, `root_delete`, `root_fail`).
    pub pod_sync_actions: Family<OneLabel, Counter>,
    /// Pod sync: reconciles of a pod that failed and are retried, by `side` (`root`, `leaf`).
    pub pod_sync_errors: Family<OneLabel, Counter>,
    /// Pod sync: root pods bound to the virtual nodes this replica serves.
    pub pods_synced: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut families = Families::default();
        let sessions_active = Family::<SessionLabels, Gauge>::default();
        families.register(
            "sessions_active",
            "Open relayed sessions (exec, attach, port-forward, logs) by kind and leaf",
            sessions_active.clone(),
        );
        let sessions = Family::<ResultLabels, Counter>::default();
        families.register(
            "sessions",
            "Finished relayed sessions by kind, leaf and result",
            sessions.clone(),
        );
        let bytes = Family::<OneLabel, Counter>::default();
        families.register(
            "relayed_bytes",
            "Bytes relayed, by direction (to_leaf, to_client)",
            bytes.clone(),
        );
        let upgrade_latency = Family::<OneLabel, Histogram>::new_with_constructor(|| {
            // 5 ms .. ~20 s: a local leaf answers in milliseconds, a far one in a second.
            Histogram::new(exponential_buckets(0.005, 2.0, 13))
        });
        families.register(
            "upgrade_latency_seconds",
            "Time from a call reaching relaylet to the leaf's answer (101 Switching Protocols or an error), by kind",
            upgrade_latency.clone(),
        );
        let leaf_reachable = Family::<OneLabel, Gauge>::default();
        families.register(
            "leaf_reachable",
            "1 when the leaf cluster's apiserver answered the last probe",
            leaf_reachable.clone(),
        );
        let root_reachable = Gauge::default();
        families.register(
            "root_reachable",
            "1 when the root cluster's apiserver answered the last probe",
            root_reachable.clone(),
        );
        let node_write_errors = Family::<OneLabel, Counter>::default();
        families.register(
            "node_write_errors",
            "Failed writes of virtual Nodes (kind=node), their Leases (kind=lease), LeafCluster rows (kind=leaf_row) and leaf token renewals (kind=leaf_credential)",
            node_write_errors.clone(),
        );
        let node_write_conflicts = Counter::default();
        families.register(
            "node_write_conflicts",
            "Writes of a held virtual Node refused because the Node changed since this replica last read or wrote it (409 on its resourceVersion); the Node is read again and the write retried",
            node_write_conflicts.clone(),
        );
        let leader = Gauge::default();
        families.register(
            "leader",
            "1 while this replica is the elected leader (it writes the virtual Nodes)",
            leader.clone(),
        );
        let auth_decisions = Family::<OneLabel, Counter>::default();
        families.register(
            "auth_decisions",
            "Kubelet-port authentication and authorization outcomes by decision",
            auth_decisions.clone(),
        );
        let leaf_connections = Family::<LeafConnectionLabels, Counter>::default();
        families.register(
            "leaf_connections",
            "Connections relayed calls took to a leaf apiserver, by leaf and source (spare: dialed ahead of the session; dialed: by the session)",
            leaf_connections.clone(),
        );
        let counterpart_refusals = Family::<LeafConnectionLabels, Counter>::default();
        families.register(
            "counterpart_refusals",
            "Calls refused because the leaf pod did not prove to be the root pod's counterpart, by leaf and reason",
            counterpart_refusals.clone(),
        );
        let orphan_checks = Counter::default();
        families.register(
            "orphan_checks",
            "Rounds in which the leader looked for this install's virtual Nodes whose leaf is gone",
            orphan_checks.clone(),
        );
        let serving_cert_pending = Gauge::default();
        families.register(
            "serving_certificate_csr_pending",
            "1 while this replica's serving-certificate CSR waits for approval and signing (SERVING_CERT_MODE=csr)",
            serving_cert_pending.clone(),
        );
        let serving_cert_issued = Counter::default();
        families.register(
            "serving_certificates_issued",
            "Serving certificates issued to this replica by kubernetes.io/kubelet-serving, the first and each renewal",
            serving_cert_issued.clone(),
        );
        let serving_cert_expiry = Gauge::default();
        families.register(
            "serving_certificate_expiration_timestamp_seconds",
            "When the CSR-issued serving certificate expires, in Unix seconds (alert when it comes near)",
            serving_cert_expiry.clone(),
        );
        let limit_refusals = Family::<OneLabel, Counter>::default();
        families.register(
            "limit_refusals",
            "Connections and streams refused at a cap, by cap (connections, unauthenticated_connections, handshakes, sessions, sessions_per_namespace, log_streams, log_streams_per_namespace)",
            limit_refusals.clone(),
        );
        let csr_approver_decisions = Family::<OneLabel, Counter>::default();
        families.register(
            "csr_approver_decisions",
            "The CSR approver's decisions on kubelet-serving CSRs made by relaylet's identity, by decision (approved, refused)",
            csr_approver_decisions.clone(),
        );
        let leaf_secret_refusals = Family::<OneLabel, Counter>::default();
        families.register(
            "leaf_secret_refusals",
            "Leaf Secrets refused and not registered, by reason (exec_plugin, token_file, node_name_taken, ...); the Secret's Warning Event says which",
            leaf_secret_refusals.clone(),
        );
        let virtual_nodes_served = Gauge::default();
        families.register(
            "virtual_nodes_served",
            "Virtual nodes this replica writes now (each Node names its replica in relaylet.io/served-by; the root apiserver sends that node's sessions there)",
            virtual_nodes_served.clone(),
        );
        let virtual_nodes_registered = Gauge::default();
        families.register(
            "virtual_nodes_registered",
            "Virtual nodes of the leaf Secrets this replica has registered (every replica registers every leaf; across replicas relaylet_virtual_nodes_served adds up to this)",
            virtual_nodes_registered.clone(),
        );
        let leaves_served = Gauge::default();
        families.register(
            "leaves_served",
            "Leaf clusters whose nodes and pods this replica watches now: the leaves of the virtual nodes it serves, takes over or hands over (each leaf is watched by one replica)",
            leaves_served.clone(),
        );
        let virtual_node_takeovers = Counter::default();
        families.register(
            "virtual_node_takeovers",
            "Virtual nodes this replica took over: created, taken from a replica gone, or handed back to it",
            virtual_node_takeovers.clone(),
        );
        // Leaf bounds.
        let leaf_limits_exceeded = Family::<LeafConnectionLabels, Counter>::default();
        families.register(
            "leaf_limit_exceeded",
            "Answers from a leaf read past relaylet's limit (limit=watch_line, body, error_body: the call failed) and times a leaf held more pods or nodes than relaylet keeps (limit=pods, nodes: its watch was dropped), by leaf and limit",
            leaf_limits_exceeded.clone(),
        );
        let ignored_leases = Family::<OneLabel, Counter>::default();
        families.register(
            "ignored_leases",
            "Writes of replica Leases (relaylet-replica-*, relaylet-leader) seen and not counted because they break the replica rules, by reason (holder_mismatch, not_a_live_pod)",
            ignored_leases.clone(),
        );
        let pod_sync_actions = Family::<OneLabel, Counter>::default();
        families.register(
            "pod_sync_actions",
            "What pod sync did for pods, by action (leaf_create, leaf_patch, leaf_delete, root_status, root_delete, root_fail)",
            pod_sync_actions.clone(),
        );
        let pod_sync_errors = Family::<OneLabel, Counter>::default();
        families.register(
            "pod_sync_errors",
            "Pod sync reconciles that failed and are retried with a backoff, by side (root, leaf)",
            pod_sync_errors.clone(),
        );
        let pods_synced = Gauge::default();
        families.register(
            "pods_synced",
            "Root pods bound to the virtual nodes this replica serves, whose leaf copies it keeps",
            pods_synced.clone(),
        );
        let (registry, series) = families.finish();
        Metrics {
            registry: Arc::new(registry),
            process: Arc::new(process_registry()),
            series: Arc::new(series),
            pod_sync_actions,
            pod_sync_errors,
            pods_synced,
            leaf_limits_exceeded,
            ignored_leases,
            virtual_nodes_served,
            virtual_nodes_registered,
            leaves_served,
            virtual_node_takeovers,
            leaf_secret_refusals,
            serving_cert_pending,
            serving_cert_issued,
            serving_cert_expiry,
            csr_approver_decisions,
            sessions_active,
            sessions,
            bytes,
            upgrade_latency,
            leaf_reachable,
            root_reachable,
            node_write_errors,
            node_write_conflicts,
            leader,
            auth_decisions,
            leaf_connections,
            counterpart_refusals,
            orphan_checks,
            limit_refusals,
        }
    }

    /// Counts one connection or stream refused at cap `cap` (see `limits::LimitError::cap`).
    pub fn limit_refusal(&self, cap: &'static str) {
        self.limit_refusals
            .get_or_create(&[("cap", cap.to_string())])
            .inc();
    }

    /// The counter of connections to `leaf` that came from `source` (`spare`: served by its spare
    /// connection; `dialed`: dialled for the session).
    pub fn leaf_connections(&self, leaf: &str, source: &'static str) -> Counter {
        self.leaf_connections
            .get_or_create(&[("leaf", leaf.to_string()), ("source", source.to_string())])
            .clone()
    }

    /// Counts one pod sync `action`.
    pub fn pod_sync_action(&self, action: &'static str) {
        self.pod_sync_actions
            .get_or_create(&[("action", action.to_string())])
            .inc();
    }

    /// Counts one failed pod sync reconcile on `side`.
    pub fn pod_sync_error(&self, side: &'static str) {
        self.pod_sync_errors
            .get_or_create(&[("side", side.to_string())])
            .inc();
    }

    /// The counter of bytes moving in `direction` (`to_leaf` or `to_client`).
    pub fn bytes_counter(&self, direction: &'static str) -> Counter {
        self.bytes
            .get_or_create(&[("direction", direction.to_string())])
            .clone()
    }

    /// Counts one authentication or authorization outcome.
    pub fn auth_decision(&self, decision: &'static str) {
        self.auth_decisions
            .get_or_create(&[("decision", decision.to_string())])
            .inc();
    }

    /// Counts one decision of the CSR approver (`approved`, `refused`).
    pub fn csr_approver_decision(&self, decision: &'static str) {
        self.csr_approver_decisions
            .get_or_create(&[("decision", decision.to_string())])
            .inc();
    }

    /// Counts one call refused for want of a proven leaf counterpart.
    pub fn counterpart_refusal(&self, leaf: &str, reason: &'static str) {
        self.counterpart_refusals
            .get_or_create(&[("leaf", leaf.to_string()), ("reason", reason.to_string())])
            .inc();
    }

    /// Counts one write of a replica Lease that is not counted (`replicas::identity`).
    pub fn ignored_lease(&self, reason: &'static str) {
        self.ignored_leases
            .get_or_create(&[("reason", reason.to_string())])
            .inc();
    }

    /// Counts one refused leaf Secret.
    pub fn leaf_secret_refusal(&self, reason: &'static str) {
        self.leaf_secret_refusals
            .get_or_create(&[("reason", reason.to_string())])
            .inc();
    }

    /// Counts one failed write of a virtual Node (`"node"`) or Lease (`"lease"`).
    pub fn node_write_error(&self, kind: &'static str) {
        self.node_write_errors
            .get_or_create(&[("kind", kind.to_string())])
            .inc();
    }

    /// Counts one write of a held virtual Node that found it changed (a 409).
    pub fn node_write_conflict(&self) {
        self.node_write_conflicts.inc();
    }

    /// Counts one time leaf `leaf` went past limit `limit` (see `leaf_limits_exceeded`).
    pub fn leaf_limit_exceeded(&self, leaf: &str, limit: &'static str) {
        self.leaf_limits_exceeded
            .get_or_create(&[("leaf", leaf.to_string()), ("limit", limit.to_string())])
            .inc();
    }

    /// The exposition text of every metric.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        encode_registry(&mut out, &self.registry)?;
        encode_registry(&mut out, &self.process)?;
        encode_eof(&mut out)?;
        Ok(out)
    }

    /// The name of every series [`Metrics::encode`] can write, as a query names it: a counter's
    /// with `_total`, a histogram's `_bucket`, `_sum` and `_count`. A family shows up in the
    /// exposition only once it has a sample (a refusal counter before the first refusal does
    /// not), so this, not one scrape, is the list a dashboard or an alert may use.
    pub fn series(&self) -> &[String] {
        &self.series
    }

    /// An HTTP answer carrying [`Metrics::encode`].
    pub fn response(&self) -> axum::response::Response {
        match self.encode() {
            Ok(text) => {
                let mut resp = axum::response::Response::new(axum::body::Body::from(text));
                resp.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static(CONTENT_TYPE),
                );
                resp
            }
            Err(err) => crate::model::status::response(
                http::StatusCode::INTERNAL_SERVER_ERROR,
                format!("encoding metrics: {err}"),
            ),
        }
    }
}

/// Registers relaylet's families under the `relaylet_` prefix and keeps the name of every series
/// each one makes.
struct Families {
    registry: Registry,
    series: Vec<String>,
}

impl Default for Families {
    fn default() -> Self {
        Families {
            registry: Registry::with_prefix("relaylet"),
            series: Vec::new(),
        }
    }
}

impl Families {
    fn register(&mut self, name: &str, help: &str, metric: impl Metric) {
        series_of(
            &format!("relaylet_{name}"),
            metric.metric_type(),
            &mut self.series,
        );
        self.registry.register(name, help, metric);
    }

    fn finish(self) -> (Registry, Vec<String>) {
        let mut series = self.series;
        for (name, kind, _) in PROCESS_SERIES {
            series_of(name, *kind, &mut series);
        }
        (self.registry, series)
    }
}

/// The series a family named `family` of type `kind` writes.
fn series_of(family: &str, kind: MetricType, out: &mut Vec<String>) {
    match kind {
        MetricType::Counter => out.push(format!("{family}_total")),
        MetricType::Histogram => {
            for suffix in ["_bucket", "_sum", "_count"] {
                out.push(format!("{family}{suffix}"));
            }
        }
        MetricType::Info => out.push(format!("{family}_info")),
        _ => out.push(family.to_string()),
    }
}

/// The process-wide families [`ProcessCollector`] writes: the `process_*` ones as client_golang
/// names them, and the allocator's heap in use.
const PROCESS_SERIES: &[(&str, MetricType, &str)] = &[
    (
        "process_resident_memory_bytes",
        MetricType::Gauge,
        "Resident memory size in bytes",
    ),
    (
        "process_virtual_memory_bytes",
        MetricType::Gauge,
        "Virtual memory size in bytes",
    ),
    (
        "process_cpu_seconds",
        MetricType::Counter,
        "Total user and system CPU time spent in seconds",
    ),
    (
        "process_open_fds",
        MetricType::Gauge,
        "Number of open file descriptors",
    ),
    (
        "process_max_fds",
        MetricType::Gauge,
        "Maximum number of open file descriptors",
    ),
    (
        "process_start_time_seconds",
        MetricType::Gauge,
        "Start time of the process since the Unix epoch in seconds",
    ),
    (
        "relaylet_heap_in_use_bytes",
        MetricType::Gauge,
        "Bytes glibc's allocator has handed out and not had back (mallinfo2: uordblks + hblkhd); resident memory less this is memory the allocator holds free",
    ),
];

fn process_registry() -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ProcessCollector));
    registry
}

/// Reads this process's figures from `/proc/self` at each scrape; writes nothing where there is
/// no `/proc` (or a figure cannot be read).
#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let figures = ProcessFigures::read();
        for (name, kind, help) in PROCESS_SERIES {
            let value = match *name {
                "process_resident_memory_bytes" => figures.resident_bytes,
                "process_virtual_memory_bytes" => figures.virtual_bytes,
                "process_cpu_seconds" => figures.cpu_seconds,
                "process_open_fds" => figures.open_fds,
                "process_max_fds" => figures.max_fds,
                "process_start_time_seconds" => figures.start_time_seconds,
                "relaylet_heap_in_use_bytes" => figures.heap_in_use_bytes,
                _ => None,
            };
            let Some(value) = value else { continue };
            if matches!(kind, MetricType::Counter) {
                let counter = ConstCounter::new(value);
                let metric = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
                counter.encode(metric)?;
            } else {
                let gauge = ConstGauge::new(value);
                let metric = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
                gauge.encode(metric)?;
            }
        }
        Ok(())
    }
}

/// One reading of `/proc/self`; a figure that cannot be read is `None`.
#[derive(Debug, Default)]
struct ProcessFigures {
    resident_bytes: Option<f64>,
    virtual_bytes: Option<f64>,
    cpu_seconds: Option<f64>,
    open_fds: Option<f64>,
    max_fds: Option<f64>,
    start_time_seconds: Option<f64>,
    heap_in_use_bytes: Option<f64>,
}

/// The unit of `/proc/<pid>/stat`'s times: USER_HZ, 100 on every architecture the image is
/// built for (the kernel's ABI, whatever its own tick rate).
const USER_HZ: f64 = 100.0;

impl ProcessFigures {
    fn read() -> ProcessFigures {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let mut figures = ProcessFigures {
            heap_in_use_bytes: crate::ops::memory::heap_in_use().map(|bytes| bytes as f64),
            ..ProcessFigures::default()
        };
        if let Some(status) = read("/proc/self/status") {
            figures.resident_bytes = status_kib(&status, "VmRSS:").map(|k| k * 1024.0);
        }
        if let Some(stat) = read("/proc/self/stat") {
            // The fields after the command name, which is in parentheses and may hold anything.
            let fields: Vec<&str> = stat
                .rsplit_once(')')
                .map(|(_, rest)| rest.split_whitespace().collect())
                .unwrap_or_default();
            // Field 3 of proc(5) is fields[0]: utime 14, stime 15, starttime 22, vsize 23.
            let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<f64>().ok());
            if let (Some(user), Some(system)) = (field(14), field(15)) {
                figures.cpu_seconds = Some((user + system) / USER_HZ);
            }
            figures.virtual_bytes = field(23);
            let boot = read("/proc/stat").and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("btime "))
                    .and_then(|v| v.trim().parse::<f64>().ok())
            });
            if let (Some(boot), Some(start)) = (boot, field(22)) {
                figures.start_time_seconds = Some(boot + start / USER_HZ);
            }
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            figures.open_fds = Some(fds.count() as f64);
        }
        figures.max_fds = read("/proc/self/limits").and_then(|limits| {
            limits
                .lines()
                .find_map(|l| l.strip_prefix("Max open files"))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|soft| soft.parse::<f64>().ok())
        });
        figures
    }
}

/// The value of a `/proc/self/status` line such as `VmRSS:  1234 kB`, in KiB.
fn status_kib(status: &str, key: &str) -> Option<f64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_show_up_with_their_labels() {
        let m = Metrics::new();
        m.bytes_counter("to_leaf").inc_by(5);
        m.auth_decision("denied");
        m.sessions
            .get_or_create(&[
                ("kind", "exec".to_string()),
                ("leaf", "leaf-1".to_string()),
                ("result", "completed".to_string()),
            ])
            .inc();
        let text = m.encode().unwrap();
        assert!(text.contains("relaylet_relayed_bytes_total{direction=\"to_leaf\"} 5"));
        assert!(text.contains("relaylet_auth_decisions_total{decision=\"denied\"} 1"));
        assert!(text.contains(
            "relaylet_sessions_total{kind=\"exec\",leaf=\"leaf-1\",result=\"completed\"} 1"
        ));
        assert!(text.ends_with("# EOF\n"));
        assert_eq!(text.matches("# EOF").count(), 1);
    }

    /// The value of the sample named exactly `name` (no labels).
    fn sample(text: &str, name: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn process_series_are_this_process_figures() {
        let m = Metrics::new();
        let before = vec![0u8; 8 << 20];
        let text = m.encode().unwrap();
        let rss = sample(&text, "process_resident_memory_bytes").unwrap();
        // The test binary and the buffer just made (its pages touched by the zeroing or not,
        // the binary alone is several MiB).
        assert!(rss > 1e6, "{rss}");
        assert!(sample(&text, "process_virtual_memory_bytes").unwrap() >= rss);
        assert!(text.contains("# TYPE process_cpu_seconds counter"));
        assert!(sample(&text, "process_cpu_seconds_total").unwrap() >= 0.0);
        assert!(sample(&text, "process_open_fds").unwrap() >= 3.0);
        assert!(
            sample(&text, "process_max_fds").unwrap() >= sample(&text, "process_open_fds").unwrap()
        );
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = sample(&text, "process_start_time_seconds").unwrap();
        assert!(
            start <= now + 1.0 && start > now - 86_400.0,
            "{start} vs {now}"
        );
        drop(before);
    }

    #[test]
    fn series_names_every_family_as_queries_name_it() {
        let m = Metrics::new();
        let series = m.series();
        for name in [
            "relaylet_sessions_total",
            "relaylet_sessions_active",
            "relaylet_upgrade_latency_seconds_bucket",
            "relaylet_upgrade_latency_seconds_sum",
            "relaylet_upgrade_latency_seconds_count",
            "relaylet_leaf_secret_refusals_total",
            "relaylet_virtual_nodes_registered",
            "process_resident_memory_bytes",
            "process_cpu_seconds_total",
        ] {
            assert!(series.iter().any(|s| s == name), "{name} in {series:?}");
        }
        assert!(!series.iter().any(|s| s == "relaylet_sessions"));
        // Every sample written, families with children included, is one of them.
        m.sessions_active
            .get_or_create(&[("kind", "exec".to_string()), ("leaf", "l".to_string())])
            .inc();
        m.upgrade_latency
            .get_or_create(&[("kind", "exec".to_string())])
            .observe(0.1);
        m.leaf_secret_refusal("exec_plugin");
        let text = m.encode().unwrap();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(series.iter().any(|s| s == name), "{name} not in series()");
        }
    }
}
