//! mount(2) and umount2(2): kernel mounts, bind mounts and unmounts.
//!
//! Blocking syscalls: a hung FUSE server can block them indefinitely, so async callers run
//! them on a blocking thread with a timeout. Each function does exactly one thing; deciding
//! whether it is needed (the kernel may already have it) is the caller's job, with
//! [`super::mountinfo`].

use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};

/// A failed mount syscall: which operation, on which path, and the kernel's errno (callers
/// tell EBUSY from EINVAL from ENOTCONN by it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op} {}: {errno}", path.display())]
pub struct MountError {
    /// `mount`, `bind`, `remount read-only` or `unmount`.
    pub op: &'static str,
    /// The target path.
    pub path: PathBuf,
    /// What the kernel said.
    pub errno: Errno,
}

/// Flags a plan may put on a bind (see the policy's allow-list).
pub fn bind_flag(name: &str) -> Option<MsFlags> {
    Some(match name {
        "nosuid" => MsFlags::MS_NOSUID,
        "nodev" => MsFlags::MS_NODEV,
        "noexec" => MsFlags::MS_NOEXEC,
        "noatime" => MsFlags::MS_NOATIME,
        "nodiratime" => MsFlags::MS_NODIRATIME,
        "relatime" => MsFlags::MS_RELATIME,
        "strictatime" => MsFlags::MS_STRICTATIME,
        _ => return None,
    })
}

fn io_err(op: &'static str, path: &Path, errno: Errno) -> MountError {
    MountError { op, path: path.to_path_buf(), errno }
}

/// Mount a filesystem: `mount -t fstype -o options source target`.
pub fn mount(fstype: &str, source: &str, target: &Path, options: &[String], readonly: bool) -> Result<(), MountError> {
    let flags = if readonly { MsFlags::MS_RDONLY } else { MsFlags::empty() } | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    let data = options.join(",");
    let data = (!data.is_empty()).then_some(data.as_str());
    nix::mount::mount(Some(source), target, Some(fstype), flags, data).map_err(|e| io_err("mount", target, e))
}

/// Bind `source` onto `target`, read-only when asked, with extra per-mount flags.
///
/// Read-only needs a second call: the kernel ignores `MS_RDONLY` on the initial bind and only
/// honours it on a `MS_REMOUNT | MS_BIND` of the new mount.
pub fn bind(source: &Path, target: &Path, readonly: bool, flags: MsFlags) -> Result<(), MountError> {
    nix::mount::mount(Some(source), target, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .map_err(|e| io_err("bind", target, e))?;
    if readonly || !flags.is_empty() {
        // A bind remount sets the per-mount flags to exactly those given: keep nosuid and nodev
        // (pods never get set-uid binaries or device nodes through a volume).
        let remount = MsFlags::MS_REMOUNT
            | MsFlags::MS_BIND
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | flags
            | if readonly { MsFlags::MS_RDONLY } else { MsFlags::empty() };
        if let Err(e) = nix::mount::mount(None::<&str>, target, None::<&str>, remount, None::<&str>) {
            // Never leave a writable bind behind when a read-only one was asked for.
            let _ = nix::mount::umount2(target, MntFlags::MNT_DETACH);
            return Err(io_err("remount read-only", target, e));
        }
    }
    Ok(())
}

/// Unmount `target`. With `lazy`, detach it now even if busy (`MNT_DETACH`), as needed for a
/// dead FUSE mount ("Transport endpoint is not connected") that a pod still holds open.
pub fn unmount(target: &Path, lazy: bool) -> Result<(), MountError> {
    let flags = if lazy { MntFlags::MNT_DETACH } else { MntFlags::empty() };
    nix::mount::umount2(target, flags).map_err(|e| io_err("unmount", target, e))
}

impl From<MountError> for crate::error::Error {
    fn from(e: MountError) -> Self {
        crate::error::Error::internal(e.to_string())
    }
}
