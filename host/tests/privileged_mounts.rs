//! Real mounts through the executor room. Needs root (as the node daemon has, and CI is).
//!
//! Each test re-executes itself under `unshare --mount --propagation private` and first checks
//! that its mount namespace is not the machine's, so nothing here can touch the host's mounts,
//! and whatever a failing test leaves mounted dies with its namespace. Every test runs twice:
//! with the kernel's new mount API and `openat2`, and with what kernels before 5.2 and 5.6 offer
//! (`mount(2)` on `/proc/self/fd` paths, a component walk).

use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

mod common;

use common::in_private_namespace;
use mounthost::exec::cgroup::Cgroups;
use mounthost::exec::mountinfo;
use mounthost::exec::{Linux, Mounts};
use mounthost::plan::MountOption;
use nix::errno::Errno;

fn mounted(path: &Path) -> Option<mountinfo::MountEntry> {
    mountinfo::at(&mountinfo::read().unwrap(), path).cloned()
}

/// Executors anchored at `root`: the modern one and the legacy one.
fn executors(root: &Path) -> [(&'static str, Linux); 2] {
    let linux = Linux::new(Cgroups::none(), [root.to_path_buf()]);
    [("new api", linux.clone()), ("legacy", linux.legacy())]
}

fn root() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    (dir, root)
}

fn text(s: &str) -> MountOption {
    MountOption::Text(s.into())
}

#[test]
fn a_tmpfs_mount_shows_in_mountinfo_and_goes_away() {
    if !in_private_namespace("a_tmpfs_mount_shows_in_mountinfo_and_goes_away") {
        return;
    }
    let (_d, root) = root();
    for (api, x) in executors(&root) {
        let target = root.join(format!("with space {api}"));
        std::fs::create_dir(&target).unwrap();
        x.mount("tmpfs", "mounthost-test", &target, &[text("size=1m"), text("mode=0750")], false).unwrap();
        let entry = mounted(&target).expect("the mount is in mountinfo, escaped path and all");
        assert_eq!((entry.fstype.as_str(), entry.source.as_str()), ("tmpfs", "mounthost-test"), "{api}");
        assert!(entry.super_options.contains("size=1024k"), "{entry:?}");
        assert!(entry.mount_options.contains("nosuid") && entry.mount_options.contains("nodev"), "{entry:?}");
        assert_eq!(std::fs::metadata(&target).unwrap().permissions().mode() & 0o777, 0o750);
        std::fs::write(target.join("f"), b"x").unwrap();
        x.unmount(&target, false).unwrap();
        assert!(mounted(&target).is_none(), "{api}");
        assert!(!target.join("f").exists(), "the file lived on the tmpfs");
    }
}

/// A pod can give a path holding mounts any name, UTF-8 or not (it renames a directory in its own
/// volume to `$'\xff'`): the table must still read, and name that mount point byte for byte.
#[test]
fn a_mount_point_that_is_not_utf8_reads_byte_for_byte() {
    if !in_private_namespace("a_mount_point_that_is_not_utf8_reads_byte_for_byte") {
        return;
    }
    let (_d, root) = root();
    let target = root.join(OsStr::from_bytes(b"pod\xff dir"));
    std::fs::create_dir(&target).unwrap();
    let [(_, x), _] = executors(&root);
    x.mount("tmpfs", "mounthost-test", &target, &[text("size=1m")], false).unwrap();
    let table = mountinfo::read().expect("one path that is not UTF-8 does not hide the table");
    let entry = mountinfo::at(&table, &target).expect("the mount is in mountinfo");
    assert_eq!(entry.mount_point.as_os_str().as_bytes(), target.as_os_str().as_bytes());
    assert_eq!(entry.source, "mounthost-test");
    x.unmount(&target, false).unwrap();
    assert!(mounted(&target).is_none());
}

#[test]
fn a_read_only_bind_rejects_writes() {
    if !in_private_namespace("a_read_only_bind_rejects_writes") {
        return;
    }
    let (_d, root) = root();
    for (api, x) in executors(&root) {
        let (staging, target) = (root.join(format!("staging-{api}")), root.join(format!("target-{api}")));
        std::fs::create_dir(&staging).unwrap();
        std::fs::create_dir(&target).unwrap();
        x.mount("tmpfs", "tmpfs", &staging, &[], false).unwrap();
        std::fs::write(staging.join("data"), b"hello").unwrap();

        x.bind(&staging, &target, true, &["noexec".into()]).unwrap();
        let entry = mounted(&target).unwrap();
        assert!(entry.is_readonly(), "{api}: {entry:?}");
        for flag in ["noexec", "nosuid", "nodev"] {
            assert!(entry.mount_options.split(',').any(|o| o == flag), "{api}: {flag} in {entry:?}");
        }
        assert_eq!(std::fs::read(target.join("data")).unwrap(), b"hello");
        let err = std::fs::write(target.join("new"), b"x").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(Errno::EROFS as i32), "{err}");
        // The staging mount stays writable and the bind sees its changes.
        std::fs::write(staging.join("data"), b"changed").unwrap();
        assert_eq!(std::fs::read(target.join("data")).unwrap(), b"changed");
        // A sub-path bind shows its root in mountinfo.
        std::fs::create_dir(staging.join("sub")).unwrap();
        let sub_target = root.join(format!("sub-{api}"));
        std::fs::create_dir(&sub_target).unwrap();
        x.bind(&staging.join("sub"), &sub_target, false, &[]).unwrap();
        assert_eq!(mounted(&sub_target).unwrap().root, PathBuf::from("/sub"));
        assert!(!mounted(&sub_target).unwrap().is_readonly());

        for m in [&sub_target, &target, &staging] {
            x.unmount(m, false).unwrap();
            assert!(mounted(m).is_none());
        }
    }
}

#[test]
fn a_busy_mount_needs_a_lazy_unmount() {
    if !in_private_namespace("a_busy_mount_needs_a_lazy_unmount") {
        return;
    }
    let (_d, root) = root();
    for (api, x) in executors(&root) {
        let target = root.join(format!("busy-{api}"));
        std::fs::create_dir(&target).unwrap();
        x.mount("tmpfs", "tmpfs", &target, &[], false).unwrap();
        let mut open = std::fs::File::create(target.join("held")).unwrap();
        let err = x.unmount(&target, false).unwrap_err();
        assert_eq!(err.errno, Errno::EBUSY, "{err}");
        assert!(err.to_string().contains(&target.display().to_string()), "the error names the path: {err}");
        x.unmount(&target, true).unwrap();
        assert!(mounted(&target).is_none(), "detached from the tree at once");
        open.write_all(b"still usable through the open file").unwrap();
    }
}

#[test]
fn errors_name_the_path_and_change_nothing() {
    if !in_private_namespace("errors_name_the_path_and_change_nothing") {
        return;
    }
    let (_d, root) = root();
    for (api, x) in executors(&root) {
        let missing = root.join("missing");
        let err = x.bind(&root, &missing, true, &[]).unwrap_err();
        assert_eq!((err.op, err.errno, err.path.clone()), ("resolve", Errno::ENOENT, missing.clone()), "{api}: {err}");
        std::fs::create_dir_all(root.join("d")).unwrap();
        let err = x.unmount(&root.join("d"), false).unwrap_err();
        assert_eq!(err.errno, Errno::EINVAL, "{api}: not a mount point: {err}");
        let err = x.unmount(Path::new("/tmp"), false).unwrap_err();
        assert_eq!(err.op, "resolve", "{api}: outside the anchors: {err}");
        assert!(mounted(&root).is_none() && mounted(&missing).is_none());
    }
}

#[test]
fn links_on_the_way_are_refused_at_the_syscall() {
    if !in_private_namespace("links_on_the_way_are_refused_at_the_syscall") {
        return;
    }
    let (_d, base) = root();
    let root = base.join("anchor");
    let outside = base.join("etc");
    std::fs::create_dir_all(root.join("vol/real")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("passwd"), b"root").unwrap();
    std::os::unix::fs::symlink(&outside, root.join("vol/evil")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("target-link")).unwrap();
    std::fs::create_dir(root.join("target")).unwrap();
    for (api, x) in executors(&root) {
        // Bind source through a link, target through a link, target that is a link.
        for (source, target) in [
            (root.join("vol/evil"), root.join("target")),
            (root.join("vol/real"), root.join("target-link")),
            (root.join("vol/evil/passwd"), root.join("target")),
        ] {
            let err = x.bind(&source, &target, false, &[]).unwrap_err();
            assert_eq!(err.errno, Errno::ELOOP, "{api}: {err}");
            assert!(err.to_string().contains("is a symbolic link"), "{api}: {err}");
        }
        let err = x.mount("tmpfs", "tmpfs", &root.join("target-link"), &[], false).unwrap_err();
        assert_eq!(err.errno, Errno::ELOOP, "{api}: {err}");
        let err = x.unmount(&root.join("target-link"), false).unwrap_err();
        assert!(matches!(err.errno, Errno::EINVAL | Errno::ELOOP), "{api}: a link is never unmounted through: {err}");
        // Path mount options resolve below the anchors too.
        let opt = MountOption::Path { prefix: "x=".into(), path: root.join("vol/evil") };
        let err = x.mount("tmpfs", "tmpfs", &root.join("target"), &[opt], false).unwrap_err();
        assert_eq!(err.errno, Errno::ELOOP, "{api}: {err}");
        let table = mountinfo::read().unwrap();
        assert!(!table.iter().any(|m| m.mount_point.starts_with(&base)), "{api}: nothing was mounted: {table:?}");
    }
    assert_eq!(std::fs::read(outside.join("passwd")).unwrap(), b"root");
}

#[test]
fn every_bind_flag_the_policy_allows_works_with_both_mount_apis() {
    if !in_private_namespace("every_bind_flag_the_policy_allows_works_with_both_mount_apis") {
        return;
    }
    let (_d, root) = root();
    let source = root.join("source");
    std::fs::create_dir(&source).unwrap();
    let mut checked = 0;
    for (api, x) in executors(&root) {
        for flag in mounthost::plan::policy::BIND_OPTIONS {
            for readonly in [false, true] {
                let target = root.join(format!("t-{api}-{flag}-{readonly}"));
                std::fs::create_dir(&target).unwrap();
                x.bind(&source, &target, readonly, &[flag.to_string()]).unwrap_or_else(|e| panic!("{api} {flag}: {e}"));
                let opts = mounted(&target).unwrap().mount_options;
                let has = |o: &str| opts.split(',').any(|p| p == o);
                assert_eq!(has("ro"), readonly, "{api} {flag}: {opts}");
                assert!(has("nosuid") && has("nodev"), "{api} {flag}: {opts}");
                match *flag {
                    "strictatime" => assert!(!has("noatime") && !has("relatime"), "{api}: {opts}"),
                    other => assert!(has(other), "{api} {flag}: {opts}"),
                }
                x.unmount(&target, false).unwrap();
                checked += 1;
            }
        }
    }
    println!("checked: {checked} binds, every allowed flag, read-only and read-write, both mount APIs");
}

/// A node on the real executor, with the test plugin `plugin` (granted tmpfs) in its folder, a
/// staging path and a target whose parent exists, below a fresh kubelet directory.
struct Real {
    _dir: tempfile::TempDir,
    node: mounthost::daemon::Node,
    exec: std::sync::Arc<Linux>,
    staging: PathBuf,
    target: PathBuf,
}

fn real_node(plugin: &str) -> Real {
    let (_dir, root) = root();
    let kubelet = root.join("kubelet");
    let mut config = mounthost::config::Config::new(root.join("state"));
    config.kubelet_dir = kubelet.clone();
    config.grants.insert(
        plugin.into(),
        mounthost::plan::policy::Grant { fstypes: ["tmpfs".to_string()].into(), ..Default::default() },
    );
    std::fs::create_dir_all(&config.plugin_dir).unwrap();
    std::fs::copy(mounthost::stock::fixtures::path(plugin), config.plugin_dir.join(format!("{plugin}.wasm"))).unwrap();
    let staging = kubelet.join("plugins/kubernetes.io/csi/csi.mounthost.dev/0a1b/globalmount");
    let target = kubelet.join("pods/pod-a/volumes/kubernetes.io~csi/pv-1/mount");
    std::fs::create_dir_all(&staging).unwrap();
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    let exec = std::sync::Arc::new(Linux::new(Cgroups::none(), [config.state_dir.clone(), kubelet.clone()]));
    let runtime = std::sync::Arc::new(mounthost::plugin::PluginRuntime::new(config.runtime()).unwrap());
    let node = mounthost::daemon::Node::new(config, runtime, exec.clone()).unwrap();
    Real { _dir, node, exec, staging, target }
}

/// A plugin built against contract 0.1.0 (the `legacy` fixture, through the host's adapter)
/// stages and publishes for real, every call twice: a sized tmpfs at the staging path, bound
/// onto the target.
#[test]
fn a_contract_0_1_0_plugin_stages_and_publishes() {
    use csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
    use mounthost::proto::csi;
    if !in_private_namespace("a_contract_0_1_0_plugin_stages_and_publishes") {
        return;
    }
    let Real { _dir, node, staging, target, .. } = real_node("legacy");

    let id = "legacy~pv-1";
    let context: std::collections::HashMap<String, String> =
        [("plugin".to_string(), "legacy".to_string()), ("sizeMiB".into(), "4".into())].into();
    let capability = csi::VolumeCapability {
        access_mode: Some(AccessMode { mode: Mode::SingleNodeWriter as i32 }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    };
    let path = |p: &Path| p.display().to_string();
    let stage = csi::NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: path(&staging),
        volume_capability: Some(capability.clone()),
        volume_context: context.clone(),
        ..Default::default()
    };
    let publish = csi::NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: path(&staging),
        target_path: path(&target),
        volume_capability: Some(capability),
        volume_context: context,
        ..Default::default()
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        for _ in 0..2 {
            node.stage(stage.clone()).await.unwrap();
        }
        let entry = mounted(&staging).expect("a tmpfs at the staging path");
        assert_eq!(entry.fstype, "tmpfs");
        assert!(entry.super_options.contains("size=4096k"), "{}", entry.super_options);
        for _ in 0..2 {
            node.publish(publish.clone()).await.unwrap();
        }
        std::fs::write(target.join("f"), b"legacy").unwrap();
        assert_eq!(std::fs::read(staging.join("f")).unwrap(), b"legacy", "the target is a bind of the staging tmpfs");
        let unpublish = csi::NodeUnpublishVolumeRequest { volume_id: id.into(), target_path: path(&target) };
        let unstage = csi::NodeUnstageVolumeRequest { volume_id: id.into(), staging_target_path: path(&staging) };
        for _ in 0..2 {
            node.unpublish(unpublish.clone()).await.unwrap();
        }
        for _ in 0..2 {
            node.unstage(unstage.clone()).await.unwrap();
        }
        assert!(mounted(&staging).is_none() && mounted(&target).is_none());
    });
    println!("checked: a contract 0.1.0 plugin staged, published, unpublished and unstaged, each twice");
}

/// A dynamic volume's pod owns everything below its target and can make a directory chain
/// deeper than PATH_MAX there (relative `mkdir` and `cd`), then rename `mounts/`, holding a
/// mount, into it, or have a mount land at the chain's end: no single path syscall reaches
/// those mount points (ENAMETOOLONG), the executor's resolution in pieces does.
/// NodeUnpublishVolume answers OK, leaves nothing mounted at or below the target, and removes
/// it (were an unmount below the target to fail anyway, it is best effort, and the target's own
/// unmount, busy with what is left, detaches the whole subtree).
/// New mount API only: a dynamic volume needs `mount_setattr(2)`, which the legacy executor
/// never uses.
#[test]
fn unpublish_unmounts_mounts_a_pod_moved_deeper_than_path_max() {
    use csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
    use mounthost::proto::csi;
    use rustix::fs::CWD;
    use rustix::mount::{MountFlags, mount};
    if !in_private_namespace("unpublish_unmounts_mounts_a_pod_moved_deeper_than_path_max") {
        return;
    }
    let Real { _dir, node, exec, staging, target } = real_node("tmpfs");

    let id = "tmpfs~pv-1";
    let context: std::collections::HashMap<String, String> =
        [("plugin", "tmpfs"), ("sizeMiB", "1"), ("dynamic", "true")].map(|(k, v)| (k.into(), v.into())).into();
    let capability = csi::VolumeCapability {
        access_mode: Some(AccessMode { mode: Mode::SingleNodeWriter as i32 }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    };
    let path = |p: &Path| p.display().to_string();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let stage = csi::NodeStageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: path(&staging),
            volume_capability: Some(capability.clone()),
            volume_context: context.clone(),
            ..Default::default()
        };
        node.stage(stage).await.unwrap();
        let publish = csi::NodePublishVolumeRequest {
            volume_id: id.into(),
            staging_target_path: path(&staging),
            target_path: path(&target),
            volume_capability: Some(capability),
            volume_context: context,
            ..Default::default()
        };
        node.publish(publish).await.unwrap();
    });
    assert_eq!(mounted(&target).expect("the host's tmpfs at the target").fstype, "tmpfs");
    assert!(target.join("mounts").is_dir(), "the published directory has its mounts/");

    // The pod's doing, with the pod's means: a mount in `mounts/` (as a dynamic mount is), a
    // chain of 17 directories of 255-byte names made and entered relative to each other, a
    // tmpfs at its deepest directory (mounted through its descriptor: no path to it works), and
    // `mounts/` renamed into the directory above that.
    std::fs::create_dir(target.join("mounts/m1")).unwrap();
    let tmpfs = |at: &str| mount("tmpfs", at, "tmpfs", MountFlags::empty(), c"size=64k").unwrap();
    tmpfs(&path(&target.join("mounts/m1")));
    let (chain, deep) = common::deep_chain(&target, 17);
    let deepest = chain.last().unwrap();
    tmpfs(&format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(deepest)));
    rustix::fs::renameat(&chain[0], "mounts", &chain[16], "mounts").unwrap();
    let moved = deep.parent().unwrap().join("mounts/m1");
    assert!(deep.as_os_str().len() - target.as_os_str().len() > 4096);
    drop(chain);
    assert!(rustix::fs::statat(CWD, &deep, rustix::fs::AtFlags::empty()).is_err(), "no path reaches it");
    let below_target = || -> Vec<PathBuf> {
        mountinfo::read().unwrap().into_iter().map(|m| m.mount_point).filter(|p| p.starts_with(&target)).collect()
    };
    let before = below_target();
    for p in [&target, &target.join("volume"), &deep, &moved] {
        assert!(before.contains(p), "{} bytes long, missing from mountinfo", p.as_os_str().len());
    }
    // No single path syscall reaches them; the executor resolves them in pieces.
    for p in [&deep, &moved] {
        let e = rustix::fs::statat(CWD, p.as_path(), rustix::fs::AtFlags::empty()).unwrap_err();
        assert_eq!(e, rustix::io::Errno::NAMETOOLONG);
        let id = mounthost::exec::Executor::file_id(exec.as_ref(), p).unwrap().expect("the executor finds it");
        assert_eq!(id.kind, mounthost::exec::FileKind::Directory);
    }
    assert_eq!(below_target(), before);

    let unpublish = csi::NodeUnpublishVolumeRequest { volume_id: id.into(), target_path: path(&target) };
    rt.block_on(node.unpublish(unpublish.clone())).expect("NodeUnpublishVolume answers OK");
    assert_eq!(below_target(), Vec::<PathBuf>::new(), "nothing is mounted at or below the target");
    assert!(!target.exists(), "the target directory is gone");
    // The retry kubelet may send finds nothing to do, and the volume unstages.
    rt.block_on(node.unpublish(unpublish)).unwrap();
    let unstage = csi::NodeUnstageVolumeRequest { volume_id: id.into(), staging_target_path: path(&staging) };
    rt.block_on(node.unstage(unstage)).unwrap();
    assert!(mounted(&staging).is_none());
    let depth = deep.as_os_str().len() - target.as_os_str().len();
    println!("checked: 2 mounts no single path reaches (down to {depth} bytes below a dynamic target) gone with it");
}

/// An inline (ephemeral) volume whose publish fails after the host staged it (the target's
/// parent is missing) is unstaged again, for real: kubelet never sends NodeUnpublishVolume for
/// a publish that did not succeed, so its tmpfs would otherwise stay mounted until the daemon's
/// next start.
#[test]
fn an_inline_volume_whose_publish_fails_leaves_no_mount() {
    use mounthost::proto::csi;
    if !in_private_namespace("an_inline_volume_whose_publish_fails_leaves_no_mount") {
        return;
    }
    let Real { _dir, node, exec: _, staging: _, target } = real_node("tmpfs");
    let state = _dir.path().canonicalize().unwrap().join("state");
    let orphan = target.parent().unwrap().parent().unwrap().join("pv-2/mount");
    let request = |target: &Path| csi::NodePublishVolumeRequest {
        volume_id: "csi-5e1d".into(),
        target_path: target.display().to_string(),
        volume_capability: Some(common::multi_writer()),
        volume_context: [("plugin", "tmpfs"), ("sizeMiB", "1"), ("csi.storage.k8s.io/ephemeral", "true")]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into(),
        ..Default::default()
    };
    let below_state = || -> Vec<PathBuf> {
        mountinfo::read().unwrap().into_iter().map(|m| m.mount_point).filter(|p| p.starts_with(&state)).collect()
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let err = rt.block_on(node.publish(request(&orphan))).unwrap_err();
    assert!(err.message.contains("pv-2"), "the error names the target: {err:?}");
    assert_eq!(below_state(), Vec::<PathBuf>::new(), "the host's staging tmpfs is unmounted");
    let ephemeral: Vec<_> = std::fs::read_dir(state.join("ephemeral")).map(|d| d.collect()).unwrap_or_default();
    assert!(ephemeral.is_empty(), "no staging directory is left: {ephemeral:?}");
    // The same volume at a target whose parent exists: staged and published.
    rt.block_on(node.publish(request(&target))).unwrap();
    assert_eq!(mounted(&target).expect("published").fstype, "tmpfs");
    assert_eq!(below_state().len(), 1, "one staging tmpfs");
    println!("checked: a failed inline publish left no mount; the retry at a real target published");
}

/// The bind the daemon makes at start to share its state directory goes at its exit only when
/// nothing is mounted below it (a volume staged there stays, and so does the bind holding it),
/// also while a file in it is held open (the daemon's state lock).
#[test]
fn the_bind_that_shares_a_root_goes_only_when_nothing_is_below_it() {
    if !in_private_namespace("the_bind_that_shares_a_root_goes_only_when_nothing_is_below_it") {
        return;
    }
    let (_d, root) = root();
    let state = root.join("state");
    std::fs::create_dir_all(state.join("volume")).unwrap();
    assert_eq!(Linux::share_root(&state).unwrap(), mounthost::exec::confine::Shared::Bound);
    let entry = mounted(&state).expect("a bind of the directory onto itself");
    assert!(entry.mount_options.contains("rw"), "{entry:?}");
    let _lock = std::fs::File::create(state.join("lock")).unwrap();
    let x = Linux::new(Cgroups::none(), [state.clone()]);
    x.mount("tmpfs", "mounthost-test", &state.join("volume"), &[text("size=1m")], false).unwrap();
    let kept = Linux::release_root(&state).unwrap_err();
    assert_eq!(kept.kind(), std::io::ErrorKind::ResourceBusy, "{kept}");
    assert!(mounted(&state).is_some() && mounted(&state.join("volume")).is_some(), "both stay");
    x.unmount(&state.join("volume"), false).unwrap();
    Linux::release_root(&state).unwrap();
    assert!(mounted(&state).is_none(), "the bind is gone");
    assert!(state.join("lock").is_file(), "what the bind showed is the directory's own");
}
