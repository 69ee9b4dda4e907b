//! arm64: `make static` builds dbop, dbop-backup and dbop-instance for aarch64 as well as x86_64,
//! the aarch64 ones run (under qemu's user-mode emulation, called directly: no binfmt needed) and
//! do what the x86_64 ones do in their commands that need no cluster and no PostgreSQL, and the
//! release image (`images.sh release`) is an index of linux/amd64 and linux/arm64 with each
//! platform's own binaries, which `check-image.sh` holds against the Dockerfile. Needs no test bed;
//! a missing qemu or missing binaries fail with what to run, never skip.

#[path = "offline/mod.rs"]
mod offline;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use offline::{scratch, workspace_root};
use serde_json::Value;

const BINARIES: [&str; 3] = ["dbop", "dbop-backup", "dbop-instance"];

/// One architecture of the static build: Docker's name, the Rust target, what `file` says.
#[derive(Clone, Copy, Debug)]
struct Arch {
    docker: &'static str,
    triple: &'static str,
    file_says: &'static str,
}

const AMD64: Arch = Arch {
    docker: "amd64",
    triple: "x86_64-unknown-linux-musl",
    file_says: "x86-64",
};
const ARM64: Arch = Arch {
    docker: "arm64",
    triple: "aarch64-unknown-linux-musl",
    file_says: "ARM aarch64",
};

/// `make static`'s output directory of an architecture (CARGO_TARGET_DIR is honoured).
fn release_dir(arch: Arch) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    target.join(arch.triple).join("release")
}

fn binary(arch: Arch, name: &str) -> PathBuf {
    let path = release_dir(arch).join(name);
    assert!(
        path.exists(),
        "no {}: `make static` builds it (it needs e2e/testbed/install-deps.sh's musl-dev:arm64 \
         and `rustup target add {}`)",
        path.display(),
        arch.triple
    );
    path
}

/// qemu's user-mode aarch64 emulator: `$DBOP_QEMU_AARCH64`, else qemu-aarch64-static or
/// qemu-aarch64 on PATH.
fn qemu() -> PathBuf {
    if let Some(path) = std::env::var_os("DBOP_QEMU_AARCH64") {
        return PathBuf::from(path);
    }
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .flat_map(|d| [d.join("qemu-aarch64-static"), d.join("qemu-aarch64")])
        .find(|p| p.exists());
    found.unwrap_or_else(|| {
        panic!(
            "no qemu-aarch64-static or qemu-aarch64 on PATH: the aarch64 binaries cannot be run. \
             Install it with e2e/testbed/install-deps.sh (as root: apt-get install qemu-user-static), \
             or set DBOP_QEMU_AARCH64."
        )
    })
}

/// A command that runs `program` of `arch` on this (x86_64) host.
fn command(arch: Arch, program: &Path) -> Command {
    match arch.docker {
        "arm64" => {
            let mut c = Command::new(qemu());
            c.arg(program);
            c
        }
        _ => Command::new(program),
    }
}

fn run(mut cmd: Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

fn file_says(path: &Path) -> String {
    let out = run({
        let mut c = Command::new("file");
        c.arg("-L").arg(path);
        c
    });
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn assert_static_of(arch: Arch, path: &Path) {
    let says = file_says(path);
    assert!(
        says.contains(arch.file_says),
        "{} is not {}: {says}",
        path.display(),
        arch.file_says
    );
    assert!(
        says.contains("statically linked") || says.contains("static-pie linked"),
        "{} is not static: {says}",
        path.display()
    );
}

#[test]
fn make_static_builds_every_binary_for_both_architectures() {
    for arch in [AMD64, ARM64] {
        for name in BINARIES {
            assert_static_of(arch, &binary(arch, name));
        }
    }
}

#[test]
fn the_aarch64_binaries_report_their_version_under_emulation() {
    let version = env!("CARGO_PKG_VERSION");
    for name in BINARIES {
        let mut cmd = command(ARM64, &binary(ARM64, name));
        cmd.arg("--version");
        let out = run(cmd);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.trim() == format!("{name} {version}"),
            "aarch64 {name} --version: {:?} {stdout:?} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `dbop crd` needs no cluster: the aarch64 operator prints exactly the checked-in CRDs.
#[test]
fn the_aarch64_operator_prints_the_checked_in_crds() {
    let mut cmd = command(ARM64, &binary(ARM64, "dbop"));
    cmd.arg("crd");
    let out = run(cmd);
    let checked_in = std::fs::read_to_string(workspace_root().join("crds/dbop.dev.yaml")).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout) == checked_in,
        "the aarch64 `dbop crd` differs from crds/dbop.dev.yaml"
    );
}

/// `dbop-instance server-version` (the upgrade preflight) against a stand-in `postgres` on PATH
/// (major 99: never the host's own PostgreSQL): the exit code and termination message of each
/// outcome, the same on both architectures.
#[test]
fn the_instance_managers_version_check_behaves_the_same_on_both_architectures() {
    let dir = scratch("multiarch-server-version");
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let fake = bin.join("postgres");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho 'postgres (PostgreSQL) 99.3 (stand-in)'\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    // (PATH, --expect) -> (exit code, what the termination message holds)
    let cases = [
        (&bin, "99.3", 0, "99.3"),
        (&bin, "99.4", 2, "99.3"),
        (&empty, "99.3", 1, "no PostgreSQL 99 server binaries"),
    ];
    for arch in [AMD64, ARM64] {
        for (path, expect, code, message) in cases {
            let log = dir.join(format!("termination-{}-{expect}-{code}", arch.docker));
            let mut cmd = command(arch, &binary(arch, "dbop-instance"));
            cmd.args(["server-version", "--major", "99", "--expect", expect])
                .arg("--termination-log")
                .arg(&log)
                .env("PATH", path);
            let out = run(cmd);
            let written = std::fs::read_to_string(&log).unwrap_or_default();
            assert_eq!(
                out.status.code(),
                Some(code),
                "{} server-version --expect {expect} with PATH {}: {}",
                arch.docker,
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                written.contains(message),
                "{}: termination message {written:?}, expected {message:?}",
                arch.docker
            );
        }
    }
}

/// The release image, built once per test process: `images.sh release` (needs root) from the
/// static binaries; its tarball's path.
fn release_image() -> &'static Path {
    static IMAGE: OnceLock<PathBuf> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let out = run({
            let mut c = Command::new(workspace_root().join("e2e/testbed/images.sh"));
            c.arg("release")
                .env("DBOP_RELEASE_BIN_DIR", release_dir(AMD64))
                .env("DBOP_RELEASE_ARM64_BIN_DIR", release_dir(ARM64));
            c
        });
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "images.sh release failed:\n{stderr}");
        assert!(stderr.contains("matches the Dockerfile"), "{stderr}");
        let (_, tar) = stdout
            .trim()
            .split_once(' ')
            .expect("images.sh prints `ref tarball`");
        PathBuf::from(tar)
    })
}

fn json_file(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap())
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// The release image's index names exactly linux/amd64 and linux/arm64, and each platform's
/// image holds binaries of its architecture that run.
#[test]
fn the_release_image_indexes_both_platforms_with_their_own_binaries() {
    let dir = scratch("multiarch-release");
    let tar = release_image();
    assert!(
        run({
            let mut c = Command::new("tar");
            c.arg("-C").arg(&dir).arg("-xf").arg(tar);
            c
        })
        .status
        .success()
    );
    let blob = |digest: &Value| {
        dir.join("blobs/sha256")
            .join(digest.as_str().unwrap().trim_start_matches("sha256:"))
    };
    let top = json_file(&dir.join("index.json"));
    let named = &top["manifests"][0];
    assert_eq!(
        named["mediaType"], "application/vnd.oci.image.index.v1+json",
        "{top}"
    );
    assert_eq!(
        named["annotations"]["io.containerd.image.name"],
        format!("dbop.local/dbop:{}", env!("CARGO_PKG_VERSION"))
    );
    let index = json_file(&blob(&named["digest"]));
    let manifests = index["manifests"].as_array().unwrap();
    let platforms: Vec<String> = manifests
        .iter()
        .map(|m| {
            format!(
                "{}/{}",
                m["platform"]["os"].as_str().unwrap(),
                m["platform"]["architecture"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(platforms, ["linux/amd64", "linux/arm64"]);
    for (arch, manifest) in [AMD64, ARM64].into_iter().zip(manifests) {
        let manifest = json_file(&blob(&manifest["digest"]));
        let config = json_file(&blob(&manifest["config"]["digest"]));
        assert_eq!(config["architecture"], arch.docker);
        let root = dir.join(arch.docker);
        std::fs::create_dir_all(&root).unwrap();
        assert!(
            run({
                let mut c = Command::new("tar");
                c.arg("-C")
                    .arg(&root)
                    .arg("-xzf")
                    .arg(blob(&manifest["layers"][0]["digest"]));
                c
            })
            .status
            .success()
        );
        for path in BINARIES
            .map(|b| format!("usr/local/bin/{b}"))
            .iter()
            .chain(&["usr/bin/cp".to_string()])
        {
            assert_static_of(arch, &root.join(path));
        }
        let mut cmd = command(arch, &root.join("usr/local/bin/dbop"));
        cmd.arg("--version");
        let out = run(cmd);
        assert!(
            out.status.success(),
            "{} dbop from the image: {}",
            arch.docker,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Kept when the test fails, to look at; removed when it passes.
    let _ = std::fs::remove_dir_all(&dir);
}

/// check-image.sh fails, naming the difference, for a Dockerfile that disagrees with the index
/// (a platform more or less, a build stage that would be emulated, a COPY of one architecture's
/// binary into every platform), and passes for the repository's own.
#[test]
fn check_image_refuses_a_dockerfile_that_disagrees_with_the_index() {
    let dir = scratch("multiarch-check-image");
    // A copy: the images cache is shared, and another checkout's `images.sh release` replaces
    // the tarball when its binaries differ.
    let image = dir.join("release.tar");
    std::fs::copy(release_image(), &image).unwrap();
    let dockerfile = std::fs::read_to_string(workspace_root().join("Dockerfile")).unwrap();
    let check = |text: &str| {
        let path = dir.join("Dockerfile");
        std::fs::write(&path, text).unwrap();
        let out = run({
            let mut c = Command::new(workspace_root().join("e2e/testbed/check-image.sh"));
            c.arg(&image).arg(&path);
            c
        });
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, stderr) = check(&dockerfile);
    assert!(ok, "the repository's Dockerfile: {stderr}");
    let arches = "ARG DBOP_ARCHES=\"amd64 arm64\"";
    assert!(dockerfile.contains(arches));
    let variants = [
        (
            dockerfile.replace(arches, "ARG DBOP_ARCHES=\"amd64 arm64 riscv64\""),
            "linux/riscv64: in the Dockerfile's DBOP_ARCHES, not in the image index",
        ),
        (
            dockerfile.replace(arches, "ARG DBOP_ARCHES=\"amd64\""),
            "linux/arm64: in the image index, not in the Dockerfile's DBOP_ARCHES",
        ),
        (
            dockerfile.replace("FROM --platform=$BUILDPLATFORM ", "FROM "),
            "would be emulated",
        ),
        (
            dockerfile.replace(
                "/out/${TARGETARCH}/dbop-instance ",
                "/out/amd64/dbop-instance ",
            ),
            "/usr/local/bin/dbop-instance: COPYed from /out/amd64/dbop-instance, not from its platform's",
        ),
    ];
    for (text, says) in variants {
        assert_ne!(text, dockerfile, "the variant for {says:?} changed nothing");
        let (ok, stderr) = check(&text);
        assert!(
            !ok && stderr.contains(says),
            "expected a failure saying {says:?}, got ok={ok}: {stderr}"
        );
    }
    // Kept when the test fails, to look at; removed when it passes.
    let _ = std::fs::remove_dir_all(&dir);
}
