//! The unprivileged room: effects that need no privilege and that the CSI front and the
//! plugin runtime's owner may use. Listening on a unix socket, a gRPC channel to one, the
//! controller's HTTP client, and loading compiled plugin artifacts live here; everything the
//! host daemon does to the node lives in [`crate::exec`] instead.

pub mod artifact;
pub mod grpc;
pub mod http;
pub mod lazy_wire;
pub mod lookup;
pub mod metrics_http;
pub mod plugin_files;
pub mod private_files;
pub mod socket;
pub mod sys;
pub mod unix_http;
