//! `mounthost csi`: the CSI front on kubelet's `csi.sock`. Node calls are forwarded to the host
//! daemon over its socket, statelessly (a restarted front answers from the host's state at
//! once); controller calls run the plugins' provision planners here, and the controller keeps
//! only what ListVolumes and DeleteVolume cannot ask a backend for ([`backends`], and the
//! notes of plugins pulled by reference). It can be restarted or upgraded at any time without
//! touching a mount.

pub mod backends;
pub mod controller;
pub mod identity;
pub mod metered;
pub mod node;
pub mod provision;
pub mod volumes;

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use clap::ValueEnum;
use tokio_stream::wrappers::UnixListenerStream;

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
pub type Host = HostClient<crate::unpriv::grpc::UnixChannel>;

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

/// A call to the host daemon failed on the way (no connection, or one cut mid-call): UNAVAILABLE,
/// saying so, so kubelet retries. A status the daemon answered (no error source: it came in the
/// response, e.g. a registry it could not reach) passes as it is.
pub fn host_down(e: tonic::Status) -> tonic::Status {
    let local = std::error::Error::source(&e).is_some();
    let transport =
        local && matches!(e.code(), tonic::Code::Unknown | tonic::Code::Unavailable | tonic::Code::Cancelled);
    if transport {
        tonic::Status::unavailable(format!("the mounthost host daemon is not reachable: {}", e.message()))
    } else {
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::csi::identity_client::IdentityClient;
    use crate::unpriv::grpc::channel;

    /// Serve the front on `socket` until the returned sender is dropped or sent to.
    fn start(socket: &Path, host: Host) -> (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let socket = socket.to_path_buf();
        let task = tokio::spawn(async move {
            serve(Mode::Node, &socket, Some(host), None, async move {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        (stop, task)
    }

    /// `Ok(true)` ready; `Ok(false)` served, and the host daemon does not answer (Probe's
    /// FAILED_PRECONDITION); `Err` the front itself is not reached.
    async fn probe(client: &mut IdentityClient<crate::unpriv::grpc::UnixChannel>) -> Result<bool, tonic::Status> {
        match client.probe(csi::ProbeRequest {}).await {
            Ok(r) => Ok(r.into_inner().ready == Some(true)),
            Err(e) if e.code() == tonic::Code::FailedPrecondition => {
                assert!(e.message().contains("host daemon") && e.message().contains("host.sock"), "{e:?}");
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    #[tokio::test]
    async fn a_host_gone_mid_call_is_unavailable() {
        use tokio::io::AsyncReadExt;
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("host.sock");
        // A daemon that takes the request and dies before answering (its socket goes with it).
        let listener = tokio::net::UnixListener::bind(&sock).unwrap();
        let daemon = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            conn.read(&mut buf).await.unwrap()
        });
        let e = Host::new(channel(&sock)).health(crate::proto::host::HealthRequest {}).await.unwrap_err();
        assert!(daemon.await.unwrap() > 0, "the request reached the daemon");
        let e = host_down(e);
        assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
        assert!(e.message().contains("host daemon is not reachable"), "{e:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_channel_connects_at_its_first_call_and_again_after_its_server_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let csi_sock = dir.path().join("csi.sock");
        // The host socket has no server: the front's calls through its channel fail, which
        // Probe reports as not ready (and forwarded calls as UNAVAILABLE).
        let host = Host::new(channel(&dir.path().join("host.sock")));
        let mut client = IdentityClient::new(channel(&csi_sock));
        let err = probe(&mut client).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
        assert!(err.message().contains(&format!("connecting to {}", csi_sock.display())), "{err:?}");

        let (stop, task) = start(&csi_sock, host.clone());
        let mut ready = None;
        for _ in 0..200 {
            if let Ok(r) = probe(&mut client).await {
                ready = Some(r);
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(ready, Some(false), "served, and the host is unreachable");
        let forwarded = host_down(
            host.clone().health(crate::proto::host::HealthRequest {}).await.expect_err("no host daemon runs"),
        );
        assert_eq!(forwarded.code(), tonic::Code::Unavailable, "{forwarded:?}");
        assert!(forwarded.message().contains("host daemon is not reachable"), "{forwarded:?}");
        // What the daemon itself answered passes unchanged, "connect" in its message or not.
        for answered in [
            tonic::Status::unavailable("registry 127.0.0.1:5055 is unreachable: tcp connect error: Connection refused"),
            tonic::Status::unknown("something the daemon said"),
        ] {
            let passed = host_down(answered.clone());
            assert_eq!((passed.code(), passed.message()), (answered.code(), answered.message()));
        }

        // The server goes away and comes back on the same path: once it answers a new channel,
        // the old one gets through at its first call (a request its closed connection did not
        // send goes out on a new one).
        stop.send(()).unwrap();
        task.await.unwrap();
        let (stop, task) = start(&csi_sock, host);
        let mut fresh = IdentityClient::new(channel(&csi_sock));
        let mut up = false;
        for _ in 0..200 {
            if probe(&mut fresh).await.is_ok() {
                up = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(up, "the restarted front never answered");
        assert!(!probe(&mut client).await.unwrap(), "the old channel answers at its first call after the restart");
        // Many calls at once share the one connection.
        let calls: Vec<_> = (0..200)
            .map(|_| {
                let mut c = client.clone();
                tokio::spawn(async move { probe(&mut c).await })
            })
            .collect();
        for c in calls {
            c.await.unwrap().unwrap();
        }
        stop.send(()).unwrap();
        task.await.unwrap();
    }
}
