//! Per-volume cgroups: every FUSE process runs in `<hierarchy>/<parent>/<volume key>`, where
//! `<parent>` is the daemon's own (`<--cgroup-parent>-<instance id>`, see `exec::instance`) and a
//! volume's group is named by its record (`VolumeState::cgroup`, relative to the hierarchy's
//! root), so
//!
//! - the kernel names every process of a volume, including one spawned by a daemon that was
//!   killed before it could record the pid (start-up reconciliation kills what no state file
//!   claims below its own parent, never elsewhere, and unstage kills what the program forked);
//! - a per-volume memory limit confines the OOM killer to that volume: another volume's
//!   process is never chosen;
//! - a container runtime that kills the daemon's own cgroup (a DaemonSet pod restarting)
//!   leaves the FUSE processes alone.
//!
//! Two layouts are supported and detected from the mount table at start:
//!
//! - **v2** (unified, production nodes): a `cgroup2` mount whose `cgroup.controllers` lists
//!   `memory`. `memory` is enabled in `cgroup.subtree_control` from the hierarchy's root down to
//!   the parent; a limit is `memory.max`, with `memory.oom.group` so an OOM takes the volume's
//!   whole group at once. Leftovers are killed with `cgroup.kill` where the kernel has it.
//! - **v1** (legacy or hybrid hosts, such as systemd's hybrid layout where `memory` is bound to
//!   a v1 hierarchy and `/sys/fs/cgroup/unified` has no controllers): the `memory` hierarchy;
//!   a limit is `memory.limit_in_bytes`. Each process also joins a group of the same name in
//!   **every other mounted hierarchy** (the other v1 controllers, `name=systemd`, and the
//!   controller-less v2 hierarchy of the hybrid layout): a container runtime finds the
//!   processes to kill with a container in one hierarchy of its choice (runc 1.1: `devices`)
//!   and freezes them in another (`freezer`), so a FUSE process left in the daemon's container
//!   group anywhere dies with the daemon's container. On cpuset hierarchies each new group gets
//!   its parent's `cpuset.cpus` and `cpuset.mems` (v1 refuses tasks into a cpuset without them).
//!
//! Without either, processes run without a group and a plan that asks for a memory limit is
//! refused (FailedPrecondition) instead of running unlimited.
//!
//! Every volume's group also gets the node's caps ([`Caps`], host config): `pids.max` (the
//! processes and threads of the volume's programs together) and block I/O throttling per device
//! (v2 `io.max`; v1 `blkio.throttle.{read,write}_{bps,iops}_device`), where the node has the
//! controller (v2: listed in the root's `cgroup.controllers`; v1: a mounted `pids` or `blkio`
//! hierarchy). [`Cgroups::unapplied`] names a configured cap the node cannot apply.
//!
//! A process joins its group between fork and exec (it writes `0` to `cgroup.procs`), so it is
//! never outside it, not even for an instant.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

use super::mountinfo::{self, MountEntry};

/// Which cgroup interface a node has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// The unified hierarchy with the memory controller.
    V2,
    /// The legacy memory hierarchy.
    V1,
}

pub use crate::config::caps::{Caps, IoLimit};

/// The daemon's cgroup parent, as detected. Groups are named by their path relative to the
/// hierarchy's root (`<parent>/<key>`, or a record's older one); only the parent's own are listed.
#[derive(Debug, Clone)]
pub struct Cgroups {
    /// The hierarchy's mount point.
    root: Option<PathBuf>,
    /// `<hierarchy mount>/<parent>`, or `None` when the node has no usable hierarchy.
    parent: Option<PathBuf>,
    /// `<parent>`, relative to the hierarchy's root.
    name: String,
    version: Option<Version>,
    /// With v1: every other writable hierarchy, where each group is made too and joined.
    others: Vec<Other>,
    /// With v1: the memory hierarchy is also a cpuset one (co-mounted), whose new groups need
    /// CPUs and memory nodes; the file names' prefix.
    memory_cpuset: Option<&'static str>,
    /// With v2: the controllers the hierarchy's root offers.
    v2_controllers: Vec<String>,
    /// What every group gets.
    caps: Caps,
}

/// Another hierarchy a v1 group spans.
#[derive(Debug, Clone)]
struct Other {
    /// Its mount point.
    root: PathBuf,
    /// A cpuset hierarchy (new groups need CPUs and memory nodes): the prefix of its files'
    /// names, `cpuset.` (or none, mounted with `noprefix`).
    cpuset: Option<&'static str>,
    /// Holds the `pids` controller.
    pids: bool,
    /// Holds the `blkio` controller.
    blkio: bool,
}

/// The prefix of a cpuset hierarchy's file names, if `m` is one.
fn cpuset_prefix(m: &MountEntry) -> Option<&'static str> {
    let has = |o: &str| m.super_options.split(',').any(|x| x == o);
    (m.fstype == "cgroup" && has("cpuset")).then(|| if has("noprefix") { "" } else { "cpuset." })
}

/// May this process make groups below `m`? Not on a read-only mount or one it may not write.
fn writable(m: &MountEntry) -> bool {
    !m.mount_options.split(',').any(|o| o == "ro")
        && nix::unistd::access(&m.mount_point, nix::unistd::AccessFlags::W_OK).is_ok()
}

/// The `cgroup.procs` files of one group, in every hierarchy it spans (the one holding the
/// memory limit first), for a new process to join between fork and exec.
#[derive(Debug)]
pub struct Joining(Vec<File>);

impl Joining {
    /// The files, in the order the process joins them.
    pub fn files(&self) -> &[File] {
        &self.0
    }
}

/// The top mount at each mount point (a later entry in the mount table is mounted over an
/// earlier one at the same place, as a container runtime's own cgroup mounts may be).
fn visible(mounts: &[MountEntry]) -> Vec<&MountEntry> {
    let mut seen = std::collections::HashSet::new();
    let mut top: Vec<&MountEntry> = mounts.iter().rev().filter(|m| seen.insert(m.mount_point.clone())).collect();
    top.reverse();
    top
}

/// The default parent name (below the hierarchy's root).
pub const DEFAULT_PARENT: &str = crate::config::DEFAULT_CGROUP_PARENT;

/// How long leftovers may take to die before removing a group gives up.
const RELEASE_BOUND: Duration = Duration::from_secs(5);

impl Cgroups {
    /// Find the hierarchy in this process's mount table and use `parent` below its root.
    pub fn detect(parent: &str) -> Self {
        match mountinfo::read() {
            Ok(mounts) => Self::detect_in(&mounts, parent),
            Err(_) => Self::none(),
        }
    }

    /// [`Cgroups::detect`] against a given mount table.
    pub fn detect_in(mounts: &[MountEntry], parent: &str) -> Self {
        let mounts = visible(mounts);
        let controls = |m: &MountEntry, c: &str| m.super_options.split(',').any(|o| o == c);
        let v2 = mounts.iter().find(|m| m.fstype == "cgroup2").filter(|m| {
            std::fs::read_to_string(m.mount_point.join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"))
        });
        if let Some(m) = v2 {
            let controllers = std::fs::read_to_string(m.mount_point.join("cgroup.controllers")).unwrap_or_default();
            return Cgroups {
                root: Some(m.mount_point.clone()),
                parent: Some(m.mount_point.join(parent)),
                name: parent.to_string(),
                version: Some(Version::V2),
                others: Vec::new(),
                memory_cpuset: None,
                v2_controllers: controllers.split_whitespace().map(str::to_string).collect(),
                caps: Caps::default(),
            };
        }
        let v1 = mounts.iter().find(|m| m.fstype == "cgroup" && controls(m, "memory"));
        match v1 {
            Some(memory) => Cgroups {
                root: Some(memory.mount_point.clone()),
                parent: Some(memory.mount_point.join(parent)),
                name: parent.to_string(),
                version: Some(Version::V1),
                memory_cpuset: cpuset_prefix(memory),
                others: mounts
                    .iter()
                    .filter(|m| (m.fstype == "cgroup" || m.fstype == "cgroup2") && m.mount_point != memory.mount_point)
                    .filter(|m| {
                        // A FUSE process stays in the daemon's group in a hierarchy it cannot
                        // write, and dies with its container there: say so, but run it.
                        let ok = writable(m);
                        if !ok {
                            tracing::warn!(hierarchy = %m.mount_point.display(),
                                "a cgroup hierarchy is not writable: FUSE processes stay in the host daemon's group there, and a container runtime that stops the daemon's container kills them");
                        }
                        ok
                    })
                    .map(|m| Other {
                        root: m.mount_point.clone(),
                        cpuset: cpuset_prefix(m),
                        pids: m.fstype == "cgroup" && controls(m, "pids"),
                        blkio: m.fstype == "cgroup" && controls(m, "blkio"),
                    })
                    .collect(),
                v2_controllers: Vec::new(),
                caps: Caps::default(),
            },
            None => Cgroups { name: parent.to_string(), ..Self::none() },
        }
    }

    /// No cgroups (processes run in the daemon's own).
    pub fn none() -> Self {
        Cgroups {
            root: None,
            parent: None,
            name: String::new(),
            version: None,
            others: Vec::new(),
            memory_cpuset: None,
            v2_controllers: Vec::new(),
            caps: Caps::default(),
        }
    }

    /// Give every group `caps` from now on.
    pub fn with_caps(mut self, caps: Caps) -> Self {
        self.caps = caps;
        self
    }

    /// The configured caps this node cannot apply (no such controller), each said in a
    /// sentence: the daemon warns of them at start and runs its volumes without them.
    pub fn unapplied(&self) -> Vec<String> {
        let mut missing = Vec::new();
        let (pids, io) = match self.version {
            Some(Version::V2) => {
                let has = |c: &str| self.v2_controllers.iter().any(|x| x == c);
                (has("pids"), has("io"))
            }
            Some(Version::V1) => (self.others.iter().any(|o| o.pids), self.others.iter().any(|o| o.blkio)),
            None => (false, false),
        };
        if self.caps.pids.is_some() && !pids {
            missing.push(
                "the process cap (--fuse-max-pids): this node has no writable pids cgroup controller".to_string(),
            );
        }
        if !self.caps.io.is_empty() && !io {
            missing.push(
                "the block I/O caps (--fuse-io-max): this node has no writable io (v2) or blkio (v1) cgroup controller"
                    .to_string(),
            );
        }
        missing
    }

    /// Remove the parent in every hierarchy where it is empty, best effort: `rmdir` refuses one
    /// that still holds a group (a staged volume's), which stays for the next start. The
    /// daemon does it at its exit; tests and tools that clean up after a daemon too.
    pub fn remove_parent(&self) {
        for dir in self.parent_dirs() {
            let _ = std::fs::remove_dir(dir);
        }
    }

    /// The parent's directory in every hierarchy its groups span.
    pub fn parent_dirs(&self) -> Vec<PathBuf> {
        let others = self.others.iter().map(|o| o.root.join(&self.name));
        self.parent.iter().cloned().chain(others).collect()
    }

    /// The mount points of the other hierarchies a v1 group spans (empty on v2).
    pub fn other_hierarchies(&self) -> Vec<&Path> {
        self.others.iter().map(|o| o.root.as_path()).collect()
    }

    /// The detected interface.
    pub fn version(&self) -> Option<Version> {
        self.version
    }

    /// `<hierarchy>/<parent>`.
    pub fn parent_dir(&self) -> Option<&Path> {
        self.parent.as_deref()
    }

    /// The group `name` below the parent, as groups are named (relative to the hierarchy's root).
    pub fn group(&self, name: &str) -> String {
        format!("{}/{name}", self.name)
    }

    /// The directory of `group` (relative to the hierarchy's root: plain names, no `..`).
    fn dir(&self, group: &str) -> io::Result<Option<PathBuf>> {
        let Some(root) = &self.root else { return Ok(None) };
        let path = Path::new(group);
        if group.is_empty() || !path.components().all(|c| matches!(c, std::path::Component::Normal(_))) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{group:?} is not a cgroup below the root"),
            ));
        }
        Ok(Some(root.join(path)))
    }

    /// Create `group` (an existing one is reused) and its parents, in every hierarchy it spans,
    /// set or clear its memory limit, and open its `cgroup.procs` files for a new process to
    /// join. `None` when the node has no cgroups and no limit was asked for.
    pub fn prepare(&self, group: &str, memory_limit: Option<u64>) -> io::Result<Option<Joining>> {
        let (Some(dir), Some(version)) = (self.dir(group)?, self.version) else {
            return match memory_limit {
                None => Ok(None),
                Some(_) => Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "the plan sets a memory limit, but this node has no memory cgroup controller",
                )),
            };
        };
        let parent = dir.parent().expect("a group lies below the root");
        std::fs::create_dir_all(parent)
            .map_err(|e| io::Error::new(e.kind(), format!("creating cgroup {}: {e}", parent.display())))?;
        if version == Version::V2 {
            self.enable_v2(parent)?;
        }
        match std::fs::create_dir(&dir) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                return Err(io::Error::new(e.kind(), format!("creating cgroup {}: {e}", dir.display())));
            }
            _ => {}
        }
        if let (Some(prefix), Some(root)) = (self.memory_cpuset, &self.root) {
            // cpuset co-mounted with memory: each group on the way needs CPUs and memory nodes.
            let mut at = root.clone();
            for component in Path::new(group).components() {
                let above = at.clone();
                at.push(component);
                inherit_cpuset(&above, &at, prefix)?;
            }
        }
        let (limit_file, unlimited) = match version {
            Version::V2 => ("memory.max", "max".to_string()),
            // The largest page-aligned value; the kernel reads it as "no limit".
            Version::V1 => ("memory.limit_in_bytes", "-1".to_string()),
        };
        let value = memory_limit.map(|b| b.to_string()).unwrap_or(unlimited);
        write_file(&dir.join(limit_file), &value)?;
        if version == Version::V2 {
            write_file(&dir.join("memory.oom.group"), "1")?;
            self.cap_v2(&dir)?;
        }
        let mut joining = vec![open_procs(&dir)?];
        for other in &self.others {
            let made = other.make(group)?;
            self.cap_v1(other, &made)?;
            joining.push(open_procs(&made)?);
        }
        Ok(Some(Joining(joining)))
    }

    /// Put every process of `group` (as its memory hierarchy lists them) into the group of the
    /// same name in every other hierarchy it spans, making those groups as needed: what a
    /// process started by an earlier daemon, which joined the memory hierarchy only, lacks.
    /// Returns how many memberships it changed; nothing on v2 or without cgroups.
    pub fn settle(&self, group: &str) -> io::Result<usize> {
        if self.others.is_empty() {
            return Ok(0);
        }
        let pids = self.procs(group)?;
        let mut moved = 0;
        for other in &self.others {
            if pids.is_empty() {
                break;
            }
            let dir = other.make(group)?;
            let members = read_procs(&dir)?;
            for pid in pids.iter().filter(|p| !members.contains(p)) {
                match write_file(&dir.join("cgroup.procs"), &pid.to_string()) {
                    Ok(()) => moved += 1,
                    // Exited meanwhile.
                    Err(e) if e.raw_os_error() == Some(nix::libc::ESRCH) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(moved)
    }

    /// The v2 controllers a group needs: `memory`, and those of the caps the root offers.
    fn v2_needed(&self) -> Vec<&'static str> {
        let has = |c: &str| self.v2_controllers.iter().any(|x| x == c);
        let mut needed = vec!["memory"];
        if self.caps.pids.is_some() && has("pids") {
            needed.push("pids");
        }
        if !self.caps.io.is_empty() && has("io") {
            needed.push("io");
        }
        needed
    }

    /// The caps of a v2 group whose controllers are enabled (those the root offers).
    fn cap_v2(&self, dir: &Path) -> io::Result<()> {
        let needed = self.v2_needed();
        if needed.contains(&"pids") {
            write_file(&dir.join("pids.max"), &self.caps.pids.map_or("max".to_string(), |n| n.to_string()))?;
        }
        if needed.contains(&"io") {
            for limit in &self.caps.io {
                write_file(&dir.join("io.max"), &limit.v2_line())?;
            }
        }
        Ok(())
    }

    /// The caps of a group in another v1 hierarchy, if it holds their controller.
    fn cap_v1(&self, other: &Other, dir: &Path) -> io::Result<()> {
        if other.pids {
            write_file(&dir.join("pids.max"), &self.caps.pids.map_or("max".to_string(), |n| n.to_string()))?;
        }
        if other.blkio {
            for limit in &self.caps.io {
                for (file, line) in limit.v1_writes() {
                    write_file(&dir.join(file), &line)?;
                }
            }
        }
        Ok(())
    }

    /// v2 distributes a controller only where every ancestor enables it for its children:
    /// the hierarchy's root, each cgroup on the way down, and the group's parent itself.
    fn enable_v2(&self, parent: &Path) -> io::Result<()> {
        let Some(root) = &self.root else { return Ok(()) };
        let mut dirs = vec![root.clone()];
        for component in parent.strip_prefix(root).unwrap_or(Path::new("")).components() {
            let next = dirs.last().expect("starts with the root").join(component);
            dirs.push(next);
        }
        let needed = self.v2_needed();
        for dir in &dirs {
            let control = dir.join("cgroup.subtree_control");
            let enabled = std::fs::read_to_string(&control)?;
            for controller in &needed {
                if !enabled.split_whitespace().any(|c| c == *controller) {
                    write_file(&control, &format!("+{controller}"))?;
                }
            }
        }
        Ok(())
    }

    /// The pids in `group` (empty when it does not exist).
    pub fn procs(&self, group: &str) -> io::Result<Vec<i32>> {
        let Some(dir) = self.dir(group)? else { return Ok(Vec::new()) };
        read_procs(&dir)
    }

    /// Kill whatever still runs in `group` (SIGKILL; the group's processes were already
    /// asked to stop), reap our children among them, and remove the group. A missing group is
    /// fine. Returns how many processes had to be killed.
    pub fn release(&self, group: &str) -> io::Result<usize> {
        let Some(dir) = self.dir(group)? else { return Ok(0) };
        let killed = self.release_memory_group(group, &dir)?;
        // The same group in the other hierarchies holds the same processes: gone now.
        for other in &self.others {
            remove_group(&other.root.join(group), Instant::now() + RELEASE_BOUND)?;
        }
        Ok(killed)
    }

    fn release_memory_group(&self, group: &str, dir: &Path) -> io::Result<usize> {
        if !dir.exists() {
            return Ok(0);
        }
        let until = Instant::now() + RELEASE_BOUND;
        let mut killed = 0;
        loop {
            let pids = self.procs(group)?;
            if pids.is_empty() {
                match std::fs::remove_dir(dir) {
                    Ok(()) => return Ok(killed),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(killed),
                    // Exiting tasks are still accounted for a moment.
                    Err(e) if e.raw_os_error() == Some(nix::libc::EBUSY) && Instant::now() < until => {}
                    Err(e) => return Err(io::Error::new(e.kind(), format!("removing cgroup {}: {e}", dir.display()))),
                }
            } else {
                let group_kill = dir.join("cgroup.kill");
                if self.version == Some(Version::V2) && group_kill.exists() {
                    write_file(&group_kill, "1")?;
                } else {
                    for &pid in &pids {
                        // Read from the group an instant ago: still a member, not a recycled pid.
                        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                    }
                }
                killed = killed.max(pids.len());
                for &pid in &pids {
                    let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
                }
                if Instant::now() >= until {
                    return Err(io::Error::other(format!(
                        "cgroup {} still holds {} processes {RELEASE_BOUND:?} after SIGKILL",
                        dir.display(),
                        pids.len()
                    )));
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The groups under the parent (`<parent>/<name>`; never anything outside it).
    pub fn groups(&self) -> io::Result<Vec<String>> {
        let Some(parent) = &self.parent else { return Ok(Vec::new()) };
        let entries = match std::fs::read_dir(parent) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                names.push(self.group(&entry.file_name().to_string_lossy()));
            }
        }
        names.sort();
        Ok(names)
    }

    /// How many times the OOM killer killed a process of `group`.
    pub fn oom_kills(&self, group: &str) -> Option<u64> {
        let dir = self.dir(group).ok()??;
        let (file, key) = match self.version? {
            Version::V2 => ("memory.events", "oom_kill"),
            Version::V1 => ("memory.oom_control", "oom_kill"),
        };
        let text = std::fs::read_to_string(dir.join(file)).ok()?;
        text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
    }
}

impl Other {
    /// Make `group` (a path validated by the memory hierarchy's [`Cgroups::dir`]) and its
    /// parents here; its directory. In a cpuset hierarchy every directory on the way gets its
    /// parent's CPUs and memory nodes where it has none (also one a crash left half made).
    fn make(&self, group: &str) -> io::Result<PathBuf> {
        let mut dir = self.root.clone();
        for component in Path::new(group).components() {
            let parent = dir.clone();
            dir.push(component);
            match std::fs::create_dir(&dir) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                    return Err(io::Error::new(e.kind(), format!("creating cgroup {}: {e}", dir.display())));
                }
                _ => {}
            }
            if let Some(prefix) = self.cpuset {
                inherit_cpuset(&parent, &dir, prefix)?;
            }
        }
        Ok(dir)
    }
}

/// Give the cpuset group `dir` its parent's CPUs and memory nodes where it has none (v1 refuses
/// a task into a cpuset without them); `prefix` is the files' (`cpuset.`, or none).
fn inherit_cpuset(parent: &Path, dir: &Path, prefix: &str) -> io::Result<()> {
    for name in ["cpus", "mems"] {
        let file = format!("{prefix}{name}");
        if std::fs::read_to_string(dir.join(&file))?.trim().is_empty() {
            let inherited = std::fs::read_to_string(parent.join(&file))?;
            write_file(&dir.join(&file), inherited.trim())?;
        }
    }
    Ok(())
}

/// `cgroup.procs` of `dir`, opened for a new process to write itself into.
fn open_procs(dir: &Path) -> io::Result<File> {
    let procs = dir.join("cgroup.procs");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&procs)
        .map_err(|e| io::Error::new(e.kind(), format!("opening {}: {e}", procs.display())))
}

/// The pids in the group at `dir` (empty when it does not exist).
fn read_procs(dir: &Path) -> io::Result<Vec<i32>> {
    match std::fs::read_to_string(dir.join("cgroup.procs")) {
        Ok(text) => Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Remove the (emptied) group at `dir`, waiting until `until` for exiting tasks to leave it; a
/// missing one is fine.
fn remove_group(dir: &Path, until: Instant) -> io::Result<()> {
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(nix::libc::EBUSY) && Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(io::Error::new(e.kind(), format!("removing cgroup {}: {e}", dir.display()))),
        }
    }
}

fn write_file(path: &Path, value: &str) -> io::Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .map_err(|e| io::Error::new(e.kind(), format!("writing {value:?} to {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(point: &str, fstype: &str, super_options: &str) -> MountEntry {
        MountEntry {
            mount_id: 1,
            parent_id: 0,
            device: "0:1".into(),
            root: "/".into(),
            mount_point: point.into(),
            mount_options: "rw".into(),
            fstype: fstype.into(),
            source: fstype.into(),
            super_options: super_options.into(),
        }
    }

    #[test]
    fn a_hybrid_layout_uses_the_v1_memory_hierarchy() {
        // systemd's hybrid layout: controllers on v1, an empty v2 at .../unified.
        let dir = tempfile::tempdir().unwrap();
        let (cpu, unified) = (dir.path().join("cpu"), dir.path().join("unified"));
        std::fs::create_dir(&cpu).unwrap();
        std::fs::create_dir(&unified).unwrap();
        let mounts = [
            entry(cpu.to_str().unwrap(), "cgroup", "rw,cpu"),
            entry("/sys/fs/cgroup/memory", "cgroup", "rw,memory"),
            entry(unified.to_str().unwrap(), "cgroup2", "rw"),
        ];
        let c = Cgroups::detect_in(&mounts, "mh");
        assert_eq!(c.version(), Some(Version::V1));
        assert_eq!(c.parent_dir(), Some(Path::new("/sys/fs/cgroup/memory/mh")));
        // Every other hierarchy is joined too, the controller-less unified one included.
        assert_eq!(c.other_hierarchies(), [cpu.as_path(), unified.as_path()]);
    }

    #[test]
    fn hierarchies_it_cannot_write_are_left_out_and_cpusets_are_recognised() {
        let dir = tempfile::tempdir().unwrap();
        let point = |name: &str| {
            let p = dir.path().join(name);
            std::fs::create_dir(&p).unwrap();
            p.to_str().unwrap().to_string()
        };
        let (memory, cpu, cpuset) = (point("memory"), point("cpu"), point("cpuset"));
        let mounts = [
            entry(&memory, "cgroup", "rw,memory,cpuset,noprefix"),
            MountEntry { mount_options: "ro".into(), ..entry(&cpu, "cgroup", "rw,cpu") },
            entry(&cpuset, "cgroup", "rw,cpuset"),
        ];
        let c = Cgroups::detect_in(&mounts, "mh");
        assert_eq!(c.other_hierarchies(), [Path::new(&cpuset)], "the read-only cpu mount is left out");
        assert_eq!(c.memory_cpuset, Some(""), "co-mounted with noprefix: `cpus`, `mems`");
        // A cpuset group gets its parent's CPUs and memory nodes.
        std::fs::write(Path::new(&cpuset).join("cpuset.cpus"), "0-1").unwrap();
        std::fs::write(Path::new(&cpuset).join("cpuset.mems"), "0").unwrap();
        std::fs::create_dir_all(Path::new(&cpuset).join("mh/k")).unwrap();
        for d in ["mh", "mh/k"] {
            for f in ["cpuset.cpus", "cpuset.mems"] {
                std::fs::write(Path::new(&cpuset).join(d).join(f), "").unwrap();
            }
        }
        let made = c.others[0].make("mh/k").unwrap();
        assert_eq!(std::fs::read_to_string(made.join("cpuset.cpus")).unwrap(), "0-1");
        assert_eq!(std::fs::read_to_string(made.join("cpuset.mems")).unwrap(), "0");
    }

    #[test]
    fn a_mount_over_another_at_the_same_place_is_the_one_used() {
        // A container runtime's own read-only cgroup mounts, then the node's mounted over them.
        let mounts = [
            entry("/sys/fs/cgroup/memory", "cgroup", "ro,memory"),
            entry("/sys/fs/cgroup/cpuset", "cgroup", "ro,cpuset"),
            MountEntry { mount_id: 9, ..entry("/sys/fs/cgroup/memory", "cgroup", "rw,memory") },
            MountEntry { mount_id: 10, ..entry("/sys/fs/cgroup/cpuset", "cgroup", "rw,cpuset") },
        ];
        let c = Cgroups::detect_in(&mounts, "mh");
        assert_eq!(c.other_hierarchies(), [Path::new("/sys/fs/cgroup/cpuset")], "each place once");
        assert_eq!(c.others[0].cpuset, Some("cpuset."));
        assert_eq!(visible(&mounts).iter().map(|m| m.mount_id).collect::<Vec<_>>(), [9, 10]);
    }

    #[test]
    fn a_v2_mount_with_the_memory_controller_wins() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cgroup.controllers"), "cpuset cpu io memory pids\n").unwrap();
        let point = dir.path().to_str().unwrap();
        let mounts = [entry("/sys/fs/cgroup/memory", "cgroup", "rw,memory"), entry(point, "cgroup2", "rw")];
        let c = Cgroups::detect_in(&mounts, "mh");
        assert_eq!(c.version(), Some(Version::V2));
        assert_eq!(c.parent_dir(), Some(dir.path().join("mh").as_path()));
    }

    #[test]
    fn without_a_memory_controller_a_limit_is_refused_and_no_limit_runs_ungrouped() {
        let c = Cgroups::detect_in(&[entry("/x", "cgroup", "rw,cpu")], "mh");
        assert_eq!(c.version(), None);
        assert!(c.prepare("mh/v", None).unwrap().is_none());
        let err = c.prepare("mh/v", Some(64 << 20)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::Unsupported);
        assert!(err.to_string().contains("no memory cgroup controller"), "{err}");
        assert_eq!(c.release("mh/v").unwrap(), 0);
        assert!(c.groups().unwrap().is_empty());
    }

    #[test]
    fn a_group_is_a_plain_path_below_the_root() {
        let c = Cgroups::detect_in(&[entry("/sys/fs/cgroup/memory", "cgroup", "rw,memory")], "mh-1");
        assert_eq!(c.group("k"), "mh-1/k");
        assert_eq!(c.dir("mh/k").unwrap(), Some(PathBuf::from("/sys/fs/cgroup/memory/mh/k")));
        for bad in ["", "/abs", "mh/../other", "./mh", ".."] {
            assert_eq!(c.dir(bad).unwrap_err().kind(), io::ErrorKind::InvalidInput, "{bad:?}");
        }
        assert_eq!(c.oom_kills("../x"), None);
    }

    #[test]
    fn caps_a_node_has_no_controller_for_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let point = |name: &str| {
            let p = dir.path().join(name);
            std::fs::create_dir(&p).unwrap();
            p.to_str().unwrap().to_string()
        };
        let (memory, pids, blkio) = (point("memory"), point("pids"), point("blkio"));
        let caps = Caps { pids: Some(64), io: vec![IoLimit::parse("8:0 wbps=1").unwrap()] };
        let full = [
            entry(&memory, "cgroup", "rw,memory"),
            entry(&pids, "cgroup", "rw,pids"),
            entry(&blkio, "cgroup", "rw,blkio"),
        ];
        let c = Cgroups::detect_in(&full, "mh").with_caps(caps.clone());
        assert!(c.unapplied().is_empty(), "{:?}", c.unapplied());
        assert_eq!(c.others.iter().map(|o| (o.pids, o.blkio)).collect::<Vec<_>>(), [(true, false), (false, true)]);
        let c = Cgroups::detect_in(&full[..1], "mh").with_caps(caps.clone());
        let missing = c.unapplied();
        assert_eq!(missing.len(), 2, "{missing:?}");
        assert!(missing[0].contains("--fuse-max-pids") && missing[1].contains("--fuse-io-max"), "{missing:?}");
        // Nothing configured, nothing missing.
        assert!(Cgroups::detect_in(&full[..1], "mh").unapplied().is_empty());
        // v2: what the root's cgroup.controllers lists.
        let v2 = point("v2");
        std::fs::write(Path::new(&v2).join("cgroup.controllers"), "cpu memory pids\n").unwrap();
        let c = Cgroups::detect_in(&[entry(&v2, "cgroup2", "rw")], "mh").with_caps(caps);
        assert_eq!(c.v2_needed(), ["memory", "pids"]);
        let missing = c.unapplied();
        assert!(missing.len() == 1 && missing[0].contains("--fuse-io-max"), "{missing:?}");
    }
}
