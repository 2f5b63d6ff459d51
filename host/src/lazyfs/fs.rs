//! The FUSE operations of a lazy volume: a read-only tree whose file bytes are read from the
//! layers' descriptors once the host says they are there, waited for (and asked for) until
//! then, and handed to the kernel's passthrough once a file's blob is complete and verified.

use std::ffi::OsStr;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEntry, ReplyOpen, ReplyStatfs,
    Request,
};

use super::state::{Inner, Shared};
use super::table::{NodeKind, ROOT, Table};
use crate::unpriv::lazy_wire::{Data, Span, covers};

/// How long the kernel keeps names and attributes: the tree never changes but by growing.
const TTL: Duration = Duration::from_secs(3600);
/// Chunks a sequential reader is ahead of what it reads.
const READ_AHEAD_CHUNKS: u64 = 4;
/// `st_blksize`: what buffered readers take as the size of one read.
const BLOCK: u32 = 128 << 10;

/// The filesystem.
pub struct LazyFs {
    pub shared: Arc<Shared>,
    /// Every open file, by handle.
    handles: std::sync::Mutex<std::collections::HashMap<u64, Handle>>,
    next_handle: AtomicU64,
    /// The kernel accepted passthrough.
    passthrough: std::sync::atomic::AtomicBool,
    /// The kernel maps files opened for direct I/O (FUSE_DIRECT_IO_ALLOW_MMAP, Linux 6.6+).
    direct: std::sync::atomic::AtomicBool,
}

/// One open file.
#[derive(Debug, Clone, Copy)]
struct Handle {
    ino: u64,
    /// Opened for the kernel's passthrough.
    passthrough: bool,
    /// How far its reads reached, and how many bytes they went on in a row (sequential readers
    /// get read-ahead).
    end: u64,
    run: u64,
}

impl Handle {
    /// A read of `[offset, end)`: the bytes this handle has now read in a row. A read that
    /// starts within `slack` of where the reads reached goes on with them: the kernel's
    /// requests of one sequential reader reach the FUSE threads slightly out of order.
    fn read(&mut self, offset: u64, end: u64, slack: u64) -> u64 {
        if offset.abs_diff(self.end) <= slack {
            self.run += end.saturating_sub(self.end);
            self.end = self.end.max(end);
        } else {
            (self.run, self.end) = (end.saturating_sub(offset), end);
        }
        self.run
    }
}

impl LazyFs {
    pub fn new(shared: Arc<Shared>) -> LazyFs {
        LazyFs {
            shared,
            handles: Default::default(),
            next_handle: AtomicU64::new(1),
            passthrough: std::sync::atomic::AtomicBool::new(false),
            direct: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The state once the table is there (it comes with the host's first opening), waiting for
    /// it at most the read wait; `None` when it did not come.
    fn with_table(&self) -> Option<std::sync::MutexGuard<'_, Inner>> {
        let mut g = self.shared.lock();
        let deadline = Instant::now() + g.read_wait;
        while g.table.is_none() {
            let (next, left) = self.shared.wait_until(g, deadline);
            g = next;
            if !left && g.table.is_none() {
                return None;
            }
        }
        Some(g)
    }

    /// What `stat` says of inode `ino`: an image's entries with their owner and mode (the
    /// mount's `default_permissions` makes the kernel check them), the others read-only and
    /// owned by root.
    fn attr(table: &Table, ino: u64) -> Option<FileAttr> {
        let node = table.get(ino)?;
        let (kind, perm, size, nlink) = match &node.kind {
            NodeKind::Dir(children) => (FileType::Directory, 0o555, 0, 2 + children.len() as u32),
            NodeKind::File { size, .. } => (FileType::RegularFile, 0o444, *size, node.links.max(1)),
            NodeKind::Symlink(t) => (FileType::Symlink, 0o777, t.len() as u64, 1),
        };
        let (uid, gid, perm) = match node.owner {
            // A link's own mode means nothing; set-uid and set-gid never reach a reader.
            Some(o) if kind != FileType::Symlink => (o.uid, o.gid, (o.mode & 0o1777) as u16),
            Some(o) => (o.uid, o.gid, perm),
            None => (0, 0, perm),
        };
        let time = UNIX_EPOCH + Duration::from_secs(node.mtime.max(0) as u64);
        Some(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: time,
            mtime: time,
            ctime: time,
            crtime: time,
            kind,
            perm,
            nlink,
            uid,
            gid,
            rdev: 0,
            blksize: BLOCK,
            flags: 0,
        })
    }

    /// The root before the table is there (what the host's readiness check stats).
    fn bare_root() -> FileAttr {
        FileAttr {
            ino: INodeNo(ROOT),
            size: 0,
            blocks: 0,
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind: FileType::Directory,
            perm: 0o555,
            nlink: 2,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: BLOCK,
            flags: 0,
        }
    }

    /// The layers whose files are still to come that may put something at `path` in
    /// directory `dir`: for an image, all of them while the table says the directory is open
    /// (a layer above the ones served is pending, and nothing served hides its entries there),
    /// none once it is not; else those whose files go at or below `path`.
    fn pending_at(g: &Inner, dir: u64, path: &str) -> Vec<u32> {
        if g.image {
            let open = g.table.as_ref().and_then(|t| t.get(dir)).is_some_and(|n| n.open);
            return (0..g.layers.len() as u32).filter(|i| open && g.layers[*i as usize].pending.is_some()).collect();
        }
        (0..g.layers.len() as u32)
            .filter(|i| {
                g.layers[*i as usize].pending.as_deref().is_some_and(|p| {
                    p.is_empty()
                        || p == path
                        || p.starts_with(&format!("{path}/"))
                        || path.starts_with(&format!("{p}/"))
                })
            })
            .collect()
    }

    /// Wait for a change while `pending` layers are still to come, asking for them first
    /// (they are fetched at once, ahead of the fill's turn); `None` past `deadline`.
    fn wait_for_layers<'a>(
        &'a self,
        mut g: std::sync::MutexGuard<'a, Inner>,
        pending: Vec<u32>,
        deadline: Instant,
    ) -> Option<std::sync::MutexGuard<'a, Inner>> {
        let asks: Vec<_> = pending
            .into_iter()
            .filter_map(|l| {
                let size = g.layers[l as usize].size;
                self.shared.asking(&mut g, l, 0, size, true)
            })
            .collect();
        if !asks.is_empty() {
            drop(g);
            for m in &asks {
                self.shared.send(m);
            }
            return Some(self.shared.lock());
        }
        let (next, left) = self.shared.wait_until(g, deadline);
        left.then_some(next)
    }

    /// Read `size` bytes at `offset` of the file `id` whose bytes are `data`, waiting for them
    /// up to the read wait.
    fn read_file(
        &self,
        fh: u64,
        id: u32,
        file_size: u64,
        data: &Data,
        offset: u64,
        size: u32,
    ) -> Result<Vec<u8>, Errno> {
        let end = offset.saturating_add(u64::from(size)).min(file_size);
        if offset >= end {
            return Ok(Vec::new());
        }
        match data {
            Data::Tree { layer, rel } => self.read_tree(id, *layer, rel, offset, end),
            Data::Blob { layer, offset: base } => {
                // A reader that went on from where it stopped for more than two chunks reads
                // the file through: it gets read-ahead (one large read split by the kernel
                // into several requests does not).
                let sequential = {
                    let chunk = self.shared.lock().chunk;
                    let mut h = self.handles.lock().unwrap_or_else(|p| p.into_inner());
                    h.get_mut(&fh).is_some_and(|h| h.read(offset, end, chunk) >= 2 * chunk)
                };
                self.read_blob(*layer, base + offset, base + end, (*base, base + file_size), sequential)
            }
        }
    }

    /// Bytes `[start, end)` of layer `layer`'s blob, once readable; `file` is the file's extent
    /// in the blob (read-ahead stays inside it).
    fn read_blob(&self, layer: u32, start: u64, end: u64, file: Span, sequential: bool) -> Result<Vec<u8>, Errno> {
        let mut g = self.shared.lock();
        let deadline = Instant::now() + g.read_wait;
        if sequential {
            let chunk = g.chunk.max(1);
            let ahead = ((end + READ_AHEAD_CHUNKS * chunk).min(file.1)).max(end);
            let l = g.layers.get(layer as usize);
            if ahead > end && l.is_some_and(|l| !l.complete && !covers(&l.readable, end, ahead)) {
                let msg = self.shared.asking(&mut g, layer, end, ahead, false);
                drop(g);
                if let Some(m) = msg {
                    self.shared.send(&m);
                }
                g = self.shared.lock();
            }
        }
        loop {
            if g.failed.is_some() {
                return Err(Errno::EIO);
            }
            let Some(l) = g.layers.get(layer as usize) else { return Err(Errno::EIO) };
            if l.refuses(start, end) {
                return Err(Errno::EIO);
            }
            if (l.complete || covers(&l.readable, start, end))
                && let Some(file) = l.file.clone()
            {
                drop(g);
                let mut buf = vec![0u8; (end - start) as usize];
                file.read_exact_at(&mut buf, start).map_err(|e| {
                    tracing::warn!(layer, start, end, error = %e, "reading a layer's blob failed");
                    Errno::EIO
                })?;
                return Ok(buf);
            }
            let msg = self.shared.asking(&mut g, layer, start, end, true);
            if let Some(m) = msg {
                drop(g);
                self.shared.send(&m);
                g = self.shared.lock();
                continue;
            }
            let (next, left) = self.shared.wait_until(g, deadline.min(Instant::now() + super::state::ASK_AGAIN));
            g = next;
            if !left && Instant::now() >= deadline {
                tracing::warn!(layer, start, end, "a read waited for its bytes past the read wait: EIO");
                return Err(Errno::EIO);
            }
        }
    }

    /// Bytes of a file of an unpacked tree (always there once its layer was added).
    fn read_tree(&self, id: u32, layer: u32, rel: &str, start: u64, end: u64) -> Result<Vec<u8>, Errno> {
        let file = {
            let g = self.shared.lock();
            if g.failed.is_some() {
                return Err(Errno::EIO);
            }
            match g.tree_files.get(&id) {
                Some(f) => f.clone(),
                None => {
                    let dir = g.layers.get(layer as usize).and_then(|l| l.file.clone()).ok_or(Errno::EIO)?;
                    drop(g);
                    let f = Arc::new(crate::unpriv::sys::open_beneath(&dir, rel).map_err(|e| {
                        tracing::warn!(layer, rel, error = %e, "opening a file of an unpacked layer failed");
                        Errno::EIO
                    })?);
                    self.shared.lock().tree_files.insert(id, f.clone());
                    f
                }
            }
        };
        let mut buf = vec![0u8; (end - start) as usize];
        file.read_exact_at(&mut buf, start).map_err(|_| Errno::EIO)?;
        Ok(buf)
    }
}

impl Filesystem for LazyFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Passthrough (Linux 6.9+): the host registers complete files' backing ids on this
        // connection, and opens of them bypass this process. Stack depth 1: the cache is on a
        // plain filesystem.
        if config.capabilities().contains(InitFlags::FUSE_PASSTHROUGH)
            && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && config.set_max_stack_depth(1).is_ok()
        {
            self.passthrough.store(true, Ordering::Relaxed);
        }
        // Files still downloading are read around the page cache (below), and may still be
        // mapped: the kernel then reads their pages as for any other file.
        if config.capabilities().contains(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
            && config.add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP).is_ok()
        {
            self.direct.store(true, Ordering::Relaxed);
        }
        tracing::info!(
            passthrough = self.passthrough.load(Ordering::Relaxed),
            direct = self.direct.load(Ordering::Relaxed),
            "lazy filesystem ready"
        );
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let Some(mut g) = self.with_table() else { return reply.error(Errno::EIO) };
        let deadline = Instant::now() + g.read_wait;
        loop {
            let table = g.table.as_ref().expect("waited for");
            if let Some(ino) = table.child(parent.0, name) {
                return match Self::attr(table, ino) {
                    Some(a) => reply.entry(&TTL, &a, Generation(0)),
                    None => reply.error(Errno::EIO),
                };
            }
            // A layer still to be fetched and unpacked may put it here: wait for it.
            let path = match table.path(parent.0) {
                p if p.is_empty() => name.to_string_lossy().into_owned(),
                p => format!("{p}/{}", name.to_string_lossy()),
            };
            let pending = Self::pending_at(&g, parent.0, &path);
            if pending.is_empty() || g.failed.is_some() {
                return reply.error(Errno::ENOENT);
            }
            g = match self.wait_for_layers(g, pending, deadline) {
                Some(g) => g,
                None => return reply.error(Errno::EAGAIN),
            };
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino.0 == ROOT && self.shared.lock().table.is_none() {
            return reply.attr(&Duration::ZERO, &Self::bare_root());
        }
        let Some(g) = self.with_table() else { return reply.error(Errno::EIO) };
        match Self::attr(g.table.as_ref().expect("waited for"), ino.0) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: fuser::ReplyData) {
        let Some(g) = self.with_table() else { return reply.error(Errno::EIO) };
        match g.table.as_ref().and_then(|t| t.get(ino.0)).map(|n| &n.kind) {
            Some(NodeKind::Symlink(t)) => reply.data(t.as_bytes()),
            _ => reply.error(Errno::EINVAL),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        let Some(g) = self.with_table() else { return reply.error(Errno::EIO) };
        let Some(NodeKind::File { data, .. }) = g.table.as_ref().and_then(|t| t.get(ino.0)).map(|n| &n.kind) else {
            return reply.error(Errno::EISDIR);
        };
        let backing = g.backing.get(&ino.0).copied().filter(|_| g.failed.is_none());
        let downloading = match data {
            Data::Blob { layer, .. } => g.layers.get(*layer as usize).is_some_and(|l| !l.complete),
            Data::Tree { .. } => false,
        };
        drop(g);
        let fh = self.next_handle.fetch_add(1, Ordering::Relaxed);
        // The kernel refuses (EIO) a passthrough open of a file that is still open through its
        // page cache (read, or mapped, before it was complete), and an open through the page
        // cache of one open for passthrough: a file keeps the way it is open until its last
        // handle is released. A handle open for direct I/O counts as one through the page
        // cache: the kernel would take a passthrough open beside it, but then refuse (ENODEV)
        // the mapping that handle may still make.
        let mut handles = self.handles.lock().unwrap_or_else(|p| p.into_inner());
        let cached = handles.values().any(|h| h.ino == ino.0 && !h.passthrough);
        let passthrough = match backing {
            Some(id) if self.passthrough.load(Ordering::Relaxed) && !cached => Some(id),
            _ => None,
        };
        handles.insert(fh, Handle { ino: ino.0, passthrough: passthrough.is_some(), end: u64::MAX, run: 0 });
        drop(handles);
        match passthrough {
            Some(id) => crate::unpriv::sys::reply_passthrough(reply, FileHandle(fh), id),
            // A file still downloading is read around the page cache: a reader's bytes are
            // copied once from the cache file into its buffer, not also into the FUSE file's
            // page cache (which doubled the memory a read through took).
            None if downloading && self.direct.load(Ordering::Relaxed) => {
                reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_KEEP_CACHE)
            }
            // The bytes never change: the page cache stays valid across opens (dropped when the
            // volume fails, so every later read asks this process and fails).
            None => reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(g) = self.with_table() else { return reply.error(Errno::EIO) };
        let Some(NodeKind::File { id, size: file_size, data }) =
            g.table.as_ref().and_then(|t| t.get(ino.0)).map(|n| n.kind.clone())
        else {
            return reply.error(Errno::EISDIR);
        };
        drop(g);
        match self.read_file(fh.0, id, file_size, &data, offset, size) {
            Ok(bytes) => reply.data(&bytes),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        _flush: bool,
        reply: fuser::ReplyEmpty,
    ) {
        self.handles.lock().unwrap_or_else(|p| p.into_inner()).remove(&fh.0);
        reply.ok();
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let Some(mut g) = self.with_table() else { return reply.error(Errno::EIO) };
        // An image's directory that a pending layer may still add to is listed once it is
        // complete (up to the read wait): a listing never leaves out what the layers below
        // put there, nor shows what a layer above deletes.
        let deadline = Instant::now() + g.read_wait;
        loop {
            let pending = Self::pending_at(&g, ino.0, "");
            if !g.image || pending.is_empty() || g.failed.is_some() {
                break;
            }
            g = match self.wait_for_layers(g, pending, deadline) {
                Some(g) => g,
                None => return reply.error(Errno::EAGAIN),
            };
        }
        let table = g.table.as_ref().expect("waited for");
        let Some(node) = table.get(ino.0) else { return reply.error(Errno::ENOENT) };
        let NodeKind::Dir(children) = &node.kind else { return reply.error(Errno::ENOTDIR) };
        let mut entries: Vec<(u64, FileType, &OsStr)> =
            vec![(ino.0, FileType::Directory, OsStr::new(".")), (node.parent, FileType::Directory, OsStr::new(".."))];
        for (name, child) in children {
            let kind = match table.get(*child).map(|n| &n.kind) {
                Some(NodeKind::Dir(_)) => FileType::Directory,
                Some(NodeKind::Symlink(_)) => FileType::Symlink,
                _ => FileType::RegularFile,
            };
            entries.push((*child, kind, name.as_os_str()));
        }
        for (i, (child, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(child), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let (bytes, files) = match self.shared.lock().table.as_ref() {
            Some(t) => (t.bytes(), t.len() as u64),
            None => (0, 1),
        };
        reply.statfs(bytes.div_ceil(4096), 0, 0, files, 0, 4096, 255, 4096);
    }
}

#[cfg(test)]
mod tests {
    use super::{Handle, LazyFs};
    use crate::lazyfs::state::{Inner, Layer};
    use crate::lazyfs::table::{ROOT, Table};
    use crate::unpriv::lazy_wire::{Data, FileEntry, Kind, Owner};

    fn entry(path: &str, kind: Kind, owner: Option<Owner>, open: bool) -> FileEntry {
        FileEntry { path: path.into(), kind, mtime: 0, owner, open, inode: None }
    }

    fn file(layer: u32) -> Kind {
        Kind::File { size: 4, data: Data::Blob { layer, offset: 0 } }
    }

    /// An image's files show their owner and mode (the kernel checks them: the mount has
    /// `default_permissions`), never a set-id bit; a model's are read-only and root's.
    #[test]
    fn an_images_entries_show_their_owner_and_mode() {
        let o = |uid, mode| Some(Owner { uid, gid: uid + 1, mode });
        let t = Table::new(&[
            entry("secret", file(0), o(1000, 0o600), false),
            entry("suid", file(0), o(0, 0o4755), false),
            entry("tmp", Kind::Dir, o(0, 0o1777), false),
            entry("link", Kind::Symlink { target: "/etc/passwd".into() }, o(3, 0o644), false),
            entry("model", file(1), None, false),
        ]);
        let attr = |p: &str| LazyFs::attr(&t, t.by_path(p).unwrap()).unwrap();
        assert_eq!((attr("secret").uid, attr("secret").gid, attr("secret").perm), (1000, 1001, 0o600));
        assert_eq!(attr("suid").perm, 0o755);
        assert_eq!(attr("tmp").perm, 0o1777);
        assert_eq!((attr("link").uid, attr("link").perm), (3, 0o777));
        assert_eq!((attr("model").uid, attr("model").perm), (0, 0o444));
    }

    /// Lookups and listings of an image wait where a pending layer may add entries (an open
    /// directory), and nowhere else; a model's wait below a pending layer's path.
    #[test]
    fn an_image_waits_for_pending_layers_only_in_open_directories() {
        let t = Table::new(&[
            entry("", Kind::Dir, Some(Owner::DIR), true),
            entry("app", Kind::Dir, None, true),
            entry("opaque", Kind::Dir, None, false),
        ]);
        let (app, opaque) = (t.by_path("app").unwrap(), t.by_path("opaque").unwrap());
        let layers = || vec![Layer { pending: Some(String::new()), ..Default::default() }, Layer::default()];
        let g = Inner { image: true, table: Some(t.clone()), layers: layers(), ..Default::default() };
        assert_eq!(LazyFs::pending_at(&g, ROOT, "x"), [0]);
        assert_eq!(LazyFs::pending_at(&g, app, "app/x"), [0]);
        assert!(LazyFs::pending_at(&g, opaque, "opaque/x").is_empty(), "nothing below can show there");
        let g = Inner { image: false, table: Some(t), layers: layers(), ..Default::default() };
        assert_eq!(LazyFs::pending_at(&g, opaque, "opaque/x"), [0], "a model: by the layer's path");
    }

    const K: u64 = 128 << 10;
    const CHUNK: u64 = 4 << 20;

    fn handle() -> Handle {
        Handle { ino: 2, passthrough: false, end: u64::MAX, run: 0 }
    }

    /// Requests of one reader going through a file, as the FUSE threads took them (the third
    /// and fourth swapped, as seen when a reader read a lazy file through): a run.
    #[test]
    fn a_reader_going_on_is_a_run_though_its_requests_come_out_of_order() {
        let mut h = handle();
        let mut run = 0;
        for i in [0, 1, 3, 2, 4, 5, 7, 6] {
            run = h.read(i * K, (i + 1) * K, CHUNK);
        }
        assert_eq!(run, 8 * K);
        // The whole chunk and more, in order: a run of twice a chunk is reached.
        for i in 8..(2 * CHUNK / K) {
            run = h.read(i * K, (i + 1) * K, CHUNK);
        }
        assert_eq!(run, 2 * CHUNK);
    }

    /// Reads here and there (a safetensors header, then tensors far apart) are no run; a read
    /// far from the last starts one again.
    #[test]
    fn reads_far_apart_are_no_run() {
        let mut h = handle();
        assert_eq!(h.read(0, 8, CHUNK), 8);
        assert_eq!(h.read(100 * CHUNK, 100 * CHUNK + K, CHUNK), K);
        assert_eq!(h.read(100 * CHUNK + K, 100 * CHUNK + 2 * K, CHUNK), 2 * K);
        assert_eq!(h.read(7 * CHUNK, 7 * CHUNK + K, CHUNK), K);
        // Reading the same bytes again does not add to a run.
        assert_eq!(h.read(7 * CHUNK, 7 * CHUNK + K, CHUNK), K);
    }
}
