//! The plugin's requests to the API server: read what `status` shows, the superuser's name for
//! `psql`, and create and follow an on-demand `DatabaseBackup`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event, PersistentVolumeClaim, Pod, Secret, Service};
use kube::api::{ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::{Api, Client};

use super::health::{PodHealth, figures};
use super::logs;
use super::render::{EventLine, StatusView, from_meta_time};
use super::report::{self, Bundle};
use crate::api::{
    BackupMethod, BackupReason, Database, DatabaseBackup, DatabaseBackupSpec, MonitoringSpec,
};
use crate::resources::credentials::secret_name;
use crate::resources::primary_lease::PROMOTE_ANNOTATION;
use crate::resources::template_origin::RESTARTED_AT_ANNOTATION;
use dbop_contract::instance::METRICS_PORT;

/// What went wrong, in a sentence for the terminal.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("Database {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    #[error(
        "DatabaseBackup {namespace}/{name} not found (kubectl get databasebackups -n {namespace})"
    )]
    BackupNotFound { namespace: String, name: String },
    #[error(
        "the API server does not serve Databases: are the dbop CRDs installed? (kubectl apply -f crds/)"
    )]
    NoCrd,
    #[error("{what}: {}", brief(source))]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("lost the watch on DatabaseBackup {name}: {message}")]
    Watch { name: String, message: String },
    #[error("DatabaseBackup {name} was deleted while waiting for it")]
    Deleted { name: String },
    #[error(
        "DatabaseBackup {name} did not finish within {timeout:?} (it keeps going; see `kubectl get dbb {name}`)"
    )]
    Timeout { name: String, timeout: Duration },
}

/// The API server's own sentence when it sent one (`secrets "x" not found`), else the error.
fn brief(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) if !status.message.is_empty() => status.message.clone(),
        other => other.to_string(),
    }
}

fn api_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> PluginError {
    let what = what.into();
    move |source| PluginError::Api { what, source }
}

/// The Database, or a clear error when there is none of that name.
pub async fn database(client: &Client, ns: &str, name: &str) -> Result<Database, PluginError> {
    Api::<Database>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(|e| match e {
            // get_opt maps a missing object to None: a 404 left is the whole resource type.
            kube::Error::Api(s) if s.code == 404 => PluginError::NoCrd,
            e => api_error(format!("cannot read Database {ns}/{name}"))(e),
        })?
        .ok_or_else(|| PluginError::NotFound {
            namespace: ns.into(),
            name: name.into(),
        })
}

/// The DatabaseBackup of that name.
pub async fn backup(client: &Client, ns: &str, name: &str) -> Result<DatabaseBackup, PluginError> {
    Api::<DatabaseBackup>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(api_error(format!("cannot read DatabaseBackup {ns}/{name}")))?
        .ok_or_else(|| PluginError::BackupNotFound {
            namespace: ns.into(),
            name: name.into(),
        })
}

/// Whether a Database of that name exists.
pub async fn database_exists(client: &Client, ns: &str, name: &str) -> Result<bool, PluginError> {
    match database(client, ns, name).await {
        Ok(_) => Ok(true),
        Err(PluginError::NotFound { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Creates the Database; an existing one of that name is an error, never overwritten.
pub async fn create_database(client: &Client, db: &Database) -> Result<Database, PluginError> {
    let ns = db.namespace_or_default();
    Api::<Database>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), db)
        .await
        .map_err(api_error(format!(
            "cannot create Database {ns}/{}",
            db.name()
        )))
}

/// The Databases of the namespace, or of every namespace.
pub async fn databases(client: &Client, ns: Option<&str>) -> Result<Vec<Database>, PluginError> {
    let api = match ns {
        Some(ns) => Api::<Database>::namespaced(client.clone(), ns),
        None => Api::<Database>::all(client.clone()),
    };
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|e| match e {
            kube::Error::Api(s) if s.code == 404 => PluginError::NoCrd,
            e => api_error("cannot list Databases")(e),
        })
}

/// The DatabaseBackups of the Database.
pub async fn backups_of(
    client: &Client,
    ns: &str,
    name: &str,
) -> Result<Vec<DatabaseBackup>, PluginError> {
    Ok(Api::<DatabaseBackup>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map_err(api_error("cannot list DatabaseBackups"))?
        .items
        .into_iter()
        .filter(|b| b.spec.database == name)
        .collect())
}

/// The Database with its DatabaseBackups and the Events about it.
pub async fn status_view(client: &Client, ns: &str, name: &str) -> Result<StatusView, PluginError> {
    let database = database(client, ns, name).await?;
    let backups = backups_of(client, ns, name).await?;
    let selector = format!("involvedObject.kind=Database,involvedObject.name={name}");
    let events = Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default().fields(&selector))
        .await
        .map_err(api_error("cannot list Events"))?
        .items
        .iter()
        .map(event_line)
        .collect();
    let health = health(client, &database).await;
    Ok(StatusView {
        database,
        backups,
        events,
        health,
    })
}

/// How long one pod's scrape may take before `status` shows it as unavailable.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// Each database pod's health figures, scraped through the API server's pod proxy (the user
/// needs `get` on `pods/proxy`; without it the row says so).
async fn health(client: &Client, db: &Database) -> Vec<PodHealth> {
    let ns = db.namespace_or_default();
    let mut out = vec![];
    for ordinal in 0..db.spec.instances.max(1) {
        let pod = format!("{}-{ordinal}", db.name());
        let figures = if MonitoringSpec::enabled(db.spec.monitoring.as_ref()) {
            scrape(client, &ns, &pod).await.map(|text| figures(&text))
        } else {
            Err("spec.monitoring.enabled is false".into())
        };
        out.push(PodHealth { pod, figures });
    }
    out
}

/// One scrape of a database pod's `/metrics`, or why there is none.
async fn scrape(client: &Client, ns: &str, pod: &str) -> Result<String, String> {
    let path = format!("/api/v1/namespaces/{ns}/pods/{pod}:{METRICS_PORT}/proxy/metrics");
    let request = http::Request::get(path)
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    match tokio::time::timeout(SCRAPE_TIMEOUT, client.request_text(request)).await {
        Ok(Ok(text)) => Ok(text),
        Ok(Err(e)) => Err(brief(&e)),
        Err(_) => Err(format!("no answer within {SCRAPE_TIMEOUT:?}")),
    }
}

/// An Event as the screen shows it, at the last time it happened: a repeated Event written
/// through events.k8s.io (as dbop writes them) has its first time in `eventTime` and its latest
/// in `series.lastObservedTime`, with the repetitions in `series.count`; one written through
/// core/v1 has `lastTimestamp` and `count`. The newest of the times it carries wins.
fn event_line(e: &Event) -> EventLine {
    let micro = |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime| {
        DateTime::from_timestamp(t.0.as_second(), 0)
    };
    let times = [
        e.series
            .as_ref()
            .and_then(|s| s.last_observed_time.as_ref())
            .and_then(micro),
        e.last_timestamp.as_ref().and_then(from_meta_time),
        e.event_time.as_ref().and_then(micro),
        e.first_timestamp.as_ref().and_then(from_meta_time),
        e.metadata
            .creation_timestamp
            .as_ref()
            .and_then(from_meta_time),
    ];
    let at = times.into_iter().flatten().max();
    let count = e
        .series
        .as_ref()
        .and_then(|s| s.count)
        .into_iter()
        .chain(e.count)
        .max()
        .unwrap_or(1);
    EventLine {
        at,
        type_: e.type_.clone().unwrap_or_default(),
        reason: e.reason.clone().unwrap_or_default(),
        message: e.message.clone().unwrap_or_default(),
        count,
    }
}

/// The Database's instance pods.
pub async fn instance_pods(client: &Client, db: &Database) -> Result<Vec<Pod>, PluginError> {
    let ns = db.namespace_or_default();
    Api::<Pod>::namespaced(client.clone(), &ns)
        .list(&ListParams::default().labels(&logs::instance_selector(db)))
        .await
        .map(|l| l.items)
        .map_err(api_error(format!(
            "cannot list the pods of Database {ns}/{}",
            db.name()
        )))
}

/// The operator's pods (the chart's labels, in the namespace or any) and the Leases of their
/// namespaces (the leader holds one).
pub async fn operator_pods(
    client: &Client,
    ns: Option<&str>,
) -> Result<(Vec<Pod>, Vec<Lease>), PluginError> {
    let api = match ns {
        Some(ns) => Api::<Pod>::namespaced(client.clone(), ns),
        None => Api::<Pod>::all(client.clone()),
    };
    let pods = api
        .list(&ListParams::default().labels(logs::OPERATOR_SELECTOR))
        .await
        .map_err(api_error(format!(
            "cannot list the operator's pods ({})",
            logs::OPERATOR_SELECTOR
        )))?
        .items;
    let mut namespaces: Vec<String> = pods
        .iter()
        .filter_map(|p| p.metadata.namespace.clone())
        .collect();
    namespaces.sort();
    namespaces.dedup();
    let mut leases = vec![];
    for ns in namespaces {
        // Without the right to list Leases the first running pod is shown.
        if let Ok(list) = Api::<Lease>::namespaced(client.clone(), &ns)
            .list(&ListParams::default())
            .await
        {
            leases.extend(list.items);
        }
    }
    Ok((pods, leases))
}

/// How many lines of each container's log the report keeps.
const REPORT_LOG_LINES: i64 = 2000;

/// Lists the objects dbop made for the Database; a failure is noted in the bundle.
async fn owned<K>(client: &Client, ns: &str, database: &str, bundle: &mut Bundle) -> Vec<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let selector = report::owned_selector(database);
    match Api::<K>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&selector))
        .await
    {
        Ok(list) => list.items,
        Err(e) => {
            bundle.problem(format!(
                "{}: {}",
                K::plural(&K::DynamicType::default()),
                brief(&e)
            ));
            vec![]
        }
    }
}

/// The support bundle of the Database: it, its DatabaseBackups, the objects dbop made for it,
/// the Events about them, every container's log, and its Secrets by name and keys only.
pub async fn report(client: &Client, db: &Database, at: &str) -> Bundle {
    let ns = db.namespace_or_default();
    let name = db.name();
    let mut bundle = Bundle::default();
    bundle.objects("database.yaml", std::slice::from_ref(db));
    match backups_of(client, &ns, &name).await {
        Ok(backups) => bundle.objects("databasebackups.yaml", &backups),
        Err(e) => bundle.problem(e.to_string()),
    }
    let statefulsets: Vec<StatefulSet> = owned(client, &ns, &name, &mut bundle).await;
    bundle.objects("statefulsets.yaml", &statefulsets);
    let pods: Vec<Pod> = owned(client, &ns, &name, &mut bundle).await;
    bundle.objects("pods.yaml", &pods);
    let claims: Vec<PersistentVolumeClaim> = owned(client, &ns, &name, &mut bundle).await;
    bundle.objects("persistentvolumeclaims.yaml", &claims);
    let services: Vec<Service> = owned(client, &ns, &name, &mut bundle).await;
    bundle.objects("services.yaml", &services);
    let jobs: Vec<Job> = owned(client, &ns, &name, &mut bundle).await;
    bundle.objects("jobs.yaml", &jobs);
    let configmaps: Vec<ConfigMap> = owned(client, &ns, &name, &mut bundle).await;
    bundle.objects("configmaps.yaml", &configmaps);
    let mut secrets: Vec<Secret> = owned(client, &ns, &name, &mut bundle).await;
    // The user's credentials Secret carries none of dbop's labels.
    if let Ok(Some(own)) = Api::<Secret>::namespaced(client.clone(), &ns)
        .get_opt(&secret_name(db))
        .await
        && !secrets.iter().any(|s| s.metadata.name == own.metadata.name)
    {
        secrets.push(own);
    }
    bundle.secrets(&secrets);
    bundle_events(client, &ns, &name, &mut bundle).await;
    bundle_logs(client, &ns, &pods, &mut bundle).await;
    bundle.readme(&ns, &name, at);
    bundle
}

/// The Events about the Database and what dbop made for it (not those of another Database
/// whose name starts alike).
async fn bundle_events(client: &Client, ns: &str, name: &str, bundle: &mut Bundle) {
    let others: Vec<String> = match databases(client, Some(ns)).await {
        Ok(dbs) => dbs.iter().map(Database::name).collect(),
        Err(e) => {
            bundle.problem(e.to_string());
            vec![]
        }
    };
    match Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
    {
        Ok(list) => {
            let events: Vec<Event> = list
                .items
                .into_iter()
                .filter(|e| {
                    e.involved_object
                        .name
                        .as_deref()
                        .is_some_and(|n| report::event_concerns(name, &others, n))
                })
                .collect();
            bundle.objects("events.yaml", &events);
        }
        Err(e) => bundle.problem(format!("events: {}", brief(&e))),
    }
}

/// The last lines of every container's log (init containers first) of `pods`.
async fn bundle_logs(client: &Client, ns: &str, pods: &[Pod], bundle: &mut Bundle) {
    let api = Api::<Pod>::namespaced(client.clone(), ns);
    for pod in pods {
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let spec = pod.spec.clone().unwrap_or_default();
        let containers = spec
            .init_containers
            .unwrap_or_default()
            .into_iter()
            .chain(spec.containers)
            .map(|c| c.name);
        for container in containers {
            let params = LogParams {
                container: Some(container.clone()),
                tail_lines: Some(REPORT_LOG_LINES),
                ..LogParams::default()
            };
            match tokio::time::timeout(SCRAPE_TIMEOUT, api.logs(&pod_name, &params)).await {
                Ok(Ok(text)) => bundle.log(&pod_name, &container, text),
                Ok(Err(e)) => {
                    bundle.problem(format!("log of {pod_name}/{container}: {}", brief(&e)))
                }
                Err(_) => bundle.problem(format!(
                    "log of {pod_name}/{container}: no answer within {SCRAPE_TIMEOUT:?}"
                )),
            }
        }
    }
}

/// The credentials Secret of the Database (the user's or the generated one).
pub async fn credentials(client: &Client, db: &Database) -> Result<Secret, PluginError> {
    let ns = db.namespace_or_default();
    let name = secret_name(db);
    Api::<Secret>::namespaced(client.clone(), &ns)
        .get(&name)
        .await
        .map_err(api_error(format!(
            "cannot read the credentials Secret {ns}/{name}"
        )))
}

/// The name of an on-demand backup made at `now`: `<database>-manual-<yyyymmddhhmmss>` (UTC).
pub fn manual_backup_name(database: &str, now: DateTime<Utc>) -> String {
    format!("{database}-manual-{}", now.format("%Y%m%d%H%M%S"))
}

/// Creates a `Manual` DatabaseBackup of the (existing) Database, of `method`.
pub async fn create_backup(
    client: &Client,
    ns: &str,
    database: &str,
    method: BackupMethod,
    now: DateTime<Utc>,
) -> Result<DatabaseBackup, PluginError> {
    let name = manual_backup_name(database, now);
    let backup = DatabaseBackup::new(
        &name,
        DatabaseBackupSpec {
            database: database.into(),
            reason: BackupReason::Manual,
            method,
        },
    );
    Api::<DatabaseBackup>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &backup)
        .await
        .map_err(api_error(format!(
            "cannot create DatabaseBackup {ns}/{name}"
        )))
}

/// Asks the operator to make `instance` the primary of the Database (a switchover): the
/// annotation it answers with an Event and then removes.
pub async fn request_promotion(
    client: &Client,
    ns: &str,
    database: &str,
    instance: &str,
) -> Result<(), PluginError> {
    let patch = serde_json::json!({"metadata": {"annotations": {PROMOTE_ANNOTATION: instance}}});
    Api::<Database>::namespaced(client.clone(), ns)
        .patch(database, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(drop)
        .map_err(api_error(format!(
            "cannot ask for the promotion of {instance} in Database {ns}/{database}"
        )))
}

/// The patch that asks for a rolling restart at `now`: a new value of `dbop.dev/restartedAt`,
/// which the operator copies into the pod template (and its recorded inputs), so the
/// StatefulSet rolls the pods one at a time.
pub fn restart_patch(now: DateTime<Utc>) -> serde_json::Value {
    let at = now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    serde_json::json!({"metadata": {"annotations": {RESTARTED_AT_ANNOTATION: at}}})
}

/// Asks the operator for a rolling restart of the (existing) Database's pods.
pub async fn request_restart(
    client: &Client,
    ns: &str,
    database: &str,
    now: DateTime<Utc>,
) -> Result<(), PluginError> {
    Api::<Database>::namespaced(client.clone(), ns)
        .patch(
            database,
            &PatchParams::default(),
            &Patch::Merge(&restart_patch(now)),
        )
        .await
        .map(drop)
        .map_err(api_error(format!(
            "cannot ask for a restart of Database {ns}/{database}"
        )))
}

/// Follows the DatabaseBackup (a watch) until it succeeded or failed, or the timeout passed.
pub async fn wait_finished(
    client: &Client,
    ns: &str,
    name: &str,
    timeout: Duration,
) -> Result<DatabaseBackup, PluginError> {
    let api = Api::<DatabaseBackup>::namespaced(client.clone(), ns);
    let finished = |b: Option<&DatabaseBackup>| {
        b.and_then(|b| b.status.as_ref()?.phase)
            .is_some_and(|p| p.is_finished())
    };
    let timed_out = || PluginError::Timeout {
        name: name.into(),
        timeout,
    };
    match tokio::time::timeout(timeout, await_condition(api, name, finished)).await {
        Err(_) => Err(timed_out()),
        Ok(Err(e)) => Err(PluginError::Watch {
            name: name.into(),
            message: e.to_string(),
        }),
        Ok(Ok(Some(b))) => Ok(b),
        Ok(Ok(None)) => Err(PluginError::Deleted { name: name.into() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_backups_are_named_after_the_database_and_the_second() {
        let at = "2026-11-30T09:05:07Z".parse().unwrap();
        assert_eq!(
            manual_backup_name("orders", at),
            "orders-manual-20261130090507"
        );
    }

    /// The restart request is the annotation the operator copies into the pod template, with a
    /// new value each second.
    #[test]
    fn a_restart_request_is_a_new_restarted_at_annotation() {
        let at = "2026-11-30T09:05:07.123Z".parse().unwrap();
        assert_eq!(
            restart_patch(at),
            serde_json::json!({"metadata": {"annotations": {"dbop.dev/restartedAt": "2026-11-30T09:05:07Z"}}})
        );
        let db: Database = serde_json::from_value(serde_json::json!({
            "apiVersion": "dbop.dev/v1alpha1", "kind": "Database",
            "metadata": {"name": "orders", "namespace": "shop",
                "annotations": restart_patch(at)["metadata"]["annotations"].clone()},
            "spec": {"version": "16.4", "storage": {"size": "1Gi"}}
        }))
        .unwrap();
        let annotations = crate::resources::pod_annotations(&db).unwrap();
        assert_eq!(annotations["dbop.dev/restartedAt"], "2026-11-30T09:05:07Z");
    }

    /// A Ready Event first written at 09:00 and repeated (a series) until 10:05, after a
    /// Degraded one at 10:00: the screen's newest-last list ends with the Ready one.
    #[test]
    fn a_repeated_event_is_listed_at_its_last_time_with_its_series_count() {
        use super::super::render::{StatusView, status_screen};
        let event = |value: serde_json::Value| -> Event { serde_json::from_value(value).unwrap() };
        let ready = event(serde_json::json!({
            "metadata": {"name": "orders.1", "namespace": "shop",
                "creationTimestamp": "2026-11-30T09:00:00Z"},
            "involvedObject": {"kind": "Database", "name": "orders"},
            "type": "Normal", "reason": "Ready", "message": "accepting connections again",
            "eventTime": "2026-11-30T09:00:00.000000Z",
            "series": {"count": 3, "lastObservedTime": "2026-11-30T10:05:00.000000Z"}
        }));
        let degraded = event(serde_json::json!({
            "metadata": {"name": "orders.2", "namespace": "shop",
                "creationTimestamp": "2026-11-30T10:00:00Z"},
            "involvedObject": {"kind": "Database", "name": "orders"},
            "type": "Warning", "reason": "Degraded", "message": "pod orders-0 lost readiness",
            "eventTime": "2026-11-30T10:00:00.000000Z"
        }));
        // core/v1 style: lastTimestamp and count.
        let old = event(serde_json::json!({
            "metadata": {"name": "orders.3", "namespace": "shop",
                "creationTimestamp": "2026-11-30T08:00:00Z"},
            "involvedObject": {"kind": "Database", "name": "orders"},
            "type": "Normal", "reason": "Provisioning", "message": "creating the StatefulSet",
            "firstTimestamp": "2026-11-30T08:00:00Z", "lastTimestamp": "2026-11-30T08:30:00Z",
            "count": 2
        }));
        let lines: Vec<EventLine> = [&ready, &degraded, &old]
            .into_iter()
            .map(event_line)
            .collect();
        assert_eq!(lines[0].at, Some("2026-11-30T10:05:00Z".parse().unwrap()));
        assert_eq!(lines[0].count, 3);
        assert_eq!(lines[2].at, Some("2026-11-30T08:30:00Z".parse().unwrap()));
        assert_eq!(lines[2].count, 2);
        let database: Database = serde_json::from_value(serde_json::json!({
            "apiVersion": "dbop.dev/v1alpha1", "kind": "Database",
            "metadata": {"name": "orders", "namespace": "shop"},
            "spec": {"version": "15.20", "storage": {"size": "1Gi"}},
            "status": {"phase": "Ready"}
        }))
        .unwrap();
        let view = StatusView {
            database,
            backups: vec![],
            events: lines,
            health: vec![],
        };
        let screen = status_screen(&view, "2026-11-30T10:06:00Z".parse().unwrap());
        let at = |needle: &str| {
            screen
                .find(needle)
                .unwrap_or_else(|| panic!("{needle}:\n{screen}"))
        };
        assert!(
            at("creating the StatefulSet") < at("lost readiness"),
            "{screen}"
        );
        assert!(
            at("lost readiness") < at("accepting connections again (x3)"),
            "{screen}"
        );
    }
}
