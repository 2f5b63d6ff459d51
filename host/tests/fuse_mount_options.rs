//! Real FUSE mounts of connections the host opens (WIT `fuse-mount.host-fd`), as root, in a
//! private mount namespace: every mount option a plan may name (the policy's
//! `HOST_MOUNT_OPTIONS`, and `max_read=`) mounts, and shows in mountinfo where the kernel puts
//! it. `noexec` and the atime options are mount(2) flags (per-mount options), the kernel's FUSE
//! parser refuses them as data; `default_permissions` and `max_read` are FUSE data
//! (superblock options). No server runs: the connection is mounted, read back from the mount
//! table and detached.

mod common;

use std::os::fd::OwnedFd;
use std::path::Path;

use common::in_private_namespace;
use mounthost::exec::beneath::Anchors;
use mounthost::exec::mount::{mount_fuse, unmount};
use mounthost::exec::mountinfo;
use mounthost::plan::policy::HOST_MOUNT_OPTIONS;
use rustix::fs::{Mode, OFlags};

fn open_fuse() -> OwnedFd {
    rustix::fs::open("/dev/fuse", OFlags::RDWR | OFlags::CLOEXEC, Mode::empty()).expect("opening /dev/fuse")
}

#[test]
fn every_host_fd_mount_option_mounts() {
    if !nix::unistd::Uid::effective().is_root() || !Path::new("/dev/fuse").exists() {
        eprintln!("skipped: needs root and /dev/fuse");
        return;
    }
    if !in_private_namespace("every_host_fd_mount_option_mounts") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let anchors = Anchors::new([root.clone()]);
    let options: Vec<String> =
        HOST_MOUNT_OPTIONS.iter().map(|o| o.to_string()).chain(["max_read=65536".to_string()]).collect();
    // Each alone, then all together (the atime ones: the last named wins).
    let mut cases: Vec<Vec<String>> = options.iter().map(|o| vec![o.clone()]).collect();
    cases.push(options.clone());
    for (n, case) in cases.iter().enumerate() {
        let target = root.join(format!("m{n}"));
        std::fs::create_dir(&target).unwrap();
        let dev = open_fuse();
        mount_fuse(&anchors, &dev, "fuse.test", "src", &target, 2147418112, 2147418112, case, true)
            .unwrap_or_else(|e| panic!("mounting with {case:?}: {e}"));
        let entry = mountinfo::at(&mountinfo::read().unwrap(), &target).cloned().expect("mounted");
        drop(dev);
        unmount(&anchors, &target, true).unwrap();
        let per_mount: Vec<&str> = entry.mount_options.split(',').collect();
        let superblock: Vec<&str> = entry.super_options.split(',').collect();
        for o in ["ro", "nosuid", "nodev"] {
            assert!(per_mount.contains(&o), "{case:?}: {o} in {per_mount:?}");
        }
        for o in ["user_id=2147418112", "group_id=2147418112", "allow_other"] {
            assert!(superblock.contains(&o), "{case:?}: {o} in {superblock:?}");
        }
        let last_atime = case.iter().rev().find(|o| o.ends_with("atime") && *o != "nodiratime");
        for o in case {
            match o.as_str() {
                "default_permissions" | "max_read=65536" => {
                    assert!(superblock.contains(&o.as_str()), "{case:?}: {o} in {superblock:?}")
                }
                "noexec" | "nodiratime" => assert!(per_mount.contains(&o.as_str()), "{case:?}: {o} in {per_mount:?}"),
                // mountinfo names relatime and noatime; strictatime is neither.
                _ if Some(o) != last_atime => {}
                "strictatime" => assert!(
                    !per_mount.contains(&"relatime") && !per_mount.contains(&"noatime"),
                    "{case:?}: {per_mount:?}"
                ),
                _ => assert!(per_mount.contains(&o.as_str()), "{case:?}: {o} in {per_mount:?}"),
            }
        }
        assert!(mountinfo::at(&mountinfo::read().unwrap(), &target).is_none(), "detached");
    }
    println!("checked: {} mounts with host-fd options {options:?}", cases.len());
}
