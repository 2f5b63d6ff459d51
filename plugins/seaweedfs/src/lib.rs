//! The `seaweedfs` plugin: mounts SeaweedFS filer directories with `weed mount`.
//!
//! A pure planner. Given StorageClass parameters, a volume context and secrets it returns plans
//! the mounthost host checks against its policy and executes:
//!
//! - `validate` checks parameters, secrets and capabilities;
//! - `provision` plans one filer directory per volume (`<parentDir>/<directory name>`, the
//!   CSI name mapped to a name SeaweedFS takes by [`names`]), a capacity record next to it, and
//!   an id that tells `delete` where both are ([`controller`]);
//! - `stage` plans one `weed mount` FUSE process at the staging path ([`node`]);
//! - `publish` is the SDK's bind mount of the staging path onto the target, read-only when asked;
//! - `unstage` adds nothing: the host stops what stage started and removes the cache directory;
//! - `expand`, `capacity`, `list-volumes` and `describe` read SeaweedFS through lookups and
//!   grow a volume's quota ([`volumes`]).
//!
//! The parameter table lives in [`params`] (value checks in [`values`]), the `weed mount` flag
//! allowlist in [`mount_options`].
//! User documentation: `docs/plugins/seaweedfs.md`.

pub mod controller;
pub mod mount_options;
pub mod names;
pub mod node;
pub mod params;
pub mod values;
pub mod volumes;

use mounthost_plugin_sdk::*;

/// The plugin, as exported to the host.
pub struct Seaweedfs;

impl Plugin for Seaweedfs {
    fn info() -> PluginInfo {
        PluginInfo::new(
            "seaweedfs",
            "0.1.0",
            "Mounts SeaweedFS filer directories with `weed mount` (FUSE). Provisioning \
             creates one directory per volume under parentDir on the filer; static \
             volumes mount an existing path. Secrets reach weed only through its \
             environment.",
        )
        .with_parameters(mounthost_plugin_sdk::params::param_docs(params::SPECS))
        .with_programs([node::PROGRAM])
        .with_fstypes([node::FSTYPE])
    }

    /// ValidateVolumeCapabilities: the host sends the volume's context and parameters in one
    /// list, so `path` is accepted here (CreateVolume still refuses it as a parameter).
    fn validate(req: ValidateRequest) -> Result<(), BackendError> {
        let p = params::open(&req.parameters, ParamSource::Context)?;
        let settings = params::Settings::parse(&p)?;
        values::check_bucket_path(&values::label("parentDir"), settings.parent_dir)?;
        if let Some(path) = settings.path {
            values::check_bucket_path(&values::label("path"), path)?;
        }
        params::secret_env(&req.secrets)?;
        for cap in &req.capabilities {
            let flags = mount_options::check_capability(cap)?;
            mount_options::merge(settings.mount_options.clone(), flags.options)?;
        }
        Ok(())
    }

    fn provision(req: ProvisionRequest) -> Result<ProvisionPlan, BackendError> {
        controller::provision(&req)
    }

    fn delete(req: DeleteRequest) -> Result<Plan, BackendError> {
        controller::delete(&req)
    }

    fn stage(req: StageRequest) -> Result<Plan, BackendError> {
        node::stage(&req)
    }

    fn expand(req: ExpandRequest) -> Result<ExpandPlan, BackendError> {
        volumes::expand(&req)
    }

    fn capacity(req: CapacityRequest) -> Result<CapacityAnswer, BackendError> {
        volumes::capacity(&req)
    }

    fn list_volumes(req: ListRequest) -> Result<ListAnswer, BackendError> {
        volumes::list(&req)
    }

    fn describe(req: DescribeRequest) -> Result<DescribeAnswer, BackendError> {
        volumes::describe(&req)
    }
}

export_plugin!(Seaweedfs);

#[cfg(test)]
mod tests;
