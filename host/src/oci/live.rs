//! What the node knows of one blob while it is being downloaded, and, for the lazy volumes that
//! read it, between downloads: which byte ranges are on disk, which of them passed their
//! chunk's hash (when the artifact has a chunk index), which failed it twice, the ranges
//! readers wait for, whether the background fill may run, and how many bytes came on demand
//! and how many by the fill.
//!
//! A download ([`super::download`]) writes the ranges here as its writes return; a lazy
//! volume's session reads them to tell its FUSE server what can be read, and pushes the ranges
//! the server's readers wait for. Every change bumps the cache's change counter
//! ([`Live::bump`]), which the sessions watch.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use sha2::Digest as _;

use super::segments::Segments;

/// The sha256 of every chunk of one blob: what an indexed lazy volume checks each chunk's
/// bytes against before a reader gets them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkIndex {
    /// The chunk size (the last chunk may be shorter).
    pub chunk: u64,
    /// One hash per chunk, in order.
    pub hashes: Vec<[u8; 32]>,
}

impl ChunkIndex {
    /// The byte range of chunk `k` of a blob of `size` bytes.
    pub fn range(&self, k: u64, size: u64) -> Range<u64> {
        (k * self.chunk).min(size)..((k + 1) * self.chunk).min(size)
    }

    /// The chunks overlapping `r`.
    pub fn chunks_of(&self, r: &Range<u64>) -> Range<u64> {
        if r.start >= r.end {
            return 0..0;
        }
        r.start / self.chunk..(r.end - 1) / self.chunk + 1
    }

    /// Do `bytes` hash to chunk `k`'s entry?
    pub fn matches(&self, k: u64, bytes: &[u8]) -> bool {
        self.hashes.get(k as usize).is_some_and(|h| sha2::Sha256::digest(bytes).as_slice() == h)
    }
}

/// One blob's live state (shared by its download and the lazy sessions reading it).
#[derive(Debug)]
pub struct Live {
    /// Bytes on disk (written, not yet necessarily hashed).
    pub covered: AtomicU64,
    /// The blob's size.
    pub size: u64,
    /// Ranges written to the partial file (what the follower hashes without an index).
    pub segs: Mutex<Segments>,
    /// Notified as `segs` (or `verified`) grows.
    pub grew: Condvar,
    /// Chunks whose bytes matched the index (readable for an indexed volume; what the follower
    /// hashes when there is an index).
    pub verified: Mutex<Segments>,
    /// Chunks that failed the index twice: reads of them fail.
    pub bad: Mutex<Segments>,
    index: OnceLock<Arc<ChunkIndex>>,
    /// Ranges readers wait for, oldest first, taken by the download's demand workers.
    pub demand: Mutex<VecDeque<Range<u64>>>,
    /// Ranges demand workers are fetching now (a wish they cover is not queued again).
    pub fetching: Mutex<Vec<Range<u64>>>,
    /// Notified when `demand` gets a range, the fill is switched on, or the download should stop.
    pub wake: tokio::sync::Notify,
    /// The background fill may run (an eager pull always; a lazy one once its turn came).
    fill: AtomicBool,
    /// Stop the download (no volume wants the blob any more).
    pub cancel: AtomicBool,
    /// A lazy server was handed the partial file: its inode stays (a failed download keeps it
    /// for the next attempt, unless its bytes are wrong), or the server would read a file no
    /// later write reaches.
    pub served: AtomicBool,
    /// Requests made for readers, and their bytes; bytes the fill fetched.
    pub demand_requests: AtomicU64,
    pub demand_bytes: AtomicU64,
    pub fill_bytes: AtomicU64,
    /// How often each chunk failed its hash.
    failures: Mutex<HashMap<u64, u32>>,
    /// The cache's change counter.
    changed: Option<Arc<tokio::sync::watch::Sender<u64>>>,
}

impl Live {
    /// A blob of `size` bytes with nothing known yet; changes bump `changed`.
    pub fn new(size: u64, changed: Option<Arc<tokio::sync::watch::Sender<u64>>>) -> Live {
        Live {
            covered: AtomicU64::new(0),
            size,
            segs: Mutex::new(Segments::default()),
            grew: Condvar::new(),
            verified: Mutex::new(Segments::default()),
            bad: Mutex::new(Segments::default()),
            index: OnceLock::new(),
            demand: Mutex::new(VecDeque::new()),
            fetching: Mutex::new(Vec::new()),
            wake: tokio::sync::Notify::new(),
            fill: AtomicBool::new(false),
            cancel: AtomicBool::new(false),
            served: AtomicBool::new(false),
            demand_requests: AtomicU64::new(0),
            demand_bytes: AtomicU64::new(0),
            fill_bytes: AtomicU64::new(0),
            failures: Mutex::new(HashMap::new()),
            changed,
        }
    }

    /// Tell the sessions something changed.
    pub fn bump(&self) {
        if let Some(c) = &self.changed {
            c.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// The chunk index, if the blob has one.
    pub fn index(&self) -> Option<&Arc<ChunkIndex>> {
        self.index.get()
    }

    /// Give the blob its chunk index (the first one given stays).
    pub fn set_index(&self, index: Arc<ChunkIndex>) {
        let _ = self.index.set(index);
    }

    /// Let the background fill run.
    pub fn fill_on(&self) {
        if !self.fill.swap(true, Ordering::AcqRel) {
            self.wake.notify_waiters();
        }
    }

    pub fn filling(&self) -> bool {
        self.fill.load(Ordering::Acquire)
    }

    /// A reader waits for `r`: the download's demand workers fetch it before the fill gets
    /// there (ranges already asked for are not queued twice).
    pub fn want(&self, r: Range<u64>) {
        if r.start >= r.end {
            return;
        }
        {
            if lock(&self.fetching).iter().any(|f| f.start <= r.start && r.end <= f.end) {
                return;
            }
            let mut q = lock(&self.demand);
            if q.iter().any(|q| q.start <= r.start && r.end <= q.end) {
                return;
            }
            q.push_back(r);
            // Bounded: a flood of reads only keeps the most recent wishes.
            while q.len() > 1024 {
                q.pop_front();
            }
        }
        self.wake.notify_waiters();
    }

    /// The ranges a reader may read now: the verified chunks when the blob has an index, else
    /// what is on disk.
    pub fn readable(&self) -> Vec<(u64, u64)> {
        match self.index() {
            Some(_) => lock(&self.verified).spans(),
            None => lock(&self.segs).spans(),
        }
    }

    /// The ranges that failed verification twice.
    pub fn bad_spans(&self) -> Vec<(u64, u64)> {
        lock(&self.bad).spans()
    }

    /// Bytes whose chunk hash matched (0 without an index).
    pub fn verified_bytes(&self) -> u64 {
        lock(&self.verified).covered()
    }

    /// Check every chunk that `written` completed against the index, reading it back from
    /// `file`: a match is verified; a first mismatch is forgotten (written again: it goes back
    /// to the demand queue, and `unclaim` lets a writer take it), a second one is bad. Blocking.
    /// Without an index, nothing to do.
    pub fn verify(&self, file: &File, written: &[Range<u64>], unclaim: &dyn Fn(Range<u64>)) {
        let Some(index) = self.index().cloned() else { return };
        let mut changed = false;
        for r in written {
            for k in index.chunks_of(r) {
                let range = index.range(k, self.size);
                if range.is_empty() || lock(&self.verified).contains(range.clone()) {
                    continue;
                }
                if !lock(&self.segs).contains(range.clone()) {
                    continue;
                }
                let mut buf = vec![0u8; (range.end - range.start) as usize];
                let ok = file.read_exact_at(&mut buf, range.start).is_ok() && index.matches(k, &buf);
                changed = true;
                if ok {
                    lock(&self.verified).insert(range);
                    continue;
                }
                lock(&self.segs).remove(range.clone());
                unclaim(range.clone());
                let failures = {
                    let mut f = lock(&self.failures);
                    let n = f.entry(k).or_insert(0);
                    *n += 1;
                    *n
                };
                if failures == 1 {
                    tracing::warn!(
                        chunk = k,
                        start = range.start,
                        "a chunk does not match the index; fetching it again"
                    );
                    lock(&self.demand).push_front(range);
                    self.wake.notify_waiters();
                } else {
                    tracing::error!(
                        chunk = k,
                        start = range.start,
                        "a chunk does not match the index twice; reads of it fail"
                    );
                    lock(&self.bad).insert(range);
                }
            }
        }
        if changed {
            self.grew.notify_all();
            self.bump();
        }
    }

    /// How many chunks failed the index so far (each counts once per failure).
    #[cfg(test)]
    pub fn chunk_failures(&self) -> u64 {
        lock(&self.failures).values().map(|n| u64::from(*n)).sum()
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn index_of(data: &[u8], chunk: u64) -> ChunkIndex {
        let hashes =
            data.chunks(chunk as usize).map(|c| <[u8; 32]>::from(sha2::Sha256::digest(c))).collect::<Vec<[u8; 32]>>();
        ChunkIndex { chunk, hashes }
    }

    #[test]
    fn chunks_are_verified_once_written_and_a_bad_one_is_fetched_again_then_refused() {
        let good: Vec<u8> = (0..100u32).map(|i| i as u8).collect();
        let index = Arc::new(index_of(&good, 32));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("blob");
        let mut bad = good.clone();
        bad[40] ^= 1; // chunk 1 is wrong on disk
        std::fs::File::create(&path).unwrap().write_all(&bad).unwrap();
        let file = File::open(&path).unwrap();
        let live = Live::new(100, None);
        live.set_index(index);
        lock(&live.segs).insert(0..100);
        let unclaimed = Mutex::new(Vec::new());
        let unclaim = |r: Range<u64>| unclaimed.lock().unwrap().push(r);
        live.verify(&file, std::slice::from_ref(&(0..100)), &unclaim);
        assert_eq!(live.readable(), [(0, 32), (64, 100)], "chunk 1 is not readable");
        assert_eq!(lock(&live.segs).spans(), [(0, 32), (64, 100)], "and is to be written again");
        assert_eq!(*unclaimed.lock().unwrap(), vec![32..64]);
        assert_eq!(lock(&live.demand).front(), Some(&(32..64)), "fetched again before anything else");
        // Written again, still wrong: bad.
        lock(&live.segs).insert(32..64);
        live.verify(&file, std::slice::from_ref(&(32..64)), &unclaim);
        assert_eq!(live.bad_spans(), [(32, 64)]);
        assert_eq!(live.chunk_failures(), 2);
        // Right the second time around (another blob): verified.
        let live = Live::new(100, None);
        live.set_index(Arc::new(index_of(&good, 32)));
        std::fs::File::create(&path).unwrap().write_all(&good).unwrap();
        lock(&live.segs).insert(0..70);
        live.verify(&File::open(&path).unwrap(), std::slice::from_ref(&(0..70)), &unclaim);
        assert_eq!(live.readable(), [(0, 64)], "only whole chunks");
        assert_eq!(live.verified_bytes(), 64);
    }

    #[test]
    fn without_an_index_what_is_written_is_readable_and_wishes_are_queued_once() {
        let live = Live::new(10, None);
        lock(&live.segs).insert(2..5);
        assert_eq!(live.readable(), [(2, 5)]);
        live.want(0..4);
        live.want(1..3);
        live.want(5..9);
        assert_eq!(lock(&live.demand).iter().cloned().collect::<Vec<_>>(), [0..4, 5..9]);
    }
}
