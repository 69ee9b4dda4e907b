//! `e2e-suites`: runs the end-to-end suites of `make test-e2e` side by side on one test bed.
//!
//! Each file in `e2e/tests/` is a suite (one test binary). `e2e/suites.yaml` places every suite
//! in a group — `kwok` suites run side by side, `real-node` suites at most `--real-node-jobs` at
//! once, `alone` suites (they restart the API server or etcd) when nothing else runs — and gives
//! its last measured time, so the longest start first. Each suite's output goes to its own log;
//! a failed suite's log is printed whole. At the end: a table of every suite, slowest first,
//! the overlap gained, and the totals as `e2e: N passed, M failed`.
//!
//! The scheduling decision (`next_to_start`) and the reading of a suite's result
//! (`TestCounts::from_output`) are pure; `main` only spawns, polls and prints.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;

/// How long one suite may run before it is killed and counted as failed.
const SUITE_TIMEOUT: Duration = Duration::from_secs(25 * 60);
/// How often running suites are polled.
const POLL: Duration = Duration::from_millis(200);

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
enum Group {
    Kwok,
    RealNode,
    Alone,
}

impl Group {
    fn label(self) -> &'static str {
        match self {
            Group::Kwok => "kwok",
            Group::RealNode => "real-node",
            Group::Alone => "alone",
        }
    }
}

#[derive(Debug, Deserialize)]
struct Placement {
    group: Group,
    seconds: u64,
}

#[derive(Debug, Deserialize)]
struct SuiteTable {
    suites: BTreeMap<String, Placement>,
}

/// A suite to run: its test binary and where the table places it.
#[derive(Clone, Debug)]
struct Suite {
    name: String,
    exe: PathBuf,
    group: Group,
    expected_secs: u64,
}

/// How many suites may run at once.
#[derive(Clone, Copy, Debug)]
struct Limits {
    jobs: usize,
    real_node_jobs: usize,
}

/// Which pending suite to start now, given the groups of the running ones (pure). Pending is
/// in the order to try: longest first. An `alone` suite starts only when nothing runs and
/// nothing else is pending; nothing starts beside it.
fn next_to_start(pending: &[Suite], running: &[Group], limits: Limits) -> Option<usize> {
    if running.contains(&Group::Alone) || running.len() >= limits.jobs {
        return None;
    }
    let real_running = running.iter().filter(|g| **g == Group::RealNode).count();
    let others_pending = pending.iter().any(|s| s.group != Group::Alone);
    pending.iter().position(|s| match s.group {
        Group::Kwok => true,
        Group::RealNode => real_running < limits.real_node_jobs,
        Group::Alone => running.is_empty() && !others_pending,
    })
}

/// What a test binary's `test result:` lines add up to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct TestCounts {
    passed: u64,
    failed: u64,
    ignored: u64,
}

impl TestCounts {
    /// Sums every `test result: ok. 3 passed; 0 failed; 1 ignored; ...` line (pure).
    fn from_output(text: &str) -> TestCounts {
        let mut counts = TestCounts::default();
        for line in text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("test result: "))
        {
            for part in line.split(';') {
                let mut words = part.split_whitespace().rev();
                let (Some(what), Some(n)) = (words.next(), words.next()) else {
                    continue;
                };
                let Ok(n) = n.parse::<u64>() else { continue };
                match what {
                    "passed" => counts.passed += n,
                    "failed" => counts.failed += n,
                    "ignored" => counts.ignored += n,
                    _ => {}
                }
            }
        }
        counts
    }
}

/// How one suite ended.
struct Outcome {
    suite: Suite,
    counts: TestCounts,
    ok: bool,
    why: Option<String>,
    secs: f64,
}

struct Running {
    suite: Suite,
    child: Child,
    log: PathBuf,
    started: Instant,
}

struct Options {
    limits: Limits,
    test_threads: usize,
    log_dir: PathBuf,
    only: Option<Vec<String>>,
    test_args: Vec<String>,
}

fn usage() -> ! {
    eprintln!(
        "usage: e2e-suites [--jobs N] [--real-node-jobs N] [--test-threads N] [--log-dir DIR] \
         [--only a,b] [-- ARGS for every test binary]"
    );
    std::process::exit(2)
}

fn parse_options() -> Options {
    let mut opts = Options {
        limits: Limits {
            jobs: 4,
            real_node_jobs: 2,
        },
        test_threads: 4,
        log_dir: PathBuf::from(std::env::var("DBOP_TESTBED_DIR").unwrap_or(".testbed".into()))
            .join("suites"),
        only: None,
        test_args: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    let number = |flag: &str, v: Option<String>| -> usize {
        match v.as_deref().map(str::parse::<usize>) {
            Some(Ok(n)) if n > 0 => n,
            _ => {
                eprintln!("{flag} takes a whole number above 0");
                usage()
            }
        }
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--jobs" => opts.limits.jobs = number("--jobs", args.next()),
            "--real-node-jobs" => {
                opts.limits.real_node_jobs = number("--real-node-jobs", args.next())
            }
            "--test-threads" => opts.test_threads = number("--test-threads", args.next()),
            "--log-dir" => opts.log_dir = args.next().map(PathBuf::from).unwrap_or_else(|| usage()),
            "--only" => {
                let list = args.next().unwrap_or_else(|| usage());
                opts.only = Some(list.split(',').map(str::to_string).collect());
            }
            "--" => opts.test_args = args.by_ref().collect(),
            _ => {
                eprintln!("unknown argument {arg:?}");
                usage()
            }
        }
    }
    opts
}

/// The e2e crate's test binaries, built (or found fresh) by cargo: (suite name, executable).
/// Asked of the whole workspace, as `make build-tests` builds it: `-p dbop-e2e` alone would
/// resolve the dependencies' features differently and rebuild tokio, kube and dbop once more.
fn test_binaries() -> Result<Vec<(String, PathBuf)>, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .args([
            "test",
            "--workspace",
            "--locked",
            "--no-run",
            "--message-format=json",
        ])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {cargo}: {e}"))?;
    if !out.status.success() {
        return Err(format!("building the e2e suites failed ({})", out.status));
    }
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let is_test = msg["target"]["kind"]
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k == "test"));
        let is_e2e = msg["package_id"]
            .as_str()
            .is_some_and(|id| id.contains("#dbop-e2e@"));
        if let (true, Some(name), Some(exe)) = (
            is_test && is_e2e,
            msg["target"]["name"].as_str(),
            msg["executable"].as_str(),
        ) {
            found.push((name.to_string(), PathBuf::from(exe)));
        }
    }
    Ok(found)
}

/// The suites to run, longest expected first, each placed by the table. Refuses a suite the
/// table does not place and an entry with no suite.
fn suites(table: &SuiteTable, binaries: Vec<(String, PathBuf)>) -> Result<Vec<Suite>, String> {
    let mut unplaced = Vec::new();
    let mut suites = Vec::new();
    for (name, exe) in &binaries {
        match table.suites.get(name) {
            Some(p) => suites.push(Suite {
                name: name.clone(),
                exe: exe.clone(),
                group: p.group,
                expected_secs: p.seconds,
            }),
            None => unplaced.push(name.clone()),
        }
    }
    let stale: Vec<&String> = table
        .suites
        .keys()
        .filter(|k| !binaries.iter().any(|(n, _)| n == *k))
        .collect();
    if !unplaced.is_empty() || !stale.is_empty() {
        return Err(format!(
            "e2e/suites.yaml is out of date: suites with no entry {unplaced:?} (give each a group), \
             entries with no suite {stale:?}"
        ));
    }
    suites.sort_by(|a, b| {
        b.expected_secs
            .cmp(&a.expected_secs)
            .then(a.name.cmp(&b.name))
    });
    Ok(suites)
}

fn start(suite: Suite, opts: &Options) -> Result<Running, String> {
    let log = opts.log_dir.join(format!("{}.log", suite.name));
    let file = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = file.try_clone().map_err(|e| e.to_string())?;
    let child = Command::new(&suite.exe)
        .arg(format!("--test-threads={}", opts.test_threads))
        .arg("--nocapture")
        .args(&opts.test_args)
        .env("DBOP_E2E_SUITE", &suite.name)
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", suite.exe.display()))?;
    println!(
        "e2e suite {} [{}] started (last took {} s)",
        suite.name,
        suite.group.label(),
        suite.expected_secs
    );
    Ok(Running {
        suite,
        child,
        log,
        started: Instant::now(),
    })
}

/// The outcome of a suite whose process has ended (or was killed after the timeout).
fn finish(run: Running, status: Option<std::process::ExitStatus>) -> Outcome {
    let secs = run.started.elapsed().as_secs_f64();
    let text = std::fs::read_to_string(&run.log).unwrap_or_default();
    let counts = TestCounts::from_output(&text);
    let why = match status {
        None => Some(format!("killed after {} s", SUITE_TIMEOUT.as_secs())),
        Some(s) if !s.success() => Some(format!("exited with {s}")),
        Some(_) if counts.passed == 0 => Some("ran no test".to_string()),
        Some(_) => None,
    };
    let ok = why.is_none() && counts.failed == 0;
    for line in text
        .lines()
        .filter(|l| l.trim().starts_with("test result: "))
    {
        println!("{}: {}", run.suite.name, line.trim());
    }
    if ok {
        println!(
            "e2e suite {}: ok, {} passed in {secs:.0} s",
            run.suite.name, counts.passed
        );
    } else {
        println!(
            "e2e suite {}: FAILED ({}) in {secs:.0} s; its log ({}):",
            run.suite.name,
            why.as_deref().unwrap_or("a test failed"),
            run.log.display()
        );
        println!("{text}");
        println!("--- end of {}", run.log.display());
    }
    Outcome {
        suite: run.suite,
        counts,
        ok,
        why,
        secs,
    }
}

/// How much of each operator log a failed suite's namespaces leave is printed.
const OPERATOR_LOG_TAIL: usize = 80;

/// Deletes the namespaces the ended suite created (`dbop_e2e::delete_suite_namespaces`): a
/// finished suite's database pods would otherwise keep running on the real node, taking CPU,
/// pod slots and volumes from the suites after it. A failure here is printed, not fatal: the
/// test bed goes down at the end anyway. For a failed suite, the end of the log of each
/// operator it ran (one per namespace, in the test bed's `logs/`) is printed first: the test
/// bed, and those logs with it, is gone when CI shows the failure.
fn clean_up(outcome: &Outcome, suite_logs: &Path) {
    let suite = outcome.suite.name.as_str();
    let kubeconfig = std::env::var_os("KUBECONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(".testbed/kubeconfig"));
    let deleted = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
        .and_then(|rt| rt.block_on(dbop_e2e::delete_suite_namespaces(&kubeconfig, suite)));
    let namespaces = match deleted {
        Ok(names) => names,
        Err(e) => {
            println!("e2e suite {suite}: its namespaces were not deleted: {e}");
            return;
        }
    };
    if !outcome.ok {
        let logs = suite_logs.parent().unwrap_or(Path::new(".")).join("logs");
        for ns in &namespaces {
            let path = logs.join(format!("dbop-{ns}.log"));
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(OPERATOR_LOG_TAIL)..];
            println!("--- the last {} lines of {}:", tail.len(), path.display());
            tail.iter().for_each(|l| println!("{l}"));
            println!("--- end of {}", path.display());
        }
    }
    if !outcome.ok && outcome.suite.group == Group::RealNode {
        print_real_node_health(suite_logs.parent().unwrap_or(Path::new(".")));
    }
    if !namespaces.is_empty() {
        println!(
            "e2e suite {suite}: its {} namespace(s) deleted",
            namespaces.len()
        );
    }
}

/// The real node's processes and the last lines of their logs, printed after a real-node suite
/// failed: a node that stopped starting pods or routing Services (a process gone, an error in a
/// loop) fails every suite after it the same way, and the test bed is gone when CI shows it.
fn print_real_node_health(testbed: &Path) {
    const PROCESSES: [&str; 4] = ["kubelet", "containerd", "kube-proxy", "coredns"];
    const TAIL: usize = 15;
    if let Ok(out) = std::process::Command::new("df")
        .arg("-h")
        .arg(testbed)
        .output()
    {
        print!(
            "--- real node: disk\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    if let Ok(meminfo) = std::fs::read_to_string("/proc/meminfo") {
        let available = meminfo.lines().find(|l| l.starts_with("MemAvailable"));
        println!(
            "--- real node: {}",
            available.unwrap_or("MemAvailable unknown")
        );
    }
    for name in PROCESSES {
        let pid = std::fs::read_to_string(testbed.join("pids").join(format!("{name}.pid")));
        let alive = match pid.as_deref().map(str::trim) {
            Ok(pid) if Path::new("/proc").join(pid).exists() => format!("running (pid {pid})"),
            Ok(pid) => format!("NOT RUNNING (pid {pid} gone)"),
            Err(_) => "no pid file".to_string(),
        };
        println!("--- real node: {name} {alive}");
        let Ok(text) = std::fs::read_to_string(testbed.join("logs").join(format!("{name}.log")))
        else {
            continue;
        };
        let lines: Vec<&str> = text.lines().collect();
        for line in &lines[lines.len().saturating_sub(TAIL)..] {
            println!("    {line}");
        }
    }
}

fn print_table(outcomes: &mut [Outcome], wall: f64) {
    outcomes.sort_by(|a, b| b.secs.total_cmp(&a.secs));
    println!(
        "\n{:<20} {:<10} {:>7} {:>7} {:>6} {:>8}  result",
        "suite", "group", "passed", "failed", "secs", "expected"
    );
    for o in outcomes.iter() {
        println!(
            "{:<20} {:<10} {:>7} {:>7} {:>6.0} {:>8}  {}",
            o.suite.name,
            o.suite.group.label(),
            o.counts.passed,
            o.counts.failed,
            o.secs,
            o.suite.expected_secs,
            if o.ok {
                "ok"
            } else {
                o.why.as_deref().unwrap_or("FAILED")
            }
        );
    }
    let sum: f64 = outcomes.iter().map(|o| o.secs).sum();
    println!(
        "e2e wall {wall:.0} s for {sum:.0} s of suites ({:.1}x overlap)",
        sum / wall.max(1.0)
    );
}

/// Appends each suite's time to `$DBOP_TIMES` (the table `.ci/run` prints), when set.
fn record_times(outcomes: &[Outcome]) {
    let Some(path) = std::env::var_os("DBOP_TIMES") else {
        return;
    };
    let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(Path::new(&path))
    else {
        return;
    };
    for o in outcomes {
        let _ = writeln!(file, "e2e {}\t{:.0}", o.suite.name, o.secs);
    }
}

fn load_table() -> Result<SuiteTable, String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("suites.yaml");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_norway::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn run(opts: Options) -> Result<bool, String> {
    let table = load_table()?;
    let mut pending = suites(&table, test_binaries()?)?;
    if let Some(only) = &opts.only {
        pending.retain(|s| only.contains(&s.name));
    }
    std::fs::create_dir_all(&opts.log_dir).map_err(|e| e.to_string())?;
    println!(
        "e2e: {} suites, at most {} at once ({} on the real node), logs in {}",
        pending.len(),
        opts.limits.jobs,
        opts.limits.real_node_jobs,
        opts.log_dir.display()
    );
    let t0 = Instant::now();
    let mut running: Vec<Running> = Vec::new();
    let mut outcomes: Vec<Outcome> = Vec::new();
    while !pending.is_empty() || !running.is_empty() {
        let groups: Vec<Group> = running.iter().map(|r| r.suite.group).collect();
        if let Some(i) = next_to_start(&pending, &groups, opts.limits) {
            running.push(start(pending.remove(i), &opts)?);
            continue;
        }
        std::thread::sleep(POLL);
        let mut i = 0;
        while i < running.len() {
            let status = running[i].child.try_wait().map_err(|e| e.to_string())?;
            let timed_out = running[i].started.elapsed() > SUITE_TIMEOUT;
            if status.is_none() && !timed_out {
                i += 1;
                continue;
            }
            let mut run = running.swap_remove(i);
            if status.is_none() {
                let _ = run.child.kill();
                let _ = run.child.wait();
            }
            let outcome = finish(run, status);
            clean_up(&outcome, &opts.log_dir);
            outcomes.push(outcome);
        }
    }
    print_table(&mut outcomes, t0.elapsed().as_secs_f64());
    record_times(&outcomes);
    let passed: u64 = outcomes.iter().map(|o| o.counts.passed).sum();
    let failed: u64 = outcomes.iter().map(|o| o.counts.failed).sum();
    let broken = outcomes.iter().filter(|o| !o.ok).count();
    println!("e2e: {passed} passed, {failed} failed");
    if broken > 0 {
        println!("e2e: {broken} suite(s) failed (their logs are printed above)");
    }
    Ok(broken == 0)
}

fn main() {
    let opts = parse_options();
    match run(opts) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("e2e-suites: {e}");
            std::process::exit(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn suite(name: &str, group: Group, secs: u64) -> Suite {
        Suite {
            name: name.into(),
            exe: PathBuf::from(name),
            group,
            expected_secs: secs,
        }
    }

    const LIMITS: Limits = Limits {
        jobs: 3,
        real_node_jobs: 1,
    };

    #[test]
    fn the_first_startable_suite_starts_up_to_the_limits() {
        let pending = [
            suite("real", Group::RealNode, 300),
            suite("kwok", Group::Kwok, 100),
        ];
        assert_eq!(next_to_start(&pending, &[], LIMITS), Some(0));
        // The real node is full: the kwok suite goes next.
        assert_eq!(next_to_start(&pending, &[Group::RealNode], LIMITS), Some(1));
        // Every slot is taken.
        let full = [Group::Kwok, Group::Kwok, Group::Kwok];
        assert_eq!(next_to_start(&pending, &full, LIMITS), None);
        let real_only = [suite("real", Group::RealNode, 300)];
        assert_eq!(next_to_start(&real_only, &[Group::RealNode], LIMITS), None);
    }

    #[test]
    fn an_alone_suite_waits_for_everything_else_and_blocks_the_rest() {
        let pending = [suite("cp", Group::Alone, 80), suite("k", Group::Kwok, 10)];
        // Something else is pending: the alone suite waits even with nothing running.
        assert_eq!(next_to_start(&pending, &[], LIMITS), Some(1));
        let only_alone = [suite("cp", Group::Alone, 80)];
        assert_eq!(next_to_start(&only_alone, &[Group::Kwok], LIMITS), None);
        assert_eq!(next_to_start(&only_alone, &[], LIMITS), Some(0));
        // Nothing starts beside it.
        let later = [suite("k", Group::Kwok, 10)];
        assert_eq!(next_to_start(&later, &[Group::Alone], LIMITS), None);
    }

    #[test]
    fn test_result_lines_are_summed() {
        let text = "running 2 tests\n\
            test a ... ok\n\
            test result: ok. 2 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 3.1s\n\
            noise: 7 passed\n\
            test result: FAILED. 1 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out\n";
        assert_eq!(
            TestCounts::from_output(text),
            TestCounts {
                passed: 3,
                failed: 2,
                ignored: 1
            }
        );
        assert_eq!(TestCounts::from_output("no results"), TestCounts::default());
    }

    #[test]
    fn the_table_places_every_suite_and_nothing_else() {
        let table: SuiteTable = serde_norway::from_str(
            "suites:\n  a: {group: kwok, seconds: 5}\n  b: {group: real-node, seconds: 50}\n",
        )
        .unwrap();
        let both = vec![("a".into(), "a".into()), ("b".into(), "b".into())];
        let order: Vec<String> = suites(&table, both)
            .unwrap()
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(order, ["b", "a"], "longest first");
        let err = suites(
            &table,
            vec![("a".into(), "a".into()), ("c".into(), "c".into())],
        )
        .unwrap_err();
        assert!(err.contains("[\"c\"]") && err.contains("[\"b\"]"), "{err}");
    }

    #[test]
    fn the_checked_in_table_parses_and_names_every_suite_file() {
        let table = load_table().unwrap();
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                name.strip_suffix(".rs").map(str::to_string)
            })
            .collect();
        files.sort();
        let entries: Vec<String> = table.suites.keys().cloned().collect();
        assert_eq!(entries, files);
    }
}
