//! Test fixture: a plugin whose plans touch a path in every directory a volume has, so the
//! symlink tests (`host/tests/symlinks.rs`) can plant a link at each of them. No process, no
//! network, no backend.
//!
//! - `stage` mounts a `tmpfs` at the staging directory, then makes `data/sub` inside it, `c/d`
//!   in the volume's cache directory and `r` in its runtime directory;
//! - `publish` makes the target, then binds `<staging>/<subPath>` onto it (read-only when the
//!   request or the access mode asks);
//! - `unstage` removes `c/d` from the cache directory and `r` from the runtime directory (the
//!   host then removes both directories itself).
//!
//! Its only parameter is `subPath` (default `data/sub`), the path inside the staging directory
//! that publish binds. It is passed to the host as given, so the host's policy is what judges
//! it. Any other parameter, and any secret, is refused. The host grants no fstype by default:
//! run it with `--grant paths:fstype=tmpfs`.

use mounthost_plugin_sdk::*;

/// The plugin, as exported to the host (public so native builds of the crate, which export
/// nothing, still use it).
pub struct Paths;

/// The one parameter.
const SUB_PATH: &str = "subPath";
/// What publish binds unless told otherwise.
pub const SUB_PATH_DEFAULT: &str = "data/sub";
/// What stage makes in the cache directory, and unstage removes.
pub const CACHE_DIR: &str = "c/d";
/// What stage makes in the runtime directory, and unstage removes.
pub const RUNTIME_DIR: &str = "r";

/// Every documented key with where it may come from, for `check_known`.
const KNOWN: [(&str, ParamSource); 1] = [(SUB_PATH, ParamSource::Parameter)];

/// Check a parameter list (StorageClass parameters, or a volume context) and read `subPath`.
fn sub_path(kvs: &[Kv], source: ParamSource) -> Result<String, BackendError> {
    let params = Params::new("parameter", kvs)?;
    params.check_known(KNOWN, source)?;
    Ok(params.text(SUB_PATH)?.unwrap_or(SUB_PATH_DEFAULT).to_string())
}

/// This plugin reads no secret: any is a mistake in the StorageClass.
fn no_secrets(secrets: &[Kv]) -> Result<(), BackendError> {
    Params::new("secret", secrets)?.check_known(KNOWN, ParamSource::Secret)
}

impl Plugin for Paths {
    fn info() -> PluginInfo {
        PluginInfo::new(
            "paths",
            "0.1.0",
            "Test fixture: stages a tmpfs and touches a path in the staging, cache, \
             runtime and target directories, for the symlink tests; needs the fstype \
             tmpfs granted.",
        )
        .with_parameters([ParamDoc::new(
            SUB_PATH,
            ParamKind::Text,
            format!("Path inside the staging directory that publish binds (default {SUB_PATH_DEFAULT})."),
        )
        .with_default_value(SUB_PATH_DEFAULT.to_string())])
        .with_fstypes(["tmpfs"])
    }

    fn validate(req: ValidateRequest) -> Result<(), BackendError> {
        sub_path(&req.parameters, ParamSource::Parameter)?;
        no_secrets(&req.secrets)
    }

    fn stage(req: StageRequest) -> Result<Plan, BackendError> {
        sub_path(&req.context, ParamSource::Context)?;
        no_secrets(&req.secrets)?;
        let tmpfs = Mount::new("tmpfs", MountSource::Named("tmpfs".into()), staging(""))
            .with_options([arg("size=4m"), arg("mode=0755")]);
        Ok(Plan::new([
            Step::Mount(tmpfs),
            Step::Mkdir(staging(SUB_PATH_DEFAULT)),
            Step::Mkdir(cache(CACHE_DIR)),
            Step::Mkdir(runtime(RUNTIME_DIR)),
        ]))
    }

    fn publish(req: PublishRequest) -> Result<Plan, BackendError> {
        let sub = sub_path(&req.context, ParamSource::Context)?;
        no_secrets(&req.secrets)?;
        let readonly = req.readonly || is_read_only(req.capability.access_mode);
        Ok(Plan::new([
            Step::Mkdir(target("")),
            Step::Bind(Bind::new(staging(&sub), target("")).with_readonly(readonly)),
        ]))
    }

    fn unstage(_req: UnstageRequest) -> Result<Plan, BackendError> {
        Ok(Plan::new([Step::Remove(cache(CACHE_DIR)), Step::Remove(runtime(RUNTIME_DIR))]))
    }
}

export_plugin!(Paths);

#[cfg(test)]
mod tests {
    use super::*;

    fn capability(access_mode: AccessMode) -> VolumeCapability {
        VolumeCapability::new(access_mode)
    }

    fn publish_req(context: Vec<Kv>, readonly: bool, access_mode: AccessMode) -> PublishRequest {
        PublishRequest::default()
            .with_volume_id("v")
            .with_context(context)
            .with_capability(capability(access_mode))
            .with_readonly(readonly)
    }

    #[test]
    fn stage_touches_the_staging_cache_and_runtime_directories() {
        let req = StageRequest::default().with_volume_id("v").with_node_id("node-1");
        let plan = Paths::stage(req).unwrap();
        let [Step::Mount(m), rest @ ..] = &plan.steps[..] else { panic!("{plan:?}") };
        assert_eq!((m.fstype.as_str(), &m.target), ("tmpfs", &staging("")));
        assert_eq!(
            rest,
            [Step::Mkdir(staging("data/sub")), Step::Mkdir(cache("c/d")), Step::Mkdir(runtime("r"))].as_slice()
        );
    }

    #[test]
    fn publish_binds_the_sub_path_and_unstage_removes_what_stage_made() {
        let plan = Paths::publish(publish_req(Vec::new(), false, AccessMode::SingleNodeWriter)).unwrap();
        let bind = |source: &str, readonly| Step::Bind(Bind::new(staging(source), target("")).with_readonly(readonly));
        assert_eq!(plan.steps, vec![Step::Mkdir(target("")), bind("data/sub", false)]);
        let plan = Paths::publish(publish_req(vec![kv(SUB_PATH, "data")], true, AccessMode::SingleNodeWriter)).unwrap();
        assert_eq!(plan.steps[1], bind("data", true));
        let plan = Paths::publish(publish_req(Vec::new(), false, AccessMode::MultiNodeReaderOnly)).unwrap();
        assert_eq!(plan.steps[1], bind("data/sub", true));
        assert!(Paths::publish(publish_req(vec![kv("other", "x")], false, AccessMode::SingleNodeWriter)).is_err());
        let plan = Paths::unstage(UnstageRequest::default().with_volume_id("v"));
        assert_eq!(plan.unwrap().steps, vec![Step::Remove(cache("c/d")), Step::Remove(runtime("r"))]);
    }
}
