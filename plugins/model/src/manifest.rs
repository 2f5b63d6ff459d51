//! Reading the manifest and config the host resolved: which layers hold which files.
//!
//! A ModelPack artifact (CNCF model-spec v1) is an OCI image manifest whose `artifactType` is
//! `application/vnd.cncf.model.manifest.v1+json` or whose config has the media type
//! `application/vnd.cncf.model.config.v1+json`. Tools that cannot set `artifactType` push
//! ordinary image manifests; those are accepted too when their layers carry the
//! `org.cncf.model.filepath` annotation. Each layer is one file or directory:
//! `application/vnd.cncf.model.<class>.v1.<format>`, where the class is `weight`,
//! `weight.config`, `doc`, `code` or `dataset` and the format `raw` (the file itself) or `tar`,
//! `tar+gzip`, `tar+zstd` (an archive holding it under its path). A layer of another media type
//! is skipped (and the host logs it), not refused: a newer model-spec may add classes.
//!
//! Everything here comes from a registry, so it is checked before it reaches a plan: digests
//! are `sha256:<64 hex>`, file paths relative without `.`, `..` or empty components.

use std::collections::BTreeMap;

use mounthost_plugin_sdk::params::invalid;
use mounthost_plugin_sdk::{Archive, BackendError};
use serde::Deserialize;

use crate::filters::Class;
use crate::reference::is_sha256_digest;

/// `artifactType` of a ModelPack manifest.
pub const MODEL_ARTIFACT_TYPE: &str = "application/vnd.cncf.model.manifest.v1+json";
/// Media type of a ModelPack config.
pub const MODEL_CONFIG_TYPE: &str = "application/vnd.cncf.model.config.v1+json";
/// The layer annotation naming the file's path in the model.
pub const FILEPATH_ANNOTATION: &str = "org.cncf.model.filepath";
/// Media type of an OCI image manifest.
pub const OCI_MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// Media type of a Docker image manifest (schema 2).
pub const DOCKER_MANIFEST_TYPE: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// Media types of the layers of ordinary container images (OCI and Docker), each a changeset
/// the host applies in order with its whiteouts, and how each is packed.
pub const IMAGE_LAYER_TYPES: [(&str, Archive); 5] = [
    ("application/vnd.oci.image.layer.v1.tar", Archive::Tar),
    ("application/vnd.oci.image.layer.v1.tar+gzip", Archive::TarGzip),
    ("application/vnd.oci.image.layer.v1.tar+zstd", Archive::TarZstd),
    ("application/vnd.docker.image.rootfs.diff.tar", Archive::Tar),
    ("application/vnd.docker.image.rootfs.diff.tar.gzip", Archive::TarGzip),
];
/// Foreign (non-distributable) layers: their blobs live at `urls` outside the registry, which
/// the host never contacts; they are skipped.
const FOREIGN_LAYER_TYPES: [&str; 4] = [
    "application/vnd.oci.image.layer.nondistributable.v1.tar",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
];
/// Prefix of ModelPack layer media types.
const LAYER_PREFIX: &str = "application/vnd.cncf.model.";
/// Longest file path accepted (the host's plan texts are bounded).
pub const MAX_FILE_PATH: usize = 4000;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    // Optional here so that an index or a Docker manifest is named as such below, not
    // reported as a missing field.
    #[serde(default)]
    schema_version: Option<u32>,
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    artifact_type: Option<String>,
    #[serde(default)]
    config: Option<Descriptor>,
    #[serde(default)]
    layers: Vec<Descriptor>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    media_type: String,
    digest: String,
    size: u64,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    #[serde(default)]
    urls: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct ModelConfig {
    modelfs: ModelFs,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ModelFs {
    #[serde(rename = "type")]
    kind: String,
    diff_ids: Vec<String>,
}

/// One model layer the plugin understands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    /// Its index in the manifest's `layers`.
    pub index: usize,
    /// `sha256:<64 hex>`.
    pub digest: String,
    /// Size in bytes.
    pub size: u64,
    /// The media type, as the manifest gives it.
    pub media_type: String,
    /// What it holds.
    pub class: Class,
    /// How it is packed.
    pub format: Archive,
    /// The file's (or directory's) path in the model, checked.
    pub path: String,
}

/// A layer left out because its media type is not a ModelPack layer type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Its index in the manifest's `layers`.
    pub index: usize,
    /// Its media type.
    pub media_type: String,
}

/// The model layers of a resolved artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    /// Layers of a known media type, in manifest order.
    pub layers: Vec<Layer>,
    /// Layers of other media types, in manifest order.
    pub skipped: Vec<Skipped>,
}

/// One layer of an ordinary container image: a changeset of the image's tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageLayer {
    /// Its index in the manifest's `layers`.
    pub index: usize,
    /// `sha256:<64 hex>`.
    pub digest: String,
    /// Size in bytes.
    pub size: u64,
    /// The media type, as the manifest gives it.
    pub media_type: String,
    /// How it is packed.
    pub format: Archive,
}

/// The layers of an ordinary container image, bottom first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// Every layer the host applies, in manifest order.
    pub layers: Vec<ImageLayer>,
    /// Foreign layers (blobs outside the registry), left out.
    pub skipped: Vec<Skipped>,
}

/// What a resolved reference holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// A ModelPack model: one file (or directory) per layer.
    Model(Artifact),
    /// An ordinary container image: layers applied in order.
    Image(Image),
}

/// Read the manifest and config the host resolved for `reference`: a ModelPack model, or an
/// ordinary container image (OCI or Docker schema 2) whose layers are all image layers (or
/// foreign ones).
pub fn read(reference: &str, manifest: &str, config: &str) -> Result<Parsed, BackendError> {
    if let Some(image) = image(reference, manifest)? {
        return Ok(Parsed::Image(image));
    }
    parse(reference, manifest, config).map(Parsed::Model)
}

/// The image `manifest` describes, or `None` when it is not an ordinary image (a ModelPack
/// manifest, or anything [`parse`] explains better).
fn image(reference: &str, manifest: &str) -> Result<Option<Image>, BackendError> {
    let Ok(m) = serde_json::from_str::<Manifest>(manifest) else { return Ok(None) };
    let docker = m.media_type.as_deref() == Some(DOCKER_MANIFEST_TYPE);
    let oci = m.media_type.as_deref().is_none_or(|t| t == OCI_MANIFEST_TYPE);
    let config_type = m.config.as_ref().map(|c| c.media_type.as_str()).unwrap_or_default();
    if m.schema_version != Some(2)
        || !(docker || oci)
        || m.layers.is_empty()
        || m.artifact_type.as_deref() == Some(MODEL_ARTIFACT_TYPE)
        || config_type == MODEL_CONFIG_TYPE
        || m.layers.iter().any(|l| l.annotations.contains_key(FILEPATH_ANNOTATION))
        || !m.layers.iter().any(|l| image_format(&l.media_type).is_some())
    {
        return Ok(None);
    }
    let mut image = Image { layers: Vec::new(), skipped: Vec::new() };
    for (index, d) in m.layers.into_iter().enumerate() {
        let name = || format!("layers[{index}] ({}) of image {reference}", d.media_type);
        if FOREIGN_LAYER_TYPES.contains(&d.media_type.as_str()) || !d.urls.is_empty() {
            image.skipped.push(Skipped { index, media_type: d.media_type });
            continue;
        }
        let format = image_format(&d.media_type).ok_or_else(|| {
            invalid(format!(
                "{}: not an image layer media type ({}), so the image's tree cannot be built",
                name(),
                IMAGE_LAYER_TYPES.map(|(t, _)| t).join(", ")
            ))
        })?;
        if !is_sha256_digest(&d.digest) {
            return Err(invalid(format!(
                "{}: digest {:?} is not sha256: and 64 lower-case hex digits",
                name(),
                d.digest
            )));
        }
        image.layers.push(ImageLayer { index, digest: d.digest, size: d.size, media_type: d.media_type, format });
    }
    if image.layers.is_empty() {
        return Err(invalid(format!(
            "image {reference} has only foreign layers (blobs outside the registry, which the host never fetches)"
        )));
    }
    Ok(Some(image))
}

/// How an image layer of `media_type` is packed; `None` for other media types.
pub fn image_format(media_type: &str) -> Option<Archive> {
    IMAGE_LAYER_TYPES.iter().find(|(t, _)| *t == media_type).map(|(_, f)| *f)
}

/// Read the manifest and config the host resolved for `reference`.
pub fn parse(reference: &str, manifest: &str, config: &str) -> Result<Artifact, BackendError> {
    let m: Manifest = serde_json::from_str(manifest).map_err(|e| {
        invalid(format!(
            "the manifest of {reference} is not an OCI image manifest ({e}); the reference must name a ModelPack model or a container image"
        ))
    })?;
    if let Some(t) = m.media_type.as_deref().filter(|t| *t != OCI_MANIFEST_TYPE) {
        return Err(invalid(format!(
            "{reference} is a {t}, not an OCI image manifest ({OCI_MANIFEST_TYPE}); the reference must name a ModelPack model or a container image"
        )));
    }
    if m.schema_version != Some(2) {
        let v = m.schema_version.map_or_else(|| "none".to_string(), |v| v.to_string());
        return Err(invalid(format!(
            "the manifest of {reference} has schemaVersion {v}, not 2: it is not an OCI image manifest"
        )));
    }
    let config_type = match &m.config {
        Some(c) => c.media_type.as_str(),
        None => {
            return Err(invalid(format!("the manifest of {reference} has no config: it is not an OCI image manifest")));
        }
    };
    if m.layers.is_empty() {
        return Err(BackendError::NotFound(format!("{reference} has no layers: there is no model file to mount")));
    }
    let is_model = m.artifact_type.as_deref() == Some(MODEL_ARTIFACT_TYPE) || config_type == MODEL_CONFIG_TYPE;
    if !is_model && !m.layers.iter().any(|l| l.annotations.contains_key(FILEPATH_ANNOTATION)) {
        return Err(invalid(format!(
            "{reference} is neither a ModelPack model nor a container image: its manifest has neither \
             artifactType {MODEL_ARTIFACT_TYPE} nor a config of media type {MODEL_CONFIG_TYPE}, no \
             layer carries the {FILEPATH_ANNOTATION} annotation, and no layer is an image layer"
        )));
    }
    if config_type == MODEL_CONFIG_TYPE {
        check_config(reference, config, m.layers.len())?;
    }

    let mut layers = Vec::new();
    let mut skipped = Vec::new();
    for (index, d) in m.layers.into_iter().enumerate() {
        let Some((class, format)) = classify(&d.media_type) else {
            skipped.push(Skipped { index, media_type: d.media_type });
            continue;
        };
        let name = || format!("layers[{index}] ({}) of {reference}", d.media_type);
        if !is_sha256_digest(&d.digest) {
            return Err(invalid(format!(
                "{}: digest {:?} is not sha256: and 64 lower-case hex digits",
                name(),
                d.digest
            )));
        }
        let path = d.annotations.get(FILEPATH_ANNOTATION).ok_or_else(|| {
            invalid(format!("{}: the layer has no {FILEPATH_ANNOTATION} annotation, so its file has no path", name()))
        })?;
        check_file_path(path).map_err(|why| {
            invalid(format!(
                "{}: its {FILEPATH_ANNOTATION} {path:?} is not a file path this plugin takes ({why})",
                name()
            ))
        })?;
        layers.push(Layer {
            index,
            path: path.clone(),
            digest: d.digest,
            size: d.size,
            media_type: d.media_type,
            class,
            format,
        });
    }
    Ok(Artifact { layers, skipped })
}

/// A ModelPack config: `modelfs.type` is `layers` and `modelfs.diffIds` has one entry per layer.
fn check_config(reference: &str, config: &str, layers: usize) -> Result<(), BackendError> {
    let c: ModelConfig = serde_json::from_str(config)
        .map_err(|e| invalid(format!("the config of {reference} is not a ModelPack model config ({e})")))?;
    if c.modelfs.kind != "layers" {
        return Err(invalid(format!(
            "the config of {reference} has modelfs.type {:?}; only \"layers\" is supported",
            c.modelfs.kind
        )));
    }
    if c.modelfs.diff_ids.len() != layers {
        return Err(invalid(format!(
            "the config of {reference} lists {} modelfs.diffIds for {layers} layers in its manifest; \
             the artifact is inconsistent, push it again",
            c.modelfs.diff_ids.len()
        )));
    }
    Ok(())
}

/// The class and format of a ModelPack layer media type; `None` for any other media type.
pub fn classify(media_type: &str) -> Option<(Class, Archive)> {
    let (class, format) = media_type.strip_prefix(LAYER_PREFIX)?.split_once(".v1.")?;
    let class = match class {
        "weight" => Class::Weight,
        "weight.config" => Class::Config,
        "doc" => Class::Doc,
        "code" => Class::Code,
        "dataset" => Class::Dataset,
        _ => return None,
    };
    let format = match format {
        "raw" => Archive::Raw,
        "tar" => Archive::Tar,
        "tar+gzip" => Archive::TarGzip,
        "tar+zstd" => Archive::TarZstd,
        _ => return None,
    };
    Some((class, format))
}

/// A file path in the model: relative, `/`-separated, no empty, `.` or `..` components, no
/// control characters, at most [`MAX_FILE_PATH`] bytes.
pub fn check_file_path(path: &str) -> Result<(), &'static str> {
    if path.is_empty() {
        Err("empty")
    } else if path.len() > MAX_FILE_PATH {
        Err("longer than 4000 bytes")
    } else if path.starts_with('/') {
        Err("absolute; it must be relative to the model's root")
    } else if path.chars().any(char::is_control) {
        Err("it contains a control character")
    } else if path.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        Err("it has an empty, . or .. component")
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("application/vnd.cncf.model.weight.v1.tar", Class::Weight, Archive::Tar)]
    #[case("application/vnd.cncf.model.weight.v1.raw", Class::Weight, Archive::Raw)]
    #[case("application/vnd.cncf.model.weight.config.v1.tar+gzip", Class::Config, Archive::TarGzip)]
    #[case("application/vnd.cncf.model.doc.v1.tar+zstd", Class::Doc, Archive::TarZstd)]
    #[case("application/vnd.cncf.model.code.v1.raw", Class::Code, Archive::Raw)]
    #[case("application/vnd.cncf.model.dataset.v1.tar", Class::Dataset, Archive::Tar)]
    fn known_media_types(#[case] t: &str, #[case] class: Class, #[case] format: Archive) {
        assert_eq!(classify(t), Some((class, format)));
    }

    #[rstest]
    #[case("application/vnd.oci.image.layer.v1.tar")]
    #[case("application/vnd.cncf.model.weight.v2.tar")]
    #[case("application/vnd.cncf.model.weight.v1.tar+lz4")]
    #[case("application/vnd.cncf.model.license.v1.tar")]
    #[case("application/vnd.cncf.model.config.v1+json")]
    #[case("application/vnd.cncf.model.weight.v1.tar ")]
    fn unknown_media_types(#[case] t: &str) {
        assert_eq!(classify(t), None);
    }

    #[rstest]
    #[case("model.safetensors", true)]
    #[case("tokenizer/vocab.json", true)]
    #[case("a b/ü.txt", true)]
    #[case("", false)]
    #[case("/etc/passwd", false)]
    #[case("../x", false)]
    #[case("a/../../x", false)]
    #[case("./x", false)]
    #[case("a//b", false)]
    #[case("dir/", false)]
    #[case("a\nb", false)]
    fn file_paths(#[case] p: &str, #[case] ok: bool) {
        assert_eq!(check_file_path(p).is_ok(), ok, "{p:?}");
    }
}
