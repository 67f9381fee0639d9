//! Helpers the engine's test modules share.

use std::sync::Arc;
use tap_engine::{ContainerRequest, Engine, EngineConfig, Level, Outcome, Placement, Topology};

/// The 2-socket, 4-node fixture with a GPU most modules place on.
pub const GPU96: &str = "synthetic-2s-4numa-96c-gpu";

/// The topology of fixture `name` (fixtures/sysfs).
pub fn topo(name: &str) -> Arc<Topology> {
    tap_engine::testdata::fixture_topology(name).expect("fixture topology")
}

/// An engine on fixture `name`.
pub fn engine(name: &str, cfg: EngineConfig) -> Engine {
    Engine::new(topo(name), cfg)
}

/// A container `app` of Pod `pod-<id>` in `default`, with a CPU request and limit in
/// millicores.
pub fn request(id: &str, request_milli: u64, limit_milli: Option<u64>) -> ContainerRequest {
    ContainerRequest {
        id: id.into(),
        pod_name: format!("pod-{id}"),
        namespace: "default".into(),
        container_name: "app".into(),
        cpu_request_milli: request_milli,
        cpu_limit_milli: limit_milli,
        ..Default::default()
    }
}

/// The placement of an outcome that must be one.
pub fn placed(o: Outcome) -> Placement {
    match o {
        Outcome::Placed(p) => p,
        Outcome::Skipped(s) => panic!("expected a placement, got skipped: {s}"),
    }
}

/// The CPUs of each pool at `level`, in the topology's order.
pub fn pool_cpus(t: &Topology, level: Level) -> Vec<String> {
    t.pools
        .iter()
        .filter(|p| p.level == level)
        .map(|p| p.cpus.to_string())
        .collect()
}
