//! `tap-kube-scale`: how many writes per second N agents' NodeTopology status reporting sends
//! to a real kube-apiserver, idle and under container churn. A measurement program, not a test
//! (docs/design/scale.md):
//!
//! ```text
//! bash hack/e2e/setup-kube.sh      # kube-apiserver, kubectl, etcd (once)
//! cargo run --release -p tap-e2e --bin tap-kube-scale -- \
//!     [--nodes 10,100,1000] [--churn 0.1,1] [--window 60] [--fixture synthetic-2s-4numa-96c-gpu]
//! ```
//!
//! It starts etcd and kube-apiserver as the e2e tier does ([`tap_e2e::kube::KubeCluster`]),
//! applies the CRDs and, for each N (growing), creates NodeTopology objects up to N and runs
//! one agent link per node in this process: the node-agent library's
//! [`node_agent::kube_link::run_with_client`], each with its own [`Agent`] (its own engine on
//! the fixture's topology), all over one client. Once every node has written its status and
//! the usage interval has passed, it counts writes (`apiserver_request_total` of
//! `nodetopologies` with a write verb, from the API server's own /metrics) over `--window`
//! seconds: first with no churn, then with each churn rate (container creates per node per
//! second, each create also removing the node's oldest container once it has 8), after one
//! usage interval of warm-up. It prints one Markdown table row per (N, churn) and the load.
//!
//! With `--nrt` it also installs the NodeResourceTopology CRD (hack/e2e/setup-nrt-crd.sh; or
//! `TAP_NRT_CRD`) and runs the links with NodeResourceTopology publishing on, and counts those
//! writes (`noderesourcetopologies`) in a column of their own.
//!
//! Each node also runs the DRA driver's slice publisher (`--dra-driver=on`, without a kubelet):
//! the last column counts ResourceSlice writes in the window (one create per node at start,
//! before any window; none after, whatever the churn, when the publisher writes only changes).

use anyhow::{bail, Context, Result};
use node_agent::agent::{Agent, ContainerInfo, PodInfo};
use node_agent::flags::NrtMode;
use node_agent::kube_link::{self, LinkOptions, USAGE_MIN_INTERVAL};
use node_agent::metrics::Metrics;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tap_e2e::kube::KubeCluster;
use tap_e2e::util;
use tap_engine::{Engine, EngineConfig, Topology};
use tokio_util::sync::CancellationToken;

struct Opts {
    nodes: Vec<usize>,
    churn: Vec<f64>,
    window: Duration,
    fixture: String,
    nrt: bool,
}

fn list<T: std::str::FromStr>(s: &str) -> Result<Vec<T>> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse()
                .map_err(|_| anyhow::anyhow!("bad list item {x:?}"))
        })
        .collect()
}

fn parse() -> Result<Opts> {
    let mut o = Opts {
        nodes: vec![10, 100, 1000],
        churn: vec![0.1, 1.0],
        window: Duration::from_secs(60),
        fixture: "synthetic-2s-4numa-96c-gpu".into(),
        nrt: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().with_context(|| format!("{name} needs a value"));
        match a.as_str() {
            "--nodes" => o.nodes = list(&value("--nodes")?)?,
            "--churn" => o.churn = list(&value("--churn")?)?,
            "--window" => o.window = Duration::from_secs(value("--window")?.parse()?),
            "--fixture" => o.fixture = value("--fixture")?,
            "--nrt" => o.nrt = true,
            "-h" | "--help" => {
                println!("tap-kube-scale [--nodes 10,100,1000] [--churn 0.1,1] [--window SECONDS] [--fixture NAME] [--nrt]");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?} (see --help)"),
        }
    }
    o.nodes.sort_unstable();
    Ok(o)
}

fn node(i: usize) -> String {
    format!("scale-node-{i:04}")
}

/// Write requests on NodeTopologies, on NodeResourceTopologies and on ResourceSlices so far,
/// from the API server's /metrics.
fn writes(k: &KubeCluster) -> Result<(f64, f64, f64)> {
    // With 1,000 watchers the exposition is large and a busy API server slow to send it: a
    // longer timeout than kubectl's usual 10 s (the last flag wins), and retries.
    let mut last = None;
    for _ in 0..5 {
        match k.kubectl_ok(&["get", "--raw", "/metrics", "--request-timeout=120s"]) {
            Ok(text) => {
                return Ok((
                    count_writes(&text, "nodetopologies"),
                    count_writes(&text, "noderesourcetopologies"),
                    count_writes(&text, "resourceslices"),
                ))
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no /metrics")))
}

/// The sum of `apiserver_request_total` samples of `resource` with a write verb (server-side
/// apply is counted as `APPLY`).
fn count_writes(metrics: &str, resource: &str) -> f64 {
    let label = format!("resource=\"{resource}\"");
    metrics
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| l.contains(&label))
        .filter(|l| {
            [
                "APPLY", "PATCH", "PUT", "POST", "UPDATE", "CREATE", "DELETE",
            ]
            .iter()
            .any(|v| l.contains(&format!("verb=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.trim().parse::<f64>().ok())
        .sum()
}

/// Nodes whose status the agent has written (status.agent set).
fn reported(k: &KubeCluster) -> Result<usize> {
    let v = k
        .get_json(&["get", "nodetopologies"])?
        .context("no NodeTopology list")?;
    Ok(v["items"]
        .as_array()
        .map(|a| a.iter().filter(|i| !i["status"]["agent"].is_null()).count())
        .unwrap_or(0))
}

/// The agents' ResourceSlices on the API server.
fn slices(k: &KubeCluster) -> Result<usize> {
    let v = k
        .get_json(&["get", "resourceslices"])?
        .context("no ResourceSlice list")?;
    Ok(v["items"].as_array().map(Vec::len).unwrap_or(0))
}

/// Creates NodeTopology objects `from..to`.
fn create_objects(k: &KubeCluster, from: usize, to: usize) -> Result<()> {
    for chunk in (from..to).collect::<Vec<_>>().chunks(200) {
        let mut doc = String::new();
        for &i in chunk {
            doc.push_str(&format!(
                "---\napiVersion: tap.kunpeng.io/v1alpha1\nkind: NodeTopology\nmetadata: {{name: {n}}}\nspec: {{nodeName: {n}}}\n",
                n = node(i)
            ));
        }
        k.apply(&doc)?;
    }
    Ok(())
}

/// A container of node-local churn number `seq`: Burstable, 100m to 400m (so the usage a
/// create-and-remove leaves behind changes).
fn churn_container(node: usize, seq: u64) -> ContainerInfo {
    let milli = 100 + (seq % 7) * 50;
    ContainerInfo {
        id: format!("{node:04}-{seq:08}"),
        name: "app".into(),
        pod: PodInfo {
            uid: format!("pod-{node}-{seq}"),
            name: format!("churn-{seq}"),
            namespace: "default".into(),
            cgroup_parent: Some(format!("/kubepods/burstable/podpod-{node}-{seq}")),
            ..PodInfo::default()
        },
        cpu_shares: Some(milli * 1024 / 1000),
        cpu_period: Some(100_000),
        ..ContainerInfo::default()
    }
}

/// Creates containers at `per_node` creates per node per second across `agents`, round-robin,
/// until `stop`; each create removes the node's oldest container once it has 8.
async fn churn(agents: Vec<Arc<Agent>>, per_node: f64, stop: CancellationToken) {
    let tick = Duration::from_millis(100);
    let per_tick = per_node * agents.len() as f64 * tick.as_secs_f64();
    let mut owed = 0.0;
    let mut next = 0usize;
    let mut seq = 0u64;
    let mut live: Vec<VecDeque<String>> = vec![VecDeque::new(); agents.len()];
    let mut iv = tokio::time::interval(tick);
    while !stop.is_cancelled() {
        iv.tick().await;
        owed += per_tick;
        while owed >= 1.0 {
            owed -= 1.0;
            let n = next % agents.len();
            next += 1;
            seq += 1;
            let c = churn_container(n, seq);
            agents[n].create(&c);
            live[n].push_back(c.id);
            if live[n].len() > 8 {
                if let Some(old) = live[n].pop_front() {
                    agents[n].remove(&old);
                }
            }
        }
    }
}

fn main() -> Result<()> {
    let o = parse()?;
    let k = KubeCluster::start()?;
    k.apply_crds()?;
    if o.nrt {
        k.install_nrt_crd()?;
    }
    // kube_link::connect reads it; nothing else runs in this process yet.
    std::env::set_var("KUBECONFIG", &k.kubeconfig);
    let raw = tap_engine::sysfs::discover_dir(&util::fixture_dir(&o.fixture))?;
    let topo = Arc::new(Topology::build(&raw)?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = rt.block_on(run(&o, &k, topo));
    println!("load average: {}", util::load_average());
    result
}

async fn run(o: &Opts, k: &KubeCluster, topo: Arc<Topology>) -> Result<()> {
    let client = kube_link::connect().await?;
    let state = util::temp_dir("tap-kube-scale")?;
    let _rm = util::RmDir(state.clone());
    let shutdown = CancellationToken::new();
    let mut agents: Vec<Arc<Agent>> = Vec::new();
    println!(
        "| nodes | churn (creates/s per node) | window (s) | writes | writes/s | writes per node per 10 s | limit N/{}s | NodeResourceTopology writes per node per minute | DRA ResourceSlice writes in the window |",
        USAGE_MIN_INTERVAL.as_secs()
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &n in &o.nodes {
        let from = agents.len();
        if n > from {
            create_objects(k, from, n)?;
        }
        for i in from..n {
            let agent = Arc::new(Agent::new(
                Engine::new(topo.clone(), EngineConfig::default()),
                Arc::new(Metrics::new()),
                None,
                "kube-scale",
            ));
            // No runtime: the empty state is the truth (the link publishes once restored).
            if let Err(e) = agent.restore(&[]) {
                eprintln!("node {i}: {e}");
            }
            let opts = LinkOptions {
                node: node(i),
                base: EngineConfig::default(),
                kubelet_reserved: Default::default(),
                cache_path: state.join(format!("{}.json", node(i))),
                // No Pods exist here: no Events. NodeResourceTopology only with --nrt.
                pod_events: false,
                nrt: if o.nrt { NrtMode::On } else { NrtMode::Off },
                nrt_advertised: kube_link::nrt::Advertised {
                    policy: "single-numa-node".into(),
                    // The fixture has no hugepages files: none published.
                    sysfs_root: util::fixture_dir(&o.fixture),
                    method: Default::default(),
                    informer: Default::default(),
                    fingerprint: kube_link::nrt::Fingerprint::Omitted,
                },
            };
            let (a, c, s) = (agent.clone(), client.clone(), shutdown.clone());
            tokio::spawn(kube_link::run_with_client(opts, a, c, s));
            // The DRA driver's slice publisher of the node (--dra-driver=on, no kubelet).
            let (a, c, s) = (agent.clone(), client.clone(), shutdown.clone());
            let level = tap_engine::topology::Level::Numa;
            tokio::spawn(node_agent::dra::run::publish_slices(
                node(i),
                level,
                a,
                c,
                s,
            ));
            agents.push(agent);
        }
        // Every node reported, then one usage interval for the start-up writes to settle.
        let t0 = Instant::now();
        loop {
            // Listing every object can time out while the links start: not yet.
            let got = match tokio::task::block_in_place(|| reported(k)) {
                Ok(got) => got,
                Err(e) => {
                    eprintln!("listing NodeTopologies: {e:#}");
                    0
                }
            };
            if got >= n {
                break;
            }
            if t0.elapsed() > Duration::from_secs(300) {
                bail!("only {got} of {n} nodes reported their status in 300 s");
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        eprintln!("{n} nodes reported in {:.1}s", t0.elapsed().as_secs_f64());
        // Every node's publisher has created its slice (the windows then count what follows).
        let t1 = Instant::now();
        while tokio::task::block_in_place(|| slices(k))? < n {
            if t1.elapsed() > Duration::from_secs(120) {
                bail!("fewer than {n} ResourceSlices after 120 s");
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        tokio::time::sleep(USAGE_MIN_INTERVAL + Duration::from_secs(2)).await;

        for &rate in std::iter::once(&0.0).chain(o.churn.iter()) {
            let stop = CancellationToken::new();
            if rate > 0.0 {
                tokio::spawn(churn(agents.clone(), rate, stop.clone()));
                tokio::time::sleep(USAGE_MIN_INTERVAL).await;
            }
            let w0 = tokio::task::block_in_place(|| writes(k))?;
            let start = Instant::now();
            tokio::time::sleep(o.window).await;
            let w1 = tokio::task::block_in_place(|| writes(k))?;
            let secs = start.elapsed().as_secs_f64();
            stop.cancel();
            let (w, r, slices) = (w1.0 - w0.0, w1.1 - w0.1, w1.2 - w0.2);
            let nrt = if o.nrt {
                format!("{:.2}", r / secs / n as f64 * 60.0)
            } else {
                "-".into()
            };
            println!(
                "| {n} | {rate} | {secs:.0} | {w:.0} | {:.2} | {:.3} | {:.2} | {nrt} | {slices:.0} |",
                w / secs,
                w / secs / n as f64 * 10.0,
                n as f64 / USAGE_MIN_INTERVAL.as_secs_f64()
            );
            // Let the last churn writes drain before the next row.
            tokio::time::sleep(USAGE_MIN_INTERVAL + Duration::from_secs(2)).await;
        }
    }
    shutdown.cancel();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_only_write_verbs_on_nodetopologies() {
        let m = r#"# HELP apiserver_request_total x
apiserver_request_total{code="200",resource="nodetopologies",subresource="status",verb="APPLY",version="v1alpha1"} 7
apiserver_request_total{code="404",resource="nodetopologies",subresource="status",verb="APPLY",version="v1alpha1"} 2
apiserver_request_total{code="200",resource="nodetopologies",subresource="",verb="WATCH",version="v1alpha1"} 50
apiserver_request_total{code="200",resource="nodetopologies",subresource="",verb="LIST",version="v1alpha1"} 5
apiserver_request_total{code="201",resource="nodetopologies",subresource="",verb="POST",version="v1alpha1"} 3
apiserver_request_total{code="200",resource="pods",subresource="",verb="PATCH",version="v1"} 100
apiserver_request_total{code="200",resource="noderesourcetopologies",subresource="",verb="APPLY",version="v1alpha2"} 4
"#;
        assert_eq!(count_writes(m, "nodetopologies"), 12.0);
        assert_eq!(count_writes(m, "noderesourcetopologies"), 4.0);
    }
}
