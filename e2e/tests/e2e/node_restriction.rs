//! e2e: a node's agent writes only its own NodeTopology, on the real kube-apiserver.
//!
//! The chart's ValidatingAdmissionPolicy (rendered by the real `helm template`, so the test
//! checks what ships) is applied with the rest of the chart to a private kube-apiserver with two
//! Node objects and a Pod of the agent's ServiceAccount on each. Tokens come from the
//! TokenRequest API bound to those Pods (`kubectl create token --bound-object-kind Pod`), as the
//! kubelet mounts them into the agent's container; the API server puts the Pod's node into the
//! token (`authentication.kubernetes.io/node-name`). Then: an agent's status write to its own
//! NodeTopology passes, one to the other node's is refused with the policy's message, a token
//! without the node claim is refused, and the operator's account still writes both objects.

use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;
use tap_e2e::helm::{docs, template_in};
use tap_e2e::kube::KubeCluster;
use tap_e2e::util::workspace_root;

const NS: &str = "kunpeng-tap";
/// Release `kunpeng-tap` in `kunpeng-tap` gives the names of deploy/ (`kunpeng-tap-agent`, ...).
const RELEASE: &str = "kunpeng-tap";
const AGENT_SA: &str = "kunpeng-tap-agent";
const OPERATOR_SA: &str = "kunpeng-tap-operator";
const NODES: [&str; 2] = ["node-a", "node-b"];

fn node(name: &str) -> String {
    format!("apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n")
}

fn pod(name: &str, sa: &str, node: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {NS}\nspec:\n  serviceAccountName: {sa}\n  nodeName: {node}\n  containers:\n  - name: c\n    image: registry.invalid/pause:1\n"
    )
}

fn node_topology(name: &str) -> String {
    format!(
        "apiVersion: tap.kunpeng.io/v1alpha1\nkind: NodeTopology\nmetadata:\n  name: {name}\nspec:\n  nodeName: {name}\n"
    )
}

/// The status body the agent applies (server-side apply on `/status`, its field manager).
fn status_apply(name: &str, writer: &str) -> String {
    json!({
        "apiVersion": "tap.kunpeng.io/v1alpha1",
        "kind": "NodeTopology",
        "metadata": {"name": name},
        "status": {"agent": {
            "annotationsAllowed": false,
            "clusterAffinity": false,
            "configSource": "flags",
            "memoryTopology": false,
            "mode": "NRI",
            "policy": "topology-aware",
            "version": writer,
        }},
    })
    .to_string()
}

/// Applies the status as the agent does, with `kubeconfig`; (success, stderr).
fn write_status(k: &KubeCluster, kubeconfig: &Path, name: &str, writer: &str) -> (bool, String) {
    let out = k
        .kubectl_stdin_as(
            kubeconfig,
            &[
                "apply",
                "--server-side",
                "--subresource=status",
                "--field-manager=kunpeng-tap-agent",
                "--force-conflicts",
                "-f",
                "-",
            ],
            &status_apply(name, writer),
        )
        .expect("kubectl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn status_version(k: &KubeCluster, name: &str) -> String {
    k.kubectl_ok(&[
        "get",
        "nodetopology",
        name,
        "-o",
        "jsonpath={.status.agent.version}",
    ])
    .expect("get nodetopology")
}

/// A TokenRequest token of `sa`, bound to Pod `pod` when given.
fn token(k: &KubeCluster, sa: &str, pod: Option<&str>) -> String {
    let mut args = vec!["-n", NS, "create", "token", sa];
    if let Some(p) = pod {
        args.extend(["--bound-object-kind", "Pod", "--bound-object-name", p]);
    }
    k.kubectl_ok(&args)
        .expect("TokenRequest")
        .trim()
        .to_string()
}

/// `extra` of the caller as the API server sees it (SelfSubjectReview).
fn whoami(k: &KubeCluster, kubeconfig: &Path) -> Value {
    let out = k
        .kubectl_as(kubeconfig, &["auth", "whoami", "-o", "json"])
        .expect("kubectl auth whoami");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("whoami JSON");
    v["status"]["userInfo"].clone()
}

/// The chart's policy objects and deploy/'s agree (labels aside).
fn assert_deploy_matches(rendered: &[Value]) {
    let text = std::fs::read_to_string(
        workspace_root().join("deploy/admission/agent-node-restriction.yaml"),
    )
    .expect("deploy/admission/agent-node-restriction.yaml");
    let plain = docs(&text);
    for kind in [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        let mut from_chart = rendered
            .iter()
            .find(|o| o["kind"] == kind)
            .unwrap_or_else(|| panic!("the chart renders no {kind}"))
            .clone();
        from_chart["metadata"]
            .as_object_mut()
            .expect("metadata")
            .remove("labels");
        let from_deploy = plain
            .iter()
            .find(|o| o["kind"] == kind)
            .unwrap_or_else(|| panic!("deploy/admission has no {kind}"));
        assert_eq!(
            &from_chart, from_deploy,
            "{kind}: chart and deploy/admission/agent-node-restriction.yaml differ"
        );
    }
}

#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn an_agent_writes_only_its_own_node_topology() {
    tap_e2e::util::require_e2e_tier();
    let k = KubeCluster::start().expect("kube-apiserver (hack/e2e/setup-kube.sh)");
    let root = workspace_root();
    k.kubectl_ok(&["apply", "-f", &root.join("crds").to_string_lossy()])
        .expect("CRDs");
    k.wait_for(Duration::from_secs(30), "CRDs established", |k| {
        Ok(k.kubectl(&["get", "nodetopology"])?.status.success())
    })
    .expect("CRDs");
    k.kubectl_ok(&["create", "namespace", NS])
        .expect("namespace");

    // What ships: the whole default chart (the workloads stay Pending: there is no scheduler).
    let rendered = template_in(RELEASE, NS, &[], &[]);
    let objs = docs(&rendered);
    assert_deploy_matches(&objs);
    k.apply(&rendered).expect("applying the rendered chart");

    for n in NODES {
        k.apply(&node(n)).expect("Node");
        k.apply(&node_topology(n)).expect("NodeTopology");
        k.apply(&pod(&format!("agent-{n}"), AGENT_SA, n))
            .expect("agent Pod");
    }
    k.apply(&pod("operator-node-a", OPERATOR_SA, "node-a"))
        .expect("operator Pod");

    let kc = |stem: &str, sa: &str, pod: Option<&str>| {
        k.kubeconfig_with_token(stem, &token(&k, sa, pod))
            .expect("kubeconfig")
    };
    let agent_a = kc("agent-a", AGENT_SA, Some("agent-node-a"));
    let agent_b = kc("agent-b", AGENT_SA, Some("agent-node-b"));
    let agent_unbound = kc("agent-unbound", AGENT_SA, None);
    let operator = kc("operator", OPERATOR_SA, Some("operator-node-a"));

    // The API server (1.37, no feature gate) puts the Pod's node into bound tokens.
    let who = whoami(&k, &agent_a);
    assert_eq!(
        who["username"],
        format!("system:serviceaccount:{NS}:{AGENT_SA}")
    );
    assert_eq!(
        who["extra"]["authentication.kubernetes.io/node-name"],
        json!(["node-a"]),
        "no node-name claim in a Pod-bound token: {who}"
    );
    assert!(
        whoami(&k, &agent_unbound)["extra"]["authentication.kubernetes.io/node-name"].is_null()
    );

    // The policy starts to act once the API server has loaded it (asynchronously): probe
    // until node-a's agent is refused node-b's object by the policy (a probe that got through
    // before writes only "probe"), then make the real attempt once.
    let mut last = String::new();
    let acting = k.wait_for(Duration::from_secs(30), "the policy to act", |k| {
        let (ok, err) = write_status(k, &agent_a, "node-b", "probe");
        let by_policy = !ok && err.contains("kunpeng-tap-agent-node-restriction");
        last = err;
        Ok(by_policy)
    });
    assert!(
        acting.is_ok(),
        "the policy never refused node-a's agent: {last}"
    );
    let (ok, err) = write_status(&k, &agent_a, "node-b", "from-agent-a");
    last = err;
    assert!(!ok, "node-a's agent wrote node-b's status");
    assert!(
        last.contains("kunpeng-tap-agent-node-restriction")
            && last.contains(
                "kunpeng-tap node restriction: the agent on node node-a may write only the NodeTopology and NodeResourceTopology node-a, not node-b"
            ),
        "refused, but not by the policy: {last}"
    );
    assert_ne!(status_version(&k, "node-b"), "from-agent-a");
    eprintln!("refused: {}", last.trim());

    // Each agent writes its own.
    for (kubeconfig, n) in [(&agent_a, "node-a"), (&agent_b, "node-b")] {
        let (ok, err) = write_status(&k, kubeconfig, n, &format!("own-{n}"));
        assert!(ok, "{n}'s agent could not write its own status: {err}");
        assert_eq!(status_version(&k, n), format!("own-{n}"));
    }
    let (ok, err) = write_status(&k, &agent_b, "node-a", "from-agent-b");
    assert!(
        !ok && err
            .contains("the agent on node node-b may write only the NodeTopology and NodeResourceTopology node-b, not node-a"),
        "{err}"
    );
    assert_eq!(status_version(&k, "node-a"), "own-node-a");

    // A token of the agent's account without the node claim writes nothing.
    let (ok, err) = write_status(&k, &agent_unbound, "node-a", "unbound");
    assert!(
        !ok && err.contains("writes NodeTopologies and NodeResourceTopologies only with a token bound to a Pod on a node"),
        "{err}"
    );
    assert_eq!(status_version(&k, "node-a"), "own-node-a");

    // The operator's account is not matched: its token (bound to a Pod on node-a) writes the
    // specs of both nodes' objects.
    for n in NODES {
        let out = k
            .kubectl_as(
                &operator,
                &[
                    "patch",
                    "nodetopology",
                    n,
                    "--type=merge",
                    "-p",
                    r#"{"metadata":{"labels":{"written-by":"operator"}}}"#,
                ],
            )
            .expect("kubectl");
        assert!(
            out.status.success(),
            "operator could not write {n}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let labels = k
        .kubectl_ok(&[
            "get",
            "nodetopology",
            "-o",
            "jsonpath={.items[*].metadata.labels.written-by}",
        ])
        .expect("get");
    assert_eq!(labels.trim(), "operator operator");

    // The same for the NodeResourceTopology the agent publishes for the scheduler, with the
    // real CRD (hack/e2e/setup-nrt-crd.sh): its own node's object only.
    k.install_nrt_crd().expect("NodeResourceTopology CRD");
    let create_nrt = |kubeconfig: &std::path::Path, n: &str| {
        let path = k.dir.join(format!("nrt-{n}.json"));
        let obj = json!({
            "apiVersion": "topology.node.k8s.io/v1alpha2",
            "kind": "NodeResourceTopology",
            "metadata": {"name": n},
            "zones": [{"name": "node-0", "type": "Node", "resources": [
                {"name": "cpu", "capacity": "4", "allocatable": "4", "available": "4"}]}],
        });
        std::fs::write(&path, obj.to_string()).expect("write");
        let out = k
            .kubectl_as(kubeconfig, &["create", "-f", &path.to_string_lossy()])
            .expect("kubectl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, err) = create_nrt(&agent_a, "node-b");
    assert!(
        !ok && err.contains(
            "the agent on node node-a may write only the NodeTopology and NodeResourceTopology node-a, not node-b"
        ),
        "node-a's agent created node-b's NodeResourceTopology: {err}"
    );
    let (ok, err) = create_nrt(&agent_a, "node-a");
    assert!(
        ok,
        "node-a's agent could not create its own NodeResourceTopology: {err}"
    );
}
