//! The runtime-agnostic hook layer that every mode (NRI, CRI proxy, Docker proxy) calls.
//!
//! A mode turns what its runtime says into a [`ContainerInfo`]; the [`Agent`] turns that into a
//! [`tap_engine::ContainerRequest`], asks the engine, and answers with an [`Adjustment`].
//! Every call fails open: an error or even a panic inside the engine gives an empty adjustment
//! (the container starts unchanged), a log line and a metric, never an error to the runtime.

pub use crate::fold::HostFold;
use crate::hook::Hook;
use crate::metrics::Metrics;

pub mod claims;
mod device_hints;
pub mod rebalance;
use crate::pod_resources::{DeviceSource, KubeletDevice};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;
use tap_engine::devices::DeviceScheme;
use tap_engine::grant::Grant;
use tap_engine::request::{milli_cpu_from_quota, milli_cpu_from_shares, GRANT_KEY, KEY_PREFIX};
use tap_engine::{
    ContainerRequest, CpuSet, CpusetUpdate, Engine, EngineConfig, Existing, NodeSet, Outcome,
    Overrides, Qos, Topology,
};

/// What a runtime tells us about a Pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodInfo {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub labels: HashMap<String, String>,
    pub annotations: HashMap<String, String>,
    /// The Pod's cgroup parent (QoS is in the path) when the runtime gives it.
    pub cgroup_parent: Option<String>,
}

/// What a runtime tells us about a container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerInfo {
    pub id: String,
    pub name: String,
    pub pod: PodInfo,
    /// QoS when the runtime knows it directly; else derived from the cgroup parent, else from
    /// the resources.
    pub qos: Option<Qos>,
    pub cpu_shares: Option<u64>,
    pub cpu_quota: Option<i64>,
    pub cpu_period: Option<u64>,
    pub memory_limit: Option<i64>,
    /// `KEY=VALUE` environment entries (device requests such as `VA_VISIBLE_DEVICES`).
    pub env: Vec<String>,
    /// The container's own annotations or labels (the grant record is read from here).
    pub annotations: HashMap<String, String>,
    /// Current cpuset and memory nodes (for restore), as the runtime reports them (parsed
    /// from its list syntax at the edge with [`runtime_cpus`] / [`runtime_nodes`]).
    pub cpus: Option<CpuSet>,
    pub mems: Option<NodeSet>,
    /// Devices the kubelet allocated to the container (pod-resources API), read at create.
    pub kubelet_devices: Vec<KubeletDevice>,
    /// The hugetlb limits the runtime sets on the container (the kubelet's
    /// `hugepages-<size>` limits), one per page size; zero limits left out.
    pub hugepage_limits: Vec<HugepageLimit>,
}

/// A container's hugetlb limit: at most `bytes` of pages of `size_kb`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HugepageLimit {
    pub size_kb: u64,
    pub bytes: u64,
}

impl HugepageLimit {
    /// A limit as the runtimes give it (`page_size` `2MB`, `1GB`, `64KB`: `<size><unit>B`,
    /// base 1024, as in the OCI spec and CRI); `None` for a zero limit or a size not read.
    pub fn from_runtime(page_size: &str, bytes: u64) -> Option<HugepageLimit> {
        if bytes == 0 {
            return None;
        }
        let s = page_size.trim().strip_suffix('B')?;
        let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (number, unit) = s.split_at(split);
        let number: u64 = number.parse().ok()?;
        let kb = match unit {
            "K" | "k" => number,
            "M" => number.checked_mul(1 << 10)?,
            "G" => number.checked_mul(1 << 20)?,
            "T" => number.checked_mul(1 << 30)?,
            _ => return None,
        };
        (kb > 0).then_some(HugepageLimit { size_kb: kb, bytes })
    }

    /// The pages the limit holds (a part page counts whole).
    pub fn pages(&self) -> u64 {
        let page = self.size_kb.saturating_mul(1024).max(1);
        self.bytes.div_ceil(page)
    }
}

impl ContainerInfo {
    /// Takes the hugepage limits a runtime passes, `(page size, bytes)` each, where it passes
    /// any; the sizes [`HugepageLimit::from_runtime`] does not read are left out.
    pub fn set_runtime_hugepage_limits<'a>(
        &mut self,
        limits: impl IntoIterator<Item = (&'a str, u64)>,
    ) {
        let mut limits = limits.into_iter().peekable();
        if limits.peek().is_some() {
            self.hugepage_limits = limits
                .filter_map(|(size, bytes)| HugepageLimit::from_runtime(size, bytes))
                .collect();
        }
    }

    /// A copy holding only what placement, updates and restore read again: every field but the
    /// maps and the environment whole, of those only the kunpeng-tap keys ([`KEY_PREFIX`]) and
    /// the device entries ([`DEVICE_ENV_VARS`]). What the ledger keeps per container: the
    /// kubelet's other labels, annotations and environment (~3.6 KiB a container) are not needed.
    pub fn placement_inputs(&self) -> ContainerInfo {
        fn ours(m: &HashMap<String, String>) -> HashMap<String, String> {
            m.iter()
                .filter(|(k, _)| k.starts_with(KEY_PREFIX))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        }
        ContainerInfo {
            id: self.id.clone(),
            name: self.name.clone(),
            pod: PodInfo {
                uid: self.pod.uid.clone(),
                name: self.pod.name.clone(),
                namespace: self.pod.namespace.clone(),
                labels: ours(&self.pod.labels),
                annotations: ours(&self.pod.annotations),
                cgroup_parent: self.pod.cgroup_parent.clone(),
            },
            qos: self.qos,
            cpu_shares: self.cpu_shares,
            cpu_quota: self.cpu_quota,
            cpu_period: self.cpu_period,
            memory_limit: self.memory_limit,
            env: self
                .env
                .iter()
                .filter(|e| {
                    e.split_once('=')
                        .is_some_and(|(k, _)| DEVICE_ENV_VARS.contains(&k))
                })
                .cloned()
                .collect(),
            annotations: ours(&self.annotations),
            cpus: self.cpus,
            mems: self.mems,
            kubelet_devices: self.kubelet_devices.clone(),
            hugepage_limits: self.hugepage_limits.clone(),
        }
    }
}

/// A cpuset change for another container, in runtime terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    pub container_id: String,
    pub cpus: CpuSet,
    pub mems: Option<NodeSet>,
}

/// The answer to a create or update hook. Empty means "leave the container as it is".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Adjustment {
    pub cpus: Option<CpuSet>,
    pub mems: Option<NodeSet>,
    /// Grant record to store with the container (annotation or label [`GRANT_KEY`]).
    pub record: Option<String>,
    pub updates: Vec<Update>,
}

impl Adjustment {
    pub fn is_empty(&self) -> bool {
        self.cpus.is_none() && self.mems.is_none() && self.updates.is_empty()
    }
}

/// A cpuset as a runtime reports it (kernel list syntax) at the edge where its wire format is
/// read. Empty is `None` (nothing set); so is a list that does not parse (logged): the
/// container is then treated as one without a cpuset.
pub fn runtime_cpus(container: &str, s: &str) -> Option<CpuSet> {
    parsed(container, "cpus", s, CpuSet::parse(s)).filter(|c| !c.is_empty())
}

/// Memory nodes as a runtime reports them; as [`runtime_cpus`].
pub fn runtime_nodes(container: &str, s: &str) -> Option<NodeSet> {
    parsed(container, "mems", s, NodeSet::parse(s)).filter(|m| !m.is_empty())
}

fn parsed<T>(
    container: &str,
    what: &'static str,
    s: &str,
    r: Result<T, tap_engine::cpuset::ParseError>,
) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(
                container,
                what,
                value = s,
                "ignoring the runtime's {what}: {e}"
            );
            None
        }
    }
}

/// Environment variables through which a container names its accelerator devices (NVIDIA,
/// the reference's `VA_*`, Ascend): see [`tap_engine::devices::DeviceScheme`].
pub use tap_engine::devices::DEVICE_ENV_VARS;

pub struct Agent {
    /// Shared with the metrics, which read the per-pool figures at scrape time.
    engine: Arc<Mutex<Engine>>,
    topo: Arc<Topology>,
    metrics: Arc<Metrics>,
    fold: Option<HostFold>,
    mode: &'static str,
    /// Placement notes for Pod Events (see [`crate::notes`]).
    notes: crate::notes::Sink,
    /// Set by the first [`Agent::restore`]: until then the engine does not hold the runtime's
    /// containers and its usage figures must not be published.
    restored: std::sync::atomic::AtomicBool,
    /// Whether the reason cluster affinity is off on this CPU was logged (once a process).
    clusters_off_logged: std::sync::atomic::AtomicBool,
    /// Where the devices the kubelet allocated are read (none: environment hints only).
    device_source: std::sync::OnceLock<Arc<dyn DeviceSource>>,
    /// Lists the containers the agent books (set by the runtime mode's ledger).
    roster: std::sync::OnceLock<Roster>,
    /// Told the containers a configuration change moved (set by the runtime mode's ledger).
    change_sink: std::sync::OnceLock<ChangeSink>,
    /// The NUMA nodes of this node's DRA devices (kept by the kube link, read with the
    /// kubelet's device allocation).
    dra: Arc<crate::pod_resources::dra::DraTopology>,
    /// Woken when the configuration changes (the DRA driver's devices follow it).
    config_changed: tokio::sync::Notify,
    /// The next engine call panics (tests of the panic guard's callers).
    #[cfg(test)]
    panic_next: std::sync::atomic::AtomicBool,
}

/// Takes the ids of containers whose cpuset changed outside a runtime hook.
pub type ChangeSink = Box<dyn Fn(Vec<String>) + Send + Sync>;

/// Lists the placement inputs of the containers the agent books.
pub type Roster = Box<dyn Fn() -> Vec<ContainerInfo> + Send + Sync>;

/// The placement engine panicked (caught, logged and counted in `tap_errors_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the placement engine failed (a panic, logged)")]
pub struct EngineFailed;

impl Agent {
    pub fn new(
        engine: Engine,
        metrics: Arc<Metrics>,
        fold: Option<HostFold>,
        mode: &'static str,
    ) -> Agent {
        let topo = engine.topology().clone();
        let engine = Arc::new(Mutex::new(engine));
        let weak = Arc::downgrade(&engine);
        metrics.set_usage_source(Box::new(move || match weak.upgrade() {
            Some(e) => {
                let e = e.lock().unwrap_or_else(|p| p.into_inner());
                crate::metrics::EngineFigures {
                    pools: e.pool_status(),
                    config: e.config().clone(),
                }
            }
            None => crate::metrics::EngineFigures::default(),
        }));
        let weak = Arc::downgrade(&engine);
        let grant_fold = fold.clone();
        metrics.set_grants_source(Box::new(move || match weak.upgrade() {
            Some(e) => {
                let e = e.lock().unwrap_or_else(|p| p.into_inner());
                grants_json(&e, grant_fold.as_ref())
            }
            None => serde_json::json!({}),
        }));
        metrics.set_cpu_info(&topo.cpu);
        let agent = Agent {
            engine,
            topo,
            metrics,
            fold,
            mode,
            notes: crate::notes::Sink::default(),
            restored: std::sync::atomic::AtomicBool::new(false),
            clusters_off_logged: std::sync::atomic::AtomicBool::new(false),
            device_source: std::sync::OnceLock::new(),
            roster: std::sync::OnceLock::new(),
            change_sink: std::sync::OnceLock::new(),
            dra: Arc::default(),
            config_changed: tokio::sync::Notify::new(),
            #[cfg(test)]
            panic_next: std::sync::atomic::AtomicBool::new(false),
        };
        agent.log_clusters_off(&agent.lock());
        agent
    }

    /// Whether the state has been rebuilt from the runtime at least once (see
    /// [`Agent::restore`]). Status and NodeResourceTopology writers wait for it: before it, an
    /// agent that just restarted would publish an empty node over the truth its predecessor
    /// published.
    pub fn restored(&self) -> bool {
        self.restored.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Reads the devices the kubelet allocates from `source` (set once; a second call is
    /// ignored).
    pub fn set_device_source(&self, source: Arc<dyn DeviceSource>) {
        let _ = self.device_source.set(source);
    }

    pub fn device_source(&self) -> Option<&Arc<dyn DeviceSource>> {
        self.device_source.get()
    }

    /// Where placement notes go (attach a consumer to get them).
    pub fn notes(&self) -> &crate::notes::Sink {
        &self.notes
    }

    /// Offers a note about `c` (never blocks; a full queue drops it, counted).
    fn note(&self, hook: Hook, c: &ContainerInfo, kind: crate::notes::Kind, message: String) {
        if c.pod.name.is_empty() || !self.notes.attached() {
            return;
        }
        let n = crate::notes::Note {
            kind,
            hook,
            pod_uid: c.pod.uid.clone(),
            pod_name: c.pod.name.clone(),
            namespace: c.pod.namespace.clone(),
            container: c.name.clone(),
            message,
        };
        if !self.notes.offer(n) {
            self.metrics
                .count_error(hook, crate::metrics::ErrorKind::EventDropped);
        }
    }

    pub fn topology(&self) -> &Arc<Topology> {
        &self.topo
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn mode(&self) -> &'static str {
        self.mode
    }

    /// The engine, even if a previous holder panicked (the state is consistent between calls:
    /// the engine mutates only after it decided).
    fn lock(&self) -> MutexGuard<'_, Engine> {
        self.engine.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the engine is held by someone else right now (a restore, a scrape): a decision
    /// would wait for it.
    pub fn engine_busy(&self) -> bool {
        matches!(
            self.engine.try_lock(),
            Err(std::sync::TryLockError::WouldBlock)
        )
    }

    /// Runs `f` on the engine; a panic inside becomes `None` with a log line and a metric.
    fn guarded<T>(&self, hook: Hook, f: impl FnOnce(&mut Engine) -> T) -> Option<T> {
        let start = Instant::now();
        let mut guard = self.lock();
        let out = catch_unwind(AssertUnwindSafe(|| {
            #[cfg(test)]
            if self
                .panic_next
                .swap(false, std::sync::atomic::Ordering::SeqCst)
            {
                panic!("a panic the test asked for");
            }
            f(&mut guard)
        }));
        drop(guard);
        self.metrics.observe_hook(hook, self.mode, start.elapsed());
        match out {
            Ok(v) => Some(v),
            Err(p) => {
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                tracing::error!(hook = hook.as_str(), %msg, "placement engine failed; leaving the container unchanged");
                self.metrics
                    .count_error(hook, crate::metrics::ErrorKind::Panic);
                None
            }
        }
    }

    /// Builds the engine request for a container; annotation problems are logged and counted.
    pub fn request_of(&self, c: &ContainerInfo) -> ContainerRequest {
        let (overrides, warnings) = Overrides::from_pod(&c.pod.labels, &c.pod.annotations, &c.name);
        for w in &warnings {
            tracing::warn!(pod = %c.pod.name, namespace = %c.pod.namespace, container = %c.name, "{w}");
            self.metrics
                .count_error(Hook::Create, crate::metrics::ErrorKind::Annotation);
        }
        let qos = c
            .qos
            .or_else(|| c.pod.cgroup_parent.as_deref().map(Qos::from_cgroup_parent));
        let request = c.cpu_shares.map(milli_cpu_from_shares).unwrap_or(0);
        let limit = match (c.cpu_quota, c.cpu_period) {
            (Some(q), Some(p)) => milli_cpu_from_quota(q, p),
            (Some(q), None) => milli_cpu_from_quota(q, 100_000),
            _ => None,
        };
        ContainerRequest {
            id: c.id.clone(),
            pod_uid: c.pod.uid.clone(),
            pod_name: c.pod.name.clone(),
            namespace: c.pod.namespace.clone(),
            container_name: c.name.clone(),
            qos,
            cpu_request_milli: request,
            cpu_limit_milli: limit,
            memory_limit_bytes: c.memory_limit.filter(|m| *m > 0).map(|m| m as u64),
            device_nodes: self.device_nodes(&c.env, &c.kubelet_devices),
            claims: own_claims(&c.kubelet_devices),
            overrides,
        }
    }

    /// NUMA nodes of the container's devices: those the kubelet allocated (their plugin's
    /// topology), and those it names through its environment, each variable over its own
    /// devices ([`DeviceScheme`]): `NVIDIA_VISIBLE_DEVICES=0` is the first NVIDIA GPU, never
    /// the BMC's VGA. What does not name a device for sure names none.
    fn device_nodes(&self, env: &[String], kubelet: &[KubeletDevice]) -> Vec<u32> {
        let mut out = Vec::new();
        for n in kubelet.iter().flat_map(|d| d.numa_nodes.iter()) {
            if self.topo.node(*n).is_some() && !out.contains(n) {
                out.push(*n);
            }
        }
        for e in env {
            let Some((k, v)) = e.split_once('=') else {
                continue;
            };
            let Some(scheme) = DeviceScheme::of_env(k) else {
                continue;
            };
            for d in tap_engine::devices::requested(scheme, v, &self.topo.devices) {
                if let Some(n) = d.numa_node.filter(|n| !out.contains(n)) {
                    out.push(n);
                }
            }
        }
        out
    }

    /// CPUs as the host names them: the fold of a fixture on a test host, else the same set.
    pub fn fold_cpus(&self, s: &CpuSet) -> CpuSet {
        match &self.fold {
            Some(f) => f.cpus(s),
            None => *s,
        }
    }

    /// Memory nodes as the host names them (see [`Agent::fold_cpus`]).
    pub fn fold_nodes(&self, s: &NodeSet) -> NodeSet {
        match &self.fold {
            Some(f) => f.nodes(s),
            None => *s,
        }
    }

    fn to_updates(&self, ups: impl IntoIterator<Item = CpusetUpdate>) -> Vec<Update> {
        ups.into_iter()
            .map(|u| Update {
                container_id: u.container_id.to_string(),
                cpus: self.fold_cpus(&u.cpus),
                mems: u.mems.as_ref().map(|m| self.fold_nodes(m)),
            })
            .collect()
    }

    /// Where a placement is, for logs and Events: its pool's name, or `reserved` for the
    /// reserved CPUs (in no pool).
    fn pool_label<'a>(&'a self, p: &tap_engine::Placement) -> &'a str {
        match p.reason {
            tap_engine::Reason::Reserved => "reserved",
            _ => &self.topo.pools[p.pool].name,
        }
    }

    fn adjustment(
        &self,
        hook: Hook,
        c: &ContainerInfo,
        out: Option<(Outcome, Option<String>)>,
    ) -> Adjustment {
        match out {
            Some((Outcome::Placed(p), record)) => {
                tracing::info!(
                    hook = hook.as_str(),
                    container = %c.id,
                    name = %c.name,
                    pod = %c.pod.name,
                    namespace = %c.pod.namespace,
                    cpus = %p.cpus,
                    mems = p.mems.as_ref().map(tracing::field::display),
                    pool = %self.pool_label(&p),
                    exclusive = p.exclusive,
                    reason = %p.reason,
                    updates = p.updates.len(),
                    "placed"
                );
                self.metrics
                    .count_placement(self.topo.pools[p.pool].level.as_str(), p.exclusive);
                let mut msg = format!(
                    "cpus {} ({}{})",
                    self.fold_cpus(&p.cpus),
                    self.pool_label(&p),
                    if p.exclusive { ", exclusive" } else { "" }
                );
                if let Some(m) = &p.mems {
                    msg.push_str(&format!(", mems {}", self.fold_nodes(m)));
                }
                msg.push_str(&format!(": {}", p.reason));
                if !c.kubelet_devices.is_empty() {
                    let devices = crate::pod_resources::describe(&c.kubelet_devices);
                    msg.push_str(&format!("; devices {devices}"));
                }
                self.note(hook, c, crate::notes::Kind::Placed, msg);
                if let Some(u) = p.unhonoured {
                    tracing::warn!(hook = hook.as_str(), container = %c.id, name = %c.name, pod = %c.pod.name, "not honoured: {u}");
                    self.metrics
                        .count_error(hook, crate::metrics::ErrorKind::Unhonoured(u));
                    self.note(hook, c, crate::notes::Kind::NotHonoured, u.to_string());
                }
                let own_cpus = p.reason != tap_engine::Reason::Reserved;
                if hook == Hook::Create && own_cpus && !c.kubelet_devices.is_empty() {
                    self.check_device_hint(c, &p.cpus);
                }
                Adjustment {
                    cpus: Some(self.fold_cpus(&p.cpus)),
                    mems: p.mems.as_ref().map(|m| self.fold_nodes(m)),
                    record,
                    updates: self.to_updates(p.updates),
                }
            }
            Some((Outcome::Skipped(why), _)) => {
                self.left_alone(hook, c, why);
                Adjustment::default()
            }
            None => {
                let msg = "left on all CPUs: the placement engine failed (see the agent log)";
                self.note(hook, c, crate::notes::Kind::FailedOpen, msg.into());
                Adjustment::default()
            }
        }
    }

    /// A container the engine left alone: where it was to be placed and could not be, a
    /// failed-open note, and an error counted when its NUMA policy could not be met.
    fn left_alone(&self, hook: Hook, c: &ContainerInfo, why: tap_engine::SkipReason) {
        use crate::metrics::ErrorKind;
        use tap_engine::SkipReason;
        tracing::info!(hook = hook.as_str(), container = %c.id, name = %c.name, pod = %c.pod.name, "not adjusted: {why}");
        let error = match why {
            SkipReason::NoCapacity => None,
            SkipReason::NoSingleNumaNode => Some(ErrorKind::StrictNuma),
            SkipReason::NoFreeNumaNode => Some(ErrorKind::ExclusiveNuma),
            _ => return,
        };
        if let Some(kind) = error {
            self.metrics.count_error(hook, kind);
        }
        let msg = format!("left on all CPUs: {why}");
        self.note(hook, c, crate::notes::Kind::FailedOpen, msg);
    }

    /// A container is being created. Everything that reads the runtime's input runs inside
    /// the panic guard.
    pub fn create(&self, c: &ContainerInfo) -> Adjustment {
        let out = self.guarded(Hook::Create, |e| {
            let req = self.request_of(c);
            let o = e.create(&req);
            let rec = e.record(&req.id);
            (o, rec)
        });
        self.adjustment(Hook::Create, c, out)
    }

    /// A container's resources changed.
    pub fn update(&self, c: &ContainerInfo) -> Adjustment {
        let out = self.guarded(Hook::Update, |e| {
            let req = self.request_of(c);
            if req.overrides.skip && e.grant(&req.id).is_none() {
                return (Outcome::Skipped(tap_engine::SkipReason::OptedOut), None);
            }
            let o = e.update(&req);
            let rec = e.record(&req.id);
            (o, rec)
        });
        self.adjustment(Hook::Update, c, out)
    }

    /// The grant a container has now (to undo a change the runtime refuses).
    pub fn grant_of(&self, id: &str) -> Option<Grant> {
        self.lock().grant(id).cloned()
    }

    /// Puts back the grant a container had before a change the runtime refused (`None`: it had
    /// none). Returns cpuset updates of containers whose cpuset must change for it.
    pub fn reinstate(&self, id: &str, previous: Option<Grant>) -> Vec<Update> {
        let ups = self
            .guarded(Hook::Rollback, |e| e.reinstate(id, previous))
            .unwrap_or_default();
        self.to_updates(ups)
    }

    /// The cpuset and memory nodes the engine gives a container now, as the runtime writes
    /// them (folded onto the host where a fold is set); `None` without a grant.
    pub fn current(&self, id: &str) -> Option<(CpuSet, Option<NodeSet>)> {
        let e = self.lock();
        let g = e.grant(id)?;
        Some((
            self.fold_cpus(&g.cpus),
            g.mems.as_ref().map(|m| self.fold_nodes(m)),
        ))
    }

    /// The grant record of a placed container.
    pub fn record_of(&self, id: &str) -> Option<String> {
        self.lock().record(id)
    }

    /// The ids of every container with a grant.
    pub fn granted(&self) -> Vec<String> {
        self.lock().grants().map(|(id, _)| id.to_string()).collect()
    }

    /// A container stopped or was removed (idempotent).
    pub fn remove(&self, id: &str) -> Vec<Update> {
        let ups = self
            .guarded(Hook::Remove, |e| e.remove(id))
            .unwrap_or_default();
        self.to_updates(ups)
    }

    /// Rebuilds the state from what the runtime reports. Returns updates for containers whose
    /// cpuset should change (restored ones, and shared ones around adopted exclusive CPUs).
    /// Containers already known keep their grant.
    /// An engine failure (a panic, caught) is an error; the engine may hold part of the
    /// restore then (a panic is not undone).
    pub fn restore(&self, containers: &[ContainerInfo]) -> Result<Vec<Update>, EngineFailed> {
        let report = self.guarded(Hook::Sync, |e| {
            let existing: Vec<Existing> = containers
                .iter()
                .map(|c| Existing {
                    request: self.request_of(c),
                    // With a host fold the live cpuset is in host CPUs, not the topology's: it
                    // cannot confirm a record (the record alone is used then).
                    cpus: c
                        .cpus
                        .filter(|s| !s.is_empty())
                        .filter(|_| self.fold.is_none() || !c.annotations.contains_key(GRANT_KEY)),
                    mems: c.mems,
                    record: c.annotations.get(GRANT_KEY).cloned(),
                })
                .collect();
            e.restore(&existing)
        });
        match report {
            Some(r) => {
                tracing::info!(
                    from_record = r.from_record,
                    inferred = r.inferred,
                    unmanaged = r.unmanaged,
                    updates = r.updates.len(),
                    "state restored from the runtime"
                );
                self.restored
                    .store(true, std::sync::atomic::Ordering::Release);
                // The ledger compares what the runtime holds with the engine in the runtime's
                // terms (folded onto the host where a fold is set): these name what to compare.
                Ok(self.to_updates(r.updates))
            }
            None => Err(EngineFailed),
        }
    }

    /// Applies a new policy configuration to containers created from now on (as the engine
    /// puts it in force: [`EngineConfig::in_force`]).
    /// Shared containers whose cpuset the change moved (reserved CPUs added or given back) go
    /// to the runtime mode's ledger ([`Agent::set_change_sink`]) to be written.
    pub fn set_config(&self, cfg: EngineConfig) {
        let mut e = self.lock();
        let before = e.config().clone();
        let ups = e.set_config(cfg);
        let now = e.config();
        if *now != before {
            tracing::info!(policy = %now.policy, memory = now.memory_topology, clusters = now.cluster_affinity, moved = ups.len(), "policy configuration changed");
        }
        self.log_clusters_off(&e);
        drop(e);
        self.config_changed.notify_one();
        self.moved(ups);
    }

    /// Resolves at the next configuration change (or at once when one happened since the last
    /// wait).
    pub async fn config_changed(&self) {
        self.config_changed.notified().await
    }

    /// Hands the containers whose cpuset a change outside a runtime hook moved to the runtime
    /// mode's ledger, to be written.
    fn moved(&self, ups: tap_engine::CpusetUpdates) {
        if !ups.is_empty() {
            if let Some(sink) = self.change_sink.get() {
                sink(
                    ups.into_iter()
                        .map(|u| u.container_id.to_string())
                        .collect(),
                );
            }
        }
    }

    /// Makes the next engine call panic inside the guard (tests).
    #[cfg(test)]
    pub(crate) fn panic_next(&self) {
        self.panic_next
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// The NUMA nodes of this node's DRA devices.
    pub fn dra_topology(&self) -> &Arc<crate::pod_resources::dra::DraTopology> {
        &self.dra
    }

    /// Where containers whose cpuset changed outside a runtime hook go (set once).
    pub fn set_change_sink(&self, sink: ChangeSink) {
        let _ = self.change_sink.set(sink);
    }

    /// Where the booked containers are listed (set once).
    pub fn set_roster(&self, roster: Roster) {
        let _ = self.roster.set(roster);
    }

    /// The placement inputs of the containers the agent books (none without a runtime mode's
    /// ledger). Call it without holding the engine.
    pub fn roster(&self) -> Vec<ContainerInfo> {
        self.roster.get().map(|r| r()).unwrap_or_default()
    }

    /// Logs, the first time it happens, why cluster affinity asked for is off on this CPU.
    fn log_clusters_off(&self, e: &Engine) {
        use std::sync::atomic::Ordering;
        if let Some(off) = e.clusters_off() {
            if !self.clusters_off_logged.swap(true, Ordering::Relaxed) {
                tracing::info!("{off}");
            }
        }
    }

    /// Why cluster affinity asked for is off on this CPU (`--cluster-affinity-rule`).
    pub fn clusters_off(&self) -> Option<tap_engine::cpu_model::ClustersOff> {
        self.lock().clusters_off().cloned()
    }

    pub fn config(&self) -> EngineConfig {
        self.lock().config().clone()
    }

    /// A copy of the engine (tests).
    pub fn snapshot(&self) -> Engine {
        self.lock().clone()
    }

    /// Reads the engine under its lock without copying it (status reporting: copying every
    /// grant once a second would hold the lock longer than reading the few figures needed).
    pub fn inspect<T>(&self, f: impl FnOnce(&Engine) -> T) -> T {
        f(&self.lock())
    }

    /// Keeps the engine locked for `d` (tests of the decision deadline).
    #[cfg(test)]
    pub fn hold_engine_for(&self, d: std::time::Duration) {
        let _g = self.lock();
        std::thread::sleep(d);
    }
}

/// The engine's grants by container key, as `/grants` shows them: the cpuset and memory
/// nodes the engine wants in the runtime's terms (folded where a fold is set), whether the
/// CPUs are the container's alone, and the pool.
/// The claims of this node's CPU driver ([`crate::dra::DRIVER`]) among a container's devices.
fn own_claims(devices: &[KubeletDevice]) -> Vec<tap_engine::claim::ClaimKey> {
    let mut out: Vec<tap_engine::claim::ClaimKey> = Vec::new();
    for d in devices.iter().filter(|d| d.resource == crate::dra::DRIVER) {
        if let Some(k) = d.claim.as_ref().filter(|k| !out.contains(k)) {
            out.push(k.clone());
        }
    }
    out
}

fn grants_json(e: &Engine, fold: Option<&HostFold>) -> serde_json::Value {
    let topo = e.topology();
    let mut out = serde_json::Map::new();
    for (id, g) in e.grants() {
        let (cpus, mems) = match fold {
            Some(f) => (f.cpus(&g.cpus), g.mems.as_ref().map(|m| f.nodes(m))),
            None => (g.cpus, g.mems),
        };
        out.insert(
            id.to_string(),
            serde_json::json!({
                "cpus": cpus.to_string(),
                "mems": mems.map(|m| m.to_string()).unwrap_or_default(),
                "exclusive": g.is_exclusive(),
                "pool": topo.pools.get(g.pool).map(|p| p.name.as_str()).unwrap_or(""),
            }),
        );
    }
    serde_json::Value::Object(out)
}

/// Sets from literals and sets shown as the runtime writes them, for tests.
#[cfg(test)]
pub(crate) mod test_sets {
    use super::{Adjustment, ContainerInfo, CpuSet, NodeSet};

    pub fn cpu_set(s: &str) -> CpuSet {
        CpuSet::parse(s).expect("a cpu list literal")
    }

    pub fn node_set(s: &str) -> NodeSet {
        NodeSet::parse(s).expect("a node list literal")
    }

    pub fn shown<T: std::fmt::Display>(o: Option<T>) -> Option<String> {
        o.map(|v| v.to_string())
    }

    /// The answer placing a container on `cpus` and memory nodes `mems`, with a grant `record`
    /// and no updates to others.
    pub fn placed(cpus: &str, mems: &str, record: &str) -> Adjustment {
        Adjustment {
            cpus: Some(cpu_set(cpus)),
            mems: Some(node_set(mems)),
            record: Some(record.into()),
            updates: vec![],
        }
    }

    /// Asserts the CPU and memory figures the runtimes' create fixtures carry: 4096 CPU
    /// shares, a quota of 8 CPUs per 100 ms, 1 GiB of memory.
    pub fn assert_fixture_resources(info: &ContainerInfo) {
        assert_eq!(info.cpu_shares, Some(4096));
        assert_eq!(info.cpu_quota, Some(800_000));
        assert_eq!(info.cpu_period, Some(100_000));
        assert_eq!(info.memory_limit, Some(1 << 30));
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #[test]
    fn hugepage_limits_as_the_runtimes_write_them() {
        let h = HugepageLimit::from_runtime;
        let kb = |l: Option<HugepageLimit>| l.map(|l| (l.size_kb, l.pages()));
        assert_eq!(kb(h("2MB", 1 << 30)), Some((2048, 512)));
        assert_eq!(kb(h("1GB", 3 << 30)), Some((1 << 20, 3)));
        assert_eq!(kb(h("64KB", 100 << 10)), Some((64, 2)));
        assert_eq!(kb(h("2MB", (2 << 20) + 1)), Some((2048, 2)));
        for (size, bytes) in [
            ("2MB", 0),
            ("2M", 1),
            ("MB", 1),
            ("0MB", 1),
            ("2XB", 1),
            ("9999999999999TB", 1),
        ] {
            assert_eq!(h(size, bytes), None, "{size} {bytes}");
        }
    }

    use super::test_sets::*;
    use super::*;

    /// Fixture `name`'s topology, with the NVIDIA GPU UUIDs of its proc files (where it has
    /// them), as `Flags::load_topology` reads a host.
    fn fixture(name: &str) -> Arc<Topology> {
        let mut raw = tap_engine::testdata::discover_fixture(name).unwrap();
        let proc = tap_engine::sysfs::DirSource::new(tap_engine::testdata::proc_fixture_dir(name));
        tap_engine::devices::read_nvidia_uuids(&proc, &mut raw.devices);
        Arc::new(Topology::build(&raw).unwrap())
    }

    /// Asserts the series of `metrics` with the error kind `kind` stands at `n`.
    pub(crate) fn assert_error_count(metrics: &Metrics, kind: &str, n: u64) {
        let m = metrics.render();
        let (label, value) = (format!("kind=\"{kind}\""), format!(" {n}"));
        assert!(
            m.lines().any(|l| l.contains(&label) && l.ends_with(&value)),
            "{m}"
        );
    }

    /// A device the kubelet allocated: `example.com/accel` `id` on NUMA node `node`.
    fn accel(id: &str, node: u32) -> KubeletDevice {
        KubeletDevice {
            resource: "example.com/accel".into(),
            id: id.into(),
            numa_nodes: vec![node],
            claim: None,
        }
    }

    pub(crate) fn agent(name: &str) -> Agent {
        let topo = fixture(name);
        Agent::new(
            Engine::new(topo, EngineConfig::default()),
            Arc::new(Metrics::new()),
            None,
            "test",
        )
    }

    /// A container `app` of the Pod `pod-<key>` (QoS class `qos`, as its cgroup parent says it)
    /// asking for `req_cpus` CPUs and limited to `lim_cpus`.
    pub(crate) fn container(key: &str, qos: &str, req_cpus: u64, lim_cpus: u64) -> ContainerInfo {
        ContainerInfo {
            id: key.into(),
            name: "app".into(),
            pod: PodInfo {
                uid: format!("uid-{key}"),
                name: format!("pod-{key}"),
                namespace: "default".into(),
                cgroup_parent: Some(format!("/kubepods/{qos}/pod1")),
                ..Default::default()
            },
            cpu_shares: Some(req_cpus * 1024),
            cpu_quota: Some((lim_cpus * 100_000) as i64),
            cpu_period: Some(100_000),
            ..Default::default()
        }
    }

    pub(crate) fn burstable(id: &str, req_cpus: u64, lim_cpus: u64) -> ContainerInfo {
        container(id, "burstable", req_cpus, lim_cpus)
    }

    #[test]
    fn runtime_lists_are_parsed_at_the_edge_and_bad_ones_are_absent() {
        assert_eq!(runtime_cpus("c", " 0-3,8\n"), Some(cpu_set("0-3,8")));
        assert_eq!(runtime_cpus("c", ""), None);
        assert_eq!(runtime_cpus("c", "3-1"), None);
        assert_eq!(runtime_nodes("c", "0,1"), Some(node_set("0-1")));
        assert_eq!(runtime_nodes("c", "x"), None);
    }

    #[test]
    fn burstable_4_8_gets_one_numa_node() {
        let a = agent("synthetic-2s-4numa-96c-gpu");
        let adj = a.create(&burstable("c1", 4, 8));
        assert_eq!(shown(adj.cpus).as_deref(), Some("0-23"));
        assert!(adj.record.is_some());
    }

    #[test]
    fn bad_annotation_still_places_and_skip_label_is_honoured() {
        let a = agent("synthetic-2s-4numa-96c-gpu");
        let mut c = burstable("c1", 4, 8);
        c.pod
            .annotations
            .insert("tap.kunpeng.huawei.com/level".into(), "nowhere".into());
        assert!(a.create(&c).cpus.is_some());
        let mut c = burstable("c2", 4, 8);
        c.pod
            .labels
            .insert("tap.kunpeng.huawei.com/skip".into(), "true".into());
        assert!(a.create(&c).is_empty());
    }

    #[test]
    fn a_strict_numa_policy_that_cannot_be_met_leaves_the_container_unpinned_and_says_so() {
        let a = agent("synthetic-2s-4numa-96c-gpu");
        let strict = |id: &str, req, lim| {
            let mut c = burstable(id, req, lim);
            c.pod
                .annotations
                .insert("tap.kunpeng.huawei.com/numa-policy".into(), "strict".into());
            c
        };
        assert_eq!(
            shown(a.create(&strict("c1", 4, 8)).cpus).as_deref(),
            Some("0-23")
        );
        let adj = a.create(&strict("c2", 25, 35));
        assert!(adj.is_empty(), "left on all CPUs: {adj:?}");
        assert_error_count(a.metrics(), "strict_numa", 1);
    }

    /// Devices the kubelet allocated (pod-resources) place the container on their NUMA node
    /// and are named in its placement note; a node the topology does not have is no hint.
    #[test]
    fn kubelet_devices_place_the_container_near_them_and_are_named() {
        let a = agent("synthetic-2s-4numa-96c-gpu");
        let mut rx = a.notes().attach().expect("notes");
        let mut c = burstable("c1", 4, 8);
        c.kubelet_devices = vec![accel("accel-3", 3)];
        assert_eq!(shown(a.create(&c).cpus).as_deref(), Some("72-95"));
        let n = rx.try_recv().expect("a note");
        assert!(
            n.message
                .ends_with("fits one numa; devices example.com/accel accel-3 (NUMA 3)"),
            "{n:?}"
        );
        // Node 9 is not on this machine: the container goes where one without devices goes.
        let b = agent("synthetic-2s-4numa-96c-gpu");
        b.create(&c);
        let plain = b.create(&burstable("c2", 4, 8)).cpus;
        let mut c = burstable("c2", 4, 8);
        c.kubelet_devices = vec![accel("accel-9", 9)];
        assert_eq!(a.create(&c).cpus, plain);
        // The ledger keeps the devices with what it keeps of a container.
        assert_eq!(c.placement_inputs().kubelet_devices, c.kubelet_devices);
    }

    /// A device hint the placement cannot honour (the device's NUMA node has no room left for
    /// the container, or is no node of this machine): the container is placed anyway, with a
    /// `TopologyDeviceHintNotHonoured` Warning naming the device and why, and
    /// `tap_errors_total{kind="device_hint"}`. A hint honoured gets no Warning.
    #[test]
    fn a_device_hint_that_cannot_be_honoured_places_the_container_and_says_so() {
        let a = agent("synthetic-2s-4numa-96c-gpu");
        let mut rx = a.notes().attach().expect("notes");
        let mut notes = move || {
            std::iter::from_fn(|| rx.try_recv().ok())
                .map(|n| (n.reason(), n.message))
                .collect::<Vec<_>>()
        };
        let mut big = burstable("big", 20, 24);
        big.kubelet_devices = vec![accel("accel-0", 3)];
        assert_eq!(shown(a.create(&big).cpus).as_deref(), Some("72-95"));
        let got = notes();
        assert_eq!(got.len(), 1, "honoured: no Warning: {got:?}");
        // Each hint not honoured: a placement note and a Warning naming the device and why.
        let mut not_honoured = |device: &str, why: &str| {
            let got = notes();
            assert_eq!(got.len(), 2, "{got:?}");
            assert_eq!(got[1].0, "TopologyDeviceHintNotHonoured");
            assert!(
                got[1].1.contains(device) && got[1].1.contains(why),
                "{got:?}"
            );
        };
        // Node 3 has 4 CPUs of request left: an 8-CPU container goes elsewhere.
        let mut c = burstable("c", 8, 8);
        c.kubelet_devices = vec![accel("accel-1", 3)];
        let adj = a.create(&c);
        assert!(
            adj.cpus.is_some_and(|s| !s.intersects(&cpu_set("72-95"))),
            "{adj:?}"
        );
        not_honoured(
            "example.com/accel accel-1 (NUMA 3)",
            "could not hold the container",
        );
        // A node the machine does not have.
        let mut d = burstable("d", 1, 2);
        d.kubelet_devices = vec![accel("accel-9", 9)];
        assert!(a.create(&d).cpus.is_some());
        not_honoured(
            "example.com/accel accel-9 (NUMA 9)",
            "not a NUMA node of this machine",
        );
        assert_error_count(a.metrics(), "device_hint", 2);
    }

    /// `numa-policy: exclusive` with no free node: left on all CPUs, a `TopologyNotPlaced` note
    /// and `tap_errors_total{kind="exclusive_numa"}`; with a free node, the whole node.
    #[test]
    fn an_exclusive_numa_policy_gets_a_whole_node_or_is_left_unpinned() {
        let a = agent("synthetic-2s-4numa-96c-gpu");
        let mut rx = a.notes().attach().expect("notes");
        let excl = |id: &str| {
            let mut c = burstable(id, 2, 4);
            c.pod.annotations.insert(
                "tap.kunpeng.huawei.com/numa-policy".into(),
                "exclusive".into(),
            );
            c
        };
        assert_eq!(shown(a.create(&excl("x0")).cpus).as_deref(), Some("0-23"));
        for i in 1..3 {
            assert!(a.create(&excl(&format!("x{i}"))).cpus.is_some());
        }
        let _ = std::iter::from_fn(|| rx.try_recv().ok()).count();
        // The fourth node is free, but the machine keeps shared CPUs.
        assert!(a.create(&excl("x3")).is_empty(), "no node left");
        let n = rx.try_recv().expect("a note");
        assert_eq!(n.reason(), "TopologyNotPlaced");
        assert!(n.message.contains("numa-policy exclusive"), "{n:?}");
        assert_error_count(a.metrics(), "exclusive_numa", 1);
    }

    /// A control that cannot be honoured (3 exclusive CPUs in whole 2-thread cores): the
    /// container is placed on shared CPUs, with a `TopologyNotHonoured` note and a metric.
    #[test]
    fn an_unhonoured_control_places_the_container_and_says_so() {
        let a = agent("synthetic-2s-2numa-smt-96t");
        let mut rx = a.notes().attach().expect("notes");
        let mut c = burstable("g3", 3, 3);
        c.pod.cgroup_parent = Some("/kubepods/pod1".into());
        let adj = a.create(&c);
        assert!(adj.cpus.is_some_and(|s| s.len() > 3), "shared: {adj:?}");
        let kinds: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|n| (n.reason(), n.message))
            .collect();
        assert_eq!(kinds.len(), 2, "{kinds:?}");
        assert_eq!(kinds[1].0, "TopologyNotHonoured");
        assert!(kinds[1].1.contains("whole free cores"), "{kinds:?}");
        assert_error_count(a.metrics(), "whole_cores", 1);
    }

    #[test]
    fn gpu_request_prefers_the_gpu_node() {
        let a = agent("synthetic-2s-4numa-96c-gpu");
        // The fixture's GPU is on NUMA node 1 (CPUs 24-47).
        assert_eq!(
            placed_with_env(&a, "VA_VISIBLE_DEVICES=/dev/vacc0").as_deref(),
            Some("24-47")
        );
    }

    /// The GPU server fixture: an ASPEED BMC VGA at 0000:02:00.0 (node 0), NVIDIA GPUs
    /// 0000:18, 2a, 3a, 5d on node 0 and 9a, ab, ba, db on node 1; the driver's proc file gives
    /// the UUID of 0000:ab:00.0 (NVIDIA index 5) only.
    const GPU_SERVER: &str = "synthetic-2s-2numa-32t-8gpu-bmc";
    const GPU5_UUID: &str = "GPU-7f3a9c2e-4b1d-4e8a-9c6f-2d5b8e000001";

    fn env(entry: &str) -> Vec<String> {
        vec![entry.to_string()]
    }

    /// Asserts the device of index `i` in `variable` (`NVIDIA_VISIBLE_DEVICES`, ...) is on NUMA
    /// node `nodes[i]`, for each `i`.
    fn assert_indexes_on_nodes(a: &Agent, variable: &str, nodes: &[u32]) {
        for (i, node) in nodes.iter().enumerate() {
            let entry = format!("{variable}={i}");
            assert_eq!(a.device_nodes(&env(&entry), &[]), [*node], "{entry}");
        }
    }

    /// Asserts none of the environment `entries` names a device (so gives no NUMA hint).
    fn assert_no_device_nodes(a: &Agent, entries: &[&str]) {
        for entry in entries {
            let got = a.device_nodes(&env(entry), &[]);
            assert!(got.is_empty(), "{entry}: {got:?}");
        }
    }

    /// Where a burstable 4/8 container whose environment names devices by `entry` is placed.
    fn placed_with_env(a: &Agent, entry: &str) -> Option<String> {
        let mut c = burstable("c1", 4, 8);
        c.env.push(entry.into());
        shown(a.create(&c).cpus)
    }

    #[test]
    fn nvidia_indexes_and_uuids_name_nvidia_gpus_not_the_bmc_vga() {
        let a = agent(GPU_SERVER);
        assert_indexes_on_nodes(&a, "NVIDIA_VISIBLE_DEVICES", &[0, 0, 0, 0, 1, 1, 1, 1]);
        let uuid = format!("NVIDIA_VISIBLE_DEVICES={GPU5_UUID}");
        assert_eq!(a.device_nodes(&env(&uuid), &[]), vec![1]);
        // A UUID the host does not tell (another GPU's, unread), past the last GPU, all of
        // them: no hint, never a guess.
        assert_no_device_nodes(
            &a,
            &[
                "NVIDIA_VISIBLE_DEVICES=GPU-7f3a9c2e-4b1d-4e8a-9c6f-2d5b8e000002",
                "NVIDIA_VISIBLE_DEVICES=MIG-7f3a9c2e-4b1d-4e8a-9c6f-2d5b8e000003",
                "NVIDIA_VISIBLE_DEVICES=8",
                "NVIDIA_VISIBLE_DEVICES=all",
                "NVIDIA_VISIBLE_DEVICES=none",
                "NVIDIA_VISIBLE_DEVICES=void",
                "NVIDIA_VISIBLE_DEVICES=nvidia1",
            ],
        );
        // The container lands on its GPU's node: the first GPU of node 1 is index 4.
        assert_eq!(
            placed_with_env(&a, "NVIDIA_VISIBLE_DEVICES=4").as_deref(),
            Some("8-15,24-31")
        );
    }

    #[test]
    fn ascend_npus_are_found_and_a_bmc_vga_is_no_va_device() {
        // Huawei's BMC VGA (19e5:1711) at 0000:05:00.0 on node 0; Ascend NPUs at 0000:01, 02
        // (node 0), 41, 42 (node 1), 81, 82 (node 2), c1, c2 (node 3).
        let a = agent("synthetic-2s-4numa-32c-8npu-bmc");
        assert_indexes_on_nodes(&a, "ASCEND_VISIBLE_DEVICES", &[0, 0, 1, 1, 2, 2, 3, 3]);
        let got = a.device_nodes(&env("ASCEND_VISIBLE_DEVICES=/dev/davinci3,davinci6-7"), &[]);
        assert_eq!(got, vec![1, 3]);
        assert_no_device_nodes(
            &a,
            &[
                "VA_VISIBLE_DEVICES=0",
                "VA_ALLOCATE_DEVICES=/dev/vacc0",
                "NVIDIA_VISIBLE_DEVICES=0",
            ],
        );
        assert_eq!(
            placed_with_env(&a, "ASCEND_VISIBLE_DEVICES=5").as_deref(),
            Some("16-23")
        );
    }

    #[test]
    fn restore_after_restart_gives_the_same_state() {
        let a = agent("synthetic-2s-4numa-96c-gpu");
        let mut infos = Vec::new();
        for i in 0..6 {
            let mut c = burstable(&format!("c{i}"), 4, 8);
            let adj = a.create(&c);
            c.cpus = adj.cpus;
            c.annotations.insert(GRANT_KEY.into(), adj.record.unwrap());
            infos.push(c);
        }
        let before = a.snapshot();
        let b = agent("synthetic-2s-4numa-96c-gpu");
        // A new agent has published nothing yet: it is not restored until the runtime's list.
        assert!(!b.restored());
        assert!(b.restore(&infos).expect("restored").is_empty());
        assert!(b.restored());
        assert_eq!(b.snapshot(), before);
    }
}
