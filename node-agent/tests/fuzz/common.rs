//! Strategies shared by the property tests (each module uses a part of them).

use proptest::prelude::*;
use serde_json::{Number, Value};

/// An `i64` with the extremes and small values well represented.
pub fn edge_i64() -> impl Strategy<Value = i64> {
    prop_oneof![
        2 => any::<i64>(),
        1 => Just(i64::MIN),
        1 => Just(i64::MAX),
        1 => Just(0i64),
        1 => Just(-1i64),
        2 => 1i64..1_000_000,
    ]
}

/// A `u64` with the extremes (and the values just past `i64::MAX`) well represented.
pub fn edge_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        2 => any::<u64>(),
        1 => Just(u64::MAX),
        1 => Just(i64::MAX as u64),
        1 => Just(i64::MAX as u64 + 1),
        1 => Just(0u64),
        2 => 1u64..1_000_000,
    ]
}

/// A JSON value where a number is expected, with what it is made of (so a test knows what a
/// correct reader gets out of it).
#[derive(Debug, Clone)]
pub enum Num {
    U(u64),
    I(i64),
    F(f64),
    Str(String),
    Null,
    Bool(bool),
    Absent,
}

impl Num {
    /// The JSON value (`None` when the field is left out).
    pub fn json(&self) -> Option<Value> {
        Some(match self {
            Num::U(u) => Value::from(*u),
            Num::I(i) => Value::from(*i),
            Num::F(f) => Number::from_f64(*f).map_or(Value::Null, Value::Number),
            Num::Str(s) => Value::String(s.clone()),
            Num::Null => Value::Null,
            Num::Bool(b) => Value::Bool(*b),
            Num::Absent => return None,
        })
    }

    /// The value as an exact non-negative integer (what `as_u64` must give).
    pub fn exact_u64(&self) -> Option<u64> {
        match self {
            Num::U(u) => Some(*u),
            Num::I(i) => u64::try_from(*i).ok(),
            _ => None,
        }
    }

    /// The value as an exact `i64` (what `as_i64` must give).
    pub fn exact_i64(&self) -> Option<i64> {
        match self {
            Num::U(u) => i64::try_from(*u).ok(),
            Num::I(i) => Some(*i),
            _ => None,
        }
    }
}

/// Floats: fractional, integral-looking (`4096.0` is still a float), huge, negative.
pub fn edge_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        (-1_000_000i64..1_000_000, 0i32..4).prop_map(|(m, k)| m as f64 / 10f64.powi(k)),
        Just(4096.0),
        Just(-1.5),
        Just(0.5),
        Just(1e30),
        Just(1.8446744073709552e19), // u64::MAX + 1 as a float
        Just(f64::MAX),
        Just(-0.0),
    ]
}

pub fn num() -> impl Strategy<Value = Num> {
    prop_oneof![
        4 => edge_u64().prop_map(Num::U),
        4 => edge_i64().prop_map(Num::I),
        2 => edge_f64().prop_map(Num::F),
        1 => "[0-9-]{0,6}".prop_map(Num::Str),
        1 => Just(Num::Null),
        1 => any::<bool>().prop_map(Num::Bool),
        2 => Just(Num::Absent),
    ]
}

/// Short text of any characters (multi-byte UTF-8 included).
pub fn text() -> impl Strategy<Value = String> {
    prop_oneof![".{0,12}", "[a-z0-9/._-]{0,12}"]
}

/// Object keys: names the decoders look for, and others.
pub fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => proptest::sample::select(&[
            "HostConfig", "Labels", "Config", "Name", "Env", "CpuShares", "CpuQuota",
            "CpuPeriod", "Memory", "CgroupParent", "CpusetCpus", "CpusetMems", "Image",
            "runtimeSpec", "linux", "resources", "cpu", "shares", "quota", "period", "cpus",
            "mems", "memory", "limit", "process", "env", "config", "cgroup_parent",
            "io.kubernetes.pod.name", "io.kubernetes.container.name",
            "io.kubernetes.docker.type", "tap.kunpeng.huawei.com/grant",
        ][..]).prop_map(str::to_string),
        1 => ".{0,6}",
    ]
}

pub fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        edge_u64().prop_map(Value::from),
        edge_i64().prop_map(Value::from),
        edge_f64().prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
        text().prop_map(Value::String),
        Just(Value::String("container".into())),
    ]
}

/// A JSON tree of bounded depth and size.
pub fn json_value() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(4, 64, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            json_object_of(inner),
        ]
    })
}

pub fn json_object_of(inner: impl Strategy<Value = Value>) -> impl Strategy<Value = Value> {
    proptest::collection::vec((key(), inner), 0..6)
        .prop_map(|kv| Value::Object(kv.into_iter().collect()))
}

/// A JSON object at the top (what a create body is).
pub fn json_object() -> impl Strategy<Value = Value> {
    json_object_of(json_value())
}

/// A cpuset-like string (possibly empty).
pub fn cpuset() -> impl Strategy<Value = String> {
    prop_oneof![3 => "[0-9]{1,3}(-[0-9]{1,3})?(,[0-9]{1,3})?", 1 => Just(String::new())]
}

/// Ids in runs (`a-b` ranges and single ids) anywhere below the sets' limit, possibly none.
fn id_runs() -> impl Strategy<Value = Vec<usize>> {
    proptest::collection::vec((0..tap_engine::cpuset::MAX_IDS, 0usize..8), 0..4).prop_map(|runs| {
        runs.into_iter()
            .flat_map(|(start, len)| start..(start + len).min(tap_engine::cpuset::MAX_IDS))
            .collect()
    })
}

/// A CPU set as the engine hands it (possibly empty).
pub fn cpu_set() -> impl Strategy<Value = tap_engine::CpuSet> {
    id_runs().prop_map(tap_engine::CpuSet::from_ids)
}

/// A NUMA node set as the engine hands it (possibly empty).
pub fn node_set() -> impl Strategy<Value = tap_engine::NodeSet> {
    id_runs().prop_map(tap_engine::NodeSet::from_ids)
}

/// A cpuset as a runtime writes it: the kernel's list syntax, canonical, possibly empty.
pub fn cpuset_list() -> impl Strategy<Value = String> {
    cpu_set().prop_map(|s| s.to_string())
}

/// A set as its runtime wire string.
pub fn shown<T: std::fmt::Display>(o: Option<T>) -> Option<String> {
    o.map(|v| v.to_string())
}

/// An adjustment as the engine might hand it (any combination of the three parts).
pub fn adjustment() -> impl Strategy<Value = node_agent::Adjustment> {
    (
        proptest::option::of(cpu_set()),
        proptest::option::of(node_set()),
        proptest::option::of(text()),
    )
        .prop_map(|(cpus, mems, record)| node_agent::Adjustment {
            cpus,
            mems,
            record,
            updates: vec![],
        })
}
