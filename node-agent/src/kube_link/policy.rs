//! From a NodeTopology's policy to the engine configuration, and the on-disk cache.

use serde::{Deserialize, Serialize};
use std::path::Path;
use tap_api::{PolicySettings, PolicySource};
use tap_engine::{CpuSet, EngineConfig, PolicyKind, Rebalance, ReservedAccess, ReservedAnnotation};

/// Where the configuration in force came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigSource {
    /// The NodeTopology spec.
    NodeTopology,
    /// The on-disk cache (API server not reached yet).
    Cache,
    /// The agent's flags (no policy assigned).
    Flags,
}

impl ConfigSource {
    pub fn as_str(self) -> &'static str {
        match self {
            ConfigSource::NodeTopology => "NodeTopology",
            ConfigSource::Cache => "cache",
            ConfigSource::Flags => "flags",
        }
    }
}

/// The cached last policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CachedPolicy {
    pub node: String,
    pub generation: Option<i64>,
    pub source: Option<PolicySource>,
    pub policy: Option<PolicySettings>,
}

/// The engine's policy for the CRD's policy name: the one conversion between the two (a new
/// policy fails to compile here until it is mapped).
pub fn policy_kind(p: tap_api::PolicyName) -> PolicyKind {
    match p {
        tap_api::PolicyName::NumaAware => PolicyKind::NumaAware,
        tap_api::PolicyName::TopologyAware => PolicyKind::TopologyAware,
    }
}

/// Who may use the reserved CPUs, as a policy says.
pub fn reserved_access(r: &tap_api::ReservedCpusFor) -> ReservedAccess {
    ReservedAccess {
        namespaces: r.namespaces.clone(),
        annotation: match r.annotation {
            tap_api::ReservedAnnotation::Ignored => ReservedAnnotation::Ignored,
            tap_api::ReservedAnnotation::Honoured => ReservedAnnotation::Honoured,
        },
    }
}

/// Who may use the reserved CPUs in the CRD's terms (the status reports what is in force).
pub fn reserved_cpus_for(a: &ReservedAccess) -> tap_api::ReservedCpusFor {
    tap_api::ReservedCpusFor {
        namespaces: a.namespaces.clone(),
        annotation: match a.annotation {
            ReservedAnnotation::Ignored => tap_api::ReservedAnnotation::Ignored,
            ReservedAnnotation::Honoured => tap_api::ReservedAnnotation::Honoured,
        },
    }
}

/// The CRD's name of an engine rebalancing setting.
pub fn rebalance_mode(r: Rebalance) -> tap_api::RebalanceMode {
    match r {
        Rebalance::Off => tap_api::RebalanceMode::Off,
        Rebalance::Usage => tap_api::RebalanceMode::Usage,
    }
}

/// The engine's rebalancing setting of a CRD's.
fn rebalance(r: tap_api::RebalanceMode) -> Rebalance {
    match r {
        tap_api::RebalanceMode::Off => Rebalance::Off,
        tap_api::RebalanceMode::Usage => Rebalance::Usage,
    }
}

/// The flags' configuration with a policy's settings on top (the settings a policy does not
/// carry, resource priority and exclusive CPUs, stay with the flags). `None` = the flags. A
/// policy's reservedCPUs and reservedCPUsFor replace the flags'; the kubelet's
/// reservedSystemCPUs (`kubelet`, a fact of the node) stay reserved under any policy.
pub fn engine_config(
    base: &EngineConfig,
    kubelet: &CpuSet,
    s: Option<&PolicySettings>,
) -> Result<EngineConfig, String> {
    let Some(s) = s else {
        return Ok(base.clone());
    };
    let policy = policy_kind(s.policy);
    let reserved = CpuSet::parse(&s.reserved_cpus)
        .map_err(|e| format!("reservedCPUs {:?}: {e}", s.reserved_cpus))?;
    Ok(EngineConfig {
        policy,
        memory_topology: s.memory_topology,
        cluster_affinity: s.cluster_affinity,
        reserved: reserved.union(kubelet),
        reserved_for: reserved_access(&s.reserved_cpus_for),
        annotations_allowed: s.annotations_allowed,
        rebalance: rebalance(s.rebalance),
        dra_level: s.dra_device_level.map(dra_level),
        ..base.clone()
    })
}

/// A policy's DRA device level as the engine's pool level.
pub fn dra_level(l: tap_api::DraDeviceLevel) -> tap_engine::topology::Level {
    use tap_api::DraDeviceLevel as D;
    use tap_engine::topology::Level;
    match l {
        D::Numa => Level::Numa,
        D::Socket => Level::Socket,
        D::Die => Level::Die,
        D::Cluster => Level::Cluster,
        D::Cache => Level::Cache,
    }
}

pub fn load_cache(path: &Path) -> std::io::Result<Option<CachedPolicy>> {
    match std::fs::read(path) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes the cache atomically (temporary file, then rename).
pub fn store_cache(path: &Path, c: &CachedPolicy) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("json.tmp");
    let body = serde_json::to_vec_pretty(c).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, body)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tap_api::fixtures::settings_all_set;
    use tap_api::PolicyName;
    use tap_engine::ResourcePriority;

    #[test]
    fn crd_policy_names_map_to_the_engine_policies_of_the_same_name() {
        for p in [PolicyName::NumaAware, PolicyName::TopologyAware] {
            assert_eq!(policy_kind(p).as_str(), p.as_str());
        }
    }

    #[test]
    fn a_policys_dra_device_level_overrides_the_flag_and_its_absence_keeps_it() {
        let base = EngineConfig::default();
        let clusters = PolicySettings {
            dra_device_level: Some(tap_api::DraDeviceLevel::Cluster),
            ..settings_all_set()
        };
        let c = engine_config(&base, &CpuSet::new(), Some(&clusters)).unwrap();
        assert_eq!(c.dra_level, Some(tap_engine::topology::Level::Cluster));
        let c = engine_config(&base, &CpuSet::new(), Some(&settings_all_set())).unwrap();
        assert_eq!(c.dra_level, None, "absent: the agent's --dra-device-level");
        let yaml = "policy: topology-aware\ndraDeviceLevel: cache\n";
        let s: PolicySettings = serde_yaml::from_str(yaml).unwrap();
        assert_eq!(s.dra_device_level, Some(tap_api::DraDeviceLevel::Cache));
    }

    #[test]
    fn policy_overrides_flags_and_keeps_the_rest() {
        let base = EngineConfig {
            priority: ResourcePriority::GpuFirst,
            exclusive_cpus: false,
            cluster_rule: tap_engine::ClusterAffinityRule::Kunpeng950Only,
            ..Default::default()
        };
        let c = engine_config(&base, &CpuSet::new(), Some(&settings_all_set())).unwrap();
        assert_eq!(c.policy, PolicyKind::NumaAware);
        assert!(c.memory_topology && c.cluster_affinity && !c.annotations_allowed);
        assert_eq!(c.reserved.to_string(), "0-1");
        assert_eq!(c.priority, ResourcePriority::GpuFirst);
        assert!(!c.exclusive_cpus);
        assert_eq!(
            c.rebalance,
            Rebalance::Usage,
            "the policy turns rebalancing on"
        );
        let off = PolicySettings {
            rebalance: tap_api::RebalanceMode::Off,
            ..settings_all_set()
        };
        let flags_on = EngineConfig {
            rebalance: Rebalance::Usage,
            ..base.clone()
        };
        let c = engine_config(&flags_on, &CpuSet::new(), Some(&off)).unwrap();
        assert_eq!(c.rebalance, Rebalance::Off, "and off, over the flag");
        // The flags' cluster affinity rule stays: the engine applies it to the policy's
        // clusterAffinity as to the flag's (EngineConfig::in_force).
        assert_eq!(
            c.cluster_rule,
            tap_engine::ClusterAffinityRule::Kunpeng950Only
        );
        assert_eq!(engine_config(&base, &CpuSet::new(), None).unwrap(), base);
    }

    #[test]
    fn a_policy_replaces_the_flags_reserved_settings_and_keeps_the_kubelets_cpus() {
        let base = EngineConfig {
            reserved: CpuSet::parse("7").unwrap(),
            reserved_for: ReservedAccess {
                namespaces: vec!["flags-ns".into()],
                annotation: ReservedAnnotation::Ignored,
            },
            ..Default::default()
        };
        let kubelet = CpuSet::parse("3").unwrap();
        let c = engine_config(&base, &kubelet, Some(&settings_all_set())).unwrap();
        assert_eq!(c.reserved.to_string(), "0-1,3");
        assert_eq!(c.reserved_for.namespaces, ["kube-system"]);
        assert_eq!(c.reserved_for.annotation, ReservedAnnotation::Honoured);
        // A policy without reservedCPUsFor: nobody uses the reserved CPUs.
        let s = PolicySettings {
            reserved_cpus_for: Default::default(),
            ..settings_all_set()
        };
        let c = engine_config(&base, &kubelet, Some(&s)).unwrap();
        assert_eq!(c.reserved_for, ReservedAccess::default());
    }

    #[test]
    fn bad_reserved_cpus_is_an_error_not_a_panic() {
        let mut s = settings_all_set();
        s.reserved_cpus = "3-1,x".into();
        assert!(
            engine_config(&EngineConfig::default(), &CpuSet::new(), Some(&s))
                .unwrap_err()
                .contains("reservedCPUs")
        );
    }

    #[test]
    fn cache_round_trips_and_missing_is_none() {
        let dir = std::env::temp_dir().join(format!("tap-kube-link-{}", std::process::id()));
        let path = dir.join("sub").join("p.json");
        assert_eq!(load_cache(&path).unwrap(), None);
        let c = CachedPolicy {
            node: "n1".into(),
            generation: Some(2),
            source: Some(PolicySource {
                name: "p".into(),
                uid: None,
                generation: 5,
            }),
            policy: Some(settings_all_set()),
        };
        store_cache(&path, &c).unwrap();
        assert_eq!(load_cache(&path).unwrap(), Some(c));
        std::fs::write(&path, b"{not json").unwrap();
        assert!(load_cache(&path).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
