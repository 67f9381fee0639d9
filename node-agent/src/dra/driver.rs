//! The kubelet's calls for this driver's claims: prepare reads the claim from the API server,
//! checks it ([`super::ask`]) and books it on the engine; unprepare gives its CPUs back. Both
//! are idempotent (the kubelet retries), serialised, and end with the checkpoint written: a
//! claim whose booking cannot be saved is released again and its prepare fails, so a restart
//! never finds a container on CPUs no record holds. With a CDI folder, each booked claim also
//! has its CDI spec ([`super::cdi`]) before the kubelet hears of it.

use super::cdi::CdiDir;
use super::source::ClaimSource;
use super::{ask, checkpoint, PrepareError, DRIVER};
use crate::agent::claims::BookError;
use crate::agent::Agent;
use crate::hook::Hook;
use crate::kubelet_plugin::{ClaimRef, DraDriver, PreparedDevice};
use crate::ledger::state_file::StateFile;
use crate::metrics::ErrorKind;
use std::sync::Arc;
use tap_engine::claim::ClaimGrant;

pub struct TapDriver {
    agent: Arc<Agent>,
    claims: Box<dyn ClaimSource>,
    /// This node's name: the pool of the node's slice.
    node: String,
    checkpoint: StateFile,
    cdi: Option<CdiDir>,
    /// One call at a time: a booking and its checkpoint go together.
    serial: tokio::sync::Mutex<()>,
}

impl TapDriver {
    pub fn new(
        agent: Arc<Agent>,
        claims: Box<dyn ClaimSource>,
        node: String,
        checkpoint: StateFile,
    ) -> TapDriver {
        TapDriver {
            agent,
            claims,
            node,
            checkpoint,
            cdi: None,
            serial: tokio::sync::Mutex::new(()),
        }
    }

    /// Gives each prepared claim a CDI device in `cdi`.
    pub fn with_cdi(mut self, cdi: Option<CdiDir>) -> TapDriver {
        self.cdi = cdi;
        self
    }

    /// Writes every booked claim to the checkpoint.
    fn save(&self) -> Result<(), PrepareError> {
        let cp = checkpoint::Checkpoint::of(self.agent.claims().into_iter(), self.agent.topology());
        self.checkpoint
            .save_as(&cp)
            .map_err(PrepareError::Checkpoint)
    }

    async fn prepare_once(&self, claim: &ClaimRef) -> Result<Vec<PreparedDevice>, PrepareError> {
        let _one = self.serial.lock().await;
        if let Some(g) = self.agent.claim_of(&claim.uid) {
            // Repeated: the spec is written again (the runtime's folder may have been emptied).
            write_cdi(&self.agent, self.cdi.as_ref(), &g)?;
            return Ok(self.prepared(&g));
        }
        let rc = self.claims.claim(claim).await?;
        let asked = ask::ask_of(&rc, claim, &self.node, self.agent.topology())?;
        let g = self.agent.book_claim(&asked).map_err(|e| match e {
            BookError::Refused(r) => PrepareError::Engine(r),
            BookError::Failed(_) => PrepareError::EngineFailed,
        })?;
        if let Err(e) = self.save() {
            let _ = self.agent.release_claim(&claim.uid);
            return Err(e);
        }
        if let Err(e) = write_cdi(&self.agent, self.cdi.as_ref(), &g) {
            // No container may name a device the runtime cannot find: the claim goes back.
            let _ = self.agent.release_claim(&claim.uid);
            self.save()?;
            return Err(e);
        }
        Ok(self.prepared(&g))
    }

    async fn unprepare_once(&self, claim: &ClaimRef) -> Result<(), PrepareError> {
        let _one = self.serial.lock().await;
        if let Some(cdi) = &self.cdi {
            cdi.remove(&claim.uid);
        }
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
        if let Some(cdi) = &self.cdi {
            cdi.remove(uid);
        }
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
                cdi_device_ids: match self.cdi {
                    Some(_) => vec![CdiDir::device_id(&g.uid)],
                    None => Vec::new(),
                },
            })
            .collect()
    }

    fn failed(&self, hook: Hook, claim: &ClaimRef, e: &PrepareError) {
        tracing::warn!(driver = DRIVER, claim = %format!("{}/{}", claim.namespace, claim.name), uid = %claim.uid, hook = hook.as_str(), "DRA claim refused: {e}");
        self.agent.metrics().count_error(hook, ErrorKind::Claim);
    }
}

/// Writes booked claim `g`'s CDI spec, its CPUs and memory nodes as the host names them.
pub fn write_cdi(agent: &Agent, cdi: Option<&CdiDir>, g: &ClaimGrant) -> Result<(), PrepareError> {
    let Some(cdi) = cdi else {
        return Ok(());
    };
    let (cpus, mems) = (agent.fold_cpus(&g.cpus), agent.fold_nodes(&g.mems));
    cdi.write(g, &cpus, &mems)?;
    Ok(())
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

#[cfg(test)]
mod tests;
