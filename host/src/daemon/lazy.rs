//! Lazy volumes on the daemon's side (`lazy: "true"`, docs/lazy.md).
//!
//! - At stage ([`Node::lazy_stage_plan`]): the checked plan is lowered into the host's lazy
//!   FUSE server ([`crate::plan::lazy`]), the blobs are authorized, every layer's file table is
//!   read (headers only, [`crate::oci::BlobTable`]), and the stage answers without waiting for
//!   data.
//! - When the pipeline starts the server, the executor hands it the opening
//!   ([`Node::lazy_opening`]): the table, the layers' descriptors and what is readable now.
//! - A session per volume ([`Node::lazy_attach`]) then runs for as long as the volume is
//!   staged, across restarts of the server (healed) and of this daemon (re-adopted): it connects
//!   to the server, forwards the ranges its readers wait for to the cache's downloads, fills
//!   the layers in order in the background, tells the server what became readable, registers
//!   complete files for passthrough, and records the progress and any failure.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tracing::{error, info, warn};

use super::Node;
use crate::error::Error;
use crate::exec::artifacts::Prepared;
use crate::exec::lazy::{Link, Opening};
use crate::oci::{BlobRef, BlobTable, ChunkIndex, Source, TableKind};
use crate::plan::{Archive, Lazy, Plan, Step};
use crate::unpriv::lazy_wire::{self, FileEntry, Hello, LayerState, Span, ToHost, ToServer};
use crate::volume::state::{MountPhase, Phase};

mod image;

/// A lazy volume's progress and state, as the host API, the CLI, a dynamic mount's view and the
/// metrics show it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LazyStatus {
    /// Bytes of all its layers.
    pub total_bytes: u64,
    /// Bytes known good: complete blobs, and with a chunk index the chunks that matched it.
    pub verified_bytes: u64,
    /// Bytes on the node (verified or not).
    pub present_bytes: u64,
    /// Requests made for its readers (ahead of the fill), and their bytes.
    pub demand_requests: u64,
    pub demand_bytes: u64,
    /// Bytes the background fill fetched.
    pub fill_bytes: u64,
    /// Layers, and those complete.
    pub layers: u32,
    pub layers_complete: u32,
    /// Compressed layers whose files appear only once they are fetched and unpacked.
    pub layers_pending: u32,
    /// Files the kernel now reads without the server (passthrough).
    pub passthrough_files: u32,
    /// The artifact has a chunk index: every chunk is checked before a reader gets it.
    pub indexed: bool,
    /// The server is connected to this daemon.
    pub connected: bool,
    /// Why the volume failed (a blob that does not match its digest): every read fails.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
    /// Why the fill does not go on now (the registry unreachable, the disk full); reads of what
    /// is on the node keep working.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stalled: Option<String>,
}

/// The daemon's lazy sessions.
#[derive(Default)]
pub(super) struct Lazies {
    sessions: Mutex<HashMap<String, SessionHandle>>,
}

struct SessionHandle {
    stop: tokio::sync::watch::Sender<bool>,
    status: Arc<Mutex<LazyStatus>>,
}

/// One layer as a session tracks it.
#[derive(Debug, Clone)]
pub(super) struct LayerCtx {
    blob: BlobRef,
    format: Archive,
    dest: String,
    /// Its files: (path in the filesystem, path in the layer).
    files: Vec<(String, String)>,
    /// Its files are still to come (a compressed layer not unpacked yet).
    pending: bool,
    /// What the server was told.
    sent_complete: bool,
    sent_readable: Vec<Span>,
    sent_bad: Vec<Span>,
    /// Files registered for passthrough.
    backing: u32,
}

/// How often a session looks again without a change (a tree being unpacked, a fill to start
/// again after a transient failure).
const TICK: Duration = Duration::from_secs(1);
/// How long a session waits before connecting again to a server that is not there.
const RECONNECT: Duration = Duration::from_millis(250);
/// What one table entry takes in the server's opening besides its path (a bound: kind, size,
/// where its bytes are, time, JSON).
const ENTRY_BYTES: usize = 160;
/// A server's messages waiting for its session, at most.
const NEEDS_QUEUED: usize = 256;
/// The shortest time between two updates of a session (a stat of each layer's blob, and what
/// the server is told).
const UPDATE_EVERY: Duration = Duration::from_millis(5);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The blob of a lazy layer.
fn blob_of(l: &crate::plan::LazyLayer) -> BlobRef {
    BlobRef { digest: l.digest.clone(), size: l.size, media_type: l.media_type.clone() }
}

/// `rel` below `dest` in the filesystem.
fn join(dest: &str, rel: &str) -> String {
    match (dest.is_empty(), rel.is_empty()) {
        (true, _) => rel.to_string(),
        (false, true) => dest.to_string(),
        (false, false) => format!("{dest}/{rel}"),
    }
}

/// The table entries of one layer, and its files (path in the filesystem, path in the layer).
fn entries_of(layer: u32, dest: &str, format: Archive, table: &BlobTable) -> (Vec<FileEntry>, Vec<(String, String)>) {
    let mut entries = Vec::with_capacity(table.entries.len());
    let mut files = Vec::new();
    for e in &table.entries {
        if let TableKind::File { .. } = e.kind {
            files.push((join(dest, &e.path), e.path.clone()));
        }
        let kind = image::wire_kind(layer, format, e);
        let (path, owner) = (join(dest, &e.path), e.owner);
        entries.push(FileEntry { path, kind, mtime: e.mtime, owner, open: false, inode: None });
    }
    (entries, files)
}

/// Are these layers a container image's (any of them an image layer)? Then the server gets
/// them merged ([`image::image_files`]).
fn is_image(media_types: impl IntoIterator<Item = impl AsRef<str>>) -> bool {
    media_types.into_iter().any(|m| crate::plan::tar_rules::image_layer(m.as_ref()))
}

/// Which chunk index a lazy plan uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IndexChoice {
    /// The manifest's first, looked up as a referrer (none: chunks are not checked).
    Lookup,
    /// This one (digest, size): the volume's pinned index, or the one its signature policy
    /// verified.
    Use(String, u64),
}

impl Node {
    /// The stage plan of a lazy volume: `plan` (checked, its artifact resolved to
    /// `manifest_digest`) lowered into the host's lazy server, its blobs authorized for
    /// `source`, every layer's file table read (from the node, else from the registry's
    /// headers), and the chunk index `index` chooses (the manifest's, found when it has one, or
    /// the one given). Returns without
    /// waiting for any data; the caller registers the blobs as in use ([`Node::lazy_register`])
    /// once the plan is its volume's or mount's.
    /// `key` is the volume's id, or a dynamic mount's waiter key (its session's name); `control`
    /// the name of its server's control socket.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn lazy_plan(
        &self,
        key: &str,
        plan: Plan,
        source: &Source,
        reference: &str,
        manifest_digest: &str,
        index: IndexChoice,
        control: String,
        admit: &(dyn Fn(u64) -> Result<(), Error> + Sync),
    ) -> Result<Plan, Error> {
        let id = key.replace('\n', "/mounts/");
        let mut plan = crate::plan::lazy::lower(plan, &self.inner.config.lazy.server)
            .map_err(|e| Error::invalid(format!("{id}: {} is \"true\", but {e}", crate::volume::request::LAZY_KEY)))?;
        let lazy = crate::plan::lazy::layers(&plan).cloned().expect("lowered");
        let blobs: Vec<BlobRef> = lazy.layers.iter().map(blob_of).collect();
        let artifacts = &self.inner.artifacts;
        let oci = |e| super::pull::oci_error(e, reference);
        // What the manifest and its index's say is fetched, judged before any of it is.
        let found = match index {
            IndexChoice::Lookup => artifacts.index_descriptor(source, manifest_digest).await.map_err(oci)?,
            IndexChoice::Use(digest, size) => Some((digest, size)),
        };
        admit(found.as_ref().map_or(0, |(_, size)| *size))?;
        artifacts.authorize(source, &blobs).await.map_err(oci)?;
        let index = match found {
            Some((digest, size)) => {
                artifacts.fetch_index(source, manifest_digest, &digest, size, &blobs).await.map_err(oci)?;
                Some(digest)
            }
            None => None,
        };
        // The whole table goes to the server in one frame: a model of more files than fit is
        // refused here, not at the server's start.
        let mut table_bytes = 0usize;
        for l in &lazy.layers {
            let table = artifacts
                .lazy_table(source, &blob_of(l), l.format)
                .await
                .map_err(|e| super::pull::oci_error(e, reference))?;
            let entries = table.iter().flat_map(|t| t.entries.iter());
            table_bytes += entries.map(|e| 2 * (l.dest.len() + e.path.len()) + ENTRY_BYTES).sum::<usize>();
        }
        if table_bytes > lazy_wire::MAX_FRAME / 2 {
            return Err(Error::invalid(format!(
                "{id}: {} is \"true\", but the model has more files than a lazy volume serves (its table would take about {} MiB, at most {} MiB)",
                crate::volume::request::LAZY_KEY,
                table_bytes >> 20,
                lazy_wire::MAX_FRAME >> 21
            )));
        }
        if let Some(digest) = &index {
            info!(volume.id = %id, index = %digest, "the model has a chunk index: every chunk is checked before it is read");
        }
        for step in &mut plan.steps {
            if let Step::SpawnFuse { lazy: Some(l), .. } = step {
                l.index = index.clone();
                l.control = control.clone();
            }
        }
        Ok(plan)
    }

    /// Register the blobs lazy `plan` reads as in use by `key` (a volume's id, or a dynamic
    /// mount's waiter key): the cache keeps them, and their downloads run for it.
    pub(super) fn lazy_register(&self, key: &str, plan: &Plan) {
        if let Some(lazy) = crate::plan::lazy::layers(plan) {
            let blobs: Vec<BlobRef> = lazy.layers.iter().map(blob_of).collect();
            self.inner.artifacts.lazy_register(key, &blobs);
        }
    }

    /// What the server of volume `id` (serving `lazy`) is told first: its table, its layers'
    /// descriptors and what is readable now. Blocking. Fails when a tar layer's table is not on
    /// the node (a restarted server's volume whose cache was emptied).
    pub(super) fn lazy_opening(&self, id: &str, lazy: &Lazy) -> Result<(Opening, Vec<LayerCtx>), Error> {
        let artifacts = &self.inner.artifacts;
        // With a chunk index, only the chunks that matched it are readable from the start.
        let index = match &lazy.index {
            Some(digest) => {
                let blobs: Vec<BlobRef> = lazy.layers.iter().map(blob_of).collect();
                artifacts.load_index(digest, &blobs).map_err(|e| e.into_error(digest))?
            }
            None => HashMap::new(),
        };
        let mut files = Vec::new();
        let mut layers = Vec::new();
        let mut states = Vec::new();
        let mut entries: Vec<FileEntry> = Vec::new();
        let image = is_image(lazy.layers.iter().map(|l| &l.media_type));
        let mut tables = Vec::new();
        let mut failed = None;
        for (i, l) in lazy.layers.iter().enumerate() {
            let i = i as u32;
            let blob = blob_of(l);
            let table = artifacts.lazy_stored_table(&blob, l.format);
            let pending = table.is_none() && matches!(l.format, Archive::TarGzip | Archive::TarZstd);
            let (mut layer_entries, layer_files) = match &table {
                Some(t) => entries_of(i, &l.dest, l.format, t),
                None if pending => (Vec::new(), Vec::new()),
                None => {
                    return Err(Error::unavailable(format!(
                        "volume {id}: the file table of layer {} is not on the node; stage the volume again",
                        l.digest
                    )));
                }
            };
            entries.append(&mut layer_entries);
            tables.push(table);
            let view = artifacts.lazy_view(&blob, index.get(&l.digest));
            if let Some(e) = &view.failed {
                failed.get_or_insert_with(|| format!("layer {} failed verification: {e}", l.digest));
            }
            match l.format {
                Archive::TarGzip | Archive::TarZstd if !pending => {
                    let dir = artifacts
                        .lazy_open_tree(&blob)
                        .map_err(|e| super::pipeline::io_error(e, &PathBuf::from(&l.digest)))?;
                    files.push((i, dir));
                }
                Archive::TarGzip | Archive::TarZstd => {}
                Archive::Raw | Archive::Tar => {
                    let f = artifacts
                        .lazy_open(&blob)
                        .map_err(|e| super::pipeline::io_error(e, &PathBuf::from(&l.digest)))?;
                    files.push((i, f));
                }
            }
            let compressed_done = matches!(l.format, Archive::TarGzip | Archive::TarZstd) && !pending;
            states.push(LayerState {
                size: l.size,
                readable: view.readable.clone(),
                bad: view.bad.clone(),
                complete: compressed_done,
                pending: pending.then(|| l.dest.clone()),
                image: crate::plan::tar_rules::image_layer(&l.media_type),
            });
            layers.push(LayerCtx {
                blob,
                format: l.format,
                dest: l.dest.clone(),
                files: layer_files,
                pending,
                // An image's unpacked layer is finished again (its files registered for
                // passthrough with this server): the server may not open a file of the tree
                // its owner's mode keeps from it.
                sent_complete: compressed_done && !image,
                sent_readable: view.readable,
                sent_bad: view.bad,
                backing: 0,
            });
        }
        if image {
            let shape: Vec<(Archive, &str)> = lazy.layers.iter().map(|l| (l.format, l.dest.as_str())).collect();
            entries = image::image_files(&shape, &tables);
        }
        let hello = Hello {
            volume: id.to_string(),
            files: entries,
            layers: states,
            read_wait_ms: self.inner.config.lazy.read_wait.as_millis() as u64,
            chunk: self.inner.config.lazy.chunk_bytes,
            failed,
        };
        Ok((Opening { hello, files }, layers))
    }

    /// Make sure volume `id` has its lazy session (after a stage, at start, from the sweep).
    pub(super) fn lazy_attach(&self, id: &str) {
        let mut sessions = lock(&self.inner.lazies.sessions);
        if sessions.contains_key(id) {
            return;
        }
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let status = Arc::new(Mutex::new(LazyStatus::default()));
        sessions.insert(id.to_string(), SessionHandle { stop, status: status.clone() });
        let (node, id) = (self.clone(), id.to_string());
        tokio::spawn(async move {
            node.lazy_session(&id, status.clone(), stopped).await;
            // Only this session's entry: a new session of the same key (a quick restage) may
            // have taken its place.
            let mut sessions = lock(&node.inner.lazies.sessions);
            if sessions.get(&id).is_some_and(|s| Arc::ptr_eq(&s.status, &status)) {
                sessions.remove(&id);
            }
        });
    }

    /// Stop the sessions whose key starts with `prefix` (a dynamic volume's mounts, unpublish).
    pub(super) fn lazy_detach_prefix(&self, prefix: &str) {
        let keys: Vec<String> =
            lock(&self.inner.lazies.sessions).keys().filter(|k| k.starts_with(prefix)).cloned().collect();
        for k in keys {
            self.lazy_detach(&k);
        }
    }

    /// Stop volume `id`'s session (unstage).
    pub(super) fn lazy_detach(&self, id: &str) {
        if let Some(s) = lock(&self.inner.lazies.sessions).remove(id) {
            let _ = s.stop.send(true);
        }
        crate::metrics::global().lazy_volume_gone(&label(id));
    }

    /// Does session `key` run?
    pub(super) fn lazy_attached(&self, key: &str) -> bool {
        lock(&self.inner.lazies.sessions).contains_key(key)
    }

    /// Volume `id`'s lazy status, if it is a lazy volume with a session.
    pub fn lazy_status(&self, id: &str) -> Option<LazyStatus> {
        lock(&self.inner.lazies.sessions).get(id).map(|s| lock(&s.status).clone())
    }

    /// Every lazy volume's status.
    pub fn lazy_statuses(&self) -> Vec<(String, LazyStatus)> {
        lock(&self.inner.lazies.sessions).iter().map(|(id, s)| (id.clone(), lock(&s.status).clone())).collect()
    }

    /// Give every staged lazy volume, and every ready lazy dynamic mount, a session (the
    /// supervisor calls it). Blocking.
    pub(super) fn lazy_sweep(&self) {
        let Ok(records) = self.inner.store.all() else { return };
        for st in records.into_iter().filter(|st| st.phase == Phase::Staged) {
            if crate::plan::lazy::layers(&st.plan).is_some() {
                self.lazy_attach(&st.volume_id);
            }
            for (id, m) in &st.dynamic {
                if m.phase == MountPhase::Ready && crate::plan::lazy::layers_of(&m.steps).is_some() {
                    self.lazy_attach(&super::dynamic::waiter(&st.volume_id, id));
                }
            }
        }
    }

    /// The session of volume `id`, until `stopped` (unstage) or the volume is gone.
    async fn lazy_session(
        &self,
        id: &str,
        status: Arc<Mutex<LazyStatus>>,
        mut stopped: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut warned = false;
        let mut kept = Kept::default();
        loop {
            if *stopped.borrow() {
                return;
            }
            match self.lazy_connect(id, &mut kept).await {
                Ok(Some(conn)) => {
                    warned = false;
                    if self.lazy_converse(id, conn, &status, &mut stopped, &mut kept).await {
                        return;
                    }
                }
                Ok(None) => return,
                Err(e) => {
                    if !warned {
                        warn!(volume.id = %id, error = %e.message, "the lazy server is not reachable yet; trying again");
                        warned = true;
                    }
                }
            }
            lock(&status).connected = false;
            tokio::select! {
                _ = tokio::time::sleep(RECONNECT) => {}
                _ = stopped.changed() => return,
            }
        }
    }

    /// Connect to the server of session `key` (a volume's id, or a dynamic mount's
    /// [`super::dynamic::waiter`]) and send its opening; `None` when it is no staged lazy volume or ready
    /// lazy mount any more. A dynamic mount's dead server is started again here (a volume's,
    /// by the supervisor).
    async fn lazy_connect(&self, key: &str, kept: &mut Kept) -> Result<Option<Connected>, Error> {
        let (volume, mount) = match key.split_once('\n') {
            Some((v, m)) => (v, Some(m)),
            None => (key, None),
        };
        let Some(st) = self.inner.store.load(volume)? else { return Ok(None) };
        if st.phase == Phase::Unstaging {
            return Ok(None);
        }
        let (steps, process) = match mount {
            None => (st.plan.steps.clone(), st.process),
            Some(m) => match st.dynamic.get(m).filter(|d| d.phase == MountPhase::Ready) {
                Some(d) => (d.steps.clone(), d.process),
                None => return Ok(None),
            },
        };
        let Some(lazy) = crate::plan::lazy::layers_of(&steps).cloned() else { return Ok(None) };
        let Some(process) = process.filter(|p| self.inner.exec.is_alive(p)) else {
            if let Some(m) = mount {
                if !kept.heal.due() {
                    return Err(Error::unavailable("its server died again; it is started again after a pause"));
                }
                let (v, m) = (volume.to_string(), m.to_string());
                let _guard = self.inner.locks.try_lock(&v)?;
                self.blocking(move |n| n.heal_mount_locked(&v, &m)).await?;
                return Err(Error::unavailable("its server was started again"));
            }
            return Err(Error::unavailable("its server is not running (the supervisor restarts it)"));
        };
        let id = volume;
        let resolve = steps.iter().find(|s| matches!(s, Step::Resolve { .. })).cloned();
        // A volume with the secrets kept for it; a dynamic mount with its volume's kept
        // credentials, for the registries its StorageClass names (dynamic/credentials.rs).
        let source = match (&resolve, mount) {
            (None, _) => return Err(Error::internal("a lazy volume's plan has no resolve step")),
            (Some(r), None) => {
                let secrets: crate::secrets::Secrets = self.inner.store.load_secrets(id)?.into_iter().collect();
                self.source(r, &secrets)?
            }
            (Some(r), Some(m)) => {
                let plugin = st.dynamic.get(m).map(|d| d.plugin.clone()).unwrap_or_default();
                self.dynamic_mount_source(&st, &plugin, r).await?
            }
        };
        let blobs: Vec<BlobRef> = lazy.layers.iter().map(blob_of).collect();
        // Its blobs are in use, and readable, for as long as it is staged (a restarted daemon
        // registers them here).
        self.inner.artifacts.lazy_register(key, &blobs);
        if !self.lazy_attached(key) {
            // Stopped meanwhile (an unstage, a delete): what was just registered goes again.
            self.inner.artifacts.forget(key);
            return Ok(None);
        }
        let index = match &lazy.index {
            Some(digest) => self.inner.artifacts.load_index(digest, &blobs).map_err(|e| e.into_error(digest))?,
            None => HashMap::new(),
        };
        let socket = self.dirs(id, None, None).runtime.expect("a volume has a runtime dir").join(&lazy.control);
        let id2 = id.to_string();
        let conn = self
            .blocking(move |n| {
                let conn = n.inner.exec.connect(&socket).map_err(|e| super::pipeline::io_error(e, &socket))?;
                let (opening, layers) = n.lazy_opening(&id2, &lazy)?;
                conn.set_read_timeout(Some(Duration::from_secs(10)))
                    .map_err(|e| super::pipeline::io_error(e, &socket))?;
                opening
                    .send(&conn)
                    .map_err(|e| Error::unavailable(format!("the lazy server did not take the opening: {e}")))?;
                let link = Link::new(conn).map_err(|e| super::pipeline::io_error(e, &socket))?;
                Ok((link, layers))
            })
            .await?;
        let (link, layers) = conn;
        if kept.backed.as_ref().is_some_and(|(p, _)| *p != process) {
            kept.backed = None;
        }
        Ok(Some(Connected { link, layers, source, process, index, broken: false }))
    }

    /// Run one conversation until the connection ends (false) or the session is stopped (true).
    async fn lazy_converse(
        &self,
        id: &str,
        mut c: Connected,
        status: &Arc<Mutex<LazyStatus>>,
        stopped: &mut tokio::sync::watch::Receiver<bool>,
        kept: &mut Kept,
    ) -> bool {
        // Bounded: a server that asks faster than the session answers waits to send.
        let (tx, mut rx) = tokio::sync::mpsc::channel(NEEDS_QUEUED);
        if let Err(e) = c.link.read_on_thread(move |m| {
            let _ = tx.blocking_send(m);
        }) {
            warn!(volume.id = %id, error = %e, "reading the lazy server's messages");
            return false;
        }
        info!(volume.id = %id, layers = c.layers.len(), "connected to the lazy server");
        let mut changes = self.inner.artifacts.lazy_changes();
        let mut tick = tokio::time::interval(TICK);
        let mut failed_sent = false;
        let mut updated = std::time::Instant::now() - UPDATE_EVERY;
        loop {
            // At most every few milliseconds however fast the server asks (a reader's wish is
            // handed to the cache at once, below).
            if updated.elapsed() >= UPDATE_EVERY {
                self.lazy_update(id, &mut c, status, &mut failed_sent, kept).await;
                updated = std::time::Instant::now();
            }
            if c.broken {
                info!(volume.id = %id, "the lazy server did not take a message: connecting again");
                c.link.close();
                return false;
            }
            tokio::select! {
                m = rx.recv() => match m {
                    Some(Some(ToHost::Need { layer, start, end, urgent })) => {
                        if let Some(l) = c.layers.get(layer as usize) {
                            let index = c.index.get(&l.blob.digest).cloned();
                            if let Err(e) = self.inner.artifacts.lazy_want(id, &c.source, &l.blob, start, end, urgent, index) {
                                warn!(volume.id = %id, digest = %l.blob.digest, error = %e, "a reader's range could not be asked for");
                            }
                        }
                    }
                    Some(Some(ToHost::Ready { .. })) => {}
                    Some(None) | None => {
                        info!(volume.id = %id, "the lazy server's connection ended");
                        return false;
                    }
                },
                r = changes.changed() => {
                    if r.is_err() {
                        return false;
                    }
                    // Changes come with every write: a short pause gathers them.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                _ = tick.tick() => {}
                _ = stopped.changed() => {
                    c.link.close();
                    return true;
                }
            }
        }
    }

    /// Tell the server what changed, advance the fill, finish complete layers, and record the
    /// status.
    async fn lazy_update(
        &self,
        id: &str,
        c: &mut Connected,
        status: &Arc<Mutex<LazyStatus>>,
        failed_sent: &mut bool,
        kept: &mut Kept,
    ) {
        let artifacts = self.inner.artifacts.clone();
        let mut s = LazyStatus {
            layers: c.layers.len() as u32,
            indexed: !c.index.is_empty(),
            connected: true,
            ..Default::default()
        };
        let mut fill_next = true;
        for i in 0..c.layers.len() {
            let l = c.layers[i].clone();
            let view = artifacts.lazy_view(&l.blob, c.index.get(&l.blob.digest));
            s.total_bytes += l.blob.size;
            s.verified_bytes += view.verified;
            s.present_bytes += view.present;
            s.demand_requests += view.demand_requests;
            s.demand_bytes += view.demand_bytes;
            s.fill_bytes += view.fill_bytes;
            s.passthrough_files += l.backing;
            if let Some(e) = &view.failed {
                let reason = format!("layer {} failed verification: {e}", l.blob.digest);
                if !*failed_sent {
                    error!(volume.id = %id, digest = %l.blob.digest, error = %e, "a lazy volume's blob does not match its digest: every read of the volume fails from now on, and the blob is dropped from the cache");
                    *failed_sent = self.tell(c, ToServer::Failed { reason: reason.clone() }, Vec::new()).await;
                }
                s.failed.get_or_insert(reason);
                continue;
            }
            if let Some(why) = &view.stalled {
                s.stalled.get_or_insert_with(|| format!("the fill of layer {} stopped: {why}", l.blob.digest));
            }
            if view.complete && !l.sent_complete {
                // The blob matched its digest: ranges an index disagreed with read now, also
                // while a tar layer is still being unpacked (before `Complete` is sent).
                if !l.sent_bad.is_empty()
                    && self.tell(c, ToServer::Bad { layer: i as u32, ranges: Vec::new() }, Vec::new()).await
                {
                    c.layers[i].sent_bad.clear();
                }
                match self.lazy_finish(id, c, i, kept).await {
                    Ok(Finish::Done) => {}
                    Ok(Finish::Later(why)) => {
                        fill_next = false;
                        if let Some(why) = why {
                            s.stalled.get_or_insert_with(|| format!("layer {}: {why}", l.blob.digest));
                        }
                    }
                    Ok(Finish::Failed(why)) => {
                        let reason = format!("layer {}: {why}", l.blob.digest);
                        if !*failed_sent {
                            error!(volume.id = %id, reason, "a lazy volume's layer failed its check: every read fails from now on");
                            *failed_sent = self.tell(c, ToServer::Failed { reason: reason.clone() }, Vec::new()).await;
                        }
                        s.failed.get_or_insert(reason);
                    }
                    // A passing failure (an I/O error, the server not taking a message): tried
                    // again at the next update.
                    Err(e) => {
                        fill_next = false;
                        warn!(volume.id = %id, digest = %l.blob.digest, error = %e.message, "finishing a complete lazy layer failed; trying again");
                        s.stalled.get_or_insert_with(|| format!("layer {}: {}", l.blob.digest, e.message));
                    }
                }
            } else if !view.complete {
                if view.readable != l.sent_readable {
                    let msg = ToServer::Readable { layer: i as u32, ranges: view.readable.clone() };
                    if self.tell(c, msg, Vec::new()).await {
                        c.layers[i].sent_readable = view.readable.clone();
                    }
                }
                if view.bad != l.sent_bad {
                    let msg = ToServer::Bad { layer: i as u32, ranges: view.bad.clone() };
                    if self.tell(c, msg, Vec::new()).await {
                        c.layers[i].sent_bad = view.bad.clone();
                    }
                }
                // The background fill: one layer at a time, in order.
                if fill_next {
                    fill_next = false;
                    let index = c.index.get(&l.blob.digest).cloned();
                    if let Err(e) = artifacts.lazy_start(id, &c.source, &l.blob, true, false, index) {
                        s.stalled
                            .get_or_insert_with(|| format!("the fill of layer {} cannot start: {e}", l.blob.digest));
                    }
                }
            }
            if c.layers[i].sent_complete {
                s.layers_complete += 1;
            }
            if c.layers[i].pending {
                s.layers_pending += 1;
            }
        }
        if s.failed.is_some() {
            s.stalled = None;
        }
        crate::metrics::global().lazy_volume(
            &label(id),
            &crate::metrics::LazyVolume {
                total_bytes: s.total_bytes,
                verified_bytes: s.verified_bytes,
                present_bytes: s.present_bytes,
                demand_requests: s.demand_requests,
                demand_bytes: s.demand_bytes,
                fill_bytes: s.fill_bytes,
                passthrough_files: u64::from(s.passthrough_files),
                failed: s.failed.is_some(),
                stalled: s.stalled.is_some(),
            },
        );
        *lock(status) = s;
    }

    /// Send `msg` (with `files`) to the server off the async workers; false (and the
    /// conversation marked broken) when the server did not take it.
    async fn tell(&self, c: &mut Connected, msg: ToServer, files: Vec<crate::exec::lazy::Handed>) -> bool {
        if c.broken {
            return false;
        }
        let ok = c.link.send_later(msg, files).await.is_ok();
        c.broken |= !ok;
        ok
    }

    /// Layer `i` of `c` is complete and verified: check its table (a tar layer's was read from
    /// a registry's ranges), unpack what needs it, register its files for passthrough and tell
    /// the server. [`Finish::Later`]: not done yet (an unpack runs, or the disk is full), try
    /// again later.
    async fn lazy_finish(&self, id: &str, c: &mut Connected, i: usize, kept: &mut Kept) -> Result<Finish, Error> {
        let l = c.layers[i].clone();
        let artifacts = self.inner.artifacts.clone();
        if l.format == Archive::Tar {
            match artifacts.lazy_check_table(&l.blob).await {
                Ok(()) => {}
                Err(e) if e.is_integrity() => return Ok(Finish::Failed(e.to_string())),
                Err(e) => return Err(e.into_error(&l.blob.digest)),
            }
        }
        if l.format != Archive::Raw {
            match self.inner.assembler.prepare(
                &l.blob.digest,
                l.format,
                crate::plan::tar_rules::Layering::of(&l.blob.media_type),
            ) {
                Prepared::Ready => {}
                Prepared::Working => return Ok(Finish::Later(None)),
                // Without its tree, a tar layer is served from the blob as before (no
                // passthrough); a compressed layer stays pending and is tried again when the
                // disk had no room, and fails the volume when its archive is refused.
                Prepared::Failed(e) => {
                    if l.format == Archive::Tar {
                        warn!(volume.id = %id, digest = %l.blob.digest, error = %e, "unpacking a complete layer failed; its files stay served by the lazy server");
                        if !self.tell(c, ToServer::Complete { layer: i as u32, backing: Vec::new() }, Vec::new()).await
                        {
                            return Err(Error::unavailable("the lazy server did not take a message"));
                        }
                        c.layers[i].sent_complete = true;
                        return Ok(Finish::Done);
                    }
                    if matches!(e, crate::oci::OciError::DiskFull { .. }) {
                        return Ok(Finish::Later(Some(e.to_string())));
                    }
                    // An archive the unpack refuses can never be served.
                    if e.is_integrity()
                        || matches!(&e, crate::oci::OciError::Local { kind, .. } if *kind == std::io::ErrorKind::InvalidData)
                    {
                        return Ok(Finish::Failed(e.to_string()));
                    }
                    return Err(e.into_error(&l.blob.digest));
                }
            }
        }
        let mut layer = l.clone();
        let image = is_image(c.layers.iter().map(|l| &l.blob.media_type));
        let mut added = None;
        if l.pending {
            // A compressed layer's files, now that it is unpacked.
            let table = artifacts
                .lazy_table(&c.source, &l.blob, l.format)
                .await
                .map_err(|e| e.into_error(&l.blob.digest))?
                .ok_or_else(|| Error::internal(format!("layer {} is unpacked but has no tree", l.blob.digest)))?;
            let (mut entries, files) = entries_of(i as u32, &l.dest, l.format, &table);
            if image {
                entries = self.lazy_image_files(c, i, table).await?;
            }
            let blob = l.blob.clone();
            let dir = self
                .blocking(move |n| {
                    n.inner
                        .artifacts
                        .lazy_open_tree(&blob)
                        .map_err(|e| super::pipeline::io_error(e, &PathBuf::from(&blob.digest)))
                })
                .await?;
            let msg = ToServer::Added { layer: i as u32, files: entries };
            if !self.tell(c, ToServer::Files { layers: vec![i as u32] }, vec![dir]).await
                || (!image && !self.tell(c, msg.clone(), Vec::new()).await)
            {
                return Err(Error::unavailable(format!("telling the lazy server of layer {}", l.blob.digest)));
            }
            // An image's files join once their backing ids are there (below): the server may
            // not be able to open a file of the unpacked tree itself (its owner's mode).
            added = image.then_some(msg);
            layer.files = files;
            layer.pending = false;
        }
        // Passthrough: each complete file registered as its own backing file, once per server
        // process (a reconnection to the same process sends the same ids again).
        let process = c.process;
        let (blob, format) = (l.blob.clone(), l.format);
        let wanted: Vec<(u32, String)> =
            layer.files.iter().enumerate().map(|(k, (_, rel))| (k as u32, rel.clone())).collect();
        let paths: Vec<String> = layer.files.iter().map(|(p, _)| p.clone()).collect();
        let before = kept.backed.as_ref().filter(|(p, _)| *p == process).and_then(|(_, b)| b.get(&(i as u32))).cloned();
        let backing = match before {
            Some(ids) => ids,
            None => self
            .blocking(move |n| {
                let files = n.inner.artifacts.lazy_backing_files(&blob, format, &wanted);
                let refs: Vec<_> = files.iter().map(|(_, f)| f).collect();
                Ok(match n.inner.exec.backing_open(&process, &refs) {
                    Ok(ids) => {
                        files.iter().map(|(k, _)| paths[*k as usize].clone()).zip(ids).collect::<Vec<(String, u32)>>()
                    }
                    Err(e) => {
                        info!(error = %e, "passthrough is not available for this server; its files stay served by it");
                        Vec::new()
                    }
                })
            })
            .await?,
        };
        kept.backed.get_or_insert_with(|| (process, HashMap::new())).1.insert(i as u32, backing.clone());
        layer.backing = backing.len() as u32;
        if !self.tell(c, ToServer::Complete { layer: i as u32, backing }, Vec::new()).await {
            return Err(Error::unavailable(format!("telling the lazy server of layer {}", l.blob.digest)));
        }
        if let Some(msg) = added
            && !self.tell(c, msg, Vec::new()).await
        {
            return Err(Error::unavailable(format!("telling the lazy server of layer {}", l.blob.digest)));
        }
        layer.sent_complete = true;
        info!(volume.id = %id, digest = %l.blob.digest, passthrough = layer.backing, "a lazy layer is complete and verified");
        c.layers[i] = layer;
        Ok(Finish::Done)
    }
}

impl Node {
    /// The merged table of an image's layers in `c` now that its pending layer `i` is known
    /// (`table`): the others' tables as kept on the node, those still pending unknown (what is
    /// below them is not served yet). The tables are read off the runtime.
    async fn lazy_image_files(&self, c: &Connected, i: usize, table: BlobTable) -> Result<Vec<FileEntry>, Error> {
        let layers: Vec<(BlobRef, Archive, String, bool)> =
            c.layers.iter().map(|l| (l.blob.clone(), l.format, l.dest.clone(), l.pending)).collect();
        self.blocking(move |n| {
            let mut table = Some(table);
            let tables: Vec<Option<BlobTable>> = layers
                .iter()
                .enumerate()
                .map(|(k, (blob, format, _, pending))| match k == i {
                    true => table.take(),
                    false if *pending => None,
                    false => n.inner.artifacts.lazy_stored_table(blob, *format),
                })
                .collect();
            let shape: Vec<(Archive, &str)> = layers.iter().map(|(_, f, d, _)| (*f, d.as_str())).collect();
            Ok(image::image_files(&shape, &tables))
        })
        .await
    }
}

/// How far finishing a complete layer got.
enum Finish {
    Done,
    /// Not yet: an unpack runs, or (with the reason) the disk had no room for it.
    Later(Option<String>),
    /// Never: the layer's bytes are not what they should be (its table or archive); the
    /// volume fails.
    Failed(String),
}

/// A session's open conversation.
struct Connected {
    link: Link,
    layers: Vec<LayerCtx>,
    source: Source,
    process: crate::exec::process::ProcessId,
    /// Chunk indexes by blob digest.
    index: HashMap<String, Arc<ChunkIndex>>,
    /// A message could not be sent: the conversation ends (the stream may be out of step).
    broken: bool,
}

/// What a session keeps across its conversations with one server process: the backing ids it
/// registered on that server's connection, by layer (registered once per process: ids live
/// as long as the connection, and registering again on each reconnection would pile up
/// kernel references), and when it may start a dead dynamic mount's server again.
#[derive(Default)]
struct Kept {
    backed: Option<(crate::exec::process::ProcessId, Backed)>,
    heal: Backoff,
}

/// Backing ids by layer: `(path, id)` of each file registered.
type Backed = HashMap<u32, Vec<(String, u32)>>;

/// When a session may start a dead server again: at once the first time, then after twice
/// the previous wait, up to [`HEAL_MAX`].
#[derive(Default)]
struct Backoff {
    next: Option<std::time::Instant>,
    wait: Duration,
}

/// The longest wait between two starts of a server that keeps dying.
const HEAL_MAX: Duration = Duration::from_secs(60);

impl Backoff {
    /// May a start happen now? Then the next one waits longer.
    fn due(&mut self) -> bool {
        let now = std::time::Instant::now();
        if self.next.is_some_and(|t| now < t) {
            return false;
        }
        self.wait = (self.wait * 2).clamp(Duration::from_secs(1), HEAL_MAX);
        self.next = Some(now + self.wait);
        true
    }
}

/// A session key as a label or a log shows it: `<volume>/mounts/<id>` for a dynamic mount.
fn label(key: &str) -> String {
    key.replace('\n', "/mounts/")
}
