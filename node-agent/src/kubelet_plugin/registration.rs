//! The `pluginregistration.Registration` service the kubelet's plugin watcher calls on the
//! registration socket: GetInfo names the driver and its DRA socket, NotifyRegistrationStatus
//! says whether the kubelet took it.

use super::proto::{self, *};
use super::server::{method_of, unary};
use super::RegistrationState;
use futures_util::future::BoxFuture;
use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::watch;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::server::NamedService;
use tonic::Status;

#[derive(Clone)]
pub(super) struct RegistrationService {
    info: Arc<PluginInfo>,
    status: Arc<watch::Sender<RegistrationState>>,
}

impl RegistrationService {
    pub(super) fn new(info: PluginInfo, status: watch::Sender<RegistrationState>) -> Self {
        RegistrationService {
            info: Arc::new(info),
            status: Arc::new(status),
        }
    }

    fn notified(&self, s: RegistrationStatus) -> RegistrationStatusResponse {
        let state = if s.plugin_registered {
            tracing::info!(driver = %self.info.name, "the kubelet registered the DRA plugin");
            RegistrationState::Registered
        } else {
            tracing::warn!(driver = %self.info.name, error = %s.error, "the kubelet refused the DRA plugin");
            RegistrationState::Refused(s.error)
        };
        self.status.send_replace(state);
        RegistrationStatusResponse {}
    }

    async fn route(self, req: http::Request<Body>) -> http::Response<Body> {
        match method_of(&req).as_str() {
            "GetInfo" => {
                let info = (*self.info).clone();
                unary(req, move |_: InfoRequest| std::future::ready(info)).await
            }
            "NotifyRegistrationStatus" => {
                unary(req, move |s: RegistrationStatus| {
                    std::future::ready(self.notified(s))
                })
                .await
            }
            other => Status::unimplemented(other.to_string()).into_http(),
        }
    }
}

impl NamedService for RegistrationService {
    const NAME: &'static str = proto::REGISTRATION_SERVICE;
}

impl tower::Service<http::Request<Body>> for RegistrationService {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.route(req).await) })
    }
}
