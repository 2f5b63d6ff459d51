//! A recording [`Executor`] for unit tests: it performs nothing, logs every call in order, and
//! keeps a simulated mount table and process list, so the pipeline's decisions ("already
//! mounted: skip", "another mount at the target: AlreadyExists") can be tested without root.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use nix::errno::Errno;

use super::executor::{Executor, Fuse, FuseError, Usage};
use super::mount::MountError;
use super::mountinfo::MountEntry;
use super::process::{ProcessError, ProcessId, Stopped};

#[derive(Debug, Default)]
struct Sim {
    calls: Vec<String>,
    mounts: Vec<MountEntry>,
    alive: BTreeSet<i32>,
    /// Each cgroup's member pids.
    groups: BTreeMap<String, BTreeSet<i32>>,
    /// What each spawned pid runs.
    exes: BTreeMap<i32, PathBuf>,
    next: u32,
    fail_next: Option<(String, Errno)>,
}

/// Records calls; simulates the kernel's view.
#[derive(Debug, Default)]
pub struct Recording {
    sim: Mutex<Sim>,
}

impl Recording {
    /// A fresh machine: nothing mounted, nothing running.
    pub fn new() -> Self {
        Self::default()
    }

    fn sim(&self) -> std::sync::MutexGuard<'_, Sim> {
        self.sim.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every call so far, in order, as text (`mount tmpfs tmpfs /x ro`, `bind /a /b ro`, ...).
    pub fn calls(&self) -> Vec<String> {
        self.sim().calls.clone()
    }

    /// Forget the calls recorded so far.
    pub fn clear_calls(&self) {
        self.sim().calls.clear();
    }

    /// Make the next call of `op` (`mount`, `bind`, `unmount`, `spawn-fuse`) fail with `errno`.
    pub fn fail_next(&self, op: &str, errno: Errno) {
        self.sim().fail_next = Some((op.into(), errno));
    }

    /// Simulate a crash of a process.
    pub fn kill(&self, pid: i32) {
        self.sim().alive.remove(&pid);
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
        push_mount(&mut s, fstype, source, "/", target, false);
    }
}

fn push_mount(s: &mut Sim, fstype: &str, source: &str, root: &str, target: &Path, readonly: bool) {
    s.next += 1;
    let id = s.next;
    s.mounts.push(MountEntry {
        mount_id: 100 + id,
        parent_id: 1,
        device: format!("0:{id}"),
        root: root.into(),
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

impl Executor for Recording {
    fn mounts(&self) -> io::Result<Vec<MountEntry>> {
        Ok(self.sim().mounts.clone())
    }

    fn mkdir(&self, path: &Path) -> io::Result<()> {
        self.sim().calls.push(format!("mkdir {}", path.display()));
        Ok(())
    }

    fn remove_tree(&self, path: &Path) -> io::Result<()> {
        self.sim().calls.push(format!("remove-tree {}", path.display()));
        Ok(())
    }

    fn remove_entry(&self, path: &Path) -> io::Result<()> {
        self.sim().calls.push(format!("remove {}", path.display()));
        Ok(())
    }

    fn mount(
        &self,
        fstype: &str,
        source: &str,
        target: &Path,
        options: &[String],
        readonly: bool,
    ) -> Result<(), MountError> {
        let mut s = self.sim();
        s.calls.push(format!(
            "mount {fstype} {source} {} [{}]{}",
            target.display(),
            options.join(","),
            if readonly { " ro" } else { "" }
        ));
        if let Some(errno) = failing(&mut s, "mount") {
            return Err(MountError { op: "mount", path: target.into(), errno });
        }
        push_mount(&mut s, fstype, source, "/", target, readonly);
        Ok(())
    }

    fn bind(&self, source: &Path, target: &Path, readonly: bool, flags: &[String]) -> Result<(), MountError> {
        let mut s = self.sim();
        s.calls.push(format!("bind {} {}{}", source.display(), target.display(), if readonly { " ro" } else { "" }));
        if let Some(errno) = failing(&mut s, "bind") {
            return Err(MountError { op: "bind", path: target.into(), errno });
        }
        let _ = flags;
        let Some(src) = s.mounts.iter().rev().find(|m| m.mount_point == source).cloned() else {
            // Binding a plain directory: a new "device" for the simulation.
            push_mount(&mut s, "none", &source.display().to_string(), &source.display().to_string(), target, readonly);
            return Ok(());
        };
        let mut entry = src;
        s.next += 1;
        entry.mount_id = 100 + s.next;
        entry.mount_point = target.to_path_buf();
        entry.mount_options = if readonly { "ro".into() } else { "rw".into() };
        s.mounts.push(entry);
        Ok(())
    }

    fn unmount(&self, target: &Path, lazy: bool) -> Result<(), MountError> {
        let mut s = self.sim();
        s.calls.push(format!("unmount {}{}", target.display(), if lazy { " lazy" } else { "" }));
        if let Some(errno) = failing(&mut s, "unmount") {
            return Err(MountError { op: "unmount", path: target.into(), errno });
        }
        match s.mounts.iter().rposition(|m| m.mount_point == target) {
            Some(i) => {
                s.mounts.remove(i);
                Ok(())
            }
            None => Err(MountError { op: "unmount", path: target.into(), errno: Errno::EINVAL }),
        }
    }

    fn spawn_fuse(&self, fuse: &Fuse<'_>) -> Result<ProcessId, FuseError> {
        let mut s = self.sim();
        s.calls.push(format!(
            "spawn-fuse {} {} -> {}",
            fuse.spec.executable.display(),
            fuse.spec.args.join(" "),
            fuse.mountpoint.display()
        ));
        if let Some(errno) = failing(&mut s, "spawn-fuse") {
            return Err(FuseError::Process(ProcessError::Spawn {
                path: fuse.spec.executable.into(),
                source: errno.into(),
            }));
        }
        s.next += 1;
        let pid = 10_000 + s.next as i32;
        s.alive.insert(pid);
        s.groups.entry(fuse.group.into()).or_default().insert(pid);
        s.exes.insert(pid, fuse.spec.executable.into());
        let source = fuse.spec.executable.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        push_mount(&mut s, fuse.fstype, &source, "/", fuse.mountpoint, false);
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

    fn release_group(&self, group: &str) -> io::Result<usize> {
        let mut s = self.sim();
        let Some(pids) = s.groups.remove(group) else { return Ok(0) };
        s.calls.push(format!("release-group {group}"));
        Ok(pids.into_iter().filter(|p| s.alive.remove(p)).count())
    }

    fn groups(&self) -> io::Result<Vec<String>> {
        Ok(self.sim().groups.keys().cloned().collect())
    }

    fn oom_kills(&self, _group: &str) -> Option<u64> {
        None
    }

    fn usage(&self, path: &Path) -> io::Result<Usage> {
        let s = self.sim();
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

/// Paths a recording saw mounted, for assertions.
pub fn mount_points(rec: &Recording) -> Vec<PathBuf> {
    rec.mounts().unwrap_or_default().into_iter().map(|m| m.mount_point).collect()
}
