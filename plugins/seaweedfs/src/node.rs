//! The node side: the `weed mount` invocation NodeStageVolume runs.
//!
//! CSI NodeStageVolume mounts the volume once per node at the staging path; publish then
//! bind-mounts it into each pod (the SDK's default `publish`). The stage plan is one
//! `spawn-fuse` step. Plans are diffed against what the node already has, so the same request
//! must give a byte-identical plan: every flag has one fixed place in the argument list.
//! Node paths are never spelled out here, only path references the host resolves; secrets
//! reach `weed` through its environment as references, never through argv.

use mounthost_plugin_sdk::params::invalid;
use mounthost_plugin_sdk::{
    Arg, BackendError, ParamSource, Plan, SpawnFuse, StageRequest, Step, arg, cache, is_read_only, kv, path_arg,
    runtime, staging,
};

use crate::mount_options;
use crate::params::{self, Settings};
use crate::values;
use crate::volumes;

/// The program name the host maps to its `weed` binary.
pub const PROGRAM: &str = "weed";
/// The fstype `weed mount` shows in mountinfo.
pub const FSTYPE: &str = "fuse.seaweedfs";

/// Plan NodeStageVolume.
pub fn stage(req: &StageRequest) -> Result<Plan, BackendError> {
    let ctx = params::open(&req.context, ParamSource::Context)?;
    let settings = Settings::parse(&ctx)?;
    let env = params::secret_env(&req.secrets)?;
    let caps = mount_options::check_capability(&req.capability)?;
    let read_only = settings.read_only || caps.read_only || is_read_only(req.capability.access_mode);
    let options = mount_options::merge(settings.mount_options.clone(), caps.options)?;

    let path = settings.path.ok_or_else(|| {
        invalid(
            "parameter \"path\" is missing from the volume context: a provisioned volume gets it \
             from CreateVolume, a static PersistentVolume must set volumeAttributes.path to the \
             remote directory to mount (such as /buckets/data)",
        )
    })?;
    // A static volume under /buckets must name a bucket SeaweedFS takes. A volume this plugin
    // provisioned (its id is `<filers><path>`) is exempt: its directory exists, and one made by
    // an earlier version from a name like `Data` must keep mounting. (The host has been seen to
    // pass the whole CSI id, `seaweedfs~<filers><path>`, where the WIT promises our part.)
    let id = req.volume_id.strip_prefix("seaweedfs~").unwrap_or(&req.volume_id);
    let provisioned = id == format!("{}{path}", settings.filer_list());
    if !provisioned {
        values::check_bucket_path(&values::label("path"), path)?;
    }
    let collection = settings.collection_for(path)?;
    // The size: a provisioned volume's capacity record, read first (crate::volumes), unless the
    // StorageClass sets the quota itself.
    let explicit = options.iter().find(|o| o.name == "collectionQuotaMB").and_then(|o| o.value.as_deref());
    let explicit = explicit.and_then(|v| v.parse::<u64>().ok());
    // A provisioned volume's directory is read with it, in the same round: CSI NodeStageVolume
    // "Volume does not exist 5 NOT_FOUND", where `weed mount` would make an empty one.
    let recorded = provisioned.then_some((settings.filers.as_slice(), path));
    let mut reads = volumes::stage_dir(&req.looked_up, recorded)?;
    let quota = match volumes::stage_quota(&req.looked_up, recorded, explicit)? {
        Ok(q) => q,
        Err(lookups) => {
            reads.extend(lookups);
            0
        }
    };
    if !reads.is_empty() {
        return Ok(Plan::new(reads));
    }

    let mut args: Vec<Arg> = vec![
        // A global flag, so it comes before the subcommand: without it weed writes glog files
        // into the node's /tmp that nothing ever removes. The host keeps its stderr per volume.
        arg("-logtostderr"),
        arg("mount"),
        arg(format!("-filer={}", settings.filer_list())),
        arg(format!("-filer.path={path}")),
        path_arg("-dir=", staging("")),
        path_arg("-cacheDir=", cache("")),
        path_arg("-localSocket=", runtime(volumes::MOUNT_SOCKET)),
    ];
    let mut flag = |name: &str, value: Option<String>| {
        if let Some(v) = value {
            args.push(arg(format!("-{name}={v}")));
        }
    };
    flag("collection", collection.clone());
    if explicit.is_none() && quota > 0 {
        flag("collectionQuotaMB", Some(quota.to_string()));
    }
    flag("replication", settings.replication.map(str::to_string));
    flag("disk", settings.disk_type.map(str::to_string));
    flag("dataCenter", settings.data_center.map(str::to_string));
    flag("ttl", settings.ttl_secs.map(|n| n.to_string()));
    flag("chunkSizeLimitMB", settings.chunk_size_limit_mb.map(|n| n.to_string()));
    flag("cacheCapacityMB", settings.effective_cache_capacity_mb().map(|n| n.to_string()));
    flag("cacheMetaTtlSec", settings.cache_meta_ttl_sec.map(|n| n.to_string()));
    flag("concurrentWriters", settings.concurrent_writers.map(|n| n.to_string()));
    flag("concurrentReaders", settings.concurrent_readers.map(|n| n.to_string()));
    flag("volumeServerAccess", settings.volume_server_access.map(str::to_string));
    flag("map.uid", settings.uid_map.clone());
    flag("map.gid", settings.gid_map.clone());
    flag("umask", settings.umask.map(str::to_string));
    // Go's soft limit sits below the cgroup's hard limit, so the GC works harder before the
    // kernel's OOM killer would step in.
    flag("memoryLimitMB", settings.memory_limit_mb.map(|mb| (mb * 9 / 10).to_string()));
    if read_only {
        args.push(arg("-readOnly"));
    }
    args.extend(options.iter().map(|o| arg(o.to_arg())));

    // `weed mount` mounts its filesystem itself (as the host's root): the default
    // `FuseMount::ByProgram`.
    let spawn = SpawnFuse::new(PROGRAM, args, staging(""), FSTYPE)
        .with_env(env)
        // At most 300 s * 1000, well inside u32.
        .with_ready_timeout_ms(u32::try_from(settings.ready_timeout_sec * 1000).unwrap_or(u32::MAX))
        .with_memory_limit_bytes(settings.memory_limit_mb.map(|mb| mb * 1024 * 1024));
    Ok(Plan::new([Step::SpawnFuse(spawn)]).with_attributes([
        kv("filer", settings.filer_list()),
        kv("path", path),
        kv("collection", collection.unwrap_or_default()),
        kv("readOnly", read_only.to_string()),
        kv("quotaMB", quota.to_string()),
        // Set by the StorageClass (`mountOptions`), not by the volume's size: expansion
        // cannot change it (crate::volumes::expand).
        kv("quotaFixed", explicit.is_some().to_string()),
    ]))
}
