//! The plugin over real Unix sockets, called as the kubelet calls it: a tonic client sending
//! the hand-written messages to the registration and DRA sockets.

use super::proto::*;
use super::*;
use hyper_util::rt::TokioIo;
use std::sync::Mutex;
use std::time::Duration;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint, Uri};

/// A driver that fails claims named `bad`, panics on claims named `panics`, gives every other
/// claim one device named after it, and records what it was asked to unprepare.
#[derive(Default)]
struct FakeDriver {
    unprepared: Mutex<Vec<ClaimRef>>,
}

#[derive(Debug, thiserror::Error)]
#[error("no such claim here")]
struct Inner;

#[derive(Debug, thiserror::Error)]
#[error("claim {0} cannot be prepared")]
struct FakeError(String, #[source] Inner);

#[async_trait::async_trait]
impl DraDriver for FakeDriver {
    type Error = FakeError;

    async fn prepare(&self, claim: &ClaimRef) -> Result<Vec<PreparedDevice>, FakeError> {
        match claim.name.as_str() {
            "bad" => Err(FakeError(claim.name.clone(), Inner)),
            "panics" => panic!("the fake driver panics"),
            name => Ok(vec![PreparedDevice {
                requests: vec!["req".into()],
                pool: "pool-a".into(),
                device: format!("dev-{name}"),
                cdi_device_ids: vec![format!("example.com/dev={name}")],
            }]),
        }
    }

    async fn unprepare(&self, claim: &ClaimRef) -> Result<(), FakeError> {
        if claim.name == "bad" {
            return Err(FakeError(claim.name.clone(), Inner));
        }
        self.unprepared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(claim.clone());
        Ok(())
    }
}

const DRIVER: &str = "test.example.com";

struct Running {
    paths: PluginPaths,
    driver: Arc<FakeDriver>,
    status: watch::Receiver<RegistrationState>,
    stop: CancellationToken,
    served: tokio::task::JoinHandle<Result<(), PluginError>>,
}

impl Running {
    async fn start(tag: &str) -> Running {
        let root = std::env::temp_dir().join(format!("tap-drap-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let paths = PluginPaths::under_kubelet_root(&root, DRIVER);
        let driver = Arc::new(FakeDriver::default());
        let (tx, status) = watch::channel(RegistrationState::Waiting);
        let stop = CancellationToken::new();
        let served = tokio::spawn({
            let (paths, driver, stop) = (paths.clone(), driver.clone(), stop.clone());
            async move { serve_with_status(DRIVER, &paths, driver, stop, tx).await }
        });
        let reg = paths.registration_socket(DRIVER);
        for _ in 0..200 {
            if reg.exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(reg.exists(), "no registration socket at {}", reg.display());
        Running {
            paths,
            driver,
            status,
            stop,
            served,
        }
    }

    async fn stop(self) {
        self.stop.cancel();
        let r = tokio::time::timeout(Duration::from_secs(10), self.served).await;
        assert!(matches!(r, Ok(Ok(Ok(())))), "serve ended with {r:?}");
        assert!(!self.paths.registration_socket(DRIVER).exists());
        assert!(!self.paths.dra_socket().exists());
        let _ = std::fs::remove_dir_all(self.paths.registry_dir.parent().unwrap());
    }
}

fn channel(socket: std::path::PathBuf) -> Channel {
    Endpoint::from_static("http://[::]:50051").connect_with_connector_lazy(tower::service_fn(
        move |_: Uri| {
            let p = socket.clone();
            async move { tokio::net::UnixStream::connect(p).await.map(TokioIo::new) }
        },
    ))
}

async fn call<Req, Resp>(ch: &Channel, method: &'static str, req: Req) -> Resp
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let mut grpc = tonic::client::Grpc::new(ch.clone());
    grpc.ready().await.expect("the plugin's socket");
    let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
    grpc.unary(
        tonic::Request::new(req),
        PathAndQuery::from_static(method),
        codec,
    )
    .await
    .unwrap_or_else(|s| panic!("{method}: {s}"))
    .into_inner()
}

fn claim(name: &str) -> Claim {
    Claim {
        namespace: "ns".into(),
        uid: format!("uid-{name}"),
        name: name.into(),
    }
}

#[tokio::test]
async fn get_info_names_the_driver_its_socket_and_the_v1_service() {
    let p = Running::start("info").await;
    let ch = channel(p.paths.registration_socket(DRIVER));
    let info: PluginInfo = call(&ch, GET_INFO, InfoRequest {}).await;
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, DRIVER);
    assert_eq!(info.endpoint, p.paths.dra_socket().display().to_string());
    assert!(info
        .endpoint
        .ends_with("/plugins/test.example.com/dra.sock"));
    assert_eq!(info.supported_versions, ["v1.DRAPlugin"]);
    p.stop().await;
}

#[tokio::test]
async fn one_claims_failure_is_its_own_and_the_others_are_prepared() {
    let p = Running::start("prepare").await;
    let ch = channel(p.paths.dra_socket());
    let req = NodePrepareResourcesRequest {
        claims: vec![claim("good"), claim("bad"), claim("panics")],
    };
    let resp: NodePrepareResourcesResponse = call(&ch, NODE_PREPARE_RESOURCES, req).await;
    assert_eq!(resp.claims.len(), 3, "{resp:?}");
    let good = &resp.claims["uid-good"];
    assert!(good.error.is_empty(), "{good:?}");
    let want = Device {
        request_names: vec!["req".into()],
        pool_name: "pool-a".into(),
        device_name: "dev-good".into(),
        cdi_device_ids: vec!["example.com/dev=good".into()],
        share_id: None,
    };
    assert_eq!(good.devices, [want]);
    let bad = &resp.claims["uid-bad"];
    assert!(bad.devices.is_empty());
    assert_eq!(
        bad.error,
        "claim bad cannot be prepared: no such claim here"
    );
    let panicked = &resp.claims["uid-panics"];
    assert!(panicked.devices.is_empty());
    assert!(panicked.error.contains("panic"), "{panicked:?}");
    // The server is still there after a driver's panic.
    let again: NodePrepareResourcesResponse = call(
        &ch,
        NODE_PREPARE_RESOURCES,
        NodePrepareResourcesRequest {
            claims: vec![claim("good")],
        },
    )
    .await;
    assert!(again.claims["uid-good"].error.is_empty());
    p.stop().await;
}

#[tokio::test]
async fn unprepare_hands_each_claim_to_the_driver() {
    let p = Running::start("unprepare").await;
    let ch = channel(p.paths.dra_socket());
    let req = NodeUnprepareResourcesRequest {
        claims: vec![claim("a"), claim("bad")],
    };
    let resp: NodeUnprepareResourcesResponse = call(&ch, NODE_UNPREPARE_RESOURCES, req).await;
    assert_eq!(resp.claims["uid-a"].error, "");
    assert!(resp.claims["uid-bad"].error.contains("cannot be prepared"));
    let seen = p.driver.unprepared.lock().unwrap().clone();
    assert_eq!(
        seen,
        [ClaimRef {
            namespace: "ns".into(),
            uid: "uid-a".into(),
            name: "a".into()
        }]
    );
    p.stop().await;
}

#[tokio::test]
async fn registration_status_from_the_kubelet_is_published() {
    let mut p = Running::start("status").await;
    assert_eq!(*p.status.borrow(), RegistrationState::Waiting);
    let ch = channel(p.paths.registration_socket(DRIVER));
    let refused = RegistrationStatus {
        plugin_registered: false,
        error: "none of the services are supported".into(),
    };
    let _: RegistrationStatusResponse = call(&ch, NOTIFY_REGISTRATION_STATUS, refused).await;
    p.status.changed().await.expect("a status");
    assert_eq!(
        *p.status.borrow_and_update(),
        RegistrationState::Refused("none of the services are supported".into())
    );
    let ok = RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    };
    let _: RegistrationStatusResponse = call(&ch, NOTIFY_REGISTRATION_STATUS, ok).await;
    p.status.changed().await.expect("a status");
    assert_eq!(*p.status.borrow(), RegistrationState::Registered);
    p.stop().await;
}

#[tokio::test]
async fn a_bad_driver_name_is_refused_before_any_socket() {
    let root = std::env::temp_dir().join(format!("tap-drap-name-{}", std::process::id()));
    let paths = PluginPaths::under_kubelet_root(&root, "x");
    for name in ["", "Upper.example.com", "a/b", "-a", "a..b", "a."] {
        let r = serve(
            name,
            &paths,
            Arc::new(FakeDriver::default()),
            CancellationToken::new(),
        )
        .await;
        assert!(
            matches!(r, Err(PluginError::BadDriverName(_))),
            "{name:?}: {r:?}"
        );
    }
    assert!(!root.exists());
}

#[test]
fn dns_subdomains() {
    for ok in [
        "accel.example.com",
        "a",
        "dra.tap.kunpeng.huawei.com",
        "a-b.c9",
    ] {
        assert!(is_dns_subdomain(ok), "{ok}");
    }
    assert!(!is_dns_subdomain(&"a".repeat(254)));
}
