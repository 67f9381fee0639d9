//! The rebalancing loop's metrics: what each NUMA node's shared containers used and
//! waited for in the last round, the imbalance the rebalancer compares with its threshold, the
//! moves, and what a round costs.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::time::Duration;
use tap_engine::rebalance::UsageReport;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NumaLabels {
    pub numa: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

pub struct RebalanceMetrics {
    /// CPUs the shared containers on each NUMA node used over the last round.
    pub usage: Family<NumaLabels, FloatGauge>,
    /// CPUs' worth of time they waited for a CPU (PSI `some`).
    pub stall: Family<NumaLabels, FloatGauge>,
    /// Max/mean of the nodes' demand per shared CPU (0 when there is nothing to compare).
    pub imbalance: FloatGauge,
    pub moves: Counter,
    /// Containers whose cgroup was read in the last round.
    pub sampled: Gauge,
    pub round_duration: Histogram,
}

impl RebalanceMetrics {
    pub fn register(registry: &mut Registry) -> RebalanceMetrics {
        let m = RebalanceMetrics {
            usage: Family::default(),
            stall: Family::default(),
            imbalance: FloatGauge::default(),
            moves: Counter::default(),
            sampled: Gauge::default(),
            // 100 µs .. ~1.6 s
            round_duration: Histogram::new(exponential_buckets(1e-4, 4.0, 8)),
        };
        register!(registry;
            "tap_numa_usage_cpus" => m.usage,
                "CPUs the shared containers on each NUMA node used over the last rebalancing round (cgroup cpu.stat)";
            "tap_numa_cpu_stall_cpus" => m.stall,
                "CPUs' worth of time the shared containers on each NUMA node waited for a CPU over the last rebalancing round (cgroup cpu.pressure, some)";
            "tap_numa_usage_imbalance" => m.imbalance,
                "Max/mean over NUMA nodes of the shared containers' demand (use plus wait) per shared CPU, as the rebalancer last measured it (0: nothing to compare)";
            "tap_rebalance_moves" => m.moves,
                "Shared containers the rebalancer moved to another NUMA node";
            "tap_rebalance_sampled_containers" => m.sampled,
                "Containers whose cgroup the last rebalancing round read";
            "tap_rebalance_round_duration_seconds" => m.round_duration,
                "Time a rebalancing round took: reading every container's cgroup, planning, applying";
        );
        m
    }

    /// Sets the per-node gauges and the imbalance from a round's reports (`demand` is what
    /// the rebalancer compared).
    pub fn observe_round(
        &self,
        usage: &UsageReport,
        stall: &UsageReport,
        demand: &UsageReport,
        sampled: usize,
        took: Duration,
    ) {
        for (family, report) in [(&self.usage, usage), (&self.stall, stall)] {
            for n in &report.nodes {
                let l = NumaLabels {
                    numa: n.node.to_string(),
                };
                family.get_or_create(&l).set(n.usage_milli as f64 / 1000.0);
            }
        }
        self.imbalance.set(demand.imbalance.unwrap_or(0.0));
        self.sampled.set(i64::try_from(sampled).unwrap_or(i64::MAX));
        self.round_duration.observe(took.as_secs_f64());
    }
}
