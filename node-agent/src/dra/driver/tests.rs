//! The driver's calls on a real agent (the 4-NUMA GPU fixture), a claim from a map instead of
//! the API server, the checkpoint and the CDI folder in a temporary folder.

use super::*;
use crate::agent::tests::agent;
use crate::dra::source::ClaimSource;
use k8s_openapi::api::resource::v1::ResourceClaim;
use std::path::PathBuf;

const NODE: &str = "node-a";

struct Claims(Vec<ResourceClaim>);

#[async_trait::async_trait]
impl ClaimSource for Claims {
    async fn claim(&self, c: &ClaimRef) -> Result<ResourceClaim, PrepareError> {
        self.0
            .iter()
            .find(|rc| rc.metadata.name.as_deref() == Some(c.name.as_str()))
            .cloned()
            .ok_or(PrepareError::NoApiServer)
    }
}

fn allocated(name: &str, device: &str, cpus: &str) -> ResourceClaim {
    crate::dra::ask::allocated(&claim_ref(name), NODE, device, &[("cpu", cpus)])
}

fn claim_ref(name: &str) -> ClaimRef {
    ClaimRef {
        namespace: "ns".into(),
        uid: format!("uid-{name}"),
        name: name.into(),
    }
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tap-driver-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn driver(dir: &std::path::Path, claims: Vec<ResourceClaim>) -> TapDriver {
    TapDriver::new(
        Arc::new(agent("synthetic-2s-4numa-96c-gpu")),
        Box::new(Claims(claims)),
        NODE.into(),
        StateFile::new(dir.join("dra-claims.json")),
    )
    .with_cdi(Some(CdiDir(dir.join("cdi"))))
}

fn cdi_files(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir.join("cdi"))
        .map(|d| {
            d.map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[tokio::test]
async fn prepare_names_the_claims_cdi_device_and_unprepare_removes_it() {
    let dir = scratch("cdi");
    let d = driver(&dir, vec![allocated("a", "numa3", "4")]);
    let devices = d.prepare(&claim_ref("a")).await.expect("prepared");
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].device, "numa3");
    assert_eq!(
        devices[0].cdi_device_ids,
        ["dra.tap.kunpeng.io/claim=uid-a"]
    );
    assert_eq!(cdi_files(&dir), ["dra.tap.kunpeng.io-uid-a.json"]);
    let spec: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.join("cdi/dra.tap.kunpeng.io-uid-a.json")).expect("spec"),
    )
    .expect("json");
    let g = d.agent.claim_of("uid-a").expect("booked");
    assert_eq!(g.cpus.len(), 4);
    let env = &spec["devices"][0]["containerEdits"]["env"];
    assert_eq!(env[0], format!("TAP_DRA_CPUS={}", g.cpus));
    assert_eq!(env[1], "TAP_DRA_MEMS=3");

    // The kubelet repeats the call: the same answer, one booking, the spec written again.
    std::fs::remove_file(dir.join("cdi/dra.tap.kunpeng.io-uid-a.json")).expect("rm");
    assert_eq!(d.prepare(&claim_ref("a")).await.expect("again"), devices);
    assert_eq!(d.agent.claims().len(), 1);
    assert_eq!(cdi_files(&dir), ["dra.tap.kunpeng.io-uid-a.json"]);

    d.unprepare(&claim_ref("a")).await.expect("unprepared");
    d.unprepare(&claim_ref("a"))
        .await
        .expect("unprepared again");
    assert!(d.agent.claims().is_empty());
    assert!(cdi_files(&dir).is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_claim_whose_cdi_spec_cannot_be_written_is_not_booked() {
    let dir = scratch("cdi-refused");
    std::fs::create_dir_all(&dir).expect("mkdir");
    // A file where the CDI folder should be: the spec cannot be written.
    std::fs::write(dir.join("cdi"), "not a folder").expect("file");
    let d = driver(&dir, vec![allocated("a", "numa0", "2")]);
    let e = d.prepare(&claim_ref("a")).await.expect_err("refused");
    assert!(matches!(e, PrepareError::Cdi(_)), "{e}");
    assert!(d.agent.claims().is_empty(), "nothing booked");
    let cp: checkpoint::Checkpoint = d.checkpoint.load_as().expect("checkpoint");
    assert!(cp.claims.is_empty(), "nothing in the checkpoint: {cp:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_claim_of_another_nodes_pool_is_refused_and_nothing_is_booked() {
    let dir = scratch("foreign");
    let mut rc = allocated("a", "numa0", "2");
    if let Some(r) = rc
        .status
        .as_mut()
        .and_then(|s| s.allocation.as_mut())
        .and_then(|a| a.devices.as_mut())
        .and_then(|d| d.results.as_mut())
    {
        r[0].pool = "node-b".into();
    }
    let d = driver(&dir, vec![rc]);
    let e = d.prepare(&claim_ref("a")).await.expect_err("refused");
    assert_eq!(
        e.to_string(),
        "device numa0 of pool node-b is not a CPU group of this node"
    );
    assert!(d.agent.claims().is_empty());
    assert!(cdi_files(&dir).is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}
