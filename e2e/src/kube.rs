//! A private kube-apiserver + etcd on loopback for e2e tests.
//!
//! Installed by `hack/e2e/setup-kube.sh`: etcd from Debian, kube-apiserver and kubectl built
//! with `go build` from the pinned k8s.io/kubernetes module into [`BIN_DIR`]. Each
//! [`KubeCluster`] has its own temp dir with a test-private CA, server and client
//! certificates (openssl, made at start), a service-account signing key, etcd's data and both
//! logs. Ports are free loopback ports. Dropping it kills both processes and removes the dir
//! (`TAP_E2E_KEEP=1` keeps the dir for debugging).
//!
//! Clients authenticate with client certificates: `CN` is the user name, `O` the groups. A
//! certificate for `system:serviceaccount:<ns>:<name>` acts as that service account for RBAC
//! ([`KubeCluster::kubeconfig_for`]).
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use tap_e2e::kube::KubeCluster;
//! let k = KubeCluster::start()?;
//! k.kubectl_ok(&["apply", "-f", "crds/"])?;
//! let v = k.get_json(&["get", "nodetopology", "n1"])?;
//! # let _ = v;
//! # Ok(())
//! # }
//! ```

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Where setup-kube.sh puts kube-apiserver, kubectl and the other Kubernetes components: the
/// folder of the release it builds by default (`K8S_VERSION`; a unit test checks the two agree).
pub const BIN_DIR: &str = "/var/cache/kunpeng-tap/kube-v1.37.2";

pub(crate) fn bin_dir() -> PathBuf {
    std::env::var_os("TAP_KUBE_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(BIN_DIR))
}

pub fn kube_apiserver_bin() -> PathBuf {
    bin_dir().join("kube-apiserver")
}

pub fn kubectl_bin() -> PathBuf {
    bin_dir().join("kubectl")
}

pub(crate) fn etcd_bin() -> PathBuf {
    ["/usr/bin/etcd", "/usr/local/bin/etcd"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("etcd"))
}

/// Fails (never skips) when the setup script has not run.
pub fn check_installed() -> Result<()> {
    for p in [kube_apiserver_bin(), kubectl_bin()] {
        if !p.exists() {
            bail!("{} is missing: run hack/e2e/setup-kube.sh", p.display());
        }
    }
    let etcd = Command::new(etcd_bin()).arg("--version").output();
    if !etcd.map(|o| o.status.success()).unwrap_or(false) {
        bail!("etcd is missing: run hack/e2e/setup-kube.sh (Debian's etcd-server)");
    }
    if Command::new("openssl").arg("version").output().is_err() {
        bail!("openssl is missing: run hack/e2e/setup-kube.sh");
    }
    Ok(())
}

/// A child process killed (and reaped) on drop.
pub struct Proc {
    pub name: String,
    child: Option<Child>,
    pub log: PathBuf,
}

impl Proc {
    /// Starts `cmd` with stdout and stderr going to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Result<Proc> {
        let out =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        Ok(Proc {
            name: name.to_string(),
            child: Some(child),
            log: log.to_path_buf(),
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        crate::util::stop_child(&mut self.child);
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub fn terminate(&mut self, grace: Duration) {
        if let Some(c) = self.child.as_mut() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let start = Instant::now();
            while start.elapsed() < grace {
                if let Ok(Some(_)) = c.try_wait() {
                    self.child = None;
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        self.kill();
    }

    /// The last `n` lines of the log.
    pub fn log_tail(&self, n: usize) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

pub use crate::util::free_port;

pub(crate) fn run_ok(cmd: &mut Command) -> Result<Output> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out)
}

use crate::util::temp_dir;

/// How [`KubeCluster::start_with`] sets up the API server.
#[derive(Debug, Clone, Default)]
pub struct KubeOptions {
    /// A node address (the machine's own, see [`crate::cluster::node_ip`]): serve there instead
    /// of 127.0.0.1, with what a kubelet needs (the Node authorizer, NodeRestriction, a client
    /// certificate for calls to kubelets, the kubelet CA) and the Service IP 10.96.0.1 in the
    /// serving certificate's SANs.
    pub node_ip: Option<String>,
    /// More kube-apiserver flags, after the harness's own, e.g. `--runtime-config=...` to
    /// switch an API off.
    pub extra_args: Vec<String>,
}

pub struct KubeCluster {
    pub dir: PathBuf,
    /// The address the API server serves on (127.0.0.1, or the node's address).
    pub host: String,
    pub port: u16,
    /// Admin (system:masters) kubeconfig.
    pub kubeconfig: PathBuf,
    // Dropped in reverse order: apiserver first, then etcd.
    pub apiserver: Proc,
    pub etcd: Proc,
}

impl KubeCluster {
    /// Starts etcd and kube-apiserver on 127.0.0.1 and waits until `/readyz` answers.
    pub fn start() -> Result<KubeCluster> {
        KubeCluster::start_with(&KubeOptions::default())
    }

    /// Starts etcd and kube-apiserver as `opts` says and waits until `/readyz` answers.
    pub fn start_with(opts: &KubeOptions) -> Result<KubeCluster> {
        check_installed()?;
        let dir = temp_dir("tap-e2e-kube")?;
        let pki = dir.join("pki");
        std::fs::create_dir_all(&pki)?;
        make_ca(&pki)?;
        let host = opts.node_ip.clone().unwrap_or_else(|| "127.0.0.1".into());
        let sans = match &opts.node_ip {
            Some(ip) => format!("IP:127.0.0.1,IP:{ip},IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"),
            None => "IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc".into(),
        };
        make_cert(
            &pki,
            "apiserver",
            "/CN=kube-apiserver",
            Some(&format!(
                "subjectAltName={sans}\nextendedKeyUsage=serverAuth"
            )),
        )?;
        make_cert(&pki, "admin", "/O=system:masters/CN=tap-e2e-admin", None)?;
        run_ok(
            Command::new("openssl")
                .args(["genrsa", "-out"])
                .arg(pki.join("sa.key"))
                .arg("2048"),
        )?;
        run_ok(
            Command::new("openssl")
                .args(["rsa", "-pubout", "-in"])
                .arg(pki.join("sa.key"))
                .arg("-out")
                .arg(pki.join("sa.pub")),
        )?;

        let etcd_port = free_port()?;
        let peer_port = free_port()?;
        let mut etcd_cmd = Command::new(etcd_bin());
        etcd_cmd
            .arg("--name=tap-e2e")
            .arg(format!("--data-dir={}", dir.join("etcd").display()))
            .arg(format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"))
            .arg(format!(
                "--advertise-client-urls=http://127.0.0.1:{etcd_port}"
            ))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"
            ))
            .arg(format!(
                "--initial-cluster=tap-e2e=http://127.0.0.1:{peer_port}"
            ))
            .arg("--log-level=warn");
        let mut etcd = Proc::spawn("etcd", etcd_cmd, &dir.join("etcd.log"))?;
        wait_tcp(etcd_port, Duration::from_secs(20))
            .with_context(|| format!("etcd did not listen:\n{}", etcd.log_tail(20)))?;
        if !etcd.running() {
            bail!("etcd exited:\n{}", etcd.log_tail(20));
        }

        let port = free_port()?;
        let p = |f: &str| pki.join(f).display().to_string();
        let mut api_cmd = Command::new(kube_apiserver_bin());
        api_cmd
            .arg(format!("--etcd-servers=http://127.0.0.1:{etcd_port}"))
            .arg(format!("--bind-address={host}"))
            .arg(format!("--advertise-address={host}"))
            .arg(format!("--secure-port={port}"))
            .arg(format!("--cert-dir={}", dir.join("certs").display()))
            .arg(format!("--tls-cert-file={}", p("apiserver.crt")))
            .arg(format!("--tls-private-key-file={}", p("apiserver.key")))
            .arg(format!("--client-ca-file={}", p("ca.crt")))
            .arg(format!("--service-account-key-file={}", p("sa.pub")))
            .arg(format!(
                "--service-account-signing-key-file={}",
                p("sa.key")
            ))
            .arg("--service-account-issuer=https://kubernetes.default.svc")
            .arg("--service-cluster-ip-range=10.96.0.0/24")
            .arg(if opts.node_ip.is_some() {
                "--authorization-mode=Node,RBAC"
            } else {
                "--authorization-mode=RBAC"
            })
            .arg("--endpoint-reconciler-type=none")
            .arg("--enable-priority-and-fairness=false")
            .arg("--profiling=false")
            .arg("--v=1");
        if opts.node_ip.is_some() {
            make_cert(
                &pki,
                "apiserver-kubelet-client",
                "/O=system:masters/CN=kube-apiserver-kubelet-client",
                None,
            )?;
            api_cmd
                .arg("--enable-admission-plugins=NodeRestriction")
                .arg(format!(
                    "--kubelet-client-certificate={}",
                    p("apiserver-kubelet-client.crt")
                ))
                .arg(format!(
                    "--kubelet-client-key={}",
                    p("apiserver-kubelet-client.key")
                ))
                .arg(format!("--kubelet-certificate-authority={}", p("ca.crt")))
                // The node's name does not resolve.
                .arg("--kubelet-preferred-address-types=InternalIP,Hostname");
        }
        api_cmd.args(&opts.extra_args);
        let apiserver = Proc::spawn("kube-apiserver", api_cmd, &dir.join("apiserver.log"))?;

        let kubeconfig = dir.join("admin.kubeconfig");
        write_kubeconfig(&kubeconfig, &host, port, &pki, "admin")?;
        // From here on, dropping `cluster` stops both and removes the dir.
        let mut cluster = KubeCluster {
            dir,
            host,
            port,
            kubeconfig,
            apiserver,
            etcd,
        };
        let start = Instant::now();
        loop {
            let out = cluster.kubectl(&["get", "--raw", "/readyz"])?;
            if out.status.success() {
                break;
            }
            if !cluster.apiserver.running() {
                bail!("kube-apiserver exited:\n{}", cluster.apiserver.log_tail(40));
            }
            if start.elapsed() > Duration::from_secs(90) {
                bail!(
                    "kube-apiserver not ready after 90s:\n{}",
                    cluster.apiserver.log_tail(40)
                );
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        // The bootstrap RBAC policy is in place once the default ClusterRoles exist.
        cluster.wait_for(Duration::from_secs(60), "bootstrap RBAC roles", |k| {
            Ok(k.kubectl(&["get", "clusterrole", "system:discovery"])?
                .status
                .success())
        })?;
        eprintln!(
            "kube-apiserver ready on {}:{port} after {:.1}s",
            cluster.host,
            start.elapsed().as_secs_f64()
        );
        Ok(cluster)
    }

    /// A kubeconfig authenticating as the ServiceAccount `kunpeng-tap/<name>` (client
    /// certificate carrying the ServiceAccount's user name and groups, as RBAC sees it).
    pub fn service_account_kubeconfig(&self, file_stem: &str, name: &str) -> Result<PathBuf> {
        self.kubeconfig_for(
            file_stem,
            &format!("system:serviceaccount:kunpeng-tap:{name}"),
            &[
                "system:serviceaccounts",
                "system:serviceaccounts:kunpeng-tap",
            ],
        )
    }

    /// Applies the repository's CRDs (`crds/`) and waits until they are established.
    pub fn apply_crds(&self) -> Result<()> {
        let crds = crate::util::workspace_root().join("crds");
        self.kubectl_ok(&["apply", "-f", &crds.display().to_string()])?;
        self.kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            "--timeout=30s",
            "crd/topologypolicies.tap.kunpeng.io",
            "crd/nodetopologies.tap.kunpeng.io",
        ])?;
        Ok(())
    }

    /// Applies the repository's CRDs ([`Self::apply_crds`]) and RBAC (`deploy/rbac/`).
    pub fn apply_crds_and_rbac(&self) -> Result<()> {
        self.apply_crds()?;
        let rbac = crate::util::workspace_root().join("deploy/rbac");
        self.kubectl_ok(&["apply", "-f", &rbac.display().to_string()])?;
        Ok(())
    }

    /// Installs the NodeResourceTopology CRD that hack/e2e/setup-nrt-crd.sh fetched (or the
    /// file `TAP_NRT_CRD` names) and waits until it is established.
    pub fn install_nrt_crd(&self) -> Result<()> {
        let crd = std::env::var_os("TAP_NRT_CRD")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/cache/kunpeng-tap/nrt/crd.yaml"));
        if !crd.exists() {
            bail!("{} missing: run hack/e2e/setup-nrt-crd.sh", crd.display());
        }
        self.kubectl_ok(&["apply", "-f", &crd.display().to_string()])?;
        self.kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/noderesourcetopologies.topology.node.k8s.io",
        ])?;
        Ok(())
    }

    /// A kubeconfig authenticating as `user` (client certificate, CN = user, O = groups).
    pub fn kubeconfig_for(&self, file_stem: &str, user: &str, groups: &[&str]) -> Result<PathBuf> {
        let pki = self.dir.join("pki");
        let mut subj = String::new();
        for g in groups {
            subj.push_str(&format!("/O={g}"));
        }
        subj.push_str(&format!("/CN={user}"));
        make_cert(&pki, file_stem, &subj, None)?;
        let path = self.dir.join(format!("{file_stem}.kubeconfig"));
        write_kubeconfig(&path, &self.host, self.port, &pki, file_stem)?;
        Ok(path)
    }

    /// Runs kubectl as admin.
    pub fn kubectl(&self, args: &[&str]) -> Result<Output> {
        self.kubectl_as(&self.kubeconfig, args)
    }

    pub fn kubectl_as(&self, kubeconfig: &Path, args: &[&str]) -> Result<Output> {
        Command::new(kubectl_bin())
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg("--request-timeout=10s")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .context("running kubectl")
    }

    /// Runs kubectl as admin; fails with its output unless it succeeds. Returns stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> Result<String> {
        let out = self.kubectl(args)?;
        crate::util::stdout_of("kubectl", args, out)
    }

    /// `kubectl apply -f -` with the given manifest (YAML or JSON).
    pub fn apply(&self, manifest: &str) -> Result<String> {
        self.kubectl_stdin(&["apply", "-f", "-"], manifest)
    }

    /// Runs kubectl as admin with `input` on stdin; fails unless it succeeds.
    pub fn kubectl_stdin(&self, args: &[&str], input: &str) -> Result<String> {
        let out = self.kubectl_stdin_as(&self.kubeconfig, args, input)?;
        crate::util::stdout_of("kubectl", args, out)
    }

    /// Runs kubectl with `kubeconfig` and `input` on stdin; its output, whatever the status.
    pub fn kubectl_stdin_as(
        &self,
        kubeconfig: &Path,
        args: &[&str],
        input: &str,
    ) -> Result<Output> {
        use std::io::Write;
        let mut child = Command::new(kubectl_bin())
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg("--request-timeout=10s")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("running kubectl")?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(input.as_bytes())?;
        }
        Ok(child.wait_with_output()?)
    }

    /// A kubeconfig authenticating with a bearer `token` (e.g. one from `kubectl create token`,
    /// the TokenRequest API).
    pub fn kubeconfig_with_token(&self, file_stem: &str, token: &str) -> Result<PathBuf> {
        let path = self.dir.join(format!("{file_stem}.kubeconfig"));
        let body = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: https://{host}:{port}\n    certificate-authority: {ca}\nusers:\n- name: {file_stem}\n  user:\n    token: {token}\ncontexts:\n- name: e2e\n  context:\n    cluster: e2e\n    user: {file_stem}\ncurrent-context: e2e\n",
            host = self.host,
            port = self.port,
            ca = self.dir.join("pki").join("ca.crt").display(),
        );
        std::fs::write(&path, body)?;
        Ok(path)
    }

    /// `kubectl ... -o json` parsed; `None` when the object is not found.
    pub fn get_json(&self, args: &[&str]) -> Result<Option<serde_json::Value>> {
        let mut a: Vec<&str> = args.to_vec();
        a.extend(["-o", "json"]);
        let out = self.kubectl(&a)?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            if err.contains("NotFound") || err.contains("not found") {
                return Ok(None);
            }
            bail!("kubectl {}: {err}", a.join(" "));
        }
        Ok(Some(serde_json::from_slice(&out.stdout)?))
    }

    /// Polls `check` every 250 ms until it returns true or `timeout` passes.
    pub fn wait_for(
        &self,
        timeout: Duration,
        what: &str,
        mut check: impl FnMut(&KubeCluster) -> Result<bool>,
    ) -> Result<()> {
        let start = Instant::now();
        let mut last_err = None;
        loop {
            match check(self) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => last_err = Some(e),
            }
            if start.elapsed() > timeout {
                match last_err {
                    Some(e) => bail!("timed out after {timeout:?} waiting for {what}: {e:#}"),
                    None => bail!("timed out after {timeout:?} waiting for {what}"),
                }
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for KubeCluster {
    fn drop(&mut self) {
        self.apiserver.terminate(Duration::from_secs(3));
        self.etcd.terminate(Duration::from_secs(3));
        crate::util::remove_unless_kept(&self.dir);
    }
}

fn wait_tcp(port: u16, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("port {port} not listening after {timeout:?}")
}

pub(crate) fn make_ca(pki: &Path) -> Result<()> {
    run_ok(
        Command::new("openssl")
            .args(["req", "-x509", "-nodes", "-newkey", "ec", "-pkeyopt"])
            .arg("ec_paramgen_curve:prime256v1")
            .arg("-keyout")
            .arg(pki.join("ca.key"))
            .arg("-out")
            .arg(pki.join("ca.crt"))
            .args(["-days", "2", "-subj", "/CN=tap-e2e-ca"]),
    )?;
    Ok(())
}

/// A key and a certificate signed by the CA in `pki`.
pub(crate) fn make_cert(pki: &Path, stem: &str, subj: &str, ext: Option<&str>) -> Result<()> {
    let key = pki.join(format!("{stem}.key"));
    let csr = pki.join(format!("{stem}.csr"));
    let crt = pki.join(format!("{stem}.crt"));
    run_ok(
        Command::new("openssl")
            .args(["req", "-new", "-nodes", "-newkey", "ec", "-pkeyopt"])
            .arg("ec_paramgen_curve:prime256v1")
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&csr)
            .args(["-subj", subj]),
    )?;
    let ext_file = pki.join(format!("{stem}.ext"));
    std::fs::write(
        &ext_file,
        ext.unwrap_or("extendedKeyUsage=clientAuth").to_string() + "\n",
    )?;
    run_ok(
        Command::new("openssl")
            .args(["x509", "-req", "-in"])
            .arg(&csr)
            .arg("-CA")
            .arg(pki.join("ca.crt"))
            .arg("-CAkey")
            .arg(pki.join("ca.key"))
            .arg("-CAcreateserial")
            .arg("-out")
            .arg(&crt)
            .args(["-days", "2", "-extfile"])
            .arg(&ext_file),
    )?;
    Ok(())
}

pub(crate) fn write_kubeconfig(
    path: &Path,
    host: &str,
    port: u16,
    pki: &Path,
    stem: &str,
) -> Result<()> {
    let body = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: https://{host}:{port}\n    certificate-authority: {ca}\nusers:\n- name: {stem}\n  user:\n    client-certificate: {crt}\n    client-key: {key}\ncontexts:\n- name: e2e\n  context:\n    cluster: e2e\n    user: {stem}\ncurrent-context: e2e\n",
        ca = pki.join("ca.crt").display(),
        crt = pki.join(format!("{stem}.crt")).display(),
        key = pki.join(format!("{stem}.key")).display(),
    );
    std::fs::write(path, body)?;
    Ok(())
}

pub use crate::util::cargo_bin;

#[cfg(test)]
mod tests {
    /// `BIN_DIR` is the folder of the release hack/e2e/setup-kube.sh builds by default.
    #[test]
    fn bin_dir_is_the_release_setup_kube_builds() {
        let script = crate::util::workspace_root().join("hack/e2e/setup-kube.sh");
        let text = std::fs::read_to_string(script).expect("hack/e2e/setup-kube.sh");
        let version = text
            .lines()
            .find_map(|l| l.strip_prefix("K8S_VERSION=\"${K8S_VERSION:-"))
            .and_then(|rest| rest.strip_suffix("}\""))
            .expect("a default K8S_VERSION in setup-kube.sh");
        assert_eq!(
            super::BIN_DIR,
            format!("/var/cache/kunpeng-tap/kube-{version}")
        );
    }
}
