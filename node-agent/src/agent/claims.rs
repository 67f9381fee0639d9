//! DRA claims on the agent's engine ([`tap_engine::claim`]): booked when the kubelet prepares
//! them, given back when it unprepares them, read back from the checkpoint before the
//! containers at start. Shared containers that a claim moves go to the runtime mode's ledger
//! to be written, as after a policy change.

use super::{Agent, EngineFailed};
use crate::hook::Hook;
use tap_engine::claim::{ClaimAsk, ClaimError, ClaimGrant};
use tap_engine::dra::DeviceSpec;
use tap_engine::topology::Level;

/// Why the engine did not book a claim.
#[derive(Debug, thiserror::Error)]
pub enum BookError {
    #[error(transparent)]
    Refused(#[from] ClaimError),
    #[error(transparent)]
    Failed(#[from] EngineFailed),
}

impl Agent {
    /// Books `ask` (idempotent for the same claim); the shared containers it moves are written.
    pub fn book_claim(&self, ask: &ClaimAsk) -> Result<ClaimGrant, BookError> {
        let (g, ups) = self
            .guarded(Hook::Prepare, |e| e.claim(ask))
            .ok_or(EngineFailed)??;
        tracing::info!(claim = %ask.key, uid = %ask.uid, cpus = %g.cpus, mems = %g.mems, moved = ups.len(), "DRA claim booked");
        self.moved(ups);
        Ok(g)
    }

    /// Gives the CPUs of claim `uid` back (idempotent); the shared containers that may use them
    /// again are written.
    pub fn release_claim(&self, uid: &str) -> Result<(), EngineFailed> {
        let ups = self
            .guarded(Hook::Unprepare, |e| e.release_claim(uid))
            .ok_or(EngineFailed)?;
        tracing::info!(uid, moved = ups.len(), "DRA claim released");
        self.moved(ups);
        Ok(())
    }

    /// Books the claims of the checkpoint (before the containers are restored); returns those
    /// the engine refused.
    pub fn restore_claims(&self, claims: Vec<ClaimGrant>) -> Result<Vec<ClaimError>, EngineFailed> {
        let (ups, refused) = self
            .guarded(Hook::Sync, |e| e.restore_claims(claims))
            .ok_or(EngineFailed)?;
        self.moved(ups);
        Ok(refused)
    }

    /// The booked claims.
    pub fn claims(&self) -> Vec<ClaimGrant> {
        self.inspect(|e| e.claims().cloned().collect())
    }

    /// The booked claim `uid`.
    pub fn claim_of(&self, uid: &str) -> Option<ClaimGrant> {
        self.inspect(|e| e.claim_of(uid).cloned())
    }

    /// The DRA devices this node offers: at the policy's level where it sets one, else at
    /// `level` (over the engine's allocatable CPUs).
    pub fn dra_devices(&self, level: Level) -> Vec<DeviceSpec> {
        self.inspect(|e| {
            let cfg = e.config();
            let level = cfg.dra_level.unwrap_or(level);
            tap_engine::dra::devices(e.topology(), &e.allocatable(), level, cfg.exclusive_cores)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{agent, burstable};
    use super::super::Agent;
    use crate::dra::DRIVER;
    use crate::pod_resources::KubeletDevice;
    use std::sync::{Arc, Mutex};
    use tap_engine::claim::{ClaimAsk, ClaimKey, PartAsk};

    fn key(name: &str) -> ClaimKey {
        ClaimKey {
            namespace: "default".into(),
            name: name.into(),
        }
    }

    fn device(claim: &str, node: u32) -> KubeletDevice {
        KubeletDevice {
            resource: DRIVER.into(),
            id: format!("node-a/numa{node}"),
            numa_nodes: vec![node],
            claim: Some(key(claim)),
        }
    }

    /// The claim `uid` (named `name`) asking, under its request `cpus`, for `cpus` CPUs and
    /// `memory_bytes` of the CPU group `group` (`numa3`).
    fn ask(
        a: &Agent,
        uid: &str,
        name: &str,
        group: &str,
        cpus: usize,
        memory_bytes: u64,
    ) -> ClaimAsk {
        let device = tap_engine::dra::pool_of(a.topology(), group).unwrap().id;
        ClaimAsk {
            uid: uid.into(),
            key: key(name),
            parts: vec![PartAsk {
                request: "cpus".into(),
                device,
                cpus,
                memory_bytes,
            }],
        }
    }

    #[test]
    fn a_container_of_a_prepared_claim_gets_its_cpus_and_neighbours_move_off_them() {
        let a = agent("synthetic-2s-4numa-96c-gpu");
        let moved = Arc::new(Mutex::new(Vec::new()));
        let sink = moved.clone();
        a.set_change_sink(Box::new(move |ids| sink.lock().unwrap().extend(ids)));
        let mut shared = burstable("s", 4, 8);
        shared.kubelet_devices = vec![KubeletDevice {
            claim: None,
            resource: "example.com/accel".into(),
            ..device("x", 3)
        }];
        let before = a.create(&shared).cpus.unwrap();
        assert_eq!(
            before.to_string(),
            "72-95",
            "the shared container on node 3"
        );
        let ask = ask(&a, "uid-c1", "cpus", "numa3", 4, 256 << 20);
        let g = a.book_claim(&ask).unwrap();
        assert_eq!(
            *moved.lock().unwrap(),
            ["s"],
            "the shared container moves off the claim"
        );
        assert!(g.cpus.is_subset(&before));

        let mut c = burstable("c", 1, 2);
        c.kubelet_devices = vec![
            device("cpus", 3),
            KubeletDevice {
                claim: Some(key("gpu")),
                resource: "gpu.example.com".into(),
                ..device("gpu", 3)
            },
        ];
        let adj = a.create(&c);
        assert_eq!(
            (adj.cpus, adj.mems.map(|m| m.to_string())),
            (Some(g.cpus), Some("3".into()))
        );
        assert!(adj.record.unwrap().ends_with(";on=claim:uid-c1"));
        // Another container of the Pod, without the claim, is placed around it.
        let other = a.create(&burstable("o", 1, 2)).cpus.unwrap();
        assert!(!other.intersects(&g.cpus));
        // Unprepared: the CPUs go back to the shared container.
        moved.lock().unwrap().clear();
        a.remove("c");
        a.release_claim("uid-c1").unwrap();
        assert!(moved.lock().unwrap().contains(&"s".to_string()));
        assert!(a.claims().is_empty());
    }

    #[test]
    fn a_claim_the_node_cannot_hold_is_refused_and_nothing_moves() {
        let a = agent("synthetic-2s-4numa-96c-gpu");
        let ask = ask(&a, "u", "big", "numa0", 25, 0);
        let e = a.book_claim(&ask).unwrap_err();
        assert_eq!(
            e.to_string(),
            "device numa0: 25 CPUs asked, 0 or more than the group's 24 usable CPUs"
        );
        assert!(a.claims().is_empty());
    }
}
