//! Loading precompiled plugin artifacts.
//!
//! `Component::deserialize_file` is `unsafe` because a crafted artifact is native code that
//! runs unchecked. We only ever load files that this daemon wrote into its own private cache
//! directory, and we check that before trusting one: owned by our effective uid, not writable
//! by group or others, inside a directory with the same properties.
#![allow(unsafe_code)]

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use wasmtime::Engine;
use wasmtime::component::Component;

/// Why an artifact was not loaded.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    /// It could not be inspected.
    #[error("reading {path}: {source}")]
    Io { path: String, source: std::io::Error },
    /// It is not safely ours.
    #[error("{path} is not trusted: {reason}")]
    Untrusted { path: String, reason: &'static str },
    /// wasmtime refused it (different engine configuration or version, corrupt file).
    #[error("deserializing {path}: {source}")]
    Incompatible { path: String, source: wasmtime::Error },
}

fn check_private(path: &Path) -> Result<(), ArtifactError> {
    let meta =
        fs::symlink_metadata(path).map_err(|source| ArtifactError::Io { path: path.display().to_string(), source })?;
    let euid = nix::unistd::geteuid().as_raw();
    let untrusted = |reason| ArtifactError::Untrusted { path: path.display().to_string(), reason };
    if meta.file_type().is_symlink() {
        return Err(untrusted("it is a symbolic link"));
    }
    if meta.uid() != euid {
        return Err(untrusted("it is owned by another user"));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(untrusted("it is writable by group or others"));
    }
    Ok(())
}

/// Load a component that this process (or an earlier run of it) serialized into `path`.
pub fn load_component(engine: &Engine, path: &Path) -> Result<Component, ArtifactError> {
    if let Some(dir) = path.parent() {
        check_private(dir)?;
    }
    check_private(path)?;
    // SAFETY: the file was written by this daemon with `Component::serialize` into a private
    // directory, and both were just checked to be owned by us and not writable by anyone else.
    // wasmtime itself verifies that the artifact matches this engine's version and settings.
    unsafe { Component::deserialize_file(engine, path) }
        .map_err(|source| ArtifactError::Incompatible { path: path.display().to_string(), source })
}
