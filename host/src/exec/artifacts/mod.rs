//! A fetched blob into a volume, through the node cache's read-only tree for it
//! ([`Assembler::assemble`]), and [`Assembler::prepare`], which unpacks that tree in the
//! background first. The cache itself (its store, the registries, the downloads) is `oci/`;
//! what writes below a volume root or into the cache's trees is here, in the executor's room:
//! archives are unpacked and trees linked through descriptors resolved without following
//! links ([`crate::exec::beneath`]).
//!
//! Unpacking a multi-GB `tar+zstd` layer takes longer than kubelet waits for NodeStageVolume,
//! so a stage asks `prepare` (which never blocks) until every tree is there, answering a
//! retriable error meanwhile, and `assemble` then only links. Called without `prepare`,
//! `assemble` unpacks itself.

mod link;
mod unpack;

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use self::link::{link_file, link_tree};
use self::unpack::unpack_layer;
use crate::oci::{Artifacts, OciError, hex_of, remove_tree};
use crate::plan::Archive;
use crate::plan::tar_rules::Layering;

/// The parsers of registry bytes, for the fuzz targets in `host/fuzz`; not an API.
#[doc(hidden)]
pub mod fuzzing {
    pub use super::unpack::{LeftOut, unpack, unpack_layer};

    /// Apply the image layer tree `tree` (made by [`unpack_layer`]) over the directory `dest`
    /// below `below`, as a stage applies it into a volume.
    pub fn apply_image_layer(
        tree: &std::path::Path,
        dest: &std::path::Path,
        below: &std::path::Path,
    ) -> std::io::Result<()> {
        super::link::link_tree(tree, dest, below, crate::plan::tar_rules::Layering::Image)
    }
}

/// What [`Assembler::prepare`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prepared {
    /// [`Assembler::assemble`] will only link: the tree is there (or the blob is raw).
    Ready,
    /// The layer is being unpacked (in the background).
    Working,
    /// The unpack failed (a refused or corrupt archive, a full disk, the blob gone). Reported
    /// once; the next `prepare` starts over.
    Failed(OciError),
}

/// Unpacks and links the node cache's blobs. Cheap to share in an `Arc`.
pub struct Assembler {
    cache: Arc<Artifacts>,
    /// Unpacks that `prepare` started, by hex digest and layering: running, or failed and not
    /// yet reported.
    unpacks: Mutex<HashMap<(String, Layering), Unpack>>,
}

/// An unpack `prepare` started.
#[derive(Debug, Clone)]
enum Unpack {
    Running,
    /// Failed; reported to the next `prepare` of the digest, which then starts over.
    Failed(OciError),
}

impl Assembler {
    /// Unpacks and links for the blobs of `cache`.
    pub fn new(cache: Arc<Artifacts>) -> Arc<Assembler> {
        Arc::new(Assembler { cache, unpacks: Mutex::new(HashMap::new()) })
    }

    /// Put the blob `digest` at `dest` (blocking): for `Raw`, `dest` is the file, a hardlink to
    /// the blob; for the tar formats, every file of the cache's read-only tree for the blob is
    /// hardlinked into the directory `dest` (copied when `dest` is on another filesystem); the
    /// tree is unpacked first if [`Assembler::prepare`] has not made it (that can take long).
    /// `dest` lies below the directory `below` and is resolved without following symbolic
    /// links; missing directories are created, and temporary names an interrupted assemble left
    /// there are removed. Idempotent. An image layer (`layering`) is applied over what `dest`
    /// holds ([`link::link_tree`]).
    pub fn assemble(
        &self,
        digest: &str,
        format: Archive,
        layering: Layering,
        dest: &Path,
        below: &Path,
    ) -> io::Result<()> {
        let hex = hex_of(digest).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let lock = self.cache.digest_lock(hex);
        let _held = lock.lock().unwrap_or_else(|p| p.into_inner());
        match format {
            Archive::Raw => {
                let blob = self.cache.store().blob(hex);
                if !blob.is_file() {
                    return Err(missing(digest));
                }
                link_file(&blob, dest, below)?;
            }
            Archive::Tar | Archive::TarGzip | Archive::TarZstd => {
                let tree = self.tree_locked(hex, digest, format, layering)?;
                link_tree(&tree, dest, below, layering)?;
            }
        }
        self.cache.store().touch(hex);
        Ok(())
    }

    /// Get the blob `digest` ready for [`Assembler::assemble`] without waiting: for the tar
    /// formats, start unpacking it into the cache's tree on a thread of its own (once per
    /// digest on the node, whoever asks) and say how far it is; a raw blob is `Ready` at once.
    /// Call it again until `Ready`. The blob must be in the cache (after `Ensure::Ready`).
    pub fn prepare(self: &Arc<Self>, digest: &str, format: Archive, layering: Layering) -> Prepared {
        match self.prepare_inner(digest, format, layering) {
            Prepared::Failed(e) => Prepared::Failed(e.redacted()),
            other => other,
        }
    }

    fn prepare_inner(self: &Arc<Self>, digest: &str, format: Archive, layering: Layering) -> Prepared {
        let hex = match hex_of(digest) {
            Ok(hex) => hex.to_string(),
            Err(e) => return Prepared::Failed(e),
        };
        if format == Archive::Raw {
            return Prepared::Ready;
        }
        let mut unpacks = self.unpacks.lock().unwrap_or_else(|p| p.into_inner());
        let slot = (hex.clone(), layering);
        match unpacks.get(&slot) {
            Some(Unpack::Running) => return Prepared::Working,
            Some(Unpack::Failed(e)) => {
                let e = e.clone();
                unpacks.remove(&slot);
                return Prepared::Failed(e);
            }
            None => {}
        }
        if self.cache.store().tree_of(&hex, layering).is_dir() {
            return Prepared::Ready;
        }
        if !self.cache.store().blob(&hex).is_file() {
            return Prepared::Failed(local(&self.cache.store().blob(&hex), &missing(digest), digest));
        }
        unpacks.insert(slot.clone(), Unpack::Running);
        drop(unpacks);
        let (core, owned, key) = (self.clone(), digest.to_string(), hex.clone());
        let span = tracing::Span::current();
        let started = std::thread::Builder::new().name("mh-unpack".into()).spawn(move || {
            let (hex, digest) = (key, owned);
            let _entered = span.enter();
            let lock = core.cache.digest_lock(&hex);
            let result = {
                let _held = lock.lock().unwrap_or_else(|p| p.into_inner());
                core.tree_locked(&hex, &digest, format, layering)
            };
            let mut unpacks = core.unpacks.lock().unwrap_or_else(|p| p.into_inner());
            match result {
                Ok(tree) => {
                    unpacks.remove(&(hex.clone(), layering));
                    core.cache.store().touch(&hex);
                    tracing::debug!(digest, tree = %tree.display(), "layer ready");
                }
                Err(e) => {
                    tracing::warn!(digest, error = %e, "unpacking a layer failed");
                    unpacks.insert((hex, layering), Unpack::Failed(local(&core.cache.store().tree_dir(), &e, &digest)));
                }
            }
        });
        match started {
            Ok(_) => Prepared::Working,
            Err(e) => {
                self.unpacks.lock().unwrap_or_else(|p| p.into_inner()).remove(&slot);
                Prepared::Failed(local(&self.cache.store().tree_dir(), &e, digest))
            }
        }
    }

    /// The tree of `hex` laid out as `layering` says, unpacked now if it is not there yet. The
    /// caller holds its digest lock.
    fn tree_locked(&self, hex: &str, digest: &str, format: Archive, layering: Layering) -> io::Result<PathBuf> {
        let tree = self.cache.store().tree_of(hex, layering);
        if tree.is_dir() {
            return Ok(tree);
        }
        let blob = self.cache.store().blob(hex);
        if !blob.is_file() {
            return Err(missing(digest));
        }
        // Locked (flock) until renamed, so another daemon sharing the cache leaves it alone.
        let (tmp, _locked) = self.cache.store().new_tree_tmp(hex, layering)?;
        let started = std::time::Instant::now();
        let left_out = match unpack_layer(&blob, digest, format, layering, &tmp) {
            Ok(left_out) => left_out,
            Err(e) => {
                let _ = remove_tree(&tmp);
                return Err(e);
            }
        };
        if left_out.any() {
            tracing::warn!(
                digest,
                devices = left_out.devices,
                fifos = left_out.fifos,
                hard_links = left_out.hard_links,
                others = left_out.others,
                set_id_cleared = left_out.set_id_cleared,
                "an image layer's entries left out: device nodes, FIFOs, hard links to no file before them in the layer, paths climbing out or through a link; set-id bits cleared"
            );
            let m = crate::metrics::global();
            m.image_entries_left_out("device", left_out.devices);
            m.image_entries_left_out("fifo", left_out.fifos);
            m.image_entries_left_out("hard_link", left_out.hard_links);
            m.image_entries_left_out("other", left_out.others);
            m.image_entries_left_out("set_id_cleared", left_out.set_id_cleared);
        }
        if let Err(e) = std::fs::rename(&tmp, &tree) {
            let _ = remove_tree(&tmp);
            // Another daemon sharing the cache renamed its own unpack there first.
            if !tree.is_dir() {
                return Err(e);
            }
        }
        if let Some(dir) = tree.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        tracing::info!(
            digest,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "layer unpacked into the model cache"
        );
        Ok(tree)
    }
}

fn missing(digest: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("blob {digest} is not in the model cache (ensure it before assembling)"),
    )
}

/// An unpack's failure as the cache reports it (a full disk as [`OciError::DiskFull`]).
fn local(path: &Path, e: &io::Error, digest: &str) -> OciError {
    OciError::local(path, e, "its archive", digest)
}

#[cfg(test)]
mod tests;
