//! A grant: what one container was given, and its text form (the grant record) that the agent
//! stores in the container itself (an annotation or label) so a restarted agent reads back
//! exactly what it decided.

use crate::cpuset::CpuSet;
use crate::nodeset::NodeSet;
use crate::request::{Hyperthreads, PolicyKind};
use crate::topology::{PoolId, Topology};
use crate::types::Site;
use std::fmt::Write as _;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub policy: PolicyKind,
    /// The pool the request is charged to (and its ancestors).
    pub pool: PoolId,
    /// NUMA nodes the grant spans (numa-aware: the chosen nodes; topology-aware: the pool's).
    pub nodes: NodeSet,
    /// The CPUs the grant may use before exclusive, reserved and isolated CPUs are taken out.
    pub span: CpuSet,
    /// Exclusive CPUs (empty for a shared grant).
    pub exclusive: CpuSet,
    pub request_milli: u64,
    pub limit_milli: Option<u64>,
    /// Memory charged to the pool (memory topology on and a limit set), bytes.
    pub memory_bytes: u64,
    /// Memory nodes set on the container, if memory binding applies.
    pub mems: Option<NodeSet>,
    /// The cpuset the container has now.
    pub cpus: CpuSet,
    /// Which hyperthreads of the grant the container sees (`cpus` follows it).
    pub threads: Hyperthreads,
    /// Where the CPUs come from: the pools, the reserved CPUs or DRA claims' CPUs (the span;
    /// charged nowhere). The engine keeps which claims a [`Site::Claim`] grant uses.
    pub site: Site,
}

impl Grant {
    /// The cpuset the container gets from `cpus` (its exclusive CPUs, or its span's shared
    /// CPUs): one hyperthread per core when it hides them.
    pub fn visible(&self, topo: &Topology, cpus: &CpuSet) -> CpuSet {
        match self.threads {
            Hyperthreads::Shown => *cpus,
            Hyperthreads::Hidden => topo.one_thread_per_core(cpus),
        }
    }

    /// The request charged to the grant's pool and nodes: its request, and at least its
    /// exclusive CPUs (a `numa-policy: exclusive` grant holds a whole node whatever it asked).
    pub fn charged_request(&self) -> u64 {
        let excl = u64::try_from(self.exclusive.len())
            .unwrap_or(u64::MAX)
            .saturating_mul(1000);
        self.request_milli.max(excl)
    }

    pub fn is_exclusive(&self) -> bool {
        !self.exclusive.is_empty()
    }

    /// Whether the grant is on the reserved CPUs (a system daemon).
    pub fn is_reserved(&self) -> bool {
        self.site == Site::Reserved
    }

    /// Whether the grant's CPUs are its span, off the pools (the reserved CPUs, or a DRA
    /// claim's): charged nowhere, never refreshed, never moved.
    pub fn off_pools(&self) -> bool {
        self.site != Site::Pools
    }

    /// The grant record: `v1;p=<policy>;pool=<name>;n=<nodes>;x=<exclusive>;r=<req>;l=<lim>;m=<mem>;mems=<mems>`,
    /// and `;on=reserved` for a grant on the reserved CPUs, `;on=claim:` for one on DRA
    /// claims' CPUs, which the engine follows with the claims' uids (`<uid>+<uid>`; older
    /// agents ignore the key).
    pub fn record(&self, topo: &Topology) -> String {
        let mut s = String::with_capacity(96);
        let _ = write!(
            s,
            "v1;p={};pool={};n={};x={};r={};l={};m={}",
            self.policy,
            topo.pools[self.pool].name,
            self.nodes,
            self.exclusive,
            self.request_milli,
            self.limit_milli.map(|l| l.to_string()).unwrap_or_default(),
            self.memory_bytes,
        );
        if let Some(m) = self.mems {
            let _ = write!(s, ";mems={m}");
        }
        match self.site {
            Site::Pools => {}
            Site::Reserved => s.push_str(";on=reserved"),
            Site::Claim => s.push_str(";on=claim:"),
        }
        s
    }
}

/// A parsed grant record; resolved against a topology by the engine's restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantRecord {
    pub policy: PolicyKind,
    pub pool: String,
    pub nodes: NodeSet,
    pub exclusive: CpuSet,
    pub request_milli: u64,
    pub limit_milli: Option<u64>,
    pub memory_bytes: u64,
    pub mems: Option<NodeSet>,
    pub site: Site,
    /// The claims' uids of a [`Site::Claim`] record.
    pub claims: Vec<String>,
}

impl GrantRecord {
    /// Parses a record; `None` for anything malformed (the caller then infers the grant from
    /// the container's cpuset instead).
    pub fn parse(s: &str) -> Option<GrantRecord> {
        let mut parts = s.trim().split(';');
        if parts.next()? != "v1" {
            return None;
        }
        let (mut policy, mut pool, mut nodes, mut excl) = (None, None, None, None);
        let (mut req, mut lim, mut mem, mut mems) = (None, None, None, None);
        let mut site = Site::Pools;
        let mut claims = Vec::new();
        for part in parts {
            let (k, v) = part.split_once('=')?;
            match k {
                "p" => policy = PolicyKind::parse(v),
                "pool" => pool = Some(v.to_string()),
                "n" => nodes = NodeSet::parse(v).ok(),
                "x" => excl = CpuSet::parse(v).ok(),
                "r" => req = v.parse().ok(),
                "l" => {
                    lim = Some(if v.is_empty() {
                        None
                    } else {
                        Some(v.parse().ok()?)
                    })
                }
                "m" => mem = v.parse().ok(),
                "mems" => mems = Some(NodeSet::parse(v).ok()?),
                "on" if v == "reserved" => site = Site::Reserved,
                "on" => {
                    let uids = v.strip_prefix("claim:").filter(|u| !u.is_empty())?;
                    site = Site::Claim;
                    claims = uids.split('+').map(str::to_string).collect();
                }
                _ => {}
            }
        }
        Some(GrantRecord {
            policy: policy?,
            pool: pool?,
            nodes: nodes?,
            exclusive: excl?,
            request_milli: req?,
            limit_milli: lim?,
            memory_bytes: mem?,
            mems,
            site,
            claims,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_parse_rejects_garbage() {
        for s in [
            "",
            "v2;p=numa-aware",
            "v1;p=foo;pool=a;n=0;x=;r=1;l=;m=0",
            "v1;p=numa-aware",
        ] {
            assert!(GrantRecord::parse(s).is_none(), "{s}");
        }
        let r = GrantRecord::parse("v1;p=numa-aware;pool=numa1;n=1;x=;r=4000;l=8000;m=0;mems=1")
            .unwrap();
        assert_eq!(r.pool, "numa1");
        assert_eq!(r.limit_milli, Some(8000));
        assert_eq!(r.mems.unwrap().to_string(), "1");
        assert_eq!(r.site, Site::Pools);
    }

    #[test]
    fn a_reserved_grant_says_so_in_its_record() {
        let r =
            GrantRecord::parse("v1;p=topology-aware;pool=machine;n=0;x=;r=100;l=;m=0;on=reserved")
                .unwrap();
        assert_eq!(r.site, Site::Reserved);
        assert!(
            GrantRecord::parse("v1;p=topology-aware;pool=machine;n=0;x=;r=1;l=;m=0;on=moon")
                .is_none()
        );
    }

    #[test]
    fn a_claimed_grant_names_its_claims_in_its_record() {
        let r = GrantRecord::parse(
            "v1;p=topology-aware;pool=numa1;n=1;x=;r=0;l=;m=0;mems=1;on=claim:a-1+b-2",
        )
        .unwrap();
        assert_eq!(
            (r.site, r.claims.as_slice()),
            (Site::Claim, &["a-1".to_string(), "b-2".to_string()][..])
        );
        for bad in ["on=claim:", "on=claims:a"] {
            let s = format!("v1;p=topology-aware;pool=numa1;n=1;x=;r=0;l=;m=0;{bad}");
            assert!(GrantRecord::parse(&s).is_none(), "{s}");
        }
    }
}
