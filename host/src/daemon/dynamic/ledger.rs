//! A dynamic volume's byte level: what its cap (`--dynamic-max-mib`, the attribute
//! `dynamicMaxMiB`) is checked against.
//!
//! At any instant a volume's level is the sum of
//!
//! - **held**: the bytes every mount of its record fetches (a pending one's as much as a ready
//!   one's; a failed one's nothing: its downloads count as ending);
//! - **reserved**: the bytes of requests admitted but not recorded yet (a POST between the check
//!   of what its manifest says and its record; a mount planned again after a restart);
//! - **ending**: the bytes still to come in the downloads of mounts that are gone (deleted,
//!   failed), until those downloads have ended. A gone mount's downloads nobody else waits for
//!   are stopped at once ([`crate::oci::Artifacts::abandon`]): a queued one ends then, a
//!   running one at its next read.
//!
//! A request is admitted only if the level plus what it fetches stays within the cap, under
//! one lock: concurrent requests that together pass the cap are refused past it. The ledger is
//! in memory; a restarted daemon starts with nothing reserved or ending (no download of the old
//! process survives it).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::{ApiErr, api, limit_source};
use crate::daemon::Node;
use crate::oci::{Artifacts, Stopping};
use crate::volume::state::{MountPhase, VolumeState};

/// A volume's level, by part (the module's doc says what each is).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Level {
    /// What its mounts fetch.
    pub held: u64,
    /// Of requests admitted and not recorded yet.
    pub reserved: u64,
    /// Still to come in the downloads of its gone mounts.
    pub ending: u64,
}

impl Level {
    pub fn total(&self) -> u64 {
        self.held.saturating_add(self.reserved).saturating_add(self.ending)
    }
}

/// Every dynamic volume's reservations and ending downloads.
#[derive(Default, Clone)]
pub(super) struct Ledger(Arc<Mutex<HashMap<String, Book>>>);

/// Reservation tokens, unique in the process (a volume published again after an unpublish
/// never meets a token of its earlier publication).
static NEXT: AtomicU64 = AtomicU64::new(0);

#[derive(Default)]
struct Book {
    /// Token → bytes.
    reserved: BTreeMap<u64, u64>,
    /// The downloads gone mounts stopped, which may still run.
    ending: Vec<Vec<Stopping>>,
}

/// Bytes reserved in a volume's level until dropped (the mount is recorded, or the request
/// ended without it).
pub struct Reservation {
    ledger: Option<Ledger>,
    volume: String,
    token: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(l) = &self.ledger
            && let Some(book) = l.lock().get_mut(&self.volume)
        {
            book.reserved.remove(&self.token);
        }
    }
}

impl Reservation {
    /// Nothing reserved (a volume without a byte cap).
    pub fn none() -> Reservation {
        Reservation { ledger: None, volume: String::new(), token: 0 }
    }
}

impl Ledger {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Book>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The level of the volume `load` reads (under the ledger's lock, as [`Ledger::reserve`]
    /// reads it). Ending downloads that have ended are dropped.
    pub fn level<E>(&self, load: impl FnOnce() -> Result<VolumeState, E>, artifacts: &Artifacts) -> Result<Level, E> {
        let mut books = self.lock();
        let st = load()?;
        Ok(level_of(books.get_mut(&st.volume_id), held(&st, None), artifacts))
    }

    /// Reserve `bytes` for mount `id` of the volume `load` reads (under the ledger's lock, so
    /// a record saved before counts), if the level stays within `cap`: `Ok(Err(level))` when
    /// it would not; `Err` when `load` fails. `again`: mount `id` is recorded (planned again),
    /// its record's bytes are left out.
    pub fn reserve<E>(
        &self,
        load: impl FnOnce() -> Result<VolumeState, E>,
        id: &str,
        again: bool,
        bytes: u64,
        cap: u64,
        artifacts: &Artifacts,
    ) -> Result<Result<Reservation, Level>, E> {
        let mut books = self.lock();
        let st = load()?;
        let level = level_of(books.get_mut(&st.volume_id), held(&st, again.then_some(id)), artifacts);
        if level.total().saturating_add(bytes) > cap {
            return Ok(Err(level));
        }
        let token = NEXT.fetch_add(1, Ordering::Relaxed);
        books.entry(st.volume_id.clone()).or_default().reserved.insert(token, bytes);
        Ok(Ok(Reservation { ledger: Some(self.clone()), volume: st.volume_id, token }))
    }

    /// A gone mount of `volume` stopped the downloads `blobs`: they count until they end (a
    /// later download of the same blob, for another volume, is not theirs). Those that ended
    /// already are not kept, here or before.
    pub fn ending(&self, volume: &str, blobs: Vec<Stopping>, artifacts: &Artifacts) {
        let mut books = self.lock();
        if let Some(book) = books.get_mut(volume) {
            book.ending.retain(|b| artifacts.remaining(b) > 0);
        }
        if artifacts.remaining(&blobs) > 0 {
            books.entry(volume.to_string()).or_default().ending.push(blobs);
        }
    }

    /// The volume is unpublished: nothing of it counts any more.
    pub fn forget(&self, volume: &str) {
        self.lock().remove(volume);
    }
}

impl Node {
    /// Reserve the `bytes` mount `id` fetches in its volume's level (the module's doc), or 507 naming
    /// the level and the cap. `again`: the mount is recorded (planned again after a restart);
    /// its record's bytes are left out, the reservation stands for them.
    pub(super) fn reserve_bytes(&self, volume: &str, id: &str, again: bool, bytes: u64) -> Result<Reservation, ApiErr> {
        let st = self.dynamic_state(volume)?;
        let Some(max) = self.limits_of(&st).max_bytes else { return Ok(Reservation::none()) };
        let d = &self.inner.dynamic;
        let load = || self.dynamic_state(volume);
        let level = match d.ledger.reserve(load, id, again, bytes, max, &self.inner.artifacts)? {
            Ok(reservation) => return Ok(reservation),
            Err(level) => level,
        };
        let source =
            limit_source(&self.config().dynamic, &st, crate::volume::request::DYNAMIC_MAX_MIB_KEY, "--dynamic-max-mib");
        let cap = format!("its cap of {max} bytes ({source} {} MiB)", max >> 20);
        if bytes > max {
            return Err(ApiErr::new(
                507,
                "resource_exhausted",
                format!("mount {id} fetches {bytes} bytes, more than {cap}: it cannot be mounted on this volume"),
            ));
        }
        let held = format!(
            "the volume holds {} (its mounts {}, downloads of deleted or failed mounts still ending {}, other requests being admitted {})",
            level.total(),
            level.held,
            level.ending,
            level.reserved
        );
        if level.held.saturating_add(bytes) <= max {
            // It fits once what is ending has ended and what is admitted is recorded or gone.
            return Err(ApiErr::new(
                507,
                "resource_exhausted",
                format!("mount {id} fetches {bytes} bytes and {held}, more than {cap}; retry in a moment"),
            )
            .retry_after(1));
        }
        Err(ApiErr::new(
            507,
            "resource_exhausted",
            format!("mount {id} fetches {bytes} bytes and {held}, more than {cap}; delete a mount first"),
        ))
    }

    /// `GET /usage`: the volume's byte level and its caps.
    pub fn dynamic_usage(&self, volume: &str) -> Result<api::Usage, ApiErr> {
        let st = self.dynamic_state(volume)?;
        let level = self.inner.dynamic.ledger.level(|| self.dynamic_state(volume), &self.inner.artifacts)?;
        let limits = self.limits_of(&st);
        Ok(api::Usage {
            level_bytes: level.total(),
            held_bytes: level.held,
            ending_bytes: level.ending,
            reserved_bytes: level.reserved,
            max_bytes: limits.max_bytes,
            mounts: st.dynamic.len() as u64,
            max_mounts: limits.max_mounts,
        })
    }
}

/// What the mounts of `st` fetch, but mount `except` and failed ones. A record of schema 3
/// has no bytes: what its plan's steps fetch counts.
fn held(st: &VolumeState, except: Option<&str>) -> u64 {
    st.dynamic
        .iter()
        .filter(|(id, m)| Some(id.as_str()) != except && m.phase != MountPhase::Failed)
        .fold(0u64, |sum, (_, m)| sum.saturating_add(m.bytes.max(super::steps_bytes(&m.steps))))
}

fn level_of(book: Option<&mut Book>, held: u64, artifacts: &Artifacts) -> Level {
    let Some(book) = book else { return Level { held, ..Level::default() } };
    let reserved = book.reserved.values().fold(0u64, |sum, b| sum.saturating_add(*b));
    book.ending.retain(|blobs| artifacts.remaining(blobs) > 0);
    // A download stopped twice (a mount deleted, posted again, joining it, deleted again) counts once.
    let ending = artifacts.remaining(&book.ending.concat());
    Level { held, reserved, ending }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn book(l: &Ledger, volume: &str) -> Option<(usize, usize)> {
        l.lock().get(volume).map(|b| (b.reserved.len(), b.ending.len()))
    }

    #[test]
    fn reservations_count_until_dropped_and_ended_downloads_stop_counting() {
        let dir = tempfile::tempdir().unwrap();
        let artifacts = Artifacts::new(dir.path().join("cache"), Default::default()).unwrap();
        let l = Ledger::default();
        let mut b = Book::default();
        b.reserved.insert(u64::MAX - 1, 10);
        b.reserved.insert(u64::MAX, 5);
        // A gone mount's blob with no download running: it counts nothing, and is dropped.
        let blob =
            crate::oci::BlobRef { digest: format!("sha256:{}", "ab".repeat(32)), size: 100, media_type: String::new() };
        let blob = Stopping::unknown(blob);
        b.ending.push(vec![blob.clone()]);
        l.lock().insert("v".into(), b);
        let level = level_of(l.lock().get_mut("v"), 7, &artifacts);
        assert_eq!(level, Level { held: 7, reserved: 15, ending: 0 });
        assert_eq!(level.total(), 22);
        assert_eq!(book(&l, "v"), Some((2, 0)), "an ended download is forgotten");
        // A reservation counts until it is dropped; `none` reserves nothing.
        let r = Reservation { ledger: Some(l.clone()), volume: "v".into(), token: u64::MAX - 1 };
        drop(r);
        assert_eq!(level_of(l.lock().get_mut("v"), 0, &artifacts).reserved, 5);
        drop(Reservation::none());
        l.ending("v", vec![blob], &artifacts);
        assert_eq!(book(&l, "v"), Some((1, 0)), "nothing ending is not recorded");
        l.forget("v");
        assert_eq!(book(&l, "v"), None);
        // A volume the ledger never saw holds what its records hold.
        assert_eq!(level_of(None, 3, &artifacts), Level { held: 3, reserved: 0, ending: 0 });
    }

    #[test]
    fn a_mount_holds_its_recorded_bytes_or_what_its_steps_fetch() {
        use crate::plan::Step;
        use crate::volume::state::DynamicMount;
        let mut st = crate::volume::state::tests::state("v");
        let fetch =
            |size| Step::FetchBlob { digest: format!("sha256:{}", "cd".repeat(32)), size, media_type: String::new() };
        let mount = |phase, bytes, steps| DynamicMount {
            plugin: "model".into(),
            parameters: Default::default(),
            phase,
            reason: None,
            steps,
            bytes,
            process: None,
        };
        st.dynamic.insert("a".into(), mount(MountPhase::Ready, 10, vec![fetch(10)]));
        // A ready mount recorded under schema 3: no bytes, its steps count.
        st.dynamic.insert("b".into(), mount(MountPhase::Ready, 0, vec![fetch(7), fetch(5)]));
        st.dynamic.insert("c".into(), mount(MountPhase::Failed, 100, vec![fetch(100)]));
        st.dynamic.insert("d".into(), mount(MountPhase::Pending, 3, Vec::new()));
        assert_eq!(held(&st, None), 10 + 12 + 3, "a failed mount holds nothing");
        assert_eq!(held(&st, Some("b")), 13);
    }
}
