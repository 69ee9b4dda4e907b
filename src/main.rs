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
        /// Where PostgreSQL images come from; the tag is the Database's version.
        #[arg(
            long,
            env = "DBOP_IMAGE_REPOSITORY",
            default_value = "docker.io/library/postgres"
        )]
        image_repository: String,
        /// The image backup Jobs copy the backup agent (`/usr/local/bin/dbop-backup`) from;
        /// normally the operator's own image.
        #[arg(long, env = "DBOP_AGENT_IMAGE", default_value = dbop::resources::DEFAULT_AGENT_IMAGE)]
        agent_image: String,
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
            image_repository,
            agent_image,
            log_format,
        } => {
            telemetry::init(log_format);
            let client = match dbop::client().await {
                Ok(client) => client,
                Err(error) => {
                    tracing::error!(%error, "cannot reach the Kubernetes API: set KUBECONFIG or run in a cluster");
                    return std::process::ExitCode::FAILURE;
                }
            };
            let settings = Settings {
                image_repository,
                agent_image,
            };
            dbop::controller::run(client, settings, namespace).await;
            std::process::ExitCode::SUCCESS
        }
    }
}
