//! CRI proxy mode (`--container-runtime-mode=Containerd`) against a real containerd 1.7 with
//! CRI, driven by a real CRI client (k8s-cri / tonic) through the proxy socket.
//!
//! Uses the shared containerd harness (`tap_e2e::containerd`, hack/e2e/setup-containerd.sh)
//! with NRI off, and the agent launcher from `tap_e2e::docker`. Decisions are made on the
//! 96-CPU fixture and folded onto this host (`--fold-cpus-to-host`).

use anyhow::{ensure, Context, Result};
use k8s_cri::v1 as cri;
use std::path::Path;
use std::time::{Duration, Instant};
use tap_e2e::containerd::{
    cgroup_cpuset, timed_with_containerd, CgroupQos, ContainerSpec, Containerd, ContainerdOptions,
    Cri, PodSpec, BUSYBOX_IMAGE,
};
use tap_e2e::docker::TapAgent;
use tap_e2e::text::all_at;

const GRANT_KEY: &str = "tap.kunpeng.huawei.com/grant";
const FIXTURE: &str = "synthetic-2s-4numa-96c-gpu";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
async fn cri_proxy_places_passes_through_and_survives_restart() -> Result<()> {
    tap_e2e::util::require_e2e_tier();
    let opts = ContainerdOptions::without_nri();
    timed_with_containerd("CRI proxy e2e", "tap-crip", opts, scenario).await
}

async fn scenario(ctd: &mut Containerd, dir: &Path) -> Result<()> {
    let proxy = dir.join("cri-proxy.sock");
    let args = ctd.cri_proxy_agent_args(&proxy, Some(FIXTURE), &dir.join("state"));
    let log = dir.join("agent.log");
    let mut agent = TapAgent::start(&args, &log)?;
    let mut cri = Cri::connect(&proxy).await?;

    // ImageService passes through.
    let ch = tap_e2e::containerd::unix_channel(&proxy).await?;
    let mut images = cri::image_service_client::ImageServiceClient::new(ch.clone());
    let list = images
        .list_images(cri::ListImagesRequest::default())
        .await?
        .into_inner();
    ensure!(
        list.images
            .iter()
            .any(|i| i.repo_tags.iter().any(|t| t.contains(BUSYBOX_IMAGE))),
        "busybox image not listed through the proxy: {list:?}"
    );

    // Calls this build does not model pass through to the runtime untouched: the v1alpha2 API
    // containerd 1.7 still serves, and a method no runtime has (containerd itself answers).
    let mut raw = tonic::client::Grpc::new(ch.clone());
    raw.ready().await.context("raw gRPC client")?;
    let v: cri::VersionResponse = raw
        .unary(
            tonic::Request::new(cri::VersionRequest {
                version: "0.1.0".into(),
            }),
            tonic::codegen::http::uri::PathAndQuery::from_static(
                "/runtime.v1alpha2.RuntimeService/Version",
            ),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .context("v1alpha2 Version through the proxy")?
        .into_inner();
    assert_eq!(v.runtime_name, "containerd", "{v:?}");
    raw.ready().await.context("raw gRPC client")?;
    let unknown = raw
        .unary::<_, cri::VersionResponse, _>(
            tonic::Request::new(cri::VersionRequest::default()),
            tonic::codegen::http::uri::PathAndQuery::from_static(
                "/runtime.v1.RuntimeService/NoSuchMethod",
            ),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .expect_err("an unknown method cannot succeed");
    assert_eq!(unknown.code(), tonic::Code::Unimplemented, "{unknown:?}");
    assert!(
        unknown.message().contains("NoSuchMethod"),
        "not the runtime's own answer: {unknown:?}"
    );

    // Server-streaming GetContainerEvents passes through: an event arrives for a new sandbox.
    // (containerd sends the response headers with the first event, so the call runs aside.)
    let mut ev_client = cri::runtime_service_client::RuntimeServiceClient::new(ch);
    let events = tokio::spawn(async move {
        let mut s = ev_client
            .get_container_events(cri::GetEventsRequest::default())
            .await?
            .into_inner();
        s.message().await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Burstable 4/8: a NUMA node's CPUs (folded), and the grant record annotation.
    let web = PodSpec::new("web", CgroupQos::Burstable).label("app", "web");
    let sb1 = cri.run_pod(&web).await?;
    let c1 = cri
        .run_container(&sb1, &ContainerSpec::cpus("app", 4000, Some(8000)))
        .await?;
    let set1 = cri.spec_cpuset(&c1).await?;
    ensure!(!set1.is_empty(), "no cpuset in the OCI spec");
    assert_eq!(cgroup_cpuset(cri.pid(&c1).await?)?, set1);
    // The record is a CRI annotation of the container (what ContainerStatus gives back).
    let (st, _) = cri.container_status(&c1).await?;
    let rec1 = st.annotations.get(GRANT_KEY).cloned().unwrap_or_default();
    assert!(
        rec1.starts_with("v1;"),
        "grant annotation missing: {:?}",
        st.annotations
    );

    // Guaranteed 1 CPU: one exclusive CPU (a single host CPU after the fold).
    let db = PodSpec::new("db", CgroupQos::Guaranteed);
    let sb2 = cri.run_pod(&db).await?;
    let c2 = cri
        .run_container(&sb2, &ContainerSpec::cpus("db", 1000, Some(1000)))
        .await?;
    let set2 = cri.spec_cpuset(&c2).await?;
    assert!(
        set2.parse::<u32>().is_ok(),
        "expected one CPU, got {set2:?}"
    );
    assert_eq!(cgroup_cpuset(cri.pid(&c2).await?)?, set2);

    // Opted out: untouched.
    let skip =
        PodSpec::new("skipme", CgroupQos::Burstable).label("tap.kunpeng.huawei.com/skip", "1");
    let sb3 = cri.run_pod(&skip).await?;
    let c3 = cri
        .run_container(&sb3, &ContainerSpec::cpus("app", 2000, Some(4000)))
        .await?;
    assert_eq!(cri.spec_cpuset(&c3).await?, "");
    assert!(!cri
        .container_status(&c3)
        .await?
        .0
        .annotations
        .contains_key(GRANT_KEY));
    assert_eq!(agent.accounted_on("numa")?, 2);
    // The event stream saw at least one of the three Pods' events (read now, so a stream that
    // opened late still had two more Pods to report).
    let ev = tokio::time::timeout(Duration::from_secs(10), events)
        .await
        .context("no container event through the proxy")?
        .context("event task")?
        .context("GetContainerEvents through the proxy")?;
    let ev = ev.context("event stream ended")?;
    assert!(!ev.container_id.is_empty(), "{ev:?}");

    // The proxy mode's metrics: the proxy gauge says it serves, the build info the mode.
    let m = agent.metrics()?;
    assert!(
        m.lines().any(|l| l == "tap_proxy_up 1"),
        "tap_proxy_up:\n{m}"
    );
    assert!(
        m.lines().any(|l| l.starts_with("tap_build_info{")
            && l.contains("mode=\"Containerd\"")
            && l.ends_with(" 1")),
        "tap_build_info:\n{m}"
    );

    // UpdateContainerResources through the proxy: re-placed for 8/16.
    let mut r = ContainerSpec::cpus("app", 8000, Some(16000)).resources();
    r.cpuset_cpus = String::new();
    cri.update_resources(&c1, r).await?;
    let usage: Vec<String> = agent
        .state()?
        .into_iter()
        .filter(|l| l.starts_with("tap_topology_node_usage_cpus{") && l.contains("numa"))
        .collect();
    assert!(
        usage.iter().any(|l| l.ends_with(" 8.0")),
        "no NUMA pool shows 8 CPUs after the update: {usage:?}"
    );
    assert_eq!(
        cgroup_cpuset(cri.pid(&c1).await?)?,
        cri.spec_cpuset(&c1).await?
    );

    // Restart the agent: same state, rebuilt from the records (the updated one included).
    // An open GetContainerEvents stream (the kubelet keeps one) does not hold the exit up
    // beyond the graceful timeout (2 s here).
    let mut watcher = cri::runtime_service_client::RuntimeServiceClient::new(
        tap_e2e::containerd::unix_channel(&proxy).await?,
    );
    let mut held = watcher
        .get_container_events(cri::GetEventsRequest::default())
        .await?
        .into_inner();
    let before = agent.state()?;
    let stopping = Instant::now();
    let st = agent.stop();
    let took = stopping.elapsed();
    assert!(
        st.map(|s| s.success()).unwrap_or(false),
        "unclean exit: {st:?}"
    );
    eprintln!("agent exit took {took:?}");
    assert!(took < Duration::from_secs(8), "exit took {took:?}");
    // Events already relayed may still be buffered; then the stream ends.
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(Some(_)) = held.message().await {}
    })
    .await;
    assert!(ended.is_ok(), "the event stream outlived the proxy");
    drop(agent);
    let mut agent = TapAgent::start(&args, &log)?;
    assert_eq!(before, agent.state()?, "state changed across a restart");
    let text = tap_e2e::util::strip_ansi(&std::fs::read_to_string(&log)?);
    assert!(
        text.contains("from_record=2"),
        "restore did not use the records"
    );
    let mut cri = Cri::connect(&proxy).await?;

    // containerd restarts under the proxy: the proxy reconnects, the kubelet's calls go on.
    let restarting = Instant::now();
    ctd.restart()?;
    eprintln!("containerd restart took {:?}", restarting.elapsed());
    let mut through = cri::runtime_service_client::RuntimeServiceClient::new(
        tap_e2e::containerd::unix_channel(&proxy).await?,
    );
    let until = Instant::now() + Duration::from_secs(15);
    loop {
        match through.version(cri::VersionRequest::default()).await {
            Ok(_) => break,
            Err(e) if Instant::now() < until && e.code() == tonic::Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => {
                return Err(e).context("Version through the proxy after a containerd restart")
            }
        }
    }
    eprintln!(
        "calls go through the proxy again {:?} after the restart began",
        restarting.elapsed()
    );
    // Compare after a periodic reconcile (every 5 s) that listed the restarted containerd: it
    // would release grants of containers the runtime lost.
    let seen = agent.reconciles_ok()?;
    let until = Instant::now() + Duration::from_secs(20);
    while agent.reconciles_ok()? <= seen {
        ensure!(
            Instant::now() < until,
            "no reconcile with the restarted containerd"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        before,
        agent.state()?,
        "state changed across a containerd restart"
    );

    // Stop releases; remove is idempotent.
    cri.stop_container(&c1).await?;
    let until = Instant::now() + Duration::from_secs(10);
    while agent.accounted_on("numa")? != 1 {
        ensure!(Instant::now() < until, "not released at StopContainer");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cri.remove_container(&c1).await?;
    assert_eq!(agent.accounted_on("numa")?, 1);
    cri.stop_container(&c2).await?;
    cri.remove_container(&c2).await?;
    assert_eq!(agent.accounted_on("numa")?, 0);
    let state = agent.state()?;
    assert!(
        all_at(&state, "tap_topology_node_usage_cpus{", "0.0"),
        "usage left: {state:?}"
    );
    for sb in [sb1, sb2, sb3] {
        cri.remove_pod(&sb).await?;
    }
    agent.stop();
    Ok(())
}
