//! The books against what containers' cgroups hold: the read-back, the restore of a late
//! session, and which updates may ride on an answer (pure logic over a directory tree standing
//! in for a cgroup mount; containerd and the kernel are in the e2e tiers).

use super::tests::{agent, container, created, one_shared_per_node, Recorder};
use super::*;
use crate::agent::Update;
use crate::cgroupfs::testing::{read, Mount};
use crate::cgroupfs::Cgroupfs;
use std::time::Instant;
use tap_engine::request::GRANT_KEY;

/// A container id as runtimes make them (64 hex digits), from a short name.
fn hex_id(name: &str) -> String {
    let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
    format!("{hex:0>64}")
}

/// Writes cpusets straight into the cgroups under a mount (as NRI mode does on containerd
/// before 2.4).
struct CgroupWriter(Arc<Cgroupfs>);

#[async_trait::async_trait]
impl Writer for CgroupWriter {
    async fn write_cpuset(&self, u: &Update) -> Result<(), WriteError> {
        self.0
            .write(&u.container_id, &u.cpus, u.mems.as_ref())
            .map_err(|e| WriteError::Refused(e.to_string()))
    }
}

/// Creates `key` with a cgroup holding what its create answer said; returns the cgroup.
async fn started(l: &Ledger, m: &Mount, c: ContainerInfo) -> std::path::PathBuf {
    let id = hex_id(&c.id);
    let adj = created(l, c, &id).await;
    let cpus = adj.cpus.map(|c| c.to_string()).unwrap_or_default();
    m.container(&id, &cpus, "0")
}

/// One shared container per NUMA node and an exclusive one, each with its cgroup; returns the
/// shared ones' cgroups.
async fn started_with_an_exclusive_one(l: &Ledger, m: &Mount) -> Vec<std::path::PathBuf> {
    let mut shared = Vec::new();
    for i in 0..4 {
        shared.push(started(l, m, container(&format!("s{i}"), "burstable", 2, 4)).await);
    }
    let _ = started(l, m, container("g", "guaranteed", 4, 4)).await;
    shared
}

/// No shared container's cgroup holds a CPU of an exclusive grant: checked on what the
/// cgroups hold, not on the engine's books.
fn assert_cgroups_keep_exclusive_cpus(l: &Ledger, shared: &[std::path::PathBuf]) {
    let taken = *l.agent().snapshot().taken();
    for dir in shared {
        let cpus = CpuSet::parse(&read(dir, "cpuset.cpus")).expect("cpus");
        assert!(
            !cpus.intersects(&taken),
            "{} holds {cpus}, exclusive CPUs are {taken}",
            dir.display()
        );
    }
}

#[tokio::test]
async fn the_loop_writes_cgroups_and_the_read_back_heals_one_rewritten_behind_its_back() {
    let m = Mount::v1("ledger-heal");
    let fs = Arc::new(Cgroupfs::detect(m.path()).expect("cgroupfs"));
    let w = CgroupWriter(fs.clone());
    let l = Ledger::new(agent(), None);
    let shared = started_with_an_exclusive_one(&l, &m).await;
    l.converge_once(&w).await;
    assert_cgroups_keep_exclusive_cpus(&l, &shared);
    assert_eq!(l.unconverged(), 0);
    let report = l.read_back_once(&fs).await;
    assert_eq!((report.same, report.corrected), (5, 0), "{report:?}");

    // Something rewrites a shared container's cgroup (a daemon-reload, another tool).
    let before = read(&shared[0], "cpuset.cpus");
    std::fs::write(shared[0].join("cpuset.cpus"), "0-95").expect("write");
    assert_eq!(l.unconverged(), 0, "the books cannot know before a read");
    let report = l.read_back_once(&fs).await;
    assert_eq!(report.corrected, 1, "{report:?}");
    assert_eq!(l.unconverged(), 1);
    l.converge_once(&w).await;
    assert_eq!(read(&shared[0], "cpuset.cpus"), before);
    assert_cgroups_keep_exclusive_cpus(&l, &shared);
    assert_eq!(l.unconverged(), 0);
    let m = l.agent().metrics().render();
    assert!(
        m.contains("tap_cpuset_readbacks_total{result=\"corrected\"} 1"),
        "{m}"
    );
}

#[tokio::test]
async fn a_reading_taken_while_a_write_was_out_is_dropped() {
    let m = Mount::v1("ledger-stale");
    let fs = Arc::new(Cgroupfs::detect(m.path()).expect("cgroupfs"));
    let l = Ledger::new(agent(), None);
    let _ = started_with_an_exclusive_one(&l, &m).await;
    let targets = l.read_back_targets();
    let due = l.take_due(Instant::now());
    assert_eq!(due.writes.len(), 1, "one shared container shrinks");
    let key = due.writes[0].key.clone();
    let t = targets.iter().find(|t| t.key == key).expect("target");
    let stale = fs.read(&t.runtime_id).expect("read");
    assert_eq!(l.take_reading(t, &stale), None, "a write is out");
    for d in due.writes {
        l.settle(d, Ok(()));
    }
    assert_eq!(l.take_reading(t, &stale), None, "applied changed since");
    assert_eq!(l.unconverged(), 0);
}

/// A late Synchronize reconcile (it missed its deadline and ran after its answer) must not
/// release the creates that came in after its list was taken.
#[tokio::test]
async fn a_late_session_restore_keeps_the_creates_newer_than_its_list() {
    let l = Ledger::new(agent(), None);
    let mut old = container("old", "burstable", 2, 4);
    let adj = created(&l, old.clone(), "old").await;
    old.cpus = adj.cpus;
    old.annotations
        .insert(GRANT_KEY.into(), adj.record.expect("record"));
    let since = l.now();
    let new = l.begin_create(container("new", "burstable", 2, 4)).await;
    let listed = vec![Listed {
        runtime_id: "old".into(),
        info: old,
    }];
    let report = l.restore(listed, since);
    assert_eq!(report.released, 0, "{report:?}");
    assert!(l.keys().contains(&"new".to_string()), "{:?}", l.keys());
    l.commit_create(new, Some("new".into()));
    assert!(l.agent().current("new").is_some(), "still granted");
    assert!(l.agent().snapshot().grant("new").is_some());
}

/// Which due updates may ride on an answer: never one whose last write timed out (a hung
/// shim would hold the request it rides on, and every other one of the node); one that failed
/// otherwise only once its retry is due; one the writer deferred (the runtime was busy) at once.
#[tokio::test]
async fn updates_ride_on_answers_only_where_no_hung_write_stands_in_the_way() {
    for (outcome, rides) in [
        (WriteError::Timeout(converge::WRITE_DEADLINE), false),
        (WriteError::Refused("no".into()), false),
        (WriteError::Deferred("busy".into()), true),
    ] {
        let l = Ledger::new(agent(), None);
        let _ = one_shared_per_node(&l).await;
        let _ = created(&l, container("g", "guaranteed", 4, 4), "ig").await;
        let due = l.take_due(Instant::now());
        assert_eq!(due.writes.len(), 1);
        for d in due.writes {
            l.settle(d, Err(outcome.clone()));
        }
        let carried = l.claim_for_answer();
        assert_eq!(carried.len(), usize::from(rides), "{outcome}: {carried:?}");
        if !rides {
            assert_eq!(
                l.pending_updates().len(),
                1,
                "{outcome}: still due for the loop"
            );
        }
    }
}

/// A start and a resize of the same container overlap: the first answered does not end the
/// hold of the other.
#[tokio::test]
async fn a_second_call_out_for_a_container_keeps_its_writes_held() {
    let l = Ledger::new(agent(), None);
    let _ = one_shared_per_node(&l).await;
    let _ = created(&l, container("g", "guaranteed", 4, 4), "ig").await;
    let due = l.pending_updates();
    assert_eq!(due.len(), 1, "a shared container shrinks: {due:?}");
    let target = due[0].container_id.clone();
    let first = l.begin_start(&target).expect("known");
    let _second = l.begin_start(&target).expect("known");
    l.end_start(&first);
    let due = l.take_due(Instant::now());
    assert!(
        due.writes.iter().all(|d| d.update.container_id != target),
        "{:?}",
        due.writes
    );
}

/// A refused resize that overlapped a loop write leaves what the runtime holds unknown: the
/// loop writes again.
#[tokio::test]
async fn a_refused_resize_that_overlapped_a_write_leaves_the_cpuset_unknown() {
    let l = Ledger::new(agent(), None);
    let rt = Recorder::default();
    let _ = one_shared_per_node(&l).await;
    let _ = created(&l, container("g", "guaranteed", 4, 4), "ig").await;
    let due = l.take_due(Instant::now());
    assert_eq!(due.writes.len(), 1);
    let id = due.writes[0].update.container_id.clone();
    let resize = l.begin_update(&id, |_| {}).await;
    for d in due.writes {
        l.settle(d, Ok(()));
    }
    // The exclusive container goes: the engine wants back what the books held before the
    // loop's write, which the runtime may no longer hold.
    l.release("ig", Release::Removed);
    l.abort(resize);
    assert_eq!(l.pending_updates().len(), 1, "unknown after the overlap");
    l.converge_once(&rt).await;
    assert_eq!(rt.writes().len(), 1);
    assert_eq!(l.unconverged(), 0);
}
