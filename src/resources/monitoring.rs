//! The database pods' metrics endpoint (`spec.monitoring`): the instance manager's
//! `--metrics-addr`, the container port `metrics`, and the custom queries' ConfigMap key
//! mounted where the manager reads it at every scrape.
//!
//! Pure: functions of the Database.

use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, ContainerPort, KeyToPath, PodTemplateSpec, Volume,
};

use crate::api::{Database, MonitoringSpec};
use dbop_contract::instance::{
    METRICS_PORT, METRICS_QUERIES_DIR, METRICS_QUERIES_FILE, metrics_args,
};

/// The name of the metrics port (what a PodMonitor's `podMetricsEndpoints[].port` names).
pub const METRICS_PORT_NAME: &str = "metrics";
const QUERIES_VOLUME: &str = "metrics-queries";

/// Opens the metrics endpoint in the database pod template, when the spec wants it.
pub fn add_to_pod_template(template: &mut PodTemplateSpec, db: &Database) {
    let spec = db.spec.monitoring.as_ref();
    if !MonitoringSpec::enabled(spec) {
        return;
    }
    let Some(pod) = template.spec.as_mut() else {
        return;
    };
    let Some(postgres) = pod.containers.iter_mut().find(|c| c.name == "postgres") else {
        return;
    };
    open_endpoint(postgres);
    let Some(queries) = spec.and_then(|m| m.custom_queries.as_ref()) else {
        return;
    };
    postgres
        .volume_mounts
        .get_or_insert_with(Vec::new)
        .push(super::pod::mount(QUERIES_VOLUME, METRICS_QUERIES_DIR, true));
    pod.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: QUERIES_VOLUME.into(),
        config_map: Some(ConfigMapVolumeSource {
            name: queries.name.clone(),
            items: Some(vec![KeyToPath {
                key: queries.key.clone(),
                path: METRICS_QUERIES_FILE.into(),
                ..KeyToPath::default()
            }]),
            // A missing ConfigMap or key: no custom queries, and the pod still starts.
            optional: Some(true),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    });
}

/// `run --metrics-addr` (the probes keep their arguments) and the named port.
fn open_endpoint(postgres: &mut Container) {
    postgres
        .command
        .get_or_insert_with(Vec::new)
        .extend(metrics_args(METRICS_PORT));
    postgres
        .ports
        .get_or_insert_with(Vec::new)
        .push(ContainerPort {
            name: Some(METRICS_PORT_NAME.into()),
            container_port: i32::from(METRICS_PORT),
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::statefulset::statefulset;
    use crate::resources::testing;
    use crate::settings::Settings;
    use dbop_contract::instance::{Cli, Cmd};

    fn template(monitoring: serde_json::Value) -> PodTemplateSpec {
        let mut spec = serde_json::json!({"version": "16.4", "storage": {"size": "1Gi"}});
        if !monitoring.is_null() {
            spec["monitoring"] = monitoring;
        }
        let db = testing::database(spec);
        statefulset(&db, &Settings::default(), None).spec.template
    }

    fn postgres(t: &PodTemplateSpec) -> Container {
        let spec = t.spec.clone().unwrap();
        spec.containers
            .into_iter()
            .find(|c| c.name == "postgres")
            .unwrap()
    }

    #[test]
    fn the_endpoint_is_on_by_default_and_the_manager_parses_it() {
        let c = postgres(&template(serde_json::Value::Null));
        let command = c.command.clone().unwrap();
        let Cmd::Run(run) = <Cli as clap::Parser>::try_parse_from(command)
            .unwrap()
            .command
        else {
            panic!("not run");
        };
        assert_eq!(run.metrics_addr.map(|a| a.port()), Some(METRICS_PORT));
        let ports: Vec<_> = c
            .ports
            .unwrap()
            .into_iter()
            .map(|p| (p.name, p.container_port))
            .collect();
        assert!(ports.contains(&(Some("metrics".into()), 9187)), "{ports:?}");
        // The probes do not serve metrics.
        let probe = c.readiness_probe.unwrap().exec.unwrap().command.unwrap();
        assert!(
            !probe.iter().any(|a| a.starts_with("--metrics-addr")),
            "{probe:?}"
        );
    }

    #[test]
    fn off_means_no_endpoint() {
        let c = postgres(&template(serde_json::json!({"enabled": false})));
        assert!(
            !c.command
                .unwrap()
                .iter()
                .any(|a| a.starts_with("--metrics-addr"))
        );
        assert!(
            !c.ports
                .unwrap()
                .iter()
                .any(|p| p.name.as_deref() == Some("metrics"))
        );
    }

    #[test]
    fn custom_queries_are_mounted_where_the_manager_reads_them() {
        let t = template(
            serde_json::json!({"customQueries": {"name": "orders-metrics", "key": "q.yaml"}}),
        );
        let c = postgres(&t);
        let mount = c
            .volume_mounts
            .unwrap()
            .into_iter()
            .find(|m| m.name == QUERIES_VOLUME)
            .expect("the queries mount");
        assert_eq!(mount.mount_path, METRICS_QUERIES_DIR);
        let volume = t
            .spec
            .unwrap()
            .volumes
            .unwrap()
            .into_iter()
            .find(|v| v.name == QUERIES_VOLUME)
            .expect("the queries volume");
        let cm = volume.config_map.unwrap();
        assert_eq!(cm.name, "orders-metrics");
        assert_eq!(cm.optional, Some(true));
        let item = &cm.items.unwrap()[0];
        assert_eq!(
            (item.key.as_str(), item.path.as_str()),
            ("q.yaml", METRICS_QUERIES_FILE)
        );
    }
}
