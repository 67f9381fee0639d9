//! The pods bound to this node as the API server shows them, for the NodeResourceTopology's pod
//! fingerprint and the NUMA placement of their pinned containers ([`super::placement`]). The scheduler plugin (scheduler-plugins' NodeResourceTopologyMatch) trusts a
//! node's object only while the fingerprint equals the one it computes over the pods *it* sees
//! on the node, so the set follows the plugin's own rules rather than the runtime's:
//!
//! - which pods: with the plugin's default `informerMode: Dedicated`, every pod bound to the
//!   node but the `Pending` ones (completed ones included); with `Shared` (the scheduler's own
//!   pod informer), the pods in phase `Running` ([`PodInformer`]);
//! - the method: `all` of them, or only those with exclusive resources
//!   ([`FingerprintMethod`]), as the plugin's `resyncMethod` says (its `Autodetect` follows the
//!   method attribute the agent publishes; `OnlyExclusiveResources` needs
//!   `with-exclusive-resources` here).
//!
//! A pod "has exclusive resources" as the plugin judges it: any container (init containers
//! included) requests an extended resource (a device), or the pod is Guaranteed and a container
//! requests a whole number of CPUs, or memory or hugepages.

use super::node_watch::{self, NodeCopy};
pub use crate::flags::{FingerprintMethod, PodInformer};
use k8s_openapi::api::core::v1::{Container, Pod};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// The phase of a pod (`status.phase`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
}

impl Phase {
    fn of(pod: &Pod) -> Phase {
        match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
            Some("Running") => Phase::Running,
            Some("Succeeded") => Phase::Succeeded,
            Some("Failed") => Phase::Failed,
            Some("Unknown") => Phase::Unknown,
            // No status yet: the API server has just taken the pod.
            _ => Phase::Pending,
        }
    }
}

/// What the fingerprint and the NUMA placement need of one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFacts {
    pub namespace: String,
    pub name: String,
    pub phase: Phase,
    pub exclusive: bool,
    pub guaranteed: bool,
    /// Its sidecar init containers (`restartPolicy: Always`) and its containers: those the
    /// plugin's preemption may count as pinned (the other init containers have ended).
    pub containers: Vec<ContainerFacts>,
}

/// What the plugin's preemption judges of one container: whether it is pinned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerFacts {
    pub name: String,
    /// A Guaranteed pod's container requesting whole CPUs, memory or hugepages.
    pub native_exclusive: bool,
    /// The extended resources it requests (pinned when the NodeResourceTopology has one).
    pub extended: Vec<String>,
}

impl ContainerFacts {
    fn of(guaranteed: bool, c: &Container) -> ContainerFacts {
        let requests = requests(c);
        ContainerFacts {
            name: c.name.clone(),
            native_exclusive: requests
                .iter()
                .any(|(res, q)| is_native(res) && exclusive_request(guaranteed, res, &q.0)),
            extended: requests.keys().filter(|r| !is_native(r)).cloned().collect(),
        }
    }

    /// Whether the plugin counts it as pinned, `resources` being the names the
    /// NodeResourceTopology's zones carry.
    pub fn pinned(&self, resources: &std::collections::BTreeSet<String>) -> bool {
        self.native_exclusive || self.extended.iter().any(|r| resources.contains(r))
    }
}

impl PodFacts {
    pub fn of(pod: &Pod) -> PodFacts {
        let guaranteed = qos_class(pod) == QosClass::Guaranteed;
        let containers = pod.spec.as_ref().map_or_else(Vec::new, |spec| {
            let sidecars = spec
                .init_containers
                .iter()
                .flatten()
                .filter(|c| c.restart_policy.as_deref() == Some("Always"));
            sidecars
                .chain(spec.containers.iter())
                .map(|c| ContainerFacts::of(guaranteed, c))
                .collect()
        });
        PodFacts {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            phase: Phase::of(pod),
            exclusive: has_exclusive_resources(pod),
            guaranteed,
            containers,
        }
    }

    /// Whether the plugin's cache, with this informer, holds the pod at all.
    pub fn seen(&self, informer: PodInformer) -> bool {
        match informer {
            PodInformer::Shared => self.phase == Phase::Running,
            PodInformer::Dedicated => self.phase != Phase::Pending,
        }
    }

    /// Whether the plugin's cache, with this informer and method, counts the pod.
    pub fn counted(&self, informer: PodInformer, method: FingerprintMethod) -> bool {
        self.seen(informer) && (method == FingerprintMethod::All || self.exclusive)
    }
}

/// The plugin's judgement of a pod's exclusive resources (see the module's text).
pub fn has_exclusive_resources(pod: &Pod) -> bool {
    let guaranteed = qos_class(pod) == QosClass::Guaranteed;
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let init = spec.init_containers.iter().flatten();
    init.chain(spec.containers.iter()).any(|c| {
        requests(c)
            .iter()
            .any(|(res, q)| exclusive_request(guaranteed, res, &q.0))
    })
}

fn requests(
    c: &Container,
) -> BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity> {
    c.resources
        .as_ref()
        .and_then(|r| r.requests.clone())
        .unwrap_or_default()
}

/// Whether one request makes the pod's resources exclusive.
fn exclusive_request(guaranteed: bool, resource: &str, quantity: &str) -> bool {
    if !is_native(resource) {
        return true;
    }
    if !guaranteed {
        return false;
    }
    if resource == "cpu" {
        return quantity_milli(quantity).is_some_and(|m| m > 0 && m % 1000 == 0);
    }
    if resource == "memory" || resource.starts_with("hugepages-") {
        return quantity_milli(quantity).is_some_and(|m| m > 0);
    }
    false
}

/// A resource Kubernetes itself defines (no domain, or a `kubernetes.io/` one); the others
/// are extended resources, devices for the plugin.
fn is_native(resource: &str) -> bool {
    !resource.contains('/') || resource.contains("kubernetes.io/")
}

/// The QoS class of a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

/// `status.qosClass` (set by the API server when it takes the pod), else computed from the
/// containers as the kubelet does: Guaranteed when every container has CPU and memory limits
/// equal to its requests.
pub fn qos_class(pod: &Pod) -> QosClass {
    match pod.status.as_ref().and_then(|s| s.qos_class.as_deref()) {
        Some("Guaranteed") => return QosClass::Guaranteed,
        Some("Burstable") => return QosClass::Burstable,
        Some("BestEffort") => return QosClass::BestEffort,
        _ => {}
    }
    let Some(spec) = pod.spec.as_ref() else {
        return QosClass::BestEffort;
    };
    let all: Vec<&Container> = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .collect();
    let compute = |m: &BTreeMap<String, _>| m.contains_key("cpu") || m.contains_key("memory");
    let any_set = all.iter().any(|c| {
        c.resources.as_ref().is_some_and(|r| {
            r.requests.as_ref().is_some_and(compute) || r.limits.as_ref().is_some_and(compute)
        })
    });
    if !any_set {
        return QosClass::BestEffort;
    }
    let guaranteed = all.iter().all(|c| {
        let Some(r) = c.resources.as_ref() else {
            return false;
        };
        let limits = r.limits.clone().unwrap_or_default();
        let requests = r.requests.clone().unwrap_or_default();
        ["cpu", "memory"].iter().all(|k| {
            let limit = limits.get(*k).and_then(|q| quantity_milli(&q.0));
            // A request left out defaults to the limit.
            let request = requests.get(*k).map_or(limit, |q| quantity_milli(&q.0));
            limit.is_some() && request == limit
        })
    });
    if guaranteed {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

/// A Kubernetes quantity (`2`, `500m`, `1.5`, `64Mi`, `1G`, `2e3`) in thousandths, rounded
/// up; `None` for a negative or malformed one, or one too large.
pub fn quantity_milli(q: &str) -> Option<u128> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && frac.is_empty() {
        return None;
    }
    let digits = format!("{whole}{frac}");
    let mantissa: u128 = digits.parse().ok()?;
    // value = mantissa * 10^-frac_len * factor; milli = value * 1000.
    let (num, den) = suffix_factor(suffix)?;
    let den = den.checked_mul(10u128.checked_pow(u32::try_from(frac.len()).ok()?)?)?;
    let num = mantissa.checked_mul(num)?.checked_mul(1000)?;
    Some(num.div_ceil(den))
}

/// A quantity suffix as the fraction `num / den`.
fn suffix_factor(s: &str) -> Option<(u128, u128)> {
    let binary = |p: u32| Some((1u128 << (10 * p), 1));
    let decimal = |e: i32| {
        if e >= 0 {
            Some((10u128.checked_pow(e.unsigned_abs())?, 1))
        } else {
            Some((1, 10u128.checked_pow(e.unsigned_abs())?))
        }
    };
    match s {
        "" => decimal(0),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(1),
        "Mi" => binary(2),
        "Gi" => binary(3),
        "Ti" => binary(4),
        "Pi" => binary(5),
        "Ei" => binary(6),
        e if e.starts_with(['e', 'E']) => {
            decimal(e[1..].parse::<i32>().ok().filter(|x| x.abs() <= 30)?)
        }
        _ => None,
    }
}

/// The node's pods, kept equal to the API server's by [`watch`]; `None` until the first full
/// listing.
#[derive(Debug, Default)]
pub struct NodePods {
    pods: Mutex<Option<HashMap<String, PodFacts>>>,
}

impl NodePods {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<HashMap<String, PodFacts>>> {
        self.pods.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pods `(namespace, name)` the plugin counts; `None` before the first listing (then
    /// no fingerprint is published rather than a wrong one).
    pub fn counted(
        &self,
        informer: PodInformer,
        method: FingerprintMethod,
    ) -> Option<Vec<(String, String)>> {
        let pods = self.lock();
        let pods = pods.as_ref()?;
        Some(
            pods.values()
                .filter(|p| p.counted(informer, method))
                .map(|p| (p.namespace.clone(), p.name.clone()))
                .collect(),
        )
    }

    /// The pods the plugin's cache holds with this informer, whatever their resources (its
    /// preemption takes their pinned containers); `None` before the first listing.
    pub fn seen(&self, informer: PodInformer) -> Option<Vec<PodFacts>> {
        let pods = self.lock();
        let pods = pods.as_ref()?;
        Some(
            pods.values()
                .filter(|p| p.seen(informer))
                .cloned()
                .collect(),
        )
    }
}

/// A pod's key in [`NodePods`]: `namespace/name`.
fn key(namespace: Option<&str>, name: Option<&str>) -> String {
    let (namespace, name) = (namespace.unwrap_or_default(), name.unwrap_or_default());
    format!("{namespace}/{name}")
}

/// Keeps `pods` equal to the pods bound to `node` until the stream ends.
pub async fn watch(client: kube::Client, node: String, pods: Arc<NodePods>) {
    node_watch::keep(client, &node, &*pods).await
}

impl NodeCopy for NodePods {
    type Object = Pod;
    type Kept = PodFacts;
    const WATCH: &'static str = "pod watch";
    const SERVES: &'static str = "the NodeResourceTopology's pod fingerprint";
    const READ: &'static str = "the node's pods read";

    fn key(pod: &Pod) -> String {
        let m = &pod.metadata;
        key(m.namespace.as_deref(), m.name.as_deref())
    }

    fn kept(&self, pod: &Pod) -> PodFacts {
        PodFacts::of(pod)
    }

    fn replace(&self, listing: HashMap<String, PodFacts>) {
        *self.lock() = Some(listing);
    }

    fn put(&self, key: String, facts: PodFacts) {
        if let Some(p) = self.lock().as_mut() {
            p.insert(key, facts);
        }
    }

    fn remove(&self, key: &str) {
        if let Some(p) = self.lock().as_mut() {
            p.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn facts_key(p: &PodFacts) -> String {
        key(Some(&p.namespace), Some(&p.name))
    }

    fn pod(name: &str, phase: &str, qos: &str, containers: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": name},
            "spec": {"nodeName": "n1", "containers": containers},
            "status": {"phase": phase, "qosClass": qos},
        }))
        .expect("a pod")
    }

    fn ctr(requests: serde_json::Value) -> serde_json::Value {
        json!({"name": "c", "resources": {"requests": requests, "limits": requests}})
    }

    #[test]
    fn quantities_in_thousandths() {
        let cases = [
            ("2", Some(2000)),
            ("500m", Some(500)),
            ("1.5", Some(1500)),
            ("100n", Some(1)),
            ("2k", Some(2_000_000)),
            ("1Ki", Some(1_024_000)),
            ("64Mi", Some(64 * 1024 * 1024 * 1000)),
            ("2e3", Some(2_000_000)),
            ("0", Some(0)),
            ("-1", None),
            ("", None),
            ("1x", None),
            ("1e99", None),
        ];
        for (q, want) in cases {
            assert_eq!(quantity_milli(q), want, "{q}");
        }
    }

    #[test]
    fn exclusive_resources_as_the_plugin_judges_them() {
        let g = |name, requests| pod(name, "Running", "Guaranteed", json!([ctr(requests)]));
        let b = |name, requests| pod(name, "Running", "Burstable", json!([ctr(requests)]));
        for (p, exclusive) in [
            (g("int", json!({"cpu": "2", "memory": "1Gi"})), true),
            // Memory alone makes a Guaranteed pod's resources exclusive for the plugin.
            (g("frac", json!({"cpu": "1500m", "memory": "1Gi"})), true),
            (g("frac-nomem", json!({"cpu": "1500m"})), false),
            (b("burst", json!({"cpu": "2", "memory": "1Gi"})), false),
            (
                b("dev", json!({"cpu": "100m", "example.com/accel": "1"})),
                true,
            ),
            (b("native-domain", json!({"kubernetes.io/x": "1"})), false),
        ] {
            let name = p.metadata.name.clone();
            assert_eq!(has_exclusive_resources(&p), exclusive, "{name:?}");
        }
        // An init container counts too.
        let mut p = b("init", json!({"cpu": "100m"}));
        if let Some(s) = p.spec.as_mut() {
            s.init_containers = Some(vec![serde_json::from_value(ctr(
                json!({"example.com/nic": "1"}),
            ))
            .expect("c")]);
        }
        assert!(has_exclusive_resources(&p));
    }

    /// The containers the plugin's preemption may count as pinned: sidecar init containers
    /// and containers, not the init containers that have ended; devices pinned only when the
    /// object carries them.
    #[test]
    fn pinned_containers_as_the_preemption_judges_them() {
        let mut p = pod(
            "g",
            "Running",
            "Guaranteed",
            json!([
                {"name": "int", "resources": {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}}},
                {"name": "dev", "resources": {"requests": {"cpu": "500m", "example.com/accel": "1"}}},
                {"name": "frac", "resources": {"requests": {"cpu": "500m"}}},
            ]),
        );
        let init: Vec<Container> = serde_json::from_value(json!([
            {"name": "setup", "resources": {"requests": {"cpu": "1"}}},
            {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
        ]))
        .expect("init containers");
        if let Some(s) = p.spec.as_mut() {
            s.init_containers = Some(init);
        }
        let f = PodFacts::of(&p);
        let names: Vec<&str> = f.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["proxy", "int", "dev", "frac"]);
        let carried = std::collections::BTreeSet::from(["example.com/accel".to_string()]);
        let pinned = |res: &std::collections::BTreeSet<String>| -> Vec<&str> {
            f.containers
                .iter()
                .filter(|c| c.pinned(res))
                .map(|c| c.name.as_str())
                .collect()
        };
        assert_eq!(pinned(&carried), ["proxy", "int", "dev"]);
        assert_eq!(pinned(&Default::default()), ["proxy", "int"]);
        // Burstable: only devices pin.
        let b = PodFacts::of(&pod(
            "b",
            "Running",
            "Burstable",
            json!([ctr(json!({"cpu": "2", "example.com/accel": "1"})), {"name": "x", "resources": {"requests": {"cpu": "2"}}}]),
        ));
        let pinned: Vec<bool> = b.containers.iter().map(|c| c.pinned(&carried)).collect();
        assert_eq!(pinned, [true, false]);
        assert!(!b.guaranteed && f.guaranteed);
    }

    #[test]
    fn the_qos_class_without_a_status_is_computed() {
        let mut p = pod(
            "g",
            "Running",
            "",
            json!([ctr(json!({"cpu": "1", "memory": "1Gi"}))]),
        );
        p.status = None;
        assert_eq!(qos_class(&p), QosClass::Guaranteed);
        let mut p = pod(
            "b",
            "Running",
            "",
            json!([{"name": "c", "resources": {"requests": {"cpu": "1"}}}]),
        );
        p.status = None;
        assert_eq!(qos_class(&p), QosClass::Burstable);
        let mut p = pod("be", "Running", "", json!([{"name": "c"}]));
        p.status = None;
        assert_eq!(qos_class(&p), QosClass::BestEffort);
    }

    #[test]
    fn the_pods_counted_follow_the_informer_and_the_method() {
        let facts = |phase, exclusive| PodFacts {
            namespace: "ns".into(),
            name: "p".into(),
            phase,
            exclusive,
            guaranteed: false,
            containers: Vec::new(),
        };
        use FingerprintMethod::{All, WithExclusiveResources as Excl};
        use PodInformer::{Dedicated, Shared};
        let table = [
            // phase, exclusive, informer, method, counted
            (Phase::Running, false, Shared, All, true),
            (Phase::Pending, false, Shared, All, false),
            (Phase::Succeeded, false, Shared, All, false),
            (Phase::Failed, true, Shared, Excl, false),
            (Phase::Running, false, Shared, Excl, false),
            (Phase::Running, true, Shared, Excl, true),
            (Phase::Pending, true, Dedicated, All, false),
            (Phase::Succeeded, false, Dedicated, All, true),
            (Phase::Failed, true, Dedicated, Excl, true),
            (Phase::Unknown, false, Dedicated, All, true),
        ];
        for (phase, excl, inf, method, want) in table {
            assert_eq!(
                facts(phase, excl).counted(inf, method),
                want,
                "{phase:?} exclusive={excl} {inf:?} {method:?}"
            );
        }
    }

    #[test]
    fn no_set_before_the_first_listing_and_the_watch_events_keep_it() {
        let pods = NodePods::default();
        assert_eq!(
            pods.counted(PodInformer::Shared, FingerprintMethod::All),
            None
        );
        let run = PodFacts::of(&pod(
            "a",
            "Running",
            "Burstable",
            json!([ctr(json!({"cpu": "1"}))]),
        ));
        pods.put(facts_key(&run), run.clone());
        assert_eq!(
            pods.counted(PodInformer::Shared, FingerprintMethod::All),
            None
        );
        pods.replace(HashMap::from([(facts_key(&run), run.clone())]));
        let done = PodFacts::of(&pod(
            "job",
            "Succeeded",
            "BestEffort",
            json!([{"name": "c"}]),
        ));
        pods.put(facts_key(&done), done.clone());
        let shared = pods.counted(PodInformer::Shared, FingerprintMethod::All);
        assert_eq!(shared, Some(vec![("ns".to_string(), "a".to_string())]));
        let mut dedicated = pods
            .counted(PodInformer::Dedicated, FingerprintMethod::All)
            .unwrap_or_default();
        dedicated.sort();
        assert_eq!(dedicated.len(), 2);
        pods.remove(&facts_key(&run));
        assert_eq!(
            pods.counted(PodInformer::Shared, FingerprintMethod::All),
            Some(vec![])
        );
    }
}
