//! The driver every node RPC ends in, on one blocking thread: read the node once, diff, record
//! what must be recorded before the first syscall, apply the actions through the executor,
//! record the outcome. An RPC describes itself as a [`Job`]; the driver is the same for all.
//!
//! Nothing is written before the diff has passed: a conflict (ALREADY_EXISTS) or a step this
//! host cannot run changes nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use tracing::warn;

use super::Node;
use super::diff::{self, Action, Conflict, Desired, Observed};
use crate::error::{Error, ErrorKind};
use crate::exec::beneath::is_link_refused;
use crate::exec::lazy::Opening;
use crate::exec::process::{ProcessId, Spec};
use crate::exec::{Confinement, Control, Fuse, FuseError, HostFuse};
use crate::plan::{Step, resolve_env_at};
use crate::secrets::Secrets;
use crate::volume::dirs::volume_key;
use crate::volume::state::{MountPhase, VolumeState};

/// What one RPC asks of the driver.
pub(super) struct Job {
    /// The volume.
    pub id: String,
    /// What the node must look like afterwards.
    pub desired: Desired,
    /// The volume's recorded process (its liveness is part of the snapshot).
    pub process: Option<ProcessId>,
    /// Secrets the plan's steps reference.
    pub secrets: Secrets,
    /// Recorded before the first action (a stage's `staging` record, an unstage's `unstaging`).
    pub first: Option<VolumeState>,
    /// Kept with the volume before the first action, for restarts (a stage's referenced secrets).
    pub keep_secrets: Option<BTreeMap<String, String>>,
    /// The record once every action ran.
    pub then: Box<dyn FnOnce(&Applied) -> Persist + Send>,
    /// What a failure undoes.
    pub undo: Undo,
}

impl Job {
    /// A job with no process, no secrets, nothing recorded before its actions and nothing
    /// to undo (unpublish, a dynamic mount, a publication applied again).
    pub fn plain(id: &str, desired: Desired, then: impl FnOnce(&Applied) -> Persist + Send + 'static) -> Job {
        Job {
            id: id.to_string(),
            desired,
            process: None,
            secrets: Secrets::default(),
            first: None,
            keep_secrets: None,
            then: Box::new(then),
            undo: Undo::Nothing,
        }
    }
}

/// What the actions produced.
#[derive(Debug, Default, Clone)]
pub(super) struct Applied {
    /// The FUSE process started, if one was.
    pub spawned: Option<ProcessId>,
    /// Recorded targets not bound again because their pod's directory is gone (seen in the
    /// snapshot before the diff; a pod that goes away later fails this attempt, and the retry
    /// sees it gone).
    pub gone_targets: Vec<PathBuf>,
}

/// The state transition after the actions.
pub(super) enum Persist {
    /// Write this record.
    Save(Box<VolumeState>),
    /// Forget the volume (record and kept secrets).
    Remove,
    /// Leave the record as it is.
    Keep,
}

/// What a failed job undoes.
pub(super) enum Undo {
    /// Nothing: every action is safe to retry as it is (publish, unpublish, unstage).
    Nothing,
    /// A stage: tear down what it made; keep the record (with no process) if pods still
    /// depend on it or the supervisor is restarting it, forget it otherwise.
    Stage { state: Box<VolumeState>, keep_record: bool },
}

fn conflict(e: Conflict) -> Error {
    match e {
        Conflict::Occupied { .. } => Error::exists(e.to_string()),
        Conflict::Unsupported { .. } => Error::unimplemented(e.to_string()),
    }
}

impl Node {
    /// Run `job`. Blocking.
    pub(super) fn run_job(&self, job: Job) -> Result<Applied, Error> {
        let t0 = std::time::Instant::now();
        let fresh_target =
            job.desired.lone_bind_target().is_some_and(|t| matches!(self.inner.exec.exists(t), Ok(false)));
        let mounts = if fresh_target { Vec::new() } else { self.mounts_touching(&job.desired.paths())? };
        let t_mounts = t0.elapsed();
        let process_alive = job.process.is_some_and(|p| self.inner.exec.is_alive(&p));
        let mut gone_targets = std::collections::BTreeSet::new();
        for (target, parent) in job.desired.recorded_targets() {
            if !self.inner.exec.exists(&parent).map_err(|e| io_error(e, &parent))? {
                warn!(volume.id = %job.id, target = %target.display(), "the pod's directory is gone: forgetting the target");
                gone_targets.insert(target.to_path_buf());
            }
        }
        let observed = Observed { mounts: &mounts, process_alive, gone_targets: &gone_targets };
        let actions = diff::diff(&job.desired, observed).map_err(conflict)?;
        let t_diff = t0.elapsed();
        if let Some(first) = &job.first {
            self.inner.store.save(first)?;
        }
        if let Some(keep) = &job.keep_secrets {
            self.inner.store.save_secrets(&job.id, keep)?;
        }
        let mut applied = Applied { gone_targets: gone_targets.into_iter().collect(), ..Applied::default() };
        let t_first = t0.elapsed();
        match self.apply(&job.id, &actions, &job.secrets, &mut applied) {
            Ok(()) => {
                let t_apply = t0.elapsed();
                match (job.then)(&applied) {
                    Persist::Save(st) => self.inner.store.save(&st)?,
                    Persist::Remove => self.inner.store.remove(&job.id)?,
                    Persist::Keep => {}
                }
                tracing::debug!(
                    mounts = mounts.len(),
                    read_us = t_mounts.as_micros() as u64,
                    diff_us = (t_diff - t_mounts).as_micros() as u64,
                    first_us = (t_first - t_diff).as_micros() as u64,
                    actions_us = (t_apply - t_first).as_micros() as u64,
                    persist_us = (t0.elapsed() - t_apply).as_micros() as u64,
                    "job timing"
                );
                Ok(applied)
            }
            Err(e) => {
                if let (Undo::Nothing, Some(p)) = (&job.undo, applied.spawned) {
                    // A dynamic mount's server the failed job started: nothing else would stop it.
                    if let Err(stop) = self.inner.exec.stop(&p, self.inner.config.fuse_stop_grace) {
                        warn!(volume.id = %job.id, pid = p.pid, error = %stop, "stopping the process a failed job started");
                    }
                }
                if let Undo::Stage { mut state, keep_record } = job.undo {
                    // What the failed attempt started is torn down with the rest.
                    state.process = applied.spawned.or(state.process);
                    if let Err(undo) = self.teardown(&state, &[]) {
                        warn!(volume.id = %job.id, error = %undo.message, "rolling back a failed stage");
                    }
                    let record = if keep_record {
                        state.process = None;
                        self.inner.store.save(&state)
                    } else {
                        self.inner.store.remove(&job.id)
                    };
                    if let Err(undo) = record {
                        warn!(volume.id = %job.id, error = %undo, "recording a rolled-back stage");
                    }
                }
                Err(e)
            }
        }
    }

    /// Tear down everything `st` has and forget the volume (record and kept secrets): an
    /// unstage the daemon finishes by itself. Blocking.
    pub(super) fn tear_down_and_forget(&self, st: &VolumeState) -> Result<(), Error> {
        self.teardown(st, &[])?;
        Ok(self.inner.store.remove(&st.volume_id)?)
    }

    /// Stop the volume's process, kill what is left in its cgroup, clear its staging mount
    /// (and `targets`), remove the host's directories of the volume. Blocking.
    pub(super) fn teardown(&self, st: &VolumeState, targets: &[PathBuf]) -> Result<(), Error> {
        let mut host_dirs: Vec<PathBuf> = self.host_dirs_of(&st.volume_id, &st.plan);
        if st.ephemeral {
            host_dirs.push(st.staging_path.parent().unwrap_or(&st.staging_path).to_path_buf());
        }
        let mut paths: Vec<&Path> = vec![&st.staging_path];
        paths.extend(targets.iter().map(PathBuf::as_path));
        paths.extend(host_dirs.iter().map(PathBuf::as_path));
        let mounts = self.mounts_touching(&paths)?;
        let mut actions = Vec::new();
        for t in targets {
            actions.extend(
                diff::diff(
                    &Desired::Unpublish { target: t.clone() },
                    Observed { mounts: &mounts, process_alive: false, gone_targets: &Default::default() },
                )
                .map_err(conflict)?
                .into_iter()
                // The unmounts (best effort below the target), not the target's removal.
                .filter(|a| matches!(a, Action::Unmount(_) | Action::BestEffort(_))),
            );
        }
        let desired =
            Desired::Teardown { staging: st.staging_path.clone(), host_dirs, steps: Vec::new(), process: st.process };
        let alive = st.process.is_some_and(|p| self.inner.exec.is_alive(&p));
        actions.extend(
            diff::diff(&desired, Observed { mounts: &mounts, process_alive: alive, gone_targets: &Default::default() })
                .map_err(conflict)?,
        );
        self.apply(&st.volume_id, &actions, &Secrets::default(), &mut Applied::default())
    }

    /// Remove host directories (and unmount what is below them). Blocking.
    pub(super) fn remove_host_dirs(&self, dirs: Vec<PathBuf>) -> Result<(), Error> {
        if dirs.is_empty() {
            return Ok(());
        }
        let mounts = self.mounts()?;
        let actions = diff::diff(
            &Desired::Removed { dirs },
            Observed { mounts: &mounts, process_alive: false, gone_targets: &Default::default() },
        )
        .map_err(conflict)?;
        self.apply("", &actions, &Secrets::default(), &mut Applied::default())
    }

    /// Apply `actions` in order through the executor, noting what was started in `applied`.
    pub(super) fn apply(
        &self,
        id: &str,
        actions: &[Action],
        secrets: &Secrets,
        applied: &mut Applied,
    ) -> Result<(), Error> {
        for action in actions {
            self.apply_one(id, action, secrets, applied)?;
        }
        Ok(())
    }

    fn apply_one(&self, id: &str, action: &Action, secrets: &Secrets, applied: &mut Applied) -> Result<(), Error> {
        let exec = &self.inner.exec;
        match action {
            Action::Unmount(path) => self.unmount(path)?,
            Action::Mkdir { path, below } => exec.mkdir(path, below, 0o750).map_err(|e| io_error(e, path))?,
            Action::PrivateDir(path) => exec.private_dir(path).map_err(|e| io_error(e, path))?,
            Action::Run(step) => {
                if let Some(pid) = self.run_step(id, step, secrets)? {
                    applied.spawned = Some(pid);
                }
            }
            Action::Stop(p) => {
                exec.stop(p, self.inner.config.fuse_stop_grace)?;
            }
            Action::ReleaseGroup => match exec.release_group(&self.group_of(id)?) {
                Ok(0) => {}
                Ok(n) => warn!(volume.id = %id, killed = n, "killed processes left in the volume's cgroup"),
                Err(e) => return Err(Error::internal(format!("releasing the cgroup of volume {id}: {e}"))),
            },
            Action::RemoveTree(path) => exec.remove_tree(path).map_err(|e| io_error(e, path))?,
            Action::RemoveEntry(path) => exec.remove_entry(path).map_err(|e| io_error(e, path))?,
            Action::BestEffort(a) => {
                if let Err(e) = self.apply_one(id, a, secrets, applied) {
                    // A plugin's clean-up step at unstage, or an unmount below an unpublished
                    // target: what follows in the same tear-down covers it (diff::Action).
                    warn!(volume.id = %id, error = %e.message, "a best-effort tear-down step failed; the tear-down goes on");
                }
            }
        }
        Ok(())
    }

    /// The cgroup of volume `id`: its record's (every job and tear-down that touches a group
    /// runs after the volume's record is written), else where a new record would put it. A
    /// record that cannot be read names none this daemon may use: an error.
    fn group_of(&self, id: &str) -> Result<String, Error> {
        Ok(match self.inner.store.load(id)? {
            Some(st) => st.cgroup,
            None => self.inner.config.volume_cgroup(&volume_key(id)),
        })
    }

    /// The memory limit of volume `id`'s cgroup as the program of `starting` (a `spawn-fuse`
    /// step) starts in it: [`group_limit`] over the steps its record runs.
    fn group_memory_limit(&self, id: &str, starting: &Step) -> Result<Option<u64>, Error> {
        let state = self.inner.store.load(id)?;
        let steps = state.iter().flat_map(|st| {
            let mounts = st.dynamic.values().filter(|m| m.phase != MountPhase::Failed);
            st.plan.steps.iter().chain(mounts.flat_map(|m| m.steps.iter()))
        });
        Ok(group_limit(steps, starting, self.inner.config.lazy.memory_limit))
    }

    /// Unmount the top mount at `path`: lazily when it is busy (a pod holds it) or its FUSE
    /// server is dead; one already gone is fine.
    fn unmount(&self, path: &Path) -> Result<(), Error> {
        match self.inner.exec.unmount(path, false) {
            Ok(()) => Ok(()),
            Err(e) if matches!(e.errno, Errno::EBUSY | Errno::ENOTCONN | Errno::EIO) => {
                warn!(path = %path.display(), errno = %e.errno, "detaching lazily");
                Ok(self.inner.exec.unmount(path, true)?)
            }
            Err(e) if matches!(e.errno, Errno::EINVAL | Errno::ENOENT) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn run_step(&self, id: &str, step: &Step, secrets: &Secrets) -> Result<Option<ProcessId>, Error> {
        let exec = &self.inner.exec;
        match step {
            Step::SpawnFuse {
                program,
                executable,
                args,
                env,
                mountpoint,
                fstype,
                ready_timeout_ms,
                memory_limit_bytes: _,
                host_mount,
                lazy,
            } => {
                let dirs = self.dirs(id, None, None);
                let runtime = dirs.runtime.clone().expect("a volume has a runtime dir");
                // The host's own lazy server: its control socket, and what it is told first.
                let opening = lazy.as_ref().map(|l| self.lazy_opening(id, l)).transpose()?.map(|(o, _)| o);
                let sender = opening.as_ref().map(Opening::sender);
                let control = sender.as_ref().zip(lazy.as_ref()).map(|(send, l)| Control {
                    dir: &runtime,
                    name: &l.control,
                    opening: send,
                });
                // A program the host mounts for runs as the volume's own id, which its record
                // holds before it first runs (daemon/fuse_ids.rs).
                let fuse_id = host_mount.as_ref().map(|_| self.recorded_fuse_id(id)).transpose()?;
                // Secrets the program reads from files (daemon/secret_files.rs), then its command.
                // The host's lazy server has none (and a volume may run several of them).
                let files_dir = self.secret_files_dir(id, step);
                if lazy.is_none() {
                    self.write_secret_files(&files_dir, step, secrets, fuse_id)?;
                }
                let mut args: Vec<String> = args.iter().map(|a| a.render_at(&files_dir)).collect();
                let mut env: Vec<(String, String)> =
                    env.iter().map(|e| (e.name.clone(), resolve_env_at(&e.value, secrets, &files_dir))).collect();
                // A plan's program (never the host's own server) runs under its rule set, in a
                // mount namespace of its own unless that is turned off (exec::confine): an empty
                // private home and working directory, and an empty file where its rule set says
                // it takes a configuration file.
                let cfg = &self.inner.config;
                let set = lazy.is_none().then(|| cfg.program_rules.set(program)).flatten();
                let confined = cfg.confine_programs && lazy.is_none();
                if let Some(set) = set {
                    let empty = if confined { crate::exec::confine::EMPTY_FILE } else { "/dev/null" };
                    args.extend(set.config_args(Path::new(empty)));
                }
                if confined && !env.iter().any(|(name, _)| name == "HOME") {
                    env.push(("HOME".into(), crate::exec::confine::HOME.into()));
                }
                let mut writable: Vec<&Path> =
                    dirs.cache.iter().chain(dirs.runtime.iter()).map(PathBuf::as_path).collect();
                if host_mount.is_some() {
                    writable.push(&files_dir);
                }
                let confine = confined.then(|| Confinement { writable, hidden: set.map_or(&[][..], |s| &s.reads) });
                let log = runtime.join(format!("{program}.log"));
                let host_mount = host_mount.as_ref().zip(fuse_id).map(|(h, fuse_id)| HostFuse {
                    source: &h.source,
                    options: &h.options,
                    readonly: h.readonly,
                    uid: fuse_id,
                    gid: fuse_id,
                });
                let fuse = Fuse {
                    spec: Spec { executable, args: &args, env: &env, log: &log },
                    mountpoint,
                    fstype,
                    ready_timeout: std::time::Duration::from_millis(u64::from(*ready_timeout_ms)),
                    group: &self.group_of(id)?,
                    memory_limit: self.group_memory_limit(id, step)?,
                    host_mount,
                    control,
                    confine,
                };
                let pid = exec.spawn_fuse(&fuse).map_err(|e| fuse_error(e, secrets))?;
                // The supervisor watches it from the moment the stage is done.
                self.inner.spawned.notify_one();
                Ok(Some(pid))
            }
            Step::Mount { fstype, source, target, options, readonly } => {
                exec.mount(fstype, source, target, options, *readonly)?;
                Ok(None)
            }
            Step::Bind { source, target, readonly, options } => {
                exec.bind(source, target, *readonly, options).map_err(|e| bind_error(e, source))?;
                Ok(None)
            }
            Step::Unpack { digest, format, dest, layering } => {
                let dirs = self.dirs(id, None, None);
                // The root that holds `dest` (the policy put it inside one of the volume's
                // directories); the cache links below it without following any link.
                let below = dirs.host_dirs().into_iter().find(|d| dest.starts_with(d)).ok_or_else(|| {
                    Error::internal(format!("unpack into {} outside the volume's cache", dest.display()))
                })?;
                self.inner
                    .assembler
                    .assemble(digest, *format, *layering, dest, &below)
                    .map_err(|e| io_error(e, dest))?;
                Ok(None)
            }
            Step::Socket { path } => {
                self.serve_socket(id, path)?;
                Ok(None)
            }
            Step::SocketCall { socket, method, message, timeout_ms } => {
                let stream = exec.connect(socket).map_err(|e| io_error(e, socket))?;
                let timeout = std::time::Duration::from_millis(u64::from(*timeout_ms));
                // On a blocking thread of the runtime (the pipeline's): wait for the call here.
                tokio::runtime::Handle::current()
                    .block_on(crate::unpriv::grpc::unary_on(stream, method, message, timeout))
                    .map_err(|e| {
                        Error::unavailable(format!(
                            "volume {id}: the program behind {} did not take the call: {e}",
                            socket.display()
                        ))
                    })?;
                Ok(None)
            }
            other => Err(Error::internal(format!("a {} step reached the executor", other.kind()))),
        }
    }

    /// The mount table as the kernel shows it now.
    pub(super) fn mounts(&self) -> Result<Vec<crate::exec::mountinfo::MountEntry>, Error> {
        self.inner.exec.mounts().map_err(|e| Error::internal(format!("reading the mount table: {e}")))
    }

    /// The entries of the mount table at, above or below `paths`, read once.
    pub(super) fn mounts_touching(&self, paths: &[&Path]) -> Result<Vec<crate::exec::mountinfo::MountEntry>, Error> {
        self.inner.exec.mounts_touching(paths).map_err(|e| Error::internal(format!("reading the mount table: {e}")))
    }
}

/// An executor error about `path`, classed: a symbolic link on the way or a missing parent is
/// the caller's (or a pod's) doing, a busy mount point is worth a retry, anything else is ours.
pub(super) fn io_error(e: std::io::Error, path: &Path) -> Error {
    let message = if e.to_string().contains(&path.display().to_string()) {
        e.to_string()
    } else {
        format!("{}: {e}", path.display())
    };
    if is_link_refused(&e) || e.kind() == std::io::ErrorKind::NotFound {
        Error::precondition(message)
    } else if e.kind() == std::io::ErrorKind::ResourceBusy {
        // Something is mounted where the host must remove (a mount moved under the name while
        // the call ran): a retry finds the mount table as it is now.
        Error::unavailable(message)
    } else {
        Error::internal(message)
    }
}

fn fuse_error(e: FuseError, secrets: &Secrets) -> Error {
    let message = secrets.scrub(&e.to_string());
    match e {
        FuseError::Timeout { .. } => Error::new(ErrorKind::DeadlineExceeded, message),
        FuseError::Exited { .. } => Error::unavailable(message),
        FuseError::Cgroup(e) if e.kind() == std::io::ErrorKind::Unsupported => Error::precondition(message),
        FuseError::Io(e) if is_link_refused(&e) || e.kind() == std::io::ErrorKind::NotFound => {
            Error::precondition(message)
        }
        // The plan made its program mount where it may not: the same plan does it again.
        FuseError::MountedElsewhere { .. } => Error::invalid(message),
        // The program cannot work the way the plan asks, or the node cannot confine it: a
        // retry changes nothing until the plan or the node does.
        FuseError::NoHostFd { .. } => Error::precondition(message),
        FuseError::Confine { source, .. } if source.kind() == std::io::ErrorKind::Unsupported => {
            Error::precondition(message)
        }
        FuseError::Process(_) | FuseError::Io(_) | FuseError::Cgroup(_) | FuseError::Confine { .. } => {
            Error::internal(message)
        }
    }
}

/// What every process of a volume's group may use together, once `starting` runs beside the
/// `spawn-fuse` steps of `recorded` (the one starting may be among them, found by its mount
/// point): the sum of each plan program's own limit (one without a limit: none for the group),
/// plus `per_server` (`--lazy-memory-mib`; none: none for the group) for each of the host's
/// lazy servers (the stage's, and one per lazy dynamic mount). So a lazy volume's lone server
/// gets exactly `--lazy-memory-mib`.
fn group_limit<'a>(
    recorded: impl Iterator<Item = &'a Step>,
    starting: &'a Step,
    per_server: Option<u64>,
) -> Option<u64> {
    let mut servers = std::collections::BTreeSet::new();
    let mut programs: BTreeMap<&Path, Option<u64>> = BTreeMap::new();
    for step in recorded.chain(std::iter::once(starting)) {
        if let Step::SpawnFuse { lazy, memory_limit_bytes, mountpoint, .. } = step {
            match lazy {
                Some(l) => _ = servers.insert(l.control.as_str()),
                None => _ = programs.insert(mountpoint.as_path(), *memory_limit_bytes),
            }
        }
    }
    let programs = programs.into_values().try_fold(0u64, |sum, limit| limit.map(|l| sum.saturating_add(l)))?;
    if servers.is_empty() {
        return Some(programs);
    }
    per_server.map(|each| programs.saturating_add(each.saturating_mul(servers.len() as u64)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_groups_limit_adds_every_program_and_lazy_server_and_none_is_none() {
        let program = |at: &str, limit: Option<u64>| Step::SpawnFuse {
            program: "weed".into(),
            executable: "/usr/bin/weed".into(),
            args: Vec::new(),
            env: Vec::new(),
            mountpoint: at.into(),
            fstype: "fuse.seaweedfs".into(),
            ready_timeout_ms: 1000,
            memory_limit_bytes: limit,
            host_mount: None,
            lazy: None,
        };
        let server = |at: &str, control: &str| {
            let plan = crate::plan::lazy::tests::model_plan();
            let plan = crate::plan::lazy::lower(plan, Path::new("/usr/bin/mounthost")).unwrap();
            let mut s = plan.steps.into_iter().find(|s| matches!(s, Step::SpawnFuse { .. })).unwrap();
            if let Step::SpawnFuse { lazy: Some(l), mountpoint, .. } = &mut s {
                l.control = control.into();
                *mountpoint = at.into();
            }
            s
        };
        let (a, b) = (program("/v/a", Some(100)), program("/v/b", Some(50)));
        let (s1, s2) = (server("/v/m1", "m1"), server("/v/m2", "m2"));
        // Two programs add up; the one starting is counted once, recorded or not.
        assert_eq!(group_limit([&a, &b].into_iter(), &b, Some(10)), Some(150));
        assert_eq!(group_limit([&a].into_iter(), &b, Some(10)), Some(150));
        // Each lazy server adds its share.
        assert_eq!(group_limit([&a, &s1].into_iter(), &s2, Some(10)), Some(120));
        assert_eq!(group_limit([&s1].into_iter(), &s1, Some(10)), Some(10));
        // A program without a limit, wherever it is, leaves the group without one.
        let free = program("/v/c", None);
        assert_eq!(group_limit([&free, &a].into_iter(), &b, Some(10)), None);
        assert_eq!(group_limit([&a].into_iter(), &free, Some(10)), None);
        // No limit per lazy server: none for a group running one.
        assert_eq!(group_limit([&a].into_iter(), &s1, None), None);
        assert_eq!(group_limit([&a].into_iter(), &b, None), Some(150));
    }

    #[test]
    fn a_fuse_programs_log_quote_keeps_no_secret() {
        let secrets: Secrets = [("password".to_string(), "hunter22".to_string())].into_iter().collect();
        let log_tail = "E1202 filer auth failed for user admin with password hunter22\nusage: weed mount".to_string();
        let exited = FuseError::Exited {
            program: "/usr/bin/weed".into(),
            mountpoint: "/var/lib/kubelet/x/globalmount".into(),
            oom: String::new(),
            log_tail: log_tail.clone(),
        };
        let timeout = FuseError::Timeout {
            program: "/usr/bin/weed".into(),
            mountpoint: "/var/lib/kubelet/x/globalmount".into(),
            timeout: std::time::Duration::from_secs(1),
            log_tail,
        };
        for (e, kind) in [(exited, ErrorKind::Unavailable), (timeout, ErrorKind::DeadlineExceeded)] {
            let err = fuse_error(e, &secrets);
            assert_eq!(err.kind, kind);
            assert!(err.message.contains("auth failed for user admin"), "the cause is quoted: {}", err.message);
            assert!(!err.message.contains("hunter22"), "{}", err.message);
        }
    }
}

/// A bind that failed because its source is missing or not a directory (a model volume of a
/// container image whose `path` names nothing, or a file, in the image) is the request's to fix:
/// FAILED_PRECONDITION, saying so. Anything else as the executor reports it.
fn bind_error(e: crate::exec::mount::MountError, source: &Path) -> Error {
    if !matches!(e.errno, Errno::ENOENT | Errno::ENOTDIR | Errno::EINVAL) {
        return e.into();
    }
    // Only for the message: the bind has failed already, and nothing is done with the answer.
    let what = match std::fs::symlink_metadata(source) {
        Err(_) => "does not exist",
        Ok(m) if m.is_file() => "is a file, not a directory",
        _ => return e.into(),
    };
    Error::precondition(format!(
        "cannot bind {}: it {what} (for a model volume of a container image: its parameter path names no \
         directory of the image)",
        source.display()
    ))
}
