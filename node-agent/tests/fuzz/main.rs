//! The agent's property tests in one binary (each test binary links the agent again), a module
//! per reader: the CRI proxy's, the Docker proxy's and the NRI multiplexer's. Proptest keeps
//! each module's regressions beside its source (`<module>.proptest-regressions`).

mod common;

mod fuzz_cri;
mod fuzz_docker;
mod fuzz_nri_mux;
