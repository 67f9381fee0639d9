//! What the book keeps of a container's placement inputs: the fields of its
//! [`ContainerInfo`], but the id is the book's key itself (one allocation), the grant record
//! is held out of the annotations and the cpuset and memory nodes the runtime reported are
//! boxed; [`Kept::info`] puts them back whenever the book hands the inputs out, so every
//! reader sees exactly what was given.
//!
//! In a `ContainerInfo` the record was one entry of an annotation map (a table of 4 slots,
//! about 240 bytes, for a record of about 100) and the two 1,024-bit sets took 272 bytes
//! inline though a container created through NRI or the proxies carries neither.

use crate::agent::{ContainerInfo, HugepageLimit, PodInfo};
use crate::pod_resources::KubeletDevice;
use std::collections::HashMap;
use std::sync::Arc;
use tap_engine::request::GRANT_KEY;
use tap_engine::{CpuSet, NodeSet, Qos};

/// The cpuset and memory nodes the runtime reported for a container.
type Sets = (Option<CpuSet>, Option<NodeSet>);

/// A [`ContainerInfo`]'s fields, but the id shared with the book's key, the record out of the
/// annotations and the two sets boxed (absent when neither is set).
#[derive(Debug, Clone)]
pub(super) struct Kept {
    /// The container id: the book's key itself when they are equal (always, in the book).
    id: Arc<str>,
    name: String,
    pod: PodInfo,
    qos: Option<Qos>,
    cpu_shares: Option<u64>,
    cpu_quota: Option<i64>,
    cpu_period: Option<u64>,
    memory_limit: Option<i64>,
    env: Vec<String>,
    /// The annotations but the grant record.
    annotations: HashMap<String, String>,
    kubelet_devices: Vec<KubeletDevice>,
    hugepage_limits: Vec<HugepageLimit>,
    /// The annotation [`GRANT_KEY`], if the inputs had it.
    record: Option<Box<str>>,
    /// `cpus` and `mems`, when either is set.
    sets: Option<Box<Sets>>,
}

impl Kept {
    /// Keeps `info`, naming its id with `key`'s allocation when they are equal.
    pub(super) fn new(info: ContainerInfo, key: &Arc<str>) -> Kept {
        let ContainerInfo {
            id,
            name,
            pod,
            qos,
            cpu_shares,
            cpu_quota,
            cpu_period,
            memory_limit,
            env,
            mut annotations,
            cpus,
            mems,
            kubelet_devices,
            hugepage_limits,
        } = info;
        let record = annotations.remove(GRANT_KEY).map(String::into_boxed_str);
        if annotations.is_empty() {
            // An emptied map keeps its table: dropped for one that has none.
            annotations = HashMap::new();
        }
        Kept {
            id: if *id == **key {
                Arc::clone(key)
            } else {
                Arc::from(id)
            },
            name,
            pod,
            qos,
            cpu_shares,
            cpu_quota,
            cpu_period,
            memory_limit,
            env,
            annotations,
            kubelet_devices,
            hugepage_limits,
            record,
            sets: (cpus.is_some() || mems.is_some()).then(|| Box::new((cpus, mems))),
        }
    }

    /// Keeps `info` instead, sharing the id this one has.
    pub(super) fn replace(&mut self, info: ContainerInfo) {
        let id = Arc::clone(&self.id);
        *self = Kept::new(info, &id);
    }

    /// The inputs whole, as they were given (with the record set since, if any).
    pub(super) fn info(&self) -> ContainerInfo {
        let mut annotations = self.annotations.clone();
        if let Some(r) = &self.record {
            annotations.insert(GRANT_KEY.into(), r.to_string());
        }
        let (cpus, mems) = self.sets.as_deref().copied().unwrap_or_default();
        ContainerInfo {
            id: self.id.to_string(),
            name: self.name.clone(),
            pod: self.pod.clone(),
            qos: self.qos,
            cpu_shares: self.cpu_shares,
            cpu_quota: self.cpu_quota,
            cpu_period: self.cpu_period,
            memory_limit: self.memory_limit,
            env: self.env.clone(),
            annotations,
            cpus,
            mems,
            kubelet_devices: self.kubelet_devices.clone(),
            hugepage_limits: self.hugepage_limits.clone(),
        }
    }

    pub(super) fn pod(&self) -> &PodInfo {
        &self.pod
    }

    pub(super) fn name(&self) -> &str {
        &self.name
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
        assert_eq!(Kept::new(i.clone(), &"c".into()).info(), i);
        let bare = ContainerInfo {
            id: "b".into(),
            ..Default::default()
        };
        let k = Kept::new(bare.clone(), &"b".into());
        assert!(k.record.is_none() && k.sets.is_none());
        assert_eq!(k.info(), bare);
        let mems_only = ContainerInfo {
            mems: NodeSet::parse("1").ok(),
            ..Default::default()
        };
        assert_eq!(Kept::new(mems_only.clone(), &"m".into()).info(), mems_only);
    }

    #[test]
    fn a_record_set_later_is_in_the_inputs() {
        let mut k = Kept::new(ContainerInfo::default(), &"".into());
        assert_eq!(k.annotations.capacity(), 0);
        k.set_record("v1;p=topology-aware".into());
        let info = k.info();
        assert_eq!(
            info.annotations.get(GRANT_KEY).map(String::as_str),
            Some("v1;p=topology-aware")
        );
        let mut k = Kept::new(sample(), &"c".into());
        k.set_record("v1;new".into());
        assert_eq!(k.info().annotations.get(GRANT_KEY).unwrap(), "v1;new");
        assert_eq!(k.pod().name, "p");
        assert_eq!(k.name(), "app");
    }

    #[test]
    fn the_id_is_the_key_itself() {
        let key: Arc<str> = "c".into();
        let mut k = Kept::new(sample(), &key);
        assert!(Arc::ptr_eq(&k.id, &key));
        k.replace(sample());
        assert!(Arc::ptr_eq(&k.id, &key));
        // An id that is not the key (not the book's case) is kept as it is.
        let other = Kept::new(sample(), &"k".into());
        assert_eq!(other.info().id, "c");
    }
}
