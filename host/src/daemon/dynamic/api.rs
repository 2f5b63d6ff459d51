//! The HTTP/JSON API a dynamic volume's socket serves (`<published dir>/csi.sock`), shared by
//! the server (`daemon::dynamic`) and the client (`mounthost dynamic`).
//!
//! The server behind one socket knows one volume; no URL or body names a volume.
//!
//! | Request | Answer |
//! |---|---|
//! | `POST /mounts` with [`CreateMount`] | 201 [`MountView`] (ready), 202 (pending or pulling), 200 (the same request again) |
//! | `GET /mounts` | 200 [`MountList`] |
//! | `GET /mounts/{id}` | 200 [`MountView`] |
//! | `DELETE /mounts/{id}` | 200 [`MountView`] with state `deleted` |
//! | `GET /usage` | 200 [`Usage`]: the volume's byte level and caps |
//!
//! Every error is a 4xx (the client's mistake) or 5xx (the host's) with an [`ApiError`] body.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Path of the collection.
pub const MOUNTS_PATH: &str = "/mounts";
/// Path of the volume's byte level.
pub const USAGE_PATH: &str = "/usage";
/// Name of the socket in the published directory.
pub const SOCKET_NAME: &str = "csi.sock";
/// Name of the folder the mounts land in.
pub const MOUNTS_DIR: &str = "mounts";
/// Longest mount id.
pub const MAX_ID_LEN: usize = 63;
/// Largest request body, bytes.
pub const MAX_BODY: usize = 64 << 10;
/// Most parameters in one request.
pub const MAX_PARAMS: usize = 64;
/// Longest parameter key and value, bytes.
pub const MAX_KEY_LEN: usize = 128;
pub const MAX_VALUE_LEN: usize = 4096;

/// `POST /mounts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateMount {
    /// The mount's name: it lands at `mounts/<id>/`. See [`check_id`].
    pub id: String,
    /// Which plugin plans it; absent: the volume's own plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    /// What to mount (for the model plugin: `reference`, and optionally `include`, `exclude`,
    /// `weights`, `types`).
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
}

/// `GET /usage`: what counts against the volume's byte cap now (docs/dynamic-mounts.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// `heldBytes + endingBytes + reservedBytes`: at most `maxBytes`.
    pub level_bytes: u64,
    /// What the volume's mounts fetch (pending and ready; a failed one's nothing).
    pub held_bytes: u64,
    /// Still to come in the downloads of deleted or failed mounts, until they end.
    pub ending_bytes: u64,
    /// Of requests admitted and not recorded yet.
    pub reserved_bytes: u64,
    /// The cap; absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    pub mounts: u64,
    pub max_mounts: u64,
}

/// Where a mount is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MountState {
    /// Accepted; planning or waiting for its turn.
    Pending,
    /// Its blobs are downloading into the node's cache.
    Pulling,
    /// Mounted read-only at `mounts/<id>/`.
    Ready,
    /// It failed; `reason` says why. DELETE it, or POST it again to retry.
    Failed,
    /// Unmounted (the answer to DELETE).
    Deleted,
}

/// One mount as the API shows it (answers accept fields a newer server adds).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MountView {
    pub id: String,
    pub plugin: String,
    pub parameters: BTreeMap<String, String>,
    pub state: MountState,
    /// Relative to the published directory: `mounts/<id>`.
    pub path: String,
    /// While pulling: bytes in the cache and in total.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_done: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_total: Option<u64>,
    /// Why it failed (state `failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A lazy mount's progress (docs/lazy.md), as the host's ListVolumes shows a volume's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lazy: Option<crate::daemon::lazy::LazyStatus>,
}

/// `GET /mounts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MountList {
    pub mounts: Vec<MountView>,
}

/// The body of every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiError {
    /// A stable machine-readable code: `bad_request`, `bad_id`, `bad_json`, `too_large`,
    /// `not_found`, `method_not_allowed`, `conflict`, `too_many_mounts`, `too_many_requests`, `forbidden_plugin`,
    /// `signature_refused`,
    /// `unknown_plugin`, `invalid_parameters`, `unauthenticated`, `permission_denied`, `busy`,
    /// `unavailable`, `resource_exhausted`, `data_loss`, `internal`.
    pub code: String,
    /// What went wrong and what to do, for a person.
    pub message: String,
}

/// A mount id: 1 to 63 of `[a-z0-9-]`, starting and ending with a letter or digit (a DNS
/// label: no `.`, `/`, `%`, NUL or upper case, so it is one safe path component).
pub fn check_id(id: &str) -> Result<(), String> {
    let ok = !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !id.starts_with('-')
        && !id.ends_with('-');
    if ok {
        Ok(())
    } else {
        let shown: String = id.chars().take(80).flat_map(char::escape_debug).collect();
        Err(format!(
            "mount id \"{shown}\" is invalid: use 1 to {MAX_ID_LEN} lowercase letters, digits and dashes, starting and ending with a letter or digit"
        ))
    }
}

/// Parameters: at most [`MAX_PARAMS`], keys of `[A-Za-z0-9._-]` up to [`MAX_KEY_LEN`] bytes,
/// values up to [`MAX_VALUE_LEN`] bytes without control characters.
pub fn check_parameters(params: &BTreeMap<String, String>) -> Result<(), String> {
    if params.len() > MAX_PARAMS {
        return Err(format!("{} parameters; at most {MAX_PARAMS} are accepted", params.len()));
    }
    for (k, v) in params {
        let key_ok = !k.is_empty()
            && k.len() <= MAX_KEY_LEN
            && k.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !key_ok {
            let shown: String = k.chars().take(80).flat_map(char::escape_debug).collect();
            return Err(format!(
                "parameter name \"{shown}\" is invalid: use 1 to {MAX_KEY_LEN} letters, digits, `.`, `_` and `-`"
            ));
        }
        if v.len() > MAX_VALUE_LEN || v.chars().any(char::is_control) {
            return Err(format!(
                "parameter {k:?}: the value is longer than {MAX_VALUE_LEN} bytes or holds control characters"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_one_safe_path_component() {
        for good in ["a", "llama-3", "0", &"x".repeat(63)] {
            assert!(check_id(good).is_ok(), "{good}");
        }
        for bad in ["", "..", ".", "a/b", "a%2fb", "A", "a.b", "-a", "a-", "a\0", "é", &"x".repeat(64), "/etc"] {
            assert!(check_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn parameters_are_bounded() {
        let mut p = BTreeMap::new();
        p.insert("reference".to_string(), "r:5000/m:v1".to_string());
        assert!(check_parameters(&p).is_ok());
        p.insert("bad key".into(), "v".into());
        assert!(check_parameters(&p).is_err());
        let mut p = BTreeMap::new();
        p.insert("k".into(), "a\nb".into());
        assert!(check_parameters(&p).is_err());
        let many: BTreeMap<String, String> = (0..65).map(|i| (format!("k{i}"), String::new())).collect();
        assert!(check_parameters(&many).is_err());
    }

    #[test]
    fn unknown_fields_are_refused() {
        assert!(serde_json::from_str::<CreateMount>(r#"{"id":"a","volume":"b"}"#).is_err());
        let ok: CreateMount = serde_json::from_str(r#"{"id":"a","parameters":{"reference":"r/m"}}"#).unwrap();
        assert_eq!(ok.plugin, None);
    }
}
