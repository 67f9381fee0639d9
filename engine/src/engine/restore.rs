//! Rebuilding the state from the containers a runtime reports: at start-up, at a reconnect,
//! and when a running agent adopts containers it did not know (started behind its back).
//!
//! The rules, in order:
//! - a container opted out (skip label or annotation) stays unmanaged;
//! - its grant record is used when it still holds: the pool and nodes exist, exclusive CPUs are
//!   usable (not reserved, isolated or offline), and the live cpuset agrees with it (the live
//!   cpuset wins over an older record: a container resized in place keeps its new CPUs);
//! - otherwise the grant is inferred from the live cpuset (the reference's recovery);
//! - exclusive grants are adopted first, and one that collides with an exclusive grant already
//!   held becomes shared; one that would leave a shared grant with no CPU becomes shared too;
//! - a grant on the reserved CPUs (its record says `on=reserved`, or a container allowed
//!   there runs on reserved CPUs only) keeps the reserved CPUs, charged nowhere;
//! - every shared grant whose span meets the exclusive CPUs adopted, the engine's own included,
//!   gets its cpuset recomputed (an exclusive container adopted into a running agent shrinks the
//!   shared containers around it).

use super::{CpusetUpdate, Engine, RestoreReport};
use crate::cpuset::CpuSet;
use crate::grant::{Grant, GrantRecord};
use crate::nodeset::NodeSet;
use crate::request::{Hyperthreads, PolicyKind};
use crate::topology::Level;
use crate::types::{Existing, Site};
use std::sync::Arc;

/// How a restored grant was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Record,
    Inferred,
}

impl Engine {
    /// Rebuilds the state from the containers a runtime reports (containers the engine already
    /// holds keep their grant). Returns what was adopted and the cpuset updates needed: for
    /// restored containers whose live cpuset differs, and for shared containers already held
    /// whose cpuset the adopted exclusive CPUs change.
    pub fn restore(&mut self, existing: &[Existing]) -> RestoreReport {
        let mut report = RestoreReport::default();
        let resolved = self.resolve_grants(existing, &mut report);
        let exclusive = self.adopt(resolved, &mut report);
        let demoted = self.demote_starving_exclusives(existing);
        let mut updates: Vec<CpusetUpdate> = self
            .refresh_shared(&exclusive.union(&demoted))
            .into_iter()
            .filter(|u| !existing.iter().any(|e| *e.request.id == *u.container_id))
            .collect();
        updates.extend(self.restored_cpusets(existing));
        updates.sort_by(|a, b| a.container_id.cmp(&b.container_id));
        report.updates = updates;
        report
    }

    /// Step 1: the grant each new container has, from its record or its live cpuset.
    fn resolve_grants<'a>(
        &self,
        existing: &'a [Existing],
        report: &mut RestoreReport,
    ) -> Vec<(&'a Existing, Grant, Source)> {
        // How many containers use each CPU: a CPU used by two containers is not exclusive.
        let mut users = vec![0u16; crate::cpuset::MAX_IDS];
        for e in existing {
            for cpu in e.cpus.iter().flat_map(|c| c.iter()) {
                users[cpu] = users[cpu].saturating_add(1);
            }
        }
        let mut resolved = Vec::new();
        for e in existing {
            if self.grants.contains_key(e.request.id.as_str()) {
                continue;
            }
            if self.cfg.annotations_allowed && e.request.overrides.skip {
                report.unmanaged += 1;
                continue;
            }
            let from_record = e
                .record
                .as_deref()
                .and_then(GrantRecord::parse)
                .and_then(|r| self.grant_from_record(&r, e));
            let found = match from_record {
                Some(g) => Some((g, Source::Record)),
                None => e.cpus.and_then(|cpus| {
                    let sole = cpus.iter().all(|c| users[c] == 1);
                    self.infer_grant(e, cpus, sole)
                        .map(|g| (g, Source::Inferred))
                }),
            };
            match found {
                Some((g, source)) => resolved.push((e, g, source)),
                None => report.unmanaged += 1,
            }
        }
        // Exclusive grants first, then by id: the result does not depend on the list's order.
        resolved.sort_by_key(|(e, g, _)| (!g.is_exclusive(), e.request.id.clone()));
        resolved
    }

    /// Step 2: charges the grants, exclusive ones first; an exclusive grant whose CPUs are
    /// already taken becomes shared. Returns the exclusive CPUs adopted.
    fn adopt(
        &mut self,
        resolved: Vec<(&Existing, Grant, Source)>,
        report: &mut RestoreReport,
    ) -> CpuSet {
        let mut adopted = CpuSet::new();
        for (e, mut g, source) in resolved {
            if g.is_exclusive() {
                if g.exclusive.intersects(&self.taken) {
                    // Two containers claim the same exclusive CPU: the later one becomes shared.
                    g.exclusive = CpuSet::new();
                } else {
                    adopted = adopted.union(&g.exclusive);
                    self.set_taken(self.taken.union(&g.exclusive));
                }
            }
            // Shared cpusets are filled in once all exclusive CPUs are known.
            g.cpus = g.visible(&self.topo, &g.exclusive);
            self.charge(&g);
            let id: Arc<str> = Arc::from(e.request.id.as_str());
            if g.site == Site::Claim {
                let uids = e.record.as_deref().and_then(GrantRecord::parse);
                let uids = uids.map(|r| r.claims).unwrap_or_default();
                self.claim_users.insert(
                    Arc::clone(&id),
                    uids.iter().map(|u| Arc::from(u.as_str())).collect(),
                );
            }
            self.put(id, g);
            match source {
                Source::Record => report.from_record += 1,
                Source::Inferred => report.inferred += 1,
            }
        }
        adopted
    }

    /// Step 3, a safety net for inferred grants: an exclusive grant adopted now that would
    /// leave a shared one with no CPU becomes shared itself (grants the engine already held are
    /// never touched). Returns the exclusive CPUs given back.
    fn demote_starving_exclusives(&mut self, existing: &[Existing]) -> CpuSet {
        let mut given_back = CpuSet::new();
        loop {
            let starving = self.grants.values().find_map(|g| {
                let cpus = self.shared_cpus(&g.span);
                (!g.is_exclusive() && !g.off_pools() && cpus.is_empty()).then_some(g.span)
            });
            let Some(span) = starving else { break };
            let Some(id) = self
                .grants
                .iter()
                .filter(|(id, g)| {
                    g.exclusive.intersects(&span) && existing.iter().any(|e| *e.request.id == ***id)
                })
                .map(|(id, _)| Arc::clone(id))
                .min()
            else {
                break;
            };
            if let Some(mut g) = self.take(&id) {
                self.uncharge(&g);
                self.set_taken(self.taken.difference(&g.exclusive));
                given_back = given_back.union(&g.exclusive);
                g.exclusive = CpuSet::new();
                g.cpus = CpuSet::new();
                self.charge(&g);
                self.put(id, g);
            }
        }
        given_back
    }

    /// Step 4: the cpusets of the restored containers, and an update for each whose live cpuset
    /// differs.
    fn restored_cpusets(&mut self, existing: &[Existing]) -> Vec<CpusetUpdate> {
        let (usable, taken) = (self.usable, self.taken);
        let mut updates = Vec::new();
        for e in existing {
            let Some(g) = self.grants.get_mut(e.request.id.as_str()) else {
                continue;
            };
            if g.off_pools() {
                g.cpus = g.visible(&self.topo, &g.span);
            } else if !g.is_exclusive() {
                g.cpus = g.visible(&self.topo, &g.span.intersection(&usable).difference(&taken));
            }
            if e.cpus != Some(g.cpus) && !g.cpus.is_empty() {
                updates.push(CpusetUpdate {
                    container_id: Arc::from(e.request.id.as_str()),
                    cpus: g.cpus,
                    mems: g.mems,
                });
            }
        }
        updates
    }

    /// The grant a record describes, if it still holds (see the module's rules).
    fn grant_from_record(&self, r: &GrantRecord, e: &Existing) -> Option<Grant> {
        match r.site {
            Site::Reserved => return self.reserved_grant(e, e.cpus.unwrap_or_default()),
            Site::Claim => return self.claimed_grant(r, e),
            Site::Pools => {}
        }
        let pool = self.topo.pool_by_name(&r.pool)?;
        if !r.exclusive.is_subset(&self.usable) {
            return None;
        }
        let span = match r.policy {
            PolicyKind::NumaAware => {
                let mut s = CpuSet::new();
                for n in r.nodes.iter() {
                    s = s.union(&self.topo.node(n as u32)?.cpus);
                }
                s
            }
            PolicyKind::TopologyAware => pool.cpus,
        };
        let threads = crate::policy::Settings::new(&self.cfg, &e.request).threads;
        if let Some(live) = e.cpus {
            // The live cpuset wins over a record it contradicts.
            let agrees = if r.exclusive.is_empty() {
                live.is_subset(&span)
            } else {
                live == r.exclusive
                    || (threads == Hyperthreads::Hidden
                        && live == self.topo.one_thread_per_core(&r.exclusive))
            };
            if !agrees {
                return None;
            }
        }
        // The record says where the container was placed; what it asks for now is what the
        // runtime reports (a resize after the record was written), when it reports anything.
        let live = &e.request;
        let reported = live.cpu_request_milli > 0 || live.cpu_limit_milli.is_some();
        let (request_milli, limit_milli) = if reported {
            (live.cpu_request_milli, live.cpu_limit_milli)
        } else {
            (r.request_milli, r.limit_milli)
        };
        let memory_bytes = match live.memory_limit_bytes {
            Some(m) if r.memory_bytes > 0 => m,
            _ => r.memory_bytes,
        };
        Some(Grant {
            policy: r.policy,
            pool: pool.id,
            nodes: r.nodes,
            span,
            exclusive: r.exclusive,
            request_milli,
            limit_milli,
            memory_bytes,
            mems: r.mems,
            cpus: CpuSet::new(),
            threads,
            site: Site::Pools,
        })
    }

    /// The grant of a container on the CPUs of the claims its record names, when they are all
    /// booked again ([`Engine::restore_claims`] runs first) and the live cpuset is theirs.
    fn claimed_grant(&self, r: &GrantRecord, e: &Existing) -> Option<Grant> {
        let (span, mems) = self.claims_span(&r.claims)?;
        if e.cpus.is_some_and(|live| !live.is_subset(&span)) {
            return None;
        }
        let req = &e.request;
        Some(Grant {
            policy: PolicyKind::TopologyAware,
            pool: self.topo.deepest_pool_containing(&span),
            nodes: self.topo.nodes_of(&span),
            span,
            exclusive: CpuSet::new(),
            request_milli: req.cpu_request_milli,
            limit_milli: req.cpu_limit_milli,
            memory_bytes: 0,
            mems: Some(mems),
            cpus: CpuSet::new(),
            threads: crate::policy::Settings::new(&self.cfg, req).threads,
            site: Site::Claim,
        })
    }

    /// A grant on the reserved CPUs for a container running on `live` CPUs, when the container
    /// is still allowed there and `live` is within them (else it goes back to the pools). The
    /// request figures are the live ones: the grant is charged nowhere.
    fn reserved_grant(&self, e: &Existing, live: CpuSet) -> Option<Grant> {
        use crate::policy::reserved::{decide, ReservedUse};
        let req = &e.request;
        let set = crate::policy::Settings::new(&self.cfg, req);
        let ReservedUse::Place(cpus) = decide(&self.view(), req, &set) else {
            return None;
        };
        if !live.is_empty() && !live.is_subset(&cpus) {
            return None;
        }
        let nodes = self.topo.nodes_of(&cpus);
        Some(Grant {
            policy: PolicyKind::TopologyAware,
            pool: 0,
            nodes,
            span: cpus,
            exclusive: CpuSet::new(),
            request_milli: req.cpu_request_milli,
            limit_milli: req.cpu_limit_milli,
            memory_bytes: 0,
            mems: set.memory.then(|| self.topo.mems_for_nodes(&nodes)),
            cpus: CpuSet::new(),
            threads: set.threads,
            site: Site::Reserved,
        })
    }

    /// The deepest pool containing `cpus` that a shared grant of `req` could have: cluster
    /// pools only with cluster affinity or a cluster level asked for (a Guaranteed container
    /// alone on a whole cluster's CPUs is exclusive, not shared on that cluster).
    fn shared_pool_containing(
        &self,
        cpus: &CpuSet,
        req: &crate::request::ContainerRequest,
    ) -> usize {
        let set = crate::policy::Settings::new(&self.cfg, req);
        let off =
            |l: Level| (l == Level::Cluster && !set.clusters) || (l == Level::Cache && !set.caches);
        let mut pool = self.topo.deepest_pool_containing(cpus);
        while off(self.topo.pools[pool].level) {
            match self.topo.pools[pool].parent {
                Some(p) => pool = p,
                None => break,
            }
        }
        pool
    }

    /// The grant a container most likely has, from its cpuset alone (the reference's recovery:
    /// the deepest pool that contains it). Exclusive only on usable CPUs no one else uses, for
    /// a container that asks for exactly that many.
    fn infer_grant(&self, e: &Existing, cpus: CpuSet, sole_user: bool) -> Option<Grant> {
        let cpus = cpus.intersection(&self.topo.online);
        if cpus.is_empty() {
            return None;
        }
        if !self.cfg.reserved.is_empty() && cpus.is_subset(&self.cfg.reserved) {
            if let Some(g) = self.reserved_grant(e, cpus) {
                return Some(g);
            }
        }
        let req = &e.request;
        let pool = self.shared_pool_containing(&cpus, req);
        let nodes = self.topo.nodes_of(&cpus);
        let exclusive = match req.exclusive_cpus() {
            Some(n)
                if n == cpus.len()
                    && sole_user
                    && cpus.is_subset(&self.usable)
                    && self.cfg.exclusive_cpus
                    && self.cfg.policy == PolicyKind::TopologyAware
                    && self.topo.pools[pool].cpus != cpus =>
            {
                cpus
            }
            _ => CpuSet::new(),
        };
        let (policy, span) = if exclusive.is_empty() && self.topo.pools[pool].cpus != cpus {
            // Not a pool's cpuset: a numa-aware grant over whole nodes, or a pool with
            // exclusive CPUs carved out; the NUMA nodes' CPUs are the span either way.
            let mut s = CpuSet::new();
            for n in nodes.iter() {
                if let Some(node) = self.topo.node(n as u32) {
                    s = s.union(&node.cpus);
                }
            }
            let pool_span = self.topo.pools[pool].cpus;
            if pool_span.is_subset(&s) && s.len() > pool_span.len() {
                (PolicyKind::NumaAware, s)
            } else {
                (self.cfg.policy, pool_span)
            }
        } else {
            (self.cfg.policy, self.topo.pools[pool].cpus)
        };
        let mems = self.adopted_mems(e);
        Some(Grant {
            policy,
            pool,
            nodes,
            span,
            exclusive,
            request_milli: req.cpu_request_milli,
            limit_milli: req.cpu_limit_milli,
            memory_bytes: if self.cfg.memory_topology && mems.is_some() {
                req.memory_limit_bytes.unwrap_or(0)
            } else {
                0
            },
            mems,
            cpus: CpuSet::new(),
            threads: crate::policy::Settings::new(&self.cfg, req).threads,
            site: Site::Pools,
        })
    }

    /// The memory nodes of a container adopted without a record: none where its memory is not
    /// bound (the agent then never writes its `cpuset.mems`, a move included), else the live
    /// ones without the memory-only nodes of kinds it did not ask for (the kernel's default
    /// mems hold every memory node).
    fn adopted_mems(&self, e: &Existing) -> Option<NodeSet> {
        let set = crate::policy::Settings::new(&self.cfg, &e.request);
        let live = e.mems.filter(|m| !m.is_empty() && set.memory)?;
        let asked = |id: usize| {
            self.topo
                .node(id as u32)
                .is_none_or(|n| !n.cpus.is_empty() || set.memory_types.tiers().any(|k| k == n.kind))
        };
        let kept = NodeSet::from_ids(live.iter().filter(|id| asked(*id)));
        (!kept.is_empty()).then_some(kept)
    }
}
