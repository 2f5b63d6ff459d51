//! What a signature check reads from the registry and the cache (docs/signing.md): the
//! Sigstore bundles attached to a manifest as referrers, a signature file that is a layer of
//! the artifact, the chunk indexes of a manifest, and the sha256 of every file of an unpacked
//! tree. Nothing here judges a signature: `oci::signing` verifies, the daemon decides.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use sha2::Digest as _;

use super::index::{INDEX_ARTIFACT_TYPE, INDEX_MEDIA_TYPE, MAX_INDEX_BYTES};
use super::referrer::PREDICATE_ANNOTATION;
use super::signing::{BUNDLE_MEDIA_TYPE, MAX_BUNDLE_BYTES};
use super::{Artifacts, OciError, Source, store};

/// Referrers of one kind read at most per manifest: a registry writer cannot make a stage read
/// an unbounded list.
pub const MAX_REFERRERS: usize = 8;

/// A file of an unpacked tree, as a signature sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TreeEntry {
    /// A regular file and its sha256 (hex).
    File(String),
    /// A symbolic link (no signature lists one).
    Symlink,
}

impl Artifacts {
    /// The Sigstore bundles attached to manifest `manifest_digest` of `src`'s repository whose
    /// predicate type is `predicate` (a referrer without the annotation is listed too, and the
    /// verification judges its statement): each bundle blob's digest and size, at most
    /// [`MAX_REFERRERS`] of them. Read each with [`Artifacts::signature_blob`], one at a time.
    pub async fn bundle_referrers(
        &self,
        src: &Source,
        manifest_digest: &str,
        predicate: &str,
    ) -> Result<Vec<(String, u64)>, OciError> {
        let found = async {
            let ep = self.core.registries.endpoint(src)?;
            let mut out = Vec::new();
            for referrer in ep.referrers(manifest_digest, BUNDLE_MEDIA_TYPE).await?.into_iter().take(MAX_REFERRERS) {
                let manifest = ep.manifest_by_digest(&referrer).await?;
                let annotated =
                    manifest.get("annotations").and_then(|a| a.get(PREDICATE_ANNOTATION)).and_then(|p| p.as_str());
                if annotated.is_some_and(|p| p != predicate) {
                    continue;
                }
                if let Some(found) = layer_of(&manifest, BUNDLE_MEDIA_TYPE) {
                    out.push(found);
                }
            }
            Ok(out)
        };
        found.await.map_err(OciError::redacted)
    }

    /// The blob `digest` of `size` bytes of `src` (a bundle, or a layer holding a signature
    /// file), read whole from the registry and checked against its digest; at most
    /// [`MAX_BUNDLE_BYTES`] (a larger one is refused before any of it is read).
    pub async fn signature_blob(&self, src: &Source, digest: &str, size: u64) -> Result<Vec<u8>, OciError> {
        let read = async {
            let ep = self.core.registries.endpoint(src)?;
            if size > MAX_BUNDLE_BYTES {
                return Err(ep.size_mismatch(
                    digest,
                    format!("it is {size} bytes; a signature is read only up to {MAX_BUNDLE_BYTES}"),
                ));
            }
            ep.small_blob(digest, size).await
        };
        read.await.map_err(OciError::redacted)
    }

    /// Every chunk index attached to manifest `manifest_digest` (at most [`MAX_REFERRERS`]):
    /// each index blob's digest and size, as its referrer's manifest gives them.
    pub async fn index_descriptors(&self, src: &Source, manifest_digest: &str) -> Result<Vec<(String, u64)>, OciError> {
        let found = async {
            let ep = self.core.registries.endpoint(src)?;
            let mut out = Vec::new();
            for referrer in ep.referrers(manifest_digest, INDEX_ARTIFACT_TYPE).await?.into_iter().take(MAX_REFERRERS) {
                let manifest = ep.manifest_by_digest(&referrer).await?;
                if let Some((digest, size)) = layer_of(&manifest, INDEX_MEDIA_TYPE)
                    && size <= MAX_INDEX_BYTES
                {
                    out.push((digest, size));
                }
            }
            Ok(out)
        };
        found.await.map_err(OciError::redacted)
    }

    /// Every file below the unpacked tree of blob `digest` in the cache, by its path in the
    /// tree, with its sha256 (a symbolic link is named as one; directories are not listed).
    /// Blocking: reads every byte. The tree is the cache's own (unpacked by `exec::artifacts`,
    /// below the state directory): it is walked without following links.
    pub fn tree_files(&self, digest: &str) -> io::Result<BTreeMap<String, TreeEntry>> {
        let hex = store::hex_of(digest).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let root = self.core.store.tree(hex);
        let mut out = BTreeMap::new();
        walk(&root, "", &mut out)?;
        Ok(out)
    }
}

/// The first layer of `manifest` of media type `media_type`: its digest and size.
fn layer_of(manifest: &serde_json::Value, media_type: &str) -> Option<(String, u64)> {
    let layer = manifest
        .get("layers")?
        .as_array()?
        .iter()
        .find(|d| d.get("mediaType").and_then(|m| m.as_str()) == Some(media_type))?;
    let digest = layer.get("digest")?.as_str()?;
    store::hex_of(digest).ok()?;
    Some((digest.to_string(), layer.get("size")?.as_u64()?))
}

fn walk(dir: &Path, prefix: &str, out: &mut BTreeMap<String, TreeEntry>) -> io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name().into_string().map_err(|n| {
            io::Error::new(io::ErrorKind::InvalidData, format!("{prefix}{n:?} is not UTF-8, which no signature names"))
        })?;
        let rel = format!("{prefix}{name}");
        let kind = e.file_type()?;
        if kind.is_dir() {
            walk(&e.path(), &format!("{rel}/"), out)?;
        } else if kind.is_symlink() {
            out.insert(rel, TreeEntry::Symlink);
        } else if kind.is_file() {
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
                .open(e.path())?;
            let mut hash = sha2::Sha256::new();
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = file.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                hash.update(&buf[..n]);
            }
            out.insert(rel, TreeEntry::File(hex::encode(hash.finalize())));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_is_listed_with_the_sha256_of_each_file_and_its_links_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/w.bin"), b"weights").unwrap();
        std::fs::write(dir.path().join("top.json"), b"{}").unwrap();
        std::os::unix::fs::symlink("top.json", dir.path().join("a/link")).unwrap();
        let mut out = BTreeMap::new();
        walk(dir.path(), "", &mut out).unwrap();
        let sha = |b: &[u8]| TreeEntry::File(hex::encode(sha2::Sha256::digest(b)));
        assert_eq!(
            out,
            BTreeMap::from([
                ("a/b/w.bin".to_string(), sha(b"weights")),
                ("a/link".to_string(), TreeEntry::Symlink),
                ("top.json".to_string(), sha(b"{}")),
            ])
        );
    }

    #[test]
    fn a_referrer_names_its_layer_of_one_media_type() {
        let d = format!("sha256:{}", "a".repeat(64));
        let m = serde_json::json!({"layers": [
            {"mediaType": "x", "digest": format!("sha256:{}", "b".repeat(64)), "size": 1},
            {"mediaType": BUNDLE_MEDIA_TYPE, "digest": d, "size": 7},
        ]});
        assert_eq!(layer_of(&m, BUNDLE_MEDIA_TYPE), Some((d, 7)));
        assert_eq!(layer_of(&m, "y"), None);
        let bad = serde_json::json!({"layers": [{"mediaType": "x", "digest": "md5:00", "size": 1}]});
        assert_eq!(layer_of(&bad, "x"), None, "only sha256 digests");
    }
}
