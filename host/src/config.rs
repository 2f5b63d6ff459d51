//! Host configuration: plain data that tests build directly and the CLI fills from flags
//! and `MOUNTHOST_*` environment variables.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::plan::policy::Grant;
use crate::plugin::{Limits, RuntimeConfig};

/// Default state directory on a Kubernetes node.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/mounthost";
/// kubelet's root directory on a Kubernetes node.
pub const DEFAULT_KUBELET_DIR: &str = "/var/lib/kubelet";
/// The CSI driver name.
pub const DRIVER_NAME: &str = "csi.mounthost.dev";
/// The cgroup (below the hierarchy's root) under which each volume gets a group of its own.
pub const DEFAULT_CGROUP_PARENT: &str = "mounthost";
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
    /// The host daemon's socket (front ↔ host).
    pub host_socket: PathBuf,
    /// The group of the host daemon's socket: with one, the socket is 0660 in that group (a
    /// non-root front in the group may connect); without, 0600.
    pub host_socket_group: Option<u32>,
    /// Where `/metrics`, `/healthz` and `/readyz` are served (none: not served).
    pub metrics_address: Option<std::net::SocketAddr>,
    /// The cgroup (relative to the hierarchy's root) under which each volume's FUSE processes
    /// get a group of their own.
    pub cgroup_parent: String,
    /// How the node's OCI blob cache reaches registries.
    pub registries: Registries,
}

/// Registry access and the size of the node's OCI blob cache (`<state>/cache`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Registries {
    /// PEM bundle of extra CA certificates trusted for registries, besides the system roots.
    pub ca_bundle: Option<PathBuf>,
    /// Registries (`host` or `host:port`) reached over plain HTTP when a plan asks so.
    pub insecure: std::collections::BTreeSet<String>,
    /// An HTTP(S) proxy for registry traffic (P2P distribution systems that act as one).
    pub proxy: Option<String>,
    /// Blobs no staged volume uses are evicted, least recently used first, above this size.
    pub cache_max_bytes: Option<u64>,
}

/// The proxy URL may carry credentials (`http://user:password@proxy:3128`): never printed.
impl std::fmt::Debug for Registries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registries")
            .field("ca_bundle", &self.ca_bundle)
            .field("insecure", &self.insecure)
            .field("proxy", &self.proxy.as_ref().map(|_| "<set>"))
            .field("cache_max_bytes", &self.cache_max_bytes)
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
            grants,
            plugin_limits: Limits::default(),
            plugin_limits_by_name: BTreeMap::new(),
            plugin_concurrency: 64,
            kubelet_dir: PathBuf::from(DEFAULT_KUBELET_DIR),
            node_id: default_node_id(),
            fuse_stop_grace: std::time::Duration::from_secs(10),
            cgroup_parent: DEFAULT_CGROUP_PARENT.to_string(),
            registries: Registries::default(),
        }
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
            ..RuntimeConfig::default()
        }
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
    fn the_proxy_url_is_never_printed() {
        let r = Registries { proxy: Some("http://user:hunter2@proxy:3128".into()), ..Default::default() };
        let printed = format!("{:?}", Config { registries: r, ..Config::default() });
        assert!(!printed.contains("hunter2") && printed.contains("<set>"), "{printed}");
    }
}
