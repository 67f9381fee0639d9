//! The messages of the kubelet's pod-resources API (`k8s.io/kubelet/pkg/apis/podresources/v1`,
//! service `v1.PodResourcesLister`) the agent reads: written out by hand from the API's
//! field numbers, so no code generator or `protoc` is needed to build. Fields the agent does
//! not read (CPU ids, memory, a claim's CDI devices) are left out; prost skips them on decode.

/// `ListPodResourcesRequest`: empty.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodResourcesRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodResourcesResponse {
    #[prost(message, repeated, tag = "1")]
    pub pod_resources: Vec<PodResources>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPodResourcesRequest {
    #[prost(string, tag = "1")]
    pub pod_name: String,
    #[prost(string, tag = "2")]
    pub pod_namespace: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPodResourcesResponse {
    #[prost(message, optional, tag = "1")]
    pub pod_resources: Option<PodResources>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodResources {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub namespace: String,
    #[prost(message, repeated, tag = "3")]
    pub containers: Vec<ContainerResources>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerResources {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, repeated, tag = "2")]
    pub devices: Vec<ContainerDevices>,
    #[prost(message, repeated, tag = "5")]
    pub dynamic_resources: Vec<DynamicResource>,
}

/// `DynamicResource`: the devices of one ResourceClaim the container uses (DRA).
#[derive(Clone, PartialEq, prost::Message)]
pub struct DynamicResource {
    #[prost(string, tag = "2")]
    pub claim_name: String,
    #[prost(string, tag = "3")]
    pub claim_namespace: String,
    #[prost(message, repeated, tag = "4")]
    pub claim_resources: Vec<ClaimResource>,
}

/// `ClaimResource`: one allocated device, named as its driver's ResourceSlice names it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ClaimResource {
    #[prost(string, tag = "2")]
    pub driver_name: String,
    #[prost(string, tag = "3")]
    pub pool_name: String,
    #[prost(string, tag = "4")]
    pub device_name: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerDevices {
    #[prost(string, tag = "1")]
    pub resource_name: String,
    #[prost(string, repeated, tag = "2")]
    pub device_ids: Vec<String>,
    #[prost(message, optional, tag = "3")]
    pub topology: Option<TopologyInfo>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TopologyInfo {
    #[prost(message, repeated, tag = "1")]
    pub nodes: Vec<NumaNode>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NumaNode {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

/// `AllocatableResourcesRequest`: empty.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AllocatableResourcesRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AllocatableResourcesResponse {
    #[prost(message, repeated, tag = "1")]
    pub devices: Vec<ContainerDevices>,
}

/// The methods' gRPC paths.
pub const GET: &str = "/v1.PodResourcesLister/Get";
pub const LIST: &str = "/v1.PodResourcesLister/List";
pub const ALLOCATABLE: &str = "/v1.PodResourcesLister/GetAllocatableResources";
