//! What the kubelet does with a Job's container before it runs, for the contract tests: the
//! Secret volumes written as files, the environment taken as it is.

use std::collections::BTreeMap;
use std::path::Path;

/// The container's command line and environment as the kubelet would run them: every Secret
/// volume the container mounts written under `root` from `secrets` (its items, or every key of
/// the Secret), and the paths into those mounts rewritten to those files. An environment
/// variable read from a Secret fails the test: secrets reach the agent as files only.
pub fn resolve(
    pod: &k8s_openapi::api::core::v1::PodSpec,
    root: &Path,
    secrets: &BTreeMap<(&str, &str), &str>,
) -> (Vec<String>, Vec<(String, String)>) {
    let container = &pod.containers[0];
    let mut argv = container.command.clone().unwrap_or_default();
    argv.extend(container.args.clone().unwrap_or_default());
    let mut mounted = Vec::new();
    for m in container.volume_mounts.iter().flatten() {
        let Some(secret) = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == m.name)
            .and_then(|v| v.secret.clone())
        else {
            continue;
        };
        assert_eq!(secret.default_mode, Some(0o440), "{}", m.name);
        let name = secret.secret_name.clone().unwrap();
        let files: Vec<(String, String)> = match &secret.items {
            Some(items) => items
                .iter()
                .map(|i| (i.key.clone(), i.path.clone()))
                .collect(),
            None => secrets
                .keys()
                .filter(|(s, _)| *s == name)
                .map(|(_, k)| (k.to_string(), k.to_string()))
                .collect(),
        };
        let dir = root.join(&m.name);
        std::fs::create_dir_all(&dir).unwrap();
        for (key, path) in files {
            let value = secrets
                .get(&(name.as_str(), key.as_str()))
                .unwrap_or_else(|| {
                    panic!("the Job mounts a secret key nobody provided: {name}/{key}")
                });
            std::fs::write(dir.join(path), value).unwrap();
        }
        mounted.push((m.mount_path.clone(), dir.display().to_string()));
    }
    let env = container
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|e| {
            assert!(
                e.value_from.is_none(),
                "{} is read from a reference",
                e.name
            );
            let mut v = e.value.unwrap_or_default();
            for (path, dir) in &mounted {
                if let Some(rest) = v.strip_prefix(path.as_str()) {
                    v = format!("{dir}{rest}");
                }
            }
            (e.name, v)
        })
        .collect();
    (argv, env)
}
