//! The registry path a release publishes to is set once, in release.env; everything that names it
//! must agree: the operator's default agent image (build.rs reads release.env), the chart's
//! image.repository and appVersion, docs/install.md and the README. No document or default may
//! name a bare `dbop:<version>` (Docker Hub's library namespace, where nothing is published).

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// release.env's value of `key`, read as the shell and make read it (KEY=value lines).
fn release_env(key: &str) -> String {
    read("release.env")
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("release.env has no {key}="))
        .to_string()
}

fn yaml(path: &str) -> serde_json::Value {
    serde_norway::from_str(&read(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_operator_defaults_to_its_own_published_image() {
    let repository = release_env("DBOP_IMAGE_REPOSITORY");
    assert_eq!(
        dbop::settings::DEFAULT_AGENT_IMAGE,
        format!("{repository}:{}", env!("CARGO_PKG_VERSION")),
        "the default agent image is not release.env's repository at the crate's version"
    );
    assert_eq!(dbop::settings::IMAGE_REPOSITORY, repository);
}

#[test]
fn the_chart_installs_the_published_image_of_its_version() {
    let values = yaml("charts/dbop/values.yaml");
    assert_eq!(
        values["image"]["repository"],
        release_env("DBOP_IMAGE_REPOSITORY").as_str(),
        "charts/dbop/values.yaml image.repository differs from release.env"
    );
    let chart = yaml("charts/dbop/Chart.yaml");
    assert_eq!(
        chart["appVersion"],
        env!("CARGO_PKG_VERSION"),
        "the chart's appVersion (the image tag it installs) is not the crate's version"
    );
}

#[test]
fn the_install_docs_name_the_published_image_and_chart() {
    let image = release_env("DBOP_IMAGE_REPOSITORY");
    let chart = format!("{}/dbop", release_env("DBOP_CHART_REPOSITORY"));
    let install = read("docs/install.md");
    for wanted in [
        format!("helm install dbop {chart}"),
        format!("{image}:{}", env!("CARGO_PKG_VERSION")),
        "make release".to_string(),
    ] {
        assert!(
            install.contains(&wanted),
            "docs/install.md does not say {wanted:?}"
        );
    }
    let readme = read("README.md");
    assert!(
        readme.contains(&chart) && readme.contains(&image),
        "README.md does not name the chart {chart} and the image {image}"
    );
}

/// `dbop:<digit>` not preceded by a registry path (`/`), a word or `.`: Docker Hub's library.
fn bare_image_refs(text: &str) -> Vec<String> {
    let re = regex::Regex::new(r"(^|[^A-Za-z0-9_./-])dbop:[0-9]").unwrap();
    text.lines()
        .filter(|l| re.is_match(l))
        .map(str::to_string)
        .collect()
}

#[test]
fn nothing_names_a_bare_dbop_image() {
    let mut files = vec![
        root().join("README.md"),
        root().join("charts/dbop/values.yaml"),
        root().join("Dockerfile"),
        root().join("src/main.rs"),
        root().join("src/settings.rs"),
    ];
    for dir in ["docs", "charts/dbop/templates"] {
        for entry in std::fs::read_dir(root().join(dir)).unwrap() {
            let p = entry.unwrap().path();
            if p.is_file() {
                files.push(p);
            }
        }
    }
    let mut found = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        for line in bare_image_refs(&text) {
            found.push(format!("{}: {line}", rel(f)));
        }
    }
    assert!(
        found.is_empty(),
        "bare dbop:<version> images:\n{}",
        found.join("\n")
    );
}

fn rel(p: &Path) -> String {
    p.strip_prefix(root()).unwrap_or(p).display().to_string()
}

#[test]
fn a_bare_reference_is_found_and_a_registry_path_is_not() {
    assert_eq!(bare_image_refs("image: dbop:0.1.0").len(), 1);
    assert_eq!(bare_image_refs("`docker build -t dbop:0.1.0 .`").len(), 1);
    assert!(bare_image_refs("ghcr.io/dbop-dev/dbop:0.1.0 dbop.local/dbop:dev").is_empty());
}
