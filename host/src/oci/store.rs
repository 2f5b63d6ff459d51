//! The cache's layout on disk, and eviction.
//!
//! ```text
//! <cache>/blobs/sha256/<hex>               a verified blob, mode 0444
//! <cache>/blobs/sha256/<hex>.partial       a download in progress (or interrupted), 0600
//! <cache>/blobs/sha256/<hex>.partial.json  which ranges of it are written
//! <cache>/blobs/sha256/<hex>.partial.writer who wrote it last (a digest of the source)
//! <cache>/trees/sha256/<hex>/              the blob unpacked (files 0444, directories 0555)
//! <cache>/trees/sha256/.<hex>.tmp.<pid>.<n> an unpack in progress (flock'd while it runs)
//! ```
//!
//! `blobs/` and `trees/` are the daemon's own (0700): nothing else writes there, so they are
//! used by path. An entry's *last use* is the blob's access time, set explicitly whenever a volume
//! asks for it or it is assembled (so `noatime`/`relatime` mounts do not matter).
//!
//! At start, [`Store::open`] removes what a killed daemon left: unpacks no process holds locked,
//! trees half removed, and ranges files that no partial file goes with (or whose blob is
//! complete: a kill between the final rename and the ranges file's removal).

use std::collections::BTreeMap;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use rustix::fs::{FlockOperation, Mode, OFlags};

use super::error::OciError;
use crate::plan::tar_rules::Layering;

/// The cache's directories.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

/// One cached digest as found on disk.
#[derive(Debug, Clone)]
pub struct OnDisk {
    pub hex: String,
    /// The blob's size (0 when only its tree is left).
    pub blob_bytes: u64,
    /// The unpacked tree's file bytes.
    pub tree_bytes: u64,
    pub last_used: SystemTime,
    /// Some file of it has a name outside the cache (a hardlink in a volume): removing the
    /// entry would free nothing and lose the link to the cache.
    pub linked: bool,
}

/// The hex part of a `sha256:<64 hex>` digest.
pub fn hex_of(digest: &str) -> Result<&str, OciError> {
    match digest.strip_prefix("sha256:") {
        Some(hex) if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) => {
            Ok(hex)
        }
        _ => Err(OciError::Config(format!(
            "{digest:?} is not a sha256 digest (sha256: followed by 64 lower-case hex digits); only sha256 is supported"
        ))),
    }
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl Store {
    /// Open the cache at `root` (the daemon's `<state>/cache`, which other parts share), creating
    /// `blobs/` and `trees/` in it (0700: a linked file needs no path to the cache), and remove
    /// what a crash left (see the module's doc). Removing leftovers is best effort.
    pub fn open(root: &Path) -> io::Result<Store> {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(root)?;
        let store = Store { root: root.canonicalize()? };
        for top in ["blobs", "trees", "tables"] {
            let dir = store.root.join(top);
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir)?;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        }
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(store.blob_dir())?;
        for dir in store.tree_dirs() {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        }
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(store.table_dir())?;
        store.sweep_trees()?;
        store.sweep_sidecars()?;
        Ok(store)
    }

    /// Remove unpacks no process holds (another daemon sharing the cache may be unpacking into
    /// one: it holds a lock on it) and trees whose removal was interrupted.
    fn sweep_trees(&self) -> io::Result<()> {
        for entry in
            self.tree_dirs().iter().map(std::fs::read_dir).collect::<io::Result<Vec<_>>>()?.into_iter().flatten()
        {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if !name.starts_with('.') {
                continue;
            }
            let path = entry.path();
            let stale = if name.contains(".tmp.") {
                // Locked by its unpacker while it runs; a killed one's lock died with it.
                match rustix::fs::open(
                    &path,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                ) {
                    Ok(fd) => rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive).is_ok(),
                    Err(_) => false,
                }
            } else {
                name.contains(".trash.")
            };
            if stale && let Err(e) = remove_tree(&path) {
                // Another daemon removing it at the same time, or a file that will not go.
                tracing::warn!(path = %path.display(), error = %e, "removing a leftover of the model cache");
            }
        }
        Ok(())
    }

    /// Remove ranges and writer files (and their temporary names) no partial file goes with, or
    /// whose blob is complete. A partial file is left: a later `ensure` resumes it.
    fn sweep_sidecars(&self) -> io::Result<()> {
        for entry in std::fs::read_dir(self.blob_dir())? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(hex) = name
                .strip_suffix(".partial.json")
                .or_else(|| name.strip_suffix(".partial.json.tmp"))
                .or_else(|| name.strip_suffix(".partial.writer"))
            else {
                continue;
            };
            if !is_hex64(hex) {
                continue;
            }
            let orphan = self.partial(hex).symlink_metadata().is_err() || self.blob(hex).symlink_metadata().is_ok();
            if orphan {
                match std::fs::remove_file(entry.path()) {
                    Ok(()) => tracing::info!(path = %entry.path().display(), "removed a leftover ranges file"),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => {
                        tracing::warn!(path = %entry.path().display(), error = %e, "removing a leftover ranges file")
                    }
                }
            }
        }
        Ok(())
    }

    pub fn blob_dir(&self) -> PathBuf {
        self.root.join("blobs/sha256")
    }

    pub fn tree_dir(&self) -> PathBuf {
        self.root.join("trees/sha256")
    }

    pub fn blob(&self, hex: &str) -> PathBuf {
        self.blob_dir().join(hex)
    }

    pub fn partial(&self, hex: &str) -> PathBuf {
        self.blob_dir().join(format!("{hex}.partial"))
    }

    pub fn sidecar(&self, hex: &str) -> PathBuf {
        self.blob_dir().join(format!("{hex}.partial.json"))
    }

    /// Who downloaded into the partial file of `hex` last: a sha256 of the host contacted, the
    /// repository and the credentials' digest (`Scope::tag`), so that the same source resumes
    /// it after a restart without proving anything (its download is the proof).
    pub fn writer(&self, hex: &str) -> PathBuf {
        self.blob_dir().join(format!("{hex}.partial.writer"))
    }

    pub fn tree(&self, hex: &str) -> PathBuf {
        self.tree_dir().join(hex)
    }

    /// Where blobs unpacked as image layers go (whiteouts kept as markers, owners and modes
    /// kept: `exec::artifacts`), apart from the plain trees of the same blobs.
    pub fn image_tree_dir(&self) -> PathBuf {
        self.root.join("trees/image")
    }

    /// The tree of `hex` laid out as `layering` says.
    pub fn tree_of(&self, hex: &str, layering: Layering) -> PathBuf {
        match layering {
            Layering::Files => self.tree(hex),
            Layering::Image => self.image_tree_dir().join(hex),
        }
    }

    /// Both directories of trees.
    fn tree_dirs(&self) -> [PathBuf; 2] {
        [self.tree_dir(), self.image_tree_dir()]
    }

    /// Where the file tables of lazily served tar layers are kept.
    pub fn table_dir(&self) -> PathBuf {
        self.root.join("tables/sha256")
    }

    /// The kept file table of layer `hex` (oci/table.rs).
    pub fn table(&self, hex: &str) -> PathBuf {
        self.table_dir().join(format!("{hex}.json"))
    }

    /// A fresh, empty directory (0700) for an unpack, and the `flock` that tells another
    /// daemon's [`Store::open`] it is in use: held until the returned descriptor is dropped.
    pub fn new_tree_tmp(&self, hex: &str, layering: Layering) -> io::Result<(PathBuf, OwnedFd)> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = self.tree_of(hex, layering).parent().map(Path::to_path_buf).unwrap_or_else(|| self.tree_dir());
        let path = dir.join(format!(".{hex}.tmp.{}.{n}", std::process::id()));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        let fd = rustix::fs::open(
            &path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive)?;
        Ok((path, fd))
    }

    /// Is the verified blob there, with `size` bytes?
    pub fn present(&self, hex: &str, size: u64) -> bool {
        std::fs::symlink_metadata(self.blob(hex)).is_ok_and(|m| m.is_file() && m.len() == size)
    }

    /// Record a use of `hex` now (for eviction order). Best effort.
    pub fn touch(&self, hex: &str) {
        let now = rustix::fs::Timestamps {
            last_access: rustix::fs::Timespec { tv_sec: 0, tv_nsec: rustix::fs::UTIME_NOW },
            last_modification: rustix::fs::Timespec { tv_sec: 0, tv_nsec: rustix::fs::UTIME_OMIT },
        };
        for path in [self.blob(hex), self.tree(hex), self.tree_of(hex, Layering::Image)] {
            let _ = rustix::fs::utimensat(rustix::fs::CWD, &path, &now, rustix::fs::AtFlags::SYMLINK_NOFOLLOW);
        }
    }

    /// Every complete blob or tree in the cache.
    pub fn scan(&self) -> io::Result<Vec<OnDisk>> {
        let mut found: BTreeMap<String, OnDisk> = BTreeMap::new();
        for entry in std::fs::read_dir(self.blob_dir())? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !is_hex64(&name) {
                continue;
            }
            let Ok(meta) = entry.path().symlink_metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            found.insert(
                name.clone(),
                OnDisk {
                    hex: name,
                    blob_bytes: meta.len(),
                    tree_bytes: 0,
                    last_used: atime(&meta),
                    linked: meta.nlink() > 1,
                },
            );
        }
        for entry in
            self.tree_dirs().iter().map(std::fs::read_dir).collect::<io::Result<Vec<_>>>()?.into_iter().flatten()
        {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !is_hex64(&name) {
                continue;
            }
            let Ok(meta) = entry.path().symlink_metadata() else { continue };
            let (bytes, linked) = tree_usage(&entry.path())?;
            let e = found.entry(name.clone()).or_insert_with(|| OnDisk {
                hex: name,
                blob_bytes: 0,
                tree_bytes: 0,
                last_used: atime(&meta),
                linked: false,
            });
            e.tree_bytes += bytes;
            e.linked |= linked;
        }
        Ok(found.into_values().collect())
    }

    /// Remove `hex`'s tree and blob (a tree first: a tree without its blob is still usable, a
    /// blob without its tree is re-unpacked).
    pub fn evict(&self, hex: &str) -> io::Result<()> {
        remove_tree(&self.tree(hex))?;
        remove_tree(&self.tree_of(hex, Layering::Image))?;
        let _ = std::fs::remove_file(self.table(hex));
        match std::fs::remove_file(self.blob(hex)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// The ranges an interrupted download of `hex` (`size` bytes) left in its partial file, as
    /// its ranges file says (`None` without a consistent one).
    pub fn partial_ranges(&self, hex: &str, size: u64) -> Option<super::segments::Segments> {
        let len = std::fs::symlink_metadata(self.partial(hex)).ok().filter(|m| m.is_file())?.len();
        let text = std::fs::read_to_string(self.sidecar(hex)).ok()?;
        super::segments::Segments::decode(&text, size, len)
    }

    /// Put `bytes`, already verified against `hex`, in place as that blob (a small one: a chunk
    /// index): a fresh file, fsync'd, 0444, renamed.
    pub fn put_verified(&self, hex: &str, bytes: &[u8]) -> io::Result<()> {
        use std::io::Write;
        if self.present(hex, bytes.len() as u64) {
            return Ok(());
        }
        let (mut f, tmp) = self.begin_put(hex)?;
        let written = f.write_all(bytes).and_then(|()| self.finish_put(f, &tmp, hex));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }

    /// A new temporary file in the blob directory, for bytes that become blob `hex` by
    /// [`Store::finish_put`] once verified (removed by the caller otherwise).
    pub fn begin_put(&self, hex: &str) -> io::Result<(std::fs::File, PathBuf)> {
        use std::os::unix::fs::OpenOptionsExt;
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let tmp =
            self.blob_dir().join(format!(".{hex}.put.{}.{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
        let f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        Ok((f, tmp))
    }

    /// Make the verified bytes written to `tmp` blob `hex`: synced, read-only, renamed.
    pub fn finish_put(&self, f: std::fs::File, tmp: &Path, hex: &str) -> io::Result<()> {
        f.sync_all()?;
        f.set_permissions(std::fs::Permissions::from_mode(0o444))?;
        std::fs::rename(tmp, self.blob(hex))
    }

    /// Remove an interrupted download's files.
    pub fn drop_partial(&self, hex: &str) {
        let _ = std::fs::remove_file(self.partial(hex));
        let _ = std::fs::remove_file(self.writer(hex));
        let _ = std::fs::remove_file(self.sidecar(hex));
        let _ = std::fs::remove_file(self.sidecar(hex).with_extension("json.tmp"));
    }
}

fn atime(meta: &std::fs::Metadata) -> SystemTime {
    meta.accessed().or_else(|_| meta.modified()).unwrap_or(SystemTime::UNIX_EPOCH)
}

/// The bytes of a tree's regular files, and whether any of them has a name outside the tree
/// (more links than names inside it).
fn tree_usage(path: &Path) -> io::Result<(u64, bool)> {
    let mut names: BTreeMap<(u64, u64), (u64, u64)> = BTreeMap::new(); // (dev, ino) -> (nlink, seen)
    let mut bytes = 0;
    let mut stack = vec![(path.to_path_buf(), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        if depth > 256 {
            return Err(io::Error::other(format!("{} is nested too deep", dir.display())));
        }
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let meta = entry.path().symlink_metadata()?;
            if meta.is_dir() {
                stack.push((entry.path(), depth + 1));
            } else if meta.is_file() {
                let seen = names.entry((meta.dev(), meta.ino())).or_insert((meta.nlink(), 0));
                if seen.1 == 0 {
                    bytes += meta.len();
                }
                seen.1 += 1;
            }
        }
    }
    Ok((bytes, names.values().any(|(nlink, seen)| nlink > seen)))
}

/// Remove a tree of the cache (read-only directories included): renamed aside first, so it
/// disappears at once, then emptied. A missing one is fine.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    let meta = match path.symlink_metadata() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        other => other?,
    };
    if !meta.is_dir() {
        return std::fs::remove_file(path);
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let trash = if name.contains(".trash.") {
        path.to_path_buf()
    } else {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let trash = path.with_file_name(format!(".{}.trash.{}.{n}", name.trim_start_matches('.'), std::process::id()));
        std::fs::rename(path, &trash)?;
        trash
    };
    empty_and_remove(&trash, 0)
}

fn empty_and_remove(dir: &Path, depth: usize) -> io::Result<()> {
    if depth > 256 {
        return Err(io::Error::other(format!("{} is nested too deep", dir.display())));
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.path().symlink_metadata()?;
        if meta.is_dir() {
            empty_and_remove(&entry.path(), depth + 1)?;
        } else {
            std::fs::remove_file(entry.path())?;
        }
    }
    std::fs::remove_dir(dir)
}
