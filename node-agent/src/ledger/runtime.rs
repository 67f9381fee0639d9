//! What a proxy mode provides to the ledger (writing cpusets, listing containers), and the
//! loop that keeps the ledger in line with the runtime: after the runtime restarts, and by
//! reading back what the runtime holds.

use super::{Ledger, Listed, Listing};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often a proxy compares the ledger with the runtime's cheap list. A runtime restart that
/// took containers with it is seen within this time.
pub const RECONCILE_EVERY: Duration = Duration::from_secs(5);
/// Every this many comparisons, the full list is read and what the runtime holds becomes what
/// the ledger counts as applied (a write lost or reordered is corrected within this time).
pub const READ_BACK_EVERY: u32 = 6;
/// The longest one listing of the runtime may take (a wedged status call fails it, and the
/// next round tries again).
pub const LIST_DEADLINE: Duration = Duration::from_secs(20);

/// A live container in the runtime's cheap list: its ledger key and runtime id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveId {
    pub key: String,
    pub runtime_id: String,
    /// Started (not only created).
    pub running: bool,
}

#[async_trait::async_trait]
pub trait Runtime: super::Writer {
    /// Every live (created, running, paused) Kubernetes container, fully described. A
    /// container the runtime cannot describe right now fails the whole list (never taken as
    /// gone); one that vanished between the list and its status is left out.
    async fn list(&self) -> anyhow::Result<Vec<Listed>>;
    /// Every live Kubernetes container, keys and ids only (one cheap call).
    async fn live(&self) -> anyhow::Result<Vec<LiveId>>;
}

/// `f` under [`LIST_DEADLINE`].
async fn bounded<T>(
    what: &str,
    f: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    match tokio::time::timeout(LIST_DEADLINE, f).await {
        Ok(r) => r,
        Err(_) => anyhow::bail!("{what}: no answer within {LIST_DEADLINE:?}"),
    }
}

impl Ledger {
    /// Start-up: rebuilds the book from the runtime's full list. Returns how many containers
    /// the runtime reported.
    pub async fn restore_from(&self, rt: &dyn Runtime) -> anyhow::Result<usize> {
        let since = self.now();
        let listed = bounded("listing the runtime's containers", rt.list()).await?;
        let n = listed.len();
        let report = self.restore(listed, since);
        // The engine failed (a panic, logged and counted): not restored, so the proxy stays
        // not ready and forwards calls unadjusted while the restore is tried again.
        if !self.agent().restored() {
            anyhow::bail!("the placement engine failed to rebuild the state");
        }
        tracing::info!(
            adopted = report.adopted,
            released = report.released,
            updates = self.pending_updates().len(),
            "ledger rebuilt from the runtime"
        );
        Ok(n)
    }

    /// Whether the book lacks a live container: unknown, or known as stopped.
    fn lacks(&self, key: &str) -> bool {
        let b = self.book();
        b.entries
            .get(key)
            .is_none_or(|e| matches!(e.state, super::State::Stopped))
    }

    /// Whether the book knows `l`'s key under another runtime id: the container it knows was
    /// removed and another took its name.
    fn replaced(&self, l: &LiveId) -> bool {
        self.book().replaced(&l.key, &l.runtime_id)
    }

    /// One comparison with the runtime: the cheap list, and the full one when the runtime has
    /// running containers the ledger lacks, lists a key under another runtime id than the
    /// book's (a name reused), or when `how` asks for a read-back.
    pub async fn reconcile_with(
        &self,
        rt: &dyn Runtime,
        how: Listing,
    ) -> anyhow::Result<super::ReconcileReport> {
        let since = self.now();
        let live = bounded("listing the runtime's containers", rt.live()).await?;
        // Only a running container is adopted here: one that is merely created and unknown is a
        // create the ledger rolled back (the runtime gave up on it, or its caller did), which
        // the kubelet will remove; it is adopted at start-up only.
        let lacking = live
            .iter()
            .any(|l| (l.running && self.lacks(&l.key)) || self.replaced(l));
        let full = lacking || how == Listing::Live;
        // What the comparison covers: running containers, and created ones the book has.
        let kept: HashSet<String> = live
            .iter()
            .filter(|l| l.running || !self.lacks(&l.key))
            .map(|l| l.key.clone())
            .collect();
        let listed: Vec<Listed> = if full {
            bounded("describing the runtime's containers", rt.list())
                .await?
                .into_iter()
                .filter(|l| kept.contains(&l.info.id))
                .collect()
        } else {
            live.into_iter()
                .filter(|l| kept.contains(&l.key))
                .map(|l| Listed {
                    info: self
                        .info(&l.key)
                        .unwrap_or_else(|| crate::agent::ContainerInfo {
                            id: l.key.clone(),
                            ..Default::default()
                        }),
                    runtime_id: l.runtime_id,
                })
                .collect()
        };
        let how = if full { Listing::Live } else { Listing::Ids };
        let report = self.reconcile(listed, since, how);
        if report != super::ReconcileReport::default() {
            tracing::info!(
                released = report.released,
                adopted = report.adopted,
                "ledger reconciled with the runtime"
            );
        }
        Ok(report)
    }

    /// Compares the ledger with the runtime every `every` until `shutdown`, reading back what
    /// the runtime holds every [`READ_BACK_EVERY`] rounds.
    pub async fn keep_reconciled(
        self: Arc<Self>,
        rt: Arc<dyn Runtime>,
        every: Duration,
        shutdown: CancellationToken,
    ) {
        let mut reachable = true;
        let mut round: u32 = 0;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            round = round.wrapping_add(1);
            let how = if round.is_multiple_of(READ_BACK_EVERY) {
                Listing::Live
            } else {
                Listing::Ids
            };
            let result = self.reconcile_with(rt.as_ref(), how).await;
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
