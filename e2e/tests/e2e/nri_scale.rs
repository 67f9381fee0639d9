//! 1,000 containers through the NRI protocol: the agent (`kunpeng-tap` in NRI mode on the
//! repository's 96-CPU fixture) registers with a test runtime ([`tap_e2e::nri_runtime`]), is
//! asked to create 1,000 containers of mixed QoS, answers every one with a cpuset, and
//! accounts all 1,000 in its metrics. Then the runtime goes away and comes back: the agent
//! reconnects and a Synchronize listing the same containers (with the cpusets and grant records it gave
//! them) changes nothing and leaves it accounting 1,000.
//! (The memory this costs is measured by `tap-nri-memory`, docs/design/scale.md.)

use anyhow::{ensure, Context, Result};
use std::time::Duration;
use tap_e2e::docker::{tcp_get, TapAgent};
use tap_e2e::nri_runtime::{create_mix, start_agent, AgentOnRuntime, MixOptions};
use tap_e2e::text::metric_sum;
use tap_e2e::util::{self, RmDir};

const N: usize = 1000;

fn known(agent: &TapAgent) -> Result<f64> {
    let (code, body) = tcp_get(&agent.metrics_addr, "/metrics")?;
    ensure!(code == 200, "/metrics answered {code}");
    Ok(metric_sum(&body, "tap_topology_node_containers"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
async fn a_thousand_creates_are_answered_with_a_cpuset_and_accounted() -> Result<()> {
    util::require_e2e_tier();
    let dir = util::temp_dir("tap-nri-scale")?;
    let _rm = RmDir(dir.clone());
    let fixture = util::fixture_dir("synthetic-2s-4numa-96c-gpu");
    let AgentOnRuntime {
        agent,
        runtime,
        session,
    } = start_agent(&dir, &fixture).await?;
    assert_eq!(
        session.registered,
        ("kunpeng-tap".to_string(), "10".to_string())
    );
    assert_eq!(known(&agent)?, 0.0);

    let tally = create_mix(
        &session,
        0..N,
        MixOptions {
            keep: true,
            bare: false,
        },
    )
    .await?;
    assert_eq!(tally.answered, N);
    assert_eq!(
        tally.with_cpuset,
        N,
        "answered without a cpuset: {:?}\n{}",
        tally.without_cpuset,
        agent.log_tail(30)
    );
    assert_eq!(known(&agent)?, N as f64, "{}", agent.log_tail(30));

    // The runtime restarts: the agent reconnects and the sync lists the same containers.
    session.close().await;
    let session = runtime
        .accept(Duration::from_secs(30))
        .await
        .context("the agent did not reconnect")?;
    session.configure().await?;
    let (pods, containers): (Vec<_>, Vec<_>) = tally.created.into_iter().unzip();
    let resp = session.synchronize(pods, containers).await?;
    // What it granted is what the containers have: nothing to change.
    assert!(resp.update.is_empty(), "{} updates", resp.update.len());
    assert_eq!(known(&agent)?, N as f64, "{}", agent.log_tail(30));
    assert!(!agent.panicked());
    session.close().await;
    Ok(())
}
