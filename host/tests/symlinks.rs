//! Symbolic links planted at every path a node plan touches, against the real executor. Needs
//! root (as the node daemon has, and CI is).
//!
//! An in-process [`Node`] over [`Linux`] (the new mount API with `openat2`, and the legacy
//! `mount(2)` with a component walk), anchored at a temporary kubelet directory and state
//! directory, runs volumes of the `paths` test plugin, whose plans touch a path in every
//! directory a volume has: the staging directory (a tmpfs, with `data/sub` made inside), the
//! target, and the volume's cache (`c/d`) and runtime (`r`) directories.
//!
//! For each of those paths, and each of their components below kubelet's directory or the
//! state directory, a link replaces the directory before the RPC that touches it: first to
//! `outside/etc` (standing for the node's `/etc`, holding the names plans touch), then
//! (relative) to a neighbouring volume's staging directory. Each case proves:
//! - nothing in `outside` or the neighbour was created, removed or changed (a snapshot of both
//!   trees: names, types, modes, owners, inodes, times, contents);
//! - nothing was mounted onto them or bound from them: every mount the case added is volume
//!   a's own tmpfs or a bind of it, and after clean-up the table is exactly what it was;
//! - a refused RPC answers FAILED_PRECONDITION with a message naming the link; an RPC that
//!   answers OK did so without following the link (it removed the link, or never used the path).
//!
//! Two race tests swap a directory with a link (`renameat2(RENAME_EXCHANGE)`) as fast as they
//! can while publishing and unpublishing in a loop: `data/sub` with a link to `outside/etc` (each
//! publish is refused, or shows the volume's own file), and the target's parent with a link to
//! the neighbour's (whose published target is never unmounted, stacked on or removed). A third
//! test of the second race checks the error class: a link met mid-race is refused as a link.
//!
//! Each test runs in its own private mount namespace (`common::in_private_namespace`).

use std::collections::{BTreeMap, HashSet};
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

mod common;

use common::in_private_namespace;
use mounthost::config::Config;
use mounthost::daemon::Node;
use mounthost::exec::Linux;
use mounthost::exec::cgroup::Cgroups;
use mounthost::exec::mountinfo::{self, MountEntry};
use mounthost::plan::policy::Grant;
use mounthost::plugin::PluginRuntime;
use mounthost::proto::csi;
use mounthost::volume::dirs::volume_key;
use tonic::{Code, Status};

/// What volume a's backend wrote (the file a pod must see through its target).
const MARKER_A: &str = "volume a";
/// What the neighbour holds.
const MARKER_B: &str = "volume b";

/// One volume's paths, as kubelet and the host name them.
struct Vol {
    id: &'static str,
    staging: PathBuf,
    target: PathBuf,
    cache: PathBuf,
    runtime: PathBuf,
}

/// A node over the real executor, volume b staged and published (the neighbour), volume a not.
struct Env {
    dir: tempfile::TempDir,
    kubelet: PathBuf,
    state: PathBuf,
    /// `outside/etc`, the stand-in for the node's `/etc`.
    etc: PathBuf,
    node: Node,
    rt: tokio::runtime::Runtime,
    a: Vol,
    b: Vol,
    /// The mount table with b staged and a absent.
    baseline: Vec<MountEntry>,
    /// Snapshots of `outside` and of the neighbour's directories, taken with the baseline.
    untouched: BTreeMap<PathBuf, String>,
}

fn mount_cap() -> csi::VolumeCapability {
    use csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
    csi::VolumeCapability {
        access_mode: Some(AccessMode { mode: Mode::SingleNodeMultiWriter as i32 }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

impl Env {
    fn new(legacy: bool) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let (kubelet, state) = (base.join("kubelet"), base.join("state"));
        let etc = base.join("outside/etc");
        // The names plans touch exist here, so a removal that followed a link would show.
        for d in ["c/d", "d", "r", "data/sub", "sub", "mount", "globalmount"] {
            std::fs::create_dir_all(etc.join(d)).unwrap();
            std::fs::write(etc.join(d).join("keep"), b"outside").unwrap();
        }
        std::fs::write(etc.join("passwd"), b"root:x:0:0:root:/root:/bin/sh\n").unwrap();
        std::fs::create_dir_all(&kubelet).unwrap();
        let mut config = Config::new(state.clone());
        config.kubelet_dir = kubelet.clone();
        config.plugin_concurrency = 4;
        config.grants.insert("paths".into(), Grant { fstypes: ["tmpfs".to_string()].into(), ..Grant::default() });
        std::fs::create_dir_all(&config.plugin_dir).unwrap();
        std::fs::copy(mounthost::stock::fixtures::path("paths"), config.plugin_dir.join("paths.wasm")).unwrap();
        let runtime = Arc::new(PluginRuntime::new(config.runtime()).unwrap());
        let linux = Linux::new(Cgroups::none(), [kubelet.clone(), state.clone()]);
        let exec = Arc::new(if legacy { linux.legacy() } else { linux });
        let node = Node::new(config, runtime, exec).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let vol = |id: &'static str, pod: &str, pv: &str| {
            use sha2::Digest;
            let hash = hex::encode(sha2::Sha256::digest(pv.as_bytes()));
            let staging = kubelet.join(format!("plugins/kubernetes.io/csi/csi.mounthost.dev/{hash}/globalmount"));
            let target = kubelet.join(format!("pods/{pod}/volumes/kubernetes.io~csi/{pv}/mount"));
            // kubelet makes the staging directory and the target's parent.
            std::fs::create_dir_all(&staging).unwrap();
            std::fs::create_dir_all(target.parent().unwrap()).unwrap();
            let key = volume_key(id);
            Vol {
                id,
                staging,
                target,
                cache: state.join("cache/volumes").join(&key),
                runtime: state.join("run").join(key),
            }
        };
        let (a, b) = (vol("paths~vol-a", "pod-a", "pv-a"), vol("paths~vol-b", "pod-b", "pv-b"));
        let mut env =
            Env { dir, kubelet, state, etc, node, rt, a, b, baseline: Vec::new(), untouched: BTreeMap::new() };
        env.stage(&env.b).unwrap();
        std::fs::write(env.b.staging.join("marker"), MARKER_B).unwrap();
        std::fs::write(env.b.staging.join("data/sub/marker"), MARKER_B).unwrap();
        env.publish(&env.b).unwrap();
        env.baseline = mountinfo::read().unwrap();
        env.untouched = env.watched();
        env
    }

    fn stage(&self, v: &Vol) -> Result<(), Status> {
        let req = csi::NodeStageVolumeRequest {
            volume_id: v.id.into(),
            staging_target_path: s(&v.staging),
            volume_capability: Some(mount_cap()),
            volume_context: [("plugin".to_string(), "paths".to_string())].into(),
            ..Default::default()
        };
        self.rt.block_on(self.node.stage(req)).map_err(Status::from)
    }

    fn publish(&self, v: &Vol) -> Result<(), Status> {
        let req = csi::NodePublishVolumeRequest {
            volume_id: v.id.into(),
            staging_target_path: s(&v.staging),
            target_path: s(&v.target),
            volume_capability: Some(mount_cap()),
            volume_context: [("plugin".to_string(), "paths".to_string())].into(),
            ..Default::default()
        };
        self.rt.block_on(self.node.publish(req)).map_err(Status::from)
    }

    fn unpublish(&self, v: &Vol) -> Result<(), Status> {
        let req = csi::NodeUnpublishVolumeRequest { volume_id: v.id.into(), target_path: s(&v.target) };
        self.rt.block_on(self.node.unpublish(req)).map_err(Status::from)
    }

    fn unstage(&self, v: &Vol) -> Result<(), Status> {
        let req = csi::NodeUnstageVolumeRequest { volume_id: v.id.into(), staging_target_path: s(&v.staging) };
        self.rt.block_on(self.node.unstage(req)).map_err(Status::from)
    }

    /// Stage volume a and write its backend's file into `data/sub`.
    fn stage_a(&self) {
        self.stage(&self.a).expect("staging volume a");
        std::fs::write(self.a.staging.join("data/sub/marker"), MARKER_A).unwrap();
    }

    /// What must never change: `outside` and the neighbour's directories (its staging mount,
    /// its target's directory with its published target, its cache and runtime directories).
    fn guarded(&self) -> [&Path; 5] {
        let b = &self.b;
        [self.etc.parent().unwrap(), &b.staging, b.target.parent().unwrap(), &b.cache, &b.runtime]
    }

    /// Snapshots of the guarded trees.
    fn watched(&self) -> BTreeMap<PathBuf, String> {
        let mut out = BTreeMap::new();
        for root in self.guarded() {
            snapshot(root, &mut out);
        }
        out
    }

    /// What is wrong with the mount table now: a mount onto `outside` or the neighbour, a new
    /// mount that is neither volume a's own tmpfs nor a bind of it, a mount of the baseline gone.
    fn strays(&self) -> Vec<String> {
        let table = mountinfo::read().unwrap();
        let known: HashSet<u32> = self.baseline.iter().map(|m| m.mount_id).collect();
        let devices: HashSet<&str> = self.baseline.iter().map(|m| m.device.as_str()).collect();
        let new: Vec<&MountEntry> = table.iter().filter(|m| !known.contains(&m.mount_id)).collect();
        // Volume a's tmpfs: a fresh superblock of the plugin's mount.
        let own: HashSet<&str> = new
            .iter()
            .filter(|m| m.fstype == "tmpfs" && m.source == "tmpfs" && m.root == Path::new("/"))
            .map(|m| m.device.as_str())
            .filter(|d| !devices.contains(d))
            .collect();
        let guarded = self.guarded();
        let mut out = Vec::new();
        for m in &new {
            if guarded.iter().any(|g| m.mount_point.starts_with(g)) {
                out.push(format!("mounted onto a guarded path: {m:?}"));
            } else if !own.contains(m.device.as_str()) {
                out.push(format!("a mount that is not volume a's own: {m:?}"));
            }
        }
        let ids: HashSet<u32> = table.iter().map(|m| m.mount_id).collect();
        out.extend(self.baseline.iter().filter(|m| !ids.contains(&m.mount_id)).map(|m| format!("mount gone: {m:?}")));
        out
    }

    /// Whatever changed in `outside` or the neighbour since the start.
    fn changed(&self) -> Vec<String> {
        diff_snapshots(&self.untouched, &self.watched())
    }
}

impl Drop for Env {
    /// Detach what is left below the temporary directory, deepest first.
    fn drop(&mut self) {
        let mut left = common::mounts_below(self.dir.path());
        left.sort();
        for m in left.iter().rev() {
            let _ = nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// Every entry below `root` (the root included, never following a link): type, mode, owner,
/// inode, modification and change times, and a file's content or a link's target.
fn snapshot(root: &Path, out: &mut BTreeMap<PathBuf, String>) {
    let m = match std::fs::symlink_metadata(root) {
        Ok(m) => m,
        Err(e) => {
            out.insert(root.to_path_buf(), format!("unreadable: {e}"));
            return;
        }
    };
    let t = m.file_type();
    let what = if t.is_symlink() {
        format!("link to {}", std::fs::read_link(root).unwrap().display())
    } else if t.is_file() {
        format!("file {:?}", String::from_utf8_lossy(&std::fs::read(root).unwrap()))
    } else if t.is_dir() {
        "dir".to_string()
    } else {
        "other".to_string()
    };
    let times = (m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec());
    let line = format!("{what} mode {:o} owner {}:{} inode {} times {times:?}", m.mode(), m.uid(), m.gid(), m.ino());
    out.insert(root.to_path_buf(), line);
    if t.is_dir() {
        let mut names: Vec<_> = std::fs::read_dir(root).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        for n in names {
            snapshot(&root.join(n), out);
        }
    }
}

fn diff_snapshots(before: &BTreeMap<PathBuf, String>, after: &BTreeMap<PathBuf, String>) -> Vec<String> {
    let mut out = Vec::new();
    for (p, was) in before {
        match after.get(p) {
            None => out.push(format!("{} removed (was {was})", p.display())),
            Some(now) if now != was => out.push(format!("{} changed: {was} -> {now}", p.display())),
            Some(_) => {}
        }
    }
    out.extend(
        after.iter().filter(|(p, _)| !before.contains_key(*p)).map(|(p, n)| format!("{} created: {n}", p.display())),
    );
    out
}

/// Where `at` is moved while a link takes its place.
fn aside(at: &Path) -> PathBuf {
    at.with_file_name(format!("{}.real", at.file_name().unwrap().to_string_lossy()))
}

/// Where `p` is while `at` is moved aside.
fn current(p: &Path, at: &Path) -> PathBuf {
    match p.strip_prefix(at) {
        Ok(rest) => aside(at).join(rest),
        Err(_) => p.to_path_buf(),
    }
}

/// The relative path from the directory `from` to `to`.
fn relative(from: &Path, to: &Path) -> PathBuf {
    let (f, t): (Vec<_>, Vec<_>) = (from.components().collect(), to.components().collect());
    let common = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..f.len() {
        out.push("..");
    }
    out.extend(&t[common..]);
    out
}

/// The RPC a case attacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rpc {
    Stage,
    Publish,
    Unpublish,
    Unstage,
}

/// What the RPC must answer with a link at the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// FAILED_PRECONDITION, naming the link.
    Refused,
    /// OK: the path is the RPC's to remove, and it removed the link itself.
    Removed,
    /// OK: the RPC never uses the path by name (nothing is mounted at the staging path, so
    /// nothing is unmounted there); the link is left as it is.
    Unused,
}

struct Case {
    rpc: Rpc,
    /// The path a link replaces.
    at: PathBuf,
    expect: Expect,
}

/// The components of `path` below `anchor` (`anchor/x`, `anchor/x/y`, ..., `path`).
fn components(anchor: &Path, path: &Path) -> Vec<PathBuf> {
    let mut at = anchor.to_path_buf();
    path.strip_prefix(anchor)
        .unwrap()
        .iter()
        .map(|c| {
            at.push(c);
            at.clone()
        })
        .collect()
}

fn cases(env: &Env) -> Vec<Case> {
    use Expect::*;
    use Rpc::*;
    let a = &env.a;
    let staging = components(&env.kubelet, &a.staging);
    let target = components(&env.kubelet, &a.target);
    let host: Vec<PathBuf> = [components(&env.state, &a.cache), components(&env.state, &a.runtime)].concat();
    let own = [a.cache.join("c"), a.cache.join("c/d"), a.runtime.join("r")];
    let mut out = Vec::new();
    let mut add = |rpc, paths: &[PathBuf], expect: &dyn Fn(&Path) -> Expect| {
        out.extend(paths.iter().map(|p| Case { rpc, at: p.clone(), expect: expect(p) }));
    };
    // Stage makes the staging directory, the host's directories and what the plan names inside.
    add(Stage, &staging, &|_| Refused);
    add(Stage, &host, &|_| Refused);
    add(Stage, &own, &|_| Refused);
    // Publish makes the target and binds staging/data/sub: the staging mount point itself
    // cannot be replaced while mounted.
    add(Publish, &target, &|_| Refused);
    add(Publish, &staging[..staging.len() - 1], &|_| Refused);
    add(Publish, &[a.staging.join("data"), a.staging.join("data/sub")], &|_| Refused);
    // Unpublish unmounts and removes the target (a link there is removed, never followed).
    add(Unpublish, &target, &|p| if p == a.target { Removed } else { Refused });
    // Unstage removes what the plan names (best effort: a link in the way of a plugin's step is
    // logged), then the host's directories, removing a link in their place without following it;
    // it unmounts the staging path only if the mount table shows a mount there.
    add(Unstage, &staging, &|_| Unused);
    add(Unstage, &host, &|p| if p == a.cache || p == a.runtime { Removed } else { Refused });
    add(Unstage, &own, &|_| Removed);
    out
}

/// What one pass of the sweep saw.
#[derive(Default)]
struct Tally {
    refused: usize,
    removed: usize,
    unused: usize,
    problems: Vec<String>,
}

/// Plant a link at `case.at` (to `outside/etc`, or to the neighbour's staging directory), run
/// the RPC, check, restore, clean up, check again.
fn run_case(env: &Env, case: &Case, to_neighbour: bool, tally: &mut Tally) {
    let a = &env.a;
    let at = &case.at;
    let mut problems = Vec::new();
    let mut problem = |what: String| problems.push(what);
    // The volume as the RPC finds it.
    match case.rpc {
        Rpc::Stage => {}
        Rpc::Publish | Rpc::Unstage => env.stage_a(),
        Rpc::Unpublish => {
            env.stage_a();
            env.publish(a).expect("publishing volume a");
        }
    }
    // A mount point cannot be renamed: the mount goes first (something else unmounted it).
    if (case.rpc, at) == (Rpc::Unpublish, &a.target) || (case.rpc, at) == (Rpc::Unstage, &a.staging) {
        nix::mount::umount2(at, nix::mount::MntFlags::empty()).unwrap();
    }
    if let Some(parent) = at.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    let moved = std::fs::symlink_metadata(at).is_ok();
    if moved {
        std::fs::rename(at, aside(at)).unwrap();
    }
    let dest =
        if to_neighbour { relative(at.parent().unwrap(), &current(&env.b.staging, at)) } else { env.etc.clone() };
    symlink(&dest, at).unwrap();

    let result = match case.rpc {
        Rpc::Stage => env.stage(a),
        Rpc::Publish => env.publish(a),
        Rpc::Unpublish => env.unpublish(a),
        Rpc::Unstage => env.unstage(a),
    };
    let strays = env.strays();
    let link_left = std::fs::read_link(at).ok();

    // Restore, then the outcome.
    match std::fs::symlink_metadata(at) {
        Ok(m) if m.file_type().is_symlink() => std::fs::remove_file(at).unwrap(),
        Ok(_) => problem(format!("the link was replaced by something else ({:?})", std::fs::symlink_metadata(at))),
        Err(_) => {}
    }
    // A directory moved aside inside the volume's own cache or runtime directory goes with it
    // when the RPC tears those down; one of those directories moved aside itself is left where
    // it was moved (the host removed the link in its place and knows nothing else), and goes.
    let torn_down = [&a.cache, &a.runtime].iter().any(|d| at.starts_with(d) && std::fs::symlink_metadata(d).is_err());
    if moved && !torn_down {
        std::fs::rename(aside(at), at).unwrap();
    } else if moved && (at == &a.cache || at == &a.runtime) {
        std::fs::remove_dir_all(aside(at)).unwrap();
    }
    let named = |st: &Status| st.message().contains(&format!("{} is a symbolic link", at.display()));
    match (case.expect, &result) {
        (Expect::Refused, Err(st)) if st.code() == Code::FailedPrecondition && named(st) => tally.refused += 1,
        (Expect::Removed, Ok(())) if link_left.is_none() => tally.removed += 1,
        (Expect::Unused, Ok(())) if link_left.as_deref() == Some(dest.as_path()) => tally.unused += 1,
        _ => problem(format!(
            "expected {:?}, got {:?} (link {})",
            case.expect,
            result.as_ref().map_err(|st| (st.code(), st.message())),
            if link_left.is_some() { "left" } else { "removed" }
        )),
    }
    for s in strays {
        problem(s);
    }
    // Clean up as kubelet would, and nothing of volume a may be left.
    if let Err(st) = env.unpublish(a) {
        problem(format!("clean-up unpublish: {st:?}"));
    }
    if let Err(st) = env.unstage(a) {
        problem(format!("clean-up unstage: {st:?}"));
    }
    let table = mountinfo::read().unwrap();
    if table != env.baseline {
        let extra: Vec<_> = table.iter().filter(|m| !env.baseline.contains(m)).collect();
        problem(format!("the mount table differs after clean-up; extra: {extra:?}"));
    }
    if env.node.store().load(a.id).unwrap().is_some() {
        problem("volume a is still recorded after clean-up".into());
    }
    for d in [&a.cache, &a.runtime] {
        if std::fs::symlink_metadata(d).is_ok() {
            problem(format!("{} is left after clean-up", d.display()));
        }
    }
    for c in env.changed() {
        problem(c);
    }
    let to = if to_neighbour { "the neighbour" } else { "outside" };
    tally
        .problems
        .extend(problems.into_iter().map(|p| format!("{:?} with a link to {to} at {}: {p}", case.rpc, at.display())));
}

/// The checks are not blind: escapes made by hand (a file created and removed again in
/// `outside`, `outside/etc` bound into kubelet's tree, a tmpfs mounted onto the neighbour) are
/// seen. The snapshots are taken again afterwards.
fn checks_see_escapes(env: &mut Env) {
    use nix::mount::{MntFlags, MsFlags, mount, umount2};
    let planted = env.etc.join("planted");
    std::fs::write(&planted, b"x").unwrap();
    assert!(env.changed().iter().any(|c| c.contains("planted created")), "{:?}", env.changed());
    std::fs::remove_file(&planted).unwrap();
    assert!(env.changed().iter().any(|c| c.contains("etc changed")), "{:?}", env.changed());
    let spot = env.a.target.with_file_name("canary");
    std::fs::create_dir(&spot).unwrap();
    mount(Some(&env.etc), &spot, None::<&str>, MsFlags::MS_BIND, None::<&str>).unwrap();
    assert!(env.strays().iter().any(|s| s.contains("not volume a's own")), "{:?}", env.strays());
    umount2(&spot, MntFlags::empty()).unwrap();
    std::fs::remove_dir(&spot).unwrap();
    let data = env.b.staging.join("data");
    mount(Some("tmpfs"), &data, Some("tmpfs"), MsFlags::empty(), None::<&str>).unwrap();
    assert!(env.strays().iter().any(|s| s.contains("onto a guarded path")), "{:?}", env.strays());
    umount2(&data, MntFlags::empty()).unwrap();
    assert!(env.strays().is_empty(), "{:?}", env.strays());
    env.untouched = env.watched();
}

fn sweep(legacy: bool) {
    let api = if legacy { "legacy" } else { "new api" };
    let t0 = Instant::now();
    let mut env = Env::new(legacy);
    checks_see_escapes(&mut env);
    let cases = cases(&env);
    let mut tally = Tally::default();
    for to_neighbour in [false, true] {
        for case in &cases {
            run_case(&env, case, to_neighbour, &mut tally);
        }
    }
    let count = |rpc| cases.iter().filter(|c| c.rpc == rpc).count();
    println!(
        "checked: {api}: {} links ({} cases of a path and an RPC: stage {}, publish {}, unpublish {}, unstage {}; x2: to outside/etc, to the neighbour): \
         {} refused naming the link, {} removed (never followed), {} left unused; outside and neighbour unchanged, \
         no stray mount; {:.1}s",
        2 * cases.len(),
        cases.len(),
        count(Rpc::Stage),
        count(Rpc::Publish),
        count(Rpc::Unpublish),
        count(Rpc::Unstage),
        tally.refused,
        tally.removed,
        tally.unused,
        t0.elapsed().as_secs_f64()
    );
    assert!(tally.problems.is_empty(), "{api}: {} problems:\n{}", tally.problems.len(), tally.problems.join("\n"));
}

#[test]
fn a_link_at_any_path_a_plan_touches_is_never_followed() {
    if !in_private_namespace("a_link_at_any_path_a_plan_touches_is_never_followed") {
        return;
    }
    sweep(false);
}

#[test]
fn a_link_at_any_path_a_plan_touches_is_never_followed_on_old_kernels() {
    if !in_private_namespace("a_link_at_any_path_a_plan_touches_is_never_followed_on_old_kernels") {
        return;
    }
    sweep(true);
}

/// Swap `data/sub` with a link to `outside/etc` as fast as possible while publishing and
/// unpublishing `rounds` times.
fn race(legacy: bool, rounds: usize) {
    let api = if legacy { "legacy" } else { "new api" };
    let t0 = Instant::now();
    let env = Env::new(legacy);
    let a = &env.a;
    env.stage_a();
    let data = a.staging.join("data");
    let sub = data.join("sub");
    // Whichever component the diagnostic walk finds, it is `data/sub` (or nothing, and then the
    // path itself is named).
    let named = format!("{} is a symbolic link", sub.display());
    symlink(&env.etc, data.join("swap")).unwrap();
    let dir = std::fs::File::open(&data).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let swapper = {
        let (stop, swaps) = (stop.clone(), swaps.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                rustix::fs::renameat_with(&dir, "sub", &dir, "swap", rustix::fs::RenameFlags::EXCHANGE).unwrap();
                swaps.fetch_add(1, Ordering::Relaxed);
            }
            dir
        })
    };
    let (mut ok, mut refused, mut problems) = (0usize, 0usize, Vec::new());
    for round in 0..rounds {
        match env.publish(a) {
            Ok(()) => {
                ok += 1;
                let names: Vec<_> = std::fs::read_dir(&a.target).unwrap().map(|e| e.unwrap().file_name()).collect();
                let marker = std::fs::read_to_string(a.target.join("marker")).ok();
                if names != ["marker"] || marker.as_deref() != Some(MARKER_A) {
                    problems.push(format!("round {round}: the target shows {names:?} ({marker:?})"));
                }
            }
            Err(st) if st.code() == Code::FailedPrecondition && st.message().contains(&named) => refused += 1,
            Err(st) => problems.push(format!("round {round}: publish answered {st:?}")),
        }
        problems.extend(env.strays().into_iter().map(|s| format!("round {round}: {s}")));
        if let Err(st) = env.unpublish(a) {
            problems.push(format!("round {round}: unpublish answered {st:?}"));
        }
    }
    stop.store(true, Ordering::Relaxed);
    let dir = swapper.join().unwrap();
    if std::fs::symlink_metadata(&sub).unwrap().file_type().is_symlink() {
        rustix::fs::renameat_with(&dir, "sub", &dir, "swap", rustix::fs::RenameFlags::EXCHANGE).unwrap();
    }
    env.unstage(a).unwrap();
    problems.extend(env.changed());
    let table = mountinfo::read().unwrap();
    if table != env.baseline {
        problems.push(format!("the mount table differs at the end: {table:?}"));
    }
    println!(
        "checked: race ({api}): {rounds} publish+unpublish rounds while data/sub was swapped with a link to outside/etc \
         {} times: {ok} published the volume's own file, {refused} refused naming the link, 0 showed outside; {:.1}s",
        swaps.load(Ordering::Relaxed),
        t0.elapsed().as_secs_f64()
    );
    assert!(problems.is_empty(), "{api}: {} problems:\n{}", problems.len(), problems.join("\n"));
    assert!(ok > 0 && refused > 0, "{api}: the race was not exercised: {ok} ok, {refused} refused");
}

#[test]
fn a_sub_path_swapped_for_a_link_during_publish_never_shows_outside() {
    if !in_private_namespace("a_sub_path_swapped_for_a_link_during_publish_never_shows_outside") {
        return;
    }
    race(false, 500);
    race(true, 500);
}

/// Swap volume a's target directory's parent with a link to the neighbour's (which holds the
/// neighbour's published target) while publishing and unpublishing `rounds` times, retrying
/// unpublish as kubelet does. Returns the problems seen: anything mounted onto the neighbour's
/// target, the neighbour's target unmounted or removed, a stray mount, an unpublish that never
/// succeeds; with `strict`, also any refusal that is not FAILED_PRECONDITION naming a link.
fn race_target_parent(legacy: bool, rounds: usize, strict: bool) -> Vec<String> {
    let api = if legacy { "legacy" } else { "new api" };
    let t0 = Instant::now();
    let env = Env::new(legacy);
    let a = &env.a;
    env.stage_a();
    let pv = a.target.parent().unwrap();
    let volumes = pv.parent().unwrap();
    symlink(relative(volumes, env.b.target.parent().unwrap()), volumes.join("swap")).unwrap();
    let dir = std::fs::File::open(volumes).unwrap();
    let pv_name = pv.file_name().unwrap().to_owned();
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let swapper = {
        let (stop, swaps) = (stop.clone(), swaps.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                rustix::fs::renameat_with(&dir, &pv_name, &dir, "swap", rustix::fs::RenameFlags::EXCHANGE).unwrap();
                swaps.fetch_add(1, Ordering::Relaxed);
            }
            (dir, pv_name)
        })
    };
    let (mut ok, mut problems) = (0usize, Vec::new());
    let mut refused: BTreeMap<String, usize> = BTreeMap::new();
    // A refusal naming a link is right. So is UNAVAILABLE (EBUSY) from unpublish: the mount table
    // was read while the target's mount was under the swapped name, so the target was not
    // unmounted before its removal (kubelet retries).
    let mut class = |rpc: &str, st: &Status| {
        let link = st.code() == Code::FailedPrecondition && st.message().contains("is a symbolic link");
        let busy = rpc == "unpublish"
            && st.code() == Code::Unavailable
            && st.message().ends_with("Device or resource busy (os error 16)");
        let key = if link {
            format!("{rpc}: refused naming a link")
        } else {
            format!("{rpc}: {:?} ({})", st.code(), st.message().rsplit(": ").next().unwrap_or_default())
        };
        if strict && !link && !busy {
            problems.push(format!("{rpc} answered {:?}: {}", st.code(), st.message()));
        }
        *refused.entry(key).or_default() += 1;
    };
    let mut strays = Vec::new();
    for round in 0..rounds {
        match env.publish(a) {
            Ok(()) => ok += 1,
            Err(st) => class("publish", &st),
        }
        strays.extend(env.strays().into_iter().map(|s| format!("round {round}: {s}")));
        let mut tries = 0;
        while let Err(st) = env.unpublish(a) {
            class("unpublish", &st);
            tries += 1;
            if tries == 1000 {
                strays.push(format!("round {round}: unpublish still fails: {st:?}"));
                break;
            }
        }
        strays.extend(env.strays().into_iter().map(|s| format!("round {round}: {s}")));
    }
    stop.store(true, Ordering::Relaxed);
    let (dir, pv_name) = swapper.join().unwrap();
    if std::fs::symlink_metadata(pv).unwrap().file_type().is_symlink() {
        rustix::fs::renameat_with(&dir, &pv_name, &dir, "swap", rustix::fs::RenameFlags::EXCHANGE).unwrap();
    }
    std::fs::remove_file(volumes.join("swap")).unwrap();
    env.unpublish(a).unwrap();
    env.unstage(a).unwrap();
    strays.extend(env.changed());
    let table = mountinfo::read().unwrap();
    if table != env.baseline {
        strays.push(format!("the mount table differs at the end: {table:?}"));
    }
    println!(
        "checked: race ({api}): {rounds} publish+unpublish rounds (unpublish retried until OK) while the target's \
         parent was swapped with a link to the neighbour's {} times: {ok} published, failures {refused:?}; \
         {} touching the neighbour or stray; {:.1}s",
        swaps.load(Ordering::Relaxed),
        strays.len(),
        t0.elapsed().as_secs_f64()
    );
    if !refused.keys().any(|k| k.starts_with("publish")) || ok == 0 {
        problems.push(format!("the race was not exercised: {ok} ok, {refused:?}"));
    }
    problems.extend(strays);
    problems.into_iter().map(|p| format!("{api}: {p}")).collect()
}

#[test]
fn a_target_parent_swapped_for_a_link_never_reaches_the_neighbours_target() {
    if !in_private_namespace("a_target_parent_swapped_for_a_link_never_reaches_the_neighbours_target") {
        return;
    }
    let problems = [race_target_parent(false, 300, false), race_target_parent(true, 300, false)].concat();
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
}

/// A link met as the final component of a directory open during a race is refused as a link
/// (FAILED_PRECONDITION naming it), never INTERNAL "Not a directory": `Anchors::resolve` opens
/// `O_PATH | O_NOFOLLOW` and judges the link on the descriptor, instead of asking for a
/// directory and guessing from a later `lstat` (the bug this test was written to show).
#[test]
fn a_link_met_during_a_race_is_refused_as_a_link() {
    if !in_private_namespace("a_link_met_during_a_race_is_refused_as_a_link") {
        return;
    }
    let problems = [race_target_parent(false, 150, true), race_target_parent(true, 150, true)].concat();
    // The same answer in many rounds is shown once, with its count.
    let mut distinct: BTreeMap<String, usize> = BTreeMap::new();
    for p in &problems {
        *distinct.entry(p.split_once(": ").map_or(p.as_str(), |(_, rest)| rest).to_string()).or_default() += 1;
    }
    assert!(problems.is_empty(), "{} problems: {distinct:#?}", problems.len());
}

/// A plan's `socket-call` reaches a program's socket through `Executor::connect`: only a
/// socket, never through a link (at its end or on the way), and at a path longer than a
/// socket address can hold.
#[test]
fn a_socket_call_connects_only_to_a_socket_and_never_through_a_link() {
    use mounthost::exec::Executor;
    let root = tempfile::tempdir().unwrap();
    let anchor = root.path().join("state");
    let deep = anchor.join("run").join("d".repeat(100)).join("e".repeat(100));
    std::fs::create_dir_all(&deep).unwrap();
    let outside = root.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let exec = Linux::new(Cgroups::none(), [anchor.clone()]);

    // A path longer than sun_path (108 bytes), connected through the socket's own descriptor.
    let sock = deep.join("weed.sock");
    assert!(sock.as_os_str().len() > 108);
    // Bound at a short name, then moved where the path is long (a socket keeps its inode).
    let server = std::os::unix::net::UnixListener::bind(root.path().join("s.sock")).unwrap();
    std::fs::rename(root.path().join("s.sock"), &sock).unwrap();
    let outside_server = std::os::unix::net::UnixListener::bind(outside.join("real.sock")).unwrap();
    let stream = exec.connect(&sock).unwrap();
    let (mut accepted, _) = server.accept().unwrap();
    use std::io::{Read, Write};
    (&stream).write_all(b"hello").unwrap();
    let mut got = [0u8; 5];
    accepted.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"hello");

    // A link at the socket's name, to a socket outside: refused, and the outside server sees no one.
    outside_server.set_nonblocking(true).unwrap();
    let link = deep.join("link.sock");
    symlink(outside.join("real.sock"), &link).unwrap();
    let err = exec.connect(&link).unwrap_err();
    assert!(err.to_string().contains("is a symbolic link"), "{err}");
    // A link on the way (a directory swapped for one).
    let hop = anchor.join("run").join("hop");
    symlink(&outside, &hop).unwrap();
    let err = exec.connect(&hop.join("real.sock")).unwrap_err();
    assert!(err.to_string().contains("is a symbolic link"), "{err}");
    assert!(outside_server.accept().is_err(), "nothing reached the socket outside");

    // Something else than a socket at the name.
    let file = deep.join("file.sock");
    std::fs::write(&file, b"x").unwrap();
    let err = exec.connect(&file).unwrap_err();
    assert!(err.to_string().contains("is not a socket"), "{err}");
    // Outside the anchors.
    assert!(exec.connect(&outside.join("real.sock")).is_err());
}
