//! Test fixture: a plugin built against the frozen contract `mounthost:plugin@0.3.0`
//! (`wit/v0.3.0/plugin.wit`) with its own bindings, without the SDK, so the host's loading of
//! 0.3.0 components (their detection and instantiation) and its answers to the exports added in
//! 0.4.0 are exercised by a real component.
//!
//! - `stage` mounts a `tmpfs` at the staging directory with `size=<sizeMiB>m` (default 16) and
//!   `mode=0755`, the cache directory passed as a 0.3.0 path argument with a suffix
//!   (`x-cache=<dir>/.`) when `pathOption` is set (only the plan tests set it);
//! - `publish` binds the staging directory onto the target, read-only when asked;
//! - `fail=not-found` makes `stage` answer `not-found`;
//! - everything else: `validate` accepts, `unstage` and `delete` plan nothing, `provision` and
//!   `dynamic-mount` are refused.
//!
//! The host grants no fstype by default: run it with `--grant legacy030:fstype=tmpfs`.

wit_bindgen::generate!({
    path: "../../../wit/v0.3.0",
    world: "plugin",
    additional_derives: [PartialEq],
});

use exports::mounthost::plugin::planner::Guest;
use mounthost::plugin::types::{
    AccessMode, Arg, BackendError, Bind, DeleteRequest, DirRoot, DynamicMountRequest, Kv, Mount, MountSource, ParamDoc,
    ParamKind, ParamSource, PathArg, PathRef, Plan, PluginInfo, ProvisionPlan, ProvisionRequest, PublishRequest,
    StageRequest, Step, UnstageRequest, ValidateRequest,
};

/// The plugin, as exported to the host (public so native builds of the crate, which export
/// nothing, still use it).
pub struct Legacy030;

fn get<'a>(kvs: &'a [Kv], key: &str) -> Option<&'a str> {
    kvs.iter().find(|kv| kv.key == key).map(|kv| kv.value.as_str())
}

fn path(root: DirRoot, rel: &str) -> PathRef {
    PathRef { root, rel: rel.into() }
}

fn empty() -> Plan {
    Plan { steps: Vec::new(), attributes: Vec::new() }
}

impl Guest for Legacy030 {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "legacy030".into(),
            version: "0.3.0".into(),
            description: "Test fixture: a contract 0.3.0 plugin staging a tmpfs, for the host's adapter.".into(),
            parameters: vec![ParamDoc {
                name: "sizeMiB".into(),
                doc: "Size of the tmpfs in MiB.".into(),
                kind: ParamKind::Integer,
                source: ParamSource::Parameter,
                required: false,
                default_value: Some("16".into()),
            }],
            programs: Vec::new(),
            fstypes: vec!["tmpfs".into()],
        }
    }

    fn validate(_req: ValidateRequest) -> Result<(), BackendError> {
        Ok(())
    }

    fn provision(_req: ProvisionRequest) -> Result<ProvisionPlan, BackendError> {
        Err(BackendError::InvalidArgument("plugin legacy030 does not provision volumes".into()))
    }

    fn delete(_req: DeleteRequest) -> Result<Plan, BackendError> {
        Ok(empty())
    }

    fn stage(req: StageRequest) -> Result<Plan, BackendError> {
        if get(&req.context, "fail") == Some("not-found") {
            return Err(BackendError::NotFound("asked to fail".into()));
        }
        let size = get(&req.context, "sizeMiB").unwrap_or("16");
        let mut options = vec![Arg::Literal(format!("size={size}m")), Arg::Literal("mode=0755".into())];
        if let Some(name) = get(&req.context, "pathOption") {
            let cache = path(DirRoot::Cache, "");
            options.push(Arg::Path(PathArg { prefix: format!("{name}="), path: cache, suffix: "/.".into() }));
        }
        Ok(Plan {
            steps: vec![Step::Mount(Mount {
                fstype: "tmpfs".into(),
                source: MountSource::Named("tmpfs".into()),
                target: path(DirRoot::Staging, ""),
                options,
                readonly: false,
            })],
            attributes: vec![Kv { key: "contract".into(), value: "0.3.0".into() }],
        })
    }

    fn publish(req: PublishRequest) -> Result<Plan, BackendError> {
        let read_only =
            matches!(req.capability.access_mode, AccessMode::SingleNodeReaderOnly | AccessMode::MultiNodeReaderOnly);
        Ok(Plan {
            steps: vec![Step::Bind(Bind {
                source: path(DirRoot::Staging, ""),
                target: path(DirRoot::Target, ""),
                readonly: req.readonly || read_only,
                options: Vec::new(),
            })],
            attributes: Vec::new(),
        })
    }

    fn unstage(_req: UnstageRequest) -> Result<Plan, BackendError> {
        Ok(empty())
    }

    fn dynamic_mount(_req: DynamicMountRequest) -> Result<Plan, BackendError> {
        Err(BackendError::InvalidArgument("plugin legacy030 does not support dynamic mounts".into()))
    }
}

// Only a wasm32 build exports anything (as in the SDK's `export_plugin!`).
#[cfg(target_arch = "wasm32")]
export!(Legacy030);
