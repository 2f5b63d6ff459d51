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
