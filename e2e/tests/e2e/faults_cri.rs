//! The fault matrix of the CRI proxy mode (docs/design/reliability.md) on a real containerd 1.7:
//! every create the runtime accepts succeeds whatever the agent meets, and after each fault
//! (and an agent restart) the agent's accounting equals what the runtime holds.

use anyhow::{ensure, Context, Result};
use k8s_cri::v1 as cri;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};
use tap_e2e::containerd::{
    timed_with_containerd, CgroupQos, ContainerSpec, Containerd, ContainerdOptions, Cri, PodSpec,
};
use tap_e2e::docker::TapAgent;

const GRANT_KEY: &str = "tap.kunpeng.huawei.com/grant";
const FIXTURE: &str = "synthetic-2s-4numa-96c-gpu";

/// Live containers that carry a grant record: what the runtime holds placed.
async fn placed_in_runtime(cri: &mut Cri) -> Result<i64> {
    let live = cri.live_containers().await?;
    Ok(live
        .iter()
        .filter(|c| c.annotations.contains_key(GRANT_KEY))
        .count() as i64)
}

async fn wait_until(what: &str, secs: u64, mut f: impl FnMut() -> Result<bool>) -> Result<()> {
    let until = Instant::now() + Duration::from_secs(secs);
    while !f()? {
        ensure!(Instant::now() < until, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// The ledger equals the runtime's truth, and the agent never panicked.
async fn check_truth(agent: &TapAgent, cri: &mut Cri, when: &str) -> Result<()> {
    let runtime = placed_in_runtime(cri).await?;
    let ours = agent.accounted()?;
    ensure!(
        ours == runtime,
        "{when}: the agent accounts {ours} containers, the runtime holds {runtime} placed"
    );
    ensure!(!agent.panicked(), "{when}: the agent log shows a panic");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
async fn cri_proxy_fault_matrix() -> Result<()> {
    tap_e2e::util::require_e2e_tier();
    let opts = ContainerdOptions::without_nri();
    timed_with_containerd("CRI fault matrix", "tap-crif", opts, scenario).await
}

async fn scenario(ctd: &mut Containerd, dir: &Path) -> Result<()> {
    let proxy = dir.join("cri-proxy.sock");
    let args = ctd.cri_proxy_agent_args(&proxy, Some(FIXTURE), &dir.join("state"));
    let log = dir.join("agent.log");

    // A non-socket file at the endpoint: a clear error, and the file is kept.
    std::fs::write(&proxy, "not a socket")?;
    let refused = TapAgent::start(&args, &log);
    ensure!(refused.is_err(), "the agent started over a regular file");
    ensure!(std::fs::read_to_string(&proxy)? == "not a socket");
    let text = std::fs::read_to_string(&log)?;
    ensure!(text.contains("not a socket"), "no clear message: {text}");
    std::fs::remove_file(&proxy)?;

    // Socket mode under umask 000: still 0600.
    let mut agent = TapAgent::start_with_umask(&args, &log, Some("000"))?;
    let mode = std::fs::metadata(&proxy)?.permissions().mode() & 0o777;
    ensure!(mode == 0o600, "proxy socket mode {mode:o} under umask 000");
    let mut cri = Cri::connect(&proxy).await?;

    // CpuShares 1e17 and CpuQuota i64::MAX: the create succeeds, on the whole machine.
    let huge_pod = cri
        .run_pod(&PodSpec::new("huge", CgroupQos::Burstable))
        .await?;
    let mut huge = ContainerSpec::sleeper("app");
    huge.raw_resources = Some(cri::LinuxContainerResources {
        cpu_shares: 100_000_000_000_000_000,
        cpu_quota: i64::MAX,
        cpu_period: 100_000,
        ..Default::default()
    });
    let c_huge = cri
        .create_container(&huge_pod, &huge)
        .await
        .context("a create with huge CPU values must reach the runtime and succeed")?;
    let (st, _) = cri.container_status(&c_huge).await?;
    let rec = st.annotations.get(GRANT_KEY).cloned().unwrap_or_default();
    ensure!(
        rec.is_empty() || rec.contains("pool=machine"),
        "a request larger than the machine went to one pool: {rec}"
    );
    cri.remove_container(&c_huge).await?;
    check_truth(&agent, &mut cri, "after the huge create").await?;

    // A kubelet retry of a create (same sandbox, name, attempt): the runtime says "name
    // already reserved", and the first container keeps its grant.
    let web = cri
        .run_pod(&PodSpec::new("web", CgroupQos::Burstable))
        .await?;
    let spec = ContainerSpec::cpus("app", 1000, Some(2000));
    let c1 = cri.run_container(&web, &spec).await?;
    let set1 = cri.spec_cpuset(&c1).await?;
    let before = agent.state()?;
    let dup = cri.create_container(&web, &spec).await;
    ensure!(dup.is_err(), "containerd accepted a duplicate create");
    ensure!(
        agent.state()? == before,
        "a duplicate create changed the state"
    );
    ensure!(cri.spec_cpuset(&c1).await? == set1);
    check_truth(&agent, &mut cri, "after a duplicate create").await?;

    // An update the runtime refuses (memory below what the container uses): nothing charged.
    let mut r = ContainerSpec::cpus("app", 8000, Some(16000)).resources();
    r.memory_limit_in_bytes = 4096;
    let refused = cri.update_resources(&c1, r).await;
    ensure!(refused.is_err(), "containerd accepted a 4 KiB memory limit");
    ensure!(agent.state()? == before, "a refused update was charged");

    // An accepted update, then a corrupt state file and an agent restart: same state.
    let r = ContainerSpec::cpus("app", 3000, Some(4000)).resources();
    cri.update_resources(&c1, r).await?;
    let updated = agent.state()?;
    ensure!(updated != before, "the accepted update changed nothing");
    let state_dir = dir.join("state");
    let smode = std::fs::metadata(&state_dir)?.permissions().mode() & 0o777;
    ensure!(smode == 0o700, "state dir mode {smode:o}");
    let file = state_dir.join("cri-grants.json");
    records_soon(&file)?;
    let fmode = std::fs::metadata(&file)?.permissions().mode() & 0o777;
    ensure!(fmode == 0o600, "state file mode {fmode:o}");
    agent.stop();
    drop(agent);
    std::fs::write(&file, "{\"truncated")?;
    let mut agent = TapAgent::start(&args, &log)?;
    ensure!(
        agent.state()? == updated,
        "state after a restart over a corrupt file differs"
    );
    ensure!(state_dir.join("cri-grants.json.corrupt").exists());
    let r = ContainerSpec::cpus("app", 2000, Some(4000)).resources();
    cri.update_resources(&c1, r).await?;
    let saved = records_soon(&file)?;
    ensure!(
        saved.as_object().is_some_and(|o| o.len() == 1),
        "state file after the next update: {saved}"
    );
    check_truth(&agent, &mut cri, "after the corrupt state file").await?;

    // Malformed input on the proxy socket: garbage bytes, then a CreateContainer whose body
    // is not a CreateContainerRequest. The runtime answers; the proxy keeps serving.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::UnixStream::connect(&proxy).await?;
        s.write_all(b"\x00\x00\x01garbage that is no HTTP/2 preface\r\n\r\n")
            .await?;
        let mut buf = [0u8; 256];
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await;
    }
    let ch = tap_e2e::containerd::unix_channel(&proxy).await?;
    let mut raw = tonic::client::Grpc::new(ch);
    raw.ready().await?;
    let bad = raw
        .unary::<_, cri::CreateContainerResponse, _>(
            tonic::Request::new(cri::LinuxContainerResources {
                cpu_period: 5,
                ..Default::default()
            }),
            tonic::codegen::http::uri::PathAndQuery::from_static(
                "/runtime.v1.RuntimeService/CreateContainer",
            ),
            tonic_prost::ProstCodec::default(),
        )
        .await;
    ensure!(bad.is_err(), "a malformed create succeeded");
    cri.raw()
        .version(cri::VersionRequest::default())
        .await
        .context("the proxy stopped serving after malformed input")?;
    check_truth(&agent, &mut cri, "after malformed input").await?;

    // containerd dies and takes its containers with it: the grants are released once it is
    // back (the proxy compares with the runtime's list every few seconds).
    let pid = cri.pid(&c1).await?;
    ctd.stop_daemon()?;
    let _ = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status();
    ctd.restart()?;
    let mut cri = Cri::connect(&proxy).await?;
    let t = Instant::now();
    wait_until(
        "the grant of a container that died to be released",
        20,
        || Ok(agent.accounted()? == 0),
    )
    .await?;
    eprintln!("released {:?} after containerd came back", t.elapsed());
    check_truth(
        &agent,
        &mut cri,
        "after containerd restarted without its containers",
    )
    .await?;

    // And once more after an agent restart.
    agent.stop();
    drop(agent);
    let agent = TapAgent::start(&args, &log)?;
    check_truth(&agent, &mut cri, "after the last agent restart").await?;
    for sb in [huge_pod, web] {
        let _ = cri.remove_pod(&sb).await;
    }
    Ok(())
}

/// The state file's records once the agent's writer thread has stored them (it writes just
/// after a change is committed, off the hook's path).
fn records_soon(file: &std::path::Path) -> Result<serde_json::Value> {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        if let Ok(bytes) = std::fs::read(file) {
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) {
                return Ok(v);
            }
        }
        ensure!(
            Instant::now() < until,
            "{} was never written",
            file.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
