//! HTTP calls of controller plans (`http` steps): the controller executes them itself, with
//! no privilege. Each URL is tried in order (a plan lists every filer of a volume); a
//! connection failure moves on to the next, an answer ends the step.
//!
//! Every URL is parsed by [`crate::plan::url::parse`], the parser the policy approved it
//! with, and the request URI is built from that [`Target`] alone (explicit port included), so
//! the client connects to exactly the host and port the policy judged.

use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::plan::url::{Scheme, Target, parse as parse_url};

/// Longest time one attempt may take.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// How much of an error response body is kept for the message.
const BODY_EXCERPT: usize = 512;

/// One HTTP call, secrets already filled in.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: String,
    pub urls: Vec<String>,
    pub headers: Vec<(String, String)>,
    pub body: String,
    pub ok_status: Vec<u16>,
}

/// How a call failed.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// No URL could be reached.
    #[error("{method} failed on every URL: {}", attempts.join("; "))]
    Unreachable { method: String, attempts: Vec<String> },
    /// The server answered with a status the plan does not accept.
    #[error("{method} {url} answered {status} (accepted: {ok:?}): {body}")]
    Status { method: String, url: String, status: u16, ok: Vec<u16>, body: String },
    /// The call itself is malformed.
    #[error("{0}")]
    Invalid(String),
}

/// The HTTP client (plain HTTP; TLS is not offered yet).
#[derive(Clone)]
pub struct HttpClient {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Default for HttpClient {
    fn default() -> Self {
        HttpClient { client: Client::builder(TokioExecutor::new()).build_http() }
    }
}

impl HttpClient {
    /// Run one call; returns the status that ended it.
    pub async fn call(&self, call: &Call) -> Result<u16, HttpError> {
        let method = hyper::Method::from_bytes(call.method.as_bytes())
            .map_err(|_| HttpError::Invalid(format!("invalid HTTP method {:?}", call.method)))?;
        let mut attempts = Vec::new();
        for url in &call.urls {
            let target = parse_url(url).map_err(|e| HttpError::Invalid(format!("invalid URL: {e}")))?;
            if target.scheme() != Scheme::Http {
                attempts.push(format!("{url}: only http:// URLs are supported by this controller version"));
                continue;
            }
            let req = request(&method, &target, &call.headers, &call.body)?;
            let resp = match tokio::time::timeout(ATTEMPT_TIMEOUT, self.client.request(req)).await {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => {
                    attempts.push(format!("{url}: {e}"));
                    continue;
                }
                Err(_) => {
                    attempts.push(format!("{url}: no answer within {ATTEMPT_TIMEOUT:?}"));
                    continue;
                }
            };
            let status = resp.status().as_u16();
            if call.ok_status.contains(&status) {
                return Ok(status);
            }
            let body = match tokio::time::timeout(ATTEMPT_TIMEOUT, resp.into_body().collect()).await {
                Ok(Ok(b)) => String::from_utf8_lossy(&b.to_bytes()).chars().take(BODY_EXCERPT).collect(),
                _ => String::new(),
            };
            return Err(HttpError::Status {
                method: call.method.clone(),
                url: url.clone(),
                status,
                ok: call.ok_status.clone(),
                body: body.trim().to_string(),
            });
        }
        Err(HttpError::Unreachable { method: call.method.clone(), attempts })
    }
}

/// What a read ([`HttpClient::read`]) got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    /// The status, 0 when no URL answered.
    pub status: u16,
    /// The body's first [`MAX_READ`] bytes.
    pub body: Vec<u8>,
    /// The body was longer.
    pub truncated: bool,
}

/// The most of a body a read keeps (a `lookup`'s answer).
pub const MAX_READ: usize = 64 << 10;

impl HttpClient {
    /// A read (`GET` or `HEAD`) of the first URL that answers, whatever its status; its first
    /// [`MAX_READ`] bytes. Status 0 (and what each URL said, in the log) when none answered.
    pub async fn read(&self, method: &str, urls: &[String], headers: &[(String, String)]) -> Result<Read, HttpError> {
        let method = hyper::Method::from_bytes(method.as_bytes())
            .map_err(|_| HttpError::Invalid(format!("invalid HTTP method {method:?}")))?;
        for url in urls {
            let target = parse_url(url).map_err(|e| HttpError::Invalid(format!("invalid URL: {e}")))?;
            if target.scheme() != Scheme::Http {
                tracing::debug!(%url, "a lookup of an https:// URL: only http:// is supported by this version");
                continue;
            }
            let req = request(&method, &target, headers, "")?;
            let resp = match tokio::time::timeout(ATTEMPT_TIMEOUT, self.client.request(req)).await {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => {
                    tracing::debug!(%url, error = %e, "a lookup's URL did not answer");
                    continue;
                }
                Err(_) => {
                    tracing::debug!(%url, "a lookup's URL did not answer in time");
                    continue;
                }
            };
            let status = resp.status().as_u16();
            let mut body = resp.into_body();
            let mut kept = Vec::new();
            let mut truncated = false;
            // The whole body (or its first MAX_READ bytes), or nothing: a body cut off by an
            // error or the timeout is no answer, never a short one handed over as complete.
            let reading = async {
                while let Some(frame) = body.frame().await {
                    let Ok(data) = frame.map(|f| f.into_data().unwrap_or_default()) else { return false };
                    let room = MAX_READ - kept.len();
                    if data.len() > room {
                        kept.extend_from_slice(&data[..room]);
                        truncated = true;
                        return true;
                    }
                    kept.extend_from_slice(&data);
                }
                true
            };
            if !matches!(tokio::time::timeout(ATTEMPT_TIMEOUT, reading).await, Ok(true)) {
                tracing::debug!(%url, status, "a lookup's body did not arrive whole");
                continue;
            }
            return Ok(Read { status, body: kept, truncated });
        }
        Ok(Read { status: 0, body: Vec::new(), truncated: false })
    }
}

/// The request for one target. Its URI comes from the target alone, with the port explicit:
/// hyper's connector takes the address to connect to from exactly this URI's host and port.
pub(crate) fn request(
    method: &hyper::Method,
    target: &Target,
    headers: &[(String, String)],
    body: &str,
) -> Result<hyper::Request<Full<Bytes>>, HttpError> {
    let mut req = hyper::Request::builder().method(method.clone()).uri(target.uri());
    for (k, v) in headers {
        req = req.header(k, v);
    }
    req.body(Full::new(Bytes::from(body.to_owned())))
        .map_err(|e| HttpError::Invalid(format!("building the request to {target}: {e}")))
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A server answering each connection with `answer` as it is, then closing.
    async fn serving(answer: &'static str) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf).await;
                let _ = conn.write_all(answer.as_bytes()).await;
            }
        });
        format!("http://{at}/record")
    }

    /// A body cut off before its Content-Length is no answer (status 0, as when no URL
    /// answers); a whole one is handed over with its status; the next URL is tried after a cut.
    #[tokio::test]
    async fn a_lookup_body_cut_off_is_no_answer() {
        let client = HttpClient::default();
        let cut = serving("HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"capacityBytes\":1").await;
        let whole = serving("HTTP/1.1 200 OK\r\ncontent-length: 20\r\n\r\n{\"capacityBytes\":12}").await;
        let read = client.read("GET", std::slice::from_ref(&cut), &[]).await.unwrap();
        assert_eq!((read.status, read.body.len(), read.truncated), (0, 0, false));
        let read = client.read("GET", &[cut, whole], &[]).await.unwrap();
        assert_eq!(
            (read.status, read.body.as_slice(), read.truncated),
            (200, b"{\"capacityBytes\":12}".as_slice(), false)
        );
    }
}
