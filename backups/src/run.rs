//! Dispatch: turns parsed arguments into an operation, runs it, and shapes its result summary.
//! Also `list` and `prune`, which only read and delete objects according to `catalog` and
//! `retention`, and `wal-push`/`wal-fetch`, which print no summary: PostgreSQL reads only their
//! exit code. `base-restore` prints the base backup's record as one JSON line; `base-backup`
//! and `recover` print a result summary like `dump` and `restore`.

use chrono::Utc;

use crate::base::{Lsn, Target};
use crate::base_restore::{self, BaseRestoreOptions};
use crate::base_store::{self, BaseBackupOptions};
use crate::catalog::{self, BackupEntry};
use crate::cli::{
    BaseBackupArgs, BaseRestoreArgs, Command, DumpArgs, EncodeArgs, KeyArgs, ListArgs, PgArgs,
    PruneArgs, RecoverArgs, RestoreArgs, RetentionArgs, StorageArgs, VerifyArgs, WalArgs,
    WalFetchArgs, WalPushArgs,
};
use crate::crypto::{Key, KeyRing};
use crate::dump::{self, DumpOptions};
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::pg::PgTools;
use crate::prune::prune_database;
use crate::recover;
use crate::restore::{self, RestoreOptions};
use crate::result::{BackupResult, Operation, Outcome};
use crate::s3::{Encryption, S3Settings, Store};
use crate::signals::Interrupt;
use crate::verify::{self, VerifyOptions};
use crate::wal_store::WalStore;

/// What a run produced: a summary to print (not for `list`) and the exit code.
pub struct RunOutput {
    pub summary: Option<BackupResult>,
    pub exit_code: i32,
}

async fn store_for(args: &StorageArgs) -> Result<(Store, Layout)> {
    let store = Store::connect(&S3Settings {
        bucket: args.bucket.clone(),
        path_style: args.path_style,
        ca_file: args.ca_file.clone(),
        checksums: args.s3_checksums,
        encryption: args.sse.map(|mode| Encryption {
            mode,
            kms_key_id: args.sse_kms_key_id.clone(),
        }),
        static_key: crate::secrets::static_key(
            args.s3_access_key_id_file.as_deref(),
            args.s3_secret_access_key_file.as_deref(),
            args.s3_session_token_file.as_deref(),
        )?,
    })
    .await?;
    Ok((store, Layout::new(&args.prefix)))
}

fn finish(mut result: BackupResult, outcome: Result<()>) -> RunOutput {
    let exit_code = match outcome {
        Ok(()) => {
            result.outcome = Outcome::Succeeded;
            0
        }
        Err(e) => {
            tracing::error!(kind = e.label(), "{e}");
            result.outcome = Outcome::Failed;
            result.message = Some(e.to_string());
            result.failure_kind = Some(e.label().to_string());
            e.exit_code()
        }
    };
    if result.completed_at.is_none() || result.outcome == Outcome::Failed {
        result.completed_at = Some(Utc::now());
    }
    RunOutput {
        summary: Some(result),
        exit_code,
    }
}

/// The operation of a command that reports a result summary.
pub fn operation_of(command: &Command) -> Option<Operation> {
    match command {
        Command::Dump(_) => Some(Operation::Dump),
        Command::Restore(_) => Some(Operation::Restore),
        Command::Verify(_) | Command::VerifyBase(_) => Some(Operation::Verify),
        Command::Prune(_) => Some(Operation::Prune),
        Command::Recover(_) => Some(Operation::Recover),
        Command::BaseBackup(_) => Some(Operation::BaseBackup),
        Command::List(_) | Command::WalPush(_) | Command::WalFetch(_) | Command::BaseRestore(_) => {
            None
        }
    }
}

/// A command that failed before it ran (its user or password file): its failed result, for a
/// command that reports one.
pub fn failed_before_start(command: &Command, e: Error) -> RunOutput {
    match operation_of(command) {
        Some(operation) => finish(BackupResult::new(operation), Err(e)),
        None => RunOutput {
            summary: None,
            exit_code: e.exit_code(),
        },
    }
}

pub async fn run(command: Command, interrupt: Interrupt) -> RunOutput {
    match command {
        Command::Dump(a) => dump_command(&a, &interrupt).await,
        Command::Restore(a) => restore_command(&a, &interrupt).await,
        Command::Verify(a) => verify_command(&a, &interrupt).await,
        Command::Prune(a) => {
            let mut result = BackupResult::new(Operation::Prune);
            result.started_at = Some(Utc::now());
            let outcome = prune_command(&a, &mut result).await;
            finish(result, outcome)
        }
        Command::WalPush(a) => wal_push_command(&a).await,
        Command::WalFetch(a) => wal_fetch_command(&a).await,
        Command::BaseBackup(a) => base_backup_command(&a, &interrupt).await,
        Command::BaseRestore(a) => base_restore_command(&a, &interrupt).await,
        Command::Recover(a) => recover_command(&a, &interrupt).await,
        Command::VerifyBase(a) => verify_base_command(&a, &interrupt).await,
        Command::List(a) => match list_command(&a).await {
            Ok(()) => RunOutput {
                summary: None,
                exit_code: 0,
            },
            Err(e) => {
                eprintln!("dbop-backup list: {e}");
                RunOutput {
                    summary: None,
                    exit_code: e.exit_code(),
                }
            }
        },
    }
}

/// The key ring of `--encryption-key-dir`.
fn key_ring(keys: &KeyArgs) -> Option<KeyRing> {
    keys.encryption_key_dir
        .as_ref()
        .map(|dir| KeyRing { dir: dir.clone() })
}

/// The key new objects are encrypted with (`--encryption-key` of `--encryption-key-dir`),
/// checked before anything is written; `consequence` says what did not happen.
fn write_key(keys: &KeyArgs, encode: &EncodeArgs, consequence: &str) -> Result<Option<Key>> {
    let (Some(ring), Some(name)) = (key_ring(keys), &encode.encryption_key) else {
        return Ok(None);
    };
    ring.get(name).map(Some).map_err(|e| {
        Error::Key(format!(
            "cannot encrypt: {e}; {consequence} (in dbop, spec.backup.encryption names the Secret and its key)"
        ))
    })
}

/// The PostgreSQL client tools of a command.
fn pg_tools(pg: &PgArgs) -> PgTools {
    PgTools {
        bin_dir: pg.pg_bin_dir.clone(),
    }
}

async fn dump_command(a: &DumpArgs, interrupt: &Interrupt) -> RunOutput {
    let mut result = BackupResult::new(Operation::Dump);
    result.started_at = Some(Utc::now());
    let outcome = async {
        let key = write_key(&a.keys, &a.encode, "nothing was dumped")?;
        let (store, layout) = store_for(&a.storage).await?;
        let tools = pg_tools(&a.pg);
        let opts = DumpOptions {
            key,
            compression_level: a.encode.compression_level,
            compression_threads: a.compression_threads,
            part_size: a.part_size as usize,
            concurrency: a.upload_concurrency as usize,
            backup_id: a.backup_id.clone(),
            policy: a.retention.policy(),
            incomplete_grace: a.retention.incomplete_grace,
            jobs: usize::from(a.jobs),
            split_above: a.split_tables_larger_than,
        };
        dump::dump(&store, &layout, &tools, &opts, interrupt, &mut result).await
    }
    .await;
    finish(result, outcome)
}

async fn restore_command(a: &RestoreArgs, interrupt: &Interrupt) -> RunOutput {
    let mut result = BackupResult::new(Operation::Restore);
    let outcome = async {
        let (store, layout) = store_for(&a.storage).await?;
        let tools = pg_tools(&a.pg);
        let opts = RestoreOptions {
            backup: a.backup.clone(),
            source_database: a.source_database.clone(),
            target_database: None,
            no_owner: a.no_owner,
            no_acl: a.no_acl,
            restore_globals: !a.no_globals,
            only_database: a.database.clone(),
            keys: key_ring(&a.keys),
            jobs: usize::from(a.jobs),
        };
        restore::restore(&store, &layout, &tools, &opts, interrupt, &mut result)
            .await
            .map(|_| ())
    }
    .await;
    finish(result, outcome)
}

async fn verify_command(a: &VerifyArgs, interrupt: &Interrupt) -> RunOutput {
    let mut result = BackupResult::new(Operation::Verify);
    let outcome = async {
        let (store, layout) = store_for(&a.storage).await?;
        let tools = pg_tools(&a.pg);
        let opts = VerifyOptions {
            backup: a.backup.clone(),
            source_database: a.source_database.clone(),
            scratch_database: a.scratch_database.clone(),
            keys: key_ring(&a.keys),
            jobs: usize::from(a.jobs),
        };
        verify::verify(&store, &layout, &tools, &opts, interrupt, &mut result).await
    }
    .await;
    finish(result, outcome)
}

async fn list_command(a: &ListArgs) -> Result<()> {
    let (store, layout) = store_for(&a.storage).await?;
    let prefix = match &a.database {
        Some(db) => layout.database_prefix(db),
        None => layout.root(),
    };
    let objects = store.list(&prefix).await?;
    let entries = catalog::group(&layout, &objects);
    if a.json {
        let doc = serde_json::json!({ "bucket": store.bucket, "backups": entries });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        print!("{}", render_table(&entries));
    }
    Ok(())
}

/// A plain text table of backups.
pub fn render_table(entries: &[BackupEntry]) -> String {
    let mut rows = vec![[
        "DATABASE".to_string(),
        "BACKUP ID".to_string(),
        "STATUS".to_string(),
        "SIZE".to_string(),
        "COMPLETED".to_string(),
    ]];
    for e in entries {
        rows.push([
            e.database.clone(),
            e.backup_id.clone(),
            if e.complete { "complete" } else { "incomplete" }.to_string(),
            e.size_bytes.map_or("-".into(), |s| s.to_string()),
            crate::result::format_time(&e.completed_at),
        ]);
    }
    let widths: Vec<usize> = (0..5)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// `--database`, else PGDATABASE, checked to fit in a key.
fn database_or_env(flag: Option<&str>, purpose: &str) -> Result<String> {
    let database = flag
        .map(str::to_string)
        .or_else(|| std::env::var("PGDATABASE").ok().filter(|d| !d.is_empty()))
        .ok_or_else(|| {
            Error::Usage(format!(
                "--database or PGDATABASE must name the database {purpose}"
            ))
        })?;
    crate::layout::validate_database_name(&database).map_err(Error::Usage)?;
    Ok(database)
}

/// `wal-fetch`'s exit code when the archive has no such file (PostgreSQL asks for files that
/// do not exist, such as the next timeline's history: that is no failure).
pub const WAL_NOT_FOUND: i32 = 3;

/// `wal-fetch`'s exit code when it fails for any reason but the file's absence (S3 down or
/// refusing, a damaged or undecryptable object, a bad flag). PostgreSQL takes an exit code of
/// 125 or less from `restore_command` as "no such file" and ends recovery there, promoting
/// without every commit after it; above 125 it stops recovery instead, and a stopped recovery
/// can be run again.
pub const WAL_FETCH_FAILED: i32 = 200;

/// `wal-fetch`'s exit code for a WAL command's: found, missing and a shutdown's SIGTERM (which
/// PostgreSQL recognises) unchanged, every other failure [`WAL_FETCH_FAILED`].
pub fn wal_fetch_exit_code(code: i32) -> i32 {
    match code {
        0 | WAL_NOT_FOUND | 143 => code,
        _ => WAL_FETCH_FAILED,
    }
}

/// The WAL store of a `wal-push` or `wal-fetch`, with the key it writes with.
async fn wal_store(a: &WalArgs, key: Option<Key>, level: i32) -> Result<WalStore> {
    let database = database_or_env(a.database.as_deref(), "whose WAL this is")?;
    let ring = key_ring(&a.keys);
    let (store, layout) = store_for(&a.storage).await?;
    Ok(WalStore {
        store,
        layout,
        database,
        key,
        ring,
        compression_level: level,
        deadline: a.wal_deadline,
    })
}

/// The exit code of a WAL command, its failure logged (a missing file only at debug).
fn wal_exit(outcome: Result<bool>, name: &str) -> RunOutput {
    let exit_code = match outcome {
        Ok(true) => 0,
        Ok(false) => {
            tracing::debug!(file = name, "not in the archive");
            WAL_NOT_FOUND
        }
        Err(e) => {
            tracing::error!(kind = e.label(), file = name, "{e}");
            e.exit_code()
        }
    };
    RunOutput {
        summary: None,
        exit_code,
    }
}

async fn wal_push_command(a: &WalPushArgs) -> RunOutput {
    let outcome = async {
        let key = write_key(&a.wal.keys, &a.encode, "nothing was archived")?;
        let ws = wal_store(&a.wal, key, a.encode.compression_level).await?;
        let spool = a.wal_spool_dir.as_deref();
        ws.push(&a.path, &a.file_name, a.wal_parallel.into(), spool)
            .await
            .map(|_| true)
    }
    .await;
    wal_exit(outcome, &a.file_name)
}

async fn wal_fetch_command(a: &WalFetchArgs) -> RunOutput {
    let outcome = async {
        let ws = wal_store(&a.wal, None, 1).await?;
        ws.fetch(&a.file_name, &a.path).await
    }
    .await;
    let mut output = wal_exit(outcome, &a.file_name);
    output.exit_code = wal_fetch_exit_code(output.exit_code);
    output
}

/// The exit code of a base backup command; its record as one JSON line on stdout.
fn base_exit(outcome: Result<crate::base::BaseRecord>, what: &str) -> RunOutput {
    let exit_code = match outcome {
        Ok(record) => {
            println!("{}", serde_json::to_string(&record).unwrap_or_default());
            0
        }
        Err(e) => {
            tracing::error!(kind = e.label(), "{what}: {e}");
            e.exit_code()
        }
    };
    RunOutput {
        summary: None,
        exit_code,
    }
}

/// A base backup's result: what the operator reads of it (the same whether this run took it
/// or found it complete).
pub fn base_backup_result(
    result: &mut BackupResult,
    done: &base_store::BaseBackupDone,
    tar_key: String,
) {
    let r = &done.record;
    result.backup_id = Some(r.backup_id.clone());
    result.database = Some(r.database.clone());
    result.key = Some(tar_key);
    result.size_bytes = Some(r.size_bytes);
    result.raw_bytes = Some(r.raw_bytes);
    result.sha256 = Some(r.sha256.clone());
    result.engine_version = Some(r.engine_version.clone());
    result.started_at = Some(r.start_time);
    result.completed_at = Some(r.stop_time);
    result.message = Some(crate::base::summary(r, done.taken_now));
}

async fn base_backup_command(a: &BaseBackupArgs, interrupt: &Interrupt) -> RunOutput {
    let mut result = BackupResult::new(Operation::BaseBackup);
    result.started_at = Some(Utc::now());
    result.backup_id = a.backup_id.clone();
    result.bucket = Some(a.storage.bucket.clone());
    let outcome = async {
        let database = database_or_env(a.database.as_deref(), "whose base backups these are")?;
        result.database = Some(database.clone());
        let key = write_key(&a.keys, &a.encode, "no base backup was taken")?;
        let (store, layout) = store_for(&a.storage).await?;
        let opts = BaseBackupOptions {
            database,
            backup_id: a.backup_id.clone(),
            key,
            compression_level: a.encode.compression_level,
            compression_threads: a.compression_threads,
            part_size: a.part_size as usize,
            concurrency: a.upload_concurrency as usize,
            fast_checkpoint: a.fast_checkpoint,
            manifest_checksums: a.manifest_checksums.clone(),
            direct: a.base_client == "auto",
        };
        let done =
            base_store::base_backup(&store, &layout, &pg_tools(&a.pg), &opts, interrupt).await?;
        let tar_key = crate::base::tar_key(&layout, &opts.database, &done.record.backup_id);
        base_backup_result(&mut result, &done, tar_key);
        let just_taken = (opts.database.as_str(), done.record.backup_id.as_str());
        if let Some(pruned) = prune_after_base(&store, &layout, &a.retention, just_taken).await {
            let message = result.message.take().unwrap_or_default();
            result.message = Some(format!("{message}; {pruned}"));
        }
        Ok(())
    }
    .await;
    finish(result, outcome)
}

/// Applies `--keep-last`/`--max-age` to base backups and WAL after a successful base backup;
/// a failed prune is reported in the message, never fails the backup.
async fn prune_after_base(
    store: &Store,
    layout: &Layout,
    retention: &RetentionArgs,
    (database, backup_id): (&str, &str),
) -> Option<String> {
    let policy = retention.policy();
    if policy.is_empty() {
        return None;
    }
    let grace = retention.incomplete_grace;
    let pruned =
        crate::base_prune::prune_base(store, layout, database, (policy, grace), backup_id).await;
    Some(crate::prune::after_backup_message(pruned, "base backup"))
}

/// The target of `--target-time`/`--target-lsn`/`--target-name` (none: the latest).
fn restore_target(a: &BaseRestoreArgs) -> Result<Target> {
    Ok(match (&a.target_time, &a.target_lsn, &a.target_name) {
        (Some(t), _, _) => Target::Time(*t),
        (_, Some(l), _) => Target::Lsn(Lsn::parse(l).map_err(Error::Usage)?),
        (_, _, Some(n)) => Target::Name(n.clone()),
        _ => Target::Latest,
    })
}

/// The flags `wal-fetch` needs to find the same WAL: names and file paths, never a secret.
/// The endpoint and region come from PostgreSQL's environment (`AWS_*`), as for `wal-push`.
fn wal_fetch_flags(a: &BaseRestoreArgs, database: &str) -> Vec<(String, Option<String>)> {
    let s = &a.storage;
    let path = |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.display().to_string());
    let mut flags = vec![
        ("--bucket", Some(s.bucket.clone())),
        ("--prefix", Some(s.prefix.clone())),
        ("--database", Some(database.to_string())),
        (
            "--s3-checksums",
            clap::ValueEnum::to_possible_value(&s.s3_checksums).map(|v| v.get_name().to_string()),
        ),
    ];
    if s.path_style {
        flags.push(("--path-style", None));
    }
    for (flag, value) in [
        ("--ca-file", path(&s.ca_file)),
        ("--s3-access-key-id-file", path(&s.s3_access_key_id_file)),
        (
            "--s3-secret-access-key-file",
            path(&s.s3_secret_access_key_file),
        ),
        ("--s3-session-token-file", path(&s.s3_session_token_file)),
        ("--encryption-key-dir", path(&a.keys.encryption_key_dir)),
    ] {
        if value.is_some() {
            flags.push((flag, value));
        }
    }
    flags.into_iter().map(|(f, v)| (f.to_string(), v)).collect()
}

/// The store and options of a `base-restore` or `recover`.
async fn base_restore_setup(a: &BaseRestoreArgs) -> Result<(Store, Layout, BaseRestoreOptions)> {
    let database = database_or_env(a.database.as_deref(), "whose base backups these are")?;
    let target = restore_target(a)?;
    let agent = match &a.agent_path {
        Some(p) => p.clone(),
        None => std::env::current_exe().map_err(|e| Error::io("cannot find this executable", e))?,
    };
    let restore_command =
        crate::base::restore_command(&agent.display().to_string(), &wal_fetch_flags(a, &database));
    let (store, layout) = store_for(&a.storage).await?;
    let opts = BaseRestoreOptions {
        database,
        backup_id: a.backup_id.clone(),
        target,
        data_dir: a.data_dir.clone(),
        keys: key_ring(&a.keys),
        restore_command,
    };
    Ok((store, layout, opts))
}

async fn base_restore_command(a: &BaseRestoreArgs, interrupt: &Interrupt) -> RunOutput {
    let outcome = async {
        let (store, layout, opts) = base_restore_setup(a).await?;
        base_restore::base_restore(&store, &layout, &pg_tools(&a.pg), &opts, interrupt).await
    }
    .await;
    base_exit(outcome, "base restore failed")
}

/// `recover`: a finished data directory is reported again before anything else is read.
async fn recover_command(a: &RecoverArgs, interrupt: &Interrupt) -> RunOutput {
    let mut result = BackupResult::new(Operation::Recover);
    result.started_at = Some(Utc::now());
    let outcome = async {
        if let Some(done) = recover::finished(&a.restore.data_dir)? {
            tracing::info!(data_dir = %a.restore.data_dir.display(), "the recovery is finished already");
            result = done;
            return Ok(());
        }
        let (store, layout, opts) = base_restore_setup(&a.restore).await?;
        result.database = Some(opts.database.clone());
        result.bucket = Some(store.bucket.clone());
        let tools = pg_tools(&a.restore.pg);
        recover::recover(&store, &layout, &tools, &opts, interrupt, &mut result).await
    }
    .await;
    finish(result, outcome)
}

/// `verify-base`: a recovery into a scratch directory, checked and read, then deleted.
async fn verify_base_command(a: &RecoverArgs, interrupt: &Interrupt) -> RunOutput {
    let mut result = BackupResult::new(Operation::Verify);
    result.started_at = Some(Utc::now());
    let outcome = async {
        let (store, layout, opts) = base_restore_setup(&a.restore).await?;
        if !matches!(opts.target, crate::base::Target::Latest) {
            return Err(Error::Usage(
                "verify-base recovers to the latest point: drop the target flag".into(),
            ));
        }
        result.database = Some(opts.database.clone());
        result.bucket = Some(store.bucket.clone());
        let tools = pg_tools(&a.restore.pg);
        crate::verify_base::verify_base(&store, &layout, &tools, &opts, interrupt, &mut result)
            .await
    }
    .await;
    finish(result, outcome)
}

async fn prune_command(a: &PruneArgs, result: &mut BackupResult) -> Result<()> {
    let policy = a.retention.policy();
    let database = database_or_env(a.database.as_deref(), "to prune")?;
    result.database = Some(database.clone());
    if policy.is_empty() {
        return Err(Error::Usage(
            "prune needs --keep-last and/or --max-age".into(),
        ));
    }
    let (store, layout) = store_for(&a.storage).await?;
    result.bucket = Some(store.bucket.clone());
    let report = prune_database(
        &store,
        &layout,
        &database,
        policy,
        a.retention.incomplete_grace,
        a.dry_run,
    )
    .await?;
    result.message = Some(report.to_string());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn record(id: &str) -> crate::base::BaseRecord {
        let t = Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 0).unwrap();
        crate::base::BaseRecord {
            record_version: 1,
            backup_id: id.into(),
            database: "physical".into(),
            start_lsn: Lsn(0x2000028),
            start_wal_file: None,
            stop_lsn: Lsn(0x2000100),
            timeline: 1,
            start_time: t,
            stop_time: t + chrono::Duration::seconds(3),
            backup_from: "standby".into(),
            raw_bytes: 100,
            size_bytes: 10,
            sha256: "ab".repeat(32),
            files: 7,
            engine_version: "15.10".into(),
            system_identifier: "1".into(),
            compression: "zstd".into(),
            agent_version: "0".into(),
            encryption: None,
            manifest: None,
        }
    }

    #[test]
    fn a_base_backup_result_is_the_same_whether_taken_now_or_before() {
        let results: Vec<BackupResult> = [true, false]
            .into_iter()
            .map(|taken_now| {
                let done = base_store::BaseBackupDone {
                    record: record("b1"),
                    taken_now,
                };
                let mut result = BackupResult::new(Operation::BaseBackup);
                base_backup_result(&mut result, &done, "k/base.tar.zst".into());
                finish(result, Ok(())).summary.unwrap()
            })
            .collect();
        let r = &results[0];
        assert_eq!(r.outcome, Outcome::Succeeded);
        assert_eq!(
            (
                r.backup_id.as_deref(),
                r.key.as_deref(),
                r.size_bytes,
                r.raw_bytes
            ),
            (Some("b1"), Some("k/base.tar.zst"), Some(10), Some(100))
        );
        assert_eq!(r.completed_at, Some(record("b1").stop_time));
        let m = r.message.as_deref().unwrap();
        assert!(
            m.contains("0/2000028") && m.contains("0/2000100") && m.contains("timeline 1"),
            "{m}"
        );
        let again = &results[1];
        assert!(
            again
                .message
                .as_deref()
                .unwrap()
                .contains("already complete")
        );
        assert_eq!(
            BackupResult {
                message: None,
                ..again.clone()
            },
            BackupResult {
                message: None,
                ..r.clone()
            }
        );
    }

    #[test]
    fn wal_fetch_stops_recovery_on_every_failure_but_a_missing_file() {
        let exit = |outcome: Result<bool>| {
            wal_fetch_exit_code(wal_exit(outcome, "000000010000000000000001").exit_code)
        };
        assert_eq!(exit(Ok(true)), 0);
        assert_eq!(exit(Ok(false)), WAL_NOT_FOUND);
        assert_eq!(exit(Err(Error::Interrupted("SIGTERM"))), 143);
        let failures = [
            Error::Usage("--bucket is missing".into()),
            Error::Interrupted("SIGINT"),
            Error::io("cannot write", std::io::Error::other("disk full")),
            Error::Integrity {
                key: "k".into(),
                detail: "sha256 differs".into(),
            },
        ];
        for failure in failures {
            let label = failure.to_string();
            let code = exit(Err(failure));
            assert!(code > 125 && code < 256, "{label}: {code}");
        }
    }

    #[test]
    fn a_failure_before_the_run_is_reported_for_commands_with_a_result() {
        use clap::Parser;
        let parse = |args: &[&str]| crate::cli::Cli::try_parse_from(args).unwrap().command;
        let base = parse(&["dbop-backup", "base-backup", "--bucket", "b"]);
        let out = failed_before_start(&base, Error::Usage("--password-file: bad".into()));
        let r = out.summary.unwrap();
        assert_eq!(
            (
                r.outcome,
                r.operation,
                r.failure_kind.as_deref(),
                out.exit_code
            ),
            (Outcome::Failed, Operation::BaseBackup, Some("usage"), 2)
        );
        let fetch = parse(&["dbop-backup", "wal-fetch", "f", "p", "--bucket", "b"]);
        let out = failed_before_start(&fetch, Error::Usage("x".into()));
        assert!(out.summary.is_none());
    }

    #[test]
    fn table_renders_aligned() {
        let t = Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 0).unwrap();
        let e = |id: &str, complete| BackupEntry {
            database: "app".into(),
            backup_id: id.into(),
            complete,
            size_bytes: complete.then_some(42),
            completed_at: t,
            keys: vec![],
        };
        let out = render_table(&[e("20250101T000000Z", true), e("x", false)]);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[0],
            "DATABASE  BACKUP ID         STATUS      SIZE  COMPLETED"
        );
        assert_eq!(
            lines[1],
            "app       20250101T000000Z  complete    42    2025-01-01T00:00:00Z"
        );
        assert_eq!(
            lines[2],
            "app       x                 incomplete  -     2025-01-01T00:00:00Z"
        );
    }
}
