//! The instances as the roles see them (`roles` decides from these): each database pod, their
//! WAL positions, the primary Lease, the Secrets they mount, whether a standby can take over
//! now. Facts, filled by `facts` from what `observe` read; pure.

use std::collections::{BTreeMap, BTreeSet};

use crate::resources::primary_lease::LeaseFact;
use crate::resources::replication::ROLE_LABEL;
use dbop_contract::position::Position;
use k8s_openapi::api::core::v1::Pod;

/// One database pod, as far as roles go.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodFact {
    pub name: String,
    /// Its role label now (`None`: none yet, as for every new pod).
    pub role_label: Option<String>,
    /// Ready and not being deleted.
    pub ready: bool,
    pub node: Option<String>,
    /// The pod's service account (the instances' one: its manager follows the primary Lease).
    pub service_account: Option<String>,
    /// The versions of the mounted Secrets it was last told about (`SECRETS_SEEN_ANNOTATION`).
    pub secrets_seen: Option<String>,
    /// The StatefulSet revision it runs (its `controller-revision-hash` label).
    pub revision: Option<String>,
}

/// On a database pod: the versions of the Secrets it mounts, as dbop last saw them. Changing it
/// updates the pod, and the kubelet re-syncs a pod's Secret volumes when the pod changes: a new
/// password or certificate reaches the instance manager in seconds, not at the kubelet's next
/// periodic sync (a minute or more).
pub const SECRETS_SEEN_ANNOTATION: &str = "dbop.dev/secrets-seen";

impl PodFact {
    /// Ready, and its manager follows the primary Lease (it runs as the instances' account
    /// `account`): a standby that can take the primary role by a switchover.
    fn ready_follower(&self, account: &str) -> bool {
        self.ready && self.service_account.as_deref() == Some(account)
    }

    /// What a cached database pod says.
    pub fn of(pod: &Pod) -> PodFact {
        let ready = pod.metadata.deletion_timestamp.is_none()
            && pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        PodFact {
            name: pod.metadata.name.clone().unwrap_or_default(),
            role_label: pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(ROLE_LABEL))
                .cloned(),
            ready,
            node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            service_account: pod
                .spec
                .as_ref()
                .and_then(|s| s.service_account_name.clone()),
            secrets_seen: pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(SECRETS_SEEN_ANNOTATION))
                .cloned(),
            revision: pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(crate::upgrade::facts::REVISION_LABEL))
                .cloned(),
        }
    }
}

/// What the roles are decided from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RolesFact {
    /// The Database's database pods.
    pub pods: Vec<PodFact>,
    /// The WAL position of each pod whose manager answered (`positions`), by pod name.
    pub positions: BTreeMap<String, Position>,
    /// The replication Secret exists.
    pub replication_secret: bool,
    /// The primary Lease (`None`: none exists, or the Database has one instance).
    pub lease: Option<LeaseFact>,
    /// The pass's `now`, Unix milliseconds.
    pub now_ms: i64,
    /// The versions of the Secrets the database pods mount (`mounted_secrets`; empty: none yet).
    pub mounted_secrets: String,
    /// The StatefulSet is moving its pods to this revision (its update revision while it
    /// differs from the current one; `None`: no rollout under way).
    pub rolling_to: Option<String>,
    /// The nodes of the pods that are cordoned (`kubectl drain`'s first step).
    pub cordoned_nodes: BTreeSet<String>,
    /// Where a version upgrade stands: while it rolls out, the primary's pod is still replaced
    /// last, after a switchover; in its other stages it places the pods itself.
    pub version_upgrade: VersionUpgrade,
}

/// Whether a standby can take the primary role by a switchover now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TakeOver {
    Can,
    /// Not yet: its manager did not answer in this pass, or its stream is not up yet.
    NotYet,
    /// It is not a standby of the primary (a former primary, or on another timeline).
    Cannot,
}

impl RolesFact {
    /// Whether `name` can take the primary role from `current` by a switchover: its pod is
    /// ready and follows the Lease, and, when `current`'s manager reports its position (every
    /// manager of this dbop does), its own manager said in this same pass that it streams as a
    /// standby on `current`'s timeline. A Ready condition alone can be stale: the pods of a
    /// lost node stay Ready until the node controller's grace runs out, and one that came back
    /// as a former primary would be promoted without every commit made since.
    pub(super) fn take_over(&self, name: &str, current: &str, account: &str) -> TakeOver {
        let follower = self
            .pods
            .iter()
            .any(|p| p.name == name && p.ready_follower(account));
        if !follower {
            return TakeOver::Cannot;
        }
        let Some(primary) = self.positions.get(current).filter(|p| !p.standby) else {
            return TakeOver::Can;
        };
        match self.positions.get(name) {
            None => TakeOver::NotYet,
            Some(p) if !p.standby => TakeOver::Cannot,
            Some(p) if !p.streaming => TakeOver::NotYet,
            Some(p)
                if p.timeline.is_some()
                    && (primary.timeline.is_none() || p.timeline == primary.timeline) =>
            {
                TakeOver::Can
            }
            Some(_) => TakeOver::Cannot,
        }
    }

    pub(super) fn can_take_over(&self, name: &str, current: &str, account: &str) -> bool {
        self.take_over(name, current, account) == TakeOver::Can
    }
}

/// A version upgrade, as the roles see it (`upgrade::plan`'s stage).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VersionUpgrade {
    /// None under way.
    #[default]
    None,
    /// Its pods move to the new version one at a time, highest ordinal first (its partition):
    /// the primary's pod is held until it has handed over to a standby on the new version.
    RollingOut,
    /// Preflight, backup, verification or rollback: it places the pods itself (partition,
    /// rollback), so the primary-last order stays out of its way.
    PlacesPods,
}

/// The versions of the Secrets database pods mount, `name=resourceVersion` joined by `,`:
/// changes whenever one of them is written.
pub fn mounted_secrets(secrets: &[Option<&k8s_openapi::api::core::v1::Secret>]) -> String {
    secrets
        .iter()
        .flatten()
        .filter_map(|s| {
            let name = s.metadata.name.as_deref()?;
            let version = s.metadata.resource_version.as_deref()?;
            Some(format!("{name}={version}"))
        })
        .collect::<Vec<_>>()
        .join(",")
}
