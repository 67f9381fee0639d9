//! Small helpers shared by the e2e tests.

use std::path::PathBuf;

/// Whether the e2e tier is enabled (`TAP_E2E=1`).
pub fn enabled() -> bool {
    std::env::var("TAP_E2E").map(|v| v == "1").unwrap_or(false)
}

/// Returns true (and prints why) when the e2e tier is off, so a test can return early.
pub fn skip_unless_enabled(test: &str) -> bool {
    if enabled() {
        false
    } else {
        eprintln!("{test}: e2e tier off (set TAP_E2E=1 and run hack/test.sh e2e)");
        true
    }
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The shared sysfs fixtures folder (`../shared/fixtures/sysfs` beside the checkout).
pub fn fixtures_dir() -> PathBuf {
    std::env::var_os("TAP_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("../shared/fixtures/sysfs"))
}
