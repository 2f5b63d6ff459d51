//! The `mounthost` command line: flags with `MOUNTHOST_*` environment fallbacks, turned into
//! a [`Config`](crate::config::Config), then one subcommand.

pub mod cache;
pub mod client;
pub mod dynamic;
pub mod first_volume;
pub mod lazyfs;
pub mod libfuse;
pub mod model;
pub mod plugin;
pub mod plugin_check;
pub mod plugin_push;
pub mod progress;
pub mod serve;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::config::{Config, DEFAULT_STATE_DIR};
use crate::plan::policy::{OPTION_SETS, OptionName, option_set};
use crate::plan::rules::{self, ProgramRules};
use crate::plugin::Limits;
use crate::telemetry::LogFormat;

/// mounthost: a CSI driver with a stable host daemon and backends as WebAssembly plugins.
#[derive(Debug, Parser)]
#[command(name = "mounthost", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Options every subcommand shares (listed after a subcommand's own, under their own heading:
/// most configure the daemons).
#[derive(Debug, Args)]
#[command(next_help_heading = "Global options")]
pub struct GlobalArgs {
    /// State directory (volume state, caches, sockets).
    #[arg(long, env = "MOUNTHOST_STATE_DIR", default_value = DEFAULT_STATE_DIR, global = true)]
    pub state_dir: PathBuf,
    /// Folder of extra `.wasm` plugins [default: <state-dir>/plugins].
    #[arg(long, env = "MOUNTHOST_PLUGIN_DIR", global = true)]
    pub plugin_dir: Option<PathBuf>,
    /// Map a program name used by plugins to a binary, NAME=/absolute/path (repeatable).
    #[arg(long = "program", env = "MOUNTHOST_PROGRAMS", value_delimiter = ',', value_parser = parse_program, global = true)]
    pub programs: Vec<(String, PathBuf)>,
    /// Grant a plugin something, PLUGIN:program=NAME, PLUGIN:fstype=TYPE or PLUGIN:host=HOST[:PORT] (repeatable).
    #[arg(long = "grant", env = "MOUNTHOST_GRANTS", value_delimiter = ',', value_parser = parse_grant, global = true)]
    pub grants: Vec<GrantArg>,
    /// Constrain a program's arguments and environment, PROGRAM:deny=OPTION, PROGRAM:deny=@sshfs
    /// (a built-in set), PROGRAM:allow=OPTION or PROGRAM:env=NAME; OPTION is a long or -o option
    /// name (ssh_command) or -X. A program with any rule gets only the environment variables
    /// its env=NAME rules allow (repeatable).
    #[arg(long = "program-args", env = "MOUNTHOST_PROGRAM_ARGS", value_delimiter = ',', value_parser = parse_program_args, global = true)]
    pub program_args: Vec<ProgramArgsArg>,
    /// The rule set a program's whole argv is judged by: PROGRAM=@SET (built in: @weed,
    /// @sshfs, @bindfs, @rclone, @s3fs), PROGRAM=SET (SET.yaml of --program-rules-dir) or
    /// PROGRAM=none; a program named like a built-in set, or a set of --program-rules-dir, gets
    /// that set unless named here (repeatable).
    #[arg(long = "program-rules", env = "MOUNTHOST_PROGRAM_RULES", value_name = "PROGRAM=SET", value_delimiter = ',', value_parser = parse_program_rules, global = true)]
    pub program_rules: Vec<(String, String)>,
    /// Directory of rule sets, one NAME.yaml each (unknown keys refused; a ConfigMap mounted
    /// there); a set applies to the program of its own name unless --program-rules names another.
    #[arg(long, env = "MOUNTHOST_PROGRAM_RULES_DIR", global = true)]
    pub program_rules_dir: Option<PathBuf>,
    /// A program that must run unprivileged on a FUSE connection the host mounts, whatever its
    /// rule set says: a plan asking it to mount by itself is refused (repeatable).
    #[arg(
        long = "require-host-fd",
        env = "MOUNTHOST_REQUIRE_HOST_FD",
        value_name = "PROGRAM",
        value_delimiter = ',',
        global = true
    )]
    pub require_host_fd: Vec<String>,
    /// Start every FUSE program a plan runs in a mount namespace of its own, where the node's
    /// tree is absent but for what its volume needs and only its planned mount point reaches
    /// the node (Linux 5.12 or later); false only to measure what it costs.
    #[arg(long, env = "MOUNTHOST_CONFINE_PROGRAMS", default_value_t = true, action = clap::ArgAction::Set, global = true)]
    pub confine_programs: bool,
    /// Deadline of one plugin call in milliseconds.
    #[arg(long, env = "MOUNTHOST_PLUGIN_DEADLINE_MS", default_value_t = 1000, global = true)]
    pub plugin_deadline_ms: u64,
    /// Memory cap of one plugin instance in MiB.
    #[arg(long, env = "MOUNTHOST_PLUGIN_MEMORY_MIB", default_value_t = 64, global = true)]
    pub plugin_memory_mib: u64,
    /// Per-plugin limits, NAME=DEADLINE_MS/MEMORY_MIB (repeatable).
    #[arg(long = "plugin-limit", env = "MOUNTHOST_PLUGIN_LIMITS", value_delimiter = ',', value_parser = parse_limit, global = true)]
    pub plugin_limits: Vec<(String, Limits)>,
    /// Plugin calls in flight at once.
    #[arg(long, env = "MOUNTHOST_PLUGIN_CONCURRENCY", default_value_t = 64, global = true)]
    pub plugin_concurrency: u32,
    /// Log format.
    #[arg(long, env = "MOUNTHOST_LOG_FORMAT", value_enum, default_value = "text", global = true)]
    pub log_format: LogFormat,
    /// kubelet's root directory; staging and target paths must be inside it
    /// [default: /var/lib/kubelet; for `local`: <state-dir>/kubelet].
    #[arg(long, env = "MOUNTHOST_KUBELET_DIR", global = true)]
    pub kubelet_dir: Option<PathBuf>,
    /// The host daemon's socket [default: <state-dir>/host.sock].
    #[arg(long, env = "MOUNTHOST_HOST_SOCKET", global = true)]
    pub host_socket: Option<PathBuf>,
    /// The host daemon socket's group: the socket becomes mode 0660 in this group (GID) instead
    /// of 0600, so a non-root CSI front in the group can connect.
    #[arg(long, env = "MOUNTHOST_HOST_SOCKET_GROUP", global = true)]
    pub host_socket_group: Option<u32>,
    /// Serve Prometheus metrics at /metrics, and /healthz and /readyz, over HTTP on ADDR:PORT
    /// (e.g. 0.0.0.0:9810; an IPv6 address with or without brackets) [default: not served].
    #[arg(long, env = "MOUNTHOST_METRICS_ADDRESS", value_parser = parse_listen_address, global = true)]
    pub metrics_address: Option<std::net::SocketAddr>,
    /// The node id NodeGetInfo reports [default: the hostname].
    #[arg(long, env = "MOUNTHOST_NODE_ID", global = true)]
    pub node_id: Option<String>,
    /// Seconds a FUSE process gets between SIGTERM and SIGKILL at unstage.
    #[arg(long, env = "MOUNTHOST_FUSE_STOP_GRACE_SECS", default_value_t = 10, global = true)]
    pub fuse_stop_grace_secs: u64,
    /// Ids (FIRST-LAST) from which each volume whose FUSE program the host mounts for
    /// (plugins' `fuse-mount.host-fd`) gets a user and group id of its own; none below 1000,
    /// neither 65534, 65535 nor 4294967295, at most 2^20 of them.
    #[arg(long, env = "MOUNTHOST_FUSE_IDS", default_value = crate::config::DEFAULT_FUSE_IDS, value_parser = crate::config::FuseIds::parse, global = true)]
    pub fuse_ids: crate::config::FuseIds,
    /// Directory of the secret files of FUSE programs the host mounts for, one sub-directory per
    /// volume (a size-capped tmpfs the host daemon mounts there); its parents must let every
    /// FUSE id through [default: /run/mounthost/fuse for the default state directory,
    /// /run/mounthost/fuse-<hash of the state directory> for another].
    #[arg(long, env = "MOUNTHOST_FUSE_FILES_DIR", global = true)]
    pub fuse_files_dir: Option<PathBuf>,
    /// The largest file, in MiB, an unprivileged FUSE program (plugins' `fuse-mount.host-fd`) may
    /// write: its RLIMIT_FSIZE, which it cannot raise; a write past it fails with EFBIG. 0: no cap.
    #[arg(long, env = "MOUNTHOST_FUSE_MAX_FILE_MIB", default_value_t = crate::config::DEFAULT_FUSE_MAX_FILE_MIB, global = true)]
    pub fuse_max_file_mib: u64,
    /// The most processes and threads of one volume's FUSE programs together (its cgroup's
    /// pids.max, where the node has the pids controller); a fork past it fails. 0: no cap.
    #[arg(long, env = "MOUNTHOST_FUSE_MAX_PIDS", default_value_t = crate::config::DEFAULT_FUSE_MAX_PIDS, global = true)]
    pub fuse_max_pids: u64,
    /// Throttle the block I/O of each volume's FUSE programs on one device, "MAJ:MIN KEY=N...",
    /// KEY one of rbps, wbps (bytes per second), riops, wiops (operations per second): its
    /// cgroup's io.max (v2) or blkio.throttle.* (v1) (repeatable) [default: none].
    #[arg(long = "fuse-io-max", env = "MOUNTHOST_FUSE_IO_MAX", value_delimiter = ',', value_parser = crate::config::caps::IoLimit::parse, global = true)]
    pub fuse_io_max: Vec<crate::config::caps::IoLimit>,
    /// Mounts one dynamic volume's pod may hold at once, at most 1024 (each takes inodes of the
    /// volume's 4096-inode tmpfs); a volume's dynamicMaxMounts may lower it.
    #[arg(long, env = "MOUNTHOST_DYNAMIC_MAX_MOUNTS", default_value_t = crate::config::DEFAULT_DYNAMIC_MAX_MOUNTS, value_parser = clap::value_parser!(u64).range(1..=1024), global = true)]
    pub dynamic_max_mounts: u64,
    /// MiB all of one dynamic volume's mounts may fetch together; a mount that would pass it is
    /// refused before any of its layers is fetched (a volume's dynamicMaxMiB may lower it); 0: no cap
    /// [default: half the cache's cap, measured at start; a quarter of the state directory's
    /// filesystem when the cache has none].
    #[arg(long, env = "MOUNTHOST_DYNAMIC_MAX_MIB", value_parser = clap::value_parser!(u64).range(0..=1 << 30), global = true)]
    pub dynamic_max_mib: Option<u64>,
    /// POST and DELETE requests a minute one dynamic volume's socket takes (a token bucket; more
    /// are answered 429 with Retry-After; a volume's dynamicRequestsPerMinute may lower it).
    #[arg(long, env = "MOUNTHOST_DYNAMIC_REQUESTS_PER_MINUTE", default_value_t = crate::config::DEFAULT_DYNAMIC_REQUESTS_PER_MINUTE, value_parser = clap::value_parser!(u64).range(1..=60_000), global = true)]
    pub dynamic_requests_per_minute: u64,
    /// How many of those may come at once after a quiet while (the bucket's size).
    #[arg(long, env = "MOUNTHOST_DYNAMIC_BURST", default_value_t = crate::config::DEFAULT_DYNAMIC_BURST, value_parser = clap::value_parser!(u64).range(1..=10_000), global = true)]
    pub dynamic_burst: u64,
    /// The cgroup, relative to the hierarchy's root (v2, or v1's memory hierarchy), under which
    /// every volume's FUSE processes get a group of their own.
    #[arg(long, env = "MOUNTHOST_CGROUP_PARENT", default_value = crate::config::DEFAULT_CGROUP_PARENT, value_parser = parse_cgroup_parent, global = true)]
    pub cgroup_parent: String,
    /// PEM file of extra CA certificates trusted for OCI registries (besides the system roots),
    /// or a directory whose *.crt and *.pem files are read (an empty one adds none).
    #[arg(long, env = "MOUNTHOST_REGISTRY_CA", global = true)]
    pub registry_ca: Option<PathBuf>,
    /// Pull REGISTRY's artifacts through MIRROR, both HOST[:PORT] as references name them, when
    /// a volume names no mirror of its own (repeatable).
    #[arg(long = "registry-mirror", env = "MOUNTHOST_REGISTRY_MIRRORS", value_name = "REGISTRY=MIRROR", value_delimiter = ',', value_parser = parse_mirror, global = true)]
    pub registry_mirrors: Vec<(String, String)>,
    /// An OCI registry, HOST[:PORT], that plans may reach over plain HTTP (repeatable).
    #[arg(long = "insecure-registry", env = "MOUNTHOST_INSECURE_REGISTRIES", value_delimiter = ',', value_parser = parse_registry, global = true)]
    pub insecure_registries: Vec<String>,
    /// A host REGISTRY's token realm and redirects may name besides the registry itself and, for
    /// redirects, public addresses: REGISTRY=HOST[:PORT] (repeatable; `docker.io=auth.docker.io`
    /// is built in). Needed for a realm on another host, and for a redirect to a private address.
    #[arg(long = "registry-endpoint", env = "MOUNTHOST_REGISTRY_ENDPOINTS", value_name = "REGISTRY=HOST", value_delimiter = ',', value_parser = parse_endpoint, global = true)]
    pub registry_endpoints: Vec<(String, String)>,
    /// A blob download that receives less than 64 KiB in this many seconds fails (retriably)
    /// and frees its slot.
    #[arg(long, env = "MOUNTHOST_DOWNLOAD_STALL_SECS", default_value_t = crate::config::DEFAULT_DOWNLOAD_STALL_SECS, value_parser = clap::value_parser!(u64).range(1..=3600), global = true)]
    pub download_stall_secs: u64,
    /// HTTP(S) proxy URL for OCI registry traffic (e.g. a P2P distribution daemon).
    #[arg(long, env = "MOUNTHOST_REGISTRY_PROXY", global = true)]
    pub registry_proxy: Option<String>,
    /// Evict cached OCI blobs that no staged volume uses, least recently used first, once the
    /// cache is larger than this many MiB; 0: no limit [default: half the size of the state
    /// directory's filesystem, measured at the host daemon's start].
    #[arg(long, env = "MOUNTHOST_CACHE_MAX_MIB", global = true)]
    pub cache_max_mib: Option<u64>,
    /// Let a `plugin: oci://...` value name a tag without a digest (resolved to its digest once,
    /// when the volume is created or first staged, and pinned) [default: a digest is required].
    #[arg(long, env = "MOUNTHOST_ALLOW_PLUGIN_TAGS", global = true)]
    pub allow_plugin_tags: bool,
    /// A directory of trust entries for model signatures (NAME.pub, NAME.ca.pem with an
    /// optional NAME.identity; a ConfigMap mount), read afresh at each verification
    /// (docs/signing.md) [default: none, nothing is trusted].
    #[arg(long, env = "MOUNTHOST_TRUST_DIR", global = true)]
    pub trust_dir: Option<PathBuf>,
    /// Every volume whose stage plan resolves or fetches an OCI artifact must be signed by an
    /// entry of the trust set (by its `signedBy` entries when it names some), whatever its
    /// plugin; no volume attribute turns this off.
    #[arg(long, env = "MOUNTHOST_REQUIRE_SIGNATURE", global = true)]
    pub require_signature: bool,
    /// The stock plugins this process offers, comma-separated, or `none`: a StorageClass or
    /// volume naming another one is refused as an unknown plugin.
    #[arg(long, env = "MOUNTHOST_STOCK_PLUGINS", value_delimiter = ',', value_parser = parse_stock_plugin, default_value = "seaweedfs,model", global = true)]
    pub stock_plugins: Vec<String>,
    /// Seconds a read of a lazy volume waits for bytes that are not on the node yet (the
    /// registry slow or gone) before it fails with EIO.
    #[arg(long, env = "MOUNTHOST_LAZY_READ_WAIT_SECS", default_value_t = crate::config::DEFAULT_LAZY_READ_WAIT_SECS, value_parser = clap::value_parser!(u64).range(1..=600), global = true)]
    pub lazy_read_wait_secs: u64,
    /// The chunk (MiB) a lazy volume fetches for a reader at least, aligned, and the unit of its
    /// read-ahead; a power of two from 1 to 64.
    #[arg(long, env = "MOUNTHOST_LAZY_CHUNK_MIB", default_value_t = crate::config::DEFAULT_LAZY_CHUNK_MIB, value_parser = parse_chunk_mib, global = true)]
    pub lazy_chunk_mib: u64,
    /// The memory (MiB) one lazy volume's FUSE server may use: its volume's cgroup gets this
    /// much per lazy server it runs (memory.max, or v1's memory.limit_in_bytes; page cache
    /// included, reclaimed first); 0: no limit.
    #[arg(long, env = "MOUNTHOST_LAZY_MEMORY_MIB", default_value_t = crate::config::DEFAULT_LAZY_MEMORY_MIB, value_parser = clap::value_parser!(u64).range(0..=1 << 20), global = true)]
    pub lazy_memory_mib: u64,
    /// The executable started as lazy volumes' FUSE server (`mounthost lazyfs`) [default: this
    /// binary].
    #[arg(long, env = "MOUNTHOST_LAZY_SERVER", global = true)]
    pub lazy_server: Option<PathBuf>,
    /// Log filter, e.g. `info` or `info,mounthost=debug`.
    #[arg(long, env = "MOUNTHOST_LOG", default_value = "info", global = true)]
    pub log: String,
}

/// One grant from the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantArg {
    plugin: String,
    what: GrantKind,
    value: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GrantKind {
    Program,
    Fstype,
    Host,
}

/// One `--program-args` value: option names denied to, or allowed for, a program's arguments,
/// or an environment variable allowed for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramArgsArg {
    program: String,
    rule: ProgramRule,
}

/// What one `--program-args` value says about its program.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ProgramRule {
    /// `deny=OPTION`, `deny=@SET`.
    Deny(Vec<OptionName>),
    /// `allow=OPTION`.
    Allow(Vec<OptionName>),
    /// `env=NAME`.
    Env(String),
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Inspect plugins and run their planners without mounting anything.
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
    /// Run the host daemon: the only process that mounts and supervises FUSE programs.
    Host,
    /// Run the CSI front on kubelet's socket.
    Csi(serve::CsiArgs),
    /// Run host daemon and CSI front together on local defaults (everything under --state-dir).
    Local(serve::LocalArgs),
    /// Drive a CSI socket by hand, the way kubelet does.
    Client(client::ClientArgs),
    /// The node's OCI blob cache, through the host daemon: pull (warm), ls, prune.
    #[command(subcommand)]
    Cache(cache::CacheCommand),
    /// A dynamic volume's mounts, through the socket in its published directory: create,
    /// list, get, delete, wait. Needs no host daemon socket and no root.
    Dynamic(dynamic::DynamicArgs),
    /// Model artifacts in their registry: publish a model's chunk index (signed or not), attach its
    /// signature.
    #[command(subcommand)]
    Model(model::ModelCommand),
    /// The FUSE server of a lazy model volume: started by the host daemon, unprivileged, with
    /// the FUSE connection and its control socket as descriptors; not run by hand.
    Lazyfs(lazyfs::LazyfsArgs),
}

impl GlobalArgs {
    /// The configuration these flags describe. Relative directories are taken from the
    /// current directory (`--state-dir .local` is the local, unprivileged setup).
    pub fn config(&self) -> std::io::Result<Config> {
        let mut cfg = Config::new(std::path::absolute(&self.state_dir)?);
        // Before the grants below: a stock plugin left out keeps only what --grant gives it.
        cfg.offer_stock(self.stock_plugins.iter().filter(|n| !n.is_empty()).cloned().collect());
        if let Some(dir) = &self.plugin_dir {
            cfg.plugin_dir = std::path::absolute(dir)?;
        }
        cfg.programs.extend(self.programs.iter().cloned());
        for g in &self.grants {
            let grant = cfg.grants.entry(g.plugin.clone()).or_default();
            let set = match g.what {
                GrantKind::Program => &mut grant.programs,
                GrantKind::Fstype => &mut grant.fstypes,
                GrantKind::Host => &mut grant.hosts,
            };
            set.insert(g.value.clone());
        }
        for a in &self.program_args {
            let rules = cfg.program_args.entry(a.program.clone()).or_default();
            match &a.rule {
                ProgramRule::Deny(names) => rules.deny.extend(names.iter().cloned()),
                ProgramRule::Allow(names) => rules.allow.get_or_insert_default().extend(names.iter().cloned()),
                ProgramRule::Env(name) => _ = rules.env.insert(name.clone()),
            }
        }
        cfg.program_rules = self.program_rules().map_err(std::io::Error::other)?;
        cfg.confine_programs = self.confine_programs;
        cfg.plugin_limits = Limits {
            deadline: Duration::from_millis(self.plugin_deadline_ms),
            memory_bytes: self.plugin_memory_mib << 20,
        };
        cfg.plugin_limits_by_name = self.plugin_limits.iter().cloned().collect::<BTreeMap<_, _>>();
        cfg.plugin_concurrency = self.plugin_concurrency;
        if let Some(k) = &self.kubelet_dir {
            cfg.kubelet_dir = std::path::absolute(k)?;
        }
        if let Some(s) = &self.host_socket {
            cfg.host_socket = std::path::absolute(s)?;
        }
        cfg.host_socket_group = self.host_socket_group;
        cfg.metrics_address = self.metrics_address;
        if let Some(n) = &self.node_id {
            cfg.node_id = n.clone();
        }
        cfg.fuse_stop_grace = Duration::from_secs(self.fuse_stop_grace_secs);
        cfg.fuse_ids = self.fuse_ids;
        cfg.fuse_max_file_bytes = (self.fuse_max_file_mib > 0).then(|| self.fuse_max_file_mib.saturating_mul(1 << 20));
        cfg.dynamic = crate::config::DynamicCaps {
            max_mounts: self.dynamic_max_mounts,
            // Resolved at the host daemon's start (`Config::resolve_byte_caps`).
            max_bytes: None,
            requests_per_minute: self.dynamic_requests_per_minute,
            burst: self.dynamic_burst,
        };
        cfg.fuse_caps = crate::config::caps::Caps {
            pids: (self.fuse_max_pids > 0).then_some(self.fuse_max_pids),
            io: self.fuse_io_max.clone(),
        };
        cfg.fuse_files_dir = self.fuse_files_dir.as_ref().map(std::path::absolute).transpose()?;
        cfg.cgroup_parent = self.cgroup_parent.clone();
        cfg.registries = crate::config::Registries {
            ca_bundle: self.registry_ca.as_ref().map(std::path::absolute).transpose()?,
            insecure: self.insecure_registries.iter().filter(|h| !h.is_empty()).cloned().collect(),
            proxy: self.registry_proxy.clone(),
            mirrors: self.registry_mirrors.iter().filter(|(r, _)| !r.is_empty()).cloned().collect(),
            cache_max_bytes: None,
            endpoints: {
                let mut m = std::collections::BTreeMap::<String, std::collections::BTreeSet<String>>::new();
                for (r, h) in self.registry_endpoints.iter().filter(|(r, _)| !r.is_empty()) {
                    m.entry(r.clone()).or_default().insert(h.clone());
                }
                m
            },
            download_stall: Duration::from_secs(self.download_stall_secs),
        };
        cfg.byte_caps = crate::config::ByteCaps {
            cache: crate::config::ByteCap::from_mib(self.cache_max_mib),
            dynamic: crate::config::ByteCap::from_mib(self.dynamic_max_mib),
        };
        cfg.allow_plugin_tags = self.allow_plugin_tags;
        cfg.signatures = crate::config::Signatures {
            trust_dir: self.trust_dir.as_ref().map(std::path::absolute).transpose()?,
            required: self.require_signature,
        };
        cfg.lazy = crate::config::LazyConfig {
            server: match &self.lazy_server {
                Some(p) => std::path::absolute(p)?,
                None => std::env::current_exe()?,
            },
            read_wait: Duration::from_secs(self.lazy_read_wait_secs),
            chunk_bytes: self.lazy_chunk_mib << 20,
            memory_limit: (self.lazy_memory_mib > 0).then_some(self.lazy_memory_mib << 20),
        };
        Ok(cfg)
    }
}

impl GlobalArgs {
    /// The rule set of each program: the built-in set of its name, then the sets of
    /// `--program-rules-dir` by their names, then what `--program-rules` names.
    fn program_rules(&self) -> Result<ProgramRules, String> {
        let mut rules = ProgramRules::builtin();
        let from_dir = match &self.program_rules_dir {
            Some(dir) => load_rule_sets(&std::path::absolute(dir).map_err(|e| e.to_string())?)?,
            None => BTreeMap::new(),
        };
        rules.sets.extend(from_dir.iter().map(|(n, s)| (n.clone(), s.clone())));
        for (program, set) in &self.program_rules {
            if program.is_empty() {
                continue;
            }
            match set.strip_prefix('@') {
                _ if set == "none" => _ = rules.sets.remove(program),
                Some(name) => {
                    let set = rules::builtin(name).ok_or_else(|| {
                        let known: Vec<String> = rules::BUILTIN.iter().map(|(n, _)| format!("@{n}")).collect();
                        format!(
                            "--program-rules {program}={set}: no built-in rule set {set} (built in: {})",
                            known.join(", ")
                        )
                    })?;
                    rules.sets.insert(program.clone(), set);
                }
                None => {
                    let found = from_dir.get(set).ok_or_else(|| match &self.program_rules_dir {
                        Some(dir) => format!(
                            "--program-rules {program}={set}: no rule set {set} in {} (a file {set}.yaml)",
                            dir.display()
                        ),
                        None => format!(
                            "--program-rules {program}={set}: rule sets by name come from --program-rules-dir, which is \
                             not set (built-in sets are named @{set})"
                        ),
                    })?;
                    rules.sets.insert(program.clone(), found.clone());
                }
            }
        }
        rules.host_fd_required = self.require_host_fd.iter().filter(|p| !p.is_empty()).cloned().collect();
        Ok(rules)
    }
}

/// The rule sets in `dir`: each `*.yaml` file, named by its `name`, which must be the file's
/// name without `.yaml`. Any other file is ignored; a file that does not parse is an error.
fn load_rule_sets(dir: &std::path::Path) -> Result<BTreeMap<String, std::sync::Arc<rules::RuleSet>>, String> {
    let mut sets = BTreeMap::new();
    let entries = std::fs::read_dir(dir).map_err(|e| format!("reading rule sets in {}: {e}", dir.display()))?;
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        let Some(stem) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".yaml")) else {
            continue;
        };
        // A ConfigMap volume's own entries (`..data`, `..2026_...`) are links and directories.
        if stem.starts_with('.') || !path.is_file() {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        let set = rules::RuleSet::parse(&path.display().to_string(), &text)?;
        if set.name != stem {
            return Err(format!("{}: its name is {:?}; name the file {}.yaml", path.display(), set.name, set.name));
        }
        sets.insert(set.name.clone(), std::sync::Arc::new(set));
    }
    Ok(sets)
}

/// One `--program-rules PROGRAM=SET` (empty: none, so that an empty variable is allowed).
fn parse_program_rules(s: &str) -> Result<(String, String), String> {
    if s.trim().is_empty() {
        return Ok((String::new(), String::new()));
    }
    let (program, set) = s.split_once('=').ok_or_else(|| {
        format!("{s:?}: expected PROGRAM=@SET (built in), PROGRAM=SET (--program-rules-dir) or PROGRAM=none")
    })?;
    let token = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if !token(program) || !token(set.strip_prefix('@').unwrap_or(set)) {
        return Err(format!("{s:?}: PROGRAM and SET are letters, digits, '.', '_' or '-'"));
    }
    Ok((program.to_string(), set.to_string()))
}

/// `--lazy-chunk-mib`: a power of two from 1 to 64.
fn parse_chunk_mib(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(n) if (1..=64).contains(&n) && n.is_power_of_two() => Ok(n),
        _ => Err(format!("{s:?} is not a power of two from 1 to 64 (MiB)")),
    }
}

/// A registry as references name it, `HOST[:PORT]`, lower-cased (blank: none); a scheme, a path
/// or credentials could never match a reference's registry, so they are refused at start.
fn parse_registry(s: &str) -> Result<String, String> {
    let host = s.trim().to_ascii_lowercase();
    if host.is_empty() || crate::plan::oci_ref::is_host_port(&host) {
        Ok(host)
    } else {
        Err(format!(
            "{s:?} is not a registry HOST[:PORT] as references name it (no scheme or path), e.g. 127.0.0.1:5000"
        ))
    }
}

/// One `--registry-mirror REGISTRY=MIRROR` (empty: none, so that an empty variable is allowed).
fn parse_mirror(s: &str) -> Result<(String, String), String> {
    if s.trim().is_empty() {
        return Ok((String::new(), String::new()));
    }
    let (registry, mirror) = s.split_once('=').ok_or_else(|| {
        format!("{s:?} is not REGISTRY=MIRROR (two HOST[:PORT]), e.g. docker.io=mirror.cluster.local:5000")
    })?;
    let (registry, mirror) = (parse_registry(registry)?, parse_registry(mirror)?);
    if registry.is_empty() || mirror.is_empty() || registry == mirror {
        return Err(format!("{s:?}: REGISTRY and MIRROR must be two different HOST[:PORT]"));
    }
    Ok((registry, mirror))
}

/// One `--registry-endpoint REGISTRY=HOST[:PORT]` (empty: none).
fn parse_endpoint(s: &str) -> Result<(String, String), String> {
    if s.trim().is_empty() {
        return Ok((String::new(), String::new()));
    }
    let (registry, host) = s.split_once('=').ok_or_else(|| {
        format!("{s:?} is not REGISTRY=HOST[:PORT] (two HOST[:PORT]), e.g. registry.example.com=auth.example.com")
    })?;
    let (registry, host) = (parse_registry(registry)?, parse_registry(host)?);
    if registry.is_empty() || host.is_empty() {
        return Err(format!("{s:?}: REGISTRY and HOST must both be HOST[:PORT]"));
    }
    Ok((registry, host))
}

/// One name of `--stock-plugins`: a stock plugin's, or `none` (also empty) for none of them.
fn parse_stock_plugin(s: &str) -> Result<String, String> {
    let name = s.trim();
    match name {
        "" | "none" => Ok(String::new()),
        _ if crate::stock::names().contains(&name) => Ok(name.to_string()),
        _ => Err(format!(
            "{s:?} is not a stock plugin; the stock plugins are {} (or `none` for none of them)",
            crate::stock::names().join(", ")
        )),
    }
}

/// A relative cgroup path: `/`-separated names of `[A-Za-z0-9._-]`, none `.` or `..`.
fn parse_cgroup_parent(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 255
        && s.split('/').all(|c| {
            !c.is_empty()
                && c != "."
                && c != ".."
                && c.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        });
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not a relative cgroup path (names of letters, digits, '.', '_' and '-' joined by '/')"))
    }
}

fn parse_program(s: &str) -> Result<(String, PathBuf), String> {
    let (name, path) = s.split_once('=').ok_or("expected NAME=/absolute/path")?;
    let path = PathBuf::from(path);
    if name.is_empty() || name.contains('/') {
        return Err(format!("program name {name:?} must be non-empty and contain no '/'"));
    }
    if !path.is_absolute() {
        return Err(format!("program path {} must be absolute", path.display()));
    }
    Ok((name.to_string(), path))
}

fn parse_grant(s: &str) -> Result<GrantArg, String> {
    let err = || format!("{s:?}: expected PLUGIN:program=NAME, PLUGIN:fstype=TYPE or PLUGIN:host=HOST[:PORT]");
    let (plugin, rest) = s.split_once(':').ok_or_else(err)?;
    let (what, value) = rest.split_once('=').ok_or_else(err)?;
    let what = match what {
        "program" => GrantKind::Program,
        "fstype" => GrantKind::Fstype,
        "host" => GrantKind::Host,
        _ => return Err(err()),
    };
    if plugin.is_empty() || value.is_empty() {
        return Err(err());
    }
    if what == GrantKind::Host {
        // Parsed as the policy parses it, so a grant that could never match is refused here.
        crate::plan::url::HostGrant::parse(value).map_err(|e| format!("{s:?}: {e}"))?;
    }
    Ok(GrantArg { plugin: plugin.into(), what, value: value.to_ascii_lowercase() })
}

/// `PROGRAM:deny=OPTION`, `PROGRAM:deny=@SET`, `PROGRAM:allow=OPTION` or `PROGRAM:env=NAME`.
fn parse_program_args(s: &str) -> Result<ProgramArgsArg, String> {
    let err = || {
        format!("{s:?}: expected PROGRAM:deny=OPTION, PROGRAM:deny=@sshfs, PROGRAM:allow=OPTION or PROGRAM:env=NAME")
    };
    let (program, rest) = s.split_once(':').ok_or_else(err)?;
    let (what, value) = rest.split_once('=').ok_or_else(err)?;
    if !matches!(what, "deny" | "allow" | "env") {
        return Err(err());
    }
    if program.is_empty() || program.contains('/') {
        return Err(format!("{s:?}: program name {program:?} must be non-empty and contain no '/'"));
    }
    let option = || OptionName::parse(value).map_err(|e| format!("{s:?}: {e}"));
    let rule = match (what, value.strip_prefix('@')) {
        ("env", _) => {
            crate::plan::policy::env_name(value).map_err(|e| format!("{s:?}: {e}"))?;
            ProgramRule::Env(value.into())
        }
        ("allow", Some(_)) => {
            return Err(format!("{s:?}: option sets such as {value} are deny sets; allow options one by one"));
        }
        ("allow", None) => ProgramRule::Allow(vec![option()?]),
        (_, Some(set)) => ProgramRule::Deny(option_set(set).ok_or_else(|| {
            let known: Vec<String> = OPTION_SETS.iter().map(|(n, _)| format!("@{n}")).collect();
            format!("{s:?}: unknown option set {value} (known: {})", known.join(", "))
        })?),
        (_, None) => ProgramRule::Deny(vec![option()?]),
    };
    Ok(ProgramArgsArg { program: program.into(), rule })
}

/// `IP:PORT`, where an IPv6 address may come without brackets (`fd00::1:9810`, as
/// `$(HOST_IP):9810` expands on an IPv6 node): the port is what follows the last `:`.
fn parse_listen_address(s: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(addr) = s.parse() {
        return Ok(addr);
    }
    let err = || format!("{s:?} is not IP:PORT (e.g. 0.0.0.0:9810, [::]:9810)");
    let (ip, port) = s.rsplit_once(':').ok_or_else(err)?;
    let ip: std::net::IpAddr = ip.trim_start_matches('[').trim_end_matches(']').parse().map_err(|_| err())?;
    Ok(std::net::SocketAddr::new(ip, port.parse().map_err(|_| err())?))
}

fn parse_limit(s: &str) -> Result<(String, Limits), String> {
    let err = || format!("{s:?}: expected NAME=DEADLINE_MS/MEMORY_MIB, e.g. model=2000/128");
    let (name, rest) = s.split_once('=').ok_or_else(err)?;
    let (ms, mib) = rest.split_once('/').ok_or_else(err)?;
    let ms: u64 = ms.parse().map_err(|_| err())?;
    let mib: u64 = mib.parse().map_err(|_| err())?;
    if ms == 0 || mib == 0 {
        return Err(err());
    }
    Ok((name.into(), Limits { deadline: Duration::from_millis(ms), memory_bytes: mib << 20 }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_rule_sets_directory_names_each_set_by_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let text = "name: mine\nchecked: {version: '1', command: [--version]}\nstyle: gnu\noptions: {--x: flag}\n";
        std::fs::write(dir.path().join("mine.yaml"), text).unwrap();
        std::fs::write(dir.path().join("README"), "not a set").unwrap();
        let sets = super::load_rule_sets(dir.path()).unwrap();
        assert_eq!(sets.keys().collect::<Vec<_>>(), ["mine"]);
        std::fs::write(dir.path().join("other.yaml"), text).unwrap();
        let err = super::load_rule_sets(dir.path()).unwrap_err();
        assert!(err.contains("other.yaml") && err.contains("mine.yaml"), "{err}");
    }

    #[test]
    fn listen_addresses_take_ipv6_with_or_without_brackets() {
        for (given, want) in [
            ("0.0.0.0:9810", "0.0.0.0:9810"),
            ("10.1.2.3:9810", "10.1.2.3:9810"),
            ("[fd00::1]:9810", "[fd00::1]:9810"),
            ("fd00::1:9810", "[fd00::1]:9810"),
        ] {
            assert_eq!(super::parse_listen_address(given).unwrap().to_string(), want, "{given}");
        }
        for bad in ["", "9810", "host:9810", "10.1.2.3", "10.1.2.3:x", "::1"] {
            assert!(super::parse_listen_address(bad).is_err(), "{bad} accepted");
        }
    }

    use super::*;

    #[test]
    fn insecure_registries_are_host_and_port_only() {
        assert_eq!(parse_registry(" Registry.Local:5000 ").unwrap(), "registry.local:5000");
        assert_eq!(parse_registry("127.0.0.1").unwrap(), "127.0.0.1");
        for bad in ["http://127.0.0.1:5055", "127.0.0.1:5055/v2", "u:p@reg.local", "reg.local:99999", "reg local"] {
            let e = parse_registry(bad).unwrap_err();
            assert!(e.contains("HOST[:PORT]"), "{bad}: {e}");
        }
    }

    #[test]
    fn registry_mirrors_map_one_host_to_another() {
        let m = |s| parse_mirror(s);
        assert_eq!(m("Docker.io=Mirror.Local:5000").unwrap(), ("docker.io".into(), "mirror.local:5000".into()));
        assert_eq!(m(" ").unwrap(), (String::new(), String::new()), "an empty variable sets none");
        for bad in
            ["docker.io", "docker.io=", "=mirror:5000", "a.io=a.io", "docker.io=http://m:5000", "docker.io=m/path"]
        {
            assert!(m(bad).is_err(), "{bad}");
        }
        let cli = Cli::try_parse_from(["mounthost", "--registry-mirror", "a.io=m:1,b.io=m:2", "host"]).unwrap();
        let mirrors = cli.global.config().unwrap().registries.mirrors;
        assert_eq!(mirrors.get("b.io").map(String::as_str), Some("m:2"));
        assert_eq!(mirrors.len(), 2);
    }

    #[test]
    fn host_grants_are_parsed_as_the_policy_parses_them() {
        assert_eq!(parse_grant("seaweedfs:host=Filer.Example:8888").unwrap().value, "filer.example:8888");
        for bad in ["s:host=a@b", "s:host=h:99999", "s:host=%31", "s:host=h:+80", "s:host=a b"] {
            assert!(parse_grant(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn flags_build_the_config() {
        let cli = Cli::try_parse_from([
            "mounthost",
            "--state-dir",
            "/tmp/s",
            "--program",
            "fusetest=/bin/true",
            "--grant",
            "x:fstype=tmpfs,x:host=Filer:8888",
            "--plugin-limit",
            "x=250/8",
            "plugin",
            "info",
            "seaweedfs",
        ])
        .unwrap();
        let cfg = cli.global.config().unwrap();
        assert_eq!(cfg.plugin_dir, PathBuf::from("/tmp/s/plugins"));
        assert_eq!(cfg.programs["fusetest"], PathBuf::from("/bin/true"));
        assert_eq!(cfg.programs["weed"], PathBuf::from(crate::config::DEFAULT_WEED));
        let g = cfg.grant("x");
        assert!(g.fstypes.contains("tmpfs") && g.hosts.contains("filer:8888"));
        assert_eq!(cfg.plugin_limits_by_name["x"].memory_bytes, 8 << 20);
        assert!(cfg.grant("seaweedfs").programs.contains("weed"));
        assert_eq!(cfg.cgroup_parent, "mounthost");
        let cli = Cli::try_parse_from(["mounthost", "--cgroup-parent", "system.slice/mounthost", "plugin", "list"]);
        assert_eq!(cli.unwrap().global.config().unwrap().cgroup_parent, "system.slice/mounthost");
    }

    #[test]
    fn program_args_flags_build_the_rules() {
        use crate::plan::policy::SSHFS_DENY;
        let cli = Cli::try_parse_from([
            "mounthost",
            "--program-args",
            "sshfs:deny=@sshfs,sshfs:deny=directport",
            "--program-args",
            "weed:allow=filer,weed:allow=-f",
            "--program-args",
            "weed:env=AWS_REGION,weed:env=HOME",
            "plugin",
            "list",
        ])
        .unwrap();
        let cfg = cli.global.config().unwrap();
        let sshfs = &cfg.program_args["sshfs"];
        assert_eq!(sshfs.deny.len(), SSHFS_DENY.len() + 1);
        assert!(sshfs.deny.contains(&OptionName::Long("proxycommand".into())) && sshfs.allow.is_none());
        assert!(sshfs.env.is_empty(), "@sshfs allows no environment variable");
        let weed = &cfg.program_args["weed"];
        assert!(weed.deny.is_empty());
        assert_eq!(weed.allow, Some([OptionName::Long("filer".into()), OptionName::Short('f')].into()));
        assert_eq!(weed.env, ["AWS_REGION".to_string(), "HOME".to_string()].into());
        // Without the flag, nothing is constrained: existing configurations keep working.
        let cli = Cli::try_parse_from(["mounthost", "plugin", "list"]).unwrap();
        assert!(cli.global.config().unwrap().program_args.is_empty());
        for (bad, why) in [
            ("sshfs", "expected PROGRAM:deny=OPTION"),
            ("sshfs:deny", "expected PROGRAM:deny=OPTION"),
            ("sshfs:block=x", "expected PROGRAM:deny=OPTION"),
            (":deny=x", "must be non-empty"),
            ("/bin/sshfs:deny=x", "contain no '/'"),
            ("sshfs:deny=--ssh_command", "without dashes"),
            ("sshfs:deny=-o", "-o introduces an option list"),
            ("sshfs:deny=", "must be -X"),
            ("sshfs:deny=@ssh", "unknown option set @ssh (known: @sshfs)"),
            ("sshfs:allow=@sshfs", "deny sets"),
            ("sshfs:env=", "must match [A-Za-z_][A-Za-z0-9_]*"),
            ("sshfs:env=SSH-ASKPASS", "must match [A-Za-z_][A-Za-z0-9_]*"),
            ("sshfs:env=LD_PRELOAD", "would change what the dynamic loader runs"),
            ("sshfs:env=@sshfs", "must match"),
        ] {
            let err = parse_program_args(bad).unwrap_err();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
    }

    #[test]
    fn stock_plugins_are_chosen_by_name() {
        let offered = |args: &[&str]| {
            let cli = Cli::try_parse_from([&["mounthost"], args, &["plugin", "list"]].concat()).unwrap();
            let cfg = cli.global.config().unwrap();
            (cfg.stock_plugins.iter().cloned().collect::<Vec<_>>(), cfg.grant("seaweedfs"))
        };
        assert_eq!(offered(&[]).0, ["model", "seaweedfs"]);
        let (names, seaweedfs) = offered(&["--stock-plugins", "model"]);
        assert_eq!(names, ["model"]);
        assert!(seaweedfs.programs.is_empty(), "a stock plugin left out keeps no default grant");
        // A grant given explicitly still applies (to a folder plugin of that name).
        let (_, seaweedfs) = offered(&["--stock-plugins", "model", "--grant", "seaweedfs:program=weed"]);
        assert!(seaweedfs.programs.contains("weed"));
        for none in ["none", ""] {
            assert!(offered(&["--stock-plugins", none]).0.is_empty(), "{none:?}");
        }
        let err = Cli::try_parse_from(["mounthost", "--stock-plugins", "model,seaweed", "plugin", "list"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation);
        let text = err.to_string();
        assert!(text.contains("\"seaweed\" is not a stock plugin; the stock plugins are seaweedfs, model"), "{text}");
    }

    #[test]
    fn relative_directories_become_absolute() {
        let cli = Cli::try_parse_from(["mounthost", "--state-dir", ".local", "plugin", "list"]).unwrap();
        let cfg = cli.global.config().unwrap();
        assert_eq!(cfg.state_dir, std::env::current_dir().unwrap().join(".local"));
        assert!(cfg.plugin_dir.is_absolute() && cfg.plugin_cache_dir().is_absolute());
    }

    #[test]
    fn bad_flags_are_refused() {
        for bad in [
            ["--program", "weed=relative/weed"],
            ["--grant", "x:device=/dev/sda"],
            ["--program-args", "sshfs:deny=--ssh_command"],
            ["--plugin-limit", "x=0/8"],
            ["--cgroup-parent", "../escape"],
            ["--cgroup-parent", "/absolute"],
            ["--cgroup-parent", "a//b"],
            ["--cgroup-parent", "sp ace"],
            ["--fuse-ids", "0-100"],
            ["--fuse-ids", "65000-66000"],
        ] {
            let err = Cli::try_parse_from(["mounthost", bad[0], bad[1], "plugin", "list"]).unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation, "{bad:?}");
        }
    }
}
