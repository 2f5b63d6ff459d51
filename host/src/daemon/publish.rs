//! NodePublishVolume and NodeUnpublishVolume: what differs from the other RPCs.
//!
//! Publish (the hot path: one blocking section, one mount-table read, at most one state write,
//! no plugin-folder scan unless the volume's recorded build is gone):
//! - the volume must be staged at the given staging path (FAILED_PRECONDITION otherwise); an
//!   ephemeral inline volume is staged here first, by the host itself, and unstaged again when
//!   the publish fails and leaves it published nowhere;
//! - the capability must be the one the volume was staged with: another one is
//!   FAILED_PRECONDITION ("exceeds capabilities"), or ALREADY_EXISTS at a target the volume is
//!   already published at ("published but is incompatible");
//! - a SINGLE_NODE_WRITER or SINGLE_NODE_SINGLE_WRITER volume may be published read-write at
//!   one target only, a SINGLE_NODE_READER_ONLY volume at one target only (FAILED_PRECONDITION:
//!   "exceeds capabilities");
//! - the volume's build of its plugin plans (the current build when the recorded one is gone
//!   and the volume does not pin it; see `Node::resolve_build`), the policy checks, the diff
//!   skips what the target already holds and refuses another mount there, or this volume with
//!   other flags (ALREADY_EXISTS);
//! - a read-only publish (`readonly`, or a SINGLE_NODE_READER_ONLY or MULTI_NODE_READER_ONLY
//!   access mode) is refused (INVALID_ARGUMENT, as any refused plan) when
//!   the plugin's plan mounts or binds nothing read-only at the volume's root in the target, or
//!   anything read-write at or below it: plugins are untrusted planners, and CSI's `readonly`
//!   ("the volume should be published as readonly") is the host's to keep;
//! - the target's parent must exist (the CO creates it); the target itself is created.
//!
//! Unpublish: nothing mounted at the target and no target afterwards (a target already gone is
//! OK); the publication is forgotten; an ephemeral volume's last unpublish unstages it. A target
//! the volume is not published at is cleared only when no readable volume record holds anything
//! at, below or above it (what a crash between a bind and its record leaves); otherwise
//! (another volume's stage or pod, this volume's own staging path, a directory inside a
//! volume) it is left as it is and the answer is OK: the volume is not published there
//! (`Node::recorded_at`, which NodeUnstageVolume of a volume with no record uses too).

use std::path::{Path, PathBuf};

use super::Node;
use super::diff::{Desired, Root};
use super::dynamic::credentials::Given;
use super::pipeline::{Job, Persist, Undo};
use super::stage::StageAsk;
use crate::error::Error;
use crate::plan::policy::Operation;
use crate::plan::{planned_readonly, read_only_publication};
use crate::plugin::bindings::types as wit;
use crate::proto::csi;
use crate::volume::request;
use crate::volume::state::{Phase, Publication, VolumeState};

impl Node {
    /// NodePublishVolume, the hot path: the state comes from memory, the plugin is found by its
    /// pinned digest without a folder scan, its plan usually from the memo, and everything from
    /// the lock to the reply runs as one blocking section (the rare plugin call runs in it
    /// through the runtime's handle). On a multi-thread runtime (the daemon's) that section is
    /// `block_in_place` on the request's own worker, which first hands its other tasks to
    /// another: no wake-up of a blocking thread and back. Like every node operation it runs to
    /// completion even if the caller goes away (it is synchronous inside one poll), holding the
    /// volume's lock until done; a panic is an INTERNAL error, as for every operation.
    pub async fn publish(&self, req: csi::NodePublishVolumeRequest) -> Result<(), Error> {
        let (this, rt) = (self.clone(), tokio::runtime::Handle::current());
        if rt.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread {
            let run =
                std::panic::AssertUnwindSafe(|| tokio::task::block_in_place(|| rt.block_on(this.publish_now(req))));
            return std::panic::catch_unwind(run)
                .unwrap_or_else(|_| Err(Error::internal("a node operation panicked".to_string())));
        }
        tokio::task::spawn_blocking(move || rt.block_on(this.publish_now(req)))
            .await
            .map_err(|e| Error::internal(format!("a node operation panicked: {e}")))?
    }

    /// Runs in a blocking section (see [`Node::publish`]): the state file and the syscalls run
    /// here directly. An inline volume that this call leaves staged without a target is
    /// unstaged again ([`Node::drop_unused_ephemeral`]).
    async fn publish_now(&self, req: csi::NodePublishVolumeRequest) -> Result<(), Error> {
        let t0 = std::time::Instant::now();
        let id = request::volume_id(&req.volume_id)?;
        let target = self.inner.roots.check("target_path", &req.target_path)?;
        let ephemeral = req.volume_context.get(request::EPHEMERAL_KEY).is_some_and(|v| v == "true");
        let result = self.publish_checked(req, id.clone(), target.clone(), ephemeral, t0).await;
        if let Err(e) = &result
            && ephemeral
        {
            self.drop_unused_ephemeral(&id, &target, e).await;
        }
        result
    }

    /// After a failed publish of an inline volume: unstage it if it is staged and published
    /// nowhere, and nothing is mounted at or below the target. kubelet sends no
    /// NodeUnpublishVolume for a publish that never succeeded, so a volume this call staged
    /// (or an earlier failed one did) would otherwise keep its mount and its FUSE process until
    /// the daemon's next start. A mount at the target (a bind that succeeded before a later
    /// step failed) keeps the volume staged: kubelet's retry finds it and records it. Best
    /// effort: the caller's error stands, whatever happens here.
    async fn drop_unused_ephemeral(&self, id: &str, target: &Path, cause: &Error) {
        // Another operation on the volume (kubelet's retry) decides for itself.
        let Ok(_guard) = self.inner.locks.try_lock(id) else { return };
        let Ok(Some(st)) = self.inner.store.load(id) else { return };
        if !st.ephemeral || st.phase != Phase::Staged || !st.published.is_empty() {
            return;
        }
        match self.mounts_touching(&[target]) {
            Ok(table) if table.iter().all(|m| !m.mount_point.starts_with(target)) => {}
            _ => return,
        }
        match self.unstage_locked(id, &st.staging_path).await {
            Ok(()) => tracing::info!(
                volume.id = %id,
                error = %cause.message,
                "an inline volume whose publish failed is unstaged again (kubelet's retry stages it anew)"
            ),
            Err(e) => tracing::warn!(
                volume.id = %id,
                error = %e.message,
                "unstaging an inline volume whose publish failed; the daemon's next start does it"
            ),
        }
    }

    /// The publish itself, for an `id` and `target` [`Node::publish_now`] checked.
    async fn publish_checked(
        &self,
        req: csi::NodePublishVolumeRequest,
        id: String,
        target: PathBuf,
        ephemeral: bool,
        t0: std::time::Instant,
    ) -> Result<(), Error> {
        let capability = request::capability(req.volume_capability.as_ref())?;
        request::map("volume_context", &req.volume_context)?;
        request::map("publish_context", &req.publish_context)?;
        let secrets = request::secrets(&req.secrets)?;
        let staging = if ephemeral {
            if !req.staging_target_path.is_empty() {
                return Err(Error::invalid("an ephemeral inline volume has no staging_target_path"));
            }
            self.ephemeral_staging(&id)
        } else if req.staging_target_path.is_empty() {
            return Err(Error::precondition(
                "staging_target_path is required (this driver has STAGE_UNSTAGE_VOLUME): NodeStageVolume first",
            ));
        } else {
            self.inner.roots.check("staging_target_path", &req.staging_target_path)?
        };
        if target == staging {
            return Err(Error::invalid("target_path and staging_target_path are the same path"));
        }
        let _guard = self.inner.locks.try_lock(&id)?;
        let mut state = self.inner.store.load(&id)?;
        if ephemeral && state.as_ref().is_none_or(|s| s.phase != Phase::Staged) {
            let ask = StageAsk {
                id: id.clone(),
                staging: staging.clone(),
                staging_below: self.state_dir().to_path_buf(),
                capability: capability.clone(),
                context: req.volume_context.clone(),
                secrets: secrets.clone(),
                ephemeral: true,
            };
            self.stage_locked(ask).await?;
            state = self.inner.store.load(&id)?;
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
        staged_with(&state, &capability, &target)?;
        let t_load = t0.elapsed();
        let t1 = std::time::Instant::now();
        // Pinned by the record, or by the attribute itself (records older than the flag).
        let pinned = state.pinned || req.volume_context.contains_key(request::DIGEST_KEY);
        let plugin = self.resolve_build(&id, &state.plugin, Some(&state.digest), pinned).await?;
        let digest = plugin.digest.to_string();
        let t_resolve = t1.elapsed();
        let wit_req = wit::PublishRequest {
            volume_id: id.clone(),
            context: request::kvs(&request::plugin_attrs(&req.volume_context)),
            secrets: request::secret_kvs(&secrets),
            capability: capability.clone(),
            readonly: req.readonly,
            recorded: state.plan.attributes.iter().map(|(k, v)| wit::Kv { key: k.clone(), value: v.clone() }).collect(),
        };
        let wplan = self.publish_plan(&plugin, &id, wit_req).await?;
        // A dynamic volume's own files go below the host's tmpfs at the target (dynamic.rs).
        let dynamic = request::dynamic_plugins(&req.volume_context, &state.plugin)?;
        let dynamic_limits = request::dynamic_limits(&req.volume_context)?;
        if let Err(above) = self.config().dynamic.check(&dynamic_limits) {
            // Already published here with these attributes: the node's caps were lowered since
            // (a restart with lower --dynamic-max-* flags). The pod keeps its volume, under the
            // lower of each (`DynamicCaps::effective`); a new publication is still refused.
            let republish =
                state.published.get(&target).is_some_and(|p| p.dynamic.is_some() && p.dynamic_limits == dynamic_limits);
            if !republish {
                return Err(above);
            }
            tracing::warn!(
                volume.id = %id,
                target = %target.display(),
                reason = %above.message,
                "a dynamic volume's attributes are above this node's caps, lowered since it was published; \
                 it keeps its publication under the node's caps"
            );
        }
        let content = if dynamic.is_some() { target.join(super::dynamic::VOLUME_DIR) } else { target.clone() };
        if dynamic.is_some() && !self.inner.exec.atomic_read_only_binds() {
            return Err(Error::precondition(format!(
                "volume {id} is dynamic, which needs Linux 5.12 or later (mount_setattr): on older kernels a \
                 read-only bind is attached writable first, and a running pod's copy of it would stay writable"
            )));
        }
        if dynamic.is_some()
            && let Some(other) = state.published.keys().find(|t| **t != target)
        {
            return Err(Error::precondition(format!(
                "volume {id} is dynamic and already published at {}; a dynamic volume serves one pod",
                other.display()
            )));
        }
        let dirs = self.dirs(&id, Some(&staging), Some(&content));
        let plan = self.check(&plugin, Operation::Publish, &dirs, &state.context, state.ephemeral, &secrets, wplan)?;
        // A signed volume's publication shows the pod the staged files, read-only, and nothing else.
        if self.signed(&state)
            && let Some(why) = super::signed::publish_beside(&plan, &staging)
        {
            return Err(super::signed::refusal(
                &format!("volume {id}"),
                "unsupported",
                "model",
                format!("plugin {}'s publish plan {why}: a signature covers only the staged files", plugin.info.name),
            ));
        }
        // A read-only publish gets a read-only volume whatever the plugin planned (a dynamic
        // volume's tmpfs and socket are the host's own steps, added below, and not judged), and
        // so does a read-only access mode: kubelet leaves `readonly` false for a ReadOnlyMany
        // volume unless the pod says readOnly.
        let reader_only = request::is_reader_only(capability.access_mode);
        if (req.readonly || reader_only)
            && let Err(why) = read_only_publication(&plan, &content)
        {
            let asked = if req.readonly {
                "the publish asked for read-only".to_string()
            } else {
                format!("its access mode is {}", request::access_mode_name(capability.access_mode))
            };
            return Err(Error::invalid(format!(
                "plan from plugin {} refused: it makes {why}, but {asked}",
                plugin.info.name
            )));
        }
        let t_plan = t1.elapsed();
        // Compatible with what is recorded? Compare what the plan makes, not the CO's flag.
        let readonly = planned_readonly(&plan, &content).unwrap_or(req.readonly);
        let steps = match &dynamic {
            Some(_) => super::dynamic::publication_steps(&target, plan.steps),
            None => plan.steps,
        };
        let publication = Publication { readonly, steps, dynamic, dynamic_limits };
        // Recorded with other flags or other steps (read-only, noexec, ...): the kernel keeps
        // what it has, so it is not the same publication.
        if let Some(p) = state.published.get(&target)
            && *p != publication
        {
            return Err(Error::exists(format!(
                "volume {id} is already published at {} {}, with other flags than asked; unpublish it first",
                target.display(),
                if p.readonly { "read-only" } else { "read-write" }
            )));
        }
        single_writer(&state, &capability, &target, readonly)?;
        let unchanged = state.published.get(&target) == Some(&publication);
        if publication.dynamic.is_some() {
            // Its mounts' registry credentials (dynamic/credentials.rs): this publish's secrets,
            // in place of an earlier publish's (a rotated Secret), kept before the socket serves.
            let (v, eph, s) = (id.clone(), state.ephemeral, secrets.clone());
            self.blocking(move |n| n.keep_dynamic_secrets(&v, eph, Given::Publish, &s)).await?;
        }
        let below = target.parent().unwrap_or(&target).to_path_buf();
        let job = Job {
            id: id.clone(),
            desired: Desired::Publish {
                staging,
                target: Root { path: target.clone(), below },
                steps: publication.steps.clone(),
            },
            process: None,
            secrets,
            first: None,
            keep_secrets: None,
            then: Box::new(move |_| {
                if unchanged {
                    return Persist::Keep;
                }
                let mut st = state;
                st.published.insert(target, publication);
                // The build used now (another one when the recorded build is gone and not pinned).
                st.digest = digest;
                st.pinned = pinned;
                Persist::Save(Box::new(st))
            }),
            undo: Undo::Nothing,
        };
        let t2 = std::time::Instant::now();
        self.run_job(job)?;
        tracing::debug!(
            load_us = t_load.as_micros() as u64,
            resolve_us = t_resolve.as_micros() as u64,
            plan_us = t_plan.as_micros() as u64,
            apply_us = t2.elapsed().as_micros() as u64,
            "publish timing"
        );
        Ok(())
    }

    /// NodeUnpublishVolume (to completion, see [`Node::detached`]).
    pub async fn unpublish(&self, req: csi::NodeUnpublishVolumeRequest) -> Result<(), Error> {
        self.detached(|n| async move { n.unpublish_now(req).await }).await
    }

    async fn unpublish_now(&self, req: csi::NodeUnpublishVolumeRequest) -> Result<(), Error> {
        let id = request::volume_id(&req.volume_id)?;
        let target = self.inner.roots.check("target_path", &req.target_path)?;
        let _guard = self.inner.locks.try_lock(&id)?;
        let state = self.inner.store.load(&id)?;
        // Not published there: the target is cleared only if no volume's record holds it.
        if !state.as_ref().is_some_and(|s| s.published.contains_key(&target))
            && let Some(holder) = self.recorded_at(&target)?
        {
            tracing::warn!(
                path = %target.display(),
                holds = %holder,
                "unpublish of a path the volume is not published at, which another record holds: left alone"
            );
            return Ok(());
        }
        if state.is_none() {
            // An ephemeral volume whose first publish is still waiting for its blobs.
            self.inner.artifacts.forget(&id);
        }
        let dynamic = state.as_ref().and_then(|s| s.published.get(&target)).is_some_and(|p| p.dynamic.is_some());
        // Lazy dynamic mounts: their servers, and the blobs they read (their mounts go with the
        // volume's mounts/ and cache).
        let (servers, lazy): (Vec<crate::exec::process::ProcessId>, Vec<String>) = match &state {
            Some(st) if dynamic => (
                st.dynamic.values().filter_map(|m| m.process).collect(),
                st.dynamic
                    .iter()
                    .filter(|(_, m)| crate::plan::lazy::layers_of(&m.steps).is_some())
                    .map(|(m, _)| super::dynamic::waiter(&id, m))
                    .collect(),
            ),
            _ => Default::default(),
        };
        if dynamic {
            // Its server and mounts in progress first: nothing may mount below the target now.
            self.stop_dynamic(&id);
            // Then the lazy mounts' servers (a crash after this leaves records whose servers
            // are gone, which a restarted daemon starts again until the unpublish is retried).
            self.blocking(move |n| {
                for p in servers.iter().filter(|p| n.inner.exec.is_alive(p)) {
                    n.inner.exec.stop(p, n.inner.config.fuse_stop_grace)?;
                }
                Ok(())
            })
            .await?;
        }
        let remaining = state.as_ref().map(|s| {
            let mut s = s.clone();
            s.published.remove(&target);
            s
        });
        let job = Job::plain(&id, Desired::Unpublish { target: target.clone() }, move |_| match state {
            Some(mut st) => match st.published.remove(&target) {
                Some(p) => {
                    if p.dynamic.is_some() {
                        st.dynamic.clear();
                    }
                    Persist::Save(Box::new(st))
                }
                None => Persist::Keep,
            },
            None => Persist::Keep,
        });
        self.blocking(move |n| n.run_job(job)).await?;
        if dynamic {
            let dir = self.dynamic_cache(&id);
            self.blocking(move |n| n.remove_host_dirs(vec![dir])).await?;
            let v = id.clone();
            self.blocking(move |n| n.forget_dynamic_secrets(&v, Some(Given::Publish))).await?;
            // Their downloads no other volume wants stop, and their partial files go.
            for key in lazy {
                self.inner.artifacts.lazy_forget(&key).await;
            }
        }
        if let Some(st) = remaining.filter(|s| s.ephemeral && s.published.is_empty()) {
            self.unstage_locked(&id, &st.staging_path).await?;
        }
        Ok(())
    }
}

/// Plans kept at most (then the memo starts afresh).
const MAX_MEMO: usize = 4096;

impl Node {
    /// What a volume record (any volume's, this one's included) keeps at `path`, below it or
    /// above it: a staging path or a publication, described for a log line. An unpublish that
    /// names such a path for a volume not published there, or an unstage of a volume with no
    /// record, must not clear it (it would unmount another volume's stage or pod, or remove a
    /// directory inside a volume).
    pub(super) fn recorded_at(&self, path: &std::path::Path) -> Result<Option<String>, Error> {
        let overlaps = |p: &std::path::Path| p.starts_with(path) || path.starts_with(p);
        for st in self.inner.store.all()? {
            if overlaps(&st.staging_path) {
                return Ok(Some(format!("volume {}'s staging path {}", st.volume_id, st.staging_path.display())));
            }
            if let Some(t) = st.published.keys().find(|t| overlaps(t)) {
                return Ok(Some(format!("volume {}'s publication at {}", st.volume_id, t.display())));
            }
        }
        Ok(None)
    }
}

impl Node {
    /// The plugin's publish plan. Planners are pure functions of their request (the contract:
    /// no clock, no randomness, no I/O), and a publish request names no path (the target is
    /// a root the policy resolves afterwards), so every publish of a volume with the same flags
    /// (another pod, kubelet's retry) gets the same plan: it is kept, by a digest of the plugin
    /// build and every field of the request, secrets included, and reused without a call.
    async fn publish_plan(
        &self,
        plugin: &crate::plugin::LoadedPlugin,
        id: &str,
        req: wit::PublishRequest,
    ) -> Result<wit::Plan, Error> {
        let key = publish_key(&plugin.digest.to_string(), &req);
        if let Some(plan) = self.inner.plans.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Ok(plan.clone());
        }
        let plan = self.inner.runtime.call(plugin, id, req).await?;
        let mut memo = self.inner.plans.lock().unwrap_or_else(|p| p.into_inner());
        if memo.len() >= MAX_MEMO {
            memo.clear();
        }
        memo.insert(key, plan.clone());
        Ok(plan)
    }
}

/// A digest of everything a publish planner sees, each field length-prefixed.
pub(super) fn publish_key(digest: &str, req: &wit::PublishRequest) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let mut put = |s: &[u8]| {
        h.update((s.len() as u64).to_le_bytes());
        h.update(s);
    };
    // Destructured whole: a field added to the request must be added to the key (or the memo
    // would answer a request that differs in it with another request's plan).
    let wit::PublishRequest { volume_id, context, secrets, capability, readonly, recorded } = req;
    let wit::VolumeCapability { access_mode, fs_type, mount_flags } = capability;
    put(digest.as_bytes());
    put(volume_id.as_bytes());
    for kvs in [context, secrets, recorded] {
        let mut sorted: Vec<&wit::Kv> = kvs.iter().collect();
        sorted.sort_by(|a, b| (&a.key, &a.value).cmp(&(&b.key, &b.value)));
        put(&(sorted.len() as u64).to_le_bytes());
        for kv in sorted {
            put(kv.key.as_bytes());
            put(kv.value.as_bytes());
        }
    }
    put(request::access_mode_name(*access_mode).as_bytes());
    put(fs_type.as_bytes());
    put(&(mount_flags.len() as u64).to_le_bytes());
    for f in mount_flags {
        put(f.as_bytes());
    }
    put(&[u8::from(*readonly)]);
    h.finalize().into()
}

/// A publish asks for the capability the volume was staged with (access mode, fs type and mount
/// flags; records older than that field are not checked). CSI: "COs SHOULD NOT call
/// NodePublishVolume a second time with a different volume_capability. If this happens, the
/// Plugin SHOULD return FAILED_PRECONDITION" ("Exceeds capabilities"); at a target it is already
/// published at with that capability, "Volume published but is incompatible": ALREADY_EXISTS.
fn staged_with(state: &VolumeState, capability: &wit::VolumeCapability, target: &PathBuf) -> Result<(), Error> {
    let Some(staged) = &state.capability else { return Ok(()) };
    let asked = super::stage::staged_capability(capability);
    if *staged == asked {
        return Ok(());
    }
    let show = |c: &crate::volume::state::StagedCapability| {
        format!("{} (fs_type {:?}, mount flags {:?})", c.access_mode, c.fs_type, c.mount_flags)
    };
    let id = &state.volume_id;
    if state.published.contains_key(target) {
        return Err(Error::exists(format!(
            "volume {id} is already published at {} with capability {}, not {}; unpublish it first",
            target.display(),
            show(staged),
            show(&asked)
        )));
    }
    Err(Error::precondition(format!(
        "volume {id} is staged with capability {}, and this publish asks for {}: it is published with the \
         capability it was staged with (to change it, unpublish and unstage it, then stage it again)",
        show(staged),
        show(&asked)
    )))
}

/// SINGLE_NODE_WRITER and SINGLE_NODE_SINGLE_WRITER: "can only be published once as read/write
/// on a single node, at any given time". A second target is refused when either it or one
/// already there is read-write. SINGLE_NODE_READER_ONLY: "can only be published once as
/// readonly on a single node, at any given time": any second target is refused.
fn single_writer(
    state: &VolumeState,
    capability: &wit::VolumeCapability,
    target: &PathBuf,
    readonly: bool,
) -> Result<(), Error> {
    use wit::AccessMode as M;
    let once = match capability.access_mode {
        M::SingleNodeWriter | M::SingleNodeSingleWriter => "read-write at one target only",
        M::SingleNodeReaderOnly => "at one target only",
        _ => return Ok(()),
    };
    let others: Vec<_> = state.published.iter().filter(|(t, _)| *t != target).collect();
    let refused =
        capability.access_mode == M::SingleNodeReaderOnly || !readonly || others.iter().any(|(_, p)| !p.readonly);
    match others.first() {
        Some((other, _)) if refused => Err(Error::precondition(format!(
            "volume {} has access mode {} and is already published at {}; it can be published {once}",
            state.volume_id,
            request::access_mode_name(capability.access_mode),
            other.display()
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> wit::PublishRequest {
        let kv = |k: &str, v: &str| wit::Kv { key: k.into(), value: v.into() };
        wit::PublishRequest {
            volume_id: "v".into(),
            context: vec![kv("a", "1"), kv("b", "2")],
            secrets: vec![kv("s", "secret")],
            capability: wit::VolumeCapability {
                access_mode: wit::AccessMode::SingleNodeMultiWriter,
                fs_type: String::new(),
                mount_flags: vec![],
            },
            readonly: false,
            recorded: vec![],
        }
    }

    #[test]
    fn the_plan_memo_key_covers_every_input_and_ignores_order() {
        let base = publish_key("sha256:x", &req());
        let mut reordered = req();
        reordered.context.reverse();
        assert_eq!(publish_key("sha256:x", &reordered), base, "map order does not matter");
        type Change = Box<dyn Fn(&mut wit::PublishRequest)>;
        let changes: Vec<(&str, Change)> = vec![
            ("volume", Box::new(|r| r.volume_id = "w".into())),
            ("context", Box::new(|r| r.context[0].value = "9".into())),
            ("secret", Box::new(|r| r.secrets[0].value = "other".into())),
            ("recorded", Box::new(|r| r.recorded.push(wit::Kv { key: "k".into(), value: "v".into() }))),
            ("mode", Box::new(|r| r.capability.access_mode = wit::AccessMode::SingleNodeWriter)),
            ("fs type", Box::new(|r| r.capability.fs_type = "ext4".into())),
            ("flags", Box::new(|r| r.capability.mount_flags.push("noatime".into()))),
            ("readonly", Box::new(|r| r.readonly = true)),
            // A value moved from one field into the next must not collide.
            (
                "boundary",
                Box::new(|r| {
                    r.context[0].key = "a1".into();
                    r.context[0].value = String::new();
                }),
            ),
        ];
        for (what, change) in changes {
            let mut r = req();
            change(&mut r);
            assert_ne!(publish_key("sha256:x", &r), base, "{what}");
        }
        assert_ne!(publish_key("sha256:y", &req()), base, "another build of the plugin");
    }
}
