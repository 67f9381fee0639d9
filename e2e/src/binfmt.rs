//! A binfmt_misc handler that runs aarch64 ELF files on this host with qemu-user, for the tests
//! that run the arm64 agent (its image on containerd): registered for the test and removed
//! when the guard drops, failure included.
//!
//! The interpreter is hack/build-arm64.sh's chroot's `qemu-aarch64` (a static binary;
//! `TAP_QEMU_AARCH64` names another). It is registered with flag `F`: the kernel opens it at
//! registration, so it runs binaries inside containers whose root has no qemu.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const BINFMT: &str = "/proc/sys/fs/binfmt_misc";
/// Not the name hack/build-arm64.sh registers: the two may not remove each other's.
const NAME: &str = "kunpeng-tap-e2e-aarch64";
/// ELF64, little-endian, version 1, ET_EXEC or ET_DYN, EM_AARCH64 (0xb7), and its mask.
const MAGIC: &str = r"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00";
const MASK: &str =
    r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff";

/// The qemu-user interpreter for aarch64 the tests register.
pub fn qemu_aarch64() -> PathBuf {
    std::env::var_os("TAP_QEMU_AARCH64")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from("/var/cache/kunpeng-tap/arm64/chroot/usr/bin/qemu-aarch64")
        })
}

/// How aarch64 binaries run while the guard lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Aarch64Runner {
    /// This test registered the handler (and removes it on drop).
    Registered(PathBuf),
    /// The kernel ran them before (a handler of the system's, or an arm64 host): nothing done.
    AlreadyRunnable,
}

/// Keeps the handler registered; removes it on drop when it registered it.
pub struct Aarch64Handler {
    pub runner: Aarch64Runner,
}

fn runs(probe: &Path) -> bool {
    Command::new(probe)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn remove_ours() {
    let entry = Path::new(BINFMT).join(NAME);
    if entry.exists() {
        let _ = std::fs::write(&entry, "-1");
    }
}

impl Aarch64Handler {
    /// Makes aarch64 binaries runnable: `probe` (an aarch64 program that accepts `--version`)
    /// runs afterwards, or this fails saying why.
    pub fn ensure(probe: &Path) -> Result<Aarch64Handler> {
        remove_ours(); // a stale one of a killed run
        if runs(probe) {
            return Ok(Aarch64Handler {
                runner: Aarch64Runner::AlreadyRunnable,
            });
        }
        let qemu = qemu_aarch64();
        if !qemu.exists() {
            bail!(
                "{} missing: bash hack/build-arm64.sh makes it (or set TAP_QEMU_AARCH64)",
                qemu.display()
            );
        }
        if !Path::new(BINFMT).join("register").exists() {
            let st = Command::new("mount")
                .args(["-t", "binfmt_misc", "binfmt_misc", BINFMT])
                .status()
                .context("mounting binfmt_misc")?;
            if !st.success() {
                bail!("mount -t binfmt_misc failed ({st})");
            }
        }
        let line = format!(":{NAME}:M::{MAGIC}:{MASK}:{}:F", qemu.display());
        std::fs::write(Path::new(BINFMT).join("register"), line)
            .context("registering the aarch64 binfmt_misc handler")?;
        let guard = Aarch64Handler {
            runner: Aarch64Runner::Registered(qemu),
        };
        if !runs(probe) {
            bail!(
                "{} does not run with the handler {NAME} registered",
                probe.display()
            );
        }
        Ok(guard)
    }
}

impl Drop for Aarch64Handler {
    fn drop(&mut self) {
        if matches!(self.runner, Aarch64Runner::Registered(_)) {
            remove_ours();
        }
    }
}
