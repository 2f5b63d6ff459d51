//! `mounthost host`: the host daemon. Everything in this folder runs in that process.
//!
//! - [`service`]: the gRPC service on the host socket (`proto/host.proto`).
//! - The node pipeline, one driver for every node RPC ([`pipeline`]):
//!
//!   ```text
//!   validate ─▶ per-volume lock ─▶ plugin plans ─▶ policy checks the plan
//!      ─▶ diff against one snapshot of the node ─▶ executor applies what is missing ─▶ state saved ─▶ reply
//!   ```
//!
//!   Each RPC supplies only what differs ([`stage`], [`publish`], [`unstage`]): which planner,
//!   what the volume must look like ([`diff::Desired`]) and which state transition follows.
//! - [`health`]: volume health, NodeGetVolumeStats, the volume list.
//! - [`reconcile`] at start, [`heal`] and [`supervise`] while running.
//!
//! Every effect goes through the [`Executor`]. Which record is written before which syscall is
//! in `docs/node-lifecycle.md`.

pub mod cache;
pub mod diff;
pub mod dynamic;
pub mod expand;
pub mod fuse_ids;
pub mod heal;
pub mod health;
pub mod lazy;
pub mod pipeline;
pub mod publish;
pub mod pull;
pub mod reconcile;
pub mod secret_files;
pub mod service;
pub mod signed;
pub mod stage;
pub mod supervise;
pub mod unstage;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use tracing::warn;

pub use health::Health;

use crate::config::Config;
use crate::error::Error;
use crate::exec::Executor;
use crate::plan::Plan;
use crate::plan::policy::{self, Context, Operation};
use crate::plugin::bindings::types as wit;
use crate::plugin::{LoadedPlugin, PluginError, PluginRuntime};
use crate::secrets::Secrets;
use crate::volume::request::Roots;
use crate::volume::state::StateStore;
use crate::volume::{VolumeDirs, VolumeLocks};

/// The host daemon's node side. Cheap to clone.
#[derive(Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    runtime: Arc<PluginRuntime>,
    store: StateStore,
    locks: Arc<VolumeLocks>,
    exec: Arc<dyn Executor>,
    roots: Roots,
    boot_id: String,
    backoff: heal::Backoff,
    /// Signalled whenever a FUSE process is started, so the supervisor watches it at once.
    spawned: tokio::sync::Notify,
    /// Publish plans by a digest of their inputs (see `publish.rs`).
    plans: std::sync::Mutex<std::collections::HashMap<[u8; 32], wit::Plan>>,
    /// The node's OCI blob cache and its downloads (see `pull.rs`).
    artifacts: Arc<crate::oci::Artifacts>,
    /// Unpacks and links the cache's blobs into volumes (the executor's side of the cache).
    assembler: Arc<crate::exec::artifacts::Assembler>,
    /// Dynamic volumes' servers and mounts in progress (see `dynamic`).
    dynamic: dynamic::Dynamic,
    /// FUSE ids chosen for stages in flight (see `fuse_ids`).
    fuse_claims: fuse_ids::Claims,
    /// Held while the FUSE files directory's tmpfs is checked and mounted (see `secret_files`).
    fuse_tmpfs: std::sync::Mutex<()>,
    /// Planning-time reads of backends (`lookup` steps, see `unpriv::lookup`).
    http: crate::unpriv::http::HttpClient,
    /// Lazy volumes' sessions (see `lazy`).
    lazies: lazy::Lazies,
}

impl Node {
    /// A node service over `exec`, keeping state under `config.state_dir`. The state and
    /// kubelet directories must be absolute and canonical (the CLI makes them so).
    pub fn new(config: Config, runtime: Arc<PluginRuntime>, exec: Arc<dyn Executor>) -> Result<Self, Error> {
        let schema = crate::volume::state::Schema::current(&config.cgroup_parent);
        let store = StateStore::open(&config.state_dir, exec.clone(), schema)?;
        // Callers name paths below kubelet's directory only; ephemeral volumes' staging directories
        // under the state directory are computed by the daemon itself.
        let roots = Roots::new([config.kubelet_dir.clone()]);
        let boot_id = exec.boot().map_err(|e| Error::internal(format!("reading the boot id: {e}")))?.id;
        let registries = crate::oci::RegistryConfig::of(&config.registries);
        let artifacts = crate::oci::Artifacts::new(config.state_dir.join("cache"), registries)
            .map_err(|e| Error::precondition(format!("setting up the OCI blob cache: {e}")))?;
        let artifacts = Arc::new(artifacts);
        Ok(Node {
            inner: Arc::new(Inner {
                config,
                runtime,
                store,
                locks: VolumeLocks::new(),
                exec,
                roots,
                boot_id,
                backoff: Default::default(),
                spawned: Default::default(),
                plans: Default::default(),
                assembler: crate::exec::artifacts::Assembler::new(artifacts.clone()),
                artifacts,
                dynamic: Default::default(),
                fuse_claims: Default::default(),
                fuse_tmpfs: Default::default(),
                http: Default::default(),
                lazies: Default::default(),
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The state store.
    pub fn store(&self) -> &StateStore {
        &self.inner.store
    }

    /// The node's OCI blob cache.
    pub fn artifacts(&self) -> &Arc<crate::oci::Artifacts> {
        &self.inner.artifacts
    }

    /// The executor.
    pub fn executor(&self) -> &Arc<dyn Executor> {
        &self.inner.exec
    }

    /// Run blocking work (syscalls, state files) off the async workers.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Node) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, Error> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || f(&this))
            .await
            .map_err(|e| Error::internal(format!("a node operation panicked: {e}")))?
    }

    /// Run an operation as a task of its own. A caller that goes away (kubelet's deadline, a
    /// killed front) drops only its wait: the operation keeps its volume's lock until it is
    /// done, so a retry meets Aborted while it runs and its finished result afterwards, never a
    /// second copy running alongside it.
    async fn detached<T, F>(&self, op: impl FnOnce(Node) -> F) -> Result<T, Error>
    where
        F: Future<Output = Result<T, Error>> + Send + 'static,
        T: Send + 'static,
    {
        tokio::spawn(op(self.clone())).await.map_err(|e| Error::internal(format!("a node operation panicked: {e}")))?
    }

    /// The directories of a volume for one operation.
    fn dirs(&self, id: &str, staging: Option<&Path>, target: Option<&Path>) -> VolumeDirs {
        let mut dirs = VolumeDirs::host_owned(&self.inner.config.state_dir, id);
        dirs.fuse_files = Some(self.fuse_files_dir(id));
        dirs.staging = staging.map(Path::to_path_buf);
        dirs.target = target.map(Path::to_path_buf);
        dirs
    }

    /// The build of plugin `name` a call on volume `id` uses (every lookup of a volume's
    /// plugin goes through here: stage, restage, publish, unstage). Without a digest: the
    /// current build. With one: that build while this node has it. When it has not (an image
    /// upgrade replaced a stock plugin, a `.wasm` was removed from the plugin folder and the daemon restarted):
    /// - a digest the user `pinned` (the `pluginDigest` volume attribute) is FAILED_PRECONDITION
    ///   saying how to install that build;
    /// - a digest merely recorded at stage gives way to the current build of the same plugin,
    ///   with a warning; the caller records the new digest when it saves the state anyway.
    ///
    /// Whatever build is returned, its plans go through the policy as always.
    ///
    /// A build pulled by OCI reference that is neither loaded nor in the node's blob cache any
    /// more is pulled again with no credentials: publish and unstage carry none for the
    /// registry (see [`Node::resolve_build_with`] for a call that does).
    async fn resolve_build(
        &self,
        id: &str,
        name: &str,
        digest: Option<&str>,
        pinned: bool,
    ) -> Result<Arc<LoadedPlugin>, Error> {
        self.resolve_build_with(id, name, digest, pinned, &Secrets::default()).await
    }

    /// [`Node::resolve_build`] for a call that carries the registry's credentials
    /// (`pluginRegistryAuth` in a restage's secrets), used if a pulled build must be pulled
    /// again.
    async fn resolve_build_with(
        &self,
        id: &str,
        name: &str,
        digest: Option<&str>,
        pinned: bool,
        secrets: &Secrets,
    ) -> Result<Arc<LoadedPlugin>, Error> {
        let runtime = &self.inner.runtime;
        let Some(digest) = digest else {
            return Ok(runtime.resolve(name, None).await?);
        };
        // A plugin pulled by OCI reference: exactly the recorded build, reloaded from the
        // node's blob cache (its compiled form from the compile cache) after a restart.
        if let Ok(Some(st)) = self.inner.store.load(id)
            && let Some(source) = st.source.as_deref().filter(|_| st.digest == digest && st.plugin == name)
        {
            let puller = self.puller();
            return crate::plugin::pulled::reload(runtime, &puller, source, digest, secrets, id).await;
        }
        match runtime.resolve(name, Some(digest)).await {
            Err(PluginError::UnknownDigest { known, .. }) if pinned => Err(Error::precondition(format!(
                "volume {id} is pinned (volume attribute {}) to build {digest} of plugin {name}, which is not \
                 installed on this node (installed builds: {known}); put the .wasm whose sha256 is that digest \
                 into the plugin folder {} (it is picked up without a restart) and retry",
                crate::volume::request::DIGEST_KEY,
                self.inner.config.plugin_dir.display()
            ))),
            Err(PluginError::UnknownDigest { .. }) => {
                let current = runtime.resolve(name, None).await?;
                warn!(volume.id = %id, plugin = %name, digest.old = %digest, digest.new = %current.digest,
                    "the build the volume was staged with is not installed any more and the volume does not pin it: using the current build");
                Ok(current)
            }
            other => Ok(other?),
        }
    }

    /// Plugins selected by OCI reference are pulled through the node's blob cache.
    fn puller(&self) -> crate::oci::PluginPull {
        crate::oci::PluginPull::new(self.inner.artifacts.clone(), None)
    }

    /// Policy over a plugin's plan, plus: every secret it references must be in the request.
    /// The volume's `attrs` grant the hosts their endpoint and OCI-reference values name only
    /// when they came from a StorageClass (or a PersistentVolume) an administrator wrote: an
    /// inline volume's attributes are the pod author's (`ephemeral`), and grant nothing, so a
    /// pod reaches only hosts the node grants the plugin (`--grant PLUGIN:host=...`).
    #[allow(clippy::too_many_arguments)]
    fn check(
        &self,
        plugin: &LoadedPlugin,
        operation: Operation,
        dirs: &VolumeDirs,
        attrs: &BTreeMap<String, String>,
        ephemeral: bool,
        secrets: &Secrets,
        wplan: wit::Plan,
    ) -> Result<Plan, Error> {
        let cfg = &self.inner.config;
        let grant = cfg.grant(&plugin.info.name);
        let ctx = Context {
            operation,
            plugin: &plugin.info.name,
            digest: plugin.digest.to_string(),
            grant: &grant,
            programs: &cfg.programs,
            program_args: &cfg.program_args,
            rules: &cfg.program_rules,
            endpoint_hosts: if ephemeral {
                Default::default()
            } else {
                policy::endpoint_hosts(&plugin.info, attrs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            },
            dirs,
            secrets,
        };
        let plan = policy::check(&ctx, wplan).inspect_err(|e| {
            if let Some(r) = &e.rule {
                crate::metrics::global().policy_refusal(&r.program, &r.rule);
            }
        })?;
        if crate::plan::secret_refs(&plan).iter().any(|k| k == crate::plugin::pulled::AUTH_SECRET_KEY) {
            return Err(Error::invalid(format!(
                "plugin {} references the secret {}, the host's credentials for pulling plugins, which plugins never get",
                plugin.info.name,
                crate::plugin::pulled::AUTH_SECRET_KEY
            )));
        }
        if let Some(key) = crate::plan::secret_refs(&plan).into_iter().find(|k| secrets.get(k).is_none()) {
            return Err(Error::invalid(format!(
                "plugin {} needs the secret {key:?}, which the request does not carry (check the StorageClass's secret references)",
                plugin.info.name
            )));
        }
        Ok(plan)
    }
}

#[cfg(test)]
mod tests;
