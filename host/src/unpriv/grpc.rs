//! gRPC over unix sockets: a client channel to a socket path, and `unix://` endpoint parsing.

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};

/// A channel to the gRPC server on the unix socket `path`. Connects lazily and reconnects
/// after the server restarts, so a client outlives its server's restarts.
pub fn channel(path: &Path) -> Channel {
    let path = path.to_path_buf();
    Endpoint::from_static("http://localhost").connect_with_connector_lazy(tower::service_fn(move |_| {
        let path = path.clone();
        async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
    }))
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
