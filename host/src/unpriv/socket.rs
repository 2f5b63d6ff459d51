//! Unix socket listeners: private (0600) and safe against a stale socket file.
//!
//! A socket file left by a crashed server is replaced; one that still answers belongs to a
//! running server and is never stolen; anything that is not a socket is never removed.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;

use tokio::net::UnixListener;

/// Bind a listener at `path` with mode 0600 (its directory is created 0700 if missing).
pub fn listen(path: &Path) -> io::Result<UnixListener> {
    listen_for(path, None)
}

/// Bind a listener at `path`: mode 0600, or 0660 in `group` when one is given (its directory,
/// if missing, is created 0700, or 0750 in `group`), so only root and that group may connect.
pub fn listen_for(path: &Path, group: Option<u32>) -> io::Result<UnixListener> {
    if path.as_os_str().len() >= 108 {
        return Err(io::Error::other(format!(
            "socket path {} is longer than the 107 bytes unix sockets allow",
            path.display()
        )));
    }
    if let Some(dir) = path.parent()
        && !dir.exists()
    {
        crate::unpriv::private_files::private_dir(dir)?;
        if let Some(gid) = group {
            std::os::unix::fs::lchown(dir, None, Some(gid))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o750))?;
        }
    }
    if let Some(gid) = group {
        group_can_reach(path, gid)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{} is served by a running process; stop it first", path.display()),
                ));
            }
            crate::unpriv::private_files::remove_file(path)?;
        }
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket; refusing to replace it", path.display()),
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    match group {
        None => std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?,
        Some(gid) => {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
            std::os::unix::fs::lchown(path, None, Some(gid))?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
        }
    }
    Ok(listener)
}

/// Every directory above `path` must let members of `gid` pass (search permission for the
/// group or for everyone); else the group's socket is out of their reach and saying so at
/// start beats a front that cannot connect.
fn group_can_reach(path: &Path, gid: u32) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    for dir in path.ancestors().skip(1).filter(|d| !d.as_os_str().is_empty()) {
        let meta = std::fs::metadata(dir)?;
        let mode = meta.mode();
        if mode & 0o001 == 0 && !(meta.gid() == gid && mode & 0o010 != 0) {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "the host socket's group {gid} cannot reach {}: {} is mode {:o}, owned by group {}; put the socket in a directory of its own (e.g. --host-socket /run/mounthost/host.sock), not in the state directory",
                    path.display(),
                    dir.display(),
                    mode & 0o777,
                    meta.gid()
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stale_sockets_are_replaced_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.sock");
        let live = listen(&p).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(listen(&p).unwrap_err().kind(), io::ErrorKind::AddrInUse);
        drop(live);
        // The file stays after the listener is gone: a stale socket.
        assert!(p.exists());
        let _again = listen(&p).expect("a stale socket is replaced");
        let f = dir.path().join("file");
        std::fs::write(&f, b"x").unwrap();
        assert_eq!(listen(&f).unwrap_err().kind(), io::ErrorKind::AlreadyExists);
        assert!(f.exists());
    }

    #[tokio::test]
    async fn a_socket_for_a_group_is_0660_in_that_group() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        // Like /run: everyone may pass (a temporary directory is 0700).
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let p = dir.path().join("run/host.sock");
        let gid = 4242;
        let _l = listen_for(&p, Some(gid)).unwrap();
        let sock = std::fs::metadata(&p).unwrap();
        assert_eq!((sock.mode() & 0o777, sock.gid()), (0o660, gid));
        let parent = std::fs::metadata(p.parent().unwrap()).unwrap();
        assert_eq!((parent.mode() & 0o777, parent.gid()), (0o750, gid));
        // In a private directory (the state directory is 0700) the group could never connect.
        let private = dir.path().join("state");
        std::fs::create_dir(&private).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        let err = listen_for(&private.join("host.sock"), Some(gid)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        assert!(err.to_string().contains("is mode 700"), "{err}");
        assert!(!private.join("host.sock").exists(), "refused before binding");
    }
}
