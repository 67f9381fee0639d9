//! Docker proxy mode against a real dockerd, driven by the real `docker` CLI through the proxy.
//!
//! Decisions are made on the 2-socket/4-NUMA/96-CPU fixture and folded onto this host's CPUs
//! (`--fold-cpus-to-host`); exclusive single-CPU grants make the fold visible (one CPU instead
//! of all of them).

use anyhow::{Context, Result};
use std::time::{Duration, Instant};
use tap_e2e::docker::{
    docker_attached, docker_output, temp_dir, unix_get, Dockerd, ProxyEnv as Env, TapAgent, IMAGE,
};
use tap_e2e::text::all_at;
use tap_e2e::util::{self, print_logs_on_failure, RmDir};

const GRANT_KEY: &str = "tap.kunpeng.huawei.com/grant";

fn cpus_allowed(env: &Env, id: &str) -> Result<String> {
    // `docker exec` through the proxy (an upgraded connection).
    let status = env.docker(&["exec", id, "cat", "/proc/self/status"])?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|s| s.trim().to_string())
        .context("no Cpus_allowed_list in /proc/self/status")
}

fn host_cpus() -> Result<String> {
    Ok(std::fs::read_to_string("/sys/devices/system/cpu/online")?
        .trim()
        .to_string())
}

fn metric(agent: &TapAgent, prefix: &str) -> Result<Vec<String>> {
    Ok(agent
        .state()?
        .into_iter()
        .filter(|l| l.starts_with(prefix))
        .collect())
}

#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn docker_proxy_places_passes_through_and_survives_restart() -> Result<()> {
    util::require_e2e_tier();
    let t0 = Instant::now();
    let dir = temp_dir("tap-dkp")?;
    let _rm = RmDir(dir.clone());
    let env = Env {
        dockerd: Dockerd::start()?,
        proxy: dir.join("proxy.sock"),
        dir: dir.clone(),
    };
    let res = scenario(&env);
    print_logs_on_failure(&res, &dir, "dockerd", || env.dockerd.log_tail(40));
    drop(env);
    eprintln!("docker proxy e2e took {:.1?}", t0.elapsed());
    res
}

fn scenario(env: &Env) -> Result<()> {
    let mut agent = env.start_agent()?;
    let host = host_cpus()?;

    // Every path reaches dockerd, as dockerd answers it (its /_ping; versioned paths too).
    let (s, v) = unix_get(&env.proxy, "/_ping")?;
    assert_eq!((s, v.as_str()), (200, "OK"));
    let (s, v) = unix_get(&env.proxy, "/v1.41/version")?;
    assert_eq!(s, 200);
    assert!(v.contains("ApiVersion"), "{v}");

    // A Burstable 4/8 CPU container: one NUMA node on the fixture (0-23 or 24-47 ...),
    // folded onto this host.
    let sb1 = env.sandbox("web", "uid-web", "burstable/poduid-web", &["app=web"])?;
    let c1 = env.container(
        "web",
        "uid-web",
        &sb1,
        "app",
        "burstable/poduid-web",
        4096,
        Some(800_000),
        &[],
    )?;
    let rec1 = env.inspect(
        &c1,
        &format!("{{{{index .Config.Labels \"{GRANT_KEY}\"}}}}"),
    )?;
    assert!(rec1.starts_with("v1;"), "grant label missing: {rec1:?}");
    assert!(
        rec1.contains("pool=numa") || rec1.contains("pool=node"),
        "{rec1}"
    );
    let set1 = env.inspect(&c1, "{{.HostConfig.CpusetCpus}}")?;
    assert!(!set1.is_empty(), "CpusetCpus not set by the proxy");
    assert_eq!(env.dockerd.container_cgroup_cpus(&c1)?, set1);
    assert_eq!(agent.accounted_on("numa")?, 1);

    // A Guaranteed 1-CPU container: an exclusive CPU, i.e. a single host CPU after the fold.
    let sb2 = env.sandbox("db", "uid-db", "poduid-db", &[])?;
    let c2 = env.container(
        "db",
        "uid-db",
        &sb2,
        "db",
        "poduid-db",
        1024,
        Some(100_000),
        &[],
    )?;
    let set2 = env.inspect(&c2, "{{.HostConfig.CpusetCpus}}")?;
    assert!(
        set2.parse::<u32>().is_ok(),
        "expected one exclusive CPU, got {set2:?}"
    );
    assert_eq!(env.dockerd.container_cgroup_cpus(&c2)?, set2);
    // ... which the container really runs on (exec through the proxy).
    assert_eq!(cpus_allowed(env, &c2)?, set2);
    let rec2 = env.inspect(
        &c2,
        &format!("{{{{index .Config.Labels \"{GRANT_KEY}\"}}}}"),
    )?;
    assert!(rec2.contains(";x="), "{rec2}");
    assert!(!rec2.contains(";x=;"), "exclusive CPUs missing: {rec2}");

    // Opted-out Pod (skip label on the sandbox) and a plain container: untouched.
    let sb3 = env.sandbox(
        "skipme",
        "uid-skip",
        "burstable/poduid-skip",
        &["tap.kunpeng.huawei.com/skip=true"],
    )?;
    let c3 = env.container(
        "skipme",
        "uid-skip",
        &sb3,
        "app",
        "burstable/poduid-skip",
        2048,
        Some(400_000),
        &[],
    )?;
    assert_eq!(env.inspect(&c3, "{{.HostConfig.CpusetCpus}}")?, "");
    let rec3 = env.inspect(
        &c3,
        &format!("{{{{index .Config.Labels \"{GRANT_KEY}\"}}}}"),
    )?;
    assert!(rec3.is_empty() || rec3 == "<no value>", "{rec3}");
    let plain = env.docker(&[
        "run",
        "-d",
        "--network=none",
        "--cpu-shares=4096",
        IMAGE,
        "/bin/sleep",
        "3600",
    ])?;
    assert_eq!(env.inspect(&plain, "{{.HostConfig.CpusetCpus}}")?, "");
    assert_eq!(env.dockerd.container_cgroup_cpus(&plain)?, host);
    // Only the two placed containers are accounted (both on NUMA-node pools).
    assert_eq!(agent.accounted_on("numa")?, 2);

    // Hijacked attach with stdin (run -i), streaming logs -f, exec: all through the proxy.
    let out = docker_output(
        &env.proxy,
        &[
            "run",
            "-i",
            "--rm",
            "--network=none",
            IMAGE,
            "/bin/sh",
            "-c",
            "cat; echo done",
        ],
        Some(b"hello through the proxy\n"),
    )?;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hello through the proxy\ndone\n"
    );
    let talker = env.docker(&[
        "run",
        "-d",
        "--network=none",
        IMAGE,
        "/bin/sh",
        "-c",
        "for i in 1 2 3 4 5; do echo line$i; sleep 0.2; done",
    ])?;
    let t = Instant::now();
    let logs = env.docker(&["logs", "-f", &talker])?;
    assert_eq!(logs, "line1\nline2\nline3\nline4\nline5");
    assert!(t.elapsed() < Duration::from_secs(20));
    // `docker attach` to a running container, both ways over the hijacked connection: the
    // container writes only after reading the line attach sends, and attach returns when it
    // exits (no race with how soon attach connects).
    let later = env.docker(&[
        "run",
        "-d",
        "-i",
        "--network=none",
        IMAGE,
        "/bin/sh",
        "-c",
        "read x; echo attached-$x",
    ])?;
    let out = docker_attached(&env.proxy, &["attach", &later], b"ok\n")?;
    assert!(out.status.success(), "docker attach: {out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "attached-ok");

    // Update through the proxy: the grant follows the new request (8/16 CPUs).
    env.docker(&[
        "update",
        "--cpu-shares=8192",
        "--cpu-quota=1600000",
        "--cpu-period=100000",
        &c1,
    ])?;
    let usage = metric(&agent, "tap_topology_node_usage_cpus{")?;
    assert!(
        usage.iter().any(|l| l.ends_with(" 8.0")),
        "no pool shows 8 CPUs used after the update: {usage:?}"
    );
    let set1b = env.inspect(&c1, "{{.HostConfig.CpusetCpus}}")?;
    assert_eq!(env.dockerd.container_cgroup_cpus(&c1)?, set1b);

    // Restart the agent: its state equals the one before (records from labels + update file).
    let before = agent.state()?;
    let st = agent.stop();
    assert!(
        st.map(|s| s.success()).unwrap_or(false),
        "unclean exit: {st:?}"
    );
    assert!(!env.proxy.exists(), "socket left behind");
    drop(agent);
    let mut agent = env.start_agent()?;
    let after = agent.state()?;
    assert_eq!(before, after, "state changed across a restart");
    let log = tap_e2e::util::strip_ansi(&std::fs::read_to_string(env.dir.join("agent.log"))?);
    assert!(
        log.contains("from_record=2"),
        "restore did not use the records"
    );

    // Stop releases (idempotently again at delete); the other grant is untouched.
    env.docker(&["stop", "-t", "1", &c1])?;
    util::wait_until(
        "release at stop",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || Ok(agent.accounted_on("numa")? == 1),
    )?;
    env.docker(&["rm", &c1])?;
    assert_eq!(
        agent.accounted_on("numa")?,
        1,
        "the exclusive grant vanished"
    );
    // Force-delete a running one: released too, everything back to zero.
    env.docker(&["rm", "-f", &c2])?;
    let state = agent.state()?;
    assert!(
        all_at(&state, "container_count", "0"),
        "grants left after delete: {state:?}"
    );
    assert!(
        all_at(&state, "tap_topology_node_usage_cpus{", "0.0"),
        "usage left after delete: {state:?}"
    );
    agent.stop();
    Ok(())
}
