//! Whether an object needs to be written: the observed object must contain every field of the
//! desired one. Fields the API server defaults or other managers add are ignored, so a
//! reconcile with nothing to change sends no write, while a hand edit of a field dbop sets is
//! put back. Pure.

use serde_json::Value;

/// True when `observed` is missing or differs from `desired` in a field `desired` sets.
pub fn needs_apply(desired: &Value, observed: Option<&Value>) -> bool {
    match observed {
        None => true,
        Some(observed) => !contains(observed, desired),
    }
}

fn contains(observed: &Value, desired: &Value) -> bool {
    match (desired, observed) {
        (Value::Object(d), Value::Object(o)) => d.iter().all(|(key, dv)| match o.get(key) {
            Some(ov) => contains(ov, dv),
            // The server drops empty objects and lists on some fields.
            None => is_empty(dv),
        }),
        (Value::Array(d), Value::Array(o)) => {
            d.len() <= o.len() && d.iter().zip(o).all(|(dv, ov)| contains(ov, dv))
        }
        (Value::Object(d), Value::Null) => d.is_empty(),
        (d, o) => d == o,
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Null => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn drift_table() {
        let desired = json!({
            "metadata": {"labels": {"a": "1"}},
            "spec": {"replicas": 1, "template": {"containers": [{"name": "pg", "image": "pg:16.4"}]}, "emptyDir": {}}
        });
        let table = [
            ("missing object", None, true),
            (
                "server added defaults",
                Some(json!({
                    "metadata": {"labels": {"a": "1", "b": "2"}, "resourceVersion": "7"},
                    "spec": {"replicas": 1, "revisionHistoryLimit": 10,
                             "template": {"containers": [{"name": "pg", "image": "pg:16.4", "imagePullPolicy": "IfNotPresent"}]},
                             "emptyDir": {}},
                    "status": {"readyReplicas": 1}
                })),
                false,
            ),
            (
                "hand-edited image",
                Some(json!({
                    "metadata": {"labels": {"a": "1"}},
                    "spec": {"replicas": 1, "template": {"containers": [{"name": "pg", "image": "pg:latest"}]}}
                })),
                true,
            ),
            (
                "label removed",
                Some(json!({
                    "metadata": {},
                    "spec": {"replicas": 1, "template": {"containers": [{"name": "pg", "image": "pg:16.4"}]}}
                })),
                true,
            ),
            (
                "empty object dropped by the server",
                Some(json!({
                    "metadata": {"labels": {"a": "1"}},
                    "spec": {"replicas": 1, "template": {"containers": [{"name": "pg", "image": "pg:16.4"}]}}
                })),
                false,
            ),
            (
                "container removed",
                Some(
                    json!({"metadata": {"labels": {"a": "1"}}, "spec": {"replicas": 1, "template": {"containers": []}}}),
                ),
                true,
            ),
            (
                "scaled by hand",
                Some(json!({
                    "metadata": {"labels": {"a": "1"}},
                    "spec": {"replicas": 3, "template": {"containers": [{"name": "pg", "image": "pg:16.4"}]}}
                })),
                true,
            ),
        ];
        for (name, observed, want) in table {
            assert_eq!(needs_apply(&desired, observed.as_ref()), want, "{name}");
        }
    }
}
