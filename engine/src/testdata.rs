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
