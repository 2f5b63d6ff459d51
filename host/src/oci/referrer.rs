//! OCI 1.1 referrers: an artifact pushed next to a model's manifest, naming it as its
//! `subject`, so whoever pulls the model can find it. Two kinds are attached here: chunk
//! indexes ([`super::index`]) and Sigstore bundles signing the model or its index
//! ([`push_signature`], `mounthost model sign`).
//!
//! [`Subject::attach`] follows the distribution spec 1.1 ("Pushing Manifests with Subject"):
//! the blobs (the empty config and the artifact's layers) go up unless a `HEAD` finds them,
//! the manifest is `PUT` under its own digest, then the referrers tag schema's index is
//! updated: the tag `sha256-<hex>` of the subject, an image index whose entries carry each
//! referrer's `artifactType` and `annotations` as the referrers API's reply does. "If the tag
//! returns a 404, the client MUST begin with an empty image index"; a tag holding anything but
//! an image index is reported, never overwritten. Registries without the referrers API (CNCF
//! distribution 2.8) serve that tag; those with it answer the API and keep the tag as any
//! other. The read-modify-write of the tag is not atomic: two publishers attaching to one
//! manifest at the same moment can lose one entry (the manifest itself stays, and attaching it
//! again restores the entry).
//!
//! A signature is attached as cosign's new bundle format attaches one: artifactType and layer
//! media type [`BUNDLE_MEDIA_TYPE`], the empty config, annotations
//! `dev.sigstore.bundle.content` = `dsse-envelope` and [`PREDICATE_ANNOTATION`] = the
//! statement's predicate type. Nothing here verifies a bundle (the node does, against its own
//! trust); [`SignatureBundle::parse`] only refuses what is no DSSE Sigstore bundle at all.

use std::collections::BTreeMap;

use base64::Engine as _;
use oci_client::Reference;
use oci_client::manifest::{OCI_IMAGE_INDEX_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE};
use sha2::Digest as _;

use super::error::{Ctx, OciError, What};
use super::registry::{Endpoint, Registries};
use super::signing::{BUNDLE_MEDIA_TYPE, MAX_BUNDLE_BYTES};
use super::{Credentials, RegistryConfig, Resolved, Source};
use crate::plan::oci_ref::OciRef;

/// The empty config of OCI 1.1 artifacts.
const EMPTY_CONFIG: &[u8] = b"{}";
const EMPTY_CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";
/// The annotation of a bundle's referrer naming the predicate type of its statement.
pub const PREDICATE_ANNOTATION: &str = "dev.sigstore.bundle.predicateType";
/// The annotation of a bundle's referrer naming what it signs (cosign's bundle format).
const CONTENT_ANNOTATION: &str = "dev.sigstore.bundle.content";

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

/// A manifest in its registry, resolved, and what reaches it: what artifacts are attached to.
pub(super) struct Subject {
    registries: Registries,
    /// The endpoint the manifest was resolved through (its blobs are read through it too).
    pub endpoint: Endpoint,
    /// The manifest (for an index: the one of the node's platform, as volumes resolve it).
    pub resolved: Resolved,
    /// The manifest's JSON.
    pub manifest: serde_json::Value,
    /// `host[:port]` of the registry, lowercase.
    pub host: String,
    plain_http: bool,
    repository: String,
    /// The reference as the user wrote it, for errors.
    shown: String,
    credentials: Credentials,
}

/// An artifact to attach to a [`Subject`].
pub(super) struct Artifact<'a> {
    /// The manifest's `artifactType`.
    pub artifact_type: &'a str,
    /// Its layers: media type and bytes.
    pub layers: &'a [(&'a str, &'a [u8])],
    /// The manifest's annotations (repeated in the referrers index entry).
    pub annotations: BTreeMap<String, String>,
}

/// What [`Subject::attach`] pushed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Attached {
    /// The artifact's manifest.
    pub manifest_digest: String,
    /// Its layers' digests, in order.
    pub layers: Vec<String>,
}

impl Subject {
    /// Resolve `target` (a tag or a digest; an index resolves to the node's platform's manifest) under the
    /// node's registry settings; plain HTTP when they list its host as insecure.
    pub async fn resolve(cfg: RegistryConfig, target: &OciRef, credentials: &Credentials) -> Result<Subject, OciError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let host = target.registry().to_ascii_lowercase();
        let plain_http = cfg.insecure.contains(&host);
        let registries = Registries::new(cfg)?;
        let src = Source {
            registry: target.registry().to_string(),
            repository: target.repository().to_string(),
            reference: target.digest().or(target.tag()).unwrap_or("latest").to_string(),
            mirror: None,
            credentials: credentials.clone(),
            insecure: plain_http,
            platform: None,
        };
        let endpoint = registries.endpoint(&src)?;
        let resolved = endpoint.resolve().await?;
        let manifest = serde_json::from_str(&resolved.manifest).map_err(|e| OciError::Protocol {
            registry: host.clone(),
            reference: target.to_string(),
            detail: format!("the manifest is not JSON: {e}"),
        })?;
        Ok(Subject {
            registries,
            endpoint,
            resolved,
            manifest,
            host,
            plain_http,
            repository: target.repository().to_string(),
            shown: target.to_string(),
            credentials: credentials.clone(),
        })
    }

    /// Attach `artifact` as a referrer of this manifest: its blobs pushed unless there, its
    /// manifest pushed under its digest, and the referrers tag schema's index updated (the
    /// other entries kept, an entry of the same digest replaced). Pushing the same artifact
    /// again changes nothing.
    pub async fn attach(&self, artifact: &Artifact<'_>) -> Result<Attached, OciError> {
        let host = &self.host;
        let client = self.registries.client(host, self.plain_http, true)?;
        let ctx = Ctx { registry: host.clone(), reference: self.shown.clone(), given: self.credentials.given() };
        let auth = self.credentials.to_registry_auth();
        client.store_auth_if_needed(host, &auth).await;
        let subject_digest = &self.resolved.manifest_digest;
        let at = Reference::with_digest(host.clone(), self.repository.clone(), subject_digest.clone());
        let layers: Vec<(String, &[u8])> = artifact.layers.iter().map(|(_, b)| (sha256(b), *b)).collect();
        for (digest, bytes) in std::iter::once((sha256(EMPTY_CONFIG), EMPTY_CONFIG)).chain(layers.iter().cloned()) {
            let there = client.blob_exists(&at, &digest).await.map_err(|e| ctx.classify(&e, What::Blob(&digest)))?;
            if !there {
                client
                    .push_blob(&at, bytes.to_vec(), &digest)
                    .await
                    .map_err(|e| ctx.classify(&e, What::Blob(&digest)))?;
            }
        }
        let media_type = self.manifest.get("mediaType").and_then(|m| m.as_str()).unwrap_or(OCI_IMAGE_MEDIA_TYPE);
        let mut doc = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_IMAGE_MEDIA_TYPE,
            "artifactType": artifact.artifact_type,
            "config": {"mediaType": EMPTY_CONFIG_MEDIA_TYPE, "digest": sha256(EMPTY_CONFIG), "size": EMPTY_CONFIG.len()},
            "layers": artifact.layers.iter().zip(&layers).map(|((layer_type, bytes), (digest, _))| {
                serde_json::json!({"mediaType": layer_type, "digest": digest, "size": bytes.len()})
            }).collect::<Vec<_>>(),
            "subject": {"mediaType": media_type, "digest": subject_digest, "size": self.resolved.manifest.len()},
        });
        if !artifact.annotations.is_empty() {
            doc["annotations"] = serde_json::json!(artifact.annotations);
        }
        let referrer = serde_json::to_vec(&doc).expect("JSON values always serialize");
        let manifest_digest = sha256(&referrer);
        client
            .push_manifest_raw(
                &Reference::with_digest(host.clone(), self.repository.clone(), manifest_digest.clone()),
                referrer.clone(),
                OCI_IMAGE_MEDIA_TYPE.parse().expect("a valid header value"),
            )
            .await
            .map_err(|e| ctx.classify(&e, What::Manifest))?;
        // The referrers tag schema: the subject's tag lists its referrers, for registries
        // without the referrers API (those with it answer the API, and the tag is an index like
        // any other). Read through the endpoint, so its size is capped as every manifest's is.
        let tag = subject_digest.replacen(':', "-", 1);
        let tag_ref = Reference::with_tag(host.clone(), self.repository.clone(), tag.clone());
        let current = match client.fetch_manifest_digest(&tag_ref, &auth).await {
            Ok(digest) => Some(self.endpoint.manifest_by_digest(&digest).await?),
            Err(e) => match ctx.classify(&e, What::Manifest) {
                OciError::ManifestNotFound { .. } => None,
                other => return Err(other),
            },
        };
        let mut entry = serde_json::json!({
            "mediaType": OCI_IMAGE_MEDIA_TYPE,
            "digest": manifest_digest,
            "size": referrer.len(),
            "artifactType": artifact.artifact_type,
        });
        if !artifact.annotations.is_empty() {
            entry["annotations"] = serde_json::json!(artifact.annotations);
        }
        let tag_index = referrers_index(current.as_ref(), entry).map_err(|detail| OciError::Protocol {
            registry: host.clone(),
            reference: self.shown.clone(),
            detail: format!("the tag {tag} (the referrers tag schema's): {detail}"),
        })?;
        client
            .push_manifest_raw(&tag_ref, tag_index, OCI_IMAGE_INDEX_MEDIA_TYPE.parse().expect("a valid header value"))
            .await
            .map_err(|e| ctx.classify(&e, What::Manifest))?;
        Ok(Attached { manifest_digest, layers: layers.into_iter().map(|(d, _)| d).collect() })
    }
}

/// The referrers tag schema's index: `current`'s entries (none without one) with `entry`
/// added, replacing one of the same digest. A `current` that is no image index is an error
/// (the spec: "the client SHOULD report a failure").
fn referrers_index(current: Option<&serde_json::Value>, entry: serde_json::Value) -> Result<Vec<u8>, String> {
    let mut list = match current {
        None => Vec::new(),
        Some(doc) => {
            let media_type = doc.get("mediaType").and_then(|m| m.as_str());
            match doc.get("manifests").and_then(|m| m.as_array()) {
                Some(list) if media_type.is_none_or(|m| m == OCI_IMAGE_INDEX_MEDIA_TYPE) => list.clone(),
                _ => {
                    return Err(format!(
                        "it holds a manifest of media type {}, not an image index; not overwritten",
                        media_type.unwrap_or("(none)")
                    ));
                }
            }
        }
    };
    list.retain(|m| m.get("digest") != entry.get("digest"));
    list.push(entry);
    Ok(serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_IMAGE_INDEX_MEDIA_TYPE,
        "manifests": list,
    }))
    .expect("JSON values always serialize"))
}

/// A Sigstore bundle (`model_signing sign ... --signature FILE`, or
/// [`super::signing::sign`]) to attach to a model: checked for shape only, never verified
/// here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignatureBundle {
    bytes: Vec<u8>,
    predicate_type: String,
}

impl SignatureBundle {
    /// `bytes` as a bundle: at most [`MAX_BUNDLE_BYTES`], JSON of `mediaType`
    /// [`BUNDLE_MEDIA_TYPE`], with a `dsseEnvelope` whose `payload` is base64 of an in-toto
    /// statement (JSON) naming its `predicateType`. Else why not.
    pub fn parse(bytes: Vec<u8>) -> Result<SignatureBundle, String> {
        if bytes.len() as u64 > MAX_BUNDLE_BYTES {
            return Err(format!("it is {} bytes; a bundle is at most {MAX_BUNDLE_BYTES}", bytes.len()));
        }
        let doc: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| format!("it is not JSON (a Sigstore bundle is): {e}"))?;
        match doc.get("mediaType").and_then(|m| m.as_str()) {
            Some(BUNDLE_MEDIA_TYPE) => {}
            Some(other) => {
                return Err(format!("its mediaType is {other:?}; a Sigstore bundle v0.3 has {BUNDLE_MEDIA_TYPE:?}"));
            }
            None => return Err(format!("it has no mediaType; a Sigstore bundle v0.3 has {BUNDLE_MEDIA_TYPE:?}")),
        }
        let Some(envelope) = doc.get("dsseEnvelope").filter(|e| e.is_object()) else {
            return Err("it has no dsseEnvelope (a model signature signs an in-toto statement in DSSE)".into());
        };
        let Some(payload) = envelope.get("payload").and_then(|p| p.as_str()) else {
            return Err("its dsseEnvelope has no payload".into());
        };
        let statement = base64::engine::general_purpose::STANDARD
            .decode(payload)
            .or_else(|_| base64::engine::general_purpose::URL_SAFE.decode(payload))
            .map_err(|e| format!("its DSSE payload is not base64: {e}"))?;
        let statement: serde_json::Value = serde_json::from_slice(&statement)
            .map_err(|e| format!("its DSSE payload is not JSON (an in-toto statement is): {e}"))?;
        let predicate_type = match statement.get("predicateType").and_then(|p| p.as_str()) {
            Some(p) if !p.is_empty() => p.to_string(),
            _ => return Err("its DSSE statement names no predicateType".into()),
        };
        Ok(SignatureBundle { bytes, predicate_type })
    }

    /// The `predicateType` of its statement.
    pub fn predicate_type(&self) -> &str {
        &self.predicate_type
    }

    /// The bundle as given.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// What [`push_signature`] attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushedSignature {
    /// The model's manifest (the bundle's subject).
    pub subject: String,
    /// The referrer's manifest.
    pub manifest_digest: String,
    /// The bundle's blob.
    pub bundle_digest: String,
    /// The predicate type of its statement (the referrer's [`PREDICATE_ANNOTATION`]).
    pub predicate_type: String,
}

/// Attach `bundle` as a referrer of `target`'s manifest (a tag or a digest; an index resolves
/// to the node's platform's manifest, as [`super::push_index`] resolves it). Errors are redacted as the
/// cache's are.
pub async fn push_signature(
    cfg: RegistryConfig,
    target: &OciRef,
    credentials: &Credentials,
    bundle: &SignatureBundle,
) -> Result<PushedSignature, OciError> {
    let pushed = async {
        let subject = Subject::resolve(cfg, target, credentials).await?;
        let annotations = BTreeMap::from([
            (CONTENT_ANNOTATION.to_string(), "dsse-envelope".to_string()),
            (PREDICATE_ANNOTATION.to_string(), bundle.predicate_type.clone()),
        ]);
        let layers = [(BUNDLE_MEDIA_TYPE, bundle.bytes.as_slice())];
        let artifact = Artifact { artifact_type: BUNDLE_MEDIA_TYPE, layers: &layers, annotations };
        let attached = subject.attach(&artifact).await?;
        Ok(PushedSignature {
            subject: subject.resolved.manifest_digest.clone(),
            manifest_digest: attached.manifest_digest,
            bundle_digest: attached.layers.into_iter().next().expect("one layer"),
            predicate_type: bundle.predicate_type.clone(),
        })
    };
    pushed.await.map_err(OciError::redacted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle(media_type: &str, payload: Option<&str>) -> Vec<u8> {
        let mut doc = serde_json::json!({"mediaType": media_type, "verificationMaterial": {}});
        if let Some(p) = payload {
            doc["dsseEnvelope"] = serde_json::json!({"payload": p, "payloadType": "application/vnd.in-toto+json"});
        }
        serde_json::to_vec(&doc).unwrap()
    }

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn a_bundle_names_its_predicate_type_and_anything_else_is_refused() {
        let statement = r#"{"_type":"https://in-toto.io/Statement/v1","predicateType":"https://x/v1"}"#;
        let ok = SignatureBundle::parse(bundle(BUNDLE_MEDIA_TYPE, Some(&b64(statement)))).unwrap();
        assert_eq!(ok.predicate_type(), "https://x/v1");
        let refused = |bytes: Vec<u8>, why: &str| {
            let e = SignatureBundle::parse(bytes).unwrap_err();
            assert!(e.contains(why), "{e:?} does not say {why:?}");
        };
        refused(b"not json".to_vec(), "not JSON");
        refused(vec![b' '; MAX_BUNDLE_BYTES as usize + 1], "at most");
        refused(bundle("application/vnd.dev.sigstore.bundle+json;version=0.2", Some(&b64(statement))), "mediaType");
        refused(b"{}".to_vec(), "no mediaType");
        refused(bundle(BUNDLE_MEDIA_TYPE, None), "no dsseEnvelope");
        refused(bundle(BUNDLE_MEDIA_TYPE, Some("%%%")), "not base64");
        refused(bundle(BUNDLE_MEDIA_TYPE, Some(&b64("{"))), "not JSON");
        refused(bundle(BUNDLE_MEDIA_TYPE, Some(&b64(r#"{"predicateType":""}"#))), "no predicateType");
    }

    #[test]
    fn the_referrers_index_keeps_other_entries_and_replaces_its_own() {
        let entry = |d: &str| serde_json::json!({"digest": d, "artifactType": "t"});
        let first: serde_json::Value = serde_json::from_slice(&referrers_index(None, entry("a")).unwrap()).unwrap();
        assert_eq!(first["mediaType"], OCI_IMAGE_INDEX_MEDIA_TYPE);
        let both: serde_json::Value =
            serde_json::from_slice(&referrers_index(Some(&first), entry("b")).unwrap()).unwrap();
        let again: serde_json::Value =
            serde_json::from_slice(&referrers_index(Some(&both), entry("a")).unwrap()).unwrap();
        let digests = |v: &serde_json::Value| {
            v["manifests"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["digest"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(digests(&again), vec!["b".to_string(), "a".to_string()]);
        let image = serde_json::json!({"mediaType": OCI_IMAGE_MEDIA_TYPE, "layers": []});
        assert!(referrers_index(Some(&image), entry("a")).unwrap_err().contains("not an image index"));
    }
}
