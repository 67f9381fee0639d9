//! Prometheus metrics of the agent and the HTTP endpoint that serves them with `/healthz` and
//! `/readyz`. Names follow Prometheus's conventions: the unit as a suffix (`_seconds`, `_cpus`),
//! counters end in `_total`, gauges never in `_count` or `_total`. The reference's names are
//! kept where they did; the three per-zone gauges were renamed (CHANGELOG.md lists old and new).
//!
//! What is registered depends on the runtime mode ([`Metrics::for_mode`]): `tap_proxy_up` only
//! in the proxy modes (Docker, Containerd). The per-zone gauges and `tap_build_info` are read
//! from the engine at scrape time; cluster-level zones appear only while cluster affinity is on.

/// Registers each metric under its name and help text, in order; the registry gets a clone
/// (the values are shared, so the caller keeps the handle it updates).
macro_rules! register {
    ($registry:expr; $($name:literal => $metric:expr, $help:literal;)+) => {
        $($registry.register($name, $help, $metric.clone());)+
    };
}

mod rebalance;
pub use rebalance::{NumaLabels, RebalanceMetrics};

use crate::hook::Hook;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tap_engine::engine::PoolStatus;
use tap_engine::{EngineConfig, Level};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HookLabels {
    pub hook: Hook,
    pub mode: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    pub method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ZoneLabels {
    pub zone: String,
    pub level: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub hook: Hook,
    /// [`ErrorKind::as_str`]: one series per label text (an `Unhonoured` control's payload,
    /// such as a whole-cores size, does not make series of its own).
    pub kind: &'static str,
}

/// What went wrong, for `tap_errors_total{kind}` (every problem is failed open).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// a Pod annotation or label with a bad value (ignored).
    Annotation,
    /// a Pod Event dropped (its queue was full).
    EventDropped,
    /// a Pod Event the API server refused.
    Event,
    /// the placement engine panicked (caught).
    Panic,
    /// the kubelet gave up on a create before the runtime answered.
    Abandoned,
    /// a runtime request the proxy could not decode (forwarded unchanged).
    Request,
    /// a body too large to rewrite (forwarded unchanged).
    TooLarge,
    /// a decision task failed.
    Internal,
    /// a decision or a cpuset write missed its deadline.
    Timeout,
    /// an update while another change of the container is in flight.
    Busy,
    /// the state file could not be read or written.
    State,
    /// a runtime message without what the agent needs (no container id).
    Input,
    /// a create of an NRI session that is gone.
    StaleSession,
    /// a create or resize containerd did not confirm.
    Unconfirmed,
    /// the proxy served before its restore was done (calls pass unadjusted).
    NotReady,
    /// the runtime could not be reached.
    Runtime,
    /// the runtime refused a cpuset write.
    Refused,
    /// the runtime does not know the container of a cpuset write.
    NotFound,
    /// `numa-policy: strict` and no single NUMA node holds the container (left on all CPUs).
    StrictNuma,
    /// `numa-policy: exclusive` and no NUMA node free of other containers (left on all CPUs).
    ExclusiveNuma,
    /// the kubelet's pod-resources API failed or was late (placed without its device hint).
    PodResources,
    /// a create placed on none of its devices' NUMA nodes, or a device on a node the machine
    /// lacks (placed without its device hint).
    DeviceHint,
    /// a DRA claim the kubelet asked to prepare or unprepare was refused (not booked, or
    /// not given back: the kubelet retries).
    Claim,
    /// a per-Pod control the placement could not honour (placed without it): the control's
    /// own label (`whole_cores`, `sibling_pair`, ...).
    Unhonoured(tap_engine::Unhonoured),
}

impl ErrorKind {
    /// The `kind` label.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Annotation => "annotation",
            ErrorKind::EventDropped => "event_dropped",
            ErrorKind::Event => "event",
            ErrorKind::Panic => "panic",
            ErrorKind::Abandoned => "abandoned",
            ErrorKind::Request => "request",
            ErrorKind::TooLarge => "too_large",
            ErrorKind::Internal => "internal",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Busy => "busy",
            ErrorKind::State => "state",
            ErrorKind::Input => "input",
            ErrorKind::StaleSession => "stale_session",
            ErrorKind::Unconfirmed => "unconfirmed",
            ErrorKind::NotReady => "not_ready",
            ErrorKind::Runtime => "runtime",
            ErrorKind::Refused => "refused",
            ErrorKind::NotFound => "not_found",
            ErrorKind::StrictNuma => "strict_numa",
            ErrorKind::ExclusiveNuma => "exclusive_numa",
            ErrorKind::PodResources => "pod_resources",
            ErrorKind::DeviceHint => "device_hint",
            ErrorKind::Claim => "claim",
            ErrorKind::Unhonoured(u) => u.kind(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    /// The architecture the binary was built for (`x86_64`, `aarch64`).
    arch: String,
    mode: String,
    policy: String,
}

/// `tap_cpu_info`: the CPU model (`implementer` and `part` hex, empty without an Arm MIDR).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CpuLabels {
    pub implementer: String,
    pub part: String,
    pub model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PlacementLabels {
    pub level: String,
    pub exclusive: String,
}

fn latency_histogram() -> Histogram {
    // 1 µs .. ~16 s
    Histogram::new(exponential_buckets(1e-6, 4.0, 13))
}

pub struct Metrics {
    registry: Registry,
    /// `tap_proxy_up`; registered (exported) only in the proxy modes.
    pub proxy_up: Gauge,
    pub proxy_request_duration: Family<MethodLabels, Histogram>,
    pub hook_request_duration: Family<HookLabels, Histogram>,
    /// `tap_pod_resources_request_duration_seconds`: the create's device lookup at the kubelet.
    pub pod_resources_duration: Histogram,
    pub errors: Family<ErrorLabels, Counter>,
    pub placements: Family<PlacementLabels, Counter>,
    pub runtime_connected: Gauge,
    /// Periodic comparisons of the ledger with the runtime (proxy modes), by result.
    pub reconciles: Family<ResultLabels, Counter>,
    /// Cpuset writes of the convergence loop, by result.
    pub cpuset_writes: Family<ResultLabels, Counter>,
    /// Containers whose runtime cpuset differs from the engine's (as far as the agent knows).
    pub unconverged: Gauge,
    /// Containers' cgroups read back, by result.
    pub cpuset_readbacks: Family<ResultLabels, Counter>,
    /// `tap_cpu_info`, set once from the topology ([`Metrics::set_cpu_info`]).
    pub cpu_info: Family<CpuLabels, Gauge>,
    /// The rebalancing loop's (registered in every mode; empty while rebalancing is off).
    pub rebalance: RebalanceMetrics,
    /// Where the per-pool figures come from at scrape time.
    usage: UsageSource,
    grants: OnceLock<Box<GrantsFn>>,
    /// The state is rebuilt from the runtime (proxies) or the NRI session is synchronized.
    ready: AtomicBool,
    /// Whether `/readyz` also waits for a proxy socket, and whether it is bound.
    socket: AtomicU8,
}

/// Values of [`Metrics::socket`].
const SOCKET_NONE: u8 = 0;
const SOCKET_PENDING: u8 = 1;
const SOCKET_BOUND: u8 = 2;

/// What a scrape reads from the engine: the per-pool figures (capacity, usage, containers)
/// and the configuration in force (policy, cluster affinity).
#[derive(Debug, Clone, Default)]
pub struct EngineFigures {
    pub pools: Vec<PoolStatus>,
    pub config: EngineConfig,
}

/// Reads the engine's figures when they are scraped.
pub type UsageFn = dyn Fn() -> EngineFigures + Send + Sync;

/// Whether `mode` (`--container-runtime-mode`, any case) is a proxy mode, where
/// `tap_proxy_up` means something.
pub fn is_proxy_mode(mode: &str) -> bool {
    mode.eq_ignore_ascii_case("docker") || mode.eq_ignore_ascii_case("containerd")
}

#[derive(Clone, Default)]
struct UsageSource(Arc<OnceLock<Box<UsageFn>>>);

/// Renders the grants (`/grants`): every container the engine holds, with the cpuset and
/// memory nodes it wants for it in the runtime's terms, as JSON.
pub type GrantsFn = dyn Fn() -> serde_json::Value + Send + Sync;

impl std::fmt::Debug for UsageSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UsageSource")
    }
}

/// `tap_topology_node_{capacity_cpus,usage_cpus,containers}` and `tap_build_info`, computed from
/// the engine's state on each scrape rather than on every hook.
#[derive(Debug)]
struct UsageCollector {
    source: UsageSource,
    mode: String,
}

impl Collector for UsageCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let figures = self.source.0.get().map(|f| f());
        let mut family = encoder.encode_descriptor(
            "tap_build_info",
            "Always 1: the agent's version, architecture, runtime mode and the placement policy in force",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(1i64).encode(
            family.encode_family(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_string(),
                arch: std::env::consts::ARCH.to_string(),
                mode: self.mode.clone(),
                policy: figures
                    .as_ref()
                    .map(|f| f.config.policy.as_str().to_string())
                    .unwrap_or_default(),
            })?,
        )?;
        let (pools, cluster_affinity, cache_affinity) = figures
            .map(|f| {
                let caches = f.config.cache_affinity == tap_engine::CacheAffinity::On;
                (f.pools, f.config.cluster_affinity, caches)
            })
            .unwrap_or_default();
        // Cluster (and cache) pools hold containers only with cluster (cache) affinity; without
        // it their series would only repeat their NUMA node's CPUs.
        let pools: Vec<PoolStatus> = pools
            .into_iter()
            .filter(|p| cluster_affinity || p.level != Level::Cluster)
            .filter(|p| cache_affinity || p.level != Level::Cache)
            .collect();
        let labels: Vec<ZoneLabels> = pools
            .iter()
            .map(|p| ZoneLabels {
                zone: p.name.clone(),
                level: p.level.as_str().to_string(),
            })
            .collect();
        let cpus = |m: u64| m as f64 / 1000.0;
        let series = [
            (
                "tap_topology_node_capacity_cpus",
                "CPUs a topology zone (pool) can share out",
                pools
                    .iter()
                    .map(|p| cpus(p.capacity_milli))
                    .collect::<Vec<_>>(),
            ),
            (
                "tap_topology_node_usage_cpus",
                "CPUs requested by containers placed in a topology zone (pool) and below",
                pools.iter().map(|p| cpus(p.request_milli)).collect(),
            ),
        ];
        for (name, help, values) in series {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (v, l) in values.into_iter().zip(&labels) {
                ConstGauge::new(v).encode(family.encode_family(l)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "tap_topology_node_containers",
            "Containers placed on a topology zone (pool) itself",
            None,
            MetricType::Gauge,
        )?;
        for (p, l) in pools.iter().zip(&labels) {
            ConstGauge::new(i64::from(p.containers)).encode(family.encode_family(l)?)?;
        }
        Ok(())
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// The metrics of NRI mode (no `tap_proxy_up`); for tests and tools.
    pub fn new() -> Metrics {
        Metrics::for_mode("NRI")
    }

    /// The metrics of an agent in runtime mode `mode` (`NRI`, `Containerd`, `Docker`, or a
    /// tool's name): `tap_build_info` carries it, and `tap_proxy_up` is registered only in the
    /// proxy modes.
    pub fn for_mode(mode: &str) -> Metrics {
        let mut registry = Registry::default();
        let proxy_up = Gauge::default();
        let proxy_request_duration = Family::<MethodLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let hook_request_duration = Family::<HookLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let pod_resources_duration = latency_histogram();
        let errors = Family::<ErrorLabels, Counter>::default();
        let placements = Family::<PlacementLabels, Counter>::default();
        let runtime_connected = Gauge::default();
        let reconciles = Family::<ResultLabels, Counter>::default();
        let cpuset_writes = Family::<ResultLabels, Counter>::default();
        let unconverged = Gauge::default();
        let cpuset_readbacks = Family::<ResultLabels, Counter>::default();
        let cpu_info = Family::<CpuLabels, Gauge>::default();
        if is_proxy_mode(mode) {
            registry.register(
                "tap_proxy_up",
                "Whether the runtime proxy is serving (1) or not (0)",
                proxy_up.clone(),
            );
        }
        register!(registry;
            "tap_proxy_request_duration_seconds" => proxy_request_duration,
                "Time to serve a proxied runtime request, by method";
            "tap_hook_request_duration_seconds" => hook_request_duration,
                "Time the placement engine took for a hook, by hook and mode";
            "tap_pod_resources_request_duration_seconds" => pod_resources_duration,
                "Time the kubelet's pod-resources API took to tell a create's allocated devices (answered or not)";
        );
        let usage = UsageSource::default();
        registry.register_collector(Box::new(UsageCollector {
            source: usage.clone(),
            mode: mode.to_string(),
        }));
        register!(registry;
            "tap_errors" => errors,
                "Problems that were failed open (the container started unchanged), by hook and kind";
            "tap_placements" => placements,
                "Containers placed, by pool level and exclusivity";
            "tap_runtime_connected" => runtime_connected,
                "Whether the agent is connected to its runtime (NRI) or can reach it (proxies)";
            "tap_runtime_reconciles" => reconciles,
                "Periodic comparisons of the agent's state with the runtime's containers (proxy modes), by result (ok, error)";
            "tap_cpuset_writes" => cpuset_writes,
                "Cpuset updates the agent sent to its runtime to converge a container, by result (ok, refused, not_found, runtime, timeout)";
            "tap_unconverged_containers" => unconverged,
                "Containers whose cpuset at the runtime differs from the agent's decision, as far as the agent knows (0 at rest)";
            "tap_cpuset_readbacks" => cpuset_readbacks,
                "Containers' cgroup cpusets read back by the agent, by result (same: as the agent's books said; corrected: the books were wrong and now say what the cgroup holds; not_found; error)";
            "tap_cpu_info" => cpu_info,
                "Always 1: the CPU model (Arm implementer and part, hex; model name)";
        );
        let rebalance = RebalanceMetrics::register(&mut registry);
        Metrics {
            registry,
            rebalance,
            proxy_up,
            proxy_request_duration,
            hook_request_duration,
            pod_resources_duration,
            errors,
            placements,
            runtime_connected,
            reconciles,
            cpuset_writes,
            unconverged,
            cpuset_readbacks,
            cpu_info,
            usage,
            grants: OnceLock::new(),
            ready: AtomicBool::new(false),
            socket: AtomicU8::new(SOCKET_NONE),
        }
    }

    pub fn observe_hook(&self, hook: Hook, mode: &'static str, d: Duration) {
        self.hook_request_duration
            .get_or_create(&HookLabels { hook, mode })
            .observe(d.as_secs_f64());
    }

    pub fn observe_proxy(&self, method: &'static str, d: Duration) {
        self.proxy_request_duration
            .get_or_create(&MethodLabels { method })
            .observe(d.as_secs_f64());
    }

    pub fn count_error(&self, hook: Hook, kind: ErrorKind) {
        let kind = kind.as_str();
        self.errors.get_or_create(&ErrorLabels { hook, kind }).inc();
    }

    /// One cpuset write of the convergence loop ended (`ok` or an error kind).
    pub fn count_cpuset_write(&self, result: &'static str) {
        self.cpuset_writes
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// One container's cgroup was read back (`same`, `corrected`, `not_found`, `error`).
    pub fn count_readback(&self, result: &'static str, n: u64) {
        if n > 0 {
            self.cpuset_readbacks
                .get_or_create(&ResultLabels { result })
                .inc_by(n);
        }
    }

    /// One periodic reconcile with the runtime ended (`ok`, or `error` when it could not list).
    pub fn count_reconcile(&self, ok: bool) {
        self.reconciles
            .get_or_create(&ResultLabels {
                result: if ok { "ok" } else { "error" },
            })
            .inc();
    }

    pub fn count_placement(&self, level: &str, exclusive: bool) {
        self.placements
            .get_or_create(&PlacementLabels {
                level: level.to_string(),
                exclusive: exclusive.to_string(),
            })
            .inc();
    }

    /// Sets `tap_cpu_info` to this CPU (one series; a later call replaces it).
    pub fn set_cpu_info(&self, cpu: &tap_engine::CpuModel) {
        self.cpu_info.clear();
        self.cpu_info
            .get_or_create(&CpuLabels {
                implementer: cpu.implementer_hex().unwrap_or_default(),
                part: cpu.part_hex().unwrap_or_default(),
                model: cpu.name(),
            })
            .set(1);
    }

    /// Sets where the per-pool gauges are read from at scrape time (once; later calls are
    /// ignored).
    pub fn set_usage_source(&self, f: Box<UsageFn>) {
        let _ = self.usage.0.set(f);
    }

    /// Sets where `/grants` is read from (once; later calls are ignored).
    pub fn set_grants_source(&self, f: Box<GrantsFn>) {
        let _ = self.grants.set(f);
    }

    /// The engine's grants as JSON (`{}` before the agent is set up).
    pub fn grants(&self) -> serde_json::Value {
        self.grants
            .get()
            .map_or_else(|| serde_json::json!({}), |f| f())
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    /// A proxy mode: `/readyz` also waits for [`Metrics::set_socket_bound`], so a client that
    /// waits for readiness finds the socket there (the state can be restored before the bind).
    pub fn expect_socket(&self) {
        self.socket.store(SOCKET_PENDING, Ordering::SeqCst);
    }

    /// The proxy socket is bound (`true`) or closed (`false`); sets `tap_proxy_up` with it.
    pub fn set_socket_bound(&self, bound: bool) {
        let v = if bound { SOCKET_BOUND } else { SOCKET_PENDING };
        self.socket.store(v, Ordering::SeqCst);
        self.proxy_up.set(i64::from(bound));
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst) && self.socket.load(Ordering::SeqCst) != SOCKET_PENDING
    }

    /// The OpenMetrics text of all metrics.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// Serves `/metrics`, `/healthz`, `/readyz` and `/grants` on `addr` until the process ends.
pub async fn serve(addr: std::net::SocketAddr, metrics: Arc<Metrics>) -> anyhow::Result<()> {
    use axum::{http::StatusCode, routing::get, Router};
    let m1 = metrics.clone();
    let m2 = metrics.clone();
    let m3 = metrics.clone();
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let m = m1.clone();
                async move {
                    (
                        [(
                            "content-type",
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        m.render(),
                    )
                }
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/grants",
            get(move || {
                let m = m3.clone();
                async move {
                    (
                        [("content-type", "application/json")],
                        m.grants().to_string(),
                    )
                }
            }),
        )
        .route(
            "/readyz",
            get(move || {
                let m = m2.clone();
                async move {
                    if m.is_ready() {
                        (StatusCode::OK, "ready")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                    }
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving /metrics, /healthz, /readyz and /grants");
    axum::serve(listener, app).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines of a scrape that start with `prefix` (a metric's name and `{`: its series).
    fn series<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
        text.lines().filter(|l| l.starts_with(prefix)).collect()
    }

    /// A control's payload (a whole-cores size) makes no series of its own: two sizes count
    /// on one line.
    #[test]
    fn one_series_per_error_kind_label() {
        let m = Metrics::for_mode("NRI");
        for cpus in [4, 6] {
            let u = tap_engine::Unhonoured::WholeCores { cpus };
            m.count_error(Hook::Create, ErrorKind::Unhonoured(u));
        }
        let text = m.render();
        let lines: Vec<&str> = text.lines().filter(|l| l.contains("whole_cores")).collect();
        assert_eq!(
            lines,
            [r#"tap_errors_total{hook="create",kind="whole_cores"} 2"#],
            "{text}"
        );
    }

    #[test]
    fn a_proxy_is_ready_once_restored_and_bound() {
        let m = Metrics::for_mode("Docker");
        m.expect_socket();
        m.set_ready(true);
        assert!(!m.is_ready(), "restored but the socket is not bound yet");
        m.set_socket_bound(true);
        assert!(m.is_ready());
        assert_eq!(m.proxy_up.get(), 1);
        m.set_socket_bound(false);
        assert!(!m.is_ready(), "the socket is closed");
        let nri = Metrics::for_mode("NRI");
        nri.set_ready(true);
        assert!(nri.is_ready(), "NRI mode has no socket to wait for");
    }

    #[test]
    fn reference_metric_names_are_exported() {
        let m = Metrics::for_mode("Containerd");
        m.observe_hook(Hook::Create, "NRI", Duration::from_micros(5));
        m.observe_proxy(
            "/runtime.v1.RuntimeService/Version",
            Duration::from_micros(50),
        );
        m.count_error(Hook::Create, crate::metrics::ErrorKind::Annotation);
        let text = m.render();
        for name in [
            "tap_proxy_up",
            "tap_proxy_request_duration_seconds",
            "tap_hook_request_duration_seconds",
            "tap_topology_node_capacity_cpus",
            "tap_topology_node_usage_cpus",
            "tap_topology_node_containers",
            "tap_errors_total",
            "tap_build_info",
        ] {
            assert!(text.contains(name), "{name} missing from\n{text}");
        }
    }

    /// The names docs/user/troubleshooting.md, README.md and the other docs use are the names
    /// exported: counters carry `_total` (OpenMetrics), so `tap_errors` alone is not a series.
    #[test]
    fn documented_metric_names_are_the_exported_ones() {
        let m = Metrics::for_mode("Docker");
        m.count_error(Hook::Create, crate::metrics::ErrorKind::Annotation);
        m.count_placement("numa", false);
        m.count_reconcile(true);
        m.count_cpuset_write("ok");
        m.count_readback("corrected", 1);
        m.observe_hook(Hook::Create, "Docker", Duration::from_micros(5));
        m.observe_proxy("/v1.41/containers/create", Duration::from_micros(5));
        m.set_cpu_info(&tap_engine::CpuModel::unknown());
        let round = tap_engine::rebalance::UsageReport {
            nodes: vec![tap_engine::rebalance::NodeUsage {
                node: 0,
                usage_milli: 1500,
                shared_cpus: 4,
            }],
            imbalance: Some(1.2),
        };
        m.rebalance
            .observe_round(&round, &round, &round, 3, Duration::from_millis(2));
        m.set_usage_source(Box::new(|| EngineFigures {
            pools: vec![pool("numa0", Level::Numa, 4000, 1000, 1)],
            config: EngineConfig::default(),
        }));
        let text = m.render();
        let exported: std::collections::BTreeSet<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .filter_map(|l| l.split(['{', ' ']).next())
            .collect();
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut checked = 0;
        for doc in [
            "docs/user/troubleshooting.md",
            "docs/user/install.md",
            "docs/design/nri.md",
            "docs/design/reliability.md",
            "docs/design/rebalance.md",
            "docs/user/metrics.md",
            "README.md",
        ] {
            let text = std::fs::read_to_string(root.join(doc)).unwrap_or_default();
            assert!(!text.is_empty(), "{doc} missing");
            // Every `tap_…` word in backticks or followed by `{` names an exported series
            // (histograms by their base name).
            for word in text
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("tap_") && w.len() > 4)
            {
                if word.starts_with("tap_e2e") || word == "tap_sim" {
                    continue;
                }
                let known = exported.iter().any(|e| {
                    *e == word
                        || e.strip_suffix("_bucket") == Some(word)
                        || e.strip_suffix("_count") == Some(word)
                        || e.strip_suffix("_sum") == Some(word)
                });
                assert!(
                    known,
                    "{doc} names {word}, which the agent does not export: {exported:?}"
                );
                checked += 1;
            }
        }
        assert!(
            checked > 10,
            "only {checked} metric names found in the docs"
        );
    }

    fn pool(name: &str, level: Level, capacity: u64, request: u64, containers: u32) -> PoolStatus {
        PoolStatus {
            name: name.into(),
            level,
            cpus: "0-3".into(),
            capacity_milli: capacity,
            request_milli: request,
            limit_milli: 0,
            exclusive_cpus: String::new(),
            shared_cpus: "0-3".into(),
            claimed_cpus: String::new(),
            containers,
        }
    }

    #[test]
    fn proxy_up_is_exported_only_in_the_proxy_modes() {
        for (mode, exported) in [
            ("NRI", false),
            ("nri", false),
            ("kube-link", false),
            ("Containerd", true),
            ("Docker", true),
            ("docker", true),
        ] {
            let text = Metrics::for_mode(mode).render();
            assert_eq!(text.contains("tap_proxy_up"), exported, "{mode}:\n{text}");
        }
        assert!(!Metrics::new().render().contains("tap_proxy_up"));
    }

    #[test]
    fn build_info_says_version_arch_mode_and_the_policy_in_force() {
        let m = Metrics::for_mode("NRI");
        let policy = Arc::new(std::sync::Mutex::new(tap_engine::PolicyKind::TopologyAware));
        let p2 = policy.clone();
        m.set_usage_source(Box::new(move || EngineFigures {
            pools: Vec::new(),
            config: EngineConfig {
                policy: *p2.lock().unwrap(),
                ..EngineConfig::default()
            },
        }));
        let (v, arch) = (env!("CARGO_PKG_VERSION"), std::env::consts::ARCH);
        let want = |policy: &str| {
            [format!("tap_build_info{{version=\"{v}\",arch=\"{arch}\",mode=\"NRI\",policy=\"{policy}\"}} 1")]
        };
        assert_eq!(
            series(&m.render(), "tap_build_info{"),
            want("topology-aware")
        );
        // A NodeTopology policy switches the engine's config: the next scrape says so.
        *policy.lock().unwrap() = tap_engine::PolicyKind::NumaAware;
        assert_eq!(series(&m.render(), "tap_build_info{"), want("numa-aware"));
    }

    #[test]
    fn cpu_info_names_the_cpu_once() {
        use tap_engine::cpu_model::{CpuModel, CpuModelSource, Midr};
        let m = Metrics::new();
        let kp = |bits| CpuModel::from_midr(Midr::from_bits(bits), CpuModelSource::SysfsMidr);
        m.set_cpu_info(&kp(0x481f_d010));
        m.set_cpu_info(&kp(0x480f_d060));
        assert_eq!(
            series(&m.render(), "tap_cpu_info{"),
            ["tap_cpu_info{implementer=\"0x48\",part=\"0xd06\",model=\"HiSilicon Kunpeng 950\"} 1"]
        );
    }

    #[test]
    fn cluster_zones_are_exported_only_with_cluster_affinity() {
        for affinity in [false, true] {
            let m = Metrics::new();
            m.set_usage_source(Box::new(move || EngineFigures {
                pools: vec![
                    pool("numa0", Level::Numa, 4000, 2000, 0),
                    pool("cluster0", Level::Cluster, 4000, 2000, 1),
                ],
                config: EngineConfig {
                    cluster_affinity: affinity,
                    ..EngineConfig::default()
                },
            }));
            let t = m.render();
            assert!(t.contains("tap_topology_node_usage_cpus{zone=\"numa0\",level=\"numa\"} 2.0"));
            for name in [
                "tap_topology_node_capacity_cpus",
                "tap_topology_node_usage_cpus",
                "tap_topology_node_containers",
            ] {
                assert_eq!(
                    t.contains(&format!("{name}{{zone=\"cluster0\",level=\"cluster\"}}")),
                    affinity,
                    "{name}, cluster affinity {affinity}:\n{t}"
                );
            }
        }
    }

    #[test]
    fn pool_figures_are_read_when_scraped() {
        let m = Metrics::new();
        let n = Arc::new(std::sync::atomic::AtomicU64::new(1000));
        let n2 = n.clone();
        m.set_usage_source(Box::new(move || EngineFigures {
            pools: vec![pool(
                "numa0",
                Level::Numa,
                4000,
                n2.load(Ordering::SeqCst),
                2,
            )],
            config: EngineConfig::default(),
        }));
        let t = m.render();
        for (name, value) in [
            ("tap_topology_node_usage_cpus", "1.0"),
            ("tap_topology_node_capacity_cpus", "4.0"),
            ("tap_topology_node_containers", "2"),
        ] {
            assert_eq!(
                series(&t, &format!("{name}{{")),
                [format!("{name}{{zone=\"numa0\",level=\"numa\"}} {value}")]
            );
        }
        n.store(2500, Ordering::SeqCst);
        assert!(m
            .render()
            .contains("tap_topology_node_usage_cpus{zone=\"numa0\",level=\"numa\"} 2.5"));
    }
}
