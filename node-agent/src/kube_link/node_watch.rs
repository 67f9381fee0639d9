//! A keyed copy of the objects of one kind bound to this node (`spec.nodeName`), kept from a
//! watch: each listing replaces the copy whole once it is read, then every change is applied.

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use std::collections::HashMap;

/// Where a watch's objects are kept, and what is kept of each.
pub trait NodeCopy: Sync {
    type Object: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static;
    type Kept: Send;

    /// The watch, for the log (`pod watch`).
    const WATCH: &'static str;
    /// What the copy serves, said with the first failure (`the NodeResourceTopology's pod
    /// fingerprint`).
    const SERVES: &'static str;
    /// A listing read, for the log (`the node's pods read`).
    const READ: &'static str;

    /// The object's key in the copy.
    fn key(obj: &Self::Object) -> String;
    /// What is kept of the object.
    fn kept(&self, obj: &Self::Object) -> Self::Kept;
    /// Replaces the whole copy with a listing just read.
    fn replace(&self, listing: HashMap<String, Self::Kept>);
    fn put(&self, key: String, kept: Self::Kept);
    fn remove(&self, key: &str);
}

/// Keeps `copy` equal to the objects bound to `node` until the stream ends. A failure is
/// warned about once (until the next listing is read), then the watch retries quietly.
pub async fn keep<C: NodeCopy>(client: kube::Client, node: &str, copy: &C) {
    let api: Api<C::Object> = Api::all(client);
    let wc = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut stream = std::pin::pin!(watcher(api, wc).default_backoff());
    let mut listing = HashMap::new();
    let mut warned = false;
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::Init) => listing.clear(),
            Ok(watcher::Event::InitApply(o)) => {
                listing.insert(C::key(&o), copy.kept(&o));
            }
            Ok(watcher::Event::InitDone) => {
                warned = false;
                tracing::debug!(node = %node, objects = listing.len(), "{}", C::READ);
                copy.replace(std::mem::take(&mut listing));
            }
            Ok(watcher::Event::Apply(o)) => copy.put(C::key(&o), copy.kept(&o)),
            Ok(watcher::Event::Delete(o)) => copy.remove(&C::key(&o)),
            Err(e) if !warned => {
                warned = true;
                tracing::warn!(node = %node, "{} ({}): {e}", C::WATCH, C::SERVES);
            }
            Err(e) => tracing::debug!(node = %node, "{}: {e}", C::WATCH),
        }
    }
}
