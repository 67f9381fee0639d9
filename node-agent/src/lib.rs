//! kunpeng-tap node agent: the runtime edges (NRI plugin, CRI proxy, Docker proxy), the link to
//! the API server, metrics, and the shared hook layer over the placement engine.

pub mod agent;
pub mod cgroupfs;
pub mod cri_proxy;
pub mod docker_proxy;
pub mod dra;
pub mod explain;
pub mod fail_open;
pub mod flags;
pub mod fold;
pub mod hook;
pub mod kube_link;
pub mod kubelet_config;
pub mod kubelet_plugin;
pub mod ledger;
pub mod metrics;
pub mod notes;
pub mod nri;
pub mod pod_resources;
pub mod proxy_server;
pub mod retry;
pub mod usage;

pub use agent::{Adjustment, Agent, ContainerInfo, PodInfo, Update};
