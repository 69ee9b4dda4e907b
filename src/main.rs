//! The `dbop` binary: `dbop run` starts the controller, `dbop crd` prints the CRDs.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use dbop::kube_io::rate_limit::ApiLimits;
use dbop::operator::{ProcessSettings, Stopped};
use dbop::ops::leader::{self, LeaseSettings};
use dbop::settings::Settings;
use dbop::telemetry::{self, LogFormat};

#[derive(Parser)]
#[command(
    name = "dbop",
    version,
    about = "A Kubernetes operator that runs PostgreSQL with its whole lifecycle"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controller against the cluster of the current kubeconfig (or in-cluster config).
    Run(Box<RunArgs>),
    /// Print the CustomResourceDefinitions as YAML.
    Crd,
}

/// The flags of `dbop run` (each also read from a `DBOP_*` variable; docs/configuration.md).
#[derive(clap::Args)]
struct RunArgs {
    /// Watch only these namespaces (comma-separated; default: all namespaces).
    #[arg(long, env = "DBOP_WATCH_NAMESPACES", value_delimiter = ',')]
    watch_namespaces: Vec<String>,
    /// One namespace to watch: the older spelling of `--watch-namespaces`, added to its list.
    #[arg(long, env = "DBOP_NAMESPACE")]
    namespace: Option<String>,
    /// The PostgreSQL image of a version: `{version}` becomes the Database's `MAJOR.MINOR`
    /// (a value without `{version}` is a repository, tagged with the version). A Database's
    /// `spec.image` overrides it.
    #[arg(
        long,
        env = "DBOP_POSTGRES_IMAGE_TEMPLATE",
        default_value = dbop::settings::DEFAULT_POSTGRES_IMAGE_TEMPLATE
    )]
    postgres_image_template: String,
    /// dbop's own image, holding the static `dbop-instance` and `dbop-backup` at
    /// `/usr/local/bin`: database and backup pods copy them from it with an init container.
    #[arg(long, env = "DBOP_AGENT_IMAGE", default_value = dbop::settings::DEFAULT_AGENT_IMAGE)]
    agent_image: String,
    /// Pull secrets (comma-separated names, in each Database's namespace) for the pods dbop
    /// creates.
    #[arg(long, env = "DBOP_IMAGE_PULL_SECRETS", value_delimiter = ',')]
    image_pull_secrets: Vec<String>,
    /// Resources of the init and backup Jobs' containers, as JSON
    /// (`{"requests":{"cpu":"100m","memory":"128Mi"},"limits":{"memory":"512Mi"}}`).
    #[arg(long, env = "DBOP_JOB_RESOURCES")]
    job_resources: Option<String>,
    /// API requests per second on average (0: no limit); a watch counts once, when it starts.
    #[arg(long, env = "DBOP_API_QPS", default_value_t = 50.0)]
    api_qps: f64,
    /// API requests at once above `--api-qps` (the token bucket's size).
    #[arg(long, env = "DBOP_API_BURST", default_value_t = 100)]
    api_burst: u32,
    /// Database reconciles at once (0: unbounded). Bounded so that thousands of new Databases
    /// drain steadily instead of timing each other out (docs/benchmarks.md).
    #[arg(long, env = "DBOP_RECONCILE_CONCURRENCY", default_value_t = dbop::runtime::DEFAULT_RECONCILE_CONCURRENCY)]
    reconcile_concurrency: u16,
    /// Log format.
    #[arg(long, env = "DBOP_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Where `/metrics`, `/healthz` and `/readyz` listen (port 0: any free port).
    #[arg(long, env = "DBOP_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Run the controllers only while holding a Lease, so that of several replicas only one
    /// writes (the chart turns it on).
    #[arg(long, env = "DBOP_LEADER_ELECT", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    leader_elect: bool,
    /// The Lease's name.
    #[arg(
        long,
        env = "DBOP_LEADER_ELECT_LEASE_NAME",
        default_value = "dbop-leader"
    )]
    leader_elect_lease_name: String,
    /// The Lease's namespace (default: the pod's namespace, else the kubeconfig's).
    #[arg(long, env = "DBOP_LEADER_ELECT_NAMESPACE")]
    leader_elect_namespace: Option<String>,
    /// Seconds the lease holds after the last renewal: how long a standby waits after the
    /// leader died.
    #[arg(long, env = "DBOP_LEADER_ELECT_LEASE_DURATION", default_value_t = 15)]
    leader_elect_lease_duration: u64,
    /// Seconds before expiry the leader renews the lease.
    #[arg(long, env = "DBOP_LEADER_ELECT_RENEW_GRACE", default_value_t = 5)]
    leader_elect_renew_grace: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => match dbop::api::crds_yaml() {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("dbop: cannot render the CRDs: {error}");
                ExitCode::FAILURE
            }
        },
        Command::Run(args) => run(*args).await,
    }
}

async fn run(args: RunArgs) -> ExitCode {
    telemetry::init(args.log_format);
    let job_resources = match args.job_resources.as_deref().map(serde_json::from_str) {
        None => dbop::settings::default_job_resources(),
        Some(Ok(resources)) => resources,
        Some(Err(error)) => {
            tracing::error!(%error, "--job-resources (DBOP_JOB_RESOURCES) is not a resources object such as {{\"requests\":{{\"memory\":\"128Mi\"}}}}");
            return ExitCode::FAILURE;
        }
    };
    let limits = ApiLimits {
        qps: args.api_qps,
        burst: args.api_burst,
    };
    if let Err(problem) = limits.check() {
        tracing::error!("{problem}");
        return ExitCode::FAILURE;
    }
    let client = match dbop::operator::client(limits).await {
        Ok(client) => client,
        Err(error) => {
            tracing::error!(%error, "cannot reach the Kubernetes API: set KUBECONFIG or run in a cluster");
            return ExitCode::FAILURE;
        }
    };
    let namespaces = match watched_namespaces(args.watch_namespaces.clone(), args.namespace.clone())
    {
        Ok(namespaces) => namespaces,
        Err(problem) => {
            tracing::error!("{problem}");
            return ExitCode::FAILURE;
        }
    };
    let lease = args.leader_elect.then(|| lease_settings(&args, &client));
    if let Some(Err(problem)) = lease.as_ref().map(LeaseSettings::check) {
        tracing::error!("--leader-elect-lease-duration / --leader-elect-renew-grace: {problem}");
        return ExitCode::FAILURE;
    }
    let settings = Settings {
        postgres_image_template: args.postgres_image_template,
        agent_image: args.agent_image,
        image_pull_secrets: args
            .image_pull_secrets
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect(),
        job_resources,
    };
    let process = ProcessSettings {
        metrics_addr: args.metrics_addr,
        lease,
        namespaces,
        reconcile_concurrency: args.reconcile_concurrency,
    };
    match dbop::operator::run(client, settings, process).await {
        Stopped::Signal => ExitCode::SUCCESS,
        Stopped::LostLease | Stopped::Endpoints => ExitCode::FAILURE,
    }
}

/// `--watch-namespaces` and `--namespace` together, each name once, blanks dropped (none: all);
/// a name that cannot be a namespace is refused.
fn watched_namespaces(list: Vec<String>, single: Option<String>) -> Result<Vec<String>, String> {
    let mut namespaces: Vec<String> = Vec::new();
    for ns in list
        .into_iter()
        .chain(single)
        .map(|ns| ns.trim().to_string())
    {
        if ns.is_empty() || namespaces.contains(&ns) {
            continue;
        }
        if !is_namespace_name(&ns) {
            return Err(format!(
                "--watch-namespaces / --namespace: {ns:?} is not a namespace name (lowercase letters, digits and '-', at most 63)"
            ));
        }
        namespaces.push(ns);
    }
    Ok(namespaces)
}

/// A DNS-1123 label, as namespace names are.
fn is_namespace_name(name: &str) -> bool {
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    name.len() <= 63 && name.chars().all(allowed) && !name.starts_with('-') && !name.ends_with('-')
}

/// The Lease of `--leader-elect`: in the pod's namespace unless one is given.
fn lease_settings(args: &RunArgs, client: &kube::Client) -> LeaseSettings {
    LeaseSettings {
        name: args.leader_elect_lease_name.clone(),
        namespace: args
            .leader_elect_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .unwrap_or_else(|| client.default_namespace().to_string()),
        identity: leader::default_identity(),
        duration: Duration::from_secs(args.leader_elect_lease_duration),
        grace: Duration::from_secs(args.leader_elect_renew_grace),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn both_namespace_flags_make_one_list_each_name_once() {
        let list = strings(&["apps", " shop", ""]);
        let merged = watched_namespaces(list, Some("apps".into()));
        assert_eq!(merged.unwrap(), ["apps", "shop"]);
        assert_eq!(
            watched_namespaces(vec![], Some("one".into())).unwrap(),
            ["one"]
        );
        assert!(watched_namespaces(vec![], None).unwrap().is_empty(), "all");
    }

    #[test]
    fn a_name_that_cannot_be_a_namespace_is_refused_with_its_name() {
        for bad in ["apps,", "Apps", "-a", &"a".repeat(64)] {
            let error = watched_namespaces(strings(&[bad]), None).unwrap_err();
            assert!(error.contains(&format!("{bad:?}")), "{error}");
        }
    }

    #[test]
    fn watch_namespaces_splits_on_commas() {
        let cli = Cli::try_parse_from([
            "dbop",
            "run",
            "--watch-namespaces",
            "a,b",
            "--namespace",
            "c",
        ]);
        let Command::Run(args) = cli.unwrap().command else {
            panic!("not run")
        };
        assert_eq!(args.watch_namespaces, ["a", "b"]);
        assert_eq!(args.namespace.as_deref(), Some("c"));
    }
}
