//! `--explain` on server-shaped fixtures, through the real binary: it lists the GPUs and NPUs
//! with the variable and index that name each and its NUMA node, and never lists the BMC's VGA
//! as one of them.

use tap_engine::testdata::{fixture_file, proc_fixture_dir};

fn explain(fixture: &str) -> String {
    crate::common::explain(&fixture_file(fixture), &proc_fixture_dir(fixture), &[])
}

/// The `pci` lines, in order.
fn pci_lines(out: &str) -> Vec<&str> {
    out.lines()
        .filter(|l| l.trim_start().starts_with("pci "))
        .collect()
}

/// Each of `expected` (address, node) has a `pci` line of `kind` naming it `var=<index>` in
/// that order, ending in its node; no other line is a `pci` line.
fn lists_exactly(out: &str, kind: &str, var: &str, expected: &[(&str, u32)]) {
    let lines = pci_lines(out);
    assert_eq!(lines.len(), expected.len(), "{out}");
    for (i, (addr, node)) in expected.iter().enumerate() {
        let line = lines
            .iter()
            .find(|l| l.contains(&format!("pci {addr} {kind} ")))
            .unwrap_or_else(|| panic!("no {kind} line for {addr}:\n{out}"));
        assert!(line.contains(&format!("{var}={i}")), "{line}");
        assert!(line.ends_with(&format!("numa node {node}")), "{line}");
    }
}

#[test]
fn gpu_server_lists_its_nvidia_gpus_not_its_bmc_vga() {
    let out = explain("synthetic-2s-2numa-32t-8gpu-bmc");
    let gpus = [
        ("0000:18:00.0", 0),
        ("0000:2a:00.0", 0),
        ("0000:3a:00.0", 0),
        ("0000:5d:00.0", 0),
        ("0000:9a:00.0", 1),
        ("0000:ab:00.0", 1),
        ("0000:ba:00.0", 1),
        ("0000:db:00.0", 1),
    ];
    lists_exactly(&out, "gpu 10de:2330", "NVIDIA_VISIBLE_DEVICES", &gpus);
    lists_exactly(&out, "gpu 10de:2330", "VA_VISIBLE_DEVICES", &gpus);
    // The UUID the driver's file gives, on its GPU's line.
    let ab = pci_lines(&out)
        .into_iter()
        .find(|l| l.contains("0000:ab:00.0"))
        .unwrap_or_default();
    assert!(
        ab.contains("or GPU-7f3a9c2e-4b1d-4e8a-9c6f-2d5b8e000001"),
        "{out}"
    );
    assert!(
        out.contains("not GPUs (a BMC's or virtual machine's VGA): 0000:02:00.0 (1a03:2000)"),
        "{out}"
    );
}

#[test]
fn npu_server_lists_its_ascend_npus_not_its_bmc_vga() {
    let out = explain("synthetic-2s-4numa-32c-8npu-bmc");
    let npus = [
        ("0000:01:00.0", 0),
        ("0000:02:00.0", 0),
        ("0000:41:00.0", 1),
        ("0000:42:00.0", 1),
        ("0000:81:00.0", 2),
        ("0000:82:00.0", 2),
        ("0000:c1:00.0", 3),
        ("0000:c2:00.0", 3),
    ];
    lists_exactly(&out, "npu 19e5:d801", "ASCEND_VISIBLE_DEVICES", &npus);
    assert!(!out.contains("VA_VISIBLE_DEVICES="), "{out}");
    assert!(
        out.contains("not GPUs (a BMC's or virtual machine's VGA): 0000:05:00.0 (19e5:1711)"),
        "{out}"
    );
}
