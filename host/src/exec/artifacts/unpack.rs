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
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::rc::Rc;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::exec::beneath::Anchors;
use crate::plan::Archive;
use crate::plan::tar_rules::{check_link_target, clean};

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
/// which must be empty or not exist.
pub fn unpack(blob: &Path, digest: &str, format: Archive, into: &Path) -> io::Result<()> {
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
        let rel = clean(&raw).map_err(&refuse)?;
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
        if rel.as_os_str().is_empty() {
            // The archive's root (`./`).
            if kind.is_dir() {
                continue;
            }
            return Err(refuse("it names the archive's root"));
        }
        let mode = entry.header().mode().map_err(|e| bad_archive(digest, format, &e))?;
        if mode & 0o6000 != 0 {
            return Err(refuse("it has the set-uid or set-gid bit"));
        }
        let path = into.join(&rel);
        let parent = path.parent().unwrap_or(into);
        match kind {
            tar::EntryType::Directory => {
                anchors.mkdir(&path, into, 0o700).map_err(|e| failed(digest, &raw, e))?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                anchors.mkdir(parent, into, 0o700).map_err(|e| failed(digest, &raw, e))?;
                let (dir, name) = anchors.open_parent(&path).map_err(|e| failed(digest, &raw, e))?;
                let fd = create(&dir, &name, || refuse("a file would replace a directory"))?;
                let mut out = File::from(fd);
                loop {
                    let n = entry.read(&mut buf).map_err(|e| bad_archive(digest, format, &e))?;
                    if n == 0 {
                        break;
                    }
                    out.write_all(&buf[..n]).map_err(|e| failed(digest, &raw, e))?;
                }
                out.set_permissions(std::fs::Permissions::from_mode(0o444)).map_err(|e| failed(digest, &raw, e))?;
                out.sync_all().map_err(|e| failed(digest, &raw, e))?;
            }
            tar::EntryType::Symlink => {
                let target = entry.link_name().map_err(|e| bad_archive(digest, format, &e))?;
                let target = target.ok_or_else(|| refuse("the symbolic link has no target"))?.into_owned();
                check_link_target(&rel, &target).map_err(|why| refuse(&why))?;
                anchors.mkdir(parent, into, 0o700).map_err(|e| failed(digest, &raw, e))?;
                let (dir, name) = anchors.open_parent(&path).map_err(|e| failed(digest, &raw, e))?;
                make_room(&dir, &name, || refuse("a symbolic link would replace a directory"))?;
                rustix::fs::symlinkat(&target, &dir, &name).map_err(|e| failed(digest, &raw, e.into()))?;
            }
            tar::EntryType::Link => {
                let target = entry.link_name().map_err(|e| bad_archive(digest, format, &e))?;
                let target = target.ok_or_else(|| refuse("the hard link has no target"))?.into_owned();
                let target_rel = clean(&target).ok().filter(|t| !t.as_os_str().is_empty()).ok_or_else(|| {
                    refuse(&format!("its hard link target {} is outside the archive", target.display()))
                })?;
                let (src_dir, src_name) = anchors.open_parent(&into.join(&target_rel)).map_err(|_| {
                    refuse(&format!("its hard link target {} is not a file unpacked before it", target.display()))
                })?;
                match rustix::fs::statat(&src_dir, &src_name, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile => {}
                    _ => {
                        return Err(refuse(&format!(
                            "its hard link target {} is not a file unpacked before it",
                            target.display()
                        )));
                    }
                }
                anchors.mkdir(parent, into, 0o700).map_err(|e| failed(digest, &raw, e))?;
                let (dir, name) = anchors.open_parent(&path).map_err(|e| failed(digest, &raw, e))?;
                make_room(&dir, &name, || refuse("a hard link would replace a directory"))?;
                rustix::fs::linkat(&src_dir, &src_name, &dir, &name, AtFlags::empty())
                    .map_err(|e| failed(digest, &raw, e.into()))?;
            }
            tar::EntryType::Char | tar::EntryType::Block => return Err(refuse("it is a device node")),
            tar::EntryType::Fifo => return Err(refuse("it is a FIFO")),
            other => return Err(refuse(&format!("its type ({other:?}) is not supported"))),
        }
    }
    seal(into, 0)
}

/// Create the file `name` in `dir` (an earlier entry of the same name is replaced, as tar does).
fn create(dir: &OwnedFd, name: &OsStr, is_dir: impl Fn() -> io::Error) -> io::Result<OwnedFd> {
    make_room(dir, name, is_dir)?;
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(0o600))?)
}

/// Remove a non-directory `name` from `dir` (a later tar entry replaces an earlier one).
fn make_room(dir: &OwnedFd, name: &OsStr, is_dir: impl Fn() -> io::Error) -> io::Result<()> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
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
    io::Error::new(e.kind(), format!("layer {digest}: entry {}: {e}", entry.display()))
}

fn bad_archive(digest: &str, format: Archive, e: &io::Error) -> io::Error {
    let kind = if e.kind() == io::ErrorKind::StorageFull { e.kind() } else { io::ErrorKind::InvalidData };
    io::Error::new(kind, format!("layer {digest} is not a valid {format:?} archive: {e}"))
}
