//! `tap-touch MIB [GO]`: allocates MIB MiB, writes one byte in every page so each is really
//! allocated (on the NUMA nodes its cpuset and memory policy allow), prints `touched`, then
//! sleeps, so `/proc/<pid>/numa_maps` shows where its pages are. With GO (a path), it spins
//! instead once GO exists (a busy container for the rebalancer). Built static by the NUMA
//! guest test (e2e/tests/numa_vm.rs) to run inside a busybox container: std only.
use std::io::Write;

fn main() {
    let mib: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(64);
    let mut buf = vec![0u8; mib.saturating_mul(1 << 20)];
    for i in (0..buf.len()).step_by(4096) {
        buf[i] = 1;
    }
    std::hint::black_box(&buf);
    let mut out = std::io::stdout();
    let _ = writeln!(out, "touched {mib} MiB");
    let _ = out.flush();
    if let Some(go) = std::env::args().nth(2) {
        while !std::path::Path::new(&go).exists() {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        let mut n: u64 = 0;
        loop {
            n = std::hint::black_box(n.wrapping_add(1));
        }
    }
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
        std::hint::black_box(&buf);
    }
}
