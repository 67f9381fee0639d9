//! PCI devices as discovery reports them, and what each is to placement: a GPU, an NPU, or a
//! console display (a server BMC's VGA or a virtual machine's emulated one, never a GPU).

use serde::Serialize;
use std::fmt;

/// PCI vendor id of NVIDIA.
pub const VENDOR_NVIDIA: u32 = 0x10de;
/// PCI vendor id of Huawei (Ascend NPUs, and the BMC VGA of its servers).
pub const VENDOR_HUAWEI: u32 = 0x19e5;

/// Display controllers that only drive a console: (vendor, device), device `None` for every
/// display controller of that vendor.
const CONSOLE_DISPLAYS: [(u32, Option<u32>); 5] = [
    // ASPEED: the BMC of most x86 and many Arm servers (AST2xxx).
    (0x1a03, None),
    // Matrox: the G200e family in BMCs (iLO, iDRAC).
    (0x102b, None),
    // Huawei's Hi171x BMC VGA (TaiShan / Kunpeng servers); its other devices are not consoles.
    (VENDOR_HUAWEI, Some(0x1711)),
    // QEMU's standard (Bochs) VGA.
    (0x1234, Some(0x1111)),
    // Cirrus Logic: QEMU's and old hypervisors' emulated VGA.
    (0x1013, None),
];

/// What a PCI device is to placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// A display or 3D controller (class 0x03) that computes: a GPU of any vendor.
    Gpu,
    /// A processing accelerator (class 0x12), such as Huawei's Ascend NPUs.
    Npu,
    /// A display controller that only drives a console: a server BMC's VGA or a virtual
    /// machine's emulated one. Never a GPU.
    Console,
    /// Anything else (a device discovery was asked to report by address).
    Other,
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceKind::Gpu => "gpu",
            DeviceKind::Npu => "npu",
            DeviceKind::Console => "console display",
            DeviceKind::Other => "device",
        })
    }
}

/// PCI base classes discovery reports: display controllers and processing accelerators.
pub fn is_accelerator_class(class: u32) -> bool {
    matches!(class >> 16, 0x03 | 0x12)
}

/// A device's kind from its PCI class code (e.g. 0x030200), vendor and device ids.
pub fn classify(class: u32, vendor: u32, device: u32) -> DeviceKind {
    match class >> 16 {
        0x03 if is_console_display(vendor, device) => DeviceKind::Console,
        0x03 => DeviceKind::Gpu,
        0x12 => DeviceKind::Npu,
        _ => DeviceKind::Other,
    }
}

fn is_console_display(vendor: u32, device: u32) -> bool {
    CONSOLE_DISPLAYS
        .iter()
        .any(|&(v, d)| v == vendor && d.is_none_or(|d| d == device))
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PciDevice {
    /// PCI address, e.g. `0000:3b:00.0`.
    pub address: String,
    /// Class code, e.g. 0x030000 (VGA), 0x030200 (3D controller), 0x120000 (processing
    /// accelerator).
    pub class: u32,
    pub vendor: u32,
    pub device: u32,
    pub numa_node: Option<u32>,
    /// The GPU's UUID (`GPU-…`) where the driver tells it (NVIDIA:
    /// [`crate::devices::read_nvidia_uuids`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
}

impl PciDevice {
    /// What the device is: see [`classify`].
    pub fn kind(&self) -> DeviceKind {
        classify(self.class, self.vendor, self.device)
    }

    /// A GPU: a display or 3D controller (class 0x03) of any vendor, but not a console display
    /// (a server BMC's VGA, a virtual machine's emulated one).
    pub fn is_gpu(&self) -> bool {
        self.kind() == DeviceKind::Gpu
    }
}
