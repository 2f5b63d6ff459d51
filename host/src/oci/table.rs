//! The file table of a layer without its data (lazy volumes, docs/lazy.md): for an uncompressed
//! tar layer, its entries and where each file's bytes lie in the blob, read from the 512-byte
//! headers alone; for an unpacked layer, its tree.
//!
//! The headers are read in windows of [`WINDOW`] bytes, from the complete blob on disk or with
//! HTTP range requests: each window holds the next header (and those of small entries after
//! it), and the reader jumps over a large file's data to the header after it, so listing a
//! 10 GiB layer of a few files costs a few requests of 64 KiB. Entries obey the rules the
//! host's unpacking applies ([`crate::plan::tar_rules`]); what unpacking would refuse, the
//! table refuses. A table read over the network is unverified until the blob is complete:
//! [`crate::oci::Artifacts::lazy_check_table`] then reads it again from the verified bytes and
//! compares.
//!
//! Container image layers ([`image`]) are read by the image spec's rules instead: owners and
//! modes kept, any link target, whiteouts, skipped device nodes; a compressed one's table comes
//! from its archive, decompressed once it is on the node (its unpacked tree keeps no whiteouts).
//!
//! Tables are kept beside the blobs (`tables/sha256/<hex>.json`), so a restarted daemon or a
//! healed server has them without the network, and removed with their blob ([`kept`]).

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

mod entry;
pub mod image;
mod kept;

pub use entry::{BlobTable, Owner, TableEntry, TableKind, Whiteout};

use super::OciError;
use super::registry::Endpoint;
use crate::plan::tar_rules::{check_link_target, clean};

/// The bytes one read of headers takes.
pub const WINDOW: u64 = 64 << 10;
/// The largest long name, long link name or pax record block read.
const MAX_META: u64 = 1 << 20;
/// The most entries one layer's table holds.
const MAX_ENTRIES: usize = 1_000_000;

/// Reads byte ranges of one blob.
enum Source_<'a> {
    Local(&'a File),
    Remote(&'a Endpoint, &'a str),
    /// A compressed layer's archive, decompressed as it is read: ranges only forward.
    Stream(std::sync::Mutex<Stream>),
}

/// A forward-only reader of a decompressed archive, keeping the bytes from the last range read
/// on (the next range may start inside it).
struct Stream {
    reader: Box<dyn io::Read + Send>,
    /// The offset of `buf[0]`.
    at: u64,
    buf: Vec<u8>,
}

impl Stream {
    /// Up to `len` bytes at `offset` (fewer at the archive's end); `offset` never goes back.
    fn read(&mut self, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        if offset < self.at {
            return Err(io::Error::other("a read of a decompressed archive went back"));
        }
        let skip = offset - self.at;
        if skip >= self.buf.len() as u64 {
            let over = skip - self.buf.len() as u64;
            self.buf.clear();
            io::copy(&mut io::Read::take(&mut self.reader, over), &mut io::sink())?;
        } else {
            self.buf.drain(..skip as usize);
        }
        self.at = offset;
        let mut chunk = vec![0u8; 64 << 10];
        while (self.buf.len() as u64) < len {
            let want = chunk.len().min((len - self.buf.len() as u64) as usize);
            match self.reader.read(&mut chunk[..want]) {
                Ok(0) => break,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(self.buf[..self.buf.len().min(len as usize)].to_vec())
    }
}

impl Source_<'_> {
    /// Does a stream end at `pos` (an archive without its end blocks)? Blobs end at their size.
    fn ended(&self, pos: u64) -> Result<bool, OciError> {
        match self {
            Source_::Stream(s) => Ok(stream(s).read(pos, 1).map_err(stream_error)?.is_empty()),
            _ => Ok(false),
        }
    }

    async fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, OciError> {
        match self {
            Source_::Stream(s) => stream(s).read(offset, len).map_err(stream_error),
            Source_::Local(f) => {
                let mut buf = vec![0u8; len as usize];
                let mut at = 0;
                while at < buf.len() {
                    let n = f.read_at(&mut buf[at..], offset + at as u64).map_err(|e| OciError::Local {
                        path: "<blob>".into(),
                        detail: e.to_string(),
                        kind: e.kind(),
                    })?;
                    if n == 0 {
                        break;
                    }
                    at += n;
                }
                buf.truncate(at);
                Ok(buf)
            }
            Source_::Remote(ep, digest) => {
                let mut body = ep.range(digest, offset, Some(len)).await?;
                let mut out = Vec::with_capacity(len as usize);
                let mut skip = if body.full { offset } else { 0 };
                let mut window = super::stall::Window::new(ep.stall());
                while let Some(chunk) = window.next(&mut body.stream, &ep.ctx, digest).await? {
                    let chunk = chunk.map_err(|e| OciError::Unreachable {
                        registry: ep.ctx.registry.clone(),
                        reference: ep.ctx.reference.clone(),
                        detail: format!("reading the headers of {digest}: {e}"),
                    })?;
                    let mut data: &[u8] = &chunk;
                    if skip > 0 {
                        let n = skip.min(data.len() as u64) as usize;
                        skip -= n as u64;
                        data = &data[n..];
                    }
                    let room = (len as usize).saturating_sub(out.len());
                    out.extend_from_slice(&data[..data.len().min(room)]);
                    if out.len() as u64 >= len {
                        break;
                    }
                    if !window.got(chunk.len() as u64) {
                        return Err(window.stalled(&ep.ctx, digest));
                    }
                }
                Ok(out)
            }
        }
    }
}

fn stream(s: &std::sync::Mutex<Stream>) -> std::sync::MutexGuard<'_, Stream> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

fn stream_error(e: io::Error) -> OciError {
    OciError::Local { path: "<archive>".into(), detail: format!("decompressing the layer: {e}"), kind: e.kind() }
}

/// How deep unpacking nests directories (`exec/artifacts/unpack.rs` seals at most this deep).
const MAX_DEPTH: usize = 256;

/// A refused or unreadable archive.
fn bad(digest: &str, detail: String) -> OciError {
    OciError::Protocol {
        registry: String::new(),
        reference: digest.to_string(),
        detail: format!("layer {digest} cannot be served lazily: {detail}"),
    }
}

/// Read the table of the tar archive `digest` (`size` bytes) from `src`: by the rules of image
/// layers when `image` ([`image`]), with its whiteouts.
async fn read_tar(
    src: &Source_<'_>,
    digest: &str,
    size: u64,
    image: bool,
) -> Result<(Vec<TableEntry>, Vec<Whiteout>), OciError> {
    let mut image = image.then(image::LayerReader::default);
    let mut entries: Vec<TableEntry> = Vec::new();
    // Regular files by path, for hard links (to a file before them).
    let mut files: BTreeMap<PathBuf, (u64, u64)> = BTreeMap::new();
    // What each path is so far (a directory, or not), named or implied by a path below it:
    // what unpacking refuses (a directory replaced by anything else, or anything else by a
    // directory, an entry below a file or a link), the table refuses, so the lazy volume never
    // serves a tree the eager one would not hold.
    let mut dirs: std::collections::HashMap<PathBuf, bool> = std::collections::HashMap::new();
    let mut window: (u64, Vec<u8>) = (0, Vec::new());
    let mut pos = 0u64;
    // What extension headers say of the next member (a GNU long name or link, pax records).
    // As tar reads them: only under a ustar or GNU header, at most one of each kind per member,
    // and taken by whatever entry comes next.
    let mut long_name: Option<Vec<u8>> = None;
    let mut long_link: Option<Vec<u8>> = None;
    let mut pax: Option<BTreeMap<String, Vec<u8>>> = None;
    loop {
        if pos >= size {
            if pos > size {
                return Err(bad(digest, format!("the blob ends inside the padding of the entry before byte {pos}")));
            }
            // A tar archive ends with zero blocks; one without them ends at the blob's end.
            break;
        }
        if size - pos < 512 {
            return Err(bad(digest, format!("the blob ends inside the header at byte {pos}")));
        }
        if src.ended(pos)? {
            break;
        }
        let header_bytes = read_at(src, &mut window, pos, 512, size).await?;
        if header_bytes.iter().all(|b| *b == 0) {
            break;
        }
        let header = tar::Header::from_byte_slice(&header_bytes);
        check_sum(&header_bytes).map_err(|e| bad(digest, format!("at byte {pos}: {e}")))?;
        let kind = header.entry_type();
        let extension = matches!(
            kind,
            tar::EntryType::GNULongName
                | tar::EntryType::GNULongLink
                | tar::EntryType::XHeader
                | tar::EntryType::XGlobalHeader
        );
        let mut data_size = header.entry_size().map_err(|e| bad(digest, format!("at byte {pos}: {e}")))?;
        if let Some(s) = pax
            .as_ref()
            .filter(|_| !extension)
            .and_then(|p| p.get("size"))
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| v.parse().ok())
        {
            data_size = s;
        }
        // `pos + 512 <= size` above; a size from a header or a pax record may be any u64.
        let data_at = pos + 512;
        if data_size > size - data_at {
            return Err(bad(digest, format!("an entry at byte {pos} claims {data_size} bytes past the blob's end")));
        }
        let next = data_at + data_size.div_ceil(512) * 512;
        let meta = |n: u64| -> Result<(), OciError> {
            if n > MAX_META {
                Err(bad(digest, format!("more than {MAX_META} bytes of long names or pax records at byte {pos}")))
            } else {
                Ok(())
            }
        };
        let twice = || bad(digest, format!("at byte {pos}: two {kind:?} entries describe one member"));
        let recognized = header.as_ustar().is_some() || header.as_gnu().is_some();
        match kind {
            tar::EntryType::GNULongName if recognized => {
                meta(data_size)?;
                if long_name.is_some() {
                    return Err(twice());
                }
                long_name = Some(trim_nul(read_at(src, &mut window, data_at, data_size, size).await?));
                pos = next;
                continue;
            }
            tar::EntryType::GNULongLink if recognized => {
                meta(data_size)?;
                if long_link.is_some() {
                    return Err(twice());
                }
                long_link = Some(trim_nul(read_at(src, &mut window, data_at, data_size, size).await?));
                pos = next;
                continue;
            }
            tar::EntryType::XHeader if recognized => {
                meta(data_size)?;
                if pax.is_some() {
                    return Err(twice());
                }
                let records = read_at(src, &mut window, data_at, data_size, size).await?;
                let mut read = BTreeMap::new();
                for ext in tar::PaxExtensions::new(&records) {
                    let ext = ext.map_err(|e| bad(digest, format!("pax records at byte {pos}: {e}")))?;
                    let key = ext.key().map_err(|e| bad(digest, format!("pax records at byte {pos}: {e}")))?;
                    // tar takes a key's first record.
                    read.entry(key.to_string()).or_insert_with(|| ext.value_bytes().to_vec());
                }
                pax = Some(read);
                pos = next;
                continue;
            }
            _ => {}
        }
        // A member: it takes what the extension headers before it said.
        let mut pax = pax.take().unwrap_or_default();
        // As tar: a GNU long name or link before a pax one, then the header's own.
        let raw_path =
            long_name.take().or_else(|| pax.remove("path")).unwrap_or_else(|| header.path_bytes().into_owned());
        let raw_link = long_link
            .take()
            .or_else(|| pax.remove("linkpath"))
            .or_else(|| header.link_name_bytes().map(|l| l.into_owned()));
        let mtime = pax
            .remove("mtime")
            .and_then(|v| String::from_utf8(v).ok())
            .and_then(|v| v.split('.').next().and_then(|s| s.parse::<i64>().ok()))
            .or_else(|| header.mtime().ok().map(|m| m as i64))
            .unwrap_or(0);
        long_name = None;
        long_link = None;
        if extension {
            // A global pax header, or an extension header tar does not take as one (no ustar
            // or GNU magic): unpacking skips it, once its name is a clean relative one.
            let name = PathBuf::from(std::ffi::OsStr::from_bytes(&raw_path));
            clean(&name).map_err(|why| bad(digest, format!("entry {}: refused: {why}", name.display())))?;
            pos = next;
            continue;
        }
        let raw = PathBuf::from(String::from_utf8_lossy(&raw_path).into_owned());
        let refuse = |why: &str| bad(digest, format!("entry {}: refused: {why}", raw.display()));
        // The table names files in UTF-8 (JSON); an unpacked layer keeps a name's bytes, so a
        // name of other bytes is refused rather than served under another one.
        // No file name holds a NUL byte (unpacking fails on one).
        let utf8 = |bytes: Vec<u8>, what: &str| {
            if bytes.contains(&0) {
                return Err(refuse(&format!("{what} holds a NUL byte")));
            }
            String::from_utf8(bytes).map(PathBuf::from).map_err(|_| refuse(&format!("{what} is not UTF-8")))
        };
        let raw = utf8(raw_path, "its name")?;
        let rel = match (clean(&raw), image.as_mut()) {
            (Ok(rel), _) => rel,
            // An image layer's `/a` is `a`, as a runtime reads it; one with `..` is left out.
            (Err(_), Some(reader)) => match clean(raw.strip_prefix("/").unwrap_or(&raw)) {
                Ok(rel) => rel,
                Err(_) => {
                    reader.skip();
                    pos = next;
                    continue;
                }
            },
            (Err(why), None) => return Err(refuse(why)),
        };
        // What the unpacked tree's filesystem and its sealing take: names of at most 255
        // bytes, directories at most 256 deep.
        if rel.components().any(|c| c.as_os_str().len() > 255) {
            return Err(refuse("a name in its path is longer than 255 bytes"));
        }
        let depth = rel.components().count().saturating_sub(usize::from(kind != tar::EntryType::Directory));
        if depth > MAX_DEPTH {
            return Err(refuse(&format!("it is nested deeper than {MAX_DEPTH} directories")));
        }
        if let Some(reader) = image.as_mut() {
            // As unpacking takes them: the header's numeric ids (0 when unreadable), its mode
            // without the set-id bits.
            let (uid, gid) = (header.uid().unwrap_or(0) as u32, header.gid().unwrap_or(0) as u32);
            let mode = header.mode().map_err(|e| refuse(&format!("its mode: {e}")))? & 0o1777;
            let owner = Owner { uid, gid, mode };
            let m = image::Member { rel, kind, size: data_size, offset: data_at, mtime, link: raw_link, owner };
            reader.member(m).map_err(|why| refuse(&why))?;
            if reader.len() > MAX_ENTRIES {
                return Err(bad(digest, format!("more than {MAX_ENTRIES} entries")));
            }
            pos = next;
            continue;
        }
        if rel.as_os_str().is_empty() {
            if kind.is_dir() {
                pos = next;
                continue;
            }
            return Err(refuse("it names the archive's root"));
        }
        let path = rel.to_string_lossy().into_owned();
        for parent in rel.ancestors().skip(1).filter(|p| !p.as_os_str().is_empty()) {
            if *dirs.entry(parent.to_path_buf()).or_insert(true) {
                continue;
            }
            return Err(refuse(&format!("{} before it is not a directory", parent.display())));
        }
        let is_dir = kind == tar::EntryType::Directory;
        match dirs.insert(rel.clone(), is_dir) {
            Some(true) if !is_dir => return Err(refuse("it would replace a directory")),
            Some(false) if is_dir => return Err(refuse("a directory would replace a file or a link")),
            _ => {}
        }
        // A name given again is replaced by what comes now: unpacking removes the old one
        // first, so a hard link to its own name has no target left.
        files.remove(&rel);
        let entry_kind = match kind {
            tar::EntryType::Directory => TableKind::Dir,
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                files.insert(rel.clone(), (data_size, data_at));
                TableKind::File { size: data_size, offset: data_at }
            }
            tar::EntryType::Symlink => {
                let target = raw_link.ok_or_else(|| refuse("the symbolic link has no target"))?;
                let target = utf8(target, "its target")?;
                check_link_target(&rel, &target).map_err(|why| refuse(&why))?;
                TableKind::Symlink { target: target.to_string_lossy().into_owned() }
            }
            tar::EntryType::Link => {
                let target = raw_link.ok_or_else(|| refuse("the hard link has no target"))?;
                let target = utf8(target, "its target")?;
                let target_rel = clean(&target).ok().filter(|t| !t.as_os_str().is_empty());
                let (size, offset) = target_rel.and_then(|t| files.get(&t).copied()).ok_or_else(|| {
                    refuse(&format!("its hard link target {} is not a file before it", target.display()))
                })?;
                files.insert(rel.clone(), (size, offset));
                TableKind::File { size, offset }
            }
            tar::EntryType::GNUSparse => return Err(refuse("it is a sparse file, which a lazy volume cannot serve")),
            tar::EntryType::Char | tar::EntryType::Block => return Err(refuse("it is a device node")),
            tar::EntryType::Fifo => return Err(refuse("it is a FIFO")),
            other => return Err(refuse(&format!("its type ({other:?}) is not supported"))),
        };
        let mode = header.mode().map_err(|e| refuse(&format!("its mode: {e}")))?;
        if mode & 0o6000 != 0 {
            return Err(refuse("it has the set-uid or set-gid bit"));
        }
        entries.push(TableEntry { path, kind: entry_kind, mtime, owner: None });
        if entries.len() > MAX_ENTRIES {
            return Err(bad(digest, format!("more than {MAX_ENTRIES} entries")));
        }
        pos = next;
    }
    if long_name.is_some() || long_link.is_some() || pax.is_some() {
        return Err(bad(digest, "its last extension header describes no member after it".into()));
    }
    Ok(match image {
        Some(reader) => reader.finish(digest),
        None => (entries, Vec::new()),
    })
}

/// The table of the tar archive in file `blob`, as a lazy volume serves it (for the fuzz
/// targets: `oci::fuzzing`).
pub fn tar_table_of(blob: &Path) -> Result<Vec<TableEntry>, OciError> {
    let f = File::open(blob).map_err(|e| OciError::local(blob, &e, "", "sha256:fuzz"))?;
    let size = f.metadata().map_err(|e| OciError::local(blob, &e, "", "sha256:fuzz"))?.len();
    let rt = tokio::runtime::Builder::new_current_thread().build().map_err(|e| OciError::local(blob, &e, "", ""))?;
    rt.block_on(read_tar(&Source_::Local(&f), "sha256:fuzz", size, false)).map(|(entries, _)| entries)
}

/// The result of a read of local bytes (a file, a stream), which never waits for anything.
fn at_once<T>(read: impl std::future::Future<Output = Result<T, OciError>>) -> Result<T, OciError> {
    let mut read = std::pin::pin!(read);
    match read.as_mut().poll(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
        std::task::Poll::Ready(r) => r,
        std::task::Poll::Pending => Err(OciError::Local {
            path: "<archive>".into(),
            detail: "a local read waited".into(),
            kind: io::ErrorKind::Other,
        }),
    }
}

/// `len` bytes at `at`, from the window when it holds them, else from a new window there.
async fn read_at(
    src: &Source_<'_>,
    window: &mut (u64, Vec<u8>),
    at: u64,
    len: u64,
    size: u64,
) -> Result<Vec<u8>, OciError> {
    let (start, bytes) = &*window;
    if at >= *start && at + len <= start + bytes.len() as u64 {
        let from = (at - start) as usize;
        return Ok(bytes[from..from + len as usize].to_vec());
    }
    let want = len.max(WINDOW).min(size - at);
    let got = src.read(at, want).await?;
    if (got.len() as u64) < len {
        return Err(OciError::Protocol {
            registry: String::new(),
            reference: String::new(),
            detail: format!("the blob ended at byte {} while reading its headers", at + got.len() as u64),
        });
    }
    *window = (at, got);
    Ok(window.1[..len as usize].to_vec())
}

fn trim_nul(mut v: Vec<u8>) -> Vec<u8> {
    // One NUL, as tar takes it off: a name with more holds a NUL, and is refused.
    if v.last() == Some(&0) {
        v.pop();
    }
    v
}

/// A header's checksum: the sum of its bytes with the checksum field as spaces.
fn check_sum(h: &[u8]) -> Result<(), String> {
    let field = std::str::from_utf8(&h[148..156]).map_err(|_| "not a tar header".to_string())?;
    let want = u32::from_str_radix(field.trim_matches(|c: char| c == '\0' || c == ' '), 8)
        .map_err(|_| "not a tar header (no checksum)".to_string())?;
    let sum: u32 = h.iter().enumerate().map(|(i, b)| if (148..156).contains(&i) { 32 } else { u32::from(*b) }).sum();
    if sum == want { Ok(()) } else { Err(format!("not a tar header (checksum {want}, computed {sum})")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table_of(bytes: &[u8]) -> Result<Vec<TableEntry>, OciError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("blob");
        std::fs::write(&path, bytes).unwrap();
        tar_table_of(&path)
    }

    fn builder() -> tar::Builder<Vec<u8>> {
        tar::Builder::new(Vec::new())
    }

    /// A regular file `name` of `data` (mode `mode`) under a ustar header of its own.
    fn ustar_file(b: &mut tar::Builder<Vec<u8>>, name: &str, data: &[u8], mode: u32) {
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_path(name).unwrap();
        h.set_cksum();
        b.append(&h, data).unwrap();
    }

    fn add(b: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8]) {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(1_700_000_000);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, path, data).unwrap();
    }

    #[test]
    fn offsets_point_at_each_files_bytes_across_windows_and_long_names() {
        let mut b = builder();
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        add(&mut b, "config.json", b"{\"a\":1}");
        add(&mut b, "weights/model.safetensors", &big);
        let long = format!("deep/{}/tokenizer.json", "d".repeat(200));
        add(&mut b, &long, b"tok");
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        h.set_mode(0o777);
        b.append_link(&mut h, "weights/link", "model.safetensors").unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Link);
        h.set_size(0);
        h.set_mode(0o644);
        b.append_link(&mut h, "copy.json", "config.json").unwrap();
        let bytes = b.into_inner().unwrap();
        let entries = table_of(&bytes).unwrap();
        let file = |p: &str| {
            entries.iter().find(|e| e.path == p).map(|e| match e.kind {
                TableKind::File { size, offset } => bytes[offset as usize..(offset + size) as usize].to_vec(),
                _ => panic!("{p} is not a file"),
            })
        };
        assert_eq!(file("config.json").unwrap(), b"{\"a\":1}");
        assert_eq!(file("weights/model.safetensors").unwrap(), big);
        assert_eq!(file(&long).unwrap(), b"tok", "a GNU long name");
        assert_eq!(file("copy.json").unwrap(), b"{\"a\":1}", "a hard link reads its target's bytes");
        assert!(
            entries.iter().any(
                |e| e.path == "weights/link" && e.kind == TableKind::Symlink { target: "model.safetensors".into() }
            )
        );
        assert_eq!(entries.iter().find(|e| e.path == "config.json").unwrap().mtime, 1_700_000_000);
    }

    #[test]
    fn pax_paths_and_sizes_are_read() {
        let mut b = builder();
        let name = format!("p/{}.bin", "x".repeat(150));
        let mut h = tar::Header::new_ustar();
        h.set_size(5);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_pax_extensions([("path", name.as_bytes())]).unwrap();
        h.set_path("short").unwrap();
        h.set_cksum();
        b.append(&h, &b"12345"[..]).unwrap();
        let bytes = b.into_inner().unwrap();
        let entries = table_of(&bytes).unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].path, name);
    }

    /// A pax header whose own header is neither ustar nor GNU is no extension to tar: an entry
    /// of its own (skipped by unpacking), and the member after it keeps the name in its header.
    /// The fuzz target `lazy_table` found the table taking its path, where unpacking did not.
    #[test]
    fn an_extension_header_without_ustar_magic_names_nothing() {
        let mut b = builder();
        b.append_pax_extensions([("path", b"long/name.bin".as_slice())]).unwrap();
        ustar_file(&mut b, "short", b"12345", 0o644);
        let mut bytes = b.into_inner().unwrap();
        assert_eq!(table_of(&bytes).unwrap()[0].path, "long/name.bin");
        // The pax header's magic (257..263) spoilt, its checksum made right again.
        bytes[257..263].copy_from_slice(b"ustra0");
        let mut pax = tar::Header::from_byte_slice(&bytes[..512]).clone();
        pax.set_cksum();
        bytes[..512].copy_from_slice(pax.as_bytes());
        let entries = table_of(&bytes).unwrap();
        assert_eq!(entries.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(), ["short"]);
    }

    /// As tar: a key's first pax record counts, and a GNU long name comes before a pax path.
    #[test]
    fn the_first_pax_record_and_a_gnu_long_name_win_as_in_tar() {
        let mut b = builder();
        b.append_pax_extensions([("path", b"first".as_slice()), ("path", b"second".as_slice())]).unwrap();
        ustar_file(&mut b, "short", b"", 0o644);
        assert_eq!(table_of(&b.into_inner().unwrap()).unwrap()[0].path, "first");
        let mut b = builder();
        let long = format!("gnu/{}", "l".repeat(120));
        let mut l = tar::Header::new_gnu();
        l.set_path("././@LongLink").unwrap();
        l.set_entry_type(tar::EntryType::GNULongName);
        l.set_size(long.len() as u64 + 1);
        l.set_mode(0o644);
        l.set_cksum();
        b.append(&l, format!("{long}\0").as_bytes()).unwrap();
        b.append_pax_extensions([("path", b"pax".as_slice())]).unwrap();
        ustar_file(&mut b, "short", b"", 0o644);
        let bytes = b.into_inner().unwrap();
        assert_eq!(table_of(&bytes).unwrap()[0].path, long);
        let mut seen = tar::Archive::new(bytes.as_slice());
        let first = seen.entries().unwrap().next().unwrap().unwrap();
        assert_eq!(first.path().unwrap().to_str().unwrap(), long, "tar reads it so too");
    }

    /// As tar: two extension headers of one kind before one member, or one with no member
    /// after it, are refused.
    #[test]
    fn extension_headers_twice_or_of_no_member_are_refused() {
        let mut b = builder();
        b.append_pax_extensions([("path", b"a".as_slice())]).unwrap();
        b.append_pax_extensions([("path", b"b".as_slice())]).unwrap();
        ustar_file(&mut b, "f", b"", 0o644);
        let e = table_of(&b.into_inner().unwrap()).unwrap_err().to_string();
        assert!(e.contains("two XHeader entries describe one member"), "{e}");
        let mut b = builder();
        b.append_pax_extensions([("path", b"a".as_slice())]).unwrap();
        let e = table_of(&b.into_inner().unwrap()).unwrap_err().to_string();
        assert!(e.contains("describes no member"), "{e}");
    }

    /// What tar fails on, the table refuses (found by the fuzz target `lazy_table` once it
    /// asserted it): a blob cut inside a header or an entry's padding, a name with a NUL byte,
    /// a mode that is not a number.
    #[test]
    fn what_tar_fails_on_the_table_refuses() {
        let file = |b: &mut tar::Builder<Vec<u8>>, name: &str, mode: u32| ustar_file(b, name, b"12345", mode);
        let mut b = builder();
        file(&mut b, "f", 0o644);
        file(&mut b, "g", 0o644);
        let whole = b.into_inner().unwrap();
        assert_eq!(table_of(&whole[..2048]).unwrap().len(), 2, "no end blocks: ends at the blob's end");
        for (cut, says) in [(517, "inside the padding"), (1024 + 100, "inside the header")] {
            let e = table_of(&whole[..cut]).unwrap_err().to_string();
            assert!(e.contains(says), "{cut}: {e}");
        }
        let mut b = builder();
        b.append_pax_extensions([("path", b"a\0b".as_slice())]).unwrap();
        file(&mut b, "f", 0o644);
        let e = table_of(&b.into_inner().unwrap()).unwrap_err().to_string();
        assert!(e.contains("NUL"), "{e}");
        let mut b = builder();
        file(&mut b, "f", 0o644);
        let mut bytes = b.into_inner().unwrap();
        bytes[100..108].copy_from_slice(b"not oct\0");
        let mut h = tar::Header::from_byte_slice(&bytes[..512]).clone();
        h.set_cksum();
        bytes[..512].copy_from_slice(h.as_bytes());
        let e = table_of(&bytes).unwrap_err().to_string();
        assert!(e.contains("its mode"), "{e}");
        // What the unpacked tree's filesystem refuses: a name of 256 bytes, a file 257
        // directories deep (256 are fine).
        for (path, says) in [
            (format!("d/{}", "n".repeat(256)), Some("longer than 255 bytes")),
            (format!("d/{}", "n".repeat(255)), None),
            (format!("{}f", "d/".repeat(257)), Some("deeper than 256")),
            (format!("{}f", "d/".repeat(256)), None),
        ] {
            let mut b = builder();
            b.append_pax_extensions([("path", path.as_bytes())]).unwrap();
            file(&mut b, "f", 0o644);
            let got = table_of(&b.into_inner().unwrap());
            match says {
                Some(says) => assert!(got.unwrap_err().to_string().contains(says), "{path}"),
                None => assert_eq!(got.unwrap()[0].path, path),
            }
        }
    }

    #[test]
    fn a_size_past_the_blobs_end_is_refused_whatever_it_is() {
        for size in [b"18446744073709551615".as_slice(), b"18446744073709551000", b"4096"] {
            let mut b = builder();
            let mut h = tar::Header::new_ustar();
            h.set_size(5);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            b.append_pax_extensions([("size", size)]).unwrap();
            h.set_path("f").unwrap();
            h.set_cksum();
            b.append(&h, &b"12345"[..]).unwrap();
            let e = table_of(&b.into_inner().unwrap()).unwrap_err().to_string();
            assert!(e.contains("past the blob's end"), "{e}");
        }
    }

    #[test]
    fn what_unpacking_refuses_the_table_refuses() {
        use crate::oci::tests::TarOf;
        for (tar, why) in [
            (TarOf::new().file("/abs", b"x").bytes(), "absolute"),
            (TarOf::new().file("a/../../x", b"x").bytes(), "`..`"),
            (TarOf::new().symlink("a/l", "../../etc").bytes(), "outside"),
            (TarOf::new().raw("dev", tar::EntryType::Char, None, 0o644, b"").bytes(), "device"),
            (TarOf::new().raw("f", tar::EntryType::Fifo, None, 0o644, b"").bytes(), "FIFO"),
            (TarOf::new().raw("s", tar::EntryType::Regular, None, 0o4755, b"x").bytes(), "set-uid"),
            (TarOf::new().hardlink("h", "missing").bytes(), "hard link target"),
        ] {
            let e = table_of(&tar).unwrap_err().to_string();
            assert!(e.contains(why), "{why}: {e}");
        }
        // A name or a link target of other bytes than UTF-8 (the table's names are UTF-8, an
        // unpacked layer's are the archive's bytes): fuzz input `found-non-utf8-name`.
        for (tar, why) in [
            (TarOf::new().file("a\u{fffd}", b"x").bytes(), "never refused"),
            (include_bytes!("../../fuzz/corpus/lazy_table/found-non-utf8-name").to_vec(), "its name is not UTF-8"),
        ] {
            match table_of(&tar) {
                Ok(_) => assert_eq!(why, "never refused"),
                Err(e) => assert!(e.to_string().contains(why), "{why}: {e}"),
            }
        }
        // What unpacking refuses of names given again, or below a file or a link.
        for (tar, why) in [
            (TarOf::new().dir("a").file("a/b", b"b").file("a", b"x").bytes(), "would replace a directory"),
            (TarOf::new().file("a/b", b"b").symlink("a", "b").bytes(), "would replace a directory"),
            (TarOf::new().file("c", b"c").dir("c").bytes(), "a directory would replace"),
            (TarOf::new().file("f", b"f").file("f/g", b"g").bytes(), "f before it is not a directory"),
            (TarOf::new().symlink("l", "d").file("l/g", b"g").bytes(), "l before it is not a directory"),
            (TarOf::new().file("f", b"f").symlink("f", "g").hardlink("h", "f").bytes(), "hard link target"),
            (TarOf::new().file("h", b"h").hardlink("h", "h").bytes(), "hard link target"),
        ] {
            let e = table_of(&tar).unwrap_err().to_string();
            assert!(e.contains(why), "{why}: {e}");
        }
        // A file given again is the later one; a directory given again stays one.
        let tar = TarOf::new().dir("d").file("d/f", b"old").file("d/f", b"new").dir("d").hardlink("h", "d/f").bytes();
        let entries = table_of(&tar).unwrap();
        let last = |p: &str| entries.iter().rev().find(|e| e.path == p).unwrap().kind.clone();
        let TableKind::File { size, offset } = last("h") else { panic!("{entries:?}") };
        assert_eq!(&tar[offset as usize..(offset + size) as usize], b"new");
        let e = table_of(&[7u8; 1024]).unwrap_err().to_string();
        assert!(e.contains("not a tar header"), "{e}");
    }

    #[test]
    fn a_tree_lists_its_files_directories_and_links() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/f"), b"hello").unwrap();
        std::os::unix::fs::symlink("b/f", dir.path().join("a/l")).unwrap();
        let t = kept::tree_table(dir.path()).unwrap();
        let paths: Vec<&str> = t.iter().map(|e| e.path.as_str()).collect();
        assert!(paths.contains(&"a") && paths.contains(&"a/b") && paths.contains(&"a/b/f") && paths.contains(&"a/l"));
        assert!(t.iter().any(|e| e.path == "a/b/f" && e.kind == TableKind::File { size: 5, offset: 0 }));
    }
}
