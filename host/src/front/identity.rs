//! CSI Identity.

use tonic::{Request, Response, Status};

use super::{Host, Mode};
use crate::config::DRIVER_NAME;
use crate::proto::csi;
use crate::proto::host::HealthRequest;

/// The Identity service.
pub struct IdentityService {
    pub(super) mode: Mode,
    pub(super) host: Option<Host>,
}

#[tonic::async_trait]
impl csi::identity_server::Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: DRIVER_NAME.into(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        use csi::plugin_capability::{Service, Type};
        let mut capabilities = Vec::new();
        if self.mode.controller() {
            capabilities.push(csi::PluginCapability {
                r#type: Some(Type::Service(Service {
                    r#type: csi::plugin_capability::service::Type::ControllerService as i32,
                })),
            });
        }
        // Volumes grow while published (a plugin whose volumes cannot grow answers OUT_OF_RANGE).
        capabilities.push(csi::PluginCapability {
            r#type: Some(Type::VolumeExpansion(csi::plugin_capability::VolumeExpansion {
                r#type: csi::plugin_capability::volume_expansion::Type::Online as i32,
            })),
        });
        Ok(Response::new(csi::GetPluginCapabilitiesResponse { capabilities }))
    }

    /// Ready when the host daemon answers (node mode); a controller is ready once it runs. A
    /// node front whose host daemon does not answer lacks what it needs to serve: CSI's Probe
    /// table, "Missing required dependency 9 FAILED_PRECONDITION" ("Indicates that the plugin is
    /// missing one or more required dependency"), with the reason in the message.
    async fn probe(&self, _: Request<csi::ProbeRequest>) -> Result<Response<csi::ProbeResponse>, Status> {
        if let (Some(host), true) = (&self.host, self.mode.node())
            && let Err(e) = host.clone().health(HealthRequest {}).await
        {
            return Err(Status::failed_precondition(format!(
                "the mounthost host daemon, which the node service needs, does not answer: {}",
                e.message()
            )));
        }
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}
