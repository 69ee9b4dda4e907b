//! What the instance manager's real-PostgreSQL tests share: Debian's server binaries, the
//! `postgres` user to run them as when the tests run as root, and free loopback ports.

use std::path::PathBuf;
use std::process::Command;

/// The newest PostgreSQL under /usr/lib/postgresql: (major, bin dir).
pub fn server() -> (u32, PathBuf) {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL server packages (run backups/install-test-deps.sh)")
        .filter_map(|e| {
            let e = e.ok()?;
            let major = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").is_file().then_some((major, bin))
        })
        .collect();
    found.sort();
    found
        .pop()
        .expect("a PostgreSQL server under /usr/lib/postgresql")
}

/// The uid and gid to run as: `postgres` when root, else ourselves.
pub fn ids() -> Option<(u32, u32)> {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        return None;
    }
    let id = |flag: &str| -> u32 {
        let out = Command::new("id")
            .args([flag, "postgres"])
            .output()
            .unwrap();
        assert!(out.status.success(), "the postgres system user is missing");
        String::from_utf8(out.stdout)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    Some((id("-u"), id("-g")))
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Copies the manager's binary to `exe` (where the test's uid can run it) and waits until it
/// can be executed: a process another test thread forked while the copy was open for writing
/// holds that descriptor until it execs, and an exec meanwhile fails with "Text file busy".
pub fn copy_manager(exe: &std::path::Path) {
    std::fs::copy(env!("CARGO_BIN_EXE_dbop-instance"), exe).unwrap();
    for _ in 0..100 {
        match Command::new(exe).arg("--version").output() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => panic!("cannot run {}: {e}", exe.display()),
            Ok(_) => return,
        }
    }
    panic!("{} stayed busy", exe.display());
}

/// Polls `check` until it succeeds (every `every`), or panics after `deadline` with its last
/// reason: a wait on a condition, never a fixed sleep. (Not every test binary that includes
/// this module waits.)
#[allow(dead_code)]
pub fn wait_for<T>(
    what: &str,
    deadline: std::time::Duration,
    every: std::time::Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> T {
    let start = std::time::Instant::now();
    loop {
        match check() {
            Ok(value) => return value,
            Err(why) if start.elapsed() > deadline => {
                panic!("{what}: not within {deadline:?}: {why}")
            }
            Err(_) => std::thread::sleep(every),
        }
    }
}
