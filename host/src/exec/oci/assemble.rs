//! [`Core::assemble`]: a blob into a volume, through the cache's tree for it.

use std::io;
use std::path::Path;

use super::cache::Core;
use super::link::{link_file, link_tree};
use super::store::{hex_of, remove_tree};
use super::unpack::unpack;
use crate::plan::Archive;

impl Core {
    pub fn assemble(&self, digest: &str, format: Archive, dest: &Path, below: &Path) -> io::Result<()> {
        let hex = hex_of(digest).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let lock = self.digest_lock(hex);
        let _held = lock.lock().unwrap_or_else(|p| p.into_inner());
        let blob = self.store.blob(hex);
        let missing = || {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("blob {digest} is not in the model cache (ensure it before assembling)"),
            )
        };
        match format {
            Archive::Raw => {
                if !blob.is_file() {
                    return Err(missing());
                }
                link_file(&blob, dest, below)?;
            }
            Archive::Tar | Archive::TarGzip | Archive::TarZstd => {
                let tree = self.store.tree(hex);
                if !tree.is_dir() {
                    if !blob.is_file() {
                        return Err(missing());
                    }
                    let tmp = self.store.tree_tmp(hex);
                    let started = std::time::Instant::now();
                    if let Err(e) = unpack(&blob, digest, format, &tmp) {
                        let _ = remove_tree(&tmp);
                        return Err(e);
                    }
                    std::fs::rename(&tmp, &tree).inspect_err(|_| {
                        let _ = remove_tree(&tmp);
                    })?;
                    std::fs::File::open(self.store.tree_dir())?.sync_all()?;
                    tracing::info!(
                        digest,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "layer unpacked into the model cache"
                    );
                }
                link_tree(&tree, dest, below)?;
            }
        }
        self.store.touch(hex);
        Ok(())
    }
}
