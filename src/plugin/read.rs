//! The plugin's requests to the API server: read what `status` shows, the superuser's name for
//! `psql`, and create and follow an on-demand `DatabaseBackup`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::api::{ListParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::{Api, Client};

use super::render::{EventLine, StatusView, from_meta_time};
use crate::api::{BackupReason, Database, DatabaseBackup, DatabaseBackupSpec};
use crate::resources::credentials::secret_name;

/// What went wrong, in a sentence for the terminal.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("Database {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
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

/// The Database with its DatabaseBackups and the Events about it.
pub async fn status_view(client: &Client, ns: &str, name: &str) -> Result<StatusView, PluginError> {
    let database = database(client, ns, name).await?;
    let backups = Api::<DatabaseBackup>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map_err(api_error("cannot list DatabaseBackups"))?
        .items
        .into_iter()
        .filter(|b| b.spec.database == name)
        .collect();
    let selector = format!("involvedObject.kind=Database,involvedObject.name={name}");
    let events = Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default().fields(&selector))
        .await
        .map_err(api_error("cannot list Events"))?
        .items
        .iter()
        .map(event_line)
        .collect();
    Ok(StatusView {
        database,
        backups,
        events,
    })
}

fn event_line(e: &Event) -> EventLine {
    let at = e
        .last_timestamp
        .as_ref()
        .and_then(from_meta_time)
        .or_else(|| {
            e.event_time
                .as_ref()
                .and_then(|t| DateTime::from_timestamp(t.0.as_second(), 0))
        })
        .or_else(|| {
            e.metadata
                .creation_timestamp
                .as_ref()
                .and_then(from_meta_time)
        });
    EventLine {
        at,
        type_: e.type_.clone().unwrap_or_default(),
        reason: e.reason.clone().unwrap_or_default(),
        message: e.message.clone().unwrap_or_default(),
        count: e.count.unwrap_or(1),
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

/// Creates a `Manual` DatabaseBackup of the (existing) Database.
pub async fn create_backup(
    client: &Client,
    ns: &str,
    database: &str,
    now: DateTime<Utc>,
) -> Result<DatabaseBackup, PluginError> {
    let name = manual_backup_name(database, now);
    let backup = DatabaseBackup::new(
        &name,
        DatabaseBackupSpec {
            database: database.into(),
            reason: BackupReason::Manual,
        },
    );
    Api::<DatabaseBackup>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &backup)
        .await
        .map_err(api_error(format!(
            "cannot create DatabaseBackup {ns}/{name}"
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
}
