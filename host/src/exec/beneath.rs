//! Symlink-proof paths. Everything the host daemon touches lies below one of its *anchors*:
//! kubelet's directory and its own state directory, both trusted and made canonical at start.
//! Anything below an anchor is hostile: a pod writes inside its volumes, a backend inside its
//! mount, and a kubelet path may be swapped while a call runs.
//!
//! So a path is never used by name. It is resolved at the syscall, relative to the anchor's
//! file descriptor, with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`:
//! no component may be a symbolic link and resolution cannot leave the anchor (a path longer
//! than `PATH_MAX`, which a pod can make, is resolved in pieces, each with the same flags from
//! where the last one ended). Kernels without
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
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

mod files;
pub use files::{SPARE_MARK, TMP_MARK, spare_name};

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

    /// Open the entry `name` of the directory `parent` (from [`Anchors::open_parent`] of
    /// `path`) like [`Anchors::open`]: a link there is refused naming `path`. The parent is not
    /// resolved again, so the entry is the one in the directory already held.
    pub fn open_in(&self, parent: &OwnedFd, name: &OsStr, path: &Path, flags: OFlags) -> io::Result<OwnedFd> {
        self.resolve(parent, Path::new(name), flags, ResolveFlags::empty()).map_err(|e| explain_one(e, path))
    }

    /// Resolve `rel` below the directory `at`. The path is resolved to an `O_PATH` descriptor
    /// first and judged on it (a final link is refused as a link, a non-directory where one is
    /// asked for is ENOTDIR); other access is a reopen of that very inode through
    /// `/proc/self/fd`, so nothing swapped in between can change what was judged.
    fn resolve(&self, at: &OwnedFd, rel: &Path, flags: OFlags, extra: ResolveFlags) -> io::Result<OwnedFd> {
        let how = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS | extra;
        // A directory opened for reading is opened at once: `O_DIRECTORY` refuses anything else
        // before it is opened (no FIFO or device is ever opened; a final link, not followed
        // under `O_NOFOLLOW`, is ENOTDIR too). One call instead of four (the state directory's
        // open on every state write, for one). ENOTDIR goes the judged way below, which tells
        // a final link (ELOOP) from anything else.
        if !self.walk && flags.contains(OFlags::DIRECTORY) && !flags.contains(OFlags::PATH) {
            match openat2_pieces(at, rel, flags | OFlags::NOFOLLOW | OFlags::CLOEXEC, how) {
                Err(Errno::NOSYS | Errno::NOTDIR) => {}
                other => return Ok(other?),
            }
        }
        let path_only = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = 'open: {
            if !self.walk {
                match openat2_pieces(at, rel, path_only, how) {
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

fn open_anchor(anchor: &Path, flags: OFlags) -> io::Result<OwnedFd> {
    // The anchor itself is trusted configuration (made canonical at start).
    rustix::fs::open(anchor, flags | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| with_path(e.into(), anchor))
}

/// Longest path a syscall takes, its NUL included.
const PATH_MAX: usize = nix::libc::PATH_MAX as usize;

/// `openat2` of `rel` below `at` with `how`; a `rel` too long for one call (a pod can build a
/// directory chain deeper than any path may name, and move a mount into it) in pieces of whole
/// components, each resolved with the same flags from the directory the last one reached. Each
/// piece stays beneath where it starts, link-free and (with `RESOLVE_NO_XDEV`) on its mount,
/// so the whole does too; a piece that ends on anything but a directory ends the resolution
/// (ELOOP for a link, ENOTDIR otherwise).
fn openat2_pieces(at: &OwnedFd, rel: &Path, flags: OFlags, how: ResolveFlags) -> rustix::io::Result<OwnedFd> {
    if rel.as_os_str().len() < PATH_MAX {
        return rustix::fs::openat2(at, rel, flags, Mode::empty(), how);
    }
    let mut cur: Option<OwnedFd> = None;
    let mut piece = PathBuf::new();
    let mut parts = rel.iter().peekable();
    while let Some(part) = parts.next() {
        piece.push(part);
        let next = parts.peek();
        if next.is_some_and(|n| piece.as_os_str().len() + 1 + n.len() < PATH_MAX) {
            continue;
        }
        let dir = cur.as_ref().map(AsFd::as_fd).unwrap_or(at.as_fd());
        let fd = rustix::fs::openat2(dir, &piece, flags, Mode::empty(), how)?;
        if next.is_some() {
            match FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode) {
                FileType::Directory => {}
                FileType::Symlink => return Err(Errno::LOOP),
                _ => return Err(Errno::NOTDIR),
            }
        }
        cur = Some(fd);
        piece.clear();
    }
    cur.ok_or(Errno::INVAL)
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
mod tests;
