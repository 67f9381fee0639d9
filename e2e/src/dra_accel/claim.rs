//! A claim's allocation as the API server holds it: the devices of this driver in
//! `status.allocation.devices.results`.

use super::DRIVER;
use node_agent::kubelet_plugin::{ClaimRef, PreparedDevice};
use serde_json::Value;
use std::path::Path;

/// Why a claim cannot be prepared (the kubelet gets the text and retries).
#[derive(Debug)]
pub enum AccelError {
    Kubectl(String),
    /// The claim of that name is another one than the kubelet asked for.
    OtherUid {
        asked: String,
        found: String,
    },
    NotAllocated,
    NoDeviceOfOurs,
}

impl std::fmt::Display for AccelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AccelError::Kubectl(e) => write!(f, "reading the claim: {e}"),
            AccelError::OtherUid { asked, found } => {
                write!(f, "the claim's UID is {found}, not {asked}")
            }
            AccelError::NotAllocated => write!(f, "the claim is not allocated"),
            AccelError::NoDeviceOfOurs => write!(f, "no device of {DRIVER} is allocated"),
        }
    }
}

impl std::error::Error for AccelError {}

/// `kubectl get resourceclaim` of `claim`, parsed.
pub(super) async fn fetch(kubeconfig: &Path, claim: &ClaimRef) -> Result<Value, AccelError> {
    let out = tokio::process::Command::new(crate::kube::kubectl_bin())
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(["--request-timeout=10s", "-n", &claim.namespace])
        .args(["get", "resourceclaim", &claim.name, "-o", "json"])
        .output()
        .await
        .map_err(|e| AccelError::Kubectl(e.to_string()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(AccelError::Kubectl(err));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| AccelError::Kubectl(e.to_string()))
}

/// The devices of this driver the claim `object` was allocated, checked to be the claim the
/// kubelet asked for.
pub fn allocated_devices(
    object: &Value,
    claim: &ClaimRef,
) -> Result<Vec<PreparedDevice>, AccelError> {
    let found = object["metadata"]["uid"].as_str().unwrap_or_default();
    if found != claim.uid {
        return Err(AccelError::OtherUid {
            asked: claim.uid.clone(),
            found: found.to_string(),
        });
    }
    let results = object["status"]["allocation"]["devices"]["results"]
        .as_array()
        .ok_or(AccelError::NotAllocated)?;
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let ours: Vec<PreparedDevice> = results
        .iter()
        .filter(|r| r["driver"] == DRIVER)
        .map(|r| PreparedDevice {
            requests: vec![text(&r["request"])],
            pool: text(&r["pool"]),
            device: text(&r["device"]),
            cdi_device_ids: Vec::new(),
        })
        .collect();
    if ours.is_empty() {
        return Err(AccelError::NoDeviceOfOurs);
    }
    Ok(ours)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim() -> ClaimRef {
        ClaimRef {
            namespace: "default".into(),
            uid: "u-1".into(),
            name: "pod-accel-x".into(),
        }
    }

    fn object(uid: &str, results: Value) -> Value {
        json!({"metadata": {"uid": uid}, "status": {"allocation": {"devices": {"results": results}}}})
    }

    #[test]
    fn the_devices_of_this_driver_only() {
        let o = object(
            "u-1",
            json!([
                {"request": "accel", "driver": DRIVER, "pool": "node-a", "device": "accel-1"},
                {"request": "nic", "driver": "nic.example.com", "pool": "node-a", "device": "nic-0"}
            ]),
        );
        let got = allocated_devices(&o, &claim()).expect("devices");
        assert_eq!(
            got,
            [PreparedDevice {
                requests: vec!["accel".into()],
                pool: "node-a".into(),
                device: "accel-1".into(),
                cdi_device_ids: Vec::new(),
            }]
        );
    }

    #[test]
    fn another_claim_or_no_allocation_is_an_error() {
        let one = json!([{"request": "a", "driver": DRIVER, "pool": "p", "device": "d"}]);
        let e = allocated_devices(&object("u-2", one.clone()), &claim());
        assert!(matches!(e, Err(AccelError::OtherUid { .. })), "{e:?}");
        let e = allocated_devices(&json!({"metadata": {"uid": "u-1"}}), &claim());
        assert!(matches!(e, Err(AccelError::NotAllocated)), "{e:?}");
        let other =
            json!([{"request": "a", "driver": "x.example.com", "pool": "p", "device": "d"}]);
        let e = allocated_devices(&object("u-1", other), &claim());
        assert!(matches!(e, Err(AccelError::NoDeviceOfOurs)), "{e:?}");
    }
}
