//! Usage-aware rebalancing: which shared containers to move between NUMA nodes when their
//! measured CPU use, not their requests, is unbalanced. Pure like the rest of the engine: the
//! caller measures, passes the figures and a tick count (its clock), and applies the moves it
//! gets with [`Engine::relocate`](crate::Engine::relocate).
//!
//! A round ([`Rebalancer::plan`]): each NUMA node's usage is the sum of the measured usage of
//! the shared grants on it (a grant spanning several nodes, such as a BestEffort container on
//! the machine's shared CPUs, is spread over them in proportion to its CPUs on each: exclusive
//! CPUs taken from one node leave its share there smaller); the imbalance is max/mean of those
//! figures over the nodes that have shared CPUs, each node's usage divided by its shared CPUs
//! first ([`BalanceBy::UsagePerSharedCpu`], the default) or not ([`BalanceBy::Usage`]). Only
//! after it stays above the threshold for `window` consecutive rounds does the rebalancer act: it picks, one at a time and at most
//! `max_moves`, the move of a shared one-node grant to another node's NUMA pool that lowers
//! the imbalance most (ties: the lower sum of squares of the node usages), recomputing after
//! each, among grants that fit their target ([`fit`]), are not opted out, and did not move in
//! the last `cooldown` ticks (unless [`CooldownWaiver::OffOversubscribed`] and the grant's
//! node burns more than its shared CPUs); and again every round while the imbalance stays
//! above.
//!
//! With [`PlaceBy::Usage`], [`Rebalancer::hint`] also turns the round's usage into a
//! [`UsageHint`] for [`Engine::set_usage_hint`](crate::Engine::set_usage_hint): new shared
//! containers then go to the least busy NUMA node among the places that fit them.
//! [`RebalanceConfig::usage_aware`] is the set of settings measured in docs/measurements/sim.md.

mod config;
mod hint;
#[cfg(test)]
mod hint_tests;
mod nodes;
mod report;
#[cfg(test)]
mod tests;

pub use crate::engine::RelocateError;
pub use crate::usage_hint::UsageHint;
pub use config::{BalanceBy, CooldownWaiver, PlaceBy, RebalanceConfig};
pub use nodes::numa_pools;
pub use report::{report, NodeUsage, UsageReport};

use nodes::{node_pos, Nodes};

use crate::engine::Engine;
use crate::fit::{fits, Pending, Shift};
use crate::grant::Grant;
use crate::state::StateView;
use crate::topology::PoolId;
use crate::types::Site;
use std::collections::HashMap;

/// A container's measured CPU use over the last interval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageSample {
    /// The container id as the engine knows it.
    pub id: String,
    /// Milli-CPUs used on average over the interval.
    pub usage_milli: u64,
}

/// Why a move was chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MoveReason {
    /// The usage imbalance across NUMA nodes (max/mean) before and after this move, and the
    /// usage that moves.
    UsageImbalance {
        before: f64,
        after: f64,
        usage_milli: u64,
    },
}

/// Move container `id` from pool `from` to pool `to` (a NUMA node's pool).
#[derive(Debug, Clone, PartialEq)]
pub struct Move {
    pub id: String,
    pub from: PoolId,
    pub to: PoolId,
    pub why: MoveReason,
}

/// The rebalancer's state between rounds.
#[derive(Debug, Clone)]
pub struct Rebalancer {
    cfg: RebalanceConfig,
    /// Consecutive rounds above the threshold.
    above: u32,
    /// The tick of each container's last move (containers gone are forgotten every round).
    moved_at: HashMap<String, u64>,
}

/// The best move found so far in a round.
struct Best<'a> {
    id: &'a str,
    grant: &'a Grant,
    src: usize,
    dst: usize,
    usage: u64,
    after: (f64, f64),
}

impl Rebalancer {
    pub fn new(cfg: RebalanceConfig) -> Rebalancer {
        Rebalancer {
            cfg,
            above: 0,
            moved_at: HashMap::new(),
        }
    }

    pub fn config(&self) -> &RebalanceConfig {
        &self.cfg
    }

    /// Consecutive rounds the imbalance has been above the threshold.
    pub fn rounds_above(&self) -> u32 {
        self.above
    }

    /// The usage hint to hand the engine with this round's usage
    /// ([`Engine::set_usage_hint`](crate::Engine::set_usage_hint)): `Some` with
    /// [`PlaceBy::Usage`], `None` with [`PlaceBy::Requests`].
    pub fn hint(&self, engine: &Engine, usage: &[UsageSample]) -> Option<UsageHint> {
        match self.cfg.place {
            PlaceBy::Requests => None,
            PlaceBy::Usage => Some(UsageHint::measure(&engine.view(), usage)),
        }
    }

    /// One round: what to move, given this round's usage (does not change the engine). Apply
    /// the moves in order with [`Engine::relocate`](crate::Engine::relocate).
    pub fn plan(
        &mut self,
        engine: &Engine,
        usage: &[UsageSample],
        tick: u64,
        opted_out: &dyn Fn(&str) -> bool,
    ) -> Vec<Move> {
        let view = engine.view();
        self.moved_at.retain(|id, _| view.grant(id).is_some());
        let mut nodes = Nodes::measure(&view, usage, self.cfg.by);
        let above = nodes.imbalance().is_some_and(|i| i > self.cfg.threshold);
        if !above {
            self.above = 0;
            return Vec::new();
        }
        self.above = self.above.saturating_add(1);
        if self.above < self.cfg.window {
            return Vec::new();
        }
        let moves = self.choose(&view, &mut nodes, usage, tick, opted_out);
        for m in &moves {
            self.moved_at.insert(m.id.clone(), tick);
        }
        moves
    }

    /// Up to `max_moves` moves, each the one that lowers the imbalance most after the ones
    /// before it.
    fn choose(
        &self,
        view: &StateView<'_>,
        nodes: &mut Nodes,
        usage: &[UsageSample],
        tick: u64,
        opted_out: &dyn Fn(&str) -> bool,
    ) -> Vec<Move> {
        let topo = view.topology();
        let mut pending = Pending::new(topo);
        let mut out: Vec<Move> = Vec::new();
        while out.len() < self.cfg.max_moves {
            // Once the moves so far bring it under the threshold, the round is done (a move
            // that only trims an imbalance nobody acts on is churn).
            let Some(before) = nodes.imbalance().filter(|i| *i > self.cfg.threshold) else {
                break;
            };
            let mut best: Option<Best<'_>> = None;
            for s in usage {
                if out.iter().any(|m| m.id == s.id) {
                    continue;
                }
                if let Some((g, src)) = self.candidate(view, s, tick, opted_out, nodes) {
                    self.best_target(view, &mut pending, nodes, (s, g, src), &mut best);
                }
            }
            let Some(b) = best.filter(|b| b.after.0 < before) else {
                break;
            };
            let to = nodes.pool[b.dst].unwrap_or(b.grant.pool);
            pending.shift(topo, b.grant, b.grant.pool, &b.grant.nodes, Shift::Take);
            pending.shift(topo, b.grant, to, &topo.pools[to].numa_nodes, Shift::Add);
            nodes.usage[b.src] = nodes.usage[b.src].saturating_sub(b.usage);
            nodes.usage[b.dst] = nodes.usage[b.dst].saturating_add(b.usage);
            out.push(Move {
                id: b.id.to_string(),
                from: b.grant.pool,
                to,
                why: MoveReason::UsageImbalance {
                    before,
                    after: b.after.0,
                    usage_milli: b.usage,
                },
            });
        }
        out
    }

    /// Updates `best` with the best target node of one candidate, where it fits.
    fn best_target<'a>(
        &self,
        view: &StateView<'_>,
        pending: &mut Pending,
        nodes: &Nodes,
        (s, g, src): (&'a UsageSample, &'a Grant, usize),
        best: &mut Option<Best<'a>>,
    ) {
        let topo = view.topology();
        pending.shift(topo, g, g.pool, &g.nodes, Shift::Take);
        for (dst, pool) in nodes.pool.iter().enumerate() {
            let Some(pool) = *pool else { continue };
            if dst == src {
                continue;
            }
            let Some(after) = nodes.after(src, dst, s.usage_milli) else {
                continue;
            };
            let better = best.as_ref().is_none_or(|b| {
                after
                    .0
                    .total_cmp(&b.after.0)
                    .then(after.1.total_cmp(&b.after.1))
                    == std::cmp::Ordering::Less
            });
            if better && fits(view, pending, g, pool) {
                *best = Some(Best {
                    id: &s.id,
                    grant: g,
                    src,
                    dst,
                    usage: s.usage_milli,
                    after,
                });
            }
        }
        pending.shift(topo, g, g.pool, &g.nodes, Shift::Add);
    }

    /// The grant of a sample that may move, and the position of its node.
    fn candidate<'a>(
        &self,
        view: &StateView<'a>,
        s: &UsageSample,
        tick: u64,
        opted_out: &dyn Fn(&str) -> bool,
        nodes: &Nodes,
    ) -> Option<(&'a Grant, usize)> {
        if s.usage_milli == 0 || opted_out(&s.id) {
            return None;
        }
        let g = view.grant(&s.id)?;
        let topo = view.topology();
        let one_node = g.nodes.len() == 1 && topo.pools[g.pool].numa_nodes.len() == 1;
        if g.is_exclusive() || g.site != Site::Pools || !one_node {
            return None;
        }
        let src = node_pos(topo, g.nodes.iter().next()?)?;
        nodes.pool[src]?;
        let cooling = |t: &u64| tick.saturating_sub(*t) < self.cfg.cooldown;
        let waived = self.cfg.cooldown_waiver == CooldownWaiver::OffOversubscribed
            && nodes.oversubscribed(src);
        if !waived && self.moved_at.get(&s.id).is_some_and(cooling) {
            return None;
        }
        Some((g, src))
    }
}
