//! Test fixture: a plugin that stages a `tmpfs` at the staging path. No process, no network, no
//! backend, so benchmarks and restart tests can measure mounthost itself without SeaweedFS.
//!
//! - `stage` plans one `mount` step: fstype `tmpfs`, source `tmpfs`, at the staging directory
//!   itself, options `size=<sizeMiB>m` and `mode=0755`;
//! - `publish` is the SDK's bind of the staging directory onto the target (read-only when asked);
//! - `provision` names the volume after the request and plans nothing (the host prefixes
//!   `tmpfs~`); its capacity is the tmpfs's size, so a `required_bytes` above it is
//!   `out-of-range` (and the host answers a `limit_bytes` below it with OUT_OF_RANGE); `delete`
//!   plans nothing.
//!
//! Its only parameter is `sizeMiB` (1 to 1024, default 16). Any other parameter, and any
//! secret, is refused. The host grants no fstype by default: run it with
//! `--grant tmpfs:fstype=tmpfs`.

use mounthost_plugin_sdk::params::invalid;
use mounthost_plugin_sdk::*;

/// The plugin, as exported to the host (public so native builds of the crate, which export
/// nothing, still use it).
pub struct Tmpfs;

/// The one parameter.
const SIZE: &str = "sizeMiB";
/// Its bounds and default, in MiB.
const SIZE_MIN: u64 = 1;
const SIZE_MAX: u64 = 1024;
const SIZE_DEFAULT: u64 = 16;
/// Longest plugin part of a volume id (WIT `provision-plan.volume-id`).
const MAX_VOLUME_ID: usize = 100;

/// Every documented key with where it may come from, for `check_known`.
const KNOWN: [(&str, ParamSource); 1] = [(SIZE, ParamSource::Parameter)];

/// Check a parameter list (StorageClass parameters, or a volume context) and read `sizeMiB`.
fn size(kvs: &[Kv], source: ParamSource) -> Result<Option<u64>, BackendError> {
    let params = Params::new("parameter", kvs)?;
    params.check_known(KNOWN, source)?;
    params.integer(SIZE, SIZE_MIN, SIZE_MAX)
}

/// This plugin reads no secret: any is a mistake in the StorageClass.
fn no_secrets(secrets: &[Kv]) -> Result<(), BackendError> {
    Params::new("secret", secrets)?.check_known(KNOWN, ParamSource::Secret)
}

impl Plugin for Tmpfs {
    fn info() -> PluginInfo {
        PluginInfo::new(
            "tmpfs",
            "0.1.0",
            "Test fixture: stages an empty tmpfs of sizeMiB at the staging path. \
             For benchmarks and restart tests; needs the fstype tmpfs granted.",
        )
        .with_parameters([ParamDoc::new(
            SIZE,
            ParamKind::Integer,
            format!("Size of the tmpfs in MiB, {SIZE_MIN} to {SIZE_MAX} (mount option size=<n>m)."),
        )
        .with_default_value(SIZE_DEFAULT.to_string())])
        .with_fstypes(["tmpfs"])
    }

    fn validate(req: ValidateRequest) -> Result<(), BackendError> {
        size(&req.parameters, ParamSource::Parameter)?;
        no_secrets(&req.secrets)
    }

    fn provision(req: ProvisionRequest) -> Result<ProvisionPlan, BackendError> {
        let size = size(&req.parameters, ParamSource::Parameter)?;
        no_secrets(&req.secrets)?;
        let printable = req.name.bytes().all(|b| b.is_ascii_graphic());
        if req.name.is_empty() || req.name.len() > MAX_VOLUME_ID || !printable {
            return Err(invalid(format!(
                "volume name {:?} must be 1 to {MAX_VOLUME_ID} printable ASCII characters \
                 without spaces",
                req.name
            )));
        }
        // The volume is a tmpfs of exactly this size.
        let capacity = size.unwrap_or(SIZE_DEFAULT) << 20;
        if req.required_bytes > capacity {
            return Err(BackendError::OutOfRange(format!(
                "required_bytes {} is more than the volume's size, {capacity} bytes (parameter {SIZE} {}); \
                 ask for at most that, or set a larger {SIZE} (up to {SIZE_MAX})",
                req.required_bytes,
                capacity >> 20
            )));
        }
        let context = size.map(|n| vec![kv(SIZE, n.to_string())]).unwrap_or_default();
        Ok(ProvisionPlan::new(req.name, capacity).with_context(context))
    }

    fn delete(_req: DeleteRequest) -> Result<Plan, BackendError> {
        Ok(Plan::default())
    }

    fn stage(req: StageRequest) -> Result<Plan, BackendError> {
        let size = size(&req.context, ParamSource::Context)?.unwrap_or(SIZE_DEFAULT);
        no_secrets(&req.secrets)?;
        let options = [arg(format!("size={size}m")), arg("mode=0755")];
        let tmpfs = Mount::new("tmpfs", MountSource::Named("tmpfs".into()), staging("")).with_options(options);
        Ok(Plan::new([Step::Mount(tmpfs)]))
    }
}

export_plugin!(Tmpfs);

#[cfg(test)]
mod tests {
    use super::*;

    fn stage_req(context: Vec<Kv>) -> StageRequest {
        StageRequest::default().with_volume_id("v").with_context(context).with_node_id("node-1")
    }

    fn options(plan: &Plan) -> Vec<Arg> {
        match &plan.steps[..] {
            [Step::Mount(m)] => m.options.clone(),
            other => panic!("expected one mount step, got {other:?}"),
        }
    }

    #[test]
    fn stage_mounts_a_sized_tmpfs_at_the_staging_dir() {
        let plan = Tmpfs::stage(stage_req(Vec::new())).unwrap();
        let Step::Mount(m) = &plan.steps[0] else { panic!("not a mount") };
        assert_eq!((m.fstype.as_str(), &m.source), ("tmpfs", &MountSource::Named("tmpfs".into())));
        assert_eq!(m.target, staging(""));
        assert!(!m.readonly);
        assert_eq!(options(&plan), vec![arg("size=16m"), arg("mode=0755")]);
        let plan = Tmpfs::stage(stage_req(vec![kv(SIZE, "1024")])).unwrap();
        assert_eq!(options(&plan), vec![arg("size=1024m"), arg("mode=0755")]);
    }

    #[test]
    fn bad_and_unknown_parameters_are_refused() {
        for bad in ["0", "1025", "x", "", "-1"] {
            assert!(Tmpfs::stage(stage_req(vec![kv(SIZE, bad)])).is_err(), "{bad:?}");
        }
        let err = Tmpfs::stage(stage_req(vec![kv("size", "1")])).unwrap_err();
        assert_eq!(err, invalid("unknown parameter \"size\"; accepted: sizeMiB"));
        // Orchestrator keys are not the plugin's business.
        assert!(Tmpfs::stage(stage_req(vec![kv("csi.storage.k8s.io/pod.name", "p")])).is_ok());
        let mut req = stage_req(Vec::new());
        req.secrets = vec![kv("token", "t")];
        assert!(Tmpfs::stage(req).is_err());
    }

    #[test]
    fn provision_names_the_volume_after_the_request() {
        let req =
            |name: &str, parameters: Vec<Kv>| ProvisionRequest::default().with_name(name).with_parameters(parameters);
        let out = Tmpfs::provision(req("pvc-1", vec![kv(SIZE, "8")])).unwrap();
        assert_eq!(out.volume_id, "pvc-1");
        assert_eq!(out.context, vec![kv(SIZE, "8")]);
        assert!(out.steps.is_empty());
        assert!(Tmpfs::provision(req("pvc-1", Vec::new())).unwrap().context.is_empty());
        assert!(Tmpfs::provision(req("a b", Vec::new())).is_err());
        assert!(Tmpfs::provision(req("pvc-1", vec![kv("nope", "1")])).is_err());
        // Its capacity is the tmpfs's size; more than that cannot be given.
        assert_eq!(out.capacity_bytes, 8 << 20);
        assert_eq!(Tmpfs::provision(req("pvc-1", Vec::new())).unwrap().capacity_bytes, SIZE_DEFAULT << 20);
        let sized = |required: u64| req("pvc-1", vec![kv(SIZE, "8")]).with_required_bytes(required);
        assert_eq!(Tmpfs::provision(sized(8 << 20)).unwrap().capacity_bytes, 8 << 20);
        assert!(
            matches!(Tmpfs::provision(sized((8 << 20) + 1)), Err(BackendError::OutOfRange(m)) if m.contains("sizeMiB"))
        );
        assert_eq!(Tmpfs::delete(DeleteRequest::default().with_volume_id("pvc-1")).unwrap(), Plan::default());
    }
}
