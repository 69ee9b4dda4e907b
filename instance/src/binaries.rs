//! Where the PostgreSQL binaries of a major version are: the Debian layout
//! (`/usr/lib/postgresql/<major>/bin`, used by the official images too), else `PATH`.
//!
//! Pure: the caller says which candidate directories hold a `postgres` executable.

use std::path::{Path, PathBuf};

/// The directories to look in, in order of preference.
pub fn candidates(major: u32, path_var: &str) -> Vec<PathBuf> {
    let mut out = vec![PathBuf::from(format!("/usr/lib/postgresql/{major}/bin"))];
    out.extend(
        std::env::split_paths(path_var).filter(|p| !p.as_os_str().is_empty() && p.is_absolute()),
    );
    out
}

/// The first candidate for which `has_postgres` is true.
pub fn choose(candidates: &[PathBuf], has_postgres: impl Fn(&Path) -> bool) -> Option<PathBuf> {
    candidates.iter().find(|d| has_postgres(d)).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debian_layout_first_then_path() {
        let c = candidates(15, "/usr/local/bin:relative:/usr/bin");
        assert_eq!(
            c,
            vec![
                PathBuf::from("/usr/lib/postgresql/15/bin"),
                PathBuf::from("/usr/local/bin"),
                PathBuf::from("/usr/bin"),
            ]
        );
        let in_path = |d: &Path| d == Path::new("/usr/bin");
        assert_eq!(choose(&c, in_path), Some(PathBuf::from("/usr/bin")));
        let both = |d: &Path| d.starts_with("/usr/lib") || d == Path::new("/usr/bin");
        assert_eq!(
            choose(&c, both),
            Some(PathBuf::from("/usr/lib/postgresql/15/bin"))
        );
        assert_eq!(choose(&c, |_| false), None);
    }
}
