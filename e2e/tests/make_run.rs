//! `make run` (e2e/run.sh) on a cluster that is already configured — the test bed, standing in for
//! a user's cluster. It applies nothing without consent (standard input not a terminal and no
//! DBOP_RUN_YES=1) or when the database pods could not pull their images; with DBOP_RUN_YES=1 it
//! brings the example to Ready and, on SIGINT, removes exactly what it made (its namespace and
//! Database, through dbop's finalizer) and leaves what was there before (the CRDs, a Database in
//! another namespace, which its operator never touches). Its output to a pipe has no colour codes.

use std::process::Stdio;
use std::time::Duration;

use dbop::api::{Database, Phase};
use dbop_e2e::{TestBed, database_manifest, testbed, workspace_root};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use rand::Rng;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// A namespace name nobody has: run.sh is to create it (and remove it).
fn fresh_namespace() -> String {
    format!("e2e-make-run-{:06}", rand::rng().random_range(0..1_000_000))
}

/// e2e/run.sh against the test bed as a configured cluster, with standard input not a terminal
/// and nothing from the caller's environment that changes its choices.
fn run_sh(bed: &TestBed, namespace: &str) -> Command {
    let mut cmd = Command::new(workspace_root().join("e2e/run.sh"));
    cmd.env("KUBECONFIG", &bed.kubeconfig)
        .env("DBOP_TESTBED_DIR", &bed.dir)
        .env("DBOP_RUN_NAMESPACE", namespace)
        .env_remove("DBOP_RUN_YES")
        .env_remove("DBOP_AGENT_IMAGE")
        .env_remove("DBOP_POSTGRES_IMAGE_TEMPLATE")
        .env_remove("DBOP_EXAMPLE")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

async fn namespace_exists(bed: &TestBed, name: &str) -> bool {
    let api: Api<Namespace> = Api::all(bed.client.clone());
    api.get_opt(name)
        .await
        .expect("reading a namespace")
        .is_some()
}

#[tokio::test]
async fn on_a_configured_cluster_it_applies_nothing_without_consent_or_pullable_images() {
    let bed = testbed().await;
    let namespace = fresh_namespace();
    let cases: [(&[(&str, &str)], &str); 4] = [
        (&[], "without DBOP_RUN_YES=1"),
        (&[("DBOP_RUN_YES", "0")], "without DBOP_RUN_YES=1"),
        (
            &[
                ("DBOP_RUN_YES", "1"),
                ("DBOP_AGENT_IMAGE", "dbop.local/dbop:dev"),
            ],
            "DBOP_AGENT_IMAGE=dbop.local/dbop:dev",
        ),
        (
            &[
                ("DBOP_RUN_YES", "1"),
                ("DBOP_POSTGRES_IMAGE_TEMPLATE", "postgres:{version}"),
            ],
            "DBOP_POSTGRES_IMAGE_TEMPLATE=postgres:{version}",
        ),
    ];
    for (env, says) in cases {
        // (it refuses in a second or two; one that goes ahead would run until stopped)
        let out = tokio::time::timeout(
            Duration::from_secs(120),
            run_sh(&bed, &namespace).envs(env.iter().copied()).output(),
        )
        .await
        .unwrap_or_else(|_| {
            panic!("with {env:?}, run.sh did not refuse: it still runs after 2 minutes")
        })
        .expect("running e2e/run.sh");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "with {env:?}, run.sh did not refuse:\n{err}"
        );
        assert!(
            err.contains(says) && err.contains("context dbop-testbed"),
            "with {env:?}, run.sh did not name the context and say {says:?}:\n{err}"
        );
        assert!(
            !err.contains('\u{1b}'),
            "colour codes in run.sh's output to a pipe:\n{err}"
        );
        assert!(
            !namespace_exists(&bed, &namespace).await,
            "with {env:?}, run.sh refused but created namespace {namespace}"
        );
    }
}

// In the clean-clone CI run of 2026-12-02 run.sh did not end within 5 minutes of this SIGINT:
// that run was started with `nohup … &`, so SIGINT was ignored from the top down and bash could
// not trap it (now reset in the child, above). A timeout prints run.sh's output, the namespace
// and the end of its dbop's log.
#[tokio::test]
async fn on_sigint_it_removes_what_it_made_and_nothing_else() {
    let bed = testbed().await;
    // What was there before: the CRDs (testbed() installs them) and a Database elsewhere.
    let other = bed.namespace("make-run-other").await;
    bed.apply_database(&other, database_manifest("keep", serde_json::json!({})))
        .await;
    let namespace = fresh_namespace();

    let mut cmd = run_sh(&bed, &namespace);
    cmd.env("DBOP_RUN_YES", "1");
    // A process started in the background by a non-interactive shell (`nohup make test &`)
    // ignores SIGINT, and so does everything it starts: bash cannot trap a signal ignored at
    // its entry, so run.sh would never see this test's Ctrl-C. Give it the terminal's default.
    // SAFETY: between fork and exec only `signal`, which is async-signal-safe, runs.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("starting e2e/run.sh");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut log = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    loop {
        let line = tokio::time::timeout_at(deadline, lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("the example was not Ready in 5 minutes:\n{log}"))
            .expect("reading run.sh's output");
        let Some(line) = line else {
            panic!("run.sh ended before the example was Ready:\n{log}");
        };
        log.push_str(&line);
        log.push('\n');
        if line.contains("keeps running") {
            break;
        }
    }
    let databases: Api<Database> = Api::namespaced(bed.client.clone(), &namespace);
    let db = databases.get("orders").await.expect("the example Database");
    assert_eq!(
        db.status.as_ref().and_then(|s| s.phase),
        Some(Phase::Ready),
        "{log}"
    );

    let pid = child.id().expect("run.sh's pid").to_string();
    let sent = Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .await
        .unwrap();
    assert!(sent.success(), "kill -INT {pid}");
    let ended = tokio::time::timeout(Duration::from_secs(300), async {
        while let Some(line) = lines.next_line().await.expect("reading run.sh's output") {
            log.push_str(&line);
            log.push('\n');
        }
        child.wait().await.expect("waiting for run.sh")
    })
    .await;
    let Ok(status) = ended else {
        let operator_log = bed.dir.join(format!("logs/make-run-{namespace}.log"));
        let tail = std::fs::read_to_string(&operator_log).unwrap_or_default();
        let tail: Vec<&str> = tail.lines().rev().take(40).collect();
        let around = bed.namespace_report(&namespace).await;
        panic!(
            "run.sh did not end within 5 minutes of SIGINT:\n{log}\n{around}\nthe end of {}:\n{}",
            operator_log.display(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    };
    assert_eq!(
        status.code(),
        Some(130),
        "run.sh's status after SIGINT:\n{log}"
    );

    assert!(
        databases.get_opt("orders").await.unwrap().is_none(),
        "the example Database is left:\n{log}"
    );
    assert!(
        !namespace_exists(&bed, &namespace).await,
        "namespace {namespace}, which run.sh made, is left:\n{log}"
    );
    let crds: Api<CustomResourceDefinition> = Api::all(bed.client.clone());
    for crd in ["databases.dbop.dev", "databasebackups.dbop.dev"] {
        assert!(
            crds.get_opt(crd).await.unwrap().is_some(),
            "run.sh deleted the CRD {crd}, which was there before it:\n{log}"
        );
    }
    let keep = bed
        .databases(&other)
        .get("keep")
        .await
        .expect("the other namespace's Database is left as it was");
    assert!(
        keep.metadata.finalizers.unwrap_or_default().is_empty() && keep.status.is_none(),
        "run.sh's operator acted on a Database outside its namespace:\n{log}"
    );
    assert!(
        !log.contains('\u{1b}'),
        "colour codes in run.sh's output to a pipe:\n{log}"
    );
}
