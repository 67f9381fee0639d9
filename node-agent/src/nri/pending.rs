//! Calls answered and not yet confirmed by the runtime (a create until PostStartContainer, a
//! resize until PostUpdateContainer), and the one task that gives them up when their time
//! is over.
//!
//! Holding a call costs the hook a map insert: no task and no timer per call. The sweeper
//! wakes every tick while calls are held (a quarter of the shortest timeout held so far, at
//! most a second), so a call is given up at most a tick after its timeout; with nothing held it
//! sleeps until the next hold.

use crate::hook::Hook;
use crate::ledger::{Ledger, Ticket};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// What a pending call is, for its log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unconfirmed {
    /// A create containerd did not finish.
    Create,
    /// A resize containerd refused.
    Resize,
}

/// A call waiting for its confirmation.
struct Held {
    ticket: Ticket,
    due: Instant,
    what: Unconfirmed,
}

/// The longest a sweeper sleeps between looks while calls are held.
const MAX_TICK: Duration = Duration::from_secs(1);

struct Calls {
    by_id: HashMap<String, Held>,
    /// The sweeper waits for a hold (nothing was held when it last looked).
    parked: bool,
    /// The sweeper runs (started at the first hold).
    started: bool,
    /// How long the sweeper sleeps between looks.
    tick: Duration,
}

/// Calls answered and not yet confirmed, by container id (a newer call for the same
/// container replaces an older one, which is aborted).
pub struct Pending {
    calls: Mutex<Calls>,
    /// Wakes a parked sweeper (a hold, or this Pending dropped).
    wake: Arc<Notify>,
}

impl Default for Pending {
    fn default() -> Pending {
        Pending {
            calls: Mutex::new(Calls {
                by_id: HashMap::new(),
                parked: false,
                started: false,
                tick: MAX_TICK,
            }),
            wake: Arc::new(Notify::new()),
        }
    }
}

impl Drop for Pending {
    /// A parked sweeper wakes, finds the Pending gone and ends.
    fn drop(&mut self) {
        self.wake.notify_one();
    }
}

impl Pending {
    fn lock(&self) -> MutexGuard<'_, Calls> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The held call of `id`, no longer held.
    pub fn take(&self, id: &str) -> Option<Ticket> {
        self.lock().by_id.remove(id).map(|h| h.ticket)
    }

    /// Commits the pending create of `id`, if there is one.
    pub fn take_into(&self, ledger: &Ledger, id: &str) -> bool {
        match self.take(id) {
            Some(t) => {
                ledger.commit_create(t, Some(id.to_string()));
                true
            }
            None => false,
        }
    }

    /// Forgets every held call (their tickets dropped, not aborted).
    pub fn clear(&self) {
        self.lock().by_id.clear();
    }

    /// How many calls are held.
    pub fn len(&self) -> usize {
        self.lock().by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps `t` until confirmed; unconfirmed after `timeout`, it is aborted (the grant of a
    /// create released, a resize's previous grant restored). An older call of the same
    /// container is aborted now. Call it inside a Tokio runtime.
    pub fn hold(
        self: &Arc<Self>,
        ledger: &Arc<Ledger>,
        id: String,
        t: Ticket,
        (what, timeout): (Unconfirmed, Duration),
    ) {
        let held = Held {
            ticket: t,
            due: Instant::now() + timeout,
            what,
        };
        let mut calls = self.lock();
        let older = calls.by_id.insert(id, held);
        calls.tick = calls.tick.min((timeout / 4).max(Duration::from_millis(1)));
        if !calls.started {
            calls.started = true;
            let wake = self.wake.clone();
            tokio::spawn(sweep(Arc::downgrade(self), wake, ledger.clone()));
        } else if calls.parked {
            calls.parked = false;
            self.wake.notify_one();
        }
        drop(calls);
        if let Some(older) = older {
            ledger.abort(older.ticket);
        }
    }

    /// The calls due by `now`, no longer held, and the tick; `None` when nothing is held (the
    /// sweeper parks).
    fn expired(&self, now: Instant) -> Option<(Vec<(String, Held)>, Duration)> {
        let mut calls = self.lock();
        if calls.by_id.is_empty() {
            calls.parked = true;
            return None;
        }
        let out = calls.by_id.extract_if(|_, h| h.due <= now).collect();
        Some((out, calls.tick))
    }
}

/// Gives up the calls whose time is over, until the [`Pending`] is dropped.
async fn sweep(pending: Weak<Pending>, wake: Arc<Notify>, ledger: Arc<Ledger>) {
    loop {
        let Some(p) = pending.upgrade() else { return };
        let found = p.expired(Instant::now());
        // The Pending is not kept alive while the sweeper sleeps.
        drop(p);
        match found {
            // Woken by the next hold, or by the Pending's drop.
            None => wake.notified().await,
            Some((gone, tick)) => {
                for (id, h) in gone {
                    give_up(&ledger, &id, h);
                }
                tokio::time::sleep(tick).await;
            }
        }
    }
}

fn give_up(ledger: &Ledger, id: &str, h: Held) {
    tracing::warn!(container = %id, what = ?h.what, "containerd did not confirm it; undone");
    ledger
        .agent()
        .metrics()
        .count_error(Hook::Update, crate::metrics::ErrorKind::Unconfirmed);
    ledger.abort(h.ticket);
}
