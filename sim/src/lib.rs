//! `tap-sim`: replays a workload trace against a fixture topology and compares placement
//! quality of no pinning, the kubelet's static CPU manager, and the kunpeng-tap policies.
//! See `docs/design/sim.md` for the trace format, the metrics and the measured results.

pub mod floor;
pub mod gen;
pub mod goals;
pub mod kubelet;
pub mod plot;
pub mod rebalance;
pub mod report;
pub mod seeds;
pub mod sim;
pub mod trace;
pub mod usage;
