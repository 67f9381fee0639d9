//! Which runtime call or agent task a decision, a log span or a metric belongs to (the
//! `hook` label of `tap_errors_total` and `tap_hook_request_duration_seconds`).

use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hook {
    /// A container created (and, for NRI, started).
    Create,
    /// A container's resources changed (a resize).
    Update,
    /// A container started (the CRI proxy holds its writes meanwhile).
    Start,
    /// A container stopped.
    Stop,
    /// A container removed (CRI, NRI).
    Remove,
    /// A container deleted (Docker).
    Delete,
    /// The state rebuilt from the runtime's list.
    Sync,
    /// A refused resize undone.
    Rollback,
    /// A rebalancing round.
    Rebalance,
    /// A DRA claim prepared for the kubelet (its CPUs booked).
    Prepare,
    /// A DRA claim unprepared (its CPUs given back).
    Unprepare,
}

impl Hook {
    /// The label value, as the metrics and logs print it.
    pub fn as_str(self) -> &'static str {
        match self {
            Hook::Create => "create",
            Hook::Update => "update",
            Hook::Start => "start",
            Hook::Stop => "stop",
            Hook::Remove => "remove",
            Hook::Delete => "delete",
            Hook::Sync => "sync",
            Hook::Rollback => "rollback",
            Hook::Rebalance => "rebalance",
            Hook::Prepare => "prepare",
            Hook::Unprepare => "unprepare",
        }
    }
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl EncodeLabelValue for Hook {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), fmt::Error> {
        fmt::Write::write_str(encoder, self.as_str())
    }
}
