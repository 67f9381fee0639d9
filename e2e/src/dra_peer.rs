//! kubernetes-sigs/dra-driver-cpu, the peer the comparison runs next to kunpeng-tap's own DRA
//! driver on the cluster tier: its `dracpu` binary (driver `dra.cpu`), built unchanged from its
//! Go module by `hack/e2e/setup-dra-driver-cpu.sh`, run as a host process with the flags of its
//! Helm chart's DaemonSet (`--cpu-device-mode=grouped --group-by=numanode --v=4`) and the
//! cluster's admin kubeconfig.
//!
//! Its paths are fixed: the NRI socket `/var/run/nri/nri.sock`, the kubelet's registry
//! `/var/lib/kubelet/plugins_registry`, CDI specs in `/var/run/cdi`. It runs in a mount namespace
//! of its own in which the tier's containerd NRI folder, its kubelet's registry folder and its
//! containerd's CDI spec folder are bind-mounted there, so nothing of the host's is used. Its
//! kubelet plugin socket stays in `/var/lib/kubelet/plugins/dra.cpu/`, the path it tells the
//! kubelet: removed on drop, as are the mount points it had to create.

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The peer's driver name, and the name of the DeviceClass its chart installs.
pub const DRIVER: &str = "dra.cpu";
/// The release built and run.
pub const VERSION: &str = "v0.2.0";
/// Where it serves its kubelet plugin (and tells the kubelet to dial).
const PLUGIN_DIR: &str = "/var/lib/kubelet/plugins/dra.cpu";
/// Its fixed paths, bind-mounted from the tier's in its mount namespace.
const NRI_DIR: &str = "/run/nri";
const REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
const CDI_DIR: &str = "/run/cdi";

/// The binary setup-dra-driver-cpu.sh builds.
pub fn binary() -> PathBuf {
    PathBuf::from(format!("/var/cache/kunpeng-tap/bin/dracpu-{VERSION}"))
}

/// The DeviceClass of the peer's chart (`deployment/helm/dra-driver-cpu/templates/deviceclass.yaml`).
pub fn device_class() -> Value {
    crate::dra_accel::device_class_of(DRIVER)
}

/// The tier's folders and credentials the peer is given.
#[derive(Debug, Clone)]
pub struct PeerPaths {
    /// The folder of containerd's NRI socket (`nri.sock` in it).
    pub nri_dir: PathBuf,
    /// The kubelet's `<root-dir>/plugins_registry`.
    pub registry_dir: PathBuf,
    /// A folder containerd reads CDI specs from.
    pub cdi_dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub node: String,
}

/// The running peer; stopped with SIGINT (the signal it handles) on drop.
pub struct DraCpu {
    child: Option<Child>,
    log: PathBuf,
    /// Folders made on the host for it (removed on drop when empty).
    made: Vec<PathBuf>,
}

impl DraCpu {
    /// Starts `bin` and waits until its /healthz answers 200: it has registered with the
    /// kubelet (its start waits for that) and connects to NRI next.
    pub fn start(bin: &Path, paths: &PeerPaths, log: &Path) -> Result<DraCpu> {
        if !bin.exists() {
            bail!(
                "{} is missing: run hack/e2e/setup-dra-driver-cpu.sh",
                bin.display()
            );
        }
        let mut peer = DraCpu {
            child: None,
            log: log.to_path_buf(),
            made: Vec::new(),
        };
        for dir in [NRI_DIR, REGISTRY_DIR, CDI_DIR] {
            peer.mount_point(Path::new(dir))?;
        }
        // The peer makes its plugin folder's parent itself: removed after it when it was not there.
        let plugins = Path::new(PLUGIN_DIR).parent().context("plugin folder")?;
        if !plugins.exists() {
            peer.made.insert(0, plugins.to_path_buf());
        }
        let port = crate::util::free_port()?;
        peer.child = Some(spawn(bin, paths, port, log)?);
        peer.wait_healthy(port, Duration::from_secs(90))?;
        Ok(peer)
    }

    fn mount_point(&mut self, dir: &Path) -> Result<()> {
        if !dir.exists() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            self.made.push(dir.to_path_buf());
        }
        Ok(())
    }

    fn wait_healthy(&mut self, port: u16, timeout: Duration) -> Result<()> {
        let until = Instant::now() + timeout;
        loop {
            if let Ok(resp) = crate::util::http_get(port, "/healthz") {
                if resp.starts_with("HTTP/1.0 200") || resp.starts_with("HTTP/1.1 200") {
                    return Ok(());
                }
            }
            if let Some(ch) = self.child.as_mut() {
                if let Ok(Some(st)) = ch.try_wait() {
                    bail!("dracpu exited ({st}):\n{}", self.log_tail(40));
                }
            }
            if Instant::now() > until {
                bail!("dracpu not healthy in {timeout:?}:\n{}", self.log_tail(40));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_tail(&self, n: usize) -> String {
        let s = self.log_text();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

/// `unshare --mount` with the tier's folders bind-mounted on the peer's fixed paths, then the
/// peer with its chart's flags.
fn spawn(bin: &Path, p: &PeerPaths, port: u16, log: &Path) -> Result<Child> {
    let script = format!(
        "set -e; mount --bind \"$1\" {NRI_DIR}; mount --bind \"$2\" {REGISTRY_DIR}; \
         mount --bind \"$3\" {CDI_DIR}; shift 3; exec \"$@\""
    );
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c"])
        .arg(script)
        .arg("dracpu-mounts")
        .args([&p.nri_dir, &p.registry_dir, &p.cdi_dir])
        .arg(bin)
        .arg(format!("--kubeconfig={}", p.kubeconfig.display()))
        .arg(format!("--hostname-override={}", p.node))
        .arg(format!("--bind-address=127.0.0.1:{port}"))
        .args(["--v=4", "--cpu-device-mode=grouped", "--group-by=numanode"])
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .context("starting dracpu under unshare")
}

impl Drop for DraCpu {
    fn drop(&mut self) {
        if let Some(mut ch) = self.child.take() {
            // The peer handles SIGINT only (its NRI and kubelet plugins stop on it).
            let _ = Command::new("kill")
                .args(["-INT", &ch.id().to_string()])
                .status();
            let until = Instant::now() + Duration::from_secs(10);
            while Instant::now() < until && matches!(ch.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = ch.kill();
            let _ = ch.wait();
        }
        let _ = std::fs::remove_dir_all(PLUGIN_DIR);
        for dir in self.made.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}
