//! The kubelet's calls for this driver's claims: prepare reads the claim from the API server,
//! checks it ([`super::ask`]) and books it on the engine; unprepare gives its CPUs back. Both
//! are idempotent (the kubelet retries), serialised, and end with the checkpoint written: a
//! claim whose booking cannot be saved is released again and its prepare fails, so a restart
//! never finds a container on CPUs no record holds.

use super::{ask, checkpoint, PrepareError, DRIVER};
use crate::agent::claims::BookError;
use crate::agent::Agent;
use crate::hook::Hook;
use crate::kubelet_plugin::{ClaimRef, DraDriver, PreparedDevice};
use crate::ledger::state_file::StateFile;
use crate::metrics::ErrorKind;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use std::sync::Arc;
use tap_engine::claim::ClaimGrant;

pub struct TapDriver {
    agent: Arc<Agent>,
    client: Option<kube::Client>,
    /// This node's name: the pool of the node's slice.
    node: String,
    checkpoint: StateFile,
    /// One call at a time: a booking and its checkpoint go together.
    serial: tokio::sync::Mutex<()>,
}

impl TapDriver {
    pub fn new(
        agent: Arc<Agent>,
        client: Option<kube::Client>,
        node: String,
        checkpoint: StateFile,
    ) -> TapDriver {
        TapDriver {
            agent,
            client,
            node,
            checkpoint,
            serial: tokio::sync::Mutex::new(()),
        }
    }

    /// Writes every booked claim to the checkpoint.
    fn save(&self) -> Result<(), PrepareError> {
        let cp = checkpoint::Checkpoint::of(self.agent.claims().into_iter(), self.agent.topology());
        self.checkpoint
            .save_as(&cp)
            .map_err(PrepareError::Checkpoint)
    }

    async fn read_claim(&self, claim: &ClaimRef) -> Result<ResourceClaim, PrepareError> {
        let client = self.client.clone().ok_or(PrepareError::NoApiServer)?;
        let api: Api<ResourceClaim> = Api::namespaced(client, &claim.namespace);
        api.get(&claim.name).await.map_err(PrepareError::Api)
    }

    async fn prepare_once(&self, claim: &ClaimRef) -> Result<Vec<PreparedDevice>, PrepareError> {
        let _one = self.serial.lock().await;
        if let Some(g) = self.agent.claim_of(&claim.uid) {
            return Ok(self.prepared(&g));
        }
        let rc = self.read_claim(claim).await?;
        let asked = ask::ask_of(&rc, claim, &self.node, self.agent.topology())?;
        let g = self.agent.book_claim(&asked).map_err(|e| match e {
            BookError::Refused(r) => PrepareError::Engine(r),
            BookError::Failed(_) => PrepareError::EngineFailed,
        })?;
        if let Err(e) = self.save() {
            let _ = self.agent.release_claim(&claim.uid);
            return Err(e);
        }
        Ok(self.prepared(&g))
    }

    async fn unprepare_once(&self, claim: &ClaimRef) -> Result<(), PrepareError> {
        let _one = self.serial.lock().await;
        if self.agent.claim_of(&claim.uid).is_none() {
            return Ok(());
        }
        self.agent
            .release_claim(&claim.uid)
            .map_err(|_| PrepareError::EngineFailed)?;
        self.save()
    }

    /// Gives back claim `uid` without a call of the kubelet (the API server no longer has it).
    pub async fn forget(&self, uid: &str) {
        let _one = self.serial.lock().await;
        if self.agent.release_claim(uid).is_ok() {
            if let Err(e) = self.save() {
                tracing::error!("{e}");
            }
        }
    }

    /// The devices of a booked claim as the kubelet records them.
    fn prepared(&self, g: &ClaimGrant) -> Vec<PreparedDevice> {
        let topo = self.agent.topology();
        g.parts
            .iter()
            .map(|p| PreparedDevice {
                requests: vec![p.request.clone()],
                pool: self.node.clone(),
                device: tap_engine::dra::device_name(topo, p.device),
                cdi_device_ids: Vec::new(),
            })
            .collect()
    }

    fn failed(&self, hook: Hook, claim: &ClaimRef, e: &PrepareError) {
        tracing::warn!(driver = DRIVER, claim = %format!("{}/{}", claim.namespace, claim.name), uid = %claim.uid, hook = hook.as_str(), "DRA claim refused: {e}");
        self.agent.metrics().count_error(hook, ErrorKind::Claim);
    }
}

#[async_trait::async_trait]
impl DraDriver for TapDriver {
    type Error = PrepareError;

    async fn prepare(&self, claim: &ClaimRef) -> Result<Vec<PreparedDevice>, PrepareError> {
        let start = std::time::Instant::now();
        let out = self.prepare_once(claim).await;
        match &out {
            Ok(devices) => tracing::info!(
                claim = %format!("{}/{}", claim.namespace, claim.name),
                uid = %claim.uid,
                devices = devices.len(),
                elapsed_us = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX),
                "DRA claim prepared"
            ),
            Err(e) => self.failed(Hook::Prepare, claim, e),
        }
        out
    }

    async fn unprepare(&self, claim: &ClaimRef) -> Result<(), PrepareError> {
        let out = self.unprepare_once(claim).await;
        match &out {
            Ok(()) => tracing::info!(
                claim = %format!("{}/{}", claim.namespace, claim.name),
                uid = %claim.uid,
                "DRA claim unprepared"
            ),
            Err(e) => self.failed(Hook::Unprepare, claim, e),
        }
        out
    }
}
