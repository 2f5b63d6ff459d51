//! The cache's shared state ([`Core`]): the store on disk, the registries' clients, the map of
//! downloads in flight and of the volumes waiting, what each source was proven to read, and
//! eviction over all of them.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};

use super::error::OciError;
use super::live::Live;
use super::pulls::Pulls;
use super::registry::{Registries, Scope};
use super::store::{Store, hex_of};
use super::{BlobRef, CachedBlob, Pruned, RegistryConfig};

/// Everything an [`super::Artifacts`] shares with its background downloads.
pub(super) struct Core {
    pub store: Store,
    pub registries: Registries,
    pub inner: Mutex<Inner>,
    /// Blob bytes received from registries.
    pub fetched: AtomicU64,
    /// Downloads that may run at once on the node, shared between volumes
    /// ([`super::slots`]); the others wait.
    pub downloads: Arc<super::slots::Slots>,
    /// The runtime `new` ran in, for `ensure` called outside one.
    pub handle: Option<tokio::runtime::Handle>,
    /// One lock per digest, held while it is unpacked, linked or evicted.
    digest_locks: Mutex<HashMap<String, Arc<Mutex<()>>>>,
    /// (scope, hex digest) pairs a registry let read: by a `HEAD` of `authorize`, or by a
    /// download. Kept for the process's lifetime (emptied past [`MAX_PROVEN`] entries).
    proven: Mutex<HashSet<(Scope, String)>>,
    /// Bumped on every change a lazy volume's session may care about (bytes written or
    /// verified, a download ended); the sessions watch it.
    pub changed: Arc<tokio::sync::watch::Sender<u64>>,
}

/// Proofs kept before the set is emptied (each costs one request again).
const MAX_PROVEN: usize = 1 << 16;

impl Core {
    pub fn new(cache_root: &Path, cfg: RegistryConfig) -> Result<Core, OciError> {
        let store = Store::open(cache_root).map_err(|e| OciError::Local {
            path: cache_root.display().to_string(),
            detail: format!("preparing the cache: {e}"),
            kind: e.kind(),
        })?;
        Ok(Core {
            store,
            registries: Registries::new(cfg)?,
            inner: Mutex::new(Inner::default()),
            fetched: AtomicU64::new(0),
            downloads: Arc::new(super::slots::Slots::default()),
            handle: tokio::runtime::Handle::try_current().ok(),
            digest_locks: Mutex::new(HashMap::new()),
            proven: Mutex::new(HashSet::new()),
            changed: Arc::new(tokio::sync::watch::channel(0).0),
        })
    }

    pub fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Has a registry let `scope` read the blob `hex`?
    pub fn is_proven(&self, scope: &Scope, hex: &str) -> bool {
        // A borrowed key would need a second map type; the clone is cheap next to a request.
        let key = (scope.clone(), hex.to_string());
        self.proven.lock().unwrap_or_else(|p| p.into_inner()).contains(&key)
    }

    /// Remember that a registry let `scope` read the blob `hex`.
    pub fn prove(&self, scope: &Scope, hex: &str) {
        let mut proven = self.proven.lock().unwrap_or_else(|p| p.into_inner());
        if proven.len() >= MAX_PROVEN {
            proven.clear();
        }
        proven.insert((scope.clone(), hex.to_string()));
    }

    /// The lock of one digest (see `digest_locks`).
    pub fn digest_lock(&self, hex: &str) -> Arc<Mutex<()>> {
        let mut locks = self.digest_locks.lock().unwrap_or_else(|p| p.into_inner());
        // Forget locks nobody holds, so the map does not grow with every digest ever seen.
        if locks.len() > 256 {
            locks.retain(|_, l| Arc::strong_count(l) > 1);
        }
        locks.entry(hex.to_string()).or_default().clone()
    }

    pub fn list(&self, in_use: &BTreeMap<String, Vec<String>>) -> io::Result<Vec<CachedBlob>> {
        Ok(self
            .store
            .scan()?
            .into_iter()
            .map(|e| {
                let digest = format!("sha256:{}", e.hex);
                CachedBlob {
                    volumes: in_use.get(&digest).cloned().unwrap_or_default(),
                    digest,
                    size: e.blob_bytes + e.tree_bytes,
                    last_used: e.last_used,
                }
            })
            .collect())
    }

    pub fn prune(&self, in_use: &BTreeSet<String>, keep_bytes: u64) -> io::Result<Pruned> {
        let mut keep: BTreeSet<String> = in_use.iter().filter_map(|d| hex_of(d).ok().map(str::to_string)).collect();
        {
            let inner = self.inner();
            keep.extend(
                inner.volumes.values().flatten().filter_map(|b: &BlobRef| hex_of(&b.digest).ok().map(str::to_string)),
            );
            keep.extend(inner.flights.keys().cloned());
        }
        let mut entries = self.store.scan()?;
        let mut total: u64 = entries.iter().map(|e| e.blob_bytes + e.tree_bytes).sum();
        entries.sort_by_key(|e| e.last_used);
        let mut pruned = Pruned::default();
        for e in entries {
            if total <= keep_bytes {
                break;
            }
            if keep.contains(&e.hex) || e.linked {
                continue;
            }
            let lock = self.digest_lock(&e.hex);
            // Being assembled right now: in use.
            let Ok(_held) = lock.try_lock() else { continue };
            self.store.evict(&e.hex)?;
            let bytes = e.blob_bytes + e.tree_bytes;
            total -= bytes;
            pruned.blobs += 1;
            pruned.bytes += bytes;
            tracing::info!(digest = %format!("sha256:{}", e.hex), bytes, "evicted from the model cache");
        }
        Ok(pruned)
    }
}

/// The map behind the lock.
#[derive(Default)]
pub(super) struct Inner {
    /// Downloads running or failed-not-yet-reported, by hex digest.
    pub flights: HashMap<String, Flight>,
    /// What each volume asked for (kept until it is forgotten).
    pub volumes: BTreeMap<String, Vec<BlobRef>>,
    /// The last transient failure of a digest's download and the bytes it left on disk
    /// (cleared when a download of it succeeds or fails for good).
    pub transient: HashMap<String, Stopped>,
    /// What each waiter's pull has seen, for the metrics.
    pub pulls: Pulls,
    /// Volumes that read their blobs lazily (among `volumes`).
    pub lazy_volumes: BTreeSet<String>,
    /// The live state of blobs lazy volumes read, kept between downloads (a running
    /// download's is its flight's).
    pub lives: HashMap<String, Arc<Live>>,
    /// Digests whose download failed for good while lazy volumes read them, with the failure
    /// (a digest mismatch), until those volumes are forgotten.
    pub lazy_failed: HashMap<String, OciError>,
}

/// A download stopped by a transient failure: no new one starts before `retry_at`, so a
/// caller that asks every few milliseconds (a dynamic mount, a warm-up) does not hammer a
/// registry that answers 429 or 5xx.
pub(super) struct Stopped {
    pub error: String,
    pub kept: u64,
    pub failures: u32,
    pub retry_at: std::time::Instant,
    /// When a reader's wish last started an attempt before `retry_at` (lazy volumes).
    pub tried: Option<std::time::Instant>,
}

pub(super) struct Flight {
    /// Which download this is: unique in the process ([`next_flight`]), so a download a gone
    /// mount stopped is never taken for a later one of the same digest.
    pub id: u64,
    pub live: Arc<Live>,
    pub state: State,
    /// Volumes waiting for it.
    pub waiters: BTreeSet<String>,
    /// Whose credentials it downloads with.
    pub scope: Scope,
    /// Started for lazy volumes only, and none other joined: stopped once none waits.
    pub lazy: bool,
}

/// A new download's [`Flight::id`].
pub(super) fn next_flight() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

pub(super) enum State {
    Running,
    /// Failed for good; each volume in `unreported` still has to be told.
    Failed {
        error: OciError,
        unreported: BTreeSet<String>,
    },
}
