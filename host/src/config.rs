//! Host configuration: plain data that tests build directly and the CLI fills from flags
//! and `MOUNTHOST_*` environment variables.

pub mod caps;

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::plan::policy::{ArgRules, Grant};
use crate::plugin::{Limits, RuntimeConfig};

/// Default state directory on a Kubernetes node.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/mounthost";
/// kubelet's root directory on a Kubernetes node.
pub const DEFAULT_KUBELET_DIR: &str = "/var/lib/kubelet";
/// The CSI driver name.
pub const DRIVER_NAME: &str = "csi.mounthost.dev";
/// The cgroup (below the hierarchy's root) from which each host daemon's own parent is derived
/// (`<parent>-<instance id>`, [`Config::own_cgroup_parent`]), holding a group per volume.
pub const DEFAULT_CGROUP_PARENT: &str = "mounthost";
/// Where unprivileged FUSE programs' secret files live unless configured, for a daemon with
/// the default state directory (others get `/run/mounthost/fuse-<hash>`: [`Config::fuse_files`]).
pub const DEFAULT_FUSE_FILES_DIR: &str = "/run/mounthost/fuse";
/// The ids unprivileged FUSE programs run as unless configured: the last 65536-id block below
/// 2^31 (0x7FFF0000-0x7FFFFFFF), one whole block of kubelet's user-namespace allocator.
pub const DEFAULT_FUSE_IDS: &str = "2147418112-2147483647";
/// The largest file an unprivileged FUSE program may write unless configured, in MiB.
pub const DEFAULT_FUSE_MAX_FILE_MIB: u64 = 64 << 10;
/// The most processes and threads of one volume's FUSE programs unless configured.
pub const DEFAULT_FUSE_MAX_PIDS: u64 = 1024;
/// Mounts one dynamic volume may hold unless configured.
pub const DEFAULT_DYNAMIC_MAX_MOUNTS: u64 = 64;
/// POST and DELETE requests one dynamic volume's socket takes a minute unless configured.
pub const DEFAULT_DYNAMIC_REQUESTS_PER_MINUTE: u64 = 120;
/// How many of those may come at once (the token bucket's size) unless configured.
pub const DEFAULT_DYNAMIC_BURST: u64 = 20;

/// The node's limits on each dynamic volume's mounts; a volume's attributes may lower each
/// ([`crate::volume::request::DynamicLimits`]), never raise it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DynamicCaps {
    /// Mounts at once.
    pub max_mounts: u64,
    /// Bytes all of a volume's mounts fetch together (`None`: no cap).
    pub max_bytes: Option<u64>,
    /// POST and DELETE requests a minute (a token bucket refilled at this rate).
    pub requests_per_minute: u64,
    /// The bucket's size: requests that may come at once after a quiet while.
    pub burst: u64,
}

impl Default for DynamicCaps {
    fn default() -> Self {
        DynamicCaps {
            max_mounts: DEFAULT_DYNAMIC_MAX_MOUNTS,
            max_bytes: None,
            requests_per_minute: DEFAULT_DYNAMIC_REQUESTS_PER_MINUTE,
            burst: DEFAULT_DYNAMIC_BURST,
        }
    }
}

impl DynamicCaps {
    /// Refuse a volume's attribute that would raise a cap (INVALID_ARGUMENT, naming both).
    pub fn check(&self, asked: &crate::volume::request::DynamicLimits) -> Result<(), crate::error::Error> {
        use crate::volume::request as r;
        let above = |key: &str, asked: Option<u64>, cap: Option<u64>, flag: &str, unit: u64| match (asked, cap) {
            (Some(a), Some(c)) if a > c => Err(crate::error::Error::invalid(format!(
                "volume attribute {key} is {}, above this node's cap of {} ({flag}); ask for {} or less",
                a / unit,
                c / unit,
                c / unit
            ))),
            _ => Ok(()),
        };
        above(r::DYNAMIC_MAX_MOUNTS_KEY, asked.max_mounts, Some(self.max_mounts), "--dynamic-max-mounts", 1)?;
        above(r::DYNAMIC_MAX_MIB_KEY, asked.max_bytes, self.max_bytes, "--dynamic-max-mib", 1 << 20)?;
        above(
            r::DYNAMIC_RATE_KEY,
            asked.requests_per_minute,
            Some(self.requests_per_minute),
            "--dynamic-requests-per-minute",
            1,
        )
    }

    /// Does the volume's attribute `key` (one of [`crate::volume::request::DYNAMIC_LIMIT_KEYS`])
    /// set its limit, rather than the node's cap? Only when it asked for no more than the node
    /// allows (a cap lowered since its publish is the node's).
    pub fn set_by_volume(&self, asked: &crate::volume::request::DynamicLimits, key: &str) -> bool {
        use crate::volume::request as r;
        match key {
            r::DYNAMIC_MAX_MOUNTS_KEY => asked.max_mounts.is_some_and(|a| a <= self.max_mounts),
            r::DYNAMIC_MAX_MIB_KEY => asked.max_bytes.is_some_and(|a| self.max_bytes.is_none_or(|c| a <= c)),
            _ => asked.requests_per_minute.is_some_and(|a| a <= self.requests_per_minute),
        }
    }

    /// The limits a volume with `asked` gets: the lower of each.
    pub fn effective(&self, asked: &crate::volume::request::DynamicLimits) -> DynamicCaps {
        let lower = |a: Option<u64>, c: Option<u64>| match (a, c) {
            (Some(a), Some(c)) => Some(a.min(c)),
            (a, c) => a.or(c),
        };
        DynamicCaps {
            max_mounts: asked.max_mounts.map_or(self.max_mounts, |a| a.min(self.max_mounts)),
            max_bytes: lower(asked.max_bytes, self.max_bytes),
            requests_per_minute: asked
                .requests_per_minute
                .map_or(self.requests_per_minute, |a| a.min(self.requests_per_minute)),
            burst: self.burst,
        }
    }
}

/// A byte cap as the command line gives it: a size, none at all, or the default, measured from
/// the state directory's filesystem when the host daemon starts ([`Config::resolve_byte_caps`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ByteCap {
    /// Not given: the default, measured at start.
    #[default]
    Measured,
    /// `0`: no cap.
    Unlimited,
    /// This many bytes.
    Bytes(u64),
}

impl ByteCap {
    /// A flag in MiB: absent is the default, `0` no cap.
    pub fn from_mib(flag: Option<u64>) -> ByteCap {
        match flag {
            None => ByteCap::Measured,
            Some(0) => ByteCap::Unlimited,
            Some(mib) => ByteCap::Bytes(mib.saturating_mul(1 << 20)),
        }
    }
}

/// The default node cache cap: this share of the state directory's filesystem (its size, as
/// statvfs gives it at the host daemon's start), as `numerator / denominator`.
pub const DEFAULT_CACHE_SHARE: (u64, u64) = (1, 2);
/// The default dynamic byte cap: this share of the node's cache cap (of the state directory's
/// filesystem when the cache has none).
pub const DEFAULT_DYNAMIC_SHARE: (u64, u64) = (1, 2);

/// The node's byte caps as the flags give them (`--cache-max-mib`, `--dynamic-max-mib`), until
/// [`Config::resolve_byte_caps`] turns them into `registries.cache_max_bytes` and
/// `dynamic.max_bytes`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ByteCaps {
    pub cache: ByteCap,
    pub dynamic: ByteCap,
}

/// What [`Config::resolve_byte_caps`] chose, and why (for the start-up log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedCaps {
    /// The node cache's cap.
    pub cache: Option<u64>,
    /// Where it came from.
    pub cache_from: String,
    /// Each dynamic volume's byte cap.
    pub dynamic: Option<u64>,
    /// Where it came from.
    pub dynamic_from: String,
}

/// `bytes` as `N MiB`, or `none`.
pub fn show_cap(bytes: Option<u64>) -> String {
    bytes.map_or("none".to_string(), |b| format!("{} MiB", b >> 20))
}

/// Where the stock seaweedfs plugin's `weed` is looked for unless configured.
pub const DEFAULT_WEED: &str = "/usr/local/bin/weed";

/// Everything the host needs to know.
#[derive(Debug, Clone)]
pub struct Config {
    /// State, caches and runtime files live below this directory.
    pub state_dir: PathBuf,
    /// Folder of extra `.wasm` plugins (default `<state>/plugins`).
    pub plugin_dir: PathBuf,
    /// Program name → absolute binary, for `spawn-fuse` steps.
    pub programs: BTreeMap<String, PathBuf>,
    /// Program name → the options its arguments may not (or only may) name; none: any.
    pub program_args: BTreeMap<String, ArgRules>,
    /// Program name → the rule set its whole argv is judged by (the built-in set of its own
    /// name unless configured), and the programs that must run on a connection the host mounts.
    pub program_rules: crate::plan::rules::ProgramRules,
    /// Run every FUSE program a plan starts in a mount namespace of its own (`exec::confine`);
    /// `false` only where the kernel cannot (before Linux 5.12) or to measure what it costs.
    pub confine_programs: bool,
    /// What each plugin (by name) is granted.
    pub grants: BTreeMap<String, Grant>,
    /// Limits for plugins without their own entry.
    pub plugin_limits: Limits,
    /// Limits by plugin name.
    pub plugin_limits_by_name: BTreeMap<String, Limits>,
    /// Plugin calls in flight at once.
    pub plugin_concurrency: u32,
    /// kubelet's root: staging and target paths must lie inside it (or inside `state_dir`).
    pub kubelet_dir: PathBuf,
    /// The node id reported by NodeGetInfo.
    pub node_id: String,
    /// How long a FUSE process gets between SIGTERM and SIGKILL at unstage.
    pub fuse_stop_grace: std::time::Duration,
    /// The ids FUSE programs whose connection the host mounts run as (WIT
    /// `fuse-mount.host-fd`): each such volume gets one of its own, as user and group.
    pub fuse_ids: FuseIds,
    /// Caps on what those programs may write: the largest file (RLIMIT_FSIZE; `None`: none).
    pub fuse_max_file_bytes: Option<u64>,
    /// Caps every volume's cgroup gets (processes, block I/O), whatever runs in it.
    pub fuse_caps: caps::Caps,
    /// Limits on each dynamic volume's mounts.
    pub dynamic: DynamicCaps,
    /// Where those programs' secret files live, one directory per volume: outside the private
    /// state directory, which they cannot reach (a tmpfs the daemon mounts there). `None`:
    /// derived from the state directory ([`Config::fuse_files`]).
    pub fuse_files_dir: Option<PathBuf>,
    /// The host daemon's socket (front ↔ host).
    pub host_socket: PathBuf,
    /// The group of the host daemon's socket: with one, the socket is 0660 in that group (a
    /// non-root front in the group may connect); without, 0600.
    pub host_socket_group: Option<u32>,
    /// Where `/metrics`, `/healthz` and `/readyz` are served (none: not served).
    pub metrics_address: Option<std::net::SocketAddr>,
    /// The cgroup (relative to the hierarchy's root) the daemon's own parent is derived from;
    /// each volume's FUSE processes get a group of their own there ([`Config::own_cgroup_parent`]).
    pub cgroup_parent: String,
    /// The host daemon's instance id, kept in its state directory ([`crate::exec::instance`]);
    /// `None` for processes that run no FUSE program (the front) and in unit tests.
    pub instance: Option<String>,
    /// How the node's OCI blob cache reaches registries.
    pub registries: Registries,
    /// A `plugin: oci://…` value may name a tag without a digest: it is resolved to a digest
    /// once (CreateVolume, or a volume's first stage) and the volume is pinned to that.
    pub allow_plugin_tags: bool,
    /// The stock plugins this process offers, by name (all of them unless configured): a
    /// volume naming another is refused as an unknown plugin ([`Config::offer_stock`]).
    pub stock_plugins: std::collections::BTreeSet<String>,
    /// Lazy volumes (docs/lazy.md).
    pub lazy: LazyConfig,
    /// The byte caps as asked (resolved at the host daemon's start).
    pub byte_caps: ByteCaps,
    /// Model signatures (docs/signing.md).
    pub signatures: Signatures,
}

/// The node's trust set and signature policy (docs/signing.md).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Signatures {
    /// The directory of trust entries (a ConfigMap mount), read at each verification; none:
    /// nothing is trusted.
    pub trust_dir: Option<PathBuf>,
    /// Every volume whose stage plan resolves or fetches an OCI artifact must be signed by an
    /// entry of the trust set (its `signedBy` entries when it names some).
    pub required: bool,
}

/// How lazy volumes are served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LazyConfig {
    /// The executable started as a lazy volume's FUSE server (`mounthost lazyfs`): the daemon's
    /// own binary.
    pub server: PathBuf,
    /// How long a read of bytes not on the node waits before it fails with EIO.
    pub read_wait: std::time::Duration,
    /// The unit a reader's request is rounded to, and the read-ahead's.
    pub chunk_bytes: u64,
    /// The memory each lazy server may use: its volume's cgroup gets this much per lazy server
    /// it runs (`None`: no limit).
    pub memory_limit: Option<u64>,
}

/// A lazy read's wait for its bytes, by default.
pub const DEFAULT_LAZY_READ_WAIT_SECS: u64 = 30;
/// A lazy reader's chunk, by default (MiB).
pub const DEFAULT_LAZY_CHUNK_MIB: u64 = 4;
/// The memory of one lazy server, by default (MiB): its cgroup's limit (docs/lazy.md, "Sizing").
pub const DEFAULT_LAZY_MEMORY_MIB: u64 = 256;

impl Default for LazyConfig {
    fn default() -> Self {
        LazyConfig {
            server: PathBuf::from("/usr/local/bin/mounthost"),
            read_wait: std::time::Duration::from_secs(DEFAULT_LAZY_READ_WAIT_SECS),
            chunk_bytes: DEFAULT_LAZY_CHUNK_MIB << 20,
            memory_limit: Some(DEFAULT_LAZY_MEMORY_MIB << 20),
        }
    }
}

/// The range of ids (`FIRST-LAST`, inclusive) from which each volume whose FUSE program the
/// host mounts for gets a user and group id of its own (the same number for both), so one
/// volume's program can neither read another's files or `/proc/<pid>/environ` nor signal or
/// trace it. The range holds no id below 1000 (system accounts), neither 65534 (`nobody`) nor
/// 65535, nor 4294967295 (-1 to the kernel), and at most 2^20 ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FuseIds {
    /// The first id.
    pub first: u32,
    /// The last id (inclusive).
    pub last: u32,
}

impl Default for FuseIds {
    fn default() -> Self {
        FuseIds::parse(DEFAULT_FUSE_IDS).expect("the default range is valid")
    }
}

impl FuseIds {
    /// The most ids a range may hold.
    pub const MAX_LEN: u64 = 1 << 20;

    /// `FIRST-LAST` (numbers), checked.
    pub fn parse(s: &str) -> Result<FuseIds, String> {
        let (first, last) =
            s.split_once('-').ok_or_else(|| format!("{s:?} is not FIRST-LAST (e.g. {DEFAULT_FUSE_IDS})"))?;
        let id = |v: &str| v.parse::<u32>().map_err(|_| format!("{v:?} is not an id (0 to 4294967295)"));
        let (first, last) = (id(first)?, id(last)?);
        if first > last {
            return Err(format!("{s}: the first id is above the last"));
        }
        if first < 1000 {
            return Err(format!("{s}: ids below 1000 are system accounts' (0 is root's)"));
        }
        for reserved in [65534, 65535, u32::MAX] {
            if (first..=last).contains(&reserved) {
                return Err(format!("{s} holds {reserved}, which is nobody's or -1 to the kernel"));
            }
        }
        if u64::from(last - first) + 1 > Self::MAX_LEN {
            return Err(format!("{s} holds more than {} ids", Self::MAX_LEN));
        }
        Ok(FuseIds { first, last })
    }

    /// Every id of the range, lowest first.
    pub fn ids(&self) -> std::ops::RangeInclusive<u32> {
        self.first..=self.last
    }
}

/// Registry access and the size of the node's OCI blob cache (`<state>/cache`).
#[derive(Clone, PartialEq, Eq)]
pub struct Registries {
    /// PEM bundle of extra CA certificates trusted for registries, besides the system roots (or
    /// a directory of such bundles, `*.crt` and `*.pem`).
    pub ca_bundle: Option<PathBuf>,
    /// Registries (`host` or `host:port`) reached over plain HTTP when a plan asks so.
    pub insecure: std::collections::BTreeSet<String>,
    /// An HTTP(S) proxy for registry traffic (P2P distribution systems that act as one).
    pub proxy: Option<String>,
    /// The node's registry mirrors: registry `host[:port]` → mirror `host[:port]`, for pulls
    /// whose volume names no `mirror` of its own.
    pub mirrors: BTreeMap<String, String>,
    /// Blobs no staged volume uses are evicted, least recently used first, above this size.
    pub cache_max_bytes: Option<u64>,
    /// Registry `host[:port]` → hosts its token realm and redirects may name besides itself.
    pub endpoints: BTreeMap<String, std::collections::BTreeSet<String>>,
    /// A download receiving less than 64 KiB in this window fails retriably.
    pub download_stall: std::time::Duration,
}

/// `--download-stall-secs`'s default.
pub const DEFAULT_DOWNLOAD_STALL_SECS: u64 = 60;

impl Default for Registries {
    fn default() -> Self {
        Registries {
            ca_bundle: None,
            insecure: Default::default(),
            proxy: None,
            mirrors: Default::default(),
            cache_max_bytes: None,
            endpoints: Default::default(),
            download_stall: std::time::Duration::from_secs(DEFAULT_DOWNLOAD_STALL_SECS),
        }
    }
}

/// The proxy URL may carry credentials (`http://user:password@proxy:3128`): never printed.
impl std::fmt::Debug for Registries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registries")
            .field("ca_bundle", &self.ca_bundle)
            .field("insecure", &self.insecure)
            .field("proxy", &self.proxy.as_ref().map(|_| "<set>"))
            .field("mirrors", &self.mirrors)
            .field("cache_max_bytes", &self.cache_max_bytes)
            .field("endpoints", &self.endpoints)
            .field("download_stall", &self.download_stall)
            .finish()
    }
}

impl Config {
    /// The defaults for a node: the stock plugins' grants and programs.
    pub fn new(state_dir: PathBuf) -> Self {
        let mut grants = BTreeMap::new();
        grants.insert(
            "seaweedfs".to_string(),
            Grant {
                programs: ["weed".to_string()].into(),
                fstypes: ["fuse.seaweedfs".to_string()].into(),
                hosts: Default::default(),
            },
        );
        // The model plugin runs nothing and mounts nothing but binds; the registries it pulls
        // from are granted by the StorageClass's oci-reference parameter, not here.
        grants.insert("model".to_string(), Grant::default());
        Config {
            host_socket: state_dir.join("host.sock"),
            host_socket_group: None,
            metrics_address: None,
            plugin_dir: state_dir.join("plugins"),
            state_dir,
            programs: [("weed".to_string(), PathBuf::from(DEFAULT_WEED))].into(),
            program_args: BTreeMap::new(),
            program_rules: crate::plan::rules::ProgramRules::builtin(),
            confine_programs: true,
            grants,
            plugin_limits: Limits::default(),
            plugin_limits_by_name: BTreeMap::new(),
            plugin_concurrency: 64,
            kubelet_dir: PathBuf::from(DEFAULT_KUBELET_DIR),
            node_id: default_node_id(),
            fuse_stop_grace: std::time::Duration::from_secs(10),
            fuse_ids: FuseIds::default(),
            fuse_max_file_bytes: Some(DEFAULT_FUSE_MAX_FILE_MIB << 20),
            dynamic: DynamicCaps::default(),
            fuse_caps: caps::Caps { pids: Some(DEFAULT_FUSE_MAX_PIDS), io: Vec::new() },
            fuse_files_dir: None,
            cgroup_parent: DEFAULT_CGROUP_PARENT.to_string(),
            instance: None,
            registries: Registries::default(),
            allow_plugin_tags: false,
            signatures: Signatures::default(),
            stock_plugins: crate::stock::names().into_iter().map(String::from).collect(),
            lazy: LazyConfig::default(),
            byte_caps: ByteCaps::default(),
        }
    }

    /// Turn the byte caps as asked into the node cache's cap (`registries.cache_max_bytes`) and
    /// each dynamic volume's (`dynamic.max_bytes`), given the size of the state directory's
    /// filesystem (`None`: it could not be measured). Defaults: the cache half that size, a
    /// dynamic volume half the cache's cap (a quarter of the filesystem), each rounded down to a
    /// MiB and at least 1 MiB. What was not measured has no default cap.
    pub fn resolve_byte_caps(&mut self, state_fs_bytes: Option<u64>) -> ResolvedCaps {
        let share = |bytes: u64, (n, d): (u64, u64)| ((bytes / d).saturating_mul(n) >> 20).max(1) << 20;
        let fs = |what: &str| match state_fs_bytes {
            Some(total) => format!("{what} the state directory's filesystem ({} MiB), measured at start", total >> 20),
            None => "the state directory's filesystem could not be measured at start: none".to_string(),
        };
        let (cache, cache_from) = match self.byte_caps.cache {
            ByteCap::Bytes(b) => (Some(b), "--cache-max-mib".to_string()),
            ByteCap::Unlimited => (None, "--cache-max-mib=0".to_string()),
            ByteCap::Measured => (state_fs_bytes.map(|t| share(t, DEFAULT_CACHE_SHARE)), fs("half of")),
        };
        let (dynamic, dynamic_from) = match (self.byte_caps.dynamic, cache) {
            (ByteCap::Bytes(b), _) => (Some(b), "--dynamic-max-mib".to_string()),
            (ByteCap::Unlimited, _) => (None, "--dynamic-max-mib=0".to_string()),
            (ByteCap::Measured, Some(c)) => {
                (Some(share(c, DEFAULT_DYNAMIC_SHARE)), "half of the cache's cap".to_string())
            }
            (ByteCap::Measured, None) => (
                state_fs_bytes.map(|t| share(share(t, DEFAULT_CACHE_SHARE), DEFAULT_DYNAMIC_SHARE)),
                fs("a quarter of"),
            ),
        };
        self.registries.cache_max_bytes = cache;
        self.dynamic.max_bytes = dynamic;
        ResolvedCaps { cache, cache_from, dynamic, dynamic_from }
    }

    /// Compiled plugin artifacts are cached here.
    pub fn plugin_cache_dir(&self) -> PathBuf {
        self.state_dir.join("cache").join("plugins")
    }

    /// The plugin runtime's configuration.
    pub fn runtime(&self) -> RuntimeConfig {
        RuntimeConfig {
            plugin_dir: Some(self.plugin_dir.clone()),
            cache_dir: Some(self.plugin_cache_dir()),
            concurrency: self.plugin_concurrency,
            default_limits: self.plugin_limits,
            limits: self.plugin_limits_by_name.clone(),
            stock: crate::stock::offered(&self.stock_plugins),
            ..RuntimeConfig::default()
        }
    }

    /// The directory of unprivileged FUSE programs' files: the configured one, or
    /// [`DEFAULT_FUSE_FILES_DIR`] for the default state directory and
    /// `/run/mounthost/fuse-<16 hex of sha256(state directory)>` for any other, so daemons with
    /// different state directories (`mounthost local` beside a node's daemon) never share it.
    pub fn fuse_files(&self) -> PathBuf {
        if let Some(dir) = &self.fuse_files_dir {
            return dir.clone();
        }
        if self.state_dir == std::path::Path::new(DEFAULT_STATE_DIR) {
            return PathBuf::from(DEFAULT_FUSE_FILES_DIR);
        }
        use sha2::Digest;
        let digest = sha2::Sha256::digest(self.state_dir.as_os_str().as_encoded_bytes());
        PathBuf::from(format!("{DEFAULT_FUSE_FILES_DIR}-{}", hex::encode(&digest[..8])))
    }

    /// The cgroup (relative to the hierarchy's root) holding this daemon's volume groups:
    /// `<cgroup_parent>-<instance>`, one per state directory, so a second daemon on the node (a
    /// test run, another driver instance, the next pod of a rolling update with its own state)
    /// never lists, sweeps or kills another's groups; `<cgroup_parent>` without an instance.
    pub fn own_cgroup_parent(&self) -> String {
        match &self.instance {
            Some(id) => format!("{}-{id}", self.cgroup_parent),
            None => self.cgroup_parent.clone(),
        }
    }

    /// The cgroup of a new record of the volume whose state key is `key`.
    pub fn volume_cgroup(&self, key: &str) -> String {
        format!("{}/{key}", self.own_cgroup_parent())
    }

    /// Offer only the stock plugins in `names` (each one of [`crate::stock::names`]). A stock
    /// plugin left out also loses its default grant, so a folder plugin taking its name gets
    /// only what `--grant` gives it.
    pub fn offer_stock(&mut self, names: std::collections::BTreeSet<String>) {
        for stock in crate::stock::names() {
            if !names.contains(stock) {
                self.grants.remove(stock);
            }
        }
        self.stock_plugins = names;
    }

    /// What `plugin` is granted (nothing when it has no entry).
    pub fn grant(&self, plugin: &str) -> Grant {
        self.grants.get(plugin).cloned().unwrap_or_default()
    }
}

/// The runtime's defaults: no folder, no cache, stock plugins, files on disk.
impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            plugin_dir: None,
            cache_dir: None,
            concurrency: 64,
            default_limits: Limits::default(),
            limits: BTreeMap::new(),
            stock: crate::stock::plugins(),
            files: std::sync::Arc::new(crate::unpriv::plugin_files::Disk::new()),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config::new(PathBuf::from(DEFAULT_STATE_DIR))
    }
}

/// The node's hostname (what Kubernetes uses as node name unless told otherwise).
pub fn default_node_id() -> String {
    crate::unpriv::private_files::hostname().unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuse_ids_are_a_sane_unprivileged_range() {
        let d = FuseIds::default();
        assert_eq!((d.first, d.last), (0x7FFF_0000, 0x7FFF_FFFF));
        assert_eq!(FuseIds::parse("100000-100009"), Ok(FuseIds { first: 100000, last: 100009 }));
        assert_eq!(FuseIds::parse("5000-5000").unwrap().ids().count(), 1);
        for bad in [
            "0-10",
            "999-2000",
            "60000-70000",
            "65535-65535",
            "4294967000-4294967295",
            "200000-100000",
            "100000-2000000",
            "100000",
            "a-b",
            "-1-5",
            "100000:100010",
        ] {
            assert!(FuseIds::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_fuse_files_directory_is_the_state_directorys_own() {
        let node = Config::default();
        assert_eq!(node.fuse_files(), PathBuf::from(DEFAULT_FUSE_FILES_DIR));
        let (a, b) = (Config::new("/tmp/a".into()).fuse_files(), Config::new("/tmp/b".into()).fuse_files());
        assert_ne!(a, b);
        assert!(a.to_string_lossy().starts_with("/run/mounthost/fuse-") && a.to_string_lossy().len() == 36, "{a:?}");
        let set = Config { fuse_files_dir: Some("/x".into()), ..Config::new("/tmp/a".into()) };
        assert_eq!(set.fuse_files(), PathBuf::from("/x"));
    }

    #[test]
    fn byte_caps_default_to_shares_of_the_state_filesystem_and_flags_override_them() {
        let gib = 1u64 << 30;
        let resolve = |cache: Option<u64>, dynamic: Option<u64>, fs: Option<u64>| {
            let mut cfg = Config::default();
            cfg.byte_caps = ByteCaps { cache: ByteCap::from_mib(cache), dynamic: ByteCap::from_mib(dynamic) };
            let r = cfg.resolve_byte_caps(fs);
            assert_eq!((cfg.registries.cache_max_bytes, cfg.dynamic.max_bytes), (r.cache, r.dynamic));
            r
        };
        let r = resolve(None, None, Some(100 * gib));
        assert_eq!((r.cache, r.dynamic), (Some(50 * gib), Some(25 * gib)));
        assert_eq!(r.cache_from, "half of the state directory's filesystem (102400 MiB), measured at start");
        assert_eq!(r.dynamic_from, "half of the cache's cap");
        // Rounded down to a MiB, never 0.
        let r = resolve(None, None, Some((3 << 20) + 5));
        assert_eq!((r.cache, r.dynamic), (Some(1 << 20), Some(1 << 20)));
        let r = resolve(Some(4096), None, Some(100 * gib));
        assert_eq!((r.cache, r.dynamic), (Some(4 * gib), Some(2 * gib)));
        assert_eq!(r.cache_from, "--cache-max-mib");
        // No cache cap: a dynamic volume still gets a quarter of the filesystem.
        let r = resolve(Some(0), None, Some(100 * gib));
        assert_eq!((r.cache, r.dynamic), (None, Some(25 * gib)));
        assert!(r.dynamic_from.starts_with("a quarter of the state directory's filesystem"), "{}", r.dynamic_from);
        let r = resolve(Some(0), Some(0), Some(100 * gib));
        assert_eq!((r.cache, r.dynamic), (None, None));
        assert_eq!(r.dynamic_from, "--dynamic-max-mib=0");
        let r = resolve(None, Some(64), None);
        assert_eq!((r.cache, r.dynamic), (None, Some(64 << 20)));
        assert!(r.cache_from.contains("could not be measured"), "{}", r.cache_from);
        // A Config built directly (tests) keeps no cap until resolved.
        let cfg = Config::default();
        assert_eq!((cfg.registries.cache_max_bytes, cfg.dynamic.max_bytes), (None, None));
    }

    #[test]
    fn the_proxy_url_is_never_printed() {
        let r = Registries { proxy: Some("http://user:hunter2@proxy:3128".into()), ..Default::default() };
        let printed = format!("{:?}", Config { registries: r, ..Config::default() });
        assert!(!printed.contains("hunter2") && printed.contains("<set>"), "{printed}");
    }

    #[test]
    fn a_stock_plugin_left_out_is_not_offered_and_loses_its_grant() {
        let all = Config::default();
        let names = |c: &Config| c.runtime().stock.iter().map(|s| s.name).collect::<Vec<_>>();
        assert_eq!(names(&all), ["seaweedfs", "model"]);
        let mut models = Config::default();
        models.offer_stock(["model".to_string()].into());
        assert_eq!(names(&models), ["model"]);
        assert!(models.grant("seaweedfs").programs.is_empty() && models.grant("seaweedfs").fstypes.is_empty());
        assert!(all.grant("seaweedfs").programs.contains("weed"));
        let mut none = Config::default();
        none.offer_stock(Default::default());
        assert!(names(&none).is_empty());
    }
}
