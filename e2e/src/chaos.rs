//! Random crash-resume: the real `dbop` binary is killed with SIGKILL at seeded random moments
//! while a scenario runs, and restarted at once each time, until the scenario's kill budget is
//! spent; then it runs undisturbed and the scenario checks the outcome.
//!
//! The seed is printed and read from `DBOP_CRASH_SEED`, so a failing run's kill delays can be
//! replayed (the interleaving also depends on the machine's timing: a replay repeats the same
//! delays, not necessarily the same race). Each scenario derives its own stream from the seed
//! and its name, so adding a scenario does not move the others' kills.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{OperatorProcess, TestBed};

/// How many kills and how far apart: each gap is drawn uniformly from `gap`.
#[derive(Clone, Debug)]
pub struct KillPlan {
    pub kills: usize,
    pub gap: std::ops::Range<Duration>,
}

/// What a scenario got: the kills it survived and the operator left running.
pub struct Survived {
    pub kills: usize,
    pub operator: OperatorProcess,
}

/// The run's seed (one per test process): `DBOP_CRASH_SEED` when set, else a random one;
/// printed either way.
pub fn seed() -> u64 {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SEED.get_or_init(pick_seed)
}

fn pick_seed() -> u64 {
    let seed = match std::env::var("DBOP_CRASH_SEED") {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("DBOP_CRASH_SEED={text:?} is not an unsigned integer")),
        Err(_) => rand::rng().random(),
    };
    println!("crash: seed {seed} (replay with DBOP_CRASH_SEED={seed})");
    seed
}

/// The random stream of one scenario: the run's seed mixed with the scenario's name.
pub fn stream(seed: u64, scenario: &str) -> StdRng {
    let mixed = scenario.bytes().fold(seed ^ 0x9e37_79b9_7f4a_7c15, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    StdRng::seed_from_u64(mixed)
}

/// Runs `work` while the operator (started here for `namespace` with `env`) is killed and
/// restarted `plan.kills` times at random gaps; returns once `work` is done *and* the budget is
/// spent, with the operator that is then running. `work` is handed a flag that turns true when
/// the last kill has happened, so it can repeat its unit until then.
pub async fn with_random_kills<F, Fut>(
    bed: &TestBed,
    namespace: &str,
    env: &[(&str, &str)],
    rng: &mut StdRng,
    plan: &KillPlan,
    work: F,
) -> Survived
where
    F: FnOnce(Arc<AtomicBool>) -> Fut,
    Fut: Future<Output = ()>,
{
    let spent = Arc::new(AtomicBool::new(false));
    let kills = AtomicUsize::new(0);
    let gaps: Vec<Duration> = (0..plan.kills)
        .map(|_| rng.random_range(plan.gap.clone()))
        .collect();
    let killer = async {
        let mut operator = bed.operator_binary_with_env(namespace, env);
        for (i, gap) in gaps.iter().enumerate() {
            tokio::time::sleep(*gap).await;
            operator.kill9();
            kills.store(i + 1, Ordering::SeqCst);
            tracing::info!(kill = i + 1, after = ?gap, "kill -9 the operator");
            operator = bed.operator_binary_with_env(namespace, env);
        }
        spent.store(true, Ordering::SeqCst);
        operator
    };
    let ((), operator) = tokio::join!(work(spent.clone()), killer);
    Survived {
        kills: kills.load(Ordering::SeqCst),
        operator,
    }
}

/// The objects the operator created in `namespace` (HTTP 201 to its `create`, from the API
/// server's audit log), as `resource/name` with how many times each was created. Anything
/// created twice was lost and made again — a duplicate, or a regenerated password.
pub fn operator_creations(
    bed: &TestBed,
    namespace: &str,
) -> std::collections::BTreeMap<String, usize> {
    let path = bed.dir.join("audit.log");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read the audit log {}: {e}", path.display()));
    let mut created = std::collections::BTreeMap::new();
    for entry in text
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
    {
        let by_operator = entry["userAgent"]
            .as_str()
            .is_some_and(|ua| ua.starts_with("dbop/"));
        let object = &entry["objectRef"];
        if by_operator
            && entry["verb"] == "create"
            && entry["responseStatus"]["code"] == 201
            && object["namespace"].as_str() == Some(namespace)
            && object["resource"] != "events"
        {
            let key = format!(
                "{}/{}",
                object["resource"].as_str().unwrap_or_default(),
                object["name"].as_str().unwrap_or_default()
            );
            *created.entry(key).or_insert(0) += 1;
        }
    }
    created
}

/// Panics naming every object the operator created more than once.
pub fn assert_each_created_once(bed: &TestBed, namespace: &str) {
    let created = operator_creations(bed, namespace);
    let twice: Vec<_> = created.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "created more than once (a duplicate, or lost and made again): {twice:?}"
    );
}
