//! Translation between NRI messages and the hook layer's types.

use super::proto::{
    Container, ContainerAdjustment, ContainerUpdate, Event, LinuxCPU, LinuxContainerAdjustment,
    LinuxContainerUpdate, LinuxResources, PodSandbox,
};
use crate::agent::{runtime_cpus, runtime_nodes, Adjustment, ContainerInfo, PodInfo, Update};
use std::collections::HashMap;
use tap_engine::request::GRANT_KEY;
use tap_engine::{CpuSet, NodeSet};

/// The events kunpeng-tap subscribes to. Only events up to REMOVE_CONTAINER (11): a bit outside
/// the runtime's valid mask (0x7FF up to NRI v0.9) fails the registration.
pub const SUBSCRIBED_EVENTS: [Event; 6] = [
    Event::CREATE_CONTAINER,
    // Sent when containerd started the container: confirms a create (see `NriPlugin`).
    Event::POST_START_CONTAINER,
    Event::UPDATE_CONTAINER,
    // Sent only when containerd applied an update: confirms a resize (see `NriPlugin`).
    Event::POST_UPDATE_CONTAINER,
    Event::STOP_CONTAINER,
    Event::REMOVE_CONTAINER,
];

/// The valid event mask of NRI <= v0.9 (containerd 1.7 speaks v0.3 .. v0.8).
pub const VALID_EVENTS_V0_9: i32 = 0x7FF;

/// Event `e` is bit `e - 1`.
pub fn event_bit(e: Event) -> i32 {
    let v = e as i32;
    if v <= 0 {
        0
    } else {
        1 << (v - 1)
    }
}

/// The `events` mask of our ConfigureResponse.
pub fn event_mask(events: &[Event]) -> i32 {
    events.iter().fold(0, |m, e| m | event_bit(*e))
}

fn to_map(m: &HashMap<String, String>) -> HashMap<String, String> {
    m.clone()
}

/// The Pod as the hook layer sees it.
pub fn pod_info(pod: &PodSandbox) -> PodInfo {
    let cgroup_parent = pod
        .linux
        .as_ref()
        .map(|l| l.cgroup_parent.clone())
        .filter(|p| !p.is_empty());
    PodInfo {
        uid: pod.uid.clone(),
        name: pod.name.clone(),
        namespace: pod.namespace.clone(),
        labels: to_map(&pod.labels),
        annotations: to_map(&pod.annotations),
        cgroup_parent,
    }
}

/// Copies CPU and memory figures from NRI resources into `info` (only those that are set).
pub fn apply_resources(info: &mut ContainerInfo, r: &LinuxResources) {
    if let Some(cpu) = r.cpu.as_ref() {
        if let Some(s) = cpu.shares.as_ref() {
            info.cpu_shares = Some(s.value);
        }
        if let Some(q) = cpu.quota.as_ref() {
            info.cpu_quota = (q.value > 0).then_some(q.value);
        }
        if let Some(p) = cpu.period.as_ref() {
            info.cpu_period = (p.value > 0).then_some(p.value);
        }
        if let Some(c) = runtime_cpus(&info.id, &cpu.cpus) {
            info.cpus = Some(c);
        }
        if let Some(m) = runtime_nodes(&info.id, &cpu.mems) {
            info.mems = Some(m);
        }
    }
    if let Some(l) = r.memory.as_ref().and_then(|m| m.limit.as_ref()) {
        info.memory_limit = (l.value > 0).then_some(l.value);
    }
    let hugepages = r.hugepage_limits.iter();
    info.set_runtime_hugepage_limits(hugepages.map(|h| (h.page_size.as_str(), h.limit)));
}

/// A container and its Pod as the hook layer sees them.
pub fn container_info(pod: Option<&PodSandbox>, c: &Container) -> ContainerInfo {
    let mut info = ContainerInfo {
        id: c.id.clone(),
        name: c.name.clone(),
        pod: pod.map(pod_info).unwrap_or_default(),
        env: c.env.clone(),
        annotations: to_map(&c.annotations),
        ..ContainerInfo::default()
    };
    if let Some(r) = c.linux.as_ref().and_then(|l| l.resources.as_ref()) {
        apply_resources(&mut info, r);
    }
    info
}

fn cpu_resources(cpus: &CpuSet, mems: Option<&NodeSet>) -> LinuxResources {
    let mut cpu = LinuxCPU::new();
    cpu.cpus = cpus.to_string();
    if let Some(m) = mems {
        cpu.mems = m.to_string();
    }
    let mut r = LinuxResources::new();
    r.cpu = Some(cpu).into();
    r
}

/// The ContainerAdjustment for a create: cpuset (and mems) plus the grant record annotation.
/// `None` when the container is left as it is.
pub fn adjustment(adj: &Adjustment) -> Option<ContainerAdjustment> {
    let cpus = adj.cpus.as_ref()?;
    let mut linux = LinuxContainerAdjustment::new();
    linux.resources = Some(cpu_resources(cpus, adj.mems.as_ref())).into();
    let mut out = ContainerAdjustment::new();
    out.linux = Some(linux).into();
    if let Some(rec) = &adj.record {
        out.annotations.insert(GRANT_KEY.to_string(), rec.clone());
    }
    Some(out)
}

/// A cpuset update for another container. Failures are ignored by the runtime (the container
/// may be gone), so an update never fails the event it rides on.
pub fn container_update(u: &Update) -> ContainerUpdate {
    let mut linux = LinuxContainerUpdate::new();
    linux.resources = Some(cpu_resources(&u.cpus, u.mems.as_ref())).into();
    let mut out = ContainerUpdate::new();
    out.container_id = u.container_id.clone();
    out.linux = Some(linux).into();
    // A failure is reported (an unsolicited update's `failed`, a resize's missing
    // PostUpdateContainer), so the convergence loop knows and tries again.
    out.ignore_failure = false;
    out
}

/// An update of another container riding on the answer to one of containerd's requests: a
/// failure there would fail that request (a create), so it is ignored; the container was
/// live a moment ago, and containerd applies the update as it handles the request.
pub fn neighbour_update(u: &Update) -> ContainerUpdate {
    let mut out = container_update(u);
    out.ignore_failure = true;
    out
}

pub fn container_updates(ups: &[Update]) -> Vec<ContainerUpdate> {
    ups.iter().map(container_update).collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::proto::{LinuxContainer, LinuxMemory, LinuxPodSandbox, OptionalInt64};
    use super::super::proto::{OptionalUInt64, SynchronizeRequest};
    use super::*;
    use crate::agent::test_sets::*;
    use crate::agent::HugepageLimit;
    use protobuf::Message;

    /// The Pod `default/web` (uid `uid-1`, sandbox `sb1`), labelled to be skipped, asking for
    /// the NUMA level.
    pub(crate) fn pod() -> PodSandbox {
        let mut p = PodSandbox::new();
        p.id = "sb1".into();
        p.name = "web".into();
        p.uid = "uid-1".into();
        p.namespace = "default".into();
        p.labels
            .insert("tap.kunpeng.huawei.com/skip".into(), "x".into());
        p.annotations
            .insert("tap.kunpeng.huawei.com/level".into(), "numa".into());
        let mut l = LinuxPodSandbox::new();
        l.cgroup_parent = "/kubepods/burstable/poduid-1".into();
        p.linux = Some(l).into();
        p
    }

    fn container(shares: u64, quota: i64, period: u64) -> Container {
        let mut cpu = LinuxCPU::new();
        let mut s = OptionalUInt64::new();
        s.value = shares;
        cpu.shares = Some(s).into();
        let mut q = OptionalInt64::new();
        q.value = quota;
        cpu.quota = Some(q).into();
        let mut pe = OptionalUInt64::new();
        pe.value = period;
        cpu.period = Some(pe).into();
        cpu.cpus = "0-3".into();
        let mut mem = LinuxMemory::new();
        let mut lim = OptionalInt64::new();
        lim.value = 1 << 30;
        mem.limit = Some(lim).into();
        let mut r = LinuxResources::new();
        r.cpu = Some(cpu).into();
        r.memory = Some(mem).into();
        // The kubelet sets every size, the ones not asked for at zero.
        for (size, limit) in [("2MB", 64u64 << 20), ("1GB", 0)] {
            let mut h = super::super::proto::HugepageLimit::new();
            h.page_size = size.into();
            h.limit = limit;
            r.hugepage_limits.push(h);
        }
        let mut lc = LinuxContainer::new();
        lc.resources = Some(r).into();
        let mut c = Container::new();
        c.id = "c1".into();
        c.pod_sandbox_id = "sb1".into();
        c.name = "app".into();
        c.env = vec!["VA_VISIBLE_DEVICES=0".into()];
        c.annotations.insert(GRANT_KEY.into(), "rec".into());
        c.linux = Some(lc).into();
        c
    }

    #[test]
    fn event_mask_stays_inside_the_v0_6_valid_mask() {
        let m = event_mask(&SUBSCRIBED_EVENTS);
        assert_eq!(m, 0x8 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400);
        assert_eq!(m & !VALID_EVENTS_V0_9, 0);
        assert_eq!(event_bit(Event::RUN_POD_SANDBOX), 1);
        assert_eq!(event_bit(Event::REMOVE_CONTAINER), 0x400);
        assert_eq!(event_bit(Event::UNKNOWN), 0);
    }

    #[test]
    fn container_info_reads_pod_and_resources() {
        let info = container_info(Some(&pod()), &container(4096, 800_000, 100_000));
        assert_eq!(info.id, "c1");
        assert_eq!(info.name, "app");
        assert_eq!(info.pod.uid, "uid-1");
        assert_eq!(info.pod.name, "web");
        assert_eq!(info.pod.namespace, "default");
        assert_eq!(
            info.pod.cgroup_parent.as_deref(),
            Some("/kubepods/burstable/poduid-1")
        );
        assert!(info.pod.labels.contains_key("tap.kunpeng.huawei.com/skip"));
        assert_fixture_resources(&info);
        assert_eq!(
            info.hugepage_limits,
            [HugepageLimit {
                size_kb: 2048,
                bytes: 64 << 20
            }]
        );
        assert_eq!(shown(info.cpus).as_deref(), Some("0-3"));
        assert_eq!(info.env, vec!["VA_VISIBLE_DEVICES=0".to_string()]);
        assert_eq!(
            info.annotations.get(GRANT_KEY).map(String::as_str),
            Some("rec")
        );
    }

    #[test]
    fn no_quota_means_no_limit_and_missing_parts_are_tolerated() {
        let info = container_info(Some(&pod()), &container(2, -1, 100_000));
        assert_eq!(info.cpu_quota, None);
        assert_eq!(info.cpu_shares, Some(2));
        // No pod, no linux section: still a valid, empty request.
        let mut c = Container::new();
        c.id = "x".into();
        let info = container_info(None, &c);
        assert_eq!(info.id, "x");
        assert_eq!(info.cpu_shares, None);
        assert_eq!(info.pod, PodInfo::default());
    }

    #[test]
    fn adjustment_carries_cpus_mems_and_the_grant_record() {
        assert!(adjustment(&Adjustment::default()).is_none());
        let a = placed("0-23", "0", "r1");
        let out = adjustment(&a).unwrap();
        let cpu = out.linux.resources.cpu.clone().unwrap();
        assert_eq!(cpu.cpus, "0-23");
        assert_eq!(cpu.mems, "0");
        assert!(cpu.shares.is_none() && cpu.quota.is_none());
        assert!(out.linux.resources.memory.is_none());
        assert_eq!(
            out.annotations.get(GRANT_KEY).map(String::as_str),
            Some("r1")
        );
        let u = container_update(&Update {
            container_id: "o".into(),
            cpus: cpu_set("24-47"),
            mems: None,
        });
        assert_eq!(u.container_id, "o");
        assert!(!u.ignore_failure);
        assert_eq!(u.linux.resources.cpu.cpus, "24-47");
        assert_eq!(u.linux.resources.cpu.mems, "");
    }

    /// The field numbers on the wire are the runtime's (NRI-NOTES §7): hand-encode a few.
    #[test]
    fn wire_field_numbers_match_the_runtime() {
        // LinuxCPU.cpus = 6 (tag 0x32), mems = 7 (0x3a).
        let mut cpu = LinuxCPU::new();
        cpu.cpus = "1".into();
        cpu.mems = "0".into();
        assert_eq!(
            cpu.write_to_bytes().unwrap(),
            vec![0x32, 1, b'1', 0x3a, 1, b'0']
        );
        // ContainerAdjustment.linux = 6 (0x32) > LinuxContainerAdjustment.resources = 2 (0x12)
        // > LinuxResources.cpu = 2 (0x12).
        let a = adjustment(&Adjustment {
            cpus: Some(cpu_set("1")),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            a.write_to_bytes().unwrap(),
            vec![0x32, 7, 0x12, 5, 0x12, 3, 0x32, 1, b'1']
        );
        // SynchronizeRequest.containers = 2 with Container.id = 1, unknown fields skipped.
        let raw = [0x12, 6, 0x0a, 1, b'c', 0xa8, 0x01, 5];
        let req = SynchronizeRequest::parse_from_bytes(&raw).unwrap();
        assert_eq!(req.containers.len(), 1);
        assert_eq!(req.containers[0].id, "c");
    }
}
