//! A tower layer that counts every CSI call the front answers, by RPC and gRPC code, and times
//! it (`mounthost_csi_requests_total`, `mounthost_csi_request_duration_seconds`). One place for
//! every service, the unimplemented RPCs included.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

/// The layer's service.
#[derive(Clone)]
pub struct Metered<S> {
    inner: S,
}

/// Wrap `inner`.
pub fn layer<S>(inner: S) -> Metered<S> {
    Metered { inner }
}

/// Every method of the CSI spec v1.12 services (Identity, Controller, Node, GroupController,
/// SnapshotMetadata): the only values the `rpc` label takes besides `unknown`.
const CSI_METHODS: &[&str] = &[
    "GetPluginInfo",
    "GetPluginCapabilities",
    "Probe",
    "CreateVolume",
    "DeleteVolume",
    "ControllerPublishVolume",
    "ControllerUnpublishVolume",
    "ValidateVolumeCapabilities",
    "ListVolumes",
    "GetCapacity",
    "ControllerGetCapabilities",
    "CreateSnapshot",
    "DeleteSnapshot",
    "ListSnapshots",
    "GetSnapshot",
    "ControllerExpandVolume",
    "ControllerGetVolume",
    "ControllerModifyVolume",
    "NodeStageVolume",
    "NodeUnstageVolume",
    "NodePublishVolume",
    "NodeUnpublishVolume",
    "NodeGetVolumeStats",
    "NodeExpandVolume",
    "NodeGetCapabilities",
    "NodeGetInfo",
    "GroupControllerGetCapabilities",
    "CreateVolumeGroupSnapshot",
    "DeleteVolumeGroupSnapshot",
    "GetVolumeGroupSnapshot",
    "GetMetadataAllocated",
    "GetMetadataDelta",
];

/// The method name of a CSI path (`/csi.v1.Node/NodeStageVolume` → `NodeStageVolume`), or
/// `unknown` for anything else, so a client cannot add series at will.
fn rpc_name(path: &str) -> &'static str {
    let method = path.strip_prefix("/csi.v1.").and_then(|p| p.split_once('/')).map(|(_, m)| m);
    CSI_METHODS.iter().find(|m| Some(**m) == method).copied().unwrap_or("unknown")
}

impl<S, B, RB> tower::Service<http::Request<B>> for Metered<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let rpc = rpc_name(req.uri().path());
        let started = Instant::now();
        let answer = self.inner.call(req);
        Box::pin(async move {
            let res = answer.await;
            // A unary error is a trailers-only answer: its status is in the headers. An answer
            // without one carries a message, so it is OK (the status follows in the trailers).
            let code = match &res {
                Ok(r) => r
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<i32>().ok())
                    .map_or(tonic::Code::Ok, tonic::Code::from_i32),
                Err(_) => tonic::Code::Internal,
            };
            crate::metrics::global().csi_request(rpc, code, started.elapsed());
            res
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{CSI_METHODS, rpc_name};

    #[test]
    fn the_method_list_is_the_protos() {
        let proto = include_str!("../../../proto/csi.proto");
        let mut rpcs: Vec<&str> = proto
            .lines()
            .filter_map(|l| l.trim().strip_prefix("rpc "))
            .map(|l| l.split(|c: char| !c.is_ascii_alphanumeric()).next().unwrap())
            .collect();
        let mut listed = CSI_METHODS.to_vec();
        rpcs.sort();
        listed.sort();
        assert_eq!(listed, rpcs);
    }

    #[test]
    fn only_csi_method_names_become_labels() {
        assert_eq!(rpc_name("/csi.v1.Node/NodeStageVolume"), "NodeStageVolume");
        assert_eq!(rpc_name("/csi.v1.Identity/Probe"), "Probe");
        assert_eq!(rpc_name("/other.Service/Method"), "unknown");
        assert_eq!(rpc_name("/csi.v1.Node/Made1x"), "unknown");
        assert_eq!(rpc_name("/csi.v1.Node/a-b"), "unknown");
    }
}
