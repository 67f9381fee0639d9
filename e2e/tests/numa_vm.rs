//! The NUMA guest tier: the agent on a real kernel with real NUMA nodes (docs/design/numa-vm.md).
//!
//! `x86_numa_guest` boots one x86 guest (TCG) of 8 vCPUs in 2 sockets of 2 NUMA nodes (512 MiB
//! each, distances 10/12/20) and runs this same test binary in it (`in_guest`, ignored on the
//! host), on the guest's own kernel: containerd with NRI and runc as installed by the e2e setup,
//! the agent in NRI mode reading the guest's live `/sys` (no `--fold-cpus-to-host`), with
//! memory topology on. `arm64_numa_guest` does the same in an arm64 guest shaped like a small
//! Kunpeng (2 sockets of 2 clusters of 2 cores, 2 NUMA nodes) with this test binary built for
//! aarch64 (`arm64_in_guest`), on Debian's arm64 containerd and runc. The checks themselves are
//! `tap_e2e::numa_guest`. The guest writes what it saw to `report.json` in the exchange
//! folder; the host test fails with the guest's log when any check failed.

use anyhow::{bail, ensure, Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use tap_e2e::numa_guest::{self, Checks, Scenarios};
use tap_e2e::util;
use tap_e2e::vm::{self, Arch, Shape};

// ---- host side ---------------------------------------------------------------------------------

#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn x86_numa_guest() -> Result<()> {
    util::require_e2e_tier();
    let agent = util::agent_binary()?;
    let touch = build_toucher()?;
    let exe = std::env::current_exe()?;
    let script = format!(
        "x=$(dirname \"$0\")\n\
         export TAP_E2E=1 TAP_IN_GUEST=1 TAP_AGENT_BIN={agent} TAP_TOUCH_BIN={touch} \
         TAP_GUEST_REPORT=$x/report.json RUST_BACKTRACE=1 NO_COLOR=1\n\
         cd {ws}\n\
         exec {exe} --ignored --exact in_guest --nocapture --test-threads=1\n",
        agent = agent.display(),
        touch = touch.display(),
        ws = util::workspace_root().display(),
        exe = exe.display(),
    );
    let shape = Shape::x86_two_sockets_four_nodes();
    let dir = vm::exchange_dir()?;
    boot_and_check(Arch::X86, &shape, &dir, &script, Duration::from_secs(900))
}

/// Boots the guest, runs `script` in it and fails with the guest's log and console when its
/// checks failed; prints the wall time and the guest's report either way.
fn boot_and_check(
    arch: Arch,
    shape: &Shape,
    dir: &Path,
    script: &str,
    timeout: Duration,
) -> Result<()> {
    let run = vm::run(arch, shape, dir, script, timeout)?;
    let report = std::fs::read_to_string(run.dir.join("report.json")).unwrap_or_default();
    // The init's own lines: when the guest was up, when it was done.
    let init: Vec<&str> = run
        .console
        .lines()
        .filter(|l| l.starts_with("GUEST:"))
        .collect();
    println!(
        "{arch:?} guest ran {:.1} s wall, rc {:?}\n{}\nreport: {report}",
        run.wall.as_secs_f64(),
        run.rc,
        init.join("\n")
    );
    if run.rc != Some(0) {
        bail!(
            "the guest's checks failed (rc {:?}):\n--- run.log\n{}\n--- console (last 40 lines)\n{}",
            run.rc,
            run.log,
            tail(&run.console, 40)
        );
    }
    let _ = std::fs::remove_dir_all(&run.dir);
    Ok(())
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The memory toucher (`e2e/vm/touch.rs`), static so it runs in a busybox container.
fn build_toucher() -> Result<PathBuf> {
    let dir = PathBuf::from(format!("/var/tmp/tap-touch-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let out = dir.join("tap-touch");
    let src = util::workspace_root().join("e2e/vm/touch.rs");
    let st = Command::new("rustc")
        .args([
            "-O",
            "-C",
            "target-feature=+crt-static",
            "--edition",
            "2021",
        ])
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .status()
        .context("running rustc")?;
    ensure!(st.success(), "building {} failed", src.display());
    Ok(out)
}

// ---- guest side --------------------------------------------------------------------------------

#[test]
#[ignore = "runs inside the NUMA guest that x86_numa_guest boots"]
fn in_guest() -> Result<()> {
    numa_guest::main_in_guest(Checks::X86)
}

#[test]
#[ignore = "runs inside the arm64 NUMA guest that arm64_numa_guest boots"]
fn arm64_in_guest() -> Result<()> {
    numa_guest::main_in_guest(Checks::Arm64(scenarios()?))
}

// ---- arm64 guest -------------------------------------------------------------------------------

/// Where hack/build-arm64.sh leaves what it built.
const ARM64_OUT: &str = "/var/cache/kunpeng-tap/arm64/out";

/// The static arm64 agent: `TAP_ARM64_AGENT`, else what hack/build-arm64.sh built.
fn arm64_agent() -> Result<PathBuf> {
    let p = std::env::var_os("TAP_ARM64_AGENT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(ARM64_OUT).join("kunpeng-tap"));
    ensure!(
        p.exists(),
        "{} is missing: run hack/build-arm64.sh",
        p.display()
    );
    Ok(p)
}

/// Which arm64 scenarios run: `TAP_ARM64_GUEST_SCENARIOS` = `placement` (the default, CI's:
/// a Pod on a cluster and an exclusive grant) or `all` (docs/design/numa-vm.md).
fn scenarios() -> Result<Scenarios> {
    let name =
        std::env::var("TAP_ARM64_GUEST_SCENARIOS").unwrap_or_else(|_| "placement".to_string());
    Scenarios::parse(&name)
        .with_context(|| format!("TAP_ARM64_GUEST_SCENARIOS={name}: placement or all"))
}

/// What the arm64 guest runs, built for aarch64 from this checkout by `hack/build-arm64.sh
/// --guest` (run here too: seconds when nothing changed): this test binary, tap-touch and the
/// agent, under `bin/` of the exchange folder `dir`, the toucher alone in `touch/` (that folder
/// is mounted into containers).
fn arm64_guest_programs(dir: &Path) -> Result<()> {
    let script = util::workspace_root().join("hack/build-arm64.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("--guest")
        .output()
        .context("running hack/build-arm64.sh --guest")?;
    ensure!(
        out.status.success(),
        "hack/build-arm64.sh --guest failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let built = Path::new(ARM64_OUT).join("guest");
    for (name, sub) in [
        ("numa_vm", "bin"),
        ("kunpeng-tap", "bin"),
        ("tap-touch", "touch"),
    ] {
        std::fs::create_dir_all(dir.join(sub))?;
        let (from, to) = (built.join(name), dir.join(sub).join(name));
        if std::fs::hard_link(&from, &to).is_err() {
            std::fs::copy(&from, &to).with_context(|| format!("copying {}", from.display()))?;
        }
    }
    Ok(())
}

/// Real containers placed by the arm64 agent on an arm64 kernel with clusters and NUMA nodes:
/// containerd with NRI, runc and the agent (cluster affinity on) in the guest, this test
/// binary's `arm64_in_guest` checking cgroups and `numa_maps` there (`tap_e2e::numa_guest`).
#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn arm64_numa_guest() -> Result<()> {
    util::require_e2e_tier();
    let scenarios = scenarios()?;
    let dir = vm::exchange_dir()?;
    arm64_guest_programs(&dir)?;
    let script = format!(
        "x=$(dirname \"$0\")\n\
         export TAP_E2E=1 TAP_IN_GUEST=1 TAP_AGENT_BIN=$x/bin/kunpeng-tap \
         TAP_TOUCH_BIN=$x/touch/tap-touch TAP_GUEST_REPORT=$x/report.json \
         TAP_ARM64_GUEST_SCENARIOS={} RUST_BACKTRACE=1 NO_COLOR=1\n\
         exec $x/bin/numa_vm --ignored --exact arm64_in_guest --nocapture --test-threads=1\n",
        scenarios.name()
    );
    let shape = Shape::arm64_two_sockets_four_clusters();
    boot_and_check(
        Arch::Arm64,
        &shape,
        &dir,
        &script,
        Duration::from_secs(1800),
    )
}

/// The files of the guest's sysfs the agent reads, copied as they are (node meminfo: its
/// MemTotal line), with the kernel's `cpuN/nodeK` links: a fixture of the live arm64 kernel.
const CAPTURE_SYSFS: &str = r#"
S=/sys/devices/system; O=$x/sysfs/devices/system
mkdir -p $O/cpu $O/node
for f in online possible present isolated offline; do [ -f $S/cpu/$f ] && cat $S/cpu/$f > $O/cpu/$f; done
for c in $S/cpu/cpu[0-9]*; do
  n=${c##*/}; mkdir -p $O/cpu/$n/topology $O/cpu/$n/regs/identification
  for f in $c/topology/*; do [ -f $f ] && cat $f > $O/cpu/$n/topology/${f##*/}; done
  for f in midr_el1 revidr_el1; do [ -f $c/regs/identification/$f ] && cat $c/regs/identification/$f > $O/cpu/$n/regs/identification/$f; done
  for l in $c/node[0-9]*; do [ -e $l ] && ln -s ../../node/${l##*/} $O/cpu/$n/${l##*/}; done
done
for f in online possible has_cpu has_memory has_normal_memory; do [ -f $S/node/$f ] && cat $S/node/$f > $O/node/$f; done
for d in $S/node/node[0-9]*; do
  n=${d##*/}; mkdir -p $O/node/$n
  cat $d/cpulist > $O/node/$n/cpulist; cat $d/distance > $O/node/$n/distance
  grep MemTotal $d/meminfo > $O/node/$n/meminfo
done
"#;

/// The arm64 agent on a live arm64 kernel shaped like a Kunpeng (2 sockets, 2 clusters of 2
/// cores each, 2 NUMA nodes): its pool tree shows what QEMU was given, a small container with
/// cluster affinity lands on a cluster, and the guest's sysfs, captured, is the repository's
/// fixture `qemu-arm64-2s-4cluster-2numa` (and the host's agent explains it the same way).
#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn arm64_guest_topology() -> Result<()> {
    util::require_e2e_tier();
    let agent = arm64_agent()?;
    let dir = vm::exchange_dir()?;
    std::fs::copy(&agent, dir.join("kunpeng-tap"))?;
    let script = format!(
        "x=$(dirname \"$0\"); cd \"$x\"\n\
         ./kunpeng-tap --explain --topology-cluster-affinity --resource-policy=topology-aware > explain.txt 2> explain.err\n\
         echo $? > explain.rc\n\
         {CAPTURE_SYSFS}\n\
         exit $(cat explain.rc)\n"
    );
    let shape = Shape::arm64_two_sockets_four_clusters();
    let run = vm::run(Arch::Arm64, &shape, &dir, &script, Duration::from_secs(300))?;
    let explain = std::fs::read_to_string(dir.join("explain.txt")).unwrap_or_default();
    println!(
        "arm64 guest ran {:.1} s wall, rc {:?}\n{explain}",
        run.wall.as_secs_f64(),
        run.rc
    );
    ensure!(
        run.rc == Some(0),
        "the arm64 agent failed in the guest (rc {:?}):\n{}\n{}\n--- console\n{}",
        run.rc,
        run.log,
        std::fs::read_to_string(dir.join("explain.err")).unwrap_or_default(),
        tail(&run.console, 30)
    );
    check_arm64_explain(&explain)?;
    let captured = dir.join("sysfs");
    compare_with_fixture(&captured)?;
    // The host's (x86) agent reads the captured tree as the arm64 agent read the live one.
    let host = Command::new(util::agent_binary()?)
        .args([
            "--explain",
            "--topology-cluster-affinity",
            "--resource-policy=topology-aware",
        ])
        .arg(format!("--sysfs-root={}", captured.display()))
        .output()?;
    let host_text = String::from_utf8_lossy(&host.stdout);
    ensure!(
        host_text == explain,
        "the host's agent explains the captured sysfs differently:\n{host_text}\n--- guest:\n{explain}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn check_arm64_explain(explain: &str) -> Result<()> {
    for want in [
        "topology: 8 CPUs online, 2 sockets,",
        "2 NUMA nodes, 4 clusters, 8 cores",
        "numa node 0: cpus [0-3]",
        "numa node 1: cpus [4-7]",
        "distances [20 10]",
    ] {
        ensure!(
            explain.contains(want),
            "--explain lacks {want:?}:\n{explain}"
        );
    }
    // QEMU's `-cpu max` is no HiSilicon part: identified from the live midr_el1, not a Kunpeng.
    let cpu = explain
        .lines()
        .find(|l| l.starts_with("cpu:"))
        .context("no cpu: line")?;
    ensure!(
        cpu.contains("midr_el1") && !cpu.contains("Kunpeng"),
        "the guest's CPU line: {cpu}"
    );
    let clusters: Vec<&str> = explain
        .lines()
        .filter(|l| l.contains("[cluster] cpus"))
        .collect();
    ensure!(clusters.len() == 4, "4 cluster pools expected:\n{explain}");
    for (i, cpus) in ["0-1", "2-3", "4-5", "6-7"].iter().enumerate() {
        ensure!(
            clusters[i].contains(&format!("cpus {cpus} (2)")),
            "cluster {i} is not CPUs {cpus}: {}",
            clusters[i]
        );
    }
    let small = explain
        .lines()
        .find(|l| l.trim_start().starts_with("burstable-1-2"))
        .context("no burstable-1-2 sample")?;
    ensure!(
        small.contains("(cluster") && small.contains("fits one cluster"),
        "a 1-2 CPU container did not get a cluster: {small}"
    );
    Ok(())
}

/// The captured tree equals the fixture in the repository, file by file.
fn compare_with_fixture(captured: &Path) -> Result<()> {
    let fixture = util::fixture_dir("qemu-arm64-2s-4cluster-2numa");
    let (got, want) = (tree(captured)?, tree(&fixture)?);
    let missing: Vec<_> = want.keys().filter(|k| !got.contains_key(*k)).collect();
    let extra: Vec<_> = got.keys().filter(|k| !want.contains_key(*k)).collect();
    let differ: Vec<_> = want
        .iter()
        .filter(|(k, v)| got.get(*k).is_some_and(|g| !same_file(k, g, v)))
        .map(|(k, _)| k)
        .collect();
    ensure!(
        missing.is_empty() && extra.is_empty() && differ.is_empty(),
        "the guest's sysfs differs from fixtures/sysfs/qemu-arm64-2s-4cluster-2numa \
         (if QEMU or the kernel changed: python3 hack/sysfsdump.py dump {} \
         fixtures/sysfs/qemu-arm64-2s-4cluster-2numa): missing {missing:?}, extra {extra:?}, differ {differ:?}",
        captured.display()
    );
    Ok(())
}

/// Equal contents; a node's `meminfo` (its MemTotal line) within 1%: the kernel's own
/// allocations move it by a page or so from one boot to the next (513,344 kB, then 513,340 kB).
fn same_file(path: &str, got: &str, want: &str) -> bool {
    if !path.ends_with("/meminfo") {
        return got == want;
    }
    match (mem_total_kb(got), mem_total_kb(want)) {
        (Some(g), Some(w)) => g.abs_diff(w).saturating_mul(100) <= w,
        _ => got == want,
    }
}

fn mem_total_kb(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.contains("MemTotal:"))?;
    line.split_whitespace().rev().nth(1)?.parse().ok()
}

/// Relative path → content (a symlink: "-> target").
fn tree(root: &Path) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let p = e?.path();
            let rel = p.strip_prefix(root)?.display().to_string();
            let meta = std::fs::symlink_metadata(&p)?;
            if meta.file_type().is_symlink() {
                out.insert(rel, format!("-> {}", std::fs::read_link(&p)?.display()));
            } else if meta.is_dir() {
                stack.push(p);
            } else {
                out.insert(rel, std::fs::read_to_string(&p)?);
            }
        }
    }
    Ok(out)
}

/// The fixture comparison's tolerance: a page of MemTotal is noise, another size is not.
#[test]
fn meminfo_compared_within_one_percent() {
    let want = "Node 1 MemTotal:         513344 kB\n";
    let path = "devices/system/node/node1/meminfo";
    assert!(same_file(
        path,
        "Node 1 MemTotal:         513340 kB\n",
        want
    ));
    assert!(!same_file(
        path,
        "Node 1 MemTotal:         400000 kB\n",
        want
    ));
    assert!(!same_file(path, "garbage\n", want));
    assert!(!same_file(
        "devices/system/node/node1/cpulist",
        "0-3\n",
        "4-7\n"
    ));
}
