//! The workload trace format (JSON) and its validation.
//!
//! ```json
//! {
//!   "name": "example",
//!   "description": "free text",
//!   "warmup_s": 30.0,
//!   "pods": [
//!     {
//!       "name": "web-0", "namespace": "default", "qos": "Burstable",
//!       "arrival_s": 0.0, "departure_s": 600.0,
//!       "annotations": { "tap.kunpeng.huawei.com/memory-binding": "true" },
//!       "containers": [
//!         { "name": "app", "cpu_request": "500m", "cpu_limit": 2,
//!           "memory_limit": "1Gi", "gpus": 0 }
//!       ]
//!     }
//!   ]
//! }
//! ```
//!
//! - `cpu_request` / `cpu_limit`: a Kubernetes CPU quantity, as a string (`"250m"`, `"2"`,
//!   `"1.5"`) or a number of CPUs (`2`, `0.5`). Missing = not set.
//! - `memory_limit`: bytes as a number, or a string with a Kubernetes suffix
//!   (`Ki Mi Gi Ti`, `k M G T`).
//! - `qos`: `Guaranteed`, `Burstable` or `BestEffort`; it must agree with the containers'
//!   resources by the Kubernetes rules (Guaranteed: every container has a CPU limit equal to
//!   its request; BestEffort: no container sets a CPU request, CPU limit or memory limit).
//!   A container of a Guaranteed Pod without a request takes its limit as the request, as the
//!   API server defaults it.
//! - `arrival_s`, `departure_s`: seconds from the start of the trace; `departure_s` missing or
//!   `null` = the Pod lives until the end.
//! - `gpus`: number of GPUs the container asks for; the simulator hands out the machine's free
//!   GPUs in PCI address order (as a device plugin without topology hints would) and passes their
//!   NUMA nodes to the engine as device hints. A request that cannot be met gets no GPU.
//! - `warmup_s` (optional, default 0): time-averaged figures (imbalance, overcommit) are taken
//!   from this time to the last arrival, so an empty machine filling up does not count.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use tap_engine::Qos;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trace {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default)]
    pub warmup_s: f64,
    pub pods: Vec<PodSpec>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodSpec {
    pub name: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    pub qos: QosName,
    pub arrival_s: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub departure_s: Option<f64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    pub containers: Vec<ContainerSpec>,
}

fn default_namespace() -> String {
    "default".to_string()
}

/// QoS class as spelled in a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum QosName {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl From<QosName> for Qos {
    fn from(q: QosName) -> Qos {
        match q {
            QosName::Guaranteed => Qos::Guaranteed,
            QosName::Burstable => Qos::Burstable,
            QosName::BestEffort => Qos::BestEffort,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerSpec {
    pub name: String,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "cpu_quantity"
    )]
    pub cpu_request: Option<u64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "cpu_quantity"
    )]
    pub cpu_limit: Option<u64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "memory_quantity"
    )]
    pub memory_limit: Option<u64>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gpus: u32,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TraceError {
    #[error("trace is not valid JSON for the trace format: {0}")]
    Json(String),
    #[error("pod {pod}: {what}")]
    Pod { pod: String, what: String },
}

impl Trace {
    pub fn parse(text: &str) -> Result<Trace, TraceError> {
        let t: Trace = serde_json::from_str(text).map_err(|e| TraceError::Json(e.to_string()))?;
        t.validate()?;
        Ok(t)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Checks times, names and that each Pod's QoS agrees with its resources.
    pub fn validate(&self) -> Result<(), TraceError> {
        let mut names = std::collections::HashSet::new();
        for p in &self.pods {
            let err = |what: String| TraceError::Pod {
                pod: p.name.clone(),
                what,
            };
            if !names.insert((p.namespace.as_str(), p.name.as_str())) {
                return Err(err("duplicate pod name".into()));
            }
            if !p.arrival_s.is_finite() || p.arrival_s < 0.0 {
                return Err(err(format!("bad arrival_s {}", p.arrival_s)));
            }
            if let Some(d) = p.departure_s {
                if !d.is_finite() || d < p.arrival_s {
                    return Err(err(format!("departure_s {d} before arrival_s")));
                }
            }
            if p.containers.is_empty() {
                return Err(err("no containers".into()));
            }
            for c in &p.containers {
                if let (Some(r), Some(l)) = (c.cpu_request, c.cpu_limit) {
                    if r > l {
                        return Err(err(format!(
                            "container {}: cpu_request {r}m above cpu_limit {l}m",
                            c.name
                        )));
                    }
                }
            }
            let implied = implied_qos(&p.containers);
            if implied != p.qos {
                return Err(err(format!(
                    "qos {:?} does not match the resources (they make it {:?})",
                    p.qos, implied
                )));
            }
        }
        Ok(())
    }

    /// Time of the last arrival (the end of the measured window).
    pub fn last_arrival(&self) -> f64 {
        self.pods.iter().map(|p| p.arrival_s).fold(0.0, f64::max)
    }
}

/// The QoS class Kubernetes gives a Pod with these containers (CPU and memory limits only;
/// memory requests are not modelled and taken equal to the limit).
pub fn implied_qos(containers: &[ContainerSpec]) -> QosName {
    let none = containers.iter().all(|c| {
        c.cpu_request.unwrap_or(0) == 0 && c.cpu_limit.is_none() && c.memory_limit.is_none()
    });
    if none {
        return QosName::BestEffort;
    }
    let guaranteed = containers.iter().all(|c| {
        c.cpu_limit
            .is_some_and(|l| l > 0 && c.cpu_request.is_none_or(|r| r == l))
            && c.memory_limit.is_some()
    });
    if guaranteed {
        QosName::Guaranteed
    } else {
        QosName::Burstable
    }
}

impl ContainerSpec {
    /// CPU request in milli-CPU after API-server defaulting (a missing request with a limit
    /// takes the limit).
    pub fn effective_request(&self) -> u64 {
        match (self.cpu_request, self.cpu_limit) {
            (Some(r), _) => r,
            (None, Some(l)) => l,
            (None, None) => 0,
        }
    }
}

/// Parses a Kubernetes CPU quantity into milli-CPU.
pub fn parse_cpu(s: &str) -> Option<u64> {
    let s = s.trim();
    if let Some(m) = s.strip_suffix('m') {
        return m.parse::<u64>().ok();
    }
    let v: f64 = s.parse().ok()?;
    cpus_to_milli(v)
}

fn cpus_to_milli(v: f64) -> Option<u64> {
    if !v.is_finite() || v < 0.0 {
        return None;
    }
    Some((v * 1000.0).round() as u64)
}

/// Parses a Kubernetes memory quantity into bytes.
pub fn parse_memory(s: &str) -> Option<u64> {
    let s = s.trim();
    let units: [(&str, u64); 8] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    for (suffix, mul) in units {
        if let Some(n) = s.strip_suffix(suffix) {
            let v: f64 = n.trim().parse().ok()?;
            if !v.is_finite() || v < 0.0 {
                return None;
            }
            return Some((v * mul as f64).round() as u64);
        }
    }
    let v: f64 = s.parse().ok()?;
    (v.is_finite() && v >= 0.0).then(|| v.round() as u64)
}

/// Formats milli-CPU the way Kubernetes prints it (`"500m"`, `"2"`).
pub fn format_cpu(milli: u64) -> String {
    if milli.is_multiple_of(1000) {
        (milli / 1000).to_string()
    } else {
        format!("{milli}m")
    }
}

/// Formats bytes with the largest binary suffix that divides them.
pub fn format_memory(bytes: u64) -> String {
    for (suffix, shift) in [("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1u64 << shift) {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

#[derive(Deserialize)]
#[serde(untagged)]
enum NumOrStr {
    Num(f64),
    Str(String),
}

impl fmt::Display for NumOrStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NumOrStr::Num(n) => write!(f, "{n}"),
            NumOrStr::Str(s) => write!(f, "{s:?}"),
        }
    }
}

/// Serde for an optional Kubernetes quantity held as an integer (milli-CPUs or bytes): written
/// in Kubernetes notation, read from that notation or a plain number.
mod quantity {
    use super::NumOrStr;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(
        v: &Option<u64>,
        s: S,
        format: fn(u64) -> String,
    ) -> Result<S::Ok, S::Error> {
        match v {
            Some(x) => s.serialize_str(&format(*x)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
        from_num: fn(f64) -> Option<u64>,
        from_str: fn(&str) -> Option<u64>,
        what: &str,
    ) -> Result<Option<u64>, D::Error> {
        let Some(q) = Option::<NumOrStr>::deserialize(d)? else {
            return Ok(None);
        };
        let parsed = match &q {
            NumOrStr::Num(n) => from_num(*n),
            NumOrStr::Str(s) => from_str(s),
        };
        parsed
            .map(Some)
            .ok_or_else(|| serde::de::Error::custom(format!("bad {what} quantity {q}")))
    }
}

mod cpu_quantity {
    use super::*;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        quantity::serialize(v, s, format_cpu)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        quantity::deserialize(d, cpus_to_milli, parse_cpu, "CPU")
    }
}

mod memory_quantity {
    use super::*;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        quantity::serialize(v, s, format_memory)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        let bytes = |n: f64| (n.is_finite() && n >= 0.0).then(|| n.round() as u64);
        quantity::deserialize(d, bytes, parse_memory, "memory")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"{
      "name": "sample",
      "warmup_s": 5,
      "pods": [
        {"name": "g", "qos": "Guaranteed", "arrival_s": 0, "departure_s": 10,
         "containers": [{"name": "app", "cpu_request": "4", "cpu_limit": 4, "memory_limit": "8Gi"}]},
        {"name": "b", "namespace": "web", "qos": "Burstable", "arrival_s": 1.5,
         "annotations": {"tap.kunpeng.huawei.com/level": "numa"},
         "containers": [{"name": "app", "cpu_request": "250m", "cpu_limit": "1.5", "gpus": 1},
                        {"name": "side", "cpu_request": 0.1}]},
        {"name": "e", "qos": "BestEffort", "arrival_s": 2, "departure_s": null,
         "containers": [{"name": "app"}]},
        {"name": "g2", "qos": "Guaranteed", "arrival_s": 3,
         "containers": [{"name": "app", "cpu_limit": "500m", "memory_limit": 1073741824}]}
      ]
    }"#;

    #[test]
    fn parses_quantities_qos_and_defaults() {
        let t = Trace::parse(SAMPLE).unwrap();
        assert_eq!(t.pods.len(), 4);
        assert_eq!(t.warmup_s, 5.0);
        let g = &t.pods[0].containers[0];
        assert_eq!((g.cpu_request, g.cpu_limit), (Some(4000), Some(4000)));
        assert_eq!(g.memory_limit, Some(8 << 30));
        let b = &t.pods[1];
        assert_eq!(b.namespace, "web");
        assert_eq!(b.containers[0].cpu_request, Some(250));
        assert_eq!(b.containers[0].cpu_limit, Some(1500));
        assert_eq!(b.containers[0].gpus, 1);
        assert_eq!(b.containers[1].cpu_request, Some(100));
        assert_eq!(b.departure_s, None);
        assert_eq!(t.pods[0].namespace, "default");
        assert_eq!(t.pods[2].qos, QosName::BestEffort);
        // A Guaranteed container without a request takes its limit.
        assert_eq!(t.pods[3].containers[0].effective_request(), 500);
        assert_eq!(t.pods[3].containers[0].memory_limit, Some(1 << 30));
        assert_eq!(t.last_arrival(), 3.0);
    }

    #[test]
    fn round_trips_through_json() {
        let t = Trace::parse(SAMPLE).unwrap();
        let again = Trace::parse(&t.to_json()).unwrap();
        assert_eq!(t, again);
    }

    #[test]
    fn rejects_inconsistent_or_malformed_traces() {
        let bad_qos = SAMPLE.replace(
            r#""name": "g", "qos": "Guaranteed""#,
            r#""name": "g", "qos": "Burstable""#,
        );
        let e = Trace::parse(&bad_qos).unwrap_err();
        assert!(e.to_string().contains("does not match"), "{e}");

        let bad_cpu = SAMPLE.replace(r#""cpu_request": "250m""#, r#""cpu_request": "lots""#);
        assert!(matches!(Trace::parse(&bad_cpu), Err(TraceError::Json(_))));

        let req_over_limit = SAMPLE.replace(r#""cpu_request": "250m""#, r#""cpu_request": "2""#);
        let e = Trace::parse(&req_over_limit).unwrap_err();
        assert!(e.to_string().contains("above cpu_limit"), "{e}");

        let early = SAMPLE.replace(r#""departure_s": 10"#, r#""departure_s": -1"#);
        assert!(Trace::parse(&early).is_err());

        let unknown = SAMPLE.replace(r#""warmup_s": 5"#, r#""warmup": 5"#);
        assert!(matches!(Trace::parse(&unknown), Err(TraceError::Json(_))));
    }

    #[test]
    fn shipped_example_trace_parses() {
        let t = Trace::parse(include_str!("../traces/example.json")).unwrap();
        assert_eq!(t.pods.len(), 4);
        assert_eq!(t.pods[1].containers.len(), 2);
        assert_eq!(t.pods[2].containers[0].gpus, 1);
        assert_eq!(t.pods[2].departure_s, None);
        assert_eq!(t.pods[3].namespace, "default");
    }

    #[test]
    fn quantity_parsing() {
        assert_eq!(parse_cpu("100m"), Some(100));
        assert_eq!(parse_cpu("2"), Some(2000));
        assert_eq!(parse_cpu("0.25"), Some(250));
        assert_eq!(parse_cpu("-1"), None);
        assert_eq!(parse_memory("1Gi"), Some(1 << 30));
        assert_eq!(parse_memory("512Mi"), Some(512 << 20));
        assert_eq!(parse_memory("1G"), Some(1_000_000_000));
        assert_eq!(parse_memory("4096"), Some(4096));
        assert_eq!(parse_memory("x"), None);
        assert_eq!(format_cpu(1500), "1500m");
        assert_eq!(format_cpu(3000), "3");
        assert_eq!(format_memory(3 << 30), "3Gi");
        assert_eq!(format_memory(1536 << 20), "1536Mi");
    }
}
