//! Where sysfs files come from: a directory on disk, or an in-memory map in tests.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;

/// Where sysfs files come from.
pub trait FileSource {
    /// The file's text; `Err` with `NotFound` when it does not exist.
    fn read(&self, rel: &str) -> io::Result<String>;
    /// Entry names of a directory.
    fn list(&self, rel: &str) -> io::Result<Vec<String>>;
}

/// A sysfs tree on disk rooted at `root` (e.g. `/sys`).
#[derive(Debug, Clone)]
pub struct DirSource {
    pub root: PathBuf,
}

impl DirSource {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        DirSource { root: root.into() }
    }
}

impl FileSource for DirSource {
    fn read(&self, rel: &str) -> io::Result<String> {
        std::fs::read_to_string(self.root.join(rel))
    }
    fn list(&self, rel: &str) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(self.root.join(rel))? {
            out.push(e?.file_name().to_string_lossy().into_owned());
        }
        out.sort();
        Ok(out)
    }
}

/// An in-memory tree for tests: path -> content.
#[derive(Debug, Clone, Default)]
pub struct MapSource {
    pub files: BTreeMap<String, String>,
}

impl MapSource {
    pub fn with(mut self, path: &str, content: &str) -> Self {
        self.files.insert(path.to_string(), content.to_string());
        self
    }
}

impl FileSource for MapSource {
    fn read(&self, rel: &str) -> io::Result<String> {
        self.files
            .get(rel)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, rel.to_string()))
    }
    fn list(&self, rel: &str) -> io::Result<Vec<String>> {
        let prefix = format!("{}/", rel.trim_end_matches('/'));
        let mut out: Vec<String> = self
            .files
            .keys()
            .filter_map(|k| k.strip_prefix(&prefix))
            .map(|rest| rest.split('/').next().unwrap_or(rest).to_string())
            .collect();
        out.dedup();
        if out.is_empty() {
            return Err(io::Error::new(io::ErrorKind::NotFound, rel.to_string()));
        }
        Ok(out)
    }
}
