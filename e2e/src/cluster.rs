//! A real single-node Kubernetes cluster for the e2e tier: etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler and a kubelet on a private containerd 1.7 (NRI on,
//! bridge CNI), everything on private paths under one temp dir.
//!
//! Installed by `hack/e2e/setup-kube.sh` (the five Kubernetes binaries, one `go build`) and
//! `hack/e2e/setup-containerd.sh` (containerd, runc, the CNI plugins). What the kubelet changes
//! on the host is undone on drop (see `../shared/CLUSTER-NOTES.md`): its sysctls
//! (`vm.overcommit_memory`, `kernel.panic`, `kernel.panic_on_oops`) are restored, its mounts
//! under the temp dir unmounted, the `/kubepods` cgroups removed, its `/var/log/containers`
//! symlinks deleted, the CNI bridge deleted. Start it once per test binary: bring-up is
//! seconds, but each start costs the kubelet's and the control plane's warm-up.
//!
//! The API server serves on the machine's own address ([`node_ip`]; no traffic leaves the
//! machine) so that Pods on the bridge network reach it: Pods that talk to it get
//! `KUBERNETES_SERVICE_HOST`/`_PORT` from [`Cluster::api_env`] (there is no kube-proxy).

use crate::containerd::{Containerd, ContainerdOptions};
use crate::kube::{bin_dir, make_cert, write_kubeconfig, KubeCluster, KubeOptions, Proc};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The node's name (`--hostname-override`).
pub const NODE: &str = "tap-e2e-node";
/// The CNI bridge the cluster's Pods are attached to (deleted on drop).
pub const BRIDGE: &str = "tape2e0";
/// The Pods' subnet (host-local IPAM, on [`BRIDGE`]; nothing outside this machine).
pub const POD_SUBNET: &str = "10.244.77.0/24";

/// Sysctls the kubelet sets without asking; saved before it starts and restored on drop.
const KUBELET_SYSCTLS: [&str; 3] = [
    "vm/overcommit_memory",
    "kernel/panic",
    "kernel/panic_on_oops",
];

/// The machine's primary IPv4 address: the address of the interface of the default route
/// (read from the routing table; nothing is sent).
pub fn node_ip() -> Result<String> {
    let routes = std::fs::read_to_string("/proc/net/route")?;
    let dev = routes
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() > 2 && f[1] == "00000000")
        .map(|f| f[0].to_string())
        .context("no default route in /proc/net/route")?;
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show", "dev", &dev])
        .output()
        .context("running ip")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let ip = text
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|cidr| cidr.split('/').next())
        .with_context(|| format!("no IPv4 address on {dev}: {text}"))?;
    Ok(ip.to_string())
}

/// Fails (never skips) when a binary the cluster needs is missing.
pub fn check_installed() -> Result<()> {
    crate::kube::check_installed()?;
    crate::containerd::check_installed()?;
    for b in ["kubelet", "kube-scheduler", "kube-controller-manager"] {
        let p = bin_dir().join(b);
        if !p.exists() {
            bail!("{} is missing: run hack/e2e/setup-kube.sh", p.display());
        }
    }
    let cni = PathBuf::from(crate::containerd::INSTALL_ROOT).join("usr/lib/cni/bridge");
    if !cni.exists() {
        bail!(
            "{} is missing: run hack/e2e/setup-containerd.sh",
            cni.display()
        );
    }
    Ok(())
}

/// How the kubelet reaches the runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeEndpoint {
    /// containerd's own CRI socket.
    Containerd,
    /// Another socket in front of it (a CRI proxy).
    Proxy(PathBuf),
}

/// Knobs of a [`Cluster`].
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// containerd's NRI `plugin_request_timeout`.
    pub nri_request_timeout: Duration,
    /// The kubelet's `runtimeRequestTimeout` (how long it waits for a CRI call).
    pub runtime_request_timeout: Duration,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            nri_request_timeout: Duration::from_secs(2),
            runtime_request_timeout: Duration::from_secs(30),
        }
    }
}

pub struct Cluster {
    pub dir: PathBuf,
    pub opts: ClusterOptions,
    pub node_ip: String,
    // Stopped in this order on drop: kubelet, containerd, scheduler, controller-manager, then
    // the API server and etcd (KubeCluster's own drop).
    kubelet: Option<Proc>,
    pub containerd: Option<Containerd>,
    scheduler: Option<Proc>,
    controller_manager: Option<Proc>,
    pub kube: Option<KubeCluster>,
    kubelet_args: Vec<String>,
    endpoint: RuntimeEndpoint,
    saved_sysctls: Vec<(String, String)>,
    kubelet_runs: usize,
    /// Bring-up time of the last [`Cluster::start`] (to a Ready node).
    pub bring_up: Duration,
    /// The host-wide lock ([`HOST_LOCK`]), held until everything above is gone.
    _host_lock: std::fs::File,
}

/// Two clusters on one host undo each other (the `/kubepods` cgroups, the bridge, the kubelet's
/// device-plugin folder), so a cluster holds this file's lock from start to teardown; a second
/// test binary waits for it.
pub const HOST_LOCK: &str = "/tmp/tap-e2e-cluster.lock";

/// Takes [`HOST_LOCK`], waiting for another cluster to be torn down.
fn lock_host() -> Result<std::fs::File> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(HOST_LOCK)
        .with_context(|| format!("opening {HOST_LOCK}"))?;
    match f.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let t = Instant::now();
            eprintln!("cluster: another cluster holds {HOST_LOCK}; waiting");
            f.lock().with_context(|| format!("locking {HOST_LOCK}"))?;
            let waited = t.elapsed().as_secs_f64();
            eprintln!("cluster: waited {waited:.1}s for {HOST_LOCK}");
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("locking {HOST_LOCK}"))
        }
    }
    Ok(f)
}

impl Cluster {
    /// Starts the whole cluster and waits until the node is Ready.
    pub fn start() -> Result<Cluster> {
        Cluster::start_with(ClusterOptions::default())
    }

    /// [`Cluster::start`] with other knobs.
    pub fn start_with(opts: ClusterOptions) -> Result<Cluster> {
        check_installed()?;
        let host_lock = lock_host()?;
        let t0 = Instant::now();
        let node_ip = node_ip()?;
        let dir = crate::util::temp_dir("tap-cl")?;
        let mut c = Cluster {
            dir: dir.clone(),
            opts: opts.clone(),
            node_ip: node_ip.clone(),
            kubelet: None,
            containerd: None,
            scheduler: None,
            controller_manager: None,
            kube: None,
            kubelet_args: Vec::new(),
            endpoint: RuntimeEndpoint::Containerd,
            saved_sysctls: Vec::new(),
            kubelet_runs: 0,
            bring_up: Duration::ZERO,
            _host_lock: host_lock,
        };
        // From here on, dropping `c` undoes whatever was done.
        let kube = KubeCluster::start_with(&KubeOptions {
            node_ip: Some(node_ip.clone()),
            ..KubeOptions::default()
        })?;
        let pki = kube.dir.join("pki");
        let (host, port) = (kube.host.clone(), kube.port);
        c.kube = Some(kube);

        for (stem, subj) in [
            ("controller-manager", "/CN=system:kube-controller-manager"),
            ("scheduler", "/CN=system:kube-scheduler"),
            (
                "kubelet",
                &format!("/O=system:nodes/CN=system:node:{NODE}") as &str,
            ),
        ] {
            make_cert(&pki, stem, subj, None)?;
            write_kubeconfig(
                &dir.join(format!("{stem}.kubeconfig")),
                &host,
                port,
                &pki,
                stem,
            )?;
        }
        make_cert(
            &pki,
            "kubelet-serving",
            &format!("/CN={NODE}"),
            Some(&format!(
                "subjectAltName=IP:{node_ip},DNS:{NODE}\nextendedKeyUsage=serverAuth"
            )),
        )?;

        let p = |f: &str| pki.join(f).display().to_string();
        let kc = |s: &str| dir.join(format!("{s}.kubeconfig")).display().to_string();
        let mut cm = Command::new(bin_dir().join("kube-controller-manager"));
        cm.arg(format!("--kubeconfig={}", kc("controller-manager")))
            .arg(format!(
                "--authentication-kubeconfig={}",
                kc("controller-manager")
            ))
            .arg(format!(
                "--authorization-kubeconfig={}",
                kc("controller-manager")
            ))
            .arg("--use-service-account-credentials=true")
            .arg(format!(
                "--service-account-private-key-file={}",
                p("sa.key")
            ))
            .arg(format!("--root-ca-file={}", p("ca.crt")))
            .arg("--leader-elect=false")
            .arg("--bind-address=127.0.0.1")
            .arg("--secure-port=0")
            .arg("--v=1");
        c.controller_manager = Some(Proc::spawn(
            "kube-controller-manager",
            cm,
            &dir.join("controller-manager.log"),
        )?);
        let mut sch = Command::new(bin_dir().join("kube-scheduler"));
        sch.arg(format!("--kubeconfig={}", kc("scheduler")))
            .arg(format!("--authentication-kubeconfig={}", kc("scheduler")))
            .arg(format!("--authorization-kubeconfig={}", kc("scheduler")))
            .arg("--leader-elect=false")
            .arg("--bind-address=127.0.0.1")
            .arg("--secure-port=0")
            .arg("--v=1");
        c.scheduler = Some(Proc::spawn(
            "kube-scheduler",
            sch,
            &dir.join("scheduler.log"),
        )?);

        let conflist = serde_json::json!({
            "cniVersion": "0.4.0",
            "name": "tap-e2e",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": true,
                    "ipMasq": false,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": dir.join("cni-ipam").display().to_string(),
                        "ranges": [[{"subnet": POD_SUBNET}]],
                        "routes": [{"dst": "0.0.0.0/0"}]
                    }
                },
                {"type": "loopback"}
            ]
        });
        c.containerd = Some(Containerd::start(ContainerdOptions {
            nri: crate::containerd::Nri::On,
            nri_request_timeout: opts.nri_request_timeout,
            import_image: true,
            cni_conflist: Some(conflist.to_string()),
        })?);

        c.save_sysctls();
        c.write_kubelet_config(&pki)?;
        c.start_kubelet()?;
        c.wait_node_ready(Duration::from_secs(120))?;
        // Pods need their namespace's default ServiceAccount and the root CA ConfigMap, which
        // the controller-manager publishes.
        c.kube().wait_for(
            Duration::from_secs(60),
            "ServiceAccount default/default and ConfigMap kube-root-ca.crt",
            |k| {
                Ok(
                    k.kubectl(&["-n", "default", "get", "serviceaccount", "default"])?
                        .status
                        .success()
                        && k.kubectl(&["-n", "default", "get", "configmap", "kube-root-ca.crt"])?
                            .status
                            .success(),
                )
            },
        )?;
        c.bring_up = t0.elapsed();
        eprintln!(
            "cluster: node {NODE} ({node_ip}) Ready {:.1}s after start",
            c.bring_up.as_secs_f64()
        );
        Ok(c)
    }

    pub fn kube(&self) -> &KubeCluster {
        self.kube.as_ref().expect("the API server runs")
    }

    pub fn containerd(&self) -> &Containerd {
        self.containerd.as_ref().expect("containerd runs")
    }

    pub fn containerd_mut(&mut self) -> &mut Containerd {
        self.containerd.as_mut().expect("containerd runs")
    }

    /// Environment for a Pod that talks to the API server (in-cluster config): the Service IP
    /// has no proxy here, so point it at the server's own address.
    pub fn api_env(&self) -> Vec<(String, String)> {
        vec![
            ("KUBERNETES_SERVICE_HOST".into(), self.kube().host.clone()),
            (
                "KUBERNETES_SERVICE_PORT".into(),
                self.kube().port.to_string(),
            ),
        ]
    }

    fn save_sysctls(&mut self) {
        for s in KUBELET_SYSCTLS {
            if let Ok(v) = std::fs::read_to_string(format!("/proc/sys/{s}")) {
                self.saved_sysctls
                    .push((s.to_string(), v.trim().to_string()));
            }
        }
    }

    fn restore_sysctls(&self) {
        for (s, v) in &self.saved_sysctls {
            let path = format!("/proc/sys/{s}");
            if std::fs::read_to_string(&path)
                .map(|c| c.trim() != v)
                .unwrap_or(false)
            {
                if let Err(e) = std::fs::write(&path, v) {
                    eprintln!("cluster: restoring {path} to {v}: {e}");
                }
            }
        }
    }

    /// The kubelet's log so far (every run).
    pub fn kubelet_log(&self) -> String {
        (0..self.kubelet_runs)
            .map(|i| {
                std::fs::read_to_string(self.dir.join(format!("kubelet-{i}.log")))
                    .unwrap_or_default()
            })
            .collect()
    }

    /// The last lines of every component's log, for failure messages.
    pub fn logs_tail(&self, n: usize) -> String {
        let mut out = String::new();
        let kubelet = format!("kubelet-{}.log", self.kubelet_runs.saturating_sub(1));
        for f in [kubelet.as_str(), "controller-manager.log", "scheduler.log"] {
            let s = std::fs::read_to_string(self.dir.join(f)).unwrap_or_default();
            let lines: Vec<&str> = s.lines().collect();
            out.push_str(&format!(
                "--- {f}\n{}\n",
                lines[lines.len().saturating_sub(n)..].join("\n")
            ));
        }
        if let Some(ctd) = &self.containerd {
            out.push_str(&format!("--- containerd\n{}\n", ctd.log_tail(n)));
        }
        out
    }

    fn runtime_socket(&self) -> PathBuf {
        match &self.endpoint {
            RuntimeEndpoint::Containerd => self.containerd().cri_socket(),
            RuntimeEndpoint::Proxy(p) => p.clone(),
        }
    }

    fn write_kubelet_config(&self, pki: &Path) -> Result<()> {
        let d = &self.dir;
        for sub in ["kubelet", "manifests", "pod-logs"] {
            std::fs::create_dir_all(d.join(sub))?;
        }
        let port = crate::kube::free_port()?;
        let cfg = format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {ip}
port: {port}
readOnlyPort: 0
healthzPort: 0
healthzBindAddress: 127.0.0.1
tlsCertFile: {pki}/kubelet-serving.crt
tlsPrivateKeyFile: {pki}/kubelet-serving.key
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: {pki}/ca.crt
authorization:
  mode: AlwaysAllow
cgroupDriver: cgroupfs
cgroupsPerQOS: true
cpuManagerPolicy: none
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: unix://{sock}
runtimeRequestTimeout: {rrt}s
staticPodPath: {d}/manifests
podLogsDir: {d}/pod-logs
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# Absolute disk thresholds: the test machine's disk is thin-provisioned and shared, so
# 1% of its 252 GB (2.7 GB) evicted the tier's Pods once when 2.1 GB were free.
evictionHard:
  memory.available: 100Mi
  nodefs.available: 256Mi
  nodefs.inodesFree: 1%
  imagefs.available: 256Mi
  imagefs.inodesFree: 1%
syncFrequency: 5s
fileCheckFrequency: 5s
nodeStatusUpdateFrequency: 5s
"#,
            ip = self.node_ip,
            pki = pki.display(),
            sock = self.runtime_socket().display(),
            d = d.display(),
            rrt = self.opts.runtime_request_timeout.as_secs().max(1),
        );
        std::fs::write(d.join("kubelet-config.yaml"), cfg)?;
        Ok(())
    }

    fn start_kubelet(&mut self) -> Result<()> {
        let d = self.dir.clone();
        let args = vec![
            format!("--config={}", d.join("kubelet-config.yaml").display()),
            format!("--kubeconfig={}", d.join("kubelet.kubeconfig").display()),
            format!("--hostname-override={NODE}"),
            format!("--node-ip={}", self.node_ip),
            format!("--root-dir={}", d.join("kubelet").display()),
            format!("--cert-dir={}", d.join("kubelet/pki").display()),
            "--v=2".to_string(),
        ];
        self.kubelet_args = args.clone();
        let mut cmd = Command::new(bin_dir().join("kubelet"));
        cmd.args(&args);
        // One log per run (kubelet-0.log, kubelet-1.log, ...).
        self.kubelet_runs += 1;
        let log = d.join(format!("kubelet-{}.log", self.kubelet_runs - 1));
        let mut p = Proc::spawn("kubelet", cmd, &log)?;
        std::thread::sleep(Duration::from_millis(300));
        if !p.running() {
            bail!("the kubelet exited at once:\n{}", p.log_tail(40));
        }
        self.kubelet = Some(p);
        Ok(())
    }

    /// Stops the kubelet (SIGTERM) and starts it again with the same configuration; Pods keep
    /// running. Waits until the node is Ready again.
    pub fn restart_kubelet(&mut self) -> Result<()> {
        let beat = self.ready_heartbeat();
        if let Some(mut k) = self.kubelet.take() {
            k.terminate(Duration::from_secs(10));
        }
        self.start_kubelet()?;
        // The node still shows the old kubelet's Ready: wait for the new one's heartbeat.
        let start = Instant::now();
        while self.ready_heartbeat() == beat {
            if start.elapsed() > Duration::from_secs(120) {
                bail!(
                    "no node heartbeat from the restarted kubelet:\n{}",
                    self.logs_tail(40)
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        self.wait_node_ready(Duration::from_secs(120))
    }

    /// `lastHeartbeatTime` of the node's Ready condition.
    fn ready_heartbeat(&self) -> Option<String> {
        let n = self
            .kube()
            .get_json(&["get", "node", NODE])
            .ok()
            .flatten()?;
        n["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "Ready")
            .and_then(|c| c["lastHeartbeatTime"].as_str().map(str::to_string))
    }

    /// Points the kubelet at another runtime endpoint (a CRI proxy, or back at containerd)
    /// and restarts it.
    pub fn set_runtime_endpoint(&mut self, endpoint: RuntimeEndpoint) -> Result<()> {
        self.endpoint = endpoint;
        let pki = self.kube().dir.join("pki");
        self.write_kubelet_config(&pki)?;
        self.restart_kubelet()
    }

    /// Waits until the node reports Ready.
    pub fn wait_node_ready(&mut self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            let ready = self
                .kube()
                .get_json(&["get", "node", NODE])
                .ok()
                .flatten()
                .and_then(|n| {
                    n["status"]["conditions"].as_array().map(|cs| {
                        cs.iter()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    })
                })
                .unwrap_or(false);
            if ready {
                return Ok(());
            }
            if let Some(k) = self.kubelet.as_mut() {
                if !k.running() {
                    bail!("the kubelet exited:\n{}", k.log_tail(60));
                }
            }
            if start.elapsed() > timeout {
                bail!(
                    "node {NODE} not Ready after {timeout:?}:\n{}",
                    self.logs_tail(40)
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Removes the `/var/log/containers` symlinks that point into this cluster's dir.
    fn remove_log_symlinks(&self) {
        let prefix = self.dir.to_string_lossy().into_owned();
        let Ok(rd) = std::fs::read_dir("/var/log/containers") else {
            return;
        };
        for e in rd.flatten() {
            if let Ok(target) = std::fs::read_link(e.path()) {
                if target.to_string_lossy().starts_with(&prefix) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let t = Instant::now();
        if let Some(mut k) = self.kubelet.take() {
            k.terminate(Duration::from_secs(5));
        }
        // Deletes every container, kills the shims and containerd, unmounts its dirs.
        self.containerd = None;
        if let Some(mut p) = self.scheduler.take() {
            p.terminate(Duration::from_secs(3));
        }
        if let Some(mut p) = self.controller_manager.take() {
            p.terminate(Duration::from_secs(3));
        }
        self.kube = None;
        crate::util::unmount_under(&self.dir);
        crate::util::remove_cgroup_dirs("/kubepods");
        let _ = Command::new("ip")
            .args(["link", "del", BRIDGE])
            .stderr(std::process::Stdio::null())
            .status();
        self.restore_sysctls();
        self.remove_log_symlinks();
        crate::util::remove_unless_kept(&self.dir);
        eprintln!("cluster: torn down in {:.1}s", t.elapsed().as_secs_f64());
    }
}
