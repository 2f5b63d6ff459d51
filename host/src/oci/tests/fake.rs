//! A small in-process registry over plain HTTP on 127.0.0.1, enough for the puller: `GET /v2/`,
//! manifests by tag or digest, blobs with `Range` (and `HEAD`). Knobs make it fail the ways real
//! ones do: cut connections after a byte budget, refuse connections, ignore `Range`, serve other
//! bytes, redirect blobs to "storage" (`/storage/<digest>?…`, served here too) or fail there.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use sha2::Digest as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
pub struct State {
    pub blobs: Mutex<HashMap<String, Vec<u8>>>,
    pub manifests: Mutex<HashMap<String, (String, Vec<u8>)>>,
    /// Body bytes left before every connection is cut (u64::MAX: no limit).
    pub budget: AtomicU64,
    /// Close connections as soon as they are accepted.
    pub refuse: AtomicBool,
    /// Answer ranged requests with the whole blob (200).
    pub ignore_range: AtomicBool,
    /// Serve blobs with their first byte flipped.
    pub corrupt: AtomicBool,
    /// Two-faced, once: answer the next blob request whose range starts at 0 with the whole
    /// blob (200), pausing this many milliseconds at byte `.0` and sending every byte after it
    /// flipped; other requests get the true bytes.
    pub whole_then_other: Mutex<Option<(usize, u64)>>,
    /// Body bytes sent for blobs.
    pub served: AtomicU64,
    /// Blob requests received.
    pub blob_requests: AtomicUsize,
    /// Blob bodies being sent now, and the most at once.
    pub blobs_sending: AtomicUsize,
    pub blobs_sending_max: AtomicUsize,
    /// Pause between two 64 KiB pieces of a blob (milliseconds).
    pub delay_ms: AtomicU64,
    /// Pause before the headers of a blob's answer (milliseconds): a mirror fetching upstream.
    pub head_delay_ms: AtomicU64,
    /// Requests received in proxy form (absolute URL).
    pub proxied: AtomicUsize,
    /// Connections accepted.
    pub connections: AtomicUsize,
    /// Require `Authorization: Basic base64(user:pass)`.
    pub basic: Mutex<Option<String>>,
    /// `HEAD` requests for blobs received.
    pub heads: AtomicUsize,
    /// Blob `GET`s of at most 64 bytes (`Range`) served past authentication: the proofs of
    /// `authorize`; and all of them, refused ones included.
    pub probes: AtomicUsize,
    pub probes_asked: AtomicUsize,
    /// Answer blob GETs with `307`, `Location` this with `{digest}` replaced.
    pub redirect: Mutex<Option<String>>,
    /// `/storage/…` answers 500 with an S3-like XML body that echoes a signature.
    pub storage_fails: AtomicBool,
    /// Answer `POST /v2/<repo>/blobs/uploads/` with `202`, `Location` this (an upload there,
    /// below `/storage/`, then finds nothing: 404).
    pub upload_location: Mutex<Option<String>>,
}

pub struct Fake {
    pub state: Arc<State>,
    pub host: String,
}

impl Fake {
    pub async fn start() -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let host = listener.local_addr().unwrap().to_string();
        let state = Arc::new(State { budget: AtomicU64::new(u64::MAX), ..Default::default() });
        let s = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else { return };
                s.connections.fetch_add(1, Ordering::SeqCst);
                if s.refuse.load(Ordering::SeqCst) {
                    drop(conn);
                    continue;
                }
                tokio::spawn(serve(conn, s.clone()));
            }
        });
        Fake { state, host }
    }

    /// Store a blob; returns its digest.
    pub fn blob(&self, bytes: Vec<u8>) -> String {
        let digest = format!("sha256:{}", hex::encode(sha2::Sha256::digest(&bytes)));
        self.state.blobs.lock().unwrap().insert(digest.clone(), bytes);
        digest
    }

    /// Store a manifest under `tag` and its digest; returns the digest.
    pub fn manifest(&self, tag: &str, media_type: &str, json: &str) -> String {
        let digest = format!("sha256:{}", hex::encode(sha2::Sha256::digest(json.as_bytes())));
        let mut m = self.state.manifests.lock().unwrap();
        m.insert(tag.to_string(), (media_type.to_string(), json.as_bytes().to_vec()));
        m.insert(digest.clone(), (media_type.to_string(), json.as_bytes().to_vec()));
        digest
    }
}

/// A `Range` of at most 64 bytes.
fn small_range(headers: &HashMap<String, String>) -> bool {
    headers
        .get("range")
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split_once('-'))
        .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)))
        .is_some_and(|(a, b)| b + 1 - a <= 64)
}

async fn serve(mut conn: TcpStream, s: Arc<State>) {
    let mut buf = Vec::new();
    loop {
        // Read one request head.
        let head = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..i]).into_owned();
                buf.drain(..i + 4);
                break head;
            }
            let mut chunk = [0u8; 4096];
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let mut lines = head.lines();
        let first = lines.next().unwrap_or_default().to_string();
        let headers: HashMap<String, String> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let mut path = first.split_whitespace().nth(1).unwrap_or("/").to_string();
        // A request through this server as an HTTP proxy names the origin: `GET http://host/v2/`.
        if let Some(rest) = path.strip_prefix("http://") {
            s.proxied.fetch_add(1, Ordering::SeqCst);
            path = rest.find('/').map(|i| rest[i..].to_string()).unwrap_or_else(|| "/".into());
        }
        let path = path.split('?').next().unwrap_or("").to_string();
        let head_only = first.starts_with("HEAD ");
        if head_only && path.contains("/blobs/") {
            s.heads.fetch_add(1, Ordering::SeqCst);
        }
        if let Some(digest) = path.strip_prefix("/storage/") {
            // An upload's body: read and dropped, so the answer below reaches the client.
            let len: usize = headers.get("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
            while buf.len() < len {
                let mut chunk = [0u8; 4096];
                match conn.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            buf.drain(..len);
            // Storage behind a presigned URL: no registry auth, its own errors.
            if s.storage_fails.load(Ordering::SeqCst) {
                let body = "<?xml version=\"1.0\"?><Error><Code>InternalError</Code><Message>try again</Message>\
                    <SignatureProvided>STORAGE-SIGNATURE-SECRET</SignatureProvided></Error>";
                let head = format!(
                    "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                if conn.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                continue;
            }
            let found = s.blobs.lock().unwrap().get(digest).cloned();
            let (status, body) = match found {
                Some(b) => ("200 OK", b),
                None => ("404 Not Found", Vec::new()),
            };
            let head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\n\r\n", body.len());
            if conn.write_all(head.as_bytes()).await.is_err() || conn.write_all(&body).await.is_err() {
                return;
            }
            s.served.fetch_add(body.len() as u64, Ordering::SeqCst);
            continue;
        }
        if first.starts_with("GET ") && path.contains("/blobs/") && small_range(&headers) {
            s.probes_asked.fetch_add(1, Ordering::SeqCst);
        }
        let wanted = s.basic.lock().unwrap().clone();
        if let Some(want) = wanted
            && headers.get("authorization") != Some(&format!("Basic {want}"))
        {
            let body = br#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#;
            let head = format!(
                "HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nWWW-Authenticate: Basic realm=\"fake\"\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            let body: &[u8] = if head_only { b"" } else { body };
            if conn.write_all(head.as_bytes()).await.is_err() || conn.write_all(body).await.is_err() {
                return;
            }
            continue;
        }
        if first.starts_with("GET ") && path.contains("/blobs/") && small_range(&headers) {
            s.probes.fetch_add(1, Ordering::SeqCst);
        }
        let upload = s.upload_location.lock().unwrap().clone();
        if let Some(location) = upload.filter(|_| first.starts_with("POST ") && path.ends_with("/blobs/uploads/")) {
            let head = format!("HTTP/1.1 202 Accepted\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n");
            if conn.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            continue;
        }
        if path == "/v2/" {
            let head =
                "HTTP/1.1 200 OK\r\nDocker-Distribution-API-Version: registry/2.0\r\nContent-Length: 2\r\n\r\n{}";
            if conn.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            continue;
        }
        let parts: Vec<&str> = path.trim_start_matches("/v2/").rsplitn(3, '/').collect();
        let (kind, key) = match parts.as_slice() {
            [key, kind, _repo] => (*kind, *key),
            _ => ("", ""),
        };
        let found = match kind {
            "manifests" => s.manifests.lock().unwrap().get(key).cloned(),
            "blobs" => s.blobs.lock().unwrap().get(key).cloned().map(|b| ("application/octet-stream".to_string(), b)),
            _ => None,
        };
        if kind == "blobs" && head_only {
            let head = match &found {
                Some((media_type, b)) => {
                    format!("HTTP/1.1 200 OK\r\nContent-Type: {media_type}\r\nContent-Length: {}\r\n\r\n", b.len())
                }
                None => "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_string(),
            };
            if conn.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            continue;
        }
        let location = s.redirect.lock().unwrap().clone();
        if let (Some(location), "blobs", true) = (location, kind, found.is_some()) {
            let head = format!(
                "HTTP/1.1 307 Temporary Redirect\r\nLocation: {}\r\nContent-Length: 0\r\n\r\n",
                location.replace("{digest}", key)
            );
            if conn.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            continue;
        }
        let Some((media_type, mut body)) = found else {
            let code = if kind == "blobs" { "BLOB_UNKNOWN" } else { "MANIFEST_UNKNOWN" };
            let body = format!(r#"{{"errors":[{{"code":"{code}","message":"unknown"}}]}}"#);
            let head = format!(
                "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            if conn.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            continue;
        };
        if kind == "blobs" {
            s.blob_requests.fetch_add(1, Ordering::SeqCst);
            if s.corrupt.load(Ordering::SeqCst) && !body.is_empty() {
                body[0] ^= 0xff;
            }
        }
        let two_faced = if kind == "blobs"
            && headers.get("range").is_some_and(|r| r.starts_with("bytes=0-"))
            && let Some((at, pause)) = s.whole_then_other.lock().unwrap().take()
        {
            for b in &mut body[at..] {
                *b ^= 0xff;
            }
            Some((at, pause))
        } else {
            None
        };
        let total = body.len() as u64;
        let range = headers
            .get("range")
            .filter(|_| kind == "blobs" && !s.ignore_range.load(Ordering::SeqCst) && two_faced.is_none())
            .and_then(|r| r.strip_prefix("bytes="))
            .and_then(|r| r.split_once('-'))
            .map(|(a, b)| {
                let a: u64 = a.parse().unwrap_or(0);
                let b: u64 = if b.is_empty() { total.saturating_sub(1) } else { b.parse().unwrap_or(0).min(total - 1) };
                (a, b)
            });
        let (status, slice, extra) = match range {
            Some((a, _)) if a >= total => {
                let head = format!(
                    "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{total}\r\nContent-Length: 0\r\n\r\n"
                );
                if conn.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                continue;
            }
            Some((a, b)) => (
                "206 Partial Content",
                &body[a as usize..=b as usize],
                format!("Content-Range: bytes {a}-{b}/{total}\r\n"),
            ),
            None => ("200 OK", &body[..], String::new()),
        };
        let digest_header = if kind == "manifests" {
            format!("Docker-Content-Digest: sha256:{}\r\n", hex::encode(sha2::Sha256::digest(&body)))
        } else {
            String::new()
        };
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Type: {media_type}\r\nContent-Length: {}\r\n{extra}{digest_header}\r\n",
            slice.len()
        );
        let head_delay = s.head_delay_ms.load(Ordering::SeqCst);
        if head_delay > 0 && kind == "blobs" {
            tokio::time::sleep(std::time::Duration::from_millis(head_delay)).await;
        }
        if conn.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let _sending = (kind == "blobs").then(|| Sending::start(&s));
        for (i, piece) in slice.chunks(64 << 10).enumerate() {
            if let Some((at, pause)) = two_faced
                && i * (64 << 10) == at
            {
                tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
            }
            let n = if kind == "blobs" {
                let left = s.budget.load(Ordering::SeqCst);
                let n = (piece.len() as u64).min(left);
                if left != u64::MAX {
                    s.budget.fetch_sub(n, Ordering::SeqCst);
                }
                n as usize
            } else {
                piece.len()
            };
            let delay = s.delay_ms.load(Ordering::SeqCst);
            if delay > 0 && kind == "blobs" {
                tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
            }
            if conn.write_all(&piece[..n]).await.is_err() {
                return;
            }
            if kind == "blobs" {
                s.served.fetch_add(n as u64, Ordering::SeqCst);
            }
            if n < piece.len() {
                // Out of budget: cut the connection mid-body.
                let _ = conn.shutdown().await;
                return;
            }
        }
    }
}

/// A blob body being sent: counted in `blobs_sending` until dropped.
struct Sending(Arc<State>);

impl Sending {
    fn start(s: &Arc<State>) -> Sending {
        let now = s.blobs_sending.fetch_add(1, Ordering::SeqCst) + 1;
        s.blobs_sending_max.fetch_max(now, Ordering::SeqCst);
        Sending(s.clone())
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        self.0.blobs_sending.fetch_sub(1, Ordering::SeqCst);
    }
}
