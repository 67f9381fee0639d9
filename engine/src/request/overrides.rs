//! The per-Pod (or per-container) choices read from annotations: one table names each key,
//! how its value is read and what it expects.

use super::{
    CoreGrain, MemoryTypes, NumaPolicy, PolicyKind, CONFINE_BEST_EFFORT_KEY, EXCLUSIVE_CORES_KEY,
    EXCLUSIVE_KEY, HIDE_HYPERTHREADS_KEY, LEVEL_KEY, MEMORY_BINDING_KEY, MEMORY_TYPE_KEY,
    NUMA_POLICY_KEY, POLICY_KEY, RESERVED_CPUS_KEY, SKIP_KEY,
};
use crate::names::one_of;
use crate::topology::Level;
use std::collections::HashMap;
use std::fmt;

/// Per-Pod (or per-container) choices read from annotations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    pub skip: bool,
    pub policy: Option<PolicyKind>,
    pub level: Option<Level>,
    pub numa_policy: Option<NumaPolicy>,
    pub memory_binding: Option<bool>,
    pub exclusive: Option<bool>,
    pub confine_best_effort: Option<bool>,
    pub exclusive_cores: Option<CoreGrain>,
    pub hide_hyperthreads: Option<bool>,
    pub memory_types: Option<MemoryTypes>,
    /// `reserved-cpus`: asks for (or, in a listed namespace, declines) the reserved CPUs.
    pub reserved_cpus: Option<bool>,
}

/// A problem with an annotation: its value was ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnotationWarning {
    pub key: String,
    pub value: String,
    pub expected: String,
}

impl fmt::Display for AnnotationWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ignoring annotation {}={:?}: expected {}",
            self.key, self.value, self.expected
        )
    }
}

/// One annotation override: its key, how a value sets it (`None`: a value it does not know)
/// and what it expects.
struct Annotation {
    key: &'static str,
    apply: fn(&mut Overrides, &str) -> Option<()>,
    expected: fn() -> String,
}

/// Every annotation override, in the order they are read (and warned about).
const ANNOTATIONS: [Annotation; 10] = [
    Annotation {
        key: POLICY_KEY,
        apply: |o, v| match v.trim() {
            "none" | "skip" => {
                o.skip = true;
                Some(())
            }
            other => set(&mut o.policy, PolicyKind::parse(other)),
        },
        expected: || one_of(&[PolicyKind::NAMES, &["none"]].concat()),
    },
    Annotation {
        key: LEVEL_KEY,
        apply: |o, v| set(&mut o.level, Level::parse(v)),
        expected: || one_of(Level::NAMES),
    },
    Annotation {
        key: NUMA_POLICY_KEY,
        apply: |o, v| set(&mut o.numa_policy, NumaPolicy::parse(v)),
        expected: || one_of(NumaPolicy::NAMES),
    },
    Annotation {
        key: EXCLUSIVE_CORES_KEY,
        apply: |o, v| set(&mut o.exclusive_cores, CoreGrain::parse(v)),
        expected: || one_of(CoreGrain::NAMES),
    },
    Annotation {
        key: MEMORY_TYPE_KEY,
        apply: |o, v| set(&mut o.memory_types, MemoryTypes::parse(v)),
        expected: || "a comma-separated list of dram, pmem, cxl, hbm".into(),
    },
    Annotation {
        key: HIDE_HYPERTHREADS_KEY,
        apply: |o, v| set(&mut o.hide_hyperthreads, parse_bool(v)),
        expected: true_or_false,
    },
    Annotation {
        key: MEMORY_BINDING_KEY,
        apply: |o, v| set(&mut o.memory_binding, parse_bool(v)),
        expected: true_or_false,
    },
    Annotation {
        key: EXCLUSIVE_KEY,
        apply: |o, v| set(&mut o.exclusive, parse_bool(v)),
        expected: true_or_false,
    },
    Annotation {
        key: CONFINE_BEST_EFFORT_KEY,
        apply: |o, v| set(&mut o.confine_best_effort, parse_bool(v)),
        expected: true_or_false,
    },
    Annotation {
        key: RESERVED_CPUS_KEY,
        apply: |o, v| set(&mut o.reserved_cpus, parse_bool(v)),
        expected: true_or_false,
    },
];

/// Puts a value read into its slot; `None` when there was none.
fn set<T>(slot: &mut Option<T>, read: Option<T>) -> Option<()> {
    *slot = Some(read?);
    Some(())
}

fn true_or_false() -> String {
    "true or false".into()
}

fn parse_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" => Some(true),
        "false" | "no" | "off" | "0" => Some(false),
        _ => None,
    }
}

impl Overrides {
    /// Reads the overrides for container `container` of a Pod. For every key `K`, the
    /// container-specific annotation `K.<container>` wins over `K`. The skip key is honoured as
    /// a label or an annotation. Values that do not parse are ignored and reported.
    pub fn from_pod(
        labels: &HashMap<String, String>,
        annotations: &HashMap<String, String>,
        container: &str,
    ) -> (Overrides, Vec<AnnotationWarning>) {
        let lookup = |key: &str| -> Option<(String, &String)> {
            let specific = format!("{key}.{container}");
            if let Some(v) = annotations.get(&specific) {
                return Some((specific, v));
            }
            annotations.get(key).map(|v| (key.to_string(), v))
        };
        let mut o = Overrides {
            skip: labels.contains_key(SKIP_KEY) || lookup(SKIP_KEY).is_some(),
            ..Overrides::default()
        };
        let mut warnings = Vec::new();
        for a in &ANNOTATIONS {
            let Some((key, value)) = lookup(a.key) else {
                continue;
            };
            if (a.apply)(&mut o, value).is_none() {
                warnings.push(AnnotationWarning {
                    key,
                    value: value.clone(),
                    expected: (a.expected)(),
                });
            }
        }
        (o, warnings)
    }
}
