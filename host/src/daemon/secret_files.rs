//! Secrets handed to FUSE programs as files (WIT `arg.secret-file`, `value.secret-file`).
//!
//! Some programs read a credential only from a file (`-oIdentityFile=`, a service account
//! JSON). Before a spawn, each such secret is written to `<runtime>/secrets/<16 hex of
//! sha256(key)>` (mode 0600, directory 0700) through the executor, and the program gets the
//! file's path, never the value. The runtime directories' root, `<state>/run`, is a tmpfs the
//! daemon mounts at start (mode 0700), so these files never reach a disk, and they go away
//! with the volume's runtime directory at unstage (and with the tmpfs at reboot). The state
//! directory proper never holds them: a spawn that needs one while `<state>/run` is not a
//! tmpfs is refused rather than written to disk.

use std::path::{Path, PathBuf};

use tracing::{info, warn};

use super::Node;
use crate::error::Error;
use crate::plan::{MountOption, SECRETS_DIR, Step, secret_file_path, secret_files};
use crate::secrets::Secrets;

/// Mode of a secret file.
const SECRET_FILE_MODE: u32 = 0o600;
/// The source name the runtime tmpfs shows in mountinfo.
const RUN_SOURCE: &str = "mounthost-run";
/// The runtime tmpfs's size cap: it holds secret files, sockets and the FUSE programs' logs,
/// in memory, so a program that logs without end fills this, not the node's RAM.
const RUN_SIZE: &str = "256m";

impl Node {
    /// The root of the volumes' runtime directories, `<state>/run`.
    fn run_root(&self) -> PathBuf {
        self.inner.config.state_dir.join("run")
    }

    /// Mount a tmpfs (mode 0700) at `<state>/run` unless one is there already. Called once at
    /// daemon start, before reconciliation. A non-empty `<state>/run` on another filesystem
    /// (volumes staged by a version without it) is left alone: mounting over it would hide
    /// their sockets. Failing is not fatal (an unprivileged test daemon cannot mount): spawns
    /// that need secret files are then refused with the reason.
    pub fn mount_runtime_tmpfs(&self) {
        let run = self.run_root();
        match self.ensure_run_tmpfs(&run) {
            Ok(true) => info!(path = %run.display(), "mounted the runtime tmpfs"),
            Ok(false) => {}
            Err(e) => warn!(path = %run.display(), error = %e.message,
                "the runtime directories are not on a tmpfs; plans that deliver secrets as files are refused"),
        }
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

    /// Write the secret files `step` names into the volume's `runtime` directory (which must
    /// exist; the pipeline makes it before any step). Nothing to do for a step without any.
    pub fn write_secret_files(&self, runtime: &Path, step: &Step, secrets: &Secrets) -> Result<(), Error> {
        let keys = secret_files(step);
        if keys.is_empty() {
            return Ok(());
        }
        let dir = runtime.join(SECRETS_DIR);
        if self.run_fstype(&dir)?.as_deref() != Some("tmpfs") {
            return Err(Error::precondition(format!(
                "the plan delivers secrets as files, which are written only to a tmpfs, and {} is not on one; \
                 see the host daemon's start-up log",
                self.run_root().display()
            )));
        }
        let exec = &self.inner.exec;
        exec.private_dir(&dir).map_err(|e| super::pipeline::io_error(e, &dir))?;
        for key in keys {
            // The policy checked every referenced secret present before anything ran.
            let value = secrets.get(&key).ok_or_else(|| {
                Error::invalid(format!("the plan's secret file names secret {key:?}, which the request does not carry"))
            })?;
            let path = secret_file_path(runtime, &key);
            exec.write_file(&path, value.as_bytes(), SECRET_FILE_MODE)
                .map_err(|e| super::pipeline::io_error(e, &path))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::Config;
    use crate::error::ErrorKind;
    use crate::exec::Files;
    use crate::exec::recording::Recording;
    use crate::plan::{EnvVar, SpawnArg, Value};
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
        e.node.write_secret_files(&runtime, &spawn(), &secrets()).unwrap();
        for (key, value) in [("token", "hunter22"), ("key", "-----KEY-----")] {
            let file = secret_file_path(&runtime, key);
            assert_eq!(e.rec.read_file(&file).unwrap().as_deref(), Some(value.as_bytes()), "{key}");
            assert_eq!(e.rec.mode(&file), Some(0o600), "{key}");
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
        e.node.write_secret_files(&runtime, &plain, &secrets()).unwrap();
        assert!(e.rec.calls().is_empty(), "{:?}", e.rec.calls());
    }

    #[test]
    fn secrets_are_never_written_off_a_tmpfs() {
        let e = env();
        let run = e.state.join("run");
        // A volume staged before the runtime tmpfs existed: its directory is left alone.
        e.rec.add_dir(&run.join("feedfacefeedface"));
        e.node.mount_runtime_tmpfs();
        assert!(e.rec.calls().iter().all(|c| !c.starts_with("mount ")), "{:?}", e.rec.calls());
        let runtime = run.join("0123456789abcdef");
        e.rec.add_dir(&runtime);
        let err = e.node.write_secret_files(&runtime, &spawn(), &secrets()).unwrap_err();
        assert_eq!(err.kind, ErrorKind::FailedPrecondition, "{}", err.message);
        assert!(err.message.contains("not on one"), "{}", err.message);
        assert!(!e.rec.exists(&runtime.join(SECRETS_DIR)), "nothing written");
    }
}
