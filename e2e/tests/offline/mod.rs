//! What the cluster-free suites (`chart_render`, `alerts`) share: the tools they drive, found
//! without a test bed, and a scratch directory. A missing tool fails the test with what to run;
//! it never skips.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

pub fn chart() -> PathBuf {
    workspace_root().join("charts/dbop")
}

/// The test bed's helm (`e2e/testbed/build.sh tools` builds it into its cache; no cluster is
/// needed to use it): `$DBOP_HELM`, else the running test bed's `tools-bin/helm`, else the
/// cache directory `e2e/testbed/lib.sh` names for the pinned version.
pub fn helm() -> PathBuf {
    if let Some(path) = std::env::var_os("DBOP_HELM") {
        return PathBuf::from(path);
    }
    let root = workspace_root();
    let bed_dir = std::env::var_os("DBOP_TESTBED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".testbed"));
    let in_bed = bed_dir.join("tools-bin/helm");
    if in_bed.exists() {
        return in_bed;
    }
    let lib = root.join("e2e/testbed/lib.sh");
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(". '{}' && testbed_tools_bin_dir", lib.display()))
        .output()
        .expect("running bash");
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let cached = PathBuf::from(&dir).join("helm");
    assert!(
        out.status.success() && cached.exists(),
        "no helm: not at {} nor at {} (the pinned build's cache). Build it with \
         `e2e/testbed/build.sh tools` (no cluster needed), or point DBOP_HELM at a helm v4. {}",
        in_bed.display(),
        cached.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    cached
}

/// Prometheus's promtool (Debian's `prometheus` package; e2e/testbed/install-deps.sh installs
/// it): `$DBOP_PROMTOOL`, else `promtool` on PATH, else /usr/bin/promtool.
pub fn promtool() -> PathBuf {
    if let Some(path) = std::env::var_os("DBOP_PROMTOOL") {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("promtool"))
        .find(|p| p.exists());
    let path = on_path.unwrap_or_else(|| PathBuf::from("/usr/bin/promtool"));
    assert!(
        path.exists(),
        "no promtool (on PATH or at /usr/bin/promtool): the alert rules cannot be tested. \
         Install it with e2e/testbed/install-deps.sh (as root; it runs \
         `apt-get install --no-install-recommends prometheus`), or set DBOP_PROMTOOL."
    );
    path
}

/// A fresh scratch directory for this test process.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("dbop-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

/// Runs helm without any cluster: its state in `scratch`, a kubeconfig that does not exist.
pub fn helm_cmd(scratch: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(helm())
        .args(args)
        .env("KUBECONFIG", scratch.join("no-kubeconfig"))
        .env("HELM_CACHE_HOME", scratch.join("helm/cache"))
        .env("HELM_CONFIG_HOME", scratch.join("helm/config"))
        .env("HELM_DATA_HOME", scratch.join("helm/data"))
        .output()
        .expect("running helm");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The YAML documents of a multi-document stream, as JSON values (empty ones left out).
pub fn documents(yaml: &str) -> Vec<serde_json::Value> {
    yaml.split("\n---")
        .map(|doc| {
            serde_norway::from_str::<serde_json::Value>(doc)
                .unwrap_or_else(|e| panic!("a rendered document is not YAML: {e}\n{doc}"))
        })
        .filter(|v| v.is_object())
        .collect()
}
