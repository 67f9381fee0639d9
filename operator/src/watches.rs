//! One watch per kind, shared by its reflector store and every controller that needs it.
//!
//! Each root stream (watch -> reflector -> shared store) is driven here; the controllers get
//! subscriptions to it, filtered by a predicate over the fields they act on. Deletions and
//! re-lists are not dispatched to subscribers, so the root streams turn those into triggers:
//!
//! | change                                  | re-resolves                      |
//! |-----------------------------------------|----------------------------------|
//! | TopologyPolicy generation, set, re-list | every node, every policy status  |
//! | Node labels, set, re-list               | that node, every policy status   |
//! | Node deleted / re-list                  | GC of its / of every NodeTopology |
//! | NodeTopology spec/owner/label, deleted  | its Node                         |
//! | NodeTopology created                    | GC of it                         |

use crate::controller::{error_policy, reconcile_gc, reconcile_node, reconcile_policy, Ctx, Error};
use crate::metrics::Metrics;
use crate::plan::FIELD_MANAGER;
use futures::channel::mpsc;
use futures::{future, Stream, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::controller::{Config as CtlConfig, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, store::Writer, ObjectRef};
use kube::runtime::watcher::Event;
use kube::runtime::{predicates, watcher, Predicate, PredicateConfig, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tap_api::{NodeTopology, TopologyPolicy};
use tokio_util::sync::CancellationToken;

/// Events a subscriber may lag behind its root stream before the root waits for it.
const SUBSCRIBER_BUFFER: usize = 1024;

/// The objects of a shared store that are new, or whose `predicate` hash changed.
fn changed<K, P>(
    writer: &Writer<K>,
    predicate: P,
) -> Result<impl Stream<Item = Arc<K>> + Send + 'static, Error>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    P: Predicate<K> + Send + 'static,
{
    let handle = writer.subscribe().ok_or(Error::Cache)?;
    Ok(handle
        .map(|obj| Ok(K::clone(&obj)))
        .predicate_filter(predicate, PredicateConfig::default())
        .filter_map(|r| future::ready(r.ok().map(Arc::new))))
}

/// What the node controller compares on a NodeTopology (see [`crate::plan::needs_apply`]):
/// its spec (generation), its Node owners, and its labels.
fn node_topology_fields(nt: &NodeTopology) -> Option<u64> {
    let mut h = DefaultHasher::new();
    nt.metadata.generation.hash(&mut h);
    nt.labels().hash(&mut h);
    for o in nt.owner_references() {
        (&o.kind, &o.name, &o.uid).hash(&mut h);
    }
    Some(h.finish())
}

/// Drives a root stream to its store; `on_event` sees each event (for deletions and re-lists).
async fn drive<K>(api: Api<K>, writer: Writer<K>, mut on_event: impl FnMut(&Event<K>))
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
    K: k8s_openapi::serde::de::DeserializeOwned,
{
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect_shared(writer);
    let mut stream = std::pin::pin!(stream);
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(ev) => on_event(&ev),
            Err(e) => tracing::warn!("{} watch: {e}", K::kind(&())),
        }
    }
}

fn shutdown_on(
    token: &CancellationToken,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let token = token.clone();
    async move { token.cancelled().await }
}

/// Logs (at debug level) what a controller's run reports failing.
async fn failure_logged<T, E: std::fmt::Display>(controller: &str, r: Result<T, E>) {
    if let Err(e) = r {
        tracing::debug!("{controller} controller: {e}");
    }
}

/// Runs the controllers until `shutdown`.
pub async fn run(
    client: Client,
    metrics: Arc<Metrics>,
    identity: &str,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let (nodes, nodes_w) = reflector::store_shared::<Node>(SUBSCRIBER_BUFFER);
    let (policies, policies_w) = reflector::store_shared::<TopologyPolicy>(SUBSCRIBER_BUFFER);
    let (nts, nts_w) = reflector::store_shared::<NodeTopology>(SUBSCRIBER_BUFFER);
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some(identity.to_string()),
        },
    );
    let stores = (nodes.clone(), policies.clone(), nts.clone());
    let ctx = Arc::new(Ctx::new(client.clone(), stores, metrics, recorder));

    let (all_nodes_tx, all_nodes) = mpsc::unbounded::<()>();
    let (all_policies_tx, all_policies) = mpsc::unbounded::<()>();
    let (all_gc_tx, all_gc) = mpsc::unbounded::<()>();
    let (gc_tx, gc_one) = mpsc::unbounded::<ObjectRef<NodeTopology>>();
    let (node_tx, node_one) = mpsc::unbounded::<ObjectRef<Node>>();

    // A policy spec or the set of policies changed: every node and every status.
    let policies_changed = {
        let (ctx, nodes_tx, pols_tx) = (ctx.clone(), all_nodes_tx, all_policies_tx.clone());
        move || {
            ctx.policies_changed();
            let _ = nodes_tx.unbounded_send(());
            let _ = pols_tx.unbounded_send(());
        }
    };
    // Node labels or the set of nodes changed: every status.
    let nodes_changed = {
        let (ctx, pols_tx) = (ctx.clone(), all_policies_tx);
        move || {
            ctx.nodes_changed();
            let _ = pols_tx.unbounded_send(());
        }
    };

    let policy_updates = changed(&policies_w, predicates::generation)?.inspect({
        let f = policies_changed.clone();
        move |_| f()
    });
    let node_updates = changed(&nodes_w, predicates::labels)?.inspect({
        let f = nodes_changed.clone();
        move |_| f()
    });
    let nt_for_nodes = changed(&nts_w, node_topology_fields)?;
    let nt_for_gc = changed(&nts_w, predicates::generation)?;

    let policy_root = drive(Api::all(client.clone()), policies_w, move |ev| {
        if matches!(ev, Event::Delete(_) | Event::InitDone) {
            policies_changed();
        }
    });
    let node_root = drive(Api::all(client.clone()), nodes_w, move |ev| match ev {
        Event::Delete(n) => {
            nodes_changed();
            let _ = gc_tx.unbounded_send(ObjectRef::new(&n.name_any()));
        }
        // Nodes deleted while the watch was down are only missing from the new list.
        Event::InitDone => {
            nodes_changed();
            let _ = all_gc_tx.unbounded_send(());
        }
        _ => {}
    });
    let nt_root = drive(Api::<NodeTopology>::all(client), nts_w, move |ev| {
        if let Event::Delete(nt) = ev {
            for o in nt.owner_references().iter().filter(|o| o.kind == "Node") {
                let _ = node_tx.unbounded_send(ObjectRef::new(&o.name));
            }
        }
    });

    let node_controller = Controller::for_shared_stream(node_updates, nodes)
        .owns_shared_stream(nt_for_nodes)
        .reconcile_all_on(all_nodes)
        .reconcile_on(node_one)
        .with_config(CtlConfig::default().debounce(Duration::from_millis(200)))
        .graceful_shutdown_on(shutdown_on(&shutdown))
        .run(reconcile_node, error_policy, ctx.clone())
        .for_each(|r| failure_logged("node", r));
    let policy_controller = Controller::for_shared_stream(policy_updates, policies)
        .reconcile_all_on(all_policies)
        .with_config(CtlConfig::default().debounce(Duration::from_millis(300)))
        .graceful_shutdown_on(shutdown_on(&shutdown))
        .run(reconcile_policy, error_policy, ctx.clone())
        .for_each(|r| failure_logged("policy", r));
    let gc = Controller::for_shared_stream(nt_for_gc, nts)
        .reconcile_all_on(all_gc)
        .reconcile_on(gc_one)
        .with_config(CtlConfig::default().debounce(Duration::from_millis(200)))
        .graceful_shutdown_on(shutdown_on(&shutdown))
        .run(reconcile_gc, error_policy, ctx.clone())
        .for_each(|r| failure_logged("gc", r));

    let ready = async {
        let _ = ctx.nodes.wait_until_ready().await;
        let _ = ctx.policies.wait_until_ready().await;
        let _ = ctx.node_topologies.wait_until_ready().await;
        ctx.metrics.ready.store(true, Ordering::Relaxed);
        tracing::info!("caches synced");
    };

    tokio::select! {
        _ = async { tokio::join!(node_controller, policy_controller, gc, ready) } => {}
        _ = policy_root => {}
        _ = node_root => {}
        _ = nt_root => {}
        _ = shutdown.cancelled() => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::desired_node_topology;

    #[test]
    fn node_topology_predicate_ignores_the_agents_status() {
        let nt = desired_node_topology("n1", "uid-1", None);
        let base = node_topology_fields(&nt);

        let mut with_status = nt.clone();
        with_status.status = Some(Default::default());
        with_status.metadata.resource_version = Some("42".into());
        assert_eq!(node_topology_fields(&with_status), base);

        let mut regenerated = nt.clone();
        regenerated.metadata.generation = Some(7);
        assert_ne!(node_topology_fields(&regenerated), base);

        let mut relabelled = nt.clone();
        relabelled.metadata.labels = None;
        assert_ne!(node_topology_fields(&relabelled), base);

        let reowned = desired_node_topology("n1", "uid-2", None);
        assert_ne!(node_topology_fields(&reowned), base);
    }
}
