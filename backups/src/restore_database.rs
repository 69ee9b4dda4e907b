//! One database's dump restored in one transaction: its one object by pg_restore itself
//! (`restore_stream`); a database dumped in parts (`streams`) through one psql session that
//! opens the transaction, each part's pg_restore writing its SQL straight into that session's
//! input in the manifest's order (pre-data, the data streams, then the rest and post-data).
//! The agent commits only once every part has been read whole, checked against the manifest
//! and executed; any failure kills psql before `COMMIT`, so the server rolls everything back
//! and the target database is left as it was, as with a dump of one object.

use std::io::Write;
use std::process::Stdio;

use crate::error::{Error, Result};
use crate::manifest::DumpPart;
use crate::pg::{self, PgTools};
use crate::restore_stream::{OneRestore, Output, restore_object};
use crate::s3::Store;

/// Restores one database's dump into the job's target in one transaction: its one object
/// through pg_restore, or its parts in order.
pub(crate) async fn restore_one(store: &Store, tools: &PgTools, job: OneRestore<'_>) -> Result<()> {
    match job.dump.objects().as_slice() {
        [one] => restore_object(store, tools, &job, one, Output::Database).await,
        parts => restore_parts(store, tools, &job, parts).await,
    }
}

/// Restores `parts` in order into the job's target in one transaction.
async fn restore_parts(
    store: &Store,
    tools: &PgTools,
    job: &OneRestore<'_>,
    parts: &[DumpPart],
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
    let fed = feed_parts(store, tools, job, parts, &mut input).await;
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

/// Opens the transaction, runs every part's pg_restore into `input` and commits after the
/// last; returns at the first failure, before any `COMMIT`.
async fn feed_parts(
    store: &Store,
    tools: &PgTools,
    job: &OneRestore<'_>,
    parts: &[DumpPart],
    input: &mut std::fs::File,
) -> Result<()> {
    let say = |input: &mut std::fs::File, sql: &str| {
        input
            .write_all(sql.as_bytes())
            .map_err(|e| Error::io("writing to psql", e))
    };
    say(input, "BEGIN;\n")?;
    for part in parts {
        restore_object(store, tools, job, part, Output::Script(input)).await?;
    }
    say(input, "COMMIT;\n")
}
