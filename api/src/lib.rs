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

/// Bounds of `TopologyPolicy.spec.priority` (the API server refuses values outside).
pub const PRIORITY_MIN: i32 = -1000;
pub const PRIORITY_MAX: i32 = 1000;

/// The placement policies the engine knows: `numa-aware` gives each container the CPUs of one
/// NUMA node (the nearest nodes when it needs more); `topology-aware` places containers in a
/// tree of pools (machine, socket, die, NUMA node, CPU cluster) at the smallest level that fits.
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

/// Whether a Pod outside [`ReservedCpusFor::namespaces`] that asks for the reserved CPUs by
/// annotation (`tap.kunpeng.huawei.com/reserved-cpus: "true"`) is placed there.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum ReservedAnnotation {
    /// Only the listed namespaces use the reserved CPUs; the annotation elsewhere is not
    /// honoured (a `TopologyNotHonoured` Event).
    #[default]
    #[serde(rename = "ignored")]
    Ignored,
    /// Any Pod that asks by annotation is placed on the reserved CPUs.
    #[serde(rename = "honoured")]
    Honoured,
}

/// The CPU group each device of the agent's DRA driver is.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DraDeviceLevel {
    /// A NUMA node.
    Numa,
    /// A socket.
    Socket,
    /// A die.
    Die,
    /// A CPU cluster (Kunpeng).
    Cluster,
    /// CPUs sharing an L3 cache.
    Cache,
}

/// Whether the node agents move shared containers between NUMA nodes by their measured CPU
/// use.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum RebalanceMode {
    /// Containers stay where they were placed. (`none`, not `off`: YAML 1.1 readers, as
    /// kubectl's, take an unquoted `off` for `false`.)
    #[default]
    #[serde(rename = "none")]
    Off,
    /// A shared container moves off a NUMA node whose demand per shared CPU is 10% above the
    /// mean (at most two moves a round, none of a container within 20 rounds of its last
    /// unless its node is oversubscribed), and new shared containers go to the node with the
    /// lowest demand that fits them. Pods keep their place with
    /// `tap.kunpeng.huawei.com/rebalance: "false"`.
    #[serde(rename = "usage")]
    Usage,
}

impl RebalanceMode {
    pub fn is_off(&self) -> bool {
        *self == RebalanceMode::Off
    }
}

/// Who may use the reserved CPUs (system daemons): they are in no pool, and only these Pods'
/// containers are placed on them (all of them, shared).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReservedCpusFor {
    /// Namespaces whose Pods' containers run on the reserved CPUs (a Pod may decline with the
    /// annotation `tap.kunpeng.huawei.com/reserved-cpus: "false"`), e.g. `kube-system`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 63)))]
    pub namespaces: Vec<String>,
    /// `honoured`: a Pod in any namespace may ask by annotation
    /// (`tap.kunpeng.huawei.com/reserved-cpus: "true"`); `ignored` (the default): only the
    /// listed namespaces.
    #[serde(default)]
    pub annotation: ReservedAnnotation,
}

impl ReservedCpusFor {
    /// Nobody (the default): serialized as nothing, so objects without it stay as they were.
    pub fn is_empty(&self) -> bool {
        self == &ReservedCpusFor::default()
    }
}

/// The placement settings a TopologyPolicy carries to a node (the part of the node agent's
/// configuration the cluster decides; the rest stays with the agent's flags).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicySettings {
    /// The placement policy: `numa-aware` (each container on the CPUs of one NUMA node, or of
    /// the nearest nodes when it needs more) or `topology-aware` (the smallest pool of the
    /// machine > socket > die > NUMA node > cluster tree that fits).
    pub policy: PolicyName,
    /// Also set cpuset.mems to the chosen CPUs' NUMA nodes and account memory limits.
    #[serde(default)]
    pub memory_topology: bool,
    /// Let topology-aware place containers on CPU clusters (Kunpeng 950).
    #[serde(default)]
    pub cluster_affinity: bool,
    /// CPUs kept out of every pool, kernel list syntax (`0-1`); empty = none. Only the Pods
    /// `reservedCPUsFor` names run on them (system daemons).
    #[serde(default, rename = "reservedCPUs")]
    #[schemars(length(max = 1024))]
    #[x_kube(validation = Rule::new(CPUSET_RULE).message(CPUSET_MESSAGE))]
    pub reserved_cpus: String,
    /// Who may use the reserved CPUs: Pods of these namespaces, and any Pod asking by
    /// annotation when `annotation` is `honoured`. Absent: nobody.
    #[serde(
        default,
        rename = "reservedCPUsFor",
        skip_serializing_if = "ReservedCpusFor::is_empty"
    )]
    pub reserved_cpus_for: ReservedCpusFor,
    /// Move shared containers between NUMA nodes by their measured CPU use: `none` (absent)
    /// or `usage`.
    #[serde(default, skip_serializing_if = "RebalanceMode::is_off")]
    pub rebalance: RebalanceMode,
    /// The CPU group each device of the agent's DRA driver is (`numa`, `socket`, `die`,
    /// `cluster`, `cache`), where the agent runs it (`--dra-driver=on`); absent: the agent's
    /// `--dra-device-level`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dra_device_level: Option<DraDeviceLevel>,
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
            reserved_cpus_for: ReservedCpusFor::default(),
            rebalance: RebalanceMode::Off,
            annotations_allowed: true,
            dra_device_level: None,
        }
    }
}

/// What a TopologyPolicy asks for: the Nodes it selects, the placement policy and settings they
/// get, and its priority where selectors overlap.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "tap.kunpeng.io",
    version = "v1alpha1",
    kind = "TopologyPolicy",
    plural = "topologypolicies",
    doc = "TopologyPolicy chooses how kunpeng-tap places containers' CPUs and memory on the Nodes its nodeSelector matches: a placement policy (numa-aware or topology-aware) and its settings. Where the selectors of several policies match a Node, the higher priority wins, then the older policy, then the smaller name. The operator resolves policies onto Nodes and writes the result into each Node's NodeTopology; the node agent applies it. Cluster-scoped.",
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
    /// The placement policy and settings the selected Nodes get (the fields of the spec
    /// beside `nodeSelector` and `priority`).
    #[serde(flatten)]
    pub settings: PolicySettings,
    /// Precedence where the selectors of several policies match a Node: the higher priority
    /// wins, then the older policy, then the smaller name. From -1000 to 1000; default 0.
    #[serde(default)]
    #[schemars(range(min = PRIORITY_MIN, max = PRIORITY_MAX))]
    pub priority: i32,
}

/// How the policy was resolved onto Nodes; written by the operator.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopologyPolicyStatus {
    /// Nodes this policy is applied to (it matches and wins).
    #[serde(default)]
    pub matched_nodes: i32,
    /// Nodes the selector matches where a policy of higher precedence wins.
    #[serde(default)]
    pub overridden_nodes: i32,
    /// `Ready` (the selector is valid and the policy was resolved) and `Conflict` (it overlaps
    /// a policy of the same priority, so age or name decided); one per type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// The spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The placement settings resolved for one Node; written by the operator.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "tap.kunpeng.io",
    version = "v1alpha1",
    kind = "NodeTopology",
    plural = "nodetopologies",
    doc = "NodeTopology is one Node's CPU and memory placement state under kunpeng-tap, named after the Node and owned by it. The operator writes the spec (the placement settings resolved from the TopologyPolicies that match the Node, and which policy they came from); the node agent on that Node writes the status (the discovered topology, per-zone CPU capacity and allocation, the agent's mode and version). Cluster-scoped.",
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
        name = "CPU",
        type_ = "string",
        json_path = ".status.cpuModel.name",
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
    /// The TopologyPolicy the settings came from; absent with the policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<PolicySource>,
}

/// Where a NodeTopology's policy came from.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicySource {
    /// The TopologyPolicy's name.
    pub name: String,
    /// The TopologyPolicy's metadata.uid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The TopologyPolicy's metadata.generation the settings were taken from.
    #[serde(default)]
    pub generation: i64,
}

/// What the node agent found and did on the Node; written by the node agent.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeTopologyStatus {
    /// The machine as the agent discovered it (sockets, dies, clusters, NUMA nodes, CPUs,
    /// devices).
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
    /// The agent: its mode, version and the settings in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentStatus>,
    /// The CPU model the agent identified (`midr_el1` in sysfs, else `/proc/cpuinfo`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_model: Option<CpuModelSummary>,
    /// `Ready`: the agent runs and applies the spec's policy (or its flags when none); one per
    /// type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// The discovered machine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopologySummary {
    /// Physical packages (sockets).
    pub sockets: i32,
    /// Dies, over all sockets.
    pub dies: i32,
    /// CPU clusters (the kernel's `cluster_id`), over all dies; 0 without cluster information.
    pub clusters: i32,
    /// NUMA nodes.
    pub numa_node_count: i32,
    /// Online CPUs.
    pub cpu_count: i32,
    /// Online CPUs, kernel list syntax.
    #[serde(rename = "onlineCPUs")]
    pub online_cpus: String,
    /// CPUs isolated from the scheduler (`isolcpus`), kernel list syntax; absent when none.
    #[serde(
        default,
        rename = "isolatedCPUs",
        skip_serializing_if = "String::is_empty"
    )]
    pub isolated_cpus: String,
    /// Each NUMA node: its CPUs and memory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub numa_nodes: Vec<NumaNodeSummary>,
    /// PCI display controllers (GPUs, and the console VGAs of BMCs and virtual machines, which
    /// are not GPUs), processing accelerators (NPUs) and the devices named in the agent's options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceSummary>,
}

/// The machine's CPU model, as the node agent identified it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CpuModelSummary {
    /// A name for people: `HiSilicon Kunpeng 920` (implementer 0x48, part 0xd01),
    /// `HiSilicon Kunpeng 950` (part 0xd06), another Arm implementer and part, an x86 model
    /// name, or `unknown`.
    pub name: String,
    /// The Arm MIDR_EL1 implementer code, hex (`0x48` HiSilicon); absent without one (x86).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub implementer: Option<String>,
    /// The Arm MIDR_EL1 part number, hex (`0xd01`); absent without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<String>,
    /// The Arm MIDR_EL1 variant, hex; absent without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// The Arm MIDR_EL1 revision; absent without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i32>,
    /// `/proc/cpuinfo`'s `vendor_id` (x86: `GenuineIntel`, `AuthenticAMD`); absent on Arm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor: Option<String>,
    /// Where it was read: `midr_el1` (sysfs), `cpuinfo` (proc) or `none`.
    pub source: String,
}

/// One NUMA node of the machine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NumaNodeSummary {
    /// The kernel's NUMA node number.
    pub id: i32,
    /// Its CPUs, kernel list syntax.
    pub cpus: String,
    /// Its memory (the node's MemTotal), bytes.
    pub memory_bytes: i64,
}

/// One PCI device and the NUMA node it hangs off.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceSummary {
    /// PCI address, e.g. `0000:81:00.0`.
    pub address: String,
    /// PCI class, hex (`0x030200`).
    pub class: String,
    /// PCI vendor id, hex (`0x19e5`).
    pub vendor: String,
    /// PCI device id, hex.
    pub device: String,
    /// The NUMA node the device is attached to; absent when the kernel does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<i32>,
}

/// One pool (zone) of the placement tree. Zones nest (machine > socket > die > NUMA node >
/// cache > cluster): a zone's figures include the zones below it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ZoneStatus {
    /// The pool's name, e.g. `socket0` or `numa1`.
    pub name: String,
    /// `machine`, `socket`, `die`, `numa`, `cache` (CPUs sharing an L3 cache) or `cluster`.
    pub level: String,
    /// The pool's CPUs, kernel list syntax.
    pub cpus: String,
    /// Usable CPUs of the pool, milli-CPU.
    pub capacity_milli: i64,
    /// CPU requests charged to this zone and the zones below it (milli-CPU).
    pub allocated_milli: i64,
    /// CPU limits charged to this zone and the zones below it (milli-CPU).
    pub limit_milli: i64,
    /// CPUs of this zone shared by its containers.
    #[serde(default, rename = "sharedCPUs")]
    pub shared_cpus: String,
    /// CPUs of this zone given exclusively to one container each.
    #[serde(default, rename = "exclusiveCPUs")]
    pub exclusive_cpus: String,
    /// CPUs of this zone booked by DRA claims of the driver `dra.tap.kunpeng.io` (only the
    /// claims' containers run there); absent when none.
    #[serde(
        default,
        rename = "claimedCPUs",
        skip_serializing_if = "String::is_empty"
    )]
    pub claimed_cpus: String,
    /// Containers charged to this zone itself.
    pub containers: i32,
}

/// The node agent and the settings it applies.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    /// `NRI`, `Containerd`, `Docker` or `kube-link`.
    pub mode: String,
    /// The agent's version.
    pub version: String,
    /// The policy in force.
    pub policy: String,
    /// Whether cpuset.mems follows the chosen CPUs' NUMA nodes.
    pub memory_topology: bool,
    /// Whether topology-aware places containers on CPU clusters (false where
    /// `clusterAffinityRule` turned a policy's or flag's cluster affinity off on this CPU).
    pub cluster_affinity: bool,
    /// Where cluster affinity may be used (`--cluster-affinity-rule`): `any`, or
    /// `kunpeng-950-only` (only on CPU part 0xd06, as the reference).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cluster_affinity_rule: String,
    /// CPUs kept out of every pool (only the Pods of `reservedCPUsFor` use them), kernel
    /// list syntax; empty = none.
    #[serde(default, rename = "reservedCPUs")]
    pub reserved_cpus: String,
    /// Who may use the reserved CPUs (system daemons); absent: nobody.
    #[serde(
        default,
        rename = "reservedCPUsFor",
        skip_serializing_if = "ReservedCpusFor::is_empty"
    )]
    pub reserved_cpus_for: ReservedCpusFor,
    /// Usage-aware rebalancing in force: `none` (absent) or `usage`.
    #[serde(default, skip_serializing_if = "RebalanceMode::is_off")]
    pub rebalance: RebalanceMode,
    /// Whether Pod annotations may override the policy, level and memory binding.
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

#[cfg(feature = "fixtures")]
pub mod fixtures;

#[cfg(test)]
mod tests;
