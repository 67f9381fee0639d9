use anyhow::Context;
use clap::Parser;
use node_agent::agent::Agent;
use node_agent::flags::{DraDriverMode, Flags, RuntimeMode};
use node_agent::fold::HostFold;
use node_agent::metrics::Metrics;
use node_agent::pod_resources::client::KubeletPodResources;
use node_agent::{cri_proxy, docker_proxy, explain, kube_link, nri};
use std::sync::Arc;
use tap_engine::sysfs::discover_dir;
use tap_engine::{CpuSet, Engine, NodeSet};

/// `--fold-cpus-to-host`: `topo`'s NUMA nodes onto the real host's CPUs and nodes.
fn host_fold(topo: &tap_engine::Topology) -> anyhow::Result<HostFold> {
    let raw = discover_dir(std::path::Path::new("/sys"))
        .context("reading this host's /sys for --fold-cpus-to-host")?;
    let cpus = CpuSet::from_ids(raw.cpus.iter().map(|c| c.id));
    let nodes = NodeSet::from_ids(
        raw.nodes
            .iter()
            .filter(|n| !n.cpus.is_empty())
            .map(|n| n.id as usize),
    );
    HostFold::for_topology(topo, &cpus, &nodes).context("this host reports no online CPUs")
}

fn main() -> std::process::ExitCode {
    let flags = Flags::parse();
    flags.init_logging();
    if let Err(msg) = flags.validate() {
        eprintln!("kunpeng-tap: {msg}");
        return std::process::ExitCode::from(2);
    }
    match run(flags) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("kunpeng-tap: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(flags: Flags) -> anyhow::Result<()> {
    let topo = flags.load_topology()?;
    let fold = if flags.fold_cpus_to_host {
        Some(host_fold(&topo)?)
    } else {
        None
    };
    let metrics = Arc::new(Metrics::for_mode(flags.container_runtime_mode.as_str()));
    let engine = Engine::new(topo.clone(), flags.engine_config());
    let agent = Arc::new(Agent::new(
        engine,
        metrics.clone(),
        fold,
        flags.container_runtime_mode.as_str(),
    ));

    if flags.explain {
        print!("{}", explain::explain(&agent));
        if flags.dra_driver == DraDriverMode::On {
            let devices = agent.dra_devices(flags.dra_device_level.level());
            let node = kube_link::node_name(&flags);
            println!("DRA ResourceSlice (--dra-driver=on):");
            print!("{}", node_agent::dra::slice::yaml(&node, &devices));
        }
        return Ok(());
    }
    // The PCIe roots' NUMA nodes, for DRA devices that name only their root.
    if let Ok(sys) = tap_engine::sysfs::open_root(&flags.sysfs_root) {
        let roots = node_agent::pod_resources::dra::PcieRoots::read(&sys);
        agent.dra_topology().set_pcie_roots(roots);
    }
    let dra = (flags.dra_driver == DraDriverMode::On).then(|| node_agent::dra::run::DraOptions {
        node: kube_link::node_name(&flags),
        level: flags.dra_device_level.level(),
        kubelet_root: flags.kubelet_root_dir.clone(),
        cdi: (!flags.dra_cdi_dir.as_os_str().is_empty())
            .then(|| node_agent::dra::cdi::CdiDir(flags.dra_cdi_dir.clone())),
        state_dir: flags.state_dir.clone(),
    });
    if let Some(opts) = &dra {
        // Before the runtime mode restores the containers: those on a claim's CPUs find it.
        node_agent::dra::run::restore_claims(&agent, opts);
    }
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        arch = std::env::consts::ARCH,
        mode = flags.container_runtime_mode.as_str(),
        policy = %flags.resource_policy,
        cpus = topo.online.len(),
        numa_nodes = topo.nodes.len(),
        pools = topo.pools.len(),
        "kunpeng-tap starting"
    );

    let rt = tap_bin_support::runtime(tap_bin_support::Threads::One)
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let shutdown = tap_bin_support::shutdown_on_signal();
        // (The client's channel needs the runtime: made in it.)
        if !flags.pod_resources_socket.as_os_str().is_empty() {
            let dra = agent.dra_topology().clone();
            let client = KubeletPodResources::new(&flags.pod_resources_socket, dra);
            agent.set_device_source(Arc::new(client));
        }
        if !flags.metrics_bind_address.is_empty() {
            let addr = tap_bin_support::parse_bind(&flags.metrics_bind_address)
                .map_err(|e| anyhow::anyhow!("--metrics-bind-address: {e}"))?;
            let m = metrics.clone();
            tokio::spawn(async move {
                if let Err(e) = node_agent::metrics::serve(addr, m).await {
                    tracing::error!("metrics endpoint failed: {e:#}");
                }
            });
        }
        if flags.enable_node_topology {
            let opts = kube_link::LinkOptions::from_flags(&flags);
            let (a, s) = (agent.clone(), shutdown.clone());
            tokio::spawn(async move {
                if let Err(e) = kube_link::run(opts, a, s).await {
                    tracing::error!("NodeTopology link stopped: {e:#}");
                }
            });
        }
        if let Some(opts) = dra {
            let (a, s) = (agent.clone(), shutdown.clone());
            tokio::spawn(node_agent::dra::run::run(opts, a, s));
        }
        let result = match flags.container_runtime_mode {
            RuntimeMode::Nri => nri::run(&flags, agent.clone(), shutdown.clone()).await,
            RuntimeMode::Containerd => {
                cri_proxy::run(&flags, agent.clone(), shutdown.clone()).await
            }
            RuntimeMode::Docker => docker_proxy::run(&flags, agent.clone(), shutdown.clone()).await,
        };
        shutdown.cancel();
        result
    })
}
