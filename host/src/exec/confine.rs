//! A FUSE program's own mount namespace (docs/policy.md#confinement): the node's tree is absent
//! but for what the program and its volume need, and the only mount that can reach the node
//! is one at its planned mount point.
//!
//! A rule set judges a program's argv before it runs; this confines what the rules miss. The
//! namespace is built from detached mounts prepared here, in the daemon, before the fork
//! ([`Prepared::build`]); the child attaches them and pivots into them before it execs
//! ([`Entry::enter`]):
//!
//! - `/` is an empty tmpfs, read-only once built: `dev/` holds only `null`, `zero`, `full`,
//!   `random`, `urandom`, `tty` and `fuse`;
//! - `/usr` (and `/bin`, `/sbin`, `/lib*`, as links or directories as the node has them),
//!   `/proc` and `/sys` are read-only copies of the node's (slaves: the node's unmounts reach
//!   them, so the namespace never pins another volume's mount);
//! - `/etc` holds only what programs read to run (users, name resolution, certificates, the
//!   loader's cache, libfuse's `fuse.conf`), read-only;
//! - `/tmp` is a tmpfs of its own (64 MiB) holding the program's empty `HOME` and working
//!   directory (`/tmp/home`) and an empty file for the `config-file` of its rule set;
//! - the volume's own directories (cache, runtime, secret files) are writable at their paths;
//! - the program's binary is at its path (a read-only copy of the file when no system
//!   directory holds it);
//! - the files its rule set says it reads by itself are absent or, under `/usr`, covered by
//!   something empty;
//! - for a program that mounts by itself, the directory holding its mount point is a read-only
//!   copy of the node's that is a *peer* of the node's mount holding it (a copy of the mount
//!   point itself would make it a mount point, which `weed mount` refuses): a mount the program
//!   makes at its mount point propagates to the node (and the node's unmount of it back).
//!   Every other mount of the namespace is a slave or private: a mount made anywhere else stays
//!   in the namespace, which dies with the program; one made beside the mount point, in that
//!   directory, is seen ([`elsewhere`]) and fails the stage.
//!
//! Needs Linux 5.12 (`mount_setattr`); root (the daemon). The node's directory holding the
//! mount point must be a shared mount, as kubelet makes its own directory.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::mount::{FsMountFlags, FsOpenFlags, MountAttrFlags, OpenTreeFlags};

/// The node's directories a program gets read-only, when the node has them (a link, as on a
/// merged-`/usr` system, is made again as the same link).
const SYSTEM: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];
/// What of `/etc` a program gets, read-only, when the node has it: users and groups, name
/// resolution, certificates, the dynamic loader's cache, libfuse's configuration, time zone and
/// MIME types, the alternatives links. Nothing else of `/etc` is in the namespace.
pub const ETC: &[&str] = &[
    "passwd",
    "group",
    "nsswitch.conf",
    "hosts",
    "host.conf",
    "resolv.conf",
    "gai.conf",
    "services",
    "protocols",
    "localtime",
    "timezone",
    "mime.types",
    "fuse.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "pki",
    "crypto-policies",
    "alternatives",
    "mtab",
];
/// What the directories of [`ETC`] hold that no program gets: private keys (covered by an empty
/// tmpfs where the node has them).
pub const ETC_PRIVATE: &[&str] = &["/etc/ssl/private", "/etc/pki/tls/private", "/etc/pki/CA/private"];
/// Device nodes of `/dev`: name, major, minor, mode (`/dev/fuse` for root only: an
/// unprivileged program gets its connection as a descriptor).
const DEVICES: &[(&str, u32, u32, u32)] = &[
    ("null", 1, 3, 0o666),
    ("zero", 1, 5, 0o666),
    ("full", 1, 7, 0o666),
    ("random", 1, 8, 0o666),
    ("urandom", 1, 9, 0o666),
    ("tty", 5, 0, 0o666),
    ("fuse", 10, 229, 0o600),
];
/// The size of a program's own `/tmp`, which holds its home.
pub const TMP_BYTES: u64 = 64 << 20;
/// A program's `HOME` and working directory.
pub const HOME: &str = "/tmp/home";
/// The empty file a rule set's `config-file` names.
pub const EMPTY_FILE: &str = "/tmp/.mounthost-empty";

/// What one program's namespace holds beyond the system's directories.
#[derive(Debug)]
pub struct Jail<'a> {
    /// A program that mounts by itself: the directory holding its planned mount point, opened
    /// below the anchors.
    pub mount_parent: Option<(&'a Path, &'a OwnedFd)>,
    /// The volume's own directories, opened below the anchors: writable at their paths.
    pub writable: Vec<(&'a Path, &'a OwnedFd)>,
    /// What the program reads by itself (its rule set's `reads`): never in the namespace.
    pub hidden: &'a [PathBuf],
    /// The binary it runs.
    pub executable: &'a Path,
    /// The user and group it runs as (its `/tmp` and home are theirs).
    pub uid: u32,
    /// Its group.
    pub gid: u32,
}

/// A namespace prepared in the daemon: detached mounts the child attaches.
#[derive(Debug)]
pub struct Prepared {
    root_program: bool,
    root: OwnedFd,
    /// Each mount and where it goes (relative to the root), parents before children.
    mounts: Vec<(OwnedFd, CString)>,
    /// The binary's path in the namespace (its canonical path on the node).
    executable: PathBuf,
}

/// The child's half of a [`Prepared`] namespace: plain descriptors and paths, made before the
/// fork so that nothing is allocated after it.
#[derive(Debug, Clone)]
pub struct Entry {
    root: RawFd,
    mounts: Vec<(RawFd, CString)>,
    home: CString,
    /// The program runs as root: it keeps only [`KEPT_CAPS`].
    root_program: bool,
}

/// The capabilities a program that runs as root keeps in its namespace (what a FUSE server that
/// mounts by itself and serves files for others uses): every other one leaves its bounding,
/// inheritable and ambient sets before it runs. Without `CAP_SYS_PTRACE`, and with fewer
/// capabilities than the daemon and the node's own root processes, it cannot reach their
/// trees through `/proc/<pid>/root` (nor `/proc/<pid>/ns`), nor can it open a file by handle
/// without `CAP_DAC_READ_SEARCH`.
pub const KEPT_CAPS: &[u32] = &[
    0,  // CAP_CHOWN
    1,  // CAP_DAC_OVERRIDE
    3,  // CAP_FOWNER
    4,  // CAP_FSETID
    5,  // CAP_KILL
    6,  // CAP_SETGID
    7,  // CAP_SETUID
    10, // CAP_NET_BIND_SERVICE
    14, // CAP_IPC_LOCK
    21, // CAP_SYS_ADMIN (its mount)
    23, // CAP_SYS_NICE
    24, // CAP_SYS_RESOURCE
];
/// The highest capability number this code knows (CAP_CHECKPOINT_RESTORE, Linux 5.9); a
/// higher one the kernel may have is dropped as well (PR_CAPBSET_DROP ends with EINVAL).
const LAST_CAP: u32 = 63;

fn io_at(what: &str, path: &Path, e: impl Into<io::Error>) -> io::Error {
    let e: io::Error = e.into();
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

/// `mount_setattr(2)` on `fd` itself (and what is below it with `recursive`).
fn set_attr(
    fd: &OwnedFd,
    recursive: bool,
    set: MountAttrFlags,
    clear: MountAttrFlags,
    propagation: u64,
) -> io::Result<()> {
    use super::mount::MountAttr;
    let attr =
        MountAttr { attr_set: u64::from(set.bits()), attr_clr: u64::from(clear.bits()), propagation, userns_fd: 0 };
    let flags = nix::libc::AT_EMPTY_PATH | if recursive { nix::libc::AT_RECURSIVE } else { 0 };
    // SAFETY: mount_setattr(2) reads `size_of::<MountAttr>()` bytes from `&attr`, a live,
    // properly laid out `struct mount_attr`; the path is an empty NUL-terminated string and
    // `fd` an open descriptor. It writes no memory of ours.
    let r = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            c"".as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

const MS_PRIVATE: u64 = nix::libc::MS_PRIVATE as u64;
const MS_SLAVE: u64 = nix::libc::MS_SLAVE as u64;

/// A detached copy of the mount at `path` (following links) and, with `recursive`, of those
/// below it.
fn clone_path(path: &Path, recursive: bool) -> io::Result<OwnedFd> {
    let mut flags = OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC;
    if recursive {
        flags |= OpenTreeFlags::AT_RECURSIVE;
    }
    rustix::mount::open_tree(rustix::fs::CWD, path, flags).map_err(|e| io_at("copying the mount of", path, e))
}

/// A detached copy of the mount `fd` names (resolved below the anchors by the caller).
fn clone_fd(fd: &OwnedFd, path: &Path) -> io::Result<OwnedFd> {
    let flags = OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC | OpenTreeFlags::AT_EMPTY_PATH;
    rustix::mount::open_tree(fd, "", flags).map_err(|e| io_at("copying the mount of", path, e))
}

/// A new, detached tmpfs.
fn tmpfs(options: &[(&str, String)], attrs: MountAttrFlags) -> io::Result<OwnedFd> {
    let fs = rustix::mount::fsopen("tmpfs", FsOpenFlags::FSOPEN_CLOEXEC)?;
    for (k, v) in options {
        rustix::mount::fsconfig_set_string(&fs, *k, v.as_str())?;
    }
    rustix::mount::fsconfig_create(&fs)?;
    Ok(rustix::mount::fsmount(&fs, FsMountFlags::FSMOUNT_CLOEXEC, attrs)?)
}

/// Where a path of the namespace lands: in one of the tmpfs mounts made here, which may be
/// written, or in a copy of the node's, which never is.
enum Holder<'a> {
    Ours(&'a OwnedFd, PathBuf),
    Node,
}

/// A mount the namespace will hold, at `at` (absolute in the namespace).
struct Planned {
    at: PathBuf,
    fd: OwnedFd,
    /// Made here (a tmpfs of the namespace's own): what lies below it may be created.
    ours: bool,
}

struct Builder {
    root: OwnedFd,
    planned: Vec<Planned>,
}

impl Builder {
    /// The deepest mount holding `path` (other than one at `path` itself) and `path`'s place
    /// in it.
    fn holder(&self, path: &Path) -> Holder<'_> {
        let deepest = self
            .planned
            .iter()
            .filter(|p| path.starts_with(&p.at) && path != p.at)
            .max_by_key(|p| p.at.components().count());
        match deepest {
            Some(p) if p.ours => Holder::Ours(&p.fd, path.strip_prefix(&p.at).expect("starts with it").to_path_buf()),
            Some(_) => Holder::Node,
            None => Holder::Ours(&self.root, path.strip_prefix("/").unwrap_or(path).to_path_buf()),
        }
    }

    /// Make `path` exist in the namespace (a directory, or an empty file with `file`), with its
    /// missing parents, inside a tmpfs of its own; under a copy of the node's, it must exist on
    /// the node already.
    fn place(&self, path: &Path, file: bool) -> io::Result<()> {
        match self.holder(path) {
            Holder::Node => match std::fs::symlink_metadata(path) {
                Ok(_) => Ok(()),
                Err(e) => Err(io_at("placing in the program's namespace (below a node directory)", path, e)),
            },
            Holder::Ours(fd, rel) => {
                let mut so_far = PathBuf::new();
                let parts: Vec<_> = rel.components().collect();
                for (i, part) in parts.iter().enumerate() {
                    so_far.push(part);
                    let last = i + 1 == parts.len();
                    let made = if last && file {
                        rustix::fs::openat(
                            fd,
                            &so_far,
                            OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                            Mode::from_raw_mode(0o444),
                        )
                        .map(drop)
                    } else {
                        rustix::fs::mkdirat(fd, &so_far, Mode::from_raw_mode(0o755))
                    };
                    match made {
                        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                        Err(e) => return Err(io_at("placing in the program's namespace", path, e)),
                    }
                }
                Ok(())
            }
        }
    }

    fn add(&mut self, at: &Path, fd: OwnedFd, ours: bool, file: bool) -> io::Result<()> {
        self.place(at, file)?;
        self.planned.push(Planned { at: at.to_path_buf(), fd, ours });
        Ok(())
    }
}

/// Whether `path` is a directory on the node (following links).
fn is_dir(path: &Path) -> bool {
    path.is_dir()
}

/// The mount id of the mount `fd` is on, and whether that mount is shared (a member of a
/// peer group), from `/proc/self/mountinfo`.
fn shared(fd: &OwnedFd) -> io::Result<(u64, bool)> {
    let st = rustix::fs::statx(fd, "", AtFlags::EMPTY_PATH, rustix::fs::StatxFlags::MNT_ID)?;
    let id = st.stx_mnt_id;
    let table = std::fs::read("/proc/self/mountinfo")?;
    let line = table
        .split(|b| *b == b'\n')
        .find(|l| l.split(|b| *b == b' ').next().is_some_and(|f| f == id.to_string().as_bytes()));
    let Some(line) = line else { return Ok((id, false)) };
    // Optional fields come after the sixth and end at " - ".
    let before = line.windows(3).position(|w| w == b" - ").map_or(line, |i| &line[..i]);
    Ok((id, before.split(|b| *b == b' ').skip(6).any(|f| f.starts_with(b"shared:"))))
}

impl Prepared {
    /// Prepare `jail`'s namespace: every mount detached, ready for [`Prepared::entry`]. A
    /// kernel without the new mount API is an `Unsupported` error that says so.
    pub fn build(jail: &Jail<'_>) -> io::Result<Prepared> {
        Prepared::build_on(jail).map_err(|e| {
            if e.raw_os_error() == Some(nix::libc::ENOSYS) {
                io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!(
                        "{e}: this kernel lacks the mount API a program's namespace is built with (open_tree, \
                         fsmount, mount_setattr: Linux 5.12 or later); --confine-programs=false runs programs \
                         without one"
                    ),
                )
            } else {
                e
            }
        })
    }

    fn build_on(jail: &Jail<'_>) -> io::Result<Prepared> {
        let skeleton_attrs = MountAttrFlags::MOUNT_ATTR_NOSUID;
        let root =
            tmpfs(&[("mode", "0755".into()), ("size", "1m".into()), ("nr_inodes", "4096".into())], skeleton_attrs)
                .map_err(|e| io::Error::new(e.kind(), format!("making the program's root (a tmpfs): {e}")))?;
        let mut b = Builder { root, planned: Vec::new() };
        let read_only =
            MountAttrFlags::MOUNT_ATTR_RDONLY | MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV;
        let none = MountAttrFlags::empty();
        for name in SYSTEM {
            let host = Path::new("/").join(name);
            let Ok(meta) = std::fs::symlink_metadata(&host) else { continue };
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&host)?;
                rustix::fs::symlinkat(&target, &b.root, *name).map_err(|e| io_at("linking", &host, e))?;
            } else if meta.is_dir() {
                let fd = clone_path(&host, true)?;
                set_attr(&fd, true, read_only, none, MS_SLAVE).map_err(|e| io_at("making read-only", &host, e))?;
                b.add(&host, fd, false, false)?;
            }
        }
        for (name, extra) in [("proc", MountAttrFlags::MOUNT_ATTR_NOEXEC), ("sys", MountAttrFlags::MOUNT_ATTR_NOEXEC)] {
            let host = Path::new("/").join(name);
            if is_dir(&host) {
                let fd = clone_path(&host, true)?;
                set_attr(&fd, true, read_only | extra, none, MS_SLAVE)
                    .map_err(|e| io_at("making read-only", &host, e))?;
                b.add(&host, fd, false, false)?;
            }
        }
        // /dev: the devices a FUSE program uses, as nodes of the root's own.
        rustix::fs::mkdirat(&b.root, "dev", Mode::from_raw_mode(0o755))?;
        for (name, major, minor, mode) in DEVICES {
            let at = format!("dev/{name}");
            let made = rustix::fs::mknodat(
                &b.root,
                &at,
                FileType::CharacterDevice,
                Mode::from_raw_mode(*mode),
                rustix::fs::makedev(*major, *minor),
            )
            // Its mode as given, whatever the daemon's umask took off it.
            .and_then(|()| rustix::fs::chmodat(&b.root, &at, Mode::from_raw_mode(*mode), AtFlags::empty()));
            made.map_err(|e| io_at("making", &Path::new("/dev").join(name), e))?;
        }
        for (name, target) in [
            ("fd", "/proc/self/fd"),
            ("stdin", "/proc/self/fd/0"),
            ("stdout", "/proc/self/fd/1"),
            ("stderr", "/proc/self/fd/2"),
        ] {
            rustix::fs::symlinkat(target, &b.root, format!("dev/{name}"))?;
        }
        // /etc: what programs read to run.
        rustix::fs::mkdirat(&b.root, "etc", Mode::from_raw_mode(0o755))?;
        for name in ETC {
            let host = Path::new("/etc").join(name);
            if jail.hidden.iter().any(|h| host.starts_with(h)) {
                continue;
            }
            let Ok(meta) = std::fs::symlink_metadata(&host) else { continue };
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&host)?;
                let resolved = std::fs::canonicalize(&host).ok();
                // A link into /usr or /proc (/etc/localtime, /etc/mtab) works as it is; one
                // elsewhere (/etc/resolv.conf into /run) gets what it points to.
                let inside = target.to_string_lossy().contains("proc/self")
                    || resolved.as_ref().is_some_and(|r| r.starts_with("/usr") || r.starts_with("/proc"));
                if inside {
                    rustix::fs::symlinkat(&target, &b.root, format!("etc/{name}"))?;
                    continue;
                }
                let Some(resolved) = resolved else { continue };
                let fd = clone_path(&resolved, true)?;
                set_attr(&fd, true, read_only, none, MS_PRIVATE).map_err(|e| io_at("making read-only", &host, e))?;
                b.add(&host, fd, false, !resolved.is_dir())?;
            } else {
                let fd = clone_path(&host, true)?;
                set_attr(&fd, true, read_only, none, MS_PRIVATE).map_err(|e| io_at("making read-only", &host, e))?;
                b.add(&host, fd, false, !meta.is_dir())?;
            }
        }
        // /tmp: the program's own, with its home and the empty configuration file.
        let tmp = tmpfs(
            &[
                ("mode", "0700".into()),
                ("size", TMP_BYTES.to_string()),
                ("nr_inodes", "16384".into()),
                ("uid", jail.uid.to_string()),
                ("gid", jail.gid.to_string()),
            ],
            MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV,
        )
        .map_err(|e| io::Error::new(e.kind(), format!("making the program's /tmp (a tmpfs): {e}")))?;
        rustix::fs::mkdirat(&tmp, "home", Mode::from_raw_mode(0o700))?;
        rustix::fs::chownat(
            &tmp,
            "home",
            Some(rustix::fs::Uid::from_raw(jail.uid)),
            Some(rustix::fs::Gid::from_raw(jail.gid)),
            AtFlags::SYMLINK_NOFOLLOW,
        )?;
        let empty = Path::new(EMPTY_FILE).file_name().expect("a file name");
        drop(rustix::fs::openat(
            &tmp,
            empty,
            OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o444),
        )?);
        b.add(Path::new("/tmp"), tmp, true, false)?;
        // The volume's own directories, writable.
        for (path, fd) in &jail.writable {
            let copy = clone_fd(fd, path)?;
            set_attr(
                &copy,
                false,
                MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV,
                MountAttrFlags::MOUNT_ATTR_RDONLY,
                MS_PRIVATE,
            )
            .map_err(|e| io_at("preparing", path, e))?;
            b.add(path, copy, false, false)?;
        }
        // The binary, where no system directory holds it.
        let executable = std::fs::canonicalize(jail.executable).map_err(|e| io_at("resolving", jail.executable, e))?;
        if !b.planned.iter().any(|p| executable.starts_with(&p.at) && !p.ours) {
            let fd = clone_path(&executable, false)?;
            set_attr(
                &fd,
                false,
                MountAttrFlags::MOUNT_ATTR_RDONLY
                    | MountAttrFlags::MOUNT_ATTR_NODEV
                    | MountAttrFlags::MOUNT_ATTR_NOSUID,
                none,
                MS_PRIVATE,
            )
            .map_err(|e| io_at("preparing", &executable, e))?;
            b.add(&executable, fd, false, true)?;
        }
        // What the program reads by itself, where a node directory would show it: covered.
        for hidden in jail.hidden.iter().map(PathBuf::as_path).chain(ETC_PRIVATE.iter().map(Path::new)) {
            let under_node = b.planned.iter().any(|p| !p.ours && hidden.starts_with(&p.at));
            let Ok(meta) = std::fs::metadata(hidden) else { continue };
            if !under_node {
                continue;
            }
            let cover = if meta.is_dir() {
                tmpfs(&[("mode", "0555".into()), ("size", "4k".into())], read_only)?
            } else {
                let fd = clone_path(Path::new("/dev/null"), false)?;
                set_attr(&fd, false, MountAttrFlags::MOUNT_ATTR_RDONLY, none, MS_PRIVATE)?;
                fd
            };
            b.planned.push(Planned { at: hidden.to_path_buf(), fd: cover, ours: false });
        }
        // The directory of a program's mount point: a peer of the node's mount, so that its
        // mount there reaches the node.
        if let Some((path, fd)) = jail.mount_parent {
            let (id, is_shared) = shared(fd).map_err(|e| io_at("reading the mount of", path, e))?;
            if !is_shared {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!(
                        "the mount holding {} (mount {id}) is not shared, so the program's mount cannot reach the node \
                         from its own namespace; kubelet's directory must be a shared mount (kubelet makes it one; \
                         `mount --make-rshared` it)",
                        path.display()
                    ),
                ));
            }
            let copy = clone_fd(fd, path)?;
            // Read-only: nothing is written into the node's directory; mounting onto the mount
            // point in it is allowed. Its propagation stays the node's (a peer).
            set_attr(&copy, false, MountAttrFlags::MOUNT_ATTR_RDONLY, none, 0)
                .map_err(|e| io_at("preparing", path, e))?;
            b.add(path, copy, false, false)?;
        }
        set_attr(&b.root, false, MountAttrFlags::MOUNT_ATTR_RDONLY, none, 0)
            .map_err(|e| io::Error::new(e.kind(), format!("making the program's root read-only: {e}")))?;
        let mut mounts: Vec<(usize, OwnedFd, CString)> = Vec::new();
        for p in b.planned {
            let rel = p.at.strip_prefix("/").unwrap_or(&p.at);
            let c = CString::new(rel.as_os_str().as_bytes())
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("{} holds NUL", p.at.display())))?;
            mounts.push((p.at.components().count(), p.fd, c));
        }
        // Parents before children: each lands on what the one before placed.
        mounts.sort_by_key(|(depth, _, _)| *depth);
        Ok(Prepared {
            root_program: jail.uid == 0,
            root: b.root,
            mounts: mounts.into_iter().map(|(_, fd, c)| (fd, c)).collect(),
            executable,
        })
    }

    /// The binary's path in the namespace (its canonical path on the node): what to exec.
    pub fn executable(&self) -> &Path {
        &self.executable
    }

    /// The child's half, valid while `self` lives.
    pub fn entry(&self) -> Entry {
        Entry {
            root: self.root.as_fd().as_raw_fd(),
            mounts: self.mounts.iter().map(|(fd, at)| (fd.as_raw_fd(), at.clone())).collect(),
            home: CString::new(HOME).expect("no NUL"),
            root_program: self.root_program,
        }
    }
}

impl Entry {
    /// Enter the namespace: a mount namespace of its own, every mount of which is a slave of
    /// the node's, the prepared root attached over `/` with the prepared mounts on it, then
    /// pivoted into and the node's root detached; the working directory is the home.
    ///
    /// # Safety
    /// Call only in a forked child before exec (plain syscalls, no allocation), while the
    /// [`Prepared`] this came from is alive in the parent (its descriptors are the child's
    /// copies).
    pub unsafe fn enter(&self) -> io::Result<()> {
        use nix::libc;
        // SAFETY: each call takes integers, NUL-terminated strings that live in `self` or are
        // literals, or null pointers the kernel reads nothing through (mount's source, type and
        // data); none writes memory of ours.
        unsafe {
            let step = |ok: bool, what: &[u8]| -> io::Result<()> {
                if ok {
                    return Ok(());
                }
                let e = io::Error::last_os_error();
                let _ = libc::write(2, b"mounthost: entering the program's namespace: ".as_ptr().cast(), 46);
                let _ = libc::write(2, what.as_ptr().cast(), what.len());
                let _ = libc::write(2, b" failed\n".as_ptr().cast(), 8);
                Err(e)
            };
            step(libc::unshare(libc::CLONE_NEWNS) == 0, b"unshare(CLONE_NEWNS)")?;
            let none = std::ptr::null::<libc::c_char>();
            step(
                libc::mount(none, c"/".as_ptr(), none, libc::MS_REC | libc::MS_SLAVE, std::ptr::null()) == 0,
                b"making every mount a slave",
            )?;
            let move_mount = |from: RawFd, to: RawFd, at: &std::ffi::CStr| {
                libc::syscall(libc::SYS_move_mount, from, c"".as_ptr(), to, at.as_ptr(), libc::MOVE_MOUNT_F_EMPTY_PATH)
                    == 0
            };
            step(move_mount(self.root, libc::AT_FDCWD, c"/"), b"attaching its root")?;
            for (fd, at) in &self.mounts {
                step(move_mount(*fd, self.root, at), at.as_bytes())?;
            }
            step(libc::fchdir(self.root) == 0, b"entering its root")?;
            step(libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) == 0, b"pivot_root")?;
            step(libc::umount2(c".".as_ptr(), libc::MNT_DETACH) == 0, b"detaching the node's root")?;
            step(libc::chdir(self.home.as_ptr()) == 0, b"entering its home")?;
            if self.root_program {
                drop_capabilities(&step)?;
            }
        }
        Ok(())
    }
}

/// Keep only [`KEPT_CAPS`] across the exec of a program that runs as root: clear the ambient
/// and inheritable sets (which an exec as root adds to the permitted one whatever the bounding
/// set says), then drop every other capability from the bounding set, `CAP_SETPCAP` (which the
/// dropping needs) last.
///
/// # Safety
/// Call only in a forked child before exec (plain syscalls on stack memory, no allocation).
unsafe fn drop_capabilities(step: &dyn Fn(bool, &[u8]) -> io::Result<()>) -> io::Result<()> {
    use nix::libc;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    const CAP_SETPCAP: u32 = 8;
    // SAFETY: prctl, capget and capset take integers and pointers to live locals of the
    // layout the kernel expects (`struct __user_cap_header_struct`, two
    // `struct __user_cap_data_struct`); they read or fill only those.
    unsafe {
        step(
            libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) == 0,
            b"clearing its ambient capabilities",
        )?;
        let mut header = Header { version: VERSION_3, pid: 0 };
        let mut data = [Data { effective: 0, permitted: 0, inheritable: 0 }; 2];
        step(libc::syscall(libc::SYS_capget, &mut header as *mut Header, data.as_mut_ptr()) == 0, b"capget")?;
        data[0].inheritable = 0;
        data[1].inheritable = 0;
        step(libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) == 0, b"capset")?;
        for cap in (0..=LAST_CAP).filter(|c| *c != CAP_SETPCAP && !KEPT_CAPS.contains(c)) {
            if libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) != 0 {
                // EINVAL: no such capability on this kernel (the last known is below 63).
                if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
                    step(false, b"dropping a capability")?;
                }
            }
        }
        step(libc::prctl(libc::PR_CAPBSET_DROP, CAP_SETPCAP as libc::c_ulong, 0, 0, 0) == 0, b"dropping CAP_SETPCAP")?;
    }
    Ok(())
}

/// Once a program that mounts by itself is ready, make the copy of its mount point's directory
/// in its namespace (`dir`) private: from then on no mount it makes there reaches the node (its
/// mount at the mount point, made already, stays where it is, and what is mounted inside its
/// own filesystem still propagates with it). A short-lived child of the daemon enters the
/// program's mount namespace (`setns`, which a process with threads cannot) and changes it.
pub fn seal(pid: i32, dir: &Path) -> io::Result<()> {
    use nix::libc;
    let ns = rustix::fs::open(format!("/proc/{pid}/ns/mnt").as_str(), OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?;
    let path = CString::new(dir.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let (ns_fd, write_fd) = (ns.as_raw_fd(), write.as_raw_fd());
    // SAFETY: the child runs only async-signal-safe calls on memory allocated before the fork
    // (`path`) and integers, then `_exit`s; it never returns into Rust code of the parent.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(io::Error::last_os_error());
    }
    if child == 0 {
        // SAFETY: as above; errno is read right after the call that set it.
        unsafe {
            let errno = |ok: bool| if ok { 0u8 } else { (*libc::__errno_location()).clamp(1, 255) as u8 };
            let mut code = errno(libc::setns(ns_fd, libc::CLONE_NEWNS) == 0);
            if code == 0 {
                let none = std::ptr::null::<libc::c_char>();
                code = errno(libc::mount(none, path.as_ptr(), none, libc::MS_PRIVATE, std::ptr::null()) == 0);
            }
            libc::write(write_fd, (&code as *const u8).cast(), 1);
            libc::_exit(i32::from(code != 0));
        }
    }
    drop(write);
    let mut code = [255u8];
    let got = rustix::io::read(&read, &mut code);
    // Reaped here, or by the supervisor's reaper if it got there first.
    let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(child), None);
    match got {
        Ok(1) if code[0] == 0 => Ok(()),
        Ok(1) => Err(io::Error::from_raw_os_error(i32::from(code[0]))),
        _ => Err(io::Error::other("the child that seals a program's namespace ended without a word")),
    }
}

fn is_fuse(fstype: &str) -> bool {
    fstype == "fuse" || fstype == "fuseblk" || fstype.starts_with("fuse.") || fstype.starts_with("fuseblk.")
}

/// A FUSE mount in a confined program's namespace (`theirs`, its mountinfo) other than at its
/// `mount_point` that the node (`node`, the daemon's mountinfo) did not make: one in the
/// directory holding the mount point (where the namespace's mounts reach the node, so only the
/// program can have made it), or one whose connection the node has nowhere outside that
/// directory (made in the namespace, or the program's own mounted again elsewhere).
pub fn elsewhere(
    theirs: &[super::mountinfo::MountEntry],
    node: &[super::mountinfo::MountEntry],
    mount_point: &Path,
) -> Option<super::mountinfo::MountEntry> {
    let reaching = mount_point.parent().unwrap_or(mount_point);
    let nodes: std::collections::BTreeSet<&str> = node
        .iter()
        .filter(|m| is_fuse(&m.fstype) && !m.mount_point.starts_with(reaching))
        .map(|m| m.device.as_str())
        .collect();
    theirs
        .iter()
        .find(|m| {
            is_fuse(&m.fstype)
                && m.mount_point != mount_point
                && (m.mount_point.starts_with(reaching) || !nodes.contains(m.device.as_str()))
        })
        .cloned()
}

/// How [`share_anchor`] found the directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shared {
    /// The mount holding it was shared already (kubelet's, a node's `/`).
    Already,
    /// It was a mount point of its own, now shared.
    Made,
    /// It is now a bind mount of itself, shared.
    Bound,
}

/// Make `dir` (kubelet's directory) a shared mount if the mount holding it is not, as kubelet
/// does with its own (a bind of itself when it is no mount point, then `MS_SHARED`), so that a
/// confined program's mount at a staging or target path below it reaches the node. A directory
/// that is no mount point and has mounts below it is left alone (a bind would hide them): an
/// error.
pub fn share_anchor(dir: &Path) -> io::Result<Shared> {
    let fd = rustix::fs::open(dir, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    if shared(&fd)?.1 {
        return Ok(Shared::Already);
    }
    let mounts = super::mountinfo::read()?;
    let make_shared =
        || rustix::mount::mount_change(dir, rustix::mount::MountPropagationFlags::SHARED).map_err(io::Error::from);
    if mounts.iter().any(|m| m.mount_point == dir) {
        make_shared()?;
        return Ok(Shared::Made);
    }
    if let Some(below) = mounts.iter().find(|m| m.mount_point.starts_with(dir)) {
        return Err(io::Error::other(format!(
            "{} is on a mount that is not shared and holds a mount ({}) already: bind it onto itself and make it \
             shared before the daemon starts (mount --bind DIR DIR; mount --make-rshared DIR)",
            dir.display(),
            below.mount_point.display()
        )));
    }
    rustix::mount::mount_bind(dir, dir)?;
    make_shared()?;
    Ok(Shared::Bound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::mountinfo::MountEntry;

    fn entry(point: &str, fstype: &str, device: &str) -> MountEntry {
        MountEntry {
            mount_id: 1,
            parent_id: 1,
            device: device.into(),
            root: "/".into(),
            mount_point: point.into(),
            mount_options: "rw".into(),
            fstype: fstype.into(),
            source: "x".into(),
            super_options: "rw".into(),
        }
    }

    #[test]
    fn a_second_fuse_mount_of_the_program_is_found_and_the_nodes_are_not() {
        let point = Path::new("/k/staging/globalmount");
        let node = [
            entry("/", "ext4", "254:0"),
            entry("/k/staging/globalmount", "fuse.seaweedfs", "0:50"),
            entry("/k/other/globalmount", "fuse.sshfs", "0:51"),
            entry("/k/staging/globalmount/sub", "fuse", "0:53"),
            entry("/k/staging/vol_data.json", "fuse", "0:54"),
        ];
        // Its own mount, a node's mount propagated into the namespace, a non-FUSE mount: none.
        let theirs = [entry("/", "tmpfs", "0:60"), entry("/k/staging/globalmount", "fuse.seaweedfs", "0:50")];
        assert_eq!(elsewhere(&theirs, &node, point), None);
        let theirs = [entry("/usr/x", "fuse.sshfs", "0:51"), entry("/tmp", "tmpfs", "0:61")];
        assert_eq!(elsewhere(&theirs, &node, point), None);
        // A mount at another path, its own connection bound elsewhere, one below its mount
        // point (which the node shows, but as the program's doing): found.
        for (at, device) in [
            ("/etc", "0:52"),
            ("/tmp/x", "0:50"),
            ("/k/staging/globalmount/sub", "0:53"),
            ("/k/staging/vol_data.json", "0:54"),
        ] {
            let theirs = [entry(at, "fuse.bindfs", device)];
            assert_eq!(elsewhere(&theirs, &node, point).map(|m| m.mount_point), Some(at.into()), "{at}");
        }
    }

    #[test]
    fn the_namespaces_etc_holds_no_secret_of_the_node() {
        for secret in ["shadow", "gshadow", "ssh", "kubernetes", "sudoers", "mounthost", "passwd-s3fs", "seaweedfs"] {
            assert!(!ETC.contains(&secret), "{secret}");
        }
        // The directories it holds have their private keys covered.
        for (dir, private) in [("ssl", "/etc/ssl/private"), ("pki", "/etc/pki/tls/private")] {
            assert!(ETC.contains(&dir) && ETC_PRIVATE.contains(&private), "{dir}");
        }
    }
}
