//! Dynamic mounts: what the host promises a plugin's `dynamic_mount` planner, and how the
//! resolution of an OCI reference reaches it.
//!
//! A pod whose volume is dynamic asks the host, over the volume's socket, to mount something
//! more into that same volume. The host calls [`Plugin::dynamic_mount`](crate::Plugin::dynamic_mount)
//! with a [`DynamicMountRequest`](crate::DynamicMountRequest):
//!
//! - `context` is the volume's context (StorageClass parameters or volume attributes): trusted;
//! - `request` is what the pod asked for: **untrusted**, check every key and value;
//! - `recorded` holds the attributes the volume's stage plan recorded (and, in the second round
//!   of a resolve, the resolution: see below);
//! - `subdir` is always the empty string: the mount has a directory of its own.
//!
//! # Directories
//!
//! The dir roots of a dynamic-mount plan name the mount's own directories, not the volume's:
//!
//! | root | what it is for a dynamic mount |
//! |---|---|
//! | [`DirRoot::Target`](crate::DirRoot::Target) | the mount's own directory, `<published dir>/mounts/<id>` |
//! | [`DirRoot::Cache`](crate::DirRoot::Cache) | a cache directory owned by that one mount |
//! | [`DirRoot::Staging`](crate::DirRoot::Staging) | not available: a plan must not name it |
//! | [`DirRoot::Runtime`](crate::DirRoot::Runtime) | not available: a plan must not name it |
//!
//! Every bind or mount onto the target must be read-only: the volume's pods share it.
//!
//! # Resolving an OCI reference
//!
//! The contract's `dynamic-mount-request` (0.2.0 to 0.5.0) has no `resolved` field, so the host runs the same
//! two rounds as for a stage and passes the resolution in `recorded`, under reserved keys:
//!
//! 1. The first call has none of the [`RESOLVED_KEYS`]. If its plan holds a [`Step::Resolve`](crate::Step::Resolve)
//!    (at most one), the host resolves it (policy, credentials, mirror) and calls `dynamic_mount`
//!    again with the same request.
//! 2. The second call's `recorded` holds all four [`RESOLVED_KEYS`] (read them with
//!    [`resolved_from_recorded`]) next to the stage's own recorded attributes. Its plan must
//!    repeat the same `Resolve` step, followed by `FetchBlob` and `Unpack` steps.
//!
//! The keys start with [`RESOLVED_PREFIX`], which is the host's: a plan's attributes must not use
//! it.

use crate::{Kv, Resolved};

/// Every reserved key starts with this; plugins must not record attributes under it.
pub const RESOLVED_PREFIX: &str = "mounthost.resolved.";
/// [`Resolved::reference`]: the reference as the plan's `resolve` step gave it.
pub const RESOLVED_REFERENCE: &str = "mounthost.resolved.reference";
/// [`Resolved::manifest_digest`]: `sha256:<hex>` of the manifest.
pub const RESOLVED_MANIFEST_DIGEST: &str = "mounthost.resolved.manifestDigest";
/// [`Resolved::manifest`]: the manifest (JSON, as served).
pub const RESOLVED_MANIFEST: &str = "mounthost.resolved.manifest";
/// [`Resolved::config`]: the config blob the manifest names (JSON).
pub const RESOLVED_CONFIG: &str = "mounthost.resolved.config";
/// The four keys, in the order of [`Resolved`]'s fields.
pub const RESOLVED_KEYS: [&str; 4] = [RESOLVED_REFERENCE, RESOLVED_MANIFEST_DIGEST, RESOLVED_MANIFEST, RESOLVED_CONFIG];

/// The resolution the host passed to a dynamic mount's second round, or `None` in the first
/// round. `Some` only if all four [`RESOLVED_KEYS`] are present (a key given twice counts once,
/// its first value); a plugin that wants to tell "some but not all" apart from "none" checks
/// [`RESOLVED_KEYS`] itself.
pub fn resolved_from_recorded(recorded: &[Kv]) -> Option<Resolved> {
    let get = |key: &str| recorded.iter().find(|kv| kv.key == key).map(|kv| kv.value.clone());
    Some(Resolved {
        reference: get(RESOLVED_REFERENCE)?,
        manifest_digest: get(RESOLVED_MANIFEST_DIGEST)?,
        manifest: get(RESOLVED_MANIFEST)?,
        config: get(RESOLVED_CONFIG)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv;

    fn all() -> Vec<Kv> {
        vec![
            kv("reference", "r.io/stage:1"),
            kv(RESOLVED_CONFIG, "{}"),
            kv(RESOLVED_MANIFEST, "{\"layers\":[]}"),
            kv(RESOLVED_MANIFEST_DIGEST, "sha256:00"),
            kv(RESOLVED_REFERENCE, "r.io/m:1"),
            kv("files", "3"),
        ]
    }

    #[test]
    fn all_four_keys_make_a_resolution() {
        assert_eq!(
            resolved_from_recorded(&all()),
            Some(Resolved {
                reference: "r.io/m:1".into(),
                manifest_digest: "sha256:00".into(),
                manifest: "{\"layers\":[]}".into(),
                config: "{}".into(),
            })
        );
        assert!(RESOLVED_KEYS.iter().all(|k| k.starts_with(RESOLVED_PREFIX)));
    }

    #[test]
    fn a_missing_key_is_no_resolution() {
        assert_eq!(resolved_from_recorded(&[]), None);
        assert_eq!(resolved_from_recorded(&[kv("reference", "r.io/m:1")]), None);
        for key in RESOLVED_KEYS {
            let partial: Vec<Kv> = all().into_iter().filter(|kv| kv.key != key).collect();
            assert_eq!(resolved_from_recorded(&partial), None, "without {key}");
        }
    }

    #[test]
    fn the_first_of_a_repeated_key_counts() {
        let mut recorded = all();
        recorded.push(kv(RESOLVED_REFERENCE, "other.io/x:2"));
        assert_eq!(resolved_from_recorded(&recorded).unwrap().reference, "r.io/m:1");
    }
}
