//! kunpeng-tap operator: resolves TopologyPolicies onto Nodes as NodeTopology objects.
//!
//! - [`selector`], [`resolve`], [`plan`]: pure logic (observed state -> desired objects),
//!   unit-tested and benchmarked.
//! - [`controller`]: the reconcilers (thin I/O layer); [`watches`]: one shared watch per kind
//!   feeding the stores and the Controllers.
//! - [`lease`]: leader election on a Lease.
//! - [`metrics`]: Prometheus metrics, health and readiness.

pub mod controller;
pub mod lease;
pub mod metrics;
pub mod plan;
pub mod resolve;
pub mod selector;
pub mod watches;
