//! Placement policies: the [`Policy`] trait, the settings of one request, and the dispatch
//! that every request goes through before a policy sees it.
//!
//! - [`topology_aware`]: the pool tree (machine > socket > die > NUMA > cache > cluster), exclusive
//!   CPUs for Guaranteed integer-CPU containers.
//! - [`numa_aware`]: the smallest set of nearest NUMA nodes that holds the container's size.
//! - Before either: a system daemon (its namespace listed by the policy, or asking by
//!   annotation where the policy honours it) gets the reserved CPUs ([`reserved`]);
//!   a `kube-system` Pod gets the whole machine, and a BestEffort container
//!   (unless confined by the configuration or an annotation) the machine's shared CPUs (all
//!   usable CPUs minus exclusive ones).
//! - With memory binding, `cpuset.mems` always covers memory that holds the container's memory
//!   limit: the pool's (or the NUMA nodes') memory, and for exclusive CPUs their own nodes only
//!   when those hold it.
//!
//! Requests, limits and memory come from outside: all capacity arithmetic is done in `i128`
//! (or saturating), so a request of `u64::MAX` never wraps into "fits".
//!
//! # Plugging in a policy
//!
//! A policy is a value implementing [`Policy`]; it may hold state of its own (tables built
//! from the topology, tuning knobs), read at every decision through `&self`. It decides from a
//! read-only [`StateView`] and returns a [`Choice`], which the engine commits. The engine owns
//! one instance per [`PolicyKind`]: the built-in ones by default, and
//! [`Engine::with_policy`](crate::Engine::with_policy) replaces the instance for the kind the
//! policy reports. The kind names the shape of the grants it makes (a pool's span, or a union
//! of NUMA nodes), which the engine needs for records, restore and node accounting; a new
//! policy therefore takes an existing kind's slot (and its configuration and annotation value)
//! rather than adding a variant. Shared helpers: [`pool_choice`] (a pool-shaped choice with
//! the memory binding worked out) and [`crate::cpu_picker::pick_exclusive`].

pub(crate) mod balance;
pub mod numa_aware;
pub mod numa_exclusive;
pub mod reserved;
pub mod topology_aware;

pub use crate::types::Choice;

use crate::cpuset::CpuSet;
use crate::grant::Grant;
use crate::nodeset::NodeSet;
use crate::request::{
    ContainerRequest, CoreGrain, Hyperthreads, MemoryTypes, NumaPolicy, PolicyKind, Qos,
};
use crate::state::StateView;
use crate::topology::{Level, PoolId};
use crate::types::{EngineConfig, Reason, Site, Unhonoured};
use std::fmt;
use std::sync::Arc;

/// A placement policy. Decisions are pure functions of the state view, the request and the
/// policy's own fields; they must not allocate per call beyond what the built-ins do.
pub trait Policy: fmt::Debug + Send + Sync {
    /// The slot this policy fills, and the kind of grant it makes (see the module docs).
    fn kind(&self) -> PolicyKind;

    /// A name for logs and comparisons (`topology-aware`, `numa-aware`, …).
    fn name(&self) -> &str;

    /// Where to place `req`. `prefer` is the container's current grant on a resize, given
    /// only when that grant was made by this kind: keep it when it still fits. `None` when
    /// there is nothing to place on.
    fn choose(
        &self,
        view: &StateView<'_>,
        req: &ContainerRequest,
        settings: &Settings,
        prefer: Option<&Grant>,
    ) -> Option<Choice>;
}

/// Settings for one request: the engine's configuration with the Pod's overrides applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub policy: PolicyKind,
    /// Bind memory (`cpuset.mems`) and account memory limits.
    pub memory: bool,
    /// A forced pool level.
    pub level: Option<Level>,
    /// Cluster pools may be chosen.
    pub clusters: bool,
    /// Cache (L3) pools may be chosen.
    pub caches: bool,
    /// Exclusive CPUs for Guaranteed integer-CPU containers.
    pub exclusive: bool,
    pub confine_best_effort: bool,
    /// How exclusive CPUs are taken from cores.
    pub cores: CoreGrain,
    /// Which hyperthreads of its grant the container sees.
    pub threads: Hyperthreads,
    /// Memory kinds for `cpuset.mems` (memory-only nodes only when asked for).
    pub memory_types: MemoryTypes,
    /// How hard the container holds to one NUMA node (`exclusive`: a whole node to itself).
    pub numa: NumaPolicy,
    /// The `reserved-cpus` annotation: asks for (or declines) the reserved CPUs.
    pub reserved: Option<bool>,
}

impl Settings {
    pub fn new(cfg: &EngineConfig, req: &ContainerRequest) -> Settings {
        let o = if cfg.annotations_allowed {
            req.overrides.clone()
        } else {
            Default::default()
        };
        Settings {
            policy: o.policy.unwrap_or(cfg.policy),
            // A memory type asked for binds memory unless binding is turned off explicitly.
            memory: o
                .memory_binding
                .unwrap_or(cfg.memory_topology || o.memory_types.is_some_and(|t| t.has_tiers())),
            level: o.level,
            clusters: cfg.cluster_affinity || o.level == Some(Level::Cluster),
            caches: cfg.cache_affinity == crate::types::CacheAffinity::On
                || o.level == Some(Level::Cache),
            exclusive: cfg.exclusive_cpus && o.exclusive.unwrap_or(true),
            confine_best_effort: o.confine_best_effort.unwrap_or(cfg.confine_best_effort),
            cores: o.exclusive_cores.unwrap_or(cfg.exclusive_cores),
            threads: match o.hide_hyperthreads {
                Some(true) => Hyperthreads::Hidden,
                _ => Hyperthreads::Shown,
            },
            memory_types: o.memory_types.unwrap_or_default(),
            numa: o.numa_policy.unwrap_or(NumaPolicy::Preferred),
            reserved: o.reserved_cpus,
        }
    }
}

/// The policy instances an engine owns, one per kind.
#[derive(Debug, Clone)]
pub struct Policies {
    topology_aware: Arc<dyn Policy>,
    numa_aware: Arc<dyn Policy>,
}

impl Default for Policies {
    fn default() -> Self {
        Policies {
            topology_aware: Arc::new(topology_aware::TopologyAware),
            numa_aware: Arc::new(numa_aware::NumaAware),
        }
    }
}

impl PartialEq for Policies {
    /// Same names in every slot (policies hold no comparable state of their own).
    fn eq(&self, other: &Self) -> bool {
        self.topology_aware.name() == other.topology_aware.name()
            && self.numa_aware.name() == other.numa_aware.name()
    }
}

impl Eq for Policies {}

impl Policies {
    pub fn get(&self, kind: PolicyKind) -> &dyn Policy {
        match kind {
            PolicyKind::TopologyAware => &*self.topology_aware,
            PolicyKind::NumaAware => &*self.numa_aware,
        }
    }

    /// Puts `policy` in the slot of its kind, replacing what was there.
    pub fn set(&mut self, policy: Arc<dyn Policy>) {
        match policy.kind() {
            PolicyKind::TopologyAware => self.topology_aware = policy,
            PolicyKind::NumaAware => self.numa_aware = policy,
        }
    }

    /// Where to place `req`: the reserved CPUs for a system daemon, the whole machine for
    /// `kube-system` and unconfined BestEffort, else the policy of the request's kind. `old` is
    /// the current grant on a resize.
    pub fn choose(
        &self,
        view: &StateView<'_>,
        req: &ContainerRequest,
        old: Option<&Grant>,
    ) -> Option<Choice> {
        let set = Settings::new(view.config(), req);
        // The common case goes straight to the pools: no copy of the choice on the way out.
        match reserved::decide(view, req, &set) {
            reserved::ReservedUse::Pools => self.choose_pools(view, req, set, old),
            reserved::ReservedUse::Place(cpus) => Some(reserved::choice(view, &set, cpus)),
            reserved::ReservedUse::Refused(r) => {
                let mut c = self.choose_pools(view, req, set, old)?;
                c.unhonoured = c.unhonoured.or(Some(Unhonoured::ReservedCpus(r)));
                Some(c)
            }
        }
    }

    /// Where to place `req` on the pools (see [`Policies::choose`]).
    fn choose_pools(
        &self,
        view: &StateView<'_>,
        req: &ContainerRequest,
        set: Settings,
        old: Option<&Grant>,
    ) -> Option<Choice> {
        if view.usable().is_empty() {
            return None;
        }
        if req.namespace == "kube-system" {
            return Some(root(view, req, &set, Reason::KubeSystem));
        }
        if set.numa == NumaPolicy::Exclusive {
            // Else placed as usual: a create is then refused by the engine, a resize kept.
            if let Some(c) = numa_exclusive::choose(view, req, &set, old) {
                return Some(c);
            }
        }
        if req.qos() == Qos::BestEffort && !set.confine_best_effort {
            return Some(root(view, req, &set, Reason::BestEffort));
        }
        let prefer = old.filter(|g| g.policy == set.policy);
        self.get(set.policy).choose(view, req, &set, prefer)
    }
}

fn root(view: &StateView<'_>, req: &ContainerRequest, set: &Settings, reason: Reason) -> Choice {
    pool_choice(view, req, set, 0, CpuSet::new(), reason)
}

/// A topology-aware (pool-shaped) choice of pool `pool`, with `exclusive` CPUs taken from it
/// (empty for a shared grant), and `cpuset.mems` worked out when memory is bound.
pub fn pool_choice(
    e: &StateView<'_>,
    req: &ContainerRequest,
    set: &Settings,
    pool: PoolId,
    exclusive: CpuSet,
    reason: Reason,
) -> Choice {
    let topo = e.topology();
    let p = &topo.pools[pool];
    let mems = set.memory.then(|| {
        if exclusive.is_empty() {
            return p.mems;
        }
        // Exclusive CPUs: their own nodes when those hold the memory limit, else the pool's
        // nodes (the pool passed the memory check, and the CPUs are inside it).
        let cpu_nodes = topo.nodes_of(&exclusive);
        match req.memory_limit_bytes {
            Some(m) if !nodes_hold_memory(e, &cpu_nodes, m) => p.mems,
            _ => topo.mems_for_nodes(&cpu_nodes),
        }
    });
    let (mems, unhonoured) = with_tiers(topo, mems, set);
    Choice {
        policy: PolicyKind::TopologyAware,
        pool,
        nodes: p.numa_nodes,
        span: p.cpus,
        exclusive,
        mems,
        charge_memory: set.memory && req.memory_limit_bytes.is_some(),
        reason,
        unhonoured,
        site: Site::Pools,
    }
}

/// `cpuset.mems` (its DRAM nodes) with the memory-only nodes of each kind the container asks
/// for added, the nearest to those nodes; and the first kind it asked for but could not get.
/// Memory capacity is accounted on DRAM only.
pub fn with_tiers(
    topo: &crate::topology::Topology,
    mems: Option<NodeSet>,
    set: &Settings,
) -> (Option<NodeSet>, Option<Unhonoured>) {
    if !set.memory_types.has_tiers() {
        return (mems, None);
    }
    let Some(dram) = mems else {
        return (None, Some(Unhonoured::MemoryTypeUnbound));
    };
    let mut out = dram;
    let mut missing = None;
    for kind in set.memory_types.tiers() {
        let extra = topo.tier_nodes(&dram, kind);
        if extra.is_empty() {
            missing = missing.or(Some(Unhonoured::MemoryType(kind)));
        }
        out = out.union(&extra);
    }
    (Some(out), missing)
}

/// Whether the memory of `nodes` (their single-node pools: DRAM) has `need` bytes free. A node of unknown size (0) does not constrain.
fn nodes_hold_memory(e: &StateView<'_>, nodes: &NodeSet, need: u64) -> bool {
    let topo = e.topology();
    let mut free: u64 = 0;
    for p in &topo.pools {
        // The shallowest pool of one node: the node's own pool (or a one-node socket or die).
        let single =
            p.numa_nodes.len() == 1 && p.parent.is_none_or(|q| topo.pools[q].numa_nodes.len() > 1);
        if !single || !p.numa_nodes.is_subset(nodes) {
            continue;
        }
        if p.memory_bytes == 0 {
            return true;
        }
        free = free.saturating_add(
            p.memory_bytes
                .saturating_sub(e.pool_load(p.id).memory_bytes),
        );
    }
    free >= need
}
