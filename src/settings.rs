//! The operator's settings: what `dbop run` is told (flags or environment) that the builders
//! and the controllers use, with their defaults. Pure data.

use std::time::Duration;

use k8s_openapi::api::core::v1::ResourceRequirements;

use crate::api::PodSecuritySpec;
use crate::objects::quantities;

/// Operator-wide settings: what `dbop run` is told (flags or environment) and the builders use.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// The PostgreSQL image of a version: `{version}` is replaced by the Database's
    /// `MAJOR.MINOR` (e.g. `docker.io/library/postgres:{version}`). A template without
    /// `{version}` is a repository, tagged with the version.
    pub postgres_image_template: String,
    /// dbop's own image: it holds the static `dbop-backup` and `dbop-instance` at
    /// `/usr/local/bin`, which init containers copy into the database and backup pods.
    pub agent_image: String,
    /// Pull secrets (in the Database's namespace) for the pods dbop creates.
    pub image_pull_secrets: Vec<String>,
    /// Resources of the init and backup Jobs' containers.
    pub job_resources: ResourceRequirements,
    /// Resources of the database container of a Database without `spec.resources`.
    pub database_resources: ResourceRequirements,
    /// The ids of the pods of a Database without `spec.podSecurity` (None: from the image's
    /// name, `resources::pod::image_uid`). On OpenShift, `assignedBy: Platform` for all.
    pub database_pod_security: Option<PodSecuritySpec>,
    /// Watch the nodes (cordoned or not): a primary on a node being drained hands over first.
    /// Off where dbop may read nothing cluster-wide (the chart's watchNamespaces mode).
    pub watch_nodes: bool,
    /// How the operator moves Databases onto its own instance manager (the `release` module).
    pub release: ReleasePolicy,
}

/// How an operator release reaches the Databases (the `release` module).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReleasePolicy {
    /// At most this many Databases restart onto a new release at once (at least 1).
    pub wave: u32,
    /// The release may restart Databases outside their maintenance windows, and those without
    /// one (a security fix): still in waves.
    pub urgent: bool,
    /// A Database not healthy this long after it started on the release failed it: it is rolled
    /// back and the release stops.
    pub timeout: Duration,
}

impl Default for ReleasePolicy {
    fn default() -> Self {
        Self {
            wave: 1,
            urgent: false,
            timeout: Duration::from_secs(600),
        }
    }
}

/// Where a release publishes the operator's image (release.env, read by build.rs).
pub const IMAGE_REPOSITORY: &str = env!("DBOP_IMAGE_REPOSITORY");
/// The default agent image: the operator's own published image of this version (a process
/// cannot know the image it runs from; the chart sets the one it installed).
pub const DEFAULT_AGENT_IMAGE: &str = concat!(
    env!("DBOP_IMAGE_REPOSITORY"),
    ":",
    env!("CARGO_PKG_VERSION")
);
/// The default PostgreSQL image template: the official images.
pub const DEFAULT_POSTGRES_IMAGE_TEMPLATE: &str = "docker.io/library/postgres:{version}";

impl Default for Settings {
    fn default() -> Self {
        Self {
            postgres_image_template: DEFAULT_POSTGRES_IMAGE_TEMPLATE.into(),
            agent_image: DEFAULT_AGENT_IMAGE.into(),
            image_pull_secrets: Vec::new(),
            job_resources: default_job_resources(),
            database_resources: default_database_resources(),
            database_pod_security: None,
            watch_nodes: true,
            release: ReleasePolicy::default(),
        }
    }
}

impl Settings {
    /// The image of a PostgreSQL version from the template.
    pub fn postgres_image(&self, version: &str) -> String {
        if self.postgres_image_template.contains("{version}") {
            self.postgres_image_template.replace("{version}", version)
        } else {
            format!("{}:{version}", self.postgres_image_template)
        }
    }
}

/// The default resources of Job containers (init SQL, backups): a namespace with a
/// ResourceQuota and no LimitRange admits them. Operators change them with `--job-resources`.
pub fn default_job_resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: quantities(&[("cpu", "100m"), ("memory", "128Mi")]),
        limits: quantities(&[("cpu", "1"), ("memory", "512Mi")]),
        ..ResourceRequirements::default()
    }
}

/// The default resources of the database container (`spec.resources` absent): enough for a
/// small database, and admitted by a namespace whose ResourceQuota requires requests and limits
/// of cpu and memory. The memory limit equals the request, so the pod is never killed for using
/// memory it was promised (and a runaway query cannot take the node's memory); the CPU limit is
/// generous, one core over a request of a tenth, because a CPU limit throttles rather than
/// protects. Operators change them with `--database-resources`, users with `spec.resources`.
pub fn default_database_resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: quantities(&[("cpu", "100m"), ("memory", "256Mi")]),
        limits: quantities(&[("cpu", "1"), ("memory", "256Mi")]),
        ..ResourceRequirements::default()
    }
}
