//! A private dockerd for e2e tests, the `docker` CLI against any socket, and a kunpeng-tap
//! agent process.
//!
//! Installed by `hack/e2e/setup-docker.sh` (Debian's docker.io, runc, busybox-static and a
//! busybox rootfs tarball). A [`Dockerd`] lives entirely under its own temp dir: socket,
//! data-root, exec-root (where it runs its own containerd), pidfile; no iptables, no bridge.
//! Dropping it removes its containers, stops the daemon (and its containerd), removes the
//! cgroups the test's containers used and the dir.
//!
//! [`TapAgent`] runs the `kunpeng-tap` binary (built once per test process with cargo) and
//! stops it on drop.

use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The busybox rootfs tarball setup-docker.sh builds.
pub const ROOTFS_TARBALL: &str = "/var/cache/kunpeng-tap/docker/busybox-rootfs.tar";
/// The image the harness imports.
pub const IMAGE: &str = "tap.local/busybox:e2e";

static SEQ: AtomicU32 = AtomicU32::new(0);

pub use crate::util::temp_dir;

/// Fails (never skips) when the setup script has not run.
pub fn check_installed() -> Result<()> {
    for bin in ["dockerd", "docker", "runc"] {
        let ok = Command::new("sh")
            .args(["-c", &format!("command -v {bin}")])
            .stdout(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            bail!("{bin} is missing: run hack/e2e/setup-docker.sh");
        }
    }
    if !Path::new(ROOTFS_TARBALL).exists() {
        bail!("{ROOTFS_TARBALL} is missing: run hack/e2e/setup-docker.sh");
    }
    Ok(())
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// Sends SIGTERM, waits up to `grace`, then SIGKILL.
pub fn terminate(child: &mut Child, grace: Duration) {
    signal(child.id(), "TERM");
    let until = Instant::now() + grace;
    while Instant::now() < until {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Runs the `docker` CLI against `socket`; fails with its stderr when it fails.
pub fn docker(socket: &Path, args: &[&str]) -> Result<String> {
    let out = docker_output(socket, args, None)?;
    let stdout = crate::util::stdout_of("docker", args, out)?;
    Ok(stdout.trim().to_string())
}

/// Runs the `docker` CLI against `socket`, optionally feeding `stdin` (then closed), with a
/// 60 s limit.
pub fn docker_output(socket: &Path, args: &[&str], stdin: Option<&[u8]>) -> Result<Output> {
    run_docker(socket, args, stdin, false)
}

/// As [`docker_output`], but stdin stays open after `input` until the CLI exits: for `docker
/// attach`, which dockerd ends at stdin's EOF (unless the container was created stdin-once).
pub fn docker_attached(socket: &Path, args: &[&str], input: &[u8]) -> Result<Output> {
    run_docker(socket, args, Some(input), true)
}

fn run_docker(
    socket: &Path,
    args: &[&str],
    stdin: Option<&[u8]>,
    keep_stdin_open: bool,
) -> Result<Output> {
    let mut child = Command::new("docker")
        .args(args)
        .env("DOCKER_HOST", format!("unix://{}", socket.display()))
        .env("DOCKER_CONFIG", socket.with_file_name("docker-cli-config"))
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running docker")?;
    let mut held = None;
    if let Some(data) = stdin {
        let mut si = child.stdin.take().context("docker stdin")?;
        si.write_all(data)?;
        if keep_stdin_open {
            held = Some(si);
        } // else dropped: EOF, the CLI half-closes the hijacked connection
    }
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = rx.recv_timeout(Duration::from_secs(60));
    drop(held);
    match out {
        Ok(out) => Ok(out?),
        Err(_) => {
            signal(pid, "KILL");
            bail!("docker {} hung for 60 s", args.join(" "))
        }
    }
}

/// A raw HTTP/1.0 GET over a unix socket: (status, body).
pub fn unix_get(socket: &Path, path: &str) -> Result<(u16, String)> {
    let mut s = std::os::unix::net::UnixStream::connect(socket)
        .with_context(|| format!("connecting {}", socket.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: docker\r\n\r\n")?;
    let mut buf = String::new();
    s.read_to_string(&mut buf)?;
    http_split(&buf)
}

/// A raw HTTP/1.0 GET over TCP: (status, body).
pub fn tcp_get(addr: &str, path: &str) -> Result<(u16, String)> {
    let mut s = std::net::TcpStream::connect(addr).with_context(|| format!("connecting {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut buf = String::new();
    s.read_to_string(&mut buf)?;
    http_split(&buf)
}

fn http_split(buf: &str) -> Result<(u16, String)> {
    let status = buf
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no HTTP status")?;
    let body = buf.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
    Ok((status, body.to_string()))
}

/// dockerd `bin` serving `dir/docker.sock` with its data, exec root and pid file in `dir`: no
/// iptables, no bridge, the vfs storage driver (it works on any filesystem).
pub fn dockerd_command(bin: &str, dir: &Path) -> Command {
    let mut c = Command::new(bin);
    c.arg(format!(
        "--host=unix://{}",
        dir.join("docker.sock").display()
    ))
    .arg(format!("--data-root={}", dir.join("data").display()))
    .arg(format!("--exec-root={}", dir.join("exec").display()))
    .arg(format!("--pidfile={}", dir.join("dockerd.pid").display()))
    .args([
        "--iptables=false",
        "--ip-masq=false",
        "--bridge=none",
        "--storage-driver=vfs",
    ]);
    c
}

fn spawn_dockerd(dir: &Path) -> Result<Child> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("dockerd.log"))?;
    dockerd_command("dockerd", dir)
        .arg("--log-level=warn")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting dockerd")
}

/// A raw HTTP/1.1 POST over a unix socket (`Connection: close`): (status, body).
pub fn unix_post(socket: &Path, path: &str, body: &[u8]) -> Result<(u16, String)> {
    let mut s = std::os::unix::net::UnixStream::connect(socket)
        .with_context(|| format!("connecting {}", socket.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: docker\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    s.write_all(body)?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    http_split(&String::from_utf8_lossy(&buf))
}

/// A running private dockerd. Kill-on-drop.
pub struct Dockerd {
    dir: PathBuf,
    child: Option<Child>,
    /// cgroup parents handed out by [`Dockerd::cgroup_parent`], removed on drop.
    cgroup_root: String,
}

impl Dockerd {
    /// Starts dockerd under a fresh temp dir, waits for its API and imports [`IMAGE`].
    pub fn start() -> Result<Dockerd> {
        check_installed()?;
        let dir = temp_dir("tap-dkd")?;
        let cgroup_root = format!(
            "/tap-e2e-docker-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        );
        let child = spawn_dockerd(&dir)?;
        let d = Dockerd {
            dir,
            child: Some(child),
            cgroup_root,
        };
        d.wait_ready()?;
        let out = Command::new("docker")
            .args(["import", ROOTFS_TARBALL, IMAGE])
            .env("DOCKER_HOST", format!("unix://{}", d.socket().display()))
            .output()
            .context("docker import")?;
        if !out.status.success() {
            bail!(
                "docker import failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(d)
    }

    fn wait_ready(&self) -> Result<()> {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok((200, _)) = unix_get(&self.socket(), "/_ping") {
                return Ok(());
            }
            if Instant::now() > until {
                bail!("dockerd did not answer in 60 s:\n{}", self.log_tail(30));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops dockerd (SIGTERM: it stops its containers, no live-restore) and starts it again
    /// on the same data.
    pub fn restart(&mut self) -> Result<()> {
        if let Some(mut ch) = self.child.take() {
            terminate(&mut ch, Duration::from_secs(30));
        }
        self.child = Some(spawn_dockerd(&self.dir)?);
        self.wait_ready()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// dockerd's own API socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("docker.sock")
    }

    pub fn log_tail(&self, n: usize) -> String {
        tail(&self.dir.join("dockerd.log"), n)
    }

    /// A cgroup parent for a test container under this daemon's private cgroup root, e.g.
    /// `cgroup_parent("burstable/pod1")`; the QoS is read from the path as the kubelet writes it.
    pub fn cgroup_parent(&self, rel: &str) -> String {
        format!("{}/{}", self.cgroup_root, rel.trim_start_matches('/'))
    }

    /// `cpuset.cpus` of a running container's cgroup (v1 cpuset hierarchy, or v2).
    pub fn container_cgroup_cpus(&self, id: &str) -> Result<String> {
        let pid = docker(&self.socket(), &["inspect", "-f", "{{.State.Pid}}", id])?;
        let pid: u32 = pid.parse().context("container pid")?;
        cgroup_cpuset(pid)
    }

    fn remove_cgroups(&self) {
        crate::util::remove_cgroup_dirs(&self.cgroup_root);
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        let sock = self.socket();
        if let Ok(ids) = docker(&sock, &["ps", "-aq"]) {
            let ids: Vec<&str> = ids.split_whitespace().collect();
            if !ids.is_empty() {
                let mut args = vec!["rm", "-f"];
                args.extend(ids);
                let _ = docker(&sock, &args);
            }
        }
        if let Some(mut ch) = self.child.take() {
            terminate(&mut ch, Duration::from_secs(15));
        }
        // dockerd's containerd stops with it; anything left mounted under the dir goes.
        let _ = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "grep -o ' {}[^ ]*' /proc/self/mounts | sort -r | xargs -r -n1 umount -l",
                self.dir.display()
            ))
            .status();
        self.remove_cgroups();
        crate::util::remove_unless_kept(&self.dir);
    }
}

fn tail(path: &Path, n: usize) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `cpuset.cpus` of a process's cgroup (v1 cpuset hierarchy or v2 unified).
pub use crate::containerd::cgroup_cpuset;

pub use crate::util::free_port;

/// A running kunpeng-tap agent. Stopped (SIGTERM, then SIGKILL) on drop.
pub struct TapAgent {
    child: Option<Child>,
    log: PathBuf,
    /// `127.0.0.1:<port>` of /metrics, /healthz, /readyz.
    pub metrics_addr: String,
}

impl TapAgent {
    /// Starts `kunpeng-tap <args> --metrics-bind-address 127.0.0.1:<free>`, logging to `log`,
    /// and waits until /readyz answers 200 (the mode finished its start-up sync).
    pub fn start(args: &[String], log: &Path) -> Result<TapAgent> {
        TapAgent::start_with_umask(args, log, None)
    }

    /// As [`TapAgent::start`], the agent running under `umask` (e.g. `"000"`) when given.
    pub fn start_with_umask(args: &[String], log: &Path, umask: Option<&str>) -> Result<TapAgent> {
        TapAgent::spawn(&crate::util::agent_binary()?, args, log, umask)
    }

    /// As [`TapAgent::start`], with the agent binary `bin` (the benchmarks use a release build).
    pub fn start_binary(bin: &Path, args: &[String], log: &Path) -> Result<TapAgent> {
        TapAgent::spawn(bin, args, log, None)
    }

    fn spawn(bin: &Path, args: &[String], log: &Path, umask: Option<&str>) -> Result<TapAgent> {
        let metrics_addr = format!("127.0.0.1:{}", free_port()?);
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let mut cmd = match umask {
            Some(m) => {
                let mut c = Command::new("/bin/sh");
                c.arg("-c")
                    .arg(format!("umask {m} && exec \"$0\" \"$@\""))
                    .arg(bin);
                c
            }
            None => Command::new(bin),
        };
        let child = cmd
            .args(args)
            .arg(format!("--metrics-bind-address={metrics_addr}"))
            .env("TAP_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut a = TapAgent {
            child: Some(child),
            log: log.to_path_buf(),
            metrics_addr,
        };
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok((200, _)) = tcp_get(&a.metrics_addr, "/readyz") {
                return Ok(a);
            }
            if let Some(ch) = a.child.as_mut() {
                if let Ok(Some(st)) = ch.try_wait() {
                    bail!("kunpeng-tap exited ({st}):\n{}", a.log_tail(30));
                }
            }
            if Instant::now() > until {
                bail!("kunpeng-tap not ready in 60 s:\n{}", a.log_tail(30));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn log_tail(&self, n: usize) -> String {
        tail(&self.log, n)
    }

    /// The whole log so far (every run that appended to the same file).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The agent's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Peak resident memory of the agent so far (`VmHWM`), in KiB.
    pub fn peak_rss_kib(&self) -> Result<u64> {
        let pid = self.pid().context("agent not running")?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .context("no VmHWM in /proc/<pid>/status")
    }

    /// Whether the agent's log shows a panic.
    pub fn panicked(&self) -> bool {
        std::fs::read_to_string(&self.log)
            .map(|l| l.contains("panicked"))
            .unwrap_or(false)
    }

    /// The OpenMetrics text.
    pub fn metrics(&self) -> Result<String> {
        let (s, body) = tcp_get(&self.metrics_addr, "/metrics")?;
        anyhow::ensure!(s == 200, "/metrics answered {s}");
        Ok(body)
    }

    /// `tap_runtime_reconciles_total{result="ok"}`: periodic reconciles that listed the
    /// runtime (proxy modes).
    pub fn reconciles_ok(&self) -> Result<u64> {
        Ok(self
            .metrics()?
            .lines()
            .find_map(|l| l.strip_prefix("tap_runtime_reconciles_total{result=\"ok\"} "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map_or(0, |v| v as u64))
    }

    /// The agent's placement state as its metrics show it: every `tap_topology_node_usage_cpus` and
    /// `tap_topology_node_containers` line, sorted.
    pub fn state(&self) -> Result<Vec<String>> {
        let mut v: Vec<String> = self
            .metrics()?
            .lines()
            .filter(|l| {
                l.starts_with("tap_topology_node_usage_cpus{")
                    || l.starts_with("tap_topology_node_containers{")
            })
            .map(str::to_string)
            .collect();
        v.sort();
        Ok(v)
    }

    /// Containers the agent accounts over all pools (each is charged to exactly one pool).
    pub fn accounted(&self) -> Result<i64> {
        self.accounted_where("")
    }

    /// Containers the agent accounts on pools of one level (`numa`, `socket`, …).
    pub fn accounted_on(&self, level: &str) -> Result<i64> {
        self.accounted_where(&format!("level=\"{level}\""))
    }

    fn accounted_where(&self, label: &str) -> Result<i64> {
        Ok(self
            .state()?
            .iter()
            .filter(|l| l.starts_with("tap_topology_node_containers{") && l.contains(label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<i64>().ok())
            .sum())
    }

    /// Kills the agent at once (SIGKILL), as a crash or an OOM kill would.
    pub fn kill(&mut self) {
        crate::util::stop_child(&mut self.child);
    }

    /// Stops the agent (SIGTERM) and returns its exit status.
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let mut ch = self.child.take()?;
        terminate(&mut ch, Duration::from_secs(20));
        ch.try_wait().ok().flatten()
    }
}

impl Drop for TapAgent {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A private dockerd with the agent's Docker proxy in front of it, and helpers that make
/// containers the way cri-dockerd does (labels, names, cgroup parents).
pub struct ProxyEnv {
    pub dockerd: Dockerd,
    pub proxy: PathBuf,
    pub dir: PathBuf,
}

impl ProxyEnv {
    pub fn agent_args(&self) -> Vec<String> {
        vec![
            "--container-runtime-mode=Docker".into(),
            format!("--runtime-proxy-endpoint={}", self.proxy.display()),
            format!(
                "--container-runtime-service-endpoint=unix://{}",
                self.dockerd.socket().display()
            ),
            format!(
                "--sysfs-root={}",
                crate::util::fixture_dir("synthetic-2s-4numa-96c-gpu").display()
            ),
            "--fold-cpus-to-host".into(),
            format!("--state-dir={}", self.dir.join("state").display()),
            "--graceful-timeout=2s".into(),
        ]
    }

    pub fn start_agent(&self) -> Result<TapAgent> {
        TapAgent::start(&self.agent_args(), &self.dir.join("agent.log"))
    }

    /// The docker CLI through the proxy.
    pub fn docker(&self, args: &[&str]) -> Result<String> {
        docker(&self.proxy, args)
    }

    pub fn inspect(&self, id: &str, fmt: &str) -> Result<String> {
        docker(&self.dockerd.socket(), &["inspect", "-f", fmt, id])
    }

    /// A Pod sandbox the way cri-dockerd makes one.
    pub fn sandbox(&self, pod: &str, uid: &str, qos_path: &str, extra: &[&str]) -> Result<String> {
        let name = format!("k8s_POD_{pod}_default_{uid}_0");
        let cg = self.dockerd.cgroup_parent(qos_path);
        let mut args = vec![
            "run".to_string(),
            "-d".into(),
            "--name".into(),
            name,
            "--cgroup-parent".into(),
            cg,
            "--network=none".into(),
        ];
        for l in [
            format!("io.kubernetes.pod.name={pod}"),
            "io.kubernetes.pod.namespace=default".into(),
            format!("io.kubernetes.pod.uid={uid}"),
            "io.kubernetes.container.name=POD".into(),
            "io.kubernetes.docker.type=podsandbox".into(),
        ] {
            args.push("--label".into());
            args.push(l);
        }
        for l in extra {
            args.push("--label".into());
            args.push(l.to_string());
        }
        args.extend([IMAGE.to_string(), "/bin/sleep".into(), "3600".into()]);
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        self.docker(&argv)
    }

    /// An application container of that Pod, created (and started) through the proxy.
    #[allow(clippy::too_many_arguments)]
    pub fn container(
        &self,
        pod: &str,
        uid: &str,
        sandbox: &str,
        name: &str,
        qos_path: &str,
        shares: u64,
        quota: Option<i64>,
        extra: &[&str],
    ) -> Result<String> {
        let cname = format!("k8s_{name}_{pod}_default_{uid}_0");
        let cg = self.dockerd.cgroup_parent(qos_path);
        let mut args: Vec<String> = vec![
            "run".into(),
            "-d".into(),
            "--name".into(),
            cname,
            "--cgroup-parent".into(),
            cg,
            "--network=none".into(),
            format!("--cpu-shares={shares}"),
            "--memory=64m".into(),
        ];
        if let Some(q) = quota {
            args.push(format!("--cpu-quota={q}"));
            args.push("--cpu-period=100000".into());
        }
        for l in [
            format!("io.kubernetes.pod.name={pod}"),
            "io.kubernetes.pod.namespace=default".into(),
            format!("io.kubernetes.pod.uid={uid}"),
            format!("io.kubernetes.container.name={name}"),
            "io.kubernetes.docker.type=container".into(),
            format!("io.kubernetes.sandbox.id={sandbox}"),
        ] {
            args.push("--label".into());
            args.push(l);
        }
        for e in extra {
            args.push(e.to_string());
        }
        args.extend([IMAGE.to_string(), "/bin/sleep".into(), "3600".into()]);
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        self.docker(&argv)
    }
}
