//! Applying checked plans: each step first asks the kernel whether it is already done, so a
//! retried call (kubelet retries everything) finishes what a previous one started. Runs on a
//! blocking thread; every effect goes through the [`Executor`](crate::exec::Executor).

use std::path::{Path, PathBuf};

use nix::errno::Errno;
use tracing::{info, warn};

use super::{Health, Node};
use crate::error::Error;
use crate::exec::mountinfo::{self, MountEntry};
use crate::exec::process::Spec;
use crate::exec::{Fuse, FuseError};
use crate::plan::{Plan, Step, resolve, secret_refs};
use crate::secrets::Secrets;
use crate::volume::VolumeDirs;
use crate::volume::dirs::volume_key;
use crate::volume::state::{Phase, Publication, VolumeState};

/// How many stacked mounts one path may hold before clearing it gives up.
const MAX_STACKED: usize = 16;

impl Node {
    fn mounts(&self) -> Result<Vec<MountEntry>, Error> {
        self.inner.exec.mounts().map_err(|e| Error::internal(format!("reading the mount table: {e}")))
    }

    fn save(&self, state: &VolumeState) -> Result<(), Error> {
        Ok(self.inner.store.save(state)?)
    }

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
        if !problems.is_empty() {
            // Read only for a volume in trouble (a health check runs for every volume).
            let oom = u64::from(st.oom_kills) + self.inner.exec.oom_kills(&volume_key(&st.volume_id)).unwrap_or(0);
            if oom > 0 {
                problems.push(format!(
                    "the OOM killer struck {oom} times in the volume's cgroup: its memory limit is too small"
                ));
            }
        }
        Health { healthy: problems.is_empty(), condition: problems.join("; ") }
    }

    /// The mount table, for callers checking many volumes at once.
    pub(super) fn mount_table(&self) -> Result<Vec<MountEntry>, Error> {
        self.mounts()
    }

    /// Unmount everything stacked on `path` (lazily when busy). Not mounted is fine.
    pub(super) fn clear_mounts(&self, path: &Path) -> Result<(), Error> {
        for _ in 0..MAX_STACKED {
            if mountinfo::at(&self.mounts()?, path).is_none() {
                return Ok(());
            }
            match self.inner.exec.unmount(path, false) {
                Ok(()) => {}
                // Busy (a pod holds it) or a dead FUSE server: detach now, the kernel frees it later.
                Err(e) if matches!(e.errno, Errno::EBUSY | Errno::ENOTCONN | Errno::EIO) => {
                    warn!(path = %path.display(), errno = %e.errno, "detaching lazily");
                    self.inner.exec.unmount(path, true)?;
                }
                Err(e) if e.errno == Errno::EINVAL => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::internal(format!("{} still has mounts after {MAX_STACKED} unmounts", path.display())))
    }

    /// Clear every mount below `dir` (deepest first), e.g. before removing it.
    pub(super) fn clear_mounts_below(&self, dir: &Path) -> Result<(), Error> {
        let mut below: Vec<PathBuf> =
            self.mounts()?.into_iter().map(|m| m.mount_point).filter(|p| p.starts_with(dir)).collect();
        below.sort();
        below.dedup();
        for p in below.iter().rev() {
            self.clear_mounts(p)?;
        }
        Ok(())
    }

    /// Stage: record the plan (phase `staging`) before any step, apply the steps, record the
    /// process, then `staged`. On failure, roll back to nothing.
    pub(super) fn apply_stage(
        &self,
        mut state: VolumeState,
        dirs: &VolumeDirs,
        secrets: &Secrets,
        healing: bool,
    ) -> Result<(), Error> {
        // Leftovers of an earlier attempt or a crashed process go first, and whatever else still
        // runs in the volume's cgroup (a process a killed daemon spawned but never recorded).
        if let Some(old) = state.process.take() {
            self.inner.exec.stop(&old, self.inner.config.fuse_stop_grace)?;
        }
        self.release_group(&state.volume_id)?;
        self.clear_mounts(&state.staging_path)?;
        self.save(&state)?;
        // Only the secrets the plan references, so a crashed FUSE process can be restarted.
        let kept: std::collections::BTreeMap<String, String> =
            secret_refs(&state.plan).into_iter().filter_map(|k| secrets.get(&k).map(|v| (k, v.to_string()))).collect();
        self.inner.store.save_secrets(&state.volume_id, &kept)?;
        match self.run_stage_steps(&mut state, dirs, secrets) {
            Ok(()) => {
                // Targets first: a crash before `staged` is saved leaves a `staging` record with
                // targets, which the supervisor restages; `staged` with a target still on the
                // dead mount would look healthy (found by the chaos test).
                self.rebind_published(&state)?;
                state.phase = Phase::Staged;
                self.save(&state)?;
                // A fresh start: earlier failed restarts no longer hold the supervisor back.
                self.inner.backoff.clear(&state.volume_id);
                Ok(())
            }
            Err(e) => {
                if let Err(undo) = self.teardown(&state, dirs) {
                    warn!(volume.id = %state.volume_id, error = %undo.message, "rolling back a failed stage");
                }
                if state.published.is_empty() && !healing {
                    let _ = self.inner.store.remove(&state.volume_id);
                } else {
                    state.process = None;
                    let _ = self.save(&state);
                }
                Err(e)
            }
        }
    }

    fn run_stage_steps(&self, state: &mut VolumeState, dirs: &VolumeDirs, secrets: &Secrets) -> Result<(), Error> {
        for d in [&dirs.cache, &dirs.runtime].into_iter().flatten() {
            crate::exec::fs::private_dir(d).map_err(|e| Error::internal(format!("creating {}: {e}", d.display())))?;
        }
        let steps = state.plan.steps.clone();
        for step in &steps {
            match step {
                Step::SpawnFuse {
                    program,
                    executable,
                    args,
                    env,
                    mountpoint,
                    fstype,
                    ready_timeout_ms,
                    memory_limit_bytes,
                } => {
                    self.clear_mounts(mountpoint)?;
                    self.mkdir(mountpoint)?;
                    let env: Vec<(String, String)> =
                        env.iter().map(|e| (e.name.clone(), resolve(&e.value, secrets))).collect();
                    let runtime = dirs.runtime.as_ref().expect("stage has a runtime dir");
                    let log = runtime.join(format!("{program}.log"));
                    let fuse = Fuse {
                        spec: Spec { executable, args, env: &env, log: &log },
                        mountpoint,
                        fstype,
                        ready_timeout: std::time::Duration::from_millis(u64::from(*ready_timeout_ms)),
                        group: &volume_key(&state.volume_id),
                        memory_limit: *memory_limit_bytes,
                    };
                    let pid = self.inner.exec.spawn_fuse(&fuse).map_err(|e| fuse_error(e, secrets))?;
                    state.process = Some(pid);
                    // Recorded at once: a crash from here on knows which process is ours.
                    self.save(state)?;
                    // The supervisor watches it from the moment the stage is done.
                    self.inner.spawned.notify_one();
                }
                other => self.apply_step(other)?,
            }
        }
        Ok(())
    }

    fn mkdir(&self, path: &Path) -> Result<(), Error> {
        self.inner.exec.mkdir(path).map_err(|e| Error::internal(format!("creating {}: {e}", path.display())))
    }

    /// The steps shared by stage and publish.
    fn apply_step(&self, step: &Step) -> Result<(), Error> {
        match step {
            Step::Mkdir { path } => self.mkdir(path),
            Step::Remove { path } => {
                self.clear_mounts_below(path)?;
                self.inner
                    .exec
                    .remove_tree(path)
                    .map_err(|e| Error::internal(format!("removing {}: {e}", path.display())))
            }
            Step::Mount { fstype, source, target, options, readonly } => {
                if let Some(m) = mountinfo::at(&self.mounts()?, target) {
                    if &m.fstype == fstype && &m.source == source && m.is_readonly() == *readonly {
                        return Ok(());
                    }
                    return Err(Error::exists(format!(
                        "{} already holds a {} mount of {}",
                        target.display(),
                        m.fstype,
                        m.source
                    )));
                }
                self.mkdir(target)?;
                Ok(self.inner.exec.mount(fstype, source, target, options, *readonly)?)
            }
            Step::Bind { source, target, readonly, options } => self.bind(source, target, *readonly, options),
            Step::SpawnFuse { .. } => Err(Error::internal("a spawn-fuse step outside stage")),
            Step::Fetch { .. } | Step::Unpack { .. } => {
                Err(Error::unimplemented(format!("{} steps are not supported by this host version yet", step.kind())))
            }
            Step::Socket { .. } => {
                Err(Error::unimplemented("dynamic-mount sockets are not supported by this host version yet"))
            }
            Step::Http { .. } => {
                Err(Error::internal("an http step reached the node (policy allows it only in controller plans)"))
            }
        }
    }

    /// Bind `source` at `target` unless exactly that is already there; a different mount at
    /// the target is AlreadyExists.
    fn bind(&self, source: &Path, target: &Path, readonly: bool, options: &[String]) -> Result<(), Error> {
        let mounts = self.mounts()?;
        if let Some(m) = mountinfo::at(&mounts, target) {
            let same = mountinfo::at(&mounts, source).is_some_and(|s| s.device == m.device && s.root == m.root);
            if same && m.is_readonly() == readonly {
                return Ok(());
            }
            return Err(Error::exists(format!(
                "{} already holds {} ({} {}); unpublish it first",
                target.display(),
                if same { "this volume with other flags" } else { "another mount" },
                m.fstype,
                if m.is_readonly() { "read-only" } else { "read-write" }
            )));
        }
        self.mkdir(target)?;
        Ok(self.inner.exec.bind(source, target, readonly, options)?)
    }

    /// After a restage, bind every recorded target again onto the new mount.
    fn rebind_published(&self, state: &VolumeState) -> Result<(), Error> {
        for (target, p) in &state.published {
            let mounts = self.mounts()?;
            let fresh = mountinfo::at(&mounts, &state.staging_path);
            let current = mountinfo::at(&mounts, target);
            if let (Some(f), Some(c)) = (fresh, current)
                && f.device == c.device
            {
                continue;
            }
            self.clear_mounts(target)?;
            if p.steps.is_empty() {
                self.bind(&state.staging_path, target, p.readonly, &[])?;
            }
            for step in &p.steps {
                self.apply_step(step)?;
            }
            info!(volume.id = %state.volume_id, target = %target.display(), "re-bound after restage");
        }
        Ok(())
    }

    /// Publish: apply the plan's steps (mkdir, bind), then record the target.
    pub(super) fn apply_publish(
        &self,
        mut state: VolumeState,
        plan: &Plan,
        target: &Path,
        readonly: bool,
    ) -> Result<(), Error> {
        for step in &plan.steps {
            self.apply_step(step)?;
        }
        let publication = Publication { readonly, steps: plan.steps.clone() };
        if state.published.get(target) != Some(&publication) {
            state.published.insert(target.to_path_buf(), publication);
            self.save(&state)?;
        }
        Ok(())
    }

    /// Unpublish: unmount the target, remove it, forget it. Returns the remaining state.
    pub(super) fn apply_unpublish(
        &self,
        state: Option<VolumeState>,
        target: &Path,
    ) -> Result<Option<VolumeState>, Error> {
        self.clear_mounts(target)?;
        self.inner
            .exec
            .remove_entry(target)
            .map_err(|e| Error::internal(format!("removing {}: {e}", target.display())))?;
        let Some(mut st) = state else { return Ok(None) };
        if st.published.remove(target).is_some() {
            self.save(&st)?;
        }
        Ok(Some(st))
    }

    /// Drop recorded targets that are no longer mounted (kubelet or a reboot removed them).
    pub(super) fn forget_unmounted_targets(&self, mut st: VolumeState) -> Result<VolumeState, Error> {
        let mounts = self.mounts()?;
        let before = st.published.len();
        st.published.retain(|t, _| mountinfo::at(&mounts, t).is_some());
        if st.published.len() != before {
            self.save(&st)?;
        }
        Ok(st)
    }

    /// Unstage: record `unstaging`, run the plugin's clean-up steps, tear down, forget.
    pub(super) fn apply_unstage(
        &self,
        mut st: VolumeState,
        extra: Option<Plan>,
        dirs: &VolumeDirs,
    ) -> Result<(), Error> {
        st.phase = Phase::Unstaging;
        self.save(&st)?;
        if let Some(plan) = extra {
            for step in &plan.steps {
                self.apply_step(step)?;
            }
        }
        self.teardown(&st, dirs)?;
        self.inner.backoff.clear(&st.volume_id);
        Ok(self.inner.store.remove(&st.volume_id)?)
    }

    /// Kill what is left in the volume's cgroup and remove it.
    pub(super) fn release_group(&self, volume_id: &str) -> Result<(), Error> {
        let key = volume_key(volume_id);
        match self.inner.exec.release_group(&key) {
            Ok(0) => Ok(()),
            Ok(n) => {
                warn!(volume.id = %volume_id, killed = n, "killed processes left in the volume's cgroup");
                Ok(())
            }
            Err(e) => Err(Error::internal(format!("releasing the cgroup of volume {volume_id}: {e}"))),
        }
    }

    /// Stop the process, kill what is left in its cgroup, clear the staging mount, remove the
    /// host's directories of the volume.
    pub(super) fn teardown(&self, st: &VolumeState, dirs: &VolumeDirs) -> Result<(), Error> {
        if let Some(p) = &st.process {
            self.inner.exec.stop(p, self.inner.config.fuse_stop_grace)?;
        }
        self.release_group(&st.volume_id)?;
        self.clear_mounts(&st.staging_path)?;
        for d in [&dirs.cache, &dirs.runtime].into_iter().flatten() {
            self.clear_mounts_below(d)?;
            self.inner.exec.remove_tree(d).map_err(|e| Error::internal(format!("removing {}: {e}", d.display())))?;
        }
        if st.ephemeral {
            let dir = st.staging_path.parent().unwrap_or(&st.staging_path).to_path_buf();
            self.inner
                .exec
                .remove_tree(&dir)
                .map_err(|e| Error::internal(format!("removing {}: {e}", dir.display())))?;
        }
        Ok(())
    }
}

fn fuse_error(e: FuseError, secrets: &Secrets) -> Error {
    let message = secrets.scrub(&e.to_string());
    match e {
        FuseError::Timeout { .. } => Error::new(crate::error::ErrorKind::DeadlineExceeded, message),
        FuseError::Exited { .. } => Error::unavailable(message),
        FuseError::Cgroup(e) if e.kind() == std::io::ErrorKind::Unsupported => Error::precondition(message),
        FuseError::Process(_) | FuseError::Io(_) | FuseError::Cgroup(_) => Error::internal(message),
    }
}
