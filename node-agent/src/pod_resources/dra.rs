//! The NUMA nodes of this node's DRA devices (Dynamic Resource Allocation): the kubelet's
//! pod-resources API names a container's claimed devices by driver, pool and device, and only
//! their drivers' ResourceSlices say where they are (the standard attribute
//! `resource.kubernetes.io/numaNode`). The kube link keeps the slices of this node here; a
//! create reads them when it looks up the container's devices.

use std::collections::HashMap;
use std::sync::RwLock;

/// The attribute DRA drivers publish a device's NUMA node under.
pub const NUMA_NODE_ATTRIBUTE: &str = "resource.kubernetes.io/numaNode";

/// The attribute DRA drivers publish a device's PCIe root complex under (`pci0000:3a`): where a
/// device has no NUMA node attribute, the root's NUMA node (from sysfs) is taken.
pub const PCIE_ROOT_ATTRIBUTE: &str = "resource.kubernetes.io/pcieRoot";

/// The NUMA node of each PCIe root complex of this machine, read from sysfs: a root
/// `devices/pci<domain>:<bus>` holds the functions below it, and the first of them with a
/// `numa_node` of 0 or more gives the root's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PcieRoots(HashMap<String, u32>);

impl PcieRoots {
    /// The roots under `sys` (a sysfs root); none where sysfs shows none (a fixture dump).
    pub fn read(sys: &(impl tap_engine::source::FileSource + ?Sized)) -> PcieRoots {
        let mut out = HashMap::new();
        let roots = sys.list("devices").unwrap_or_default();
        for root in roots.iter().filter(|r| r.starts_with("pci")) {
            let functions = sys.list(&format!("devices/{root}")).unwrap_or_default();
            let node = functions
                .iter()
                .filter(|f| f.contains(':') && f.contains('.'))
                .filter_map(|f| sys.read(&format!("devices/{root}/{f}/numa_node")).ok())
                .find_map(|v| {
                    v.trim()
                        .parse::<i64>()
                        .ok()
                        .and_then(|n| numa_node_of(Some(n)))
                });
            if let Some(n) = node {
                out.insert(root.clone(), n);
            }
        }
        PcieRoots(out)
    }

    /// The NUMA node of root `name` (`pci0000:3a`).
    pub fn numa_node(&self, name: &str) -> Option<u32> {
        self.0.get(name).copied()
    }
}

/// A device as DRA names it: its driver, the driver's pool and the device's name there.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DraDevice {
    pub driver: String,
    pub pool: String,
    pub device: String,
}

/// One ResourceSlice's devices and their NUMA nodes (a device without the attribute, or with
/// a value that is no NUMA node id, has none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SliceDevices {
    /// The pool's generation the slice belongs to: while a driver replaces a pool, the newer
    /// generation's slice wins.
    pub generation: i64,
    pub devices: Vec<(DraDevice, Option<u32>)>,
}

/// The DRA devices of this node by ResourceSlice, as the kube link last saw them.
#[derive(Debug, Default)]
pub struct DraTopology {
    slices: RwLock<HashMap<String, SliceDevices>>,
    /// This machine's PCIe roots, for devices named by their root only (set once at start).
    roots: std::sync::OnceLock<PcieRoots>,
}

impl DraTopology {
    /// Sets the machine's PCIe roots (once; a second call is ignored).
    pub fn set_pcie_roots(&self, roots: PcieRoots) {
        let _ = self.roots.set(roots);
    }

    /// The machine's PCIe roots (none before [`DraTopology::set_pcie_roots`]).
    pub fn pcie_roots(&self) -> PcieRoots {
        self.roots.get().cloned().unwrap_or_default()
    }

    /// Slice `name` holds `devices` now (a new slice, or a changed one).
    pub fn put(&self, name: &str, devices: SliceDevices) {
        self.write().insert(name.to_string(), devices);
    }

    /// Slice `name` is gone.
    pub fn remove(&self, name: &str) {
        self.write().remove(name);
    }

    /// Every slice at once (a relist): what is not in `all` is gone.
    pub fn replace(&self, all: HashMap<String, SliceDevices>) {
        *self.write() = all;
    }

    /// The NUMA node of `d`, if a slice of this node names it with one.
    pub fn numa_node(&self, d: &DraDevice) -> Option<u32> {
        let slices = self.slices.read().unwrap_or_else(|p| p.into_inner());
        slices
            .values()
            .flat_map(|s| s.devices.iter().map(move |dn| (s.generation, dn)))
            .filter(|(_, (dev, _))| dev == d)
            .max_by_key(|(generation, _)| *generation)
            .and_then(|(_, (_, node))| *node)
    }

    /// How many devices the slices hold.
    pub fn len(&self) -> usize {
        let slices = self.slices.read().unwrap_or_else(|p| p.into_inner());
        slices.values().map(|s| s.devices.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, SliceDevices>> {
        self.slices.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// A NUMA node id from an attribute's integer value (negative or too large: none).
pub fn numa_node_of(value: Option<i64>) -> Option<u32> {
    value.and_then(|v| u32::try_from(v).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(device: &str) -> DraDevice {
        DraDevice {
            driver: "example.com".into(),
            pool: "node-a".into(),
            device: device.into(),
        }
    }

    #[test]
    fn devices_are_found_by_driver_pool_and_name_and_go_with_their_slice() {
        let t = DraTopology::default();
        t.put(
            "s1",
            SliceDevices {
                generation: 1,
                devices: vec![(dev("accel-0"), Some(0)), (dev("accel-1"), Some(1))],
            },
        );
        t.put(
            "s2",
            SliceDevices {
                generation: 1,
                devices: vec![(dev("nic-0"), None)],
            },
        );
        // The pool's next generation, published before the old slice goes.
        t.put(
            "s1-next",
            SliceDevices {
                generation: 2,
                devices: vec![(dev("accel-0"), Some(3))],
            },
        );
        assert_eq!(
            t.numa_node(&dev("accel-0")),
            Some(3),
            "the newer generation"
        );
        t.remove("s1-next");
        assert_eq!(t.numa_node(&dev("accel-1")), Some(1));
        assert_eq!(t.numa_node(&dev("nic-0")), None, "no attribute");
        let other_driver = DraDevice {
            driver: "other.com".into(),
            ..dev("accel-1")
        };
        assert_eq!(t.numa_node(&other_driver), None);
        assert_eq!(t.len(), 3);
        t.remove("s1");
        assert_eq!(t.numa_node(&dev("accel-1")), None);
        t.replace(HashMap::new());
        assert!(t.is_empty());
    }

    #[test]
    fn attribute_values_that_are_no_node_id_give_none() {
        assert_eq!(numa_node_of(Some(3)), Some(3));
        assert_eq!(numa_node_of(Some(-1)), None);
        assert_eq!(numa_node_of(Some(i64::MAX)), None);
        assert_eq!(numa_node_of(None), None);
    }
}
