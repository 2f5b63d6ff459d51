//! The OCI cache and puller (`mounthost::oci`) against a real `docker-registry`
//! (`common::registry`): resolve, download and verify, single flight, a corrupted blob, a
//! registry killed mid-download, TLS with and without the CA, htpasswd, a full disk.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::registry::{Class, ModelBuilder, Packing, PushedModel, Registry, RegistryOptions, random_file};
use mounthost::oci::{Artifacts, BlobRef, Credentials, Ensure, OciError, RegistryConfig, Source};
use mounthost::plan::Archive;
use sha2::{Digest, Sha256};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// A cache in a fresh temp dir, configured for `reg` (its CA, or plain HTTP allowed).
struct Cache {
    _dir: tempfile::TempDir,
    root: PathBuf,
    a: std::sync::Arc<Artifacts>,
}

fn cache(cfg: RegistryConfig) -> Cache {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let a = Artifacts::new(root.join("cache"), cfg).unwrap();
    Cache { _dir: dir, root, a: std::sync::Arc::new(a) }
}

fn plain(reg: &Registry) -> RegistryConfig {
    RegistryConfig { insecure: [reg.host()].into(), ..Default::default() }
}

fn source(reg: &Registry, model: &PushedModel, credentials: Credentials, insecure: bool) -> Source {
    Source {
        registry: reg.host(),
        repository: model.repo.clone(),
        reference: model.tag.clone(),
        mirror: None,
        credentials,
        insecure,
        platform: None,
    }
}

/// Every blob the manifest lists (config and layers).
fn blobs(manifest: &str) -> Vec<BlobRef> {
    let v: serde_json::Value = serde_json::from_str(manifest).unwrap();
    let one = |d: &serde_json::Value| BlobRef {
        digest: d["digest"].as_str().unwrap().to_string(),
        size: d["size"].as_u64().unwrap(),
        media_type: d["mediaType"].as_str().unwrap().to_string(),
    };
    std::iter::once(one(&v["config"])).chain(v["layers"].as_array().unwrap().iter().map(one)).collect()
}

/// `ensure` until it stops answering `Pulling` (120 s at most).
async fn settle(a: &Artifacts, volume: &str, src: &Source, blobs: &[BlobRef]) -> Ensure {
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        match a.ensure(volume, src, blobs) {
            Ensure::Pulling(_) if Instant::now() < until => tokio::time::sleep(Duration::from_millis(20)).await,
            other => return other,
        }
    }
}

fn sha256_file(path: &Path) -> String {
    let mut f = std::fs::File::open(path).unwrap();
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).unwrap();
    format!("sha256:{}", hex::encode(h.finalize()))
}

fn cached(c: &Cache, digest: &str) -> PathBuf {
    c.root.join("cache/blobs/sha256").join(digest.trim_start_matches("sha256:"))
}

/// Files whose name ends with `.partial` anywhere in the cache.
fn partials(c: &Cache) -> Vec<String> {
    std::fs::read_dir(c.root.join("cache/blobs/sha256"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".partial"))
        .collect()
}

#[test]
fn a_model_is_resolved_pulled_verified_and_assembled_and_a_second_ensure_fetches_nothing() {
    let reg = Registry::start(RegistryOptions::default());
    let work = tempfile::tempdir().unwrap();
    let (weights, weights_sha) = random_file(work.path(), 5 << 20);
    let model = ModelBuilder::new()
        .file("model.safetensors", weights.as_path(), Class::Weight, Packing::TarZstd)
        .file("config.json", br#"{"hidden_size": 8}"#, Class::Config, Packing::TarGzip)
        .file("README.md", b"# test\n", Class::Doc, Packing::Tar)
        .file("extra/tokenizer.bin", b"raw bytes", Class::Config, Packing::Raw)
        .push(&reg, "team/llm", "v1");
    let c = cache(plain(&reg));
    let src = source(&reg, &model, Credentials::Anonymous, true);
    runtime().block_on(async {
        let r = c.a.resolve(&src).await.unwrap();
        assert_eq!(r.manifest_digest, model.manifest_digest);
        assert_eq!(r.manifest, model.manifest);
        let config: serde_json::Value = serde_json::from_str(&r.config).unwrap();
        assert_eq!(config["modelfs"]["type"], "layers");

        let blobs = blobs(&r.manifest);
        let total: u64 = blobs.iter().map(|b| b.size).sum();
        assert!(matches!(c.a.ensure("vol-1", &src, &blobs), Ensure::Pulling(_)));
        assert_eq!(settle(&c.a, "vol-1", &src, &blobs).await, Ensure::Ready);
        for b in &blobs {
            assert_eq!(sha256_file(&cached(&c, &b.digest)), b.digest);
        }
        assert_eq!(c.a.bytes_fetched(), total);
        assert!(partials(&c).is_empty());

        // Again, for another volume: all there, nothing fetched.
        assert_eq!(c.a.ensure("vol-2", &src, &blobs), Ensure::Ready);
        assert_eq!(c.a.bytes_fetched(), total);
    });

    // Assemble the layers the way the model plugin plans them.
    let below = c.root.join("vol");
    std::fs::create_dir(&below).unwrap();
    let dest = below.join("model");
    let asm = mounthost::exec::artifacts::Assembler::new(c.a.clone());
    for layer in &model.layers {
        let format = match layer.media_type.rsplit('.').next().unwrap() {
            "tar" => Archive::Tar,
            "tar+gzip" => Archive::TarGzip,
            "tar+zstd" => Archive::TarZstd,
            _ => Archive::Raw,
        };
        let to = if format == Archive::Raw { dest.join(&layer.filepath) } else { dest.clone() };
        asm.assemble(&layer.descriptor.digest, format, Default::default(), &to, &below).unwrap();
        asm.assemble(&layer.descriptor.digest, format, Default::default(), &to, &below).unwrap();
    }
    for (path, sha, size) in &model.files {
        let file = dest.join(path);
        assert_eq!(std::fs::metadata(&file).unwrap().len(), *size, "{path}");
        assert_eq!(sha256_file(&file), format!("sha256:{sha}"), "{path}");
    }
    assert_eq!(model.file("model.safetensors").unwrap().0, weights_sha);
}

#[test]
fn two_volumes_asking_at_once_share_one_download() {
    let reg = Registry::start(RegistryOptions::default());
    let work = tempfile::tempdir().unwrap();
    let (weights, _) = random_file(work.path(), 48 << 20);
    let model = ModelBuilder::new().file("w.bin", weights.as_path(), Class::Weight, Packing::Raw).push(&reg, "m", "v1");
    let c = cache(plain(&reg));
    let src = source(&reg, &model, Credentials::Anonymous, true);
    let layer = &model.layers[0].descriptor;
    let blobs = [BlobRef { digest: layer.digest.clone(), size: layer.size, media_type: String::new() }];
    runtime().block_on(async {
        assert!(matches!(c.a.ensure("vol-a", &src, &blobs), Ensure::Pulling(_)));
        assert!(matches!(c.a.ensure("vol-b", &src, &blobs), Ensure::Pulling(_)));
        let (a, b) = tokio::join!(settle(&c.a, "vol-a", &src, &blobs), settle(&c.a, "vol-b", &src, &blobs));
        assert_eq!((a, b), (Ensure::Ready, Ensure::Ready));
    });
    assert_eq!(c.a.bytes_fetched(), layer.size, "one download for both volumes");
    assert_eq!(sha256_file(&cached(&c, &layer.digest)), layer.digest);
}

#[test]
fn a_corrupted_blob_fails_with_a_digest_mismatch_and_leaves_no_partial_file() {
    let reg = Registry::start(RegistryOptions::default());
    let model =
        ModelBuilder::new().file("w.bin", vec![42u8; 1 << 20], Class::Weight, Packing::Raw).push(&reg, "m", "v1");
    let layer = &model.layers[0].descriptor;
    let stored = reg.blob_storage_path(&layer.digest);
    let mut bytes = std::fs::read(&stored).unwrap();
    bytes[1000] ^= 0xff;
    std::fs::write(&stored, bytes).unwrap();
    let c = cache(plain(&reg));
    let src = source(&reg, &model, Credentials::Anonymous, true);
    let blobs = [BlobRef { digest: layer.digest.clone(), size: layer.size, media_type: String::new() }];
    let got = runtime().block_on(settle(&c.a, "vol-1", &src, &blobs));
    let Ensure::Failed(e) = got else { panic!("expected a failure, got {got:?}") };
    assert!(matches!(e, OciError::DigestMismatch { .. }), "{e:?}");
    let text = e.to_string();
    assert!(text.contains("digest mismatch") && text.contains(&layer.digest) && text.contains(&reg.host()), "{text}");
    assert!(partials(&c).is_empty(), "{:?}", partials(&c));
    assert!(!cached(&c, &layer.digest).exists());
}

#[test]
fn a_registry_killed_mid_download_is_resumed_after_its_restart() {
    let mut reg = Registry::start(RegistryOptions::default());
    let work = tempfile::tempdir().unwrap();
    let size = 256u64 << 20;
    let (weights, _) = random_file(work.path(), size);
    let model = ModelBuilder::new().file("w.bin", weights.as_path(), Class::Weight, Packing::Raw).push(&reg, "m", "v1");
    drop(work);
    let c = cache(plain(&reg));
    let src = source(&reg, &model, Credentials::Anonymous, true);
    let layer = &model.layers[0].descriptor;
    let blobs = [BlobRef { digest: layer.digest.clone(), size: layer.size, media_type: String::new() }];
    let rt = runtime();
    rt.block_on(async {
        assert!(matches!(c.a.ensure("vol-1", &src, &blobs), Ensure::Pulling(_)));
        // Kill it once some of the blob is on disk.
        let until = Instant::now() + Duration::from_secs(60);
        while c.a.progress()["vol-1"].done_bytes < size / 8 {
            assert!(Instant::now() < until, "no progress");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        reg.kill();
        let killed_at = c.a.bytes_fetched();
        assert!(killed_at < size, "the blob finished before the registry was killed");
        let until = Instant::now() + Duration::from_secs(60);
        while !c.a.last_errors().contains_key(&layer.digest) {
            assert!(Instant::now() < until, "the download did not stop");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let why = &c.a.last_errors()[&layer.digest];
        assert!(why.contains(&reg.host()), "{why}");
        assert!(!partials(&c).is_empty(), "the partial file is kept");
        let kept = c.a.progress()["vol-1"].done_bytes;
        assert!(kept > 0, "progress shows what is on disk");

        reg.restart();
        assert_eq!(settle(&c.a, "vol-1", &src, &blobs).await, Ensure::Ready);
        println!("checked: killed at {killed_at} of {size} bytes, {kept} kept, {} fetched in all", c.a.bytes_fetched());
    });
    assert!(c.a.bytes_fetched() as f64 <= size as f64 * 1.1, "fetched {} for {size}", c.a.bytes_fetched());
    assert_eq!(sha256_file(&cached(&c, &layer.digest)), layer.digest);
    assert!(partials(&c).is_empty());
}

#[test]
fn tls_without_the_ca_names_the_registry_and_with_it_works() {
    let reg = Registry::start(RegistryOptions { tls: true, ..Default::default() });
    let model = ModelBuilder::new().file("w.bin", vec![1u8; 4096], Class::Weight, Packing::Raw).push(&reg, "m", "v1");
    let src = source(&reg, &model, Credentials::Anonymous, false);
    let rt = runtime();

    let untrusting = cache(RegistryConfig::default());
    let e = rt.block_on(untrusting.a.resolve(&src)).unwrap_err();
    assert!(matches!(e, OciError::Tls { .. }), "{e:?}");
    let text = e.to_string();
    assert!(text.contains(&reg.host()) && text.contains("configure the registry's CA"), "{text}");
    let blobs = blobs(&model.manifest);
    let got = rt.block_on(settle(&untrusting.a, "vol-1", &src, &blobs));
    assert!(matches!(got, Ensure::Failed(OciError::Tls { .. })), "{got:?}");

    let trusting = cache(RegistryConfig { ca_bundle: Some(reg.ca_pem()), ..Default::default() });
    let r = rt.block_on(trusting.a.resolve(&src)).unwrap();
    assert_eq!(r.manifest_digest, model.manifest_digest);
    assert_eq!(rt.block_on(settle(&trusting.a, "vol-1", &src, &blobs)), Ensure::Ready);

    // Plain HTTP to a TLS registry it does not list: refused before connecting.
    let mut http = src.clone();
    http.insecure = true;
    let e = rt.block_on(trusting.a.resolve(&http)).unwrap_err();
    assert!(matches!(e, OciError::InsecureRefused { .. }), "{e:?}");
}

#[test]
fn htpasswd_tells_missing_from_refused_credentials() {
    let reg =
        Registry::start(RegistryOptions { htpasswd: Some(("alice".into(), "s3cret-pw".into())), ..Default::default() });
    let model = ModelBuilder::new().file("w.bin", vec![2u8; 4096], Class::Weight, Packing::Raw).push(&reg, "m", "v1");
    let c = cache(plain(&reg));
    let rt = runtime();

    let e = rt.block_on(c.a.resolve(&source(&reg, &model, Credentials::Anonymous, true))).unwrap_err();
    assert!(matches!(e, OciError::AuthMissing { .. }), "{e:?}");
    assert!(e.to_string().contains("no credentials were given") && e.to_string().contains(&reg.host()), "{e}");

    let wrong = Credentials::Basic { username: "alice".into(), password: "not-it".into() };
    let e = rt.block_on(c.a.resolve(&source(&reg, &model, wrong.clone(), true))).unwrap_err();
    assert!(matches!(e, OciError::AuthRefused { .. }), "{e:?}");
    assert!(!e.to_string().contains("not-it"), "{e}");
    let blobs = blobs(&model.manifest);
    let got = rt.block_on(settle(&c.a, "vol-1", &source(&reg, &model, wrong, true), &blobs));
    assert!(matches!(got, Ensure::Failed(OciError::AuthRefused { .. })), "{got:?}");

    let right = Credentials::Basic { username: "alice".into(), password: "s3cret-pw".into() };
    let src = source(&reg, &model, right, true);
    rt.block_on(c.a.resolve(&src)).unwrap();
    assert_eq!(rt.block_on(settle(&c.a, "vol-2", &src, &blobs)), Ensure::Ready);
}

#[test]
fn a_full_cache_disk_fails_and_leaves_no_partial_file() {
    if !common::in_private_namespace("a_full_cache_disk_fails_and_leaves_no_partial_file") {
        return;
    }
    let reg = Registry::start(RegistryOptions::default());
    let model =
        ModelBuilder::new().file("w.bin", vec![3u8; 8 << 20], Class::Weight, Packing::Raw).push(&reg, "m", "v1");
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().canonicalize().unwrap().join("small");
    std::fs::create_dir(&small).unwrap();
    let status = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs"])
        .arg(&small)
        .status()
        .unwrap();
    assert!(status.success(), "mounting a small tmpfs");
    let a = Artifacts::new(small.join("cache"), plain(&reg)).unwrap();
    let src = source(&reg, &model, Credentials::Anonymous, true);
    let layer = &model.layers[0].descriptor;
    let blobs = [BlobRef { digest: layer.digest.clone(), size: layer.size, media_type: String::new() }];
    let got = runtime().block_on(settle(&a, "vol-1", &src, &blobs));
    let Ensure::Failed(e) = got else { panic!("expected a failure, got {got:?}") };
    assert!(matches!(e, OciError::DiskFull { .. }), "{e:?}");
    assert!(e.to_string().contains("is full") && e.to_string().contains(&layer.digest), "{e}");
    let left: Vec<_> =
        std::fs::read_dir(small.join("cache/blobs/sha256")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "{left:?}");
    // Prune works on what is there (nothing) and the cache stays usable.
    assert_eq!(a.prune(&BTreeSet::new(), 0).unwrap().blobs, 0);
    let _ = std::process::Command::new("umount").arg(&small).status();
}

/// HEAD requests for blobs the registry answered, from its log (a line is written just after its
/// response ends: poll briefly).
fn blob_heads(reg: &Registry) -> usize {
    reg.log()
        .lines()
        .filter(|l| l.contains("http.request.method=HEAD ") && l.contains("/blobs/sha256:"))
        .filter(|l| l.contains("msg=\"response completed\""))
        .count()
}

/// `count()` once it has stopped changing for a moment (10 s at most).
fn settled_count(count: impl Fn() -> usize) -> usize {
    let until = Instant::now() + Duration::from_secs(10);
    let mut last = count();
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = count();
        if now == last || Instant::now() > until {
            return now;
        }
        last = now;
    }
}

#[test]
fn a_cached_private_blob_is_handed_only_to_sources_the_registry_lets_read_it() {
    let reg =
        Registry::start(RegistryOptions { htpasswd: Some(("alice".into(), "s3cret-pw".into())), ..Default::default() });
    let model = ModelBuilder::new()
        .file("w.bin", vec![7u8; 64 << 10], Class::Weight, Packing::Raw)
        .file("config.json", b"{}", Class::Config, Packing::Tar)
        .push(&reg, "private/llm", "v1");
    let c = cache(plain(&reg));
    let rt = runtime();
    let blobs = blobs(&model.manifest);
    let right = Credentials::Basic { username: "alice".into(), password: "s3cret-pw".into() };
    let owner = source(&reg, &model, right, true);
    assert_eq!(rt.block_on(settle(&c.a, "vol-owner", &owner, &blobs)), Ensure::Ready);

    // Someone who only knows the digests (a manifest of their own listing them) and has no
    // credentials, or wrong ones: `ensure` alone would hand the cached blobs over.
    let anonymous = source(&reg, &model, Credentials::Anonymous, true);
    assert_eq!(c.a.ensure("vol-intruder", &anonymous, &blobs), Ensure::Ready);
    let e = rt.block_on(c.a.authorize(&anonymous, &blobs)).unwrap_err();
    assert!(matches!(e, OciError::AuthMissing { .. }), "{e:?}");
    assert!(e.to_string().contains(&reg.host()), "{e}");
    let wrong = Credentials::Basic { username: "alice".into(), password: "not-it".into() };
    let e = rt.block_on(c.a.authorize(&source(&reg, &model, wrong, true), &blobs)).unwrap_err();
    assert!(matches!(e, OciError::AuthRefused { .. }), "{e:?}");
    assert!(!format!("{e} {e:?}").contains("not-it"), "{e:?}");

    // The owner: the download was its proof, no request.
    let heads = settled_count(|| blob_heads(&reg));
    rt.block_on(c.a.authorize(&owner, &blobs)).unwrap();
    assert_eq!(settled_count(|| blob_heads(&reg)), heads, "a download counts as proof");

    // After a restart (a new cache on the same directory): each blob proven by a few of its
    // bytes (4 ranges of 64 bytes, or the whole blob when that small), then never again; no
    // HEAD, which proves nothing.
    let served = reg.served_bytes();
    let again = Artifacts::new(c.root.join("cache"), plain(&reg)).unwrap();
    rt.block_on(again.authorize(&owner, &blobs)).unwrap();
    let proof = settled_count(|| reg.served_bytes() as usize) - served as usize;
    assert!(proof > 0 && proof <= blobs.len() * 256, "{proof} bytes served to prove {} blobs", blobs.len());
    rt.block_on(again.authorize(&owner, &blobs)).unwrap();
    assert_eq!(settled_count(|| reg.served_bytes() as usize), served as usize + proof, "the second call asked again");
    assert_eq!(settled_count(|| blob_heads(&reg)), heads);
    assert_eq!(again.ensure("vol-owner-2", &owner, &blobs), Ensure::Ready);
}

#[test]
fn a_download_stopped_by_a_passing_failure_is_not_started_again_at_once() {
    // A "registry" that accepts connections and closes them at once: every attempt fails with
    // an error that may pass by itself. Counted, so the test sees each new attempt.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let host = format!("127.0.0.1:{}", listener.local_addr().unwrap().port());
    let accepts = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = accepts.clone();
    std::thread::spawn(move || {
        for c in listener.incoming().flatten() {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(c);
        }
    });
    let count = || accepts.load(std::sync::atomic::Ordering::SeqCst);
    let c = cache(RegistryConfig { insecure: [host.clone()].into(), ..Default::default() });
    let src = Source {
        registry: host.clone(),
        repository: "m".into(),
        reference: "v1".into(),
        mirror: None,
        credentials: Credentials::Anonymous,
        insecure: true,
        platform: None,
    };
    let blob = BlobRef { digest: format!("sha256:{}", "a".repeat(64)), size: 10, media_type: "x/y".into() };
    let rt = runtime();
    rt.block_on(async {
        let _ = c.a.ensure("v", &src, std::slice::from_ref(&blob));
        let until = Instant::now() + Duration::from_secs(10);
        while c.a.last_errors().is_empty() {
            assert!(Instant::now() < until, "the first attempt never failed");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let after_first = count();
        assert!(after_first >= 1);
        // Asked every 10 ms for 300 ms: no new attempt within the first wait (0.5 s).
        for _ in 0..30 {
            assert!(matches!(c.a.ensure("v", &src, std::slice::from_ref(&blob)), Ensure::Pulling(_)));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(count(), after_first, "no attempt during the wait");
        // After the wait, the next ask starts one.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let until = Instant::now() + Duration::from_secs(5);
        while count() == after_first {
            let _ = c.a.ensure("v", &src, std::slice::from_ref(&blob));
            assert!(Instant::now() < until, "no attempt after the wait");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        println!("checked: {after_first} connection(s) in the first attempt, none during the wait, then a new attempt");
    });
}
