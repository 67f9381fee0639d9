//! The fault matrix of the Docker proxy mode (docs/design/reliability.md) on a real dockerd: every
//! create reaches dockerd whatever the agent meets, and after each fault (and an agent
//! restart) the agent's accounting equals what dockerd holds.

use anyhow::{ensure, Result};
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};
use tap_e2e::docker::{docker, temp_dir, unix_get, unix_post, Dockerd, ProxyEnv, TapAgent};
use tap_e2e::util::{self, print_logs_on_failure, RmDir};

const GRANT_KEY: &str = "tap.kunpeng.huawei.com/grant";

/// Running containers that carry a grant label: what dockerd holds placed.
fn placed_in_dockerd(env: &ProxyEnv) -> Result<i64> {
    let out = docker(
        &env.dockerd.socket(),
        &["ps", "--format", &format!("{{{{.Label \"{GRANT_KEY}\"}}}}")],
    )?;
    Ok(out.lines().filter(|l| l.starts_with("v1;")).count() as i64)
}

fn check_truth(agent: &TapAgent, env: &ProxyEnv, when: &str) -> Result<()> {
    let ours = agent.accounted()?;
    let theirs = placed_in_dockerd(env)?;
    ensure!(
        ours == theirs,
        "{when}: the agent accounts {ours} containers, dockerd runs {theirs} placed"
    );
    ensure!(!agent.panicked(), "{when}: the agent log shows a panic");
    Ok(())
}

/// A create body the way cri-dockerd sends it, with raw CPU values.
fn create_body(pod: &str, sandbox: &str, shares: u64, quota: i64, env_bytes: usize) -> Vec<u8> {
    let filler = "x".repeat(env_bytes);
    serde_json::json!({
        "Image": tap_e2e::docker::IMAGE,
        "Cmd": ["/bin/sleep", "3600"],
        "Env": [format!("FILLER={filler}")],
        "Labels": {
            "io.kubernetes.pod.name": pod,
            "io.kubernetes.pod.namespace": "default",
            "io.kubernetes.pod.uid": format!("uid-{pod}"),
            "io.kubernetes.container.name": "app",
            "io.kubernetes.docker.type": "container",
            "io.kubernetes.sandbox.id": sandbox,
        },
        "HostConfig": {
            "CpuShares": shares,
            "CpuQuota": quota,
            "CpuPeriod": 100000,
            "NetworkMode": "none",
        }
    })
    .to_string()
    .into_bytes()
}

/// Waits (20 s at most) until the agent accounts `n` containers.
fn wait_accounted(agent: &TapAgent, n: i64, what: &str) -> Result<()> {
    util::wait_until(
        what,
        Duration::from_secs(20),
        Duration::from_millis(100),
        || Ok(agent.accounted()? == n),
    )
}

#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn docker_proxy_fault_matrix() -> Result<()> {
    util::require_e2e_tier();
    let t0 = Instant::now();
    let dir = temp_dir("tap-dkf")?;
    let _rm = RmDir(dir.clone());
    let mut env = ProxyEnv {
        dockerd: Dockerd::start()?,
        proxy: dir.join("proxy.sock"),
        dir: dir.clone(),
    };
    let res = scenario(&mut env);
    print_logs_on_failure(&res, &dir, "dockerd", || env.dockerd.log_tail(40));
    drop(env);
    eprintln!("Docker fault matrix took {:.1?}", t0.elapsed());
    res
}

fn scenario(env: &mut ProxyEnv) -> Result<()> {
    let log = env.dir.join("agent.log");
    let args = env.agent_args();
    // Socket mode under umask 000: still 0600.
    let mut agent = TapAgent::start_with_umask(&args, &log, Some("000"))?;
    let mode = std::fs::metadata(&env.proxy)?.permissions().mode() & 0o777;
    ensure!(mode == 0o600, "proxy socket mode {mode:o} under umask 000");

    let sb = env.sandbox("web", "uid-web", "burstable/poduid-web", &[])?;

    // CpuShares 1e17 and CpuQuota i64::MAX: dockerd gets the create and answers it.
    let (s, body) = unix_post(
        &env.proxy,
        "/v1.41/containers/create?name=k8s_app_huge_default_uid-huge_0",
        &create_body("huge", &sb, 100_000_000_000_000_000, i64::MAX, 0),
    )?;
    ensure!(
        !body.contains("kunpeng-tap proxy"),
        "the proxy answered instead of dockerd: {s} {body}"
    );
    let _ = docker(&env.proxy, &["rm", "-f", "k8s_app_huge_default_uid-huge_0"]);
    check_truth(&agent, env, "after the huge create")?;

    // A retried create (same name): dockerd answers 409 and the first keeps its grant.
    let c1 = env.container(
        "web",
        "uid-web",
        &sb,
        "app",
        "burstable/poduid-web",
        1024,
        Some(200_000),
        &[],
    )?;
    let set1 = env.inspect(&c1, "{{.HostConfig.CpusetCpus}}")?;
    let before = agent.state()?;
    let (s, _) = unix_post(
        &env.proxy,
        "/v1.41/containers/create?name=k8s_app_web_default_uid-web_0",
        &create_body("web", &sb, 1024, 200_000, 0),
    )?;
    ensure!(s == 409, "a duplicate name was answered {s}");
    ensure!(
        agent.state()? == before,
        "a duplicate create changed the state"
    );
    ensure!(env.inspect(&c1, "{{.HostConfig.CpusetCpus}}")? == set1);
    check_truth(&agent, env, "after a duplicate create")?;

    // An update dockerd refuses (memory below its 6 MB minimum): nothing charged.
    let refused = env.docker(&["update", "--cpu-shares=8192", "--memory=4096", &c1]);
    ensure!(refused.is_err(), "dockerd accepted a 4 KiB memory limit");
    ensure!(agent.state()? == before, "a refused update was charged");

    // An accepted update, then a corrupt state file and an agent restart: same state.
    env.docker(&["update", "--cpu-shares=3072", "--cpu-quota=400000", &c1])?;
    let updated = agent.state()?;
    ensure!(updated != before, "the accepted update changed nothing");
    let file = env.dir.join("state/docker-grants.json");
    // The agent's writer thread stores the records just after the update is committed.
    let written = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !file.exists() && std::time::Instant::now() < written {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let fmode = std::fs::metadata(&file)?.permissions().mode() & 0o777;
    ensure!(fmode == 0o600, "state file mode {fmode:o}");
    agent.stop();
    drop(agent);
    std::fs::write(&file, "[1, 2")?;
    let mut agent = env.start_agent()?;
    ensure!(
        agent.state()? == updated,
        "state after a restart over a corrupt file differs"
    );
    check_truth(&agent, env, "after the corrupt state file")?;

    // A 64 MiB create body: streamed to dockerd unmodified, the agent's memory stays bounded.
    let base = agent.peak_rss_kib()?;
    let (s, body) = unix_post(
        &env.proxy,
        "/v1.41/containers/create?name=k8s_app_big_default_uid-big_0",
        &create_body("big", &sb, 1024, 100_000, 64 << 20),
    )?;
    ensure!(
        !body.contains("kunpeng-tap proxy"),
        "the proxy answered instead of dockerd: {s} {body}"
    );
    let peak = agent.peak_rss_kib()?;
    eprintln!("agent peak RSS {base} KiB before, {peak} KiB after a 64 MiB body");
    ensure!(
        peak < base + 40 * 1024,
        "a 64 MiB body grew the agent from {base} to {peak} KiB"
    );
    let _ = docker(&env.proxy, &["rm", "-f", "k8s_app_big_default_uid-big_0"]);

    // Malformed HTTP and JSON: the proxy keeps serving.
    {
        use std::io::{Read, Write};
        let mut s = std::os::unix::net::UnixStream::connect(&env.proxy)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"\x16\x03\x01 not http at all\r\n\r\n")?;
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
    }
    let (s, _) = unix_post(&env.proxy, "/v1.41/containers/create", b"{\"Labels\": [")?;
    ensure!(s >= 400, "malformed JSON was answered {s}");
    ensure!(unix_get(&env.proxy, "/_ping")?.0 == 200);
    check_truth(&agent, env, "after malformed input")?;

    // dockerd restarts and stops its containers: their grants are released.
    ensure!(agent.accounted()? == 1);
    env.dockerd.restart()?;
    let t = Instant::now();
    wait_accounted(&agent, 0, "the grants of stopped containers to be released")?;
    eprintln!("released {:?} after dockerd came back", t.elapsed());
    check_truth(&agent, env, "after a dockerd restart")?;

    // Started again (outside the proxy): adopted again from its grant label.
    docker(&env.dockerd.socket(), &["start", &c1])?;
    wait_accounted(&agent, 1, "a restarted container to be adopted again")?;
    check_truth(&agent, env, "after the container was started again")?;

    agent.stop();
    drop(agent);
    let agent = env.start_agent()?;
    check_truth(&agent, env, "after the last agent restart")?;
    Ok(())
}
