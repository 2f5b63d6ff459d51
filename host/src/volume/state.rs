//! One state file per volume: what the kernel cannot tell the daemon after a restart.
//!
//! Durability: a file is replaced atomically (temporary file, rename) before the operation
//! replies, so it survives any crash of the daemon. It is not fsync'd: everything it describes
//! (mounts, processes) dies with the kernel, and a daemon starting in a new boot discards every
//! record of an earlier boot, including one a kernel crash left torn (see `node::reconcile`).
//! An fsync would buy nothing and cost a journal commit per call.
//!
//! `<state-dir>/volumes/<key>.json`, where `key` is a hash of the volume id (ids may hold any
//! character); the id is stored inside and checked on load. Written atomically (temporary file,
//! rename) with mode 0600, with a schema `version`. It records
//! the plugin and digest the volume was staged with, the checked plan (which holds no secret
//! values), the FUSE process's identity, the published targets and the boot id, and nothing the
//! kernel already knows better (mounts are always read back from mountinfo).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::dirs::volume_key;
use crate::exec::fs;
use crate::exec::process::ProcessId;
use crate::plan::Plan;

/// The schema version this daemon writes and reads.
pub const SCHEMA_VERSION: u32 = 1;

/// Where a volume is in its life on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Stage started; recorded *before* the first step runs, so a crash mid-stage is seen.
    Staging,
    /// Stage completed.
    Staged,
    /// Unstage started; recorded before tear-down, so a crash mid-unstage is finished later.
    Unstaging,
}

/// One published target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Publication {
    /// Read-only, as the publish plan made it (a read-only access mode makes a read-only bind
    /// even when the CO's `readonly` flag is false).
    pub readonly: bool,
    /// The checked publish plan's steps, replayed to re-bind the target after a restage.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<crate::plan::Step>,
}

/// The persisted state of one volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VolumeState {
    /// Schema version ([`SCHEMA_VERSION`]).
    pub version: u32,
    /// The CSI volume id.
    pub volume_id: String,
    /// Plugin name and digest the volume was staged with (later calls pin this digest).
    pub plugin: String,
    /// See `plugin`.
    pub digest: String,
    /// `/proc/sys/kernel/random/boot_id` when the state was written: after a reboot nothing
    /// recorded here is running or mounted any more.
    pub boot_id: String,
    /// Where the volume is in its life.
    pub phase: Phase,
    /// The CSI staging path.
    pub staging_path: PathBuf,
    /// The volume context (never secrets).
    pub context: BTreeMap<String, String>,
    /// The checked stage plan.
    pub plan: Plan,
    /// The FUSE process, once spawned.
    pub process: Option<ProcessId>,
    /// Published targets.
    pub published: BTreeMap<PathBuf, Publication>,
    /// A CSI ephemeral inline volume: staged by the host itself (under its state directory)
    /// at the first publish, unstaged with the last unpublish.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ephemeral: bool,
    /// Times the host restarted the FUSE process after it died (self-heal).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restarts: u32,
    /// Times the OOM killer struck in the volume's cgroup, summed over its restarts.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub oom_kills: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl VolumeState {
    /// May a target be published? Only once staging completed.
    pub fn can_publish(&self) -> bool {
        self.phase == Phase::Staged
    }

    /// May the volume be unstaged? Not while targets are still published on it.
    pub fn can_unstage(&self) -> bool {
        self.published.is_empty()
    }
}

/// A state file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// I/O on the file.
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// The file is not valid state JSON.
    #[error("{path} is not a valid state file: {source}")]
    Corrupt { path: PathBuf, source: serde_json::Error },
    /// Written by a daemon with another schema.
    #[error("{path} has schema version {found}; this daemon reads version {SCHEMA_VERSION}")]
    Version { path: PathBuf, found: u32 },
    /// The file belongs to another volume (hash collision or a file moved by hand).
    #[error("{path} holds volume {found:?}, not {expected:?}")]
    WrongVolume { path: PathBuf, expected: String, found: String },
    /// A file whose name is not the one its volume's state is kept under.
    #[error("{path} holds volume {found:?}, whose state belongs in {belongs}")]
    Misplaced { path: PathBuf, found: String, belongs: PathBuf },
}

/// One state file found by [`StateStore::list`]: its path, and its state or why it is unusable.
pub type Listed = (PathBuf, Result<VolumeState, StateError>);

/// The folder of state files.
#[derive(Debug, Clone)]
pub struct StateStore {
    dir: PathBuf,
}

impl StateStore {
    /// Open (and create, 0700) `<state-dir>/volumes`.
    pub fn open(state_dir: &Path) -> Result<Self, StateError> {
        let dir = state_dir.join("volumes");
        fs::private_dir(&dir).map_err(|source| StateError::Io { path: dir.clone(), source })?;
        Ok(StateStore { dir })
    }

    /// The file of `volume_id`.
    pub fn path(&self, volume_id: &str) -> PathBuf {
        self.dir.join(format!("{}.json", volume_key(volume_id)))
    }

    /// Write `state` atomically.
    pub fn save(&self, state: &VolumeState) -> Result<(), StateError> {
        let path = self.path(&state.volume_id);
        let json = serde_json::to_vec_pretty(state).expect("state always serializes");
        fs::replace_atomic(&path, &json, 0o600).map_err(|source| StateError::Io { path, source })
    }

    /// The state of `volume_id`, or `None` if it has none.
    pub fn load(&self, volume_id: &str) -> Result<Option<VolumeState>, StateError> {
        let path = self.path(volume_id);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(StateError::Io { path, source }),
        };
        let state = parse(&path, &bytes)?;
        if state.volume_id != volume_id {
            return Err(StateError::WrongVolume { path, expected: volume_id.into(), found: state.volume_id });
        }
        Ok(Some(state))
    }

    /// Forget `volume_id` and its kept secrets (no error if it had none).
    pub fn remove(&self, volume_id: &str) -> Result<(), StateError> {
        self.remove_secrets(volume_id)?;
        let path = self.path(volume_id);
        fs::remove_file(&path).map_err(|source| StateError::Io { path, source })
    }

    /// Keep the secrets a volume's plan references, so the host can restart its FUSE process
    /// after a crash without kubelet: `<state-dir>/secrets/<key>.json`, 0600 in a 0700 folder
    /// (root only, like `/proc/<pid>/environ` of the process that holds them anyway).
    pub fn save_secrets(&self, volume_id: &str, secrets: &BTreeMap<String, String>) -> Result<(), StateError> {
        let path = self.secrets_path(volume_id);
        if secrets.is_empty() {
            return fs::remove_file(&path).map_err(|source| StateError::Io { path, source });
        }
        let dir = path.parent().expect("has a parent").to_path_buf();
        fs::private_dir(&dir).map_err(|source| StateError::Io { path: dir, source })?;
        let json = serde_json::to_vec(secrets).expect("strings serialize");
        fs::replace_atomic(&path, &json, 0o600).map_err(|source| StateError::Io { path, source })
    }

    /// The secrets kept for `volume_id` (empty if none).
    pub fn load_secrets(&self, volume_id: &str) -> Result<BTreeMap<String, String>, StateError> {
        let path = self.secrets_path(volume_id);
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|source| StateError::Corrupt { path, source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
            Err(source) => Err(StateError::Io { path, source }),
        }
    }

    /// Forget the kept secrets of `volume_id`.
    pub fn remove_secrets(&self, volume_id: &str) -> Result<(), StateError> {
        let path = self.secrets_path(volume_id);
        fs::remove_file(&path).map_err(|source| StateError::Io { path, source })
    }

    fn secrets_path(&self, volume_id: &str) -> PathBuf {
        self.dir.with_file_name("secrets").join(format!("{}.json", volume_key(volume_id)))
    }

    /// Remove the temporary files of writers killed mid-write (state and kept secrets). Only
    /// at start, while no writer of this store is alive. Returns how many were removed.
    pub fn remove_stray_temporaries(&self) -> Result<usize, StateError> {
        let mut removed = 0;
        for dir in [self.dir.clone(), self.dir.with_file_name("secrets")] {
            removed += crate::exec::fs::remove_stray_temporaries(&dir)
                .map_err(|source| StateError::Io { path: dir, source })?;
        }
        Ok(removed)
    }

    /// The keys (file stems) of every state file, read from the folder without parsing.
    pub fn keys(&self) -> Result<std::collections::BTreeSet<String>, StateError> {
        let entries =
            std::fs::read_dir(&self.dir).map_err(|source| StateError::Io { path: self.dir.clone(), source })?;
        Ok(entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                (!name.starts_with('.')).then(|| name.strip_suffix(".json").map(str::to_string)).flatten()
            })
            .collect())
    }

    /// Every state file, each parsed or with its error (for reconciliation at start). Stray
    /// temporary files from an interrupted write are skipped (start-up removes them).
    pub fn list(&self) -> Result<Vec<Listed>, StateError> {
        let entries =
            std::fs::read_dir(&self.dir).map_err(|source| StateError::Io { path: self.dir.clone(), source })?;
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') || !name.ends_with(".json") {
                continue;
            }
            let parsed = std::fs::read(&path)
                .map_err(|source| StateError::Io { path: path.clone(), source })
                .and_then(|b| parse(&path, &b))
                .and_then(|state| {
                    let belongs = self.path(&state.volume_id);
                    if belongs == path {
                        Ok(state)
                    } else {
                        Err(StateError::Misplaced { path: path.clone(), found: state.volume_id, belongs })
                    }
                });
            out.push((path, parsed));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

fn parse(path: &Path, bytes: &[u8]) -> Result<VolumeState, StateError> {
    #[derive(Deserialize)]
    struct Versioned {
        version: u32,
    }
    let v: Versioned =
        serde_json::from_slice(bytes).map_err(|source| StateError::Corrupt { path: path.to_path_buf(), source })?;
    if v.version != SCHEMA_VERSION {
        return Err(StateError::Version { path: path.to_path_buf(), found: v.version });
    }
    serde_json::from_slice(bytes).map_err(|source| StateError::Corrupt { path: path.to_path_buf(), source })
}

/// This boot's id.
pub fn boot_id() -> std::io::Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?.trim().to_string())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::plan::{EnvVar, Step, Value};

    fn state(id: &str) -> VolumeState {
        VolumeState {
            version: SCHEMA_VERSION,
            volume_id: id.into(),
            plugin: "seaweedfs".into(),
            digest: format!("sha256:{}", "a".repeat(64)),
            boot_id: boot_id().unwrap(),
            phase: Phase::Staging,
            staging_path: "/var/lib/kubelet/plugins/kubernetes.io/csi/csi.mounthost.dev/h/globalmount".into(),
            context: [("filer".to_string(), "f:8888".to_string())].into(),
            plan: Plan {
                plugin: "seaweedfs".into(),
                digest: format!("sha256:{}", "a".repeat(64)),
                steps: vec![Step::SpawnFuse {
                    program: "weed".into(),
                    executable: "/usr/local/bin/weed".into(),
                    args: vec!["mount".into()],
                    env: vec![EnvVar {
                        name: "WEED_JWT_SIGNING_KEY".into(),
                        value: Value::Secret("jwtSigningKey".into()),
                    }],
                    mountpoint: "/m".into(),
                    fstype: "fuse.seaweedfs".into(),
                    ready_timeout_ms: 30_000,
                    memory_limit_bytes: None,
                }],
                attributes: vec![],
            },
            process: Some(ProcessId { pid: 42, start_time: 7 }),
            published: BTreeMap::new(),
            ephemeral: false,
            restarts: 0,
            oom_kills: 0,
        }
    }

    #[test]
    fn round_trip_is_private_and_atomic() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path()).unwrap();
        let id = "pvc/with spaces/and-a-very-long-id".repeat(3);
        assert_eq!(store.load(&id).unwrap(), None);
        let mut s = state(&id);
        store.save(&s).unwrap();
        s.phase = Phase::Staged;
        s.published.insert("/pods/u/mount".into(), Publication { readonly: true, steps: Vec::new() });
        store.save(&s).unwrap();
        assert_eq!(store.load(&id).unwrap(), Some(s.clone()));
        let path = store.path(&id);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(path.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o700);
        assert!(!std::fs::read_to_string(&path).unwrap().contains("secretvalue"));
        assert_eq!(store.list().unwrap().len(), 1, "no temporary files left");
        store.remove(&id).unwrap();
        store.remove(&id).unwrap();
        assert_eq!(store.load(&id).unwrap(), None);
    }

    #[test]
    fn kept_secrets_are_private_and_go_with_the_volume() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path()).unwrap();
        assert!(store.load_secrets("v").unwrap().is_empty());
        let kept: BTreeMap<String, String> = [("jwtSigningKey".to_string(), "s3cr3t-value".to_string())].into();
        store.save_secrets("v", &kept).unwrap();
        assert_eq!(store.load_secrets("v").unwrap(), kept);
        let file = dir.path().join("secrets").join(format!("{}.json", volume_key("v")));
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(file.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o700);
        store.save(&state("v")).unwrap();
        assert!(!std::fs::read_to_string(store.path("v")).unwrap().contains("s3cr3t-value"), "never in the state file");
        store.remove("v").unwrap();
        assert!(!file.exists(), "removed with the volume");
        store.save_secrets("v", &BTreeMap::new()).unwrap();
        assert!(!file.exists(), "nothing is written when the plan references no secret");
    }

    #[test]
    fn transitions_are_gated() {
        let mut s = state("v");
        assert!(!s.can_publish(), "not before stage completed");
        s.phase = Phase::Staged;
        assert!(s.can_publish() && s.can_unstage());
        s.published.insert("/t".into(), Publication { readonly: false, steps: Vec::new() });
        assert!(!s.can_unstage(), "not while published");
    }

    #[test]
    fn bad_files_are_reported_never_guessed() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path()).unwrap();
        std::fs::write(store.path("torn"), b"{\"version\":1,\"volumeId\":").unwrap();
        assert!(matches!(store.load("torn").unwrap_err(), StateError::Corrupt { .. }));
        let mut future = serde_json::to_value(state("future")).unwrap();
        future["version"] = 2.into();
        std::fs::write(store.path("future"), future.to_string()).unwrap();
        let err = store.load("future").unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("{} has schema version 2; this daemon reads version 1", store.path("future").display())
        );
        std::fs::write(store.path("moved"), serde_json::to_vec(&state("other")).unwrap()).unwrap();
        assert!(matches!(store.load("moved").unwrap_err(), StateError::WrongVolume { .. }));
        let mut unknown = serde_json::to_value(state("x")).unwrap();
        unknown["surprise"] = true.into();
        std::fs::write(store.path("x"), unknown.to_string()).unwrap();
        assert!(matches!(store.load("x").unwrap_err(), StateError::Corrupt { .. }));
        std::fs::write(dir.path().join("volumes/.abc.json.tmp.1"), b"partial").unwrap();
        let listed = store.list().unwrap();
        assert_eq!(listed.len(), 4, "every state file is listed, temporaries skipped");
        assert!(listed.iter().all(|(_, r)| r.is_err()));
    }
}
