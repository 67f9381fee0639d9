//! Flag validation through the real binary: a bad combination exits non-zero with a clear
//! message before anything starts; a good one gets past validation.

use std::process::Command;

fn tap(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kunpeng-tap"))
        .args(args)
        .env("TAP_LOG", "off")
        .output()
        .expect("running kunpeng-tap");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn docker_mode_without_an_endpoint_is_refused() {
    let (code, err) = tap(&[
        "--container-runtime-mode=Docker",
        "--container-runtime-service-endpoint=",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("needs --container-runtime-service-endpoint"),
        "{err}"
    );
}

#[test]
fn containerd_mode_with_the_proxy_on_the_runtime_socket_is_refused() {
    let (code, err) = tap(&[
        "--container-runtime-mode=Containerd",
        "--runtime-proxy-endpoint=/run/x.sock",
        "--container-runtime-service-endpoint=unix:///run/x.sock",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("are the same socket"), "{err}");
}

#[test]
fn unknown_mode_and_bad_index_are_refused() {
    let (code, err) = tap(&["--container-runtime-mode=cri-o"]);
    assert_ne!(code, 0);
    assert!(err.contains("use Docker, Containerd or NRI"), "{err}");
    let (code, err) = tap(&["--container-runtime-mode=NRI", "--nri-plugin-index=7"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("two digits"), "{err}");
}

#[test]
fn a_valid_combination_passes_validation() {
    // Valid flags, but a sysfs root that does not exist: the failure comes after validation.
    let (code, err) = tap(&[
        "--container-runtime-mode=Docker",
        "--container-runtime-service-endpoint=/nonexistent/docker.sock",
        "--sysfs-root=/nonexistent-sysfs",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("discovering the topology"), "{err}");
}

/// The shipped systemd units' ExecStart flags are accepted (parsed and validated).
#[test]
fn systemd_unit_flags_are_valid() {
    for runtime in ["docker", "containerd"] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("../hack/kunpeng-tap/kunpeng-tap.service.{runtime}"));
        let unit = std::fs::read_to_string(&path).expect("unit file");
        let joined = unit.replace("\\\n", " ");
        let exec = joined
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .expect("ExecStart");
        let mut words = exec.split_whitespace();
        assert_eq!(words.next(), Some("/usr/local/bin/kunpeng-tap"));
        let mut args: Vec<&str> = words.collect();
        assert!(args
            .iter()
            .any(|a| a.starts_with("--container-runtime-mode=")));
        args.push("--sysfs-root=/nonexistent-sysfs");
        let (code, err) = tap(&args);
        assert_eq!(code, 1, "{runtime}: {err}");
        assert!(err.contains("discovering the topology"), "{runtime}: {err}");
    }
}
