//! Property tests of what the Docker proxy reads from its clients and from dockerd: routing,
//! percent-decoding, query parameters, and the JSON create/inspect/update bodies
//! (`docker_proxy::convert`).

use crate::common::{
    adjustment, cpu_set, cpuset_list, json_object, json_value, node_set, num, shown, text, Num,
};
use hyper::Method;
use node_agent::docker_proxy::convert::{
    apply_resources, info_from_create, info_from_inspect, percent_decode, query_param,
    rewrite_create, rewrite_update, route, strip_version, update_body, Route, LABEL_CONTAINER_NAME,
    LABEL_DOCKER_TYPE, LABEL_POD_NAME,
};
use node_agent::{Adjustment, ContainerInfo, Update};
use proptest::prelude::*;
use serde_json::{json, Map, Value};
use tap_engine::request::GRANT_KEY;
use tap_engine::{CpuSet, NodeSet};

// ---- helpers ----------------------------------------------------------------------------

/// `%XX` for every byte (upper or lower case hex).
fn encode_all(s: &str, upper: bool) -> String {
    s.bytes()
        .map(|b| {
            if upper {
                format!("%{b:02X}")
            } else {
                format!("%{b:02x}")
            }
        })
        .collect()
}

/// Unreserved characters as they are, every other byte as `%XX` (what a client sends).
fn encode_path(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn method() -> impl Strategy<Value = Method> {
    proptest::sample::select(vec![
        Method::GET,
        Method::POST,
        Method::DELETE,
        Method::PUT,
        Method::HEAD,
    ])
}

/// Paths near the routed ones, and anything.
fn path() -> impl Strategy<Value = String> {
    let seg = prop_oneof![
        Just("containers".to_string()),
        Just("create".to_string()),
        Just("update".to_string()),
        Just("stop".to_string()),
        Just("healthz".to_string()),
        Just("v1.41".to_string()),
        Just(String::new()),
        "[%a-z0-9._]{0,8}",
        ".{0,6}",
    ];
    prop_oneof![
        3 => proptest::collection::vec(seg, 0..5).prop_map(|s| format!("/{}", s.join("/"))),
        1 => ".{0,24}",
    ]
}

fn k8s_labels() -> impl Strategy<Value = Map<String, Value>> {
    proptest::collection::vec(("[a-z./]{1,12}", json_value()), 0..4).prop_map(|extra| {
        let mut m: Map<String, Value> = extra.into_iter().collect();
        m.insert(LABEL_POD_NAME.into(), json!("web"));
        m.insert(LABEL_CONTAINER_NAME.into(), json!("app"));
        m.insert(LABEL_DOCKER_TYPE.into(), json!("container"));
        m
    })
}

/// A HostConfig with every resource field drawn from the number edge cases.
fn host_config() -> impl Strategy<Value = (Map<String, Value>, [Num; 4])> {
    (
        [num(), num(), num(), num()],
        proptest::option::of(json_value()),
        crate::common::json_object(),
    )
        .prop_map(|(nums, parent, rest)| {
            let mut m = match rest {
                Value::Object(m) => m,
                _ => Map::new(),
            };
            for (k, n) in ["CpuShares", "CpuQuota", "CpuPeriod", "Memory"]
                .iter()
                .zip(&nums)
            {
                match n.json() {
                    Some(v) => m.insert(k.to_string(), v),
                    None => m.remove(*k),
                };
            }
            match parent {
                Some(p) => m.insert("CgroupParent".into(), p),
                None => m.remove("CgroupParent"),
            };
            (m, nums)
        })
}

/// Checks what was read from a HostConfig against the numbers it was made of; the body went
/// through JSON text first, as the proxy reads it.
fn check_resources(info: &ContainerInfo, hc: &Map<String, Value>, nums: &[Num; 4]) {
    let [shares, quota, period, memory] = nums;
    assert_eq!(info.cpu_shares, shares.exact_u64().filter(|s| *s > 0));
    assert_eq!(info.cpu_quota, quota.exact_i64().filter(|q| *q != 0));
    assert_eq!(info.cpu_period, period.exact_u64().filter(|p| *p > 0));
    assert_eq!(info.memory_limit, memory.exact_i64().filter(|m| *m > 0));
    let parent = hc
        .get("CgroupParent")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty());
    assert_eq!(info.pod.cgroup_parent.as_deref(), parent);
}

fn reparse(v: &Value) -> Value {
    serde_json::from_str(&v.to_string()).expect("serde_json reads what it writes")
}

/// A body with what an adjustment owns taken out (the keys it sets); a HostConfig or Labels
/// left empty by that, or null, counts as absent (dockerd reads null as absent).
fn unowned(v: &Value, adj: &Adjustment) -> Value {
    let mut v = v.clone();
    if let Some(obj) = v.as_object_mut() {
        let mut owned = |k: &str, sub: &[(&str, bool)]| {
            if let Some(Value::Object(m)) = obj.get_mut(k) {
                for (s, set) in sub {
                    if *set {
                        m.remove(*s);
                    }
                }
            }
            if obj
                .get(k)
                .is_some_and(|x| x.is_null() || x.as_object().is_some_and(Map::is_empty))
            {
                obj.remove(k);
            }
        };
        owned(
            "HostConfig",
            &[
                ("CpusetCpus", adj.cpus.is_some()),
                ("CpusetMems", adj.mems.is_some()),
            ],
        );
        owned("Labels", &[(GRANT_KEY, adj.record.is_some())]);
    }
    v
}

// ---- properties -------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any text: never a panic; never longer than what came in (no amplification); text
    /// without `%` and `+` is unchanged; `%XX` of every byte decodes back to the text.
    #[test]
    fn percent_decode_never_panics_and_inverts_encoding(
        s in prop_oneof![".{0,24}", "[%+0-9a-fA-FéЖ中😀]{0,24}", any::<String>()],
        raw in proptest::collection::vec(any::<u8>(), 0..24),
        upper in any::<bool>(),
    ) {
        let d = percent_decode(&s);
        prop_assert!(d.len() <= s.len(), "{:?} -> {:?}", s, d);
        if !s.contains('%') && !s.contains('+') {
            prop_assert_eq!(&d, &s);
        }
        prop_assert_eq!(percent_decode(&encode_all(&s, upper)), s.clone());
        // A '%' at the very end (or with one hex digit after it) stays as it is.
        prop_assert_eq!(percent_decode(&format!("{s}%")), format!("{}%", percent_decode(&s)));
        // Random bytes (invalid UTF-8 included) encoded: decoded lossily, never a panic.
        let encoded: String = raw.iter().map(|b| format!("%{b:02x}")).collect();
        prop_assert_eq!(percent_decode(&encoded), String::from_utf8_lossy(&raw).into_owned());
        let _ = percent_decode(&String::from_utf8_lossy(&raw));
    }

    /// Any path and method: never a panic; a version prefix changes nothing; the routed
    /// forms carry the decoded id.
    #[test]
    fn routing_any_path_never_panics(m in method(), p in path(), id in ".{1,16}") {
        let r = route(&m, &p);
        let stripped = strip_version(&p);
        prop_assert!(p.ends_with(stripped));
        if p.starts_with('/') && stripped == p {
            prop_assert_eq!(route(&m, &format!("/v1.41{p}")), r.clone());
        }
        match &r {
            Route::Create | Route::Update(_) | Route::Stop(_) => prop_assert_eq!(&m, &Method::POST),
            Route::Delete(_) => prop_assert_eq!(&m, &Method::DELETE),
            Route::Other => {}
        }
        let e = encode_path(&id);
        prop_assert_eq!(
            route(&Method::POST, &format!("/v1.24/containers/{e}/update")),
            Route::Update(id.clone())
        );
        prop_assert_eq!(
            route(&Method::POST, &format!("/containers/{e}/stop/")),
            Route::Stop(id.clone())
        );
        prop_assert_eq!(route(&Method::DELETE, &format!("/containers/{e}")), Route::Delete(id));
    }

    /// Any query: never a panic; an encoded value comes back decoded, the first one of its key.
    #[test]
    fn query_param_finds_the_first_value(
        q in proptest::option::of(".{0,32}"),
        key in ".{0,6}",
        pairs in proptest::collection::vec(("[a-c]{1,2}", ".{0,8}"), 0..5),
    ) {
        let _ = query_param(q.as_deref(), &key);
        let query = pairs
            .iter()
            .map(|(k, v)| format!("{k}={}", encode_path(v)))
            .collect::<Vec<_>>()
            .join("&");
        for (k, _) in &pairs {
            let first = pairs.iter().find(|(k2, _)| k2 == k).map(|(_, v)| v.clone());
            prop_assert_eq!(query_param(Some(&query), k), first);
        }
        prop_assert_eq!(query_param(Some(&query), "zz"), None);
    }

    /// Any JSON: the readers never panic.
    #[test]
    fn readers_of_any_json_never_panic(v in json_value(), labels in k8s_labels()) {
        let mut info = ContainerInfo::default();
        apply_resources(&mut info, &v);
        let _ = info_from_create("k8s_app_web_default_u_0", &v, None);
        let _ = info_from_inspect(&v, None);
        // The same trees where the readers look, with labels that make them read on.
        let create = json!({"Labels": labels, "Env": v, "HostConfig": v});
        prop_assert!(info_from_create("k8s_app_web_default_u_0", &create, None).is_some());
        let inspect = json!({"Name": "/k8s_app", "Config": {"Labels": labels, "Env": v},
                             "HostConfig": v});
        prop_assert!(info_from_inspect(&inspect, None).is_some());
    }

    /// Resource numbers at the u64/i64 extremes are read exactly or not at all (a CpuShares
    /// of u64::MAX stays u64::MAX; negative, fractional or out-of-range ones are ignored).
    #[test]
    fn create_and_inspect_read_numbers_without_wrapping(
        (hc, nums) in host_config(),
        labels in k8s_labels(),
        env in json_value(),
        cpus in prop_oneof![
            3 => cpuset_list().prop_map(Value::String),
            1 => json_value().prop_filter("a non-string", |v| !v.is_string()),
        ],
    ) {
        let mut hc = hc;
        let body = reparse(&json!({"Labels": labels, "Env": env, "HostConfig": hc}));
        let info = info_from_create("/k8s_app_web_default_u_0", &body, None)
            .expect("a Kubernetes container");
        check_resources(&info, &hc, &nums);
        let want_env: Vec<String> = env
            .as_array()
            .map(|a| a.iter().filter_map(|e| e.as_str().map(str::to_string)).collect())
            .unwrap_or_default();
        prop_assert_eq!(&info.env, &want_env);

        hc.insert("CpusetCpus".into(), cpus.clone());
        let inspect = reparse(&json!({"Name": "/k8s_app_web_default_u_0",
                                      "Config": {"Labels": labels, "Env": env},
                                      "HostConfig": hc}));
        let info = info_from_inspect(&inspect, None).expect("a Kubernetes container");
        check_resources(&info, &hc, &nums);
        let got = shown(info.cpus);
        prop_assert_eq!(got.as_deref(), cpus.as_str().filter(|s| !s.is_empty()));

        // An update body (flat) keeps what it does not set.
        let before = info.clone();
        let mut after = info.clone();
        apply_resources(&mut after, &reparse(&Value::Object(hc.clone())));
        prop_assert_eq!(after, before);
    }

    /// A cpuset of any text from dockerd is read as the set it names, or not at all (empty,
    /// or not the kernel's list syntax).
    #[test]
    fn inspect_reads_any_cpuset_text_as_a_set_or_nothing(
        cpus in text(),
        mems in text(),
        labels in k8s_labels(),
    ) {
        let inspect = json!({"Name": "/k8s_app_web_default_u_0", "Config": {"Labels": labels},
                             "HostConfig": {"CpusetCpus": cpus, "CpusetMems": mems}});
        let info = info_from_inspect(&inspect, None).expect("a Kubernetes container");
        prop_assert_eq!(info.cpus, CpuSet::parse(&cpus).ok().filter(|s| !s.is_empty()));
        prop_assert_eq!(info.mems, NodeSet::parse(&mems).ok().filter(|s| !s.is_empty()));
    }

    /// rewrite_create on any JSON object: after the proxy's serialize/parse round trip, every
    /// key it does not own is byte-for-byte what a plain round trip gives; what it owns holds
    /// the adjustment; a body it leaves alone is unchanged.
    #[test]
    fn rewrite_create_keeps_every_key_it_does_not_own(
        base in json_object(),
        hc in prop_oneof![
            2 => Just(None),
            1 => Just(Some(Value::Null)),
            4 => json_object().prop_map(Some),
            1 => json_value().prop_map(Some),
        ],
        labels in prop_oneof![
            2 => Just(None),
            1 => Just(Some(Value::Null)),
            4 => json_object().prop_map(Some),
            1 => json_value().prop_map(Some),
        ],
        adj in adjustment(),
    ) {
        let mut body = base;
        if let Some(obj) = body.as_object_mut() {
            if let Some(h) = hc {
                obj.insert("HostConfig".into(), h);
            }
            if let Some(l) = labels {
                obj.insert("Labels".into(), l);
            }
        }
        let mut rewritten = body.clone();
        let changed = rewrite_create(&mut rewritten, &adj);
        let plain = reparse(&body);
        let sent = reparse(&rewritten);

        let odd = |k: &str| body.get(k).is_some_and(|v| !v.is_object() && !v.is_null());
        let may_change = (adj.cpus.is_some() || adj.mems.is_some())
            && !odd("HostConfig")
            && !(adj.record.is_some() && odd("Labels"));
        prop_assert_eq!(changed, may_change);
        if !changed {
            prop_assert_eq!(sent.to_string(), plain.to_string());
            return Ok(());
        }
        prop_assert_eq!(unowned(&sent, &adj).to_string(), unowned(&plain, &adj).to_string());
        let hc = &sent["HostConfig"];
        if let Some(c) = &adj.cpus {
            let c = c.to_string();
            prop_assert_eq!(hc["CpusetCpus"].as_str(), Some(c.as_str()));
        }
        if let Some(m) = &adj.mems {
            let m = m.to_string();
            prop_assert_eq!(hc["CpusetMems"].as_str(), Some(m.as_str()));
        }
        if let Some(r) = &adj.record {
            prop_assert_eq!(sent["Labels"][GRANT_KEY].as_str(), Some(r.as_str()));
        }
    }

    /// rewrite_update sets the cpuset it has and keeps everything else.
    #[test]
    fn rewrite_update_keeps_every_other_key(body in json_value(), adj in adjustment()) {
        let mut rewritten = body.clone();
        let changed = rewrite_update(&mut rewritten, &adj);
        prop_assert_eq!(changed, body.is_object() && (adj.cpus.is_some() || adj.mems.is_some()));
        let mut want = body.clone();
        if let Some(obj) = want.as_object_mut() {
            if let Some(c) = &adj.cpus {
                obj.insert("CpusetCpus".into(), Value::String(c.to_string()));
            }
            if let Some(m) = &adj.mems {
                obj.insert("CpusetMems".into(), Value::String(m.to_string()));
            }
        }
        prop_assert_eq!(reparse(&rewritten).to_string(), reparse(&want).to_string());
    }

    /// The body of an update for another container is exactly its cpuset.
    #[test]
    fn update_body_round_trips(cpus in cpu_set(), mems in proptest::option::of(node_set())) {
        let u = Update { container_id: "c".into(), cpus, mems };
        let v = reparse(&update_body(&u));
        let mut want = json!({"CpusetCpus": cpus.to_string()});
        if let Some(m) = mems {
            want["CpusetMems"] = Value::String(m.to_string());
        }
        prop_assert_eq!(v, want);
    }
}

/// CpuShares of u64::MAX is read as u64::MAX; -1, 1.5 and 2^64 are ignored.
#[test]
fn cpu_shares_at_the_extremes() {
    let read = |text: &str| {
        let v: Value = serde_json::from_str(text).expect("json");
        let mut info = ContainerInfo::default();
        apply_resources(&mut info, &v);
        info.cpu_shares
    };
    assert_eq!(
        read(r#"{"CpuShares": 18446744073709551615}"#),
        Some(u64::MAX)
    );
    assert_eq!(read(r#"{"CpuShares": -1}"#), None);
    assert_eq!(read(r#"{"CpuShares": 1.5}"#), None);
    assert_eq!(read(r#"{"CpuShares": 4096.0}"#), None);
    assert_eq!(read(r#"{"CpuShares": 18446744073709551616}"#), None);
    assert_eq!(read(r#"{"CpuShares": "4096"}"#), None);
}
