//! Whole-file reads and writes below the anchors: atomic replacement (a spare swapped in with
//! `RENAME_EXCHANGE`, or a temporary file and a rename), appending, reading under a shared lock.

use std::ffi::{OsStr, OsString};
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use super::{Anchors, explain_one, with_path};

impl Anchors {
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
    /// get the temporary file. With `sync` (secrets), a fresh temporary file, fsync'd, is renamed over
    /// the file, its spare (an earlier content) removed and the directory fsync'd.
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
                // An earlier content swapped out into the spare goes too (secrets: a rotated
                // credential must not stay on disk).
                let spare = spare_name(name);
                match rustix::fs::unlinkat(&parent, &spare, AtFlags::empty()) {
                    Ok(()) | Err(Errno::NOENT) => {}
                    // Not a file this writer made: an empty directory goes too, anything else
                    // is an error naming it.
                    Err(Errno::ISDIR) => rustix::fs::unlinkat(&parent, &spare, AtFlags::REMOVEDIR)?,
                    Err(e) => return Err(e.into()),
                }
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
    // Looked at before it is opened (a device node must not be opened at all); the directory's
    // lock keeps other writers from changing it in between.
    let fd = match rustix::fs::statat(parent, &spare, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile && st.st_nlink == 1 => {
            rustix::fs::openat(parent, &spare, flags, Mode::from_raw_mode(mode))?
        }
        Err(Errno::NOENT) => rustix::fs::openat(parent, &spare, flags | OFlags::EXCL, Mode::from_raw_mode(mode))?,
        // Not a spare this writer made (a link, a FIFO, a device, an empty directory, a second
        // name for another file that would be rewritten through it): start a fresh one.
        Ok(st) => {
            let dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
            rustix::fs::unlinkat(parent, &spare, if dir { AtFlags::REMOVEDIR } else { AtFlags::empty() })?;
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
