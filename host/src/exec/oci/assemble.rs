//! [`Core::assemble`]: a blob into a volume, through the cache's tree for it; and
//! [`Core::prepare`], which unpacks that tree in the background first.
//!
//! Unpacking a multi-GB `tar+zstd` layer takes longer than kubelet waits for NodeStageVolume,
//! so a stage asks `prepare` (which never blocks) until every tree is there, answering a
//! retriable error meanwhile, and `assemble` then only links. Called without `prepare`,
//! `assemble` unpacks itself, as before.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::Prepared;
use super::cache::Core;
use super::error::OciError;
use super::link::{link_file, link_tree};
use super::store::{hex_of, remove_tree};
use super::unpack::unpack;
use crate::plan::Archive;

/// An unpack `prepare` started.
#[derive(Debug, Clone)]
pub(super) enum Unpack {
    Running,
    /// Failed; reported to the next `prepare` of the digest, which then starts over.
    Failed(OciError),
}

impl Core {
    pub fn assemble(&self, digest: &str, format: Archive, dest: &Path, below: &Path) -> io::Result<()> {
        let hex = hex_of(digest).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let lock = self.digest_lock(hex);
        let _held = lock.lock().unwrap_or_else(|p| p.into_inner());
        match format {
            Archive::Raw => {
                let blob = self.store.blob(hex);
                if !blob.is_file() {
                    return Err(missing(digest));
                }
                link_file(&blob, dest, below)?;
            }
            Archive::Tar | Archive::TarGzip | Archive::TarZstd => {
                let tree = self.tree_locked(hex, digest, format)?;
                link_tree(&tree, dest, below)?;
            }
        }
        self.store.touch(hex);
        Ok(())
    }

    pub fn prepare(self: &Arc<Self>, digest: &str, format: Archive) -> Prepared {
        let hex = match hex_of(digest) {
            Ok(hex) => hex.to_string(),
            Err(e) => return Prepared::Failed(e),
        };
        if format == Archive::Raw {
            return Prepared::Ready;
        }
        let mut unpacks = self.unpacks.lock().unwrap_or_else(|p| p.into_inner());
        match unpacks.get(&hex) {
            Some(Unpack::Running) => return Prepared::Working,
            Some(Unpack::Failed(e)) => {
                let e = e.clone();
                unpacks.remove(&hex);
                return Prepared::Failed(e);
            }
            None => {}
        }
        if self.store.tree(&hex).is_dir() {
            return Prepared::Ready;
        }
        if !self.store.blob(&hex).is_file() {
            return Prepared::Failed(local(&self.store.blob(&hex), &missing(digest), digest));
        }
        unpacks.insert(hex.clone(), Unpack::Running);
        drop(unpacks);
        let (core, owned, key) = (self.clone(), digest.to_string(), hex.clone());
        let span = tracing::Span::current();
        let started = std::thread::Builder::new().name("mh-unpack".into()).spawn(move || {
            let (hex, digest) = (key, owned);
            let _entered = span.enter();
            let lock = core.digest_lock(&hex);
            let result = {
                let _held = lock.lock().unwrap_or_else(|p| p.into_inner());
                core.tree_locked(&hex, &digest, format)
            };
            let mut unpacks = core.unpacks.lock().unwrap_or_else(|p| p.into_inner());
            match result {
                Ok(tree) => {
                    unpacks.remove(&hex);
                    core.store.touch(&hex);
                    tracing::debug!(digest, tree = %tree.display(), "layer ready");
                }
                Err(e) => {
                    tracing::warn!(digest, error = %e, "unpacking a layer failed");
                    unpacks.insert(hex, Unpack::Failed(local(&core.store.tree_dir(), &e, &digest)));
                }
            }
        });
        match started {
            Ok(_) => Prepared::Working,
            Err(e) => {
                self.unpacks.lock().unwrap_or_else(|p| p.into_inner()).remove(&hex);
                Prepared::Failed(local(&self.store.tree_dir(), &e, digest))
            }
        }
    }

    /// The tree of `hex`, unpacked now if it is not there yet. The caller holds its digest lock.
    fn tree_locked(&self, hex: &str, digest: &str, format: Archive) -> io::Result<PathBuf> {
        let tree = self.store.tree(hex);
        if tree.is_dir() {
            return Ok(tree);
        }
        let blob = self.store.blob(hex);
        if !blob.is_file() {
            return Err(missing(digest));
        }
        // Locked (flock) until renamed, so another daemon sharing the cache leaves it alone.
        let (tmp, _locked) = self.store.new_tree_tmp(hex)?;
        let started = std::time::Instant::now();
        if let Err(e) = unpack(&blob, digest, format, &tmp) {
            let _ = remove_tree(&tmp);
            return Err(e);
        }
        if let Err(e) = std::fs::rename(&tmp, &tree) {
            let _ = remove_tree(&tmp);
            // Another daemon sharing the cache renamed its own unpack there first.
            if !tree.is_dir() {
                return Err(e);
            }
        }
        std::fs::File::open(self.store.tree_dir())?.sync_all()?;
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
