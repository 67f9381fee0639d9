//! e2e: the Helm chart with the real `helm` (built from helm.sh/helm/v3 by
//! hack/e2e/setup-helm.sh): lint, render with several value sets and check what comes out, and
//! apply the rendered manifests to the real kube-apiserver of the e2e tier (server-side dry
//! run, then a real `helm install`, `kubectl get nodetopology`, `helm uninstall`), using the
//! shared kube-apiserver harness (`tap_e2e::kube`, hack/e2e/setup-kube.sh).

use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Command, Output};
use tap_e2e::helm::{chart, docs, helm, helm_bin, ok, run, template_in};
use tap_e2e::kube::{kubectl_bin, KubeCluster};
use tap_e2e::util::workspace_root;

const NS: &str = "kunpeng-tap";
const RELEASE: &str = "tap";

/// `helm template` of the release `tap` in `kunpeng-tap`; the YAML text.
fn template_text(sets: &[&str], extra: &[&str]) -> String {
    template_in(RELEASE, NS, sets, extra)
}

fn render(sets: &[&str]) -> Vec<Value> {
    docs(&template_text(sets, &[]))
}

fn kinds(objs: &[Value]) -> Vec<String> {
    let mut k: Vec<String> = objs
        .iter()
        .map(|o| o["kind"].as_str().unwrap_or("?").to_string())
        .collect();
    k.sort();
    k
}

fn one<'a>(objs: &'a [Value], kind: &str) -> &'a Value {
    let v: Vec<&Value> = objs.iter().filter(|o| o["kind"] == kind).collect();
    assert_eq!(v.len(), 1, "exactly one {kind} expected, got {}", v.len());
    v[0]
}

fn args_of(container: &Value) -> Vec<String> {
    container["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg").to_string())
        .collect()
}

fn has_arg(args: &[String], a: &str) -> bool {
    args.iter().any(|x| x == a)
}

#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn chart_lints_clean_with_each_value_set() {
    tap_e2e::util::require_e2e_tier();
    for sets in [
        vec![],
        vec!["agent.enableNri.enabled=true"],
        vec!["agent.flags.containerRuntimeMode=Containerd"],
        vec!["agent.flags.containerRuntimeMode=Docker,agent.flags.containerRuntimeServiceEndpoint=/var/run/docker.sock"],
        vec!["metrics.serviceMonitor.enabled=true", "agent.flags.metricsBindAddress="],
        vec!["metrics.podMonitor.enabled=true", "metrics.podMonitor.namespace=monitoring"],
        vec!["operator.enabled=false", "rbac.create=false"],
        vec![
            "metrics.prometheusRule.enabled=true",
            "metrics.prometheusRule.force=true",
            "metrics.podMonitor.enabled=true",
        ],
        vec!["operator.replicas=1", "operator.leaderElection.enabled=false"],
    ] {
        let mut c = helm();
        c.args(["lint", "--strict", &chart(), "--namespace", NS]);
        for s in &sets {
            c.args(["--set", s]);
        }
        let out = ok(c);
        assert!(out.contains("0 chart(s) failed"), "helm lint {sets:?}:\n{out}");
        eprintln!("helm lint --strict {sets:?}: ok");
    }
}

#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn default_render_is_an_nri_daemonset_with_minimal_privileges_and_an_ha_operator() {
    tap_e2e::util::require_e2e_tier();
    let objs = render(&[]);
    assert_eq!(
        kinds(&objs),
        [
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            "ClusterRoleBinding",
            "DaemonSet",
            "Deployment",
            "PodDisruptionBudget",
            "Role",
            "RoleBinding",
            "Service",
            "Service",
            "ServiceAccount",
            "ServiceAccount",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding"
        ]
    );
    for o in &objs {
        let ns = &o["metadata"]["namespace"];
        let cluster_scoped = [
            "ClusterRole",
            "ClusterRoleBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ]
        .contains(&o["kind"].as_str().unwrap());
        assert_eq!(ns.is_null(), cluster_scoped, "namespace of {o}");
        if !cluster_scoped {
            assert_eq!(ns, NS);
        }
    }

    // Agent.
    let ds = one(&objs, "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let args = args_of(c);
    for a in [
        "--container-runtime-mode=NRI",
        "--nri-socket-path=/var/run/nri/nri.sock",
        "--resource-policy=topology-aware",
        "--sysfs-root=/host/sys",
        "--metrics-bind-address=:9091",
        "--enable-node-topology=true",
        "--log-format=json",
        "--verbose=2",
    ] {
        assert!(has_arg(&args, a), "{a} not in {args:?}");
    }
    assert!(!args
        .iter()
        .any(|a| a.starts_with("--fold-cpus-to-host") || a == "--explain"));
    assert_eq!(
        c["env"][0],
        json!({"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    );
    let sc = &c["securityContext"];
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert!(sc["capabilities"]["add"].is_null());
    assert!(pod["hostPID"].is_null() && pod["hostNetwork"].is_null() && pod["hostIPC"].is_null());
    assert!(pod["initContainers"].is_null());
    let mounts = c["volumeMounts"].as_array().unwrap();
    let vols = pod["volumes"].as_array().unwrap();
    let host_path = |name: &str| {
        vols.iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("volume {name}"))["hostPath"]["path"]
            .clone()
    };
    let mount = |name: &str| {
        mounts
            .iter()
            .find(|m| m["name"] == name)
            .unwrap_or_else(|| panic!("mount {name}"))
            .clone()
    };
    assert_eq!(host_path("host-sys"), "/sys");
    assert_eq!(mount("host-sys")["mountPath"], "/host/sys");
    assert_eq!(mount("host-sys")["readOnly"], true);
    // The cgroup filesystem, read-write in NRI mode: the agent writes cpusets where containerd
    // takes no unsolicited update (--nri-cgroup-writes=auto).
    assert_eq!(host_path("host-cgroup"), "/sys/fs/cgroup");
    assert_eq!(mount("host-cgroup")["mountPath"], "/host/cgroup");
    assert_eq!(mount("host-cgroup")["readOnly"], false);
    assert!(has_arg(&args_of(c), "--cgroup-root=/host/cgroup"));
    assert!(has_arg(&args_of(c), "--nri-cgroup-writes=auto"));
    assert_eq!(host_path("nri-socket-dir"), "/var/run/nri");
    assert_eq!(mount("nri-socket-dir")["mountPath"], "/var/run/nri");
    assert_eq!(host_path("state"), "/var/lib/kunpeng-tap");
    // The kubelet's pod-resources folder, read-only (device hints).
    assert_eq!(host_path("pod-resources"), "/var/lib/kubelet/pod-resources");
    assert_eq!(mount("pod-resources")["readOnly"], true);
    assert!(c["args"].as_array().is_some_and(|a| a
        .iter()
        .any(|a| a == "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock")));
    assert_eq!(mounts.len(), 5, "{mounts:?}");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["ports"][0]["containerPort"], 9091);
    assert_eq!(pod["tolerations"], json!([{"operator": "Exists"}]));
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert_eq!(
        ds["spec"]["template"]["metadata"]["labels"]["tap.kunpeng.huawei.com/skip"],
        "true"
    );
    let app_version = "0.1.0";
    assert_eq!(
        c["image"],
        format!("kunpeng-tap/kunpeng-tap-agent:{app_version}")
    );

    // Operator: 2 replicas, leader election, non-root.
    let dep = one(&objs, "Deployment");
    assert_eq!(dep["spec"]["replicas"], 2);
    let pod = &dep["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert!(has_arg(&args_of(c), "--leader-elect=true"));
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(
        pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
            ["podAffinityTerm"]["topologyKey"],
        "kubernetes.io/hostname"
    );
    // Its budget keeps one of the two up through drains and selects exactly its Pods.
    let pdb = one(&objs, "PodDisruptionBudget");
    assert_eq!(pdb["apiVersion"], "policy/v1");
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert!(pdb["spec"]["maxUnavailable"].is_null());
    assert_eq!(pdb["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow");
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        dep["spec"]["selector"]["matchLabels"]
    );

    // RBAC: each binding names the ServiceAccount the workload runs as.
    let sas: Vec<&str> = objs
        .iter()
        .filter(|o| o["kind"] == "ServiceAccount")
        .map(|o| o["metadata"]["name"].as_str().unwrap())
        .collect();
    assert!(sas.contains(
        &ds["spec"]["template"]["spec"]["serviceAccountName"]
            .as_str()
            .unwrap()
    ));
    assert!(sas.contains(&pod["serviceAccountName"].as_str().unwrap()));
    for b in objs
        .iter()
        .filter(|o| o["kind"] == "ClusterRoleBinding" || o["kind"] == "RoleBinding")
    {
        let sa = b["subjects"][0]["name"].as_str().unwrap();
        assert!(sas.contains(&sa), "{b}");
    }
    let role = one(&objs, "Role");
    assert_eq!(role["rules"][0]["resources"], json!(["leases"]));
}

#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn value_sets_change_what_is_rendered() {
    tap_e2e::util::require_e2e_tier();
    // Flags reach the args.
    let objs = render(&[
        "agent.flags.resourcePolicy=numa-aware",
        "agent.flags.enableMemoryTopology=true",
        "agent.flags.reservedCpus=0-1",
        "agent.flags.verbose=4",
        "agent.flags.nodeName=n1",
        "agent.flags.foldCpusToHost=true",
        "agent.extraArgs={--exclusive-cpus=false}",
        "agent.image.tag=dev",
    ]);
    let c = &one(&objs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0];
    let args = args_of(c);
    for a in [
        "--resource-policy=numa-aware",
        "--enable-memory-topology=true",
        "--reserved-cpus=0-1",
        "--verbose=4",
        "--node-name=n1",
        "--fold-cpus-to-host",
        "--exclusive-cpus=false",
    ] {
        assert!(has_arg(&args, a), "{a} not in {args:?}");
    }
    assert_eq!(c["image"], "kunpeng-tap/kunpeng-tap-agent:dev");

    // The opt-in NRI enabler: a privileged init container entering the host's namespaces
    // through the host's /proc (only it mounts it), running the chart's script from a
    // ConfigMap; the Pod gets no hostPID.
    let objs = render(&["agent.enableNri.enabled=true"]);
    let pod = &one(&objs, "DaemonSet")["spec"]["template"]["spec"];
    assert!(pod["hostPID"].is_null(), "hostPID: {}", pod["hostPID"]);
    let init = &pod["initContainers"][0];
    assert_eq!(init["name"], "enable-nri");
    assert_eq!(init["securityContext"]["privileged"], true);
    assert!(init["command"][2]
        .as_str()
        .unwrap()
        .contains("nsenter --mount=/host/proc/1/ns/mnt"));
    assert!(init["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["name"] == "host-proc" && m["mountPath"] == "/host/proc"));
    assert!(!pod["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["name"] == "host-proc"));
    let cm = one(&objs, "ConfigMap");
    let script =
        std::fs::read_to_string(workspace_root().join("charts/kunpeng-tap/files/enable-nri.sh"))
            .unwrap();
    assert_eq!(
        cm["data"]["enable-nri.sh"].as_str().unwrap().trim_end(),
        script.trim_end()
    );
    // The agent container itself stays unprivileged.
    assert_eq!(pod["containers"][0]["securityContext"]["privileged"], false);

    // Proxy mode: the runtime's socket folder and the proxy socket folder instead of NRI's.
    let objs = render(&["agent.flags.containerRuntimeMode=Containerd"]);
    let pod = &one(&objs, "DaemonSet")["spec"]["template"]["spec"];
    let cgroup = pod["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "host-cgroup")
        .cloned()
        .expect("cgroup mount");
    assert_eq!(cgroup["readOnly"], true, "proxies only read cgroups");
    let paths: Vec<&str> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["hostPath"]["path"].as_str())
        .collect();
    assert_eq!(
        paths,
        [
            "/sys",
            "/sys/fs/cgroup",
            "/var/lib/kunpeng-tap",
            "/var/lib/kubelet/pod-resources",
            "/var/run/containerd",
            "/var/run/kunpeng"
        ]
    );
    // podResourcesSocket empty: no mount, and the flag says off.
    let objs = render(&["agent.flags.podResourcesSocket="]);
    let pod = &one(&objs, "DaemonSet")["spec"]["template"]["spec"];
    assert!(!pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|v| v["name"] == "pod-resources"));

    // Metrics off: no port, no probes, no agent Service; ServiceMonitors on request.
    let objs = render(&[
        "agent.flags.metricsBindAddress=",
        "metrics.serviceMonitor.enabled=true",
    ]);
    let c = &one(&objs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0];
    assert!(c["ports"].is_null() && c["readinessProbe"].is_null());
    let sm: Vec<&Value> = objs
        .iter()
        .filter(|o| o["kind"] == "ServiceMonitor")
        .collect();
    assert_eq!(sm.len(), 1, "only the operator has a metrics port now");
    let objs = render(&[
        "metrics.serviceMonitor.enabled=true",
        "metrics.serviceMonitor.labels.release=prom",
    ]);
    let sm: Vec<&Value> = objs
        .iter()
        .filter(|o| o["kind"] == "ServiceMonitor")
        .collect();
    assert_eq!(sm.len(), 2);
    for s in sm {
        assert_eq!(s["metadata"]["labels"]["release"], "prom");
        assert_eq!(s["spec"]["endpoints"][0]["path"], "/metrics");
    }

    // The operator's PodDisruptionBudget: none for a single replica (it would block every
    // drain) or when turned off; maxUnavailable, when set, replaces minAvailable.
    let pdbs = |sets: &[&str]| -> Vec<Value> {
        render(sets)
            .into_iter()
            .filter(|o| o["kind"] == "PodDisruptionBudget")
            .collect()
    };
    assert!(pdbs(&[
        "operator.replicas=1",
        "operator.leaderElection.enabled=false"
    ])
    .is_empty());
    assert!(pdbs(&["operator.podDisruptionBudget.enabled=false"]).is_empty());
    assert!(pdbs(&["operator.enabled=false"]).is_empty());
    let three = pdbs(&[
        "operator.replicas=3",
        "operator.podDisruptionBudget.maxUnavailable=1",
        "operator.podDisruptionBudget.unhealthyPodEvictionPolicy=",
    ]);
    let pdb = &three[0];
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert!(pdb["spec"]["minAvailable"].is_null(), "{pdb}");
    assert!(pdb["spec"]["unhealthyPodEvictionPolicy"].is_null(), "{pdb}");
    let half = pdbs(&["operator.podDisruptionBudget.minAvailable=50%"]);
    let pdb = &half[0];
    assert_eq!(pdb["spec"]["minAvailable"], "50%");

    // What the schema cannot see fails at render time with a message saying what to do (the
    // schema's checks are in values_schema_refuses_bad_values).
    let mut c = helm();
    c.args([
        "template",
        RELEASE,
        &chart(),
        "--set",
        "operator.leaderElection.enabled=false",
    ]);
    let out = run(c);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("needs operator.leaderElection.enabled=true"),
        "{err}"
    );
}

/// The prometheus-operator objects: a ServiceMonitor or (the alternative) a PodMonitor per
/// component, each relabelling the scraped Pod's node into a `node` label, in the release
/// namespace or the override, always selecting the release namespace's objects.
#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn monitors_add_a_node_label_and_follow_the_namespace_override() {
    tap_e2e::util::require_e2e_tier();
    let node_relabel = json!([{
        "action": "replace",
        "sourceLabels": ["__meta_kubernetes_pod_node_name"],
        "targetLabel": "node",
    }]);
    for (kind, endpoints, sets) in [
        (
            "ServiceMonitor",
            "endpoints",
            vec!["metrics.serviceMonitor.enabled=true"],
        ),
        (
            "ServiceMonitor",
            "endpoints",
            vec![
                "metrics.serviceMonitor.enabled=true",
                "metrics.serviceMonitor.namespace=monitoring",
                "metrics.serviceMonitor.interval=15s",
            ],
        ),
        (
            "PodMonitor",
            "podMetricsEndpoints",
            vec!["metrics.podMonitor.enabled=true"],
        ),
        (
            "PodMonitor",
            "podMetricsEndpoints",
            vec![
                "metrics.podMonitor.enabled=true",
                "metrics.podMonitor.namespace=monitoring",
                "metrics.podMonitor.labels.release=prom",
            ],
        ),
    ] {
        let objs = render(&sets);
        let want_ns = if sets.iter().any(|s| s.contains("namespace=monitoring")) {
            "monitoring"
        } else {
            NS
        };
        let monitors: Vec<&Value> = objs
            .iter()
            .filter(|o| o["kind"] == "ServiceMonitor" || o["kind"] == "PodMonitor")
            .collect();
        assert_eq!(monitors.len(), 2, "{sets:?}: one per component");
        let mut components = Vec::new();
        for m in monitors {
            assert_eq!(m["kind"], kind, "{sets:?}");
            assert_eq!(m["apiVersion"], "monitoring.coreos.com/v1");
            assert_eq!(m["metadata"]["namespace"], want_ns, "{sets:?}");
            assert_eq!(m["spec"]["namespaceSelector"]["matchNames"], json!([NS]));
            let component = m["metadata"]["labels"]["app.kubernetes.io/component"]
                .as_str()
                .unwrap()
                .to_string();
            assert_eq!(
                m["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"],
                component.as_str()
            );
            let ep = &m["spec"][endpoints][0];
            assert_eq!(ep["port"], "metrics", "{sets:?}");
            assert_eq!(ep["path"], "/metrics");
            assert_eq!(ep["relabelings"], node_relabel, "{sets:?}");
            if sets.iter().any(|s| s.contains("interval=15s")) {
                assert_eq!(ep["interval"], "15s");
            }
            if sets.iter().any(|s| s.contains("release=prom")) {
                assert_eq!(m["metadata"]["labels"]["release"], "prom");
            }
            components.push(component);
        }
        components.sort();
        assert_eq!(components, ["agent", "operator"]);
        // The port the monitors name exists on both workloads' Pods (and the Services).
        for workload in ["DaemonSet", "Deployment"] {
            let c = &one(&objs, workload)["spec"]["template"]["spec"]["containers"][0];
            assert_eq!(c["ports"][0]["name"], "metrics", "{workload}");
        }
    }
    // Both at once would scrape every target twice.
    let mut c = helm();
    c.args(["template", RELEASE, &chart()]).args([
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.podMonitor.enabled=true",
    ]);
    let out = run(c);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("choose one"), "{err}");
    // Off by default.
    assert!(!render(&[])
        .iter()
        .any(|o| o["kind"] == "ServiceMonitor" || o["kind"] == "PodMonitor"));
}

/// `helm lint --strict` and `helm template` of the chart with `sets`: (lint ok, template ok,
/// both outputs).
fn lint_and_template(sets: &[&str]) -> (bool, bool, String) {
    let mut lint = helm();
    lint.args(["lint", "--strict", &chart(), "--namespace", NS]);
    let mut tmpl = helm();
    tmpl.args(["template", RELEASE, &chart(), "--namespace", NS]);
    for s in sets {
        lint.args(["--set", s]);
        tmpl.args(["--set", s]);
    }
    let (l, t) = (run(lint), run(tmpl));
    let text = |o: &Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    (
        l.status.success(),
        t.status.success(),
        format!("lint: {}\ntemplate: {}", text(&l), text(&t)),
    )
}

/// values.schema.json: misspelt keys, wrong types and malformed values are refused by the real
/// `helm lint` and `helm template` (instead of rendering silently), each naming the value;
/// good value sets still pass both.
#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn values_schema_refuses_bad_values() {
    tap_e2e::util::require_e2e_tier();
    for (set, needle) in [
        // Three bad values: a typo, a word for a number, a malformed CPU list.
        (
            "agent.flags.resourcPolicy=numa-aware",
            "additional properties 'resourcPolicy' not allowed",
        ),
        ("operator.replicas=two", "/operator/replicas"),
        (
            "agent.flags.nodeResourceTopology=yes",
            "/agent/flags/nodeResourceTopology",
        ),
        ("agent.flags.podEvents=sometimes", "/agent/flags/podEvents"),
        (
            "agent.flags.reservedCpus=0-1;3",
            "/agent/flags/reservedCpus",
        ),
        (
            "agent.flags.resourcePolicy=best",
            "/agent/flags/resourcePolicy",
        ),
        (
            "agent.flags.resourcePriority=io-first",
            "/agent/flags/resourcePriority",
        ),
        (
            "agent.flags.containerRuntimeMode=crio",
            "/agent/flags/containerRuntimeMode",
        ),
        (
            "agent.flags.nriPluginIndex=7",
            "/agent/flags/nriPluginIndex",
        ),
        ("agent.flags.logFormat=xml", "/agent/flags/logFormat"),
        (
            "agent.flags.gracefulTimeout=soon",
            "/agent/flags/gracefulTimeout",
        ),
        (
            "agent.flags.metricsBindAddress=9091",
            "/agent/flags/metricsBindAddress",
        ),
        (
            "agent.flags.exclusiveCpus=maybe",
            "/agent/flags/exclusiveCpus",
        ),
        (
            "agent.image.pullPolicy=Sometimes",
            "/agent/image/pullPolicy",
        ),
        ("operator.metricsPort=http", "/operator/metricsPort"),
        ("operator.replicas=-1", "/operator/replicas"),
        (
            "operator.leaderElection.leaseDuration=15",
            "/operator/leaderElection/leaseDuration",
        ),
        (
            "agnet.enabled=false",
            "additional properties 'agnet' not allowed",
        ),
        (
            "metrics.serviceMonitor.enable=true",
            "additional properties 'enable' not allowed",
        ),
        (
            "metrics.podMonitor.interval=30",
            "/metrics/podMonitor/interval",
        ),
        (
            "metrics.prometheusRule.for=5",
            "/metrics/prometheusRule/for",
        ),
        (
            "metrics.prometheusRule.errorThreshold=many",
            "/metrics/prometheusRule/errorThreshold",
        ),
        (
            "metrics.prometheusRule.severity=page",
            "additional properties 'severity' not allowed",
        ),
        (
            "operator.podDisruptionBudget.minAvailable=half",
            "/operator/podDisruptionBudget/minAvailable",
        ),
        (
            "operator.podDisruptionBudget.unhealthyPodEvictionPolicy=Never",
            "/operator/podDisruptionBudget/unhealthyPodEvictionPolicy",
        ),
    ] {
        let (lint_ok, template_ok, out) = lint_and_template(&[set]);
        assert!(!lint_ok, "helm lint accepted {set}:\n{out}");
        assert!(!template_ok, "helm template accepted {set}:\n{out}");
        assert!(
            out.matches(needle).count() >= 2,
            "{set}: both should name {needle:?}:\n{out}"
        );
        eprintln!("refused {set}");
    }
    for sets in [
        vec![],
        vec!["agent.flags.reservedCpus=0-1\\,8", "operator.replicas=3"],
        vec![
            "agent.flags.reservedCpus=3",
            "agent.flags.nriPluginIndex=20",
        ],
        vec![
            "agent.flags.containerRuntimeMode=docker",
            "agent.flags.socketGroup=1000",
        ],
        vec![
            "agent.flags.resourcePolicy=numa-aware",
            "agent.flags.gracefulTimeout=1m30s",
        ],
        vec![
            "agent.flags.metricsBindAddress=0.0.0.0:9100",
            "agent.flags.verbose=5",
        ],
        vec![
            "operator.leaderElection.enabled=false",
            "operator.replicas=1",
        ],
        vec![
            "operator.podDisruptionBudget.minAvailable=50%",
            "metrics.prometheusRule.errorThreshold=0.5",
            "metrics.prometheusRule.unconvergedFor=1h30m",
        ],
        vec!["operator.podDisruptionBudget.maxUnavailable=1"],
    ] {
        let (lint_ok, template_ok, out) = lint_and_template(&sets);
        assert!(lint_ok && template_ok, "{sets:?} refused:\n{out}");
    }
}

#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn crds_ship_with_the_chart() {
    tap_e2e::util::require_e2e_tier();
    let with = docs(&template_text(&[], &["--include-crds"]));
    let crds: Vec<&Value> = with
        .iter()
        .filter(|o| o["kind"] == "CustomResourceDefinition")
        .collect();
    let names: Vec<&str> = crds
        .iter()
        .map(|c| c["metadata"]["name"].as_str().unwrap())
        .collect();
    assert!(
        names.iter().any(|n| n.starts_with("nodetopologies.")),
        "{names:?}"
    );
    assert!(
        names.iter().any(|n| n.starts_with("topologypolicies.")),
        "{names:?}"
    );
    // The RBAC rules name the CRDs' group and plural.
    let objs = render(&[]);
    for crd in crds {
        let group = crd["spec"]["group"].as_str().unwrap();
        let plural = crd["spec"]["names"]["plural"].as_str().unwrap();
        let covered = objs
            .iter()
            .filter(|o| o["kind"] == "ClusterRole")
            .flat_map(|r| r["rules"].as_array().unwrap().iter())
            .any(|rule| {
                rule["apiGroups"]
                    .as_array()
                    .unwrap()
                    .contains(&json!(group))
                    && rule["resources"]
                        .as_array()
                        .unwrap()
                        .contains(&json!(plural))
            });
        assert!(covered, "no ClusterRole rule for {plural}.{group}");
    }
}

/// containerd 1.7 from hack/e2e/setup-containerd.sh (or `TAP_CONTAINERD`).
fn containerd_bin() -> PathBuf {
    tap_e2e::util::installed(
        "TAP_CONTAINERD",
        "/var/cache/kunpeng-tap/containerd/root/usr/bin/containerd",
        "hack/e2e/setup-containerd.sh (containerd 1.7)",
    )
}

/// A containerd on private sockets and dirs; killed on drop.
struct Containerd(std::process::Child);

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for(path: &std::path::Path, secs: u64) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if path.exists() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    path.exists()
}

/// Starts containerd with `config`, waits for its API socket, says whether the NRI socket came.
fn nri_socket_appears(dir: &std::path::Path, config: &std::path::Path, run: &str) -> bool {
    let sock = dir.join(format!("{run}.sock"));
    let nri = dir.join("nri.sock");
    let _ = std::fs::remove_file(&nri);
    let log = std::fs::File::create(dir.join(format!("{run}.log"))).unwrap();
    let child = Command::new(containerd_bin())
        .arg("--config")
        .arg(config)
        .arg("--root")
        .arg(dir.join(format!("{run}-root")))
        .arg("--state")
        .arg(dir.join(format!("{run}-state")))
        .arg("--address")
        .arg(&sock)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("starting containerd");
    let _guard = Containerd(child);
    assert!(
        wait_for(&sock, 30),
        "containerd did not come up:\n{}",
        std::fs::read_to_string(dir.join(format!("{run}.log"))).unwrap_or_default()
    );
    // NRI starts with the other plugins; give it a moment after the API socket.
    wait_for(&nri, 3)
}

#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn enable_nri_script_turns_on_nri_in_a_real_containerd_1_7() {
    tap_e2e::util::require_e2e_tier();
    let tmp = TempDir::new("enable-nri");
    let dir = tmp.0.clone();
    let out = run({
        let mut c = Command::new(containerd_bin());
        c.args(["config", "default"]);
        c
    });
    assert!(out.status.success(), "containerd config default failed");
    let default = String::from_utf8(out.stdout).unwrap();
    assert!(
        default.contains("[plugins.\"io.containerd.nri.v1.nri\"]\n    disable = true"),
        "containerd 1.7's default config should ship NRI disabled"
    );
    // Keep this containerd away from the machine's paths. (The CRI plugin stays: containerd
    // 1.7 opens the NRI socket when CRI starts.)
    let d = dir.display();
    let config = default
        .replace("/var/run/nri/nri.sock", &format!("{d}/nri.sock"))
        .replace("/etc/nri/conf.d", &format!("{d}/nri-conf.d"))
        .replace("/opt/nri/plugins", &format!("{d}/nri-plugins"))
        .replace("/opt/containerd", &format!("{d}/opt"))
        .replace("/etc/cni/net.d", &format!("{d}/cni-conf"))
        .replace("/opt/cni/bin", &format!("{d}/cni-bin"))
        .replace("\"/var/lib/containerd\"", &format!("\"{d}/root\""))
        .replace("\"/run/containerd", &format!("\"{d}/run"));
    let cfg = dir.join("config.toml");
    std::fs::write(&cfg, &config).unwrap();

    // As shipped: no NRI socket.
    assert!(
        !nri_socket_appears(&dir, &cfg, "before"),
        "NRI socket present with NRI disabled"
    );

    // The chart's script, as the init container runs it (restart recorded instead of done).
    let marker = dir.join("restarted");
    let out = run({
        let mut c = Command::new("sh");
        c.arg(workspace_root().join("charts/kunpeng-tap/files/enable-nri.sh"))
            .env("CONTAINERD_CONFIG", &cfg)
            .env("RESTART_COMMAND", format!("touch '{}'", marker.display()));
        c
    });
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        marker.exists(),
        "containerd restart not requested after a change"
    );

    // containerd loads the result and serves NRI.
    let dump = run({
        let mut c = Command::new(containerd_bin());
        c.arg("--config").arg(&cfg).args(["config", "dump"]);
        c
    });
    let dump = String::from_utf8_lossy(&dump.stdout);
    assert!(
        dump.contains("[plugins.\"io.containerd.nri.v1.nri\"]\n    disable = false"),
        "{dump}"
    );
    assert!(
        nri_socket_appears(&dir, &cfg, "after"),
        "no NRI socket after enable-nri.sh:\n{}",
        std::fs::read_to_string(dir.join("after.log")).unwrap_or_default()
    );
}

/// The enable-NRI init container's command as the chart renders it, run the way a container
/// without hostPID runs it: in a new PID namespace and a new mount namespace (where a tmpfs
/// hides the work dir), with the host's /proc where the chart mounts it. A stand-in process of
/// this test plays the host's PID 1 (the sandbox may not let a test read the real PID 1's
/// namespaces). The script must edit the config in the host's mount namespace, and its restart
/// command must run there while staying in the container's PID namespace.
#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn enable_nri_init_command_reaches_the_host_without_host_pid() {
    tap_e2e::util::require_e2e_tier();
    let objs = render(&["agent.enableNri.enabled=true"]);
    let pod = &one(&objs, "DaemonSet")["spec"]["template"]["spec"];
    assert!(pod["hostPID"].is_null());
    let init = &pod["initContainers"][0];
    assert_eq!(init["command"][0], "sh");
    let rendered = init["command"][2].as_str().unwrap().to_string();
    let host_proc = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "host-proc")
        .expect("host-proc volume");
    assert_eq!(host_proc["hostPath"]["path"], "/proc");

    let tmp = TempDir::new("enable-nri-ns");
    let work = tmp.0.join("host");
    std::fs::create_dir_all(&work).unwrap();
    let cfg = work.join("config.toml");
    std::fs::write(
        &cfg,
        "version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = true\n",
    )
    .unwrap();
    let marker = work.join("restarted");
    let mut stand_in = Command::new("sleep").arg("60").spawn().expect("sleep");
    let pid = stand_in.id();
    let script = workspace_root().join("charts/kunpeng-tap/files/enable-nri.sh");
    // Not remounting /proc inside keeps the host's procfs visible there, as the hostPath does.
    let cmd = rendered
        .replace("/host/proc/1/", &format!("/proc/{pid}/"))
        .replace("/scripts/enable-nri.sh", &script.to_string_lossy());
    let out = run({
        let mut c = Command::new("unshare");
        c.args([
            "--pid",
            "--fork",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
        ])
        .arg(format!(
            "mount -t tmpfs none '{w}' && test ! -e '{w}/config.toml' && {cmd}",
            w = work.display()
        ))
        .env("CONTAINERD_CONFIG", &cfg)
        .env(
            "RESTART_COMMAND",
            format!(
                "echo $(readlink /proc/self/ns/mnt) $(readlink /proc/self/ns/pid) > '{}'",
                marker.display()
            ),
        );
        c
    });
    let _ = stand_in.kill();
    let _ = stand_in.wait();
    assert!(
        out.status.success(),
        "{cmd}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let edited = std::fs::read_to_string(&cfg).unwrap();
    assert!(
        edited.contains("disable = false"),
        "the host's config was not edited:\n{edited}"
    );
    let seen = std::fs::read_to_string(&marker).expect("restart command ran on the host");
    let ns = |kind: &str| std::fs::read_link(format!("/proc/self/ns/{kind}")).unwrap();
    let seen: Vec<&str> = seen.split_whitespace().collect();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(
        seen[0],
        ns("mnt").to_string_lossy(),
        "restart not in the host mount namespace"
    );
    assert_ne!(
        seen[1],
        ns("pid").to_string_lossy(),
        "the test did not run it in a PID namespace of its own"
    );
}

/// A temp dir removed on drop (test failures included).
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("tap-e2e-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp dir");
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// kubectl (built by hack/e2e/setup-kube.sh, matching the API server) with a kubeconfig.
fn kubectl(kubeconfig: &std::path::Path) -> Command {
    let mut c = Command::new(kubectl_bin());
    c.arg("--kubeconfig").arg(kubeconfig);
    c
}

/// The platform team's path against a real kube-apiserver: the rendered manifests pass a
/// strict server-side dry run, `helm install` creates everything, the CRDs serve
/// (`kubectl get nodetopology`), the documented TopologyPolicy example is accepted, the
/// ServiceAccounts have exactly the rights the components need, and `helm uninstall` removes
/// the release but keeps the CRDs.
fn install_path(kubeconfig: &std::path::Path, work: &std::path::Path) {
    let kc = |args: &[&str]| {
        let mut c = kubectl(kubeconfig);
        c.args(args);
        ok(c)
    };
    // The README's install block, as written: the namespace and its label now, `helm install`
    // after the dry runs below (which need the namespace).
    let readme = ReadmeShell::new(kubeconfig, work);
    let commands = readme_install_commands();
    let (install, namespace) = commands
        .split_last()
        .expect("commands in the README's install block");
    assert!(install.starts_with("helm install"), "{install}");
    for c in namespace {
        readme.run(c);
    }
    let label = kc(&[
        "get",
        "namespace",
        NS,
        "-o",
        "jsonpath={.metadata.labels.pod-security\\.kubernetes\\.io/enforce}",
    ]);
    assert_eq!(label, "privileged");

    // 1. Server-side dry run of everything the chart renders by default (CRDs included),
    //    with strict field validation: an unknown or misspelt field fails.
    let dry_run = |sets: &[&str], name: &str| -> (Output, usize) {
        let rendered = template_text(sets, &["--include-crds"]);
        let file = work.join(name);
        std::fs::write(&file, &rendered).unwrap();
        let mut c = kubectl(kubeconfig);
        c.args([
            "apply",
            "--server-side",
            "--dry-run=server",
            "--validate=strict",
            "--field-manager=tap-e2e",
            "-f",
            &file.to_string_lossy(),
            "-o",
            "json",
        ]);
        (run(c), docs(&rendered).len())
    };
    let (out, n_rendered) = dry_run(&[], "rendered.yaml");
    assert!(
        out.status.success(),
        "server-side dry run refused the default chart: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: Value = serde_json::from_slice(&out.stdout).expect("kubectl -o json");
    let items = list["items"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| vec![list.clone()]);
    assert_eq!(
        items.len(),
        n_rendered,
        "server returned {} of {n_rendered} objects",
        items.len()
    );
    let ds = items
        .iter()
        .find(|o| o["kind"] == "DaemonSet")
        .expect("DaemonSet");
    // Defaulted by the server: the object really went through the API server's pipeline.
    assert_eq!(ds["spec"]["template"]["spec"]["dnsPolicy"], "ClusterFirst");
    assert_eq!(ds["spec"]["revisionHistoryLimit"], 10);
    eprintln!("server-side dry run: {n_rendered} objects accepted");

    // The other value sets pass too; the opt-in enable-NRI step needs privileged Pods, which
    // an API server without --allow-privileged (as here) refuses, for that reason only.
    for sets in [
        vec!["agent.flags.containerRuntimeMode=Containerd"],
        vec!["operator.enabled=false", "agent.flags.metricsBindAddress="],
    ] {
        let (out, _) = dry_run(&sets, "variant.yaml");
        assert!(
            out.status.success(),
            "dry run {sets:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (out, _) = dry_run(&["agent.enableNri.enabled=true"], "enable-nri.yaml");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success()
            || (err.contains("initContainers[0].securityContext.privileged: Forbidden")
                && !err.contains("containers[0]")),
        "dry run with agent.enableNri.enabled=true: {err}"
    );
    eprintln!(
        "enable-NRI variant: {}",
        if out.status.success() {
            "accepted".into()
        } else {
            err.trim().to_string()
        }
    );

    // 2. helm install for real, the README's command (no --wait: there are no nodes or
    //    controllers here); the images are the ones it names under $REG.
    let out = readme.run(install);
    assert!(out.contains("STATUS: deployed"), "{out}");
    for (kind, name, image) in [
        ("daemonset", "tap-kunpeng-tap-agent", "kunpeng-tap-agent"),
        (
            "deployment",
            "tap-kunpeng-tap-operator",
            "kunpeng-tap-operator",
        ),
    ] {
        let got = kc(&[
            "-n",
            NS,
            "get",
            kind,
            name,
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        ]);
        let want = format!("{README_REG}/{image}:");
        assert!(
            got.starts_with(&want),
            "{kind} {name} runs {got}, not {want}*"
        );
    }
    assert!(out.contains("kubectl get nodetopology"), "NOTES: {out}");
    // The e2e tier's kube-apiserver (1.37) serves ValidatingAdmissionPolicy: the restriction is installed.
    assert!(
        out.contains("Node restriction is on: the ValidatingAdmissionPolicy tap-kunpeng-tap-agent-node-restriction"),
        "NOTES: {out}"
    );
    kc(&[
        "get",
        "validatingadmissionpolicy",
        "tap-kunpeng-tap-agent-node-restriction",
    ]);
    let pdb = kc(&[
        "-n",
        NS,
        "get",
        "poddisruptionbudget",
        "tap-kunpeng-tap-operator",
        "-o",
        "jsonpath={.spec.minAvailable}",
    ]);
    assert_eq!(pdb, "1");
    let ds = kc(&["-n", NS, "get", "daemonset", "-o", "name"]);
    assert_eq!(ds.trim(), "daemonset.apps/tap-kunpeng-tap-agent");
    let dep: Value = serde_json::from_str(&kc(&[
        "-n",
        NS,
        "get",
        "deployment",
        "tap-kunpeng-tap-operator",
        "-o",
        "json",
    ]))
    .unwrap();
    assert_eq!(dep["spec"]["replicas"], 2);

    // 3. The CRDs serve: the commands the docs tell users to run.
    for res in ["nodetopology", "ntopo", "topologypolicy", "tpol"] {
        let mut c = kubectl(kubeconfig);
        c.args(["get", res]);
        let out = run(c);
        assert!(
            out.status.success(),
            "kubectl get {res}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The TopologyPolicy example of docs/user/install.md is valid against the installed CRD.
    let install_md = std::fs::read_to_string(workspace_root().join("docs/user/install.md"))
        .expect("docs/user/install.md");
    let example = install_md
        .split("```yaml\n")
        .find(|b| b.starts_with("apiVersion: tap.kunpeng.io/v1alpha1\nkind: TopologyPolicy"))
        .and_then(|b| b.split("```").next())
        .expect("TopologyPolicy example in docs/user/install.md");
    let ex = work.join("policy.yaml");
    std::fs::write(&ex, example).unwrap();
    kc(&["apply", "--validate=strict", "-f", &ex.to_string_lossy()]);
    let got = kc(&[
        "get",
        "tpol",
        "kunpeng-920-numa",
        "-o",
        "jsonpath={.spec.policy}",
    ]);
    assert_eq!(got, "numa-aware");
    // And an invalid one is refused by the CRD's validation.
    let bad = example.replace("policy: numa-aware", "policy: fastest");
    std::fs::write(&ex, bad).unwrap();
    let mut c = kubectl(kubeconfig);
    c.args(["apply", "-f", &ex.to_string_lossy()]);
    assert!(!run(c).status.success(), "policy: fastest was accepted");

    // 4. RBAC: what each ServiceAccount may do (the API server authorizes with RBAC).
    let can = |sa: &str, args: &[&str]| -> bool {
        let mut c = kubectl(kubeconfig);
        c.args(["auth", "can-i"])
            .args(args)
            .arg(format!("--as=system:serviceaccount:{NS}:{sa}"));
        let out = run(c);
        String::from_utf8_lossy(&out.stdout).trim() == "yes"
    };
    let agent = "tap-kunpeng-tap-agent";
    let op = "tap-kunpeng-tap-operator";
    let (nt, tp) = (
        "nodetopologies.tap.kunpeng.io",
        "topologypolicies.tap.kunpeng.io",
    );
    let status = "--subresource=status";
    let lease = "leases.coordination.k8s.io";
    let rbac: [(&str, &[&str], bool); 13] = [
        (agent, &["watch", nt], true),
        (agent, &["patch", nt, status], true),
        // The agent writes no specs.
        (agent, &["patch", nt], false),
        (agent, &["list", tp], false),
        (agent, &["get", "secrets", "-n", NS], false),
        (op, &["watch", tp], true),
        (op, &["patch", tp, status], true),
        (op, &["create", nt], true),
        (op, &["delete", nt], true),
        (op, &["watch", "nodes"], true),
        (op, &["patch", "nodes"], false),
        (op, &["update", lease, "-n", NS], true),
        (op, &["update", lease, "-n", "kube-system"], false),
    ];
    for (sa, args, want) in rbac {
        assert_eq!(can(sa, args), want, "{sa} can-i {args:?}");
    }

    // 5. Uninstall: the release's objects go, the CRDs (and so the user's policies) stay.
    let mut c = helm();
    c.args(["uninstall", RELEASE, "--namespace", NS, "--kubeconfig"])
        .arg(kubeconfig);
    ok(c);
    let left = kc(&[
        "-n",
        NS,
        "get",
        "daemonset,deployment,serviceaccount,role",
        "-o",
        "name",
    ]);
    assert!(
        !left.contains("tap-kunpeng-tap"),
        "left after uninstall: {left}"
    );
    let crs = kc(&["get", "clusterrole", "-o", "name"]);
    assert!(!crs.contains("tap-kunpeng-tap"), "{crs}");
    kc(&[
        "get",
        "crd",
        "nodetopologies.tap.kunpeng.io",
        "topologypolicies.tap.kunpeng.io",
    ]);
    kc(&["get", "tpol", "kunpeng-920-numa"]);
}

/// The registry `$REG` stands for when the README's commands run (never pulled from).
const README_REG: &str = "registry.invalid/tap";

/// The commands of the README's install block as written (a line ending in `\\` continues
/// its command).
fn readme_install_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).unwrap();
    let block = readme
        .split("## Install on a cluster")
        .nth(1)
        .and_then(|s| s.split("```sh\n").nth(1))
        .and_then(|b| b.split("```").next())
        .expect("a sh block in the README's \"Install on a cluster\"");
    let mut commands: Vec<String> = Vec::new();
    let mut continued = false;
    for line in block.lines() {
        match commands.last_mut() {
            Some(last) if continued => {
                last.push('\n');
                last.push_str(line);
            }
            _ => commands.push(line.to_string()),
        }
        continued = line.ends_with('\\');
    }
    commands
}

/// A platform team's shell for the README's commands: kubectl and helm on PATH, KUBECONFIG
/// set, `$REG` a registry, the repository's root as the working folder.
struct ReadmeShell {
    bin: PathBuf,
    kubeconfig: PathBuf,
}

impl ReadmeShell {
    fn new(kubeconfig: &std::path::Path, work: &std::path::Path) -> ReadmeShell {
        let bin = work.join("readme-bin");
        std::fs::create_dir_all(&bin).unwrap();
        for (name, target) in [("kubectl", kubectl_bin()), ("helm", helm_bin())] {
            let link = bin.join(name);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(target, link).unwrap();
        }
        ReadmeShell {
            bin,
            kubeconfig: kubeconfig.to_path_buf(),
        }
    }

    /// Runs `command` with `bash -eu -o pipefail`; panics with its output unless it succeeds.
    /// Returns stdout.
    fn run(&self, command: &str) -> String {
        let path = format!(
            "{}:{}",
            self.bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut c = Command::new("bash");
        c.args(["-eu", "-o", "pipefail", "-c", command])
            .current_dir(workspace_root())
            .env("PATH", path)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("REG", README_REG);
        // helm's private HELM_* homes, as every other helm call here.
        for (k, v) in helm().get_envs() {
            if let Some(v) = v {
                c.env(k, v);
            }
        }
        eprintln!("README: {command}");
        ok(c)
    }
}

#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn helm_install_path_on_a_real_kube_apiserver() {
    tap_e2e::util::require_e2e_tier();
    let t0 = std::time::Instant::now();
    let cluster = KubeCluster::start().expect("kube-apiserver (hack/e2e/setup-kube.sh)");
    let work = TempDir::new("helm-install");
    install_path(&cluster.kubeconfig, &work.0);
    eprintln!("helm install path: {:.1}s", t0.elapsed().as_secs_f64());
}

/// The chart README is what helm-docs (hack/e2e/setup-helm-docs.sh) makes of values.yaml and
/// README.md.gotmpl today: a value added or re-described without regenerating it fails here.
#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn chart_readme_is_generated_from_the_values() {
    tap_e2e::util::require_e2e_tier();
    let bin = tap_e2e::util::installed(
        "TAP_HELM_DOCS",
        "/var/cache/kunpeng-tap/bin/helm-docs",
        "hack/e2e/setup-helm-docs.sh",
    );
    let charts = workspace_root().join("charts");
    let out = Command::new(&bin)
        .arg("--chart-search-root")
        .arg(&charts)
        .args([
            "--skip-version-footer",
            "--dry-run",
            "--log-level",
            "warning",
        ])
        .output()
        .expect("running helm-docs");
    assert!(
        out.status.success(),
        "helm-docs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = String::from_utf8_lossy(&out.stdout);
    let have = std::fs::read_to_string(charts.join("kunpeng-tap/README.md")).expect("README");
    assert!(
        want.trim_end() == have.trim_end(),
        "charts/kunpeng-tap/README.md is out of date; regenerate it:\n  {} --chart-search-root charts --skip-version-footer",
        bin.display()
    );
    // Every value is described (no empty description column).
    let undocumented: Vec<&str> = have
        .lines()
        .filter(|l| l.starts_with("| ") && l.trim_end().ends_with("|  |"))
        .collect();
    assert!(
        undocumented.is_empty(),
        "values without a `# --` comment: {undocumented:#?}"
    );
}
