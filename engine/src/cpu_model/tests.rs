use super::*;
use crate::sysfs::MapSource;

/// One arm64 `/proc/cpuinfo` block as the kernel prints it.
fn arm_block(cpu: usize, implementer: &str, variant: &str, part: &str, features: &str) -> String {
    format!(
        "processor\t: {cpu}\nBogoMIPS\t: 200.00\nFeatures\t: {features}\n\
         CPU implementer\t: {implementer}\nCPU architecture: 8\nCPU variant\t: {variant}\n\
         CPU part\t: {part}\nCPU revision\t: 0\n\n"
    )
}

const KP920_FEATURES: &str = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp \
                              cpuid asimdrdm jscvt fcma dcpop asimddp asimdfhm ssbs";

/// A Kunpeng 920 two-socket server's cpuinfo: 96 processors, all alike.
fn kunpeng_920_cpuinfo() -> String {
    (0..96)
        .map(|c| arm_block(c, "0x48", "0x1", "0xd01", KP920_FEATURES))
        .collect()
}

const X86_CPUINFO: &str = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n\
model\t\t: 85\nmodel name\t: Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz\nstepping\t: 7\n\
microcode\t: 0x5003604\ncpu MHz\t\t: 2500.000\ncache size\t: 28160 KB\nphysical id\t: 0\n\
siblings\t: 40\ncore id\t\t: 0\ncpu cores\t: 20\nflags\t\t: fpu vme de pse tsc msr pae mce\n\n\
processor\t: 1\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz\n";

#[test]
fn sysfs_midr_text_splits_into_its_fields() {
    let m = Midr::parse("0x00000000481fd010\n").expect("midr");
    assert_eq!(
        m,
        Midr {
            implementer: 0x48,
            variant: 1,
            architecture: 0xf,
            part: 0xd01,
            revision: 0
        }
    );
    assert_eq!(m.bits(), 0x481f_d010);
    assert_eq!(m.known(), Some(KnownCpu::Kunpeng920));
    let m = Midr::parse("0x00000000480fd060").expect("midr");
    assert_eq!((m.implementer, m.part), (HISILICON, PART_KUNPENG_950));
    assert_eq!(m.known(), Some(KnownCpu::Kunpeng950));
}

#[test]
fn qemu_max_is_no_kunpeng() {
    // QEMU's `-cpu max` arm64 guest: implementer 0x00 (software), part 0x051.
    let m = Midr::parse("0x00000000000f0510").expect("midr");
    assert_eq!((m.implementer, m.part, m.architecture), (0, 0x051, 0xf));
    let model = CpuModel::from_midr(m, CpuModelSource::SysfsMidr);
    assert_eq!(model.known(), None);
    assert_eq!(model.name(), "software-defined part 0x051");
    assert_eq!(model.implementer_hex().as_deref(), Some("0x00"));
    assert_eq!(model.part_hex().as_deref(), Some("0x051"));
    let info = arm_block(0, "0x00", "0x0", "0x051", "fp asimd");
    assert_eq!(CpuModel::from_cpuinfo(&info).midr, Some(m));
    assert!(ClusterAffinityRule::Kunpeng950Only.check(&model).is_err());
}

#[test]
fn kunpeng_920_cpuinfo_names_the_920() {
    let model = CpuModel::from_cpuinfo(&kunpeng_920_cpuinfo());
    assert_eq!(model.source, CpuModelSource::ProcCpuinfo);
    assert_eq!(model.midr, Midr::parse("0x481fd010"));
    assert_eq!(model.known(), Some(KnownCpu::Kunpeng920));
    assert_eq!(
        model.to_string(),
        "HiSilicon Kunpeng 920 (implementer 0x48, part 0xd01, variant 0x1, revision 0)"
    );
}

#[test]
fn x86_cpuinfo_gives_the_model_name_and_vendor() {
    let model = CpuModel::from_cpuinfo(X86_CPUINFO);
    assert_eq!(model.midr, None);
    assert_eq!(model.vendor_id.as_deref(), Some("GenuineIntel"));
    assert_eq!(model.name(), "Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz");
    assert_eq!(
        model.to_string(),
        "Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz (GenuineIntel)"
    );
    assert_eq!((model.implementer_hex(), model.part_hex()), (None, None));
    assert_eq!(model.source, CpuModelSource::ProcCpuinfo);
}

#[test]
fn garbage_is_unknown_never_an_error() {
    for text in [
        "",
        "\0\u{1}binary\n",
        "CPU implementer\t: 0x148\nCPU part\t: 0xd01\n",
        "CPU implementer\t: 0x48\nCPU part\t: 0x1d01\n",
        "CPU implementer\t: zz\nCPU part\t: 0xd01\n",
        "CPU implementer\t: 0x48\n",
        ":::\n: 0x48\n",
    ] {
        let m = CpuModel::from_cpuinfo(text);
        assert_eq!(m, CpuModel::unknown(), "{text:?}");
        assert_eq!(m.name(), "unknown");
    }
    for text in [
        "",
        "0x",
        "481fd010",
        "0x481fd010zz",
        "0x1234567890abcdef0",
        "-0x1",
    ] {
        assert_eq!(Midr::parse(text), None, "{text:?}");
    }
    // A very long model name is cut, control characters dropped.
    let long = format!("model name\t: {}\u{7}\n", "x".repeat(500));
    assert_eq!(CpuModel::from_cpuinfo(&long).name().len(), MAX_TEXT);
}

#[test]
fn identify_prefers_sysfs_then_cpuinfo_and_reports_what_it_skipped() {
    let sys = MapSource::default().with(&midr_path(0), "0x00000000481fd010\n");
    let proc = MapSource::default().with("cpuinfo", X86_CPUINFO);
    let found = identify(&sys, &proc, 0);
    assert_eq!(found.model.source, CpuModelSource::SysfsMidr);
    assert_eq!(found.model.known(), Some(KnownCpu::Kunpeng920));
    assert!(found.problems.is_empty());

    // No midr_el1 (x86, or an older kernel): cpuinfo, quietly.
    let found = identify(&MapSource::default(), &proc, 0);
    assert_eq!(found.model.vendor_id.as_deref(), Some("GenuineIntel"));
    assert!(found.problems.is_empty());

    // A malformed midr_el1: reported, cpuinfo used.
    let sys = MapSource::default().with(&midr_path(2), "garbage");
    let arm = MapSource::default().with("cpuinfo", &kunpeng_920_cpuinfo());
    let found = identify(&sys, &arm, 2);
    assert_eq!(found.model.known(), Some(KnownCpu::Kunpeng920));
    assert_eq!(found.model.source, CpuModelSource::ProcCpuinfo);
    assert!(matches!(
        found.problems.as_slice(),
        [CpuModelProblem::MalformedMidr { path, .. }] if path.ends_with("cpu2/regs/identification/midr_el1")
    ));

    // Neither: unknown.
    let found = identify(&MapSource::default(), &MapSource::default(), 0);
    assert_eq!(found.model, CpuModel::unknown());
    assert_eq!(found.model.source.as_str(), "none");
}

#[test]
fn kunpeng_950_only_allows_hisilicon_part_0xd06_alone() {
    let rule = ClusterAffinityRule::Kunpeng950Only;
    let kp = |bits: u64| CpuModel::from_midr(Midr::from_bits(bits), CpuModelSource::SysfsMidr);
    assert!(rule.check(&kp(0x480f_d060)).is_ok());
    let off = rule.check(&kp(0x481f_d010)).unwrap_err();
    assert_eq!(
        off.to_string(),
        "cluster affinity is off: --cluster-affinity-rule=kunpeng-950-only uses cluster pools \
         only on CPU part 0xd06 (HiSilicon Kunpeng 950), and this CPU is HiSilicon Kunpeng 920 \
         (implementer 0x48, part 0xd01, variant 0x1, revision 0)"
    );
    // Arm's Cortex-A65 is part 0xd06 too, of implementer 0x41.
    assert!(rule.check(&kp(0x410f_d060)).is_err());
    assert!(rule.check(&CpuModel::unknown()).is_err());
    for cpu in [kp(0x481f_d010), CpuModel::unknown()] {
        assert!(ClusterAffinityRule::Any.check(&cpu).is_ok());
    }
    for r in ClusterAffinityRule::ALL {
        assert_eq!(ClusterAffinityRule::parse(r.as_str()), Some(r));
    }
    assert_eq!(ClusterAffinityRule::parse("kunpeng-920"), None);
}
