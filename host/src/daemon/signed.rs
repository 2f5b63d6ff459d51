//! Signature policy (docs/signing.md): what a volume whose plan names an OCI artifact must
//! prove before a byte of it is mounted, whatever its plugin.
//!
//! A volume is under a policy when it names trust entries (`signedBy`) or the node requires a
//! signature (`--require-signature`). Its model must then carry an OpenSSF model-signing
//! bundle (a `model.sig` layer of the artifact, or a referrer of its manifest) that an allowed
//! entry of the trust set verifies, and every file the volume serves must be listed in it with
//! its sha256. The checks run in two rounds:
//!
//! 1. [`Node::check_signature`], once the plan is known and before any layer is fetched: the
//!    bundle, and the files of raw layers (a raw layer's file is its blob, whose digest is its
//!    sha256); a lazy volume also needs a chunk index signed by an allowed entry;
//! 2. [`Node::check_trees`], once the tar layers are fetched and unpacked in the node's cache
//!    and before anything is linked into the volume: the files of each tar layer, hashed.
//!
//! A refusal is FAILED_PRECONDITION (a dynamic mount's 403 `signature_refused`), names the
//! reference, the file and the reason, is counted by reason and logged at warn.

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

use tracing::{info, warn};

use super::Node;
use crate::error::Error;
use crate::oci::signing::{self, INDEX_PREDICATE, MODEL_PREDICATE, TrustSet};
use crate::oci::{Source, TreeEntry};
use crate::plan::{Archive, LazyLayer, Plan, Step};
use crate::volume::state::Verification;

/// Every signature refusal's message starts so (the dynamic API answers it 403
/// `signature_refused`).
pub const REFUSED: &str = "signature refused";
/// The file name of a signature inside a model (as `model_signing sign` writes it).
pub const SIGNATURE_FILE: &str = "model.sig";
/// The ModelPack annotation giving a layer's path in the model.
const FILEPATH_ANNOTATION: &str = "org.cncf.model.filepath";

/// A volume's signature policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// The trust entries that may sign (empty: any entry of the trust set).
    pub signers: Vec<String>,
    /// A signature is needed (`signedBy`, or the node's `--require-signature`).
    pub required: bool,
    /// `chunkIndex: required`: a lazy volume needs a chunk index.
    pub index_required: bool,
}

impl Policy {
    /// No policy at all.
    pub fn none(&self) -> bool {
        !self.required && !self.index_required
    }
}

/// What round 1 found, for round 2.
#[derive(Debug, Clone, Default)]
pub struct Checked {
    /// Recorded with the volume.
    pub verification: Verification,
    /// The signed files: path → sha256 (empty without a policy).
    files: BTreeMap<String, String>,
    /// The tar layers served, and where their files go (checked in round 2).
    tar_layers: Vec<(String, String)>,
    /// Signed paths round 1 could not place (a tar layer may hold them).
    unplaced: Vec<String>,
    /// The manifest's layer paths (ModelPack `org.cncf.model.filepath`), for files the filters
    /// leave out.
    artifact_paths: Vec<String>,
    reference: String,
    enforced: bool,
}

impl Checked {
    /// Round 2 has work: the policy holds and tar layers are served.
    pub fn needs_trees(&self) -> bool {
        self.enforced && !self.tar_layers.is_empty()
    }

    /// The tar layers round 2 reads.
    pub fn tar_digests(&self) -> impl Iterator<Item = &str> {
        self.tar_layers.iter().map(|(d, _)| d.as_str())
    }
}

/// The served layout of a checked plan: each unpacked blob and where it goes below the
/// volume's root (`None`: the plan does not have the shape a signature can be checked on).
pub fn layout(plan: &Plan) -> Option<Vec<LazyLayer>> {
    if let Some(l) = crate::plan::lazy::layers(plan) {
        return Some(l.layers.clone());
    }
    let lowered = crate::plan::lazy::lower(plan.clone(), std::path::Path::new("/")).ok()?;
    crate::plan::lazy::layers(&lowered).map(|l| l.layers.clone())
}

/// Why `plan` (its layout found) serves something besides its unpacked layers, if it does: under
/// a policy a plan may resolve, fetch and unpack blobs, make directories, bind its layers'
/// directory (or below it), and run the host's own lazy server; a mount, another program, a
/// bind of anything else would put bytes no signature covers in front of the pod.
fn beside_layers(plan: &Plan) -> Option<String> {
    let root = plan.steps.iter().find_map(|s| match s {
        Step::SpawnFuse { lazy: Some(_), mountpoint, .. } => Some(mountpoint.clone()),
        _ => None,
    });
    let unpacked: Vec<&std::path::Path> = plan
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Unpack { dest, .. } => Some(dest.as_path()),
            _ => None,
        })
        .collect();
    for step in &plan.steps {
        match step {
            Step::Resolve { .. } | Step::FetchBlob { .. } | Step::Unpack { .. } | Step::Mkdir { .. } => {}
            Step::SpawnFuse { lazy: Some(_), .. } => {}
            Step::Bind { source, .. } => {
                let covered = match &root {
                    Some(r) => source.starts_with(r),
                    None => unpacked.iter().all(|d| d.starts_with(source)) && !unpacked.is_empty(),
                };
                if !covered {
                    return Some(format!("binds {}, which holds no signed layer", source.display()));
                }
            }
            other => return Some(format!("has a {} step", other.kind())),
        }
    }
    None
}

/// `rel` below `dest`.
fn join(dest: &str, rel: &str) -> String {
    match (dest.is_empty(), rel.is_empty()) {
        (true, _) => rel.to_string(),
        (false, true) => dest.to_string(),
        (false, false) => format!("{dest}/{rel}"),
    }
}

/// The refusal of `reference` for `why`.
fn refusal(reference: &str, reason: &'static str, kind: &'static str, why: String) -> Error {
    crate::metrics::global().signature_check(kind, reason);
    warn!(reference = %reference, reason, kind, detail = %why, "{REFUSED}");
    Error::precondition(format!("{REFUSED} for {reference}: {why}"))
}

/// The paths the manifest's layers give (ModelPack), and the `model.sig` layer if any:
/// `(digest, size, media type)`.
type SigLayer = (String, u64, String);
fn manifest_paths(manifest: &str) -> (Vec<String>, Option<SigLayer>) {
    let doc: serde_json::Value = serde_json::from_str(manifest).unwrap_or_default();
    let mut paths = Vec::new();
    let mut sig = None;
    for l in doc.get("layers").and_then(|l| l.as_array()).map(Vec::as_slice).unwrap_or_default() {
        let Some(path) = l.get("annotations").and_then(|a| a.get(FILEPATH_ANNOTATION)).and_then(|p| p.as_str()) else {
            continue;
        };
        let path = path.trim_start_matches("./").trim_end_matches('/').to_string();
        if path == SIGNATURE_FILE
            && let (Some(d), Some(s)) =
                (l.get("digest").and_then(|d| d.as_str()), l.get("size").and_then(|s| s.as_u64()))
        {
            let media = l.get("mediaType").and_then(|m| m.as_str()).unwrap_or_default().to_string();
            sig.get_or_insert((d.to_string(), s, media));
        }
        paths.push(path);
    }
    (paths, sig)
}

/// The file `model.sig` from the bytes of a layer of media type `media`: the layer itself
/// when raw, else the entry of that name of its tar (plain, gzip or zstd), read at most
/// [`signing::MAX_BUNDLE_BYTES`].
fn signature_in_layer(bytes: Vec<u8>, media: &str) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let reader: Box<dyn std::io::Read + '_> = if media.ends_with("tar+gzip") || media.ends_with("tar.gzip") {
        Box::new(flate2::read::MultiGzDecoder::new(&bytes[..]))
    } else if media.ends_with("tar+zstd") {
        Box::new(zstd::stream::read::Decoder::new(&bytes[..]).map_err(|e| e.to_string())?)
    } else if media.ends_with(".tar") || media.ends_with("tar") {
        Box::new(&bytes[..])
    } else {
        return Ok(bytes);
    };
    let mut archive = tar::Archive::new(reader.take(4 * signing::MAX_BUNDLE_BYTES));
    for entry in archive.entries().map_err(|e| e.to_string())? {
        let mut entry = entry.map_err(|e| e.to_string())?;
        let path = entry.path().map_err(|e| e.to_string())?.to_string_lossy().trim_start_matches("./").to_string();
        if path == SIGNATURE_FILE && entry.header().entry_type().is_file() {
            let mut out = Vec::new();
            (&mut entry).take(signing::MAX_BUNDLE_BYTES + 1).read_to_end(&mut out).map_err(|e| e.to_string())?;
            if out.len() as u64 > signing::MAX_BUNDLE_BYTES {
                return Err(format!("its {SIGNATURE_FILE} is larger than {} bytes", signing::MAX_BUNDLE_BYTES));
            }
            return Ok(out);
        }
    }
    Err(format!("the layer holds no file {SIGNATURE_FILE}"))
}

impl Node {
    /// The policy of a volume with `signed_by` entries and `index_required`, under the node's
    /// `--require-signature`.
    pub(super) fn policy(&self, signed_by: &[String], index_required: bool) -> Policy {
        Policy {
            signers: signed_by.to_vec(),
            required: !signed_by.is_empty() || self.inner.config.signatures.required,
            index_required,
        }
    }

    /// The trust set as its directory holds it now (read at each verification, so a changed
    /// ConfigMap applies at the next stage; an unusable file is logged and trusts nothing).
    fn trust(&self) -> TrustSet {
        let Some(dir) = &self.inner.config.signatures.trust_dir else { return TrustSet::empty() };
        let set = TrustSet::load(dir);
        for p in set.problems() {
            warn!(trust_dir = %dir.display(), problem = %p, "a trust entry is unusable");
        }
        set
    }

    /// The entries a policy accepts: its own, else every usable entry of the trust set.
    fn allowed(policy: &Policy, trust: &TrustSet) -> Vec<String> {
        if policy.signers.is_empty() { trust.names() } else { policy.signers.clone() }
    }

    /// Round 1 (see the module): the signature of the artifact `plan` mounts (resolved to
    /// `manifest_digest`, its manifest `manifest`), its raw layers' files, and a lazy plan's
    /// chunk index. `pinned`: what this volume's earlier stage verified and the layout it
    /// served, kept as it is while the manifest and the layout are the same (nothing is looked
    /// up again). Returns what to record, and
    /// what round 2 checks. `lazy`: the plan is a lazy volume's (it needs a signed index).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn check_signature(
        &self,
        policy: &Policy,
        plan: &Plan,
        lazy: bool,
        source: &Source,
        reference: &str,
        manifest: &str,
        manifest_digest: &str,
        pinned: Option<(&Verification, Vec<LazyLayer>)>,
    ) -> Result<Checked, Error> {
        let mut checked = Checked {
            verification: Verification { manifest: manifest_digest.to_string(), ..Verification::default() },
            reference: reference.to_string(),
            enforced: policy.required,
            ..Checked::default()
        };
        if policy.none() {
            return Ok(checked);
        }
        let Some(layers) = layout(plan) else {
            return Err(refusal(
                reference,
                "unsupported",
                "model",
                "the plan does not unpack its blobs into one directory that it then mounts, so the files it serves cannot be checked against a signature".into(),
            ));
        };
        if policy.required
            && let Some(why) = beside_layers(plan)
        {
            return Err(refusal(
                reference,
                "unsupported",
                "model",
                format!("the plan {why}: a signature covers only the files of the artifact's layers"),
            ));
        }
        // A restage of the same manifest laid out the same way: what its first stage verified
        // stands (the registry is not asked again).
        if let Some((p, _)) = pinned.filter(|(p, earlier)| p.manifest == manifest_digest && *earlier == layers) {
            info!(reference = %reference, signer = ?p.signer, index = ?p.index, "restaged: the verification of its first stage stands");
            checked.verification = p.clone();
            checked.enforced = false;
            return Ok(checked);
        }
        let trust = self.trust();
        let allowed = Self::allowed(policy, &trust);
        if policy.required {
            let (artifact_paths, sig_layer) = manifest_paths(manifest);
            let verified =
                self.find_model_signature(&trust, &allowed, source, reference, manifest_digest, sig_layer).await?;
            checked.verification.signer = Some(verified.0.signer.clone());
            checked.verification.identity = verified.0.identity.clone();
            checked.verification.bundle = Some(verified.1);
            checked.verification.found_in = Some(verified.2.into());
            checked.files = verified.0.files;
            checked.artifact_paths = artifact_paths;
            // Raw layers: the file is the blob, verified against its digest as it arrives.
            let mut served = BTreeSet::new();
            for l in &layers {
                match l.format {
                    Archive::Raw => {
                        let hex = l.digest.trim_start_matches("sha256:");
                        self.check_file(&checked, &l.dest, Some(hex))?;
                        served.insert(l.dest.clone());
                    }
                    _ => checked.tar_layers.push((l.digest.clone(), l.dest.clone())),
                }
            }
            for path in checked.files.keys() {
                if served.contains(path) {
                    continue;
                }
                let in_tar = checked.tar_layers.iter().any(|(_, d)| d.is_empty() || path.starts_with(&format!("{d}/")));
                if in_tar {
                    checked.unplaced.push(path.clone());
                } else {
                    self.left_out(&checked, path)?;
                }
            }
            crate::metrics::global().signature_check("model", "verified");
            info!(reference = %reference, signer = %verified.0.signer, found_in = verified.2, "the model's signature verified");
        }
        if lazy {
            self.check_index(&mut checked, policy, &trust, &allowed, source, reference, manifest_digest).await?;
        }
        Ok(checked)
    }

    /// The first bundle an allowed entry verifies, with its digest and where it was found: the
    /// artifact's `model.sig` layer, then the manifest's referrers.
    async fn find_model_signature(
        &self,
        trust: &TrustSet,
        allowed: &[String],
        source: &Source,
        reference: &str,
        manifest_digest: &str,
        sig_layer: Option<SigLayer>,
    ) -> Result<(signing::Verified, String, &'static str), Error> {
        let oci = |e: crate::oci::OciError| super::pull::oci_error(e, reference);
        let mut candidates: Vec<(String, Vec<u8>, &'static str)> = Vec::new();
        let mut reasons: Vec<String> = Vec::new();
        if let Some((digest, size, media)) = sig_layer {
            let bytes = self.inner.artifacts.signature_blob(source, &digest, size).await.map_err(oci)?;
            match signature_in_layer(bytes, &media) {
                Ok(b) => candidates.push((digest, b, SIGNATURE_FILE)),
                Err(e) => reasons.push(format!("its {SIGNATURE_FILE} layer {digest}: {e}")),
            }
        }
        for (digest, bytes) in
            self.inner.artifacts.referrer_bundles(source, manifest_digest, MODEL_PREDICATE).await.map_err(oci)?
        {
            candidates.push((digest, bytes, "referrer"));
        }
        if candidates.is_empty() && reasons.is_empty() {
            return Err(refusal(
                reference,
                "unsigned",
                "model",
                format!(
                    "the model is not signed: it has no {SIGNATURE_FILE} layer, and no Sigstore bundle refers to manifest \
                     {manifest_digest} (attach one with `mounthost model sign`)"
                ),
            ));
        }
        let now = SystemTime::now();
        let mut first_reason = "unsigned";
        for (digest, bytes, found_in) in candidates {
            match signing::verify(&bytes, trust, allowed, MODEL_PREDICATE, now) {
                Ok(v) => return Ok((v, digest, found_in)),
                Err(r) => {
                    if reasons.is_empty() {
                        first_reason = r.reason;
                    }
                    reasons.push(format!("the bundle {digest} ({found_in}): {r}"));
                }
            }
        }
        Err(refusal(
            reference,
            first_reason,
            "model",
            format!("no signature verifies against trust entries {}: {}", allowed_text(allowed), reasons.join("; ")),
        ))
    }

    /// A served file at `path` whose sha256 is `hex` (`None`: a symbolic link) must be listed
    /// with that sha256 (the signature file itself excepted).
    fn check_file(&self, c: &Checked, path: &str, hex: Option<&str>) -> Result<(), Error> {
        if path == SIGNATURE_FILE {
            return Ok(());
        }
        let Some(hex) = hex else {
            return Err(refusal(
                &c.reference,
                "symlink",
                "model",
                format!("{path} is a symbolic link, which no model signature lists"),
            ));
        };
        match c.files.get(path) {
            None => Err(refusal(
                &c.reference,
                "unlisted",
                "model",
                format!("{path} is served but the signature does not list it"),
            )),
            Some(want) if !want.eq_ignore_ascii_case(hex) => Err(refusal(
                &c.reference,
                "mismatch",
                "model",
                format!("{path} has sha256 {hex}, but the signature lists {want}"),
            )),
            Some(_) => Ok(()),
        }
    }

    /// A signed file the volume does not serve: fine when a layer of the artifact holds it (the
    /// volume's filters left it out); a refusal when none does (the artifact lacks it).
    fn left_out(&self, c: &Checked, path: &str) -> Result<(), Error> {
        let held = c.artifact_paths.iter().any(|p| p == path || path.starts_with(&format!("{p}/")));
        if held {
            return Ok(());
        }
        Err(refusal(&c.reference, "missing", "model", format!("the signature lists {path}, which the artifact lacks")))
    }

    /// Round 2 (blocking): the files of every tar layer the volume serves, hashed from its
    /// unpacked tree in the node's cache, and the signed files round 1 could not place.
    pub(super) fn check_trees(&self, c: &Checked) -> Result<(), Error> {
        if !c.needs_trees() {
            return Ok(());
        }
        let mut served = BTreeSet::new();
        for (digest, dest) in &c.tar_layers {
            let files = self.inner.artifacts.tree_files(digest).map_err(|e| {
                Error::unavailable(format!(
                    "reading the unpacked layer {digest} of {} in the node's cache: {e}",
                    c.reference
                ))
            })?;
            for (rel, f) in files {
                let path = join(dest, &rel);
                let hex = match &f {
                    TreeEntry::File(h) => Some(h.as_str()),
                    TreeEntry::Symlink => None,
                };
                self.check_file(c, &path, hex)?;
                served.insert(path);
            }
        }
        for path in &c.unplaced {
            if !served.contains(path) {
                // In no served layer: held by one the filters left out, or lacking.
                let held_by_served_layer =
                    c.tar_layers.iter().any(|(_, d)| !d.is_empty() && path.starts_with(&format!("{d}/")));
                if held_by_served_layer {
                    return Err(refusal(
                        &c.reference,
                        "missing",
                        "model",
                        format!("the signature lists {path}, which the layer that should hold it lacks"),
                    ));
                }
                self.left_out(c, path)?;
            }
        }
        Ok(())
    }

    /// A lazy volume's chunk index: under a signature policy, one a signed statement binds to
    /// the manifest (signed by an allowed entry); with `chunkIndex: required`, any. Its digest
    /// and size go into the verification (the stage pins it).
    #[allow(clippy::too_many_arguments)]
    async fn check_index(
        &self,
        checked: &mut Checked,
        policy: &Policy,
        trust: &TrustSet,
        allowed: &[String],
        source: &Source,
        reference: &str,
        manifest_digest: &str,
    ) -> Result<(), Error> {
        let oci = |e: crate::oci::OciError| super::pull::oci_error(e, reference);
        let indexes = self.inner.artifacts.index_descriptors(source, manifest_digest).await.map_err(oci)?;
        if !policy.required {
            let Some((digest, size)) = indexes.into_iter().next() else {
                return Err(refusal(
                    reference,
                    "no_index",
                    "index",
                    format!(
                        "volume attribute chunkIndex is \"required\", but manifest {manifest_digest} has no chunk index \
                         (publish one with `mounthost model index`)"
                    ),
                ));
            };
            checked.verification.index = Some(digest);
            checked.verification.index_size = size;
            return Ok(());
        }
        let bundles =
            self.inner.artifacts.referrer_bundles(source, manifest_digest, INDEX_PREDICATE).await.map_err(oci)?;
        let now = SystemTime::now();
        let mut reasons = Vec::new();
        let mut first_reason = "no_index";
        for (bdigest, bytes) in bundles {
            let v = match signing::verify(&bytes, trust, allowed, INDEX_PREDICATE, now) {
                Ok(v) => v,
                Err(r) => {
                    if reasons.is_empty() {
                        first_reason = r.reason;
                    }
                    reasons.push(format!("the bundle {bdigest}: {r}"));
                    continue;
                }
            };
            let subject = |name: &str| v.subjects.iter().find(|(n, _)| n == name).map(|(_, h)| format!("sha256:{h}"));
            if subject("manifest").as_deref() != Some(manifest_digest) {
                reasons.push(format!("the bundle {bdigest} signs the index of another manifest"));
                continue;
            }
            let Some(index) = subject("index") else {
                reasons.push(format!("the bundle {bdigest} names no index"));
                continue;
            };
            match indexes.iter().find(|(d, _)| *d == index) {
                Some((d, size)) => {
                    checked.verification.index = Some(d.clone());
                    checked.verification.index_size = *size;
                    checked.verification.index_signer = Some(v.signer.clone());
                    crate::metrics::global().signature_check("index", "verified");
                    info!(reference = %reference, index = %d, signer = %v.signer, "the chunk index's signature verified");
                    return Ok(());
                }
                None => reasons.push(format!("the index {index} it signs is not attached to the manifest")),
            }
        }
        let why = if reasons.is_empty() {
            format!(
                "a lazy volume under a signature policy needs a chunk index signed by {} (publish one with `mounthost \
                 model index --sign-key`), and manifest {manifest_digest} has none",
                allowed_text(allowed)
            )
        } else {
            format!("no signed chunk index of manifest {manifest_digest} verifies: {}", reasons.join("; "))
        };
        Err(refusal(reference, first_reason, "index", why))
    }
}

fn allowed_text(allowed: &[String]) -> String {
    if allowed.is_empty() { "(none: the trust set is empty)".into() } else { allowed.join(", ") }
}

/// Does the plan fetch an OCI artifact (a `resolve` or `fetch-blob` step)?
pub fn names_artifact(plan: &Plan) -> bool {
    plan.steps.iter().any(|s| matches!(s, Step::Resolve { .. } | Step::FetchBlob { .. }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_gives_its_paths_and_its_signature_layer() {
        let m = serde_json::json!({"layers": [
            {"mediaType": "application/vnd.cncf.model.weight.v1.raw", "digest": "sha256:aa", "size": 3,
             "annotations": {FILEPATH_ANNOTATION: "w.bin"}},
            {"mediaType": "application/vnd.cncf.model.doc.v1.raw", "digest": "sha256:bb", "size": 9,
             "annotations": {FILEPATH_ANNOTATION: "model.sig"}},
            {"mediaType": "application/vnd.cncf.model.weight.config.v1.tar", "digest": "sha256:cc", "size": 9,
             "annotations": {FILEPATH_ANNOTATION: "tokenizer/"}},
        ]})
        .to_string();
        let (paths, sig) = manifest_paths(&m);
        assert_eq!(paths, ["w.bin", "model.sig", "tokenizer"]);
        assert_eq!(sig, Some(("sha256:bb".into(), 9, "application/vnd.cncf.model.doc.v1.raw".into())));
    }

    #[test]
    fn a_plan_under_a_policy_serves_its_layers_and_nothing_beside_them() {
        let d = |c: char| format!("sha256:{}", c.to_string().repeat(64));
        let root = std::path::PathBuf::from("/v/cache/model");
        let mut steps = vec![
            Step::FetchBlob { digest: d('a'), size: 3, media_type: "m".into() },
            Step::Unpack { digest: d('a'), format: Archive::Raw, dest: root.join("w.bin") },
            Step::Bind { source: root.clone(), target: "/staging".into(), readonly: true, options: vec![] },
        ];
        let plan = |steps: Vec<Step>| Plan { plugin: "p".into(), digest: String::new(), steps, attributes: vec![] };
        assert_eq!(beside_layers(&plan(steps.clone())), None);
        assert_eq!(layout(&plan(steps.clone())).unwrap()[0].dest, "w.bin");
        let lowered = crate::plan::lazy::lower(plan(steps.clone()), std::path::Path::new("/bin/x")).unwrap();
        assert_eq!(beside_layers(&lowered), None, "the host's own lazy server");
        let mut other = steps.clone();
        other.push(Step::Bind {
            source: "/etc".into(),
            target: "/staging/etc".into(),
            readonly: true,
            options: vec![],
        });
        assert!(beside_layers(&plan(other)).unwrap().contains("/etc"));
        steps.push(Step::Mount {
            fstype: "tmpfs".into(),
            source: "x".into(),
            target: "/staging/x".into(),
            options: vec![],
            readonly: true,
        });
        assert!(beside_layers(&plan(steps)).unwrap().contains("mount"));
    }

    #[test]
    fn a_signature_is_read_from_a_raw_layer_or_a_tar_of_it() {
        assert_eq!(signature_in_layer(b"{}".to_vec(), "application/vnd.cncf.model.doc.v1.raw").unwrap(), b"{}");
        let mut tar = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(2);
        h.set_mode(0o644);
        tar.append_data(&mut h, "model.sig", &b"{}"[..]).unwrap();
        let bytes = tar.into_inner().unwrap();
        assert_eq!(signature_in_layer(bytes.clone(), "application/vnd.cncf.model.doc.v1.tar").unwrap(), b"{}");
        let mut other = tar::Builder::new(Vec::new());
        other.append_data(&mut h, "README.md", &b"{}"[..]).unwrap();
        let err = signature_in_layer(other.into_inner().unwrap(), "application/vnd.cncf.model.doc.v1.tar");
        assert!(err.unwrap_err().contains("no file model.sig"));
    }
}
