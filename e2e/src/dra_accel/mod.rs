//! A small DRA driver for the cluster tier: `accel.example.com`, the Dynamic Resource Allocation
//! twin of the `example.com/accel` device plugin. Its node's ResourceSlice names each device's
//! NUMA node with the standard attribute `resource.kubernetes.io/numaNode`; the kube-scheduler
//! allocates claims of the DeviceClass `accel.example.com` from it; its kubelet plugin (the
//! agent's `node_agent::kubelet_plugin`) registers with the real kubelet and prepares each claim
//! by reading its allocation from the API server and answering with the allocated devices, so
//! that the kubelet's pod-resources API lists them for the container. No CDI devices: the
//! kubelet does not require them.

mod claim;

pub use claim::{allocated_devices, AccelError};

use anyhow::{bail, Context, Result};
use node_agent::kubelet_plugin::{
    serve_with_status, ClaimRef, DraDriver, PluginPaths, PreparedDevice, RegistrationState,
};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The driver's name, and the name of its DeviceClass.
pub const DRIVER: &str = "accel.example.com";

/// One published device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraDevice {
    pub name: String,
    pub numa_node: u32,
}

/// The name of the node's one ResourceSlice.
pub fn slice_name(node: &str) -> String {
    format!("{node}-{DRIVER}")
}

/// The node's one ResourceSlice: a pool named after the node, generation 1.
pub fn resource_slice(node: &str, devices: &[DraDevice]) -> Value {
    let devices: Vec<Value> = devices
        .iter()
        .map(|d| {
            json!({
                "name": d.name,
                "attributes": {"resource.kubernetes.io/numaNode": {"int": d.numa_node}},
            })
        })
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node)},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    })
}

/// The DeviceClass `accel.example.com`: every device of the driver.
pub fn device_class() -> Value {
    device_class_of(DRIVER)
}

/// A DeviceClass named after `driver` that selects every device of it.
pub fn device_class_of(driver: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": driver},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{driver}\"")}}]},
    })
}

/// What the kubelet asked of the driver.
#[derive(Debug, Default)]
struct Calls {
    prepared: Vec<(ClaimRef, Vec<PreparedDevice>)>,
    unprepared: Vec<ClaimRef>,
}

struct Driver {
    kubeconfig: PathBuf,
    calls: Mutex<Calls>,
}

impl Driver {
    fn calls(&self) -> std::sync::MutexGuard<'_, Calls> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait::async_trait]
impl DraDriver for Driver {
    type Error = AccelError;

    async fn prepare(&self, claim: &ClaimRef) -> Result<Vec<PreparedDevice>, AccelError> {
        let object = claim::fetch(&self.kubeconfig, claim).await?;
        let devices = allocated_devices(&object, claim)?;
        self.calls().prepared.push((claim.clone(), devices.clone()));
        Ok(devices)
    }

    async fn unprepare(&self, claim: &ClaimRef) -> Result<(), AccelError> {
        self.calls().unprepared.push(claim.clone());
        Ok(())
    }
}

/// The running kubelet plugin: stopped (its sockets removed) on drop.
pub struct DraAccel {
    driver: Arc<Driver>,
    status: watch::Receiver<RegistrationState>,
    stop: CancellationToken,
}

impl DraAccel {
    /// Serves the plugin on `rt` for the kubelet whose `--root-dir` is `kubelet_root`; claims are
    /// read with the admin `kubeconfig`.
    pub fn start(rt: &tokio::runtime::Runtime, kubelet_root: &Path, kubeconfig: &Path) -> DraAccel {
        let driver = Arc::new(Driver {
            kubeconfig: kubeconfig.to_path_buf(),
            calls: Mutex::default(),
        });
        let (tx, status) = watch::channel(RegistrationState::Waiting);
        let stop = CancellationToken::new();
        let paths = PluginPaths::under_kubelet_root(kubelet_root, DRIVER);
        let (d, s) = (driver.clone(), stop.clone());
        rt.spawn(async move {
            if let Err(e) = serve_with_status(DRIVER, &paths, d, s, tx).await {
                eprintln!("{DRIVER} kubelet plugin: {e}");
            }
        });
        DraAccel {
            driver,
            status,
            stop,
        }
    }

    /// Waits until the kubelet has registered the plugin; fails at once if it refused it.
    pub fn wait_registered(&self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            match &*self.status.borrow() {
                RegistrationState::Registered => return Ok(()),
                RegistrationState::Refused(e) => bail!("the kubelet refused {DRIVER}: {e}"),
                RegistrationState::Waiting => {}
            }
            if start.elapsed() > timeout {
                bail!("the kubelet did not register {DRIVER} within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The claims prepared so far and the devices each was answered with.
    pub fn prepared(&self) -> Vec<(ClaimRef, Vec<PreparedDevice>)> {
        self.driver.calls().prepared.clone()
    }

    /// The claims unprepared so far.
    pub fn unprepared(&self) -> Vec<ClaimRef> {
        self.driver.calls().unprepared.clone()
    }

    /// The UID of claim `namespace/name` as the kubelet handed it over (prepared), if it was.
    pub fn prepared_uid(&self, namespace: &str, name: &str) -> Result<String> {
        self.prepared()
            .into_iter()
            .find(|(c, _)| c.namespace == namespace && c.name == name)
            .map(|(c, _)| c.uid)
            .with_context(|| format!("claim {namespace}/{name} was not prepared"))
    }
}

impl Drop for DraAccel {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
