//! `--explain` names the CPU through the real binary (its `cpu:` line, from `midr_el1` or from
//! `/proc/cpuinfo`), and `--cluster-affinity-rule=kunpeng-950-only` keeps cluster pools off on
//! the Kunpeng 920 fixture and on on the part-0xd06 one.

use crate::common::explain;
use std::path::Path;
use tap_engine::testdata::{fixture_file, proc_fixture_dir};

const KP920: &str = "synthetic-2s-4numa-96c-kunpeng920";
const KP950: &str = "synthetic-1s-2numa-96c-kunpeng950";

fn cpu_line(out: &str) -> &str {
    out.lines()
        .find(|l| l.starts_with("cpu: "))
        .unwrap_or_else(|| panic!("no cpu: line in\n{out}"))
}

#[test]
fn explain_names_both_kunpeng_fixtures_from_midr_el1() {
    let out = explain(&fixture_file(KP920), &proc_fixture_dir(KP920), &[]);
    assert_eq!(
        cpu_line(&out),
        "cpu: HiSilicon Kunpeng 920 (implementer 0x48, part 0xd01, variant 0x1, revision 0), \
         from midr_el1 under --sysfs-root"
    );
    // Right below the topology line.
    assert!(
        out.lines().nth(1).is_some_and(|l| l.starts_with("cpu: ")),
        "{out}"
    );
    let out = explain(&fixture_file(KP950), &proc_fixture_dir(KP950), &[]);
    assert_eq!(
        cpu_line(&out),
        "cpu: HiSilicon Kunpeng 950 (implementer 0x48, part 0xd06, variant 0x0, revision 0), \
         from midr_el1 under --sysfs-root"
    );
}

/// A sysfs tree without `midr_el1` (an older kernel): the fixture's `/proc/cpuinfo` names it.
#[test]
fn explain_falls_back_to_cpuinfo() {
    let out = explain(
        &fixture_file("synthetic-2s-4numa-96c-gpu"),
        &proc_fixture_dir(KP920),
        &[],
    );
    assert_eq!(
        cpu_line(&out),
        "cpu: HiSilicon Kunpeng 920 (implementer 0x48, part 0xd01, variant 0x1, revision 0), \
         from cpuinfo under --proc-root"
    );
    // Neither: unknown, and the agent still runs.
    let none = Path::new("/nonexistent-proc-root");
    let out = explain(&fixture_file("synthetic-2s-4numa-96c-gpu"), none, &[]);
    assert!(
        cpu_line(&out).starts_with("cpu: unknown (no midr_el1"),
        "{out}"
    );
}

#[test]
fn kunpeng_950_only_turns_cluster_pools_off_on_the_920_and_keeps_them_on_the_950() {
    let rule = [
        "--topology-cluster-affinity",
        "--cluster-affinity-rule=kunpeng-950-only",
    ];
    let out = explain(&fixture_file(KP920), &proc_fixture_dir(KP920), &rule);
    assert!(!out.contains("[cluster]"), "{out}");
    assert!(
        out.contains(
            "(24 cluster pools not shown: --cluster-affinity-rule=kunpeng-950-only and this CPU \
             is not part 0xd06)"
        ),
        "{out}"
    );
    assert!(out.contains("cluster affinity false"), "{out}");
    assert!(
        out.contains("cluster affinity is off: --cluster-affinity-rule=kunpeng-950-only"),
        "{out}"
    );
    assert!(
        out.contains("burstable-4-8    -> cpus 0-23 (numa0)"),
        "{out}"
    );

    let out = explain(&fixture_file(KP950), &proc_fixture_dir(KP950), &rule);
    assert!(out.contains("cluster0 [cluster] cpus 0-3"), "{out}");
    assert!(out.contains("cluster affinity true"), "{out}");
    assert!(!out.contains("not shown"), "{out}");

    // `any` (the default) keeps today's behaviour: cluster pools on the 920 too.
    let out = explain(
        &fixture_file(KP920),
        &proc_fixture_dir(KP920),
        &["--topology-cluster-affinity"],
    );
    assert!(out.contains("cluster0 [cluster] cpus 0-3"), "{out}");
}
