//! A container's cpuset as its cgroup holds it, read and written in the cgroup filesystem
//! itself: cgroup v2, or v1's `cpuset` hierarchy, with either cgroup driver (the directory is
//! found by the container's id, [`index`]).
//!
//! The convergence loop writes here where the runtime offers no safe call of its own (NRI on
//! containerd before 2.4: docs/design/reliability.md), and every mode reads here what a
//! container really runs with (the read-back), since a runtime's own record of it (its spec)
//! can differ from the cgroup.

pub mod index;

use index::CgroupIndex;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tap_engine::{CpuSet, NodeSet};

/// How often a lookup of an unknown container may walk the tree again.
const WALK_AT_MOST_EVERY: Duration = Duration::from_millis(500);

/// Which cgroup layout holds the cpusets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hierarchy {
    /// The unified hierarchy (`cgroup.controllers` at its root).
    V2,
    /// cgroup v1's `cpuset` hierarchy (`<root>/cpuset`).
    V1Cpuset,
}

impl Hierarchy {
    pub fn as_str(self) -> &'static str {
        match self {
            Hierarchy::V2 => "cgroup v2",
            Hierarchy::V1Cpuset => "cgroup v1 cpuset",
        }
    }
}

/// Why a container's cpuset files could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no cgroup of container {id} under {}", root.display())]
    NotFound { id: String, root: PathBuf },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: not a CPU or node list: {text:?}", path.display())]
    Parse { path: PathBuf, text: String },
}

impl CgroupError {
    /// The container is gone (or not created yet): nothing to read or write.
    pub fn is_not_found(&self) -> bool {
        match self {
            CgroupError::NotFound { .. } => true,
            CgroupError::Io { source, .. } => source.kind() == std::io::ErrorKind::NotFound,
            CgroupError::Parse { .. } => false,
        }
    }
}

/// What a container's cgroup holds: `cpuset.cpus` and `cpuset.mems` as written (not the
/// effective sets; an empty v2 file means "inherited").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cpuset {
    pub cpus: CpuSet,
    pub mems: NodeSet,
}

/// The cpuset files of containers under one cgroup root.
#[derive(Debug)]
pub struct Cgroupfs {
    hierarchy: Hierarchy,
    /// Where containers' cpuset directories are (v1: the `cpuset` hierarchy's root).
    root: PathBuf,
    index: Mutex<CgroupIndex>,
}

impl Cgroupfs {
    /// The cgroup filesystem mounted at `mount` (normally `/sys/fs/cgroup`), if it has cpusets.
    pub fn detect(mount: &Path) -> Option<Cgroupfs> {
        let (hierarchy, root) = if mount.join("cgroup.controllers").is_file() {
            (Hierarchy::V2, mount.to_path_buf())
        } else if mount.join("cpuset/cpuset.cpus").is_file() {
            (Hierarchy::V1Cpuset, mount.join("cpuset"))
        } else {
            return None;
        };
        Some(Cgroupfs {
            hierarchy,
            index: Mutex::new(CgroupIndex::new(&root)),
            root,
        })
    }

    /// [`Cgroupfs::detect`], saying so when nothing was found.
    pub fn find(mount: &Path) -> Option<Arc<Cgroupfs>> {
        let fs = Cgroupfs::detect(mount);
        if fs.is_none() {
            tracing::warn!(
                cgroup_root = %mount.display(),
                "no cgroup filesystem with cpusets there (--cgroup-root): containers' cpusets are not read back"
            );
        }
        fs.map(Arc::new)
    }

    pub fn hierarchy(&self) -> Hierarchy {
        self.hierarchy
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether this process may write the hierarchy (not mounted read-only, not another
    /// user's). Opens a file of the root cgroup for writing without writing anything.
    pub fn writable(&self) -> Result<(), CgroupError> {
        let path = self.root.join("cgroup.procs");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map(drop)
            .map_err(|source| CgroupError::Io { path, source })
    }

    fn index(&self) -> std::sync::MutexGuard<'_, CgroupIndex> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on container `id`'s directory; a directory found gone is forgotten and looked
    /// up once more (the same id in a new place: a restarted runtime).
    fn with_dir<T>(
        &self,
        id: &str,
        f: impl Fn(&Path) -> Result<T, CgroupError>,
    ) -> Result<T, CgroupError> {
        for _ in 0..2 {
            let Some(dir) = self.index().find(id, WALK_AT_MOST_EVERY) else {
                break;
            };
            match f(&dir) {
                Err(e) if e.is_not_found() => self.index().forget(id),
                r => return r,
            }
        }
        Err(CgroupError::NotFound {
            id: id.to_string(),
            root: self.root.clone(),
        })
    }

    /// What container `id`'s cgroup holds.
    pub fn read(&self, id: &str) -> Result<Cpuset, CgroupError> {
        self.with_dir(id, |dir| {
            let cpus_text = read_file(&dir.join("cpuset.cpus"))?;
            let mems_text = read_file(&dir.join("cpuset.mems"))?;
            Ok(Cpuset {
                cpus: parse_list(&dir.join("cpuset.cpus"), &cpus_text, CpuSet::parse)?,
                mems: parse_list(&dir.join("cpuset.mems"), &mems_text, NodeSet::parse)?,
            })
        })
    }

    /// Writes container `id`'s `cpuset.cpus` and, when given, `cpuset.mems`. The kernel moves
    /// the container's tasks at once; it involves no runtime and no shim.
    pub fn write(
        &self,
        id: &str,
        cpus: &CpuSet,
        mems: Option<&NodeSet>,
    ) -> Result<(), CgroupError> {
        let cpus = cpus.to_string();
        let mems = mems.filter(|m| !m.is_empty()).map(|m| m.to_string());
        self.with_dir(id, |dir| {
            write_file(&dir.join("cpuset.cpus"), &cpus)?;
            if let Some(m) = &mems {
                write_file(&dir.join("cpuset.mems"), m)?;
            }
            Ok(())
        })
    }
}

fn read_file(path: &Path) -> Result<String, CgroupError> {
    std::fs::read_to_string(path).map_err(|source| CgroupError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn write_file(path: &Path, text: &str) -> Result<(), CgroupError> {
    std::fs::write(path, text).map_err(|source| CgroupError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn parse_list<T, E>(
    path: &Path,
    text: &str,
    parse: impl Fn(&str) -> Result<T, E>,
) -> Result<T, CgroupError> {
    parse(text.trim()).map_err(|_| CgroupError::Parse {
        path: path.to_path_buf(),
        text: text.trim().to_string(),
    })
}

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
