//! The error classes every module maps its errors onto. The CSI front turns an
//! [`ErrorKind`] into a gRPC status code (see STYLE.md's table); the CLI prints the message and
//! exits non-zero.

/// What kind of failure an error is, in gRPC terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request (or a plugin's reading of it) is wrong; retrying unchanged cannot help.
    InvalidArgument,
    /// Something named does not exist.
    NotFound,
    /// Already exists with different properties.
    AlreadyExists,
    /// The system is not in the state the call needs.
    FailedPrecondition,
    /// Another operation on the same object is in flight; retry.
    Aborted,
    /// A dependency is down; retry later.
    Unavailable,
    /// A deadline passed.
    DeadlineExceeded,
    /// A bug or an unexpected failure.
    Internal,
}
