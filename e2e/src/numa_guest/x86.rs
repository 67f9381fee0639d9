//! The x86 guest's checks: `--explain` on the live `/sys`, the guide's Pod on one node, memory
//! over nodes, an exclusive grant next to shared ones, a resize that moves pages, and
//! usage-aware rebalancing.

use super::*;
use vm::Shape;

/// Everything the x86 guest checks, in order; the last step restarts the agent with
/// rebalancing on.
pub(super) async fn checks(report: &mut Value) -> Result<()> {
    let shape = Shape::x86_two_sockets_four_nodes();
    let nodes = GuestNodes::read()?;
    report["nodes"] = nodes.report();
    explain_matches_shape(&shape, &nodes, report)?;
    let mut rig = Rig::start(&[], report).await?;
    let out = steps(&mut rig, &nodes, report).await;
    rig.finish(out)
}

async fn steps(rig: &mut Rig, nodes: &GuestNodes, report: &mut Value) -> Result<()> {
    let cri = &mut rig.cri;
    guide_pod_on_one_node(cri, nodes, report).await?;
    memory_over_nodes(cri, nodes, 400, report).await?;
    exclusive_next_to_shared(cri, 1, report).await?;
    resize_moves_pages(cri, nodes, report).await?;
    rig.cri.remove_all_pods().await?;
    rig.restart_agent(&["--rebalance=usage", "--rebalance-interval=1s"])?;
    rebalance_moves_pages(&mut rig.cri, nodes, report).await
}

/// `--explain` on the guest's live `/sys` names QEMU's shape: sockets, NUMA nodes, each
/// node's CPUs (as the kernel lists them) and distances.
fn explain_matches_shape(shape: &Shape, nodes: &GuestNodes, report: &mut Value) -> Result<()> {
    let out = Command::new(agent_bin()?)
        .args(["--explain", "--resource-policy=topology-aware"])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    ensure!(
        out.status.success(),
        "--explain failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    report["explain"] = json!(text);
    let head = format!(
        "topology: {} CPUs online, {} sockets,",
        shape.cpus(),
        shape.sockets
    );
    ensure!(text.contains(&head), "--explain lacks {head:?}:\n{text}");
    ensure!(
        text.contains(&format!("{} NUMA nodes", shape.nodes.len())),
        "--explain lacks the NUMA node count:\n{text}"
    );
    for (i, n) in shape.nodes.iter().enumerate() {
        let i = i as u32;
        let kernel_cpus = nodes
            .cpus
            .get(&(i as usize))
            .context("guest node missing")?;
        let qemu_cpus: BTreeSet<usize> = (n.cpus.0 as usize..=n.cpus.1 as usize).collect();
        ensure!(
            *kernel_cpus == qemu_cpus,
            "node {i}: kernel cpus {kernel_cpus:?}, QEMU {qemu_cpus:?}"
        );
        let dist: Vec<String> = (0..shape.nodes.len() as u32)
            .map(|j| shape.distance(i, j).to_string())
            .collect();
        let line = format!("numa node {i}: cpus [{}-{}]", n.cpus.0, n.cpus.1);
        let found = text
            .lines()
            .find(|l| l.trim_start().starts_with(&line))
            .with_context(|| format!("--explain lacks {line:?}:\n{text}"))?;
        let want = format!("distances [{}]", dist.join(" "));
        ensure!(found.contains(&want), "{found:?} lacks {want:?}");
    }
    Ok(())
}

/// The guide's Pod shape (Burstable, 1 CPU requested, 2 limit, 256 MiB) lands on one NUMA node:
/// its cgroup holds exactly that node's CPUs and memory node, and its pages are there.
async fn guide_pod_on_one_node(
    cri: &mut Cri,
    nodes: &GuestNodes,
    report: &mut Value,
) -> Result<()> {
    let (_, at) = guide_shaped_pod(cri, "guide", report).await?;
    let node = nodes.exactly(&at.cpus).with_context(|| {
        format!(
            "cpuset {:?} is not one NUMA node's CPUs {:?}",
            at.cpus, nodes.cpus
        )
    })?;
    memory_on_node(&at.mems, &at.pages, node)
}

/// A resize that no longer fits the container's NUMA node moves it to another one (the engine
/// keeps a resized container where it is while it fits): its cgroup's CPUs and memory node
/// change, and its pages follow (cgroup v2 migrates a cgroup's pages when `cpuset.mems`
/// changes). The layout is made with the engine's own rules: one container per node, a second
/// one on the mover's node, one node emptied, then the mover grows.
async fn resize_moves_pages(cri: &mut Cri, nodes: &GuestNodes, report: &mut Value) -> Result<()> {
    cri.remove_all_pods().await?;
    let mover = run(
        cri,
        "mover",
        CgroupQos::Burstable,
        &toucher("app", 1000, 2000, 256 * MIB, 64)?,
    )
    .await?;
    let home = node_of(nodes, mover.pid)?;
    let mut fillers = Vec::new();
    for i in 0..nodes.cpus.len() - 1 {
        let mut f = ContainerSpec::cpus("fill", 1000, Some(2000));
        f.memory_limit_bytes = Some(32 * MIB as i64);
        let p = run(cri, &format!("fill{i}"), CgroupQos::Burstable, &f).await?;
        fillers.push((node_of(nodes, p.pid)?, p));
    }
    let mut c = ContainerSpec::cpus("second", 1000, Some(1000));
    c.memory_limit_bytes = Some(32 * MIB as i64);
    let second = run(cri, "second", CgroupQos::Burstable, &c).await?;
    let second_node = node_of(nodes, second.pid)?;
    ensure!(
        second_node == home,
        "layout: the second container went to node {second_node}, not the mover's node {home} (fillers on {:?})",
        fillers.iter().map(|(n, _)| *n).collect::<Vec<_>>()
    );
    // Empty one node: the one whose filler is removed.
    let (freed, last) = fillers.pop().context("no filler")?;
    cri.stop_container(&last.id).await?;
    cri.remove_container(&last.id).await?;
    let before = touched_pages(mover.pid, 64)?;
    let mut grown = toucher("app", 1500, 2000, 256 * MIB, 64)?;
    grown.cpu_request_milli = Some(1500);
    cri.update_resources(&mover.id, grown.resources()).await?;
    let cpus = parse_list(&cgroup_cpuset(mover.pid)?)?;
    let mems = parse_list(&cgroup_mems(mover.pid)?)?;
    let after = pages_after_move(mover.pid, 64, &mems).await?;
    report["resize"] = json!({
        "before": {"node": home, "numa_maps_anon_pages": before},
        "after": {"cpuset.cpus": list(&cpus), "cpuset.mems": list(&mems), "numa_maps_anon_pages": after},
        "emptied_node": freed,
    });
    ensure!(
        nodes.exactly(&cpus) == Some(freed),
        "the grown container's cpuset {cpus:?}: not node {freed}'s CPUs"
    );
    memory_on_node(&mems, &after, freed)
}
