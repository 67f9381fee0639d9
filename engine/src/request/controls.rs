//! The hyperthread and memory-tier controls a Pod can ask for by annotation: how exclusive CPUs
//! are taken from cores, which hyperthreads a container sees, which memory kinds it uses.

use crate::topology::MemoryKind;

crate::names! {
    /// How exclusive CPUs are taken from cores (`exclusive-cores` annotation, `--exclusive-cores`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub enum CoreGrain: "exclusive core grain", Ignored {
        /// Whole cores only: a container whose CPU count is not made of whole free cores gets
        /// shared CPUs instead (the kubelet's `full-pcpus-only`). The default.
        #[default]
        WholeCores = "whole" | "whole-cores" | "full-cores",
        /// Any hyperthreads: whole cores first, a remainder from a split core.
        Threads = "threads" | "any",
        /// Exactly the two hyperthreads of one core (a 2-CPU container).
        SiblingPair = "sibling-pair" | "pair",
    }
}

/// The memory kinds a container asks for (`memory-type` annotation). DRAM is always in;
/// the others add memory-only nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryTypes {
    pmem: bool,
    hbm: bool,
}

impl MemoryTypes {
    /// `dram`, `pmem`, `cxl`, `hbm`, comma-separated; `None` when empty or any item is unknown.
    pub fn parse(s: &str) -> Option<MemoryTypes> {
        let mut t = MemoryTypes::default();
        let mut any = false;
        for item in s.split(',').filter(|i| !i.trim().is_empty()) {
            any = true;
            match MemoryKind::parse(item)? {
                MemoryKind::Dram => {}
                MemoryKind::Pmem => t.pmem = true,
                MemoryKind::Hbm => t.hbm = true,
            }
        }
        any.then_some(t)
    }

    /// The memory-only kinds asked for (PMEM/CXL, then HBM).
    pub fn tiers(self) -> impl Iterator<Item = MemoryKind> {
        [(self.pmem, MemoryKind::Pmem), (self.hbm, MemoryKind::Hbm)]
            .into_iter()
            .filter_map(|(on, k)| on.then_some(k))
    }

    pub fn has_tiers(self) -> bool {
        self.pmem || self.hbm
    }
}

/// Which hyperthreads of its grant a container sees (`hide-hyperthreads` annotation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Hyperthreads {
    /// Every CPU of the grant (the default).
    #[default]
    Shown,
    /// One hyperthread per core of the grant: the lowest-numbered one the grant holds.
    Hidden,
}
