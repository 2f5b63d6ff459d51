//! A recording [`Executor`] for unit tests: it performs nothing on the machine, logs every
//! effect in order (directories, files, mounts, processes, groups, sockets), and keeps a
//! simulated node: a filesystem in memory (directories, files, symbolic links), a mount table,
//! processes and cgroups. The pipeline's decisions ("already mounted: skip", "another mount at
//! the target: AlreadyExists", "a link on the way: refused") can be tested without root, and a
//! test can assert that it saw every effect of an RPC, state files included.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::errno::Errno;

use super::beneath::{Entry, LinkRefused, is_link_refused};
use super::executor::{Boot, Executor, Exit, Files, Fuse, FuseError, Groups, Mounts, Processes, Usage};
use super::mount::MountError;
use super::mountinfo::MountEntry;
use super::process::{ProcessError, ProcessId, Stopped};
use crate::plan::MountOption;

/// One node of the simulated filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Inode {
    Dir { mode: u32 },
    File { bytes: Vec<u8>, mode: u32, modified: SystemTime },
    Link { to: PathBuf },
}

#[derive(Debug)]
struct Sim {
    calls: Vec<String>,
    mounts: Vec<MountEntry>,
    alive: BTreeSet<i32>,
    /// Ids live processes hold besides the simulated ones ([`Recording::hold_id`]).
    held_ids: BTreeSet<u32>,
    /// Each cgroup's member pids.
    groups: BTreeMap<String, BTreeSet<i32>>,
    /// What each spawned pid runs.
    exes: BTreeMap<i32, PathBuf>,
    /// Futures waiting for a pid's exit.
    exits: BTreeMap<i32, Arc<tokio::sync::Notify>>,
    fs: BTreeMap<PathBuf, Inode>,
    boot: Boot,
    clock: SystemTime,
    next: u32,
    fail_next: Option<(String, Errno)>,
}

impl Default for Sim {
    fn default() -> Self {
        let mut fs = BTreeMap::new();
        fs.insert(PathBuf::from("/"), Inode::Dir { mode: 0o755 });
        Sim {
            calls: Vec::new(),
            mounts: Vec::new(),
            alive: BTreeSet::new(),
            held_ids: BTreeSet::new(),
            groups: BTreeMap::new(),
            exes: BTreeMap::new(),
            exits: BTreeMap::new(),
            fs,
            boot: Boot { id: "recording-boot-1".into(), started: UNIX_EPOCH + Duration::from_secs(1_000_000) },
            clock: UNIX_EPOCH + Duration::from_secs(2_000_000),
            next: 0,
            fail_next: None,
        }
    }
}

/// Records calls; simulates the node.
#[derive(Debug, Default)]
pub struct Recording {
    sim: Mutex<Sim>,
}

fn loop_err(path: &Path, link: &Path) -> io::Error {
    io::Error::other(LinkRefused { path: path.to_path_buf(), link: link.to_path_buf() })
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("{}: No such file or directory", path.display()))
}

impl Sim {
    /// Refuse a path with a link anywhere on the way (the final component included unless
    /// `final_ok`); as [`super::beneath`] does.
    fn check(&self, path: &Path, final_ok: bool) -> io::Result<()> {
        let mut at = PathBuf::from("/");
        let parts: Vec<_> = path.iter().skip(1).collect();
        for (i, part) in parts.iter().enumerate() {
            at.push(part);
            if let Some(Inode::Link { .. }) = self.fs.get(&at)
                && !(final_ok && i + 1 == parts.len())
            {
                return Err(loop_err(path, &at));
            }
        }
        Ok(())
    }

    fn is_dir(&self, path: &Path) -> bool {
        matches!(self.fs.get(path), Some(Inode::Dir { .. }))
    }

    fn mkdirs(&mut self, path: &Path, below: &Path, mode: u32) -> io::Result<()> {
        self.check(path, false)?;
        if !self.is_dir(below) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} does not exist (it must exist before {} is created)", below.display(), path.display()),
            ));
        }
        let rest = path.strip_prefix(below).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let mut at = below.to_path_buf();
        for part in rest.iter() {
            at.push(part);
            match self.fs.get(&at) {
                Some(Inode::Dir { .. }) => {}
                Some(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!("{} is not a directory", at.display()),
                    ));
                }
                None => {
                    self.fs.insert(at.clone(), Inode::Dir { mode });
                }
            }
        }
        Ok(())
    }

    fn below_mount(&self, path: &Path) -> Option<PathBuf> {
        self.mounts.iter().map(|m| m.mount_point.clone()).find(|m| m.starts_with(path))
    }

    fn tick(&mut self) -> SystemTime {
        self.clock += Duration::from_secs(1);
        self.clock
    }
}

impl Recording {
    /// A fresh node: an empty root directory, nothing mounted, nothing running.
    pub fn new() -> Self {
        Self::default()
    }

    fn sim(&self) -> std::sync::MutexGuard<'_, Sim> {
        self.sim.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every effect so far, in order (`mount tmpfs tmpfs /x [..] ro`, `bind /a /b ro`,
    /// `write /state/volumes/k.json`, ...).
    pub fn calls(&self) -> Vec<String> {
        self.sim().calls.clone()
    }

    /// Forget the calls recorded so far.
    pub fn clear_calls(&self) {
        self.sim().calls.clear();
    }

    /// Make the next call of `op` (`mount`, `bind`, `unmount`, `spawn-fuse`, `write`) fail
    /// with `errno`.
    pub fn fail_next(&self, op: &str, errno: Errno) {
        self.sim().fail_next = Some((op.into(), errno));
    }

    /// Some process (say one left by an earlier holder of a FUSE id) runs as `id`.
    pub fn hold_id(&self, id: u32) {
        self.sim().held_ids.insert(id);
    }

    /// Simulate a crash of a process.
    pub fn kill(&self, pid: i32) {
        let mut s = self.sim();
        s.alive.remove(&pid);
        if let Some(n) = s.exits.remove(&pid) {
            n.notify_waiters();
            n.notify_one();
        }
    }

    /// A process in a volume's cgroup that no state file names (a daemon killed between spawn
    /// and recording the pid). Returns its pid.
    pub fn orphan_in_group(&self, group: &str) -> i32 {
        let mut s = self.sim();
        s.next += 1;
        let pid = 10_000 + s.next as i32;
        s.alive.insert(pid);
        s.groups.entry(group.into()).or_default().insert(pid);
        pid
    }

    /// Put a mount in the table as if someone else had made it.
    pub fn add_mount(&self, fstype: &str, source: &str, target: &Path) {
        let mut s = self.sim();
        // A mount point exists, as in the kernel.
        s.mkdirs(target, Path::new("/"), 0o755).expect("no links on the way");
        push_mount(&mut s, fstype, source, "/", target, false);
    }

    /// Create a directory and its parents, as kubelet or a test would (not recorded).
    pub fn add_dir(&self, path: &Path) {
        let mut s = self.sim();
        s.mkdirs(path, Path::new("/"), 0o755).expect("no links on the way");
    }

    /// Plant a symbolic link (not recorded), as a pod could inside its volume.
    pub fn add_symlink(&self, path: &Path, to: &Path) {
        let mut s = self.sim();
        s.fs.insert(path.to_path_buf(), Inode::Link { to: to.to_path_buf() });
    }

    /// Write a file directly (not recorded), e.g. a torn state file; `modified` sets its mtime.
    pub fn add_file(&self, path: &Path, bytes: &[u8], modified: Option<SystemTime>) {
        let mut s = self.sim();
        let modified = modified.unwrap_or_else(|| s.tick());
        s.fs.insert(path.to_path_buf(), Inode::File { bytes: bytes.to_vec(), mode: 0o600, modified });
    }

    /// Does `path` exist in the simulated filesystem (as anything)?
    pub fn exists(&self, path: &Path) -> bool {
        self.sim().fs.contains_key(path)
    }

    /// The mode of a file or directory.
    pub fn mode(&self, path: &Path) -> Option<u32> {
        match self.sim().fs.get(path)? {
            Inode::Dir { mode } | Inode::File { mode, .. } => Some(*mode),
            Inode::Link { .. } => None,
        }
    }

    /// Every path below `dir` (files, directories and links).
    pub fn paths_below(&self, dir: &Path) -> Vec<PathBuf> {
        self.sim().fs.keys().filter(|p| p.starts_with(dir) && *p != dir).cloned().collect()
    }

    /// Simulate a reboot: a new boot id, begun now.
    pub fn reboot(&self) {
        let mut s = self.sim();
        let n = s.boot.id.rsplit('-').next().and_then(|n| n.parse::<u32>().ok()).unwrap_or(1) + 1;
        let started = s.tick();
        s.boot = Boot { id: format!("recording-boot-{n}"), started };
    }
}

fn push_mount(s: &mut Sim, fstype: &str, source: &str, root: &str, target: &Path, readonly: bool) {
    let root = PathBuf::from(root);
    s.next += 1;
    let id = s.next;
    s.mounts.push(MountEntry {
        mount_id: 100 + id,
        parent_id: 1,
        device: format!("0:{id}"),
        root,
        mount_point: target.to_path_buf(),
        mount_options: if readonly { "ro".into() } else { "rw".into() },
        fstype: fstype.into(),
        source: source.into(),
        super_options: "rw".into(),
    });
}

fn failing(s: &mut Sim, op: &str) -> Option<Errno> {
    match &s.fail_next {
        Some((o, errno)) if o == op => {
            let errno = *errno;
            s.fail_next = None;
            Some(errno)
        }
        _ => None,
    }
}

fn mount_err(op: &'static str, path: &Path, errno: Errno) -> MountError {
    MountError { op, path: path.to_path_buf(), errno, detail: errno.desc().to_string() }
}

fn resolving(path: &Path, e: io::Error) -> MountError {
    let errno = if is_link_refused(&e) { Errno::ELOOP } else { Errno::ENOENT };
    MountError { op: "resolve", path: path.to_path_buf(), errno, detail: e.to_string() }
}

/// The mount a path is on in the table, and the path's place inside it.
fn containing<'a>(mounts: &'a [MountEntry], path: &Path) -> Option<(&'a MountEntry, PathBuf)> {
    mounts
        .iter()
        .filter(|m| path.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.as_os_str().len())
        .map(|m| (m, path.strip_prefix(&m.mount_point).unwrap_or(Path::new("")).to_path_buf()))
}

impl Recording {
    /// A file write recorded as `<op> <path>` (a failure planned for `write` applies to both).
    fn write_as(&self, op: &str, path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
        let mut s = self.sim();
        s.calls.push(format!("{op} {}", path.display()));
        if let Some(errno) = failing(&mut s, "write") {
            return Err(errno.into());
        }
        s.check(path, false)?;
        if !s.is_dir(path.parent().unwrap_or(path)) {
            return Err(not_found(path));
        }
        let modified = s.tick();
        s.fs.insert(path.to_path_buf(), Inode::File { bytes: bytes.to_vec(), mode, modified });
        Ok(())
    }
}

impl Files for Recording {
    fn mkdir(&self, path: &Path, below: &Path, mode: u32) -> io::Result<()> {
        let mut s = self.sim();
        s.calls.push(format!("mkdir {}", path.display()));
        s.mkdirs(path, below, mode)
    }

    fn private_dir(&self, path: &Path) -> io::Result<()> {
        let mut s = self.sim();
        s.calls.push(format!("private-dir {}", path.display()));
        s.mkdirs(path, Path::new("/"), 0o700)?;
        s.fs.insert(path.to_path_buf(), Inode::Dir { mode: 0o700 });
        Ok(())
    }

    fn remove_tree(&self, path: &Path) -> io::Result<()> {
        let mut s = self.sim();
        s.calls.push(format!("remove-tree {}", path.display()));
        let parent = path.parent().unwrap_or(path);
        s.check(parent, false)?;
        if matches!(s.fs.get(path), Some(Inode::Link { .. })) {
            s.fs.remove(path);
            return Ok(());
        }
        if let Some(m) = s.below_mount(path) {
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                format!("{} is a mount point; refusing to remove anything below it", m.display()),
            ));
        }
        s.fs.retain(|p, _| !p.starts_with(path));
        Ok(())
    }

    fn remove_entry(&self, path: &Path) -> io::Result<()> {
        let mut s = self.sim();
        s.calls.push(format!("remove {}", path.display()));
        s.check(path.parent().unwrap_or(path), false)?;
        if s.mounts.iter().any(|m| m.mount_point == path) {
            return Err(io::Error::new(io::ErrorKind::ResourceBusy, format!("{}: mounted", path.display())));
        }
        if s.fs.keys().any(|p| p.starts_with(path) && p != path) && s.is_dir(path) {
            return Err(io::Error::new(io::ErrorKind::DirectoryNotEmpty, format!("{}: not empty", path.display())));
        }
        s.fs.remove(path);
        Ok(())
    }

    /// Recorded as `write-secret <path>` (the simulation keeps no spares either way).
    fn write_secret_file(&self, path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
        self.write_as("write-secret", path, bytes, mode)
    }

    fn write_file(&self, path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
        self.write_as("write", path, bytes, mode)
    }

    fn read_file(&self, path: &Path) -> io::Result<Option<Vec<u8>>> {
        let s = self.sim();
        s.check(path, false)?;
        match s.fs.get(path) {
            Some(Inode::File { bytes, .. }) => Ok(Some(bytes.clone())),
            Some(_) => Err(io::Error::new(io::ErrorKind::IsADirectory, format!("{} is not a file", path.display()))),
            None => Ok(None),
        }
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<Entry>> {
        let s = self.sim();
        s.check(path, false)?;
        Ok(s.fs
            .iter()
            .filter(|(p, _)| p.parent() == Some(path) && *p != path)
            .map(|(p, n)| Entry {
                name: p.file_name().unwrap_or_default().to_os_string(),
                is_dir: matches!(n, Inode::Dir { .. }),
                is_file: matches!(n, Inode::File { .. }),
            })
            .collect())
    }

    fn set_owner(&self, path: &Path, uid: u32, gid: u32, mode: u32) -> io::Result<()> {
        let mut s = self.sim();
        s.check(path, false)?;
        s.calls.push(format!("chown {} {uid}:{gid} {mode:o}", path.display()));
        match s.fs.get_mut(path) {
            Some(Inode::Dir { mode: m } | Inode::File { mode: m, .. }) => {
                *m = mode;
                Ok(())
            }
            _ => Err(not_found(path)),
        }
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        let s = self.sim();
        s.check(path, false)?;
        Ok(s.fs.contains_key(path))
    }

    fn modified(&self, path: &Path) -> io::Result<SystemTime> {
        match self.sim().fs.get(path) {
            Some(Inode::File { modified, .. }) => Ok(*modified),
            Some(_) => Ok(UNIX_EPOCH),
            None => Err(not_found(path)),
        }
    }
}

impl Mounts for Recording {
    fn mounts(&self) -> io::Result<Vec<MountEntry>> {
        Ok(self.sim().mounts.clone())
    }

    fn mount(
        &self,
        fstype: &str,
        source: &str,
        target: &Path,
        options: &[MountOption],
        readonly: bool,
    ) -> Result<(), MountError> {
        let mut s = self.sim();
        let shown: Vec<String> = options
            .iter()
            .map(|o| match o {
                MountOption::Text(t) => t.clone(),
                MountOption::Path { prefix, path } => format!("{prefix}{}", path.display()),
            })
            .collect();
        s.calls.push(format!(
            "mount {fstype} {source} {} [{}]{}",
            target.display(),
            shown.join(","),
            if readonly { " ro" } else { "" }
        ));
        if let Some(errno) = failing(&mut s, "mount") {
            return Err(mount_err("mount", target, errno));
        }
        s.check(target, false).map_err(|e| resolving(target, e))?;
        if !s.is_dir(target) {
            return Err(resolving(target, not_found(target)));
        }
        push_mount(&mut s, fstype, source, "/", target, readonly);
        Ok(())
    }

    fn bind(&self, source: &Path, target: &Path, readonly: bool, flags: &[String]) -> Result<(), MountError> {
        let mut s = self.sim();
        s.calls.push(format!("bind {} {}{}", source.display(), target.display(), if readonly { " ro" } else { "" }));
        if let Some(errno) = failing(&mut s, "bind") {
            return Err(mount_err("bind", target, errno));
        }
        let _ = flags;
        s.check(source, false).map_err(|e| resolving(source, e))?;
        s.check(target, false).map_err(|e| resolving(target, e))?;
        if !s.fs.contains_key(target) {
            return Err(resolving(target, not_found(target)));
        }
        match containing(&s.mounts, source).map(|(m, rel)| (m.clone(), rel)) {
            Some((mut entry, rel)) => {
                s.next += 1;
                entry.mount_id = 100 + s.next;
                entry.root = entry.root.join(rel);
                entry.mount_point = target.to_path_buf();
                entry.mount_options = if readonly { "ro".into() } else { "rw".into() };
                s.mounts.push(entry);
            }
            // Binding a plain directory: a new "device" for the simulation.
            None => {
                let src = source.display().to_string();
                push_mount(&mut s, "none", &src, &src, target, readonly);
            }
        }
        Ok(())
    }

    fn unmount(&self, target: &Path, lazy: bool) -> Result<(), MountError> {
        let mut s = self.sim();
        s.calls.push(format!("unmount {}{}", target.display(), if lazy { " lazy" } else { "" }));
        if let Some(errno) = failing(&mut s, "unmount") {
            return Err(mount_err("unmount", target, errno));
        }
        s.check(target.parent().unwrap_or(target), false).map_err(|e| resolving(target, e))?;
        if matches!(s.fs.get(target), Some(Inode::Link { .. })) {
            return Err(mount_err("unmount", target, Errno::EINVAL));
        }
        match s.mounts.iter().rposition(|m| m.mount_point == target) {
            Some(i) => {
                s.mounts.remove(i);
                Ok(())
            }
            None => Err(mount_err("unmount", target, Errno::EINVAL)),
        }
    }

    fn usage(&self, path: &Path) -> io::Result<Usage> {
        let s = self.sim();
        s.check(path, false)?;
        if s.mounts.iter().any(|m| m.mount_point == path) {
            Ok(Usage {
                total_bytes: 1 << 30,
                available_bytes: 1 << 29,
                used_bytes: 1 << 29,
                total_inodes: 1000,
                free_inodes: 900,
                used_inodes: 100,
            })
        } else {
            Err(io::Error::from(io::ErrorKind::NotFound))
        }
    }
}

impl Processes for Recording {
    fn spawn_fuse(&self, fuse: &Fuse<'_>) -> Result<ProcessId, FuseError> {
        let mut s = self.sim();
        // The program's log, opened (created 0600) before the spawn, as the real executor does.
        let modified = s.tick();
        s.calls.push(format!("write {}", fuse.spec.log.display()));
        s.fs.insert(fuse.spec.log.to_path_buf(), Inode::File { bytes: Vec::new(), mode: 0o600, modified });
        s.calls.push(format!(
            "spawn-fuse {} {} -> {}",
            fuse.spec.executable.display(),
            fuse.spec.args.join(" "),
            fuse.mountpoint.display()
        ));
        if let Some(h) = &fuse.host_mount {
            s.calls.push(format!(
                "host-fd {} {}{}{} as {}:{}",
                fuse.fstype,
                h.source,
                if h.readonly { " ro" } else { "" },
                h.options.iter().map(|o| format!(" {o}")).collect::<String>(),
                h.uid,
                h.gid,
            ));
        }
        if let Some(errno) = failing(&mut s, "spawn-fuse") {
            return Err(FuseError::Process(ProcessError::Spawn {
                path: fuse.spec.executable.into(),
                source: errno.into(),
            }));
        }
        s.check(fuse.mountpoint, false).map_err(FuseError::Io)?;
        if !s.is_dir(fuse.mountpoint) {
            return Err(FuseError::Io(not_found(fuse.mountpoint)));
        }
        s.next += 1;
        let pid = 10_000 + s.next as i32;
        s.alive.insert(pid);
        s.groups.entry(fuse.group.into()).or_default().insert(pid);
        s.exes.insert(pid, fuse.spec.executable.into());
        let source = match &fuse.host_mount {
            Some(h) => h.source.to_string(),
            None => fuse.spec.executable.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        };
        let readonly = fuse.host_mount.as_ref().is_some_and(|h| h.readonly);
        push_mount(&mut s, fuse.fstype, &source, "/", fuse.mountpoint, readonly);
        Ok(ProcessId { pid, start_time: 1 })
    }

    fn is_alive(&self, id: &ProcessId) -> bool {
        self.sim().alive.contains(&id.pid)
    }

    fn stop(&self, id: &ProcessId, _grace: Duration) -> Result<Stopped, ProcessError> {
        let mut s = self.sim();
        s.calls.push(format!("stop {}", id.pid));
        Ok(if s.alive.remove(&id.pid) { Stopped::Terminated } else { Stopped::AlreadyGone })
    }

    fn executable(&self, id: &ProcessId) -> Option<PathBuf> {
        let s = self.sim();
        s.alive.contains(&id.pid).then(|| s.exes.get(&id.pid).cloned()).flatten()
    }

    fn reap(&self) -> usize {
        0
    }

    fn watch(&self, id: &ProcessId) -> io::Result<Exit> {
        let mut s = self.sim();
        if !s.alive.contains(&id.pid) {
            return Err(io::Error::from_raw_os_error(nix::libc::ESRCH));
        }
        let n = s.exits.entry(id.pid).or_default().clone();
        Ok(Box::pin(async move { n.notified().await }))
    }

    fn ids_in_use(&self) -> io::Result<BTreeSet<u32>> {
        Ok(self.sim().held_ids.clone())
    }

    fn backing_open(&self, server: &ProcessId, files: &[&std::fs::File]) -> io::Result<Vec<u32>> {
        let mut s = self.sim();
        s.calls.push(format!("backing-open {} x{}", server.pid, files.len()));
        if !s.alive.contains(&server.pid) {
            return Err(io::Error::from_raw_os_error(nix::libc::ESRCH));
        }
        Ok((1..=files.len() as u32).collect())
    }
}

impl Groups for Recording {
    fn release_group(&self, group: &str) -> io::Result<usize> {
        let mut s = self.sim();
        let Some(pids) = s.groups.remove(group) else { return Ok(0) };
        s.calls.push(format!("release-group {group}"));
        Ok(pids.into_iter().filter(|p| s.alive.remove(p)).count())
    }

    /// Like the real one, only the groups below the own parent of a daemon without an
    /// instance id (`mounthost/`, what unit tests' configurations give).
    fn groups(&self) -> io::Result<Vec<String>> {
        let own = format!("{}/", crate::config::DEFAULT_CGROUP_PARENT);
        Ok(self.sim().groups.keys().filter(|g| g.starts_with(&own)).cloned().collect())
    }

    fn oom_kills(&self, _group: &str) -> Option<u64> {
        None
    }

    /// One hierarchy here: nothing to settle.
    fn settle_group(&self, _group: &str) -> io::Result<usize> {
        Ok(0)
    }
}

impl Executor for Recording {
    fn boot(&self) -> io::Result<Boot> {
        Ok(self.sim().boot.clone())
    }

    fn listen(&self, path: &Path, _group: Option<u32>) -> io::Result<tokio::net::UnixListener> {
        self.sim().calls.push(format!("listen {}", path.display()));
        Err(io::Error::new(io::ErrorKind::Unsupported, "the recording executor serves no sockets"))
    }

    fn listen_in(
        &self,
        dir: &Path,
        name: &str,
        _mode: u32,
    ) -> io::Result<(std::os::unix::net::UnixListener, super::FileId)> {
        self.sim().calls.push(format!("listen {}", dir.join(name).display()));
        Err(io::Error::new(io::ErrorKind::Unsupported, "the recording executor serves no sockets"))
    }

    /// Records the call and hands back one end of a fresh pair: nothing answers on it.
    fn connect(&self, path: &Path) -> io::Result<std::os::unix::net::UnixStream> {
        self.sim().calls.push(format!("connect {}", path.display()));
        Ok(std::os::unix::net::UnixStream::pair()?.0)
    }

    fn file_id(&self, path: &Path) -> io::Result<Option<super::FileId>> {
        let kind = match self.sim().fs.get(path) {
            None => return Ok(None),
            Some(Inode::Dir { .. }) => super::FileKind::Directory,
            Some(Inode::Link { .. }) => super::FileKind::Link,
            Some(Inode::File { .. }) => super::FileKind::Other,
        };
        Ok(Some(super::FileId { dev: 0, ino: 0, kind }))
    }

    fn share(&self, target: &Path) -> Result<(), MountError> {
        self.sim().calls.push(format!("share {}", target.display()));
        Ok(())
    }

    fn atomic_read_only_binds(&self) -> bool {
        true
    }
}

/// Paths a recording saw mounted, for assertions.
pub fn mount_points(rec: &Recording) -> Vec<PathBuf> {
    rec.mounts().unwrap_or_default().into_iter().map(|m| m.mount_point).collect()
}
