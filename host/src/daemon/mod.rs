//! The host daemon's node pipeline. Every operation follows the same steps:
//!
//! ```text
//! validate request ─▶ per-volume lock ─▶ plugin plans ─▶ policy checks the plan
//!    ─▶ diff against what the kernel has ─▶ executor applies what is missing ─▶ state saved ─▶ reply
//! ```
//!
//! The state transitions (which record is written before which syscall) are in
//! `docs/node-lifecycle.md`.

pub mod apply;
pub mod heal;
pub mod reconcile;
pub mod service;
pub mod supervise;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::config::Config;
use crate::error::Error;
use crate::exec::Executor;
use crate::plan::Plan;
use crate::plan::policy::{self, Context, Operation};
use crate::plugin::bindings::types as wit;
use crate::plugin::{LoadedPlugin, PluginRuntime};
use crate::proto::csi;
use crate::secrets::Secrets;
use crate::volume::request;
use crate::volume::state::{Phase, SCHEMA_VERSION, StateStore, VolumeState};
use crate::volume::{VolumeDirs, VolumeLocks};

/// How long a statvfs of a volume may take before the volume counts as hung.
const STATS_TIMEOUT: Duration = Duration::from_secs(5);

/// The node side of the host daemon. Cheap to clone.
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
    roots: request::Roots,
    boot_id: String,
    backoff: heal::Backoff,
    /// Signalled whenever a FUSE process is started, so the supervisor watches it at once.
    spawned: tokio::sync::Notify,
}

/// What a health check of one volume found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// Everything is in place.
    pub healthy: bool,
    /// Why not.
    pub condition: String,
}

impl Node {
    /// A node service over `exec`, keeping state under `config.state_dir`.
    pub fn new(config: Config, runtime: Arc<PluginRuntime>, exec: Arc<dyn Executor>) -> Result<Self, Error> {
        let store = StateStore::open(&config.state_dir)?;
        let roots = request::Roots::new([config.kubelet_dir.clone(), config.state_dir.join("ephemeral")]);
        let boot_id =
            crate::volume::state::boot_id().map_err(|e| Error::internal(format!("reading the boot id: {e}")))?;
        let locks = VolumeLocks::new();
        Ok(Node {
            inner: Arc::new(Inner {
                config,
                runtime,
                store,
                locks,
                exec,
                roots,
                boot_id,
                backoff: Default::default(),
                spawned: Default::default(),
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

    /// NodeStageVolume (to completion, see [`Node::detached`]).
    pub async fn stage(&self, req: csi::NodeStageVolumeRequest) -> Result<(), Error> {
        self.detached(|n| async move { n.stage_now(req).await }).await
    }

    async fn stage_now(&self, req: csi::NodeStageVolumeRequest) -> Result<(), Error> {
        let id = request::volume_id(&req.volume_id)?;
        let staging = self.inner.roots.check("staging_target_path", &req.staging_target_path)?;
        let capability = request::capability(req.volume_capability.as_ref())?;
        request::map("volume_context", &req.volume_context)?;
        request::map("publish_context", &req.publish_context)?;
        let secrets = request::secrets(&req.secrets)?;
        let _guard = self.inner.locks.try_lock(&id)?;
        let ask = StageAsk { id, staging, capability, context: req.volume_context, secrets, ephemeral: false };
        self.stage_locked(ask).await
    }

    async fn stage_locked(&self, ask: StageAsk) -> Result<(), Error> {
        let id = ask.id.clone();
        let existing = self.blocking(move |n| Ok(n.inner.store.load(&id)?)).await?;
        if let Some(st) = &existing {
            if st.staging_path != ask.staging {
                return Err(Error::precondition(format!(
                    "volume {} is already staged at {}, not {}",
                    ask.id,
                    st.staging_path.display(),
                    ask.staging.display()
                )));
            }
            if st.phase == Phase::Staged {
                let st2 = st.clone();
                let health = self.blocking(move |n| Ok(n.health(&st2))).await?;
                if health.healthy {
                    return Ok(());
                }
                warn!(volume.id = %ask.id, condition = %health.condition, "restaging an unhealthy volume");
            }
        }
        let name = match &existing {
            Some(st) => st.plugin.clone(),
            None => request::plugin_name(&ask.id, &ask.context)?,
        };
        let digest = match &existing {
            Some(st) => Some(st.digest.clone()),
            None => ask.context.get(request::DIGEST_KEY).cloned(),
        };
        let plugin = self.inner.runtime.resolve(&name, digest.as_deref()).await?;
        let attrs = request::plugin_attrs(&ask.context);
        let wit_req = wit::StageRequest {
            volume_id: ask.id.clone(),
            context: request::kvs(&attrs),
            secrets: request::secret_kvs(&ask.secrets),
            capability: ask.capability.clone(),
            ephemeral: ask.ephemeral,
        };
        let wplan = self.inner.runtime.call(&plugin, &ask.id, wit_req).await?;
        let dirs = self.dirs(&ask.id, Some(&ask.staging), None);
        let plan = self.check(&plugin, Operation::Stage, &dirs, &attrs, &ask.secrets, wplan)?;
        let state = VolumeState {
            version: SCHEMA_VERSION,
            volume_id: ask.id.clone(),
            plugin: plugin.info.name.clone(),
            digest: plugin.digest.to_string(),
            boot_id: self.inner.boot_id.clone(),
            phase: Phase::Staging,
            staging_path: ask.staging.clone(),
            context: attrs,
            plan,
            process: existing.as_ref().and_then(|s| s.process),
            restarts: existing.as_ref().map(|s| s.restarts).unwrap_or(0),
            oom_kills: existing.as_ref().map(|s| s.oom_kills).unwrap_or(0),
            published: existing.map(|s| s.published).unwrap_or_default(),
            ephemeral: ask.ephemeral,
        };
        let secrets = ask.secrets;
        self.blocking(move |n| n.apply_stage(state, &dirs, &secrets, false)).await?;
        info!(volume.id = %ask.id, plugin = %name, staging = %ask.staging.display(), "staged");
        Ok(())
    }

    /// NodeUnstageVolume (to completion, see [`Node::detached`]).
    pub async fn unstage(&self, req: csi::NodeUnstageVolumeRequest) -> Result<(), Error> {
        self.detached(|n| async move { n.unstage_now(req).await }).await
    }

    async fn unstage_now(&self, req: csi::NodeUnstageVolumeRequest) -> Result<(), Error> {
        let id = request::volume_id(&req.volume_id)?;
        let staging = self.inner.roots.check("staging_target_path", &req.staging_target_path)?;
        let _guard = self.inner.locks.try_lock(&id)?;
        self.unstage_locked(&id, &staging).await
    }

    async fn unstage_locked(&self, id: &str, staging: &Path) -> Result<(), Error> {
        let id_owned = id.to_string();
        let Some(mut st) = self.blocking(move |n| Ok(n.inner.store.load(&id_owned)?)).await? else {
            // Nothing recorded: make sure nothing is left mounted there, and say OK.
            let staging = staging.to_path_buf();
            return self.blocking(move |n| n.clear_mounts(&staging)).await;
        };
        if st.staging_path != staging {
            return Err(Error::precondition(format!(
                "volume {id} is staged at {}, not {}",
                st.staging_path.display(),
                staging.display()
            )));
        }
        let st2 = st.clone();
        st = self.blocking(move |n| n.forget_unmounted_targets(st2)).await?;
        if !st.can_unstage() {
            let targets: Vec<_> = st.published.keys().map(|p| p.display().to_string()).collect();
            return Err(Error::precondition(format!(
                "volume {id} is still published at {}; NodeUnpublishVolume first",
                targets.join(", ")
            )));
        }
        let dirs = self.dirs(id, Some(&st.staging_path), None);
        // The plugin's own clean-up steps; unstage must work even if the plugin no longer loads.
        let extra = match self.inner.runtime.resolve(&st.plugin, Some(&st.digest)).await {
            Ok(plugin) => {
                let req = wit::UnstageRequest {
                    volume_id: id.to_string(),
                    context: request::kvs(&st.context),
                    recorded: st
                        .plan
                        .attributes
                        .iter()
                        .map(|(k, v)| wit::Kv { key: k.clone(), value: v.clone() })
                        .collect(),
                };
                match self.inner.runtime.call(&plugin, id, req).await {
                    Ok(wplan) => {
                        Some(self.check(&plugin, Operation::Unstage, &dirs, &st.context, &Secrets::default(), wplan)?)
                    }
                    Err(e) => {
                        warn!(volume.id = %id, error = %e, "the plugin's unstage planner failed; the host tears down alone");
                        None
                    }
                }
            }
            Err(e) => {
                warn!(volume.id = %id, error = %e, "the volume's plugin does not load; the host tears down alone");
                None
            }
        };
        self.blocking(move |n| n.apply_unstage(st, extra, &dirs)).await?;
        info!(volume.id = %id, "unstaged");
        Ok(())
    }

    /// NodePublishVolume (to completion, see [`Node::detached`]).
    pub async fn publish(&self, req: csi::NodePublishVolumeRequest) -> Result<(), Error> {
        self.detached(|n| async move { n.publish_now(req).await }).await
    }

    async fn publish_now(&self, req: csi::NodePublishVolumeRequest) -> Result<(), Error> {
        let id = request::volume_id(&req.volume_id)?;
        let target = self.inner.roots.check("target_path", &req.target_path)?;
        let capability = request::capability(req.volume_capability.as_ref())?;
        request::map("volume_context", &req.volume_context)?;
        request::map("publish_context", &req.publish_context)?;
        let secrets = request::secrets(&req.secrets)?;
        let ephemeral = req.volume_context.get(request::EPHEMERAL_KEY).is_some_and(|v| v == "true");
        let staging = if ephemeral {
            if !req.staging_target_path.is_empty() {
                return Err(Error::invalid("an ephemeral inline volume has no staging_target_path"));
            }
            self.inner.config.state_dir.join("ephemeral").join(crate::volume::dirs::volume_key(&id)).join("mount")
        } else if req.staging_target_path.is_empty() {
            return Err(Error::invalid("staging_target_path is required (this driver has STAGE_UNSTAGE_VOLUME)"));
        } else {
            self.inner.roots.check("staging_target_path", &req.staging_target_path)?
        };
        if target == staging {
            return Err(Error::invalid("target_path and staging_target_path are the same path"));
        }
        let _guard = self.inner.locks.try_lock(&id)?;
        let t0 = std::time::Instant::now();
        let id2 = id.clone();
        let mut state = self.blocking(move |n| Ok(n.inner.store.load(&id2)?)).await?;
        let t_load = t0.elapsed();
        if ephemeral && state.as_ref().is_none_or(|s| s.phase != Phase::Staged) {
            let ask = StageAsk {
                id: id.clone(),
                staging: staging.clone(),
                capability: capability.clone(),
                context: req.volume_context.clone(),
                secrets: secrets.clone(),
                ephemeral: true,
            };
            self.stage_locked(ask).await?;
            let id2 = id.clone();
            state = self.blocking(move |n| Ok(n.inner.store.load(&id2)?)).await?;
        }
        let Some(state) = state else {
            return Err(Error::precondition(format!(
                "volume {id} is not staged on this node; NodeStageVolume must succeed first"
            )));
        };
        if state.staging_path != staging {
            return Err(Error::precondition(format!(
                "volume {id} is staged at {}, not at {}",
                state.staging_path.display(),
                staging.display()
            )));
        }
        if !state.can_publish() {
            return Err(Error::precondition(format!(
                "volume {id} is not staged yet (phase {:?}); retry NodeStageVolume",
                state.phase
            )));
        }
        let t1 = std::time::Instant::now();
        let plugin = self.inner.runtime.resolve(&state.plugin, Some(&state.digest)).await?;
        let t_resolve = t1.elapsed();
        let wit_req = wit::PublishRequest {
            volume_id: id.clone(),
            context: request::kvs(&request::plugin_attrs(&req.volume_context)),
            secrets: request::secret_kvs(&secrets),
            capability,
            readonly: req.readonly,
            recorded: state.plan.attributes.iter().map(|(k, v)| wit::Kv { key: k.clone(), value: v.clone() }).collect(),
        };
        let wplan = self.inner.runtime.call(&plugin, &id, wit_req).await?;
        let dirs = self.dirs(&id, Some(&staging), Some(&target));
        let plan = self.check(&plugin, Operation::Publish, &dirs, &state.context, &secrets, wplan)?;
        let t_plan = t1.elapsed();
        // Compatible with what is recorded? Compare what the plan makes, not the CO's flag.
        let readonly = crate::plan::planned_readonly(&plan, &target).unwrap_or(req.readonly);
        if let Some(p) = state.published.get(&target)
            && p.readonly != readonly
        {
            return Err(Error::exists(format!(
                "volume {id} is already published at {} {}; unpublish it first",
                target.display(),
                if p.readonly { "read-only" } else { "read-write" }
            )));
        }
        let t2 = std::time::Instant::now();
        let r = self.blocking(move |n| n.apply_publish(state, &plan, &target, readonly)).await;
        tracing::debug!(
            load_us = t_load.as_micros() as u64,
            resolve_us = t_resolve.as_micros() as u64,
            plan_us = t_plan.as_micros() as u64,
            apply_us = t2.elapsed().as_micros() as u64,
            "publish timing"
        );
        r
    }

    /// NodeUnpublishVolume (to completion, see [`Node::detached`]).
    pub async fn unpublish(&self, req: csi::NodeUnpublishVolumeRequest) -> Result<(), Error> {
        self.detached(|n| async move { n.unpublish_now(req).await }).await
    }

    async fn unpublish_now(&self, req: csi::NodeUnpublishVolumeRequest) -> Result<(), Error> {
        let id = request::volume_id(&req.volume_id)?;
        let target = self.inner.roots.check("target_path", &req.target_path)?;
        let _guard = self.inner.locks.try_lock(&id)?;
        let id2 = id.clone();
        let state = self.blocking(move |n| Ok(n.inner.store.load(&id2)?)).await?;
        let remaining = self.blocking(move |n| n.apply_unpublish(state, &target)).await?;
        if let Some(st) = remaining.filter(|s| s.ephemeral && s.published.is_empty()) {
            self.unstage_locked(&id, &st.staging_path).await?;
        }
        Ok(())
    }

    /// NodeGetVolumeStats.
    pub async fn stats(&self, req: csi::NodeGetVolumeStatsRequest) -> Result<csi::NodeGetVolumeStatsResponse, Error> {
        let id = request::volume_id(&req.volume_id)?;
        let path = request::lexical("volume_path", &req.volume_path)?;
        let id2 = id.clone();
        let Some(st) = self.blocking(move |n| Ok(n.inner.store.load(&id2)?)).await? else {
            return Err(Error::not_found(format!("volume {id} is not staged on this node")));
        };
        if st.staging_path != path && !st.published.contains_key(&path) {
            return Err(Error::not_found(format!("volume {id} is neither staged nor published at {}", path.display())));
        }
        let st2 = st.clone();
        let mut health = self.blocking(move |n| Ok(n.health(&st2))).await?;
        if let Some(reason) = self.gave_up(&id) {
            health = Health { healthy: false, condition: join(&health, &reason) };
        }
        let exec = self.inner.exec.clone();
        let p2 = path.clone();
        let usage = tokio::time::timeout(STATS_TIMEOUT, tokio::task::spawn_blocking(move || exec.usage(&p2))).await;
        let (usage, condition) = match usage {
            Ok(Ok(Ok(u))) if health.healthy => (u, health),
            Ok(Ok(Ok(u))) => (u, health),
            Ok(Ok(Err(e))) => (
                Default::default(),
                Health { healthy: false, condition: join(&health, &format!("statfs {}: {e}", path.display())) },
            ),
            Ok(Err(e)) => return Err(Error::internal(format!("statfs task: {e}"))),
            Err(_) => (
                Default::default(),
                Health {
                    healthy: false,
                    condition: join(
                        &health,
                        &format!("statfs {} did not answer within {STATS_TIMEOUT:?}", path.display()),
                    ),
                },
            ),
        };
        use csi::volume_usage::Unit;
        let to_i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let usage_list = if usage.total_bytes == 0 && usage.total_inodes == 0 && !condition.healthy {
            Vec::new()
        } else {
            vec![
                csi::VolumeUsage {
                    available: to_i(usage.available_bytes),
                    total: to_i(usage.total_bytes),
                    used: to_i(usage.used_bytes),
                    unit: Unit::Bytes as i32,
                },
                csi::VolumeUsage {
                    available: to_i(usage.free_inodes),
                    total: to_i(usage.total_inodes),
                    used: to_i(usage.used_inodes),
                    unit: Unit::Inodes as i32,
                },
            ]
        };
        Ok(csi::NodeGetVolumeStatsResponse {
            usage: usage_list,
            volume_condition: Some(csi::VolumeCondition {
                abnormal: !condition.healthy,
                message: if condition.healthy { "healthy".into() } else { condition.condition },
            }),
        })
    }

    /// Every volume with state, and its health now.
    pub async fn list(&self) -> Result<Vec<(VolumeState, Health)>, Error> {
        self.blocking(|n| {
            let mut out = Vec::new();
            let mounts = n.mount_table()?;
            for (path, parsed) in n.inner.store.list()? {
                match parsed {
                    Ok(st) => {
                        let h = n.health_in(&st, &mounts);
                        out.push((st, h));
                    }
                    Err(e) => warn!(path = %path.display(), error = %e, "unusable state file"),
                }
            }
            Ok(out)
        })
        .await
    }

    /// The directories of a volume for one operation.
    fn dirs(&self, id: &str, staging: Option<&Path>, target: Option<&Path>) -> VolumeDirs {
        let mut dirs = VolumeDirs::host_owned(&self.inner.config.state_dir, id);
        dirs.staging = staging.map(Path::to_path_buf);
        dirs.target = target.map(Path::to_path_buf);
        dirs
    }

    /// Policy over a plugin's plan, plus: every secret it references must be in the request.
    fn check(
        &self,
        plugin: &LoadedPlugin,
        operation: Operation,
        dirs: &VolumeDirs,
        attrs: &BTreeMap<String, String>,
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
            endpoint_hosts: policy::endpoint_hosts(&plugin.info, attrs.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
            dirs,
            secrets,
        };
        let plan = policy::check(&ctx, wplan)?;
        if let Some(key) = crate::plan::secret_refs(&plan).into_iter().find(|k| secrets.get(k).is_none()) {
            return Err(Error::invalid(format!(
                "plugin {} needs the secret {key:?}, which the request does not carry (check the StorageClass's secret references)",
                plugin.info.name
            )));
        }
        Ok(plan)
    }
}

/// A stage as the pipeline sees it after validation.
struct StageAsk {
    id: String,
    staging: PathBuf,
    capability: wit::VolumeCapability,
    context: std::collections::HashMap<String, String>,
    secrets: Secrets,
    ephemeral: bool,
}

fn join(h: &Health, more: &str) -> String {
    if h.healthy { more.to_string() } else { format!("{}; {more}", h.condition) }
}

#[cfg(test)]
mod tests;
