//! The lifecycle ledger: one book of every container the agent has seen, for all three runtime
//! modes, so that the agent's state always equals the runtime's.
//!
//! - Every container has an entry keyed by the engine's key (NRI: the container id; CRI proxy:
//!   `<sandbox>/<name>/<attempt>`; Docker proxy: the container name), which exists before the
//!   runtime assigns an id. The runtime id, once known, maps to the key.
//! - Creates and updates are two-phase. `begin_*` reserves the decision (the engine's state
//!   changes) and returns a [`Ticket`]; the caller forwards the call; `commit` when the runtime
//!   said yes, `abort` otherwise, which rolls back exactly (a refused update gets its previous
//!   grant back). A create whose key is already in the book (a kubelet retrying after a timeout)
//!   is a duplicate: it never touches the first one's grant.
//! - Decisions run under the fail-open [`deadline`] and the agent's panic guard.
//! - What the runtime has applied is tracked per container; the updates a mode must send are
//!   always "what the engine wants now" for the containers whose applied cpuset differs, so a
//!   rollback, a stale update or a reordered one never leaves a container wrong.
//! - Grant records changed after create are kept in the [`state_file`].
//! - [`Ledger::reconcile`] brings the book in line with the runtime's list after a restart of
//!   either side.

pub mod deadline;
pub mod runtime;
pub mod state_file;

use crate::agent::{Adjustment, Agent, ContainerInfo, Update};
use deadline::Deadline;
use state_file::{Records, StateFile};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tap_engine::grant::Grant;
use tap_engine::request::GRANT_KEY;
use tap_engine::{CpuSet, NodeSet};

/// The span of one hook (a create, update, stop or remove as a mode sees it): every log line of
/// the hook carries the hook, the mode and, once the ledger knows them, the Pod, its namespace
/// and the container.
pub fn hook_span(hook: &'static str, mode: &'static str) -> tracing::Span {
    tracing::info_span!(
        "hook",
        hook,
        mode,
        pod = tracing::field::Empty,
        namespace = tracing::field::Empty,
        container = tracing::field::Empty,
    )
}

/// Records what the ledger knows of a container on the current hook span.
fn record_on_span(info: &ContainerInfo) {
    let span = tracing::Span::current();
    span.record("pod", info.pod.name.as_str());
    span.record("namespace", info.pod.namespace.as_str());
    span.record("container", info.name.as_str());
}

/// A container as the runtime lists it: the ledger key, the runtime's id, and what the runtime
/// says (resources, labels or annotations, the live cpuset and mems).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub runtime_id: String,
    /// `info.id` is the ledger key.
    pub info: ContainerInfo,
}

/// The cpuset and memory nodes a runtime holds for a container (no memory nodes and an empty
/// set of them are the same).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Applied {
    cpus: CpuSet,
    mems: Option<NodeSet>,
}

impl Applied {
    fn new(cpus: CpuSet, mems: Option<NodeSet>) -> Applied {
        Applied {
            cpus,
            mems: mems.filter(|m| !m.is_empty()),
        }
    }
}

#[derive(Debug, Clone)]
enum State {
    /// Decided (or being decided); the runtime has not answered the create yet.
    PendingCreate,
    Committed,
    /// A resize is forwarded; `before` is what to go back to if the runtime refuses it.
    PendingUpdate {
        before: Option<Box<Grant>>,
        before_info: Box<ContainerInfo>,
        after_info: Box<ContainerInfo>,
    },
}

#[derive(Debug, Clone)]
struct Entry {
    info: ContainerInfo,
    runtime_id: Option<String>,
    state: State,
    applied: Option<Applied>,
    /// Ledger clock at the last change (a reconcile leaves entries newer than its list alone).
    seq: u64,
}

#[derive(Default)]
struct Book {
    entries: HashMap<String, Entry>,
    /// Runtime id -> key.
    ids: HashMap<String, String>,
    /// Grant records changed after create (mirrors the state file).
    records: Records,
}

impl Book {
    /// The key of a container from a key, a runtime id, or a unique id prefix of 4+ hex digits
    /// (the Docker API accepts all three).
    fn resolve(&self, id: &str) -> Option<String> {
        let id = id.trim_start_matches('/');
        if self.entries.contains_key(id) {
            return Some(id.to_string());
        }
        if let Some(k) = self.ids.get(id) {
            return Some(k.clone());
        }
        if id.len() >= 4 && id.chars().all(|c| c.is_ascii_hexdigit()) {
            let mut hits = self.ids.iter().filter(|(full, _)| full.starts_with(id));
            if let (Some((_, k)), None) = (hits.next(), hits.next()) {
                return Some(k.clone());
            }
        }
        None
    }

    fn forget(&mut self, key: &str) {
        if let Some(e) = self.entries.remove(key) {
            if let Some(id) = e.runtime_id {
                self.ids.remove(&id);
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Create,
    /// A create for a key already in the book.
    Duplicate,
    Update,
    /// Nothing reserved (unknown container, or one with a change in flight).
    Pass,
}

/// A reserved decision, to be committed or aborted after the runtime answered.
#[must_use = "a ticket must be committed or aborted"]
#[derive(Debug)]
pub struct Ticket {
    key: String,
    phase: Phase,
    /// What to write into the forwarded call.
    pub adjustment: Adjustment,
}

impl Ticket {
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Whether this create repeats one the ledger already has.
    pub fn is_duplicate(&self) -> bool {
        self.phase == Phase::Duplicate
    }
}

/// What a reconcile changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Grants released because the runtime no longer has their container (or never applied
    /// them).
    pub released: usize,
    /// Containers the ledger did not know and adopted.
    pub adopted: usize,
}

pub struct Ledger {
    agent: Arc<Agent>,
    book: Mutex<Book>,
    file: Option<StateFile>,
    deadline: Deadline,
    clock: AtomicU64,
}

impl Ledger {
    /// A ledger over `agent`, keeping changed grant records in `file` if given.
    pub fn new(agent: Arc<Agent>, file: Option<StateFile>) -> Ledger {
        Ledger {
            agent,
            book: Mutex::new(Book::default()),
            file,
            deadline: Deadline::default(),
            clock: AtomicU64::new(1),
        }
    }

    pub fn agent(&self) -> &Arc<Agent> {
        &self.agent
    }

    /// The budget of one decision (NRI: from the runtime's request timeout).
    pub fn set_budget(&self, d: Duration) {
        self.deadline.set_budget(d);
    }

    pub fn budget(&self) -> Duration {
        self.deadline.budget()
    }

    /// The ledger clock now; pass it to [`Ledger::reconcile`] before listing the runtime.
    pub fn now(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The key of a known container from its key, runtime id or unique id prefix.
    pub fn resolve(&self, id: &str) -> Option<String> {
        self.book().resolve(id)
    }

    /// What the ledger knows of a container (key, runtime id or id prefix).
    pub fn info(&self, id: &str) -> Option<ContainerInfo> {
        let b = self.book();
        let key = b.resolve(id)?;
        b.entries.get(&key).map(|e| e.info.clone())
    }

    /// Every container in the book, by key (for tests and status).
    pub fn keys(&self) -> Vec<String> {
        let mut k: Vec<String> = self.book().entries.keys().cloned().collect();
        k.sort();
        k
    }

    /// Runs `f` under the deadline (see [`deadline`]).
    pub async fn decide<T, F, L>(&self, hook: &'static str, f: F, on_late: L) -> Option<T>
    where
        T: Send + 'static,
        F: FnOnce(&Agent) -> T + Send + 'static,
        L: FnOnce(&Agent, T) + Send + 'static,
    {
        self.deadline.run(&self.agent, hook, f, on_late).await
    }

    /// Reserves the placement of a container about to be created (`info.id` is the key).
    pub async fn begin_create(&self, info: ContainerInfo) -> Ticket {
        record_on_span(&info);
        let key = info.id.clone();
        {
            let mut b = self.book();
            if b.entries.contains_key(&key) {
                tracing::info!(container = %key, "a create repeats one in flight or done; its grant is left as it is");
                self.agent.metrics().count_error("create", "duplicate");
                return Ticket {
                    adjustment: self.existing_adjustment(&key),
                    key,
                    phase: Phase::Duplicate,
                };
            }
            let seq = self.now();
            b.entries.insert(
                key.clone(),
                Entry {
                    info: info.placement_inputs(),
                    runtime_id: None,
                    state: State::PendingCreate,
                    applied: None,
                    seq,
                },
            );
        }
        let late_key = key.clone();
        let adjustment = self
            .decide(
                "create",
                move |a| a.create(&info),
                move |a, late: Adjustment| {
                    if !late.is_empty() {
                        tracing::warn!(container = %late_key, "releasing a grant that came too late");
                        let _ = a.remove(&late_key);
                    }
                },
            )
            .await
            .unwrap_or_default();
        Ticket {
            key,
            phase: Phase::Create,
            adjustment,
        }
    }

    /// The adjustment a duplicate create gets: the first one's cpuset and record, so that a
    /// runtime that accepts it anyway creates the same container.
    fn existing_adjustment(&self, key: &str) -> Adjustment {
        match self.agent.current(key) {
            Some((cpus, mems)) => Adjustment {
                cpus: Some(cpus),
                mems,
                record: self.agent.record_of(key),
                updates: Vec::new(),
            },
            None => Adjustment::default(),
        }
    }

    /// The runtime created the container (`runtime_id` when its answer names it). Returns the
    /// cpuset updates other containers need now.
    pub fn commit_create(&self, t: Ticket, runtime_id: Option<String>) -> Vec<Update> {
        let mut b = self.book();
        let seq = self.now();
        let Some(e) = b.entries.get_mut(&t.key) else {
            return Vec::new();
        };
        let old_id = match t.phase {
            Phase::Create => {
                e.state = State::Committed;
                e.applied = t
                    .adjustment
                    .cpus
                    .map(|c| Applied::new(c, t.adjustment.mems));
                if let Some(r) = &t.adjustment.record {
                    e.info.annotations.insert(GRANT_KEY.into(), r.clone());
                }
                e.seq = seq;
                match &runtime_id {
                    Some(id) => e.runtime_id.replace(id.clone()),
                    None => None,
                }
            }
            // The runtime accepted a repeated create: the container under this key is the new
            // one (the first must be gone), with the same cpuset.
            Phase::Duplicate if runtime_id.is_some() => {
                e.seq = seq;
                std::mem::replace(&mut e.runtime_id, runtime_id.clone())
            }
            _ => return Vec::new(),
        };
        if let Some(old) = old_id {
            b.ids.remove(&old);
        }
        if let Some(id) = runtime_id {
            b.ids.insert(id, t.key.clone());
        }
        let keys = t.adjustment.updates.iter().map(|u| u.container_id.clone());
        self.wanted(&b, keys)
    }

    /// The runtime refused the call (or could not be reached): undo the reservation exactly.
    /// Returns the cpuset updates other containers need now (normally none).
    pub fn abort(&self, t: Ticket) -> Vec<Update> {
        let mut b = self.book();
        match t.phase {
            Phase::Create => {
                if matches!(
                    b.entries.get(&t.key).map(|e| &e.state),
                    Some(State::PendingCreate)
                ) {
                    b.forget(&t.key);
                }
                let ups = self.agent.remove(&t.key);
                self.wanted(&b, ups.into_iter().map(|u| u.container_id))
            }
            Phase::Update => {
                let Some(e) = b.entries.get_mut(&t.key) else {
                    return Vec::new();
                };
                let State::PendingUpdate {
                    before,
                    before_info,
                    ..
                } = std::mem::replace(&mut e.state, State::Committed)
                else {
                    return Vec::new();
                };
                e.info = *before_info;
                e.seq = self.now();
                let ups = self.agent.reinstate(&t.key, before.map(|g| *g));
                let keys = ups
                    .into_iter()
                    .map(|u| u.container_id)
                    .chain(t.adjustment.updates.iter().map(|u| u.container_id.clone()));
                self.wanted(&b, keys.chain(std::iter::once(t.key.clone())))
            }
            Phase::Duplicate | Phase::Pass => Vec::new(),
        }
    }

    /// Reserves the re-placement of a container whose resources change; `change` applies the
    /// new resources to what the ledger knows of it. An unknown container, or one with another
    /// change in flight, gets an empty ticket (the call is forwarded unchanged).
    pub async fn begin_update(&self, id: &str, change: impl FnOnce(&mut ContainerInfo)) -> Ticket {
        let pass = |key: String| Ticket {
            key,
            phase: Phase::Pass,
            adjustment: Adjustment::default(),
        };
        let (key, info) = {
            let mut b = self.book();
            let Some(key) = b.resolve(id) else {
                return pass(id.to_string());
            };
            let before = self.agent.grant_of(&key);
            let Some(e) = b.entries.get_mut(&key) else {
                return pass(key);
            };
            if !matches!(e.state, State::Committed) {
                tracing::warn!(container = %key, "an update while another change is in flight; forwarded unchanged");
                self.agent.metrics().count_error("update", "busy");
                return pass(key);
            }
            record_on_span(&e.info);
            let mut info = e.info.clone();
            change(&mut info);
            e.state = State::PendingUpdate {
                before: before.map(Box::new),
                before_info: Box::new(e.info.clone()),
                after_info: Box::new(info.clone()),
            };
            (key, info)
        };
        let adjustment = self
            .decide("update", move |a| a.update(&info), |_, _| {})
            .await
            .unwrap_or_default();
        Ticket {
            key,
            phase: Phase::Update,
            adjustment,
        }
    }

    /// The runtime applied the update. Returns the cpuset updates still needed (other
    /// containers, and this one if its decision came too late to ride along).
    pub fn commit_update(&self, t: Ticket) -> Vec<Update> {
        let mut b = self.book();
        if t.phase != Phase::Update {
            return Vec::new();
        }
        let seq = self.now();
        let Some(e) = b.entries.get_mut(&t.key) else {
            return Vec::new();
        };
        let State::PendingUpdate { after_info, .. } =
            std::mem::replace(&mut e.state, State::Committed)
        else {
            return Vec::new();
        };
        e.info = *after_info;
        e.seq = seq;
        let adj = &t.adjustment;
        if let Some(c) = adj.cpus {
            let mems = adj.mems.or(e.applied.as_ref().and_then(|a| a.mems));
            e.applied = Some(Applied::new(c, mems));
        }
        if let Some(r) = &adj.record {
            e.info.annotations.insert(GRANT_KEY.into(), r.clone());
            if b.records.get(&t.key) != Some(r) {
                b.records.insert(t.key.clone(), r.clone());
                self.save(&b.records);
            }
        }
        let keys = adj.updates.iter().map(|u| u.container_id.clone());
        self.wanted(&b, keys.chain(std::iter::once(t.key.clone())))
    }

    /// A container stopped (`forget == false`) or was removed (`true`): its grant is released
    /// (idempotent). Returns the cpuset updates other containers need now.
    pub fn release(&self, id: &str, forget: bool) -> Vec<Update> {
        let mut b = self.book();
        let Some(key) = b.resolve(id) else {
            return Vec::new();
        };
        if let Some(e) = b.entries.get(&key) {
            record_on_span(&e.info);
        }
        let ups = self.agent.remove(&key);
        if b.records.remove(&key).is_some() {
            self.save(&b.records);
        }
        if forget {
            b.forget(&key);
        } else if let Some(e) = b.entries.get_mut(&key) {
            e.seq = self.now();
        }
        self.wanted(&b, ups.into_iter().map(|u| u.container_id))
    }

    /// The runtime applied `u` (a cpuset update the ledger asked for).
    pub fn applied(&self, u: &Update) {
        let mut b = self.book();
        if let Some(key) = b.resolve(&u.container_id) {
            if let Some(e) = b.entries.get_mut(&key) {
                e.applied = Some(Applied::new(u.cpus, u.mems));
            }
        }
    }

    /// Rebuilds the book at start-up from everything the runtime lists (live containers only)
    /// and the state file. Returns the cpuset updates needed.
    pub fn restore(&self, listed: Vec<Listed>) -> (ReconcileReport, Vec<Update>) {
        if let Some(f) = &self.file {
            let records = match f.load() {
                Ok(r) => r,
                Err(e) => {
                    let aside = f.quarantine();
                    tracing::error!(
                        moved_to = ?aside,
                        "{e}; rebuilding the grants from the records stored in the containers"
                    );
                    self.agent.metrics().count_error("sync", "state");
                    Records::new()
                }
            };
            self.book().records = records;
        }
        self.reconcile(listed, u64::MAX, true)
    }

    /// Brings the book in line with the runtime's list of live containers, taken after the
    /// ledger clock read `since` (entries changed later are left alone). Grants of containers
    /// the runtime no longer has are released; containers the ledger does not know are adopted
    /// (from the grant records they carry). With `full`, `listed` also carries each
    /// container's live cpuset, which becomes what the ledger counts as applied, and grants the
    /// runtime never applied (no record, no cpuset) are dropped.
    pub fn reconcile(
        &self,
        listed: Vec<Listed>,
        since: u64,
        full: bool,
    ) -> (ReconcileReport, Vec<Update>) {
        let mut report = ReconcileReport::default();
        let mut b = self.book();
        let live: HashMap<&str, &Listed> = listed.iter().map(|l| (l.info.id.as_str(), l)).collect();
        let mut touched: Vec<String> = Vec::new();
        // 1. Entries the runtime does not have (or whose grant it never applied); with a full
        // list also grants the book does not know (a decision that came too late).
        // A full list comes when a session starts (NRI) or at start-up: a change still pending
        // then belongs to a call that is gone (its handler was dropped with its connection).
        if full {
            for e in b.entries.values_mut() {
                if let State::PendingUpdate { after_info, .. } =
                    std::mem::replace(&mut e.state, State::Committed)
                {
                    e.info = *after_info;
                }
            }
        }
        let settled = b
            .entries
            .iter()
            .filter(|(_, e)| match e.state {
                State::Committed => e.seq < since,
                State::PendingCreate => full,
                State::PendingUpdate { .. } => false,
            })
            .map(|(k, _)| k.clone());
        let orphans = if full {
            self.agent
                .granted()
                .into_iter()
                .filter(|k| !b.entries.contains_key(k))
                .collect()
        } else {
            Vec::new()
        };
        let stale: Vec<String> = settled
            .chain(orphans)
            .filter(|k| match live.get(k.as_str()) {
                None => true,
                Some(l) => {
                    full && l.info.cpus.is_none() && !l.info.annotations.contains_key(GRANT_KEY)
                }
            })
            .collect();
        for k in stale {
            if self.agent.current(&k).is_some() {
                tracing::info!(container = %k, "releasing a grant the runtime does not have");
                report.released += 1;
            }
            touched.extend(self.agent.remove(&k).into_iter().map(|u| u.container_id));
            b.records.remove(&k);
            b.forget(&k);
        }
        // 2. Containers the book does not have.
        let unknown: Vec<&Listed> = listed
            .iter()
            .filter(|l| !b.entries.contains_key(&l.info.id))
            .collect();
        // A full list always goes through the engine's restore (it logs what it adopted).
        if full || !unknown.is_empty() {
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
            let _ = self.agent.restore(&infos);
            let seq = self.now();
            for (l, info) in unknown.iter().zip(infos) {
                report.adopted += 1;
                touched.push(info.id.clone());
                if !l.runtime_id.is_empty() {
                    b.ids.insert(l.runtime_id.clone(), info.id.clone());
                }
                let applied = info.cpus.map(|c| Applied::new(c, info.mems));
                b.entries.insert(
                    info.id.clone(),
                    Entry {
                        runtime_id: Some(l.runtime_id.clone()).filter(|s| !s.is_empty()),
                        info: info.placement_inputs(),
                        state: State::Committed,
                        applied,
                        seq,
                    },
                );
            }
        }
        // 3. Runtime ids the book did not learn at create (an answer without a readable id).
        for l in &listed {
            if l.runtime_id.is_empty() {
                continue;
            }
            if let Some(e) = b.entries.get_mut(&l.info.id) {
                if e.runtime_id.is_none() {
                    e.runtime_id = Some(l.runtime_id.clone());
                    b.ids.insert(l.runtime_id.clone(), l.info.id.clone());
                }
            }
        }
        // 4. With a full list, what the runtime has is what counts as applied.
        if full {
            for l in &listed {
                if let Some(e) = b.entries.get_mut(&l.info.id) {
                    if matches!(e.state, State::Committed) && e.seq < since {
                        e.applied = l.info.cpus.map(|c| Applied::new(c, l.info.mems));
                        touched.push(l.info.id.clone());
                    }
                }
            }
        }
        let before = b.records.len();
        let Book {
            entries, records, ..
        } = &mut *b;
        records.retain(|k, _| entries.contains_key(k));
        if b.records.len() != before {
            self.save(&b.records);
        }
        let ups = self.wanted(&b, touched);
        (report, ups)
    }

    /// The updates that make the runtime hold what the engine wants for `keys`: one per
    /// committed container whose applied cpuset differs.
    fn wanted(&self, b: &Book, keys: impl IntoIterator<Item = String>) -> Vec<Update> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for key in keys {
            if !seen.insert(key.clone()) {
                continue;
            }
            let Some(e) = b.entries.get(&key) else {
                continue;
            };
            if !matches!(e.state, State::Committed) {
                continue;
            }
            let Some((cpus, mems)) = self.agent.current(&key) else {
                continue;
            };
            let want = Applied::new(cpus, mems);
            if e.applied.as_ref() == Some(&want) {
                continue;
            }
            out.push(Update {
                container_id: e.runtime_id.clone().unwrap_or(key),
                cpus,
                mems,
            });
        }
        out.sort_by(|a, b| a.container_id.cmp(&b.container_id));
        out
    }

    fn save(&self, records: &Records) {
        if let Some(f) = &self.file {
            if let Err(e) = f.save(records) {
                tracing::warn!("cannot store the grant records: {e}");
                self.agent.metrics().count_error("update", "state");
            }
        }
    }
}

#[cfg(test)]
mod tests;
