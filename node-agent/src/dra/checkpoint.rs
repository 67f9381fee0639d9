//! The booked claims on disk (`dra-claims.json` in the state folder, written atomically after
//! every prepare and unprepare): a restarted agent books them again before it restores the
//! containers, so a container on a claim's CPUs finds its claim, and no CPU is given twice.
//! Devices are kept by name and CPUs in the kernel's list syntax, so a record outlives a change
//! of pool numbering; a record that no longer fits the machine is refused by the engine.

use crate::ledger::state_file::{StateFile, StateFileError};
use serde::{Deserialize, Serialize};
use std::path::Path;
use tap_engine::claim::{ClaimGrant, ClaimKey, ClaimPart};
use tap_engine::{CpuSet, NodeSet, Topology};

/// The file's name in the state folder.
pub const FILE: &str = "dra-claims.json";

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub claims: Vec<ClaimRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimRecord {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub parts: Vec<PartRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PartRecord {
    pub request: String,
    pub device: String,
    pub cpus: String,
    pub memory_bytes: u64,
}

/// A record that does not describe a claim on this machine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("claim {key} in the checkpoint: {why}")]
pub struct BadRecord {
    pub key: ClaimKey,
    pub why: String,
}

impl Checkpoint {
    pub fn of(claims: impl Iterator<Item = ClaimGrant>, topo: &Topology) -> Checkpoint {
        Checkpoint {
            claims: claims.map(|g| ClaimRecord::of(&g, topo)).collect(),
        }
    }

    /// The claims it holds, and those it cannot give back on `topo`.
    pub fn grants(&self, topo: &Topology) -> (Vec<ClaimGrant>, Vec<BadRecord>) {
        let mut good = Vec::new();
        let mut bad = Vec::new();
        for r in &self.claims {
            match r.grant(topo) {
                Ok(g) => good.push(g),
                Err(e) => bad.push(e),
            }
        }
        (good, bad)
    }
}

impl ClaimRecord {
    fn of(g: &ClaimGrant, topo: &Topology) -> ClaimRecord {
        ClaimRecord {
            uid: g.uid.clone(),
            namespace: g.key.namespace.clone(),
            name: g.key.name.clone(),
            parts: g
                .parts
                .iter()
                .map(|p| PartRecord {
                    request: p.request.clone(),
                    device: tap_engine::dra::device_name(topo, p.device),
                    cpus: p.cpus.to_string(),
                    memory_bytes: p.memory_bytes,
                })
                .collect(),
        }
    }

    fn grant(&self, topo: &Topology) -> Result<ClaimGrant, BadRecord> {
        let key = ClaimKey {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        };
        let bad = |why: String| BadRecord {
            key: key.clone(),
            why,
        };
        let mut parts = Vec::with_capacity(self.parts.len());
        for p in &self.parts {
            let pool = tap_engine::dra::pool_of(topo, &p.device)
                .ok_or_else(|| bad(format!("no CPU group {}", p.device)))?;
            let cpus =
                CpuSet::parse(&p.cpus).map_err(|e| bad(format!("cpus {:?}: {e}", p.cpus)))?;
            if !cpus.is_subset(&pool.cpus) {
                return Err(bad(format!("cpus {cpus} are not all in {}", p.device)));
            }
            parts.push(ClaimPart {
                request: p.request.clone(),
                device: pool.id,
                cpus,
                memory_bytes: p.memory_bytes,
            });
        }
        let cpus = parts.iter().fold(CpuSet::new(), |s, p| s.union(&p.cpus));
        let mems: NodeSet = topo.mems_for_nodes(&topo.nodes_of(&cpus));
        Ok(ClaimGrant {
            uid: self.uid.clone(),
            key,
            parts,
            cpus,
            mems,
        })
    }
}

/// The checkpoint file under `state_dir`.
pub fn file(state_dir: &Path) -> StateFile {
    StateFile::new(state_dir.join(FILE))
}

/// Reads the checkpoint; a file that cannot be read is moved aside and reported (the claims
/// are then prepared again by the kubelet's next call, or lost to the pools).
pub fn load(f: &StateFile) -> Result<Checkpoint, StateFileError> {
    match f.load_as::<Checkpoint>() {
        Ok(c) => Ok(c),
        Err(e) => {
            f.quarantine();
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tap_engine::claim::{ClaimAsk, PartAsk};
    use tap_engine::{Engine, EngineConfig};

    #[test]
    fn a_checkpoint_gives_back_the_claims_it_was_written_from() {
        let raw =
            tap_engine::testdata::discover_fixture("synthetic-2s-4numa-96c-kunpeng920").unwrap();
        let topo = Arc::new(Topology::build(&raw).unwrap());
        let mut e = Engine::new(topo.clone(), EngineConfig::default());
        let device = tap_engine::dra::pool_of(&topo, "numa2").unwrap().id;
        let ask = ClaimAsk {
            uid: "u-1".into(),
            key: ClaimKey {
                namespace: "ns".into(),
                name: "c".into(),
            },
            parts: vec![PartAsk {
                request: "cpus".into(),
                device,
                cpus: 4,
                memory_bytes: 1 << 28,
            }],
        };
        let (g, _) = e.claim(&ask).unwrap();
        let cp = Checkpoint::of(e.claims().cloned(), &topo);
        assert_eq!(cp.claims[0].parts[0].device, "numa2");
        let text = serde_json::to_string(&cp).unwrap();
        let back: Checkpoint = serde_json::from_str(&text).unwrap();
        let (grants, bad) = back.grants(&topo);
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(grants, vec![g]);

        let mut broken = back.clone();
        broken.claims[0].parts[0].device = "numa9".into();
        broken.claims.push(ClaimRecord {
            uid: "u-2".into(),
            namespace: "ns".into(),
            name: "d".into(),
            parts: vec![PartRecord {
                request: "cpus".into(),
                device: "numa0".into(),
                cpus: "90-91".into(),
                memory_bytes: 0,
            }],
        });
        let (grants, bad) = broken.grants(&topo);
        assert!(grants.is_empty());
        let why: Vec<String> = bad.iter().map(|b| b.to_string()).collect();
        assert_eq!(
            why,
            [
                "claim ns/c in the checkpoint: no CPU group numa9",
                "claim ns/d in the checkpoint: cpus 90-91 are not all in numa0"
            ]
        );
    }
}
