//! Chunk indexes (docs/lazy.md#per-chunk-verification): the sha256 of every chunk of every
//! layer of a model, published as an OCI 1.1 referrer of its manifest, so a lazy volume checks
//! each chunk before a reader gets its bytes instead of only the whole blob at its end.
//!
//! The artifact: an image manifest of `artifactType` [`INDEX_ARTIFACT_TYPE`] whose `subject` is
//! the model's manifest, the empty config, and one layer of [`INDEX_MEDIA_TYPE`] holding
//!
//! ```json
//! {"version": 1, "chunkSize": 4194304,
//!  "blobs": {"sha256:<layer>": {"size": 123, "chunks": ["<64 hex>", ...]}}}
//! ```
//!
//! [`push_index`] (`mounthost model index REF`) reads every layer once and attaches the index
//! as a referrer ([`super::referrer`]): the blobs, the manifest under its digest, and the
//! referrers tag schema's index (`sha256-<hex>` of the subject), which registries without the
//! referrers API serve and those with it ignore.
//! [`Artifacts::index_descriptor`] looks it up when a lazy volume is staged (the referrers API, else
//! the tag), keeps it in the cache like any blob, and checks that it covers the volume's
//! layers.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use super::error::{OciError, chain};
use super::referrer::{Artifact, Subject};
use super::store::hex_of;
use super::{Artifacts, BlobRef, ChunkIndex, Credentials, RegistryConfig, Source};
use crate::plan::oci_ref::OciRef;

/// The artifact type of a chunk index (its manifest's `artifactType`).
pub const INDEX_ARTIFACT_TYPE: &str = "application/vnd.mounthost.chunk-index.v1+json";
/// The media type of its one layer, the index itself.
pub const INDEX_MEDIA_TYPE: &str = "application/vnd.mounthost.chunk-index.v1+json";
/// The largest index read (a 1 TiB model in 1 MiB chunks is about 70 MiB: use larger chunks).
pub const MAX_INDEX_BYTES: u64 = 64 << 20;

/// The index document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IndexDoc {
    pub version: u32,
    pub chunk_size: u64,
    pub blobs: BTreeMap<String, BlobChunks>,
}

/// One blob's chunks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BlobChunks {
    pub size: u64,
    pub chunks: Vec<String>,
}

/// The indexes of `blobs` an index document gives, or why it is unusable for them (another
/// version, a chunk size out of range, a blob missing or of another size, a wrong count or
/// malformed hash).
pub fn parse_index(bytes: &[u8], blobs: &[BlobRef]) -> Result<HashMap<String, Arc<ChunkIndex>>, String> {
    let doc: IndexDoc = serde_json::from_slice(bytes).map_err(|e| format!("not a chunk index: {e}"))?;
    if doc.version != 1 {
        return Err(format!("chunk index version {} (this host reads version 1)", doc.version));
    }
    if !(64 << 10..=256 << 20).contains(&doc.chunk_size) || !doc.chunk_size.is_power_of_two() {
        return Err(format!("chunk size {} is not a power of two from 64 KiB to 256 MiB", doc.chunk_size));
    }
    let mut out = HashMap::new();
    for b in blobs {
        let Some(entry) = doc.blobs.get(&b.digest) else {
            return Err(format!("it has no chunks of layer {}", b.digest));
        };
        if entry.size != b.size {
            return Err(format!("it gives layer {} {} bytes; the manifest says {}", b.digest, entry.size, b.size));
        }
        let want = b.size.div_ceil(doc.chunk_size).max(1);
        if entry.chunks.len() as u64 != want && !(b.size == 0 && entry.chunks.is_empty()) {
            return Err(format!("it has {} chunks of layer {}, which has {want}", entry.chunks.len(), b.digest));
        }
        let mut hashes = Vec::with_capacity(entry.chunks.len());
        for h in &entry.chunks {
            let mut raw = [0u8; 32];
            hex::decode_to_slice(h, &mut raw).map_err(|_| format!("{h:?} is not a sha256 in hex"))?;
            hashes.push(raw);
        }
        out.insert(b.digest.clone(), Arc::new(ChunkIndex { chunk: doc.chunk_size, hashes }));
    }
    Ok(out)
}

/// The index document of `layers` (digest → bytes), chunked by `chunk` (for tests and
/// [`push_index`]).
pub fn index_of(chunk: u64, layers: &[(String, Vec<u8>)]) -> IndexDoc {
    let mut blobs = BTreeMap::new();
    for (digest, bytes) in layers {
        let chunks = bytes.chunks(chunk as usize).map(|c| hex::encode(sha2::Sha256::digest(c))).collect();
        blobs.insert(digest.clone(), BlobChunks { size: bytes.len() as u64, chunks });
    }
    IndexDoc { version: 1, chunk_size: chunk, blobs }
}

impl Artifacts {
    /// The chunk index of manifest `manifest_digest` (of `src`'s repository), if it has one:
    /// looked up as a referrer (the referrers reply and the index's manifest; no blob), its
    /// digest and size. An index larger than [`MAX_INDEX_BYTES`] is refused. Then
    /// [`Artifacts::fetch_index`].
    pub async fn index_descriptor(
        &self,
        src: &Source,
        manifest_digest: &str,
    ) -> Result<Option<(String, u64)>, OciError> {
        let ep = self.core.registries.endpoint(src)?;
        let found = async {
            let referrers = ep.referrers(manifest_digest, INDEX_ARTIFACT_TYPE).await?;
            let Some(first) = referrers.first() else { return Ok(None) };
            let manifest = ep.manifest_by_digest(first).await?;
            let layer = manifest
                .get("layers")
                .and_then(|l| l.as_array())
                .and_then(|l| l.iter().find(|d| d.get("mediaType").and_then(|m| m.as_str()) == Some(INDEX_MEDIA_TYPE)))
                .cloned();
            let (Some(digest), Some(size)) = (
                layer.as_ref().and_then(|d| d.get("digest")).and_then(|d| d.as_str()),
                layer.as_ref().and_then(|d| d.get("size")).and_then(|d| d.as_u64()),
            ) else {
                return Err(OciError::Protocol {
                    registry: ep.ctx.registry.clone(),
                    reference: ep.ctx.reference.clone(),
                    detail: format!("chunk index {first} has no layer of media type {INDEX_MEDIA_TYPE}"),
                });
            };
            if size > MAX_INDEX_BYTES {
                return Err(OciError::Protocol {
                    registry: ep.ctx.registry.clone(),
                    reference: ep.ctx.reference.clone(),
                    detail: format!("chunk index {digest} is {size} bytes; at most {MAX_INDEX_BYTES} are read"),
                });
            }
            Ok(Some((digest.to_string(), size)))
        };
        found.await.map_err(OciError::redacted)
    }

    /// The chunk index `digest` of `size` bytes ([`Artifacts::index_descriptor`]) for
    /// `blobs`: read and verified, kept in the cache. An index that does not cover `blobs` is
    /// an error (the artifact says its chunks are indexed; serving them unchecked would not be
    /// what it says).
    pub async fn fetch_index(
        &self,
        src: &Source,
        manifest_digest: &str,
        digest: &str,
        size: u64,
        blobs: &[BlobRef],
    ) -> Result<(), OciError> {
        let ep = self.core.registries.endpoint(src)?;
        // Streamed to the cache, never held whole on its way (a registry may claim any size up
        // to the cap, and send less or more).
        ep.blob_to_store(&self.core.store, digest, size).await.map_err(OciError::redacted)?;
        self.load_index(digest, blobs).map_err(|e| match e {
            OciError::Protocol { detail, .. } => OciError::Protocol {
                registry: ep.ctx.registry.clone(),
                reference: ep.ctx.reference.clone(),
                detail: format!("the chunk index {digest} of manifest {manifest_digest} is unusable: {detail}"),
            },
            other => other,
        })?;
        Ok(())
    }

    /// The indexes of `blobs` from the index `digest` kept in the cache.
    pub fn load_index(&self, digest: &str, blobs: &[BlobRef]) -> Result<HashMap<String, Arc<ChunkIndex>>, OciError> {
        let bytes = self.read_blob(digest, MAX_INDEX_BYTES)?.ok_or_else(|| OciError::Local {
            path: self.core.store.blob(hex_of(digest).unwrap_or_default()).display().to_string(),
            detail: format!("the chunk index {digest} is not in the cache any more; stage the volume again"),
            kind: std::io::ErrorKind::NotFound,
        })?;
        parse_index(&bytes, blobs).map_err(|e| OciError::Protocol {
            registry: "this node's cache".into(),
            reference: digest.to_string(),
            detail: e,
        })
    }
}

/// What [`push_index`] published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushedIndex {
    /// The model's manifest (the index's subject).
    pub subject: String,
    /// The index artifact's manifest.
    pub manifest_digest: String,
    /// The index document's blob.
    pub index_digest: String,
    pub chunk: u64,
    /// Layers indexed, and their bytes.
    pub layers: usize,
    pub bytes: u64,
}

/// Read every layer of `target` (a tag or a digest) once, and publish its chunk index as a
/// referrer of its manifest (an index resolves to the manifest of the node's platform, as volumes do). Errors
/// are redacted as the cache's are.
pub async fn push_index(
    cfg: RegistryConfig,
    target: &OciRef,
    credentials: &Credentials,
    chunk: u64,
) -> Result<PushedIndex, OciError> {
    push(cfg, target, credentials, chunk).await.map_err(OciError::redacted)
}

async fn push(
    cfg: RegistryConfig,
    target: &OciRef,
    credentials: &Credentials,
    chunk: u64,
) -> Result<PushedIndex, OciError> {
    let subject = Subject::resolve(cfg, target, credentials).await?;
    let (ep, host) = (&subject.endpoint, &subject.host);
    let mut blobs = BTreeMap::new();
    let mut total = 0u64;
    let layers = subject.manifest.get("layers").and_then(|l| l.as_array()).cloned().unwrap_or_default();
    for l in &layers {
        let (Some(digest), Some(size)) =
            (l.get("digest").and_then(|d| d.as_str()), l.get("size").and_then(|s| s.as_u64()))
        else {
            continue;
        };
        if blobs.contains_key(digest) {
            continue;
        }
        let hex = hex_of(digest)?.to_string();
        let mut body = ep.range(digest, 0, None).await?;
        let mut whole = sha2::Sha256::new();
        let mut part = sha2::Sha256::new();
        let mut in_part = 0u64;
        let mut got = 0u64;
        let mut chunks = Vec::new();
        while let Some(bytes) = body.stream.next().await {
            let bytes = bytes.map_err(|e| OciError::Unreachable {
                registry: host.clone(),
                reference: target.to_string(),
                detail: format!("the connection broke while reading {digest}: {}", chain(&e)),
            })?;
            whole.update(&bytes);
            got += bytes.len() as u64;
            let mut data: &[u8] = &bytes;
            while !data.is_empty() {
                let n = (chunk - in_part).min(data.len() as u64) as usize;
                part.update(&data[..n]);
                in_part += n as u64;
                data = &data[n..];
                if in_part == chunk {
                    chunks.push(hex::encode(std::mem::take(&mut part).finalize()));
                    in_part = 0;
                }
            }
        }
        if in_part > 0 || (got == 0 && chunks.is_empty()) {
            chunks.push(hex::encode(part.finalize()));
        }
        if got != size {
            return Err(ep.size_mismatch(digest, format!("the registry sent {got} bytes; the manifest says {size}")));
        }
        let actual = hex::encode(whole.finalize());
        if actual != hex {
            return Err(OciError::DigestMismatch {
                registry: host.clone(),
                reference: target.to_string(),
                digest: digest.to_string(),
                actual: format!("sha256:{actual}"),
            });
        }
        total += size;
        blobs.insert(digest.to_string(), BlobChunks { size, chunks });
    }
    let doc = IndexDoc { version: 1, chunk_size: chunk, blobs };
    let index = serde_json::to_vec(&doc).map_err(|e| OciError::Config(e.to_string()))?;
    let layers = [(INDEX_MEDIA_TYPE, index.as_slice())];
    let attached = subject
        .attach(&Artifact {
            artifact_type: INDEX_ARTIFACT_TYPE,
            layers: &layers,
            annotations: BTreeMap::from([("dev.mounthost.chunk-size".to_string(), chunk.to_string())]),
        })
        .await?;
    Ok(PushedIndex {
        subject: subject.resolved.manifest_digest.clone(),
        manifest_digest: attached.manifest_digest,
        index_digest: attached.layers.into_iter().next().expect("one layer"),
        chunk,
        layers: doc.blobs.len(),
        bytes: total,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob(digest: &str, size: u64) -> BlobRef {
        BlobRef { digest: digest.into(), size, media_type: String::new() }
    }

    #[test]
    fn an_index_is_read_for_the_layers_it_covers_and_refused_otherwise() {
        let a = format!("sha256:{}", "a".repeat(64));
        let data: Vec<u8> = (0..200u32 << 10).map(|i| (i % 251) as u8).collect();
        let doc = index_of(64 << 10, &[(a.clone(), data.clone())]);
        let bytes = serde_json::to_vec(&doc).unwrap();
        let got = parse_index(&bytes, &[blob(&a, data.len() as u64)]).unwrap();
        let i = &got[&a];
        assert_eq!(i.hashes.len(), 4, "200 KiB in 64 KiB chunks");
        assert!(i.matches(3, &data[192 << 10..]));
        assert!(!i.matches(0, &data[1..(64 << 10) + 1]));
        let b = format!("sha256:{}", "b".repeat(64));
        assert!(parse_index(&bytes, &[blob(&b, 1)]).unwrap_err().contains("no chunks of layer"));
        assert!(parse_index(&bytes, &[blob(&a, 1)]).unwrap_err().contains("manifest says 1"));
        let mut bad = doc.clone();
        bad.chunk_size = 1000;
        assert!(parse_index(&serde_json::to_vec(&bad).unwrap(), &[]).unwrap_err().contains("power of two"));
        let mut bad = doc.clone();
        bad.blobs.get_mut(&a).unwrap().chunks.pop();
        assert!(
            parse_index(&serde_json::to_vec(&bad).unwrap(), &[blob(&a, data.len() as u64)])
                .unwrap_err()
                .contains("3 chunks")
        );
        assert!(
            parse_index(b"{\"version\":2,\"chunkSize\":65536,\"blobs\":{}}", &[]).unwrap_err().contains("version 2")
        );
    }
}
