//! One blob's download into `<hex>.partial`: byte ranges fetched by one or more streams and
//! written at their offsets, a *follower* thread hashing the file's completed prefix as it
//! grows, then fsync, mode 0444 and a rename to the blob's final name.
//!
//! - Blobs over [`CHUNK`] bytes are cut into [`CHUNK`]-byte ranges taken in file order by
//!   [`STREAMS`] streams, so the completed prefix (and the hash) advances at the streams'
//!   combined speed and the follower is at most about one range per other stream behind at the
//!   end. A blob of one range or less is one request.
//! - Written ranges are recorded in memory and, every [`SAVE_EVERY`] bytes and when the
//!   download stops, in `<hex>.partial.json` ([`Segments`]). The next attempt fetches only the
//!   gaps and re-hashes what is on disk (while the gaps download).
//! - A registry that ignores `Range` (answers 200) is read from byte 0: that stream takes over
//!   the rest of the blob.
//! - Memory stays bounded: two write buffers of [`WRITE_BUF`] per stream and one read buffer for
//!   the follower.
//! - The follower starts the hashed bytes' writeback at once, so the final fsync is short.
//! - The follower (`follower.rs`) runs with a raised thread priority while it hashes.
//! - A lazy volume's download ([`download`] with `lazy`) also runs demand workers that fetch the
//!   ranges its readers wait for ([`Live::want`]) ahead of the streams, and its streams start
//!   only once the fill's turn came ([`Live::fill_on`]). Every range a stream takes is first cut
//!   to what no writer claimed, so bytes fetched on demand are not fetched again.
//! - With chunk indexes (one for each manifest its lazy volumes read the blob by), each chunk a
//!   write completes is read back and checked against every index before it counts as readable
//!   for that index's volumes ([`Live::verify`]); the follower hashes only bytes no index will
//!   have written again (settled). A chunk that fails an index twice stays on disk: the blob's
//!   digest decides when it completes.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::error::{OciError, chain};
use super::follower::{Watched, follow};
use super::live::{Live, lock};
use super::registry::Endpoint;
use super::segments::{Segments, chunks};
use super::stall::Window;
use super::store::Store;

/// Parallel streams for a large blob. On a 2-core machine pulling 1 GiB over loopback, 2 beat
/// 1 (~1.4–1.8 s against ~1.5–2.7 s) and 3 (~1.6–1.8 s); each stream is also one connection
/// a remote registry or CDN may throttle on its own.
pub(super) const STREAMS: usize = 2;
/// The range one request of a parallel download asks for. Each request costs the registry a
/// lookup and a fresh file reader: pulling 1 GiB from the local `docker-registry` in 16 MiB
/// ranges cost it 1.1–1.2 CPU-seconds against about 0.6 in 64 MiB ranges, on a 2-core machine
/// where those cores also hash, and the pull took ~2.1–2.7 s against ~1.8–2.0 s. Larger ranges
/// would leave the hash further behind the download at its end (up to one range).
pub(super) const CHUNK: u64 = 64 << 20;
/// Bytes gathered before one positioned write.
const WRITE_BUF: usize = 1 << 20;
/// Progress between two saves of the written ranges: what a daemon killed mid-download (whose
/// written bytes survive in the page cache) fetches again at most, plus the writes in flight.
/// A save is one small file written and renamed, so 256 per GiB cost nothing measurable.
const SAVE_EVERY: u64 = 4 << 20;
/// What a resumed download may fetch again after its daemon was killed: the progress not yet
/// saved, plus each stream's write buffer and write in flight.
pub const MAX_REFETCH: u64 = SAVE_EVERY + (STREAMS as u64) * 2 * WRITE_BUF as u64;
/// The blob to fetch.
#[derive(Debug, Clone)]
pub(super) struct Blob {
    pub digest: String,
    pub hex: String,
    pub size: u64,
}

/// State shared by the streams, the demand workers and the follower of one attempt (the
/// written ranges themselves are the blob's [`Live`]).
struct Shared {
    file: File,
    live: Arc<Live>,
    /// Ranges a writer took to write (written, or being written). A byte is written once per
    /// attempt: a writer writes only what no other one claimed, so bytes the follower has
    /// hashed are never written again (a registry answering one range with the whole blob
    /// sends other streams' ranges again, and not necessarily the same bytes).
    claimed: Mutex<Segments>,
    /// The follower stops (the attempt failed).
    stop: AtomicBool,
    /// Bytes written since the last save of the ranges.
    unsaved: AtomicU64,
    /// Ranges not yet handed to a stream.
    queue: Mutex<VecDeque<Range<u64>>>,
    /// The first error; the other workers stop at their next chunk.
    failed: Mutex<Option<OciError>>,
    /// Where each stream is: the next byte it receives and the end of its range.
    windows: Mutex<Vec<(u64, u64)>>,
    /// Every stream has ended (after the fill was on): what is still missing then is only what
    /// readers ask for, or chunks that failed the index.
    streams_done: AtomicBool,
}

/// Demand workers of a lazy download: ranges readers wait for, fetched at once.
const DEMAND_WORKERS: usize = 4;
/// A range a stream reaches within this many bytes is left to the stream.
const NEAR: u64 = 8 << 20;

/// Is a failed download's partial file kept (whatever the failure, unless its bytes are
/// wrong)? For a lazy download, and for any download of a blob a lazy server reads.
fn kept(lazy: bool, live: &Live) -> bool {
    lazy || live.served.load(Ordering::Relaxed)
}

/// Who fetches a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Stream `n` of the fill.
    Stream(usize),
    /// A demand worker.
    Demand,
}

/// Fetch `blob` into the cache. Returns when the blob is in place, or with the error that
/// stopped it (a transient one keeps the partial file for the next attempt; a permanent one
/// removes it). `lazy`: run demand workers too, and start the streams only once the fill is on.
#[allow(clippy::too_many_arguments, reason = "the flight's parts, each passed on to the streams")]
pub(super) async fn download(
    ep: &Endpoint,
    store: &Store,
    blob: &Blob,
    live: &Arc<Live>,
    lazy: bool,
    fetched: &AtomicU64,
    counted: &crate::metrics::ByteCounter,
    stall: std::time::Duration,
) -> Result<(), OciError> {
    let local = |e: io::Error, path: &std::path::Path| OciError::local(path, &e, &ep.ctx.reference, &blob.digest);
    let (file, segs) = {
        let (store, blob, writer) = (store.clone(), blob.clone(), ep.scope.tag());
        tokio::task::spawn_blocking(move || {
            let prepared = prepare(&store, &blob, lazy)?;
            // Whose download writes it now: the same source resumes it after a restart unasked.
            let _ = std::fs::write(store.writer(&blob.hex), writer);
            Ok::<_, io::Error>(prepared)
        })
    }
    .await
    .map_err(|e| local(io::Error::other(e), &store.partial(&blob.hex)))?
    .map_err(|e| {
        if e.kind() != io::ErrorKind::WouldBlock && !kept(lazy, live) {
            store.drop_partial(&blob.hex);
        }
        local(e, &store.partial(&blob.hex))
    })?;
    live.covered.store(segs.covered(), Ordering::Relaxed);
    *lock(&live.segs) = segs.clone();
    let shared = Arc::new(Shared {
        file,
        live: live.clone(),
        claimed: Mutex::new(segs.clone()),
        stop: AtomicBool::new(false),
        unsaved: AtomicU64::new(0),
        queue: Mutex::new(VecDeque::new()),
        failed: Mutex::new(None),
        windows: Mutex::new(vec![(0, 0); STREAMS]),
        streams_done: AtomicBool::new(false),
    });
    // What an earlier attempt left on disk is settled again (checked against every chunk
    // index the blob is read with) before the follower hashes it.
    live.unsettle();
    {
        let shared2 = shared.clone();
        let ranges: Vec<Range<u64>> = segs.ranges().to_vec();
        tokio::task::spawn_blocking(move || {
            shared2.live.verify(&shared2.file, &ranges, &|r| lock(&shared2.claimed).remove(r));
        })
        .await
        .map_err(|e| local(io::Error::other(e), &store.partial(&blob.hex)))?;
    }
    let gaps = lock(&live.segs).gaps(blob.size);
    let (streams, pieces) = if blob.size > CHUNK {
        let pieces = chunks(&gaps, CHUNK);
        (STREAMS.min(pieces.len()), pieces)
    } else {
        (gaps.len().min(1), gaps)
    };
    *lock(&shared.queue) = pieces.into();
    let follower = {
        let (shared, size) = (shared.clone(), blob.size);
        tokio::task::spawn_blocking(move || {
            // Only settled bytes are hashed: a chunk written again after it failed an index is
            // hashed once, with its new bytes.
            let watched =
                Watched { file: &shared.file, segs: &shared.live.settled, grew: &shared.live.grew, stop: &shared.stop };
            follow(watched, size)
        })
    };
    // Should this future be dropped (the runtime shutting down), the follower stops too.
    let _stop = StopOnDrop(shared.clone());
    let ctx = Stream { ep, store, blob, live, fetched, counted, shared: &shared, lazy, stall };
    let started = std::time::Instant::now();
    let demand = if lazy { DEMAND_WORKERS } else { 0 };
    let workers = async {
        futures_util::future::join_all((0..streams).map(|i| ctx.run(i))).await;
        shared.streams_done.store(true, Ordering::Relaxed);
        live.wake.notify_waiters();
    };
    let demanders = futures_util::future::join_all((0..demand).map(|_| ctx.demand()));
    futures_util::future::join(workers, demanders).await;
    ctx.mop_up().await;
    let received = started.elapsed();

    let failed = lock(&shared.failed).take();
    let complete = lock(&live.segs).gaps(blob.size).is_empty();
    if failed.is_some() || !complete {
        shared.stop.store(true, Ordering::Relaxed);
        live.grew.notify_all();
        let _ = follower.await;
        // Every worker ended without an error and without filling the file: a bug.
        let err = failed.unwrap_or_else(|| OciError::Local {
            path: store.partial(&blob.hex).display().to_string(),
            detail: "the download ended with ranges missing".into(),
            kind: io::ErrorKind::Other,
        });
        // A lazy volume's readers keep what is on disk unless it is wrong: its server reads this
        // very file, and the next attempt writes into it.
        // Cancelled: no volume waits for the blob (its last lazy volume was unstaged, its
        // dynamic mount deleted); nothing is kept, unless a lazy server reads this very file.
        if matches!(err, OciError::Cancelled { .. }) {
            if live.served.load(Ordering::Relaxed) {
                let _ = save(store, blob, &shared);
            } else {
                store.drop_partial(&blob.hex);
            }
        } else if err.is_transient() || (kept(lazy, live) && !err.is_integrity()) {
            let _ = save(store, blob, &shared);
        } else {
            store.drop_partial(&blob.hex);
        }
        return Err(err);
    }
    let hashed = follower.await.map_err(|e| local(io::Error::other(e), &store.partial(&blob.hex)))?;
    let verified = started.elapsed();
    let actual = match hashed {
        Ok(Some(hex)) => hex,
        // Told to stop, and nothing tells it to but a failure or a drop: kept for a resume.
        Ok(None) => {
            return Err(OciError::Local {
                path: store.partial(&blob.hex).display().to_string(),
                detail: "the hashing of the download stopped early".into(),
                kind: io::ErrorKind::Interrupted,
            });
        }
        Err(e) => {
            if !kept(lazy, live) {
                store.drop_partial(&blob.hex);
            }
            return Err(local(e, &store.partial(&blob.hex)));
        }
    };
    if actual != blob.hex {
        store.drop_partial(&blob.hex);
        return Err(OciError::DigestMismatch {
            registry: ep.ctx.registry.clone(),
            reference: ep.ctx.reference.clone(),
            digest: blob.digest.clone(),
            actual: format!("sha256:{actual}"),
        });
    }
    for (chunk, spans) in live.disagreements() {
        tracing::warn!(
            digest = %blob.digest,
            chunk_bytes = chunk,
            ranges = ?spans,
            "the blob matches its digest, but a chunk index gave other hashes for these ranges: that index is wrong, and the whole blob is readable now"
        );
    }
    let (store2, blob2) = (store.clone(), blob.clone());
    let done = tokio::task::spawn_blocking(move || finish(&store2, &blob2, &shared.file))
        .await
        .map_err(|e| local(io::Error::other(e), &store.blob(&blob.hex)))?;
    done.map_err(|e| {
        if !kept(lazy, live) {
            store.drop_partial(&blob.hex);
        }
        local(e, &store.blob(&blob.hex))
    })?;
    tracing::debug!(
        digest = %blob.digest,
        streams,
        received_ms = received.as_millis() as u64,
        verified_ms = verified.as_millis() as u64,
        stored_ms = started.elapsed().as_millis() as u64,
        "blob downloaded"
    );
    Ok(())
}

/// Open and lock the partial file, read which of its ranges are written, and reserve the
/// blob's space (so a full disk shows now, not half-way) unless `lazy`: a lazy volume's readers
/// read what fits, and the volume says why the rest does not come.
fn prepare(store: &Store, blob: &Blob, lazy: bool) -> io::Result<(File, Segments)> {
    let path = store.partial(&blob.hex);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc_flags())
        .open(&path)?;
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "another process is downloading this blob into the same cache",
            ));
        }
        Err(e) => return Err(e.into()),
    }
    let mut len = file.metadata()?.len();
    if len > blob.size {
        // Left by an attempt that was told another size: nothing past the blob's end is kept.
        file.set_len(blob.size)?;
        len = blob.size;
    }
    let segs = match std::fs::read_to_string(store.sidecar(&blob.hex)) {
        Ok(text) => Segments::decode(&text, blob.size, len).unwrap_or_default(),
        Err(_) => Segments::default(),
    };
    if blob.size > 0 && !lazy {
        match rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, blob.size) {
            Ok(()) | Err(rustix::io::Errno::OPNOTSUPP) | Err(rustix::io::Errno::NOSYS) => {}
            Err(e) => return Err(e.into()),
        }
    }
    write_sidecar(store, blob, &segs)?;
    Ok((file, segs))
}

pub(super) fn libc_flags() -> i32 {
    rustix::fs::OFlags::NOFOLLOW.bits() as i32
}

/// Make the verified file the blob: on disk, read-only, under its final name.
fn finish(store: &Store, blob: &Blob, file: &File) -> io::Result<()> {
    file.sync_data()?;
    file.set_permissions(std::fs::Permissions::from_mode(0o444))?;
    std::fs::rename(store.partial(&blob.hex), store.blob(&blob.hex))?;
    File::open(store.blob_dir())?.sync_all()?;
    let _ = std::fs::remove_file(store.sidecar(&blob.hex));
    let _ = std::fs::remove_file(store.writer(&blob.hex));
    Ok(())
}

fn write_sidecar(store: &Store, blob: &Blob, segs: &Segments) -> io::Result<()> {
    let path = store.sidecar(&blob.hex);
    let tmp = path.with_extension("json.tmp");
    let written = std::fs::write(&tmp, segs.encode(blob.size)).and_then(|()| std::fs::rename(&tmp, &path));
    if written.is_err() {
        // A full disk, say: no half-written temporary stays.
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

fn save(store: &Store, blob: &Blob, shared: &Shared) -> io::Result<()> {
    let segs = lock(&shared.live.segs).clone();
    write_sidecar(store, blob, &segs)
}

/// What every worker of one attempt shares.
struct Stream<'a> {
    ep: &'a Endpoint,
    store: &'a Store,
    blob: &'a Blob,
    live: &'a Arc<Live>,
    fetched: &'a AtomicU64,
    /// The same bytes, in the registry's metric.
    counted: &'a crate::metrics::ByteCounter,
    shared: &'a Arc<Shared>,
    /// A lazy volume's download.
    lazy: bool,
    /// A range receiving less than [`super::STALL_BYTES`] in this window fails.
    stall: std::time::Duration,
}

impl Stream<'_> {
    /// Should the workers stop: a failure, a cancel, or (for the demand workers and a stream
    /// waiting for its turn) every byte written, or the fill over and nothing asked for?
    fn ended(&self) -> bool {
        lock(&self.shared.failed).is_some()
            || self.live.cancel.load(Ordering::Relaxed)
            || lock(&self.live.segs).gaps(self.blob.size).is_empty()
            || (self.shared.streams_done.load(Ordering::Relaxed) && lock(&self.live.demand).is_empty())
    }

    /// Wait for a wake-up of the blob's state (or a short while).
    async fn nap(&self) {
        let _ = tokio::time::timeout(std::time::Duration::from_millis(100), self.live.wake.notified()).await;
    }

    /// Stream `n`: take ranges until none is left or a worker failed; in a lazy download, only
    /// once the fill is on.
    async fn run(&self, n: usize) {
        while self.lazy && !self.live.filling() {
            if self.ended() {
                return;
            }
            self.nap().await;
        }
        loop {
            if lock(&self.shared.failed).is_some() {
                return;
            }
            if self.live.cancel.load(Ordering::Relaxed) {
                self.fail(self.cancelled());
                return;
            }
            let Some(range) = lock(&self.shared.queue).pop_front() else { return };
            // Only what no writer claimed (a demand worker may have been there first).
            let mut pieces = lock(&self.shared.claimed).missing_in(range).into_iter();
            let Some(first) = pieces.next() else { continue };
            {
                let mut q = lock(&self.shared.queue);
                for p in pieces.rev() {
                    q.push_front(p);
                }
            }
            if let Err(e) = self.fetch(first, Role::Stream(n)).await {
                self.fail(e);
                return;
            }
        }
    }

    /// A demand worker: fetch the ranges readers wait for, until the blob is written.
    async fn demand(&self) {
        loop {
            // An index that comes once the workers ended is caught up by `mop_up`.
            if self.ended() || !self.catch_up().await {
                return;
            }
            let Some(range) = lock(&self.live.demand).pop_front() else {
                self.nap().await;
                continue;
            };
            if self.streams_reach(&range) {
                continue;
            }
            let pieces = lock(&self.shared.claimed).missing_in(range.clone());
            // Another wish for this range while it is fetched is not queued again.
            lock(&self.live.fetching).push(range.clone());
            let mut result = Ok(());
            for piece in pieces {
                self.live.demand_requests.fetch_add(1, Ordering::Relaxed);
                result = self.fetch(piece, Role::Demand).await;
                if result.is_err() {
                    break;
                }
            }
            {
                let mut f = lock(&self.live.fetching);
                if let Some(i) = f.iter().position(|r| *r == range) {
                    f.swap_remove(i);
                }
            }
            if let Err(e) = result {
                self.fail(e);
                return;
            }
        }
    }

    /// An index came: the chunks on disk are checked for it now, not at the next write. False
    /// when that failed (the download fails).
    async fn catch_up(&self) -> bool {
        if !self.live.behind() {
            return true;
        }
        if let Err(e) = self.check(&[]).await {
            let partial = self.store.partial(&self.blob.hex);
            self.fail(OciError::local(&partial, &e, &self.ep.ctx.reference, &self.blob.digest));
            return false;
        }
        true
    }

    /// After the streams and demand workers ended: fetch what an index sent to be fetched
    /// again once they were gone (an eager pull has no demand workers), and check the bytes
    /// for an index that came at the end, so the follower can hash every byte. Each chunk is
    /// fetched again at most once per index, so this ends.
    async fn mop_up(&self) {
        for _ in 0..=super::live::MAX_INDEXES {
            if lock(&self.shared.failed).is_some() {
                return;
            }
            // Cancelled with bytes missing: it ends as the workers left it (the partial file
            // saved; what the flight records decides whether it stays).
            let cancelled = self.live.cancel.load(Ordering::Relaxed);
            if cancelled && !lock(&self.live.segs).gaps(self.blob.size).is_empty() {
                return;
            }
            if !self.catch_up().await {
                return;
            }
            let gaps = lock(&self.live.segs).gaps(self.blob.size);
            if gaps.is_empty() || cancelled {
                return;
            }
            lock(&self.live.demand).clear();
            for gap in gaps {
                let pieces = lock(&self.shared.claimed).missing_in(gap);
                for piece in pieces {
                    if let Err(e) = self.fetch(piece, Role::Stream(0)).await {
                        self.fail(e);
                        return;
                    }
                }
            }
        }
    }

    /// Will a stream of the fill write `r` within [`NEAR`] bytes of where it is?
    fn streams_reach(&self, r: &Range<u64>) -> bool {
        self.live.filling()
            && lock(&self.shared.windows)
                .iter()
                .any(|(pos, end)| *pos <= r.start && r.start < pos + NEAR && r.end <= *end)
    }

    fn fail(&self, e: OciError) {
        lock(&self.shared.failed).get_or_insert(e);
        self.live.wake.notify_waiters();
    }

    fn cancelled(&self) -> OciError {
        OciError::Cancelled { digest: self.blob.digest.clone() }
    }

    /// Fetch one range and write it where it belongs.
    async fn fetch(&self, range: Range<u64>, role: Role) -> Result<(), OciError> {
        let (ep, blob) = (self.ep, self.blob);
        let whole = range.start == 0 && range.end == blob.size;
        let len = if whole { None } else { Some(range.end - range.start) };
        // A stop while the registry has not answered yet (a mirror fetching upstream, a token
        // round trip) ends the request at once: the stop's "within a second" holds here too.
        let mut body = tokio::select! {
            body = ep.range(&blob.digest, range.start, len) => body?,
            () = self.live.stopped() => return Err(self.cancelled()),
        };
        let mut end = range.end;
        // Bytes to drop before `range.start` (a registry that ignores Range sends from 0).
        let mut skip = 0;
        if body.full && !whole {
            skip = range.start;
            // A stream now fetches the rest of the blob; the queued ranges are covered.
            if role != Role::Demand {
                end = blob.size;
                lock(&self.shared.queue).clear();
            }
            tracing::warn!(registry = %ep.ctx.registry, digest = %blob.digest, "the registry ignores Range requests; reading the blob from its start");
        }
        let mut pos = range.start; // file offset of buf[0]
        let mut buf: Vec<u8> = Vec::with_capacity(WRITE_BUF);
        let mut writing: Option<Write> = None;
        let mut window = Window::new(self.stall);
        loop {
            // Registered before the look at `cancel`: a stop while the registry is silent ends
            // the read at once, not at the next chunk or the stall window's end.
            let woken = self.live.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if self.live.cancel.load(Ordering::Relaxed) {
                return self.drain(writing, buf, pos, self.cancelled()).await;
            }
            let next = tokio::select! {
                biased;
                next = window.next(&mut body.stream, &ep.ctx, &blob.digest) => next,
                // Any change of the blob's state: look at `cancel` again (reading the body is
                // cancel-safe).
                () = &mut woken => continue,
            };
            let next = match next {
                Ok(next) => next,
                Err(e) => return self.drain(writing, buf, pos, e).await,
            };
            let chunk = match next {
                None => break,
                Some(Ok(chunk)) => chunk,
                Some(Err(e)) => {
                    let err = OciError::Unreachable {
                        registry: ep.ctx.registry.clone(),
                        reference: ep.ctx.reference.clone(),
                        detail: format!("the connection broke while receiving {}: {}", blob.digest, chain(&e)),
                    };
                    return self.drain(writing, buf, pos, err).await;
                }
            };
            if !window.got(chunk.len() as u64) {
                return self.drain(writing, buf, pos, window.stalled(&ep.ctx, &blob.digest)).await;
            }
            self.fetched.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            self.counted.add(chunk.len() as u64);
            match role {
                Role::Demand => self.live.demand_bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed),
                Role::Stream(_) => self.live.fill_bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed),
            };
            let mut data: &[u8] = &chunk;
            if skip > 0 {
                let n = skip.min(data.len() as u64);
                skip -= n;
                data = &data[n as usize..];
            }
            let room = end - pos - buf.len() as u64;
            if data.len() as u64 > room {
                if end == blob.size {
                    let err = ep.size_mismatch(
                        &blob.digest,
                        format!("the registry sends more than the {} bytes the manifest says", blob.size),
                    );
                    return self.drain(writing, buf, pos, err).await;
                }
                // More than asked for: keep what was asked.
                data = &data[..room as usize];
            }
            buf.extend_from_slice(data);
            if let Role::Stream(n) = role {
                let at = pos + buf.len() as u64;
                if let Some(w) = lock(&self.shared.windows).get_mut(n) {
                    *w = (at, end);
                }
                // A demand worker wrote what comes next: stop receiving it, and queue what is
                // still missing of this range instead (bytes are not fetched twice).
                if at < end && self.lazy && lock(&self.shared.claimed).contains(at..(at + WRITE_BUF as u64).min(end)) {
                    self.wait(writing.take()).await?;
                    if !buf.is_empty() {
                        let n = buf.len() as u64;
                        self.wait(Some(self.write(std::mem::take(&mut buf), pos))).await?;
                        pos += n;
                    }
                    let rest = lock(&self.shared.claimed).missing_in(pos..end);
                    let mut q = lock(&self.shared.queue);
                    for p in rest.into_iter().rev() {
                        q.push_front(p);
                    }
                    if let Some(w) = lock(&self.shared.windows).get_mut(n) {
                        *w = (0, 0);
                    }
                    return Ok(());
                }
            }
            if buf.len() >= WRITE_BUF {
                let mut next = self.wait(writing.take()).await?.unwrap_or_else(|| Vec::with_capacity(WRITE_BUF));
                next.clear();
                let full = std::mem::replace(&mut buf, next);
                let n = full.len() as u64;
                writing = Some(self.write(full, pos));
                pos += n;
            }
            if pos + buf.len() as u64 == end {
                break;
            }
        }
        self.wait(writing.take()).await?;
        if !buf.is_empty() {
            let n = buf.len() as u64;
            self.wait(Some(self.write(buf, pos))).await?;
            pos += n;
        }
        if let Role::Stream(n) = role
            && let Some(w) = lock(&self.shared.windows).get_mut(n)
        {
            *w = (0, 0);
        }
        if pos < end {
            return Err(ep.size_mismatch(
                &blob.digest,
                format!("the registry ended the blob at byte {pos}; the manifest says {} bytes", blob.size),
            ));
        }
        Ok(())
    }

    /// Start writing, on a blocking thread, the parts of `buf` (whose first byte belongs at
    /// `pos`) that no writer claimed yet.
    fn write(&self, buf: Vec<u8>, pos: u64) -> Write {
        let shared = self.shared.clone();
        let pieces = lock(&self.shared.claimed).claim(pos..pos + buf.len() as u64);
        let to_write = pieces.clone();
        let handle = tokio::task::spawn_blocking(move || {
            for p in &to_write {
                shared.file.write_all_at(&buf[(p.start - pos) as usize..(p.end - pos) as usize], p.start)?;
            }
            Ok(buf)
        });
        Write { handle, pieces }
    }

    /// Settle `written` (with chunk indexes, check the chunks it completed, and those on disk
    /// for an index that came since the last check: [`Live::verify`]).
    async fn check(&self, written: &[Range<u64>]) -> io::Result<()> {
        if self.live.settle_unindexed(written) {
            return Ok(());
        }
        let shared = self.shared.clone();
        let written = written.to_vec();
        tokio::task::spawn_blocking(move || {
            shared.live.verify(&shared.file, &written, &|r| lock(&shared.claimed).remove(r));
        })
        .await
        .map_err(io::Error::other)
    }

    /// Wait for a write, then record what it wrote, and settle it ([`Stream::check`]). Returns
    /// the buffer for reuse.
    async fn wait(&self, w: Option<Write>) -> Result<Option<Vec<u8>>, OciError> {
        let Some(w) = w else { return Ok(None) };
        let partial = self.store.partial(&self.blob.hex);
        let local = |e: io::Error| OciError::local(&partial, &e, &self.ep.ctx.reference, &self.blob.digest);
        let buf = w.handle.await.map_err(|e| local(io::Error::other(e)))?.map_err(local)?;
        let n: u64 = w.pieces.iter().map(|p| p.end - p.start).sum();
        let covered = {
            let mut segs = lock(&self.live.segs);
            for p in &w.pieces {
                segs.insert(p.clone());
            }
            segs.covered()
        };
        self.check(&w.pieces).await.map_err(local)?;
        self.live.grew.notify_all();
        self.live.covered.store(covered, Ordering::Relaxed);
        self.live.bump();
        if self.shared.unsaved.fetch_add(n, Ordering::Relaxed) + n >= SAVE_EVERY {
            self.shared.unsaved.store(0, Ordering::Relaxed);
            let _ = save(self.store, self.blob, self.shared);
        }
        Ok(Some(buf))
    }

    /// Stop on `err`, keeping what was received: finish the write in flight and write the
    /// buffer (`pos` is its offset), so a resume does not fetch those bytes again.
    async fn drain(&self, w: Option<Write>, buf: Vec<u8>, pos: u64, err: OciError) -> Result<(), OciError> {
        self.wait(w).await?;
        if !buf.is_empty() && err.is_transient() {
            self.wait(Some(self.write(buf, pos))).await?;
        }
        Err(err)
    }
}

/// Tells the follower to stop when dropped.
struct StopOnDrop(Arc<Shared>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop.store(true, Ordering::Relaxed);
        self.0.live.grew.notify_all();
    }
}

/// A positioned write in flight: the file ranges it writes.
struct Write {
    handle: tokio::task::JoinHandle<io::Result<Vec<u8>>>,
    pieces: Vec<Range<u64>>,
}
