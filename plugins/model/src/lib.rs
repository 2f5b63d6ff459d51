//! The `model` plugin: mounts AI models packaged as ModelPack artifacts (CNCF model-spec), and
//! ordinary container images carrying a model, from OCI registries, read-only, into pods.
//!
//! A pure planner. It never touches the network: it asks the host to resolve the reference,
//! reads the manifest and config the host hands back, and plans fetches by digest that the
//! host executes natively into its content-addressed cache.
//!
//! - `validate` checks the reference, mirror, filters, secrets and capabilities;
//! - `provision` checks the same and returns a stable id and the parameters as the volume
//!   context; nothing is created, and `delete` has nothing to remove ([`controller`]);
//! - `stage` plans `resolve`, then, once the host has resolved it, `fetch-blob` and `unpack`
//!   steps for the selected layers and a read-only bind onto the staging path ([`node`]);
//! - `publish` binds the staging path onto the target, always read-only, `nosuid,nodev`;
//! - `unstage` adds nothing: the host removes the volume's cache directory;
//! - `dynamic_mount` plans the same two rounds as `stage` for a model a pod of a dynamic volume
//!   names, with its own filters, the volume's `mirror` and `insecure`, anonymous pulls, and a
//!   read-only bind onto the mount's own directory ([`node`]).
//!
//! The parameter table lives in [`params`], reference parsing in [`reference`](mod@reference),
//! the layer filters in [`filters`], manifest reading in [`manifest`].
//! User documentation: `docs/plugins/model.md`.

pub mod controller;
pub mod filters;
pub mod manifest;
pub mod node;
pub mod params;
pub mod reference;

use mounthost_plugin_sdk::*;

/// The plugin, as exported to the host.
pub struct Model;

impl Plugin for Model {
    fn info() -> PluginInfo {
        PluginInfo::new(
            "model",
            "0.1.0",
            "Mounts AI models packaged as ModelPack artifacts (CNCF model-spec) from OCI \
             registries, read-only. The host resolves the reference, fetches the \
             selected layers by digest into its node cache and unpacks them; filters \
             choose files by path and by layer class (weights, config, docs, code, \
             datasets). Ordinary container images (OCI or Docker) mount as the tree a \
             runtime builds from their layers, or one directory of it (path). Registry credentials come from CSI secrets, by key. Pods of a \
             dynamic volume may mount further models read-only at mounts/<id>/, naming \
             reference, include, exclude, weights, types and path (the volume's mirror and \
             insecure apply, and its CSI secrets go to the registries its \
             StorageClass names, never to others).",
        )
        .with_parameters(mounthost_plugin_sdk::params::param_docs(params::SPECS))
    }

    /// ValidateVolumeCapabilities: the host sends the volume's context and parameters in one
    /// list. Writer access modes are accepted: the volume is mounted read-only regardless.
    fn validate(req: ValidateRequest) -> Result<(), BackendError> {
        let p = params::open(&req.parameters, ParamSource::Context)?;
        params::Settings::parse(&p)?;
        params::registry_auth(&req.secrets)?;
        req.capabilities.iter().try_for_each(node::check_capability)
    }

    fn provision(req: ProvisionRequest) -> Result<ProvisionPlan, BackendError> {
        controller::provision(&req)
    }

    /// Nothing was created, so nothing is deleted.
    fn delete(_req: DeleteRequest) -> Result<Plan, BackendError> {
        Ok(Plan::default())
    }

    fn stage(req: StageRequest) -> Result<Plan, BackendError> {
        node::stage(&req).map(logged)
    }

    /// A model volume holds one artifact, read-only: its size is the artifact's, and no
    /// capacity asked for changes it (CSI's "Unsupported capacity": OUT_OF_RANGE).
    fn expand(req: ExpandRequest) -> Result<ExpandPlan, BackendError> {
        Err(BackendError::OutOfRange(format!(
            "model volume {} cannot be expanded: it holds one OCI artifact, read-only, and its size \
             is the artifact's; set allowVolumeExpansion: false on the model StorageClass",
            req.volume_id
        )))
    }

    fn publish(req: PublishRequest) -> Result<Plan, BackendError> {
        node::publish(&req)
    }

    /// A pod of a dynamic volume mounts another model at `mounts/<id>/`: parameters
    /// `reference`, `include`, `exclude`, `weights` and `types` ([`params::DYNAMIC`]).
    fn dynamic_mount(req: DynamicMountRequest) -> Result<Plan, BackendError> {
        node::dynamic_mount(&req).map(logged)
    }
}

/// The plan, after logging its notes.
fn logged(staged: node::Staged) -> Plan {
    for note in &staged.notes {
        log(Level::Warn, note);
    }
    staged.plan
}

export_plugin!(Model);

#[cfg(test)]
mod tests;
