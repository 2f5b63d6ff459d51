//! Unpacking a tar layer (plain, gzip or zstd) into a fresh directory of the cache, refusing
//! anything that could reach outside it or give privilege: absolute paths, `..`, symbolic links
//! whose target climbs out (or uses `..` after a name), hard links to anything but a file
//! already unpacked, device nodes, FIFOs, set-uid and set-gid bits.
//!
//! What tar reads between two entries is bounded ([`BETWEEN_ENTRIES`]): it holds long names and
//! pax records in memory whole.
//!
//! Entries are created relative to the directory's descriptor, never through a symbolic link
//! (an archive's own link cannot redirect a later entry: [`Anchors`] resolves parents with
//! `RESOLVE_NO_SYMLINKS`). Files end 0444 and directories 0555; every file and directory is
//! fsync'd so that the caller's rename publishes a complete tree.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use rustix::fs::{AtFlags, FileType, Gid, Mode, OFlags, Timespec, Timestamps, Uid};
use rustix::io::Errno;

use crate::exec::beneath::{Anchors, is_link_refused};
use crate::plan::Archive;
use crate::plan::tar_rules::{Layering, WHITEOUT_PREFIX, Whiteout, below_marker, check_link_target, clean, whiteout};

/// What tar may read between two entries: the next entry's headers (GNU long names and long
/// link names, pax records, each read into memory whole) and whatever it skips of an entry
/// that was not read (data behind a directory or a link, which have none). Real archives need
/// a few KiB here; without a bound, one header claiming 64 GiB of name (a few MiB once
/// compressed) would take the daemon's memory.
const BETWEEN_ENTRIES: u64 = 1 << 20;

/// The archive's reader: while `left` is set, reading more than that many bytes more fails.
struct Budgeted<R> {
    inner: R,
    left: Rc<Cell<Option<u64>>>,
}

impl<R: Read> Read for Budgeted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.left.get() {
            None => self.inner.read(buf),
            Some(0) if !buf.is_empty() => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "more than {BETWEEN_ENTRIES} bytes between two entries (long names, pax records, or data \
                     behind an entry that has none)"
                ),
            )),
            Some(left) => {
                let room = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                let n = self.inner.read(&mut buf[..room])?;
                self.left.set(Some(left - n as u64));
                Ok(n)
            }
        }
    }
}

/// Unpack the archive `blob` (its digest `digest`, for messages) into the directory `into`,
/// which must be empty or not exist, as a plain archive of files.
pub fn unpack(blob: &Path, digest: &str, format: Archive, into: &Path) -> io::Result<()> {
    unpack_layer(blob, digest, format, Layering::Files, into).map(|_| ())
}

/// What an image layer's unpack left out, by kind; nothing is left out of a plain archive
/// (such entries refuse it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeftOut {
    /// Character and block devices.
    pub devices: u64,
    /// FIFOs.
    pub fifos: u64,
    /// Hard links whose target is not a file unpacked before them in the same layer.
    pub hard_links: u64,
    /// Entries whose path has `..`, climbs through a symbolic link, or another type tar has.
    pub others: u64,
    /// Set-uid or set-gid bits cleared (the entries themselves are kept).
    pub set_id_cleared: u64,
}

impl LeftOut {
    /// Whether anything was left out or changed.
    pub fn any(&self) -> bool {
        *self != LeftOut::default()
    }
}

/// Unpack the archive `blob` into `into` (empty or absent), laid out as `layering` says.
///
/// An image layer ([`Layering::Image`]) is laid out so that `link_tree` can apply it over the
/// layers below it: its whiteouts stay in the tree as empty files of their own names
/// (`.wh.<name>`, [`crate::plan::tar_rules::OPAQUE_MARKER`]); every other `.wh..wh.` name is dropped; a directory the
/// archive creates without an entry of its own holds the empty file [`IMPLICIT_MARKER`] (its
/// owner and mode are not the layer's to set); files, directories and links keep their numeric
/// owners, and files and directories their modes (set-id bits cleared) and files their
/// modification times; symbolic links keep any target (never followed: every entry is created
/// below a descriptor without following links); device nodes, FIFOs, hard links to anything
/// but a file unpacked before them, and entries whose path climbs out (`..`) or through a link
/// are left out and counted. A later entry of the same path replaces an earlier one, whatever
/// their types.
pub fn unpack_layer(
    blob: &Path,
    digest: &str,
    format: Archive,
    layering: Layering,
    into: &Path,
) -> io::Result<LeftOut> {
    let image = layering == Layering::Image;
    let file = File::open(blob)?;
    let reader: Box<dyn Read> = match format {
        Archive::Tar => Box::new(BufReader::with_capacity(1 << 20, file)),
        Archive::TarGzip => Box::new(flate2::read::MultiGzDecoder::new(BufReader::with_capacity(1 << 20, file))),
        Archive::TarZstd => Box::new(zstd::stream::read::Decoder::new(file)?),
        Archive::Raw => return Err(io::Error::new(io::ErrorKind::InvalidInput, "a raw blob is not unpacked")),
    };
    match std::fs::create_dir(into) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && std::fs::read_dir(into)?.next().is_none() => {}
        other => other?,
    }
    std::fs::set_permissions(into, std::fs::Permissions::from_mode(0o700))?;
    let left = Rc::new(Cell::new(None));
    let mut archive = tar::Archive::new(Budgeted { inner: reader, left: left.clone() });
    let anchors = Anchors::new([into.to_path_buf()]);
    let mut buf = vec![0u8; 1 << 20];
    let mut left_out = LeftOut::default();
    // Image layers: the directories the archive has entries for, with their owner and mode,
    // set once everything is in (root still writes into a 0500 directory, but the order of
    // entries must not matter).
    let mut dirs: HashMap<PathBuf, Meta> = HashMap::new();
    // Entries taken so far (bounded, as the lazy reader bounds a layer's table).
    let mut files = 0usize;
    let mut entries = archive.entries().map_err(|e| bad_archive(digest, format, &e))?;
    loop {
        // What tar reads to reach the next entry is bounded; the entry's data, read below, is not.
        left.set(Some(BETWEEN_ENTRIES));
        let next = entries.next();
        left.set(None);
        let Some(entry) = next else { break };
        let mut entry = entry.map_err(|e| bad_archive(digest, format, &e))?;
        let raw = entry.path().map_err(|e| bad_archive(digest, format, &e))?.into_owned();
        let refuse = |why: &str| refused(digest, &raw, why);
        let kind = entry.header().entry_type();
        if matches!(
            kind,
            tar::EntryType::XGlobalHeader
                | tar::EntryType::XHeader
                | tar::EntryType::GNULongName
                | tar::EntryType::GNULongLink
        ) {
            continue;
        }
        let rel = match clean(&raw) {
            Ok(rel) => rel,
            // A runtime reads `/a` as `a`; `..` it refuses.
            Err(_) if image => match clean(raw.strip_prefix("/").unwrap_or(&raw)) {
                Ok(rel) => rel,
                Err(_) => {
                    left_out.others += 1;
                    drain(&mut entry, digest, format)?;
                    continue;
                }
            },
            Err(why) => return Err(refuse(why)),
        };
        if rel.as_os_str().is_empty() {
            // The archive's root (`./`).
            if kind.is_dir() {
                continue;
            }
            if image {
                left_out.others += 1;
                drain(&mut entry, digest, format)?;
                continue;
            }
            return Err(refuse("it names the archive's root"));
        }
        if image && below_marker(&rel) {
            left_out.others += 1;
            drain(&mut entry, digest, format)?;
            continue;
        }
        if image
            && let Some(name) = rel.file_name()
            && whiteout(name.as_bytes()) == Whiteout::Reserved
        {
            drain(&mut entry, digest, format)?;
            continue;
        }
        if image && files >= MAX_ENTRIES {
            return Err(refuse(&format!("the layer has more than {MAX_ENTRIES} entries")));
        }
        files += 1;
        let mut mode = entry.header().mode().map_err(|e| bad_archive(digest, format, &e))?;
        if mode & 0o6000 != 0 {
            if !image {
                return Err(refuse("it has the set-uid or set-gid bit"));
            }
            left_out.set_id_cleared += 1;
            mode &= !0o6000;
        }
        let meta = Meta {
            mode: mode & 0o1777,
            uid: entry.header().uid().unwrap_or(0) as u32,
            gid: entry.header().gid().unwrap_or(0) as u32,
            mtime: entry.header().mtime().unwrap_or(0),
        };
        let path = into.join(&rel);
        let parent = path.parent().unwrap_or(into);
        let placed: io::Result<()> = (|| {
            match kind {
                tar::EntryType::Directory => {
                    if image {
                        anchors.mkdir(parent, into, 0o700).map_err(|e| failed(digest, &raw, e))?;
                        let (dir, name) = anchors.open_parent(&path).map_err(|e| failed(digest, &raw, e))?;
                        if let Ok(st) = rustix::fs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW)
                            && FileType::from_raw_mode(st.st_mode) != FileType::Directory
                        {
                            rustix::fs::unlinkat(&dir, &name, AtFlags::empty())?;
                        }
                        // A later entry of the same directory wins.
                        dirs.insert(rel.clone(), meta);
                    }
                    anchors.mkdir(&path, into, 0o700).map_err(|e| failed(digest, &raw, e))?;
                }
                tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                    anchors.mkdir(parent, into, 0o700).map_err(|e| failed(digest, &raw, e))?;
                    let (dir, name) = anchors.open_parent(&path).map_err(|e| failed(digest, &raw, e))?;
                    let fd = create(&dir, &name, image, || refuse("a file would replace a directory"))?;
                    let mut out = File::from(fd);
                    loop {
                        let n = entry.read(&mut buf).map_err(|e| bad_archive(digest, format, &e))?;
                        if n == 0 {
                            break;
                        }
                        out.write_all(&buf[..n]).map_err(|e| failed(digest, &raw, e))?;
                    }
                    let final_mode = if image { meta.mode } else { 0o444 };
                    if image {
                        rustix::fs::fchown(&out, Some(Uid::from_raw(meta.uid)), Some(Gid::from_raw(meta.gid)))?;
                        let at = Timespec { tv_sec: meta.mtime as i64, tv_nsec: 0 };
                        rustix::fs::futimens(&out, &Timestamps { last_access: at, last_modification: at })?;
                    }
                    out.set_permissions(std::fs::Permissions::from_mode(final_mode))
                        .map_err(|e| failed(digest, &raw, e))?;
                    out.sync_all().map_err(|e| failed(digest, &raw, e))?;
                }
                tar::EntryType::Symlink => {
                    let target = entry.link_name().map_err(|e| bad_archive(digest, format, &e))?;
                    let target = target.ok_or_else(|| refuse("the symbolic link has no target"))?.into_owned();
                    if !image {
                        check_link_target(&rel, &target).map_err(|why| refuse(&why))?;
                    } else if target.as_os_str().is_empty() {
                        left_out.others += 1;
                        return Ok(());
                    }
                    anchors.mkdir(parent, into, 0o700).map_err(|e| failed(digest, &raw, e))?;
                    let (dir, name) = anchors.open_parent(&path).map_err(|e| failed(digest, &raw, e))?;
                    make_room(&dir, &name, image, || refuse("a symbolic link would replace a directory"))?;
                    rustix::fs::symlinkat(&target, &dir, &name).map_err(|e| failed(digest, &raw, e.into()))?;
                    if image {
                        rustix::fs::chownat(
                            &dir,
                            &name,
                            Some(Uid::from_raw(meta.uid)),
                            Some(Gid::from_raw(meta.gid)),
                            AtFlags::SYMLINK_NOFOLLOW,
                        )?;
                    }
                }
                tar::EntryType::Link => {
                    let target = entry.link_name().map_err(|e| bad_archive(digest, format, &e))?;
                    let target = target.ok_or_else(|| refuse("the hard link has no target"))?.into_owned();
                    if !image && !clean(&target).is_ok_and(|t| !t.as_os_str().is_empty()) {
                        return Err(refuse(&format!(
                            "its hard link target {} is outside the archive",
                            target.display()
                        )));
                    }
                    let source = clean(target.strip_prefix("/").unwrap_or(&target))
                        .ok()
                        .filter(|t| !t.as_os_str().is_empty())
                        // A link to its own path names no file left once it is placed.
                        .filter(|t| !image || *t != rel)
                        // A marker is no file of the image (the lazy reader keeps none).
                        .filter(|t| {
                            !image
                                || t.file_name().is_some_and(|n| !n.as_bytes().starts_with(WHITEOUT_PREFIX.as_bytes()))
                        })
                        .and_then(|t| anchors.open_parent(&into.join(&t)).ok())
                        .filter(|(dir, name)| {
                            rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
                                .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::RegularFile)
                        });
                    let Some((src_dir, src_name)) = source else {
                        if image {
                            left_out.hard_links += 1;
                            return Ok(());
                        }
                        return Err(refuse(&format!(
                            "its hard link target {} is not a file unpacked before it",
                            target.display()
                        )));
                    };
                    anchors.mkdir(parent, into, 0o700).map_err(|e| failed(digest, &raw, e))?;
                    let (dir, name) = anchors.open_parent(&path).map_err(|e| failed(digest, &raw, e))?;
                    make_room(&dir, &name, image, || refuse("a hard link would replace a directory"))?;
                    rustix::fs::linkat(&src_dir, &src_name, &dir, &name, AtFlags::empty())
                        .map_err(|e| failed(digest, &raw, e.into()))?;
                }
                tar::EntryType::Char | tar::EntryType::Block if image => left_out.devices += 1,
                tar::EntryType::Fifo if image => left_out.fifos += 1,
                _ if image => {
                    left_out.others += 1;
                    drain(&mut entry, digest, format)?;
                }
                tar::EntryType::Char | tar::EntryType::Block => return Err(refuse("it is a device node")),
                tar::EntryType::Fifo => return Err(refuse("it is a FIFO")),
                other => return Err(refuse(&format!("its type ({other:?}) is not supported"))),
            }
            Ok(())
        })();
        match placed {
            Ok(()) => {}
            // An entry below a symbolic link of the layer, or below a file: a runtime would
            // follow the link (out of the tree, for all it knows) or fail; the host never
            // follows one, and the image stays mountable.
            Err(e) if image && through(&e) => {
                left_out.others += 1;
                drain(&mut entry, digest, format)?;
            }
            Err(e) => return Err(e),
        }
    }
    if image {
        mark_implicit(into, &dirs)?;
        // One a later entry replaced with something else is gone.
        for (rel, meta) in &dirs {
            let Ok(fd) = anchors.open(&into.join(rel), OFlags::RDONLY | OFlags::DIRECTORY) else { continue };
            rustix::fs::fchown(&fd, Some(Uid::from_raw(meta.uid)), Some(Gid::from_raw(meta.gid)))?;
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(meta.mode))?;
        }
        sync_tree(into, 0)?;
        rustix::fs::fchmod(&anchors.open(into, OFlags::RDONLY | OFlags::DIRECTORY)?, Mode::from_raw_mode(0o555))?;
        return Ok(left_out);
    }
    seal(into, 0).map(|()| left_out)
}

/// Most entries an image layer may have (directories and everything else), as the lazy reader
/// bounds a layer's table: what the unpack keeps in memory per directory stays bounded.
const MAX_ENTRIES: usize = 1_000_000;

/// Read the rest of an entry that is left out, outside the budget between entries (an entry's
/// data may be large; skipping it is reading it).
fn drain(entry: &mut impl Read, digest: &str, format: Archive) -> io::Result<()> {
    io::copy(entry, &mut io::sink()).map(|_| ()).map_err(|e| bad_archive(digest, format, &e))
}

/// An entry placed below a symbolic link or a file of its own layer: `Anchors` refuses to
/// follow the link ([`is_link_refused`]), or the kernel says ELOOP or ENOTDIR.
fn through(e: &io::Error) -> bool {
    is_link_refused(e)
        || e.get_ref().is_some_and(|i| i.is::<Through>())
        || [Errno::LOOP, Errno::NOTDIR].iter().any(|n| io::Error::from(*n).kind() == e.kind())
}

/// [`failed`]'s error for an entry whose path went through a link or a file ([`through`]).
#[derive(Debug)]
struct Through(String);

impl std::fmt::Display for Through {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Through {}

/// The empty file an image layer's tree holds in each directory the archive created without
/// an entry of its own (`a/` for an archive holding only `a/b`): `link_tree` then leaves that
/// directory's owner and mode to the layers below. A reserved whiteout name, which no archive
/// entry becomes ([`unpack_layer`] drops them).
pub const IMPLICIT_MARKER: &str = ".wh..wh..implicit";

/// An image layer entry's owner, mode and time.
#[derive(Debug, Clone, Copy)]
struct Meta {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: u64,
}

/// Put [`IMPLICIT_MARKER`] in every directory of the tree below `into` that `explicit` does not
/// list, and make those directories 0755.
fn mark_implicit(into: &Path, explicit: &HashMap<PathBuf, Meta>) -> io::Result<()> {
    let mut stack = vec![(PathBuf::new(), 0usize)];
    while let Some((rel, depth)) = stack.pop() {
        if depth > 256 {
            return Err(io::Error::other(format!("{} is nested deeper than 256 levels", into.join(&rel).display())));
        }
        for entry in std::fs::read_dir(into.join(&rel))? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                let child = rel.join(entry.file_name());
                if !explicit.contains_key(&child) {
                    let dir = into.join(&child);
                    File::create(dir.join(IMPLICIT_MARKER))?.sync_all()?;
                    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
                }
                stack.push((child, depth + 1));
            }
        }
    }
    Ok(())
}

/// fsync every directory of the tree (children first), leaving modes as they are.
fn sync_tree(dir: &Path, depth: usize) -> io::Result<()> {
    if depth > 256 {
        return Err(io::Error::other(format!("{} is nested deeper than 256 levels", dir.display())));
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            sync_tree(&entry.path(), depth + 1)?;
        }
    }
    File::open(dir)?.sync_all()
}

/// Create the file `name` in `dir` (an earlier entry of the same name is replaced, as tar does).
fn create(dir: &OwnedFd, name: &OsStr, image: bool, is_dir: impl Fn() -> io::Error) -> io::Result<OwnedFd> {
    make_room(dir, name, image, is_dir)?;
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(0o600))?)
}

/// Remove a non-directory `name` from `dir` (a later tar entry replaces an earlier one); in an
/// image layer (`image`) a directory too, with everything below it.
fn make_room(dir: &OwnedFd, name: &OsStr, image: bool, is_dir: impl Fn() -> io::Error) -> io::Result<()> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory && image => {
            super::link::remove_at(dir, name, 0)
        }
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => Err(is_dir()),
        Ok(_) => Ok(rustix::fs::unlinkat(dir, name, AtFlags::empty())?),
    }
}

/// Make every directory of the tree 0555 and fsync it (children first).
fn seal(dir: &Path, depth: usize) -> io::Result<()> {
    if depth > 256 {
        return Err(io::Error::other(format!("{} is nested deeper than 256 levels", dir.display())));
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            seal(&entry.path(), depth + 1)?;
        }
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555))?;
    File::open(dir)?.sync_all()
}

fn refused(digest: &str, entry: &Path, why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("layer {digest}: entry {}: refused: {why}", entry.display()))
}

fn failed(digest: &str, entry: &Path, e: io::Error) -> io::Error {
    let message = format!("layer {digest}: entry {}: {e}", entry.display());
    if through(&e) {
        return io::Error::new(e.kind(), Through(message));
    }
    io::Error::new(e.kind(), message)
}

fn bad_archive(digest: &str, format: Archive, e: &io::Error) -> io::Error {
    let kind = if e.kind() == io::ErrorKind::StorageFull { e.kind() } else { io::ErrorKind::InvalidData };
    io::Error::new(kind, format!("layer {digest} is not a valid {format:?} archive: {e}"))
}
