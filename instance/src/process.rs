//! The process-level I/O: signal handlers that only record what arrived, sending signals to
//! the server, and reaping every child (the manager is PID 1 of its container) except those
//! another thread spawned with `spawn_owned` and waits for itself (the metrics' psql).

use std::collections::BTreeMap;
use std::process::{Child, Command};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::shutdown::Signal;

static PENDING: AtomicU32 = AtomicU32::new(0);

const HANDLED: [(libc::c_int, Signal); 4] = [
    (libc::SIGTERM, Signal::Term),
    (libc::SIGINT, Signal::Int),
    (libc::SIGQUIT, Signal::Quit),
    (libc::SIGHUP, Signal::Hup),
];

extern "C" fn record(signal: libc::c_int) {
    // Async-signal-safe: one atomic OR.
    if (0..32).contains(&signal) {
        PENDING.fetch_or(1 << signal, Ordering::SeqCst);
    }
}

/// Installs the handlers for SIGTERM, SIGINT, SIGQUIT and SIGHUP.
pub fn install_handlers() -> std::io::Result<()> {
    for (number, _) in HANDLED {
        // SAFETY: a zeroed sigaction with a handler that only touches an atomic; SA_RESTART so
        // blocking calls resume.
        let result = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = record as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(number, &action, std::ptr::null_mut())
        };
        if result != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The signals received since the last call.
pub fn take_signals() -> Vec<Signal> {
    let bits = PENDING.swap(0, Ordering::SeqCst);
    HANDLED
        .iter()
        .filter(|(n, _)| bits & (1 << n) != 0)
        .map(|(_, s)| *s)
        .collect()
}

/// Sends `signal` to the process `pid`.
pub fn send(pid: u32, signal: Signal) {
    let number = HANDLED
        .iter()
        .find(|(_, s)| *s == signal)
        .map(|(n, _)| *n)
        .unwrap_or(libc::SIGTERM);
    // SAFETY: kill has no memory effects.
    unsafe { libc::kill(pid as libc::pid_t, number) };
}

/// Children spawned by `spawn_owned`: their exit code once `reap` took it for their owner.
/// `reap` holds the lock while it reaps, `spawn_owned` while it spawns and registers, so a
/// reaped child is always known to be owned or not, and an owned pid is never reused before
/// its owner has seen it end.
static OWNED: Mutex<BTreeMap<u32, Option<i32>>> = Mutex::new(BTreeMap::new());

fn owned() -> std::sync::MutexGuard<'static, BTreeMap<u32, Option<i32>>> {
    OWNED.lock().unwrap_or_else(|e| e.into_inner())
}

fn exit_code(status: libc::c_int) -> i32 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    }
}

/// Reaps every exited child; returns their pids and exit codes (128 + signal when killed).
/// Children of `spawn_owned` are reaped too, their codes kept for `try_wait_owned`.
pub fn reap() -> Vec<(u32, i32)> {
    let mut out = Vec::new();
    let mut owned = owned();
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: status is a valid pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return out;
        }
        let code = exit_code(status);
        match owned.get_mut(&(pid as u32)) {
            Some(slot) => *slot = Some(code),
            None => out.push((pid as u32, code)),
        }
    }
}

/// Spawns `cmd` as a child that this thread waits for with `try_wait_owned` (never with
/// `Child::wait`: the supervisor's `reap` may take its exit first).
pub fn spawn_owned(cmd: &mut Command) -> std::io::Result<Child> {
    let mut owned = owned();
    let child = cmd.spawn()?;
    owned.insert(child.id(), None);
    Ok(child)
}

/// The exit code of an owned child once it ended (then it is forgotten).
pub fn try_wait_owned(pid: u32) -> Option<i32> {
    let mut owned = owned();
    let code = match owned.get(&pid)? {
        Some(code) => Some(*code),
        None => {
            let mut status: libc::c_int = 0;
            // SAFETY: status is a valid pointer.
            match unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::WNOHANG) } {
                0 => None,
                p if p > 0 => Some(exit_code(status)),
                // Not our child any more (cannot happen while it is registered): ended.
                _ => Some(-1),
            }
        }
    };
    if code.is_some() {
        owned.remove(&pid);
    }
    code
}

/// SIGKILL to an owned child that has not been reaped (so its pid is still its own).
pub fn kill_owned(pid: u32) {
    let owned = owned();
    if owned.get(&pid) == Some(&None) {
        // SAFETY: kill has no memory effects; the pid is an unreaped child's.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    }
}

/// `n` random bytes from the kernel.
pub fn random_bytes(n: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; n];
    let mut filled = 0;
    while filled < n {
        // SAFETY: the pointer and length describe the unfilled tail of `buf`.
        let got = unsafe { libc::getrandom(buf[filled..].as_mut_ptr().cast(), n - filled, 0) };
        if got < 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() != std::io::ErrorKind::Interrupted {
                return Err(error);
            }
        } else {
            filled += got as usize;
        }
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_children_are_left_to_their_owner() {
        // Waited for with try_wait_owned, not Child::wait.
        let pid = spawn_owned(Command::new("sh").args(["-c", "exit 7"]))
            .unwrap()
            .id();
        // The supervisor's reaper runs meanwhile: it takes the exit but does not report it.
        let start = std::time::Instant::now();
        loop {
            assert!(!reap().iter().any(|(p, _)| *p == pid));
            if let Some(code) = try_wait_owned(pid) {
                assert_eq!(code, 7);
                break;
            }
            assert!(start.elapsed() < std::time::Duration::from_secs(10));
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(try_wait_owned(pid), None, "forgotten once seen");
        // A child killed at its limit.
        let pid = spawn_owned(Command::new("sleep").arg("30")).unwrap().id();
        kill_owned(pid);
        let start = std::time::Instant::now();
        let code = loop {
            if let Some(code) = try_wait_owned(pid) {
                break code;
            }
            assert!(start.elapsed() < std::time::Duration::from_secs(10));
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        assert_eq!(code, 128 + libc::SIGKILL);
    }
}
