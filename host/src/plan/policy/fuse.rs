//! `spawn-fuse` steps whose filesystem the host mounts itself (WIT `fuse-mount.host-fd`): the
//! program then runs unprivileged and finds its connection only through a `fuse-fd` argument,
//! so a plan has that argument exactly when it asks for the host's mount. The mount is a
//! kernel `fuse` mount the plan describes with text the host checks here: the fstype (`fuse`
//! or `fuse.<subtype>`, granted like any other), the source the mount table shows, and options
//! from a fixed list. `fd`, `rootmode`, `user_id`, `group_id` and `allow_other` are the
//! host's, never the plan's.

use super::{Context, R, text, token};
use crate::plan::{HostMount, SpawnArg};
use crate::plugin::bindings::types as wit;

/// FUSE mount options a `host-fd` plan may add (besides `max_read=<bytes>`). `noexec` and the
/// atime ones are mount(2) flags, which the executor passes as such (`exec::mount`).
pub const HOST_MOUNT_OPTIONS: &[&str] =
    &["default_permissions", "noexec", "noatime", "nodiratime", "relatime", "strictatime"];
/// Bounds of `max_read=` in bytes.
const MAX_READ: std::ops::RangeInclusive<u64> = 4096..=(16 << 20);
/// Longest mount source.
const MAX_SOURCE: usize = 256;

/// A `fuse-fd` argument.
pub(super) fn fd_arg(ctx: &Context<'_>, f: &wit::FuseFdArg) -> R<SpawnArg> {
    text(ctx, &f.prefix, "argument")?;
    text(ctx, &f.suffix, "argument")?;
    Ok(SpawnArg::FuseFd { prefix: f.prefix.clone(), suffix: f.suffix.clone() })
}

/// The mount of a spawn, checked against its fstype and its (already checked) arguments.
pub(super) fn host_mount(
    ctx: &Context<'_>,
    mount: wit::FuseMount,
    fstype: &str,
    args: &[SpawnArg],
) -> R<Option<HostMount>> {
    let names_fd = args.iter().any(|a| matches!(a, SpawnArg::FuseFd { .. }));
    let m = match mount {
        wit::FuseMount::ByProgram if names_fd => {
            return Err("a fuse-fd argument names the connection of a host-fd mount, and this spawn-fuse's program \
                        mounts its filesystem itself (fuse-mount.by-program)"
                .into());
        }
        wit::FuseMount::ByProgram => return Ok(None),
        wit::FuseMount::HostFd(m) => m,
    };
    if !names_fd {
        return Err("a host-fd mount needs a fuse-fd argument: the program finds its mounted connection only \
                    through it (/dev/fd/3)"
            .into());
    }
    if !(fstype == "fuse" || fstype.strip_prefix("fuse.").is_some_and(|sub| !sub.is_empty() && token(sub))) {
        return Err(format!(
            "fstype {fstype:?} of a host-fd mount must be \"fuse\" or \"fuse.<subtype>\" (the host mounts a FUSE \
             connection)"
        ));
    }
    // First: the refusal below shows the source.
    text(ctx, &m.source, "the mount source")?;
    let printable = m.source.bytes().all(|b| b.is_ascii_graphic() && b != b',');
    if m.source.is_empty() || m.source.len() > MAX_SOURCE || !printable || m.source.starts_with('/') {
        return Err(format!(
            "mount source {:?} must be 1 to {MAX_SOURCE} printable ASCII characters without spaces or commas, \
             not starting with '/' (it is a name, such as user@host:/path)",
            m.source
        ));
    }
    for o in &m.options {
        let max_read = o.strip_prefix("max_read=").map(|n| n.parse::<u64>().ok().filter(|n| MAX_READ.contains(n)));
        match max_read {
            Some(Some(_)) => {}
            Some(None) => {
                return Err(format!(
                    "FUSE mount option {o:?}: max_read must be a number of bytes from {} to {}",
                    MAX_READ.start(),
                    MAX_READ.end()
                ));
            }
            None if HOST_MOUNT_OPTIONS.contains(&o.as_str()) => {}
            None => {
                return Err(format!(
                    "FUSE mount option {o:?} is not allowed; allowed: {}, max_read=<bytes> (fd, rootmode, user_id, \
                     group_id and allow_other are the host's)",
                    HOST_MOUNT_OPTIONS.join(", ")
                ));
            }
        }
    }
    Ok(Some(HostMount { source: m.source, options: m.options, readonly: m.readonly }))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use super::super::{Grant, Operation, check};
    use super::*;
    use crate::plan::Step;
    use crate::plugin::bindings::types::{self as w, DirRoot};
    use crate::secrets::Secrets;
    use crate::volume::VolumeDirs;

    fn p(root: DirRoot, rel: &str) -> w::PathRef {
        w::PathRef { root, rel: rel.into() }
    }

    fn fd(prefix: &str) -> w::Arg {
        w::Arg::FuseFd(w::FuseFdArg { prefix: prefix.into(), suffix: String::new() })
    }

    fn host_fd(source: &str, options: &[&str]) -> w::FuseMount {
        w::FuseMount::HostFd(w::HostFdMount {
            source: source.into(),
            options: options.iter().map(|o| o.to_string()).collect(),
            readonly: true,
        })
    }

    fn spawn(fstype: &str, args: Vec<w::Arg>, mount: w::FuseMount) -> w::Step {
        w::Step::SpawnFuse(w::SpawnFuse {
            program: "sshfs".into(),
            args,
            env: vec![],
            mountpoint: p(DirRoot::Staging, ""),
            fstype: fstype.into(),
            ready_timeout_ms: 1000,
            memory_limit_bytes: None,
            mount,
        })
    }

    fn check_one(step: w::Step) -> Result<Step, String> {
        let grant = Grant {
            programs: ["sshfs".to_string()].into(),
            fstypes: ["fuse.sshfs".to_string(), "fuse".to_string(), "fuseblk".to_string()].into(),
            hosts: Default::default(),
        };
        let programs: BTreeMap<String, PathBuf> = [("sshfs".to_string(), PathBuf::from("/usr/bin/sshfs"))].into();
        let dirs = VolumeDirs {
            staging: Some("/k/plugins/x/globalmount".into()),
            target: None,
            cache: Some("/s/cache/ab".into()),
            runtime: Some("/s/run/ab".into()),
            fuse_files: Some("/f/ab".into()),
        };
        let secrets: Secrets = [("sshKey".to_string(), "PRIVATEKEY".to_string())].into_iter().collect();
        let ctx = Context {
            operation: Operation::Stage,
            plugin: "sshfs",
            digest: "sha256:00".into(),
            grant: &grant,
            programs: &programs,
            program_args: &Default::default(),
            rules: &Default::default(),
            endpoint_hosts: Default::default(),
            dirs: &dirs,
            secrets: &secrets,
        };
        check(&ctx, w::Plan { steps: vec![step], attributes: vec![] })
            .map(|mut plan| plan.steps.remove(0))
            .map_err(|e| e.reason)
    }

    #[test]
    fn a_host_fd_spawn_is_resolved() {
        let args = vec![w::Arg::Literal("u@h:/p".into()), fd(""), w::Arg::Literal("-f".into())];
        let step = check_one(spawn("fuse.sshfs", args, host_fd("u@h:/p", &["default_permissions", "max_read=65536"])))
            .unwrap();
        let Step::SpawnFuse { args, host_mount, .. } = step else { panic!("{step:?}") };
        assert_eq!(args[1], SpawnArg::FuseFd { prefix: String::new(), suffix: String::new() });
        assert_eq!(args[1].render(std::path::Path::new("/r")), "/dev/fd/3");
        assert_eq!(
            host_mount,
            Some(HostMount {
                source: "u@h:/p".into(),
                options: vec!["default_permissions".into(), "max_read=65536".into()],
                readonly: true
            })
        );
    }

    #[test]
    fn a_host_fd_spawn_without_its_argument_or_an_argument_without_it_is_refused() {
        let err = check_one(spawn("fuse.sshfs", vec![], host_fd("src", &[]))).unwrap_err();
        assert!(err.contains("needs a fuse-fd argument"), "{err}");
        let err = check_one(spawn("fuse.sshfs", vec![fd("")], w::FuseMount::ByProgram)).unwrap_err();
        assert!(err.contains("mounts its filesystem itself"), "{err}");
        assert!(check_one(spawn("fuse.sshfs", vec![], w::FuseMount::ByProgram)).is_ok());
    }

    #[test]
    fn fstype_source_and_options_are_checked() {
        let ok = |fstype: &str, source: &str, options: &[&str]| {
            check_one(spawn(fstype, vec![fd("")], host_fd(source, options)))
        };
        assert!(ok("fuse", "src", &[]).is_ok());
        assert!(ok("fuseblk", "src", &[]).unwrap_err().contains("must be \"fuse\" or"));
        for bad in ["", "a b", "a,b", "x\n", "/etc", &"s".repeat(257)] {
            assert!(ok("fuse.sshfs", bad, &[]).unwrap_err().contains("printable ASCII"), "{bad:?}");
        }
        let leak = ok("fuse.sshfs", "PRIVATEKEY", &[]).unwrap_err();
        assert!(leak.contains("secret \"sshKey\"") && !leak.contains("PRIVATEKEY"), "{leak}");
        for bad in ["allow_other", "user_id=0", "fd=4", "rootmode=100000", "suid", "dev", "max_read=1", "max_read=x"] {
            assert!(ok("fuse.sshfs", "src", &[bad]).is_err(), "{bad}");
        }
        // A mount option is never a fuse-fd argument.
        let mount = w::Step::Mount(w::Mount {
            fstype: "fuse".into(),
            source: w::MountSource::Named("x".into()),
            target: p(DirRoot::Staging, ""),
            options: vec![fd("fd=")],
            readonly: false,
        });
        assert!(check_one(mount).unwrap_err().contains("fuse-fd"));
    }
}
