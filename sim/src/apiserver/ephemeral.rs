//! The `pods/{name}/ephemeralcontainers` subresource: the only way to add an ephemeral container
//! to a pod (what `kubectl debug` does). As upstream's `EphemeralContainersStrategy` and
//! `ValidatePodEphemeralContainersUpdate`: only `spec.ephemeralContainers` is taken from the
//! request; existing ephemeral containers may be neither removed nor changed; a new one needs
//! a name no other container of the pod has, and an image.

use serde_json::Value;

use super::failure::Failure;
use super::kinds::Kind;

/// The subresource's name.
pub const SUBRESOURCE: &str = "ephemeralcontainers";

const FIELD: &str = "spec.ephemeralContainers";

/// `live` with the request's `spec.ephemeralContainers` (and resourceVersion, for conflicts).
pub(super) fn take(live: &Value, mut next: Value) -> Value {
    let mut out = live.clone();
    out["metadata"]["resourceVersion"] = next["metadata"]["resourceVersion"].take();
    match next["spec"]["ephemeralContainers"].take() {
        Value::Null => {
            if let Some(spec) = out["spec"].as_object_mut() {
                spec.remove("ephemeralContainers");
            }
        }
        list => out["spec"]["ephemeralContainers"] = list,
    }
    out
}

fn containers<'a>(pod: &'a Value, field: &str) -> &'a [Value] {
    pod["spec"][field].as_array().map_or(&[], Vec::as_slice)
}

fn name(c: &Value) -> &str {
    c["name"].as_str().unwrap_or_default()
}

/// Refuses what upstream's validation refuses, worded as it words it.
pub(super) fn validate(kind: &Kind, live: &Value, next: &Value) -> Result<(), Failure> {
    let pod = live["metadata"]["name"].as_str().unwrap_or_default();
    let old = containers(live, "ephemeralContainers");
    let new = containers(next, "ephemeralContainers");
    for o in old {
        let refused = match new.iter().find(|n| name(n) == name(o)) {
            None => Some("removed"),
            Some(n) if n != o => Some("changed"),
            Some(_) => None,
        };
        if let Some(verb) = refused {
            let detail = format!(
                "Forbidden: existing ephemeral containers \"{}\" may not be {verb}\n",
                name(o)
            );
            return Err(Failure::invalid(kind, pod, FIELD, &detail));
        }
    }
    let mut seen: Vec<&str> = containers(next, "initContainers")
        .iter()
        .chain(containers(next, "containers"))
        .map(name)
        .collect();
    for (i, c) in new.iter().enumerate() {
        let field = format!("{FIELD}[{i}]");
        if name(c).is_empty() {
            return Err(Failure::invalid(
                kind,
                pod,
                &format!("{field}.name"),
                "Required value",
            ));
        }
        if seen.contains(&name(c)) {
            return Err(Failure::invalid(
                kind,
                pod,
                &format!("{field}.name"),
                &format!("Duplicate value: \"{}\"", name(c)),
            ));
        }
        seen.push(name(c));
        if c["image"].as_str().unwrap_or_default().is_empty() {
            return Err(Failure::invalid(
                kind,
                pod,
                &format!("{field}.image"),
                "Required value",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(ephemeral: Value) -> Value {
        json!({
            "metadata": {"name": "web", "resourceVersion": "7"},
            "spec": {"containers": [{"name": "main", "image": "x"}], "ephemeralContainers": ephemeral},
            "status": {"phase": "Running"},
        })
    }

    fn kind() -> &'static Kind {
        crate::apiserver::kinds::lookup("", "v1", "pods").expect("pods")
    }

    #[test]
    fn only_ephemeral_containers_are_taken() {
        let live = pod(json!([]));
        let mut next = pod(json!([{"name": "dbg", "image": "busybox"}]));
        next["spec"]["containers"][0]["image"] = json!("changed");
        next["status"]["phase"] = json!("Failed");
        next["metadata"]["resourceVersion"] = json!("7");
        let out = take(&live, next);
        assert_eq!(out["spec"]["containers"][0]["image"], "x");
        assert_eq!(out["status"]["phase"], "Running");
        assert_eq!(out["spec"]["ephemeralContainers"][0]["name"], "dbg");
        assert!(validate(kind(), &live, &out).is_ok());
    }

    #[test]
    fn existing_ones_may_not_go_or_change_and_names_are_unique() {
        let live = pod(json!([{"name": "dbg", "image": "busybox"}]));
        let removed = validate(kind(), &live, &pod(json!([]))).unwrap_err();
        assert_eq!(
            removed.message,
            "Pod \"web\" is invalid: spec.ephemeralContainers: Forbidden: existing ephemeral containers \"dbg\" may not be removed\n"
        );
        let changed = pod(json!([{"name": "dbg", "image": "alpine"}]));
        assert!(
            validate(kind(), &live, &changed)
                .unwrap_err()
                .message
                .contains("may not be changed")
        );
        let clash =
            pod(json!([{"name": "dbg", "image": "busybox"}, {"name": "main", "image": "b"}]));
        assert_eq!(
            validate(kind(), &live, &clash).unwrap_err().message,
            "Pod \"web\" is invalid: spec.ephemeralContainers[1].name: Duplicate value: \"main\""
        );
        let no_image = pod(json!([{"name": "dbg", "image": "busybox"}, {"name": "two"}]));
        assert!(
            validate(kind(), &live, &no_image)
                .unwrap_err()
                .message
                .ends_with("spec.ephemeralContainers[1].image: Required value")
        );
        assert_eq!(
            validate(kind(), &live, &live).map_err(|f| f.message),
            Ok(())
        );
    }
}
