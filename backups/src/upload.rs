//! The streaming half of a dump: pg_dump's output compressed with zstd (frames with content
//! checksums) and its SHA-256 taken on the fly (`compress`, `compress_observed`), cut into parts
//! (`PartSink`) and uploaded at most `concurrency` at a time (`upload_parts`), with bounded
//! buffers whatever the database's size.

use std::collections::BTreeMap;
use std::io::{Read, Write};

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::archive::{FormatError, RowCounter};
use crate::crypto::{EncryptWriter, Key};
use crate::error::{Error, Result};
use crate::s3::Store;

const READ_CHUNK: usize = 256 << 10;
const ZSTD_JOB_SIZE: u32 = 2 << 20;

/// Rows per table, counted in the archive as it passed.
pub(crate) type StreamCounts = std::result::Result<BTreeMap<String, u64>, FormatError>;

/// What the compressor saw.
#[derive(Debug)]
pub(crate) struct Compressed {
    pub(crate) raw_bytes: u64,
    pub(crate) size_bytes: u64,
    pub(crate) sha256: String,
}

/// Uploads parts as they arrive, at most `concurrency` at once; returns them in order.
pub(crate) async fn upload_parts(
    store: &Store,
    key: &str,
    upload_id: &str,
    mut rx: mpsc::Receiver<Bytes>,
    concurrency: usize,
) -> Result<Vec<aws_sdk_s3::types::CompletedPart>> {
    let mut in_flight = FuturesUnordered::new();
    let mut done = Vec::new();
    let mut next_part: i32 = 0;
    let mut input_open = true;
    while input_open || !in_flight.is_empty() {
        tokio::select! {
            Some(r) = in_flight.next(), if !in_flight.is_empty() => done.push(r?),
            part = rx.recv(), if input_open && in_flight.len() < concurrency => match part {
                Some(body) => {
                    next_part += 1;
                    if next_part > 10_000 {
                        return Err(Error::Usage(
                            "the dump needs more than 10000 parts: raise --part-size".into(),
                        ));
                    }
                    tracing::debug!(part = next_part, bytes = body.len(), "uploading part");
                    in_flight.push(store.upload_part(key, upload_id, next_part, body));
                }
                None => input_open = false,
            },
        }
    }
    done.sort_by_key(|p: &aws_sdk_s3::types::CompletedPart| p.part_number());
    Ok(done)
}

/// Collects compressed bytes into parts of `part_size`, hashing them, and hands each full
/// part to the uploader (blocking while the channel is full: that is the back-pressure).
pub(crate) struct PartSink {
    buf: Vec<u8>,
    part_size: usize,
    tx: mpsc::Sender<Bytes>,
    hasher: Sha256,
    total: u64,
}

impl PartSink {
    fn send(&mut self) -> std::io::Result<()> {
        let part = std::mem::replace(&mut self.buf, Vec::with_capacity(self.part_size));
        self.hasher.update(&part);
        self.total += part.len() as u64;
        self.tx
            .blocking_send(Bytes::from(part))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the upload stopped"))
    }
}

impl Write for PartSink {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = data.len().min(self.part_size - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= self.part_size {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Where the compressed stream goes: the parts, or the parts through the cipher (so the
/// parts, their SHA-256 and size are of the ciphertext: what is stored).
enum Out {
    Plain(PartSink),
    Sealed(EncryptWriter<PartSink>),
}

impl Out {
    fn finish(self) -> std::io::Result<PartSink> {
        match self {
            Out::Plain(sink) => Ok(sink),
            Out::Sealed(w) => w.finish(),
        }
    }
}

impl Write for Out {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        match self {
            Out::Plain(sink) => sink.write(data),
            Out::Sealed(w) => w.write(data),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// How the compressor encrypts: the key and the object's context (`manifest::object_context`).
pub(crate) type Sealing = Option<(Key, String)>;

/// The compressor thread: reads pg_dump's output until EOF, writes one zstd frame with a
/// content checksum (encrypted on its way to the parts when `sealing` says so) and counts rows
/// in the archive on the way. Reaching EOF says nothing about success: the caller checks
/// pg_dump's exit.
pub(crate) fn compress(
    src: std::fs::File,
    level_threads: (i32, u32),
    part_size: usize,
    sealing: Sealing,
    (tx, mut counter): (mpsc::Sender<Bytes>, RowCounter),
) -> std::io::Result<(Compressed, StreamCounts)> {
    // After an error the counter only repeats it: stop spending time on it.
    let mut counting = true;
    let mut observe = |chunk: &[u8]| counting = counting && counter.feed(chunk).is_ok();
    let compressed = compress_observed(src, level_threads, part_size, sealing, tx, &mut observe)?;
    Ok((compressed, counter.finish()))
}

/// Reads `src` until EOF into one zstd frame with a content checksum (encrypted on its way to
/// the parts when `sealing` says so), showing every chunk read to `observe` (the dump's row
/// counter, the base backup's tar reader).
pub(crate) fn compress_observed(
    mut src: impl Read,
    (level, threads): (i32, u32),
    part_size: usize,
    sealing: Sealing,
    tx: mpsc::Sender<Bytes>,
    observe: &mut dyn FnMut(&[u8]),
) -> std::io::Result<Compressed> {
    let mut enc = zstd::stream::write::Encoder::new(parts_out(part_size, sealing, tx)?, level)?;
    enc.include_checksum(true)?;
    if threads > 0 {
        enc.multithread(threads)?;
        // Small jobs keep zstd's buffers (and so the agent's memory) small.
        enc.set_parameter(zstd::zstd_safe::CParameter::JobSize(ZSTD_JOB_SIZE))?;
    }
    let mut buf = vec![0u8; READ_CHUNK];
    let mut raw_bytes = 0u64;
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        raw_bytes += n as u64;
        observe(&buf[..n]);
        enc.write_all(&buf[..n])?;
    }
    finish_parts(enc.finish()?, raw_bytes)
}

/// Stores what arrives on `rx` as it is (already compressed: the server's zstd), encrypted on
/// its way to the parts when `sealing` says so, showing every chunk to `observe`. `raw_bytes`
/// is left at 0: only the caller knows the size before compression.
pub(crate) fn store_observed(
    mut rx: mpsc::Receiver<Bytes>,
    part_size: usize,
    sealing: Sealing,
    tx: mpsc::Sender<Bytes>,
    observe: &mut dyn FnMut(&[u8]) -> std::io::Result<()>,
) -> std::io::Result<Compressed> {
    let mut out = parts_out(part_size, sealing, tx)?;
    while let Some(chunk) = rx.blocking_recv() {
        observe(&chunk)?;
        out.write_all(&chunk)?;
    }
    finish_parts(out, 0)
}

/// The parts' writer: plain, or through the cipher.
fn parts_out(part_size: usize, sealing: Sealing, tx: mpsc::Sender<Bytes>) -> std::io::Result<Out> {
    let sink = PartSink {
        buf: Vec::with_capacity(part_size),
        part_size,
        tx,
        hasher: Sha256::new(),
        total: 0,
    };
    Ok(match sealing {
        Some((key, context)) => Out::Sealed(EncryptWriter::new(sink, &key, &context)?),
        None => Out::Plain(sink),
    })
}

/// Sends the last part; the stored size and SHA-256.
fn finish_parts(out: Out, raw_bytes: u64) -> std::io::Result<Compressed> {
    let mut sink = out.finish()?;
    if !sink.buf.is_empty() {
        sink.send()?;
    }
    Ok(Compressed {
        raw_bytes,
        size_bytes: sink.total,
        sha256: hex::encode(sink.hasher.finalize()),
    })
}
