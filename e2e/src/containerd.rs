//! A private containerd (CRI and NRI enabled) for e2e tests, and a small CRI client.
//!
//! Installed by `hack/e2e/setup-containerd.sh` (containerd 1.7 from Debian trixie, runc and
//! busybox-static from bookworm, unpacked under [`INSTALL_ROOT`]; a busybox image tarball that
//! serves as both the pause image and the workload image). `TAP_CONTAINERD_ROOT` names another
//! root of the same layout, such as a containerd 2.x that `hack/e2e/setup-containerd2.sh` builds
//! (runc and the image stay the 1.7 install's); the config is written for the version
//! `containerd --version` there reports ([`installed_version`]): version 2 for 1.x, version 3
//! (the plugin ids containerd 2.0 renamed) for 2.x. Everything a [`Containerd`] uses is
//! under its own temp dir: sockets, root, state, runc root; nothing touches `/run/containerd`.
//! Dropping it deletes every container (runc), kills its shims and the daemon, unmounts what
//! is left and removes the dir.
//!
//! ```text
//! let ctd = Containerd::start(ContainerdOptions::default())?;
//! let mut cri = ctd.cri().await?;
//! let pod = PodSpec::new("web", CgroupQos::Burstable);
//! let sb = cri.run_pod(&pod).await?;
//! let id = cri.run_container(&sb, &pod, &ContainerSpec::cpus("app", 4000, Some(8000))).await?;
//! let spec_cpus = cri.spec_cpuset(&id).await?;
//! let cg_cpus = cgroup_cpuset(cri.pid(&id).await?)?;
//! ```

use anyhow::{bail, Context, Result};
use k8s_cri::v1 as cri;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use tonic::transport::{Channel, Endpoint, Uri};

/// Where setup-containerd.sh unpacks containerd, runc and busybox.
pub const INSTALL_ROOT: &str = "/var/cache/kunpeng-tap/containerd/root";
/// The image tarball setup-containerd.sh builds.
pub const IMAGE_TARBALL: &str = "/var/cache/kunpeng-tap/containerd/images/busybox.tar";
/// Sandbox (pause) image: busybox running `sleep`.
pub const PAUSE_IMAGE: &str = "tap.local/pause:1";
/// Workload image (same layers).
pub const BUSYBOX_IMAGE: &str = "tap.local/busybox:1";
/// The CRI namespace.
pub const K8S_NAMESPACE: &str = "k8s.io";

fn install_root() -> PathBuf {
    std::env::var_os("TAP_CONTAINERD_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(INSTALL_ROOT))
}

/// A containerd version as printed, with its (major, minor).
pub type Version = (String, (u64, u64));

/// containerd's version at the install root, as `containerd --version` prints it: `1.7.24~ds1`,
/// `v2.3.7`; with its (major, minor).
pub fn installed_version() -> Result<Version> {
    static VERSION: std::sync::OnceLock<std::result::Result<Version, String>> =
        std::sync::OnceLock::new();
    VERSION
        .get_or_init(|| {
            let bin = install_root().join("usr/bin/containerd");
            let out = Command::new(&bin)
                .arg("--version")
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("running {} --version: {e}", bin.display()))?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            // `containerd github.com/containerd/containerd/v2 v2.3.7 <revision>`
            let version = text
                .split_whitespace()
                .nth(2)
                .ok_or_else(|| format!("{} --version printed {text:?}", bin.display()))?
                .to_string();
            let mm = parse_major_minor(&version)
                .ok_or_else(|| format!("containerd version {version:?} not understood"))?;
            Ok((version, mm))
        })
        .clone()
        .map_err(anyhow::Error::msg)
}

/// `v2.3.7`, `1.7.24~ds1`, `2.4.2+unknown` -> (major, minor).
fn parse_major_minor(version: &str) -> Option<(u64, u64)> {
    let mut parts = version
        .trim_start_matches('v')
        .split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// Fails (never skips) when the setup script has not run.
pub fn check_installed() -> Result<()> {
    let root = install_root();
    for bin in [
        "usr/bin/containerd",
        "usr/bin/containerd-shim-runc-v2",
        "usr/bin/ctr",
        "usr/sbin/runc",
    ] {
        let p = root.join(bin);
        if !p.exists() {
            bail!(
                "{} is missing: run hack/e2e/setup-containerd.sh",
                p.display()
            );
        }
    }
    if !Path::new(IMAGE_TARBALL).exists() {
        bail!("{IMAGE_TARBALL} is missing: run hack/e2e/setup-containerd.sh");
    }
    Ok(())
}

/// PATH with the unpacked binaries first (containerd finds the shim, the shim finds runc).
fn tool_path() -> String {
    let root = install_root();
    format!(
        "{}:{}:{}",
        root.join("usr/bin").display(),
        root.join("usr/sbin").display(),
        std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into())
    )
}

#[derive(Debug, Clone)]
pub struct ContainerdOptions {
    /// Whether containerd serves NRI plugins (socket at [`Containerd::nri_socket`]).
    pub nri: Nri,
    /// containerd's `plugin_request_timeout` for NRI.
    pub nri_request_timeout: Duration,
    /// Import [`IMAGE_TARBALL`] after start.
    pub import_image: bool,
    /// A CNI network (conflist JSON) for Pods without host networking: the plugins are the
    /// ones setup-containerd.sh unpacks (`usr/lib/cni`), network namespaces are mounted under
    /// the state dir. `None`: host-network Pods only.
    pub cni_conflist: Option<String>,
}

impl Default for ContainerdOptions {
    fn default() -> Self {
        ContainerdOptions {
            nri: Nri::On,
            nri_request_timeout: Duration::from_secs(2),
            import_image: true,
            cni_conflist: None,
        }
    }
}

impl ContainerdOptions {
    /// The defaults with NRI off (the proxies' tests).
    pub fn without_nri() -> Self {
        ContainerdOptions {
            nri: Nri::Off,
            ..Default::default()
        }
    }

    /// The defaults for an agent in `mode`: NRI on for the plugin, off behind the CRI proxy.
    pub fn for_agent(mode: AgentMode) -> Self {
        match mode {
            AgentMode::Nri => ContainerdOptions::default(),
            AgentMode::CriProxy => ContainerdOptions::without_nri(),
        }
    }
}

/// Which way the agent meets containerd: as its NRI plugin, or as a CRI proxy in front of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentMode {
    Nri,
    CriProxy,
}

/// The agent's topology flags: a sysfs fixture folded onto this host, or this host's own.
fn sysfs_args(fixture: Option<&str>) -> Vec<String> {
    match fixture {
        Some(f) => vec![
            format!("--sysfs-root={}", crate::util::fixture_dir(f).display()),
            "--fold-cpus-to-host".into(),
        ],
        None => vec!["--sysfs-root=/sys".into()],
    }
}

/// Whether containerd serves NRI plugins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nri {
    On,
    Off,
}

/// A running private containerd. Kill-on-drop, with everything it started.
pub struct Containerd {
    dir: PathBuf,
    opts: ContainerdOptions,
    child: Option<Child>,
}

impl Containerd {
    /// Writes a config under a fresh temp dir, starts containerd and waits for CRI.
    pub fn start(opts: ContainerdOptions) -> Result<Containerd> {
        check_installed()?;
        let dir = crate::util::temp_dir("tap-ctd")?;
        let mut c = Containerd {
            dir,
            opts,
            child: None,
        };
        c.write_config()?;
        c.spawn()?;
        if c.opts.import_image {
            c.import_image(Path::new(IMAGE_TARBALL))?;
        }
        Ok(c)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The daemon's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// The CRI (and containerd API) socket.
    pub fn cri_socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    /// The agent's flags for CRI proxy mode in front of this containerd: its proxy socket at
    /// `proxy`, the fixture `fixture` folded onto the host (`None`: this host's own sysfs), its
    /// state in `state_dir`, a 2 s graceful stop. Callers add their own flags (a policy, say).
    pub fn cri_proxy_agent_args(
        &self,
        proxy: &Path,
        fixture: Option<&str>,
        state_dir: &Path,
    ) -> Vec<String> {
        let mut args = vec![
            "--container-runtime-mode=Containerd".into(),
            format!("--runtime-proxy-endpoint={}", proxy.display()),
            format!(
                "--container-runtime-service-endpoint={}",
                self.cri_socket().display()
            ),
        ];
        args.extend(sysfs_args(fixture));
        args.extend([
            format!("--state-dir={}", state_dir.display()),
            "--graceful-timeout=2s".into(),
        ]);
        args
    }

    /// The agent's flags in `mode`: [`Containerd::nri_agent_args`], or
    /// [`Containerd::cri_proxy_agent_args`] with the proxy's socket at `proxy`.
    pub fn agent_args(
        &self,
        mode: AgentMode,
        proxy: &Path,
        fixture: Option<&str>,
        state_dir: &Path,
    ) -> Vec<String> {
        match mode {
            AgentMode::Nri => self.nri_agent_args(fixture, state_dir),
            AgentMode::CriProxy => self.cri_proxy_agent_args(proxy, fixture, state_dir),
        }
    }

    /// The agent's flags for NRI mode on this containerd: its NRI socket, the topology of
    /// `fixture` folded onto this host (`None`: this host's own), its state in `state_dir`.
    pub fn nri_agent_args(&self, fixture: Option<&str>, state_dir: &Path) -> Vec<String> {
        let mut args = vec![
            "--container-runtime-mode=NRI".into(),
            format!("--nri-socket-path={}", self.nri_socket().display()),
        ];
        args.extend(sysfs_args(fixture));
        args.push(format!("--state-dir={}", state_dir.display()));
        args
    }

    /// The only folder containerd reads CDI specs from (empty unless a DRA driver under test
    /// writes there: containers that name no CDI device are not affected).
    pub fn cdi_dir(&self) -> PathBuf {
        self.dir.join("cdi")
    }

    /// The NRI socket plugins connect to (alone in its folder, which a plugin's Pod mounts).
    pub fn nri_socket(&self) -> PathBuf {
        self.dir.join("nri/nri.sock")
    }

    /// containerd's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("containerd.log")
    }

    /// The last `n` lines of the log, for failure messages.
    pub fn log_tail(&self, n: usize) -> String {
        let s = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    fn runc_root(&self) -> PathBuf {
        self.dir.join("runc")
    }

    fn write_config(&self) -> Result<()> {
        let (_, (major, minor)) = installed_version()?;
        let cfg = if major >= 2 {
            self.config_v3(minor)
        } else {
            self.config_v2()
        };
        let d = &self.dir;
        std::fs::write(d.join("config.toml"), cfg)?;
        for sub in [
            "cni-bin",
            "cni-conf",
            "nri-plugins",
            "nri-conf",
            "nri",
            "cdi",
        ] {
            std::fs::create_dir_all(d.join(sub))?;
        }
        if let Some(conf) = &self.opts.cni_conflist {
            std::fs::write(d.join("cni-conf/10-tap-e2e.conflist"), conf)?;
        }
        Ok(())
    }

    /// The CNI plugins' folder: the install's (a network of its own) or an empty one.
    fn cni_bin(&self) -> PathBuf {
        if self.opts.cni_conflist.is_some() {
            install_root().join("usr/lib/cni")
        } else {
            self.dir.join("cni-bin")
        }
    }

    /// The runc binary the shims run. TAP_RUNC_BINARY: a wrapper for debugging runc failures.
    fn runc_bin() -> String {
        std::env::var("TAP_RUNC_BINARY")
            .unwrap_or_else(|_| install_root().join("usr/sbin/runc").display().to_string())
    }

    /// containerd 2.x: config version 3, where CRI is three plugins (`io.containerd.cri.v1.images`,
    /// `io.containerd.cri.v1.runtime`, `io.containerd.grpc.v1.cri`) and the sandbox image is a
    /// pinned image; the same settings as [`Containerd::config_v2`] otherwise.
    fn config_v3(&self, minor: u64) -> String {
        let d = self.dir.display();
        // `bin_dir` is deprecated from 2.1 on for `bin_dirs`.
        let cni_bin = if minor >= 1 {
            format!("bin_dirs = [\"{}\"]", self.cni_bin().display())
        } else {
            format!("bin_dir = \"{}\"", self.cni_bin().display())
        };
        let runtime = "plugins.'io.containerd.cri.v1.runtime'";
        format!(
            r#"{head}[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"
[{runtime}]
{cri}  [{runtime}.cni]
    {cni_bin}
    conf_dir = "{d}/cni-conf"
  [{runtime}.containerd]
    default_runtime_name = "runc"
{runc}[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
{nri}"#,
            head = self.config_head(3),
            cri = self.cri_settings(),
            runc = self.runc_settings(&format!("{runtime}.containerd")),
            nri = self.nri_settings("'"),
        )
    }

    /// containerd 1.x: config version 2, CRI as one plugin (`io.containerd.grpc.v1.cri`).
    fn config_v2(&self) -> String {
        let d = self.dir.display();
        let cri = "plugins.\"io.containerd.grpc.v1.cri\"";
        format!(
            r#"{head}[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
{settings}  [{cri}.cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{d}/cni-conf"
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
{runc}{nri}"#,
            head = self.config_head(2),
            settings = self.cri_settings(),
            cni_bin = self.cni_bin().display(),
            runc = self.runc_settings(&format!("{cri}.containerd")),
            nri = self.nri_settings("\""),
        )
    }

    /// The config's first lines: its version, folders, sockets and log level.
    fn config_head(&self, version: u32) -> String {
        let (d, sock) = (&self.dir, self.cri_socket());
        format!(
            r#"version = {version}
root = "{root}"
state = "{state}"
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[debug]
  level = "info"
"#,
            root = d.join("root").display(),
            state = d.join("state").display(),
            sock = sock.display(),
        )
    }

    /// The CRI runtime's settings (either config version names its table differently).
    fn cri_settings(&self) -> String {
        format!(
            r#"  enable_cdi = true
  cdi_spec_dirs = ["{d}/cdi"]
  disable_apparmor = true
  # Lowering oom_score_adj (the sandbox's -998) is refused in unprivileged or nested hosts.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
"#,
            d = self.dir.display()
        )
    }

    /// runc as the runtime, under the CRI `containerd` table `table`.
    fn runc_settings(&self, table: &str) -> String {
        format!(
            r#"    [{table}.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{table}.runtimes.runc.options]
        Root = "{runc}"
        SystemdCgroup = false
        BinaryName = "{runc_bin}"
"#,
            runc = self.runc_root().display(),
            runc_bin = Self::runc_bin(),
        )
    }

    /// The NRI plugin's table, its name quoted with `q`.
    fn nri_settings(&self, q: &str) -> String {
        format!(
            r#"[plugins.{q}io.containerd.nri.v1.nri{q}]
  disable = {disable}
  socket_path = "{nri}"
  plugin_path = "{d}/nri-plugins"
  plugin_config_path = "{d}/nri-conf"
  plugin_registration_timeout = "5s"
  plugin_request_timeout = "{req}ms"
  disable_connections = false
"#,
            d = self.dir.display(),
            disable = self.opts.nri == Nri::Off,
            nri = self.nri_socket().display(),
            req = self.opts.nri_request_timeout.as_millis(),
        )
    }

    fn spawn(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        let child = Command::new(install_root().join("usr/bin/containerd"))
            .arg("--config")
            .arg(self.dir.join("config.toml"))
            .env("PATH", tool_path())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting containerd")?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(ch) = self.child.as_mut() {
                if let Some(st) = ch.try_wait()? {
                    bail!("containerd exited ({st}):\n{}", self.log_tail(30));
                }
            }
            if self.cri_socket().exists()
                && (self.opts.nri == Nri::Off || self.nri_socket().exists())
                && self.ctr(&["version"]).is_ok()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("containerd did not come up:\n{}", self.log_tail(30));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs `ctr` against this containerd (namespace k8s.io); stdout on success.
    pub fn ctr(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(install_root().join("usr/bin/ctr"))
            .arg("--address")
            .arg(self.cri_socket())
            .args(["--namespace", K8S_NAMESPACE])
            .args(args)
            .env("PATH", tool_path())
            .stdin(Stdio::null())
            .output()
            .context("running ctr")?;
        if !out.status.success() {
            bail!(
                "ctr {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `ctr images import` of a docker-archive or OCI tarball.
    pub fn import_image(&self, tarball: &Path) -> Result<()> {
        let p = tarball.to_string_lossy().into_owned();
        self.ctr(&["images", "import", &p])?;
        Ok(())
    }

    /// Stops the daemon (SIGTERM, then SIGKILL after 10 s). Containers and shims keep running.
    pub fn stop_daemon(&mut self) -> Result<()> {
        if let Some(mut ch) = self.child.take() {
            signal(ch.id() as i32, "TERM");
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if ch.try_wait()?.is_some() {
                    break;
                }
                if Instant::now() > deadline {
                    let _ = ch.kill();
                    let _ = ch.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// Kills the daemon at once (SIGKILL); its containers live on in their shims.
    pub fn kill_daemon(&mut self) {
        crate::util::stop_child(&mut self.child);
    }

    /// Restarts the daemon on the same dirs (containers survive, as on a real node).
    pub fn restart(&mut self) -> Result<()> {
        self.stop_daemon()?;
        self.spawn()
    }

    /// A CRI client on this containerd.
    pub async fn cri(&self) -> Result<Cri> {
        Cri::connect(&self.cri_socket()).await
    }

    /// Deletes every container runc knows under our root (kills its processes).
    fn delete_containers(&self) {
        let root = self.runc_root().join(K8S_NAMESPACE);
        let Ok(entries) = std::fs::read_dir(&root) else {
            return;
        };
        for e in entries.flatten() {
            let id = e.file_name().to_string_lossy().into_owned();
            let _ = Command::new(install_root().join("usr/sbin/runc"))
                .arg("--root")
                .arg(&root)
                .args(["delete", "--force", &id])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }

    /// Pids of the shims this containerd started (their command line names our socket).
    fn shim_pids(&self) -> Vec<i32> {
        let needle = self.cri_socket().to_string_lossy().into_owned();
        let mut out = Vec::new();
        let Ok(rd) = std::fs::read_dir("/proc") else {
            return out;
        };
        for e in rd.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
                continue;
            };
            let cmd = String::from_utf8_lossy(&cmd);
            if cmd.contains("containerd-shim") && cmd.contains(&needle) {
                out.push(pid);
            }
        }
        out
    }
}

fn signal(pid: i32, sig: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.delete_containers();
        let shims = self.shim_pids();
        crate::util::stop_child(&mut self.child);
        for pid in shims {
            signal(pid, "KILL");
        }
        // Shims are reaped by init; give them a moment to release their mounts.
        std::thread::sleep(Duration::from_millis(200));
        crate::util::unmount_under(&self.dir);
        crate::util::remove_unless_kept(&self.dir);
    }
}

// ---------------------------------------------------------------------------------------------
// CRI

/// The QoS class, expressed the way the kubelet does: in the Pod's cgroup parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupQos {
    Guaranteed,
    Burstable,
    BestEffort,
}

/// A Pod sandbox to run (host network: no CNI needed).
#[derive(Debug, Clone)]
pub struct PodSpec {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub labels: HashMap<String, String>,
    pub annotations: HashMap<String, String>,
    /// e.g. `/tap-e2e/kubepods/burstable/pod<uid>`.
    pub cgroup_parent: String,
}

/// The cgroup root all e2e Pods live under (removed by [`remove_cgroup_tree`]).
pub const CGROUP_ROOT: &str = "/tap-e2e";

static POD_SEQ: AtomicU32 = AtomicU32::new(0);

impl PodSpec {
    /// A Pod with a unique uid and the kubelet-style cgroup parent of its QoS class.
    pub fn new(name: &str, qos: CgroupQos) -> PodSpec {
        let uid = format!(
            "{:08x}-0000-4000-8000-{:012x}",
            std::process::id(),
            POD_SEQ.fetch_add(1, Ordering::SeqCst)
        );
        let class = match qos {
            CgroupQos::Guaranteed => "".to_string(),
            CgroupQos::Burstable => "burstable/".to_string(),
            CgroupQos::BestEffort => "besteffort/".to_string(),
        };
        PodSpec {
            name: name.to_string(),
            namespace: "default".into(),
            uid: uid.clone(),
            labels: HashMap::new(),
            annotations: HashMap::new(),
            cgroup_parent: format!("{CGROUP_ROOT}/kubepods/{class}pod{uid}"),
        }
    }

    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.labels.insert(k.into(), v.into());
        self
    }

    pub fn annotation(mut self, k: &str, v: &str) -> Self {
        self.annotations.insert(k.into(), v.into());
        self
    }

    fn config(&self) -> cri::PodSandboxConfig {
        let mut labels = self.labels.clone();
        labels.insert("io.kubernetes.pod.name".into(), self.name.clone());
        labels.insert("io.kubernetes.pod.namespace".into(), self.namespace.clone());
        labels.insert("io.kubernetes.pod.uid".into(), self.uid.clone());
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: self.name.clone(),
                uid: self.uid.clone(),
                namespace: self.namespace.clone(),
                attempt: 0,
            }),
            labels,
            annotations: self.annotations.clone(),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: self.cgroup_parent.clone(),
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(cri::NamespaceOption {
                        network: cri::NamespaceMode::Node as i32,
                        pid: cri::NamespaceMode::Container as i32,
                        ipc: cri::NamespaceMode::Pod as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

/// A container to create: CPU in milli-CPU as the kubelet converts it (shares, quota, period).
#[derive(Debug, Clone)]
pub struct ContainerSpec {
    pub name: String,
    pub image: String,
    pub command: Vec<String>,
    pub cpu_request_milli: Option<u64>,
    pub cpu_limit_milli: Option<u64>,
    pub memory_limit_bytes: Option<i64>,
    pub labels: HashMap<String, String>,
    pub annotations: HashMap<String, String>,
    pub env: Vec<(String, String)>,
    /// Read-only bind mounts: (host path, container path).
    pub mounts: Vec<(String, String)>,
    /// Sent instead of the resources computed from the fields above (fault tests).
    pub raw_resources: Option<cri::LinuxContainerResources>,
}

impl ContainerSpec {
    /// A busybox `sleep` container with no resources (BestEffort).
    pub fn sleeper(name: &str) -> ContainerSpec {
        ContainerSpec {
            name: name.into(),
            image: BUSYBOX_IMAGE.into(),
            command: vec!["/bin/sleep".into(), "3600".into()],
            cpu_request_milli: None,
            cpu_limit_milli: None,
            memory_limit_bytes: None,
            labels: HashMap::new(),
            annotations: HashMap::new(),
            env: Vec::new(),
            mounts: Vec::new(),
            raw_resources: None,
        }
    }

    /// A sleeper with a CPU request and optional limit.
    pub fn cpus(name: &str, request_milli: u64, limit_milli: Option<u64>) -> ContainerSpec {
        ContainerSpec {
            cpu_request_milli: Some(request_milli),
            cpu_limit_milli: limit_milli,
            ..ContainerSpec::sleeper(name)
        }
    }

    /// The CRI resources the kubelet would send.
    pub fn resources(&self) -> cri::LinuxContainerResources {
        if let Some(r) = &self.raw_resources {
            return r.clone();
        }
        let shares = match self.cpu_request_milli {
            Some(m) if m > 0 => (m * 1024 / 1000).max(2) as i64,
            _ => 2,
        };
        let (quota, period) = match self.cpu_limit_milli {
            Some(l) => ((l * 100_000 / 1000) as i64, 100_000),
            None => (0, 0),
        };
        cri::LinuxContainerResources {
            cpu_shares: shares,
            cpu_quota: quota,
            cpu_period: period,
            memory_limit_in_bytes: self.memory_limit_bytes.unwrap_or(0),
            ..Default::default()
        }
    }

    fn config(&self) -> cri::ContainerConfig {
        cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: self.name.clone(),
                attempt: 0,
            }),
            image: Some(cri::ImageSpec {
                image: self.image.clone(),
                ..Default::default()
            }),
            command: self.command.clone(),
            envs: self
                .env
                .iter()
                .map(|(k, v)| cri::KeyValue {
                    key: k.clone(),
                    value: v.clone(),
                })
                .collect(),
            mounts: self
                .mounts
                .iter()
                .map(|(host, ctr)| cri::Mount {
                    host_path: host.clone(),
                    container_path: ctr.clone(),
                    readonly: true,
                    ..Default::default()
                })
                .collect(),
            labels: self.labels.clone(),
            annotations: self.annotations.clone(),
            linux: Some(cri::LinuxContainerConfig {
                resources: Some(self.resources()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

/// A CRI RuntimeService client over a unix socket.
pub struct Cri {
    rt: cri::runtime_service_client::RuntimeServiceClient<Channel>,
    sandboxes: HashMap<String, PodSpec>,
}

/// A tonic channel to a unix socket.
pub async fn unix_channel(path: &Path) -> Result<Channel> {
    let path = path.to_path_buf();
    let ch = Endpoint::try_from("http://localhost")?
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let s = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        }))
        .await
        .context("connecting to the CRI socket")?;
    Ok(ch)
}

impl Cri {
    pub async fn connect(socket: &Path) -> Result<Cri> {
        let ch = unix_channel(socket).await?;
        let mut rt = cri::runtime_service_client::RuntimeServiceClient::new(ch);
        rt.version(cri::VersionRequest {
            version: "v1".into(),
        })
        .await
        .context("CRI Version")?;
        Ok(Cri {
            rt,
            sandboxes: HashMap::new(),
        })
    }

    /// The raw client, for calls this wrapper does not cover.
    /// The containers that have not exited.
    pub async fn live_containers(&mut self) -> Result<Vec<cri::Container>> {
        let list = self
            .raw()
            .list_containers(cri::ListContainersRequest::default())
            .await?
            .into_inner()
            .containers;
        let exited = cri::ContainerState::ContainerExited as i32;
        Ok(list.into_iter().filter(|c| c.state != exited).collect())
    }

    pub fn raw(&mut self) -> &mut cri::runtime_service_client::RuntimeServiceClient<Channel> {
        &mut self.rt
    }

    /// RunPodSandbox; returns the sandbox id.
    pub async fn run_pod(&mut self, pod: &PodSpec) -> Result<String> {
        let r = self
            .rt
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(pod.config()),
                runtime_handler: String::new(),
            })
            .await
            .with_context(|| format!("RunPodSandbox {}", pod.name))?
            .into_inner();
        self.sandboxes.insert(r.pod_sandbox_id.clone(), pod.clone());
        Ok(r.pod_sandbox_id)
    }

    /// The CreateContainerRequest the kubelet would send for `c` in a sandbox made by
    /// [`Cri::run_pod`] (built ahead of a timed call).
    pub fn create_request(
        &self,
        sandbox: &str,
        c: &ContainerSpec,
    ) -> Result<cri::CreateContainerRequest> {
        let pod = self
            .sandboxes
            .get(sandbox)
            .context("unknown sandbox (not run through this client)")?;
        Ok(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox.to_string(),
            config: Some(c.config()),
            sandbox_config: Some(pod.config()),
        })
    }

    /// CreateContainer in a sandbox made by [`Cri::run_pod`]; returns the container id.
    pub async fn create_container(&mut self, sandbox: &str, c: &ContainerSpec) -> Result<String> {
        let req = self.create_request(sandbox, c)?;
        let pod = self.sandboxes.get(sandbox).map(|p| p.name.clone());
        let r = self
            .rt
            .create_container(req)
            .await
            .with_context(|| format!("CreateContainer {}/{}", pod.unwrap_or_default(), c.name))?
            .into_inner();
        Ok(r.container_id)
    }

    pub async fn start_container(&mut self, id: &str) -> Result<()> {
        self.rt
            .start_container(cri::StartContainerRequest {
                container_id: id.to_string(),
            })
            .await
            .with_context(|| format!("StartContainer {id}"))?;
        Ok(())
    }

    /// Create and start.
    pub async fn run_container(&mut self, sandbox: &str, c: &ContainerSpec) -> Result<String> {
        let id = self.create_container(sandbox, c).await?;
        self.start_container(&id).await?;
        Ok(id)
    }

    /// StopContainer with no grace period (SIGKILL at once).
    pub async fn stop_container(&mut self, id: &str) -> Result<()> {
        self.rt
            .stop_container(cri::StopContainerRequest {
                container_id: id.to_string(),
                timeout: 0,
            })
            .await
            .with_context(|| format!("StopContainer {id}"))?;
        Ok(())
    }

    pub async fn remove_container(&mut self, id: &str) -> Result<()> {
        self.rt
            .remove_container(cri::RemoveContainerRequest {
                container_id: id.to_string(),
            })
            .await
            .with_context(|| format!("RemoveContainer {id}"))?;
        Ok(())
    }

    pub async fn update_resources(
        &mut self,
        id: &str,
        r: cri::LinuxContainerResources,
    ) -> Result<()> {
        self.rt
            .update_container_resources(cri::UpdateContainerResourcesRequest {
                container_id: id.to_string(),
                linux: Some(r),
                ..Default::default()
            })
            .await
            .with_context(|| format!("UpdateContainerResources {id}"))?;
        Ok(())
    }

    /// Stops and removes a sandbox (and its containers).
    pub async fn remove_pod(&mut self, sandbox: &str) -> Result<()> {
        self.rt
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: sandbox.to_string(),
            })
            .await
            .with_context(|| format!("StopPodSandbox {sandbox}"))?;
        self.rt
            .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: sandbox.to_string(),
            })
            .await
            .with_context(|| format!("RemovePodSandbox {sandbox}"))?;
        self.sandboxes.remove(sandbox);
        Ok(())
    }

    /// The ids of the running containers (not sandboxes).
    pub async fn list_running(&mut self) -> Result<Vec<String>> {
        let items = self
            .rt
            .list_containers(cri::ListContainersRequest {
                filter: Some(cri::ContainerFilter {
                    state: Some(cri::ContainerStateValue {
                        state: cri::ContainerState::ContainerRunning as i32,
                    }),
                    ..Default::default()
                }),
            })
            .await?
            .into_inner()
            .containers;
        Ok(items.into_iter().map(|c| c.id).collect())
    }

    /// Removes every sandbox the runtime knows.
    pub async fn remove_all_pods(&mut self) -> Result<()> {
        let pods = self
            .rt
            .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
            .await?
            .into_inner()
            .items;
        for p in pods {
            self.remove_pod(&p.id).await?;
        }
        Ok(())
    }

    /// ContainerStatus (verbose): the status and the parsed `info` JSON (pid, runtimeSpec …).
    pub async fn container_status(
        &mut self,
        id: &str,
    ) -> Result<(cri::ContainerStatus, serde_json::Value)> {
        let r = self
            .rt
            .container_status(cri::ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: true,
            })
            .await
            .with_context(|| format!("ContainerStatus {id}"))?
            .into_inner();
        let info = r
            .info
            .get("info")
            .map(|s| serde_json::from_str(s))
            .transpose()
            .context("parsing ContainerStatus info")?
            .unwrap_or(serde_json::Value::Null);
        let status = r.status.context("ContainerStatus without status")?;
        Ok((status, info))
    }

    /// `linux.resources.cpu.cpus` of the container's OCI spec (empty if unset).
    pub async fn spec_cpuset(&mut self, id: &str) -> Result<String> {
        let (_, info) = self.container_status(id).await?;
        Ok(info
            .pointer("/runtimeSpec/linux/resources/cpu/cpus")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string())
    }

    /// `linux.resources.cpu.mems` of the container's OCI spec (empty if unset).
    pub async fn spec_mems(&mut self, id: &str) -> Result<String> {
        let (_, info) = self.container_status(id).await?;
        Ok(info
            .pointer("/runtimeSpec/linux/resources/cpu/mems")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string())
    }

    /// The OCI spec annotations of a container.
    pub async fn spec_annotations(&mut self, id: &str) -> Result<HashMap<String, String>> {
        let (_, info) = self.container_status(id).await?;
        let mut out = HashMap::new();
        if let Some(m) = info
            .pointer("/runtimeSpec/annotations")
            .and_then(|v| v.as_object())
        {
            for (k, v) in m {
                if let Some(s) = v.as_str() {
                    out.insert(k.clone(), s.to_string());
                }
            }
        }
        Ok(out)
    }

    /// The container's init pid on the host.
    pub async fn pid(&mut self, id: &str) -> Result<u32> {
        let (st, info) = self.container_status(id).await?;
        let pid = info.get("pid").and_then(|p| p.as_u64()).unwrap_or(0);
        if pid == 0 {
            bail!(
                "container {id} has no pid (state {:?})",
                cri::ContainerState::try_from(st.state)
            );
        }
        Ok(pid as u32)
    }
}

/// The cpuset a process actually has: `cpuset.cpus` of its cgroup (v1 cpuset hierarchy or
/// the v2 unified one).
pub fn cgroup_cpuset(pid: u32) -> Result<String> {
    cgroup_file(pid, "cpuset.cpus")
}

/// `cpuset.mems` of a process's cgroup.
pub fn cgroup_mems(pid: u32) -> Result<String> {
    cgroup_file(pid, "cpuset.mems")
}

fn cgroup_file(pid: u32, file: &str) -> Result<String> {
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .with_context(|| format!("reading /proc/{pid}/cgroup"))?;
    let v1 = Path::new("/sys/fs/cgroup/cpuset/cpuset.cpus").exists();
    for line in cg.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrls, path) = match (parts.next(), parts.next(), parts.next()) {
            (Some(a), Some(b), Some(c)) => (a, b, c),
            _ => continue,
        };
        let base = if v1 && ctrls.split(',').any(|c| c == "cpuset") {
            "/sys/fs/cgroup/cpuset"
        } else if !v1 && ctrls.is_empty() {
            "/sys/fs/cgroup"
        } else {
            continue;
        };
        let p = format!("{base}{path}/{file}");
        let s = std::fs::read_to_string(&p).with_context(|| format!("reading {p}"))?;
        return Ok(s.trim().to_string());
    }
    bail!("no cpuset cgroup for pid {pid}")
}

/// Removes the e2e cgroup tree ([`CGROUP_ROOT`]) from every hierarchy, deepest first. Only
/// empty cgroups can go; call after the containers are gone.
pub fn remove_cgroup_tree() {
    crate::util::remove_cgroup_dirs(CGROUP_ROOT);
}

/// Runs one test's scenario against a private containerd: starts it with `opts`, runs
/// `scenario`, and on failure prints the agent's log (`<dir>/agent.log`) and containerd's last
/// lines; then stops containerd and removes the e2e cgroup tree, whatever the outcome.
pub async fn with_containerd(
    opts: ContainerdOptions,
    dir: &Path,
    scenario: impl AsyncFnOnce(&mut Containerd) -> Result<()>,
) -> Result<()> {
    let mut ctd = Containerd::start(opts)?;
    let res = scenario(&mut ctd).await;
    crate::util::print_logs_on_failure(&res, dir, "containerd", || ctd.log_tail(40));
    drop(ctd);
    remove_cgroup_tree();
    res
}

/// [`with_containerd`] in a fresh temporary folder `<prefix>-...` (removed after), which the
/// scenario gets too; prints how long `what` took.
pub async fn timed_with_containerd(
    what: &str,
    prefix: &str,
    opts: ContainerdOptions,
    scenario: impl AsyncFnOnce(&mut Containerd, &Path) -> Result<()>,
) -> Result<()> {
    let t0 = Instant::now();
    let dir = crate::util::temp_dir(prefix)?;
    let _rm = crate::util::RmDir(dir.clone());
    let res = with_containerd(opts, &dir, async |ctd| scenario(ctd, &dir).await).await;
    eprintln!("{what} took {:.1?}", t0.elapsed());
    res
}

#[cfg(test)]
mod tests {
    use super::parse_major_minor;

    #[test]
    fn containerd_versions_parse() {
        assert_eq!(parse_major_minor("1.7.24~ds1"), Some((1, 7)));
        assert_eq!(parse_major_minor("v2.3.7"), Some((2, 3)));
        assert_eq!(parse_major_minor("2.4.2+unknown"), Some((2, 4)));
        assert_eq!(parse_major_minor("v2.4.0-beta.0"), Some((2, 4)));
        assert_eq!(parse_major_minor("devel"), None);
    }
}
