use super::*;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The checked-in CRD YAML (crds/ and, once it exists, the Helm chart's copy) must equal what
/// the types generate. `UPDATE_CRDS=1 cargo test -p tap-api` rewrites them.
#[test]
fn crd_yaml_is_up_to_date() {
    let files = crd_files().expect("generating CRD YAML");
    let mut dirs = vec![root().join("crds")];
    let chart = root().join("charts/kunpeng-tap/crds");
    if chart.is_dir() {
        dirs.push(chart);
    }
    let update = std::env::var("UPDATE_CRDS")
        .map(|v| v == "1")
        .unwrap_or(false);
    let mut drift = Vec::new();
    for dir in &dirs {
        for (name, yaml) in &files {
            let path = dir.join(name);
            if update {
                std::fs::create_dir_all(dir).unwrap();
                std::fs::write(&path, yaml).unwrap();
                continue;
            }
            match std::fs::read_to_string(&path) {
                Ok(s) if &s == yaml => {}
                _ => drift.push(path.display().to_string()),
            }
        }
    }
    assert!(
        drift.is_empty(),
        "CRD YAML out of date: {drift:?}; run `UPDATE_CRDS=1 cargo test -p tap-api` or \
         `cargo run -p tap-api --bin crdgen -- crds charts/kunpeng-tap/crds`"
    );
}

#[test]
fn crds_are_cluster_scoped_with_status_and_columns() {
    let tp = TopologyPolicy::crd();
    assert_eq!(tp.spec.scope, "Cluster");
    assert_eq!(tp.spec.group, GROUP);
    let v = &tp.spec.versions[0];
    assert_eq!(v.name, VERSION);
    assert!(v.subresources.as_ref().unwrap().status.is_some());
    assert_eq!(
        default_columns(&tp),
        ["POLICY", "NODES", "PRIORITY", "READY", "AGE"]
    );

    let nt = NodeTopology::crd();
    assert_eq!(nt.spec.scope, "Cluster");
    assert_eq!(
        default_columns(&nt),
        [
            "NODE",
            "POLICY",
            "NUMA",
            "CPUS",
            "ALLOCATED",
            "CONTAINERS",
            "READY",
            "AGE"
        ]
    );
}

/// The printer columns `kubectl get` shows without `-o wide` (priority 0), upper-cased.
fn default_columns(crd: &CustomResourceDefinition) -> Vec<String> {
    crd.spec.versions[0]
        .additional_printer_columns
        .as_ref()
        .expect("printer columns")
        .iter()
        .filter(|c| c.priority.unwrap_or(0) == 0)
        .map(|c| c.name.to_uppercase())
        .collect()
}

/// The first version's OpenAPI schema as JSON.
fn schema_json(crd: &CustomResourceDefinition) -> serde_json::Value {
    serde_json::to_value(&crd.spec.versions[0].schema).expect("schema as JSON")
}

/// A property of the TopologyPolicy spec's schema.
fn policy_spec_property(name: &str) -> serde_json::Value {
    schema_json(&TopologyPolicy::crd())["openAPIV3Schema"]["properties"]["spec"]["properties"][name]
        .clone()
}

#[test]
fn schema_carries_cel_rules_and_enum() {
    let json = serde_json::to_string(&TopologyPolicy::crd()).unwrap();
    assert!(json.contains("x-kubernetes-validations"), "{json}");
    assert!(json.contains("int(r.split('-')[0])"));
    assert!(json.contains("\"numa-aware\""));
    let json = serde_json::to_string(&NodeTopology::crd()).unwrap();
    assert!(json.contains("x-kubernetes-validations"));
}

/// The kinds and every field have a description (none of kube's "Auto-generated derived type"),
/// conditions are a map keyed by type, priority is bounded, and the policy enum is not repeated
/// as a CEL rule.
#[test]
fn schema_describes_every_field_and_bounds_priority() {
    fn undescribed(s: &serde_json::Value, path: &str, out: &mut Vec<String>) {
        if let Some(props) = s["properties"].as_object() {
            for (k, v) in props {
                let p = format!("{path}.{k}");
                if v["description"].as_str().is_none_or(str::is_empty) {
                    out.push(p.clone());
                }
                undescribed(v, &p, out);
            }
        }
        if s.get("items").is_some() {
            undescribed(&s["items"], &format!("{path}[]"), out);
        }
    }
    for crd in [TopologyPolicy::crd(), NodeTopology::crd()] {
        let schema = schema_json(&crd);
        let root = &schema["openAPIV3Schema"];
        let kind = &crd.spec.names.kind;
        let top = root["description"].as_str().unwrap();
        assert!(top.starts_with(&format!("{kind} ")), "{kind}: {top}");
        assert!(!top.contains("Auto-generated"), "{kind}: {top}");
        let mut missing = Vec::new();
        undescribed(root, "", &mut missing);
        assert!(missing.is_empty(), "{kind}: no description: {missing:?}");
        let conditions = &root["properties"]["status"]["properties"]["conditions"];
        assert_eq!(conditions["x-kubernetes-list-type"], "map", "{kind}");
        assert_eq!(
            conditions["x-kubernetes-list-map-keys"],
            serde_json::json!(["type"]),
            "{kind}"
        );
        let json = schema.to_string();
        assert!(!json.contains("self in ['numa-aware'"), "{kind}: {json}");
    }
    let priority = policy_spec_property("priority");
    assert_eq!(priority["minimum"].as_f64(), Some(f64::from(PRIORITY_MIN)));
    assert_eq!(priority["maximum"].as_f64(), Some(f64::from(PRIORITY_MAX)));
}

#[test]
fn spec_defaults_and_names_round_trip() {
    let spec = read_spec(serde_json::json!({
        "policy": "numa-aware",
        "reservedCPUs": "0-1",
    }))
    .expect("spec");
    assert_eq!(spec.settings.policy, PolicyName::NumaAware);
    assert!(spec.settings.annotations_allowed);
    assert_eq!(spec.priority, 0);
    assert_eq!(spec.settings.reserved_cpus, "0-1");
    let v = written(&spec.settings);
    assert_eq!(v["reservedCPUs"], "0-1");
    assert_eq!(v["policy"], "numa-aware");
    assert!(read_spec(serde_json::json!({"policy": "best"})).is_err());
}

#[test]
fn reserved_cpus_for_round_trips_and_old_objects_still_parse() {
    let spec = read_spec(serde_json::json!({
        "policy": "topology-aware",
        "reservedCPUs": "0-1",
        "reservedCPUsFor": {"namespaces": ["kube-system"], "annotation": "honoured"},
    }))
    .expect("spec");
    assert_eq!(spec.settings.reserved_cpus_for.namespaces, ["kube-system"]);
    assert_eq!(
        spec.settings.reserved_cpus_for.annotation,
        ReservedAnnotation::Honoured
    );
    let v = written(&spec.settings);
    assert_eq!(v["reservedCPUsFor"]["annotation"], "honoured");
    assert_eq!(v["reservedCPUsFor"]["namespaces"][0], "kube-system");
    // Without it (objects written before it existed): nobody, and nothing written back.
    let old = settings_written_before_new_fields();
    assert!(old.reserved_cpus_for.is_empty());
    assert!(written(&old).get("reservedCPUsFor").is_none());
    assert!(
        serde_json::from_value::<ReservedCpusFor>(serde_json::json!({"annotation": "always"}))
            .is_err()
    );
    let f = policy_spec_property("reservedCPUsFor");
    assert_eq!(f["properties"]["namespaces"]["maxItems"], 64, "{f}");
}

#[test]
fn rebalance_round_trips_and_old_objects_keep_containers_in_place() {
    let spec = read_spec(serde_json::json!({
        "policy": "numa-aware",
        "rebalance": "usage",
    }))
    .expect("spec");
    assert_eq!(spec.settings.rebalance, RebalanceMode::Usage);
    let v = written(&spec.settings);
    assert_eq!(v["rebalance"], "usage");
    let old = settings_written_before_new_fields();
    assert_eq!(old.rebalance, RebalanceMode::Off);
    assert!(written(&old).get("rebalance").is_none());
    // `off` is no value of the CRD (kubectl's YAML reads an unquoted off as false).
    assert!(read_spec(serde_json::json!({
        "policy": "numa-aware",
        "rebalance": "off",
    }))
    .is_err());
}

/// Settings as an object written before the optional fields existed carries them: the policy
/// alone.
fn settings_written_before_new_fields() -> PolicySettings {
    serde_json::from_value(serde_json::json!({"policy": "numa-aware"})).expect("old settings")
}

/// Settings as they are written back to the API server.
fn written(settings: &PolicySettings) -> serde_json::Value {
    serde_json::to_value(settings).expect("settings as JSON")
}

/// A TopologyPolicy spec as the API server would hand it over.
fn read_spec(json: serde_json::Value) -> serde_json::Result<TopologyPolicySpec> {
    serde_json::from_value(json)
}
