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
//! - What the runtime holds is tracked per container (`applied`, from what the runtime confirmed
//!   or listed). Every change that moves CPUs marks the containers it affects dirty; one worker
//!   per mode ([`converge`]) drives applied towards what the engine wants now, with retries and
//!   generation checks, so a refused, lost, stale or reordered update never leaves a container
//!   wrong. No hook sends updates of other containers itself, so no create waits on them.
//! - Grant records changed after create are kept in the [`state_file`].
//! - [`Ledger::reconcile`] ([`reconcile`]) brings the book in line with the runtime's list after
//!   a restart of either side.

pub mod converge;
pub mod deadline;
mod kept;
pub mod readback;
mod reconcile;
pub mod runtime;
mod saver;
pub mod state_file;

pub use converge::{Channel, DirtyQueue, WriteError, Writer};
pub use reconcile::Listing;

use crate::agent::{Adjustment, Agent, ContainerInfo, PodInfo};
use crate::hook::Hook;
use crate::pod_resources::{ContainerRef, PodResourcesError};
use deadline::Deadline;
use kept::Kept;
use state_file::{Records, StateFile};
use std::collections::hash_map::Entry as MapEntry;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tap_engine::grant::Grant;
use tap_engine::{CpuSet, NodeSet};

/// The longest a create waits for the kubelet's device allocation (pod-resources API).
pub const DEVICE_LOOKUP_MAX: Duration = Duration::from_millis(250);

/// The span of one hook (a create, update, stop or remove as a mode sees it): with
/// `TAP_LOG=debug` every log line of the hook carries the hook, the mode and, once the ledger
/// knows them, the Pod, its namespace and the container. At the default level it is off: a
/// span per hook was a fifth of the agent's CPU per container start (docs/design/start-path.md,
/// fifth part), and the lines a user sees at info and above name the container themselves.
pub fn hook_span(hook: Hook, mode: &'static str) -> tracing::Span {
    tracing::debug_span!(
        "hook",
        hook = hook.as_str(),
        mode,
        pod = tracing::field::Empty,
        namespace = tracing::field::Empty,
        container = tracing::field::Empty,
    )
}

/// Records what the ledger knows of a container on the current hook span.
fn record_on_span(info: &ContainerInfo) {
    record_names_on_span(&info.pod, &info.name);
}

fn record_names_on_span(pod: &PodInfo, container: &str) {
    // The hook span is a debug span: below that level there is nothing to record on, and
    // finding the current span is not free (it showed in the remove path's profile).
    if tracing::level_filters::LevelFilter::current() < tracing::Level::DEBUG {
        return;
    }
    let span = tracing::Span::current();
    span.record("pod", pod.name.as_str());
    span.record("namespace", pod.namespace.as_str());
    span.record("container", container);
}

/// A container as the runtime lists it: the ledger key, the runtime's id, and what the runtime
/// says (resources, labels or annotations, the live cpuset and mems).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub runtime_id: String,
    /// `info.id` is the ledger key.
    pub info: ContainerInfo,
}

/// How a committed update's cpuset reached the runtime.
enum Sent {
    /// On the hook's answer (the runtime applied it as it handled the call).
    TheAnswer,
    /// Not at all: the runtime holds what it reported (unknown: `None`).
    Nothing(Option<Applied>),
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
    /// Stopped: its grant is released; the runtime still has the container (Docker can start
    /// it again, and the reconcile then adopts it anew).
    Stopped,
    /// A resize is forwarded; `before` is what to go back to if the runtime refuses it.
    PendingUpdate {
        before: Option<Box<Grant>>,
        before_info: Box<ContainerInfo>,
        after_info: Box<ContainerInfo>,
    },
}

#[derive(Debug, Clone)]
struct Entry {
    /// The container's placement inputs.
    info: Kept,
    /// The runtime's id; the same allocation as the key when they are equal (NRI).
    runtime_id: Option<Arc<str>>,
    state: State,
    /// What the runtime holds, as far as the ledger knows (`None`: unknown).
    applied: Option<Applied>,
    /// Ledger clock at the last change (a reconcile leaves entries newer than its list alone;
    /// the convergence worker's result counts only if no change came in between).
    seq: u64,
    flight: converge::Flight,
}

impl Entry {
    fn new(info: Kept, state: State, seq: u64) -> Entry {
        Entry {
            info,
            runtime_id: None,
            state,
            applied: None,
            seq,
            flight: converge::Flight::default(),
        }
    }
}

/// Why a container's grant is released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// Stopped: the runtime keeps the container (its entry stays, without a grant).
    Stopped,
    /// Removed (or gone): the entry is forgotten.
    Removed,
}

/// The book's maps share one allocation per id: an entry's key, its runtime id when the runtime
/// names it the same (NRI) and both sides of `ids` are the same `Arc<str>`. Entries are boxed:
/// a map's table keeps up to twice as many slots as entries (it doubles when 7/8 full), and
/// a table of entries in place (1.2 KB each then) took 2.1 MB at 1,000 containers; boxed
/// entries of 768 bytes and their table take 0.8 MB (docs/design/scale.md).
#[derive(Default)]
struct Book {
    entries: HashMap<Arc<str>, Box<Entry>>,
    /// Runtime id -> key.
    ids: HashMap<Arc<str>, Arc<str>>,
    /// Grant records changed after create (mirrors the state file).
    records: Records,
}

impl Book {
    /// Whether the book knows `key` under a runtime id other than `runtime_id` (none given:
    /// no): the container it knows is gone and another took its name (behind a proxy).
    fn replaced(&self, key: &str, runtime_id: &str) -> bool {
        !runtime_id.is_empty()
            && self
                .entries
                .get(key)
                .and_then(|e| e.runtime_id.as_deref())
                .is_some_and(|r| r != runtime_id)
    }

    /// The key of a container from a runtime id, a key, or a unique runtime id prefix, in
    /// dockerd's order (a full id first, then a name, then a prefix; a name given with its
    /// leading `/` too).
    fn resolve(&self, id: &str) -> Option<String> {
        if let Some(k) = self.ids.get(id) {
            return Some(k.to_string());
        }
        let name = id.trim_start_matches('/');
        if self.entries.contains_key(name) {
            return Some(name.to_string());
        }
        if !id.is_empty() && id.chars().all(|c| c.is_ascii_hexdigit()) {
            let mut hits = self.ids.iter().filter(|(full, _)| full.starts_with(id));
            if let (Some((_, k)), None) = (hits.next(), hits.next()) {
                return Some(k.to_string());
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

    /// Adds (or replaces) the entry of a container, keyed by `info.id`.
    fn add(&mut self, info: ContainerInfo, state: State, seq: u64) -> &mut Entry {
        let key: Arc<str> = match self.entries.get_key_value(info.id.as_str()) {
            Some((k, _)) => Arc::clone(k),
            None => Arc::from(info.id.as_str()),
        };
        let entry = Box::new(Entry::new(Kept::new(info, &key), state, seq));
        match self.entries.entry(key) {
            MapEntry::Occupied(mut o) => {
                *o.get_mut() = entry;
                o.into_mut()
            }
            MapEntry::Vacant(v) => v.insert(entry),
        }
    }

    /// Names the runtime id of the entry of `key`, forgetting the one it had (returned).
    /// Nothing happens when the book has no such entry.
    fn set_runtime_id(&mut self, key: &str, id: &str) -> Option<Arc<str>> {
        let key = Arc::clone(self.entries.get_key_value(key)?.0);
        // The key's own allocation when the runtime names the container by its key.
        let id: Arc<str> = if *id == *key {
            Arc::clone(&key)
        } else {
            Arc::from(id)
        };
        let old = self
            .entries
            .get_mut(&key)?
            .runtime_id
            .replace(Arc::clone(&id));
        if let Some(old) = &old {
            self.ids.remove(old);
        }
        self.ids.insert(id, key);
        old
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
    /// Writes the records off the book's lock (None: no file, or no thread could be started).
    saver: Option<saver::Saver>,
    deadline: Deadline,
    clock: AtomicU64,
    /// Containers whose runtime cpuset may differ from the engine's (see [`converge`]).
    dirty: Arc<DirtyQueue>,
    /// The state file is read once, at the first restore (an NRI reconnect restores again).
    records_loaded: std::sync::atomic::AtomicBool,
}

impl Ledger {
    /// A ledger over `agent`, keeping changed grant records in `file` if given.
    pub fn new(agent: Arc<Agent>, file: Option<StateFile>) -> Ledger {
        let saver = file.as_ref().and_then(|f| start_saver(&agent, f));
        Ledger {
            agent,
            book: Mutex::new(Book::default()),
            file,
            saver,
            deadline: Deadline::default(),
            clock: AtomicU64::new(1),
            dirty: Arc::new(DirtyQueue::default()),
            records_loaded: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// A shared ledger that also takes the containers a policy change moved: what the
    /// runtime modes use.
    pub fn shared(agent: Arc<Agent>, file: Option<StateFile>) -> Arc<Ledger> {
        let ledger = Arc::new(Ledger::new(agent, file));
        let dirty = Arc::downgrade(&ledger.dirty);
        ledger.agent.set_change_sink(Box::new(move |ids| {
            if let Some(d) = dirty.upgrade() {
                d.mark(ids);
            }
        }));
        let book = Arc::downgrade(&ledger);
        ledger.agent.set_roster(Box::new(move || {
            book.upgrade().map_or_else(Vec::new, |l| {
                l.containers().into_iter().map(|(_, _, i)| i).collect()
            })
        }));
        ledger
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
        b.entries.get(key.as_str()).map(|e| e.info.info())
    }

    /// Every container in the book with what the usage sampler needs: its key, the runtime's
    /// id (the cgroup's name carries it) and its placement inputs.
    pub fn containers(&self) -> Vec<(String, String, ContainerInfo)> {
        let b = self.book();
        b.entries
            .iter()
            .map(|(k, e)| {
                let rid = e.runtime_id.as_deref().unwrap_or(k).to_string();
                (k.to_string(), rid, e.info.info())
            })
            .collect()
    }

    /// Every container in the book, by key (for tests and status).
    pub fn keys(&self) -> Vec<String> {
        let mut k: Vec<String> = self.book().entries.keys().map(|k| k.to_string()).collect();
        k.sort();
        k
    }

    /// Runs `f` under the deadline (see [`deadline`]).
    pub async fn decide<T, F, L>(&self, hook: Hook, f: F, on_late: L) -> Option<T>
    where
        T: Send + 'static,
        F: FnOnce(&Agent) -> T + Send + 'static,
        L: FnOnce(&Agent, T) + Send + 'static,
    {
        self.deadline.run(&self.agent, hook, f, on_late).await
    }

    /// Reserves the placement of a container about to be created (`info.id` is the key).
    pub async fn begin_create(&self, mut info: ContainerInfo) -> Ticket {
        self.read_kubelet_devices(&mut info).await;
        record_on_span(&info);
        let key = info.id.clone();
        {
            let mut b = self.book();
            if b.entries.contains_key(key.as_str()) {
                // A kubelet retrying after its timeout: harmless, not an error.
                tracing::info!(container = %key, "a create repeats one in flight or done; its grant is left as it is");
                return Ticket {
                    adjustment: self.existing_adjustment(&key),
                    key,
                    phase: Phase::Duplicate,
                };
            }
            let seq = self.now();
            b.add(info.placement_inputs(), State::PendingCreate, seq);
        }
        let late_key = key.clone();
        let dirty = self.dirty.clone();
        let adjustment = self
            .decide(
                Hook::Create,
                move |a| a.create(&info),
                move |a, late: Adjustment| {
                    if !late.is_empty() {
                        tracing::warn!(container = %late_key, "releasing a grant that came too late");
                        // Exclusive CPUs it took go back to the shared containers (the loop).
                        let late_ups = a.remove(&late_key).into_iter().chain(late.updates);
                        dirty.mark(late_ups.map(|u| u.container_id));
                    }
                },
            )
            .await
            .unwrap_or_else(|| self.failed_open(Hook::Create, &key));
        // The neighbours the decision changed may be written now (NRI carries them on this
        // very answer); a refused create marks them again when it is undone.
        let neighbours = adjustment.updates.iter().map(|u| u.container_id.clone());
        self.dirty.mark(neighbours);
        Ticket {
            key,
            phase: Phase::Create,
            adjustment,
        }
    }

    /// The answer of a decision that failed (its error was logged without the container: the
    /// hook span is off at the default level): says which container runs unadjusted.
    fn failed_open(&self, hook: Hook, key: &str) -> Adjustment {
        let b = self.book();
        let (pod, namespace, name) = match b.entries.get(key) {
            Some(e) => (
                e.info.pod().name.as_str(),
                e.info.pod().namespace.as_str(),
                e.info.name(),
            ),
            None => ("", "", ""),
        };
        tracing::warn!(hook = hook.as_str(), container = %key, name, pod, namespace, "left unadjusted: the decision failed");
        Adjustment::default()
    }

    /// Adds the devices the kubelet allocated to the container (fails open: without them the
    /// environment's hints remain). Bounded by a quarter of the decision's budget, at most
    /// [`DEVICE_LOOKUP_MAX`].
    async fn read_kubelet_devices(&self, info: &mut ContainerInfo) {
        let Some(source) = self.agent.device_source() else {
            return;
        };
        if info.pod.name.is_empty() || info.pod.namespace.is_empty() {
            return;
        }
        let c = ContainerRef {
            namespace: &info.pod.namespace,
            pod: &info.pod.name,
            container: &info.name,
        };
        let wait = (self.budget() / 4).min(DEVICE_LOOKUP_MAX);
        let started = std::time::Instant::now();
        let result = match tokio::time::timeout(wait, source.devices(c)).await {
            Ok(r) => r,
            Err(_) => Err(PodResourcesError::Timeout(wait)),
        };
        if !matches!(result, Err(PodResourcesError::NoSocket(_))) {
            let took = started.elapsed().as_secs_f64();
            self.agent.metrics().pod_resources_duration.observe(took);
        }
        match result {
            Ok(devices) => info.kubelet_devices = devices,
            Err(e) => self.agent.device_hint_unavailable(info, &e),
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

    /// The runtime created the container (`runtime_id` when its answer names it) with the
    /// ticket's cpuset. The container itself and the neighbours the decision changed are marked
    /// for the convergence loop: the engine may have moved this one since its create was sent
    /// (an exclusive grant committed meanwhile).
    pub fn commit_create(&self, t: Ticket, runtime_id: Option<String>) {
        let mut b = self.book();
        let seq = self.now();
        let Some(e) = b.entries.get_mut(t.key.as_str()) else {
            return;
        };
        match t.phase {
            Phase::Create => {
                e.state = State::Committed;
                e.applied = t
                    .adjustment
                    .cpus
                    .map(|c| Applied::new(c, t.adjustment.mems));
                if let Some(r) = t.adjustment.record {
                    e.info.set_record(r);
                }
                e.seq = seq;
            }
            // The runtime accepted a repeated create: the container under this key is the new
            // one (the first must be gone), with the same cpuset.
            Phase::Duplicate if runtime_id.is_some() => e.seq = seq,
            _ => return,
        }
        if let Some(id) = runtime_id {
            b.set_runtime_id(&t.key, &id);
        }
        let neighbours = t.adjustment.updates.into_iter().map(|u| u.container_id);
        self.dirty.mark(neighbours.chain(std::iter::once(t.key)));
    }

    /// The runtime refused the call (or could not be reached): undo the reservation exactly.
    pub fn abort(&self, t: Ticket) {
        let mut b = self.book();
        match t.phase {
            Phase::Create => {
                if matches!(
                    b.entries.get(t.key.as_str()).map(|e| &e.state),
                    Some(State::PendingCreate)
                ) {
                    b.forget(&t.key);
                }
                let ups = self.agent.remove(&t.key);
                self.dirty.mark(ups.into_iter().map(|u| u.container_id));
            }
            Phase::Update => {
                let seq = self.now();
                let Some(e) = b.entries.get_mut(t.key.as_str()) else {
                    return;
                };
                // The refused call changed nothing; a loop write it overlapped makes what the
                // runtime holds unknown.
                let kept = e.applied.take();
                e.applied = e.flight.settle_hook_write(kept);
                // Only a change still pending is undone (a stop may have come in between).
                if !matches!(e.state, State::PendingUpdate { .. }) {
                    return;
                }
                let State::PendingUpdate {
                    before,
                    before_info,
                    ..
                } = std::mem::replace(&mut e.state, State::Committed)
                else {
                    return;
                };
                e.info.replace(*before_info);
                e.seq = seq;
                let ups = self.agent.reinstate(&t.key, before.map(|g| *g));
                let keys = ups
                    .into_iter()
                    .map(|u| u.container_id)
                    .chain(t.adjustment.updates.into_iter().map(|u| u.container_id));
                self.dirty.mark(keys.chain(std::iter::once(t.key)));
            }
            Phase::Duplicate | Phase::Pass => {}
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
            let seq = self.now();
            let Some(e) = b.entries.get_mut(key.as_str()) else {
                return pass(key);
            };
            if !matches!(e.state, State::Committed) {
                tracing::warn!(container = %key, "an update while another change is in flight; forwarded unchanged");
                self.agent
                    .metrics()
                    .count_error(Hook::Update, crate::metrics::ErrorKind::Busy);
                return pass(key);
            }
            let mut info = e.info.info();
            record_on_span(&info);
            change(&mut info);
            e.state = State::PendingUpdate {
                before: before.map(Box::new),
                before_info: Box::new(e.info.info()),
                after_info: Box::new(info.clone()),
            };
            // The call carries this container's cpuset: a loop write still in flight may land
            // before or after it, so what the runtime holds is unknown until both are done.
            e.seq = seq;
            e.flight.hook_write_begins();
            (key, info)
        };
        // A decision that comes too late has changed the engine anyway: the loop compares.
        let dirty = self.dirty.clone();
        let late_key = key.clone();
        let adjustment = self
            .decide(
                Hook::Update,
                move |a| a.update(&info),
                move |_, late: Adjustment| {
                    let neighbours = late.updates.into_iter().map(|u| u.container_id);
                    dirty.mark(neighbours.chain(std::iter::once(late_key)));
                },
            )
            .await
            .unwrap_or_else(|| self.failed_open(Hook::Update, &key));
        Ticket {
            key,
            phase: Phase::Update,
            adjustment,
        }
    }

    /// The runtime applied the update (with the ticket's cpuset, if it carried one).
    pub fn commit_update(&self, t: Ticket) {
        self.commit_update_as(t, Sent::TheAnswer);
    }

    /// Commits an update whose cpuset nobody sent: what the runtime holds is what it reports
    /// (`cpus`, `mems`; unknown without a cpuset), so the loop writes what differs.
    pub fn commit_unsent_update(&self, t: Ticket, cpus: Option<CpuSet>, mems: Option<NodeSet>) {
        let held = cpus.map(|c| Applied::new(c, mems));
        self.commit_update_as(t, Sent::Nothing(held));
    }

    fn commit_update_as(&self, t: Ticket, how: Sent) {
        let mut b = self.book();
        if t.phase != Phase::Update {
            return;
        }
        let seq = self.now();
        let Some(e) = b.entries.get_mut(t.key.as_str()) else {
            return;
        };
        // Only a change still pending is committed (a stop may have come in between: the
        // container stays stopped, and a start adopts it anew).
        if !matches!(e.state, State::PendingUpdate { .. }) {
            e.flight.settle_hook_write(None);
            return;
        }
        let State::PendingUpdate { after_info, .. } =
            std::mem::replace(&mut e.state, State::Committed)
        else {
            return;
        };
        e.info.replace(*after_info);
        e.seq = seq;
        let adj = &t.adjustment;
        e.applied = match how {
            Sent::TheAnswer => {
                let sent = adj.cpus.map(|c| {
                    let mems = adj.mems.or(e.applied.as_ref().and_then(|a| a.mems));
                    Applied::new(c, mems)
                });
                e.flight.settle_hook_write(sent.or(e.applied.take()))
            }
            Sent::Nothing(held) => held,
        };
        if let Some(r) = &adj.record {
            e.info.set_record(r.clone());
            if b.records.get(&t.key) != Some(r) {
                b.records.insert(t.key.clone(), r.clone());
                self.save(&b.records);
            }
        }
        let neighbours = t.adjustment.updates.into_iter().map(|u| u.container_id);
        self.dirty.mark(neighbours.chain(std::iter::once(t.key)));
    }

    /// The runtime is asked to start a container (a proxy forwards StartContainer). containerd
    /// 1.7 puts a cpuset write for a container that is not running yet in its spec only, and a
    /// start under way runs the container with the spec it read before: a write that overlaps
    /// the start can be answered and never reach the cgroup. So the loop holds this container's
    /// writes until [`Ledger::end_start`], and a write it had out already is sent again then.
    /// Returns the key to end the start with, if the container is in the book.
    pub fn begin_start(&self, id: &str) -> Option<String> {
        let mut b = self.book();
        let key = b.resolve(id)?;
        b.entries.get_mut(key.as_str())?.flight.hook_write_begins();
        Some(key)
    }

    /// The start [`Ledger::begin_start`] announced was answered (whatever the answer): what
    /// the runtime holds is as before, unless a loop write overlapped the start (then it is
    /// unknown and written again); the writes held meanwhile go now. The loop is woken only
    /// when there is something to write (most starts overlap nothing).
    pub fn end_start(&self, key: &str) {
        let mut b = self.book();
        let Some(e) = b.entries.get_mut(key) else {
            return;
        };
        let before = e.applied.take();
        e.applied = e.flight.settle_hook_write(before);
        let due = self.difference(&b, key).is_some();
        drop(b);
        if due {
            self.dirty.mark([key.to_string()]);
        }
    }

    /// A container stopped or was removed: its grant is released (idempotent), and the
    /// neighbours that get CPUs back are marked for the convergence loop.
    pub fn release(&self, id: &str, why: Release) {
        let mut b = self.book();
        let Some(key) = b.resolve(id) else {
            return;
        };
        if let Some(e) = b.entries.get(key.as_str()) {
            record_names_on_span(e.info.pod(), e.info.name());
        }
        let ups = self.agent.remove(&key);
        if b.records.remove(&key).is_some() {
            self.save(&b.records);
        }
        match why {
            Release::Removed => b.forget(&key),
            Release::Stopped => {
                let seq = self.now();
                if let Some(e) = b.entries.get_mut(key.as_str()) {
                    e.seq = seq;
                    e.state = State::Stopped;
                }
            }
        }
        self.dirty.mark(ups.into_iter().map(|u| u.container_id));
    }

    /// Hands the records to the writer thread (written off the book's lock).
    fn save(&self, records: &Records) {
        match (&self.saver, &self.file) {
            (Some(s), _) => s.submit(records.clone()),
            (None, Some(f)) => {
                if let Err(e) = f.save(records) {
                    state_write_failed(&self.agent, e);
                }
            }
            (None, None) => {}
        }
    }

    /// Waits until the records handed to the writer so far are on disk.
    pub fn flush_records(&self) {
        if let Some(s) = &self.saver {
            s.flush();
        }
    }
}

fn start_saver(agent: &Arc<Agent>, f: &StateFile) -> Option<saver::Saver> {
    let a = agent.clone();
    let file = StateFile::new(f.path().to_path_buf());
    match saver::Saver::start(file, move |e| state_write_failed(&a, e)) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!("no writer thread for the grant records ({e}); writing them inline");
            None
        }
    }
}

fn state_write_failed(agent: &Agent, e: state_file::StateFileError) {
    tracing::warn!("cannot store the grant records: {e}");
    agent
        .metrics()
        .count_error(Hook::Update, crate::metrics::ErrorKind::State);
}

#[cfg(test)]
mod bound_tests;
#[cfg(test)]
pub(crate) mod tests;
