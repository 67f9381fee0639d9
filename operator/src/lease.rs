//! Leader election on a `coordination.k8s.io/v1` Lease, so two replicas never write at once.
//!
//! The holder renews `renewTime` every retry period. Another replica judges expiry by its own
//! monotonic clock, never by comparing `renewTime` with its wall clock (clocks of different
//! nodes disagree): it remembers the Lease's spec and the [`Instant`] it last saw that spec
//! change, and takes the lease over only when the spec has stayed the same for the holder's
//! `leaseDurationSeconds` as measured locally. A candidate whose clock runs ahead thus never
//! steals a live lease, and one whose clock lags still takes over a dead one. A fresh candidate
//! waits one full lease duration before it may take a held lease over (it cannot know how old
//! the last renewal is). Every write is a replace with the resourceVersion read just before, so
//! two candidates racing for an expired lease cannot both win (the API server refuses the
//! second with a conflict). A holder that cannot renew within its renew deadline stops writing
//! (the process exits; its Deployment restarts it as a candidate).
//!
//! The wall clock is only written (`acquireTime`, `renewTime`, for people and tools reading the
//! Lease). [`LeaderElector::with_wall_clock_offset`] shifts those written timestamps; it exists
//! only so that tests can play a node whose clock is off.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What to do with the lease as it is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseAction {
    /// No lease object yet.
    Create,
    /// We hold it: renew.
    Renew,
    /// Free or expired: take it over.
    Acquire,
    /// Someone else holds it and it changed less than its lease duration ago (local time).
    Wait { holder: String },
}

/// The lease spec as last seen, and when (by this process's monotonic clock) it was first seen
/// in that form.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    pub spec: LeaseSpec,
    pub since: Instant,
}

/// The lease duration the holder declared (15 s when absent, at least 1 s).
fn lease_duration(spec: &LeaseSpec) -> Duration {
    let secs = spec.lease_duration_seconds.unwrap_or(15).max(1);
    Duration::from_secs(u64::try_from(secs).unwrap_or(1))
}

/// Pure decision from the lease as read, what was observed before and the monotonic `now`.
/// Updates `seen` when the spec changed (or was never seen).
pub fn decide(
    spec: Option<&LeaseSpec>,
    me: &str,
    seen: &mut Option<Observed>,
    now: Instant,
) -> LeaseAction {
    let Some(spec) = spec else {
        *seen = None;
        return LeaseAction::Create;
    };
    if seen.as_ref().is_none_or(|o| &o.spec != spec) {
        *seen = Some(Observed {
            spec: spec.clone(),
            since: now,
        });
    }
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder == me {
        return LeaseAction::Renew;
    }
    if holder.is_empty() {
        return LeaseAction::Acquire;
    }
    let since = seen.as_ref().map_or(now, |o| o.since);
    if now.saturating_duration_since(since) < lease_duration(spec) {
        LeaseAction::Wait { holder }
    } else {
        LeaseAction::Acquire
    }
}

pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
    /// Added to the wall-clock timestamps written into the Lease; zero except in tests.
    wall_clock_offset: jiff::SignedDuration,
    seen: Mutex<Option<Observed>>,
}

impl LeaderElector {
    pub fn new(api: Api<Lease>, name: &str, identity: &str, duration: Duration) -> LeaderElector {
        LeaderElector {
            api,
            name: name.to_string(),
            identity: identity.to_string(),
            duration,
            wall_clock_offset: jiff::SignedDuration::ZERO,
            seen: Mutex::new(None),
        }
    }

    /// Test-only: shift the `acquireTime`/`renewTime` this replica writes, as a node whose
    /// clock is off by `offset` would. Expiry never depends on these timestamps.
    pub fn with_wall_clock_offset(mut self, offset: jiff::SignedDuration) -> LeaderElector {
        self.wall_clock_offset = offset;
        self
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    fn wall_now(&self) -> jiff::Timestamp {
        let now = jiff::Timestamp::now();
        now.checked_add(self.wall_clock_offset).unwrap_or(now)
    }

    fn spec(&self, old: Option<&LeaseSpec>, acquire: bool) -> LeaseSpec {
        let now = MicroTime(self.wall_now());
        let transitions = old.and_then(|s| s.lease_transitions).unwrap_or(0);
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.duration.as_secs().max(1)).unwrap_or(i32::MAX),
            ),
            acquire_time: if acquire {
                Some(now.clone())
            } else {
                old.and_then(|s| s.acquire_time.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(if acquire && old.is_some() {
                transitions.saturating_add(1)
            } else {
                transitions
            }),
            ..Default::default()
        }
    }

    fn observe(&self) -> std::sync::MutexGuard<'_, Option<Observed>> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One attempt to take or keep the lease; `Ok(true)` when we hold it afterwards.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let current = self.api.get_opt(&self.name).await?;
        let action = decide(
            current.as_ref().and_then(|l| l.spec.as_ref()),
            &self.identity,
            &mut self.observe(),
            Instant::now(),
        );
        let result = match (&action, current) {
            (LeaseAction::Create, _) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..Default::default()
                    },
                    spec: Some(self.spec(None, true)),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            (LeaseAction::Wait { .. }, _) => return Ok(false),
            (_, None) => return Ok(false),
            (LeaseAction::Renew | LeaseAction::Acquire, Some(mut lease)) => {
                let acquire = action == LeaseAction::Acquire;
                lease.spec = Some(self.spec(lease.spec.as_ref(), acquire));
                // metadata.resourceVersion is kept: a concurrent writer makes this a 409.
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
            }
        };
        match result {
            Ok(written) => {
                if let Some(spec) = written.spec {
                    *self.observe() = Some(Observed {
                        spec,
                        since: Instant::now(),
                    });
                }
                if action == LeaseAction::Acquire || action == LeaseAction::Create {
                    tracing::info!(lease = %self.name, identity = %self.identity, "became leader");
                }
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the lease up (on shutdown) so a standby takes over at once.
    pub async fn release(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await else {
            return;
        };
        let Some(spec) = lease.spec.as_mut() else {
            return;
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.acquire_time = None;
        spec.renew_time = None;
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => tracing::info!(lease = %self.name, "released the leader lease"),
            Err(e) => tracing::warn!(lease = %self.name, "could not release the lease: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, renewed_us: i64, duration: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            renew_time: Some(MicroTime(
                jiff::Timestamp::from_microsecond(renewed_us).unwrap(),
            )),
            lease_duration_seconds: Some(duration),
            ..Default::default()
        }
    }

    fn wait(holder: &str) -> LeaseAction {
        LeaseAction::Wait {
            holder: holder.into(),
        }
    }

    /// Asserts a candidate that has `seen` the lease `l` still waits for its holder at `waits`
    /// and takes it over at `acquires`.
    fn assert_waits_then_acquires(
        l: &LeaseSpec,
        seen: &mut Option<Observed>,
        waits: Instant,
        acquires: Instant,
    ) {
        let holder = l.holder_identity.as_deref().expect("a holder");
        assert_eq!(decide(Some(l), "me", seen, waits), wait(holder));
        assert_eq!(decide(Some(l), "me", seen, acquires), LeaseAction::Acquire);
    }

    #[test]
    fn create_renew_and_free() {
        let t0 = Instant::now();
        let mut seen = None;
        assert_eq!(decide(None, "me", &mut seen, t0), LeaseAction::Create);
        assert_eq!(seen, None);
        let mine = lease(Some("me"), 10, 15);
        assert_eq!(decide(Some(&mine), "me", &mut seen, t0), LeaseAction::Renew);
        // Released (no holder): taken at once, whatever its timestamps say.
        let free = lease(None, 4_000_000_000_000_000, 15);
        assert_eq!(
            decide(Some(&free), "me", &mut seen, t0),
            LeaseAction::Acquire
        );
    }

    #[test]
    fn a_fresh_candidate_waits_one_lease_duration_by_its_own_clock() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        // The renewTime is an hour in the past of any reader's wall clock: irrelevant.
        let other = lease(Some("other"), 0, 15);
        let mut seen = None;
        assert_eq!(decide(Some(&other), "me", &mut seen, t0), wait("other"));
        assert_eq!(seen.as_ref().map(|o| o.since), Some(t0));
        assert_waits_then_acquires(&other, &mut seen, t0 + s(14), t0 + s(15));
    }

    #[test]
    fn every_renewal_restarts_the_local_countdown_whatever_its_timestamp() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let hour_us = 3_600_000_000i64;
        let mut seen = None;
        // The holder's clock runs an hour ahead, then an hour behind: each renewal is a change.
        let mut at = t0;
        for (i, renew) in [hour_us, hour_us + 2_000_000, -hour_us, -hour_us + 1]
            .into_iter()
            .enumerate()
        {
            at = t0 + s(10 * i as u64);
            let l = lease(Some("other"), renew, 15);
            assert_eq!(decide(Some(&l), "me", &mut seen, at), wait("other"));
            assert_eq!(seen.as_ref().map(|o| o.since), Some(at));
        }
        // No change since the last renewal: expired 15 s (local) after it was seen.
        let last = lease(Some("other"), -hour_us + 1, 15);
        assert_waits_then_acquires(&last, &mut seen, at + s(14), at + s(15));
    }

    #[test]
    fn the_holders_duration_counts_and_a_new_holder_is_a_change() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut seen = None;
        let short = lease(Some("a"), 5, 3);
        assert_waits_then_acquires(&short, &mut seen, t0, t0 + s(3));
        // Someone else took it over (same renewTime, new holder): the countdown restarts.
        let taken = lease(Some("b"), 5, 3);
        assert_waits_then_acquires(&taken, &mut seen, t0 + s(4), t0 + s(7));
        // A missing or nonsensical duration: 15 s, at least 1 s.
        let mut none = lease(Some("c"), 5, 0);
        none.lease_duration_seconds = None;
        assert_eq!(decide(Some(&none), "me", &mut seen, t0), wait("c"));
        assert_eq!(decide(Some(&none), "me", &mut seen, t0 + s(14)), wait("c"));
        let negative = lease(Some("d"), 5, -7);
        assert_waits_then_acquires(&negative, &mut seen, t0, t0 + s(1));
    }

    #[test]
    fn a_deleted_lease_forgets_the_observation() {
        let t0 = Instant::now();
        let mut seen = None;
        let l = lease(Some("a"), 5, 3);
        assert_eq!(decide(Some(&l), "me", &mut seen, t0), wait("a"));
        assert_eq!(decide(None, "me", &mut seen, t0), LeaseAction::Create);
        assert!(seen.is_none());
    }
}
