//! The messages of the kubelet's plugin registration API (`k8s.io/kubelet/pkg/apis/
//! pluginregistration/v1`, proto package `pluginregistration`) and of its DRA API
//! (`k8s.io/kubelet/pkg/apis/dra/v1`, proto package `k8s.io.kubelet.pkg.apis.dra.v1`), written
//! out by hand from the field numbers of their `api.proto` at k8s.io/kubelet v0.37.2, so that no
//! code generator or `protoc` is needed to build.

use std::collections::HashMap;

// ---- pluginregistration.Registration ----------------------------------------------------------

#[derive(Clone, PartialEq, prost::Message)]
pub struct InfoRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PluginInfo {
    /// `DRAPlugin` for a DRA driver.
    #[prost(string, tag = "1")]
    pub r#type: String,
    /// The DRA driver's name.
    #[prost(string, tag = "2")]
    pub name: String,
    /// The DRA service's socket, an absolute path.
    #[prost(string, tag = "3")]
    pub endpoint: String,
    /// For DRA: the gRPC services the plugin serves, as `<package>.<service>` (`v1.DRAPlugin`).
    #[prost(string, repeated, tag = "4")]
    pub supported_versions: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RegistrationStatus {
    #[prost(bool, tag = "1")]
    pub plugin_registered: bool,
    #[prost(string, tag = "2")]
    pub error: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RegistrationStatusResponse {}

pub const REGISTRATION_SERVICE: &str = "pluginregistration.Registration";
pub const GET_INFO: &str = "/pluginregistration.Registration/GetInfo";
pub const NOTIFY_REGISTRATION_STATUS: &str =
    "/pluginregistration.Registration/NotifyRegistrationStatus";

// ---- k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin -------------------------------------------------

#[derive(Clone, PartialEq, prost::Message)]
pub struct Claim {
    #[prost(string, tag = "1")]
    pub namespace: String,
    #[prost(string, tag = "2")]
    pub uid: String,
    #[prost(string, tag = "3")]
    pub name: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodePrepareResourcesRequest {
    #[prost(message, repeated, tag = "1")]
    pub claims: Vec<Claim>,
}

/// Keyed by claim UID.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodePrepareResourcesResponse {
    #[prost(map = "string, message", tag = "1")]
    pub claims: HashMap<String, NodePrepareResourceResponse>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodePrepareResourceResponse {
    #[prost(message, repeated, tag = "1")]
    pub devices: Vec<Device>,
    #[prost(string, tag = "2")]
    pub error: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Device {
    #[prost(string, repeated, tag = "1")]
    pub request_names: Vec<String>,
    #[prost(string, tag = "2")]
    pub pool_name: String,
    #[prost(string, tag = "3")]
    pub device_name: String,
    #[prost(string, repeated, tag = "4")]
    pub cdi_device_ids: Vec<String>,
    /// Set for a device shared through consumable capacity.
    #[prost(string, optional, tag = "5")]
    pub share_id: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnprepareResourcesRequest {
    #[prost(message, repeated, tag = "1")]
    pub claims: Vec<Claim>,
}

/// Keyed by claim UID.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnprepareResourcesResponse {
    #[prost(map = "string, message", tag = "1")]
    pub claims: HashMap<String, NodeUnprepareResourceResponse>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnprepareResourceResponse {
    #[prost(string, tag = "1")]
    pub error: String,
}

pub const DRA_SERVICE: &str = "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin";
pub const NODE_PREPARE_RESOURCES: &str =
    "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources";
pub const NODE_UNPREPARE_RESOURCES: &str =
    "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources";
