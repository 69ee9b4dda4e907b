//! Volumes of a real, limited size on the test bed's real node, and a stand-in for the CSI
//! driver that would grow them: what the suites about full and growing volumes
//! (`e2e/tests/autogrow.rs`) run on.
//!
//! The real node's local PersistentVolumes are directories of the host's disk: a pod on them
//! sees the host's whole filesystem, and nothing resizes them (no CSI driver runs on the test
//! bed). Here each volume is a **tmpfs** mounted on a directory of the host (`mount -t tmpfs -o
//! size=…`), so the pod's `df`, PostgreSQL's writes and the instance manager's `statvfs` meet
//! its real limit (ENOSPC included), and it grows online (`mount -o remount,size=…`): the pod's
//! bind mount is the same filesystem and sees the new size at once. A local PersistentVolume of
//! that size points at the directory, with node affinity to the real node, pre-bound
//! (`claimRef`) to the claim the StatefulSet will make (`data-<database>-<ordinal>`).
//!
//! The [`Resizer`] task plays the CSI resizer and the kubelet's part of an expansion: when a
//! claim bound to one of these volumes asks for more than its `status.capacity`, it marks the
//! claim's resize in progress (`status.allocatedResources`, `allocatedResourceStatuses`), grows
//! the filesystem, sets the PersistentVolume's `spec.capacity`, then the claim's
//! `status.capacity` — the filesystem first, then the capacity, as a driver does. Each resize
//! is logged with its times and kept for the test to read ([`SizedVolumes::resizes`]).
//!
//! Two StorageClasses of the static `kubernetes.io/no-provisioner` kind, `WaitForFirstConsumer`:
//! [`EXPANDABLE_CLASS`] (`allowVolumeExpansion: true`) and [`FIXED_CLASS`] (without).
//!
//! tmpfs is memory: keep the sizes small. Its pages are charged to the memory cgroup of the
//! process that writes them, i.e. the database container, whose memory limit must leave room
//! for the data (the default 256Mi does not). Root is required (mount); without it the suite
//! fails, never skips. The directories are under `<test bed>/node/sized-pv/<namespace>.<claim>`,
//! where down.sh would unmount anything left; [`SizedVolumes`] unmounts and removes its own when
//! dropped, and at its start those of earlier runs whose namespace is gone.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::TestBed;
use crate::node::REAL_NODE;

/// A StorageClass whose volumes may grow (`allowVolumeExpansion: true`).
pub const EXPANDABLE_CLASS: &str = "dbop-e2e-expandable";
/// A StorageClass whose volumes may not grow (no `allowVolumeExpansion`).
pub const FIXED_CLASS: &str = "dbop-e2e-fixed";
/// The label of the PersistentVolumes made here.
pub const SIZED_VOLUME_LABEL: &str = "testbed.dbop.dev/sized-volume";
/// How often the resizer looks at the claims.
const RESIZER_PERIOD: Duration = Duration::from_millis(250);

const MIB: u64 = 1024 * 1024;

/// A filesystem's size and what is left of it, as `statvfs` gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    pub size_bytes: u64,
    /// What an unprivileged writer such as PostgreSQL can still use (`f_bavail`).
    pub free_bytes: u64,
}

impl Usage {
    pub fn used_bytes(&self) -> u64 {
        self.size_bytes.saturating_sub(self.free_bytes)
    }

    /// Whether at least `percent` % is in use, exactly (whether the share is rounded up, as the
    /// instance manager's report does, or down).
    pub fn at_least(&self, percent: u64) -> bool {
        self.used_bytes() * 100 >= self.size_bytes * percent
    }

    /// The share in use, in percent, rounded up: as the instance manager reports it.
    pub fn used_percent(&self) -> u64 {
        match self.size_bytes {
            0 => 0,
            size => (self.used_bytes() * 100).div_ceil(size),
        }
    }
}

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.1} of {:.1} MiB used ({} %), {:.1} MiB free",
            self.used_bytes() as f64 / MIB as f64,
            self.size_bytes as f64 / MIB as f64,
            self.used_percent(),
            self.free_bytes as f64 / MIB as f64
        )
    }
}

/// One volume: a tmpfs on the host and the PersistentVolume pre-bound to `claim`.
#[derive(Clone, Debug)]
pub struct SizedVolume {
    pub namespace: String,
    /// The claim the volume is bound to (`data-<database>-<ordinal>`).
    pub claim: String,
    /// The PersistentVolume's name: `<namespace>.<claim>`.
    pub pv: String,
    /// The tmpfs's mount point on the host (the PersistentVolume's `local.path`).
    pub dir: PathBuf,
}

impl SizedVolume {
    /// The filesystem's size and free space, read on the host (`stat -f`): what the pod sees.
    pub fn usage(&self) -> Usage {
        usage_of(&self.dir)
    }
}

/// One resize the [`Resizer`] made.
#[derive(Clone, Debug)]
pub struct Resize {
    pub claim: String,
    pub from_bytes: u64,
    pub to_bytes: u64,
    /// The request as the claim spelled it (e.g. `384Mi`).
    pub request: String,
    /// When the resizer saw the claim ask for more.
    pub seen: Instant,
    pub seen_at: chrono::DateTime<chrono::Utc>,
    /// From then until the claim's `status.capacity` said the new size.
    pub took: Duration,
}

/// The sized volumes of one test's namespace and the resizer that grows them. Dropping it
/// stops the resizer, unmounts and removes the directories, deletes the PersistentVolumes and
/// the namespace (the test's own; its pods hold the tmpfs memory until they go, as when the
/// suite runner deletes it).
pub struct SizedVolumes {
    client: kube::Client,
    bed_kubectl: PathBuf,
    kubeconfig: PathBuf,
    namespace: String,
    base: PathBuf,
    volumes: Arc<Mutex<Vec<SizedVolume>>>,
    resizes: Arc<Mutex<Vec<Resize>>>,
    resizer: tokio::task::JoinHandle<()>,
}

/// The stand-in resizer's task (see the module's documentation).
struct Resizer {
    pvs: Api<PersistentVolume>,
    claims: Api<PersistentVolumeClaim>,
    volumes: Arc<Mutex<Vec<SizedVolume>>>,
    resizes: Arc<Mutex<Vec<Resize>>>,
}

impl TestBed {
    /// The sized volumes of `namespace` (a fresh [`TestBed::real_node_namespace`]), with their
    /// StorageClasses and the resizer running. Removes what earlier runs left first.
    pub async fn sized_volumes(&self, namespace: &str) -> SizedVolumes {
        self.require_real_node().await;
        self.sized_volume_classes().await;
        let base = self.dir.join("node/sized-pv");
        std::fs::create_dir_all(&base)
            .unwrap_or_else(|e| panic!("creating {}: {e}", base.display()));
        self.remove_stale_sized_volumes(&base).await;
        let volumes = Arc::new(Mutex::new(Vec::new()));
        let resizes = Arc::new(Mutex::new(Vec::new()));
        let resizer = Resizer {
            pvs: Api::all(self.client.clone()),
            claims: Api::namespaced(self.client.clone(), namespace),
            volumes: volumes.clone(),
            resizes: resizes.clone(),
        };
        SizedVolumes {
            client: self.client.clone(),
            bed_kubectl: self.kubectl_path(),
            kubeconfig: self.kubeconfig.clone(),
            namespace: namespace.to_string(),
            base,
            volumes,
            resizes,
            resizer: tokio::spawn(resizer.run()),
        }
    }

    /// Both StorageClasses, applied (idempotent; shared by every test).
    async fn sized_volume_classes(&self) {
        let api: Api<StorageClass> = Api::all(self.client.clone());
        for (name, expandable) in [(EXPANDABLE_CLASS, true), (FIXED_CLASS, false)] {
            let mut class = json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": name},
                "provisioner": "kubernetes.io/no-provisioner",
                "volumeBindingMode": "WaitForFirstConsumer",
                "reclaimPolicy": "Retain",
            });
            if expandable {
                class["allowVolumeExpansion"] = json!(true);
            }
            api.patch(
                name,
                &PatchParams::apply("dbop-e2e-sized-volume").force(),
                &Patch::Apply(&class),
            )
            .await
            .unwrap_or_else(|e| panic!("applying StorageClass {name}: {e}"));
        }
    }

    /// Unmounts and removes the directories, and deletes the PersistentVolumes, of namespaces
    /// that are gone or going (a crashed or killed earlier run; a finished suite's).
    async fn remove_stale_sized_volumes(&self, base: &Path) {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let live = |ns: String| {
            let namespaces = namespaces.clone();
            async move {
                match namespaces.get_opt(&ns).await {
                    Ok(Some(n)) => n.metadata.deletion_timestamp.is_none(),
                    Ok(None) => false,
                    // Unknown: leave it.
                    Err(_) => true,
                }
            }
        };
        for entry in std::fs::read_dir(base).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some((ns, _)) = name.split_once('.') else {
                continue;
            };
            if !live(ns.to_string()).await {
                eprintln!("sized-volume: removing {name}, left by an earlier run");
                unmount_and_remove(&entry.path());
            }
        }
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let list = pvs
            .list(&ListParams::default().labels(SIZED_VOLUME_LABEL))
            .await
            .expect("listing the sized PersistentVolumes");
        for pv in list.items {
            let name = pv.metadata.name.unwrap_or_default();
            let Some((ns, _)) = name.split_once('.') else {
                continue;
            };
            if pv.metadata.deletion_timestamp.is_none() && !live(ns.to_string()).await {
                let _ = pvs.delete(&name, &Default::default()).await;
            }
        }
    }
}

impl SizedVolumes {
    /// A tmpfs of `size_mib` MiB and a PersistentVolume of `class` on it, pre-bound to `claim`
    /// of this namespace.
    pub async fn add(&self, claim: &str, class: &str, size_mib: u64) -> SizedVolume {
        let pv = format!("{}.{claim}", self.namespace);
        let dir = self.base.join(&pv);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        run(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                &format!("size={}m,mode=0777", size_mib),
                "tmpfs",
                &dir.to_string_lossy(),
            ],
        )
        .unwrap_or_else(|e| {
            panic!(
                "mounting a tmpfs on {}: {e} (the real-node suites run as root)",
                dir.display()
            )
        });
        let volume = SizedVolume {
            namespace: self.namespace.clone(),
            claim: claim.to_string(),
            pv: pv.clone(),
            dir: dir.clone(),
        };
        // Registered before the PersistentVolume exists, so that drop cleans it up.
        self.volumes.lock().unwrap().push(volume.clone());
        let usage = volume.usage();
        assert_eq!(
            usage.size_bytes,
            size_mib * MIB,
            "the tmpfs on {} has the size asked for",
            dir.display()
        );
        let object: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": pv, "labels": {SIZED_VOLUME_LABEL: "true"}},
            "spec": {
                "storageClassName": class,
                "capacity": {"storage": format!("{size_mib}Mi")},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "volumeMode": "Filesystem",
                "claimRef": {"namespace": self.namespace, "name": claim},
                "local": {"path": dir.to_string_lossy()},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [REAL_NODE]},
                ]}]}},
            },
        }))
        .expect("PersistentVolume");
        Api::<PersistentVolume>::all(self.client.clone())
            .create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("creating PersistentVolume {pv}: {e}"));
        volume
    }

    /// The resizes made so far, in order.
    pub fn resizes(&self) -> Vec<Resize> {
        self.resizes.lock().unwrap().clone()
    }

    /// The resizes of one claim so far, in order.
    pub fn resizes_of(&self, claim: &str) -> Vec<Resize> {
        self.resizes()
            .into_iter()
            .filter(|r| r.claim == claim)
            .collect()
    }
}

impl Drop for SizedVolumes {
    fn drop(&mut self) {
        self.resizer.abort();
        let kubectl = |args: &[&str]| {
            let _ = Command::new(&self.bed_kubectl)
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .args(args)
                .output();
        };
        // The namespace first: its pods go, and with them the last users of the tmpfs.
        kubectl(&["delete", "namespace", &self.namespace, "--wait=false"]);
        let volumes = self.volumes.lock().map(|v| v.clone()).unwrap_or_default();
        for volume in volumes {
            kubectl(&["delete", "pv", &volume.pv, "--wait=false"]);
            unmount_and_remove(&volume.dir);
        }
    }
}

impl Resizer {
    async fn run(self) {
        loop {
            if let Err(e) = self.pass().await {
                eprintln!("sized-volume resizer: {e} (retrying)");
            }
            tokio::time::sleep(RESIZER_PERIOD).await;
        }
    }

    /// Grows every volume whose claim asks for more than its capacity.
    async fn pass(&self) -> Result<(), String> {
        let volumes: BTreeMap<String, SizedVolume> = self
            .volumes
            .lock()
            .unwrap()
            .iter()
            .map(|v| (v.pv.clone(), v.clone()))
            .collect();
        if volumes.is_empty() {
            return Ok(());
        }
        let claims = self
            .claims
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("listing the claims: {e}"))?;
        for claim in claims.items {
            let Some(volume) = claim
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.as_ref())
                .and_then(|pv| volumes.get(pv))
            else {
                continue;
            };
            let Some(request) = claim.spec.as_ref().and_then(|s| {
                s.resources
                    .as_ref()?
                    .requests
                    .as_ref()?
                    .get("storage")
                    .cloned()
            }) else {
                continue;
            };
            let capacity = claim
                .status
                .as_ref()
                .and_then(|s| s.capacity.as_ref()?.get("storage").cloned());
            let requested = quantity_bytes(&request.0)?;
            let current = match &capacity {
                Some(q) => quantity_bytes(&q.0)?,
                None => continue, // not bound yet
            };
            if requested > current {
                self.resize(volume, &request.0, current, requested).await?;
            }
        }
        Ok(())
    }

    async fn resize(
        &self,
        volume: &SizedVolume,
        request: &str,
        from: u64,
        to: u64,
    ) -> Result<(), String> {
        let seen = Instant::now();
        let seen_at = chrono::Utc::now();
        let status = |value| Patch::Merge(json!({ "status": value }));
        let pp = PatchParams::default();
        // As an external resizer starts: the claim's resize is in progress.
        self.claims
            .patch_status(
                &volume.claim,
                &pp,
                &status(json!({
                    "allocatedResources": {"storage": request},
                    "allocatedResourceStatuses": {"storage": "ControllerResizeInProgress"},
                })),
            )
            .await
            .map_err(|e| format!("marking {}'s resize in progress: {e}", volume.claim))?;
        // The filesystem grows (online: the pod's bind mount sees it at once) …
        let grown = grow_tmpfs(volume, to)?;
        // … then the volume's capacity, then the claim's.
        self.pvs
            .patch(
                &volume.pv,
                &pp,
                &Patch::Merge(json!({"spec": {"capacity": {"storage": request}}})),
            )
            .await
            .map_err(|e| format!("setting {}'s capacity: {e}", volume.pv))?;
        self.claims
            .patch_status(
                &volume.claim,
                &pp,
                &status(json!({
                    "capacity": {"storage": request},
                    "allocatedResources": {"storage": request},
                    "allocatedResourceStatuses": null,
                })),
            )
            .await
            .map_err(|e| format!("setting {}'s capacity: {e}", volume.claim))?;
        let took = seen.elapsed();
        eprintln!(
            "sized-volume: {} claim {} grew from {:.0} to {:.0} MiB (asked {request}): tmpfs \
             remounted, PersistentVolume {} and the claim's status.capacity set, in {:.2} s; \
             now {grown}",
            seen_at.format("%H:%M:%S%.3f"),
            volume.claim,
            from as f64 / MIB as f64,
            to as f64 / MIB as f64,
            volume.pv,
            took.as_secs_f64(),
        );
        self.resizes.lock().unwrap().push(Resize {
            claim: volume.claim.clone(),
            from_bytes: from,
            to_bytes: to,
            request: request.to_string(),
            seen,
            seen_at,
            took,
        });
        Ok(())
    }
}

/// Remounts `volume`'s tmpfs `to` bytes large; its usage after.
fn grow_tmpfs(volume: &SizedVolume, to: u64) -> Result<Usage, String> {
    let size_kib = to.div_ceil(1024);
    run(
        "mount",
        &[
            "-o",
            &format!("remount,size={size_kib}k"),
            &volume.dir.to_string_lossy(),
        ],
    )?;
    let grown = volume.usage();
    if grown.size_bytes < to {
        return Err(format!(
            "the tmpfs on {} is {} bytes after the remount, not {to}",
            volume.dir.display(),
            grown.size_bytes
        ));
    }
    Ok(grown)
}

/// The bytes of a Kubernetes quantity (`384Mi`, `402653184`, `0.5Gi`).
pub fn quantity_bytes(quantity: &str) -> Result<u64, String> {
    dbop::resources::quantity::bytes(quantity)
        .and_then(|b| u64::try_from(b).ok())
        .ok_or_else(|| format!("{quantity:?} is not a quantity of bytes"))
}

/// `statvfs` of a directory's filesystem, through `stat -f`.
fn usage_of(dir: &Path) -> Usage {
    let out = Command::new("stat")
        .args(["-f", "--format=%S %b %a"])
        .arg(dir)
        .output()
        .expect("running stat");
    assert!(
        out.status.success(),
        "stat -f {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let numbers: Vec<u64> = text
        .split_whitespace()
        .filter_map(|n| n.parse().ok())
        .collect();
    let [block, blocks, available] = numbers[..] else {
        panic!("stat -f {}: unexpected {text:?}", dir.display());
    };
    Usage {
        size_bytes: block * blocks,
        free_bytes: block * available,
    }
}

fn is_mount_point(dir: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let dir = dir.to_string_lossy();
    mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .any(|m| m == dir)
}

/// Unmounts (lazily when still in use) and removes a volume's directory; best effort.
fn unmount_and_remove(dir: &Path) {
    let path = dir.to_string_lossy();
    while is_mount_point(dir) {
        if run("umount", &[&path]).is_err() && run("umount", &["-l", &path]).is_err() {
            eprintln!("sized-volume: cannot unmount {path}");
            return;
        }
    }
    if let Err(e) = std::fs::remove_dir(dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        eprintln!("sized-volume: cannot remove {path}: {e}");
    }
}

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("running {program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
