//! Dynamic volumes: a pod mounts more into its own volume, through a socket in that volume.
//!
//! A volume with the attribute `dynamic: "true"` is published as a small tmpfs of the host's at
//! the target (mode 0755, 1 MiB, shared propagation) holding:
//!
//! - `volume/`: the volume's own files (the plugin's publish plan, whose target root is here);
//! - `csi.sock`: an HTTP/JSON server for this volume only ([`server`], [`api`]);
//! - `mounts/<id>/`: what the pod mounted through it, each read-only.
//!
//! The publication's steps are data like any other ([`publication_steps`]): the tmpfs mount,
//! the plugin's steps, and a `socket` step the executor runs by serving the socket. A restage
//! replays them without touching the tmpfs, a restarted daemon serves every socket again.
//!
//! A mount is one more run of the pipeline, with the volume's lock: the plugin's
//! `dynamic-mount` planner plans it (twice when it resolves an OCI reference: the resolution
//! comes back in `recorded` under the reserved `mounthost.resolved.*` keys, since the 0.2.0
//! request has no field for it), the policy checks the plan with the mount's own directory
//! as `target` and its own cache directory as `cache` and nothing else, blobs download in the
//! node's cache, and the diff applies it ([`super::diff::Desired::Dynamic`]). The record is
//! in the volume's state file, written before the work starts, so a daemon killed meanwhile
//! takes it up again.
//!
//! The server object knows its volume's id; no URL or body names a volume. Everything below
//! the target is the pod's to write: every path the host touches there is resolved without
//! following links (the executor), and the host repairs its own entries (`csi.sock`, `mounts/`)
//! when a pod replaces them.

pub mod api;
pub(super) mod credentials;
mod ledger;
mod limits;
mod server;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{info, warn};

use super::Node;
use super::diff::{Desired, Root};
use super::lazy::IndexChoice;
use super::pipeline::{Job, Persist};
use super::signed::{Checked, Policy};
use crate::error::{Error, ErrorKind};
use crate::exec::artifacts::Prepared;
use crate::exec::{FileId, FileKind};
use crate::oci::Ensure;
use crate::plan::policy::{Operation, RESERVED_ATTRIBUTE_PREFIX};
use crate::plan::{MountOption, Plan, Step};
use crate::plugin::bindings::types as wit;
use crate::secrets::Secrets;
use crate::unpriv::unix_http::Listener;
use crate::volume::VolumeDirs;
use crate::volume::state::{DynamicMount, MountPhase, VolumeState};

use api::{CreateMount, MOUNTS_DIR, MountState, MountView, SOCKET_NAME};

/// Where a dynamic volume's own files go, below its target.
pub const VOLUME_DIR: &str = "volume";
/// The source name of the host's tmpfs at a dynamic volume's target.
pub const TMPFS_SOURCE: &str = "mounthost-dynamic";
/// The reserved keys the resolution of a dynamic mount's `resolve` step is passed under.
pub const RESOLVED_REFERENCE: &str = "mounthost.resolved.reference";
pub const RESOLVED_MANIFEST_DIGEST: &str = "mounthost.resolved.manifestDigest";
pub const RESOLVED_MANIFEST: &str = "mounthost.resolved.manifest";
pub const RESOLVED_CONFIG: &str = "mounthost.resolved.config";
/// How long a POST may take to plan and resolve its mount (registry round trips).
const RESOLVE_WAIT: Duration = Duration::from_secs(30);
/// How long a POST waits for its mount before answering 202.
const CREATE_WAIT: Duration = Duration::from_secs(2);
/// How often a mount waiting for its blobs looks again.
const PULL_TICK: Duration = Duration::from_millis(20);
/// How long an API call waits for the volume's lock (another call on the volume).
const LOCK_WAIT: Duration = Duration::from_secs(10);
/// How often the sweeper checks every volume's socket and `mounts/`.
const SWEEP_EVERY: Duration = Duration::from_secs(2);

/// The steps of a dynamic volume's publication at `target`: the host's tmpfs, the plugin's
/// publish steps (planned with `target/volume` as their target), the socket.
pub fn publication_steps(target: &Path, plugin_steps: Vec<Step>) -> Vec<Step> {
    let mut steps = vec![Step::Mount {
        fstype: "tmpfs".into(),
        source: TMPFS_SOURCE.into(),
        target: target.to_path_buf(),
        options: ["mode=0755", "size=1m", "nr_inodes=4096"].map(|o| MountOption::Text(o.into())).to_vec(),
        readonly: false,
    }];
    steps.extend(plugin_steps);
    steps.push(Step::Socket { path: target.join(SOCKET_NAME) });
    steps
}

/// The key a dynamic mount waits for its blobs under (never a volume id: those have no
/// control characters).
pub(super) fn waiter(volume: &str, id: &str) -> String {
    format!("{volume}\n{id}")
}

/// Is this key of the cache's waiters a dynamic mount's (not a volume's)?
pub fn is_mount_waiter(key: &str) -> bool {
    key.contains('\n')
}

/// The servers and mount tasks of this daemon.
pub struct Dynamic {
    servers: Mutex<HashMap<String, Arc<Served>>>,
    /// Sockets that could not be served (a pod's obstacle the host could not clear): the
    /// sweeper tries again.
    unserved: Mutex<HashMap<String, PathBuf>>,
    tasks: Mutex<HashMap<String, tokio::task::AbortHandle>>,
    /// Each volume's bucket of POST and DELETE requests, with what a refusal says of its rate.
    buckets: Mutex<HashMap<String, (limits::Bucket, String)>>,
    /// Each volume's byte level beyond its record ([`ledger`]).
    ledger: ledger::Ledger,
    /// Signalled when a mount reaches a final phase.
    settled: tokio::sync::Notify,
    /// Connections served at once on all sockets of the node.
    connections: Arc<tokio::sync::Semaphore>,
    sweeper: std::sync::OnceLock<tokio::task::AbortHandle>,
    /// Mounts found pending at start (volume, id): planned again once the daemon is ready
    /// ([`Node::resume_dynamic`]).
    resume: Mutex<Vec<(String, String)>>,
}

/// The pause before attempt `attempt + 1` of `attempts` after a failure of `kind`: none when
/// the failure is not retriable (only UNAVAILABLE is) or the budget is spent; else
/// [`RESUME_FIRST`] doubled for each attempt before, at most [`RESUME_MAX`].
fn retry_after(kind: ErrorKind, attempt: u32, attempts: u32) -> Option<std::time::Duration> {
    if kind != ErrorKind::Unavailable || attempt >= attempts {
        return None;
    }
    Some(RESUME_FIRST.saturating_mul(1 << (attempt - 1).min(16)).min(RESUME_MAX))
}

/// Attempts a mount pending at start gets, when each fails retriably, before it is failed.
pub const RESUME_ATTEMPTS: u32 = 5;
/// The pause after its first failed attempt; doubled after each, at most [`RESUME_MAX`].
const RESUME_FIRST: std::time::Duration = std::time::Duration::from_secs(2);
const RESUME_MAX: std::time::Duration = std::time::Duration::from_secs(60);

impl Default for Dynamic {
    fn default() -> Self {
        Dynamic {
            servers: Default::default(),
            unserved: Default::default(),
            tasks: Default::default(),
            buckets: Default::default(),
            ledger: Default::default(),
            settled: Default::default(),
            connections: Arc::new(tokio::sync::Semaphore::new(server::MAX_NODE_CONNECTIONS)),
            sweeper: Default::default(),
            resume: Default::default(),
        }
    }
}

/// What planning one mount needs ([`Node::planning`]).
struct Planning {
    plugin: Arc<crate::plugin::LoadedPlugin>,
    /// Served lazily ([`mount_lazy`]); `lazy_asked`: by the pod's `lazy` parameter (else by
    /// the volume's own laziness, which a mount of no OCI artifact ignores).
    lazy: bool,
    lazy_asked: bool,
    context: BTreeMap<String, String>,
    recorded: Vec<wit::Kv>,
    dirs: VolumeDirs,
    ephemeral: bool,
    /// The volume's registry credentials, for the registries its StorageClass names.
    credentials: credentials::MountCredentials,
    /// The volume's signature policy, narrowed by the mount's `signedBy` (docs/signing.md).
    policy: Policy,
}

/// Abandons a mount's blobs when its task is dropped before its end (aborted).
struct AbortGuard {
    node: Node,
    volume: String,
    id: String,
    armed: bool,
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        if self.armed {
            self.node.abandon_mount(&self.volume, &self.id);
        }
    }
}

/// A mount's plan, the bytes it fetches, and those bytes reserved in its volume's level.
struct Planned {
    plan: Plan,
    bytes: u64,
    reservation: ledger::Reservation,
    /// What its signature policy checked before anything was fetched.
    checked: Checked,
}

/// A mount's plan and what its signature policy checked (the tar layers' files remain).
type Ready = (Plan, Checked);

/// One volume's server.
struct Served {
    /// The published directory (the host's tmpfs).
    target: PathBuf,
    /// What the sweeper checks, under this lock; `live` false once the volume's server stops,
    /// so a check that started before never touches the target again.
    watch: Mutex<Watch>,
    /// A fresh listener for the server task (its socket was replaced).
    relisten: tokio::sync::mpsc::UnboundedSender<Listener>,
    task: tokio::task::AbortHandle,
}

struct Watch {
    live: bool,
    /// The socket the server listens on.
    socket: FileId,
    /// The tmpfs's device: a target that shows another is not the host's tmpfs any more.
    tmpfs: u64,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An API error: HTTP status, code, message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiErr {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
    /// Seconds after which the request may succeed (a `Retry-After` header).
    pub retry_after: Option<u64>,
}

impl ApiErr {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        ApiErr { status, code, message: message.into(), retry_after: None }
    }

    /// With a `Retry-After` of `secs`.
    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }
}

impl From<Error> for ApiErr {
    fn from(e: Error) -> Self {
        let (status, code) = match e.kind {
            ErrorKind::InvalidArgument | ErrorKind::OutOfRange => (400, "invalid_parameters"),
            ErrorKind::NotFound => (404, "not_found"),
            // Its artifact's signature refused (daemon/signed.rs): the pod may not mount it.
            ErrorKind::FailedPrecondition if e.message.starts_with(super::signed::REFUSED) => {
                (403, "signature_refused")
            }
            ErrorKind::AlreadyExists | ErrorKind::FailedPrecondition => (409, "conflict"),
            ErrorKind::Aborted => (503, "busy"),
            ErrorKind::Unavailable | ErrorKind::DeadlineExceeded => (503, "unavailable"),
            ErrorKind::Unauthenticated => (401, "unauthenticated"),
            ErrorKind::PermissionDenied => (403, "permission_denied"),
            ErrorKind::ResourceExhausted => (507, "resource_exhausted"),
            ErrorKind::DataLoss => (502, "data_loss"),
            ErrorKind::Internal | ErrorKind::Unimplemented => (500, "internal"),
        };
        ApiErr { status, code, message: crate::error::bounded(e.message), retry_after: None }
    }
}

/// A mount's view for the API (its lazy progress set by the caller).
fn view(id: &str, m: &DynamicMount, progress: Option<(u64, u64)>) -> MountView {
    let state = match (m.phase, progress) {
        (MountPhase::Pending, Some(_)) => MountState::Pulling,
        (MountPhase::Pending, None) => MountState::Pending,
        (MountPhase::Ready, _) => MountState::Ready,
        (MountPhase::Failed, _) => MountState::Failed,
    };
    MountView {
        id: id.to_string(),
        plugin: m.plugin.clone(),
        parameters: m.parameters.clone(),
        state,
        path: format!("{MOUNTS_DIR}/{id}"),
        bytes_done: progress.map(|p| p.0),
        bytes_total: progress.map(|p| p.1),
        reason: m.reason.clone(),
        lazy: None,
    }
}

/// The dynamic publication of a volume: its target and the plugins its pod may use.
fn publication(st: &VolumeState) -> Option<(&PathBuf, &Vec<String>)> {
    st.published.iter().find_map(|(t, p)| p.dynamic.as_ref().map(|d| (t, d)))
}

impl Node {
    /// `<volume cache>/dynamic`: the dynamic mounts' cache directories.
    pub(super) fn dynamic_cache(&self, volume: &str) -> PathBuf {
        self.dirs(volume, None, None).cache.expect("a volume has a cache dir").join("dynamic")
    }

    /// Run a publication's `socket` step: the tmpfs at the socket's directory is made shared
    /// (so mounts below it reach the pod's container), `mounts/` is a directory, and the
    /// volume's server listens on the socket (again, if the socket is not the one it serves).
    /// Blocking; runs inside the daemon's runtime.
    pub(super) fn serve_socket(&self, volume: &str, socket: &Path) -> Result<(), Error> {
        let exec = &self.inner.exec;
        let dir = socket.parent().ok_or_else(|| Error::internal("a socket step without a directory"))?;
        exec.share(dir)?;
        self.repair_mounts_dir(dir)?;
        let d = &self.inner.dynamic;
        let mut servers = d.servers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = servers.get(volume)
            && s.target == dir
            && !s.task.is_finished()
            && exec.file_id(socket).ok().flatten() == Some(lock(&s.watch).socket)
        {
            return Ok(());
        }
        let tmpfs = exec
            .file_id(dir)
            .map_err(|e| super::pipeline::io_error(e, dir))?
            .ok_or_else(|| Error::precondition(format!("{} is gone", dir.display())))?
            .dev;
        let (listener, id) = self.listen_dynamic(dir)?;
        let (relisten, fresh) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::runtime::Handle::current()
            .spawn(server::run(self.clone(), volume.to_string(), listener, fresh, d.connections.clone()))
            .abort_handle();
        let watch = Mutex::new(Watch { live: true, socket: id, tmpfs });
        let served = Arc::new(Served { target: dir.to_path_buf(), watch, relisten, task });
        if let Some(old) = servers.insert(volume.to_string(), served) {
            lock(&old.watch).live = false;
        }
        d.unserved.lock().unwrap_or_else(|p| p.into_inner()).remove(volume);
        drop(servers);
        self.start_sweeper();
        info!(volume.id = %volume, socket = %socket.display(), "serving the dynamic volume's socket");
        Ok(())
    }

    /// Bind the socket in `dir` (replacing whatever has its name).
    fn listen_dynamic(&self, dir: &Path) -> Result<(Listener, FileId), Error> {
        let (std, id) = self
            .inner
            .exec
            .listen_in(dir, SOCKET_NAME, 0o666)
            .map_err(|e| super::pipeline::io_error(e, &dir.join(SOCKET_NAME)))?;
        let listener = crate::unpriv::unix_http::from_std(std)
            .map_err(|e| Error::internal(format!("serving {}: {e}", dir.join(SOCKET_NAME).display())))?;
        Ok((listener, id))
    }

    /// `mounts/` below a dynamic volume's target must be a directory the host made: a link,
    /// file or socket a pod put there is removed (never followed) and the directory made again.
    fn repair_mounts_dir(&self, target: &Path) -> Result<(), Error> {
        let exec = &self.inner.exec;
        let mounts = target.join(MOUNTS_DIR);
        match exec.file_id(&mounts).map_err(|e| super::pipeline::io_error(e, &mounts))? {
            Some(FileId { kind: FileKind::Directory, .. }) => return Ok(()),
            Some(other) => {
                warn!(path = %mounts.display(), kind = ?other.kind, "a pod replaced the mounts directory: making it again");
                exec.remove_entry(&mounts).map_err(|e| super::pipeline::io_error(e, &mounts))?;
            }
            None => {}
        }
        exec.mkdir(&mounts, target, 0o755).map_err(|e| super::pipeline::io_error(e, &mounts))
    }

    /// One sweeper for every server of the node: every [`SWEEP_EVERY`], in one blocking task,
    /// each volume's socket must still be the one its server listens on (else a new listener
    /// goes to the server) and `mounts/` a directory; sockets not served yet are tried again.
    fn start_sweeper(&self) {
        let d = &self.inner.dynamic;
        if d.sweeper.get().is_some() {
            return;
        }
        let this = self.clone();
        let task = tokio::runtime::Handle::current().spawn(async move {
            let mut tick = tokio::time::interval(SWEEP_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let _ = this
                    .blocking(|n| {
                        n.sweep();
                        Ok(())
                    })
                    .await;
            }
        });
        if let Err(task) = d.sweeper.set(task.abort_handle()) {
            task.abort();
        }
    }

    fn sweep(&self) {
        let d = &self.inner.dynamic;
        let servers: Vec<(String, Arc<Served>)> =
            d.servers.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        for (volume, s) in servers {
            if let Err(e) = self.repair(&s) {
                warn!(volume.id = %volume, error = %e.message, "dynamic socket: repairing the volume's entries");
            }
        }
        let unserved: Vec<(String, PathBuf)> =
            d.unserved.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        for (volume, socket) in unserved {
            let Ok(_guard) = self.inner.locks.try_lock(&volume) else { continue };
            // Served again only while the volume is still published dynamically there.
            let still = self
                .inner
                .store
                .load(&volume)
                .ok()
                .flatten()
                .is_some_and(|st| publication(&st).is_some_and(|(t, _)| t.join(SOCKET_NAME) == socket));
            if !still {
                d.unserved.lock().unwrap_or_else(|p| p.into_inner()).remove(&volume);
            } else if let Err(e) = self.serve_socket(&volume, &socket) {
                warn!(volume.id = %volume, error = %e.message, "dynamic socket: still not served");
            }
        }
    }

    /// The sweeper's check of one server, under its watch lock (so a server stopped meanwhile
    /// is left alone) and only while its target is still the host's tmpfs.
    fn repair(&self, s: &Served) -> Result<(), Error> {
        let mut w = lock(&s.watch);
        let exec = &self.inner.exec;
        if !w.live || exec.file_id(&s.target).ok().flatten().map(|f| f.dev) != Some(w.tmpfs) {
            return Ok(());
        }
        self.repair_mounts_dir(&s.target)?;
        let socket = s.target.join(SOCKET_NAME);
        if exec.file_id(&socket).ok().flatten() == Some(w.socket) {
            return Ok(());
        }
        warn!(socket = %socket.display(), "a pod removed or replaced the volume's socket: serving it again");
        let (listener, id) = self.listen_dynamic(&s.target)?;
        w.socket = id;
        let _ = s.relisten.send(listener);
        Ok(())
    }

    /// Stop a volume's server and its mounts in progress (unpublish).
    pub(super) fn stop_dynamic(&self, volume: &str) {
        let d = &self.inner.dynamic;
        if let Some(s) = d.servers.lock().unwrap_or_else(|p| p.into_inner()).remove(volume) {
            // Waits for a check in progress; none starts after.
            lock(&s.watch).live = false;
        }
        d.unserved.lock().unwrap_or_else(|p| p.into_inner()).remove(volume);
        lock(&d.buckets).remove(volume);
        let prefix = waiter(volume, "");
        self.lazy_detach_prefix(&prefix);
        let mut tasks = d.tasks.lock().unwrap_or_else(|p| p.into_inner());
        for (key, task) in tasks.iter().filter(|(k, _)| k.starts_with(&prefix)) {
            task.abort();
            // Its downloads nobody else waits for stop.
            self.inner.artifacts.abandon(key);
        }
        tasks.retain(|k, _| !k.starts_with(&prefix));
        d.ledger.forget(volume);
    }

    /// After reconciliation at start: serve every dynamic volume's socket again, mount again
    /// what a ready mount lost, take up mounts in progress. Each volume under its lock (its
    /// socket answers meanwhile; a request waits for the lock). Blocking; returns the sockets
    /// served.
    pub fn restore_dynamic(&self) -> usize {
        let mut served = 0;
        let Ok(listed) = self.inner.store.list() else { return 0 };
        // Read once: a publication whose tmpfs is still there only needs its socket served.
        let table = self.mounts().unwrap_or_default();
        for st in listed.into_iter().filter_map(|(_, st)| st.ok()) {
            let Some((target, _)) = publication(&st) else { continue };
            let Ok(_guard) = self.inner.locks.try_lock(&st.volume_id) else { continue };
            let socket = target.join(SOCKET_NAME);
            let tmpfs = table.iter().any(|m| m.mount_point == *target && m.source == TMPFS_SOURCE);
            let result = if tmpfs {
                self.serve_socket(&st.volume_id, &socket)
            } else {
                // Gone (unmounted by someone else): the publication's recorded steps again,
                // the socket step among them; never a socket in kubelet's own directory.
                warn!(volume.id = %st.volume_id, target = %target.display(), "the dynamic volume's tmpfs is gone: publishing it again");
                self.republish(&st, target)
            };
            match result {
                Ok(()) => served += 1,
                Err(e) if !tmpfs => {
                    // No tmpfs: nothing of the pod's may be mounted into kubelet's own directory.
                    warn!(volume.id = %st.volume_id, error = %e.message, "publishing a dynamic volume again failed; its mounts stay down");
                    continue;
                }
                Err(e) => {
                    warn!(volume.id = %st.volume_id, error = %e.message, "serving a dynamic volume's socket again; retrying");
                    self.inner
                        .dynamic
                        .unserved
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(st.volume_id.clone(), socket);
                    self.start_sweeper();
                }
            }
            for (id, m) in &st.dynamic {
                match m.phase {
                    // A lazy mount whose server lives on is re-adopted: its session (the
                    // supervisor's sweep) connects to it again; one whose server died is healed.
                    MountPhase::Ready if crate::plan::lazy::layers_of(&m.steps).is_some() => {
                        if !m.process.is_some_and(|p| self.inner.exec.is_alive(&p))
                            && let Err(e) = self.heal_mount_locked(&st.volume_id, id)
                        {
                            warn!(volume.id = %st.volume_id, mount = %id, error = %e.message, "starting a lazy dynamic mount's server again");
                        }
                    }
                    MountPhase::Ready => {
                        if let Err(e) = self.apply_mount(&st, id, m.steps.clone()) {
                            warn!(volume.id = %st.volume_id, mount = %id, error = %e.message, "mounting a dynamic mount again");
                        }
                    }
                    // Planned again once the daemon is ready (a registry is not asked before).
                    MountPhase::Pending => lock(&self.inner.dynamic.resume).push((st.volume_id.clone(), id.clone())),
                    MountPhase::Failed => {}
                }
            }
        }
        served
    }

    /// Plan again, pull and mount every mount [`Node::restore_dynamic`] found pending: called
    /// once the daemon is ready. Each gets [`RESUME_ATTEMPTS`] attempts with a growing pause
    /// while it fails retriably (a registry down, stalled), then is `failed` naming why; a
    /// permanent failure (a reply refused, a cap) fails it at once.
    pub fn resume_dynamic(&self) -> usize {
        let pending = std::mem::take(&mut *lock(&self.inner.dynamic.resume));
        for (volume, id) in &pending {
            self.spawn_mount(volume, id, None, RESUME_ATTEMPTS);
        }
        pending.len()
    }

    /// A dynamic publication's recorded steps applied again at `target` (restore at start).
    fn republish(&self, st: &VolumeState, target: &Path) -> Result<(), Error> {
        let steps = st.published.get(target).map(|p| p.steps.clone()).unwrap_or_default();
        let below = target.parent().unwrap_or(target).to_path_buf();
        let job = Job::plain(
            &st.volume_id,
            Desired::Publish {
                staging: st.staging_path.clone(),
                target: Root { path: target.to_path_buf(), below },
                steps,
            },
            |_| Persist::Keep,
        );
        self.run_job(job).map(|_| ())
    }

    /// Wait for the volume's lock (another call on it is running) up to [`LOCK_WAIT`] (an API
    /// call), or as long as it takes (a mount's task: aborted if its mount goes).
    async fn lock_volume(&self, volume: &str, forever: bool) -> Result<crate::volume::lock::VolumeGuard, ApiErr> {
        let deadline = tokio::time::Instant::now() + LOCK_WAIT;
        loop {
            match self.inner.locks.try_lock(volume) {
                Ok(g) => return Ok(g),
                Err(_) if forever || tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(5)).await
                }
                Err(e) => return Err(ApiErr::new(503, "busy", format!("{e}; retry"))),
            }
        }
    }

    /// The volume's record, with its dynamic publication.
    fn dynamic_state(&self, volume: &str) -> Result<VolumeState, ApiErr> {
        let st = self.inner.store.load(volume).map_err(Error::from)?;
        match st {
            Some(st) if publication(&st).is_some() => Ok(st),
            _ => Err(ApiErr::new(503, "unavailable", "the volume is being unpublished")),
        }
    }

    fn progress_of(&self, volume: &str, id: &str) -> Option<(u64, u64)> {
        self.inner.artifacts.progress().get(&waiter(volume, id)).map(|p| (p.done_bytes, p.total_bytes))
    }

    /// `GET /mounts`.
    pub fn dynamic_list(&self, volume: &str) -> Result<Vec<MountView>, ApiErr> {
        let st = self.dynamic_state(volume)?;
        let progress = self.inner.artifacts.progress();
        Ok(st
            .dynamic
            .iter()
            .map(|(id, m)| {
                let key = waiter(volume, id);
                // A lazy mount's blobs are registered as it is read, not pulled: no pull progress.
                let pulled = progress.get(&key).filter(|_| m.process.is_none());
                let mut v = view(id, m, pulled.map(|p| (p.done_bytes, p.total_bytes)));
                v.lazy = self.lazy_status(&key);
                v
            })
            .collect())
    }

    /// `GET /mounts/{id}`.
    pub fn dynamic_get(&self, volume: &str, id: &str) -> Result<MountView, ApiErr> {
        api::check_id(id).map_err(|m| ApiErr::new(400, "bad_id", m))?;
        let st = self.dynamic_state(volume)?;
        let m = st.dynamic.get(id).ok_or_else(|| not_found(id))?;
        let key = waiter(volume, id);
        let mut v = view(id, m, self.progress_of(volume, id).filter(|_| m.process.is_none()));
        v.lazy = self.lazy_status(&key);
        Ok(v)
    }

    /// `POST /mounts`: the status (201 ready, 202 in progress, 200 the same request again)
    /// and the mount.
    ///
    /// The volume's lock is held only to read what it allows and to record the mount: the
    /// plugin's build, its plans and the resolution of what it mounts (registry I/O) happen
    /// without it, so a request waiting for the lock never waits for a registry. What the
    /// plan fetches is counted against the volume's byte cap before anything is recorded or
    /// fetched; the count, the cap on mounts and the id are checked again when it is recorded.
    pub async fn dynamic_create(&self, volume: &str, ask: CreateMount) -> Result<(u16, MountView), ApiErr> {
        api::check_id(&ask.id).map_err(|m| ApiErr::new(400, "bad_id", m))?;
        api::check_parameters(&ask.parameters).map_err(|m| ApiErr::new(400, "invalid_parameters", m))?;
        self.take_request_token(volume)?;
        let id = ask.id.clone();
        let st = {
            let _guard = self.lock_volume(volume, false).await?;
            self.dynamic_state(volume)?
        };
        let plugin = ask.plugin.clone().unwrap_or_else(|| st.plugin.clone());
        let mut record = DynamicMount {
            plugin,
            parameters: ask.parameters,
            phase: MountPhase::Pending,
            reason: None,
            steps: Vec::new(),
            bytes: 0,
            process: None,
        };
        mount_lazy(&st, &record).map_err(ApiErr::from)?;
        if let Some(again) = self.admit(&st, &id, &record)? {
            return Ok(again);
        }
        self.inner.runtime.resolve(&record.plugin, None).await.map_err(|e| match e {
            crate::plugin::PluginError::UnknownPlugin { .. } => ApiErr::new(
                404,
                "unknown_plugin",
                format!("plugin {:?} is not installed on this node: {e}", record.plugin),
            ),
            other => ApiErr::from(Error::from(other)),
        })?;
        // The plugin's plans, the policy's check and the resolution answer a bad request at
        // once, and leave nothing recorded.
        let p = self.planning(&st, &id, &record).await?;
        let planned = tokio::time::timeout(RESOLVE_WAIT, self.full_plan(&p, volume, &id, &record, false))
            .await
            .map_err(|_| {
                ApiErr::new(
                    503,
                    "unavailable",
                    format!(
                        "resolving the mount did not finish within {RESOLVE_WAIT:?} (is the registry reachable?); retry"
                    ),
                )
            })??;
        let Planned { plan, bytes, reservation, checked } = planned;
        record.bytes = bytes;
        {
            let _guard = self.lock_volume(volume, false).await?;
            let mut st = self.dynamic_state(volume)?;
            if let Some(again) = self.admit(&st, &id, &record)? {
                return Ok(again);
            }
            // Whatever an earlier mount of this id left in its cache directory goes first.
            let cache = self.dynamic_cache(volume).join(&id);
            self.blocking(move |n| n.inner.exec.remove_tree(&cache).map_err(|e| super::pipeline::io_error(e, &cache)))
                .await?;
            st.dynamic.insert(id.clone(), record);
            self.inner.store.save(&st).map_err(Error::from)?;
            // Its record counts its bytes from now on.
            drop(reservation);
            info!(volume.id = %volume, mount = %id, "dynamic mount accepted");
            self.spawn_mount(volume, &id, Some((plan, checked)), 1);
        }
        // A mount of files already in the cache is ready in milliseconds: answer with it.
        let deadline = tokio::time::Instant::now() + CREATE_WAIT;
        loop {
            // Registered before the look, so a mount settling in between still wakes this.
            let settled = self.inner.dynamic.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            let v = self.dynamic_get(volume, &id)?;
            match v.state {
                MountState::Ready => return Ok((201, v)),
                MountState::Failed => return Ok((200, v)),
                _ if tokio::time::Instant::now() >= deadline => return Ok((202, v)),
                _ => {
                    let _ = tokio::time::timeout_at(deadline, settled).await;
                }
            }
        }
    }

    /// May `record` become mount `id` of the volume `st`? `Some(answer)` when it already is
    /// (the same request again); an error when its plugin is not allowed, the id holds another
    /// mount or the volume holds as many mounts as it may.
    fn admit(&self, st: &VolumeState, id: &str, record: &DynamicMount) -> Result<Option<(u16, MountView)>, ApiErr> {
        let (_, allowed) = publication(st).expect("checked by dynamic_state");
        if !allowed.contains(&record.plugin) {
            return Err(ApiErr::new(
                403,
                "forbidden_plugin",
                format!(
                    "plugin {:?} is not allowed for this volume (allowed: {}); the StorageClass parameter dynamicPlugins sets the list",
                    record.plugin,
                    allowed.join(", ")
                ),
            ));
        }
        let volume = &st.volume_id;
        if let Some(m) = st.dynamic.get(id) {
            if m.plugin != record.plugin || m.parameters != record.parameters {
                return Err(ApiErr::new(
                    409,
                    "conflict",
                    format!("mount {id} exists with other parameters; delete it first"),
                ));
            }
            // A pending mount whose task is gone (its lock wait ended, a bug) starts again.
            if m.phase == MountPhase::Ready || (m.phase == MountPhase::Pending && self.mount_running(volume, id)) {
                return Ok(Some((200, view(id, m, self.progress_of(volume, id)))));
            }
            return Ok(None);
        }
        let max = self.limits_of(st).max_mounts;
        if st.dynamic.len() as u64 >= max {
            return Err(ApiErr::new(
                409,
                "too_many_mounts",
                format!(
                    "the volume holds {} mounts, the most it may ({} {max}); delete one first",
                    st.dynamic.len(),
                    limit_source(
                        &self.config().dynamic,
                        st,
                        crate::volume::request::DYNAMIC_MAX_MOUNTS_KEY,
                        "--dynamic-max-mounts"
                    )
                ),
            ));
        }
        Ok(None)
    }

    /// The limits of a dynamic volume: the node's, lowered by its attributes.
    fn limits_of(&self, st: &VolumeState) -> crate::config::DynamicCaps {
        let asked = st.published.values().find(|p| p.dynamic.is_some()).map(|p| p.dynamic_limits).unwrap_or_default();
        self.config().dynamic.effective(&asked)
    }

    /// One token of the volume's POST and DELETE bucket, or 429 with when to retry.
    ///
    /// The bucket is made from the volume's record at its first request and kept until the
    /// socket stops (the limits are the publication's and change only with it), so a request
    /// past the rate is answered without reading anything: a flood costs the daemon little.
    fn take_request_token(&self, volume: &str) -> Result<(), ApiErr> {
        let now = std::time::Instant::now();
        let taken = lock(&self.inner.dynamic.buckets)
            .get_mut(volume)
            .map(|(b, said)| b.take(now).map_err(|w| (w, said.clone())));
        let taken = match taken {
            Some(taken) => taken,
            None => {
                let st = self.dynamic_state(volume)?;
                let limits = self.limits_of(&st);
                let said = format!(
                    "this volume takes {} POST and DELETE requests a minute ({})",
                    limits.requests_per_minute,
                    limit_source(
                        &self.config().dynamic,
                        &st,
                        crate::volume::request::DYNAMIC_RATE_KEY,
                        "--dynamic-requests-per-minute"
                    )
                );
                let mut buckets = lock(&self.inner.dynamic.buckets);
                let (bucket, said) = buckets
                    .entry(volume.to_string())
                    .or_insert_with(|| (limits::Bucket::new(limits.burst, limits.requests_per_minute), said));
                bucket.take(now).map_err(|w| (w, said.clone()))
            }
        };
        taken.map_err(|(wait, said)| {
            let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
            ApiErr::new(429, "too_many_requests", format!("{said}; retry in {secs} s")).retry_after(secs)
        })
    }

    /// `DELETE /mounts/{id}`: unmounted, its directory and cache gone, forgotten. Runs as a
    /// task of its own with the volume's lock: a client that goes away does not stop it halfway.
    pub async fn dynamic_delete(&self, volume: &str, id: &str) -> Result<MountView, ApiErr> {
        api::check_id(id).map_err(|m| ApiErr::new(400, "bad_id", m))?;
        self.take_request_token(volume)?;
        let (this, volume, id) = (self.clone(), volume.to_string(), id.to_string());
        tokio::spawn(async move {
            let stopped = {
                let _guard = this.lock_volume(&volume, false).await?;
                let st = this.dynamic_state(&volume)?;
                let m = st.dynamic.get(&id).ok_or_else(|| not_found(&id))?.clone();
                let key = waiter(&volume, &id);
                if let Some(task) = this.inner.dynamic.tasks.lock().unwrap_or_else(|p| p.into_inner()).remove(&key) {
                    task.abort();
                }
                this.lazy_detach(&key);
                // Its downloads nobody else wants stop; until they have, they count.
                let stopped = this.abandon_mount(&volume, &id);
                let (v2, id2) = (volume.clone(), id.clone());
                this.blocking(move |n| n.remove_mount(&v2, &id2)).await?;
                let mut v = view(&id, &m, None);
                v.state = MountState::Deleted;
                v.reason = None;
                (v, stopped)
            };
            // Answered once they have stopped (at most a few seconds), without the lock.
            this.inner.artifacts.stopping(&stopped.1).await;
            Ok(stopped.0)
        })
        .await
        .map_err(|e| ApiErr::new(500, "internal", format!("a dynamic mount's deletion panicked: {e}")))?
    }

    /// Unmount one dynamic mount, remove its directory and cache, forget it. Blocking, with
    /// the volume's lock held. The mount is found where it should be and, by what it shows,
    /// anywhere below the target a pod may have moved it (renaming `mounts/`); the mount table
    /// is read once.
    fn remove_mount(&self, volume: &str, id: &str) -> Result<(), Error> {
        let Some(mut st) = self.inner.store.load(volume)? else { return Ok(()) };
        let Some(target) = publication(&st).map(|(t, _)| t.clone()) else { return Ok(()) };
        let record = st.dynamic.remove(id);
        let dir = target.join(MOUNTS_DIR).join(id);
        let cache = self.dynamic_cache(volume).join(id);
        let table = self
            .inner
            .exec
            .mounts_touching(&[target.as_path(), cache.as_path()])
            .map_err(|e| Error::internal(format!("reading the mount table: {e}")))?;
        let mut actions = Vec::new();
        // A lazy mount's server goes first (its mounts then go below).
        if let Some(p) = record.as_ref().and_then(|r| r.process).filter(|p| self.inner.exec.is_alive(p)) {
            actions.push(super::diff::Action::Stop(p));
        }
        for at in moved_mounts(&table, &target, &dir, record.as_ref().map(|r| r.steps.as_slice()).unwrap_or(&[])) {
            actions.push(super::diff::Action::Unmount(at));
        }
        let observed =
            super::diff::Observed { mounts: &table, process_alive: false, gone_targets: &Default::default() };
        let removed = super::diff::diff(&Desired::Removed { dirs: vec![dir, cache] }, observed)
            .map_err(|e| Error::internal(e.to_string()))?;
        actions.extend(removed);
        self.apply(volume, &actions, &Secrets::default(), &mut Default::default())?;
        self.inner.store.save(&st)?;
        info!(volume.id = %volume, mount = %id, "dynamic mount deleted");
        Ok(())
    }

    /// Mount `id` of `volume` is gone (deleted, failed): it stops waiting for its blobs, and the
    /// downloads it stopped count in the volume's level until they end ([`ledger`]). Returns
    /// their blobs.
    fn abandon_mount(&self, volume: &str, id: &str) -> Vec<crate::oci::Stopping> {
        let artifacts = &self.inner.artifacts;
        let stopped = artifacts.abandon(&waiter(volume, id));
        self.inner.dynamic.ledger.ending(volume, stopped.clone(), artifacts);
        stopped
    }

    /// Is a task working on this mount now?
    fn mount_running(&self, volume: &str, id: &str) -> bool {
        let tasks = self.inner.dynamic.tasks.lock().unwrap_or_else(|p| p.into_inner());
        tasks.get(&waiter(volume, id)).is_some_and(|t| !t.is_finished())
    }

    /// Start (or start again) the task that plans (unless `planned`), pulls and mounts a
    /// recorded mount, in up to `attempts` attempts while it fails retriably.
    fn spawn_mount(&self, volume: &str, id: &str, planned: Option<Ready>, attempts: u32) {
        let key = waiter(volume, id);
        let (this, volume, id) = (self.clone(), volume.to_string(), id.to_string());
        // Registered before the task can end (its end forgets its own handle only).
        let mut tasks = self.inner.dynamic.tasks.lock().unwrap_or_else(|p| p.into_inner());
        let task = tokio::runtime::Handle::current().spawn(async move {
            // Aborted (a DELETE, an unpublish) wherever it is: what it registered meanwhile is
            // abandoned as the DELETE abandons it.
            let mut guard = AbortGuard { node: this.clone(), volume: volume.clone(), id: id.clone(), armed: true };
            let mut planned = planned;
            let mut attempt = 1;
            let outcome = loop {
                let outcome = this.mount_now(&volume, &id, planned.take()).await;
                match outcome {
                    Err(e) => match retry_after(e.kind, attempt, attempts) {
                        Some(pause) => {
                            warn!(volume.id = %volume, mount = %id, attempt, error = %e.message, "a dynamic mount pending at start failed; trying again");
                            // Its stopped downloads end before it plans again; its record's bytes
                            // count for them meanwhile (it is still pending).
                            let stopped = this.inner.artifacts.abandon(&waiter(&volume, &id));
                            this.inner.artifacts.stopping(&stopped).await;
                            tokio::time::sleep(pause).await;
                            attempt += 1;
                        }
                        None if attempts > 1 => {
                            break Err(Error::new(
                                e.kind,
                                format!("after {attempt} attempt(s) since the host daemon started: {}", e.message),
                            ));
                        }
                        None => break Err(e),
                    },
                    ok => break ok,
                }
            };
            guard.armed = false;
            this.settle(&volume, &id, outcome).await;
        });
        if let Some(old) = tasks.insert(key, task.abort_handle()) {
            old.abort();
        }
    }

    /// Record how a mount's task ended (unless the mount was deleted meanwhile).
    async fn settle(&self, volume: &str, id: &str, outcome: Result<(), Error>) {
        let key = waiter(volume, id);
        // A lazy mount reads its blobs for as long as it exists: its session keeps them
        // registered (DELETE forgets them).
        if outcome.is_err() {
            // Its downloads nobody else wants stop; until they have, they count.
            self.abandon_mount(volume, id);
        } else if !self.lazy_attached(&key) {
            self.inner.artifacts.forget(&key);
        }
        if let Err(e) = &outcome {
            warn!(volume.id = %volume, mount = %id, error = %e.message, "dynamic mount failed");
            if let Ok(_guard) = self.lock_volume(volume, true).await
                && let Ok(Some(mut st)) = self.inner.store.load(volume)
                && let Some(m) = st.dynamic.get_mut(id).filter(|m| m.phase == MountPhase::Pending)
            {
                m.phase = MountPhase::Failed;
                m.reason = Some(crate::error::bounded(format!("{}: {}", kind_name(e.kind), e.message)));
                if let Err(e) = self.inner.store.save(&st) {
                    warn!(volume.id = %volume, mount = %id, error = %e, "recording a failed dynamic mount");
                }
            }
        }
        // Forgotten only if it is still this task's (a POST may have started a newer one).
        let mut tasks = self.inner.dynamic.tasks.lock().unwrap_or_else(|p| p.into_inner());
        if tasks.get(&key).is_some_and(|t| tokio::task::try_id() == Some(t.id())) {
            tasks.remove(&key);
        }
        drop(tasks);
        self.inner.dynamic.settled.notify_waiters();
    }

    /// What planning a mount of `volume` needs: the plugin's build, what it may see, the
    /// mount's directories.
    async fn planning(&self, st: &VolumeState, id: &str, m: &DynamicMount) -> Result<Planning, Error> {
        let (target, _) = publication(st).ok_or_else(|| Error::unavailable("the volume is being unpublished"))?;
        let own = m.plugin == st.plugin;
        let plugin = if own {
            self.resolve_build(&st.volume_id, &st.plugin, Some(&st.digest), st.pinned).await?
        } else {
            self.inner.runtime.resolve(&m.plugin, None).await?
        };
        let credentials = self.mount_credentials(st, &plugin, own)?;
        // Another plugin sees none of the volume's attributes (and they grant it nothing).
        Ok(Planning {
            plugin,
            lazy: mount_lazy(st, m)?,
            lazy_asked: m.parameters.contains_key(crate::volume::request::LAZY_KEY),
            context: if own { st.context.clone() } else { BTreeMap::new() },
            recorded: if own { kvs(&st.plan.attributes) } else { Vec::new() },
            dirs: VolumeDirs {
                staging: None,
                target: Some(target.join(MOUNTS_DIR).join(id)),
                cache: Some(self.dynamic_cache(&st.volume_id).join(id)),
                runtime: None,
                fuse_files: None,
            },
            ephemeral: st.ephemeral,
            credentials,
            policy: self.mount_policy(st, m)?,
        })
    }

    /// The signature policy of mount `m` of volume `st`: the volume's, which the mount's own
    /// `signedBy` may narrow (entries the volume lists) or, on a volume without one, set; and
    /// `chunkIndex: required` if either says so. A pod never widens its volume's policy.
    fn mount_policy(&self, st: &VolumeState, m: &DynamicMount) -> Result<Policy, Error> {
        use crate::volume::request::{CHUNK_INDEX_KEY, SIGNED_BY_KEY, parse_signers, shown};
        let signers = match m.parameters.get(SIGNED_BY_KEY) {
            None => st.signed_by.clone(),
            Some(raw) => {
                let asked = parse_signers(raw)
                    .map_err(|why| Error::invalid(format!("parameter {SIGNED_BY_KEY} is {}: {why}", shown(raw))))?;
                if let Some(other) = asked.iter().find(|n| !st.signed_by.is_empty() && !st.signed_by.contains(n)) {
                    return Err(Error::new(
                        ErrorKind::PermissionDenied,
                        format!(
                            "parameter {SIGNED_BY_KEY} names {other}, which this volume's {SIGNED_BY_KEY} ({}) does not: a \
                             mount may narrow its volume's signature policy, never widen it",
                            st.signed_by.join(", ")
                        ),
                    ));
                }
                asked
            }
        };
        let index = match m.parameters.get(CHUNK_INDEX_KEY).map(String::as_str) {
            None => st.chunk_index_required,
            Some("required") => true,
            Some(other) => {
                return Err(Error::invalid(format!(
                    "parameter {CHUNK_INDEX_KEY} is {}; the one value is \"required\"",
                    shown(other)
                )));
            }
        };
        Ok(self.policy(&signers, index))
    }

    /// One call of the plugin's `dynamic-mount` planner (with what the host resolved, on the
    /// second round), and the policy's check of its plan.
    async fn plan_round(
        &self,
        p: &Planning,
        volume: &str,
        m: &DynamicMount,
        resolved: Vec<wit::Kv>,
    ) -> Result<Plan, Error> {
        let req = wit::DynamicMountRequest {
            volume_id: volume.to_string(),
            context: crate::volume::request::kvs(&p.context),
            // `lazy`, `signedBy` and `chunkIndex` are the host's, as a volume's attributes are.
            request: crate::volume::request::kvs(m.parameters.iter().filter(|(k, _)| {
                ![
                    crate::volume::request::LAZY_KEY,
                    crate::volume::request::SIGNED_BY_KEY,
                    crate::volume::request::CHUNK_INDEX_KEY,
                ]
                .contains(&k.as_str())
            })),
            subdir: String::new(),
            // The host's resolution first, and no recorded attribute under its prefix.
            recorded: resolved
                .into_iter()
                .chain(p.recorded.iter().filter(|kv| !kv.key.starts_with(RESERVED_ATTRIBUTE_PREFIX)).cloned())
                .collect(),
        };
        let wplan = self.inner.runtime.call(&p.plugin, volume, req).await?;
        let none = Secrets::default();
        self.check(&p.plugin, Operation::DynamicMount, &p.dirs, &p.context, p.ephemeral, &none, wplan)
    }

    /// A mount's whole plan: the plugin's first, and when it resolves an OCI reference, the
    /// second with what the host resolved (registry I/O; never with the volume's lock held).
    ///
    /// What it fetches is reserved in the volume's level (`again`: the mount is recorded)
    /// before anything beyond its manifest is fetched: a 507 otherwise.
    async fn full_plan(
        &self,
        p: &Planning,
        volume: &str,
        id: &str,
        m: &DynamicMount,
        again: bool,
    ) -> Result<Planned, Error> {
        // A refusal of the cap, or the volume going meanwhile.
        let exhausted = |e: ApiErr| match e.status {
            507 => Error::new(ErrorKind::ResourceExhausted, e.message),
            503 => Error::unavailable(e.message),
            _ => Error::internal(e.message),
        };
        let plan = self.plan_round(p, volume, m, Vec::new()).await?;
        let Some(first) = plan.steps.iter().find(|s| matches!(s, Step::Resolve { .. })).cloned() else {
            if p.lazy && p.lazy_asked {
                return Err(Error::invalid(format!(
                    "mount {id}: {} is \"true\", but plugin {} plans no OCI artifact to serve lazily",
                    crate::volume::request::LAZY_KEY,
                    p.plugin.info.name
                )));
            }
            if p.policy.required && (!p.policy.signers.is_empty() || super::signed::names_artifact(&plan)) {
                return Err(super::signed::refusal(
                    &format!("mount {id}"),
                    "unsupported",
                    "model",
                    format!(
                        "it must be signed, but plugin {} resolves no OCI artifact whose signature the host could check",
                        p.plugin.info.name
                    ),
                ));
            }
            let bytes = fetched_bytes(&plan);
            let reservation = self.reserve_bytes(volume, id, again, bytes).map_err(exhausted)?;
            return Ok(Planned { plan, bytes, reservation, checked: Checked::default() });
        };
        let source = self.mount_source(&first, &p.credentials)?;
        let Step::Resolve { reference, .. } = &first else { unreachable!("matched above") };
        let found = self.inner.artifacts.resolve(&source).await.map_err(|e| super::pull::oci_error(e, reference))?;
        let resolved = vec![
            kv(RESOLVED_REFERENCE, reference),
            kv(RESOLVED_MANIFEST_DIGEST, &found.manifest_digest),
            kv(RESOLVED_MANIFEST, &found.manifest),
            kv(RESOLVED_CONFIG, &found.config),
        ];
        let plan = self.plan_round(p, volume, m, resolved).await?;
        if plan.steps.iter().find(|s| matches!(s, Step::Resolve { .. })) != Some(&first) {
            return Err(Error::internal(format!(
                "plugin {} answered the resolved {reference} with a plan that does not resolve it again unchanged",
                p.plugin.info.name
            )));
        }
        // Before anything but the manifest is fetched: the signature and the raw layers' files.
        let checked = self
            .check_signature(
                &p.policy,
                &plan,
                p.lazy,
                &source,
                reference,
                &found.manifest,
                &found.manifest_digest,
                None,
            )
            .await?;
        let layers = fetched_bytes(&plan);
        if p.lazy {
            if checked.needs_trees() {
                return Err(super::signed::refusal(
                    reference,
                    "unsupported",
                    "model",
                    format!(
                        "mount {id} is lazy and under a signature policy, which serves raw layers only (their chunks \
                         checked against the signed index): it has archive layers, whose files can be checked only \
                         once fetched; mount it with lazy \"false\""
                    ),
                ));
            }
            let index = match &checked.verification.index {
                Some(d) => IndexChoice::Use(d.clone(), checked.verification.index_size),
                None => IndexChoice::Lookup,
            };
            // Served by a lazy server of its own while its blobs download (docs/lazy.md); its
            // chunk index counts like a blob, reserved before it is fetched.
            let control = crate::plan::lazy::mount_control(id);
            let key = waiter(volume, id);
            let reserved = Mutex::new(None);
            let admit = |index: u64| {
                let r = self.reserve_bytes(volume, id, again, layers.saturating_add(index)).map_err(exhausted)?;
                *lock(&reserved) = Some((r, layers.saturating_add(index)));
                Ok(())
            };
            let plan =
                self.lazy_plan(&key, plan, &source, reference, &found.manifest_digest, index, control, &admit).await?;
            let (reservation, bytes) = lock(&reserved)
                .take()
                .ok_or_else(|| Error::internal("a lazy mount was planned without its bytes reserved"))?;
            return Ok(Planned { plan, bytes, reservation, checked });
        }
        let reservation = self.reserve_bytes(volume, id, again, layers).map_err(exhausted)?;
        Ok(Planned { plan, bytes: layers, reservation, checked })
    }

    /// Plan (unless `planned`: what the POST planned), pull and mount one recorded mount.
    async fn mount_now(&self, volume: &str, id: &str, planned: Option<Ready>) -> Result<(), Error> {
        let st = self.inner.store.load(volume)?.ok_or_else(|| Error::unavailable("the volume is gone"))?;
        let Some(m) = st.dynamic.get(id).cloned() else { return Ok(()) };
        let (plan, checked) = match planned {
            Some(ready) => ready,
            None => {
                // Planned again (a restarted daemon): the tag may name a larger artifact now.
                // Its record takes the new bytes before the reservation goes.
                let p = self.planning(&st, id, &m).await?;
                let Planned { plan, bytes, reservation, checked } = self.full_plan(&p, volume, id, &m, true).await?;
                let _guard = self.lock_volume(volume, true).await.map_err(|e| Error::unavailable(e.message))?;
                let Some(mut st) = self.inner.store.load(volume)? else { return Ok(()) };
                match st.dynamic.get_mut(id) {
                    Some(m) if m.phase == MountPhase::Pending => m.bytes = bytes,
                    _ => return Ok(()),
                }
                self.inner.store.save(&st)?;
                drop(reservation);
                (plan, checked)
            }
        };
        let lazy = crate::plan::lazy::layers(&plan).is_some();
        if lazy {
            // Its blobs are this mount's from now on (`settle` forgets them if it fails).
            self.lazy_register(&waiter(volume, id), &plan);
        }
        if let Some(first) = plan.steps.iter().find(|s| matches!(s, Step::Resolve { .. }))
            && !lazy
        {
            let source = self.mount_source(first, &self.mount_credentials_of(&st, &m.plugin).await?)?;
            let Step::Resolve { reference, .. } = first else { unreachable!("matched above") };
            self.pull(volume, id, &source, &plan, reference).await?;
            // Fetched and unpacked in the cache, nothing linked yet: the tar layers' files.
            let c = checked.clone();
            self.blocking(move |n| n.check_trees(&c)).await?;
        }
        // The mount still waits for its blobs (the artifacts keep them from a prune) until its
        // record holds its steps; `settle` forgets it, however this ends.
        let _guard = self.lock_volume(volume, true).await.map_err(|e| Error::unavailable(e.message))?;
        let (volume, id) = (volume.to_string(), id.to_string());
        let fetched = plan.steps.iter().any(|s| matches!(s, Step::FetchBlob { .. }));
        self.blocking(move |n| {
            // Deleted or unpublished while it was being planned: nothing to mount.
            let Some(st) = n.inner.store.load(&volume)? else { return Ok(()) };
            if st.dynamic.get(&id).is_none_or(|m| m.phase != MountPhase::Pending) || publication(&st).is_none() {
                return Ok(());
            }
            if lazy {
                // Its server runs as the volume's own FUSE user, recorded first.
                n.mount_fuse_id(&volume)?;
            }
            let st = if lazy { n.inner.store.load(&volume)?.unwrap_or(st) } else { st };
            n.apply_mount(&st, &id, plan.steps)?;
            if fetched {
                // Its blobs now count as used: the cache may shrink to its cap, as after a stage.
                n.prune_to_cap();
            }
            if lazy {
                n.lazy_attach(&waiter(&volume, &id));
            }
            Ok(())
        })
        .await
    }

    /// Wait until every blob of `plan` is in the cache and every archive unpacked.
    async fn pull(
        &self,
        volume: &str,
        id: &str,
        source: &crate::oci::Source,
        plan: &Plan,
        reference: &str,
    ) -> Result<(), Error> {
        let blobs = super::pull::plan_blobs(plan);
        let oci = |e| super::pull::oci_error(e, reference);
        self.inner.artifacts.authorize(source, &blobs).await.map_err(oci)?;
        let key = waiter(volume, id);
        loop {
            match self.inner.artifacts.ensure(&key, source, &blobs) {
                // Another source may have brought a blob meanwhile: this one must prove its own
                // access to it too (memoized, so a blob it fetched itself costs nothing).
                Ensure::Ready => {
                    self.inner.artifacts.authorize(source, &blobs).await.map_err(oci)?;
                    break;
                }
                Ensure::Pulling(_) => tokio::time::sleep(PULL_TICK).await,
                Ensure::Failed(e) => return Err(oci(e)),
            }
        }
        for step in &plan.steps {
            if let Step::Unpack { digest, format, layering, .. } = step {
                loop {
                    match self.inner.assembler.prepare(digest, *format, *layering) {
                        Prepared::Ready => break,
                        Prepared::Working => tokio::time::sleep(PULL_TICK).await,
                        Prepared::Failed(e) => return Err(oci(e)),
                    }
                }
            }
        }
        Ok(())
    }

    /// Apply a checked dynamic-mount plan and record the mount ready. Blocking, with the
    /// volume's lock held (or at start, before anything is served).
    fn apply_mount(&self, st: &VolumeState, id: &str, steps: Vec<Step>) -> Result<(), Error> {
        let (target, _) = publication(st).ok_or_else(|| Error::unavailable("the volume is being unpublished"))?;
        self.repair_mounts_dir(target)?;
        let mounts = target.join(MOUNTS_DIR);
        // A link, file or socket a pod put where the mount goes is removed, never followed.
        let dir = mounts.join(id);
        if let Some(found) = self.inner.exec.file_id(&dir).map_err(|e| super::pipeline::io_error(e, &dir))?
            && found.kind != FileKind::Directory
        {
            warn!(path = %dir.display(), kind = ?found.kind, "a pod put something where a dynamic mount goes: removing it");
            self.inner.exec.remove_entry(&dir).map_err(|e| super::pipeline::io_error(e, &dir))?;
        }
        let cache = self.dynamic_cache(&st.volume_id);
        let mut next = st.clone();
        if let Some(m) = next.dynamic.get_mut(id) {
            m.phase = MountPhase::Ready;
            m.reason = None;
            m.steps = steps.clone();
        }
        let (before, mount) = (st.clone(), id.to_string());
        let job = Job::plain(
            &st.volume_id,
            Desired::Dynamic {
                target: Root { path: mounts.join(id), below: mounts },
                cache: Root { path: cache.join(id), below: cache },
                steps,
            },
            move |applied| {
                // A lazy mount's server, started by this job.
                if let (Some(p), Some(m)) = (applied.spawned, next.dynamic.get_mut(&mount)) {
                    m.process = Some(p);
                }
                if next == before { Persist::Keep } else { Persist::Save(Box::new(next)) }
            },
        );
        self.run_job(job)?;
        info!(volume.id = %st.volume_id, mount = %id, "dynamic mount ready");
        Ok(())
    }
}

impl Node {
    /// Start a lazy dynamic mount's server again (it died, or a restarted daemon found it gone):
    /// what is left mounted at its directory goes (lazily: a pod may hold it), then its
    /// recorded steps run again (a new server, a new bind). Blocking, with the volume's lock
    /// held (or at start, before anything is served).
    pub(super) fn heal_mount_locked(&self, volume: &str, id: &str) -> Result<(), Error> {
        let st = self.inner.store.load(volume)?.ok_or_else(|| Error::unavailable("the volume is gone"))?;
        let Some(m) = st.dynamic.get(id).filter(|m| m.phase == MountPhase::Ready).cloned() else { return Ok(()) };
        let (target, _) = publication(&st).ok_or_else(|| Error::unavailable("the volume is being unpublished"))?;
        let dir = target.join(MOUNTS_DIR).join(id);
        if let Some(p) = m.process.filter(|p| self.inner.exec.is_alive(p)) {
            self.inner.exec.stop(&p, self.inner.config.fuse_stop_grace)?;
        }
        let table = self.mounts_touching(&[dir.as_path()])?;
        let stale: Vec<super::diff::Action> =
            table.iter().filter(|e| e.mount_point == dir).map(|_| super::diff::Action::Unmount(dir.clone())).collect();
        self.apply(volume, &stale, &Secrets::default(), &mut Default::default())?;
        warn!(volume.id = %volume, mount = %id, "the lazy dynamic mount's server is gone: starting it again");
        self.apply_mount(&st, id, m.steps)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Mounts below `target` but not at `dir` that show what the mount's binds bind (same device
/// and root as their source): the mount, moved by a pod that renamed `mounts/` or a parent.
fn moved_mounts(
    table: &[crate::exec::mountinfo::MountEntry],
    target: &Path,
    dir: &Path,
    steps: &[Step],
) -> Vec<PathBuf> {
    let shows = |source: &Path| {
        table
            .iter()
            .filter(|m| source.starts_with(&m.mount_point))
            .max_by_key(|m| m.mount_point.as_os_str().len())
            .map(|m| (m.device.clone(), m.root.join(source.strip_prefix(&m.mount_point).expect("filtered"))))
    };
    let sources: Vec<(String, PathBuf)> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Bind { source, .. } => shows(source),
            _ => None,
        })
        .collect();
    let mut out: Vec<PathBuf> = table
        .iter()
        .filter(|m| m.mount_point.starts_with(target) && !m.mount_point.starts_with(dir))
        // The volume's own files are never a mount's.
        .filter(|m| !m.mount_point.starts_with(target.join(VOLUME_DIR)))
        .filter(|m| sources.iter().any(|(dev, root)| m.device == *dev && m.root == *root))
        .map(|m| m.mount_point.clone())
        .collect();
    // Deepest first.
    out.sort();
    out.dedup();
    out.reverse();
    out
}

/// The bytes a plan fetches (a lazy mount's: its layers').
fn fetched_bytes(plan: &Plan) -> u64 {
    steps_bytes(&plan.steps)
}

/// What `steps` fetch: their `fetch-blob` steps' sizes, and a lazy server's layers.
fn steps_bytes(steps: &[Step]) -> u64 {
    let lazy = crate::plan::lazy::layers_of(steps).into_iter().flat_map(|l| l.layers.iter().map(|l| l.size));
    steps
        .iter()
        .map(|s| if let Step::FetchBlob { size, .. } = s { *size } else { 0 })
        .chain(lazy)
        .fold(0, u64::saturating_add)
}

/// Is mount `m` of volume `st` served lazily: its `lazy` parameter (the host's, never the
/// plugin's), else the volume's own laziness (for a mount that plans an OCI artifact).
fn mount_lazy(st: &VolumeState, m: &DynamicMount) -> Result<bool, Error> {
    match m.parameters.get(crate::volume::request::LAZY_KEY).map(String::as_str) {
        None => Ok(crate::plan::lazy::layers(&st.plan).is_some()),
        Some("true") => Ok(true),
        Some("false") => Ok(false),
        Some(other) => Err(Error::invalid(format!(
            "parameter {} is {}; use \"true\" or \"false\"",
            crate::volume::request::LAZY_KEY,
            crate::volume::request::shown(other)
        ))),
    }
}

/// Where a volume's limit comes from: its attribute `key` when it set one at or below the
/// node's `node` (caps lowered since its publish win), else the node's `flag`.
fn limit_source(node: &crate::config::DynamicCaps, st: &VolumeState, key: &str, flag: &str) -> String {
    let set = st.published.values().find(|p| p.dynamic.is_some()).map(|p| p.dynamic_limits).unwrap_or_default();
    if node.set_by_volume(&set, key) { format!("volume attribute {key}") } else { format!("the node's {flag}") }
}

fn not_found(id: &str) -> ApiErr {
    ApiErr::new(404, "not_found", format!("this volume has no mount {id}"))
}

fn kv(key: &str, value: &str) -> wit::Kv {
    wit::Kv { key: key.into(), value: value.into() }
}

fn kvs(pairs: &[(String, String)]) -> Vec<wit::Kv> {
    pairs.iter().map(|(k, v)| kv(k, v)).collect()
}

/// The gRPC-style name of an error class, for a failed mount's reason.
fn kind_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::InvalidArgument => "invalid argument",
        ErrorKind::NotFound => "not found",
        ErrorKind::AlreadyExists => "already exists",
        ErrorKind::FailedPrecondition => "failed precondition",
        ErrorKind::Aborted => "aborted",
        ErrorKind::Unavailable => "unavailable",
        ErrorKind::DeadlineExceeded => "deadline exceeded",
        ErrorKind::Internal => "internal",
        ErrorKind::Unimplemented => "unimplemented",
        ErrorKind::Unauthenticated => "unauthenticated",
        ErrorKind::PermissionDenied => "permission denied",
        ErrorKind::ResourceExhausted => "resource exhausted",
        ErrorKind::DataLoss => "data loss",
        ErrorKind::OutOfRange => "out of range",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::mountinfo::MountEntry;

    fn entry(at: &str, device: &str, root: &str) -> MountEntry {
        MountEntry {
            mount_id: 1,
            parent_id: 1,
            device: device.into(),
            root: root.into(),
            mount_point: at.into(),
            mount_options: "ro".into(),
            fstype: "ext4".into(),
            source: "src".into(),
            super_options: String::new(),
        }
    }

    #[test]
    fn a_mount_a_pod_moved_is_found_by_what_it_shows() {
        let t = "/k/pods/p/mount";
        let table = [
            entry("/", "8:1", "/"),
            entry("/s", "8:2", "/"),
            entry(t, "0:40", "/"),
            // Moved with `mounts/` renamed to `old/`, and one where it belongs.
            entry(&format!("{t}/old/m1"), "8:2", "/cache/dyn/m1/model"),
            entry(&format!("{t}/mounts/m1"), "8:2", "/cache/dyn/m1/model"),
            // Another mount's, and the volume's own files: not this one.
            entry(&format!("{t}/old/m2"), "8:2", "/cache/dyn/m2/model"),
            entry(&format!("{t}/volume"), "8:2", "/cache/dyn/m1/model"),
        ];
        let steps = [Step::Bind {
            source: "/s/cache/dyn/m1/model".into(),
            target: format!("{t}/mounts/m1").into(),
            readonly: true,
            options: vec![],
        }];
        let found = moved_mounts(&table, Path::new(t), &Path::new(t).join("mounts/m1"), &steps);
        assert_eq!(found, vec![PathBuf::from(format!("{t}/old/m1"))]);
        assert!(moved_mounts(&table, Path::new(t), &Path::new(t).join("mounts/m1"), &[]).is_empty());
    }

    #[test]
    fn a_lazy_mount_counts_its_layers_against_the_cap_as_a_pulled_one_its_blobs() {
        let plan = crate::plan::lazy::tests::model_plan();
        let pulled = fetched_bytes(&plan);
        assert!(pulled > 0);
        let lazy = crate::plan::lazy::lower(plan, std::path::Path::new("/m")).unwrap();
        assert!(!lazy.steps.iter().any(|s| matches!(s, Step::FetchBlob { .. })), "nothing is fetched before");
        assert_eq!(fetched_bytes(&lazy), pulled);
    }

    #[test]
    fn a_mount_pending_at_start_is_retried_with_growing_pauses_then_given_up() {
        use std::time::Duration;
        let pauses: Vec<Option<Duration>> =
            (1..=RESUME_ATTEMPTS).map(|a| retry_after(ErrorKind::Unavailable, a, RESUME_ATTEMPTS)).collect();
        let s = Duration::from_secs;
        assert_eq!(pauses, vec![Some(s(2)), Some(s(4)), Some(s(8)), Some(s(16)), None]);
        // A permanent failure (a refused reply, a cap) is not retried; a POST's one attempt is all.
        for kind in [ErrorKind::FailedPrecondition, ErrorKind::ResourceExhausted, ErrorKind::InvalidArgument] {
            assert_eq!(retry_after(kind, 1, RESUME_ATTEMPTS), None);
        }
        assert_eq!(retry_after(ErrorKind::Unavailable, 1, 1), None);
        assert_eq!(retry_after(ErrorKind::Unavailable, 30, 40), Some(RESUME_MAX));
    }

    #[test]
    fn a_pending_mount_with_progress_is_pulling() {
        let m = DynamicMount {
            plugin: "model".into(),
            parameters: BTreeMap::new(),
            phase: MountPhase::Pending,
            reason: None,
            steps: vec![],
            bytes: 0,
            process: None,
        };
        assert_eq!(view("a", &m, None).state, MountState::Pending);
        let v = view("a", &m, Some((1, 2)));
        assert_eq!(
            (v.state, v.bytes_done, v.bytes_total, v.path.as_str()),
            (MountState::Pulling, Some(1), Some(2), "mounts/a")
        );
    }
}
