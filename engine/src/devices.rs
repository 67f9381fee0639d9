//! Accelerators: which PCI devices are GPUs or NPUs, and which of them a container's device
//! environment (`NVIDIA_VISIBLE_DEVICES=1`, `VA_VISIBLE_DEVICES=/dev/vacc0`, ...) names.
//!
//! - [`classify`]: a device's [`DeviceKind`] from its class, vendor and device ids. A server
//!   BMC's VGA (ASPEED, Matrox, Huawei's 0x1711) or a virtual machine's emulated VGA is a
//!   console, never a GPU.
//! - [`DeviceScheme`]: how one family of environment variables names devices, each over its
//!   own devices in PCI-address order: NVIDIA's over NVIDIA GPUs, the reference's `VA_*` over
//!   every GPU, Ascend's over Huawei NPUs.
//! - [`requested`]: the devices one variable's value names. What cannot be resolved for sure
//!   (an unknown UUID, an index past the last device, `all`, garbage) names none: no hint is
//!   better than a wrong NUMA node.
//! - [`read_nvidia_uuids`]: GPU UUIDs from the NVIDIA driver's `/proc` files, so that
//!   `NVIDIA_VISIBLE_DEVICES=GPU-…` (the NVIDIA device plugin's default) resolves.

pub use crate::pci::{
    classify, is_accelerator_class, DeviceKind, PciDevice, VENDOR_HUAWEI, VENDOR_NVIDIA,
};
use crate::source::FileSource;

/// How a family of environment variables names the devices a container was given. Each
/// scheme counts its own devices in PCI-address order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceScheme {
    /// `NVIDIA_VISIBLE_DEVICES`: NVIDIA GPUs (vendor 0x10de). Items: an index (the driver's
    /// default order is by PCI address), `<gpu>:<mig>` (a MIG instance of GPU `<gpu>`),
    /// `GPU-<uuid>`, or `MIG-GPU-<uuid>/…` (the older MIG naming, which carries its GPU's
    /// UUID). A newer `MIG-<uuid>` does not say its GPU: no hint.
    Nvidia,
    /// `VA_VISIBLE_DEVICES`, `VA_ALLOCATE_DEVICES` (the reference implementation's): every GPU,
    /// of any vendor, as the reference takes every 3D controller whatever its vendor. Items:
    /// an index or `/dev/vacc<index>`.
    Va,
    /// `ASCEND_VISIBLE_DEVICES`: Huawei Ascend NPUs (vendor 0x19e5, class 0x12). Items: an
    /// index, a range `<first>-<last>`, or `davinci<index>` / `/dev/davinci<index>`.
    Ascend,
}

/// The environment variables through which a container names accelerator devices.
pub const DEVICE_ENV_VARS: [&str; 4] = [
    "VA_VISIBLE_DEVICES",
    "VA_ALLOCATE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "ASCEND_VISIBLE_DEVICES",
];

impl DeviceScheme {
    /// The scheme of environment variable `key`, if it names devices.
    pub fn of_env(key: &str) -> Option<DeviceScheme> {
        match key {
            "VA_VISIBLE_DEVICES" | "VA_ALLOCATE_DEVICES" => Some(DeviceScheme::Va),
            "NVIDIA_VISIBLE_DEVICES" => Some(DeviceScheme::Nvidia),
            "ASCEND_VISIBLE_DEVICES" => Some(DeviceScheme::Ascend),
            _ => None,
        }
    }

    /// Whether this scheme counts `d`.
    pub fn counts(self, d: &PciDevice) -> bool {
        match self {
            DeviceScheme::Nvidia => d.kind() == DeviceKind::Gpu && d.vendor == VENDOR_NVIDIA,
            DeviceScheme::Va => d.kind() == DeviceKind::Gpu,
            DeviceScheme::Ascend => d.kind() == DeviceKind::Npu && d.vendor == VENDOR_HUAWEI,
        }
    }

    /// The devices this scheme counts, in its index order (PCI address).
    pub fn devices(self, all: &[PciDevice]) -> Vec<&PciDevice> {
        let mut out: Vec<&PciDevice> = all.iter().filter(|d| self.counts(d)).collect();
        out.sort_by_cached_key(|d| address_key(&d.address));
        out
    }

    /// The variable that names this scheme's devices in `--explain` (the first of its family).
    pub fn env_var(self) -> &'static str {
        match self {
            DeviceScheme::Nvidia => "NVIDIA_VISIBLE_DEVICES",
            DeviceScheme::Va => "VA_VISIBLE_DEVICES",
            DeviceScheme::Ascend => "ASCEND_VISIBLE_DEVICES",
        }
    }

    /// Every scheme.
    pub const ALL: [DeviceScheme; 3] =
        [DeviceScheme::Nvidia, DeviceScheme::Va, DeviceScheme::Ascend];
}

/// PCI address order: domain, bus, device, function as numbers (domains may be wider than
/// four digits); an address that does not parse sorts after the rest, by its text.
fn address_key(address: &str) -> (bool, [u32; 4], String) {
    let parsed = (|| {
        let (domain, rest) = address.split_once(':')?;
        let (bus, rest) = rest.split_once(':')?;
        let (dev, func) = rest.split_once('.')?;
        let hex = |s: &str| u32::from_str_radix(s, 16).ok();
        Some([hex(domain)?, hex(bus)?, hex(dev)?, hex(func)?])
    })();
    (
        parsed.is_none(),
        parsed.unwrap_or_default(),
        address.to_string(),
    )
}

/// One item of a device variable's comma-separated value.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Item {
    /// Devices `first..=last` of the scheme's order (one device: first == last).
    Indexes { first: usize, last: usize },
    /// A GPU by its UUID (`GPU-…`, compared without regard to case).
    Uuid(String),
    /// Names no device for sure: `all`, `none`, `void`, an unresolvable UUID, garbage.
    Nothing,
}

/// The devices `value` (of a variable of `scheme`) names, in the order named, each once.
pub fn requested<'a>(
    scheme: DeviceScheme,
    value: &str,
    all: &'a [PciDevice],
) -> Vec<&'a PciDevice> {
    let devices = scheme.devices(all);
    let mut out: Vec<&PciDevice> = Vec::new();
    for item in value.split(',') {
        for d in resolve(&parse_item(scheme, item.trim()), &devices) {
            if !out.iter().any(|o| o.address == d.address) {
                out.push(d);
            }
        }
    }
    out
}

fn resolve<'a>(item: &Item, devices: &[&'a PciDevice]) -> Vec<&'a PciDevice> {
    match item {
        Item::Indexes { first, last } => devices
            .iter()
            .enumerate()
            .filter(|(i, _)| (*first..=*last).contains(i))
            .map(|(_, d)| *d)
            .collect(),
        Item::Uuid(u) => devices
            .iter()
            .filter(|d| d.uuid.as_deref().is_some_and(|x| x.eq_ignore_ascii_case(u)))
            .copied()
            .collect(),
        Item::Nothing => Vec::new(),
    }
}

fn parse_item(scheme: DeviceScheme, item: &str) -> Item {
    match scheme {
        DeviceScheme::Nvidia => parse_nvidia(item),
        DeviceScheme::Va => one_index(strip_any(item, &["/dev/vacc", "vacc"])),
        DeviceScheme::Ascend => parse_ascend(item),
    }
}

fn parse_nvidia(item: &str) -> Item {
    if let Some(rest) = item.strip_prefix("MIG-") {
        // `MIG-GPU-<gpu uuid>/<gi>/<ci>` names its GPU; `MIG-<uuid>` does not.
        return match rest.split_once('/') {
            Some((gpu, _)) if gpu.starts_with("GPU-") => uuid_item(gpu),
            _ => Item::Nothing,
        };
    }
    if item.starts_with("GPU-") {
        return uuid_item(item);
    }
    // `<gpu>:<mig>`: a MIG instance on GPU `<gpu>`.
    match item.split_once(':') {
        Some((gpu, mig)) if digits(mig).is_some() => one_index(gpu),
        Some(_) => Item::Nothing,
        None => one_index(item),
    }
}

fn parse_ascend(item: &str) -> Item {
    let item = strip_any(item, &["/dev/davinci", "davinci"]);
    match item.split_once('-') {
        Some((first, last)) => match (digits(first), digits(last)) {
            (Some(first), Some(last)) if first <= last => Item::Indexes { first, last },
            _ => Item::Nothing,
        },
        None => one_index(item),
    }
}

fn uuid_item(uuid: &str) -> Item {
    // `GPU-` and a UUID's hex digits and dashes; anything else is not one.
    let Some(body) = uuid.strip_prefix("GPU-") else {
        return Item::Nothing;
    };
    if !body.is_empty() && body.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
        Item::Uuid(uuid.to_string())
    } else {
        Item::Nothing
    }
}

fn one_index(s: &str) -> Item {
    match digits(s) {
        Some(i) => Item::Indexes { first: i, last: i },
        None => Item::Nothing,
    }
}

/// A decimal index: ASCII digits only (no sign, no spaces), fitting a usize.
fn digits(s: &str) -> Option<usize> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn strip_any<'a>(s: &'a str, prefixes: &[&str]) -> &'a str {
    prefixes.iter().find_map(|p| s.strip_prefix(p)).unwrap_or(s)
}

/// Where the NVIDIA driver describes a GPU, relative to a proc root (`/proc`).
pub fn nvidia_information_path(address: &str) -> String {
    format!("driver/nvidia/gpus/{address}/information")
}

/// Sets the UUID of every NVIDIA GPU in `devices` whose driver file under `proc` (a `/proc`
/// root) has a `GPU UUID: GPU-…` line. A missing or unreadable file, or one without such a
/// line, leaves the UUID unset (the GPU is still found by index).
pub fn read_nvidia_uuids(proc: &(impl FileSource + ?Sized), devices: &mut [PciDevice]) {
    for d in devices.iter_mut() {
        if !DeviceScheme::Nvidia.counts(d) {
            continue;
        }
        if let Ok(text) = proc.read(&nvidia_information_path(&d.address)) {
            d.uuid = uuid_of_information(&text);
        }
    }
}

fn uuid_of_information(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (key, value) = l.split_once(':')?;
        let value = value.trim();
        let is_uuid = matches!(uuid_item(value), Item::Uuid(_));
        (key.trim() == "GPU UUID" && is_uuid).then(|| value.to_string())
    })
}

#[cfg(test)]
mod tests;
