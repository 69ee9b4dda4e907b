//! Storage faults against real servers, each followed by the next run: a server whose disk
//! fills up mid-upload (s3s-fs on a small tmpfs that only its own mount namespace sees), a slow
//! server (a throttling proxy in front of s3s-fs), and a server killed mid-upload and started
//! again. A fault must end in a clean failure naming the server and bucket, with nothing that
//! looks like a complete backup (no manifest, no dump object); the next run must succeed.

mod common;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// s3s-fs serving a tmpfs of a few MiB mounted in a private mount namespace (`unshare -m`): the
/// host never sees the mount, and it is gone with the process. Files are read through
/// `/proc/<pid>/root`, which shows the server's own view.
struct SmallDiskS3 {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl SmallDiskS3 {
    fn start(megabytes: u32) -> SmallDiskS3 {
        let dir = tempfile::Builder::new()
            .prefix("dbop-s3-small-")
            .tempdir()
            .unwrap();
        let port = free_port();
        let home = PathBuf::from(std::env::var_os("HOME").unwrap_or_default());
        let s3s = find_in_path("s3s-fs", &[home.join(".cargo/bin")])
            .unwrap_or_else(|| panic!("{}", install_hint("s3s-fs")));
        let script = r#"mount -t tmpfs -o size="$1"m dbop-s3-disk "$0" && mkdir "$0/backups" &&
            exec "$2" --host 127.0.0.1 --port "$3" --access-key "$4" --secret-key "$5" "$0""#;
        let mut child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", script])
            .arg(dir.path())
            .arg(megabytes.to_string())
            .arg(&s3s)
            .arg(port.to_string())
            .args([S3_ACCESS_KEY, S3_SECRET_KEY])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", install_hint("unshare (util-linux)")));
        wait_for_port(
            port,
            &mut child,
            "s3s-fs on a small tmpfs (needs root for unshare -m)",
        );
        SmallDiskS3 { child, port, dir }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every file the server stores, as it sees them (relative paths).
    fn files(&self) -> Vec<String> {
        let root = PathBuf::from(format!("/proc/{}/root", self.child.id()))
            .join(self.dir.path().strip_prefix("/").unwrap());
        let mut found = Vec::new();
        walk(&root, &root, &mut found);
        found.sort();
        found
    }
}

impl Drop for SmallDiskS3 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn walk(root: &Path, dir: &Path, found: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            walk(root, &path, found);
        } else {
            found.push(path.strip_prefix(root).unwrap().display().to_string());
        }
    }
}

fn complete_looking(keys: &[String]) -> Vec<&String> {
    keys.iter()
        .filter(|k| k.ends_with("manifest.json") || k.ends_with("dump.pgc.zst"))
        .collect()
}

#[test]
fn a_full_disk_fails_cleanly_and_the_next_backup_fits() {
    let pg = Pg::start();
    let s3 = SmallDiskS3::start(8);
    pg.create_db("app");
    // ~24 MiB of hard-to-compress rows: more than the 8 MiB disk holds, compressed.
    fill_bulky(&pg, "app", 24);
    let mut env = pg.env("app");
    env.extend(s3_env(&s3.endpoint()));
    let run = agent(&["dump", "--part-size", "5MiB"], &env);
    run.failed();
    let m = run.message();
    assert!(
        m.contains(&s3.endpoint()) && m.contains("bucket 'backups'"),
        "the failure names the server and bucket: {m}"
    );
    run.assert_no_secrets();
    let files = s3.files();
    assert!(complete_looking(&files).is_empty(), "{files:?}");
    assert!(
        files.iter().all(|f| !f.contains(".upload")),
        "the multipart upload was aborted and its parts freed: {files:?}"
    );
    println!("storage-faults: full disk → {m}");

    // The space is free again: a backup that fits succeeds on the same server (every database
    // is backed up, so the big one goes first).
    pg.psql("postgres", "DROP DATABASE app");
    pg.create_db("small");
    fill_varied(&pg, "small", 500, 1);
    let mut env = pg.env("small");
    env.extend(s3_env(&s3.endpoint()));
    let ok = agent(&["dump"], &env);
    let result = ok.ok();
    let files = s3.files();
    assert_eq!(complete_looking(&files).len(), 2, "{files:?}");
    assert!(
        files
            .iter()
            .any(|f| f.ends_with(result.key.as_deref().unwrap())),
        "{files:?}"
    );
}

/// A proxy in front of `upstream` that delays every chunk it forwards (both ways) by `delay`
/// and forwards at most `chunk` bytes at a time: a slow, high-latency server.
fn slow_proxy(upstream: u16, chunk: usize, delay: Duration) -> u16 {
    tcp_proxy(upstream, move |client, server| {
        let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        std::thread::spawn(move || pump(s2, c2, chunk, delay));
        pump(client, server, chunk, delay);
    })
}

fn pump(mut from: TcpStream, mut to: TcpStream, chunk: usize, delay: Duration) {
    let mut buf = vec![0u8; chunk];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 {
            break;
        }
        std::thread::sleep(delay);
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

#[test]
fn a_slow_server_still_gives_a_complete_and_correct_backup() {
    let pg = Pg::start();
    let s3 = S3Server::start(S3Kind::S3sFs);
    pg.create_db("app");
    fill_bulky(&pg, "app", 4);
    // 16 KiB per 20 ms each way: under 1 MiB/s, and 20 ms more on every request and answer.
    let proxy = slow_proxy(s3.port, 16 * 1024, Duration::from_millis(20));
    let mut env = pg.env("app");
    env.extend(s3_env(&format!("http://127.0.0.1:{proxy}")));
    let started = Instant::now();
    let run = agent(&["dump", "--part-size", "5MiB"], &env);
    let took = started.elapsed();
    let result = run.ok();
    let size = result.size_bytes.unwrap();
    println!("storage-faults: slow server: {size} bytes in {took:.1?}");
    assert!(
        took >= Duration::from_millis(20 * size / (16 * 1024)),
        "the proxy really slowed it down: {took:?} for {size} bytes"
    );
    // What the slow server stored is what the agent says it stored.
    let key = result.key.clone().unwrap();
    let stored = s3.get(&key);
    assert_eq!(stored.len() as u64, size);
    use sha2::Digest;
    assert_eq!(
        hex::encode(sha2::Sha256::digest(&stored)),
        result.sha256.clone().unwrap()
    );
    assert!(s3.keys("").iter().any(|k| k.ends_with("manifest.json")));
}

#[test]
fn after_s3_dies_mid_upload_the_next_run_succeeds() {
    let pg = Pg::start();
    let mut s3 = S3Server::start(S3Kind::S3sFs);
    pg.create_db("app");
    fill_bulky(&pg, "app", 32);
    let env = env_of(&pg, "app", &s3);
    let child = agent_command(
        &["dump", "--compression-level", "12", "--part-size", "5MiB"],
        &env,
    )
    .spawn()
    .expect("agent");
    wait_until(120, "the first part", || {
        s3.s3s_upload_files()
            .iter()
            .any(|f| f.starts_with(".upload_id-"))
    });
    s3.kill();
    let failed = parse_run(child.wait_with_output().unwrap());
    failed.failed();
    s3.restart();
    assert!(
        complete_looking(&s3.keys("")).is_empty(),
        "{:?}",
        s3.keys("")
    );

    // The next run (a new backup id, as the next scheduled Job has) completes.
    let next = agent(&["dump", "--part-size", "5MiB"], &env);
    let result = next.ok();
    let keys = s3.keys("");
    let complete = complete_looking(&keys);
    assert_eq!(complete.len(), 2, "one dump and its manifest: {keys:?}");
    assert!(complete.contains(&result.key.as_ref().unwrap()), "{keys:?}");
}
