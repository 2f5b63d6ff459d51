//! Plugins selected by OCI reference: `plugin: oci://registry/repository@sha256:<manifest>`.
//!
//! The runtime has no effects, so the registry is reached through a [`PluginPuller`] its owner
//! supplies (`oci::PluginPull`, the node's OCI blob cache: the same client, TLS, proxy,
//! plain-HTTP and credential rules as model artifacts). What this module adds is pure:
//!
//! - the reference's form: pinned by the manifest digest, or a tag only where the host allows
//!   tags (`--allow-plugin-tags`), which [`select`] resolves once to the digest it then pins;
//! - the checks on what came back: the manifest is the one the reference pins (the puller
//!   verifies its bytes against the digest), the layer's bytes hash to the layer's digest, and
//!   the component's own digest is the layer digest, which is what volumes record and
//!   `pluginDigest` pins;
//! - grants: a pulled plugin is granted what the node grants the name its `info` reports, and
//!   [`PluginRuntime::load_pulled`] refuses one that reports the name of a stock plugin or of a
//!   plugin in the folder (each time it is selected or reloaded), so pulling cannot take over
//!   another plugin's grants; and a name never selects a pulled build
//!   ([`PluginRuntime::resolve`]), only its reference does.
//!
//! Compiling goes through the same compiled-artifact cache as every plugin (keyed by the
//! component's sha256), so a restarted daemon loads the compiled form instead of compiling.

use std::sync::Arc;

use futures_util::future::BoxFuture;

use super::digest::Digest;
use super::{LoadedPlugin, PluginRuntime};
use crate::error::{Error, ErrorKind};
use crate::plan::oci_ref::{MAX_REFERENCE, OciRef};
use crate::secrets::Secrets;

/// The prefix of a `plugin` value that names an OCI artifact.
pub const SCHEME: &str = "oci://";
/// `artifactType` of a plugin's manifest (OCI image spec 1.1).
pub const ARTIFACT_TYPE: &str = "application/vnd.mounthost.plugin.manifest.v1+json";
/// Media type of the one layer: the component's `.wasm` bytes, as is.
pub const LAYER_MEDIA_TYPE: &str = "application/vnd.mounthost.plugin.v1+wasm";
/// The OCI empty descriptor's media type, used for the config (`{}`).
pub const EMPTY_CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";
/// The largest plugin the host pulls. Planners are small (the stock ones are 0.15-1 MiB), so a
/// pull is over in well under a second on any link a node has; the bound keeps a StorageClass
/// from making every node download and compile something large inside a CSI call.
pub const MAX_PULLED_BYTES: u64 = 16 << 20;
/// Annotation holding the plugin's name (what its `info` reports), set by `mounthost plugin push`.
pub const NAME_ANNOTATION: &str = "dev.mounthost.plugin.name";
/// Annotation holding the plugin's version, set by `mounthost plugin push`.
pub const VERSION_ANNOTATION: &str = "org.opencontainers.image.version";

/// The secret key holding the credentials for a plugin's registry: a docker config JSON
/// (`{"auths": {"REGISTRY": {"auth": …}}}`, the `.dockerconfigjson` of a
/// `kubernetes.io/dockerconfigjson` Secret). The host's own: plugins never receive it.
pub const AUTH_SECRET_KEY: &str = "pluginRegistryAuth";

/// What a puller brings back: the wasm, verified.
#[derive(Clone)]
pub struct Pulled {
    /// `sha256:…` of the manifest the reference resolved to.
    pub manifest_digest: String,
    /// `sha256:…` of the layer (the component's own digest).
    pub layer_digest: String,
    /// The component.
    pub wasm: Vec<u8>,
}

impl std::fmt::Debug for Pulled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pulled")
            .field("manifest_digest", &self.manifest_digest)
            .field("layer_digest", &self.layer_digest)
            .field("bytes", &self.wasm.len())
            .finish()
    }
}

/// The registry side of plugins by reference, supplied by the runtime's owner.
pub trait PluginPuller: Send + Sync {
    /// Resolve `reference` (by digest, or by tag) to its manifest, check that it is a plugin
    /// artifact ([`ARTIFACT_TYPE`], one [`LAYER_MEDIA_TYPE`] layer of at most
    /// [`MAX_PULLED_BYTES`]), get the layer into the node's cache and return its bytes,
    /// verified against the layer digest. Credentials come from `secrets` (its
    /// [`AUTH_SECRET_KEY`]). `waiter` names who waits (a volume id), for progress. A pull
    /// that takes longer than the puller waits answers UNAVAILABLE while it goes on.
    fn pull<'a>(
        &'a self,
        reference: &'a OciRef,
        secrets: &'a Secrets,
        waiter: &'a str,
    ) -> BoxFuture<'a, Result<Pulled, Error>>;

    /// The layer `digest` if the node's cache holds it (verified when it was stored, hashed
    /// again here), without asking a registry. Only for volumes that pulled it before (a
    /// restarted daemon): a new volume must show the registry it may read it ([`Self::pull`]).
    fn cached<'a>(&'a self, digest: &'a Digest) -> BoxFuture<'a, Result<Option<Vec<u8>>, Error>>;

    /// Note that volume `volume_id` (`<name>~<id>`) was created with the plugin pulled from
    /// `source` (pinned to its manifest), so that its DeleteVolume, which gets only the id, runs
    /// exactly that build. Written atomically (and synced) before CreateVolume answers; an
    /// error means it is not kept, and CreateVolume fails.
    fn remember(&self, volume_id: &str, source: &str) -> Result<(), Error>;

    /// What [`Self::remember`] and [`Self::deleted`] noted for `volume_id`.
    fn recall(&self, volume_id: &str) -> Result<VolumeNote, Error>;

    /// Where the note of `volume_id` is kept, if notes are kept (for error messages).
    fn note_path(&self, volume_id: &str) -> Option<std::path::PathBuf>;

    /// Volume `volume_id` was deleted: its note becomes a tombstone, so a repeated DeleteVolume
    /// answers OK (tombstones are dropped after a while).
    fn deleted(&self, volume_id: &str) -> Result<(), Error>;
}

/// What a controller noted about one volume's pulled plugin ([`PluginPuller::recall`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeNote {
    /// Nothing: not created here with a pulled plugin, or the note was lost.
    None,
    /// Created with the plugin pulled from this (pinned) reference.
    Source(String),
    /// Deleted (its plugin came from this reference).
    Deleted(String),
}

/// The reference in a `plugin` value that starts with [`SCHEME`], or `None` for a plugin name.
pub fn reference_of(value: &str) -> Option<&str> {
    value.strip_prefix(SCHEME)
}

/// Is this `plugin` value an OCI reference?
pub fn is_reference(value: &str) -> bool {
    reference_of(value).is_some()
}

/// The longest `plugin` value that is a reference.
pub const MAX_VALUE: usize = SCHEME.len() + MAX_REFERENCE;

/// Parse a `plugin` value naming an OCI artifact. Without a digest it is refused unless
/// `allow_tags`.
pub fn parse(value: &str, allow_tags: bool) -> Result<OciRef, Error> {
    let Some(raw) = reference_of(value) else {
        return Err(Error::invalid(format!("plugin {value:?} is not an {SCHEME} reference")));
    };
    let r = OciRef::parse(raw).map_err(|e| {
        Error::invalid(format!(
            "plugin {value:?}: {e}; write {SCHEME}REGISTRY/REPOSITORY@sha256:<manifest digest> (`mounthost plugin push` prints it)"
        ))
    })?;
    if r.digest().is_none() && !allow_tags {
        return Err(Error::invalid(format!(
            "plugin {value:?} names a tag without a digest, and this host does not allow plugin tags: a tag can \
             move, and the code a volume runs must not; pin it as {SCHEME}{}/{}@sha256:<manifest digest> \
             (`mounthost plugin push` prints it), or start the host daemon and the CSI controller with \
             --allow-plugin-tags to resolve tags once, when a volume is created or first staged",
            r.registry(),
            r.repository()
        )));
    }
    Ok(r)
}

/// `source` with its manifest digest: `oci://registry/repository[:tag]@sha256:…`.
fn pinned(r: &OciRef, manifest_digest: &str) -> String {
    let tag = r.tag().map(|t| format!(":{t}")).unwrap_or_default();
    format!("{SCHEME}{}/{}{tag}@{manifest_digest}", r.registry(), r.repository())
}

/// Does a `plugin` value a request carries name the recorded (pinned) `source`? The same
/// text, or the same reference without the digest (the tag it was resolved from).
pub fn same_source(asked: &str, source: &str) -> bool {
    if asked == source {
        return true;
    }
    match (reference_of(asked).map(OciRef::parse), reference_of(source).map(OciRef::parse)) {
        (Some(Ok(a)), Some(Ok(s))) => {
            a.digest().is_none()
                && a.tag().is_some()
                && (a.registry(), a.repository(), a.tag()) == (s.registry(), s.repository(), s.tag())
        }
        _ => false,
    }
}

/// A plugin selected by reference.
#[derive(Debug, Clone)]
pub struct Selected {
    /// The loaded plugin (its digest is the layer's).
    pub plugin: Arc<LoadedPlugin>,
    /// The reference pinned to the manifest it resolved to, what a volume records.
    pub source: String,
}

/// Pull, verify, load (compiled once per digest, cached on disk) and describe the plugin a
/// `plugin: oci://…` value names.
pub async fn select(
    runtime: &PluginRuntime,
    puller: &dyn PluginPuller,
    value: &str,
    allow_tags: bool,
    secrets: &Secrets,
    waiter: &str,
) -> Result<Selected, Error> {
    let r = parse(value, allow_tags)?;
    let pulled = puller.pull(&r, secrets, waiter).await?;
    if let Some(want) = r.digest()
        && want != pulled.manifest_digest
    {
        return Err(Error::new(
            ErrorKind::DataLoss,
            format!(
                "plugin {value}: digest mismatch: expected manifest {want}, the registry's is {}",
                pulled.manifest_digest
            ),
        ));
    }
    let actual = Digest::of(&pulled.wasm);
    if actual.to_string() != pulled.layer_digest {
        return Err(Error::new(
            ErrorKind::DataLoss,
            format!(
                "plugin {value}: digest mismatch: expected layer {}, the bytes received hash to {actual}",
                pulled.layer_digest
            ),
        ));
    }
    let source = pinned(&r, &pulled.manifest_digest);
    let plugin = runtime.load_pulled(pulled.wasm, source.clone()).await?;
    tracing::info!(plugin = %plugin.info.name, version = %plugin.info.version, %source, digest = %plugin.digest,
        compiled = ?plugin.obtained, "plugin pulled");
    Ok(Selected { plugin, source })
}

/// The build `digest` of the plugin a volume selected by `source` (its pinned reference): as
/// loaded already, else from the node's cache (a restarted daemon: the compiled form comes from
/// the compiled-artifact cache), else pulled again with `secrets`.
pub async fn reload(
    runtime: &PluginRuntime,
    puller: &dyn PluginPuller,
    source: &str,
    digest: &str,
    secrets: &Secrets,
    waiter: &str,
) -> Result<Arc<LoadedPlugin>, Error> {
    let d = Digest::parse(digest)
        .ok_or_else(|| Error::internal(format!("the recorded plugin digest {digest:?} is not sha256:<64 hex>")))?;
    if let Some(p) = runtime.loaded_pulled(&d).await? {
        return Ok(p);
    }
    if let Some(wasm) = puller.cached(&d).await?
        && Digest::of(&wasm) == d
    {
        let plugin = runtime.load_pulled(wasm, source.to_string()).await?;
        tracing::info!(plugin = %plugin.info.name, %source, digest = %plugin.digest, compiled = ?plugin.obtained,
            "plugin reloaded from the node's cache");
        return Ok(plugin);
    }
    let selected = select(runtime, puller, source, false, secrets, waiter).await?;
    if selected.plugin.digest != d {
        return Err(Error::new(
            ErrorKind::DataLoss,
            format!(
                "plugin {source}: digest mismatch: expected layer {d}, the registry's is {}",
                selected.plugin.digest
            ),
        ));
    }
    Ok(selected.plugin)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(c: char) -> String {
        std::iter::repeat_n(c, 64).collect()
    }

    #[test]
    fn references_must_be_pinned_unless_tags_are_allowed() {
        let pinned = format!("oci://r.io:5000/plugins/tmpfs@sha256:{}", hex('a'));
        assert_eq!(parse(&pinned, false).unwrap().digest(), Some(format!("sha256:{}", hex('a')).as_str()));
        let tagged = "oci://r.io/plugins/tmpfs:v1";
        let e = parse(tagged, false).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message.contains("names a tag without a digest") && e.message.contains("--allow-plugin-tags"), "{e}");
        assert_eq!(parse(tagged, true).unwrap().tag(), Some("v1"));
        let e = parse("oci://r.io/plugins/tmpfs", false).unwrap_err();
        assert!(e.message.contains("without a digest"), "latest is a tag too: {e}");
        for bad in ["oci://tmpfs", "oci://r.io/Up", "oci://r.io/x@sha256:abc", "tmpfs"] {
            assert_eq!(parse(bad, true).unwrap_err().kind, ErrorKind::InvalidArgument, "{bad}");
        }
    }

    #[test]
    fn a_recorded_source_matches_itself_and_the_tag_it_came_from() {
        let d = format!("sha256:{}", hex('b'));
        let source = format!("oci://r.io/p:v1@{d}");
        assert!(same_source(&source, &source));
        assert!(same_source("oci://r.io/p:v1", &source));
        assert!(!same_source("oci://r.io/p:v2", &source));
        assert!(!same_source(&format!("oci://r.io/p@sha256:{}", hex('c')), &source));
        assert!(!same_source("tmpfs", &source));
        let r = OciRef::parse("r.io/p:v1").unwrap();
        assert_eq!(pinned(&r, &d), source);
        assert!(is_reference(&source) && !is_reference("tmpfs"));
    }
}
