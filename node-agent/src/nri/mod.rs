//! NRI plugin mode.

mod proto;

use crate::agent::Agent;
use crate::flags::Flags;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Runs until `shutdown` is cancelled.
pub async fn run(
    _flags: &Flags,
    _agent: Arc<Agent>,
    _shutdown: CancellationToken,
) -> anyhow::Result<()> {
    anyhow::bail!("NRI plugin mode is not implemented yet")
}
