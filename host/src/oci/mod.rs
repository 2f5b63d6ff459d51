//! The node-wide OCI blob cache and puller: what the `model` plugin's fetch and unpack steps
//! run on. DESIGN.md: "Bulk data never flows through the plugin: it plans fetch steps by digest
//! and the host downloads natively (resumable, digest-verified, content-addressed cache shared
//! by all volumes on the node)", and "a multi-GB model fetch must not hold a CSI call past its
//! deadline".
//!
//! So [`Artifacts::ensure`] never waits: it says which blobs are there and starts one background
//! download per missing digest, node-wide, shared by every volume asking for it; the CSI call
//! returns a retriable error while the pull goes on, and the next call finds it further along
//! ([`Artifacts::progress`]) or done. The executor (`exec::artifacts`) then unpacks a layer
//! once into a read-only tree of this store and hardlinks the tree into a volume. Because the cache is shared, [`Artifacts::authorize`] first makes a source prove to
//! the registry that it may read the blobs the cache already holds. Layout, verification,
//! resume and eviction: `docs/model-cache.md`.
//!
//! Registry traffic goes through oci-client (rustls with the ring provider): TLS always
//! verified against the system roots plus an optional CA bundle, plain HTTP only to hosts the
//! node lists as insecure, an optional proxy.

mod auth;
mod authorize;
mod cache;
mod download;
mod error;
mod flight;
mod follower;
mod guard;
mod index;
mod lazy;
mod live;
mod plugin;
mod pulls;
mod push;
mod referrer;
mod registry;
mod segments;
mod signed;
pub mod signing;
mod slots;
mod stall;
mod store;
mod table;
mod wire;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

pub use crate::plan::platform::Platform;
pub use auth::{Credentials, credentials_from_docker_config};
pub use download::MAX_REFETCH;
pub use error::{OciError, redact};
pub use index::{INDEX_ARTIFACT_TYPE, IndexDoc, PushedIndex, index_of, parse_index, push_index};
pub use lazy::{BlobView, ChunkIndex};
pub use signed::{MAX_REFERRERS, TreeEntry};
pub use table::image::{MergeLayer, Merged, merge as merge_image_layers};
pub use table::{BlobTable, Owner, TableEntry, TableKind, Whiteout};

/// The parsers of registry bytes, for the fuzz targets in `host/fuzz`; not an API.
#[doc(hidden)]
pub mod fuzzing {
    pub use super::plugin::plugin_layer;
    pub use super::table::tar_table_of;
}
pub use plugin::PluginPull;
pub use push::{PushedPlugin, push_plugin};
pub use referrer::{PREDICATE_ANNOTATION, PushedSignature, SignatureBundle, push_signature};
pub use store::{Store, hex_of, remove_tree};

/// The node's registry settings (from the daemon's configuration).
#[derive(Clone)]
pub struct RegistryConfig {
    /// PEM file of CAs trusted for registries, besides the system's roots, or a directory whose
    /// `*.crt` and `*.pem` files are such bundles (an empty directory adds none).
    pub ca_bundle: Option<PathBuf>,
    /// `host[:port]` of registries that may be reached over plain HTTP (when a source asks).
    pub insecure: BTreeSet<String>,
    /// HTTP(S) proxy URL for all registry traffic. Unset: the process's `HTTPS_PROXY`,
    /// `HTTP_PROXY` and `NO_PROXY` apply, as in any HTTP client.
    pub proxy: Option<String>,
    /// The node's mirrors: registry `host[:port]` → the `host[:port]` pulled from instead, for a
    /// source that names no mirror of its own ([`RegistryConfig::mirror_for`]).
    pub mirrors: BTreeMap<String, String>,
    /// Registry `host[:port]` → the hosts its token realm and redirects may name besides itself
    /// (`--registry-endpoint`); [`RegistryConfig::endpoints_for`] adds the built-in ones.
    pub endpoints: BTreeMap<String, BTreeSet<String>>,
    /// A download receiving less than [`STALL_BYTES`] in this window fails retriably.
    pub stall: std::time::Duration,
}

/// What a download must receive in each stall window (`--download-stall-secs`).
pub const STALL_BYTES: u64 = 64 << 10;

/// Hosts a registry's token realm is known to live on: Docker Hub's.
const BUILT_IN_ENDPOINTS: &[(&str, &str)] = &[
    ("docker.io", "auth.docker.io"),
    ("index.docker.io", "auth.docker.io"),
    ("registry-1.docker.io", "auth.docker.io"),
];

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig {
            ca_bundle: None,
            insecure: BTreeSet::new(),
            proxy: None,
            mirrors: BTreeMap::new(),
            endpoints: BTreeMap::new(),
            stall: std::time::Duration::from_secs(crate::config::DEFAULT_DOWNLOAD_STALL_SECS),
        }
    }
}

impl RegistryConfig {
    /// The client side of the node's registry settings.
    pub fn of(r: &crate::config::Registries) -> RegistryConfig {
        RegistryConfig {
            ca_bundle: r.ca_bundle.clone(),
            insecure: r.insecure.clone(),
            proxy: r.proxy.clone(),
            mirrors: r.mirrors.clone(),
            endpoints: r.endpoints.clone(),
            stall: r.download_stall,
        }
    }

    /// The hosts `registry`'s realm and redirects may name besides itself: the node's and the
    /// built-in ones.
    pub fn endpoints_for(&self, registry: &str) -> Vec<String> {
        let mut out: Vec<String> =
            self.endpoints.get(registry).map(|s| s.iter().cloned().collect()).unwrap_or_default();
        out.extend(BUILT_IN_ENDPOINTS.iter().filter(|(r, _)| *r == registry).map(|(_, h)| h.to_string()));
        out
    }

    /// The mirror a source of `registry` is pulled through: its own when it names one (a
    /// StorageClass's `mirror`), else the node's for that registry, else none.
    pub fn mirror_for(&self, registry: &str, own: Option<&str>) -> Option<String> {
        own.map(str::to_string).or_else(|| self.mirrors.get(&registry.to_ascii_lowercase()).cloned())
    }
}

impl fmt::Debug for RegistryConfig {
    // The proxy URL may carry a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryConfig")
            .field("ca_bundle", &self.ca_bundle)
            .field("insecure", &self.insecure)
            .field("proxy", &self.proxy.as_ref().map(|_| "<set>"))
            .field("mirrors", &self.mirrors)
            .finish()
    }
}

/// Where an artifact comes from, and how to get it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// `host[:port]` of the registry the reference names (`docker.io` is Docker Hub).
    pub registry: String,
    /// The repository (`org/model`).
    pub repository: String,
    /// A tag, or a `sha256:` digest.
    pub reference: String,
    /// `host[:port]` to contact instead of `registry`, with the same repository and credentials.
    pub mirror: Option<String>,
    /// Credentials for the registry (or the mirror).
    pub credentials: Credentials,
    /// Reach the registry over plain HTTP (refused unless the node lists it as insecure).
    pub insecure: bool,
    /// The platform an image index resolves to; `None`: the node's ([`Platform::node`]).
    pub platform: Option<Platform>,
}

/// A reference resolved to its manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// `sha256:…` of the manifest (for an index: of the manifest chosen for the platform).
    pub manifest_digest: String,
    /// The manifest's JSON, as the registry sent it.
    pub manifest: String,
    /// The config blob's JSON (at most 1 MiB), verified against its digest.
    pub config: String,
}

/// A blob a volume needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobRef {
    /// `sha256:<64 hex>`.
    pub digest: String,
    /// Its size in bytes, as the manifest says.
    pub size: u64,
    /// Its media type (informational).
    pub media_type: String,
}

/// A download a gone dynamic mount stopped ([`Artifacts::abandon`]): its blob, and which
/// download it was. A later download of the same digest (another volume asking for it) is
/// another one, and is not taken for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stopping {
    pub blob: BlobRef,
    flight: u64,
}

impl Stopping {
    /// A download of `blob` that is no download of this process (never running).
    #[cfg(test)]
    pub fn unknown(blob: BlobRef) -> Stopping {
        Stopping { blob, flight: 0 }
    }
}

/// How far a volume's blobs are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// Bytes of the volume's blobs on disk.
    pub done_bytes: u64,
    /// Bytes of all the volume's blobs.
    pub total_bytes: u64,
    /// Each blob.
    pub blobs: Vec<BlobProgress>,
}

/// How far one blob is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlobProgress {
    pub digest: String,
    /// Bytes on disk (all of them once verified).
    pub done: u64,
    pub total: u64,
}

/// What [`Artifacts::ensure`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ensure {
    /// Every blob is in the cache, verified.
    Ready,
    /// Some are downloading (in the background).
    Pulling(Progress),
    /// A download failed in a way retrying will not fix. Reported once to each volume that
    /// waited for it; the next `ensure` starts over.
    Failed(OciError),
}

/// One digest in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedBlob {
    pub digest: String,
    /// Bytes on disk: the blob plus its unpacked tree.
    pub size: u64,
    /// Last asked for or assembled.
    pub last_used: SystemTime,
    /// The volumes using it (from the caller's map).
    pub volumes: Vec<String>,
}

/// What [`Artifacts::prune`] removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Digests removed (blob and tree).
    pub blobs: usize,
    /// Bytes freed.
    pub bytes: u64,
}

/// The node's OCI cache and puller. Cheap to share in an `Arc`; every method may be called from
/// any thread (`ensure`, `progress` and `forget` from async code too: they do not block).
pub struct Artifacts {
    core: Arc<cache::Core>,
}

impl Artifacts {
    /// A cache at `cache_root` (its `blobs/` and `trees/`, created 0700; other files there are
    /// left alone). Reads the CA bundle now, so a bad one is reported at start; contacts nothing.
    pub fn new(cache_root: PathBuf, cfg: RegistryConfig) -> Result<Self, OciError> {
        // rustls needs one process-wide crypto provider; another part of the process may have
        // installed it already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Ok(Artifacts { core: Arc::new(cache::Core::new(&cache_root, cfg)?) })
    }

    /// Resolve `src` to its manifest and config. A tag is looked up on every call; an image
    /// index (or Docker manifest list) resolves to the manifest of `src.platform` or the
    /// node's, or to its first manifest when no entry names a platform (plan/platform.rs).
    pub async fn resolve(&self, src: &Source) -> Result<Resolved, OciError> {
        let resolved = async { self.core.registries.endpoint(src)?.resolve().await };
        resolved.await.map_err(OciError::redacted)
    }

    /// Prove that `src` may read those of `blobs` the cache already holds (complete, partly
    /// downloaded, or downloading with other credentials): a `HEAD` of each, with `src`'s
    /// credentials, to the registry (or its mirror), a few at once. What a registry allowed is
    /// remembered for the process's lifetime per host, repository, credentials (a sha256 of
    /// them) and digest, and so is every blob a download of `src` fetched: asking again costs
    /// nothing. Blobs not in the cache are not checked (their download uses `src`'s
    /// credentials). Errors: [`OciError::AuthMissing`] or [`OciError::AuthRefused`] (401, 403),
    /// [`OciError::BlobNotFound`] (404), or what the request met.
    ///
    /// Call it after [`Artifacts::resolve`] and before [`Artifacts::ensure`] with the same
    /// source: the cache is shared by every volume on the node, and without it a source could
    /// be handed a cached blob it has no right to.
    pub async fn authorize(&self, src: &Source, blobs: &[BlobRef]) -> Result<(), OciError> {
        self.core.authorize(src, blobs).await.map_err(OciError::redacted)
    }

    /// Make sure `blobs` are in the cache for `volume`, without waiting: present blobs count as
    /// done, missing ones get a background download (one per digest on the node, shared by
    /// every volume asking). Call it again to learn how far they are. Outside a tokio runtime
    /// (and when `new` was not called in one) a download cannot start: `Failed`.
    ///
    /// Present blobs are handed over without asking the registry: call
    /// [`Artifacts::authorize`] with the same source first.
    pub fn ensure(&self, volume: &str, src: &Source, blobs: &[BlobRef]) -> Ensure {
        match self.core.ensure(volume, src, blobs) {
            Ensure::Failed(e) => Ensure::Failed(e.redacted()),
            other => other,
        }
    }

    /// The progress of every volume that asked for blobs and was not forgotten.
    pub fn progress(&self) -> BTreeMap<String, Progress> {
        self.core.progress()
    }

    /// Why the last download of a digest stopped, for digests whose last attempt failed in a
    /// way that is retried (registry unreachable, connection lost) and that no attempt has
    /// pulled since: the next [`Artifacts::ensure`] asking for one resumes it. Digest → message.
    pub fn last_errors(&self) -> BTreeMap<String, String> {
        self.core.last_errors().into_iter().map(|(d, e)| (d, error::redact(&e))).collect()
    }

    /// `volume` no longer waits (it was unstaged, or a warm-up ended). The downloads it waited
    /// for go on to their end: whoever asks next finds the blob there or still coming.
    pub fn forget(&self, volume: &str) {
        self.core.forget(volume)
    }

    /// A dynamic mount's end: see [`cache::Core::abandon`].
    pub fn abandon(&self, waiter: &str) -> Vec<Stopping> {
        self.core.abandon(waiter)
    }

    /// The bytes still to come in the downloads `stopping` names, while each runs (not in a
    /// later download of the same blob).
    pub fn remaining(&self, stopping: &[Stopping]) -> u64 {
        self.core.remaining(stopping)
    }

    /// The downloads of `blobs` running now, named as [`Artifacts::abandon`] names them (without
    /// stopping them).
    #[cfg(test)]
    pub fn running(&self, blobs: &[BlobRef]) -> Vec<Stopping> {
        let inner = self.core.inner();
        blobs
            .iter()
            .filter_map(|b| {
                let f = inner.flights.get(store::hex_of(&b.digest).ok()?)?;
                Some(Stopping { blob: b.clone(), flight: f.id })
            })
            .collect()
    }

    /// The store on disk, for the executor's unpacking and linking (`exec::artifacts`), which
    /// holds [`Artifacts::digest_lock`] while it writes a digest's tree.
    pub fn store(&self) -> &Store {
        &self.core.store
    }

    /// The lock of one digest: held while its tree is unpacked or linked into a volume, and
    /// tried by [`Artifacts::prune`], which leaves a held digest alone.
    pub fn digest_lock(&self, hex: &str) -> Arc<std::sync::Mutex<()>> {
        self.core.digest_lock(hex)
    }

    /// The bytes of the cached blob `digest`, hashed again; `None` when the cache does not hold
    /// it whole. A blob larger than `max` bytes is refused. Counts as a use (eviction order).
    /// Blocking (one file read).
    pub fn read_blob(&self, digest: &str, max: u64) -> Result<Option<Vec<u8>>, OciError> {
        let hex = store::hex_of(digest)?;
        let path = self.core.store.blob(hex);
        let local = |e: &io::Error| OciError::local(&path, e, digest, digest);
        use std::os::unix::fs::OpenOptionsExt as _;
        // Opened without following a link and without waiting (a FIFO in its place would block
        // a plain open), then judged and read through that one descriptor.
        let flags = download::libc_flags() | rustix::fs::OFlags::NONBLOCK.bits() as i32;
        let file = std::fs::OpenOptions::new().read(true).custom_flags(flags).open(&path);
        let file = match file {
            Ok(f) => f,
            Err(e) if matches!(e.kind(), io::ErrorKind::NotFound) => return Ok(None),
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => return Ok(None),
            Err(e) => return Err(local(&e)),
        };
        let meta = file.metadata().map_err(|e| local(&e))?;
        if !meta.is_file() {
            return Ok(None);
        }
        let too_big = |len: u64| OciError::Local {
            path: path.display().to_string(),
            detail: format!("blob {digest} is {len} bytes, more than the {max} read here"),
            kind: io::ErrorKind::InvalidData,
        };
        if meta.len() > max {
            return Err(too_big(meta.len()));
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        io::Read::read_to_end(&mut io::Read::take(&file, max.saturating_add(1)), &mut bytes).map_err(|e| local(&e))?;
        if bytes.len() as u64 > max {
            return Err(too_big(bytes.len() as u64));
        }
        let actual = crate::plugin::Digest::of(&bytes).to_string();
        if actual != digest {
            return Err(OciError::DigestMismatch {
                registry: "this node's cache".into(),
                reference: path.display().to_string(),
                digest: digest.to_string(),
                actual,
            });
        }
        self.core.store.touch(hex);
        Ok(Some(bytes))
    }

    /// May registry `host` (`host[:port]`) be reached over plain HTTP (the node lists it)?
    pub fn plain_http_allowed(&self, host: &str) -> bool {
        self.core.registries.config().insecure.contains(&host.to_ascii_lowercase())
    }

    /// The mirror a source of `registry` is pulled through ([`RegistryConfig::mirror_for`]).
    pub fn mirror_for(&self, registry: &str, own: Option<&str>) -> Option<String> {
        self.core.registries.config().mirror_for(registry, own)
    }

    /// Blob bytes received from registries by downloads since start (manifests and configs
    /// that `resolve` reads are not counted). The process's metrics count them by registry
    /// as they arrive (`mounthost_oci_blob_fetched_bytes_total`), with the other pull metrics
    /// (`pulls.rs`).
    pub fn bytes_fetched(&self) -> u64 {
        self.core.fetched.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Every digest in the cache; `in_use` maps digests to the volumes using them.
    pub fn list(&self, in_use: &BTreeMap<String, Vec<String>>) -> io::Result<Vec<CachedBlob>> {
        self.core.list(in_use)
    }

    /// Evict least recently used digests (blob and tree) until the cache holds at most
    /// `keep_bytes`. Never evicted: digests in `in_use`, digests a volume asked for and was not
    /// forgotten, downloads in progress, and entries with a file hardlinked outside the cache
    /// (a volume still has it: removing it would free nothing). The cache never prunes by
    /// itself: its owner calls this with the volumes' real use (a copy made across filesystems
    /// shows in no link count).
    pub fn prune(&self, in_use: &BTreeSet<String>, keep_bytes: u64) -> io::Result<Pruned> {
        self.core.prune(in_use, keep_bytes)
    }
}

#[cfg(test)]
pub(crate) mod tests;
