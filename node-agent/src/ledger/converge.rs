//! The convergence loop: one worker per mode drives what the runtime holds for each container
//! (`applied`) towards what the engine wants now (`Agent::current`).
//!
//! - Every change that moves CPUs (create, commit, release, rollback, adoption, resize,
//!   restore, a decision that came too late) marks the containers it affects in the
//!   [`DirtyQueue`]; nothing else sends cpuset updates of containers.
//! - The worker takes the dirty containers that are committed, not being written and not
//!   waiting for a retry, compares, and writes the difference through the mode's [`Writer`]
//!   under [`WRITE_DEADLINE`], up to four at once, one write per container at a time; a pass
//!   ends when its batch is answered (so a hung write delays later marks by the deadline).
//! - A result counts only for the generation it was computed for: an entry changed while its
//!   write was out (its `seq` moved, or a hook's own call for it was forwarded meanwhile) is
//!   marked unknown and compared again, so a stale result never overwrites a newer one.
//! - A failed write is retried with jittered exponential backoff ([`RETRY_MIN`] to
//!   [`RETRY_MAX`]); the container stays dirty until the runtime holds what the engine wants or
//!   it has no grant any more.
//! - Every [`SWEEP_EVERY`] all committed containers are compared again (a change that escaped
//!   marking, e.g. a decision that finished after its hook, is still found).

use super::{Applied, Book, Ledger, State};
use crate::agent::Update;
use crate::hook::Hook;
use crate::retry::{Delays, Spread};
use futures_util::StreamExt;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// The longest a cpuset write may take before it counts as failed (a hung shim). Short: a
/// healthy runtime answers in milliseconds, and containerd 1.7 holds other containers'
/// creates and starts while an update waits on a hung shim (docs/design/reliability.md).
pub const WRITE_DEADLINE: Duration = Duration::from_secs(2);
/// The shortest wait before a write that timed out is tried again (each try may hold the
/// runtime's other work for up to [`WRITE_DEADLINE`]).
pub const RETRY_AFTER_TIMEOUT: Duration = Duration::from_secs(10);
/// First and longest wait before a failed write is tried again.
pub const RETRY_MIN: Duration = Duration::from_millis(200);
pub const RETRY_MAX: Duration = Duration::from_secs(30);
/// How long a deferred write waits before the loop tries it again.
pub const DEFER_FOR: Duration = Duration::from_millis(500);
/// How often every committed container is compared again.
pub const SWEEP_EVERY: Duration = Duration::from_secs(30);
/// Writes out at once (each for a different container).
const PARALLEL_WRITES: usize = 4;

/// Why a cpuset write failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    #[error("the runtime refused the update: {0}")]
    Refused(String),
    #[error("the runtime does not know the container")]
    NotFound,
    #[error("the runtime cannot be reached: {0}")]
    Unreachable(String),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// Not sent, by the writer's own choice (the runtime is busy): no failure, tried again
    /// after [`DEFER_FOR`], and it may ride on an answer meanwhile.
    #[error("not sent now: {0}")]
    Deferred(String),
}

impl WriteError {
    /// The `kind` of `tap_errors_total`.
    pub fn kind(&self) -> crate::metrics::ErrorKind {
        use crate::metrics::ErrorKind;
        match self {
            WriteError::Refused(_) => ErrorKind::Refused,
            WriteError::NotFound => ErrorKind::NotFound,
            WriteError::Unreachable(_) => ErrorKind::Runtime,
            WriteError::Timeout(_) => ErrorKind::Timeout,
            WriteError::Deferred(_) => ErrorKind::Busy,
        }
    }
}

/// How a writer reaches the runtime now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// Through calls of its own: the loop sends due writes.
    OwnCalls,
    /// Only on the answers to the runtime's own requests (NRI where unsolicited updates are not
    /// safe): due writes stay marked until the next answer takes them
    /// ([`Ledger::claim_for_answer`]).
    AnswersOnly,
}

/// How a mode writes a container's cpuset (and memory nodes), and only those.
#[async_trait::async_trait]
pub trait Writer: Send + Sync {
    fn channel(&self) -> Channel {
        Channel::OwnCalls
    }
    async fn write_cpuset(&self, u: &Update) -> Result<(), WriteError>;
}

/// The keys of containers to compare, and the worker's wake-up.
#[derive(Default)]
pub struct DirtyQueue {
    keys: Mutex<BTreeSet<String>>,
    wake: Notify,
}

impl DirtyQueue {
    /// Marks containers (ledger keys or runtime ids) for comparison and wakes the worker.
    pub fn mark(&self, keys: impl IntoIterator<Item = String>) {
        let mut k = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let mut any = false;
        for key in keys {
            any = true;
            k.insert(key);
        }
        drop(k);
        // Even when every key was marked already: one may have become committed since.
        if any {
            self.wake.notify_one();
        }
    }

    fn snapshot(&self) -> Vec<String> {
        let k = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        k.iter().cloned().collect()
    }

    fn clear(&self, key: &str) {
        self.keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    pub fn len(&self) -> usize {
        self.keys.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Ledger {
    /// The runtime is reachable again (a new NRI session): writes waiting for a retry go now,
    /// their backoff forgotten, and every committed container is compared.
    pub fn retry_now(&self) {
        {
            let mut b = self.book();
            for e in b.entries.values_mut() {
                e.flight.failures = 0;
                e.flight.last = LastWrite::Done;
                e.flight.not_before = None;
            }
        }
        self.sweep();
    }
}

/// How the loop's last write for a container ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum LastWrite {
    /// Answered (or none yet).
    #[default]
    Done,
    /// Not sent: the writer deferred it.
    Deferred,
    /// Refused or not delivered.
    Failed,
    /// No answer in time: a hung shim, most likely. Such a container's updates never ride on
    /// an answer (containerd would hold the request, and every other one, on that shim).
    TimedOut,
}

/// Whether a loop write for a container is out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum LoopWrite {
    #[default]
    Idle,
    Out,
}

/// Whether the order in which the runtime applied a container's last writes is known.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Order {
    #[default]
    Known,
    /// A loop write and a hook's own call overlapped.
    Unknown,
}

/// An entry's writes: the loop's own and the hooks' forwarded calls.
#[derive(Debug, Clone, Default)]
pub(super) struct Flight {
    loop_write: LoopWrite,
    order: Order,
    /// Hooks' own calls for this container out now (a start and a resize may overlap).
    hooks_out: u32,
    /// Failed writes in a row, how the last ended, and when the next may go.
    failures: u32,
    last: LastWrite,
    not_before: Option<Instant>,
}

impl Flight {
    /// A hook forwards a call that sets this container's cpuset.
    pub(super) fn hook_write_begins(&mut self) {
        self.hooks_out = self.hooks_out.saturating_add(1);
        if self.loop_write == LoopWrite::Out {
            self.order = Order::Unknown;
        }
    }

    fn hook_writing(&self) -> bool {
        self.hooks_out > 0
    }

    /// Whether an update for this container may ride on an answer now.
    fn may_ride(&self, now: Instant) -> bool {
        match self.last {
            LastWrite::TimedOut => false,
            LastWrite::Failed => self.not_before.is_none_or(|t| t <= now),
            LastWrite::Done | LastWrite::Deferred => true,
        }
    }

    /// The hook's call is answered; `sent` is what it set when the runtime applied it. Returns
    /// what the runtime holds as far as can be told (unknown after an overlap). A loop write
    /// still out keeps the overlap: its answer is not trusted either.
    pub(super) fn settle_hook_write(&mut self, sent: Option<Applied>) -> Option<Applied> {
        self.hooks_out = self.hooks_out.saturating_sub(1);
        if self.hook_writing() {
            // Another hook's call is still out: its answer settles what the runtime holds.
            return None;
        }
        let order = match self.loop_write {
            LoopWrite::Out => self.order,
            LoopWrite::Idle => std::mem::take(&mut self.order),
        };
        if order == Order::Unknown {
            None
        } else {
            sent
        }
    }

    /// A write of the loop's or a hook's is out.
    pub(super) fn busy(&self) -> bool {
        self.loop_write == LoopWrite::Out || self.hook_writing()
    }

    fn retry_delay(&self) -> Duration {
        let floor = if self.last == LastWrite::TimedOut {
            RETRY_AFTER_TIMEOUT
        } else {
            Duration::ZERO
        };
        // The first failure waits about RETRY_MIN.
        Delays::doubling(RETRY_MIN, RETRY_MAX, Spread::Jittered)
            .after(self.failures)
            .max(floor)
    }
}

/// One write the worker sends: for `key` at generation `seq`.
#[derive(Debug)]
pub(super) struct Dispatch {
    pub(super) key: String,
    seq: u64,
    pub(super) update: Update,
}

/// What a pass found to do.
pub(super) struct Due {
    pub(super) writes: Vec<Dispatch>,
    /// The earliest retry still waiting.
    next_retry: Option<Instant>,
}

impl Ledger {
    /// The dirty set (for a mode that must hand it to a helper, e.g. a late decision).
    pub fn dirty(&self) -> &Arc<DirtyQueue> {
        &self.dirty
    }

    /// The cpuset writes the loop would send now, ignoring retry delays (tests and status).
    pub fn pending_updates(&self) -> Vec<Update> {
        let b = self.book();
        let mut out: Vec<Update> = self
            .dirty
            .snapshot()
            .iter()
            .filter_map(|k| self.difference(&b, k))
            .map(|(_, u)| u)
            .collect();
        out.sort_by(|a, b| a.container_id.cmp(&b.container_id));
        out
    }

    /// Containers whose runtime cpuset differs from the engine's, for the
    /// `tap_unconverged_containers` gauge. Only marked containers can differ (every change
    /// marks what it affects, and the sweep marks the rest), so only they are compared: the
    /// worker reads this after every pass.
    pub fn unconverged(&self) -> usize {
        let b = self.book();
        let mut keys: Vec<String> = self
            .dirty
            .snapshot()
            .iter()
            .filter_map(|k| b.resolve(k))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        keys.iter()
            .filter(|k| self.difference(&b, k).is_some())
            .count()
    }

    /// The write that would bring `key` to what the engine wants, if it is committed, has a
    /// grant and the runtime (as far as known) holds something else.
    pub(super) fn difference(&self, b: &Book, key: &str) -> Option<(u64, Update)> {
        let key = b.resolve(key)?;
        let e = b.entries.get(key.as_str())?;
        if !matches!(e.state, State::Committed) {
            return None;
        }
        let (cpus, mems) = self.agent.current(&key)?;
        if e.applied.as_ref() == Some(&Applied::new(cpus, mems)) {
            return None;
        }
        let container_id = match &e.runtime_id {
            Some(id) => id.to_string(),
            None => key,
        };
        Some((
            e.seq,
            Update {
                container_id,
                cpus,
                mems,
            },
        ))
    }

    /// Takes the writes due now, marking them out; drops converged and vanished keys.
    pub(super) fn take_due(&self, now: Instant) -> Due {
        let mut b = self.book();
        let mut due = Due {
            writes: Vec::new(),
            next_retry: None,
        };
        for mark in self.dirty.snapshot() {
            let Some(key) = b.resolve(&mark) else {
                self.dirty.clear(&mark);
                continue;
            };
            if key != mark {
                // Marked by runtime id: keep one mark per container, by key.
                self.dirty.clear(&mark);
                self.dirty.mark([key.clone()]);
            }
            let Some(e) = b.entries.get(key.as_str()) else {
                continue;
            };
            match e.state {
                State::Committed => {}
                // Their commit or abort marks them again.
                State::PendingCreate | State::PendingUpdate { .. } => continue,
                State::Stopped => {
                    self.dirty.clear(&key);
                    continue;
                }
            }
            if e.flight.busy() {
                continue;
            }
            if let Some(t) = e.flight.not_before.filter(|t| *t > now) {
                due.next_retry = Some(due.next_retry.map_or(t, |n| n.min(t)));
                continue;
            }
            let Some((seq, update)) = self.difference(&b, &key) else {
                self.dirty.clear(&key);
                continue;
            };
            if let Some(e) = b.entries.get_mut(key.as_str()) {
                e.flight.loop_write = LoopWrite::Out;
                e.flight.order = Order::Known;
            }
            due.writes.push(Dispatch { key, seq, update });
        }
        due
    }

    /// Records a write's outcome. The container stays dirty: the next pass compares again (and
    /// clears it when the runtime holds what the engine wants).
    pub(super) fn settle(&self, d: Dispatch, result: Result<(), WriteError>) {
        let mut b = self.book();
        let Some(e) = b.entries.get_mut(d.key.as_str()) else {
            return;
        };
        e.flight.loop_write = LoopWrite::Idle;
        // A hook's call overlapped this write and was answered first: not trusted either.
        let overlapped =
            !e.flight.hook_writing() && std::mem::take(&mut e.flight.order) == Order::Unknown;
        match result {
            Ok(()) => {
                tracing::info!(container = %d.update.container_id, cpus = %d.update.cpus, "cpuset updated");
                e.flight.failures = 0;
                e.flight.last = LastWrite::Done;
                e.flight.not_before = None;
                let current = e.seq == d.seq && matches!(e.state, State::Committed);
                if e.flight.hook_writing() {
                    // A hook's call for it is out too: order unknown until it is answered.
                    e.flight.order = Order::Unknown;
                } else if current && !overlapped {
                    e.applied = Some(Applied::new(d.update.cpus, d.update.mems));
                } else {
                    e.applied = None;
                }
                self.agent.metrics().count_cpuset_write("ok");
            }
            Err(WriteError::Deferred(why)) => {
                // Nothing was sent: what the runtime holds is as before.
                tracing::debug!(container = %d.update.container_id, "cpuset update deferred: {why}");
                e.flight.last = LastWrite::Deferred;
                e.flight.not_before = Some(Instant::now() + DEFER_FOR);
                if overlapped {
                    e.applied = None;
                }
            }
            Err(err) => {
                // A write that timed out or was cut off may still land later: what the runtime
                // holds is unknown until a later write or read-back says. A refusal changed
                // nothing.
                if overlapped || matches!(err, WriteError::Timeout(_) | WriteError::Unreachable(_))
                {
                    e.applied = None;
                }
                e.flight.failures = e.flight.failures.saturating_add(1);
                e.flight.last = if matches!(err, WriteError::Timeout(_)) {
                    LastWrite::TimedOut
                } else {
                    LastWrite::Failed
                };
                let delay = e.flight.retry_delay();
                e.flight.not_before = Some(Instant::now() + delay);
                tracing::warn!(
                    container = %d.update.container_id,
                    failures = e.flight.failures,
                    retry_in_ms = delay.as_millis() as u64,
                    "cpuset update failed: {err}"
                );
                self.agent.metrics().count_error(Hook::Update, err.kind());
                self.agent.metrics().count_cpuset_write(err.kind().as_str());
            }
        }
        drop(b);
        self.dirty.mark([d.key]);
    }

    /// The writes due now, taken to ride on the answer to one of the runtime's own requests
    /// (NRI), which the runtime applies as it handles that request: each counts as applied
    /// (the read-back sees one the runtime failed to apply). Containers with a write out,
    /// pending, waiting for a retry after a failure, or whose last write timed out are left to
    /// the loop.
    pub fn claim_for_answer(&self) -> Vec<Update> {
        let mut b = self.book();
        let now = Instant::now();
        let mut out = Vec::new();
        for mark in self.dirty.snapshot() {
            let Some(key) = b.resolve(&mark) else {
                self.dirty.clear(&mark);
                continue;
            };
            let Some((_, update)) = self.difference(&b, &key) else {
                // Settled, as the loop would find it (pending ones are marked at their end).
                if b.entries
                    .get(key.as_str())
                    .is_some_and(|e| matches!(e.state, State::Committed))
                {
                    self.dirty.clear(&mark);
                }
                continue;
            };
            let Some(e) = b.entries.get_mut(key.as_str()) else {
                continue;
            };
            if e.flight.busy() || !e.flight.may_ride(now) {
                continue;
            }
            e.applied = Some(Applied::new(update.cpus, update.mems));
            self.dirty.clear(&mark);
            out.push(update);
        }
        out
    }

    /// Marks every committed container for comparison.
    fn sweep(&self) {
        let keys: Vec<String> = {
            let b = self.book();
            b.entries
                .iter()
                .filter(|(_, e)| matches!(e.state, State::Committed))
                .map(|(k, _)| k.to_string())
                .collect()
        };
        self.dirty.mark(keys);
    }

    /// One pass: sends what is due, `PARALLEL_WRITES` at a time. Returns when the next retry
    /// is due (if any is waiting) and whether anything was sent.
    pub async fn converge_once(&self, w: &dyn Writer) -> (Option<Instant>, bool) {
        let due = self.take_due(Instant::now());
        let sent = !due.writes.is_empty();
        futures_util::stream::iter(due.writes)
            .map(|d| async move {
                let r = match tokio::time::timeout(WRITE_DEADLINE, w.write_cpuset(&d.update)).await
                {
                    Ok(r) => r,
                    Err(_) => Err(WriteError::Timeout(WRITE_DEADLINE)),
                };
                (d, r)
            })
            .buffer_unordered(PARALLEL_WRITES)
            .for_each(|(d, r)| {
                self.settle(d, r);
                std::future::ready(())
            })
            .await;
        (due.next_retry, sent)
    }

    /// The worker: runs until `shutdown`.
    pub async fn converge(self: Arc<Self>, w: Arc<dyn Writer>, shutdown: CancellationToken) {
        let mut last_sweep = Instant::now();
        loop {
            if last_sweep.elapsed() >= SWEEP_EVERY {
                self.sweep();
                last_sweep = Instant::now();
            }
            let (next_retry, sent) = match w.channel() {
                Channel::OwnCalls => self.converge_once(w.as_ref()).await,
                Channel::AnswersOnly => (None, false),
            };
            self.agent()
                .metrics()
                .unconverged
                .set(i64::try_from(self.unconverged()).unwrap_or(i64::MAX));
            if sent {
                continue;
            }
            let until_sweep = SWEEP_EVERY.saturating_sub(last_sweep.elapsed());
            let wait = next_retry
                .map(|t| t.saturating_duration_since(Instant::now()))
                .map_or(until_sweep, |d| d.min(until_sweep));
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.dirty.wake.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}
