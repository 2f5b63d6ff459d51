//! Errors of the plugin runtime. Each says which plugin and which call, and what a person can
//! do about it; [`PluginError::kind`] classifies it for gRPC.

use std::time::Duration;

use crate::error::ErrorKind;

/// A plugin's own domain error (the WIT `backend-error`), with secrets scrubbed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The plugin says the request is wrong.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The plugin says something named does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// The plugin says a dependency is unavailable.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The plugin reports a bug of its own.
    #[error("internal: {0}")]
    Internal(String),
    /// The plugin says the capacity asked for is one its volumes cannot have.
    #[error("out of range: {0}")]
    OutOfRange(String),
    /// The plugin says a volume of that name exists with other properties.
    #[error("already exists: {0}")]
    AlreadyExists(String),
    /// The plugin does not offer the operation (contract 0.5.0 on).
    #[error("not supported: {0}")]
    Unsupported(String),
}

/// Why a plugin could not be found, loaded or called.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// No plugin has this name.
    #[error("unknown plugin {name:?}; known plugins: {known}")]
    UnknownPlugin { name: String, known: String },
    /// The name exists but not at this digest.
    #[error(
        "plugin {name:?} is not loaded at digest {digest}; loaded digests: {known}; put that build into the plugin folder"
    )]
    UnknownDigest { name: String, digest: String, known: String },
    /// A digest that is not `sha256:<64 hex>`.
    #[error("invalid plugin digest {0:?}: expected sha256:<64 lowercase hex digits>")]
    BadDigest(String),
    /// The file could not be read or compiled, or its `info` is unusable.
    #[error("cannot load plugin {origin}: {reason}")]
    Load { origin: String, reason: String },
    /// The component imports interfaces plugins may not use.
    #[error(
        "plugin {origin} is refused: it imports {}, but plugins may only import \
         mounthost:plugin/host, mounthost:plugin/types and WASI clocks, random, io and cli (no filesystem, sockets or http)",
        imports.join(", ")
    )]
    ForbiddenImports { origin: String, imports: Vec<String> },
    /// A plugin pulled by OCI reference reports the name of a stock or folder plugin, whose
    /// grants it would get.
    #[error(
        "plugin {origin} is refused: it calls itself {name:?}, the name of {owner}; grants are given by name, so a \
         pulled plugin may not take the name of a stock or folder plugin: give it a name of its own and grant that"
    )]
    Shadows { origin: String, name: String, owner: String },
    /// The call ran past its deadline and was stopped.
    #[error("plugin {plugin} did not finish {call} within its deadline of {deadline:?} and was stopped")]
    Deadline { plugin: String, call: &'static str, deadline: Duration },
    /// The call tried to use more memory than allowed and was stopped.
    #[error("plugin {plugin} was stopped in {call}: {detail}")]
    Memory { plugin: String, call: &'static str, detail: String },
    /// The plugin trapped (a panic, an unreachable, a bad host call).
    #[error("plugin {plugin} crashed in {call}: {detail}")]
    Trap { plugin: String, call: &'static str, detail: String },
    /// The plugin returned its own error.
    #[error("plugin {plugin} refused {call}: {error}")]
    Backend { plugin: String, call: &'static str, error: BackendError },
}

impl PluginError {
    /// The gRPC class of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            PluginError::UnknownPlugin { .. } => ErrorKind::NotFound,
            // The node lacks the build a volume is pinned to (by its context, or by the build it
            // was staged with): not a missing volume.
            PluginError::UnknownDigest { .. } => ErrorKind::FailedPrecondition,
            PluginError::BadDigest(_) | PluginError::Shadows { .. } => ErrorKind::InvalidArgument,
            PluginError::Load { .. } | PluginError::ForbiddenImports { .. } => ErrorKind::FailedPrecondition,
            PluginError::Deadline { .. } => ErrorKind::DeadlineExceeded,
            PluginError::Memory { .. } | PluginError::Trap { .. } => ErrorKind::Internal,
            PluginError::Backend { error, .. } => match error {
                BackendError::InvalidArgument(_) => ErrorKind::InvalidArgument,
                BackendError::NotFound(_) => ErrorKind::NotFound,
                BackendError::Unavailable(_) => ErrorKind::Unavailable,
                BackendError::Internal(_) => ErrorKind::Internal,
                BackendError::OutOfRange(_) => ErrorKind::OutOfRange,
                BackendError::AlreadyExists(_) => ErrorKind::AlreadyExists,
                // An operation the plugin does not offer: the request asked for it, as CSI's
                // INVALID_ARGUMENT says (what plugins answered before contract 0.5.0 had a case).
                BackendError::Unsupported(_) => ErrorKind::InvalidArgument,
            },
        }
    }
}

impl From<PluginError> for crate::error::Error {
    fn from(e: PluginError) -> Self {
        let kind = match &e {
            // A request naming a plugin that does not exist is a bad request.
            PluginError::UnknownPlugin { .. } => crate::error::ErrorKind::InvalidArgument,
            other => other.kind(),
        };
        crate::error::Error::new(kind, e.to_string())
    }
}
