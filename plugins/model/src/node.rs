//! The node side: NodeStageVolume lays the model's files out read-only at the staging path,
//! NodePublishVolume binds them into the pod, and a pod's dynamic mount lays another model out
//! read-only at its own directory, `mounts/<id>/` in the published volume.
//!
//! Stage runs in two rounds, because the plugin cannot plan fetches before it has seen the
//! manifest and never touches the network itself:
//!
//! 1. without `resolved`, the plan is one `resolve` step; the host resolves the reference
//!    (registry auth by secret key, TLS, the mirror) and calls stage again;
//! 2. with `resolved`, the plan repeats the same `resolve` step, then one `fetch-blob` per
//!    selected layer (digest, size and media type from the manifest, so the host verifies each
//!    blob), one `unpack` per layer into the volume's cache directory `model/` (tar layers
//!    unpack there, a raw layer becomes `model/<file path>`), and a read-only bind of `model/`
//!    onto the staging path with `nosuid,nodev`.
//!
//! A dynamic mount plans the same two rounds with the same steps (one code path,
//! `plan_model`), with three differences: the model and its filters come from the pod's
//! request and only `mirror` and `insecure` from the volume ([`Settings::dynamic`]); the
//! `resolve` step names no secret (the plugin gets none: the host gives the mount the volume's
//! own credentials for the registries its StorageClass names); and the bind goes
//! onto `target`, which the host maps to the mount's own directory, its `cache` being a
//! directory of that mount alone. The resolution reaches the second round in `recorded`, under
//! the SDK's reserved keys ([`resolved_from_recorded`]), because the contract's
//! `dynamic-mount-request` has no `resolved` field.
//!
//! Plans are diffed against what the node already has, so the same request gives a
//! byte-identical plan: steps follow the manifest's layer order, and the reference is always
//! written in its canonical form. A model volume is read-only whatever access mode is asked:
//! kubelet gives inline volumes `single-node-writer`, so writer modes are not refused.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use mounthost_plugin_sdk::params::invalid;
use mounthost_plugin_sdk::{
    Archive, BackendError, Bind, CONTRACT_VERSION, DynamicMountRequest, FetchBlob, ParamSource, PathRef, Plan,
    PublishRequest, RESOLVED_KEYS, RegistryAuth, Resolve, Resolved, StageRequest, Step, Unpack, VolumeCapability,
    cache, kv, resolved_from_recorded, staging, target,
};

use crate::manifest::{self, Artifact, Image, Layer, Parsed};
use crate::params::{self, Settings};
use crate::reference::is_sha256_digest;

/// The volume's cache directory the files are laid out in.
pub const MODEL_DIR: &str = "model";

/// Mount flags of every bind: a model holds files to read, never programs to run as root or
/// device nodes.
pub const BIND_OPTIONS: [&str; 2] = ["nosuid", "nodev"];

/// How many skipped layers a log line names.
const SKIPPED_SHOWN: usize = 5;
/// How many file paths a "nothing selected" message names.
const PATHS_SHOWN: usize = 10;

/// A stage plan and the lines the host should log about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Staged {
    /// The plan.
    pub plan: Plan,
    /// Notes for the host's log (skipped layers), at most one per call.
    pub notes: Vec<String>,
}

/// Plan NodeStageVolume (both rounds): the files land read-only on the staging path.
pub fn stage(req: &StageRequest) -> Result<Staged, BackendError> {
    let ctx = params::open(&req.context, ParamSource::Context)?;
    let settings = Settings::parse(&ctx)?;
    let auth = params::registry_auth(&req.secrets)?;
    check_capability(&req.capability)?;
    plan_model(&settings, auth, req.resolved.as_ref(), staging(""))
}

/// Plan a pod's dynamic mount (both rounds): the model the pod names, with the filters it
/// gives and the volume's `mirror` and `insecure`, its `resolve` step naming no secret (the
/// host adds the volume's credentials where they belong), lands read-only on the mount's own
/// directory (`target`), laid out in the mount's own cache directory as a stage
/// lays it out in the volume's. The resolution of the second round arrives in `recorded`
/// ([`resolved_from_recorded`]); some of its keys without the others is a host bug, refused
/// as an internal error rather than taken for a first round.
pub fn dynamic_mount(req: &DynamicMountRequest) -> Result<Staged, BackendError> {
    if !req.subdir.is_empty() {
        return Err(BackendError::Internal(format!(
            "the host asked for a dynamic mount into sub-directory {:?}, but this plugin plans \
             onto the mount's own directory (contract mounthost:plugin@{CONTRACT_VERSION}: target is \
             mounts/<id>, subdir empty): the host and the plugin disagree on the contract",
            req.subdir
        )));
    }
    let resolved = resolved_from_recorded(&req.recorded);
    if resolved.is_none() {
        let given: Vec<&str> =
            RESOLVED_KEYS.into_iter().filter(|k| req.recorded.iter().any(|kv| kv.key == *k)).collect();
        if !given.is_empty() {
            return Err(BackendError::Internal(format!(
                "the host passed the resolution keys {} but not all of {}: the host and the plugin \
                 disagree on the contract",
                given.join(", "),
                RESOLVED_KEYS.join(", ")
            )));
        }
    }
    let settings = Settings::dynamic(&req.request, &req.context)?;
    plan_model(&settings, RegistryAuth::Anonymous, resolved.as_ref(), target(""))
}

/// Plan either round for a model: without `resolved`, one `resolve` step; with it, that step,
/// the fetches and unpacks of the selected layers into the cache directory [`MODEL_DIR`], and
/// a read-only bind of it onto `onto`.
fn plan_model(
    settings: &Settings,
    auth: RegistryAuth,
    resolved: Option<&Resolved>,
    onto: PathRef,
) -> Result<Staged, BackendError> {
    let resolve = Resolve::new(settings.reference.canonical())
        .with_mirror(settings.mirror.clone())
        .with_auth(auth)
        .with_insecure(settings.insecure);
    let Some(resolved) = resolved else {
        return Ok(Staged { plan: Plan::new([Step::Resolve(resolve)]), notes: Vec::new() });
    };
    if resolved.reference != resolve.reference {
        return Err(BackendError::Internal(format!(
            "the host resolved {:?}, but the plan asked for {:?}",
            resolved.reference, resolve.reference
        )));
    }
    if !is_sha256_digest(&resolved.manifest_digest) {
        return Err(BackendError::Internal(format!(
            "the host resolved {} to manifest digest {:?}, which is not sha256:<64 hex>",
            resolve.reference, resolved.manifest_digest
        )));
    }
    let artifact = match manifest::read(&resolve.reference, &resolved.manifest, &resolved.config)? {
        Parsed::Model(artifact) => artifact,
        Parsed::Image(image) => return plan_image(settings, resolve, resolved, &image, onto),
    };
    if let Some(path) = &settings.path {
        return Err(invalid(format!(
            "parameter \"path\" ({path:?}) mounts a directory of an ordinary container image, but {} \
             is a ModelPack model; select its files with include and exclude",
            resolve.reference
        )));
    }
    let selected: Vec<&Layer> = artifact.layers.iter().filter(|l| settings.filters.selects(&l.path, l.class)).collect();
    if selected.is_empty() {
        return Err(nothing_selected(&resolve.reference, settings, &artifact));
    }
    check_layout(&resolve.reference, &selected)?;

    let mut steps = vec![Step::Resolve(resolve.clone())];
    // Two layers may share a blob (the same file under two paths): fetch it once, and unpack
    // a shared archive once.
    let mut fetched = BTreeSet::new();
    for layer in selected.iter().filter(|l| fetched.insert(l.digest.as_str())) {
        steps.push(Step::FetchBlob(FetchBlob::new(layer.digest.clone(), layer.size, layer.media_type.clone())));
    }
    let mut unpacked = BTreeSet::new();
    for layer in &selected {
        let dest = match layer.format {
            Archive::Raw => format!("{MODEL_DIR}/{}", layer.path),
            // Tar, TarGzip, TarZstd (the only other formats `manifest::classify` gives): an
            // archive holding the file under its path, unpacked into the directory.
            _ => MODEL_DIR.to_string(),
        };
        if unpacked.insert((layer.digest.as_str(), dest.clone())) {
            steps.push(Step::Unpack(Unpack::new(layer.digest.clone(), layer.format, cache(&dest))));
        }
    }
    steps.push(Step::Bind(
        Bind::new(cache(MODEL_DIR), onto).with_readonly(true).with_options(BIND_OPTIONS.map(String::from)),
    ));
    let notes = skipped_note(&resolve.reference, &artifact).into_iter().collect();
    Ok(Staged {
        plan: Plan::new(steps).with_attributes([
            kv("reference", resolve.reference),
            kv("manifestDigest", resolved.manifest_digest.as_str()),
            kv("files", selected.len().to_string()),
        ]),
        notes,
    })
}

/// Plan the second round for an ordinary container image: the same `resolve`, one `fetch-blob`
/// per distinct layer blob, one `unpack` per layer in manifest order (bottom first) into
/// [`MODEL_DIR`] (the host applies an image layer's whiteouts and keeps its owners and modes,
/// because the blob's media type says it is one), and a read-only bind of `model/` or of the
/// directory `path` names in it. Layers are never deduplicated among the unpacks: a blob
/// applied twice (an empty layer, say) is applied in both places, as a runtime would.
fn plan_image(
    settings: &Settings,
    resolve: Resolve,
    resolved: &Resolved,
    image: &Image,
    onto: PathRef,
) -> Result<Staged, BackendError> {
    if !settings.filter_keys.is_empty() {
        return Err(invalid(format!(
            "parameter(s) {} select files of a ModelPack model, but {} is an ordinary container \
             image: its layers have no classes and are applied whole, in order; remove them, and \
             mount one directory of the image with parameter \"path\" (such as /models)",
            settings.filter_keys.join(", "),
            resolve.reference
        )));
    }
    let mut steps = vec![Step::Resolve(resolve.clone())];
    let mut fetched = BTreeSet::new();
    for layer in image.layers.iter().filter(|l| fetched.insert(l.digest.as_str())) {
        steps.push(Step::FetchBlob(FetchBlob::new(layer.digest.clone(), layer.size, layer.media_type.clone())));
    }
    for layer in &image.layers {
        steps.push(Step::Unpack(Unpack::new(layer.digest.clone(), layer.format, cache(MODEL_DIR))));
    }
    let source = match &settings.path {
        Some(path) => format!("{MODEL_DIR}/{path}"),
        None => MODEL_DIR.to_string(),
    };
    steps.push(Step::Bind(
        Bind::new(cache(&source), onto).with_readonly(true).with_options(BIND_OPTIONS.map(String::from)),
    ));
    let notes = foreign_note(&resolve.reference, image).into_iter().collect();
    let mut attributes = vec![
        kv("reference", resolve.reference),
        kv("manifestDigest", resolved.manifest_digest.as_str()),
        kv("image", "true"),
        kv("layers", image.layers.len().to_string()),
    ];
    if let Some(path) = &settings.path {
        attributes.push(kv("path", format!("/{path}")));
    }
    Ok(Staged { plan: Plan::new(steps).with_attributes(attributes), notes })
}

/// One log line naming the foreign layers an image's tree is built without, if any.
fn foreign_note(reference: &str, image: &Image) -> Option<String> {
    if image.skipped.is_empty() {
        return None;
    }
    let shown: Vec<String> =
        image.skipped.iter().take(SKIPPED_SHOWN).map(|s| format!("layers[{}] ({})", s.index, s.media_type)).collect();
    let more = image.skipped.len().saturating_sub(SKIPPED_SHOWN);
    Some(format!(
        "image {reference}: skipped {} foreign layer(s), whose blobs live outside the registry and are \
         never fetched: {}{}; the volume's tree is built without them",
        image.skipped.len(),
        shown.join(", "),
        if more > 0 { format!(" and {more} more") } else { String::new() }
    ))
}

/// Plan NodePublishVolume: bind the staged files onto the target, always read-only.
pub fn publish(req: &PublishRequest) -> Result<Plan, BackendError> {
    check_capability(&req.capability)?;
    Ok(Plan::new([Step::Bind(
        Bind::new(staging(""), target("")).with_readonly(true).with_options(BIND_OPTIONS.map(String::from)),
    )]))
}

/// A capability a model volume can serve: no fsType (it is a bind mount of files, not a
/// filesystem) and no mount flags but `ro` and `rw`, both ignored (it is always read-only).
pub fn check_capability(cap: &VolumeCapability) -> Result<(), BackendError> {
    if !cap.fs_type.is_empty() {
        return Err(invalid(format!(
            "fsType {:?} is not supported: a model volume is a read-only bind mount of files, not a \
             filesystem; leave fsType empty (no csi.storage.k8s.io/fstype parameter, no fsType in the PV)",
            cap.fs_type
        )));
    }
    for flag in &cap.mount_flags {
        for item in flag.split(',') {
            if item != "ro" && item != "rw" {
                return Err(invalid(format!(
                    "mount flag {item:?} is not supported: a model volume is always mounted read-only \
                     with nosuid,nodev; only ro and rw (both ignored) are accepted"
                )));
            }
        }
    }
    Ok(())
}

/// Two selected layers must not claim the same path, and a raw file cannot be the parent
/// directory of another layer's path: the host could not lay both out. Sorted lookups, so a
/// model of many thousand files stays well inside the call's deadline.
fn check_layout(reference: &str, selected: &[&Layer]) -> Result<(), BackendError> {
    let clash = |a: &Layer, b: &Layer, why: String| {
        let (first, second) = if a.index < b.index { (a, b) } else { (b, a) };
        invalid(format!(
            "layers[{}] and layers[{}] of {reference} {why}; select one of them with parameter \
             \"include\" or \"exclude\"",
            first.index, second.index
        ))
    };
    let mut by_path: BTreeMap<&str, &Layer> = BTreeMap::new();
    for layer in selected {
        if let Some(earlier) = by_path.insert(&layer.path, layer) {
            return Err(clash(earlier, layer, format!("both carry the file path {:?}", layer.path)));
        }
    }
    for file in selected.iter().filter(|l| l.format == Archive::Raw) {
        let dir = format!("{}/", file.path);
        let below = by_path.range::<str, _>((Bound::Included(dir.as_str()), Bound::Unbounded)).next();
        if let Some((path, child)) = below.filter(|(path, _)| path.starts_with(&dir)) {
            return Err(clash(file, child, format!("{:?} is a file but {path:?} needs it as a directory", file.path)));
        }
    }
    Ok(())
}

/// The error for an artifact none of whose layers the filters select.
fn nothing_selected(reference: &str, settings: &Settings, artifact: &Artifact) -> BackendError {
    if artifact.layers.is_empty() {
        let types: Vec<&str> = artifact.skipped.iter().map(|s| s.media_type.as_str()).collect();
        return invalid(format!(
            "{reference} has no ModelPack layer this plugin reads: its {} layers have the media types {}, \
             none of them application/vnd.cncf.model.<weight|weight.config|doc|code|dataset>.v1.<raw|tar|tar+gzip|tar+zstd>",
            types.len(),
            dedup(types).join(", ")
        ));
    }
    let paths: Vec<String> =
        artifact.layers.iter().take(PATHS_SHOWN).map(|l| format!("{} ({})", l.path, l.class.name())).collect();
    let more = artifact.layers.len().saturating_sub(PATHS_SHOWN);
    invalid(format!(
        "the filters ({}) select none of the {} model files of {reference}: {}{}; change parameters \
         include, exclude, weights or types",
        settings.filters.describe(),
        artifact.layers.len(),
        paths.join(", "),
        if more > 0 { format!(" and {more} more") } else { String::new() }
    ))
}

/// One log line naming the layers skipped for their media type, if any.
fn skipped_note(reference: &str, artifact: &Artifact) -> Option<String> {
    if artifact.skipped.is_empty() {
        return None;
    }
    let shown: Vec<String> = artifact
        .skipped
        .iter()
        .take(SKIPPED_SHOWN)
        .map(|s| format!("layers[{}] ({})", s.index, s.media_type))
        .collect();
    let more = artifact.skipped.len().saturating_sub(SKIPPED_SHOWN);
    Some(format!(
        "{reference}: skipped {} layer(s) whose media type is not a ModelPack layer type: {}{}",
        artifact.skipped.len(),
        shown.join(", "),
        if more > 0 { format!(" and {more} more") } else { String::new() }
    ))
}

fn dedup(mut v: Vec<&str>) -> Vec<&str> {
    let mut seen = Vec::new();
    v.retain(|t| {
        let new = !seen.contains(t);
        seen.push(*t);
        new
    });
    v
}
