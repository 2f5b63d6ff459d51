//! The [`Executor`] traits: every effect the host daemon has on the node, behind a few narrow
//! interfaces. [`super::Linux`] performs them with real syscalls;
//! [`super::recording::Recording`] records them against a simulated node for unit tests.
//!
//! Methods are blocking (a hung FUSE server can block a syscall); the pipeline calls them from
//! a blocking thread.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::{Duration, SystemTime};

use super::beneath::Entry;
use super::mount::MountError;
use super::mountinfo::MountEntry;
use super::process::{ProcessError, ProcessId, Spec, Stopped};
use crate::plan::MountOption;

/// Space and inode usage of a mounted filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub total_bytes: u64,
    pub available_bytes: u64,
    pub used_bytes: u64,
    pub total_inodes: u64,
    pub free_inodes: u64,
    pub used_inodes: u64,
}

/// A FUSE program to start and the mount it must produce.
#[derive(Debug, Clone)]
pub struct Fuse<'a> {
    /// The program.
    pub spec: Spec<'a>,
    /// Where its filesystem must appear.
    pub mountpoint: &'a Path,
    /// With this fstype in mountinfo.
    pub fstype: &'a str,
    /// Within this time.
    pub ready_timeout: Duration,
    /// The volume's cgroup (its state key), and its memory limit.
    pub group: &'a str,
    pub memory_limit: Option<u64>,
    /// The host mounts the filesystem and runs the program unprivileged; `None`: the program
    /// mounts it itself, with the daemon's privileges.
    pub host_mount: Option<HostFuse<'a>>,
    /// The host's own lazy FUSE server: its control socket, and what the host tells it first.
    pub control: Option<Control<'a>>,
    /// Start it in a mount namespace of its own ([`super::confine`]); `None`: in the daemon's
    /// (the host's own lazy server, or confinement turned off).
    pub confine: Option<Confinement<'a>>,
}

/// What a confined FUSE program's namespace holds of its volume ([`super::confine`]).
#[derive(Debug, Clone, Default)]
pub struct Confinement<'a> {
    /// The volume's own directories (cache, runtime, secret files), writable at their paths;
    /// one that does not exist is left out.
    pub writable: Vec<&'a Path>,
    /// What its rule set says it reads by itself: never in the namespace.
    pub hidden: &'a [PathBuf],
}

/// The control socket of the host's own FUSE server (a lazy volume's, `mounthost lazyfs`):
/// bound in `dir` (the volume's runtime directory) as `name` before the program starts and
/// handed to it as descriptor [`crate::unpriv::lazy_wire::CONTROL_FD`]; once its mount answers,
/// the executor connects and runs `opening` on the connection (the file table and the layers'
/// descriptors, answered by the server's readiness), within the spawn's ready timeout.
#[derive(Clone, Copy)]
pub struct Control<'a> {
    /// The directory the socket is bound in.
    pub dir: &'a Path,
    /// The socket's name.
    pub name: &'a str,
    /// The host's opening of the conversation; an error fails the spawn.
    pub opening: &'a (dyn Fn(&std::os::unix::net::UnixStream) -> io::Result<()> + Sync),
}

impl std::fmt::Debug for Control<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control").field("dir", &self.dir).field("name", &self.name).finish_non_exhaustive()
    }
}

/// A FUSE connection the host opens and mounts itself before it starts the program (WIT
/// `fuse-mount.host-fd`): `/dev/fuse` is opened, mounted at [`Fuse::mountpoint`] with type
/// [`Fuse::fstype`] and the options `fd=N,rootmode=40000,user_id=<uid>,group_id=<gid>,
/// allow_other` plus [`HostFuse::options`] (those that are mount flags, `noexec` and the atime
/// ones, as flags; flags `nosuid`, `nodev`, and `ro` when asked), and
/// the program gets it as descriptor [`crate::plan::FUSE_FD`], runs as `uid`/`gid` without
/// supplementary groups or a way to regain privileges (`no_new_privs`), with no other
/// descriptor than stdin, stdout and stderr.
#[derive(Debug, Clone)]
pub struct HostFuse<'a> {
    /// The source the mount table shows.
    pub source: &'a str,
    /// Extra FUSE mount options (checked by the policy).
    pub options: &'a [String],
    /// Mount read-only.
    pub readonly: bool,
    /// The user the program runs as (the volume's own FUSE id).
    pub uid: u32,
    /// Its group.
    pub gid: u32,
}

/// A FUSE program did not become ready.
#[derive(Debug, thiserror::Error)]
pub enum FuseError {
    /// It could not be started.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// It exited before its mount appeared.
    #[error("{program} exited before mounting {}{oom}; its log says: {log_tail}", mountpoint.display())]
    Exited { program: PathBuf, mountpoint: PathBuf, oom: String, log_tail: String },
    /// Its mount did not appear in time (it was stopped).
    #[error("{program} did not mount {} within {timeout:?}; its log says: {log_tail}", mountpoint.display())]
    Timeout { program: PathBuf, mountpoint: PathBuf, timeout: Duration, log_tail: String },
    /// The mount table could not be read.
    #[error("reading the mount table: {0}")]
    Io(#[from] io::Error),
    /// Its cgroup could not be prepared (kind `Unsupported`: the node lacks the controller).
    #[error("preparing the volume's cgroup: {0}")]
    Cgroup(io::Error),
    /// Its mount namespace could not be made or entered (kind `Unsupported`: the node cannot
    /// give it one, such as a kernel before 5.12 or a mount point on a mount that is not shared).
    #[error("confining {program} to a mount namespace of its own: {source}{log}")]
    Confine { program: PathBuf, source: io::Error, log: String },
    /// It mounted something other than its planned mount point: the mount stayed in its own
    /// namespace and it was stopped.
    #[error(
        "{program} mounted {fstype} at {} besides its mount point {}: a plan's program mounts only at its planned mount point, so nothing of that mount reached the node and the program was stopped (check the plan's arguments); its log says: {log_tail}",
        elsewhere.display(),
        mountpoint.display()
    )]
    MountedElsewhere { program: PathBuf, mountpoint: PathBuf, elsewhere: PathBuf, fstype: String, log_tail: String },
    /// It exited at once on the connection the host mounted, saying it cannot use it (a
    /// program linked with libfuse 2, or one that mounts through `fusermount`).
    #[error(
        "{program} cannot take the FUSE connection the host mounted (fuse-mount.host-fd): it exited saying {log_tail:?}; a program that reads /dev/fd/N as a mount point or opens /dev/fuse itself cannot (those linked with libfuse 2, such as Debian 12's s3fs and bindfs, which `ldd {program}` shows, and those that run fusermount, such as rclone 1.60's mount): plan fuse-mount.by-program for it, or install a build that takes /dev/fd/N (libfuse 3)"
    )]
    NoHostFd { program: PathBuf, log_tail: String },
}

/// Is the mount point `point` at, above or below one of `paths`?
pub fn touches(point: &Path, paths: &[&Path]) -> bool {
    paths.iter().any(|p| p.starts_with(point) || point.starts_with(p))
}

/// When the node booted, so records of an earlier boot can be told apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Boot {
    /// `/proc/sys/kernel/random/boot_id`.
    pub id: String,
    /// When this boot began.
    pub started: SystemTime,
}

/// A future that resolves once a watched process has exited.
pub type Exit = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Files and directories below the host's anchors (kubelet's directory and the state
/// directory), resolved without following any symbolic link ([`super::beneath`]).
pub trait Files {
    /// Create `path` (mode `mode`) and any missing directories between `below` and it;
    /// `below` must exist. An existing directory is fine.
    fn mkdir(&self, path: &Path, below: &Path, mode: u32) -> io::Result<()>;
    /// Create `path` (and missing parents below its anchor) with mode 0700, and tighten an
    /// existing one to 0700.
    fn private_dir(&self, path: &Path) -> io::Result<()>;
    /// Remove a directory tree (links are removed, never followed; a mount point inside stops
    /// it with an error); a missing one is fine.
    fn remove_tree(&self, path: &Path) -> io::Result<()>;
    /// Remove a file, link or empty directory; a missing one is fine.
    fn remove_entry(&self, path: &Path) -> io::Result<()>;
    /// Replace a file atomically with mode `mode`, without fsync (state files: a spare swapped
    /// in with `RENAME_EXCHANGE`, see `exec::beneath` and `volume::state`).
    fn write_file(&self, path: &Path, bytes: &[u8], mode: u32) -> io::Result<()>;
    /// Replace a file holding secrets atomically with mode `mode`: a fresh file, fsync'd, renamed
    /// over it, and no spare, so nothing of an earlier content (a rotated credential) stays
    /// under another name.
    fn write_secret_file(&self, path: &Path, bytes: &[u8], mode: u32) -> io::Result<()>;
    /// A file's content, or `None` if it does not exist.
    fn read_file(&self, path: &Path) -> io::Result<Option<Vec<u8>>>;
    /// A directory's entries, sorted by name (empty if it does not exist).
    fn list_dir(&self, path: &Path) -> io::Result<Vec<Entry>>;
    /// When a file was last modified.
    fn modified(&self, path: &Path) -> io::Result<SystemTime>;
    /// Give `path` (not following a link at its end) to `uid`:`gid`, with mode `mode`.
    fn set_owner(&self, path: &Path, uid: u32, gid: u32, mode: u32) -> io::Result<()>;
    /// Does `path` exist (not following a link at its end; a link on the way is an error)?
    fn exists(&self, path: &Path) -> io::Result<bool>;
}

/// Mounts: the table as the kernel shows it, and changes to it.
pub trait Mounts {
    /// The mount table as the kernel shows it now.
    fn mounts(&self) -> io::Result<Vec<MountEntry>>;
    /// The entries of the mount table at, above or below any of `paths` (what an operation on
    /// those paths can see or change), read once.
    fn mounts_touching(&self, paths: &[&Path]) -> io::Result<Vec<MountEntry>> {
        Ok(self.mounts()?.into_iter().filter(|m| touches(&m.mount_point, paths)).collect())
    }
    /// mount(2) of a filesystem onto `target`; a `source` starting with `/` is a path below
    /// the anchors.
    fn mount(
        &self,
        fstype: &str,
        source: &str,
        target: &Path,
        options: &[MountOption],
        readonly: bool,
    ) -> Result<(), MountError>;
    /// A bind mount, read-only when asked, with per-mount flags (`nosuid`, ...).
    fn bind(&self, source: &Path, target: &Path, readonly: bool, flags: &[String]) -> Result<(), MountError>;
    /// Unmount the top mount at `target`, lazily (`MNT_DETACH`) when asked.
    fn unmount(&self, target: &Path, lazy: bool) -> Result<(), MountError>;
    /// statvfs(2) of a mounted path.
    fn usage(&self, path: &Path) -> io::Result<Usage>;
}

/// Long-lived programs (FUSE servers).
pub trait Processes {
    /// Start a FUSE program and wait until its mount appears (then a stat of it works); with
    /// [`Fuse::host_mount`], mount its connection first. On failure nothing is left running,
    /// and nothing the host mounted is left mounted.
    fn spawn_fuse(&self, fuse: &Fuse<'_>) -> Result<ProcessId, FuseError>;
    /// Is it still the same live process?
    fn is_alive(&self, id: &ProcessId) -> bool;
    /// SIGTERM, up to `grace`, SIGKILL, reap.
    fn stop(&self, id: &ProcessId, grace: Duration) -> Result<Stopped, ProcessError>;
    /// The binary a live process runs (for re-adoption: same pid, start time and program).
    fn executable(&self, id: &ProcessId) -> Option<PathBuf>;
    /// Whether `id` runs `executable`: its binary by that path, or by that path made canonical
    /// (a confined program runs its binary by its canonical path, `super::confine`). `None`
    /// if it is gone.
    fn runs(&self, id: &ProcessId, executable: &Path) -> Option<bool> {
        let running = self.executable(id)?;
        Some(running == executable || std::fs::canonicalize(executable).is_ok_and(|c| c == running))
    }
    /// Reap every exited child of the daemon; returns how many.
    fn reap(&self) -> usize;
    /// A future that resolves once `id` exits (a pidfd on Linux). Errors if it is gone.
    fn watch(&self, id: &ProcessId) -> io::Result<Exit>;
    /// Every user and group id some live process has (real, effective, saved or filesystem).
    fn ids_in_use(&self) -> io::Result<std::collections::BTreeSet<u32>>;
    /// Register `files` as passthrough backing files on the FUSE connection of the host's own
    /// lazy server `server`; their backing ids, in order ([`super::lazy::backing_open`]).
    fn backing_open(&self, server: &ProcessId, files: &[&std::fs::File]) -> io::Result<Vec<u32>>;
}

/// Per-volume cgroups.
pub trait Groups {
    /// Kill whatever is left in a volume's cgroup and remove it; a missing one is fine.
    /// Returns how many processes had to be killed.
    fn release_group(&self, group: &str) -> io::Result<usize>;
    /// The volumes' cgroups that exist.
    fn groups(&self) -> io::Result<Vec<String>>;
    /// How often the OOM killer struck in a volume's cgroup.
    fn oom_kills(&self, group: &str) -> Option<u64>;
    /// Put every process of a volume's cgroup into the group of the same name in every other
    /// hierarchy it spans (cgroup v1: what a process an earlier daemon started may lack);
    /// returns how many memberships changed.
    fn settle_group(&self, group: &str) -> io::Result<usize>;
}

/// What a directory entry is, and which inode (to tell a file the host made from one put in
/// its place).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
    pub kind: FileKind,
}

/// The kind of a directory entry (a link is never followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Directory,
    Socket,
    Link,
    Other,
}

/// Everything the host daemon does to the node: [`Files`], [`Mounts`], [`Processes`],
/// [`Groups`], the boot it runs in and the sockets it serves. [`super::Linux`] performs it
/// with real syscalls; [`super::recording::Recording`] records it against a simulated node.
pub trait Executor: Files + Mounts + Processes + Groups + Send + Sync + 'static {
    /// This boot.
    fn boot(&self) -> io::Result<Boot>;
    /// Listen on a unix socket (0600, or 0660 in `group`; a stale socket file is replaced, a
    /// live one refused).
    fn listen(&self, path: &Path, group: Option<u32>) -> io::Result<tokio::net::UnixListener>;
    /// Listen on a unix socket named `name` in the directory `dir` (below the anchors, resolved
    /// without following links), bound through `/proc/self/fd/N/name` so the directory's path
    /// may be longer than `sun_path` allows, then given mode `mode`. Whatever had the name
    /// (a stale socket, a file or link a pod put there, a directory tree) is removed first,
    /// never followed. Returns the listener and the socket's identity.
    fn listen_in(&self, dir: &Path, name: &str, mode: u32) -> io::Result<(std::os::unix::net::UnixListener, FileId)>;
    /// What `path` is (not following a link at its end), or `None` if nothing has the name.
    fn file_id(&self, path: &Path) -> io::Result<Option<FileId>>;
    /// Connect to the unix socket at `path` (below the anchors, resolved without following a
    /// link, refused unless it is a socket), through `/proc/self/fd/N` of the socket itself, so
    /// a program that put a link or another file there is never followed and the path may be
    /// longer than `sun_path` allows.
    fn connect(&self, path: &Path) -> io::Result<std::os::unix::net::UnixStream>;
    /// Make the mount at `target` shared (in a peer group of its own if it was private), so
    /// mounts made below it later also appear in the copies containers hold of it.
    fn share(&self, target: &Path) -> Result<(), MountError>;
    /// Are read-only binds read-only from the moment they are attached (the new mount API with
    /// `mount_setattr`, Linux 5.12)? Older kernels attach read-write and remount, and a copy a
    /// shared parent propagated meanwhile (a container's) stays writable.
    fn atomic_read_only_binds(&self) -> bool;
}
