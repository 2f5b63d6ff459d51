//! Generated gRPC code: the CSI spec (`csi.v1`) and the front ↔ host protocol
//! (`mounthost.host.v1`), from `proto/` by `build.rs`. The modules nest as the protobuf
//! packages do, because the host protocol refers to CSI messages by package path.

/// CSI v1.12 (package `csi.v1`), re-exported flat as `proto::csi::*`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod csi {
    pub mod v1 {
        tonic::include_proto!("csi.v1");
    }
    pub use v1::*;
}

/// Package `mounthost.host.v1`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod mounthost {
    pub mod host {
        pub mod v1 {
            tonic::include_proto!("mounthost.host.v1");
        }
    }
}

/// The host daemon's own protocol.
pub use mounthost::host::v1 as host;
