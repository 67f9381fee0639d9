//! The ledger's file: grant records that changed after a container was created (a runtime
//! cannot change the label or annotation it stored at create), so a restarted agent reads back
//! exactly what it decided.
//!
//! Written whole from memory (never read-modify-write), atomically: a temporary file in the
//! same folder, fsync, rename, fsync of the folder. The file is 0600 in a 0700 folder. A file
//! that cannot be read is moved aside (`*.corrupt`) and reported; the caller rebuilds the state
//! from the runtime.

use std::collections::BTreeMap;
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Engine key -> grant record.
pub type Records = BTreeMap<String, String>;

/// Largest file accepted (a record is ~100 bytes; 1 MiB holds ~10,000 containers).
pub const MAX_FILE: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is {size} bytes, more than the {MAX_FILE} a state file can be")]
    TooLarge { path: PathBuf, size: u64 },
    #[error("{path} is not the JSON the agent writes there: {source}")]
    Corrupt {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

pub struct StateFile {
    path: PathBuf,
}

impl StateFile {
    pub fn new(path: PathBuf) -> StateFile {
        StateFile { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The records, empty when there is no file yet.
    pub fn load(&self) -> Result<Records, StateFileError> {
        self.load_as()
    }

    /// What the file holds as `T` (its default when there is no file yet): the same checks,
    /// for another file of the state folder.
    pub fn load_as<T: serde::de::DeserializeOwned + Default>(&self) -> Result<T, StateFileError> {
        let read_err = |source| StateFileError::Read {
            path: self.path.clone(),
            source,
        };
        let meta = match fs::metadata(&self.path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(T::default()),
            Err(e) => return Err(read_err(e)),
        };
        if meta.len() > MAX_FILE {
            return Err(StateFileError::TooLarge {
                path: self.path.clone(),
                size: meta.len(),
            });
        }
        let bytes = fs::read(&self.path).map_err(read_err)?;
        serde_json::from_slice(&bytes).map_err(|source| StateFileError::Corrupt {
            path: self.path.clone(),
            source,
        })
    }

    /// Moves an unreadable file aside so the next write does not destroy what it held.
    pub fn quarantine(&self) -> Option<PathBuf> {
        let aside = self.path.with_extension("json.corrupt");
        fs::rename(&self.path, &aside).ok().map(|_| aside)
    }

    /// Replaces the file with `records`, atomically.
    pub fn save(&self, records: &Records) -> Result<(), StateFileError> {
        self.save_as(records)
    }

    /// Replaces the file with `value` as JSON, atomically.
    pub fn save_as<T: serde::Serialize>(&self, value: &T) -> Result<(), StateFileError> {
        self.write(value).map_err(|source| StateFileError::Write {
            path: self.path.clone(),
            source,
        })
    }

    fn write<T: serde::Serialize>(&self, records: &T) -> std::io::Result<()> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
        let body = serde_json::to_vec_pretty(records).map_err(std::io::Error::other)?;
        let tmp = self.path.with_extension("json.tmp");
        {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            // An old temporary file keeps its mode: set it.
            f.set_permissions(fs::Permissions::from_mode(0o600))?;
            f.write_all(&body)?;
            f.sync_all()?;
        }
        fs::rename(&tmp, &self.path)?;
        File::open(dir)?.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tap-state-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn round_trip_is_private_and_atomic() {
        let dir = temp("rt");
        let f = StateFile::new(dir.join("sub/grants.json"));
        assert!(f.load().unwrap().is_empty());
        let mut r = Records::new();
        r.insert("a".into(), "v1;x".into());
        r.insert("b".into(), "v1;y".into());
        f.save(&r).unwrap();
        assert_eq!(f.load().unwrap(), r);
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(f.path()), 0o600);
        assert_eq!(mode(&dir.join("sub")), 0o700);
        assert!(!dir.join("sub/grants.json.tmp").exists());
        r.remove("a");
        f.save(&r).unwrap();
        assert_eq!(f.load().unwrap(), r);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_corrupt_file_is_an_error_and_is_kept_aside() {
        let dir = temp("bad");
        fs::create_dir_all(&dir).unwrap();
        let f = StateFile::new(dir.join("grants.json"));
        fs::write(f.path(), "{not json").unwrap();
        let e = f.load().unwrap_err();
        assert!(matches!(e, StateFileError::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("grants.json"), "{e}");
        let aside = f.quarantine().unwrap();
        assert_eq!(fs::read_to_string(aside).unwrap(), "{not json");
        assert!(f.load().unwrap().is_empty());
        fs::write(f.path(), vec![b' '; (MAX_FILE + 1) as usize]).unwrap();
        assert!(matches!(f.load(), Err(StateFileError::TooLarge { .. })));
        let _ = fs::remove_dir_all(&dir);
    }
}
