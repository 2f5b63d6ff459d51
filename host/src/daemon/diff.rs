//! The diff step of the pipeline: a pure function of what an RPC wants ([`Desired`]: the
//! checked plan's steps, the volume's directories and recorded targets) and one snapshot of
//! what the node has ([`Observed`]: the mount table read once for the operation, and whether
//! the volume's recorded process lives), returning the [`Action`]s still missing, in order.
//!
//! It walks the steps against a copy of the mount table that it updates with each action it
//! emits, so a later step sees what an earlier one will have made (a bind of a sub-path of a
//! FUSE mount about to be restarted, targets re-bound onto a fresh mount).
//!
//! A step the kernel already has is skipped (kubelet retries everything). Where something else
//! is in the way, the mode decides: a stage owns the volume's own directories and replaces
//! what it finds there (leftovers of a crashed attempt); a publish must not take over a target
//! that holds something else, and answers with a [`Conflict`] (gRPC ALREADY_EXISTS).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::exec::mountinfo::MountEntry;
use crate::exec::process::ProcessId;
use crate::plan::Step;
use crate::volume::state::Publication;

/// One effect for the executor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Unmount the top mount at this path (lazily if it is busy or its FUSE server is dead).
    Unmount(PathBuf),
    /// Create the directory `path` and what is missing between `below` (which must exist) and it.
    Mkdir { path: PathBuf, below: PathBuf },
    /// Create a host-owned directory, private (0700).
    PrivateDir(PathBuf),
    /// Run a plan step: spawn-fuse, mount or bind.
    Run(Step),
    /// Stop a process (SIGTERM, grace, SIGKILL).
    Stop(ProcessId),
    /// Kill what is left in the volume's cgroup and remove the group.
    ReleaseGroup,
    /// Remove a directory tree (never through a link or into a mount).
    RemoveTree(PathBuf),
    /// Remove a file, link or empty directory.
    RemoveEntry(PathBuf),
    /// An action of a tear-down whose failure is logged, not fatal, because what follows it
    /// does its work anyway, and neither a backend nor a pod may keep a volume in place by
    /// putting something in its way:
    /// - a plugin's clean-up step at unstage (the host's own tear-down that follows removes the
    ///   volume's directories, whatever a link planted in the step's way);
    /// - at unpublish, the unmount of a mount point strictly below the target (the target's own
    ///   unmount, which follows and stays mandatory, detaches what is left below it; a pod can
    ///   move a mount of its dynamic volume where no path reaches it).
    BestEffort(Box<Action>),
}

/// What the node has, read once per operation.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    /// The mount table.
    pub mounts: &'a [MountEntry],
    /// Whether the volume's recorded process is alive.
    pub process_alive: bool,
    /// Recorded targets whose parent directory is gone (the pod went away): a restage does not
    /// bind them again, and the record forgets them.
    pub gone_targets: &'a BTreeSet<PathBuf>,
}

/// A directory a plan may act in, and where creating it may start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    /// The directory (staging, target, cache, runtime).
    pub path: PathBuf,
    /// The deepest directory that must already exist for it to be created (kubelet's for a
    /// target: its parent).
    pub below: PathBuf,
}

/// What an RPC wants the node to look like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Desired {
    /// NodeStageVolume (and a self-heal restart): the stage plan from scratch at `staging`
    /// (whatever a dead attempt left goes first), then every recorded target re-bound unless it
    /// already shows the staged mount.
    Stage {
        staging: Root,
        /// The host's own directories (cache, runtime), created private.
        host_dirs: Vec<PathBuf>,
        steps: Vec<Step>,
        published: BTreeMap<PathBuf, Publication>,
        process: Option<ProcessId>,
    },
    /// NodePublishVolume: the publish plan at `target`; something else there is a conflict.
    Publish { staging: PathBuf, target: Root, steps: Vec<Step> },
    /// NodeUnpublishVolume: nothing mounted at or below `target`, and no `target`.
    Unpublish { target: PathBuf },
    /// A pod's dynamic mount (`daemon::dynamic`): its checked plan into its own directory
    /// (`target`, below the volume's `mounts/`) from its own cache directory; something else
    /// at the target is a conflict.
    Dynamic { target: Root, cache: Root, steps: Vec<Step> },
    /// NodeUnstageVolume, a rolled-back stage, a volume of an earlier boot: the plugin's clean-up
    /// steps, the process stopped, its cgroup gone, nothing mounted at `staging`, the host's
    /// directories (and what is mounted below them) removed.
    Teardown { staging: PathBuf, host_dirs: Vec<PathBuf>, steps: Vec<Step>, process: Option<ProcessId> },
    /// Host directories no volume claims (start-up): gone, with whatever is mounted below them.
    Removed { dirs: Vec<PathBuf> },
    /// NodeExpandVolume: the expand plan's calls to the volume's running program, each made
    /// (telling a program its size again is harmless); nothing else.
    Expand { steps: Vec<Step> },
}

impl Desired {
    /// Every path the operation can look at or act on: the mount table is read for these only.
    pub fn paths(&self) -> Vec<&Path> {
        let mut out: Vec<&Path> = Vec::new();
        let steps = match self {
            Desired::Stage { staging, host_dirs, steps, published, .. } => {
                out.push(&staging.path);
                out.extend(host_dirs.iter().map(PathBuf::as_path));
                out.extend(published.keys().map(PathBuf::as_path));
                out.extend(published.values().flat_map(|p| p.steps.iter().flat_map(step_paths)));
                steps
            }
            Desired::Publish { staging, target, steps } => {
                out.extend([staging.as_path(), target.path.as_path()]);
                steps
            }
            Desired::Unpublish { target } => return vec![target],
            Desired::Dynamic { target, cache, steps } => {
                out.extend([target.path.as_path(), cache.path.as_path()]);
                steps
            }
            Desired::Teardown { staging, host_dirs, steps, .. } => {
                out.push(staging);
                out.extend(host_dirs.iter().map(PathBuf::as_path));
                steps
            }
            Desired::Removed { dirs } => return dirs.iter().map(PathBuf::as_path).collect(),
            Desired::Expand { steps } => steps,
        };
        out.extend(steps.iter().flat_map(step_paths));
        out
    }

    /// A publish whose plan is a single bind onto its target: when the target does not exist,
    /// the diff needs no mount table (a path that does not exist holds no mount, and nothing
    /// else in the plan is compared with the table), so the pipeline skips reading it.
    pub fn lone_bind_target(&self) -> Option<&Path> {
        match self {
            Desired::Publish { target, steps, .. } => match steps.as_slice() {
                [Step::Bind { target: t, .. }] if *t == target.path => Some(&target.path),
                _ => None,
            },
            // Likewise a dynamic mount: it mounts only onto its own directory (the policy), and
            // its sources are compared with nothing else in the table.
            Desired::Dynamic { target, .. } => Some(&target.path),
            _ => None,
        }
    }

    /// Recorded targets a restage binds again, each with its parent directory (whose presence
    /// is part of the snapshot).
    pub fn recorded_targets(&self) -> impl Iterator<Item = (&Path, PathBuf)> {
        let published = match self {
            Desired::Stage { published, .. } => Some(published.keys()),
            _ => None,
        };
        published.into_iter().flatten().map(|t| (t.as_path(), parent(t)))
    }
}

/// The paths one step names.
fn step_paths(step: &Step) -> Vec<&Path> {
    match step {
        Step::Mkdir { path } | Step::Remove { path } => vec![path],
        Step::SpawnFuse { mountpoint, .. } => vec![mountpoint],
        Step::Mount { target, source, .. } => {
            let mut v = vec![target.as_path()];
            if source.starts_with('/') {
                v.push(Path::new(source));
            }
            v
        }
        Step::Bind { source, target, .. } => vec![source, target],
        Step::Unpack { dest, .. } => vec![dest],
        Step::Socket { path } => vec![path],
        Step::SocketCall { socket, .. } => vec![socket],
        Step::Fetch { .. }
        | Step::Http { .. }
        | Step::Resolve { .. }
        | Step::FetchBlob { .. }
        | Step::Lookup { .. } => vec![],
    }
}

/// Something else is in the way of a publish.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Conflict {
    /// The target holds another mount, or this volume with other flags.
    #[error("{} already holds {what}; unpublish it first", path.display())]
    Occupied { path: PathBuf, what: String },
    /// The step kind is not executed by this host version.
    #[error("{kind} steps are not supported by this host version yet")]
    Unsupported { kind: &'static str },
}

/// The mount table as the actions so far will have left it, and the directories they made.
struct Table {
    mounts: Vec<MountEntry>,
    fresh: u32,
    made: std::collections::BTreeSet<PathBuf>,
}

impl Table {
    fn at(&self, path: &Path) -> Option<&MountEntry> {
        self.mounts.iter().rev().find(|m| m.mount_point == path)
    }

    fn stacked(&self, path: &Path) -> usize {
        self.mounts.iter().filter(|m| m.mount_point == path).count()
    }

    /// The mount `path` lies on, and the path's place inside it (as mountinfo's `root` shows a
    /// bind of it).
    fn containing(&self, path: &Path) -> Option<(&MountEntry, PathBuf)> {
        // The deepest mount point containing `path`; of several stacked there, the top one
        // (`max_by_key` keeps the last of equals, and the table lists the top last).
        let m = self
            .mounts
            .iter()
            .filter(|m| path.starts_with(&m.mount_point))
            .max_by_key(|m| m.mount_point.as_os_str().len())?;
        let rel = path.strip_prefix(&m.mount_point).expect("filtered by starts_with");
        Some((m, m.root.join(rel)))
    }

    /// Unmount everything at `path`.
    fn clear(&mut self, path: &Path, out: &mut Vec<Action>) {
        for _ in 0..self.stacked(path) {
            out.push(Action::Unmount(path.to_path_buf()));
        }
        if self.stacked(path) > 0 {
            // What was made on the mount is gone with it.
            self.made.retain(|p| !p.starts_with(path) || p == path);
        }
        self.mounts.retain(|m| m.mount_point != path);
    }

    /// Unmount everything strictly below or at `dir`, deepest first.
    fn clear_below(&mut self, dir: &Path, out: &mut Vec<Action>) {
        let mut below: Vec<PathBuf> =
            self.mounts.iter().map(|m| m.mount_point.clone()).filter(|p| p.starts_with(dir)).collect();
        below.sort();
        below.dedup();
        for p in below.iter().rev() {
            self.clear(p, out);
        }
    }

    fn push(&mut self, at: &Path, fstype: &str, source: &str, device: Option<(String, PathBuf)>, readonly: bool) {
        // Directories made below `at` are hidden by the new mount: make them again if asked.
        self.made.retain(|p| !p.starts_with(at) || p == at);
        self.fresh += 1;
        let (device, root) = device.unwrap_or_else(|| (format!("new:{}", self.fresh), PathBuf::from("/")));
        self.mounts.push(MountEntry {
            mount_id: 0,
            parent_id: 0,
            device,
            root,
            mount_point: at.to_path_buf(),
            mount_options: if readonly { "ro".into() } else { "rw".into() },
            fstype: fstype.into(),
            source: source.into(),
            super_options: String::new(),
        });
    }
}

/// Whether something in the way is replaced (the volume's own directories) or refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Replace,
    Refuse,
}

/// The actions that bring the node from `observed` to `desired`.
pub fn diff(desired: &Desired, observed: Observed<'_>) -> Result<Vec<Action>, Conflict> {
    let mut t = Table { mounts: observed.mounts.to_vec(), fresh: 0, made: Default::default() };
    let mut out = Vec::new();
    match desired {
        Desired::Stage { staging, host_dirs, steps, published, process } => {
            if let Some(p) = process.filter(|_| observed.process_alive) {
                out.push(Action::Stop(p));
            }
            out.push(Action::ReleaseGroup);
            t.clear(&staging.path, &mut out);
            mkdir(&mut t, &staging.path, staging.below.clone(), &mut out);
            out.extend(host_dirs.iter().cloned().map(Action::PrivateDir));
            let mut roots = vec![staging.clone()];
            roots.extend(host_dirs.iter().map(|d| Root { path: d.clone(), below: d.clone() }));
            walk(steps, &roots, Mode::Replace, &mut t, &mut out)?;
            // Targets still showing the staged mount keep it; the others are bound again, except
            // those whose pod directory is gone (one pod that went away must not keep the volume
            // from being staged).
            let staged = t.at(&staging.path).map(|m| m.device.clone());
            for (target, p) in published {
                if observed.gone_targets.contains(target) {
                    continue;
                }
                if p.dynamic.is_some() {
                    // The host's tmpfs at the target stays (with the pod's socket and mounts);
                    // the steps bind the volume again below it where it is stale.
                    let roots = [Root { path: target.clone(), below: parent(target) }, staging.clone()];
                    walk(&p.steps, &roots, Mode::Replace, &mut t, &mut out)?;
                    continue;
                }
                if staged.is_some() && t.at(target).map(|m| &m.device) == staged.as_ref() {
                    continue;
                }
                t.clear(target, &mut out);
                let roots = [Root { path: target.clone(), below: parent(target) }, staging.clone()];
                let default_bind;
                let steps = if p.steps.is_empty() {
                    default_bind = [Step::Bind {
                        source: staging.path.clone(),
                        target: target.clone(),
                        readonly: p.readonly,
                        options: Vec::new(),
                    }];
                    &default_bind[..]
                } else {
                    &p.steps[..]
                };
                walk(steps, &roots, Mode::Replace, &mut t, &mut out)?;
            }
        }
        Desired::Publish { staging, target, steps } => {
            let roots = [target.clone(), Root { path: staging.clone(), below: staging.clone() }];
            walk(steps, &roots, Mode::Refuse, &mut t, &mut out)?;
        }
        Desired::Unpublish { target } => {
            // Deepest first, the target's own mounts last. Those strictly below it are best effort:
            // everything below the target may be the pod's doing (a dynamic volume's pod can rename
            // `mounts/` into a directory chain deeper than PATH_MAX, which the executor reaches
            // only by resolving in pieces), so a mount point there may be hard to reach, and one
            // failure must not fail every unpublish of the volume for ever. The target's own
            // unmounts stay mandatory and do the rest: with a child mount left, umount(2) of the
            // target fails with EBUSY, `Node::unmount` (pipeline.rs) then detaches it lazily
            // (MNT_DETACH), and a detach takes the whole subtree with it. When the target has no
            // mount of its own, no unmount of it follows, but a mount left below means an entry
            // left in the target directory, so removing it fails (not empty) and the unpublish
            // answers an error rather than OK with a mount left behind.
            let mut unmounts = Vec::new();
            t.clear_below(target, &mut unmounts);
            out.extend(unmounts.into_iter().map(|a| match a {
                Action::Unmount(p) if p != *target => Action::BestEffort(Box::new(Action::Unmount(p))),
                a => a,
            }));
            out.push(Action::RemoveEntry(target.clone()));
        }
        Desired::Dynamic { target, cache, steps } => {
            out.push(Action::PrivateDir(cache.path.clone()));
            walk(steps, &[target.clone(), cache.clone()], Mode::Refuse, &mut t, &mut out)?;
        }
        Desired::Teardown { staging, host_dirs, steps, process } => {
            let roots: Vec<Root> =
                std::iter::once(staging).chain(host_dirs).map(|d| Root { path: d.clone(), below: d.clone() }).collect();
            let mut plugin = Vec::new();
            walk(steps, &roots, Mode::Replace, &mut t, &mut plugin)?;
            out.extend(plugin.into_iter().map(|a| Action::BestEffort(Box::new(a))));
            if let Some(p) = process.filter(|_| observed.process_alive) {
                out.push(Action::Stop(p));
            }
            out.push(Action::ReleaseGroup);
            t.clear(staging, &mut out);
            for d in host_dirs {
                t.clear_below(d, &mut out);
                out.push(Action::RemoveTree(d.clone()));
            }
        }
        Desired::Removed { dirs } => {
            for d in dirs {
                t.clear_below(d, &mut out);
                out.push(Action::RemoveTree(d.clone()));
            }
        }
        Desired::Expand { steps } => {
            for step in steps {
                match step {
                    Step::SocketCall { .. } => out.push(Action::Run(step.clone())),
                    other => return Err(Conflict::Unsupported { kind: other.kind() }),
                }
            }
        }
    }
    Ok(out)
}

/// Create `path` unless an earlier action already did (and no mount has hidden it since).
fn mkdir(t: &mut Table, path: &Path, below: PathBuf, out: &mut Vec<Action>) {
    if t.made.insert(path.to_path_buf()) {
        out.push(Action::Mkdir { path: path.to_path_buf(), below });
    }
}

fn parent(p: &Path) -> PathBuf {
    p.parent().unwrap_or(p).to_path_buf()
}

/// Where creating `path` may start: the root it lies in (its own `below` if it is the root).
fn below(path: &Path, roots: &[Root]) -> PathBuf {
    roots
        .iter()
        .filter(|r| path.starts_with(&r.path))
        .max_by_key(|r| r.path.as_os_str().len())
        .map(|r| if r.path == path { r.below.clone() } else { r.path.clone() })
        .unwrap_or_else(|| parent(path))
}

fn walk(steps: &[Step], roots: &[Root], mode: Mode, t: &mut Table, out: &mut Vec<Action>) -> Result<(), Conflict> {
    for step in steps {
        match step {
            Step::Mkdir { path } => mkdir(t, path, below(path, roots), out),
            Step::Remove { path } => {
                t.clear_below(path, out);
                out.push(Action::RemoveTree(path.clone()));
            }
            Step::SpawnFuse { mountpoint, fstype, .. } => {
                t.clear(mountpoint, out);
                mkdir(t, mountpoint, below(mountpoint, roots), out);
                out.push(Action::Run(step.clone()));
                t.push(mountpoint, fstype, "", None, false);
            }
            Step::Mount { fstype, source, target, readonly, .. } => {
                if let Some(m) = t.at(target) {
                    if &m.fstype == fstype && &m.source == source && m.is_readonly() == *readonly {
                        continue;
                    }
                    if mode == Mode::Refuse {
                        let what = format!("a {} mount of {}", m.fstype, m.source);
                        return Err(Conflict::Occupied { path: target.clone(), what });
                    }
                    t.clear(target, out);
                }
                mkdir(t, target, below(target, roots), out);
                out.push(Action::Run(step.clone()));
                t.push(target, fstype, source, None, *readonly);
            }
            Step::Bind { source, target, readonly, .. } => {
                let from = t.containing(source).map(|(m, root)| (m.device.clone(), root, m.fstype.clone()));
                if let Some(m) = t.at(target) {
                    let same = from.as_ref().is_some_and(|(dev, root, _)| &m.device == dev && &m.root == root);
                    if same && m.is_readonly() == *readonly {
                        continue;
                    }
                    if mode == Mode::Refuse {
                        let what = format!(
                            "{} ({} {})",
                            if same { "this volume with other flags" } else { "another mount" },
                            m.fstype,
                            if m.is_readonly() { "read-only" } else { "read-write" }
                        );
                        return Err(Conflict::Occupied { path: target.clone(), what });
                    }
                    t.clear(target, out);
                }
                mkdir(t, target, below(target, roots), out);
                out.push(Action::Run(step.clone()));
                let fstype = from.as_ref().map(|f| f.2.clone()).unwrap_or_else(|| "none".into());
                t.push(target, &fstype, "", from.map(|(d, r, _)| (d, r)), *readonly);
            }
            // The artifact was resolved and its blobs are in the node's cache before a plan
            // that names them is diffed (daemon/pull.rs): nothing left to do for these.
            Step::Resolve { .. } | Step::FetchBlob { .. } => {}
            // Unpacking links files from the cache; doing it again over a complete tree is a
            // no-op, so it always runs (a stage builds its directories from scratch anyway).
            Step::Unpack { .. } => out.push(Action::Run(step.clone())),
            // The host's own step of a dynamic volume's publication: serve its socket (the
            // executor checks what is there, so it always runs).
            Step::Socket { .. } => out.push(Action::Run(step.clone())),
            // Telling a running program something (an expansion): always.
            Step::SocketCall { .. } => out.push(Action::Run(step.clone())),
            // Answered while planning; never part of a plan that runs (unpriv/lookup.rs strips it).
            Step::Lookup { .. } => {}
            Step::Fetch { .. } | Step::Http { .. } => {
                return Err(Conflict::Unsupported { kind: step.kind() });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
