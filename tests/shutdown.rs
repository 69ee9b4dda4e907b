//! `dbop run` stops on one SIGTERM in every state, the API server unreachable included: the
//! real binary against an API address that refuses connections and one that accepts them and
//! never answers (a request in flight), with and without leader election.

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long the process may take after its one SIGTERM: the grace for work in flight
/// (`dbop::operator::SHUTDOWN_GRACE`) and a margin for a loaded machine.
const STOP_BOUND: Duration = Duration::from_secs(25);

/// A kubeconfig naming `server` (a token, never used: no server answers).
fn kubeconfig(dir: &tempfile::TempDir, server: &str) -> std::path::PathBuf {
    let path = dir.path().join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    insecure-skip-tls-verify: true\ncontexts:\n- name: c\n  context: {{cluster: c, user: u, namespace: default}}\nusers:\n- name: u\n  user: {{token: t}}\n"
    );
    std::fs::write(&path, text).expect("writing the kubeconfig");
    path
}

fn free_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// The process and its log, read as it is written (a full pipe would block the process).
struct Running {
    child: Child,
    log: std::sync::Arc<std::sync::Mutex<String>>,
}

fn start(kubeconfig: &std::path::Path, metrics: SocketAddr, extra: &[&str]) -> Running {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dbop"))
        .arg("run")
        .arg("--metrics-addr")
        .arg(metrics.to_string())
        .args(extra)
        .env_clear()
        .env("KUBECONFIG", kubeconfig)
        .env("POD_NAME", "dbop-test")
        .env("POD_NAMESPACE", "default")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting dbop run");
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let mut stderr = child.stderr.take().unwrap();
    let sink = log.clone();
    std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        while let Ok(n @ 1..) = stderr.read(&mut chunk) {
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&chunk[..n]));
        }
    });
    Running { child, log }
}

/// Waits until the process serves `/healthz` (its endpoints are up: it is past the flags and
/// inside its run), failing if it exits first.
fn wait_serving(child: &mut Child, metrics: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("dbop exited before serving its endpoints: {status}");
        }
        if TcpStream::connect(metrics).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("dbop did not serve its endpoints within 30 s");
}

fn sigterm(child: &Child) {
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill")
        .success();
    assert!(ok, "kill -TERM failed");
}

/// The exit status once it has stopped, or a panic (after killing it) when it outlives
/// `STOP_BOUND`.
fn stopped_within_bound(running: &mut Running) -> ExitStatus {
    let deadline = Instant::now() + STOP_BOUND;
    while Instant::now() < deadline {
        if let Some(status) = running.child.try_wait().unwrap() {
            return status;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = running.child.kill();
    let _ = running.child.wait();
    let log = running.log.lock().unwrap().clone();
    panic!("one SIGTERM did not stop dbop within {STOP_BOUND:?}; its log:\n{log}");
}

/// An API address that accepts connections and never answers: every request hangs in flight.
/// The accepted connections are kept open until the listener's thread ends with the test.
fn silent_server() -> (SocketAddr, std::sync::mpsc::Receiver<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (accepted, seen) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
            let _ = accepted.send(());
        }
    });
    (addr, seen)
}

fn one_sigterm_stops(
    server: &str,
    extra: &[&str],
    connected: Option<std::sync::mpsc::Receiver<()>>,
) {
    let dir = tempfile::tempdir().unwrap();
    let config = kubeconfig(&dir, server);
    let metrics = free_addr();
    let mut running = start(&config, metrics, extra);
    wait_serving(&mut running.child, metrics);
    if let Some(connected) = connected {
        connected
            .recv_timeout(Duration::from_secs(30))
            .expect("dbop never connected to the API address");
    }
    sigterm(&running.child);
    let status = stopped_within_bound(&mut running);
    assert!(status.success(), "dbop exited with {status} after SIGTERM");
}

#[test]
fn one_sigterm_stops_it_while_the_api_server_refuses_connections() {
    let closed = free_addr();
    one_sigterm_stops(&format!("https://{closed}"), &[], None);
}

#[test]
fn one_sigterm_stops_it_while_a_request_hangs_unanswered() {
    let (addr, connected) = silent_server();
    one_sigterm_stops(&format!("https://{addr}"), &[], Some(connected));
}

#[test]
fn one_sigterm_stops_a_leader_candidate_while_the_api_server_is_unreachable() {
    let (addr, connected) = silent_server();
    one_sigterm_stops(
        &format!("https://{addr}"),
        &["--leader-elect"],
        Some(connected),
    );
}
