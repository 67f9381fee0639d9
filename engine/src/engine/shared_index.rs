//! Shared grants grouped by span. When exclusive CPUs are taken or given back, only the shared
//! grants whose span meets those CPUs need a new cpuset; with the grants grouped by span, the
//! refresh visits those groups alone (a few dozen spans on the largest machine) instead of
//! scanning every grant, and computes each group's new cpuset once.

use crate::cpuset::CpuSet;
use crate::grants::Slot;
use crate::topology::PoolId;
use std::sync::Arc;

#[derive(Debug, Clone, Default)]
pub(super) struct SharedIndex {
    groups: Vec<Group>,
    /// Groups of each pool (index = [`PoolId`]): a pool's shared grants almost always have one
    /// span (the pool's CPUs), so finding a grant's group is one or two set comparisons.
    by_pool: Vec<Vec<usize>>,
    /// Where each member is (index = its grant's slot), so adding and removing one is constant
    /// time (no ordered set of ids to search and rebalance on the start path).
    at: Vec<Option<Place>>,
}

#[derive(Debug, Clone, Copy)]
struct Place {
    group: usize,
    index: usize,
}

/// A member of a group: its grant's slot (the refresh goes straight to the grant) and its id.
#[derive(Debug, Clone)]
pub(super) struct Member {
    pub slot: Slot,
    pub id: Arc<str>,
}

#[derive(Debug, Clone)]
pub(super) struct Group {
    pub span: CpuSet,
    /// Members in an order fixed by the sequence of adds and removes (a removed member's
    /// place goes to the group's last): the refresh hands out updates in a deterministic
    /// order.
    pub members: Vec<Member>,
}

impl SharedIndex {
    pub fn add(&mut self, slot: Slot, id: &Arc<str>, pool: PoolId, span: &CpuSet) {
        self.remove(slot);
        let g = self.group_of(pool, span).unwrap_or_else(|| {
            if self.by_pool.len() <= pool {
                self.by_pool.resize_with(pool.saturating_add(1), Vec::new);
            }
            self.groups.push(Group {
                span: *span,
                members: Vec::new(),
            });
            let g = self.groups.len() - 1;
            self.by_pool[pool].push(g);
            g
        });
        let members = &mut self.groups[g].members;
        let at = slot as usize;
        if self.at.len() <= at {
            self.at.resize(at.saturating_add(1), None);
        }
        self.at[at] = Some(Place {
            group: g,
            index: members.len(),
        });
        members.push(Member {
            slot,
            id: Arc::clone(id),
        });
    }

    /// Takes the grant in `slot` out of its group (nothing when it is in none).
    pub fn remove(&mut self, slot: Slot) {
        let Some(place) = self.at.get_mut(slot as usize).and_then(Option::take) else {
            return;
        };
        let members = &mut self.groups[place.group].members;
        members.swap_remove(place.index);
        if let Some(moved) = members.get(place.index) {
            if let Some(Some(m)) = self.at.get_mut(moved.slot as usize) {
                m.index = place.index;
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
            .filter(move |g| !g.members.is_empty() && g.span.intersects(changed))
    }

    /// The members of every group as (span, id) pairs, sorted: for comparing two indexes
    /// regardless of the order their groups were made in.
    fn canonical(&self) -> Vec<(CpuSet, &str)> {
        let mut v: Vec<(CpuSet, &str)> = self
            .groups
            .iter()
            .flat_map(|g| g.members.iter().map(move |m| (g.span, &*m.id)))
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
        g.members.iter().map(|m| m.id.to_string()).collect()
    }

    #[test]
    fn members_move_and_leave_in_constant_time_keeping_positions_right() {
        let (a, b): (CpuSet, CpuSet) = ("0-3".parse().unwrap(), "4-7".parse().unwrap());
        let mut ix = SharedIndex::default();
        // Slots 0-3 for x, y, z, w.
        for (slot, id) in ["x", "y", "z", "w"].into_iter().enumerate() {
            ix.add(slot as Slot, &Arc::from(id), 1, &a);
        }
        ix.remove(0); // the last member takes x's place
        assert_eq!(ids(&ix, &a), ["w", "y", "z"]);
        ix.remove(2);
        ix.remove(2); // twice: no effect
        assert_eq!(ids(&ix, &a), ["w", "y"]);
        ix.add(3, &Arc::from("w"), 2, &b); // a member re-added elsewhere leaves its old group
        assert_eq!(ids(&ix, &a), ["y"]);
        assert_eq!(ids(&ix, &b), ["w"]);
        ix.remove(1);
        ix.remove(3);
        assert!(ix.at.iter().all(Option::is_none));
        assert_eq!(
            ix.hit(&"0-7".parse().unwrap()).count(),
            0,
            "empty groups are not hit"
        );
        // Positions stay right through the swaps: every member is where `at` says.
        for i in 0..50u32 {
            ix.add(i, &Arc::from(format!("c{i}").as_str()), 1, &a);
        }
        for i in (0..50u32).step_by(3) {
            ix.remove(i);
        }
        for (slot, place) in ix.at.iter().enumerate() {
            if let Some(p) = place {
                assert_eq!(ix.groups[p.group].members[p.index].slot as usize, slot);
            }
        }
    }
}
