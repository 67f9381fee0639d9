//! Parsers for single sysfs values: integer id files, `cpuN`/`nodeN` directory names and a
//! node's `meminfo`. None of them panics on any input (see the proptests below).

use super::error::DiscoveryError;
use crate::cpuset::ParseError;

pub(super) fn malformed(path: &str, what: String, content: &str) -> DiscoveryError {
    DiscoveryError::Malformed {
        path: path.to_string(),
        what,
        content: content.chars().take(120).collect(),
    }
}

/// A CPU list or mask that did not parse: an id beyond the set capacity is named as such.
pub(super) fn cpus_error(path: &str, text: &str, e: ParseError) -> DiscoveryError {
    match e {
        ParseError::TooLarge { id, .. } => DiscoveryError::CpuIdOutOfRange {
            path: path.to_string(),
            value: id.to_string(),
        },
        ParseError::Invalid { .. } => malformed(path, e.to_string(), text),
    }
}

/// An integer id file's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Id {
    Value(u64),
    /// -1: the kernel does not know (no clusters, no die information).
    Unknown,
    /// An integer, but negative (other than -1) or too large for 64 bits.
    OutOfRange,
    Malformed,
}

pub(super) fn parse_id(text: &str) -> Id {
    let t = text.trim();
    if t == "-1" {
        return Id::Unknown;
    }
    let digits = t.strip_prefix('-').unwrap_or(t);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Id::Malformed;
    }
    if t.starts_with('-') {
        return Id::OutOfRange;
    }
    digits.parse().map(Id::Value).unwrap_or(Id::OutOfRange)
}

/// The `N` of a `<prefix>N` directory name: `None` for other entries (`cpufreq`, `online`),
/// `Some(Err)` with the digits when N is not below `limit`.
pub(super) fn dir_id(name: &str, prefix: &str, limit: usize) -> Option<Result<usize, String>> {
    let digits = name.strip_prefix(prefix)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(match digits.parse::<usize>() {
        Ok(id) if id < limit => Ok(id),
        _ => Err(digits.chars().take(40).collect()),
    })
}

/// MemTotal of a node's `meminfo`, in bytes.
pub(super) fn parse_memtotal(path: &str, text: &str) -> Result<u64, DiscoveryError> {
    let Some(rest) = text
        .lines()
        .find_map(|line| line.split_once("MemTotal:").map(|(_, rest)| rest))
    else {
        return Err(malformed(path, "no MemTotal line".into(), text));
    };
    let number = rest.split_whitespace().next().unwrap_or("");
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed(
            path,
            "MemTotal is not a number of kB".into(),
            text,
        ));
    }
    number
        .parse::<u64>()
        .ok()
        .and_then(|kib| kib.checked_mul(1024))
        .ok_or_else(|| DiscoveryError::MemTotalOverflow {
            path: path.to_string(),
            kib: number.chars().take(40).collect(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpuset::MAX_IDS;
    use crate::nodeset::MAX_NODES;
    use proptest::prelude::*;

    #[test]
    fn ids() {
        assert_eq!(parse_id("3\n"), Id::Value(3));
        assert_eq!(parse_id(" -1\n"), Id::Unknown);
        assert_eq!(parse_id("-2"), Id::OutOfRange);
        assert_eq!(parse_id("18446744073709551616"), Id::OutOfRange);
        assert_eq!(parse_id("0x1"), Id::Malformed);
        assert_eq!(parse_id(""), Id::Malformed);
        assert_eq!(parse_id("-"), Id::Malformed);
        assert_eq!(dir_id("cpu12", "cpu", MAX_IDS), Some(Ok(12)));
        assert_eq!(dir_id("cpufreq", "cpu", MAX_IDS), None);
        assert_eq!(dir_id("cpu", "cpu", MAX_IDS), None);
        assert_eq!(dir_id("cpu1023", "cpu", MAX_IDS), Some(Ok(1023)));
        assert_eq!(dir_id("node127", "node", MAX_NODES), Some(Ok(127)));
        assert_eq!(
            dir_id("node128", "node", MAX_NODES),
            Some(Err("128".into()))
        );
    }

    #[test]
    fn memtotal() {
        let p = "node0/meminfo";
        assert_eq!(
            parse_memtotal(p, "Node 0 MemTotal:  1024 kB\n").unwrap(),
            1 << 20
        );
        let err = parse_memtotal(p, "Node 0 MemTotal: 18014398509481984 kB\n").unwrap_err();
        assert!(
            matches!(err, DiscoveryError::MemTotalOverflow { ref kib, .. } if kib == "18014398509481984"),
            "{err}"
        );
        for bad in ["", "MemTotal:", "MemTotal: -5 kB", "MemTotal: 1e9 kB"] {
            assert!(parse_memtotal(p, bad).is_err(), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn id_parser_never_panics(text in "\\PC*", n in any::<i128>()) {
            let _ = parse_id(&text);
            match parse_id(&n.to_string()) {
                Id::Value(v) => prop_assert_eq!(i128::from(v), n),
                Id::Unknown => prop_assert_eq!(n, -1),
                Id::OutOfRange => prop_assert!(n < -1 || n > i128::from(u64::MAX)),
                Id::Malformed => prop_assert!(false, "{} is an integer", n),
            }
        }

        #[test]
        fn dir_name_parser_never_panics(text in "\\PC*", n in any::<u128>()) {
            let _ = dir_id(&text, "cpu", MAX_IDS);
            let got = dir_id(&format!("node{n}"), "node", MAX_NODES);
            prop_assert_eq!(got.clone().map(|r| r.is_ok()), Some(n < MAX_NODES as u128), "{:?}", got);
        }

        #[test]
        fn meminfo_parser_never_panics(text in "\\PC*", kib in any::<u64>()) {
            let _ = parse_memtotal("meminfo", &text);
            let line = format!("Node 3 MemTotal: {kib} kB\nNode 3 MemFree: 1 kB\n");
            match parse_memtotal("meminfo", &line) {
                Ok(bytes) => prop_assert_eq!(u128::from(bytes), u128::from(kib) * 1024),
                Err(DiscoveryError::MemTotalOverflow { .. }) => prop_assert!(kib.checked_mul(1024).is_none()),
                Err(e) => prop_assert!(false, "{}", e),
            }
        }
    }
}
