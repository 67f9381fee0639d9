//! Shared grants grouped by span. When exclusive CPUs are taken or given back, only the shared
//! grants whose span meets those CPUs need a new cpuset; with the grants grouped by span, the
//! refresh visits those groups alone (a few dozen spans on the largest machine) instead of
//! scanning every grant, and computes each group's new cpuset once.

use crate::cpuset::CpuSet;
use crate::topology::PoolId;
use crate::types::IdHasher;
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Debug, Clone, Default)]
pub(super) struct SharedIndex {
    groups: Vec<Group>,
    /// Groups of each pool (index = [`PoolId`]): a pool's shared grants almost always have one
    /// span (the pool's CPUs), so finding a grant's group is one or two set comparisons.
    by_pool: Vec<Vec<usize>>,
    /// Where each member is, so adding and removing one is constant time (no ordered set of
    /// ids to search and rebalance on the start path).
    at: HashMap<Arc<str>, Slot, IdHasher>,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    group: usize,
    index: usize,
}

#[derive(Debug, Clone)]
pub(super) struct Group {
    pub span: CpuSet,
    /// Members in an order fixed by the sequence of adds and removes (a removed member's
    /// place goes to the group's last): the refresh hands out updates in a deterministic
    /// order.
    pub ids: Vec<Arc<str>>,
}

impl SharedIndex {
    pub fn add(&mut self, id: &Arc<str>, pool: PoolId, span: &CpuSet) {
        self.remove(id);
        let g = self.group_of(pool, span).unwrap_or_else(|| {
            if self.by_pool.len() <= pool {
                self.by_pool.resize_with(pool.saturating_add(1), Vec::new);
            }
            self.groups.push(Group {
                span: *span,
                ids: Vec::new(),
            });
            let g = self.groups.len() - 1;
            self.by_pool[pool].push(g);
            g
        });
        let ids = &mut self.groups[g].ids;
        self.at.insert(
            Arc::clone(id),
            Slot {
                group: g,
                index: ids.len(),
            },
        );
        ids.push(Arc::clone(id));
    }

    pub fn remove(&mut self, id: &str) {
        let Some(slot) = self.at.remove(id) else {
            return;
        };
        let ids = &mut self.groups[slot.group].ids;
        ids.swap_remove(slot.index);
        if let Some(moved) = ids.get(slot.index) {
            if let Some(m) = self.at.get_mut(&**moved) {
                m.index = slot.index;
            }
        }
    }

    fn group_of(&self, pool: PoolId, span: &CpuSet) -> Option<usize> {
        self.by_pool
            .get(pool)?
            .iter()
            .copied()
            .find(|&g| self.groups[g].span == *span)
    }

    /// Groups whose span meets `changed` and that have members.
    pub fn hit<'a>(&'a self, changed: &'a CpuSet) -> impl Iterator<Item = &'a Group> + 'a {
        self.groups
            .iter()
            .filter(move |g| !g.ids.is_empty() && g.span.intersects(changed))
    }

    /// The members of every group as (span, id) pairs, sorted: for comparing two indexes
    /// regardless of the order their groups were made in.
    fn canonical(&self) -> Vec<(CpuSet, &str)> {
        let mut v: Vec<(CpuSet, &str)> = self
            .groups
            .iter()
            .flat_map(|g| g.ids.iter().map(move |id| (g.span, &**id)))
            .collect();
        v.sort_unstable_by(|a, b| a.1.cmp(b.1));
        v
    }
}

/// Two indexes are equal when they group the same ids under the same spans.
impl PartialEq for SharedIndex {
    fn eq(&self, other: &Self) -> bool {
        self.canonical() == other.canonical()
    }
}

impl Eq for SharedIndex {}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(ix: &SharedIndex, span: &CpuSet) -> Vec<String> {
        let g = ix.groups.iter().find(|g| g.span == *span).expect("group");
        g.ids.iter().map(|i| i.to_string()).collect()
    }

    #[test]
    fn members_move_and_leave_in_constant_time_keeping_positions_right() {
        let (a, b): (CpuSet, CpuSet) = ("0-3".parse().unwrap(), "4-7".parse().unwrap());
        let mut ix = SharedIndex::default();
        for id in ["x", "y", "z", "w"] {
            ix.add(&Arc::from(id), 1, &a);
        }
        ix.remove("x"); // the last member takes its place
        assert_eq!(ids(&ix, &a), ["w", "y", "z"]);
        ix.remove("z");
        ix.remove("z"); // twice: no effect
        assert_eq!(ids(&ix, &a), ["w", "y"]);
        ix.add(&Arc::from("w"), 2, &b); // a member re-added elsewhere leaves its old group
        assert_eq!(ids(&ix, &a), ["y"]);
        assert_eq!(ids(&ix, &b), ["w"]);
        ix.remove("y");
        ix.remove("w");
        assert!(ix.at.is_empty());
        assert_eq!(
            ix.hit(&"0-7".parse().unwrap()).count(),
            0,
            "empty groups are not hit"
        );
        // Positions stay right through the swaps: every member is where `at` says.
        for i in 0..50 {
            ix.add(&Arc::from(format!("c{i}").as_str()), 1, &a);
        }
        for i in (0..50).step_by(3) {
            ix.remove(&format!("c{i}"));
        }
        for (id, slot) in &ix.at {
            assert_eq!(&ix.groups[slot.group].ids[slot.index], id);
        }
    }
}
