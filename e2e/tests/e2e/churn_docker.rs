//! The churn invariant behind the Docker proxy: shared and exclusive containers
//! created (two at a time, as cri-dockerd makes them) and removed in a seeded order; an
//! exclusive container stopped on dockerd directly and started again (it is adopted anew and
//! the shared containers shrink back); a container stopped through the proxy and started
//! behind its back; an in-place resize; a hung shim; an agent restart and a dockerd restart.
//! After each phase, at rest: no shared container's cgroup cpuset meets an exclusive grant and
//! every container's cgroup cpuset equals the agent's books.

use anyhow::{ensure, Result};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tap_e2e::churn::{self, Frozen, Rng};
use tap_e2e::docker::{cgroup_cpuset, docker, temp_dir, Dockerd, ProxyEnv, TapAgent};
use tap_e2e::util::{print_logs_on_failure, RmDir};

#[derive(Clone, Debug)]
struct Made {
    sandbox: String,
    id: String,
    name: String,
    exclusive: bool,
}

struct Run {
    env: Arc<ProxyEnv>,
    made: Vec<Made>,
    next: usize,
    slowest: Duration,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
async fn churn_docker_proxy() -> Result<()> {
    tap_e2e::util::require_e2e_tier();
    churn::host_has_two_cpus()?;
    let t0 = Instant::now();
    let dir = temp_dir("tap-dchurn")?;
    let _rm = RmDir(dir.clone());
    let env = Arc::new(ProxyEnv {
        dockerd: Dockerd::start()?,
        proxy: dir.join("proxy.sock"),
        dir: dir.clone(),
    });
    let mut run = Run {
        env,
        made: Vec::new(),
        next: 0,
        slowest: Duration::ZERO,
    };
    let res = run.phases().await;
    print_logs_on_failure(&res, &dir, "dockerd", || run.env.dockerd.log_tail(40));
    eprintln!("churn_docker_proxy took {:.1?}", t0.elapsed());
    res
}

impl Run {
    fn start_agent(&self) -> Result<TapAgent> {
        let args = churn::on_this_host(self.env.agent_args());
        TapAgent::start(&args, &self.env.dir.join("agent.log"))
    }

    async fn phases(&mut self) -> Result<()> {
        let mut agent = self.start_agent()?;
        let res = async {
            self.churn(churn::seed()).await?;
            self.at_rest("churn", &agent).await?;
            self.exclusive_restarted_behind_the_back(&agent).await?;
            self.stopped_through_the_proxy_started_behind(&agent)
                .await?;
            self.resize()?;
            self.at_rest("in-place resize", &agent).await?;
            self.hung_shim(&agent).await?;
            self.at_rest("hung shim thawed", &agent).await?;
            agent.stop();
            agent = self.start_agent()?;
            self.at_rest("agent restarted", &agent).await?;
            self.restart_dockerd()?;
            self.at_rest("dockerd restarted", &agent).await?;
            self.soak(&agent).await?;
            churn::check_slowest_create(self.slowest)
        }
        .await;
        churn::print_agent_log_on_failure(&res, &agent);
        res
    }

    /// More seeded churn rounds, each checked at rest, for [`churn::soak_seconds`].
    async fn soak(&mut self, agent: &TapAgent) -> Result<()> {
        churn::soak(async |seed, n| {
            self.churn(seed).await?;
            self.at_rest(&format!("soak round {n}"), agent).await
        })
        .await
    }

    /// A Pod sandbox and its container through the proxy, timed.
    fn run_one(env: &ProxyEnv, n: usize, exclusive: bool) -> Result<(Made, Duration)> {
        let pod = format!("churn{n}");
        let uid = format!("uid{n}");
        let qos = if exclusive {
            format!("pod{uid}")
        } else {
            format!("burstable/pod{uid}")
        };
        let t = Instant::now();
        let sandbox = env.sandbox(&pod, &uid, &qos, &[])?;
        let (shares, quota) = if exclusive {
            (1024, 100_000)
        } else {
            (204, 100_000)
        };
        let id = env.container(&pod, &uid, &sandbox, "app", &qos, shares, Some(quota), &[])?;
        let name = format!("k8s_app_{pod}_default_{uid}_0");
        let made = Made {
            sandbox,
            id,
            name,
            exclusive,
        };
        Ok((made, t.elapsed()))
    }

    /// Two creates at once.
    async fn create_pair(&mut self, first: bool, second: bool) -> Result<()> {
        let (a, b) = (self.next + 1, self.next + 2);
        self.next += 2;
        let (e1, e2) = (self.env.clone(), self.env.clone());
        let one = tokio::task::spawn_blocking(move || Run::run_one(&e1, a, first));
        let two = tokio::task::spawn_blocking(move || Run::run_one(&e2, b, second));
        let (one, two) = tokio::join!(one, two);
        for r in [one?, two?] {
            let (made, took) = r?;
            self.slowest = self.slowest.max(took);
            self.made.push(made);
        }
        Ok(())
    }

    /// Removes a container and its sandbox through the proxy, as cri-dockerd does.
    fn remove(&mut self, i: usize) -> Result<()> {
        let m = self.made.remove(i);
        self.env.docker(&["rm", "-f", &m.id])?;
        self.env.docker(&["rm", "-f", &m.sandbox])?;
        Ok(())
    }

    async fn churn(&mut self, seed: u64) -> Result<()> {
        let mut rng = Rng::new(seed);
        for _ in 0..8 {
            if self.made.len() >= 6 || (!self.made.is_empty() && rng.below(3) == 0) {
                let i = rng.below(self.made.len());
                self.remove(i)?;
            } else {
                self.create_pair(rng.below(2) == 0, rng.below(2) == 0)
                    .await?;
            }
        }
        Ok(())
    }

    /// Every running container the test made, by name, with its cgroup cpuset.
    async fn live(&self) -> Result<HashMap<String, BTreeSet<usize>>> {
        let sock = self.env.dockerd.socket();
        let mut out = HashMap::new();
        for m in &self.made {
            let pid = docker(&sock, &["inspect", "-f", "{{.State.Pid}}", &m.id])?;
            let pid: u32 = pid.trim().parse().unwrap_or(0);
            if pid == 0 {
                continue;
            }
            out.insert(m.name.clone(), churn::parse_list(&cgroup_cpuset(pid)?)?);
        }
        Ok(out)
    }

    async fn at_rest(&self, phase: &str, agent: &TapAgent) -> Result<()> {
        churn::wait_at_rest(phase, &agent.metrics_addr, async || self.live().await).await?;
        Ok(())
    }

    /// The first exclusive container (made if there is none).
    async fn exclusive(&mut self) -> Result<Made> {
        if !self.made.iter().any(|m| m.exclusive) {
            self.create_pair(true, false).await?;
        }
        self.made
            .iter()
            .find(|m| m.exclusive)
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no exclusive container"))
    }

    /// Stopped on dockerd directly (released by the reconcile, the shared ones widen), then
    /// started again directly: adopted as exclusive, the shared ones must shrink back.
    async fn exclusive_restarted_behind_the_back(&mut self, agent: &TapAgent) -> Result<()> {
        let e = self.exclusive().await?;
        let sock = self.env.dockerd.socket();
        docker(&sock, &["stop", "-t", "0", &e.id])?;
        self.at_rest("exclusive stopped behind the agent's back", agent)
            .await?;
        docker(&sock, &["start", &e.id])?;
        self.at_rest("exclusive started again behind the agent's back", agent)
            .await
    }

    /// Stopped through the proxy (released, its entry kept), then started on dockerd directly:
    /// the reconcile adopts it again, it does not run on with no grant.
    async fn stopped_through_the_proxy_started_behind(&mut self, agent: &TapAgent) -> Result<()> {
        let e = self.exclusive().await?;
        self.env.docker(&["stop", "-t", "0", &e.id])?;
        self.at_rest("stopped through the proxy", agent).await?;
        docker(&self.env.dockerd.socket(), &["start", &e.id])?;
        self.at_rest("started again behind the proxy", agent)
            .await?;
        let books = churn::books(&agent.metrics_addr)?;
        ensure!(books.contains_key(&e.name), "{} has no grant again", e.name);
        Ok(())
    }

    /// A shared container resized in place through the proxy.
    fn resize(&mut self) -> Result<()> {
        let Some(m) = self.made.iter().find(|m| !m.exclusive).cloned() else {
            return Ok(());
        };
        self.env.docker(&["update", "--cpu-shares", "512", &m.id])?;
        Ok(())
    }

    /// A shared container's shim hangs while an exclusive one is created (see
    /// churn_containerd.rs: the runtime may hold the create for up to the write deadline).
    async fn hung_shim(&mut self, agent: &TapAgent) -> Result<()> {
        while !self.made.is_empty() {
            self.remove(0)?;
        }
        self.create_pair(false, false).await?;
        self.at_rest("before the hung shim", agent).await?;
        let frozen = Frozen::new(churn::shim_pid(&self.made[0].id)?)?;
        let before = self.slowest;
        self.slowest = Duration::ZERO;
        self.create_pair(true, false).await?;
        let during = self.slowest;
        self.slowest = before;
        eprintln!("creates while a shim hung took up to {during:.1?} (before: {before:.1?})");
        ensure!(
            during < before + Duration::from_secs(3),
            "a create waited {during:?} while a neighbour's shim hung (before: {before:?})"
        );
        drop(frozen);
        Ok(())
    }

    /// dockerd restarts (no live-restore: its containers stop with it).
    fn restart_dockerd(&mut self) -> Result<()> {
        let Some(env) = Arc::get_mut(&mut self.env) else {
            anyhow::bail!("the environment is still shared");
        };
        env.dockerd.restart()
    }
}
