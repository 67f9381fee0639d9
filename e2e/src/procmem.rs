//! A process's memory as the kernel accounts it: `/proc/PID/status` and
//! `/proc/PID/smaps_rollup`, in KiB.

use anyhow::{Context, Result};

/// One reading.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcMemory {
    /// Resident set now (`VmRSS`) and its peak (`VmHWM`).
    pub rss_kib: u64,
    pub hwm_kib: u64,
    /// `VmRSS` split: anonymous pages (heap, stacks), file-backed pages (the mapped binary and
    /// libraries), shared memory.
    pub anon_kib: u64,
    pub file_kib: u64,
    pub shmem_kib: u64,
    /// `Anonymous` of smaps_rollup (all anonymous pages of the mappings, resident).
    pub smaps_anonymous_kib: u64,
    /// Private dirty pages (what the process itself wrote).
    pub private_dirty_kib: u64,
    pub threads: u64,
}

fn field(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

impl ProcMemory {
    /// Reads the figures of process `pid`.
    pub fn read(pid: u32) -> Result<ProcMemory> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("reading /proc/{pid}/status"))?;
        let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
            .with_context(|| format!("reading /proc/{pid}/smaps_rollup"))?;
        let s =
            |n: &str| field(&status, n).with_context(|| format!("no {n} in /proc/{pid}/status"));
        let r = |n: &str| {
            field(&rollup, n).with_context(|| format!("no {n} in /proc/{pid}/smaps_rollup"))
        };
        Ok(ProcMemory {
            rss_kib: s("VmRSS")?,
            hwm_kib: s("VmHWM")?,
            anon_kib: s("RssAnon")?,
            file_kib: s("RssFile")?,
            shmem_kib: s("RssShmem")?,
            threads: s("Threads")?,
            smaps_anonymous_kib: r("Anonymous")?,
            private_dirty_kib: r("Private_Dirty")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let m = ProcMemory::read(std::process::id()).unwrap();
        assert!(m.rss_kib > 0 && m.hwm_kib >= m.rss_kib);
        // The kernel reads the counters one by one while other test threads allocate.
        let parts = m.anon_kib + m.file_kib + m.shmem_kib;
        assert!(m.rss_kib.abs_diff(parts) < 4096, "{m:?}");
        assert!(m.file_kib > 0 && m.smaps_anonymous_kib > 0, "{m:?}");
        assert!(m.threads >= 1);
    }

    #[test]
    fn field_parses_the_number_after_the_colon() {
        let t = "Name:\tx\nVmRSS:\t   1234 kB\nVmHWMx: 9\n";
        assert_eq!(field(t, "VmRSS"), Some(1234));
        assert_eq!(field(t, "VmHWM"), None);
    }
}
