//! Start-up is bounded whatever the runtime does: a CRI runtime that
//! accepts connections and never answers (a wedged containerd) does not keep the proxy socket
//! away from the kubelet. The socket is bound within `RESTORE_BOUND` (15 s), the agent says it
//! is not ready, and calls are forwarded unadjusted until the restore finishes.

use anyhow::{ensure, Context, Result};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tap_e2e::docker::{free_port, tcp_get, terminate};
use tap_e2e::util::{self, RmDir};

#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn the_proxy_socket_is_bound_within_a_bound_when_the_runtime_never_answers() -> Result<()> {
    util::require_e2e_tier();
    let dir = util::temp_dir("tap-wedged")?;
    let _rm = RmDir(dir.clone());
    // The wedged runtime: a socket that accepts and never says a word.
    let backend = dir.join("containerd.sock");
    let listener = std::os::unix::net::UnixListener::bind(&backend)?;
    let held = std::thread::spawn(move || {
        let mut conns = Vec::new();
        for c in listener.incoming().take(64) {
            match c {
                Ok(c) => conns.push(c),
                Err(_) => break,
            }
        }
        conns.len()
    });
    let proxy = dir.join("proxy.sock");
    let metrics = format!("127.0.0.1:{}", free_port()?);
    let log = dir.join("agent.log");
    let bin = util::agent_binary()?;
    let started = Instant::now();
    let mut agent = Command::new(bin)
        .args([
            "--container-runtime-mode=Containerd".to_string(),
            format!("--runtime-proxy-endpoint={}", proxy.display()),
            format!("--container-runtime-service-endpoint={}", backend.display()),
            format!(
                "--sysfs-root={}",
                util::fixture_dir("synthetic-2s-4numa-96c-gpu").display()
            ),
            "--fold-cpus-to-host".into(),
            format!("--state-dir={}", dir.join("state").display()),
            format!("--metrics-bind-address={metrics}"),
        ])
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log)?)
        .stderr(std::fs::File::create(dir.join("agent.err"))?)
        .spawn()
        .context("starting kunpeng-tap")?;
    let res = (|| {
        while !proxy.exists() {
            ensure!(
                started.elapsed() < Duration::from_secs(25),
                "the proxy socket is not bound after 25 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let bound = started.elapsed();
        eprintln!("proxy socket bound after {bound:.1?} with a runtime that never answers");
        ensure!(
            bound >= Duration::from_secs(10),
            "bound before the restore bound: {bound:?}"
        );
        let (ready, _) = tcp_get(&metrics, "/readyz")?;
        ensure!(ready == 503, "/readyz answered {ready} before any restore");
        let (health, _) = tcp_get(&metrics, "/healthz")?;
        ensure!(health == 200, "/healthz answered {health}");
        let text = std::fs::read_to_string(dir.join("agent.err"))?;
        ensure!(
            text.contains("forwarding every call unadjusted"),
            "no fail-open line in the log:\n{text}"
        );
        Ok(())
    })();
    terminate(&mut agent, Duration::from_secs(10));
    drop(held);
    if res.is_err() {
        let out = std::fs::read_to_string(&log).unwrap_or_default();
        let err = std::fs::read_to_string(dir.join("agent.err")).unwrap_or_default();
        eprintln!("--- agent log ---\n{out}\n--- stderr ---\n{err}");
    }
    res
}
