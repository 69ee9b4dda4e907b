//! `crds/` must be exactly what the API types generate: run `make crds` after changing src/api/.

#[test]
fn checked_in_crds_match_the_types() {
    let generated = dbop::api::crds_yaml().expect("CRDs render");
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/crds/dbop.dev.yaml");
    let checked_in = std::fs::read_to_string(path).expect("crds/dbop.dev.yaml exists");
    assert!(
        generated == checked_in,
        "crds/dbop.dev.yaml is out of date with src/api/: run `make crds` and commit the result"
    );
}

#[test]
fn the_helm_chart_ships_the_same_crds() {
    let root = env!("CARGO_MANIFEST_DIR");
    let crds = std::fs::read_to_string(format!("{root}/crds/dbop.dev.yaml")).unwrap();
    let chart = std::fs::read_to_string(format!("{root}/charts/dbop/crds/dbop.dev.yaml"))
        .expect("charts/dbop/crds/dbop.dev.yaml exists");
    assert!(
        crds == chart,
        "charts/dbop/crds/ is out of date: run `make crds` and commit the result"
    );
}

#[test]
fn every_database_field_is_documented() {
    // `kubectl explain` shows these descriptions; an undocumented field is a hole in the API docs.
    let crd = serde_json::to_value(&dbop::api::crds()[0]).unwrap();
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    fn walk(path: &str, schema: &serde_json::Value, missing: &mut Vec<String>) {
        if let Some(props) = schema["properties"].as_object() {
            for (name, field) in props {
                let here = format!("{path}.{name}");
                if field["description"].as_str().is_none_or(str::is_empty) {
                    missing.push(here.clone());
                }
                // k8s-openapi's own types (resources) are documented upstream.
                if name != "resources" {
                    walk(&here, field, missing);
                }
            }
        }
    }
    let mut missing = vec![];
    walk("spec", spec, &mut missing);
    assert!(missing.is_empty(), "undocumented fields: {missing:?}");
}
