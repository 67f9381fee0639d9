//! The convergence loop's way to a container's cpuset in NRI mode, one of three
//! ([`WritePath`]):
//!
//! - the container's cgroup written directly ([`crate::cgroupfs`]), which involves neither
//!   containerd's locks nor the container's shim, so it is bounded and no hung shim holds it
//!   (`--nri-cgroup-writes=auto`, where the cgroup filesystem is writable: the default on
//!   every containerd);
//! - otherwise unsolicited `UpdateContainers` on the current session, where the runtime takes
//!   them without deadlock (containerd from 2.4 under `--nri-unsolicited-updates=auto`;
//!   `always` forces this path);
//! - failing both, updates ride on the answers to containerd's own requests
//!   ([`crate::ledger::Ledger::claim_for_answer`]): no time bound, kept as the last resort.
//!
//! Why not unsolicited updates everywhere: containerd's NRI takes two locks, its CRI glue's
//! (`pkg/nri`, held for a whole lifecycle request) and then the NRI adaptation's. An
//! unsolicited `UpdateContainers` takes them the other way round (adaptation first, then the
//! glue's, in `updateContainers` → `updateFn`), so one that arrives while containerd handles
//! any pod or container request can deadlock containerd's NRI for good: every later create
//! waits forever. Fixed upstream in NRI v0.12.1 (commit 55afaa2, the lock order made one),
//! which containerd vendors from 2.4 on; every 1.7, 2.0-2.3 release has the inversion.

use crate::agent::Update;
use crate::cgroupfs::Cgroupfs;
use crate::flags::UnsolicitedUpdates;
use crate::ledger::{Channel, WriteError, Writer};
use async_trait::async_trait;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::convert;
use super::proto::{RuntimeClient, UpdateContainersRequest};

/// How the convergence loop's writes reach a container in NRI mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WritePath {
    /// Unsolicited `UpdateContainers` (the runtime's record and the cgroup change together).
    Unsolicited,
    /// The container's cgroup, written directly.
    Cgroup,
    /// Only on the answers to the runtime's own requests.
    Answers,
}

/// Whether this runtime may be sent unsolicited updates, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Send,
    AnswersOnly(String),
}

/// The first containerd release whose NRI takes unsolicited updates without the lock inversion.
const CONTAINERD_FIXED: (u64, u64) = (2, 4);

/// Decides from the flag and what the runtime told Configure.
pub fn verdict(flag: UnsolicitedUpdates, runtime: &str, version: &str) -> Verdict {
    match flag {
        UnsolicitedUpdates::Always => Verdict::Send,
        UnsolicitedUpdates::Never => Verdict::AnswersOnly("--nri-unsolicited-updates=never".into()),
        UnsolicitedUpdates::Auto => auto_verdict(runtime, version),
    }
}

fn auto_verdict(runtime: &str, version: &str) -> Verdict {
    if runtime != "containerd" {
        return Verdict::AnswersOnly(format!(
            "runtime {runtime:?} is not known to take unsolicited NRI updates safely"
        ));
    }
    match major_minor(version) {
        Some(v) if v >= CONTAINERD_FIXED => Verdict::Send,
        Some(_) => Verdict::AnswersOnly(format!(
            "containerd {version}'s NRI can deadlock on an unsolicited update (the lock-order inversion fixed in NRI v0.12.1, vendored from containerd 2.4)"
        )),
        None => Verdict::AnswersOnly(format!("containerd version {version:?} not understood")),
    }
}

/// `v2.4.0-beta.0`, `1.7.24~ds1`, `2.1.4+unknown` → (major, minor).
fn major_minor(version: &str) -> Option<(u64, u64)> {
    let v = version.trim().trim_start_matches('v');
    let mut parts = v.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The runtime connection of the current session. Empty between sessions and until the
/// session's Synchronize is answered: the loop's writes then fail and are retried.
pub struct RuntimeSlot {
    flag: UnsolicitedUpdates,
    /// The cgroup filesystem, where the agent may write it (`--nri-cgroup-writes`).
    cgroups: Option<Arc<Cgroupfs>>,
    client: Mutex<Option<RuntimeClient>>,
    /// Set at Configure from [`verdict`].
    unsolicited: AtomicBool,
    /// containerd's requests being handled, and when the last one ended (ms since the epoch).
    busy: AtomicUsize,
    last_request_ms: AtomicU64,
    /// One unsolicited write at a time.
    writing: tokio::sync::Mutex<()>,
}

impl Default for RuntimeSlot {
    fn default() -> Self {
        RuntimeSlot::new(UnsolicitedUpdates::Auto, None)
    }
}

/// How long the runtime must have sent no request before an unsolicited update goes out, even
/// where it is allowed: updates ride on answers while the runtime is busy.
pub const QUIET_BEFORE_UNSOLICITED: Duration = Duration::from_millis(1000);

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Counts a request of the runtime's as being handled until dropped.
pub struct Handling<'a>(&'a RuntimeSlot);

impl<'a> Handling<'a> {
    pub fn new(slot: &'a RuntimeSlot) -> Handling<'a> {
        slot.busy.fetch_add(1, Ordering::SeqCst);
        Handling(slot)
    }
}

impl Drop for Handling<'_> {
    fn drop(&mut self) {
        self.0.last_request_ms.store(now_ms(), Ordering::SeqCst);
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

impl RuntimeSlot {
    pub fn new(flag: UnsolicitedUpdates, cgroups: Option<Arc<Cgroupfs>>) -> RuntimeSlot {
        RuntimeSlot {
            flag,
            cgroups,
            client: Mutex::new(None),
            unsolicited: AtomicBool::new(false),
            busy: AtomicUsize::new(0),
            last_request_ms: AtomicU64::new(0),
            writing: tokio::sync::Mutex::new(()),
        }
    }

    /// At Configure: decides, logs and returns whether unsolicited updates go out.
    pub fn configure(&self, runtime: &str, version: &str) -> Verdict {
        let v = verdict(self.flag, runtime, version);
        self.unsolicited
            .store(matches!(v, Verdict::Send), Ordering::SeqCst);
        match (&v, &self.cgroups) {
            (_, Some(fs)) if self.path() == WritePath::Cgroup => tracing::info!(
                runtime,
                version,
                cgroup_root = %fs.root().display(),
                "NRI: cpuset updates of running containers are written to their cgroups ({})",
                fs.hierarchy().as_str()
            ),
            (Verdict::Send, _) => tracing::info!(
                runtime,
                version,
                "NRI: cpuset updates of running containers go out on their own when the runtime is quiet"
            ),
            (Verdict::AnswersOnly(why), _) => tracing::warn!(
                runtime,
                version,
                "NRI: cpuset updates of running containers ride on the answers to the runtime's requests only, with no time bound: {why}; and no writable cgroup filesystem (--cgroup-root, --nri-cgroup-writes)"
            ),
        }
        v
    }

    /// How the loop's writes reach containers now.
    /// The cgroup write where allowed, on every containerd: containerd (2.4.2 too) applies an
    /// unsolicited or carried update under its NRI lock and waits on the container's shim, so
    /// one for a container whose shim hangs holds every Pod operation of the node (measured:
    /// a create 6.2 s instead of 0.3 s). `--nri-unsolicited-updates=always` still forces them.
    pub fn path(&self) -> WritePath {
        let unsolicited = self.unsolicited.load(Ordering::SeqCst);
        match (self.flag, &self.cgroups) {
            (UnsolicitedUpdates::Always, _) => WritePath::Unsolicited,
            (_, Some(_)) => WritePath::Cgroup,
            (_, None) if unsolicited => WritePath::Unsolicited,
            (_, None) => WritePath::Answers,
        }
    }

    /// Whether the runtime has been quiet long enough for an unsolicited update.
    fn quiet(&self) -> bool {
        let last = self.last_request_ms.load(Ordering::SeqCst);
        self.busy.load(Ordering::SeqCst) == 0
            && now_ms().saturating_sub(last) >= QUIET_BEFORE_UNSOLICITED.as_millis() as u64
    }

    pub fn set(&self, c: Option<RuntimeClient>) {
        *self.client.lock().unwrap_or_else(|p| p.into_inner()) = c;
    }

    fn get(&self) -> Option<RuntimeClient> {
        self.client
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[async_trait]
impl Writer for RuntimeSlot {
    fn channel(&self) -> Channel {
        match self.path() {
            WritePath::Unsolicited | WritePath::Cgroup => Channel::OwnCalls,
            WritePath::Answers => Channel::AnswersOnly,
        }
    }

    async fn write_cpuset(&self, u: &Update) -> Result<(), WriteError> {
        match (self.path(), &self.cgroups) {
            (WritePath::Cgroup, Some(fs)) => write_cgroup(fs.clone(), u).await,
            _ => self.update_containers(u).await,
        }
    }
}

/// Writes the container's cgroup on a blocking thread (the loop's deadline still applies).
async fn write_cgroup(fs: Arc<Cgroupfs>, u: &Update) -> Result<(), WriteError> {
    let u = u.clone();
    let joined =
        tokio::task::spawn_blocking(move || fs.write(&u.container_id, &u.cpus, u.mems.as_ref()))
            .await;
    match joined {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) if e.is_not_found() => Err(WriteError::NotFound),
        Ok(Err(e)) => Err(WriteError::Refused(e.to_string())),
        Err(e) => Err(WriteError::Refused(format!(
            "the cgroup write stopped: {e}"
        ))),
    }
}

impl RuntimeSlot {
    /// An unsolicited `UpdateContainers` on the current session.
    async fn update_containers(&self, u: &Update) -> Result<(), WriteError> {
        let Some(client) = self.get() else {
            return Err(WriteError::Unreachable("no NRI session".into()));
        };
        let _one = self.writing.lock().await;
        if !self.quiet() {
            return Err(WriteError::Deferred(
                "the runtime is busy (the update rides on its next answer or goes when it is quiet)"
                    .into(),
            ));
        }
        let mut req = UpdateContainersRequest::new();
        req.update = vec![convert::container_update(u)];
        // The same deadline goes to the runtime, which gives up on the update then (a shorter
        // wait for the creates it holds meanwhile than the loop's timeout plus a margin).
        let deadline = crate::ledger::converge::WRITE_DEADLINE;
        let ctx = ttrpc::context::with_timeout(deadline.as_nanos() as i64);
        match client.update_containers(ctx, &req).await {
            Ok(resp) if resp.failed.is_empty() => Ok(()),
            Ok(_) => Err(WriteError::Refused(
                "UpdateContainers listed it as failed".into(),
            )),
            Err(e) if is_deadline(&e) => Err(WriteError::Timeout(deadline)),
            Err(e) => Err(WriteError::Unreachable(format!("UpdateContainers: {e}"))),
        }
    }
}

/// Whether a ttrpc error is a missed deadline (the client's own, or the server's status).
fn is_deadline(e: &ttrpc::Error) -> bool {
    match e {
        ttrpc::Error::RpcStatus(s) => s.code() == ttrpc::Code::DEADLINE_EXCEEDED,
        ttrpc::Error::Others(m) => m.contains("deadline"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auto(runtime: &str, version: &str) -> bool {
        verdict(UnsolicitedUpdates::Auto, runtime, version) == Verdict::Send
    }

    #[test]
    fn only_a_containerd_without_the_lock_inversion_gets_unsolicited_updates_by_default() {
        // The versions on the machines we test and the ones users run.
        assert!(!auto("containerd", "1.7.24~ds1"));
        assert!(!auto("containerd", "v1.7.34"));
        assert!(!auto("containerd", "v2.3.4"));
        assert!(!auto("containerd", "2.0.0+unknown"));
        assert!(auto("containerd", "v2.4.0-beta.0"));
        assert!(auto("containerd", "2.4.1"));
        assert!(auto("containerd", "v3.0.0"));
        // Unknown runtimes and versions: answers only.
        assert!(!auto("cri-o", "1.31.0"));
        assert!(!auto("containerd", ""));
        assert!(!auto("containerd", "dev"));
    }

    #[test]
    fn the_flag_overrides_the_runtime_check() {
        let s = verdict(UnsolicitedUpdates::Always, "cri-o", "1.31.0");
        assert_eq!(s, Verdict::Send);
        let n = verdict(UnsolicitedUpdates::Never, "containerd", "v2.4.0");
        assert!(matches!(n, Verdict::AnswersOnly(_)));
    }

    #[test]
    fn the_slot_writes_on_its_own_only_after_a_send_verdict() {
        let slot = RuntimeSlot::default();
        assert_eq!(slot.channel(), Channel::AnswersOnly, "before Configure");
        slot.configure("containerd", "1.7.24");
        assert_eq!(slot.channel(), Channel::AnswersOnly);
        slot.configure("containerd", "2.4.0");
        assert_eq!(slot.channel(), Channel::OwnCalls);
    }

    #[tokio::test]
    async fn before_2_4_the_loop_writes_cgroups_where_it_may() {
        use crate::cgroupfs::testing::{read, Mount};
        let m = Mount::v1("slot");
        let id = "ab".repeat(32);
        let dir = m.container(&id, "0-95", "0");
        let fs = Arc::new(Cgroupfs::detect(m.path()).expect("cgroupfs"));
        let slot = RuntimeSlot::new(UnsolicitedUpdates::Auto, Some(fs.clone()));
        slot.configure("containerd", "1.7.24");
        assert_eq!(slot.path(), WritePath::Cgroup);
        assert_eq!(slot.channel(), Channel::OwnCalls);
        let u = Update {
            container_id: id.clone(),
            cpus: tap_engine::CpuSet::parse("4-7").expect("cpus"),
            mems: Some(tap_engine::NodeSet::parse("1").expect("nodes")),
        };
        slot.write_cpuset(&u).await.expect("written");
        assert_eq!(read(&dir, "cpuset.cpus"), "4-7");
        assert_eq!(read(&dir, "cpuset.mems"), "1");
        let gone = Update {
            container_id: "cd".repeat(32),
            ..u
        };
        assert_eq!(slot.write_cpuset(&gone).await, Err(WriteError::NotFound));
        // containerd 2.4 takes unsolicited updates without the deadlock, but still waits on a
        // hung shim under its NRI lock for one: cgroups there too.
        slot.configure("containerd", "2.4.2");
        assert_eq!(slot.path(), WritePath::Cgroup);
        let always = RuntimeSlot::new(UnsolicitedUpdates::Always, Some(fs.clone()));
        always.configure("containerd", "1.7.24");
        assert_eq!(always.path(), WritePath::Unsolicited);
        // Without a writable cgroup filesystem: unsolicited from 2.4, answers before.
        let none = RuntimeSlot::new(UnsolicitedUpdates::Auto, None);
        none.configure("containerd", "2.4.2");
        assert_eq!(none.path(), WritePath::Unsolicited);
        none.configure("containerd", "2.3.7");
        assert_eq!(none.path(), WritePath::Answers);
    }
}
