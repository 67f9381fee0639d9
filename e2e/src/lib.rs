//! Harness for the e2e tier: start real components on test-private sockets and clean up.
//!
//! The tier's tests are `#[ignore]`d, so a plain `cargo test` shows them as ignored; the e2e
//! tier runs them with `--include-ignored` and `TAP_E2E=1` (see the README). Run without
//! `TAP_E2E=1`, or with a component missing, such a test fails, never passes having done nothing.

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
pub mod text;
pub mod util;
pub mod vm;
