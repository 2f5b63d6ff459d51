//! `mounthost host`: the host daemon's gRPC service (`proto/host.proto`) on its unix socket.
//! Each RPC gets a tracing span with the volume id; errors become gRPC statuses by class.

use std::future::Future;
use std::path::Path;

use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::daemon::Node;
use crate::proto::csi;
use crate::proto::host::host_server::{Host, HostServer};
use crate::proto::host::{HealthRequest, HealthResponse, ListVolumesRequest, ListVolumesResponse, VolumeStatus};

/// The host service.
#[derive(Clone)]
pub struct HostService {
    node: Node,
}

impl HostService {
    /// Serve `node`.
    pub fn new(node: Node) -> Self {
        HostService { node }
    }
}

fn span(method: &'static str, volume: &str) -> tracing::Span {
    tracing::info_span!("rpc", method, volume.id = %volume)
}

/// Run one operation in a span carrying the volume id, log how it ended, and count it by RPC,
/// plugin and gRPC code.
async fn traced<T>(
    method: &'static str,
    volume: &str,
    plugin: Option<String>,
    f: impl Future<Output = Result<T, crate::error::Error>>,
) -> Result<Response<T>, Status> {
    let span = span(method, volume);
    async move {
        let started = std::time::Instant::now();
        let result = f.await;
        match &result {
            Ok(_) => tracing::debug!(elapsed_us = started.elapsed().as_micros() as u64, "ok"),
            Err(e) => tracing::warn!(code = ?e.kind, error = %e.message, "failed"),
        }
        let result = result.map(Response::new).map_err(Status::from);
        let code = result.as_ref().err().map_or(tonic::Code::Ok, Status::code);
        // Checked after the call: its plugin may have been loaded by it.
        let metrics = crate::metrics::global();
        metrics.host_operation(method, &metrics.plugin_label(plugin.as_deref()), code, started.elapsed());
        result
    }
    .instrument(span)
    .await
}

impl HostService {
    /// The plugin an operation on `volume` names: its `plugin` attribute, else the plugin its
    /// state file records, else its id's `<plugin>~` prefix (the label is `unknown` unless that
    /// plugin is loaded).
    fn plugin_of(&self, volume: &str, attrs: Option<&std::collections::HashMap<String, String>>) -> Option<String> {
        attrs
            .and_then(|a| a.get(crate::volume::request::PLUGIN_KEY))
            .cloned()
            .or_else(|| self.node.store().plugin_of(volume))
            .or_else(|| volume.split_once('~').map(|(p, _)| p.to_string()))
    }
}

#[tonic::async_trait]
impl Host for HostService {
    async fn health(&self, _: Request<HealthRequest>) -> Result<Response<HealthResponse>, Status> {
        let volumes = self.node.store().all().map(|l| l.len()).unwrap_or(0);
        Ok(Response::new(HealthResponse {
            version: env!("CARGO_PKG_VERSION").into(),
            node_id: self.node.config().node_id.clone(),
            volumes: u32::try_from(volumes).unwrap_or(u32::MAX),
        }))
    }

    async fn node_stage_volume(
        &self,
        req: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        let req = req.into_inner();
        let id = req.volume_id.clone();
        let plugin = self.plugin_of(&id, Some(&req.volume_context));
        traced("NodeStageVolume", &id, plugin, async {
            self.node.stage(req).await.map(|()| csi::NodeStageVolumeResponse {})
        })
        .await
    }

    async fn node_unstage_volume(
        &self,
        req: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        let req = req.into_inner();
        let id = req.volume_id.clone();
        let plugin = self.plugin_of(&id, None);
        traced("NodeUnstageVolume", &id, plugin, async {
            self.node.unstage(req).await.map(|()| csi::NodeUnstageVolumeResponse {})
        })
        .await
    }

    async fn node_publish_volume(
        &self,
        req: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let req = req.into_inner();
        let id = req.volume_id.clone();
        let plugin = self.plugin_of(&id, Some(&req.volume_context));
        traced("NodePublishVolume", &id, plugin, async {
            self.node.publish(req).await.map(|()| csi::NodePublishVolumeResponse {})
        })
        .await
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let req = req.into_inner();
        let id = req.volume_id.clone();
        let plugin = self.plugin_of(&id, None);
        traced("NodeUnpublishVolume", &id, plugin, async {
            self.node.unpublish(req).await.map(|()| csi::NodeUnpublishVolumeResponse {})
        })
        .await
    }

    async fn node_get_volume_stats(
        &self,
        req: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        let req = req.into_inner();
        let id = req.volume_id.clone();
        let plugin = self.plugin_of(&id, None);
        traced("NodeGetVolumeStats", &id, plugin, self.node.stats(req)).await
    }

    async fn list_volumes(&self, _: Request<ListVolumesRequest>) -> Result<Response<ListVolumesResponse>, Status> {
        let list = self.node.list().await.map_err(Status::from)?;
        let volumes = list
            .into_iter()
            .map(|(st, h)| VolumeStatus {
                volume_id: st.volume_id,
                plugin: st.plugin,
                digest: st.digest,
                phase: st.phase.as_str().to_string(),
                staging_path: st.staging_path.display().to_string(),
                targets: st.published.keys().map(|p| p.display().to_string()).collect(),
                pid: st.process.map(|p| p.pid).unwrap_or(0),
                healthy: h.healthy,
                condition: h.condition,
                restarts: st.restarts,
                oom_kills: st.oom_kills,
            })
            .collect();
        Ok(Response::new(ListVolumesResponse { volumes }))
    }
}

/// Reconcile, then serve `node` on `socket` until `shutdown` resolves.
pub async fn serve(node: Node, socket: &Path, shutdown: impl Future<Output = ()> + Send) -> anyhow::Result<()> {
    // Listening first refuses to start beside a live daemon (its socket answers), so nothing
    // below runs while another writer of the same state is alive. Calls wait in the backlog
    // until reconciliation is done.
    let listener = node.executor().listen(socket, node.config().host_socket_group)?;
    let metrics = crate::metrics::global();
    let n = node.clone();
    metrics.on_scrape(
        "host",
        std::sync::Arc::new(move || {
            let n = n.clone();
            Box::pin(async move {
                if let Ok(list) = n.list().await {
                    let live: Vec<crate::metrics::LiveVolume> = list
                        .into_iter()
                        .map(|(st, h)| crate::metrics::LiveVolume {
                            plugin: st.plugin,
                            phase: st.phase.as_str().to_string(),
                            healthy: h.healthy,
                        })
                        .collect();
                    crate::metrics::global().set_volumes(&live);
                }
            })
        }),
    );
    let n = node.clone();
    let report = tokio::task::spawn_blocking(move || n.reconcile()).await??;
    // Watches, reaps and restarts FUSE processes (daemon/supervise.rs, daemon/heal.rs).
    let supervisor = tokio::spawn(crate::daemon::supervise::run(node.clone()));
    tracing::info!(socket = %socket.display(), adopted = report.adopted, cleaned = report.cleaned, unhealthy = report.unhealthy, "host daemon ready");
    metrics.set_ready("host");
    tonic::transport::Server::builder()
        .add_service(HostServer::new(HostService::new(node)))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await?;
    supervisor.abort();
    Ok(())
}
