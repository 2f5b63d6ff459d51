//! gRPC over unix sockets: a client channel to a socket path, and `unix://` endpoint parsing.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixStream;

/// What a call through a [`UnixChannel`] fails with.
pub type ChannelError = Box<dyn std::error::Error + Send + Sync>;

/// A gRPC channel to the server on one unix socket: a single HTTP/2 connection, opened at the
/// first call and again at the first call after it closed (the server restarted), so a client
/// outlives its server's restarts. A call goes straight to the connection's sender: unlike
/// tonic's `Channel`, no buffer task sits between the caller and the connection (one task
/// hand-off less each way).
#[derive(Clone)]
pub struct UnixChannel {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    /// The connection's sender and which connection of this channel it is (1, 2, ...).
    sender: tokio::sync::Mutex<(u64, Option<SendRequest<tonic::body::Body>>)>,
}

/// A channel to the gRPC server on the unix socket `path`; connects at the first call.
pub fn channel(path: &Path) -> UnixChannel {
    UnixChannel { inner: Arc::new(Inner { path: path.to_path_buf(), sender: Default::default() }) }
}

impl Inner {
    /// The open connection's sender and its number, connecting when there is none, it closed,
    /// or it is connection `stale` (which a call just found closed, though its sender may not
    /// say so yet). Failing to connect is a [`tonic::ConnectError`], which tonic reports as
    /// UNAVAILABLE.
    async fn sender(&self, stale: Option<u64>) -> Result<(u64, SendRequest<tonic::body::Body>), ChannelError> {
        let mut held = self.sender.lock().await;
        let (number, sender) = &mut *held;
        if let Some(s) = sender.as_ref().filter(|s| !s.is_closed())
            && stale != Some(*number)
        {
            return Ok((*number, s.clone()));
        }
        *sender = None;
        let connect_error = |e: &dyn std::fmt::Display| {
            tonic::ConnectError(format!("connecting to {}: {e}", self.path.display()).into())
        };
        let io = TokioIo::new(UnixStream::connect(&self.path).await.map_err(|e| connect_error(&e))?);
        let (sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await.map_err(|e| connect_error(&e))?;
        // Drives the connection until either side closes it; the sender then reports closed.
        tokio::spawn(connection);
        held.0 += 1;
        held.1 = Some(sender.clone());
        Ok((held.0, sender))
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for UnixChannel {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = ChannelError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Connecting happens in the call: a channel is always ready to take one.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: http::Request<tonic::body::Body>) -> Self::Future {
        let inner = self.inner.clone();
        Box::pin(async move {
            // A client made with `new` names only the path; HTTP/2 needs a scheme and an
            // authority, and a server on a unix socket has no host name: `localhost`.
            if req.uri().authority().is_none() {
                let mut parts = std::mem::take(req.uri_mut()).into_parts();
                parts.scheme = Some(http::uri::Scheme::HTTP);
                parts.authority = Some(http::uri::Authority::from_static("localhost"));
                *req.uri_mut() = http::Uri::from_parts(parts)?;
            }
            let (number, mut sender) = inner.sender(None).await?;
            match sender.try_send_request(req).await {
                Ok(answer) => Ok(answer),
                // The connection closed before the request went out (the server restarted
                // since the last call, and the sender had not noticed yet): nothing was sent,
                // so it goes once more on a new connection.
                Err(mut e) => match e.take_message() {
                    Some(req) => {
                        let (_, mut fresh) = inner.sender(Some(number)).await?;
                        Ok(fresh.send_request(req).await?)
                    }
                    None => Err(e.into_error().into()),
                },
            }
        })
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
