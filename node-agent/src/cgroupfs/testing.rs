//! A directory tree standing in for a cgroup mount, for unit tests (plain files: the kernel's
//! own checks are the e2e tiers' business).

use std::path::{Path, PathBuf};

pub(crate) struct Mount(pub(crate) PathBuf);

impl Mount {
    pub(crate) fn new(tag: &str) -> Mount {
        let dir = std::env::temp_dir().join(format!("tap-cgroupfs-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        Mount(dir)
    }

    /// A cgroup v1 mount with a `cpuset` hierarchy.
    pub(crate) fn v1(tag: &str) -> Mount {
        let m = Mount::new(tag);
        m.file("cpuset/cpuset.cpus", "0-95\n");
        m.file("cpuset/cgroup.procs", "");
        m
    }

    pub(crate) fn file(&self, rel: &str, text: &str) -> PathBuf {
        let p = self.0.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(&p, text).expect("write");
        p
    }

    /// A container's cpuset directory in the v1 hierarchy (cgroupfs driver); returns it.
    pub(crate) fn container(&self, id: &str, cpus: &str, mems: &str) -> PathBuf {
        let dir = format!("cpuset/kubepods/burstable/pod1/{id}");
        self.file(&format!("{dir}/cpuset.cpus"), cpus);
        self.file(&format!("{dir}/cpuset.mems"), mems);
        self.0.join(dir)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

/// A cpuset file's content, trimmed.
pub(crate) fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file))
        .expect("read")
        .trim()
        .to_string()
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
