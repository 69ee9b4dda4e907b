//! `kubectl-dbop`, the kubectl plugin (`kubectl dbop status|list|logs|backup|restore|restart|reload|…`): flags, the
//! client and the exit code; the work is in `dbop::plugin`.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use dbop::api::BackupMethod;
use dbop::plugin::output::{self, Format};
use dbop::plugin::{kubectl, logs, psql, read, render, restore};

#[derive(Parser)]
#[command(
    name = "kubectl-dbop",
    version,
    about = "Inspect and operate dbop Databases"
)]
struct Cli {
    #[command(flatten)]
    target: Target,
    #[command(subcommand)]
    command: Command,
}

/// kubectl's global flags: which kubeconfig, context and namespace.
#[derive(clap::Args)]
struct Target {
    /// The kubeconfig file (default: KUBECONFIG, else ~/.kube/config, as kubectl).
    #[arg(long, global = true, value_name = "FILE")]
    kubeconfig: Option<std::path::PathBuf>,
    /// The kubeconfig context (default: its current context).
    #[arg(long, global = true, value_name = "NAME")]
    context: Option<String>,
    /// The namespace (default: the context's, else `default`).
    #[arg(short = 'n', long, global = true)]
    namespace: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Phase, version, endpoint, conditions, backups and recent Events of a Database.
    Status {
        name: String,
        /// Print the Database and its DatabaseBackups as a List instead of the screen.
        #[arg(short = 'o', long, value_enum)]
        output: Option<Format>,
    },
    /// The Databases: phase, version, ready/instances, primary, age.
    List {
        /// In every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        /// Print the Databases as a List instead of the table.
        #[arg(short = 'o', long, value_enum)]
        output: Option<Format>,
    },
    /// Create an on-demand DatabaseBackup (reason Manual), optionally waiting for it.
    Backup {
        name: String,
        /// A physical base backup (method Physical; needs spec.backup.walArchiving) instead of
        /// a logical dump.
        #[arg(long)]
        physical: bool,
        /// Follow the backup until it succeeded (exit 0) or failed (exit 1).
        #[arg(long)]
        wait: bool,
        /// How long --wait waits (`30s`, `10m`, `1h`).
        #[arg(long, default_value = "10m", value_parser = dbop_contract::units::parse_duration)]
        timeout: Duration,
    },
    /// The primary's (or an instance's, or the operator's) log, through `kubectl logs`.
    Logs {
        name: Option<String>,
        /// The instance (e.g. orders-1); default: the pod labelled dbop.dev/role=primary.
        instance: Option<String>,
        /// The operator's log instead (its leader's when it runs several replicas), found in
        /// the namespace -n names, else in any.
        #[arg(long, conflicts_with_all = ["name", "instance"])]
        operator: bool,
        /// Keep streaming new lines.
        #[arg(short = 'f', long)]
        follow: bool,
        /// Only the last N lines.
        #[arg(long, value_name = "N")]
        tail: Option<u32>,
    },
    /// A rolling restart of the Database's pods, the primary last (after a switchover).
    ///
    /// Sets the annotation dbop.dev/restartedAt, which the operator carries into the pod
    /// template; the StatefulSet then restarts the pods one at a time.
    Restart { name: String },
    /// Make every instance reread its configuration (`SELECT pg_reload_conf()`).
    ///
    /// Runs psql in each pod as `psql` does (local socket, no password).
    Reload { name: String },
    /// Create a new Database that restores a DatabaseBackup.
    ///
    /// NEW_NAME gets spec.bootstrap.fromBackup, and the source Database's version and storage
    /// unless overridden. An existing Database is never overwritten.
    Restore {
        name: String,
        /// The DatabaseBackup to restore (of Database NAME).
        #[arg(long, value_name = "BACKUP")]
        from_backup: String,
        /// The new Database's name.
        #[arg(long, value_name = "NEW_NAME")]
        to: String,
        /// The new Database's version (default: the source's).
        #[arg(long)]
        version: Option<String>,
        /// The new Database's volume size (default: the source's).
        #[arg(long, value_name = "QUANTITY")]
        storage_size: Option<String>,
        /// The new Database's StorageClass (default: the source's).
        #[arg(long, value_name = "CLASS")]
        storage_class: Option<String>,
        /// Print the Database as YAML and create nothing.
        #[arg(long)]
        dry_run: bool,
        /// Do not ask for confirmation (it is asked only when stdin is a terminal).
        #[arg(short = 'y', long)]
        yes: bool,
    },
    /// Make INSTANCE (a ready standby, e.g. orders-2) the primary: a switchover.
    ///
    /// The old primary
    /// stops after sending its standbys all of its WAL; no commit is lost. The operator answers
    /// with an Event (Switchover or PromoteRefused); `status` shows the new primary.
    Promote { name: String, instance: String },
    /// Run psql in the Database's primary as its superuser.
    ///
    /// Peer authentication on the local socket; no password is used. Arguments after `--` go
    /// to psql.
    Psql {
        name: String,
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Collect a support bundle of the Database (no Secret values).
    ///
    /// Its YAML and its DatabaseBackups', the StatefulSet, pods, claims, Services, Jobs,
    /// ConfigMaps, Events and the pods' logs; Secrets by name and keys only, never their values.
    Report {
        name: String,
        /// A directory, or a file ending in .tar.gz/.tgz (default:
        /// dbop-report-NS-NAME-TIME.tar.gz); never an existing path.
        #[arg(short = 'o', long, value_name = "DIR|FILE.tar.gz")]
        output: Option<std::path::PathBuf>,
    },
    /// Print a shell completion script for `kubectl-dbop`.
    ///
    /// bash, zsh, fish, elvish or powershell; needs no cluster:
    /// `source <(kubectl-dbop completion bash)`.
    Completion { shell: clap_complete::Shell },
}

#[tokio::main]
async fn main() -> ExitCode {
    if let Some(words) = completion_request(std::env::args().collect()) {
        return complete(&words).await;
    }
    let cli = parse();
    if let Command::Completion { shell } = cli.command {
        print!("{}", completion(shell));
        return ExitCode::SUCCESS;
    }
    let global = kubectl::Global {
        kubeconfig: (cli.target.kubeconfig.as_ref()).map(|p| p.display().to_string()),
        context: cli.target.context.clone(),
    };
    let explicit_namespace = cli.target.namespace.clone();
    let (client, namespace) = match connect(cli.target).await {
        Ok(found) => found,
        Err(message) => return fail(&message),
    };
    let result = run(
        &client,
        &global,
        &namespace,
        explicit_namespace,
        cli.command,
    )
    .await;
    result.unwrap_or_else(|message| fail(&message))
}

/// Runs one command (completion is answered before connecting) in `namespace`;
/// `explicit_namespace` is the one `--namespace` gave (the operator's, for `logs --operator`).
async fn run(
    client: &kube::Client,
    global: &kubectl::Global,
    namespace: &str,
    explicit_namespace: Option<String>,
    command: Command,
) -> Result<ExitCode, String> {
    match command {
        Command::Status { name, output } => status(client, namespace, &name, output).await,
        Command::List {
            all_namespaces,
            output,
        } => list(client, (!all_namespaces).then_some(namespace), output).await,
        Command::Backup {
            name,
            physical,
            wait,
            timeout,
        } => {
            let method = match physical {
                true => BackupMethod::Physical,
                false => BackupMethod::Logical,
            };
            backup(client, namespace, &name, method, wait.then_some(timeout)).await
        }
        Command::Restart { name } => restart(client, namespace, &name).await,
        Command::Reload { name } => reload(client, global, namespace, &name).await,
        Command::Restore {
            name,
            from_backup,
            to,
            version,
            storage_size,
            storage_class,
            dry_run,
            yes,
        } => {
            let overrides = restore::Overrides {
                version,
                storage_size,
                storage_class,
            };
            let request = RestoreRequest {
                source: &name,
                backup: &from_backup,
                to: &to,
                overrides: &overrides,
                dry_run,
                yes,
            };
            restore(client, namespace, request).await
        }
        Command::Report { name, output } => report(client, namespace, &name, output).await,
        Command::Completion { .. } => unreachable!("answered before connecting"),
        Command::Psql { name, args } => psql(client, global, namespace, &name, &args).await,
        Command::Logs {
            name,
            instance,
            operator,
            follow,
            tail,
        } => {
            let pick = match (operator, name) {
                (true, _) => LogsOf::Operator {
                    operator_ns: explicit_namespace.clone(),
                },
                (false, Some(name)) => LogsOf::Instance(name, instance),
                (false, None) => return Err("logs needs a Database NAME, or --operator".into()),
            };
            logs(client, global, namespace, pick, follow, tail).await
        }
        Command::Promote { name, instance } => promote(client, namespace, &name, &instance).await,
    }
}

/// The flags, with usage lines that say `kubectl dbop` (only there: a bin name with a space
/// breaks clap's bash completion script).
fn parse() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    let matches = Cli::command().bin_name("kubectl dbop").get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// The completion script of the shell, for the binary `kubectl-dbop`.
fn completion(shell: clap_complete::Shell) -> String {
    use clap::CommandFactory;
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "kubectl-dbop", &mut out);
    let script = String::from_utf8_lossy(&out).into_owned();
    // clap_complete's bash script spells a hyphenated bin name's subcommand states two ways
    // (`kubectl__dbop__subcmd__list` when walking the words, `kubectl__subcmd__dbop__…` in the
    // arms), so no subcommand's flags complete (clap-rs/clap#6421); the arms take the first.
    match shell {
        clap_complete::Shell::Bash => script.replace("kubectl__subcmd__dbop", "kubectl__dbop"),
        _ => script,
    }
}

/// The words to complete when kubectl's completion runs this binary: as
/// `kubectl_complete-dbop WORDS…` (a link to it by that name), or as `kubectl-dbop __complete
/// WORDS…` (what that name's script runs).
fn completion_request(args: Vec<String>) -> Option<Vec<String>> {
    let mut args = args.into_iter();
    let invoked_as = args.next().unwrap_or_default();
    let base = std::path::Path::new(&invoked_as)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if base == "kubectl_complete-dbop" {
        return Some(args.collect());
    }
    let mut rest = args.peekable();
    if rest.peek().map(String::as_str) == Some("__complete") {
        rest.next();
        return Some(rest.collect());
    }
    None
}

/// Prints the words for kubectl's completion; Database names come from the cluster the words
/// choose. A cluster that cannot be reached offers no name and prints nothing else: completion
/// never writes an error into the user's command line.
async fn complete(words: &[String]) -> ExitCode {
    use clap::CommandFactory;
    use dbop::plugin::complete::{NO_FILE_COMPLETION, Offer, matching, offer, protocol_lines};
    let (words, directive) = match offer(&Cli::command(), words) {
        Offer::Words(words, directive) => (words, directive),
        Offer::DatabaseNames { prefix, target } => {
            let target = Target {
                kubeconfig: target.kubeconfig.map(Into::into),
                context: target.context,
                namespace: target.namespace,
            };
            let names = async {
                let (client, namespace) = connect(target).await.ok()?;
                let databases = read::databases(&client, Some(&namespace)).await.ok()?;
                Some(
                    databases
                        .into_iter()
                        .map(|db| db.metadata.name.unwrap_or_default()),
                )
            };
            // A cluster that does not answer must not hang the user's shell.
            let names = tokio::time::timeout(Duration::from_secs(5), names)
                .await
                .ok()
                .flatten()
                .into_iter()
                .flatten();
            (matching(names, &prefix), NO_FILE_COMPLETION)
        }
    };
    print!("{}", protocol_lines(&words, directive));
    ExitCode::SUCCESS
}

fn fail(message: &str) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::FAILURE
}

/// A client from the kubeconfig (as kubectl finds it: `--kubeconfig`, else KUBECONFIG, else
/// ~/.kube/config; `--context`, else the current one) and the namespace to use (`-n`, else the
/// context's).
async fn connect(target: Target) -> Result<(kube::Client, String), String> {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let options = KubeConfigOptions {
        context: target.context.clone(),
        ..KubeConfigOptions::default()
    };
    let cannot = |e: &dyn std::fmt::Display| format!("cannot load the kubeconfig: {e}");
    let mut config = match (&target.kubeconfig, &target.context) {
        (Some(path), _) => {
            let file = Kubeconfig::read_from(path)
                .map_err(|e| format!("cannot read the kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|e| cannot(&e))?
        }
        (None, Some(_)) => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| cannot(&e))?,
        // No flag: in-cluster config too, as kube's client finds it.
        (None, None) => kube::Config::infer()
            .await
            .map_err(|e| format!("cannot load a kubeconfig (set KUBECONFIG): {e}"))?,
    };
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(concat!("kubectl-dbop/", env!("CARGO_PKG_VERSION"))),
    ));
    let namespace = target
        .namespace
        .unwrap_or_else(|| config.default_namespace.clone());
    let client =
        kube::Client::try_from(config).map_err(|e| format!("cannot make a client: {e}"))?;
    Ok((client, namespace))
}

async fn status(
    client: &kube::Client,
    ns: &str,
    name: &str,
    format: Option<Format>,
) -> Result<ExitCode, String> {
    if let Some(format) = format {
        let db = read::database(client, ns, name)
            .await
            .map_err(|e| e.to_string())?;
        let backups = read::backups_of(client, ns, name)
            .await
            .map_err(|e| e.to_string())?;
        print!(
            "{}",
            output::print(&output::status_document(&db, &backups), format)
        );
        return Ok(ExitCode::SUCCESS);
    }
    let view = read::status_view(client, ns, name)
        .await
        .map_err(|e| e.to_string())?;
    print!("{}", render::status_screen(&view, chrono::Utc::now()));
    Ok(ExitCode::SUCCESS)
}

async fn list(
    client: &kube::Client,
    ns: Option<&str>,
    format: Option<Format>,
) -> Result<ExitCode, String> {
    let dbs = read::databases(client, ns)
        .await
        .map_err(|e| e.to_string())?;
    match format {
        Some(format) => {
            let items = dbs.iter().map(output::object).collect();
            print!("{}", output::print(&output::list(items), format));
        }
        None if dbs.is_empty() => match ns {
            Some(ns) => eprintln!("No Databases found in {ns} namespace."),
            None => eprintln!("No Databases found."),
        },
        None => print!(
            "{}",
            output::list_table(&dbs, ns.is_none(), chrono::Utc::now())
        ),
    }
    Ok(ExitCode::SUCCESS)
}

async fn backup(
    client: &kube::Client,
    ns: &str,
    name: &str,
    method: BackupMethod,
    wait: Option<Duration>,
) -> Result<ExitCode, String> {
    read::database(client, ns, name)
        .await
        .map_err(|e| e.to_string())?;
    let created = read::create_backup(client, ns, name, method, chrono::Utc::now())
        .await
        .map_err(|e| e.to_string())?;
    let backup = created.metadata.name.unwrap_or_default();
    println!("databasebackup.dbop.dev/{backup} created");
    let Some(timeout) = wait else {
        return Ok(ExitCode::SUCCESS);
    };
    let done = read::wait_finished(client, ns, &backup, timeout)
        .await
        .map_err(|e| e.to_string())?;
    match render::backup_outcome(&done) {
        Ok(line) => {
            println!("{line}");
            Ok(ExitCode::SUCCESS)
        }
        Err(line) => Err(line),
    }
}

async fn promote(
    client: &kube::Client,
    ns: &str,
    name: &str,
    instance: &str,
) -> Result<ExitCode, String> {
    read::database(client, ns, name)
        .await
        .map_err(|e| e.to_string())?;
    read::request_promotion(client, ns, name, instance)
        .await
        .map_err(|e| e.to_string())?;
    println!(
        "database.dbop.dev/{name}: promotion of {instance} requested; `kubectl dbop status {name}` shows the primary, `kubectl get events --field-selector involvedObject.name={name}` the answer"
    );
    Ok(ExitCode::SUCCESS)
}

async fn restart(client: &kube::Client, ns: &str, name: &str) -> Result<ExitCode, String> {
    read::database(client, ns, name)
        .await
        .map_err(|e| e.to_string())?;
    let now = chrono::Utc::now();
    read::request_restart(client, ns, name, now)
        .await
        .map_err(|e| e.to_string())?;
    println!(
        "database.dbop.dev/{name}: restart requested (dbop.dev/restartedAt={}); the pods restart one at a time, the primary last after a switchover: `kubectl get pods -l app.kubernetes.io/instance={name} -w`",
        now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    );
    Ok(ExitCode::SUCCESS)
}

async fn psql(
    client: &kube::Client,
    global: &kubectl::Global,
    ns: &str,
    name: &str,
    extra: &[String],
) -> Result<ExitCode, String> {
    let (db, user) = superuser_of(client, ns, name).await?;
    let pod = psql::primary_pod(&db);
    let args = psql::exec_args(ns, &pod, &user, std::io::stdin().is_terminal(), extra);
    run_kubectl(global, args)
}

/// The Database and its superuser's name (from the credentials Secret's `username`).
async fn superuser_of(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> Result<(dbop::api::Database, String), String> {
    let db = read::database(client, ns, name)
        .await
        .map_err(|e| e.to_string())?;
    let secret = read::credentials(client, &db)
        .await
        .map_err(|e| e.to_string())?;
    Ok((db, psql::superuser(&secret)))
}

async fn reload(
    client: &kube::Client,
    global: &kubectl::Global,
    ns: &str,
    name: &str,
) -> Result<ExitCode, String> {
    let (db, user) = superuser_of(client, ns, name).await?;
    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into());
    let mut failed = 0;
    for pod in psql::instance_pods(&db) {
        let out = std::process::Command::new(&kubectl)
            .args(global.command(psql::reload_args(ns, &pod, &user)))
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {kubectl}: {e}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if out.status.success() && psql::reloaded(&stdout) {
            println!("{pod}: configuration reloaded");
        } else {
            failed += 1;
            let said = String::from_utf8_lossy(&out.stderr);
            let said = said.trim();
            let said = if said.is_empty() { stdout.trim() } else { said };
            eprintln!("{pod}: reload failed: {said}");
        }
    }
    match failed {
        0 => Ok(ExitCode::SUCCESS),
        n => Err(format!("{n} instance(s) of {ns}/{name} did not reload")),
    }
}

/// What `restore` was asked.
struct RestoreRequest<'a> {
    source: &'a str,
    backup: &'a str,
    to: &'a str,
    overrides: &'a restore::Overrides,
    dry_run: bool,
    yes: bool,
}

async fn restore(
    client: &kube::Client,
    ns: &str,
    request: RestoreRequest<'_>,
) -> Result<ExitCode, String> {
    let text = |e: read::PluginError| e.to_string();
    let source = read::database(client, ns, request.source)
        .await
        .map_err(text)?;
    let backup = read::backup(client, ns, request.backup)
        .await
        .map_err(text)?;
    let db = restore::manifest(&source, &backup, request.to, request.overrides)?;
    if read::database_exists(client, ns, request.to)
        .await
        .map_err(text)?
    {
        return Err(format!(
            "Database {ns}/{} already exists: restore creates a new Database and never overwrites one",
            request.to
        ));
    }
    if request.dry_run {
        print!("{}", output::print(&output::object(&db), Format::Yaml));
        return Ok(ExitCode::SUCCESS);
    }
    print!("Will create {}", restore::summary(&db, &backup));
    if !request.yes && std::io::stdin().is_terminal() {
        print!("Create it? [y/N] ");
        std::io::Write::flush(&mut std::io::stdout()).ok();
        let mut answer = String::new();
        std::io::stdin()
            .read_line(&mut answer)
            .map_err(|e| format!("cannot read the answer: {e}"))?;
        if !restore::confirmed(&answer) {
            println!("Nothing created.");
            return Ok(ExitCode::FAILURE);
        }
    }
    read::create_database(client, &db).await.map_err(text)?;
    println!(
        "database.dbop.dev/{} created; `kubectl dbop status {}` follows the restore",
        request.to, request.to
    );
    Ok(ExitCode::SUCCESS)
}

async fn report(
    client: &kube::Client,
    ns: &str,
    name: &str,
    out: Option<std::path::PathBuf>,
) -> Result<ExitCode, String> {
    let db = read::database(client, ns, name)
        .await
        .map_err(|e| e.to_string())?;
    let now = chrono::Utc::now();
    let out = out.unwrap_or_else(|| dbop::plugin::report::default_output(ns, name, now).into());
    let at = now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let bundle = read::report(client, &db, &at).await;
    let top = format!("dbop-report-{ns}-{name}");
    let written = bundle.write(&out, &top)?;
    println!(
        "wrote {} ({} files{})",
        written.display(),
        bundle.files.len(),
        match bundle.problems.len() {
            0 => String::new(),
            n => format!("; {n} things not collected, listed in README.txt"),
        }
    );
    Ok(ExitCode::SUCCESS)
}

/// Whose log `logs` shows.
enum LogsOf {
    Instance(String, Option<String>),
    /// In the namespace `-n` names, else in any.
    Operator {
        operator_ns: Option<String>,
    },
}

async fn logs(
    client: &kube::Client,
    global: &kubectl::Global,
    ns: &str,
    of: LogsOf,
    follow: bool,
    tail: Option<u32>,
) -> Result<ExitCode, String> {
    let (ns, pod, container) = match of {
        LogsOf::Instance(name, instance) => {
            let db = read::database(client, ns, &name)
                .await
                .map_err(|e| e.to_string())?;
            let pods = read::instance_pods(client, &db)
                .await
                .map_err(|e| e.to_string())?;
            let pod = logs::instance_pod(&db, &pods, instance.as_deref())?;
            (ns.to_string(), pod, logs::INSTANCE_CONTAINER)
        }
        LogsOf::Operator { operator_ns } => {
            let (pods, leases) = read::operator_pods(client, operator_ns.as_deref())
                .await
                .map_err(|e| e.to_string())?;
            let (ns, pod) = logs::operator_pod(&pods, &leases)?;
            (ns, pod, logs::OPERATOR_CONTAINER)
        }
    };
    run_kubectl(global, logs::logs_args(&ns, &pod, container, follow, tail))
}

/// Runs kubectl (`KUBECTL`, else `kubectl` on PATH) with the global flags and `args`; its exit
/// code is the plugin's.
fn run_kubectl(global: &kubectl::Global, args: Vec<String>) -> Result<ExitCode, String> {
    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into());
    let status = std::process::Command::new(&kubectl)
        .args(global.command(args))
        .status()
        .map_err(|e| format!("cannot run {kubectl}: {e}"))?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        None => ExitCode::FAILURE,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flags_are_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn completion_scripts_know_the_commands_and_their_flags() {
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let script = completion(shell);
            // (fish names long flags without their dashes)
            for word in [
                "restore",
                "from-backup",
                "all-namespaces",
                "kubeconfig",
                "context",
            ] {
                assert!(script.contains(word), "{shell}: no {word}");
            }
        }
    }

    /// The krew manifest installs this binary on each platform, from placeholders a release
    /// fills in.
    #[test]
    fn the_krew_manifest_installs_kubectl_dbop() {
        let text = include_str!("../docs/krew/dbop.yaml");
        let manifest: serde_json::Value = serde_norway::from_str(text).unwrap();
        assert_eq!(manifest["kind"], "Plugin");
        assert_eq!(manifest["metadata"]["name"], "dbop");
        let platforms = manifest["spec"]["platforms"].as_array().unwrap();
        assert!(!platforms.is_empty());
        for p in platforms {
            assert_eq!(p["bin"], "kubectl-dbop");
            assert!(p["uri"].as_str().unwrap().contains("vVERSION"), "{p}");
            assert!(p["sha256"].as_str().unwrap().starts_with("SHA256_"), "{p}");
            assert!(
                p["files"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|f| f["from"] == "kubectl-dbop"),
                "{p}"
            );
        }
    }

    /// bash completes a subcommand's flags (what clap-rs/clap#6421 breaks).
    #[test]
    fn bash_completes_a_subcommand_s_flags() {
        let script = completion(clap_complete::Shell::Bash);
        let complete = |words: &str| {
            let words: Vec<&str> = words.split(' ').collect();
            let program = format!(
                "{script}\nCOMP_WORDS=({all}); COMP_CWORD={last}; _kubectl__dbop kubectl-dbop {cur} {prev}; echo \"${{COMPREPLY[@]}}\"",
                all = words.join(" "),
                last = words.len() - 1,
                cur = words[words.len() - 1],
                prev = words[words.len() - 2],
            );
            let out = std::process::Command::new("bash")
                .args(["-c", &program])
                .output()
                .expect("bash");
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        assert_eq!(complete("kubectl-dbop res"), "restart restore");
        assert_eq!(complete("kubectl-dbop restore --fr"), "--from-backup");
        assert_eq!(complete("kubectl-dbop list --all"), "--all-namespaces");
    }
}
