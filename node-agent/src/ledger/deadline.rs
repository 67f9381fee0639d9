//! The fail-open deadline around a decision: it runs on a blocking thread and must answer
//! within the budget; a missed deadline or a failed task gives `None` (the caller lets the
//! container go unadjusted), a log line and `tap_errors_total{hook,kind}`. A result that
//! arrives after the deadline is handed to `on_late` (to undo a grant the runtime never heard
//! of).

use crate::agent::Agent;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The budget of a decision when the runtime says nothing about its timeout: 75% of containerd's
/// default NRI request timeout (2 s). The kubelet's CRI timeout (2 min) is far longer.
pub const DEFAULT_BUDGET: Duration = Duration::from_millis(1500);

pub struct Deadline {
    budget_ms: AtomicU64,
}

impl Default for Deadline {
    fn default() -> Self {
        Deadline {
            budget_ms: AtomicU64::new(DEFAULT_BUDGET.as_millis() as u64),
        }
    }
}

impl Deadline {
    pub fn budget(&self) -> Duration {
        Duration::from_millis(self.budget_ms.load(Ordering::Relaxed))
    }

    pub fn set_budget(&self, d: Duration) {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1);
        self.budget_ms.store(ms, Ordering::Relaxed);
    }

    pub async fn run<T, F, L>(
        &self,
        agent: &Arc<Agent>,
        hook: &'static str,
        f: F,
        on_late: L,
    ) -> Option<T>
    where
        T: Send + 'static,
        F: FnOnce(&Agent) -> T + Send + 'static,
        L: FnOnce(&Agent, T) + Send + 'static,
    {
        let a = agent.clone();
        // The decision logs inside the caller's hook span.
        let span = tracing::Span::current();
        let mut task = tokio::task::spawn_blocking(move || span.in_scope(|| f(&a)));
        let budget = self.budget();
        match tokio::time::timeout(budget, &mut task).await {
            Ok(Ok(v)) => Some(v),
            Ok(Err(e)) => {
                tracing::error!(
                    hook,
                    "decision failed: {e}; leaving the container unchanged"
                );
                agent
                    .metrics()
                    .count_error(hook, crate::metrics::ErrorKind::Internal);
                None
            }
            Err(_) => {
                tracing::error!(
                    hook,
                    budget_ms = budget.as_millis() as u64,
                    "decision missed its deadline; answering without adjustment"
                );
                agent
                    .metrics()
                    .count_error(hook, crate::metrics::ErrorKind::Timeout);
                let a = agent.clone();
                tokio::spawn(async move {
                    if let Ok(v) = task.await {
                        on_late(&a, v);
                    }
                });
                None
            }
        }
    }
}
