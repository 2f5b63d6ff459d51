//! Issue 42, ask 1: a dynamic volume's byte cap is a level its pod cannot walk around, through
//! the real front and host daemons. Root, each test in a private mount namespace.
//!
//! The pod's volume is capped at 32 MiB (`--dynamic-max-mib=32`); its mounts come from a
//! registry of the test's own (`common::hostile`) that sends every blob reply at 256 KiB/s and
//! says, at any instant, how many bytes its replies still have to send. Each test samples the
//! volume's level (`GET /usage`) and that registry-side figure while the pod works, and
//! asserts both stay within the cap:
//!
//! - a pod looping POST then DELETE, a different model each time: eager mounts, then mounts
//!   that fail (one blob of each answers 404 while the other downloads), then lazy mounts. A
//!   deleted or failed mount's downloads stop (the registry's replies end within a second of
//!   the DELETE, or of the failure), and the registry serves no more than the cap over the
//!   loop. The loop runs `CAP_LOOP_SECS` seconds a kind (default 8; the measure is 60:
//!   `bench/dynamic-cap.sh`);
//! - concurrent POSTs that together pass the cap: those past it are answered 507;
//! - a lazy mount past the cap is answered 507 with no layer fetched (the registry's log: the
//!   manifest, its config blob, the referrers query; no layer, no chunk index); its chunk index's
//!   size counts like a blob, before it is read.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::dynamic::{DynNode, call, dynamic_ctx, tiny_model};
use common::hostile::{Hostile, Lie, noise};
use common::registry::{Class, Packing, PushedModel, Registry, RegistryOptions};
use common::{guarded, in_private_namespace};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const MIB: u64 = 1 << 20;
/// The volume's cap, MiB.
const CAP_MIB: u64 = 32;
/// What the registry sends a second, per reply.
const RATE: u64 = 256 << 10;
/// The weights of each model.
const WEIGHTS: usize = 8 << 20;
/// The registry's pieces: its figure of what is still to come may lag one piece per reply.
const PIECE: u64 = 16 << 10;

fn loop_secs() -> u64 {
    std::env::var("CAP_LOOP_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(8)
}

/// A model of `WEIGHTS` bytes of weights of its own at `repo:v1`; with `broken`, a second small
/// weights file whose blob the registry answers 404.
fn model(server: &Hostile, repo: &str, broken: bool) -> PushedModel {
    let weights = noise(repo, WEIGHTS);
    if !broken {
        return server.put_model(repo, "v1", &[("model.safetensors", &weights, Class::Weight, Packing::Raw)]);
    }
    let small = noise(&format!("{repo}/small"), 4096);
    let m = server.put_model(
        repo,
        "v1",
        &[
            ("model.safetensors", &weights, Class::Weight, Packing::Raw),
            ("extra.safetensors", &small, Class::Weight, Packing::Raw),
        ],
    );
    let gone = m.layers.iter().find(|l| l.filepath == "extra.safetensors").unwrap();
    server.claim_blob(&gone.descriptor.digest, gone.descriptor.size, Lie::NotFound);
    m
}

/// What one sample saw.
#[derive(Default, Debug)]
struct Samples {
    count: usize,
    /// The highest level the volume reported, and the most the registry still had to send.
    max_level: u64,
    max_pending: u64,
    /// The longest a mount's end (from its DELETE sent, or its failure seen) took to reach
    /// the registry: until no reply was sending any more.
    max_stop: Duration,
}

impl Samples {
    /// Wait until the registry sends nothing (at most 5 s after `t0`), and remember how long it
    /// took.
    fn stopped(&mut self, hostile: &Hostile, t0: Instant) {
        while hostile.pending_bytes() > 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "the registry still sends {} bytes",
                hostile.pending_bytes()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        self.max_stop = self.max_stop.max(t0.elapsed());
    }

    fn take(&mut self, dir: &Path, hostile: &Hostile) {
        let (status, u) = call(dir, "GET", "/usage", None);
        assert_eq!(status, 200, "{u}");
        let (level, cap) = (u["levelBytes"].as_u64().unwrap(), u["maxBytes"].as_u64().unwrap());
        assert_eq!(cap, CAP_MIB * MIB, "{u}");
        let parts = ["heldBytes", "endingBytes", "reservedBytes"].iter().map(|k| u[*k].as_u64().unwrap()).sum::<u64>();
        assert_eq!(level, parts, "the level is the sum of its parts: {u}");
        let pending = hostile.pending_bytes();
        assert!(level <= cap, "the volume's level passed its cap: {u}");
        // Each running reply may lag a piece behind the bytes the node took.
        let slack = 8 * PIECE;
        assert!(pending <= cap + slack, "the registry still had {pending} bytes to send, past the cap {cap}: {u}");
        self.count += 1;
        self.max_level = self.max_level.max(level);
        self.max_pending = self.max_pending.max(pending);
    }
}

/// The node, a dynamic volume on it (its own model from a real registry), the hostile
/// registry its pod mounts from; `body` gets the volume's directory.
fn with_volume(test: &str, body: impl AsyncFnOnce(&Path, &Hostile)) {
    if !in_private_namespace(test) {
        return;
    }
    let registry = Registry::start(RegistryOptions::default());
    let base = tiny_model(&registry, "models/base", "v1", b"base weights");
    let hostile = Hostile::start();
    hostile.behave(|b| b.rate = Some(RATE));
    let insecure = format!("--insecure-registry={}", hostile.host());
    let grant = format!("--grant=model:host={}", hostile.host());
    let cap = format!("--dynamic-max-mib={CAP_MIB}");
    let node = DynNode::start_with(&registry, &[&insecure, &grant, &cap]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    guarded(&node.dirs, || {
        rt.block_on(async {
            let mut csi = node.node().await;
            let dir = node.dynamic_volume(&mut csi, "pv-cap", "pod-cap", &dynamic_ctx(&base.reference)).await;
            if let Err(e) =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| futures_block(body(&dir, &hostile))))
            {
                eprintln!("--- requests to the hostile registry (tail)\n{}", common::model::tail(&hostile.log(), 40));
                std::panic::resume_unwind(e);
            }
        })
    });
}

/// Run a test body (which blocks on the pod's socket) off the runtime's workers.
fn futures_block<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

/// POST a mount of `model` (lazily with `lazy`), answered with anything but an error of the
/// request (a 507 is one: the cap said no); retried after a 429's Retry-After.
fn post(dir: &Path, id: &str, model: &PushedModel, lazy: bool) -> (u16, Value) {
    let mut parameters = json!({"reference": model.reference});
    if lazy {
        parameters["lazy"] = json!("true");
    }
    loop {
        let (status, v) = call(dir, "POST", "/mounts", Some(json!({"id": id, "parameters": parameters})));
        if status != 429 {
            return (status, v);
        }
        std::thread::sleep(Duration::from_secs(v["retryAfter"].as_u64().unwrap_or(1).min(1)));
    }
}

fn delete(dir: &Path, id: &str) -> u16 {
    loop {
        let (status, _) = call(dir, "DELETE", &format!("/mounts/{id}"), None);
        if status != 429 {
            return status;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The kinds of mount the looping pod makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Eager,
    Failing,
    Lazy,
}

/// The pod's loop for `secs` seconds: POST a fresh model, look at it for a moment, DELETE it.
/// Returns the cycles made and what the registry served meanwhile.
fn looping(dir: &Path, hostile: &Hostile, kind: Kind, secs: u64, samples: &mut Samples) -> (usize, u64) {
    let served_before = hostile.blob_bytes_sent();
    let until = Instant::now() + Duration::from_secs(secs);
    let mut cycles = 0;
    let mut posts = Vec::new();
    while Instant::now() < until {
        let id = format!("{kind:?}-{cycles}").to_lowercase();
        let m = model(hostile, &format!("models/{id}"), kind == Kind::Failing);
        if kind == Kind::Failing {
            let (status, v) = post(dir, &id, &m, false);
            assert!(matches!(status, 200..=202), "POST {id}: {status} {v}");
            samples.take(dir, hostile);
            // It fails at the 404 while its weights download; they stop.
            let until = Instant::now() + Duration::from_secs(20);
            loop {
                let (_, v) = call(dir, "GET", &format!("/mounts/{id}"), None);
                samples.take(dir, hostile);
                if v["state"] == "failed" {
                    samples.stopped(hostile, Instant::now());
                    break;
                }
                assert!(Instant::now() < until && v["state"] != "ready", "{id} never failed: {v}");
                std::thread::sleep(Duration::from_millis(100));
            }
        } else {
            // The pod does not wait for the answer: once the mount is recorded, it looks for a
            // moment and deletes it.
            let (dir2, id2, lazy) = (dir.to_path_buf(), id.clone(), kind == Kind::Lazy);
            let posting = std::thread::spawn(move || post(&dir2, &id2, &m, lazy));
            let until = Instant::now() + Duration::from_secs(20);
            while call(dir, "GET", &format!("/mounts/{id}"), None).0 != 200 {
                if posting.is_finished() {
                    let (status, v) = posting.join().unwrap();
                    panic!("POST {id} was answered {status} {v} before it was recorded");
                }
                assert!(Instant::now() < until, "{id} was never recorded");
                std::thread::sleep(Duration::from_millis(20));
            }
            samples.take(dir, hostile);
            std::thread::sleep(Duration::from_millis(300));
            samples.take(dir, hostile);
            posts.push(posting);
        }
        let t0 = Instant::now();
        assert_eq!(delete(dir, &id), 200, "DELETE {id}");
        samples.stopped(hostile, t0);
        samples.take(dir, hostile);
        cycles += 1;
    }
    for p in posts {
        // Answered whatever it was (a mount deleted while its POST waited is not found).
        p.join().unwrap();
    }
    // Every reply the loop started has ended within a second or so of its mount's end.
    let until = Instant::now() + Duration::from_secs(5);
    while hostile.pending_bytes() > 0 {
        assert!(Instant::now() < until, "the registry still sends {} bytes after the loop", hostile.pending_bytes());
        std::thread::sleep(Duration::from_millis(50));
    }
    let (_, u) = call(dir, "GET", "/usage", None);
    assert_eq!(u["levelBytes"], 0, "nothing counts once every mount is gone and its downloads ended: {u}");
    (cycles, hostile.blob_bytes_sent() - served_before)
}

#[test]
fn a_pod_looping_post_and_delete_stays_within_its_byte_cap() {
    with_volume("a_pod_looping_post_and_delete_stays_within_its_byte_cap", async |dir, hostile| {
        let secs = loop_secs();
        for kind in [Kind::Eager, Kind::Failing, Kind::Lazy] {
            let mut samples = Samples::default();
            let gets = hostile.blob_gets();
            let (cycles, served) = looping(dir, hostile, kind, secs, &mut samples);
            let gets = hostile.blob_gets() - gets;
            println!(
                "checked: {kind:?} mounts, {secs} s: {cycles} POST/DELETE cycles, {gets} blob GETs; the registry served {:.1} MiB (cap {CAP_MIB} MiB); {} samples: level at most {:.1} MiB, the registry's replies at most {:.1} MiB still to send; a mount's end reached the registry within {:?}",
                served as f64 / MIB as f64,
                samples.count,
                samples.max_level as f64 / MIB as f64,
                samples.max_pending as f64 / MIB as f64,
                samples.max_stop,
            );
            assert!(cycles >= 2, "{kind:?}: the loop made {cycles} cycles");
            // Each cycle's weights were asked for (with its config): every kind downloaded.
            assert!(gets >= 2 * cycles as u64, "{kind:?}: {gets} blob GETs in {cycles} cycles");
            assert!(
                served <= CAP_MIB * MIB,
                "{kind:?}: the registry served {served} bytes over the loop, past the cap"
            );
        }
    });
}

#[test]
fn concurrent_posts_past_the_cap_are_refused_past_it() {
    with_volume("concurrent_posts_past_the_cap_are_refused_past_it", async |dir, hostile| {
        // Eight models of 8 MiB against 32 MiB: four fit.
        let models: Vec<PushedModel> = (0..8).map(|i| model(hostile, &format!("models/c{i}"), false)).collect();
        let answers: Vec<(u16, Value)> = std::thread::scope(|s| {
            let posts: Vec<_> = models
                .iter()
                .enumerate()
                .map(|(i, m)| s.spawn(move || post(dir, &format!("c{i}"), m, false)))
                .collect();
            posts.into_iter().map(|p| p.join().unwrap()).collect()
        });
        let statuses: Vec<u16> = answers.iter().map(|(s, _)| *s).collect();
        let accepted = statuses.iter().filter(|s| matches!(s, 200..=202)).count();
        let refused: Vec<&Value> = answers.iter().filter(|(s, _)| *s == 507).map(|(_, v)| v).collect();
        println!("checked: 8 concurrent POSTs of 8 MiB against a cap of {CAP_MIB} MiB: {statuses:?}");
        assert_eq!(accepted + refused.len(), 8, "every POST is accepted or refused by the cap: {answers:?}");
        assert_eq!(accepted, 4, "as many as fit, no more: {answers:?}");
        let reason = refused[0]["message"].as_str().unwrap_or_default();
        assert!(reason.contains("cap") && reason.contains("33554432"), "{reason}");
        let mut samples = Samples::default();
        samples.take(dir, hostile);
        assert_eq!(samples.max_level, 4 * WEIGHTS as u64, "the four accepted mounts count");
    });
}

#[test]
fn a_lazy_mount_past_the_cap_fetches_no_layer() {
    with_volume("a_lazy_mount_past_the_cap_fetches_no_layer", async |dir, hostile| {
        // Five weights files of 8 MiB: 40 MiB, past the cap of 32.
        let files: Vec<(String, Vec<u8>)> =
            (0..5).map(|i| (format!("part-{i}.safetensors"), noise(&format!("big/{i}"), WEIGHTS))).collect();
        let listed: Vec<(&str, &[u8], Class, Packing)> =
            files.iter().map(|(p, w)| (p.as_str(), w.as_slice(), Class::Weight, Packing::Raw)).collect();
        let m = hostile.put_model("models/huge", "v1", &listed);
        let reference = m.reference.clone();
        let config = m.config.digest.clone();
        let before = hostile.seen().len();
        let ask = json!({"id": "huge", "parameters": {"reference": reference, "lazy": "true"}});
        let (status, v) = call(dir, "POST", "/mounts", Some(ask));
        let seen: Vec<String> = hostile.seen()[before..].iter().map(|s| format!("{} {}", s.method, s.path)).collect();
        println!(
            "checked: a lazy mount of 40 MiB past a cap of {CAP_MIB} MiB: {status} {v}; the registry saw {seen:?}"
        );
        assert_eq!(status, 507, "{v}");
        assert!(v["message"].as_str().unwrap_or_default().contains("cap"), "{v}");
        for s in &seen {
            let blob = s.contains("/blobs/");
            assert!(!blob || s.ends_with(config.as_str()), "only the config is read of the blobs: {seen:?}");
        }
        assert_eq!(call(dir, "GET", "/mounts/huge", None).0, 404, "nothing is recorded");
        let (_, u) = call(dir, "GET", "/usage", None);
        assert_eq!(u["levelBytes"], 0, "{u}");
    });
}

/// The referrer of `model` (at `host/repo`) that says it has a chunk index of `size` bytes,
/// which the registry only claims (its bytes would be wrong): the referrers tag schema's index,
/// and the index artifact's manifest.
fn claim_index(hostile: &Hostile, model: &PushedModel, seed: &str, size: u64) -> String {
    let index = format!("sha256:{}", hex::encode(Sha256::digest(seed.as_bytes())));
    hostile.claim_blob(&index, size, Lie::WrongBytes);
    let artifact = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": mounthost::oci::INDEX_ARTIFACT_TYPE,
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a", "size": 2},
        "layers": [{"mediaType": mounthost::oci::INDEX_ARTIFACT_TYPE, "digest": index, "size": size}],
    })
    .to_string();
    let artifact_digest = hostile.put_manifest(&model.repo, "chunk-index", &artifact);
    let referrers = common::registry::chunk_index_referrers(&artifact_digest, &artifact);
    hostile.put_manifest(&model.repo, &model.manifest_digest.replacen(':', "-", 1), &referrers);
    index
}

#[test]
fn a_lazy_mount_counts_its_chunk_index_before_reading_it() {
    with_volume("a_lazy_mount_counts_its_chunk_index_before_reading_it", async |dir, hostile| {
        // Three weights files of 8 MiB (24 MiB, within the cap of 32) and an index of 9 MiB.
        let files: Vec<(String, Vec<u8>)> =
            (0..3).map(|i| (format!("part-{i}.safetensors"), noise(&format!("indexed/{i}"), WEIGHTS))).collect();
        let listed: Vec<(&str, &[u8], Class, Packing)> =
            files.iter().map(|(p, w)| (p.as_str(), w.as_slice(), Class::Weight, Packing::Raw)).collect();
        let over = hostile.put_model("models/indexed", "v1", &listed);
        let index = claim_index(hostile, &over, "index/over", 9 * MIB);
        let ask = json!({"id": "indexed", "parameters": {"reference": over.reference, "lazy": "true"}});
        let (status, v) = call(dir, "POST", "/mounts", Some(ask.clone()));
        let asked =
            |digest: &str| hostile.seen().iter().filter(|s| s.method == "GET" && s.path.ends_with(digest)).count();
        println!("checked: a lazy mount of 24 MiB of layers with a 9 MiB chunk index, cap {CAP_MIB} MiB: {status} {v}");
        assert_eq!(status, 507, "{v}");
        assert!(v["message"].as_str().unwrap_or_default().contains(&(33 * MIB).to_string()), "layers and index: {v}");
        assert_eq!(asked(&index), 0, "the index was read before the cap's check: {}", hostile.log());
        // The same layers with an index of 1 MiB pass the check (the index is read then, and
        // its wrong bytes fail the mount: not the cap).
        let under = hostile.put_model("models/indexed-small", "v1", &listed);
        let index = claim_index(hostile, &under, "index/under", MIB);
        let ask = json!({"id": "indexed", "parameters": {"reference": under.reference, "lazy": "true"}});
        let (status, v) = call(dir, "POST", "/mounts", Some(ask));
        println!("checked: the same layers with a 1 MiB chunk index: {status} {v}");
        assert_ne!(status, 507, "{v}");
        assert_eq!(asked(&index), 1, "past the cap's check, the index is read: {}", hostile.log());
    });
}
