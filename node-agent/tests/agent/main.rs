//! The agent's binary driven from outside, in one test binary (each test binary links the agent
//! again): its flag checks, `--explain` on the fixtures and the README's first command. The
//! property tests are the other binary (tests/fuzz).

mod common;

mod cli_flags;
mod explain_cpu;
mod explain_devices;
mod readme_commands;
