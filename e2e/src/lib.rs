//! Harness for the e2e tier: start real components on test-private sockets and clean up.
//!
//! The tier runs only with `TAP_E2E=1` (see the README); without it every e2e test returns at
//! once and says so. With it, a missing component is a failure, never a skip.

pub mod binfmt;
pub mod churn;
pub mod cluster;
pub mod containerd;
pub mod cpumeter;
pub mod device_plugin;
pub mod docker;
pub mod dra_accel;
pub mod dra_peer;
pub mod helm;
pub mod images;
pub mod kube;
pub mod nri_runtime;
pub mod numa_guest;
pub mod procmem;
pub mod stats;
pub mod util;
pub mod vm;
