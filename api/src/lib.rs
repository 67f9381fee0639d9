//! kunpeng-tap's Kubernetes API (`tap.kunpeng.io/v1alpha1`), both cluster-scoped:
//!
//! - [`TopologyPolicy`]: which placement policy applies to the Nodes its selector matches. Where
//!   selectors overlap, the higher `priority` wins, then the older policy, then the name.
//! - [`NodeTopology`]: one per Node (same name, owned by the Node). The operator writes its spec
//!   (the resolved policy and where it came from); the node agent writes its status (the
//!   discovered topology, per-zone usage, the agent's mode and version).
//!
//! The CRD YAML in `crds/` is generated from these types: `cargo run -p tap-api --bin crdgen`
//! (or `UPDATE_CRDS=1 cargo test -p tap-api`); a test fails when it drifted.

// `#[kube(printcolumn(name = .., type_ = ..))]` repeats keys by design; clippy reads them as
// duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "tap.kunpeng.io";
pub const VERSION: &str = "v1alpha1";
pub const API_VERSION: &str = "tap.kunpeng.io/v1alpha1";

/// Condition types.
pub const CONDITION_READY: &str = "Ready";
pub const CONDITION_CONFLICT: &str = "Conflict";

/// CEL rule for a CPU list in the kernel's syntax (`0-3,8,10-11`, empty = none): the grammar,
/// and every range ascending. `split` comes from the CEL strings library the API server loads.
pub const CPUSET_RULE: &str = "self == '' || (self.matches('^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$') && self.split(',').all(r, !r.contains('-') || int(r.split('-')[0]) <= int(r.split('-')[1])))";
pub const CPUSET_MESSAGE: &str =
    "must be a CPU list such as 0-3,8 (ascending ranges, no spaces) or empty";

/// The placement policies the engine knows.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum PolicyName {
    #[serde(rename = "numa-aware")]
    NumaAware,
    #[serde(rename = "topology-aware")]
    TopologyAware,
}

impl PolicyName {
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyName::NumaAware => "numa-aware",
            PolicyName::TopologyAware => "topology-aware",
        }
    }
}

impl std::fmt::Display for PolicyName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

fn yes() -> bool {
    true
}

/// The placement settings a policy carries to a node (the part of the agent's configuration
/// the cluster decides; the rest stays with the agent's flags).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicySettings {
    /// `numa-aware` or `topology-aware`.
    #[x_kube(validation = Rule::new("self in ['numa-aware', 'topology-aware']").message("policy must be numa-aware or topology-aware"))]
    pub policy: PolicyName,
    /// Also set cpuset.mems to the chosen CPUs' NUMA nodes and account memory limits.
    #[serde(default)]
    pub memory_topology: bool,
    /// Let topology-aware place containers on CPU clusters (Kunpeng 950).
    #[serde(default)]
    pub cluster_affinity: bool,
    /// CPUs never handed to containers, kernel list syntax (`0-1`); empty = none.
    #[serde(default, rename = "reservedCPUs")]
    #[schemars(length(max = 1024))]
    #[x_kube(validation = Rule::new(CPUSET_RULE).message(CPUSET_MESSAGE))]
    pub reserved_cpus: String,
    /// Whether Pod annotations may override the policy, level and memory binding.
    #[serde(default = "yes")]
    pub annotations_allowed: bool,
}

impl Default for PolicySettings {
    fn default() -> Self {
        PolicySettings {
            policy: PolicyName::TopologyAware,
            memory_topology: false,
            cluster_affinity: false,
            reserved_cpus: String::new(),
            annotations_allowed: true,
        }
    }
}

/// Which placement policy applies to the Nodes a selector matches.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "tap.kunpeng.io",
    version = "v1alpha1",
    kind = "TopologyPolicy",
    plural = "topologypolicies",
    shortname = "tpol",
    category = "kunpeng-tap",
    status = "TopologyPolicyStatus",
    printcolumn(name = "Policy", type_ = "string", json_path = ".spec.policy"),
    printcolumn(name = "Nodes", type_ = "integer", json_path = ".status.matchedNodes"),
    printcolumn(name = "Priority", type_ = "integer", json_path = ".spec.priority"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Conflict",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Conflict\")].status",
        priority = "1"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct TopologyPolicySpec {
    /// Nodes this policy applies to; empty selects every Node.
    #[serde(default)]
    pub node_selector: LabelSelector,
    /// `numa-aware` or `topology-aware`.
    #[x_kube(validation = Rule::new("self in ['numa-aware', 'topology-aware']").message("policy must be numa-aware or topology-aware"))]
    pub policy: PolicyName,
    /// Also set cpuset.mems to the chosen CPUs' NUMA nodes and account memory limits.
    #[serde(default)]
    pub memory_topology: bool,
    /// Let topology-aware place containers on CPU clusters (Kunpeng 950).
    #[serde(default)]
    pub cluster_affinity: bool,
    /// CPUs never handed to containers, kernel list syntax (`0-1`); empty = none.
    #[serde(default, rename = "reservedCPUs")]
    #[schemars(length(max = 1024))]
    #[x_kube(validation = Rule::new(CPUSET_RULE).message(CPUSET_MESSAGE))]
    pub reserved_cpus: String,
    /// Higher wins where selectors overlap (then the older policy, then the name).
    #[serde(default)]
    pub priority: i32,
    /// Whether Pod annotations may override the policy, level and memory binding.
    #[serde(default = "yes")]
    pub annotations_allowed: bool,
}

impl TopologyPolicySpec {
    /// The settings a node gets from this policy.
    pub fn settings(&self) -> PolicySettings {
        PolicySettings {
            policy: self.policy,
            memory_topology: self.memory_topology,
            cluster_affinity: self.cluster_affinity,
            reserved_cpus: self.reserved_cpus.clone(),
            annotations_allowed: self.annotations_allowed,
        }
    }
}

/// Written by the operator.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopologyPolicyStatus {
    /// Nodes this policy is applied to (it matches and wins).
    #[serde(default)]
    pub matched_nodes: i32,
    /// Nodes the selector matches where a policy of higher precedence wins.
    #[serde(default)]
    pub overridden_nodes: i32,
    /// `Ready` (the selector is valid and the policy was resolved) and `Conflict` (it overlaps
    /// a policy of the same priority, so age or name decided).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// One Node's topology placement state: spec from the operator, status from the node agent.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "tap.kunpeng.io",
    version = "v1alpha1",
    kind = "NodeTopology",
    plural = "nodetopologies",
    shortname = "ntopo",
    category = "kunpeng-tap",
    status = "NodeTopologyStatus",
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.nodeName"),
    printcolumn(name = "Policy", type_ = "string", json_path = ".spec.source.name"),
    printcolumn(
        name = "Numa",
        type_ = "integer",
        json_path = ".status.topology.numaNodeCount"
    ),
    printcolumn(
        name = "Cpus",
        type_ = "integer",
        json_path = ".status.topology.cpuCount"
    ),
    printcolumn(name = "Allocated", type_ = "string", json_path = ".status.allocated"),
    printcolumn(
        name = "Containers",
        type_ = "integer",
        json_path = ".status.containers"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Mode",
        type_ = "string",
        json_path = ".spec.policy.policy",
        priority = "1"
    ),
    printcolumn(
        name = "Agent",
        type_ = "string",
        json_path = ".status.agent.mode",
        priority = "1"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NodeTopologySpec {
    /// The Node this object describes (equal to metadata.name).
    pub node_name: String,
    /// The resolved policy; absent when no TopologyPolicy matches (the agent then uses its
    /// flags).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicySettings>,
    /// The TopologyPolicy it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<PolicySource>,
}

/// Where a NodeTopology's policy came from.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicySource {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The TopologyPolicy's metadata.generation the settings were taken from.
    #[serde(default)]
    pub generation: i64,
}

/// Written by the node agent.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeTopologyStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<TopologySummary>,
    /// Per pool (zone) of the placement tree: capacity and what is allocated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zones: Vec<ZoneStatus>,
    /// Containers the agent placed.
    #[serde(default)]
    pub containers: i32,
    /// CPU requests placed over usable CPUs, e.g. `4.5/94`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentStatus>,
    /// `Ready`: the agent runs and applies the spec's policy (or its flags when none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The discovered machine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopologySummary {
    pub sockets: i32,
    pub dies: i32,
    pub clusters: i32,
    pub numa_node_count: i32,
    pub cpu_count: i32,
    /// Online CPUs, kernel list syntax.
    #[serde(rename = "onlineCPUs")]
    pub online_cpus: String,
    #[serde(
        default,
        rename = "isolatedCPUs",
        skip_serializing_if = "String::is_empty"
    )]
    pub isolated_cpus: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub numa_nodes: Vec<NumaNodeSummary>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceSummary>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NumaNodeSummary {
    pub id: i32,
    pub cpus: String,
    pub memory_bytes: i64,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceSummary {
    /// PCI address, e.g. `0000:81:00.0`.
    pub address: String,
    /// PCI class, hex (`0x030200`).
    pub class: String,
    pub vendor: String,
    pub device: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<i32>,
}

/// One pool of the placement tree.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ZoneStatus {
    pub name: String,
    /// `machine`, `socket`, `die`, `numa` or `cluster`.
    pub level: String,
    pub cpus: String,
    pub capacity_milli: i64,
    /// CPU requests charged to this zone and the zones below it (milli-CPU).
    pub allocated_milli: i64,
    pub limit_milli: i64,
    /// CPUs of this zone shared by its containers.
    #[serde(default, rename = "sharedCPUs")]
    pub shared_cpus: String,
    /// CPUs of this zone given exclusively to one container each.
    #[serde(default, rename = "exclusiveCPUs")]
    pub exclusive_cpus: String,
    /// Containers charged to this zone itself.
    pub containers: i32,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    /// `NRI`, `Containerd`, `Docker` or `kube-link`.
    pub mode: String,
    pub version: String,
    /// The policy in force.
    pub policy: String,
    pub memory_topology: bool,
    pub cluster_affinity: bool,
    #[serde(default, rename = "reservedCPUs")]
    pub reserved_cpus: String,
    pub annotations_allowed: bool,
    /// `NodeTopology` when from the spec, `flags` when the spec has none, `cache` when taken
    /// from the on-disk cache because the API server was not reached yet.
    pub config_source: String,
    /// The NodeTopology metadata.generation whose spec is applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The generated CRDs as `(file name, YAML)`, in a stable order.
pub fn crd_files() -> Result<Vec<(&'static str, String)>, serde_yaml::Error> {
    Ok(vec![
        (
            "tap.kunpeng.io_topologypolicies.yaml",
            to_yaml(&TopologyPolicy::crd())?,
        ),
        (
            "tap.kunpeng.io_nodetopologies.yaml",
            to_yaml(&NodeTopology::crd())?,
        ),
    ])
}

fn to_yaml(crd: &CustomResourceDefinition) -> Result<String, serde_yaml::Error> {
    let body = serde_yaml::to_string(crd)?;
    Ok(format!(
        "# Generated from api/src/lib.rs by `cargo run -p tap-api --bin crdgen`; do not edit.\n{body}"
    ))
}

#[cfg(test)]
mod tests;
