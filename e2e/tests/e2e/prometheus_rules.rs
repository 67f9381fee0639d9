//! e2e: the chart's PrometheusRule (`metrics.prometheusRule`), checked by Prometheus's own rule
//! checker: the rendered groups pass `promtool check rules`, every series an alert reads is one
//! the agent or the operator really exports (their registries, rendered here), the `job` of the
//! target-down alerts is the one prometheus-operator gives the chart's own monitors, and
//! `promtool test rules` shows each alert firing on its condition, with the labels and
//! messages it fires with, and staying quiet on a node or moment that is fine. It is rendered
//! only where monitoring.coreos.com/v1 is served, or when forced.
//!
//! Needs helm (hack/e2e/setup-helm.sh) and promtool (hack/e2e/setup-promtool.sh, Debian's
//! `prometheus` package; `TAP_PROMTOOL` overrides).

use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use tap_e2e::helm::{docs, template_in};
use tap_e2e::util::temp_dir;

const NS: &str = "kunpeng-tap";
const RELEASE: &str = "tap";
const AGENT_JOB: &str = "tap-kunpeng-tap-agent-metrics";
const OPERATOR_JOB: &str = "tap-kunpeng-tap-operator-metrics";

fn promtool() -> PathBuf {
    tap_e2e::util::installed(
        "TAP_PROMTOOL",
        "/usr/bin/promtool",
        "hack/e2e/setup-promtool.sh",
    )
}

/// The objects `helm template` renders with `sets` and `extra` arguments.
fn render(sets: &[&str], extra: &[&str]) -> Vec<Value> {
    docs(&template_in(RELEASE, NS, sets, extra))
}

/// The PrometheusRule rendered with `sets` (forced: no cluster here).
fn rule(sets: &[&str]) -> Value {
    let mut all = vec![
        "metrics.prometheusRule.enabled=true",
        "metrics.prometheusRule.force=true",
    ];
    all.extend_from_slice(sets);
    let objs = render(&all, &[]);
    let rules: Vec<&Value> = objs
        .iter()
        .filter(|o| o["kind"] == "PrometheusRule")
        .collect();
    assert_eq!(rules.len(), 1, "{sets:?}");
    rules[0].clone()
}

/// Every alerting rule of a PrometheusRule, by name.
fn alerts(rule: &Value) -> BTreeMap<String, Value> {
    rule["spec"]["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .map(|r| (r["alert"].as_str().expect("alert").to_string(), r.clone()))
        .collect()
}

/// Writes the rule's `spec` (a Prometheus rule file: `groups:`) into `dir`.
fn rule_file(dir: &Path, rule: &Value) -> PathBuf {
    let p = dir.join("rules.yaml");
    std::fs::write(&p, serde_yaml::to_string(&rule["spec"]).expect("YAML")).expect("write");
    p
}

fn promtool_run(args: &[&str], dir: &Path) -> (bool, String) {
    let out = Command::new(promtool())
        .args(args)
        .current_dir(dir)
        .output()
        .expect("running promtool");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The series names the agent (in a proxy mode, where all of them exist) and the operator
/// export, each family touched so that it has a sample.
fn exported() -> BTreeSet<String> {
    use node_agent::hook::Hook;
    use node_agent::metrics::{ErrorKind, Metrics};
    let m = Metrics::for_mode("Docker");
    m.count_error(Hook::Create, ErrorKind::Refused);
    m.count_placement("numa", false);
    m.count_reconcile(true);
    m.count_cpuset_write("refused");
    m.observe_hook(Hook::Create, "Docker", Duration::from_micros(5));
    m.observe_proxy("/v1.41/containers/create", Duration::from_micros(5));
    let op = tap_operator::metrics::Metrics::new();
    op.observe("node", Duration::from_millis(1), false);
    op.failed("Node", "api_conflict");
    op.wrote("node");
    op.policy_nodes
        .get_or_create(&tap_operator::metrics::PolicyLabel { policy: "p".into() })
        .set(1);
    let text = m.render() + &op.encode();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

/// The `tap_…` names an expression reads.
fn series_in(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("tap_"))
        .map(str::to_string)
        .collect()
}

/// Every alert the chart's rules hold, by name.
const ALL_ALERTS: [&str; 8] = [
    "KunpengTapAgentDown",
    "KunpengTapContainersUnconverged",
    "KunpengTapErrors",
    "KunpengTapOperatorDown",
    "KunpengTapOperatorNoLeader",
    "KunpengTapPlacementRefused",
    "KunpengTapProxyDown",
    "KunpengTapRuntimeDisconnected",
];

#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn prometheus_rules_pass_promtool_and_read_exported_series() {
    tap_e2e::util::require_e2e_tier();
    let names = exported();
    assert!(names.contains("tap_errors_total") && names.contains("tap_operator_leader"));
    let dir = temp_dir("tap-e2e-promrules").expect("temp dir");
    for (sets, want_alerts) in [
        (
            vec!["metrics.serviceMonitor.enabled=true"],
            ALL_ALERTS.to_vec(),
        ),
        (
            vec![
                "metrics.podMonitor.enabled=true",
                "metrics.podMonitor.namespace=monitoring",
            ],
            ALL_ALERTS.to_vec(),
        ),
        // Scraped some other way: the chart cannot know the jobs, no target-down alerts.
        (
            vec![],
            vec![
                "KunpengTapContainersUnconverged",
                "KunpengTapErrors",
                "KunpengTapPlacementRefused",
                "KunpengTapProxyDown",
                "KunpengTapRuntimeDisconnected",
            ],
        ),
        (
            vec!["metrics.serviceMonitor.enabled=true", "agent.enabled=false"],
            vec!["KunpengTapOperatorDown", "KunpengTapOperatorNoLeader"],
        ),
    ] {
        let r = rule(&sets);
        let got = alerts(&r);
        assert_eq!(got.keys().collect::<Vec<_>>(), want_alerts, "{sets:?}");
        let file = rule_file(&dir, &r);
        let (ok, out) = promtool_run(&["check", "rules", &file.to_string_lossy()], &dir);
        assert!(ok, "promtool check rules {sets:?}:\n{out}");
        assert!(
            out.contains(&format!("SUCCESS: {} rules found", want_alerts.len())),
            "{out}"
        );
        for (name, a) in &got {
            let expr = a["expr"].as_str().expect("expr");
            for s in series_in(expr) {
                assert!(
                    names.contains(&s),
                    "{name} reads {s}, which neither the agent nor the operator exports: {names:?}"
                );
            }
            assert!(
                ["warning", "critical"].contains(&a["labels"]["severity"].as_str().unwrap_or("")),
                "{name}: {a}"
            );
            for k in ["summary", "description"] {
                assert!(a["annotations"][k].is_string(), "{name} has no {k}");
            }
        }
        eprintln!("promtool check rules {sets:?}: {} rules", got.len());
    }

    // The target-down alerts select the jobs prometheus-operator gives the chart's monitors:
    // a ServiceMonitor's targets the Service's name, a PodMonitor's `<namespace>/<name>`.
    let objs = render(
        &[
            "metrics.serviceMonitor.enabled=true",
            "metrics.prometheusRule.enabled=true",
            "metrics.prometheusRule.force=true",
        ],
        &[],
    );
    let services: Vec<&str> = objs
        .iter()
        .filter(|o| o["kind"] == "Service")
        .map(|o| o["metadata"]["name"].as_str().unwrap())
        .collect();
    let r = objs.iter().find(|o| o["kind"] == "PrometheusRule").unwrap();
    for (alert, job) in [
        ("KunpengTapAgentDown", AGENT_JOB),
        ("KunpengTapOperatorDown", OPERATOR_JOB),
    ] {
        assert!(services.contains(&job), "{job} is no Service: {services:?}");
        let expr = alerts(r)[alert]["expr"].as_str().unwrap().to_string();
        assert!(expr.contains(&format!("job=\"{job}\"")), "{expr}");
    }
    let objs = render(
        &[
            "metrics.podMonitor.enabled=true",
            "metrics.podMonitor.namespace=monitoring",
            "metrics.prometheusRule.enabled=true",
            "metrics.prometheusRule.force=true",
        ],
        &[],
    );
    let r = objs.iter().find(|o| o["kind"] == "PrometheusRule").unwrap();
    for pm in objs.iter().filter(|o| o["kind"] == "PodMonitor") {
        let job = format!(
            "{}/{}",
            pm["metadata"]["namespace"].as_str().unwrap(),
            pm["metadata"]["name"].as_str().unwrap()
        );
        assert!(
            alerts(r).values().any(|a| a["expr"]
                .as_str()
                .unwrap()
                .contains(&format!("job=\"{job}\""))),
            "no alert selects the PodMonitor's job {job}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn prometheus_rule_only_where_its_api_is_served_or_forced() {
    tap_e2e::util::require_e2e_tier();
    let has = |sets: &[&str], extra: &[&str]| {
        render(sets, extra)
            .iter()
            .any(|o| o["kind"] == "PrometheusRule")
    };
    let on = ["metrics.prometheusRule.enabled=true"];
    assert!(!has(&[], &[]), "off by default");
    assert!(!has(&[], &["--api-versions", "monitoring.coreos.com/v1"]));
    assert!(!has(&on, &[]), "rendered without monitoring.coreos.com/v1");
    assert!(has(&on, &["--api-versions", "monitoring.coreos.com/v1"]));
    assert!(has(
        &on,
        &["--api-versions", "monitoring.coreos.com/v1/PrometheusRule"]
    ));
    assert!(has(
        &[
            "metrics.prometheusRule.enabled=true",
            "metrics.prometheusRule.force=true"
        ],
        &[]
    ));
    // Where it goes and what it carries.
    let r = rule(&[
        "metrics.prometheusRule.namespace=monitoring",
        "metrics.prometheusRule.labels.release=prom",
        "metrics.prometheusRule.alertLabels.team=platform",
        "metrics.prometheusRule.for=2m",
        "metrics.prometheusRule.errorThreshold=20",
    ]);
    assert_eq!(r["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(r["metadata"]["namespace"], "monitoring");
    assert_eq!(r["metadata"]["labels"]["release"], "prom");
    let a = alerts(&r);
    for (name, rule) in &a {
        assert_eq!(rule["labels"]["team"], "platform", "{name}");
        if name != "KunpengTapContainersUnconverged" {
            assert_eq!(rule["for"], "2m", "{name}");
        }
    }
    assert_eq!(a["KunpengTapContainersUnconverged"]["for"], "15m");
    assert!(a["KunpengTapErrors"]["expr"]
        .as_str()
        .unwrap()
        .ends_with("> 20"));
}

/// Expands the Prometheus templates the chart's annotations use, for `labels` and `value`;
/// panics on any other template (so a new one is added here, and checked by promtool).
fn expand(text: &str, labels: &BTreeMap<&str, &str>, value: &str) -> String {
    let mut s = text.replace("{{ $value | printf \"%.0f\" }}", value);
    for (k, v) in labels {
        s = s.replace(&format!("{{{{ $labels.{k} }}}}"), v);
    }
    // Labels the alert does not carry expand to nothing.
    for k in ["node", "pod", "kind"] {
        s = s.replace(&format!("{{{{ $labels.{k} }}}}"), "");
    }
    assert!(!s.contains("{{"), "a template this test does not know: {s}");
    s
}

/// One promtool `alert_rule_test` case: `alert` at minute `at` fires once per entry of
/// `firing` (its labels and the `$value` its messages show), none when empty.
fn case(rule: &Value, alert: &str, at: u32, firing: &[(BTreeMap<&str, &str>, &str)]) -> Value {
    let a = &alerts(rule)[alert];
    let exp: Vec<Value> = firing
        .iter()
        .map(|(labels, value)| {
            let mut l: BTreeMap<String, String> = labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            for (k, v) in a["labels"].as_object().unwrap() {
                l.insert(k.clone(), v.as_str().unwrap().to_string());
            }
            let ann: BTreeMap<String, String> = a["annotations"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), expand(v.as_str().unwrap(), labels, value)))
                .collect();
            json!({"exp_labels": l, "exp_annotations": ann})
        })
        .collect();
    json!({"eval_time": format!("{at}m"), "alertname": alert, "exp_alerts": exp})
}

fn agent_labels(node: &str) -> BTreeMap<&'static str, &'static str> {
    let (pod, node): (&'static str, &'static str) = match node {
        "node-a" => ("agent-a", "node-a"),
        _ => ("agent-b", "node-b"),
    };
    BTreeMap::from([
        ("job", AGENT_JOB),
        ("namespace", NS),
        ("pod", pod),
        ("node", node),
        (
            "instance",
            if pod == "agent-a" {
                "agent-a:9091"
            } else {
                "agent-b:9091"
            },
        ),
    ])
}

/// A promtool series selector: `name{labels}` (plus `extra` labels).
/// An alert quiet at one minute and firing at a later one with these labels and value.
type QuietThenFiring<'a> = (&'a str, u32, u32, BTreeMap<&'a str, &'a str>, &'a str);

/// Two cases per row of `table`: the alert is quiet at its first minute and fires at its second.
fn quiet_then_firing(rule: &Value, table: &[QuietThenFiring]) -> Vec<Value> {
    table
        .iter()
        .flat_map(|(alert, quiet, fires, labels, value)| {
            [
                case(rule, alert, *quiet, &[]),
                case(rule, alert, *fires, &[(labels.clone(), *value)]),
            ]
        })
        .collect()
}

fn series(name: &str, labels: &BTreeMap<&str, &str>, extra: &[(&str, &str)]) -> String {
    let mut all: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    all.extend(extra.iter().map(|(k, v)| format!("{k}=\"{v}\"")));
    format!("{name}{{{}}}", all.join(","))
}

#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn each_alert_fires_on_its_condition_only() {
    tap_e2e::util::require_e2e_tier();
    let r = rule(&["metrics.serviceMonitor.enabled=true"]);
    let dir = temp_dir("tap-e2e-promtest").expect("temp dir");
    rule_file(&dir, &r);
    let (a, b) = (agent_labels("node-a"), agent_labels("node-b"));
    // with() adds the labels a sum-free alert keeps from its series.
    let with = |l: &BTreeMap<&'static str, &'static str>,
                extra: &[(&'static str, &'static str)]| {
        let mut l = l.clone();
        l.extend(extra.iter().copied());
        l
    };
    let op = |pod: &'static str| {
        BTreeMap::from([
            ("job", OPERATOR_JOB),
            ("namespace", NS),
            ("pod", pod),
            (
                "instance",
                if pod == "op-1" {
                    "op-1:8080"
                } else {
                    "op-2:8080"
                },
            ),
        ])
    };
    // Minute by minute (promtool's expanding notation: `1 1 0x10` is 1, 1, then 0 eleven times).
    // Node a goes bad at minute 2 and stays so; node b stays fine or has a blip.
    let down_from_2 = "1 1 0x20";
    let input = vec![
        json!({"series": series("up", &a, &[]), "values": down_from_2}),
        json!({"series": series("up", &b, &[]), "values": "1x22"}),
        json!({"series": series("tap_proxy_up", &a, &[]), "values": down_from_2}),
        json!({"series": series("tap_proxy_up", &b, &[]), "values": "1 0 0 1x19"}),
        json!({"series": series("tap_runtime_connected", &a, &[]), "values": down_from_2}),
        json!({"series": series("tap_runtime_connected", &b, &[]), "values": "1x22"}),
        // One timeout a minute on node a, spread over two hooks (summed); one annotation
        // error on node b, ever.
        json!({"series": series("tap_errors_total", &a, &[("hook", "create"), ("kind", "timeout")]), "values": "0+1x22"}),
        json!({"series": series("tap_errors_total", &a, &[("hook", "update"), ("kind", "timeout")]), "values": "0x22"}),
        json!({"series": series("tap_errors_total", &b, &[("hook", "create"), ("kind", "annotation")]), "values": "0 0 0 1x20"}),
        // Node a's runtime refuses a cpuset write a minute; node b's writes succeed.
        json!({"series": series("tap_cpuset_writes_total", &a, &[("result", "refused")]), "values": "0 0 0+1x20"}),
        json!({"series": series("tap_cpuset_writes_total", &a, &[("result", "ok")]), "values": "0+5x22"}),
        json!({"series": series("tap_cpuset_writes_total", &b, &[("result", "ok")]), "values": "0+5x22"}),
        json!({"series": series("tap_cpuset_writes_total", &b, &[("result", "refused")]), "values": "0x22"}),
        // Three containers stay off their CPUs on node a from minute 2; two for a minute on b.
        json!({"series": series("tap_unconverged_containers", &a, &[]), "values": "0 0 3x20"}),
        json!({"series": series("tap_unconverged_containers", &b, &[]), "values": "0 2 0x20"}),
    ];
    // Each alert: quiet at its first minute, firing with its labels and value at the second.
    let labelled = |extra: &[(&'static str, &'static str)]| with(&a, extra);
    let agent_cases = quiet_then_firing(
        &r,
        &[
            ("KunpengTapAgentDown", 6, 8, a.clone(), "0"),
            ("KunpengTapProxyDown", 6, 8, a.clone(), "0"),
            ("KunpengTapRuntimeDisconnected", 6, 8, a.clone(), "0"),
            (
                "KunpengTapErrors",
                4,
                20,
                labelled(&[("kind", "timeout")]),
                "10",
            ),
            (
                "KunpengTapPlacementRefused",
                2,
                20,
                labelled(&[("result", "refused")]),
                "10",
            ),
            ("KunpengTapContainersUnconverged", 12, 18, a.clone(), "3"),
        ],
    );
    let operator_input = vec![
        json!({"series": series("up", &op("op-1"), &[]), "values": down_from_2}),
        json!({"series": series("up", &op("op-2"), &[]), "values": "1 1 1 0x19"}),
        json!({"series": series("tap_operator_leader", &op("op-1"), &[]), "values": "1 1 1 1 0 0 0 0 0 0 0 0 0x10"}),
        json!({"series": series("tap_operator_leader", &op("op-2"), &[]), "values": "0 0 0 0 1 1 1 0 0 0 0 0 0x10"}),
    ];
    let no_labels = BTreeMap::new();
    // One replica down is no alert; both for 5m is. The hand-over at minute 4 is no alert; no
    // leader from minute 7 for 5m is.
    let operator_cases = quiet_then_firing(
        &r,
        &[
            ("KunpengTapOperatorDown", 6, 9, no_labels.clone(), "0"),
            ("KunpengTapOperatorNoLeader", 8, 13, no_labels.clone(), "0"),
        ],
    );
    let tests = json!({
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {"interval": "1m", "input_series": input, "alert_rule_test": agent_cases},
            {"interval": "1m", "input_series": operator_input, "alert_rule_test": operator_cases},
        ],
    });
    let n_cases = agent_cases.len() + operator_cases.len();
    std::fs::write(
        dir.join("tests.yaml"),
        serde_yaml::to_string(&tests).expect("YAML"),
    )
    .expect("write");
    let (ok, out) = promtool_run(&["test", "rules", "tests.yaml"], &dir);
    assert!(
        ok,
        "promtool test rules:\n{out}\n--- tests.yaml ---\n{}",
        std::fs::read_to_string(dir.join("tests.yaml")).unwrap_or_default()
    );
    assert!(out.contains("SUCCESS"), "{out}");
    eprintln!("promtool test rules: {n_cases} cases over 8 alerts passed");
    let _ = std::fs::remove_dir_all(&dir);
}
