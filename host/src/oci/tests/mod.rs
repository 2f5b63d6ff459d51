//! Unit tests of the OCI cache: no root, no real registry (an in-process fake serves HTTP).

mod auth;
mod authorize;
mod fake;
mod pull;
mod redact;
mod segments;
mod store;
mod wire;

use std::path::Path;

/// A tar archive built from entries written byte by byte, so malicious names and types can be
/// made (the tar crate's builder refuses them).
pub(crate) struct TarOf(tar::Builder<Vec<u8>>);

impl TarOf {
    pub fn new() -> TarOf {
        TarOf(tar::Builder::new(Vec::new()))
    }

    pub fn raw(mut self, name: &str, kind: tar::EntryType, link: Option<&str>, mode: u32, data: &[u8]) -> TarOf {
        self.0.append(&header(name, kind, link, mode, (0, 0), data.len()), data).unwrap();
        self
    }

    pub fn file(self, name: &str, data: &[u8]) -> TarOf {
        self.raw(name, tar::EntryType::Regular, None, 0o644, data)
    }

    pub fn dir(self, name: &str) -> TarOf {
        self.raw(name, tar::EntryType::Directory, None, 0o755, b"")
    }

    pub fn symlink(self, name: &str, target: &str) -> TarOf {
        self.raw(name, tar::EntryType::Symlink, Some(target), 0o777, b"")
    }

    pub fn hardlink(self, name: &str, target: &str) -> TarOf {
        self.raw(name, tar::EntryType::Link, Some(target), 0o644, b"")
    }

    pub fn bytes(self) -> Vec<u8> {
        self.0.into_inner().unwrap()
    }
}

/// A tar header written byte by byte (raw names and link names, however malicious), owned by
/// `owner` (uid, gid), for `size` bytes of data.
pub(crate) fn header(
    name: &str,
    kind: tar::EntryType,
    link: Option<&str>,
    mode: u32,
    owner: (u64, u64),
    size: usize,
) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    if let Some(l) = link {
        h.as_old_mut().linkname[..l.len()].copy_from_slice(l.as_bytes());
    }
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(owner.0);
    h.set_gid(owner.1);
    h.set_size(size as u64);
    h.set_mtime(1_700_000_000);
    h.set_cksum();
    h
}

/// A tree most tests unpack: nested files, an implicit parent, links inside.
pub(crate) fn good_tar() -> Vec<u8> {
    TarOf::new()
        .dir("./")
        .dir("a/")
        .file("a/b.txt", b"bee")
        .symlink("a/link", "b.txt")
        .dir("a/c/")
        .symlink("a/c/up", "../b.txt")
        .hardlink("a/hard", "a/b.txt")
        .file("x/y/z.bin", &[7u8; 3000])
        .bytes()
}

pub(crate) fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

pub(crate) fn zstd(bytes: &[u8]) -> Vec<u8> {
    zstd::stream::encode_all(bytes, 1).unwrap()
}

pub(crate) fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

pub(crate) fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

pub(crate) fn ino(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).unwrap().ino()
}

/// A temp dir whose path is canonical (an anchor must be).
pub(crate) fn tempdir() -> (tempfile::TempDir, std::path::PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().canonicalize().unwrap();
    (t, p)
}
