//! Reconciliation at start: every state file is compared with what the kernel has
//! (`/proc/self/mountinfo`, `/proc/<pid>`), and repaired or removed with a log line saying why.
//! Nothing is guessed: a file that cannot be read is reported and left for a person.

use std::collections::BTreeSet;

use tracing::{error, info, warn};

use super::Node;
use crate::error::Error;
use crate::exec::mountinfo::MountEntry;
use crate::volume::state::{Phase, VolumeState};

/// The host's own directories of volumes, below the state directory.
const HOST_DIRS: [&str; 3] = ["cache/volumes", "run", "ephemeral"];

/// What reconciliation found, for logs and tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Staged volumes whose process and mount are in place.
    pub adopted: usize,
    /// Staged volumes found broken (dead process or missing mount); the next NodeStage rebuilds them.
    pub unhealthy: usize,
    /// Interrupted stages and unstages, and volumes of an earlier boot, cleaned away.
    pub cleaned: usize,
    /// State files that could not be read (left in place).
    pub unreadable: usize,
    /// Host directories no state file claimed, removed.
    pub orphans: usize,
    /// Processes found in cgroups no state file claims (spawned by a daemon killed before it
    /// recorded them), killed with their groups.
    pub orphan_processes: usize,
}

impl Node {
    /// Reconcile every state file. Blocking.
    pub fn reconcile(&self) -> Result<Report, Error> {
        let mut report = Report::default();
        report.cleaned += self.inner.store.remove_stray_temporaries()?;
        let mounts = self.mounts()?;
        let boot = self.inner.exec.boot().map_err(|e| Error::internal(format!("reading the boot: {e}")))?;
        for (path, parsed) in self.inner.store.list()? {
            let st = match parsed {
                Ok(st) => st,
                // A file of another schema is never removed: it waits for a daemon that reads it.
                Err(e) if !e.is_schema() && self.inner.exec.modified(&path).is_ok_and(|m| m < boot.started) => {
                    // Torn by a kernel crash, and about a boot whose mounts and processes are gone.
                    warn!(path = %path.display(), error = %e, "removing an unreadable state file of an earlier boot");
                    self.inner.store.remove_file(&path)?;
                    report.cleaned += 1;
                    continue;
                }
                Err(e) => {
                    error!(path = %path.display(), error = %e, "state file unreadable; left for inspection");
                    report.unreadable += 1;
                    continue;
                }
            };
            match self.reconcile_one(st, &mounts) {
                Ok(Outcome::Adopted) => report.adopted += 1,
                Ok(Outcome::Unhealthy) => report.unhealthy += 1,
                Ok(Outcome::Cleaned) => report.cleaned += 1,
                Err(e) => {
                    error!(path = %path.display(), error = %e.message, "reconciling a volume failed");
                    report.unhealthy += 1;
                }
            }
        }
        // The keys of the records that survived the pass (read from the directory's names).
        let claimed = self.inner.store.keys()?;
        report.cleaned += self.sweep_dynamic_secrets(&claimed)?;
        report.orphans = self.sweep_orphans(&claimed)?;
        report.orphan_processes = self.sweep_orphan_groups(&claimed)?;
        info!(?report, "reconciled volume state");
        Ok(report)
    }

    /// Remove host directories (`cache/volumes/<key>`, `run/<key>`, `ephemeral/<key>`, and
    /// `<key>` in the FUSE files directory) that no state file claims: left by a crash between
    /// creating them and the first state write reaching the disk, or by an unstage the daemon
    /// did not finish.
    fn sweep_orphans(&self, claimed: &BTreeSet<String>) -> Result<usize, Error> {
        let state_dir = &self.inner.config.state_dir;
        let mut orphans = Vec::new();
        let fuse_files = self.inner.config.fuse_files();
        for dir in HOST_DIRS.map(|d| state_dir.join(d)).into_iter().chain([fuse_files]) {
            let Ok(entries) = self.inner.exec.list_dir(&dir) else { continue };
            for entry in entries {
                let name = entry.name.to_string_lossy().into_owned();
                if claimed.contains(&name) || !entry.is_dir {
                    continue;
                }
                warn!(path = %dir.join(&entry.name).display(), "removing a host directory no volume claims");
                orphans.push(dir.join(&entry.name));
            }
        }
        let removed = orphans.len();
        self.remove_host_dirs(orphans)?;
        Ok(removed)
    }

    /// Kill and remove the groups below this daemon's own cgroup parent that no state file
    /// claims (by key, also an unreadable one's). Groups elsewhere are never touched: another
    /// daemon's, and those of records migrated from schema 1, which their record names.
    fn sweep_orphan_groups(&self, claimed: &BTreeSet<String>) -> Result<usize, Error> {
        let groups = self.inner.exec.groups().map_err(|e| Error::internal(format!("listing cgroups: {e}")))?;
        let mut killed = 0;
        let key = |g: &String| g.rsplit('/').next().unwrap_or_default().to_string();
        for group in groups.iter().filter(|g| !claimed.contains(&key(g))) {
            let n = self
                .inner
                .exec
                .release_group(group)
                .map_err(|e| Error::internal(format!("removing cgroup {group}: {e}")))?;
            warn!(cgroup = %group, killed = n, "removed a cgroup no volume claims");
            killed += n;
        }
        Ok(killed)
    }

    /// Is the recorded process still the program the plan started (pid and start time are
    /// checked by `is_alive`; this adds the executable)? If not, forget it without signalling
    /// it: the pid now belongs to something else.
    fn verify_program(&self, st: &mut VolumeState) -> Result<(), Error> {
        let Some(p) = st.process else { return Ok(()) };
        let planned = st.plan.steps.iter().find_map(|s| match s {
            crate::plan::Step::SpawnFuse { executable, .. } => Some(executable.clone()),
            _ => None,
        });
        let Some(planned) = planned else { return Ok(()) };
        if self.inner.exec.runs(&p, &planned) == Some(false) {
            let running = self.inner.exec.executable(&p).unwrap_or_default();
            warn!(volume.id = %st.volume_id, pid = p.pid, running = %running.display(), "the recorded pid runs another program; forgetting it");
            st.process = None;
            self.inner.store.save(st)?;
        }
        Ok(())
    }

    fn reconcile_one(&self, mut st: VolumeState, mounts: &[MountEntry]) -> Result<Outcome, Error> {
        let id = st.volume_id.clone();
        if st.boot_id != self.inner.boot_id {
            // After a reboot nothing recorded runs or is mounted; kubelet's next NodeStage and
            // NodePublish rebuild the volume. Stale mount points are cleared first.
            warn!(volume.id = %id, "state is from an earlier boot; cleaning it, kubelet restages");
            st.process = None;
            let targets: Vec<_> = st.published.keys().cloned().collect();
            self.teardown(&st, &targets)?;
            self.inner.store.remove(&id)?;
            return Ok(Outcome::Cleaned);
        }
        let unfinished = match st.phase {
            Phase::Unstaging => Some("finishing an interrupted unstage"),
            // An inline volume is staged by the host for its targets and unstaged with the last
            // one; none left means the daemon died between its last unpublish and that unstage.
            Phase::Staged if st.ephemeral && st.published.is_empty() => {
                Some("finishing the unstage of an ephemeral volume without targets")
            }
            Phase::Staging if st.published.is_empty() => Some("rolling back an interrupted stage; kubelet retries it"),
            _ => None,
        };
        if let Some(why) = unfinished {
            warn!(volume.id = %id, "{why}");
            self.tear_down_and_forget(&st)?;
            return Ok(Outcome::Cleaned);
        }
        self.verify_program(&mut st)?;
        let health = self.health_in(&st, mounts);
        if health.healthy {
            // A process an earlier daemon started may be in its group in the memory hierarchy
            // only: on v1 every other hierarchy must hold it too, or a container runtime that
            // stops this daemon's container kills it with the container.
            match self.inner.exec.settle_group(&st.cgroup) {
                Ok(0) => {}
                Ok(n) => {
                    info!(volume.id = %id, cgroup = %st.cgroup, moved = n, "put the volume's processes into its group in every cgroup hierarchy")
                }
                Err(e) => {
                    warn!(volume.id = %id, cgroup = %st.cgroup, error = %e, "could not put the volume's processes into its group in every cgroup hierarchy; a stop of this daemon's container may kill them")
                }
            }
            info!(volume.id = %id, pid = ?st.process.map(|p| p.pid), "adopted");
            Ok(Outcome::Adopted)
        } else {
            warn!(volume.id = %id, condition = %health.condition, "volume is not healthy; the next NodeStageVolume rebuilds it");
            Ok(Outcome::Unhealthy)
        }
    }
}

enum Outcome {
    Adopted,
    Unhealthy,
    Cleaned,
}
