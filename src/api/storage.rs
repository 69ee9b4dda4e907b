//! A Database's data volumes: their size and class (`spec.storage`), and how they grow before
//! they fill (`spec.storage.autoGrow`). Pure data: `resources/` builds the claims, and
//! `database::autogrow` decides the growths.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The data volume of each instance.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "quantity(self.size).compareTo(quantity(oldSelf.size)) >= 0",
        "message": "storage.size may not shrink (a volume can only grow)"
    },
    {
        "rule": "has(self.storageClassName) == has(oldSelf.storageClassName) && (!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)",
        "message": "storage.storageClassName is immutable"
    },
    {
        "rule": "!has(self.autoGrow) || quantity(self.autoGrow.maximum).compareTo(quantity(self.size)) >= 0",
        "message": "storage.autoGrow.maximum must be at least storage.size"
    }
]))]
pub struct StorageSpec {
    /// The volume size, a Kubernetes quantity such as `10Gi`. It may grow (where the
    /// StorageClass allows expansion), never shrink.
    #[schemars(length(max = 32))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))",
        "message": "storage.size must be a positive quantity such as 10Gi"
    }]))]
    pub size: String,

    /// The StorageClass of the volume; the cluster default when absent. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,

    /// Grow the data volumes before they fill: dbop reads each instance's volume and, past
    /// the threshold, asks every data claim for more (the StorageClass must allow volume
    /// expansion; condition `StorageAutoGrow`). A volume already full, with PostgreSQL
    /// stopped, grows too. The volumes only grow; `size` stays the size of a new one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_grow: Option<AutoGrowSpec>,
}

/// When and how far `spec.storage.autoGrow` grows the data volumes.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoGrowSpec {
    /// Grow when a data volume is this full, in percent of its size.
    #[serde(default = "default_threshold_percent")]
    #[schemars(range(min = 50, max = 95))]
    pub threshold_percent: i32,

    /// How much each growth adds: a quantity such as `10Gi`, or a percentage of the current
    /// size such as `20%`. Some clouds allow one change of a volume every few hours: make
    /// each step count.
    #[serde(default = "default_increment")]
    #[schemars(length(max = 32))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self.matches('^[1-9][0-9]?%$|^100%$') || (isQuantity(self) && quantity(self).isGreaterThan(quantity('0')))",
        "message": "storage.autoGrow.increment must be a positive quantity such as 10Gi or a percentage from 1% to 100%"
    }]))]
    pub increment: String,

    /// The largest size a data volume grows to. Past the threshold at this size,
    /// `StorageAutoGrow` turns False.
    #[schemars(length(max = 32))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))",
        "message": "storage.autoGrow.maximum must be a positive quantity such as 100Gi"
    }]))]
    pub maximum: String,
}

impl AutoGrowSpec {
    /// The threshold as a share of the volume in percent, within 1..=100 whatever the object
    /// holds (one written past an older schema).
    pub fn threshold(&self) -> u64 {
        self.threshold_percent.clamp(1, 100) as u64
    }
}

fn default_threshold_percent() -> i32 {
    80
}

fn default_increment() -> String {
    "20%".into()
}
