//! Command line: subcommands and flags, each flag also readable from a `DBOP_BACKUP_*`
//! environment variable. Connection settings are not flags: they come from the libpq (`PG*`)
//! and AWS SDK (`AWS_*`) variables, or from files (`--password-file`, `--s3-*-file`,
//! `--encryption-key-dir`: Secrets mounted as volumes), so no secret is ever on a command line.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::s3::{ChecksumMode, SseMode};
use crate::units::{parse_duration, parse_size};

#[derive(Debug, Parser)]
#[command(
    name = "dbop-backup",
    version,
    about = "Streams PostgreSQL dumps to S3-compatible storage and back"
)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, env = "DBOP_BACKUP_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// pg_dump → zstd → S3 multipart upload, then the manifest (then prune, if a policy is given).
    Dump(DumpArgs),
    /// Download, check, decompress and pg_restore a backup into PGDATABASE, in one transaction.
    Restore(RestoreArgs),
    /// Restore a backup into a scratch database and compare the manifest's row counts.
    Verify(VerifyArgs),
    /// List backups (complete and incomplete).
    List(ListArgs),
    /// Apply the retention policy to one database's backups.
    Prune(PruneArgs),
    /// Archive one WAL file (PostgreSQL's `archive_command = 'dbop-backup wal-push %p %f'`),
    /// and other files already ready, in parallel.
    WalPush(WalPushArgs),
    /// Bring one archived WAL file back (`restore_command = 'dbop-backup wal-fetch %f %p'`).
    WalFetch(WalFetchArgs),
    /// A physical base backup of the whole instance: pg_basebackup's tar → zstd → S3, then
    /// its record; prints a result summary like `dump`. It connects for replication only
    /// (a LOGIN REPLICATION role suffices), and a complete backup's id is reported again.
    BaseBackup(BaseBackupArgs),
    /// Unpack the base backup for a recovery target into an empty data directory and write
    /// the recovery settings; PostgreSQL started on it replays archived WAL to the target.
    BaseRestore(BaseRestoreArgs),
    /// A whole point-in-time recovery into a data directory (absent or empty): base-restore
    /// into `<data dir>.recovering`, PostgreSQL run there until it promoted, the recovery
    /// settings removed, then renamed into place; prints the point reached. Run again on the
    /// finished directory, it prints the same result and changes nothing.
    Recover(RecoverArgs),
    /// Proof that a base backup restores: `recover` to the latest point into a scratch data
    /// directory (absent or empty; deleted afterwards), checked to have replayed every WAL
    /// segment the bucket held when it began, then every table of every database read whole;
    /// prints a result summary with the recovery time measured. Never touches a live server.
    VerifyBase(RecoverArgs),
}

#[derive(Debug, Args, Clone)]
pub struct StorageArgs {
    /// Bucket holding the backups.
    #[arg(long, env = "DBOP_BACKUP_BUCKET")]
    pub bucket: String,
    /// Key prefix; objects are `<prefix>/<database>/<backup id>/…`.
    #[arg(long, env = "DBOP_BACKUP_PREFIX", default_value = "")]
    pub prefix: String,
    /// Path-style requests (`endpoint/bucket/key`), as MinIO and most S3-compatible servers need.
    #[arg(long, env = "DBOP_BACKUP_PATH_STYLE", num_args = 0..=1, default_value = "false",
          default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub path_style: bool,
    /// PEM file of an extra CA to trust (a private CA), added to the system roots.
    #[arg(long, env = "DBOP_BACKUP_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// When the SDK adds request checksums: `when-required` suits every S3-compatible server;
    /// `when-supported` is the AWS SDK default (CRC32, aws-chunked bodies).
    #[arg(long, env = "DBOP_BACKUP_S3_CHECKSUMS", value_enum, default_value_t = ChecksumMode::WhenRequired)]
    pub s3_checksums: ChecksumMode,
    /// Server-side encryption of every object written: `aes256` (SSE-S3) or `aws-kms`
    /// (SSE-KMS). Default: the bucket's.
    #[arg(long, env = "DBOP_BACKUP_SSE", value_enum)]
    pub sse: Option<SseMode>,
    /// The KMS key (id, ARN or alias) of `--sse=aws-kms`; default: the account's.
    #[arg(long, env = "DBOP_BACKUP_SSE_KMS_KEY_ID", requires = "sse")]
    pub sse_kms_key_id: Option<String>,
    /// File holding the S3 access key id (a static key; else the SDK's credential chain).
    #[arg(
        long,
        env = "DBOP_BACKUP_S3_ACCESS_KEY_ID_FILE",
        requires = "s3_secret_access_key_file"
    )]
    pub s3_access_key_id_file: Option<PathBuf>,
    /// File holding the S3 secret access key.
    #[arg(
        long,
        env = "DBOP_BACKUP_S3_SECRET_ACCESS_KEY_FILE",
        requires = "s3_access_key_id_file"
    )]
    pub s3_secret_access_key_file: Option<PathBuf>,
    /// File holding an S3 session token (temporary credentials), with the two above.
    #[arg(
        long,
        env = "DBOP_BACKUP_S3_SESSION_TOKEN_FILE",
        requires = "s3_access_key_id_file"
    )]
    pub s3_session_token_file: Option<PathBuf>,
}

#[derive(Debug, Args, Clone, Default)]
pub struct OutputArgs {
    /// Also write the result summary JSON here (a Job uses /dev/termination-log).
    #[arg(long, env = "DBOP_BACKUP_RESULT_FILE")]
    pub result_file: Option<PathBuf>,
}

#[derive(Debug, Args, Clone, Default)]
pub struct PgArgs {
    /// Directory of pg_dump/pg_restore/psql; default: /usr/lib/postgresql/<server major>/bin, then PATH.
    #[arg(long, env = "DBOP_BACKUP_PG_BIN_DIR")]
    pub pg_bin_dir: Option<PathBuf>,
    /// File holding the database user's name (sets PGUSER, and PGDATABASE when unset, as
    /// libpq's default database is the user's name). A missing file changes nothing.
    #[arg(long, env = "DBOP_BACKUP_USER_FILE")]
    pub user_file: Option<PathBuf>,
    /// File holding the database password: written, escaped, into a pgpass file (mode 0600)
    /// in a private scratch directory that PGPASSFILE names for psql, pg_dump and pg_restore.
    #[arg(long, env = "DBOP_BACKUP_PASSWORD_FILE")]
    pub password_file: Option<PathBuf>,
}

#[derive(Debug, Args, Clone, Default)]
pub struct KeyArgs {
    /// Directory of encryption keys, one file per key name (a Secret mounted as a volume),
    /// each the base64 of 32 random bytes (`openssl rand -base64 32`). An encrypted backup
    /// is read with the key its manifest names.
    #[arg(long, env = "DBOP_BACKUP_ENCRYPTION_KEY_DIR")]
    pub encryption_key_dir: Option<PathBuf>,
}

/// How what the agent writes is encoded (`dump`, `wal-push`).
#[derive(Debug, Args, Clone)]
pub struct EncodeArgs {
    /// zstd level (1 fast … 19 small; negative levels are faster still).
    #[arg(long, env = "DBOP_BACKUP_COMPRESSION_LEVEL", default_value_t = 1,
          allow_negative_numbers = true,
          value_parser = clap::value_parser!(i32).range(-7..=19))]
    pub compression_level: i32,
    /// Encrypt every object written with this key of `--encryption-key-dir`.
    #[arg(
        long,
        env = "DBOP_BACKUP_ENCRYPTION_KEY",
        requires = "encryption_key_dir"
    )]
    pub encryption_key: Option<String>,
}

#[derive(Debug, Args, Clone)]
pub struct RetentionArgs {
    /// Keep at most this many complete backups (the newest is always kept).
    #[arg(long, env = "DBOP_BACKUP_KEEP_LAST")]
    pub keep_last: Option<u32>,
    /// Delete complete backups older than this (e.g. 30d, 12h); the newest is always kept.
    #[arg(long, env = "DBOP_BACKUP_MAX_AGE", value_parser = parse_duration)]
    pub max_age: Option<Duration>,
    /// Incomplete backups and unfinished uploads older than this are removed.
    #[arg(long, env = "DBOP_BACKUP_INCOMPLETE_GRACE", value_parser = parse_duration, default_value = "24h")]
    pub incomplete_grace: Duration,
}

impl RetentionArgs {
    /// The retention rule these flags set.
    pub fn policy(&self) -> crate::retention::Policy {
        crate::retention::Policy {
            keep_last: self.keep_last,
            max_age: self.max_age,
        }
    }
}

fn parse_part_size(s: &str) -> Result<u64, String> {
    let n = parse_size(s)?;
    if !(5 << 20..=5 << 30).contains(&n) {
        return Err("part size must be between 5MiB and 5GiB (S3 limits)".into());
    }
    Ok(n)
}

#[derive(Debug, Args)]
pub struct DumpArgs {
    #[command(flatten)]
    pub storage: StorageArgs,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub pg: PgArgs,
    #[command(flatten)]
    pub retention: RetentionArgs,
    #[command(flatten)]
    pub encode: EncodeArgs,
    /// zstd worker threads: 0 compresses in the thread that reads pg_dump; N ≥ 1 hands
    /// compression to N workers so reading and compressing overlap.
    #[arg(long, env = "DBOP_BACKUP_COMPRESSION_THREADS", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(0..=8))]
    pub compression_threads: u32,
    /// Size of each uploaded part (raised automatically when the database is so large that
    /// 10,000 parts might not suffice); memory use is about (concurrency + 2) × part size.
    #[arg(long, env = "DBOP_BACKUP_PART_SIZE", default_value = "8MiB", value_parser = parse_part_size)]
    pub part_size: u64,
    /// Parts uploaded at once.
    #[arg(long, env = "DBOP_BACKUP_UPLOAD_CONCURRENCY", default_value_t = 2,
          value_parser = clap::value_parser!(u16).range(1..=16))]
    pub upload_concurrency: u16,
    /// pg_dump streams per database, all reading the same snapshot: with N > 1 the largest
    /// tables' rows are shared out among N − 1 data-only streams beside the rest of the dump,
    /// each stored as an object of its own (a backup in parts, which agents that predate parts
    /// refuse whole). Memory grows with N: about N × (concurrency + 2) × part size.
    #[arg(long, env = "DBOP_BACKUP_JOBS", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=16))]
    pub jobs: u16,
    /// With `--jobs` > 1 on PostgreSQL 14 and later, a table larger than this and than 1.5 ×
    /// one stream's share of the dump is cut into ranges of its pages dumped side by side
    /// (smaller ones dump in seconds: a slice of their own would only add objects).
    #[arg(long, env = "DBOP_BACKUP_SPLIT_TABLES_LARGER_THAN", default_value = "64MiB",
          value_parser = parse_size)]
    pub split_tables_larger_than: u64,
    /// Backup id (default: the UTC start time, YYYYMMDDTHHMMSSZ). If a complete backup with
    /// this id exists, `dump` reports it as succeeded without dumping again.
    #[arg(long, env = "DBOP_BACKUP_ID")]
    pub backup_id: Option<String>,
    #[command(flatten)]
    pub keys: KeyArgs,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// Backup id, or `latest`.
    #[arg(env = "DBOP_BACKUP_ID", default_value = "latest")]
    pub backup: String,
    /// Database whose backups to read (default: the target: PGDATABASE, else libpq's default).
    #[arg(long, env = "DBOP_BACKUP_SOURCE_DATABASE")]
    pub source_database: Option<String>,
    /// Pass --no-owner to pg_restore (objects owned by the restoring user).
    #[arg(long, env = "DBOP_BACKUP_NO_OWNER")]
    pub no_owner: bool,
    /// Pass --no-acl to pg_restore (no GRANT/REVOKE).
    #[arg(long, env = "DBOP_BACKUP_NO_ACL")]
    pub no_acl: bool,
    /// Do not recreate the backup's roles and memberships before the data.
    #[arg(long, env = "DBOP_BACKUP_NO_GLOBALS")]
    pub no_globals: bool,
    /// Restore only this database of the backup (e.g. the application's, `app`) into the
    /// target. Default: every database: the backup's own into the target, each other one under
    /// its own name (created, or the server's empty one).
    #[arg(
        long = "database",
        value_name = "NAME",
        env = "DBOP_BACKUP_RESTORE_DATABASE"
    )]
    pub database: Option<String>,
    /// Sessions restoring a backup dumped in parts (`dump --jobs`) at once. 1: each database
    /// in one transaction, all or nothing. N > 1, only into empty databases: the schema, then
    /// the data streams N at once, then indexes and constraints, each step committed on its
    /// own once its objects are checked whole; a failure after the first step leaves the
    /// schema and some rows behind (the error says so), and the database must be emptied
    /// before another restore.
    #[arg(long, env = "DBOP_RESTORE_JOBS", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=16))]
    pub jobs: u16,
    #[command(flatten)]
    pub keys: KeyArgs,
    #[command(flatten)]
    pub storage: StorageArgs,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub pg: PgArgs,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Backup id, or `latest`.
    #[arg(env = "DBOP_BACKUP_ID", default_value = "latest")]
    pub backup: String,
    /// Database whose backups to read (default: PGDATABASE).
    #[arg(long, env = "DBOP_BACKUP_SOURCE_DATABASE")]
    pub source_database: Option<String>,
    /// Name of the scratch database (created, then dropped; default dbop_verify_<time>_<pid>).
    #[arg(long, env = "DBOP_BACKUP_SCRATCH_DATABASE")]
    pub scratch_database: Option<String>,
    /// Sessions restoring a backup dumped in parts into the scratch database at once (in
    /// steps, as `restore --jobs`: the scratch database is new and dropped whatever happens).
    #[arg(long, env = "DBOP_VERIFY_JOBS", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=16))]
    pub jobs: u16,
    #[command(flatten)]
    pub keys: KeyArgs,
    #[command(flatten)]
    pub storage: StorageArgs,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub pg: PgArgs,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only this database's backups.
    #[arg(long, env = "DBOP_BACKUP_DATABASE")]
    pub database: Option<String>,
    /// JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub storage: StorageArgs,
}

#[derive(Debug, Args)]
pub struct PruneArgs {
    /// Database whose backups to prune (default: PGDATABASE).
    #[arg(long, env = "DBOP_BACKUP_DATABASE")]
    pub database: Option<String>,
    /// Print the decisions without deleting anything.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub retention: RetentionArgs,
    #[command(flatten)]
    pub storage: StorageArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// What `wal-push` and `wal-fetch` share.
#[derive(Debug, Args)]
pub struct WalArgs {
    /// Database whose backups folder holds the WAL, `<prefix>/<database>/wal/` (default:
    /// PGDATABASE).
    #[arg(long, env = "DBOP_BACKUP_DATABASE")]
    pub database: Option<String>,
    /// The longest one call may take, retries included; then it exits non-zero and PostgreSQL
    /// calls again.
    #[arg(long, env = "DBOP_BACKUP_WAL_DEADLINE", value_parser = parse_duration, default_value = "60s")]
    pub wal_deadline: Duration,
    #[command(flatten)]
    pub keys: KeyArgs,
    #[command(flatten)]
    pub storage: StorageArgs,
}

#[derive(Debug, Args)]
pub struct WalPushArgs {
    /// The file to archive (`%p`: relative to the data directory, in `pg_wal/`).
    pub path: PathBuf,
    /// Its name (`%f`).
    pub file_name: String,
    /// Files uploaded at once: this one and up to N-1 others PostgreSQL has marked ready in
    /// `pg_wal/archive_status/` (1: no read-ahead).
    #[arg(long, env = "DBOP_BACKUP_WAL_PARALLEL", default_value_t = 4,
          value_parser = clap::value_parser!(u16).range(1..=32))]
    pub wal_parallel: u16,
    /// Where a marker is left for each file uploaded ahead of its own call (default:
    /// `dbop-wal-spool` beside `pg_wal`, in the data directory).
    #[arg(long, env = "DBOP_BACKUP_WAL_SPOOL_DIR")]
    pub wal_spool_dir: Option<PathBuf>,
    #[command(flatten)]
    pub encode: EncodeArgs,
    #[command(flatten)]
    pub wal: WalArgs,
}

#[derive(Debug, Args)]
pub struct WalFetchArgs {
    /// The file PostgreSQL asks for (`%f`).
    pub file_name: String,
    /// Where to put it (`%p`).
    pub path: PathBuf,
    #[command(flatten)]
    pub wal: WalArgs,
}

/// The PostgreSQL checksum algorithms of a backup manifest.
const MANIFEST_CHECKSUMS: [&str; 6] = ["NONE", "CRC32C", "SHA224", "SHA256", "SHA384", "SHA512"];

#[derive(Debug, Args)]
pub struct BaseBackupArgs {
    /// Database whose backups folder holds the base backups, `<prefix>/<database>/base/`
    /// (default: PGDATABASE); the backup is of the whole instance.
    #[arg(long, env = "DBOP_BACKUP_DATABASE")]
    pub database: Option<String>,
    /// Backup id (default: the UTC start time, YYYYMMDDTHHMMSSZ). If a complete base backup
    /// with this id exists, it is reported without taking another.
    #[arg(long, env = "DBOP_BACKUP_ID")]
    pub backup_id: Option<String>,
    /// Ask for an immediate checkpoint (default: a spread one, gentler on a busy server).
    #[arg(long, env = "DBOP_BACKUP_FAST_CHECKPOINT")]
    pub fast_checkpoint: bool,
    /// Checksum algorithm of PostgreSQL's backup manifest.
    #[arg(long, env = "DBOP_BACKUP_MANIFEST_CHECKSUMS", default_value = "CRC32C",
          value_parser = clap::builder::PossibleValuesParser::new(MANIFEST_CHECKSUMS))]
    pub manifest_checksums: String,
    /// zstd worker threads (0: compress in the reading thread). With the agent's own
    /// connection the server compresses, with this many workers beside its sender.
    #[arg(long, env = "DBOP_BACKUP_COMPRESSION_THREADS", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(0..=8))]
    pub compression_threads: u32,
    /// Who takes the backup: `auto` is the agent's own replication connection, the server
    /// compressing (PostgreSQL 15 or later, and connection settings it reads as libpq does),
    /// else pg_basebackup; `pg_basebackup` always runs pg_basebackup and compresses here.
    #[arg(long, env = "DBOP_BACKUP_BASE_CLIENT", default_value = "auto",
          value_parser = clap::builder::PossibleValuesParser::new(["auto", "pg_basebackup"]))]
    pub base_client: String,
    /// Size of each uploaded part (at most 10,000 parts: 8MiB parts hold 78 GiB compressed).
    #[arg(long, env = "DBOP_BACKUP_PART_SIZE", default_value = "8MiB", value_parser = parse_part_size)]
    pub part_size: u64,
    /// Parts uploaded at once.
    #[arg(long, env = "DBOP_BACKUP_UPLOAD_CONCURRENCY", default_value_t = 2,
          value_parser = clap::value_parser!(u16).range(1..=16))]
    pub upload_concurrency: u16,
    // With --keep-last/--max-age, after the backup: older base backups are deleted, and the
    // archived WAL before the oldest retained one's start (`base_prune`).
    #[command(flatten)]
    pub retention: RetentionArgs,
    #[command(flatten)]
    pub encode: EncodeArgs,
    #[command(flatten)]
    pub keys: KeyArgs,
    #[command(flatten)]
    pub storage: StorageArgs,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub pg: PgArgs,
}

#[derive(Debug, Args)]
pub struct BaseRestoreArgs {
    /// The data directory to restore into: absent or empty.
    pub data_dir: PathBuf,
    /// Database whose backups folder holds the base backups and WAL (default: PGDATABASE).
    #[arg(long, env = "DBOP_BACKUP_DATABASE")]
    pub database: Option<String>,
    /// Restore this base backup (default: the newest that ends before the target).
    #[arg(long, env = "DBOP_BACKUP_ID")]
    pub backup_id: Option<String>,
    /// Recover to this moment (RFC 3339, e.g. 2025-01-02T03:04:05.123Z) and promote.
    #[arg(long, env = "DBOP_BACKUP_TARGET_TIME", group = "target")]
    pub target_time: Option<chrono::DateTime<chrono::Utc>>,
    /// Recover to this WAL location (X/Y) and promote.
    #[arg(long, env = "DBOP_BACKUP_TARGET_LSN", group = "target")]
    pub target_lsn: Option<String>,
    /// Recover to this restore point (`pg_create_restore_point`) and promote.
    #[arg(long, env = "DBOP_BACKUP_TARGET_NAME", group = "target")]
    pub target_name: Option<String>,
    /// The agent PostgreSQL runs as `restore_command` (default: this executable).
    #[arg(long, env = "DBOP_BACKUP_AGENT_PATH")]
    pub agent_path: Option<PathBuf>,
    #[command(flatten)]
    pub keys: KeyArgs,
    #[command(flatten)]
    pub storage: StorageArgs,
    #[command(flatten)]
    pub pg: PgArgs,
}

#[derive(Debug, Args)]
pub struct RecoverArgs {
    #[command(flatten)]
    pub restore: BaseRestoreArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn a_negative_compression_level_is_a_value_not_a_flag() {
        let level = |args: &[&str]| {
            let cli =
                Cli::try_parse_from([&["dbop-backup", "dump", "--bucket", "b"], args].concat())
                    .map_err(|e| e.to_string())?;
            let Command::Dump(d) = cli.command else {
                panic!("not a dump")
            };
            Ok::<_, String>(d.encode.compression_level)
        };
        assert_eq!(level(&["--compression-level", "-3"]), Ok(-3));
        assert_eq!(level(&["--compression-level=-7"]), Ok(-7));
        assert!(level(&["--compression-level", "-8"]).is_err());
    }

    #[test]
    fn parses_a_dump() {
        let cli = Cli::try_parse_from([
            "dbop-backup",
            "dump",
            "--bucket",
            "b",
            "--path-style",
            "--part-size",
            "16MiB",
            "--keep-last",
            "3",
            "--max-age",
            "30d",
        ])
        .unwrap();
        let Command::Dump(d) = cli.command else {
            panic!("not a dump")
        };
        assert!(d.storage.path_style);
        assert_eq!(d.part_size, 16 << 20);
        assert_eq!(d.retention.keep_last, Some(3));
        assert_eq!(d.retention.max_age, Some(Duration::from_secs(30 * 86_400)));
        assert_eq!(d.encode.compression_level, 1);
        assert_eq!(d.storage.s3_checksums, ChecksumMode::WhenRequired);
        assert_eq!((d.jobs, d.split_tables_larger_than), (1, 64 << 20));
    }

    #[test]
    fn parses_the_wal_commands_as_postgresql_calls_them() {
        let cli = Cli::try_parse_from([
            "dbop-backup",
            "wal-push",
            "pg_wal/000000010000000000000002",
            "000000010000000000000002",
            "--bucket",
            "b",
        ])
        .unwrap();
        let Command::WalPush(p) = cli.command else {
            panic!("not a wal-push")
        };
        assert_eq!(p.path, PathBuf::from("pg_wal/000000010000000000000002"));
        assert_eq!(p.file_name, "000000010000000000000002");
        assert_eq!((p.wal_parallel, p.encode.compression_level), (4, 1));
        assert_eq!(p.wal.wal_deadline, Duration::from_secs(60));
        let cli = Cli::try_parse_from([
            "dbop-backup",
            "wal-fetch",
            "00000002.history",
            "pg_wal/RECOVERYHISTORY",
            "--bucket",
            "b",
            "--wal-deadline",
            "10s",
        ])
        .unwrap();
        let Command::WalFetch(f) = cli.command else {
            panic!("not a wal-fetch")
        };
        assert_eq!(f.file_name, "00000002.history");
        assert_eq!(f.wal.wal_deadline, Duration::from_secs(10));
    }

    #[test]
    fn parses_the_base_backup_commands() {
        let cli = Cli::try_parse_from([
            "dbop-backup",
            "base-backup",
            "--bucket",
            "b",
            "--fast-checkpoint",
            "--result-file",
            "/dev/termination-log",
            "--keep-last",
            "2",
        ])
        .unwrap();
        let Command::BaseBackup(b) = cli.command else {
            panic!("not a base-backup")
        };
        assert!(b.fast_checkpoint);
        assert_eq!(
            b.retention.policy(),
            crate::retention::Policy {
                keep_last: Some(2),
                max_age: None
            }
        );
        assert_eq!(
            b.output.result_file,
            Some(PathBuf::from("/dev/termination-log"))
        );
        assert_eq!(
            (b.manifest_checksums.as_str(), b.part_size),
            ("CRC32C", 8 << 20)
        );
        let cli = Cli::try_parse_from([
            "dbop-backup",
            "base-restore",
            "/var/lib/postgresql/data",
            "--bucket",
            "b",
            "--target-time",
            "2025-01-02T03:04:05.5+01:00",
        ])
        .unwrap();
        let Command::BaseRestore(r) = cli.command else {
            panic!("not a base-restore")
        };
        assert_eq!(r.data_dir, PathBuf::from("/var/lib/postgresql/data"));
        let cli = Cli::try_parse_from([
            "dbop-backup",
            "recover",
            "/var/lib/postgresql/data",
            "--bucket",
            "b",
            "--target-lsn",
            "0/3000100",
            "--result-file",
            "/dev/termination-log",
        ])
        .unwrap();
        let Command::Recover(v) = cli.command else {
            panic!("not a recover")
        };
        assert_eq!(v.restore.target_lsn.as_deref(), Some("0/3000100"));
        assert_eq!(
            v.output.result_file,
            Some(PathBuf::from("/dev/termination-log"))
        );
        assert_eq!(
            r.target_time.map(|t| t.to_rfc3339()),
            Some("2025-01-02T02:04:05.500+00:00".to_string())
        );
        for args in [
            vec![
                "dbop-backup",
                "base-restore",
                "d",
                "--bucket",
                "b",
                "--target-time",
                "x",
            ],
            vec![
                "dbop-backup",
                "base-restore",
                "d",
                "--bucket",
                "b",
                "--target-lsn",
                "0/1",
                "--target-name",
                "n",
            ],
            vec!["dbop-backup", "base-restore", "--bucket", "b"],
            vec![
                "dbop-backup",
                "recover",
                "d",
                "--bucket",
                "b",
                "--target-time",
                "2025-01-01T00:00:00Z",
                "--target-name",
                "n",
            ],
            vec![
                "dbop-backup",
                "base-backup",
                "--bucket",
                "b",
                "--manifest-checksums",
                "MD5",
            ],
        ] {
            assert!(Cli::try_parse_from(&args).is_err(), "{args:?}");
        }
    }

    #[test]
    fn rejects_bad_values() {
        for args in [
            vec![
                "dbop-backup",
                "dump",
                "--bucket",
                "b",
                "--part-size",
                "1MiB",
            ],
            vec![
                "dbop-backup",
                "dump",
                "--bucket",
                "b",
                "--compression-level",
                "30",
            ],
            vec!["dbop-backup", "dump", "--bucket", "b", "--max-age", "30"],
            vec![
                "dbop-backup",
                "dump",
                "--bucket",
                "b",
                "--upload-concurrency",
                "0",
            ],
            vec!["dbop-backup", "dump"],
            vec![
                "dbop-backup",
                "wal-push",
                "p",
                "f",
                "--bucket",
                "b",
                "--wal-parallel",
                "0",
            ],
            vec!["dbop-backup", "wal-push", "p", "--bucket", "b"],
            vec![
                "dbop-backup",
                "wal-fetch",
                "f",
                "p",
                "--bucket",
                "b",
                "--wal-deadline",
                "5",
            ],
            vec![
                "dbop-backup",
                "wal-push",
                "p",
                "f",
                "--bucket",
                "b",
                "--encryption-key",
                "k",
            ],
        ] {
            assert!(Cli::try_parse_from(&args).is_err(), "{args:?}");
        }
    }
}
