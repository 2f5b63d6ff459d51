//! NodeStageVolume: what differs from the other RPCs.
//!
//! - A volume already staged here, healthy, with the same context and a compatible capability:
//!   OK, nothing done. With a different context or an incompatible capability: ALREADY_EXISTS
//!   (CSI: "volume_id has already been staged ... but is incompatible"). At another staging
//!   path: FAILED_PRECONDITION.
//! - Otherwise the plugin's stage planner plans (a restage with the recorded build, or the
//!   current one when that is gone and the volume does not pin it), the policy checks, and the
//!   pipeline makes it from scratch: the `staging` record (with the plan, the process it
//!   replaces and the build used) and the referenced secrets are written before the first
//!   action, `staged` with the new process after the last. A failure tears down what the
//!   attempt made.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use tracing::{info, warn};

use super::Node;
use super::diff::{Desired, Root};
use super::dynamic::credentials::Given;
use super::pipeline::{Job, Persist, Undo};
use crate::error::Error;
use crate::plan::secret_refs;
use crate::plugin::bindings::types as wit;
use crate::proto::csi;
use crate::secrets::Secrets;
use crate::volume::request;
use crate::volume::state::{Phase, SCHEMA_VERSION, StagedCapability, VolumeState};

/// A stage as the pipeline sees it after validation.
pub(super) struct StageAsk {
    pub id: String,
    pub staging: PathBuf,
    /// Where creating the staging directory may start (kubelet creates its parent; the host
    /// creates an ephemeral volume's whole directory).
    pub staging_below: PathBuf,
    pub capability: wit::VolumeCapability,
    pub context: HashMap<String, String>,
    pub secrets: Secrets,
    pub ephemeral: bool,
}

/// The recorded form of a capability.
pub(super) fn staged_capability(c: &wit::VolumeCapability) -> StagedCapability {
    let mut mount_flags = c.mount_flags.clone();
    mount_flags.sort();
    StagedCapability {
        access_mode: request::access_mode_name(c.access_mode).into(),
        fs_type: c.fs_type.clone(),
        mount_flags,
    }
}

impl Node {
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
        let staging_below = staging.parent().unwrap_or(&staging).to_path_buf();
        // A dynamic volume's mounts pull with these when its publish brings none
        // (dynamic/credentials.rs); also a stage of a volume staged already brings them anew.
        let dynamic = req.volume_context.get(request::DYNAMIC_KEY).is_some_and(|v| v == "true");
        let kept = dynamic.then(|| (id.clone(), secrets.clone()));
        let ask =
            StageAsk { id, staging, staging_below, capability, context: req.volume_context, secrets, ephemeral: false };
        self.stage_locked(ask).await?;
        if let Some((v, s)) = kept {
            self.blocking(move |n| n.keep_dynamic_secrets(&v, false, Given::Stage, &s)).await?;
        }
        Ok(())
    }

    /// Stage under the volume's lock (also the first publish of an ephemeral volume).
    pub(super) async fn stage_locked(&self, ask: StageAsk) -> Result<(), Error> {
        let existing = self.inner.store.load(&ask.id)?;
        if let Some(st) = &existing {
            if st.staging_path != ask.staging {
                return Err(Error::precondition(format!(
                    "volume {} is already staged at {}, not {}",
                    ask.id,
                    st.staging_path.display(),
                    ask.staging.display()
                )));
            }
            self.compatible(st, &ask)?;
            if st.phase == Phase::Staged {
                let st2 = st.clone();
                let health = self.blocking(move |n| Ok(n.health(&st2))).await?;
                if health.healthy {
                    return Ok(());
                }
                warn!(volume.id = %ask.id, condition = %health.condition, "restaging an unhealthy volume");
            }
        }
        // A restage uses the recorded build (or, when it is gone and not pinned, the current one).
        let asked_digest = ask.context.get(request::DIGEST_KEY);
        let (plugin, source, pinned) = match &existing {
            Some(st) => {
                let pinned = st.pinned || asked_digest.is_some();
                let plugin =
                    self.resolve_build_with(&ask.id, &st.plugin, Some(&st.digest), pinned, &ask.secrets).await?;
                (plugin, st.source.clone(), pinned)
            }
            None => {
                let name = request::plugin_name(&ask.id, &ask.context)?;
                if crate::plugin::pulled::is_reference(&name) {
                    // Pulled once, pinned to the manifest it resolved to, for the volume's life.
                    let selected = self.select_pulled(&ask, &name, asked_digest).await?;
                    (selected.plugin, Some(selected.source), true)
                } else {
                    let digest = asked_digest.map(String::as_str);
                    (self.resolve_build(&ask.id, &name, digest, digest.is_some()).await?, None, digest.is_some())
                }
            }
        };
        let name = plugin.info.name.clone();
        let attrs = request::plugin_attrs(&ask.context);
        let dirs = self.dirs(&ask.id, Some(&ask.staging), None);
        let earlier = existing.as_ref().and_then(|s| s.verified.as_ref().map(|v| (v, &s.plan)));
        let (plan, verified) = self.stage_plan(&plugin, &ask, &attrs, &dirs, earlier).await?;
        let lazy = crate::plan::lazy::layers(&plan).is_some();
        let cached = lazy || plan.steps.iter().any(|s| matches!(s, crate::plan::Step::FetchBlob { .. }));
        let mut state = VolumeState {
            version: SCHEMA_VERSION,
            volume_id: ask.id.clone(),
            plugin: plugin.info.name.clone(),
            digest: plugin.digest.to_string(),
            pinned,
            source,
            boot_id: self.inner.boot_id.clone(),
            phase: Phase::Staging,
            staging_path: ask.staging.clone(),
            context: attrs,
            plan,
            process: existing.as_ref().and_then(|s| s.process),
            restarts: existing.as_ref().map(|s| s.restarts).unwrap_or(0),
            oom_kills: existing.as_ref().map(|s| s.oom_kills).unwrap_or(0),
            capability: Some(staged_capability(&ask.capability)),
            dynamic: existing.as_ref().map(|s| s.dynamic.clone()).unwrap_or_default(),
            fuse_id: existing.as_ref().and_then(|s| s.fuse_id),
            cgroup: existing
                .as_ref()
                .map(|s| s.cgroup.clone())
                .unwrap_or_else(|| self.inner.config.volume_cgroup(&crate::volume::dirs::volume_key(&ask.id))),
            published: existing.map(|s| s.published).unwrap_or_default(),
            ephemeral: ask.ephemeral,
            signed_by: request::signed_by(&ask.context)?,
            chunk_index_required: request::chunk_index_required(&ask.context)?,
            verified,
        };
        let staged = self
            .blocking(move |n| {
                // The volume's FUSE id, claimed until the job has recorded it.
                let _claim = n.assign_fuse_id(&mut state)?;
                n.run_job(n.stage_job(state, ask.staging_below, ask.secrets, false))
            })
            .await;
        if let Err(e) = staged {
            // A lazy stage registered its blobs as in use when it planned; a failed first stage
            // (its record rolled back) leaves none registered, and no download of them running.
            if lazy && matches!(self.inner.store.load(&ask.id), Ok(None)) {
                self.inner.artifacts.lazy_forget(&ask.id).await;
            }
            return Err(e);
        }
        self.inner.backoff.clear(&ask.id);
        if lazy {
            // Its server runs; from now on a session feeds it (reads on demand, the fill).
            self.lazy_attach(&ask.id);
        }
        if cached {
            // Now that this volume's blobs count as used, the cache may shrink to its cap.
            self.blocking(|n| {
                n.prune_to_cap();
                Ok(())
            })
            .await?;
        }
        info!(volume.id = %ask.id, plugin = %name, staging = %ask.staging.display(), "staged");
        Ok(())
    }

    /// A restage must ask for what is staged: the same plugin (and pinned digest), the same
    /// volume context, a compatible capability.
    fn compatible(&self, st: &VolumeState, ask: &StageAsk) -> Result<(), Error> {
        let refuse = |what: String| {
            Err(Error::exists(format!(
                "volume {} is already staged at {} with {what}; unstage it first",
                ask.id,
                st.staging_path.display()
            )))
        };
        if let Some(p) = ask.context.get(request::PLUGIN_KEY) {
            let (same, staged) = match &st.source {
                Some(source) => (crate::plugin::pulled::same_source(p, source), source),
                None => (*p == st.plugin, &st.plugin),
            };
            if !same {
                return refuse(format!("plugin {staged}, not {p}"));
            }
        }
        if let Some(d) = ask.context.get(request::DIGEST_KEY)
            && *d != st.digest
        {
            return refuse(format!("plugin digest {}, not {d}", st.digest));
        }
        let (staged_lazy, asked_lazy) = (crate::plan::lazy::layers(&st.plan).is_some(), request::lazy(&ask.context)?);
        if staged_lazy != asked_lazy {
            return refuse(format!("{} {staged_lazy}, not {asked_lazy}", request::LAZY_KEY));
        }
        let (signed_by, index) = (request::signed_by(&ask.context)?, request::chunk_index_required(&ask.context)?);
        if signed_by != st.signed_by {
            return refuse(format!(
                "{} {:?}, not {:?}",
                request::SIGNED_BY_KEY,
                st.signed_by.join(","),
                signed_by.join(",")
            ));
        }
        if index != st.chunk_index_required {
            return refuse(format!("{} required {}, not {index}", request::CHUNK_INDEX_KEY, st.chunk_index_required));
        }
        let attrs = request::plugin_attrs(&ask.context);
        if attrs != st.context {
            let differ: Vec<&String> = attrs
                .keys()
                .chain(st.context.keys())
                .filter(|k| attrs.get(*k) != st.context.get(*k))
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            let keys: Vec<&str> = differ.iter().map(|k| k.as_str()).collect();
            return refuse(format!("another volume context (differs in {})", keys.join(", ")));
        }
        if let Some(c) = &st.capability {
            let asked = staged_capability(&ask.capability);
            if *c != asked {
                return refuse(format!(
                    "capability {} fs_type {:?} mount flags {:?}, not {} {:?} {:?}",
                    c.access_mode, c.fs_type, c.mount_flags, asked.access_mode, asked.fs_type, asked.mount_flags
                ));
            }
        }
        Ok(())
    }

    /// The job that stages `state` (a `staging` record with its plan) from scratch: kubelet's
    /// stage, and the supervisor's restart (`healing`: the record is kept on failure).
    pub(super) fn stage_job(&self, state: VolumeState, staging_below: PathBuf, secrets: Secrets, healing: bool) -> Job {
        // The FUSE files directory of a host-mounted program is not among them: it is made on
        // its own tmpfs, which the spawn mounts first (daemon/secret_files.rs).
        let host_dirs = self.dirs(&state.volume_id, None, None).host_dirs();
        // Only the secrets the plan references, so a crashed FUSE process can be restarted.
        let kept: BTreeMap<String, String> =
            secret_refs(&state.plan).into_iter().filter_map(|k| secrets.get(&k).map(|v| (k, v.to_string()))).collect();
        let desired = Desired::Stage {
            staging: Root { path: state.staging_path.clone(), below: staging_below },
            host_dirs,
            steps: state.plan.steps.clone(),
            published: state.published.clone(),
            process: state.process,
        };
        let keep_record = healing || !state.published.is_empty();
        let node = self.clone();
        let done = state.clone();
        Job {
            id: state.volume_id.clone(),
            desired,
            process: state.process,
            secrets,
            first: Some(state.clone()),
            keep_secrets: Some(kept),
            then: Box::new(move |applied| {
                let mut st = done;
                st.phase = Phase::Staged;
                // The old process was stopped; the plan's own is the one that runs now (if any).
                st.process = applied.spawned;
                for gone in &applied.gone_targets {
                    // A dynamic volume's pod went away: its server and mounts go with it.
                    if st.published.remove(gone).is_some_and(|p| p.dynamic.is_some()) {
                        st.dynamic.clear();
                        node.stop_dynamic(&st.volume_id);
                    }
                }
                Persist::Save(Box::new(st))
            }),
            undo: Undo::Stage { state: Box::new(state), keep_record },
        }
    }

    /// Where an ephemeral volume is staged: `<state>/ephemeral/<key>/mount`.
    pub(super) fn ephemeral_staging(&self, id: &str) -> PathBuf {
        self.inner.config.state_dir.join("ephemeral").join(crate::volume::dirs::volume_key(id)).join("mount")
    }

    /// Where creating an ephemeral volume's directories may start.
    pub(super) fn state_dir(&self) -> &Path {
        &self.inner.config.state_dir
    }
}
