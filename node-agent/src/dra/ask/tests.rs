use super::*;
use serde_json::json;

fn topo() -> Topology {
    let raw = tap_engine::testdata::discover_fixture("synthetic-2s-4numa-96c-kunpeng920").unwrap();
    Topology::build(&raw).unwrap()
}

fn claim(uid: &str, results: serde_json::Value) -> ResourceClaim {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "cpus", "namespace": "ns", "uid": uid},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": results}}}
    }))
    .unwrap()
}

fn want(uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "ns".into(),
        uid: uid.into(),
        name: "cpus".into(),
    }
}

fn result(
    driver: &str,
    pool: &str,
    device: &str,
    cpu: Option<&str>,
    mem: Option<&str>,
) -> serde_json::Value {
    let mut consumed = serde_json::Map::new();
    if let Some(c) = cpu {
        consumed.insert("cpu".into(), json!(c));
    }
    if let Some(m) = mem {
        consumed.insert("memory".into(), json!(m));
    }
    let mut r = json!({"request": "cpus", "driver": driver, "pool": pool, "device": device});
    if !consumed.is_empty() {
        r["consumedCapacity"] = serde_json::Value::Object(consumed);
    }
    r
}

#[test]
fn a_claim_of_4_cpus_and_256mi_on_numa2_asks_for_them() {
    let t = topo();
    let c = claim(
        "u1",
        json!([
            result(DRIVER, "node-a", "numa2", Some("4"), Some("256Mi")),
            result("accel.example.com", "node-a", "accel-2", None, None),
        ]),
    );
    let a = ask_of(&c, &want("u1"), "node-a", &t).unwrap();
    assert_eq!(a.key.to_string(), "ns/cpus");
    assert_eq!(a.parts.len(), 1, "only this driver's result");
    let p = &a.parts[0];
    assert_eq!(t.pool(p.device).cpus, t.node(2).unwrap().cpus);
    assert_eq!(
        (p.cpus, p.memory_bytes, p.request.as_str()),
        (4, 256 << 20, "cpus")
    );
}

#[test]
fn a_device_allocated_whole_asks_for_the_whole_group_and_fractions_round_up() {
    let t = topo();
    let c = claim("u1", json!([result(DRIVER, "node-a", "numa0", None, None)]));
    let p = &ask_of(&c, &want("u1"), "node-a", &t).unwrap().parts[0];
    assert_eq!(
        (p.cpus, p.memory_bytes),
        (24, t.node(0).unwrap().memory_bytes)
    );
    let c = claim(
        "u1",
        json!([result(DRIVER, "node-a", "numa0", Some("2500m"), Some("1k"))]),
    );
    let p = &ask_of(&c, &want("u1"), "node-a", &t).unwrap().parts[0];
    assert_eq!((p.cpus, p.memory_bytes), (3, 1000));
}

#[test]
fn bad_claims_are_refused_with_what_is_wrong() {
    let t = topo();
    let ok = json!([result(DRIVER, "node-a", "numa1", Some("2"), None)]);
    // Claim u1 with one device of this driver: `cpus` of device `device` of pool `pool`.
    let one_device = |pool: &str, device: &str, cpus: &str| {
        claim(
            "u1",
            json!([result(DRIVER, pool, device, Some(cpus), None)]),
        )
    };
    let cases = [
        (
            claim("old", ok.clone()),
            "claim ns/cpus: the API server has uid old, the kubelet asked for u1 (a stale claim)",
        ),
        (
            claim(
                "u1",
                json!([result("accel.example.com", "node-a", "a", None, None)]),
            ),
            "claim ns/cpus has no device of driver dra.tap.kunpeng.io",
        ),
        (
            one_device("node-b", "numa1", "2"),
            "device numa1 of pool node-b is not a CPU group of this node",
        ),
        (
            one_device("node-a", "gpu0", "2"),
            "device gpu0 of pool node-a is not a CPU group of this node",
        ),
        (
            one_device("node-a", "numa9", "2"),
            "device numa9 of pool node-a is not a CPU group of this node",
        ),
        (
            one_device("node-a", "numa1", "-2"),
            "device numa1: consumed cpu \"-2\" is not a quantity",
        ),
    ];
    for (c, why) in cases {
        let e = ask_of(&c, &want("u1"), "node-a", &t).unwrap_err();
        assert_eq!(e.to_string(), why);
    }
    let mut unallocated = claim("u1", ok);
    unallocated.status = None;
    let e = ask_of(&unallocated, &want("u1"), "node-a", &t).unwrap_err();
    assert_eq!(e.to_string(), "claim ns/cpus is not allocated");
}
