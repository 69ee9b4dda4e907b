//! One database's dump restored. In one transaction (the default): its one object by
//! pg_restore itself (`restore_stream`); a database dumped in parts (`streams`) through one psql
//! session that opens the transaction, each part's pg_restore writing its SQL straight into that
//! session's input in the manifest's order (pre-data, the data streams, then the rest and
//! post-data). The agent commits only once every part has been read whole, checked against
//! the manifest and executed; any failure kills psql before `COMMIT`, so the server rolls
//! everything back and the target database is left as it was, as with a dump of one object.
//!
//! With `jobs` > 1, a dump in parts is restored in steps, each step a transaction of its own
//! committed only after its objects were checked whole: the schema (pre-data); then the data
//! streams and the rest's data, up to `jobs` at once, each in its own session; then the
//! post-data (indexes, constraints, triggers), whose index builds PostgreSQL spreads over its
//! own parallel maintenance workers. Only into a database without objects of its own: a
//! failure after the first step leaves the schema and some tables' rows committed, which the
//! error says, and a second run refuses the database until it is empty again.

use std::io::Write;
use std::process::Stdio;

use crate::databases::HAS_OBJECTS_SQL;
use crate::error::{Error, Result};
use crate::manifest::DumpPart;
use crate::pg::{self, PgTools};
use crate::restore_stream::{OneRestore, Output, Section, restore_object};
use crate::s3::Store;

/// How a database's dump was restored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Restored {
    InOneTransaction,
    InSteps,
}

/// Restores one database's dump into the job's target: its one object through pg_restore, its
/// parts in one transaction, or its parts in steps with `job.jobs` sessions.
pub(crate) async fn restore_one(
    store: &Store,
    tools: &PgTools,
    job: OneRestore<'_>,
) -> Result<Restored> {
    match job.dump.objects().as_slice() {
        [one] => {
            restore_object(store, tools, &job, one, Output::Database).await?;
            Ok(Restored::InOneTransaction)
        }
        [pre, data @ .., rest] if job.jobs > 1 && !data.is_empty() => {
            restore_in_steps(store, tools, &job, pre, data, rest).await?;
            Ok(Restored::InSteps)
        }
        parts => {
            let pieces: Vec<Piece> = parts.iter().map(Piece::whole).collect();
            in_one_transaction(store, tools, &job, &pieces).await?;
            Ok(Restored::InOneTransaction)
        }
    }
}

/// What one pg_restore of a transaction restores: a section of one stored object.
#[derive(Clone, Copy)]
struct Piece<'a> {
    part: &'a DumpPart,
    section: Section,
}

impl<'a> Piece<'a> {
    fn whole(part: &'a DumpPart) -> Self {
        Piece {
            part,
            section: Section::All,
        }
    }
}

/// The schema, then the data streams at most `job.jobs` at once, then the post-data: each
/// step committed only once its objects were checked whole.
async fn restore_in_steps(
    store: &Store,
    tools: &PgTools,
    job: &OneRestore<'_>,
    pre: &DumpPart,
    data: &[DumpPart],
    rest: &DumpPart,
) -> Result<()> {
    use futures::StreamExt;
    if tools.query(Some(job.target), HAS_OBJECTS_SQL).await? == "true" {
        return Err(Error::Usage(format!(
            "database '{}' is not empty: a restore with several jobs only loads an empty database (restore with one job, in one transaction, or empty it first); nothing was restored",
            job.target
        )));
    }
    in_one_transaction(store, tools, job, &[Piece::whole(pre)]).await?;
    let loads: Vec<[Piece; 1]> = data
        .iter()
        .map(|part| [Piece::whole(part)])
        .chain([[Piece {
            part: rest,
            section: Section::Data,
        }]])
        .collect();
    let post = [Piece {
        part: rest,
        section: Section::PostData,
    }];
    // Every load runs to its own end (commit or rollback), so what the target holds after a
    // failure is settled when the error is reported.
    let loaded: Vec<Result<()>> = futures::stream::iter(&loads)
        .map(|load| in_one_transaction(store, tools, job, load))
        .buffer_unordered(job.jobs)
        .collect()
        .await;
    match loaded.into_iter().find(Result::is_err) {
        None => in_one_transaction(store, tools, job, &post).await,
        Some(failed) => failed,
    }
    .map_err(|e| partly_restored(job.target, e))
}

/// A failure after the schema was committed: the error, and what the target holds now.
fn partly_restored(target: &str, e: Error) -> Error {
    tracing::error!(database = target, error = %e, "restore failed after the schema was committed");
    Error::Partial {
        cause: Box::new(e),
        target: target.to_string(),
    }
}

/// Restores `pieces` in order into the job's target in one transaction.
async fn in_one_transaction(
    store: &Store,
    tools: &PgTools,
    job: &OneRestore<'_>,
    pieces: &[Piece<'_>],
) -> Result<()> {
    let target = job.target;
    let mut psql = tools
        .command("psql", job.major)
        .args(["-X", "-w", "-q", "-v", "ON_ERROR_STOP=1"])
        .env("PGDATABASE", target)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| pg::pg_error("psql", target, format!("cannot run psql: {e}")))?;
    let stderr = pg::collect_stderr(&mut psql, "psql");
    let input = psql
        .stdin
        .take()
        .ok_or_else(|| pg::pg_error("psql", target, "no stdin pipe"))
        .and_then(|s| pg::stdin_file(s).map_err(|e| pg::pg_error("psql", target, e.to_string())))?;
    let mut input = input;
    let fed = feed_pieces(store, tools, job, pieces, &mut input).await;
    // After a failure, psql has either stopped on its own (an SQL error: the cause of what its
    // writers saw next) or is waiting for more input: then it is killed before its input
    // closes, so it never reads an end it could take for the end of its script.
    let stopped_itself = match &fed {
        Ok(()) => false,
        Err(_) => tokio::time::timeout(OWN_STOP, psql.wait()).await.is_ok(),
    };
    if fed.is_err() && !stopped_itself {
        let _ = psql.start_kill();
    }
    drop(input);
    let status = psql
        .wait()
        .await
        .map_err(|e| pg::pg_error("psql", target, e.to_string()))?;
    let tail = stderr.await.unwrap_or_default();
    let psql_failed = |what: String| {
        pg::pg_error(
            "psql",
            target,
            format!("{what}; nothing was committed: {}", pg::tail_text(&tail)),
        )
    };
    match fed {
        Ok(()) if status.success() => Ok(()),
        Ok(()) => Err(psql_failed(format!("{status}, the commit unconfirmed"))),
        Err(_) if stopped_itself && !status.success() => Err(psql_failed(status.to_string())),
        Err(e) => Err(e),
    }
}

/// How long a failed restore waits for psql to have stopped on its own before killing it.
const OWN_STOP: std::time::Duration = std::time::Duration::from_millis(500);

/// Opens the transaction, runs every piece's pg_restore into `input` and commits after the
/// last; returns at the first failure, before any `COMMIT`.
async fn feed_pieces(
    store: &Store,
    tools: &PgTools,
    job: &OneRestore<'_>,
    pieces: &[Piece<'_>],
    input: &mut std::fs::File,
) -> Result<()> {
    let say = |input: &mut std::fs::File, sql: &str| {
        input
            .write_all(sql.as_bytes())
            .map_err(|e| Error::io("writing to psql", e))
    };
    say(input, "BEGIN;\n")?;
    for piece in pieces {
        let output = Output::Script {
            into: input,
            section: piece.section,
        };
        restore_object(store, tools, job, piece.part, output).await?;
    }
    say(input, "COMMIT;\n")
}
