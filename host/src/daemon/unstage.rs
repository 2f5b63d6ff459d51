//! NodeUnstageVolume: what differs from the other RPCs.
//!
//! - Nothing recorded: whatever is still mounted at the staging path is cleared (and anything
//!   left in the volume's cgroup killed); OK. That is how a crash's leftovers go. But when a
//!   record of any volume holds something at, below or above that path (another volume's
//!   stage or pod), nothing is touched, a warning names the holder, and the answer is OK: CSI
//!   v1.12, "If the volume corresponding to the volume_id is not staged to the
//!   staging_target_path, the Plugin MUST reply 0 OK". The same guard as NodeUnpublishVolume's
//!   (`Node::recorded_at`).
//! - Staged elsewhere: OK, and nothing is touched (the same CSI sentence: the volume is not
//!   staged to that path), with a warning naming both paths. Still published (targets that kubelet has not
//!   unmounted yet): FAILED_PRECONDITION naming them; targets kubelet already removed are
//!   forgotten first.
//! - Otherwise the plugin's unstage planner adds its clean-up steps (the recorded build, or the
//!   current one when that is gone and the volume does not pin it; unstage works even if no
//!   build loads or its planner fails), `unstaging` is recorded before the first action, and
//!   the volume is forgotten after the last.

use std::path::Path;

use tracing::{info, warn};

use super::Node;
use super::diff::Desired;
use super::pipeline::{Job, Persist, Undo};
use crate::error::Error;
use crate::exec::mountinfo;
use crate::plan::policy::Operation;
use crate::plugin::bindings::types as wit;
use crate::proto::csi;
use crate::secrets::Secrets;
use crate::volume::request;
use crate::volume::state::Phase;

impl Node {
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

    /// Unstage under the volume's lock (also an ephemeral volume's last unpublish).
    pub(super) async fn unstage_locked(&self, id: &str, staging: &Path) -> Result<(), Error> {
        // A volume still waiting for its blobs waits no more (a download others share goes on);
        // a lazy volume's session ends, and its fill with it when no other volume wants the blobs.
        self.lazy_detach(id);
        self.inner.artifacts.lazy_forget(id).await;
        let Some(st) = self.inner.store.load(id)? else {
            // Not this volume's: an unknown id must not unmount another volume's stage or pod.
            if let Some(holder) = self.recorded_at(staging)? {
                warn!(
                    volume.id = %id,
                    path = %staging.display(),
                    holds = %holder,
                    "unstage of a volume with no record at a path another record holds: left alone"
                );
                return Ok(());
            }
            let job = Job::plain(
                id,
                Desired::Teardown {
                    staging: staging.to_path_buf(),
                    host_dirs: Vec::new(),
                    steps: Vec::new(),
                    process: None,
                },
                |_| Persist::Keep,
            );
            self.blocking(move |n| n.run_job(job)).await?;
            return Ok(());
        };
        // CSI: "If the volume corresponding to the volume_id is not staged to the
        // staging_target_path, the Plugin MUST reply 0 OK". Its stage elsewhere is left as it is.
        if st.staging_path != staging {
            warn!(
                volume.id = %id,
                path = %staging.display(),
                staged = %st.staging_path.display(),
                "unstage at a path the volume is not staged at: OK, and its stage is left as it is"
            );
            return Ok(());
        }
        // Targets kubelet unmounted and removed itself (or a reboot took) are forgotten.
        let st = self
            .blocking(move |n| {
                let mounts = n.mounts()?;
                let mut st = st;
                let before = st.published.len();
                st.published.retain(|t, _| mountinfo::at(&mounts, t).is_some());
                if st.published.len() != before {
                    n.inner.store.save(&st)?;
                }
                Ok(st)
            })
            .await?;
        if !st.can_unstage() {
            let targets: Vec<_> = st.published.keys().map(|p| p.display().to_string()).collect();
            return Err(Error::precondition(format!(
                "volume {id} is still published at {}; NodeUnpublishVolume first",
                targets.join(", ")
            )));
        }
        // Published nowhere now, so no server may answer for it: a dynamic publication forgotten
        // just above (its tmpfs unmounted behind the daemon's back) still had one, reachable
        // through the copy of its socket a pod's container holds.
        self.stop_dynamic(id);
        let dirs = self.dirs(id, Some(&st.staging_path), None);
        let steps = match self.resolve_build(id, &st.plugin, Some(&st.digest), st.pinned).await {
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
                let planned = match self.inner.runtime.call(&plugin, id, req).await {
                    Ok(wplan) => self.check(
                        &plugin,
                        Operation::Unstage,
                        &dirs,
                        &st.context,
                        st.ephemeral,
                        &Secrets::default(),
                        wplan,
                    ),
                    Err(e) => Err(e.into()),
                };
                match planned {
                    Ok(plan) => plan.steps,
                    // A planner that fails, or a plan the policy refuses, never keeps a volume
                    // staged: the host's own tear-down removes what the volume has anyway.
                    Err(e) => {
                        warn!(volume.id = %id, error = %e.message, "the plugin's unstage plan failed or was refused; the host tears down alone");
                        Vec::new()
                    }
                }
            }
            Err(e) => {
                warn!(volume.id = %id, error = %e.message, "the volume's plugin does not load; the host tears down alone");
                Vec::new()
            }
        };
        let mut host_dirs = self.host_dirs_of(id, &st.plan);
        if st.ephemeral {
            host_dirs.push(st.staging_path.parent().unwrap_or(&st.staging_path).to_path_buf());
        }
        let mut first = st.clone();
        first.phase = Phase::Unstaging;
        let job = Job {
            id: id.to_string(),
            desired: Desired::Teardown { staging: st.staging_path.clone(), host_dirs, steps, process: st.process },
            process: st.process,
            secrets: Secrets::default(),
            first: Some(first),
            keep_secrets: None,
            then: Box::new(|_| Persist::Remove),
            undo: Undo::Nothing,
        };
        self.blocking(move |n| n.run_job(job)).await?;
        let v = id.to_string();
        self.blocking(move |n| n.forget_dynamic_secrets(&v, None)).await?;
        self.inner.backoff.clear(id);
        info!(volume.id = %id, "unstaged");
        Ok(())
    }
}
