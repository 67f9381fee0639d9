//! Finds containers' cgroup directories by container id under a cgroup root (v2, or one v1
//! hierarchy), whatever the cgroup driver named them: `cri-containerd-<id>.scope` and `docker-<id>.scope` (systemd),
//! `<id>` (cgroupfs). One walk of the tree finds every container; a later walk happens only
//! when a container is not known yet (bounded by [`MAX_DEPTH`] and [`MAX_DIRS`]).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Containers sit at most this deep (`kubepods.slice/kubepods-burstable.slice/<pod>/<ctr>`).
pub const MAX_DEPTH: usize = 6;
/// A walk stops after this many directories.
pub const MAX_DIRS: usize = 200_000;

/// The container id in a cgroup directory's name: its run of 64 hex digits.
pub fn container_id(name: &str) -> Option<&str> {
    let bytes = name.as_bytes();
    let mut start = 0;
    for (i, b) in bytes.iter().enumerate() {
        if !b.is_ascii_hexdigit() || b.is_ascii_uppercase() {
            start = i + 1;
            continue;
        }
        if i + 1 - start == 64 && bytes.get(i + 1).is_none_or(|n| !n.is_ascii_hexdigit()) {
            return name.get(start..=i);
        }
    }
    None
}

#[derive(Debug)]
pub struct CgroupIndex {
    root: PathBuf,
    by_id: HashMap<String, PathBuf>,
    /// Ids the last walk did not find (a cgroup v1 host, another cgroup root): they do not
    /// cause another walk every round, only a new id does.
    missing: HashSet<String>,
    /// When the tree was last walked.
    walked: Option<Instant>,
}

impl CgroupIndex {
    pub fn new(root: &Path) -> CgroupIndex {
        CgroupIndex {
            root: root.to_path_buf(),
            by_id: HashMap::new(),
            missing: HashSet::new(),
            walked: None,
        }
    }

    /// Walks the tree again (once) if one of `ids` is new (neither known nor missed by the
    /// last walk): call it once per round.
    pub fn learn(&mut self, ids: &[&str]) {
        let new = |id: &&str| !self.by_id.contains_key(*id) && !self.missing.contains(*id);
        if ids.iter().any(new) {
            self.rewalk();
            self.missing = ids
                .iter()
                .filter(|id| !self.by_id.contains_key(**id))
                .map(|id| id.to_string())
                .collect();
        }
    }

    fn rewalk(&mut self) {
        self.by_id = walk(&self.root);
        self.walked = Some(Instant::now());
    }

    /// The cgroup directory of container `id`, walking the tree again when it is not known
    /// and the last walk is at least `every` old (a container's cgroup appears when it is
    /// created, and one walk finds every container that has one).
    pub fn find(&mut self, id: &str, every: Duration) -> Option<PathBuf> {
        if let Some(d) = self.by_id.get(id) {
            return Some(d.clone());
        }
        if self.walked.is_some_and(|t| t.elapsed() < every) {
            return None;
        }
        self.rewalk();
        self.missing.remove(id);
        self.by_id.get(id).cloned()
    }

    /// Forgets one container's directory (it was found gone).
    pub fn forget(&mut self, id: &str) {
        self.by_id.remove(id);
    }

    /// The cgroup directory of container `id`, as last walked.
    pub fn dir(&self, id: &str) -> Option<&Path> {
        self.by_id.get(id).map(PathBuf::as_path)
    }

    /// Forgets containers not in `live`.
    pub fn retain(&mut self, live: &dyn Fn(&str) -> bool) {
        self.by_id.retain(|id, _| live(id));
        self.missing.retain(|id| live(id));
    }
}

/// Every container directory under `root`, by id.
fn walk(root: &Path) -> HashMap<String, PathBuf> {
    let mut found = HashMap::new();
    let mut stack = vec![(root.to_path_buf(), 0usize)];
    let mut seen = 0usize;
    while let Some((dir, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            seen = seen.saturating_add(1);
            if seen > MAX_DIRS {
                return found;
            }
            let name = e.file_name();
            if let Some(id) = name.to_str().and_then(container_id) {
                found.insert(id.to_string(), e.path());
            } else if depth + 1 < MAX_DEPTH {
                stack.push((e.path(), depth + 1));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f1c2b9a8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3";

    #[test]
    fn ids_are_found_in_every_drivers_names() {
        assert_eq!(
            container_id(&format!("cri-containerd-{ID}.scope")),
            Some(ID)
        );
        assert_eq!(container_id(&format!("docker-{ID}.scope")), Some(ID));
        assert_eq!(container_id(ID), Some(ID));
        assert_eq!(container_id("kubepods-burstable-pod0b1c.slice"), None);
        // 65 hex digits or upper case: not an id.
        assert_eq!(container_id(&format!("{ID}0")), None);
        assert_eq!(container_id(&ID.to_uppercase()), None);
    }

    #[test]
    fn the_walk_finds_containers_under_both_drivers_layouts() {
        let root = std::env::temp_dir().join(format!("tap-cgroups-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let other = ID.replace('3', "7");
        let systemd = root.join(format!(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podx.slice/cri-containerd-{ID}.scope"
        ));
        let cgroupfs = root.join(format!("kubepods/besteffort/pody/{other}"));
        for d in [&systemd, &cgroupfs] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        let mut idx = CgroupIndex::new(&root);
        assert_eq!(idx.dir(ID), None, "not walked yet");
        idx.learn(&[ID, "missing"]);
        assert_eq!(idx.dir(ID), Some(systemd.as_path()));
        assert_eq!(idx.dir(&other), Some(cgroupfs.as_path()));
        assert_eq!(idx.dir("missing"), None);
        // A container whose cgroup the walk did not find causes no walk every round; a new
        // container does.
        let late = ID.replace('3', "9");
        std::fs::create_dir_all(root.join(format!("kubepods/pod-late/{late}"))).expect("mkdir");
        idx.learn(&[ID, "missing"]);
        assert_eq!(idx.dir(&late), None, "no walk for the missing one alone");
        idx.learn(&[ID, "missing", &late]);
        assert!(idx.dir(&late).is_some(), "a new id walks again");
        idx.retain(&|id| id == ID);
        assert_eq!(idx.by_id.len(), 1);
        assert!(idx.missing.is_empty());
        let _ = std::fs::remove_dir_all(&root);
    }
}
