//! The books against what containers' cgroups hold: the read-back, the restore of a late
//! session, and which updates may ride on an answer (pure logic over a directory tree standing
//! in for a cgroup mount; containerd and the kernel are in the e2e tiers).

use super::tests::{
    agent, as_listed, assert_metric, container, created, shared_then_one_exclusive,
    the_one_write_due, Recorder,
};
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
    assert_metric(&l, "tap_cpuset_readbacks_total{result=\"corrected\"} 1");
}

#[tokio::test]
async fn a_reading_taken_while_a_write_was_out_is_dropped() {
    let m = Mount::v1("ledger-stale");
    let fs = Arc::new(Cgroupfs::detect(m.path()).expect("cgroupfs"));
    let l = Ledger::new(agent(), None);
    let _ = started_with_an_exclusive_one(&l, &m).await;
    let targets = l.read_back_targets();
    let due = the_one_write_due(&l);
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
    let old = container("old", "burstable", 2, 4);
    let adj = created(&l, old.clone(), "old").await;
    let old = as_listed(old, &adj);
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
        let (l, _) = shared_then_one_exclusive().await;
        let due = the_one_write_due(&l);
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
    let (l, _) = shared_then_one_exclusive().await;
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
    let (l, _) = shared_then_one_exclusive().await;
    let rt = Recorder::default();
    let due = the_one_write_due(&l);
    let id = due.writes[0].update.container_id.clone();
    let resize = l.begin_update(&id, |_| {}).await;
    for d in due.writes {
        l.settle(d, Ok(()));
    }
    // The exclusive container goes: the engine wants back what the books held before the
    // loop's write, which the runtime may no longer hold.
    l.release("idg", Release::Removed);
    l.abort(resize);
    assert_eq!(l.pending_updates().len(), 1, "unknown after the overlap");
    l.converge_once(&rt).await;
    assert_eq!(rt.writes().len(), 1);
    assert_eq!(l.unconverged(), 0);
}

/// Reserves CPUs 0-1 through the agent, as the kube link does for a NodeTopology's policy.
fn reserve_0_1(a: &Agent) {
    let mut cfg = a.config();
    cfg.reserved = CpuSet::parse("0-1").expect("cpus");
    a.set_config(cfg);
}

/// A policy change that reserves CPUs moves the shared containers off them at once and the
/// loop writes their cgroups; after a restart the grants are the same whether the change
/// comes before the first restore or after it.
#[tokio::test]
async fn a_policy_reserving_cpus_moves_shared_containers_in_either_order() {
    let m = Mount::v1("ledger-policy");
    let fs = Arc::new(Cgroupfs::detect(m.path()).expect("cgroupfs"));
    let w = CgroupWriter(fs.clone());
    let running = Ledger::shared(agent(), None);
    let keys = ["s0", "s1", "s2", "s3"];
    let mut shared = Vec::new();
    for k in keys {
        shared.push(started(&running, &m, container(k, "burstable", 2, 4)).await);
    }
    running.converge_once(&w).await;
    let reserved = CpuSet::parse("0-1").expect("cpus");
    let cpus_of =
        |dir: &std::path::PathBuf| CpuSet::parse(&read(dir, "cpuset.cpus")).expect("cpus");
    assert!(
        cpus_of(&shared[0]).intersects(&reserved),
        "s0 starts on CPUs 0-1"
    );
    // What a restarted agent lists: the containers with their cpusets and records.
    let snap = running.agent().snapshot();
    let listed: Vec<Listed> = keys
        .iter()
        .zip(&shared)
        .map(|(k, dir)| {
            let mut info = container(k, "burstable", 2, 4);
            info.cpus = Some(cpus_of(dir));
            info.annotations
                .insert(GRANT_KEY.into(), snap.record(k).expect("record"));
            Listed {
                runtime_id: hex_id(k),
                info,
            }
        })
        .collect();

    reserve_0_1(running.agent());
    running.converge_once(&w).await;
    for dir in &shared {
        assert!(
            !cpus_of(dir).intersects(&reserved),
            "{} holds {}",
            dir.display(),
            cpus_of(dir)
        );
    }
    assert_eq!(running.unconverged(), 0);

    let change_first = Ledger::shared(agent(), None);
    reserve_0_1(change_first.agent());
    change_first.restore(listed.clone(), change_first.now());
    let restore_first = Ledger::shared(agent(), None);
    restore_first.restore(listed, restore_first.now());
    reserve_0_1(restore_first.agent());
    let grants = |l: &Ledger| {
        let snap = l.agent().snapshot();
        keys.map(|k| snap.grant(k).map(|g| g.cpus))
    };
    assert_eq!(grants(&change_first), grants(&restore_first));
    assert_eq!(grants(&running), grants(&restore_first));
}

/// A runtime that lists fixed containers (for the comparison's logic; dockerd is in the e2e
/// tier).
struct Fixed(Vec<Listed>);

#[async_trait::async_trait]
impl Writer for Fixed {
    async fn write_cpuset(&self, _: &Update) -> Result<(), WriteError> {
        Ok(())
    }
}

#[async_trait::async_trait]
impl super::runtime::Runtime for Fixed {
    async fn list(&self) -> anyhow::Result<Vec<Listed>> {
        Ok(self.0.clone())
    }

    async fn live(&self) -> anyhow::Result<Vec<super::runtime::LiveId>> {
        Ok(self
            .0
            .iter()
            .map(|l| super::runtime::LiveId {
                key: l.info.id.clone(),
                runtime_id: l.runtime_id.clone(),
                running: true,
            })
            .collect())
    }
}

/// A name reused behind a proxy between two comparisons (the container removed and another
/// made under its name on the runtime itself) is the new container from the next comparison
/// on: its grant follows its own resources and writes go to its runtime id.
#[tokio::test]
async fn a_name_reused_behind_the_proxy_is_taken_as_the_new_container() {
    let l = Ledger::new(agent(), None);
    created(&l, container("k", "burstable", 2, 4), "old-id").await;
    let mut reused = container("k", "burstable", 8, 8);
    reused.cpus = CpuSet::parse("0-23").ok();
    let rt = Fixed(vec![Listed {
        runtime_id: "new-id".into(),
        info: reused,
    }]);
    let report = l
        .reconcile_with(&rt, Listing::Ids)
        .await
        .expect("reconcile");
    assert_eq!((report.released, report.adopted), (1, 1), "{report:?}");
    assert_eq!(l.resolve("new-id").as_deref(), Some("k"));
    assert_eq!(l.resolve("old-id"), None);
    let g = l.agent().snapshot().grant("k").cloned().expect("granted");
    assert_eq!(g.request_milli, 8000, "the new container's resources");
}

/// A restore the engine fails (a panic, caught) is an error, so the proxy's start-up tries it
/// again and does not report ready while nothing was restored.
#[tokio::test]
async fn a_restore_the_engine_fails_is_an_error_and_the_next_one_restores() {
    let l = Ledger::new(agent(), None);
    let mut c = container("k", "burstable", 2, 4);
    c.cpus = CpuSet::parse("0-23").ok();
    let rt = Fixed(vec![Listed {
        runtime_id: "id-k".into(),
        info: c,
    }]);
    l.agent().panic_next();
    assert!(l.restore_from(&rt).await.is_err());
    assert!(!l.agent().restored());
    assert_eq!(l.restore_from(&rt).await.expect("restored"), 1);
    assert!(l.agent().restored());
    assert!(l.agent().snapshot().grant("k").is_some());
}
