//! CSI requests as kubelet (or anything that reaches the socket) could send them: the protobuf
//! decoded, then every check the front and the daemon run on a request before acting (ids,
//! paths confined to kubelet's directories, capabilities, maps, secrets, the reserved
//! attributes, capacity ranges). Nothing panics, and a path the checks accept is inside a root.
#![no_main]
use std::collections::HashMap;
use std::path::PathBuf;

use libfuzzer_sys::fuzz_target;
use mounthost::proto::csi;
use mounthost::volume::{request, size};
use prost::Message;

const ROOT: &str = "/var/lib/kubelet";

fn attrs(id: &str, m: &HashMap<String, String>) {
    if request::map("volume_context", m).is_ok()
        && let Ok(name) = request::plugin_name(id, m)
    {
        let _ = request::dynamic_plugins(m, &name);
        let _ = request::plugin_attrs(m);
    }
}

fn path(roots: &request::Roots, field: &str, raw: &str) {
    if let Ok(p) = roots.check(field, raw) {
        assert!(p.starts_with(ROOT), "{raw:?} accepted as {}", p.display());
        assert!(!p.components().any(|c| matches!(c, std::path::Component::ParentDir)), "{raw:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else { return };
    let roots = request::Roots::new([PathBuf::from(ROOT)]);
    match which % 5 {
        0 => {
            let Ok(r) = csi::NodeStageVolumeRequest::decode(bytes) else { return };
            if let Ok(id) = request::volume_id(&r.volume_id) {
                attrs(&id, &r.volume_context);
            }
            path(&roots, "staging_target_path", &r.staging_target_path);
            let _ = request::capability(r.volume_capability.as_ref());
            let _ = request::map("publish_context", &r.publish_context);
            let _ = request::secrets(&r.secrets);
        }
        1 => {
            let Ok(r) = csi::NodePublishVolumeRequest::decode(bytes) else { return };
            if let Ok(id) = request::volume_id(&r.volume_id) {
                attrs(&id, &r.volume_context);
            }
            path(&roots, "target_path", &r.target_path);
            path(&roots, "staging_target_path", &r.staging_target_path);
            if let Ok(c) = request::capability(r.volume_capability.as_ref()) {
                let _ = request::access_mode_name(c.access_mode);
                let _ = request::is_reader_only(c.access_mode);
            }
            let _ = request::secrets(&r.secrets);
        }
        2 => {
            let Ok(r) = csi::CreateVolumeRequest::decode(bytes) else { return };
            let _ = request::identifier("name", &r.name);
            for c in &r.volume_capabilities {
                let _ = request::capability(Some(c));
            }
            let _ = request::map("parameters", &r.parameters);
            let _ = request::secrets(&r.secrets);
            let _ = request::kvs(&r.parameters);
        }
        3 => {
            let Ok(r) = csi::ControllerExpandVolumeRequest::decode(bytes) else { return };
            let _ = request::volume_id(&r.volume_id);
            if let Ok((required, limit)) = size::expansion_range(r.capacity_range.as_ref()) {
                assert!(required > 0 || limit > 0);
                assert!(limit == 0 || required <= limit);
            }
            let _ = size::node_expansion_range(r.capacity_range.as_ref());
        }
        _ => {
            let Ok(r) = csi::NodeUnpublishVolumeRequest::decode(bytes) else { return };
            let _ = request::volume_id(&r.volume_id);
            path(&roots, "target_path", &r.target_path);
            let _ = request::lexical("target_path", &r.target_path);
        }
    }
});
