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
mod server;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{info, warn};

use super::Node;
use super::diff::{Desired, Root};
use super::pipeline::{Job, Persist, Undo};
use crate::error::{Error, ErrorKind};
use crate::exec::oci::{BlobRef, Ensure, Prepared};
use crate::exec::{FileId, FileKind};
use crate::plan::policy::Operation;
use crate::plan::{MountOption, Plan, Step};
use crate::plugin::bindings::types as wit;
use crate::secrets::Secrets;
use crate::volume::VolumeDirs;
use crate::volume::state::{DynamicMount, MountPhase, VolumeState};

use api::{CreateMount, MOUNTS_DIR, MountState, MountView, SOCKET_NAME};

/// Where a dynamic volume's own files go, below its target.
pub const VOLUME_DIR: &str = "volume";
/// The source name of the host's tmpfs at a dynamic volume's target.
pub const TMPFS_SOURCE: &str = "mounthost-dynamic";
/// Mounts one volume may hold.
pub const MAX_MOUNTS: usize = 64;
/// The reserved keys the resolution of a dynamic mount's `resolve` step is passed under.
pub const RESOLVED_REFERENCE: &str = "mounthost.resolved.reference";
pub const RESOLVED_MANIFEST_DIGEST: &str = "mounthost.resolved.manifestDigest";
pub const RESOLVED_MANIFEST: &str = "mounthost.resolved.manifest";
pub const RESOLVED_CONFIG: &str = "mounthost.resolved.config";
/// How long a POST waits for its mount before answering 202.
const CREATE_WAIT: Duration = Duration::from_secs(2);
/// How often a mount waiting for its blobs looks again.
const PULL_TICK: Duration = Duration::from_millis(20);
/// How long an API call waits for the volume's lock (another call on the volume).
const LOCK_WAIT: Duration = Duration::from_secs(10);

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
fn waiter(volume: &str, id: &str) -> String {
    format!("{volume}\n{id}")
}

/// Is this key of the cache's waiters a dynamic mount's (not a volume's)?
pub fn is_mount_waiter(key: &str) -> bool {
    key.contains('\n')
}

/// The servers and mount tasks of this daemon.
#[derive(Default)]
pub struct Dynamic {
    servers: Mutex<HashMap<String, Served>>,
    tasks: Mutex<HashMap<String, tokio::task::AbortHandle>>,
    /// Signalled when a mount reaches a final phase.
    settled: tokio::sync::Notify,
}

/// What planning one mount needs ([`Node::planning`]).
struct Planning {
    plugin: Arc<crate::plugin::LoadedPlugin>,
    context: BTreeMap<String, String>,
    recorded: Vec<wit::Kv>,
    dirs: VolumeDirs,
    ephemeral: bool,
}

struct Served {
    socket: PathBuf,
    id: Arc<Mutex<FileId>>,
    task: tokio::task::AbortHandle,
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
}

impl ApiErr {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        ApiErr { status, code, message: message.into() }
    }
}

impl From<Error> for ApiErr {
    fn from(e: Error) -> Self {
        let (status, code) = match e.kind {
            ErrorKind::InvalidArgument => (400, "invalid_parameters"),
            ErrorKind::NotFound => (404, "not_found"),
            ErrorKind::AlreadyExists | ErrorKind::FailedPrecondition => (409, "conflict"),
            ErrorKind::Aborted => (503, "busy"),
            ErrorKind::Unavailable | ErrorKind::DeadlineExceeded => (503, "unavailable"),
            ErrorKind::Unauthenticated => (401, "unauthenticated"),
            ErrorKind::PermissionDenied => (403, "permission_denied"),
            ErrorKind::ResourceExhausted => (507, "resource_exhausted"),
            ErrorKind::DataLoss => (502, "data_loss"),
            ErrorKind::Internal | ErrorKind::Unimplemented => (500, "internal"),
        };
        ApiErr { status, code, message: e.message }
    }
}

/// A mount's view for the API.
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
        let mut servers = self.inner.dynamic.servers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = servers.get(volume)
            && s.socket == socket
            && !s.task.is_finished()
            && exec.file_id(socket).ok().flatten() == Some(*s.id.lock().unwrap_or_else(|p| p.into_inner()))
        {
            return Ok(());
        }
        let (listener, id) = self.listen_dynamic(dir)?;
        let id = Arc::new(Mutex::new(id));
        let task = tokio::runtime::Handle::current()
            .spawn(server::run(self.clone(), volume.to_string(), dir.to_path_buf(), listener, id.clone()))
            .abort_handle();
        servers.insert(volume.to_string(), Served { socket: socket.to_path_buf(), id, task });
        info!(volume.id = %volume, socket = %socket.display(), "serving the dynamic volume's socket");
        Ok(())
    }

    /// Bind the socket in `dir` (replacing whatever has its name).
    fn listen_dynamic(&self, dir: &Path) -> Result<(tokio::net::UnixListener, FileId), Error> {
        let (std, id) = self
            .inner
            .exec
            .listen_in(dir, SOCKET_NAME, 0o666)
            .map_err(|e| super::pipeline::io_error(e, &dir.join(SOCKET_NAME)))?;
        let listener = tokio::net::UnixListener::from_std(std)
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

    /// The server's periodic check: its socket still the one it listens on (else a new
    /// listener, returned), `mounts/` still a directory.
    async fn repair(&self, target: PathBuf, id: Arc<Mutex<FileId>>) -> Result<Option<tokio::net::UnixListener>, Error> {
        self.blocking(move |n| {
            n.repair_mounts_dir(&target)?;
            let socket = target.join(SOCKET_NAME);
            let current = *id.lock().unwrap_or_else(|p| p.into_inner());
            if n.inner.exec.file_id(&socket).ok().flatten() == Some(current) {
                return Ok(None);
            }
            warn!(socket = %socket.display(), "a pod removed or replaced the volume's socket: serving it again");
            let (listener, new) = n.listen_dynamic(&target)?;
            *id.lock().unwrap_or_else(|p| p.into_inner()) = new;
            Ok(Some(listener))
        })
        .await
    }

    /// Stop a volume's server and its mounts in progress (unpublish, unstage).
    pub(super) fn stop_dynamic(&self, volume: &str) {
        let d = &self.inner.dynamic;
        d.servers.lock().unwrap_or_else(|p| p.into_inner()).remove(volume);
        let prefix = waiter(volume, "");
        let mut tasks = d.tasks.lock().unwrap_or_else(|p| p.into_inner());
        for (key, task) in tasks.iter().filter(|(k, _)| k.starts_with(&prefix)) {
            task.abort();
            self.inner.artifacts.forget(key);
        }
        tasks.retain(|k, _| !k.starts_with(&prefix));
    }

    /// After reconciliation at start: serve every dynamic volume's socket again, mount again
    /// what a ready mount lost, take up mounts in progress. Blocking; returns the sockets served.
    pub fn restore_dynamic(&self) -> usize {
        let mut served = 0;
        let Ok(listed) = self.inner.store.list() else { return 0 };
        for st in listed.into_iter().filter_map(|(_, st)| st.ok()) {
            let Some((target, _)) = publication(&st) else { continue };
            if let Err(e) = self.serve_socket(&st.volume_id, &target.join(SOCKET_NAME)) {
                warn!(volume.id = %st.volume_id, error = %e.message, "serving a dynamic volume's socket again");
                continue;
            }
            served += 1;
            for (id, m) in &st.dynamic {
                match m.phase {
                    MountPhase::Ready => {
                        if let Err(e) = self.apply_mount(&st, id, m.steps.clone()) {
                            warn!(volume.id = %st.volume_id, mount = %id, error = %e.message, "mounting a dynamic mount again");
                        }
                    }
                    MountPhase::Pending => self.start_mount(&st.volume_id, id),
                    MountPhase::Failed => {}
                }
            }
        }
        served
    }

    /// Wait for the volume's lock (another call on it is running) up to [`LOCK_WAIT`].
    async fn lock_volume(&self, volume: &str) -> Result<crate::volume::lock::VolumeGuard, ApiErr> {
        let deadline = tokio::time::Instant::now() + LOCK_WAIT;
        loop {
            match self.inner.locks.try_lock(volume) {
                Ok(g) => return Ok(g),
                Err(_) if tokio::time::Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(5)).await,
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
            .map(|(id, m)| view(id, m, progress.get(&waiter(volume, id)).map(|p| (p.done_bytes, p.total_bytes))))
            .collect())
    }

    /// `GET /mounts/{id}`.
    pub fn dynamic_get(&self, volume: &str, id: &str) -> Result<MountView, ApiErr> {
        api::check_id(id).map_err(|m| ApiErr::new(400, "bad_id", m))?;
        let st = self.dynamic_state(volume)?;
        let m = st.dynamic.get(id).ok_or_else(|| not_found(id))?;
        Ok(view(id, m, self.progress_of(volume, id)))
    }

    /// `POST /mounts`: the status (201 ready, 202 in progress, 200 the same request again)
    /// and the mount.
    pub async fn dynamic_create(&self, volume: &str, ask: CreateMount) -> Result<(u16, MountView), ApiErr> {
        api::check_id(&ask.id).map_err(|m| ApiErr::new(400, "bad_id", m))?;
        api::check_parameters(&ask.parameters).map_err(|m| ApiErr::new(400, "invalid_parameters", m))?;
        let id = ask.id.clone();
        {
            let _guard = self.lock_volume(volume).await?;
            let mut st = self.dynamic_state(volume)?;
            let (_, allowed) = publication(&st).expect("checked by dynamic_state");
            let plugin = ask.plugin.clone().unwrap_or_else(|| st.plugin.clone());
            if !allowed.contains(&plugin) {
                return Err(ApiErr::new(
                    403,
                    "forbidden_plugin",
                    format!(
                        "plugin {plugin:?} is not allowed for this volume (allowed: {}); the StorageClass parameter dynamicPlugins sets the list",
                        allowed.join(", ")
                    ),
                ));
            }
            if let Some(m) = st.dynamic.get(&id) {
                if m.plugin != plugin || m.parameters != ask.parameters {
                    return Err(ApiErr::new(
                        409,
                        "conflict",
                        format!("mount {id} exists with other parameters; delete it first"),
                    ));
                }
                if m.phase != MountPhase::Failed {
                    return Ok((200, view(&id, m, self.progress_of(volume, &id))));
                }
            } else if st.dynamic.len() >= MAX_MOUNTS {
                return Err(ApiErr::new(
                    409,
                    "too_many_mounts",
                    format!("the volume holds {MAX_MOUNTS} mounts, the most it may; delete one first"),
                ));
            }
            self.inner.runtime.resolve(&plugin, None).await.map_err(|e| {
                ApiErr::new(404, "unknown_plugin", format!("plugin {plugin:?} is not installed on this node: {e}"))
            })?;
            let record = DynamicMount {
                plugin,
                parameters: ask.parameters,
                phase: MountPhase::Pending,
                reason: None,
                steps: Vec::new(),
            };
            // The plugin's first plan and the policy's check answer a bad request at once, and
            // leave nothing recorded.
            let p = self.planning(&st, &id, &record).await?;
            self.plan_round(&p, volume, &record, Vec::new()).await?;
            st.dynamic.insert(id.clone(), record);
            self.inner.store.save(&st).map_err(Error::from)?;
            info!(volume.id = %volume, mount = %id, "dynamic mount accepted");
            self.start_mount(volume, &id);
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

    /// `DELETE /mounts/{id}`: unmounted, its directory and cache gone, forgotten.
    pub async fn dynamic_delete(&self, volume: &str, id: &str) -> Result<MountView, ApiErr> {
        api::check_id(id).map_err(|m| ApiErr::new(400, "bad_id", m))?;
        let _guard = self.lock_volume(volume).await?;
        let st = self.dynamic_state(volume)?;
        let m = st.dynamic.get(id).ok_or_else(|| not_found(id))?.clone();
        let key = waiter(volume, id);
        if let Some(task) = self.inner.dynamic.tasks.lock().unwrap_or_else(|p| p.into_inner()).remove(&key) {
            task.abort();
        }
        self.inner.artifacts.forget(&key);
        let (volume, id2) = (volume.to_string(), id.to_string());
        self.blocking(move |n| n.remove_mount(&volume, &id2)).await?;
        let mut v = view(id, &m, None);
        v.state = MountState::Deleted;
        v.reason = None;
        Ok(v)
    }

    /// Unmount one dynamic mount, remove its directory and cache, forget it. Blocking, with
    /// the volume's lock held.
    fn remove_mount(&self, volume: &str, id: &str) -> Result<(), Error> {
        let Some(mut st) = self.inner.store.load(volume)? else { return Ok(()) };
        let Some(target) = publication(&st).map(|(t, _)| t.clone()) else { return Ok(()) };
        let dir = target.join(MOUNTS_DIR).join(id);
        st.dynamic.remove(id);
        self.repair_mounts_dir(&target)?;
        let job = Job {
            id: volume.to_string(),
            desired: Desired::Unpublish { target: dir },
            process: None,
            secrets: Secrets::default(),
            first: None,
            keep_secrets: None,
            then: Box::new(move |_| Persist::Save(Box::new(st))),
            undo: Undo::Nothing,
        };
        self.run_job(job)?;
        self.remove_host_dirs(vec![self.dynamic_cache(volume).join(id)])?;
        info!(volume.id = %volume, mount = %id, "dynamic mount deleted");
        Ok(())
    }

    /// Start (or start again) the task that plans, pulls and mounts a recorded mount.
    fn start_mount(&self, volume: &str, id: &str) {
        let key = waiter(volume, id);
        let (this, volume, id) = (self.clone(), volume.to_string(), id.to_string());
        let task = tokio::runtime::Handle::current().spawn(async move {
            let outcome = this.mount_now(&volume, &id).await;
            this.settle(&volume, &id, outcome).await;
        });
        let old = self.inner.dynamic.tasks.lock().unwrap_or_else(|p| p.into_inner()).insert(key, task.abort_handle());
        if let Some(old) = old {
            old.abort();
        }
    }

    /// Record how a mount's task ended (unless the mount was deleted meanwhile).
    async fn settle(&self, volume: &str, id: &str, outcome: Result<(), Error>) {
        let key = waiter(volume, id);
        self.inner.artifacts.forget(&key);
        if let Err(e) = &outcome {
            warn!(volume.id = %volume, mount = %id, error = %e.message, "dynamic mount failed");
            if let Ok(_guard) = self.lock_volume(volume).await
                && let Ok(Some(mut st)) = self.inner.store.load(volume)
                && let Some(m) = st.dynamic.get_mut(id).filter(|m| m.phase == MountPhase::Pending)
            {
                m.phase = MountPhase::Failed;
                m.reason = Some(format!("{}: {}", kind_name(e.kind), e.message));
                if let Err(e) = self.inner.store.save(&st) {
                    warn!(volume.id = %volume, mount = %id, error = %e, "recording a failed dynamic mount");
                }
            }
        }
        self.inner.dynamic.tasks.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
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
        // Another plugin sees none of the volume's attributes (and they grant it nothing).
        Ok(Planning {
            plugin,
            context: if own { st.context.clone() } else { BTreeMap::new() },
            recorded: if own { kvs(&st.plan.attributes) } else { Vec::new() },
            dirs: VolumeDirs {
                staging: None,
                target: Some(target.join(MOUNTS_DIR).join(id)),
                cache: Some(self.dynamic_cache(&st.volume_id).join(id)),
                runtime: None,
            },
            ephemeral: st.ephemeral,
        })
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
            request: crate::volume::request::kvs(&m.parameters),
            subdir: String::new(),
            recorded: p.recorded.iter().cloned().chain(resolved).collect(),
        };
        let wplan = self.inner.runtime.call(&p.plugin, volume, req).await?;
        let none = Secrets::default();
        self.check(&p.plugin, Operation::DynamicMount, &p.dirs, &p.context, p.ephemeral, &none, wplan)
    }

    /// Plan, pull and mount one recorded mount.
    async fn mount_now(&self, volume: &str, id: &str) -> Result<(), Error> {
        let st = self.inner.store.load(volume)?.ok_or_else(|| Error::unavailable("the volume is gone"))?;
        let Some(m) = st.dynamic.get(id).cloned() else { return Ok(()) };
        let p = self.planning(&st, id, &m).await?;
        let mut plan = self.plan_round(&p, volume, &m, Vec::new()).await?;
        if let Some(first) = plan.steps.iter().find(|s| matches!(s, Step::Resolve { .. })).cloned() {
            let none = Secrets::default();
            let source = self.source(&first, &none)?;
            let Step::Resolve { reference, .. } = &first else { unreachable!("matched above") };
            let found =
                self.inner.artifacts.resolve(&source).await.map_err(|e| super::pull::oci_error(e, reference))?;
            let resolved = vec![
                kv(RESOLVED_REFERENCE, reference),
                kv(RESOLVED_MANIFEST_DIGEST, &found.manifest_digest),
                kv(RESOLVED_MANIFEST, &found.manifest),
                kv(RESOLVED_CONFIG, &found.config),
            ];
            plan = self.plan_round(&p, volume, &m, resolved).await?;
            if plan.steps.iter().find(|s| matches!(s, Step::Resolve { .. })) != Some(&first) {
                return Err(Error::internal(format!(
                    "plugin {} answered the resolved {reference} with a plan that does not resolve it again unchanged",
                    p.plugin.info.name
                )));
            }
            self.pull(volume, id, &source, &plan, reference).await?;
        }
        let key = waiter(volume, id);
        self.inner.artifacts.forget(&key);
        let _guard = self.lock_volume(volume).await.map_err(|e| Error::unavailable(e.message))?;
        let (volume, id) = (volume.to_string(), id.to_string());
        self.blocking(move |n| {
            // Deleted or unpublished while it was being planned: nothing to mount.
            let Some(st) = n.inner.store.load(&volume)? else { return Ok(()) };
            if st.dynamic.get(&id).is_none_or(|m| m.phase != MountPhase::Pending) || publication(&st).is_none() {
                return Ok(());
            }
            n.apply_mount(&st, &id, plan.steps)
        })
        .await
    }

    /// Wait until every blob of `plan` is in the cache and every archive unpacked.
    async fn pull(
        &self,
        volume: &str,
        id: &str,
        source: &crate::exec::oci::Source,
        plan: &Plan,
        reference: &str,
    ) -> Result<(), Error> {
        let blobs: Vec<BlobRef> = plan
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::FetchBlob { digest, size, media_type } => {
                    Some(BlobRef { digest: digest.clone(), size: *size, media_type: media_type.clone() })
                }
                _ => None,
            })
            .collect();
        let oci = |e| super::pull::oci_error(e, reference);
        self.inner.artifacts.authorize(source, &blobs).await.map_err(oci)?;
        let key = waiter(volume, id);
        loop {
            match self.inner.artifacts.ensure(&key, source, &blobs) {
                Ensure::Ready => break,
                Ensure::Pulling(_) => tokio::time::sleep(PULL_TICK).await,
                Ensure::Failed(e) => return Err(oci(e)),
            }
        }
        for step in &plan.steps {
            if let Step::Unpack { digest, format, .. } = step {
                loop {
                    match self.inner.artifacts.prepare(digest, *format) {
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
        let unchanged = next == *st;
        let job = Job {
            id: st.volume_id.clone(),
            desired: Desired::Dynamic {
                target: Root { path: mounts.join(id), below: mounts },
                cache: Root { path: cache.join(id), below: cache },
                steps,
            },
            process: None,
            secrets: Secrets::default(),
            first: None,
            keep_secrets: None,
            then: Box::new(move |_| if unchanged { Persist::Keep } else { Persist::Save(Box::new(next)) }),
            undo: Undo::Nothing,
        };
        self.run_job(job)?;
        info!(volume.id = %st.volume_id, mount = %id, "dynamic mount ready");
        Ok(())
    }
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
    }
}
