//! The engine's integration tests, one binary with a module per subject (each test binary links
//! the engine again). The counting allocator's test is a binary of its own
//! (tests/allocations.rs): a global allocator counts every thread of its process.

mod common;

mod cache_level;
mod custom_policy;
mod fixtures;
mod hyperthreads;
mod memory_tiers;
mod module_graph;
mod numa_exclusive;
mod policies;
mod reference_cases;
mod reinstate;
mod restore_rules;
mod state_props;
mod sysfs_checks;
