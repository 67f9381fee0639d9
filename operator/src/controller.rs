//! The reconcilers of the three kube-runtime Controllers (wired up in [`crate::watches`]);
//! every decision is made by [`crate::resolve`] and [`crate::plan`].
//!
//! - `node`: per Node, apply its NodeTopology spec (server-side apply) when it differs.
//! - `policy`: per TopologyPolicy, write its status from a full pass over all nodes (cached
//!   while neither policies nor node labels changed).
//! - `gc`: per NodeTopology, delete it when its Node is gone (there is no garbage collector
//!   without kube-controller-manager, and with one this is merely early).

use crate::metrics::{Metrics, PolicyLabel};
use crate::plan::{self, EventSpec, FIELD_MANAGER};
use crate::resolve::{FullPass, NodeInput, PolicyInput, Resolver};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tap_api::{NodeTopology, TopologyPolicy, API_VERSION};

pub use crate::watches::run;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kube API: {0}")]
    Kube(#[from] kube::Error),
    #[error("reflector cache unavailable")]
    Cache,
}

impl Error {
    /// A short, stable label for metrics: the variant, and for API errors the kind of refusal.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(s)) => match s.code {
                401 | 403 => "api_forbidden",
                404 => "api_not_found",
                409 => "api_conflict",
                422 => "api_invalid",
                429 => "api_throttled",
                500..=599 => "api_server_error",
                _ => "api_other",
            },
            Error::Kube(_) => "kube_client",
            Error::Cache => "cache",
        }
    }
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
    pub(crate) fn new(
        client: Client,
        stores: (Store<Node>, Store<TopologyPolicy>, Store<NodeTopology>),
        metrics: Arc<Metrics>,
        recorder: Recorder,
    ) -> Ctx {
        let (nodes, policies, node_topologies) = stores;
        Ctx {
            client,
            nodes,
            policies,
            node_topologies,
            metrics,
            recorder,
            policy_version: AtomicU64::new(0),
            node_version: AtomicU64::new(0),
            resolver: Mutex::new(None),
            full: Mutex::new(None),
        }
    }

    /// The set of policies or one's spec changed: cached resolutions are stale.
    pub(crate) fn policies_changed(&self) {
        self.policy_version.fetch_add(1, Ordering::SeqCst);
    }

    /// The set of nodes or one's labels changed: the cached full pass is stale.
    pub(crate) fn nodes_changed(&self) {
        self.node_version.fetch_add(1, Ordering::SeqCst);
    }

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

/// One reconcile of `controller`, its duration and failure observed.
async fn observed(
    ctx: &Ctx,
    controller: &str,
    reconcile: impl std::future::Future<Output = Result<Action, Error>>,
) -> Result<Action, Error> {
    let start = Instant::now();
    let r = reconcile.await;
    ctx.metrics.observe(controller, start.elapsed(), r.is_ok());
    r
}

/// Waits until `store`'s reflector has listed its objects.
async fn synced<K>(store: &Store<K>) -> Result<(), Error>
where
    K: kube::runtime::reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store.wait_until_ready().await.map_err(|_| Error::Cache)
}

#[tracing::instrument(skip_all, fields(name = %node.name_any(), node = %node.name_any()))]
pub(crate) async fn reconcile_node(node: Arc<Node>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    observed(&ctx, "node", reconcile_node_inner(&node, &ctx)).await
}

async fn reconcile_node_inner(node: &Node, ctx: &Ctx) -> Result<Action, Error> {
    synced(&ctx.policies).await?;
    synced(&ctx.node_topologies).await?;
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

#[tracing::instrument(skip_all, fields(name = %p.name_any()))]
pub(crate) async fn reconcile_policy(
    p: Arc<TopologyPolicy>,
    ctx: Arc<Ctx>,
) -> Result<Action, Error> {
    observed(&ctx, "policy", reconcile_policy_inner(&p, &ctx)).await
}

async fn reconcile_policy_inner(p: &TopologyPolicy, ctx: &Ctx) -> Result<Action, Error> {
    synced(&ctx.nodes).await?;
    synced(&ctx.policies).await?;
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

#[tracing::instrument(skip_all, fields(name = %nt.name_any(), node = %nt.spec.node_name))]
pub(crate) async fn reconcile_gc(nt: Arc<NodeTopology>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    observed(&ctx, "gc", reconcile_gc_inner(&nt, &ctx)).await
}

async fn reconcile_gc_inner(nt: &NodeTopology, ctx: &Ctx) -> Result<Action, Error> {
    synced(&ctx.nodes).await?;
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

/// Logs the failed object and counts the failure by kind and reason; retries soon.
pub(crate) fn error_policy<K: Resource<DynamicType = ()>>(
    obj: Arc<K>,
    e: &Error,
    ctx: Arc<Ctx>,
) -> Action {
    let (kind, reason) = (K::kind(&()), e.reason());
    tracing::warn!(%kind, name = %obj.name_any(), reason, "reconcile failed: {e}");
    ctx.metrics.failed(&kind, reason);
    Action::requeue(Duration::from_secs(2))
}

#[cfg(test)]
mod tests {
    use super::Error;
    use kube::core::Status;

    fn api(code: u16) -> Error {
        Error::Kube(kube::Error::Api(
            Status::failure("refused", "Test").with_code(code).boxed(),
        ))
    }

    #[test]
    fn error_reasons_are_short_and_stable() {
        assert_eq!(api(409).reason(), "api_conflict");
        assert_eq!(api(404).reason(), "api_not_found");
        assert_eq!(api(403).reason(), "api_forbidden");
        assert_eq!(api(422).reason(), "api_invalid");
        assert_eq!(api(429).reason(), "api_throttled");
        assert_eq!(api(503).reason(), "api_server_error");
        assert_eq!(api(400).reason(), "api_other");
        assert_eq!(Error::Cache.reason(), "cache");
    }
}
