//! Where the sysfs fixtures are, for tests, benches and examples.
//!
//! Every fixture the repository's tests, benches, examples and e2e tier read ships in the
//! repository under `fixtures/sysfs/` (see the README there; the proc files that go with some
//! of them under `fixtures/proc/`), so a plain clone tests itself.
//! Code names a fixture by folder name and finds it here, never by a path of its own.

use std::path::{Path, PathBuf};

/// The repository's fixtures folder, `fixtures/sysfs` at the workspace root.
///
/// Cargo runs tests, benches and examples with `CARGO_MANIFEST_DIR` set to the package being
/// run (every workspace package sits one level below the root), so that checkout is preferred
/// to the one this crate was compiled in: a build directory shared between two clones can hold
/// this crate compiled in the other one (Cargo judges it fresh by modification times).
pub fn fixtures_root() -> PathBuf {
    let at_run = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(|dir| Path::new(&dir).join("../fixtures/sysfs"))
        .filter(|root| root.is_dir());
    at_run.unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/sysfs"))
}

/// The sysfs root of fixture `name`: `fixtures/sysfs/<name>` in the repository.
pub fn fixture_dir(name: &str) -> PathBuf {
    fixtures_root().join(name)
}

/// The proc root that goes with fixture `name` (`fixtures/proc/<name>`: the NVIDIA driver's
/// GPU files, where the fixture has them), for `--proc-root`.
pub fn proc_fixture_dir(name: &str) -> PathBuf {
    fixtures_root().join("../proc").join(name)
}

/// The names of every fixture the repository ships (its folders), sorted.
pub fn fixture_names() -> std::io::Result<Vec<String>> {
    let mut names = Vec::new();
    for e in std::fs::read_dir(fixtures_root())? {
        let e = e?;
        if e.file_type()?.is_dir() {
            names.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// Container `i` of the placement benchmarks' mix: 70% Burstable (100m-500m requested, twice
/// that as the limit), 20% BestEffort, 10% Guaranteed with 1 or 2 CPUs. The criterion bench
/// (`engine/benches/placement.rs`) and the instruction count (`engine/examples/
/// placement_workload.rs`, hack/bench-ir.sh) build their state from it, so both measure the
/// same thing.
pub fn bench_request(i: usize) -> crate::ContainerRequest {
    use crate::Qos;
    let k = i as u64;
    let (qos, request, limit) = match i % 10 {
        0 => (Qos::Guaranteed, 1000 + 1000 * (k / 10 % 2), None),
        1 | 2 => (Qos::BestEffort, 0, None),
        _ => {
            let r = 100 + (k * 37) % 400;
            (Qos::Burstable, r, Some(2 * r))
        }
    };
    crate::ContainerRequest {
        id: format!("c{i:04}"),
        namespace: "default".into(),
        container_name: "app".into(),
        qos: Some(qos),
        cpu_request_milli: request,
        cpu_limit_milli: if qos == Qos::Guaranteed {
            Some(request)
        } else {
            limit
        },
        ..Default::default()
    }
}

/// An engine of `policy` on `topo` with the first `n` containers of [`bench_request`] placed.
pub fn bench_engine(
    topo: std::sync::Arc<crate::Topology>,
    policy: crate::PolicyKind,
    n: usize,
) -> crate::Engine {
    let mut e = crate::Engine::new(
        topo,
        crate::EngineConfig {
            policy,
            ..Default::default()
        },
    );
    for i in 0..n {
        let _ = e.create(&bench_request(i));
    }
    e
}
