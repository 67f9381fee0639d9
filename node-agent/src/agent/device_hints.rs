//! What became of a container's device hint (the devices the kubelet allocated, with the NUMA
//! nodes their device plugin or DRA ResourceSlice named): a Warning Event on the Pod when the
//! hint could not be read or could not be honoured. Either way the container is placed, without
//! the hint (fail open).

use super::{Agent, ContainerInfo};
use crate::hook::Hook;
use crate::metrics::ErrorKind;
use crate::notes::Kind;
use crate::pod_resources::{KubeletDevice, PodResourcesError};
use tap_engine::{CpuSet, Topology};

impl Agent {
    /// The kubelet's devices of `c` could not be read (its pod-resources API failed or was
    /// late): logged, counted (`pod_resources`) and said to the Pod as a
    /// `TopologyDeviceHintUnavailable` Warning. A host without the socket is not a failure.
    pub(crate) fn device_hint_unavailable(&self, c: &ContainerInfo, e: &PodResourcesError) {
        if !e.is_failure() {
            return;
        }
        tracing::warn!(container = %c.id, pod = %c.pod.name, namespace = %c.pod.namespace, "no device hints from the kubelet: {e}");
        self.metrics
            .count_error(Hook::Create, ErrorKind::PodResources);
        let msg = format!(
            "no device hint from the kubelet ({e}): placed without the devices' NUMA nodes"
        );
        self.note(Hook::Create, c, Kind::DeviceHintUnavailable, msg);
    }

    /// After a create placed `c` on `cpus`: a `TopologyDeviceHintNotHonoured` Warning (and
    /// `device_hint` counted) when the placement is on none of its devices' NUMA nodes, or a
    /// device names a node this machine does not have.
    pub(super) fn check_device_hint(&self, c: &ContainerInfo, cpus: &CpuSet) {
        let Some(why) = unhonoured(&self.topo, &c.kubelet_devices, cpus) else {
            return;
        };
        tracing::warn!(container = %c.id, name = %c.name, pod = %c.pod.name, "{why}");
        self.metrics
            .count_error(Hook::Create, ErrorKind::DeviceHint);
        self.note(Hook::Create, c, Kind::DeviceHintNotHonoured, why);
    }
}

/// Why the devices' hint is not honoured by a placement on `cpus`, naming the devices; `None`
/// when it is (or when no device carries a NUMA node: then there is no hint).
pub(crate) fn unhonoured(
    topo: &Topology,
    devices: &[KubeletDevice],
    cpus: &CpuSet,
) -> Option<String> {
    let on_machine = |d: &KubeletDevice| d.numa_nodes.iter().any(|n| topo.node(*n).is_some());
    let mut parts = Vec::new();
    let known: Vec<&KubeletDevice> = devices.iter().filter(|d| on_machine(d)).collect();
    if !known.is_empty() {
        let on = topo.nodes_of(cpus);
        let near = known
            .iter()
            .flat_map(|d| d.numa_nodes.iter())
            .any(|n| on.contains(*n as usize));
        if !near {
            parts.push(format!(
                "{}: placed on NUMA {on}, as the devices' NUMA nodes could not hold the container",
                names(&known)
            ));
        }
    }
    let strangers: Vec<&KubeletDevice> = devices
        .iter()
        .filter(|d| !d.numa_nodes.is_empty() && !on_machine(d))
        .collect();
    if !strangers.is_empty() {
        parts.push(format!(
            "{}: not a NUMA node of this machine",
            names(&strangers)
        ));
    }
    (!parts.is_empty()).then(|| format!("device hint not honoured: {}", parts.join("; ")))
}

/// `example.com/accel accel-1 (NUMA 1), ...`
fn names(devices: &[&KubeletDevice]) -> String {
    let parts: Vec<String> = devices.iter().map(|d| d.to_string()).collect();
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accel(id: &str, nodes: &[u32]) -> KubeletDevice {
        KubeletDevice {
            resource: "example.com/accel".into(),
            id: id.into(),
            numa_nodes: nodes.to_vec(),
            claim: None,
        }
    }

    #[test]
    fn a_hint_is_honoured_when_the_placement_meets_any_device_node() {
        let raw = tap_engine::testdata::discover_fixture("synthetic-2s-4numa-96c-gpu").unwrap();
        let topo = Topology::build(&raw).unwrap();
        let cpus = |s: &str| CpuSet::parse(s).unwrap();
        let on_1_and_3 = [accel("a", &[1]), accel("b", &[3])];
        assert_eq!(unhonoured(&topo, &on_1_and_3, &cpus("72-95")), None);
        assert_eq!(unhonoured(&topo, &[accel("a", &[])], &cpus("0-23")), None);
        assert_eq!(unhonoured(&topo, &[], &cpus("0-23")), None);
        let why = unhonoured(&topo, &on_1_and_3, &cpus("0-23")).unwrap();
        assert_eq!(
            why,
            "device hint not honoured: example.com/accel a (NUMA 1), example.com/accel b \
             (NUMA 3): placed on NUMA 0, as the devices' NUMA nodes could not hold the container"
        );
        let why = unhonoured(&topo, &[accel("a", &[0]), accel("z", &[9])], &cpus("0-23"));
        assert_eq!(
            why.as_deref(),
            Some("device hint not honoured: example.com/accel z (NUMA 9): not a NUMA node of this machine")
        );
    }
}
