use std::os::unix::fs::{PermissionsExt, symlink};
use std::sync::atomic::Ordering;

use super::*;

fn both(root: &Path) -> [Anchors; 2] {
    let a = Anchors::new([root.to_path_buf()]);
    [a.clone(), a.with_walk()]
}

fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(dir.path()).unwrap();
    let root = base.join("root");
    let outside = base.join("outside");
    std::fs::create_dir_all(root.join("a/b")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret"), b"s").unwrap();
    symlink(&outside, root.join("a/evil")).unwrap();
    symlink("b", root.join("a/rel")).unwrap();
    (dir, root, outside)
}

#[test]
fn links_are_refused_at_every_component_with_the_link_named() {
    let (_d, root, _outside) = setup();
    for a in both(&root) {
        for p in ["a/evil", "a/evil/secret", "a/rel", "a/rel/x"] {
            let e = a.open(&root.join(p), OFlags::PATH).unwrap_err();
            assert!(is_link_refused(&e), "{p}: {e}");
            assert!(e.to_string().contains("is a symbolic link"), "{e}");
        }
        a.open(&root.join("a/b"), OFlags::PATH).expect("plain directories resolve");
        let e = a.open(Path::new("/etc"), OFlags::PATH).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
    }
}

#[test]
fn mkdir_creates_below_only_and_never_through_links() {
    let (_d, root, outside) = setup();
    for (i, a) in both(&root).into_iter().enumerate() {
        let p = root.join(format!("a/b/new{i}/deeper"));
        a.mkdir(&p, &root.join("a/b"), 0o750).unwrap();
        assert!(p.is_dir());
        a.mkdir(&p, &root.join("a/b"), 0o750).expect("existing is fine");
        let e = a.mkdir(&root.join("a/evil/x"), &root.join("a"), 0o750).unwrap_err();
        assert!(is_link_refused(&e), "{e}");
        let e = a.mkdir(&root.join("missing/x"), &root.join("missing"), 0o750).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("missing does not exist"), "{e}");
    }
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 1, "nothing created outside");
}

#[test]
fn remove_tree_unlinks_links_and_stops_at_nothing_outside() {
    let (_d, root, outside) = setup();
    for a in both(&root) {
        std::fs::create_dir_all(root.join("t/x/y")).unwrap();
        std::fs::write(root.join("t/x/y/f"), b"1").unwrap();
        symlink(&outside, root.join("t/x/out")).unwrap();
        a.remove_tree(&root.join("t")).unwrap();
        assert!(!root.join("t").exists());
        a.remove_tree(&root.join("t")).expect("missing is fine");
        assert!(outside.join("secret").exists(), "a link's target is never touched");
        // A link as the tree itself is removed, not followed.
        symlink(&outside, root.join("t")).unwrap();
        a.remove_tree(&root.join("t")).unwrap();
        assert!(outside.join("secret").exists() && std::fs::symlink_metadata(root.join("t")).is_err());
        // Through a link on the way: refused.
        let e = a.remove_tree(&root.join("a/evil/secret")).unwrap_err();
        assert!(is_link_refused(&e), "{e}");
        assert!(outside.join("secret").exists());
    }
}

#[test]
fn a_synced_write_leaves_no_earlier_content_in_a_spare() {
    let (_d, root, _outside) = setup();
    let a = &both(&root)[0];
    let p = root.join("a/secrets.json");
    for old in [&b"rotated-1"[..], b"rotated-2"] {
        a.write_atomic(&p, old, 0o600, false).unwrap();
    }
    let spare = root.join("a/.secrets.json.spare");
    assert_eq!(std::fs::read(&spare).unwrap(), b"rotated-1", "the exchange keeps the earlier content");
    a.write_atomic(&p, b"current", 0o600, true).unwrap();
    assert_eq!(a.read(&p).unwrap().unwrap(), b"current");
    assert!(!spare.exists(), "the spare with an earlier secret is gone");
    let names: Vec<_> = std::fs::read_dir(root.join("a")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(!names.iter().any(|n| n.to_string_lossy().contains(".tmp.")), "{names:?}");
}

#[test]
fn atomic_writes_are_private_and_leave_no_temporary() {
    let (_d, root, outside) = setup();
    let a = &both(&root)[0];
    let p = root.join("a/state.json");
    a.write_atomic(&p, b"one", 0o600, false).unwrap();
    a.write_atomic(&p, b"two", 0o600, true).unwrap();
    assert_eq!(a.read(&p).unwrap().unwrap(), b"two");
    // The exchange: longer, then shorter content; the spare keeps the old one, never torn.
    a.write_atomic(&p, b"three-longer", 0o600, false).unwrap();
    a.write_atomic(&p, b"four", 0o600, false).unwrap();
    assert_eq!(a.read(&p).unwrap().unwrap(), b"four");
    let spare = root.join("a/.state.json.spare");
    assert_eq!(std::fs::read(&spare).unwrap(), b"three-longer", "the previous content, swapped out whole");
    assert_eq!(std::fs::metadata(&spare).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(a.read(&root.join("a/none")).unwrap(), None);
    let names: Vec<_> = a.list(&root.join("a")).unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names, [".state.json.spare", "b", "evil", "rel", "state.json"].map(OsString::from));
    let e = a.write_atomic(&root.join("a/evil/planted"), b"x", 0o600, false).unwrap_err();
    assert!(is_link_refused(&e), "{e}");
    assert!(!outside.join("planted").exists());
    let e = a.read(&root.join("a/evil/secret")).unwrap_err();
    assert!(is_link_refused(&e), "{e}");
    a.remove_entry(&p).unwrap();
    assert!(!spare.exists(), "the spare goes with its file");
    a.remove_entry(&p).expect("gone is fine");
    a.remove_entry(&root.join("a/evil")).unwrap();
    assert!(outside.join("secret").exists(), "removing a link leaves its target");
}

#[test]
fn a_spare_that_is_not_a_lone_regular_file_is_replaced_not_written_through() {
    let (_d, root, outside) = setup();
    let a = &both(&root)[0];
    let p = root.join("a/state.json");
    let spare = root.join("a/.state.json.spare");
    a.write_atomic(&p, b"one", 0o600, false).unwrap();
    // A second name for a file elsewhere in the tree, and a link out: neither is written.
    std::fs::write(root.join("a/b/other"), b"other").unwrap();
    std::fs::hard_link(root.join("a/b/other"), &spare).unwrap();
    a.write_atomic(&p, b"two", 0o600, false).unwrap();
    assert_eq!(std::fs::read(root.join("a/b/other")).unwrap(), b"other");
    assert_eq!(a.read(&p).unwrap().unwrap(), b"two");
    std::fs::remove_file(&spare).unwrap();
    symlink(outside.join("secret"), &spare).unwrap();
    a.write_atomic(&p, b"three", 0o600, false).unwrap();
    assert_eq!(std::fs::read(outside.join("secret")).unwrap(), b"s");
    assert_eq!(a.read(&p).unwrap().unwrap(), b"three");
    assert!(std::fs::symlink_metadata(&spare).unwrap().is_file(), "a fresh spare");
    // A FIFO (opening it would block) and an empty directory: replaced too.
    std::fs::remove_file(&spare).unwrap();
    rustix::fs::mknodat(rustix::fs::CWD, &spare, FileType::Fifo, Mode::from_raw_mode(0o600), 0).unwrap();
    a.write_atomic(&p, b"four", 0o600, false).unwrap();
    std::fs::remove_file(&spare).unwrap();
    std::fs::create_dir(&spare).unwrap();
    a.write_atomic(&p, b"five", 0o600, false).unwrap();
    assert_eq!(a.read(&p).unwrap().unwrap(), b"five");
    assert!(std::fs::symlink_metadata(&spare).unwrap().is_file(), "a fresh spare");
}

#[test]
fn concurrent_writers_and_readers_never_see_a_torn_file() {
    let (_d, root, _) = setup();
    let a = std::sync::Arc::new(both(&root)[0].clone());
    let p = root.join("a/contended.json");
    let value = |w: usize, i: usize| format!("{w}:{i}:{}", "x".repeat((w * 37 + i * 11) % 3000)).into_bytes();
    a.write_atomic(&p, &value(0, 0), 0o600, false).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (a, p, stop) = (a.clone(), p.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut reads = 0;
            while !stop.load(Ordering::Relaxed) {
                let got = a.read(&p).unwrap().expect("the file is never missing");
                let text = String::from_utf8(got).unwrap();
                let mut parts = text.splitn(3, ':');
                let (w, i) = (parts.next().unwrap().parse::<usize>().unwrap(), parts.next().unwrap().parse().unwrap());
                assert_eq!(text.into_bytes(), value(w, i), "a whole value");
                reads += 1;
            }
            reads
        })
    };
    let writers: Vec<_> = (1..=4)
        .map(|w| {
            let (a, p) = (a.clone(), p.clone());
            std::thread::spawn(move || {
                for i in 0..300 {
                    a.write_atomic(&p, &value(w, i), 0o600, false).unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);
}

#[test]
fn private_dirs_are_tightened() {
    let (_d, root, _) = setup();
    let a = &both(&root)[0];
    std::fs::create_dir_all(root.join("s/v")).unwrap();
    std::fs::set_permissions(root.join("s/v"), std::fs::Permissions::from_mode(0o755)).unwrap();
    a.private_dir(&root.join("s/v")).unwrap();
    assert_eq!(std::fs::metadata(root.join("s/v")).unwrap().permissions().mode() & 0o777, 0o700);
    a.private_dir(&root.join("s/w/x")).unwrap();
    assert_eq!(std::fs::metadata(root.join("s/w/x")).unwrap().permissions().mode() & 0o777, 0o700);
}

/// A directory chain deeper than `PATH_MAX`, made relative to each other as a pod can: paths
/// into it resolve (in pieces), links at a piece's end or inside a piece are still refused.
#[test]
fn paths_longer_than_path_max_resolve_in_pieces_and_still_refuse_links() {
    let (_d, root, outside) = setup();
    let name = "d".repeat(255);
    // `chain[i]` is the directory `i` levels below the root.
    let mut chain = vec![rustix::fs::open(&root, OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).unwrap()];
    let mut deep = root.clone();
    for _ in 0..18 {
        let at = chain.last().unwrap();
        rustix::fs::mkdirat(at, name.as_str(), Mode::from_raw_mode(0o755)).unwrap();
        chain.push(rustix::fs::openat(at, name.as_str(), OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).unwrap());
        deep.push(&name);
    }
    let file = OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC;
    rustix::io::write(rustix::fs::openat(&chain[18], "f", file, Mode::from_raw_mode(0o644)).unwrap(), b"deep").unwrap();
    assert!(deep.strip_prefix(&root).unwrap().as_os_str().len() > 4096);
    // Component 16 ends the first piece: a link there, and one in the middle of a piece.
    let piece_end = (0..15).fold(root.clone(), |p, _| p.join(&name));
    let link = "l".repeat(255);
    rustix::fs::symlinkat(&outside, &chain[15], link.as_str()).unwrap();
    rustix::fs::symlinkat(&outside, &chain[18], "mid").unwrap();
    for a in both(&root) {
        let fd = a.open(&deep.join("f"), OFlags::RDONLY).expect("a path deeper than PATH_MAX resolves");
        let mut buf = [0u8; 8];
        let n = rustix::io::read(&fd, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"deep");
        a.mkdir(&deep.join("made"), &deep, 0o750).expect("mkdir below a deep directory");
        for p in [piece_end.join(&link).join("secret"), deep.join("mid/secret")] {
            let e = a.open(&p, OFlags::RDONLY).unwrap_err();
            assert!(is_link_refused(&e), "{} bytes: {e}", p.as_os_str().len());
        }
        // A final link, opened as a directory: refused as a link, not just "not a directory".
        for p in [piece_end.join(&link), deep.join("mid")] {
            let e = a.open(&p, OFlags::RDONLY | OFlags::DIRECTORY).unwrap_err();
            assert!(is_link_refused(&e), "{} bytes: {e}", p.as_os_str().len());
        }
    }
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 1, "nothing created outside");
}

/// A directory opened for reading is opened in one call: links on the way and at the end are
/// refused naming the link, anything but a directory (a FIFO that would block an open, a file)
/// is ENOTDIR without being opened.
#[test]
fn a_directory_opened_for_reading_refuses_links_and_non_directories() {
    let (_d, root, _outside) = setup();
    rustix::fs::mknodat(rustix::fs::CWD, root.join("a/fifo"), FileType::Fifo, Mode::from_raw_mode(0o600), 0).unwrap();
    std::fs::write(root.join("a/file"), b"x").unwrap();
    for a in both(&root) {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY;
        for p in ["a/evil", "a/evil/x", "a/rel"] {
            let e = a.open(&root.join(p), flags).unwrap_err();
            assert!(is_link_refused(&e), "{p}: {e}");
        }
        for p in ["a/fifo", "a/file"] {
            let e = a.open(&root.join(p), flags).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::NotADirectory, "{p}: {e}");
        }
        let fd = a.open(&root.join("a/b"), flags).unwrap();
        assert_eq!(list_fd(&fd).unwrap(), Vec::<Entry>::new(), "a/b is an empty directory, listed");
    }
}
