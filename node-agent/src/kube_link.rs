//! The agent's link to the API server (`--enable-node-topology`), in every runtime mode:
//!
//! - watches its own NodeTopology (name = `--node-name` / `NODE_NAME`, else the hostname) and
//!   applies the spec's policy to containers created from then on ([`Agent::set_config`]);
//!   without a policy in the spec (or without the object) the flags' configuration applies;
//! - caches the last policy in `--state-dir` so a restart applies it before (or without) the
//!   API server;
//! - writes the NodeTopology status (discovered topology, per-zone usage, containers, agent
//!   mode and version, conditions) on change, at most once per [`STATUS_MIN_INTERVAL`], and
//!   at most once per [`USAGE_MIN_INTERVAL`] when only the usage changed.
//!
//! - with `--pod-events` (default on) records an Event on the Pod for each placement
//!   ([`events`]);
//! - with `--node-resource-topology` (default `auto`: when the API server serves the CRD)
//!   publishes the node's NodeResourceTopology for the scheduler ([`nrt`]), with the same
//!   rate limit.
//!
//! Nothing here can stop a container from starting: API errors are logged and retried.
//! Decisions are pure functions in [`policy`] and [`status`]; this file is the I/O.

pub mod dra_slices;
pub mod events;
pub mod fingerprint;
pub mod hugepages;
pub mod node_pods;
pub mod node_watch;
pub mod nrt;
pub mod numaplacement;
pub mod pace;
pub mod placement;
pub mod policy;
pub mod status;

use crate::agent::Agent;
use crate::flags::{Flags, NrtMode};
use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::{watcher, WatchStreamExt};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tap_api::NodeTopology;
use tap_engine::{CpuSet, EngineConfig};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use policy::{CachedPolicy, ConfigSource};

/// The shortest time between two status writes.
pub const STATUS_MIN_INTERVAL: Duration = Duration::from_secs(5);
/// The shortest time between two status writes when only the usage changed (zones' allocation,
/// container count): under container churn a node writes at most once per this interval, so N
/// nodes send at most N / 15 writes per second (docs/design/scale.md).
pub const USAGE_MIN_INTERVAL: Duration = Duration::from_secs(15);
/// How long the NodeResourceTopology loop waits after building an object that had not changed.
const NRT_BUILD_EVERY: Duration = Duration::from_secs(5);
/// The field manager of the agent's status writes.
pub const FIELD_MANAGER: &str = "kunpeng-tap-agent";
/// File in `--state-dir` holding the last policy.
pub const CACHE_FILE: &str = "node-topology-policy.json";

/// This node's name: `--node-name` / `NODE_NAME`, else the hostname.
pub fn node_name(flags: &Flags) -> String {
    flags
        .node_name
        .clone()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "localhost".into())
        })
}

/// What the link knows, shared between the watch and the status writer.
struct State {
    source: ConfigSource,
    generation: Option<i64>,
    /// Why the spec's policy was not applied, if it was not.
    invalid: Option<String>,
}

struct Link {
    agent: Arc<Agent>,
    base: EngineConfig,
    /// The kubelet's reservedSystemCPUs: reserved under any policy.
    kubelet_reserved: CpuSet,
    node: String,
    cache_path: PathBuf,
    state: Mutex<State>,
    changed: Notify,
    pod_events: bool,
    nrt: NrtMode,
    nrt_advertised: nrt::Advertised,
}

impl Link {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies a NodeTopology (or its absence) to the agent and the cache.
    fn apply(&self, nt: Option<&NodeTopology>) {
        let settings = nt.and_then(|n| n.spec.policy.as_ref());
        let generation = nt.and_then(|n| n.metadata.generation);
        match policy::engine_config(&self.base, &self.kubelet_reserved, settings) {
            Ok(cfg) => {
                self.agent.set_config(cfg);
                let mut st = self.state();
                st.source = if settings.is_some() {
                    ConfigSource::NodeTopology
                } else {
                    ConfigSource::Flags
                };
                st.generation = generation;
                st.invalid = None;
                drop(st);
                let cached = CachedPolicy {
                    node: self.node.clone(),
                    generation,
                    source: nt.and_then(|n| n.spec.source.clone()),
                    policy: settings.cloned(),
                };
                if let Err(e) = policy::store_cache(&self.cache_path, &cached) {
                    tracing::warn!(path = %self.cache_path.display(), "caching the policy: {e}");
                }
            }
            Err(why) => {
                tracing::warn!(node = %self.node, "NodeTopology policy not applied: {why}");
                let mut st = self.state();
                st.invalid = Some(why);
                st.generation = generation;
            }
        }
        self.changed.notify_one();
    }
}

/// A client for the API server from the usual places (in-cluster service account, else
/// `KUBECONFIG` / `~/.kube/config`).
pub async fn connect() -> Result<kube::Client, kube::Error> {
    let config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    kube::Client::try_from(config)
}

/// What one link needs besides the agent and a client.
#[derive(Debug, Clone)]
pub struct LinkOptions {
    /// The NodeTopology (node) name.
    pub node: String,
    /// The flags' engine configuration (in force when no policy is assigned).
    pub base: EngineConfig,
    /// The kubelet's reservedSystemCPUs (`--kubelet-config`): reserved under any policy.
    pub kubelet_reserved: CpuSet,
    /// The policy cache file.
    pub cache_path: PathBuf,
    /// Record placement Events on Pods (`--pod-events`).
    pub pod_events: bool,
    /// Publish the NodeResourceTopology (`--node-resource-topology`).
    pub nrt: NrtMode,
    /// What the NodeResourceTopology advertises.
    pub nrt_advertised: nrt::Advertised,
}

impl LinkOptions {
    pub fn from_flags(flags: &Flags) -> LinkOptions {
        LinkOptions {
            node: node_name(flags),
            base: flags.engine_config(),
            kubelet_reserved: flags.kubelet_reserved(),
            cache_path: flags.state_dir.join(CACHE_FILE),
            pod_events: flags.pod_events,
            nrt: flags.node_resource_topology,
            nrt_advertised: nrt::Advertised {
                policy: flags.nrt_topology_manager_policy.clone(),
                sysfs_root: flags.sysfs_root.clone(),
                method: flags.nrt_fingerprint_method,
                informer: flags.nrt_scheduler_informer,
                fingerprint: nrt::Fingerprint::Published,
            },
        }
    }
}

impl Link {
    /// A link with the cached policy applied, so placement follows the cluster's choice even
    /// before (or without) the API server.
    fn new(opts: LinkOptions, agent: Arc<Agent>) -> Link {
        let LinkOptions {
            node,
            base,
            kubelet_reserved,
            cache_path,
            pod_events,
            nrt,
            nrt_advertised,
        } = opts;
        let link = Link {
            pod_events,
            nrt,
            nrt_advertised,
            agent: agent.clone(),
            base: base.clone(),
            kubelet_reserved,
            node: node.clone(),
            cache_path: cache_path.clone(),
            state: Mutex::new(State {
                source: ConfigSource::Flags,
                generation: None,
                invalid: None,
            }),
            changed: Notify::new(),
        };
        match policy::load_cache(&cache_path) {
            Ok(Some(c)) if c.node == node => {
                match policy::engine_config(&base, &kubelet_reserved, c.policy.as_ref()) {
                    Ok(cfg) => {
                        tracing::info!(path = %cache_path.display(), policy = %cfg.policy, "policy from the cache");
                        agent.set_config(cfg);
                        let mut st = link.state();
                        st.source = if c.policy.is_some() {
                            ConfigSource::Cache
                        } else {
                            ConfigSource::Flags
                        };
                        st.generation = c.generation;
                    }
                    Err(e) => tracing::warn!("cached policy ignored: {e}"),
                }
            }
            Ok(Some(c)) => {
                tracing::info!(cached = %c.node, node = %node, "cached policy is for another node; ignored")
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(path = %cache_path.display(), "cached policy unreadable: {e}")
            }
        }
        link
    }
}

/// Runs until `shutdown` is cancelled.
pub async fn run(
    opts: LinkOptions,
    agent: Arc<Agent>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let link = Arc::new(Link::new(opts, agent));
    // Connect (retrying: the agent works without the API server meanwhile).
    let client = loop {
        match connect().await {
            Ok(c) => break c,
            Err(e) => {
                tracing::warn!("no API server configuration yet: {e}; retrying in 10s");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(10)) => {}
                    _ = shutdown.cancelled() => return Ok(()),
                }
            }
        }
    };
    serve(link, client, shutdown).await;
    Ok(())
}

/// Runs the link of `opts.node` over `client` until `shutdown` is cancelled. Several links can
/// share one client: this is how one process simulates many agents (`tap-kube-scale`).
pub async fn run_with_client(
    opts: LinkOptions,
    agent: Arc<Agent>,
    client: kube::Client,
    shutdown: CancellationToken,
) {
    serve(Arc::new(Link::new(opts, agent)), client, shutdown).await
}

async fn serve(link: Arc<Link>, client: kube::Client, shutdown: CancellationToken) {
    let node = link.node.clone();
    tracing::info!(node = %node, "NodeTopology link started");
    let api: Api<NodeTopology> = Api::all(client.clone());
    let event_writer = {
        let rx = if link.pod_events {
            link.agent.notes().attach()
        } else {
            None
        };
        let (client, node, agent) = (client.clone(), node.clone(), link.agent.clone());
        async move {
            match rx {
                Some(rx) => events::publish(client, &node, rx, agent.metrics().clone()).await,
                None => std::future::pending().await,
            }
        }
    };
    let nrt_writer = write_nrt(
        link.clone(),
        client.clone(),
        link.nrt,
        link.nrt_advertised.clone(),
    );

    let watch = {
        let (link, api, node) = (link.clone(), api.clone(), node.clone());
        async move {
            let wc = watcher::Config::default().fields(&format!("metadata.name={node}"));
            let mut stream = std::pin::pin!(watcher(api, wc).default_backoff());
            let mut seen_in_init = false;
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(watcher::Event::Init) => seen_in_init = false,
                    Ok(watcher::Event::InitApply(nt)) => {
                        seen_in_init = true;
                        link.apply(Some(&nt));
                    }
                    Ok(watcher::Event::InitDone) => {
                        if !seen_in_init {
                            // The API server says there is none: the flags apply.
                            link.apply(None);
                        }
                    }
                    Ok(watcher::Event::Apply(nt)) => link.apply(Some(&nt)),
                    Ok(watcher::Event::Delete(_)) => link.apply(None),
                    Err(e) => tracing::warn!(node = %link.node, "NodeTopology watch: {e}"),
                }
            }
        }
    };

    let writer = {
        let (link, api) = (link.clone(), api.clone());
        async move {
            let mut limiter = status::RateLimiter::new(STATUS_MIN_INTERVAL, USAGE_MIN_INTERVAL);
            let mut previous: Option<tap_api::NodeTopologyStatus> = None;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = link.changed.notified() => {}
                }
                if !link.agent.restored() {
                    // The previous agent's status stays until this one knows the containers.
                    continue;
                }
                let facts = {
                    let st = link.state();
                    status::Facts {
                        source: st.source,
                        generation: st.generation,
                        invalid: st.invalid.clone(),
                        mode: link.agent.mode().to_string(),
                        version: env!("CARGO_PKG_VERSION").to_string(),
                    }
                };
                let now =
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now());
                let st = link
                    .agent
                    .inspect(|e| status::node_status(e, &facts, previous.as_ref(), &now));
                if !limiter.should_send(Instant::now(), &st) {
                    continue;
                }
                let body = serde_json::json!({
                    "apiVersion": tap_api::API_VERSION,
                    "kind": "NodeTopology",
                    "status": st,
                });
                match api
                    .patch_status(
                        &link.node,
                        &PatchParams::apply(FIELD_MANAGER).force(),
                        &Patch::Apply(&body),
                    )
                    .await
                {
                    Ok(_) => {
                        if previous.is_none() {
                            tracing::info!(
                                node = %link.node,
                                containers = st.containers,
                                allocated = st.allocated.as_deref().unwrap_or(""),
                                "NodeTopology status published"
                            );
                        } else {
                            tracing::debug!(node = %link.node, "NodeTopology status written");
                        }
                        limiter.sent(Instant::now(), &st);
                        previous = Some(st);
                    }
                    Err(kube::Error::Api(e)) if e.code == 404 => {
                        // The operator has not created it yet; try again later.
                        limiter.failed(Instant::now());
                    }
                    Err(e) => {
                        tracing::warn!(node = %link.node, "writing NodeTopology status: {e}");
                        limiter.failed(Instant::now());
                    }
                }
            }
        }
    };

    let dra_watch = dra_slices::watch(
        client.clone(),
        node.clone(),
        link.agent.dra_topology().clone(),
    );

    tokio::select! {
        _ = watch => {}
        _ = dra_watch => {}
        _ = writer => {}
        _ = nrt_writer => {}
        _ = event_writer => {}
        _ = shutdown.cancelled() => {}
    }
}

/// How often `auto` looks again for the NodeResourceTopology CRD while it is not served.
const NRT_CHECK_EVERY: Duration = Duration::from_secs(60);

/// Whether the API server serves NodeResourceTopology in the version written.
/// How soon the agent asks again when the API server could not say whether it serves
/// NodeResourceTopology (unreachable, overloaded).
const NRT_RETRY_AFTER: Duration = Duration::from_secs(5);

/// Whether the API server serves NodeResourceTopology: `Some(false)` when the group version is
/// not there, `None` when the question got no answer.
async fn nrt_served(client: &kube::Client) -> Option<bool> {
    match client
        .list_api_group_resources(&format!("{}/{}", nrt::GROUP, nrt::VERSION))
        .await
    {
        Ok(list) => Some(list.resources.iter().any(|r| r.name == nrt::PLURAL)),
        Err(kube::Error::Api(e)) if e.code == 404 => Some(false),
        Err(e) => {
            tracing::debug!("asking for the NodeResourceTopology API: {e}");
            None
        }
    }
}

/// How often the NodeResourceTopology's device counts are asked of the kubelet.
const DEVICE_ZONES_EVERY: Duration = Duration::from_secs(10);

/// The device-plugin resources per NUMA node, asked of the kubelet at most every
/// [`DEVICE_ZONES_EVERY`]; the last answer stays while the kubelet does not give one.
#[derive(Default)]
struct DeviceZones {
    asked: Option<Instant>,
    last: Vec<crate::pod_resources::ZoneDevices>,
    warned: bool,
}

impl DeviceZones {
    async fn current(&mut self, agent: &Agent) -> Vec<crate::pod_resources::ZoneDevices> {
        let Some(source) = agent.device_source() else {
            return Vec::new();
        };
        if self.asked.is_some_and(|t| t.elapsed() < DEVICE_ZONES_EVERY) {
            return self.last.clone();
        }
        self.asked = Some(Instant::now());
        match tokio::time::timeout(Duration::from_secs(2), source.zone_devices()).await {
            Ok(Ok(z)) => {
                self.last = z;
                self.warned = false;
            }
            Ok(Err(e)) if !e.is_failure() => {}
            Ok(Err(e)) if !self.warned => {
                tracing::warn!("NodeResourceTopology device counts: {e}");
                self.warned = true;
            }
            Err(_) if !self.warned => {
                tracing::warn!(
                    "NodeResourceTopology device counts: the kubelet did not answer in 2 s"
                );
                self.warned = true;
            }
            _ => {}
        }
        self.last.clone()
    }
}

/// Publishes the node's NodeResourceTopology (server-side apply, the agent's field manager)
/// while the CRD is served, only when it changed and at most once per [`USAGE_MIN_INTERVAL`]
/// (it is all usage: the same bound as usage-only status changes).
/// Never returns (pending for ever when `mode` is off).
async fn write_nrt(link: Arc<Link>, client: kube::Client, mode: NrtMode, adv: nrt::Advertised) {
    if mode == NrtMode::Off {
        return std::future::pending().await;
    }
    let ar = ApiResource {
        group: nrt::GROUP.into(),
        version: nrt::VERSION.into(),
        api_version: format!("{}/{}", nrt::GROUP, nrt::VERSION),
        kind: nrt::KIND.into(),
        plural: nrt::PLURAL.into(),
    };
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let mut pacer = pace::Pacer::default();
    let mut devices = DeviceZones::default();
    // The node's pods as the scheduler sees them, for the fingerprint: watched only while the
    // object is published.
    let pods = Arc::new(node_pods::NodePods::default());
    let pod_watch = node_pods::watch(client.clone(), link.node.clone(), pods.clone());
    tokio::pin!(pod_watch);
    let mut pod_watch_done = adv.fingerprint == nrt::Fingerprint::Omitted;
    let (mut served, mut next_check, mut warned) = (false, Instant::now(), false);
    let mut next_build = Instant::now();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = &mut pod_watch, if !pod_watch_done => pod_watch_done = true,
        }
        if !served {
            if Instant::now() < next_check {
                continue;
            }
            let answer = nrt_served(&client).await;
            served = answer == Some(true);
            next_check = Instant::now()
                + match answer {
                    None => NRT_RETRY_AFTER,
                    Some(_) => NRT_CHECK_EVERY,
                };
            if !served {
                if answer == Some(false) && !warned {
                    let msg = "the API server does not serve NodeResourceTopology (topology.node.k8s.io/v1alpha2); not published, looking again every minute";
                    if mode == NrtMode::On {
                        tracing::warn!(node = %link.node, "{msg}");
                    } else {
                        tracing::info!(node = %link.node, "{msg}");
                    }
                    warned = true;
                }
                continue;
            }
            tracing::info!(node = %link.node, "publishing NodeResourceTopology");
            pacer.reset();
        }
        // Nothing is built (pods listed, hugepages read) before a write could be sent, nor
        // within NRT_BUILD_EVERY of a build that found nothing changed.
        let now = Instant::now();
        let due = pacer.due(now, USAGE_MIN_INTERVAL) && now >= next_build;
        if !link.agent.restored() || !due {
            continue;
        }
        next_build = now + NRT_BUILD_EVERY;
        let published = adv.fingerprint == nrt::Fingerprint::Published;
        let extras = nrt::Extras {
            pods: published
                .then(|| pods.counted(adv.informer, adv.method))
                .flatten(),
            seen_pods: published.then(|| pods.seen(adv.informer)).flatten(),
            devices: devices.current(&link.agent).await,
            hugepages: hugepages::read(&adv.sysfs_root),
            // Listed before the engine is held (the book's lock is taken alone).
            booked: link.agent.roster(),
        };
        let obj = link
            .agent
            .inspect(|e| nrt::resource_topology(e, &link.node, &adv, &extras));
        let now = Instant::now();
        if !pacer.should_send(now, &obj, USAGE_MIN_INTERVAL) {
            continue;
        }
        match api
            .patch(
                &link.node,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&obj),
            )
            .await
        {
            Ok(_) => {
                tracing::debug!(node = %link.node, "NodeResourceTopology written");
                pacer.sent(now, obj);
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {
                // The CRD went away: look for it again.
                pacer.failed(now);
                served = false;
                warned = false;
            }
            Err(e) => {
                tracing::warn!(node = %link.node, "writing NodeResourceTopology: {e}");
                pacer.failed(now);
            }
        }
    }
}
