//! The README's first command, run as written from the repository's root on a fresh clone
//! (nothing beside the checkout): it must build, pick the agent binary, find the fixture the
//! repository ships, and print the topology and the sample decisions the README describes.

use std::path::PathBuf;
use std::process::{Command, Stdio};

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The first `cargo run` line of the README's "The two commands" section.
fn readme_first_command() -> Vec<String> {
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).unwrap();
    let section = readme
        .split("## The two commands")
        .nth(1)
        .expect("README has a section \"The two commands\"");
    let line = section
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("cargo run"))
        .expect("a `cargo run` line in that section");
    // No quoting in the command: plain words.
    assert!(!line.contains(['"', '\'', '\\']), "{line}");
    line.split_whitespace().map(str::to_string).collect()
}

#[test]
fn readme_first_command_runs_as_written() {
    let words = readme_first_command();
    assert_eq!(words[0], "cargo");
    assert!(
        !words.iter().any(|w| w.contains("../shared")),
        "the first command must not need ../shared: {words:?}"
    );
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(workspace_root())
        .args(&words[1..])
        // What a newcomer's shell has: no log override.
        .env_remove("TAP_LOG")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .expect("running cargo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "`{}` failed ({}):\n{stdout}\n{stderr}",
        words.join(" "),
        out.status
    );
    // What the README says the command shows.
    for want in [
        "topology: 96 CPUs online, 2 sockets, 4 dies, 4 NUMA nodes, 24 clusters",
        "numa node 0: cpus [0-23]",
        "numa node 1: cpus [24-47]",
        "numa node 2: cpus [48-71]",
        "numa node 3: cpus [72-95]",
        "pool tree:",
        "policy: topology-aware",
        "sample decisions",
    ] {
        assert!(
            stdout.contains(want),
            "{want:?} not in the output:\n{stdout}"
        );
    }
    // The GPU and its node.
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("pci") && l.trim_end().ends_with("numa node 1")),
        "no GPU on NUMA node 1 in:\n{stdout}"
    );
    // A Burstable 4/8 container gets one NUMA node's CPUs; a Guaranteed 4-CPU one 4 CPUs.
    let decision = |name: &str| -> String {
        let l = stdout
            .lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("no decision for {name} in:\n{stdout}"));
        // `  name -> cpus 0-23 (numa0): why`
        let cpus = l.split("-> cpus ").nth(1).unwrap();
        cpus[..cpus.find(' ').unwrap()].to_string()
    };
    let nodes = ["0-23", "24-47", "48-71", "72-95"];
    let b = decision("burstable-4-8");
    assert!(nodes.contains(&b.as_str()), "burstable-4-8 got {b}");
    let g = tap_engine::CpuSet::parse(&decision("guaranteed-4")).unwrap();
    assert_eq!(g.len(), 4, "guaranteed-4 got [{g}]");
}
