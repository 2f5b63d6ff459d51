//! One state file per volume: what the kernel cannot tell the daemon after a restart.
//!
//! Durability: a file is replaced atomically (its spare `.<key>.json.spare` rewritten in place
//! and swapped in with `RENAME_EXCHANGE`, see [`crate::exec::beneath`]) before the operation
//! replies, so it survives any crash of the daemon. It is not fsync'd: everything it describes
//! (mounts, processes) dies with the kernel, and a daemon starting in a new boot discards every
//! record of an earlier boot, including one a kernel crash left torn (see `daemon::reconcile`).
//! An fsync would buy nothing and cost a journal commit per call.
//!
//! `<state-dir>/volumes/<key>.json`, where `key` is a hash of the volume id (ids may hold any
//! character); the id is stored inside and checked on load. Mode 0600, with a schema
//! `version`. It records the plugin and digest the volume was staged with (and whether the user
//! pinned that digest), the checked plan (which holds no secret values), the FUSE process's
//! identity and cgroup, the published targets and the boot id, and nothing the kernel already
//! knows better (mounts are always read back from mountinfo).
//!
//! Schema versions: a file of an older schema this daemon knows is migrated when it is read
//! (and written in the current schema at the volume's next save); a file of a newer schema, or
//! of one too old, is never guessed at and never rewritten: the volume is refused
//! (FAILED_PRECONDITION, naming both versions) and left as it is, and every other volume is
//! served. Any change to the format is a new version: a newer field an older daemon does not
//! know would otherwise be dropped by its next save.
//!
//! | schema | written by | what changed |
//! |---|---|---|
//! | 1 | mounthost 0.1.0 | first |
//! | 2 | an earlier release | `cgroup`: the volume's cgroup, recorded, so each daemon owns the groups its records name (schema 1 volumes keep `<cgroup-parent>/<key>`, where every earlier release put them) |
//! | 3 | an earlier release | lazy volumes (docs/lazy.md): a `spawn-fuse` step's `lazy` (the host's own server and the layers it serves), a dynamic mount's `process`; a schema 2 record has neither and reads as it is |
//! | 4 | an earlier release | a dynamic volume's limits: a publication's `dynamicLimits` (what its attributes lowered) and a dynamic mount's `bytes` (what it counts against the byte cap); a schema 3 record has neither and reads as it is (no limit lowered; a mount counts what its recorded steps fetch) |
//! | 5 | this release | signatures (docs/signing.md): `signedBy` (the volume's signature policy, which its dynamic mounts inherit), `chunkIndexRequired`, and `verified` (who signed what the stage mounted, the chunk index it pinned); a schema 4 record has none and reads as it is (no policy of its own, nothing verified) |
//!
//! A record is written in the oldest schema that holds it ([`VolumeState::oldest_schema`]):
//! this release writes schema 5 only for volumes with a signature policy or a verified
//! signature or pinned chunk index, 4 for dynamic volumes whose attributes lower a limit or
//! whose mounts count bytes, 3 for other lazy volumes, 2 for the rest, so a daemon of an
//! earlier release reads every volume that uses nothing newer, and refuses (FAILED_PRECONDITION,
//! naming both versions) one whose limits or signature policy it would drop at its next save. Records that daemons
//! between schemas 3 and 4 wrote with these fields under an older version still read here.
//!
//! Every read and write goes through the executor's [`Files`] (paths resolved below the state
//! directory without following links), so the recording executor sees them in unit tests.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::dirs::volume_key;
use crate::exec::Files;
use crate::exec::beneath::{SPARE_MARK, TMP_MARK};
use crate::exec::process::ProcessId;
use crate::plan::Plan;

/// The schema version this daemon writes (and the newest it reads).
pub const SCHEMA_VERSION: u32 = 5;

/// The oldest schema version this daemon reads, migrating it to [`SCHEMA_VERSION`].
pub const OLDEST_SCHEMA_VERSION: u32 = 1;

/// Which schema versions a store reads and how it migrates the older ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema {
    /// The version written, and the newest read ([`SCHEMA_VERSION`] in this build; a test
    /// passes an older one to act as a daemon built with that constant).
    pub newest: u32,
    /// The `--cgroup-parent` this daemon runs with: schema 1 records had no `cgroup` field, and
    /// their groups are `<cgroup-parent>/<key>`.
    pub legacy_cgroup_parent: String,
}

impl Schema {
    /// This build's schema, migrating schema 1 records' cgroups from `cgroup_parent`.
    pub fn current(cgroup_parent: &str) -> Schema {
        Schema { newest: SCHEMA_VERSION, legacy_cgroup_parent: cgroup_parent.to_string() }
    }
}

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

impl Phase {
    /// The name the state file uses (`staging`, `staged`, `unstaging`).
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Staging => "staging",
            Phase::Staged => "staged",
            Phase::Unstaging => "unstaging",
        }
    }
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
    /// A dynamic volume's publication (`daemon::dynamic`), with the plugins its pod may mount
    /// through its socket: the steps mount the host's small tmpfs at the target, the plugin's
    /// publish under `volume/`, and serve `csi.sock`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic: Option<Vec<String>>,
    /// What a dynamic volume's attributes lowered of the node's limits on its mounts.
    #[serde(default, skip_serializing_if = "crate::volume::request::DynamicLimits::is_default")]
    pub dynamic_limits: crate::volume::request::DynamicLimits,
}

/// Where a pod's dynamic mount is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MountPhase {
    /// Accepted and recorded; planning, downloading or about to mount (a restarted daemon
    /// takes it up again).
    Pending,
    /// Mounted.
    Ready,
    /// Failed for good; `reason` says why.
    Failed,
}

/// A pod's dynamic mount into its own volume (`daemon::dynamic`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DynamicMount {
    /// The plugin that plans it.
    pub plugin: String,
    /// What the pod asked for (no secrets: the API carries none).
    pub parameters: BTreeMap<String, String>,
    pub phase: MountPhase,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The checked plan's steps once planned (what a restart mounts again).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<crate::plan::Step>,
    /// The bytes its plan fetches (its `fetch-blob` steps' sizes, or a lazy mount's layers'),
    /// counted against the volume's `dynamicMaxMiB`.
    #[serde(default, skip_serializing_if = "is_zero_bytes")]
    pub bytes: u64,
    /// A lazy mount's server (the host's own, docs/lazy.md), once started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessId>,
}

fn is_zero_bytes(n: &u64) -> bool {
    *n == 0
}

/// The persisted state of one volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VolumeState {
    /// Schema version ([`SCHEMA_VERSION`]).
    pub version: u32,
    /// The CSI volume id.
    pub volume_id: String,
    /// Plugin name and digest of the build the volume was staged with; later calls use this
    /// build while the node has it (see `pinned` for when it does not).
    pub plugin: String,
    /// See `plugin`.
    pub digest: String,
    /// The digest was pinned by the user (the `pluginDigest` volume attribute at stage): later
    /// calls use exactly that build or fail. When not pinned and the recorded build no longer
    /// loads (an image upgrade replaced a stock plugin), they use the current build of the same
    /// plugin and the digest is updated at the next save. Records written before this field
    /// existed read as not pinned.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pinned: bool,
    /// For a plugin selected by OCI reference (`plugin: oci://…`): that reference pinned to the
    /// manifest it resolved to at stage (`oci://registry/repository[:tag]@sha256:…`); `digest`
    /// is then the layer's, and later calls reload exactly that build (from the node's blob
    /// cache after a restart). Such a volume is always `pinned`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
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
    /// The volume's cgroup, relative to the hierarchy's root: `<cgroup-parent>-<instance>/<key>`
    /// ([`crate::exec::instance`]), recorded with the first record of a stage, before the group
    /// is made. A daemon releases, reads and sweeps only groups its records name or that lie
    /// below its own instance's parent, so two daemons never touch each other's processes.
    /// Migrated schema 1 records hold `<cgroup-parent>/<key>`.
    pub cgroup: String,
    /// Times the host restarted the FUSE process after it died (self-heal).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restarts: u32,
    /// Times the OOM killer struck in the volume's cgroup, summed over its restarts.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub oom_kills: u32,
    /// The capability it was staged with: a restage with an incompatible one is refused
    /// (records written before this field existed have none and accept any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability: Option<StagedCapability>,
    /// A dynamic volume's mounts, by id (at most one publication of such a volume).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub dynamic: BTreeMap<String, DynamicMount>,
    /// The user and group id its FUSE program runs as when the host mounts for it (WIT
    /// `fuse-mount.host-fd`): one of `--fuse-ids` no other volume has, allocated at stage and
    /// recorded before the program first runs, kept until unstage (restarts, restages and a
    /// restarted daemon use it again). Records written before this field existed have none and
    /// get one at their next (re)stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuse_id: Option<u32>,
    /// The volume's signature policy: the trust entries its `signedBy` attribute names
    /// (docs/signing.md). Kept for its dynamic mounts, which inherit it, and for a restage,
    /// which must ask for the same.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub signed_by: Vec<String>,
    /// The volume's `chunkIndex: required`: a lazy stage without a chunk index fails.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub chunk_index_required: bool,
    /// What the stage verified of the OCI artifact it mounts: who signed it, the chunk index it
    /// pinned. A restage of the same manifest keeps it (the registry's signatures and indexes
    /// are not looked up again while the volume stays staged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified: Option<Verification>,
}

/// What a stage verified of the artifact it mounts (docs/signing.md).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Verification {
    /// The manifest the volume mounts.
    pub manifest: String,
    /// The trust entry whose key or CA verified the model's signature (none: not signed, or no
    /// policy asked for one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signer: Option<String>,
    /// The certificate identity (subjectAltName) the entry pinned, when it pins one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// The digest of the Sigstore bundle that verified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<String>,
    /// Where that bundle was found: `referrer` or `model.sig` (a file of the artifact).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub found_in: Option<String>,
    /// The chunk index a lazy volume checks every chunk against, pinned at its first stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<String>,
    /// That index's size in bytes (to fetch it again by digest).
    #[serde(default, skip_serializing_if = "is_zero_bytes")]
    pub index_size: u64,
    /// The trust entry that signed that index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_signer: Option<String>,
}

/// The parts of a CSI volume capability a restage must match.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StagedCapability {
    /// The access mode, as the CSI spec names it (`SINGLE_NODE_WRITER`, ...).
    pub access_mode: String,
    /// The filesystem type asked for (empty when the CO did not say).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub fs_type: String,
    /// The CO's mount flags.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mount_flags: Vec<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl VolumeState {
    /// The oldest schema that holds this record: 5 for a volume with a signature policy or a
    /// verification, 4 for a dynamic volume whose publication
    /// lowers a limit or one of whose mounts counts bytes (what schema 4 added), 3 for a lazy
    /// volume, or a volume with a lazy dynamic mount (what schema 3 added), else 2.
    pub fn oldest_schema(&self) -> u32 {
        let lazy = |steps: &[crate::plan::Step]| crate::plan::lazy::layers_of(steps).is_some();
        let limits = self.published.values().any(|p| !p.dynamic_limits.is_default())
            || self.dynamic.values().any(|d| d.bytes != 0);
        if !self.signed_by.is_empty() || self.chunk_index_required || self.verified.is_some() {
            5
        } else if limits {
            4
        } else if lazy(&self.plan.steps) || self.dynamic.values().any(|d| d.process.is_some() || lazy(&d.steps)) {
            3
        } else {
            2
        }
    }

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
    /// Written by a daemon with a schema this one does not read (a newer one, after a
    /// rollback; or one older than any it migrates).
    #[error(
        "{path} has schema version {found}{}; this daemon reads versions {OLDEST_SCHEMA_VERSION} to {newest}: the volume is left as it is (see docs/install.md, \"Upgrades and rollbacks\")",
        if found > newest { ", written by a newer mounthost" } else { "" }
    )]
    Version { path: PathBuf, found: u32, newest: u32 },
    /// The file belongs to another volume (hash collision or a file moved by hand).
    #[error("{path} holds volume {found:?}, not {expected:?}")]
    WrongVolume { path: PathBuf, expected: String, found: String },
    /// A file whose name is not the one its volume's state is kept under.
    #[error("{path} holds volume {found:?}, whose state belongs in {belongs}")]
    Misplaced { path: PathBuf, found: String, belongs: PathBuf },
    /// The record names a cgroup that is not one of this daemon's volume groups: a daemon
    /// kills what runs in a volume's group at unstage, so it never trusts a name it would not
    /// have made itself.
    #[error(
        "{path} names the cgroup {cgroup:?}, which is not a volume group of --cgroup-parent {parent:?} (<parent>/{key} or <parent>-<instance id>/{key})"
    )]
    ForeignCgroup { path: PathBuf, cgroup: String, parent: String, key: String },
    /// The file was found unusable when the folder was read (see the start-up log).
    #[error("{path} is unusable: {reason}")]
    Unusable { path: PathBuf, reason: String, schema: bool },
}

impl StateError {
    /// The file is unusable because of its schema version, not because it is damaged.
    pub fn is_schema(&self) -> bool {
        matches!(self, StateError::Version { .. } | StateError::Unusable { schema: true, .. })
    }
}

/// What records of another schema hold ([`StateStore::refused_claims`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RefusedClaims {
    /// FUSE ids they record.
    pub fuse_ids: BTreeSet<u32>,
    /// Blob digests they mention.
    pub digests: BTreeSet<String>,
}

/// Every string in `v` that is a blob digest.
fn collect_digests(v: &serde_json::Value, out: &mut BTreeSet<String>) {
    match v {
        serde_json::Value::String(s) => {
            let hex = s.strip_prefix("sha256:").unwrap_or_default();
            if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
                out.insert(s.clone());
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| collect_digests(x, out)),
        serde_json::Value::Object(o) => o.values().for_each(|x| collect_digests(x, out)),
        _ => {}
    }
}

/// One state file found by [`StateStore::list`]: its path, and its state or why it is unusable.
pub type Listed = (PathBuf, Result<VolumeState, StateError>);

/// What the index holds for one file: its state, or why it is unusable (and whether that is
/// its schema version).
type Indexed = Result<VolumeState, (String, bool)>;

/// The folder of state files, read and written through the executor, with an index in memory:
/// every write goes to the file first and then to the index, so the index is the folder as
/// this daemon left it and a call reads no file. A restarted daemon rebuilds it from the folder.
pub struct StateStore {
    dir: PathBuf,
    secrets_dir: PathBuf,
    schema: Schema,
    files: Arc<dyn Files + Send + Sync>,
    /// By key (file stem); `None` until first read.
    index: Mutex<Option<BTreeMap<String, Indexed>>>,
}

impl std::fmt::Debug for StateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateStore").field("dir", &self.dir).finish_non_exhaustive()
    }
}

impl StateStore {
    /// Open (and create, 0700) `<state-dir>/volumes`, reading the schema versions `schema` names.
    pub fn open(state_dir: &Path, files: Arc<dyn Files + Send + Sync>, schema: Schema) -> Result<Self, StateError> {
        let dir = state_dir.join("volumes");
        files.private_dir(&dir).map_err(|source| StateError::Io { path: dir.clone(), source })?;
        Ok(StateStore { secrets_dir: state_dir.join("secrets"), dir, schema, files, index: Mutex::new(None) })
    }

    /// The file of `volume_id`.
    pub fn path(&self, volume_id: &str) -> PathBuf {
        self.dir.join(format!("{}.json", volume_key(volume_id)))
    }

    fn indexed<T>(&self, f: impl FnOnce(&mut BTreeMap<String, Indexed>) -> T) -> Result<T, StateError> {
        let mut index = self.index.lock().unwrap_or_else(|p| p.into_inner());
        if index.is_none() {
            let listed = self.read_folder()?;
            *index = Some(
                listed.into_iter().map(|(p, r)| (stem(&p), r.map_err(|e| (e.to_string(), e.is_schema())))).collect(),
            );
        }
        Ok(f(index.as_mut().expect("loaded above")))
    }

    /// Write `state` atomically.
    /// The record says the oldest schema that holds it ([`VolumeState::oldest_schema`]), so a
    /// daemon of an earlier release still reads every volume that uses nothing newer.
    pub fn save(&self, state: &VolumeState) -> Result<(), StateError> {
        let path = self.path(&state.volume_id);
        let written = VolumeState { version: state.oldest_schema().min(self.schema.newest), ..state.clone() };
        let json = serde_json::to_vec(&written).expect("state always serializes");
        self.files.write_file(&path, &json, 0o600).map_err(|source| StateError::Io { path: path.clone(), source })?;
        self.indexed(|i| i.insert(stem(&path), Ok(state.clone())))?;
        Ok(())
    }

    /// The state of `volume_id`, or `None` if it has none.
    pub fn load(&self, volume_id: &str) -> Result<Option<VolumeState>, StateError> {
        let path = self.path(volume_id);
        match self.indexed(|i| i.get(&stem(&path)).cloned())? {
            None => Ok(None),
            Some(Ok(st)) if st.volume_id == volume_id => Ok(Some(st)),
            Some(Ok(st)) => Err(StateError::WrongVolume { path, expected: volume_id.into(), found: st.volume_id }),
            Some(Err((reason, schema))) => Err(StateError::Unusable { path, reason, schema }),
        }
    }

    /// The plugin `volume_id`'s state records, from the index, without copying the state.
    pub fn plugin_of(&self, volume_id: &str) -> Option<String> {
        let key = stem(&self.path(volume_id));
        self.indexed(|i| match i.get(&key) {
            Some(Ok(st)) if st.volume_id == volume_id => Some(st.plugin.clone()),
            _ => None,
        })
        .ok()
        .flatten()
    }

    /// Every usable state, from the index.
    pub fn all(&self) -> Result<Vec<VolumeState>, StateError> {
        self.indexed(|i| i.values().filter_map(|r| r.as_ref().ok().cloned()).collect())
    }

    /// Forget `volume_id` and its kept secrets (no error if it had none).
    pub fn remove(&self, volume_id: &str) -> Result<(), StateError> {
        self.remove_secrets(volume_id)?;
        let path = self.path(volume_id);
        self.remove_file(&path)
    }

    /// Remove one state file (also an unusable one) by path.
    pub fn remove_file(&self, path: &Path) -> Result<(), StateError> {
        self.files.remove_entry(path).map_err(|source| StateError::Io { path: path.to_path_buf(), source })?;
        self.indexed(|i| i.remove(&stem(path)))?;
        Ok(())
    }

    /// Keep the secrets a volume's plan references, so the host can restart its FUSE process
    /// after a crash without kubelet: `<state-dir>/secrets/<key>.json`, 0600 in a 0700 folder
    /// (root only, like `/proc/<pid>/environ` of the process that holds them anyway).
    pub fn save_secrets(&self, volume_id: &str, secrets: &BTreeMap<String, String>) -> Result<(), StateError> {
        let path = self.secrets_path(volume_id);
        if secrets.is_empty() {
            return self.files.remove_entry(&path).map_err(|source| StateError::Io { path, source });
        }
        let dir = self.secrets_dir.clone();
        self.files.private_dir(&dir).map_err(|source| StateError::Io { path: dir, source })?;
        let kept = KeptSecrets { version: SECRETS_SCHEMA_VERSION, secrets: secrets.clone() };
        let json = serde_json::to_vec(&kept).expect("strings serialize");
        self.files.write_secret_file(&path, &json, 0o600).map_err(|source| StateError::Io { path, source })
    }

    /// The secrets kept for `volume_id` (empty if none).
    pub fn load_secrets(&self, volume_id: &str) -> Result<BTreeMap<String, String>, StateError> {
        let path = self.secrets_path(volume_id);
        match self.files.read_file(&path) {
            Ok(Some(b)) => parse_secrets(&path, &b),
            Ok(None) => Ok(BTreeMap::new()),
            Err(source) => Err(StateError::Io { path, source }),
        }
    }

    /// Forget the kept secrets of `volume_id`.
    pub fn remove_secrets(&self, volume_id: &str) -> Result<(), StateError> {
        let path = self.secrets_path(volume_id);
        self.files.remove_entry(&path).map_err(|source| StateError::Io { path, source })
    }

    fn secrets_path(&self, volume_id: &str) -> PathBuf {
        self.secrets_dir.join(format!("{}.json", volume_key(volume_id)))
    }

    /// Remove the temporary files of writers killed mid-write (state and kept secrets). Only
    /// at start, while no writer of this store is alive. Returns how many were removed.
    pub fn remove_stray_temporaries(&self) -> Result<usize, StateError> {
        let mut removed = 0;
        for (dir, secrets) in [(&self.dir, false), (&self.secrets_dir, true)] {
            let entries = self.files.list_dir(dir).map_err(|source| StateError::Io { path: dir.clone(), source })?;
            let names: BTreeSet<String> = entries.iter().map(|e| e.name.to_string_lossy().into_owned()).collect();
            for e in &entries {
                let name = e.name.to_string_lossy();
                // A spare whose file is gone (a crash between removing the two), and any spare
                // among the secrets, which are written without one: it can only hold an earlier
                // value (a crash right after a write, or a write of an older version).
                let spare_of = name.strip_prefix('.').and_then(|n| n.strip_suffix(SPARE_MARK));
                let orphan_spare = spare_of.is_some_and(|live| !names.contains(live) || secrets);
                if name.starts_with('.') && (name.contains(TMP_MARK) || orphan_spare) && e.is_file {
                    let path = dir.join(&e.name);
                    self.files.remove_entry(&path).map_err(|source| StateError::Io { path, source })?;
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }

    /// What the records this daemon refuses for their schema (a newer daemon's, after a
    /// rollback) still hold on the node, read leniently from their JSON: every FUSE id
    /// (`fuseId`) and every blob digest (`sha256:<64 hex>`) they mention. Nothing is inferred from
    /// them but "taken": the blob cache evicts none of those digests and no new volume gets
    /// one of those ids. Reads only those files; none when every record is usable.
    pub fn refused_claims(&self) -> Result<RefusedClaims, StateError> {
        let refused: Vec<String> =
            self.indexed(|i| i.iter().filter(|(_, r)| matches!(r, Err((_, true)))).map(|(k, _)| k.clone()).collect())?;
        let mut claims = RefusedClaims::default();
        for key in refused {
            let path = self.dir.join(format!("{key}.json"));
            let Ok(Some(bytes)) = self.files.read_file(&path) else { continue };
            let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&bytes) else { continue };
            if let Some(id) = doc.get("fuseId").and_then(serde_json::Value::as_u64).and_then(|v| u32::try_from(v).ok())
            {
                claims.fuse_ids.insert(id);
            }
            collect_digests(&doc, &mut claims.digests);
        }
        Ok(claims)
    }

    /// The keys (file stems) of every state file, usable or not, from the index.
    pub fn keys(&self) -> Result<BTreeSet<String>, StateError> {
        self.indexed(|i| i.keys().cloned().collect())
    }

    /// Every state file, each parsed or with its error, read from the folder (for
    /// reconciliation at start; the index is not touched). Stray temporary files from an
    /// interrupted write are skipped (start-up removes them).
    pub fn list(&self) -> Result<Vec<Listed>, StateError> {
        self.read_folder()
    }

    fn read_folder(&self) -> Result<Vec<Listed>, StateError> {
        let entries =
            self.files.list_dir(&self.dir).map_err(|source| StateError::Io { path: self.dir.clone(), source })?;
        let mut out = Vec::new();
        for entry in entries {
            let name = entry.name.to_string_lossy();
            if name.starts_with('.') || !name.ends_with(".json") {
                continue;
            }
            let path = self.dir.join(&entry.name);
            let parsed = match self.files.read_file(&path) {
                Ok(Some(b)) => parse(&path, &b, &self.schema),
                Ok(None) => continue,
                Err(source) => Err(StateError::Io { path: path.clone(), source }),
            }
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

/// The schema version of kept secrets files. Schema 1 (mounthost 0.1.0) was the bare object of
/// names and values, without a version; schema 2 wraps it as `{"version": 2, "secrets": {...}}`.
pub const SECRETS_SCHEMA_VERSION: u32 = 2;

/// A kept secrets file (schema 2).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeptSecrets {
    version: u32,
    secrets: BTreeMap<String, String>,
}

/// Read kept secrets of schema 1 or 2. A schema 1 file cannot be mistaken for a later one: its
/// values are all strings, and a later one's `version` is a number.
fn parse_secrets(path: &Path, bytes: &[u8]) -> Result<BTreeMap<String, String>, StateError> {
    let corrupt = |source| StateError::Corrupt { path: path.to_path_buf(), source };
    let doc: serde_json::Value = serde_json::from_slice(bytes).map_err(corrupt)?;
    match doc.get("version").and_then(serde_json::Value::as_u64) {
        None => serde_json::from_value(doc).map_err(corrupt),
        Some(v) if v <= u64::from(SECRETS_SCHEMA_VERSION) => {
            Ok(serde_json::from_value::<KeptSecrets>(doc).map_err(corrupt)?.secrets)
        }
        Some(v) => Err(StateError::Version {
            path: path.to_path_buf(),
            found: u32::try_from(v).unwrap_or(u32::MAX),
            newest: SECRETS_SCHEMA_VERSION,
        }),
    }
}

fn stem(path: &Path) -> String {
    path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}

/// Read a record of any schema version `schema` knows, migrating an older one in memory.
fn parse(path: &Path, bytes: &[u8], schema: &Schema) -> Result<VolumeState, StateError> {
    let corrupt = |source| StateError::Corrupt { path: path.to_path_buf(), source };
    let mut doc: serde_json::Value = serde_json::from_slice(bytes).map_err(corrupt)?;
    let found = match doc.get("version").and_then(serde_json::Value::as_u64) {
        Some(v) => u32::try_from(v).unwrap_or(u32::MAX),
        // Let serde name what is wrong (a missing or non-numeric version).
        None => return serde_json::from_value(doc).map_err(corrupt),
    };
    if found > schema.newest || found < OLDEST_SCHEMA_VERSION {
        return Err(StateError::Version { path: path.to_path_buf(), found, newest: schema.newest });
    }
    for from in found..schema.newest {
        migrate(&mut doc, from, schema);
    }
    let st: VolumeState = serde_json::from_value(doc).map_err(corrupt)?;
    check_cgroup(path, &st, &schema.legacy_cgroup_parent)?;
    Ok(st)
}

/// A record's cgroup is `<parent>/<key>` (0.1.0's layout) or `<parent>-<16 hex>/<key>` (an
/// instance's), with `parent` this daemon's `--cgroup-parent` and `key` the volume's.
fn check_cgroup(path: &Path, st: &VolumeState, parent: &str) -> Result<(), StateError> {
    let key = volume_key(&st.volume_id);
    let ok = st.cgroup.strip_suffix(&format!("/{key}")).is_some_and(|p| {
        p == parent
            || p.strip_prefix(parent).and_then(|rest| rest.strip_prefix('-')).is_some_and(|id| {
                id.len() == 16 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            })
    });
    if ok {
        Ok(())
    } else {
        Err(StateError::ForeignCgroup {
            path: path.to_path_buf(),
            cgroup: st.cgroup.clone(),
            parent: parent.into(),
            key,
        })
    }
}

/// Turn a record of schema `from` into one of `from + 1`, keeping every field it has.
fn migrate(doc: &mut serde_json::Value, from: u32, schema: &Schema) {
    let Some(fields) = doc.as_object_mut() else { return };
    if from == 1 {
        // Every release before schema 2 put a volume's group at `<cgroup-parent>/<key>`.
        let key = fields.get("volumeId").and_then(serde_json::Value::as_str).map(volume_key).unwrap_or_default();
        fields.insert("cgroup".into(), format!("{}/{key}", schema.legacy_cgroup_parent).into());
    }
    fields.insert("version".into(), (from + 1).into());
}

impl From<StateError> for crate::error::Error {
    fn from(e: StateError) -> Self {
        if e.is_schema() {
            // Not a fault of this daemon: the file waits for a daemon that reads its schema.
            crate::error::Error::precondition(format!("volume state: {e}"))
        } else {
            crate::error::Error::internal(format!("volume state: {e}"))
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::exec::recording::Recording;
    use crate::plan::{EnvVar, Step, Value};

    pub(crate) fn state(id: &str) -> VolumeState {
        VolumeState {
            version: SCHEMA_VERSION,
            volume_id: id.into(),
            plugin: "seaweedfs".into(),
            digest: format!("sha256:{}", "a".repeat(64)),
            pinned: false,
            source: None,
            boot_id: "boot-1".into(),
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
                    host_mount: None,
                    lazy: None,
                }],
                attributes: vec![],
            },
            process: Some(ProcessId { pid: 42, start_time: 7 }),
            published: BTreeMap::new(),
            ephemeral: false,
            restarts: 0,
            oom_kills: 0,
            capability: None,
            dynamic: BTreeMap::new(),
            fuse_id: None,
            signed_by: Vec::new(),
            chunk_index_required: false,
            verified: None,
            cgroup: format!("mounthost-0123456789abcdef/{}", volume_key(id)),
        }
    }

    const DIR: &str = "/var/lib/mounthost";

    fn store() -> (Arc<Recording>, StateStore) {
        let rec = Arc::new(Recording::new());
        let store = StateStore::open(Path::new(DIR), rec.clone(), Schema::current("mounthost")).unwrap();
        (rec, store)
    }

    fn text(rec: &Recording, path: &Path) -> String {
        String::from_utf8(rec.read_file(path).unwrap().unwrap()).unwrap()
    }

    #[test]
    fn round_trip_is_private_and_goes_through_the_executor() {
        let (rec, store) = store();
        let id = "pvc/with spaces/and-a-very-long-id".repeat(3);
        assert_eq!(store.load(&id).unwrap(), None);
        let mut s = state(&id);
        store.save(&s).unwrap();
        s.phase = Phase::Staged;
        s.published.insert(
            "/pods/u/mount".into(),
            Publication { readonly: true, steps: Vec::new(), dynamic: None, dynamic_limits: Default::default() },
        );
        store.save(&s).unwrap();
        assert_eq!(store.load(&id).unwrap(), Some(s.clone()));
        let path = store.path(&id);
        assert_eq!(rec.mode(&path), Some(0o600));
        assert_eq!(rec.mode(path.parent().unwrap()), Some(0o700));
        assert!(rec.calls().contains(&format!("write {}", path.display())), "{:?}", rec.calls());
        // A second store over the same files (a restarted daemon) reads what the first wrote.
        let again = StateStore::open(Path::new(DIR), Arc::new(Recording::new()), Schema::current("mounthost")).unwrap();
        assert_eq!(again.load(&id).unwrap(), None, "another node's files are not this one's");
        let reopened = StateStore::open(Path::new(DIR), rec.clone(), Schema::current("mounthost")).unwrap();
        assert_eq!(reopened.load(&id).unwrap(), Some(s.clone()));
        assert_eq!(store.list().unwrap().len(), 1);
        store.remove(&id).unwrap();
        store.remove(&id).unwrap();
        assert_eq!(store.load(&id).unwrap(), None);
        assert!(!rec.exists(&path));
    }

    #[test]
    fn kept_secrets_are_private_and_go_with_the_volume() {
        let (rec, store) = store();
        assert!(store.load_secrets("v").unwrap().is_empty());
        let kept: BTreeMap<String, String> = [("jwtSigningKey".to_string(), "s3cr3t-value".to_string())].into();
        store.save_secrets("v", &kept).unwrap();
        assert_eq!(store.load_secrets("v").unwrap(), kept);
        let file = Path::new(DIR).join("secrets").join(format!("{}.json", volume_key("v")));
        assert_eq!(rec.mode(&file), Some(0o600));
        assert_eq!(rec.mode(file.parent().unwrap()), Some(0o700));
        store.save(&state("v")).unwrap();
        assert!(!text(&rec, &store.path("v")).contains("s3cr3t-value"), "never in the state file");
        store.remove("v").unwrap();
        assert!(!rec.exists(&file), "removed with the volume");
        store.save_secrets("v", &BTreeMap::new()).unwrap();
        assert!(!rec.exists(&file), "nothing is written when the plan references no secret");
    }

    #[test]
    fn transitions_are_gated() {
        let mut s = state("v");
        assert!(!s.can_publish(), "not before stage completed");
        s.phase = Phase::Staged;
        assert!(s.can_publish() && s.can_unstage());
        s.published.insert(
            "/t".into(),
            Publication { readonly: false, steps: Vec::new(), dynamic: None, dynamic_limits: Default::default() },
        );
        assert!(!s.can_unstage(), "not while published");
    }

    #[test]
    fn bad_files_are_reported_never_guessed() {
        let (rec, store) = store();
        rec.add_file(&store.path("torn"), b"{\"version\":1,\"volumeId\":", None);
        let mut future = serde_json::to_value(state("future")).unwrap();
        future["version"] = (SCHEMA_VERSION + 1).into();
        rec.add_file(&store.path("future"), future.to_string().as_bytes(), None);
        rec.add_file(&store.path("moved"), &serde_json::to_vec(&state("other")).unwrap(), None);
        let mut unknown = serde_json::to_value(state("x")).unwrap();
        unknown["surprise"] = true.into();
        rec.add_file(&store.path("x"), unknown.to_string().as_bytes(), None);
        rec.add_file(&Path::new(DIR).join("volumes/.abc.json.tmp.1"), b"partial", None);
        let listed = store.list().unwrap();
        assert_eq!(listed.len(), 4, "every state file is listed, temporaries skipped");
        assert!(listed.iter().all(|(_, r)| r.is_err()));
        assert!(matches!(store.load("torn").unwrap_err(), StateError::Unusable { .. }));
        let err = store.load("future").unwrap_err();
        assert!(err.is_schema(), "{err}");
        let err = err.to_string();
        assert!(
            err.contains(&format!(
                "has schema version {}, written by a newer mounthost; this daemon reads versions 1 to {SCHEMA_VERSION}",
                SCHEMA_VERSION + 1
            )),
            "{err}"
        );
        assert!(!store.load("torn").unwrap_err().is_schema(), "a torn file is damaged, not of another schema");
        assert!(store.load("moved").unwrap_err().to_string().contains("belongs in"));
        assert!(store.load("x").unwrap_err().to_string().contains("surprise"));
        assert_eq!(store.keys().unwrap().len(), 4, "unusable files still claim their key");
        assert_eq!(store.remove_stray_temporaries().unwrap(), 1);
    }

    #[test]
    fn start_up_removes_every_spare_of_the_secrets_and_only_orphans_of_the_state() {
        let (rec, store) = store();
        store.save_secrets("v", &[("k".to_string(), "current".to_string())].into()).unwrap();
        store.save(&state("v")).unwrap();
        let key = volume_key("v");
        let secret_spare = Path::new(DIR).join(format!("secrets/.{key}.json.spare"));
        let state_spare = Path::new(DIR).join(format!("volumes/.{key}.json.spare"));
        rec.add_file(&secret_spare, b"{\"k\":\"rotated\"}", None);
        rec.add_file(&state_spare, b"{}", None);
        assert_eq!(store.remove_stray_temporaries().unwrap(), 1);
        assert!(!rec.exists(&secret_spare), "a secrets spare holds an earlier value");
        assert!(rec.exists(&state_spare), "a live state file keeps its spare");
        assert_eq!(store.load_secrets("v").unwrap()["k"], "current");
    }

    #[test]
    fn records_without_a_fuse_id_read_as_none_and_one_is_kept() {
        let (rec, store) = store();
        let old = serde_json::to_value(state("old")).unwrap();
        assert!(old.get("fuseId").is_none(), "a record without one stays as earlier daemons wrote it");
        rec.add_file(&store.path("old"), old.to_string().as_bytes(), None);
        assert_eq!(store.load("old").unwrap().unwrap().fuse_id, None);
        let mut with = state("with");
        with.fuse_id = Some(2147418112);
        store.save(&with).unwrap();
        assert!(text(&rec, &store.path("with")).contains("\"fuseId\":2147418112"));
        assert_eq!(store.load("with").unwrap().unwrap().fuse_id, Some(2147418112));
    }

    #[test]
    fn records_without_a_capability_still_read() {
        let (rec, store) = store();
        let mut old = serde_json::to_value(state("old")).unwrap();
        old.as_object_mut().unwrap().remove("capability");
        rec.add_file(&store.path("old"), old.to_string().as_bytes(), None);
        assert_eq!(store.load("old").unwrap().unwrap().capability, None);
    }

    #[test]
    fn records_without_the_pinned_flag_read_as_not_pinned_and_unpinned_ones_omit_it() {
        let (rec, store) = store();
        let old = serde_json::to_value(state("old")).unwrap();
        assert!(old.get("pinned").is_none(), "an unpinned record stays as earlier daemons wrote it");
        rec.add_file(&store.path("old"), old.to_string().as_bytes(), None);
        assert!(!store.load("old").unwrap().unwrap().pinned);
        let mut pinned = state("pinned");
        pinned.pinned = true;
        store.save(&pinned).unwrap();
        assert!(text(&rec, &store.path("pinned")).contains("\"pinned\":true"));
        assert!(store.load("pinned").unwrap().unwrap().pinned);
    }

    /// The record a 0.1.0 daemon wrote for a staged and published bindfs volume
    /// (`host/tests/fixtures/state-v1/`), with its machine-specific values filled in.
    fn fixture_v1() -> String {
        include_str!("../../tests/fixtures/state-v1/bindfs-staged-published.json")
            .replace("@ROOT@", "/r")
            .replace("@BOOT_ID@", "boot-1")
            .replace("@PID@", "4242")
            .replace("@START_TIME@", "99")
    }

    #[test]
    fn a_schema_1_record_is_migrated_keeping_every_field() {
        let (rec, store) = store();
        let path = store.path("bindfs~pv-fixture");
        rec.add_file(&path, fixture_v1().as_bytes(), None);
        let st = store.load("bindfs~pv-fixture").unwrap().unwrap();
        assert_eq!(st.version, SCHEMA_VERSION);
        assert_eq!(st.cgroup, format!("mounthost/{}", volume_key("bindfs~pv-fixture")), "where 0.1.0 put its group");
        assert_eq!(st.process, Some(ProcessId { pid: 4242, start_time: 99 }));
        assert_eq!(st.phase, Phase::Staged);
        assert_eq!(st.published.len(), 1);
        assert_eq!(st.context["memoryLimitMiB"], "64");
        // Every field of the old record survives a save in the new schema.
        store.save(&st).unwrap();
        let old: serde_json::Value = serde_json::from_str(&fixture_v1()).unwrap();
        let new: serde_json::Value = serde_json::from_slice(&rec.read_file(&path).unwrap().unwrap()).unwrap();
        for (k, v) in old.as_object().unwrap() {
            if k != "version" {
                assert_eq!(new.get(k), Some(v), "field {k} kept");
            }
        }
        assert_eq!(new["version"], 2);
        assert_eq!(new["cgroup"], format!("mounthost/{}", volume_key("bindfs~pv-fixture")));
    }

    #[test]
    fn a_record_says_the_oldest_schema_that_holds_it() {
        let (rec, store) = store();
        store.save(&state("plain")).unwrap();
        let mut lazy = state("lazy");
        lazy.dynamic.insert(
            "m".into(),
            DynamicMount {
                plugin: "model".into(),
                parameters: BTreeMap::new(),
                phase: MountPhase::Ready,
                reason: None,
                steps: Vec::new(),
                bytes: 0,
                process: Some(ProcessId { pid: 7, start_time: 8 }),
            },
        );
        store.save(&lazy).unwrap();
        let written = |id: &str| -> serde_json::Value {
            serde_json::from_slice(&rec.read_file(&store.path(id)).unwrap().unwrap()).unwrap()
        };
        assert_eq!(written("plain")["version"], 2, "nothing of schema 3 in it");
        assert_eq!(written("lazy")["version"], 3, "a lazy dynamic mount's server is schema 3's");
        // A daemon of the release before reads the one and leaves the other.
        let older = Schema { newest: 2, legacy_cgroup_parent: "mounthost".into() };
        let old_daemon = StateStore::open(Path::new(DIR), rec.clone(), older).unwrap();
        assert!(old_daemon.load("plain").unwrap().is_some());
        let err = old_daemon.load("lazy").unwrap_err();
        assert!(err.is_schema() && err.to_string().contains("has schema version 3"), "{err}");
    }

    /// A dynamic volume's limits (schema 4): a daemon built with schema 3 refuses such a record
    /// by its version, naming both, instead of reading it and dropping the limits at its next
    /// save; this daemon reads schema 3 records, and the records daemons between the two wrote
    /// with these fields under version 2 or 3.
    #[test]
    fn a_dynamic_volumes_limits_are_schema_4_and_an_older_daemon_refuses_them() {
        let (rec, store) = store();
        let dynamic = |id: &str, lowered: bool, bytes: u64| {
            let mut st = state(id);
            st.phase = Phase::Staged;
            let dynamic_limits =
                crate::volume::request::DynamicLimits { max_bytes: lowered.then_some(1 << 20), ..Default::default() };
            st.published.insert(
                "/pods/u/mount".into(),
                Publication { readonly: true, steps: Vec::new(), dynamic: Some(vec!["model".into()]), dynamic_limits },
            );
            st.dynamic.insert(
                "m".into(),
                DynamicMount {
                    plugin: "model".into(),
                    parameters: BTreeMap::new(),
                    phase: MountPhase::Ready,
                    reason: None,
                    steps: Vec::new(),
                    bytes,
                    process: None,
                },
            );
            st
        };
        let written = |id: &str| -> serde_json::Value {
            serde_json::from_slice(&rec.read_file(&store.path(id)).unwrap().unwrap()).unwrap()
        };
        for (id, lowered, bytes) in [("lowered", true, 0), ("counted", false, 4096), ("both", true, 4096)] {
            let st = dynamic(id, lowered, bytes);
            store.save(&st).unwrap();
            assert_eq!(written(id)["version"], 4, "{id}");
            assert_eq!(store.load(id).unwrap(), Some(st), "{id} reads back whole");
        }
        store.save(&dynamic("plain", false, 0)).unwrap();
        assert_eq!(written("plain")["version"], 2, "no limit lowered, nothing counted: nothing of schema 4");

        // A daemon of the release before (schema 3) refuses the limits by version, names both
        // versions, and leaves the file as it is; it still reads the plain dynamic volume.
        let older = Schema { newest: 3, legacy_cgroup_parent: "mounthost".into() };
        let old_daemon = StateStore::open(Path::new(DIR), rec.clone(), older).unwrap();
        let before = rec.read_file(&store.path("both")).unwrap().unwrap();
        let err = old_daemon.load("both").unwrap_err();
        assert!(err.is_schema(), "{err}");
        assert!(
            err.to_string()
                .contains("has schema version 4, written by a newer mounthost; this daemon reads versions 1 to 3"),
            "{err}"
        );
        let err: crate::error::Error = err.into();
        assert_eq!(err.kind, crate::error::ErrorKind::FailedPrecondition);
        assert_eq!(rec.read_file(&store.path("both")).unwrap().unwrap(), before, "never rewritten");
        assert!(old_daemon.load("plain").unwrap().is_some());

        // This daemon reads what earlier ones wrote: the fields under version 2 or 3 (daemons
        // between the two schemas), and a schema 3 record without them.
        for version in [2, 3] {
            let mut doc = written("both");
            doc["version"] = version.into();
            let id = format!("v{version}");
            doc["volumeId"] = id.clone().into();
            doc["cgroup"] = format!("mounthost-0123456789abcdef/{}", volume_key(&id)).into();
            rec.add_file(&store.path(&id), doc.to_string().as_bytes(), None);
        }
        let mut doc = written("plain");
        doc["version"] = 3.into();
        doc["volumeId"] = "v3plain".into();
        doc["cgroup"] = format!("mounthost-0123456789abcdef/{}", volume_key("v3plain")).into();
        rec.add_file(&store.path("v3plain"), doc.to_string().as_bytes(), None);
        let again = StateStore::open(Path::new(DIR), rec.clone(), Schema::current("mounthost")).unwrap();
        for id in ["v2", "v3"] {
            let st = again.load(id).unwrap().unwrap();
            assert_eq!(st.version, SCHEMA_VERSION, "{id} migrated");
            assert_eq!(st.published["/pods/u/mount".as_ref() as &Path].dynamic_limits.max_bytes, Some(1 << 20), "{id}");
            assert_eq!(st.dynamic["m"].bytes, 4096, "{id}");
            // Its next save says schema 4.
            again.save(&st).unwrap();
            assert_eq!(written(id)["version"], 4, "{id}");
        }
        let plain = again.load("v3plain").unwrap().unwrap();
        assert!(plain.published.values().all(|p| p.dynamic_limits.is_default()) && plain.dynamic["m"].bytes == 0);
    }

    #[test]
    fn a_signature_policy_is_schema_5_and_an_older_daemon_refuses_it() {
        let (rec, store) = store();
        let written = |id: &str| -> serde_json::Value {
            serde_json::from_slice(&rec.read_file(&store.path(id)).unwrap().unwrap()).unwrap()
        };
        let signed = |id: &str| {
            let mut st = state(id);
            st.phase = Phase::Staged;
            st.signed_by = vec!["corp".into()];
            st.verified = Some(Verification {
                manifest: format!("sha256:{}", "a".repeat(64)),
                signer: Some("corp".into()),
                bundle: Some(format!("sha256:{}", "b".repeat(64))),
                found_in: Some("referrer".into()),
                ..Verification::default()
            });
            st
        };
        let mut indexed = state("indexed");
        indexed.verified = Some(Verification {
            manifest: format!("sha256:{}", "a".repeat(64)),
            index: Some(format!("sha256:{}", "c".repeat(64))),
            index_size: 4096,
            ..Verification::default()
        });
        let mut required = state("required");
        required.chunk_index_required = true;
        for st in [signed("signed"), indexed, required] {
            store.save(&st).unwrap();
            assert_eq!(written(&st.volume_id)["version"], 5, "{}", st.volume_id);
            assert_eq!(store.load(&st.volume_id).unwrap(), Some(st.clone()), "reads back whole");
        }
        store.save(&state("plain")).unwrap();
        assert_eq!(written("plain")["version"], 2, "no policy, nothing verified: nothing of schema 5");
        // A daemon of the release before (schema 4) refuses it by version (it would drop the
        // policy its dynamic mounts inherit), and leaves the file as it is.
        let older = Schema { newest: 4, legacy_cgroup_parent: "mounthost".into() };
        let old_daemon = StateStore::open(Path::new(DIR), rec.clone(), older).unwrap();
        let before = rec.read_file(&store.path("signed")).unwrap().unwrap();
        let err = old_daemon.load("signed").unwrap_err();
        assert!(err.to_string().contains("has schema version 5, written by a newer mounthost"), "{err}");
        assert_eq!(rec.read_file(&store.path("signed")).unwrap().unwrap(), before, "never rewritten");
        assert!(old_daemon.load("plain").unwrap().is_some());
    }

    #[test]
    fn a_daemon_built_with_schema_1_refuses_a_schema_2_record_and_leaves_it() {
        let (rec, store) = store();
        store.save(&state("new")).unwrap();
        let written = rec.read_file(&store.path("new")).unwrap().unwrap();
        let older = Schema { newest: 1, legacy_cgroup_parent: "mounthost".into() };
        let old_daemon = StateStore::open(Path::new(DIR), rec.clone(), older).unwrap();
        let err = old_daemon.load("new").unwrap_err();
        assert!(err.is_schema());
        assert!(
            err.to_string()
                .contains("has schema version 2, written by a newer mounthost; this daemon reads versions 1 to 1"),
            "{err}"
        );
        let err: crate::error::Error = err.into();
        assert_eq!(err.kind, crate::error::ErrorKind::FailedPrecondition);
        assert!(old_daemon.all().unwrap().is_empty(), "listed as unusable, not as a volume");
        assert_eq!(old_daemon.keys().unwrap().len(), 1, "its key stays claimed (its cgroup is not swept)");
        assert_eq!(rec.read_file(&store.path("new")).unwrap().unwrap(), written, "never rewritten");
    }

    #[test]
    fn a_record_naming_a_cgroup_this_daemon_would_not_make_is_unusable() {
        let (rec, store) = store();
        for (id, cgroup) in [
            ("a", "user.slice/user-1000.slice/session-2.scope".to_string()),
            ("b", format!("mounthost-0123456789abcdef/{}", volume_key("other"))),
            ("c", format!("elsewhere-0123456789abcdef/{}", volume_key("c"))),
            ("d", format!("mounthost-0123/{}", volume_key("d"))),
        ] {
            let mut doc = serde_json::to_value(state(id)).unwrap();
            doc["cgroup"] = cgroup.into();
            rec.add_file(&store.path(id), doc.to_string().as_bytes(), None);
        }
        store.save(&state("ok")).unwrap();
        let mut legacy = state("legacy");
        legacy.cgroup = format!("mounthost/{}", volume_key("legacy"));
        store.save(&legacy).unwrap();
        let again = StateStore::open(Path::new(DIR), rec.clone(), Schema::current("mounthost")).unwrap();
        for id in ["a", "b", "c", "d"] {
            let err = again.load(id).unwrap_err().to_string();
            assert!(err.contains("which is not a volume group of --cgroup-parent"), "{id}: {err}");
        }
        assert!(again.load("ok").unwrap().is_some() && again.load("legacy").unwrap().is_some());
    }

    #[test]
    fn what_a_refused_record_holds_stays_taken() {
        let (rec, store) = store();
        let mut newer = serde_json::to_value(state("newer")).unwrap();
        newer["version"] = (SCHEMA_VERSION + 1).into();
        newer["fuseId"] = 2147418113u32.into();
        newer["somethingNew"] = serde_json::json!({"layers": [format!("sha256:{}", "b".repeat(64)), "sha256:short"]});
        rec.add_file(&store.path("newer"), newer.to_string().as_bytes(), None);
        // A damaged file claims nothing (it is not another schema's).
        rec.add_file(&store.path("torn"), br#"{"version":1,"fuseId":7"#, None);
        store.save(&state("ok")).unwrap();
        let claims = store.refused_claims().unwrap();
        assert_eq!(claims.fuse_ids, [2147418113].into());
        assert_eq!(
            claims.digests,
            [format!("sha256:{}", "a".repeat(64)), format!("sha256:{}", "b".repeat(64))].into(),
            "the plan's digest and the unknown field's, not the short one"
        );
    }

    #[test]
    fn kept_secrets_of_schema_1_read_and_newer_ones_are_refused() {
        let (rec, store) = store();
        let file = Path::new(DIR).join("secrets").join(format!("{}.json", volume_key("v")));
        // 0.1.0 wrote the bare object; a secret may even be called `version`.
        rec.add_file(&file, br#"{"jwtSigningKey":"k1","version":"2"}"#, None);
        let old = store.load_secrets("v").unwrap();
        assert_eq!(old["jwtSigningKey"], "k1");
        assert_eq!(old["version"], "2");
        store.save_secrets("v", &old).unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&rec.read_file(&file).unwrap().unwrap()).unwrap();
        assert_eq!(doc["version"], SECRETS_SCHEMA_VERSION);
        assert_eq!(store.load_secrets("v").unwrap(), old);
        rec.add_file(&file, br#"{"version":3,"secrets":{},"more":1}"#, None);
        let err = store.load_secrets("v").unwrap_err();
        assert!(err.is_schema() && err.to_string().contains("schema version 3"), "{err}");
    }
}
