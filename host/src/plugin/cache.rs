//! On-disk cache of compiled plugins, so a daemon restart does not recompile.
//!
//! Keyed by the wasm's sha256 and the engine's precompile-compatibility hash: a different
//! wasmtime version or engine setting gets a different file, never a wrong one. Files are
//! written atomically into a private (0700) directory, mode 0600.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;

use tracing::{debug, warn};
use wasmtime::Engine;
use wasmtime::component::Component;

use super::digest::Digest;
use super::file_access::PluginFiles;

/// How a component was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Obtained {
    /// Loaded from the on-disk cache.
    Cached,
    /// Compiled now (and written to the cache when there is one).
    Compiled,
}

/// The compiled-artifact cache (or none: always compile).
#[derive(Clone)]
pub struct ArtifactCache {
    dir: Option<PathBuf>,
    files: Arc<dyn PluginFiles>,
}

impl ArtifactCache {
    /// A cache in `dir` through `files`, or no cache.
    pub fn new(dir: Option<PathBuf>, files: Arc<dyn PluginFiles>) -> Self {
        ArtifactCache { dir, files }
    }

    /// The cache file for `digest` under this engine, if there is a cache.
    pub fn path_for(&self, engine: &Engine, digest: &Digest) -> Option<PathBuf> {
        let mut h = DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut h);
        self.dir.as_ref().map(|d| d.join(format!("{}-{:016x}.cwasm", digest.hex(), h.finish())))
    }

    /// Load the component for `bytes` from the cache, or compile it and store it.
    /// Blocking (compilation takes tens of milliseconds): call from a blocking thread.
    pub fn load_or_compile(
        &self,
        engine: &Engine,
        digest: &Digest,
        bytes: &[u8],
    ) -> wasmtime::Result<(Component, Obtained)> {
        let Some(path) = self.path_for(engine, digest) else {
            return Ok((Component::new(engine, bytes)?, Obtained::Compiled));
        };
        match self.files.load_compiled(engine, &path) {
            Some(Ok(c)) => return Ok((c, Obtained::Cached)),
            // A stale or foreign file is replaced below, never trusted.
            Some(Err(e)) => warn!(%e, "ignoring cached plugin artifact"),
            None => {}
        }
        let component = Component::new(engine, bytes)?;
        if let Err(e) = component.serialize().and_then(|b| Ok(self.files.save_compiled(&path, &b)?)) {
            warn!(path = %path.display(), %e, "could not write the compiled plugin cache");
        } else {
            debug!(path = %path.display(), "cached compiled plugin");
        }
        Ok((component, Obtained::Compiled))
    }
}
