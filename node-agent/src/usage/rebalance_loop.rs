//! The rebalancing loop: every interval, each container's CPU use is read from its
//! cgroup, the engine's rebalancer plans with it ([`Agent::rebalance_round`]), and the moved
//! containers are marked for the ledger's convergence loop, which writes their new cpusets
//! (retried, never leaving the books wrong), with a `TopologyRebalanced` Event each.

use super::cpu_stat;
use super::sampler::Sampler;
use crate::agent::rebalance::{opts_out, Measured};
use crate::agent::ContainerInfo;
use crate::cgroupfs::index::CgroupIndex;
use crate::flags::Flags;
use crate::hook::Hook;
use crate::ledger::Ledger;
use crate::metrics::ErrorKind;
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tap_engine::rebalance::{RebalanceConfig, Rebalancer, UsageSample};
use tap_engine::Rebalance;
use tokio_util::sync::CancellationToken;

/// What the loop needs besides the ledger.
#[derive(Debug, Clone)]
pub struct LoopOptions {
    pub interval: Duration,
    /// Where cgroup v2 is mounted (the host's `/sys/fs/cgroup`).
    pub cgroup_root: PathBuf,
    pub config: RebalanceConfig,
}

impl LoopOptions {
    pub fn from_flags(flags: &Flags) -> LoopOptions {
        LoopOptions {
            interval: flags.rebalance_interval,
            cgroup_root: flags.cgroup_root.clone(),
            config: RebalanceConfig::usage_aware(),
        }
    }
}

/// The loop's state between rounds.
pub struct Round {
    cgroups: CgroupIndex,
    sampler: Sampler,
    rebalancer: Rebalancer,
    started: Instant,
    tick: u64,
}

impl Round {
    pub fn new(opts: &LoopOptions) -> Round {
        Round {
            cgroups: CgroupIndex::new(&opts.cgroup_root),
            sampler: Sampler::default(),
            rebalancer: Rebalancer::new(opts.config),
            started: Instant::now(),
            tick: 0,
        }
    }

    /// One round: sample, plan, apply, mark, note. Returns the keys moved.
    pub fn run(&mut self, ledger: &Ledger) -> Vec<String> {
        let t0 = Instant::now();
        self.tick = self.tick.saturating_add(1);
        let containers = ledger.containers();
        let measured = self.sample(&containers);
        let agent = ledger.agent();
        let reports = agent.usage_reports(&measured);
        let moves = agent.rebalance_round(
            &mut self.rebalancer,
            &measured.demand,
            self.tick,
            &measured.opted_out,
        );
        let moved: Vec<String> = moves.iter().map(|m| m.id.clone()).collect();
        ledger.dirty().mark(moved.iter().cloned());
        for m in &moves {
            if let Some((_, _, c)) = containers.iter().find(|(k, _, _)| *k == m.id) {
                agent.note_rebalanced(c, m);
            }
        }
        let metrics = &agent.metrics().rebalance;
        metrics.moves.inc_by(moves.len() as u64);
        metrics.observe_round(
            &reports.usage,
            &reports.stall,
            &reports.demand,
            measured.usage.len(),
            t0.elapsed(),
        );
        moved
    }

    /// Each container's use since the last round, read from its cgroup (a container whose
    /// cgroup is not found, or read for the first time, has none yet).
    fn sample(&mut self, containers: &[(String, String, ContainerInfo)]) -> Measured {
        let rids: Vec<&str> = containers.iter().map(|(_, r, _)| r.as_str()).collect();
        self.cgroups.learn(&rids);
        let live: HashSet<&str> = containers.iter().map(|(k, _, _)| k.as_str()).collect();
        self.sampler.retain(&|id| live.contains(id));
        let running: HashSet<&str> = rids.iter().copied().collect();
        self.cgroups.retain(&|id| running.contains(id));
        let now = self.started.elapsed();
        let mut m = Measured::default();
        for (key, rid, info) in containers {
            if opts_out(info) {
                m.opted_out.insert(key.clone());
            }
            let Some(dir) = self.cgroups.dir(rid) else {
                continue;
            };
            let Ok(stat) = cpu_stat::read(dir) else {
                continue;
            };
            if let Some(u) = self.sampler.observe(key, now, stat) {
                let sample = |milli| UsageSample {
                    id: key.clone(),
                    usage_milli: milli,
                };
                m.usage.push(sample(u.milli));
                m.stall.push(sample(u.stall_milli));
                m.demand.push(sample(u.demand_milli()));
            }
        }
        m
    }
}

/// Starts the loop ([`run`]) on a task of its own (every mode does, whatever the flag: a
/// NodeTopology policy may turn rebalancing on later).
pub fn spawn(
    ledger: &Arc<Ledger>,
    flags: &Flags,
    shutdown: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(
        ledger.clone(),
        LoopOptions::from_flags(flags),
        shutdown.clone(),
    ))
}

/// Runs rounds every `opts.interval` until `shutdown`, while the configuration in force (flags
/// or the NodeTopology's policy) asks for rebalancing and the agent is ready (its state is
/// the runtime's). Turning it off forgets the rounds' history.
pub async fn run(ledger: Arc<Ledger>, opts: LoopOptions, shutdown: CancellationToken) {
    let mut round: Option<Round> = None;
    let mut every = tokio::time::interval(opts.interval);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = every.tick() => {}
        }
        let agent = ledger.agent();
        if agent.config().rebalance == Rebalance::Off {
            if round.take().is_some() {
                agent.clear_usage_hint();
                tracing::info!("rebalancing turned off");
            }
            continue;
        }
        if !agent.metrics().is_ready() {
            continue;
        }
        let mut r = round.take().unwrap_or_else(|| {
            tracing::info!(interval = ?opts.interval, cgroup_root = %opts.cgroup_root.display(), "rebalancing by usage");
            Round::new(&opts)
        });
        // A round reads a file or two per container: off the runtime's threads.
        let l = ledger.clone();
        match tokio::task::spawn_blocking(move || {
            let moved = r.run(&l);
            (r, moved)
        })
        .await
        {
            // The round marked what it moved for the convergence loop; backoffs stay as
            // they are (a container that just timed out keeps its floor).
            Ok((r, _moved)) => round = Some(r),
            // A panic in a round: logged, counted, the next round starts over.
            Err(e) => {
                tracing::error!("rebalancing round failed: {e}");
                agent
                    .metrics()
                    .count_error(Hook::Rebalance, ErrorKind::Panic);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::tests::{agent, burstable};

    fn ledger() -> Ledger {
        Ledger::new(Arc::new(agent("synthetic-2s-4numa-96c-gpu")), None)
    }

    fn id(i: usize) -> String {
        format!("{i:064x}")
    }

    /// Burstable 1/2 CPUs.
    fn container(i: usize) -> ContainerInfo {
        burstable(&id(i), 1, 2)
    }

    /// The NUMA nodes of container `i`'s grant.
    fn node_of(l: &Ledger, i: usize) -> Option<String> {
        l.agent()
            .snapshot()
            .grant(&id(i))
            .map(|g| g.nodes.to_string())
    }

    /// The nodes of container 0 and the containers `0..8` placed there (the hot ones).
    fn hot_on_the_first_node(l: &Ledger) -> (String, Vec<usize>) {
        let first = node_of(l, 0).expect("placed");
        let hot = (0..8)
            .filter(|i| node_of(l, *i).as_deref() == Some(first.as_str()))
            .collect();
        (first, hot)
    }

    /// Writes the `cpu.stat` of containers `0..8` in a tree shaped like the systemd driver's
    /// under `root`: `usage_usec` of `per_hot` (the hot ones) or `per_cold`, times `n`.
    fn write_usage(root: &std::path::Path, hot: &[usize], (per_hot, per_cold): (u64, u64), n: u64) {
        for i in 0..8 {
            let dir = root.join(format!(
                "kubepods.slice/pod{i}.slice/cri-containerd-{}.scope",
                id(i)
            ));
            std::fs::create_dir_all(&dir).expect("mkdir");
            let per = if hot.contains(&i) { per_hot } else { per_cold };
            let usage = per * n;
            std::fs::write(dir.join("cpu.stat"), format!("usage_usec {usage}\n")).expect("write");
        }
    }

    /// Containers' cgroups in a tree shaped like the systemd driver's; the hot ones use 8 CPUs
    /// between rounds. After the window the loop moves a hot container off the crowded node,
    /// marks it for the convergence loop and the engine holds its new node.
    #[tokio::test]
    async fn rounds_read_the_cgroups_and_move_a_hot_container() {
        let l = ledger();
        for i in 0..8 {
            let t = l.begin_create(container(i)).await;
            l.commit_create(t, Some(id(i)));
        }
        let (first, hot) = hot_on_the_first_node(&l);
        let root = std::env::temp_dir().join(format!("tap-rebalance-loop-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let opts = LoopOptions {
            interval: Duration::from_secs(10),
            cgroup_root: root.clone(),
            config: RebalanceConfig::default(),
        };
        let mut round = Round::new(&opts);
        let mut moved = Vec::new();
        for r in 0..6u64 {
            write_usage(&root, &hot, (80_000_000, 1_000_000), r);
            // Readings 10 s apart as the sampler sees them.
            round.started -= Duration::from_secs(10);
            moved = round.run(&l);
            if !moved.is_empty() {
                break;
            }
        }
        let _ = std::fs::remove_dir_all(&root);
        let shed = moved
            .iter()
            .find(|k| hot.iter().any(|i| id(*i) == **k))
            .expect("a hot container moved");
        let i = hot.iter().copied().find(|i| id(*i) == *shed).expect("hot");
        assert_ne!(node_of(&l, i).as_deref(), Some(first.as_str()));
        assert!(
            l.pending_updates().iter().any(|u| u.container_id == *shed),
            "marked for the loop"
        );
    }

    /// Writes that time out, as to a hung shim.
    struct Hung;

    #[async_trait::async_trait]
    impl crate::ledger::Writer for Hung {
        async fn write_cpuset(
            &self,
            _: &crate::agent::Update,
        ) -> Result<(), crate::ledger::WriteError> {
            Err(crate::ledger::WriteError::Timeout(Duration::from_secs(10)))
        }
    }

    /// The loop moving a container leaves every other container's backoff as it is: one whose
    /// write timed out (a hung shim) keeps its 10 s floor.
    #[tokio::test]
    async fn a_move_keeps_the_backoff_of_a_container_whose_write_timed_out() {
        let l = Arc::new(ledger());
        let mut cfg = l.agent().config();
        cfg.rebalance = Rebalance::Usage;
        l.agent().set_config(cfg);
        l.agent().metrics().set_ready(true);
        for i in 0..8 {
            let t = l.begin_create(container(i)).await;
            l.commit_create(t, Some(id(i)));
        }
        // An exclusive create shrinks the shared containers of its node; their writes time out.
        let mut exclusive = burstable(&id(99), 4, 4);
        exclusive.qos = Some(tap_engine::Qos::Guaranteed);
        let g = l.begin_create(exclusive).await;
        l.commit_create(g, Some(id(99)));
        l.converge_once(&Hung).await;
        let hung: Vec<String> = l
            .pending_updates()
            .into_iter()
            .map(|u| u.container_id)
            .collect();
        assert!(!hung.is_empty(), "a write timed out");
        let (_, hot) = hot_on_the_first_node(&l);
        let root =
            std::env::temp_dir().join(format!("tap-rebalance-backoff-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let opts = LoopOptions {
            interval: Duration::from_millis(20),
            cgroup_root: root.clone(),
            config: RebalanceConfig::default(),
        };
        let stop = CancellationToken::new();
        let worker = tokio::spawn(run(l.clone(), opts, stop.clone()));
        let moved = |l: &Ledger| l.agent().metrics().rebalance.moves.get() > 0;
        for tick in 0..250u64 {
            write_usage(&root, &hot, (160_000, 2_000), tick);
            tokio::time::sleep(Duration::from_millis(20)).await;
            if moved(&l) {
                break;
            }
        }
        stop.cancel();
        let _ = worker.await;
        let _ = std::fs::remove_dir_all(&root);
        assert!(moved(&l), "the loop moved a container");
        let rt = crate::ledger::tests::Recorder::default();
        l.converge_once(&rt).await;
        let sent: Vec<String> = rt.writes().into_iter().map(|u| u.container_id).collect();
        assert!(
            hung.iter().all(|h| !sent.contains(h)),
            "a timed-out write went again before its floor: {sent:?} (timed out: {hung:?})"
        );
    }
}
