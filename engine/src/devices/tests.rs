use super::*;
use crate::sysfs::MapSource;
use proptest::prelude::*;

fn dev(address: &str, class: u32, vendor: u32, device: u32, node: u32) -> PciDevice {
    PciDevice {
        address: address.into(),
        class,
        vendor,
        device,
        numa_node: Some(node),
        uuid: None,
    }
}

const VGA: u32 = 0x030000;
const GPU3D: u32 = 0x030200;
const NPU: u32 = 0x120000;
const UUID5: &str = "GPU-4e1d6f0a-5b2c-4c7e-9a3b-000000000001";

/// An x86 GPU server, listed out of address order: the BMC's VGA first in address order, 8
/// NVIDIA GPUs (4 on node 0, 4 on node 1), one with a known UUID, and a NIC.
fn gpu_server() -> Vec<PciDevice> {
    let mut v = vec![dev("0000:02:00.0", VGA, 0x1a03, 0x2000, 0)];
    for (i, bus) in ["db", "18", "ba", "2a", "9a", "3a", "ab", "5d"]
        .iter()
        .enumerate()
    {
        let node = u32::from(bus.as_bytes()[0] > b'8');
        v.push(dev(
            &format!("0000:{bus}:00.0"),
            GPU3D,
            VENDOR_NVIDIA,
            0x2330,
            node,
        ));
        if i == 6 {
            v[i + 1].uuid = Some(UUID5.into());
        }
    }
    v.push(dev("0000:03:00.0", 0x020000, 0x8086, 0x1521, 0));
    v
}

/// A Kunpeng NPU server: Huawei's BMC VGA and 8 Ascend NPUs, 2 on each of 4 nodes.
fn npu_server() -> Vec<PciDevice> {
    let mut v = vec![dev("0000:05:00.0", VGA, VENDOR_HUAWEI, 0x1711, 0)];
    for (i, bus) in ["01", "02", "41", "42", "81", "82", "c1", "c2"]
        .iter()
        .enumerate()
    {
        v.push(dev(
            &format!("0000:{bus}:00.0"),
            NPU,
            VENDOR_HUAWEI,
            0xd801,
            i as u32 / 2,
        ));
    }
    v
}

fn addresses(scheme: DeviceScheme, value: &str, all: &[PciDevice]) -> Vec<String> {
    requested(scheme, value, all)
        .iter()
        .map(|d| d.address.clone())
        .collect()
}

#[test]
fn bmc_and_emulated_vgas_are_consoles_gpus_of_any_vendor_are_gpus() {
    for (vendor, device) in [
        (0x1a03, 0x2000),
        (0x102b, 0x0522),
        (0x19e5, 0x1711),
        (0x1234, 0x1111),
    ] {
        assert_eq!(
            classify(VGA, vendor, device),
            DeviceKind::Console,
            "{vendor:x}:{device:x}"
        );
    }
    // The guide's Radeon is a VGA-class GPU; NVIDIA's are 3D controllers or VGA.
    assert_eq!(classify(VGA, 0x1002, 0x67c7), DeviceKind::Gpu);
    assert_eq!(classify(GPU3D, VENDOR_NVIDIA, 0x2330), DeviceKind::Gpu);
    assert_eq!(classify(VGA, VENDOR_NVIDIA, 0x2204), DeviceKind::Gpu);
    // Huawei's other devices are not consoles: an Ascend NPU is an NPU, a NIC is other.
    assert_eq!(classify(NPU, VENDOR_HUAWEI, 0xd801), DeviceKind::Npu);
    assert_eq!(classify(0x020000, VENDOR_HUAWEI, 0x1822), DeviceKind::Other);
    assert!(is_accelerator_class(NPU) && is_accelerator_class(GPU3D));
    assert!(!is_accelerator_class(0x020000));
}

#[test]
fn nvidia_indexes_count_nvidia_gpus_in_address_order_not_the_bmc() {
    let all = gpu_server();
    assert_eq!(addresses(DeviceScheme::Nvidia, "0", &all), ["0000:18:00.0"]);
    assert_eq!(addresses(DeviceScheme::Nvidia, "4", &all), ["0000:9a:00.0"]);
    assert_eq!(
        addresses(DeviceScheme::Nvidia, "7, 1,7", &all),
        ["0000:db:00.0", "0000:2a:00.0"]
    );
    // A MIG instance `<gpu>:<mig>` is on GPU `<gpu>`.
    assert_eq!(
        addresses(DeviceScheme::Nvidia, "5:2", &all),
        ["0000:ab:00.0"]
    );
    // Past the last GPU: nothing, not a wrap-around.
    assert!(addresses(DeviceScheme::Nvidia, "8", &all).is_empty());
}

#[test]
fn nvidia_uuids_resolve_only_where_the_driver_said_them() {
    let all = gpu_server();
    assert_eq!(
        addresses(DeviceScheme::Nvidia, UUID5, &all),
        ["0000:ab:00.0"]
    );
    let upper = UUID5.to_ascii_uppercase();
    assert_eq!(
        addresses(DeviceScheme::Nvidia, &upper, &all),
        ["0000:ab:00.0"]
    );
    let mig_old = format!("MIG-{UUID5}/1/0");
    assert_eq!(
        addresses(DeviceScheme::Nvidia, &mig_old, &all),
        ["0000:ab:00.0"]
    );
    // A UUID the host did not tell (its trailing digits are not an index), a new-style MIG
    // UUID: no hint.
    for v in [
        "GPU-4e1d6f0a-5b2c-4c7e-9a3b-000000000002",
        "MIG-8c2e5f3a-1d4b-5e6f-a7b8-000000000003",
    ] {
        assert!(addresses(DeviceScheme::Nvidia, v, &all).is_empty(), "{v}");
    }
}

#[test]
fn va_counts_every_gpu_but_no_console() {
    let mut all = gpu_server();
    all.push(dev("0000:01:00.0", VGA, 0x1002, 0x67c7, 1));
    // The Radeon has the lowest address; the BMC at 02:00.0 is skipped.
    assert_eq!(addresses(DeviceScheme::Va, "0", &all), ["0000:01:00.0"]);
    assert_eq!(
        addresses(DeviceScheme::Va, "/dev/vacc1", &all),
        ["0000:18:00.0"]
    );
    assert_eq!(addresses(DeviceScheme::Va, "vacc2", &all), ["0000:2a:00.0"]);
    // A machine whose only display controller is its BMC has no VA device.
    assert!(addresses(DeviceScheme::Va, "0", &npu_server()).is_empty());
}

#[test]
fn ascend_indexes_ranges_and_davinci_names_count_ascend_npus() {
    let all = npu_server();
    assert_eq!(addresses(DeviceScheme::Ascend, "0", &all), ["0000:01:00.0"]);
    assert_eq!(
        addresses(DeviceScheme::Ascend, "/dev/davinci4", &all),
        ["0000:81:00.0"]
    );
    assert_eq!(
        addresses(DeviceScheme::Ascend, "davinci7", &all),
        ["0000:c2:00.0"]
    );
    assert_eq!(
        addresses(DeviceScheme::Ascend, "2-3,6", &all),
        ["0000:41:00.0", "0000:42:00.0", "0000:c1:00.0"]
    );
    // A huge range ends at the last NPU.
    assert_eq!(
        addresses(DeviceScheme::Ascend, "6-18446744073709551615", &all).len(),
        2
    );
    // NVIDIA's variable names no NPU, Ascend's no GPU.
    assert!(addresses(DeviceScheme::Nvidia, "0", &all).is_empty());
    assert!(addresses(DeviceScheme::Ascend, "0", &gpu_server()).is_empty());
}

#[test]
fn all_none_void_and_garbage_name_nothing() {
    let gpus = gpu_server();
    let npus = npu_server();
    for v in [
        "",
        "all",
        "none",
        "void",
        "ALL",
        "-1",
        "+1",
        "1.5",
        "0x1",
        "nvidia1",
        "/dev/nvidia1",
        "GPU-",
        "GPU-zz",
        "GPU-1/2",
        "MIG-",
        "MIG-1/2",
        "0:",
        ":1",
        "1:x",
        "٣",
        "1 2",
        "99999999999999999999999999",
        "/dev/vacc",
        "davinci",
        "3-1",
        "1-",
        "-",
        "1-2-3",
    ] {
        for scheme in DeviceScheme::ALL {
            let all = if scheme == DeviceScheme::Ascend {
                &npus
            } else {
                &gpus
            };
            assert!(addresses(scheme, v, all).is_empty(), "{scheme:?} {v:?}");
        }
    }
}

#[test]
fn environment_variables_map_to_their_scheme() {
    for key in DEVICE_ENV_VARS {
        assert!(DeviceScheme::of_env(key).is_some(), "{key}");
    }
    assert_eq!(
        DeviceScheme::of_env("VA_ALLOCATE_DEVICES"),
        Some(DeviceScheme::Va)
    );
    assert_eq!(DeviceScheme::of_env("CUDA_VISIBLE_DEVICES"), None);
    for s in DeviceScheme::ALL {
        assert_eq!(DeviceScheme::of_env(s.env_var()), Some(s));
    }
}

#[test]
fn addresses_sort_as_numbers() {
    let mut all = vec![
        dev("10000:00:01.0", GPU3D, VENDOR_NVIDIA, 1, 0),
        dev("0000:ff:00.0", GPU3D, VENDOR_NVIDIA, 1, 0),
        dev("0000:0a:00.1", GPU3D, VENDOR_NVIDIA, 1, 0),
        dev("0000:0a:00.0", GPU3D, VENDOR_NVIDIA, 1, 0),
        dev("odd", GPU3D, VENDOR_NVIDIA, 1, 0),
    ];
    all.rotate_left(2);
    let order: Vec<&str> = DeviceScheme::Nvidia
        .devices(&all)
        .iter()
        .map(|d| d.address.as_str())
        .collect();
    assert_eq!(
        order,
        [
            "0000:0a:00.0",
            "0000:0a:00.1",
            "0000:ff:00.0",
            "10000:00:01.0",
            "odd"
        ]
    );
}

#[test]
fn nvidia_uuids_are_read_from_the_driver_files() {
    let mut all = gpu_server();
    for d in &mut all {
        d.uuid = None;
    }
    let info = |uuid: &str| {
        format!("Model: \t\t NVIDIA H100 80GB HBM3\nIRQ: \t\t 35\nGPU UUID: \t {uuid}\nBus Type: \t PCIe\n")
    };
    let proc = MapSource::default()
        .with(&nvidia_information_path("0000:18:00.0"), &info(UUID5))
        .with(&nvidia_information_path("0000:2a:00.0"), &info("??"))
        .with(
            &nvidia_information_path("0000:3a:00.0"),
            "garbage\u{0}: :\n",
        )
        // Not an NVIDIA GPU: not read.
        .with(&nvidia_information_path("0000:02:00.0"), &info(UUID5));
    read_nvidia_uuids(&proc, &mut all);
    let uuid_of = |a: &str| {
        all.iter()
            .find(|d| d.address == a)
            .and_then(|d| d.uuid.clone())
    };
    assert_eq!(uuid_of("0000:18:00.0").as_deref(), Some(UUID5));
    for a in [
        "0000:2a:00.0",
        "0000:3a:00.0",
        "0000:02:00.0",
        "0000:5d:00.0",
    ] {
        assert_eq!(uuid_of(a), None, "{a}");
    }
    assert_eq!(
        addresses(DeviceScheme::Nvidia, UUID5, &all),
        ["0000:18:00.0"]
    );
}

proptest! {
    /// Any value: no panic, and only devices of the scheme, each once.
    #[test]
    fn any_value_names_only_the_schemes_devices(value in ".{0,40}", nvidia in any::<bool>()) {
        let scheme = if nvidia { DeviceScheme::Nvidia } else { DeviceScheme::Ascend };
        let mut all = gpu_server();
        all.extend(npu_server());
        let got = requested(scheme, &value, &all);
        for d in &got {
            prop_assert!(scheme.counts(d));
        }
        let mut seen: Vec<&str> = got.iter().map(|d| d.address.as_str()).collect();
        seen.sort();
        seen.dedup();
        prop_assert_eq!(seen.len(), got.len());
    }
}
