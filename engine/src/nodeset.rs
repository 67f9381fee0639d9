//! A set of NUMA node ids: its own type so that node ids and CPU ids cannot be mixed up.
//!
//! The bit set of [`CpuSet`](crate::CpuSet) with the same kernel list syntax (`0-3,5`), but
//! [`MAX_NODES`] bits instead of 1,024: a grant holds two node sets and the agent keeps one per
//! container, and no server has a NUMA node id near 128 (the kernel numbers nodes densely from
//! 0). Every operation is the bit set's own, inlined.

use crate::cpuset::{IdSet, ParseError};
use std::fmt;
use std::str::FromStr;

/// Largest NUMA node id + 1 that a [`NodeSet`] holds; a sysfs node id at or above it is
/// reported as an error, never truncated.
pub const MAX_NODES: usize = 128;

#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct NodeSet(IdSet<{ MAX_NODES / 64 }>);

impl NodeSet {
    #[inline]
    pub const fn new() -> Self {
        NodeSet(IdSet::new())
    }

    /// Inserts `id`. Returns false (and leaves the set unchanged) when `id` is too large.
    #[inline]
    pub fn insert(&mut self, id: usize) -> bool {
        self.0.insert(id)
    }

    #[inline]
    pub fn contains(&self, id: usize) -> bool {
        self.0.contains(id)
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The id of a one-node set (`None` for none or several).
    #[inline]
    pub fn single(&self) -> Option<usize> {
        self.0.single()
    }

    #[inline]
    pub fn union(&self, other: &NodeSet) -> NodeSet {
        NodeSet(self.0.union(&other.0))
    }

    #[inline]
    pub fn is_subset(&self, other: &NodeSet) -> bool {
        self.0.is_subset(&other.0)
    }

    #[inline]
    pub fn intersects(&self, other: &NodeSet) -> bool {
        self.0.intersects(&other.0)
    }

    /// Ids in ascending order.
    #[inline]
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter()
    }

    /// Parses the kernel list syntax (`0-1,3`); the empty string is the empty set.
    pub fn parse(input: &str) -> Result<NodeSet, ParseError> {
        IdSet::parse(input).map(NodeSet)
    }

    pub fn from_ids<I: IntoIterator<Item = usize>>(ids: I) -> NodeSet {
        NodeSet(IdSet::from_ids(ids))
    }
}

impl FromStr for NodeSet {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        NodeSet::parse(s)
    }
}

impl fmt::Display for NodeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for NodeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeSet({})", self.0)
    }
}

impl serde::Serialize for NodeSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for NodeSet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        IdSet::deserialize(d).map(NodeSet)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_syntax_round_trips() {
        for s in ["", "0", "0-3", "0-3,5", "1,3,127"] {
            assert_eq!(NodeSet::parse(s).unwrap().to_string(), s);
        }
        assert!(NodeSet::parse("1-x").is_err());
        assert!(NodeSet::parse("128").is_err());
        assert!(NodeSet::parse("0-1023").is_err());
        assert_eq!(
            format!("{:?}", NodeSet::parse("0-1").unwrap()),
            "NodeSet(0-1)"
        );
    }

    #[test]
    fn set_operations() {
        let a = NodeSet::parse("0-1").unwrap();
        let b = NodeSet::from_ids([1, 3]);
        assert_eq!(a.union(&b).to_string(), "0-1,3");
        assert!(NodeSet::from_ids([1]).is_subset(&a));
        assert!(!b.is_subset(&a));
        assert!(a.intersects(&b) && !NodeSet::from_ids([3]).intersects(&a));
        assert!(b.contains(3) && !b.contains(2));
        assert_eq!(b.iter().collect::<Vec<_>>(), vec![1, 3]);
        assert_eq!((b.len(), NodeSet::new().is_empty()), (2, true));
        let mut c = NodeSet::new();
        assert!(c.insert(7) && c.insert(127) && !c.insert(128) && !c.insert(5000));
        assert_eq!(c, NodeSet::from_ids([7, 127]));
        assert_eq!(std::mem::size_of::<NodeSet>(), MAX_NODES / 8);
    }

    #[test]
    fn serde_is_the_list_string() {
        let s = NodeSet::parse("0,2-3").unwrap();
        let j = serde_json::to_string(&s).unwrap();
        assert_eq!(j, "\"0,2-3\"");
        assert_eq!(serde_json::from_str::<NodeSet>(&j).unwrap(), s);
    }
}
