//! The controller side: CreateVolume checks the parameters and names the volume; nothing is
//! created anywhere, and DeleteVolume has nothing to remove.
//!
//! A model volume is a view of an artifact that already exists in a registry, so provisioning
//! only validates the StorageClass (a typo fails the PersistentVolumeClaim at once, not every
//! pod on every node) and hands the parameters back as the volume context, where NodeStage
//! reads them. The capacity is 0, "unknown" in CSI's words: the model's size is only known once
//! a node resolves it.
//!
//! The id is a short hash of the CSI name, the canonical reference and the canonical filters,
//! so it is stable: a retried CreateVolume gets the same id. The name keeps it unique per
//! PersistentVolume, as CSI requires and kubelet relies on (it derives the staging path from
//! the id): two claims on one model never share a stage, and unstaging one cannot take the
//! files from under the other's pods.

use mounthost_plugin_sdk::params::invalid;
use mounthost_plugin_sdk::{BackendError, Kv, ParamSource, ProvisionPlan, ProvisionRequest, kv};
use sha2::{Digest, Sha256};

use crate::node::check_capability;
use crate::params::{self, SPECS, Settings};

/// Hex digits of the hash in a volume id (128 bits).
pub const ID_HEX: usize = 32;

/// Plan CreateVolume.
pub fn provision(req: &ProvisionRequest) -> Result<ProvisionPlan, BackendError> {
    let p = params::open(&req.parameters, ParamSource::Parameter)?;
    let settings = Settings::parse(&p)?;
    params::registry_auth(&req.secrets)?;
    for cap in &req.capabilities {
        check_capability(cap)?;
    }
    if req.name.is_empty() {
        return Err(invalid("the volume name is empty"));
    }
    // Every documented parameter as given, in table order (NodeStage parses them again).
    let context: Vec<Kv> = SPECS
        .iter()
        .filter(|s| s.source == ParamSource::Parameter)
        .filter_map(|s| p.get(s.name).map(|v| kv(s.name, v)))
        .collect();
    Ok(ProvisionPlan::new(volume_id(&req.name, &settings), 0).with_context(context))
}

/// The plugin's part of the volume id: [`ID_HEX`] lower-case hex digits of SHA-256 over the
/// CSI name, the canonical reference and the canonical filters.
pub fn volume_id(name: &str, settings: &Settings) -> String {
    let mut h = Sha256::new();
    for part in [name, &settings.reference.canonical(), &settings.filters.canonical()] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().iter().take(ID_HEX / 2).map(|b| format!("{b:02x}")).collect()
}
