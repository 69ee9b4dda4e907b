//! The `dbop` binary: `dbop run` starts the controller, `dbop crd` prints the CRDs.

use clap::{Parser, Subcommand};
use dbop::resources::Settings;
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
    Run {
        /// Watch only this namespace (default: all namespaces).
        #[arg(long, env = "DBOP_NAMESPACE")]
        namespace: Option<String>,
        /// The PostgreSQL image of a version: `{version}` becomes the Database's `MAJOR.MINOR`
        /// (a value without `{version}` is a repository, tagged with the version). A Database's
        /// `spec.image` overrides it.
        #[arg(
            long,
            env = "DBOP_POSTGRES_IMAGE_TEMPLATE",
            default_value = dbop::resources::DEFAULT_POSTGRES_IMAGE_TEMPLATE
        )]
        postgres_image_template: String,
        /// dbop's own image, holding the static `dbop-instance` and `dbop-backup` at
        /// `/usr/local/bin`: database and backup pods copy them from it with an init container.
        #[arg(long, env = "DBOP_AGENT_IMAGE", default_value = dbop::resources::DEFAULT_AGENT_IMAGE)]
        agent_image: String,
        /// Pull secrets (comma-separated names, in each Database's namespace) for the pods dbop
        /// creates.
        #[arg(long, env = "DBOP_IMAGE_PULL_SECRETS", value_delimiter = ',')]
        image_pull_secrets: Vec<String>,
        /// Resources of the init and backup Jobs' containers, as JSON
        /// (`{"requests":{"cpu":"100m","memory":"128Mi"},"limits":{"memory":"512Mi"}}`).
        #[arg(long, env = "DBOP_JOB_RESOURCES")]
        job_resources: Option<String>,
        /// Log format.
        #[arg(long, env = "DBOP_LOG_FORMAT", value_enum, default_value = "text")]
        log_format: LogFormat,
    },
    /// Print the CustomResourceDefinitions as YAML.
    Crd,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => match dbop::api::crds_yaml() {
            Ok(yaml) => {
                print!("{yaml}");
                std::process::ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("dbop: cannot render the CRDs: {error}");
                std::process::ExitCode::FAILURE
            }
        },
        Command::Run {
            namespace,
            postgres_image_template,
            agent_image,
            image_pull_secrets,
            job_resources,
            log_format,
        } => {
            telemetry::init(log_format);
            let job_resources = match job_resources.as_deref().map(serde_json::from_str) {
                None => dbop::resources::pod::default_job_resources(),
                Some(Ok(resources)) => resources,
                Some(Err(error)) => {
                    tracing::error!(%error, "--job-resources (DBOP_JOB_RESOURCES) is not a resources object such as {{\"requests\":{{\"memory\":\"128Mi\"}}}}");
                    return std::process::ExitCode::FAILURE;
                }
            };
            let client = match dbop::client().await {
                Ok(client) => client,
                Err(error) => {
                    tracing::error!(%error, "cannot reach the Kubernetes API: set KUBECONFIG or run in a cluster");
                    return std::process::ExitCode::FAILURE;
                }
            };
            let settings = Settings {
                postgres_image_template,
                agent_image,
                image_pull_secrets: image_pull_secrets
                    .into_iter()
                    .filter(|s| !s.is_empty())
                    .collect(),
                job_resources,
            };
            dbop::controller::run(client, settings, namespace).await;
            std::process::ExitCode::SUCCESS
        }
    }
}
