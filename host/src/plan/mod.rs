//! Plans as data: the steps the host executes, with every path resolved and checked.
//!
//! A plugin returns a WIT plan whose paths are relative to the volume's directories and whose
//! programs are names. [`policy::check`] turns it into a [`Plan`] of [`Step`]s with absolute
//! paths and resolved executables, or refuses it. A `Plan` holds no secret values (secrets
//! stay references by key until the executor fills them in, into the environment, a header
//! or a file), so it can be logged, printed, stored and diffed as is.

pub mod lazy;
pub mod oci_ref;
pub mod platform;
pub mod policy;
pub mod rules;
pub mod tar_rules;
pub mod url;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::secrets::Secrets;

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

impl Plan {
    /// How the blob `digest` is laid out when an `unpack` step applies it: as an image layer
    /// when a `fetch-blob` step of the plan fetched it under an image layer media type
    /// ([`tar_rules::IMAGE_LAYER_TYPES`]), else as a plain archive.
    pub fn layering(&self, digest: &str) -> tar_rules::Layering {
        layering_in(&self.steps, digest)
    }
}

/// [`Plan::layering`] of these steps.
pub fn layering_in(steps: &[Step], digest: &str) -> tar_rules::Layering {
    steps
        .iter()
        .find_map(|s| match s {
            Step::FetchBlob { digest: d, media_type, .. } if d == digest => Some(tar_rules::Layering::of(media_type)),
            _ => None,
        })
        .unwrap_or_default()
}

/// A value: plain text, a path, or a reference to a CSI secret by key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Value {
    /// Plain text.
    Literal(String),
    /// The secret with this key, filled in at execution time.
    Secret(String),
    /// `prefix`, the secret with this key, then `suffix` (`Bearer <token>`).
    SecretTemplate { prefix: String, key: String, suffix: String },
    /// An absolute path inside the volume's directories (environment values only).
    Path(PathBuf),
    /// The path of a file the executor writes the secret with this key into, in the volume's
    /// runtime directory ([`secret_file_path`]; environment values only).
    SecretFile(String),
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

/// A program argument: text, or the path of a file holding a secret. Serialized untagged, so
/// the plain strings of plans stored before secret files existed read as text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SpawnArg {
    /// Passed as is (paths inside the volume already resolved into it).
    Text(String),
    /// `prefix`, the path of the file holding the secret `key` ([`secret_file_path`]), then
    /// `suffix`.
    SecretFile { prefix: String, key: String, suffix: String },
    /// `prefix`, `/dev/fd/3` ([`FUSE_FD`]), then `suffix`: the FUSE connection the host mounted
    /// for a spawn with a [`HostMount`].
    FuseFd {
        #[serde(rename = "fuseFdPrefix")]
        prefix: String,
        #[serde(rename = "fuseFdSuffix")]
        suffix: String,
    },
}

impl SpawnArg {
    /// The argument the program gets, with secret files under the volume's `runtime`
    /// directory. Holds no secret value.
    pub fn render(&self, runtime: &Path) -> String {
        self.render_at(&runtime.join(SECRETS_DIR))
    }

    /// The argument the program gets, with secret files in `secrets_dir` (always named by
    /// absolute path).
    pub fn render_at(&self, secrets_dir: &Path) -> String {
        match self {
            SpawnArg::Text(t) => t.clone(),
            SpawnArg::SecretFile { prefix, key, suffix } => {
                format!("{prefix}{}{suffix}", secrets_dir.join(secret_file_name(key)).display())
            }
            SpawnArg::FuseFd { prefix, suffix } => format!("{prefix}/dev/fd/{FUSE_FD}{suffix}"),
        }
    }
}

/// The descriptor a FUSE program started with a [`HostMount`] gets its connection on
/// (`/dev/fd/3`: the first after stdin, stdout and stderr).
pub const FUSE_FD: i32 = 3;

/// The descriptor the host's own lazy FUSE server gets its listening control socket on (the
/// one after [`FUSE_FD`]; `unpriv::lazy_wire`).
pub const CONTROL_FD: i32 = 4;

/// A FUSE filesystem the host mounts itself (WIT `fuse-mount.host-fd`): it opens `/dev/fuse`,
/// mounts the connection at the spawn's mountpoint with the spawn's fstype, and starts the
/// program unprivileged with only that descriptor ([`FUSE_FD`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostMount {
    /// The source the mount table shows.
    pub source: String,
    /// Extra FUSE mount options, from the policy's allow-list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    /// Mount read-only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub readonly: bool,
}

impl From<&str> for SpawnArg {
    fn from(s: &str) -> Self {
        SpawnArg::Text(s.to_string())
    }
}

/// Registry credentials of a [`Step::Resolve`], as CSI secret *keys*; the values stay in the
/// request's secrets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", rename_all_fields = "camelCase")]
pub enum RegistryAuth {
    /// No credentials.
    Anonymous,
    /// The secrets holding a username and a password.
    Basic { username_key: String, password_key: String },
    /// The secret holding a bearer token.
    Token(String),
    /// The secret holding a `.dockerconfigjson` document.
    DockerConfig(String),
}

impl RegistryAuth {
    /// The secret keys these credentials name.
    pub fn keys(&self) -> Vec<&str> {
        match self {
            RegistryAuth::Anonymous => Vec::new(),
            RegistryAuth::Basic { username_key, password_key } => vec![username_key, password_key],
            RegistryAuth::Token(k) | RegistryAuth::DockerConfig(k) => vec![k],
        }
    }
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

/// What the host's lazy FUSE server of a volume serves: the blobs a stage plan's `unpack`
/// steps would have laid out, in their order (docs/lazy.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lazy {
    /// The layers, in the order their files replace one another.
    pub layers: Vec<LazyLayer>,
    /// The digest of the artifact's chunk index (the manifest's referrer), when it has one:
    /// every chunk is checked against it before a reader gets its bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<String>,
    /// The name of the server's control socket in the volume's runtime directory (each server
    /// of a volume has its own: the stage's, each dynamic mount's).
    #[serde(default = "lazy::default_control")]
    pub control: String,
}

/// One blob of a [`Lazy`] filesystem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LazyLayer {
    /// `sha256:<64 hex>`.
    pub digest: String,
    /// Its size.
    pub size: u64,
    /// Its media type (messages, the cache listing).
    pub media_type: String,
    /// How it is packed.
    pub format: Archive,
    /// Where its files go below the filesystem's root (`raw`: the file's own path; a tar
    /// format: the directory its entries go into, `""` for the root).
    pub dest: String,
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
        /// Arguments, paths resolved; secret files are written and named at execution.
        args: Vec<SpawnArg>,
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
        /// The host mounts the filesystem and runs the program unprivileged; `None`: the
        /// program mounts it itself.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        host_mount: Option<HostMount>,
        /// The program is the host's own lazy FUSE server ([`lazy::lower`]), serving these
        /// layers.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lazy: Option<Box<Lazy>>,
    },
    /// mount(2).
    Mount { fstype: String, source: String, target: PathBuf, options: Vec<MountOption>, readonly: bool },
    /// A bind mount.
    Bind { source: PathBuf, target: PathBuf, readonly: bool, options: Vec<String> },
    /// Download a blob into the content-addressed cache.
    Fetch { url: String, headers: Vec<Header>, digest: String, size: u64 },
    /// Resolve an OCI reference to its manifest and config (stage plans, at most one).
    Resolve {
        /// `registry[:port]/repository[:tag][@sha256:<hex>]` ([`oci_ref::OciRef`]).
        reference: String,
        /// Pull through this registry (`host[:port]`) instead.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mirror: Option<String>,
        /// Credentials, by secret key.
        auth: RegistryAuth,
        /// Plain HTTP (the host config decides whether that is allowed).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        insecure: bool,
    },
    /// Fetch a blob of the resolved artifact into the node's cache.
    FetchBlob { digest: String, size: u64, media_type: String },
    /// Unpack a fetched blob.
    Unpack {
        digest: String,
        format: Archive,
        dest: PathBuf,
        /// How it is laid out: as an image layer when the plan fetched the blob under an
        /// image layer media type (the policy decides; records before it have none: files).
        #[serde(default, skip_serializing_if = "tar_rules::Layering::is_files")]
        layering: tar_rules::Layering,
    },
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
    /// A planning-time read of the backend (checked like an `http` step; performed between
    /// planner calls by [`crate::unpriv::lookup`], and never part of the plan that runs).
    Lookup { key: String, method: String, urls: Vec<String>, headers: Vec<Header> },
    /// A unary gRPC call to a running program of the volume over its unix socket in the
    /// volume's runtime directory (node side: a new quota for `weed mount`).
    SocketCall { socket: PathBuf, method: String, message: Vec<u8>, timeout_ms: u32 },
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
            Step::Resolve { .. } => "resolve",
            Step::FetchBlob { .. } => "fetch-blob",
            Step::Unpack { .. } => "unpack",
            Step::Http { .. } => "http",
            Step::Socket { .. } => "socket",
            Step::Lookup { .. } => "lookup",
            Step::SocketCall { .. } => "socket-call",
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

/// Why a publish plan would not give the pod a read-only volume at `content`, the root the
/// publish makes the volume appear at (the target, or `<target>/volume` for a dynamic volume).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotReadOnly {
    /// A mount or bind at `content` or below it is read-write.
    #[error("a read-write {kind} at {}", path.display())]
    Writable {
        /// The step's kind (`bind`, `mount`).
        kind: &'static str,
        /// Where it mounts.
        path: PathBuf,
    },
    /// Nothing is mounted or bound at `content`: the pod would get the bare directory, writable,
    /// on the node's disk.
    #[error("no mount or bind at {} (the pod would get a writable empty directory on the node's disk)", .0.display())]
    NothingAt(PathBuf),
}

/// NodePublishVolume with `readonly`: the host's own check of a plugin's publish plan (plugins
/// are untrusted planners). The plan must mount or bind something at `content`, and every
/// mount and bind at `content` or below it must be read-only. Steps elsewhere (a sibling path,
/// the staging path) are not the publication's and are not judged here.
pub fn read_only_publication(plan: &Plan, content: &Path) -> Result<(), NotReadOnly> {
    let mut at_root = false;
    for step in &plan.steps {
        let (Step::Bind { target, readonly, .. } | Step::Mount { target, readonly, .. }) = step else { continue };
        if !target.starts_with(content) {
            continue;
        }
        if !readonly {
            return Err(NotReadOnly::Writable { kind: step.kind(), path: target.clone() });
        }
        at_root |= target == content;
    }
    if at_root { Ok(()) } else { Err(NotReadOnly::NothingAt(content.to_path_buf())) }
}

/// Keys of every secret a plan's steps fill in (environment, arguments, headers, secret
/// files), each once, in the order they first appear: those a FUSE restart needs, and that a
/// call checks present. Registry credentials ([`RegistryAuth::keys`]) are among them only for
/// a lazy volume ([`lazy`]), whose fill goes on after the stage (and after a restart of the
/// daemon); otherwise only the stage's `resolve` uses them, and they are never kept.
pub fn secret_refs(plan: &Plan) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    let mut add = |k: &str| {
        if !keys.iter().any(|seen| seen == k) {
            keys.push(k.to_string());
        }
    };
    let lazy = lazy::layers(plan).is_some();
    for step in &plan.steps {
        match step {
            Step::Resolve { auth, .. } if lazy => auth.keys().into_iter().for_each(&mut add),
            Step::SpawnFuse { args, env, .. } => {
                for a in args {
                    if let SpawnArg::SecretFile { key, .. } = a {
                        add(key);
                    }
                }
                env.iter().filter_map(|e| value_key(&e.value)).for_each(&mut add);
            }
            Step::Fetch { headers, .. } | Step::Http { headers, .. } | Step::Lookup { headers, .. } => {
                headers.iter().filter_map(|h| value_key(&h.value)).for_each(&mut add);
            }
            _ => {}
        }
    }
    keys
}

/// The secret a value references, if any.
fn value_key(v: &Value) -> Option<&str> {
    match v {
        Value::Secret(k) | Value::SecretTemplate { key: k, .. } | Value::SecretFile(k) => Some(k),
        Value::Literal(_) | Value::Path(_) => None,
    }
}

/// Keys of the secrets a step has the executor write into files (secret-file arguments and
/// environment values of a spawn), each once.
pub fn secret_files(step: &Step) -> BTreeSet<String> {
    let Step::SpawnFuse { args, env, .. } = step else { return BTreeSet::new() };
    let from_args = args.iter().filter_map(|a| match a {
        SpawnArg::SecretFile { key, .. } => Some(key.clone()),
        SpawnArg::Text(_) | SpawnArg::FuseFd { .. } => None,
    });
    let from_env = env.iter().filter_map(|e| match &e.value {
        Value::SecretFile(key) => Some(key.clone()),
        _ => None,
    });
    from_args.chain(from_env).collect()
}

/// Where the secret `key` is written for a spawn: `<runtime>/secrets/<16 hex of
/// sha256(key)>`. The name is derived from the key, never from the value, and the runtime
/// directory lives on a tmpfs, outside the state directory, and goes away at unstage.
pub fn secret_file_path(runtime: &Path, key: &str) -> PathBuf {
    runtime.join(SECRETS_DIR).join(secret_file_name(key))
}

/// The name of the file the secret `key` is written to: 16 hex of sha256(key).
pub fn secret_file_name(key: &str) -> String {
    hex::encode(&Sha256::digest(key.as_bytes())[..8])
}

/// The directory of secret files inside a volume's runtime directory.
pub const SECRETS_DIR: &str = "secrets";

/// A header or environment value with its secret filled in (every referenced secret was
/// checked present before anything ran). A [`Value::SecretFile`] names a file of the volume's
/// runtime directory, which this function does not know: environment values go through
/// [`resolve_env`]; the policy allows secret files nowhere else, so here it yields "".
pub fn resolve(v: &Value, secrets: &Secrets) -> String {
    match v {
        Value::Literal(s) => s.clone(),
        // Checked before anything ran: every referenced secret is present.
        Value::Secret(k) => secrets.get(k).unwrap_or_default().to_string(),
        Value::SecretTemplate { prefix, key, suffix } => {
            format!("{prefix}{}{suffix}", secrets.get(key).unwrap_or_default())
        }
        Value::Path(p) => p.display().to_string(),
        Value::SecretFile(_) => String::new(),
    }
}

/// An environment value of a spawn, filled in: secrets, paths, and secret files at their
/// path under the volume's `runtime` directory ([`secret_file_path`]).
pub fn resolve_env(v: &Value, secrets: &Secrets, runtime: &Path) -> String {
    resolve_env_at(v, secrets, &runtime.join(SECRETS_DIR))
}

/// [`resolve_env`] with secret files in `secrets_dir` as the program names it (see
/// [`SpawnArg::render_at`]).
pub fn resolve_env_at(v: &Value, secrets: &Secrets, secrets_dir: &Path) -> String {
    match v {
        Value::SecretFile(key) => secrets_dir.join(secret_file_name(key)).display().to_string(),
        other => resolve(other, secrets),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets() -> Secrets {
        [("token".to_string(), "hunter22".to_string())].into_iter().collect()
    }

    #[test]
    fn secret_files_are_named_by_a_hash_of_the_key() {
        let path = secret_file_path(Path::new("/s/run/ab"), "token");
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        assert_eq!(path, Path::new("/s/run/ab/secrets").join(&name));
        assert_eq!(name.len(), 16);
        assert!(name.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(secret_file_path(Path::new("/r"), "other"), secret_file_path(Path::new("/r"), "token"));
        assert_eq!(hex::encode(&Sha256::digest(b"token")[..8]), name);
    }

    #[test]
    fn values_fill_in_only_at_execution() {
        let s = secrets();
        let runtime = Path::new("/r");
        let template = Value::SecretTemplate { prefix: "Bearer ".into(), key: "token".into(), suffix: "!".into() };
        assert_eq!(resolve(&template, &s), "Bearer hunter22!");
        assert_eq!(resolve(&Value::Path("/a/b".into()), &s), "/a/b");
        assert_eq!(resolve(&Value::Secret("token".into()), &s), "hunter22");
        let file = Value::SecretFile("token".into());
        assert_eq!(resolve_env(&file, &s, runtime), secret_file_path(runtime, "token").display().to_string());
        assert_eq!(resolve(&file, &s), "", "a secret file has no text outside an environment");
        assert!(!format!("{template:?} {file:?}").contains("hunter22"));
    }

    #[test]
    fn a_read_only_publication_needs_read_only_mounts_at_and_below_its_root() {
        let content = Path::new("/k/pods/p/volumes/v/mount");
        let bind = |target: &str, readonly| Step::Bind {
            source: "/k/staging".into(),
            target: target.into(),
            readonly,
            options: vec![],
        };
        let mount = |target: &str, readonly| Step::Mount {
            fstype: "tmpfs".into(),
            source: "tmpfs".into(),
            target: target.into(),
            options: vec![],
            readonly,
        };
        let root = content.to_str().unwrap();
        let below = "/k/pods/p/volumes/v/mount/sub";
        let sibling = "/k/pods/p/volumes/v/mount2";
        let writable = |kind, path: &str| Err(NotReadOnly::Writable { kind, path: path.into() });
        let nothing = Err(NotReadOnly::NothingAt(content.to_path_buf()));
        let table: Vec<(&str, Vec<Step>, Result<(), NotReadOnly>)> = vec![
            ("read-only bind at the root", vec![bind(root, true)], Ok(())),
            ("read-only mount at the root", vec![mount(root, true)], Ok(())),
            ("read-write bind at the root", vec![bind(root, false)], writable("bind", root)),
            ("read-write mount at the root", vec![mount(root, false)], writable("mount", root)),
            ("nothing at the root", vec![Step::Mkdir { path: content.into() }], nothing.clone()),
            ("no step at all", vec![], nothing.clone()),
            (
                "read-only at the root, read-write below",
                vec![bind(root, true), bind(below, false)],
                writable("bind", below),
            ),
            (
                "read-write below, read-only at the root over it",
                vec![mount(below, false), bind(root, true)],
                writable("mount", below),
            ),
            ("read-only at the root and below", vec![bind(root, true), mount(below, true)], Ok(())),
            ("only below the root", vec![bind(below, true)], nothing.clone()),
            ("read-write at a sibling path is not counted", vec![bind(sibling, false), bind(root, true)], Ok(())),
            ("a sibling path does not count as the root", vec![bind(sibling, true)], nothing.clone()),
        ];
        for (what, steps, want) in table {
            let plan = Plan { plugin: "p".into(), digest: String::new(), steps, attributes: vec![] };
            assert_eq!(read_only_publication(&plan, content), want, "{what}");
        }
    }

    #[test]
    fn secret_refs_and_files_cover_every_kind() {
        let spawn = Step::SpawnFuse {
            program: "p".into(),
            executable: "/bin/p".into(),
            args: vec![
                "x".into(),
                SpawnArg::SecretFile { prefix: "-k=".into(), key: "a".into(), suffix: String::new() },
            ],
            env: vec![
                EnvVar {
                    name: "B".into(),
                    value: Value::SecretTemplate { prefix: String::new(), key: "b".into(), suffix: String::new() },
                },
                EnvVar { name: "C".into(), value: Value::SecretFile("c".into()) },
                EnvVar { name: "P".into(), value: Value::Path("/p".into()) },
                EnvVar { name: "A".into(), value: Value::Secret("a".into()) },
            ],
            mountpoint: "/m".into(),
            fstype: "fuse.p".into(),
            ready_timeout_ms: 1,
            memory_limit_bytes: None,
            host_mount: None,
            lazy: None,
        };
        let resolve = Step::Resolve {
            reference: "r.io/m".into(),
            mirror: None,
            auth: RegistryAuth::Basic { username_key: "u".into(), password_key: "pw".into() },
            insecure: false,
        };
        let fetch = Step::Fetch {
            url: "https://r.io/x".into(),
            headers: vec![Header { name: "H".into(), value: Value::Secret("h".into()) }],
            digest: String::new(),
            size: 1,
        };
        let files = secret_files(&spawn);
        let plan =
            Plan { plugin: "p".into(), digest: String::new(), steps: vec![spawn, resolve, fetch], attributes: vec![] };
        assert_eq!(secret_refs(&plan), ["a", "b", "c", "h"], "registry credentials are the resolve's only");
        assert_eq!(files, BTreeSet::from(["a".to_string(), "c".to_string()]));
    }
}
