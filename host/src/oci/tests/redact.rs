//! No query string, userinfo or signature of a URL reaches an error's text.

use std::sync::atomic::Ordering;

use super::super::error::redact;
use super::super::{BlobRef, Credentials, Ensure, RegistryConfig, push_plugin};
use super::pull::{env, random};

#[test]
fn urls_lose_their_query_fragment_and_userinfo() {
    let cases = [
        (
            "error sending request for url (https://bucket.s3.amazonaws.com/docker/blobs/data?X-Amz-Algorithm=AWS4&X-Amz-Credential=AKIA%2F2024&X-Amz-Signature=deadbeef): connection refused",
            "error sending request for url (https://bucket.s3.amazonaws.com/docker/blobs/data): connection refused",
        ),
        ("http://user:pa%40ss@proxy.example:3128/ is bad", "http://proxy.example:3128/ is bad"),
        ("see https://cdn.example/x#frag and http://h/y?sig=1,2,3.", "see https://cdn.example/x and http://h/y."),
        ("plain text without any", "plain text without any"),
        ("ftp://h/a?b=c", "ftp://h/a"),
        ("at the end http://h:5000", "at the end http://h:5000"),
        ("héllo ünïcode://x/?q=1 done", "héllo ünïcode://x/ done"),
        (
            "signed X-Amz-Signature=abc123&x=1 token=t0k; access_token=zz",
            "signed X-Amz-Signature=<redacted>&x=1 token=<redacted>; access_token=<redacted>",
        ),
        ("sizes a=b c==", "sizes a=b c=="),
    ];
    for (input, want) in cases {
        assert_eq!(redact(input), want, "{input}");
        assert_eq!(redact(&redact(input)), want, "idempotent: {input}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_redirected_to_storage_is_pulled() {
    let e = env().await;
    *e.fake.state.redirect.lock().unwrap() =
        Some(format!("http://{}/storage/{{digest}}?X-Amz-Signature=STORAGE-SIGNATURE-SECRET", e.fake.host));
    let data = random(100_000, 50);
    let b = e.blob(data.clone());
    assert_eq!(e.settle("vol-1", std::slice::from_ref(&b)).await, Ensure::Ready);
    assert!(std::fs::read(e.path(&b)).unwrap() == data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_presigned_url_never_reaches_an_error() {
    let e = env().await;
    // A redirect the guard refuses to follow: its error names the host it was sent to.
    *e.fake.state.redirect.lock().unwrap() = Some(
        "ftp://deploy:pa55word@storage.example/blobs/{digest}?X-Amz-Credential=AKIAEXAMPLE&X-Amz-Signature=STORAGE-SIGNATURE-SECRET"
            .to_string(),
    );
    let b = e.blob(random(1000, 51));
    let got = e.settle("vol-1", std::slice::from_ref(&b)).await;
    let Ensure::Failed(err) = got else { panic!("{got:?}") };
    let shown = format!("{err} | {err:?}");
    assert!(matches!(err, super::super::OciError::Refused { kind: "redirect", .. }), "{err:?}");
    assert!(
        shown.contains("a redirect points to storage.example: ftp:// is not HTTP(S)"),
        "the host is named: {shown}"
    );
    for secret in ["STORAGE-SIGNATURE-SECRET", "AKIAEXAMPLE", "pa55word", "X-Amz"] {
        assert!(!shown.contains(secret), "{secret} in {shown}");
    }

    // Storage the guard refuses (another port of loopback), and storage that cannot be reached
    // (the same, listed for the registry): neither error shows the URL's secrets.
    let redirect = "http://deploy:pa55word@127.0.0.1:9/storage/{digest}?X-Amz-Credential=AKIAEXAMPLE&X-Amz-Signature=STORAGE-SIGNATURE-SECRET";
    *e.fake.state.redirect.lock().unwrap() = Some(redirect.to_string());
    let b = e.blob(random(1000, 54));
    let one = std::slice::from_ref(&b);
    let Ensure::Failed(err) = e.settle("vol-1", one).await else { panic!("not refused") };
    let shown = format!("{err} | {err:?}");
    assert!(shown.contains("a redirect points to 127.0.0.1:9"), "{shown}");
    let listed = super::super::Artifacts::new(
        e.root.join("cache-2"),
        super::super::RegistryConfig {
            insecure: [e.fake.host.clone(), "127.0.0.1:9".into()].into(),
            endpoints: [(e.fake.host.clone(), ["127.0.0.1:9".to_string()].into())].into(),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(matches!(listed.ensure("vol-1", &e.src("v1"), one), Ensure::Pulling(_)));
    let why = loop {
        if let Some(w) = listed.last_errors().get(&b.digest) {
            break format!("{w} | {shown}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert!(why.contains("unreachable"), "{why}");
    for secret in ["STORAGE-SIGNATURE-SECRET", "AKIAEXAMPLE", "pa55word", "X-Amz"] {
        assert!(!why.contains(secret), "{secret} in {why}");
    }

    // Storage answering an error whose body echoes the signature.
    *e.fake.state.redirect.lock().unwrap() =
        Some(format!("http://{}/storage/{{digest}}?X-Amz-Signature=STORAGE-SIGNATURE-SECRET", e.fake.host));
    e.fake.state.storage_fails.store(true, Ordering::SeqCst);
    let c = e.blob(random(1000, 52));
    let one = std::slice::from_ref(&c);
    assert!(matches!(e.a.ensure("vol-2", &e.src("v1"), one), Ensure::Pulling(_)));
    let why = e.stopped(&c).await;
    assert!(why.contains("500") && why.contains("InternalError"), "{why}");
    assert!(!why.contains("STORAGE-SIGNATURE-SECRET"), "{why}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_download_reports_no_url_query_either() {
    let e = env().await;
    // The storage does not have it (a 404 there, whose URL oci-client keeps): a permanent
    // failure, reported through `ensure`.
    *e.fake.state.redirect.lock().unwrap() =
        Some(format!("http://{}/storage/missing-{{digest}}?X-Amz-Signature=STORAGE-SIGNATURE-SECRET", e.fake.host));
    let b: BlobRef = e.blob(random(1000, 53));
    let got = e.settle("vol-1", std::slice::from_ref(&b)).await;
    let Ensure::Failed(err) = got else { panic!("{got:?}") };
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("STORAGE-SIGNATURE-SECRET") && !shown.contains("X-Amz"), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_push_reports_no_url_query() {
    let e = env().await;
    // The registry hands the upload to presigned storage that cannot be reached: the
    // transport error names the URL, signature included, before redaction.
    let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    *e.fake.state.upload_location.lock().unwrap() =
        Some(format!("http://{gone}/storage/upload-1?X-Amz-Signature=UPLOAD-SIGNATURE-SECRET"));
    let target = crate::plan::oci_ref::OciRef::parse(&format!("{}/plugins/p:v1", e.fake.host)).unwrap();
    let cfg = RegistryConfig { insecure: [e.fake.host.clone(), gone.to_string()].into(), ..Default::default() };
    let err = push_plugin(cfg, &target, &Credentials::Anonymous, b"\0asm".to_vec(), "p.wasm", &Default::default())
        .await
        .unwrap_err();
    let shown = format!("{err} {err:?}");
    assert!(shown.contains("/storage/upload-1"), "the error says where the upload went: {shown}");
    assert!(!shown.contains("SIGNATURE-SECRET") && !shown.contains("X-Amz"), "{shown}");
}
