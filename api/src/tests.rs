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
    let cols: Vec<String> = v
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .filter(|c| c.priority.unwrap_or(0) == 0)
        .map(|c| c.name.to_uppercase())
        .collect();
    assert_eq!(cols, ["POLICY", "NODES", "PRIORITY", "READY", "AGE"]);

    let nt = NodeTopology::crd();
    assert_eq!(nt.spec.scope, "Cluster");
    let cols: Vec<String> = nt.spec.versions[0]
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .filter(|c| c.priority.unwrap_or(0) == 0)
        .map(|c| c.name.to_uppercase())
        .collect();
    assert_eq!(
        cols,
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

#[test]
fn schema_carries_cel_rules_and_enum() {
    let json = serde_json::to_string(&TopologyPolicy::crd()).unwrap();
    assert!(json.contains("x-kubernetes-validations"), "{json}");
    assert!(json.contains("int(r.split('-')[0])"));
    assert!(json.contains("\"numa-aware\""));
    let json = serde_json::to_string(&NodeTopology::crd()).unwrap();
    assert!(json.contains("x-kubernetes-validations"));
}

#[test]
fn spec_defaults_and_names_round_trip() {
    let spec: TopologyPolicySpec = serde_json::from_value(serde_json::json!({
        "policy": "numa-aware",
        "reservedCPUs": "0-1",
    }))
    .unwrap();
    assert_eq!(spec.policy, PolicyName::NumaAware);
    assert!(spec.annotations_allowed);
    assert_eq!(spec.priority, 0);
    assert_eq!(spec.reserved_cpus, "0-1");
    let v = serde_json::to_value(spec.settings()).unwrap();
    assert_eq!(v["reservedCPUs"], "0-1");
    assert_eq!(v["policy"], "numa-aware");
    assert!(
        serde_json::from_value::<TopologyPolicySpec>(serde_json::json!({"policy": "best"}))
            .is_err()
    );
}
