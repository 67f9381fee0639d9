//! Helpers the agent's test modules share.

use std::path::Path;
use std::process::{Command, Stdio};

/// What `kunpeng-tap --explain` prints on the sysfs and proc roots given, with `extra` flags;
/// fails the test when it exits non-zero.
pub fn explain(sysfs: &Path, proc: &Path, extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kunpeng-tap"))
        .arg(format!("--sysfs-root={}", sysfs.display()))
        .arg(format!("--proc-root={}", proc.display()))
        .args(extra)
        .arg("--explain")
        .env("TAP_LOG", "off")
        .stdin(Stdio::null())
        .output()
        .expect("running kunpeng-tap");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}: {}\n{stdout}\n{}",
        sysfs.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
