//! A DRA kubelet plugin: the two Unix sockets a Dynamic Resource Allocation driver serves on a
//! node. The registration socket (`<registry_dir>/<driver>-reg.sock`) answers the kubelet's
//! plugin watcher (`pluginregistration.Registration`: GetInfo, NotifyRegistrationStatus); the
//! DRA socket (`<plugin_dir>/dra.sock`) serves `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`
//! (NodePrepareResources, NodeUnprepareResources), whose claims are handed to a [`DraDriver`].
//!
//! The plugin advertises the one service `v1.DRAPlugin` in `supported_versions`, the newest the
//! 1.37 kubelet knows (it also takes `v1beta1.DRAPlugin`). The resource health service
//! (`v1.DRAResourceHealth`) is optional for the kubelet: one not advertised is never called, so
//! it is not served.
//!
//! The kubelet's plugin watcher dials the registration socket by its bare path, and grpc-go then
//! sends that path as the HTTP/2 `:authority`, which h2's server (tonic's) refuses: the
//! registration socket is served by a small unary gRPC server on h2's frame codec instead
//! (`lenient`). The kubelet's DRA client dials `unix:<path>` (authority `localhost`), so the DRA
//! socket is tonic's.
//!
//! Each claim of a call is prepared (or unprepared) on its own task: a claim's failure, even a
//! driver's panic, becomes that claim's `error` in the response (the kubelet retries it) and the
//! other claims are answered as the driver answered them.

pub mod client;
mod lenient;
pub mod proto;
mod registration;
mod server;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// `PluginInfo.type` of a DRA plugin.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The DRA gRPC service the plugin advertises, as the kubelet names it in `supported_versions`.
pub const DRA_SERVICE_V1: &str = "v1.DRAPlugin";
/// The DRA socket's file name in [`PluginPaths::plugin_dir`].
pub const DRA_SOCKET: &str = "dra.sock";

/// The kubelet's default directories, under its default `--root-dir`.
pub const KUBELET_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
pub const KUBELET_PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";

/// A ResourceClaim the kubelet asks to prepare or unprepare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef {
    pub namespace: String,
    pub uid: String,
    pub name: String,
}

/// One device of a prepared claim, as the claim's allocation names it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PreparedDevice {
    /// The claim's requests this device satisfies.
    pub requests: Vec<String>,
    pub pool: String,
    pub device: String,
    /// Fully qualified CDI device names (`vendor.com/class=name`) the runtime injects.
    pub cdi_device_ids: Vec<String>,
}

/// What a DRA driver does with the claims the kubelet hands it. Both calls must be idempotent:
/// the kubelet repeats them after its own restart and after an error.
#[async_trait::async_trait]
pub trait DraDriver: Send + Sync + 'static {
    type Error: std::error::Error + Send + Sync + 'static;
    async fn prepare(&self, claim: &ClaimRef) -> Result<Vec<PreparedDevice>, Self::Error>;
    async fn unprepare(&self, claim: &ClaimRef) -> Result<(), Self::Error>;
}

/// Where the plugin's sockets go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginPaths {
    /// The kubelet's plugin registry (`<root-dir>/plugins_registry`).
    pub registry_dir: PathBuf,
    /// The driver's own directory (`<root-dir>/plugins/<driver>`).
    pub plugin_dir: PathBuf,
}

impl PluginPaths {
    /// The directories of a kubelet whose `--root-dir` is `root`.
    pub fn under_kubelet_root(root: &Path, driver_name: &str) -> PluginPaths {
        PluginPaths {
            registry_dir: root.join("plugins_registry"),
            plugin_dir: root.join("plugins").join(driver_name),
        }
    }

    /// `<registry_dir>/<driver>-reg.sock`.
    pub fn registration_socket(&self, driver_name: &str) -> PathBuf {
        self.registry_dir.join(format!("{driver_name}-reg.sock"))
    }

    /// `<plugin_dir>/dra.sock`.
    pub fn dra_socket(&self) -> PathBuf {
        self.plugin_dir.join(DRA_SOCKET)
    }
}

/// What the kubelet last said about the plugin's registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistrationState {
    /// Not told yet.
    Waiting,
    Registered,
    /// The kubelet refused the plugin, with its reason.
    Refused(String),
}

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("the DRA driver name {0:?} is not a DNS subdomain")]
    BadDriverName(String),
    #[error("creating {path}: {source}")]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("listening on {path}: {source}")]
    Listen {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("serving {path}: {source}")]
    Serve {
        path: PathBuf,
        source: tonic::transport::Error,
    },
}

/// Serves the plugin of `driver_name` until `stop` is cancelled, then removes its sockets.
pub async fn serve<D: DraDriver>(
    driver_name: &str,
    paths: &PluginPaths,
    driver: Arc<D>,
    stop: CancellationToken,
) -> Result<(), PluginError> {
    let (status, _) = watch::channel(RegistrationState::Waiting);
    serve_with_status(driver_name, paths, driver, stop, status).await
}

/// [`serve`], publishing what the kubelet says about the registration on `status`.
pub async fn serve_with_status<D: DraDriver>(
    driver_name: &str,
    paths: &PluginPaths,
    driver: Arc<D>,
    stop: CancellationToken,
    status: watch::Sender<RegistrationState>,
) -> Result<(), PluginError> {
    if !is_dns_subdomain(driver_name) {
        return Err(PluginError::BadDriverName(driver_name.to_string()));
    }
    let dra_path = paths.dra_socket();
    let reg_path = paths.registration_socket(driver_name);
    // The DRA socket listens before the kubelet can learn of it from the registration socket.
    let dra = listen(&dra_path)?;
    let reg = match listen(&reg_path) {
        Ok(l) => l,
        Err(e) => {
            remove_socket(&dra_path);
            return Err(e);
        }
    };
    let info = proto::PluginInfo {
        r#type: PLUGIN_TYPE.to_string(),
        name: driver_name.to_string(),
        endpoint: dra_path.display().to_string(),
        supported_versions: vec![DRA_SERVICE_V1.to_string()],
    };
    let both = stop.child_token();
    let registration = registration::RegistrationService::new(info, status);
    let reg_served = lenient::serve(reg, registration, both.clone());
    let dra_served = async {
        let r = server::serve(dra, server::DraService::new(driver), both.clone()).await;
        // The registration socket is no use without the DRA socket.
        both.cancel();
        r
    };
    let (d, ()) = tokio::join!(dra_served, reg_served);
    // The registration socket goes first: the kubelet deregisters the plugin when it goes.
    remove_socket(&reg_path);
    remove_socket(&dra_path);
    d.map_err(|source| PluginError::Serve {
        path: dra_path,
        source,
    })
}

/// Binds a Unix socket at `path`, creating its directory and replacing a stale socket.
fn listen(path: &Path) -> Result<UnixListener, PluginError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| PluginError::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    remove_socket(path);
    UnixListener::bind(path).map_err(|source| PluginError::Listen {
        path: path.to_path_buf(),
        source,
    })
}

/// Removes `path` if it is a socket (nothing else is ours to delete).
fn remove_socket(path: &Path) {
    use std::os::unix::fs::FileTypeExt;
    let is_socket = std::fs::symlink_metadata(path)
        .map(|m| m.file_type().is_socket())
        .unwrap_or(false);
    if is_socket {
        if let Err(e) = std::fs::remove_file(path) {
            tracing::warn!(path = %path.display(), error = %e, "removing a DRA plugin socket");
        }
    }
}

/// A DRA driver name: a DNS subdomain (lower-case alphanumerics, `-` and `.`, at most 253
/// characters, alphanumeric at both ends), which is also safe in a file name.
fn is_dns_subdomain(name: &str) -> bool {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    name.len() <= 253
        && name.chars().all(ok_char)
        && alnum(name.chars().next())
        && alnum(name.chars().last())
        && !name.contains("..")
}
