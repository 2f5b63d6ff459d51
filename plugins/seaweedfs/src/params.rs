//! The parameter table and the typed, validated settings read from it.
//!
//! One table, [`SPECS`], lists every StorageClass parameter, volume-context key and secret the
//! plugin reads. `info()` documents exactly that table and the unknown-key checks accept exactly
//! that table, so the documentation and the behaviour cannot drift apart. [`Settings::parse`]
//! turns a parameter list (StorageClass parameters at provisioning, the volume context at node
//! stage) into typed values; every refusal is `invalid-argument` and names the parameter and
//! what would be accepted, because the person reading it is writing a StorageClass.

use mounthost_plugin_sdk::params::{ParamSpec, invalid, known};
use mounthost_plugin_sdk::{BackendError, EnvVar, Kv, ParamKind, ParamSource, Params, Value};

use crate::mount_options::{self, MountOption};
use crate::values::{
    check_collection, check_remote_path, check_replication, check_token, check_umask, label, parse_filers,
    parse_id_map, parse_ttl,
};

/// Every key the plugin reads, in the order `info()` lists them.
pub const SPECS: &[ParamSpec] = &[
    ParamSpec::parameter(
        "filer",
        ParamKind::Endpoint,
        None,
        "Filer address(es), comma-separated host:port (DNS name, IPv4 or [IPv6]); -filer=.",
    )
    .required(),
    ParamSpec::parameter(
        "path",
        ParamKind::RemotePath,
        None,
        "Remote directory to mount (-filer.path=): set by provisioning, or in a static PV's \
         volumeAttributes; absolute, no empty, . or .. components.",
    )
    .from_source(ParamSource::Context),
    ParamSpec::parameter(
        "master",
        ParamKind::Endpoint,
        None,
        "A master's HTTP address, host:port, for GetCapacity (its free volume slots); without it \
         the capacity is unknown.",
    ),
    ParamSpec::parameter(
        "masterVolumeSizeLimitMB",
        ParamKind::Integer,
        Some("30000"),
        "The master's -volumeSizeLimitMB, 1 to 1048576: GetCapacity counts each free volume slot \
         as this much (SeaweedFS's HTTP API does not report it).",
    ),
    ParamSpec::parameter(
        "parentDir",
        ParamKind::RemotePath,
        Some("/buckets"),
        "Remote directory under which provisioning creates one directory per volume.",
    ),
    ParamSpec::parameter(
        "collection",
        ParamKind::Text,
        None,
        "SeaweedFS collection for new files (-collection=); [A-Za-z0-9_.-], at most 64; \
         default: the last component of path.",
    ),
    ParamSpec::parameter(
        "replication",
        ParamKind::Text,
        None,
        "Replica placement for new files, three digits such as 000 or 001 (-replication=); \
         default: the filer decides.",
    ),
    ParamSpec::parameter(
        "diskType",
        ParamKind::Text,
        None,
        "Disk type for new files: hdd, ssd or a tag [A-Za-z0-9_-], at most 64 (-disk=).",
    ),
    ParamSpec::parameter(
        "dataCenter",
        ParamKind::Text,
        None,
        "Data center to prefer for writes, [A-Za-z0-9_.-], at most 64 (-dataCenter=).",
    ),
    ParamSpec::parameter(
        "ttl",
        ParamKind::Text,
        None,
        "Time to live of new files: whole seconds, or a number with suffix s, m, h, d or w; \
         passed as seconds (-ttl=).",
    ),
    ParamSpec::parameter(
        "chunkSizeLimitMB",
        ParamKind::Integer,
        Some("2"),
        "Write buffer and chunk size in MiB, 1 to 1024 (-chunkSizeLimitMB=); default weed's.",
    ),
    ParamSpec::parameter(
        "cacheCapacityMB",
        ParamKind::Integer,
        Some("128"),
        "Chunk read cache on the node in MiB, 0 to 1048576 (-cacheCapacityMB=); default weed's.",
    ),
    ParamSpec::parameter(
        "cacheMetaTtlSec",
        ParamKind::Integer,
        Some("60"),
        "Metadata cache validity in seconds, 0 to 86400 (-cacheMetaTtlSec=); default weed's.",
    ),
    ParamSpec::parameter(
        "concurrentWriters",
        ParamKind::Integer,
        Some("128"),
        "Concurrent chunk uploads, 1 to 1024 (-concurrentWriters=); default weed's.",
    ),
    ParamSpec::parameter(
        "concurrentReaders",
        ParamKind::Integer,
        Some("128"),
        "Concurrent chunk fetches, 1 to 1024 (-concurrentReaders=); default weed's.",
    ),
    ParamSpec::parameter(
        "volumeServerAccess",
        ParamKind::Choice,
        Some("direct"),
        "How to reach volume servers: direct, publicUrl or filerProxy (-volumeServerAccess=).",
    ),
    ParamSpec::parameter(
        "uidMap",
        ParamKind::CommaList,
        None,
        "Map local uids to filer uids, local:filer[,local:filer...] (-map.uid=).",
    ),
    ParamSpec::parameter(
        "gidMap",
        ParamKind::CommaList,
        None,
        "Map local gids to filer gids, local:filer[,local:filer...] (-map.gid=).",
    ),
    ParamSpec::parameter("umask", ParamKind::Text, Some("022"), "Octal umask for new files, 3 or 4 digits (-umask=)."),
    ParamSpec::parameter(
        "readOnly",
        ParamKind::Boolean,
        Some("false"),
        "Mount read-only (-readOnly); also implied by a read-only access mode or the ro mount flag.",
    ),
    ParamSpec::parameter(
        "cacheDir",
        ParamKind::Choice,
        Some("volume"),
        "Chunk cache policy: volume (the per-volume node cache directory, removed at unstage) \
         or disabled (-cacheCapacityMB=0; metadata still kept there).",
    ),
    ParamSpec::parameter(
        "memoryLimitMB",
        ParamKind::Integer,
        None,
        "Memory limit of the weed process's cgroup in MiB, 16 to 1048576; weed gets \
         -memoryLimitMB= at 90% of it as its Go soft limit.",
    ),
    ParamSpec::parameter(
        "readyTimeoutSec",
        ParamKind::Integer,
        Some("30"),
        "Seconds to wait for the FUSE mount to appear, 1 to 300.",
    ),
    ParamSpec::parameter(
        "mountOptions",
        ParamKind::CommaList,
        None,
        "Extra weed mount flags, comma-separated name or name=value, from an allowlist of \
         flags that name no node path and open no port (see the plugin docs).",
    ),
    ParamSpec::secret(
        "jwtSigningKey",
        "security.toml jwt.signing.key (volume server writes); given to weed as WEED_JWT_SIGNING_KEY.",
    ),
    ParamSpec::secret(
        "jwtSigningReadKey",
        "security.toml jwt.signing.read.key (volume server reads); given as WEED_JWT_SIGNING_READ_KEY.",
    ),
    ParamSpec::secret(
        "jwtFilerSigningKey",
        "security.toml jwt.filer_signing.key (filer writes); given as WEED_JWT_FILER_SIGNING_KEY.",
    ),
    ParamSpec::secret(
        "jwtFilerSigningReadKey",
        "security.toml jwt.filer_signing.read.key (filer reads); given as \
         WEED_JWT_FILER_SIGNING_READ_KEY.",
    ),
];

/// The environment variable `weed` reads each secret of [`SPECS`] from (the plugin's tests
/// check that every documented secret has one).
const SECRET_ENV: &[(&str, &str)] = &[
    ("jwtSigningKey", "WEED_JWT_SIGNING_KEY"),
    ("jwtSigningReadKey", "WEED_JWT_SIGNING_READ_KEY"),
    ("jwtFilerSigningKey", "WEED_JWT_FILER_SIGNING_KEY"),
    ("jwtFilerSigningReadKey", "WEED_JWT_FILER_SIGNING_READ_KEY"),
];

/// The environment variable for the secret `key`, if `weed` takes it.
fn secret_env_name(key: &str) -> Option<&'static str> {
    SECRET_ENV.iter().find(|(k, _)| *k == key).map(|(_, env)| *env)
}

/// Open a StorageClass parameter list (or a volume context, `source` = `Context`) and refuse
/// keys the table does not document for that source.
pub fn open<'a>(kvs: &'a [Kv], source: ParamSource) -> Result<Params<'a>, BackendError> {
    let params = Params::new("parameter", kvs)?;
    if source == ParamSource::Parameter && params.has("path") {
        return Err(invalid(
            "parameter \"path\" cannot be a StorageClass parameter: provisioning sets it to \
             <parentDir>/<volume name>; to mount an existing directory, create a static \
             PersistentVolume with volumeAttributes.path",
        ));
    }
    params.check_known(known(SPECS), source)?;
    Ok(params)
}

/// Check the secrets (known keys, non-empty values) and turn them into environment variables
/// whose values are secret *references*: the host fills them in at execution time, so a plan
/// never holds a secret value. Table order, so plans are deterministic.
pub fn secret_env(secrets: &[Kv]) -> Result<Vec<EnvVar>, BackendError> {
    let secrets = Params::new("secret", secrets)?;
    secrets.check_known(known(SPECS), ParamSource::Secret)?;
    let mut env = Vec::new();
    for spec in SPECS.iter().filter(|s| s.source == ParamSource::Secret) {
        if secrets.text(spec.name)?.is_some()
            && let Some(name) = secret_env_name(spec.name)
        {
            env.push(EnvVar::new(name, Value::Secret(spec.name.into())));
        }
    }
    Ok(env)
}

/// Where `weed` keeps its chunk cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheDir {
    /// The per-volume node cache directory (the host removes it at unstage).
    Volume,
    /// No chunk cache (`-cacheCapacityMB=0`); metadata still lives in the volume cache directory.
    Disabled,
}

/// Every parameter, parsed and validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings<'a> {
    /// Filer endpoints, in the order given.
    pub filers: Vec<&'a str>,
    /// The remote directory to mount, when known (static volume or provisioned context).
    pub path: Option<&'a str>,
    /// Where provisioning creates volume directories.
    pub parent_dir: &'a str,
    /// A master's HTTP address (GetCapacity).
    pub master: Option<&'a str>,
    /// The master's volume size limit, MiB.
    pub master_volume_size_limit_mb: u64,
    /// The explicit collection, if given.
    pub collection: Option<&'a str>,
    /// `-replication=`.
    pub replication: Option<&'a str>,
    /// `-disk=`.
    pub disk_type: Option<&'a str>,
    /// `-dataCenter=`.
    pub data_center: Option<&'a str>,
    /// `-ttl=`, in seconds.
    pub ttl_secs: Option<u64>,
    /// `-chunkSizeLimitMB=`.
    pub chunk_size_limit_mb: Option<u64>,
    /// `-cacheCapacityMB=` as given (see [`Settings::effective_cache_capacity_mb`]).
    pub cache_capacity_mb: Option<u64>,
    /// `-cacheMetaTtlSec=`.
    pub cache_meta_ttl_sec: Option<u64>,
    /// `-concurrentWriters=`.
    pub concurrent_writers: Option<u64>,
    /// `-concurrentReaders=`.
    pub concurrent_readers: Option<u64>,
    /// `-volumeServerAccess=`.
    pub volume_server_access: Option<&'a str>,
    /// `-map.uid=`, normalised.
    pub uid_map: Option<String>,
    /// `-map.gid=`, normalised.
    pub gid_map: Option<String>,
    /// `-umask=`.
    pub umask: Option<&'a str>,
    /// The `readOnly` parameter (the access mode and mount flags can also make it read-only).
    pub read_only: bool,
    /// Chunk cache policy.
    pub cache_dir: CacheDir,
    /// Memory limit of the weed cgroup, MiB.
    pub memory_limit_mb: Option<u64>,
    /// How long to wait for the mount, seconds.
    pub ready_timeout_sec: u64,
    /// Pass-through flags from the `mountOptions` parameter.
    pub mount_options: Vec<MountOption>,
}

impl<'a> Settings<'a> {
    /// Parse and validate every parameter in `p` (unknown keys are checked by [`open`]).
    pub fn parse(p: &Params<'a>) -> Result<Self, BackendError> {
        let filers = parse_filers(&label("filer"), p.required("filer")?)?;
        let path = p.text("path")?.map(|v| check_remote_path(&label("path"), v)).transpose()?;
        let parent_dir = match p.text("parentDir")? {
            Some(v) => check_remote_path(&label("parentDir"), v)?,
            None => "/buckets",
        };
        let master = match p.text("master")? {
            Some(v) => Some(parse_filers(&label("master"), v).and_then(|m| match m.as_slice() {
                [one] => Ok(*one),
                _ => Err(invalid("parameter \"master\" takes one host:port")),
            })?),
            None => None,
        };
        let collection = p.text("collection")?.map(|v| check_collection("collection", v)).transpose()?;
        let replication = p.text("replication")?.map(check_replication).transpose()?;
        let disk_type = p
            .text("diskType")?
            .map(|v| check_token("diskType", v, 64, "hdd, ssd or a tag of [A-Za-z0-9_-]", false))
            .transpose()?;
        let data_center = p
            .text("dataCenter")?
            .map(|v| check_token("dataCenter", v, 64, "a name of [A-Za-z0-9_.-]", true))
            .transpose()?;
        let ttl_secs = p.text("ttl")?.map(parse_ttl).transpose()?;
        let cache_capacity_mb = p.integer("cacheCapacityMB", 0, 1_048_576)?;
        let cache_dir = match p.choice("cacheDir", &["volume", "disabled"])? {
            Some("disabled") => CacheDir::Disabled,
            _ => CacheDir::Volume,
        };
        if cache_dir == CacheDir::Disabled && cache_capacity_mb.is_some_and(|n| n != 0) {
            return Err(invalid(
                "parameter \"cacheDir\" is \"disabled\" but parameter \"cacheCapacityMB\" asks \
                 for a non-zero chunk cache; remove cacheCapacityMB or use cacheDir=volume",
            ));
        }
        let mount_options = match p.text("mountOptions")? {
            Some(v) => mount_options::parse_list(&label("mountOptions"), v)?,
            None => Vec::new(),
        };
        Ok(Settings {
            filers,
            path,
            parent_dir,
            master,
            master_volume_size_limit_mb: p.integer("masterVolumeSizeLimitMB", 1, 1_048_576)?.unwrap_or(30_000),
            collection,
            replication,
            disk_type,
            data_center,
            ttl_secs,
            chunk_size_limit_mb: p.integer("chunkSizeLimitMB", 1, 1024)?,
            cache_capacity_mb,
            cache_meta_ttl_sec: p.integer("cacheMetaTtlSec", 0, 86_400)?,
            concurrent_writers: p.integer("concurrentWriters", 1, 1024)?,
            concurrent_readers: p.integer("concurrentReaders", 1, 1024)?,
            volume_server_access: p.choice("volumeServerAccess", &["direct", "publicUrl", "filerProxy"])?,
            uid_map: p.text("uidMap")?.map(|v| parse_id_map("uidMap", v)).transpose()?,
            gid_map: p.text("gidMap")?.map(|v| parse_id_map("gidMap", v)).transpose()?,
            umask: p.text("umask")?.map(check_umask).transpose()?,
            read_only: p.boolean("readOnly")?.unwrap_or(false),
            cache_dir,
            memory_limit_mb: p.integer("memoryLimitMB", 16, 1_048_576)?,
            ready_timeout_sec: p.integer("readyTimeoutSec", 1, 300)?.unwrap_or(30),
            mount_options,
        })
    }

    /// The filer list as `weed` and volume ids spell it: `a:1,b:2`.
    pub fn filer_list(&self) -> String {
        self.filers.join(",")
    }

    /// The `-cacheCapacityMB` value to pass, if any: 0 when the cache is disabled.
    pub fn effective_cache_capacity_mb(&self) -> Option<u64> {
        match self.cache_dir {
            CacheDir::Disabled => Some(0),
            CacheDir::Volume => self.cache_capacity_mb,
        }
    }

    /// The collection to use for a volume whose directory is `path`: the explicit one, or
    /// the last component of `path` (as SeaweedFS does for buckets); `None` for `/`.
    pub fn collection_for(&self, path: &str) -> Result<Option<String>, BackendError> {
        if let Some(c) = self.collection {
            return Ok(Some(c.to_string()));
        }
        match path.rsplit('/').next() {
            None | Some("") => Ok(None),
            Some(last) => check_collection("collection", last).map(|c| Some(c.to_string())).map_err(|_| {
                invalid(format!(
                    "parameter \"collection\" is not set and its default, the last component \
                         of the path ({last:?}), is not a valid collection name; set collection \
                         to [A-Za-z0-9_.-], at most 64 characters"
                ))
            }),
        }
    }
}
