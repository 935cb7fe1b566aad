//! The configuration read from variables, checked variable by variable.

use std::collections::HashMap;
use std::time::Duration;

use super::*;
use crate::model::counterpart::LeafPodMatch;

fn config(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::from_lookup(|name| map.get(name).cloned())
}

fn serving(vars: &[(&str, &str)]) -> Result<ServingCert, String> {
    let mut all = vec![("LEAF_NODE_IP", "10.0.0.1")];
    all.extend_from_slice(vars);
    config(&all)
        .map(|c| c.serving_cert)
        .map_err(|e| e.to_string())
}

#[test]
fn serving_cert_mode_csr_with_its_settings() {
    assert_eq!(
        serving(&[("SERVING_CERT_MODE", "csr")]),
        Ok(ServingCert::Csr(CsrSettings {
            expiration: None,
            renew_before: None,
            approver: false,
        }))
    );
    assert_eq!(
        serving(&[
            ("SERVING_CERT_MODE", "csr"),
            ("SERVING_CERT_CSR_APPROVER", "true"),
            ("SERVING_CERT_CSR_EXPIRATION", "24h"),
            ("SERVING_CERT_RENEW_BEFORE", "2h"),
        ]),
        Ok(ServingCert::Csr(CsrSettings {
            expiration: Some(Duration::from_secs(24 * 3600)),
            renew_before: Some(Duration::from_secs(2 * 3600)),
            approver: true,
        }))
    );
    let short = serving(&[
        ("SERVING_CERT_MODE", "csr"),
        ("SERVING_CERT_CSR_EXPIRATION", "5m"),
    ])
    .unwrap_err();
    assert!(
        short.contains("SERVING_CERT_CSR_EXPIRATION: must be at least 10m"),
        "{short}"
    );
}

#[test]
fn serving_cert_mode_defaults_and_conflicts() {
    assert_eq!(serving(&[]), Ok(ServingCert::SelfSigned));
    assert_eq!(
        serving(&[("SERVING_CERT_MODE", "generate")]),
        Ok(ServingCert::SelfSigned)
    );
    let files = [
        ("APISERVER_CERT_LOCATION", "/tls/tls.crt"),
        ("APISERVER_KEY_LOCATION", "/tls/tls.key"),
    ];
    let expected = Ok(ServingCert::Files {
        cert: "/tls/tls.crt".into(),
        key: "/tls/tls.key".into(),
    });
    assert_eq!(serving(&files), expected);
    let mut with_mode = files.to_vec();
    with_mode.push(("SERVING_CERT_MODE", "files"));
    assert_eq!(serving(&with_mode), expected);
    let mut conflict = files.to_vec();
    conflict.push(("SERVING_CERT_MODE", "csr"));
    assert!(
        serving(&conflict)
            .unwrap_err()
            .contains("SERVING_CERT_MODE: APISERVER_CERT_LOCATION/APISERVER_KEY_LOCATION are set")
    );
    assert!(
        serving(&[("SERVING_CERT_MODE", "files")])
            .unwrap_err()
            .contains("APISERVER_CERT_LOCATION: required")
    );
    assert!(
        serving(&[("SERVING_CERT_MODE", "acme")])
            .unwrap_err()
            .contains("\"acme\" is not one of generate, files, csr")
    );
}

#[test]
fn defaults_need_only_the_pod_ip() {
    let c = config(&[("LEAF_NODE_IP", "10.1.2.3")]).unwrap();
    assert_eq!(c.leaf_node_ip.to_string(), "10.1.2.3");
    assert_eq!(c.preferred_address_type, "InternalDNS");
    assert_eq!(c.node_server_port, 10250);
    assert_eq!(c.auth_mode, AuthMode::Webhook);
    assert_eq!(c.stream_idle_timeout, Duration::from_secs(4 * 3600));
    assert_eq!(c.stream_creation_timeout, Duration::from_secs(30));
    assert_eq!(c.serving_cert, ServingCert::SelfSigned);
    assert_eq!(c.leaf_secret_label, DEFAULT_LEAF_SECRET_LABEL);
    assert_eq!(c.node_name("leaf-1"), "relaylet-leaf-1");
    assert!(c.leader_elect);
    assert!(c.leaf_spare_connection);
    assert!(c.extend_websockets_to_kubelet);
    assert_eq!(c.limits, Limits::default());
}

#[test]
fn flags_are_true_or_false() {
    let c = config(&[
        ("LEAF_NODE_IP", "10.0.0.1"),
        ("LEAF_SPARE_CONNECTION", "false"),
        ("LEADER_ELECT", "0"),
        ("EXTEND_WEBSOCKETS_TO_KUBELET", "false"),
    ])
    .unwrap();
    assert!(!c.leaf_spare_connection && !c.leader_elect && !c.extend_websockets_to_kubelet);
    let err = config(&[
        ("LEAF_NODE_IP", "10.0.0.1"),
        ("LEAF_SPARE_CONNECTION", "no"),
    ])
    .unwrap_err();
    assert_eq!(err.0[0].var, "LEAF_SPARE_CONNECTION");
    assert!(err.0[0].message.contains("\"no\" is not true or false"));
}

#[test]
fn shutdown_grace_period_defaults_to_30s_and_is_a_duration() {
    let c = config(&[("LEAF_NODE_IP", "10.0.0.1")]).unwrap();
    assert_eq!(c.shutdown_grace_period, Duration::from_secs(30));
    let c = config(&[
        ("LEAF_NODE_IP", "10.0.0.1"),
        ("SHUTDOWN_GRACE_PERIOD", "1m30s"),
    ])
    .unwrap();
    assert_eq!(c.shutdown_grace_period, Duration::from_secs(90));
    let err = config(&[
        ("LEAF_NODE_IP", "10.0.0.1"),
        ("SHUTDOWN_GRACE_PERIOD", "soon"),
    ])
    .unwrap_err();
    assert_eq!(err.0[0].var, "SHUTDOWN_GRACE_PERIOD");
}

#[test]
fn limits_are_positive_counts() {
    let c = config(&[("LEAF_NODE_IP", "10.0.0.1"), ("MAX_SESSIONS", "20000")]).unwrap();
    assert_eq!(c.limits.sessions, 20000);
    let err = config(&[
        ("LEAF_NODE_IP", "10.0.0.1"),
        ("MAX_CONNECTIONS", "0"),
        ("MAX_SESSIONS_PER_USER", "lots"),
    ])
    .unwrap_err();
    let vars: Vec<_> = err.0.iter().map(|e| e.var).collect();
    assert_eq!(vars, ["MAX_CONNECTIONS", "MAX_SESSIONS_PER_USER"]);
}

#[test]
fn leaf_bounds_default_to_kubernetes_scalability_limits() {
    let c = config(&[("LEAF_NODE_IP", "10.0.0.1")]).unwrap();
    assert_eq!(
        c.leaf_bounds,
        LeafBounds {
            max_pods: 150_000,
            max_nodes: 5_000
        }
    );
    let c = config(&[
        ("LEAF_NODE_IP", "10.0.0.1"),
        ("LEAF_MAX_PODS", "20000"),
        ("LEAF_MAX_NODES", "100"),
    ])
    .unwrap();
    assert_eq!(
        (c.leaf_bounds.max_pods, c.leaf_bounds.max_nodes),
        (20000, 100)
    );
    let err = config(&[
        ("LEAF_NODE_IP", "10.0.0.1"),
        ("LEAF_MAX_PODS", "0"),
        ("LEAF_MAX_NODES", "many"),
    ])
    .unwrap_err();
    let vars: Vec<_> = err.0.iter().map(|e| e.var).collect();
    assert_eq!(vars, ["LEAF_MAX_PODS", "LEAF_MAX_NODES"]);
}

#[test]
fn leaf_tokens_are_renewed_at_80_percent_unless_told() {
    let c = config(&[("LEAF_NODE_IP", "10.0.0.1")]).unwrap();
    assert_eq!(c.leaf_credential_renew_at, 80);
    let c = config(&[
        ("LEAF_NODE_IP", "10.0.0.1"),
        ("LEAF_CREDENTIAL_RENEW_AT", "5"),
    ])
    .unwrap();
    assert_eq!(c.leaf_credential_renew_at, 5);
    for bad in ["0", "100", "0.8", "soon"] {
        let err = config(&[
            ("LEAF_NODE_IP", "10.0.0.1"),
            ("LEAF_CREDENTIAL_RENEW_AT", bad),
        ])
        .unwrap_err();
        assert_eq!(err.0[0].var, "LEAF_CREDENTIAL_RENEW_AT", "{bad}");
    }
}

#[test]
fn namespace_shares_default_to_a_quarter_of_the_totals_as_set() {
    let c = config(&[("LEAF_NODE_IP", "10.0.0.1")]).unwrap();
    assert_eq!(
        (
            c.limits.sessions_per_namespace,
            c.limits.log_streams_per_namespace
        ),
        (4096, 256)
    );
    let c = config(&[
        ("LEAF_NODE_IP", "10.0.0.1"),
        ("MAX_SESSIONS", "100"),
        ("MAX_LOG_STREAMS", "2"),
    ])
    .unwrap();
    assert_eq!(
        (
            c.limits.sessions_per_namespace,
            c.limits.log_streams_per_namespace
        ),
        (25, 1)
    );
    let c = config(&[
        ("LEAF_NODE_IP", "10.0.0.1"),
        ("MAX_SESSIONS_PER_NAMESPACE", "7"),
        ("MAX_LOG_STREAMS_PER_NAMESPACE", "3"),
        ("MAX_UNAUTHENTICATED_CONNECTIONS_PER_USER", "4"),
        ("MAX_LARGE_HEAD_CONNECTIONS", "9"),
    ])
    .unwrap();
    assert_eq!(c.limits.sessions_per_namespace, 7);
    assert_eq!(c.limits.log_streams_per_namespace, 3);
    assert_eq!(c.limits.unauthenticated_connections_per_user, 4);
    assert_eq!(c.limits.large_head_connections, 9);
    let err = config(&[
        ("LEAF_NODE_IP", "10.0.0.1"),
        ("MAX_SESSIONS_PER_NAMESPACE", "0"),
    ])
    .unwrap_err();
    assert_eq!(err.0[0].var, "MAX_SESSIONS_PER_NAMESPACE");
}

#[test]
fn missing_pod_ip_names_the_variable() {
    let err = config(&[]).unwrap_err();
    assert_eq!(err.0.len(), 1);
    assert_eq!(err.0[0].var, "LEAF_NODE_IP");
    assert!(
        err.to_string()
            .starts_with("invalid configuration: LEAF_NODE_IP: required")
    );
}

#[test]
fn every_bad_value_is_reported_on_its_own_line() {
    let err = config(&[
        ("LEAF_NODE_IP", "not-an-ip"),
        ("NODE_SERVER_PORT", "65536"),
        ("AUTH_MODE", "open"),
        ("STREAM_IDLE_TIMEOUT", "4 hours"),
        ("PREFERRED-ADDRESS-TYPE", "Banana"),
        ("APISERVER_CERT_LOCATION", "/tls/tls.crt"),
    ])
    .unwrap_err();
    let vars: Vec<_> = err.0.iter().map(|e| e.var).collect();
    assert_eq!(
        vars,
        [
            "LEAF_NODE_IP",
            "PREFERRED-ADDRESS-TYPE",
            "APISERVER_KEY_LOCATION",
            "NODE_SERVER_PORT",
            "AUTH_MODE",
            "STREAM_IDLE_TIMEOUT"
        ]
    );
    assert_eq!(err.to_string().lines().count(), 6);
    assert!(
        err.to_string()
            .contains("NODE_SERVER_PORT: \"65536\" is not a port number 0-65535")
    );
}

#[test]
fn node_ports_bound_the_virtual_nodes_listeners() {
    let c = config(&[("LEAF_NODE_IP", "::1")]).unwrap();
    assert_eq!(c.node_ports, DEFAULT_NODE_PORTS);
    let c = config(&[("LEAF_NODE_IP", "::1"), ("NODE_PORTS", "3000")]).unwrap();
    assert_eq!(c.node_ports, 3000);
    for (bad, says) in [
        ("0", "\"0\" is not a whole number 1-65535"),
        ("many", "\"many\" is not a whole number 1-65535"),
        (
            "60000",
            "60000 ports above NODE_SERVER_PORT=10250 go past 65535",
        ),
    ] {
        let err = config(&[("LEAF_NODE_IP", "::1"), ("NODE_PORTS", bad)]).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("invalid configuration: NODE_PORTS: {says}"),
            "{bad}"
        );
    }
    // With NODE_SERVER_PORT=0 the port is picked at start: the search ends at 65535.
    let c = config(&[
        ("LEAF_NODE_IP", "::1"),
        ("NODE_SERVER_PORT", "0"),
        ("NODE_PORTS", "60000"),
    ])
    .unwrap();
    assert_eq!(c.node_ports, 60000);
}

#[test]
fn node_server_port_zero_takes_any_free_port() {
    let c = config(&[("LEAF_NODE_IP", "::1"), ("NODE_SERVER_PORT", "0")]).unwrap();
    assert_eq!(c.node_server_port, 0);
}

#[test]
fn kosmos_and_shell_spellings_of_the_address_type() {
    let c = config(&[
        ("LEAF_NODE_IP", "::1"),
        ("PREFERRED-ADDRESS-TYPE", "internalip"),
    ])
    .unwrap();
    assert_eq!(c.preferred_address_type, "InternalIP");
    let c = config(&[
        ("LEAF_NODE_IP", "::1"),
        ("PREFERRED_ADDRESS_TYPE", "Hostname"),
    ])
    .unwrap();
    assert_eq!(c.preferred_address_type, "Hostname");
}

#[test]
fn go_durations() {
    assert_eq!(parse_duration("4h").unwrap(), Duration::from_secs(14400));
    assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
    assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
    assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
    for bad in ["", "4", "h", "4x", "-1s", "1h-"] {
        assert!(parse_duration(bad).is_err(), "{bad:?} should fail");
    }
    for text in ["4h", "1h30m", "2s", "1.5s", "500ms", "1h0m", "90s", "1h1s"] {
        let d = parse_duration(text).unwrap();
        assert_eq!(parse_duration(&format_duration(d)).unwrap(), d, "{text}");
    }
    assert_eq!(format_duration(Duration::from_secs(4 * 3600)), "4h");
    assert_eq!(format_duration(Duration::from_secs(5400)), "1h30m");
    assert_eq!(format_duration(Duration::from_secs(90)), "1m30s");
    assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
    assert_eq!(format_duration(Duration::from_millis(500)), "500ms");
}

#[test]
fn auth_mode_none_needs_the_insecure_switch() {
    let err = config(&[("LEAF_NODE_IP", "10.0.0.1"), ("AUTH_MODE", "none")]).unwrap_err();
    assert_eq!(err.0.len(), 1);
    assert_eq!(err.0[0].var, "AUTH_MODE");
    assert!(
        err.0[0]
            .message
            .contains("INSECURE_ALLOW_UNAUTHENTICATED_EXEC=true"),
        "{err}"
    );
    let c = config(&[
        ("LEAF_NODE_IP", "10.0.0.1"),
        ("AUTH_MODE", "none"),
        ("INSECURE_ALLOW_UNAUTHENTICATED_EXEC", "true"),
    ])
    .unwrap();
    assert_eq!(c.auth_mode, AuthMode::None);
}

#[test]
fn x509_mode_needs_an_allow_list() {
    let err = config(&[("LEAF_NODE_IP", "10.0.0.1"), ("AUTH_MODE", "x509")]).unwrap_err();
    assert_eq!(err.0[0].var, "AUTH_MODE");
    assert!(err.0[0].message.contains("X509_ALLOWED_USERS"), "{err}");
    let c = config(&[
        ("LEAF_NODE_IP", "10.0.0.1"),
        ("AUTH_MODE", "x509"),
        ("X509_ALLOWED_USERS", "kube-apiserver-kubelet-client, admin"),
    ])
    .unwrap();
    assert_eq!(
        c.x509_allowed_users,
        ["kube-apiserver-kubelet-client", "admin"]
    );
    let err = config(&[
        ("LEAF_NODE_IP", "10.0.0.1"),
        ("X509_ALLOWED_USERS", "admin"),
    ])
    .unwrap_err();
    assert_eq!(err.0[0].var, "X509_ALLOWED_USERS");
}

#[test]
fn leaf_pod_matching_settings() {
    let c = config(&[("LEAF_NODE_IP", "10.0.0.1")]).unwrap();
    assert_eq!(c.leaf_pod_match, LeafPodMatch::default());
    assert!(c.leaf_pod_sync, "relaylet runs the pods by default");
    assert_eq!(
        c.leaf_pod_root_apiserver, None,
        "tokens are not forwarded by default"
    );
    for (raw, want) in [
        ("https://10.0.0.1:6443", Some(("10.0.0.1", 6443))),
        ("https://root.example.com", Some(("root.example.com", 443))),
        ("https://[fd00::1]:6443/", Some(("fd00::1", 6443))),
        ("http://10.0.0.1:6443", None),
        ("10.0.0.1:6443", None),
        ("https://user:pw@10.0.0.1:6443", None),
        ("https://10.0.0.1:6443/api", None),
        ("https://bad_host:6443", None),
    ] {
        let got = config(&[
            ("LEAF_NODE_IP", "10.0.0.1"),
            ("LEAF_POD_ROOT_APISERVER", raw),
        ]);
        match want {
            Some((host, port)) => {
                let a = got.unwrap().leaf_pod_root_apiserver.unwrap();
                assert_eq!((a.host.as_str(), a.port), (host, port), "{raw}");
            }
            None => assert_eq!(
                got.unwrap_err().0[0].var,
                "LEAF_POD_ROOT_APISERVER",
                "{raw}"
            ),
        }
    }
    let err = config(&[
        ("LEAF_NODE_IP", "10.0.0.1"),
        ("LEAF_POD_SYNC", "false"),
        ("LEAF_POD_ROOT_APISERVER", "https://10.0.0.1:6443"),
    ])
    .unwrap_err();
    assert_eq!(
        err.0[0].var, "LEAF_POD_ROOT_APISERVER",
        "only for the pods relaylet runs"
    );
    // Another syncer's copies (a label) and relaylet's own copies (the root
    // UID) cannot both be true of one leaf.
    let err = config(&[
        ("LEAF_NODE_IP", "10.0.0.1"),
        ("LEAF_POD_MATCH", "label"),
        ("LEAF_POD_MARKER", "sync.example/copy=yes"),
    ])
    .unwrap_err();
    assert_eq!(err.0[0].var, "LEAF_POD_SYNC");
    let c = config(&[
        ("LEAF_NODE_IP", "10.0.0.1"),
        ("LEAF_POD_SYNC", "false"),
        ("LEAF_POD_MATCH", "label"),
        ("LEAF_POD_MARKER", "sync.example/copy=yes"),
    ])
    .unwrap();
    assert_eq!(
        c.leaf_pod_match,
        LeafPodMatch::Label {
            key: "sync.example/copy".into(),
            value: "yes".into()
        }
    );
    let err = config(&[
        ("LEAF_NODE_IP", "10.0.0.1"),
        ("LEAF_POD_MATCH", "annotations"),
    ])
    .unwrap_err();
    assert_eq!(err.0[0].var, "LEAF_POD_MATCH");
    let err = config(&[
        ("LEAF_NODE_IP", "10.0.0.1"),
        ("LEAF_POD_SYNC", "false"),
        ("LEAF_POD_MATCH", "label"),
        ("LEAF_POD_MARKER", "no-value"),
    ])
    .unwrap_err();
    assert_eq!(err.0[0].var, "LEAF_POD_MARKER");
    let c = config(&[
        ("LEAF_NODE_IP", "10.0.0.1"),
        ("LEAF_KUBECONFIG", "/leaf/kubeconfig"),
        ("LEAF_NAMESPACE_MAP", "team-a=tenant-a"),
    ])
    .unwrap();
    assert_eq!(
        c.static_leaf.unwrap().namespaces.leaf_namespace("team-a"),
        Some("tenant-a")
    );
    let err = config(&[
        ("LEAF_NODE_IP", "10.0.0.1"),
        ("LEAF_NAMESPACE_MAP", "team-a=tenant-a"),
    ])
    .unwrap_err();
    assert_eq!(err.0[0].var, "LEAF_NAMESPACE_MAP");
}

#[test]
fn static_leaf_name_must_be_a_label() {
    let c = config(&[
        ("LEAF_NODE_IP", "10.0.0.1"),
        ("LEAF_KUBECONFIG", "/leaf/kubeconfig"),
        ("LEAF_CLUSTER_NAME", "leaf-a"),
    ])
    .unwrap();
    assert_eq!(c.static_leaf.unwrap().name, "leaf-a");
    let err = config(&[
        ("LEAF_NODE_IP", "10.0.0.1"),
        ("LEAF_KUBECONFIG", "/leaf/kubeconfig"),
        ("LEAF_CLUSTER_NAME", "Leaf_A"),
    ])
    .unwrap_err();
    assert_eq!(err.0[0].var, "LEAF_CLUSTER_NAME");
}

#[test]
fn replica_selector_is_a_deployments_match_labels() {
    let c = config(&[
        ("LEAF_NODE_IP", "10.0.0.1"),
        (
            "REPLICA_SELECTOR",
            "app.kubernetes.io/name=relaylet, app.kubernetes.io/instance==prod",
        ),
    ])
    .unwrap();
    let selector = c.replica_selector.unwrap();
    assert_eq!(
        selector.query(),
        "app.kubernetes.io/instance=prod,app.kubernetes.io/name=relaylet"
    );
    assert_eq!(
        config(&[("LEAF_NODE_IP", "10.0.0.1")])
            .unwrap()
            .replica_selector,
        None
    );
    for (bad, says) in [
        ("app", "is not key=value"),
        ("app!=relaylet", "label key \"app!\""),
        ("app=rel aylet", "only letters"),
        ("Bad_Prefix/app=x", "DNS subdomain"),
        ("app=-x", "start and end"),
        ("app=a,app=b", "given twice"),
        (",", "no labels"),
    ] {
        let err = config(&[("LEAF_NODE_IP", "10.0.0.1"), ("REPLICA_SELECTOR", bad)])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("REPLICA_SELECTOR: ") && err.contains(says),
            "{bad}: {err}"
        );
    }
    let err = config(&[
        ("LEAF_NODE_IP", "10.0.0.1"),
        ("LEADER_ELECT", "false"),
        ("REPLICA_SELECTOR", "app=relaylet"),
    ])
    .unwrap_err()
    .to_string();
    assert!(err.contains("LEADER_ELECT=false"), "{err}");
}
