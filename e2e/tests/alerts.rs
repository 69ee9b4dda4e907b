//! The chart's alerts, evaluated: the PrometheusRule `helm template` renders (release `dbop` in
//! `dbop-system`, default values) is checked by `promtool check rules` and its rules are run by
//! `promtool test rules` against the recorded series of `alerts/dbop.test.yaml`. No cluster; a
//! missing helm or promtool fails with what to install. Every alert must fire in some test and
//! have its section in docs/operations.md.

#[path = "offline/mod.rs"]
mod offline;

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;

use offline::{chart, documents, helm_cmd, promtool, scratch, workspace_root};

/// The rule groups of the rendered PrometheusRule.
fn rendered_groups(dir: &std::path::Path) -> Value {
    let chart = chart();
    let (ok, out, err) = helm_cmd(
        dir,
        &[
            "template",
            "dbop",
            chart.to_str().unwrap(),
            "-n",
            "dbop-system",
            "--show-only",
            "templates/prometheusrule.yaml",
            "--set",
            "metrics.prometheusRule.enabled=true",
        ],
    );
    assert!(ok, "helm template failed:\n{err}");
    let docs = documents(&out);
    let rule = docs
        .iter()
        .find(|d| d["kind"] == "PrometheusRule")
        .expect("a PrometheusRule");
    rule["spec"]["groups"].clone()
}

fn alert_names(groups: &Value) -> BTreeSet<String> {
    groups
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r["alert"].as_str().map(String::from))
        .collect()
}

fn promtool_run(args: &[&str], dir: &std::path::Path) -> (bool, String) {
    let out = Command::new(promtool())
        .args(args)
        .current_dir(dir)
        .output()
        .expect("running promtool");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn the_chart_s_alerts_fire_on_recorded_series_as_documented() {
    let promtool = promtool();
    let dir = scratch("alerts");
    let groups = rendered_groups(&dir);

    // The whole rule file, annotations included (their templates are parsed too).
    let full = dir.join("rules-full.yaml");
    std::fs::write(&full, serde_json::json!({ "groups": groups }).to_string()).unwrap();
    let (ok, out) = promtool_run(&["check", "rules", full.to_str().unwrap()], &dir);
    assert!(ok, "promtool check rules:\n{out}");

    // The unit tests compare labels; the annotations are the docs' business.
    let mut bare = groups.clone();
    for g in bare.as_array_mut().unwrap() {
        for r in g["rules"].as_array_mut().unwrap() {
            r.as_object_mut().unwrap().remove("annotations");
        }
    }
    std::fs::write(
        dir.join("rules.yaml"),
        serde_json::json!({ "groups": bare }).to_string(),
    )
    .unwrap();
    let tests = workspace_root().join("e2e/tests/alerts/dbop.test.yaml");
    let text = std::fs::read_to_string(&tests).unwrap();
    std::fs::write(dir.join("dbop.test.yaml"), &text).unwrap();
    let (ok, out) = promtool_run(&["test", "rules", "dbop.test.yaml"], &dir);
    assert!(
        ok,
        "promtool test rules ({}, rules rendered into {}):\n{out}",
        tests.display(),
        dir.display()
    );
    eprintln!("{} {out}", promtool.display());

    // Every alert fires in some test, and has its runbook section.
    let names = alert_names(&groups);
    let spec: Value = serde_norway::from_str(&text).unwrap();
    let fired: BTreeSet<String> = spec["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().cloned().unwrap_or_default())
        .filter(|a| a["exp_alerts"].as_array().is_some_and(|e| !e.is_empty()))
        .filter_map(|a| a["alertname"].as_str().map(String::from))
        .collect();
    let untested: Vec<&String> = names.difference(&fired).collect();
    assert!(
        untested.is_empty(),
        "alerts no test of {} sees firing: {untested:?}",
        tests.display()
    );
    let operations = std::fs::read_to_string(workspace_root().join("docs/operations.md")).unwrap();
    let undocumented: Vec<&String> = names
        .iter()
        .filter(|n| !operations.contains(&format!("### {n} (")))
        .collect();
    assert!(
        undocumented.is_empty(),
        "alerts without a section (### Name (severity)) in docs/operations.md: {undocumented:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
