//! The lock files a server keeps, as the manager judges them: the data directory's
//! `postmaster.pid` and the socket's `.s.PGSQL.<port>.lock` (in the socket directory, a volume
//! that outlives the container). Whether a server runs on the data directory, and the removal
//! of a lock file a killed server left behind.
//!
//! PostgreSQL takes its lock file for a live server's when the PID in it is alive and is not
//! its own, its parent's or its grandparent's. In a container that restarted, PIDs count from
//! 1 again: the PID of the server killed before the restart is soon a thread of this manager
//! or a tool it runs, and PostgreSQL — or `pg_rewind`'s single-user crash recovery — refuses to
//! start ("lock file "postmaster.pid" already exists"). The manager knows better: a server runs
//! on the data directory only when that PID is a process (not a thread of the manager) whose
//! working directory is the data directory, as a postmaster's is. Any other file is stale, and
//! removing it is what PostgreSQL itself would do with a dead PID.

use std::path::Path;

/// What the lock file says, as far as the manager is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PidFile {
    /// No lock file, or one naming no PID.
    Absent,
    /// A server runs on the data directory with this PID.
    Running(i32),
    /// The PID is gone, or is something else than a server on this data directory.
    Stale(i32),
}

/// What `/proc` says of a PID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Process {
    Gone,
    /// A thread of another process (`/proc/PID/status`' `Tgid` is not the PID).
    Thread,
    /// A process of another user: the manager may not read its working directory.
    OtherUser,
    /// A process, and its working directory.
    Alive {
        cwd: std::path::PathBuf,
    },
}

/// Pure: the verdict on the lock file naming `pid` (`None`: none), `me` being the manager's
/// PID, and `pgdata` the data directory as `/proc` shows working directories (canonical).
pub fn judge(pid: Option<i32>, process: &Process, me: i32, pgdata: &Path) -> PidFile {
    let Some(pid) = pid.filter(|p| *p > 0) else {
        return PidFile::Absent;
    };
    if pid == me {
        return PidFile::Stale(pid);
    }
    match process {
        // Another user's process is no server on this data directory, which belongs to the
        // manager's user (PostgreSQL too takes EPERM from kill(PID, 0) for a dead PID).
        Process::Gone | Process::Thread | Process::OtherUser => PidFile::Stale(pid),
        Process::Alive { cwd } if cwd == pgdata => PidFile::Running(pid),
        Process::Alive { .. } => PidFile::Stale(pid),
    }
}

/// The first line of `postmaster.pid`, when it is a PID.
pub fn parse_pid(text: &str) -> Option<i32> {
    text.lines().next()?.trim().parse().ok()
}

/// Reads `/proc` about `pid`.
fn process(pid: i32) -> Process {
    let proc_dir = Path::new("/proc").join(pid.to_string());
    let Ok(status) = std::fs::read_to_string(proc_dir.join("status")) else {
        return Process::Gone;
    };
    let tgid = status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse::<i32>().ok());
    if tgid.is_some_and(|t| t != pid) {
        return Process::Thread;
    }
    match std::fs::read_link(proc_dir.join("cwd")) {
        Ok(cwd) => Process::Alive { cwd },
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Process::OtherUser,
        Err(_) => Process::Gone,
    }
}

/// The verdict on `pgdata`'s lock file.
pub fn read(pgdata: &Path) -> PidFile {
    read_lock(&pgdata.join("postmaster.pid"), pgdata)
}

/// The verdict on the lock file `lock` of a server on `pgdata`.
fn read_lock(lock: &Path, pgdata: &Path) -> PidFile {
    let pid = std::fs::read_to_string(lock)
        .ok()
        .and_then(|t| parse_pid(&t));
    let canonical = std::fs::canonicalize(pgdata).unwrap_or_else(|_| pgdata.to_path_buf());
    let seen = pid.map_or(Process::Gone, process);
    judge(pid, &seen, std::process::id() as i32, &canonical)
}

/// Removes a stale `postmaster.pid`; returns the PID it named when it removed one. A server
/// running on the data directory is an error.
pub fn clear_stale(pgdata: &Path) -> Result<Option<i32>, String> {
    clear_stale_lock(&pgdata.join("postmaster.pid"), pgdata)
}

fn clear_stale_lock(lock: &Path, pgdata: &Path) -> Result<Option<i32>, String> {
    let name = lock.file_name().unwrap_or_default().to_string_lossy();
    match read_lock(lock, pgdata) {
        PidFile::Absent => Ok(None),
        PidFile::Running(pid) => Err(format!(
            "a server (PID {pid}) runs on the data directory: stop it first"
        )),
        PidFile::Stale(pid) => match std::fs::remove_file(lock) {
            Ok(()) => Ok(Some(pid)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("cannot remove the stale {name}: {e}")),
        },
    }
}

/// `clear_stale`, saying in the manager's log what it removed.
pub fn clear(pgdata: &Path) -> Result<(), String> {
    clear_lock(&pgdata.join("postmaster.pid"), pgdata)
}

/// The socket's lock file in `socket_dir` for `port`, cleared the same way: PostgreSQL refuses
/// to start ("lock file … already exists") while the PID in it is alive, and after a server was
/// killed that PID is soon a thread of this manager, which lives on across the server's
/// restarts.
pub fn clear_socket(socket_dir: &Path, port: u16, pgdata: &Path) -> Result<(), String> {
    clear_lock(&socket_dir.join(format!(".s.PGSQL.{port}.lock")), pgdata)
}

fn clear_lock(lock: &Path, pgdata: &Path) -> Result<(), String> {
    if let Some(pid) = clear_stale_lock(lock, pgdata)? {
        let name = lock.file_name().unwrap_or_default().to_string_lossy();
        eprintln!(
            "dbop-instance: removed a stale {name} (PID {pid} is no server on this data \
             directory: a PID from before the container restarted, or a server killed)"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn judges_the_lock_file() {
        let data = PathBuf::from("/var/lib/postgresql/data/pgdata");
        let alive_in = |cwd: &str| Process::Alive {
            cwd: PathBuf::from(cwd),
        };
        let table: Vec<(&str, Option<i32>, Process, PidFile)> = vec![
            ("no file", None, Process::Gone, PidFile::Absent),
            ("PID 0", Some(0), alive_in("/"), PidFile::Absent),
            ("dead PID", Some(17), Process::Gone, PidFile::Stale(17)),
            (
                "the manager's own PID",
                Some(1),
                alive_in("/"),
                PidFile::Stale(1),
            ),
            (
                "a thread of the manager",
                Some(12),
                Process::Thread,
                PidFile::Stale(12),
            ),
            (
                "a tool the manager runs",
                Some(23),
                alive_in("/"),
                PidFile::Stale(23),
            ),
            (
                "a server on another data directory",
                Some(31),
                alive_in("/var/lib/postgresql/other"),
                PidFile::Stale(31),
            ),
            (
                "a server on this data directory",
                Some(40),
                alive_in("/var/lib/postgresql/data/pgdata"),
                PidFile::Running(40),
            ),
            (
                "another user's process",
                Some(41),
                Process::OtherUser,
                PidFile::Stale(41),
            ),
        ];
        for (case, pid, process, want) in table {
            assert_eq!(judge(pid, &process, 1, &data), want, "{case}");
        }
    }

    /// A thread of this test process, parked until `end`: its id is a live PID to `kill(0)`.
    struct Parked {
        tid: i32,
        done: std::sync::mpsc::Sender<()>,
        handle: std::thread::JoinHandle<()>,
    }

    impl Parked {
        fn spawn() -> Self {
            let (tx, rx) = std::sync::mpsc::channel();
            let (done, done_rx) = std::sync::mpsc::channel::<()>();
            let handle = std::thread::spawn(move || {
                // SAFETY: gettid has no preconditions.
                tx.send(unsafe { libc::gettid() }).unwrap();
                let _ = done_rx.recv();
            });
            let tid = rx.recv().unwrap();
            Self { tid, done, handle }
        }

        fn end(self) {
            self.done.send(()).unwrap();
            self.handle.join().unwrap();
        }
    }

    #[test]
    fn a_stale_socket_lock_naming_a_thread_of_the_manager_is_removed() {
        let data = tempfile::tempdir().unwrap();
        let sockets = tempfile::tempdir().unwrap();
        let lock = sockets.path().join(".s.PGSQL.5432.lock");
        // The killed server's PID is now a thread of this (test) process: PostgreSQL would take
        // it for a live server.
        let thread = Parked::spawn();
        let tid = thread.tid;
        let text = format!("{tid}\n{}\n1700000000\n5432\n", data.path().display());
        std::fs::write(&lock, text).unwrap();
        clear_socket(sockets.path(), 5432, data.path()).unwrap();
        assert!(!lock.exists(), "the stale socket lock is still there");
        // A server on the data directory keeps its lock.
        let inside = std::process::Command::new("sleep")
            .arg("60")
            .current_dir(data.path())
            .spawn()
            .unwrap();
        std::fs::write(&lock, format!("{}\n", inside.id())).unwrap();
        assert!(clear_socket(sockets.path(), 5432, data.path()).is_err());
        assert!(lock.exists());
        thread.end();
        let mut inside = inside;
        inside.kill().unwrap();
        inside.wait().unwrap();
    }

    #[test]
    fn parses_the_first_line() {
        assert_eq!(parse_pid("4711\n/var/lib/data\n1700000000\n"), Some(4711));
        assert_eq!(parse_pid(""), None);
        assert_eq!(parse_pid("garbage\n"), None);
    }

    #[test]
    fn a_live_process_elsewhere_or_a_thread_is_no_server() {
        let data = tempfile::tempdir().unwrap();
        // A live process whose working directory is not the data directory.
        let other = std::process::Command::new("sleep")
            .arg("60")
            .current_dir("/")
            .spawn()
            .unwrap();
        std::fs::write(
            data.path().join("postmaster.pid"),
            format!("{}\n", other.id()),
        )
        .unwrap();
        assert_eq!(read(data.path()), PidFile::Stale(other.id() as i32));
        // The same process, now in the data directory: a server as far as the file goes.
        let inside = std::process::Command::new("sleep")
            .arg("60")
            .current_dir(data.path())
            .spawn()
            .unwrap();
        std::fs::write(
            data.path().join("postmaster.pid"),
            format!("{}\n", inside.id()),
        )
        .unwrap();
        assert_eq!(read(data.path()), PidFile::Running(inside.id() as i32));
        assert!(clear_stale(data.path()).is_err());
        assert!(data.path().join("postmaster.pid").exists());
        // A thread of this test process.
        let thread = Parked::spawn();
        let tid = thread.tid;
        std::fs::write(data.path().join("postmaster.pid"), format!("{tid}\n")).unwrap();
        assert_eq!(clear_stale(data.path()), Ok(Some(tid)));
        assert!(!data.path().join("postmaster.pid").exists());
        thread.end();
        for mut child in [other, inside] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
