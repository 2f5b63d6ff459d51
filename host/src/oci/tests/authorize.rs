//! `authorize`: a source must prove it holds a blob the shared cache has, by its bytes.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::super::authorize::PROOF_RANGES;
use super::super::{Artifacts, BlobRef, Credentials, Ensure, OciError, RegistryConfig};
use super::pull::{Env, env, random};

/// Proofs the fake received (each asks [`PROOF_RANGES`] ranges).
fn proofs(e: &Env) -> usize {
    e.fake.state.probes.load(Ordering::SeqCst).div_ceil(PROOF_RANGES)
}

fn basic(user: &str, password: &str) -> Credentials {
    Credentials::Basic { username: user.into(), password: password.into() }
}

/// A fake that wants `u:p`, and `b` pulled into the cache with those credentials.
async fn cached_behind_auth() -> (Env, BlobRef) {
    let e = env().await;
    *e.fake.state.basic.lock().unwrap() = Some("dTpw".into()); // u:p
    let b = e.blob(random(3000, 21));
    let mut src = e.src("v1");
    src.credentials = basic("u", "p");
    assert_eq!(e.settle_with(&src, "vol-owner", std::slice::from_ref(&b)).await, Ensure::Ready);
    (e, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_blob_is_refused_to_a_source_without_the_right_credentials() {
    let (e, b) = cached_behind_auth().await;
    let one = std::slice::from_ref(&b);
    let mut src = e.src("v1");
    // Without `authorize`, `ensure` hands the blob over: the hole this closes.
    assert_eq!(e.a.ensure("vol-intruder", &src, one), Ensure::Ready);
    let err = e.a.authorize(&src, one).await.unwrap_err();
    assert!(matches!(err, OciError::AuthMissing { .. }), "{err:?}");
    assert!(err.to_string().contains(&e.fake.host), "{err}");
    src.credentials = basic("u", "wrong");
    let err = e.a.authorize(&src, one).await.unwrap_err();
    assert!(matches!(err, OciError::AuthRefused { .. }), "{err:?}");
    assert!(!format!("{err} {err:?}").contains("wrong"), "{err:?}");
    // Refusals are not remembered: each call asks again.
    let asked = e.fake.state.probes_asked.load(Ordering::SeqCst);
    assert!(e.a.authorize(&src, one).await.is_err());
    assert!(e.fake.state.probes_asked.load(Ordering::SeqCst) > asked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proof_is_asked_once_and_remembered_per_credentials() {
    let (e, b) = cached_behind_auth().await;
    let one = std::slice::from_ref(&b);
    let mut src = e.src("v1");
    src.credentials = basic("u", "p");
    // The download itself was the proof.
    e.a.authorize(&src, one).await.unwrap();
    assert_eq!(proofs(&e), 0);

    // A restarted daemon (a new cache on the same directory) remembers nothing: one proof,
    // then none.
    let again = Artifacts::new(
        e.root.join("cache"),
        RegistryConfig { insecure: [e.fake.host.clone()].into(), ..Default::default() },
    )
    .unwrap();
    again.authorize(&src, one).await.unwrap();
    assert_eq!(e.fake.state.probes.load(Ordering::SeqCst), PROOF_RANGES);
    again.authorize(&src, one).await.unwrap();
    assert_eq!(e.fake.state.probes.load(Ordering::SeqCst), PROOF_RANGES, "remembered");
    // Other credentials, other proof.
    src.credentials = basic("u", "wrong");
    assert!(again.authorize(&src, one).await.is_err());
    // Another repository, other proof.
    let mut elsewhere = e.src("v1");
    elsewhere.repository = "org/other".into();
    elsewhere.credentials = basic("u", "p");
    again.authorize(&elsewhere, one).await.unwrap();
    // One proof each: the first and this one (the refused one was served nothing).
    assert_eq!(e.fake.state.probes.load(Ordering::SeqCst), 2 * PROOF_RANGES);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_blob_the_registry_does_not_have_is_not_found() {
    let (e, b) = cached_behind_auth().await;
    e.fake.state.blobs.lock().unwrap().remove(&b.digest);
    let fresh = Artifacts::new(
        e.root.join("cache"),
        RegistryConfig { insecure: [e.fake.host.clone()].into(), ..Default::default() },
    )
    .unwrap();
    let mut src = e.src("v1");
    src.credentials = basic("u", "p");
    let err = fresh.authorize(&src, std::slice::from_ref(&b)).await.unwrap_err();
    assert!(matches!(err, OciError::BlobNotFound { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains(&b.digest) && text.contains(&format!("{}/org/model:v1", e.fake.host)), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blobs_not_in_the_cache_need_no_request() {
    let e = env().await;
    let blobs: Vec<BlobRef> = (0..5).map(|i| e.blob(random(1000, 30 + i))).collect();
    e.a.authorize(&e.src("v1"), &blobs).await.unwrap();
    assert_eq!(e.fake.state.probes.load(Ordering::SeqCst), 0);
    assert_eq!(e.fake.state.connections.load(Ordering::SeqCst), 0);
    // Many cached ones: each checked, all at once.
    let fresh = |e: &Env| {
        Artifacts::new(
            e.root.join("cache"),
            RegistryConfig { insecure: [e.fake.host.clone()].into(), ..Default::default() },
        )
        .unwrap()
    };
    assert_eq!(e.settle("vol-1", &blobs).await, Ensure::Ready);
    let other = fresh(&e);
    other.authorize(&e.src("v1"), &blobs).await.unwrap();
    assert_eq!(e.fake.state.probes.load(Ordering::SeqCst), 5 * PROOF_RANGES);
    assert_eq!(e.fake.state.heads.load(Ordering::SeqCst), 0, "a HEAD proves nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_downloading_with_other_credentials_is_checked() {
    let e = env().await;
    e.fake.state.delay_ms.store(5, Ordering::SeqCst);
    let b = e.blob(random(4 << 20, 40));
    let one = std::slice::from_ref(&b);
    let owner = e.src("v1");
    assert!(matches!(e.a.ensure("vol-owner", &owner, one), Ensure::Pulling(_)));
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The same credentials: the download is the proof to come.
    e.a.authorize(&owner, one).await.unwrap();
    assert_eq!(proofs(&e), 0);
    // Others: asked for ranges over the whole blob, compared once the download wrote them.
    let mut other = e.src("v1");
    other.credentials = basic("someone", "else");
    e.a.authorize(&other, one).await.unwrap();
    assert_eq!(e.fake.state.probes.load(Ordering::SeqCst), PROOF_RANGES);
    // Bytes not verified yet prove nothing for good: once the blob is complete, asked again.
    assert_eq!(e.settle("vol-owner", one).await, Ensure::Ready);
    e.a.authorize(&other, one).await.unwrap();
    e.a.authorize(&other, one).await.unwrap();
    assert_eq!(e.fake.state.probes.load(Ordering::SeqCst), 2 * PROOF_RANGES, "asked again, then remembered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_file_left_by_others_is_checked_against_its_bytes_or_dropped() {
    let e = env().await;
    let data = random(200_000, 41);
    let b = e.blob(data.clone());
    let one = std::slice::from_ref(&b);
    let sidecar = |have: &str| {
        let text = format!(r#"{{"version":1,"size":200000,"have":[{have}]}}"#);
        std::fs::write(e.partial(&b).with_extension("partial.json"), text).unwrap();
    };
    // An empty one holds nothing to hand over: nothing to prove.
    std::fs::write(e.partial(&b), b"").unwrap();
    e.a.authorize(&e.src("v1"), one).await.unwrap();
    assert_eq!(e.fake.state.probes.load(Ordering::SeqCst), 0);
    // Every byte written (as a download leaves them before its check): compared, not
    // remembered (nothing verified them).
    std::fs::write(e.partial(&b), &data).unwrap();
    sidecar("[0,200000]");
    e.a.authorize(&e.src("v1"), one).await.unwrap();
    e.a.authorize(&e.src("v1"), one).await.unwrap();
    assert_eq!(e.fake.state.probes.load(Ordering::SeqCst), 2 * PROOF_RANGES);
    assert!(e.partial(&b).exists(), "bytes the source agrees with are kept");
    // Other bytes, no download writing them: one of the two is wrong; the partial file,
    // unverified and unused, goes (this source then downloads with its own credentials).
    let mut wrong = data.clone();
    wrong.iter_mut().for_each(|x| *x ^= 0x55);
    std::fs::write(e.partial(&b), &wrong).unwrap();
    e.a.authorize(&e.src("v1"), one).await.unwrap();
    assert!(!e.partial(&b).exists(), "the contradicted partial file is dropped");
    // Half of it written: the ranges asked for are not all there; nothing writes more: dropped
    // without a request.
    std::fs::write(e.partial(&b), &data[..100_000]).unwrap();
    sidecar("[0,100000]");
    let asked = e.fake.state.probes.load(Ordering::SeqCst);
    let mut dropped = false;
    for _ in 0..20 {
        e.a.authorize(&e.src("v1"), one).await.unwrap();
        if !e.partial(&b).exists() {
            dropped = true;
            break;
        }
        // All four ranges fell in the written half (1 in 16): compared; draw again.
    }
    assert!(dropped, "a half-written partial file no download writes was kept");
    assert!(e.fake.state.probes.load(Ordering::SeqCst) - asked < 20 * PROOF_RANGES);
}

/// The attack: a registry that answers every `HEAD` with 200 but cannot send the bytes (here:
/// sends others) gets nothing of a blob another tenant cached; one that ignores `Range` must
/// send the whole blob, hashing to its digest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_must_send_the_bytes_not_say_it_has_them() {
    let (e, b) = cached_behind_auth().await;
    let one = std::slice::from_ref(&b);
    let fresh = || {
        Artifacts::new(
            e.root.join("cache"),
            RegistryConfig { insecure: [e.fake.host.clone()].into(), ..Default::default() },
        )
        .unwrap()
    };
    let mut src = e.src("v1");
    src.credentials = basic("u", "p");
    let truth = e.fake.state.blobs.lock().unwrap().insert(b.digest.clone(), random(3000, 99)).unwrap();
    let err = fresh().authorize(&src, one).await.unwrap_err();
    assert!(matches!(err, OciError::ProofFailed { .. }), "{err:?}");
    assert!(err.to_string().contains("did not prove it holds") && err.to_string().contains(&b.digest), "{err}");
    assert_eq!(e.fake.state.heads.load(Ordering::SeqCst), 0);
    // The whole blob, flipped: refused; the true one: proven.
    e.fake.state.ignore_range.store(true, Ordering::SeqCst);
    let err = fresh().authorize(&src, one).await.unwrap_err();
    assert!(err.to_string().contains("ignores Range"), "{err}");
    e.fake.state.blobs.lock().unwrap().insert(b.digest.clone(), truth);
    fresh().authorize(&src, one).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorize_runs_in_a_spawned_task() {
    // The daemon calls it from futures given to `tokio::spawn`: it must be `Send` for any
    // lifetime of its arguments (this does not compile otherwise).
    let e = env().await;
    let b = e.blob(random(100, 60));
    let src = e.src("v1");
    let a = std::sync::Arc::new(e.a);
    let blobs = vec![b];
    tokio::spawn(async move { a.authorize(&src, &blobs).await }).await.unwrap().unwrap();
}
