//! e2e: the chart installs on every Kubernetes version it claims (Chart.yaml
//! `kubeVersion: >=1.26.0-0`).
//!
//! The agent's node restriction is an `admissionregistration.k8s.io/v1`
//! ValidatingAdmissionPolicy, served from 1.30 on: the chart renders it only where the API server
//! serves it (`.Capabilities`) and its NOTES say that the restriction is off elsewhere. Checked
//! with the real `helm` for 1.26, 1.29, 1.30, 1.34 and 1.37, rendered as a GitOps tool renders for a
//! cluster (`helm template --kube-version --api-versions`, the cluster's resource list) and with
//! the version alone, and by a real install on the e2e tier's kube-apiserver (1.37) whose
//! ValidatingAdmissionPolicy API is switched off (`--runtime-config`), which is what a 1.26-1.29
//! server offers the chart.

use serde_json::Value;
use std::collections::BTreeSet;
use tap_e2e::helm::{chart, docs, helm, ok, run, template_in};
use tap_e2e::kube::{KubeCluster, KubeOptions};

const NS: &str = "kunpeng-tap";
const RELEASE: &str = "tap";
const VAP: &str = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy";
const VAP_BINDING: &str = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding";

/// What the API server of `minor` (1.x) lists for the kinds the chart can render, as
/// `helm template --api-versions` takes them (`group/version` and `group/version/Kind`).
fn served(minor: u32) -> Vec<&'static str> {
    let mut v = vec![
        "v1",
        "v1/ConfigMap",
        "v1/Pod",
        "v1/Service",
        "v1/ServiceAccount",
        "apps/v1",
        "apps/v1/DaemonSet",
        "apps/v1/Deployment",
        "rbac.authorization.k8s.io/v1",
        "rbac.authorization.k8s.io/v1/ClusterRole",
        "rbac.authorization.k8s.io/v1/ClusterRoleBinding",
        "rbac.authorization.k8s.io/v1/Role",
        "rbac.authorization.k8s.io/v1/RoleBinding",
        "policy/v1",
        "policy/v1/PodDisruptionBudget",
        "coordination.k8s.io/v1",
        "coordination.k8s.io/v1/Lease",
        "admissionregistration.k8s.io/v1",
        "admissionregistration.k8s.io/v1/ValidatingWebhookConfiguration",
        "admissionregistration.k8s.io/v1/MutatingWebhookConfiguration",
    ];
    if (28..30).contains(&minor) {
        // Beta, off unless switched on: the chart must not take it for v1.
        v.extend([
            "admissionregistration.k8s.io/v1beta1",
            "admissionregistration.k8s.io/v1beta1/ValidatingAdmissionPolicy",
        ]);
    }
    if minor >= 30 {
        v.extend([VAP, VAP_BINDING]);
    }
    v
}

/// `helm template` for Kubernetes `version` with `api` (none: the version alone) and `sets`.
fn render_for(version: &str, api: &[&str], sets: &[&str]) -> Vec<Value> {
    let mut extra = vec!["--kube-version", version];
    for a in api {
        extra.extend(["--api-versions", a]);
    }
    docs(&template_in(RELEASE, NS, sets, &extra))
}

fn kinds(objs: &[Value]) -> BTreeSet<String> {
    objs.iter()
        .map(|o| o["kind"].as_str().unwrap_or("?").to_string())
        .collect()
}

fn has_vap(objs: &[Value]) -> bool {
    objs.iter().any(|o| {
        o["kind"]
            .as_str()
            .is_some_and(|k| k.starts_with("ValidatingAdmissionPolicy"))
    })
}

#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn renders_for_each_supported_kubernetes_version() {
    tap_e2e::util::require_e2e_tier();
    let everything_else: BTreeSet<String> = [
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
        "Deployment",
        "PodDisruptionBudget",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for (version, minor) in [
        ("1.26.0", 26),
        ("1.29.4", 29),
        ("1.30.0", 30),
        ("1.34.4", 34),
        ("1.37.2", 37),
    ] {
        let api = served(minor);
        for (how, objs) in [
            ("the cluster's API list", render_for(version, &api, &[])),
            ("the version alone", render_for(version, &[], &[])),
        ] {
            let want_vap = minor >= 30;
            assert_eq!(
                has_vap(&objs),
                want_vap,
                "{version} with {how}: ValidatingAdmissionPolicy rendered = {}",
                !want_vap
            );
            let mut others = kinds(&objs);
            others.retain(|k| !k.starts_with("ValidatingAdmissionPolicy"));
            assert_eq!(others, everything_else, "{version} with {how}");
            // Every object is of a kind that version serves.
            for o in &objs {
                let id = format!(
                    "{}/{}",
                    o["apiVersion"].as_str().unwrap(),
                    o["kind"].as_str().unwrap()
                );
                assert!(
                    api.contains(&id.as_str()),
                    "{version}: {id} is not served there"
                );
            }
            // The PodDisruptionBudget field that 1.26 does not know is left out there.
            let pdb = objs
                .iter()
                .find(|o| o["kind"] == "PodDisruptionBudget")
                .unwrap();
            assert_eq!(
                pdb["spec"]["unhealthyPodEvictionPolicy"].is_null(),
                minor < 27,
                "{version}: {pdb}"
            );
            eprintln!(
                "{version} with {how}: {} objects, node restriction {}",
                objs.len(),
                if want_vap { "on" } else { "off" }
            );
        }
    }
    // A 1.34 server whose ValidatingAdmissionPolicy API is switched off (--runtime-config) lists
    // everything but it: no policy.
    let mut api = served(34);
    api.retain(|a| *a != VAP && *a != VAP_BINDING);
    assert!(!has_vap(&render_for("1.34.4", &api, &[])));
    // Turned off by value, never rendered.
    assert!(!has_vap(&render_for(
        "1.34.4",
        &served(34),
        &["agent.nodeRestriction.enabled=false"]
    )));
    // Below what Chart.yaml claims, helm refuses.
    let mut c = helm();
    c.args(["template", RELEASE, &chart(), "--kube-version", "1.25.9"]);
    let out = run(c);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("chart requires kubeVersion: >=1.26.0-0"),
        "{err}"
    );
}

/// The API server of a cluster without admissionregistration.k8s.io/v1
/// ValidatingAdmissionPolicy: the e2e tier's (1.37) with that API switched off.
fn start_without_vap() -> KubeCluster {
    KubeCluster::start_with(&KubeOptions {
        extra_args: vec![
            // The resource-level form: the rest of admissionregistration.k8s.io/v1 (webhooks)
            // stays, as on 1.26-1.29.
            "--runtime-config=admissionregistration.k8s.io/v1/validatingadmissionpolicies=false,admissionregistration.k8s.io/v1/validatingadmissionpolicybindings=false".into(),
            // Its admission plugin is always on (1.34 on) and waits for the policies' informers,
            // which cannot sync without the API: the server's start-up hooks then fail.
            "--disable-admission-plugins=ValidatingAdmissionPolicy".into(),
        ],
        ..KubeOptions::default()
    })
    .expect("kube-apiserver (hack/e2e/setup-kube.sh)")
}

#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn installs_where_validating_admission_policy_is_not_served() {
    tap_e2e::util::require_e2e_tier();
    let t0 = std::time::Instant::now();
    let k = start_without_vap();
    // The switch worked: the group serves its webhooks but no policies (otherwise this test
    // would pass on any server).
    let resources = k
        .kubectl_ok(&[
            "api-resources",
            "--api-group=admissionregistration.k8s.io",
            "-o",
            "name",
        ])
        .expect("api-resources");
    assert!(
        resources.contains("validatingwebhookconfigurations")
            && !resources.contains("validatingadmissionpolicies"),
        "{resources}"
    );
    let file = |name: &str, text: &str| {
        let p = k.dir.join(name);
        std::fs::write(&p, text).expect("write");
        p.to_string_lossy().into_owned()
    };

    // What failed before: a rendering with the policy is refused by such a server.
    let with_vap = template_in(RELEASE, NS, &[], &["--kube-version", "1.34.4"]);
    assert!(with_vap.contains("kind: ValidatingAdmissionPolicy"));
    let out = k
        .kubectl(&[
            "apply",
            "--dry-run=server",
            "-f",
            &file("with-vap.yaml", &with_vap),
        ])
        .expect("kubectl");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no matches for kind \"ValidatingAdmissionPolicy\""),
        "{err}"
    );

    // The 1.29 rendering (the cluster's API list) installs, CRDs included, strictly validated.
    let ns129 = "tap-129";
    k.kubectl_ok(&["create", "namespace", ns129])
        .expect("namespace");
    let text = template_in("tap129", ns129, &[], &{
        let mut a = vec!["--include-crds", "--kube-version", "1.29.4"];
        for v in served(29) {
            a.extend(["--api-versions", v]);
        }
        a
    });
    let rendered = docs(&text);
    assert!(!has_vap(&rendered));
    let path = file("v1.29.yaml", &text);
    k.kubectl_ok(&[
        "apply",
        "--server-side",
        "--validate=strict",
        "--field-manager=tap-e2e",
        "-f",
        &path,
    ])
    .expect("applying the 1.29 rendering");
    let names = k
        .kubectl_ok(&["get", "-f", &path, "-o", "name"])
        .expect("get");
    assert_eq!(
        names.lines().count(),
        rendered.len(),
        "not every object of the 1.29 rendering exists:\n{names}"
    );
    eprintln!("1.29 rendering: {} objects applied", rendered.len());

    // helm install asks the server what it serves: no policy, and NOTES say so. The
    // PrometheusRule asked for is not created either (no monitoring.coreos.com/v1 here), and
    // the NOTES say that too.
    k.kubectl_ok(&["create", "namespace", NS])
        .expect("namespace");
    let mut c = helm();
    c.args([
        "install",
        RELEASE,
        &chart(),
        "--namespace",
        NS,
        "--set",
        "metrics.prometheusRule.enabled=true",
        "--kubeconfig",
    ])
    .arg(&k.kubeconfig);
    let notes = ok(c);
    assert!(notes.contains("STATUS: deployed"), "{notes}");
    let flat = notes.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains("Node restriction is off: this API server does not serve admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy (Kubernetes >= 1.30)"),
        "NOTES: {notes}"
    );
    assert!(
        flat.contains("The PrometheusRule was not created: this API server does not serve monitoring.coreos.com/v1"),
        "NOTES: {notes}"
    );
    let mut c = helm();
    c.args([
        "get",
        "manifest",
        RELEASE,
        "--namespace",
        NS,
        "--kubeconfig",
    ])
    .arg(&k.kubeconfig);
    let manifest = ok(c);
    let objs = docs(&manifest);
    assert!(!has_vap(&objs), "helm rendered the policy for this server");
    assert!(!objs.iter().any(|o| o["kind"] == "PrometheusRule"));
    // Everything else is there.
    let installed = k
        .kubectl_ok(&["get", "-f", &file("manifest.yaml", &manifest), "-o", "name"])
        .expect("get");
    assert_eq!(installed.lines().count(), objs.len(), "{installed}");
    for want in [
        "daemonset.apps/tap-kunpeng-tap-agent",
        "deployment.apps/tap-kunpeng-tap-operator",
        "poddisruptionbudget.policy/tap-kunpeng-tap-operator",
        "clusterrole.rbac.authorization.k8s.io/tap-kunpeng-tap-agent",
        "serviceaccount/tap-kunpeng-tap-agent",
    ] {
        assert!(installed.contains(want), "{want} missing:\n{installed}");
    }
    for crd in [
        "nodetopologies.tap.kunpeng.io",
        "topologypolicies.tap.kunpeng.io",
    ] {
        k.kubectl_ok(&["get", "crd", crd]).expect("CRD");
    }
    eprintln!(
        "helm install without ValidatingAdmissionPolicy: {} objects, {:.1}s",
        objs.len(),
        t0.elapsed().as_secs_f64()
    );
}

/// The DRA driver (`agent.flags.draDriver=on`) renders the DeviceClass of resource.k8s.io/v1
/// and the agent's plugin folders where DRA is GA (1.34 on: the e2e tier's 1.37 here), and is
/// refused with the reason below it.
#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn the_dra_driver_renders_where_dra_is_served_and_is_refused_below() {
    tap_e2e::util::require_e2e_tier();
    let on = ["agent.flags.draDriver=on"];
    let objs = render_for("1.37.2", &[], &on);
    let class = objs
        .iter()
        .find(|o| o["kind"] == "DeviceClass")
        .expect("a DeviceClass");
    assert_eq!(class["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(class["metadata"]["name"], "dra.tap.kunpeng.io");
    let ds = objs.iter().find(|o| o["kind"] == "DaemonSet").unwrap();
    let args = ds["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains("--dra-driver=on"), "{args}");
    assert!(args.contains("--dra-cdi-dir=/var/run/cdi"), "{args}");
    let vols = ds["spec"]["template"]["spec"]["volumes"].to_string();
    assert!(vols.contains("/var/lib/kubelet/plugins_registry"), "{vols}");
    assert!(vols.contains("\"path\":\"/var/run/cdi\""), "{vols}");
    // No CDI folder: no CDI devices and nothing of the host's mounted for them.
    let no_cdi = render_for("1.37.2", &[], &[on[0], "agent.flags.draCdiDir="]);
    let ds = no_cdi.iter().find(|o| o["kind"] == "DaemonSet").unwrap();
    let vols = ds["spec"]["template"]["spec"]["volumes"].to_string();
    assert!(!vols.contains("cdi-specs"), "{vols}");
    assert!(
        !kinds(&render_for("1.37.2", &[], &[])).contains("DeviceClass"),
        "off by default"
    );
    let mut c = helm();
    c.args([
        "template",
        RELEASE,
        &chart(),
        "--kube-version",
        "1.30.0",
        "--set",
        on[0],
    ]);
    let out = run(c);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("needs DRA's resource.k8s.io/v1 (Kubernetes >= 1.34)"),
        "{err}"
    );
}
