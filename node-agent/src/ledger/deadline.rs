//! The fail-open deadline around a decision: it runs on a blocking thread and must answer
//! within the budget; a missed deadline or a failed task gives `None` (the caller lets the
//! container go unadjusted), a log line and `tap_errors_total{hook,kind}`. A result that
//! arrives after the deadline is handed to `on_late` (to undo a grant the runtime never heard
//! of).
//!
//! A create's or an update's decision takes microseconds: when the engine is free it runs
//! right here, on the hook's own thread ([`Placement::Inline`]; its panics are caught inside
//! `Agent::guarded` as everywhere), sparing two thread hand-offs per hook. Only when the
//! engine is busy (a restore, a scrape) or for the long hooks (a runtime's synchronization)
//! does it go to a blocking thread under the deadline.

use crate::agent::Agent;
use crate::hook::Hook;
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

    pub async fn run<T, F, L>(&self, agent: &Arc<Agent>, hook: Hook, f: F, on_late: L) -> Option<T>
    where
        T: Send + 'static,
        F: FnOnce(&Agent) -> T + Send + 'static,
        L: FnOnce(&Agent, T) + Send + 'static,
    {
        if Placement::of(hook) == Placement::Inline && !agent.engine_busy() {
            return self.inline(agent, hook, f, on_late);
        }
        let a = agent.clone();
        // The decision logs inside the caller's hook span.
        let span = tracing::Span::current();
        let mut task = tokio::task::spawn_blocking(move || span.in_scope(|| f(&a)));
        let budget = self.budget();
        match tokio::time::timeout(budget, &mut task).await {
            Ok(Ok(v)) => Some(v),
            Ok(Err(e)) => {
                tracing::error!(
                    hook = hook.as_str(),
                    "decision failed: {e}; leaving the container unchanged"
                );
                agent
                    .metrics()
                    .count_error(hook, crate::metrics::ErrorKind::Internal);
                None
            }
            Err(_) => {
                tracing::error!(
                    hook = hook.as_str(),
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

impl Deadline {
    /// Runs `f` here; the deadline is a watchdog: a decision that took longer than the budget
    /// is answered as a missed one (none, and its result to `on_late`), as if it had run on a
    /// blocking thread.
    fn inline<T, F, L>(&self, agent: &Arc<Agent>, hook: Hook, f: F, on_late: L) -> Option<T>
    where
        F: FnOnce(&Agent) -> T,
        L: FnOnce(&Agent, T),
    {
        let started = std::time::Instant::now();
        let v = f(agent);
        let budget = self.budget();
        if started.elapsed() <= budget {
            return Some(v);
        }
        tracing::error!(
            hook = hook.as_str(),
            budget_ms = budget.as_millis() as u64,
            took_ms = started.elapsed().as_millis() as u64,
            "decision took longer than its deadline; answering without adjustment"
        );
        agent
            .metrics()
            .count_error(hook, crate::metrics::ErrorKind::Timeout);
        on_late(agent, v);
        None
    }
}

/// Where a hook's decision runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placement {
    /// On the hook's thread (microseconds: a create, an update).
    Inline,
    /// On a blocking thread under the deadline (a synchronization with every container).
    Blocking,
}

impl Placement {
    fn of(hook: Hook) -> Placement {
        match hook {
            Hook::Create | Hook::Update => Placement::Inline,
            _ => Placement::Blocking,
        }
    }
}
