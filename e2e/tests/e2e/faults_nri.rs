//! The fault matrix of the NRI mode (docs/design/reliability.md) on a real containerd 1.7: creates
//! keep succeeding while the agent is killed, the runtime is killed, the API server is
//! unreachable or the NRI socket talks garbage, and afterwards the agent's accounting equals
//! what the runtime holds.

use anyhow::{ensure, Context, Result};
use k8s_cri::v1 as cri;
use std::path::Path;
use std::time::{Duration, Instant};
use tap_e2e::containerd::{
    timed_with_containerd, CgroupQos, ContainerSpec, Containerd, ContainerdOptions, Cri, PodSpec,
};
use tap_e2e::docker::TapAgent;
use tap_e2e::util::fixture_dir;

const GRANT_KEY: &str = "tap.kunpeng.huawei.com/grant";
const FIXTURE: &str = "synthetic-2s-4numa-96c-gpu";

fn agent_args(nri: &Path, dir: &Path) -> Vec<String> {
    vec![
        "--container-runtime-mode=NRI".into(),
        format!("--nri-socket-path={}", nri.display()),
        format!("--sysfs-root={}", fixture_dir(FIXTURE).display()),
        "--fold-cpus-to-host".into(),
        format!("--state-dir={}", dir.join("state").display()),
        "--graceful-timeout=2s".into(),
        // The API server is unreachable (KUBECONFIG below): placement goes on without it.
        "--enable-node-topology".into(),
        "--node-name=fault-node".into(),
    ]
}

/// Live containers whose OCI spec carries a grant record: what containerd holds placed.
async fn placed_in_runtime(cri: &mut Cri) -> Result<i64> {
    let mut n = 0;
    for c in cri.live_containers().await? {
        if cri.spec_annotations(&c.id).await?.contains_key(GRANT_KEY) {
            n += 1;
        }
    }
    Ok(n)
}

/// Waits until the agent's accounting equals the runtime's (the agent may still be
/// re-synchronizing), then checks the log has no panic.
async fn check_truth(agent: &TapAgent, cri: &mut Cri, when: &str) -> Result<()> {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let (ours, theirs) = (agent.accounted()?, placed_in_runtime(cri).await?);
        if ours == theirs {
            break;
        }
        ensure!(
            Instant::now() < until,
            "{when}: the agent accounts {ours} containers, containerd holds {theirs} placed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ensure!(!agent.panicked(), "{when}: the agent log shows a panic");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
async fn nri_fault_matrix() -> Result<()> {
    tap_e2e::util::require_e2e_tier();
    timed_with_containerd(
        "NRI fault matrix",
        "tap-nrif",
        ContainerdOptions::default(),
        scenario,
    )
    .await
}

async fn scenario(ctd: &mut Containerd, dir: &Path) -> Result<()> {
    // A kubeconfig whose API server is a closed port.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{closed}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: x\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n"
        ),
    )?;
    std::env::set_var("KUBECONFIG", &kubeconfig);
    let log = dir.join("agent.log");
    let args = agent_args(&ctd.nri_socket(), dir);
    let mut agent = TapAgent::start(&args, &log)?;
    let mut cri = ctd.cri().await?;

    // API server unreachable: containers are placed all the same.
    let pod = cri
        .run_pod(&PodSpec::new("loop", CgroupQos::Burstable))
        .await?;
    let first = cri
        .run_container(&pod, &ContainerSpec::cpus("c0", 1000, Some(2000)))
        .await?;
    ensure!(
        !cri.spec_cpuset(&first).await?.is_empty(),
        "not placed while the API server is down"
    );
    check_truth(&agent, &mut cri, "with the API server down").await?;

    // kill -9 of the agent in the middle of a create loop: every create succeeds.
    let mut ids = vec![first];
    for i in 1..7 {
        if i == 3 {
            agent.kill();
        }
        let id = cri
            .run_container(
                &pod,
                &ContainerSpec::cpus(&format!("c{i}"), 1000, Some(2000)),
            )
            .await
            .with_context(|| format!("create {i} around an agent kill -9"))?;
        ids.push(id);
    }
    drop(agent);
    let agent = TapAgent::start(&args, &log)?;
    check_truth(&agent, &mut cri, "after kill -9 in a create loop").await?;

    // containerd killed with SIGKILL and started again: the plugin reconnects and resyncs.
    let restored = agent
        .log_text()
        .matches("state restored from the runtime")
        .count();
    ctd.kill_daemon();
    ctd.restart()?;
    // containerd answers again (the client reconnects), then creates go on.
    let until = Instant::now() + Duration::from_secs(20);
    while cri
        .raw()
        .version(cri::VersionRequest::default())
        .await
        .is_err()
    {
        ensure!(Instant::now() < until, "containerd did not come back");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The plugin reconnected and resynced before the next create (else that create would go
    // unplaced and the books would agree without the reconnection having been tested).
    while agent
        .log_text()
        .matches("state restored from the runtime")
        .count()
        <= restored
    {
        ensure!(
            Instant::now() < until,
            "the agent did not resync with the restarted containerd:\n{}",
            agent.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let after = cri
        .run_container(&pod, &ContainerSpec::cpus("after-kill", 1000, Some(2000)))
        .await?;
    ids.push(after);
    check_truth(&agent, &mut cri, "after containerd kill -9 and restart").await?;

    // Removing releases; the books stay equal.
    for id in ids.iter().take(3) {
        cri.stop_container(id).await?;
        cri.remove_container(id).await?;
    }
    check_truth(&agent, &mut cri, "after removals").await?;
    drop(agent);
    let _ = cri.remove_pod(&pod).await;

    // Malformed NRI frames: a socket that answers the plugin with garbage. The agent drops the
    // connection and tries again; it never panics.
    let fake = dir.join("fake-nri.sock");
    let listener = tokio::net::UnixListener::bind(&fake)?;
    let fake_args = agent_args(&fake, &dir.join("fake"));
    let fake_log = dir.join("agent-fake.log");
    let bin = tap_e2e::util::agent_binary()?;
    // stderr too: a panic message goes there (tokio would keep the process alive).
    let out = std::fs::File::create(&fake_log)?;
    let mut child = std::process::Command::new(bin)
        .args(&fake_args)
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()?;
    // Three rounds of garbage, then a fourth connection: the proof the agent survived them.
    for round in 0..4 {
        use tokio::io::AsyncWriteExt;
        let (mut s, _) = tokio::time::timeout(Duration::from_secs(20), listener.accept())
            .await
            .with_context(|| format!("the agent did not reconnect (round {round})"))??;
        if round == 3 {
            break;
        }
        // A frame header claiming a 4 GiB payload, then random bytes. The agent may close the
        // connection as soon as it reads the header (a broken pipe here): that is the point.
        let _ = s.write_all(&[0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff]).await;
        let _ = s.write_all(&[0x5a; 64]).await;
        drop(s);
    }
    ensure!(
        child.try_wait()?.is_none(),
        "the agent exited on malformed frames"
    );
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&fake_log)?;
    ensure!(
        !text.contains("panicked"),
        "panic on malformed frames:\n{text}"
    );
    Ok(())
}
