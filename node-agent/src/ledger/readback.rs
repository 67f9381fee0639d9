//! The read-back: what each settled container's cgroup holds becomes what the book counts as
//! applied, in every mode, every [`READ_BACK_EVERY`]. A write the runtime answered but never
//! made (containerd 1.7 puts an update that overlaps a start into the spec only), an update
//! that rode on an answer and failed there, a cgroup rewritten behind the agent's back (a
//! systemd `daemon-reload` re-applying a scope's `AllowedCPUs`, another tool): each is seen
//! here, and the convergence loop writes the container again.
//!
//! A reading counts only if nothing about the container changed while it was read: same
//! generation, same `applied`, no write out (a stale reading would only cause one more write,
//! but the books should not move back and forth).

use super::{Applied, Ledger, State};
use crate::cgroupfs::{CgroupError, Cgroupfs, Cpuset};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often every settled container's cgroup is read.
pub const READ_BACK_EVERY: Duration = Duration::from_secs(5);

/// A container to read, and what the book said of it then.
#[derive(Debug)]
pub(super) struct Target {
    pub(super) key: String,
    pub(super) runtime_id: String,
    seq: u64,
    applied: Option<Applied>,
}

/// What one pass found, by container.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReadBackReport {
    /// As the book said.
    pub same: u64,
    /// The book said something else (or did not know): it now says what the cgroup holds.
    pub corrected: u64,
    /// No cgroup (not started yet, or gone).
    pub not_found: u64,
    pub errors: u64,
}

impl Ledger {
    /// The committed containers with no write out.
    pub(super) fn read_back_targets(&self) -> Vec<Target> {
        let b = self.book();
        b.entries
            .iter()
            .filter(|(_, e)| matches!(e.state, State::Committed) && !e.flight.busy())
            .map(|(k, e)| Target {
                key: k.to_string(),
                runtime_id: e.runtime_id.as_deref().unwrap_or(k).to_string(),
                seq: e.seq,
                applied: e.applied.clone(),
            })
            .collect()
    }

    /// Takes one reading into the book; returns whether it corrected the book, or `None` when
    /// the container changed meanwhile (the reading is dropped).
    pub(super) fn take_reading(&self, t: &Target, read: &Cpuset) -> Option<bool> {
        let mut b = self.book();
        let e = b.entries.get_mut(t.key.as_str())?;
        let unchanged = matches!(e.state, State::Committed)
            && e.seq == t.seq
            && e.applied == t.applied
            && !e.flight.busy();
        if !unchanged {
            return None;
        }
        // Memory nodes count only where the agent binds them.
        let binds_mems = self.agent.current(&t.key).is_some_and(|(_, m)| m.is_some());
        let mems = binds_mems.then_some(read.mems);
        let now = Applied::new(read.cpus, mems);
        if e.applied.as_ref() == Some(&now) {
            return Some(false);
        }
        if let Some(before) = &e.applied {
            tracing::warn!(
                container = %t.runtime_id,
                books = %before.cpus,
                cgroup = %now.cpus,
                "the container's cgroup holds another cpuset than the runtime was given; writing it again"
            );
        }
        e.applied = Some(now);
        Some(true)
    }

    /// One pass over every settled container: reads their cgroups (on a blocking thread) and
    /// marks those that differ from what the engine wants for the convergence loop.
    pub async fn read_back_once(&self, fs: &Arc<Cgroupfs>) -> ReadBackReport {
        let targets = self.read_back_targets();
        let reader = fs.clone();
        let reads = tokio::task::spawn_blocking(move || {
            targets
                .into_iter()
                .map(|t| {
                    let r = reader.read(&t.runtime_id);
                    (t, r)
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        let mut report = ReadBackReport::default();
        let mut marks = Vec::new();
        for (t, r) in reads {
            match r {
                Ok(read) => match self.take_reading(&t, &read) {
                    Some(true) => {
                        report.corrected += 1;
                        marks.push(t.key);
                    }
                    Some(false) => report.same += 1,
                    None => {}
                },
                Err(e) if e.is_not_found() => report.not_found += 1,
                Err(e) => {
                    report.errors += 1;
                    read_failed(&t.runtime_id, &e);
                }
            }
        }
        self.dirty.mark(marks);
        let m = self.agent.metrics();
        m.count_readback("same", report.same);
        m.count_readback("corrected", report.corrected);
        m.count_readback("not_found", report.not_found);
        m.count_readback("error", report.errors);
        report
    }

    /// Reads back every [`READ_BACK_EVERY`] until `shutdown`.
    pub async fn keep_read_back(self: Arc<Self>, fs: Arc<Cgroupfs>, shutdown: CancellationToken) {
        tracing::info!(
            cgroup_root = %fs.root().display(),
            every = ?READ_BACK_EVERY,
            "reading containers' cpusets back from their cgroups ({})",
            fs.hierarchy().as_str()
        );
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(READ_BACK_EVERY) => {}
            }
            self.read_back_once(&fs).await;
        }
    }
}

/// Starts the read-back over `fs` (none where no cgroup filesystem with cpusets was found).
pub fn spawn(
    ledger: &Arc<Ledger>,
    fs: Option<Arc<Cgroupfs>>,
    shutdown: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let (ledger, stop) = (ledger.clone(), shutdown.clone());
    tokio::spawn(async move {
        if let Some(fs) = fs {
            ledger.keep_read_back(fs, stop).await;
        }
    })
}

fn read_failed(id: &str, e: &CgroupError) {
    tracing::warn!(container = %id, "cannot read the container's cpuset back: {e}");
}
