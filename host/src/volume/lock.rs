//! One operation per volume at a time.
//!
//! The CSI spec makes the CO responsible for keeping one call in flight per volume, but allows
//! that a CO which lost its state may send several at once, and names ABORTED as the answer
//! when an operation is already pending for the volume. So a second call does not wait: it
//! fails at once with [`Busy`] (gRPC ABORTED) and kubelet retries. The guard releases on drop, so a panicking or
//! cancelled operation never leaves its volume locked.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use crate::error::ErrorKind;

/// The set of volumes with an operation in flight.
#[derive(Debug, Default)]
pub struct VolumeLocks {
    held: Mutex<HashSet<String>>,
}

/// Another operation holds the volume.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an operation on volume {0} is already in progress; retry later")]
pub struct Busy(pub String);

impl Busy {
    /// Always Aborted.
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::Aborted
    }
}

/// Holds one volume until dropped.
#[derive(Debug)]
pub struct VolumeGuard {
    locks: Arc<VolumeLocks>,
    volume: String,
}

impl VolumeLocks {
    /// An empty set, shared by every handler.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Take `volume`, or fail at once if an operation already holds it.
    pub fn try_lock(self: &Arc<Self>, volume: &str) -> Result<VolumeGuard, Busy> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if !held.insert(volume.to_string()) {
            return Err(Busy(volume.to_string()));
        }
        Ok(VolumeGuard { locks: self.clone(), volume: volume.to_string() })
    }

    /// Volumes currently held (for diagnostics).
    pub fn held(&self) -> usize {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl Drop for VolumeGuard {
    fn drop(&mut self) {
        self.locks.held.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.volume);
    }
}

impl From<Busy> for crate::error::Error {
    fn from(e: Busy) -> Self {
        crate::error::Error::new(e.kind(), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_operation_is_aborted_until_the_first_ends() {
        let locks = VolumeLocks::new();
        let guard = locks.try_lock("v1").unwrap();
        let busy = locks.try_lock("v1").unwrap_err();
        assert_eq!(busy.kind(), ErrorKind::Aborted);
        assert_eq!(busy.to_string(), "an operation on volume v1 is already in progress; retry later");
        let other = locks.try_lock("v2").expect("other volumes are independent");
        drop(guard);
        let again = locks.try_lock("v1").expect("released on drop");
        drop((again, other));
        assert_eq!(locks.held(), 0);
    }

    #[test]
    fn a_panicking_operation_releases_its_volume() {
        let locks = VolumeLocks::new();
        let l = locks.clone();
        let r = std::thread::spawn(move || {
            let _g = l.try_lock("v").unwrap();
            panic!("operation failed");
        })
        .join();
        assert!(r.is_err());
        assert!(locks.try_lock("v").is_ok());
    }

    #[test]
    fn exactly_one_of_many_concurrent_callers_wins() {
        let locks = VolumeLocks::new();
        let barrier = Arc::new(std::sync::Barrier::new(16));
        let won: Vec<_> = (0..16)
            .map(|_| {
                let (locks, barrier) = (locks.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    let g = locks.try_lock("v");
                    barrier.wait(); // hold until everyone has tried
                    g.is_ok()
                })
            })
            .collect();
        let winners = won.into_iter().map(|h| h.join().unwrap()).filter(|w| *w).count();
        assert_eq!(winners, 1);
    }
}
