//! The per-Pod (or per-container) choices read from annotations: one table names each key,
//! how its value is read and what it expects.

use super::{
    CoreGrain, MemoryTypes, NumaPolicy, PolicyKind, CONFINE_BEST_EFFORT_KEY, EXCLUSIVE_CORES_KEY,
    EXCLUSIVE_KEY, HIDE_HYPERTHREADS_KEY, LEVEL_KEY, MEMORY_BINDING_KEY, MEMORY_TYPE_KEY,
    NUMA_POLICY_KEY, POLICY_KEY, RESERVED_CPUS_KEY, SKIP_KEY,
};
use crate::names::{one_of, one_of_names, Named};
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

/// How an annotation's value sets its override: `None` for a value it does not know.
type Apply = fn(&mut Overrides, &str) -> Option<()>;
/// What an annotation expects, for the warning about a value it does not know.
type Expected = fn() -> String;

/// Every annotation override, in the order they are read (and warned about): its key, how a
/// value sets it and what it expects.
#[rustfmt::skip]
const ANNOTATIONS: [(&str, Apply, Expected); 10] = [
    (POLICY_KEY, set_policy, || one_of(&[PolicyKind::NAMES, &["none"]].concat())),
    (LEVEL_KEY, |o, v| read(&mut o.level, v), one_of_names::<Level>),
    (NUMA_POLICY_KEY, |o, v| read(&mut o.numa_policy, v), one_of_names::<NumaPolicy>),
    (EXCLUSIVE_CORES_KEY, |o, v| read(&mut o.exclusive_cores, v), one_of_names::<CoreGrain>),
    (MEMORY_TYPE_KEY, |o, v| set(&mut o.memory_types, MemoryTypes::parse(v)), memory_types),
    (HIDE_HYPERTHREADS_KEY, |o, v| flag(&mut o.hide_hyperthreads, v), true_or_false),
    (MEMORY_BINDING_KEY, |o, v| flag(&mut o.memory_binding, v), true_or_false),
    (EXCLUSIVE_KEY, |o, v| flag(&mut o.exclusive, v), true_or_false),
    (CONFINE_BEST_EFFORT_KEY, |o, v| flag(&mut o.confine_best_effort, v), true_or_false),
    (RESERVED_CPUS_KEY, |o, v| flag(&mut o.reserved_cpus, v), true_or_false),
];

/// `policy`: a policy, or `none` (or `skip`) for no placement at all.
fn set_policy(o: &mut Overrides, v: &str) -> Option<()> {
    match v.trim() {
        "none" | "skip" => {
            o.skip = true;
            Some(())
        }
        other => set(&mut o.policy, PolicyKind::parse(other)),
    }
}

/// Puts a value read into its slot; `None` when there was none.
fn set<T>(slot: &mut Option<T>, read: Option<T>) -> Option<()> {
    *slot = Some(read?);
    Some(())
}

/// A setting's name into its slot.
fn read<T: Named>(slot: &mut Option<T>, v: &str) -> Option<()> {
    set(slot, T::parse(v))
}

/// `true`, `yes`, `on`, `1` or their opposites into a yes/no slot.
fn flag(slot: &mut Option<bool>, v: &str) -> Option<()> {
    let yes = match v.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" => true,
        "false" | "no" | "off" | "0" => false,
        _ => return None,
    };
    *slot = Some(yes);
    Some(())
}

fn true_or_false() -> String {
    "true or false".into()
}

fn memory_types() -> String {
    "a comma-separated list of dram, pmem, cxl, hbm".into()
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
        for (key, apply, expected) in ANNOTATIONS {
            let Some((key, value)) = lookup(key) else {
                continue;
            };
            if apply(&mut o, value).is_none() {
                warnings.push(AnnotationWarning {
                    key,
                    value: value.clone(),
                    expected: expected(),
                });
            }
        }
        (o, warnings)
    }
}
