//! Test fixture: a plugin that reads a file through WASI, so its component imports
//! `wasi:filesystem`. The host must refuse to load it.

use mounthost_plugin_sdk::*;

struct FsReader;

impl Plugin for FsReader {
    fn info() -> PluginInfo {
        PluginInfo::new("fs-reader", "0.1.0", "Test fixture that tries to read the node's filesystem.")
    }

    fn stage(_req: StageRequest) -> Result<Plan, BackendError> {
        let text = std::fs::read_to_string("/etc/hostname").map_err(|e| BackendError::Internal(e.to_string()))?;
        Ok(Plan::default().with_attributes([kv("hostname", text)]))
    }
}

export_plugin!(FsReader);
