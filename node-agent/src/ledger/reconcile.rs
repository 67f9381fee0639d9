//! Bringing the book in line with the runtime's list: at start-up ([`Ledger::restore`]), at an
//! NRI Synchronize, and periodically in the proxy modes ([`Ledger::reconcile`]).

use super::state_file::Records;
use super::{Applied, Book, Ledger, Listed, ReconcileReport, State};
use crate::agent::ContainerInfo;
use crate::hook::Hook;
use std::collections::HashMap;
use tap_engine::request::GRANT_KEY;

/// What a runtime's list covers, and so what the ledger may conclude from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listing {
    /// Keys and ids of live containers (the cheap list): releases and adoptions only.
    Ids,
    /// Every live container with the cpuset the runtime holds now (a periodic read-back):
    /// that becomes `applied` for settled containers, so a lost or reordered write is seen.
    Live,
    /// Everything at the start of a session (agent start-up, NRI Synchronize): as `Live`, and
    /// the calls that were in flight belong to a session that is gone; grants the runtime
    /// never applied, and grants the book does not know, are dropped.
    Session,
}

impl Listing {
    fn reads_cpusets(self) -> bool {
        !matches!(self, Listing::Ids)
    }

    fn is_session(self) -> bool {
        matches!(self, Listing::Session)
    }
}

impl Ledger {
    /// Rebuilds the book at start-up from everything the runtime lists (live containers only)
    /// and, the first time, the state file. `since` is the ledger clock read before the list
    /// was taken ([`Ledger::now`]): calls that came in after it (a create answered while a late
    /// restore still ran) are newer than the list and left alone.
    pub fn restore(&self, listed: Vec<Listed>, since: u64) -> ReconcileReport {
        let first = !self
            .records_loaded
            .swap(true, std::sync::atomic::Ordering::AcqRel);
        if let Some(f) = self.file.as_ref().filter(|_| first) {
            let records = match f.load() {
                Ok(r) => r,
                Err(e) => {
                    let aside = f.quarantine();
                    tracing::error!(
                        moved_to = ?aside,
                        "{e}; rebuilding the grants from the records stored in the containers"
                    );
                    self.agent
                        .metrics()
                        .count_error(Hook::Sync, crate::metrics::ErrorKind::State);
                    Records::new()
                }
            };
            self.book().records = records;
        }
        self.reconcile(listed, since, Listing::Session)
    }

    /// One running container the book lacks (or has as stopped), reported by the runtime on
    /// its own (NRI: a start confirmed after its create was given up): adopted from what it
    /// holds, by the restore rules; nothing else is compared or released. Whether it was.
    pub fn adopt_one(&self, l: Listed) -> bool {
        let mut report = ReconcileReport::default();
        let mut b = self.book();
        let listed = [l];
        let touched = self
            .adopt_unknown(&mut b, &listed, u64::MAX, Listing::Ids, &mut report)
            .unwrap_or_default();
        drop(b);
        self.dirty.mark(touched);
        report.adopted > 0
    }

    /// Brings the book in line with the runtime's list of live containers, taken after the
    /// ledger clock read `since` (entries changed later are left alone): grants of containers
    /// the runtime no longer has are released, containers the ledger does not know (or knew as
    /// stopped) are adopted from the records they carry, and with a listing that reads cpusets
    /// what the runtime holds becomes `applied`. Every container touched is marked for the
    /// convergence loop.
    pub fn reconcile(&self, listed: Vec<Listed>, since: u64, how: Listing) -> ReconcileReport {
        let mut report = ReconcileReport::default();
        let mut b = self.book();
        let live: HashMap<&str, &Listed> = listed.iter().map(|l| (l.info.id.as_str(), l)).collect();
        if how.is_session() {
            self.end_calls_in_flight(&mut b, since);
        }
        let mut touched = self.release_missing(&mut b, &live, since, how, &mut report);
        let adopted = self.adopt_unknown(&mut b, &listed, since, how, &mut report);
        let engine_failed = adopted.is_none();
        touched.extend(adopted.unwrap_or_default());
        self.learn_runtime_ids(&mut b, &listed);
        if how.reads_cpusets() {
            touched.extend(self.read_back(&mut b, &listed, since));
        }
        // After a failed adoption the records of the containers not booked stay for the retry.
        if !engine_failed {
            self.drop_stale_records(&mut b);
        }
        drop(b);
        self.dirty.mark(touched);
        report
    }

    /// A session starts: a change still pending from before the list (`since`) belongs to a
    /// call that is gone (its handler was dropped with its connection, or its confirmation will
    /// never come). It is taken as done and the list says what the runtime really has: a create
    /// it does not list is released, the read-back gives what it holds. Calls that came after
    /// the list belong to the new session and stay pending.
    fn end_calls_in_flight(&self, b: &mut Book, since: u64) {
        for e in b.entries.values_mut().filter(|e| e.seq < since) {
            match std::mem::replace(&mut e.state, State::Committed) {
                State::PendingUpdate { after_info, .. } => {
                    e.info.replace(*after_info);
                    e.flight.settle_hook_write(None);
                }
                State::Stopped => e.state = State::Stopped,
                State::PendingCreate | State::Committed => {}
            }
        }
    }

    /// Step 1: entries the runtime does not have (or has under another runtime id, or, at a
    /// session start, whose grant it never applied), and at a session start grants the book does not know (a decision that came
    /// too late). Returns the neighbours whose cpusets change.
    fn release_missing(
        &self,
        b: &mut Book,
        live: &HashMap<&str, &Listed>,
        since: u64,
        how: Listing,
        report: &mut ReconcileReport,
    ) -> Vec<String> {
        let session = how.is_session();
        let settled = b
            .entries
            .iter()
            .filter(|(_, e)| match e.state {
                State::Committed | State::Stopped => e.seq < since,
                // At a session start none is left pending (`end_calls_in_flight`).
                State::PendingCreate | State::PendingUpdate { .. } => false,
            })
            .map(|(k, _)| k.to_string());
        let orphans = if session {
            self.agent
                .granted()
                .into_iter()
                .filter(|k| !b.entries.contains_key(k.as_str()))
                .collect()
        } else {
            Vec::new()
        };
        let never_applied = |l: &Listed| {
            session && l.info.cpus.is_none() && !l.info.annotations.contains_key(GRANT_KEY)
        };
        // The key listed under another runtime id: the container the book knows is gone and a
        // new one took its name (behind a proxy); the new one is adopted in step 2.
        let replaced = |k: &str, l: &Listed| b.replaced(k, &l.runtime_id);
        let stale: Vec<String> = settled
            .chain(orphans)
            .filter(|k| {
                live.get(k.as_str())
                    .is_none_or(|l| never_applied(l) || replaced(k, l))
            })
            .collect();
        let mut touched = Vec::new();
        for k in stale {
            if self.agent.current(&k).is_some() {
                tracing::info!(container = %k, "releasing a grant the runtime does not have");
                report.released += 1;
            }
            touched.extend(self.agent.remove(&k).into_iter().map(|u| u.container_id));
            b.records.remove(&k);
            b.forget(&k);
        }
        touched
    }

    /// Step 2: containers the book does not have, or has as stopped (started again behind
    /// the agent's back), are adopted through the engine's restore. Returns the adopted keys
    /// and the neighbours whose cpusets change; `None` when the engine failed (nothing booked).
    fn adopt_unknown(
        &self,
        b: &mut Book,
        listed: &[Listed],
        since: u64,
        how: Listing,
        report: &mut ReconcileReport,
    ) -> Option<Vec<String>> {
        // A stop recorded after the list was taken is newer than the list: left alone.
        let unknown: Vec<&Listed> = listed
            .iter()
            .filter(|l| {
                b.entries
                    .get(l.info.id.as_str())
                    .is_none_or(|e| matches!(e.state, State::Stopped) && e.seq < since)
            })
            .collect();
        // A session start always goes through the engine's restore (it logs what it adopted).
        if !how.is_session() && unknown.is_empty() {
            return Some(Vec::new());
        }
        let infos: Vec<ContainerInfo> = unknown
            .iter()
            .map(|l| {
                let mut i = l.info.clone();
                if let Some(r) = b.records.get(&i.id) {
                    i.annotations.insert(GRANT_KEY.into(), r.clone());
                }
                i
            })
            .collect();
        // The engine failed (logged and counted): nothing is booked, the next comparison
        // adopts them.
        let Ok(ups) = self.agent.restore(&infos) else {
            return None;
        };
        let mut touched: Vec<String> = ups.into_iter().map(|u| u.container_id).collect();
        let seq = self.now();
        for (l, info) in unknown.iter().zip(infos) {
            report.adopted += 1;
            touched.push(info.id.clone());
            b.forget(&info.id);
            let applied = info.cpus.map(|c| Applied::new(c, info.mems));
            b.add(info.placement_inputs(), State::Committed, seq)
                .applied = applied;
            if !l.runtime_id.is_empty() {
                b.set_runtime_id(&info.id, &l.runtime_id);
            }
        }
        Some(touched)
    }

    /// Step 3: runtime ids the book did not learn at create (an answer without a readable id).
    fn learn_runtime_ids(&self, b: &mut Book, listed: &[Listed]) {
        for l in listed.iter().filter(|l| !l.runtime_id.is_empty()) {
            let unnamed = b
                .entries
                .get(l.info.id.as_str())
                .is_some_and(|e| e.runtime_id.is_none());
            if unnamed {
                b.set_runtime_id(&l.info.id, &l.runtime_id);
            }
        }
    }

    /// Step 4: what the runtime holds is what counts as applied, for containers settled before
    /// the list was taken and with no write out. Returns the containers read.
    fn read_back(&self, b: &mut Book, listed: &[Listed], since: u64) -> Vec<String> {
        let mut touched = Vec::new();
        for l in listed {
            let Some(e) = b.entries.get_mut(l.info.id.as_str()) else {
                continue;
            };
            let settled = matches!(e.state, State::Committed) && e.seq < since;
            if settled && !e.flight.busy() {
                e.applied = l.info.cpus.map(|c| Applied::new(c, l.info.mems));
                touched.push(l.info.id.clone());
            }
        }
        touched
    }

    /// Grant records of containers the book no longer has are dropped from the state file.
    fn drop_stale_records(&self, b: &mut Book) {
        let before = b.records.len();
        let Book {
            entries, records, ..
        } = b;
        records.retain(|k, _| entries.contains_key(k.as_str()));
        if b.records.len() != before {
            self.save(&b.records);
        }
    }
}
