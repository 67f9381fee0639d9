//! What a proxy mode provides to the ledger (applying cpusets, listing containers), and the
//! loop that keeps the ledger in line with the runtime after the runtime restarts.

use super::{Ledger, Listed};
use crate::agent::Update;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often a proxy compares the ledger with the runtime's list. A runtime restart that took
/// containers with it is seen within this time.
pub const RECONCILE_EVERY: Duration = Duration::from_secs(5);

/// A live container in the runtime's cheap list: its ledger key and runtime id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveId {
    pub key: String,
    pub runtime_id: String,
    /// Started (not only created).
    pub running: bool,
}

#[async_trait::async_trait]
pub trait Runtime: Send + Sync {
    /// Sets a container's cpuset (and memory nodes).
    async fn update_cpuset(&self, u: &Update) -> Result<(), String>;
    /// Every live (created, running, paused) Kubernetes container, fully described.
    async fn list(&self) -> anyhow::Result<Vec<Listed>>;
    /// Every live Kubernetes container, keys and ids only (one cheap call).
    async fn live(&self) -> anyhow::Result<Vec<LiveId>>;
}

impl Ledger {
    /// Sends `updates` to the runtime, marking each one the runtime accepted as applied.
    pub async fn apply(&self, rt: &dyn Runtime, updates: Vec<Update>) {
        for u in updates {
            match rt.update_cpuset(&u).await {
                Ok(()) => {
                    tracing::info!(container = %u.container_id, cpus = %u.cpus, "cpuset updated");
                    self.applied(&u);
                }
                Err(e) => {
                    tracing::warn!(container = %u.container_id, "cpuset update failed: {e}");
                    self.agent().metrics().count_error("update", "runtime");
                }
            }
        }
    }

    /// Start-up: rebuilds the book from the runtime's full list. Returns how many containers
    /// the runtime reported.
    pub async fn restore_from(&self, rt: &dyn Runtime) -> anyhow::Result<usize> {
        let listed = rt.list().await?;
        let n = listed.len();
        let (report, ups) = self.restore(listed);
        tracing::info!(
            adopted = report.adopted,
            released = report.released,
            updates = ups.len(),
            "ledger rebuilt from the runtime"
        );
        self.apply(rt, ups).await;
        Ok(n)
    }

    /// One comparison with the runtime: the cheap list, and the full one only when the runtime
    /// has containers the ledger does not know.
    pub async fn reconcile_with(&self, rt: &dyn Runtime) -> anyhow::Result<super::ReconcileReport> {
        let since = self.now();
        let live = rt.live().await?;
        // Only a running container is adopted here: one that is merely created and unknown is a
        // create the ledger rolled back (the runtime gave up on it, or its caller did), which
        // the kubelet will remove; it is adopted at start-up only.
        let unknown = {
            let known = self.keys();
            live.iter()
                .any(|l| l.running && known.binary_search(&l.key).is_err())
        };
        let listed = if unknown {
            let running: std::collections::HashSet<String> = live
                .iter()
                .filter(|l| l.running)
                .map(|l| l.key.clone())
                .collect();
            let known = self.keys();
            rt.list()
                .await?
                .into_iter()
                .filter(|l| running.contains(&l.info.id) || known.binary_search(&l.info.id).is_ok())
                .collect()
        } else {
            live.into_iter()
                .filter(|l| l.running || self.resolve(&l.key).is_some())
                .map(|l| match self.info(&l.key) {
                    Some(info) => Listed {
                        runtime_id: l.runtime_id,
                        info,
                    },
                    None => Listed {
                        runtime_id: l.runtime_id,
                        info: crate::agent::ContainerInfo {
                            id: l.key,
                            ..Default::default()
                        },
                    },
                })
                .collect()
        };
        let (report, ups) = self.reconcile(listed, since, false);
        if report != super::ReconcileReport::default() {
            tracing::info!(
                released = report.released,
                adopted = report.adopted,
                "ledger reconciled with the runtime"
            );
        }
        self.apply(rt, ups).await;
        Ok(report)
    }

    /// Compares the ledger with the runtime every `every` until `shutdown`.
    pub async fn keep_reconciled(
        self: Arc<Self>,
        rt: Arc<dyn Runtime>,
        every: Duration,
        shutdown: CancellationToken,
    ) {
        let mut reachable = true;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            let result = self.reconcile_with(rt.as_ref()).await;
            self.agent().metrics().count_reconcile(result.is_ok());
            match result {
                Ok(_) => {
                    if !reachable {
                        tracing::info!("the runtime is reachable again; ledger reconciled");
                    }
                    reachable = true;
                    self.agent().metrics().runtime_connected.set(1);
                }
                Err(e) => {
                    if reachable {
                        tracing::warn!("cannot list the runtime's containers: {e:#}");
                    }
                    reachable = false;
                    self.agent().metrics().runtime_connected.set(0);
                }
            }
        }
    }
}
