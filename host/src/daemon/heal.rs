//! Self-heal: a supervisor pass (on a process exit at once, else every 5 s; see
//! [`super::supervise`]) restarts the FUSE process of
//! any volume whose process died or whose staging mount vanished, with the plan recorded at
//! stage (plans are data; the plugin is not asked again) and the secrets kept for it. The
//! restage detaches the dead mount (lazily if busy), mounts again and re-binds every published
//! target, so pods with `mountPropagation: HostToContainer` see a working path again.
//!
//! Retries back off (2 s, 4 s, 8 s, 16 s); after [`MAX_FAILURES`] failures in a row
//! the host stops trying and the volume's condition stays abnormal with the reason, until
//! kubelet's next NodeStageVolume.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::{error, info, warn};

use super::Node;
use crate::exec::process::ProcessId;
use crate::secrets::Secrets;
use crate::volume::state::Phase;

/// Failures in a row after which the host stops restarting a volume by itself.
pub const MAX_FAILURES: u32 = 5;

/// Per-volume retry bookkeeping (in memory: a restarted daemon starts afresh).
#[derive(Debug, Default)]
pub struct Backoff {
    by_volume: Mutex<HashMap<String, (u32, Instant)>>,
}

impl Backoff {
    /// Forget a volume's failures: it was staged again (by kubelet or a restart) or is gone.
    pub fn clear(&self, volume_id: &str) {
        self.by_volume.lock().unwrap_or_else(|p| p.into_inner()).remove(volume_id);
    }
}

/// What the supervisor should do now.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Survey {
    /// Volumes to restart.
    pub broken: Vec<String>,
    /// Live processes of healthy staged volumes, to watch.
    pub watch: Vec<(String, ProcessId)>,
}

impl Node {
    /// Volumes to restart now: backed by a process, broken, and not waiting out a backoff.
    pub fn broken(&self) -> Vec<String> {
        self.survey().broken
    }

    /// One look at every volume (one listing, one mount table): what to restart now and what
    /// to watch.
    pub fn survey(&self) -> Survey {
        let mut survey = Survey::default();
        let Ok(mounts) = self.mounts() else { return survey };
        // From the store's index: a survey reads no state file.
        let Ok(all) = self.inner.store.all() else { return survey };
        let backoff = self.inner.backoff.by_volume.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        for st in all {
            // Only volumes backed by a process are supervised (a lost kernel mount is not
            // silently replaced by an empty one).
            if !self.spawns(&st) {
                continue;
            }
            let broken = match st.phase {
                Phase::Staged => !self.health_in(&st, &mounts).healthy,
                // Left by a restart that failed (in this daemon's life, or before its restart
                // with pods depending on it). Not a kubelet stage in progress: taking its lock the
                // instant it ends would answer kubelet's next call with Aborted.
                Phase::Staging => !st.published.is_empty() || backoff.contains_key(&st.volume_id),
                Phase::Unstaging => false,
            };
            let waiting =
                backoff.get(&st.volume_id).is_some_and(|(failures, next)| *failures >= MAX_FAILURES || now < *next);
            if broken && !waiting {
                survey.broken.push(st.volume_id);
            } else if st.phase == Phase::Staged
                && let Some(p) = st.process
            {
                survey.watch.push((st.volume_id, p));
            }
        }
        survey
    }

    /// Resolves after the next FUSE process start (a stage or a restart), for the supervisor.
    pub async fn spawned(&self) {
        self.inner.spawned.notified().await
    }

    /// Is a failed restart due for another attempt?
    pub fn retry_due(&self) -> bool {
        let backoff = self.inner.backoff.by_volume.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        backoff.values().any(|(failures, next)| *failures < MAX_FAILURES && now >= *next)
    }

    /// Restart one broken volume. `None` if there was nothing to do (healthy again, busy with a
    /// kubelet call, gone); otherwise whether the restart worked. Blocking.
    pub fn heal_one(&self, id: &str) -> Option<bool> {
        // kubelet's own calls win: skip a volume that is busy.
        let _guard = self.inner.locks.try_lock(id).ok()?;
        // Re-read under the lock: the volume may have changed since it was found broken.
        let mut st = self.inner.store.load(id).ok()??;
        let still_broken = match st.phase {
            Phase::Staged => !self.health(&st).healthy,
            Phase::Staging => {
                !st.published.is_empty()
                    || self.inner.backoff.by_volume.lock().unwrap_or_else(|p| p.into_inner()).contains_key(id)
            }
            Phase::Unstaging => false,
        };
        if !still_broken || !self.spawns(&st) {
            return None;
        }
        let secrets: Secrets = match self.inner.store.load_secrets(id) {
            Ok(s) => s.into_iter().collect(),
            Err(e) => {
                error!(volume.id = %id, error = %e, "cannot read the kept secrets; not restarting");
                return Some(false);
            }
        };
        let oom = self.inner.exec.oom_kills(&st.cgroup).filter(|n| *n > 0);
        warn!(volume.id = %id, pid = ?st.process.map(|p| p.pid), oom_kills = ?oom, "FUSE process or mount lost; restarting");
        st.phase = Phase::Staging;
        st.restarts += 1;
        // The restage replaces the cgroup, and its counter with it: keep the count.
        st.oom_kills += u32::try_from(oom.unwrap_or(0)).unwrap_or(u32::MAX);
        crate::metrics::global().fuse_restart(&st.plugin, oom.unwrap_or(0));
        let below = if st.ephemeral {
            self.state_dir().to_path_buf()
        } else {
            st.staging_path.parent().unwrap_or(&st.staging_path).to_path_buf()
        };
        // A record without a FUSE id (written before volumes had them) gets one now, claimed
        // until the job has recorded it.
        let ran =
            self.assign_fuse_id(&mut st).and_then(|_claim| self.run_job(self.stage_job(st, below, secrets, true)));
        match ran {
            Ok(_) => {
                self.inner.backoff.clear(id);
                info!(volume.id = %id, "restarted and re-bound");
                // An inline volume lives for its targets: if every pod went away, it goes too.
                if let Ok(Some(st)) = self.inner.store.load(id)
                    && st.ephemeral
                    && st.published.is_empty()
                {
                    warn!(volume.id = %id, "no target of the ephemeral volume is left; unstaging it");
                    if let Err(e) = self.tear_down_and_forget(&st) {
                        error!(volume.id = %id, error = %e.message, "unstaging an ephemeral volume without targets");
                    }
                }
                Some(true)
            }
            Err(e) => {
                let mut backoff = self.inner.backoff.by_volume.lock().unwrap_or_else(|p| p.into_inner());
                let failures = backoff.get(id).map(|(f, _)| f + 1).unwrap_or(1);
                let wait = Duration::from_secs(1 << failures.min(6)).min(Duration::from_secs(60));
                backoff.insert(id.to_string(), (failures, Instant::now() + wait));
                error!(volume.id = %id, failures, error = %e.message, "restart failed");
                Some(false)
            }
        }
    }

    /// Does the volume's plan run a FUSE process (only those are supervised)?
    pub(super) fn spawns(&self, st: &crate::volume::state::VolumeState) -> bool {
        st.plan.steps.iter().any(|s| matches!(s, crate::plan::Step::SpawnFuse { .. }))
    }

    /// Why the supervisor gave up on a volume, if it did.
    pub fn gave_up(&self, volume_id: &str) -> Option<String> {
        let backoff = self.inner.backoff.by_volume.lock().unwrap_or_else(|p| p.into_inner());
        backoff
            .get(volume_id)
            .filter(|(f, _)| *f >= MAX_FAILURES)
            .map(|(f, _)| format!("the host gave up restarting it after {f} failed attempts"))
    }
}
