//! Where sysfs files come from: a directory on disk, or an in-memory tree (a dump file's
//! content, or a tree a test builds).

mod dump;

pub use dump::{DumpError, DUMP_MAGIC};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io;
use std::ops::Bound;
use std::path::{Path, PathBuf};

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

/// How many symlinks one path may pass through, as the kernel's limit (then the read fails).
const MAX_LINK_HOPS: usize = 40;

/// An in-memory tree: files (path -> content), symlinks (path -> target) and empty directories;
/// other directories are implied by the paths under them. Paths are relative and
/// `/`-separated. Reading and listing follow symlinks as a reader of `/sys` does (relative
/// targets; an absolute one leads out of the tree and is not found). A dump file
/// ([`MapSource::from_dump`]) reads into one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MapSource {
    pub files: BTreeMap<String, String>,
    pub links: BTreeMap<String, String>,
    pub dirs: BTreeSet<String>,
}

impl MapSource {
    pub fn with(mut self, path: &str, content: &str) -> Self {
        self.files.insert(path.to_string(), content.to_string());
        self
    }

    /// With NUMA node `id`'s files: its `cpulist`, a `meminfo` of `mem_kib` kB and its
    /// `distance` line (`cpulist` and `distance` as sysfs writes them, without the newline).
    pub fn with_node(self, id: u32, cpulist: &str, mem_kib: u64, distance: &str) -> Self {
        let dir = format!("devices/system/node/node{id}");
        self.with(&format!("{dir}/cpulist"), &format!("{cpulist}\n"))
            .with(
                &format!("{dir}/meminfo"),
                &format!("Node {id} MemTotal: {mem_kib} kB\n"),
            )
            .with(&format!("{dir}/distance"), &format!("{distance}\n"))
    }

    /// `rel` with every symlink on its way replaced by its target: the path of the file or
    /// directory it names, without `.`, `..` or empty components.
    fn resolve(&self, rel: &str) -> io::Result<String> {
        if self.links.is_empty() {
            return Ok(rel.trim_end_matches('/').to_string());
        }
        let mut rest: VecDeque<&str> = rel.split('/').collect();
        let mut cur: Vec<&str> = Vec::new();
        let mut hops = 0;
        while let Some(c) = rest.pop_front() {
            match c {
                "" | "." => continue,
                ".." => {
                    cur.pop();
                    continue;
                }
                _ => cur.push(c),
            }
            let Some(target) = self.links.get(&cur.join("/")) else {
                continue;
            };
            hops += 1;
            if hops > MAX_LINK_HOPS {
                let what = format!("{rel}: too many levels of symbolic links");
                return Err(io::Error::new(io::ErrorKind::InvalidInput, what));
            }
            if target.starts_with('/') {
                let what = format!("{rel}: symlink to {target}, outside the tree");
                return Err(io::Error::new(io::ErrorKind::NotFound, what));
            }
            cur.pop();
            for t in target.split('/').rev() {
                rest.push_front(t);
            }
        }
        Ok(cur.join("/"))
    }
}

/// The names directly under `prefix` (which is empty or ends with `/`) among `keys`.
fn names_under<'a, V>(
    keys: &'a BTreeMap<String, V>,
    prefix: &'a str,
) -> impl Iterator<Item = &'a str> + 'a {
    keys.range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
        .map(|(k, _)| k.as_str())
        .take_while(move |k| k.starts_with(prefix))
        .filter_map(move |k| k[prefix.len()..].split('/').next())
}

impl FileSource for MapSource {
    fn read(&self, rel: &str) -> io::Result<String> {
        let path = self.resolve(rel)?;
        self.files
            .get(&path)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, rel.to_string()))
    }
    fn list(&self, rel: &str) -> io::Result<Vec<String>> {
        let path = self.resolve(rel)?;
        let prefix = if path.is_empty() {
            String::new()
        } else {
            format!("{path}/")
        };
        let mut out: BTreeSet<&str> = names_under(&self.files, &prefix).collect();
        out.extend(names_under(&self.links, &prefix));
        out.extend(
            self.dirs
                .range::<str, _>((Bound::Included(prefix.as_str()), Bound::Unbounded))
                .take_while(|k| k.starts_with(&prefix))
                .filter_map(|k| k[prefix.len()..].split('/').next()),
        );
        if out.is_empty() && !self.dirs.contains(&path) {
            return Err(io::Error::new(io::ErrorKind::NotFound, rel.to_string()));
        }
        Ok(out.into_iter().map(str::to_string).collect())
    }
}

/// A sysfs root as the agent's `--sysfs-root` names it: a directory (`/sys`, a copy of it), or
/// a dump file (the repository's fixtures, see [`MapSource::from_dump`]), read into memory.
#[derive(Debug, Clone)]
pub enum RootSource {
    Dir(DirSource),
    Dump(MapSource),
}

impl RootSource {
    /// A regular file at `root` is read as a dump; anything else is taken for a directory (and
    /// fails, if it is none, when discovery reads it).
    pub fn open(root: &Path) -> io::Result<RootSource> {
        if !root.is_file() {
            return Ok(RootSource::Dir(DirSource::new(root)));
        }
        let text = std::fs::read_to_string(root)?;
        MapSource::from_dump(&text)
            .map(RootSource::Dump)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }
}

impl FileSource for RootSource {
    fn read(&self, rel: &str) -> io::Result<String> {
        match self {
            RootSource::Dir(d) => d.read(rel),
            RootSource::Dump(m) => m.read(rel),
        }
    }
    fn list(&self, rel: &str) -> io::Result<Vec<String>> {
        match self {
            RootSource::Dir(d) => d.list(rel),
            RootSource::Dump(m) => m.list(rel),
        }
    }
}
