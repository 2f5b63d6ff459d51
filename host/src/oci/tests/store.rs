use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use super::super::{Artifacts, RegistryConfig};
use super::*;
use crate::plan::Archive;

/// Put `bytes` in the cache as a finished download, last used `age` seconds ago.
fn put(root: &Path, bytes: &[u8], age: i64) -> String {
    let digest = sha256(bytes);
    let path = root.join("cache/blobs/sha256").join(digest.trim_start_matches("sha256:"));
    std::fs::write(&path, bytes).unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let t = rustix::fs::Timespec { tv_sec: now - age, tv_nsec: 0 };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        &path,
        &rustix::fs::Timestamps { last_access: t, last_modification: t },
        rustix::fs::AtFlags::empty(),
    )
    .unwrap();
    digest
}

fn cache() -> (tempfile::TempDir, PathBuf, std::sync::Arc<Artifacts>) {
    let (t, root) = tempdir();
    let a = Artifacts::new(root.join("cache"), RegistryConfig::default()).unwrap();
    (t, root, std::sync::Arc::new(a))
}

/// Link the tar blob `digest` into `vol/m` as the executor does (the unpacked tree is
/// hardlinked into the volume).
fn link_into_volume(a: &std::sync::Arc<Artifacts>, root: &Path, digest: &str) {
    let asm = crate::exec::artifacts::Assembler::new(a.clone());
    asm.assemble(digest, Archive::Tar, Default::default(), &root.join("vol/m"), &root.join("vol")).unwrap();
}

#[test]
fn eviction_takes_the_least_recently_used_first() {
    let (_t, root, a) = cache();
    let old = put(&root, &[1u8; 1000], 300);
    let used = put(&root, &[2u8; 1000], 200);
    let mid = put(&root, &[3u8; 1000], 100);
    let new = put(&root, &[4u8; 1000], 10);
    let in_use: BTreeSet<String> = [used.clone()].into();
    // 4000 bytes; keep 2000: `old` and `mid` go (`used` is in use), `new` stays.
    let p = a.prune(&in_use, 2000).unwrap();
    assert_eq!((p.blobs, p.bytes), (2, 2000));
    let left: Vec<String> = a.list(&BTreeMap::new()).unwrap().into_iter().map(|c| c.digest).collect();
    let mut want = vec![used.clone(), new.clone()];
    want.sort();
    assert_eq!(left, want);
    assert!(!left.contains(&old) && !left.contains(&mid));
    // Nothing to do when under the limit.
    assert_eq!(a.prune(&in_use, 1 << 30).unwrap().blobs, 0);
}

#[test]
fn entries_linked_into_a_volume_or_asked_for_are_kept() {
    let (_t, root, a) = cache();
    let tar = good_tar();
    let linked = put(&root, &tar, 500);
    let asked = put(&root, b"asked for", 400);
    let free = put(&root, b"free", 300);
    std::fs::create_dir(root.join("vol")).unwrap();
    link_into_volume(&a, &root, &linked);
    // A volume asked for `asked` (it is present, so nothing is downloaded).
    let src = super::super::Source {
        registry: "127.0.0.1:1".into(),
        repository: "r".into(),
        reference: "t".into(),
        mirror: None,
        credentials: Default::default(),
        insecure: false,
        platform: None,
    };
    let blob = super::super::BlobRef { digest: asked.clone(), size: 9, media_type: String::new() };
    assert_eq!(a.ensure("vol-1", &src, &[blob]), super::super::Ensure::Ready);
    let p = a.prune(&BTreeSet::new(), 0).unwrap();
    assert_eq!(p.blobs, 1);
    let left: BTreeSet<String> = a.list(&BTreeMap::new()).unwrap().into_iter().map(|c| c.digest).collect();
    assert!(left.contains(&linked) && left.contains(&asked) && !left.contains(&free), "{left:?}");
    // Once forgotten and unlinked, they go too.
    a.forget("vol-1");
    std::fs::remove_dir_all(root.join("vol/m")).unwrap();
    assert_eq!(a.prune(&BTreeSet::new(), 0).unwrap().blobs, 2);
    assert!(a.list(&BTreeMap::new()).unwrap().is_empty());
    assert_eq!(std::fs::read_dir(root.join("cache/trees/sha256")).unwrap().count(), 0);
}

#[test]
fn list_counts_the_tree_and_names_the_volumes() {
    let (_t, root, a) = cache();
    let tar = good_tar();
    let d = put(&root, &tar, 5);
    std::fs::create_dir(root.join("vol")).unwrap();
    link_into_volume(&a, &root, &d);
    let in_use: BTreeMap<String, Vec<String>> = [(d.clone(), vec!["pv-1".to_string()])].into();
    let l = a.list(&in_use).unwrap();
    assert_eq!(l.len(), 1);
    // The blob plus the tree's two distinct files (the hard link counts once).
    assert_eq!(l[0].size, tar.len() as u64 + 3 + 3000);
    assert_eq!(l[0].volumes, ["pv-1"]);
}

#[test]
fn the_shared_cache_directory_is_left_as_it_was() {
    use std::os::unix::fs::PermissionsExt;
    let (_t, root) = tempdir();
    let shared = root.join("cache");
    std::fs::create_dir_all(shared.join("plugins")).unwrap();
    std::fs::write(shared.join("plugins/x.cwasm"), b"x").unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).unwrap();
    let a = Artifacts::new(shared.clone(), RegistryConfig::default()).unwrap();
    assert_eq!(mode(&shared), 0o755);
    assert_eq!(mode(&shared.join("blobs")), 0o700);
    assert_eq!(mode(&shared.join("trees")), 0o700);
    assert!(a.list(&BTreeMap::new()).unwrap().is_empty());
    assert_eq!(a.prune(&BTreeSet::new(), 0).unwrap().blobs, 0);
    assert!(shared.join("plugins/x.cwasm").exists());
}

#[test]
fn ranges_files_a_kill_left_are_removed_at_start() {
    let (_t, root, a) = cache();
    drop(a);
    let blobs = root.join("cache/blobs/sha256");
    let hex = |n: u8| format!("{n:02x}").repeat(32);
    // Killed between the final rename and the ranges file's removal.
    std::fs::write(blobs.join(hex(1)), b"complete").unwrap();
    std::fs::write(blobs.join(format!("{}.partial.json", hex(1))), b"{}").unwrap();
    // A ranges file whose partial file is gone, and a temporary one.
    std::fs::write(blobs.join(format!("{}.partial.json", hex(2))), b"{}").unwrap();
    std::fs::write(blobs.join(format!("{}.partial.json.tmp", hex(3))), b"{}").unwrap();
    // An interrupted download: both kept for its resume.
    std::fs::write(blobs.join(format!("{}.partial", hex(4))), b"half").unwrap();
    std::fs::write(blobs.join(format!("{}.partial.json", hex(4))), b"{}").unwrap();
    // Not the cache's names: left alone.
    std::fs::write(blobs.join("notes.partial.json"), b"{}").unwrap();

    let _a = Artifacts::new(root.join("cache"), RegistryConfig::default()).unwrap();
    let mut left: Vec<String> =
        std::fs::read_dir(&blobs).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    left.sort();
    let mut want =
        vec![hex(1), format!("{}.partial", hex(4)), format!("{}.partial.json", hex(4)), "notes.partial.json".into()];
    want.sort();
    assert_eq!(left, want);
}

#[test]
fn an_unpack_another_daemon_runs_survives_a_start_and_a_dead_ones_does_not() {
    let (_t, root, a) = cache();
    drop(a);
    let trees = root.join("cache/trees/sha256");
    let running = trees.join(format!(".{}.tmp.77.0", "ab".repeat(32)));
    let dead = trees.join(format!(".{}.tmp.78.0", "cd".repeat(32)));
    let trash = trees.join(format!(".{}.trash.79.0", "ef".repeat(32)));
    for d in [&running, &dead, &trash] {
        std::fs::create_dir_all(d.join("sub")).unwrap();
        std::fs::write(d.join("sub/f"), b"x").unwrap();
    }
    let held = std::fs::File::open(&running).unwrap();
    rustix::fs::flock(&held, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();

    let _a = Artifacts::new(root.join("cache"), RegistryConfig::default()).unwrap();
    assert!(running.join("sub/f").exists(), "another daemon's unpack was removed");
    assert!(!dead.exists() && !trash.exists());
    drop(held);
    let _b = Artifacts::new(root.join("cache"), RegistryConfig::default()).unwrap();
    assert!(!running.exists());
}

#[test]
fn a_cached_blob_is_read_whole_verified_and_never_through_a_link() {
    let (_t, root, a) = cache();
    let digest = put(&root, b"plugin bytes", 0);
    assert_eq!(a.read_blob(&digest, 100).unwrap().as_deref(), Some(&b"plugin bytes"[..]));
    let err = a.read_blob(&digest, 5).unwrap_err().to_string();
    assert!(err.contains("more than the 5 read here"), "{err}");
    // A link in the blob's place (to a file whose bytes even match) reads as not cached.
    let hex = digest.trim_start_matches("sha256:");
    let blob = root.join("cache/blobs/sha256").join(hex);
    let outside = root.join("outside");
    std::fs::rename(&blob, &outside).unwrap();
    std::os::unix::fs::symlink(&outside, &blob).unwrap();
    assert_eq!(a.read_blob(&digest, 100).unwrap(), None);
    // So does a FIFO (opened without waiting for a writer, then refused as not a file).
    std::fs::remove_file(&blob).unwrap();
    nix::unistd::mkfifo(&blob, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    assert_eq!(a.read_blob(&digest, 100).unwrap(), None);
    // Bytes that do not match the digest are refused.
    std::fs::remove_file(&blob).unwrap();
    std::fs::write(&blob, b"other bytes").unwrap();
    let err = a.read_blob(&digest, 100).unwrap_err();
    assert!(matches!(err, crate::oci::OciError::DigestMismatch { .. }), "{err}");
}
