//! Lazy model volumes end to end (docs/lazy.md), as root, in a private mount namespace: models
//! built and pushed into a real `docker-registry`, reached through a throttling relay
//! (`common::model::Relay`) so "while the fill runs" is a moment a test can hold, staged and
//! published by kubelet-shaped calls through the real front and host daemon, and read by a
//! process as a pod would.

mod common;

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::model::*;
use common::registry::{Class, ModelBuilder, Packing, PushedModel, Registry, RegistryOptions, random_file};
use common::{in_private_namespace, mounts_below};
use mounthost::proto::csi;
use mounthost::proto::host::LazyProgress;

/// A model of every kind of layer: a raw weights file of `weights` bytes, a tar config, a
/// tar+gzip tokenizer and a tar+zstd README.
fn lazy_model(registry: &Registry, work: &Path, repo: &str, weights: u64) -> (PushedModel, PathBuf) {
    let (w, _) = random_file(work, weights);
    let model = ModelBuilder::new()
        .file("config.json", br#"{"architectures":["Test"]}"#.as_slice(), Class::Config, Packing::Tar)
        .file(
            "tokenizer.json",
            br#"{"version":"1.0","model":{"type":"BPE"}}"#.as_slice(),
            Class::Config,
            Packing::TarGzip,
        )
        .file("README.md", b"# a lazy test model\n".as_slice(), Class::Doc, Packing::TarZstd)
        .file("model.safetensors", common::registry::Content::File(w.clone()), Class::Weight, Packing::Raw)
        .push(registry, repo, "v1");
    (model, w)
}

/// The lazy progress of volume `id` as ListVolumes reports it.
async fn progress(node: &ModelNode, id: &str) -> Option<LazyProgress> {
    node.volumes().await.into_iter().find(|v| v.volume_id == id).and_then(|v| v.lazy)
}

/// Wait until `id`'s layers are all complete (at most `limit`).
async fn until_complete(node: &ModelNode, id: &str, limit: Duration) -> LazyProgress {
    let until = Instant::now() + limit;
    loop {
        let p = progress(node, id).await;
        if let Some(p) = &p
            && p.layers > 0
            && p.layers_complete == p.layers
        {
            return p.clone();
        }
        assert!(Instant::now() < until, "the fill did not end: {p:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `len` bytes at `at` of `file`.
fn read_range(file: &Path, at: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    std::fs::File::open(file).unwrap().read_exact_at(&mut buf, at).unwrap();
    buf
}

fn lazy_ctx(reference: &str) -> HashMap<String, String> {
    model_ctx(reference, &[("insecure", "true"), ("lazy", "true")])
}

#[test]
fn a_lazy_volume_is_staged_at_once_and_read_while_its_fill_runs() {
    if !in_private_namespace("a_lazy_volume_is_staged_at_once_and_read_while_its_fill_runs") {
        return;
    }
    let registry = Registry::start(RegistryOptions::default());
    let work = tempfile::tempdir().unwrap();
    let (model, weights) = lazy_model(&registry, work.path(), "models/lazy", 64 << 20);
    let relay = Relay::start(registry.host());
    relay.throttle(4 << 20);
    let reference = model.reference.replace(&registry.host(), &relay.host());
    let node = ModelNode::start(vec![format!("--insecure-registry={}", relay.host())]);
    run(&node, &registry, async || {
        let mut csi = node.node().await;
        let ctx = lazy_ctx(&reference);
        let staging = node.dirs.staging("pv-lazy");
        // The first call stages: no UNAVAILABLE, whatever is still to come.
        csi.node_stage_volume(stage_req("pv-lazy", &staging, &ctx)).await.unwrap();
        let at_stage = relay.sent();
        assert!(at_stage < (8 << 20), "staged after {at_stage} bytes, not after the whole model");
        let target = node.dirs.target("pod-1", "pv-lazy");
        csi.node_publish_volume(publish_req("pv-lazy", &staging, &target, &ctx)).await.unwrap();
        let lazy_mounts: Vec<_> = mounthost::exec::mountinfo::read()
            .unwrap()
            .into_iter()
            .filter(|m| m.fstype == "fuse.mounthost-lazy")
            .collect();
        assert!(!lazy_mounts.is_empty(), "the host's lazy server serves the volume");
        // The small files come first (the fill goes in layer order), the compressed ones once
        // unpacked; all byte for byte.
        for (path, want, _) in &model.files {
            if path == "model.safetensors" {
                continue;
            }
            let (got, _) = common::registry::sha256_file(&target.join(path));
            assert_eq!(&got, want, "{path}");
        }
        // A range far ahead of the fill is fetched for the reader.
        let at = 48 << 20;
        let t = Instant::now();
        assert_eq!(read_range(&target.join("model.safetensors"), at, 1 << 20), read_range(&weights, at, 1 << 20));
        println!("checked: 1 MiB at 48 MiB read after {:?}, {} bytes through the relay", t.elapsed(), relay.sent());
        let p = progress(&node, "pv-lazy").await.unwrap();
        assert!(p.demand_requests > 0 && p.demand_bytes > 0, "fetched on demand: {p:?}");
        assert_eq!(p.layers, 4);
        assert!(p.connected, "{p:?}");
        assert!(p.failed.is_empty(), "{p:?}");
        // The CLI shows it too.
        let list = node.cli(&["client", "list"]);
        let list: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
        let mine = list.as_array().unwrap().iter().find(|v| v["volumeId"] == "pv-lazy").unwrap();
        assert!(mine["lazy"]["demandRequests"].as_u64().unwrap() > 0, "{mine}");
        // The fill ends: the whole volume is the model's, byte for byte, and complete files go
        // to the kernel's passthrough.
        relay.throttle(u64::MAX);
        let done = until_complete(&node, "pv-lazy", Duration::from_secs(120)).await;
        assert_eq!(done.verified_bytes, done.total_bytes, "{done:?}");
        assert!(done.passthrough_files >= 1, "passthrough: {done:?}");
        assert_eq!(tree(&target), expected(&model, |_| true));
        assert!(model.cached(&node.dirs.state, "model.safetensors"), "the cache holds the complete blob");
        let fetched = relay.sent();
        let total: u64 = model.layers.iter().map(|l| l.descriptor.size).sum();
        println!("checked: filled; {fetched} bytes through the relay for {total} bytes of blobs; {done:?}");
        // A second lazy volume of the same model fetches nothing.
        let staging2 = node.dirs.staging("pv-lazy-2");
        csi.node_stage_volume(stage_req("pv-lazy-2", &staging2, &ctx)).await.unwrap();
        assert_eq!(tree(&staging2), expected(&model, |_| true));
        assert!(relay.sent() - fetched < (64 << 10), "a second volume fetched {} bytes", relay.sent() - fetched);
        // Unstaged: nothing mounted, no server running, no partial file.
        csi.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: "pv-lazy".into(),
            target_path: target.display().to_string(),
        })
        .await
        .unwrap();
        for (pv, staging) in [("pv-lazy", &staging), ("pv-lazy-2", &staging2)] {
            csi.node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: pv.into(),
                staging_target_path: staging.display().to_string(),
            })
            .await
            .unwrap();
        }
        assert_eq!(mounts_below(node.dirs.root.path()), Vec::<PathBuf>::new());
        assert!(partials(&node.dirs.state).is_empty());
    });
}
