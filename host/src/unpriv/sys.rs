//! The few calls that need no privilege but have no safe wrapper in `rustix` or `nix`: each is
//! one `unsafe` block with its reason, here rather than scattered over the rooms that use them
//! (the architecture test allows `unsafe` in the executor room, the artifact loader and this
//! file only).

#![allow(unsafe_code)]

use std::fs::File;
use std::os::fd::AsRawFd;

/// Ask the kernel to start writing `len` bytes at `at` of `file` to disk now
/// (`sync_file_range` with `SYNC_FILE_RANGE_WRITE`: it does not wait), so a later fsync finds
/// little left. Best effort: an error changes nothing but the fsync's length.
pub fn start_writeback(file: &File, at: u64, len: u64) {
    let (Ok(at), Ok(len)) = (i64::try_from(at), i64::try_from(len)) else { return };
    // SAFETY: a plain syscall on a descriptor this function borrows for its duration; no
    // memory is passed.
    let _ = unsafe { nix::libc::sync_file_range(file.as_raw_fd(), at, len, nix::libc::SYNC_FILE_RANGE_WRITE) };
}

/// Take ownership of descriptor `fd`, which this process inherited at exec (a FUSE server's
/// connection and control socket, passed by the host daemon at fixed numbers). Each number is
/// taken once per process; a number not open, or taken before, is an error.
pub fn take_inherited(fd: i32) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    static TAKEN: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());
    let mut taken = TAKEN.lock().unwrap_or_else(|p| p.into_inner());
    if fd < 3 || taken.contains(&fd) {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("descriptor {fd} cannot be taken")));
    }
    // F_GETFD fails with EBADF on a number that is not open.
    if nix::fcntl::fcntl(
        // SAFETY: the borrow lasts for this one call; a closed number only makes it fail (EBADF).
        unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
        nix::fcntl::FcntlArg::F_GETFD,
    )
    .is_err()
    {
        return Err(std::io::Error::new(std::io::ErrorKind::NotFound, format!("descriptor {fd} is not open")));
    }
    taken.push(fd);
    // SAFETY: the descriptor is open (checked above) and was inherited at exec; nothing else in
    // this process owns it: `TAKEN` makes this the only owner this function ever creates, and
    // no other code of the process names inherited numbers.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Answer an open with passthrough to the backing file `backing_id`, which the host daemon
/// registered on this FUSE connection (the registration needs CAP_SYS_ADMIN, which a FUSE
/// server run unprivileged does not have, so fuser's own `open_backing` cannot be used).
pub fn reply_passthrough(reply: fuser::ReplyOpen, fh: fuser::FileHandle, backing_id: u32) {
    // SAFETY: the id was registered on this connection by the host, which never closes it while
    // the connection lives; `into_raw` below keeps fuser from closing it when the wrapper
    // drops (a close needs CAP_SYS_ADMIN too, and would end passthrough for later opens).
    let backing = unsafe { reply.wrap_backing(backing_id) };
    reply.opened_passthrough(fh, fuser::FopenFlags::empty(), &backing);
    let _ = backing.into_raw();
}

/// Open the regular file `rel` below the directory `dir` for reading, resolved without
/// following any symbolic link and without leaving `dir` (`openat2` with `RESOLVE_BENEATH` and
/// `RESOLVE_NO_SYMLINKS`).
pub fn open_beneath(dir: &File, rel: &str) -> std::io::Result<File> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let fd = rustix::fs::openat2(
        dir,
        rel,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )?;
    Ok(File::from(fd))
}
