//! The [`Executor`] trait: every effect the node pipeline has on the machine, behind one
//! interface. [`Linux`] performs them with real syscalls; [`super::recording::Recording`]
//! records them against a simulated mount table for unit tests.
//!
//! Methods are blocking (a hung FUSE server can block a syscall); the pipeline calls them from
//! a blocking thread.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::cgroup::Cgroups;
use super::mount::{self, MountError};
use super::mountinfo::{self, MountEntry};
use super::process::{self, ProcessError, ProcessId, Spec, Stopped};

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
}

/// A FUSE program did not become ready.
#[derive(Debug, thiserror::Error)]
pub enum FuseError {
    /// It could not be started.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// It exited before its mount appeared.
    #[error("{program} exited before mounting {}{oom}; its log ends with: {log_tail}", mountpoint.display())]
    Exited { program: PathBuf, mountpoint: PathBuf, oom: String, log_tail: String },
    /// Its mount did not appear in time (it was stopped).
    #[error("{program} did not mount {} within {timeout:?}; its log ends with: {log_tail}", mountpoint.display())]
    Timeout { program: PathBuf, mountpoint: PathBuf, timeout: Duration, log_tail: String },
    /// The mount table could not be read.
    #[error("reading the mount table: {0}")]
    Io(#[from] io::Error),
    /// Its cgroup could not be prepared (kind `Unsupported`: the node lacks the controller).
    #[error("preparing the volume's cgroup: {0}")]
    Cgroup(io::Error),
}

/// Everything the node pipeline does to the machine.
pub trait Executor: Send + Sync + 'static {
    /// The mount table as the kernel shows it now.
    fn mounts(&self) -> io::Result<Vec<MountEntry>>;
    /// Create a directory and its parents (mode 0750); an existing one is fine.
    fn mkdir(&self, path: &Path) -> io::Result<()>;
    /// Remove a directory tree; a missing one is fine. Never crosses into a mount (the caller
    /// checks there is none below).
    fn remove_tree(&self, path: &Path) -> io::Result<()>;
    /// Remove an empty directory or a file; a missing one is fine.
    fn remove_entry(&self, path: &Path) -> io::Result<()>;
    /// mount(2).
    fn mount(
        &self,
        fstype: &str,
        source: &str,
        target: &Path,
        options: &[String],
        readonly: bool,
    ) -> Result<(), MountError>;
    /// A bind mount, read-only when asked, with per-mount flags (`nosuid`, ...).
    fn bind(&self, source: &Path, target: &Path, readonly: bool, flags: &[String]) -> Result<(), MountError>;
    /// umount2(2), lazily (`MNT_DETACH`) when asked.
    fn unmount(&self, target: &Path, lazy: bool) -> Result<(), MountError>;
    /// Start a FUSE program and wait until its mount appears (then a stat of it works). On
    /// failure nothing is left running.
    fn spawn_fuse(&self, fuse: &Fuse<'_>) -> Result<ProcessId, FuseError>;
    /// Is it still the same live process?
    fn is_alive(&self, id: &ProcessId) -> bool;
    /// SIGTERM, up to `grace`, SIGKILL, reap.
    fn stop(&self, id: &ProcessId, grace: Duration) -> Result<Stopped, ProcessError>;
    /// The binary a live process runs (for re-adoption: same pid, start time and program).
    fn executable(&self, id: &ProcessId) -> Option<PathBuf>;
    /// Kill whatever is left in a volume's cgroup and remove it; a missing one is fine.
    /// Returns how many processes had to be killed.
    fn release_group(&self, group: &str) -> io::Result<usize>;
    /// The volumes' cgroups that exist.
    fn groups(&self) -> io::Result<Vec<String>>;
    /// How often the OOM killer struck in a volume's cgroup.
    fn oom_kills(&self, group: &str) -> Option<u64>;
    /// statvfs(2) of a mounted path.
    fn usage(&self, path: &Path) -> io::Result<Usage>;
}

/// The real thing.
#[derive(Debug, Clone)]
pub struct Linux {
    cgroups: Cgroups,
}

impl Linux {
    /// FUSE processes go into groups below `cgroups`' parent.
    pub fn new(cgroups: Cgroups) -> Self {
        Linux { cgroups }
    }
}

impl Executor for Linux {
    fn mounts(&self) -> io::Result<Vec<MountEntry>> {
        mountinfo::read()
    }

    fn mkdir(&self, path: &Path) -> io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().recursive(true).mode(0o750).create(path)
    }

    fn remove_tree(&self, path: &Path) -> io::Result<()> {
        match std::fs::remove_dir_all(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    fn remove_entry(&self, path: &Path) -> io::Result<()> {
        let meta = match std::fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let result = if meta.is_dir() { std::fs::remove_dir(path) } else { std::fs::remove_file(path) };
        match result {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    fn mount(
        &self,
        fstype: &str,
        source: &str,
        target: &Path,
        options: &[String],
        readonly: bool,
    ) -> Result<(), MountError> {
        mount::mount(fstype, source, target, options, readonly)
    }

    fn bind(&self, source: &Path, target: &Path, readonly: bool, flags: &[String]) -> Result<(), MountError> {
        let flags = flags.iter().filter_map(|f| mount::bind_flag(f)).fold(nix::mount::MsFlags::empty(), |a, f| a | f);
        mount::bind(source, target, readonly, flags)
    }

    fn unmount(&self, target: &Path, lazy: bool) -> Result<(), MountError> {
        mount::unmount(target, lazy)
    }

    fn spawn_fuse(&self, fuse: &Fuse<'_>) -> Result<ProcessId, FuseError> {
        let group = self.cgroups.prepare(fuse.group, fuse.memory_limit).map_err(FuseError::Cgroup)?;
        let id = process::spawn(&fuse.spec, group.as_ref());
        drop(group);
        let id = match id {
            Ok(id) => id,
            Err(e) => {
                let _ = self.cgroups.release(fuse.group);
                return Err(e.into());
            }
        };
        let started = Instant::now();
        let program = fuse.spec.executable.to_path_buf();
        let mountpoint = fuse.mountpoint.to_path_buf();
        loop {
            let mounts = self.mounts()?;
            if mountinfo::at(&mounts, fuse.mountpoint).is_some_and(|m| m.fstype == fuse.fstype)
                && std::fs::metadata(fuse.mountpoint).is_ok()
            {
                return Ok(id);
            }
            if !process::is_alive(&id) {
                let _ = process::stop(&id, Duration::ZERO);
                let oom = match (self.cgroups.oom_kills(fuse.group), fuse.memory_limit) {
                    (Some(n), Some(limit)) if n > 0 => {
                        format!(" (killed by the OOM killer at its memory limit of {limit} bytes)")
                    }
                    _ => String::new(),
                };
                let _ = self.cgroups.release(fuse.group);
                return Err(FuseError::Exited { program, mountpoint, oom, log_tail: log_tail(fuse.spec.log) });
            }
            if started.elapsed() >= fuse.ready_timeout {
                let _ = process::stop(&id, Duration::from_secs(2));
                let _ = self.cgroups.release(fuse.group);
                return Err(FuseError::Timeout {
                    program,
                    mountpoint,
                    timeout: fuse.ready_timeout,
                    log_tail: log_tail(fuse.spec.log),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn is_alive(&self, id: &ProcessId) -> bool {
        process::is_alive(id)
    }

    fn stop(&self, id: &ProcessId, grace: Duration) -> Result<Stopped, ProcessError> {
        process::stop(id, grace)
    }

    fn executable(&self, id: &ProcessId) -> Option<PathBuf> {
        process::executable(id)
    }

    fn release_group(&self, group: &str) -> io::Result<usize> {
        self.cgroups.release(group)
    }

    fn groups(&self) -> io::Result<Vec<String>> {
        self.cgroups.groups()
    }

    fn oom_kills(&self, group: &str) -> Option<u64> {
        self.cgroups.oom_kills(group)
    }

    fn usage(&self, path: &Path) -> io::Result<Usage> {
        let s = nix::sys::statvfs::statvfs(path).map_err(io::Error::from)?;
        let frsize = s.fragment_size() as u64;
        let total = s.blocks() as u64 * frsize;
        let free = s.blocks_free() as u64 * frsize;
        let avail = s.blocks_available() as u64 * frsize;
        let (files, ffree) = (s.files() as u64, s.files_free() as u64);
        Ok(Usage {
            total_bytes: total,
            available_bytes: avail,
            used_bytes: total.saturating_sub(free),
            total_inodes: files,
            free_inodes: ffree,
            used_inodes: files.saturating_sub(ffree),
        })
    }
}

/// What the end of a log (its last 64 KiB) says went wrong, for error messages: see
/// [`super::fuse_log::summary`]. The caller scrubs secrets.
pub fn log_tail(path: &Path) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else { return "(no log)".into() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(super::fuse_log::TAIL_BYTES);
    let _ = f.seek(SeekFrom::Start(start));
    let mut buf = Vec::new();
    let _ = f.take(super::fuse_log::TAIL_BYTES).read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    // A tail that starts mid-file starts mid-line: drop that fragment.
    let text = if start > 0 { text.split_once('\n').map_or("", |(_, rest)| rest) } else { &text };
    super::fuse_log::summary(text)
}
