//! What a container learns of its claim: a CDI device per prepared claim. The driver writes
//! one CDI spec file per claim (`<dir>/dra.tap.kunpeng.io-<uid>.json`) before it answers the
//! kubelet, and names its device in the answer; the runtime (containerd with CDI on: the
//! default from 2.0, `enable_cdi = true` in 1.7) then sets the container's environment:
//!
//! - `TAP_DRA_CPUS`: the claim's CPUs, as the container's cgroup holds them (kernel list syntax);
//! - `TAP_DRA_MEMS`: its memory nodes;
//! - `TAP_DRA_CLAIM`: `<namespace>/<name>` of the claim.
//!
//! The cpuset itself is set by the agent's NRI plugin, not by CDI: these are for a program that
//! wants to know its CPUs without reading its cgroup (a DPDK core list, a thread pinning). A
//! container with two claims of this driver gets both in its cpuset; its variables name one.

use std::path::{Path, PathBuf};
use tap_engine::claim::ClaimGrant;
use tap_engine::{CpuSet, NodeSet};

/// The CDI kind of the claims' devices; a device is named by its claim's uid.
pub const KIND: &str = "dra.tap.kunpeng.io/claim";
/// The CDI specification version the files declare (environment edits exist since 0.3.0).
pub const CDI_VERSION: &str = "0.5.0";

#[derive(Debug, thiserror::Error)]
#[error("writing the CDI spec {path}: {source}")]
pub struct CdiError {
    path: PathBuf,
    source: std::io::Error,
}

/// The CDI spec folder the runtime reads (`--dra-cdi-dir`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdiDir(pub PathBuf);

impl CdiDir {
    /// The fully qualified CDI device name of claim `uid`.
    pub fn device_id(uid: &str) -> String {
        format!("{KIND}={uid}")
    }

    fn file(&self, uid: &str) -> PathBuf {
        self.0.join(format!("dra.tap.kunpeng.io-{uid}.json"))
    }

    /// Writes claim `g`'s spec (replacing an older one); `cpus` and `mems` as the host names
    /// them. The runtime never sees half a file: it is written aside and renamed.
    pub fn write(&self, g: &ClaimGrant, cpus: &CpuSet, mems: &NodeSet) -> Result<(), CdiError> {
        let path = self.file(&g.uid);
        let err = |source| CdiError {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(&self.0).map_err(err)?;
        let body = serde_json::to_vec_pretty(&spec(g, cpus, mems)).map_err(|e| err(e.into()))?;
        let tmp = self.0.join(format!(".dra.tap.kunpeng.io-{}.tmp", g.uid));
        std::fs::write(&tmp, body).map_err(err)?;
        std::fs::rename(&tmp, &path).map_err(err)
    }

    /// Removes claim `uid`'s spec; a missing one is fine (unprepare is repeated).
    pub fn remove(&self, uid: &str) {
        let path = self.file(uid);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("removing the CDI spec {}: {e}", path.display()),
        }
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

/// The CDI spec of one claim: one device, named by the claim's uid, setting three variables.
pub fn spec(g: &ClaimGrant, cpus: &CpuSet, mems: &NodeSet) -> serde_json::Value {
    serde_json::json!({
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "devices": [{
            "name": g.uid,
            "containerEdits": {
                "env": [
                    format!("TAP_DRA_CPUS={cpus}"),
                    format!("TAP_DRA_MEMS={mems}"),
                    format!("TAP_DRA_CLAIM={}", g.key),
                ]
            }
        }]
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tap_engine::claim::ClaimKey;

    fn grant() -> ClaimGrant {
        ClaimGrant {
            uid: "0b5c-uid".into(),
            key: ClaimKey {
                namespace: "ns".into(),
                name: "cpus".into(),
            },
            parts: Vec::new(),
            cpus: CpuSet::parse("72-75").expect("cpus"),
            mems: NodeSet::parse("3").expect("mems"),
        }
    }

    #[test]
    fn the_spec_names_the_claim_and_sets_its_cpus_and_mems() {
        let g = grant();
        let s = spec(
            &g,
            &CpuSet::parse("1").expect("cpus"),
            &NodeSet::parse("0").expect("mems"),
        );
        assert_eq!(s["kind"], "dra.tap.kunpeng.io/claim");
        assert_eq!(s["devices"][0]["name"], "0b5c-uid");
        let env = &s["devices"][0]["containerEdits"]["env"];
        assert_eq!(
            env,
            &serde_json::json!(["TAP_DRA_CPUS=1", "TAP_DRA_MEMS=0", "TAP_DRA_CLAIM=ns/cpus"])
        );
        assert_eq!(
            CdiDir::device_id(&g.uid),
            "dra.tap.kunpeng.io/claim=0b5c-uid"
        );
    }

    #[test]
    fn write_replaces_and_remove_forgets_the_file() {
        let dir = std::env::temp_dir().join(format!("tap-cdi-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cdi = CdiDir(dir.clone());
        let g = grant();
        cdi.write(&g, &g.cpus, &g.mems).expect("written");
        cdi.write(&g, &g.cpus, &g.mems).expect("written again");
        let files: Vec<_> = std::fs::read_dir(&dir)
            .expect("dir")
            .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
            .collect();
        assert_eq!(files, ["dra.tap.kunpeng.io-0b5c-uid.json"]);
        let back: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join(&files[0])).expect("read"))
                .expect("json");
        assert_eq!(back, spec(&g, &g.cpus, &g.mems));
        cdi.remove(&g.uid);
        cdi.remove(&g.uid);
        assert_eq!(std::fs::read_dir(&dir).expect("dir").count(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
