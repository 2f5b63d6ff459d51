//! A registry that turns hostile on demand (issue 41), and what a test needs to watch it.
//!
//! [`Hostile`] is a small OCI distribution server of the test's own (hyper 1, HTTP/1.1, on
//! 127.0.0.1, optionally TLS with a certificate signed by a test CA made with `openssl`, as
//! `common::registry` makes its own). It serves `/v2/`, `GET`/`HEAD` of manifests and of blobs
//! (`Range: bytes=a-b` answered 206) from what the test registers in memory, and misbehaves as
//! the test asks ([`Behaviour`], changeable while it runs):
//!
//! - a manifest reply of N bytes generated on the fly, or one that never ends
//!   ([`ManifestReply`]): never held in memory, counted as it is sent;
//! - blob GETs trickled (one byte per interval) for chosen digests, or every blob reply sent at
//!   a steady rate ([`Behaviour::rate`]);
//! - `200` to every blob `HEAD`, with `GET`s of blobs it only claims answering 404 or wrong
//!   bytes ([`Lie`]);
//! - `401` with a `WWW-Authenticate: Bearer realm=…` naming another listener to any request
//!   without `Authorization: Bearer`;
//! - blob GETs answered with a `307` redirect to a URL the test gives.
//!
//! It records every request (method, path, the scheme of its `Authorization`), so a test can
//! say what reached it. [`Bystander`] is a plain TCP listener that answers any request with a
//! token JSON and counts connections: the proof that **nothing reached it**. [`MemoryCage`]
//! confines a process (the host daemon) in a memory cgroup of its own, so an attack that makes
//! it read gigabytes ends with an OOM kill in the cage instead of eating the machine.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body::{Frame, SizeHint};
use tokio::sync::mpsc;

use super::registry::{
    Class, Descriptor, OCI_MANIFEST, Packing, PushedLayer, PushedModel, layer_media_type, make_tls, model_manifest,
    sha256_digest,
};

/// How a manifest is answered.
#[derive(Clone, Debug)]
pub enum ManifestReply {
    /// These bytes, with `Content-Length`.
    Json(Bytes),
    /// `Content-Length: N` and N bytes: a valid-looking manifest's opening, then JSON whitespace.
    /// Generated as it is sent.
    Sized(u64),
    /// The same opening, then whitespace without end (chunked, no length): `chunk` bytes at a
    /// time, `every` apart (zero: as fast as the client reads).
    Endless { chunk: usize, every: Duration },
}

/// What a claimed blob's `GET` answers (its `HEAD` says 200 with the claimed size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lie {
    /// 404 `BLOB_UNKNOWN`.
    NotFound,
    /// The requested length (or range) of bytes that are not the blob's.
    WrongBytes,
}

/// A blob of the server.
#[derive(Clone, Debug)]
enum Blob {
    Bytes(Bytes),
    Claimed { size: u64, lie: Lie },
}

/// The server's misbehaviours; each is off by default.
#[derive(Clone, Debug, Default)]
pub struct Behaviour {
    /// Blob digests whose `GET`s are sent one byte per interval.
    pub trickle: HashMap<String, Duration>,
    /// Answer `HEAD` of any blob 200, even of one it does not hold (Content-Length 0 then).
    pub heads_lie: bool,
    /// Answer 401 with this token realm to every request without `Authorization: Bearer`.
    pub bearer_realm: Option<String>,
    /// Answer blob `GET`s with a 307 to `<this>/<digest>`.
    pub redirect_blobs: Option<String>,
    /// Send every blob `GET`'s body at this many bytes a second (each reply on its own), in
    /// pieces of 16 KiB; a reply stops when its client goes.
    pub rate: Option<u64>,
}

/// One request the server received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub method: String,
    pub path: String,
    /// The scheme of its `Authorization` header (`Basic`, `Bearer`), when it had one.
    pub authorization: Option<String>,
}

/// The server's state, shared with its connections.
#[derive(Default)]
struct State {
    manifests: Mutex<HashMap<(String, String), (String, ManifestReply)>>,
    blobs: Mutex<HashMap<String, Blob>>,
    behaviour: Mutex<Behaviour>,
    seen: Mutex<Vec<Seen>>,
    connections: AtomicU64,
    /// Bytes of generated manifest replies handed to the connection.
    manifest_bytes: AtomicU64,
    /// Bytes of blob bodies handed to the connection (ranges and lies included).
    blob_bytes: AtomicU64,
    /// Blob `GET`s answered with a body.
    blob_gets: AtomicU64,
    /// Bytes the replies sent at a rate still have to send (their clients still there).
    pending: AtomicU64,
    /// Trickled replies whose client is still there.
    trickling: AtomicUsize,
    /// Trickled replies started.
    trickles: AtomicUsize,
    /// Bytes of trickled replies handed to the connection.
    trickled: AtomicU64,
    /// Trickled replies whose client went away before their end.
    abandoned: AtomicUsize,
}

/// A registry of the test's own on 127.0.0.1 (see the module's doc); stopped on drop.
pub struct Hostile {
    port: u16,
    tls: Option<tempfile::TempDir>,
    state: Arc<State>,
    rt: Option<tokio::runtime::Runtime>,
}

impl Hostile {
    /// Plain HTTP.
    pub fn start() -> Hostile {
        Hostile::start_with(false)
    }

    /// HTTPS with a certificate for IP 127.0.0.1 signed by a fresh test CA ([`Hostile::ca_pem`]).
    pub fn start_tls() -> Hostile {
        Hostile::start_with(true)
    }

    fn start_with(tls: bool) -> Hostile {
        let dir = tls.then(|| {
            let dir = tempfile::Builder::new().prefix("mounthost-hostile-").tempdir().unwrap();
            make_tls(dir.path());
            dir
        });
        let acceptor = dir.as_ref().map(|d| tls_acceptor(d.path()));
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let state = Arc::new(State::default());
        let shared = state.clone();
        rt.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let Ok((tcp, _)) = listener.accept().await else { continue };
                shared.connections.fetch_add(1, Ordering::SeqCst);
                let (state, acceptor) = (shared.clone(), acceptor.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(handle(&state, req)) }
                    });
                    let http = hyper::server::conn::http1::Builder::new();
                    match acceptor {
                        Some(acceptor) => {
                            let Ok(tls) = acceptor.accept(tcp).await else { return };
                            let _ = http.serve_connection(hyper_util::rt::TokioIo::new(tls), service).await;
                        }
                        None => {
                            let _ = http.serve_connection(hyper_util::rt::TokioIo::new(tcp), service).await;
                        }
                    }
                });
            }
        });
        Hostile { port, tls: dir, state, rt: Some(rt) }
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `http(s)://127.0.0.1:PORT` followed by `path`.
    pub fn url(&self, path: &str) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}{path}", self.host())
    }

    /// `127.0.0.1:PORT/repo:tag`.
    pub fn reference(&self, repo: &str, tag: &str) -> String {
        format!("{}/{repo}:{tag}", self.host())
    }

    /// The test CA's certificate (PEM). Panics on a plain HTTP server.
    pub fn ca_pem(&self) -> PathBuf {
        self.tls.as_ref().expect("this server was started without TLS").path().join("ca.pem")
    }

    /// Change how it behaves from now on.
    pub fn behave(&self, change: impl FnOnce(&mut Behaviour)) {
        change(&mut self.state.behaviour.lock().unwrap());
    }

    /// Hold a blob; returns its descriptor.
    pub fn put_blob(&self, bytes: impl Into<Bytes>) -> Descriptor {
        let bytes = bytes.into();
        let desc = Descriptor { digest: sha256_digest(&bytes), size: bytes.len() as u64 };
        self.state.blobs.lock().unwrap().insert(desc.digest.clone(), Blob::Bytes(bytes));
        desc
    }

    /// Claim a blob it does not hold: `HEAD` says 200 and `size`, `GET` answers as `lie` says.
    pub fn claim_blob(&self, digest: &str, size: u64, lie: Lie) {
        self.state.blobs.lock().unwrap().insert(digest.to_string(), Blob::Claimed { size, lie });
    }

    /// The bytes of a blob it holds.
    pub fn blob(&self, digest: &str) -> Option<Bytes> {
        match self.state.blobs.lock().unwrap().get(digest) {
            Some(Blob::Bytes(b)) => Some(b.clone()),
            _ => None,
        }
    }

    /// Hold every blob `other` holds too.
    pub fn copy_blobs_from(&self, other: &Hostile) {
        let theirs = other.state.blobs.lock().unwrap().clone();
        self.state.blobs.lock().unwrap().extend(theirs);
    }

    /// Serve `json` (an OCI image manifest) at `repo:tag` and at `repo@<its digest>`; returns
    /// the digest.
    pub fn put_manifest(&self, repo: &str, tag: &str, json: &str) -> String {
        let digest = sha256_digest(json.as_bytes());
        let reply = ManifestReply::Json(Bytes::copy_from_slice(json.as_bytes()));
        let mut manifests = self.state.manifests.lock().unwrap();
        for r in [tag, digest.as_str()] {
            manifests.insert((repo.to_string(), r.to_string()), (OCI_MANIFEST.to_string(), reply.clone()));
        }
        digest
    }

    /// Answer `repo:tag` as `reply` says.
    pub fn put_manifest_reply(&self, repo: &str, tag: &str, reply: ManifestReply) {
        self.state
            .manifests
            .lock()
            .unwrap()
            .insert((repo.to_string(), tag.to_string()), (OCI_MANIFEST.to_string(), reply));
    }

    /// A ModelPack model of `files` (each one layer, packed as it says: raw, tar or tar+gzip),
    /// its config and manifest, all held here.
    pub fn put_model(&self, repo: &str, tag: &str, files: &[(&str, &[u8], Class, Packing)]) -> PushedModel {
        let mut layers = Vec::new();
        let mut listed = Vec::new();
        for (path, bytes, class, packing) in files {
            let (blob, diff_id) = match packing {
                Packing::Raw => (bytes.to_vec(), sha256_digest(bytes)),
                Packing::Tar => {
                    let tar = tar_of(path, bytes);
                    let diff = sha256_digest(&tar);
                    (tar, diff)
                }
                Packing::TarGzip => {
                    let tar = tar_of(path, bytes);
                    let diff = sha256_digest(&tar);
                    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                    gz.write_all(&tar).unwrap();
                    (gz.finish().unwrap(), diff)
                }
                Packing::TarZstd => {
                    let tar = tar_of(path, bytes);
                    let diff = sha256_digest(&tar);
                    (zstd::encode_all(tar.as_slice(), 1).unwrap(), diff)
                }
            };
            let descriptor = self.put_blob(blob);
            layers.push(PushedLayer {
                descriptor,
                media_type: layer_media_type(*class, *packing),
                filepath: path.to_string(),
                diff_id,
            });
            let file_sha = sha256_digest(bytes).trim_start_matches("sha256:").to_string();
            listed.push((path.to_string(), file_sha, bytes.len() as u64));
        }
        self.list_model(repo, tag, &layers, listed)
    }

    /// A manifest at `repo:tag` (and a config, held here) listing `of`'s layers, whose blobs
    /// this server does not get: what a tenant who read another's manifest can publish.
    pub fn relist(&self, repo: &str, tag: &str, of: &PushedModel) -> PushedModel {
        self.list_model(repo, tag, &of.layers, of.files.clone())
    }

    fn list_model(
        &self,
        repo: &str,
        tag: &str,
        layers: &[PushedLayer],
        files: Vec<(String, String, u64)>,
    ) -> PushedModel {
        let config = serde_json::json!({
            "descriptor": { "name": repo, "version": tag, "family": "mounthost-hostile" },
            "config": { "format": "test" },
            "modelfs": { "type": "layers", "diffIds": layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>() },
        });
        let config = self.put_blob(serde_json::to_vec(&config).unwrap());
        let manifest = model_manifest(&config, layers);
        let manifest_digest = self.put_manifest(repo, tag, &manifest);
        PushedModel {
            reference: self.reference(repo, tag),
            repo: repo.to_string(),
            tag: tag.to_string(),
            manifest_digest,
            manifest,
            config,
            files,
            layers: layers.to_vec(),
        }
    }

    /// Every request received so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    /// The requests received so far whose method is `method` and whose path contains `part`.
    pub fn count(&self, method: &str, part: &str) -> usize {
        self.seen().iter().filter(|s| s.method == method && s.path.contains(part)).count()
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// Bytes of generated manifest replies handed to connections so far.
    pub fn manifest_bytes_sent(&self) -> u64 {
        self.state.manifest_bytes.load(Ordering::SeqCst)
    }

    /// Bytes of blob bodies handed to connections so far.
    pub fn blob_bytes_sent(&self) -> u64 {
        self.state.blob_bytes.load(Ordering::SeqCst)
    }

    /// Trickled replies whose client is still reading.
    pub fn trickling(&self) -> usize {
        self.state.trickling.load(Ordering::SeqCst)
    }

    /// Trickled replies started so far.
    pub fn trickles_started(&self) -> usize {
        self.state.trickles.load(Ordering::SeqCst)
    }

    /// Bytes the replies sent at [`Behaviour::rate`] still have to send, their clients still
    /// there: what the node's running downloads from here still expect.
    pub fn pending_bytes(&self) -> u64 {
        self.state.pending.load(Ordering::SeqCst)
    }

    /// Blob `GET`s answered with a body so far.
    pub fn blob_gets(&self) -> u64 {
        self.state.blob_gets.load(Ordering::SeqCst)
    }

    /// Bytes of trickled replies handed to connections so far.
    pub fn trickled_bytes(&self) -> u64 {
        self.state.trickled.load(Ordering::SeqCst)
    }

    /// Trickled replies whose client went away before their end (it gave up on them).
    pub fn trickles_abandoned(&self) -> usize {
        self.state.abandoned.load(Ordering::SeqCst)
    }

    /// The request log, one line each, for failure messages.
    pub fn log(&self) -> String {
        self.seen()
            .iter()
            .map(|s| format!("{} {} {}\n", s.method, s.path, s.authorization.as_deref().unwrap_or("-")))
            .collect()
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// A tar of the one file `bytes` at `path`.
fn tar_of(path: &str, bytes: &[u8]) -> Vec<u8> {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(bytes.len() as u64);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_uid(0);
    header.set_gid(0);
    let mut builder = tar::Builder::new(Vec::new());
    builder.append_data(&mut header, path, bytes).unwrap();
    builder.into_inner().unwrap()
}

/// A reply body: bytes at once, or what a task sends as it goes.
pub enum Reply {
    Full(Option<Bytes>),
    Stream(mpsc::Receiver<Bytes>),
}

impl http_body::Body for Reply {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Reply::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Reply::Stream(rx) => rx.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Reply::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Reply::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Reply::Full(None) => SizeHint::with_exact(0),
            Reply::Stream(_) => SizeHint::default(),
        }
    }
}

fn reply(status: StatusCode, headers: &[(&str, String)], body: Reply) -> Response<Reply> {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert("docker-distribution-api-version", HeaderValue::from_static("registry/2.0"));
    for (k, v) in headers {
        h.insert(header::HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
    }
    r
}

fn error(status: StatusCode, code: &str) -> Response<Reply> {
    let body = format!(r#"{{"errors":[{{"code":"{code}","message":"{code}"}}]}}"#);
    reply(status, &[("content-type", "application/json".into())], Reply::Full(Some(body.into())))
}

/// `(repo, rest)` of `/v2/<repo>/<kind>/<rest>`.
fn split<'a>(path: &'a str, kind: &str) -> Option<(&'a str, &'a str)> {
    let inner = path.strip_prefix("/v2/")?;
    let at = inner.rfind(kind)?;
    Some((&inner[..at], &inner[at + kind.len()..]))
}

/// `bytes=a-b` or `bytes=a-`.
fn range_of(req: &Request<hyper::body::Incoming>) -> Option<(u64, Option<u64>)> {
    let v = req.headers().get(header::RANGE)?.to_str().ok()?;
    let (a, b) = v.strip_prefix("bytes=")?.split_once('-')?;
    Some((a.trim().parse().ok()?, if b.trim().is_empty() { None } else { Some(b.trim().parse().ok()?) }))
}

fn handle(state: &Arc<State>, req: Request<hyper::body::Incoming>) -> Response<Reply> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let auth = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).map(str::to_string);
    let scheme = auth.as_deref().map(|a| a.split_whitespace().next().unwrap_or_default().to_string());
    state.seen.lock().unwrap().push(Seen { method: method.to_string(), path: path.clone(), authorization: scheme });
    let behaviour = state.behaviour.lock().unwrap().clone();
    if let Some(realm) = &behaviour.bearer_realm
        && !auth.as_deref().is_some_and(|a| a.starts_with("Bearer "))
    {
        let repo = split(&path, "/manifests/").or_else(|| split(&path, "/blobs/")).map(|(r, _)| r).unwrap_or("");
        let challenge = format!(r#"Bearer realm="{realm}",service="x",scope="repository:{repo}:pull""#);
        let mut r = error(StatusCode::UNAUTHORIZED, "UNAUTHORIZED");
        r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_str(&challenge).unwrap());
        return r;
    }
    if path == "/v2/" || path == "/v2" {
        return reply(StatusCode::OK, &[("content-type", "application/json".into())], Reply::Full(Some("{}".into())));
    }
    if method != Method::GET && method != Method::HEAD {
        return error(StatusCode::METHOD_NOT_ALLOWED, "UNSUPPORTED");
    }
    let head = method == Method::HEAD;
    if let Some((repo, reference)) = split(&path, "/manifests/") {
        let found = state.manifests.lock().unwrap().get(&(repo.to_string(), reference.to_string())).cloned();
        let Some((media_type, answer)) = found else { return error(StatusCode::NOT_FOUND, "MANIFEST_UNKNOWN") };
        return manifest(state, head, &media_type, answer);
    }
    if let Some((_, digest)) = split(&path, "/blobs/") {
        if !head && let Some(base) = &behaviour.redirect_blobs {
            return reply(
                StatusCode::TEMPORARY_REDIRECT,
                &[("location", format!("{base}/{digest}"))],
                Reply::Full(None),
            );
        }
        let blob = state.blobs.lock().unwrap().get(digest).cloned();
        let range = range_of(&req);
        return match blob {
            Some(Blob::Bytes(bytes)) => {
                blob_reply(state, head, digest, bytes, range, behaviour.trickle.get(digest), behaviour.rate)
            }
            Some(Blob::Claimed { size, .. }) if head => head_reply(digest, size),
            Some(Blob::Claimed { lie: Lie::NotFound, .. }) => error(StatusCode::NOT_FOUND, "BLOB_UNKNOWN"),
            Some(Blob::Claimed { size, lie: Lie::WrongBytes }) => {
                let wrong = Bytes::from(vec![0x5a; size as usize]);
                blob_reply(state, head, digest, wrong, range, behaviour.trickle.get(digest), behaviour.rate)
            }
            None if head && behaviour.heads_lie => head_reply(digest, 0),
            None => error(StatusCode::NOT_FOUND, "BLOB_UNKNOWN"),
        };
    }
    error(StatusCode::NOT_FOUND, "NAME_UNKNOWN")
}

fn head_reply(digest: &str, size: u64) -> Response<Reply> {
    reply(
        StatusCode::OK,
        &[
            ("content-type", "application/octet-stream".into()),
            ("content-length", size.to_string()),
            ("docker-content-digest", digest.to_string()),
            ("accept-ranges", "bytes".into()),
        ],
        Reply::Full(None),
    )
}

fn blob_reply(
    state: &Arc<State>,
    head: bool,
    digest: &str,
    bytes: Bytes,
    range: Option<(u64, Option<u64>)>,
    trickle: Option<&Duration>,
    rate: Option<u64>,
) -> Response<Reply> {
    let len = bytes.len() as u64;
    if head {
        return head_reply(digest, len);
    }
    let mut headers = vec![
        ("content-type", "application/octet-stream".to_string()),
        ("docker-content-digest", digest.to_string()),
        ("accept-ranges", "bytes".into()),
    ];
    let (status, body) = match range {
        None => (StatusCode::OK, bytes),
        Some((a, _)) if a >= len => {
            let mut r = error(StatusCode::RANGE_NOT_SATISFIABLE, "RANGE_INVALID");
            r.headers_mut().insert(header::CONTENT_RANGE, HeaderValue::from_str(&format!("bytes */{len}")).unwrap());
            return r;
        }
        Some((a, b)) => {
            let end = b.map_or(len - 1, |b| b.min(len - 1));
            headers.push(("content-range", format!("bytes {a}-{end}/{len}")));
            (StatusCode::PARTIAL_CONTENT, bytes.slice(a as usize..=end as usize))
        }
    };
    state.blob_gets.fetch_add(1, Ordering::SeqCst);
    match (trickle, rate) {
        (None, Some(rate)) => {
            headers.push(("content-length", body.len().to_string()));
            let (tx, rx) = mpsc::channel(1);
            let state = state.clone();
            state.pending.fetch_add(body.len() as u64, Ordering::SeqCst);
            tokio::spawn(async move {
                const PIECE: usize = 16 << 10;
                let started = Instant::now();
                let mut sent = 0;
                while sent < body.len() {
                    let piece = body.slice(sent..(sent + PIECE).min(body.len()));
                    let n = piece.len();
                    if tx.send(piece).await.is_err() {
                        break;
                    }
                    sent += n;
                    state.blob_bytes.fetch_add(n as u64, Ordering::SeqCst);
                    state.pending.fetch_sub(n as u64, Ordering::SeqCst);
                    let due = started + Duration::from_secs_f64(sent as f64 / rate as f64);
                    tokio::select! {
                        _ = tokio::time::sleep_until(due.into()) => {}
                        _ = tx.closed() => break,
                    }
                }
                state.pending.fetch_sub((body.len() - sent) as u64, Ordering::SeqCst);
            });
            reply(status, &headers, Reply::Stream(rx))
        }
        (None, None) => {
            state.blob_bytes.fetch_add(body.len() as u64, Ordering::SeqCst);
            reply(status, &headers, Reply::Full(Some(body)))
        }
        (Some(every), _) => {
            headers.push(("content-length", body.len().to_string()));
            let (tx, rx) = mpsc::channel(1);
            let (state, every) = (state.clone(), *every);
            state.trickling.fetch_add(1, Ordering::SeqCst);
            state.trickles.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut sent = 0;
                while sent < body.len() {
                    if tx.send(body.slice(sent..sent + 1)).await.is_err() {
                        break;
                    }
                    sent += 1;
                    state.blob_bytes.fetch_add(1, Ordering::SeqCst);
                    state.trickled.fetch_add(1, Ordering::SeqCst);
                    tokio::select! {
                        _ = tokio::time::sleep(every) => {}
                        _ = tx.closed() => break,
                    }
                }
                if sent < body.len() {
                    state.abandoned.fetch_add(1, Ordering::SeqCst);
                }
                state.trickling.fetch_sub(1, Ordering::SeqCst);
            });
            reply(status, &headers, Reply::Stream(rx))
        }
    }
}

/// The opening of a model manifest, for generated replies.
const MANIFEST_OPENING: &str = concat!(
    r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","#,
    r#""artifactType":"application/vnd.cncf.model.manifest.v1+json","config":{"mediaType":"#,
    r#""application/vnd.cncf.model.config.v1+json","digest":"sha256:"#,
    "0000000000000000000000000000000000000000000000000000000000000000",
    r#"","size":2},"layers":["#
);

fn manifest(state: &Arc<State>, head: bool, media_type: &str, answer: ManifestReply) -> Response<Reply> {
    let mut headers = vec![("content-type", media_type.to_string())];
    let generated = |total: Option<u64>, chunk: usize, every: Duration| {
        let (tx, rx) = mpsc::channel::<Bytes>(4);
        let state = state.clone();
        tokio::spawn(async move {
            let padding = Bytes::from(vec![b' '; chunk.max(1)]);
            let mut left = total.unwrap_or(u64::MAX);
            let mut next = Bytes::from_static(MANIFEST_OPENING.as_bytes());
            while left > 0 {
                let piece = next.slice(..(next.len() as u64).min(left) as usize);
                let n = piece.len() as u64;
                if tx.send(piece).await.is_err() {
                    return;
                }
                state.manifest_bytes.fetch_add(n, Ordering::SeqCst);
                left -= n;
                next = padding.clone();
                if !every.is_zero() {
                    tokio::time::sleep(every).await;
                }
            }
        });
        Reply::Stream(rx)
    };
    match answer {
        ManifestReply::Json(bytes) => {
            headers.push(("docker-content-digest", sha256_digest(&bytes)));
            if head {
                headers.push(("content-length", bytes.len().to_string()));
                return reply(StatusCode::OK, &headers, Reply::Full(None));
            }
            reply(StatusCode::OK, &headers, Reply::Full(Some(bytes)))
        }
        ManifestReply::Sized(n) => {
            headers.push(("content-length", n.to_string()));
            let body = if head { Reply::Full(None) } else { generated(Some(n), 256 << 10, Duration::ZERO) };
            reply(StatusCode::OK, &headers, body)
        }
        ManifestReply::Endless { chunk, every } => {
            let body = if head { Reply::Full(None) } else { generated(None, chunk, every) };
            reply(StatusCode::OK, &headers, body)
        }
    }
}

/// A rustls acceptor for `dir/server.pem` and `dir/server.key` (ring, HTTP/1.1 only).
fn tls_acceptor(dir: &Path) -> tokio_rustls::TlsAcceptor {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(dir.join("server.pem")).unwrap().collect::<Result<_, _>>().unwrap();
    let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

/// A plain TCP listener on 127.0.0.1 that answers anything with a token JSON (`200`,
/// `{"token": …}`) and remembers every connection and request head: a token realm or
/// redirect target that must never be reached.
pub struct Bystander {
    port: u16,
    connections: Arc<AtomicU64>,
    requests: Arc<Mutex<Vec<String>>>,
}

/// The token a [`Bystander`] hands out.
pub const BYSTANDER_TOKEN: &str = "bystander-token";

impl Bystander {
    pub fn start() -> Bystander {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let by = Bystander { port, connections: Arc::default(), requests: Arc::default() };
        let (connections, requests) = (by.connections.clone(), by.requests.clone());
        std::thread::spawn(move || {
            for mut conn in listener.incoming().flatten() {
                connections.fetch_add(1, Ordering::SeqCst);
                let requests = requests.clone();
                std::thread::spawn(move || {
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < (64 << 10) {
                        match conn.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    if head.is_empty() {
                        return;
                    }
                    let text = String::from_utf8_lossy(&head).into_owned();
                    let first = text.lines().next().unwrap_or_default().to_string();
                    let auth = text
                        .lines()
                        .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("authorization")))
                        .map(|(_, v)| format!(" (Authorization: {} …)", v.split_whitespace().next().unwrap_or("")))
                        .unwrap_or_default();
                    requests.lock().unwrap().push(format!("{first}{auth}"));
                    let body = format!(
                        r#"{{"token":"{BYSTANDER_TOKEN}","access_token":"{BYSTANDER_TOKEN}","expires_in":300}}"#
                    );
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = conn.write_all(answer.as_bytes());
                });
            }
        });
        by
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `http://127.0.0.1:PORT` followed by `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.host())
    }

    /// Connections accepted so far (a TLS handshake attempt counts, a request or not).
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::SeqCst)
    }

    /// The request lines received so far (with the scheme of their `Authorization`, if any).
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

/// The memory cgroup `pid` belongs to (relative to its hierarchy's root) and that hierarchy's
/// mount point and version (`true`: v2).
fn memory_cgroup_of(pid: &str) -> Option<(PathBuf, String, bool)> {
    let lines = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    for line in lines.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.split(',').any(|c| c == "memory") {
            let root = PathBuf::from("/sys/fs/cgroup/memory");
            return root.join("memory.limit_in_bytes").exists().then(|| (root, path.to_string(), false));
        }
    }
    let v2 = lines.lines().find_map(|l| l.strip_prefix("0::"))?;
    let root = PathBuf::from("/sys/fs/cgroup");
    let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).ok()?;
    controllers.split_whitespace().any(|c| c == "memory").then(|| (root, v2.to_string(), true))
}

/// A memory cgroup of the test's own with a hard limit, for a process that an attack would
/// make read gigabytes: under v1 a child of this process's own memory group (so the limits
/// above still hold), under v2 a child of the root (a v2 group with processes cannot have
/// children with controllers). Removed on drop, once the processes in it are gone: drop it
/// after what it confines.
pub struct MemoryCage {
    dir: PathBuf,
    v2: bool,
}

impl MemoryCage {
    /// A cage of `limit` bytes. Panics when the node has no memory cgroup to make one in: the
    /// attacks it confines must not run unconfined.
    pub fn new(limit: u64) -> MemoryCage {
        let (root, own, v2) =
            memory_cgroup_of("self").expect("no memory cgroup controller: refusing to run a memory attack unconfined");
        let name = format!("mounthost-hostile-cage-{}-{}", std::process::id(), crate_unique());
        let dir = if v2 { root.join(&name) } else { root.join(own.trim_start_matches('/')).join(&name) };
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("creating the memory cage {}: {e}", dir.display()));
        let cage = MemoryCage { dir, v2 };
        let file = if v2 { "memory.max" } else { "memory.limit_in_bytes" };
        std::fs::write(cage.dir.join(file), limit.to_string())
            .unwrap_or_else(|e| panic!("limiting the memory cage {}: {e}", cage.dir.display()));
        if v2 {
            let _ = std::fs::write(cage.dir.join("memory.swap.max"), "0");
        } else {
            let _ = std::fs::write(cage.dir.join("memory.memsw.limit_in_bytes"), limit.to_string());
        }
        cage
    }

    /// Move `pid` (and, from now on, what it forks) into the cage.
    pub fn add(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("moving {pid} into the memory cage {}: {e}", self.dir.display()));
    }

    /// The processes in the cage now.
    pub fn pids(&self) -> Vec<u32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// The most memory the cage was charged with (page cache included).
    pub fn peak(&self) -> u64 {
        let file = if self.v2 { "memory.peak" } else { "memory.max_usage_in_bytes" };
        std::fs::read_to_string(self.dir.join(file)).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
    }

    /// Processes of the cage the OOM killer killed.
    pub fn oom_kills(&self) -> u64 {
        let file = if self.v2 { "memory.events" } else { "memory.oom_control" };
        std::fs::read_to_string(self.dir.join(file))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill ").and_then(|n| n.trim().parse().ok()))
            .unwrap_or(0)
    }

    /// The highest VmHWM (peak resident set) of the processes in the cage now, in bytes, and
    /// whose it is.
    pub fn max_vm_hwm(&self) -> Option<(u32, u64)> {
        self.pids().into_iter().filter_map(|p| vm_hwm(p).map(|h| (p, h))).max_by_key(|(_, h)| *h)
    }
}

impl Drop for MemoryCage {
    fn drop(&mut self) {
        let until = Instant::now() + Duration::from_secs(5);
        while std::fs::remove_dir(&self.dir).is_err() && self.dir.exists() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A number unique in this process.
fn crate_unique() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::SeqCst)
}

/// The peak resident set (`VmHWM`) of `pid`, in bytes.
pub fn vm_hwm(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 =
        status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb << 10)
}

/// The set of the sha256s (hex) of `model`'s files.
pub fn file_hashes(model: &PushedModel) -> HashSet<String> {
    model.files.iter().map(|(_, h, _)| h.clone()).collect()
}

/// `len` pseudo-random bytes, the same for the same `seed`.
pub fn noise(seed: &str, len: usize) -> Vec<u8> {
    use sha2::Digest as _;
    let mut out = Vec::with_capacity(len + 32);
    let mut block = sha2::Sha256::digest(seed.as_bytes());
    while out.len() < len {
        block = sha2::Sha256::digest(block);
        out.extend_from_slice(&block);
    }
    out.truncate(len);
    out
}
