//! A sysfs tree as one text file: the format of the repository's fixtures (`fixtures/sysfs/*`,
//! described in the README there; `hack/sysfsdump.py` writes and reads it too).
//!
//! ```text
//! # tap sysfs dump 1
//! file devices/system/cpu/online
//! |0-95
//! link devices/system/cpu/cpu0/node0 -> ../../node/node0
//! file devices/system/cpu/isolated
//! file some/value/without/newline
//! |42
//! \ no newline at end of file
//! dir some/empty/folder
//! ```
//!
//! After the first line, each entry is a header line (`file PATH`, `link PATH -> TARGET`,
//! `dir PATH` for an empty folder) in the byte order of the paths; a file's content follows as
//! lines `|TEXT`, each standing for TEXT and a newline, and the line
//! `\ no newline at end of file` after the last of them when the file does not end with one.
//! Lines starting with `#` between entries are comments.

use super::MapSource;
use std::io;
use std::path::Path;

/// The first line of every dump.
pub const DUMP_MAGIC: &str = "# tap sysfs dump 1";
const NO_EOL: &str = "\\ no newline at end of file";

/// A dump that cannot be read: the line (1-based) and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("sysfs dump, line {line}: {what}")]
pub struct DumpError {
    pub line: usize,
    pub what: String,
}

fn err(line: usize, what: impl Into<String>) -> DumpError {
    DumpError {
        line,
        what: what.into(),
    }
}

/// Whether `path` is one the format holds: relative, `/`-separated, no empty, `.` or `..`
/// component, no ` -> `.
fn valid_path(path: &str) -> bool {
    !path.is_empty()
        && !path.contains(" -> ")
        && path.split('/').all(|c| !matches!(c, "" | "." | ".."))
}

impl MapSource {
    /// Reads a dump (the whole file's text).
    pub fn from_dump(text: &str) -> Result<MapSource, DumpError> {
        let Some(body) = text.strip_suffix('\n') else {
            return Err(err(
                text.lines().count(),
                "the dump does not end with a newline",
            ));
        };
        let mut lines = body.split('\n').enumerate().map(|(i, l)| (i + 1, l));
        if lines.next().map(|(_, l)| l) != Some(DUMP_MAGIC) {
            return Err(err(1, format!("not {DUMP_MAGIC:?}")));
        }
        let mut m = MapSource::default();
        let mut open: Option<&mut String> = None;
        for (n, line) in lines {
            if let Some(content) = open.as_mut() {
                if let Some(text) = line.strip_prefix('|') {
                    content.push_str(text);
                    content.push('\n');
                    continue;
                }
                if line == NO_EOL && content.pop().is_some() {
                    open = None;
                    continue;
                }
            }
            open = None;
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
            let (path, target) = match kind {
                "link" => match rest.split_once(" -> ") {
                    Some((p, t)) => (p, Some(t)),
                    None => return Err(err(n, "a link without \" -> \"")),
                },
                "file" | "dir" => (rest, None),
                _ => return Err(err(n, format!("unexpected {:?}", cut(line)))),
            };
            if !valid_path(path) {
                return Err(err(n, format!("not a relative path: {:?}", cut(path))));
            }
            if m.files.contains_key(path) || m.links.contains_key(path) || m.dirs.contains(path) {
                return Err(err(n, format!("{path} twice")));
            }
            if let Some(up) = ancestor_entry(&m, path) {
                return Err(err(n, format!("{path} is under {up}, not a folder")));
            }
            match (kind, target) {
                ("link", Some(t)) => {
                    m.links.insert(path.to_string(), t.to_string());
                }
                ("dir", _) => {
                    m.dirs.insert(path.to_string());
                }
                _ => open = Some(m.files.entry(path.to_string()).or_default()),
            }
        }
        Ok(m)
    }

    /// The dump of this tree: [`MapSource::from_dump`] of it gives the tree back.
    pub fn to_dump(&self) -> String {
        let mut entries: Vec<(&str, Option<&str>)> = Vec::new();
        entries.extend(self.files.keys().map(|p| (p.as_str(), None)));
        entries.extend(
            self.links
                .iter()
                .map(|(p, t)| (p.as_str(), Some(t.as_str()))),
        );
        entries.extend(self.dirs.iter().map(|p| (p.as_str(), None)));
        entries.sort_unstable();
        let mut out = format!("{DUMP_MAGIC}\n");
        for (path, target) in entries {
            if let Some(t) = target {
                out.push_str(&format!("link {path} -> {t}\n"));
            } else if let Some(content) = self.files.get(path) {
                out.push_str(&format!("file {path}\n"));
                for line in content.split_inclusive('\n') {
                    out.push('|');
                    out.push_str(line);
                }
                if !content.is_empty() && !content.ends_with('\n') {
                    out.push('\n');
                    out.push_str(NO_EOL);
                    out.push('\n');
                }
            } else {
                out.push_str(&format!("dir {path}\n"));
            }
        }
        out
    }

    /// Writes the tree under `dir` (created, with its parents): files, symlinks, empty folders.
    pub fn write_tree(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)?;
        for d in &self.dirs {
            std::fs::create_dir_all(dir.join(d))?;
        }
        for (path, content) in &self.files {
            let p = dir.join(path);
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(p, content)?;
        }
        for (path, target) in &self.links {
            let p = dir.join(path);
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent)?;
            }
            symlink(target, &p)?;
        }
        Ok(())
    }
}

#[cfg(unix)]
fn symlink(target: &str, link: &Path) -> io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

#[cfg(not(unix))]
fn symlink(_target: &str, link: &Path) -> io::Result<()> {
    let what = format!("{}: symlinks are written on Unix only", link.display());
    Err(io::Error::new(io::ErrorKind::Unsupported, what))
}

/// A file or link already in `m` that one of `path`'s parent folders would be.
fn ancestor_entry<'a>(m: &MapSource, path: &'a str) -> Option<&'a str> {
    path.match_indices('/')
        .map(|(i, _)| &path[..i])
        .find(|up| m.files.contains_key(*up) || m.links.contains_key(*up))
}

/// At most 40 characters of `s`, for error messages.
fn cut(s: &str) -> String {
    s.chars().take(40).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::FileSource;

    const DUMP: &str = "# tap sysfs dump 1\n\
        file a/empty\n\
        file a/noeol\n|x\n|y\n\\ no newline at end of file\n\
        file a/one\n|1\n\
        file a/two-newlines\n|\n|\n\
        dir a/void\n\
        link b -> a\n\
        link c/d -> ../b/one\n";

    #[test]
    fn round_trips_files_links_and_empty_folders() {
        let m = MapSource::from_dump(DUMP).unwrap();
        assert_eq!(m.files["a/empty"], "");
        assert_eq!(m.files["a/noeol"], "x\ny");
        assert_eq!(m.files["a/two-newlines"], "\n\n");
        assert_eq!(m.to_dump(), DUMP);
        assert_eq!(m.read("c/d").unwrap(), "1\n");
        assert_eq!(m.read("b/noeol").unwrap(), "x\ny");
        assert_eq!(
            m.list("b").unwrap(),
            ["empty", "noeol", "one", "two-newlines", "void"]
        );
        assert_eq!(m.list("a/void").unwrap(), Vec::<String>::new());
        assert_eq!(m.list("").unwrap(), ["a", "b", "c"]);
        assert_eq!(m.read("b/../a/one").unwrap(), "1\n");
        assert!(m.read("a/missing").is_err());
        assert!(m.list("a/one").is_err());
    }

    #[test]
    fn the_tree_on_disk_reads_back_the_same() {
        let m = MapSource::from_dump(DUMP).unwrap();
        let dir = std::env::temp_dir().join(format!("tap-dump-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        m.write_tree(&dir).unwrap();
        let disk = crate::source::DirSource::new(&dir);
        assert_eq!(disk.read("c/d").unwrap(), "1\n");
        assert_eq!(disk.read("a/noeol").unwrap(), "x\ny");
        assert_eq!(disk.list("b").unwrap(), m.list("b").unwrap());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn loops_and_bad_lines_are_errors() {
        let looped = MapSource::from_dump("# tap sysfs dump 1\nlink x -> y\nlink y -> x\n");
        assert!(looped.unwrap().read("x/z").is_err());
        for (bad, line) in [
            ("# tap sysfs dump 2\n", 1),
            ("# tap sysfs dump 1", 1),
            ("# tap sysfs dump 1\n|x\n", 2),
            ("# tap sysfs dump 1\nfile a\nfile a\n", 3),
            ("# tap sysfs dump 1\nfile a\nfile a/b\n", 3),
            ("# tap sysfs dump 1\nfile ../a\n", 2),
            ("# tap sysfs dump 1\nlink a\n", 2),
            (
                "# tap sysfs dump 1\nfile a\n\\ no newline at end of file\n",
                3,
            ),
        ] {
            let e = MapSource::from_dump(bad).unwrap_err();
            assert_eq!(e.line, line, "{bad:?}: {e}");
        }
    }
}
