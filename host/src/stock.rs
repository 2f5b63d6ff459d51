//! The stock plugins compiled into the binary (built by `host/build.rs`).

use crate::plugin::StockPlugin;

/// The seaweedfs plugin component.
pub const SEAWEEDFS: &[u8] = include_bytes!(concat!(env!("MOUNTHOST_PLUGIN_WASM"), "/mounthost_plugin_seaweedfs.wasm"));

/// The model plugin component (ModelPack artifacts from OCI registries).
pub const MODEL: &[u8] = include_bytes!(concat!(env!("MOUNTHOST_PLUGIN_WASM"), "/mounthost_plugin_model.wasm"));

/// Every stock plugin.
pub fn plugins() -> Vec<StockPlugin> {
    vec![StockPlugin { name: "seaweedfs", wasm: SEAWEEDFS }, StockPlugin { name: "model", wasm: MODEL }]
}

/// The stock plugins' names, in the order of [`plugins`].
pub fn names() -> Vec<&'static str> {
    plugins().iter().map(|p| p.name).collect()
}

/// The stock plugins named in `offered`, in the order of [`plugins`] (what a host started with
/// `--stock-plugins` offers).
pub fn offered(offered: &std::collections::BTreeSet<String>) -> Vec<StockPlugin> {
    plugins().into_iter().filter(|p| offered.contains(p.name)).collect()
}

/// Test fixtures built with the stock plugins (used by tests and benchmarks only).
pub mod fixtures {
    /// Path of a fixture component, e.g. `misbehave`.
    pub fn path(name: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("MOUNTHOST_PLUGIN_WASM"))
            .join(format!("mounthost_plugin_{}.wasm", name.replace('-', "_")))
    }
}
