//! Test fixture: a plugin written against SDK 1.0.0 (plugins/sdk-releases/v1.0.0) and never
//! changed since. Built twice by host/build.rs: against the current SDK (`sdk1`, which must keep
//! compiling it) and against the frozen 1.0.0 copy (`sdk1-frozen`, a plugin binary of contract
//! 0.4.0 as SDK 1.0.0 made it, which the current host must keep loading); host/tests/sdk_compat.rs
//! plans with both and compares.
//!
//! - `stage` mounts a `tmpfs` of `sizeMiB` (1 to 64, default 8; 13 is refused) at the staging
//!   directory, with `mode=0755`, read-only when `readonly` is `true`;
//! - the required `site` must be an `http://` or `https://` URL: SDK 1.0.0 has no URL kind, so it
//!   is documented as text and checked by hand, as a newcomer's plugin did (and `plugin check`'s
//!   made-up text for it is refused);
//! - `publish` is the SDK's bind; `provision`, `dynamic_mount` and the rest are the SDK's
//!   defaults;
//! - [`every_record`] builds every contract record through SDK 1.0.0's constructors and setters,
//!   so a later SDK that broke one of them would fail to compile this crate.
//!
//! The host grants no fstype by default: run it with `--grant sdk1:fstype=tmpfs`.

use mounthost_plugin_sdk::params::{ParamSpec, invalid, param_docs};
use mounthost_plugin_sdk::*;

/// The plugin, as exported to the host.
pub struct Sdk1;

const SIZE: &str = "sizeMiB";
const READONLY: &str = "readonly";
const SITE: &str = "site";

/// Its parameters, as a `const` table of SDK 1.0.0's `ParamSpec`.
const SPECS: &[ParamSpec] = &[
    ParamSpec::parameter(SIZE, ParamKind::Integer, Some("8"), "Size of the tmpfs in MiB, 1 to 64."),
    ParamSpec::parameter(READONLY, ParamKind::Boolean, Some("false"), "Mount the tmpfs read-only."),
    ParamSpec::parameter(SITE, ParamKind::Text, None, "An http:// or https:// URL (recorded only).").required(),
    ParamSpec::parameter("note", ParamKind::Text, None, "Ignored.").from_source(ParamSource::Context),
    ParamSpec::secret("unused", "Ignored.").with_kind(ParamKind::Text),
];

impl Plugin for Sdk1 {
    fn info() -> PluginInfo {
        PluginInfo::new("sdk1", "1.0.0", "Test fixture written against SDK 1.0.0: a tmpfs at the staging path.")
            .with_parameters(param_docs(SPECS))
            .with_fstypes(["tmpfs"])
    }

    fn validate(req: ValidateRequest) -> Result<(), BackendError> {
        settings(&req.parameters, ParamSource::Parameter).map(|_| ())
    }

    fn stage(req: StageRequest) -> Result<Plan, BackendError> {
        let (size, readonly) = settings(&req.context, ParamSource::Context)?;
        let readonly = readonly || mounthost_plugin_sdk::is_read_only(req.capability.access_mode);
        let tmpfs = Mount::new("tmpfs", MountSource::Named("tmpfs".into()), staging(""))
            .with_options([arg(format!("size={size}m")), arg("mode=0755")])
            .with_readonly(readonly);
        let mode = match req.capability.access_mode {
            AccessMode::SingleNodeWriter => "single-node-writer",
            AccessMode::MultiNodeReaderOnly => "multi-node-reader-only",
            _ => "other",
        };
        Ok(Plan::new([Step::Mount(tmpfs)]).with_attributes([kv("accessMode", mode)]))
    }
}

/// `sizeMiB` and `readonly` from a parameter list, other keys refused.
fn settings(kvs: &[Kv], source: ParamSource) -> Result<(u64, bool), BackendError> {
    let params = Params::new("parameter", kvs)?;
    params.check_known(mounthost_plugin_sdk::params::known(SPECS), source)?;
    let size = params.integer(SIZE, 1, 64)?.unwrap_or(8);
    let readonly = params.boolean(READONLY)?.unwrap_or(false);
    let site = params.required(SITE)?;
    if !(site.starts_with("http://") || site.starts_with("https://")) {
        return Err(invalid(format!("parameter {SITE:?} must be an http:// or https:// URL, not {site:?}")));
    }
    if size == 13 {
        return Err(invalid("sizeMiB 13 is unlucky"));
    }
    Ok((size, readonly))
}

/// One of every contract record and case, built as SDK 1.0.0 documents (constructors, `with_*`
/// setters, `Default` requests, the path and argument helpers); never planned.
pub fn every_record() -> (Vec<Step>, Vec<String>) {
    let env = [
        EnvVar::new("A", literal("1")),
        EnvVar::new("B", secret_template("Bearer ", "token", "")),
        EnvVar::new("C", path_value(cache("x"))),
        EnvVar::new("D", secret_file_value("key")),
        EnvVar::new("E", Value::SecretTemplate(SecretTemplate::new("k").with_prefix("p").with_suffix("s"))),
    ];
    let args = vec![
        arg("-f"),
        path_arg("--cache=", cache("")),
        path_arg_with_suffix("-o", runtime("s"), ",x"),
        secret_file_arg("-oIdentityFile=", "key", ""),
        fuse_fd_arg("", ""),
        Arg::Path(PathArg::new(staging("p")).with_prefix("a").with_suffix("b")),
        Arg::SecretFile(SecretFileArg::new("k").with_prefix("a").with_suffix("b")),
        Arg::FuseFd(FuseFdArg::new().with_prefix("a").with_suffix("b")),
    ];
    let spawn = SpawnFuse::new("prog", args, staging(""), "fuse.prog")
        .with_env(env)
        .with_ready_timeout_ms(5_000)
        .with_memory_limit_bytes(64u64 << 20)
        .with_mount(FuseMount::HostFd(HostFdMount::new("src").with_options(["noatime"]).with_readonly(true)));
    let spawn2 = SpawnFuse::new("prog", [arg("x")], staging(""), "fuse.prog").with_mount(host_fd("s", &[], false));
    let headers = vec![Header::new("Authorization", secret("token"))];
    let steps = vec![
        Step::Mkdir(staging("d")),
        Step::Remove(cache("d")),
        Step::SpawnFuse(spawn),
        Step::SpawnFuse(spawn2),
        Step::Mount(Mount::new("tmpfs", MountSource::Path(cache("m")), target("")).with_readonly(true)),
        Step::Bind(Bind::new(staging(""), target("")).with_readonly(true).with_options(["nosuid"])),
        Step::Fetch(Fetch::new("https://h/x", format!("sha256:{}", "a".repeat(64)), 1).with_headers(headers.clone())),
        Step::Resolve(
            Resolve::new("r.io/m:1")
                .with_mirror("m.io".to_string())
                .with_auth(RegistryAuth::Basic(BasicAuth::new("u", "p")))
                .with_insecure(false),
        ),
        Step::FetchBlob(FetchBlob::new(format!("sha256:{}", "b".repeat(64)), 2, "application/octet-stream")),
        Step::Unpack(Unpack::new(format!("sha256:{}", "b".repeat(64)), Archive::TarGzip, cache("u"))),
        Step::Http(HttpCall::new("PUT", ["http://h:1/x"], [200, 201]).with_headers(headers.clone()).with_body(vec![1])),
        Step::Socket(target("csi.sock")),
        Step::Lookup(Lookup::new("k", "GET", ["http://h:1/y"]).with_headers(headers)),
        Step::SocketCall(SocketCall::new(runtime("s.sock"), "/p.S/M", vec![0]).with_timeout_ms(1_000)),
    ];
    let requests = vec![
        format!(
            "{:?}",
            ValidateRequest::default().with_parameters([kv("a", "1")]).with_capabilities([VolumeCapability::default()])
        ),
        format!(
            "{:?}",
            ProvisionRequest::default()
                .with_name("n")
                .with_required_bytes(1)
                .with_limit_bytes(2)
                .with_looked_up([LookedUp::new("k", 200, b"{}".to_vec()).with_truncated(true)])
        ),
        format!("{:?}", DeleteRequest::default().with_volume_id("v").with_secrets([kv("s", "1")])),
        format!(
            "{:?}",
            StageRequest::default()
                .with_volume_id("v")
                .with_capability(
                    VolumeCapability::new(AccessMode::MultiNodeReaderOnly)
                        .with_fs_type("ext4")
                        .with_mount_flags(["ro"])
                )
                .with_ephemeral(true)
                .with_resolved(Resolved::new("r", "d", "{}", "{}").with_config("{}"))
                .with_node_id("n")
        ),
        format!("{:?}", PublishRequest::default().with_readonly(true).with_recorded([kv("r", "1")])),
        format!("{:?}", UnstageRequest::default().with_context([kv("c", "1")])),
        format!("{:?}", DynamicMountRequest::default().with_request([kv("q", "1")]).with_subdir("s")),
        format!(
            "{:?}",
            ExpandRequest::default().with_side(ExpandSide::Node).with_capability(VolumeCapability::default())
        ),
        format!("{:?}", CapacityRequest::default().with_parameters([kv("a", "1")])),
        format!("{:?}", ListRequest::default().with_hosts(["h:1"]).with_max_entries(10).with_starting_token("t")),
        format!("{:?}", DescribeRequest::default().with_volume_id("v")),
        format!("{:?}", ProvisionPlan::new("v", 1).with_context([kv("c", "1")]).with_steps([Step::Mkdir(cache(""))])),
        format!("{:?}", ExpandPlan::new(1).with_node_expansion_required(true)),
        format!("{:?}", CapacityAnswer::default().with_available_bytes(1).with_maximum_volume_bytes(2)),
        format!("{:?}", ListAnswer::new([ListedVolume::new("v", 1).with_context([kv("c", "1")])]).with_next_token("t")),
        format!("{:?}", DescribeAnswer::new(Existence::Exists).with_steps([])),
        format!(
            "{:?}",
            ParamDoc::new("p", ParamKind::Endpoint, "d").with_source(ParamSource::Secret).with_required(true)
        ),
    ];
    (steps, requests)
}

export_plugin!(Sdk1);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_plans_a_sized_tmpfs_and_every_record_builds() {
        let site = kv(SITE, "https://files.example/");
        let req = StageRequest::default().with_volume_id("v").with_context([
            kv(SIZE, "4"),
            kv(READONLY, "true"),
            site.clone(),
        ]);
        let plan = Sdk1::stage(req).unwrap();
        let [Step::Mount(m)] = &plan.steps[..] else { panic!("{plan:?}") };
        assert_eq!(m.options, vec![arg("size=4m"), arg("mode=0755")]);
        assert!(m.readonly);
        assert!(Sdk1::stage(StageRequest::default().with_context([kv(SIZE, "13"), site.clone()])).is_err());
        assert!(Sdk1::stage(StageRequest::default().with_context([kv(SITE, "example")])).is_err());
        let (steps, requests) = every_record();
        assert_eq!((steps.len(), requests.len()), (14, 17));
    }
}
