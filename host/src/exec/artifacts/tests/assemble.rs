use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;

use super::super::{Assembler, Prepared};
use super::*;
use crate::oci::{Artifacts, RegistryConfig};
use crate::plan::Archive;
use crate::plan::tar_rules::Layering;

/// An empty cache with `blob` stored in it (as a download leaves it: 0444), and a volume
/// directory to assemble into.
fn cache_with(blob: &[u8]) -> (tempfile::TempDir, Arc<Assembler>, String, PathBuf) {
    let (t, root) = tempdir();
    let a = Assembler::new(Arc::new(Artifacts::new(root.join("cache"), RegistryConfig::default()).unwrap()));
    let digest = sha256(blob);
    let path = root.join("cache/blobs/sha256").join(digest.trim_start_matches("sha256:"));
    std::fs::write(&path, blob).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o444)).unwrap();
    std::fs::create_dir(root.join("vol")).unwrap();
    (t, a, digest, root)
}

#[test]
fn a_layer_is_unpacked_once_and_linked_into_each_destination() {
    let (_t, a, digest, root) = cache_with(&gzip(&good_tar()));
    let below = root.join("vol");
    let dest = below.join("models/m1");
    a.assemble(&digest, Archive::TarGzip, Layering::Files, &dest, &below).unwrap();
    let tree = root.join("cache/trees/sha256").join(digest.trim_start_matches("sha256:"));
    assert_eq!(ino(&dest.join("a/b.txt")), ino(&tree.join("a/b.txt")), "hardlinked, not copied");
    assert_eq!(std::fs::read(dest.join("x/y/z.bin")).unwrap(), vec![7u8; 3000]);
    assert_eq!(mode(&dest.join("a/b.txt")), 0o444);
    assert_eq!(std::fs::read_link(dest.join("a/c/up")).unwrap(), Path::new("../b.txt"));
    assert_eq!(std::fs::read(dest.join("a/c/up")).unwrap(), b"bee");
    let tree_mtime = std::fs::metadata(&tree).unwrap().mtime_nsec();

    // Again into the same place: nothing changes. Into a second place: the same tree.
    a.assemble(&digest, Archive::TarGzip, Layering::Files, &dest, &below).unwrap();
    assert_eq!(ino(&dest.join("a/b.txt")), ino(&tree.join("a/b.txt")));
    let dest2 = below.join("other");
    a.assemble(&digest, Archive::TarGzip, Layering::Files, &dest2, &below).unwrap();
    assert_eq!(ino(&dest2.join("a/b.txt")), ino(&tree.join("a/b.txt")));
    assert_eq!(std::fs::metadata(&tree).unwrap().mtime_nsec(), tree_mtime, "not unpacked twice");
    let leftovers: Vec<_> = std::fs::read_dir(&dest).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers.len(), 2, "only a/ and x/: {leftovers:?}");
}

#[test]
fn a_raw_blob_is_linked_as_the_destination_file() {
    let (_t, a, digest, root) = cache_with(b"weights");
    let below = root.join("vol");
    let dest = below.join("m/model.bin");
    a.assemble(&digest, Archive::Raw, Layering::Files, &dest, &below).unwrap();
    a.assemble(&digest, Archive::Raw, Layering::Files, &dest, &below).unwrap();
    let blob = root.join("cache/blobs/sha256").join(digest.trim_start_matches("sha256:"));
    assert_eq!(ino(&dest), ino(&blob));
    assert_eq!(std::fs::read(&dest).unwrap(), b"weights");
}

#[test]
fn a_planted_link_is_replaced_never_followed() {
    let (_t, a, digest, root) = cache_with(&good_tar());
    let (_t2, elsewhere) = tempdir();
    std::fs::write(elsewhere.join("victim"), b"keep").unwrap();
    let below = root.join("vol");
    let dest = below.join("m");
    std::fs::create_dir_all(dest.join("a")).unwrap();
    std::os::unix::fs::symlink(elsewhere.join("victim"), dest.join("a/b.txt")).unwrap();

    // The file link is replaced by the file itself, not written through.
    a.assemble(&digest, Archive::Tar, Layering::Files, &dest, &below).unwrap();
    assert!(std::fs::symlink_metadata(dest.join("a/b.txt")).unwrap().is_file());
    assert_eq!(std::fs::read(elsewhere.join("victim")).unwrap(), b"keep");

    // A link where the tree has a directory: refused, nothing written there.
    std::fs::remove_dir_all(dest.join("x")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, dest.join("x")).unwrap();
    let e = a.assemble(&digest, Archive::Tar, Layering::Files, &dest, &below).unwrap_err();
    assert!(e.to_string().contains("not a directory"), "{e}");
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 1);

    // A link on the way to the destination is refused.
    std::os::unix::fs::symlink(&elsewhere, below.join("via")).unwrap();
    let e = a.assemble(&digest, Archive::Tar, Layering::Files, &below.join("via/m"), &below).unwrap_err();
    assert!(crate::exec::beneath::is_link_refused(&e), "{e}");
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 1);
}

#[test]
fn a_refused_archive_leaves_no_tree() {
    let bad = TarOf::new().file("ok", b"fine").file("../evil", b"x").bytes();
    let (_t, a, digest, root) = cache_with(&bad);
    let below = root.join("vol");
    let e = a.assemble(&digest, Archive::Tar, Layering::Files, &below.join("m"), &below).unwrap_err();
    assert!(e.to_string().contains("../evil"), "{e}");
    assert_eq!(std::fs::read_dir(root.join("cache/trees/sha256")).unwrap().count(), 0, "no tree, no temp");
}

#[test]
fn a_missing_blob_says_so() {
    let (_t, a, _digest, root) = cache_with(b"x");
    let other = sha256(b"not there");
    let e = a.assemble(&other, Archive::Tar, Layering::Files, &root.join("vol/m"), &root.join("vol")).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    assert!(e.to_string().contains(&other), "{e}");
}

#[test]
fn another_filesystem_gets_a_copy() {
    // /dev/shm is a tmpfs on most machines: a hardlink there from the cache fails with EXDEV.
    let shm = Path::new("/dev/shm");
    let (_t, a, digest, root) = cache_with(&good_tar());
    if !shm.is_dir() || std::fs::metadata(shm).unwrap().dev() == std::fs::metadata(&root).unwrap().dev() {
        eprintln!("skipped: no second filesystem at /dev/shm");
        return;
    }
    let other = tempfile::tempdir_in(shm).unwrap();
    let below = other.path().canonicalize().unwrap();
    let dest = below.join("m");
    a.assemble(&digest, Archive::Tar, Layering::Files, &dest, &below).unwrap();
    assert_eq!(std::fs::read(dest.join("a/b.txt")).unwrap(), b"bee");
    assert_eq!(mode(&dest.join("a/b.txt")), 0o444);
    let first = ino(&dest.join("a/b.txt"));
    a.assemble(&digest, Archive::Tar, Layering::Files, &dest, &below).unwrap();
    assert_eq!(ino(&dest.join("a/b.txt")), first, "a copy already made is kept");
}

/// `prepare` until it stops answering `Working` (30 s at most).
fn prepared(a: &Arc<Assembler>, digest: &str, format: Archive) -> Prepared {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match a.prepare(digest, format, Layering::Files) {
            Prepared::Working if std::time::Instant::now() < until => {
                std::thread::sleep(std::time::Duration::from_millis(5))
            }
            other => return other,
        }
    }
}

#[test]
fn prepare_unpacks_in_the_background_once_and_assemble_only_links() {
    // Big enough that the unpack is still running when `prepare` returns.
    let big = TarOf::new().file("w.bin", &vec![9u8; 32 << 20]).file("small", b"s").bytes();
    let (_t, a, digest, root) = cache_with(&zstd(&big));
    let tree = root.join("cache/trees/sha256").join(digest.trim_start_matches("sha256:"));
    let started = std::time::Instant::now();
    assert_eq!(a.prepare(&digest, Archive::TarZstd, Layering::Files), Prepared::Working);
    assert!(started.elapsed() < std::time::Duration::from_millis(200), "prepare blocked");
    // Asked again while it runs: the same unpack.
    assert_eq!(a.prepare(&digest, Archive::TarZstd, Layering::Files), Prepared::Working);
    assert_eq!(prepared(&a, &digest, Archive::TarZstd), Prepared::Ready);
    assert!(tree.join("w.bin").is_file());
    let trees: Vec<_> =
        std::fs::read_dir(root.join("cache/trees/sha256")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(trees.len(), 1, "one tree, no temporary left: {trees:?}");
    let unpacked = std::fs::metadata(&tree).unwrap().mtime_nsec();

    let below = root.join("vol");
    a.assemble(&digest, Archive::TarZstd, Layering::Files, &below.join("m"), &below).unwrap();
    assert_eq!(ino(&below.join("m/w.bin")), ino(&tree.join("w.bin")));
    assert_eq!(std::fs::metadata(&tree).unwrap().mtime_nsec(), unpacked, "assemble did not unpack again");
    assert_eq!(a.prepare(&digest, Archive::TarZstd, Layering::Files), Prepared::Ready);
}

#[test]
fn prepare_says_ready_at_once_for_a_raw_blob() {
    let (_t, a, digest, _root) = cache_with(b"weights");
    assert_eq!(a.prepare(&digest, Archive::Raw, Layering::Files), Prepared::Ready);
}

#[test]
fn a_failed_unpack_is_reported_once_then_tried_again() {
    let bad = TarOf::new().file("ok", b"fine").file("../evil", b"x").bytes();
    let (_t, a, digest, root) = cache_with(&bad);
    let Prepared::Failed(e) = prepared(&a, &digest, Archive::Tar) else { panic!("must fail") };
    assert!(e.to_string().contains("../evil") && e.to_string().contains("refused"), "{e}");
    assert_eq!(std::fs::read_dir(root.join("cache/trees/sha256")).unwrap().count(), 0, "no tree, no temp");
    // Reported once: the next call starts over (and fails again).
    assert!(matches!(a.prepare(&digest, Archive::Tar, Layering::Files), Prepared::Working | Prepared::Failed(_)));
    assert!(matches!(prepared(&a, &digest, Archive::Tar), Prepared::Failed(_)));
    // A blob the cache does not hold.
    let Prepared::Failed(e) = a.prepare(&sha256(b"absent"), Archive::Tar, Layering::Files) else { panic!("must fail") };
    assert!(e.to_string().contains("not in the model cache"), "{e}");
    assert!(matches!(a.prepare("sha256:nope", Archive::Tar, Layering::Files), Prepared::Failed(_)));
}

#[test]
fn temporary_names_an_interrupted_assemble_left_are_removed() {
    let (_t, a, digest, root) = cache_with(&good_tar());
    let below = root.join("vol");
    let dest = below.join("m");
    std::fs::create_dir_all(dest.join("a")).unwrap();
    // A kill -9 between linking under the temporary name and the rename leaves these.
    for left in [".b.txt.mh-link.4242.0", "a/.b.txt.mh-link.1.17", "a/.link.mh-link.1.18", ".x.mh-link.7.7"] {
        std::fs::write(dest.join(left), b"stale").unwrap();
    }
    // Not ours to remove: no tree entry of that name, a directory, not our pattern.
    for keep in ["a/.notintree.mh-link.1.2", "a/.b.txt.mh-link.x.2", "a/.b.txt.mh-link.1"] {
        std::fs::write(dest.join(keep), b"pod's").unwrap();
    }
    std::fs::create_dir(dest.join("a/.hard.mh-link.1.3")).unwrap();
    a.assemble(&digest, Archive::Tar, Layering::Files, &dest, &below).unwrap();
    for left in ["a/.b.txt.mh-link.1.17", "a/.link.mh-link.1.18", ".x.mh-link.7.7"] {
        assert!(dest.join(left).symlink_metadata().is_err(), "{left} is still there");
    }
    // `.b.txt…` at the top: the tree has no `b.txt` there.
    assert!(dest.join(".b.txt.mh-link.4242.0").exists());
    for keep in ["a/.notintree.mh-link.1.2", "a/.b.txt.mh-link.x.2", "a/.b.txt.mh-link.1", "a/.hard.mh-link.1.3"] {
        assert!(dest.join(keep).exists(), "{keep} was removed");
    }

    // A raw blob's destination too.
    let (_t2, a, digest, root) = cache_with(b"weights");
    let below = root.join("vol");
    std::fs::create_dir_all(below.join("m")).unwrap();
    std::fs::write(below.join("m/.model.bin.mh-link.9.9"), b"stale").unwrap();
    a.assemble(&digest, Archive::Raw, Layering::Files, &below.join("m/model.bin"), &below).unwrap();
    let names: Vec<_> = std::fs::read_dir(below.join("m")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["model.bin"]);
}

#[test]
fn two_daemons_unpacking_the_same_layer_at_once_both_succeed() {
    let big = TarOf::new().file("w.bin", &vec![5u8; 8 << 20]).bytes();
    let (_t, a, digest, root) = cache_with(&big);
    // A second cache on the same directory: digest locks are per process.
    let b = Assembler::new(Arc::new(Artifacts::new(root.join("cache"), RegistryConfig::default()).unwrap()));
    std::fs::create_dir(root.join("vol2")).unwrap();
    let (va, vb) = (root.join("vol"), root.join("vol2"));
    std::thread::scope(|s| {
        let one = s.spawn(|| a.assemble(&digest, Archive::Tar, Layering::Files, &va.join("m"), &va));
        let two = s.spawn(|| b.assemble(&digest, Archive::Tar, Layering::Files, &vb.join("m"), &vb));
        one.join().unwrap().unwrap();
        two.join().unwrap().unwrap();
    });
    assert_eq!(std::fs::read(vb.join("m/w.bin")).unwrap().len(), 8 << 20);
    let trees: Vec<_> =
        std::fs::read_dir(root.join("cache/trees/sha256")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(trees.len(), 1, "{trees:?}");
}
