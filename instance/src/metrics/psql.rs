//! Running one psql child for the metrics, bounded in wall-clock time: its output is read
//! while it runs, and it is killed (SIGKILL) when it outlives its limit, whatever it waits
//! for (a server that does not answer, a connection that hangs).
//!
//! I/O only. The child is spawned with `process::spawn_owned`, so the supervisor's reaper
//! (which reaps every child of PID 1) leaves its exit to this thread.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::process;

/// The application_name of the metrics' sessions (as the server's logs and
/// pg_stat_activity show them).
pub const APPLICATION_NAME: &str = "dbop-instance-metrics";

/// What a psql child printed.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub stdout: String,
    pub stderr: String,
    /// It was killed at its limit.
    pub killed: bool,
}

/// Runs `cmd` (stdout and stderr captured, `stdin` written to it, or nothing), killing it after
/// `limit`.
pub fn run(mut cmd: Command, stdin: Option<&str>, limit: Duration) -> std::io::Result<Outcome> {
    cmd.env_remove("PGPASSWORD")
        .env_remove("PGPASSFILE")
        .env("LC_ALL", "C")
        .env("PGAPPNAME", APPLICATION_NAME)
        .env(
            "PGCONNECT_TIMEOUT",
            limit.as_secs().clamp(2, 10).to_string(),
        )
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = process::spawn_owned(&mut cmd)?;
    let pid = child.id();
    let input = child.stdin.take();
    let mut out = child.stdout.take().expect("stdout is piped");
    let mut err = child.stderr.take().expect("stderr is piped");
    std::thread::scope(|scope| {
        if let (Some(mut input), Some(text)) = (input, stdin) {
            // A psql that dies early closes the pipe: the error is its own, reported below.
            scope.spawn(move || {
                let _ = input.write_all(text.as_bytes());
            });
        }
        let stdout = scope.spawn(move || {
            let mut bytes = Vec::new();
            let _ = out.read_to_end(&mut bytes);
            bytes
        });
        let stderr = scope.spawn(move || {
            let mut bytes = Vec::new();
            let _ = err.read_to_end(&mut bytes);
            bytes
        });
        let mut killed = false;
        while process::try_wait_owned(pid).is_none() {
            if !killed && started.elapsed() >= limit {
                process::kill_owned(pid);
                killed = true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
        Ok(Outcome {
            stdout: text(stdout.join().unwrap_or_default()),
            stderr: text(stderr.join().unwrap_or_default()),
            killed,
        })
    })
}
