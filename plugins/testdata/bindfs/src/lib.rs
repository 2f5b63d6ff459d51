//! Test fixture: a plugin whose volumes are served by a real FUSE process, `bindfs`, mirroring
//! a directory of the volume's node cache at the staging path. Cheap (a few MiB per process,
//! no network, no backend), so chaos tests and benchmarks can spawn, kill and re-adopt dozens of
//! real FUSE processes without SeaweedFS.
//!
//! - `stage` plans two steps: a `mkdir` of `data` in the volume's cache directory, then a
//!   `spawn-fuse` of `bindfs -f <cache>/data <staging>` that is ready when a mount of fstype
//!   `fuse` appears at the staging directory (within 10 s), in a cgroup limited to
//!   `memoryLimitMiB` when given;
//! - `publish` is the SDK's bind of the staging directory onto the target (read-only when asked);
//! - `provision` names the volume after the request and plans nothing (the host prefixes
//!   `bindfs~`); `delete` plans nothing.
//!
//! The data lives in the host's cache directory of the volume, so it is gone after the
//! unstage. Its parameters are `memoryLimitMiB` (16 to 4096, no limit by default) and `env`
//! (`NAME=VALUE` items separated by `;`, set as literals in bindfs's environment, so tests can
//! show what the host's policy lets through). Any other parameter, and any secret, is refused. The host grants nothing by default: run it with
//! `--program bindfs=/usr/bin/bindfs --grant bindfs:program=bindfs --grant bindfs:fstype=fuse`.

use mounthost_plugin_sdk::params::invalid;
use mounthost_plugin_sdk::*;

/// The plugin, as exported to the host (public so native builds of the crate, which export
/// nothing, still use it).
pub struct Bindfs;

/// The program name the host maps to its `bindfs` binary.
pub const PROGRAM: &str = "bindfs";
/// The fstype `bindfs` shows in mountinfo (libfuse without a subtype).
pub const FSTYPE: &str = "fuse";
/// The mirrored directory, inside the volume's cache directory.
pub const DATA: &str = "data";
/// How long the host waits for the mount, in milliseconds.
pub const READY_TIMEOUT_MS: u32 = 10_000;

/// The one parameter.
const MEMORY: &str = "memoryLimitMiB";
/// Its bounds, in MiB (the host refuses limits below 16 MiB).
const MEMORY_MIN: u64 = 16;
const MEMORY_MAX: u64 = 4096;
/// Longest plugin part of a volume id (WIT `provision-plan.volume-id`).
const MAX_VOLUME_ID: usize = 100;

/// The environment parameter.
const ENV: &str = "env";

/// Every documented key with where it may come from, for `check_known`.
const KNOWN: [(&str, ParamSource); 2] = [(MEMORY, ParamSource::Parameter), (ENV, ParamSource::Parameter)];

/// Check a parameter list (StorageClass parameters, or a volume context) and read
/// `memoryLimitMiB`.
fn memory(kvs: &[Kv], source: ParamSource) -> Result<Option<u64>, BackendError> {
    let params = Params::new("parameter", kvs)?;
    params.check_known(KNOWN, source)?;
    params.integer(MEMORY, MEMORY_MIN, MEMORY_MAX)
}

/// The `env` parameter of a parameter list: its `NAME=VALUE` items, in order.
fn env(kvs: &[Kv]) -> Result<Vec<EnvVar>, BackendError> {
    let params = Params::new("parameter", kvs)?;
    let Some(text) = params.text(ENV)? else { return Ok(Vec::new()) };
    text.split(';')
        .map(|item| match item.split_once('=') {
            Some((name, value)) => Ok(EnvVar::new(name, literal(value))),
            None => Err(invalid(format!("env item {item:?} is not NAME=VALUE"))),
        })
        .collect()
}

/// This plugin reads no secret: any is a mistake in the StorageClass.
fn no_secrets(secrets: &[Kv]) -> Result<(), BackendError> {
    Params::new("secret", secrets)?.check_known(KNOWN, ParamSource::Secret)
}

impl Plugin for Bindfs {
    fn info() -> PluginInfo {
        PluginInfo::new(
            "bindfs",
            "0.1.0",
            "Test fixture: stages a bindfs FUSE mirror of a directory in the volume's \
             node cache at the staging path. For chaos tests and benchmarks; needs the \
             program bindfs and the fstype fuse granted.",
        )
        .with_parameters([
            ParamDoc::new(
                MEMORY,
                ParamKind::Integer,
                format!("Memory limit of the bindfs process's cgroup in MiB, {MEMORY_MIN} to {MEMORY_MAX}."),
            ),
            ParamDoc::new(
                ENV,
                ParamKind::Text,
                "Environment of the bindfs process: NAME=VALUE items separated by ';' (for tests of the host's policy).",
            ),
        ])
        .with_programs([PROGRAM])
        .with_fstypes([FSTYPE])
    }

    fn validate(req: ValidateRequest) -> Result<(), BackendError> {
        memory(&req.parameters, ParamSource::Parameter)?;
        no_secrets(&req.secrets)
    }

    fn provision(req: ProvisionRequest) -> Result<ProvisionPlan, BackendError> {
        let memory = memory(&req.parameters, ParamSource::Parameter)?;
        no_secrets(&req.secrets)?;
        let printable = req.name.bytes().all(|b| b.is_ascii_graphic());
        if req.name.is_empty() || req.name.len() > MAX_VOLUME_ID || !printable {
            return Err(invalid(format!(
                "volume name {:?} must be 1 to {MAX_VOLUME_ID} printable ASCII characters \
                 without spaces",
                req.name
            )));
        }
        let mut context: Vec<Kv> = memory.map(|n| vec![kv(MEMORY, n.to_string())]).unwrap_or_default();
        context.extend(req.parameters.iter().filter(|p| p.key == ENV).cloned());
        Ok(ProvisionPlan::new(req.name, req.required_bytes).with_context(context))
    }

    fn delete(_req: DeleteRequest) -> Result<Plan, BackendError> {
        Ok(Plan::default())
    }

    fn stage(req: StageRequest) -> Result<Plan, BackendError> {
        let memory = memory(&req.context, ParamSource::Context)?;
        let env = env(&req.context)?;
        no_secrets(&req.secrets)?;
        // `-f`: stay in the foreground, so the host supervises the FUSE server itself.
        let args = [arg("-f"), path_arg("", cache(DATA)), path_arg("", staging(""))];
        let spawn = SpawnFuse::new(PROGRAM, args, staging(""), FSTYPE)
            .with_env(env)
            .with_ready_timeout_ms(READY_TIMEOUT_MS)
            .with_memory_limit_bytes(memory.map(|mib| mib << 20));
        // bindfs refuses a source directory that does not exist.
        Ok(Plan::new([Step::Mkdir(cache(DATA)), Step::SpawnFuse(spawn)]))
    }
}

export_plugin!(Bindfs);

#[cfg(test)]
mod tests {
    use super::*;

    fn stage_req(context: Vec<Kv>) -> StageRequest {
        StageRequest::default().with_volume_id("v").with_context(context).with_node_id("node-1")
    }

    fn spawn(plan: &Plan) -> SpawnFuse {
        match &plan.steps[..] {
            [Step::Mkdir(dir), Step::SpawnFuse(s)] => {
                assert_eq!(dir, &cache(DATA), "the mirrored directory is made first");
                s.clone()
            }
            other => panic!("expected mkdir then spawn-fuse, got {other:?}"),
        }
    }

    #[test]
    fn stage_spawns_bindfs_from_the_cache_onto_the_staging_dir() {
        let s = spawn(&Bindfs::stage(stage_req(Vec::new())).unwrap());
        assert_eq!((s.program.as_str(), s.fstype.as_str()), ("bindfs", "fuse"));
        assert_eq!(s.args, vec![arg("-f"), path_arg("", cache("data")), path_arg("", staging(""))]);
        assert!(s.env.is_empty());
        assert_eq!(s.mountpoint, staging(""));
        assert_eq!(s.ready_timeout_ms, 10_000);
        assert_eq!(s.memory_limit_bytes, None);
        let s = spawn(&Bindfs::stage(stage_req(vec![kv(MEMORY, "64")])).unwrap());
        assert_eq!(s.memory_limit_bytes, Some(64 << 20));
        // Same request, same plan: the host diffs plans byte for byte.
        assert_eq!(Bindfs::stage(stage_req(Vec::new())).unwrap(), Bindfs::stage(stage_req(Vec::new())).unwrap());
    }

    #[test]
    fn bad_and_unknown_parameters_are_refused() {
        for bad in ["0", "15", "4097", "x", "", "-1"] {
            assert!(Bindfs::stage(stage_req(vec![kv(MEMORY, bad)])).is_err(), "{bad:?}");
        }
        let err = Bindfs::stage(stage_req(vec![kv("memory", "64")])).unwrap_err();
        assert_eq!(err, invalid("unknown parameter \"memory\"; accepted: env, memoryLimitMiB"));
        let s = spawn(&Bindfs::stage(stage_req(vec![kv(ENV, "TZ=UTC;A=b=c")])).unwrap());
        let lit = |n: &str, v: &str| EnvVar::new(n, literal(v));
        assert_eq!(s.env, vec![lit("TZ", "UTC"), lit("A", "b=c")]);
        assert!(Bindfs::stage(stage_req(vec![kv(ENV, "TZ")])).is_err());
        // Orchestrator keys are not the plugin's business.
        assert!(Bindfs::stage(stage_req(vec![kv("csi.storage.k8s.io/pod.name", "p")])).is_ok());
        let mut req = stage_req(Vec::new());
        req.secrets = vec![kv("token", "t")];
        assert!(Bindfs::stage(req).is_err());
    }

    #[test]
    fn provision_names_the_volume_after_the_request() {
        let req =
            |name: &str, parameters: Vec<Kv>| ProvisionRequest::default().with_name(name).with_parameters(parameters);
        let out = Bindfs::provision(req("pvc-1", vec![kv(MEMORY, "32")])).unwrap();
        assert_eq!(out.volume_id, "pvc-1");
        assert_eq!(out.context, vec![kv(MEMORY, "32")]);
        assert!(out.steps.is_empty());
        assert!(Bindfs::provision(req("pvc-1", Vec::new())).unwrap().context.is_empty());
        assert!(Bindfs::provision(req("a b", Vec::new())).is_err());
        assert!(Bindfs::provision(req("pvc-1", vec![kv("nope", "1")])).is_err());
        assert_eq!(Bindfs::delete(DeleteRequest::default().with_volume_id("pvc-1")).unwrap(), Plan::default());
    }
}
