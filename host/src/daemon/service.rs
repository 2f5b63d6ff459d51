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
use crate::proto::host::{
    BlobPull, CacheListRequest, CacheListResponse, CachePruneRequest, CachePruneResponse, CachePullProgress,
    CachePullRequest, CachedBlob, HealthRequest, HealthResponse, ListVolumesRequest, ListVolumesResponse, VolumeStatus,
};

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

    async fn node_expand_volume(
        &self,
        req: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        let req = req.into_inner();
        let id = req.volume_id.clone();
        let plugin = self.plugin_of(&id, None);
        traced("NodeExpandVolume", &id, plugin, self.node.expand(req)).await
    }

    async fn list_volumes(&self, _: Request<ListVolumesRequest>) -> Result<Response<ListVolumesResponse>, Status> {
        let list = self.node.list().await.map_err(Status::from)?;
        let mut volumes = list
            .into_iter()
            .map(|(st, h)| VolumeStatus {
                lazy: self.node.lazy_status(&st.volume_id).map(|l| lazy_progress(&l)),
                verification: verification(&st),
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
                ..Default::default()
            })
            .collect::<Vec<_>>();
        // Volumes whose stage waits for blobs have no record yet.
        for (id, p) in self.node.pulls() {
            if crate::daemon::dynamic::is_mount_waiter(&id) || volumes.iter().any(|v| v.volume_id == id) {
                continue;
            }
            volumes.push(VolumeStatus {
                volume_id: id,
                phase: "pulling".into(),
                condition: format!("pulling {}", crate::daemon::pull::describe(&p)),
                pull_done_bytes: p.done_bytes,
                pull_total_bytes: p.total_bytes,
                pull_blobs: p
                    .blobs
                    .iter()
                    .map(|b| BlobPull { digest: b.digest.clone(), done_bytes: b.done, total_bytes: b.total })
                    .collect(),
                ..Default::default()
            });
        }
        Ok(Response::new(ListVolumesResponse { volumes }))
    }

    type CachePullStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<CachePullProgress, Status>> + Send>>;

    async fn cache_pull(&self, req: Request<CachePullRequest>) -> Result<Response<Self::CachePullStream>, Status> {
        let req = req.into_inner();
        let secrets = crate::volume::request::secrets(&req.secrets).map_err(Status::from)?;
        if req.reference.trim().is_empty() {
            return Err(Status::invalid_argument("reference is empty: give registry/repository[:tag][@sha256:<hex>]"));
        }
        let ask = crate::daemon::cache::PullAsk {
            reference: req.reference,
            mirror: Some(req.mirror).filter(|m| !m.is_empty()),
            insecure: req.insecure,
            secrets,
        };
        let (updates, mut rx) = tokio::sync::mpsc::channel(4);
        let (out, stream) = tokio::sync::mpsc::channel::<Result<CachePullProgress, Status>>(4);
        let node = self.node.clone();
        let reference = ask.reference.clone();
        let pull = tokio::spawn(async move { node.cache_pull(ask, updates).await });
        tokio::spawn(async move {
            while let Some(u) = rx.recv().await {
                let (manifest_digest, p, done) = match u {
                    crate::daemon::cache::PullUpdate::Progress { manifest_digest, progress } => {
                        (manifest_digest, progress, false)
                    }
                    crate::daemon::cache::PullUpdate::Done { manifest_digest, progress } => {
                        (manifest_digest, progress, true)
                    }
                };
                let msg = CachePullProgress {
                    manifest_digest,
                    done_bytes: p.done_bytes,
                    total_bytes: p.total_bytes,
                    blobs: blob_pulls(&p),
                    done,
                };
                if out.send(Ok(msg)).await.is_err() {
                    return;
                }
            }
            match pull.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(reference = %reference, code = ?e.kind, error = %e.message, "cache pull failed");
                    let _ = out.send(Err(Status::from(e))).await;
                }
                Err(e) => {
                    let _ = out.send(Err(Status::internal(format!("the cache pull panicked: {e}")))).await;
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(stream))))
    }

    async fn cache_list(&self, _: Request<CacheListRequest>) -> Result<Response<CacheListResponse>, Status> {
        let node = self.node.clone();
        let blobs = tokio::task::spawn_blocking(move || node.cache_list())
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(Status::from)?;
        let blobs = blobs
            .into_iter()
            .map(|b| CachedBlob {
                digest: b.digest,
                size: b.size,
                last_used: b
                    .last_used
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs() as i64)
                    .unwrap_or_default(),
                volumes: b.volumes,
            })
            .collect();
        Ok(Response::new(CacheListResponse { blobs }))
    }

    async fn cache_prune(&self, req: Request<CachePruneRequest>) -> Result<Response<CachePruneResponse>, Status> {
        let keep = req.into_inner().keep_bytes;
        let node = self.node.clone();
        let (blobs, bytes) = tokio::task::spawn_blocking(move || node.cache_prune(keep))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(Status::from)?;
        tracing::info!(blobs, bytes, "pruned the blob cache");
        Ok(Response::new(CachePruneResponse { blobs: blobs as u32, bytes }))
    }
}

/// Progress as the cache RPCs send it.
fn blob_pulls(p: &crate::oci::Progress) -> Vec<BlobPull> {
    p.blobs.iter().map(|b| BlobPull { digest: b.digest.clone(), done_bytes: b.done, total_bytes: b.total }).collect()
}

/// Reconcile, then serve `node` on `socket` until `shutdown` resolves.
pub async fn serve(node: Node, socket: &Path, shutdown: impl Future<Output = ()> + Send) -> anyhow::Result<()> {
    match crate::exec::process::raise_open_files_limit() {
        Ok(n) => tracing::debug!(open_files = n, "open-files limit"),
        Err(e) => tracing::warn!(error = %e, "could not raise the open-files limit"),
    }
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
    // The runtime tmpfs first (daemon/secret_files.rs): reconciliation recreates sockets in it.
    let report = tokio::task::spawn_blocking(move || {
        n.mount_runtime_tmpfs();
        let report = n.reconcile()?;
        // Every dynamic volume's socket answers again before the daemon says it is ready.
        let served = n.restore_dynamic();
        tracing::info!(served, "dynamic volumes' sockets served");
        Ok::<_, crate::error::Error>(report)
    })
    .await??;
    // Watches, reaps and restarts FUSE processes (daemon/supervise.rs, daemon/heal.rs).
    let supervisor = tokio::spawn(crate::daemon::supervise::run(node.clone()));
    tracing::info!(socket = %socket.display(), adopted = report.adopted, cleaned = report.cleaned, unhealthy = report.unhealthy, "host daemon ready");
    metrics.set_ready("host");
    // Dynamic mounts that were pending: planned again now, never before the daemon is ready.
    let resumed = node.resume_dynamic();
    if resumed > 0 {
        tracing::info!(resumed, "dynamic mounts pending at start are planned again");
    }
    let last = node.clone();
    tonic::transport::Server::builder()
        .add_service(HostServer::new(HostService::new(node)))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await?;
    supervisor.abort();
    let _ = tokio::task::spawn_blocking(move || last.release_unused_tmpfs()).await;
    Ok(())
}

/// A lazy volume's status as the host API reports it.
pub fn lazy_progress(l: &crate::daemon::lazy::LazyStatus) -> crate::proto::host::LazyProgress {
    crate::proto::host::LazyProgress {
        total_bytes: l.total_bytes,
        verified_bytes: l.verified_bytes,
        present_bytes: l.present_bytes,
        demand_requests: l.demand_requests,
        demand_bytes: l.demand_bytes,
        fill_bytes: l.fill_bytes,
        layers: l.layers,
        layers_complete: l.layers_complete,
        layers_pending: l.layers_pending,
        passthrough_files: l.passthrough_files,
        indexed: l.indexed,
        connected: l.connected,
        failed: l.failed.clone().unwrap_or_default(),
        stalled: l.stalled.clone().unwrap_or_default(),
    }
}

/// What a volume's record says it verified (ListVolumes), if it is signed, indexed or under a
/// policy.
fn verification(st: &crate::volume::state::VolumeState) -> Option<crate::proto::host::Verification> {
    let v = st.verified.clone().unwrap_or_default();
    if st.verified.is_none() && st.signed_by.is_empty() && !st.chunk_index_required {
        return None;
    }
    Some(crate::proto::host::Verification {
        manifest: v.manifest,
        signer: v.signer.unwrap_or_default(),
        identity: v.identity.unwrap_or_default(),
        bundle: v.bundle.unwrap_or_default(),
        found_in: v.found_in.unwrap_or_default(),
        chunk_index: v.index.unwrap_or_default(),
        index_signer: v.index_signer.unwrap_or_default(),
        signed_by: st.signed_by.clone(),
        chunk_index_required: st.chunk_index_required,
    })
}
