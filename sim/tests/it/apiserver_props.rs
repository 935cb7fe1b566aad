//! Property tests for the API server's parsers and patch engines: malformed input is an error,
//! never a panic, and the pure algorithms keep their invariants on arbitrary input.

use proptest::prelude::*;
use relaylet_sim::apiserver::{fieldset, kinds, managed, protobuf, route, selector, smp};
use serde_json::{Value, json};

/// Arbitrary JSON, a few levels deep.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        "[a-z$/]{0,6}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("type".to_string()),
                    Just("$patch".to_string()),
                    Just("status".to_string()),
                    Just("addresses".to_string()),
                    "[a-z$/]{1,6}"
                ],
                inner,
                0..5
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn selectors_never_panic(text in "\\PC{0,40}") {
        let _ = selector::LabelSelector::parse(&text);
        let pods = kinds::by_resource("", "pods").unwrap();
        let _ = selector::FieldSelector::parse(&text, pods);
        let _ = route::parse(&text);
    }

    #[test]
    fn label_selectors_built_from_parts_match_their_labels(
        key in "[a-z]{1,8}",
        value in "[a-z0-9]{1,8}",
        other in "[a-z0-9]{1,8}",
    ) {
        let labels = json!({ key.clone(): value.clone() });
        let eq = selector::LabelSelector::parse(&format!("{key}={value}")).unwrap();
        prop_assert!(eq.matches(Some(&labels)));
        let set = selector::LabelSelector::parse(&format!("{key} in ({other}, {value})")).unwrap();
        prop_assert!(set.matches(Some(&labels)));
        let ne = selector::LabelSelector::parse(&format!("{key}!={value}")).unwrap();
        prop_assert!(!ne.matches(Some(&labels)));
    }

    #[test]
    fn strategic_merge_never_panics(original in json_value(), patch in json_value()) {
        let _ = smp::apply("nodes", &original, &patch);
        let _ = smp::apply("pods", &original, &patch);
    }

    #[test]
    fn strategic_merge_of_a_plain_map_patch_sets_its_scalars(
        original in prop::collection::btree_map("[a-z]{1,4}", "[a-z]{0,4}", 0..6),
        patch in prop::collection::btree_map("[a-z]{1,4}", "[a-z]{0,4}", 0..6),
    ) {
        let out = smp::apply("configmaps", &json!({"data": original}), &json!({"data": patch})).unwrap();
        for (k, v) in &patch {
            prop_assert_eq!(&out["data"][k], &json!(v));
        }
        for (k, v) in &original {
            if !patch.contains_key(k) {
                prop_assert_eq!(&out["data"][k], &json!(v));
            }
        }
    }

    #[test]
    fn apply_never_panics_and_field_sets_round_trip(live in json_value(), config in json_value(), force in any::<bool>()) {
        let req = managed::Request { resource: "nodes", api_version: "v1", manager: "m", subresource: "", skip: &[] };
        let _ = managed::apply(&req, Some(&live), &config, force);
        let set = fieldset::of("nodes", &config, &[]);
        prop_assert_eq!(fieldset::from_fields_v1(&fieldset::to_fields_v1(&set)), set);
    }

    #[test]
    fn protobuf_bodies_never_panic(body in prop::collection::vec(any::<u8>(), 0..64)) {
        let mut framed = b"k8s\0".to_vec();
        framed.extend(&body);
        let _ = protobuf::decode_review(&framed, "SelfSubjectAccessReview");
        let _ = protobuf::decode_review(&body, "TokenReview");
        for kind in ["Secret", "ConfigMap", "Namespace"] {
            let _ = protobuf::decode_object(&framed, kind);
        }
    }
}
