//! The real `helm` (built from helm.sh/helm/v3 by hack/e2e/setup-helm.sh, or `TAP_HELM`) on the
//! repository's chart: a private HELM_* home, `helm template` and the rendered documents as
//! JSON values.

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

/// The helm binary; panics (never skips) when the setup script has not run.
pub fn helm_bin() -> PathBuf {
    crate::util::installed(
        "TAP_HELM",
        "/var/cache/kunpeng-tap/bin/helm",
        "hack/e2e/setup-helm.sh",
    )
}

/// The chart's folder.
pub fn chart() -> String {
    crate::util::workspace_root()
        .join("charts/kunpeng-tap")
        .to_string_lossy()
        .into_owned()
}

/// A private HELM_* home so the machine's helm config and cache are never touched.
pub fn helm() -> Command {
    let mut c = Command::new(helm_bin());
    let home = std::env::temp_dir().join(format!("tap-e2e-helm-home-{}", std::process::id()));
    c.env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"));
    c
}

/// Runs `c`; panics when it cannot start.
pub fn run(mut c: Command) -> Output {
    c.output().unwrap_or_else(|e| panic!("running {c:?}: {e}"))
}

/// Runs `c`; panics with its output unless it succeeds. Returns stdout.
pub fn ok(c: Command) -> String {
    let desc = format!("{c:?}");
    let out = run(c);
    assert!(
        out.status.success(),
        "{desc} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `helm template <release> <chart> --namespace <ns>` with `--set` values and `extra`
/// arguments; the YAML text.
pub fn template_in(release: &str, ns: &str, sets: &[&str], extra: &[&str]) -> String {
    let mut c = helm();
    c.args(["template", release, &chart(), "--namespace", ns]);
    for s in sets {
        c.args(["--set", s]);
    }
    c.args(extra);
    ok(c)
}

/// Every document of a multi-document YAML text, as JSON values (empty ones dropped).
pub fn docs(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .filter_map(|d| {
            let v: serde_yaml::Value =
                serde::Deserialize::deserialize(d).expect("rendered YAML parses");
            let j: Value = serde_json::to_value(v).expect("YAML to JSON");
            (!j.is_null()).then_some(j)
        })
        .collect()
}
