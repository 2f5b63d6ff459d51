//! Guest SDK for mounthost plugins.
//!
//! A plugin is a pure planner compiled to a `wasm32-wasip2` component. Its author implements
//! [`Plugin`] and calls [`export_plugin!`] once:
//!
//! ```ignore
//! use mounthost_plugin_sdk::*;
//!
//! struct Tmpfs;
//! impl Plugin for Tmpfs {
//!     fn info() -> PluginInfo { /* name, version, parameters */ }
//!     fn stage(req: StageRequest) -> Result<Plan, BackendError> { /* steps */ }
//! }
//! export_plugin!(Tmpfs);
//! ```
//!
//! Everything else has a default: `validate` accepts, `publish` bind-mounts the staging
//! directory onto the target (read-only when asked), `unstage` adds nothing to the host's own
//! tear-down, and `provision`, `delete` and `dynamic_mount` say the plugin does not support them.
//! The [`params`] module turns the `list<kv>` the host sends into typed, validated values with
//! errors that name the parameter, and a plugin's table of [`params::ParamSpec`] rows into its
//! documentation and its unknown-key checks; [`net`] checks `host[:port]` endpoints; [`paths`]
//! builds the path references, arguments and values plans must use.
//!
//! A FUSE server that accepts an already mounted `/dev/fd/N` as its mountpoint (libfuse 3.3 or
//! later) can run unprivileged: its `spawn-fuse` step says `mount: `[`host_fd`]`(..)` and names
//! the connection with a [`fuse_fd_arg`]; the host opens `/dev/fuse`, mounts it and starts the
//! program as its configured unprivileged user with that descriptor only.
//!
//! SDK 1.1 builds plugins of contract `mounthost:plugin@0.5.0` ([`CONTRACT_VERSION`]); the SDK has
//! versions of its own (its CHANGELOG.md), a new contract being a minor release. A plugin
//! that needs an OCI artifact's manifest plans a [`Step::Resolve`] first; the host resolves it
//! and calls `stage` again with [`StageRequest::resolved`] set, and the plan then answers with
//! the same `Resolve` step followed by [`Step::FetchBlob`] and [`Step::Unpack`] steps.
//! `dynamic_mount` runs the same two rounds, with the resolution in `recorded` under reserved
//! keys ([`resolved_from_recorded`]); [`dynamic`] also says which directories a dynamic-mount
//! plan's roots name.

mod construct;
pub mod dynamic;
pub mod net;
pub mod params;
pub mod paths;

/// Bindings generated from `wit/plugin.wit` (contract `mounthost:plugin@0.5.0`). Plugin code
/// normally uses the re-exports at the crate root instead.
#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "plugin",
        pub_export_macro: true,
        export_macro_name: "__export_planner",
        default_bindings_module: "mounthost_plugin_sdk::bindings",
        additional_derives: [PartialEq],
        // Every type a later contract may grow (a field, a case) is `#[non_exhaustive]`, so
        // growing it is not a breaking change of the SDK: plugins build records with the
        // constructors of `construct.rs` and match with a wildcard arm. `kv` and `path-ref` are
        // complete and stay exhaustive.
        additional_type_attributes: {
            "mounthost:plugin/types@0.5.0/backend-error": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/param-kind": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/param-source": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/param-doc": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/plugin-info": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/access-mode": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/volume-capability": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/dir-root": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/arg": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/fuse-fd-arg": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/path-arg": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/secret-file-arg": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/secret-template": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/value": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/env-var": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/header": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/spawn-fuse": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/fuse-mount": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/host-fd-mount": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/mount-source": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/mount": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/bind": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/fetch": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/registry-auth": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/basic-auth": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/resolve": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/resolved": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/fetch-blob": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/archive": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/unpack": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/http-call": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/lookup": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/looked-up": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/socket-call": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/step": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/plan": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/validate-request": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/provision-request": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/provision-plan": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/delete-request": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/stage-request": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/publish-request": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/unstage-request": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/dynamic-mount-request": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/expand-side": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/expand-request": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/expand-plan": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/capacity-request": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/capacity-answer": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/list-request": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/listed-volume": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/list-answer": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/describe-request": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/existence": [#[non_exhaustive]],
            "mounthost:plugin/types@0.5.0/describe-answer": [#[non_exhaustive]],
            "mounthost:plugin/host@0.5.0/level": [#[non_exhaustive]],
        },
    });
}

#[doc(hidden)]
pub use bindings::exports::mounthost::plugin::planner::Guest as __Guest;
pub use bindings::mounthost::plugin::host::Level;
pub use bindings::mounthost::plugin::types::*;
pub use construct::{DEFAULT_READY_TIMEOUT_MS, DEFAULT_SOCKET_CALL_TIMEOUT_MS};
pub use dynamic::{
    RESOLVED_CONFIG, RESOLVED_KEYS, RESOLVED_MANIFEST, RESOLVED_MANIFEST_DIGEST, RESOLVED_PREFIX, RESOLVED_REFERENCE,
    resolved_from_recorded,
};
pub use params::Params;

/// The plugin contract these bindings implement (`package mounthost:plugin@0.5.0`).
pub const CONTRACT_VERSION: &str = "0.5.0";
pub use paths::{
    arg, cache, fuse_fd_arg, host_fd, literal, path_arg, path_arg_with_suffix, path_value, runtime, secret,
    secret_file_arg, secret_file_value, secret_template, staging, target,
};

/// What a plugin implements. Only [`Plugin::info`] and [`Plugin::stage`] are required.
pub trait Plugin {
    /// Name, version and documented parameters.
    fn info() -> PluginInfo;

    /// Check StorageClass parameters, secrets and capabilities without planning.
    fn validate(_req: ValidateRequest) -> Result<(), BackendError> {
        Ok(())
    }

    /// Plan CreateVolume. Default: this plugin has no dynamic provisioning (`unsupported`).
    fn provision(_req: ProvisionRequest) -> Result<ProvisionPlan, BackendError> {
        Err(BackendError::Unsupported(format!(
            "plugin {} does not provision volumes; create a static PersistentVolume instead",
            Self::info().name
        )))
    }

    /// Plan DeleteVolume. Default: nothing to delete.
    fn delete(_req: DeleteRequest) -> Result<Plan, BackendError> {
        Ok(Plan::default())
    }

    /// Plan NodeStageVolume.
    fn stage(req: StageRequest) -> Result<Plan, BackendError>;

    /// Plan NodePublishVolume. Default: bind the staging directory onto the target,
    /// read-only when the request or the access mode says so.
    fn publish(req: PublishRequest) -> Result<Plan, BackendError> {
        let readonly = req.readonly || is_read_only(req.capability.access_mode);
        Ok(Plan::new([Step::Bind(Bind::new(staging(""), target("")).with_readonly(readonly))]))
    }

    /// Plan extra clean-up for NodeUnstageVolume. Default: none.
    fn unstage(_req: UnstageRequest) -> Result<Plan, BackendError> {
        Ok(Plan::default())
    }

    /// Plan a dynamic mount asked for by a pod. Default: not supported (`unsupported`).
    ///
    /// `req.request` is the pod's and untrusted; `req.context` is the volume's. The plan's
    /// `target` root is the mount's own directory (`<published dir>/mounts/<id>`, so
    /// `req.subdir` is empty) and `cache` a cache directory of that mount alone; `staging` and
    /// `runtime` are not available, and every bind or mount onto the target must be read-only.
    /// A plan that needs an OCI artifact resolves it in two rounds, the resolution arriving in
    /// `req.recorded` ([`resolved_from_recorded`]). See [`dynamic`].
    fn dynamic_mount(_req: DynamicMountRequest) -> Result<Plan, BackendError> {
        Err(BackendError::Unsupported(format!("plugin {} does not support dynamic mounts", Self::info().name)))
    }

    /// Plan ControllerExpandVolume (`req.side` controller: the backend's record of the size)
    /// or NodeExpandVolume (node: what enforces the size on a node that has the volume staged).
    /// Default: the plugin's volumes have a fixed size (`out-of-range`, CSI's answer for a
    /// capacity the plugin does not allow).
    fn expand(_req: ExpandRequest) -> Result<ExpandPlan, BackendError> {
        Err(BackendError::OutOfRange(format!("plugin {}'s volumes cannot be expanded", Self::info().name)))
    }

    /// Answer GetCapacity for a StorageClass's parameters. Default: the plugin cannot tell.
    fn capacity(_req: CapacityRequest) -> Result<CapacityAnswer, BackendError> {
        Ok(CapacityAnswer::default())
    }

    /// List the volumes the plugin's backends (`req.hosts`) hold. Default: none are listed.
    fn list_volumes(_req: ListRequest) -> Result<ListAnswer, BackendError> {
        Ok(ListAnswer::default())
    }

    /// Say whether a volume exists. Default: the plugin cannot tell.
    fn describe(_req: DescribeRequest) -> Result<DescribeAnswer, BackendError> {
        Ok(DescribeAnswer::new(Existence::Unknown))
    }
}

/// The answer to the lookup named `key` in `looked_up`, if it has one.
pub fn looked_up<'a>(looked_up: &'a [LookedUp], key: &str) -> Option<&'a LookedUp> {
    looked_up.iter().find(|l| l.key == key)
}

/// True for the access modes that never write.
pub fn is_read_only(mode: AccessMode) -> bool {
    matches!(mode, AccessMode::SingleNodeReaderOnly | AccessMode::MultiNodeReaderOnly)
}

/// Shorthand for a [`Kv`].
pub fn kv(key: impl Into<String>, value: impl Into<String>) -> Kv {
    Kv { key: key.into(), value: value.into() }
}

/// Write a line to the host's log (tagged with plugin and volume there). Never log secrets.
pub fn log(level: Level, message: &str) {
    bindings::mounthost::plugin::host::log(level, message);
}

/// Export a type implementing [`Plugin`] as this component's `planner` interface.
///
/// Only a `wasm32` build exports anything: natively (unit tests of a plugin crate) the
/// component export symbols could not pass a `cdylib`'s linker version script, and nothing
/// would load them.
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            struct __MounthostPlanner;
            impl $crate::__Guest for __MounthostPlanner {
                fn info() -> $crate::PluginInfo {
                    <$plugin as $crate::Plugin>::info()
                }
                fn validate(req: $crate::ValidateRequest) -> Result<(), $crate::BackendError> {
                    <$plugin as $crate::Plugin>::validate(req)
                }
                fn provision(req: $crate::ProvisionRequest) -> Result<$crate::ProvisionPlan, $crate::BackendError> {
                    <$plugin as $crate::Plugin>::provision(req)
                }
                fn delete(req: $crate::DeleteRequest) -> Result<$crate::Plan, $crate::BackendError> {
                    <$plugin as $crate::Plugin>::delete(req)
                }
                fn stage(req: $crate::StageRequest) -> Result<$crate::Plan, $crate::BackendError> {
                    <$plugin as $crate::Plugin>::stage(req)
                }
                fn publish(req: $crate::PublishRequest) -> Result<$crate::Plan, $crate::BackendError> {
                    <$plugin as $crate::Plugin>::publish(req)
                }
                fn unstage(req: $crate::UnstageRequest) -> Result<$crate::Plan, $crate::BackendError> {
                    <$plugin as $crate::Plugin>::unstage(req)
                }
                fn dynamic_mount(req: $crate::DynamicMountRequest) -> Result<$crate::Plan, $crate::BackendError> {
                    <$plugin as $crate::Plugin>::dynamic_mount(req)
                }
                fn expand(req: $crate::ExpandRequest) -> Result<$crate::ExpandPlan, $crate::BackendError> {
                    <$plugin as $crate::Plugin>::expand(req)
                }
                fn capacity(req: $crate::CapacityRequest) -> Result<$crate::CapacityAnswer, $crate::BackendError> {
                    <$plugin as $crate::Plugin>::capacity(req)
                }
                fn list_volumes(req: $crate::ListRequest) -> Result<$crate::ListAnswer, $crate::BackendError> {
                    <$plugin as $crate::Plugin>::list_volumes(req)
                }
                fn describe(req: $crate::DescribeRequest) -> Result<$crate::DescribeAnswer, $crate::BackendError> {
                    <$plugin as $crate::Plugin>::describe(req)
                }
            }
    $crate::bindings::__export_planner!(__MounthostPlanner with_types_in $crate::bindings);
        };
    };
}
