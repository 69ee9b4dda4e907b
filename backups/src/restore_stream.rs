//! One stored object of a database's dump, streamed from S3 into pg_restore and checked on the
//! way (`restore` and `verify` both restore through it, by way of `restore_database`):
//! download → SHA-256 and size check → decryption → zstd decode (frame checksums checked) →
//! pg_restore into the database in one transaction, or as SQL into the psql session that holds
//! the transaction. The SHA-256 is only known at the end, so the last decoded bytes are held
//! back until it matches: pg_restore cannot reach the end of the archive, hence cannot commit,
//! before the whole object has been checked. On any mismatch or error pg_restore is killed
//! before its input is closed, and the target database is left as it was.

use std::io::{Read, Write};

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::crypto::{Decrypt, Key};
use crate::error::{Error, Result};
use crate::manifest::{DatabaseDump, DumpPart, TableCopy, object_context};
use crate::pg::{self, PgTools};
use crate::s3::Store;
use crate::slices;

/// Decoded bytes held back from pg_restore until the object's checksum has been checked.
pub const HOLD_BACK: usize = 64 << 10;
const CHUNK: usize = 256 << 10;

/// One database's dump to restore: which objects, into which database, decrypted how.
pub(crate) struct OneRestore<'a> {
    pub(crate) major: Option<u32>,
    /// The backup's folder in the bucket (ending in `/`) and id.
    pub(crate) folder: &'a str,
    pub(crate) backup_id: &'a str,
    pub(crate) dump: &'a DatabaseDump,
    pub(crate) target: &'a str,
    /// The backup's key when it is encrypted.
    pub(crate) key: Option<Key>,
    /// pg_restore's `--no-owner` and `--no-acl`.
    pub(crate) no_owner: bool,
    pub(crate) no_acl: bool,
    /// Sessions restoring at once (`restore_database`): 1 restores in one transaction.
    pub(crate) jobs: usize,
}

/// Where pg_restore sends the dump: into the target database itself, in one transaction, or
/// as SQL into this pipe (a psql session that holds the transaction of several objects),
/// limited to one of the archive's sections.
pub(crate) enum Output<'a> {
    Database,
    Script {
        into: &'a std::fs::File,
        section: Section,
    },
}

/// Which of an archive's sections pg_restore restores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Section {
    All,
    /// Table rows, sequence values, large objects.
    Data,
    /// Indexes, constraints, triggers, rules, materialized views' contents.
    PostData,
}

impl Section {
    fn arg(self) -> Option<&'static str> {
        match self {
            Section::All => None,
            Section::Data => Some("--section=data"),
            Section::PostData => Some("--section=post-data"),
        }
    }
}

/// Restores one stored object: S3 → checks (→ decryption) → pg_restore, or, for a slice of a
/// table, straight into the psql session as the rows of its `COPY … FROM STDIN`.
pub(crate) async fn restore_object(
    store: &Store,
    tools: &PgTools,
    job: &OneRestore<'_>,
    part: &DumpPart,
    output: Output<'_>,
) -> Result<()> {
    let key = format!("{}{}", job.folder, part.file);
    let target = job.target;
    tracing::info!(database = job.dump.name, target, key, "restore starting");
    if let Some(copy) = &part.copy {
        return restore_slice(store, job, part, copy, output, &key).await;
    }
    let body = open_dump(store, &key, part.size_bytes).await?;
    // pg_restore may stop reading once it has what one section needs (the table of contents
    // alone, for the post-data): it only writes SQL, which commits nothing, and the rest of
    // the object is still read and checked before the caller commits.
    let may_stop = matches!(output, Output::Script { section, .. } if section != Section::All);
    let restore = spawn_pg_restore(tools, job, output)?;
    let expected = Expected::of(job, part, may_stop);
    let fed = pump(body, restore.stdin, expected, restore.pid).await;
    let mut child = restore.child;
    let status = child
        .wait()
        .await
        .map_err(|e| pg::pg_error("pg_restore", target, e.to_string()))?;
    let tail = restore.stderr.await.unwrap_or_default();
    judge(store, &key, target, fed, status, &tail)
}

/// A slice's rows written into the session between its `COPY … FROM STDIN` and the `\.` that
/// ends them; the end is written only once the object was checked whole, so a bad object
/// leaves the session inside the `COPY`, which the caller's kill rolls back.
async fn restore_slice(
    store: &Store,
    job: &OneRestore<'_>,
    part: &DumpPart,
    copy: &TableCopy,
    output: Output<'_>,
    key: &str,
) -> Result<()> {
    let target = job.target;
    let failed = |e: String| pg::pg_error("psql", target, e);
    let (Output::Script { into, .. }, Some(copy_in)) = (
        output,
        slices::copy_in(&copy.schema, &copy.table, &copy.columns),
    ) else {
        return Err(Error::Usage(format!(
            "{key} is a slice of table {}.{} and is only restored with the rest of its backup",
            copy.schema, copy.table
        )));
    };
    let mut session = into.try_clone().map_err(|e| failed(e.to_string()))?;
    let header = slices::restore_header(&copy.encoding, &copy_in);
    session
        .write_all(header.as_bytes())
        .map_err(|e| failed(format!("psql stopped reading: {e}")))?;
    let body = open_dump(store, key, part.size_bytes).await?;
    let expected = Expected::of(job, part, false);
    let rows = session.try_clone().map_err(|e| failed(e.to_string()))?;
    match pump(body, rows, expected, 0).await {
        Ok(()) => session
            .write_all(b"\\.\n")
            .map_err(|e| failed(format!("psql stopped reading: {e}"))),
        Err(FeedError::PgRestoreStopped(e)) => Err(failed(format!("psql stopped reading: {e}"))),
        Err(e) => Err(fed_error(store, key, e)),
    }
}

/// The dump object's body, refused when the server announces another size than the manifest.
async fn open_dump(
    store: &Store,
    dump_key: &str,
    size_bytes: u64,
) -> Result<aws_sdk_s3::primitives::ByteStream> {
    let (body, announced) = store.get_stream(dump_key).await?;
    if announced.is_some_and(|n| n != size_bytes) {
        return Err(Error::Integrity {
            key: dump_key.to_string(),
            detail: format!(
                "object has {} bytes, the manifest says {}",
                announced.unwrap_or(0),
                size_bytes
            ),
        });
    }
    Ok(body)
}

/// A running pg_restore and its pipes.
struct PgRestore {
    child: tokio::process::Child,
    stderr: tokio::task::JoinHandle<String>,
    pid: u32,
    stdin: std::fs::File,
}

fn spawn_pg_restore(
    tools: &PgTools,
    job: &OneRestore<'_>,
    output: Output<'_>,
) -> Result<PgRestore> {
    let target = job.target;
    let mut cmd = tools.command("pg_restore", job.major);
    cmd.args(["--format=custom", "--exit-on-error", "--no-password"]);
    if job.no_owner {
        cmd.arg("--no-owner");
    }
    if job.no_acl {
        cmd.arg("--no-acl");
    }
    match output {
        // An empty --dbname makes pg_restore connect (rather than print SQL) with the database
        // from PGDATABASE, so no name is ever parsed as a connection string.
        Output::Database => cmd
            .args(["--single-transaction", "--dbname", ""])
            .env("PGDATABASE", target)
            .stdout(std::process::Stdio::null()),
        Output::Script { into, section } => {
            let pipe = into
                .try_clone()
                .map_err(|e| pg::pg_error("pg_restore", target, e.to_string()))?;
            cmd.args(section.arg());
            cmd.args(["--file", "-"]).stdout(pipe)
        }
    };
    cmd.stdin(std::process::Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| pg::pg_error("pg_restore", target, format!("cannot run pg_restore: {e}")))?;
    let stderr = pg::collect_stderr(&mut child, "pg_restore");
    let pid = child.id().unwrap_or(0);
    let stdin = child
        .stdin
        .take()
        .ok_or_else(|| pg::pg_error("pg_restore", target, "no stdin pipe"))
        .and_then(|s| {
            pg::stdin_file(s).map_err(|e| pg::pg_error("pg_restore", target, e.to_string()))
        })?;
    Ok(PgRestore {
        child,
        stderr,
        pid,
        stdin,
    })
}

/// Downloads the body into the feeder thread, which hashes it and writes it to pg_restore.
async fn pump(
    mut body: aws_sdk_s3::primitives::ByteStream,
    stdin: std::fs::File,
    expected: Expected,
    pid: u32,
) -> std::result::Result<(), FeedError> {
    let (tx, rx) = mpsc::channel::<std::result::Result<Bytes, String>>(16);
    let feeder = tokio::task::spawn_blocking(move || feed(rx, stdin, expected, pid));
    let download = async move {
        loop {
            match body.next().await {
                Some(Ok(chunk)) => {
                    if tx.send(Ok(chunk)).await.is_err() {
                        return;
                    }
                }
                Some(Err(e)) => {
                    let _ = tx
                        .send(Err(aws_sdk_s3::error::DisplayErrorContext(&e).to_string()))
                        .await;
                    return;
                }
                None => return,
            }
        }
    };
    let (_, fed) = tokio::join!(download, feeder);
    fed.unwrap_or_else(|e| Err(FeedError::Internal(e.to_string())))
}

/// How the restore ended: committed, or the error that says why not.
fn judge(
    store: &Store,
    dump_key: &str,
    target: &str,
    fed: std::result::Result<(), FeedError>,
    status: std::process::ExitStatus,
    tail: &str,
) -> Result<()> {
    let restore_failed = |what: &str| {
        pg::pg_error(
            "pg_restore",
            target,
            format!("{what}; nothing was committed: {}", pg::tail_text(tail)),
        )
    };
    match fed {
        Ok(()) if status.success() => Ok(()),
        Ok(()) => Err(restore_failed(&status.to_string())),
        Err(FeedError::PgRestoreStopped(_)) if !status.success() => {
            Err(restore_failed(&status.to_string()))
        }
        Err(FeedError::PgRestoreStopped(e)) => {
            Err(restore_failed(&format!("pg_restore stopped reading: {e}")))
        }
        Err(e) => Err(fed_error(store, dump_key, e)),
    }
}

/// What a failure to read the object whole says.
fn fed_error(store: &Store, dump_key: &str, fed: FeedError) -> Error {
    let stopped = "the restore was stopped before committing";
    match fed {
        FeedError::Integrity(detail) => Error::Integrity {
            key: dump_key.to_string(),
            detail: format!("{detail}; {stopped}"),
        },
        FeedError::Download(detail) => Error::S3 {
            operation: "GetObject",
            endpoint: store.endpoint.clone(),
            bucket: store.bucket.clone(),
            key: Some(dump_key.to_string()),
            detail: format!("{detail}; {stopped}"),
        },
        FeedError::PgRestoreStopped(e) => Error::io("restore", e),
        FeedError::Internal(detail) => Error::io("restore", std::io::Error::other(detail)),
    }
}

struct Expected {
    sha256: String,
    size_bytes: u64,
    raw_bytes: u64,
    /// The object is encrypted: decrypted (each segment authenticated) after it is hashed.
    decrypt: Option<Decrypt>,
    /// pg_restore may close its input before the end (then the object is still read and
    /// checked to its end).
    reader_may_stop: bool,
}

impl Expected {
    /// What the manifest says of `part` (`reader_may_stop`: its reader may close early).
    fn of(job: &OneRestore<'_>, part: &DumpPart, reader_may_stop: bool) -> Expected {
        Expected {
            sha256: part.sha256.clone(),
            size_bytes: part.size_bytes,
            raw_bytes: part.raw_bytes,
            reader_may_stop,
            decrypt: job
                .key
                .as_ref()
                .map(|k| Decrypt::new(k.clone(), &object_context(job.backup_id, &part.file))),
        }
    }
}

#[derive(Debug)]
enum FeedError {
    /// Writing to pg_restore failed: it exited (its own error says why).
    PgRestoreStopped(std::io::Error),
    /// The object is not what the manifest says.
    Integrity(String),
    Download(String),
    Internal(String),
}

/// Reads the downloaded chunks, hashing and counting them (the stored bytes), and gives out
/// their plaintext: decrypted when the object is encrypted.
struct HashingReader {
    rx: mpsc::Receiver<std::result::Result<Bytes, String>>,
    current: Bytes,
    hasher: Sha256,
    count: u64,
    download_error: Option<String>,
    decrypt: Option<Decrypt>,
    decrypt_error: Option<String>,
    ended: bool,
}

impl HashingReader {
    /// The plaintext of a downloaded chunk (`None`: the end of the object).
    fn plaintext(&mut self, chunk: Option<&[u8]>) -> std::io::Result<Bytes> {
        let Some(d) = self.decrypt.as_mut() else {
            return Ok(Bytes::copy_from_slice(chunk.unwrap_or_default()));
        };
        let mut out = Vec::new();
        let r = match chunk {
            Some(c) => d.push(c, &mut out),
            None => d.finish(&mut out),
        };
        match r {
            Ok(()) => Ok(Bytes::from(out)),
            Err(e) => {
                self.decrypt_error = Some(e.clone());
                Err(std::io::Error::other(e))
            }
        }
    }
}

impl Read for HashingReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            if self.ended {
                return Ok(0);
            }
            match self.rx.blocking_recv() {
                Some(Ok(chunk)) => {
                    self.hasher.update(&chunk);
                    self.count += chunk.len() as u64;
                    self.current = if self.decrypt.is_some() {
                        self.plaintext(Some(&chunk))?
                    } else {
                        chunk
                    };
                }
                Some(Err(e)) => {
                    self.download_error = Some(e.clone());
                    return Err(std::io::Error::other(e));
                }
                None => {
                    self.ended = true;
                    self.current = self.plaintext(None)?;
                }
            }
        }
        let n = out.len().min(self.current.len());
        out[..n].copy_from_slice(&self.current[..n]);
        let _ = self.current.split_to(n);
        Ok(n)
    }
}

/// The feeder thread. On error it kills pg_restore before dropping its stdin, so pg_restore
/// never sees a clean end of input it could mistake for the end of the archive.
fn feed(
    rx: mpsc::Receiver<std::result::Result<Bytes, String>>,
    mut stdin: std::fs::File,
    mut expected: Expected,
    pid: u32,
) -> std::result::Result<(), FeedError> {
    let r = feed_inner(rx, &mut stdin, &mut expected);
    if r.is_err() && pid > 0 {
        // SAFETY: plain kill(2) of our own child, which has not been reaped yet.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
        }
    }
    drop(stdin);
    r
}

fn feed_inner(
    rx: mpsc::Receiver<std::result::Result<Bytes, String>>,
    stdin: &mut std::fs::File,
    expected: &mut Expected,
) -> std::result::Result<(), FeedError> {
    let reader = HashingReader {
        rx,
        current: Bytes::new(),
        hasher: Sha256::new(),
        count: 0,
        download_error: None,
        decrypt: expected.decrypt.take(),
        decrypt_error: None,
        ended: false,
    };
    let mut sink = Sink {
        stdin,
        may_stop: expected.reader_may_stop,
        stopped: false,
    };
    let mut decoder =
        zstd::stream::read::Decoder::new(reader).map_err(|e| FeedError::Internal(e.to_string()))?;
    let mut buf = vec![0u8; CHUNK];
    let mut held: Vec<u8> = Vec::with_capacity(HOLD_BACK + CHUNK);
    let mut raw: u64 = 0;
    loop {
        let n = match decoder.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                let inner = decoder.get_ref().get_ref();
                return Err(match (&inner.download_error, &inner.decrypt_error) {
                    (Some(d), _) => FeedError::Download(d.clone()),
                    (None, Some(d)) => FeedError::Integrity(format!("the object {d}")),
                    (None, None) => FeedError::Integrity(format!(
                        "the object does not decompress ({e}) after {} bytes: corrupted or truncated",
                        inner.count
                    )),
                });
            }
        };
        raw += n as u64;
        if raw > expected.raw_bytes {
            return Err(FeedError::Integrity(format!(
                "decompressed data is longer than the manifest's {} bytes",
                expected.raw_bytes
            )));
        }
        held.extend_from_slice(&buf[..n]);
        if held.len() > HOLD_BACK {
            let release = held.len() - HOLD_BACK;
            sink.give(&held[..release])?;
            held.drain(..release);
        }
    }
    check_whole(decoder.finish(), raw, expected)?;
    // Checked: let pg_restore see the end of the archive, then EOF.
    sink.give(&held)
}

/// pg_restore's input, which it may be allowed to close early.
struct Sink<'a> {
    stdin: &'a mut std::fs::File,
    may_stop: bool,
    stopped: bool,
}

impl Sink<'_> {
    /// Writes `bytes` unless pg_restore has stopped reading, which is an error unless allowed.
    fn give(&mut self, bytes: &[u8]) -> std::result::Result<(), FeedError> {
        if self.stopped {
            return Ok(());
        }
        match self.stdin.write_all(bytes) {
            Err(e) if self.may_stop && e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.stopped = true;
                Ok(())
            }
            r => r.map_err(FeedError::PgRestoreStopped),
        }
    }
}

/// Reads what is left after the last frame (it still counts towards the checksum), then holds
/// the whole object against the manifest: its size, its sha256 and its decompressed length.
fn check_whole(
    mut reader: std::io::BufReader<HashingReader>,
    raw: u64,
    expected: &Expected,
) -> std::result::Result<(), FeedError> {
    let mut rest = [0u8; 4096];
    loop {
        match reader.read(&mut rest) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => {
                let inner = reader.get_ref();
                if let Some(d) = &inner.decrypt_error {
                    return Err(FeedError::Integrity(format!("the object {d}")));
                }
                return Err(FeedError::Download(
                    inner
                        .download_error
                        .clone()
                        .unwrap_or_else(|| e.to_string()),
                ));
            }
        }
    }
    let mut reader = reader.into_inner();
    let sha = hex::encode(std::mem::take(&mut reader.hasher).finalize());
    if reader.count != expected.size_bytes {
        return Err(FeedError::Integrity(format!(
            "read {} bytes, the manifest says {}: truncated or replaced",
            reader.count, expected.size_bytes
        )));
    }
    if sha != expected.sha256 {
        return Err(FeedError::Integrity(format!(
            "sha256 is {sha}, the manifest says {}",
            expected.sha256
        )));
    }
    if raw != expected.raw_bytes {
        return Err(FeedError::Integrity(format!(
            "decompressed to {raw} bytes, the manifest says {}",
            expected.raw_bytes
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(data: &[u8]) -> Vec<u8> {
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        enc.include_checksum(true).unwrap();
        enc.write_all(data).unwrap();
        enc.finish().unwrap()
    }

    /// Runs the feeder over `object` with the given expectations; returns what reached "pg_restore".
    fn run_feed(
        object: Vec<u8>,
        expected: Expected,
    ) -> (std::result::Result<(), FeedError>, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        let file = std::fs::File::create(&path).unwrap();
        let (tx, rx) = mpsc::channel(4);
        let t = std::thread::spawn(move || feed(rx, file, expected, 0));
        for chunk in object.chunks(1000) {
            tx.blocking_send(Ok(Bytes::copy_from_slice(chunk))).unwrap();
        }
        drop(tx);
        let r = t.join().unwrap();
        (r, std::fs::read(&path).unwrap())
    }

    fn data() -> Vec<u8> {
        (0..300_000u32).flat_map(|i| i.to_le_bytes()).collect()
    }

    fn expect(object: &[u8], raw: &[u8]) -> Expected {
        Expected {
            sha256: hex::encode(Sha256::digest(object)),
            size_bytes: object.len() as u64,
            raw_bytes: raw.len() as u64,
            decrypt: None,
            reader_may_stop: false,
        }
    }

    #[test]
    fn good_object_is_passed_whole() {
        let raw = data();
        let object = frame(&raw);
        let (r, out) = run_feed(object.clone(), expect(&object, &raw));
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(out, raw);
    }

    #[test]
    fn checksum_mismatch_holds_back_the_end() {
        let raw = data();
        let object = frame(&raw);
        let mut e = expect(&object, &raw);
        e.sha256 = "0".repeat(64);
        let (r, out) = run_feed(object, e);
        assert!(
            matches!(r, Err(FeedError::Integrity(ref m)) if m.contains("sha256")),
            "{r:?}"
        );
        assert_eq!(out.len(), raw.len() - HOLD_BACK);
    }

    #[test]
    fn truncated_object_fails_without_the_end() {
        let raw = data();
        let object = frame(&raw);
        let e = expect(&object, &raw);
        let cut = object[..object.len() - 100].to_vec();
        let (r, out) = run_feed(cut, e);
        assert!(matches!(r, Err(FeedError::Integrity(_))), "{r:?}");
        assert!(out.len() < raw.len());
    }

    #[test]
    fn flipped_byte_fails() {
        let raw = data();
        let mut object = frame(&raw);
        let e = expect(&object, &raw);
        let mid = object.len() / 2;
        object[mid] ^= 0x55;
        let (r, out) = run_feed(object, e);
        assert!(r.is_err());
        assert!(out.len() < raw.len());
    }

    /// Runs the feeder into a pipe whose reader takes 1,000 bytes and goes away.
    fn feed_a_reader_that_stops(object: Vec<u8>, expected: Expected) -> FeedResult {
        let (mut reader, writer) = std::io::pipe().unwrap();
        let stdin = std::fs::File::from(std::os::fd::OwnedFd::from(writer));
        let (tx, rx) = mpsc::channel(4);
        let t = std::thread::spawn(move || feed(rx, stdin, expected, 0));
        let stops = std::thread::spawn(move || {
            let mut first = vec![0u8; 1000];
            reader.read_exact(&mut first).unwrap();
        });
        for chunk in object.chunks(1000) {
            if tx.blocking_send(Ok(Bytes::copy_from_slice(chunk))).is_err() {
                break; // the feeder gave up
            }
        }
        drop(tx);
        stops.join().unwrap();
        t.join().unwrap()
    }

    type FeedResult = std::result::Result<(), FeedError>;

    #[test]
    fn a_reader_allowed_to_stop_early_still_has_the_whole_object_checked() {
        let raw = data();
        let object = frame(&raw);
        let mut e = expect(&object, &raw);
        e.reader_may_stop = true;
        let r = feed_a_reader_that_stops(object.clone(), e);
        assert!(r.is_ok(), "{r:?}");

        let mut e = expect(&object, &raw);
        e.reader_may_stop = true;
        e.sha256 = "0".repeat(64);
        let r = feed_a_reader_that_stops(object.clone(), e);
        assert!(
            matches!(r, Err(FeedError::Integrity(ref m)) if m.contains("sha256")),
            "{r:?}"
        );

        let r = feed_a_reader_that_stops(object.clone(), expect(&object, &raw));
        assert!(matches!(r, Err(FeedError::PgRestoreStopped(_))), "{r:?}");
    }

    #[test]
    fn download_error_is_reported_as_such() {
        let raw = data();
        let object = frame(&raw);
        let e = expect(&object, &raw);
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::File::create(dir.path().join("out")).unwrap();
        let (tx, rx) = mpsc::channel(4);
        let t = std::thread::spawn(move || feed(rx, file, e, 0));
        tx.blocking_send(Ok(Bytes::copy_from_slice(&object[..500])))
            .unwrap();
        tx.blocking_send(Err("connection reset".into())).unwrap();
        drop(tx);
        let r = t.join().unwrap();
        assert!(
            matches!(r, Err(FeedError::Download(ref m)) if m.contains("reset")),
            "{r:?}"
        );
    }
}
