//! The `pluginregistration.Registration` service the kubelet's plugin watcher calls on the
//! registration socket: GetInfo names the driver and its DRA socket, NotifyRegistrationStatus
//! says whether the kubelet took it. Served by [`super::lenient`] (the watcher's `:authority`
//! is the socket's path).

use super::lenient::{Answer, Unary};
use super::proto::*;
use super::RegistrationState;
use bytes::Bytes;
use prost::Message;
use std::sync::Arc;
use tokio::sync::watch;

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

    fn notified(&self, s: RegistrationStatus) {
        let state = if s.plugin_registered {
            tracing::info!(driver = %self.info.name, "the kubelet registered the DRA plugin");
            RegistrationState::Registered
        } else {
            tracing::warn!(driver = %self.info.name, error = %s.error, "the kubelet refused the DRA plugin");
            RegistrationState::Refused(s.error)
        };
        self.status.send_replace(state);
    }
}

impl Unary for RegistrationService {
    fn call(&self, path: &str, request: Bytes) -> Answer {
        let malformed = |e: prost::DecodeError| (tonic::Code::InvalidArgument, e.to_string());
        match path {
            GET_INFO => {
                InfoRequest::decode(request).map_err(malformed)?;
                Ok(self.info.encode_to_vec().into())
            }
            NOTIFY_REGISTRATION_STATUS => {
                self.notified(RegistrationStatus::decode(request).map_err(malformed)?);
                Ok(RegistrationStatusResponse {}.encode_to_vec().into())
            }
            other => Err((tonic::Code::Unimplemented, format!("no method {other}"))),
        }
    }
}
