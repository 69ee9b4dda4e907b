//! The chart renders, lints (`helm lint --strict`) and prints its NOTES in every documented mode,
//! without a cluster: a matrix over every value of values.yaml. Each axis lists the documented
//! settings of one or a few related values (labels included); the rows cover every pair of
//! settings of any two axes (all-pairs), and every leaf of values.yaml is set to something other
//! than its default by some row, so a value added without an axis here fails the test.

#[path = "offline/mod.rs"]
mod offline;

use std::collections::{BTreeSet, HashSet};

use serde_json::{Map, Value, json};

use offline::{chart, documents, helm_cmd, scratch, workspace_root};

/// One axis: a name and its settings (values overrides, deep-merged).
struct Axis {
    name: &'static str,
    settings: Vec<Value>,
}

fn axis(name: &'static str, settings: Vec<Value>) -> Axis {
    Axis { name, settings }
}

fn axes() -> Vec<Axis> {
    vec![
        axis(
            "watch",
            vec![
                json!({}),
                json!({"watchNamespace": "apps"}),
                json!({"watchNamespaces": ["apps", "shop"]}),
                json!({"watchNamespaces": ["apps", "shop"], "watchNamespace": "apps"}),
                json!({"watchNamespaces": ["shop"], "watchNamespace": "apps"}),
            ],
        ),
        axis(
            "leaderElection",
            vec![
                json!({}),
                json!({"replicaCount": 1}),
                json!({"replicaCount": 3, "leaderElection": {"leaseName": "dbop-lease",
                    "leaseDurationSeconds": 30, "renewGraceSeconds": 10}}),
                json!({"leaderElection": {"enabled": false}}),
                json!({"leaderElection": {"enabled": false}, "replicaCount": 3}),
            ],
        ),
        axis(
            "metrics.service",
            vec![
                json!({}),
                json!({"metrics": {"port": 9090, "service": {"annotations": {"prometheus.io/scrape": "true"}}}}),
                json!({"metrics": {"service": {"enabled": false}}}),
            ],
        ),
        axis(
            "metrics.serviceMonitor",
            vec![
                json!({}),
                json!({"metrics": {"serviceMonitor": {"enabled": true}}}),
                json!({"metrics": {"serviceMonitor": {"enabled": true, "interval": "15s",
                    "labels": {"release": "prometheus", "team": "db"}}}}),
            ],
        ),
        axis(
            "databaseMetrics.podMonitor",
            vec![
                json!({}),
                json!({"databaseMetrics": {"podMonitor": {"enabled": true}}}),
                json!({"databaseMetrics": {"podMonitor": {"enabled": true, "interval": "15s",
                    "labels": {"release": "prometheus"}}}}),
            ],
        ),
        axis(
            "dashboards",
            vec![
                json!({}),
                json!({"dashboards": {"enabled": true}}),
                json!({"dashboards": {"enabled": true, "namespace": "monitoring",
                    "labels": {"grafana_dashboard": "dbop"},
                    "annotations": {"grafana_folder": "Databases"}}}),
            ],
        ),
        axis(
            "metrics.prometheusRule",
            vec![
                json!({}),
                json!({"metrics": {"prometheusRule": {"enabled": true}}}),
                json!({"metrics": {"prometheusRule": {"enabled": true,
                    "labels": {"release": "prometheus", "role": "alert-rules"}}}}),
                json!({"metrics": {"prometheusRule": {"enabled": true,
                    "labels": {"release": "prometheus"},
                    "operatorSelector": "job=\"dbop\"",
                    "operatorDownFor": "10m", "databaseFailedFor": "1m",
                    "databaseDegradedFor": "2m", "databaseNotReadyFor": "1h",
                    "backupMaxAgeSeconds": 7200, "verificationMaxAgeSeconds": 86400,
                    "reconcileErrorRate": 0.5, "workQueueDepth": 10,
                    "postgresDownFor": "2m", "wraparoundXidAge": 500000000,
                    "volumeFreeRatio": 0.2, "replicationLagBytes": 1048576,
                    "longTransactionSeconds": 600, "connectionSaturation": 0.8,
                    "walArchivingFailingFor": "30m", "walArchiveBacklogFiles": 128}}}),
            ],
        ),
        axis(
            "rbac/serviceAccount",
            vec![
                json!({}),
                json!({"serviceAccount": {"name": "dbop-sa", "annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/x"}}}),
                json!({"serviceAccount": {"create": false, "name": "existing"}}),
                json!({"rbac": {"create": false}}),
                json!({"rbac": {"create": false}, "serviceAccount": {"create": false}}),
            ],
        ),
        axis(
            "image",
            vec![
                json!({}),
                json!({"image": {"repository": "registry.example.com/dbop", "tag": "0.1.0-dev",
                    "pullPolicy": "Always"}, "imagePullSecrets": [{"name": "regcred"}]}),
                json!({"agentImage": "mirror.example.com/dbop:0.1.0",
                    "postgresImageTemplate": "mirror.example.com/postgres:{version}",
                    "operandImagePullSecrets": ["regcred", "other"]}),
            ],
        ),
        axis(
            "operator settings",
            vec![
                json!({}),
                json!({"api": {"qps": 0, "burst": 10}, "reconcileConcurrency": 0,
                    "logFormat": "text", "logLevel": "dbop=debug,info",
                    "release": {"wave": 3, "urgent": true, "timeoutSeconds": 900}}),
                json!({"jobResources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                    "limits": {"memory": "256Mi"}},
                    "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}),
                json!({"resources": {"limits": {"cpu": "2", "memory": "1Gi"}},
                    "databaseResources": {"requests": {"cpu": "250m", "memory": "1Gi"},
                    "limits": {"memory": "1Gi"}},
                    "databasePodSecurity": {"assignedBy": "Platform"}}),
            ],
        ),
        axis(
            "pods",
            vec![
                json!({}),
                json!({"podAnnotations": {"a": "b"}, "podLabels": {"team": "db"},
                    "priorityClassName": "system-cluster-critical"}),
                json!({"nodeSelector": {"kubernetes.io/os": "linux"},
                    "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
                    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "dbop"}}}}]}}}),
            ],
        ),
        axis(
            "podSecurity",
            vec![
                json!({}),
                json!({"podSecurity": {"assignedBy": "Platform"}}),
                json!({"podSecurity": {"runAsUser": 1001, "runAsGroup": 0}}),
            ],
        ),
        axis(
            "names",
            vec![
                json!({}),
                json!({"nameOverride": "pg"}),
                json!({"fullnameOverride": "db-operator"}),
            ],
        ),
    ]
}

fn merge(into: &mut Value, from: &Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (into, from) => *into = from.clone(),
    }
}

/// Rows (one setting index per axis) in which every pair of settings of two axes occurs:
/// greedy all-pairs, deterministic.
fn all_pairs(sizes: &[usize]) -> Vec<Vec<usize>> {
    let mut uncovered: HashSet<(usize, usize, usize, usize)> = HashSet::new();
    for i in 0..sizes.len() {
        for j in i + 1..sizes.len() {
            for a in 0..sizes[i] {
                for b in 0..sizes[j] {
                    uncovered.insert((i, a, j, b));
                }
            }
        }
    }
    let mut rows = Vec::new();
    while let Some(&(i, a, j, b)) = uncovered.iter().min() {
        let mut row: Vec<Option<usize>> = vec![None; sizes.len()];
        row[i] = Some(a);
        row[j] = Some(b);
        for k in 0..sizes.len() {
            if row[k].is_some() {
                continue;
            }
            let gain = |c: usize| {
                row.iter()
                    .enumerate()
                    .filter_map(|(m, v)| v.map(|v| (m, v)))
                    .filter(|&(m, v)| {
                        let key = if m < k { (m, v, k, c) } else { (k, c, m, v) };
                        uncovered.contains(&key)
                    })
                    .count()
            };
            let best = (0..sizes[k]).max_by_key(|&c| (gain(c), usize::MAX - c));
            row[k] = best;
        }
        let row: Vec<usize> = row.into_iter().map(|v| v.unwrap_or(0)).collect();
        for i in 0..sizes.len() {
            for j in i + 1..sizes.len() {
                uncovered.remove(&(i, row[i], j, row[j]));
            }
        }
        rows.push(row);
    }
    rows
}

/// Every leaf path of a values tree (lists and empty maps count as leaves).
fn leaves(value: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(v, &path, out);
            }
        }
        _ => {
            out.insert(prefix.to_string());
        }
    }
}

/// The leaf paths a setting sets to something other than the default.
fn changed(setting: &Value, defaults: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    if let Value::Object(map) = setting {
        for (k, v) in map {
            let path = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            let default = defaults.get(k).unwrap_or(&Value::Null);
            match (v, default) {
                (Value::Object(_), Value::Object(d)) if !d.is_empty() => {
                    changed(v, default, &path, out)
                }
                _ if v != default => {
                    out.insert(path);
                }
                _ => {}
            }
        }
    }
}

fn defaults() -> Value {
    let text = std::fs::read_to_string(chart().join("values.yaml")).expect("values.yaml");
    serde_norway::from_str(&text).expect("values.yaml is YAML")
}

#[test]
fn every_value_of_values_yaml_has_an_axis_in_the_matrix() {
    let defaults = defaults();
    let mut all = BTreeSet::new();
    leaves(&defaults, "", &mut all);
    let mut set = BTreeSet::new();
    for a in axes() {
        for s in &a.settings {
            changed(s, &defaults, "", &mut set);
        }
    }
    // A setting may go deeper than a default that is an empty map (labels, annotations).
    let covered = |leaf: &String| {
        set.iter()
            .any(|s| s == leaf || s.starts_with(&format!("{leaf}.")))
    };
    let missing: Vec<&String> = all.iter().filter(|l| !covered(l)).collect();
    assert!(
        missing.is_empty(),
        "values.yaml keys no axis of chart_render.rs sets to a non-default: {missing:?}"
    );
}

#[test]
fn all_pairs_covers_every_pair() {
    let sizes = [5, 5, 3, 3, 4, 5, 3, 4, 3, 3];
    let rows = all_pairs(&sizes);
    for i in 0..sizes.len() {
        for j in i + 1..sizes.len() {
            for a in 0..sizes[i] {
                for b in 0..sizes[j] {
                    assert!(rows.iter().any(|r| r[i] == a && r[j] == b));
                }
            }
        }
    }
    assert!(rows.len() < 60, "{} rows", rows.len());
}

/// What a row's values imply for the rendered objects.
struct Expect {
    watched: Vec<String>,
    leader: bool,
    replicas: u64,
    fullname: String,
    service: bool,
    service_monitor: bool,
    pod_monitor: bool,
    dashboards: bool,
    rule: bool,
    rbac: bool,
    service_account: bool,
    /// None for both with `podSecurity.assignedBy: Platform` (OpenShift restricted-v2).
    pod_ids: (Option<i64>, Option<i64>),
}

fn expect(values: &Value) -> Expect {
    let mut watched: Vec<String> = values["watchNamespaces"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    if let Some(one) = values["watchNamespace"].as_str().filter(|s| !s.is_empty())
        && !watched.iter().any(|w| w == one)
    {
        watched.push(one.to_string());
    }
    let leader = values["leaderElection"]["enabled"].as_bool().unwrap();
    let name = values["nameOverride"]
        .as_str()
        .filter(|s| !s.is_empty())
        .unwrap_or("dbop");
    let fullname = match values["fullnameOverride"]
        .as_str()
        .filter(|s| !s.is_empty())
    {
        Some(f) => f.to_string(),
        None if "rel".contains(name) => "rel".into(),
        None => format!("rel-{name}"),
    };
    Expect {
        watched,
        leader,
        replicas: if leader {
            values["replicaCount"].as_u64().unwrap()
        } else {
            1
        },
        fullname,
        service: values["metrics"]["service"]["enabled"].as_bool().unwrap(),
        service_monitor: values["metrics"]["serviceMonitor"]["enabled"]
            .as_bool()
            .unwrap(),
        pod_monitor: values["databaseMetrics"]["podMonitor"]["enabled"]
            .as_bool()
            .unwrap(),
        dashboards: values["dashboards"]["enabled"].as_bool().unwrap(),
        rule: values["metrics"]["prometheusRule"]["enabled"]
            .as_bool()
            .unwrap(),
        rbac: values["rbac"]["create"].as_bool().unwrap(),
        service_account: values["serviceAccount"]["create"].as_bool().unwrap(),
        pod_ids: match values["podSecurity"]["assignedBy"].as_str() {
            Some("Platform") => (None, None),
            _ => (
                values["podSecurity"]["runAsUser"].as_i64(),
                values["podSecurity"]["runAsGroup"].as_i64(),
            ),
        },
    }
}

/// The operator pod's (runAsUser, runAsGroup).
fn pod_ids(deployment: &Value) -> (Option<i64>, Option<i64>) {
    let sc = &deployment["spec"]["template"]["spec"]["securityContext"];
    (sc["runAsUser"].as_i64(), sc["runAsGroup"].as_i64())
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn labels_contain(doc: &Value, wanted: &Value) -> bool {
    wanted
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| doc["metadata"]["labels"][k] == *v)
}

fn env(deployment: &Value, name: &str) -> Option<String> {
    deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str().map(String::from))
}

fn chart_app_version() -> String {
    let text = std::fs::read_to_string(chart().join("Chart.yaml")).unwrap();
    let chart: Value = serde_norway::from_str(&text).unwrap();
    chart["appVersion"].as_str().unwrap().to_string()
}

/// release.env's registry path of the operator's image (the one place it is set).
fn release_image_repository() -> String {
    let text = std::fs::read_to_string(workspace_root().join("release.env")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("DBOP_IMAGE_REPOSITORY="))
        .expect("release.env: DBOP_IMAGE_REPOSITORY=")
        .to_string()
}

/// The alerts docs/operations.md documents (its `### Dbop…` headings).
fn documented_alerts() -> BTreeSet<String> {
    let text = std::fs::read_to_string(workspace_root().join("docs/operations.md")).unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("### "))
        .filter_map(|h| h.split_whitespace().next())
        .filter(|h| h.starts_with("Dbop"))
        .map(String::from)
        .collect()
}

/// Checks one row's rendering; returns what is wrong.
fn check(values: &Value, docs: &[Value], notes: &str) -> Vec<String> {
    let e = expect(values);
    let mut wrong = Vec::new();
    let mut fail = |cond: bool, what: String| {
        if !cond {
            wrong.push(what);
        }
    };
    for d in docs {
        fail(
            d["apiVersion"].is_string()
                && d["kind"].is_string()
                && d["metadata"]["name"].is_string(),
            format!("a document without apiVersion/kind/metadata.name: {d}"),
        );
    }
    let deployments = of_kind(docs, "Deployment");
    fail(deployments.len() == 1, "not exactly one Deployment".into());
    if let Some(dep) = deployments.first() {
        fail(
            dep["metadata"]["name"] == e.fullname.as_str(),
            format!("Deployment not named {}", e.fullname),
        );
        fail(
            dep["spec"]["replicas"] == e.replicas,
            format!("replicas {} != {}", dep["spec"]["replicas"], e.replicas),
        );
        let strategy = if e.leader {
            "RollingUpdate"
        } else {
            "Recreate"
        };
        fail(
            dep["spec"]["strategy"]["type"] == strategy,
            format!("strategy is not {strategy}"),
        );
        let watch = env(dep, "DBOP_WATCH_NAMESPACES");
        let want = (!e.watched.is_empty()).then(|| e.watched.join(","));
        fail(
            watch == want,
            format!("DBOP_WATCH_NAMESPACES {watch:?} != {want:?}"),
        );
        fail(
            env(dep, "DBOP_LEADER_ELECT").as_deref()
                == Some(if e.leader { "true" } else { "false" }),
            "DBOP_LEADER_ELECT".into(),
        );
        // The operator's image: image.repository (release.env's registry path by default) at
        // image.tag or the appVersion; the agent image is that same reference unless set.
        let image = format!(
            "{}:{}",
            values["image"]["repository"].as_str().unwrap(),
            values["image"]["tag"]
                .as_str()
                .filter(|s| !s.is_empty())
                .unwrap_or(&chart_app_version())
        );
        let container = &dep["spec"]["template"]["spec"]["containers"][0];
        fail(
            container["image"] == image.as_str(),
            format!("the operator's image {} != {image}", container["image"]),
        );
        let agent = values["agentImage"]
            .as_str()
            .filter(|s| !s.is_empty())
            .unwrap_or(&image);
        fail(
            env(dep, "DBOP_AGENT_IMAGE").as_deref() == Some(agent),
            format!(
                "DBOP_AGENT_IMAGE {:?} != {agent}",
                env(dep, "DBOP_AGENT_IMAGE")
            ),
        );
        let port = values["metrics"]["port"].as_u64().unwrap();
        fail(
            env(dep, "DBOP_METRICS_ADDR") == Some(format!("0.0.0.0:{port}")),
            "DBOP_METRICS_ADDR".into(),
        );
        fail(
            pod_ids(dep) == e.pod_ids,
            format!(
                "the pod's (runAsUser, runAsGroup) {:?} != {:?}",
                pod_ids(dep),
                e.pod_ids
            ),
        );
        let pod_security = &values["databasePodSecurity"];
        let want = (pod_security.is_object()
            && pod_security.as_object().is_some_and(|o| !o.is_empty()))
        .then(|| pod_security.to_string());
        let got = env(dep, "DBOP_DATABASE_POD_SECURITY").map(|v| {
            serde_json::from_str::<Value>(&v)
                .map(|v| v.to_string())
                .unwrap_or(v)
        });
        fail(
            got == want,
            format!("DBOP_DATABASE_POD_SECURITY {got:?} != {want:?}"),
        );
        fail(
            dep["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] == true,
            "runAsNonRoot".into(),
        );
    }
    fail(
        of_kind(docs, "ServiceAccount").len() == usize::from(e.service_account),
        "ServiceAccount present iff serviceAccount.create".into(),
    );
    let cluster_roles = of_kind(docs, "ClusterRole").len();
    fail(
        cluster_roles == usize::from(e.rbac && e.watched.is_empty()),
        format!("{cluster_roles} ClusterRoles"),
    );
    let mut role_namespaces: Vec<String> = of_kind(docs, "Role")
        .iter()
        .filter(|r| r["metadata"]["name"] == e.fullname.as_str())
        .filter_map(|r| r["metadata"]["namespace"].as_str().map(String::from))
        .collect();
    role_namespaces.sort();
    let mut want_roles = if e.rbac { e.watched.clone() } else { vec![] };
    want_roles.sort();
    fail(
        role_namespaces == want_roles,
        format!("Roles in {role_namespaces:?}, not {want_roles:?}"),
    );
    fail(
        of_kind(docs, "Role").len() == role_namespaces.len() + usize::from(e.rbac && e.leader),
        "the Lease's Role present iff rbac.create and leaderElection.enabled".into(),
    );
    let services = of_kind(docs, "Service");
    fail(
        services.len() == usize::from(e.service),
        "metrics Service present iff enabled".into(),
    );
    let monitors = of_kind(docs, "ServiceMonitor");
    fail(
        monitors.len() == usize::from(e.service_monitor),
        "ServiceMonitor present iff enabled".into(),
    );
    for m in &monitors {
        fail(
            labels_contain(m, &values["metrics"]["serviceMonitor"]["labels"]),
            "ServiceMonitor labels".into(),
        );
        fail(
            m["spec"]["endpoints"][0]["honorLabels"] == true,
            "ServiceMonitor honorLabels".into(),
        );
    }
    let pod_monitors = of_kind(docs, "PodMonitor");
    fail(
        pod_monitors.len() == usize::from(e.pod_monitor),
        "PodMonitor present iff enabled".into(),
    );
    for m in &pod_monitors {
        let pod_monitor = &values["databaseMetrics"]["podMonitor"];
        fail(
            labels_contain(m, &pod_monitor["labels"]),
            "PodMonitor labels".into(),
        );
        // It selects what the operator labels a database pod with, on the port it opens.
        let database_pod = dbop::resources::labels("orders", "database");
        let selects = m["spec"]["selector"]["matchLabels"]
            .as_object()
            .is_some_and(|wanted| {
                !wanted.is_empty()
                    && wanted
                        .iter()
                        .all(|(k, v)| database_pod.get(k).map(String::as_str) == v.as_str())
            });
        fail(selects, "PodMonitor selects the database pods".into());
        let endpoint = &m["spec"]["podMetricsEndpoints"][0];
        fail(
            endpoint["port"] == dbop::resources::monitoring::METRICS_PORT_NAME
                && endpoint["interval"] == pod_monitor["interval"],
            "PodMonitor port and interval".into(),
        );
        let namespaces = &m["spec"]["namespaceSelector"];
        let want = if e.watched.is_empty() {
            json!({"any": true})
        } else {
            json!({"matchNames": e.watched})
        };
        fail(
            *namespaces == want,
            format!("PodMonitor namespaces {namespaces} != {want}"),
        );
    }
    let dashboards: Vec<&Value> = of_kind(docs, "ConfigMap")
        .into_iter()
        .filter(|c| {
            c["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.ends_with("-dashboard"))
        })
        .collect();
    fail(
        dashboards.len() == if e.dashboards { 2 } else { 0 },
        format!("{} dashboard ConfigMaps", dashboards.len()),
    );
    for d in &dashboards {
        let config = &values["dashboards"];
        let namespace = config["namespace"].as_str().filter(|n| !n.is_empty());
        fail(
            d["metadata"]["namespace"] == namespace.unwrap_or("dbop-system")
                && labels_contain(d, &config["labels"])
                && config["annotations"]
                    .as_object()
                    .is_none_or(|a| a.iter().all(|(k, v)| d["metadata"]["annotations"][k] == *v)),
            "dashboard ConfigMap namespace, labels, annotations".into(),
        );
        // Each holds one dashboard Grafana can load: JSON with a uid, a title and panels.
        let loaded = d["data"].as_object().is_some_and(|data| {
            data.len() == 1
                && data.values().all(|json| {
                    serde_json::from_str::<Value>(json.as_str().unwrap_or_default()).is_ok_and(
                        |dash| {
                            dash["uid"].is_string()
                                && dash["title"].is_string()
                                && dash["panels"].as_array().is_some_and(|p| !p.is_empty())
                        },
                    )
                })
        });
        fail(loaded, "dashboard JSON".into());
    }
    let rules = of_kind(docs, "PrometheusRule");
    fail(
        rules.len() == usize::from(e.rule),
        "PrometheusRule present iff enabled".into(),
    );
    for r in &rules {
        let rule_values = &values["metrics"]["prometheusRule"];
        fail(
            labels_contain(r, &rule_values["labels"]),
            "PrometheusRule labels".into(),
        );
        let mut names = BTreeSet::new();
        for group in r["spec"]["groups"].as_array().into_iter().flatten() {
            for rule in group["rules"].as_array().into_iter().flatten() {
                let name = rule["alert"].as_str().unwrap_or("").to_string();
                fail(
                    rule["expr"].is_string()
                        && rule["for"].is_string()
                        && rule["labels"]["severity"].is_string()
                        && rule["annotations"]["summary"].is_string()
                        && rule["annotations"]["description"].is_string(),
                    format!("alert {name}: expr, for, severity, summary, description"),
                );
                fail(names.insert(name.clone()), format!("alert {name} twice"));
            }
        }
        let documented = documented_alerts();
        fail(
            names == documented,
            format!("alerts {names:?} != the ones docs/operations.md documents {documented:?}"),
        );
        let selector = rule_values["operatorSelector"]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(String::from)
            .unwrap_or_else(|| format!("job=\"{}-metrics\",namespace=\"dbop-system\"", e.fullname));
        fail(
            r.to_string()
                .contains(&format!("absent(up{{{}}} == 1)", selector).replace('"', "\\\"")),
            format!("DbopOperatorDown does not select {selector}"),
        );
    }
    // NOTES: what was installed, and the watched namespaces.
    let watch_line = if e.watched.is_empty() {
        "It watches Databases in every namespace.".to_string()
    } else {
        format!(
            "It watches Databases in namespace(s) {} only.",
            e.watched.join(", ")
        )
    };
    fail(
        notes.contains(&watch_line),
        format!("NOTES lack {watch_line:?}"),
    );
    fail(
        notes.contains(&format!("Deployment {}:", e.fullname)),
        "NOTES lack the Deployment".into(),
    );
    fail(
        notes.contains("ServiceMonitor ") == e.service_monitor,
        "NOTES and the ServiceMonitor".into(),
    );
    fail(
        notes.contains("PrometheusRule ") == e.rule,
        "NOTES and the PrometheusRule".into(),
    );
    if let Some(first) = e.watched.first() {
        fail(
            notes.contains(&format!("kubectl get databases -n {first}")),
            "NOTES' example namespace".into(),
        );
    }
    wrong
}

#[test]
fn the_chart_renders_and_lints_in_every_documented_mode() {
    let dir = scratch("chart-render");
    let chart = chart();
    let chart = chart.to_str().unwrap();
    let axes = axes();
    let defaults = defaults();
    assert_eq!(
        defaults["image"]["repository"],
        release_image_repository().as_str(),
        "the chart's default image.repository is not release.env's DBOP_IMAGE_REPOSITORY"
    );
    let sizes: Vec<usize> = axes.iter().map(|a| a.settings.len()).collect();
    let rows = all_pairs(&sizes);
    let mut failures = Vec::new();
    for (n, row) in rows.iter().enumerate() {
        let mut overrides = Value::Object(Map::new());
        for (a, &s) in axes.iter().zip(row) {
            merge(&mut overrides, &a.settings[s]);
        }
        let mut values = defaults.clone();
        merge(&mut values, &overrides);
        let file = dir.join(format!("row-{n}.values.json"));
        std::fs::write(&file, overrides.to_string()).unwrap();
        let file = file.to_str().unwrap();
        let label = format!("row {n} ({overrides})");

        let (ok, out, err) = helm_cmd(
            &dir,
            &["template", "rel", chart, "-n", "dbop-system", "-f", file],
        );
        if !ok {
            failures.push(format!("{label}: helm template failed:\n{err}"));
            continue;
        }
        let docs = documents(&out);
        let (ok, lint, lint_err) = helm_cmd(
            &dir,
            &["lint", "--strict", chart, "-n", "dbop-system", "-f", file],
        );
        if !ok || !lint.contains("0 chart(s) failed") {
            failures.push(format!(
                "{label}: helm lint --strict failed:\n{lint}\n{lint_err}"
            ));
        }
        let (ok, install, install_err) = helm_cmd(
            &dir,
            &[
                "install",
                "rel",
                chart,
                "-n",
                "dbop-system",
                "--dry-run=client",
                "-f",
                file,
            ],
        );
        if !ok {
            failures.push(format!(
                "{label}: helm install --dry-run=client failed:\n{install_err}"
            ));
            continue;
        }
        let notes = install.split("\nNOTES:\n").nth(1).unwrap_or("");
        for w in check(&values, &docs, notes) {
            failures.push(format!("{label}: {w}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} renderings are wrong:\n{}",
        failures.len(),
        rows.len(),
        failures.join("\n\n")
    );
    let names: Vec<&str> = axes.iter().map(|a| a.name).collect();
    eprintln!(
        "{} renderings over the axes {names:?}: all render, lint and match",
        rows.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
