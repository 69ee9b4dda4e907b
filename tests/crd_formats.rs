//! The CRDs use only the OpenAPI formats the API server knows: an unknown one (schemars'
//! `uint32`) makes every `kubectl apply` of the CRDs print `Warning: unrecognized format`.

/// The formats of apiextensions-apiserver's `pkg/apiserver/validation/formats.go`.
const KNOWN: &[&str] = &[
    "bsonobjectid",
    "uri",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "uuid",
    "uuid3",
    "uuid4",
    "uuid5",
    "isbn",
    "isbn10",
    "isbn13",
    "creditcard",
    "ssn",
    "hexcolor",
    "rgbcolor",
    "byte",
    "password",
    "date",
    "duration",
    "datetime",
    "date-time",
    "int32",
    "int64",
    "float",
    "double",
];

fn formats(path: &str, v: &serde_json::Value, out: &mut Vec<(String, String)>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, child) in map {
                if k == "format"
                    && let Some(f) = child.as_str()
                {
                    out.push((path.to_string(), f.to_string()));
                }
                formats(&format!("{path}.{k}"), child, out);
            }
        }
        serde_json::Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                formats(&format!("{path}[{i}]"), child, out);
            }
        }
        _ => {}
    }
}

#[test]
fn the_crds_use_only_formats_the_api_server_recognises() {
    let mut found = Vec::new();
    for crd in dbop::api::crds() {
        let crd = serde_json::to_value(&crd).unwrap();
        formats(crd["metadata"]["name"].as_str().unwrap(), &crd, &mut found);
    }
    let unknown: Vec<_> = found
        .iter()
        .filter(|(_, f)| !KNOWN.contains(&f.as_str()))
        .collect();
    assert!(unknown.is_empty(), "unrecognised formats: {unknown:?}");
}

#[test]
fn unsigned_fields_still_refuse_negative_values() {
    let crd = serde_json::to_value(&dbop::api::crds()[0]).unwrap();
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let backup = &spec["properties"]["backup"]["properties"];
    for (field, min) in [
        (&backup["retention"]["properties"]["keepLast"], 1.0),
        (&backup["retention"]["properties"]["keepFailed"], 0.0),
        (&backup["verify"]["properties"]["everyNthBackup"], 1.0),
    ] {
        assert_eq!(field["type"], "integer", "{field}");
        assert_eq!(field["minimum"].as_f64(), Some(min), "{field}");
        assert!(field["maximum"].is_number(), "{field}");
    }
}
