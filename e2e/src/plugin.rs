//! The real `kubectl-dbop` binary run against the test bed, for the suites that check what a
//! user sees: started with the test bed's KUBECONFIG (or another), its output awaited.

use std::path::PathBuf;
use std::process::Output;

use crate::{TestBed, WAIT, operator_binary_path};

/// `kubectl-dbop` beside `dbop` in the target directory (built by `cargo build --bins`).
pub fn plugin_binary() -> PathBuf {
    operator_binary_path().with_file_name("kubectl-dbop")
}

/// Starts `kubectl-dbop ARGS` against the test bed; await it for its output.
pub fn plugin(bed: &TestBed, args: &[&str]) -> tokio::process::Child {
    plugin_with_kubeconfig(&bed.kubeconfig, args)
}

/// Starts `kubectl-dbop ARGS` with KUBECONFIG set to `kubeconfig`.
pub fn plugin_with_kubeconfig(
    kubeconfig: &std::path::Path,
    args: &[&str],
) -> tokio::process::Child {
    let binary = plugin_binary();
    tokio::process::Command::new(&binary)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start {}: {e} (run `cargo build --bins` first)",
                binary.display()
            )
        })
}

/// Awaits a started `kubectl-dbop` (within the test bed's wait); its output, printed.
pub async fn finished(child: tokio::process::Child) -> (Output, String, String) {
    let out = tokio::time::timeout(WAIT, child.wait_with_output())
        .await
        .expect("kubectl-dbop finished in time")
        .expect("kubectl-dbop output");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    println!(
        "e2e: kubectl-dbop exit {:?}\n{stdout}{stderr}",
        out.status.code()
    );
    (out, stdout, stderr)
}
