//! Plans as data: the steps the host executes, with every path resolved and checked.
//!
//! A plugin returns a WIT plan whose paths are relative to the volume's directories and whose
//! programs are names. [`policy::check`] turns it into a [`Plan`] of [`Step`]s with absolute
//! paths and resolved executables, or refuses it. A `Plan` holds no secret values (secrets
//! stay references until the executor fills them in), so it can be logged, printed, stored
//! and diffed as is.

pub mod policy;
pub mod url;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A checked plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// The plugin that made it.
    pub plugin: String,
    /// The plugin's digest.
    pub digest: String,
    /// Steps in order.
    pub steps: Vec<Step>,
    /// Attributes the plugin asked the host to record.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attributes: Vec<(String, String)>,
}

/// A value that is either plain text or a reference to a CSI secret by key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Value {
    /// Plain text.
    Literal(String),
    /// The secret with this key, filled in at execution time.
    Secret(String),
}

/// An environment variable of a spawned program.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvVar {
    /// Its name.
    pub name: String,
    /// Its value.
    pub value: Value,
}

/// An HTTP header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// Its name.
    pub name: String,
    /// Its value.
    pub value: Value,
}

/// A mount option: text, or a path inside the volume that the executor hands to the kernel as
/// a descriptor (`/proc/self/fd/N`), resolved without following links. Serialized untagged, so
/// a plain string reads as text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MountOption {
    /// Passed as is (`size=1G`).
    Text(String),
    /// `prefix` followed by the path (`lowerdir=` + a directory of the volume).
    Path { prefix: String, path: PathBuf },
}

/// Archive formats for [`Step::Unpack`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Archive {
    /// A single file.
    Raw,
    /// tar.
    Tar,
    /// gzip-compressed tar.
    TarGzip,
    /// zstd-compressed tar.
    TarZstd,
}

/// One executable step. Paths are absolute and inside the volume's directories.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "kebab-case", rename_all_fields = "camelCase")]
pub enum Step {
    /// Create a directory and its parents.
    Mkdir { path: PathBuf },
    /// Remove a directory tree.
    Remove { path: PathBuf },
    /// Spawn a FUSE program and wait for its mount.
    SpawnFuse {
        /// The program's name as the plugin gave it.
        program: String,
        /// The binary the host config maps that name to.
        executable: PathBuf,
        /// Arguments, paths resolved.
        args: Vec<String>,
        /// Environment (nothing else is inherited).
        env: Vec<EnvVar>,
        /// Where the filesystem appears.
        mountpoint: PathBuf,
        /// Its fstype in mountinfo.
        fstype: String,
        /// How long to wait for it.
        ready_timeout_ms: u32,
        /// cgroup memory limit.
        #[serde(skip_serializing_if = "Option::is_none")]
        memory_limit_bytes: Option<u64>,
    },
    /// mount(2).
    Mount { fstype: String, source: String, target: PathBuf, options: Vec<MountOption>, readonly: bool },
    /// A bind mount.
    Bind { source: PathBuf, target: PathBuf, readonly: bool, options: Vec<String> },
    /// Download a blob into the content-addressed cache.
    Fetch { url: String, headers: Vec<Header>, digest: String, size: u64 },
    /// Unpack a fetched blob.
    Unpack { digest: String, format: Archive, dest: PathBuf },
    /// An HTTP call (controller side).
    Http {
        method: String,
        urls: Vec<String>,
        headers: Vec<Header>,
        #[serde(skip_serializing_if = "String::is_empty", default)]
        body: String,
        ok_status: Vec<u16>,
    },
    /// Serve the per-volume dynamic-mount socket.
    Socket { path: PathBuf },
}

impl Step {
    /// The step's kind as the WIT names it (for messages).
    pub fn kind(&self) -> &'static str {
        match self {
            Step::Mkdir { .. } => "mkdir",
            Step::Remove { .. } => "remove",
            Step::SpawnFuse { .. } => "spawn-fuse",
            Step::Mount { .. } => "mount",
            Step::Bind { .. } => "bind",
            Step::Fetch { .. } => "fetch",
            Step::Unpack { .. } => "unpack",
            Step::Http { .. } => "http",
            Step::Socket { .. } => "socket",
        }
    }
}

/// Whether the plan's mount or bind at `target` is read-only (`None` if it makes none there).
pub fn planned_readonly(plan: &Plan, target: &Path) -> Option<bool> {
    plan.steps.iter().rev().find_map(|step| match step {
        Step::Bind { target: t, readonly, .. } | Step::Mount { target: t, readonly, .. } if t == target => {
            Some(*readonly)
        }
        _ => None,
    })
}

/// Keys of every secret a plan references.
pub fn secret_refs(plan: &Plan) -> Vec<String> {
    let mut keys = Vec::new();
    for step in &plan.steps {
        let values: Vec<&Value> = match step {
            Step::SpawnFuse { env, .. } => env.iter().map(|e| &e.value).collect(),
            Step::Fetch { headers, .. } | Step::Http { headers, .. } => headers.iter().map(|h| &h.value).collect(),
            _ => Vec::new(),
        };
        keys.extend(values.into_iter().filter_map(|v| match v {
            Value::Secret(k) => Some(k.clone()),
            Value::Literal(_) => None,
        }));
    }
    keys
}

/// A plan value with its secret filled in (every referenced secret was checked present before
/// anything ran).
pub fn resolve(v: &Value, secrets: &crate::secrets::Secrets) -> String {
    match v {
        Value::Literal(s) => s.clone(),
        // Checked before anything ran: every referenced secret is present.
        Value::Secret(k) => secrets.get(k).unwrap_or_default().to_string(),
    }
}
