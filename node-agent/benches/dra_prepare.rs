//! What the kubelet waits for when it prepares a claim of this driver: a NodePrepareResources
//! call over the DRA socket (tonic, a Unix socket), the claim read from a [`ClaimSource`] (a
//! map here: the API server's read is not in these figures), checked, booked on the engine and
//! written to the checkpoint (fsync, in the system's temporary folder), and the
//! NodeUnprepareResources that gives the CPUs back.
//!
//! The node: the 384-thread fixture with 1,000 Burstable containers; the claim: 4 CPUs and
//! 256 MiB of `numa0`. Besides criterion's means, each run prints the prepare call's
//! percentiles over [`SAMPLES`] calls: over gRPC and in process (the driver alone), each with
//! the checkpoint on the disk and on tmpfs (without the disk's share).

// The ledger of the benches; `cgroup_dir` is the read-back bench's.
#[allow(dead_code)]
mod support;

use criterion::{criterion_group, criterion_main, Criterion};
use k8s_openapi::api::resource::v1::ResourceClaim;
use node_agent::dra::driver::TapDriver;
use node_agent::dra::source::ClaimSource;
use node_agent::dra::{PrepareError, DRIVER};
use node_agent::kubelet_plugin::client::{self, channel};
use node_agent::kubelet_plugin::proto::*;
use node_agent::kubelet_plugin::{self, ClaimRef, DraDriver, PluginPaths};
use node_agent::ledger::state_file::StateFile;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

const NODE: &str = "bench-node";
const SAMPLES: usize = 2000;

/// The one claim of the bench, allocated 4 CPUs and 256 MiB of `numa0` by the "scheduler".
struct OneClaim(ResourceClaim);

#[async_trait::async_trait]
impl ClaimSource for OneClaim {
    async fn claim(&self, _: &ClaimRef) -> Result<ResourceClaim, PrepareError> {
        Ok(self.0.clone())
    }
}

fn allocated_claim() -> ResourceClaim {
    node_agent::dra::ask::allocated(
        &claim_ref(),
        NODE,
        "numa0",
        &[("cpu", "4"), ("memory", "256Mi")],
    )
}

fn claim_ref() -> ClaimRef {
    ClaimRef {
        namespace: "default".into(),
        uid: "uid-bench".into(),
        name: "bench".into(),
    }
}

/// Where the checkpoint is written: the disk's fsync is most of a prepare's time.
#[derive(Clone, Copy)]
enum Checkpoint {
    /// The system's temporary folder, on the machine's disk.
    Disk,
    /// `/dev/shm`: what a prepare costs without the disk.
    Tmpfs,
}

fn bench_dir(at: Checkpoint) -> std::path::PathBuf {
    let d = match at {
        Checkpoint::Disk => {
            std::env::temp_dir().join(format!("tap-bench-dra-prepare-{}", std::process::id()))
        }
        Checkpoint::Tmpfs => support::scratch("dra-prepare"),
    };
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("bench folder");
    d
}

fn driver(l: &node_agent::ledger::Ledger, dir: &std::path::Path) -> Arc<TapDriver> {
    Arc::new(TapDriver::new(
        l.agent().clone(),
        Box::new(OneClaim(allocated_claim())),
        NODE.into(),
        StateFile::new(dir.join("dra-claims.json")),
    ))
}

fn sample<F: std::future::Future<Output = Duration>>(
    rt: &tokio::runtime::Runtime,
    mut round: impl FnMut() -> F,
) -> Vec<Duration> {
    rt.block_on(async {
        let mut v = Vec::with_capacity(SAMPLES);
        for _ in 0..SAMPLES {
            v.push(round().await);
        }
        v
    })
}

async fn call<Req, Resp>(ch: &Channel, method: &'static str, req: Req) -> Resp
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    client::call(ch, method, req).await.expect(method)
}

fn wire_claim() -> Claim {
    let c = claim_ref();
    Claim {
        namespace: c.namespace,
        uid: c.uid,
        name: c.name,
    }
}

/// One prepare over gRPC (timed) and the unprepare after it (not timed).
async fn grpc_round(ch: &Channel) -> Duration {
    let start = Instant::now();
    let p: NodePrepareResourcesResponse = call(
        ch,
        NODE_PREPARE_RESOURCES,
        NodePrepareResourcesRequest {
            claims: vec![wire_claim()],
        },
    )
    .await;
    let took = start.elapsed();
    let one = &p.claims["uid-bench"];
    assert!(one.error.is_empty() && one.devices.len() == 1, "{p:?}");
    let u: NodeUnprepareResourcesResponse = call(
        ch,
        NODE_UNPREPARE_RESOURCES,
        NodeUnprepareResourcesRequest {
            claims: vec![wire_claim()],
        },
    )
    .await;
    assert!(u.claims["uid-bench"].error.is_empty(), "{u:?}");
    took
}

/// One prepare in process (timed) and its unprepare.
async fn direct_round(d: &TapDriver) -> Duration {
    let start = Instant::now();
    let devices = d.prepare(&claim_ref()).await.expect("prepared");
    let took = start.elapsed();
    assert_eq!(devices.len(), 1);
    d.unprepare(&claim_ref()).await.expect("unprepared");
    took
}

fn percentiles(what: &str, mut v: Vec<Duration>) {
    v.sort();
    let at = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)].as_secs_f64() * 1e6;
    println!(
        "dra_prepare/{what}: {} prepares: p50 {:.0} µs, p90 {:.0} µs, p99 {:.0} µs, max {:.0} µs",
        v.len(),
        at(0.50),
        at(0.90),
        at(0.99),
        at(1.0)
    );
}

/// Serves `driver`'s kubelet plugin under `dir` until `stop`; a channel to its DRA socket.
fn serve(
    rt: &tokio::runtime::Runtime,
    driver: Arc<TapDriver>,
    dir: &std::path::Path,
    stop: &CancellationToken,
) -> Channel {
    let paths = PluginPaths::under_kubelet_root(&dir.join("kubelet"), DRIVER);
    rt.spawn({
        let (paths, stop) = (paths.clone(), stop.clone());
        async move { kubelet_plugin::serve(DRIVER, &paths, driver, stop).await }
    });
    rt.block_on(async {
        while !paths.dra_socket().exists() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        channel(paths.dra_socket())
    })
}

fn prepare(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let l = support::ledger(1000, &rt);
    let (disk, shm) = (bench_dir(Checkpoint::Disk), bench_dir(Checkpoint::Tmpfs));
    let (on_disk, on_shm) = (driver(&l, &disk), driver(&l, &shm));
    let stop = CancellationToken::new();
    let disk_ch = serve(&rt, on_disk.clone(), &disk, &stop);
    let shm_ch = serve(&rt, on_shm.clone(), &shm, &stop);
    let mut g = support::group(c, "dra_prepare");
    g.bench_function("grpc_prepare_unprepare", |b| {
        b.iter(|| rt.block_on(grpc_round(&disk_ch)))
    });
    g.bench_function("grpc_prepare_unprepare_tmpfs", |b| {
        b.iter(|| rt.block_on(grpc_round(&shm_ch)))
    });
    g.bench_function("direct_prepare_unprepare_tmpfs", |b| {
        b.iter(|| rt.block_on(direct_round(&on_shm)))
    });
    g.finish();
    percentiles("grpc, disk", sample(&rt, || grpc_round(&disk_ch)));
    percentiles("direct, disk", sample(&rt, || direct_round(&on_disk)));
    percentiles("grpc, tmpfs", sample(&rt, || grpc_round(&shm_ch)));
    percentiles("direct, tmpfs", sample(&rt, || direct_round(&on_shm)));
    stop.cancel();
    let _ = std::fs::remove_dir_all(&disk);
    let _ = std::fs::remove_dir_all(&shm);
}

criterion_group!(benches, prepare);
criterion_main!(benches);
