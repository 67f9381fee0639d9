//! The churn invariant on containerd, in NRI mode and as the CRI proxy: shared and
//! exclusive containers created (two at a time) and removed in a seeded order, a container
//! stopped behind the agent's back, an in-place resize, a hung shim, an agent restart and a
//! containerd restart. After each phase, at rest: no shared container's cgroup cpuset meets
//! an exclusive grant, every container's cgroup cpuset equals the agent's books, and no create
//! failed or took longer than [`churn::CREATE_BOUND`] (a create never waits on another container),
//! and each phase but the restarts came to rest within [`churn::BOUND`] of its last event.
//!
//! The agent places on this host's own sysfs (two CPUs: one exclusive, one shared), not a
//! folded fixture, so the cgroups show the real cpusets. `TAP_CHURN_SEED` replays a run.

use anyhow::{ensure, Result};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tap_e2e::churn::{self, Frozen, Rng};
use tap_e2e::containerd::{
    cgroup_cpuset, timed_with_containerd, AgentMode as Mode, CgroupQos, ContainerSpec, Containerd,
    ContainerdOptions, Cri, PodSpec,
};
use tap_e2e::docker::TapAgent;

/// containerd 1.7 holds other containers' creates and starts while an update waits on a hung
/// shim: a create then may take up to the agent's write deadline more than before, no more.
const HUNG_SHIM_EXTRA: Duration = Duration::from_secs(2);

/// A container the test made: its sandbox, id and the agent's key for it.
#[derive(Clone, Debug)]
struct Made {
    sandbox: String,
    id: String,
    key: String,
    exclusive: bool,
}

struct Run {
    mode: Mode,
    /// The socket the test's creates go to (containerd's, or the proxy's).
    front: PathBuf,
    /// containerd's own CRI socket.
    direct: PathBuf,
    made: Vec<Made>,
    next: usize,
    slowest: Duration,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
async fn churn_nri() -> Result<()> {
    churn("churn_nri", Mode::Nri).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
async fn churn_cri_proxy() -> Result<()> {
    churn("churn_cri_proxy", Mode::CriProxy).await
}

async fn churn(test: &str, mode: Mode) -> Result<()> {
    tap_e2e::util::require_e2e_tier();
    churn::host_has_two_cpus()?;
    let opts = ContainerdOptions::for_agent(mode);
    timed_with_containerd(test, "tap-churn", opts, async |ctd, dir| {
        phases(ctd, dir, mode).await
    })
    .await
}

fn agent_args(ctd: &Containerd, dir: &Path, mode: Mode) -> Vec<String> {
    let args = ctd.agent_args(mode, &dir.join("proxy.sock"), None, &dir.join("state"));
    churn::on_this_host(args)
}

async fn phases(ctd: &mut Containerd, dir: &Path, mode: Mode) -> Result<()> {
    let log = dir.join("agent.log");
    let mut agent = TapAgent::start(&agent_args(ctd, dir, mode), &log)?;
    let front = match mode {
        Mode::Nri => ctd.cri_socket(),
        Mode::CriProxy => dir.join("proxy.sock"),
    };
    let mut run = Run {
        mode,
        front,
        direct: ctd.cri_socket(),
        made: Vec::new(),
        next: 0,
        slowest: Duration::ZERO,
    };
    let res = async {
        run.churn(churn::seed()).await?;
        run.bounded("churn", &agent).await?;
        if mode == Mode::CriProxy {
            run.stop_behind_the_back(ctd).await?;
            run.at_rest("stopped behind the agent's back", &agent)
                .await?;
        }
        run.resize().await?;
        run.bounded("in-place resize", &agent).await?;
        run.start_overlaps_write().await?;
        // The held write goes when the start is answered (CRI proxy), or straight to the
        // cgroup once the container runs (NRI), not at a later request or sweep.
        run.bounded("a write during a start", &agent).await?;
        run.exclusive_created_before_a_shared_start().await?;
        run.bounded("an exclusive create before a shared start", &agent)
            .await?;
        run.hung_shim(&agent).await?;
        run.bounded("hung shim thawed", &agent).await?;
        agent.stop();
        agent = TapAgent::start(&agent_args(ctd, dir, mode), &log)?;
        run.at_rest("agent restarted", &agent).await?;
        ctd.restart()?;
        run.at_rest("containerd restarted", &agent).await?;
        run.soak(&agent).await?;
        churn::check_slowest_create(run.slowest)
    }
    .await;
    churn::print_agent_log_on_failure(&res, &agent);
    res
}

/// Runs Pod `pod` with container `spec` on `cri`: the sandbox, the container and how long it took.
async fn timed_start(
    cri: &mut Cri,
    pod: &PodSpec,
    spec: &ContainerSpec,
) -> Result<(String, String, Duration)> {
    let t = Instant::now();
    let sb = cri.run_pod(pod).await?;
    let id = cri.create_container(&sb, spec).await?;
    cri.start_container(&id).await?;
    Ok((sb, id, t.elapsed()))
}

impl Run {
    /// More seeded churn rounds ([`churn::soak_seeds`], then for [`churn::soak_seconds`]),
    /// each at rest within the bound.
    async fn soak(&mut self, agent: &TapAgent) -> Result<()> {
        churn::soak(async |seed, n| {
            self.churn(seed).await?;
            self.bounded(&format!("soak round {n} (seed {seed})"), agent)
                .await?;
            Ok(())
        })
        .await
    }

    async fn cri(&self) -> Result<Cri> {
        Cri::connect(&self.front).await
    }

    /// Runs one Pod with one container through the front socket, timed.
    async fn run_one(&mut self, exclusive: bool) -> Result<(Cri, PodSpec, ContainerSpec)> {
        self.next += 1;
        let (qos, spec) = if exclusive {
            (
                CgroupQos::Guaranteed,
                ContainerSpec::cpus("app", 1000, Some(1000)),
            )
        } else {
            (
                CgroupQos::Burstable,
                ContainerSpec::cpus("app", 200, Some(1000)),
            )
        };
        let pod = PodSpec::new(&format!("churn{}", self.next), qos);
        Ok((self.cri().await?, pod, spec))
    }

    /// Creates two containers at once (each on its own connection), timing each.
    async fn create_pair(&mut self, first: bool, second: bool) -> Result<()> {
        let (mut c1, p1, s1) = self.run_one(first).await?;
        let (mut c2, p2, s2) = self.run_one(second).await?;
        let (a, b) = tokio::join!(
            timed_start(&mut c1, &p1, &s1),
            timed_start(&mut c2, &p2, &s2)
        );
        for ((sb, id, took), exclusive) in [(a?, first), (b?, second)] {
            self.slowest = self.slowest.max(took);
            self.made.push(self.record(sb, id, exclusive));
        }
        Ok(())
    }

    /// A container the test made, under the key the agent books it by.
    fn record(&self, sandbox: String, id: String, exclusive: bool) -> Made {
        let key = match self.mode {
            Mode::Nri => id.clone(),
            Mode::CriProxy => format!("{sandbox}/app/0"),
        };
        Made {
            sandbox,
            id,
            key,
            exclusive,
        }
    }

    /// A shared container is created and its start held (its shim stopped) while an exclusive
    /// neighbour is created, which shrinks it. containerd 1.7 puts an update of a container
    /// that is not running yet in its spec only, and a start already under way applies the
    /// spec it read before: the shrink must reach the cgroup all the same.
    async fn start_overlaps_write(&mut self) -> Result<()> {
        while !self.made.is_empty() {
            self.remove(0).await?;
        }
        let (mut cri, pod, spec) = self.run_one(false).await?;
        let sandbox = cri.run_pod(&pod).await?;
        let id = cri.create_container(&sandbox, &spec).await?;
        let frozen = Frozen::new(churn::shim_pid(&sandbox)?)?;
        let start_id = id.clone();
        let start = tokio::spawn(async move { cri.start_container(&start_id).await });
        // The start is in containerd (it has read the spec) and waits on the shim.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (mut c2, p2, s2) = self.run_one(true).await?;
        let sb2 = c2.run_pod(&p2).await?;
        let id2 = c2.create_container(&sb2, &s2).await?;
        c2.start_container(&id2).await?;
        // The agent's write to the first container goes out while its start is held.
        tokio::time::sleep(Duration::from_millis(500)).await;
        drop(frozen);
        start.await??;
        self.made.push(self.record(sandbox, id, false));
        self.made.push(self.record(sb2, id2, true));
        Ok(())
    }

    /// Removes a container and its Pod as the kubelet does: the container first.
    async fn remove(&mut self, i: usize) -> Result<()> {
        let m = self.made.remove(i);
        let mut cri = self.cri().await?;
        cri.stop_container(&m.id).await?;
        cri.remove_container(&m.id).await?;
        cri.remove_pod(&m.sandbox).await
    }

    /// Seeded creates (two at a time, shared or exclusive) and removals.
    async fn churn(&mut self, seed: u64) -> Result<()> {
        let mut rng = Rng::new(seed);
        for _ in 0..8 {
            if self.made.len() >= 6 || (!self.made.is_empty() && rng.below(3) == 0) {
                let i = rng.below(self.made.len());
                self.remove(i).await?;
            } else {
                self.create_pair(rng.below(2) == 0, rng.below(2) == 0)
                    .await?;
            }
        }
        Ok(())
    }

    /// Every running container the test made, by the agent's key, with its cgroup cpuset.
    async fn live(&self) -> Result<HashMap<String, BTreeSet<usize>>> {
        let mut cri = Cri::connect(&self.direct).await?;
        let mut out = HashMap::new();
        for m in &self.made {
            let Ok(pid) = cri.pid(&m.id).await else {
                continue;
            };
            out.insert(m.key.clone(), churn::parse_list(&cgroup_cpuset(pid)?)?);
        }
        Ok(out)
    }

    /// Waits until the books and the cgroups agree; returns how long that took.
    async fn at_rest(&self, phase: &str, agent: &TapAgent) -> Result<Duration> {
        churn::wait_at_rest(phase, &agent.metrics_addr, async || self.live().await).await
    }

    /// [`Run::at_rest`], within [`churn::BOUND`] of the phase's last event.
    async fn bounded(&self, phase: &str, agent: &TapAgent) -> Result<()> {
        churn::check_bound(phase, self.at_rest(phase, agent).await?)
    }

    /// A shared container is created, then an exclusive one (which takes a CPU the first was
    /// created with), then both start, and the node stays quiet: no later request carries the
    /// shared container's shrink, so the agent must write it on its own.
    async fn exclusive_created_before_a_shared_start(&mut self) -> Result<()> {
        while !self.made.is_empty() {
            self.remove(0).await?;
        }
        let (mut c1, p1, s1) = self.run_one(false).await?;
        let (mut c2, p2, s2) = self.run_one(true).await?;
        let sb1 = c1.run_pod(&p1).await?;
        let sb2 = c2.run_pod(&p2).await?;
        let id1 = c1.create_container(&sb1, &s1).await?;
        let id2 = c2.create_container(&sb2, &s2).await?;
        c1.start_container(&id1).await?;
        c2.start_container(&id2).await?;
        self.made.push(self.record(sb1, id1, false));
        self.made.push(self.record(sb2, id2, true));
        Ok(())
    }

    /// An exclusive container stopped and removed on containerd directly (the proxy never
    /// hears of it): the reconcile releases it and the shared containers widen again.
    async fn stop_behind_the_back(&mut self, ctd: &Containerd) -> Result<()> {
        if !self.made.iter().any(|m| m.exclusive) {
            self.create_pair(true, false).await?;
        }
        let Some(i) = self.made.iter().position(|m| m.exclusive) else {
            return Ok(());
        };
        let m = self.made.remove(i);
        let mut direct = ctd.cri().await?;
        direct.stop_container(&m.id).await?;
        direct.remove_container(&m.id).await
    }

    /// A shared container resized in place through the front socket.
    async fn resize(&mut self) -> Result<()> {
        if !self.made.iter().any(|m| !m.exclusive) {
            self.create_pair(false, false).await?;
        }
        let Some(m) = self.made.iter().find(|m| !m.exclusive).cloned() else {
            return Ok(());
        };
        let mut cri = self.cri().await?;
        let r = ContainerSpec::cpus("app", 500, Some(1500)).resources();
        cri.update_resources(&m.id, r).await
    }

    /// A shared container's shim hangs (SIGSTOP) while an exclusive container is created: the
    /// create must not wait for the shared container's update (NRI: written to its cgroup, no
    /// shim involved; CRI proxy: the loop retries it once the shim is back).
    async fn hung_shim(&mut self, agent: &TapAgent) -> Result<()> {
        while !self.made.is_empty() {
            self.remove(0).await?;
        }
        self.create_pair(false, false).await?;
        self.at_rest("before the hung shim", agent).await?;
        let frozen = Frozen::new(churn::shim_pid(&self.made[0].sandbox)?)?;
        let before = self.slowest;
        self.slowest = Duration::ZERO;
        self.create_pair(true, false).await?;
        let during = self.slowest;
        self.slowest = before;
        eprintln!("creates while a shim hung took up to {during:.1?} (before: {before:.1?})");
        ensure!(
            during < before + HUNG_SHIM_EXTRA + Duration::from_secs(1),
            "a create waited {during:?} while a neighbour's shim hung (before: {before:?})"
        );
        drop(frozen);
        Ok(())
    }
}
