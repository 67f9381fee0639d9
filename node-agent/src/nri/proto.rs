//! Code generated at build time from `proto/nri.proto`: the messages (`nri`) and the ttrpc
//! client and server glue (`nri_ttrpc`).

include!(concat!(env!("OUT_DIR"), "/nri_modules.rs"));

pub use nri::*;
pub use nri_ttrpc::{create_plugin, Plugin, RuntimeClient};
