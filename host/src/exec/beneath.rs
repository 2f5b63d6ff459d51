//! Symlink-proof paths. Everything the host daemon touches lies below one of its *anchors*:
//! kubelet's directory and its own state directory, both trusted and made canonical at start.
//! Anything below an anchor is hostile: a pod writes inside its volumes, a backend inside its
//! mount, and a kubelet path may be swapped while a call runs.
//!
//! So a path is never used by name. It is resolved at the syscall, relative to the anchor's
//! file descriptor, with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`:
//! no component may be a symbolic link and resolution cannot leave the anchor. Kernels without
//! `openat2` (before 5.6) get the same guarantee from a walk of one `O_PATH | O_NOFOLLOW` open
//! per component (paths never hold `..`, so nothing can climb out). The operation then acts on
//! the descriptor: `mkdirat`, `unlinkat`, `renameat`, `fstatvfs`, a mount onto it.
//!
//! Tear-down never descends through a symlink (it unlinks the link) nor into a mount: every
//! directory is opened with `RESOLVE_NO_XDEV`, and a mount point below the tree stops it with an
//! error instead of emptying someone's filesystem. (The walk fallback compares `st_dev` only,
//! so there a bind mount from the same filesystem is not seen as a mount point.)
//!
//! Each anchor directory is opened once, at its first use, and kept: the anchors are trusted
//! configuration, and replacing one of them (not something below it) needs a daemon restart.
//!
//! A refused symlink is a [`LinkRefused`] error naming the link ([`is_link_refused`] tells it
//! apart); a missing parent is [`io::ErrorKind::NotFound`] naming the parent.

use std::ffi::{OsStr, OsString};
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// How deep a tear-down may descend before it gives up (a hostile tree could be deeper than
/// the stack).
const MAX_DEPTH: usize = 256;

/// The directories every path must lie below, and how to resolve inside them.
#[derive(Debug, Clone)]
pub struct Anchors {
    dirs: Vec<PathBuf>,
    /// Each anchor's directory, opened once (`O_PATH`) at its first use.
    fds: std::sync::Arc<Vec<std::sync::OnceLock<OwnedFd>>>,
    /// Resolve by walking components even where `openat2` exists (tests of the fallback).
    walk: bool,
}

/// One entry of a listed directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its name.
    pub name: OsString,
    /// A directory (not a link to one).
    pub is_dir: bool,
    /// A regular file.
    pub is_file: bool,
}

impl Anchors {
    /// Paths must lie below one of `dirs` (absolute, canonical: the caller resolves links in
    /// the anchors themselves, which are trusted configuration).
    pub fn new(dirs: impl IntoIterator<Item = PathBuf>) -> Self {
        let dirs: Vec<PathBuf> = dirs.into_iter().collect();
        let fds = std::sync::Arc::new(dirs.iter().map(|_| std::sync::OnceLock::new()).collect());
        Anchors { dirs, fds, walk: false }
    }

    /// Use the component walk instead of `openat2` (what kernels before 5.6 get).
    pub fn with_walk(mut self) -> Self {
        self.walk = true;
        self
    }

    /// The anchor holding `path` (the longest one) and the rest of the path, checked
    /// lexically: absolute, no `.`, `..` or empty components.
    fn split<'a>(&self, path: &'a Path) -> io::Result<(&Path, &'a Path)> {
        self.split_at(path).map(|(_, a, r)| (a, r))
    }

    /// [`Anchors::split`], with the anchor's index.
    fn split_at<'a>(&self, path: &'a Path) -> io::Result<(usize, &Path, &'a Path)> {
        let (i, anchor) = self
            .dirs
            .iter()
            .enumerate()
            .filter(|(_, a)| path.starts_with(a))
            .max_by_key(|(_, a)| a.as_os_str().len())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("{} is outside the directories this host manages", path.display()),
                )
            })?;
        let rel = path.strip_prefix(anchor).expect("checked by starts_with");
        if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a normalised path", path.display()),
            ));
        }
        Ok((i, anchor, rel))
    }

    /// The anchor's directory, opened at its first use (it is trusted configuration and stays).
    fn root(&self, i: usize, anchor: &Path) -> io::Result<&OwnedFd> {
        if let Some(fd) = self.fds[i].get() {
            return Ok(fd);
        }
        let fd = open_anchor(anchor, OFlags::PATH | OFlags::DIRECTORY)?;
        Ok(self.fds[i].get_or_init(|| fd))
    }

    /// Open `path` with `flags` (plus `O_CLOEXEC | O_NOFOLLOW`), resolved below its anchor
    /// without following any symbolic link.
    pub fn open(&self, path: &Path, flags: OFlags) -> io::Result<OwnedFd> {
        let (i, anchor, rel) = self.split_at(path)?;
        if rel.as_os_str().is_empty() {
            return open_anchor(anchor, flags);
        }
        let root = self.root(i, anchor)?;
        self.resolve(root, rel, flags, ResolveFlags::empty()).map_err(|e| explain(e, anchor, rel, path))
    }

    /// The parent directory of `path` (opened `O_PATH`) and its final name. The parent is
    /// resolved like [`Anchors::open`]; the name is acted on with `*at` calls that never
    /// follow it.
    pub fn open_parent(&self, path: &Path) -> io::Result<(OwnedFd, OsString)> {
        let (_, rel) = self.split(path)?;
        let name = rel.file_name().ok_or_else(|| {
            io::Error::new(io::ErrorKind::PermissionDenied, format!("{} is an anchor itself", path.display()))
        })?;
        let parent = path.parent().expect("a path below an anchor has a parent");
        let fd = self.open(parent, OFlags::PATH | OFlags::DIRECTORY)?;
        Ok((fd, name.to_os_string()))
    }

    /// Resolve `rel` below the directory `at`. The path is resolved to an `O_PATH` descriptor
    /// first and judged on it (a final link is refused as a link, a non-directory where one is
    /// asked for is ENOTDIR); other access is a reopen of that very inode through
    /// `/proc/self/fd`, so nothing swapped in between can change what was judged.
    fn resolve(&self, at: &OwnedFd, rel: &Path, flags: OFlags, extra: ResolveFlags) -> io::Result<OwnedFd> {
        let path_only = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = 'open: {
            if !self.walk {
                let how = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS | extra;
                match rustix::fs::openat2(at, rel, path_only, Mode::empty(), how) {
                    Err(Errno::NOSYS) => {}
                    other => break 'open other?,
                }
            }
            walk(at, rel, extra.contains(ResolveFlags::NO_XDEV))?
        };
        // `O_PATH | O_NOFOLLOW` opens a final link itself instead of failing: refuse it here.
        let kind = FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode);
        if kind == FileType::Symlink {
            return Err(Errno::LOOP.into());
        }
        if flags.contains(OFlags::DIRECTORY) && kind != FileType::Directory {
            return Err(Errno::NOTDIR.into());
        }
        if flags.contains(OFlags::PATH) {
            return Ok(fd);
        }
        let again = flags & !(OFlags::NOFOLLOW) | OFlags::CLOEXEC;
        Ok(rustix::fs::open(format!("/proc/self/fd/{}", fd.as_raw_fd()), again, Mode::empty())?)
    }

    /// Create the directory `path` (mode `mode`) and any missing directories between `below`
    /// and it. `below` must exist: it is where creation may start (kubelet creates a target's
    /// parent; the host creates what lies below). An existing directory is fine.
    pub fn mkdir(&self, path: &Path, below: &Path, mode: u32) -> io::Result<()> {
        let rest = path.strip_prefix(below).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{} is not below {}", path.display(), below.display()))
        })?;
        let mut at = match self.open(below, OFlags::PATH | OFlags::DIRECTORY) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{} does not exist (it must exist before {} is created)", below.display(), path.display()),
                ));
            }
            other => other?,
        };
        let mode = Mode::from_raw_mode(mode);
        let mut done = below.to_path_buf();
        for c in rest.components() {
            let Component::Normal(name) = c else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} is not normalised", path.display()),
                ));
            };
            done.push(name);
            let last = done == path;
            let open = |at: &OwnedFd| {
                self.resolve(at, Path::new(name), OFlags::PATH | OFlags::DIRECTORY, ResolveFlags::empty())
            };
            at = match open(&at) {
                Ok(fd) => fd,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    match rustix::fs::mkdirat(&at, name, mode) {
                        // Made by us, in the directory we hold: nothing to look at again.
                        Ok(()) if last => return Ok(()),
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(with_path(e.into(), &done)),
                    }
                    open(&at).map_err(|e| explain_one(e, &done))?
                }
                Err(e) => return Err(explain_one(e, &done)),
            };
        }
        Ok(())
    }

    /// Create `path` as a private (0700) directory below its anchor, and tighten an existing
    /// one to 0700.
    pub fn private_dir(&self, path: &Path) -> io::Result<()> {
        let (anchor, _) = self.split(path)?;
        let anchor = anchor.to_path_buf();
        self.mkdir(path, &anchor, 0o700)?;
        let fd = self.open(path, OFlags::RDONLY | OFlags::DIRECTORY)?;
        let st = rustix::fs::fstat(&fd)?;
        if st.st_mode & 0o077 != 0 {
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o700))?;
        }
        Ok(())
    }

    /// Remove a file, a symbolic link (never followed) or an empty directory; a missing one is
    /// fine. A mount point is never removed (EBUSY).
    pub fn remove_entry(&self, path: &Path) -> io::Result<()> {
        let (parent, name) = match self.open_parent(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            other => other?,
        };
        let kind = match rustix::fs::statat(&parent, &name, AtFlags::SYMLINK_NOFOLLOW) {
            Err(Errno::NOENT) => None,
            Ok(st) => Some(FileType::from_raw_mode(st.st_mode)),
            Err(e) => return Err(with_path(e.into(), path)),
        };
        if let Some(kind) = kind {
            let flags = if kind == FileType::Directory { AtFlags::REMOVEDIR } else { AtFlags::empty() };
            match rustix::fs::unlinkat(&parent, &name, flags) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(e) => return Err(with_path(e.into(), path)),
            }
        }
        // A file written by `write_atomic` goes with its spare (also one a crash left behind).
        if kind != Some(FileType::Directory) {
            match rustix::fs::unlinkat(&parent, spare_name(&name), AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(e) => return Err(with_path(e.into(), path)),
            }
        }
        Ok(())
    }

    /// Remove `path` and everything below it; a missing one is fine. A symbolic link is
    /// removed, never followed; a mount point anywhere in the tree (or `path` itself) stops
    /// the removal with an error.
    pub fn remove_tree(&self, path: &Path) -> io::Result<()> {
        let (parent, name) = match self.open_parent(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            other => other?,
        };
        self.remove_below(&parent, &name, path, 0)
    }

    fn remove_below(&self, parent: &OwnedFd, name: &OsStr, shown: &Path, depth: usize) -> io::Result<()> {
        let st = match rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
            Err(Errno::NOENT) => return Ok(()),
            other => other?,
        };
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            return match rustix::fs::unlinkat(parent, name, AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => Ok(()),
                Err(e) => Err(with_path(e.into(), shown)),
            };
        }
        if depth >= MAX_DEPTH {
            return Err(io::Error::other(format!("{} is nested deeper than {MAX_DEPTH} levels", shown.display())));
        }
        let dir = match self.resolve(parent, Path::new(name), OFlags::RDONLY | OFlags::DIRECTORY, ResolveFlags::NO_XDEV)
        {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(Errno::XDEV.raw_os_error()) => {
                return Err(io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    format!("{} is a mount point; refusing to remove anything below it", shown.display()),
                ));
            }
            Err(e) => return Err(explain_one(e, shown)),
        };
        for entry in list_fd(&dir)? {
            self.remove_below(&dir, &entry.name, &shown.join(&entry.name), depth + 1)?;
        }
        match rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(with_path(e.into(), shown)),
        }
    }

    /// Replace `path` with `bytes` atomically, mode `mode`: a reader, or the next process after
    /// a crash of this one, sees the old content or the new, never a mix.
    ///
    /// Without `sync` (volume state: worthless after a reboot, see `volume::state`), the bytes
    /// are written in place into a spare file kept beside it (`.<name>.spare`), which is then
    /// swapped with the file by `renameat2(RENAME_EXCHANGE)`: no inode is created or freed, which
    /// on ext4 costs ~8 µs against ~270 µs for a new temporary file and a rename. A crash while
    /// the spare is written leaves the file as it was. Writers of a directory take turns on its
    /// `flock`; the writer holds an exclusive one on the spare while it writes and
    /// [`Anchors::read`] a shared one, so a reader that still holds the inode swapped out
    /// earlier never sees it rewritten. Filesystems without the exchange
    /// get the temporary file. With `sync`, a fresh temporary file, fsync'd, is renamed over the file and
    /// the directory fsync'd.
    pub fn write_atomic(&self, path: &Path, bytes: &[u8], mode: u32, sync: bool) -> io::Result<()> {
        let (_, rel) = self.split(path)?;
        let name = rel.file_name().ok_or_else(|| io::Error::other(format!("{} has no file name", path.display())))?;
        let parent_path = path.parent().expect("below an anchor");
        let parent = self.open(parent_path, OFlags::RDONLY | OFlags::DIRECTORY)?;
        if !sync {
            match exchange(&parent, name, bytes, mode) {
                // The filesystem cannot exchange: a temporary file instead.
                Err(e)
                    if [Errno::INVAL, Errno::OPNOTSUPP, Errno::NOSYS]
                        .iter()
                        .any(|n| e.raw_os_error() == Some(n.raw_os_error())) => {}
                other => return other.map_err(|e| with_path(e, path)),
            }
        }
        // Unique per write: two writers of one file never share a half-written temporary.
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let mut tmp = OsString::from(".");
        tmp.push(name);
        tmp.push(format!("{TMP_MARK}{}.{n}", std::process::id()));
        let result = (|| {
            let fd = rustix::fs::openat(
                &parent,
                &tmp,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(mode),
            )?;
            let mut file = std::fs::File::from(fd);
            file.write_all(bytes)?;
            if sync {
                file.sync_all()?;
            }
            rustix::fs::renameat(&parent, &tmp, &parent, name)?;
            if sync {
                rustix::fs::fsync(&parent)?;
            }
            Ok::<_, io::Error>(())
        })();
        if result.is_err() {
            let _ = rustix::fs::unlinkat(&parent, &tmp, AtFlags::empty());
        }
        result.map_err(|e| with_path(e, path))
    }

    /// Open the regular file `path` for appending and reading (created with `mode` if
    /// missing), e.g. a program's log.
    pub fn append(&self, path: &Path, mode: u32) -> io::Result<std::fs::File> {
        let (parent, name) = self.open_parent(path)?;
        let flags =
            OFlags::RDWR | OFlags::APPEND | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&parent, &name, flags, Mode::from_raw_mode(mode))
            .map_err(|e| explain_one(e.into(), path))?;
        regular(&fd, path)?;
        // Non-blocking only to open (a FIFO planted there must not hang the daemon).
        rustix::fs::fcntl_setfl(&fd, rustix::fs::fcntl_getfl(&fd)? & !OFlags::NONBLOCK)?;
        Ok(std::fs::File::from(fd))
    }

    /// The content of the regular file `path`, or `None` if it does not exist. Read under a
    /// shared lock: the inode a reader holds may become the spare of a later
    /// [`Anchors::write_atomic`], whose writer waits for the lock before rewriting it.
    pub fn read(&self, path: &Path) -> io::Result<Option<Vec<u8>>> {
        let fd = match self.open(path, OFlags::RDONLY | OFlags::NONBLOCK) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            other => other?,
        };
        regular(&fd, path)?;
        rustix::fs::flock(&fd, rustix::fs::FlockOperation::LockShared)?;
        let mut out = Vec::new();
        io::Read::read_to_end(&mut std::fs::File::from(fd), &mut out)?;
        Ok(Some(out))
    }

    /// The entries of the directory `path` (empty if it does not exist).
    pub fn list(&self, path: &Path) -> io::Result<Vec<Entry>> {
        match self.open(path, OFlags::RDONLY | OFlags::DIRECTORY) {
            Ok(fd) => list_fd(&fd),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// When `path` was last modified.
    pub fn modified(&self, path: &Path) -> io::Result<std::time::SystemTime> {
        let fd = self.open(path, OFlags::PATH)?;
        let st = rustix::fs::fstat(&fd)?;
        let secs = u64::try_from(st.st_mtime).unwrap_or(0);
        let nanos = u32::try_from(st.st_mtime_nsec).unwrap_or(0);
        Ok(std::time::UNIX_EPOCH + std::time::Duration::new(secs, nanos))
    }
}

/// A symbolic link was found where a path was resolved.
#[derive(Debug, thiserror::Error)]
#[error("{}: {} is a symbolic link; mounthost never follows links inside the directories it manages", path.display(), link.display())]
pub struct LinkRefused {
    /// The path being resolved.
    pub path: PathBuf,
    /// The component that is a link.
    pub link: PathBuf,
}

/// Is `e` a refused symbolic link (ours, or ELOOP from the kernel)?
pub fn is_link_refused(e: &io::Error) -> bool {
    e.raw_os_error() == Some(Errno::LOOP.raw_os_error()) || e.get_ref().is_some_and(|i| i.is::<LinkRefused>())
}

fn refused(path: &Path, link: &Path) -> io::Error {
    io::Error::other(LinkRefused { path: path.to_path_buf(), link: link.to_path_buf() })
}

/// The spare file kept beside `name` for [`Anchors::write_atomic`]: `.<name>.spare`.
pub fn spare_name(name: &OsStr) -> OsString {
    let mut spare = OsString::from(".");
    spare.push(name);
    spare.push(SPARE_MARK);
    spare
}

/// What ends the name of a spare file.
pub const SPARE_MARK: &str = ".spare";

/// Write `bytes` into `name`'s spare in place and swap it with `name`. Writers of one
/// directory take turns on its lock (held for the few microseconds of a write); the spare's own
/// lock waits for a reader still holding that inode. A spare that is not a regular file with one
/// link is replaced. EINVAL, EOPNOTSUPP or ENOSYS: the filesystem cannot exchange (the caller
/// falls back).
fn exchange(parent: &OwnedFd, name: &OsStr, bytes: &[u8], mode: u32) -> io::Result<()> {
    rustix::fs::flock(parent, rustix::fs::FlockOperation::LockExclusive)?;
    let spare = spare_name(name);
    let flags = OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let lone = |fd: &OwnedFd| {
        let st = rustix::fs::fstat(fd)?;
        Ok::<_, Errno>(FileType::from_raw_mode(st.st_mode) == FileType::RegularFile && st.st_nlink == 1)
    };
    let fd = match rustix::fs::openat(parent, &spare, flags | OFlags::NONBLOCK, Mode::from_raw_mode(mode)) {
        Ok(fd) if lone(&fd)? => fd,
        // Not a spare this writer made (a link, a FIFO, a second name for another file that
        // would be rewritten through it): start a fresh one.
        Ok(_) | Err(Errno::LOOP) | Err(Errno::NXIO) => {
            rustix::fs::unlinkat(parent, &spare, AtFlags::empty())?;
            rustix::fs::openat(parent, &spare, flags | OFlags::EXCL, Mode::from_raw_mode(mode))?
        }
        Err(e) => return Err(e.into()),
    };
    rustix::fs::flock(&fd, rustix::fs::FlockOperation::LockExclusive)?;
    if rustix::fs::fstat(&fd)?.st_mode & 0o7777 != mode {
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))?;
    }
    let mut done = 0;
    while done < bytes.len() {
        done += rustix::io::pwrite(&fd, &bytes[done..], done as u64)?;
    }
    rustix::fs::ftruncate(&fd, bytes.len() as u64)?;
    match rustix::fs::renameat_with(parent, &spare, parent, name, rustix::fs::RenameFlags::EXCHANGE) {
        Ok(()) => Ok(()),
        // No file yet: the spare becomes it (the next write makes a new spare).
        Err(Errno::NOENT) => Ok(rustix::fs::renameat(parent, &spare, parent, name)?),
        Err(e) => Err(e.into()),
    }
}

/// Refuse anything but a regular file (a FIFO or device planted where a file is expected).
fn regular(fd: &OwnedFd, path: &Path) -> io::Result<()> {
    if FileType::from_raw_mode(rustix::fs::fstat(fd)?.st_mode) == FileType::RegularFile {
        Ok(())
    } else {
        Err(io::Error::new(io::ErrorKind::InvalidData, format!("{} is not a regular file", path.display())))
    }
}

/// What marks a temporary file of [`Anchors::write_atomic`]: `.<name>.tmp.<pid>.<n>`.
pub const TMP_MARK: &str = ".tmp.";

fn open_anchor(anchor: &Path, flags: OFlags) -> io::Result<OwnedFd> {
    // The anchor itself is trusted configuration (made canonical at start).
    rustix::fs::open(anchor, flags | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| with_path(e.into(), anchor))
}

/// The component walk: one `openat(O_PATH | O_NOFOLLOW)` per component, refusing links.
/// Returns an `O_PATH` descriptor of the last component.
fn walk(at: &OwnedFd, rel: &Path, no_xdev: bool) -> io::Result<OwnedFd> {
    let mut cur: Option<OwnedFd> = None;
    for part in rel.iter() {
        let dir = cur.as_ref().map(AsFd::as_fd).unwrap_or(at.as_fd());
        let fd = rustix::fs::openat(dir, part, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?;
        let st = rustix::fs::fstat(&fd)?;
        if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
            return Err(Errno::LOOP.into());
        }
        if no_xdev && st.st_dev != rustix::fs::fstat(dir)?.st_dev {
            return Err(Errno::XDEV.into());
        }
        cur = Some(fd);
    }
    cur.ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))
}

fn list_fd(fd: &OwnedFd) -> io::Result<Vec<Entry>> {
    let mut out = Vec::new();
    for entry in Dir::read_from(fd)? {
        let entry = entry?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name == "." || name == ".." {
            continue;
        }
        let kind = match entry.file_type() {
            FileType::Unknown => {
                FileType::from_raw_mode(rustix::fs::statat(fd, name, AtFlags::SYMLINK_NOFOLLOW)?.st_mode)
            }
            t => t,
        };
        out.push(Entry {
            name: name.to_os_string(),
            is_dir: kind == FileType::Directory,
            is_file: kind == FileType::RegularFile,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

fn with_path(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// Could `e` come from a link on the way (ELOOP, or ENOTDIR where a directory was asked for)?
fn maybe_link(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(n) if n == Errno::LOOP.raw_os_error() || n == Errno::NOTDIR.raw_os_error())
}

fn explain_one(e: io::Error, path: &Path) -> io::Error {
    if maybe_link(&e) && std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        return refused(path, path);
    }
    if e.raw_os_error() == Some(Errno::LOOP.raw_os_error()) {
        return refused(path, path);
    }
    with_path(e, path)
}

/// Name the component that made a resolution fail: the first link on the way for ELOOP (a
/// diagnostic walk for the message only; nothing is decided on it), the path otherwise.
fn explain(e: io::Error, anchor: &Path, rel: &Path, path: &Path) -> io::Error {
    if !maybe_link(&e) {
        return with_path(e, path);
    }
    let mut at = anchor.to_path_buf();
    for part in rel.iter() {
        at.push(part);
        if std::fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink()) {
            return refused(path, &at);
        }
    }
    if e.raw_os_error() == Some(Errno::LOOP.raw_os_error()) {
        return refused(path, path);
    }
    with_path(e, path)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{PermissionsExt, symlink};

    use super::*;

    fn both(root: &Path) -> [Anchors; 2] {
        let a = Anchors::new([root.to_path_buf()]);
        [a.clone(), a.with_walk()]
    }

    fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let root = base.join("root");
        let outside = base.join("outside");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), b"s").unwrap();
        symlink(&outside, root.join("a/evil")).unwrap();
        symlink("b", root.join("a/rel")).unwrap();
        (dir, root, outside)
    }

    #[test]
    fn links_are_refused_at_every_component_with_the_link_named() {
        let (_d, root, _outside) = setup();
        for a in both(&root) {
            for p in ["a/evil", "a/evil/secret", "a/rel", "a/rel/x"] {
                let e = a.open(&root.join(p), OFlags::PATH).unwrap_err();
                assert!(is_link_refused(&e), "{p}: {e}");
                assert!(e.to_string().contains("is a symbolic link"), "{e}");
            }
            a.open(&root.join("a/b"), OFlags::PATH).expect("plain directories resolve");
            let e = a.open(Path::new("/etc"), OFlags::PATH).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        }
    }

    #[test]
    fn mkdir_creates_below_only_and_never_through_links() {
        let (_d, root, outside) = setup();
        for (i, a) in both(&root).into_iter().enumerate() {
            let p = root.join(format!("a/b/new{i}/deeper"));
            a.mkdir(&p, &root.join("a/b"), 0o750).unwrap();
            assert!(p.is_dir());
            a.mkdir(&p, &root.join("a/b"), 0o750).expect("existing is fine");
            let e = a.mkdir(&root.join("a/evil/x"), &root.join("a"), 0o750).unwrap_err();
            assert!(is_link_refused(&e), "{e}");
            let e = a.mkdir(&root.join("missing/x"), &root.join("missing"), 0o750).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::NotFound);
            assert!(e.to_string().contains("missing does not exist"), "{e}");
        }
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 1, "nothing created outside");
    }

    #[test]
    fn remove_tree_unlinks_links_and_stops_at_nothing_outside() {
        let (_d, root, outside) = setup();
        for a in both(&root) {
            std::fs::create_dir_all(root.join("t/x/y")).unwrap();
            std::fs::write(root.join("t/x/y/f"), b"1").unwrap();
            symlink(&outside, root.join("t/x/out")).unwrap();
            a.remove_tree(&root.join("t")).unwrap();
            assert!(!root.join("t").exists());
            a.remove_tree(&root.join("t")).expect("missing is fine");
            assert!(outside.join("secret").exists(), "a link's target is never touched");
            // A link as the tree itself is removed, not followed.
            symlink(&outside, root.join("t")).unwrap();
            a.remove_tree(&root.join("t")).unwrap();
            assert!(outside.join("secret").exists() && std::fs::symlink_metadata(root.join("t")).is_err());
            // Through a link on the way: refused.
            let e = a.remove_tree(&root.join("a/evil/secret")).unwrap_err();
            assert!(is_link_refused(&e), "{e}");
            assert!(outside.join("secret").exists());
        }
    }

    #[test]
    fn atomic_writes_are_private_and_leave_no_temporary() {
        let (_d, root, outside) = setup();
        let a = &both(&root)[0];
        let p = root.join("a/state.json");
        a.write_atomic(&p, b"one", 0o600, false).unwrap();
        a.write_atomic(&p, b"two", 0o600, true).unwrap();
        assert_eq!(a.read(&p).unwrap().unwrap(), b"two");
        // The exchange: longer, then shorter content; the spare keeps the old one, never torn.
        a.write_atomic(&p, b"three-longer", 0o600, false).unwrap();
        a.write_atomic(&p, b"four", 0o600, false).unwrap();
        assert_eq!(a.read(&p).unwrap().unwrap(), b"four");
        let spare = root.join("a/.state.json.spare");
        assert_eq!(std::fs::read(&spare).unwrap(), b"three-longer", "the previous content, swapped out whole");
        assert_eq!(std::fs::metadata(&spare).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(a.read(&root.join("a/none")).unwrap(), None);
        let names: Vec<_> = a.list(&root.join("a")).unwrap().into_iter().map(|e| e.name).collect();
        assert_eq!(names, [".state.json.spare", "b", "evil", "rel", "state.json"].map(OsString::from));
        let e = a.write_atomic(&root.join("a/evil/planted"), b"x", 0o600, false).unwrap_err();
        assert!(is_link_refused(&e), "{e}");
        assert!(!outside.join("planted").exists());
        let e = a.read(&root.join("a/evil/secret")).unwrap_err();
        assert!(is_link_refused(&e), "{e}");
        a.remove_entry(&p).unwrap();
        assert!(!spare.exists(), "the spare goes with its file");
        a.remove_entry(&p).expect("gone is fine");
        a.remove_entry(&root.join("a/evil")).unwrap();
        assert!(outside.join("secret").exists(), "removing a link leaves its target");
    }

    #[test]
    fn a_spare_that_is_not_a_lone_regular_file_is_replaced_not_written_through() {
        let (_d, root, outside) = setup();
        let a = &both(&root)[0];
        let p = root.join("a/state.json");
        let spare = root.join("a/.state.json.spare");
        a.write_atomic(&p, b"one", 0o600, false).unwrap();
        // A second name for a file elsewhere in the tree, and a link out: neither is written.
        std::fs::write(root.join("a/b/other"), b"other").unwrap();
        std::fs::hard_link(root.join("a/b/other"), &spare).unwrap();
        a.write_atomic(&p, b"two", 0o600, false).unwrap();
        assert_eq!(std::fs::read(root.join("a/b/other")).unwrap(), b"other");
        assert_eq!(a.read(&p).unwrap().unwrap(), b"two");
        std::fs::remove_file(&spare).unwrap();
        symlink(outside.join("secret"), &spare).unwrap();
        a.write_atomic(&p, b"three", 0o600, false).unwrap();
        assert_eq!(std::fs::read(outside.join("secret")).unwrap(), b"s");
        assert_eq!(a.read(&p).unwrap().unwrap(), b"three");
        assert!(std::fs::symlink_metadata(&spare).unwrap().is_file(), "a fresh spare");
    }

    #[test]
    fn concurrent_writers_and_readers_never_see_a_torn_file() {
        let (_d, root, _) = setup();
        let a = std::sync::Arc::new(both(&root)[0].clone());
        let p = root.join("a/contended.json");
        let value = |w: usize, i: usize| format!("{w}:{i}:{}", "x".repeat((w * 37 + i * 11) % 3000)).into_bytes();
        a.write_atomic(&p, &value(0, 0), 0o600, false).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (a, p, stop) = (a.clone(), p.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut reads = 0;
                while !stop.load(Ordering::Relaxed) {
                    let got = a.read(&p).unwrap().expect("the file is never missing");
                    let text = String::from_utf8(got).unwrap();
                    let mut parts = text.splitn(3, ':');
                    let (w, i) =
                        (parts.next().unwrap().parse::<usize>().unwrap(), parts.next().unwrap().parse().unwrap());
                    assert_eq!(text.into_bytes(), value(w, i), "a whole value");
                    reads += 1;
                }
                reads
            })
        };
        let writers: Vec<_> = (1..=4)
            .map(|w| {
                let (a, p) = (a.clone(), p.clone());
                std::thread::spawn(move || {
                    for i in 0..300 {
                        a.write_atomic(&p, &value(w, i), 0o600, false).unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
    }

    #[test]
    fn private_dirs_are_tightened() {
        let (_d, root, _) = setup();
        let a = &both(&root)[0];
        std::fs::create_dir_all(root.join("s/v")).unwrap();
        std::fs::set_permissions(root.join("s/v"), std::fs::Permissions::from_mode(0o755)).unwrap();
        a.private_dir(&root.join("s/v")).unwrap();
        assert_eq!(std::fs::metadata(root.join("s/v")).unwrap().permissions().mode() & 0o777, 0o700);
        a.private_dir(&root.join("s/w/x")).unwrap();
        assert_eq!(std::fs::metadata(root.join("s/w/x")).unwrap().permissions().mode() & 0o777, 0o700);
    }
}
