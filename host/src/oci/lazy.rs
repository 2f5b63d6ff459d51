//! The cache's side of lazy volumes (docs/lazy.md): a volume that serves its files while their
//! blobs are still downloading.
//!
//! - [`Artifacts::lazy_register`] says which blobs a volume reads lazily: they count as in use
//!   (never evicted), and their live state ([`Live`]) is kept while any such volume remains;
//! - [`Artifacts::lazy_start`] starts (or joins) a blob's download in the lazy mode: demand
//!   workers fetch what readers wait for at once; the background fill runs once `fill` is
//!   asked for (a volume fills its layers one after the other);
//! - [`Artifacts::lazy_want`] queues a range a reader waits for (starting the download if none
//!   runs, past the backoff of a transient failure: a reader is waiting);
//! - [`Artifacts::lazy_view`] is what a reader may read of a blob now, and how it came;
//! - [`Artifacts::lazy_open`] opens the blob's bytes for reading (the partial file while it
//!   downloads: the same inode becomes the blob when it completes);
//! - [`Artifacts::lazy_forget`] ends it (unstage): downloads only lazy volumes wanted stop,
//!   and what they left unfinished is removed.

use std::collections::BTreeSet;
use std::fs::File;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::cache::{Flight, State};
use super::download::Blob;
use super::live::Live;
use super::store::hex_of;
use super::{Artifacts, BlobRef, OciError, Source};
use crate::plan::Archive;

pub use super::live::ChunkIndex;

/// What a reader may read of one blob now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlobView {
    /// Complete and verified (every byte readable).
    pub complete: bool,
    /// Readable ranges (everything when complete).
    pub readable: Vec<(u64, u64)>,
    /// Ranges that failed the reader's chunk index twice (until the blob completes: then its
    /// digest decides).
    pub bad: Vec<(u64, u64)>,
    /// The blob failed for good (a digest mismatch): the volume fails.
    pub failed: Option<OciError>,
    /// The last transient failure of its download, while it is not running (the registry gone,
    /// the disk full).
    pub stalled: Option<String>,
    /// Bytes on disk.
    pub present: u64,
    /// Bytes known good: the whole blob once complete, the chunks that matched the reader's
    /// index before that.
    pub verified: u64,
    /// Requests made for readers, their bytes, and the bytes the fill fetched (this daemon's).
    pub demand_requests: u64,
    pub demand_bytes: u64,
    pub fill_bytes: u64,
    /// The download is running.
    pub running: bool,
}

/// Urgent wishes start a download at most this often per blob while its registry fails.
const URGENT_RETRY: Duration = Duration::from_secs(1);

impl Artifacts {
    /// `volume` reads `blobs` lazily: they are in use (never evicted) while it is registered.
    /// Replaces what it registered before.
    pub fn lazy_register(&self, volume: &str, blobs: &[BlobRef]) {
        let mut inner = self.core.inner();
        inner.volumes.insert(volume.to_string(), blobs.to_vec());
        inner.lazy_volumes.insert(volume.to_string());
    }

    /// The volumes reading blobs lazily.
    pub fn lazy_volumes(&self) -> BTreeSet<String> {
        self.core.inner().lazy_volumes.clone()
    }

    /// The end of `volume`'s lazy reading (unstage, [`Artifacts::forget`]): the downloads only
    /// it wanted stop, and this waits (at most a few seconds) until they have, so nothing they
    /// wrote is left behind.
    pub async fn lazy_forget(&self, volume: &str) {
        let digests: Vec<(String, Option<u64>)> = {
            let inner = self.core.inner();
            inner
                .volumes
                .get(volume)
                .map(|b| b.iter().filter_map(|b| hex_of(&b.digest).ok().map(|h| (h.to_string(), None))).collect())
                .unwrap_or_default()
        };
        self.forget(volume);
        self.wait_stopped(&digests).await;
    }

    /// Wait (at most a few seconds) until the downloads of `blobs` asked to stop
    /// ([`Artifacts::abandon`]) have ended.
    pub async fn stopping(&self, stopping: &[super::Stopping]) {
        let flights: Vec<(String, Option<u64>)> = stopping
            .iter()
            .filter_map(|s| hex_of(&s.blob.digest).ok().map(|h| (h.to_string(), Some(s.flight))))
            .collect();
        self.wait_stopped(&flights).await;
    }

    /// Wait until no download of these digests (of this flight, when one is named) is stopping.
    async fn wait_stopped(&self, flights: &[(String, Option<u64>)]) {
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            let stopping = {
                let inner = self.core.inner();
                flights.iter().any(|(h, id)| {
                    inner
                        .flights
                        .get(h)
                        .is_some_and(|f| id.is_none_or(|id| id == f.id) && f.live.cancel.load(Ordering::Relaxed))
                })
            };
            if !stopping {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The live state of blob `hex` of `size` bytes: its running download's, else the one kept
    /// for lazy volumes, else a new one from what is on disk (the ranges file of its partial
    /// file).
    fn live_of(&self, hex: &str, size: u64) -> Arc<Live> {
        let mut inner = self.core.inner();
        if let Some(f) = inner.flights.get(hex) {
            return f.live.clone();
        }
        if let Some(l) = inner.lives.get(hex) {
            return l.clone();
        }
        let live = Arc::new(Live::new(size, Some(self.core.changed.clone())));
        *super::live::lock(&live.segs) = self.core.store.partial_ranges(hex, size).unwrap_or_default();
        inner.lives.insert(hex.to_string(), live.clone());
        live
    }

    /// Make sure blob `b`'s download runs for `volume`, in the lazy mode: started when none runs
    /// and the blob is not complete (after a transient failure, not before its backoff ends,
    /// unless `urgent` and at most once a second); `fill` lets its streams fetch the whole blob
    /// in the background. `index`: the blob's chunk index, checked before bytes are readable.
    pub fn lazy_start(
        &self,
        volume: &str,
        src: &Source,
        b: &BlobRef,
        fill: bool,
        urgent: bool,
        index: Option<Arc<ChunkIndex>>,
    ) -> Result<(), OciError> {
        let hex = hex_of(&b.digest)?.to_string();
        if self.core.store.present(&hex, b.size) {
            return Ok(());
        }
        // A volume forgotten meanwhile (unstaged while its session still ran) starts nothing.
        if !self.core.inner().lazy_volumes.contains(volume) {
            return Ok(());
        }
        let live = self.live_of(&hex, b.size);
        if let Some(i) = index {
            live.add_index(i);
        }
        let mut inner = self.core.inner();
        match inner.flights.get_mut(&hex) {
            Some(Flight { state: State::Running, waiters, live, .. }) => {
                waiters.insert(volume.to_string());
                if fill {
                    live.fill_on();
                }
                return Ok(());
            }
            // Failed for good (for eager volumes that wait for it): the volume learns it from
            // its view; a failure that is not the bytes' is tried again once they were told.
            Some(Flight { state: State::Failed { error, .. }, .. }) if error.is_integrity() => return Ok(()),
            Some(Flight { state: State::Failed { unreported, .. }, .. }) => {
                unreported.remove(volume);
                if !unreported.is_empty() {
                    return Ok(());
                }
                inner.flights.remove(&hex);
            }
            None => {}
        }
        if inner.lazy_failed.contains_key(&hex) {
            return Ok(());
        }
        if let Some(t) = inner.transient.get(&hex) {
            let now = Instant::now();
            let wait_over = t.retry_at <= now;
            let urgent_ok = urgent && t.tried.is_none_or(|at| now.duration_since(at) >= URGENT_RETRY);
            if !wait_over && !urgent_ok {
                return Ok(());
            }
        }
        drop(inner);
        let ep = Arc::new(self.core.registries.endpoint(src)?);
        let handle = tokio::runtime::Handle::try_current()
            .ok()
            .or_else(|| self.core.handle.clone())
            .ok_or_else(|| OciError::Config("downloads need a tokio runtime; none is running".into()))?;
        let mut inner = self.core.inner();
        if inner.flights.contains_key(&hex) {
            return Ok(());
        }
        if let Some(t) = inner.transient.get_mut(&hex) {
            t.tried = Some(Instant::now());
        }
        live.cancel.store(false, Ordering::Relaxed);
        if fill {
            live.fill_on();
        }
        inner.lives.insert(hex.clone(), live.clone());
        inner.flights.insert(
            hex.clone(),
            Flight {
                id: super::cache::next_flight(),
                live: live.clone(),
                state: State::Running,
                waiters: BTreeSet::from([volume.to_string()]),
                scope: ep.scope.clone(),
                lazy: true,
            },
        );
        tracing::info!(volume.id = %volume, registry = %ep.ctx.registry, digest = %b.digest, bytes = b.size, fill, "reading a blob lazily");
        let blob = Blob { digest: b.digest.clone(), hex, size: b.size };
        handle.spawn(self.core.clone().fly(ep, blob, live, true, volume.to_string()));
        Ok(())
    }

    /// A reader of `volume` (checking chunks with `index`) waits for `[start, end)` of blob
    /// `b` (`urgent`), or a sequential reader soon will: its download fetches it ahead of the
    /// fill.
    #[allow(clippy::too_many_arguments)]
    pub fn lazy_want(
        &self,
        volume: &str,
        src: &Source,
        b: &BlobRef,
        start: u64,
        end: u64,
        urgent: bool,
        index: Option<Arc<ChunkIndex>>,
    ) -> Result<(), OciError> {
        let hex = hex_of(&b.digest)?.to_string();
        if self.core.store.present(&hex, b.size) || !self.core.inner().lazy_volumes.contains(volume) {
            return Ok(());
        }
        let live = self.live_of(&hex, b.size);
        if let Some(i) = &index {
            live.add_index(i.clone());
        }
        live.want(start.min(b.size)..end.min(b.size));
        self.lazy_start(volume, src, b, false, urgent, index)
    }

    /// What a reader checking chunks with `index` (its manifest's chunk index, if it has one)
    /// may read of blob `b` now. Another manifest's index never decides what it reads.
    pub fn lazy_view(&self, b: &BlobRef, index: Option<&Arc<ChunkIndex>>) -> BlobView {
        let Ok(hex) = hex_of(&b.digest).map(str::to_string) else {
            return BlobView {
                failed: Some(OciError::Config(format!("{} is not a sha256 digest", b.digest))),
                ..Default::default()
            };
        };
        let (live, running, failed, stalled) = {
            let inner = self.core.inner();
            let failed = inner.lazy_failed.get(&hex).cloned().or_else(|| match inner.flights.get(&hex) {
                Some(Flight { state: State::Failed { error, .. }, .. }) if error.is_integrity() => Some(error.clone()),
                _ => None,
            });
            let running = matches!(inner.flights.get(&hex), Some(Flight { state: State::Running, .. }));
            let stalled = match inner.flights.get(&hex) {
                Some(Flight { state: State::Failed { error, .. }, .. }) if !error.is_integrity() => {
                    Some(error.to_string())
                }
                Some(_) => None,
                None => inner.transient.get(&hex).map(|t| t.error.clone()),
            };
            let live = inner.flights.get(&hex).map(|f| f.live.clone()).or_else(|| inner.lives.get(&hex).cloned());
            (live, running, failed, stalled)
        };
        let counters = |l: &Live| {
            (
                l.demand_requests.load(Ordering::Relaxed),
                l.demand_bytes.load(Ordering::Relaxed),
                l.fill_bytes.load(Ordering::Relaxed),
            )
        };
        if self.core.store.present(&hex, b.size) {
            let (demand_requests, demand_bytes, fill_bytes) = live.as_deref().map(counters).unwrap_or_default();
            return BlobView {
                complete: true,
                readable: vec![(0, b.size)],
                present: b.size,
                verified: b.size,
                demand_requests,
                demand_bytes,
                fill_bytes,
                ..Default::default()
            };
        }
        let live = live.unwrap_or_else(|| self.live_of(&hex, b.size));
        if let Some(i) = index {
            // Past the cap, the index is not checked: nothing is readable for it until complete.
            live.add_index(i.clone());
        }
        let index = index.map(|i| &**i);
        let (demand_requests, demand_bytes, fill_bytes) = counters(&live);
        let present = super::live::lock(&live.segs).covered();
        BlobView {
            complete: false,
            readable: if failed.is_some() { Vec::new() } else { live.readable(index) },
            bad: live.bad_spans(index),
            failed,
            stalled,
            present,
            verified: live.verified_bytes(index),
            demand_requests,
            demand_bytes,
            fill_bytes,
            running,
        }
    }

    /// A read-only descriptor of blob `b`'s bytes: the complete blob, or its partial file
    /// (created empty, 0600, when missing: the download writes into that same inode and renames
    /// it into place). Blocking.
    pub fn lazy_open(&self, b: &BlobRef) -> io::Result<File> {
        let hex = hex_of(&b.digest).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let store = &self.core.store;
        let nofollow = rustix::fs::OFlags::NOFOLLOW.bits() as i32;
        let open_blob = || std::fs::OpenOptions::new().read(true).custom_flags(nofollow).open(store.blob(hex));
        match open_blob() {
            Ok(f) => return Ok(f),
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            Err(_) => {}
        }
        let partial = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(nofollow)
            .open(store.partial(hex))?;
        // Renamed into place meanwhile: the partial file just made is a stray.
        if let Ok(f) = open_blob() {
            if partial.metadata().map(|m| m.len() == 0).unwrap_or(false) {
                let _ = std::fs::remove_file(store.partial(hex));
            }
            return Ok(f);
        }
        // Read-only from here on: what the server gets. Its inode must stay the one written.
        self.live_of(hex, b.size).served.store(true, std::sync::atomic::Ordering::Relaxed);
        std::fs::OpenOptions::new().read(true).custom_flags(nofollow).open(store.partial(hex))
    }

    /// A descriptor (`O_PATH`) of the unpacked tree of blob `b` (an image layer's own tree for
    /// one fetched as such), below which the lazy server opens a compressed layer's files
    /// without following links. Blocking.
    pub fn lazy_open_tree(&self, b: &BlobRef) -> io::Result<File> {
        let hex = hex_of(&b.digest).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let fd = rustix::fs::open(
            self.core.store.tree_of(hex, crate::plan::tar_rules::Layering::of(&b.media_type)),
            rustix::fs::OFlags::PATH
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::NOFOLLOW
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        Ok(File::from(fd))
    }

    /// The complete files of layer `b` (`format`) a lazy server hands to the kernel for
    /// passthrough, by file id: a raw layer's blob itself, an archive's files in its unpacked
    /// tree (`files`: each file's id and path in the layer). A file that cannot be opened is
    /// left out (it stays served by the server). Blocking.
    pub fn lazy_backing_files(&self, b: &BlobRef, format: Archive, files: &[(u32, String)]) -> Vec<(u32, File)> {
        let Ok(hex) = hex_of(&b.digest) else { return Vec::new() };
        let open = |path: std::path::PathBuf| {
            std::fs::OpenOptions::new().read(true).custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32).open(path)
        };
        match format {
            Archive::Raw => {
                files.iter().filter_map(|(id, _)| open(self.core.store.blob(hex)).ok().map(|f| (*id, f))).collect()
            }
            Archive::Tar | Archive::TarGzip | Archive::TarZstd => {
                let Ok(tree) = self.lazy_open_tree(b) else { return Vec::new() };
                files
                    .iter()
                    .filter_map(|(id, rel)| crate::unpriv::sys::open_beneath(&tree, rel).ok().map(|f| (*id, f)))
                    .collect()
            }
        }
    }

    /// Is blob `b` complete and verified in the cache?
    pub fn present(&self, b: &BlobRef) -> bool {
        hex_of(&b.digest).is_ok_and(|hex| self.core.store.present(hex, b.size))
    }

    /// A receiver that changes whenever a lazy volume's blob does (bytes written or verified,
    /// a download ended).
    pub fn lazy_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.core.changed.subscribe()
    }
}
