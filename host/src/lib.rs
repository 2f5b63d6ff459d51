//! mounthost: a Kubernetes CSI driver whose privileged host daemon stays stable while backend
//! logic lives in sandboxed WebAssembly plugins.
//!
//! Everything lives in this library so tests can drive it in-process; `main.rs` only parses
//! flags. `unsafe` is denied everywhere except [`exec`], the one room for privileged code.
#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod cli;
pub mod config;
pub mod daemon;
pub mod error;
pub mod exec;
pub mod front;
pub mod lazyfs;
pub mod metrics;
pub mod oci;
pub mod plan;
pub mod plugin;
pub mod proto;
pub mod secrets;
pub mod stock;
pub mod telemetry;
pub mod unpriv;
pub mod volume;
