//! Real mounts through the executor room. Needs root (as the node daemon has, and CI is).
//!
//! Each test re-executes itself under `unshare --mount --propagation private` and first checks
//! that its mount namespace is not the machine's, so nothing here can touch the host's mounts,
//! and whatever a failing test leaves mounted dies with its namespace.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

mod common;

use common::in_private_namespace;
use mounthost::exec::mount::{self, bind_flag};
use mounthost::exec::mountinfo;
use nix::errno::Errno;
use nix::mount::MsFlags;

fn mounted(path: &Path) -> Option<mountinfo::MountEntry> {
    mountinfo::at(&mountinfo::read().unwrap(), path).cloned()
}

#[test]
fn a_tmpfs_mount_shows_in_mountinfo_and_goes_away() {
    if !in_private_namespace("a_tmpfs_mount_shows_in_mountinfo_and_goes_away") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("with space");
    std::fs::create_dir(&target).unwrap();
    mount::mount("tmpfs", "mounthost-test", &target, &["size=1m".into(), "mode=0750".into()], false).unwrap();
    let entry = mounted(&target).expect("the mount is in mountinfo, escaped path and all");
    assert_eq!((entry.fstype.as_str(), entry.source.as_str()), ("tmpfs", "mounthost-test"));
    assert!(entry.super_options.contains("size=1024k"), "{entry:?}");
    assert!(entry.mount_options.contains("nosuid") && entry.mount_options.contains("nodev"), "{entry:?}");
    assert_eq!(std::fs::metadata(&target).unwrap().permissions().mode() & 0o777, 0o750);
    std::fs::write(target.join("f"), b"x").unwrap();
    mount::unmount(&target, false).unwrap();
    assert!(mounted(&target).is_none());
    assert!(!target.join("f").exists(), "the file lived on the tmpfs");
}

#[test]
fn a_read_only_bind_rejects_writes() {
    if !in_private_namespace("a_read_only_bind_rejects_writes") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (staging, target) = (dir.path().join("staging"), dir.path().join("target"));
    std::fs::create_dir(&staging).unwrap();
    std::fs::create_dir(&target).unwrap();
    mount::mount("tmpfs", "tmpfs", &staging, &[], false).unwrap();
    std::fs::write(staging.join("data"), b"hello").unwrap();

    mount::bind(&staging, &target, true, bind_flag("noexec").unwrap() | MsFlags::MS_NOSUID).unwrap();
    let entry = mounted(&target).unwrap();
    assert!(entry.is_readonly(), "{entry:?}");
    assert!(entry.mount_options.contains("noexec"), "{entry:?}");
    assert_eq!(std::fs::read(target.join("data")).unwrap(), b"hello");
    let err = std::fs::write(target.join("new"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(Errno::EROFS as i32), "{err}");
    // The staging mount stays writable and the bind sees its changes.
    std::fs::write(staging.join("data"), b"changed").unwrap();
    assert_eq!(std::fs::read(target.join("data")).unwrap(), b"changed");

    mount::unmount(&target, false).unwrap();
    mount::unmount(&staging, false).unwrap();
    assert!(mounted(&target).is_none() && mounted(&staging).is_none());
}

#[test]
fn a_busy_mount_needs_a_lazy_unmount() {
    if !in_private_namespace("a_busy_mount_needs_a_lazy_unmount") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("busy");
    std::fs::create_dir(&target).unwrap();
    mount::mount("tmpfs", "tmpfs", &target, &[], false).unwrap();
    let mut open = std::fs::File::create(target.join("held")).unwrap();
    let err = mount::unmount(&target, false).unwrap_err();
    assert_eq!(err.errno, Errno::EBUSY, "{err}");
    assert!(err.to_string().contains(&target.display().to_string()), "the error names the path: {err}");
    mount::unmount(&target, true).unwrap();
    assert!(mounted(&target).is_none(), "detached from the tree at once");
    open.write_all(b"still usable through the open file").unwrap();
}

#[test]
fn errors_name_the_path_and_change_nothing() {
    if !in_private_namespace("errors_name_the_path_and_change_nothing") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let err = mount::bind(dir.path(), &missing, true, MsFlags::empty()).unwrap_err();
    assert_eq!((err.op, err.errno, err.path.clone()), ("bind", Errno::ENOENT, missing.clone()), "{err}");
    let err = mount::unmount(dir.path(), false).unwrap_err();
    assert_eq!(err.errno, Errno::EINVAL, "not a mount point: {err}");
    assert!(mounted(dir.path()).is_none() && mounted(&missing).is_none());
}
