//! The follower of a download (`download.rs`): one blocking thread that hashes the partial
//! file's completed prefix as the streams write it, starts the writeback of what it hashed,
//! and runs with a raised priority while it does: a download ends when its hash does, so where
//! the cores are short the hash keeps pace with the streams instead of finishing long after
//! their last byte.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use sha2::Digest as _;

use super::segments::Segments;

/// The follower's read size.
const HASH_BUF: usize = 4 << 20;
/// How much the follower lowers its thread's nice value while it hashes (a thread with a nice
/// value 5 below another's gets about three times its share of a busy core). Pulling 1 GiB
/// into a tmpfs cache on 2 cores (`BENCH_TMP=/dev/shm bench/pull.sh`), the hash ended
/// 1.37–1.41 s after the first request without it, 0.42–0.47 s after the last byte was
/// received; with it, 1.17–1.21 s, 0.06–0.13 s after. 10 starved the streams instead
/// (1.23–1.62 s). Within a cgroup's share only: other pods' CPU is not taken.
const HASH_NICE: i32 = 5;

/// What the follower watches: the file, its written ranges (and their condition variable,
/// notified as they grow), and the flag that tells it to stop.
pub(super) struct Watched<'a> {
    pub file: &'a File,
    pub segs: &'a Mutex<Segments>,
    pub grew: &'a Condvar,
    pub stop: &'a AtomicBool,
}

/// Hash the file's completed prefix as it grows, up to `size` bytes. `Ok(None)`: told to stop
/// first.
pub(super) fn follow(shared: Watched<'_>, size: u64) -> io::Result<Option<String>> {
    let _raised = Raised::for_follower();
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; HASH_BUF.min(size.max(1) as usize)];
    let mut at = 0u64;
    while at < size {
        let ready = {
            let mut segs = shared.segs.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if shared.stop.load(Ordering::Relaxed) {
                    return Ok(None);
                }
                let p = segs.prefix();
                if p > at {
                    break p;
                }
                segs = shared
                    .grew
                    .wait_timeout(segs, Duration::from_millis(500))
                    .map(|(g, _)| g)
                    .unwrap_or_else(|p| p.into_inner().0);
            }
        };
        while at < ready {
            if shared.stop.load(Ordering::Relaxed) {
                return Ok(None);
            }
            let n = (ready - at).min(buf.len() as u64) as usize;
            shared.file.read_exact_at(&mut buf[..n], at)?;
            hasher.update(&buf[..n]);
            // The hashed bytes' writeback starts now, so the fsync before the rename finds little
            // left: measured on a 1 GiB blob here, that fsync went from ~0.5 s to a few ms.
            crate::unpriv::sys::start_writeback(shared.file, at, n as u64);
            at += n as u64;
        }
    }
    Ok(Some(hex::encode(hasher.finalize())))
}

/// Followers running with a raised priority now.
static RAISED: AtomicUsize = AtomicUsize::new(0);

/// The calling thread's nice value lowered by some steps (its priority raised), put back when
/// dropped: the thread is one of the runtime's blocking pool, which runs other work next.
/// Best effort: without the privilege to lower it (`CAP_SYS_NICE`), nothing changes.
pub(super) struct Raised {
    thread: rustix::process::Pid,
    before: i32,
    /// Counted in [`RAISED`].
    counted: bool,
}

impl Raised {
    /// Lower the calling thread's nice value by `steps` (not below -20).
    pub(super) fn by(steps: i32) -> Option<Raised> {
        let thread = rustix::thread::gettid();
        let before = rustix::process::getpriority_process(Some(thread)).ok()?;
        rustix::process::setpriority_process(Some(thread), (before - steps).max(-20)).ok()?;
        Some(Raised { thread, before, counted: false })
    }

    /// [`HASH_NICE`] for a follower, unless half the node's cores (at least one) already have a
    /// raised follower: several downloads at once (or a resume re-hashing what is on disk, at
    /// full speed) must not crowd out the daemon's own calls.
    fn for_follower() -> Option<Raised> {
        let most = std::thread::available_parallelism().map_or(1, |n| n.get() / 2).max(1);
        if RAISED.fetch_add(1, Ordering::AcqRel) >= most {
            RAISED.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        match Raised::by(HASH_NICE) {
            Some(r) => Some(Raised { counted: true, ..r }),
            None => {
                RAISED.fetch_sub(1, Ordering::AcqRel);
                None
            }
        }
    }
}

impl Drop for Raised {
    fn drop(&mut self) {
        let _ = rustix::process::setpriority_process(Some(self.thread), self.before);
        if self.counted {
            RAISED.fetch_sub(1, Ordering::AcqRel);
        }
    }
}
