//! gRPC over unix sockets: a client channel to a socket path, and `unix://` endpoint parsing.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use h2::client::{ResponseFuture, SendRequest};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tokio::net::UnixStream;

/// What a call through a [`UnixChannel`] fails with.
pub type ChannelError = Box<dyn std::error::Error + Send + Sync>;

/// The receive windows a channel offers its server, per call and in all, the largest header
/// list it takes, and how many calls it opens before the server's settings arrive: hyper's
/// client defaults.
const STREAM_WINDOW: u32 = 2 << 20;
const CONNECTION_WINDOW: u32 = 5 << 20;
const MAX_HEADER_LIST: u32 = 16 << 10;
const MAX_SEND_STREAMS: usize = 100;

/// A gRPC channel to the server on one unix socket: a single HTTP/2 connection, opened at the
/// first call and again at the first call after it closed (the server restarted), so a client
/// outlives its server's restarts.
///
/// A call drives the HTTP/2 stream itself, in the caller's task: it queues the request's
/// headers and then its body on the connection, usually before the connection's task writes
/// either, so the two go out in one write and reach the server together. (hyper's client
/// connection sends the body from a task of its own, which waits until the connection's task
/// has opened the stream: two writes and a task hand-off per request. tonic's `Channel` adds a
/// buffer task on top.) Request bodies are queued as they come, before the answer is awaited: every
/// call this project makes sends one message.
#[derive(Clone)]
pub struct UnixChannel {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    /// The open connection and which connection of this channel it is (1, 2, ...).
    connection: tokio::sync::Mutex<(u64, Option<Connection>)>,
}

struct Connection {
    sender: SendRequest<Bytes>,
    /// Set when the connection's task ended (either side closed it) or was dropped.
    closed: Arc<AtomicBool>,
}

/// Sets its flag when dropped: when the connection's task ends, or is dropped unfinished.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// A channel to the gRPC server on the unix socket `path`; connects at the first call.
pub fn channel(path: &Path) -> UnixChannel {
    UnixChannel { inner: Arc::new(Inner { path: path.to_path_buf(), connection: Default::default() }) }
}

impl Inner {
    /// The open connection's sender and its number, connecting when there is none, it closed,
    /// or it is connection `stale` (which a call just found closed, though its task may not
    /// have ended yet). Failing to connect is a [`tonic::ConnectError`], which tonic reports as
    /// UNAVAILABLE.
    async fn sender(&self, stale: Option<u64>) -> Result<(u64, SendRequest<Bytes>), ChannelError> {
        let mut held = self.connection.lock().await;
        let (number, open) = &mut *held;
        if let Some(c) = open.as_ref().filter(|c| !c.closed.load(Ordering::Acquire))
            && stale != Some(*number)
        {
            return Ok((*number, c.sender.clone()));
        }
        *open = None;
        let connect_error = |e: &dyn std::fmt::Display| {
            tonic::ConnectError(format!("connecting to {}: {e}", self.path.display()).into())
        };
        let io = UnixStream::connect(&self.path).await.map_err(|e| connect_error(&e))?;
        let (sender, connection) = h2::client::Builder::new()
            .enable_push(false)
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_header_list_size(MAX_HEADER_LIST)
            .initial_max_send_streams(MAX_SEND_STREAMS)
            .handshake(io)
            .await
            .map_err(|e| connect_error(&e))?;
        let closed = Arc::new(AtomicBool::new(false));
        let ended = SetOnDrop(closed.clone());
        // Drives the connection until either side closes it.
        tokio::spawn(async move {
            let _ended = ended;
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "gRPC connection over a unix socket ended");
            }
        });
        held.0 += 1;
        held.1 = Some(Connection { sender: sender.clone(), closed });
        Ok((held.0, sender))
    }
}

/// Open a stream for a request with `head` on the connection of `sender`, once it takes one.
/// An error here means nothing was sent; [`connection_gone`] says whether it was the
/// connection's.
async fn open(
    sender: SendRequest<Bytes>,
    head: &http::request::Parts,
) -> Result<(ResponseFuture, h2::SendStream<Bytes>), h2::Error> {
    let mut sender = sender.ready().await?;
    let mut request = http::Request::new(());
    *request.method_mut() = head.method.clone();
    *request.uri_mut() = head.uri.clone();
    *request.headers_mut() = head.headers.clone();
    sender.send_request(request, false)
}

/// The connection failed (closed, reset, or told to go away), as opposed to h2 refusing the
/// request itself (a header HTTP/2 does not allow), which a new connection would refuse too.
fn connection_gone(e: &h2::Error) -> bool {
    e.is_io() || e.is_go_away()
}

/// Queue `body` on `stream`, frame by frame. A DATA frame is held until the body's next frame
/// is ready (or the body waits), so the last one carries the end of the stream (no empty frame
/// after it). On an error the caller resets the stream.
async fn send_body(mut body: tonic::body::Body, stream: &mut h2::SendStream<Bytes>) -> Result<(), ChannelError> {
    let mut held: Option<Bytes> = None;
    loop {
        let next = match std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx))).await {
            Poll::Ready(next) => next,
            Poll::Pending => {
                if let Some(previous) = held.take() {
                    stream.send_data(previous, false)?;
                }
                body.frame().await
            }
        };
        match next {
            None => return Ok(stream.send_data(held.unwrap_or_default(), true)?),
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    if let Some(previous) = held.replace(data) {
                        stream.send_data(previous, false)?;
                    }
                }
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        if let Some(previous) = held.take() {
                            stream.send_data(previous, false)?;
                        }
                        return Ok(stream.send_trailers(trailers)?);
                    }
                }
            },
        }
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for UnixChannel {
    type Response = http::Response<ResponseBody>;
    type Error = ChannelError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Connecting happens in the call: a channel is always ready to take one.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let inner = self.inner.clone();
        Box::pin(async move {
            let (mut head, body) = req.into_parts();
            // A client made with `new` names only the path; HTTP/2 needs a scheme and an
            // authority, and a server on a unix socket has no host name: `localhost`.
            if head.uri.authority().is_none() {
                let mut parts = std::mem::take(&mut head.uri).into_parts();
                parts.scheme = Some(http::uri::Scheme::HTTP);
                parts.authority = Some(http::uri::Authority::from_static("localhost"));
                head.uri = http::Uri::from_parts(parts)?;
            }
            let (number, sender) = inner.sender(None).await?;
            let (answer, mut stream) = match open(sender, &head).await {
                Ok(opened) => opened,
                // The connection closed before the request went out (the server restarted
                // since the last call, and the connection's task had not ended yet): nothing
                // was sent, so it goes once more on a new connection.
                Err(e) if connection_gone(&e) => {
                    let (_, fresh) = inner.sender(Some(number)).await?;
                    open(fresh, &head).await?
                }
                Err(e) => return Err(e.into()),
            };
            if let Err(e) = send_body(body, &mut stream).await {
                // The stream ends here (a no-op when the server reset it already). The server
                // may have answered first, or said why it reset the stream: either says more
                // than the failed send.
                stream.send_reset(h2::Reason::CANCEL);
                return match answer.await {
                    Ok(answered) => Ok(answered.map(ResponseBody)),
                    Err(server) if server.is_remote() || server.is_io() => Err(server.into()),
                    Err(_) => Err(e),
                };
            }
            Ok(answer.await?.map(ResponseBody))
        })
    }
}

/// An answer's body: its DATA frames, each handed back to the flow-control window as it is
/// read, then its trailers (where gRPC puts the status). A NO_ERROR from the server (a reset or
/// a GOAWAY) ends it cleanly: a reset with NO_ERROR means the server needs no more of the
/// request (HTTP/2, RFC 9113 section 8.1).
pub struct ResponseBody(h2::RecvStream);

/// `polled` with a NO_ERROR from the server (a reset or a GOAWAY) read as the end of the body.
fn ended_cleanly<T>(polled: Option<Result<T, h2::Error>>) -> Option<Result<T, h2::Error>> {
    match polled {
        Some(Err(e)) if e.is_remote() && e.reason() == Some(h2::Reason::NO_ERROR) => None,
        other => other,
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let recv = &mut self.0;
        match ended_cleanly(ready!(recv.poll_data(cx))) {
            Some(Ok(data)) => {
                // Fails only when the stream is gone, which the next poll reports.
                let _ = recv.flow_control().release_capacity(data.len());
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            Some(Err(e)) => return Poll::Ready(Some(Err(e))),
            None => {}
        }
        Poll::Ready(ended_cleanly(ready!(recv.poll_trailers(cx)).transpose()).map(|t| t.map(Frame::trailers)))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }
}

/// One unary gRPC call on the connected unix socket `io`: `method` (`/<package>.<service>/<method>`)
/// with `message`, a request message already encoded (protobuf) by whoever planned it, all of it
/// within `timeout`. The answer's messages are not read; its `grpc-status` decides: 0 is `Ok`,
/// anything else an error with the server's `grpc-message`. (A plan's `socket-call` step: the
/// host tells a running FUSE program something, such as `weed mount` its new quota.)
pub async fn unary_on(
    io: std::os::unix::net::UnixStream,
    method: &str,
    message: &[u8],
    timeout: std::time::Duration,
) -> Result<(), String> {
    let call = async {
        io.set_nonblocking(true).map_err(|e| e.to_string())?;
        let io = UnixStream::from_std(io).map_err(|e| e.to_string())?;
        let (sender, connection) = h2::client::handshake(io).await.map_err(|e| format!("HTTP/2 handshake: {e}"))?;
        let connection = tokio::spawn(async move {
            let _ = connection.await;
        });
        let mut sender = sender.ready().await.map_err(|e| e.to_string())?;
        let request = http::Request::builder()
            .method(http::Method::POST)
            .uri(format!("http://localhost{method}"))
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers")
            .body(())
            .map_err(|e| format!("the method {method:?}: {e}"))?;
        let (answer, mut stream) = sender.send_request(request, false).map_err(|e| e.to_string())?;
        let length = u32::try_from(message.len()).map_err(|_| "the message is too long".to_string())?;
        // gRPC's length-prefixed message: not compressed, its length, its bytes.
        let mut framed = Vec::with_capacity(5 + message.len());
        framed.push(0);
        framed.extend_from_slice(&length.to_be_bytes());
        framed.extend_from_slice(message);
        stream.send_data(Bytes::from(framed), true).map_err(|e| e.to_string())?;
        let (head, mut body) = answer.await.map_err(|e| e.to_string())?.into_parts();
        if head.status != http::StatusCode::OK {
            return Err(format!("the server answered HTTP {}", head.status));
        }
        let status_of = |h: &http::HeaderMap| {
            h.get("grpc-status").map(|s| {
                let message = h.get("grpc-message").and_then(|m| m.to_str().ok()).unwrap_or_default();
                (s.to_str().unwrap_or("?").to_string(), message.to_string())
            })
        };
        // A trailers-only answer carries the status in its headers.
        let status = match status_of(&head.headers) {
            Some(s) => Some(s),
            None => {
                while let Some(data) = body.data().await {
                    let data = data.map_err(|e| e.to_string())?;
                    let _ = body.flow_control().release_capacity(data.len());
                }
                body.trailers().await.map_err(|e| e.to_string())?.as_ref().and_then(status_of)
            }
        };
        connection.abort();
        match status {
            Some((code, _)) if code == "0" => Ok(()),
            Some((code, message)) => Err(format!("gRPC status {code}: {message}")),
            None => Err("the answer has no grpc-status".into()),
        }
    };
    match tokio::time::timeout(timeout, call).await {
        Ok(result) => result.map_err(|e| format!("{method}: {e}")),
        Err(_) => Err(format!("{method}: no answer within {timeout:?}")),
    }
}

/// `unix:///csi/csi.sock` or a plain absolute path → the path.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, String> {
    let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    let path = PathBuf::from(path);
    if path.is_absolute() || endpoint.strip_prefix("unix://").is_none() {
        Ok(path)
    } else {
        Err(format!("{endpoint:?}: expected unix:///absolute/path.sock"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::csi::{self, identity_client::IdentityClient};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_h2_refuses_fails_alone_and_the_connection_stays() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("csi.sock");
        let host = crate::front::Host::new(channel(&dir.path().join("host.sock")));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = sock.clone();
        let server = tokio::spawn(async move {
            crate::front::serve(crate::front::Mode::Node, &served, Some(host), None, async move {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        let channel = channel(&sock);
        let mut client = IdentityClient::new(channel.clone());
        // No host daemon runs: the front answers Probe with FAILED_PRECONDITION (still an answer).
        let answers = |r: &Result<tonic::Response<csi::ProbeResponse>, tonic::Status>| match r {
            Ok(_) => true,
            Err(e) => e.code() == tonic::Code::FailedPrecondition,
        };
        let mut answered = false;
        for _ in 0..200 {
            if answers(&client.probe(csi::ProbeRequest {}).await) {
                answered = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(answered, "the front never answered");
        let first = channel.inner.connection.lock().await.0;

        // HTTP/2 has no `connection` header: h2 refuses the request before sending anything.
        let mut refused = tonic::Request::new(csi::ProbeRequest {});
        refused.metadata_mut().insert("connection", "close".parse().unwrap());
        let e = client.probe(refused).await.unwrap_err();
        assert!(e.message().to_lowercase().contains("header"), "{e:?}");
        // Not the connection's fault: the next call goes out on the same one.
        let next = client.probe(csi::ProbeRequest {}).await;
        assert!(answers(&next), "{next:?}");
        assert_eq!(channel.inner.connection.lock().await.0, first, "a refused request opened a new connection");

        stop.send(()).unwrap();
        server.await.unwrap();
    }
}
