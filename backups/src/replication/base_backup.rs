//! `BASE_BACKUP` over the agent's own connection: the command (pure), then the server's answer
//! read in its order: the start position, the tablespaces, the copy stream (`n` a new archive,
//! `d` the archive's or the manifest's bytes, `m` the manifest follows, `p` progress), the end
//! position. The archive's bytes go to `archive` as they come (compressed by the server when
//! asked); the manifest is kept whole (it is small: one line per file).

use bytes::Bytes;
use postgres_protocol::message::backend::{DataRowBody, Message};
use tokio::sync::mpsc;

use super::wire::{Connection, unexpected};

/// What the backup asks of the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub label: String,
    pub fast_checkpoint: bool,
    /// `MANIFEST_CHECKSUMS`: `NONE`, `CRC32C`, `SHA224`, … (pg_basebackup's names).
    pub manifest_checksums: String,
    /// Server-side zstd: the level and the worker threads (0: none beside the sender).
    pub level: i32,
    pub workers: u32,
}

/// `BASE_BACKUP (…)` as PostgreSQL 15 reads it; `-X none` as the agent's pg_basebackup ran it
/// (the archive has the WAL), waiting for the end segment to be archived (the default).
pub fn command(r: &Request) -> String {
    let checkpoint = if r.fast_checkpoint { "fast" } else { "spread" };
    let detail = match r.workers {
        0 => format!("level={}", r.level),
        n => format!("level={},workers={n}", r.level),
    };
    format!(
        "BASE_BACKUP (LABEL {}, CHECKPOINT '{checkpoint}', MANIFEST 'yes', MANIFEST_CHECKSUMS {}, COMPRESSION 'zstd', COMPRESSION_DETAIL '{detail}')",
        quote(&r.label),
        quote(&r.manifest_checksums),
    )
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// What the server answered besides the archive's bytes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Answer {
    /// `(LSN, timeline)` where the backup starts and where it ends.
    pub start: (String, String),
    pub end: (String, String),
    pub archive_name: String,
    /// The archive's size before the server compressed it (its last progress report).
    pub archive_bytes: Option<u64>,
    pub manifest: Vec<u8>,
}

/// Where a CopyData payload goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Into {
    Nothing,
    Archive,
    Manifest,
}

/// Sends the command and reads the answer to its end; the archive's bytes go to `archive`.
pub async fn run(
    conn: &mut Connection,
    request: &Request,
    archive: &mpsc::Sender<Bytes>,
    max_manifest: usize,
) -> Result<Answer, String> {
    conn.query(&command(request)).await?;
    let mut answer = Answer::default();
    let mut result_sets = 0;
    let mut into = Into::Nothing;
    loop {
        match conn.next().await? {
            Message::RowDescription(_) => result_sets += 1,
            Message::DataRow(row) => match result_sets {
                1 => answer.start = position(&row)?,
                2 => check_tablespace(&row)?,
                3 => answer.end = position(&row)?,
                _ => return Err("a result the base backup does not have".into()),
            },
            Message::CommandComplete(_) | Message::CopyOutResponse(_) | Message::CopyDone => {}
            Message::NoticeResponse(_) => {}
            Message::CopyData(body) => {
                let data = body.into_bytes();
                into = match (data.first(), into) {
                    (Some(b'n'), Into::Nothing) => {
                        answer.archive_name = archive_name(&data[1..])?;
                        Into::Archive
                    }
                    (Some(b'n'), _) => {
                        return Err("a second archive: the instance has a tablespace besides the main one, which a base backup to S3 does not hold".into());
                    }
                    (Some(b'm'), _) => Into::Manifest,
                    (Some(b'p'), into) => {
                        if into == Into::Archive {
                            answer.archive_bytes = progress(&data[1..]);
                        }
                        into
                    }
                    (Some(b'd'), Into::Archive) => {
                        archive
                            .send(data.slice(1..))
                            .await
                            .map_err(|_| "the upload stopped".to_string())?;
                        Into::Archive
                    }
                    (Some(b'd'), Into::Manifest) => {
                        if answer.manifest.len() + data.len() > max_manifest {
                            return Err(format!(
                                "the backup manifest is over {max_manifest} bytes"
                            ));
                        }
                        answer.manifest.extend_from_slice(&data[1..]);
                        Into::Manifest
                    }
                    _ => return Err("a copy message out of order".into()),
                };
            }
            Message::ReadyForQuery(_) => break,
            other => return Err(unexpected(&other)),
        }
    }
    if answer.archive_name.is_empty() || answer.end.0.is_empty() || answer.manifest.is_empty() {
        return Err(
            "the server ended the base backup without an archive, a manifest or an end position"
                .into(),
        );
    }
    Ok(answer)
}

/// `n`'s payload: the archive's name, then the tablespace's location, each ending in a zero.
fn archive_name(payload: &[u8]) -> Result<String, String> {
    let end = payload
        .iter()
        .position(|b| *b == 0)
        .ok_or("an archive without a name")?;
    Ok(String::from_utf8_lossy(&payload[..end]).into_owned())
}

/// `p`'s payload: the bytes of archive done so far (before compression), an int64.
fn progress(payload: &[u8]) -> Option<u64> {
    let bytes: [u8; 8] = payload.get(..8)?.try_into().ok()?;
    u64::try_from(i64::from_be_bytes(bytes)).ok()
}

/// A row's text columns (`None` for NULL).
fn columns(row: &DataRowBody) -> Result<Vec<Option<String>>, String> {
    use fallible_iterator::FallibleIterator;
    let buffer = row.buffer();
    row.ranges()
        .map(|r| Ok(r.map(|r| String::from_utf8_lossy(&buffer[r]).into_owned())))
        .collect()
        .map_err(|e: std::io::Error| e.to_string())
}

fn position(row: &DataRowBody) -> Result<(String, String), String> {
    match columns(row)?.as_slice() {
        [Some(lsn), Some(tli), ..] => Ok((lsn.clone(), tli.clone())),
        _ => Err("a WAL position without its LSN or timeline".into()),
    }
}

/// The tablespaces: the main one has no location; any other is refused before a byte moves.
fn check_tablespace(row: &DataRowBody) -> Result<(), String> {
    match columns(row)?.get(1) {
        Some(Some(location)) => Err(format!(
            "the instance has a tablespace at {location}; a base backup to S3 holds the main one only"
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_asks_for_server_side_zstd_and_the_manifest() {
        let mut r = Request {
            label: "dbop 20261207T142000Z".into(),
            fast_checkpoint: true,
            manifest_checksums: "CRC32C".into(),
            level: 1,
            workers: 2,
        };
        assert_eq!(
            command(&r),
            "BASE_BACKUP (LABEL 'dbop 20261207T142000Z', CHECKPOINT 'fast', MANIFEST 'yes', MANIFEST_CHECKSUMS 'CRC32C', COMPRESSION 'zstd', COMPRESSION_DETAIL 'level=1,workers=2')"
        );
        r.label = "it's".into();
        r.workers = 0;
        r.level = -3;
        r.fast_checkpoint = false;
        let c = command(&r);
        assert!(c.contains("LABEL 'it''s'"), "{c}");
        assert!(c.contains("CHECKPOINT 'spread'"), "{c}");
        assert!(c.ends_with("COMPRESSION_DETAIL 'level=-3')"), "{c}");
    }

    #[test]
    fn an_archive_s_name_ends_at_its_zero() {
        assert_eq!(archive_name(b"base.tar.zst\0\0").unwrap(), "base.tar.zst");
        assert!(archive_name(b"no end").is_err());
    }

    #[test]
    fn a_progress_report_is_a_big_endian_count() {
        assert_eq!(
            progress(&2_248_443_904i64.to_be_bytes()),
            Some(2_248_443_904)
        );
        assert_eq!(progress(&(-1i64).to_be_bytes()), None);
        assert_eq!(progress(b"short"), None);
    }
}
