//! No import circles, in the operator (`src/`), the agent (`backups/src/`) and the contract crate
//! (`contract/src/`): neither between files nor between the top-level modules of a crate (a
//! module that imports one that imports it back is a circle even when the files differ).
//!
//! And no pure module of the operator (no client, no clock: the decisions, the builders, the
//! facts) reaches an I/O module (`kube_io`, `context`), straight or through another module.
//!
//! Edges are the `crate::…` and `super::…` paths a file names outside its `#[cfg(test)]` part,
//! each resolved to the longest module that has a file. Run by `make lint`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path (`reconcile::act`; the crate root is the empty path) → the modules it names.
type Graph = BTreeMap<String, BTreeSet<String>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `a/b.rs` and `a/b/mod.rs` → `a::b`; `lib.rs` → ``; `main.rs` is another crate: None.
fn module_of(root: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(root).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    match parts.last().map(String::as_str) {
        Some("main") if parts.len() == 1 => return None,
        Some("lib") if parts.len() == 1 => parts.clear(),
        Some("mod") => {
            parts.pop();
        }
        _ => {}
    }
    Some(parts.join("::"))
}

/// The paths after each `prefix` (`crate::`, `super::`): `a::b::C` → `["a", "b", "C"]`.
fn paths_after(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut found = vec![];
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        let segments = rest[..end]
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        found.push(segments);
    }
    found
}

fn join(base: &str, segments: &[String]) -> String {
    let mut all: Vec<&str> = base.split("::").filter(|s| !s.is_empty()).collect();
    all.extend(segments.iter().map(String::as_str));
    all.join("::")
}

/// The longest module with a file that `path` starts with.
fn resolve(path: &str, modules: &BTreeSet<String>) -> String {
    let mut candidate = path.to_string();
    loop {
        if modules.contains(&candidate) {
            return candidate;
        }
        match candidate.rfind("::") {
            Some(i) => candidate.truncate(i),
            None => return String::new(),
        }
    }
}

/// The file-level import graph of the crate whose root is `root`.
fn file_graph(root: &Path) -> Graph {
    let mut files = vec![];
    rust_files(root, &mut files);
    let files: Vec<(String, PathBuf)> = files
        .into_iter()
        .filter_map(|f| Some((module_of(root, &f)?, f)))
        .collect();
    let modules: BTreeSet<String> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut graph = Graph::new();
    for (module, file) in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let parent = module.rsplit_once("::").map_or("", |(p, _)| p);
        let named = paths_after(code, "crate::")
            .into_iter()
            .map(|p| join("", &p))
            .chain(
                paths_after(code, "super::")
                    .into_iter()
                    .map(|p| join(parent, &p)),
            );
        let edges = graph.entry(module.clone()).or_default();
        for path in named {
            let target = resolve(&path, &modules);
            if &target != module && !target.is_empty() {
                edges.insert(target);
            }
        }
    }
    graph
}

/// The same graph between the top-level modules (`reconcile::act` → `reconcile`).
fn top_level(graph: &Graph) -> Graph {
    let top = |m: &str| m.split("::").next().unwrap_or_default().to_string();
    let mut out = Graph::new();
    for (from, targets) in graph {
        let edges = out.entry(top(from)).or_default();
        for to in targets {
            if top(to) != top(from) {
                edges.insert(top(to));
            }
        }
    }
    out
}

/// Every circle, each as the path that closes it (`a -> b -> a`), found by depth-first search.
fn circles(graph: &Graph) -> Vec<String> {
    fn visit(
        node: &str,
        graph: &Graph,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        found: &mut Vec<String>,
    ) {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut circle = stack[at..].to_vec();
            circle.push(node.to_string());
            found.push(circle.join(" -> "));
            return;
        }
        if !done.insert(node.to_string()) {
            return;
        }
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            visit(next, graph, stack, done, found);
        }
        stack.pop();
    }
    let mut found = vec![];
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        visit(node, graph, &mut vec![], &mut done, &mut found);
    }
    found
}

/// The circles of one crate, and how many imports were seen (a scan that finds none is broken).
fn check(crate_name: &str, root: &str) -> (Vec<String>, usize) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(root);
    let files = file_graph(&root);
    let edges: usize = files.values().map(BTreeSet::len).sum();
    assert!(
        files.len() > 3,
        "{crate_name}: only {} modules found in {}: the scan is broken",
        files.len(),
        root.display()
    );
    let mut problems: Vec<String> = circles(&files)
        .into_iter()
        .map(|c| format!("{crate_name}: import circle between files: {c}"))
        .collect();
    problems.extend(
        circles(&top_level(&files))
            .into_iter()
            .map(|c| format!("{crate_name}: import circle between top-level modules: {c}")),
    );
    println!(
        "{crate_name}: {} modules, {edges} imports, {} circles",
        files.len(),
        problems.len()
    );
    (problems, edges)
}

#[test]
fn no_import_circles() {
    let mut problems = vec![];
    for (name, root) in [
        ("dbop", "src"),
        ("dbop-backup", "backups/src"),
        ("dbop-contract", "contract/src"),
    ] {
        let (found, edges) = check(name, root);
        assert!(
            name == "dbop-contract" || edges > 20,
            "{name}: only {edges} imports found: the scan is broken"
        );
        problems.extend(found);
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[test]
fn the_check_finds_a_circle() {
    let graph: Graph = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(circles(&graph), vec!["a -> b -> c -> a".to_string()]);
    let files: Graph = [("x::one", vec!["y::two"]), ("y::two", vec!["x::three"])]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
        .collect();
    assert!(circles(&files).is_empty());
    assert_eq!(circles(&top_level(&files)), vec!["x -> y -> x".to_string()]);
    assert_eq!(
        paths_after(
            "use super::job::{A, B}; x::crate::no; crate::api::X",
            "super::"
        ),
        vec![vec!["job".to_string()]]
    );
    assert_eq!(
        paths_after("use crate::api::{A}; my_crate::x", "crate::"),
        vec![vec!["api".to_string()]]
    );
}

/// The operator's pure modules (a folder stands for every module in it).
const PURE: &[&str] = &[
    "api",
    "objects",
    "settings",
    "resources",
    "upgrade",
    "backup::job",
    "backup::plan",
    "backup::s3_secret",
    "backup::schedule",
    "backup::settings",
    "backup::verify",
    "backup::window",
    "database::autogrow",
    "database::blocker",
    "database::restore",
    "database::build",
    "database::decide",
    "database::deletion",
    "database::events",
    "database::facts",
    "resources::quantity",
    "resources::server_config",
    "database::restart",
    "database::status",
    "database_backup::decide",
    "database_backup::facts",
];
/// The operator's I/O modules: what talks to the API server or holds what a pass shares.
const IO: &[&str] = &["kube_io", "context"];

fn within(module: &str, of: &str) -> bool {
    module == of || module.starts_with(&format!("{of}::"))
}

/// Each pure module that reaches an I/O module, with the path that does.
fn impure(graph: &Graph, pure: &[&str], io: &[&str]) -> Vec<String> {
    let mut found = vec![];
    for start in graph.keys().filter(|m| pure.iter().any(|p| within(m, p))) {
        let mut seen = BTreeSet::new();
        let mut todo = vec![vec![start.clone()]];
        while let Some(path) = todo.pop() {
            let last = path.last().unwrap();
            if io.iter().any(|i| within(last, i)) {
                found.push(path.join(" -> "));
                break;
            }
            for next in graph.get(last).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    let mut longer = path.clone();
                    longer.push(next.clone());
                    todo.push(longer);
                }
            }
        }
    }
    found
}

#[test]
fn pure_modules_import_no_io() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = file_graph(&root);
    for module in PURE {
        assert!(
            graph.keys().any(|m| within(m, module)),
            "{module} is listed as pure but no such module exists"
        );
    }
    let found = impure(&graph, PURE, IO);
    assert!(
        found.is_empty(),
        "pure modules reach I/O:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_check_finds_a_pure_module_that_reaches_io() {
    let graph: Graph = [("p", vec!["q"]), ("q", vec!["io::x"]), ("r", vec!["p"])]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
        .collect();
    assert_eq!(impure(&graph, &["p"], &["io"]), vec!["p -> q -> io::x"]);
    assert!(impure(&graph, &["io"], &["nothing"]).is_empty());
}
