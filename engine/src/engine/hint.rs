//! The usage hint the caller hands the engine (see [`UsageHint`]): kept roughly current as
//! containers come, go and move, and read by the policies through the state view.

use super::Engine;
use crate::grant::Grant;
use crate::usage_hint::UsageHint;

impl Engine {
    /// Places new shared containers by measured usage as well as by requests (`Some`), or by
    /// requests alone (`None`, the default). Replaces the previous hint; call it with every
    /// round's measurement ([`UsageHint::measure`]).
    pub fn set_usage_hint(&mut self, hint: Option<UsageHint>) {
        self.usage_hint = hint;
    }

    /// The hint in force, as kept since it was handed over.
    pub fn usage_hint(&self) -> Option<&UsageHint> {
        self.usage_hint.as_ref()
    }

    /// A grant was placed: counted with its request until measured.
    pub(super) fn hint_placed(&mut self, id: &str, g: &Grant) {
        if let Some(h) = self.usage_hint.as_mut() {
            h.placed(&self.topo, id, g, g.request_milli);
        }
    }

    /// A grant went: its usage taken back.
    pub(super) fn hint_removed(&mut self, id: &str, g: &Grant) {
        if let Some(h) = self.usage_hint.as_mut() {
            h.removed(&self.topo, id, g);
        }
    }

    /// A grant moved: its usage (as measured, or `usage`) carried to its new nodes.
    pub(super) fn hint_moved(&mut self, id: &str, g: &Grant, usage: Option<u64>) {
        if let (Some(h), Some(u)) = (self.usage_hint.as_mut(), usage) {
            h.placed(&self.topo, id, g, u);
        }
    }
}
