//! What the book keeps of a container's placement inputs (issue 25): the grant record and the
//! cpuset and memory nodes the runtime reported are held apart from the rest of the
//! [`ContainerInfo`], and put back whenever the book hands the inputs out, so every reader
//! sees exactly what was given.
//!
//! In the info, the record was one entry of an annotation map (a table of 4 slots, about 240
//! bytes, for a record of about 100) and the two 1,024-bit sets took 272 bytes inline though a
//! container created through NRI or the proxies carries neither.

use crate::agent::ContainerInfo;
use std::collections::HashMap;
use tap_engine::request::GRANT_KEY;
use tap_engine::{CpuSet, NodeSet};

/// The cpuset and memory nodes the runtime reported for a container.
type Sets = (Option<CpuSet>, Option<NodeSet>);

#[derive(Debug, Clone, Default)]
pub(super) struct Kept {
    /// The inputs without the grant record and without `cpus` and `mems`.
    rest: ContainerInfo,
    /// The annotation [`GRANT_KEY`], if the inputs had it.
    record: Option<Box<str>>,
    /// `cpus` and `mems`, when either is set.
    sets: Option<Box<Sets>>,
}

impl Kept {
    pub(super) fn new(mut info: ContainerInfo) -> Kept {
        let record = info
            .annotations
            .remove(GRANT_KEY)
            .map(String::into_boxed_str);
        if info.annotations.is_empty() {
            // An emptied map keeps its table: dropped for one that has none.
            info.annotations = HashMap::new();
        }
        let sets = match (info.cpus.take(), info.mems.take()) {
            (None, None) => None,
            sets => Some(Box::new(sets)),
        };
        Kept {
            rest: info,
            record,
            sets,
        }
    }

    /// The inputs whole, as they were given (with the record set since, if any).
    pub(super) fn info(&self) -> ContainerInfo {
        let mut info = self.rest.clone();
        if let Some(r) = &self.record {
            info.annotations.insert(GRANT_KEY.into(), r.to_string());
        }
        if let Some(sets) = &self.sets {
            (info.cpus, info.mems) = **sets;
        }
        info
    }

    /// The inputs' ids and names (and the rest without the record and the sets), read in
    /// place.
    pub(super) fn names(&self) -> &ContainerInfo {
        &self.rest
    }

    /// Sets the grant record (the annotation [`GRANT_KEY`]).
    pub(super) fn set_record(&mut self, record: String) {
        self.record = Some(record.into_boxed_str());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ContainerInfo {
        let mut i = ContainerInfo {
            id: "c".into(),
            name: "app".into(),
            cpus: CpuSet::parse("0-3").ok(),
            ..Default::default()
        };
        i.annotations
            .insert(GRANT_KEY.into(), "v1;p=numa-aware".into());
        i.annotations
            .insert("tap.kunpeng.huawei.com/numa-policy".into(), "strict".into());
        i.pod.name = "p".into();
        i
    }

    #[test]
    fn the_inputs_come_back_whole() {
        let i = sample();
        assert_eq!(Kept::new(i.clone()).info(), i);
        let bare = ContainerInfo {
            id: "b".into(),
            ..Default::default()
        };
        let k = Kept::new(bare.clone());
        assert!(k.record.is_none() && k.sets.is_none());
        assert_eq!(k.info(), bare);
        let mems_only = ContainerInfo {
            mems: NodeSet::parse("1").ok(),
            ..Default::default()
        };
        assert_eq!(Kept::new(mems_only.clone()).info(), mems_only);
    }

    #[test]
    fn a_record_set_later_is_in_the_inputs() {
        let mut k = Kept::new(ContainerInfo::default());
        assert_eq!(k.names().annotations.capacity(), 0);
        k.set_record("v1;p=topology-aware".into());
        let info = k.info();
        assert_eq!(
            info.annotations.get(GRANT_KEY).map(String::as_str),
            Some("v1;p=topology-aware")
        );
        let mut k = Kept::new(sample());
        k.set_record("v1;new".into());
        assert_eq!(k.info().annotations.get(GRANT_KEY).unwrap(), "v1;new");
        assert_eq!(k.names().pod.name, "p");
    }
}
