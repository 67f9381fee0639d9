//! Undoing a decision exactly: a container gets back the grant it had before (an update the
//! runtime refused), as the runtime still has it.

use super::{CpusetUpdate, Engine};
use crate::cpuset::CpuSet;
use crate::grant::Grant;
use std::sync::Arc;

impl Engine {
    /// Replaces the grant of `id` by `previous` (or drops it when `None`), charging exactly what
    /// `previous` charged. Exclusive CPUs that another container took in the meantime cannot be
    /// given back: the grant then becomes shared on its span (the container keeps running; its
    /// cpuset is corrected by the returned updates). Returns the cpuset updates of other
    /// containers, and of `id` itself when its cpuset has to change.
    pub fn reinstate(&mut self, id: &str, previous: Option<Grant>) -> Vec<CpusetUpdate> {
        let users = self.claim_users.get(id).cloned();
        let mut updates = self.release(id);
        let Some(mut g) = previous else {
            return updates.to_vec();
        };
        if let Some(uids) = users.filter(|_| g.site == crate::types::Site::Claim) {
            self.claim_users.insert(Arc::from(id), uids);
        }
        let before = g.cpus;
        if g.is_exclusive() && g.exclusive.intersects(&self.taken) {
            g.exclusive = CpuSet::new();
        }
        let cpus = if g.off_pools() {
            g.span
        } else if g.is_exclusive() {
            self.set_taken(self.taken.union(&g.exclusive));
            g.exclusive
        } else {
            self.shared_cpus(&g.span)
        };
        g.cpus = g.visible(&self.topo, &cpus);
        let (exclusive, cpus, mems) = (g.exclusive, g.cpus, g.mems);
        self.charge(&g);
        self.put(Arc::from(id), g);
        if !exclusive.is_empty() {
            updates.merge(self.refresh_shared(&exclusive));
        }
        updates.retain(|u| u.container_id != id);
        let mut updates = updates.to_vec();
        if cpus != before && !cpus.is_empty() {
            updates.push(CpusetUpdate {
                container_id: Arc::from(id),
                cpus,
                mems,
            });
        }
        updates.sort_by(|a, b| a.container_id.cmp(&b.container_id));
        updates
    }
}
