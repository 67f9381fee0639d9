//! The I/O layer: three kube-runtime Controllers over shared caches; every decision is made by
//! [`crate::resolve`] and [`crate::plan`].
//!
//! - `node`: per Node, apply its NodeTopology spec (server-side apply) when it differs.
//!   Triggered by the Node, its NodeTopology (owned), and every TopologyPolicy change.
//! - `policy`: per TopologyPolicy, write its status from a full pass over all nodes (cached
//!   while neither policies nor node labels changed). Triggered by the policy, and by policy
//!   and node-label changes.
//! - `gc`: per NodeTopology, delete it when its Node is gone (there is no garbage collector
//!   without kube-controller-manager, and with one this is merely early).

use crate::metrics::{Metrics, PolicyLabel};
use crate::plan::{self, EventSpec, FIELD_MANAGER};
use crate::resolve::{FullPass, NodeInput, PolicyInput, Resolver};
use futures::channel::mpsc;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::{Action, Config as CtlConfig, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tap_api::{NodeTopology, TopologyPolicy, API_VERSION};
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kube API: {0}")]
    Kube(#[from] kube::Error),
    #[error("cache writer dropped")]
    Cache,
    #[error("serializing: {0}")]
    Json(#[from] serde_json::Error),
}

type Cached<T> = Mutex<Option<((u64, u64), Arc<T>)>>;

pub struct Ctx {
    pub client: Client,
    pub nodes: Store<Node>,
    pub policies: Store<TopologyPolicy>,
    pub node_topologies: Store<NodeTopology>,
    pub metrics: Arc<Metrics>,
    recorder: Recorder,
    /// Bumped after each change the resolver depends on (policy specs; node set or labels).
    policy_version: AtomicU64,
    node_version: AtomicU64,
    resolver: Cached<Resolver>,
    full: Cached<(Resolver, FullPass)>,
}

pub fn policy_input(p: &TopologyPolicy) -> PolicyInput {
    PolicyInput {
        name: p.name_any(),
        uid: p.metadata.uid.clone(),
        generation: p.metadata.generation.unwrap_or(0),
        created: p
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.as_second()),
        spec: p.spec.clone(),
    }
}

pub fn node_input(n: &Node) -> NodeInput {
    NodeInput {
        name: n.name_any(),
        uid: n.metadata.uid.clone().unwrap_or_default(),
        labels: n.metadata.labels.clone().unwrap_or_default(),
    }
}

impl Ctx {
    fn versions(&self) -> (u64, u64) {
        (
            self.policy_version.load(Ordering::SeqCst),
            self.node_version.load(Ordering::SeqCst),
        )
    }

    fn resolver(&self) -> Arc<Resolver> {
        let key = (self.versions().0, 0);
        let mut c = self.resolver.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((k, r)) = c.as_ref() {
            if *k == key {
                return r.clone();
            }
        }
        let r = Arc::new(Resolver::new(
            self.policies
                .state()
                .iter()
                .map(|p| policy_input(p))
                .collect(),
        ));
        *c = Some((key, r.clone()));
        r
    }

    fn full_pass(&self) -> Arc<(Resolver, FullPass)> {
        let key = self.versions();
        let mut c = self.full.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((k, r)) = c.as_ref() {
            if *k == key {
                return r.clone();
            }
        }
        let resolver = Resolver::new(
            self.policies
                .state()
                .iter()
                .map(|p| policy_input(p))
                .collect(),
        );
        let nodes: Vec<NodeInput> = self.nodes.state().iter().map(|n| node_input(n)).collect();
        let fp = resolver.full_pass(&nodes);
        let r = Arc::new((resolver, fp));
        *c = Some((key, r.clone()));
        r
    }

    async fn publish<K: Resource<DynamicType = ()>>(&self, obj: &K, ev: EventSpec) {
        let event = Event {
            type_: if ev.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: ev.reason.to_string(),
            note: Some(ev.note),
            action: ev.action.to_string(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &obj.object_ref(&())).await {
            tracing::warn!("publishing event {}: {e}", ev.reason);
        }
    }
}

async fn reconcile_node(node: Arc<Node>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let start = Instant::now();
    let r = reconcile_node_inner(&node, &ctx).await;
    ctx.metrics.observe("node", start.elapsed(), r.is_ok());
    r
}

async fn reconcile_node_inner(node: &Node, ctx: &Ctx) -> Result<Action, Error> {
    ctx.policies
        .wait_until_ready()
        .await
        .map_err(|_| Error::Cache)?;
    ctx.node_topologies
        .wait_until_ready()
        .await
        .map_err(|_| Error::Cache)?;
    if node.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let input = node_input(node);
    let resolver = ctx.resolver();
    let desired =
        plan::desired_node_topology(&input.name, &input.uid, resolver.winner(&input.labels));
    let existing = ctx.node_topologies.get(&ObjectRef::new(&input.name));
    if plan::needs_apply(existing.as_deref(), &desired) {
        let api: Api<NodeTopology> = Api::all(ctx.client.clone());
        let applied = api
            .patch(
                &input.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&desired),
            )
            .await?;
        ctx.metrics.wrote("node");
        tracing::info!(
            node = %input.name,
            policy = desired.spec.source.as_ref().map(|s| s.name.as_str()).unwrap_or("-"),
            "NodeTopology applied"
        );
        if let Some(ev) = plan::assignment_event(existing.as_deref(), &desired) {
            ctx.publish(&applied, ev).await;
        }
    }
    // A slow periodic resync on top of the watches.
    Ok(Action::requeue(Duration::from_secs(600)))
}

async fn reconcile_policy(p: Arc<TopologyPolicy>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let start = Instant::now();
    let r = reconcile_policy_inner(&p, &ctx).await;
    ctx.metrics.observe("policy", start.elapsed(), r.is_ok());
    r
}

async fn reconcile_policy_inner(p: &TopologyPolicy, ctx: &Ctx) -> Result<Action, Error> {
    ctx.nodes
        .wait_until_ready()
        .await
        .map_err(|_| Error::Cache)?;
    ctx.policies
        .wait_until_ready()
        .await
        .map_err(|_| Error::Cache)?;
    let full = ctx.full_pass();
    let (resolver, fp) = (&full.0, &full.1);
    // Gauges for every policy (so deleted ones disappear).
    ctx.metrics.policy_nodes.clear();
    for (rank, pi) in resolver.policies.iter().enumerate() {
        ctx.metrics
            .policy_nodes
            .get_or_create(&PolicyLabel {
                policy: pi.name.clone(),
            })
            .set(i64::from(fp.stats[rank].matched));
    }
    let name = p.name_any();
    let Some(rank) = resolver.rank_of(&name) else {
        // Not in the cache yet; its own watch event will bring it back.
        return Ok(Action::requeue(Duration::from_secs(1)));
    };
    // The status is computed from the cached (and therefore current) object.
    let current = ctx
        .policies
        .get(&ObjectRef::new(&name))
        .unwrap_or_else(|| Arc::new(p.clone()));
    let old = current.status.as_ref();
    let st = plan::policy_status(
        &resolver.policies[rank],
        &fp.stats[rank],
        resolver.invalid[rank].as_deref(),
        old,
        &Time(jiff::Timestamp::now()),
    );
    if plan::status_differs(old, &st) {
        let api: Api<TopologyPolicy> = Api::all(ctx.client.clone());
        let body = serde_json::json!({
            "apiVersion": API_VERSION,
            "kind": "TopologyPolicy",
            "status": st,
        });
        api.patch_status(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?;
        ctx.metrics.wrote("policy");
        if let Some(ev) = plan::conflict_event(old, &st) {
            ctx.publish(current.as_ref(), ev).await;
        }
    }
    Ok(Action::await_change())
}

async fn reconcile_gc(nt: Arc<NodeTopology>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let start = Instant::now();
    let r = reconcile_gc_inner(&nt, &ctx).await;
    ctx.metrics.observe("gc", start.elapsed(), r.is_ok());
    r
}

async fn reconcile_gc_inner(nt: &NodeTopology, ctx: &Ctx) -> Result<Action, Error> {
    ctx.nodes
        .wait_until_ready()
        .await
        .map_err(|_| Error::Cache)?;
    let name = nt.name_any();
    let nodes: HashMap<String, String> = ctx
        .nodes
        .get(&ObjectRef::new(&name))
        .map(|n| (n.name_any(), n.metadata.uid.clone().unwrap_or_default()))
        .into_iter()
        .collect();
    for (orphan, uid) in plan::orphans(std::iter::once(nt), &nodes) {
        let api: Api<NodeTopology> = Api::all(ctx.client.clone());
        let dp = DeleteParams {
            preconditions: uid.map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&orphan, &dp).await {
            Ok(_) => {
                ctx.metrics.wrote("gc");
                tracing::info!(node = %orphan, "Node is gone: NodeTopology deleted");
            }
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Action::await_change())
}

fn error_policy<K>(_: Arc<K>, e: &Error, _: Arc<Ctx>) -> Action {
    tracing::warn!("reconcile failed: {e}");
    Action::requeue(Duration::from_secs(2))
}

fn labels_fingerprint(labels: &BTreeMap<String, String>) -> u64 {
    let mut h = DefaultHasher::new();
    labels.hash(&mut h);
    h.finish()
}

/// Runs the controllers until `shutdown`; the stores are fed by reflectors owned here, and
/// their changes trigger the reconcile-all paths.
pub async fn run(
    client: Client,
    metrics: Arc<Metrics>,
    identity: &str,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let nodes_api: Api<Node> = Api::all(client.clone());
    let policies_api: Api<TopologyPolicy> = Api::all(client.clone());
    let nt_api: Api<NodeTopology> = Api::all(client.clone());
    let wc = watcher::Config::default();

    let (nodes, nodes_writer) = reflector::store::<Node>();
    let (policies, policies_writer) = reflector::store::<TopologyPolicy>();

    let gc_controller = Controller::new(nt_api.clone(), wc.clone())
        .with_config(CtlConfig::default().debounce(Duration::from_millis(200)));
    let node_topologies = gc_controller.store();

    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some(identity.to_string()),
        },
    );
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        nodes: nodes.clone(),
        policies: policies.clone(),
        node_topologies,
        metrics: metrics.clone(),
        recorder,
        policy_version: AtomicU64::new(0),
        node_version: AtomicU64::new(0),
        resolver: Mutex::new(None),
        full: Mutex::new(None),
    });

    // Policy changes (spec or membership) -> all nodes and all policies.
    let (pol_to_nodes, pol_nodes_rx) = mpsc::unbounded::<()>();
    let (pol_to_pols, pol_pols_rx) = mpsc::unbounded::<()>();
    // Node label or membership changes -> all policies and the GC.
    let (node_to_pols, node_pols_rx) = mpsc::unbounded::<()>();
    let (node_to_gc, node_gc_rx) = mpsc::unbounded::<()>();

    let policy_feed = {
        let ctx = ctx.clone();
        let stream = reflector::reflector(
            policies_writer,
            watcher(policies_api.clone(), wc.clone()).default_backoff(),
        );
        async move {
            let mut seen: HashMap<String, (i64, Option<String>)> = HashMap::new();
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                let changed = match ev {
                    Ok(watcher::Event::Apply(p)) | Ok(watcher::Event::InitApply(p)) => {
                        let v = (p.metadata.generation.unwrap_or(0), p.metadata.uid.clone());
                        seen.insert(p.name_any(), v.clone()) != Some(v)
                    }
                    Ok(watcher::Event::Delete(p)) => seen.remove(&p.name_any()).is_some(),
                    Ok(watcher::Event::InitDone) => true,
                    Ok(watcher::Event::Init) => false,
                    Err(e) => {
                        tracing::warn!("TopologyPolicy watch: {e}");
                        false
                    }
                };
                if changed {
                    ctx.policy_version.fetch_add(1, Ordering::SeqCst);
                    let _ = pol_to_nodes.unbounded_send(());
                    let _ = pol_to_pols.unbounded_send(());
                }
            }
        }
    };
    let node_feed = {
        let ctx = ctx.clone();
        let stream = reflector::reflector(
            nodes_writer,
            watcher(nodes_api.clone(), wc.clone()).default_backoff(),
        );
        async move {
            let mut seen: HashMap<String, (u64, Option<String>)> = HashMap::new();
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                let changed = match ev {
                    Ok(watcher::Event::Apply(n)) | Ok(watcher::Event::InitApply(n)) => {
                        let v = (
                            labels_fingerprint(
                                n.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()),
                            ),
                            n.metadata.uid.clone(),
                        );
                        seen.insert(n.name_any(), v.clone()) != Some(v)
                    }
                    Ok(watcher::Event::Delete(n)) => seen.remove(&n.name_any()).is_some(),
                    Ok(watcher::Event::InitDone) => true,
                    Ok(watcher::Event::Init) => false,
                    Err(e) => {
                        tracing::warn!("Node watch: {e}");
                        false
                    }
                };
                if changed {
                    ctx.node_version.fetch_add(1, Ordering::SeqCst);
                    let _ = node_to_pols.unbounded_send(());
                    let _ = node_to_gc.unbounded_send(());
                }
            }
        }
    };

    let node_controller = Controller::new(nodes_api.clone(), wc.clone())
        .owns(nt_api.clone(), wc.clone())
        .reconcile_all_on(pol_nodes_rx)
        .with_config(CtlConfig::default().debounce(Duration::from_millis(200)))
        .graceful_shutdown_on({
            let s = shutdown.clone();
            async move { s.cancelled().await }
        })
        .run(reconcile_node, error_policy, ctx.clone())
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!("node controller: {e}");
            }
        });

    let policy_controller = Controller::new(policies_api.clone(), wc.clone())
        .reconcile_all_on(futures::stream::select(pol_pols_rx, node_pols_rx))
        .with_config(CtlConfig::default().debounce(Duration::from_millis(300)))
        .graceful_shutdown_on({
            let s = shutdown.clone();
            async move { s.cancelled().await }
        })
        .run(reconcile_policy, error_policy, ctx.clone())
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!("policy controller: {e}");
            }
        });

    let gc = gc_controller
        .reconcile_all_on(node_gc_rx)
        .graceful_shutdown_on({
            let s = shutdown.clone();
            async move { s.cancelled().await }
        })
        .run(reconcile_gc, error_policy, ctx.clone())
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!("gc controller: {e}");
            }
        });

    let ready = {
        let ctx = ctx.clone();
        async move {
            let _ = ctx.nodes.wait_until_ready().await;
            let _ = ctx.policies.wait_until_ready().await;
            let _ = ctx.node_topologies.wait_until_ready().await;
            ctx.metrics.ready.store(true, Ordering::Relaxed);
            tracing::info!("caches synced");
        }
    };

    tokio::select! {
        _ = async { tokio::join!(node_controller, policy_controller, gc, ready) } => {}
        _ = policy_feed => {}
        _ = node_feed => {}
        _ = shutdown.cancelled() => {}
    }
    Ok(())
}
