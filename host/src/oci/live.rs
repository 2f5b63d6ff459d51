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

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

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

/// One index's view of a blob's bytes: which chunks matched it, which failed it twice.
///
/// Each distinct index gets its own: volumes of different manifests may share a blob, and
/// each trusts only its own manifest's index. A chunk that fails an index is fetched again
/// once for everyone (unless its bytes were already hashed for the whole-blob digest); a
/// second failure makes it unreadable only for volumes checking with that index. The bytes
/// stay, so the blob still completes, and its digest decides: a blob that matches it is good
/// (the index was wrong), one that does not fails every volume.
#[derive(Debug)]
struct Check {
    index: Arc<ChunkIndex>,
    verified: Segments,
    bad: Segments,
    /// How often each chunk failed.
    failures: HashMap<u64, u32>,
    /// Chunks being hashed now (by another writer's check).
    busy: HashSet<u64>,
    /// Busy chunks whose bytes another index sent to be fetched again meanwhile: what their
    /// hash says is of bytes that are going, and is dropped.
    stale: HashSet<u64>,
    /// Every chunk on disk when the index came was queued for checking.
    caught_up: bool,
}

/// A chunk to hash for one index: which check, which of its chunks, where.
#[derive(Debug)]
struct Job {
    check: usize,
    chunk: u64,
    range: Range<u64>,
    index: Arc<ChunkIndex>,
}

/// Distinct indexes one blob is checked against at most; a volume whose index would be one
/// more reads the blob once it is complete (its digest verified).
pub const MAX_INDEXES: usize = 8;

/// One blob's live state (shared by its download and the lazy sessions reading it).
#[derive(Debug)]
pub struct Live {
    /// Bytes on disk (written, not yet necessarily hashed).
    pub covered: AtomicU64,
    /// The blob's size.
    pub size: u64,
    /// Ranges written to the partial file.
    pub segs: Mutex<Segments>,
    /// Notified as `segs` (or `settled`) grows.
    pub grew: Condvar,
    /// Ranges on disk that will not be written again: checked by every index the blob has
    /// (matched, or failed twice), or all of `segs` without one. What the follower hashes.
    pub settled: Mutex<Segments>,
    /// The indexes volumes read the blob with, each with what it verified.
    checks: Mutex<Vec<Check>>,
    /// An index past [`MAX_INDEXES`] was refused (said once).
    over_cap: AtomicBool,
    /// Ranges readers wait for, oldest first, taken by the download's demand workers.
    pub demand: Mutex<VecDeque<Range<u64>>>,
    /// Ranges demand workers are fetching now (a wish they cover is not queued again).
    pub fetching: Mutex<Vec<Range<u64>>>,
    /// Notified when `demand` gets a range, the fill is switched on, an index comes, or the
    /// download should stop.
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
            settled: Mutex::new(Segments::default()),
            checks: Mutex::new(Vec::new()),
            over_cap: AtomicBool::new(false),
            demand: Mutex::new(VecDeque::new()),
            fetching: Mutex::new(Vec::new()),
            wake: tokio::sync::Notify::new(),
            fill: AtomicBool::new(false),
            cancel: AtomicBool::new(false),
            served: AtomicBool::new(false),
            demand_requests: AtomicU64::new(0),
            demand_bytes: AtomicU64::new(0),
            fill_bytes: AtomicU64::new(0),
            changed,
        }
    }

    /// Ask the download to stop (no volume wants the blob any more).
    pub fn stop(&self) {
        self.cancel.store(true, Ordering::Relaxed);
        self.wake.notify_waiters();
    }

    /// Resolves once [`Live::stop`] was called (looked at on each wake-up, and every 100 ms).
    pub async fn stopped(&self) {
        while !self.cancel.load(Ordering::Relaxed) {
            let _ = tokio::time::timeout(std::time::Duration::from_millis(100), self.wake.notified()).await;
        }
    }

    /// Tell the sessions something changed.
    pub fn bump(&self) {
        if let Some(c) = &self.changed {
            c.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// A volume reads the blob with `index`: its chunks are checked against it (those on disk
    /// already at the download's next step). An index given before is kept once; past
    /// [`MAX_INDEXES`] none is added (false).
    pub fn add_index(&self, index: Arc<ChunkIndex>) -> bool {
        {
            let mut checks = lock(&self.checks);
            if checks.iter().any(|c| same(&c.index, &index)) {
                return true;
            }
            if checks.len() >= MAX_INDEXES {
                if !self.over_cap.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        indexes = checks.len(),
                        "a blob is read with more distinct chunk indexes than are checked; volumes of another index read it once it is complete"
                    );
                }
                return false;
            }
            checks.push(Check {
                index,
                verified: Segments::default(),
                bad: Segments::default(),
                failures: HashMap::new(),
                busy: HashSet::new(),
                stale: HashSet::new(),
                caught_up: false,
            });
        }
        self.wake.notify_waiters();
        true
    }

    /// An index came whose chunks on disk are not checked yet ([`Live::verify`] with nothing
    /// written checks them).
    pub fn behind(&self) -> bool {
        lock(&self.checks).iter().any(|c| !c.caught_up)
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

    /// `f` of the check of `index`, or `default` when the blob has none for it.
    fn with_check<T>(&self, index: &ChunkIndex, default: T, f: impl FnOnce(&Check) -> T) -> T {
        lock(&self.checks).iter().find(|c| same(&c.index, index)).map_or(default, f)
    }

    /// The ranges a reader checking with `index` may read now: the chunks that matched it (none
    /// before the index was added), or without an index what is on disk.
    pub fn readable(&self, index: Option<&ChunkIndex>) -> Vec<(u64, u64)> {
        match index {
            Some(i) => self.with_check(i, Vec::new(), |c| c.verified.spans()),
            None => lock(&self.segs).spans(),
        }
    }

    /// The ranges that failed `index` twice (nothing without an index).
    pub fn bad_spans(&self, index: Option<&ChunkIndex>) -> Vec<(u64, u64)> {
        index.map_or_else(Vec::new, |i| self.with_check(i, Vec::new(), |c| c.bad.spans()))
    }

    /// Bytes whose chunk matched `index` (0 without an index).
    pub fn verified_bytes(&self, index: Option<&ChunkIndex>) -> u64 {
        index.map_or(0, |i| self.with_check(i, 0, |c| c.verified.covered()))
    }

    /// The ranges some index failed twice, each with its chunk size (what a completed blob's
    /// digest overrules).
    pub fn disagreements(&self) -> Vec<(u64, Vec<(u64, u64)>)> {
        lock(&self.checks).iter().map(|c| (c.index.chunk, c.bad.spans())).filter(|(_, bad)| !bad.is_empty()).collect()
    }

    /// Check the chunks that `written` completed against every index, reading them back from
    /// `file` (and, for an index that came since the last call, every chunk on disk, until none
    /// is behind when this returns): a match is verified; a first mismatch is written again (it
    /// goes back to the demand queue, and `unclaim` lets a writer take it) unless its bytes are
    /// settled or another index verified them; otherwise it is bad for that index. Then the
    /// bytes every index checked are settled. Blocking.
    pub fn verify(&self, file: &File, written: &[Range<u64>], unclaim: &dyn Fn(Range<u64>)) {
        let mut todo = written.to_vec();
        loop {
            todo = self.verify_pass(file, &todo, unclaim);
            if todo.is_empty() && !self.behind() {
                return;
            }
        }
    }

    /// Settle `written` if the blob has no index (nothing to hash): true. False when it has
    /// one, and [`Live::verify`] must run (on a blocking thread).
    pub fn settle_unindexed(&self, written: &[Range<u64>]) -> bool {
        let checks = lock(&self.checks);
        if !checks.is_empty() {
            return false;
        }
        self.settle(written.to_vec());
        true
    }

    /// One round of [`Live::verify`]. Returns the ranges to check again: chunks whose hash was
    /// dropped as stale while their new bytes were already written (the write's own check
    /// skipped them, busy).
    fn verify_pass(&self, file: &File, written: &[Range<u64>], unclaim: &dyn Fn(Range<u64>)) -> Vec<Range<u64>> {
        let Some((jobs, scope)) = self.jobs(written) else { return Vec::new() };
        let mut buf = Vec::new();
        let results: Vec<bool> = jobs
            .iter()
            .map(|j| {
                buf.resize((j.range.end - j.range.start) as usize, 0);
                file.read_exact_at(&mut buf, j.range.start).is_ok() && j.index.matches(j.chunk, &buf)
            })
            .collect();
        self.apply(&jobs, results, scope, unclaim)
    }

    /// The chunks `written` completed (or, for an index behind, every chunk on disk) that an
    /// index has not checked, claimed (busy) so a concurrent call leaves them alone, and the
    /// ranges whose settling to reconsider. None: no index (`written` is settled).
    fn jobs(&self, written: &[Range<u64>]) -> Option<(Vec<Job>, Vec<Range<u64>>)> {
        let mut jobs = Vec::new();
        let mut scope: Vec<Range<u64>> = written.to_vec();
        {
            let mut checks = lock(&self.checks);
            if checks.is_empty() {
                self.settle(written.to_vec());
                return None;
            }
            let segs = lock(&self.segs);
            for (n, c) in checks.iter_mut().enumerate() {
                let ranges = if c.caught_up {
                    written.to_vec()
                } else {
                    c.caught_up = true;
                    scope.extend(segs.ranges().iter().cloned());
                    segs.ranges().to_vec()
                };
                for r in &ranges {
                    for k in c.index.chunks_of(r) {
                        let range = c.index.range(k, self.size);
                        if range.is_empty()
                            || c.busy.contains(&k)
                            || c.verified.contains(range.clone())
                            || c.bad.contains(range.clone())
                            || !segs.contains(range.clone())
                        {
                            continue;
                        }
                        c.busy.insert(k);
                        jobs.push(Job { check: n, chunk: k, range, index: c.index.clone() });
                    }
                }
            }
        }
        Some((jobs, scope))
    }

    /// Record what hashing `jobs` found (`results`, in order), send first mismatches to be
    /// fetched again, and settle what every index checked within `scope`. Returns the ranges
    /// to check again (see [`Live::verify_pass`]).
    fn apply(
        &self,
        jobs: &[Job],
        results: Vec<bool>,
        mut scope: Vec<Range<u64>>,
        unclaim: &dyn Fn(Range<u64>),
    ) -> Vec<Range<u64>> {
        let mut checks = lock(&self.checks);
        // Matches first, so that a mismatch sees what every index verified.
        let mut failed = Vec::new();
        let mut recheck = Vec::new();
        for (Job { check: n, chunk: k, range, .. }, ok) in jobs.iter().zip(results) {
            let c = &mut checks[*n];
            c.busy.remove(k);
            if c.stale.remove(k) {
                // Its bytes were sent to be fetched again: checked when they are written, by
                // that write's check, or here if it came while this chunk was busy.
                if lock(&self.segs).contains(range.clone()) {
                    recheck.push(range.clone());
                }
                continue;
            }
            scope.push(range.clone());
            if ok {
                c.verified.insert(range.clone());
            } else {
                failed.push((*n, *k, range.clone()));
            }
        }
        let mut again: Vec<Range<u64>> = Vec::new();
        for (n, k, range) in failed {
            let failures = {
                let f = checks[n].failures.entry(k).or_insert(0);
                *f += 1;
                *f
            };
            // Bytes the follower may have hashed, or that another index verified (its volumes
            // may be reading them now), are never written again.
            let hashed = !lock(&self.settled).within(range.clone()).is_empty();
            let vouched =
                checks.iter().enumerate().any(|(m, o)| m != n && !o.verified.within(range.clone()).is_empty());
            if failures == 1 && !hashed && !vouched {
                tracing::warn!(chunk = k, start = range.start, "a chunk does not match an index; fetching it again");
                again.push(range);
            } else {
                tracing::error!(
                    chunk = k,
                    start = range.start,
                    "a chunk does not match an index twice; reads of it with that index fail until the whole blob matches its digest"
                );
                checks[n].bad.insert(range);
            }
        }
        for r in &again {
            for c in checks.iter_mut() {
                c.verified.remove(r.clone());
                for k in c.index.chunks_of(r) {
                    if c.busy.contains(&k) {
                        c.stale.insert(k);
                    }
                }
            }
            lock(&self.segs).remove(r.clone());
            unclaim(r.clone());
            lock(&self.demand).push_front(r.clone());
        }
        // What every index checked is settled; a range is settled once its chunks under every
        // index are (so the scope reaches out to the chunk bounds).
        let mut settled = Vec::new();
        {
            let segs = lock(&self.segs);
            for r in &scope {
                let (start, end) = checks.iter().fold((r.start, r.end), |(s, e), c| {
                    let ks = c.index.chunks_of(r);
                    (s.min(ks.start * c.index.chunk), e.max((ks.end * c.index.chunk).min(self.size)))
                });
                let mut pieces = segs.within(start..end);
                for c in checks.iter() {
                    let mut kept = Segments::default();
                    for p in &pieces {
                        for q in c.verified.within(p.clone()).into_iter().chain(c.bad.within(p.clone())) {
                            kept.insert(q);
                        }
                    }
                    pieces = kept.ranges().to_vec();
                }
                settled.extend(pieces);
            }
        }
        // Under the checks' lock: an index added now finds these settled.
        self.settle(settled);
        drop(checks);
        if !again.is_empty() {
            self.wake.notify_waiters();
        }
        if !jobs.is_empty() {
            self.bump();
        }
        recheck
    }

    /// `ranges` will not be written again: the follower may hash them (called with the checks
    /// locked).
    fn settle(&self, ranges: Vec<Range<u64>>) {
        if ranges.is_empty() {
            return;
        }
        {
            let mut settled = lock(&self.settled);
            for r in ranges {
                settled.insert(r);
            }
        }
        self.grew.notify_all();
    }

    /// Start over (a new download, `segs` read from disk again): nothing is settled until
    /// checked again, and what the indexes found holds only for bytes still on disk.
    pub fn unsettle(&self) {
        let mut checks = lock(&self.checks);
        let segs = lock(&self.segs).clone();
        let on_disk = |s: &Segments| {
            let mut kept = Segments::default();
            for r in segs.ranges() {
                for q in s.within(r.clone()) {
                    kept.insert(q);
                }
            }
            kept
        };
        for c in checks.iter_mut() {
            c.verified = on_disk(&c.verified);
            c.bad = on_disk(&c.bad);
        }
        *lock(&self.settled) = Segments::default();
    }

    /// How many chunks failed an index so far (each counts once per failure).
    #[cfg(test)]
    pub fn chunk_failures(&self) -> u64 {
        lock(&self.checks).iter().flat_map(|c| c.failures.values()).map(|n| u64::from(*n)).sum()
    }
}

/// The same index (the same one given again, or an equal one another volume loaded).
fn same(a: &Arc<ChunkIndex>, b: &ChunkIndex) -> bool {
    std::ptr::eq(&**a, b) || **a == *b
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

    fn blob_file(dir: &tempfile::TempDir, bytes: &[u8]) -> File {
        let path = dir.path().join("blob");
        std::fs::File::create(&path).unwrap().write_all(bytes).unwrap();
        File::open(&path).unwrap()
    }

    /// A blob of `size` bytes on disk, the right index of it in `right`-byte chunks, and an
    /// index in `lie`-byte chunks that is wrong about chunk `wrong`.
    fn blob_with_a_wrong_index(
        size: u32,
        right: u64,
        lie: u64,
        wrong: usize,
    ) -> (tempfile::TempDir, File, Arc<ChunkIndex>, Arc<ChunkIndex>) {
        let good: Vec<u8> = (0..size).map(|i| (i * 7) as u8).collect();
        let dir = tempfile::tempdir().unwrap();
        let file = blob_file(&dir, &good);
        let mut wrong_index = index_of(&good, lie);
        wrong_index.hashes[wrong] = [0; 32];
        (dir, file, Arc::new(index_of(&good, right)), Arc::new(wrong_index))
    }

    #[test]
    fn chunks_are_verified_once_written_and_a_bad_one_is_fetched_again_then_refused() {
        let good: Vec<u8> = (0..100u32).map(|i| i as u8).collect();
        let index = Arc::new(index_of(&good, 32));
        let dir = tempfile::tempdir().unwrap();
        let mut bad = good.clone();
        bad[40] ^= 1; // chunk 1 is wrong on disk
        let file = blob_file(&dir, &bad);
        let live = Live::new(100, None);
        live.add_index(index.clone());
        lock(&live.segs).insert(0..100);
        let unclaimed = Mutex::new(Vec::new());
        let unclaim = |r: Range<u64>| unclaimed.lock().unwrap().push(r);
        live.verify(&file, std::slice::from_ref(&(0..100)), &unclaim);
        assert_eq!(live.readable(Some(&index)), [(0, 32), (64, 100)], "chunk 1 is not readable");
        assert_eq!(lock(&live.segs).spans(), [(0, 32), (64, 100)], "and is to be written again");
        assert_eq!(lock(&live.settled).spans(), [(0, 32), (64, 100)], "nor hashed for the digest yet");
        assert_eq!(*unclaimed.lock().unwrap(), vec![32..64]);
        assert_eq!(lock(&live.demand).front(), Some(&(32..64)), "fetched again before anything else");
        // Written again, still wrong: bad for this index; the bytes stay for the blob's digest
        // to decide.
        lock(&live.segs).insert(32..64);
        live.verify(&file, std::slice::from_ref(&(32..64)), &unclaim);
        assert_eq!(live.bad_spans(Some(&index)), [(32, 64)]);
        assert_eq!(live.readable(Some(&index)), [(0, 32), (64, 100)]);
        assert_eq!(lock(&live.settled).spans(), [(0, 100)], "the follower hashes it all");
        assert_eq!(live.disagreements(), [(32, vec![(32, 64)])]);
        assert_eq!(live.chunk_failures(), 2);
        // Right the second time around (another blob): verified.
        let live = Live::new(100, None);
        live.add_index(Arc::new(index_of(&good, 32)));
        let file = blob_file(&dir, &good);
        lock(&live.segs).insert(0..70);
        live.verify(&file, std::slice::from_ref(&(0..70)), &unclaim);
        assert_eq!(live.readable(Some(&index)), [(0, 64)], "only whole chunks");
        assert_eq!(live.verified_bytes(Some(&index)), 64);
        assert_eq!(lock(&live.settled).spans(), [(0, 64)], "the chunk not yet whole is not settled");
    }

    #[test]
    fn a_wrong_index_only_fails_the_volumes_that_read_with_it() {
        // The wrong one is wrong about 64..128; the right index's chunks are 32 bytes.
        let (_dir, file, right, lie) = blob_with_a_wrong_index(128, 32, 64, 1);
        let live = Live::new(128, None);
        live.add_index(lie.clone());
        live.add_index(right.clone());
        live.add_index(Arc::new((*right).clone())); // the same index again: one check
        assert_eq!(lock(&live.checks).len(), 2);
        let unclaim = |_: Range<u64>| panic!("the right index vouches for the bytes: nothing is fetched again");
        lock(&live.segs).insert(0..128);
        live.verify(&file, std::slice::from_ref(&(0..128)), &unclaim);
        // Readable with the right index and without one; not with the wrong one, until the
        // blob is complete and its digest decides.
        assert_eq!(live.readable(Some(&right)), [(0, 128)]);
        assert_eq!(live.readable(None), [(0, 128)]);
        assert_eq!(live.readable(Some(&lie)), [(0, 64)]);
        assert_eq!(live.bad_spans(Some(&lie)), [(64, 128)]);
        assert!(live.bad_spans(Some(&right)).is_empty());
        assert_eq!(lock(&live.settled).spans(), [(0, 128)], "the blob completes, for its digest to decide");
        // An index no volume added reads nothing.
        assert!(live.readable(Some(&ChunkIndex { chunk: 128, hashes: vec![[9; 32]] })).is_empty());
    }

    #[test]
    fn an_index_that_comes_late_checks_what_is_on_disk_and_never_rewrites_hashed_bytes() {
        let good: Vec<u8> = (0..96u32).map(|i| (i * 3) as u8).collect();
        let dir = tempfile::tempdir().unwrap();
        let file = blob_file(&dir, &good);
        let live = Live::new(96, None);
        let unclaim = |_: Range<u64>| {};
        lock(&live.segs).insert(0..64);
        live.verify(&file, std::slice::from_ref(&(0..64)), &unclaim);
        assert_eq!(lock(&live.settled).spans(), [(0, 64)], "without an index, what is written is settled");
        let mut late = index_of(&good, 32);
        late.hashes[0] = [1; 32];
        let late = Arc::new(late);
        live.add_index(late.clone());
        assert!(live.behind());
        // Nothing written: the bytes on disk are checked. Chunk 0 was hashed already: it is not
        // written again, only bad for this index.
        live.verify(&file, &[], &unclaim);
        assert!(!live.behind());
        assert_eq!(live.readable(Some(&late)), [(32, 64)]);
        assert_eq!(live.bad_spans(Some(&late)), [(0, 32)]);
        assert_eq!(lock(&live.segs).spans(), [(0, 64)]);
        assert!(lock(&live.demand).is_empty());
    }

    #[test]
    fn a_chunk_another_index_verified_is_never_fetched_again() {
        let (_dir, file, right, lie) = blob_with_a_wrong_index(64, 32, 32, 1);
        let live = Live::new(64, None);
        let unclaim = |_: Range<u64>| panic!("nothing is fetched again");
        live.add_index(right.clone());
        lock(&live.segs).insert(0..64);
        live.verify(&file, std::slice::from_ref(&(0..64)), &unclaim);
        assert_eq!(live.readable(Some(&right)), [(0, 64)]);
        // The wrong index comes once the right one verified the chunk: its volumes may be
        // reading it, so it stays; only the wrong index's volumes are refused it.
        live.add_index(lie.clone());
        live.verify(&file, &[], &unclaim);
        assert_eq!(live.bad_spans(Some(&lie)), [(32, 64)]);
        assert_eq!(live.readable(Some(&right)), [(0, 64)]);
        assert!(lock(&live.demand).is_empty());
    }

    #[test]
    fn a_fetch_again_makes_another_indexs_check_in_flight_stale() {
        let (_dir, file, right, lie) = blob_with_a_wrong_index(64, 32, 64, 0);
        let live = Live::new(64, None);
        live.add_index(lie.clone());
        live.add_index(right.clone());
        // Another writer's call is hashing both chunks of the right index now.
        lock(&live.checks)[1].busy.extend([0, 1]);
        lock(&live.checks)[1].caught_up = true;
        lock(&live.segs).insert(0..64);
        live.verify(&file, std::slice::from_ref(&(0..64)), &|_| {});
        // The wrong index sent 0..64 to be fetched again: what the other call hashed is of
        // bytes that are going.
        assert_eq!(lock(&live.segs).spans(), Vec::<(u64, u64)>::new());
        assert_eq!(lock(&live.checks)[1].stale, HashSet::from([0, 1]));
        assert!(live.readable(Some(&right)).is_empty());
    }

    /// One index's hash is in flight while another sends the bytes to be fetched again and
    /// they are written (their write's check skipped the busy chunk): the stale hash is
    /// dropped and the chunk checked again, so it settles and the blob can complete.
    #[test]
    fn a_stale_hash_of_bytes_already_written_again_is_checked_again() {
        let good: Vec<u8> = (0..64u32).map(|i| (i * 11) as u8).collect();
        let right = Arc::new(index_of(&good, 64));
        let dir = tempfile::tempdir().unwrap();
        let file = blob_file(&dir, &good);
        let live = Live::new(64, None);
        live.add_index(right.clone());
        lock(&live.segs).insert(0..64);
        let (jobs, scope) = live.jobs(std::slice::from_ref(&(0..64))).unwrap();
        assert_eq!(jobs.iter().map(|j| (j.check, j.chunk, j.range.clone())).collect::<Vec<_>>(), [(0, 0, 0..64)]);
        // Meanwhile: another index sent the bytes away, and they came back.
        lock(&live.checks)[0].stale.insert(0);
        live.verify(&file, std::slice::from_ref(&(0..64)), &|_| {});
        assert!(live.readable(Some(&right)).is_empty(), "the busy chunk was skipped");
        let recheck = live.apply(&jobs, vec![true], scope, &|_| {});
        assert_eq!(recheck, std::slice::from_ref(&(0..64)), "the stale hash is dropped, the chunk to be checked again");
        assert!(live.readable(Some(&right)).is_empty());
        live.verify(&file, &recheck, &|_| {});
        assert_eq!(live.readable(Some(&right)), [(0, 64)]);
        assert_eq!(lock(&live.settled).spans(), [(0, 64)]);
    }

    #[test]
    fn no_more_than_max_indexes_are_checked() {
        let live = Live::new(64, None);
        for i in 0..MAX_INDEXES {
            assert!(live.add_index(Arc::new(ChunkIndex { chunk: 64, hashes: vec![[i as u8; 32]] })));
        }
        let one_more = Arc::new(ChunkIndex { chunk: 64, hashes: vec![[0xff; 32]] });
        assert!(!live.add_index(one_more.clone()));
        assert!(live.readable(Some(&one_more)).is_empty(), "it reads the blob once complete");
        assert!(live.add_index(Arc::new(ChunkIndex { chunk: 64, hashes: vec![[0; 32]] })), "one it has");
    }

    #[test]
    fn without_an_index_what_is_written_is_readable_and_wishes_are_queued_once() {
        let live = Live::new(10, None);
        lock(&live.segs).insert(2..5);
        assert_eq!(live.readable(None), [(2, 5)]);
        live.want(0..4);
        live.want(1..3);
        live.want(5..9);
        assert_eq!(lock(&live.demand).iter().cloned().collect::<Vec<_>>(), [0..4, 5..9]);
    }
}
