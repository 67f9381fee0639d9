//! Operator leader election under clock skew, against a real kube-apiserver + etcd.
//!
//! Replicas play nodes whose clocks are an hour ahead or behind with the operator's hidden,
//! test-only `--test-wall-clock-offset` (it shifts the `acquireTime`/`renewTime` a replica
//! writes). A relay of four hand-overs covers both directions on both sides: a skewed leader
//! with an exact candidate, and an exact leader with a skewed candidate. Each time the candidate
//! must leave the live leader alone for two lease durations, and take over after the leader is
//! killed (SIGKILL, no release) about a lease duration after the leader's last renewal:
//! `acquireTime` minus `renewTime`, each less its writer's known offset, on this one machine's
//! clock.

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use tap_e2e::kube::{cargo_bin, free_port, KubeCluster, Proc};
use tap_e2e::util;

const LEASE: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_millis(300);
const HOUR: i64 = 3600;

struct Replica {
    name: String,
    offset_s: i64,
    proc: Proc,
    metrics_port: u16,
}

fn start(k: &KubeCluster, bin: &Path, kc: &Path, name: &str, offset_s: i64) -> Result<Replica> {
    let metrics_port = free_port()?;
    let mut cmd = Command::new(bin);
    cmd.env("KUBECONFIG", kc)
        .env_remove("POD_NAMESPACE")
        .env_remove("POD_NAME")
        .arg("--leader-elect")
        .arg("--lease-namespace=kunpeng-tap")
        .arg(format!("--lease-duration={}s", LEASE.as_secs()))
        .arg("--renew-deadline=2s")
        .arg(format!("--retry-period={}ms", RETRY.as_millis()))
        .arg(format!("--test-wall-clock-offset={offset_s}s"))
        .arg(format!("--identity={name}"))
        .arg(format!("--metrics-bind-address=127.0.0.1:{metrics_port}"))
        .arg("--health-probe-bind-address=")
        .arg("-v=3");
    let proc = Proc::spawn(name, cmd, &k.dir.join(format!("{name}.log")))?;
    Ok(Replica {
        name: name.to_string(),
        offset_s,
        proc,
        metrics_port,
    })
}

fn lease(k: &KubeCluster) -> Result<Option<Value>> {
    Ok(
        k.get_json(&["-n", "kunpeng-tap", "get", "lease", "kunpeng-tap-operator"])?
            .map(|v| v["spec"].clone()),
    )
}

/// The replica name of the holder (identities are `<name>_<pid>`).
fn holder(spec: &Value) -> Option<&str> {
    spec["holderIdentity"]
        .as_str()
        .and_then(|h| h.rsplit_once('_'))
        .map(|(n, _)| n)
}

fn ts(spec: &Value, field: &str) -> Result<jiff::Timestamp> {
    let s = spec[field]
        .as_str()
        .with_context(|| format!("Lease without {field}: {spec}"))?;
    s.parse().with_context(|| format!("Lease {field} {s:?}"))
}

fn leader_gauge(port: u16) -> Result<f64> {
    let body = tap_e2e::util::http_get(port, "/metrics")?;
    body.lines()
        .find_map(|l| l.strip_prefix("tap_operator_leader "))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no tap_operator_leader in:\n{body}"))
}

/// The holder `r` writes renewTime from its shifted clock (the flag works).
fn check_written_skew(spec: &Value, r: &Replica) -> Result<()> {
    let renew = ts(spec, "renewTime")?;
    let expect = jiff::Timestamp::now().as_second() + r.offset_s;
    if (renew.as_second() - expect).abs() > 60 {
        bail!(
            "{} (offset {}s) wrote renewTime {renew}, expected about {expect} (unix s)",
            r.name,
            r.offset_s
        );
    }
    Ok(())
}

/// The renewTime `r` wrote, on this machine's clock (its known offset taken out), in µs.
fn renewed_at_us(spec: &Value, r: &Replica) -> Result<i64> {
    Ok(ts(spec, "renewTime")?.as_microsecond() - r.offset_s * 1_000_000)
}

/// `candidate` must leave the live `leader` alone for two lease durations.
fn leaves_live_leader_alone(k: &KubeCluster, leader: &Replica, candidate: &Replica) -> Result<()> {
    let first = lease(k)?.context("no Lease")?;
    let transitions = first["leaseTransitions"].clone();
    let mut last = first.clone();
    let start = Instant::now();
    while start.elapsed() < LEASE * 2 {
        let spec = lease(k)?.context("Lease gone")?;
        if holder(&spec) != Some(leader.name.as_str()) || spec["leaseTransitions"] != transitions {
            bail!(
                "{} (offset {}s) took the lease from the live leader {} (offset {}s): {spec}",
                candidate.name,
                candidate.offset_s,
                leader.name,
                leader.offset_s
            );
        }
        last = spec;
        std::thread::sleep(Duration::from_millis(200));
    }
    // The leader really renewed meanwhile (so "left alone" is not a stale read): its renewTime
    // moved on by at least a lease duration. Counting the renewals the polls happened to see
    // would depend on how fast kubectl answers.
    let moved_us = renewed_at_us(&last, leader)? - renewed_at_us(&first, leader)?;
    if moved_us < LEASE.as_micros() as i64 {
        bail!(
            "the leader's renewTime moved on by {moved_us} us in {:?}",
            LEASE * 2
        );
    }
    if leader_gauge(candidate.metrics_port)? != 0.0 {
        bail!("{} reports itself leader", candidate.name);
    }
    check_written_skew(&lease(k)?.context("Lease gone")?, leader)
}

/// Kills `leader`; `candidate` takes over. Returns the hand-over time, from the leader's last
/// renewal to the candidate's acquireTime.
fn takes_over_dead_leader(
    k: &KubeCluster,
    leader: &mut Replica,
    candidate: &Replica,
) -> Result<Duration> {
    // The last renewal seen before the kill. One more may land between this read and the kill
    // (or be in flight at the kill): at most a retry period and a request later.
    let renewed_us = renewed_at_us(&lease(k)?.context("Lease gone")?, leader)?;
    leader.proc.kill();
    let mut spec = Value::Null;
    k.wait_for(LEASE * 4, &format!("{} takes over", candidate.name), |k| {
        spec = lease(k)?.unwrap_or(Value::Null);
        Ok(holder(&spec) == Some(candidate.name.as_str()))
    })?;
    check_written_skew(&spec, candidate)?;
    let acquired = ts(&spec, "acquireTime")?.as_microsecond() - candidate.offset_s * 1_000_000;
    let took_us = acquired - renewed_us;
    let took = Duration::from_micros(u64::try_from(took_us).unwrap_or(0));
    // Not before the lease expired: the candidate counts a lease duration from when it saw the
    // last renewal, which is after the renewal. Not much after: it sees that renewal within a
    // retry period, tries again every retry period, and a later renewal than the one read here
    // is at most a retry period later; 2 s of slack for API latency on a loaded machine.
    let slack = Duration::from_secs(2);
    let (min, max) = (
        LEASE - Duration::from_millis(100),
        LEASE + RETRY * 3 + slack,
    );
    if took_us < 0 || took < min || took > max {
        bail!(
            "{} (offset {}s) took over {took_us} us after the last renewal of {} (offset {}s); expected {min:?}..{max:?}",
            candidate.name,
            candidate.offset_s,
            leader.name,
            leader.offset_s
        );
    }
    if leader_gauge(candidate.metrics_port)? != 1.0 {
        bail!(
            "{} holds the lease but its gauge says otherwise",
            candidate.name
        );
    }
    Ok(took)
}

fn scenario(k: &KubeCluster, reps: &mut Vec<Replica>) -> Result<()> {
    let bin = cargo_bin("tap-operator", "kunpeng-tap-operator")?;
    k.apply_crds_and_rbac()?;
    let kc = k.service_account_kubeconfig("operator", "kunpeng-tap-operator")?;
    // (name, wall-clock offset): each one leads after the previous one is killed.
    // Hand-overs: leader ahead -> exact candidate, exact leader -> candidate behind, leader
    // behind -> exact candidate, exact leader -> candidate ahead.
    let relay = [
        ("ahead", HOUR),
        ("exact1", 0),
        ("behind", -HOUR),
        ("exact2", 0),
        ("ahead2", HOUR),
    ];
    reps.push(start(k, &bin, &kc, relay[0].0, relay[0].1)?);
    k.wait_for(Duration::from_secs(30), "the first leader", |k| {
        Ok(lease(k)?.is_some_and(|s| holder(&s) == Some(relay[0].0)))
    })?;
    for (i, (name, offset)) in relay.iter().enumerate().skip(1) {
        reps.push(start(k, &bin, &kc, name, *offset)?);
        // Let the candidate start and read the Lease at least once.
        std::thread::sleep(Duration::from_secs(1));
        let (done, rest) = reps.split_at_mut(i);
        let (leader, candidate) = (&mut done[i - 1], &rest[0]);
        leaves_live_leader_alone(k, leader, candidate)?;
        let took = takes_over_dead_leader(k, leader, candidate)?;
        eprintln!(
            "leader {:+}s -> candidate {:+}s: left alone for {:?}, took over {:.2}s after the leader's last renewal (lease {:?}, retry {:?})",
            leader.offset_s,
            candidate.offset_s,
            LEASE * 2,
            took.as_secs_f64(),
            LEASE,
            RETRY
        );
    }
    // A clean stop releases the Lease.
    if let Some(last) = reps.last_mut() {
        last.proc.terminate(Duration::from_secs(10));
    }
    k.wait_for(Duration::from_secs(10), "Lease released", |k| {
        Ok(lease(k)?.is_some_and(|s| s["holderIdentity"].is_null()))
    })
}

#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn leader_election_survives_clock_skew() {
    util::require_e2e_tier();
    let k = KubeCluster::start().expect("starting etcd + kube-apiserver");
    let mut reps = Vec::new();
    if let Err(e) = scenario(&k, &mut reps) {
        for r in &reps {
            eprintln!("--- {} log:\n{}", r.name, r.proc.log_tail(30));
        }
        eprintln!("--- kube-apiserver log:\n{}", k.apiserver.log_tail(20));
        panic!("{e:#}");
    }
}
