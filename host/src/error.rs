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
    /// Not supported by this driver.
    Unimplemented,
    /// Credentials are missing (a registry asked for them and none were given).
    Unauthenticated,
    /// Credentials were given and refused.
    PermissionDenied,
    /// Out of a resource (disk space for the blob cache).
    ResourceExhausted,
    /// Data arrived corrupted (a blob whose digest does not match).
    DataLoss,
    /// A capacity outside what the volume can have (an expansion of a fixed-size volume).
    OutOfRange,
}

/// An operation's failure: its class and a message a person can act on. Every module's error
/// converts into this at the pipeline's edge (each module implements `From` for its own error,
/// so this file depends on none of them); the daemon turns it into a gRPC status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    /// The gRPC class.
    pub kind: ErrorKind,
    /// What went wrong, with secrets already scrubbed.
    pub message: String,
}

impl Error {
    /// An error of class `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error { kind, message: message.into() }
    }
    /// InvalidArgument.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }
    /// NotFound.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }
    /// FailedPrecondition.
    pub fn precondition(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::FailedPrecondition, message)
    }
    /// AlreadyExists.
    pub fn exists(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::AlreadyExists, message)
    }
    /// Internal.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
    /// Unavailable.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }
    /// Unimplemented.
    pub fn unimplemented(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unimplemented, message)
    }
}

/// The gRPC code of an error class.
pub fn code(kind: ErrorKind) -> tonic::Code {
    match kind {
        ErrorKind::InvalidArgument => tonic::Code::InvalidArgument,
        ErrorKind::NotFound => tonic::Code::NotFound,
        ErrorKind::AlreadyExists => tonic::Code::AlreadyExists,
        ErrorKind::FailedPrecondition => tonic::Code::FailedPrecondition,
        ErrorKind::Aborted => tonic::Code::Aborted,
        ErrorKind::Unavailable => tonic::Code::Unavailable,
        ErrorKind::DeadlineExceeded => tonic::Code::DeadlineExceeded,
        ErrorKind::Internal => tonic::Code::Internal,
        ErrorKind::Unimplemented => tonic::Code::Unimplemented,
        ErrorKind::Unauthenticated => tonic::Code::Unauthenticated,
        ErrorKind::PermissionDenied => tonic::Code::PermissionDenied,
        ErrorKind::ResourceExhausted => tonic::Code::ResourceExhausted,
        ErrorKind::DataLoss => tonic::Code::DataLoss,
        ErrorKind::OutOfRange => tonic::Code::OutOfRange,
    }
}

/// Longest message a gRPC status carries, in bytes. A message can quote paths a pod made (a
/// directory chain below its volume can be far longer than `PATH_MAX`), and the CO shows the
/// message to a person (Kubernetes events keep 1 KiB of it): beyond this, its middle is left
/// out, keeping what failed (the start) and why (the end, where the errno is).
pub const MAX_STATUS_MESSAGE: usize = 2048;

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        tonic::Status::new(code(e.kind), bounded(e.message))
    }
}

/// `message`, with its middle left out if it is longer than [`MAX_STATUS_MESSAGE`] (for every
/// message that leaves the daemon: a gRPC status, a dynamic volume's API answer, a mount's
/// recorded reason).
pub fn bounded(message: String) -> String {
    if message.len() <= MAX_STATUS_MESSAGE {
        return message;
    }
    // Room for the marker, whose number has at most 20 digits.
    let keep = (MAX_STATUS_MESSAGE - 48) / 2;
    let mut head = keep;
    while !message.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = message.len() - keep;
    while !message.is_char_boundary(tail) {
        tail += 1;
    }
    format!("{} … ({} bytes left out) … {}", &message[..head], tail - head, &message[tail..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_message_keeps_its_start_and_end_within_the_bound() {
        let short = Error::internal("unmount /a/b: Device or resource busy");
        assert_eq!(tonic::Status::from(short.clone()).message(), short.message);
        let exact = "x".repeat(MAX_STATUS_MESSAGE);
        assert_eq!(tonic::Status::from(Error::internal(exact.clone())).message(), exact);
        // A path of 40 components of 306 bytes, some characters two and three bytes long.
        let path = format!("/{}", vec!["dé€".repeat(51); 40].join("/"));
        let long = format!("resolve {path}: File name too long (os error 36)");
        let status = tonic::Status::from(Error::internal(long.clone()));
        let m = status.message();
        assert!(m.len() <= MAX_STATUS_MESSAGE, "{} bytes", m.len());
        assert!(m.starts_with("resolve /dé€dé€") && m.ends_with("dé€: File name too long (os error 36)"), "{m}");
        let (head, rest) = m.split_once(" … (").unwrap();
        let (left_out, tail) = rest.split_once(" bytes left out) … ").unwrap();
        assert_eq!(head.len() + left_out.parse::<usize>().unwrap() + tail.len(), long.len());
        assert!(long.starts_with(head) && long.ends_with(tail));
        assert_eq!(status.code(), tonic::Code::Internal);
    }
}
