//! Test fixture: a plugin built against the frozen contract `mounthost:plugin@0.1.0`
//! (`wit/v0.1.0/plugin.wit`) with its own bindings, without the SDK, so the host's adapter
//! for old plugins is exercised by a real component.
//!
//! - `stage` mounts a `tmpfs` at the staging directory with the options `size=<sizeMiB>m` and
//!   `mode=0755`; when `pathOption` is given, also `<pathOption>=` + the volume's cache
//!   directory (a 0.1.0 path argument, which the host sees with an empty suffix; a real tmpfs
//!   refuses such an option, so only the plan tests set it);
//! - `publish` binds the staging directory onto the target, read-only when asked;
//! - `fail=<invalid-argument|not-found|unavailable|internal>` makes `stage` return that
//!   error, with the value of the secret `token` in its message when one is given (the host
//!   must scrub it);
//! - everything else: `validate` accepts, `unstage` plans nothing, `provision`, `delete` and
//!   `dynamic-mount` are refused.
//!
//! The host grants no fstype by default: run it with `--grant legacy:fstype=tmpfs`.

wit_bindgen::generate!({
    path: "../../../wit/v0.1.0",
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
pub struct Legacy;

/// Size of the tmpfs in MiB.
const SIZE: &str = "sizeMiB";
/// Name of an extra mount option whose value is the cache directory.
const PATH_OPTION: &str = "pathOption";
/// The error to return from `stage`.
const FAIL: &str = "fail";
/// Keys this plugin reads (keys with a `/` belong to the orchestrator).
const KNOWN: [&str; 3] = [SIZE, PATH_OPTION, FAIL];
/// The default size in MiB.
const SIZE_DEFAULT: u64 = 16;

/// The value of `key` in `kvs`.
fn get<'a>(kvs: &'a [Kv], key: &str) -> Option<&'a str> {
    kvs.iter().find(|kv| kv.key == key).map(|kv| kv.value.as_str())
}

/// Refuse keys this plugin does not know.
fn check_known(kvs: &[Kv]) -> Result<(), BackendError> {
    match kvs.iter().find(|kv| !kv.key.contains('/') && !KNOWN.contains(&kv.key.as_str())) {
        Some(kv) => Err(BackendError::InvalidArgument(format!(
            "unknown parameter {:?}; accepted: {}",
            kv.key,
            KNOWN.join(", ")
        ))),
        None => Ok(()),
    }
}

/// `sizeMiB`, 1 to 1024.
fn size(kvs: &[Kv]) -> Result<u64, BackendError> {
    match get(kvs, SIZE) {
        None => Ok(SIZE_DEFAULT),
        Some(v) => match v.parse::<u64>() {
            Ok(n) if (1..=1024).contains(&n) && v.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
            _ => Err(BackendError::InvalidArgument(format!("parameter {SIZE:?} must be 1 to 1024, not {v:?}"))),
        },
    }
}

fn path(root: DirRoot, rel: &str) -> PathRef {
    PathRef { root, rel: rel.into() }
}

fn param(name: &str, doc: &str, kind: ParamKind, default_value: Option<String>) -> ParamDoc {
    ParamDoc {
        name: name.into(),
        doc: doc.into(),
        kind,
        source: ParamSource::Parameter,
        required: false,
        default_value,
    }
}

impl Guest for Legacy {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "legacy".into(),
            version: "0.1.0".into(),
            description: "Test fixture: a contract 0.1.0 plugin staging a tmpfs, for the host's adapter.".into(),
            parameters: vec![
                param(SIZE, "Size of the tmpfs in MiB, 1 to 1024.", ParamKind::Integer, Some(SIZE_DEFAULT.to_string())),
                param(PATH_OPTION, "Adds the mount option <name>= + the cache directory.", ParamKind::Text, None),
                param(FAIL, "Makes stage fail with this error.", ParamKind::Choice, None),
            ],
            programs: Vec::new(),
            fstypes: vec!["tmpfs".into()],
        }
    }

    fn validate(req: ValidateRequest) -> Result<(), BackendError> {
        check_known(&req.parameters)?;
        size(&req.parameters).map(|_| ())
    }

    fn provision(_req: ProvisionRequest) -> Result<ProvisionPlan, BackendError> {
        Err(BackendError::InvalidArgument("plugin legacy does not provision volumes".into()))
    }

    fn delete(_req: DeleteRequest) -> Result<Plan, BackendError> {
        Ok(Plan { steps: Vec::new(), attributes: Vec::new() })
    }

    fn stage(req: StageRequest) -> Result<Plan, BackendError> {
        check_known(&req.context)?;
        if let Some(kind) = get(&req.context, FAIL) {
            let message = format!("asked to fail (token {})", get(&req.secrets, "token").unwrap_or("none"));
            return Err(match kind {
                "not-found" => BackendError::NotFound(message),
                "unavailable" => BackendError::Unavailable(message),
                "internal" => BackendError::Internal(message),
                _ => BackendError::InvalidArgument(message),
            });
        }
        let mut options =
            vec![Arg::Literal(format!("size={}m", size(&req.context)?)), Arg::Literal("mode=0755".into())];
        if let Some(name) = get(&req.context, PATH_OPTION) {
            options.push(Arg::Path(PathArg { prefix: format!("{name}="), path: path(DirRoot::Cache, "") }));
        }
        Ok(Plan {
            steps: vec![Step::Mount(Mount {
                fstype: "tmpfs".into(),
                source: MountSource::Named("tmpfs".into()),
                target: path(DirRoot::Staging, ""),
                options,
                readonly: false,
            })],
            attributes: vec![Kv { key: "contract".into(), value: "0.1.0".into() }],
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
        Ok(Plan { steps: Vec::new(), attributes: Vec::new() })
    }

    fn dynamic_mount(_req: DynamicMountRequest) -> Result<Plan, BackendError> {
        Err(BackendError::InvalidArgument("plugin legacy does not support dynamic mounts".into()))
    }
}

// Only a wasm32 build exports anything (as in the SDK's `export_plugin!`).
#[cfg(target_arch = "wasm32")]
export!(Legacy);

#[cfg(test)]
mod tests {
    use super::*;
    use mounthost::plugin::types::VolumeCapability;

    fn kv(key: &str, value: &str) -> Kv {
        Kv { key: key.into(), value: value.into() }
    }

    fn stage_req(context: Vec<Kv>) -> StageRequest {
        StageRequest {
            volume_id: "v".into(),
            context,
            secrets: vec![kv("token", "t0ken")],
            capability: VolumeCapability {
                access_mode: AccessMode::SingleNodeWriter,
                fs_type: String::new(),
                mount_flags: Vec::new(),
            },
            ephemeral: false,
        }
    }

    #[test]
    fn stage_plans_a_sized_tmpfs() {
        let plan = Legacy::stage(stage_req(vec![kv(SIZE, "8"), kv(PATH_OPTION, "x")])).unwrap();
        let [Step::Mount(m)] = &plan.steps[..] else { panic!("{plan:?}") };
        assert_eq!(m.options[0], Arg::Literal("size=8m".into()));
        assert_eq!(m.options[2], Arg::Path(PathArg { prefix: "x=".into(), path: path(DirRoot::Cache, "") }));
        assert_eq!(Legacy::stage(stage_req(Vec::new())).unwrap().steps.len(), 1);
    }

    #[test]
    fn errors_on_request() {
        assert!(
            matches!(Legacy::stage(stage_req(vec![kv(FAIL, "unavailable")])), Err(BackendError::Unavailable(m)) if m.contains("t0ken"))
        );
        assert!(matches!(Legacy::stage(stage_req(vec![kv("nope", "1")])), Err(BackendError::InvalidArgument(_))));
        assert!(Legacy::stage(stage_req(vec![kv(SIZE, "0")])).is_err());
    }
}
