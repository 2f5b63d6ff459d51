use tar::EntryType;

use super::super::unpack::unpack;
use super::*;
use crate::plan::Archive;

const D: &str = "sha256:00";

fn try_unpack(bytes: &[u8], format: Archive) -> (tempfile::TempDir, std::path::PathBuf, std::io::Result<()>) {
    let (t, root) = tempdir();
    let blob = root.join("blob");
    std::fs::write(&blob, bytes).unwrap();
    let into = root.join("tree");
    let r = unpack(&blob, D, format, &into);
    (t, into, r)
}

fn refused(bytes: Vec<u8>, entry: &str, why: &str) {
    let (_t, _into, r) = try_unpack(&bytes, Archive::Tar);
    let e = r.expect_err("must be refused").to_string();
    assert!(e.contains(entry), "{e:?} should name {entry}");
    assert!(e.contains(why), "{e:?} should say {why}");
}

#[test]
fn a_good_archive_unpacks_read_only_with_its_links() {
    for (format, bytes) in
        [(Archive::Tar, good_tar()), (Archive::TarGzip, gzip(&good_tar())), (Archive::TarZstd, zstd(&good_tar()))]
    {
        let (_t, into, r) = try_unpack(&bytes, format);
        r.unwrap();
        assert_eq!(std::fs::read(into.join("a/b.txt")).unwrap(), b"bee", "{format:?}");
        assert_eq!(std::fs::read(into.join("x/y/z.bin")).unwrap(), vec![7u8; 3000]);
        assert_eq!(mode(&into.join("a/b.txt")), 0o444);
        for d in ["", "a", "a/c", "x", "x/y"] {
            assert_eq!(mode(&into.join(d)), 0o555, "{d}");
        }
        assert_eq!(std::fs::read_link(into.join("a/link")).unwrap(), Path::new("b.txt"));
        assert_eq!(std::fs::read(into.join("a/c/up")).unwrap(), b"bee");
        assert_eq!(ino(&into.join("a/hard")), ino(&into.join("a/b.txt")));
    }
}

#[test]
fn a_later_entry_replaces_an_earlier_one() {
    let bytes = TarOf::new().file("f", b"one").file("f", b"two").bytes();
    let (_t, into, r) = try_unpack(&bytes, Archive::Tar);
    r.unwrap();
    assert_eq!(std::fs::read(into.join("f")).unwrap(), b"two");
}

#[test]
fn paths_that_leave_the_tree_are_refused() {
    refused(TarOf::new().file("/etc/evil", b"x").bytes(), "/etc/evil", "absolute");
    refused(TarOf::new().file("../evil", b"x").bytes(), "../evil", "`..`");
    refused(TarOf::new().file("a/../../evil", b"x").bytes(), "a/../../evil", "`..`");
}

#[test]
fn links_that_point_outside_are_refused() {
    refused(TarOf::new().symlink("etc", "/etc").bytes(), "etc", "absolute");
    refused(TarOf::new().symlink("up", "..").bytes(), "up", "outside");
    refused(TarOf::new().symlink("a/b/up", "../../..").bytes(), "a/b/up", "outside");
    refused(TarOf::new().symlink("a/sneak", "b/../../x").bytes(), "a/sneak", "after a name");
    refused(TarOf::new().hardlink("h", "../x").bytes(), "h", "outside the archive");
    refused(TarOf::new().hardlink("h", "/etc/passwd").bytes(), "h", "outside the archive");
    refused(TarOf::new().hardlink("h", "missing").bytes(), "h", "not a file unpacked before it");
}

#[test]
fn nothing_is_written_through_an_archive_symlink() {
    let bytes = TarOf::new().dir("sub/").symlink("d", "sub").file("d/x", b"x").bytes();
    let (_t2, into, r) = try_unpack(&bytes, Archive::Tar);
    let e = r.expect_err("writing through a link must fail");
    assert!(crate::exec::beneath::is_link_refused(&e) || e.to_string().contains("symbolic link"), "{e}");
    assert!(!into.join("sub/x").exists());
}

#[test]
fn special_files_and_privilege_bits_are_refused() {
    refused(TarOf::new().raw("dev", EntryType::Char, None, 0o600, b"").bytes(), "dev", "device node");
    refused(TarOf::new().raw("blk", EntryType::Block, None, 0o600, b"").bytes(), "blk", "device node");
    refused(TarOf::new().raw("fifo", EntryType::Fifo, None, 0o600, b"").bytes(), "fifo", "FIFO");
    refused(TarOf::new().raw("suid", EntryType::Regular, None, 0o4755, b"x").bytes(), "suid", "set-uid");
    refused(TarOf::new().raw("sgid/", EntryType::Directory, None, 0o2755, b"").bytes(), "sgid", "set-gid");
}

#[test]
fn garbage_is_not_an_archive() {
    let (_t, _into, r) = try_unpack(b"definitely not gzip", Archive::TarGzip);
    let e = r.unwrap_err().to_string();
    assert!(e.contains("is not a valid TarGzip archive"), "{e}");
}

/// A GNU long-name entry carrying `name` (NUL-terminated), then a one-byte file it names.
fn long_named(name: &[u8]) -> Vec<u8> {
    let mut data = name.to_vec();
    data.push(0);
    TarOf::new().raw("././@LongLink", EntryType::GNULongName, None, 0o644, &data).file("short", b"x").bytes()
}

#[test]
fn what_tar_reads_between_two_entries_is_bounded() {
    // A long name of three 100-byte components: what real archives have there.
    let name = format!("{}/{}/{}", "a".repeat(100), "b".repeat(100), "c".repeat(100));
    let (_t, into, r) = try_unpack(&long_named(name.as_bytes()), Archive::Tar);
    r.unwrap();
    assert_eq!(std::fs::read(into.join(&name)).unwrap(), b"x");

    // A name of 4 MiB (a header claiming 64 GiB is the same, only bigger): refused before tar
    // reads it all into memory. Without the bound, tar reads it and the create fails instead.
    let (_t, _into, r) = try_unpack(&long_named(&vec![b'a'; 4 << 20]), Archive::Tar);
    let e = r.expect_err("a 4 MiB header must be refused").to_string();
    assert!(e.contains("between two entries"), "{e}");

    // Data behind a directory entry, which tar skips by reading it.
    let bytes = TarOf::new().raw("d", EntryType::Directory, None, 0o755, &vec![0u8; 2 << 20]).file("f", b"x").bytes();
    let (_t, _into, r) = try_unpack(&bytes, Archive::Tar);
    let e = r.expect_err("2 MiB behind a directory must be refused").to_string();
    assert!(e.contains("between two entries"), "{e}");
}
