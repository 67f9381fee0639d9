//! Shared grants grouped by span. When exclusive CPUs are taken or given back, only the shared
//! grants whose span meets those CPUs need a new cpuset; with the grants grouped by span, the
//! refresh visits those groups alone (a few dozen spans on the largest machine) instead of
//! scanning every grant, and computes each group's new cpuset once.

use crate::cpuset::CpuSet;
use crate::topology::PoolId;
use std::collections::BTreeSet;
use std::sync::Arc;

#[derive(Debug, Clone, Default)]
pub(super) struct SharedIndex {
    groups: Vec<Group>,
    /// Groups of each pool (index = [`PoolId`]): a pool's shared grants almost always have one
    /// span (the pool's CPUs), so finding a grant's group is one or two set comparisons.
    by_pool: Vec<Vec<usize>>,
}

#[derive(Debug, Clone)]
pub(super) struct Group {
    pub span: CpuSet,
    /// Ids in order: the refresh hands out updates in a deterministic order.
    pub ids: BTreeSet<Arc<str>>,
}

impl SharedIndex {
    pub fn add(&mut self, id: &Arc<str>, pool: PoolId, span: &CpuSet) {
        let g = self.group_of(pool, span).unwrap_or_else(|| {
            if self.by_pool.len() <= pool {
                self.by_pool.resize_with(pool.saturating_add(1), Vec::new);
            }
            self.groups.push(Group {
                span: *span,
                ids: BTreeSet::new(),
            });
            let g = self.groups.len() - 1;
            self.by_pool[pool].push(g);
            g
        });
        self.groups[g].ids.insert(Arc::clone(id));
    }

    pub fn remove(&mut self, id: &str, pool: PoolId, span: &CpuSet) {
        if let Some(g) = self.group_of(pool, span) {
            self.groups[g].ids.remove(id);
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
