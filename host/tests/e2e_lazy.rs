//! Lazy model volumes end to end (docs/lazy.md), as root, in a private mount namespace: models
//! built and pushed into a real `docker-registry`, reached through a throttling relay
//! (`common::model::Relay`) so "while the fill runs" is a moment a test can hold, staged and
//! published by kubelet-shaped calls through the real front and host daemon, and read by a
//! process as a pod would.

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use common::model::*;
use common::registry::{PushedModel, Registry, RegistryOptions};
use common::{in_private_namespace, mounts_below};
use mounthost::proto::csi;
use mounthost::proto::host::LazyProgress;

/// A registry holding a lazy test model ([`small_model_with_weights`], `weights` bytes of weights, in `repo`),
/// and a relay in front of it passing `rate` bytes a second: the registry, the work directory
/// of the weights file, the model, the weights file, the relay, and the model's reference
/// through the relay.
fn behind_relay(repo: &str, weights: u64, rate: u64) -> (Registry, TempDir, PushedModel, PathBuf, Relay, String) {
    let registry = Registry::start(RegistryOptions::default());
    let work = tempfile::tempdir().unwrap();
    let (model, weights) = small_model_with_weights(&registry, work.path(), repo, weights);
    let relay = Relay::start(registry.host());
    relay.throttle(rate);
    let reference = model.reference.replace(&registry.host(), &relay.host());
    (registry, work, model, weights, relay, reference)
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

#[test]
fn a_lazy_volume_is_staged_at_once_and_read_while_its_fill_runs() {
    if !in_private_namespace("a_lazy_volume_is_staged_at_once_and_read_while_its_fill_runs") {
        return;
    }
    let (registry, _work, model, weights, relay, reference) = behind_relay("models/lazy", 64 << 20, 4 << 20);
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
        // Its laziness is part of what it is: staged again as an eager volume, ALREADY_EXISTS.
        let mut eager = ctx.clone();
        eager.insert("lazy".into(), "false".into());
        let err = csi.node_stage_volume(stage_req("pv-lazy", &staging, &eager)).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::AlreadyExists, "{err:?}");
        assert!(err.message().contains("lazy"), "{err:?}");
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
        // A reader that holds the file open from before the fill ended (as a server that
        // mapped it does) keeps reading it, and the file opens again meanwhile.
        let held = std::fs::File::open(target.join("model.safetensors")).unwrap();
        let mut first = vec![0u8; 4096];
        held.read_exact_at(&mut first, 1 << 20).unwrap();
        // The fill ends: the whole volume is the model's, byte for byte, and complete files go
        // to the kernel's passthrough.
        relay.throttle(u64::MAX);
        let done = until_complete(&node, "pv-lazy", Duration::from_secs(120)).await;
        assert_eq!(done.verified_bytes, done.total_bytes, "{done:?}");
        assert!(done.passthrough_files >= 1, "passthrough: {done:?}");
        let mut again = vec![0u8; 4096];
        held.read_exact_at(&mut again, 60 << 20).unwrap();
        assert_eq!(again, read_range(&weights, 60 << 20, 4096), "the held file reads on");
        assert_eq!(
            read_range(&target.join("model.safetensors"), 60 << 20, 4096),
            again,
            "opened again while another open is held"
        );
        drop(held);
        // Passthrough: a file opened now reads with its server stopped (the kernel reads the
        // cached blob itself). The server learns of the held file's close a moment later: until
        // then an open is still served by it, so a read that waits for the stopped server is
        // tried again, each time at a range no read went through the server's page cache for.
        let server = node.volumes().await.into_iter().find(|v| v.volume_id == "pv-lazy").unwrap().pid;
        let server = nix::unistd::Pid::from_raw(server);
        let mut bypassed = None;
        for attempt in 0..10u64 {
            let at = (8 + 4 * attempt) << 20;
            let through = std::fs::File::open(target.join("model.safetensors")).unwrap();
            nix::sys::signal::kill(server, nix::sys::signal::Signal::SIGSTOP).unwrap();
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 20];
                let _ = tx.send(through.read_exact_at(&mut buf, at).map(|()| buf));
            });
            let read = rx.recv_timeout(Duration::from_secs(2));
            nix::sys::signal::kill(server, nix::sys::signal::Signal::SIGCONT).unwrap();
            if let Ok(read) = read {
                bypassed = Some((at, read.unwrap()));
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let (at, read) = bypassed.expect("a read through passthrough does not wait for the stopped server");
        assert_eq!(read, read_range(&weights, at, 1 << 20));
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
        // Its blobs are in use: `cache ls` names the volume, a prune to nothing keeps them.
        let weights_digest = model.layer("model.safetensors").digest.clone();
        let ls: serde_json::Value = serde_json::from_slice(&node.cli(&["cache", "ls"]).stdout).unwrap();
        let entry = ls["blobs"].as_array().unwrap().iter().find(|b| b["digest"] == weights_digest.as_str()).cloned();
        let users = entry.map(|e| e["volumes"].clone()).unwrap_or_default();
        assert!(users.as_array().is_some_and(|u| u.iter().any(|v| v == "pv-lazy")), "{ls}");
        assert!(node.cli(&["cache", "prune"]).status.success());
        assert!(model.cached(&node.dirs.state, "model.safetensors"), "a lazy volume's blob is never evicted");
        assert_eq!(tree(&staging2), expected(&model, |_| true));
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
        // Unused now: the next prune evicts it.
        assert!(node.cli(&["cache", "prune"]).status.success());
        assert!(!model.cached(&node.dirs.state, "model.safetensors"));
    });
}

/// Pages of `file` in the page cache: `cachestat(2)` (Linux 6.5+) on a descriptor, through
/// Python's ctypes (`fincore` maps the file, and a new mapping of a file open for direct I/O
/// drops its cached pages).
fn resident(file: &Path) -> u64 {
    const CACHESTAT: &str = "import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
class Range(ctypes.Structure):
    _fields_ = [('off', ctypes.c_uint64), ('len', ctypes.c_uint64)]
class Stat(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ('cache', 'dirty', 'writeback', 'evicted', 'recently_evicted')]
fd = os.open(sys.argv[1], os.O_RDONLY)
r, s = Range(0, 0), Stat()
if libc.syscall(451, fd, ctypes.byref(r), ctypes.byref(s), 0) != 0:
    sys.exit('cachestat: ' + os.strerror(ctypes.get_errno()))
print(s.cache)
";
    let out = std::process::Command::new("python3").args(["-c", CACHESTAT]).arg(file).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// The lazy progress of `id` once its demand fetches ended (no byte came in a second), with at
/// least `bytes` fetched on demand (at most a minute).
async fn demand_settled(node: &ModelNode, id: &str, bytes: u64) -> LazyProgress {
    let until = Instant::now() + Duration::from_secs(60);
    let mut last = progress(node, id).await.unwrap();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let p = progress(node, id).await.unwrap();
        if p.demand_bytes == last.demand_bytes && p.demand_bytes >= bytes {
            return p;
        }
        assert!(Instant::now() < until, "{bytes} bytes on demand, and nothing more coming: {p:?}");
        last = p;
    }
}

/// Readers of one chunk far ahead of the fill share one range request for it; a reader that
/// reads a file through gets the chunks after the one it waits for fetched ahead of it; reads
/// of a file still downloading leave nothing in its page cache, and a mapping of it reads.
/// The weights (192 MiB) are three 64 MiB pieces for two streams, the relay passes 2 MiB/s a
/// connection: the third piece, where these reads are, is not the fill's for half a minute.
#[test]
fn readers_of_one_chunk_share_its_fetch_and_a_sequential_reader_gets_read_ahead() {
    if !in_private_namespace("readers_of_one_chunk_share_its_fetch_and_a_sequential_reader_gets_read_ahead") {
        return;
    }
    const MIB: u64 = 1 << 20;
    let (registry, _work, _model, weights, relay, reference) = behind_relay("models/ahead", 192 * MIB, 2 * MIB);
    let node = ModelNode::start(vec![format!("--insecure-registry={}", relay.host())]);
    run(&node, &registry, async || {
        let mut csi = node.node().await;
        let (staging, target) = staged_and_published(&node, &mut csi, "pv-ahead", &lazy_ctx(&reference)).await;
        let file = target.join("model.safetensors");
        let before = progress(&node, "pv-ahead").await.unwrap();
        // Eight readers at once, each with its own open, of bytes in the chunk [184, 188) MiB.
        let readers: Vec<_> = (0..8u64)
            .map(|i| {
                let file = file.clone();
                std::thread::spawn(move || read_range(&file, 184 * MIB + i * 8192, 4096))
            })
            .collect();
        for (i, r) in readers.into_iter().enumerate() {
            assert_eq!(r.join().unwrap(), read_range(&weights, 184 * MIB + i as u64 * 8192, 4096));
        }
        // (A reader gets its bytes as soon as they are written: the rest of the chunk may
        // still be coming.)
        let shared = demand_settled(&node, "pv-ahead", before.demand_bytes + 4 * MIB).await;
        assert_eq!(shared.demand_requests - before.demand_requests, 1, "one fetch for 8 readers: {shared:?}");
        assert_eq!(shared.demand_bytes - before.demand_bytes, 4 * MIB, "one chunk: {shared:?}");
        // One reader reads [140, 150) MiB through, 1 MiB at a time: it touches the chunks up to
        // 152 MiB (the file is open for direct I/O: the kernel reads no further), and gets
        // those up to 164 fetched too.
        let through = std::fs::File::open(&file).unwrap();
        for at in (140..150).map(|m| m * MIB) {
            let mut buf = vec![0u8; MIB as usize];
            through.read_exact_at(&mut buf, at).unwrap();
            assert!(buf == read_range(&weights, at, MIB as usize), "bytes at {at}");
        }
        // At least 24 MiB on demand (without read-ahead, 12).
        let ahead = demand_settled(&node, "pv-ahead", shared.demand_bytes + 24 * MIB).await;
        println!(
            "checked: 8 readers of one chunk, 1 request of 4 MiB; a reader of 10 MiB got {} MiB fetched in {} requests",
            (ahead.demand_bytes - shared.demand_bytes) / MIB,
            ahead.demand_requests - shared.demand_requests
        );
        // What was fetched ahead reads without another request.
        assert_eq!(read_range(&file, 160 * MIB, 4096), read_range(&weights, 160 * MIB, 4096));
        let after = progress(&node, "pv-ahead").await.unwrap();
        assert_eq!(after.demand_requests, ahead.demand_requests, "read ahead: {after:?}");
        // A file still downloading is read around the page cache: what was read left no page
        // of the FUSE file in memory. A mapping of it (as a safetensors loader makes) reads
        // through the page cache, from the server all the same.
        assert_eq!(resident(&file), 0, "reads during the fill are direct");
        let at = 176 * MIB;
        let script = format!(
            "import mmap, sys\nf = open(sys.argv[1], 'rb')\nm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\nsys.stdout.buffer.write(m[{at}:{at} + 65536])"
        );
        let mapped = std::process::Command::new("python3").args(["-c", &script]).arg(&file).output().unwrap();
        assert!(mapped.status.success(), "{}", String::from_utf8_lossy(&mapped.stderr));
        assert!(mapped.stdout == read_range(&weights, at, 65536), "the mapping's bytes");
        assert!(resident(&file) >= 16, "a mapping's pages are cached");
        unstage(&mut csi, "pv-ahead", &staging, &target).await;
        assert_eq!(mounts_below(node.dirs.root.path()), Vec::<PathBuf>::new());
    });
}

#[test]
fn a_read_whose_registry_is_gone_fails_in_bounded_time_and_the_fill_resumes() {
    if !in_private_namespace("a_read_whose_registry_is_gone_fails_in_bounded_time_and_the_fill_resumes") {
        return;
    }
    let (mut registry, _work, model, weights, relay, reference) = behind_relay("models/gone", 64 << 20, 2 << 20);
    let node =
        ModelNode::start(vec![format!("--insecure-registry={}", relay.host()), "--lazy-read-wait-secs=3".into()]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    common::guarded(&node.dirs, || {
        rt.block_on(async {
            let mut csi = node.node().await;
            let (staging, target) = staged_and_published(&node, &mut csi, "pv-gone", &lazy_ctx(&reference)).await;
            let weights_at = target.join("model.safetensors");
            assert_eq!(read_range(&weights_at, 0, 4096), read_range(&weights, 0, 4096));
            registry.kill();
            relay.cut();
            // A read of bytes not on the node waits its bounded time, then fails: no hang.
            let t = Instant::now();
            assert_eq!(read_errno(&weights_at, 50 << 20, 1 << 20), Some(nix::libc::EIO));
            let waited = t.elapsed();
            assert!(waited >= Duration::from_secs(3) && waited < Duration::from_secs(20), "waited {waited:?}");
            // What is on the node still reads.
            assert_eq!(read_range(&weights_at, 0, 4096), read_range(&weights, 0, 4096));
            let (abnormal, message) = condition(&mut csi, "pv-gone", &staging).await;
            assert!(abnormal && message.contains("unreachable"), "{message}");
            println!("checked: a read with the registry gone failed with EIO after {waited:?}; condition: {message}");
            registry.restart();
            relay.throttle(u64::MAX);
            // The same read works again, and the fill ends.
            assert_eq!(read_range(&weights_at, 50 << 20, 1 << 20), read_range(&weights, 50 << 20, 1 << 20));
            let done = until_complete(&node, "pv-gone", Duration::from_secs(120)).await;
            assert!(done.stalled.is_empty(), "{done:?}");
            assert_eq!(tree(&target), expected(&model, |_| true));
            let (abnormal, message) = condition(&mut csi, "pv-gone", &staging).await;
            assert!(!abnormal, "{message}");
            unstage(&mut csi, "pv-gone", &staging, &target).await;
            assert_eq!(mounts_below(node.dirs.root.path()), Vec::<PathBuf>::new());
        });
    });
}

#[test]
fn killing_the_lazy_server_mid_fill_heals_it_and_the_fill_goes_on() {
    if !in_private_namespace("killing_the_lazy_server_mid_fill_heals_it_and_the_fill_goes_on") {
        return;
    }
    let (registry, _work, model, weights, relay, reference) = behind_relay("models/heal", 64 << 20, 8 << 20);
    let node = ModelNode::start(vec![format!("--insecure-registry={}", relay.host())]);
    run(&node, &registry, async || {
        let mut csi = node.node().await;
        let (staging, target) = staged_and_published(&node, &mut csi, "pv-heal", &lazy_ctx(&reference)).await;
        until_progress(&node, "pv-heal", Duration::from_secs(60), |p| p.present_bytes > 16 << 20).await;
        let before = node.volumes().await.into_iter().find(|v| v.volume_id == "pv-heal").unwrap();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(before.pid), nix::sys::signal::Signal::SIGKILL).unwrap();
        // Healed: a new server, mounted and bound again; the pod's path reads again.
        let until = Instant::now() + Duration::from_secs(60);
        let after = loop {
            let v = node.volumes().await.into_iter().find(|v| v.volume_id == "pv-heal").unwrap();
            if v.pid != before.pid && v.pid != 0 && v.healthy {
                break v;
            }
            assert!(Instant::now() < until, "not healed: {v:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(after.restarts >= 1);
        assert_eq!(read_range(&target.join("model.safetensors"), 0, 1 << 20), read_range(&weights, 0, 1 << 20));
        relay.throttle(u64::MAX);
        let done = until_complete(&node, "pv-heal", Duration::from_secs(120)).await;
        assert_eq!(tree(&target), expected(&model, |_| true));
        // The fill went on from what was on disk: what it fetched is the model, give or take
        // the ranges in flight when the server died.
        let fetched = done.fill_bytes + done.demand_bytes;
        assert!(fetched <= done.total_bytes + (8 << 20), "{done:?}");
        println!(
            "checked: healed the server (pid {} -> {}); fetched {fetched} bytes for {}",
            before.pid, after.pid, done.total_bytes
        );
        unstage(&mut csi, "pv-heal", &staging, &target).await;
        assert_eq!(mounts_below(node.dirs.root.path()), Vec::<PathBuf>::new());
    });
}

#[test]
fn killing_the_host_mid_fill_re_adopts_the_server_and_the_fill_resumes() {
    if !in_private_namespace("killing_the_host_mid_fill_re_adopts_the_server_and_the_fill_resumes") {
        return;
    }
    let (registry, _work, model, weights, relay, reference) = behind_relay("models/adopt", 64 << 20, 8 << 20);
    let args = vec![format!("--insecure-registry={}", relay.host())];
    let node = ModelNode::start(args.clone());
    run(&node, &registry, async || {
        let mut csi = node.node().await;
        let (staging, target) = staged_and_published(&node, &mut csi, "pv-adopt", &lazy_ctx(&reference)).await;
        until_progress(&node, "pv-adopt", Duration::from_secs(60), |p| p.present_bytes > 16 << 20).await;
        let before = node.volumes().await.into_iter().find(|v| v.volume_id == "pv-adopt").unwrap();
        node.kill_host();
        relay.cut();
        let sent_at_kill = relay.sent();
        // The server lives on: what is on the node still reads with no host at all.
        assert_eq!(read_range(&target.join("model.safetensors"), 0, 1 << 20), read_range(&weights, 0, 1 << 20));
        assert_eq!(tree_of_small(&target), small_files(&model));
        node.restart_host(args.clone());
        relay.throttle(u64::MAX);
        let mut csi = node.node().await;
        let done = until_complete(&node, "pv-adopt", Duration::from_secs(120)).await;
        let after = node.volumes().await.into_iter().find(|v| v.volume_id == "pv-adopt").unwrap();
        assert_eq!(after.pid, before.pid, "re-adopted, not restarted");
        assert_eq!(tree(&target), expected(&model, |_| true));
        let total: u64 = model.layers.iter().map(|l| l.descriptor.size).sum();
        // Resumed from the ranges file: what a kill may lose again, not the whole model.
        let after_restart = done.fill_bytes + done.demand_bytes;
        assert!(
            after_restart + sent_at_kill <= total + mounthost::oci::MAX_REFETCH + (16 << 20),
            "{sent_at_kill} bytes before the kill, {after_restart} after, for {total}"
        );
        println!("checked: host killed after {sent_at_kill} bytes; the new one fetched {after_restart} of {total}");
        unstage(&mut csi, "pv-adopt", &staging, &target).await;
        assert_eq!(mounts_below(node.dirs.root.path()), Vec::<PathBuf>::new());
    });
}

/// The small files of a volume of [`small_model_with_weights`] (all but the weights, which are not read), as
/// [`tree`] lists them.
fn tree_of_small(dir: &Path) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = ["config.json", "tokenizer.json", "README.md"]
        .into_iter()
        .map(|p| (p.to_string(), common::registry::sha256_file(&dir.join(p)).0))
        .collect();
    out.sort();
    out
}

fn small_files(model: &PushedModel) -> Vec<(String, String)> {
    expected(model, |p| p != "model.safetensors")
}

#[test]
fn unstaging_during_the_fill_stops_it_and_leaves_nothing() {
    if !in_private_namespace("unstaging_during_the_fill_stops_it_and_leaves_nothing") {
        return;
    }
    let (registry, _work, model, _, relay, reference) = behind_relay("models/stop", 64 << 20, 4 << 20);
    let node = ModelNode::start(vec![format!("--insecure-registry={}", relay.host())]);
    run(&node, &registry, async || {
        let mut csi = node.node().await;
        let (staging, target) = staged_and_published(&node, &mut csi, "pv-stop", &lazy_ctx(&reference)).await;
        until_progress(&node, "pv-stop", Duration::from_secs(60), |p| p.present_bytes > 8 << 20).await;
        unstage(&mut csi, "pv-stop", &staging, &target).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let sent = relay.sent();
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(relay.sent() - sent < (1 << 20), "the fill went on: {} bytes after the unstage", relay.sent() - sent);
        assert_eq!(mounts_below(node.dirs.root.path()), Vec::<PathBuf>::new());
        assert!(partials(&node.dirs.state).is_empty(), "{:?}", partials(&node.dirs.state));
        assert!(!model.cached(&node.dirs.state, "model.safetensors"));
        assert!(progress(&node, "pv-stop").await.is_none());
        println!("checked: the fill stopped at {sent} bytes; no mount, no partial file left");
    });
}

#[test]
fn a_full_disk_stops_the_fill_and_what_is_there_still_reads() {
    if !in_private_namespace("a_full_disk_stops_the_fill_and_what_is_there_still_reads") {
        return;
    }
    let registry = Registry::start(RegistryOptions::default());
    let work = tempfile::tempdir().unwrap();
    let (model, weights) = small_model_with_weights(&registry, work.path(), "models/full", 64 << 20);
    let dirs = common::NodeDirs::new();
    // The node's cache on a tmpfs too small for the model (the compiled plugins live there too).
    let cache = dirs.state.join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    nix::mount::mount(Some("tmpfs"), &cache, Some("tmpfs"), nix::mount::MsFlags::empty(), Some("size=40m")).unwrap();
    let node = ModelNode::start_in(
        dirs,
        vec![format!("--insecure-registry={}", registry.host()), "--lazy-read-wait-secs=3".into()],
    );
    run(&node, &registry, async || {
        let mut csi = node.node().await;
        let ctx = lazy_ctx(&model.reference);
        let (staging, target) = staged_and_published(&node, &mut csi, "pv-full", &ctx).await;
        let p = until_progress(&node, "pv-full", Duration::from_secs(60), |p| !p.stalled.is_empty()).await;
        assert!(p.stalled.contains("full"), "{p:?}");
        assert!(p.failed.is_empty(), "a full disk is not a failed volume: {p:?}");
        let weights_at = target.join("model.safetensors");
        assert_eq!(read_range(&weights_at, 0, 1 << 20), read_range(&weights, 0, 1 << 20), "what is there reads");
        assert_eq!(tree_of_small(&target), small_files(&model));
        assert_eq!(read_errno(&weights_at, 60 << 20, 4096), Some(nix::libc::EIO), "what is not there fails");
        let (abnormal, message) = condition(&mut csi, "pv-full", &staging).await;
        assert!(abnormal && message.contains("full"), "{message}");
        println!("checked: a full cache stopped the fill at {} bytes; condition: {message}", p.present_bytes);
        unstage(&mut csi, "pv-full", &staging, &target).await;
        assert_eq!(
            mounts_below(node.dirs.root.path()).into_iter().filter(|m| m != &node.dirs.state.join("cache")).count(),
            0
        );
        assert!(partials(&node.dirs.state).is_empty(), "{:?}", partials(&node.dirs.state));
    });
}

#[test]
fn a_blob_that_fails_its_digest_fails_every_read_and_says_so() {
    if !in_private_namespace("a_blob_that_fails_its_digest_fails_every_read_and_says_so") {
        return;
    }
    let registry = Registry::start(RegistryOptions::default());
    let work = tempfile::tempdir().unwrap();
    let (model, _) = small_model_with_weights(&registry, work.path(), "models/corrupt", 16 << 20);
    let digest = model.layer("model.safetensors").digest.clone();
    let stored = registry.blob_storage_path(&digest);
    let mut bytes = std::fs::read(&stored).unwrap();
    bytes[5 << 20] ^= 0xff;
    std::fs::write(&stored, &bytes).unwrap();
    let node = ModelNode::start(vec![format!("--insecure-registry={}", registry.host())]);
    run(&node, &registry, async || {
        let mut csi = node.node().await;
        let (staging, target) = staged_and_published(&node, &mut csi, "pv-corrupt", &lazy_ctx(&model.reference)).await;
        let p = until_progress(&node, "pv-corrupt", Duration::from_secs(60), |p| !p.failed.is_empty()).await;
        assert!(p.failed.contains(&digest), "{p:?}");
        // Every read fails from now on, the small files' too.
        for f in ["config.json", "model.safetensors", "README.md"] {
            assert_eq!(read_errno(&target.join(f), 0, 1), Some(nix::libc::EIO), "{f}");
        }
        let (abnormal, message) = condition(&mut csi, "pv-corrupt", &staging).await;
        assert!(abnormal && message.contains(&digest) && message.contains("digest"), "{message}");
        assert!(node.dirs.logs().contains("does not match its digest"), "the log says so");
        assert!(!model.cached(&node.dirs.state, "model.safetensors"), "the blob is dropped from the cache");
        assert!(partials(&node.dirs.state).is_empty());
        println!("checked: a corrupted blob failed the volume: {message}");
        unstage(&mut csi, "pv-corrupt", &staging, &target).await;
    });
}

#[test]
fn an_indexed_volume_checks_every_chunk_before_a_reader_gets_it() {
    if !in_private_namespace("an_indexed_volume_checks_every_chunk_before_a_reader_gets_it") {
        return;
    }
    let (registry, work, model, weights, relay, reference) = behind_relay("models/indexed", 32 << 20, u64::MAX);
    let node = ModelNode::start(vec![format!("--insecure-registry={}", relay.host())]);
    // The publisher indexes the model (1 MiB chunks), through the same registry.
    let out = node.cli(&["--insecure-registry", &relay.host(), "model", "index", &reference, "--chunk-mib", "1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let pushed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(pushed["subject"], model.manifest_digest.as_str(), "{pushed}");
    assert_eq!(pushed["layers"], model.layers.len(), "{pushed}");
    // Then one chunk of the weights is corrupted in the registry.
    let digest = model.layer("model.safetensors").digest.clone();
    registry.corrupt(&digest, (9 << 20) + 7);
    relay.throttle(2 << 20);
    run(&node, &registry, async || {
        let mut csi = node.node().await;
        let (staging, target) = staged_and_published(&node, &mut csi, "pv-indexed", &lazy_ctx(&reference)).await;
        // What the session reports once it talks to the server (right after the stage, its
        // status may not be out yet).
        let p = until_progress(&node, "pv-indexed", Duration::from_secs(30), |p| p.connected).await;
        assert!(p.indexed, "the volume found the index: {p:?}");
        let weights_at = target.join("model.safetensors");
        // A good chunk ahead of the fill reads; the bad one is fetched again once, then EIO.
        assert_eq!(read_range(&weights_at, 20 << 20, 1 << 20), read_range(&weights, 20 << 20, 1 << 20));
        assert_eq!(read_errno(&weights_at, 9 << 20, 4096), Some(nix::libc::EIO));
        assert_eq!(read_range(&weights_at, 21 << 20, 4096), read_range(&weights, 21 << 20, 4096), "others still read");
        relay.throttle(u64::MAX);
        // The blob can never be whole: the volume fails.
        let p = until_progress(&node, "pv-indexed", Duration::from_secs(60), |p| !p.failed.is_empty()).await;
        assert!(p.failed.contains(&digest), "{p:?}");
        assert_eq!(read_errno(&target.join("config.json"), 0, 1), Some(nix::libc::EIO));
        println!("checked: an indexed volume refused a bad chunk and then failed: {}", p.failed);
        unstage(&mut csi, "pv-indexed", &staging, &target).await;
        // The same model, indexed and intact, reads whole.
        let fine = small_model_with_weights(&registry, work.path(), "models/indexed-fine", 8 << 20).0;
        let reference = fine.reference.replace(&registry.host(), &relay.host());
        let out = node.cli(&["--insecure-registry", &relay.host(), "model", "index", &reference]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let (staging, target) = staged_and_published(&node, &mut csi, "pv-indexed-2", &lazy_ctx(&reference)).await;
        let done = until_complete(&node, "pv-indexed-2", Duration::from_secs(60)).await;
        assert!(done.indexed && done.failed.is_empty(), "{done:?}");
        assert_eq!(tree(&target), expected(&fine, |_| true));
        unstage(&mut csi, "pv-indexed-2", &staging, &target).await;
    });
}

#[test]
fn a_server_binary_its_user_cannot_reach_fails_the_stage_naming_the_directory() {
    if !in_private_namespace("a_server_binary_its_user_cannot_reach_fails_the_stage_naming_the_directory") {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let (registry, _work, model, _weights, _relay, reference) = behind_relay("models/unreachable", 1 << 20, u64::MAX);
    // The host's binary in a directory only root may search (a checkout in a 0700 home).
    // Below /tmp, whose parents everyone may search, whatever TMPDIR says.
    let closed = tempfile::tempdir_in("/tmp").unwrap();
    std::fs::set_permissions(closed.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let server = closed.path().join("mounthost");
    std::fs::copy(env!("CARGO_BIN_EXE_mounthost"), &server).unwrap();
    let node = ModelNode::start(vec![
        format!("--insecure-registry={}", reference.split('/').next().unwrap()),
        format!("--lazy-server={}", server.display()),
    ]);
    run(&node, &registry, async || {
        let mut csi = node.node().await;
        let staging = node.dirs.staging("pv-unreachable");
        let err =
            csi.node_stage_volume(stage_req("pv-unreachable", &staging, &lazy_ctx(&reference))).await.unwrap_err();
        let dir = closed.path().display().to_string();
        assert!(
            err.message().contains(&format!("the directory {dir} (mode 700) does not let other users search it")),
            "{err:?}"
        );
        assert!(mounts_below(&staging).is_empty());
        // Searchable, the same stage works.
        std::fs::set_permissions(closed.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        csi.node_stage_volume(stage_req("pv-unreachable", &staging, &lazy_ctx(&reference))).await.unwrap();
        let target = node.dirs.target("pod-unreachable", "pv-unreachable");
        csi.node_publish_volume(publish_req("pv-unreachable", &staging, &target, &lazy_ctx(&reference))).await.unwrap();
        until_complete(&node, "pv-unreachable", Duration::from_secs(60)).await;
        assert_eq!(tree(&target), expected(&model, |_| true));
        unstage(&mut csi, "pv-unreachable", &staging, &target).await;
    });
}

/// Push `doc` (a chunk index document) into `model`'s repository as the chunk index of its
/// manifest, by hand: the artifact, and the referrers tag schema's index listing it.
fn push_index_doc(registry: &Registry, model: &PushedModel, doc: &mounthost::oci::IndexDoc) {
    let repo = &model.repo;
    let doc = serde_json::to_vec(doc).unwrap();
    let index = registry.push_blob(repo, doc.as_slice());
    let config = registry.push_blob(repo, b"{}".as_slice());
    let artifact = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": mounthost::oci::INDEX_ARTIFACT_TYPE,
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": config.digest, "size": config.size},
        "layers": [{"mediaType": mounthost::oci::INDEX_ARTIFACT_TYPE, "digest": index.digest, "size": index.size}],
        "subject": {
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": model.manifest_digest,
            "size": model.manifest.len(),
        },
    })
    .to_string();
    let artifact_digest = common::registry::sha256_digest(artifact.as_bytes());
    registry.push_manifest(repo, &artifact_digest, &artifact);
    let list = common::registry::chunk_index_referrers(&artifact_digest, &artifact);
    registry.push_manifest(repo, &model.manifest_digest.replace(':', "-"), &list);
}

#[test]
fn a_wrong_index_fails_only_its_own_volume_and_the_blob_digest_overrules_it() {
    if !in_private_namespace("a_wrong_index_fails_only_its_own_volume_and_the_blob_digest_overrules_it") {
        return;
    }
    let (registry, _work, model, weights, relay, reference) = behind_relay("models/shared-a", 24 << 20, u64::MAX);
    // The same manifest, and so the same blobs, in another repository, without an index.
    for l in &model.layers {
        registry.push_blob("models/shared-b", std::fs::read(registry.blob_storage_path(&l.descriptor.digest)).unwrap());
    }
    registry.push_blob("models/shared-b", std::fs::read(registry.blob_storage_path(&model.config.digest)).unwrap());
    registry.push_manifest("models/shared-b", "v1", &model.manifest);
    let reference_b = reference.replace("models/shared-a", "models/shared-b");
    // Whoever can push to the first repository gives its manifest an index that is wrong about
    // one chunk of the weights.
    let layers: Vec<(String, Vec<u8>)> = model
        .layers
        .iter()
        .map(|l| {
            (l.descriptor.digest.clone(), std::fs::read(registry.blob_storage_path(&l.descriptor.digest)).unwrap())
        })
        .collect();
    let digest = model.layer("model.safetensors").digest.clone();
    let mut doc = mounthost::oci::index_of(1 << 20, &layers);
    doc.blobs.get_mut(&digest).unwrap().chunks[13] = "00".repeat(32);
    push_index_doc(&registry, &model, &doc);
    relay.throttle(2 << 20);
    let node = ModelNode::start(vec![format!("--insecure-registry={}", relay.host())]);
    run(&node, &registry, async || {
        let mut csi = node.node().await;
        let (staging_a, target_a) = staged_and_published(&node, &mut csi, "pv-index-a", &lazy_ctx(&reference)).await;
        // What the sessions report once they talk to their servers.
        let connected = |p: &LazyProgress| p.connected;
        assert!(until_progress(&node, "pv-index-a", Duration::from_secs(30), connected).await.indexed);
        let (staging_b, target_b) = staged_and_published(&node, &mut csi, "pv-index-b", &lazy_ctx(&reference_b)).await;
        assert!(!until_progress(&node, "pv-index-b", Duration::from_secs(30), connected).await.indexed);
        let (weights_a, weights_b) = (target_a.join("model.safetensors"), target_b.join("model.safetensors"));
        // The volume with the wrong index: its chunk is fetched again once, then EIO (the
        // host's refusal, not a read that waited too long).
        let open_during_fill = std::fs::File::open(&weights_a).unwrap();
        assert_eq!(read_errno(&weights_a, 13 << 20, 4096), Some(nix::libc::EIO));
        assert!(node.dirs.logs().contains("a chunk does not match an index twice"));
        assert_eq!(read_range(&weights_a, 12 << 20, 4096), read_range(&weights, 12 << 20, 4096), "others read");
        // The other manifest's volume reads the same bytes: another index does not decide for it.
        assert_eq!(read_range(&weights_b, 13 << 20, 1 << 20), read_range(&weights, 13 << 20, 1 << 20));
        assert!(read_errno(&weights_b, 13 << 20, 4096).is_none());
        relay.throttle(u64::MAX);
        // The blob completes and matches its digest: the index was wrong, and nobody fails.
        let a = until_complete(&node, "pv-index-a", Duration::from_secs(60)).await;
        let b = until_complete(&node, "pv-index-b", Duration::from_secs(60)).await;
        assert!(a.failed.is_empty() && b.failed.is_empty(), "{a:?} {b:?}");
        assert_eq!(read_range(&weights_a, 13 << 20, 1 << 20), read_range(&weights, 13 << 20, 1 << 20));
        // A handle opened during the fill is served by the lazy server (no passthrough): it
        // reads the chunk too.
        let mut buf = vec![0u8; 1 << 20];
        open_during_fill.read_exact_at(&mut buf, 13 << 20).unwrap();
        assert_eq!(buf, read_range(&weights, 13 << 20, 1 << 20));
        drop(open_during_fill);
        assert_eq!(tree(&target_a), expected(&model, |_| true));
        assert_eq!(tree(&target_b), expected(&model, |_| true));
        assert!(!condition(&mut csi, "pv-index-a", &staging_a).await.0);
        let logs = node.dirs.logs();
        assert!(logs.contains("a chunk index gave other hashes for these ranges"), "the host says the index was wrong");
        println!("checked: a wrong index made only its own volume's chunk EIO, and the blob's digest overruled it");
        unstage(&mut csi, "pv-index-a", &staging_a, &target_a).await;
        unstage(&mut csi, "pv-index-b", &staging_b, &target_b).await;
    });
}

/// The pid of dynamic mount `id`'s lazy server, from volume `pv`'s state file.
fn mount_server(state: &Path, pv: &str, id: &str) -> Option<i32> {
    let key = mounthost::volume::dirs::volume_key(pv);
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state.join(format!("volumes/{key}.json"))).ok()?).ok()?;
    doc["dynamic"][id]["process"]["pid"].as_i64().map(|p| p as i32)
}

fn alive(pid: i32) -> bool {
    std::fs::metadata(format!("/proc/{pid}")).is_ok()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z ")
}

#[test]
fn a_pod_mounts_a_model_lazily_through_its_dynamic_volume() {
    use common::dynamic::{DynNode, call, dynamic_ctx, files_of, regular_files, snapshot, tiny_model, try_call};
    if !in_private_namespace("a_pod_mounts_a_model_lazily_through_its_dynamic_volume") {
        return;
    }
    let (registry, work, model, weights, relay, reference) = behind_relay("models/dyn-lazy", 32 << 20, 2 << 20);
    let base = tiny_model(&registry, "models/base", "v1", b"base weights");
    let (second, _) = small_model_with_weights(&registry, work.path(), "models/dyn-lazy-second", 32 << 20);
    let second_ref = second.reference.replace(&registry.host(), &relay.host());
    let node = DynNode::start_with(
        &registry,
        &[&format!("--insecure-registry={}", relay.host()), &format!("--grant=model:host={}", relay.host())],
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let pv = "pvc-7d1e0c9a-lazy-dynamic";
    common::guarded(&node.dirs, || {
        rt.block_on(async {
            let mut csi = node.node().await;
            // A lazy dynamic volume: its mounts are lazy unless they say otherwise.
            let mut ctx = dynamic_ctx(&base.reference);
            ctx.insert("lazy".into(), "true".into());
            let dir = node.dynamic_volume(&mut csi, pv, "pod-lazy-dyn", &ctx).await;
            assert_eq!(std::fs::read(dir.join("volume/model.safetensors")).unwrap(), b"base weights");
            // CreateVolume carries `lazy` from a StorageClass into the volume's context, and
            // refuses any other value than "true" and "false".
            let mut controller = mounthost::proto::csi::controller_client::ControllerClient::new(
                mounthost::unpriv::grpc::channel(&node.dirs.csi_sock),
            );
            let create = |lazy: &str| csi::CreateVolumeRequest {
                name: "pvc-lazy-class".into(),
                volume_capabilities: vec![common::multi_writer()],
                parameters: lazy_ctx(&base.reference).into_iter().chain([("lazy".into(), lazy.into())]).collect(),
                ..Default::default()
            };
            let vol = controller.create_volume(create("true")).await.unwrap().into_inner().volume.unwrap();
            assert_eq!(vol.volume_context["lazy"], "true");
            let err = controller.create_volume(create("yes")).await.unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
            assert!(err.message().contains("lazy"), "{err:?}");
            // ValidateVolumeCapabilities confirms the volume's own `lazy`, and leaves another
            // value unconfirmed, naming the key and where it was (never an error).
            let validate = |context: Option<&str>, parameter: Option<&str>| {
                let mut volume_context = vol.volume_context.clone();
                if let Some(v) = context {
                    volume_context.insert("lazy".into(), v.into());
                }
                csi::ValidateVolumeCapabilitiesRequest {
                    volume_id: vol.volume_id.clone(),
                    volume_context,
                    parameters: parameter.map(|v| ("lazy".to_string(), v.to_string())).into_iter().collect(),
                    volume_capabilities: vec![common::multi_writer()],
                    ..Default::default()
                }
            };
            let v = controller.validate_volume_capabilities(validate(None, None)).await.unwrap().into_inner();
            assert!(v.confirmed.is_some_and(|c| c.volume_context["lazy"] == "true"), "{}", v.message);
            for (req, says) in [
                (validate(Some("yes"), None), "volume_context: volume attribute lazy"),
                (validate(None, Some("1")), "parameters: volume attribute lazy"),
            ] {
                let v = controller.validate_volume_capabilities(req).await.unwrap().into_inner();
                assert!(v.confirmed.is_none() && v.message.contains(says), "{v:?}");
            }
            controller
                .delete_volume(csi::DeleteVolumeRequest { volume_id: vol.volume_id.clone(), ..Default::default() })
                .await
                .unwrap();
            // A bad value is refused before anything is recorded.
            let (status, v) = call(
                &dir,
                "POST",
                "/mounts",
                Some(serde_json::json!({"id": "bad", "parameters": {"reference": reference, "lazy": "yes"}})),
            );
            assert_eq!(status, 400, "{v}");
            assert!(v["message"].as_str().unwrap().contains("lazy"), "{v}");
            // A mount that says so is eager: mounted once its blobs are there, no server.
            let (status, v) = call(
                &dir,
                "POST",
                "/mounts",
                Some(serde_json::json!({"id": "eager", "parameters": {"reference": base.reference, "lazy": "false"}})),
            );
            assert!(matches!(status, 200..=202), "{status} {v}");
            let v = common::dynamic::wait_state(&dir, "eager", "ready");
            assert!(v.get("lazy").is_none(), "{v}");
            assert_eq!(mount_server(&node.dirs.state, pv, "eager"), None);
            assert_eq!(std::fs::read(dir.join("mounts/eager/model.safetensors")).unwrap(), b"base weights");
            // Lazy as its volume: ready at once, long before its weights are on the node.
            let (status, v) = call(
                &dir,
                "POST",
                "/mounts",
                Some(serde_json::json!({"id": "lazy", "parameters": {"reference": reference}})),
            );
            assert!(matches!(status, 200..=202), "{status} {v}");
            let v = common::dynamic::wait_state(&dir, "lazy", "ready");
            assert!(relay.sent() < (16 << 20), "ready after {} bytes", relay.sent());
            let at = dir.join("mounts/lazy");
            assert_eq!(tree_of_small(&at), small_files(&model));
            assert_eq!(read_range(&at.join("model.safetensors"), 20 << 20, 4096), read_range(&weights, 20 << 20, 4096));
            let (_, v2) = call(&dir, "GET", "/mounts/lazy", None);
            assert!(v2["lazy"]["demandRequests"].as_u64().unwrap() > 0, "{v2}");
            assert_eq!(v2["lazy"]["layers"], 4, "{v2}");
            println!("checked: a lazy dynamic mount was ready after {} bytes: {v}", relay.sent());
            // Its server killed: started again by its session, and the files read again.
            let first = mount_server(&node.dirs.state, pv, "lazy").expect("its server is recorded");
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(first), nix::sys::signal::Signal::SIGKILL).unwrap();
            let until = Instant::now() + Duration::from_secs(30);
            let second = loop {
                if let Some(p) = mount_server(&node.dirs.state, pv, "lazy").filter(|p| *p != first && alive(*p)) {
                    break p;
                }
                assert!(Instant::now() < until, "the server was not started again");
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            assert_eq!(tree_of_small(&at), small_files(&model));
            // The host daemon killed: the server is re-adopted, not started again.
            node.restart_host();
            relay.throttle(u64::MAX);
            let until = Instant::now() + Duration::from_secs(120);
            loop {
                // The new daemon serves the volume's socket again once it re-adopted the volume.
                let (_, v) = try_call(&dir, "GET", "/mounts/lazy", None).unwrap_or_default();
                if v["lazy"]["layers"].as_u64().is_some() && v["lazy"]["layersComplete"] == v["lazy"]["layers"] {
                    break;
                }
                assert!(Instant::now() < until, "the fill did not end: {v}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert_eq!(mount_server(&node.dirs.state, pv, "lazy"), Some(second), "re-adopted");
            assert_eq!(regular_files(&snapshot(&at)), files_of(&model));
            // Deleted: its server, its mounts and nothing of its blobs' downloads left.
            let (status, v) = call(&dir, "DELETE", "/mounts/lazy", None);
            assert_eq!(status, 200, "{v}");
            assert!(!alive(second), "its server is stopped");
            assert_eq!(mounts_below(&dir.join("mounts")), vec![dir.join("mounts/eager")], "the eager one stays");
            assert!(partials(&node.dirs.state).is_empty());
            println!("checked: a lazy dynamic mount healed (pid {first} -> {second}), re-adopted and deleted");
            // Unpublished mid-fill: its server stopped, its downloads stopped and their partial
            // files removed, nothing mounted below the target.
            relay.throttle(1 << 20);
            let (status, v) = call(
                &dir,
                "POST",
                "/mounts",
                Some(serde_json::json!({"id": "second", "parameters": {"reference": second_ref}})),
            );
            assert!(matches!(status, 200..=202), "{status} {v}");
            common::dynamic::wait_state(&dir, "second", "ready");
            let server = mount_server(&node.dirs.state, pv, "second").expect("its server is recorded");
            let until = Instant::now() + Duration::from_secs(30);
            while partials(&node.dirs.state).is_empty() {
                assert!(Instant::now() < until, "no fill started");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            csi.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                volume_id: pv.into(),
                target_path: dir.display().to_string(),
            })
            .await
            .unwrap();
            assert!(!alive(server), "its server is stopped");
            assert_eq!(mounts_below(&dir), Vec::<PathBuf>::new());
            assert!(partials(&node.dirs.state).is_empty(), "{:?}", partials(&node.dirs.state));
            println!("checked: a volume unpublished during a lazy mount's fill left nothing of it");
        });
    });
}

/// A pod names a lazy model inline: its first publish answers at once, the pod reads while the
/// fill runs, and the unpublish (which unstages it) stops the fill and leaves nothing.
#[test]
fn an_inline_lazy_volume_is_published_at_once_and_leaves_nothing() {
    if !in_private_namespace("an_inline_lazy_volume_is_published_at_once_and_leaves_nothing") {
        return;
    }
    let (registry, _work, _model, weights, relay, reference) = behind_relay("models/inline-lazy", 32 << 20, 1 << 20);
    // An inline volume's attributes grant nothing: the node grants the relay.
    let node = ModelNode::start(vec![
        format!("--insecure-registry={}", relay.host()),
        format!("--grant=model:host={}", relay.host()),
    ]);
    run(&node, &registry, async || {
        let mut csi = node.node().await;
        let mut ctx = lazy_ctx(&reference);
        ctx.insert("csi.storage.k8s.io/ephemeral".into(), "true".into());
        let target = node.dirs.target("pod-inline", "lazy");
        let req = csi::NodePublishVolumeRequest {
            volume_id: "csi-inline-lazy".into(),
            target_path: target.display().to_string(),
            volume_capability: Some(common::multi_writer()),
            volume_context: ctx,
            ..Default::default()
        };
        // Compressed layers are no reason to wait: the first call answers.
        csi.node_publish_volume(req).await.unwrap();
        assert!(relay.sent() < (8 << 20), "published after {} bytes", relay.sent());
        assert_eq!(read_range(&target.join("model.safetensors"), 30 << 20, 4096), read_range(&weights, 30 << 20, 4096));
        let p = progress(&node, "csi-inline-lazy").await.expect("ListVolumes shows its progress");
        assert!(p.present_bytes < p.total_bytes, "still filling: {p:?}");
        csi.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: "csi-inline-lazy".into(),
            target_path: target.display().to_string(),
        })
        .await
        .unwrap();
        assert_eq!(mounts_below(node.dirs.root.path()), Vec::<PathBuf>::new());
        assert!(partials(&node.dirs.state).is_empty(), "{:?}", partials(&node.dirs.state));
        assert!(node.volumes().await.is_empty());
        println!("checked: an inline lazy volume published after {} bytes and unpublished mid-fill", relay.sent());
    });
}
