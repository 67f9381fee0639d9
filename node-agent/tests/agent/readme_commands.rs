//! The README's commands, run as written from the repository's root on a fresh clone (nothing
//! beside the checkout): the two `cargo run` lines must build, pick the agent binary, find the
//! fixture the repository ships and print what the README describes; the test command must name
//! the tiers `hack/test.sh` takes, and be what CI runs. (The install block runs against a real
//! kube-apiserver in the e2e tier: e2e/tests/e2e/helm.rs.)

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The lines of the first `sh` block after README heading `heading`.
fn readme_block(heading: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).unwrap();
    let section = readme
        .split(heading)
        .nth(1)
        .unwrap_or_else(|| panic!("README has a section {heading:?}"));
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .unwrap_or_else(|| panic!("a sh block in {heading:?}"));
    block.lines().map(str::to_string).collect()
}

/// The `cargo run` lines of the README's "The two commands" section, as words (no quoting in
/// them: plain words).
fn readme_cargo_runs() -> Vec<Vec<String>> {
    let lines = readme_block("## The two commands");
    assert_eq!(lines.len(), 2, "two commands: {lines:?}");
    lines
        .iter()
        .map(|line| {
            assert!(line.starts_with("cargo run"), "{line}");
            assert!(!line.contains(['"', '\'', '\\']), "{line}");
            line.split_whitespace().map(str::to_string).collect()
        })
        .collect()
}

/// Runs `words` (a cargo command) from the workspace root as a newcomer's shell would.
fn run_cargo(words: &[String]) -> Output {
    assert_eq!(words[0], "cargo");
    assert!(
        !words.iter().any(|w| w.contains("../shared")),
        "a README command must not need ../shared: {words:?}"
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
    assert!(
        out.status.success(),
        "`{}` failed ({}):\n{}\n{}",
        words.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn readme_first_command_runs_as_written() {
    let out = run_cargo(&readme_cargo_runs()[0]);
    let stdout = String::from_utf8_lossy(&out.stdout);
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

/// The second command reads this machine's own `/sys`: whatever it holds, the agent prints a
/// topology and the sample decisions.
#[test]
fn readme_second_command_reads_this_machine() {
    let out = run_cargo(&readme_cargo_runs()[1]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    for want in ["topology: ", "pool tree:", "policy: ", "sample decisions"] {
        assert!(
            stdout.contains(want),
            "{want:?} not in the output:\n{stdout}"
        );
    }
}

/// `bash hack/test.sh [a|b|...]`: the tiers named are the ones the script takes (its usage
/// line, printed for an unknown tier, says the same), and CI runs the command without a tier.
#[test]
fn readme_test_command_names_the_tiers_ci_runs() {
    let lines = readme_block("## Tests");
    assert_eq!(lines.len(), 1, "{lines:?}");
    let tiers = lines[0]
        .strip_prefix("bash hack/test.sh [")
        .and_then(|rest| rest.strip_suffix(']'))
        .unwrap_or_else(|| panic!("not `bash hack/test.sh [tiers]`: {}", lines[0]));
    let out = Command::new("bash")
        .current_dir(workspace_root())
        .args(["hack/test.sh", "no-such-tier"])
        .stdin(Stdio::null())
        .output()
        .expect("running bash");
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown tier is a usage error"
    );
    let usage = String::from_utf8_lossy(&out.stderr);
    assert!(
        usage.contains(&format!("usage: hack/test.sh [{tiers}]")),
        "README names [{tiers}], the script says: {usage}"
    );
    let ci = std::fs::read_to_string(workspace_root().join(".ci/run")).unwrap();
    assert!(
        ci.lines().any(|l| l.trim() == "exec bash hack/test.sh"),
        "CI does not run the README's test command:\n{ci}"
    );
}
