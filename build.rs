//! Reads release.env (the registry path a release publishes to) into `DBOP_IMAGE_REPOSITORY`, so
//! that the operator's default agent image is its own published reference (src/settings.rs).

fn main() {
    // Read when the script runs, not baked in when it is compiled: a script compiled for another
    // checkout that shares this target directory would otherwise read that checkout's file.
    let manifest_dir =
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let path = std::path::Path::new(&manifest_dir).join("release.env");
    println!("cargo:rerun-if-changed={}", path.display());
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let repository = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("DBOP_IMAGE_REPOSITORY="))
        .map(str::trim)
        .filter(|v| !v.is_empty() && !v.contains(char::is_whitespace))
        .unwrap_or_else(|| {
            panic!(
                "{} has no DBOP_IMAGE_REPOSITORY=<registry path>",
                path.display()
            )
        });
    println!("cargo:rustc-env=DBOP_IMAGE_REPOSITORY={repository}");
}
