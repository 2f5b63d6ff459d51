//! CSI Node: every call is forwarded to the host daemon unchanged; capabilities are answered
//! here.

use std::future::Future;

use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::{Host, host_down};
use crate::proto::csi;
use crate::proto::host::HealthRequest;

/// Forward one call in a span carrying the volume id; a failure is logged with its code.
async fn forwarded<T>(
    rpc: &'static str,
    volume: &str,
    call: impl Future<Output = Result<Response<T>, Status>>,
) -> Result<Response<T>, Status> {
    async move {
        let answer = call.await.map_err(host_down);
        if let Err(e) = &answer {
            tracing::warn!(code = ?e.code(), error = %e.message(), "failed");
        }
        answer
    }
    .instrument(tracing::info_span!("csi", rpc, volume.id = %volume))
    .await
}

/// The Node service.
pub struct NodeService {
    pub(super) host: Host,
}

#[tonic::async_trait]
impl csi::node_server::Node for NodeService {
    async fn node_stage_volume(
        &self,
        req: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        let req = req.into_inner();
        let volume = req.volume_id.clone();
        forwarded("NodeStageVolume", &volume, self.host.clone().node_stage_volume(req)).await
    }

    async fn node_unstage_volume(
        &self,
        req: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        let req = req.into_inner();
        let volume = req.volume_id.clone();
        forwarded("NodeUnstageVolume", &volume, self.host.clone().node_unstage_volume(req)).await
    }

    async fn node_publish_volume(
        &self,
        req: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let req = req.into_inner();
        let volume = req.volume_id.clone();
        forwarded("NodePublishVolume", &volume, self.host.clone().node_publish_volume(req)).await
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let req = req.into_inner();
        let volume = req.volume_id.clone();
        forwarded("NodeUnpublishVolume", &volume, self.host.clone().node_unpublish_volume(req)).await
    }

    async fn node_get_volume_stats(
        &self,
        req: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        let req = req.into_inner();
        let volume = req.volume_id.clone();
        forwarded("NodeGetVolumeStats", &volume, self.host.clone().node_get_volume_stats(req)).await
    }

    async fn node_expand_volume(
        &self,
        req: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        let req = req.into_inner();
        let volume = req.volume_id.clone();
        forwarded("NodeExpandVolume", &volume, self.host.clone().node_expand_volume(req)).await
    }

    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        use csi::node_service_capability::rpc::Type;
        let capabilities = [
            Type::StageUnstageVolume,
            Type::GetVolumeStats,
            Type::VolumeCondition,
            Type::SingleNodeMultiWriter,
            Type::ExpandVolume,
        ]
        .into_iter()
        .map(|t| csi::NodeServiceCapability {
            r#type: Some(csi::node_service_capability::Type::Rpc(csi::node_service_capability::Rpc {
                r#type: t as i32,
            })),
        })
        .collect();
        Ok(Response::new(csi::NodeGetCapabilitiesResponse { capabilities }))
    }

    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        let health = self.host.clone().health(HealthRequest {}).await.map_err(host_down)?.into_inner();
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: health.node_id,
            max_volumes_per_node: 0,
            accessible_topology: None,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::Captured;

    /// A failed forwarded call logs one JSON line whose span carries the RPC and `volume.id`.
    #[tokio::test]
    async fn a_failed_call_is_logged_with_its_volume_id() {
        let lines = Captured::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt().json().with_writer(move || writer.clone()).finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let refused = async { Err::<Response<()>, _>(Status::failed_precondition("not staged")) };
        let err = forwarded("NodePublishVolume", "seaweedfs~f:8888/buckets/v", refused).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        let text = lines.text();
        let line: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(line["span"]["volume.id"], "seaweedfs~f:8888/buckets/v", "{text}");
        assert_eq!(line["span"]["rpc"], "NodePublishVolume", "{text}");
        assert_eq!(line["fields"]["error"], "not staged", "{text}");
    }
}
