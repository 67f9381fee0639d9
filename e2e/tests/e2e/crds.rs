//! The CRDs of crds/ on a real kube-apiserver: `kubectl explain` shows their descriptions, the
//! priority bounds and the policy enum are enforced, and status conditions are a list map keyed
//! by `type` (duplicates refused; server-side apply merges them per type).

use anyhow::{bail, Context, Result};
use std::time::Duration;
use tap_e2e::kube::KubeCluster;
use tap_e2e::util;

fn words(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `kubectl explain what` (whitespace collapsed: kubectl wraps long descriptions), once the API
/// server publishes the CRD's OpenAPI.
fn explain(k: &KubeCluster, what: &str, want: &str) -> Result<String> {
    let mut text = String::new();
    k.wait_for(
        Duration::from_secs(30),
        &format!("kubectl explain {what} shows {want:?}"),
        |k| {
            let out = k.kubectl(&["explain", what])?;
            text = words(&String::from_utf8_lossy(&out.stdout));
            Ok(text.contains(want))
        },
    )
    .with_context(|| format!("last output: {text}"))?;
    if text.contains("Auto-generated") {
        bail!("kubectl explain {what}: {text}");
    }
    Ok(text)
}

fn policy(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: tap.kunpeng.io/v1alpha1\nkind: TopologyPolicy\nmetadata: {{name: {name}}}\nspec: {spec}\n"
    )
}

fn dry_run(k: &KubeCluster, yaml: &str) -> Result<String> {
    k.kubectl_stdin(&["apply", "--dry-run=server", "-f", "-"], yaml)
}

fn condition(type_: &str, status: &str) -> String {
    format!(
        "{{type: {type_}, status: \"{status}\", reason: Test, message: m, lastTransitionTime: \"2026-01-01T00:00:00Z\"}}"
    )
}

fn scenario(k: &KubeCluster) -> Result<()> {
    k.apply_crds()?;

    // --- Descriptions, as `kubectl explain` shows them.
    explain(
        k,
        "nodetopology",
        "NodeTopology is one Node's CPU and memory placement state",
    )?;
    explain(k, "nodetopology.status.zones", "Zones nest")?;
    explain(
        k,
        "topologypolicy",
        "TopologyPolicy chooses how kunpeng-tap places",
    )?;
    let spec = explain(k, "topologypolicy.spec", "What a TopologyPolicy asks for")?;
    for want in ["From -1000 to 1000", "The placement policy: `numa-aware`"] {
        if !spec.contains(want) {
            bail!("kubectl explain topologypolicy.spec lacks {want:?}: {spec}");
        }
    }

    // --- Priority bounds and the policy enum.
    for p in [-1000, 0, 1000] {
        dry_run(
            k,
            &policy("ok", &format!("{{policy: numa-aware, priority: {p}}}")),
        )
        .with_context(|| format!("priority {p} was refused"))?;
    }
    for (p, want) in [
        (1001, "less than or equal to 1000"),
        (-1001, "greater than or equal to -1000"),
    ] {
        match dry_run(
            k,
            &policy("bad", &format!("{{policy: numa-aware, priority: {p}}}")),
        ) {
            Ok(_) => bail!("priority {p} was accepted"),
            Err(e) if format!("{e:#}").contains(want) => {}
            Err(e) => bail!("priority {p} refused without {want:?}: {e:#}"),
        }
    }
    match dry_run(k, &policy("bad", "{policy: best-effort}")) {
        Ok(_) => bail!("an unknown policy was accepted"),
        Err(e) => {
            let e = format!("{e:#}");
            // The enum refuses it, and only the enum (the CEL rule repeating it is gone).
            if !e.contains("Unsupported value") || e.contains("policy must be numa-aware") {
                bail!("unknown policy refused with: {e}");
            }
        }
    }

    // --- Conditions: one per type, merged per type by server-side apply.
    k.apply(&policy("p", "{policy: numa-aware}"))?;
    let dup = format!(
        "{{\"status\": {{\"conditions\": [{}, {}]}}}}",
        condition("Ready", "True"),
        condition("Ready", "False")
    );
    // condition() writes YAML flow style; kubectl patch -p gets it as JSON.
    let dup: serde_json::Value = serde_yaml::from_str(&dup)?;
    let out = k.kubectl(&[
        "patch",
        "topologypolicy",
        "p",
        "--subresource=status",
        "--type=merge",
        "-p",
        &dup.to_string(),
    ])?;
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.success() || !err.contains("Duplicate value") {
        bail!(
            "two Ready conditions: success={} {err}",
            out.status.success()
        );
    }
    for (manager, type_) in [("writer-a", "Ready"), ("writer-b", "Conflict")] {
        let body = format!(
            "apiVersion: tap.kunpeng.io/v1alpha1\nkind: TopologyPolicy\nmetadata: {{name: p}}\nstatus:\n  conditions: [{}]\n",
            condition(type_, "True")
        );
        k.kubectl_stdin(
            &[
                "apply",
                "--server-side",
                "--subresource=status",
                &format!("--field-manager={manager}"),
                "-f",
                "-",
            ],
            &body,
        )
        .with_context(|| format!("{manager} applying {type_}"))?;
    }
    let p = k
        .get_json(&["get", "topologypolicy", "p"])?
        .context("policy p")?;
    let mut types: Vec<&str> = p["status"]["conditions"]
        .as_array()
        .map(|a| a.iter().filter_map(|c| c["type"].as_str()).collect())
        .unwrap_or_default();
    types.sort_unstable();
    if types != ["Conflict", "Ready"] {
        bail!(
            "two managers' conditions were not merged by type: {}",
            p["status"]
        );
    }
    Ok(())
}

#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn crds_describe_bound_and_key_their_fields() {
    util::require_e2e_tier();
    let k = KubeCluster::start().expect("starting etcd + kube-apiserver");
    if let Err(e) = scenario(&k) {
        eprintln!("--- kube-apiserver log:\n{}", k.apiserver.log_tail(20));
        panic!("{e:#}");
    }
}
