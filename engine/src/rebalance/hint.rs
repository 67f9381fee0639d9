//! The usage hint measured from a round of samples, as the rebalancer counts usage (the hint
//! itself, and how the engine keeps it current: [`crate::usage_hint`]).

use super::nodes::Nodes;
use super::{BalanceBy, UsageSample};
use crate::state::StateView;
use crate::usage_hint::{counted, UsageHint};

impl UsageHint {
    /// The hint from one round of samples: each node's usage as the rebalancer counts it
    /// (shared grants on the pools; a grant over several nodes in proportion to its CPUs).
    pub fn measure(view: &StateView<'_>, usage: &[UsageSample]) -> UsageHint {
        let node = Nodes::measure(view, usage, BalanceBy::Usage).usage;
        let of = usage
            .iter()
            .filter(|s| view.grant(&s.id).is_some_and(counted))
            .map(|s| (s.id.clone(), s.usage_milli))
            .collect();
        UsageHint::new(node, of)
    }
}
