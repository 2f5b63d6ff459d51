//! The node's OCI blob cache as operators drive it (`mounthost cache pull | ls | prune`): warm
//! a node with every blob of an artifact before pods arrive, see what the cache holds and which
//! staged volumes use it, evict what none uses.
//!
//! A warm-up is an operator's call on the host socket, not a plugin's plan: no plugin policy
//! applies, but the node's transport rules do (TLS verified, plain HTTP only to registries
//! listed with `--insecure-registry`). It shares downloads with stages: a stage of the same
//! model while it runs waits for the same download.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::Node;
use super::pull::oci_error;
use crate::error::Error;
use crate::oci::{BlobRef, CachedBlob, Ensure, Progress};
use crate::plan::{RegistryAuth, Step};
use crate::secrets::Secrets;

/// How often a warm-up checks its downloads and reports progress: often enough that the
/// operator learns of the end within a few milliseconds of it (the CLI prints a line a second).
const TICK: Duration = Duration::from_millis(20);

/// What a warm-up reports.
#[derive(Debug, Clone)]
pub enum PullUpdate {
    /// Bytes so far.
    Progress { manifest_digest: String, progress: Progress },
    /// Every blob is in the cache.
    Done { manifest_digest: String, progress: Progress },
}

/// A warm-up as asked.
#[derive(Debug, Clone)]
pub struct PullAsk {
    pub reference: String,
    pub mirror: Option<String>,
    pub insecure: bool,
    pub secrets: Secrets,
}

impl Node {
    /// Resolve `ask.reference` and download every blob its manifest lists (config and layers)
    /// into the cache, sending progress on `updates` until done. Errors name the reference.
    pub async fn cache_pull(&self, ask: PullAsk, updates: tokio::sync::mpsc::Sender<PullUpdate>) -> Result<(), Error> {
        let auth = pull_auth(&ask.secrets)?;
        let step = Step::Resolve {
            reference: ask.reference.clone(),
            mirror: ask.mirror.clone(),
            auth,
            insecure: ask.insecure,
        };
        let source = self.source(&step, &ask.secrets)?;
        let found = self.inner.artifacts.resolve(&source).await.map_err(|e| oci_error(e, &ask.reference))?;
        let blobs = manifest_blobs(&found.manifest)
            .map_err(|e| Error::invalid(format!("{}: the manifest {}: {e}", ask.reference, found.manifest_digest)))?;
        self.inner.artifacts.authorize(&source, &blobs).await.map_err(|e| oci_error(e, &ask.reference))?;
        // The warm-up waits under a name no volume id can have (ids are the CO's, no spaces).
        let waiter = format!("cache pull {}", ask.reference);
        let digest = found.manifest_digest;
        let result = loop {
            match self.inner.artifacts.ensure(&waiter, &source, &blobs) {
                Ensure::Ready => {
                    let progress = complete(&blobs);
                    let _ = updates.send(PullUpdate::Done { manifest_digest: digest.clone(), progress }).await;
                    break Ok(());
                }
                Ensure::Pulling(progress) => {
                    let update = PullUpdate::Progress { manifest_digest: digest.clone(), progress };
                    if updates.send(update).await.is_err() {
                        // The operator went away; the download goes on for whoever asks next.
                        break Ok(());
                    }
                }
                Ensure::Failed(e) => break Err(oci_error(e, &ask.reference)),
            }
            tokio::time::sleep(TICK).await;
        };
        self.inner.artifacts.forget(&waiter);
        self.prune_to_cap();
        result
    }

    /// Blobs the staged volumes' plans fetch or serve lazily (their dynamic mounts' included,
    /// and a lazy volume's chunk index), with the volumes that use each.
    pub fn cache_in_use(&self) -> Result<BTreeMap<String, Vec<String>>, Error> {
        let mut used: BTreeMap<String, Vec<String>> = BTreeMap::new();
        // Records of a newer schema (after a rollback): every digest they mention stays.
        for digest in self.inner.store.refused_claims()?.digests {
            used.entry(digest).or_default().push("(a volume whose record is of a newer schema)".into());
        }
        for st in self.inner.store.all()? {
            // A plugin pulled by OCI reference: its layer is the wasm a restart reloads.
            if st.source.is_some() {
                used.entry(st.digest.clone()).or_default().push(st.volume_id.clone());
            }
            let dynamic = st.dynamic.values().flat_map(|m| m.steps.iter());
            for step in st.plan.steps.iter().chain(dynamic) {
                let digests: Vec<&String> = match step {
                    Step::FetchBlob { digest, .. } => vec![digest],
                    // A lazy server's layers, and the chunk index it checks them with.
                    Step::SpawnFuse { lazy: Some(l), .. } => {
                        l.layers.iter().map(|l| &l.digest).chain(l.index.as_ref()).collect()
                    }
                    _ => Vec::new(),
                };
                for digest in digests {
                    let users = used.entry(digest.clone()).or_default();
                    if !users.contains(&st.volume_id) {
                        users.push(st.volume_id.clone());
                    }
                }
            }
        }
        Ok(used)
    }

    /// What the cache holds.
    pub fn cache_list(&self) -> Result<Vec<CachedBlob>, Error> {
        let used = self.cache_in_use()?;
        self.inner.artifacts.list(&used).map_err(|e| Error::internal(format!("listing the blob cache: {e}")))
    }

    /// Evict blobs no staged volume uses, least recently used first, down to `keep_bytes`.
    pub fn cache_prune(&self, keep_bytes: u64) -> Result<(usize, u64), Error> {
        let used: BTreeSet<String> = self.cache_in_use()?.into_keys().collect();
        let pruned = self
            .inner
            .artifacts
            .prune(&used, keep_bytes)
            .map_err(|e| Error::internal(format!("pruning the blob cache: {e}")))?;
        Ok((pruned.blobs, pruned.bytes))
    }

    /// Keep the cache under `--cache-max-mib` (after a stage, a dynamic mount or a warm-up added
    /// to it).
    pub(super) fn prune_to_cap(&self) {
        if let Some(max) = self.inner.config.registries.cache_max_bytes
            && let Err(e) = self.cache_prune(max)
        {
            tracing::warn!(error = %e.message, "keeping the blob cache under its size cap");
        }
    }
}

/// The credentials a warm-up (and a dynamic mount, `dynamic/credentials.rs`) carries, as a model
/// volume's secrets: `username` and `password`, `token`, or `.dockerconfigjson`, one kind at most.
pub(super) fn pull_auth(secrets: &Secrets) -> Result<RegistryAuth, Error> {
    let has = |k: &str| secrets.get(k).is_some();
    let kinds = [has("username") || has("password"), has("token"), has(".dockerconfigjson")];
    match kinds {
        [false, false, false] => Ok(RegistryAuth::Anonymous),
        [true, false, false] if has("username") && has("password") => {
            Ok(RegistryAuth::Basic { username_key: "username".into(), password_key: "password".into() })
        }
        [true, false, false] => Err(Error::invalid("give both username and password, or neither")),
        [false, true, false] => Ok(RegistryAuth::Token("token".into())),
        [false, false, true] => Ok(RegistryAuth::DockerConfig(".dockerconfigjson".into())),
        _ => Err(Error::invalid("give one kind of credentials: username and password, token, or .dockerconfigjson")),
    }
}

/// Every blob a manifest lists: its config and its layers.
pub fn manifest_blobs(manifest: &str) -> Result<Vec<BlobRef>, String> {
    let v: serde_json::Value = serde_json::from_str(manifest).map_err(|e| format!("is not JSON: {e}"))?;
    let one = |d: &serde_json::Value| -> Result<BlobRef, String> {
        let digest = d["digest"].as_str().ok_or("a descriptor has no digest")?.to_string();
        if !crate::plan::oci_ref::is_sha256(&digest) {
            return Err(format!("descriptor digest {digest:?} is not sha256:<64 lowercase hex digits>"));
        }
        let size = d["size"].as_u64().ok_or_else(|| format!("descriptor {digest} has no size"))?;
        let media_type = d["mediaType"].as_str().unwrap_or_default().to_string();
        Ok(BlobRef { digest, size, media_type })
    };
    let mut blobs = Vec::new();
    if !v["config"].is_null() {
        blobs.push(one(&v["config"])?);
    }
    for layer in v["layers"].as_array().ok_or("has no layers")? {
        blobs.push(one(layer)?);
    }
    Ok(blobs)
}

/// Progress of a finished pull.
fn complete(blobs: &[BlobRef]) -> Progress {
    let total: u64 = blobs.iter().map(|b| b.size).sum();
    Progress {
        done_bytes: total,
        total_bytes: total,
        blobs: blobs
            .iter()
            .map(|b| crate::oci::BlobProgress { digest: b.digest.clone(), done: b.size, total: b.size })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warm_up_takes_one_kind_of_credentials() {
        let s = |kv: &[(&str, &str)]| -> Secrets { kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() };
        assert_eq!(pull_auth(&s(&[])).unwrap(), RegistryAuth::Anonymous);
        assert!(matches!(pull_auth(&s(&[("username", "u"), ("password", "p")])).unwrap(), RegistryAuth::Basic { .. }));
        assert_eq!(pull_auth(&s(&[("token", "t")])).unwrap(), RegistryAuth::Token("token".into()));
        assert!(pull_auth(&s(&[("username", "u")])).unwrap_err().message.contains("both"));
        assert!(pull_auth(&s(&[("token", "t"), ("password", "p")])).unwrap_err().message.contains("one kind"));
    }

    #[test]
    fn a_manifest_lists_its_config_and_layers() {
        let (aa, bb) = (format!("sha256:{}", "a".repeat(64)), format!("sha256:{}", "b".repeat(64)));
        let m = format!(
            r#"{{"schemaVersion":2,"config":{{"mediaType":"application/vnd.cncf.model.config.v1+json","digest":"{aa}","size":3}},
            "layers":[{{"mediaType":"application/vnd.cncf.model.weight.v1.raw","digest":"{bb}","size":7}}]}}"#
        );
        let b = manifest_blobs(&m).unwrap();
        assert_eq!(
            b.iter().map(|b| (b.digest.as_str(), b.size)).collect::<Vec<_>>(),
            [(aa.as_str(), 3), (bb.as_str(), 7)]
        );
        assert!(
            manifest_blobs(&format!(r#"{{"config":{{"digest":"{aa}","size":3}}}}"#)).unwrap_err().contains("no layers")
        );
        assert!(manifest_blobs(&format!(r#"{{"layers":[{{"digest":"{aa}"}}]}}"#)).unwrap_err().contains("no size"));
        // Found by the oci_manifest fuzz target: an empty or malformed digest was listed.
        for bad in ["", "sha256:aa", "sha512:aa", "../../x"] {
            let m = format!(r#"{{"layers":[{{"digest":"{bad}","size":1}}]}}"#);
            assert!(manifest_blobs(&m).unwrap_err().contains("is not sha256"), "{bad:?}");
        }
    }
}
