//! Self-heal: a supervisor pass, run every second by the daemon, restarts the FUSE process of
//! any volume whose process died or whose staging mount vanished, with the plan recorded at
//! stage (plans are data; the plugin is not asked again) and the secrets kept for it. The
//! restage detaches the dead mount (lazily if busy), mounts again and re-binds every published
//! target, so pods with `mountPropagation: HostToContainer` see a working path again.
//!
//! Retries back off (1 s, 2 s, 4 s, ... up to 60 s); after [`MAX_FAILURES`] failures in a row
//! the host stops trying and the volume's condition stays abnormal with the reason, until
//! kubelet's next NodeStageVolume.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::{error, info, warn};

use super::Node;
use crate::secrets::Secrets;
use crate::volume::state::Phase;

/// Failures in a row after which the host stops restarting a volume by itself.
pub const MAX_FAILURES: u32 = 5;

/// Per-volume retry bookkeeping (in memory: a restarted daemon starts afresh).
#[derive(Debug, Default)]
pub struct Backoff {
    by_volume: Mutex<HashMap<String, (u32, Instant)>>,
}

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HealReport {
    /// Volumes restarted successfully.
    pub healed: usize,
    /// Restarts that failed.
    pub failed: usize,
}

impl Node {
    /// One supervisor pass. Blocking.
    pub fn heal_pass(&self) -> HealReport {
        let mut report = HealReport::default();
        let Ok(mounts) = self.mount_table() else { return report };
        let Ok(listed) = self.inner.store.list() else { return report };
        for (_, parsed) in listed {
            let Ok(st) = parsed else { continue };
            let broken = match st.phase {
                Phase::Staged => !self.health_in(&st, &mounts).healthy,
                // A restart that failed earlier, with pods still depending on the volume.
                Phase::Staging => !st.published.is_empty(),
                Phase::Unstaging => false,
            };
            // Only volumes backed by a process are supervised (a lost kernel mount is not
            // silently replaced by an empty one).
            if !broken || !self.spawns(&st) {
                continue;
            }
            let id = st.volume_id.clone();
            {
                let backoff = self.inner.backoff.by_volume.lock().unwrap_or_else(|p| p.into_inner());
                if let Some((failures, next)) = backoff.get(&id)
                    && (*failures >= MAX_FAILURES || Instant::now() < *next)
                {
                    continue;
                }
            }
            // kubelet's own calls win: skip a volume that is busy.
            let Ok(_guard) = self.inner.locks.try_lock(&id) else { continue };
            // Re-read under the lock: the volume may have changed since the listing.
            let Ok(Some(mut st)) = self.inner.store.load(&id) else { continue };
            let secrets: Secrets = match self.inner.store.load_secrets(&id) {
                Ok(s) => s.into_iter().collect(),
                Err(e) => {
                    error!(volume.id = %id, error = %e, "cannot read the kept secrets; not restarting");
                    continue;
                }
            };
            let dirs = self.dirs(&id, Some(&st.staging_path), None);
            warn!(volume.id = %id, pid = ?st.process.map(|p| p.pid), "FUSE process or mount lost; restarting");
            st.phase = Phase::Staging;
            st.restarts += 1;
            match self.apply_stage(st, &dirs, &secrets, true) {
                Ok(()) => {
                    info!(volume.id = %id, "restarted and re-bound");
                    self.inner.backoff.by_volume.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
                    report.healed += 1;
                }
                Err(e) => {
                    let mut backoff = self.inner.backoff.by_volume.lock().unwrap_or_else(|p| p.into_inner());
                    let failures = backoff.get(&id).map(|(f, _)| f + 1).unwrap_or(1);
                    let wait = Duration::from_secs(1 << failures.min(6)).min(Duration::from_secs(60));
                    backoff.insert(id.clone(), (failures, Instant::now() + wait));
                    error!(volume.id = %id, failures, error = %e.message, "restart failed");
                    report.failed += 1;
                }
            }
        }
        report
    }

    /// Does the volume's plan run a FUSE process (only those are supervised)?
    fn spawns(&self, st: &crate::volume::state::VolumeState) -> bool {
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
