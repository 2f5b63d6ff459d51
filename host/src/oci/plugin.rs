//! [`PluginPull`]: the registry side of plugins selected by OCI reference
//! (`crate::plugin::pulled`), on the node's blob cache. A plugin is pulled exactly as a model's
//! blob is: the same clients (TLS verified against the system roots and the node's CA bundle,
//! the node's proxy, plain HTTP only to registries the node lists as insecure), the same
//! digest-verified, single-flight download into the content-addressed cache, and the same proof
//! ([`Artifacts::authorize`]) before a blob some other source brought is handed over.
//!
//! Plugins are small and bounded ([`MAX_PULLED_BYTES`]): a pull (the manifest, the proof of
//! access, the download) takes at most [`WAIT`], far inside kubelet's deadline, and answers
//! UNAVAILABLE past it; a download already started goes on in the background (the next call
//! finds it further along or done), as a model pull does.
//!
//! The controller's notes (volume → the reference its plugin came from, for DeleteVolume) are
//! files in a private directory of its state, one per volume id: `{"version":2,"source":"oci://…"}`
//! (schema 1, written by mounthost 0.1.0 and still read, was the bare reference on one line; a
//! note of a newer schema is refused, FAILED_PRECONDITION, never guessed at).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;

use super::{Artifacts, BlobRef, Credentials, Ensure, OciError, Source, credentials_from_docker_config};
use crate::error::{Error, ErrorKind};
use crate::plan::oci_ref::OciRef;
use crate::plugin::Digest;
use crate::plugin::pulled::{
    ARTIFACT_TYPE, AUTH_SECRET_KEY, LAYER_MEDIA_TYPE, MAX_PULLED_BYTES, PluginPuller, Pulled, SCHEME, VolumeNote,
};
use crate::secrets::Secrets;
use crate::unpriv::private_files;
use tokio::time::timeout_at;

/// How long one pull (manifest, proof of access, download) may take before it answers
/// UNAVAILABLE.
pub const WAIT: Duration = Duration::from_secs(10);

/// How often a waiting pull looks at its download.
const TICK: Duration = Duration::from_millis(20);

/// Plugins by reference through the node's blob cache.
#[derive(Clone)]
pub struct PluginPull {
    artifacts: Arc<Artifacts>,
    /// Where the notes volume → the source its plugin came from are kept (none: not kept).
    memo: Option<PathBuf>,
}

impl PluginPull {
    /// Pulls through `artifacts`; `memo` is a private directory for [`PluginPuller::remember`]
    /// (it must outlive the controller's pod: notes lost there make DeleteVolume of volumes with
    /// pulled plugins FAILED_PRECONDITION).
    pub fn new(artifacts: Arc<Artifacts>, memo: Option<PathBuf>) -> Self {
        PluginPull { artifacts, memo }
    }

    async fn pull_now(&self, r: &OciRef, secrets: &Secrets, waiter: &str) -> Result<Pulled, Error> {
        // One deadline for the whole pull: the manifest, the proof, the download.
        let until = Instant::now() + WAIT;
        let shown = format!("{SCHEME}{r}");
        // `plugin oci://REF: <what the cache says, without repeating REF>`.
        let fail = |e: OciError| {
            let mut err = e.into_error(&r.to_string());
            let what = err.message.strip_prefix(&format!("{r}: ")).unwrap_or(&err.message);
            err.message = format!("plugin {shown}: {what}");
            // In CSI, NOT_FOUND says the volume does not exist; a plugin reference the
            // registry does not know (manifest, repository, blob) is a bad argument.
            if err.kind == ErrorKind::NotFound {
                err.kind = ErrorKind::InvalidArgument;
            }
            err
        };
        let late = |what: &str| {
            Error::unavailable(format!(
                "pulling plugin {shown}: {what} took longer than {WAIT:?}; the registry is slow or unreachable, retry later"
            ))
        };
        let registry = r.registry().to_ascii_lowercase();
        // The node's mirror for that registry, if it has one, is the host contacted.
        let mirror = self.artifacts.mirror_for(&registry, None);
        let reached = mirror.clone().unwrap_or_else(|| registry.clone());
        let credentials = match secrets.get(AUTH_SECRET_KEY) {
            Some(json) => credentials_from_docker_config(json, &reached).map_err(fail)?,
            None => Credentials::Anonymous,
        };
        // Plain HTTP to a node's mirror never carries credentials.
        let insecure = self.artifacts.plain_http_allowed(&reached)
            && (mirror.is_none() || matches!(credentials, Credentials::Anonymous));
        let src = Source {
            insecure,
            registry,
            repository: r.repository().to_string(),
            reference: r.digest().or(r.tag()).unwrap_or("latest").to_string(),
            mirror,
            credentials,
            platform: None,
        };
        let found = timeout_at(until.into(), self.artifacts.resolve(&src))
            .await
            .map_err(|_| late("fetching the manifest"))?
            .map_err(fail)?;
        let layer = plugin_layer(&found.manifest).map_err(|why| {
            Error::invalid(format!("{shown} (manifest {}) is not a mounthost plugin: {why}", found.manifest_digest))
        })?;
        let blobs = std::slice::from_ref(&layer);
        let authorize = async || {
            timeout_at(until.into(), self.artifacts.authorize(&src, blobs))
                .await
                .map_err(|_| late("checking access to its layer"))?
                .map_err(fail)
        };
        authorize().await?;
        loop {
            match self.artifacts.ensure(waiter, &src, blobs) {
                Ensure::Ready => break,
                Ensure::Pulling(_) if Instant::now() < until => tokio::time::sleep(TICK).await,
                Ensure::Pulling(p) => {
                    // The download goes on; this call stops waiting for it.
                    self.artifacts.forget(waiter);
                    return Err(Error::unavailable(format!(
                        "pulling plugin {shown}: {} of {} bytes after {WAIT:?}; the download goes on in the host, retry later",
                        p.done_bytes, p.total_bytes
                    )));
                }
                Ensure::Failed(e) => {
                    self.artifacts.forget(waiter);
                    return Err(fail(e));
                }
            }
        }
        self.artifacts.forget(waiter);
        // A blob another source brought between the check above and now is proven too.
        authorize().await?;
        let (artifacts, digest) = (self.artifacts.clone(), layer.digest.clone());
        let wasm = tokio::task::spawn_blocking(move || artifacts.read_blob(&digest, MAX_PULLED_BYTES))
            .await
            .map_err(|e| Error::internal(format!("reading plugin {shown}: {e}")))?
            .map_err(fail)?
            .ok_or_else(|| {
                Error::unavailable(format!(
                    "{shown}: its layer {} left the node's cache before it was read; retry",
                    layer.digest
                ))
            })?;
        Ok(Pulled { manifest_digest: found.manifest_digest, layer_digest: layer.digest, wasm })
    }

    /// The note of `volume_id`: `<memo>/<sha256 hex of the id>` (ids may hold any character),
    /// and its tombstone (`….deleted`).
    fn note_paths(&self, volume_id: &str) -> Result<(PathBuf, PathBuf), Error> {
        let dir = self.memo.as_ref().ok_or_else(|| {
            Error::precondition("this controller keeps no notes of pulled plugins (it has no state directory)")
        })?;
        let key = Digest::of(volume_id.as_bytes()).to_string();
        let key = key.trim_start_matches("sha256:");
        Ok((dir.join(key), dir.join(format!("{key}{DELETED}"))))
    }
}

impl PluginPuller for PluginPull {
    fn pull<'a>(
        &'a self,
        reference: &'a OciRef,
        secrets: &'a Secrets,
        waiter: &'a str,
    ) -> BoxFuture<'a, Result<Pulled, Error>> {
        Box::pin(self.pull_now(reference, secrets, waiter))
    }

    fn cached<'a>(&'a self, digest: &'a Digest) -> BoxFuture<'a, Result<Option<Vec<u8>>, Error>> {
        Box::pin(async move {
            let (artifacts, d) = (self.artifacts.clone(), digest.to_string());
            tokio::task::spawn_blocking(move || artifacts.read_blob(&d, MAX_PULLED_BYTES))
                .await
                .map_err(|e| Error::internal(format!("reading plugin {digest} from the cache: {e}")))?
                .map_err(|e| e.into_error(&digest.to_string()))
        })
    }

    fn remember(&self, volume_id: &str, source: &str) -> Result<(), Error> {
        let (note, tomb) = self.note_paths(volume_id)?;
        let failed = |e: std::io::Error| {
            Error::unavailable(format!(
                "cannot note at {} which plugin volume {volume_id} was created with ({source}), which its \
                 DeleteVolume needs: {e}",
                note.display()
            ))
        };
        let dir = note.parent().expect("a note has a directory");
        private_files::private_dir(dir).map_err(failed)?;
        let doc = serde_json::json!({ "version": NOTE_SCHEMA_VERSION, "source": source });
        private_files::write_atomic(&note, format!("{doc}\n").as_bytes(), 0o600).map_err(failed)?;
        // Created again after a delete (a plugin that reuses ids): no tombstone.
        private_files::remove_file(&tomb).map_err(failed)
    }

    fn recall(&self, volume_id: &str) -> Result<VolumeNote, Error> {
        let (note, tomb) = self.note_paths(volume_id)?;
        for (path, live) in [(&note, true), (&tomb, false)] {
            match std::fs::read_to_string(path) {
                Ok(text) => {
                    let source = note_source(&text).map_err(|why| {
                        Error::precondition(format!("the note {} of volume {volume_id}'s plugin {why}", path.display()))
                    })?;
                    if !source.starts_with(SCHEME) {
                        return Err(Error::internal(format!(
                            "the note {} of volume {volume_id}'s plugin holds no {SCHEME} reference",
                            path.display()
                        )));
                    }
                    let source = source.to_string();
                    return Ok(if live { VolumeNote::Source(source) } else { VolumeNote::Deleted(source) });
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(Error::unavailable(format!(
                        "reading the note {} of volume {volume_id}'s plugin: {e}",
                        path.display()
                    )));
                }
            }
        }
        Ok(VolumeNote::None)
    }

    fn note_path(&self, volume_id: &str) -> Option<PathBuf> {
        self.note_paths(volume_id).ok().map(|(note, _)| note)
    }

    fn deleted(&self, volume_id: &str) -> Result<(), Error> {
        let (note, tomb) = self.note_paths(volume_id)?;
        let failed =
            |e: std::io::Error| Error::internal(format!("marking the note {} as deleted: {e}", note.display()));
        let source = std::fs::read(&note).map_err(failed)?;
        private_files::write_atomic(&tomb, &source, 0o600).map_err(failed)?;
        private_files::remove_file(&note).map_err(failed)?;
        prune_tombstones(tomb.parent().expect("a note has a directory"), KEEP_TOMBSTONES);
        Ok(())
    }
}

/// The schema version of the notes this controller writes.
pub const NOTE_SCHEMA_VERSION: u64 = 2;

/// The reference a note holds: schema 2's JSON, or schema 1's bare line.
fn note_source(text: &str) -> Result<String, String> {
    let text = text.trim();
    if !text.starts_with('{') {
        return Ok(text.to_string());
    }
    let doc: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("is not valid: {e}"))?;
    match doc.get("version").and_then(serde_json::Value::as_u64) {
        Some(v) if v > NOTE_SCHEMA_VERSION => Err(format!(
            "has schema version {v}, written by a newer mounthost; this controller reads versions 1 to {NOTE_SCHEMA_VERSION}"
        )),
        _ => Ok(doc.get("source").and_then(serde_json::Value::as_str).unwrap_or_default().to_string()),
    }
}

/// The suffix of a deleted volume's note.
const DELETED: &str = ".deleted";

/// How long a deleted volume's note is kept, so a DeleteVolume repeated (its answer was lost)
/// still answers OK.
const KEEP_TOMBSTONES: Duration = Duration::from_secs(7 * 24 * 3600);

/// Remove tombstones in `dir` older than `keep` (best effort).
fn prune_tombstones(dir: &Path, keep: Duration) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let old = e.metadata().ok().and_then(|m| m.modified().ok()).and_then(|t| t.elapsed().ok());
        if e.file_name().to_string_lossy().ends_with(DELETED) && old.is_some_and(|age| age > keep) {
            let _ = private_files::remove_file(&e.path());
        }
    }
}

/// The plugin layer of a manifest: `artifactType` (or, without one, the config's media type)
/// is [`ARTIFACT_TYPE`], and there is exactly one layer, of [`LAYER_MEDIA_TYPE`], at most
/// [`MAX_PULLED_BYTES`].
pub fn plugin_layer(manifest: &str) -> Result<BlobRef, String> {
    let doc: serde_json::Value =
        serde_json::from_str(manifest).map_err(|e| format!("the manifest is not JSON: {e}"))?;
    let str_at = |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
    let kind = str_at(&doc, "artifactType").or_else(|| doc.get("config").and_then(|c| str_at(c, "mediaType")));
    if kind.as_deref() != Some(ARTIFACT_TYPE) {
        return Err(format!(
            "its artifactType (or, without one, its config's media type) is {}, not {ARTIFACT_TYPE} \
             (publish plugins with `mounthost plugin push`)",
            kind.as_deref().unwrap_or("missing")
        ));
    }
    let layers = doc.get("layers").and_then(|l| l.as_array()).cloned().unwrap_or_default();
    let [layer] = layers.as_slice() else {
        return Err(format!("it has {} layers; a plugin artifact has exactly one", layers.len()));
    };
    let media_type = str_at(layer, "mediaType").unwrap_or_default();
    if media_type != LAYER_MEDIA_TYPE {
        return Err(format!("its layer's media type is {media_type:?}, not {LAYER_MEDIA_TYPE}"));
    }
    let digest = str_at(layer, "digest").ok_or("its layer has no digest")?;
    if Digest::parse(&digest).is_none() {
        return Err(format!("its layer's digest {digest:?} is not sha256:<64 lowercase hex>"));
    }
    let size = layer.get("size").and_then(|s| s.as_u64()).ok_or("its layer has no size")?;
    if size > MAX_PULLED_BYTES {
        return Err(format!("its layer is {size} bytes; plugins may be at most {MAX_PULLED_BYTES}"));
    }
    Ok(BlobRef { digest, size, media_type })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn puller(dir: &Path, memo: bool) -> PluginPull {
        let artifacts = Artifacts::new(dir.join("cache"), Default::default()).unwrap();
        PluginPull::new(Arc::new(artifacts), memo.then(|| dir.join("notes")))
    }

    #[test]
    fn notes_are_kept_per_volume_and_deleted_ones_become_tombstones() {
        let dir = tempfile::tempdir().unwrap();
        let p = puller(dir.path(), true);
        let (a, b) = ("oci://r.io/team-a/tmpfs@sha256:aa", "oci://r.io/team-b/tmpfs@sha256:bb");
        // Two volumes whose plugins report one name: each keeps its own source.
        p.remember("tmpfs~pvc-a", a).unwrap();
        p.remember("tmpfs~pvc-b/with,odd:chars", b).unwrap();
        assert_eq!(p.recall("tmpfs~pvc-a").unwrap(), VolumeNote::Source(a.into()));
        assert_eq!(p.recall("tmpfs~pvc-b/with,odd:chars").unwrap(), VolumeNote::Source(b.into()));
        assert_eq!(p.recall("tmpfs~pvc-c").unwrap(), VolumeNote::None);
        let note = p.note_path("tmpfs~pvc-a").unwrap();
        assert_eq!(note.file_name().unwrap().len(), 64, "{}", note.display());
        assert_eq!(std::fs::metadata(&note).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(note.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o700);

        p.deleted("tmpfs~pvc-a").unwrap();
        assert_eq!(p.recall("tmpfs~pvc-a").unwrap(), VolumeNote::Deleted(a.into()));
        assert_eq!(p.recall("tmpfs~pvc-b/with,odd:chars").unwrap(), VolumeNote::Source(b.into()));
        // Created again (a plugin reusing ids): live again, no tombstone.
        p.remember("tmpfs~pvc-a", b).unwrap();
        assert_eq!(p.recall("tmpfs~pvc-a").unwrap(), VolumeNote::Source(b.into()));
        p.deleted("tmpfs~pvc-a").unwrap();
        prune_tombstones(note.parent().unwrap(), Duration::from_secs(3600));
        assert_eq!(p.recall("tmpfs~pvc-a").unwrap(), VolumeNote::Deleted(b.into()), "young tombstones stay");
        prune_tombstones(note.parent().unwrap(), Duration::ZERO);
        assert_eq!(p.recall("tmpfs~pvc-a").unwrap(), VolumeNote::None);
        assert_eq!(p.recall("tmpfs~pvc-b/with,odd:chars").unwrap(), VolumeNote::Source(b.into()), "live notes stay");

        // Garbage in a note is an error, not another plugin.
        std::fs::write(p.note_path("tmpfs~pvc-x").unwrap(), "tmpfs\n").unwrap();
        assert_eq!(p.recall("tmpfs~pvc-x").unwrap_err().kind, ErrorKind::Internal);
        // Schema 2 is what is written; 0.1.0's bare line (schema 1) still reads; a newer one is refused.
        let text = std::fs::read_to_string(p.note_path("tmpfs~pvc-b/with,odd:chars").unwrap()).unwrap();
        assert_eq!(serde_json::from_str::<serde_json::Value>(&text).unwrap()["version"], 2, "{text}");
        std::fs::write(p.note_path("tmpfs~pvc-y").unwrap(), format!("{a}\n")).unwrap();
        assert_eq!(p.recall("tmpfs~pvc-y").unwrap(), VolumeNote::Source(a.into()));
        std::fs::write(p.note_path("tmpfs~pvc-y").unwrap(), format!(r#"{{"version":3,"source":"{a}"}}"#)).unwrap();
        let err = p.recall("tmpfs~pvc-y").unwrap_err();
        assert_eq!(err.kind, ErrorKind::FailedPrecondition);
        assert!(err.message.contains("schema version 3, written by a newer mounthost"), "{}", err.message);

        // Without a state directory nothing is noted, and CreateVolume of such a volume fails.
        let none = puller(dir.path(), false);
        assert_eq!(none.remember("tmpfs~pvc-a", a).unwrap_err().kind, ErrorKind::FailedPrecondition);
        assert_eq!(none.note_path("tmpfs~pvc-a"), None);
    }

    fn manifest(artifact: Option<&str>, layers: &[(&str, u64)]) -> String {
        let layers: Vec<_> = layers
            .iter()
            .map(|(m, size)| serde_json::json!({"mediaType": m, "digest": format!("sha256:{}", "a".repeat(64)), "size": size}))
            .collect();
        let mut doc = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": format!("sha256:{}", "4".repeat(64)), "size": 2},
            "layers": layers,
        });
        if let Some(a) = artifact {
            doc["artifactType"] = a.into();
        }
        doc.to_string()
    }

    #[test]
    fn only_plugin_artifacts_with_one_bounded_layer_are_taken() {
        let ok = plugin_layer(&manifest(Some(ARTIFACT_TYPE), &[(LAYER_MEDIA_TYPE, 1000)])).unwrap();
        assert_eq!((ok.size, ok.media_type.as_str()), (1000, LAYER_MEDIA_TYPE));
        for (m, why) in [
            (manifest(None, &[(LAYER_MEDIA_TYPE, 1)]), "is application/vnd.oci.empty.v1+json, not"),
            (
                manifest(Some("application/vnd.cncf.model.manifest.v1+json"), &[(LAYER_MEDIA_TYPE, 1)]),
                "not application/vnd.mounthost",
            ),
            (manifest(Some(ARTIFACT_TYPE), &[]), "0 layers"),
            (manifest(Some(ARTIFACT_TYPE), &[(LAYER_MEDIA_TYPE, 1), (LAYER_MEDIA_TYPE, 1)]), "2 layers"),
            (manifest(Some(ARTIFACT_TYPE), &[("application/wasm", 1)]), "is \"application/wasm\", not"),
            (manifest(Some(ARTIFACT_TYPE), &[(LAYER_MEDIA_TYPE, MAX_PULLED_BYTES + 1)]), "at most"),
        ] {
            let e = plugin_layer(&m).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
    }
}
