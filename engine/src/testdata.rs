//! Where the sysfs fixtures are, for tests, benches and examples.
//!
//! The repository ships the fixtures its README and its own tests need under `fixtures/sysfs/`
//! (see the README there); the rest of the collection lives in `shared/fixtures/sysfs` beside
//! the checkout (`../shared`), or where `TAP_FIXTURES` points.

use std::path::{Path, PathBuf};

/// The workspace root (the folder holding `fixtures/`).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The sysfs root of fixture `name`: `fixtures/sysfs/<name>` in the repository when it ships
/// that fixture, else `<TAP_FIXTURES or ../shared/fixtures/sysfs>/<name>`.
pub fn fixture_dir(name: &str) -> PathBuf {
    let in_repo = workspace_root().join("fixtures/sysfs").join(name);
    if in_repo.is_dir() {
        return in_repo;
    }
    std::env::var_os("TAP_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("../shared/fixtures/sysfs"))
        .join(name)
}
