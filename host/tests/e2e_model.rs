//! End to end, as root, in a private mount namespace: ModelPack artifacts built and pushed here
//! into a real `docker-registry` (Debian's package, its own config on 127.0.0.1), staged and
//! published by kubelet-shaped calls through the real front and host daemon processes (the
//! harness: `common::model`).

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::model::*;
use common::registry::{PushedModel, Registry, RegistryOptions};
use common::{NodeDirs, guarded, in_private_namespace, mounts_below};
use mounthost::proto::csi;
use tonic::Code;

#[test]
fn a_model_stages_from_the_registry_and_publishes_read_only() {
    if !in_private_namespace("a_model_stages_from_the_registry_and_publishes_read_only") {
        return;
    }
    let registry = Registry::start(RegistryOptions::default());
    let work = tempfile::tempdir().unwrap();
    let model = small_model(&registry, work.path(), "models/demo", 256 << 20);
    let insecure = format!("--insecure-registry={}", registry.host());
    let node = ModelNode::start(vec![insecure]);
    run(&node, &registry, async || {
        let mut csi = node.node().await;
        let ctx = model_ctx(&model.reference, &[("insecure", "true")]);
        let staging = node.dirs.staging("pv-model-1");
        let req = stage_req("pv-model-1", &staging, &ctx);

        // The first call starts the download and answers at once.
        let first = csi.node_stage_volume(req.clone()).await.unwrap_err();
        assert_eq!(first.code(), Code::Unavailable, "{first:?}");
        assert!(first.message().contains("pulling") && first.message().contains(&model.reference), "{first:?}");
        // (ListVolumes' progress while pulling: two_volumes_staged_at_once_share_one_download.)
        let total: u64 = model.layers.iter().map(|l| l.descriptor.size).sum();
        let (waits, done) = stage_until_done(&mut csi, &req, Duration::from_secs(120)).await;
        done.unwrap();
        println!("checked: staged after {} UNAVAILABLE answers", waits.len() + 1);

        let target = node.dirs.target("pod-1", "pv-model-1");
        csi.node_publish_volume(publish_req("pv-model-1", &staging, &target, &ctx)).await.unwrap();
        assert_eq!(tree(&target), expected(&model, |_| true), "the pod sees exactly the model's files, byte for byte");
        // CSI NodeExpandVolume of a volume that cannot grow: "Unsupported capacity", OUT_OF_RANGE.
        let grow = csi::NodeExpandVolumeRequest {
            volume_id: "pv-model-1".into(),
            volume_path: target.display().to_string(),
            capacity_range: Some(csi::CapacityRange { required_bytes: 1 << 30, limit_bytes: 0 }),
            staging_target_path: staging.display().to_string(),
            ..Default::default()
        };
        let err = csi.node_expand_volume(grow).await.unwrap_err();
        assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
        assert!(err.message().contains("cannot be expanded"), "{err:?}");
        let write = std::fs::write(target.join("config.json"), b"x").unwrap_err();
        assert_eq!(write.raw_os_error(), Some(nix::errno::Errno::EROFS as i32), "{write}");
        let create = std::fs::write(target.join("new-file"), b"x").unwrap_err();
        assert_eq!(create.raw_os_error(), Some(nix::errno::Errno::EROFS as i32), "{create}");
        let fetched = node.fetched();
        assert!(fetched >= total as f64, "fetched {fetched} of {total}");
        // One pull, every blob fetched by it, none found on the node, none pulling now.
        let layers = model.layers.len() as f64;
        let scrape = node.scrape();
        let first = Pulls::of(&scrape, &registry.host());
        let expected_first = Pulls {
            fetched,
            from_cache: 0.0,
            dedup_cached: 0.0,
            dedup_downloading: 0.0,
            in_progress: 0.0,
            ok: 1.0,
            failed: 0.0,
        };
        assert_eq!(first, expected_first, "after the first volume:\n{}", scrape.dump());
        println!("checked: pull metrics after the first volume: {}", Pulls::line(&scrape, &registry.host()));

        // A second volume of the same model downloads nothing and stages on the first call:
        // a second pull, every blob served from the cache and deduplicated.
        let staging2 = node.dirs.staging("pv-model-2");
        let t = Instant::now();
        csi.node_stage_volume(stage_req("pv-model-2", &staging2, &ctx)).await.unwrap();
        let took = t.elapsed();
        assert_eq!(node.fetched(), fetched, "a cached model costs no download");
        let scrape = node.scrape();
        let second = Pulls::of(&scrape, &registry.host());
        let expected_second = Pulls { from_cache: total as f64, dedup_cached: layers, ok: 2.0, ..expected_first };
        assert_eq!(second, expected_second, "after the second volume:\n{}", scrape.dump());
        let fast = scrape.value(
            "mounthost_oci_pull_duration_seconds_bucket",
            &[("registry", &registry.host()), ("outcome", "ok"), ("le", "0.64")],
        );
        assert!(fast >= 1.0, "the cached pull took under 0.64 s:\n{}", scrape.dump());
        println!("checked: pull metrics after the second volume: {}", Pulls::line(&scrape, &registry.host()));
        println!("checked: second volume of a cached model staged in {took:?}");

        // Filters: the weights alone, and everything but the weights.
        for (pv, weights, keep) in [
            ("pv-weights", "only", (|p: &str| p == "model.safetensors") as fn(&str) -> bool),
            ("pv-no-weights", "exclude", |p: &str| p != "model.safetensors"),
        ] {
            let ctx = model_ctx(&model.reference, &[("insecure", "true"), ("weights", weights)]);
            let staging = node.dirs.staging(pv);
            csi.node_stage_volume(stage_req(pv, &staging, &ctx)).await.unwrap();
            assert_eq!(tree(&staging), expected(&model, keep), "weights={weights}");
            csi.node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: pv.into(),
                staging_target_path: staging.display().to_string(),
            })
            .await
            .unwrap();
        }

        // The cache lists the blobs with the volumes that use them; pruning keeps those.
        let ls = node.cli(&["cache", "ls"]);
        assert!(ls.status.success(), "{}", String::from_utf8_lossy(&ls.stderr));
        let ls: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
        let weights = model.layer("model.safetensors");
        let entry = ls["blobs"].as_array().unwrap().iter().find(|b| b["digest"] == weights.digest.as_str()).unwrap();
        assert_eq!(entry["size"], weights.size);
        let users: BTreeSet<&str> = entry["volumes"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        assert_eq!(users, BTreeSet::from(["pv-model-1", "pv-model-2"]), "{ls}");
        let prune = node.cli(&["cache", "prune"]);
        assert!(prune.status.success(), "{}", String::from_utf8_lossy(&prune.stderr));
        assert!(model.cached(&node.dirs.state, "model.safetensors"));

        // Unstaged, nothing is mounted any more; pruned, the cache is empty.
        csi.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: "pv-model-1".into(),
            target_path: target.display().to_string(),
        })
        .await
        .unwrap();
        for (pv, staging) in [("pv-model-1", &staging), ("pv-model-2", &staging2)] {
            csi.node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: pv.into(),
                staging_target_path: staging.display().to_string(),
            })
            .await
            .unwrap();
        }
        assert_eq!(mounts_below(node.dirs.root.path()), Vec::<PathBuf>::new());
        let prune = node.cli(&["cache", "prune"]);
        let pruned: serde_json::Value = serde_json::from_slice(&prune.stdout).unwrap();
        assert_eq!(pruned["evictedBlobs"], model.layers.len(), "{pruned}");
        assert!(!model.cached(&node.dirs.state, "model.safetensors"));
    });
}

#[test]
fn two_volumes_staged_at_once_share_one_download() {
    if !in_private_namespace("two_volumes_staged_at_once_share_one_download") {
        return;
    }
    let registry = Registry::start(RegistryOptions::default());
    let work = tempfile::tempdir().unwrap();
    let model = small_model(&registry, work.path(), "models/shared", 64 << 20);
    let relay = Relay::start(registry.host());
    relay.throttle(32 << 20);
    let reference = model.reference.replace(&registry.host(), &relay.host());
    let node = ModelNode::start(vec![format!("--insecure-registry={}", relay.host())]);
    run(&node, &registry, async || {
        let ctx = model_ctx(&reference, &[("insecure", "true")]);
        let (req_a, req_b) =
            (stage_req("pv-a", &node.dirs.staging("pv-a"), &ctx), stage_req("pv-b", &node.dirs.staging("pv-b"), &ctx));
        let (mut csi_a, mut csi_b) = (node.node().await, node.node().await);
        let blobs: u64 = model.layers.iter().map(|l| l.descriptor.size).sum();
        // Both answer at once while the (throttled) download runs, and both show its progress.
        for (csi, req) in [(&mut csi_a, &req_a), (&mut csi_b, &req_b)] {
            let e = csi.node_stage_volume(req.clone()).await.unwrap_err();
            assert_eq!(e.code(), Code::Unavailable, "{e:?}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let listed = node.volumes().await;
        for pv in ["pv-a", "pv-b"] {
            let v = listed.iter().find(|v| v.volume_id == pv).unwrap_or_else(|| panic!("{pv} not listed: {listed:?}"));
            assert_eq!(v.phase, "pulling", "{v:?}");
            assert_eq!(v.pull_total_bytes, blobs, "{v:?}");
            assert!(v.pull_done_bytes > 0 && v.pull_done_bytes < blobs, "{v:?}");
            assert_eq!(v.pull_blobs.len(), model.layers.len(), "{v:?}");
            assert!(v.condition.contains("pulling"), "{v:?}");
        }
        // Two pulls in progress; the second joined the first's downloads (a small layer may
        // have been complete already when it asked: then it was served from the cache).
        let scrape = node.scrape();
        let during = Pulls::of(&scrape, &relay.host());
        assert_eq!(during.in_progress, 2.0, "{}", scrape.dump());
        assert_eq!(during.dedup_downloading + during.dedup_cached, model.layers.len() as f64, "{}", scrape.dump());
        assert!(during.dedup_downloading >= 1.0, "the weights were still downloading: {during:?}");
        assert_eq!(during.ok, 0.0, "{during:?}");
        println!("checked: pull metrics while both volumes pull: {}", Pulls::line(&scrape, &relay.host()));
        let client = node.cli(&["client", "list"]);
        let shown: serde_json::Value = serde_json::from_slice(&client.stdout).unwrap();
        let a = shown.as_array().unwrap().iter().find(|v| v["volumeId"] == "pv-a").unwrap();
        assert_eq!(a["pull"]["totalBytes"], blobs, "{shown}");
        let ((_, a), (_, b)) = tokio::join!(
            stage_until_done(&mut csi_a, &req_a, Duration::from_secs(120)),
            stage_until_done(&mut csi_b, &req_b, Duration::from_secs(120))
        );
        a.unwrap();
        b.unwrap();
        let fetched = node.fetched() as u64;
        assert!(fetched >= blobs && fetched < blobs + blobs / 10, "one download: fetched {fetched}, blobs {blobs}");
        assert!(relay.sent() < 2 * blobs, "the registry sent {} for {blobs} bytes of blobs", relay.sent());
        let scrape = node.scrape();
        let after = Pulls::of(&scrape, &relay.host());
        let expected = Pulls { fetched: fetched as f64, in_progress: 0.0, ok: 2.0, ..during };
        assert_eq!(after, expected, "after both:\n{}", scrape.dump());
        println!("checked: pull metrics after both volumes: {}", Pulls::line(&scrape, &relay.host()));
        println!("checked: two volumes, {fetched} bytes fetched for {blobs} bytes of blobs");
    });
}

#[test]
fn a_registry_with_a_private_ca_needs_that_ca() {
    if !in_private_namespace("a_registry_with_a_private_ca_needs_that_ca") {
        return;
    }
    let registry = Registry::start(RegistryOptions { tls: true, ..Default::default() });
    let work = tempfile::tempdir().unwrap();
    let model = small_model(&registry, work.path(), "models/tls", 1 << 20);
    let node = ModelNode::start(vec![]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    guarded(&node.dirs, || {
        rt.block_on(async {
            let mut csi = node.node().await;
            let ctx = model_ctx(&model.reference, &[]);
            let staging = node.dirs.staging("pv-tls");
            let req = stage_req("pv-tls", &staging, &ctx);
            let (_, r) = stage_until_done(&mut csi, &req, Duration::from_secs(30)).await;
            let e = r.unwrap_err();
            assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
            assert!(e.message().contains(&registry.host()) && e.message().contains("TLS"), "{e:?}");
            assert!(e.message().contains("--registry-ca"), "says how to fix it: {e:?}");
            assert_eq!(mounts_below(node.dirs.root.path()), Vec::<PathBuf>::new());
        });
        node.restart_host(vec![format!("--registry-ca={}", registry.ca_pem().display())]);
        rt.block_on(async {
            let mut csi = node.node().await;
            let ctx = model_ctx(&model.reference, &[]);
            let staging = node.dirs.staging("pv-tls");
            let (_, r) =
                stage_until_done(&mut csi, &stage_req("pv-tls", &staging, &ctx), Duration::from_secs(60)).await;
            r.unwrap();
            assert_eq!(tree(&staging), expected(&model, |_| true));
        });
    });
}

/// Every file below `dir` whose bytes contain `needle`.
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    fn walk(dir: &Path, needle: &[u8], out: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(meta) = std::fs::symlink_metadata(&p) else { continue };
            if meta.is_dir() {
                walk(&p, needle, out);
            } else if meta.is_file()
                && meta.len() < (16 << 20)
                && std::fs::read(&p).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle))
            {
                out.push(p);
            }
        }
    }
    walk(dir, needle, &mut out);
    out
}

/// Processes whose command line contains `needle`.
fn argv_containing(needle: &[u8]) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            cmd.windows(needle.len()).any(|w| w == needle).then(|| String::from_utf8_lossy(&cmd).replace('\0', " "))
        })
        .collect()
}

#[test]
fn registry_credentials_come_from_secrets_and_go_nowhere_else() {
    if !in_private_namespace("registry_credentials_come_from_secrets_and_go_nowhere_else") {
        return;
    }
    let password = "s3cret pass:word-7f1d";
    let registry =
        Registry::start(RegistryOptions { htpasswd: Some(("puller".into(), password.into())), ..Default::default() });
    let work = tempfile::tempdir().unwrap();
    let model = small_model(&registry, work.path(), "models/private", 1 << 20);
    let node = ModelNode::start(vec![format!("--insecure-registry={}", registry.host())]);
    run(&node, &registry, async || {
        let mut csi = node.node().await;
        let ctx = model_ctx(&model.reference, &[("insecure", "true")]);
        let staging = node.dirs.staging("pv-private");
        let with = |user: &str, pass: &str| {
            let mut req = stage_req("pv-private", &staging, &ctx);
            if !user.is_empty() {
                req.secrets =
                    [("username".to_string(), user.to_string()), ("password".into(), pass.to_string())].into();
            }
            req
        };
        let none = csi.node_stage_volume(with("", "")).await.unwrap_err();
        assert_eq!(none.code(), Code::Unauthenticated, "{none:?}");
        assert!(none.message().contains(&registry.host()), "{none:?}");
        let wrong = csi.node_stage_volume(with("puller", "not the password")).await.unwrap_err();
        assert_eq!(wrong.code(), Code::PermissionDenied, "{wrong:?}");
        assert!(wrong.message().contains(&registry.host()), "{wrong:?}");
        assert_eq!(mounts_below(node.dirs.root.path()), Vec::<PathBuf>::new(), "nothing mounted");
        // While the pull runs, no process on the machine carries the password in its argv.
        let watching = Arc::new(AtomicBool::new(true));
        let watcher = {
            let (watching, needle) = (watching.clone(), password.as_bytes().to_vec());
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                while watching.load(Ordering::SeqCst) {
                    seen.extend(argv_containing(&needle));
                    std::thread::sleep(Duration::from_millis(2));
                }
                seen
            })
        };
        let (_, ok) = stage_until_done(&mut csi, &with("puller", password), Duration::from_secs(60)).await;
        watching.store(false, Ordering::SeqCst);
        let seen = watcher.join().unwrap();
        assert!(seen.is_empty(), "the password was in argv during the pull: {seen:?}");
        ok.unwrap();
        assert_eq!(tree(&staging), expected(&model, |_| true));

        // The plan as `plugin plan` prints it names the secret keys, never the values.
        let plan = node.cli(&[
            "plugin",
            "plan",
            "model",
            "--op",
            "stage",
            "--param",
            &format!("reference={}", model.reference),
            "--secret",
            "username=puller",
            "--secret",
            &format!("password={password}"),
        ]);
        let printed = format!("{}{}", String::from_utf8_lossy(&plan.stdout), String::from_utf8_lossy(&plan.stderr));
        assert!(printed.contains("password"), "the plan names the key: {printed}");
        assert!(!printed.contains(password), "{printed}");

        // No log line, file of the node (state, cache, logs) or process argv holds the password.
        let leaks = files_containing(node.dirs.root.path(), password.as_bytes());
        assert!(leaks.is_empty(), "the password is in {leaks:?}");
        let argv = argv_containing(password.as_bytes());
        assert!(argv.is_empty(), "the password is in argv: {argv:?}");
        println!("checked: no password in logs, state, cache or argv");
    });
}

#[test]
fn failed_downloads_say_why_and_leave_no_partial_files() {
    if !in_private_namespace("failed_downloads_say_why_and_leave_no_partial_files") {
        return;
    }
    let registry = Registry::start(RegistryOptions::default());
    let work = tempfile::tempdir().unwrap();
    let model = small_model(&registry, work.path(), "models/broken", 8 << 20);
    let big = small_model(&registry, work.path(), "models/big", 48 << 20);
    let dirs = NodeDirs::new();
    // The blob cache on a 24 MiB tmpfs: the big model's weights do not fit.
    let cache = dirs.state.join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    nix::mount::mount(Some("tmpfs"), &cache, Some("tmpfs"), nix::mount::MsFlags::empty(), Some("size=24m")).unwrap();
    let node = ModelNode::start_in(dirs, vec![format!("--insecure-registry={}", registry.host())]);
    run(&node, &registry, async || {
        let mut csi = node.node().await;
        let stage = |pv: &str, reference: &str| {
            stage_req(pv, &node.dirs.staging(pv), &model_ctx(reference, &[("insecure", "true")]))
        };

        let unknown = registry.reference("models/broken", "no-such-tag");
        let (_, r) = stage_until_done(&mut csi, &stage("pv-unknown", &unknown), Duration::from_secs(30)).await;
        let e = r.unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "{e:?}");
        assert!(e.message().contains(&unknown), "{e:?}");

        // A blob corrupted in the registry's storage: digest mismatch, nothing kept.
        let weights = model.layer("model.safetensors");
        let stored = registry.blob_storage_path(&weights.digest);
        let mut bytes = std::fs::read(&stored).unwrap();
        bytes[4096] ^= 0xff;
        std::fs::write(&stored, &bytes).unwrap();
        let (_, r) = stage_until_done(&mut csi, &stage("pv-corrupt", &model.reference), Duration::from_secs(60)).await;
        let e = r.unwrap_err();
        assert_eq!(e.code(), Code::DataLoss, "{e:?}");
        assert!(e.message().contains(&weights.digest) && e.message().contains(&model.reference), "{e:?}");
        assert_eq!(partials(&node.dirs.state), Vec::<PathBuf>::new());
        assert!(!model.cached(&node.dirs.state, "model.safetensors"));
        // The retry after the error starts over (and fails the same way: the registry still
        // serves the corrupted bytes).
        let (waits, r) =
            stage_until_done(&mut csi, &stage("pv-corrupt", &model.reference), Duration::from_secs(60)).await;
        assert!(!waits.is_empty(), "the retry downloaded again");
        assert_eq!(r.unwrap_err().code(), Code::DataLoss);

        // A cache too small for the blob: disk full, nothing kept.
        let (_, r) = stage_until_done(&mut csi, &stage("pv-big", &big.reference), Duration::from_secs(60)).await;
        let e = r.unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(e.message().contains(&big.reference), "{e:?}");
        assert_eq!(partials(&node.dirs.state), Vec::<PathBuf>::new());
        assert_eq!(mounts_below(&node.dirs.kubelet), Vec::<PathBuf>::new(), "nothing mounted");
        println!("checked: unknown tag, corrupted blob and disk full fail clearly and leave nothing");
    });
}

/// What interrupts a pull half-way.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Interruption {
    /// The registry is killed (and the relay's connections cut), then restarted.
    RegistryKilled,
    /// The host daemon is killed -9, then started again.
    HostKilled,
}

/// Stage a 64 MiB model through a throttled relay, interrupt the pull once a third of it is
/// in, recover, and check that the retries stage it with at most 1.1x the blobs' bytes sent.
fn interrupted_pull(test: &str, how: Interruption) {
    if !in_private_namespace(test) {
        return;
    }
    let mut registry = Registry::start(RegistryOptions::default());
    let work = tempfile::tempdir().unwrap();
    let model = small_model(&registry, work.path(), "models/interrupted", 64 << 20);
    let relay = Relay::start(registry.host());
    relay.throttle(16 << 20);
    let reference = model.reference.replace(&registry.host(), &relay.host());
    let args = vec![format!("--insecure-registry={}", relay.host())];
    let node = ModelNode::start(args.clone());
    let rt = tokio::runtime::Runtime::new().unwrap();
    guarded(&node.dirs, || {
        rt.block_on(async {
            let mut csi = node.node().await;
            let ctx = model_ctx(&reference, &[("insecure", "true")]);
            let staging = node.dirs.staging("pv-interrupted");
            let req = stage_req("pv-interrupted", &staging, &ctx);
            assert_eq!(csi.node_stage_volume(req.clone()).await.unwrap_err().code(), Code::Unavailable);
            let blobs: u64 = model.layers.iter().map(|l| l.descriptor.size).sum();
            let until = Instant::now() + Duration::from_secs(60);
            while relay.sent() < blobs / 3 {
                assert!(Instant::now() < until, "the download did not progress");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            match how {
                Interruption::RegistryKilled => {
                    registry.kill();
                    relay.cut();
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    // Retries while the registry is gone say the pull goes on; then it is back.
                    let e = csi.node_stage_volume(req.clone()).await.unwrap_err();
                    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
                    assert!(e.message().contains(&reference), "{e:?}");
                    registry.restart();
                }
                Interruption::HostKilled => {
                    node.kill_host();
                    relay.cut();
                    node.restart_host(args.clone());
                }
            }
            let before = relay.sent();
            relay.throttle(u64::MAX);
            let (_, r) = stage_until_done(&mut csi, &req, Duration::from_secs(120)).await;
            r.unwrap();
            assert_eq!(tree(&staging), expected(&model, |_| true));
            let total = relay.sent();
            // Resumed, not restarted: at most what the design lets a kill lose again (progress
            // not yet saved, buffers and writes in flight) plus what sat in the sockets.
            let refetched = total.saturating_sub(blobs);
            let bound = mounthost::oci::MAX_REFETCH + (4 << 20);
            assert!(
                refetched <= bound && refetched < before,
                "resumed: {total} bytes through the relay for {blobs} bytes of blobs ({before} before the \
                 interruption): {refetched} fetched again, at most {bound}"
            );
            println!("checked: interrupted after {before} bytes; {total} bytes in total for {blobs}");
        });
    });
}

#[test]
fn a_download_cut_by_the_registry_resumes_where_it_stopped() {
    interrupted_pull("a_download_cut_by_the_registry_resumes_where_it_stopped", Interruption::RegistryKilled);
}

#[test]
fn a_host_killed_in_the_middle_of_a_pull_resumes_it_after_restart() {
    interrupted_pull("a_host_killed_in_the_middle_of_a_pull_resumes_it_after_restart", Interruption::HostKilled);
}

#[test]
fn an_inline_volume_and_a_warmed_cache() {
    if !in_private_namespace("an_inline_volume_and_a_warmed_cache") {
        return;
    }
    let registry = Registry::start(RegistryOptions::default());
    let work = tempfile::tempdir().unwrap();
    let model = small_model(&registry, work.path(), "models/inline", 16 << 20);
    // An inline volume's attributes are the pod author's: its registry must be granted by the node.
    let node = ModelNode::start(vec![
        format!("--insecure-registry={}", registry.host()),
        format!("--grant=model:host={}", registry.host()),
    ]);
    run(&node, &registry, async || {
        // An operator warms the node: plain progress lines on a pipe, the result as JSON.
        let pull = node.cli(&["cache", "pull", &model.reference, "--insecure"]);
        let stderr = String::from_utf8_lossy(&pull.stderr);
        assert!(pull.status.success(), "{stderr}");
        assert!(stderr.lines().any(|l| l.starts_with("pulled ") && l.contains("(100%)")), "{stderr}");
        let out: serde_json::Value = serde_json::from_slice(&pull.stdout).unwrap();
        assert_eq!(out["manifestDigest"], model.manifest_digest.as_str(), "{out}");
        assert_eq!(out["done"], true);
        // On a terminal the same command draws a progress bar instead (`script` gives it a pty).
        let cmd = format!(
            "{} --state-dir {} --host-socket {} cache pull {} --insecure",
            env!("CARGO_BIN_EXE_mounthost"),
            node.dirs.state.display(),
            node.dirs.host_sock.display(),
            model.reference
        );
        let tty = std::process::Command::new("script").args(["-qec", &cmd, "/dev/null"]).output().unwrap();
        let shown = String::from_utf8_lossy(&tty.stdout);
        assert!(tty.status.success(), "{shown}");
        assert!(shown.contains("eta") && !shown.contains("pulled "), "a bar, not lines: {shown:?}");
        let fetched = node.fetched();

        // A pod names the model inline: its first publish stages it from the warm cache.
        let mut csi = node.node().await;
        let mut ctx = model_ctx(&model.reference, &[("insecure", "true")]);
        ctx.insert("csi.storage.k8s.io/ephemeral".into(), "true".into());
        let target = node.dirs.target("pod-inline", "model");
        let req = csi::NodePublishVolumeRequest {
            volume_id: "csi-inline-1".into(),
            target_path: target.display().to_string(),
            volume_capability: Some(common::multi_writer()),
            volume_context: ctx.clone(),
            ..Default::default()
        };
        // (The warm-up downloaded the blobs; the archive layers' trees are unpacked at the
        // first stage, in the background: kubelet's retries meanwhile get UNAVAILABLE.)
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            match csi.node_publish_volume(req.clone()).await {
                Ok(_) => break,
                Err(e) if e.code() == Code::Unavailable && Instant::now() < until => {
                    assert!(e.message().starts_with("unpacking "), "{e:?}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("{e:?}"),
            }
        }
        assert_eq!(tree(&target), expected(&model, |_| true));
        let e = std::fs::write(target.join("x"), b"x").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(nix::errno::Errno::EROFS as i32), "read-only even when asked read-write");
        assert_eq!(node.fetched(), fetched, "the warm cache served it");
        csi.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: "csi-inline-1".into(),
            target_path: target.display().to_string(),
        })
        .await
        .unwrap();
        assert_eq!(mounts_below(node.dirs.root.path()), Vec::<PathBuf>::new());

        // A registry the node does not grant, named inline by a pod: refused before any connection.
        let mut ctx = model_ctx("127.0.0.1:9/models/inline:v1", &[("insecure", "true")]);
        ctx.insert("csi.storage.k8s.io/ephemeral".into(), "true".into());
        let other = node.dirs.target("pod-other", "model");
        let e = csi
            .node_publish_volume(csi::NodePublishVolumeRequest {
                volume_id: "csi-inline-2".into(),
                target_path: other.display().to_string(),
                volume_capability: Some(common::multi_writer()),
                volume_context: ctx,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains("127.0.0.1:9") && e.message().contains("--grant model:host="), "{e:?}");

        // A reference that does not exist fails the warm-up with its code.
        let missing = registry.reference("models/inline", "nope");
        let pull = node.cli(&["cache", "pull", &missing, "--insecure"]);
        assert!(!pull.status.success());
        let stderr = String::from_utf8_lossy(&pull.stderr);
        assert!(stderr.contains("NotFound") && stderr.contains(&missing), "{stderr}");
    });
}

/// An HTTP proxy that serves `CONNECT host:port` only (what a client sends for HTTPS through a
/// proxy) and remembers the hosts it was asked for.
struct ConnectProxy {
    port: u16,
    asked: Arc<std::sync::Mutex<Vec<String>>>,
}

impl ConnectProxy {
    fn start() -> ConnectProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let asked: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let seen = asked.clone();
        std::thread::spawn(move || {
            for mut client in listener.incoming().flatten() {
                let seen = seen.clone();
                std::thread::spawn(move || {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
                        if client.read(&mut byte).unwrap_or(0) == 0 {
                            return;
                        }
                        head.push(byte[0]);
                    }
                    let head = String::from_utf8_lossy(&head).into_owned();
                    let mut words = head.split_whitespace();
                    let (Some("CONNECT"), Some(target)) = (words.next(), words.next()) else {
                        let _ = client.write_all(b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n");
                        return;
                    };
                    seen.lock().unwrap().push(target.to_string());
                    let Ok(server) = TcpStream::connect(target) else {
                        let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n");
                        return;
                    };
                    client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").unwrap();
                    let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                    std::thread::spawn(move || pipe(c2, s2, None));
                    pipe(server, client, None);
                });
            }
        });
        ConnectProxy { port, asked }
    }
}

/// A volume's own mirror, then the node's (`--registry-mirror`) for a volume that names none,
/// both through the node's proxy, with the registry's CA given as a directory the way a mounted
/// ConfigMap lays it out (its `..data` bookkeeping skipped).
#[test]
fn a_mirror_and_a_proxy_carry_the_pull() {
    if !in_private_namespace("a_mirror_and_a_proxy_carry_the_pull") {
        return;
    }
    let registry = Registry::start(RegistryOptions { tls: true, ..Default::default() });
    let work = tempfile::tempdir().unwrap();
    let model = small_model(&registry, work.path(), "models/mirrored", 4 << 20);
    let proxy = ConnectProxy::start();
    let ca_dir = work.path().join("registry-ca");
    std::fs::create_dir_all(ca_dir.join("..data")).unwrap();
    std::fs::copy(registry.ca_pem(), ca_dir.join("..data/ca.crt")).unwrap();
    std::os::unix::fs::symlink("..data/ca.crt", ca_dir.join("ca.crt")).unwrap();
    let node = ModelNode::start(vec![
        format!("--registry-ca={}", ca_dir.display()),
        format!("--registry-proxy=http://127.0.0.1:{}", proxy.port),
        format!("--registry-mirror=127.0.0.1:10={}", registry.host()),
    ]);
    run(&node, &registry, async || {
        let mut csi = node.node().await;
        // The reference names a registry nobody serves; the mirror has the same repository.
        let origin = "127.0.0.1:9/models/mirrored:v1";
        let ctx = model_ctx(origin, &[("mirror", &registry.host())]);
        let staging = node.dirs.staging("pv-mirrored");
        let (_, r) =
            stage_until_done(&mut csi, &stage_req("pv-mirrored", &staging, &ctx), Duration::from_secs(60)).await;
        r.unwrap();
        assert_eq!(tree(&staging), expected(&model, |_| true));
        let asked = proxy.asked.lock().unwrap().clone();
        assert!(
            !asked.is_empty() && asked.iter().all(|h| *h == registry.host()),
            "through the proxy to the mirror only: {asked:?}"
        );
        // The node's mirror: a reference naming 127.0.0.1:10, where nothing listens (a stage
        // that reached it would fail), and no `mirror` of the volume's own.
        let ctx = model_ctx("127.0.0.1:10/models/mirrored:v1", &[]);
        let staging = node.dirs.staging("pv-node-mirror");
        let (_, r) =
            stage_until_done(&mut csi, &stage_req("pv-node-mirror", &staging, &ctx), Duration::from_secs(60)).await;
        r.unwrap();
        assert_eq!(tree(&staging), expected(&model, |_| true));
        let asked_after = proxy.asked.lock().unwrap().clone();
        assert!(asked_after.iter().all(|h| *h == registry.host()), "the node's mirror only: {asked_after:?}");
        println!(
            "checked: {} connections through the proxy, all to the mirror (the volume's, then the node's)",
            asked_after.len()
        );
    });
}

#[test]
fn the_cache_cap_evicts_only_what_no_volume_uses() {
    if !in_private_namespace("the_cache_cap_evicts_only_what_no_volume_uses") {
        return;
    }
    let registry = Registry::start(RegistryOptions::default());
    let work = tempfile::tempdir().unwrap();
    let a = small_model(&registry, work.path(), "models/a", 2 << 20);
    let b = small_model(&registry, work.path(), "models/b", 2 << 20);
    let node = ModelNode::start(vec![format!("--insecure-registry={}", registry.host()), "--cache-max-mib=3".into()]);
    let cached = |model: &PushedModel| model.cached(&node.dirs.state, "model.safetensors");
    run(&node, &registry, async || {
        let mut csi = node.node().await;
        let stage = |pv: &str, m: &PushedModel| {
            stage_req(pv, &node.dirs.staging(pv), &model_ctx(&m.reference, &[("insecure", "true")]))
        };
        let (_, r) = stage_until_done(&mut csi, &stage("pv-a", &a), Duration::from_secs(60)).await;
        r.unwrap();
        let (_, r) = stage_until_done(&mut csi, &stage("pv-b", &b), Duration::from_secs(60)).await;
        r.unwrap();
        // Both in use: 4 MiB over a 3 MiB cap, and nothing may go.
        assert!(cached(&a) && cached(&b));
        csi.node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: "pv-a".into(),
            staging_target_path: node.dirs.staging("pv-a").display().to_string(),
        })
        .await
        .unwrap();
        // The next stage that adds to the cache brings it under the cap: a's blobs go, b's stay.
        let (_, r) = stage_until_done(&mut csi, &stage("pv-b2", &b), Duration::from_secs(60)).await;
        r.unwrap();
        assert!(!cached(&a), "a's weights, used by no volume, were evicted");
        assert!(cached(&b), "b's weights are in use");
        assert_eq!(tree(&node.dirs.staging("pv-b2")), expected(&b, |_| true));
    });
}
