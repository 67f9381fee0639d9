//! Leader election on a `coordination.k8s.io/v1` Lease, so two replicas never write at once.
//!
//! The holder renews `renewTime` every retry period; another replica takes the lease over only
//! when `renewTime + leaseDurationSeconds` has passed. Every write is a replace with the
//! resourceVersion read just before, so two candidates racing for an expired lease cannot both
//! win (the API server refuses the second with a conflict). A holder that cannot renew within
//! its renew deadline stops writing (the process exits; its Deployment restarts it as a
//! candidate).

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use std::time::Duration;

/// What to do with the lease as it is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseAction {
    /// No lease object yet.
    Create,
    /// We hold it: renew.
    Renew,
    /// Free or expired: take it over.
    Acquire,
    /// Someone else holds it and it is fresh.
    Wait { holder: String },
}

/// Pure decision from the lease as read and the local clock.
pub fn decide(spec: Option<&LeaseSpec>, me: &str, now: jiff::Timestamp) -> LeaseAction {
    let Some(spec) = spec else {
        return LeaseAction::Create;
    };
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder == me {
        return LeaseAction::Renew;
    }
    if holder.is_empty() {
        return LeaseAction::Acquire;
    }
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15).max(1));
    let last = spec
        .renew_time
        .as_ref()
        .or(spec.acquire_time.as_ref())
        .map(|t| t.0);
    match last {
        Some(t) if t.as_second().saturating_add(duration) > now.as_second() => {
            LeaseAction::Wait { holder }
        }
        _ => LeaseAction::Acquire,
    }
}

pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
}

impl LeaderElector {
    pub fn new(api: Api<Lease>, name: &str, identity: &str, duration: Duration) -> LeaderElector {
        LeaderElector {
            api,
            name: name.to_string(),
            identity: identity.to_string(),
            duration,
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    fn spec(&self, old: Option<&LeaseSpec>, acquire: bool) -> LeaseSpec {
        let now = MicroTime(jiff::Timestamp::now());
        let transitions = old.and_then(|s| s.lease_transitions).unwrap_or(0);
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.duration.as_secs().max(1) as i32),
            acquire_time: if acquire {
                Some(now.clone())
            } else {
                old.and_then(|s| s.acquire_time.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(if acquire && old.is_some() {
                transitions + 1
            } else {
                transitions
            }),
            ..Default::default()
        }
    }

    /// One attempt to take or keep the lease; `Ok(true)` when we hold it afterwards.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let current = self.api.get_opt(&self.name).await?;
        let action = decide(
            current.as_ref().and_then(|l| l.spec.as_ref()),
            &self.identity,
            jiff::Timestamp::now(),
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
            Ok(_) => {
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

    fn at(s: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(s).unwrap()
    }

    fn lease(holder: Option<&str>, renewed: i64, duration: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            renew_time: Some(MicroTime(at(renewed))),
            lease_duration_seconds: Some(duration),
            ..Default::default()
        }
    }

    #[test]
    fn decisions() {
        assert_eq!(decide(None, "me", at(100)), LeaseAction::Create);
        assert_eq!(
            decide(Some(&lease(Some("me"), 10, 15)), "me", at(100)),
            LeaseAction::Renew
        );
        assert_eq!(
            decide(Some(&lease(Some("other"), 95, 15)), "me", at(100)),
            LeaseAction::Wait {
                holder: "other".into()
            }
        );
        assert_eq!(
            decide(Some(&lease(Some("other"), 80, 15)), "me", at(100)),
            LeaseAction::Acquire
        );
        assert_eq!(
            decide(Some(&lease(None, 99, 15)), "me", at(100)),
            LeaseAction::Acquire
        );
        let mut never_renewed = lease(Some("other"), 0, 15);
        never_renewed.renew_time = None;
        assert_eq!(
            decide(Some(&never_renewed), "me", at(100)),
            LeaseAction::Acquire
        );
    }
}
