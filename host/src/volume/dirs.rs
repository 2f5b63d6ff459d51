//! The directories of one volume. Plans may only name paths inside these.
//!
//! `staging` and `target` come from the CO (kubelet); `cache` and `runtime` are the host's
//! own, under its state directory, named by a hash of the volume id so that any id (up to the
//! CSI limit of 128 bytes, with any characters) maps to a short, safe name. `runtime` is kept
//! short because unix socket paths must fit in 108 bytes.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::plugin::bindings::types::DirRoot;

/// Absolute directories of one volume for one operation; `None` where the operation has none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeDirs {
    /// The CSI staging path.
    pub staging: Option<PathBuf>,
    /// The CSI publish target.
    pub target: Option<PathBuf>,
    /// The volume's node cache, removed at unstage.
    pub cache: Option<PathBuf>,
    /// The volume's runtime directory (sockets).
    pub runtime: Option<PathBuf>,
    /// The volume's directory for a FUSE program the host mounts for (which runs as the
    /// volume's own user and reads its secret files there).
    pub fuse_files: Option<PathBuf>,
}

/// A short, stable, filesystem-safe name for a volume id.
pub fn volume_key(volume_id: &str) -> String {
    hex::encode(&Sha256::digest(volume_id.as_bytes())[..8])
}

impl VolumeDirs {
    /// The host-owned directories of `volume_id` under `state_dir`: `cache/volumes/<key>` and
    /// `run/<key>` (compiled plugins live beside them in `cache/plugins`).
    pub fn host_owned(state_dir: &Path, volume_id: &str) -> Self {
        let key = volume_key(volume_id);
        VolumeDirs {
            staging: None,
            target: None,
            cache: Some(state_dir.join("cache").join("volumes").join(&key)),
            runtime: Some(state_dir.join("run").join(&key)),
            fuse_files: None,
        }
    }

    /// Where a spawn's secret files go: the FUSE files directory for a program the host
    /// mounts for (`host_mounted`), else `<runtime>/secrets`. `None` when the operation has
    /// no such directory.
    pub fn secret_files(&self, host_mounted: bool) -> Option<PathBuf> {
        if host_mounted {
            self.fuse_files.clone()
        } else {
            self.runtime.as_ref().map(|r| r.join(crate::plan::SECRETS_DIR))
        }
    }

    /// The host's own directories of the volume (cache, runtime).
    pub fn host_dirs(&self) -> Vec<PathBuf> {
        [&self.cache, &self.runtime].into_iter().flatten().cloned().collect()
    }

    /// The directory behind a WIT root.
    pub fn root(&self, root: DirRoot) -> Option<&Path> {
        match root {
            DirRoot::Staging => self.staging.as_deref(),
            DirRoot::Target => self.target.as_deref(),
            DirRoot::Cache => self.cache.as_deref(),
            DirRoot::Runtime => self.runtime.as_deref(),
        }
    }
}

/// The WIT name of a root, for messages.
pub fn root_name(root: DirRoot) -> &'static str {
    match root {
        DirRoot::Staging => "staging",
        DirRoot::Target => "target",
        DirRoot::Cache => "cache",
        DirRoot::Runtime => "runtime",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_owned_dirs_are_short_and_stable() {
        let long_id = "x".repeat(128);
        let d = VolumeDirs::host_owned(Path::new("/var/lib/mounthost"), &long_id);
        let runtime = d.runtime.unwrap();
        assert_eq!(runtime, VolumeDirs::host_owned(Path::new("/var/lib/mounthost"), &long_id).runtime.unwrap());
        assert!(runtime.join("weed.sock").as_os_str().len() < 108);
        assert_ne!(volume_key("a"), volume_key("b"));
    }
}
