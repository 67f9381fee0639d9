//! NodeTopology watch and status.

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
    anyhow::bail!("NodeTopology watch and status is not implemented yet")
}
