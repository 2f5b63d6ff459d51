//! The tables of the cache's layers (see the parent module): read when a lazy volume needs
//! them (from the blob, a registry's ranges, an unpacked tree, a compressed image layer's
//! archive) and kept beside the blobs (`tables/sha256/<hex>.json`), so that a restarted daemon
//! or a healed server has them without the network.

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{BlobTable, Source_, Stream, TableEntry, TableKind, at_once, read_tar};
use crate::oci::store::hex_of;
use crate::oci::{Artifacts, BlobRef, OciError, Source};
use crate::plan::Archive;
use crate::plan::tar_rules::{Layering, image_layer};

/// The schema of a kept table (`tables/sha256/<hex>.json`).
pub const TABLE_SCHEMA_VERSION: u32 = 1;

/// A table as kept on the node.
#[derive(Serialize, Deserialize)]
struct KeptTable {
    version: u32,
    /// Read as an image layer's ([`super::image`]): a blob fetched under another media type (the
    /// same bytes as a ModelPack layer) reads its headers again, by the other rules.
    #[serde(default)]
    image: bool,
    #[serde(flatten)]
    table: BlobTable,
}

/// The table of an unpacked tree at `root`.
pub(super) fn tree_table(root: &Path) -> io::Result<Vec<TableEntry>> {
    let mut out = Vec::new();
    let mut stack = vec![(root.to_path_buf(), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        if depth > 256 {
            return Err(io::Error::other(format!("{} is nested too deep", dir.display())));
        }
        let mut names: Vec<std::fs::DirEntry> = std::fs::read_dir(&dir)?.collect::<Result<_, _>>()?;
        names.sort_by_key(|e| e.file_name());
        for e in names {
            let path = e.path();
            let meta = path.symlink_metadata()?;
            let rel = path.strip_prefix(root).expect("below the root").to_string_lossy().into_owned();
            let kind = if meta.is_dir() {
                stack.push((path.clone(), depth + 1));
                TableKind::Dir
            } else if meta.file_type().is_symlink() {
                TableKind::Symlink { target: std::fs::read_link(&path)?.to_string_lossy().into_owned() }
            } else if meta.is_file() {
                TableKind::File { size: meta.len(), offset: 0 }
            } else {
                continue;
            };
            out.push(TableEntry { path: rel, kind, mtime: meta.mtime(), owner: None });
        }
    }
    Ok(out)
}

/// A raw layer's table: the blob is the one file.
fn raw_table(size: u64) -> BlobTable {
    BlobTable {
        verified: true,
        entries: vec![TableEntry {
            path: String::new(),
            kind: TableKind::File { size, offset: 0 },
            mtime: 0,
            owner: None,
        }],
        whiteouts: Vec::new(),
    }
}

/// The table of the compressed image layer `blob` (complete and verified), read from its
/// archive as it is decompressed: an unpacked tree keeps neither whiteouts nor what was
/// skipped, and its owners and modes are the cache's. Blocking.
pub(super) fn compressed_image_table(blob: &Path, digest: &str, format: Archive) -> Result<BlobTable, OciError> {
    let file = File::open(blob).map_err(|e| OciError::local(blob, &e, "", digest))?;
    let reader: Box<dyn io::Read + Send> = match format {
        Archive::TarGzip => Box::new(flate2::read::MultiGzDecoder::new(io::BufReader::with_capacity(1 << 20, file))),
        Archive::TarZstd => {
            Box::new(zstd::stream::read::Decoder::new(file).map_err(|e| OciError::local(blob, &e, "", digest))?)
        }
        Archive::Tar | Archive::Raw => Box::new(io::BufReader::with_capacity(1 << 20, file)),
    };
    let src = Source_::Stream(std::sync::Mutex::new(Stream { reader, at: 0, buf: Vec::new() }));
    let (entries, whiteouts) = at_once(read_tar(&src, digest, u64::MAX, true))?;
    Ok(BlobTable { verified: true, entries, whiteouts })
}

impl Artifacts {
    /// The file table of layer `b` (`format`): the one kept for it, else read now — a raw blob
    /// is one file, a tar layer's headers are read from the complete blob or with range
    /// requests to `src`, a compressed layer's from its unpacked tree (an image layer's from
    /// its archive: [`super::image`]). `None` for a compressed layer not yet unpacked (its files come
    /// once it is fetched and unpacked).
    pub async fn lazy_table(&self, src: &Source, b: &BlobRef, format: Archive) -> Result<Option<BlobTable>, OciError> {
        let hex = hex_of(&b.digest)?.to_string();
        let image = image_layer(&b.media_type);
        match format {
            Archive::Raw => return Ok(Some(raw_table(b.size))),
            Archive::TarGzip | Archive::TarZstd => {
                let tree = self.core.store.tree_of(&hex, Layering::of(&b.media_type));
                if !tree.is_dir() {
                    return Ok(None);
                }
                if image {
                    if let Some(t) = self.kept_table(&hex, true) {
                        return Ok(Some(t));
                    }
                    if !self.core.store.present(&hex, b.size) {
                        return Ok(None);
                    }
                    let (blob, digest) = (self.core.store.blob(&hex), b.digest.clone());
                    let table = tokio::task::spawn_blocking(move || compressed_image_table(&blob, &digest, format))
                        .await
                        .map_err(|e| OciError::Local {
                            path: String::new(),
                            detail: e.to_string(),
                            kind: io::ErrorKind::Other,
                        })??;
                    self.store_table(&hex, &table, true);
                    return Ok(Some(table));
                }
                let entries = tokio::task::spawn_blocking(move || tree_table(&tree))
                    .await
                    .map_err(|e| OciError::Local {
                        path: String::new(),
                        detail: e.to_string(),
                        kind: io::ErrorKind::Other,
                    })?
                    .map_err(|e| OciError::local(&self.core.store.tree(&hex), &e, "", &b.digest))?;
                return Ok(Some(BlobTable { verified: true, entries, whiteouts: Vec::new() }));
            }
            Archive::Tar => {}
        }
        if let Some(t) = self.kept_table(&hex, image) {
            return Ok(Some(t));
        }
        let ((entries, whiteouts), verified) = if self.core.store.present(&hex, b.size) {
            let file = File::open(self.core.store.blob(&hex))
                .map_err(|e| OciError::local(&self.core.store.blob(&hex), &e, "", &b.digest))?;
            (read_tar(&Source_::Local(&file), &b.digest, b.size, image).await?, true)
        } else {
            let ep = self.core.registries.endpoint(src)?;
            let src = Source_::Remote(&ep, &b.digest);
            (read_tar(&src, &b.digest, b.size, image).await.map_err(OciError::redacted)?, false)
        };
        let table = BlobTable { verified, entries, whiteouts };
        self.store_table(&hex, &table, image);
        Ok(Some(table))
    }

    /// The table kept for layer `b` (no network): what a restarted daemon or a healed server
    /// serves. Raw and unpacked layers need none kept ([`Artifacts::lazy_table`] reads them),
    /// but for a compressed image layer's, read from its blob when missing (blocking).
    pub fn lazy_stored_table(&self, b: &BlobRef, format: Archive) -> Option<BlobTable> {
        let hex = hex_of(&b.digest).ok()?;
        let image = image_layer(&b.media_type);
        match format {
            Archive::Tar => self.kept_table(hex, image),
            Archive::Raw => Some(raw_table(b.size)),
            Archive::TarGzip | Archive::TarZstd => {
                let tree = self.core.store.tree_of(hex, Layering::of(&b.media_type));
                if !tree.is_dir() {
                    return None;
                }
                if image {
                    return self.kept_table(hex, true).or_else(|| {
                        let table =
                            self.core.store.present(hex, b.size).then(|| {
                                compressed_image_table(&self.core.store.blob(hex), &b.digest, format).ok()
                            })??;
                        self.store_table(hex, &table, true);
                        Some(table)
                    });
                }
                tree_table(&tree).ok().map(|entries| BlobTable { verified: true, entries, whiteouts: Vec::new() })
            }
        }
    }

    /// The table kept for blob `hex`, if it was read by the same rules (an image layer's or
    /// not) and this schema (another's is read again).
    fn kept_table(&self, hex: &str, image: bool) -> Option<BlobTable> {
        let text = std::fs::read(self.core.store.table(hex)).ok()?;
        serde_json::from_slice::<KeptTable>(&text)
            .ok()
            .filter(|k| k.version == TABLE_SCHEMA_VERSION && k.image == image)
            .map(|k| k.table)
    }

    /// Read the table of the complete tar layer `b` again from its verified bytes and compare it
    /// with the one kept (read before from a registry's ranges): equal, it is marked verified;
    /// different, the registry served headers that are not the blob's (an error, and the kept
    /// table is removed). Blocking-free: the reads run on the runtime.
    pub async fn lazy_check_table(&self, b: &BlobRef) -> Result<(), OciError> {
        let hex = hex_of(&b.digest)?.to_string();
        let image = image_layer(&b.media_type);
        let kept = self.kept_table(&hex, image);
        if kept.as_ref().is_some_and(|t| t.verified) {
            return Ok(());
        }
        let file = File::open(self.core.store.blob(&hex))
            .map_err(|e| OciError::local(&self.core.store.blob(&hex), &e, "", &b.digest))?;
        let (entries, whiteouts) = read_tar(&Source_::Local(&file), &b.digest, b.size, image).await?;
        if let Some(k) = &kept
            && (k.entries != entries || k.whiteouts != whiteouts)
        {
            let _ = std::fs::remove_file(self.core.store.table(&hex));
            return Err(OciError::DigestMismatch {
                registry: String::new(),
                reference: String::new(),
                digest: b.digest.clone(),
                actual: "a table of files other than the one its headers gave while it was downloading".into(),
            });
        }
        self.store_table(&hex, &BlobTable { verified: true, entries, whiteouts }, image);
        Ok(())
    }

    /// Keep a table read by the rules of image layers or not (best effort: without it a
    /// restart reads the headers again).
    fn store_table(&self, hex: &str, table: &BlobTable, image: bool) {
        let path = self.core.store.table(hex);
        let tmp = path.with_extension(format!("json.tmp.{}", std::process::id()));
        let written = serde_json::to_vec(&KeptTable { version: TABLE_SCHEMA_VERSION, image, table: table.clone() })
            .map_err(io::Error::other)
            .and_then(|bytes| std::fs::write(&tmp, bytes))
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            tracing::warn!(path = %path.display(), error = %e, "keeping a lazy layer's file table failed");
        }
    }
}
