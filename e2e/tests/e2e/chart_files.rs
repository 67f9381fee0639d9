//! Unit tier (runs WITHOUT `TAP_E2E`): static checks of the Helm chart against the rest of the
//! repository, so the chart cannot drift from the CRDs and the agent's flags, and the chart's
//! enable-NRI script does what the install guide does by hand.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    tap_e2e::util::workspace_root()
}

fn chart() -> PathBuf {
    root().join("charts/kunpeng-tap")
}

fn read(p: &Path) -> String {
    fs::read_to_string(p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

/// `*.yaml` files of a folder, by name.
fn yaml_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    let mut out = BTreeMap::new();
    for entry in entries {
        let path = entry.expect("dir entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".yaml") || name.ends_with(".yml") {
            let bytes = fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            out.insert(name, bytes);
        }
    }
    out
}

#[test]
fn chart_crds_are_identical_to_crds() {
    let src = root().join("crds");
    let dst = chart().join("crds");
    let want = yaml_files(&src);
    let got = yaml_files(&dst);
    assert!(
        !want.is_empty(),
        "{} holds no CRD; the chart installs them from there",
        src.display()
    );
    let want_names: Vec<_> = want.keys().collect();
    let got_names: Vec<_> = got.keys().collect();
    assert_eq!(
        got_names, want_names,
        "charts/kunpeng-tap/crds/ must hold exactly the files of crds/ (copy them: cp crds/*.yaml charts/kunpeng-tap/crds/)"
    );
    for (name, bytes) in &want {
        assert!(
            got[name] == *bytes,
            "charts/kunpeng-tap/crds/{name} differs from crds/{name} (re-copy it)"
        );
    }
}

/// The `pub field: Type` names of `struct Flags` in node-agent/src/flags.rs, each with whether
/// it is a clap argument (every field of Flags is).
fn agent_flag_fields() -> Vec<String> {
    let src = read(&root().join("node-agent/src/flags.rs"));
    let start = src
        .find("pub struct Flags {")
        .expect("struct Flags in flags.rs");
    let body = &src[start..];
    let end = body.find("\n}\n").expect("end of struct Flags");
    body[..end]
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let rest = l.strip_prefix("pub ")?;
            let (name, _) = rest.split_once(':')?;
            let name = name.trim();
            (!name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
                .then(|| name.to_string())
        })
        .collect()
}

fn camel(snake: &str) -> String {
    let mut out = String::new();
    let mut up = false;
    for c in snake.chars() {
        if c == '_' {
            up = true;
        } else if up {
            out.push(c.to_ascii_uppercase());
            up = false;
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn every_agent_flag_has_a_value_and_reaches_the_daemonset() {
    let fields = agent_flag_fields();
    assert!(
        fields.len() >= 20,
        "parsed only {fields:?} from flags.rs; the parser needs fixing"
    );
    let values = read(&chart().join("values.yaml"));
    // The keys of `agent.flags:` (4-space indented block).
    let block_start = values
        .find("\n  flags:\n")
        .expect("agent.flags in values.yaml");
    let block: Vec<&str> = values[block_start + 10..]
        .lines()
        .take_while(|l| l.is_empty() || l.starts_with("    "))
        .collect();
    let keys: Vec<String> = block
        .iter()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.strip_prefix("    "))
        .filter(|l| !l.starts_with(' '))
        .filter_map(|l| l.split_once(':').map(|(k, _)| k.to_string()))
        .collect();
    let ds = read(&chart().join("templates/agent-daemonset.yaml"));
    let mut missing = Vec::new();
    for f in &fields {
        let key = camel(f);
        if !keys.contains(&key) {
            missing.push(format!("values.yaml agent.flags.{key} (flag field {f})"));
        }
        // -v is spelled --verbose (its long name); every flag is passed by its long name.
        let long = format!("--{}", f.replace('_', "-"));
        let long = if f == "verbose" {
            "--verbose".to_string()
        } else {
            long
        };
        if !ds.contains(&long) {
            missing.push(format!("{long} in templates/agent-daemonset.yaml"));
        }
        if !ds.contains(&format!("$f.{key}")) {
            missing.push(format!("$f.{key} used in templates/agent-daemonset.yaml"));
        }
    }
    assert!(missing.is_empty(), "chart does not cover: {missing:#?}");
    // And no stale value: each key is a flag.
    let stale: Vec<_> = keys
        .iter()
        .filter(|k| !fields.iter().any(|f| camel(f) == **k))
        .collect();
    assert!(
        stale.is_empty(),
        "values.yaml agent.flags has keys that are no flag: {stale:?}"
    );
}

#[test]
fn chart_app_version_is_the_workspace_version() {
    let chart_yaml = read(&chart().join("Chart.yaml"));
    let app = chart_yaml
        .lines()
        .find_map(|l| l.strip_prefix("appVersion:"))
        .expect("appVersion in Chart.yaml")
        .trim()
        .trim_matches('"')
        .to_string();
    let cargo = read(&root().join("Cargo.toml"));
    let ws = cargo
        .split("[workspace.package]")
        .nth(1)
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("version = ")))
        .expect("workspace.package.version")
        .trim()
        .trim_matches('"')
        .to_string();
    assert_eq!(
        app, ws,
        "Chart.yaml appVersion (the default image tag) must be the release version"
    );
}

/// Runs files/enable-nri.sh on `config` with a restart command that records each call.
fn enable_nri(dir: &Path, config: &Path) -> (String, usize) {
    let script = chart().join("files/enable-nri.sh");
    let log = dir.join("restarts");
    let out = Command::new("sh")
        .arg(&script)
        .env("CONTAINERD_CONFIG", config)
        .env("NRI_SOCKET_PATH", dir.join("nri.sock"))
        .env(
            "RESTART_COMMAND",
            format!("echo restart >> '{}'", log.display()),
        )
        .output()
        .expect("running sh");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "enable-nri.sh failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let restarts = fs::read_to_string(&log)
        .map(|s| s.lines().count())
        .unwrap_or(0);
    (stdout, restarts)
}

/// The value of `key` inside the NRI table of a TOML text (a small reader for the tests).
fn nri_value(toml: &str, key: &str) -> Option<String> {
    let mut in_nri = false;
    for line in toml.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            in_nri = t == "[plugins.\"io.containerd.nri.v1.nri\"]"
                || t == "[plugins.'io.containerd.nri.v1.nri']";
            continue;
        }
        if in_nri {
            if let Some((k, v)) = t.split_once('=') {
                if k.trim() == key {
                    return Some(v.trim().to_string());
                }
            }
        }
    }
    None
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tap-chart-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).expect("temp dir");
    d
}

#[test]
fn enable_nri_script_flips_a_disabled_nri_table_and_restarts_once() {
    let d = temp_dir("flip");
    let cfg = d.join("config.toml");
    // As `containerd config default` (1.7) writes it: NRI present but disabled.
    let original = "version = 2\n\n[plugins]\n\n  [plugins.\"io.containerd.grpc.v1.cri\"]\n    sandbox_image = \"registry.k8s.io/pause:3.8\"\n\n  [plugins.\"io.containerd.nri.v1.nri\"]\n    disable = true\n    disable_connections = false\n    plugin_config_path = \"/etc/nri/conf.d\"\n    plugin_path = \"/opt/nri/plugins\"\n    socket_path = \"/var/run/nri/nri.sock\"\n\n  [plugins.\"io.containerd.runtime.v1.linux\"]\n    shim = \"containerd-shim\"\n    no_shim = false\n";
    fs::write(&cfg, original).unwrap();
    let (out, restarts) = enable_nri(&d, &cfg);
    let new = read(&cfg);
    assert_eq!(
        nri_value(&new, "disable").as_deref(),
        Some("false"),
        "{new}"
    );
    assert_eq!(
        nri_value(&new, "disable_connections").as_deref(),
        Some("false")
    );
    assert_eq!(
        nri_value(&new, "socket_path").as_deref(),
        Some("\"/var/run/nri/nri.sock\"")
    );
    // Only that line changed, the rest is untouched; the original is kept.
    assert_eq!(
        new,
        original.replace("    disable = true\n", "    disable = false\n")
    );
    assert_eq!(read(&d.join("config.toml.kunpeng-tap.bak")), original);
    assert_eq!(restarts, 1, "{out}");
    // Second run: nothing to do, no restart.
    let (out, restarts) = enable_nri(&d, &cfg);
    assert!(out.contains("already enabled"), "{out}");
    assert_eq!(restarts, 1);
    assert_eq!(read(&cfg), new);
    let _ = fs::remove_dir_all(&d);
}

#[test]
fn enable_nri_script_appends_a_missing_table_and_creates_a_missing_file() {
    let d = temp_dir("append");
    let cfg = d.join("config.toml");
    fs::write(
        &cfg,
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  snapshotter = \"overlayfs\"\n",
    )
    .unwrap();
    let (_, restarts) = enable_nri(&d, &cfg);
    let new = read(&cfg);
    assert!(new.starts_with("version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  snapshotter = \"overlayfs\"\n"), "{new}");
    assert_eq!(
        nri_value(&new, "disable").as_deref(),
        Some("false"),
        "{new}"
    );
    let sock = format!("\"{}\"", d.join("nri.sock").display());
    assert_eq!(nri_value(&new, "socket_path"), Some(sock.clone()));
    assert_eq!(restarts, 1);

    // Config version 3 spelling, table without `disable`: the key is added.
    fs::write(
        &cfg,
        "version = 3\n[plugins.'io.containerd.nri.v1.nri']\n  socket_path = '/run/nri.sock'\n[plugins.'io.containerd.cri.v1.images']\n  x = 1\n",
    )
    .unwrap();
    let (_, restarts) = enable_nri(&d, &cfg);
    let new = read(&cfg);
    assert_eq!(
        nri_value(&new, "disable").as_deref(),
        Some("false"),
        "{new}"
    );
    assert!(
        new.contains("[plugins.'io.containerd.cri.v1.images']\n  x = 1\n"),
        "{new}"
    );
    assert_eq!(restarts, 2);

    // No file at all: created with the NRI table only.
    let missing = d.join("etc/containerd/config.toml");
    let (_, restarts) = enable_nri(&d, &missing);
    let new = read(&missing);
    assert!(new.starts_with("version = 2\n"), "{new}");
    assert_eq!(nri_value(&new, "disable").as_deref(), Some("false"));
    assert_eq!(nri_value(&new, "socket_path"), Some(sock));
    assert_eq!(restarts, 3);
    let _ = fs::remove_dir_all(&d);
}

/// The `rules:` blocks of a chart template, in order (plain YAML inside the template).
fn template_rules(template: &str) -> Vec<serde_yaml::Value> {
    let text = read(&chart().join("templates").join(template));
    let mut out = Vec::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("\nrules:\n") {
        let block: Vec<&str> = rest[i + 1..]
            .lines()
            .enumerate()
            .take_while(|(n, l)| *n == 0 || l.starts_with("  "))
            .map(|(_, l)| l)
            .collect();
        let v: serde_yaml::Value =
            serde_yaml::from_str(&block.join("\n")).expect("rules block parses");
        out.push(v["rules"].clone());
        rest = &rest[i + 1..];
    }
    out
}

/// The rules of the `kind` objects in deploy/rbac/<file>, in order.
fn plain_rules(file: &str, kind: &str) -> Vec<serde_yaml::Value> {
    let text = read(&root().join("deploy/rbac").join(file));
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| <serde_yaml::Value as serde::Deserialize>::deserialize(d).expect("YAML"))
        .filter(|v| v["kind"].as_str() == Some(kind))
        .map(|v| v["rules"].clone())
        .collect()
}

#[test]
fn chart_rbac_rules_are_those_of_deploy_rbac() {
    let agent = template_rules("agent-rbac.yaml");
    assert_eq!(agent.len(), 1);
    assert_eq!(
        agent,
        plain_rules("agent.yaml", "ClusterRole"),
        "agent ClusterRole rules differ from deploy/rbac/agent.yaml"
    );
    let op = template_rules("operator-rbac.yaml");
    assert_eq!(op.len(), 2, "operator ClusterRole and leader-election Role");
    assert_eq!(
        op[..1],
        plain_rules("operator.yaml", "ClusterRole")[..],
        "operator ClusterRole rules differ from deploy/rbac/operator.yaml"
    );
    assert_eq!(
        op[1..],
        plain_rules("operator.yaml", "Role")[..],
        "operator Role rules differ from deploy/rbac/operator.yaml"
    );
}
