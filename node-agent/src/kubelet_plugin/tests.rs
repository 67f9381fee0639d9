//! The plugin over real Unix sockets, called as the kubelet calls it: a tonic client sending
//! the hand-written messages to the registration and DRA sockets.

use super::proto::*;
use super::*;
use client::channel;
use prost::Message;
use std::sync::Mutex;
use std::time::Duration;
use tonic::transport::Channel;

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

async fn call<Req, Resp>(ch: &Channel, method: &'static str, req: Req) -> Resp
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    client::call(ch, method, req)
        .await
        .unwrap_or_else(|s| panic!("{method}: {s}"))
}

fn claim(name: &str) -> Claim {
    Claim {
        namespace: "ns".into(),
        uid: format!("uid-{name}"),
        name: name.into(),
    }
}

/// The plugin's answer to a NodePrepareResources of the claims `names`.
async fn prepare(ch: &Channel, names: &[&str]) -> NodePrepareResourcesResponse {
    let claims = names.iter().map(|n| claim(n)).collect();
    call(
        ch,
        NODE_PREPARE_RESOURCES,
        NodePrepareResourcesRequest { claims },
    )
    .await
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
    let resp = prepare(&ch, &["good", "bad", "panics"]).await;
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
    let again = prepare(&ch, &["good"]).await;
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

/// An HPACK literal header field without indexing, with a literal name, no Huffman coding.
fn literal(block: &mut Vec<u8>, name: &str, value: &str) {
    block.push(0);
    for s in [name, value] {
        let len = u8::try_from(s.len()).expect("a short string");
        assert!(len < 127, "{s} needs a longer length prefix");
        block.push(len);
        block.extend_from_slice(s.as_bytes());
    }
}

/// An HTTP/2 frame: 24-bit length, type, flags, stream id.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len())
        .expect("a small frame")
        .to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// GetInfo as the kubelet's plugin watcher sends it: grpc-go dialled with the socket's bare path
/// puts that path in `:authority` (h2's server resets such a stream).
#[tokio::test]
async fn get_info_with_the_socket_path_as_authority() {
    use futures_util::StreamExt;
    use tokio::io::AsyncWriteExt;
    let p = Running::start("authority").await;
    let socket = p.paths.registration_socket(DRIVER);
    let mut io = tokio::net::UnixStream::connect(&socket)
        .await
        .expect("connect");
    let mut block = Vec::new();
    literal(&mut block, ":method", "POST");
    literal(&mut block, ":scheme", "http");
    literal(&mut block, ":path", GET_INFO);
    literal(&mut block, ":authority", &socket.display().to_string());
    literal(&mut block, "content-type", "application/grpc");
    literal(&mut block, "te", "trailers");
    let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    bytes.extend(h2_frame(0x4, 0, 0, &[]));
    bytes.extend(h2_frame(0x1, 0x4, 1, &block));
    bytes.extend(h2_frame(0x0, 0x1, 1, &[0, 0, 0, 0, 0]));
    io.write_all(&bytes).await.expect("write");
    let mut codec: h2::Codec<_, bytes::Bytes> = h2::Codec::new(io);
    let (mut status, mut data, mut grpc_status) = (None, Vec::new(), None);
    while let Some(f) = codec.next().await {
        match f.expect("a frame") {
            h2::frame::Frame::Headers(h) => {
                let end = h.is_end_stream();
                let (pseudo, fields) = h.into_parts();
                status = status.or(pseudo.status);
                grpc_status = grpc_status.or(fields.get("grpc-status").cloned());
                if end {
                    break;
                }
            }
            h2::frame::Frame::Data(d) => data.extend_from_slice(d.payload()),
            _ => {}
        }
    }
    assert_eq!(status.map(|s| s.as_u16()), Some(200));
    assert_eq!(grpc_status.as_ref().map(|v| v.as_bytes()), Some(&b"0"[..]));
    assert!(data.len() > 5 && data[0] == 0, "{data:?}");
    let info = PluginInfo::decode(&data[5..]).expect("PluginInfo");
    assert_eq!(info.name, DRIVER);
    assert_eq!(info.supported_versions, ["v1.DRAPlugin"]);
    p.stop().await;
}

#[tokio::test]
async fn an_unknown_method_is_unimplemented() {
    let p = Running::start("unknown").await;
    let ch = channel(p.paths.registration_socket(DRIVER));
    let r: Result<PluginInfo, _> =
        client::call(&ch, "/pluginregistration.Registration/Nope", InfoRequest {}).await;
    assert_eq!(
        r.map(|_| ()).unwrap_err().code(),
        tonic::Code::Unimplemented
    );
    p.stop().await;
}

/// A connection that never speaks holds up no other.
#[tokio::test]
async fn a_silent_connection_does_not_block_get_info() {
    let p = Running::start("silent").await;
    let socket = p.paths.registration_socket(DRIVER);
    let _silent = tokio::net::UnixStream::connect(&socket)
        .await
        .expect("connect");
    let ch = channel(socket);
    let info = tokio::time::timeout(
        Duration::from_secs(5),
        call::<_, PluginInfo>(&ch, GET_INFO, InfoRequest {}),
    )
    .await
    .expect("GetInfo within 5 s");
    assert_eq!(info.name, DRIVER);
    p.stop().await;
}
