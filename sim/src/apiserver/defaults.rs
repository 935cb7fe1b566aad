//! Upstream's defaulting (`SetDefaults_*`) for the fields clients read back, applied to every
//! object written, through the API or straight into the store.

use serde_json::{Value, json};

use super::kinds::Kind;

/// Upstream's defaulting for the fields clients commonly leave out (and a Secret's write-only
/// `stringData` folded into `data`, as upstream's conversion does on every write).
pub(crate) fn defaults(kind: &Kind, body: &mut Value) {
    if kind.group.is_empty() && kind.kind == "Secret" {
        if body.get("type").is_none_or(|t| t.as_str() == Some("")) {
            body["type"] = json!("Opaque");
        }
        if let Some(object) = body.as_object_mut() {
            fold_string_data(object);
        }
    }
    if kind.group.is_empty() && kind.kind == "Pod" {
        pod_defaults(body);
    }
}

/// Upstream's `SetDefaults_PodSpec` and `SetDefaults_Container` for the fields clients read
/// back: kubectl relies on them (`kubectl debug` reads `spec.securityContext` without a nil
/// check and panics on a pod without it).
fn pod_defaults(body: &mut Value) {
    let Some(spec) = body.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    for (field, value) in [
        ("restartPolicy", json!("Always")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("dnsPolicy", json!("ClusterFirst")),
        ("securityContext", json!({})),
        ("schedulerName", json!("default-scheduler")),
        ("enableServiceLinks", json!(true)),
    ] {
        spec.entry(field).or_insert(value);
    }
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        for container in spec
            .get_mut(list)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            let Some(c) = container.as_object_mut() else {
                continue;
            };
            let image = c.get("image").and_then(Value::as_str).unwrap_or("");
            // No tag, or `latest`, means the image may change: pull it every time.
            let last = image.rsplit('/').next().unwrap_or(image);
            let pull = if !last.contains(':') || last.ends_with(":latest") {
                "Always"
            } else {
                "IfNotPresent"
            };
            c.entry("imagePullPolicy").or_insert(json!(pull));
            c.entry("terminationMessagePath")
                .or_insert(json!("/dev/termination-log"));
            c.entry("terminationMessagePolicy").or_insert(json!("File"));
            for port in c
                .get_mut("ports")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                if let Some(p) = port.as_object_mut() {
                    p.entry("protocol").or_insert(json!("TCP"));
                }
            }
        }
    }
}

/// Folds a Secret's `stringData` into its `data` (base64), a key in both taking the plain value.
pub(crate) fn fold_string_data(secret: &mut serde_json::Map<String, Value>) {
    use base64::Engine;
    if let Some(Value::Object(plain)) = secret.remove("stringData") {
        let data = secret.entry("data").or_insert_with(|| json!({}));
        if let Some(data) = data.as_object_mut() {
            for (k, v) in plain {
                let encoded = base64::engine::general_purpose::STANDARD
                    .encode(v.as_str().unwrap_or_default());
                data.insert(k, json!(encoded));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::kinds;

    #[test]
    fn pods_get_upstreams_defaults_and_keep_what_was_set() {
        let kind = kinds::lookup("", "v1", "pods").expect("the pods kind");
        let mut pod = json!({
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {"name": "a", "image": "busybox", "ports": [{"containerPort": 80}]},
                    {"name": "b", "image": "registry.local:5000/app:1.2"},
                ],
            },
        });
        defaults(kind, &mut pod);
        let spec = &pod["spec"];
        assert_eq!(spec["restartPolicy"], "Never");
        assert_eq!(spec["securityContext"], json!({}));
        assert_eq!(spec["dnsPolicy"], "ClusterFirst");
        assert_eq!(spec["terminationGracePeriodSeconds"], 30);
        assert_eq!(spec["schedulerName"], "default-scheduler");
        assert_eq!(spec["containers"][0]["imagePullPolicy"], "Always");
        assert_eq!(spec["containers"][1]["imagePullPolicy"], "IfNotPresent");
        assert_eq!(spec["containers"][0]["ports"][0]["protocol"], "TCP");
        assert_eq!(spec["containers"][1]["terminationMessagePolicy"], "File");
    }
}
