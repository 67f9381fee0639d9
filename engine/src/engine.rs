//! The allocation engine: the current grants, the load on every pool and NUMA node, and the
//! create / update / remove / restore operations. Pure: no I/O, no clock, no randomness.

use crate::claim::ClaimGrant;
use crate::cpu_model::ClustersOff;
use crate::cpuset::CpuSet;
use crate::grant::Grant;
use crate::grants::Grants;
use crate::policy::{Policies, Policy};
use crate::request::{ContainerRequest, Hyperthreads, PolicyKind};
use crate::state::{Parts, StateView};
use crate::topology::{PoolId, Topology};
use crate::updates::CpusetUpdates;
use crate::usage_hint::UsageHint;
use shared_index::SharedIndex;
use std::sync::Arc;

pub use crate::types::{
    Choice, CpusetUpdate, EngineConfig, Existing, NodeLoad, Outcome, Placement, PoolLoad,
    PoolStatus, Reason, ResourcePriority, RestoreReport, Site, SkipReason,
};

mod charge;
mod claims;
mod hint;
mod reinstate;
mod relocate;
pub use relocate::RelocateError;
mod restore;
mod shared_index;
#[cfg(test)]
mod tests;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Engine {
    topo: Arc<Topology>,
    /// The configuration in force ([`EngineConfig::in_force`] on the topology's CPU).
    cfg: EngineConfig,
    /// Why cluster affinity is off although the configuration given asked for it.
    clusters_off: Option<ClustersOff>,
    /// CPUs any grant may use: online minus reserved and isolated.
    usable: CpuSet,
    /// Each pool's request capacity in milli-CPUs (its usable CPUs), kept with `usable`: the
    /// ranking reads it several times per pool and decision.
    capacity: Vec<u64>,
    /// Each NUMA node's request capacity in milli-CPUs (index = position in the topology's
    /// node list), kept with `usable`.
    node_capacity: Vec<u64>,
    /// Whether each pool has a CPU left for shared containers (usable and not exclusive),
    /// kept with `usable` and `taken`: every decision asks it of every pool.
    has_shared: Vec<bool>,
    grants: Grants,
    /// The shared grants grouped by span (kept with `grants` by `put` and `take`).
    shared: SharedIndex,
    pool_load: Vec<PoolLoad>,
    node_load: Vec<NodeLoad>,
    taken: CpuSet,
    /// One policy instance per kind.
    policies: Policies,
    /// Measured usage per NUMA node, when the caller hands one (see [`UsageHint`]).
    usage_hint: Option<UsageHint>,
    /// The booked DRA claims by uid ([`crate::claim`]).
    claims: std::collections::BTreeMap<Arc<str>, ClaimGrant>,
    /// Their CPUs: out of `usable`.
    claimed: CpuSet,
    /// The uids of the claims each [`Site::Claim`] grant uses, by container id (kept here so a
    /// grant stays plain data on the placement path).
    claim_users: std::collections::HashMap<Arc<str>, Vec<Arc<str>>>,
}

impl Engine {
    pub fn new(topo: Arc<Topology>, cfg: EngineConfig) -> Engine {
        let (cfg, clusters_off) = cfg.in_force(&topo.cpu);
        let usable = topo
            .online
            .difference(&cfg.reserved)
            .difference(&topo.isolated);
        Engine {
            capacity: capacities(topo.pools.iter().map(|p| &p.cpus), &usable),
            node_capacity: capacities(topo.nodes.iter().map(|n| &n.cpus), &usable),
            has_shared: with_shared_cpus(&topo, &usable, &CpuSet::new()),
            pool_load: vec![PoolLoad::default(); topo.pools.len()],
            node_load: vec![NodeLoad::default(); topo.nodes.len()],
            topo,
            cfg,
            clusters_off,
            usable,
            grants: Grants::default(),
            shared: SharedIndex::default(),
            taken: CpuSet::new(),
            policies: Policies::default(),
            usage_hint: None,
            claims: Default::default(),
            claimed: CpuSet::new(),
            claim_users: Default::default(),
        }
    }

    /// Replaces the engine's instance of the policy of `policy.kind()` (see [`crate::policy`]):
    /// containers of that kind placed from now on are placed by `policy`.
    pub fn with_policy<P: Policy + 'static>(mut self, policy: P) -> Engine {
        self.policies.set(Arc::new(policy));
        self
    }

    /// The policy instance of a kind.
    pub fn policy(&self, kind: PolicyKind) -> &dyn Policy {
        self.policies.get(kind)
    }

    /// A read-only view of the state, as policies see it.
    pub fn view(&self) -> StateView<'_> {
        StateView::new(Parts {
            topo: &self.topo,
            cfg: &self.cfg,
            usable: &self.usable,
            capacity: &self.capacity,
            node_capacity: &self.node_capacity,
            has_shared: &self.has_shared,
            taken: &self.taken,
            grants: &self.grants,
            pool_load: &self.pool_load,
            node_load: &self.node_load,
            usage_hint: self.usage_hint.as_ref(),
        })
    }

    /// Where `req` would be placed now, without placing it (the decision [`Engine::create`]
    /// commits, before its opt-out and already-placed checks).
    pub fn decide(&self, req: &ContainerRequest) -> Option<Choice> {
        if !req.claims.is_empty() {
            if let Some(c) = self.claim_choice(req) {
                return Some(c);
            }
        }
        self.policies.choose(&self.view(), req, None)
    }

    pub fn topology(&self) -> &Arc<Topology> {
        &self.topo
    }

    /// The configuration in force: the one given, with cluster affinity off where its
    /// [`EngineConfig::cluster_rule`] does not allow it on this CPU.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Why cluster affinity is off although the configuration given asked for it.
    pub fn clusters_off(&self) -> Option<&ClustersOff> {
        self.clusters_off.as_ref()
    }

    /// Changes the policy settings for containers placed from now on (taken through
    /// [`EngineConfig::in_force`]); existing grants keep their pools. Reserved CPUs apply at once
    /// to the usable set.
    /// Shared grants follow the CPUs the new configuration makes usable or reserved at once:
    /// returns the updates for those whose cpuset changed (as a restore under the new
    /// configuration would give them, so the order of a restore and a change does not matter).
    pub fn set_config(&mut self, cfg: EngineConfig) -> CpusetUpdates {
        let (cfg, clusters_off) = cfg.in_force(&self.topo.cpu);
        self.clusters_off = clusters_off;
        let before = self.usable;
        self.cfg = cfg;
        self.set_claimed(self.claimed);
        let changed = before.symmetric_difference(&self.usable);
        if changed.is_empty() {
            return CpusetUpdates::new();
        }
        self.refresh_shared(&changed)
    }

    /// Sets the claimed CPUs and what follows from them and the configuration: the usable CPUs
    /// (online minus reserved, isolated and claimed) and the capacities read from those.
    fn set_claimed(&mut self, claimed: CpuSet) {
        self.claimed = claimed;
        self.usable = self.allocatable().difference(&claimed);
        self.capacity = capacities(self.topo.pools.iter().map(|p| &p.cpus), &self.usable);
        self.node_capacity = capacities(self.topo.nodes.iter().map(|n| &n.cpus), &self.usable);
        self.has_shared = with_shared_cpus(&self.topo, &self.usable, &self.taken);
    }

    pub fn grant(&self, id: &str) -> Option<&Grant> {
        self.grants.get(id)
    }

    pub fn grants(&self) -> impl Iterator<Item = (&str, &Grant)> {
        self.grants.iter().map(|(id, g)| (&**id, g))
    }

    /// Adds (or replaces) a grant, keeping the shared index in step (a replaced grant's entry
    /// goes: [`SharedIndex::add`] moves a slot it holds).
    fn put(&mut self, id: Arc<str>, g: Grant) {
        // Reserved grants are never refreshed: exclusive CPUs are never reserved ones.
        let shared = (!g.is_exclusive() && !g.off_pools()).then_some((g.pool, g.span));
        let slot = self.grants.insert(Arc::clone(&id), g);
        match shared {
            Some((pool, span)) => self.shared.add(slot, &id, pool, &span),
            None => self.shared.remove(slot),
        }
    }

    /// Removes a grant, keeping the shared index in step.
    fn take(&mut self, id: &str) -> Option<Grant> {
        let (slot, g) = self.grants.remove(id)?;
        self.shared.remove(slot);
        Some(g)
    }

    pub fn len(&self) -> usize {
        self.grants.len()
    }

    pub fn is_empty(&self) -> bool {
        self.grants.is_empty()
    }

    pub fn pool_load(&self, id: PoolId) -> &PoolLoad {
        &self.pool_load[id]
    }

    pub fn node_load(&self) -> &[NodeLoad] {
        &self.node_load
    }

    /// Exclusive CPUs handed out.
    pub fn taken(&self) -> &CpuSet {
        &self.taken
    }

    pub fn usable(&self) -> &CpuSet {
        &self.usable
    }

    /// CPUs a shared grant within `span` may use now.
    pub fn shared_cpus(&self, span: &CpuSet) -> CpuSet {
        self.view().shared_cpus(span)
    }

    /// Request capacity of a pool in milli-CPUs (its usable CPUs).
    pub fn capacity_milli(&self, id: PoolId) -> u64 {
        self.view().capacity_milli(id)
    }

    /// Places a new container.
    pub fn create(&mut self, req: &ContainerRequest) -> Outcome {
        if self.grants.contains_key(req.id.as_str()) {
            return Outcome::Skipped(SkipReason::AlreadyPlaced);
        }
        if self.cfg.annotations_allowed && req.overrides.skip {
            return Outcome::Skipped(SkipReason::OptedOut);
        }
        let choice = match self.decide(req) {
            Some(c) => c,
            None => return Outcome::Skipped(SkipReason::NoCapacity),
        };
        if let Some(why) = self.refusal(req, &choice) {
            return Outcome::Skipped(why);
        }
        Outcome::Placed(self.commit(req, choice))
    }

    /// Why a new container's choice may not be taken: a strict NUMA policy with more than one
    /// NUMA node (the policies give one node wherever one holds the request), an exclusive one without a whole node (a system daemon on the reserved CPUs
    /// is not held to its NUMA policy).
    fn refusal(&self, req: &ContainerRequest, choice: &Choice) -> Option<SkipReason> {
        use crate::request::NumaPolicy;
        if choice.site != Site::Pools {
            return None;
        }
        let policy = req
            .overrides
            .numa_policy
            .filter(|_| self.cfg.annotations_allowed);
        if policy == Some(NumaPolicy::Exclusive) && choice.reason != Reason::ExclusiveNuma {
            return Some(SkipReason::NoFreeNumaNode);
        }
        if policy != Some(NumaPolicy::Strict) {
            return None;
        }
        // Counted only for a strict policy: a count of a 1,024-bit set on every create.
        let nodes = if choice.exclusive.is_empty() {
            choice.nodes.len()
        } else {
            self.topo.nodes_of(&choice.exclusive).len()
        };
        (nodes != 1).then_some(SkipReason::NoSingleNumaNode)
    }

    /// Re-places a container after a resize. A container still fitting its pool stays there.
    pub fn update(&mut self, req: &ContainerRequest) -> Outcome {
        let Some(old) = self.grants.get(req.id.as_str()).cloned() else {
            return self.create(req);
        };
        // A whole NUMA node (`numa-policy: exclusive`) stays the container's whatever its size.
        let whole_node = old.is_exclusive()
            && req.overrides.numa_policy == Some(crate::request::NumaPolicy::Exclusive);
        // A container on its claims' CPUs keeps them whatever its size.
        let unchanged = old.site == Site::Claim
            || old.request_milli == req.cpu_request_milli
                && old.limit_milli == req.cpu_limit_milli
                && (whole_node || old.exclusive.len() == req.exclusive_cpus().unwrap_or(0));
        if unchanged {
            return Outcome::Placed(Placement {
                cpus: old.cpus,
                mems: old.mems,
                pool: old.pool,
                exclusive: old.is_exclusive(),
                reason: match old.site {
                    Site::Reserved => Reason::Reserved,
                    Site::Claim => Reason::Claimed,
                    Site::Pools => Reason::Fits(self.topo.pools[old.pool].level),
                },
                updates: CpusetUpdates::new(),
                unhonoured: None,
            });
        }
        let mut updates = self.release(&req.id);
        let outcome = match self.policies.choose(&self.view(), req, Some(&old)) {
            // A strict NUMA policy is checked at create only: a resize keeps the container
            // where it fits, and never leaves it without its grant.
            Some(c) => Outcome::Placed(self.commit(req, c)),
            None => Outcome::Skipped(SkipReason::NoCapacity),
        };
        match outcome {
            Outcome::Placed(mut p) => {
                // Updates from the release and from the new grant; the later one wins.
                updates.merge(std::mem::take(&mut p.updates));
                updates.retain(|u| u.container_id != req.id);
                p.updates = updates;
                Outcome::Placed(p)
            }
            other => other,
        }
    }

    /// Releases a container's grant (idempotent). Returns cpuset updates for shared containers
    /// that get returned exclusive CPUs back.
    pub fn remove(&mut self, id: &str) -> CpusetUpdates {
        self.release(id)
    }

    fn release(&mut self, id: &str) -> CpusetUpdates {
        let Some(g) = self.take(id) else {
            return CpusetUpdates::new();
        };
        self.hint_removed(id, &g);
        self.uncharge(&g);
        if g.site == Site::Claim {
            self.claim_users.remove(id);
        }
        if g.is_exclusive() {
            self.set_taken(self.taken.difference(&g.exclusive));
            self.refresh_shared(&g.exclusive)
        } else {
            CpusetUpdates::new()
        }
    }

    /// Sets the exclusive CPUs handed out, each pool's count of them and whether it keeps a
    /// shared CPU. Only the pools that hold a CPU whose state changed are counted again (the
    /// few around an exclusive grant, not every pool of the machine): the others' figures do
    /// not depend on it.
    fn set_taken(&mut self, taken: CpuSet) {
        let changed = self.taken.symmetric_difference(&taken);
        self.taken = taken;
        let usable = self.usable;
        // One pass over the pools for both figures, in the vectors already there.
        let pools = self.topo.pools.iter().zip(self.pool_load.iter_mut());
        for ((p, l), shared) in pools.zip(self.has_shared.iter_mut()) {
            if !p.cpus.intersects(&changed) {
                continue;
            }
            l.taken_cpus = u32::try_from(p.cpus.intersection(&taken).len()).unwrap_or(u32::MAX);
            *shared = !p.cpus.intersection(&usable).difference(&taken).is_empty();
        }
    }

    /// Recomputes the cpuset of every shared grant whose span meets `changed`, returning the
    /// updates for those whose cpuset changed: group by group (in the order the spans were
    /// first seen), in each group's member order.
    fn refresh_shared(&mut self, changed: &CpuSet) -> CpusetUpdates {
        let (usable, taken) = (self.usable, self.taken);
        // Room for every member of the groups hit: no regrowth (and copying) of a list that
        // can hold hundreds of updates.
        let members: usize = self.shared.hit(changed).map(|g| g.members.len()).sum();
        let mut out = CpusetUpdates::with_capacity(members);
        for group in self.shared.hit(changed) {
            let cpus = group.span.intersection(&usable).difference(&taken);
            if cpus.is_empty() {
                continue;
            }
            // One thread per core, worked out once for the group if a member hides them.
            let mut hidden = None;
            for m in &group.members {
                let Some((_, g)) = self.grants.slot_mut(m.slot) else {
                    continue;
                };
                let mine = match g.threads {
                    Hyperthreads::Shown => &cpus,
                    Hyperthreads::Hidden => {
                        hidden.get_or_insert_with(|| self.topo.one_thread_per_core(&cpus))
                    }
                };
                if g.cpus != *mine {
                    g.cpus = *mine;
                    out.push(Arc::clone(&m.id), mine, g.mems.as_ref());
                }
            }
        }
        out
    }

    fn commit(&mut self, req: &ContainerRequest, c: Choice) -> Placement {
        let memory_bytes = if c.charge_memory {
            req.memory_limit_bytes.unwrap_or(0)
        } else {
            0
        };
        let all = match c.site {
            Site::Reserved | Site::Claim => c.span,
            Site::Pools if c.exclusive.is_empty() => self.shared_cpus(&c.span),
            Site::Pools => c.exclusive,
        };
        let threads = crate::policy::Settings::new(&self.cfg, req).threads;
        let cpus = match threads {
            crate::request::Hyperthreads::Shown => all,
            crate::request::Hyperthreads::Hidden => self.topo.one_thread_per_core(&all),
        };
        let g = Grant {
            policy: c.policy,
            pool: c.pool,
            nodes: c.nodes,
            span: c.span,
            exclusive: c.exclusive,
            request_milli: req.cpu_request_milli,
            limit_milli: req.cpu_limit_milli,
            memory_bytes,
            mems: c.mems,
            cpus,
            threads,
            site: c.site,
        };
        self.charge(&g);
        let id: Arc<str> = Arc::from(req.id.as_str());
        let updates = if g.is_exclusive() {
            self.set_taken(self.taken.union(&g.exclusive));
            let ex = g.exclusive;
            self.put(id, g);
            self.refresh_shared(&ex)
        } else {
            if g.site == Site::Claim {
                self.claim_users
                    .insert(Arc::clone(&id), self.claim_uids(req));
            }
            self.hint_placed(&id, &g);
            self.put(id, g);
            CpusetUpdates::new()
        };
        Placement {
            cpus,
            mems: c.mems,
            pool: c.pool,
            exclusive: !c.exclusive.is_empty(),
            reason: c.reason,
            updates,
            unhonoured: c.unhonoured,
        }
    }

    /// The grant record of a placed container (see [`Grant::record`]), with the uids of its
    /// claims after `on=claim:`.
    pub fn record(&self, id: &str) -> Option<String> {
        let g = self.grants.get(id)?;
        let mut s = g.record(&self.topo);
        if g.site == Site::Claim {
            let uids = self
                .claim_users
                .get(id)
                .map(Vec::as_slice)
                .unwrap_or_default();
            for (i, uid) in uids.iter().enumerate() {
                if i > 0 {
                    s.push('+');
                }
                s.push_str(uid);
            }
        }
        Some(s)
    }

    /// Per-pool figures for status and metrics.
    pub fn pool_status(&self) -> Vec<PoolStatus> {
        self.topo
            .pools
            .iter()
            .map(|p| {
                let l = &self.pool_load[p.id];
                PoolStatus {
                    name: p.name.clone(),
                    level: p.level,
                    cpus: p.cpus.to_string(),
                    capacity_milli: self.capacity_milli(p.id),
                    request_milli: l.request_milli,
                    limit_milli: l.limit_milli,
                    exclusive_cpus: p.cpus.intersection(&self.taken).to_string(),
                    shared_cpus: self.shared_cpus(&p.cpus).to_string(),
                    claimed_cpus: p.cpus.intersection(&self.claimed).to_string(),
                    containers: l.containers,
                }
            })
            .collect()
    }
}

/// The request capacity in milli-CPUs of each of `sets` (pools' or nodes' CPUs): its CPUs
/// among `usable`, times 1000.
fn capacities<'a>(sets: impl Iterator<Item = &'a CpuSet>, usable: &CpuSet) -> Vec<u64> {
    sets.map(|cpus| (cpus.intersection(usable).len() as u64).saturating_mul(1000))
        .collect()
}

/// Whether each pool has a CPU in `usable` and not in `taken`.
fn with_shared_cpus(topo: &Topology, usable: &CpuSet, taken: &CpuSet) -> Vec<bool> {
    topo.pools
        .iter()
        .map(|p| !p.cpus.intersection(usable).difference(taken).is_empty())
        .collect()
}
