//! Prometheus metrics and the health/readiness endpoints.

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabel {
    pub controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabel {
    pub kind: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabel {
    pub policy: String,
}

pub struct Metrics {
    registry: Registry,
    pub reconciles: Family<ControllerLabel, Counter>,
    pub errors: Family<ControllerLabel, Counter>,
    pub failures: Family<FailureLabel, Counter>,
    pub durations: Family<ControllerLabel, Histogram>,
    pub policy_nodes: Family<PolicyLabel, Gauge>,
    pub writes: Family<ControllerLabel, Counter>,
    pub leader: Gauge,
    /// Ready: the caches are synced (leader) or the process waits for the lease (standby).
    pub ready: AtomicBool,
}

fn histogram() -> Histogram {
    Histogram::new([
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    ])
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let reconciles = Family::<ControllerLabel, Counter>::default();
        let errors = Family::<ControllerLabel, Counter>::default();
        let failures = Family::<FailureLabel, Counter>::default();
        let writes = Family::<ControllerLabel, Counter>::default();
        let durations = Family::<ControllerLabel, Histogram>::new_with_constructor(
            histogram as fn() -> Histogram,
        );
        let policy_nodes = Family::<PolicyLabel, Gauge>::default();
        let leader = Gauge::default();
        registry.register(
            "tap_operator_reconciles",
            "Reconciles run, by controller",
            reconciles.clone(),
        );
        registry.register(
            "tap_operator_reconcile_errors",
            "Reconciles that failed, by controller",
            errors.clone(),
        );
        registry.register(
            "tap_operator_reconcile_errors_by_reason",
            "Reconciles that failed, by object kind and reason (from the error policy)",
            failures.clone(),
        );
        registry.register(
            "tap_operator_writes",
            "Objects written to the API server (apply, status, delete), by controller",
            writes.clone(),
        );
        registry.register(
            "tap_operator_reconcile_duration_seconds",
            "Time spent in one reconcile, by controller",
            durations.clone(),
        );
        registry.register(
            "tap_operator_policy_nodes",
            "Nodes each TopologyPolicy applies to",
            policy_nodes.clone(),
        );
        registry.register(
            "tap_operator_leader",
            "1 while this replica holds the leader lease",
            leader.clone(),
        );
        Metrics {
            registry,
            reconciles,
            errors,
            failures,
            durations,
            policy_nodes,
            writes,
            leader,
            ready: AtomicBool::new(false),
        }
    }

    pub fn observe(&self, controller: &str, took: Duration, ok: bool) {
        let l = ControllerLabel {
            controller: controller.to_string(),
        };
        self.reconciles.get_or_create(&l).inc();
        self.durations.get_or_create(&l).observe(took.as_secs_f64());
        if !ok {
            self.errors.get_or_create(&l).inc();
        }
    }

    /// A failed reconcile of a `kind` object, by [`crate::controller::Error::reason`].
    pub fn failed(&self, kind: &str, reason: &str) {
        self.failures
            .get_or_create(&FailureLabel {
                kind: kind.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    pub fn wrote(&self, controller: &str) {
        self.writes
            .get_or_create(&ControllerLabel {
                controller: controller.to_string(),
            })
            .inc();
    }

    pub fn encode(&self) -> String {
        let mut s = String::new();
        if prometheus_client::encoding::text::encode(&mut s, &self.registry).is_err() {
            s.clear();
        }
        s
    }
}

/// Serves `/metrics`.
pub async fn serve_metrics(addr: std::net::SocketAddr, m: Arc<Metrics>) -> std::io::Result<()> {
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let m = m.clone();
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    m.encode(),
                )
            }
        }),
    );
    let l = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(l, app).await
}

/// Serves `/healthz` (the process runs) and `/readyz` (see [`Metrics::ready`]).
pub async fn serve_health(addr: std::net::SocketAddr, m: Arc<Metrics>) -> std::io::Result<()> {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let m = m.clone();
                async move {
                    if m.ready.load(Ordering::Relaxed) {
                        (StatusCode::OK, "ok")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced")
                    }
                }
            }),
        );
    let l = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(l, app).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_names_are_exported() {
        let m = Metrics::new();
        m.observe("node", Duration::from_millis(3), false);
        m.wrote("node");
        m.policy_nodes
            .get_or_create(&PolicyLabel { policy: "p".into() })
            .set(7);
        let s = m.encode();
        for name in [
            "tap_operator_reconciles_total{controller=\"node\"} 1",
            "tap_operator_reconcile_errors_total{controller=\"node\"} 1",
            "tap_operator_writes_total{controller=\"node\"} 1",
            "tap_operator_reconcile_duration_seconds_count{controller=\"node\"} 1",
            "tap_operator_policy_nodes{policy=\"p\"} 7",
            "tap_operator_leader 0",
        ] {
            assert!(s.contains(name), "{name} missing in\n{s}");
        }
    }

    #[test]
    fn failures_are_counted_by_kind_and_reason() {
        let m = Metrics::new();
        m.failed("Node", "api_conflict");
        m.failed("Node", "api_conflict");
        m.failed("TopologyPolicy", "cache");
        let s = m.encode();
        for line in [
            "tap_operator_reconcile_errors_by_reason_total{kind=\"Node\",reason=\"api_conflict\"} 2",
            "tap_operator_reconcile_errors_by_reason_total{kind=\"TopologyPolicy\",reason=\"cache\"} 1",
        ] {
            assert!(s.contains(line), "{line} missing in\n{s}");
        }
    }
}
