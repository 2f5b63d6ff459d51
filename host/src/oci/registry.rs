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
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use oci_client::client::{BlobResponse, Certificate, CertificateEncoding, ClientConfig, ClientProtocol, SizedStream};
use oci_client::manifest::{
    IMAGE_MANIFEST_LIST_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE,
};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use sha2::Digest as _;

use super::error::{Ctx, OciError, What, chain};
use super::{RegistryConfig, Resolved, Source};

/// The largest config blob [`Endpoint::resolve`] reads.
pub(super) const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Clients kept before the map is emptied (each holds a connection pool).
const MAX_CLIENTS: usize = 64;

/// The node's registry settings, and the clients made from them.
pub(super) struct Registries {
    cfg: RegistryConfig,
    ca: Vec<Certificate>,
    clients: Mutex<HashMap<ClientKey, Arc<Client>>>,
}

/// Host, plain HTTP or not, digest of the credentials.
type ClientKey = (String, bool, [u8; 32]);

/// Who asks whom: the host contacted (the mirror when there is one), the repository and a
/// sha256 of the credentials (never the credentials). What [`Endpoint::check_blob`] proves is
/// remembered per scope and digest.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Scope {
    pub host: String,
    pub repository: String,
    pub credentials: [u8; 32],
}

/// One source, ready to be talked to.
pub(super) struct Endpoint {
    client: Arc<Client>,
    /// The reference as the contacted host sees it (the mirror's host when there is one).
    reference: Reference,
    auth: RegistryAuth,
    pub ctx: Ctx,
    pub scope: Scope,
}

/// A blob range being received.
pub(super) struct Body {
    pub stream: SizedStream,
    /// The registry ignored the range and sends the whole blob from byte 0.
    pub full: bool,
}

impl Registries {
    /// Read the CA bundle (a file, or every `*.crt` and `*.pem` file of a directory); nothing is
    /// contacted yet.
    pub fn new(cfg: RegistryConfig) -> Result<Registries, OciError> {
        let mut ca = Vec::new();
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
                ca.push(Certificate { encoding: CertificateEncoding::Pem, data: pem });
            }
        }
        Ok(Registries { cfg, ca, clients: Mutex::new(HashMap::new()) })
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
        let key = (host.clone(), src.insecure, scope.credentials);
        let client = {
            let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
            match clients.get(&key) {
                Some(c) => c.clone(),
                None => {
                    if clients.len() >= MAX_CLIENTS {
                        clients.clear();
                    }
                    let c = Arc::new(self.client(&host, src.insecure, false)?);
                    clients.insert(key, c.clone());
                    c
                }
            }
        };
        let reference = if src.reference.starts_with("sha256:") {
            Reference::with_digest(host.clone(), src.repository.clone(), src.reference.clone())
        } else {
            Reference::with_tag(host.clone(), src.repository.clone(), src.reference.clone())
        };
        Ok(Endpoint {
            client,
            reference,
            auth: src.credentials.to_registry_auth(),
            scope,
            ctx: Ctx { registry: host, reference: shown, given: src.credentials.given() },
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

    /// The manifest the reference names (an index: its first manifest) and its config.
    pub async fn resolve(&self) -> Result<Resolved, OciError> {
        let (body, digest) = self.manifest(&self.reference).await?;
        let doc: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| self.protocol(format!("the manifest is not JSON: {e}")))?;
        let (body, digest, doc) = if is_index(&doc) {
            let first = doc
                .get("manifests")
                .and_then(|m| m.as_array())
                .and_then(|m| m.first())
                .and_then(|m| m.get("digest"))
                .and_then(|d| d.as_str())
                .ok_or_else(|| self.protocol("the image index lists no manifest"))?;
            let (body, digest) = self.manifest(&self.reference.clone_with_digest(first.to_string())).await?;
            let doc: serde_json::Value = serde_json::from_slice(&body)
                .map_err(|e| self.protocol(format!("manifest {first} is not JSON: {e}")))?;
            if is_index(&doc) {
                return Err(self.protocol(format!("{first}, the first entry of the index, is an index itself")));
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

    async fn manifest(&self, reference: &Reference) -> Result<(Vec<u8>, String), OciError> {
        self.client
            .pull_manifest_raw(reference, &self.auth, ACCEPT)
            .await
            .map(|(body, digest)| (body.to_vec(), digest))
            .map_err(|e| self.ctx.classify(&e, What::Manifest))
    }

    /// A small blob (a config, a chunk index), read whole and verified against `size` and
    /// `digest`.
    pub async fn small_blob(&self, digest: &str, size: u64) -> Result<Vec<u8>, OciError> {
        let hex = super::store::hex_of(digest)?;
        let mut body = self.range(digest, 0, None).await?;
        let mut out = Vec::with_capacity(size as usize);
        while let Some(chunk) = body.stream.next().await {
            let chunk = chunk.map_err(|e| OciError::Unreachable {
                registry: self.ctx.registry.clone(),
                reference: self.ctx.reference.clone(),
                detail: format!("reading the config: {}", chain(&e)),
            })?;
            if out.len() as u64 + chunk.len() as u64 > size {
                return Err(
                    self.size_mismatch(digest, format!("the config is larger than the {size} bytes the manifest says"))
                );
            }
            out.extend_from_slice(&chunk);
        }
        if (out.len() as u64) < size {
            return Err(
                self.size_mismatch(digest, format!("the config is smaller than the {size} bytes the manifest says"))
            );
        }
        let actual = hex::encode(sha2::Sha256::digest(&out));
        if actual != hex {
            return Err(OciError::DigestMismatch {
                registry: self.ctx.registry.clone(),
                reference: self.ctx.reference.clone(),
                digest: digest.to_string(),
                actual: format!("sha256:{actual}"),
            });
        }
        Ok(out)
    }

    /// The digests of the manifests that refer to `subject` (a manifest digest of this
    /// repository) with artifact type `artifact_type`: the OCI 1.1 referrers API, or, on a
    /// registry without it, the referrers tag schema (`sha256-<hex>`, an index). None: empty.
    pub async fn referrers(&self, subject: &str, artifact_type: &str) -> Result<Vec<String>, OciError> {
        self.client.store_auth_if_needed(self.reference.resolve_registry(), &self.auth).await;
        let at = self.reference.clone_with_digest(subject.to_string());
        let index = self
            .client
            .pull_referrers(&at, Some(artifact_type))
            .await
            .map_err(|e| self.ctx.classify(&e, What::Manifest))?;
        Ok(index
            .manifests
            .iter()
            .filter(|m| m.artifact_type.as_deref() == Some(artifact_type))
            .map(|m| m.digest.clone())
            .collect())
    }

    /// The manifest `digest` of this repository, as JSON, checked against its digest.
    pub async fn manifest_by_digest(&self, digest: &str) -> Result<serde_json::Value, OciError> {
        let (body, got) = self.manifest(&self.reference.clone_with_digest(digest.to_string())).await?;
        if got != digest {
            return Err(OciError::DigestMismatch {
                registry: self.ctx.registry.clone(),
                reference: self.ctx.reference.clone(),
                digest: digest.to_string(),
                actual: got,
            });
        }
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

    /// Prove that this source may read the blob `digest`: a `HEAD` of it with this source's
    /// credentials (oci-client's `blob_exists`). 401/403: the auth errors; 404: not found.
    pub async fn check_blob(&self, digest: &str) -> Result<(), OciError> {
        self.client.store_auth_if_needed(self.reference.resolve_registry(), &self.auth).await;
        match self.client.blob_exists(&self.reference, digest).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(OciError::BlobNotFound {
                registry: self.ctx.registry.clone(),
                reference: self.ctx.reference.clone(),
                digest: digest.to_string(),
            }),
            Err(e) => Err(self.ctx.classify(&e, What::Blob(digest))),
        }
    }

    /// Open `len` bytes (or the rest) of the blob `digest` from `start`. Nothing is verified
    /// here: the caller hashes what it writes.
    pub async fn range(&self, digest: &str, start: u64, len: Option<u64>) -> Result<Body, OciError> {
        self.client.store_auth_if_needed(self.reference.resolve_registry(), &self.auth).await;
        let response =
            self.client.pull_blob_stream_partial(&self.reference, digest, start, len).await.map_err(|e| match self
                .ctx
                .classify(&e, What::Blob(digest))
            {
                OciError::Registry { status: Some(416), .. } => self.size_mismatch(
                    digest,
                    format!("the registry has no byte {start} of it (HTTP 416): it is smaller than the manifest says"),
                ),
                other => other,
            })?;
        Ok(match response {
            BlobResponse::Full(stream) => Body { stream, full: true },
            BlobResponse::Partial(stream) => Body { stream, full: false },
        })
    }
}

fn is_index(doc: &serde_json::Value) -> bool {
    match doc.get("mediaType").and_then(|m| m.as_str()) {
        Some(m) => m == OCI_IMAGE_INDEX_MEDIA_TYPE || m == IMAGE_MANIFEST_LIST_MEDIA_TYPE,
        None => doc.get("manifests").is_some() && doc.get("layers").is_none(),
    }
}
