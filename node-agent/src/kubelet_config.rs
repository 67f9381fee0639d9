//! The kubelet's reserved CPUs (`reservedSystemCPUs`), read from its KubeletConfiguration file
//! (`--kubelet-config`, YAML or JSON): united with `--reserved-cpus` so that the CPUs the
//! kubelet keeps for system daemons are in no pool here either. Fails open: a missing file or
//! bad content is logged and counts as no CPUs.

use std::io::Read;
use std::path::Path;
use tap_engine::CpuSet;

/// A kubelet configuration is a few KiB; anything past this is not one.
const MAX_BYTES: u64 = 1 << 20;

/// Why the kubelet's reserved CPUs could not be read.
#[derive(Debug, thiserror::Error)]
pub enum KubeletConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is larger than {MAX_BYTES} bytes: not a kubelet configuration")]
    TooLarge { path: String },
    #[error("not YAML or JSON: {0}")]
    Syntax(#[from] serde_yaml::Error),
    #[error("not a mapping of fields: not a KubeletConfiguration")]
    NotAMapping,
    #[error("kind {0:?}: not a KubeletConfiguration")]
    Kind(String),
    #[error("reservedSystemCPUs: expected a CPU list such as \"0-1\", got {0}")]
    NotAList(String),
    #[error("reservedSystemCPUs: {0}")]
    Cpus(#[from] tap_engine::cpuset::ParseError),
}

/// The `reservedSystemCPUs` of a KubeletConfiguration document (empty when it has none).
pub fn parse(text: &str) -> Result<CpuSet, KubeletConfigError> {
    use serde_yaml::Value;
    let doc: Value = serde_yaml::from_str(text)?;
    if !doc.is_mapping() {
        return Err(KubeletConfigError::NotAMapping);
    }
    if let Some(kind) = doc.get("kind") {
        let kind = kind.as_str().unwrap_or_default();
        if kind != "KubeletConfiguration" {
            return Err(KubeletConfigError::Kind(kind.to_string()));
        }
    }
    match doc.get("reservedSystemCPUs") {
        None | Some(Value::Null) => Ok(CpuSet::new()),
        Some(Value::String(s)) => Ok(CpuSet::parse(s)?),
        // `reservedSystemCPUs: 3` is a YAML number, but a CPU list all the same.
        Some(Value::Number(n)) if n.is_u64() => Ok(CpuSet::parse(&n.to_string())?),
        Some(other) => Err(KubeletConfigError::NotAList(
            serde_yaml::to_string(other)
                .unwrap_or_default()
                .trim()
                .to_string(),
        )),
    }
}

/// Reads and parses the file at `path` (at most [`MAX_BYTES`]).
pub fn read(path: &Path) -> Result<CpuSet, KubeletConfigError> {
    let shown = || path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| KubeletConfigError::Read {
        path: shown(),
        source,
    })?;
    let mut text = String::new();
    file.take(MAX_BYTES.saturating_add(1))
        .read_to_string(&mut text)
        .map_err(|source| KubeletConfigError::Read {
            path: shown(),
            source,
        })?;
    if text.len() as u64 > MAX_BYTES {
        return Err(KubeletConfigError::TooLarge { path: shown() });
    }
    parse(&text)
}

/// The kubelet's reserved CPUs from `path` (none without a path); any failure is logged and
/// gives none.
pub fn reserved_system_cpus(path: Option<&Path>) -> CpuSet {
    let Some(path) = path else {
        return CpuSet::new();
    };
    match read(path) {
        Ok(cpus) => {
            tracing::info!(path = %path.display(), reserved = %cpus, "the kubelet's reservedSystemCPUs");
            cpus
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), "kubelet configuration ignored: {e}");
            CpuSet::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn testdata(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/kubelet")
            .join(name)
    }

    #[test]
    fn real_shaped_configurations_give_their_reserved_cpus() {
        assert_eq!(
            read(&testdata("config.yaml")).unwrap().to_string(),
            "0-1,64"
        );
        assert_eq!(read(&testdata("config.json")).unwrap().to_string(), "2-3");
        assert!(read(&testdata("no-reserved.yaml")).unwrap().is_empty());
        assert_eq!(
            parse("kind: KubeletConfiguration\nreservedSystemCPUs: 3\n")
                .unwrap()
                .to_string(),
            "3"
        );
        assert!(parse("reservedSystemCPUs: \"\"").unwrap().is_empty());
    }

    #[test]
    fn bad_content_is_an_error_and_the_agent_carries_on_without() {
        for (name, what) in [
            ("bad-cpus.yaml", "reservedSystemCPUs"),
            ("not-kubelet.yaml", "KubeProxyConfiguration"),
            ("missing.yaml", "reading"),
        ] {
            let e = read(&testdata(name)).unwrap_err().to_string();
            assert!(e.contains(what), "{name}: {e}");
            assert!(reserved_system_cpus(Some(&testdata(name))).is_empty());
        }
        for text in [
            "{not: [yaml",
            "reservedSystemCPUs: [0, 1]",
            "reservedSystemCPUs: -1",
            "- a list",
            "",
        ] {
            assert!(parse(text).is_err(), "{text}");
        }
        assert!(reserved_system_cpus(None).is_empty());
    }

    #[test]
    fn a_huge_file_is_refused_unread() {
        let dir = std::env::temp_dir().join(format!("tap-kubelet-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("big.yaml");
        std::fs::write(&path, "#".repeat((MAX_BYTES + 10) as usize)).unwrap();
        assert!(matches!(
            read(&path),
            Err(KubeletConfigError::TooLarge { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
