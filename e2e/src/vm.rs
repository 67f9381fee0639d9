//! Small QEMU guests with real NUMA nodes (TCG: this machine has no usable KVM), for tests that
//! need a kernel with several nodes: cgroup cpusets and `cpuset.mems` enforced, pages seen in
//! `/proc/<pid>/numa_maps`, a live sysfs with sockets, NUMA nodes and distances.
//!
//! No root image: the guest mounts a root read-only over 9p with an overlay in guest RAM on top
//! (`e2e/vm/init.sh`, for both architectures). The x86 guest's root is the host's `/`, so it
//! runs the host's own containerd, runc, agent and test binaries; the arm64 guest's is a folder
//! of Debian's arm64 packages ([`ARM64_ROOT`]: busybox, libc, containerd, runc), laid out as the
//! host's e2e setup lays out the amd64 ones. The host and the guest talk through an exchange
//! folder shared over a second, writable 9p mount at the same path on both sides: the host
//! writes `run.sh` (and whatever programs it brings), the guest runs it, leaves `run.log`, `rc`
//! and whatever files the script writes there, and powers off. The guest has no network
//! device. One boot per test binary: TCG is slow.
//! Installed by `hack/e2e/setup-vm.sh` (kernels, QEMU, the arm64 root).

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where setup-vm.sh keeps the x86 guest's kernel (`kimg/`, the unpacked Debian package).
pub const X86_CACHE: &str = "/var/cache/kunpeng-tap/vm/x86";
/// The arm64 guest's kernel (`kimg/`) and busybox (`bb/`).
pub const ARM64_CACHE: &str = "/var/cache/kunpeng-tap/vm/arm64";
/// The arm64 guest's `/` (setup-vm.sh): Debian's arm64 busybox-static, libc6, libseccomp2,
/// and containerd and runc where setup-containerd.sh puts the amd64 ones, with a busybox
/// image tarball for arm64.
pub const ARM64_ROOT: &str = "/var/cache/kunpeng-tap/vm/arm64/root";
/// The modules the inits load, relative to the kernel's `kernel/` folder; the ones a kernel
/// has built in are not there and are skipped.
const MODULES: &[&str] = &[
    "drivers/virtio/virtio.ko",
    "drivers/virtio/virtio_ring.ko",
    "drivers/virtio/virtio_pci_modern_dev.ko",
    "drivers/virtio/virtio_pci_legacy_dev.ko",
    "drivers/virtio/virtio_pci.ko",
    "net/9p/9pnet.ko",
    "net/9p/9pnet_virtio.ko",
    "fs/fscache/fscache.ko",
    "fs/netfs/netfs.ko",
    "fs/9p/9p.ko",
    "fs/overlayfs/overlay.ko",
];
/// A guest's architecture: what it boots and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Runs the host's own binaries from its `/`.
    X86,
    /// QEMU `virt` with `-cpu max`; runs [`ARM64_ROOT`]'s binaries and what the test copies
    /// into the exchange folder.
    Arm64,
}

impl Arch {
    fn cache(self) -> &'static Path {
        Path::new(match self {
            Arch::X86 => X86_CACHE,
            Arch::Arm64 => ARM64_CACHE,
        })
    }

    /// The folder the guest mounts as its `/` (read-only, with an overlay).
    fn root(self) -> &'static Path {
        Path::new(match self {
            Arch::X86 => "/",
            Arch::Arm64 => ARM64_ROOT,
        })
    }

    fn busybox(self) -> PathBuf {
        match self {
            // The one setup-containerd.sh unpacks.
            Arch::X86 => PathBuf::from("/var/cache/kunpeng-tap/containerd/root/bin/busybox"),
            Arch::Arm64 => self.cache().join("bb/bin/busybox"),
        }
    }

    fn qemu(self) -> &'static str {
        match self {
            Arch::X86 => "qemu-system-x86_64",
            Arch::Arm64 => "qemu-system-aarch64",
        }
    }

    fn machine_args(self) -> &'static [&'static str] {
        match self {
            Arch::X86 => &["-accel", "tcg", "-cpu", "max"],
            Arch::Arm64 => &["-M", "virt", "-accel", "tcg", "-cpu", "max"],
        }
    }

    fn console(self) -> &'static str {
        match self {
            Arch::X86 => "ttyS0",
            Arch::Arm64 => "ttyAMA0",
        }
    }
}

/// One NUMA node of a guest: its CPUs (first, last) and memory.
#[derive(Debug, Clone, Copy)]
pub struct Node {
    pub cpus: (u32, u32),
    pub mem_mib: u64,
}

/// A guest's shape as QEMU is told it.
#[derive(Debug, Clone)]
pub struct Shape {
    pub sockets: u32,
    /// Clusters per socket (arm64 `virt` only; 0: not given).
    pub clusters: u32,
    pub cores_per_socket: u32,
    pub nodes: Vec<Node>,
    /// (from, to, distance) for each pair of different nodes, both ways.
    pub distances: Vec<(u32, u32, u32)>,
}

impl Shape {
    /// 8 vCPUs: 2 sockets of 2 NUMA nodes, 2 CPUs and 512 MiB each; distance 10 local, 12
    /// within a socket, 20 across sockets.
    pub fn x86_two_sockets_four_nodes() -> Shape {
        let nodes: Vec<Node> = (0..4)
            .map(|n| Node {
                cpus: (2 * n, 2 * n + 1),
                mem_mib: 512,
            })
            .collect();
        let mut distances = Vec::new();
        for a in 0..4u32 {
            for b in 0..4u32 {
                if a != b {
                    distances.push((a, b, if a / 2 == b / 2 { 12 } else { 20 }));
                }
            }
        }
        Shape {
            sockets: 2,
            clusters: 0,
            cores_per_socket: 4,
            nodes,
            distances,
        }
    }

    /// A Kunpeng-like arm64 guest: 8 vCPUs in 2 sockets of 2 clusters of 2 cores, one NUMA
    /// node per socket (512 MiB each), distance 20 across.
    pub fn arm64_two_sockets_four_clusters() -> Shape {
        Shape {
            sockets: 2,
            clusters: 2,
            cores_per_socket: 4,
            nodes: vec![
                Node {
                    cpus: (0, 3),
                    mem_mib: 512,
                },
                Node {
                    cpus: (4, 7),
                    mem_mib: 512,
                },
            ],
            distances: vec![(0, 1, 20), (1, 0, 20)],
        }
    }

    pub fn cpus(&self) -> u32 {
        self.sockets * self.cores_per_socket
    }

    pub fn mem_mib(&self) -> u64 {
        self.nodes.iter().map(|n| n.mem_mib).sum()
    }

    /// The distance QEMU gives from `a` to `b` (10 for a node to itself).
    pub fn distance(&self, a: u32, b: u32) -> u32 {
        if a == b {
            return 10;
        }
        self.distances
            .iter()
            .find(|(x, y, _)| *x == a && *y == b)
            .map_or(20, |(_, _, d)| *d)
    }

    fn smp(&self) -> String {
        if self.clusters > 0 {
            format!(
                "{},sockets={},clusters={},cores={},threads=1",
                self.cpus(),
                self.sockets,
                self.clusters,
                self.cores_per_socket / self.clusters.max(1)
            )
        } else {
            format!(
                "{},sockets={},cores={},threads=1",
                self.cpus(),
                self.sockets,
                self.cores_per_socket
            )
        }
    }

    /// The QEMU arguments of the shape (memory, CPUs, NUMA nodes and distances).
    pub fn qemu_args(&self) -> Vec<String> {
        let mut a = vec![
            "-m".to_string(),
            format!("{}M", self.mem_mib()),
            "-smp".into(),
            self.smp(),
        ];
        for (i, n) in self.nodes.iter().enumerate() {
            a.push("-object".into());
            a.push(format!("memory-backend-ram,id=m{i},size={}M", n.mem_mib));
            a.push("-numa".into());
            a.push(format!(
                "node,nodeid={i},cpus={}-{},memdev=m{i}",
                n.cpus.0, n.cpus.1
            ));
        }
        for (x, y, d) in &self.distances {
            a.push("-numa".into());
            a.push(format!("dist,src={x},dst={y},val={d}"));
        }
        a
    }
}

/// What a guest left behind.
#[derive(Debug)]
pub struct GuestRun {
    /// The exchange folder (kept for the test to read files the script wrote).
    pub dir: PathBuf,
    /// `run.sh`'s exit code, or None when the guest never wrote one.
    pub rc: Option<i32>,
    /// `run.sh`'s output.
    pub log: String,
    /// The serial console (kernel and init messages).
    pub console: String,
    pub wall: Duration,
}

/// The guest kernel; fails (never skips) when setup-vm.sh has not run.
pub fn check_installed(arch: Arch) -> Result<PathBuf> {
    let kernel = std::fs::read_dir(arch.cache().join("kimg/boot"))
        .context("no guest kernel: run hack/e2e/setup-vm.sh")?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
        .context("no vmlinuz: run hack/e2e/setup-vm.sh")?;
    for tool in [arch.qemu(), "cpio", "gzip"] {
        let ok = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()?
            .success();
        if !ok {
            bail!("{tool} is missing: run hack/e2e/setup-vm.sh");
        }
    }
    let root = arch.root();
    if !root.join("bin/sh").exists() && !root.join("bin/busybox").exists() {
        bail!(
            "the guest's root {} has no shell: run hack/e2e/setup-vm.sh",
            root.display()
        );
    }
    if !arch.busybox().exists() {
        bail!(
            "{} is missing: run hack/e2e/setup-containerd.sh and setup-vm.sh",
            arch.busybox().display()
        );
    }
    Ok(kernel)
}

/// A fresh exchange folder (not under /tmp or /run: the guest mounts its own there).
pub fn exchange_dir() -> Result<PathBuf> {
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let d = PathBuf::from(format!("/var/tmp/tap-vm-{}-{seq}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

/// Builds the initramfs (busybox, init, modules) into `dir`.
fn initramfs(arch: Arch, kernel: &Path, dir: &Path) -> Result<PathBuf> {
    let kver = kernel
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("vmlinuz-"))
        .context("kernel file name")?;
    let kmods = arch.cache().join(format!("kimg/lib/modules/{kver}/kernel"));
    let root = dir.join("initramfs");
    let _ = std::fs::remove_dir_all(&root);
    for sub in ["bin", "proc", "sys", "dev", "mods"] {
        std::fs::create_dir_all(root.join(sub))?;
    }
    std::fs::copy(arch.busybox(), root.join("bin/busybox"))?;
    std::fs::write(root.join("init"), include_str!("../vm/init.sh"))?;
    set_mode(&root.join("init"), 0o755)?;
    for m in MODULES {
        let src = kmods.join(m);
        if !src.exists() {
            continue; // built in
        }
        let name = src.file_name().context("module name")?;
        std::fs::copy(&src, root.join("mods").join(name))
            .with_context(|| format!("copying {}", src.display()))?;
    }
    let out = dir.join("initrd.gz");
    let st = Command::new("sh")
        .arg("-c")
        .arg("cd \"$1\" && find . | cpio -o -H newc 2>/dev/null | gzip -1 > \"$2\"")
        .args([
            "sh",
            &root.display().to_string(),
            &out.display().to_string(),
        ])
        .status()?;
    if !st.success() {
        bail!("building the initramfs failed");
    }
    Ok(out)
}

fn set_mode(p: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// Boots a guest of `arch` and `shape` with `dir` as its exchange folder (where the caller may
/// have put files for it), runs `script` (sh) in it and waits until it powers off or `timeout`
/// passes (then QEMU is killed and the run has no `rc`).
pub fn run(
    arch: Arch,
    shape: &Shape,
    dir: &Path,
    script: &str,
    timeout: Duration,
) -> Result<GuestRun> {
    let kernel = check_installed(arch)?;
    let initrd = initramfs(arch, &kernel, dir)?;
    std::fs::write(dir.join("run.sh"), script)?;
    let console = std::fs::File::create(dir.join("console.log"))?;
    let mut cmd = Command::new(arch.qemu());
    cmd.args(arch.machine_args())
        .args(["-nographic", "-no-reboot", "-nic", "none"])
        .args(shape.qemu_args());
    cmd.arg("-virtfs")
        .arg(format!(
            "local,path={},mount_tag=host,security_model=none,readonly=on,multidevs=remap",
            arch.root().display()
        ))
        .arg("-virtfs")
        .arg(format!(
            "local,path={},mount_tag=xchg,security_model=none,multidevs=remap",
            dir.display()
        ))
        .arg("-kernel")
        .arg(&kernel)
        .arg("-initrd")
        .arg(&initrd)
        .arg("-append")
        .arg(format!(
            "console={} panic=-1 loglevel=3 xchg={}",
            arch.console(),
            dir.display()
        ))
        .stdin(Stdio::null())
        .stdout(console.try_clone()?)
        .stderr(console);
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", arch.qemu()))?;
    loop {
        if child.try_wait()?.is_some() {
            break;
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    Ok(GuestRun {
        rc: read("rc").trim().parse().ok(),
        log: read("run.log"),
        console: read("console.log"),
        wall: started.elapsed(),
        dir: dir.to_path_buf(),
    })
}

/// Counts of a process's pages per NUMA node, from `/proc/<pid>/numa_maps` (`N<k>=<pages>`).
pub fn numa_pages(pid: u32) -> Result<std::collections::BTreeMap<u32, u64>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/numa_maps"))
        .with_context(|| format!("reading /proc/{pid}/numa_maps"))?;
    Ok(parse_numa_maps(&text))
}

/// The per-node page counts of a `numa_maps` text.
pub fn parse_numa_maps(text: &str) -> std::collections::BTreeMap<u32, u64> {
    let mut out = std::collections::BTreeMap::new();
    for word in text.split_whitespace() {
        let Some(rest) = word.strip_prefix('N') else {
            continue;
        };
        let Some((node, pages)) = rest.split_once('=') else {
            continue;
        };
        if let (Ok(n), Ok(p)) = (node.parse::<u32>(), pages.parse::<u64>()) {
            *out.entry(n).or_insert(0) += p;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numa_maps_pages_are_summed_per_node() {
        let text = "7f00 default anon=16384 dirty=16384 N1=16000 N0=384 kernelpagesize_kB=4\n\
                    5600 default file=/bin/x mapped=3 N0=3 kernelpagesize_kB=4\n";
        let m = parse_numa_maps(text);
        assert_eq!(m.get(&0), Some(&387));
        assert_eq!(m.get(&1), Some(&16000));
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn the_x86_shape_tells_qemu_its_sockets_nodes_and_distances() {
        let s = Shape::x86_two_sockets_four_nodes();
        let args = s.qemu_args().join(" ");
        assert!(
            args.contains("-smp 8,sockets=2,cores=4,threads=1"),
            "{args}"
        );
        assert!(args.contains("node,nodeid=3,cpus=6-7,memdev=m3"), "{args}");
        assert!(args.contains("dist,src=0,dst=1,val=12"), "{args}");
        assert!(args.contains("dist,src=1,dst=2,val=20"), "{args}");
        assert_eq!(s.distance(2, 2), 10);
        assert_eq!(s.mem_mib(), 2048);
        let a = Shape::arm64_two_sockets_four_clusters()
            .qemu_args()
            .join(" ");
        assert!(
            a.contains("-smp 8,sockets=2,clusters=2,cores=2,threads=1"),
            "{a}"
        );
        assert!(a.contains("node,nodeid=1,cpus=4-7,memdev=m1"), "{a}");
    }
}
