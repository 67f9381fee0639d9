//! The cluster tier, CRI proxy mode: a kubelet retry after a slow create does not lose a grant.
//!
//! Its own test binary, so its own cluster (`tap_e2e::cluster`, started once here): the
//! kubelet's `runtimeRequestTimeout` is 8 s and containerd's NRI request timeout 25 s. The agent
//! runs as a host process in CRI proxy mode with the kubelet's runtime endpoint at its socket.
//! A second NRI plugin (a kunpeng-tap in NRI mode) registers with containerd and is stopped
//! (SIGSTOP), so containerd's CreateContainer waits for it: the kubelet's CreateContainer
//! through the proxy times out after 8 s, and the kubelet retries, as a real kubelet does. When
//! the Pod finally runs, its container must carry a grant and the agent's books must hold
//! exactly the containers that run (no grant lost, none leaked).
//!
//! What happens (measured 2026-12-03): the kubelet's deadline cuts containerd's wait for the
//! stopped plugin, containerd goes on without it and creates attempt 0 anyway, but the kubelet
//! has already seen DeadlineExceeded and creates attempt 1, which runs with a grant. Attempt 0
//! stays created and never starts; the proxy sees that the kubelet went away before the answer
//! and releases attempt 0's grant, so the books hold exactly the running container.

use anyhow::{ensure, Context, Result};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tap_e2e::cluster::{Cluster, ClusterOptions, RuntimeEndpoint};
use tap_e2e::containerd::{cgroup_cpuset, Cri, BUSYBOX_IMAGE};
use tap_e2e::docker::TapAgent;
use tap_e2e::util::{self};

const FIXTURE: &str = "synthetic-2s-4numa-96c-gpu";
/// How often the tier polls what it waits for.
const POLL: Duration = Duration::from_millis(500);
const GRANT_KEY: &str = "tap.kunpeng.huawei.com/grant";

/// Containers the proxy agent has placed (its NUMA-level container counts).
fn placed_count(agent: &TapAgent) -> Result<i64> {
    Ok(agent
        .state()?
        .iter()
        .filter(|l| l.starts_with("tap_topology_node_containers{"))
        .filter(|l| l.contains("level=\"numa\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<i64>().ok())
        .sum())
}

fn scenario(cl: &mut Cluster, rt: &tokio::runtime::Runtime) -> Result<()> {
    let proxy = cl.dir.join("tap-proxy.sock");
    let mut args =
        cl.containerd()
            .cri_proxy_agent_args(&proxy, Some(FIXTURE), &cl.dir.join("proxy-state"));
    args.extend([
        "--resource-policy=numa-aware".to_string(),
        "--enable-node-topology=false".to_string(),
    ]);
    let agent = TapAgent::start(&args, &cl.dir.join("proxy-agent.log"))?;
    let result = (|| -> Result<()> {
        cl.set_runtime_endpoint(RuntimeEndpoint::Proxy(proxy.clone()))?;

        // The slow part: an NRI plugin that stops answering.
        let log = std::fs::File::create(cl.dir.join("slow-plugin.log"))?;
        let mut slow = Command::new(util::agent_binary()?)
            .arg("--container-runtime-mode=NRI")
            .arg(format!(
                "--nri-socket-path={}",
                cl.containerd().nri_socket().display()
            ))
            .args(["--nri-plugin-name=slow", "--nri-plugin-index=90"])
            .arg("--enable-node-topology=false")
            .arg("--metrics-bind-address=")
            .arg(format!(
                "--state-dir={}",
                cl.dir.join("slow-state").display()
            ))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let slow_log = cl.dir.join("slow-plugin.log");
        util::wait_until(
            "the slow plugin registered",
            Duration::from_secs(30),
            POLL,
            || Ok(std::fs::read_to_string(&slow_log)?.contains("state restored from the runtime")),
        )?;
        let _ = Command::new("kill")
            .args(["-STOP", &slow.id().to_string()])
            .status();

        let log_before = cl.kubelet_log().len();
        let t0 = Instant::now();
        cl.kube().apply(
            &serde_json::json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "retry", "namespace": "default"},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{
                        "name": "app", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                        "command": ["/bin/sleep", "36000"],
                        "resources": {"requests": {"cpu": "250m", "memory": "64Mi"},
                                      "limits": {"cpu": "500m", "memory": "64Mi"}},
                    }],
                },
            })
            .to_string(),
        )?;
        // The kubelet's first CreateContainer times out (8 s) while containerd waits: a line
        // logged after the Pod was applied, naming both (an earlier timeout of another call
        // must not end the wait before this one).
        util::wait_until(
            "the kubelet's CreateContainer timing out",
            Duration::from_secs(60),
            POLL,
            || {
                let log = cl.kubelet_log();
                Ok(log.get(log_before..).is_some_and(|new| {
                    new.lines()
                        .any(|l| l.contains("CreateContainer") && l.contains("DeadlineExceeded"))
                }))
            },
        )?;
        eprintln!(
            "kubelet CreateContainer timed out after {:.1}s",
            t0.elapsed().as_secs_f64()
        );
        let _ = Command::new("kill")
            .args(["-KILL", &slow.id().to_string()])
            .status();
        let _ = slow.wait();

        util::wait_until("Pod retry Running", Duration::from_secs(180), POLL, || {
            let p = cl
                .kube()
                .get_json(&["-n", "default", "get", "pod", "retry"])?
                .context("no pod")?;
            Ok(p["status"]["containerStatuses"][0]["ready"] == true)
        })?;
        eprintln!(
            "Pod running {:.1}s after creation",
            t0.elapsed().as_secs_f64()
        );
        let p = cl
            .kube()
            .get_json(&["-n", "default", "get", "pod", "retry"])?
            .context("no pod")?;
        let id = p["status"]["containerStatuses"][0]["containerID"]
            .as_str()
            .context("no container id")?
            .trim_start_matches("containerd://")
            .to_string();
        let sock = cl.containerd().cri_socket();
        let (grant, spec, pid) = rt.block_on(async {
            let mut cri = Cri::connect(&sock).await?;
            let (st, _) = cri.container_status(&id).await?;
            let spec = cri.spec_cpuset(&id).await?;
            let pid = cri.pid(&id).await?;
            anyhow::Ok((st.annotations.get(GRANT_KEY).cloned(), spec, pid))
        })?;
        eprintln!(
            "retried Pod: grant {grant:?}, CRI cpuset {spec:?}, cgroup {:?}",
            cgroup_cpuset(pid)?
        );
        ensure!(grant.is_some(), "the running container has no grant");
        ensure!(!spec.is_empty(), "the running container has no cpuset");
        ensure!(cgroup_cpuset(pid)? == spec, "cgroup and CRI cpusets differ");
        // Exactly one container is placed: the one that runs.
        util::wait_until(
            "the agent's books hold exactly the running container",
            Duration::from_secs(30),
            POLL,
            || Ok(placed_count(&agent)? == 1),
        )
        .with_context(|| format!("agent state: {:?}", agent.state()))?;
        Ok(())
    })();
    if result.is_err() {
        eprintln!("--- proxy agent log\n{}", agent.log_tail(80));
        eprintln!("{}", cl.logs_tail(60));
    }
    drop(agent);
    result
}

#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn cluster_cri_proxy_kubelet_retry_keeps_the_grant() {
    util::require_e2e_tier();
    let t0 = Instant::now();
    let mut cl = Cluster::start_with(ClusterOptions {
        nri_request_timeout: Duration::from_secs(25),
        runtime_request_timeout: Duration::from_secs(8),
    })
    .expect("starting the cluster");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let r = scenario(&mut cl, &rt);
    drop(cl);
    eprintln!("kubelet retry scenario: {:.1}s", t0.elapsed().as_secs_f64());
    r.expect("kubelet retry after a slow create");
}
