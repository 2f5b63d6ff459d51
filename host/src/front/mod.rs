//! `mounthost csi`: the CSI front on kubelet's `csi.sock`. Stateless: node calls are forwarded
//! to the host daemon over its socket (a restarted front answers from the host's state at
//! once), controller calls run the plugins' provision planners here. It can be restarted or
//! upgraded at any time without touching a mount.

pub mod controller;
pub mod identity;
pub mod metered;
pub mod node;
pub mod provision;

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use clap::ValueEnum;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Channel;

use crate::proto::csi;
use crate::proto::host::host_client::HostClient;

/// Which CSI services the front serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Identity + Node (the DaemonSet).
    Node,
    /// Identity + Controller (the provisioner's Deployment).
    Controller,
    /// Everything (local use).
    All,
}

impl Mode {
    fn node(self) -> bool {
        matches!(self, Mode::Node | Mode::All)
    }
    fn controller(self) -> bool {
        matches!(self, Mode::Controller | Mode::All)
    }
}

/// A client of the host daemon.
pub type Host = HostClient<Channel>;

/// Serve the CSI services of `mode` on `socket` until `shutdown`.
pub async fn serve(
    mode: Mode,
    socket: &Path,
    host: Option<Host>,
    controller: Option<crate::front::provision::Controller>,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let metrics = crate::metrics::global();
    let listener = crate::unpriv::socket::listen(socket)?;
    let identity = identity::IdentityService { mode, host: host.clone() };
    let mut router = tonic::transport::Server::builder()
        .layer(tower::layer::layer_fn(metered::layer))
        .add_service(csi::identity_server::IdentityServer::new(identity));
    if mode.node() {
        let host = host.clone().ok_or_else(|| anyhow::anyhow!("node mode needs the host daemon's socket"))?;
        router = router.add_service(csi::node_server::NodeServer::new(node::NodeService { host }));
    }
    if mode.controller() {
        let c = controller.ok_or_else(|| anyhow::anyhow!("controller mode needs a plugin runtime"))?;
        router = router.add_service(csi::controller_server::ControllerServer::new(controller::ControllerService {
            inner: Arc::new(c),
        }));
    }
    tracing::info!(socket = %socket.display(), ?mode, "CSI front ready");
    metrics.set_ready("csi");
    router.serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown).await?;
    Ok(())
}

/// The host is unreachable: kubelet should retry.
pub fn host_down(e: tonic::Status) -> tonic::Status {
    let transport =
        e.code() == tonic::Code::Unknown || (e.code() == tonic::Code::Unavailable && e.message().contains("connect"));
    if transport {
        tonic::Status::unavailable(format!("the mounthost host daemon is not reachable: {}", e.message()))
    } else {
        e
    }
}
