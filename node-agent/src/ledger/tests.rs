//! The ledger's lifecycle rules on a fixture topology (pure logic: no runtime).

use super::*;
use crate::agent::test_sets::*;
use crate::agent::Update;
use crate::hook::Hook;
use std::path::PathBuf;
use tap_engine::request::{GRANT_KEY, SKIP_KEY};
use tap_engine::Engine;

pub(super) use crate::agent::tests::container;

pub(super) fn agent() -> Arc<Agent> {
    Arc::new(crate::agent::tests::agent("synthetic-2s-4numa-96c-gpu"))
}

fn state_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("tap-ledger-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Asserts the agent's metrics hold `series` (name, labels and value).
pub(super) fn assert_metric(l: &Ledger, series: &str) {
    let m = l.agent().metrics().render();
    assert!(m.contains(series), "{m}");
}

/// `c` as the runtime lists it after `adj`: the cpuset and the grant record it was given.
pub(super) fn as_listed(mut c: ContainerInfo, adj: &Adjustment) -> ContainerInfo {
    c.cpus = adj.cpus;
    let record = adj.record.clone().expect("a grant record");
    c.annotations.insert(GRANT_KEY.into(), record);
    c
}

pub(super) async fn created(l: &Ledger, c: ContainerInfo, id: &str) -> Adjustment {
    let t = l.begin_create(c).await;
    let adj = t.adjustment.clone();
    l.commit_create(t, Some(id.into()));
    adj
}

/// A runtime double for the convergence loop: records the cpuset writes it is sent, and
/// refuses them while `refusing` is set (pure logic: the real runtimes are in the e2e tier).
#[derive(Default)]
pub(crate) struct Recorder {
    writes: std::sync::Mutex<Vec<Update>>,
    refusing: std::sync::atomic::AtomicBool,
}

impl Recorder {
    pub(crate) fn writes(&self) -> Vec<Update> {
        self.writes.lock().unwrap().clone()
    }

    fn refuse(&self, on: bool) {
        self.refusing.store(on, std::sync::atomic::Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl Writer for Recorder {
    async fn write_cpuset(&self, u: &Update) -> Result<(), WriteError> {
        if self.refusing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(WriteError::Refused("test".into()));
        }
        self.writes.lock().unwrap().push(u.clone());
        Ok(())
    }
}

#[tokio::test]
async fn a_duplicate_create_never_touches_the_first_grant() {
    let l = Ledger::new(agent(), None);
    let first = created(&l, container("k1", "burstable", 4, 8), "id1").await;
    assert_eq!(shown(first.cpus).as_deref(), Some("0-23"));
    let before = l.agent().snapshot();
    // The kubelet retries the create; the runtime answers "name already reserved".
    let t = l.begin_create(container("k1", "burstable", 4, 8)).await;
    assert!(t.is_duplicate());
    assert_eq!(
        t.adjustment.cpus, first.cpus,
        "a retry carries the first one's cpuset"
    );
    l.abort(t);
    assert!(l.pending_updates().is_empty());
    assert_eq!(l.agent().snapshot(), before);
    assert_eq!(l.resolve("id1").as_deref(), Some("k1"));
    // A duplicate of a create still in flight is left alone too.
    let pending = l.begin_create(container("k2", "burstable", 4, 8)).await;
    let dup = l.begin_create(container("k2", "burstable", 4, 8)).await;
    assert!(dup.is_duplicate());
    l.abort(dup);
    l.commit_create(pending, Some("id2".into()));
    assert!(l.agent().snapshot().grant("k2").is_some());
}

#[tokio::test]
async fn a_refused_create_gives_everything_back() {
    let l = Ledger::new(agent(), None);
    let _ = created(&l, container("s", "burstable", 2, 4), "ids").await;
    let before = l.agent().snapshot();
    let t = l.begin_create(container("g", "guaranteed", 4, 4)).await;
    assert!(t.adjustment.cpus.is_some());
    l.abort(t);
    assert!(
        l.pending_updates().is_empty(),
        "nothing was applied, nothing to undo"
    );
    assert_eq!(l.agent().snapshot(), before);
    assert_eq!(l.keys(), vec!["s"]);
}

#[tokio::test]
async fn an_exclusive_create_shrinks_shared_containers_after_the_runtime_said_yes() {
    let l = Ledger::new(agent(), None);
    // One shared container on each NUMA node.
    let mut shared = Vec::new();
    for i in 0..4 {
        let adj = created(
            &l,
            container(&format!("s{i}"), "burstable", 2, 4),
            &format!("ids{i}"),
        )
        .await;
        shared.push(adj.cpus.expect("placed"));
    }
    let t = l.begin_create(container("g", "guaranteed", 4, 4)).await;
    let mine = t.adjustment.cpus.expect("exclusive");
    l.commit_create(t, Some("idg".into()));
    let ups = l.pending_updates();
    assert_eq!(ups.len(), 1, "{ups:?}");
    let i = shared
        .iter()
        .position(|c| c.intersects(&mine))
        .expect("the node of the exclusive CPUs has a shared container");
    assert_eq!(
        ups[0].container_id,
        format!("ids{i}"),
        "updates name the runtime id"
    );
    let shrunk = ups[0].cpus;
    assert_eq!(shrunk, shared[i].difference(&mine));
    // Until the runtime confirms, the update is still wanted; after, it is not.
    let rt = Recorder::default();
    l.converge_once(&rt).await;
    assert_eq!(rt.writes(), ups);
    assert!(l.pending_updates().is_empty());
    l.release("unknown", Release::Removed);
    assert!(l.pending_updates().is_empty());
    l.release("idg", Release::Removed);
    let back = l.pending_updates();
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].cpus, shared[i]);
}

fn container_keyed(id: &str) -> ContainerInfo {
    ContainerInfo {
        id: id.into(),
        ..Default::default()
    }
}

#[test]
fn ids_resolve_by_key_full_id_and_unique_prefix() {
    let mut b = Book::default();
    b.add(container_keyed("k8s_a"), State::Committed, 0);
    b.set_runtime_id("k8s_a", "abcdef0123");
    b.ids.insert("abcfff0000".into(), "k8s_b".into());
    assert_eq!(b.resolve("k8s_a").as_deref(), Some("k8s_a"));
    assert_eq!(b.resolve("/k8s_a").as_deref(), Some("k8s_a"));
    assert_eq!(b.resolve("abcdef0123").as_deref(), Some("k8s_a"));
    assert_eq!(b.resolve("abcd").as_deref(), Some("k8s_a"));
    assert_eq!(b.resolve("abc"), None); // ambiguous
                                        // dockerd's order: a full id wins over a name that happens to equal it.
    b.ids.insert("k8s_a".into(), "k8s_b".into());
    assert_eq!(b.resolve("k8s_a").as_deref(), Some("k8s_b"));
    assert_eq!(b.resolve("abcf").as_deref(), Some("k8s_b"));
    assert_eq!(b.resolve("ab00"), None);
    assert_eq!(b.resolve("other"), None);
}

#[test]
fn a_runtime_id_equal_to_the_key_shares_its_allocation() {
    let mut b = Book::default();
    b.add(container_keyed("0123abcd"), State::Committed, 0);
    assert_eq!(b.set_runtime_id("0123abcd", "0123abcd"), None);
    let (key, e) = b.entries.get_key_value("0123abcd").unwrap();
    let id = e.runtime_id.as_ref().unwrap();
    assert!(Arc::ptr_eq(key, id));
    let (id_key, id_val) = b.ids.get_key_value("0123abcd").unwrap();
    assert!(Arc::ptr_eq(key, id_key) && Arc::ptr_eq(key, id_val));
    // A new runtime id replaces the old one in both maps.
    let old = b.set_runtime_id("0123abcd", "ffff").unwrap();
    assert_eq!(&*old, "0123abcd");
    assert_eq!(b.resolve("ffff").as_deref(), Some("0123abcd"));
    assert!(!b.ids.contains_key("0123abcd"));
    // An unknown key is not named.
    assert_eq!(b.set_runtime_id("nope", "eeee"), None);
    assert!(!b.ids.contains_key("eeee"));
    b.forget("0123abcd");
    assert!(b.ids.is_empty() && b.entries.is_empty());
}

#[tokio::test]
async fn a_refused_update_is_rolled_back_and_not_persisted() {
    let dir = state_dir("refused");
    let file = dir.join("grants.json");
    let l = Ledger::new(agent(), Some(StateFile::new(file.clone())));
    let _ = created(&l, container("k", "burstable", 4, 8), "id").await;
    let before = l.agent().snapshot();
    let t = l
        .begin_update("id", |i| {
            i.cpu_shares = Some(40 * 1024);
            i.cpu_quota = Some(60 * 100_000);
        })
        .await;
    assert_ne!(l.agent().snapshot(), before, "the decision is reserved");
    // The runtime refused (e.g. memory below its minimum).
    l.abort(t);
    assert_eq!(l.agent().snapshot(), before);
    assert_eq!(l.info("id").unwrap().cpu_shares, Some(4 * 1024));
    assert!(!file.exists(), "a refused update writes nothing");
    // An accepted one is kept, and its record persisted.
    let t = l
        .begin_update("id", |i| i.cpu_shares = Some(30 * 1024))
        .await;
    let rec = t.adjustment.record.clone().expect("record");
    l.commit_update(t);
    l.flush_records();
    let saved = StateFile::new(file).load().unwrap();
    assert_eq!(saved.get("k"), Some(&rec));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A container created, then resized (its record in the state file changed), as the runtime
/// lists it after an agent restart (with its create-time record); returns the state folder,
/// the state file, the listing and the engine the restore should rebuild.
async fn resized_before_a_restart(name: &str) -> (PathBuf, PathBuf, Vec<Listed>, Engine) {
    let dir = state_dir(name);
    let file = dir.join("grants.json");
    let a = Ledger::new(agent(), Some(StateFile::new(file.clone())));
    let adj = created(&a, container("k", "burstable", 4, 8), "id").await;
    let t = a
        .begin_update("id", |i| i.cpu_shares = Some(6 * 1024))
        .await;
    a.commit_update(t);
    a.flush_records();
    let want = a.agent().snapshot();
    let listed = vec![Listed {
        runtime_id: "id".into(),
        info: as_listed(container("k", "burstable", 6, 8), &adj),
    }];
    (dir, file, listed, want)
}

#[tokio::test]
async fn restore_reads_changed_records_and_survives_a_corrupt_file() {
    let (dir, file, listed, want) = resized_before_a_restart("restore").await;
    let b = Ledger::new(agent(), Some(StateFile::new(file.clone())));
    let report = b.restore(listed.clone(), b.now());
    assert_eq!(report.adopted, 1);
    let ups = b.pending_updates();
    assert!(ups.is_empty(), "{ups:?}");
    assert_eq!(b.agent().snapshot(), want, "the changed record wins");
    // A corrupt file is moved aside and reported; the state comes from the containers.
    std::fs::write(&file, "{\"k\": 12").unwrap();
    let c = Ledger::new(agent(), Some(StateFile::new(file.clone())));
    let report = c.restore(listed, c.now());
    assert_eq!(report.adopted, 1);
    assert!(c.agent().snapshot().grant("k").is_some());
    assert!(dir.join("grants.json.corrupt").exists());
    let m = c.agent().metrics().render();
    assert!(m.lines().any(|l| l.contains("kind=\"state\"")), "{m}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A restore the engine fails books nothing and keeps the records: the retry restores the
/// changed record, not only the one the container carries.
#[tokio::test]
async fn a_failed_restore_keeps_the_records_for_the_retry() {
    let (dir, file, listed, want) = resized_before_a_restart("failed-restore").await;
    let b = Ledger::new(agent(), Some(StateFile::new(file.clone())));
    b.agent().panic_next();
    let report = b.restore(listed.clone(), b.now());
    assert_eq!(report.adopted, 0);
    assert!(!b.agent().restored());
    b.flush_records();
    assert!(
        StateFile::new(file.clone())
            .load()
            .unwrap()
            .contains_key("k"),
        "the record is still on disk"
    );
    let report = b.restore(listed, b.now());
    assert_eq!(report.adopted, 1);
    assert_eq!(b.agent().snapshot(), want, "the changed record wins");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn reconcile_releases_what_the_runtime_lost_and_adopts_what_it_has() {
    let l = Ledger::new(agent(), None);
    let a = created(&l, container("a", "burstable", 4, 8), "ida").await;
    let _ = created(&l, container("b", "burstable", 4, 8), "idb").await;
    let in_flight = l.begin_create(container("c", "burstable", 4, 8)).await;
    let since = l.now();
    // The runtime restarted: only "a" survived, and "x" appeared (created around us).
    let mut x = container("x", "burstable", 2, 4);
    x.cpus = Some(cpu_set("24-47"));
    let mut alive = container("a", "burstable", 4, 8);
    alive.cpus = a.cpus;
    let listed = vec![
        Listed {
            runtime_id: "ida".into(),
            info: alive,
        },
        Listed {
            runtime_id: "idx".into(),
            info: x,
        },
    ];
    let report = l.reconcile(listed, since, Listing::Ids);
    assert_eq!(report.released, 1);
    assert_eq!(report.adopted, 1);
    assert_eq!(
        l.keys(),
        vec!["a", "c", "x"],
        "the create in flight is left alone"
    );
    assert!(l.agent().snapshot().grant("b").is_none());
    assert_eq!(l.resolve("idx").as_deref(), Some("x"));
    l.commit_create(in_flight, Some("idc".into()));
    assert!(l.agent().snapshot().grant("c").is_some());
}

#[tokio::test]
async fn a_full_reconcile_drops_grants_the_runtime_never_applied() {
    let l = Ledger::new(agent(), None);
    let _ = created(&l, container("u", "burstable", 4, 8), "idu").await;
    let since = l.now();
    // Listed without cpuset or record: the runtime gave up on our answer.
    let listed = vec![Listed {
        runtime_id: "idu".into(),
        info: container("u", "burstable", 4, 8),
    }];
    let report = l.reconcile(listed, since, Listing::Session);
    assert_eq!(report.released, 1);
    assert!(l.pending_updates().is_empty());
    assert!(l.agent().snapshot().grant("u").is_none());
    assert_eq!(l.keys(), vec!["u"], "still known, now unmanaged");
}

#[tokio::test]
async fn huge_requests_neither_panic_nor_wrap() {
    let l = Ledger::new(agent(), None);
    for (i, (shares, quota)) in [(u64::MAX, i64::MAX), (100_000_000_000_000_000, 1)]
        .into_iter()
        .enumerate()
    {
        let mut c = container(&format!("h{i}"), "burstable", 1, 1);
        c.cpu_shares = Some(shares);
        c.cpu_quota = Some(quota);
        c.cpu_period = Some(1);
        c.memory_limit = Some(i64::MAX);
        let adj = created(&l, c, &format!("id{i}")).await;
        // Larger than the machine: the whole machine, never one NUMA node.
        if let Some(cpus) = shown(adj.cpus).as_deref() {
            assert_eq!(cpus, "0-95", "request {shares} shares");
        }
    }
    let m = l.agent().metrics().render();
    assert!(!m.contains("kind=\"panic\""), "{m}");
}

#[tokio::test]
async fn a_late_decision_is_released_and_the_create_goes_unadjusted() {
    let l = Ledger::new(agent(), None);
    l.set_budget(Duration::from_millis(1));
    // Hold the engine so the decision cannot finish within 1 ms.
    let hold = l.agent().clone();
    let blocker = std::thread::spawn(move || hold.hold_engine_for(Duration::from_millis(300)));
    std::thread::sleep(Duration::from_millis(20));
    let t = l.begin_create(container("late", "burstable", 4, 8)).await;
    assert!(t.adjustment.is_empty());
    l.commit_create(t, Some("idl".into()));
    blocker.join().unwrap();
    for _ in 0..100 {
        if l.agent().snapshot().grant("late").is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(l.agent().snapshot().grant("late").is_none());
    assert_eq!(l.keys(), vec!["late"], "known, unmanaged");
}

/// At the default level the hook span is off and the placed line names the Pod, namespace and
/// container itself; with `TAP_LOG=debug` the span adds the hook's context to every line.
#[test]
fn the_placed_line_names_the_container_and_at_debug_the_hook_span_too() {
    #[derive(Clone, Default)]
    struct Buf(Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf::default();
    let w = buf.clone();
    let sub = tracing_subscriber::fmt()
        .with_writer(move || w.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    // Global: the decision runs on a blocking thread. No other test sets a subscriber.
    tracing::subscriber::set_global_default(sub).expect("the only global subscriber");
    {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            use tracing::Instrument;
            let l = Ledger::new(agent(), None);
            let t = l
                .begin_create(container("spanned", "burstable", 4, 8))
                .instrument(hook_span(Hook::Create, "test"))
                .await;
            l.commit_create(t, Some("id".into()));
        });
    }
    let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    let placed = out
        .lines()
        .find(|l| l.contains("placed") && l.contains("pod-spanned"))
        .unwrap_or_else(|| panic!("no placement logged: {out}"));
    let (span, own) = placed
        .split_once(": placed ")
        .unwrap_or_else(|| panic!("not a placed line: {placed}"));
    for want in [
        "hook=\"create\"",
        "pod=pod-spanned",
        "namespace=default",
        "container=spanned",
    ] {
        assert!(
            own.contains(want),
            "{want} missing in the line's own fields: {placed}"
        );
    }
    for want in [
        "hook{",
        "hook=\"create\"",
        "mode=\"test\"",
        "pod=\"pod-spanned\"",
    ] {
        assert!(span.contains(want), "{want} missing in the span: {placed}");
    }
    // At info the span is off.
    let info = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .finish();
    tracing::subscriber::with_default(info, || {
        assert!(hook_span(Hook::Create, "test").is_disabled());
    });
}

#[tokio::test]
async fn a_reconcile_learns_a_runtime_id_the_create_answer_did_not_give() {
    let l = Ledger::new(agent(), None);
    let t = l.begin_create(container("k", "burstable", 4, 8)).await;
    l.commit_create(t, None);
    assert_eq!(l.resolve("id-late"), None);
    let since = l.now();
    let listed = vec![Listed {
        runtime_id: "id-late".into(),
        info: container("k", "burstable", 4, 8),
    }];
    let report = l.reconcile(listed, since, Listing::Ids);
    assert_eq!(report, ReconcileReport::default());
    assert_eq!(l.resolve("id-late").as_deref(), Some("k"));
}

#[tokio::test]
async fn a_full_reconcile_clears_a_create_whose_call_was_dropped() {
    let l = Ledger::new(agent(), None);
    // The handler was dropped after the decision: the ticket is never committed or aborted.
    let t = l
        .begin_create(container("dropped", "burstable", 4, 8))
        .await;
    std::mem::forget(t);
    assert!(l.agent().snapshot().grant("dropped").is_some());
    // The next session lists the container without our cpuset or record.
    let listed = vec![Listed {
        runtime_id: "dropped".into(),
        info: container("dropped", "burstable", 4, 8),
    }];
    let report = l.reconcile(listed, u64::MAX, Listing::Session);
    assert_eq!(report.released, 1);
    assert!(l.agent().snapshot().grant("dropped").is_none());
    assert_eq!(l.keys(), vec!["dropped"], "known again, unmanaged");
}

#[tokio::test]
async fn the_book_keeps_only_what_placement_reads_again() {
    let l = Ledger::new(agent(), None);
    let mut c = container("k", "burstable", 4, 8);
    c.pod.labels.insert(SKIP_KEY.into(), "".into());
    c.pod
        .labels
        .insert("io.kubernetes.pod.name".into(), "pod-k".into());
    c.pod.annotations.insert(
        "kubectl.kubernetes.io/last-applied-configuration".into(),
        "x".repeat(2048),
    );
    c.annotations
        .insert("io.kubernetes.cri.sandbox-id".into(), "f".repeat(64));
    c.env = vec![
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin".into(),
        "VA_VISIBLE_DEVICES=0".into(),
        "KUBERNETES_SERVICE_HOST=10.0.0.1".into(),
    ];
    let adj = created(&l, c, "id").await;
    assert!(adj.cpus.is_none(), "the skip label holds at create");
    let kept = l.info("id").expect("in the book");
    assert_eq!(kept.pod.labels.keys().collect::<Vec<_>>(), vec![SKIP_KEY]);
    assert!(kept.pod.annotations.is_empty());
    assert!(kept.annotations.is_empty());
    assert_eq!(kept.env, vec!["VA_VISIBLE_DEVICES=0".to_string()]);
    assert_eq!(kept.pod.name, "pod-k");
    assert_eq!(kept.cpu_shares, Some(4 * 1024));
    // An update is decided from what was kept: the skip label still holds.
    let t = l
        .begin_update("id", |i| i.cpu_shares = Some(2 * 1024))
        .await;
    assert!(
        t.adjustment.cpus.is_none(),
        "the skip label holds at update"
    );
    l.commit_update(t);
}

/// The agent lists a shared ledger's book (the NodeResourceTopology reads it), hugepage
/// limits included; a plain ledger gives the agent nothing to list.
#[tokio::test]
async fn a_shared_ledger_lists_its_book_to_the_agent() {
    let l = Ledger::shared(agent(), None);
    assert!(l.agent().roster().is_empty());
    let mut c = container("k", "guaranteed", 2, 2);
    c.hugepage_limits = vec![crate::agent::HugepageLimit {
        size_kb: 2048,
        bytes: 1 << 30,
    }];
    created(&l, c, "id").await;
    let listed = l.agent().roster();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].hugepage_limits[0].pages(), 512);
    let plain = Ledger::new(agent(), None);
    created(&plain, container("p", "burstable", 1, 2), "idp").await;
    assert!(plain.agent().roster().is_empty());
}

// ---- the books equal the runtime at rest ---------------------------------------

/// One shared 2/4 container per NUMA node (keys s0..s3, ids ids0..ids3), their cpusets.
pub(super) async fn one_shared_per_node(l: &Ledger) -> Vec<ContainerInfo> {
    let mut out = Vec::new();
    for i in 0..4 {
        let c = container(&format!("s{i}"), "burstable", 2, 4);
        let adj = created(l, c.clone(), &format!("ids{i}")).await;
        out.push(as_listed(c, &adj));
    }
    out
}

/// A ledger holding [`one_shared_per_node`] and then an exclusive 4-CPU container (key `g`,
/// runtime id `idg`) that shrinks one of them; the shared containers as created.
pub(super) async fn shared_then_one_exclusive() -> (Ledger, Vec<ContainerInfo>) {
    let l = Ledger::new(agent(), None);
    let shared = one_shared_per_node(&l).await;
    let _ = created(&l, container("g", "guaranteed", 4, 4), "idg").await;
    (l, shared)
}

/// What the loop takes now after [`shared_then_one_exclusive`]: the one write due.
pub(super) fn the_one_write_due(l: &Ledger) -> converge::Due {
    let due = l.take_due(std::time::Instant::now());
    assert_eq!(due.writes.len(), 1, "one shared container shrinks");
    due
}

/// What the runtime double holds for each container, by runtime id: its create answer's
/// cpuset, then every update sent to it (by the loop or on an answer), in order.
#[derive(Default)]
struct Held(HashMap<String, CpuSet>);

impl Held {
    fn answered(&mut self, runtime_id: &str, cpus: Option<CpuSet>) {
        if let Some(c) = cpus {
            self.0.insert(runtime_id.to_string(), c);
        }
    }

    fn applied(&mut self, ups: &[Update]) {
        for u in ups {
            self.0.insert(u.container_id.clone(), u.cpus);
        }
    }
}

/// No shared container holds a CPU of an exclusive grant in what the runtime double holds
/// (what was answered and written, not the engine's books).
fn assert_no_shared_on_exclusive(l: &Ledger, held: &Held) {
    let e = l.agent().snapshot();
    let taken = *e.taken();
    let b = l.book();
    for (key, _) in e.grants().filter(|(_, g)| !g.is_exclusive()) {
        let rid = b.entries.get(key).and_then(|e| e.runtime_id.clone());
        let rid = rid.as_deref().unwrap_or(key);
        let holds = held.0.get(rid);
        assert!(holds.is_some(), "the runtime holds nothing for {key}");
        assert!(
            holds.is_some_and(|h| !h.intersects(&taken)),
            "shared {key} holds {holds:?}, exclusive CPUs are {taken}"
        );
    }
}

/// Finding 1: a shared create in flight while an exclusive one commits. The engine shrinks the
/// shared container, but it is still being created, so no update can be sent then; its own
/// commit must mark it, or it keeps the exclusive CPUs for good.
#[tokio::test]
async fn a_shared_create_in_flight_while_an_exclusive_one_commits_is_shrunk_after() {
    let l = Ledger::new(agent(), None);
    let rt = Recorder::default();
    // Fill NUMA nodes 1-3 so the shared create and the exclusive one meet on node 0.
    let mut held = Held::default();
    for i in 1..4 {
        let adj = created(
            &l,
            container(&format!("f{i}"), "burstable", 20, 24),
            &format!("idf{i}"),
        )
        .await;
        held.answered(&format!("idf{i}"), adj.cpus);
    }
    let s = l.begin_create(container("s", "burstable", 2, 4)).await;
    let sent = s.adjustment.cpus.expect("placed");
    held.answered("ids", Some(sent));
    let g = l.begin_create(container("g", "guaranteed", 4, 4)).await;
    let exclusive = g.adjustment.cpus.expect("exclusive");
    assert!(sent.intersects(&exclusive), "{sent} / {exclusive}");
    l.commit_create(g, Some("idg".into()));
    // The loop runs now: the shared container is still being created, nothing to send it yet.
    l.converge_once(&rt).await;
    assert!(rt.writes().iter().all(|u| u.container_id != "ids"));
    // The shared container's create is answered after: created with the old cpuset.
    l.commit_create(s, Some("ids".into()));
    l.converge_once(&rt).await;
    let to_s: Vec<Update> = rt
        .writes()
        .into_iter()
        .filter(|u| u.container_id == "ids")
        .collect();
    assert_eq!(to_s.len(), 1, "{:?}", rt.writes());
    assert!(!to_s[0].cpus.intersects(&exclusive));
    assert!(l.pending_updates().is_empty());
    held.applied(&rt.writes());
    assert_no_shared_on_exclusive(&l, &held);
}

/// Finding 3: an update the runtime refuses is not forgotten: the container stays dirty and
/// the loop tries again (after a backoff) until the runtime takes it.
#[tokio::test]
async fn a_refused_update_is_retried_until_the_runtime_takes_it() {
    let l = Ledger::new(agent(), None);
    let rt = Recorder::default();
    let _ = one_shared_per_node(&l).await;
    rt.refuse(true);
    let _ = created(&l, container("g", "guaranteed", 4, 4), "idg").await;
    let (_, sent) = l.converge_once(&rt).await;
    assert!(sent);
    assert!(rt.writes().is_empty());
    assert_eq!(l.pending_updates().len(), 1, "still wanted");
    assert_eq!(l.unconverged(), 1);
    // Not before its backoff.
    let (next, sent) = l.converge_once(&rt).await;
    assert!(!sent);
    assert!(next.is_some(), "a retry is scheduled");
    let wait = next
        .unwrap()
        .saturating_duration_since(std::time::Instant::now());
    assert!(wait <= converge::RETRY_MIN * 2, "{wait:?}");
    rt.refuse(false);
    tokio::time::sleep(wait + Duration::from_millis(20)).await;
    l.converge_once(&rt).await;
    assert_eq!(rt.writes().len(), 1);
    assert!(l.pending_updates().is_empty());
    assert_eq!(l.unconverged(), 0);
    assert_metric(&l, "tap_cpuset_writes_total{result=\"refused\"} 1");
}

/// Finding 3: a loop write that overlaps a hook's own call for the same container (a resize
/// forwarded meanwhile) does not count: their order at the runtime is unknown, so the loop
/// writes what the engine wants once more.
#[tokio::test]
async fn a_write_overlapping_a_resize_is_not_trusted() {
    let (l, _) = shared_then_one_exclusive().await;
    let due = the_one_write_due(&l);
    let shrunk = due.writes[0].update.container_id.clone();
    // The kubelet resizes it while the loop's write is out.
    let t = l
        .begin_update(&shrunk, |i| i.cpu_shares = Some(3 * 1024))
        .await;
    for d in due.writes {
        l.settle(d, Ok(()));
    }
    l.commit_update(t);
    assert_eq!(
        l.pending_updates().len(),
        1,
        "what the runtime holds is unknown: written again"
    );
}

/// containerd 1.7 applies a cpuset write that reaches a container being started to its spec
/// only, and the start runs the container with the spec it read before: the loop holds the
/// container's writes while its start is out, and sends them when it is answered.
#[tokio::test]
async fn writes_wait_for_a_start_under_way() {
    let l = Ledger::new(agent(), None);
    let rt = Recorder::default();
    let mut held = Held::default();
    for (i, c) in one_shared_per_node(&l).await.into_iter().enumerate() {
        held.answered(&format!("ids{i}"), c.cpus);
    }
    // Each shared container's start is out (the one the exclusive create shrinks among them).
    let keys: Vec<String> = (0..4)
        .map(|i| l.begin_start(&format!("ids{i}")).expect("in the book"))
        .collect();
    let _ = created(&l, container("g", "guaranteed", 4, 4), "idg").await;
    let (_, sent) = l.converge_once(&rt).await;
    assert!(!sent && rt.writes().is_empty(), "held: {:?}", rt.writes());
    assert_eq!(l.pending_updates().len(), 1, "still wanted");
    for k in &keys {
        l.end_start(k);
    }
    l.converge_once(&rt).await;
    assert_eq!(rt.writes().len(), 1, "{:?}", rt.writes());
    assert!(l.pending_updates().is_empty());
    held.applied(&rt.writes());
    assert_no_shared_on_exclusive(&l, &held);
}

/// A loop write already out when a start begins may land in the spec the start has read, or
/// not: whichever is answered first, the write is not trusted and goes again.
#[tokio::test]
async fn a_write_overlapping_a_start_is_sent_again() {
    for start_answered_first in [true, false] {
        let (l, _) = shared_then_one_exclusive().await;
        let due = the_one_write_due(&l);
        let key = l
            .begin_start(&due.writes[0].update.container_id)
            .expect("in the book");
        if start_answered_first {
            l.end_start(&key);
        }
        for d in due.writes {
            l.settle(d, Ok(()));
        }
        if !start_answered_first {
            l.end_start(&key);
        }
        assert_eq!(
            l.pending_updates().len(),
            1,
            "start answered first: {start_answered_first}"
        );
    }
}

/// Finding 9 (and restarts behind the agent's back): a container stopped through the proxy
/// and started again is adopted anew by the next reconcile, not left "known" without a grant.
#[tokio::test]
async fn a_stopped_container_started_again_is_adopted_again() {
    let l = Ledger::new(agent(), None);
    let adj = created(&l, container("d", "burstable", 4, 8), "idd").await;
    l.release("idd", Release::Stopped);
    assert!(l.agent().snapshot().grant("d").is_none());
    let report = started_again(&l, &adj);
    assert_eq!(report.adopted, 1);
    assert_eq!(
        l.agent().current("d").map(|c| c.0),
        adj.cpus,
        "its grant is back"
    );
}

/// The stopped container `d` (runtime id `idd`, created as `adj` says) listed live again, as
/// after a start: what the reconcile did.
fn started_again(l: &Ledger, adj: &Adjustment) -> ReconcileReport {
    let since = l.now();
    let listed = vec![Listed {
        runtime_id: "idd".into(),
        info: as_listed(container("d", "burstable", 4, 8), adj),
    }];
    l.reconcile(listed, since, Listing::Live)
}

/// The periodic read-back: a write the runtime lost (it restarted from an older spec) is seen,
/// and written again.
#[tokio::test]
async fn a_read_back_corrects_a_write_the_runtime_lost() {
    let (l, before) = shared_then_one_exclusive().await;
    let rt = Recorder::default();
    l.converge_once(&rt).await;
    let written = rt.writes();
    assert_eq!(written.len(), 1);
    assert!(l.pending_updates().is_empty());
    // The runtime lost the write (restarted from an old spec): the read-back sees the old set.
    let since = l.now();
    let listed = before
        .into_iter()
        .enumerate()
        .map(|(i, info)| Listed {
            runtime_id: format!("ids{i}"),
            info,
        })
        .chain(std::iter::once(Listed {
            runtime_id: "idg".into(),
            info: ContainerInfo {
                cpus: l.agent().current("g").map(|c| c.0),
                ..container("g", "guaranteed", 4, 4)
            },
        }))
        .collect();
    l.reconcile(listed, since, Listing::Live);
    let again = l.pending_updates();
    assert_eq!(again, written, "the lost write is wanted again");
}

/// A stop that comes while a resize is forwarded: the resize's answer must not turn the stopped
/// entry back into a running one (it would never be adopted again when started).
#[tokio::test]
async fn a_resize_answered_after_a_stop_leaves_the_container_stopped() {
    let l = Ledger::new(agent(), None);
    let adj = created(&l, container("d", "burstable", 4, 8), "idd").await;
    for commit in [true, false] {
        let t = l
            .begin_update("idd", |i| i.cpu_shares = Some(6 * 1024))
            .await;
        l.release("idd", Release::Stopped);
        if commit {
            l.commit_update(t);
        } else {
            l.abort(t);
        }
        assert!(l.agent().snapshot().grant("d").is_none());
        let report = started_again(&l, &adj);
        assert_eq!(
            report.adopted, 1,
            "started again: adopted (commit: {commit})"
        );
        l.release("idd", Release::Stopped);
    }
}

/// A write that timed out may still land: what the runtime holds is unknown, so the loop
/// writes what the engine wants again even if it equals what was last confirmed.
#[tokio::test]
async fn a_write_that_timed_out_is_not_taken_as_known() {
    let (l, _) = shared_then_one_exclusive().await;
    let due = the_one_write_due(&l);
    for d in due.writes {
        l.settle(d, Err(WriteError::Timeout(converge::WRITE_DEADLINE)));
    }
    // The exclusive container goes away: the engine wants the old cpuset back, which is
    // what the runtime had before the write that timed out.
    l.release("idg", Release::Removed);
    assert_eq!(l.pending_updates().len(), 1, "unknown: written again");
}

/// A writer that reaches the runtime only on answers (NRI on a containerd whose NRI deadlocks
/// on unsolicited updates): the loop sends nothing, and each answer takes what is due.
struct AnswersOnly(Recorder);

#[async_trait::async_trait]
impl Writer for AnswersOnly {
    fn channel(&self) -> Channel {
        Channel::AnswersOnly
    }
    async fn write_cpuset(&self, u: &Update) -> Result<(), WriteError> {
        self.0.write_cpuset(u).await
    }
}

#[tokio::test]
async fn without_calls_of_its_own_an_exclusive_create_shrinks_its_neighbours_on_its_own_answer() {
    let l = Arc::new(Ledger::new(agent(), None));
    let w = Arc::new(AnswersOnly(Recorder::default()));
    let stop = tokio_util::sync::CancellationToken::new();
    let worker = tokio::spawn(l.clone().converge(w.clone(), stop.clone()));
    let mut shared = Vec::new();
    let mut held = Held::default();
    for i in 0..4 {
        let key = format!("s{i}");
        let adj = created(&l, container(&key, "burstable", 2, 4), &format!("ids{i}")).await;
        held.answered(&format!("ids{i}"), adj.cpus);
        shared.push(adj.cpus.expect("placed"));
    }
    assert!(l.claim_for_answer().is_empty(), "nothing due yet");
    // The exclusive create's own answer carries the shrink of the shared container it meets,
    // so containerd applies it before the exclusive container exists.
    let g = l.begin_create(container("g", "guaranteed", 4, 4)).await;
    let mine = g.adjustment.cpus.expect("exclusive");
    let on_answer = l.claim_for_answer();
    assert_eq!(on_answer.len(), 1, "{on_answer:?}");
    assert!(!on_answer[0].cpus.intersects(&mine));
    assert!(l.claim_for_answer().is_empty(), "taken once");
    l.commit_create(g, Some("idg".into()));
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(w.0.writes().is_empty(), "the loop sent nothing of its own");
    assert_eq!(l.unconverged(), 0);
    held.applied(&on_answer);
    assert_no_shared_on_exclusive(&l, &held);
    // Removing it gives the CPUs back on the next answer (a StopContainer's).
    l.release("idg", Release::Stopped);
    let back = l.claim_for_answer();
    assert_eq!(back.len(), 1, "{back:?}");
    assert!(mine.is_subset(&back[0].cpus));
    stop.cancel();
    let _ = worker.await;
    assert!(w.0.writes().is_empty());
}

/// Device sources for the create's pod-resources lookup (pure logic; the kubelet's own
/// socket is in the cluster tier).
enum Devices {
    Allocated(u32),
    Failing,
    Hanging,
    NoSocket,
}

#[async_trait::async_trait]
impl crate::pod_resources::DeviceSource for Devices {
    async fn devices(
        &self,
        c: crate::pod_resources::ContainerRef<'_>,
    ) -> Result<Vec<crate::pod_resources::KubeletDevice>, PodResourcesError> {
        match self {
            Devices::Allocated(node) => Ok(vec![crate::pod_resources::KubeletDevice {
                resource: "example.com/accel".into(),
                id: format!("{}-accel", c.pod),
                numa_nodes: vec![*node],
                claim: None,
            }]),
            Devices::Failing => Err(PodResourcesError::PodNotListed(c.pod.into())),
            Devices::NoSocket => Err(PodResourcesError::NoSocket("/nowhere".into())),
            Devices::Hanging => {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok(Vec::new())
            }
        }
    }
}

fn pod_resources_errors(l: &Ledger) -> usize {
    let m = l.agent().metrics().render();
    m.lines()
        .filter(|l| l.contains("kind=\"pod_resources\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<usize>().ok())
        .sum()
}

/// A create reads the kubelet's devices first and lands on their node; a failing or hanging
/// kubelet costs at most the lookup's bound and the container is placed anyway (fail open),
/// counted as `tap_errors_total{kind="pod_resources"}`.
#[tokio::test]
async fn creates_read_the_kubelets_devices_and_fail_open_without_them() {
    let l = Ledger::new(agent(), None);
    l.agent().set_device_source(Arc::new(Devices::Allocated(3)));
    let adj = created(&l, container("d", "burstable", 4, 8), "d").await;
    assert_eq!(shown(adj.cpus).as_deref(), Some("72-95"));
    assert_eq!(l.info("d").expect("kept").kubelet_devices.len(), 1);
    assert_eq!(pod_resources_errors(&l), 0);

    for (i, source) in [Devices::Failing, Devices::Hanging].into_iter().enumerate() {
        let l = Ledger::new(agent(), None);
        l.agent().set_device_source(Arc::new(source));
        let started = std::time::Instant::now();
        let adj = created(&l, container("e", "burstable", 4, 8), "e").await;
        assert!(adj.cpus.is_some(), "placed without devices ({i})");
        assert!(
            started.elapsed() < DEVICE_LOOKUP_MAX * 4,
            "{:?}",
            started.elapsed()
        );
        assert_eq!(pod_resources_errors(&l), 1, "source {i}");
    }
}

/// A device hint that cannot be read (the kubelet failed, or did not answer in time): the
/// container is placed anyway, and its Pod gets a `TopologyDeviceHintUnavailable` Warning
/// saying why, before the placement's own note.
#[tokio::test]
async fn a_device_hint_that_cannot_be_read_is_a_warning_event() {
    for (i, source) in [Devices::Failing, Devices::Hanging].into_iter().enumerate() {
        let l = Ledger::new(agent(), None);
        let mut rx = l.agent().notes().attach().expect("notes");
        l.agent().set_device_source(Arc::new(source));
        let adj = created(&l, container("e", "burstable", 4, 8), "e").await;
        assert!(adj.cpus.is_some(), "placed without devices ({i})");
        let notes: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert_eq!(notes[0].reason(), "TopologyDeviceHintUnavailable", "{i}");
        assert_eq!(notes[0].pod_name, "pod-e");
        let why = ["do not list pod pod-e", "no answer within"][i];
        assert!(
            notes[0]
                .message
                .contains("placed without the devices' NUMA nodes")
                && notes[0].message.contains(why),
            "{notes:?}"
        );
        assert_eq!(notes[1].reason(), "TopologyPlaced");
    }
    // A host without the socket: nothing to say.
    let l = Ledger::new(agent(), None);
    let mut rx = l.agent().notes().attach().expect("notes");
    l.agent().set_device_source(Arc::new(Devices::NoSocket));
    created(&l, container("f", "burstable", 4, 8), "f").await;
    let reasons: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok())
        .map(|n| n.reason())
        .collect();
    assert_eq!(reasons, ["TopologyPlaced"]);
}
