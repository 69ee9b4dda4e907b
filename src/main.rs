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
use k8s_openapi::api::core::v1::ResourceRequirements;

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
    #[arg(long, env = "DBOP_WATCH_NAMESPACES", value_delimiter = ',', value_parser = parse_namespace)]
    watch_namespaces: Vec<String>,
    /// One namespace to watch: the older spelling of `--watch-namespaces`, added to its list.
    #[arg(long, env = "DBOP_NAMESPACE", value_parser = parse_namespace)]
    namespace: Option<String>,
    /// Watch the nodes (list, watch: whether each is cordoned), so that a primary on a node
    /// being drained hands over to a standby first; `false` where dbop may read nothing
    /// cluster-wide.
    #[arg(long, env = "DBOP_WATCH_NODES", default_value_t = true, action = clap::ArgAction::Set)]
    watch_nodes: bool,
    /// At most this many Databases restart at once onto this operator's instance manager (a
    /// wave), each in its maintenance window; the next when one of them is healthy on it.
    #[arg(long, env = "DBOP_RELEASE_WAVE", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    release_wave: u32,
    /// This release is urgent (a security fix): it restarts Databases outside their
    /// maintenance windows, and those without one, still in waves.
    #[arg(long, env = "DBOP_RELEASE_URGENT", default_value_t = false, action = clap::ArgAction::Set)]
    release_urgent: bool,
    /// Seconds a Database may take to be healthy again on this release; one that takes longer
    /// (or whose pod fails) is rolled back, and the release stops.
    #[arg(long, env = "DBOP_RELEASE_TIMEOUT", default_value_t = 600, value_parser = clap::value_parser!(u64).range(30..))]
    release_timeout: u64,
    /// The PostgreSQL image of a version: `{version}` becomes the Database's `MAJOR.MINOR`
    /// (a value without `{version}` is a repository, tagged with the version). A Database's
    /// `spec.image` overrides it.
    #[arg(
        long,
        env = "DBOP_POSTGRES_IMAGE_TEMPLATE",
        default_value = dbop::settings::DEFAULT_POSTGRES_IMAGE_TEMPLATE,
        value_parser = parse_image
    )]
    postgres_image_template: String,
    /// dbop's own image, holding the static `dbop-instance` and `dbop-backup` at
    /// `/usr/local/bin`: database and backup pods copy them from it with an init container.
    #[arg(long, env = "DBOP_AGENT_IMAGE", default_value = dbop::settings::DEFAULT_AGENT_IMAGE, value_parser = parse_image)]
    agent_image: String,
    /// Pull secrets (comma-separated names, in each Database's namespace) for the pods dbop
    /// creates.
    #[arg(long, env = "DBOP_IMAGE_PULL_SECRETS", value_delimiter = ',', value_parser = parse_secret_name)]
    image_pull_secrets: Vec<String>,
    /// Resources of the init and backup Jobs' containers, as JSON
    /// (`{"requests":{"cpu":"100m","memory":"128Mi"},"limits":{"memory":"512Mi"}}`).
    #[arg(long, env = "DBOP_JOB_RESOURCES", value_parser = parse_resources)]
    job_resources: Option<ResourceRequirements>,
    /// Resources of the database container of a Database without `spec.resources`, as JSON
    /// (default: requests cpu 100m, memory 256Mi; limits cpu 1, memory 256Mi).
    #[arg(long, env = "DBOP_DATABASE_RESOURCES", value_parser = parse_resources)]
    database_resources: Option<ResourceRequirements>,
    /// The ids of the pods of a Database without `spec.podSecurity`, as JSON with its fields
    /// (`{"assignedBy":"Platform"}` on OpenShift; `{"runAsUser":26}` for an image template
    /// whose postgres user the name does not tell). Default: from each image's name.
    #[arg(long, env = "DBOP_DATABASE_POD_SECURITY", value_parser = parse_pod_security)]
    database_pod_security: Option<dbop::api::PodSecuritySpec>,
    /// API requests per second on average (0: no limit); a watch counts once, when it starts.
    #[arg(long, env = "DBOP_API_QPS", default_value_t = 50.0, allow_negative_numbers = true, value_parser = parse_qps)]
    api_qps: f64,
    /// API requests at once above `--api-qps` (the token bucket's size).
    #[arg(long, env = "DBOP_API_BURST", default_value_t = 100)]
    api_burst: u32,
    /// Converging Database reconciles at once (0: unbounded). Bounded so that thousands of new
    /// Databases drain steadily instead of timing each other out (docs/benchmarks.md); repairs
    /// of Ready Databases have a reserve of a quarter of this beside them.
    #[arg(long, env = "DBOP_RECONCILE_CONCURRENCY", default_value_t = dbop::runtime::DEFAULT_RECONCILE_CONCURRENCY)]
    reconcile_concurrency: u16,
    /// Log format.
    #[arg(long, env = "DBOP_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Where `/metrics`, `/healthz` and `/readyz` listen, `HOST:PORT` or `:PORT` (all
    /// interfaces; port 0: any free port).
    #[arg(long, env = "DBOP_METRICS_ADDR", default_value = "0.0.0.0:8080", value_parser = parse_listen_addr)]
    metrics_addr: SocketAddr,
    /// Run the controllers only while holding a Lease, so that of several replicas only one
    /// writes (the chart turns it on).
    #[arg(long, env = "DBOP_LEADER_ELECT", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    leader_elect: bool,
    /// The Lease's name.
    #[arg(
        long,
        env = "DBOP_LEADER_ELECT_LEASE_NAME",
        default_value = "dbop-leader",
        value_parser = parse_lease_name
    )]
    leader_elect_lease_name: String,
    /// The Lease's namespace (default: the pod's namespace, else the kubeconfig's).
    #[arg(long, env = "DBOP_LEADER_ELECT_NAMESPACE", value_parser = parse_namespace)]
    leader_elect_namespace: Option<String>,
    /// Seconds the lease holds after the last renewal: how long a standby waits after the
    /// leader died.
    #[arg(long, env = "DBOP_LEADER_ELECT_LEASE_DURATION", default_value_t = 15)]
    leader_elect_lease_duration: u64,
    /// Seconds before expiry the leader renews the lease.
    #[arg(long, env = "DBOP_LEADER_ELECT_RENEW_GRACE", default_value_t = 5)]
    leader_elect_renew_grace: u64,
}

/// The stack of each runtime worker: a reconcile pass is one deep future (observe, decide,
/// build, apply), and tokio's default of 2 MiB was overrun by a debug build's frames.
const WORKER_STACK_BYTES: usize = 8 << 20;

fn main() -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(WORKER_STACK_BYTES)
        .build();
    match runtime {
        Ok(runtime) => runtime.block_on(start()),
        Err(error) => {
            eprintln!("dbop: cannot start the async runtime: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn start() -> ExitCode {
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
    // Every flag is checked before the first request (clap's parsers did the rest).
    let checked = match check(&args) {
        Ok(checked) => checked,
        Err(problem) => {
            tracing::error!("{problem}");
            return ExitCode::FAILURE;
        }
    };
    let client = match dbop::operator::client(checked.limits).await {
        Ok(client) => client,
        Err(error) => {
            tracing::error!(%error, "cannot reach the Kubernetes API: set KUBECONFIG or run in a cluster");
            return ExitCode::FAILURE;
        }
    };
    let (namespaces, job_resources) = (checked.namespaces, checked.job_resources);
    let lease = args.leader_elect.then(|| lease_settings(&args, &client));
    let settings = Settings {
        postgres_image_template: args.postgres_image_template,
        agent_image: args.agent_image,
        image_pull_secrets: args
            .image_pull_secrets
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect(),
        job_resources,
        database_resources: args
            .database_resources
            .unwrap_or_else(dbop::settings::default_database_resources),
        database_pod_security: args.database_pod_security,
        watch_nodes: args.watch_nodes,
        release: dbop::settings::ReleasePolicy {
            wave: args.release_wave,
            urgent: args.release_urgent,
            timeout: Duration::from_secs(args.release_timeout),
        },
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

/// What `run` takes from the flags once they are known to be consistent.
struct Checked {
    limits: ApiLimits,
    namespaces: Vec<String>,
    job_resources: ResourceRequirements,
}

/// The checks that involve more than one flag (each flag alone is checked by its parser).
fn check(args: &RunArgs) -> Result<Checked, String> {
    let limits = ApiLimits {
        qps: args.api_qps,
        burst: args.api_burst,
    };
    limits.check()?;
    let namespaces = watched_namespaces(args.watch_namespaces.clone(), args.namespace.clone())?;
    if args.leader_elect {
        let timing = LeaseSettings {
            name: args.leader_elect_lease_name.clone(),
            namespace: String::new(),
            identity: String::new(),
            duration: Duration::from_secs(args.leader_elect_lease_duration),
            grace: Duration::from_secs(args.leader_elect_renew_grace),
        };
        timing.check().map_err(|p| {
            format!("--leader-elect-lease-duration / --leader-elect-renew-grace: {p}")
        })?;
    }
    let job_resources = args
        .job_resources
        .clone()
        .unwrap_or_else(dbop::settings::default_job_resources);
    Ok(Checked {
        limits,
        namespaces,
        job_resources,
    })
}

/// `--watch-namespaces`, `--namespace`, `--leader-elect-namespace`: a namespace name (blank:
/// none, dropped).
fn parse_namespace(value: &str) -> Result<String, String> {
    let ns = value.trim();
    if ns.is_empty() || is_namespace_name(ns) {
        Ok(ns.to_string())
    } else {
        Err(format!(
            "{ns:?} is not a namespace name (lowercase letters, digits and '-', at most 63)"
        ))
    }
}

/// `--leader-elect-lease-name`: a Lease's name (a DNS subdomain).
fn parse_lease_name(value: &str) -> Result<String, String> {
    if is_subdomain(value) {
        Ok(value.to_string())
    } else {
        Err(format!(
            "{value:?} is not a Lease name (lowercase letters, digits, '-' and '.', at most 253)"
        ))
    }
}

/// `--image-pull-secrets`: Secret names (DNS subdomains; blank: none, dropped).
fn parse_secret_name(value: &str) -> Result<String, String> {
    let name = value.trim();
    if name.is_empty() || is_subdomain(name) {
        Ok(name.to_string())
    } else {
        Err(format!(
            "{name:?} is not a Secret name (lowercase letters, digits, '-' and '.', at most 253)"
        ))
    }
}

/// A DNS-1123 subdomain, as most object names are.
fn is_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .split('.')
            .all(|label| !label.is_empty() && is_namespace_name(label))
}

/// `--agent-image`, `--postgres-image-template`: an image reference, not blank.
fn parse_image(value: &str) -> Result<String, String> {
    if value.trim().is_empty() || value.chars().any(char::is_whitespace) {
        return Err(format!(
            "{value:?} is not an image reference (e.g. registry.example.com/dbop:0.1.0)"
        ));
    }
    Ok(value.to_string())
}

/// `--api-qps`: 0 (no limit) or a positive number.
fn parse_qps(value: &str) -> Result<f64, String> {
    let qps: f64 = value.trim().parse().map_err(|_| {
        format!("{value:?} is not a number: give requests per second, 0 for no limit")
    })?;
    if !qps.is_finite() || qps < 0.0 {
        return Err(format!("must be 0 (no limit) or positive, not {value}"));
    }
    Ok(qps)
}

/// `--metrics-addr`: `HOST:PORT`, or `:PORT` for every interface (as controller-runtime's).
fn parse_listen_addr(value: &str) -> Result<SocketAddr, String> {
    let full = match value.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => value.to_string(),
    };
    full.parse().map_err(|_| {
        format!(
            "{value:?} is not an address to listen on: give IP:PORT such as 0.0.0.0:8080, or :8080"
        )
    })
}

/// `--job-resources`, `--database-resources`: a ResourceRequirements object (`requests`, `limits`, `claims`) whose
/// every value is a Kubernetes quantity, so that a typo stops the operator now rather than
/// failing each Job the API server refuses later.
fn parse_pod_security(value: &str) -> Result<dbop::api::PodSecuritySpec, String> {
    const EXAMPLE: &str = r#"{"assignedBy":"Platform"} or {"runAsUser":26,"fsGroup":26}"#;
    let spec: dbop::api::PodSecuritySpec = serde_json::from_str(value)
        .map_err(|e| format!("not a podSecurity object ({e}), e.g. {EXAMPLE}"))?;
    dbop::resources::pod::pod_security_problem(&spec).map_or(Ok(spec), Err)
}

fn parse_resources(value: &str) -> Result<ResourceRequirements, String> {
    const EXAMPLE: &str =
        r#"{"requests":{"cpu":"100m","memory":"128Mi"},"limits":{"memory":"512Mi"}}"#;
    let json: serde_json::Value = serde_json::from_str(value)
        .map_err(|e| format!("not JSON ({e}); give a resources object such as {EXAMPLE}"))?;
    let object = json
        .as_object()
        .ok_or_else(|| format!("not a resources object such as {EXAMPLE}"))?;
    for key in object.keys() {
        if !matches!(key.as_str(), "requests" | "limits" | "claims") {
            return Err(format!(
                "unknown field {key:?} (accepted: requests, limits, claims), e.g. {EXAMPLE}"
            ));
        }
    }
    for part in ["requests", "limits"] {
        let Some(map) = object.get(part) else {
            continue;
        };
        let map = map
            .as_object()
            .ok_or_else(|| format!("{part} must be an object of quantities, e.g. {EXAMPLE}"))?;
        for (resource, quantity) in map {
            let text = quantity
                .as_str()
                .map(String::from)
                .unwrap_or_else(|| quantity.to_string());
            if !is_quantity(&text) {
                return Err(format!(
                    "{part}.{resource}: {quantity} is not a quantity (e.g. 128Mi, 1Gi, 500m, 2)"
                ));
            }
        }
    }
    serde_json::from_value(json)
        .map_err(|e| format!("not a resources object ({e}), e.g. {EXAMPLE}"))
}

/// A non-negative Kubernetes quantity: a decimal number with an optional binary (`Ki`…`Ei`),
/// decimal (`m`, `k`, `M`…`E`) or exponent (`e3`) suffix.
fn is_quantity(text: &str) -> bool {
    let text = text.strip_prefix('+').unwrap_or(text);
    let digits_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(digits_end);
    let mut parts = number.splitn(2, '.');
    let whole = parts.next().unwrap_or("");
    let fraction = parts.next();
    let number_ok = !(whole.is_empty() && fraction.is_none_or(str::is_empty))
        && fraction.is_none_or(|f| !f.contains('.'));
    let suffix_ok = match suffix {
        "" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" | "m" | "k" | "M" | "G" | "T" | "P" | "E" => {
            true
        }
        _ => suffix
            .strip_prefix(['e', 'E'])
            .map(|exp| exp.strip_prefix(['+', '-']).unwrap_or(exp))
            .is_some_and(|exp| !exp.is_empty() && exp.chars().all(|c| c.is_ascii_digit())),
    };
    number_ok && suffix_ok
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

    fn parse(args: &[&str]) -> Result<RunArgs, String> {
        let mut all = vec!["dbop", "run"];
        all.extend(args);
        match Cli::try_parse_from(all) {
            Ok(Cli {
                command: Command::Run(args),
            }) => Ok(*args),
            Ok(_) => panic!("not run"),
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn a_negative_api_qps_is_refused_by_name_in_both_spellings() {
        for args in [&["--api-qps", "-1"][..], &["--api-qps=-1"]] {
            let error = parse(args).err().expect("refused");
            assert!(error.contains("--api-qps"), "{error}");
            assert!(error.contains("0 (no limit) or positive"), "{error}");
            assert!(!error.contains("unexpected argument"), "{error}");
        }
        let error = parse(&["--api-qps", "fast"]).err().unwrap();
        assert!(
            error.contains("--api-qps") && error.contains("not a number"),
            "{error}"
        );
        assert_eq!(parse(&["--api-qps", "0"]).ok().unwrap().api_qps, 0.0);
    }

    #[test]
    fn job_resources_with_a_bad_quantity_or_field_are_refused_naming_both() {
        let error = parse(&["--job-resources", r#"{"requests":{"memory":"lots"}}"#])
            .err()
            .expect("refused");
        assert!(error.contains("--job-resources"), "{error}");
        assert!(
            error.contains("requests.memory") && error.contains("lots"),
            "{error}"
        );
        let error = parse(&["--job-resources", r#"{"request":{"memory":"1Gi"}}"#])
            .err()
            .unwrap();
        assert!(error.contains("unknown field \"request\""), "{error}");
        let error = parse(&["--job-resources", "{bad"]).err().unwrap();
        assert!(error.contains("not JSON"), "{error}");
        let ok = parse(&[
            "--job-resources",
            r#"{"requests":{"cpu":"100m","memory":"128Mi"},"limits":{"memory":"0.5Gi"}}"#,
        ])
        .ok()
        .unwrap();
        let r = ok.job_resources.unwrap();
        assert_eq!(r.requests.unwrap()["cpu"].0, "100m");
        let error = parse(&["--database-resources", r#"{"limits":{"cpu":"x"}}"#])
            .err()
            .unwrap();
        assert!(
            error.contains("--database-resources") && error.contains("limits.cpu"),
            "{error}"
        );
    }

    #[test]
    fn quantities_follow_the_kubernetes_grammar() {
        for good in [
            "1", "100m", "0.5", ".5", "5.", "128Mi", "1Gi", "2k", "1e3", "1E-2", "+1",
        ] {
            assert!(is_quantity(good), "{good}");
        }
        for bad in ["", "lots", "-1", "1mi", "1.2.3", "Mi", "1e", "1 Gi", "1Gib"] {
            assert!(!is_quantity(bad), "{bad}");
        }
    }

    #[test]
    fn bad_namespaces_addresses_images_and_lease_names_are_refused_while_parsing() {
        for (args, flag) in [
            (
                &["--watch-namespaces", "apps,Bad_NS"][..],
                "--watch-namespaces",
            ),
            (&["--namespace", "Bad"], "--namespace"),
            (
                &["--leader-elect-namespace", "Bad.ns"],
                "--leader-elect-namespace",
            ),
            (&["--metrics-addr", "localhost"], "--metrics-addr"),
            (&["--agent-image", ""], "--agent-image"),
            (
                &["--image-pull-secrets", "ok,Not_A_Secret"],
                "--image-pull-secrets",
            ),
            (
                &["--leader-elect-lease-name", "My_Lease"],
                "--leader-elect-lease-name",
            ),
        ] {
            let error = parse(args)
                .err()
                .unwrap_or_else(|| panic!("{args:?} accepted"));
            assert!(error.contains(flag), "{args:?}: {error}");
        }
        let ok = parse(&["--metrics-addr", ":9090"]).ok().unwrap();
        assert_eq!(ok.metrics_addr, "0.0.0.0:9090".parse().unwrap());
    }

    #[test]
    fn the_lease_timing_is_checked_before_any_client_exists() {
        let args = parse(&[
            "--leader-elect",
            "--leader-elect-lease-duration",
            "15",
            "--leader-elect-renew-grace",
            "20",
        ])
        .ok()
        .unwrap();
        let error = check(&args).err().expect("refused");
        assert!(error.contains("--leader-elect-renew-grace"), "{error}");
        let args = parse(&["--api-burst", "0"]).ok().unwrap();
        assert!(check(&args).err().unwrap().contains("--api-burst"));
        assert!(check(&parse(&[]).ok().unwrap()).is_ok());
    }

    #[test]
    fn dbop_has_a_version() {
        let error = Cli::try_parse_from(["dbop", "--version"]).err().unwrap();
        assert_eq!(error.kind(), clap::error::ErrorKind::DisplayVersion);
        assert!(error.to_string().contains(env!("CARGO_PKG_VERSION")));
    }
}
