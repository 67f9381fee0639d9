//! e2e: `Dockerfile.agent` and `Dockerfile.operator` build on a real Docker engine and the
//! images run.
//!
//! There is no registry here, so the binaries are built on the host (static glibc,
//! `-C target-feature=+crt-static`), placed in `target/image/`, and the Dockerfiles' `prebuilt`
//! path copies them onto `scratch` (`--build-arg BINARIES=prebuilt`, BuildKit skips the Rust
//! stage). Each test starts its own dockerd (own data root, exec root, pid file and unix socket
//! in a temp dir, no iptables, no bridge) and stops it on drop, failure included.
//!
//! Needs: dockerd and its CLI (Debian `docker.io`, hack/e2e/setup-docker.sh), containerd and
//! runc. `TAP_DOCKER_CLI` / `TAP_DOCKERD` override the binaries (the CLI must build with
//! `DOCKER_BUILDKIT=1` without buildx, as Docker 20.10's does).

use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use tap_e2e::images::build_static;
use tap_e2e::util::{fixture_dir, workspace_root};

fn dockerd_bin() -> String {
    std::env::var("TAP_DOCKERD").unwrap_or_else(|_| "/usr/sbin/dockerd".into())
}

fn docker_cli() -> String {
    std::env::var("TAP_DOCKER_CLI").unwrap_or_else(|_| "/usr/bin/docker".into())
}

/// A private dockerd on a unix socket in a temp dir; stopped and cleaned on drop.
struct Dockerd {
    child: Option<Child>,
    dir: PathBuf,
    sock: PathBuf,
}

impl Dockerd {
    fn start(tag: &str) -> Dockerd {
        let bin = dockerd_bin();
        assert!(
            Path::new(&bin).exists(),
            "{bin} not found: install docker.io (hack/e2e/setup-docker.sh) or set TAP_DOCKERD"
        );
        let dir = std::env::temp_dir().join(format!("tap-e2e-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("temp dir");
        let sock = dir.join("docker.sock");
        // An empty config file: never read the machine's /etc/docker/daemon.json.
        fs::write(dir.join("daemon.json"), "{}").expect("daemon.json");
        let log = fs::File::create(dir.join("dockerd.log")).expect("dockerd.log");
        let child = tap_e2e::docker::dockerd_command(&bin, &dir)
            .arg(format!(
                "--config-file={}",
                dir.join("daemon.json").display()
            ))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {bin}: {e}"));
        let mut d = Dockerd {
            child: Some(child),
            dir,
            sock,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if d.sock.exists() {
                let out = d.docker(&["version", "--format", "{{.Server.Version}}"]);
                if out.status.success() {
                    eprintln!(
                        "dockerd {} on {}",
                        String::from_utf8_lossy(&out.stdout).trim(),
                        d.sock.display()
                    );
                    break;
                }
            }
            if let Some(Ok(Some(st))) = d.child.as_mut().map(|c| c.try_wait()) {
                panic!("dockerd exited ({st}) at start:\n{}", d.log());
            }
            assert!(
                Instant::now() < deadline,
                "dockerd not ready in 60s:\n{}",
                d.log()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
        d
    }

    fn log(&self) -> String {
        let s = fs::read_to_string(self.dir.join("dockerd.log")).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new(docker_cli());
        c.arg(format!("--host=unix://{}", self.sock.display()))
            .env("DOCKER_BUILDKIT", "1")
            .env("DOCKER_CONFIG", self.dir.join("cli"))
            .stdin(Stdio::null());
        c
    }

    fn docker(&self, args: &[&str]) -> Output {
        self.cmd()
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running {} {args:?}: {e}", docker_cli()))
    }

    /// Runs docker and fails the test with its output when it fails.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.docker(args);
        assert!(
            out.status.success(),
            "docker {args:?} failed ({}):\n{}{}\n--- dockerd log ---\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([sig, &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| !s.contains(") Z "))
            .unwrap_or(false)
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        // The containerd dockerd started for itself (it normally stops it on exit).
        let containerd_pid = fs::read_to_string(self.dir.join("exec/containerd/containerd.pid"))
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok());
        if let Some(mut child) = self.child.take() {
            signal(child.id(), "-TERM");
            let deadline = Instant::now() + Duration::from_secs(15);
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(100))
                    }
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
        if let Some(pid) = containerd_pid {
            if alive(pid) {
                signal(pid, "-KILL");
            }
        }
        // Whatever is still mounted under the temp dir (netns files, shm), deepest first.
        tap_e2e::util::unmount_under(&self.dir);
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// `docker build` of one Dockerfile's prebuilt path; returns `docker image inspect` of it.
fn build_image(d: &Dockerd, dockerfile: &str, tag: &str) -> Value {
    let root = workspace_root();
    let start = Instant::now();
    d.ok(&[
        "build",
        "--progress=plain",
        "--build-arg",
        "BINARIES=prebuilt",
        "-f",
        &root.join(dockerfile).to_string_lossy(),
        "-t",
        tag,
        &root.to_string_lossy(),
    ]);
    eprintln!(
        "docker build -f {dockerfile}: {:.1}s",
        start.elapsed().as_secs_f64()
    );
    let inspect: Value =
        serde_json::from_str(&d.ok(&["image", "inspect", tag])).expect("image inspect JSON");
    inspect[0].clone()
}

/// The long flags the chart passes in a template's `args:` (`- --flag=...` lines).
fn chart_flags(template: &str) -> Vec<String> {
    let text = fs::read_to_string(
        workspace_root()
            .join("charts/kunpeng-tap/templates")
            .join(template),
    )
    .expect("chart template");
    let mut flags: Vec<String> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- --"))
        .map(|f| {
            let end = f.find(['=', ' ', '"']).unwrap_or(f.len());
            format!("--{}", &f[..end])
        })
        .collect();
    flags.dedup();
    flags
}

fn check_final_image(img: &Value, entrypoint: &str) {
    let cfg = &img["Config"];
    assert_eq!(cfg["User"], "65532:65532", "image must default to non-root");
    assert_eq!(cfg["Entrypoint"], serde_json::json!([entrypoint]));
    let layers = img["RootFS"]["Layers"].as_array().expect("layers");
    assert_eq!(
        layers.len(),
        1,
        "scratch + one binary = one layer, got {layers:?}"
    );
    let size = img["Size"].as_u64().expect("image size");
    eprintln!("image {entrypoint}: {:.1} MiB", size as f64 / 1048576.0);
    assert!(size < 64 << 20, "image unexpectedly large: {size} bytes");
}

/// Builds `bin` of `package` static, then image `tag` from `dockerfile` on a private dockerd;
/// checks the final image and returns the dockerd and what `--version` printed in a container
/// of it run as the image's non-root user, without network, on a read-only root.
fn image_version(package: &str, bin: &str, dockerfile: &str, tag: &str) -> (Dockerd, String) {
    build_static(package, bin);
    let image = dockerfile.trim_start_matches("Dockerfile.");
    let d = Dockerd::start(&format!("{image}-image"));
    let img = build_image(&d, dockerfile, tag);
    check_final_image(&img, &format!("/usr/local/bin/{bin}"));
    let v = d.ok(&[
        "run",
        "--rm",
        "--network=none",
        "--read-only",
        tag,
        "--version",
    ]);
    (d, v)
}

#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn agent_image_builds_from_dockerfile_and_runs_on_scratch() {
    tap_e2e::util::require_e2e_tier();
    let t0 = Instant::now();
    let tag = "kunpeng-tap-agent:e2e";
    let (d, v) = image_version("node-agent", "kunpeng-tap", "Dockerfile.agent", tag);
    assert_eq!(
        v.trim(),
        format!("kunpeng-tap {}", env!("CARGO_PKG_VERSION")),
        "version line"
    );

    // Every flag the chart passes exists in this binary.
    let help = d.ok(&["run", "--rm", "--network=none", tag, "--help"]);
    let flags = chart_flags("agent-daemonset.yaml");
    assert!(flags.len() >= 20, "parsed {flags:?}");
    for f in &flags {
        assert!(
            help.contains(f.as_str()),
            "chart passes {f}, the agent image does not know it:\n{help}"
        );
    }

    // With the chart's security context (uid 0, every capability dropped, no privilege
    // escalation, read-only root) and a sysfs tree mounted read-only the way the chart mounts
    // the host's /sys: discovery and placement work inside the image.
    let fixture = fixture_dir("synthetic-2s-4numa-96c-gpu");
    let fixture = fixture.canonicalize().unwrap_or_else(|e| {
        panic!(
            "{}: {e} (the repository ships it as a dump in fixtures/sysfs)",
            fixture.display()
        )
    });
    let mount = format!(
        "type=bind,source={},target=/host/sys,readonly",
        fixture.display()
    );
    let out = d.ok(&[
        "run",
        "--rm",
        "--network=none",
        "--read-only",
        "--user=0:0",
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
        "--mount",
        &mount,
        tag,
        "--explain",
        "--sysfs-root=/host/sys",
    ]);
    assert!(
        out.contains("96 CPUs online") && out.contains("4 NUMA nodes"),
        "explain output inside the image:\n{out}"
    );
    eprintln!("agent image test: {:.1}s", t0.elapsed().as_secs_f64());
}

#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn operator_image_builds_from_dockerfile_and_runs_on_scratch() {
    tap_e2e::util::require_e2e_tier();
    let t0 = Instant::now();
    assert!(
        workspace_root().join("operator/Cargo.toml").exists(),
        "operator/ crate (tap-operator, binary kunpeng-tap-operator) is not in this checkout"
    );
    let tag = "kunpeng-tap-operator:e2e";
    let (d, v) = image_version(
        "tap-operator",
        "kunpeng-tap-operator",
        "Dockerfile.operator",
        tag,
    );
    assert!(
        v.trim().starts_with("kunpeng-tap-operator "),
        "version line: {v}"
    );
    let help = d.ok(&["run", "--rm", "--network=none", tag, "--help"]);
    for f in chart_flags("operator-deployment.yaml") {
        assert!(
            help.contains(f.as_str()),
            "chart passes {f}, the operator image does not know it:\n{help}"
        );
    }
    eprintln!("operator image test: {:.1}s", t0.elapsed().as_secs_f64());
}
