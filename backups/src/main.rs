//! `dbop-backup`: parses the command line, sets up logging on stderr, runs one operation and
//! prints its result summary (one JSON line) on stdout and into `--result-file`.

use std::process::ExitCode;

use clap::Parser;
use dbop_backup::cli::{Cli, Command, LogFormat};
use dbop_backup::run;
use dbop_backup::signals::Interrupt;
use tracing_subscriber::EnvFilter;

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_env("DBOP_BACKUP_LOG").unwrap_or_else(|_| {
        EnvFilter::new("info,aws_config=warn,aws_smithy_runtime=warn,aws_sdk_s3=warn,hyper=warn")
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::try_parse().unwrap_or_else(|e| exit_for_bad_flags(e));
    init_logging(cli.log_format);
    let result_file = match &cli.command {
        Command::Dump(a) => a.output.result_file.clone(),
        Command::Restore(a) => a.output.result_file.clone(),
        Command::Verify(a) => a.output.result_file.clone(),
        Command::Prune(a) => a.output.result_file.clone(),
        Command::Recover(a) | Command::VerifyBase(a) => a.output.result_file.clone(),
        Command::BaseBackup(a) => a.output.result_file.clone(),
        Command::List(_) | Command::WalPush(_) | Command::WalFetch(_) | Command::BaseRestore(_) => {
            None
        }
    };
    // The password and user files become libpq's environment before any thread starts.
    let pg = match &cli.command {
        Command::Dump(a) => Some(&a.pg),
        Command::Restore(a) => Some(&a.pg),
        Command::Verify(a) => Some(&a.pg),
        Command::BaseBackup(a) => Some(&a.pg),
        Command::BaseRestore(a) => Some(&a.pg),
        Command::Recover(a) | Command::VerifyBase(a) => Some(&a.restore.pg),
        Command::Prune(_) | Command::List(_) | Command::WalPush(_) | Command::WalFetch(_) => None,
    };
    let setup = |pg: &dbop_backup::cli::PgArgs| {
        dbop_backup::secrets::setup_pg(pg.user_file.as_deref(), pg.password_file.as_deref())
    };
    let _pgpass = match pg.map(setup).transpose() {
        Ok(dir) => dir.flatten(),
        Err(e) => {
            eprintln!("dbop-backup: {e}");
            let output = run::failed_before_start(&cli.command, e);
            return report(&output, result_file.as_deref());
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dbop-backup: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let output = runtime.block_on(async {
        match Interrupt::install() {
            Ok(interrupt) => Some(run::run(cli.command, interrupt).await),
            Err(e) => {
                eprintln!("dbop-backup: cannot install signal handlers: {e}");
                None
            }
        }
    });
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    let Some(output) = output else {
        return ExitCode::from(1);
    };
    report(&output, result_file.as_deref())
}

/// Prints clap's message and exits: with clap's code, except for `wal-fetch`, whose every
/// failure but a missing file must stop PostgreSQL's recovery ([`run::WAL_FETCH_FAILED`]).
fn exit_for_bad_flags(e: clap::Error) -> ! {
    let shown = matches!(
        e.kind(),
        clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
    );
    if shown || !std::env::args().skip(1).any(|a| a == "wal-fetch") {
        e.exit()
    }
    let _ = e.print();
    std::process::exit(run::WAL_FETCH_FAILED)
}

/// Prints the result summary and writes it into the result file; the exit code.
fn report(output: &run::RunOutput, result_file: Option<&std::path::Path>) -> ExitCode {
    if let Some(summary) = &output.summary {
        let line = summary.to_summary_line();
        println!("{line}");
        if let Some(path) = result_file
            && let Err(e) = std::fs::write(path, &line)
        {
            eprintln!(
                "dbop-backup: cannot write the result file {}: {e}",
                path.display()
            );
        }
    }
    ExitCode::from(u8::try_from(output.exit_code).unwrap_or(1))
}
