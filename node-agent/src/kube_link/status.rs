//! The NodeTopology status from the engine's state, and when to write it.

use super::pace::Pacer;
use super::policy::ConfigSource;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use std::time::{Duration, Instant};
use tap_api::{
    AgentStatus, CpuModelSummary, DeviceSummary, NodeTopologyStatus, NumaNodeSummary,
    TopologySummary, ZoneStatus, CONDITION_READY,
};
use tap_engine::{CpuModel, Engine};

/// What the link knows besides the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    pub source: ConfigSource,
    /// The NodeTopology generation whose spec is in force.
    pub generation: Option<i64>,
    /// Why the spec's policy could not be applied.
    pub invalid: Option<String>,
    pub mode: String,
    pub version: String,
}

fn milli(m: u64) -> String {
    let (whole, frac) = (m / 1000, m % 1000);
    if frac == 0 {
        format!("{whole}")
    } else {
        let s = format!("{:.2}", m as f64 / 1000.0);
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

fn i32_of(v: usize) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// `status.cpuModel`: the CPU model the topology carries.
pub fn cpu_summary(cpu: &CpuModel) -> CpuModelSummary {
    CpuModelSummary {
        name: cpu.name(),
        implementer: cpu.implementer_hex(),
        part: cpu.part_hex(),
        variant: cpu.midr.map(|m| format!("{:#x}", m.variant)),
        revision: cpu.midr.map(|m| i32::from(m.revision)),
        vendor: cpu.vendor_id.clone(),
        source: cpu.source.as_str().to_string(),
    }
}

/// The status to write.
pub fn node_status(
    engine: &Engine,
    facts: &Facts,
    previous: Option<&NodeTopologyStatus>,
    now: &Time,
) -> NodeTopologyStatus {
    let topo = engine.topology();
    let cfg = engine.config();
    let summary = TopologySummary {
        sockets: i32_of(topo.sockets),
        dies: i32_of(topo.dies),
        clusters: i32_of(topo.clusters.len()),
        numa_node_count: i32_of(topo.nodes.len()),
        cpu_count: i32_of(topo.online.len()),
        online_cpus: topo.online.to_string(),
        isolated_cpus: topo.isolated.to_string(),
        numa_nodes: topo
            .nodes
            .iter()
            .map(|n| NumaNodeSummary {
                id: i32::try_from(n.id).unwrap_or(i32::MAX),
                cpus: n.cpus.to_string(),
                memory_bytes: i64_of(n.memory_bytes),
            })
            .collect(),
        devices: topo
            .devices
            .iter()
            .map(|d| DeviceSummary {
                address: d.address.clone(),
                class: format!("0x{:06x}", d.class),
                vendor: format!("0x{:04x}", d.vendor),
                device: format!("0x{:04x}", d.device),
                numa_node: d.numa_node.map(|n| i32::try_from(n).unwrap_or(i32::MAX)),
            })
            .collect(),
    };
    let pools = engine.pool_status();
    let zones: Vec<ZoneStatus> = pools
        .iter()
        .map(|p| ZoneStatus {
            name: p.name.clone(),
            level: p.level.as_str().to_string(),
            cpus: p.cpus.clone(),
            capacity_milli: i64_of(p.capacity_milli),
            allocated_milli: i64_of(p.request_milli),
            limit_milli: i64_of(p.limit_milli),
            shared_cpus: p.shared_cpus.clone(),
            exclusive_cpus: p.exclusive_cpus.clone(),
            claimed_cpus: p.claimed_cpus.clone(),
            containers: i32::try_from(p.containers).unwrap_or(i32::MAX),
        })
        .collect();
    let root = topo.root().id;
    let allocated = pools
        .get(root)
        .map(|r| format!("{}/{}", milli(r.request_milli), milli(r.capacity_milli)));

    let (ready, reason, message) = match (&facts.invalid, facts.source) {
        (Some(why), _) => (
            false,
            "InvalidPolicy",
            format!("the NodeTopology policy was not applied: {why}"),
        ),
        (None, ConfigSource::NodeTopology) => (
            true,
            "PolicyApplied",
            format!("{} from the NodeTopology spec", cfg.policy),
        ),
        (None, ConfigSource::Cache) => (
            true,
            "CachedPolicy",
            format!("{} from the on-disk cache", cfg.policy),
        ),
        (None, ConfigSource::Flags) => (
            true,
            "NoPolicy",
            format!("no policy assigned; {} from the agent's flags", cfg.policy),
        ),
    };
    let status = if ready { "True" } else { "False" };
    let since = previous
        .and_then(|p| p.conditions.iter().find(|c| c.type_ == CONDITION_READY))
        .filter(|c| c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    NodeTopologyStatus {
        topology: Some(summary),
        zones,
        containers: i32::try_from(engine.len()).unwrap_or(i32::MAX),
        allocated,
        agent: Some(AgentStatus {
            mode: facts.mode.clone(),
            version: facts.version.clone(),
            policy: cfg.policy.as_str().to_string(),
            memory_topology: cfg.memory_topology,
            cluster_affinity: cfg.cluster_affinity,
            cluster_affinity_rule: cfg.cluster_rule.as_str().to_string(),
            reserved_cpus: cfg.reserved.to_string(),
            reserved_cpus_for: super::policy::reserved_cpus_for(&cfg.reserved_for),
            rebalance: super::policy::rebalance_mode(cfg.rebalance),
            annotations_allowed: cfg.annotations_allowed,
            config_source: facts.source.as_str().to_string(),
            observed_generation: facts.generation,
        }),
        cpu_model: Some(cpu_summary(&topo.cpu)),
        conditions: vec![Condition {
            type_: CONDITION_READY.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message,
            observed_generation: facts.generation,
            last_transition_time: since,
        }],
    }
}

/// Writes on change only: at most once per `interval` after a change of what the agent is
/// (topology, configuration, conditions), and at most once per `usage_interval` when only the
/// usage changed (zones' allocation, container counts), so container churn costs the API server
/// a bounded number of writes per node. A failed write is retried after the interval too.
#[derive(Debug)]
pub struct RateLimiter {
    interval: Duration,
    usage_interval: Duration,
    pacer: Pacer<NodeTopologyStatus>,
}

fn without_times(s: &NodeTopologyStatus) -> NodeTopologyStatus {
    let mut s = s.clone();
    for c in &mut s.conditions {
        c.last_transition_time = Time(jiff::Timestamp::UNIX_EPOCH);
    }
    s
}

/// The status without its usage figures.
fn without_usage(mut s: NodeTopologyStatus) -> NodeTopologyStatus {
    s.zones.clear();
    s.containers = 0;
    s.allocated = None;
    s
}

/// How a status differs from the last one written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    None,
    /// Only zones' usage, the container count or the allocation.
    Usage,
    /// Anything else (topology, agent configuration, conditions).
    Other,
}

impl RateLimiter {
    pub fn new(interval: Duration, usage_interval: Duration) -> RateLimiter {
        RateLimiter {
            interval,
            usage_interval: usage_interval.max(interval),
            pacer: Pacer::default(),
        }
    }

    /// How `st` differs from the last status written.
    pub fn change(&self, st: &NodeTopologyStatus) -> Change {
        let Some(last) = self.pacer.last_sent() else {
            return Change::Other;
        };
        let (last, st) = (without_times(last), without_times(st));
        if last == st {
            Change::None
        } else if without_usage(last) == without_usage(st) {
            Change::Usage
        } else {
            Change::Other
        }
    }

    pub fn should_send(&self, now: Instant, st: &NodeTopologyStatus) -> bool {
        let wait = match self.change(st) {
            Change::None => return false,
            Change::Usage => self.usage_interval,
            Change::Other => self.interval,
        };
        self.pacer.due(now, wait)
    }

    pub fn sent(&mut self, now: Instant, st: &NodeTopologyStatus) {
        self.pacer.sent(now, st.clone());
    }

    pub fn failed(&mut self, now: Instant) {
        self.pacer.failed(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tap_engine::{ContainerRequest, EngineConfig, Qos, Topology};

    fn engine() -> Engine {
        let topo = Arc::new(
            Topology::build(
                &tap_engine::testdata::discover_fixture("synthetic-2s-4numa-96c-gpu").unwrap(),
            )
            .unwrap(),
        );
        Engine::new(topo, EngineConfig::default())
    }

    fn facts(source: ConfigSource) -> Facts {
        Facts {
            source,
            generation: Some(4),
            invalid: None,
            mode: "NRI".into(),
            version: "0.1.0".into(),
        }
    }

    fn t(s: i64) -> Time {
        Time(jiff::Timestamp::from_second(s).unwrap())
    }

    #[test]
    fn status_describes_topology_usage_and_agent() {
        let mut e = engine();
        let req = ContainerRequest {
            id: "c1".into(),
            pod_uid: "u".into(),
            pod_name: "p".into(),
            namespace: "default".into(),
            container_name: "app".into(),
            qos: Some(Qos::Burstable),
            cpu_request_milli: 4000,
            cpu_limit_milli: Some(8000),
            memory_limit_bytes: None,
            device_nodes: vec![],
            claims: vec![],
            overrides: Default::default(),
        };
        e.create(&req);
        let st = node_status(&e, &facts(ConfigSource::NodeTopology), None, &t(10));
        let topo = st.topology.as_ref().unwrap();
        assert_eq!(
            (topo.sockets, topo.numa_node_count, topo.cpu_count),
            (2, 4, 96)
        );
        assert_eq!(topo.numa_nodes[1].cpus, "24-47");
        assert!(topo.devices.iter().any(|d| d.numa_node == Some(1)));
        assert_eq!(st.containers, 1);
        assert_eq!(st.allocated.as_deref(), Some("4/96"));
        let numa0 = st
            .zones
            .iter()
            .find(|z| z.cpus == "0-23" && z.level == "numa")
            .unwrap();
        assert_eq!(numa0.allocated_milli, 4000);
        let agent = st.agent.as_ref().unwrap();
        assert_eq!(
            (agent.mode.as_str(), agent.policy.as_str()),
            ("NRI", "topology-aware")
        );
        assert_eq!(agent.config_source, "NodeTopology");
        assert_eq!(agent.observed_generation, Some(4));
        assert_eq!(st.conditions[0].status, "True");
        assert_eq!(st.conditions[0].reason, "PolicyApplied");

        // Same facts later: same transition time; an invalid policy flips Ready.
        let again = node_status(&e, &facts(ConfigSource::NodeTopology), Some(&st), &t(20));
        assert_eq!(again.conditions[0].last_transition_time, t(10));
        let mut f = facts(ConfigSource::NodeTopology);
        f.invalid = Some("bad".into());
        let bad = node_status(&e, &f, Some(&st), &t(30));
        assert_eq!(bad.conditions[0].status, "False");
        assert_eq!(bad.conditions[0].last_transition_time, t(30));
    }

    /// A fixture's engine with its CPU identified as the agent does (sysfs, then proc).
    fn identified(name: &str, base: EngineConfig) -> Engine {
        use tap_engine::sysfs::DirSource;
        use tap_engine::testdata::{discover_fixture, fixture, proc_fixture_dir};
        let mut raw = discover_fixture(name).unwrap();
        let (sys, proc) = (
            fixture(name).unwrap(),
            DirSource::new(proc_fixture_dir(name)),
        );
        raw.cpu = tap_engine::cpu_model::identify(&sys, &proc, 0).model;
        Engine::new(Arc::new(Topology::build(&raw).unwrap()), base)
    }

    /// `status.cpuModel` names the CPU; a NodeTopology policy's clusterAffinity goes through
    /// the flags' `kunpeng-950-only` rule like the flag does.
    #[test]
    fn status_names_the_cpu_and_the_rule_gates_a_policys_cluster_affinity() {
        use tap_engine::ClusterAffinityRule;
        let base = EngineConfig {
            cluster_rule: ClusterAffinityRule::Kunpeng950Only,
            ..EngineConfig::default()
        };
        let settings = tap_api::PolicySettings {
            cluster_affinity: true,
            ..Default::default()
        };
        let policy =
            super::super::policy::engine_config(&base, &Default::default(), Some(&settings))
                .unwrap();
        for (name, cpu, part, clusters) in [
            (
                "synthetic-2s-4numa-96c-kunpeng920",
                "HiSilicon Kunpeng 920",
                "0xd01",
                false,
            ),
            (
                "synthetic-1s-2numa-96c-kunpeng950",
                "HiSilicon Kunpeng 950",
                "0xd06",
                true,
            ),
        ] {
            let mut e = identified(name, base.clone());
            e.set_config(policy.clone());
            let st = node_status(&e, &facts(ConfigSource::NodeTopology), None, &t(1));
            let m = st.cpu_model.as_ref().unwrap();
            assert_eq!(m.name, cpu);
            assert_eq!(
                (m.implementer.as_deref(), m.part.as_deref()),
                (Some("0x48"), Some(part))
            );
            assert_eq!(m.source, "midr_el1");
            let agent = st.agent.as_ref().unwrap();
            assert_eq!(agent.cluster_affinity, clusters, "{name}");
            assert_eq!(agent.cluster_affinity_rule, "kunpeng-950-only");
        }
        // No identification: unknown, said so.
        let st = node_status(&engine(), &facts(ConfigSource::Flags), None, &t(1));
        let m = st.cpu_model.unwrap();
        assert_eq!((m.name.as_str(), m.source.as_str()), ("unknown", "none"));
        assert_eq!(m.implementer, None);
    }

    #[test]
    fn milli_formatting() {
        assert_eq!(milli(0), "0");
        assert_eq!(milli(4000), "4");
        assert_eq!(milli(4500), "4.5");
        assert_eq!(milli(250), "0.25");
    }

    #[test]
    fn rate_limiter_sends_on_change_at_most_once_per_interval() {
        let e = engine();
        let a = node_status(&e, &facts(ConfigSource::Flags), None, &t(1));
        let b = node_status(&e, &facts(ConfigSource::NodeTopology), None, &t(1));
        let mut rl = RateLimiter::new(Duration::from_secs(5), Duration::from_secs(15));
        let t0 = Instant::now();
        assert!(rl.should_send(t0, &a));
        rl.sent(t0, &a);
        // Unchanged (even with a new timestamp): never.
        let a_later = node_status(&e, &facts(ConfigSource::Flags), None, &t(99));
        assert_eq!(rl.change(&a_later), Change::None);
        assert!(!rl.should_send(t0 + Duration::from_secs(60), &a_later));
        // Changed configuration: only after the short interval.
        assert_eq!(rl.change(&b), Change::Other);
        assert!(!rl.should_send(t0 + Duration::from_secs(2), &b));
        assert!(rl.should_send(t0 + Duration::from_secs(5), &b));
        rl.failed(t0 + Duration::from_secs(5));
        assert!(!rl.should_send(t0 + Duration::from_secs(6), &b));
        assert!(rl.should_send(t0 + Duration::from_secs(10), &b));
    }

    fn burstable(id: &str, milli: u64) -> ContainerRequest {
        ContainerRequest {
            id: id.into(),
            pod_uid: format!("u-{id}"),
            pod_name: id.into(),
            namespace: "default".into(),
            container_name: "app".into(),
            qos: Some(Qos::Burstable),
            cpu_request_milli: milli,
            cpu_limit_milli: None,
            memory_limit_bytes: None,
            device_nodes: vec![],
            claims: vec![],
            overrides: Default::default(),
        }
    }

    /// Container churn changes only the usage: one write per usage interval however fast it
    /// goes, while a configuration change still goes out after the short interval.
    #[test]
    fn churn_is_written_at_most_once_per_usage_interval() {
        let mut e = engine();
        let f = facts(ConfigSource::Flags);
        let mut rl = RateLimiter::new(Duration::from_secs(5), Duration::from_secs(15));
        let t0 = Instant::now();
        let first = node_status(&e, &f, None, &t(1));
        rl.sent(t0, &first);
        // One create per second for a minute: a write at 15, 30, 45 and 60 s only.
        let mut writes = Vec::new();
        for s in 1..=60u64 {
            e.create(&burstable(&format!("c{s}"), 100));
            let st = node_status(&e, &f, None, &t(1));
            assert_eq!(rl.change(&st), Change::Usage);
            let now = t0 + Duration::from_secs(s);
            if rl.should_send(now, &st) {
                rl.sent(now, &st);
                writes.push(s);
            }
        }
        assert_eq!(writes, vec![15, 30, 45, 60]);
        // A configuration change (with usage) waits only the short interval.
        e.create(&burstable("last", 100));
        let changed = node_status(&e, &facts(ConfigSource::NodeTopology), None, &t(1));
        assert_eq!(rl.change(&changed), Change::Other);
        assert!(!rl.should_send(t0 + Duration::from_secs(64), &changed));
        assert!(rl.should_send(t0 + Duration::from_secs(65), &changed));
        // The usage interval is never shorter than the configuration one.
        let odd = RateLimiter::new(Duration::from_secs(5), Duration::from_secs(1));
        assert_eq!(odd.usage_interval, Duration::from_secs(5));
    }
}
