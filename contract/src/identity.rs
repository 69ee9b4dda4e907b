//! Who PostgreSQL's programs run as, for the instance manager and the backup agent's
//! `recover`: `initdb` calls `getpwuid(geteuid())` and stops without an entry ("could not look
//! up effective user ID"), the server does the same at start, and peer authentication on the
//! local socket looks the connecting uid up too. A uid the image's `/etc/passwd` lacks (OpenShift
//! assigns one from the namespace's range) is given an entry with nss_wrapper: `LD_PRELOAD` of
//! the image's `libnss_wrapper.so`, and passwd and group files written for it (the official
//! docker-library entrypoint does the same for initdb).
//!
//! Pure: the decision and the files from what was read; each side reads `/etc/passwd`, writes
//! the files and sets the environment.

use std::path::{Path, PathBuf};

/// Where images keep `libnss_wrapper.so`, after `$NSS_WRAPPER_LIB` (Bitnami sets it): Debian's
/// multiarch directories (`libnss-wrapper`), then the plain ones (the docker-library
/// entrypoint's `{/usr,}/lib{/*,}/libnss_wrapper.so`).
pub const WRAPPER_DIRS: [&str; 6] = [
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib",
    "/lib",
];
/// The library's file name.
pub const WRAPPER_LIB: &str = "libnss_wrapper.so";
/// The user name PostgreSQL sees in the written passwd file.
pub const WRAPPED_USER: &str = "postgres";

/// How the manager's uid gets an entry PostgreSQL can look up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identity {
    /// The image's `/etc/passwd` has the uid: nothing to do.
    Listed,
    /// Not listed: run PostgreSQL's programs with nss_wrapper from this library.
    Wrapped { library: PathBuf },
    /// Not listed and no nss_wrapper in the image: initdb cannot run.
    Unknown,
}

/// Whether `passwd` (the text of `/etc/passwd`) has an entry for `uid`.
pub fn listed(passwd: &str, uid: u32) -> bool {
    passwd
        .lines()
        .filter_map(|line| line.split(':').nth(2))
        .any(|field| field.trim().parse::<u32>() == Ok(uid))
}

/// The places to look for the library, in order.
pub fn wrapper_candidates(nss_wrapper_lib: Option<&str>) -> Vec<PathBuf> {
    nss_wrapper_lib
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .into_iter()
        .chain(WRAPPER_DIRS.iter().map(|d| Path::new(d).join(WRAPPER_LIB)))
        .collect()
}

/// The decision: listed, or wrapped with the first candidate that `exists`, or unknown.
pub fn decide(listed: bool, candidates: &[PathBuf], exists: impl Fn(&Path) -> bool) -> Identity {
    if listed {
        return Identity::Listed;
    }
    match candidates.iter().find(|p| exists(p)) {
        Some(library) => Identity::Wrapped {
            library: library.clone(),
        },
        None => Identity::Unknown,
    }
}

/// The passwd file nss_wrapper reads: the image's entries, minus any other `postgres`, plus
/// `postgres` with this uid and gid (home: the data directory's parent).
pub fn passwd_file(image_passwd: &str, uid: u32, gid: u32, home: &Path) -> String {
    let mut text: String = image_passwd
        .lines()
        .filter(|l| !l.starts_with(&format!("{WRAPPED_USER}:")))
        .map(|l| format!("{l}\n"))
        .collect();
    text.push_str(&format!(
        "{WRAPPED_USER}:x:{uid}:{gid}:PostgreSQL:{}:/bin/false\n",
        home.display()
    ));
    text
}

/// The group file: the image's groups, plus `postgres` with this gid when the gid has none.
pub fn group_file(image_group: &str, gid: u32) -> String {
    let mut text: String = image_group.lines().map(|l| format!("{l}\n")).collect();
    if !listed(image_group, gid) {
        text.push_str(&format!("{WRAPPED_USER}:x:{gid}:\n"));
    }
    text
}

/// The files nss_wrapper reads and the environment that makes a program use them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wrapper {
    /// (path, text) of the passwd and group files, to write before any program starts.
    pub files: [(PathBuf, String); 2],
    /// `LD_PRELOAD`, `NSS_WRAPPER_PASSWD`, `NSS_WRAPPER_GROUP`.
    pub env: [(&'static str, PathBuf); 3],
}

/// The wrapper for `uid`/`gid` with `library`: its files in `dir` (`dbop-nss-passwd`,
/// `dbop-nss-group`), from the image's `/etc/passwd` and `/etc/group`, home `home`.
pub fn wrapper(
    library: &Path,
    image: [&str; 2],
    ids: (u32, u32),
    home: &Path,
    dir: &Path,
) -> Wrapper {
    let [image_passwd, image_group] = image;
    let (uid, gid) = ids;
    let (passwd, group) = (dir.join("dbop-nss-passwd"), dir.join("dbop-nss-group"));
    Wrapper {
        env: [
            ("LD_PRELOAD", library.to_path_buf()),
            ("NSS_WRAPPER_PASSWD", passwd.clone()),
            ("NSS_WRAPPER_GROUP", group.clone()),
        ],
        files: [
            (passwd, passwd_file(image_passwd, uid, gid, home)),
            (group, group_file(image_group, gid)),
        ],
    }
}

/// What a pod without an entry for its uid is told (`ImageUserNotFound` on the Database).
pub fn unknown_message(uid: u32) -> String {
    format!(
        "the container runs as uid {uid}, which has no entry in the image's /etc/passwd, and \
         the image has no libnss_wrapper.so to give it one: initdb, the server and peer \
         authentication need one. Set spec.podSecurity.runAsUser to the uid of the image's postgres user, or \
         use an image with libnss_wrapper (the official Debian postgres images have it)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
                          postgres:x:999:999:PostgreSQL:/var/lib/postgresql:/bin/bash\n";

    #[test]
    fn listed_reads_the_uid_field() {
        assert!(listed(PASSWD, 999));
        assert!(listed(PASSWD, 0));
        assert!(!listed(PASSWD, 99));
        assert!(!listed(PASSWD, 1000650000));
        assert!(!listed("garbage\n:::\n", 0));
        assert!(!listed("", 0));
    }

    #[test]
    fn decide_wraps_only_unlisted_uids_and_only_with_a_library() {
        let candidates = wrapper_candidates(Some("/opt/bitnami/common/lib/libnss_wrapper.so"));
        assert_eq!(
            candidates[0],
            PathBuf::from("/opt/bitnami/common/lib/libnss_wrapper.so")
        );
        assert_eq!(wrapper_candidates(Some("")).len(), WRAPPER_DIRS.len());
        let debian = Path::new("/usr/lib/x86_64-linux-gnu/libnss_wrapper.so");
        assert_eq!(decide(true, &candidates, |_| true), Identity::Listed);
        assert_eq!(
            decide(false, &candidates, |p| p == debian),
            Identity::Wrapped {
                library: debian.to_path_buf()
            }
        );
        assert_eq!(decide(false, &candidates, |_| false), Identity::Unknown);
    }

    #[test]
    fn the_written_files_name_the_uid_postgres() {
        let home = Path::new("/var/lib/postgresql/data");
        let passwd = passwd_file(PASSWD, 1000650000, 0, home);
        assert!(listed(&passwd, 1000650000));
        assert!(
            !listed(&passwd, 999),
            "the image's other postgres entry goes"
        );
        assert!(passwd.starts_with("root:x:0:0:"));
        assert!(
            passwd.ends_with(
                "postgres:x:1000650000:0:PostgreSQL:/var/lib/postgresql/data:/bin/false\n"
            )
        );
        assert_eq!(group_file("root:x:0:\n", 0), "root:x:0:\n");
        assert_eq!(
            group_file("root:x:0:", 1000650000),
            "root:x:0:\npostgres:x:1000650000:\n"
        );
        assert!(unknown_message(5).contains("spec.podSecurity.runAsUser"));
    }

    #[test]
    fn the_wrapper_points_the_library_at_its_two_files() {
        let (lib, dir) = (Path::new("/lib/libnss_wrapper.so"), Path::new("/run/x"));
        let w = wrapper(lib, [PASSWD, "root:x:0:\n"], (1000650000, 0), dir, dir);
        assert_eq!(w.env[0], ("LD_PRELOAD", lib.to_path_buf()));
        assert_eq!(w.env[1].1, w.files[0].0);
        assert_eq!(w.env[2].1, w.files[1].0);
        assert!(w.files[0].0.starts_with(dir) && w.files[1].0.starts_with(dir));
        assert!(listed(&w.files[0].1, 1000650000));
        assert_eq!(w.files[1].1, "root:x:0:\n");
    }
}
