//! Publishing a plugin as an OCI artifact (`mounthost plugin push FILE REF`), with the same
//! client, TLS, proxy and plain-HTTP rules the node pulls with.
//!
//! The artifact follows the OCI image spec 1.1's guidance for artifacts: an image manifest with
//! `artifactType` [`ARTIFACT_TYPE`], the empty config (`application/vnd.oci.empty.v1+json`,
//! the two bytes `{}`), and one layer of [`LAYER_MEDIA_TYPE`] holding the `.wasm` as is, so the
//! layer digest is the component's own digest (the one volumes record and `pluginDigest` pins).
//! Blobs go up with the distribution API's monolithic upload (`POST /v2/<name>/blobs/uploads/`,
//! then one `PUT <location>?digest=`), each skipped when a `HEAD` finds it there, then the
//! manifest is `PUT` under the tag (or, without one, under its own digest).

use std::collections::BTreeMap;

use oci_client::Reference;
use oci_client::manifest::OCI_IMAGE_MEDIA_TYPE;

use super::error::{Ctx, OciError, What};
use super::registry::Registries;
use super::{Credentials, RegistryConfig};
use crate::plan::oci_ref::OciRef;
use crate::plugin::pulled::{ARTIFACT_TYPE, EMPTY_CONFIG_MEDIA_TYPE, LAYER_MEDIA_TYPE, SCHEME};

/// The empty config's content.
const EMPTY_CONFIG: &[u8] = b"{}";

/// A plugin published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushedPlugin {
    /// `sha256:…` of the manifest.
    pub manifest_digest: String,
    /// `sha256:…` of the layer: the component's digest.
    pub layer_digest: String,
    /// The layer's size in bytes.
    pub size: u64,
    /// What a StorageClass names: `oci://registry/repository@<manifest digest>`.
    pub reference: String,
}

fn sha256(bytes: &[u8]) -> String {
    crate::plugin::Digest::of(bytes).to_string()
}

/// The manifest of a plugin whose layer is `layer_digest` (`size` bytes); `annotations` go on
/// the manifest, `title` on the layer (`org.opencontainers.image.title`).
pub fn plugin_manifest(layer_digest: &str, size: u64, title: &str, annotations: &BTreeMap<String, String>) -> Vec<u8> {
    let mut doc = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_IMAGE_MEDIA_TYPE,
        "artifactType": ARTIFACT_TYPE,
        "config": {"mediaType": EMPTY_CONFIG_MEDIA_TYPE, "digest": sha256(EMPTY_CONFIG), "size": EMPTY_CONFIG.len()},
        "layers": [{
            "mediaType": LAYER_MEDIA_TYPE,
            "digest": layer_digest,
            "size": size,
            "annotations": {"org.opencontainers.image.title": title},
        }],
    });
    if !annotations.is_empty() {
        doc["annotations"] = serde_json::json!(annotations);
    }
    serde_json::to_vec(&doc).expect("JSON values always serialize")
}

/// Push `wasm` to `target` (`registry/repository[:tag]`, no digest) and return its pinned
/// reference. `title` names the layer (the file's name). Errors are redacted as the cache's
/// are ([`OciError::redacted`]): no URL query, userinfo or secret-named value reaches them.
pub async fn push_plugin(
    cfg: RegistryConfig,
    target: &OciRef,
    credentials: &Credentials,
    wasm: Vec<u8>,
    title: &str,
    annotations: &BTreeMap<String, String>,
) -> Result<PushedPlugin, OciError> {
    push(cfg, target, credentials, wasm, title, annotations).await.map_err(OciError::redacted)
}

async fn push(
    cfg: RegistryConfig,
    target: &OciRef,
    credentials: &Credentials,
    wasm: Vec<u8>,
    title: &str,
    annotations: &BTreeMap<String, String>,
) -> Result<PushedPlugin, OciError> {
    if target.digest().is_some() {
        return Err(OciError::Config(format!(
            "{target}: push to a repository or a tag; the digest is the registry's answer, not an input"
        )));
    }
    // rustls needs one process-wide crypto provider (see `Artifacts::new`).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let host = target.registry().to_ascii_lowercase();
    let plain_http = cfg.insecure.contains(&host);
    let registries = Registries::new(cfg)?;
    let client = registries.client(&host, plain_http, true)?;
    let ctx = Ctx { registry: host.clone(), reference: target.to_string(), given: credentials.given() };
    let auth = credentials.to_registry_auth();
    client.store_auth_if_needed(&host, &auth).await;
    let repository = target.repository().to_string();
    let blobs_at = Reference::with_tag(host.clone(), repository.clone(), target.tag().unwrap_or("latest").to_string());
    let layer_digest = sha256(&wasm);
    let size = wasm.len() as u64;
    for (digest, bytes) in [(sha256(EMPTY_CONFIG), EMPTY_CONFIG.to_vec()), (layer_digest.clone(), wasm)] {
        let there = client.blob_exists(&blobs_at, &digest).await.map_err(|e| ctx.classify(&e, What::Blob(&digest)))?;
        if !there {
            client.push_blob(&blobs_at, bytes, &digest).await.map_err(|e| ctx.classify(&e, What::Blob(&digest)))?;
        }
    }
    let manifest = plugin_manifest(&layer_digest, size, title, annotations);
    let manifest_digest = sha256(&manifest);
    let manifest_at = match target.tag() {
        Some(tag) => Reference::with_tag(host.clone(), repository.clone(), tag.to_string()),
        None => Reference::with_digest(host.clone(), repository.clone(), manifest_digest.clone()),
    };
    client
        .push_manifest_raw(&manifest_at, manifest, OCI_IMAGE_MEDIA_TYPE.parse().expect("a valid header value"))
        .await
        .map_err(|e| ctx.classify(&e, What::Manifest))?;
    let reference = format!("{SCHEME}{}/{}@{manifest_digest}", target.registry(), target.repository());
    Ok(PushedPlugin { manifest_digest, layer_digest, size, reference })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_is_an_oci_1_1_artifact_with_the_empty_config() {
        let d = sha256(b"\0asm");
        let m = plugin_manifest(&d, 4, "p.wasm", &[("k".to_string(), "v".to_string())].into());
        let v: serde_json::Value = serde_json::from_slice(&m).unwrap();
        assert_eq!(v["artifactType"], ARTIFACT_TYPE);
        assert_eq!(v["config"]["digest"], "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a");
        assert_eq!(v["config"]["size"], 2);
        assert_eq!(v["layers"][0]["mediaType"], LAYER_MEDIA_TYPE);
        assert_eq!(v["layers"][0]["digest"], d.as_str());
        assert_eq!(v["annotations"]["k"], "v");
        let layer = super::super::plugin::plugin_layer(std::str::from_utf8(&m).unwrap()).unwrap();
        assert_eq!(layer.digest, d, "what push writes, pull takes");
    }
}
