//! What a runtime tells us about a container, normalised: QoS class, CPU request and limit,
//! memory limit, device hints, and the per-Pod overrides read from annotations.

mod controls;
mod overrides;
pub use controls::{CoreGrain, Hyperthreads, MemoryTypes};
pub use overrides::{AnnotationWarning, Overrides};
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl Qos {
    /// QoS from a kubelet cgroup parent path (`…kubepods-besteffort…`, `…burstable…`, else
    /// Guaranteed), as the reference implementation derives it.
    pub fn from_cgroup_parent(path: &str) -> Qos {
        let p = path.to_ascii_lowercase();
        if p.contains("besteffort") {
            Qos::BestEffort
        } else if p.contains("burstable") {
            Qos::Burstable
        } else {
            Qos::Guaranteed
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Qos::Guaranteed => "Guaranteed",
            Qos::Burstable => "Burstable",
            Qos::BestEffort => "BestEffort",
        }
    }
}

impl fmt::Display for Qos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Milli-CPU request from cgroup v1 CPU shares as the kubelet sets them
/// (`shares = request * 1024 / 1000`, minimum 2, which means no request).
pub fn milli_cpu_from_shares(shares: u64) -> u64 {
    if shares <= 2 {
        0
    } else {
        // Round to the nearest milli-CPU: the kubelet floors when it converts, so a plain
        // division can come out one short (e.g. 4000m -> 4096 shares -> 4000; 100m -> 102 -> 99).
        // Shares come from outside: in u128 nothing can overflow, and a result beyond u64
        // saturates (the engine then treats it as larger than the machine).
        let milli = (u128::from(shares) * 1000 + 512) / 1024;
        u64::try_from(milli).unwrap_or(u64::MAX)
    }
}

/// Milli-CPU limit from a CFS quota and period; `None` when there is no quota.
pub fn milli_cpu_from_quota(quota: i64, period: u64) -> Option<u64> {
    if quota <= 0 || period == 0 {
        None
    } else {
        // `quota > 0` here, so the cast is exact; u128 cannot overflow and the result saturates.
        let milli = (u128::from(quota as u64) * 1000).div_ceil(u128::from(period));
        Some(u64::try_from(milli).unwrap_or(u64::MAX))
    }
}

crate::names! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
    #[serde(rename_all = "kebab-case")]
    pub enum PolicyKind: "resource policy", Exact {
        TopologyAware = "topology-aware",
        NumaAware = "numa-aware",
    }
}

/// The prefix of every label and annotation key kunpeng-tap reads or writes (the keys below).
pub const KEY_PREFIX: &str = "tap.kunpeng.huawei.com/";
/// Label (or annotation) that opts a whole Pod out, any value; the reference's key.
pub const SKIP_KEY: &str = "tap.kunpeng.huawei.com/skip";
/// Annotation: `numa-aware`, `topology-aware`, or `none` (same as skip).
pub const POLICY_KEY: &str = "tap.kunpeng.huawei.com/policy";
/// Annotation: `machine`, `socket`, `die`, `numa`, `cache`, `cluster` (topology-aware only).
pub const LEVEL_KEY: &str = "tap.kunpeng.huawei.com/level";
/// Annotation: `true`/`false`, bind memory (`cpuset.mems`) to the chosen CPUs' NUMA nodes.
pub const MEMORY_BINDING_KEY: &str = "tap.kunpeng.huawei.com/memory-binding";
/// Annotation: `true`/`false`, exclusive CPUs for Guaranteed integer-CPU containers.
pub const EXCLUSIVE_KEY: &str = "tap.kunpeng.huawei.com/exclusive-cpus";
/// Annotation: `true`/`false`, confine a BestEffort container to one pool or NUMA node like
/// the others (`false`, the default: the machine's shared CPUs).
pub const CONFINE_BEST_EFFORT_KEY: &str = "tap.kunpeng.huawei.com/confine-best-effort";
/// Annotation: `strict` (one NUMA node or no placement: the container starts on all CPUs, with
/// a Warning Event), `preferred` (the default: the nearest fit, wider if need be) or
/// `exclusive` (a whole NUMA node to itself, or no placement).
pub const NUMA_POLICY_KEY: &str = "tap.kunpeng.huawei.com/numa-policy";
/// Annotation: how exclusive CPUs are taken: `whole` (whole cores only, the default, as the
/// kubelet's `full-pcpus-only`), `threads` (any hyperthreads, whole cores first) or
/// `sibling-pair` (a 2-CPU container: the two hyperthreads of one core).
pub const EXCLUSIVE_CORES_KEY: &str = "tap.kunpeng.huawei.com/exclusive-cores";
/// Annotation: `true`/`false`, the container's cpuset holds one hyperthread per core of its
/// grant (the siblings stay in the grant, unused).
pub const HIDE_HYPERTHREADS_KEY: &str = "tap.kunpeng.huawei.com/hide-hyperthreads";
/// Annotation: the memory kinds for `cpuset.mems`, comma-separated: `dram` (always), `pmem` or
/// `cxl`, `hbm`: the nearest memory-only nodes of each kind are added (never by default).
pub const MEMORY_TYPE_KEY: &str = "tap.kunpeng.huawei.com/memory-type";
/// Annotation: `true`/`false`, place the container on the node's reserved CPUs (a system
/// daemon). Honoured in the namespaces the policy lists (where `false` keeps a Pod on the
/// pools), elsewhere only when the policy honours the annotation.
pub const RESERVED_CPUS_KEY: &str = "tap.kunpeng.huawei.com/reserved-cpus";
/// Annotation written by the agent into the container it placed (where the runtime lets it):
/// the grant record that restart recovery reads back.
pub const GRANT_KEY: &str = "tap.kunpeng.huawei.com/grant";

crate::names! {
    /// How hard a container holds to one NUMA node (`numa-policy` annotation).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum NumaPolicy: "NUMA policy", Ignored {
        /// One NUMA node or no placement at all (the container is left on all CPUs).
        Strict = "strict",
        /// The nearest fit; more than one NUMA node when one does not hold it (the default).
        Preferred = "preferred",
        /// A whole NUMA node to itself: every usable CPU of a node that holds nothing else, taken
        /// out of every shared cpuset while it runs; no such node, no placement (as `Strict`).
        Exclusive = "exclusive",
    }
}

/// Everything the engine needs to place one container.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerRequest {
    /// Runtime container id; the key of the allocation.
    pub id: String,
    pub pod_uid: String,
    pub pod_name: String,
    pub namespace: String,
    pub container_name: String,
    pub qos: Option<Qos>,
    pub cpu_request_milli: u64,
    pub cpu_limit_milli: Option<u64>,
    pub memory_limit_bytes: Option<u64>,
    /// NUMA nodes of the PCI devices the container uses (GPUs), if any.
    pub device_nodes: Vec<u32>,
    /// The DRA claims of this node's CPUs the container uses ([`crate::claim`]), if any.
    pub claims: Vec<crate::claim::ClaimKey>,
    pub overrides: Overrides,
}

impl ContainerRequest {
    pub fn qos(&self) -> Qos {
        self.qos.unwrap_or_else(|| {
            if self.cpu_request_milli == 0 && self.cpu_limit_milli.is_none() {
                Qos::BestEffort
            } else if self.cpu_limit_milli == Some(self.cpu_request_milli) {
                Qos::Guaranteed
            } else {
                Qos::Burstable
            }
        })
    }

    /// Whole CPUs a Guaranteed container asks for, when its request is an integer number of
    /// CPUs equal to its limit (what the kubelet's static policy would pin).
    pub fn exclusive_cpus(&self) -> Option<usize> {
        if self.qos() != Qos::Guaranteed {
            return None;
        }
        let req = self.cpu_request_milli;
        if req == 0 || !req.is_multiple_of(1000) || self.cpu_limit_milli.is_some_and(|l| l != req) {
            return None;
        }
        Some((req / 1000) as usize)
    }

    /// The size a placement must hold: the limit, or the request when there is no limit.
    pub fn size_milli(&self) -> u64 {
        self.cpu_limit_milli
            .unwrap_or(self.cpu_request_milli)
            .max(self.cpu_request_milli)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_key_has_the_prefix() {
        for k in [
            super::SKIP_KEY,
            super::POLICY_KEY,
            super::LEVEL_KEY,
            super::MEMORY_BINDING_KEY,
            super::EXCLUSIVE_KEY,
            super::CONFINE_BEST_EFFORT_KEY,
            super::NUMA_POLICY_KEY,
            super::EXCLUSIVE_CORES_KEY,
            super::HIDE_HYPERTHREADS_KEY,
            super::MEMORY_TYPE_KEY,
            super::RESERVED_CPUS_KEY,
            super::GRANT_KEY,
        ] {
            assert!(k.starts_with(super::KEY_PREFIX), "{k}");
        }
    }

    use super::*;
    use std::collections::HashMap;

    fn map(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn shares_and_quota_conversions() {
        assert_eq!(milli_cpu_from_shares(2), 0);
        assert_eq!(milli_cpu_from_shares(1024), 1000);
        assert_eq!(milli_cpu_from_shares(4096), 4000);
        assert_eq!(milli_cpu_from_shares(102), 100);
        assert_eq!(milli_cpu_from_shares(256), 250);
        assert_eq!(milli_cpu_from_quota(800_000, 100_000), Some(8000));
        assert_eq!(milli_cpu_from_quota(-1, 100_000), None);
        assert_eq!(milli_cpu_from_quota(50_000, 100_000), Some(500));
    }

    #[test]
    fn conversions_of_outside_values_saturate_instead_of_wrapping() {
        // 1e17 shares (the fault that made the CRI proxy panic): exact in u128.
        assert_eq!(
            milli_cpu_from_shares(100_000_000_000_000_000),
            97_656_250_000_000_000
        );
        assert_eq!(milli_cpu_from_shares(u64::MAX), 18_014_398_509_481_983_999);
        assert_eq!(milli_cpu_from_quota(i64::MAX, 1), Some(u64::MAX));
        assert_eq!(
            milli_cpu_from_quota(i64::MAX, 100_000),
            Some(92_233_720_368_547_759)
        );
        assert_eq!(milli_cpu_from_quota(i64::MIN, 100_000), None);
        assert_eq!(milli_cpu_from_quota(1, u64::MAX), Some(1));
        assert_eq!(milli_cpu_from_quota(100_000, 0), None);
    }

    #[test]
    fn qos_from_cgroup_parent() {
        assert_eq!(
            Qos::from_cgroup_parent("/kubepods.slice/kubepods-besteffort.slice/x"),
            Qos::BestEffort
        );
        assert_eq!(
            Qos::from_cgroup_parent("/kubepods/burstable/pod123"),
            Qos::Burstable
        );
        assert_eq!(Qos::from_cgroup_parent("/kubepods/pod123"), Qos::Guaranteed);
    }

    #[test]
    fn overrides_container_specific_key_wins_and_bad_values_warn() {
        let ann = map(&[
            (POLICY_KEY, "numa-aware"),
            ("tap.kunpeng.huawei.com/policy.sidecar", "topology-aware"),
            (LEVEL_KEY, "galaxy"),
            (MEMORY_BINDING_KEY, "true"),
        ]);
        let (o, w) = Overrides::from_pod(&HashMap::new(), &ann, "app");
        assert_eq!(o.policy, Some(PolicyKind::NumaAware));
        assert_eq!(o.memory_binding, Some(true));
        assert_eq!(o.level, None);
        assert_eq!(w.len(), 1);
        assert!(w[0].to_string().contains("galaxy"), "{}", w[0]);
        let (o, _) = Overrides::from_pod(&HashMap::new(), &ann, "sidecar");
        assert_eq!(o.policy, Some(PolicyKind::TopologyAware));
    }

    #[test]
    fn skip_as_label_annotation_or_policy_none() {
        let (o, _) = Overrides::from_pod(&map(&[(SKIP_KEY, "")]), &HashMap::new(), "c");
        assert!(o.skip);
        let (o, _) = Overrides::from_pod(&HashMap::new(), &map(&[(SKIP_KEY, "x")]), "c");
        assert!(o.skip);
        let (o, _) = Overrides::from_pod(&HashMap::new(), &map(&[(POLICY_KEY, "none")]), "c");
        assert!(o.skip);
    }

    #[test]
    fn exclusive_only_for_guaranteed_integer() {
        let mut r = ContainerRequest {
            cpu_request_milli: 4000,
            cpu_limit_milli: Some(4000),
            ..Default::default()
        };
        assert_eq!(r.qos(), Qos::Guaranteed);
        assert_eq!(r.exclusive_cpus(), Some(4));
        r.cpu_request_milli = 1500;
        r.cpu_limit_milli = Some(1500);
        assert_eq!(r.exclusive_cpus(), None);
        r.cpu_limit_milli = Some(3000);
        assert_eq!(r.qos(), Qos::Burstable);
        assert_eq!(r.size_milli(), 3000);
    }
}
