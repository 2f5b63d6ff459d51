//! How a volume is doing: its health (process alive, staging mount in place), the
//! NodeGetVolumeStats answer (usage and VolumeCondition), and the list the host API reports.

use std::time::Duration;

use super::Node;
use crate::error::Error;
use crate::exec::mountinfo::{self, MountEntry};
use crate::proto::csi;
use crate::volume::request;
use crate::volume::state::{Phase, VolumeState};

/// How long a statvfs of a volume may take before the volume counts as hung.
const STATS_TIMEOUT: Duration = Duration::from_secs(5);

/// What a health check of one volume found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// Everything is in place.
    pub healthy: bool,
    /// Why not.
    pub condition: String,
}

impl Node {
    /// Is the volume's FUSE process alive and its staging mount in place?
    pub fn health(&self, st: &VolumeState) -> Health {
        match self.mounts() {
            Ok(m) => self.health_in(st, &m),
            Err(e) => Health { healthy: false, condition: e.message },
        }
    }

    /// [`Node::health`] against a mount table read once for many volumes.
    pub fn health_in(&self, st: &VolumeState, mounts: &[MountEntry]) -> Health {
        let mut problems = Vec::new();
        if st.phase != Phase::Staged {
            problems.push(format!("phase is {:?}", st.phase));
        }
        if let Some(p) = &st.process
            && !self.inner.exec.is_alive(p)
        {
            problems.push(format!("the FUSE process {} is not running", p.pid));
        } else if st.process.is_none() && self.spawns(st) {
            problems.push("no FUSE process is recorded".into());
        }
        if mountinfo::at(mounts, &st.staging_path).is_none() {
            problems.push(format!("nothing is mounted at the staging path {}", st.staging_path.display()));
        }
        // A lazy volume whose blob failed verification: every read fails.
        if let Some(failed) = self.lazy_status(&st.volume_id).and_then(|l| l.failed) {
            problems.push(failed);
        }
        if !problems.is_empty() {
            // Read only for a volume in trouble (a health check runs for every volume).
            let oom = u64::from(st.oom_kills) + self.inner.exec.oom_kills(&st.cgroup).unwrap_or(0);
            if oom > 0 {
                problems.push(format!(
                    "the OOM killer struck {oom} times in the volume's cgroup: its memory limit is too small"
                ));
            }
        }
        Health { healthy: problems.is_empty(), condition: problems.join("; ") }
    }

    /// NodeGetVolumeStats. A path that does not hold the volume (staged or published there),
    /// a relative one included, is NOT_FOUND, as the spec's table says.
    pub async fn stats(&self, req: csi::NodeGetVolumeStatsRequest) -> Result<csi::NodeGetVolumeStatsResponse, Error> {
        let id = request::volume_id(&req.volume_id)?;
        if req.volume_path.is_empty() {
            return Err(Error::invalid("volume_path is required"));
        }
        let shown = request::shown(&req.volume_path);
        let Some(st) = self.inner.store.load(&id)? else {
            return Err(Error::not_found(format!("volume {id} is not staged on this node")));
        };
        let path = std::path::PathBuf::from(&req.volume_path);
        if st.staging_path != path && !st.published.contains_key(&path) {
            return Err(Error::not_found(format!("volume {id} is neither staged nor published at {shown}")));
        }
        let st2 = st.clone();
        let mut health = self.blocking(move |n| Ok(n.health(&st2))).await?;
        if let Some(reason) = self.gave_up(&id) {
            health = Health { healthy: false, condition: join(&health, &reason) };
        }
        // A lazy volume whose fill stopped (the registry gone, the disk full) still reads what
        // is on the node; the condition says why the rest is not coming.
        if let Some(stalled) = self.lazy_status(&id).and_then(|l| l.stalled) {
            health = Health { healthy: false, condition: join(&health, &stalled) };
        }
        let exec = self.inner.exec.clone();
        let p2 = path.clone();
        let usage = tokio::time::timeout(STATS_TIMEOUT, tokio::task::spawn_blocking(move || exec.usage(&p2))).await;
        let (usage, condition) = match usage {
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
            let mounts = n.mounts()?;
            Ok(n.inner
                .store
                .all()?
                .into_iter()
                .map(|st| (n.health_in(&st, &mounts), st))
                .map(|(h, st)| (st, h))
                .collect())
        })
        .await
    }
}

fn join(h: &Health, more: &str) -> String {
    if h.healthy { more.to_string() } else { format!("{}; {more}", h.condition) }
}
