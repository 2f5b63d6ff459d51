//! CSI Node: every call is forwarded to the host daemon unchanged; capabilities are answered
//! here.

use tonic::{Request, Response, Status};

use super::{Host, host_down};
use crate::proto::csi;
use crate::proto::host::HealthRequest;

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
        self.host.clone().node_stage_volume(req.into_inner()).await.map_err(host_down)
    }

    async fn node_unstage_volume(
        &self,
        req: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        self.host.clone().node_unstage_volume(req.into_inner()).await.map_err(host_down)
    }

    async fn node_publish_volume(
        &self,
        req: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        self.host.clone().node_publish_volume(req.into_inner()).await.map_err(host_down)
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        self.host.clone().node_unpublish_volume(req.into_inner()).await.map_err(host_down)
    }

    async fn node_get_volume_stats(
        &self,
        req: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        self.host.clone().node_get_volume_stats(req.into_inner()).await.map_err(host_down)
    }

    async fn node_expand_volume(
        &self,
        _: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        Err(Status::unimplemented("volume expansion is not supported"))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        use csi::node_service_capability::rpc::Type;
        let capabilities =
            [Type::StageUnstageVolume, Type::GetVolumeStats, Type::VolumeCondition, Type::SingleNodeMultiWriter]
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
