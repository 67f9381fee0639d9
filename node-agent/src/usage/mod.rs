//! What containers really use (the rebalancer's measurements): each container's CPU time from its
//! cgroup (`cpu.stat`: `usage_usec`, throttling), turned into milli-CPUs over the interval
//! between two samples. The rebalancer (`tap_engine::rebalance`) reads these figures; the
//! metrics export their per-NUMA-node sums.
//!
//! I/O at the edge: [`crate::cgroupfs::index`] finds a container's cgroup by its id under the
//! cgroup root, [`cpu_stat`] reads and parses `cpu.stat`; [`sampler`] keeps the last reading per container
//! (pure arithmetic, checked). cgroup v2 only (v1's `cpuacct.usage` is not read: a v1 host
//! reports no usage and the rebalancer never acts there).

pub mod cpu_stat;
pub mod rebalance_loop;
pub mod sampler;
