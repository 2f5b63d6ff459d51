//! What the FUSE threads and the control thread share: the table, each layer's descriptor and
//! readable ranges, the backing ids of passthrough, whether the volume failed, and the
//! connection the server asks the host for bytes over. Readers wait on one condition
//! variable, woken by every change the host reports.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::table::{NodeKind, Table};
use crate::unpriv::lazy_wire::{self, LayerState, Span, ToHost};

/// One layer.
#[derive(Debug, Default)]
pub struct Layer {
    /// The blob's size.
    pub size: u64,
    /// Readable ranges.
    pub readable: Vec<Span>,
    /// Ranges that failed verification twice.
    pub bad: Vec<Span>,
    /// Complete and verified.
    pub complete: bool,
    /// Its files appear later (a compressed layer), below this path.
    pub pending: Option<String>,
    /// Its data: the blob, or the unpacked tree's directory.
    pub file: Option<Arc<File>>,
}

impl Layer {
    /// Does a read of `[start, end)` fail: a range that failed the volume's chunk index twice,
    /// while the blob is not complete (once it is, its digest vouches for every byte)?
    pub fn refuses(&self, start: u64, end: u64) -> bool {
        !self.complete && self.bad.iter().any(|(a, b)| *a < end && start < *b)
    }
}

/// Everything behind the lock.
#[derive(Debug, Default)]
pub struct Inner {
    /// The tree, once the host sent it.
    pub table: Option<Table>,
    pub layers: Vec<Layer>,
    /// Passthrough backing ids by inode.
    pub backing: HashMap<u64, u32>,
    /// Set once the volume failed verification.
    pub failed: Option<String>,
    /// How long a read waits.
    pub read_wait: Duration,
    /// The unit of a request for bytes.
    pub chunk: u64,
    /// Ranges asked for, with when (asked again after [`ASK_AGAIN`], or on a new connection).
    pub asked: HashMap<(u32, u64), Instant>,
    /// Descriptors of files of unpacked trees, by file id.
    pub tree_files: HashMap<u32, Arc<File>>,
    /// The layers are a container image's ([`LayerState::image`]): lookups and listings wait
    /// in the directories the table says are open, and nowhere else.
    pub image: bool,
    /// Passthrough backing ids of complete layers' files the table does not serve yet, by
    /// layer and path (an image's lower layer, served once the layers above it are known).
    pub unplaced: HashMap<(u32, String), u32>,
}

impl Inner {
    /// Give the files of `backing` (`(layer, path, id)`, of complete layers) their backing ids:
    /// those the table serves from that layer now; an image's others wait in
    /// [`Inner::unplaced`] for the table to reach them (a path served from another layer never
    /// comes back to this one: the tree only grows).
    pub fn place_backing(&mut self, backing: Vec<(u32, String, u32)>) {
        let Some(t) = self.table.as_ref() else { return };
        let mut later = HashMap::new();
        for (layer, path, id) in backing {
            match t.by_path(&path) {
                Some(ino) => {
                    if matches!(t.get(ino).map(|n| &n.kind), Some(NodeKind::File { data, .. }) if data.layer() == layer)
                    {
                        self.backing.insert(ino, id);
                    }
                }
                None if self.image => {
                    later.insert((layer, path), id);
                }
                None => {}
            }
        }
        self.unplaced.extend(later);
    }

    /// [`Inner::place_backing`] of the ids still unplaced (the table grew).
    pub fn place_unplaced(&mut self) {
        let unplaced = std::mem::take(&mut self.unplaced);
        self.place_backing(unplaced.into_iter().map(|((layer, path), id)| (layer, path, id)).collect());
    }
}

/// An asked-for chunk not delivered in this time is asked for again (the host may have lost it
/// across a restart).
pub const ASK_AGAIN: Duration = Duration::from_secs(2);
/// How long a read waits when the host has not said (the host's opening sets it).
pub const DEFAULT_READ_WAIT: Duration = Duration::from_secs(30);

/// The shared state.
#[derive(Debug)]
pub struct Shared {
    inner: Mutex<Inner>,
    /// Notified on every change.
    pub changed: Condvar,
    /// The connections to the host, newest last; requests go to the newest that takes them.
    writers: Mutex<Vec<UnixStream>>,
}

impl Shared {
    pub fn new() -> Arc<Shared> {
        Arc::new(Shared {
            inner: Mutex::new(Inner { read_wait: DEFAULT_READ_WAIT, chunk: 4 << 20, ..Default::default() }),
            changed: Condvar::new(),
            writers: Mutex::new(Vec::new()),
        })
    }

    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait for a change, at most until `deadline`; the guard back, and whether time is left.
    pub fn wait_until<'a>(&self, guard: MutexGuard<'a, Inner>, deadline: Instant) -> (MutexGuard<'a, Inner>, bool) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (guard, false);
        }
        let (g, _) = self.changed.wait_timeout(guard, left).unwrap_or_else(|p| p.into_inner());
        (g, Instant::now() < deadline)
    }

    /// Apply what a host's opening says of the layers (the table is set by the caller).
    pub fn set_layers(inner: &mut Inner, layers: Vec<LayerState>) {
        inner.image = layers.iter().any(|l| l.image);
        let old = std::mem::take(&mut inner.layers);
        let mut old = old.into_iter();
        inner.layers = layers
            .into_iter()
            .map(|l| Layer {
                size: l.size,
                readable: l.readable,
                bad: l.bad,
                complete: l.complete,
                pending: l.pending,
                // Kept until the opening's `Files` replace it (the same blob, after a restart).
                file: old.next().and_then(|o| o.file),
            })
            .collect();
    }

    /// A new connection to the host, the one requests go to from now on.
    pub fn add_writer(&self, w: UnixStream) {
        let mut writers = self.writers.lock().unwrap_or_else(|p| p.into_inner());
        writers.push(w);
    }

    /// The request for `[start, end)` of `layer` to send (chunks not asked for within
    /// [`ASK_AGAIN`]), recorded as asked; `None` when every chunk was asked for just now. Sent
    /// by the caller after it let go of the lock ([`Shared::send`]).
    pub fn asking(&self, inner: &mut Inner, layer: u32, start: u64, end: u64, urgent: bool) -> Option<ToHost> {
        let chunk = inner.chunk.max(1);
        let first = start / chunk;
        let last = end.saturating_sub(1) / chunk;
        let now = Instant::now();
        let mut fresh: Option<(u64, u64)> = None;
        for c in first..=last {
            let recent = inner.asked.get(&(layer, c)).is_some_and(|t| now.duration_since(*t) < ASK_AGAIN);
            if recent {
                continue;
            }
            inner.asked.insert((layer, c), now);
            fresh = Some(match fresh {
                None => (c, c),
                Some((a, _)) => (a, c),
            });
        }
        if inner.asked.len() > 65_536 {
            inner.asked.retain(|_, t| now.duration_since(*t) < ASK_AGAIN);
        }
        let (a, b) = fresh?;
        let size = inner.layers.get(layer as usize).map(|l| l.size).unwrap_or(0);
        Some(ToHost::Need { layer, start: a * chunk, end: ((b + 1) * chunk).min(size), urgent })
    }

    /// Send to the newest connection that takes it (the others are dropped).
    pub fn send(&self, msg: &ToHost) -> bool {
        let mut writers = self.writers.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(w) = writers.last() {
            if lazy_wire::send(w, msg, &[]).is_ok() {
                return true;
            }
            writers.pop();
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::{Inner, Layer};
    use crate::lazyfs::table::Table;
    use crate::unpriv::lazy_wire::{Data, FileEntry, Kind};

    fn file(path: &str, layer: u32) -> FileEntry {
        let kind = Kind::File { size: 1, data: Data::Blob { layer, offset: 0 } };
        FileEntry { path: path.into(), kind, mtime: 0, owner: None, open: false, inode: None }
    }

    /// An image's lower layer completes before the table reaches it: its backing ids wait for
    /// its files, and go only to the files that layer serves.
    #[test]
    fn backing_ids_wait_for_an_images_files_to_join_the_table() {
        let mut g = Inner { image: true, table: Some(Table::new(&[file("top", 1)])), ..Default::default() };
        g.place_backing(vec![(0, "low".into(), 7), (0, "top".into(), 8), (1, "top".into(), 9)]);
        let top = g.table.as_ref().unwrap().by_path("top").unwrap();
        assert_eq!(g.backing.get(&top), Some(&9), "the top layer's file, not the lower one's");
        assert_eq!(g.unplaced, [((0, "low".to_string()), 7)].into());
        g.table.as_mut().unwrap().refresh(&[file("top", 1), file("low", 0)]);
        g.place_unplaced();
        let low = g.table.as_ref().unwrap().by_path("low").unwrap();
        assert_eq!((g.backing.get(&low), g.unplaced.len()), (Some(&7), 0));
        // A model's (not an image's) ids for paths it does not serve are dropped.
        let mut g = Inner { table: Some(Table::new(&[])), ..Default::default() };
        g.place_backing(vec![(0, "x".into(), 1)]);
        assert!(g.unplaced.is_empty() && g.backing.is_empty());
    }

    #[test]
    fn a_bad_range_fails_reads_until_the_blob_is_complete() {
        let mut l = Layer { size: 100, bad: vec![(32, 64)], ..Default::default() };
        assert!(l.refuses(40, 41));
        assert!(l.refuses(0, 33), "a read that touches it");
        assert!(!l.refuses(0, 32) && !l.refuses(64, 100), "reads beside it");
        // The blob matched its digest: the index that disagreed was wrong.
        l.complete = true;
        assert!(!l.refuses(40, 41));
    }
}
