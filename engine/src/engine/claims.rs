//! DRA claims on the engine ([`crate::claim`]): booking a claim picks its CPUs as exclusive
//! CPUs are picked and takes them out of the usable set; a container that uses booked claims
//! gets their CPUs ([`Site::Claim`]); releasing a claim gives its CPUs back to the pools.

use super::{Choice, Engine};
use crate::claim::{ClaimAsk, ClaimError, ClaimGrant, ClaimKey, ClaimPart};
use crate::cpu_picker::pick_exclusive;
use crate::cpuset::CpuSet;
use crate::nodeset::NodeSet;
use crate::request::{ContainerRequest, CoreGrain, PolicyKind};
use crate::types::{Reason, Site};
use crate::updates::CpusetUpdates;
use std::sync::Arc;

impl Engine {
    /// Books `ask`: for each of its devices, `cpus` CPUs of that group picked like exclusive
    /// CPUs (whole cores as configured, packed into clusters), taken out of the usable set.
    /// All devices or none. Returns the claim and the updates of the shared containers that
    /// move off its CPUs. A claim already booked under the same uid with the same devices and
    /// sizes is returned as booked (a repeated prepare); with others, it is a conflict.
    pub fn claim(&mut self, ask: &ClaimAsk) -> Result<(ClaimGrant, CpusetUpdates), ClaimError> {
        if let Some(g) = self.claims.get(ask.uid.as_str()) {
            return if same_shape(g, ask) {
                Ok((g.clone(), CpusetUpdates::new()))
            } else {
                Err(ClaimError::Conflict {
                    key: ask.key.clone(),
                    uid: ask.uid.clone(),
                })
            };
        }
        if ask.parts.is_empty() {
            return Err(ClaimError::NoDevice);
        }
        let before = self.claimed;
        let mut parts = Vec::with_capacity(ask.parts.len());
        for p in &ask.parts {
            match self.pick_part(p) {
                Ok(cpus) => {
                    self.set_claimed(self.claimed.union(&cpus));
                    parts.push(ClaimPart {
                        request: p.request.clone(),
                        device: p.device,
                        cpus,
                        memory_bytes: p.memory_bytes,
                    });
                }
                Err(e) => {
                    self.set_claimed(before);
                    return Err(e);
                }
            }
        }
        let g = self.grant_of_parts(ask.uid.clone(), ask.key.clone(), parts);
        let updates = self.refresh_shared(&g.cpus);
        self.claims.insert(Arc::from(ask.uid.as_str()), g.clone());
        Ok((g, updates))
    }

    /// Releases the claim `uid` (idempotent): its CPUs go back to the pools. Returns the
    /// updates of the shared containers that may use them again.
    pub fn release_claim(&mut self, uid: &str) -> CpusetUpdates {
        let Some(g) = self.claims.remove(uid) else {
            return CpusetUpdates::new();
        };
        self.set_claimed(self.claimed.difference(&g.cpus));
        self.refresh_shared(&g.cpus)
    }

    /// Books claims read back after a restart, before the containers are restored: each keeps
    /// the CPUs it was given when they are still usable and free, else it is refused (its
    /// error returned; the others are booked). Returns the updates of shared containers
    /// already held that move off the claims' CPUs.
    pub fn restore_claims(&mut self, claims: Vec<ClaimGrant>) -> (CpusetUpdates, Vec<ClaimError>) {
        let mut refused = Vec::new();
        let mut changed = CpuSet::new();
        for g in claims {
            if self.claims.contains_key(g.uid.as_str()) {
                continue;
            }
            let free = self.usable.difference(&self.taken);
            if g.cpus.is_empty() || !g.cpus.is_subset(&free) {
                refused.push(ClaimError::Taken {
                    key: g.key.clone(),
                    cpus: g.cpus.to_string(),
                });
                continue;
            }
            self.set_claimed(self.claimed.union(&g.cpus));
            changed = changed.union(&g.cpus);
            self.claims.insert(Arc::from(g.uid.as_str()), g);
        }
        (self.refresh_shared(&changed), refused)
    }

    /// The booked claim `uid`.
    pub fn claim_of(&self, uid: &str) -> Option<&ClaimGrant> {
        self.claims.get(uid)
    }

    /// Every booked claim, by uid.
    pub fn claims(&self) -> impl Iterator<Item = &ClaimGrant> {
        self.claims.values()
    }

    /// The CPUs of every booked claim.
    pub fn claimed(&self) -> &CpuSet {
        &self.claimed
    }

    /// The choice for a container that uses booked claims: their CPUs and their memory nodes,
    /// charged nowhere. `None` when it names no booked claim (it is placed as any other).
    pub(super) fn claim_choice(&self, req: &ContainerRequest) -> Option<Choice> {
        if req.claims.is_empty() {
            return None;
        }
        let mine: Vec<&ClaimGrant> = self
            .claims
            .values()
            .filter(|g| req.claims.contains(&g.key))
            .collect();
        if mine.is_empty() {
            return None;
        }
        let cpus = mine.iter().fold(CpuSet::new(), |s, g| s.union(&g.cpus));
        let mems = mine.iter().fold(NodeSet::new(), |s, g| s.union(&g.mems));
        Some(Choice {
            policy: PolicyKind::TopologyAware,
            pool: self.topo.deepest_pool_containing(&cpus),
            nodes: self.topo.nodes_of(&cpus),
            span: cpus,
            exclusive: CpuSet::new(),
            mems: Some(mems),
            charge_memory: false,
            reason: Reason::Claimed,
            unhonoured: None,
            site: Site::Claim,
        })
    }

    /// The uids of the booked claims `req` uses.
    pub(super) fn claim_uids(&self, req: &ContainerRequest) -> Vec<Arc<str>> {
        self.claims
            .iter()
            .filter(|(_, g)| req.claims.contains(&g.key))
            .map(|(uid, _)| Arc::clone(uid))
            .collect()
    }

    /// The span of a restored grant whose record names `uids`: the union of those claims'
    /// CPUs, when every one is booked.
    pub(super) fn claims_span(&self, uids: &[String]) -> Option<(CpuSet, NodeSet)> {
        let mut cpus = CpuSet::new();
        let mut mems = NodeSet::new();
        for uid in uids {
            let g = self.claims.get(uid.as_str())?;
            cpus = cpus.union(&g.cpus);
            mems = mems.union(&g.mems);
        }
        (!cpus.is_empty()).then_some((cpus, mems))
    }

    fn pick_part(&self, p: &crate::claim::PartAsk) -> Result<CpuSet, ClaimError> {
        let pool = self
            .topo
            .pools
            .get(p.device)
            .ok_or_else(|| ClaimError::NoSuchDevice {
                device: p.device.to_string(),
            })?;
        let usable = pool.cpus.intersection(&self.allocatable()).len();
        if p.cpus == 0 || p.cpus > usable {
            return Err(ClaimError::BadSize {
                device: pool.name.clone(),
                asked: p.cpus,
                usable,
            });
        }
        let grain = self.cfg.exclusive_cores;
        pick_exclusive(&self.view(), p.device, p.cpus, grain).ok_or_else(|| ClaimError::NoRoom {
            device: pool.name.clone(),
            asked: p.cpus,
            free: self.shared_cpus(&pool.cpus).len(),
            grain: grain_text(grain),
        })
    }

    fn grant_of_parts(&self, uid: String, key: ClaimKey, parts: Vec<ClaimPart>) -> ClaimGrant {
        let cpus = parts.iter().fold(CpuSet::new(), |s, p| s.union(&p.cpus));
        let mems = self.topo.mems_for_nodes(&self.topo.nodes_of(&cpus));
        ClaimGrant {
            uid,
            key,
            parts,
            cpus,
            mems,
        }
    }

    /// The CPUs a claim may be given: online, not reserved, not isolated (claimed ones
    /// included: what the node's devices offer).
    pub fn allocatable(&self) -> CpuSet {
        self.topo
            .online
            .difference(&self.cfg.reserved)
            .difference(&self.topo.isolated)
    }
}

/// Whether a booked claim is what `ask` asks for again (the same devices, sizes and memory).
fn same_shape(g: &ClaimGrant, ask: &ClaimAsk) -> bool {
    g.parts.len() == ask.parts.len()
        && g.parts.iter().zip(&ask.parts).all(|(have, want)| {
            have.device == want.device
                && have.cpus.len() == want.cpus
                && have.memory_bytes == want.memory_bytes
                && have.request == want.request
        })
}

fn grain_text(g: CoreGrain) -> &'static str {
    match g {
        CoreGrain::WholeCores => "whole cores",
        CoreGrain::Threads => "threads",
        CoreGrain::SiblingPair => "sibling pairs",
    }
}

#[cfg(test)]
mod tests;
