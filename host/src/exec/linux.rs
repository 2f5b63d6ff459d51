//! [`Linux`]: the [`Executor`] that acts on the real node. Every path below the anchors goes
//! through [`Anchors`] (symlink-proof), every mount through [`super::mount`], every process
//! through [`super::process`], every cgroup through [`Cgroups`].

use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant, SystemTime};

use rustix::fs::{Mode, OFlags};

use super::beneath::{Anchors, Entry};
use super::cgroup::Cgroups;
use super::confine;
use super::executor::{
    Boot, Executor, Exit, FileId, FileKind, Files, Fuse, FuseError, Groups, HostFuse, Mounts, Processes, Usage,
};
use super::fuse_log;
use super::mount::{self, Api, MountError, Opt};
use super::mountinfo::{self, MountEntry};
use super::process::{self, ProcessError, ProcessId, Stopped};
use crate::plan::MountOption;

/// The real thing.
#[derive(Debug, Clone)]
pub struct Linux {
    cgroups: Cgroups,
    anchors: Anchors,
    api: Api,
    /// The largest file an unprivileged FUSE program may write (see [`process::Unprivileged`]).
    max_file_bytes: Option<u64>,
}

impl Linux {
    /// FUSE processes go into groups below `cgroups`' parent; every path must lie below one
    /// of `anchors` (absolute and canonical: kubelet's directory and the state directory).
    pub fn new(cgroups: Cgroups, anchors: impl IntoIterator<Item = PathBuf>) -> Self {
        Linux { cgroups, anchors: Anchors::new(anchors), api: Api::New, max_file_bytes: None }
    }

    /// Cap the size of every file an unprivileged FUSE program writes (its RLIMIT_FSIZE).
    pub fn with_max_file_bytes(mut self, bytes: Option<u64>) -> Self {
        self.max_file_bytes = bytes;
        self
    }

    /// Use only what kernels before 5.2 (mount API) and 5.6 (`openat2`) offer, as a node with
    /// such a kernel would (for tests of the fallbacks).
    pub fn legacy(mut self) -> Self {
        self.anchors = self.anchors.with_walk();
        self.api = Api::Legacy;
        self
    }

    /// Make a root directory the daemon works below (kubelet's directory; the FUSE files
    /// directory under `/run/mounthost`) and its parents, if missing; its canonical path, to be
    /// an anchor.
    pub fn make_root(dir: &Path) -> io::Result<PathBuf> {
        std::fs::create_dir_all(dir)?;
        std::fs::canonicalize(dir)
    }

    /// Make a root directory (kubelet's, the state directory) a shared mount if it is on none
    /// ([`confine::share_anchor`]), so that a confined program's mount at a staging or target
    /// path below it reaches the node.
    pub fn share_root(dir: &Path) -> io::Result<confine::Shared> {
        confine::share_anchor(dir)
    }

    /// Remove the bind [`Linux::share_root`] made of `dir`, unless anything is mounted below it
    /// (a volume, the runtime tmpfs): then it stays for the next start. Detached rather than
    /// unmounted, because the daemon still holds its state lock open through it; the bind is
    /// of `dir` onto itself, so the lock and the files are the same without it.
    pub fn release_root(dir: &Path) -> io::Result<()> {
        let dir = &std::fs::canonicalize(dir)?;
        let below = super::mountinfo::read_where(|p| p != dir && p.starts_with(dir))?;
        if let Some(m) = below.first() {
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                format!("{} is mounted below it", m.mount_point.display()),
            ));
        }
        Ok(rustix::mount::unmount(dir, rustix::mount::UnmountFlags::NOFOLLOW | rustix::mount::UnmountFlags::DETACH)?)
    }

    /// At the daemon's exit: its cgroup parent goes from every hierarchy where no volume's group
    /// is left in it ([`Cgroups::remove_parent`]).
    pub fn remove_unused_cgroups(&self) {
        self.cgroups.remove_parent();
    }

    /// Remove such a root if it is unused: `rmdir` refuses one that holds entries or a mount.
    pub fn remove_unused_root(dir: &Path) -> io::Result<()> {
        std::fs::remove_dir(dir)
    }
}

impl Files for Linux {
    fn mkdir(&self, path: &Path, below: &Path, mode: u32) -> io::Result<()> {
        self.anchors.mkdir(path, below, mode)
    }

    fn private_dir(&self, path: &Path) -> io::Result<()> {
        self.anchors.private_dir(path)
    }

    fn remove_tree(&self, path: &Path) -> io::Result<()> {
        self.anchors.remove_tree(path)
    }

    fn remove_entry(&self, path: &Path) -> io::Result<()> {
        self.anchors.remove_entry(path)
    }

    fn write_file(&self, path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
        self.anchors.write_atomic(path, bytes, mode, false)
    }

    fn write_secret_file(&self, path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
        self.anchors.write_atomic(path, bytes, mode, true)
    }

    fn read_file(&self, path: &Path) -> io::Result<Option<Vec<u8>>> {
        self.anchors.read(path)
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<Entry>> {
        self.anchors.list(path)
    }

    fn modified(&self, path: &Path) -> io::Result<SystemTime> {
        self.anchors.modified(path)
    }

    fn set_owner(&self, path: &Path, uid: u32, gid: u32, mode: u32) -> io::Result<()> {
        let fd = self.anchors.open(path, OFlags::PATH)?;
        // Config refuses -1 (which would mean "unchanged").
        let (uid, gid) = (rustix::fs::Uid::from_raw(uid), rustix::fs::Gid::from_raw(gid));
        rustix::fs::chownat(&fd, "", Some(uid), Some(gid), rustix::fs::AtFlags::EMPTY_PATH)?;
        // A path descriptor takes no fchmod; its /proc/self/fd entry names the same inode (the
        // descriptor is never a link: the anchors refuse them).
        rustix::fs::chmod(mount::fd_path(&fd).as_str(), Mode::from_raw_mode(mode))?;
        Ok(())
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        match self.anchors.open(path, OFlags::PATH) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
}

impl Mounts for Linux {
    fn mounts(&self) -> io::Result<Vec<MountEntry>> {
        mountinfo::read()
    }

    fn mounts_touching(&self, paths: &[&Path]) -> io::Result<Vec<MountEntry>> {
        mountinfo::read_where(|point| super::executor::touches(point, paths))
    }

    fn mount(
        &self,
        fstype: &str,
        source: &str,
        target: &Path,
        options: &[MountOption],
        readonly: bool,
    ) -> Result<(), MountError> {
        let options: Vec<Opt<'_>> = options
            .iter()
            .map(|o| match o {
                MountOption::Text(t) => Opt::Text(t),
                MountOption::Path { prefix, path } => Opt::Path { prefix, path },
            })
            .collect();
        mount::mount(&self.anchors, fstype, source, target, &options, readonly)
    }

    fn bind(&self, source: &Path, target: &Path, readonly: bool, flags: &[String]) -> Result<(), MountError> {
        mount::bind(&self.anchors, self.api, source, target, readonly, flags)
    }

    fn unmount(&self, target: &Path, lazy: bool) -> Result<(), MountError> {
        mount::unmount(&self.anchors, target, lazy)
    }

    fn usage(&self, path: &Path) -> io::Result<Usage> {
        let fd = self.anchors.open(path, OFlags::PATH)?;
        let s = rustix::fs::fstatvfs(&fd)?;
        let frsize = s.f_frsize;
        let total = s.f_blocks * frsize;
        let free = s.f_bfree * frsize;
        let avail = s.f_bavail * frsize;
        Ok(Usage {
            total_bytes: total,
            available_bytes: avail,
            used_bytes: total.saturating_sub(free),
            total_inodes: s.f_files,
            free_inodes: s.f_ffree,
            used_inodes: s.f_files.saturating_sub(s.f_ffree),
        })
    }
}

impl Processes for Linux {
    fn spawn_fuse(&self, fuse: &Fuse<'_>) -> Result<ProcessId, FuseError> {
        if let Some(host) = &fuse.host_mount {
            return self.spawn_host_mounted(fuse, host);
        }
        let log_error = |source| FuseError::Process(ProcessError::Log { path: fuse.spec.log.to_path_buf(), source });
        let log = self.anchors.append(fuse.spec.log, 0o600).map_err(log_error)?;
        // Kept to read the log's tail on failure, through the descriptor, never by name.
        let reader = log.try_clone().map_err(log_error)?;
        let jail = self.jail(fuse, Some(fuse.mountpoint), 0, 0)?;
        // What the node has mounted in the mount point's directory now: whatever appears there
        // besides the mount point while the program starts is the program's (its namespace shares
        // that directory with the node until it is ready).
        let beside = fuse.mountpoint.parent().unwrap_or(fuse.mountpoint);
        let before: std::collections::BTreeSet<PathBuf> = self
            .mounts_touching(&[beside])?
            .into_iter()
            .map(|m| m.mount_point)
            .filter(|p| p.starts_with(beside))
            .collect();
        let group = self.cgroups.prepare(fuse.group, fuse.memory_limit).map_err(FuseError::Cgroup)?;
        let id = process::spawn_as(&fuse.spec, log, group.as_ref(), None, jail.as_ref());
        drop(group);
        let confined = jail.is_some();
        // The namespace holds what it attached; what the daemon held of it goes.
        drop(jail);
        let id = id.map_err(|e| confine_error(confined, e, &reader));
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
        // Mounts that reached the node from the program's namespace besides its mount point, and
        // whatever is below the mount point: detached, deepest first.
        let clean_up = || {
            if !confined {
                return;
            }
            let mut new: Vec<PathBuf> = self
                .mounts_touching(&[beside])
                .unwrap_or_default()
                .into_iter()
                .map(|m| m.mount_point)
                .filter(|p| p.starts_with(beside) && !before.contains(p) && !p.starts_with(fuse.mountpoint))
                .collect();
            new.sort();
            for p in new.iter().rev() {
                let _ = mount::unmount(&self.anchors, p, true);
            }
        };
        // A mount of the program's elsewhere, seen in two rounds in a row (a mount of the node's
        // that was being unmounted while the tables were read is gone by the second).
        let mut suspect: Option<MountEntry> = None;
        let elsewhere = |suspect: &mut Option<MountEntry>| -> Option<MountEntry> {
            if !confined {
                return None;
            }
            let seen = self.mounted_elsewhere(&id, fuse.mountpoint);
            let confirmed = matches!((&seen, &*suspect), (Some(m), Some(s)) if m.mount_point == s.mount_point && m.device == s.device);
            *suspect = seen;
            if confirmed { suspect.take() } else { None }
        };
        let failed = |e: FuseError| {
            let _ = process::stop(&id, Duration::from_secs(2));
            clean_up();
            let _ = mount::unmount(&self.anchors, fuse.mountpoint, true);
            let _ = self.cgroups.release(fuse.group);
            e
        };
        let mounted_elsewhere = |m: MountEntry| {
            failed(FuseError::MountedElsewhere {
                program: program.clone(),
                mountpoint: mountpoint.clone(),
                elsewhere: m.mount_point,
                fstype: m.fstype,
                log_tail: fuse_log::tail_of(&reader),
            })
        };
        loop {
            if let Some(m) = elsewhere(&mut suspect) {
                return Err(mounted_elsewhere(m));
            }
            let mounts = self.mounts()?;
            // Ready: mounted with the planned fstype, and its root answers (a stat through a
            // descriptor resolved below the anchor).
            if mountinfo::at(&mounts, fuse.mountpoint).is_some_and(|m| m.fstype == fuse.fstype)
                && self.anchors.open(fuse.mountpoint, OFlags::PATH).and_then(|fd| Ok(rustix::fs::fstat(&fd)?)).is_ok()
            {
                if confined {
                    // From now on nothing the program mounts beside its mount point reaches the
                    // node; what it mounted there until now is seen once more, and fails it.
                    if let Err(e) = confine::seal(id.pid, beside) {
                        return Err(failed(FuseError::Confine {
                            program: program.clone(),
                            source: io::Error::new(e.kind(), format!("sealing its mount point's directory: {e}")),
                            log: String::new(),
                        }));
                    }
                    if let Some(m) = self.mounted_elsewhere(&id, fuse.mountpoint) {
                        return Err(mounted_elsewhere(m));
                    }
                }
                return Ok(id);
            }
            if !process::is_alive(&id) {
                let _ = process::stop(&id, Duration::ZERO);
                clean_up();
                let oom = match (self.cgroups.oom_kills(fuse.group), fuse.memory_limit) {
                    (Some(n), Some(limit)) if n > 0 => {
                        format!(" (killed by the OOM killer at its memory limit of {limit} bytes)")
                    }
                    _ => String::new(),
                };
                let _ = self.cgroups.release(fuse.group);
                return Err(FuseError::Exited { program, mountpoint, oom, log_tail: fuse_log::tail_of(&reader) });
            }
            if started.elapsed() >= fuse.ready_timeout {
                let _ = process::stop(&id, Duration::from_secs(2));
                clean_up();
                let _ = self.cgroups.release(fuse.group);
                return Err(FuseError::Timeout {
                    program,
                    mountpoint,
                    timeout: fuse.ready_timeout,
                    log_tail: fuse_log::tail_of(&reader),
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

    fn reap(&self) -> usize {
        process::reap_exited_children()
    }

    fn watch(&self, id: &ProcessId) -> io::Result<Exit> {
        Ok(Box::pin(process::exited(id)?))
    }

    fn ids_in_use(&self) -> io::Result<std::collections::BTreeSet<u32>> {
        process::ids_in_use()
    }

    fn backing_open(&self, server: &ProcessId, files: &[&std::fs::File]) -> io::Result<Vec<u32>> {
        super::lazy::backing_open(server, files)
    }
}

impl Linux {
    /// [`Processes::spawn_fuse`] of a connection the host mounts ([`HostFuse`]): open
    /// `/dev/fuse`, mount it, start the program unprivileged with it, close the daemon's copy
    /// (so the connection dies with the program), and wait until the mount's root answers a
    /// stat. Before the program answers the kernel's INIT that stat blocks, so it runs on a
    /// thread of its own; a program that exits or misses its deadline is stopped, which ends
    /// the connection and the stat with it. On failure the mount is detached.
    fn spawn_host_mounted(&self, fuse: &Fuse<'_>, host: &HostFuse<'_>) -> Result<ProcessId, FuseError> {
        let log_error = |source| FuseError::Process(ProcessError::Log { path: fuse.spec.log.to_path_buf(), source });
        let log = self.anchors.append(fuse.spec.log, 0o600).map_err(log_error)?;
        let reader = log.try_clone().map_err(log_error)?;
        let program = fuse.spec.executable.to_path_buf();
        let mountpoint = fuse.mountpoint.to_path_buf();
        let dev = rustix::fs::open("/dev/fuse", OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| FuseError::Io(io::Error::new(io::Error::from(e).kind(), format!("opening /dev/fuse: {e}"))))?;
        mount::mount_fuse(
            &self.anchors,
            &dev,
            fuse.fstype,
            host.source,
            fuse.mountpoint,
            host.uid,
            host.gid,
            host.options,
            host.readonly,
        )
        .map_err(|e| FuseError::Io(io::Error::other(e.to_string())))?;
        let detach = || {
            let _ = mount::unmount(&self.anchors, fuse.mountpoint, true);
        };
        let jail = match self.jail(fuse, None, host.uid, host.gid) {
            Ok(j) => j,
            Err(e) => {
                detach();
                return Err(e);
            }
        };
        let group = match self.cgroups.prepare(fuse.group, fuse.memory_limit) {
            Ok(g) => g,
            Err(e) => {
                detach();
                return Err(FuseError::Cgroup(e));
            }
        };
        // The control socket of the host's own server: bound now, so the host can connect as
        // soon as the program runs, and handed over blocking (the program accepts on it).
        let control = match &fuse.control {
            Some(c) => match self.listen_in(c.dir, c.name, 0o600).and_then(|(l, _)| {
                l.set_nonblocking(false)?;
                Ok(l)
            }) {
                Ok(l) => Some(l),
                Err(e) => {
                    detach();
                    return Err(FuseError::Io(io::Error::new(
                        e.kind(),
                        format!("binding the control socket in {}: {e}", c.dir.display()),
                    )));
                }
            },
            None => None,
        };
        let unprivileged = process::Unprivileged {
            fuse: dev.as_fd(),
            uid: host.uid,
            gid: host.gid,
            max_file_bytes: self.max_file_bytes,
            control: control.as_ref().map(|l| l.as_fd()),
        };
        let id = process::spawn_as(&fuse.spec, log, group.as_ref(), Some(unprivileged), jail.as_ref());
        drop((group, dev, control, jail));
        let id = match id {
            Ok(id) => id,
            Err(e) => {
                detach();
                let _ = self.cgroups.release(fuse.group);
                return Err(confine_error(fuse.confine.is_some(), e, &reader));
            }
        };
        let (tx, answered) = std::sync::mpsc::channel();
        let anchors = self.anchors.clone();
        let probe = mountpoint.clone();
        std::thread::spawn(move || {
            let stat = anchors.open(&probe, OFlags::PATH).and_then(|fd| Ok(rustix::fs::fstat(&fd)?));
            let _ = tx.send(stat.is_ok());
        });
        let started = Instant::now();
        let fail = |stop_grace: Duration| {
            let _ = process::stop(&id, stop_grace);
            detach();
            let _ = self.cgroups.release(fuse.group);
        };
        let mut probing = true;
        loop {
            if probing {
                match answered.recv_timeout(Duration::from_millis(10)) {
                    Ok(true) if process::is_alive(&id) => match &fuse.control {
                        None => return Ok(id),
                        Some(c) => {
                            let left =
                                fuse.ready_timeout.saturating_sub(started.elapsed()).max(Duration::from_millis(100));
                            match self.open_control(c, left) {
                                Ok(()) => return Ok(id),
                                Err(e) => {
                                    fail(Duration::from_secs(2));
                                    return Err(FuseError::Io(io::Error::new(
                                        e.kind(),
                                        format!("{} did not take the host's opening: {e}", program.display()),
                                    )));
                                }
                            }
                        }
                    },
                    // Failed (the program died and took the connection with it): its exit is
                    // reported below.
                    Ok(_) | Err(RecvTimeoutError::Disconnected) => probing = false,
                    Err(RecvTimeoutError::Timeout) => {}
                }
            } else {
                std::thread::sleep(Duration::from_millis(10));
            }
            if !process::is_alive(&id) {
                fail(Duration::ZERO);
                let oom = match (self.cgroups.oom_kills(fuse.group), fuse.memory_limit) {
                    (Some(n), Some(limit)) if n > 0 => {
                        format!(" (killed by the OOM killer at its memory limit of {limit} bytes)")
                    }
                    _ => String::new(),
                };
                let log_tail = fuse_log::tail_of(&reader);
                // libfuse 2 takes /dev/fd/N for a mount point to mount on, and fails on it.
                if oom.is_empty() && cannot_take_fd(&log_tail) {
                    return Err(FuseError::NoHostFd { program, log_tail });
                }
                return Err(FuseError::Exited { program, mountpoint, oom, log_tail });
            }
            if started.elapsed() >= fuse.ready_timeout {
                fail(Duration::from_secs(2));
                return Err(FuseError::Timeout {
                    program,
                    mountpoint,
                    timeout: fuse.ready_timeout,
                    log_tail: fuse_log::tail_of(&reader),
                });
            }
        }
    }
}

impl Linux {
    /// Prepare `fuse`'s mount namespace when it is to be confined: its volume's directories,
    /// opened below the anchors, writable; the directory of `mount_point` (a program that
    /// mounts by itself) a peer of the node's; its `/tmp` and home owned by `uid`:`gid`.
    fn jail(
        &self,
        fuse: &Fuse<'_>,
        mount_point: Option<&Path>,
        uid: u32,
        gid: u32,
    ) -> Result<Option<confine::Prepared>, FuseError> {
        let Some(c) = &fuse.confine else { return Ok(None) };
        let failed = |source: io::Error| FuseError::Confine {
            program: fuse.spec.executable.to_path_buf(),
            source,
            log: String::new(),
        };
        let mut writable = Vec::new();
        for dir in &c.writable {
            match self.anchors.open(dir, OFlags::PATH | OFlags::DIRECTORY) {
                Ok(fd) => writable.push((*dir, fd)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(failed(io::Error::new(e.kind(), format!("{}: {e}", dir.display())))),
            }
        }
        let parent = mount_point.map(|p| p.parent().unwrap_or(p));
        let point = match parent {
            Some(p) => Some(
                self.anchors
                    .open(p, OFlags::PATH | OFlags::DIRECTORY)
                    .map_err(|e| failed(io::Error::new(e.kind(), format!("{}: {e}", p.display()))))?,
            ),
            None => None,
        };
        let jail = confine::Jail {
            mount_parent: parent.zip(point.as_ref()),
            writable: writable.iter().map(|(p, fd)| (*p, fd)).collect(),
            hidden: c.hidden,
            executable: fuse.spec.executable,
            uid,
            gid,
        };
        confine::Prepared::build(&jail).map(Some).map_err(failed)
    }

    /// A FUSE mount of `id`'s namespace other than at `mountpoint` that the node did not make
    /// ([`confine::elsewhere`]).
    fn mounted_elsewhere(&self, id: &ProcessId, mountpoint: &Path) -> Option<MountEntry> {
        let theirs = mountinfo::parse(&std::fs::read(format!("/proc/{}/mountinfo", id.pid)).ok()?).ok()?;
        let node = self.mounts().ok()?;
        confine::elsewhere(&theirs, &node, mountpoint)
    }
}

/// A spawn error, with what the child wrote about its namespace when it was to be confined.
fn confine_error(confined: bool, e: ProcessError, log: &std::fs::File) -> FuseError {
    match e {
        ProcessError::Spawn { path, source } if confined => {
            let tail = fuse_log::tail_of(log);
            let log = if tail.is_empty() { String::new() } else { format!("; its log says: {tail}") };
            FuseError::Confine { program: path, source, log }
        }
        other => other.into(),
    }
}

/// Does the last output of a FUSE program started on a host-opened connection say it could not
/// use it? libfuse 2 reads `/dev/fd/N` as a mount point: a program that checks it says it is not
/// a directory (s3fs: "MOUNTPOINT: /dev/fd/3 is not a directory"); one that does not opens
/// `/dev/fuse` by itself, which its unprivileged FUSE id may not ("fuse: failed to open
/// /dev/fuse: Permission denied", bindfs), or runs `fusermount`, which cannot mount for it in
/// its namespace (rclone's bazil.org/fuse, libfuse 2's fallback). A program that takes the
/// connection does neither.
fn cannot_take_fd(log_tail: &str) -> bool {
    let names_fd = log_tail.contains("/dev/fd/")
        && ["not a directory", "Not a directory", "bad mount point"].iter().any(|m| log_tail.contains(m));
    names_fd || log_tail.contains("failed to open /dev/fuse") || log_tail.contains("fusermount: ")
}

impl Linux {
    /// Connect to a started server's control socket and run the host's opening on it, within
    /// `timeout` (reads and writes of the connection time out then).
    fn open_control(&self, c: &super::executor::Control<'_>, timeout: Duration) -> io::Result<()> {
        let conn = self.connect(&c.dir.join(c.name))?;
        conn.set_read_timeout(Some(timeout))?;
        conn.set_write_timeout(Some(timeout))?;
        (c.opening)(&conn)
    }
}

impl Groups for Linux {
    fn release_group(&self, group: &str) -> io::Result<usize> {
        self.cgroups.release(group)
    }

    fn groups(&self) -> io::Result<Vec<String>> {
        self.cgroups.groups()
    }

    fn oom_kills(&self, group: &str) -> Option<u64> {
        self.cgroups.oom_kills(group)
    }

    fn settle_group(&self, group: &str) -> io::Result<usize> {
        self.cgroups.settle(group)
    }
}

impl Executor for Linux {
    fn boot(&self) -> io::Result<Boot> {
        let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?.trim().to_string();
        let btime = std::fs::read_to_string("/proc/stat")?
            .lines()
            .find_map(|l| l.strip_prefix("btime ").and_then(|v| v.trim().parse::<u64>().ok()))
            .ok_or_else(|| io::Error::other("no btime in /proc/stat"))?;
        Ok(Boot { id, started: std::time::UNIX_EPOCH + Duration::from_secs(btime) })
    }

    fn listen(&self, path: &Path, group: Option<u32>) -> io::Result<tokio::net::UnixListener> {
        crate::unpriv::socket::listen_for(path, group)
    }

    fn listen_in(&self, dir: &Path, name: &str, mode: u32) -> io::Result<(std::os::unix::net::UnixListener, FileId)> {
        let dir_fd = self.anchors.open(dir, OFlags::PATH | OFlags::DIRECTORY)?;
        let path = dir.join(name);
        match file_id_at(&dir_fd, name)? {
            Some(FileId { kind: FileKind::Directory, .. }) => {
                // Moved aside first: a tree that cannot be removed (a mount point inside, too
                // deep) must not keep the socket from its name.
                let aside = format!(".{name}.removed-{}", std::process::id() as u128 * 1_000_000_007 + nanos());
                rustix::fs::renameat(&dir_fd, name, &dir_fd, aside.as_str())?;
                if let Err(e) = self.anchors.remove_tree(&dir.join(&aside)) {
                    tracing::warn!(path = %dir.join(&aside).display(), error = %e, "a directory put in place of a socket stays");
                }
            }
            Some(_) => rustix::fs::unlinkat(&dir_fd, name, rustix::fs::AtFlags::empty())?,
            None => {}
        }
        let listener = std::os::unix::net::UnixListener::bind(format!("{}/{name}", mount::fd_path(&dir_fd)))?;
        // The mode is set through a descriptor of what the name holds now, opened without
        // following it: a pod that swapped in a link meanwhile gets no chmod of its target.
        let sock = rustix::fs::openat(&dir_fd, name, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?;
        let id = stat_id(&rustix::fs::fstat(&sock)?);
        if id.kind != FileKind::Socket {
            return Err(io::Error::other(format!("{} was replaced while it was being bound", path.display())));
        }
        rustix::fs::chmod(mount::fd_path(&sock).as_str(), Mode::from_raw_mode(mode))?;
        listener.set_nonblocking(true)?;
        Ok((listener, id))
    }

    fn connect(&self, path: &Path) -> io::Result<std::os::unix::net::UnixStream> {
        let sock = self.anchors.open(path, OFlags::PATH | OFlags::NOFOLLOW)?;
        if stat_id(&rustix::fs::fstat(&sock)?).kind != FileKind::Socket {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a socket (a program put something else there)", path.display()),
            ));
        }
        std::os::unix::net::UnixStream::connect(mount::fd_path(&sock))
            .map_err(|e| io::Error::new(e.kind(), format!("connecting to {}: {e}", path.display())))
    }

    fn file_id(&self, path: &Path) -> io::Result<Option<FileId>> {
        let (parent, name) = match self.anchors.open_parent(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            other => other?,
        };
        file_id_at(&parent, &name)
    }

    fn share(&self, target: &Path) -> Result<(), MountError> {
        mount::share(&self.anchors, target)
    }

    fn atomic_read_only_binds(&self) -> bool {
        self.api == Api::New && mount::setattr_supported()
    }
}

fn nanos() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

/// What `name` in `dir` is, not following it.
fn file_id_at(dir: &std::os::fd::OwnedFd, name: impl rustix::path::Arg) -> io::Result<Option<FileId>> {
    match rustix::fs::statat(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(stat_id(&st))),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn stat_id(st: &rustix::fs::Stat) -> FileId {
    use rustix::fs::FileType;
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::Directory => FileKind::Directory,
        FileType::Socket => FileKind::Socket,
        FileType::Symlink => FileKind::Link,
        _ => FileKind::Other,
    };
    FileId { dev: st.st_dev, ino: st.st_ino, kind }
}

#[cfg(test)]
mod tests {
    use super::cannot_take_fd;

    #[test]
    fn libfuse_2s_ways_of_failing_on_a_host_connection_are_told_apart() {
        for said in [
            "MOUNTPOINT: /dev/fd/3 is not a directory.",
            "fuse: bad mount point `/dev/fd/3': Not a directory",
            "fuse: failed to open /dev/fuse: Permission denied",
            "mount helper error: fusermount: mount failed: Operation not permitted",
        ] {
            assert!(cannot_take_fd(said), "{said}");
        }
        for said in ["", "connection refused: 127.0.0.1:8888", "fusermount3: entry for /x not found in /etc/mtab"] {
            assert!(!cannot_take_fd(said), "{said}");
        }
    }
}
