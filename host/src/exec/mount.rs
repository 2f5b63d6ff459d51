//! Mounts onto file descriptors: every source and target below the host's anchors is resolved
//! with [`Anchors`] (no symbolic link, never outside the anchor) and the syscall acts on the
//! descriptor, so nothing swapped into a path between a check and the syscall can redirect it.
//!
//! - **bind**: `open_tree(OPEN_TREE_CLONE)` of the source descriptor makes a detached copy,
//!   `mount_setattr` makes it read-only (with `nosuid`, `nodev` and the plan's flags) *before*
//!   it is attached, and `move_mount` attaches it onto the target descriptor: a writable bind
//!   never exists, not even for an instant. Kernels without `open_tree` (before 5.2) get
//!   `mount(MS_BIND)` between `/proc/self/fd` paths and a bind remount; kernels without
//!   `mount_setattr` (before 5.12) get the remount through the detached tree's descriptor.
//! - **mount**: `mount(2)` onto `/proc/self/fd/N` of the target; a path source, and path
//!   options such as overlay's `lowerdir=`, are passed as `/proc/self/fd/M` too.
//! - **unmount**: `umount2("/proc/self/fd/<parent>/<name>", UMOUNT_NOFOLLOW)`. The parent is a
//!   resolved descriptor and the final name is never followed; a descriptor of the mount itself
//!   would pin it (EBUSY).
//!
//! Blocking: a hung FUSE server can block these syscalls, so callers run them on a blocking
//! thread. Deciding whether a mount is needed is the caller's job ([`super::mountinfo`]).
#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use rustix::fs::OFlags;
use rustix::mount::{MountFlags, MoveMountFlags, OpenTreeFlags, UnmountFlags};

use super::beneath::Anchors;

/// A failed mount syscall: which operation, on which path, the kernel's errno (callers tell
/// EBUSY from EINVAL from ENOTCONN by it), and a message for people.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op} {}: {detail}", path.display())]
pub struct MountError {
    /// `mount`, `bind`, `remount read-only`, `unmount` or `resolve`.
    pub op: &'static str,
    /// The path acted on.
    pub path: PathBuf,
    /// What the kernel said.
    pub errno: Errno,
    /// What went wrong, in words (names a refused symbolic link).
    pub detail: String,
}

impl MountError {
    fn new(op: &'static str, path: &Path, errno: Errno) -> Self {
        MountError { op, path: path.to_path_buf(), errno, detail: errno.desc().to_string() }
    }

    fn resolving(path: &Path, e: std::io::Error) -> Self {
        MountError { op: "resolve", path: path.to_path_buf(), errno: errno_of(&e), detail: e.to_string() }
    }

    /// A symbolic link was refused on the way.
    pub fn is_symlink(&self) -> bool {
        self.errno == Errno::ELOOP
    }
}

/// A rustix errno as nix's (the daemon matches on nix's).
fn errno(e: rustix::io::Errno) -> Errno {
    Errno::from_raw(e.raw_os_error())
}

/// The errno of an I/O error (a refused link is ELOOP; anything without one, EIO).
fn errno_of(e: &std::io::Error) -> Errno {
    if crate::exec::beneath::is_link_refused(e) {
        return Errno::ELOOP;
    }
    Errno::from_raw(e.raw_os_error().unwrap_or(match e.kind() {
        std::io::ErrorKind::NotFound => nix::libc::ENOENT,
        std::io::ErrorKind::PermissionDenied => nix::libc::EPERM,
        std::io::ErrorKind::NotADirectory => nix::libc::ENOTDIR,
        std::io::ErrorKind::InvalidFilename => nix::libc::ENAMETOOLONG,
        _ => nix::libc::EIO,
    }))
}

/// A mount option: text, or a path below the anchors handed to the kernel as a descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opt<'a> {
    /// Passed as is.
    Text(&'a str),
    /// `prefix` + the resolved path.
    Path { prefix: &'a str, path: &'a Path },
}

/// Per-mount flags a plan may put on a bind (the policy's `BIND_OPTIONS`), as
/// `MOUNT_ATTR_*` bits and as legacy `MS_*` flags. The atime ones are a choice of one.
fn bind_flag(name: &str) -> Option<(u64, MountFlags)> {
    Some(match name {
        "nosuid" => (MOUNT_ATTR_NOSUID, MountFlags::NOSUID),
        "nodev" => (MOUNT_ATTR_NODEV, MountFlags::NODEV),
        "noexec" => (MOUNT_ATTR_NOEXEC, MountFlags::NOEXEC),
        "noatime" => (MOUNT_ATTR_NOATIME, MountFlags::NOATIME),
        "nodiratime" => (MOUNT_ATTR_NODIRATIME, MountFlags::NODIRATIME),
        "relatime" => (MOUNT_ATTR_RELATIME, MountFlags::RELATIME),
        "strictatime" => (MOUNT_ATTR_STRICTATIME, MountFlags::STRICTATIME),
        _ => return None,
    })
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_NOEXEC: u64 = 0x8;
const MOUNT_ATTR_RELATIME: u64 = 0x0;
const MOUNT_ATTR_NOATIME: u64 = 0x10;
const MOUNT_ATTR_STRICTATIME: u64 = 0x20;
const MOUNT_ATTR_NODIRATIME: u64 = 0x80;
/// The atime field of `mount_attr`: cleared before one of its values is set.
const MOUNT_ATTR__ATIME: u64 = 0x70;

/// `struct mount_attr` of mount_setattr(2).
#[repr(C)]
pub(super) struct MountAttr {
    pub(super) attr_set: u64,
    pub(super) attr_clr: u64,
    pub(super) propagation: u64,
    pub(super) userns_fd: u64,
}

pub(super) fn fd_path(fd: &OwnedFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// Which mount API the kernel offers (tests force the legacy one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `open_tree` + `mount_setattr` + `move_mount`, falling back by itself where missing.
    New,
    /// `mount(2)` only.
    Legacy,
}

/// Mount a filesystem: `mount -t fstype -o options source target`, onto the resolved target.
/// A source starting with `/` is a path below the anchors.
pub fn mount(
    anchors: &Anchors,
    fstype: &str,
    source: &str,
    target: &Path,
    options: &[Opt<'_>],
    readonly: bool,
) -> Result<(), MountError> {
    mount_with(anchors, fstype, source, target, options, readonly, MountFlags::empty())
}

/// [`mount`] with extra per-mount `flags` (besides `nosuid`, `nodev` and `ro`).
fn mount_with(
    anchors: &Anchors,
    fstype: &str,
    source: &str,
    target: &Path,
    options: &[Opt<'_>],
    readonly: bool,
    flags: MountFlags,
) -> Result<(), MountError> {
    let target_fd =
        anchors.open(target, OFlags::PATH | OFlags::DIRECTORY).map_err(|e| MountError::resolving(target, e))?;
    let mut held = Vec::new();
    let source = if source.starts_with('/') {
        let fd =
            anchors.open(Path::new(source), OFlags::PATH).map_err(|e| MountError::resolving(Path::new(source), e))?;
        let s = fd_path(&fd);
        held.push(fd);
        s
    } else {
        source.to_string()
    };
    let mut data = Vec::new();
    for o in options {
        match o {
            Opt::Text(t) => data.push(t.to_string()),
            Opt::Path { prefix, path } => {
                let fd = anchors.open(path, OFlags::PATH).map_err(|e| MountError::resolving(path, e))?;
                data.push(format!("{prefix}{}", fd_path(&fd)));
                held.push(fd);
            }
        }
    }
    let flags = if readonly { MountFlags::RDONLY } else { MountFlags::empty() }
        | MountFlags::NOSUID
        | MountFlags::NODEV
        | flags;
    let data = std::ffi::CString::new(data.join(",")).map_err(|_| MountError::new("mount", target, Errno::EINVAL))?;
    let data = (!data.is_empty()).then_some(data.as_c_str());
    rustix::mount::mount(source.as_str(), fd_path(&target_fd).as_str(), fstype, flags, data)
        .map_err(|e| MountError::new("mount", target, errno(e)))?;
    drop(held);
    Ok(())
}

/// The `host-fd` mount options (the policy's `HOST_MOUNT_OPTIONS`) that are per-mount flags of
/// mount(2), not FUSE data: the kernel's FUSE option parser refuses them (EINVAL). The atime
/// ones are a choice of one (the last named wins).
fn fuse_flag(name: &str) -> Option<MountFlags> {
    Some(match name {
        "noexec" => MountFlags::NOEXEC,
        "noatime" => MountFlags::NOATIME,
        "nodiratime" => MountFlags::NODIRATIME,
        "relatime" => MountFlags::RELATIME,
        "strictatime" => MountFlags::STRICTATIME,
        _ => return None,
    })
}

/// Split `host-fd` mount options into mount(2) flags and the FUSE data options left.
fn fuse_flags(extra: &[String]) -> (MountFlags, Vec<&str>) {
    let atime = MountFlags::NOATIME | MountFlags::RELATIME | MountFlags::STRICTATIME;
    let mut flags = MountFlags::empty();
    let mut data = Vec::new();
    for o in extra {
        match fuse_flag(o) {
            Some(f) if atime.contains(f) => flags = (flags - atime) | f,
            Some(f) => flags |= f,
            None => data.push(o.as_str()),
        }
    }
    (flags, data)
}

/// Mount the FUSE connection `dev` (an open `/dev/fuse`) at `target` (resolved below the
/// anchors): type `fstype` (`fuse` or `fuse.<subtype>`), source `source`, data
/// `fd=<dev>,rootmode=40000,user_id=<uid>,group_id=<gid>,allow_other` and the FUSE data options
/// of `extra` (`default_permissions`, `max_read=`), flags `nosuid`, `nodev`, `ro` when asked
/// and those of `extra` that are flags (`noexec` and the atime ones, [`fuse_flag`]). The
/// kernel sends the connection's INIT at once and the mount answers nothing until a server
/// reads `dev`.
#[allow(clippy::too_many_arguments)]
pub fn mount_fuse(
    anchors: &Anchors,
    dev: &OwnedFd,
    fstype: &str,
    source: &str,
    target: &Path,
    uid: u32,
    gid: u32,
    extra: &[String],
    readonly: bool,
) -> Result<(), MountError> {
    let mut options = vec![
        format!("fd={}", dev.as_raw_fd()),
        "rootmode=40000".to_string(),
        format!("user_id={uid}"),
        format!("group_id={gid}"),
        "allow_other".to_string(),
    ];
    let (flags, data) = fuse_flags(extra);
    options.extend(data.into_iter().map(str::to_string));
    let options: Vec<Opt<'_>> = options.iter().map(|o| Opt::Text(o)).collect();
    mount_with(anchors, fstype, source, target, &options, readonly, flags)
}

/// Does this kernel have `mount_setattr(2)` (Linux 5.12)? Then a bind made read-only is
/// read-only before it is attached, so no copy a shared parent propagates can be writable.
pub fn setattr_supported() -> bool {
    static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        // SAFETY: an invalid descriptor and a null attribute pointer with size 0: the kernel
        // answers EBADF or EINVAL when it has the call, ENOSYS when not; it touches no memory.
        let r = unsafe {
            nix::libc::syscall(nix::libc::SYS_mount_setattr, -1, c"".as_ptr(), 0, std::ptr::null::<u8>(), 0usize)
        };
        !(r == -1 && Errno::last() == Errno::ENOSYS)
    })
}

/// Make the mount at `target` (resolved below the anchors) shared: a private mount gets a peer
/// group of its own, one already shared keeps its group.
pub fn share(anchors: &Anchors, target: &Path) -> Result<(), MountError> {
    let fd = anchors.open(target, OFlags::PATH | OFlags::DIRECTORY).map_err(|e| MountError::resolving(target, e))?;
    rustix::mount::mount_change(fd_path(&fd).as_str(), rustix::mount::MountPropagationFlags::SHARED)
        .map_err(|e| MountError::new("make shared", target, errno(e)))
}

/// Bind `source` onto `target`, read-only when asked, with per-mount flags (`nosuid` and
/// `nodev` always: pods never get set-uid binaries or device nodes through a volume).
pub fn bind(
    anchors: &Anchors,
    api: Api,
    source: &Path,
    target: &Path,
    readonly: bool,
    flags: &[String],
) -> Result<(), MountError> {
    let source_fd = anchors.open(source, OFlags::PATH).map_err(|e| MountError::resolving(source, e))?;
    // The target's parent and the target, resolved once, before anything is mounted: every
    // later step names these descriptors, never the path again.
    let (parent, name) = anchors.open_parent(target).map_err(|e| MountError::resolving(target, e))?;
    let target_fd =
        anchors.open_in(&parent, &name, target, OFlags::PATH).map_err(|e| MountError::resolving(target, e))?;
    let (mut attrs, mut legacy) = (MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, MountFlags::NOSUID | MountFlags::NODEV);
    let mut clear = 0;
    for (a, l) in flags.iter().filter_map(|f| bind_flag(f)) {
        if matches!(a, MOUNT_ATTR_NOATIME | MOUNT_ATTR_RELATIME | MOUNT_ATTR_STRICTATIME) {
            // One atime value replaces another: the field is cleared, then set.
            clear |= MOUNT_ATTR__ATIME;
            attrs &= !MOUNT_ATTR__ATIME;
        }
        attrs |= a;
        legacy |= l;
    }
    if readonly {
        attrs |= MOUNT_ATTR_RDONLY;
        legacy |= MountFlags::RDONLY;
    }
    if api == Api::New {
        match rustix::mount::open_tree(
            &source_fd,
            "",
            OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC | OpenTreeFlags::AT_EMPTY_PATH,
        ) {
            Ok(tree) => return attach(tree, &target_fd, target, attrs, clear, legacy),
            Err(rustix::io::Errno::NOSYS) => {}
            Err(e) => return Err(MountError::new("bind", target, errno(e))),
        }
    }
    // Legacy: bind between descriptors, then remount the new mount through the held parent and
    // the final name, which now holds it (a mount point cannot be renamed away in this namespace
    // while mounted); on any failure, detach it the same way. (Left open on these kernels: a
    // directory renamed away between its resolution and the bind gets the bind where it went,
    // and the remount then fails on whatever took its name.)
    rustix::mount::mount_bind(fd_path(&source_fd).as_str(), fd_path(&target_fd).as_str())
        .map_err(|e| MountError::new("bind", target, errno(e)))?;
    // mount(2) follows a link in its last component, so the remount goes through a descriptor
    // of what the name holds now, opened without following (a link planted there is refused;
    // anything else that is not the new mount's root makes the remount fail with EINVAL).
    let at = PathBuf::from(fd_path(&parent)).join(&name);
    let remount = anchors.open_in(&parent, &name, target, OFlags::PATH).map_err(|e| errno_of(&e)).and_then(|fd| {
        rustix::mount::mount_remount(fd_path(&fd).as_str(), MountFlags::BIND | legacy, "").map_err(errno)
    });
    if let Err(e) = remount {
        // Never leave a writable bind, or one without nosuid/nodev, behind.
        let _ = rustix::mount::unmount(&at, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW);
        return Err(MountError::new("remount read-only", target, e));
    }
    Ok(())
}

/// Set the flags on a detached tree, then attach it onto the target.
fn attach(
    tree: OwnedFd,
    target_fd: &OwnedFd,
    target: &Path,
    attrs: u64,
    clear: u64,
    legacy: MountFlags,
) -> Result<(), MountError> {
    let attr = MountAttr { attr_set: attrs, attr_clr: clear, propagation: 0, userns_fd: 0 };
    // SAFETY: mount_setattr(2) reads `size_of::<MountAttr>()` bytes from `&attr`, a live,
    // properly laid out `struct mount_attr`; the path is a NUL-terminated empty string and
    // `tree` an open descriptor. It writes no memory of ours.
    let r = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            nix::libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    let set_before = r == 0;
    if !set_before {
        let e = Errno::last();
        if e != Errno::ENOSYS {
            return Err(MountError::new("bind", target, e));
        }
    }
    rustix::mount::move_mount(
        &tree,
        "",
        target_fd,
        "",
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
    )
    .map_err(|e| MountError::new("bind", target, errno(e)))?;
    if !set_before {
        // Kernels 5.2–5.11: remount the attached tree through its own descriptor.
        if let Err(e) = rustix::mount::mount_remount(fd_path(&tree).as_str(), MountFlags::BIND | legacy, "") {
            let _ = rustix::mount::unmount(fd_path(&tree).as_str(), UnmountFlags::DETACH);
            return Err(MountError::new("remount read-only", target, errno(e)));
        }
    }
    Ok(())
}

/// Unmount the top mount at `target`. With `lazy`, detach it now even if busy
/// (`MNT_DETACH`), as needed for a dead FUSE mount ("Transport endpoint is not connected")
/// that a pod still holds open.
pub fn unmount(anchors: &Anchors, target: &Path, lazy: bool) -> Result<(), MountError> {
    let (parent, name) = anchors.open_parent(target).map_err(|e| MountError::resolving(target, e))?;
    let at = PathBuf::from(fd_path(&parent)).join(&name);
    let flags = UnmountFlags::NOFOLLOW | if lazy { UnmountFlags::DETACH } else { UnmountFlags::empty() };
    rustix::mount::unmount(&at, flags).map_err(|e| MountError::new("unmount", target, errno(e)))
}

impl From<MountError> for crate::error::Error {
    fn from(e: MountError) -> Self {
        if e.is_symlink() {
            crate::error::Error::precondition(e.to_string())
        } else {
            crate::error::Error::internal(e.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use rustix::mount::MountFlags;

    #[test]
    fn a_resolution_error_keeps_its_errno_through_the_path_it_names() {
        // The resolver names the path in its errors (`with_path`), which drops the raw errno:
        // the kind still says which it was, and the daemon decides on the errno (EIO means
        // "detach lazily", ENOENT "nothing mounted there").
        use nix::errno::Errno;
        use std::io::{Error, ErrorKind};
        for (kind, errno) in [
            (ErrorKind::NotFound, Errno::ENOENT),
            (ErrorKind::NotADirectory, Errno::ENOTDIR),
            (ErrorKind::InvalidFilename, Errno::ENAMETOOLONG),
            (ErrorKind::Other, Errno::EIO),
        ] {
            assert_eq!(super::errno_of(&Error::new(kind, "/a/b: described")), errno, "{kind:?}");
        }
        assert_eq!(super::errno_of(&Error::from_raw_os_error(nix::libc::EBUSY)), Errno::EBUSY);
    }

    #[test]
    fn every_bind_option_the_policy_allows_is_a_flag_here() {
        for o in crate::plan::policy::BIND_OPTIONS {
            assert!(super::bind_flag(o).is_some(), "{o}");
        }
    }

    #[test]
    fn host_fd_options_that_are_mount_flags_never_reach_the_fuse_data() {
        // What the kernel's FUSE parser accepts as data (fs/fuse/inode.c); the rest are flags.
        let fuse_data = ["default_permissions"];
        for o in crate::plan::policy::HOST_MOUNT_OPTIONS {
            assert!(super::fuse_flag(o).is_some() != fuse_data.contains(o), "{o}");
        }
        let opts = |o: &[&str]| super::fuse_flags(&o.iter().map(|s| s.to_string()).collect::<Vec<_>>()).0;
        let given: Vec<String> = ["noexec", "max_read=65536", "default_permissions"].map(String::from).into();
        let (flags, data) = super::fuse_flags(&given);
        assert_eq!((flags, data), (MountFlags::NOEXEC, vec!["max_read=65536", "default_permissions"]));
        assert_eq!(opts(&["noatime", "strictatime"]), MountFlags::STRICTATIME);
        assert_eq!(opts(&["relatime", "nodiratime", "noatime"]), MountFlags::NODIRATIME | MountFlags::NOATIME);
    }
}
