//! The e2e tests in one binary, a module per scenario (each test binary links the agent, the
//! operator and the harness again). Every test that needs real components is
//! `#[ignore = "e2e tier: ..."]`: `cargo test` shows it as ignored, and the e2e tier
//! (`hack/test.sh e2e`) runs it with `TAP_E2E=1` and `-- --include-ignored --test-threads=1`.
//! One scenario: `cargo test -p tap-e2e --test e2e -- --include-ignored nri::`. The tests that
//! read files only (`chart_files`, `docs_files`) run in every `cargo test`.
//!
//! The NUMA guest tests are a binary of their own (tests/numa_vm.rs): the arm64 guest runs that
//! binary built for aarch64 (hack/build-arm64.sh --guest), and building this one for aarch64
//! would compile every scenario and the operator on the CI's critical path for nothing.

mod chart_files;
mod chart_versions;
mod churn_containerd;
mod churn_docker;
mod cluster;
mod cluster_cri_retry;
mod crds;
mod cri_proxy;
mod docker_proxy;
mod docs_files;
mod faults_cri;
mod faults_docker;
mod faults_nri;
mod helm;
mod images;
mod images_multiarch;
mod leader_election;
mod node_restriction;
mod nri;
mod nri_scale;
mod nrt;
mod operator;
mod prometheus_rules;
mod rebalance;
mod startup_bound;
