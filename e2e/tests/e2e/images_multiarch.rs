//! e2e: the agent's image for linux/amd64 and linux/arm64 in one OCI image index, and the
//! **arm64** image run as the NRI plugin of the real containerd.
//!
//! The index is made the way a release makes it (hack/build-images.sh: buildah from
//! Dockerfile.agent's `prebuilt` path): the amd64 agent is built here (static glibc), the arm64
//! one is hack/build-arm64.sh's (static musl; the test tier's arm64 step builds it before the
//! e2e tier; `TAP_ARM64_AGENT` names another). containerd imports the arm64 platform of the
//! archive and runs it with `ctr run --platform linux/arm64`, the kernel handing the aarch64
//! binary to qemu-user through a binfmt_misc handler this test registers and removes
//! (tap_e2e::binfmt). The containerized agent then places a Burstable container made through
//! CRI, read back from the container's cgroup; its metrics say it is the aarch64 build.
//!
//! Needs: buildah (hack/e2e/setup-buildah.sh), containerd and runc (setup-containerd.sh), the
//! arm64 agent and the chroot's qemu-aarch64 (hack/build-arm64.sh --agent-only).

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use tap_e2e::binfmt::{Aarch64Handler, Aarch64Runner};
use tap_e2e::containerd::{
    cgroup_cpuset, remove_cgroup_tree, CgroupQos, ContainerSpec, Containerd, ContainerdOptions,
    PodSpec,
};
use tap_e2e::images::{build_static, is_static_elf};
use tap_e2e::util::{self, fixture_dir, workspace_root};

const FIXTURE: &str = "synthetic-2s-4numa-96c-gpu";
const IMAGE: &str = concat!(
    "docker.io/kunpeng-tap/kunpeng-tap-agent:",
    env!("CARGO_PKG_VERSION")
);
const GRANT_KEY: &str = "tap.kunpeng.huawei.com/grant";

/// The arm64 agent hack/build-arm64.sh wrote.
fn arm64_agent() -> PathBuf {
    std::env::var_os("TAP_ARM64_AGENT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/kunpeng-tap/arm64/out/kunpeng-tap"))
}

/// Both binaries where Dockerfile.agent's `prebuilt` path takes them (target/image/<arch>/).
fn stage_binaries() -> PathBuf {
    build_static("node-agent", "kunpeng-tap"); // target/image/amd64/kunpeng-tap
    let arm64 = arm64_agent();
    assert!(
        arm64.exists(),
        "{} missing: bash hack/build-arm64.sh --agent-only (the test tier's arm64 step) builds it",
        arm64.display()
    );
    assert!(is_static_elf(&arm64), "{} is not static", arm64.display());
    let dest = workspace_root().join("target/image/arm64/kunpeng-tap");
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    std::fs::copy(&arm64, &dest).unwrap();
    dest
}

/// hack/build-images.sh: the agent's OCI archive, both platforms.
fn build_index(out: &Path) -> PathBuf {
    let t = Instant::now();
    let st = Command::new("bash")
        .arg(workspace_root().join("hack/build-images.sh"))
        .arg("--out")
        .arg(out)
        .arg("agent")
        .status()
        .expect("running hack/build-images.sh");
    assert!(st.success(), "hack/build-images.sh failed ({st})");
    eprintln!("image index built in {:.1}s", t.elapsed().as_secs_f64());
    out.join(format!(
        "kunpeng-tap-agent-{}.oci.tar",
        env!("CARGO_PKG_VERSION")
    ))
}

/// A blob or file of an OCI archive, as JSON.
fn archive_json(archive: &Path, member: &str) -> Value {
    let out = Command::new("tar")
        .arg("-xOf")
        .arg(archive)
        .arg(member)
        .output()
        .expect("tar");
    assert!(
        out.status.success(),
        "{member} not in {}",
        archive.display()
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{member}: {e}"))
}

fn blob(digest: &Value) -> String {
    let d = digest.as_str().expect("digest");
    format!("blobs/{}", d.replacen(':', "/", 1))
}

/// The archive names IMAGE and holds one image index with exactly linux/amd64 and linux/arm64,
/// each a one-layer image whose config says its architecture and the agent's entrypoint.
fn check_index(archive: &Path) {
    let top = archive_json(archive, "index.json");
    let entry = &top["manifests"][0];
    assert_eq!(
        entry["annotations"]["org.opencontainers.image.ref.name"], IMAGE,
        "{top}"
    );
    assert_eq!(
        entry["mediaType"], "application/vnd.oci.image.index.v1+json",
        "{top}"
    );
    let index = archive_json(archive, &blob(&entry["digest"]));
    let mut platforms = BTreeSet::new();
    for m in index["manifests"].as_array().expect("manifests") {
        let arch = m["platform"]["architecture"].as_str().expect("arch");
        assert_eq!(m["platform"]["os"], "linux", "{m}");
        let manifest = archive_json(archive, &blob(&m["digest"]));
        assert_eq!(
            manifest["layers"].as_array().map(Vec::len),
            Some(1),
            "{manifest}"
        );
        let config = archive_json(archive, &blob(&manifest["config"]["digest"]));
        assert_eq!(config["architecture"], arch, "{config}");
        assert_eq!(
            config["config"]["Entrypoint"],
            serde_json::json!(["/usr/local/bin/kunpeng-tap"])
        );
        platforms.insert(arch.to_string());
    }
    let want: BTreeSet<String> = ["amd64", "arm64"].map(String::from).into();
    assert_eq!(platforms, want, "{index}");
}

/// The agent container (`ctr run -d`); killed and removed on drop.
struct AgentTask<'a> {
    ctd: &'a Containerd,
    id: &'static str,
    log: PathBuf,
}

impl Drop for AgentTask<'_> {
    fn drop(&mut self) {
        let _ = self
            .ctd
            .ctr(&["tasks", "kill", "--signal", "SIGKILL", self.id]);
        std::thread::sleep(Duration::from_millis(500));
        let _ = self.ctd.ctr(&["tasks", "delete", "--force", self.id]);
        let _ = self.ctd.ctr(&["containers", "delete", self.id]);
    }
}

fn bind(src: &Path, dst: &str, mode: &str) -> String {
    format!(
        "type=bind,src={},dst={dst},options=rbind:{mode}",
        src.display()
    )
}

/// `ctr run` of the arm64 image as the NRI plugin (root, host network for /metrics), with the
/// NRI socket's folder, the fixture and a state folder bound in.
fn run_agent<'a>(ctd: &'a Containerd, metrics_port: u16) -> Result<AgentTask<'a>> {
    let log = ctd.dir().join("agent-arm64.log");
    let state = ctd.dir().join("agent-state");
    std::fs::create_dir_all(&state)?;
    let nri_dir = ctd
        .nri_socket()
        .parent()
        .context("NRI socket")?
        .to_path_buf();
    let fixture = fixture_dir(FIXTURE).canonicalize()?;
    let args = [
        "--container-runtime-mode=NRI".to_string(),
        "--nri-socket-path=/nri/nri.sock".into(),
        "--resource-policy=topology-aware".into(),
        "--sysfs-root=/host/sys".into(),
        "--fold-cpus-to-host".into(),
        format!("--metrics-bind-address=127.0.0.1:{metrics_port}"),
        "--state-dir=/state".into(),
    ];
    assert_eq!(
        ctd.nri_socket().file_name().and_then(|n| n.to_str()),
        Some("nri.sock")
    );
    let mut cmd: Vec<String> = vec![
        "run".into(),
        "-d".into(),
        "--platform".into(),
        "linux/arm64".into(),
        "--net-host".into(),
        "--user".into(),
        "0:0".into(),
        "--env".into(),
        "NO_COLOR=1".into(),
        "--log-uri".into(),
        format!("file://{}", log.display()),
        "--mount".into(),
        bind(&nri_dir, "/nri", "rw"),
        "--mount".into(),
        bind(&fixture, "/host/sys", "ro"),
        "--mount".into(),
        bind(&state, "/state", "rw"),
        IMAGE.into(),
        "tap-agent-arm64".into(),
        "/usr/local/bin/kunpeng-tap".into(),
    ];
    cmd.extend(args);
    let refs: Vec<&str> = cmd.iter().map(String::as_str).collect();
    ctd.ctr(&refs)?;
    Ok(AgentTask {
        ctd,
        id: "tap-agent-arm64",
        log,
    })
}

fn wait_log(task: &AgentTask, needle: &str, timeout: Duration) -> Result<String> {
    let deadline = Instant::now() + timeout;
    loop {
        let text = std::fs::read_to_string(&task.log).unwrap_or_default();
        if text.contains(needle) {
            return Ok(text);
        }
        if Instant::now() > deadline {
            bail!("no {needle:?} in the agent's log in {timeout:?}:\n{text}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The host process of the agent container (its task's pid), and the program it runs.
fn task_exe(ctd: &Containerd, id: &str) -> Result<PathBuf> {
    let tasks = ctd.ctr(&["tasks", "ls"])?;
    let pid: u32 = tasks
        .lines()
        .find_map(|l| {
            let mut f = l.split_whitespace();
            (f.next() == Some(id)).then(|| f.next()?.parse().ok())?
        })
        .with_context(|| format!("{id} not in ctr tasks ls:\n{tasks}"))?;
    Ok(std::fs::read_link(format!("/proc/{pid}/exe"))?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
async fn arm64_agent_image_places_a_container_on_containerd() {
    util::require_e2e_tier();
    let t0 = Instant::now();
    let arm64 = stage_binaries();
    let out = util::temp_dir("tap-images").unwrap();
    let archive = build_index(&out);
    check_index(&archive);

    let _cgroups = CgroupGuard;
    remove_cgroup_tree();
    let ctd = Containerd::start(ContainerdOptions::default()).expect("starting containerd");
    let imported = ctd
        .ctr(&[
            "images",
            "import",
            "--platform",
            "linux/arm64",
            &archive.to_string_lossy(),
        ])
        .expect("ctr images import");
    eprintln!("imported: {}", imported.trim());

    let handler = Aarch64Handler::ensure(&arm64).expect("aarch64 binaries runnable");
    eprintln!("aarch64 runner: {:?}", handler.runner);
    let port = util::free_port().unwrap();
    let task = run_agent(&ctd, port).expect("ctr run of the arm64 image");
    let log = wait_log(
        &task,
        "state restored from the runtime",
        Duration::from_secs(60),
    )
    .unwrap_or_else(|e| panic!("{e}\n--- containerd ---\n{}", ctd.log_tail(30)));
    let starting = log
        .lines()
        .find(|l| l.contains("kunpeng-tap starting"))
        .unwrap_or_default();
    assert!(starting.contains("aarch64"), "startup line: {starting}");
    if let Aarch64Runner::Registered(qemu) = &handler.runner {
        let exe = task_exe(&ctd, task.id).unwrap();
        assert_eq!(&exe, qemu, "the agent container runs under qemu-user");
    }
    let metrics = util::http_get(port, "/metrics").unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("tap_build_info{") && l.contains("arch=\"aarch64\"")),
        "tap_build_info of the arm64 agent:\n{metrics}"
    );

    // A Burstable container (4 CPUs requested, 8 limit) made through CRI gets one NUMA node.
    let mut cri = ctd.cri().await.unwrap();
    let sb = cri
        .run_pod(&PodSpec::new("arm64-image", CgroupQos::Burstable))
        .await
        .unwrap();
    let id = cri
        .run_container(&sb, &ContainerSpec::cpus("app", 4000, Some(8000)))
        .await
        .unwrap();
    let ann = cri.spec_annotations(&id).await.unwrap();
    let grant = ann
        .get(GRANT_KEY)
        .unwrap_or_else(|| panic!("no grant record: {ann:?}\n{}", tail(&task.log)));
    let node = match tap_e2e::text::grant_nodes(grant)
        .map(Vec::from_iter)
        .as_deref()
    {
        Ok([n]) => *n,
        _ => panic!("one NUMA node in the grant {grant}"),
    };
    let cgroup = cgroup_cpuset(cri.pid(&id).await.unwrap()).unwrap();
    assert_eq!(
        util::parse_list(&cgroup).unwrap(),
        util::folded_node(node),
        "the container's cgroup cpuset (grant {grant})"
    );
    eprintln!(
        "arm64 agent image: grant {grant}, cgroup cpuset.cpus {cgroup}; {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    cri.remove_all_pods().await.unwrap();
    drop(task);
    drop(handler);
    let _ = std::fs::remove_dir_all(&out);
}

/// Removes the e2e cgroups when the test ends, also on failure (declared first, dropped last).
struct CgroupGuard;
impl Drop for CgroupGuard {
    fn drop(&mut self) {
        remove_cgroup_tree();
    }
}

fn tail(p: &Path) -> String {
    let s = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}
