//! Path references, arguments and values. Plans never hold absolute node paths nor secret
//! values: they name one of the volume's directories and a relative path inside it, or a
//! secret by its key, and the host resolves, checks and fills them in at execution time.

use crate::{Arg, DirRoot, FuseFdArg, FuseMount, HostFdMount, PathArg, PathRef, SecretFileArg, SecretTemplate, Value};

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
    path_arg_with_suffix(prefix, path, "")
}

/// An argument made of `prefix`, a resolved path and `suffix`, e.g.
/// `path_arg_with_suffix("lowerdir=", cache("l"), ",ro")`.
pub fn path_arg_with_suffix(prefix: impl Into<String>, path: PathRef, suffix: impl Into<String>) -> Arg {
    Arg::Path(PathArg { prefix: prefix.into(), path, suffix: suffix.into() })
}

/// A program argument naming a file that holds the CSI secret `key`, e.g.
/// `secret_file_arg("-oIdentityFile=", "sshKey", "")`. The host writes the file (mode 0600, on a
/// tmpfs, removed at unstage); the secret's value never appears in argv. Programs only: the
/// host refuses it in mount options.
pub fn secret_file_arg(prefix: impl Into<String>, key: impl Into<String>, suffix: impl Into<String>) -> Arg {
    Arg::SecretFile(SecretFileArg { prefix: prefix.into(), key: key.into(), suffix: suffix.into() })
}

/// The argument naming the FUSE connection the host mounted (`prefix` + `/dev/fd/3` + `suffix`),
/// for a `spawn-fuse` whose `mount` is [`host_fd`]; e.g. `fuse_fd_arg("", "")` where the program
/// expects its mountpoint.
pub fn fuse_fd_arg(prefix: impl Into<String>, suffix: impl Into<String>) -> Arg {
    Arg::FuseFd(FuseFdArg { prefix: prefix.into(), suffix: suffix.into() })
}

/// A `spawn-fuse` mount the host makes: it opens `/dev/fuse`, mounts it at the step's
/// mountpoint with the step's fstype (`fuse` or `fuse.<subtype>`), `source` as the mount
/// table's source and `options` (from `default_permissions`, `noexec`, `noatime`, `nodiratime`,
/// `relatime`, `strictatime`, `max_read=<bytes>`), and runs the program unprivileged with the
/// connection at [`fuse_fd_arg`]. Secret files then belong to that user and lie in the host's
/// FUSE files directory, named by absolute path.
pub fn host_fd(source: impl Into<String>, options: &[&str], readonly: bool) -> FuseMount {
    FuseMount::HostFd(HostFdMount {
        source: source.into(),
        options: options.iter().map(|o| o.to_string()).collect(),
        readonly,
    })
}

/// A plain text value.
pub fn literal(text: impl Into<String>) -> Value {
    Value::Literal(text.into())
}

/// The value of the CSI secret `key`.
pub fn secret(key: impl Into<String>) -> Value {
    Value::Secret(key.into())
}

/// The CSI secret `key` inside a text, e.g. `secret_template("Bearer ", "token", "")` for an
/// `Authorization` header.
pub fn secret_template(prefix: impl Into<String>, key: impl Into<String>, suffix: impl Into<String>) -> Value {
    Value::SecretTemplate(SecretTemplate { prefix: prefix.into(), key: key.into(), suffix: suffix.into() })
}

/// The absolute path of a path inside the volume (environment values only), e.g.
/// `path_value(cache("tmp"))` for `TMPDIR`.
pub fn path_value(path: PathRef) -> Value {
    Value::Path(path)
}

/// The path of a file holding the CSI secret `key` (environment values only), e.g. for
/// `GOOGLE_APPLICATION_CREDENTIALS`. Written by the host as for [`secret_file_arg`].
pub fn secret_file_value(key: impl Into<String>) -> Value {
    Value::SecretFile(key.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_arg_has_an_empty_suffix() {
        assert_eq!(path_arg("-dir=", staging("")), path_arg_with_suffix("-dir=", staging(""), ""));
        let Arg::Path(p) = path_arg_with_suffix("lowerdir=", cache("l"), ",ro") else { panic!("not a path") };
        assert_eq!((p.prefix.as_str(), p.path, p.suffix.as_str()), ("lowerdir=", cache("l"), ",ro"));
    }

    #[test]
    fn secrets_are_named_by_key() {
        let Arg::SecretFile(f) = secret_file_arg("-key=", "sshKey", ",x") else { panic!("not a secret file") };
        assert_eq!((f.prefix.as_str(), f.key.as_str(), f.suffix.as_str()), ("-key=", "sshKey", ",x"));
        let Value::SecretTemplate(t) = secret_template("Bearer ", "token", "") else { panic!("not a template") };
        assert_eq!((t.prefix.as_str(), t.key.as_str(), t.suffix.as_str()), ("Bearer ", "token", ""));
        assert_eq!(secret_file_value("creds"), Value::SecretFile("creds".into()));
        assert_eq!(path_value(runtime("x")), Value::Path(runtime("x")));
        assert_eq!((literal("a"), secret("k")), (Value::Literal("a".into()), Value::Secret("k".into())));
    }

    #[test]
    fn host_fd_mounts_name_their_connection() {
        assert_eq!(
            fuse_fd_arg("--mnt=", ""),
            Arg::FuseFd(FuseFdArg { prefix: "--mnt=".into(), suffix: String::new() })
        );
        let FuseMount::HostFd(m) = host_fd("u@h:/p", &["default_permissions"], true) else { panic!("not host-fd") };
        assert_eq!(
            (m.source.as_str(), m.options, m.readonly),
            ("u@h:/p", vec!["default_permissions".to_string()], true)
        );
    }
}
