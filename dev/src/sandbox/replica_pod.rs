//! A relaylet replica's Pod in a root cluster stand-in: with leader election, relaylet counts a
//! replica only when it is a Running pod of its install (`relaylet::replicas::LivePods`), so
//! every replica a test or the sandbox starts gets one, as a Deployment would give it. The Pod
//! carries the chart's selector labels (release `relaylet`); its status is written the way a
//! kubelet writes it, through the `status` subresource.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

/// The labels the chart puts on relaylet's pods (its Deployment's selector) for release
/// `relaylet`.
pub const LABELS: [(&str, &str); 2] = [
    ("app.kubernetes.io/name", "relaylet"),
    ("app.kubernetes.io/instance", "relaylet"),
];

/// `LABELS` as a `REPLICA_SELECTOR` value.
pub fn selector() -> String {
    LABELS
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Makes Pod `namespace/name` (unless it exists) and reports it Running at `ip`. `admin` is a
/// client of the root that may write pods and their status.
pub async fn running(
    admin: &kube::Client,
    namespace: &str,
    name: &str,
    ip: &str,
) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), namespace);
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(
                LABELS
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .chain([("pod-template-hash".to_string(), "5d8f7b9c4".to_string())])
                    .collect(),
            ),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "relaylet".into(),
                image: Some("relaylet:test".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    };
    match pods.create(&PostParams::default(), &pod).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(anyhow::anyhow!("creating replica pod {name}: {e}")),
    }
    set_phase(admin, namespace, name, "Running", Some(ip)).await
}

/// Writes the phase (and IP) of replica Pod `namespace/name`, as its kubelet would.
pub async fn set_phase(
    admin: &kube::Client,
    namespace: &str,
    name: &str,
    phase: &str,
    ip: Option<&str>,
) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), namespace);
    let mut status = json!({ "phase": phase });
    if let Some(ip) = ip {
        status["podIP"] = json!(ip);
        status["podIPs"] = json!([{ "ip": ip }]);
    }
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .map_err(|e| anyhow::anyhow!("writing the status of replica pod {name}: {e}"))?;
    Ok(())
}
