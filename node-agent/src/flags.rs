//! Command-line flags. The reference guide's flags keep their names, defaults and meaning so
//! its systemd units and DaemonSet args work unchanged; ours are added after them.

use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;
use tap_engine::{
    CacheAffinity, ClusterAffinityRule, CoreGrain, CpuSet, EngineConfig, PolicyKind, Rebalance,
    ReservedAccess, ReservedAnnotation, ResourcePriority,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeMode {
    Docker,
    Containerd,
    Nri,
}

tap_engine::names! {
    RuntimeMode: "container runtime mode", Ignored {
        Docker = "Docker",
        Containerd = "Containerd",
        Nri = "NRI",
    }
}

/// `--nri-unsolicited-updates`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum UnsolicitedUpdates {
    Auto,
    Always,
    Never,
}

/// `--nri-cgroup-writes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CgroupWrites {
    /// Where unsolicited updates are not sent, write containers' cgroups when the cgroup
    /// filesystem under `--cgroup-root` is writable.
    Auto,
    /// Never: updates then ride on the answers to the runtime's requests.
    Never,
}

/// `--node-resource-topology`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NrtMode {
    Auto,
    On,
    Off,
}

/// `--dra-driver`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DraDriverMode {
    /// Not a DRA driver (containers that use other drivers' claims are still placed near
    /// their devices).
    Off,
    /// The DRA driver `dra.tap.kunpeng.io`: this node's ResourceSlice and the kubelet plugin.
    On,
}

/// `--dra-device-level`: the CPU group each DRA device is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DraLevel {
    Numa,
    Socket,
    Die,
    Cluster,
    Cache,
}

impl DraLevel {
    pub fn level(self) -> tap_engine::topology::Level {
        use tap_engine::topology::Level;
        match self {
            DraLevel::Numa => Level::Numa,
            DraLevel::Socket => Level::Socket,
            DraLevel::Die => Level::Die,
            DraLevel::Cluster => Level::Cluster,
            DraLevel::Cache => Level::Cache,
        }
    }
}

/// Which of the node's pods the scheduler plugin's cache counts (its `informerMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum PodInformer {
    /// The scheduler's shared pod informer: pods in phase Running.
    Shared,
    /// The plugin's own pod informer (its default since v0.29): every pod bound to the node
    /// but Pending ones, completed ones included.
    #[default]
    Dedicated,
}

/// Which pods the fingerprint covers (attribute `nodeTopologyPodsFingerprintMethod`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum FingerprintMethod {
    /// Every counted pod.
    #[default]
    All,
    /// Only the pods with exclusive resources.
    WithExclusiveResources,
}

impl FingerprintMethod {
    /// The attribute's value, as the podfingerprint library names it.
    pub fn as_str(self) -> &'static str {
        match self {
            FingerprintMethod::All => "all",
            FingerprintMethod::WithExclusiveResources => "with-exclusive-resources",
        }
    }
}

/// `--exclusive-cores`: `sibling-pair` is for a Pod's annotation only.
fn parse_core_grain(s: &str) -> Result<CoreGrain, String> {
    match CoreGrain::parse(s) {
        Some(g @ (CoreGrain::WholeCores | CoreGrain::Threads)) => Ok(g),
        _ => Err(format!(
            "unknown exclusive core grain {s:?}: use whole or threads (sibling-pair is per Pod)"
        )),
    }
}

/// At least a second: a round reads every container's cgroup files.
fn parse_rebalance_interval(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_secs(1) {
        return Err(format!("rebalance interval {s:?} is under 1s"));
    }
    Ok(d)
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

pub use tap_bin_support::LogFormat;

/// kunpeng-tap node agent: NUMA/socket/die/cluster-aware CPU and memory placement for
/// Kubernetes containers.
#[derive(Debug, Clone, Parser)]
// A flag given twice takes its last value (the chart appends `agent.extraArgs` after its own flags).
#[command(name = "kunpeng-tap", version, about, args_override_self = true)]
pub struct Flags {
    /// Socket the proxy serves (Docker and Containerd modes); a stale socket is removed.
    #[arg(
        help_heading = "Runtime",
        long,
        default_value = "/var/run/kunpeng/tap-runtime-proxy.sock"
    )]
    pub runtime_proxy_endpoint: PathBuf,

    /// Group (name or numeric id) allowed to use the proxy socket: it is then 0660 and owned by
    /// that group; empty keeps it 0600 (root only, as the kubelet runs), whatever the umask.
    #[arg(help_heading = "Runtime", long, default_value = "")]
    pub socket_group: String,

    /// The runtime's own socket the proxy forwards to (a path, `unix://` optional).
    #[arg(help_heading = "Runtime", long, default_value = "/var/run/docker.sock")]
    pub container_runtime_service_endpoint: String,

    /// How the agent meets the runtime: Docker (Docker API proxy), Containerd (CRI proxy) or
    /// NRI (containerd >= 1.7 NRI plugin).
    #[arg(help_heading = "Runtime", long, default_value = "Docker")]
    pub container_runtime_mode: RuntimeMode,

    /// The NRI socket (NRI mode).
    #[arg(
        help_heading = "Runtime",
        long,
        default_value = "/var/run/nri/nri.sock"
    )]
    pub nri_socket_path: PathBuf,

    /// Placement policy: topology-aware or numa-aware.
    #[arg(help_heading = "Policy", long, default_value = "topology-aware")]
    pub resource_policy: PolicyKind,

    /// Which affinity wins when they disagree: cpu-first or gpu-first.
    #[arg(help_heading = "Policy", long, default_value = "cpu-first")]
    pub resource_priority: ResourcePriority,

    /// Also set cpuset.mems to the chosen CPUs' NUMA nodes, and account memory limits.
    #[arg(help_heading = "Policy", long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub enable_memory_topology: bool,

    /// Let topology-aware place containers on CPU clusters (Kunpeng 950).
    #[arg(help_heading = "Policy", long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub topology_cluster_affinity: bool,

    /// Where cluster affinity (the flag above, or a NodeTopology policy's clusterAffinity) may
    /// use cluster pools: `any` (wherever sysfs reports clusters smaller than their NUMA node)
    /// or `kunpeng-950-only` (the reference's rule: only on CPU part 0xd06, HiSilicon Kunpeng
    /// 950, read from `midr_el1` under --sysfs-root, else `cpuinfo` under --proc-root).
    #[arg(help_heading = "Policy", long, default_value = "any")]
    pub cluster_affinity_rule: ClusterAffinityRule,

    /// How long shutdown waits for requests in flight.
    #[arg(help_heading = "Runtime", long, default_value = "15s", value_parser = parse_duration)]
    pub graceful_timeout: Duration,

    /// Address for /metrics, /healthz and /readyz (e.g. `:9091`); empty = off.
    #[arg(help_heading = "Observability", long, default_value = "")]
    pub metrics_bind_address: String,

    /// Log verbosity, 2 (info) to 5 (trace); 0-1 warnings only.
    #[arg(
        help_heading = "Observability",
        short = 'v',
        long = "verbose",
        default_value_t = 2
    )]
    pub verbose: u8,

    // ---- kunpeng-tap additions ----
    /// Root of the sysfs tree to discover the topology from: a directory, or a dump file (the
    /// format of the repository's fixtures/sysfs, read into memory).
    #[arg(
        help_heading = "Policy",
        long,
        default_value = "/sys",
        env = "TAP_SYSFS_ROOT"
    )]
    pub sysfs_root: PathBuf,

    /// Root of the proc tree the NVIDIA driver's GPU files are read from
    /// (`driver/nvidia/gpus/<address>/information`), so that `NVIDIA_VISIBLE_DEVICES=GPU-<uuid>`
    /// finds its GPU, and `cpuinfo` (the CPU model where sysfs has no `midr_el1`).
    #[arg(
        help_heading = "Policy",
        long,
        default_value = "/proc",
        env = "TAP_PROC_ROOT"
    )]
    pub proc_root: PathBuf,

    /// Print the discovered topology tree and sample decisions, then exit.
    #[arg(help_heading = "Testing and debugging", long)]
    pub explain: bool,

    /// CPUs kept out of every pool (system daemons), e.g. `0-1`: only the containers of
    /// --reserved-cpus-namespaces (and, with --reserved-cpus-annotation=honoured, Pods asking
    /// by annotation) run on them. United with the kubelet's reservedSystemCPUs
    /// (--kubelet-config). A NodeTopology policy's reservedCPUs replaces this flag.
    #[arg(help_heading = "Policy", long, default_value = "")]
    pub reserved_cpus: CpuSet,

    /// Namespaces whose Pods' containers are placed on the reserved CPUs (all of them, shared),
    /// comma-separated, e.g. `kube-system`; a Pod may decline with the annotation
    /// `tap.kunpeng.huawei.com/reserved-cpus: "false"`. A NodeTopology policy's
    /// reservedCPUsFor replaces this flag.
    #[arg(
        help_heading = "Policy",
        long,
        value_delimiter = ',',
        default_value = ""
    )]
    pub reserved_cpus_namespaces: Vec<String>,

    /// Whether a Pod outside --reserved-cpus-namespaces that asks for the reserved CPUs by
    /// annotation (`tap.kunpeng.huawei.com/reserved-cpus: "true"`) gets them: `ignored` (the
    /// default: placed on the pools, with a Warning Event) or `honoured`.
    #[arg(help_heading = "Policy", long, default_value = "ignored")]
    pub reserved_cpus_annotation: ReservedAnnotation,

    /// The kubelet's configuration file (KubeletConfiguration, YAML or JSON, e.g.
    /// `/var/lib/kubelet/config.yaml`): its reservedSystemCPUs are reserved here too. A
    /// missing or unreadable file is logged and ignored. Default: none.
    #[arg(help_heading = "Policy", long)]
    pub kubelet_config: Option<PathBuf>,

    /// The kubelet's reservedSystemCPUs, read once from --kubelet-config.
    #[arg(skip)]
    kubelet_reserved: std::sync::OnceLock<CpuSet>,

    /// Give Guaranteed integer-CPU containers exclusive CPUs (topology-aware).
    #[arg(help_heading = "Policy", long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub exclusive_cpus: bool,

    /// How exclusive CPUs are taken: `whole` cores only (the kubelet's full-pcpus-only: a
    /// count that is no whole number of free cores gets shared CPUs, with a Warning Event), or
    /// any `threads` (whole cores first). Per Pod: the `exclusive-cores` annotation.
    #[arg(help_heading = "Policy", long, default_value = "whole", value_parser = parse_core_grain)]
    pub exclusive_cores: CoreGrain,

    /// Cache (L3) pools between the NUMA node and the core, where CPUs share a last-level cache
    /// smaller than their NUMA node (`cpu*/cache/index*/shared_cpu_list`, level 3): `on` (the
    /// default) or `off` (only for Pods that ask for `level: cache`).
    #[arg(help_heading = "Policy", long, default_value = "on")]
    pub cache_affinity: CacheAffinity,

    /// Confine BestEffort containers to one pool or NUMA node like the others (charged
    /// nothing); by default they run on the machine's shared CPUs, as the kubelet leaves them.
    #[arg(help_heading = "Policy", long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub confine_best_effort: bool,

    /// Move shared containers between NUMA nodes by their measured CPU use: `none` (the
    /// default) or `usage` (when a node's demand per shared CPU is 10% above the mean, at
    /// most two moves a round, none of a container moved in the last 20 rounds unless its node
    /// is oversubscribed; new shared containers go to the least busy node that fits). Per Pod: `tap.kunpeng.huawei.com/rebalance: "false"` keeps it in place. A
    /// NodeTopology policy's `rebalance` replaces this flag.
    #[arg(help_heading = "Rebalancing", long, default_value = "none")]
    pub rebalance: Rebalance,

    /// How often the rebalancer samples every container's cgroup (`cpu.stat`, `cpu.pressure`)
    /// and plans; a round's cooldown and window are counted in these.
    #[arg(help_heading = "Rebalancing", long, default_value = "10s", value_parser = parse_rebalance_interval)]
    pub rebalance_interval: Duration,

    /// Where the cgroup filesystem is mounted: containers' `cpu.stat` (cgroup v2 only: v1
    /// hosts report no usage and the rebalancer never moves anything there) and cpuset files
    /// (v2 or v1's `cpuset` hierarchy: read back in every mode, written in NRI mode) are
    /// found below it.
    #[arg(help_heading = "Rebalancing", long, default_value = "/sys/fs/cgroup")]
    pub cgroup_root: PathBuf,

    /// Map decisions onto this host's CPUs (`cpu % host CPUs`): for testing a fixture topology
    /// on a smaller machine. Never in production.
    #[arg(help_heading = "Testing and debugging", long)]
    pub fold_cpus_to_host: bool,

    /// The kubelet's pod-resources socket: a container the kubelet allocated devices through
    /// a device plugin (GPUs, NPUs, NICs with NUMA topology) is placed near their NUMA nodes.
    /// Read at each create under a short timeout (fails open); a host without the socket is
    /// skipped. Empty: off (environment hints such as `NVIDIA_VISIBLE_DEVICES` only).
    #[arg(
        help_heading = "Runtime",
        long,
        default_value = crate::pod_resources::client::DEFAULT_SOCKET
    )]
    pub pod_resources_socket: PathBuf,

    /// NRI plugin name (registered as `<index>-<name>`).
    #[arg(help_heading = "Runtime", long, default_value = "kunpeng-tap")]
    pub nri_plugin_name: String,
    /// NRI plugin index: orders the plugins containerd calls (two digits, lower first).
    #[arg(help_heading = "Runtime", long, default_value = "10")]
    pub nri_plugin_index: String,

    /// NRI: whether the agent sends cpuset updates of running containers on its own
    /// (unsolicited `UpdateContainers`). `auto`: only to containerd 2.4 or later; older
    /// containerd releases can deadlock their NRI on one (two locks taken in opposite orders,
    /// fixed in NRI v0.12.1, which containerd vendors from 2.4), so there the updates ride on
    /// the answers to containerd's own requests. `always`, `never`.
    #[arg(help_heading = "Runtime", long, value_enum, default_value = "auto")]
    pub nri_unsolicited_updates: UnsolicitedUpdates,

    /// NRI: whether the agent writes the cpuset of a running container into its cgroup itself
    /// (under `--cgroup-root`, v2 or v1's cpuset hierarchy): bounded, and no runtime lock or
    /// shim is involved. `auto` (where that filesystem is writable; used before unsolicited
    /// updates unless those are `always`) or `never` (then unsolicited updates where allowed,
    /// else updates wait for containerd's next request).
    #[arg(help_heading = "Runtime", long, value_enum, default_value = "auto")]
    pub nri_cgroup_writes: CgroupWrites,

    /// This node's name (NodeTopology object); defaults to the hostname.
    #[arg(help_heading = "Kube link", long, env = "NODE_NAME")]
    pub node_name: Option<String>,

    /// Watch this node's NodeTopology for its policy and report status to it.
    #[arg(help_heading = "Kube link", long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub enable_node_topology: bool,

    /// Publish this node's NodeResourceTopology (topology.node.k8s.io/v1alpha2: one zone per
    /// NUMA node with cpu and memory capacity, allocatable and available), read by the
    /// scheduler-plugins NodeResourceTopologyMatch plugin. `auto`: when the API server serves
    /// that CRD (checked every minute); `on`: always try (warns while it is missing); `off`.
    /// Needs --enable-node-topology.
    #[arg(help_heading = "Kube link", long, value_enum, default_value = "auto")]
    pub node_resource_topology: NrtMode,

    /// The topology manager policy and scope the NodeResourceTopology advertises (attributes
    /// `topologyManagerPolicy`, `topologyManagerScope`): the scheduler plugin filters nodes by
    /// NUMA fit only for `single-numa-node`. kunpeng-tap places each container on its own.
    #[arg(help_heading = "Kube link", long, default_value = "single-numa-node")]
    pub nrt_topology_manager_policy: String,

    /// Which of the node's pods the scheduler plugin counts for the NodeResourceTopology's pod
    /// fingerprint, as its `cache.informerMode` says: `dedicated` (its default: every pod bound
    /// to the node but Pending ones, completed ones included) or `shared` (pods in phase
    /// Running). The agent reads its node's pods from the API server for it.
    #[arg(
        help_heading = "Kube link",
        long,
        value_enum,
        default_value = "dedicated"
    )]
    pub nrt_scheduler_informer: PodInformer,

    /// Which pods the fingerprint covers (attribute `nodeTopologyPodsFingerprintMethod`):
    /// `all`, or `with-exclusive-resources` (needed when the plugin's `cache.resyncMethod` is
    /// `OnlyExclusiveResources`; its default `Autodetect` follows this attribute).
    #[arg(help_heading = "Kube link", long, value_enum, default_value = "all")]
    pub nrt_fingerprint_method: FingerprintMethod,

    /// Record an Event on the Pod for each placement (`TopologyPlaced`: cpus, pool, mems and
    /// why) and each container left unadjusted by a failure (`TopologyNotPlaced`, Warning), so
    /// `kubectl describe pod` shows them. Rate-limited and aggregated. Needs
    /// --enable-node-topology.
    #[arg(help_heading = "Kube link", long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub pod_events: bool,

    /// Act as the DRA driver `dra.tap.kunpeng.io` for CPUs and memory: publish this node's
    /// CPU groups as devices (a ResourceSlice) and prepare the claims the kube-scheduler
    /// allocates them through the kubelet's plugin socket; a container that uses a claim gets
    /// its CPUs and memory nodes. Needs the API server (in-cluster or KUBECONFIG) and
    /// `--kubelet-root-dir`. `off` or `on`.
    #[arg(help_heading = "DRA", long, value_enum, default_value = "off")]
    pub dra_driver: DraDriverMode,

    /// The CPU group each DRA device is: `numa` (a NUMA node), `socket`, `die`, `cluster`
    /// (Kunpeng clusters), `cache` (L3 groups); a level the machine lacks falls back to `numa`.
    #[arg(help_heading = "DRA", long, value_enum, default_value = "numa")]
    pub dra_device_level: DraLevel,

    /// The kubelet's root folder: the plugin registers under `plugins_registry/` and serves
    /// under `plugins/dra.tap.kunpeng.io/`.
    #[arg(help_heading = "DRA", long, default_value = "/var/lib/kubelet")]
    pub kubelet_root_dir: PathBuf,

    /// The runtime's CDI spec folder: each prepared claim gets a CDI device there that sets
    /// `TAP_DRA_CPUS`, `TAP_DRA_MEMS` and `TAP_DRA_CLAIM` in its containers (a runtime without
    /// CDI ignores it). Empty: no CDI devices.
    #[arg(help_heading = "DRA", long, default_value = "/var/run/cdi")]
    pub dra_cdi_dir: PathBuf,

    /// Where the agent keeps its cached policy and the proxies' grant records (made 0700).
    #[arg(help_heading = "Runtime", long, default_value = "/var/lib/kunpeng-tap")]
    pub state_dir: PathBuf,

    /// Log format.
    #[arg(
        help_heading = "Observability",
        long,
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
}

impl Flags {
    /// Sets up `tracing` from `-v` and `--log-format` ([`tap_bin_support::init_logging`]).
    pub fn init_logging(&self) {
        tap_bin_support::init_logging(self.verbose, self.log_format);
    }

    /// Discovers the topology under `--sysfs-root` (a directory, or a dump file such as the
    /// repository's fixtures) (and the NVIDIA GPUs' UUIDs under `--proc-root`), identifies the
    /// CPU ([`Flags::identify_cpu`]) and builds its model. What discovery worked around
    /// (asymmetric or short NUMA distance rows, ...) is logged as warnings.
    pub fn load_topology(&self) -> anyhow::Result<std::sync::Arc<tap_engine::Topology>> {
        use anyhow::Context;
        use tap_engine::sysfs::{discover_with_warnings, open_root, DiscoveryOptions};
        let context = || {
            format!(
                "discovering the topology under {}",
                self.sysfs_root.display()
            )
        };
        let sys = open_root(&self.sysfs_root).with_context(context)?;
        let mut found =
            discover_with_warnings(&sys, &DiscoveryOptions::default()).with_context(context)?;
        for w in &found.warnings {
            tracing::warn!(sysfs_root = %self.sysfs_root.display(), "sysfs: {w}");
        }
        let proc = tap_engine::sysfs::DirSource::new(&self.proc_root);
        tap_engine::devices::read_nvidia_uuids(&proc, &mut found.raw.devices);
        found.raw.cpu = Self::identify_cpu(&found.raw, &sys, &proc);
        let topo =
            tap_engine::Topology::build(&found.raw).context("building the topology model")?;
        Ok(std::sync::Arc::new(topo))
    }

    /// The CPU model: the first online CPU's `midr_el1` under `--sysfs-root`, else `cpuinfo`
    /// under `--proc-root`, else unknown (logged, never an error).
    fn identify_cpu(
        raw: &tap_engine::RawTopology,
        sys: &tap_engine::sysfs::RootSource,
        proc: &tap_engine::sysfs::DirSource,
    ) -> tap_engine::CpuModel {
        let first = raw.cpus.first().map_or(0, |c| c.id);
        let found = tap_engine::cpu_model::identify(sys, proc, first);
        for p in &found.problems {
            tracing::warn!("CPU identification: {p}");
        }
        tracing::info!(cpu = %found.model, source = found.model.source.as_str(), "CPU model");
        found.model
    }

    /// The kubelet's reservedSystemCPUs (--kubelet-config; read on first use, failures logged
    /// and taken as none).
    pub fn kubelet_reserved(&self) -> CpuSet {
        *self.kubelet_reserved.get_or_init(|| {
            crate::kubelet_config::reserved_system_cpus(self.kubelet_config.as_deref())
        })
    }

    /// Who may use the reserved CPUs, as the flags say.
    pub fn reserved_access(&self) -> ReservedAccess {
        ReservedAccess {
            namespaces: self
                .reserved_cpus_namespaces
                .iter()
                .map(|n| n.trim())
                .filter(|n| !n.is_empty())
                .map(str::to_string)
                .collect(),
            annotation: self.reserved_cpus_annotation,
        }
    }

    /// The engine configuration these flags ask for (reading --kubelet-config once).
    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            policy: self.resource_policy,
            memory_topology: self.enable_memory_topology,
            cluster_affinity: self.topology_cluster_affinity,
            cluster_rule: self.cluster_affinity_rule,
            reserved: self.reserved_cpus.union(&self.kubelet_reserved()),
            reserved_for: self.reserved_access(),
            priority: self.resource_priority,
            exclusive_cpus: self.exclusive_cpus,
            annotations_allowed: true,
            confine_best_effort: self.confine_best_effort,
            exclusive_cores: self.exclusive_cores,
            cache_affinity: self.cache_affinity,
            rebalance: self.rebalance,
            // The flag's level is the DRA driver's default; a policy's overrides it.
            dra_level: None,
        }
    }

    /// The runtime endpoint as a filesystem path (`unix://` stripped).
    pub fn runtime_endpoint_path(&self) -> PathBuf {
        PathBuf::from(
            self.container_runtime_service_endpoint
                .strip_prefix("unix://")
                .unwrap_or(&self.container_runtime_service_endpoint),
        )
    }

    /// Checks flag combinations; the message says what to change.
    pub fn validate(&self) -> Result<(), String> {
        if self.explain {
            return Ok(());
        }
        match self.container_runtime_mode {
            RuntimeMode::Docker | RuntimeMode::Containerd => {
                if self.container_runtime_service_endpoint.trim().is_empty() {
                    return Err(format!(
                        "--container-runtime-mode={} needs --container-runtime-service-endpoint (the runtime's socket)",
                        self.container_runtime_mode.as_str()
                    ));
                }
                if self.runtime_proxy_endpoint.as_os_str().is_empty() {
                    return Err("--runtime-proxy-endpoint must not be empty".into());
                }
                if self.runtime_endpoint_path() == self.runtime_proxy_endpoint {
                    return Err("--runtime-proxy-endpoint and --container-runtime-service-endpoint are the same socket".into());
                }
            }
            RuntimeMode::Nri => {
                if self.nri_socket_path.as_os_str().is_empty() {
                    return Err("--container-runtime-mode=NRI needs --nri-socket-path".into());
                }
                let idx = &self.nri_plugin_index;
                if idx.len() != 2 || !idx.chars().all(|c| c.is_ascii_digit()) {
                    return Err(format!(
                        "--nri-plugin-index must be two digits (00-99), got {idx:?}"
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rebalancing_is_off_by_default_and_rounds_are_bounded() {
        let f = Flags::try_parse_from(["kunpeng-tap"]).expect("defaults");
        assert_eq!(f.engine_config().rebalance, Rebalance::Off);
        assert_eq!(f.rebalance_interval, Duration::from_secs(10));
        let f = Flags::try_parse_from(["kunpeng-tap", "--rebalance=usage"]).expect("usage");
        assert_eq!(f.engine_config().rebalance, Rebalance::Usage);
        for bad in [
            "--rebalance=sometimes",
            "--rebalance-interval=0s",
            "--rebalance-interval=500ms",
        ] {
            assert!(
                Flags::try_parse_from(["kunpeng-tap", bad]).is_err(),
                "{bad}"
            );
        }
    }

    /// `--help` is grouped: every flag says what it does and sits under a heading.
    #[test]
    fn every_flag_has_help_and_a_heading() {
        use clap::CommandFactory;
        let cmd = Flags::command();
        let mut headings = std::collections::BTreeSet::new();
        for a in cmd.get_arguments() {
            let id = a.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            assert!(
                a.get_help()
                    .is_some_and(|h| !h.to_string().trim().is_empty()),
                "--{id} has no help text"
            );
            let h = a.get_help_heading();
            assert!(h.is_some(), "--{id} has no heading");
            headings.extend(h.map(str::to_string));
        }
        assert_eq!(
            headings.into_iter().collect::<Vec<_>>(),
            [
                "DRA",
                "Kube link",
                "Observability",
                "Policy",
                "Rebalancing",
                "Runtime",
                "Testing and debugging"
            ]
        );
    }

    #[test]
    fn reference_flags_parse() {
        let f = Flags::try_parse_from([
            "kunpeng-tap",
            "--runtime-proxy-endpoint=/var/run/kunpeng/tap-runtime-proxy.sock",
            "--container-runtime-service-endpoint=/var/run/containerd/containerd.sock",
            "--container-runtime-mode=Containerd",
            "--resource-policy=numa-aware",
            "--enable-memory-topology=true",
            "--topology-cluster-affinity",
            "-v",
            "3",
        ])
        .unwrap();
        assert_eq!(f.container_runtime_mode, RuntimeMode::Containerd);
        assert_eq!(f.resource_policy, PolicyKind::NumaAware);
        assert!(f.enable_memory_topology && f.topology_cluster_affinity);
        assert_eq!(f.verbose, 3);
        assert!(f.validate().is_ok());
        let f = Flags::try_parse_from([
            "kunpeng-tap",
            "--container-runtime-mode=NRI",
            "--nri-socket-path=/x.sock",
        ])
        .unwrap();
        assert_eq!(f.container_runtime_mode, RuntimeMode::Nri);
    }

    #[test]
    fn cluster_affinity_rule_is_a_named_choice_defaulting_to_any() {
        let f = Flags::try_parse_from(["kunpeng-tap"]).unwrap();
        assert_eq!(f.engine_config().cluster_rule, ClusterAffinityRule::Any);
        let f = Flags::try_parse_from([
            "kunpeng-tap",
            "--topology-cluster-affinity",
            "--cluster-affinity-rule=kunpeng-950-only",
        ])
        .unwrap();
        let cfg = f.engine_config();
        assert!(cfg.cluster_affinity);
        assert_eq!(cfg.cluster_rule, ClusterAffinityRule::Kunpeng950Only);
        let e = Flags::try_parse_from(["kunpeng-tap", "--cluster-affinity-rule=d06"]).unwrap_err();
        assert!(e.to_string().contains("use any or kunpeng-950-only"), "{e}");
    }

    #[test]
    fn reserved_cpus_come_from_the_flags_and_the_kubelet() {
        let kubelet = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/kubelet/config.json");
        let f = Flags::try_parse_from([
            "kunpeng-tap",
            "--reserved-cpus=0",
            "--reserved-cpus-namespaces=kube-system, monitoring,",
            "--reserved-cpus-annotation=honoured",
            &format!("--kubelet-config={kubelet}"),
        ])
        .unwrap();
        let cfg = f.engine_config();
        assert_eq!(cfg.reserved.to_string(), "0,2-3");
        assert_eq!(cfg.reserved_for.namespaces, ["kube-system", "monitoring"]);
        assert_eq!(cfg.reserved_for.annotation, ReservedAnnotation::Honoured);
        // Nothing by default; a missing kubelet file is no reserved CPUs, not an error.
        let f =
            Flags::try_parse_from(["kunpeng-tap", "--kubelet-config=/nonexistent/k.yaml"]).unwrap();
        let cfg = f.engine_config();
        assert!(cfg.reserved.is_empty() && cfg.reserved_for == ReservedAccess::default());
        // What the chart passes when nothing is listed.
        let f = Flags::try_parse_from(["kunpeng-tap", "--reserved-cpus-namespaces="]).unwrap();
        assert!(f.reserved_access().namespaces.is_empty());
        let e =
            Flags::try_parse_from(["kunpeng-tap", "--reserved-cpus-annotation=yes"]).unwrap_err();
        assert!(e.to_string().contains("ignored or honoured"), "{e}");
    }

    /// The chart appends `agent.extraArgs` after its own flags: a repeated flag takes the
    /// last value instead of failing.
    #[test]
    fn a_repeated_flag_takes_its_last_value() {
        let f = Flags::try_parse_from([
            "kunpeng-tap",
            "--sysfs-root=/host/sys",
            "--resource-policy=topology-aware",
            "--sysfs-root=/fixture",
            "--resource-policy=numa-aware",
        ])
        .unwrap();
        assert_eq!(f.sysfs_root, std::path::PathBuf::from("/fixture"));
        assert_eq!(f.resource_policy, PolicyKind::NumaAware);
    }

    #[test]
    fn bad_values_are_rejected_with_a_clear_message() {
        let e =
            Flags::try_parse_from(["kunpeng-tap", "--container-runtime-mode=crio"]).unwrap_err();
        assert!(
            e.to_string().contains("use Docker, Containerd or NRI"),
            "{e}"
        );
        let e = Flags::try_parse_from(["kunpeng-tap", "--resource-policy=best"]).unwrap_err();
        assert!(
            e.to_string().contains("topology-aware or numa-aware"),
            "{e}"
        );
        let f = Flags::try_parse_from([
            "kunpeng-tap",
            "--container-runtime-mode=Docker",
            "--container-runtime-service-endpoint=",
        ])
        .unwrap();
        assert!(f
            .validate()
            .unwrap_err()
            .contains("needs --container-runtime-service-endpoint"));
    }
}

/// docs/user/flags.md against the flags themselves: the table names every flag once, under its
/// `--help` heading, with its default as the binary has it.
#[cfg(test)]
mod doc_tests {
    use super::Flags;
    use clap::CommandFactory;
    use std::collections::BTreeMap;

    /// The table's rows: each flag named in a row's first cell (`--a`, `--b` or `-v`, `--verbose`)
    /// with the heading above it and the row's default cell.
    fn documented(md: &str) -> BTreeMap<String, (String, String)> {
        let mut heading = String::new();
        let mut out = BTreeMap::new();
        for line in md.lines().filter(|l| l.starts_with("| ")) {
            let cells: Vec<&str> = line
                .split(" | ")
                .map(|c| c.trim_matches(|c| c == '|' || c == ' '))
                .collect();
            if let Some(h) = cells[0]
                .strip_prefix("**")
                .and_then(|h| h.strip_suffix("**"))
            {
                heading = h.to_string();
                continue;
            }
            for name in cells[0]
                .split(", ")
                .filter_map(|n| n.trim_matches('`').strip_prefix("--"))
            {
                let default = cells.get(1).copied().unwrap_or_default().to_string();
                out.insert(name.to_string(), (heading.clone(), default));
            }
        }
        out
    }

    #[test]
    fn the_flags_page_lists_every_flag_under_its_heading_with_its_default() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/user/flags.md");
        let md = std::fs::read_to_string(path).expect("docs/user/flags.md");
        let docs = documented(&md);
        let cmd = Flags::command();
        let mut missing = Vec::new();
        for a in cmd
            .get_arguments()
            .filter(|a| a.get_long().is_some_and(|l| l != "help" && l != "version"))
        {
            let long = a.get_long().unwrap_or_default();
            let Some((heading, default)) = docs.get(long) else {
                missing.push(long.to_string());
                continue;
            };
            assert_eq!(
                Some(heading.as_str()),
                a.get_help_heading(),
                "--{long}: heading in flags.md"
            );
            let want: Vec<String> = a
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect();
            match want.as_slice() {
                [] => {}
                [v] if v.is_empty() => assert!(
                    default.starts_with("empty") || default.is_empty(),
                    "--{long}: default {default:?}, the binary's is empty"
                ),
                [v] => assert!(
                    default.contains(&format!("`{v}`")),
                    "--{long}: default {default:?}, the binary's is {v:?}"
                ),
                many => panic!("--{long}: several defaults {many:?}"),
            }
        }
        assert!(
            missing.is_empty(),
            "flags missing from docs/user/flags.md: {missing:?}"
        );
        let known: Vec<&str> = cmd.get_arguments().filter_map(|a| a.get_long()).collect();
        let stale: Vec<&String> = docs
            .keys()
            .filter(|k| !known.contains(&k.as_str()))
            .collect();
        assert!(
            stale.is_empty(),
            "docs/user/flags.md names flags the binary lacks: {stale:?}"
        );
    }
}
