//! The DRA driver's tasks: the claims read back at start, the kubelet plugin, and the slice
//! publisher, which also gives back claims the API server no longer has (deleted while the
//! agent was down: the kubelet will not unprepare them).

use super::cdi::CdiDir;
use super::driver::TapDriver;
use super::source::ApiClaims;
use super::{checkpoint, slice, DRIVER};
use crate::agent::Agent;
use crate::kubelet_plugin::{self, PluginPaths, RegistrationState};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Api;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tap_engine::topology::Level;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How often the slice and the booked claims are checked against the API server (reads; a
/// write only when something differs).
const PASS: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub struct DraOptions {
    pub node: String,
    pub level: Level,
    pub kubelet_root: PathBuf,
    pub state_dir: PathBuf,
    /// Where each prepared claim's CDI spec goes; none: no CDI devices.
    pub cdi: Option<CdiDir>,
}

/// Books the claims of the checkpoint on the engine; call before the runtime mode restores the
/// containers. What cannot be booked again is logged (its containers are then placed as any
/// other).
pub fn restore_claims(agent: &Agent, opts: &DraOptions) {
    let f = checkpoint::file(&opts.state_dir);
    let cp = match checkpoint::load(&f) {
        Ok(cp) => cp,
        Err(e) => {
            tracing::error!("DRA claims checkpoint unreadable (moved aside): {e}");
            return;
        }
    };
    let (grants, bad) = cp.grants(agent.topology());
    for b in &bad {
        tracing::error!("{b}");
    }
    let n = grants.len();
    match agent.restore_claims(grants) {
        Ok(refused) => {
            for r in &refused {
                tracing::error!("DRA claim from the checkpoint not booked again: {r}");
            }
            tracing::info!(claims = n - refused.len(), "DRA claims read back");
        }
        Err(e) => tracing::error!("DRA claims from the checkpoint: {e}"),
    }
    // Their containers may start again (a restart of the Pod's container) and name the
    // claim's CDI device: the runtime's folder may have been emptied meanwhile.
    for g in agent.claims() {
        if let Err(e) = super::driver::write_cdi(agent, opts.cdi.as_ref(), &g) {
            tracing::error!("DRA claim {} read back: {e}", g.key);
        }
    }
}

/// Runs the kubelet plugin and the publisher until `shutdown`.
pub async fn run(opts: DraOptions, agent: Arc<Agent>, shutdown: CancellationToken) {
    let Some(client) = connect(&shutdown).await else {
        return;
    };
    let driver = Arc::new(
        TapDriver::new(
            agent.clone(),
            Box::new(ApiClaims(Some(client.clone()))),
            opts.node.clone(),
            checkpoint::file(&opts.state_dir),
        )
        .with_cdi(opts.cdi.clone()),
    );
    let paths = PluginPaths::under_kubelet_root(&opts.kubelet_root, DRIVER);
    let (status, registered) = watch::channel(RegistrationState::Waiting);
    let stop = shutdown.clone();
    let d = driver.clone();
    tokio::spawn(async move {
        if let Err(e) = kubelet_plugin::serve_with_status(DRIVER, &paths, d, stop, status).await {
            tracing::error!("DRA kubelet plugin stopped: {e}");
        }
    });
    publish_loop(&opts, &agent, &driver, client, registered, shutdown).await;
}

async fn connect(shutdown: &CancellationToken) -> Option<kube::Client> {
    loop {
        match crate::kube_link::connect().await {
            Ok(c) => return Some(c),
            Err(e) => {
                tracing::warn!("DRA driver: no API server configuration yet: {e}; retrying in 10s");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(10)) => {}
                    _ = shutdown.cancelled() => return None,
                }
            }
        }
    }
}

/// Each pass (and at once when the kubelet registers the plugin or the configuration changes:
/// reserved CPUs change the devices): the slice, then the claims.
async fn publish_loop(
    opts: &DraOptions,
    agent: &Agent,
    driver: &TapDriver,
    client: kube::Client,
    mut registered: watch::Receiver<RegistrationState>,
    shutdown: CancellationToken,
) {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    loop {
        publish_once(&slices, &opts.node, opts.level, agent).await;
        release_deleted_claims(agent, driver, &client).await;
        tokio::select! {
            _ = tokio::time::sleep(PASS) => {}
            _ = agent.config_changed() => {}
            r = registered.changed() => if r.is_err() { return },
            _ = shutdown.cancelled() => return,
        }
    }
}

/// The node's slice made to say what the agent offers now (a write only when it differs).
async fn publish_once(slices: &Api<ResourceSlice>, node: &str, level: Level, agent: &Agent) {
    let devices = agent.dra_devices(level);
    match slice::publish(slices, node, &devices).await {
        Ok(slice::Published::Unchanged) => {}
        Ok(done) => tracing::info!(node, devices = devices.len(), "DRA ResourceSlice {done:?}"),
        Err(e) => tracing::warn!(node, "DRA ResourceSlice not written: {e}"),
    }
}

/// The slice publisher alone, without the kubelet plugin (how tap-kube-scale measures its
/// writes across many simulated nodes): each pass and each configuration change.
pub async fn publish_slices(
    node: String,
    level: Level,
    agent: Arc<Agent>,
    client: kube::Client,
    shutdown: CancellationToken,
) {
    let slices: Api<ResourceSlice> = Api::all(client);
    loop {
        publish_once(&slices, &node, level, &agent).await;
        tokio::select! {
            _ = tokio::time::sleep(PASS) => {}
            _ = agent.config_changed() => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// Gives back each booked claim the API server no longer has under its uid.
async fn release_deleted_claims(agent: &Agent, driver: &TapDriver, client: &kube::Client) {
    for g in agent.claims() {
        let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &g.key.namespace);
        let gone = match api.get_opt(&g.key.name).await {
            Ok(None) => true,
            Ok(Some(rc)) => rc.metadata.uid.as_deref() != Some(g.uid.as_str()),
            Err(e) => {
                tracing::debug!(claim = %g.key, "DRA claim not read: {e}");
                false
            }
        };
        if gone {
            tracing::info!(claim = %g.key, uid = %g.uid, "DRA claim deleted from the API server: its CPUs go back");
            driver.forget(&g.uid).await;
        }
    }
}
