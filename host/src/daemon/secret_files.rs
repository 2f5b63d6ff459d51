//! Secrets handed to FUSE programs as files (WIT `arg.secret-file`, `value.secret-file`).
//!
//! Some programs read a credential only from a file (`-oIdentityFile=`, a service account
//! JSON). Before a spawn, each such secret is written to `<runtime>/secrets/<16 hex of
//! sha256(key)>` (mode 0600, directory 0700) through the executor, and the program gets the
//! file's path, never the value. The runtime directories' root, `<state>/run`, is a tmpfs the
//! daemon mounts at start (mode 0700), so these files never reach a disk, and they go away
//! with the volume's runtime directory at unstage (and with the tmpfs at reboot). These files
//! are never on disk: a spawn that needs one while `<state>/run` is not a tmpfs is refused.
//! (The values a stage references are also kept, 0600, in `<state>/secrets/<key>.json` while
//! the volume is staged, to restart a crashed program: `volume::state`.)
//!
//! A program the host mounts for (WIT `fuse-mount.host-fd`) runs as the volume's own FUSE id
//! (`fuse_ids`) and cannot reach anything below the private state directory, and some programs
//! reach their files from another working directory (sshfs's `ssh` runs in `/`), so its files
//! go to `<fuse files dir>/<volume key>/` instead ([`crate::config::Config::fuse_files`]). That
//! directory is a tmpfs of its own (mode 0711, at most [`FUSE_FILES_SIZE`]), which the daemon
//! mounts exactly there at the first such stage; writing on it never fills the node's `/run`.
//! Everything in it is root's, readable by the volume's FUSE group only: the volume's directory
//! 0710 and its files 0640, made afresh (whatever was there removed first) before every spawn.
//! The program can read its files and nothing else there, and can create, replace, link or
//! grow nothing there. The files are named by absolute path; they go away at unstage, and
//! entries of volumes without a record at the daemon's start.

use std::path::{Path, PathBuf};

use tracing::{info, warn};

use super::Node;
use crate::error::Error;
use crate::exec::mountinfo;
use crate::plan::{MountOption, Step, secret_file_name, secret_files};
use crate::secrets::Secrets;

/// Mode of a secret file the daemon's own programs read.
const SECRET_FILE_MODE: u32 = 0o600;
/// Mode of a host-mounted program's secret file: root's, readable by the volume's FUSE group.
const FUSE_FILE_MODE: u32 = 0o640;
/// Mode of a host-mounted program's directory: root's, searchable by the volume's FUSE group.
const FUSE_DIR_MODE: u32 = 0o710;
/// The source name the runtime tmpfs shows in mountinfo.
const RUN_SOURCE: &str = "mounthost-run";
/// The source name the FUSE files directory's tmpfs shows in mountinfo.
const FUSE_FILES_SOURCE: &str = "mounthost-fuse";
/// The runtime tmpfs's size cap: it holds secret files, sockets and the FUSE programs' logs,
/// in memory, so a program that logs without end fills this, not the node's RAM.
const RUN_SIZE: &str = "256m";
/// The FUSE files tmpfs's size cap (only the daemon writes there: secret files).
pub const FUSE_FILES_SIZE: &str = "64m";

impl Node {
    /// The root of the volumes' runtime directories, `<state>/run`.
    fn run_root(&self) -> PathBuf {
        self.inner.config.state_dir.join("run")
    }

    /// Mount a tmpfs (mode 0700) at `<state>/run` unless one is there already. Called once at
    /// daemon start, before reconciliation. A non-empty `<state>/run` on another filesystem
    /// (volumes staged by a version without it) is left alone: mounting over it would hide
    /// their sockets. Failing is not fatal (an unprivileged test daemon cannot mount): spawns
    /// that need secret files are then refused with the reason. (The FUSE files directory's
    /// tmpfs is mounted at the first stage that needs it: [`Node::write_secret_files`].)
    pub fn mount_runtime_tmpfs(&self) {
        let run = self.run_root();
        match self.ensure_run_tmpfs(&run) {
            Ok(true) => info!(path = %run.display(), "mounted a runtime tmpfs"),
            Ok(false) => {}
            Err(e) => warn!(path = %run.display(), error = %e.message,
                "not on a tmpfs; plans that deliver secrets as files here are refused"),
        }
    }

    /// At the daemon's exit: unmount the runtime tmpfs when the daemon holds no volume at all
    /// (no state file, usable or not) and nothing is on it, so that a node, or a `mounthost
    /// local` run, with no volume left keeps no mount of mounthost's there; the next start
    /// mounts it again. Only the host's own tmpfs exactly at `<state>/run` is touched. A stage
    /// still finishing after the server stopped has written its first record before it makes
    /// anything there (the pipeline saves it before applying), so this leaves it alone. One
    /// that has not yet written it makes its directory on the disk below instead: a plan with
    /// secret files is then refused (they are written only to a tmpfs), and the next start
    /// mounts no tmpfs over that directory until it is gone. Best effort. (The FUSE files tmpfs
    /// stays: its directory is an anchor of the executor, which unmounts only below anchors.)
    pub fn release_unused_tmpfs(&self) {
        let exec = &self.inner.exec;
        let run = self.run_root();
        if !self.inner.store.list().is_ok_and(|records| records.is_empty()) {
            return;
        }
        if !self.own_tmpfs_at(&run, RUN_SOURCE).unwrap_or(false) {
            return;
        }
        if !exec.list_dir(&run).is_ok_and(|entries| entries.is_empty()) {
            return;
        }
        match exec.unmount(&run, false) {
            Ok(()) => info!(path = %run.display(), "unmounted the unused runtime tmpfs"),
            Err(e) => warn!(path = %run.display(), error = %e, "keeping the runtime tmpfs"),
        }
    }

    /// Where the secret files of `step` (a spawn of volume `id`) go: `<runtime>/secrets`, or,
    /// for a program the host mounts for, `<fuse files dir>/<volume key>`.
    pub fn secret_files_dir(&self, id: &str, step: &Step) -> PathBuf {
        let host_mounted = matches!(step, Step::SpawnFuse { host_mount: Some(_), .. });
        self.dirs(id, None, None).secret_files(host_mounted).expect("a volume has a runtime and a FUSE files dir")
    }

    /// The directory of a volume's files for an unprivileged FUSE program.
    pub(super) fn fuse_files_dir(&self, id: &str) -> PathBuf {
        self.inner.config.fuse_files().join(crate::volume::dirs::volume_key(id))
    }

    /// The volume's host directories a tear-down of `plan` removes: its cache and runtime, and
    /// the FUSE files directory when the plan runs a program the host mounts for.
    pub(super) fn host_dirs_of(&self, id: &str, plan: &crate::plan::Plan) -> Vec<PathBuf> {
        let mut dirs = self.dirs(id, None, None).host_dirs();
        if super::fuse_ids::host_mounted(plan) {
            dirs.push(self.fuse_files_dir(id));
        }
        dirs
    }

    /// True if it mounted the tmpfs, false if one was there.
    fn ensure_run_tmpfs(&self, run: &Path) -> Result<bool, Error> {
        let exec = &self.inner.exec;
        // On a tmpfs already: mounted by an earlier start, or the whole state directory is.
        if self.run_fstype(run)?.as_deref() == Some("tmpfs") {
            return Ok(false);
        }
        let entries = exec.list_dir(run).map_err(|e| super::pipeline::io_error(e, run))?;
        if !entries.is_empty() {
            return Err(Error::precondition(format!(
                "{} holds {} entries of volumes staged before it was a tmpfs; it is mounted at the next start after \
                 they are unstaged",
                run.display(),
                entries.len()
            )));
        }
        exec.private_dir(run).map_err(|e| super::pipeline::io_error(e, run))?;
        let options = [MountOption::Text("mode=0700".into()), MountOption::Text(format!("size={RUN_SIZE}"))];
        exec.mount("tmpfs", RUN_SOURCE, run, &options, false)?;
        Ok(true)
    }

    /// Mount the FUSE files directory's own tmpfs (mode 0711, at most [`FUSE_FILES_SIZE`])
    /// unless the mount table's top mount exactly at the directory is it already. A directory
    /// merely *on* a tmpfs (`/run`) does not do: it has no cap of its own. A non-empty
    /// directory that is not that tmpfs is refused rather than hidden.
    fn ensure_fuse_tmpfs(&self) -> Result<(), Error> {
        let _held = self.inner.fuse_tmpfs.lock().unwrap_or_else(|p| p.into_inner());
        let exec = &self.inner.exec;
        let dir = self.inner.config.fuse_files();
        if self.own_tmpfs_at(&dir, FUSE_FILES_SOURCE)? {
            return Ok(());
        }
        let entries = exec.list_dir(&dir).map_err(|e| super::pipeline::io_error(e, &dir))?;
        if !entries.is_empty() {
            return Err(Error::precondition(format!(
                "the FUSE files directory {} holds {} entries and is not the host's tmpfs; secret files of \
                 unprivileged FUSE programs are written only to that tmpfs",
                dir.display(),
                entries.len()
            )));
        }
        let options = [MountOption::Text("mode=0711".into()), MountOption::Text(format!("size={FUSE_FILES_SIZE}"))];
        exec.mount("tmpfs", FUSE_FILES_SOURCE, &dir, &options, false).map_err(|e| {
            Error::precondition(format!(
                "secret files of unprivileged FUSE programs are written only to a tmpfs at {}, which could not \
                 be mounted: {e}",
                dir.display()
            ))
        })?;
        info!(path = %dir.display(), "mounted the FUSE files tmpfs");
        Ok(())
    }

    /// Whether the mount table's top mount exactly at `dir` is the host's tmpfs `source`.
    fn own_tmpfs_at(&self, dir: &Path, source: &str) -> Result<bool, Error> {
        let mounts = self
            .inner
            .exec
            .mounts_touching(&[dir])
            .map_err(|e| Error::internal(format!("reading the mount table: {e}")))?;
        Ok(mountinfo::at(&mounts, dir).is_some_and(|m| m.fstype == "tmpfs" && m.source == source))
    }

    /// The fstype of the mount `path` is on, if the mount table says.
    fn run_fstype(&self, path: &Path) -> Result<Option<String>, Error> {
        let mounts = self
            .inner
            .exec
            .mounts_touching(&[path])
            .map_err(|e| Error::internal(format!("reading the mount table: {e}")))?;
        Ok(mounts
            .iter()
            .filter(|m| path.starts_with(&m.mount_point))
            .max_by_key(|m| m.mount_point.components().count())
            .map(|m| m.fstype.clone()))
    }

    /// Write the secret files `step` names into `dir` ([`Node::secret_files_dir`]; its parent
    /// must exist). Nothing to do for a step without any. For a program the host mounts for
    /// (`host_mount`), which runs as the volume's FUSE id `fuse_id`, the directory is made
    /// afresh on the FUSE files tmpfs, root's and the id's group's (0710, files 0640). Returns
    /// whether it wrote any.
    pub fn write_secret_files(
        &self,
        dir: &Path,
        step: &Step,
        secrets: &Secrets,
        fuse_id: Option<u32>,
    ) -> Result<bool, Error> {
        let keys = secret_files(step);
        if keys.is_empty() {
            return Ok(false);
        }
        let group = match (step, fuse_id) {
            (Step::SpawnFuse { host_mount: Some(_), .. }, Some(id)) => Some(id),
            (Step::SpawnFuse { host_mount: Some(_), .. }, None) => {
                return Err(Error::internal("a host-mounted program's secret files need the volume's FUSE id"));
            }
            _ => None,
        };
        let dir = dir.to_path_buf();
        let exec = &self.inner.exec;
        let io = |e, path: &Path| super::pipeline::io_error(e, path);
        match group {
            Some(gid) => {
                self.ensure_fuse_tmpfs()?;
                // Whatever an earlier stage (or an earlier version, which gave the directory to
                // the program) left there goes: nothing the program could have touched is reused.
                exec.remove_tree(&dir).map_err(|e| io(e, &dir))?;
                exec.private_dir(&dir).map_err(|e| io(e, &dir))?;
                exec.set_owner(&dir, 0, gid, FUSE_DIR_MODE).map_err(|e| io(e, &dir))?;
            }
            None => {
                if self.run_fstype(&dir)?.as_deref() != Some("tmpfs") {
                    return Err(Error::precondition(format!(
                        "the plan delivers secrets as files, which are written only to a tmpfs, and {} is not on \
                         one; see the host daemon's start-up log",
                        dir.parent().unwrap_or(&dir).display()
                    )));
                }
                exec.private_dir(&dir).map_err(|e| io(e, &dir))?;
            }
        }
        for key in keys {
            // The policy checked every referenced secret present before anything ran.
            let value = secrets.get(&key).ok_or_else(|| {
                Error::invalid(format!("the plan's secret file names secret {key:?}, which the request does not carry"))
            })?;
            let path = dir.join(secret_file_name(&key));
            match group {
                Some(gid) => {
                    // Root's alone until it is the group's.
                    exec.write_secret_file(&path, value.as_bytes(), SECRET_FILE_MODE).map_err(|e| io(e, &path))?;
                    exec.set_owner(&path, 0, gid, FUSE_FILE_MODE).map_err(|e| io(e, &path))?;
                }
                None => exec.write_secret_file(&path, value.as_bytes(), SECRET_FILE_MODE).map_err(|e| io(e, &path))?,
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::Config;
    use crate::error::ErrorKind;
    use crate::exec::recording::Recording;
    use crate::exec::{Files, Mounts};
    use crate::plan::{EnvVar, SECRETS_DIR, SpawnArg, Value};
    use crate::plugin::PluginRuntime;

    struct Env {
        _dir: tempfile::TempDir,
        state: PathBuf,
        rec: Arc<Recording>,
        node: Node,
    }

    fn env() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let mut config = Config::new(root.join("state"));
        config.kubelet_dir = root.join("kubelet");
        config.fuse_files_dir = Some(root.join("fuse"));
        let runtime = Arc::new(PluginRuntime::new(config.runtime()).unwrap());
        let rec = Arc::new(Recording::new());
        let node = Node::new(config.clone(), runtime, rec.clone()).unwrap();
        rec.clear_calls();
        Env { _dir: dir, state: config.state_dir, rec, node }
    }

    fn spawn() -> Step {
        let template = Value::SecretTemplate { prefix: "Bearer ".into(), key: "token".into(), suffix: String::new() };
        Step::SpawnFuse {
            program: "p".into(),
            executable: "/bin/p".into(),
            args: vec![SpawnArg::SecretFile { prefix: "-k=".into(), key: "token".into(), suffix: String::new() }],
            env: vec![
                EnvVar { name: "AUTH".into(), value: template },
                EnvVar { name: "KEY_FILE".into(), value: Value::SecretFile("key".into()) },
            ],
            mountpoint: "/m".into(),
            fstype: "fuse.p".into(),
            ready_timeout_ms: 1,
            memory_limit_bytes: None,
            host_mount: None,
            lazy: None,
        }
    }

    fn secrets() -> Secrets {
        [("token".to_string(), "hunter22".to_string()), ("key".to_string(), "-----KEY-----".to_string())]
            .into_iter()
            .collect()
    }

    #[test]
    fn the_runtime_tmpfs_is_mounted_once_and_secret_files_land_on_it() {
        let e = env();
        let run = e.state.join("run");
        e.node.mount_runtime_tmpfs();
        let mount = format!("mount tmpfs mounthost-run {} [mode=0700,size={RUN_SIZE}]", run.display());
        assert!(e.rec.calls().contains(&mount), "{:?}", e.rec.calls());
        e.rec.clear_calls();
        e.node.mount_runtime_tmpfs();
        assert!(e.rec.calls().iter().all(|c| !c.starts_with("mount ")), "mounted twice: {:?}", e.rec.calls());

        let runtime = run.join("0123456789abcdef");
        e.rec.private_dir(&runtime).unwrap();
        e.node.write_secret_files(&runtime.join(SECRETS_DIR), &spawn(), &secrets(), None).unwrap();
        for (key, value) in [("token", "hunter22"), ("key", "-----KEY-----")] {
            let file = crate::plan::secret_file_path(&runtime, key);
            assert_eq!(e.rec.read_file(&file).unwrap().as_deref(), Some(value.as_bytes()), "{key}");
            assert_eq!(e.rec.mode(&file), Some(0o600), "{key}");
            // Written as a secret: a fresh file, no spare keeping an earlier value.
            assert!(e.rec.calls().contains(&format!("write-secret {}", file.display())), "{:?}", e.rec.calls());
        }
        assert_eq!(e.rec.mode(&runtime.join(SECRETS_DIR)), Some(0o700));
        // Nothing else of the state directory holds them.
        let elsewhere: Vec<PathBuf> =
            e.rec.paths_below(&e.state).into_iter().filter(|p| !p.starts_with(&run)).collect();
        for p in elsewhere {
            let bytes = e.rec.read_file(&p).ok().flatten().unwrap_or_default();
            assert!(!String::from_utf8_lossy(&bytes).contains("hunter22"), "{}", p.display());
        }
        // A step without secret files writes nothing.
        e.rec.clear_calls();
        let plain = Step::Mkdir { path: runtime.join("x") };
        e.node.write_secret_files(&runtime.join(SECRETS_DIR), &plain, &secrets(), None).unwrap();
        assert!(e.rec.calls().is_empty(), "{:?}", e.rec.calls());
    }

    fn host_fd_spawn() -> Step {
        let Step::SpawnFuse { program, executable, args, env, mountpoint, fstype, .. } = spawn() else {
            unreachable!()
        };
        Step::SpawnFuse {
            program,
            executable,
            args,
            env,
            mountpoint,
            fstype,
            ready_timeout_ms: 1,
            memory_limit_bytes: None,
            host_mount: Some(crate::plan::HostMount { source: "s".into(), options: vec![], readonly: false }),
            lazy: None,
        }
    }

    #[test]
    fn an_unprivileged_programs_files_are_roots_on_a_tmpfs_of_their_own_readable_by_its_group() {
        let e = env();
        e.node.mount_runtime_tmpfs();
        let fuse = e.state.parent().unwrap().join("fuse");
        e.rec.add_dir(&fuse);
        let at_fuse = format!("mount tmpfs mounthost-fuse {} ", fuse.display());
        assert!(
            e.rec.calls().iter().all(|c| !c.starts_with(&at_fuse)),
            "mounted only when needed: {:?}",
            e.rec.calls()
        );
        let step = host_fd_spawn();
        let dir = e.node.secret_files_dir("vol-1", &step);
        assert_eq!(dir, fuse.join(crate::volume::dirs::volume_key("vol-1")));
        // Without the volume's FUSE id, nothing is written.
        assert_eq!(e.node.write_secret_files(&dir, &step, &secrets(), None).unwrap_err().kind, ErrorKind::Internal);
        e.rec.clear_calls();
        assert!(e.node.write_secret_files(&dir, &step, &secrets(), Some(2147418112)).unwrap());
        let calls = e.rec.calls();
        let mount = format!("mount tmpfs mounthost-fuse {} [mode=0711,size={FUSE_FILES_SIZE}]", fuse.display());
        assert_eq!(calls.iter().filter(|c| **c == mount).count(), 1, "{calls:?}");
        assert!(calls.contains(&format!("remove-tree {}", dir.display())), "{calls:?}");
        let file = dir.join(secret_file_name("token"));
        assert!(calls.contains(&format!("chown {} 0:2147418112 710", dir.display())), "{calls:?}");
        assert!(calls.contains(&format!("chown {} 0:2147418112 640", file.display())), "{calls:?}");
        assert_eq!((e.rec.mode(&dir), e.rec.mode(&file)), (Some(0o710), Some(0o640)));
        assert_eq!(e.rec.read_file(&file).unwrap().as_deref(), Some(&b"hunter22"[..]));
        // The next stage finds the tmpfs exactly at the directory and mounts nothing, and
        // reuses nothing left in the volume's directory (by an earlier version, which gave it
        // to the program).
        e.rec.add_file(&dir.join("planted"), b"x", None);
        e.rec.clear_calls();
        e.node.write_secret_files(&dir, &step, &secrets(), Some(2147418112)).unwrap();
        assert!(e.rec.calls().iter().all(|c| !c.starts_with("mount ")), "{:?}", e.rec.calls());
        assert!(!e.rec.exists(&dir.join("planted")));
        // The program names its files by absolute path.
        let arg = SpawnArg::SecretFile { prefix: "-k=".into(), key: "token".into(), suffix: String::new() };
        assert_eq!(arg.render_at(&dir), format!("-k={}", file.display()));
        // A program that mounts for itself keeps its files in the runtime directory.
        assert_eq!(e.node.secret_files_dir("vol-1", &spawn()).parent().unwrap().parent().unwrap(), e.state.join("run"));
    }

    #[test]
    fn the_fuse_files_directory_is_never_merely_on_a_tmpfs() {
        let e = env();
        let fuse = e.state.parent().unwrap().join("fuse");
        // The directory sits on the node's /run, a tmpfs without a cap of its own.
        e.rec.add_dir(&fuse);
        e.rec.mount("tmpfs", "tmpfs", e.state.parent().unwrap(), &[], false).unwrap();
        let dir = e.node.secret_files_dir("vol-1", &host_fd_spawn());
        e.node.write_secret_files(&dir, &host_fd_spawn(), &secrets(), Some(5000)).unwrap();
        let mount = format!("mount tmpfs mounthost-fuse {} [mode=0711,size={FUSE_FILES_SIZE}]", fuse.display());
        assert!(e.rec.calls().contains(&mount), "{:?}", e.rec.calls());
        // A directory that holds something and is not the host's tmpfs is refused, not hidden.
        let e = env();
        let fuse = e.state.parent().unwrap().join("fuse");
        e.rec.add_dir(&fuse.join("0123456789abcdef"));
        let dir = e.node.secret_files_dir("vol-1", &host_fd_spawn());
        let err = e.node.write_secret_files(&dir, &host_fd_spawn(), &secrets(), Some(5000)).unwrap_err();
        assert_eq!(err.kind, ErrorKind::FailedPrecondition, "{}", err.message);
        assert!(e.rec.calls().iter().all(|c| !c.starts_with("mount ")), "{:?}", e.rec.calls());
    }

    #[test]
    fn the_runtime_tmpfs_is_unmounted_at_exit_only_when_no_volume_is_left() {
        let e = env();
        let run = e.state.join("run");
        e.node.mount_runtime_tmpfs();
        let unmounts =
            |e: &Env| e.rec.calls().iter().filter(|c| c.starts_with("unmount ")).cloned().collect::<Vec<_>>();
        // A volume's runtime directory on it: it stays.
        e.rec.private_dir(&run.join("0123456789abcdef")).unwrap();
        e.rec.clear_calls();
        e.node.release_unused_tmpfs();
        assert_eq!(unmounts(&e), Vec::<String>::new());
        // Nothing on it, but a volume's record (a stage that has not made its directory yet): it stays.
        e.rec.remove_tree(&run.join("0123456789abcdef")).unwrap();
        let record = e.state.join("volumes").join(format!("{}.json", crate::volume::dirs::volume_key("vol-1")));
        e.rec.write_file(&record, b"{}", 0o600).unwrap();
        e.rec.clear_calls();
        e.node.release_unused_tmpfs();
        assert_eq!(unmounts(&e), Vec::<String>::new());
        // No volume left: it goes; a second exit finds nothing to do.
        e.rec.remove_entry(&record).unwrap();
        e.rec.clear_calls();
        e.node.release_unused_tmpfs();
        assert_eq!(unmounts(&e), [format!("unmount {}", run.display())]);
        e.rec.clear_calls();
        e.node.release_unused_tmpfs();
        assert_eq!(unmounts(&e), Vec::<String>::new());
        // Another tmpfs at the place is not the host's: never unmounted.
        e.rec.mount("tmpfs", "someone-else", &run, &[], false).unwrap();
        e.rec.clear_calls();
        e.node.release_unused_tmpfs();
        assert_eq!(unmounts(&e), Vec::<String>::new());
    }

    #[test]
    fn secrets_are_never_written_off_a_tmpfs() {
        let e = env();
        let run = e.state.join("run");
        // A volume staged before the runtime tmpfs existed: its directory is left alone.
        e.rec.add_dir(&run.join("feedfacefeedface"));
        e.node.mount_runtime_tmpfs();
        let at_run = format!("mount tmpfs mounthost-run {} ", run.display());
        assert!(e.rec.calls().iter().all(|c| !c.starts_with(&at_run)), "{:?}", e.rec.calls());
        let runtime = run.join("0123456789abcdef");
        e.rec.add_dir(&runtime);
        let err = e.node.write_secret_files(&runtime.join(SECRETS_DIR), &spawn(), &secrets(), None).unwrap_err();
        assert_eq!(err.kind, ErrorKind::FailedPrecondition, "{}", err.message);
        assert!(err.message.contains("not on one"), "{}", err.message);
        assert!(!e.rec.exists(&runtime.join(SECRETS_DIR)), "nothing written");
    }
}
