//! The node's download slots, shared fairly between volumes: [`MAX_DOWNLOADS`] downloads run at
//! once, and no volume holds more than half of them, so a volume whose registry trickles (or
//! whose model has hundreds of layers) cannot keep another volume from starting. A download
//! counts against the volume that started it; a volume waiting for a download another started
//! takes no slot. Waiters are served in the order they came, skipping one at its share.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// Blob downloads running at once on a node. Each holds blocking threads for its whole time
/// (its follower, and its streams' writes): without a bound, a manifest of hundreds of layers
/// could take every thread of the runtime's blocking pool with followers waiting for writes
/// that no thread is left to run. Eight downloads of two streams each still fill a fast link.
pub const MAX_DOWNLOADS: usize = 8;

/// The most slots one volume holds.
pub const PER_VOLUME: usize = MAX_DOWNLOADS / 2;

pub struct Slots {
    state: Mutex<State>,
    freed: tokio::sync::Notify,
}

#[derive(Default)]
struct State {
    free: usize,
    held: HashMap<String, usize>,
    /// Ticket → volume, oldest first.
    waiting: BTreeMap<u64, String>,
    next: u64,
}

/// A slot, given back when dropped.
pub struct Slot {
    slots: Arc<Slots>,
    volume: String,
}

impl Default for Slots {
    fn default() -> Self {
        Slots {
            state: Mutex::new(State { free: MAX_DOWNLOADS, ..State::default() }),
            freed: tokio::sync::Notify::new(),
        }
    }
}

impl Slots {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait for a slot for a download `volume` starts.
    pub async fn acquire(self: &Arc<Self>, volume: &str) -> Slot {
        let ticket = {
            let mut s = self.lock();
            let t = s.next;
            s.next += 1;
            s.waiting.insert(t, volume.to_string());
            t
        };
        // Taken back from the queue if this future is dropped while waiting.
        struct Queued<'a>(&'a Slots, u64, bool);
        impl Drop for Queued<'_> {
            fn drop(&mut self) {
                if !self.2 {
                    self.0.lock().waiting.remove(&self.1);
                    self.0.freed.notify_waiters();
                }
            }
        }
        let mut queued = Queued(self, ticket, false);
        loop {
            let notified = self.freed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.lock();
                if s.grantable(ticket, volume) {
                    s.free -= 1;
                    *s.held.entry(volume.to_string()).or_default() += 1;
                    s.waiting.remove(&ticket);
                    queued.2 = true;
                    return Slot { slots: self.clone(), volume: volume.to_string() };
                }
            }
            notified.await;
        }
    }

    /// Slots `volume` holds now.
    #[cfg(test)]
    pub fn held(&self, volume: &str) -> usize {
        self.lock().held.get(volume).copied().unwrap_or(0)
    }
}

impl State {
    fn under_share(&self, volume: &str) -> bool {
        self.held.get(volume).copied().unwrap_or(0) < PER_VOLUME
    }

    /// A free slot, `volume` under its share, and no older waiter under its own share.
    fn grantable(&self, ticket: u64, volume: &str) -> bool {
        self.free > 0
            && self.under_share(volume)
            && !self.waiting.range(..ticket).any(|(_, v)| v != volume && self.under_share(v))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut s = self.slots.lock();
        s.free += 1;
        if let Some(n) = s.held.get_mut(&self.volume) {
            *n -= 1;
            if *n == 0 {
                s.held.remove(&self.volume);
            }
        }
        drop(s);
        self.slots.freed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn try_acquire(slots: &Arc<Slots>, volume: &str) -> Option<Slot> {
        tokio::time::timeout(Duration::from_millis(50), slots.acquire(volume)).await.ok()
    }

    #[tokio::test]
    async fn a_volume_holds_at_most_half_and_another_gets_the_rest() {
        let slots = Arc::new(Slots::default());
        let mut a = Vec::new();
        for _ in 0..PER_VOLUME {
            a.push(try_acquire(&slots, "a").await.expect("a's share"));
        }
        assert!(try_acquire(&slots, "a").await.is_none(), "a got more than half");
        let mut b = Vec::new();
        for _ in 0..PER_VOLUME {
            b.push(try_acquire(&slots, "b").await.expect("b's share"));
        }
        assert!(try_acquire(&slots, "c").await.is_none(), "more than MAX_DOWNLOADS");
        assert_eq!((slots.held("a"), slots.held("b")), (PER_VOLUME, PER_VOLUME));
        // A slot a gives back goes to c, who waited, not to a again.
        let c = tokio::spawn({
            let slots = slots.clone();
            async move { slots.acquire("c").await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(a.pop());
        let c = tokio::time::timeout(Duration::from_secs(5), c).await.unwrap().unwrap();
        assert_eq!(slots.held("c"), 1);
        drop((a, b, c));
        assert_eq!(slots.lock().free, MAX_DOWNLOADS);
        assert!(slots.lock().waiting.is_empty());
    }

    #[tokio::test]
    async fn a_waiter_dropped_leaves_the_queue() {
        let slots = Arc::new(Slots::default());
        let held: Vec<Slot> = futures_util::future::join_all((0..PER_VOLUME).map(|_| slots.acquire("a"))).await;
        assert!(try_acquire(&slots, "a").await.is_none());
        assert!(slots.lock().waiting.is_empty(), "a timed-out waiter stayed queued");
        drop(held);
        assert!(try_acquire(&slots, "a").await.is_some());
    }
}
