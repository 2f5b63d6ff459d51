//! Path references and arguments. Plans never hold absolute node paths: they name one of the
//! volume's directories and a relative path inside it, and the host resolves and checks them.

use crate::{Arg, DirRoot, PathArg, PathRef};

fn at(root: DirRoot, rel: &str) -> PathRef {
    PathRef { root, rel: rel.to_string() }
}

/// A path inside the staging directory (`""` is the directory itself).
pub fn staging(rel: &str) -> PathRef {
    at(DirRoot::Staging, rel)
}

/// A path inside the publish target.
pub fn target(rel: &str) -> PathRef {
    at(DirRoot::Target, rel)
}

/// A path inside the volume's node-local cache directory.
pub fn cache(rel: &str) -> PathRef {
    at(DirRoot::Cache, rel)
}

/// A path inside the volume's runtime directory (short, for sockets).
pub fn runtime(rel: &str) -> PathRef {
    at(DirRoot::Runtime, rel)
}

/// A literal argument.
pub fn arg(text: impl Into<String>) -> Arg {
    Arg::Literal(text.into())
}

/// An argument made of `prefix` and a resolved path, e.g. `path_arg("-dir=", staging(""))`.
pub fn path_arg(prefix: impl Into<String>, path: PathRef) -> Arg {
    Arg::Path(PathArg { prefix: prefix.into(), path })
}
