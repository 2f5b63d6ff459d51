//! Image layers applied over each other: whiteouts, opaque directories, replacement across
//! types, owners and modes, entries left out. (Root owns the test run: owners are set.)

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;

use super::super::Assembler;
use super::super::unpack::{IMPLICIT_MARKER, LeftOut, unpack_layer};
use super::*;
use crate::oci::{Artifacts, RegistryConfig};
use crate::plan::Archive;
use crate::plan::tar_rules::Layering;

/// A tar entry with an owner.
fn entry(
    b: &mut tar::Builder<Vec<u8>>,
    name: &str,
    kind: tar::EntryType,
    link: Option<&str>,
    mode: u32,
    owner: u64,
    data: &[u8],
) {
    b.append(&header(name, kind, link, mode, (owner, owner), data.len()), data).unwrap();
}

use tar::EntryType::{Block, Char, Directory as Dir, Fifo, Link, Regular as File, Symlink};

fn lower() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    entry(&mut b, "models/", Dir, None, 0o750, 7, b"");
    entry(&mut b, "models/private", File, None, 0o600, 1000, b"secret weights");
    entry(&mut b, "models/deleted", File, None, 0o644, 0, b"gone");
    entry(&mut b, "models/replaced", File, None, 0o644, 0, b"old");
    entry(&mut b, "models/sub/", Dir, None, 0o755, 0, b"");
    entry(&mut b, "models/sub/hidden", File, None, 0o644, 0, b"hidden by opaque");
    entry(&mut b, "models/dir2/", Dir, None, 0o755, 0, b"");
    entry(&mut b, "models/dir2/child", File, None, 0o644, 0, b"child");
    entry(&mut b, "models/f", File, None, 0o644, 0, b"a file, then a directory");
    entry(&mut b, "models/suid", File, None, 0o4755, 0, b"#!");
    entry(&mut b, "models/abs", Symlink, Some("/etc/passwd"), 0o777, 0, b"");
    entry(&mut b, "models/up", Symlink, Some("../../../x"), 0o777, 0, b"");
    entry(&mut b, "models/link", Link, Some("models/private"), 0o600, 1000, b"");
    entry(&mut b, "models/dangling", Link, Some("models/nowhere"), 0o644, 0, b"");
    entry(&mut b, "dev/null", Char, None, 0o666, 0, b"");
    entry(&mut b, "dev/sda", Block, None, 0o660, 0, b"");
    entry(&mut b, "run/pipe", Fifo, None, 0o600, 0, b"");
    entry(&mut b, "../escape", File, None, 0o644, 0, b"no");
    entry(&mut b, "etc/outside", File, None, 0o644, 0, b"outside /models");
    b.into_inner().unwrap()
}

fn upper() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    entry(&mut b, "models/.wh.deleted", File, None, 0o644, 0, b"");
    entry(&mut b, "models/replaced", File, None, 0o640, 5, b"new content");
    entry(&mut b, "models/sub/", Dir, None, 0o700, 3, b"");
    entry(&mut b, "models/sub/.wh..wh..opq", File, None, 0o644, 0, b"");
    entry(&mut b, "models/sub/fresh", File, None, 0o644, 0, b"fresh");
    entry(&mut b, "models/dir2", File, None, 0o644, 0, b"a directory, then a file");
    entry(&mut b, "models/f/", Dir, None, 0o755, 0, b"");
    entry(&mut b, "models/f/g", File, None, 0o644, 0, b"g");
    entry(&mut b, "models/.wh..wh.plnk", File, None, 0o644, 0, b"");
    b.into_inner().unwrap()
}

/// Only implies `models/`: its owner and mode stay the lower layer's.
fn implying() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    entry(&mut b, "models/new/x", File, None, 0o644, 0, b"x");
    b.into_inner().unwrap()
}

/// A cache holding `blobs`, their digests, and a volume directory.
fn cache_of(blobs: &[Vec<u8>]) -> (tempfile::TempDir, Arc<Assembler>, Vec<String>, PathBuf) {
    let (t, root) = tempdir();
    let a = Assembler::new(Arc::new(Artifacts::new(root.join("cache"), RegistryConfig::default()).unwrap()));
    let digests = blobs
        .iter()
        .map(|blob| {
            let digest = sha256(blob);
            let path = root.join("cache/blobs/sha256").join(digest.trim_start_matches("sha256:"));
            std::fs::write(&path, blob).unwrap();
            digest
        })
        .collect();
    std::fs::create_dir(root.join("vol")).unwrap();
    (t, a, digests, root)
}

fn owner_mode(p: &Path) -> (u32, u32) {
    let m = std::fs::symlink_metadata(p).unwrap();
    (m.uid(), m.mode() & 0o7777)
}

#[test]
fn image_layers_apply_in_order_with_whiteouts_owners_and_modes() {
    let (_t, a, d, root) = cache_of(&[gzip(&lower()), upper(), zstd(&implying())]);
    let below = root.join("vol");
    let dest = below.join("model");
    let formats = [Archive::TarGzip, Archive::Tar, Archive::TarZstd];
    // Twice: a restage applies every layer again and ends with the same tree.
    for _ in 0..2 {
        for (digest, format) in d.iter().zip(formats) {
            a.assemble(digest, format, Layering::Image, &dest, &below).unwrap();
        }
        let m = dest.join("models");
        assert_eq!(owner_mode(&m), (7, 0o750), "models/ keeps the lower layer's owner: the top one only implies it");
        assert_eq!(std::fs::read(m.join("private")).unwrap(), b"secret weights");
        assert_eq!(owner_mode(&m.join("private")), (1000, 0o600));
        assert_eq!(ino(&m.join("link")), ino(&m.join("private")), "a hard link inside a layer stays one");
        assert!(!m.join("deleted").exists(), "whiteout");
        assert!(!m.join("dangling").exists(), "a hard link to nothing is left out");
        assert_eq!(std::fs::read(m.join("replaced")).unwrap(), b"new content");
        assert_eq!(owner_mode(&m.join("replaced")), (5, 0o640));
        let sub: Vec<_> = std::fs::read_dir(m.join("sub")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(sub, ["fresh"], "opaque: the lower layer's entries are gone, the layer's own stay");
        assert_eq!(owner_mode(&m.join("sub")), (3, 0o700));
        assert_eq!(std::fs::read(m.join("dir2")).unwrap(), b"a directory, then a file");
        assert_eq!(std::fs::read(m.join("f/g")).unwrap(), b"g");
        assert_eq!(owner_mode(&m.join("suid")), (0, 0o755), "set-uid cleared");
        assert_eq!(std::fs::read_link(m.join("abs")).unwrap(), Path::new("/etc/passwd"), "kept, never followed");
        assert_eq!(std::fs::read_link(m.join("up")).unwrap(), Path::new("../../../x"));
        assert_eq!(std::fs::read(m.join("new/x")).unwrap(), b"x");
        assert!(!m.join(".wh..wh.plnk").exists() && !m.join(".wh.deleted").exists(), "markers never placed");
        assert!(!m.join("new").join(IMPLICIT_MARKER).exists());
        assert_eq!(std::fs::read(dest.join("etc/outside")).unwrap(), b"outside /models");
        assert!(!dest.join("dev/null").exists() && !dest.join("dev/sda").exists() && !dest.join("run/pipe").exists());
        assert!(!root.join("escape").exists() && !below.join("escape").exists());
    }
}

#[test]
fn what_an_image_layer_leaves_out_is_counted_and_a_plain_archive_refuses_it() {
    let (t, root) = tempdir();
    let blob = root.join("blob");
    std::fs::write(&blob, lower()).unwrap();
    let left = unpack_layer(&blob, "sha256:x", Archive::Tar, Layering::Image, &root.join("image")).unwrap();
    assert_eq!(left, LeftOut { devices: 2, fifos: 1, hard_links: 1, others: 1, set_id_cleared: 1 });
    // The tree keeps owners; the directories `dev/` and `run/` it implied are marked.
    assert_eq!(owner_mode(&root.join("image/models/private")), (1000, 0o600));
    assert!(root.join("image/etc").join(IMPLICIT_MARKER).exists());
    assert!(!root.join("image/dev").exists(), "nothing of a device node is made");
    assert!(!root.join("image/models").join(IMPLICIT_MARKER).exists());
    let e = unpack_layer(&blob, "sha256:x", Archive::Tar, Layering::Files, &root.join("files")).unwrap_err();
    assert!(e.to_string().contains("refused"), "{e}");
    drop(t);
}

#[test]
fn a_file_and_an_image_layer_of_one_blob_have_trees_of_their_own() {
    let mut b = tar::Builder::new(Vec::new());
    entry(&mut b, "w/model.bin", File, None, 0o600, 1000, b"w");
    let (_t, a, d, root) = cache_of(&[b.into_inner().unwrap()]);
    let below = root.join("vol");
    a.assemble(&d[0], Archive::Tar, Layering::Files, &below.join("files"), &below).unwrap();
    a.assemble(&d[0], Archive::Tar, Layering::Image, &below.join("image"), &below).unwrap();
    assert_eq!(owner_mode(&below.join("files/w/model.bin")), (0, 0o444));
    assert_eq!(owner_mode(&below.join("image/w/model.bin")), (1000, 0o600));
    assert_ne!(ino(&below.join("files/w/model.bin")), ino(&below.join("image/w/model.bin")));
}

/// Whiteouts named `.wh..` and `.wh...` name `.` and `..`: they must delete nothing, least of
/// all what lies beside the destination (another mount's tree in the same volume).
#[test]
fn whiteouts_of_dot_and_dot_dot_delete_nothing() {
    let mut b = tar::Builder::new(Vec::new());
    entry(&mut b, "models/keep", File, None, 0o644, 0, b"keep");
    let lower = b.into_inner().unwrap();
    let mut b = tar::Builder::new(Vec::new());
    entry(&mut b, ".wh...", File, None, 0o644, 0, b"");
    entry(&mut b, ".wh..", File, None, 0o644, 0, b"");
    entry(&mut b, "models/.wh...", File, None, 0o644, 0, b"");
    entry(&mut b, "models/.wh..", File, None, 0o644, 0, b"");
    let upper = b.into_inner().unwrap();
    let mut b = tar::Builder::new(Vec::new());
    entry(&mut b, "models/.wh.a/b", File, None, 0o644, 0, b"below a marker");
    entry(&mut b, "models/sub/.wh..wh..implicit/x", File, None, 0o644, 0, b"below a reserved name");
    entry(&mut b, "models/hl", Link, Some("models/.wh.a/b"), 0o644, 0, b"");
    let marked = b.into_inner().unwrap();
    let (_t, a, d, root) = cache_of(&[lower, upper, marked]);
    let below = root.join("vol");
    std::fs::create_dir_all(below.join("other")).unwrap();
    std::fs::write(below.join("other/tenant"), b"another mount's file").unwrap();
    let dest = below.join("model");
    for digest in &d {
        a.assemble(digest, Archive::Tar, Layering::Image, &dest, &below).unwrap();
    }
    assert_eq!(std::fs::read(below.join("other/tenant")).unwrap(), b"another mount's file");
    assert_eq!(std::fs::read(dest.join("models/keep")).unwrap(), b"keep");
    let names: Vec<_> = std::fs::read_dir(dest.join("models")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["keep"], "nothing below a marker name (not even its parents), no link to one");
}

#[test]
fn an_entry_below_a_link_of_its_layer_and_a_large_skipped_entry_are_left_out() {
    let mut b = tar::Builder::new(Vec::new());
    entry(&mut b, "models/lnk", Symlink, Some("/etc"), 0o777, 0, b"");
    entry(&mut b, "models/lnk/passwd-x", File, None, 0o644, 0, b"no");
    entry(&mut b, "../escape.bin", File, None, 0o644, 0, &vec![7u8; 2 << 20]);
    entry(&mut b, "models/.wh..wh.big", File, None, 0o644, 0, &vec![7u8; 2 << 20]);
    entry(&mut b, "models/self", File, None, 0o644, 0, b"self");
    entry(&mut b, "models/self", Link, Some("models/self"), 0o644, 0, b"");
    entry(&mut b, "models/after", File, None, 0o644, 0, b"after");
    let (t, root) = tempdir();
    let blob = root.join("blob");
    std::fs::write(&blob, b.into_inner().unwrap()).unwrap();
    let left = unpack_layer(&blob, "sha256:x", Archive::Tar, Layering::Image, &root.join("tree")).unwrap();
    // The reserved name is dropped without being counted; the other two are counted.
    assert_eq!((left.others, left.hard_links), (2, 1), "{left:?}");
    assert_eq!(std::fs::read(root.join("tree/models/self")).unwrap(), b"self", "a link to itself leaves the file");
    assert!(!root.join("escape.bin").exists() && !root.join("tree/models/lnk/passwd-x").exists());
    assert_eq!(std::fs::read(root.join("tree/models/after")).unwrap(), b"after");
    drop(t);
}
