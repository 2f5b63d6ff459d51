//! Manifests, indexes and configs as a registry (or a mirror, or whoever answers for it) could
//! serve them, read by every parser that takes them: the model plugin's ModelPack reading, the
//! host's plugin-artifact and cache readings. The first byte splits the input into a manifest
//! and a config. Nothing panics; what is accepted is well formed.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else { return };
    let at = (split as usize * rest.len()) / 255;
    let (manifest, config) = rest.split_at(at.min(rest.len()));
    let (Ok(manifest), Ok(config)) = (std::str::from_utf8(manifest), std::str::from_utf8(config)) else { return };
    if let Ok(artifact) = mounthost_plugin_model::manifest::parse("r.io/m:v1", manifest, config) {
        for layer in &artifact.layers {
            assert!(mounthost_plugin_model::manifest::check_file_path(&layer.path).is_ok(), "{layer:?}");
        }
    }
    if let Ok(layer) = mounthost::oci::fuzzing::plugin_layer(manifest) {
        assert!(layer.digest.starts_with("sha256:"), "{layer:?}");
    }
    if let Ok(blobs) = mounthost::daemon::cache::manifest_blobs(manifest) {
        assert!(blobs.iter().all(|b| mounthost::plan::oci_ref::is_sha256(&b.digest)), "{blobs:?}");
    }
    let _ = mounthost::plan::oci_ref::OciRef::parse(config);
});
