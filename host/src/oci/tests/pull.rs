//! Resolve and download against the in-process fake registry.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::super::{Artifacts, BlobRef, Credentials, Ensure, OciError, RegistryConfig, Source};
use super::fake::Fake;
use super::*;

pub(super) const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const INDEX: &str = "application/vnd.oci.image.index.v1+json";

/// A fake registry and an empty cache allowed to reach it over plain HTTP.
pub(super) struct Env {
    pub fake: Fake,
    pub _t: tempfile::TempDir,
    pub root: std::path::PathBuf,
    pub a: Artifacts,
}

pub(super) async fn env() -> Env {
    let fake = Fake::start().await;
    let (t, root) = tempdir();
    let cfg = RegistryConfig { insecure: [fake.host.clone()].into(), ..Default::default() };
    let a = Artifacts::new(root.join("cache"), cfg).unwrap();
    Env { fake, _t: t, root, a }
}

impl Env {
    pub fn src(&self, reference: &str) -> Source {
        Source {
            registry: self.fake.host.clone(),
            repository: "org/model".into(),
            reference: reference.into(),
            mirror: None,
            credentials: Credentials::Anonymous,
            insecure: true,
            platform: None,
        }
    }

    pub fn blob(&self, bytes: Vec<u8>) -> BlobRef {
        let size = bytes.len() as u64;
        BlobRef { digest: self.fake.blob(bytes), size, media_type: "application/octet-stream".into() }
    }

    pub fn path(&self, b: &BlobRef) -> std::path::PathBuf {
        self.root.join("cache/blobs/sha256").join(b.digest.trim_start_matches("sha256:"))
    }

    pub fn partial(&self, b: &BlobRef) -> std::path::PathBuf {
        self.path(b).with_extension("partial")
    }

    /// `ensure` until it stops answering `Pulling` (30 s at most).
    pub async fn settle(&self, volume: &str, blobs: &[BlobRef]) -> Ensure {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            match self.a.ensure(volume, &self.src("v1"), blobs) {
                Ensure::Pulling(_) if Instant::now() < until => tokio::time::sleep(Duration::from_millis(20)).await,
                other => return other,
            }
        }
    }

    /// Wait until the last attempt at `b` stopped with a retriable error.
    pub async fn stopped(&self, b: &BlobRef) -> String {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(e) = self.a.last_errors().get(&b.digest) {
                return e.clone();
            }
            assert!(Instant::now() < until, "the download of {} did not stop", b.digest);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Incompressible bytes, different for each seed.
pub(super) fn random(size: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(size + 8);
    while out.len() < size {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        out.extend_from_slice(&s.to_le_bytes());
    }
    out.truncate(size);
    out
}

fn manifest_json(config: &str, config_size: usize, layer: &BlobRef) -> String {
    format!(
        r#"{{"schemaVersion":2,"mediaType":"{MANIFEST}","artifactType":"application/vnd.cncf.model.manifest.v1+json",
        "config":{{"mediaType":"application/vnd.cncf.model.config.v1+json","digest":"{config}","size":{config_size}}},
        "layers":[{{"mediaType":"application/vnd.cncf.model.weight.v1.tar","digest":"{}","size":{}}}]}}"#,
        layer.digest, layer.size
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolve_reads_manifest_and_config_by_tag_digest_or_index() {
    let e = env().await;
    let config = br#"{"descriptor":{"name":"m"},"modelfs":{"type":"layers","diffIds":[]}}"#.to_vec();
    let config_digest = e.fake.blob(config.clone());
    let layer = e.blob(b"layer".to_vec());
    let manifest = manifest_json(&config_digest, config.len(), &layer);
    let digest = e.fake.manifest("v1", MANIFEST, &manifest);
    let index = format!(
        r#"{{"schemaVersion":2,"mediaType":"{INDEX}","manifests":[{{"mediaType":"{MANIFEST}","digest":"{digest}","size":{}}}]}}"#,
        manifest.len()
    );
    e.fake.manifest("multi", INDEX, &index);

    for reference in ["v1", digest.as_str(), "multi"] {
        let r = e.a.resolve(&e.src(reference)).await.unwrap();
        assert_eq!(r.manifest_digest, digest, "{reference}");
        assert_eq!(r.manifest, manifest);
        assert_eq!(r.config.as_bytes(), config.as_slice());
    }
    let err = e.a.resolve(&e.src("nope")).await.unwrap_err();
    assert!(matches!(err, OciError::ManifestNotFound { .. }), "{err:?}");
    assert!(err.to_string().contains(&format!("{}/org/model:nope", e.fake.host)), "{err}");
    assert_eq!(e.a.bytes_fetched(), 0, "resolve is not counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_is_pulled_verified_and_found_again() {
    let e = env().await;
    let data = random(3 << 20, 1);
    let b = e.blob(data.clone());
    assert!(matches!(e.a.ensure("vol-1", &e.src("v1"), std::slice::from_ref(&b)), Ensure::Pulling(_)));
    assert_eq!(e.settle("vol-1", std::slice::from_ref(&b)).await, Ensure::Ready);
    assert_eq!(std::fs::read(e.path(&b)).unwrap(), data);
    assert_eq!(mode(&e.path(&b)), 0o444);
    assert!(!e.partial(&b).exists());
    assert!(!e.path(&b).with_extension("partial.json").exists());
    assert_eq!(e.a.bytes_fetched(), data.len() as u64);
    // Again: there already, nothing fetched.
    assert_eq!(e.a.ensure("vol-2", &e.src("v1"), std::slice::from_ref(&b)), Ensure::Ready);
    assert_eq!(e.a.bytes_fetched(), data.len() as u64);
    let p = e.a.progress();
    assert_eq!(p["vol-1"].done_bytes, data.len() as u64);
    assert_eq!(p["vol-2"].total_bytes, data.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_volumes_share_one_download() {
    let e = env().await;
    e.fake.state.delay_ms.store(2, Ordering::SeqCst);
    let data = random(4 << 20, 2);
    let b = e.blob(data.clone());
    let one = std::slice::from_ref(&b);
    assert!(matches!(e.a.ensure("vol-a", &e.src("v1"), one), Ensure::Pulling(_)));
    assert!(matches!(e.a.ensure("vol-b", &e.src("v1"), one), Ensure::Pulling(_)));
    assert_eq!(e.a.progress().len(), 2);
    assert_eq!(e.settle("vol-a", one).await, Ensure::Ready);
    assert_eq!(e.settle("vol-b", one).await, Ensure::Ready);
    assert_eq!(e.a.bytes_fetched(), data.len() as u64);
    assert_eq!(e.fake.state.blob_requests.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_blob_comes_in_parallel_ranges() {
    let e = env().await;
    let data = random(70 << 20, 3);
    let b = e.blob(data.clone());
    assert_eq!(e.settle("vol-1", std::slice::from_ref(&b)).await, Ensure::Ready);
    assert!(std::fs::read(e.path(&b)).unwrap() == data, "content differs");
    assert_eq!(e.a.bytes_fetched(), data.len() as u64);
    assert_eq!(e.fake.state.blob_requests.load(Ordering::SeqCst), 2, "70 MiB in 64 MiB ranges");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_ignoring_ranges_still_works() {
    let e = env().await;
    e.fake.state.ignore_range.store(true, Ordering::SeqCst);
    let data = random(70 << 20, 4);
    let b = e.blob(data.clone());
    assert_eq!(e.settle("vol-1", std::slice::from_ref(&b)).await, Ensure::Ready);
    assert!(std::fs::read(e.path(&b)).unwrap() == data, "content differs");
}

/// A registry that answers one ranged request with the whole blob while the other stream
/// gets its own range: the whole answer's copy of that other range comes later and is not
/// the same bytes. They are not written over the bytes the hash already read: the blob in the
/// cache holds the bytes its digest names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_written_are_never_written_again_by_another_stream() {
    let e = env().await;
    let data = random(70 << 20, 9);
    let b = e.blob(data.clone());
    // The whole answer pauses at the second range's start (long enough for that range to
    // arrive and be written, and for the hash to read what it may), then sends it flipped.
    // Written over, those bytes end either in a digest mismatch or in a cached blob that is
    // not the bytes its digest names; neither is `Ready` with the true bytes.
    *e.fake.state.whole_then_other.lock().unwrap() = Some((64 << 20, 1500));
    assert_eq!(e.settle("vol-1", std::slice::from_ref(&b)).await, Ensure::Ready);
    assert!(std::fs::read(e.path(&b)).unwrap() == data, "the cached blob is not the bytes its digest names");
    assert!(e.fake.state.whole_then_other.lock().unwrap().is_none(), "the two-faced answer was not asked for");
}

/// More blobs than may download at once: they take turns, and all of them land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downloads_take_turns_and_all_land() {
    let e = env().await;
    // Slow enough that the downloads overlap.
    e.fake.state.delay_ms.store(20, Ordering::SeqCst);
    let n = super::super::slots::MAX_DOWNLOADS * 2 + 1;
    let blobs: Vec<BlobRef> = (0..n).map(|i| e.blob(random(256 << 10, 100 + i as u64))).collect();
    assert_eq!(e.settle("vol-1", &blobs).await, Ensure::Ready);
    for b in &blobs {
        assert!(e.path(b).exists(), "{} did not land", b.digest);
    }
    // One more at most: a body counts until its server task ends, which may be just after the
    // download that read it gave its turn to the next one. Without turns, all 17 at once; one
    // volume gets half the node's slots.
    let most = e.fake.state.blobs_sending_max.load(Ordering::SeqCst);
    let turns = super::super::slots::PER_VOLUME;
    assert!((turns..=turns + 1).contains(&most), "{most} blob bodies sent at once");
}

/// A volume takes half the node's slots; the downloads it queued beyond them and no longer
/// waits for (it was unstaged) never start, and leave the slots to others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_downloads_nobody_waits_for_do_not_start() {
    let e = env().await;
    e.fake.state.delay_ms.store(40, Ordering::SeqCst);
    let share = super::super::slots::PER_VOLUME;
    let blobs: Vec<BlobRef> = (0..2 * share).map(|i| e.blob(random(512 << 10, 300 + i as u64))).collect();
    assert!(matches!(e.a.ensure("vol-1", &e.src("v1"), &blobs), Ensure::Pulling(_)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    e.a.forget("vol-1");
    // The running ones end (8 pieces of 64 KiB, 40 ms apart); the queued ones never start.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let landed = blobs.iter().filter(|b| e.path(b).exists()).count();
    assert_eq!(landed, share, "the downloads running went on to their end, no other started");
    assert_eq!(e.fake.state.blob_requests.load(Ordering::SeqCst), share);
}

/// A dynamic mount's end (`abandon`) stops the downloads only it wanted, a queued one at once
/// and a running one at its next piece, and names them; their bytes to come count until they
/// have ended (`remaining`); one another volume waits for goes on and lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_mount_stops_only_the_downloads_nobody_else_wants() {
    let e = env().await;
    // 1 MiB blobs in 64 KiB pieces 40 ms apart: 640 ms each.
    e.fake.state.delay_ms.store(40, Ordering::SeqCst);
    let share = super::super::slots::PER_VOLUME;
    let blobs: Vec<BlobRef> = (0..2 * share).map(|i| e.blob(random(1 << 20, 500 + i as u64))).collect();
    let mount = "vol\nm1";
    assert!(matches!(e.a.ensure(mount, &e.src("v1"), &blobs), Ensure::Pulling(_)));
    let shared = std::slice::from_ref(&blobs[0]);
    assert!(matches!(e.a.ensure("vol-2", &e.src("v1"), shared), Ensure::Pulling(_)));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let total = 2 * share as u64 * (1 << 20);
    let before = e.a.remaining(&e.a.running(&blobs));
    assert!(before > 0 && before <= total, "{before} of {total} bytes still to come");
    let stopped = e.a.abandon(mount);
    assert_eq!(stopped.len(), 2 * share - 1, "every download but the shared one stops");
    assert!(!stopped.iter().any(|s| s.blob == blobs[0]));
    let t0 = Instant::now();
    while e.a.remaining(&stopped) > 0 {
        assert!(t0.elapsed() < Duration::from_secs(1), "the stopped downloads still run after {:?}", t0.elapsed());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(e.settle("vol-2", shared).await, Ensure::Ready, "the shared download goes on");
    // Only the downloads that had their turn asked the registry (and the shared one, if it was
    // queued); nothing of the stopped ones is left.
    let asked = e.fake.state.blob_requests.load(Ordering::SeqCst);
    assert!((share..=share + 1).contains(&asked), "{asked} blob requests");
    for b in stopped.iter().map(|s| &s.blob) {
        let hex = b.digest.trim_start_matches("sha256:");
        assert!(!e.path(b).exists() && !e.a.store().partial(hex).exists(), "{} left a file", b.digest);
    }
    // A later download of a stopped blob, for another volume, is not the stopped one: it does
    // not count as still to come in it.
    let again = &stopped[0].blob;
    assert!(matches!(e.a.ensure("vol-3", &e.src("v1"), std::slice::from_ref(again)), Ensure::Pulling(_)));
    assert_eq!(e.a.remaining(&stopped), 0, "a new download of a stopped blob is another one");
    assert_eq!(e.settle("vol-3", std::slice::from_ref(again)).await, Ensure::Ready);
}

/// A stop while the registry has not answered a range yet (a mirror fetching upstream) ends
/// the download then, not when the answer comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_download_stops_while_the_registry_has_not_answered() {
    let e = env().await;
    e.fake.state.head_delay_ms.store(10_000, Ordering::SeqCst);
    let b = e.blob(random(1 << 20, 700));
    let mount = "vol\nsilent";
    assert!(matches!(e.a.ensure(mount, &e.src("v1"), std::slice::from_ref(&b)), Ensure::Pulling(_)));
    let t0 = Instant::now();
    while e.fake.state.blob_requests.load(Ordering::SeqCst) == 0 {
        assert!(t0.elapsed() < Duration::from_secs(5), "the download never asked the registry");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stopped = e.a.abandon(mount);
    assert_eq!(stopped.len(), 1);
    let t0 = Instant::now();
    while e.a.remaining(&stopped) > 0 {
        assert!(t0.elapsed() < Duration::from_secs(1), "still waiting for the registry after {:?}", t0.elapsed());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A download stopped for a gone mount and asked for again by another volume right away ends
/// as stopped, never as that volume's failure, and that volume's next call starts it again: it
/// lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_download_wanted_again_goes_on() {
    let e = env().await;
    e.fake.state.delay_ms.store(40, Ordering::SeqCst);
    let b = e.blob(random(1 << 20, 701));
    let one = std::slice::from_ref(&b);
    assert!(matches!(e.a.ensure("vol\ngone", &e.src("v1"), one), Ensure::Pulling(_)));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stopped = e.a.abandon("vol\ngone");
    assert_eq!(stopped.len(), 1);
    assert_eq!(e.settle("vol-2", one).await, Ensure::Ready, "wanted again: it lands");
    assert!(e.path(&b).exists());
    assert_eq!(e.a.remaining(&stopped), 0);
}

/// Cut the registry after `cut` bytes, wait for the pull to stop, let it go on, and check it
/// resumed rather than started over.
async fn resume(size: usize, cut: u64, seed: u64) {
    let e = env().await;
    let data = random(size, seed);
    let b = e.blob(data.clone());
    let one = std::slice::from_ref(&b);
    e.fake.state.budget.store(cut, Ordering::SeqCst);
    assert!(matches!(e.a.ensure("vol-1", &e.src("v1"), one), Ensure::Pulling(_)));
    let why = e.stopped(&b).await;
    assert!(why.contains("unreachable"), "{why}");
    assert!(e.partial(&b).exists(), "the partial file is kept");
    let sidecar = std::fs::read_to_string(e.path(&b).with_extension("partial.json")).unwrap();
    assert!(sidecar.contains("\"have\":[["), "{sidecar}");
    let p = &e.a.progress()["vol-1"];
    assert!(p.done_bytes > 0 && p.done_bytes <= cut, "{p:?}");

    e.fake.state.budget.store(u64::MAX, Ordering::SeqCst);
    assert_eq!(e.settle("vol-1", one).await, Ensure::Ready);
    assert!(std::fs::read(e.path(&b)).unwrap() == data, "content differs");
    let served = e.fake.state.served.load(Ordering::SeqCst);
    assert!(served as f64 <= size as f64 * 1.1, "served {served} for {size}");
    assert!(e.a.last_errors().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_download_resumes() {
    resume(20 << 20, 8 << 20, 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_parallel_download_resumes_its_holes() {
    resume(80 << 20, 30 << 20, 6).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_registry_is_retried_by_the_next_ensure() {
    let e = env().await;
    e.fake.state.refuse.store(true, Ordering::SeqCst);
    let b = e.blob(random(1000, 7));
    let one = std::slice::from_ref(&b);
    assert!(matches!(e.a.ensure("vol-1", &e.src("v1"), one), Ensure::Pulling(_)));
    let why = e.stopped(&b).await;
    assert!(why.contains(&e.fake.host), "{why}");
    let before = e.fake.state.connections.load(Ordering::SeqCst);
    e.fake.state.refuse.store(false, Ordering::SeqCst);
    assert!(matches!(e.a.ensure("vol-1", &e.src("v1"), one), Ensure::Pulling(_)), "restarted, not failed");
    assert_eq!(e.settle("vol-1", one).await, Ensure::Ready);
    assert!(e.fake.state.connections.load(Ordering::SeqCst) > before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_blob_fails_once_and_leaves_nothing() {
    let e = env().await;
    e.fake.state.corrupt.store(true, Ordering::SeqCst);
    let b = e.blob(random(2 << 20, 8));
    let one = std::slice::from_ref(&b);
    let got = e.settle("vol-1", one).await;
    let Ensure::Failed(err) = got else { panic!("{got:?}") };
    assert!(matches!(err, OciError::DigestMismatch { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("digest mismatch") && text.contains(&b.digest) && text.contains(&e.fake.host), "{text}");
    assert!(!e.partial(&b).exists() && !e.path(&b).exists());
    // Reported once: the next ensure starts over.
    e.fake.state.corrupt.store(false, Ordering::SeqCst);
    assert!(matches!(e.a.ensure("vol-1", &e.src("v1"), one), Ensure::Pulling(_)));
    assert_eq!(e.settle("vol-1", one).await, Ensure::Ready);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_is_told_to_every_volume_that_waited() {
    let e = env().await;
    e.fake.state.delay_ms.store(5, Ordering::SeqCst);
    e.fake.state.corrupt.store(true, Ordering::SeqCst);
    let b = e.blob(random(1 << 20, 9));
    let one = std::slice::from_ref(&b);
    e.a.ensure("vol-a", &e.src("v1"), one);
    e.a.ensure("vol-b", &e.src("v1"), one);
    assert!(matches!(e.settle("vol-a", one).await, Ensure::Failed(OciError::DigestMismatch { .. })));
    assert!(matches!(e.a.ensure("vol-b", &e.src("v1"), one), Ensure::Failed(OciError::DigestMismatch { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_blob_is_not_found() {
    let e = env().await;
    let b = BlobRef { digest: sha256(b"never pushed"), size: 12, media_type: String::new() };
    let got = e.settle("vol-1", std::slice::from_ref(&b)).await;
    let Ensure::Failed(err) = got else { panic!("{got:?}") };
    assert!(matches!(err, OciError::BlobNotFound { .. }), "{err:?}");
    assert!(err.to_string().contains(&b.digest), "{err}");
    assert!(!e.partial(&b).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_size_the_registry_disagrees_with_fails() {
    let e = env().await;
    let mut b = e.blob(random(5000, 10));
    b.size = 4000;
    let Ensure::Failed(err) = e.settle("vol-1", std::slice::from_ref(&b)).await else { panic!() };
    assert!(matches!(err, OciError::SizeMismatch { .. }), "{err:?}");
    b.size = 6000;
    let Ensure::Failed(err) = e.settle("vol-2", std::slice::from_ref(&b)).await else { panic!() };
    assert!(matches!(err, OciError::SizeMismatch { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_missing_refused_and_right() {
    let e = env().await;
    *e.fake.state.basic.lock().unwrap() = Some("dTpw".into()); // u:p
    let config = e.fake.blob(b"{}".to_vec());
    let layer = e.blob(b"x".to_vec());
    e.fake.manifest("v1", MANIFEST, &manifest_json(&config, 2, &layer));
    let mut src = e.src("v1");
    let err = e.a.resolve(&src).await.unwrap_err();
    assert!(matches!(err, OciError::AuthMissing { .. }), "{err:?}");
    assert!(err.to_string().contains("no credentials were given"), "{err}");
    src.credentials = Credentials::Basic { username: "u".into(), password: "wrong".into() };
    let err = e.a.resolve(&src).await.unwrap_err();
    assert!(matches!(err, OciError::AuthRefused { .. }), "{err:?}");
    assert!(!err.to_string().contains("wrong"), "{err}");
    src.credentials = Credentials::Basic { username: "u".into(), password: "p".into() };
    e.a.resolve(&src).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_to_an_unlisted_registry_is_refused_before_connecting() {
    let e = env().await;
    let mut src = e.src("v1");
    src.mirror = Some("127.0.0.1:9".into());
    let err = e.a.resolve(&src).await.unwrap_err();
    assert!(matches!(err, OciError::InsecureRefused { .. }), "{err:?}");
    assert!(err.to_string().contains("127.0.0.1:9"), "{err}");
    let b = e.blob(b"x".to_vec());
    assert!(matches!(e.a.ensure("vol-1", &src, &[b]), Ensure::Failed(OciError::InsecureRefused { .. })));
    assert_eq!(e.fake.state.connections.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_to_a_plain_http_registry_says_how_to_ask_for_plain_http() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // A plain-HTTP server answers a TLS ClientHello the way HTTP servers do.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let host = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let mut hello = [0u8; 512];
            let _ = conn.read(&mut hello).await;
            let _ = conn.write_all(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n").await;
        }
    });
    let (_t, root) = tempdir();
    let a = Artifacts::new(root.join("cache"), RegistryConfig::default()).unwrap();
    let src = Source {
        registry: host,
        repository: "org/model".into(),
        reference: "v1".into(),
        mirror: None,
        credentials: Credentials::Anonymous,
        insecure: false,
        platform: None,
    };
    let err = a.resolve(&src).await.unwrap_err();
    assert!(matches!(err, OciError::Tls { .. }), "{err:?}");
    let msg = err.into_error("ref").message;
    assert!(msg.contains("does not speak TLS") && msg.contains("--insecure-registry"), "{msg}");
    assert!(msg.contains("insecure: \"true\"") && msg.contains("cache pull --insecure"), "{msg}");
    assert!(!msg.contains("--registry-ca"), "the CA flag does not help here: {msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_is_asked_for_the_same_repository() {
    let e = env().await;
    let config = e.fake.blob(b"{}".to_vec());
    let layer = e.blob(b"x".to_vec());
    e.fake.manifest("v1", MANIFEST, &manifest_json(&config, 2, &layer));
    let mut src = e.src("v1");
    src.registry = "registry.invalid".into();
    src.mirror = Some(e.fake.host.clone());
    let r = e.a.resolve(&src).await.unwrap();
    assert_eq!(r.config, "{}");
    assert_eq!(e.settle_with(&src, "vol-1", &[layer]).await, Ensure::Ready);
}

impl Env {
    pub async fn settle_with(&self, src: &Source, volume: &str, blobs: &[BlobRef]) -> Ensure {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            match self.a.ensure(volume, src, blobs) {
                Ensure::Pulling(_) if Instant::now() < until => tokio::time::sleep(Duration::from_millis(20)).await,
                other => return other,
            }
        }
    }
}

/// Wait until the blob `b` is in the cache (without asking for it).
async fn landed(e: &Env, b: &BlobRef) {
    let until = Instant::now() + Duration::from_secs(30);
    while !e.path(b).exists() {
        assert!(Instant::now() < until, "{} never landed", b.digest);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forgetting_the_only_volume_lets_its_download_finish() {
    let e = env().await;
    e.fake.state.delay_ms.store(2, Ordering::SeqCst);
    let data = random(8 << 20, 11);
    let b = e.blob(data.clone());
    let one = std::slice::from_ref(&b);
    e.a.ensure("vol-1", &e.src("v1"), one);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(e.a.bytes_fetched() < data.len() as u64, "finished before the volume went away");
    e.a.forget("vol-1");
    assert!(e.a.progress().is_empty());
    // Nobody waits, and the download goes on to its end (a replacement pod finds it done).
    landed(&e, &b).await;
    assert!(std::fs::read(e.path(&b)).unwrap() == data);
    // The file lands a moment before the download is done with its bookkeeping; until then a
    // new volume is told to wait, then finds it ready without fetching it again.
    assert_eq!(e.settle_with(&e.src("v1"), "vol-2", one).await, Ensure::Ready);
    assert_eq!(e.a.bytes_fetched(), data.len() as u64, "fetched once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configured_proxy_carries_the_traffic() {
    let fake = Fake::start().await;
    let (_t, root) = tempdir();
    // The registry's name resolves nowhere: only the proxy (the fake) can reach it.
    let registry = "registry.invalid:5000";
    let cfg = RegistryConfig {
        insecure: [registry.to_string()].into(),
        proxy: Some(format!("http://{}", fake.host)),
        ..Default::default()
    };
    let a = Artifacts::new(root.join("cache"), cfg).unwrap();
    let data = random(100_000, 12);
    let size = data.len() as u64;
    let b = BlobRef { digest: fake.blob(data.clone()), size, media_type: String::new() };
    let src = Source {
        registry: registry.into(),
        repository: "org/model".into(),
        reference: "v1".into(),
        mirror: None,
        credentials: Credentials::Anonymous,
        insecure: true,
        platform: None,
    };
    let until = Instant::now() + Duration::from_secs(30);
    let got = loop {
        match a.ensure("vol-1", &src, std::slice::from_ref(&b)) {
            Ensure::Pulling(_) if Instant::now() < until => tokio::time::sleep(Duration::from_millis(20)).await,
            other => break other,
        }
    };
    assert_eq!(got, Ensure::Ready);
    assert!(fake.state.proxied.load(Ordering::SeqCst) > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_blob_is_fine() {
    let e = env().await;
    let b = e.blob(Vec::new());
    assert_eq!(e.settle("vol-1", std::slice::from_ref(&b)).await, Ensure::Ready);
    assert_eq!(std::fs::metadata(e.path(&b)).unwrap().len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_asking_for_other_blobs_stops_waiting_for_the_old_ones() {
    let e = env().await;
    e.fake.state.delay_ms.store(2, Ordering::SeqCst);
    let old = e.blob(random(8 << 20, 13));
    let new = e.blob(random(1000, 14));
    e.a.ensure("vol-1", &e.src("v1"), std::slice::from_ref(&old));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(e.settle("vol-1", std::slice::from_ref(&new)).await, Ensure::Ready);
    assert_eq!(e.a.progress()["vol-1"].blobs.len(), 1, "it waits for the new blob only");
    // The old download is no one's any more, and still ends in the cache.
    landed(&e, &old).await;
    assert!(!e.partial(&old).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_download_evicts_nothing() {
    let e = env().await;
    // A blob some volume holds a copy of (another filesystem: no second link shows it).
    let old = e.blob(random(4000, 15));
    assert_eq!(e.settle("vol-old", std::slice::from_ref(&old)).await, Ensure::Ready);
    e.a.forget("vol-old");
    let new = e.blob(random(5000, 16));
    assert_eq!(e.settle("vol-new", std::slice::from_ref(&new)).await, Ensure::Ready);
    assert!(e.path(&old).exists(), "pruning is the caller's, with the real in-use set");
}

/// The follower's priority raise is its thread's only while it hashes: a pool thread gets its
/// nice value back.
#[test]
fn the_follower_raises_its_threads_priority_and_gives_it_back() {
    let me = rustix::thread::gettid();
    let nice = || rustix::process::getpriority_process(Some(me)).unwrap();
    let before = nice();
    {
        let _raised =
            super::super::follower::Raised::by(5).expect("the tests run as root, which may lower nice values");
        assert_eq!(nice(), before - 5);
    }
    assert_eq!(nice(), before);
}

/// The value of the process's metric sample `name{labels}` (labels in the encoder's order).
fn sample(name: &str, labels: &str) -> f64 {
    let text = crate::metrics::global().encode();
    let prefix = format!("{name}{{{labels}}} ");
    let line = text.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("no {prefix}in:\n{text}"));
    line[prefix.len()..].parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_metrics_tell_fetched_joined_and_cached_blobs() {
    let e = env().await;
    // Each fake registry has a port of its own: its label is this test's alone.
    let r = format!("registry=\"{}\"", e.fake.host);
    e.fake.state.delay_ms.store(2, Ordering::SeqCst);
    let data = random(4 << 20, 31);
    let b = e.blob(data.clone());
    let one = std::slice::from_ref(&b);
    // vol-a starts the download, vol-b joins it: two pulls in progress, one blob deduplicated.
    assert!(matches!(e.a.ensure("vol-a", &e.src("v1"), one), Ensure::Pulling(_)));
    assert!(matches!(e.a.ensure("vol-b", &e.src("v1"), one), Ensure::Pulling(_)));
    assert!(matches!(e.a.ensure("vol-b", &e.src("v1"), one), Ensure::Pulling(_)), "asking again counts nothing");
    assert_eq!(sample("mounthost_oci_pulls_in_progress", &r), 2.0);
    assert_eq!(sample("mounthost_oci_blobs_deduplicated_total", &format!("{r},found=\"downloading\"")), 1.0);
    // Both pulls end when the blob lands, not when their callers ask next.
    landed(&e, &b).await;
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while sample("mounthost_oci_pulls_in_progress", &r) != 0.0 {
        assert!(std::time::Instant::now() < until, "the pulls did not end with their last blob");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(sample("mounthost_oci_pull_duration_seconds_count", &format!("{r},outcome=\"ok\"")), 2.0);
    assert_eq!(e.settle("vol-a", one).await, Ensure::Ready);
    assert_eq!(e.settle("vol-b", one).await, Ensure::Ready);
    assert_eq!(sample("mounthost_oci_pulls_in_progress", &r), 0.0);
    assert_eq!(sample("mounthost_oci_blob_fetched_bytes_total", &r), data.len() as f64);
    // Neither pull found it in the cache: vol-a fetched it, vol-b joined that download.
    assert_eq!(sample("mounthost_oci_blob_served_from_cache_bytes_total", &r), 0.0);
    assert_eq!(sample("mounthost_oci_pull_duration_seconds_count", &format!("{r},outcome=\"ok\"")), 2.0);
    // A third volume finds it cached: served from the cache, deduplicated, a pull at once.
    assert_eq!(e.a.ensure("vol-c", &e.src("v1"), one), Ensure::Ready);
    assert_eq!(sample("mounthost_oci_blob_served_from_cache_bytes_total", &r), data.len() as f64);
    assert_eq!(sample("mounthost_oci_blobs_deduplicated_total", &format!("{r},found=\"cached\"")), 1.0);
    assert_eq!(sample("mounthost_oci_pull_duration_seconds_count", &format!("{r},outcome=\"ok\"")), 3.0);
    assert_eq!(sample("mounthost_oci_blob_fetched_bytes_total", &r), data.len() as f64, "nothing fetched again");
    // A corrupt blob: the pull waiting for it ends failed; one forgotten while pulling is abandoned.
    e.fake.state.corrupt.store(true, Ordering::SeqCst);
    let bad = e.blob(random(1 << 20, 32));
    let other = e.blob(random(1 << 20, 33));
    assert!(matches!(e.a.ensure("vol-d", &e.src("v1"), std::slice::from_ref(&bad)), Ensure::Pulling(_)));
    assert!(matches!(e.a.ensure("vol-e", &e.src("v1"), std::slice::from_ref(&other)), Ensure::Pulling(_)));
    e.a.forget("vol-e");
    assert!(matches!(e.settle("vol-d", std::slice::from_ref(&bad)).await, Ensure::Failed(_)));
    assert_eq!(sample("mounthost_oci_pull_duration_seconds_count", &format!("{r},outcome=\"failed\"")), 1.0);
    assert_eq!(sample("mounthost_oci_pull_duration_seconds_count", &format!("{r},outcome=\"ok\"")), 3.0);
    assert_eq!(sample("mounthost_oci_pulls_in_progress", &r), 0.0);
}

/// An index for `data` in `chunk`-byte chunks, wrong about chunk `wrong`.
fn index_wrong_at(data: &[u8], chunk: u64, wrong: usize) -> std::sync::Arc<super::super::ChunkIndex> {
    use sha2::Digest as _;
    let mut hashes: Vec<[u8; 32]> = data.chunks(chunk as usize).map(|c| sha2::Sha256::digest(c).into()).collect();
    hashes[wrong] = [0; 32];
    std::sync::Arc::new(super::super::ChunkIndex { chunk, hashes })
}

/// A fake registry with a blob of `size` random bytes, and a lazy volume registered for it whose
/// index (64 KiB chunks) is wrong about chunk `wrong`.
async fn lazy_blob_with_a_wrong_index(
    size: usize,
    seed: u64,
    wrong: usize,
) -> (Env, Vec<u8>, BlobRef, std::sync::Arc<super::super::ChunkIndex>) {
    let e = env().await;
    let data = random(size, seed);
    let b = e.blob(data.clone());
    let index = index_wrong_at(&data, 64 << 10, wrong);
    e.a.lazy_register("lazy-vol", std::slice::from_ref(&b));
    (e, data, b, index)
}

/// A lazy volume's index is wrong about one chunk of a blob an eager volume then pulls: the
/// chunk is fetched again once (after the streams ended: an eager pull has no demand workers),
/// its bytes stay, and the blob lands, its digest verified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eager_pull_lands_though_a_lazy_volumes_index_is_wrong() {
    let (e, data, b, index) = lazy_blob_with_a_wrong_index(3 << 20, 21, 5).await;
    let view = e.a.lazy_view(&b, Some(&index));
    assert!(view.readable.is_empty() && !view.complete);
    assert_eq!(e.settle("eager-vol", std::slice::from_ref(&b)).await, Ensure::Ready);
    assert_eq!(std::fs::read(e.path(&b)).unwrap(), data);
    assert_eq!(e.a.bytes_fetched(), data.len() as u64 + (64 << 10), "the wrong chunk once more, nothing else");
    let view = e.a.lazy_view(&b, Some(&index));
    assert!(view.complete && view.bad.is_empty(), "the digest overrules the index: {view:?}");
}

/// A lazy download whose reader's index is wrong about one chunk: the reader is refused that
/// chunk, another reader without the index is not, and the blob completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_index_refuses_its_reader_one_chunk_and_the_blob_completes() {
    let (e, data, b, index) = lazy_blob_with_a_wrong_index(2 << 20, 22, 3).await;
    let src = e.src("v1");
    e.a.lazy_want("lazy-vol", &src, &b, 0, 1 << 20, true, Some(index.clone())).unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let view = e.a.lazy_view(&b, Some(&index));
        if view.bad == [(3 << 16, 4 << 16)] && view.readable.first() == Some(&(0, 3 << 16)) {
            break;
        }
        assert!(Instant::now() < until, "{view:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let plain = e.a.lazy_view(&b, None);
    assert!(plain.readable.first().is_some_and(|r| r.0 == 0 && r.1 >= 1 << 20), "{plain:?}");
    e.a.lazy_start("lazy-vol", &src, &b, true, false, Some(index.clone())).unwrap();
    landed(&e, &b).await;
    assert_eq!(std::fs::read(e.path(&b)).unwrap(), data);
    assert!(e.a.lazy_view(&b, Some(&index)).complete);
}
