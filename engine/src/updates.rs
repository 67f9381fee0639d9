//! The cpuset updates of other containers that a decision hands out. An exclusive create or
//! remove changes the cpuset of every shared container of the spans it meets (a hundred or more
//! on a large machine), nearly all to one of a few cpusets: the list keeps each distinct
//! (cpus, mems) once and, per container, its id and which of them it takes (a 24-byte entry
//! instead of a 280-byte copy), so building it costs little on the container start path.

use crate::cpuset::CpuSet;
use crate::nodeset::NodeSet;
use std::fmt;
use std::sync::Arc;

/// A cpuset change for another container, caused by this decision (exclusive CPUs taken or
/// returned). The runtime layer applies it (NRI update, CRI UpdateContainerResources, docker
/// update).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpusetUpdate {
    /// Shared with the engine's own key: handing out hundreds of updates allocates nothing.
    pub container_id: Arc<str>,
    pub cpus: CpuSet,
    pub mems: Option<NodeSet>,
}

/// Cpuset updates of other containers, in the order they were added.
#[derive(Clone, Default)]
pub struct CpusetUpdates {
    /// Distinct cpusets (consecutive duplicates merged; entries no member names any more may
    /// stay after [`CpusetUpdates::retain`]).
    sets: Vec<Cpusets>,
    /// Each container and the index of its cpusets in `sets`.
    members: Vec<(Arc<str>, u32)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cpusets {
    cpus: CpuSet,
    mems: Option<NodeSet>,
}

/// One update of a [`CpusetUpdates`], borrowed from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpdateRef<'a> {
    pub container_id: &'a str,
    pub cpus: &'a CpuSet,
    pub mems: Option<&'a NodeSet>,
}

impl CpusetUpdates {
    pub fn new() -> CpusetUpdates {
        CpusetUpdates::default()
    }

    /// An empty list with room for `members` updates without regrowth.
    pub fn with_capacity(members: usize) -> CpusetUpdates {
        CpusetUpdates {
            sets: Vec::new(),
            members: Vec::with_capacity(members),
        }
    }

    /// Adds an update (a container already in the list gets a second entry: see
    /// [`CpusetUpdates::merge`] for replacing).
    pub fn push(&mut self, container_id: Arc<str>, cpus: &CpuSet, mems: Option<&NodeSet>) {
        let index = match self.sets.last() {
            Some(last) if last.cpus == *cpus && last.mems.as_ref() == mems => self.sets.len() - 1,
            _ => {
                self.sets.push(Cpusets {
                    cpus: *cpus,
                    mems: mems.copied(),
                });
                self.sets.len() - 1
            }
        };
        // At most one set per update, and the members are a Vec: the index fits u32.
        let index = u32::try_from(index).unwrap_or(u32::MAX);
        self.members.push((container_id, index));
    }

    /// Adds the updates of `later`, each replacing an update of the same container already in
    /// the list (the later one wins).
    pub fn merge(&mut self, later: CpusetUpdates) {
        for (id, set) in later.members {
            self.members.retain(|(x, _)| *x != id);
            if let Some(s) = later.sets.get(set as usize) {
                self.push(id, &s.cpus, s.mems.as_ref());
            }
        }
    }

    /// Keeps the updates `keep` says yes to, in their order.
    pub fn retain(&mut self, mut keep: impl FnMut(UpdateRef<'_>) -> bool) {
        let sets = &self.sets;
        self.members
            .retain(|(id, set)| keep(update_ref(sets, id, *set)));
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    pub fn iter(&self) -> Iter<'_> {
        Iter {
            sets: &self.sets,
            members: self.members.iter(),
        }
    }

    /// The updates as owned values (each with its own copy of the cpuset).
    pub fn to_vec(&self) -> Vec<CpusetUpdate> {
        self.clone().into_iter().collect()
    }
}

fn update_ref<'a>(sets: &'a [Cpusets], id: &'a str, set: u32) -> UpdateRef<'a> {
    // Every member's index was given by `push` and sets are never removed.
    let s = &sets[set as usize];
    UpdateRef {
        container_id: id,
        cpus: &s.cpus,
        mems: s.mems.as_ref(),
    }
}

/// The updates of a [`CpusetUpdates`], borrowed.
pub struct Iter<'a> {
    sets: &'a [Cpusets],
    members: std::slice::Iter<'a, (Arc<str>, u32)>,
}

impl<'a> Iterator for Iter<'a> {
    type Item = UpdateRef<'a>;

    fn next(&mut self) -> Option<UpdateRef<'a>> {
        let (id, set) = self.members.next()?;
        Some(update_ref(self.sets, id, *set))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.members.size_hint()
    }
}

/// The updates of a [`CpusetUpdates`], owned.
pub struct IntoIter {
    sets: Vec<Cpusets>,
    members: std::vec::IntoIter<(Arc<str>, u32)>,
}

impl Iterator for IntoIter {
    type Item = CpusetUpdate;

    fn next(&mut self) -> Option<CpusetUpdate> {
        let (id, set) = self.members.next()?;
        let s = self.sets[set as usize];
        Some(CpusetUpdate {
            container_id: id,
            cpus: s.cpus,
            mems: s.mems,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.members.size_hint()
    }
}

impl IntoIterator for CpusetUpdates {
    type Item = CpusetUpdate;
    type IntoIter = IntoIter;

    fn into_iter(self) -> IntoIter {
        IntoIter {
            sets: self.sets,
            members: self.members.into_iter(),
        }
    }
}

impl<'a> IntoIterator for &'a CpusetUpdates {
    type Item = UpdateRef<'a>;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl FromIterator<CpusetUpdate> for CpusetUpdates {
    fn from_iter<I: IntoIterator<Item = CpusetUpdate>>(iter: I) -> Self {
        let mut out = CpusetUpdates::new();
        for u in iter {
            out.push(u.container_id, &u.cpus, u.mems.as_ref());
        }
        out
    }
}

/// Two lists are equal when they hold the same updates in the same order, however their
/// cpusets are shared.
impl PartialEq for CpusetUpdates {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for CpusetUpdates {}

impl fmt::Debug for CpusetUpdates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(s: &str) -> CpuSet {
        s.parse().expect("cpuset")
    }

    #[test]
    fn one_cpuset_per_run_of_equal_updates_and_later_ones_win() {
        let mut u = CpusetUpdates::new();
        for id in ["a", "b", "c"] {
            u.push(Arc::from(id), &set("0-3"), None);
        }
        u.push(Arc::from("d"), &set("0,2"), None);
        assert_eq!(u.sets.len(), 2);
        let mut later = CpusetUpdates::new();
        later.push(Arc::from("b"), &set("4-7"), None);
        u.merge(later);
        u.retain(|r| r.container_id != "c");
        let got: Vec<(String, String)> = u
            .iter()
            .map(|r| (r.container_id.to_string(), r.cpus.to_string()))
            .collect();
        let want = [("a", "0-3"), ("d", "0,2"), ("b", "4-7")];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        assert_eq!(got, want);
        let owned = u.to_vec();
        assert_eq!(owned.len(), 3);
        assert_eq!(owned[2].cpus, set("4-7"));
        assert_eq!(owned.into_iter().collect::<CpusetUpdates>(), u);
    }
}
