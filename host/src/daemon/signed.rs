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
use crate::plan::tar_rules::{Layering, image_layer};
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

/// The signature that verified.
struct Found {
    verified: signing::Verified,
    /// The bundle's digest (a referrer's blob, or the sha256 of the signature file).
    bundle: String,
    found_in: &'static str,
    /// See [`Checked::sig_file`].
    sig_file: Option<String>,
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
    /// The manifest's layers with a path (ModelPack `org.cncf.model.filepath`), for files the
    /// filters leave out.
    artifact_layers: Vec<ArtifactLayer>,
    /// The digests of the layers the plan serves.
    unpacked: BTreeSet<String>,
    /// The sha256 (hex) of the signature file the artifact's `model.sig` layer holds, when it
    /// is a bundle: the one `model.sig` the volume may serve unlisted.
    sig_file: Option<String>,
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

/// A layer of the manifest that names its path.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ArtifactLayer {
    path: String,
    digest: String,
    media_type: String,
}

/// Is `media_type` a ModelPack layer of a class the model plugin's filters select by
/// (`application/vnd.cncf.model.<class>.v1.<format>`)? A signed file in a layer of another type
/// was not left out by a filter.
fn filterable(media_type: &str) -> bool {
    const CLASSES: [&str; 5] = ["weight", "weight.config", "doc", "code", "dataset"];
    const FORMATS: [&str; 4] = ["raw", "tar", "tar+gzip", "tar+zstd"];
    media_type
        .strip_prefix("application/vnd.cncf.model.")
        .is_some_and(|rest| CLASSES.iter().any(|c| FORMATS.iter().any(|f| rest == format!("{c}.v1.{f}"))))
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
/// directory (read-only, that very directory) and run the host's own lazy server; a mount,
/// another program, a writable bind or a bind of anything else would put bytes no signature
/// covers (or a way to change the node's cache) in front of the pod.
fn beside_layers(plan: &Plan) -> Option<String> {
    let root = layout_root(plan)?;
    for step in &plan.steps {
        match step {
            Step::Resolve { .. } | Step::FetchBlob { .. } | Step::Unpack { .. } | Step::Mkdir { .. } => {}
            Step::SpawnFuse { lazy: Some(_), .. } => {}
            Step::Bind { source, readonly, .. } => {
                if *source != root {
                    return Some(format!(
                        "binds {}, not the directory its layers are served from ({})",
                        source.display(),
                        root.display()
                    ));
                }
                if !readonly {
                    return Some(format!("binds {} read-write", source.display()));
                }
            }
            other => return Some(format!("has a {} step", other.kind())),
        }
    }
    None
}

/// The directory a plan serves its layers from: its lazy server's mount point, else the first
/// bind's source that holds every unpack (as `plan::lazy::lower` finds it).
pub fn layout_root(plan: &Plan) -> Option<std::path::PathBuf> {
    if let Some(root) = plan.steps.iter().find_map(|s| match s {
        Step::SpawnFuse { lazy: Some(_), mountpoint, .. } => Some(mountpoint.clone()),
        _ => None,
    }) {
        return Some(root);
    }
    let unpacks: Vec<&std::path::Path> = plan
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Unpack { dest, .. } => Some(dest.as_path()),
            _ => None,
        })
        .collect();
    plan.steps.iter().find_map(|s| match s {
        Step::Bind { source, .. } if !unpacks.is_empty() && unpacks.iter().all(|d| d.starts_with(source)) => {
            Some(source.clone())
        }
        _ => None,
    })
}

/// Why a publish `plan` of a signed volume staged at `staging` shows the pod more than its
/// staged files, read-only, if it does: it may only make directories and bind the staging path
/// (or below it) read-only.
pub fn publish_beside(plan: &Plan, staging: &std::path::Path) -> Option<String> {
    for step in &plan.steps {
        match step {
            Step::Mkdir { .. } => {}
            Step::Bind { source, readonly: true, .. } if source.starts_with(staging) => {}
            Step::Bind { source, readonly, .. } => {
                return Some(if *readonly {
                    format!("binds {}, not the staged volume", source.display())
                } else {
                    format!("binds {} read-write", source.display())
                });
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
pub fn refusal(reference: &str, reason: &'static str, kind: &'static str, why: String) -> Error {
    crate::metrics::global().signature_check(kind, reason);
    warn!(reference = %reference, reason, kind, detail = %why, "{REFUSED}");
    Error::precondition(format!("{REFUSED} for {reference}: {why}"))
}

/// The layers of the manifest that name a path (ModelPack), and the `model.sig` layer if any:
/// `(digest, size, media type)`.
type SigLayer = (String, u64, String);
fn manifest_layers(manifest: &str) -> (Vec<ArtifactLayer>, Option<SigLayer>) {
    let doc: serde_json::Value = serde_json::from_str(manifest).unwrap_or_default();
    let mut layers = Vec::new();
    let mut sig = None;
    for l in doc.get("layers").and_then(|l| l.as_array()).map(Vec::as_slice).unwrap_or_default() {
        let Some(path) = l.get("annotations").and_then(|a| a.get(FILEPATH_ANNOTATION)).and_then(|p| p.as_str()) else {
            continue;
        };
        let path = path.trim_start_matches("./").trim_end_matches('/').to_string();
        let digest = l.get("digest").and_then(|d| d.as_str()).unwrap_or_default().to_string();
        let media_type = l.get("mediaType").and_then(|m| m.as_str()).unwrap_or_default().to_string();
        if path == SIGNATURE_FILE
            && let Some(size) = l.get("size").and_then(|s| s.as_u64())
        {
            sig.get_or_insert((digest.clone(), size, media_type.clone()));
        }
        layers.push(ArtifactLayer { path, digest, media_type });
    }
    (layers, sig)
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

    /// Is volume `st` under a signature policy (its own, or the node's for a plan that names an
    /// OCI artifact)?
    pub(super) fn signed(&self, st: &crate::volume::state::VolumeState) -> bool {
        !st.signed_by.is_empty()
            || st.verified.as_ref().is_some_and(|v| v.signer.is_some())
            || (self.inner.config.signatures.required && names_artifact(&st.plan))
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
        let image = plan.steps.iter().any(|s| matches!(s, Step::Unpack { layering: Layering::Image, .. }))
            || crate::plan::lazy::layers(plan).is_some_and(|l| l.layers.iter().any(|l| image_layer(&l.media_type)));
        if image {
            return Err(refusal(
                reference,
                "unsupported",
                "model",
                "it is an ordinary container image, whose files are the result of its layers applied with \
                 their whiteouts; mounthost verifies the signatures of ModelPack models only"
                    .into(),
            ));
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
        // Under a policy, only a record that satisfies it: signed by an entry it allows, and a
        // lazy volume's index signed too (a volume staged before the policy is checked again).
        let satisfies = |p: &Verification| {
            !policy.required
                || (p.signer.as_ref().is_some_and(|s| policy.signers.is_empty() || policy.signers.contains(s))
                    && (!lazy || p.index_signer.is_some()))
        };
        if let Some((p, _)) =
            pinned.filter(|(p, earlier)| p.manifest == manifest_digest && *earlier == layers && satisfies(p))
        {
            info!(reference = %reference, signer = ?p.signer, index = ?p.index, "restaged: the verification of its first stage stands");
            checked.verification = p.clone();
            checked.enforced = false;
            return Ok(checked);
        }
        let trust = self.trust();
        let allowed = Self::allowed(policy, &trust);
        if policy.required {
            let (artifact_layers, sig_layer) = manifest_layers(manifest);
            let found =
                self.find_model_signature(&trust, &allowed, source, reference, manifest_digest, sig_layer).await?;
            let verified = found.verified;
            checked.verification.signer = Some(verified.signer.clone());
            checked.verification.identity = verified.identity.clone();
            checked.verification.bundle = Some(found.bundle);
            checked.verification.found_in = Some(found.found_in.into());
            checked.files = verified.files;
            checked.artifact_layers = artifact_layers;
            checked.unpacked = layers.iter().map(|l| l.digest.clone()).collect();
            checked.sig_file = found.sig_file;
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
                let in_tar = checked
                    .tar_layers
                    .iter()
                    .any(|(_, d)| d.is_empty() || *path == *d || path.starts_with(&format!("{d}/")));
                if in_tar {
                    checked.unplaced.push(path.clone());
                } else {
                    self.left_out(&checked, path)?;
                }
            }
            crate::metrics::global().signature_check("model", "verified");
            info!(reference = %reference, signer = %verified.signer, found_in = found.found_in, "the model's signature verified");
        }
        if lazy {
            self.check_index(&mut checked, policy, &trust, &allowed, source, reference, manifest_digest).await?;
        }
        Ok(checked)
    }

    /// The first bundle an allowed entry verifies, and where it was found: the artifact's
    /// `model.sig` layer, then the manifest's referrers (fetched and judged one at a time).
    async fn find_model_signature(
        &self,
        trust: &TrustSet,
        allowed: &[String],
        source: &Source,
        reference: &str,
        manifest_digest: &str,
        sig_layer: Option<SigLayer>,
    ) -> Result<Found, Error> {
        let oci = |e: crate::oci::OciError| super::pull::oci_error(e, reference);
        let now = SystemTime::now();
        let mut reasons: Vec<String> = Vec::new();
        let mut first_reason = None;
        let mut sig_file = None;
        let judge = |bytes: &[u8], digest: &str, found_in: &'static str, reasons: &mut Vec<String>| {
            signing::verify(bytes, trust, allowed, MODEL_PREDICATE, now).map_err(|r| {
                reasons.push(format!("the bundle {digest} ({found_in}): {r}"));
                r.reason
            })
        };
        let seen_layer = sig_layer.is_some();
        if let Some((digest, size, media)) = sig_layer {
            let read = self.inner.artifacts.signature_blob(source, &digest, size).await;
            match read.map_err(|e| e.to_string()).and_then(|b| signature_in_layer(b, &media)) {
                Ok(bytes) => {
                    let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
                    match judge(&bytes, &digest, SIGNATURE_FILE, &mut reasons) {
                        Ok(v) => {
                            let bundle = format!("sha256:{sha}");
                            return Ok(Found { verified: v, bundle, found_in: SIGNATURE_FILE, sig_file: Some(sha) });
                        }
                        // A bundle, another signer's or the wrong one: served as the file it is.
                        Err(reason) if reason != "malformed" => {
                            sig_file = Some(sha);
                            first_reason.get_or_insert(reason);
                        }
                        Err(reason) => _ = first_reason.get_or_insert(reason),
                    }
                }
                Err(e) => reasons.push(format!("its {SIGNATURE_FILE} layer {digest}: {e}")),
            }
        }
        let referrers =
            self.inner.artifacts.bundle_referrers(source, manifest_digest, MODEL_PREDICATE).await.map_err(oci)?;
        if referrers.is_empty() && !seen_layer {
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
        for (digest, size) in referrers {
            let bytes = match self.inner.artifacts.signature_blob(source, &digest, size).await {
                Ok(b) => b,
                Err(e) => {
                    reasons.push(format!("the bundle {digest} (referrer): {e}"));
                    continue;
                }
            };
            match judge(&bytes, &digest, "referrer", &mut reasons) {
                Ok(v) => return Ok(Found { verified: v, bundle: digest, found_in: "referrer", sig_file }),
                Err(reason) => _ = first_reason.get_or_insert(reason),
            }
        }
        Err(refusal(
            reference,
            first_reason.unwrap_or("unsigned"),
            "model",
            format!("no signature verifies against trust entries {}: {}", allowed_text(allowed), reasons.join("; ")),
        ))
    }

    /// A served file at `path` whose sha256 is `hex` (`None`: a symbolic link) must be listed
    /// with that sha256; the one exception is `model.sig` at the root holding exactly the
    /// signature file the artifact's `model.sig` layer holds.
    fn check_file(&self, c: &Checked, path: &str, hex: Option<&str>) -> Result<(), Error> {
        let Some(hex) = hex else {
            return Err(refusal(
                &c.reference,
                "symlink",
                "model",
                format!("{path} is a symbolic link, which no model signature lists"),
            ));
        };
        if path == SIGNATURE_FILE && c.sig_file.as_deref().is_some_and(|s| s.eq_ignore_ascii_case(hex)) {
            return Ok(());
        }
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

    /// A signed file the volume does not serve: fine only when the layers of the artifact that
    /// hold it are ModelPack layers the plan does not mount (the volume's filters left them
    /// out); a refusal when none holds it (the artifact lacks it), when a layer the plan mounts
    /// should hold it and does not, and when its layer is of a type the plugin does not read.
    fn left_out(&self, c: &Checked, path: &str) -> Result<(), Error> {
        let holding: Vec<&ArtifactLayer> =
            c.artifact_layers.iter().filter(|l| l.path == path || path.starts_with(&format!("{}/", l.path))).collect();
        let missing = |why: String| Err(refusal(&c.reference, "missing", "model", why));
        if holding.is_empty() {
            return missing(format!("the signature lists {path}, which the artifact lacks"));
        }
        if let Some(l) = holding.iter().find(|l| c.unpacked.contains(&l.digest)) {
            return missing(format!(
                "the signature lists {path}, which layer {} ({}) should hold and does not",
                l.digest, l.path
            ));
        }
        if let Some(l) = holding.iter().find(|l| !filterable(&l.media_type)) {
            return missing(format!(
                "the signature lists {path}, whose layer {} has media type {:?}, which no filter selects: the volume would \
                 lack it",
                l.digest, l.media_type
            ));
        }
        Ok(())
    }

    /// Round 2 (blocking): the files of every tar layer the volume serves, hashed from its
    /// unpacked tree in the node's cache, and the signed files round 1 could not place.
    pub(super) fn check_trees(&self, c: &Checked) -> Result<(), Error> {
        if !c.needs_trees() {
            return Ok(());
        }
        let mut served = BTreeSet::new();
        for (digest, dest) in &c.tar_layers {
            let files = self.inner.artifacts.tree_files(digest).map_err(|e| match e.kind() {
                std::io::ErrorKind::InvalidData => refusal(
                    &c.reference,
                    "unsupported",
                    "model",
                    format!("layer {digest} holds a file no signature can name: {e}"),
                ),
                _ => Error::unavailable(format!(
                    "reading the unpacked layer {digest} of {} in the node's cache: {e}",
                    c.reference
                )),
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
        for path in c.unplaced.iter().filter(|p| !served.contains(*p)) {
            self.left_out(c, path)?;
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
            self.inner.artifacts.bundle_referrers(source, manifest_digest, INDEX_PREDICATE).await.map_err(oci)?;
        let now = SystemTime::now();
        let mut reasons = Vec::new();
        let mut first_reason = "no_index";
        for (bdigest, size) in bundles {
            let bytes = match self.inner.artifacts.signature_blob(source, &bdigest, size).await {
                Ok(b) => b,
                Err(e) => {
                    reasons.push(format!("the bundle {bdigest}: {e}"));
                    continue;
                }
            };
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
        let (layers, sig) = manifest_layers(&m);
        let paths: Vec<&str> = layers.iter().map(|l| l.path.as_str()).collect();
        assert_eq!(paths, ["w.bin", "model.sig", "tokenizer"]);
        assert!(filterable(&layers[0].media_type) && filterable(&layers[2].media_type));
        assert!(!filterable("application/vnd.cncf.model.weight.v2.raw") && !filterable("application/octet-stream"));
        assert_eq!(sig, Some(("sha256:bb".into(), 9, "application/vnd.cncf.model.doc.v1.raw".into())));
    }

    #[test]
    fn a_plan_under_a_policy_serves_its_layers_and_nothing_beside_them() {
        let d = |c: char| format!("sha256:{}", c.to_string().repeat(64));
        let root = std::path::PathBuf::from("/v/cache/model");
        let mut steps = vec![
            Step::FetchBlob { digest: d('a'), size: 3, media_type: "m".into() },
            Step::Unpack {
                digest: d('a'),
                format: Archive::Raw,
                dest: root.join("w.bin"),
                layering: Default::default(),
            },
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
        let mut writable = steps.clone();
        writable[2] = Step::Bind { source: root.clone(), target: "/staging".into(), readonly: false, options: vec![] };
        assert!(beside_layers(&plan(writable)).unwrap().contains("read-write"));
        let mut file = steps.clone();
        file.push(Step::Bind {
            source: root.join("w.bin"),
            target: "/staging/model.safetensors".into(),
            readonly: true,
            options: vec![],
        });
        assert!(beside_layers(&plan(file)).unwrap().contains("w.bin"), "a file of the layers under another name");
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
    fn a_signed_volumes_publication_binds_its_staged_files_read_only_and_nothing_else() {
        let staging = std::path::Path::new("/k/staging");
        let plan = |steps: Vec<Step>| Plan { plugin: "p".into(), digest: String::new(), steps, attributes: vec![] };
        let bind = |source: &str, readonly| Step::Bind {
            source: source.into(),
            target: "/k/t".into(),
            readonly,
            options: vec![],
        };
        assert_eq!(
            publish_beside(&plan(vec![Step::Mkdir { path: "/k/t".into() }, bind("/k/staging", true)]), staging),
            None
        );
        assert!(publish_beside(&plan(vec![bind("/k/staging", false)]), staging).unwrap().contains("read-write"));
        assert!(publish_beside(&plan(vec![bind("/etc", true)]), staging).unwrap().contains("/etc"));
        let mount = Step::Mount {
            fstype: "tmpfs".into(),
            source: "x".into(),
            target: "/k/t".into(),
            options: vec![],
            readonly: true,
        };
        assert!(publish_beside(&plan(vec![mount]), staging).unwrap().contains("mount"));
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
