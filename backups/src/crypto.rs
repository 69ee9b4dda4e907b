//! Client-side encryption of a backup's objects: every dump, `globals.sql` and the manifest's
//! contents, with a 32-byte key the agent reads from a file (a Kubernetes Secret mounted as a
//! directory, one file per key name).
//!
//! The cipher is XChaCha20-Poly1305 (the `chacha20poly1305` crate of RustCrypto) in the STREAM
//! construction of the `aead` crate (`stream::EncryptorBE32`; Hoang, Reyhanitabar, Rogaway and
//! Vizár, "Online Authenticated-Encryption and its Nonce-Reuse Misuse-Resistance"): the object
//! is cut into 64 KiB segments, each sealed with its own nonce (a random 19-byte prefix per
//! object, a 32-bit counter and a last-segment flag) and tag, so it streams in constant memory
//! and a reordered, dropped, truncated or changed segment fails to open. Nothing here is a
//! primitive of our own: only the framing.
//!
//! An object is `MAGIC` (8 bytes) ‖ nonce prefix (19 bytes) ‖ segments of 64 KiB + 16-byte tag,
//! the last one shorter (possibly empty plaintext). Every segment's associated data is the
//! header and the object's context (`<backup id>/<file>`), so an object cannot be passed off as
//! another file or another backup's.
//!
//! Pure apart from `KeyRing`, which reads the key files.

use std::io::Write;
use std::path::{Path, PathBuf};

use chacha20poly1305::aead::rand_core::RngCore;
use chacha20poly1305::aead::stream::{DecryptorBE32, EncryptorBE32};
use chacha20poly1305::aead::{KeyInit, OsRng};
use chacha20poly1305::{Key as CipherKey, XChaCha20Poly1305};
use sha2::{Digest, Sha256};

/// The first bytes of every encrypted object (and the format's version).
pub const MAGIC: &[u8; 8] = b"DBOPENC1";
/// The manifest's name for the format.
pub const ALGORITHM: &str = "xchacha20poly1305-stream64k";
/// Plaintext bytes per segment.
pub const SEGMENT: usize = 64 << 10;
const TAG: usize = 16;
const NONCE_PREFIX: usize = 19;
/// Bytes before the first segment.
pub const HEADER: usize = MAGIC.len() + NONCE_PREFIX;
/// The length of a key.
pub const KEY_BYTES: usize = 32;

/// One key, by the name the manifest records. Its bytes never leave this module except into
/// the cipher; `Debug` shows the name and fingerprint only.
#[derive(Clone)]
pub struct Key {
    pub name: String,
    bytes: [u8; KEY_BYTES],
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key")
            .field("name", &self.name)
            .field("fingerprint", &self.fingerprint())
            .finish()
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        for b in self.bytes.iter_mut() {
            // SAFETY: a plain write to memory we own; volatile so it is not optimised away.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

/// How to make a key, for every message about a bad one.
pub const KEY_HINT: &str =
    "a key is the base64 of 32 random bytes, e.g. the output of `openssl rand -base64 32`";

impl Key {
    /// Reads a key from the text of its file: base64 of exactly 32 bytes, surrounding
    /// whitespace ignored. The message never contains the text.
    pub fn parse(name: &str, text: &[u8]) -> Result<Key, String> {
        use base64::Engine as _;
        let trimmed = text.trim_ascii();
        if trimmed.is_empty() {
            return Err(format!("encryption key {name:?} is empty; {KEY_HINT}"));
        }
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(trimmed)
            .map_err(|_| format!("encryption key {name:?} is not base64; {KEY_HINT}"))?;
        let Ok(bytes) = <[u8; KEY_BYTES]>::try_from(decoded.as_slice()) else {
            return Err(format!(
                "encryption key {name:?} decodes to {} bytes, not 32; {KEY_HINT}",
                decoded.len()
            ));
        };
        if bytes.iter().all(|b| *b == bytes[0]) {
            return Err(format!(
                "encryption key {name:?} is one byte repeated, not random; {KEY_HINT}"
            ));
        }
        Ok(Key {
            name: name.to_string(),
            bytes,
        })
    }

    /// A name for the key that reveals nothing of it: the first 16 bytes of the SHA-256 of a
    /// fixed label and the key, in hex. Recorded in the manifest, so a different key under the
    /// same name is found before anything is decrypted.
    pub fn fingerprint(&self) -> String {
        let mut h = Sha256::new();
        h.update(b"dbop-backup key fingerprint v1\0");
        h.update(self.bytes);
        hex::encode(&h.finalize()[..16])
    }

    fn cipher(&self) -> XChaCha20Poly1305 {
        XChaCha20Poly1305::new(CipherKey::from_slice(&self.bytes))
    }
}

/// The keys of a directory holding one file per key name (a Secret mounted as a volume).
#[derive(Debug, Clone)]
pub struct KeyRing {
    pub dir: PathBuf,
}

impl KeyRing {
    /// The key named `name`, read and checked. A missing file says which names the directory
    /// has (names only).
    pub fn get(&self, name: &str) -> Result<Key, String> {
        if name.is_empty() || name.starts_with('.') || name.contains('/') {
            return Err(format!("{name:?} is not a key name"));
        }
        let path = self.dir.join(name);
        match std::fs::read(&path) {
            Ok(text) => Key::parse(name, &text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!(
                "the key directory {} has no key {name:?} (it has: {})",
                self.dir.display(),
                self.names().join(", ")
            )),
            Err(e) => Err(format!(
                "cannot read encryption key {}: {e}",
                path.display()
            )),
        }
    }

    /// The key names present, sorted (Secret volumes also hold `..data` links: skipped).
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.dir)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok())
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| !n.starts_with('.'))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }
}

/// The key a backup uses and where its keys are: the ring, and the name of the key to write
/// with (`dump`); reading picks the key the manifest names.
#[derive(Debug, Clone)]
pub struct KeyChoice {
    pub ring: KeyRing,
    pub write_with: Option<String>,
}

impl KeyChoice {
    pub fn new(dir: Option<&Path>, write_with: Option<&str>) -> Option<KeyChoice> {
        dir.map(|d| KeyChoice {
            ring: KeyRing {
                dir: d.to_path_buf(),
            },
            write_with: write_with.map(str::to_string),
        })
    }
}

/// Associated data of every segment of one object.
fn associated_data(header: &[u8], context: &str) -> Vec<u8> {
    let mut aad = Vec::with_capacity(header.len() + context.len());
    aad.extend_from_slice(header);
    aad.extend_from_slice(context.as_bytes());
    aad
}

/// Encrypts what is written to it into `inner`, segment by segment; `finish` seals the last.
pub struct EncryptWriter<W: Write> {
    inner: W,
    stream: Option<EncryptorBE32<XChaCha20Poly1305>>,
    aad: Vec<u8>,
    buf: Vec<u8>,
}

impl<W: Write> EncryptWriter<W> {
    /// Writes the header (a fresh random nonce prefix) to `inner`.
    pub fn new(mut inner: W, key: &Key, context: &str) -> std::io::Result<Self> {
        let mut prefix = [0u8; NONCE_PREFIX];
        OsRng.fill_bytes(&mut prefix);
        let mut header = Vec::with_capacity(HEADER);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&prefix);
        inner.write_all(&header)?;
        let stream = EncryptorBE32::from_aead(key.cipher(), prefix.as_slice().into());
        Ok(EncryptWriter {
            inner,
            stream: Some(stream),
            aad: associated_data(&header, context),
            buf: Vec::with_capacity(SEGMENT + TAG),
        })
    }

    /// Seals the full segments in the buffer but one byte, so the last segment is always
    /// sealed as the last one by `finish`.
    fn seal_full(&mut self) -> std::io::Result<()> {
        while self.buf.len() > SEGMENT {
            let rest = self.buf.split_off(SEGMENT);
            let mut segment = std::mem::replace(&mut self.buf, rest);
            let stream = self.stream.as_mut().ok_or_else(finished)?;
            stream
                .encrypt_next_in_place(&self.aad, &mut segment)
                .map_err(|_| std::io::Error::other("encryption failed"))?;
            self.inner.write_all(&segment)?;
        }
        Ok(())
    }

    /// Seals the last segment and returns the inner writer.
    pub fn finish(mut self) -> std::io::Result<W> {
        self.seal_full()?;
        let stream = self.stream.take().ok_or_else(finished)?;
        let mut last = std::mem::take(&mut self.buf);
        stream
            .encrypt_last_in_place(&self.aad, &mut last)
            .map_err(|_| std::io::Error::other("encryption failed"))?;
        self.inner.write_all(&last)?;
        Ok(self.inner)
    }

    pub fn get_ref(&self) -> &W {
        &self.inner
    }
}

fn finished() -> std::io::Error {
    std::io::Error::other("the encrypted stream was already finished")
}

impl<W: Write> Write for EncryptWriter<W> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        self.seal_full()?;
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Encrypts a small object whole.
pub fn seal(key: &Key, context: &str, plaintext: &[u8]) -> Vec<u8> {
    let mut out =
        Vec::with_capacity(HEADER + plaintext.len() + TAG * (1 + plaintext.len() / SEGMENT));
    let sealed = EncryptWriter::new(&mut out, key, context)
        .and_then(|mut w| w.write_all(plaintext).map(|()| w))
        .and_then(|w| w.finish().map(|_| ()));
    debug_assert!(sealed.is_ok(), "writing to a Vec does not fail");
    out
}

/// Decrypts a small object whole.
pub fn open(key: &Key, context: &str, object: &[u8]) -> Result<Vec<u8>, String> {
    let mut d = Decrypt::new(key.clone(), context);
    let mut out = Vec::with_capacity(object.len());
    d.push(object, &mut out)?;
    d.finish(&mut out)?;
    Ok(out)
}

/// Decrypts an object pushed in pieces of any size: each segment is opened (and so
/// authenticated) before its plaintext is given out; `finish` opens the last one, so a
/// truncated object fails there.
pub struct Decrypt {
    key: Key,
    context: String,
    stream: Option<(DecryptorBE32<XChaCha20Poly1305>, Vec<u8>)>,
    pending: Vec<u8>,
    done: bool,
}

impl Decrypt {
    pub fn new(key: Key, context: &str) -> Decrypt {
        Decrypt {
            key,
            context: context.to_string(),
            stream: None,
            pending: Vec::with_capacity(SEGMENT + TAG + 1),
            done: false,
        }
    }

    fn refused(&self) -> String {
        format!(
            "it does not decrypt with key {:?} (fingerprint {}): the object was changed after it was written",
            self.key.name,
            self.key.fingerprint()
        )
    }

    /// Takes ciphertext, appends the plaintext of every segment known not to be the last.
    pub fn push(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        if self.done {
            return Err("data after the end of the encrypted object".into());
        }
        self.pending.extend_from_slice(data);
        if self.stream.is_none() {
            if self.pending.len() < HEADER {
                return Ok(());
            }
            if &self.pending[..MAGIC.len()] != MAGIC {
                return Err("it is not an object encrypted by dbop-backup (no header)".into());
            }
            let header: Vec<u8> = self.pending.drain(..HEADER).collect();
            let stream = DecryptorBE32::from_aead(self.key.cipher(), header[MAGIC.len()..].into());
            self.stream = Some((stream, associated_data(&header, &self.context)));
        }
        while self.pending.len() > SEGMENT + TAG {
            let rest = self.pending.split_off(SEGMENT + TAG);
            let mut segment = std::mem::replace(&mut self.pending, rest);
            let refused = self.refused();
            let Some((stream, aad)) = self.stream.as_mut() else {
                return Err(refused);
            };
            stream
                .decrypt_next_in_place(aad, &mut segment)
                .map_err(|_| refused)?;
            out.extend_from_slice(&segment);
        }
        Ok(())
    }

    /// The end of the ciphertext: opens the last segment.
    pub fn finish(&mut self, out: &mut Vec<u8>) -> Result<(), String> {
        if self.done {
            return Ok(());
        }
        self.done = true;
        let refused = self.refused();
        let Some((stream, aad)) = self.stream.take() else {
            return Err("it is too short to be an encrypted object (truncated)".into());
        };
        let mut last = std::mem::take(&mut self.pending);
        if last.len() < TAG {
            return Err(format!("{refused} (truncated)"));
        }
        stream
            .decrypt_last_in_place(&aad, &mut last)
            .map_err(|_| refused)?;
        out.extend_from_slice(&last);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    fn key(name: &str, seed: u8) -> Key {
        let bytes: Vec<u8> = (0..32u8)
            .map(|i| i.wrapping_mul(7).wrapping_add(seed))
            .collect();
        let text = base64::engine::general_purpose::STANDARD.encode(bytes);
        Key::parse(name, text.as_bytes()).unwrap()
    }

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i % 251) as u8).collect()
    }

    /// Pushes `object` in pieces of `piece` bytes.
    fn open_in_pieces(
        key: &Key,
        context: &str,
        object: &[u8],
        piece: usize,
    ) -> Result<Vec<u8>, String> {
        let mut d = Decrypt::new(key.clone(), context);
        let mut out = Vec::new();
        for chunk in object.chunks(piece.max(1)) {
            d.push(chunk, &mut out)?;
        }
        d.finish(&mut out)?;
        Ok(out)
    }

    #[test]
    fn round_trips_at_every_segment_boundary() {
        let k = key("k1", 1);
        for n in [
            0,
            1,
            SEGMENT - 1,
            SEGMENT,
            SEGMENT + 1,
            2 * SEGMENT,
            3 * SEGMENT + 17,
        ] {
            let plain = data(n);
            let object = seal(&k, "b/dump", &plain);
            assert_eq!(&object[..8], MAGIC);
            for piece in [1000, 4096, SEGMENT + TAG, object.len()] {
                assert_eq!(
                    open_in_pieces(&k, "b/dump", &object, piece).unwrap(),
                    plain,
                    "{n} {piece}"
                );
            }
        }
    }

    #[test]
    fn the_stream_writer_matches_small_writes() {
        let k = key("k1", 1);
        let plain = data(3 * SEGMENT + 5);
        let mut w = EncryptWriter::new(Vec::new(), &k, "ctx").unwrap();
        for chunk in plain.chunks(777) {
            w.write_all(chunk).unwrap();
        }
        let object = w.finish().unwrap();
        assert_eq!(object.len(), HEADER + plain.len() + 4 * TAG);
        assert_eq!(open(&k, "ctx", &object).unwrap(), plain);
    }

    #[test]
    fn changes_are_refused() {
        let k = key("k1", 1);
        let plain = data(2 * SEGMENT + 100);
        let object = seal(&k, "b/dump", &plain);
        // Every kind of change: a flipped byte anywhere, truncation (also at a segment
        // boundary), a dropped segment, another context, another key.
        for at in [0, 9, HEADER, HEADER + SEGMENT + 3, object.len() - 1] {
            let mut bad = object.clone();
            bad[at] ^= 1;
            assert!(open(&k, "b/dump", &bad).is_err(), "flip at {at}");
        }
        for cut in [1, TAG, object.len() - HEADER - (SEGMENT + TAG)] {
            assert!(
                open(&k, "b/dump", &object[..object.len() - cut]).is_err(),
                "cut {cut}"
            );
        }
        let mut dropped = object[..HEADER].to_vec();
        dropped.extend_from_slice(&object[HEADER + SEGMENT + TAG..]);
        assert!(open(&k, "b/dump", &dropped).is_err());
        assert!(open(&k, "c/dump", &object).is_err(), "another backup's");
        let e = open(&key("k1", 2), "b/dump", &object).unwrap_err();
        assert!(e.contains("does not decrypt with key \"k1\""), "{e}");
        assert!(open(&k, "b/dump", b"plain text, not encrypted at all").is_err());
    }

    #[test]
    fn the_same_plaintext_encrypts_differently_each_time() {
        let k = key("k1", 1);
        assert_ne!(seal(&k, "x", b"same"), seal(&k, "x", b"same"));
    }

    #[test]
    fn keys_are_base64_of_32_random_bytes() {
        let good = base64::engine::general_purpose::STANDARD.encode(data(32));
        assert!(Key::parse("k", format!("  {good}\n").as_bytes()).is_ok());
        let cases: [(&[u8], &str); 5] = [
            (b"", "empty"),
            (b"not base64 !!", "not base64"),
            (b"c2hvcnQ=", "decodes to 5 bytes"),
            (
                b"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
                "not random",
            ),
            (b"0123456789abcdef0123456789abcdef", "decodes to 24 bytes"),
        ];
        for (text, want) in cases {
            let e = Key::parse("k", text).unwrap_err();
            assert!(
                e.contains(want) && e.contains("openssl rand -base64 32"),
                "{e}"
            );
            assert!(
                text.is_empty() || !e.contains(std::str::from_utf8(text).unwrap()),
                "{e}"
            );
        }
    }

    #[test]
    fn fingerprints_tell_keys_apart_and_debug_hides_the_bytes() {
        let (a, b) = (key("k", 1), key("k", 2));
        assert_ne!(a.fingerprint(), b.fingerprint());
        assert_eq!(a.fingerprint(), key("other", 1).fingerprint());
        assert_eq!(a.fingerprint().len(), 32);
        let shown = format!("{a:?}");
        assert!(
            shown.contains(&a.fingerprint()) && !shown.contains("bytes"),
            "{shown}"
        );
    }

    #[test]
    fn a_key_ring_reads_files_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let good = base64::engine::general_purpose::STANDARD.encode(data(32));
        std::fs::write(dir.path().join("k1"), &good).unwrap();
        std::fs::write(dir.path().join("bad"), "no pe!").unwrap();
        let ring = KeyRing {
            dir: dir.path().into(),
        };
        assert_eq!(ring.get("k1").unwrap().name, "k1");
        assert!(ring.get("bad").unwrap_err().contains("not base64"));
        let e = ring.get("k2").unwrap_err();
        assert!(e.contains("no key \"k2\"") && e.contains("bad, k1"), "{e}");
        assert!(ring.get("../k1").is_err());
    }
}
