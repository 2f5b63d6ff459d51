//! Single flight: at most one download per digest on the node, whoever asks. Volumes asking
//! for a digest being downloaded wait on the same one; its failure is reported once to each
//! volume that waited, and the next request starts over.
//!
//! A download runs to its end (success or failure) once started, whether or not anyone still
//! waits: a volume that stops waiting (unstaged, or an operator's `cache pull` interrupted) only
//! leaves the list of waiters, and whoever asks next finds the blob done or still coming. Two
//! kinds of download stop when nobody wants them any more: a lazy volume's, and those of a
//! dynamic mount that is deleted or failed ([`Core::abandon`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::cache::{Core, Flight, Inner, State, Stopped, next_flight};
use super::download::{Blob, download};
use super::error::OciError;
use super::live::Live;
use super::pulls::Sight;
use super::registry::{Endpoint, Scope, host_of};
use super::store::hex_of;
use super::{BlobProgress, BlobRef, Ensure, Progress, Source, Stopping};

/// Retries within one flight after a transient failure that made progress (a connection that
/// broke mid-blob); a failure without progress ends the flight at once.
const RETRIES: u32 = 3;

/// The wait after the first transient failure of a download; doubled with each further one.
const RETRY_FIRST: std::time::Duration = std::time::Duration::from_millis(500);
/// The longest wait between two attempts.
const RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(30);

impl Core {
    pub fn ensure(self: &Arc<Self>, volume: &str, src: &Source, blobs: &[BlobRef]) -> Ensure {
        let mut wanted = Vec::with_capacity(blobs.len());
        for b in blobs {
            match hex_of(&b.digest) {
                Ok(hex) => wanted.push((hex.to_string(), b)),
                Err(e) => return Ensure::Failed(e),
            }
        }
        // Made before the lock (building a new client sets up TLS), and only when something
        // is missing; its error matters only if a download has to start.
        let endpoint = match wanted.iter().any(|(hex, b)| !self.store.present(hex, b.size)) {
            true => Some(self.registries.endpoint(src).map(Arc::new)),
            false => None,
        };
        let mut failed = None;
        // How this call found each blob, for the pull metrics (`pulls.rs`).
        let mut sights: Vec<(String, Sight)> = Vec::with_capacity(wanted.len());
        let mut inner = self.inner();
        inner.volumes.insert(volume.to_string(), blobs.to_vec());
        // Downloads this volume asked for before and no longer does: it stops waiting (they go on).
        let now: BTreeSet<&str> = wanted.iter().map(|(hex, _)| hex.as_str()).collect();
        for (hex, f) in inner.flights.iter_mut() {
            if !now.contains(hex.as_str()) {
                f.waiters.remove(volume);
            }
        }
        for (hex, b) in &wanted {
            if self.store.present(hex, b.size) {
                self.store.touch(hex);
                sights.push((hex.clone(), Sight::Cached(b.size)));
                continue;
            }
            match inner.flights.get_mut(hex) {
                Some(Flight { state: State::Running, waiters, live, lazy, .. }) => {
                    // A lazy volume's download, joined by one that waits for the whole blob:
                    // its fill runs now, and it runs to its end.
                    live.fill_on();
                    *lazy = false;
                    // Joined, unless this waiter started it (its first sight said so). One a gone
                    // mount stopped (`abandon`) still ends as stopped, nobody's failure: this
                    // volume's next call starts it again from what it left on disk.
                    let joined = !waiters.contains(volume);
                    waiters.insert(volume.to_string());
                    sights.push((hex.clone(), if joined { Sight::Joined } else { Sight::Started }));
                    continue;
                }
                Some(Flight { state: State::Failed { error, unreported }, .. }) if unreported.contains(volume) => {
                    unreported.remove(volume);
                    failed.get_or_insert_with(|| error.clone());
                    if unreported.is_empty() {
                        inner.flights.remove(hex);
                    }
                    continue;
                }
                _ => {}
            }
            let ep = match &endpoint {
                Some(Ok(ep)) => ep.clone(),
                Some(Err(e)) => {
                    failed.get_or_insert_with(|| e.clone());
                    continue;
                }
                // Present a moment ago, gone now (evicted): the next call starts it.
                None => continue,
            };
            // Stopped by a transient failure a moment ago: not again before its time.
            if inner.transient.get(hex).is_some_and(|t| t.retry_at > std::time::Instant::now()) {
                continue;
            }
            let Some(handle) = tokio::runtime::Handle::try_current().ok().or_else(|| self.handle.clone()) else {
                failed.get_or_insert(OciError::Config("downloads need a tokio runtime; none is running".into()));
                continue;
            };
            // A lazy volume's state of the blob, when one reads it (its bytes on disk stay
            // readable while this download writes the rest).
            let live = inner
                .lives
                .get(hex)
                .cloned()
                .unwrap_or_else(|| Arc::new(Live::new(b.size, Some(self.changed.clone()))));
            live.fill_on();
            // A new download is wanted: whatever stopped the last one does not stop this one.
            live.cancel.store(false, Ordering::Relaxed);
            // What the last attempt left on disk, until this one has looked.
            if let Some(t) = inner.transient.get(hex) {
                live.covered.store(t.kept, Ordering::Relaxed);
            }
            let blob = Blob { digest: b.digest.clone(), hex: hex.clone(), size: b.size };
            inner.flights.insert(
                hex.clone(),
                Flight {
                    id: next_flight(),
                    live: live.clone(),
                    state: State::Running,
                    waiters: BTreeSet::from([volume.to_string()]),
                    scope: ep.scope.clone(),
                    lazy: false,
                },
            );
            tracing::info!(volume.id = %volume, registry = %ep.ctx.registry, digest = %b.digest, bytes = b.size, "pulling a blob");
            handle.spawn(self.clone().fly(ep, blob, live, false, volume.to_string()));
            sights.push((hex.clone(), Sight::Started));
        }
        let metrics = crate::metrics::global();
        let registry = host_of(src);
        let asked = wanted.iter().map(|(hex, _)| hex.clone()).collect();
        inner.pulls.saw(metrics, volume, &registry, asked, &sights);
        // A download that has put its blob in place but not yet recorded its end (the proof its
        // credentials gave among it): ready a moment later, so that `authorize` right after
        // `Ready` finds the proof.
        let settling =
            wanted.iter().any(|(hex, _)| matches!(inner.flights.get(hex), Some(Flight { state: State::Running, .. })));
        drop(inner);
        if let Some(e) = failed {
            self.inner().pulls.end(metrics, volume, crate::metrics::PullOutcome::Failed);
            return Ensure::Failed(e);
        }
        let mut inner = self.inner();
        let progress = self.progress_of(&inner, blobs);
        if !settling && progress.done_bytes == progress.total_bytes && blobs.iter().all(|b| self.present(b)) {
            inner.pulls.end(metrics, volume, crate::metrics::PullOutcome::Ok);
            Ensure::Ready
        } else {
            Ensure::Pulling(progress)
        }
    }

    fn present(&self, b: &BlobRef) -> bool {
        hex_of(&b.digest).is_ok_and(|hex| self.store.present(hex, b.size))
    }

    pub fn progress(&self) -> BTreeMap<String, Progress> {
        let inner = self.inner();
        inner.volumes.iter().map(|(v, blobs)| (v.clone(), self.progress_of(&inner, blobs))).collect()
    }

    fn progress_of(&self, inner: &Inner, blobs: &[BlobRef]) -> Progress {
        let mut p = Progress::default();
        for b in blobs {
            let hex = hex_of(&b.digest).unwrap_or_default();
            let done = if self.store.present(hex, b.size) {
                b.size
            } else {
                match inner.flights.get(hex) {
                    Some(f) => f.live.covered.load(Ordering::Relaxed).min(b.size),
                    None => inner.transient.get(hex).map(|t| t.kept.min(b.size)).unwrap_or(0),
                }
            };
            p.done_bytes += done;
            p.total_bytes += b.size;
            p.blobs.push(BlobProgress { digest: b.digest.clone(), done, total: b.size });
        }
        p
    }

    pub fn last_errors(&self) -> BTreeMap<String, String> {
        self.inner().transient.iter().map(|(hex, t)| (format!("sha256:{hex}"), t.error.clone())).collect()
    }

    /// `volume` stops waiting; the downloads it waited for go on, but those only lazy volumes
    /// wanted and none wants now stop, and what a lazy volume's blobs left on disk unfinished
    /// is removed when no other volume wants them.
    pub fn forget(&self, volume: &str) {
        let mut inner = self.inner();
        let had = inner.volumes.remove(volume).unwrap_or_default();
        let was_lazy = inner.lazy_volumes.remove(volume);
        inner.pulls.forget(crate::metrics::global(), volume);
        inner.flights.retain(|_, f| {
            f.waiters.remove(volume);
            match &mut f.state {
                State::Running => {
                    if f.lazy && f.waiters.is_empty() {
                        f.live.stop();
                    }
                    true
                }
                State::Failed { unreported, .. } => {
                    unreported.remove(volume);
                    !unreported.is_empty()
                }
            }
        });
        if !was_lazy {
            return;
        }
        for b in had {
            let Ok(hex) = hex_of(&b.digest).map(str::to_string) else { continue };
            let wanted = inner.volumes.values().flatten().any(|o| o.digest == b.digest);
            if wanted {
                continue;
            }
            inner.lives.remove(&hex);
            inner.lazy_failed.remove(&hex);
            // A running download removes its partial file when its cancel takes effect.
            if !inner.flights.contains_key(&hex) && !self.store.present(&hex, b.size) {
                inner.transient.remove(&hex);
                self.store.drop_partial(&hex);
                tracing::info!(volume.id = %volume, digest = %b.digest, "removed the unfinished blob of a lazy volume no volume uses");
            }
        }
    }

    /// A dynamic mount's end (deleted, failed): `waiter` stops waiting as [`Core::forget`] says,
    /// and its downloads no other volume or mount wants stop too, eager ones included (a queued
    /// one at once, a running one at its next read or pause). Returns the blobs whose downloads
    /// it stopped: they may still be ending ([`Core::remaining`]).
    pub fn abandon(&self, waiter: &str) -> Vec<Stopping> {
        let mut inner = self.inner();
        let had = inner.volumes.remove(waiter).unwrap_or_default();
        let mut stopped = Vec::new();
        for b in had.iter() {
            let Ok(hex) = hex_of(&b.digest) else { continue };
            let wanted = inner.volumes.values().flatten().any(|o| o.digest == b.digest);
            if let Some(f) = inner.flights.get_mut(hex)
                && matches!(f.state, State::Running)
                && f.waiters.remove(waiter)
                && f.waiters.is_empty()
                && !wanted
            {
                f.live.stop();
                stopped.push(Stopping { blob: b.clone(), flight: f.id });
            }
        }
        // Put back for `forget`, which does the rest (lazy bookkeeping, metrics, failures).
        inner.volumes.insert(waiter.to_string(), had);
        drop(inner);
        self.forget(waiter);
        stopped
    }

    /// The bytes still to come in the downloads `stopping` names (queued ones included), while
    /// each is the one running: a later download of the same digest is not counted.
    pub fn remaining(&self, stopping: &[Stopping]) -> u64 {
        let inner = self.inner();
        let mut seen = BTreeSet::new();
        stopping
            .iter()
            .filter(|s| seen.insert(s.flight))
            .filter_map(|s| {
                let hex = hex_of(&s.blob.digest).ok()?;
                let f = inner.flights.get(hex).filter(|f| f.id == s.flight && matches!(f.state, State::Running))?;
                Some(s.blob.size.saturating_sub(f.live.covered.load(Ordering::Relaxed)))
            })
            .fold(0, u64::saturating_add)
    }

    /// If no volume waits for the download of `hex` any more, forget it (under one lock: a
    /// volume joining now finds no flight and starts one).
    fn drop_unwanted(&self, hex: &str) -> bool {
        let mut inner = self.inner();
        let unwanted = inner.flights.get(hex).is_some_and(|f| f.waiters.is_empty());
        if unwanted {
            inner.flights.remove(hex);
        }
        unwanted
    }

    /// Whose credentials the running download of `hex` uses, if one runs.
    pub(super) fn flight_scope(&self, hex: &str) -> Option<Scope> {
        self.inner().flights.get(hex).filter(|f| matches!(f.state, State::Running)).map(|f| f.scope.clone())
    }

    /// One flight: download (retrying a transient failure that made progress), then record the
    /// outcome in the map.
    /// `starter`: the volume whose call started it, whose share of the node's slots it takes.
    pub(super) async fn fly(
        self: Arc<Self>,
        ep: Arc<Endpoint>,
        blob: Blob,
        live: Arc<Live>,
        lazy: bool,
        starter: String,
    ) {
        let mut retries = 0;
        // Blob bytes received, by registry contacted.
        let counted = crate::metrics::global().oci_fetched(&ep.ctx.registry);
        let outcome = loop {
            // Its turn among the node's downloads, for this attempt, from its starter's share;
            // given back before a retry's pause. A lazy volume's download takes no turn: its
            // readers wait for it, and its fill runs one layer at a time per volume.
            let turn = match lazy {
                true => None,
                false => tokio::select! {
                    turn = self.downloads.acquire(&starter) => Some(turn),
                    // Stopped while queued: it ends now, not when its turn comes.
                    () = live.stopped() => break Err(OciError::Cancelled { digest: blob.digest.clone() }),
                },
            };
            // Its turn came after every volume that waited for it stopped waiting (unstaged):
            // it does not start, and leaves the slot to downloads someone waits for. (One that
            // started goes on to its end, unless it is stopped: `Core::abandon`, lazy ones.)
            if !lazy && retries == 0 && self.drop_unwanted(&blob.hex) {
                drop(turn);
                live.bump();
                tracing::info!(registry = %ep.ctx.registry, digest = %blob.digest, "a queued download no volume waits for any more was dropped before it started");
                return;
            }
            let before = live.covered.load(Ordering::Relaxed);
            // A task of its own, so that a bug panicking in it ends this flight with an error
            // instead of leaving it "running" forever.
            let attempt = {
                let (core, ep, blob, live, counted) =
                    (self.clone(), ep.clone(), blob.clone(), live.clone(), counted.clone());
                tokio::spawn(async move {
                    let stall = core.registries.config().stall;
                    download(&ep, &core.store, &blob, &live, lazy, &core.fetched, &counted, stall).await
                })
            };
            let result = attempt.await.unwrap_or_else(|e| {
                Err(OciError::Local {
                    path: self.store.partial(&blob.hex).display().to_string(),
                    detail: format!("the download task failed: {e}"),
                    kind: std::io::ErrorKind::Other,
                })
            });
            drop(turn);
            match result.map_err(OciError::redacted) {
                Ok(()) => break Ok(()),
                // A stalled registry is not asked again at once: the slot goes to others, and
                // the volume's next call resumes.
                Err(e)
                    if e.is_transient()
                        && !matches!(e, OciError::Stalled { .. })
                        && retries < RETRIES
                        && live.covered.load(Ordering::Relaxed) > before
                        && !live.cancel.load(Ordering::Relaxed) =>
                {
                    retries += 1;
                    tracing::warn!(registry = %ep.ctx.registry, digest = %blob.digest, error = %e, "blob download interrupted; resuming");
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_secs(u64::from(retries))) => {}
                        () = live.stopped() => break Err(OciError::Cancelled { digest: blob.digest.clone() }),
                    }
                }
                Err(e) => break Err(e),
            }
        };
        // No pruning here: the caller prunes with the volumes' real use (`Artifacts::prune`).
        self.record(&ep, &blob, &live, outcome);
    }

    /// Record how a flight ended.
    fn record(&self, ep: &Endpoint, blob: &Blob, live: &Live, outcome: Result<(), OciError>) {
        let mut inner = self.inner();
        // Stopped because no volume wants it any more, whatever else happened meanwhile.
        let outcome = match outcome {
            Err(_) if live.cancel.load(Ordering::Relaxed) => Err(OciError::Cancelled { digest: blob.digest.clone() }),
            other => other,
        };
        match outcome {
            Err(OciError::Cancelled { .. }) => {
                inner.flights.remove(&blob.hex);
                inner.transient.remove(&blob.hex);
                // Asked for again meanwhile: the next download starts over (from the partial
                // file a lazy server reads, kept); otherwise nobody wants what is left.
                if !inner.volumes.values().flatten().any(|b| b.digest == blob.digest) {
                    inner.lives.remove(&blob.hex);
                    self.store.drop_partial(&blob.hex);
                    tracing::info!(registry = %ep.ctx.registry, digest = %blob.digest, "stopped the lazy download of a blob no volume uses; its unfinished file is removed");
                }
            }
            Ok(()) => {
                inner.flights.remove(&blob.hex);
                inner.transient.remove(&blob.hex);
                // The download read it with these credentials: proof enough for `authorize`.
                self.prove(&ep.scope, &blob.hex);
                // A pull whose last blob this was ends now, not at its caller's next request
                // (kubelet's retry comes up to minutes later).
                let complete: Vec<String> = inner
                    .volumes
                    .iter()
                    .filter(|(_, blobs)| {
                        blobs.iter().any(|b| b.digest == blob.digest) && blobs.iter().all(|b| self.present(b))
                    })
                    .map(|(v, _)| v.clone())
                    .collect();
                for waiter in complete {
                    inner.pulls.end(crate::metrics::global(), &waiter, crate::metrics::PullOutcome::Ok);
                }
                tracing::info!(registry = %ep.ctx.registry, digest = %blob.digest, bytes = blob.size, "blob pulled and verified");
            }
            // A transient failure; or a lazy volume's download that failed for another reason
            // than its bytes (the disk full, credentials refused): its readers keep what is
            // there, and it is tried again after a while.
            Err(e)
                if e.is_transient() || (!e.is_integrity() && inner.flights.get(&blob.hex).is_some_and(|f| f.lazy)) =>
            {
                if e.is_transient() {
                    tracing::warn!(registry = %ep.ctx.registry, digest = %blob.digest, error = %e, "blob download stopped; the next request resumes it");
                } else {
                    tracing::warn!(registry = %ep.ctx.registry, digest = %blob.digest, error = %e, "a lazy volume's blob download stopped; it is tried again later");
                }
                inner.flights.remove(&blob.hex);
                let kept = live.covered.load(Ordering::Relaxed);
                let failures = inner.transient.get(&blob.hex).map_or(0, |t| t.failures) + 1;
                let wait = RETRY_FIRST.saturating_mul(1 << (failures - 1).min(16)).min(RETRY_MAX);
                let retry_at = std::time::Instant::now() + wait;
                inner
                    .transient
                    .insert(blob.hex.clone(), Stopped { error: e.to_string(), kept, failures, retry_at, tried: None });
            }
            Err(e) => {
                tracing::error!(registry = %ep.ctx.registry, digest = %blob.digest, error = %e, "blob download failed");
                inner.transient.remove(&blob.hex);
                // Lazy volumes reading it learn it from their session (and their readers fail).
                let lazy_reads = inner
                    .volumes
                    .iter()
                    .any(|(v, blobs)| inner.lazy_volumes.contains(v) && blobs.iter().any(|b| b.digest == blob.digest));
                if lazy_reads && e.is_integrity() {
                    inner.lazy_failed.insert(blob.hex.clone(), e.clone());
                }
                if e.is_integrity() {
                    inner.lives.remove(&blob.hex);
                }
                match inner.flights.get_mut(&blob.hex) {
                    Some(f) if !f.waiters.is_empty() => {
                        f.state = State::Failed { error: e, unreported: f.waiters.clone() };
                    }
                    _ => {
                        inner.flights.remove(&blob.hex);
                    }
                }
            }
        }
        drop(inner);
        live.bump();
    }
}
