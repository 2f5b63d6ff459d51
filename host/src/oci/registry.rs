//! Talking to registries: one oci-client per (host, plain HTTP or not, credentials), resolving a
//! reference to its manifest and config, and opening a byte range of a blob.
//!
//! oci-client keeps credentials per registry host inside a client (the first ones stored win),
//! so two volumes pulling from one registry with different secrets get different clients; the
//! map is keyed by a digest of the credentials, not the credentials themselves.
//!
//! TLS is always verified: the system's roots plus the configured CA bundle. Plain HTTP is used
//! only when the source asks for it *and* the node's configuration lists the host as insecure;
//! otherwise the request is refused before any connection is made.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::plan::platform::Platform;
use bytes::Bytes;
use futures_util::Stream;
use oci_client::Client;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::manifest::{
    IMAGE_MANIFEST_LIST_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE,
};
use reqwest::StatusCode;
use sha2::Digest as _;

use super::error::{Ctx, OciError, What, chain};
use super::guard::{Listed, Origin, Places};
use super::stall::Window;
use super::wire::{Call, MAX_MANIFEST_BYTES, Settings, Wire};
use super::{RegistryConfig, Resolved, Source};

/// The largest config blob [`Endpoint::resolve`] reads.
pub(super) const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Clients kept before the map is emptied (each holds a connection pool).
const MAX_CLIENTS: usize = 64;

/// The node's registry settings, and the clients made from them.
pub(super) struct Registries {
    cfg: RegistryConfig,
    /// The CA bundle's PEM files, for oci-client (pushes).
    ca: Vec<Certificate>,
    /// The same, for the pull clients.
    roots: Vec<reqwest::Certificate>,
    clients: Mutex<HashMap<ClientKey, Arc<Wire>>>,
}

/// Host contacted, registry named (whose listed hosts the client allows), plain HTTP or not,
/// digest of the credentials.
type ClientKey = (String, String, bool, [u8; 32]);

/// Who asks whom: the host contacted (the mirror when there is one), the repository and a
/// sha256 of the credentials (never the credentials). What [`Endpoint::check_blob`] proves is
/// remembered per scope and digest.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Scope {
    pub host: String,
    pub repository: String,
    pub credentials: [u8; 32],
}

impl Scope {
    /// A sha256 of the scope, in hex: what a partial file's writer file holds.
    pub fn tag(&self) -> String {
        let mut h = sha2::Sha256::new();
        for part in [self.host.as_bytes(), self.repository.as_bytes(), &self.credentials] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part);
        }
        hex::encode(h.finalize())
    }
}

/// One source, ready to be talked to.
pub(super) struct Endpoint {
    wire: Arc<Wire>,
    /// The repository as the contacted host knows it.
    repository: String,
    /// The tag or digest asked for.
    reference: String,
    /// The platform an index resolves to (`None`: the node's).
    platform: Option<Platform>,
    pub ctx: Ctx,
    pub scope: Scope,
}

/// The bytes of a blob range as they arrive.
pub(super) type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes, reqwest::Error>> + Send>>;

/// A blob range being received.
pub(super) struct Body {
    pub stream: ByteStream,
    /// The registry ignored the range and sends the whole blob from byte 0.
    pub full: bool,
}

impl Registries {
    /// Read the CA bundle (a file, or every `*.crt` and `*.pem` file of a directory); nothing is
    /// contacted yet.
    pub fn new(cfg: RegistryConfig) -> Result<Registries, OciError> {
        let (mut ca, mut roots) = (Vec::new(), Vec::new());
        if let Some(path) = &cfg.ca_bundle {
            for file in ca_files(path)? {
                let pem = std::fs::read(&file)
                    .map_err(|e| OciError::Config(format!("reading the registry CA bundle {}: {e}", file.display())))?;
                use rustls::pki_types::pem::PemObject;
                let certs =
                    rustls::pki_types::CertificateDer::pem_slice_iter(&pem).collect::<Result<Vec<_>, _>>().map_err(
                        |e| OciError::Config(format!("the registry CA bundle {} is not PEM: {e}", file.display())),
                    )?;
                if certs.is_empty() {
                    return Err(OciError::Config(format!(
                        "the registry CA bundle {} holds no certificate",
                        file.display()
                    )));
                }
                for der in certs {
                    roots.push(reqwest::Certificate::from_der(der.as_ref()).map_err(|e| {
                        OciError::Config(format!("the registry CA bundle {}: {}", file.display(), chain(&e)))
                    })?);
                }
                ca.push(Certificate { encoding: CertificateEncoding::Pem, data: pem });
            }
        }
        Ok(Registries { cfg, ca, roots, clients: Mutex::new(HashMap::new()) })
    }

    /// Whose proofs `src`'s requests would give (see [`Scope`]); contacts nothing.
    pub fn scope(&self, src: &Source) -> Scope {
        Scope { host: host_of(src), repository: src.repository.clone(), credentials: src.credentials.fingerprint() }
    }

    /// The endpoint for `src`: its mirror if it has one, plain HTTP only if allowed.
    pub fn endpoint(&self, src: &Source) -> Result<Endpoint, OciError> {
        let host = host_of(src);
        if host.is_empty() || host.contains('/') || host.contains('@') {
            return Err(OciError::Config(format!("{host:?} is not a registry host (host or host:port)")));
        }
        if src.repository.is_empty() || src.reference.is_empty() {
            return Err(OciError::Config(format!(
                "registry {host}: the repository and the tag or digest must not be empty"
            )));
        }
        if src.insecure && !self.cfg.insecure.contains(&host) {
            return Err(OciError::InsecureRefused { registry: host });
        }
        let shown = display(src);
        let scope = self.scope(src);
        let key = (host.clone(), src.registry.to_ascii_lowercase(), src.insecure, scope.credentials);
        let wire = {
            let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
            match clients.get(&key) {
                Some(c) => c.clone(),
                None => {
                    if clients.len() >= MAX_CLIENTS {
                        clients.clear();
                    }
                    let c = Arc::new(self.wire(src, &host)?);
                    clients.insert(key, c.clone());
                    c
                }
            }
        };
        let repository = if contacted(&host) == "registry-1.docker.io" && !src.repository.contains('/') {
            format!("library/{}", src.repository)
        } else {
            src.repository.clone()
        };
        Ok(Endpoint {
            wire,
            repository,
            reference: src.reference.clone(),
            platform: src.platform.clone(),
            scope,
            ctx: Ctx { registry: host, reference: shown, given: src.credentials.given() },
        })
    }

    /// The pull client of `host` for `src`: its places (the host as contacted, the hosts the
    /// node lists for the registry and for the host contacted), TLS and proxy.
    fn wire(&self, src: &Source, host: &str) -> Result<Wire, OciError> {
        let https = !src.insecure;
        let scheme = if https { "https" } else { "http" };
        let base = reqwest::Url::parse(&format!("{scheme}://{}/", contacted(host)))
            .map_err(|_| OciError::Config(format!("{host:?} is not a registry host (host or host:port)")))?;
        let origin = Origin::of(&base)
            .ok_or_else(|| OciError::Config(format!("{host:?} is not a registry host (host or host:port)")))?;
        let mut listed = Vec::new();
        for key in [src.registry.to_ascii_lowercase(), host.to_string()] {
            for h in self.cfg.endpoints_for(&key) {
                if let Some(l) = Listed::parse(&h) {
                    listed.push(l);
                }
            }
        }
        let places =
            Places { origin, registry: src.registry.to_ascii_lowercase(), listed, insecure: self.cfg.insecure.clone() };
        Wire::new(Settings {
            base,
            places,
            credentials: src.credentials.clone(),
            ca: &self.roots,
            proxy: self.cfg.proxy.as_deref(),
            stall: self.cfg.stall,
        })
    }

    /// The node's registry settings.
    pub fn config(&self) -> &RegistryConfig {
        &self.cfg
    }

    /// A client for `host` (plain HTTP when `http`), under the node's TLS and proxy settings;
    /// `monolithic`: blobs are pushed in one `PUT` after the `POST` that opens the upload.
    pub fn client(&self, host: &str, http: bool, monolithic: bool) -> Result<Client, OciError> {
        let config = ClientConfig {
            use_monolithic_push: monolithic,
            protocol: if http { ClientProtocol::HttpsExcept(vec![host.to_string()]) } else { ClientProtocol::Https },
            extra_root_certificates: self.ca.clone(),
            platform_resolver: None,
            connect_timeout: Some(Duration::from_secs(30)),
            read_timeout: Some(Duration::from_secs(60)),
            user_agent: concat!("mounthost/", env!("CARGO_PKG_VERSION")),
            https_proxy: self.cfg.proxy.clone(),
            http_proxy: self.cfg.proxy.clone(),
            ..ClientConfig::default()
        };
        // `Client::new` would fall back to a default client on a bad configuration: refuse instead.
        // The proxy URL may carry a password: the error's text is redacted.
        Client::try_from(config).map_err(|e| {
            OciError::Config(format!(
                "building the client for registry {host} (check the proxy URL and the CA bundle): {}",
                chain(&e)
            ))
        })
    }
}

/// The bundles `--registry-ca` names: the file itself, or a directory's `*.crt` and `*.pem`
/// files in name order (hidden entries skipped, such as a mounted ConfigMap's `..data`; links
/// followed, as a ConfigMap's keys are). A directory without any adds no CA: an empty ConfigMap
/// mounted there is "no extra CA", while a named file that holds none stays an error.
fn ca_files(path: &std::path::Path) -> Result<Vec<std::path::PathBuf>, OciError> {
    let meta = std::fs::metadata(path)
        .map_err(|e| OciError::Config(format!("reading the registry CA bundle {}: {e}", path.display())))?;
    if !meta.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let entries = std::fs::read_dir(path)
        .map_err(|e| OciError::Config(format!("listing the registry CA directory {}: {e}", path.display())))?;
    let mut files: Vec<std::path::PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            !name.starts_with('.') && (name.ends_with(".crt") || name.ends_with(".pem")) && p.is_file()
        })
        .collect();
    files.sort();
    Ok(files)
}

/// The host contacted for `src`: its mirror's when it has one, lower case.
pub(super) fn host_of(src: &Source) -> String {
    src.mirror.as_deref().unwrap_or(&src.registry).trim().to_ascii_lowercase()
}

/// `registry/repository:tag` or `registry/repository@sha256:…`, plus the mirror.
fn display(src: &Source) -> String {
    let sep = if src.reference.starts_with("sha256:") { '@' } else { ':' };
    let mut s = format!("{}/{}{sep}{}", src.registry, src.repository, src.reference);
    if let Some(m) = &src.mirror {
        s.push_str(&format!(" (through mirror {m})"));
    }
    s
}

/// The host a pull contacts for `host`: Docker Hub's registry for `docker.io`.
fn contacted(host: &str) -> &str {
    match host {
        "docker.io" | "index.docker.io" => "registry-1.docker.io",
        other => other,
    }
}

const ACCEPT: &[&str] =
    &[OCI_IMAGE_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE, IMAGE_MANIFEST_LIST_MEDIA_TYPE];

impl Endpoint {
    fn protocol(&self, detail: impl Into<String>) -> OciError {
        OciError::Protocol {
            registry: self.ctx.registry.clone(),
            reference: self.ctx.reference.clone(),
            detail: detail.into(),
        }
    }

    /// The stall window of this source's replies.
    pub fn stall(&self) -> std::time::Duration {
        self.wire.stall
    }

    fn call<'a>(&'a self, what: What<'a>, reply: &'a str) -> Call<'a> {
        Call { ctx: &self.ctx, repository: &self.repository, what, reply }
    }

    /// The manifest the reference names (an index: the manifest of the platform asked for, else the node's; plan/platform.rs) and its config.
    pub async fn resolve(&self) -> Result<Resolved, OciError> {
        let (body, digest) = self.manifest(&self.reference).await?;
        let doc: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| self.protocol(format!("the manifest is not JSON: {e}")))?;
        let (body, digest, doc) = if is_index(&doc) {
            let want = self.platform.clone().unwrap_or_else(Platform::node);
            let first = crate::plan::platform::choose(&doc, &want).map_err(|detail| OciError::NoPlatform {
                registry: self.ctx.registry.clone(),
                reference: self.ctx.reference.clone(),
                detail,
            })?;
            super::store::hex_of(first)?;
            let (body, digest) = self.manifest(first).await?;
            let doc: serde_json::Value = serde_json::from_slice(&body)
                .map_err(|e| self.protocol(format!("manifest {first} is not JSON: {e}")))?;
            if is_index(&doc) {
                return Err(self.protocol(format!("{first}, the entry chosen of the index, is an index itself")));
            }
            (body, digest, doc)
        } else {
            (body, digest, doc)
        };
        if doc.get("schemaVersion").and_then(|v| v.as_u64()) != Some(2) {
            return Err(self.protocol("the manifest is not schema version 2"));
        }
        let config = doc.get("config").ok_or_else(|| self.protocol("the manifest has no config"))?;
        let config_digest = config
            .get("digest")
            .and_then(|d| d.as_str())
            .ok_or_else(|| self.protocol("the manifest's config has no digest"))?;
        let config_size = config
            .get("size")
            .and_then(|d| d.as_u64())
            .ok_or_else(|| self.protocol("the manifest's config has no size"))?;
        if config_size > MAX_CONFIG_BYTES {
            return Err(self.protocol(format!(
                "the config is {config_size} bytes; mounthost reads configs of at most {MAX_CONFIG_BYTES}"
            )));
        }
        let config = self.small_blob(config_digest, config_size).await?;
        let manifest = String::from_utf8(body).map_err(|_| self.protocol("the manifest is not UTF-8"))?;
        let config = String::from_utf8(config).map_err(|_| self.protocol("the config is not UTF-8 text"))?;
        Ok(Resolved { manifest_digest: digest, manifest, config })
    }

    /// The manifest `reference` (a tag or a digest) names, read under [`MAX_MANIFEST_BYTES`],
    /// and its digest (computed here; a digest reference must match it).
    async fn manifest(&self, reference: &str) -> Result<(Vec<u8>, String), OciError> {
        let path = format!("/v2/{}/manifests/{reference}", self.repository);
        let call = self.call(What::Manifest, "the manifest");
        let body = self.wire.get_capped(&call, &path, &[], &ACCEPT.join(", "), MAX_MANIFEST_BYTES).await?;
        let digest = format!("sha256:{}", hex::encode(sha2::Sha256::digest(&body)));
        if reference.starts_with("sha256:") && reference != digest {
            return Err(OciError::DigestMismatch {
                registry: self.ctx.registry.clone(),
                reference: self.ctx.reference.clone(),
                digest: reference.to_string(),
                actual: digest,
            });
        }
        Ok((body, digest))
    }

    /// A small blob (a config), read whole and verified against `size` and `digest`. Memory
    /// grows with what arrives, never more than `size`.
    pub async fn small_blob(&self, digest: &str, size: u64) -> Result<Vec<u8>, OciError> {
        let mut out = Vec::with_capacity(size.min(1 << 20) as usize);
        let received = self
            .verified(digest, size, |chunk| {
                out.extend_from_slice(chunk);
                Ok(())
            })
            .await;
        match received {
            Ok(()) => Ok(out),
            Err(Sink::Registry(e)) => Err(e),
            Err(Sink::Local(e)) => {
                Err(OciError::local(std::path::Path::new("memory"), &e, &self.ctx.reference, digest))
            }
        }
    }

    /// The blob `digest` of `size` bytes streamed into `store` (a temporary file, hashed as it
    /// arrives, renamed into place once verified): memory holds one chunk at a time, whatever
    /// size the registry claims.
    pub async fn blob_to_store(&self, store: &super::store::Store, digest: &str, size: u64) -> Result<(), OciError> {
        use std::io::Write as _;
        let hex = super::store::hex_of(digest)?;
        if store.present(hex, size) {
            return Ok(());
        }
        let local = |e: std::io::Error, p: &std::path::Path| OciError::local(p, &e, &self.ctx.reference, digest);
        let (file, tmp) = store.begin_put(hex).map_err(|e| local(e, &store.blob(hex)))?;
        // Removed however this ends before the rename (an error, or the future dropped).
        struct Tmp<'a>(&'a std::path::Path);
        impl Drop for Tmp<'_> {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(self.0);
            }
        }
        let _tmp = Tmp(&tmp);
        let mut out = std::io::BufWriter::new(file);
        self.verified(digest, size, |chunk| out.write_all(chunk)).await.map_err(|e| match e {
            Sink::Registry(e) => e,
            Sink::Local(e) => local(e, &tmp),
        })?;
        let file = out.into_inner().map_err(|e| local(e.into_error(), &tmp))?;
        store.finish_put(file, &tmp, hex).map_err(|e| local(e, &store.blob(hex)))
    }

    /// Receive the blob `digest`, handing each piece to `sink`, under the stall rule, checked
    /// against `size` as it arrives and against `digest` at its end.
    async fn verified(
        &self,
        digest: &str,
        size: u64,
        mut sink: impl FnMut(&[u8]) -> std::io::Result<()>,
    ) -> Result<(), Sink> {
        let hex = super::store::hex_of(digest)?;
        let mut body = self.range(digest, 0, None).await?;
        let mut hash = sha2::Sha256::new();
        let mut got = 0u64;
        let mut window = Window::new(self.wire.stall);
        while let Some(chunk) = window.next(&mut body.stream, &self.ctx, digest).await? {
            let chunk = chunk.map_err(|e| OciError::Unreachable {
                registry: self.ctx.registry.clone(),
                reference: self.ctx.reference.clone(),
                detail: format!("reading {digest}: {}", chain(&e)),
            })?;
            got += chunk.len() as u64;
            if got > size {
                return Err(self
                    .size_mismatch(digest, format!("it is larger than the {size} bytes the manifest says"))
                    .into());
            }
            hash.update(&chunk);
            sink(&chunk).map_err(Sink::Local)?;
            if !window.got(chunk.len() as u64) {
                return Err(window.stalled(&self.ctx, digest).into());
            }
        }
        if got < size {
            return Err(self
                .size_mismatch(digest, format!("it is smaller than the {size} bytes the manifest says"))
                .into());
        }
        let actual = hex::encode(hash.finalize());
        if actual != hex {
            return Err(OciError::DigestMismatch {
                registry: self.ctx.registry.clone(),
                reference: self.ctx.reference.clone(),
                digest: digest.to_string(),
                actual: format!("sha256:{actual}"),
            }
            .into());
        }
        Ok(())
    }

    /// The digests of the manifests that refer to `subject` (a manifest digest of this
    /// repository) with artifact type `artifact_type`: the OCI 1.1 referrers API, or, on a
    /// registry without it, the referrers tag schema (`sha256-<hex>`, an index). None: empty.
    pub async fn referrers(&self, subject: &str, artifact_type: &str) -> Result<Vec<String>, OciError> {
        let path = format!("/v2/{}/referrers/{subject}", self.repository);
        let call = self.call(What::Manifest, "the referrers list");
        let index = match self
            .wire
            .get_capped(
                &call,
                &path,
                &[("artifactType", artifact_type)],
                OCI_IMAGE_INDEX_MEDIA_TYPE,
                MAX_MANIFEST_BYTES,
            )
            .await
        {
            Ok(body) => body,
            Err(OciError::ManifestNotFound { .. }) => {
                let tag = subject.replacen(':', "-", 1);
                let path = format!("/v2/{}/manifests/{tag}", self.repository);
                match self.wire.get_capped(&call, &path, &[], OCI_IMAGE_INDEX_MEDIA_TYPE, MAX_MANIFEST_BYTES).await {
                    Ok(body) => body,
                    Err(OciError::ManifestNotFound { .. }) => return Ok(Vec::new()),
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
        let doc: serde_json::Value = serde_json::from_slice(&index)
            .map_err(|e| self.protocol(format!("the referrers list is not JSON: {e}")))?;
        Ok(doc
            .get("manifests")
            .and_then(|m| m.as_array())
            .map(|m| m.as_slice())
            .unwrap_or_default()
            .iter()
            .filter(|m| m.get("artifactType").and_then(|a| a.as_str()) == Some(artifact_type))
            .filter_map(|m| m.get("digest").and_then(|d| d.as_str()))
            .filter(|d| super::store::hex_of(d).is_ok())
            .map(str::to_string)
            .collect())
    }

    /// The manifest `digest` (`sha256:<64 hex>`) of this repository, as JSON, checked against
    /// its digest.
    pub async fn manifest_by_digest(&self, digest: &str) -> Result<serde_json::Value, OciError> {
        super::store::hex_of(digest)?;
        let (body, _) = self.manifest(digest).await?;
        serde_json::from_slice(&body).map_err(|e| self.protocol(format!("manifest {digest} is not JSON: {e}")))
    }

    pub fn size_mismatch(&self, digest: &str, detail: String) -> OciError {
        OciError::SizeMismatch {
            registry: self.ctx.registry.clone(),
            reference: self.ctx.reference.clone(),
            digest: digest.to_string(),
            detail,
        }
    }

    /// Open `len` bytes (or the rest) of the blob `digest` from `start`. Nothing is verified
    /// here: the caller hashes what it writes.
    pub async fn range(&self, digest: &str, start: u64, len: Option<u64>) -> Result<Body, OciError> {
        let path = format!("/v2/{}/blobs/{digest}", self.repository);
        let call = self.call(What::Blob(digest), "the blob");
        let resp = self.wire.range(&call, &path, start, len).await.map_err(|e| match e {
            OciError::Registry { status: Some(416), .. } => self.size_mismatch(
                digest,
                format!("the registry has no byte {start} of it (HTTP 416): it is smaller than the manifest says"),
            ),
            other => other,
        })?;
        let full = resp.status() != StatusCode::PARTIAL_CONTENT;
        Ok(Body { stream: Box::pin(resp.bytes_stream()), full })
    }
}

/// Why [`Endpoint::verified`] stopped: the registry, or the sink's own write.
enum Sink {
    Registry(OciError),
    Local(std::io::Error),
}

impl From<OciError> for Sink {
    fn from(e: OciError) -> Sink {
        Sink::Registry(e)
    }
}

fn is_index(doc: &serde_json::Value) -> bool {
    match doc.get("mediaType").and_then(|m| m.as_str()) {
        Some(m) => m == OCI_IMAGE_INDEX_MEDIA_TYPE || m == IMAGE_MANIFEST_LIST_MEDIA_TYPE,
        None => doc.get("manifests").is_some() && doc.get("layers").is_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(registry: &str, repository: &str) -> Source {
        Source {
            registry: registry.into(),
            repository: repository.into(),
            reference: "latest".into(),
            mirror: None,
            credentials: Default::default(),
            insecure: false,
            platform: None,
        }
    }

    #[tokio::test]
    async fn docker_hub_is_asked_at_its_registry_and_its_library() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let r = Registries::new(RegistryConfig::default()).unwrap();
        let ep = r.endpoint(&source("docker.io", "ubuntu")).unwrap();
        assert_eq!(ep.repository, "library/ubuntu");
        assert_eq!(ep.ctx.registry, "docker.io");
        let ep = r.endpoint(&source("docker.io", "bitnami/redis")).unwrap();
        assert_eq!(ep.repository, "bitnami/redis");
        let ep = r.endpoint(&source("ghcr.io", "ubuntu")).unwrap();
        assert_eq!(ep.repository, "ubuntu");
        assert_eq!(contacted("docker.io"), "registry-1.docker.io");
        assert_eq!(contacted("ghcr.io"), "ghcr.io");
        // Its token service's host is listed for it out of the box.
        assert_eq!(RegistryConfig::default().endpoints_for("docker.io"), vec!["auth.docker.io".to_string()]);
    }
}
