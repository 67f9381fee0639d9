//! Objects for the tests of the crates that use this API (feature `fixtures`).

use crate::{PolicyName, PolicySettings, RebalanceMode, ReservedAnnotation, ReservedCpusFor};

/// Policy settings with every field away from its default but the DRA device level:
/// numa-aware, memory topology and cluster affinity on, CPUs 0-1 reserved for `kube-system`
/// and for Pods that ask, usage rebalancing, annotations not allowed.
pub fn settings_all_set() -> PolicySettings {
    PolicySettings {
        policy: PolicyName::NumaAware,
        memory_topology: true,
        cluster_affinity: true,
        reserved_cpus: "0-1".into(),
        reserved_cpus_for: ReservedCpusFor {
            namespaces: vec!["kube-system".into()],
            annotation: ReservedAnnotation::Honoured,
        },
        rebalance: RebalanceMode::Usage,
        annotations_allowed: false,
        dra_device_level: None,
    }
}
