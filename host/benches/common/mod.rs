//! Shared by the privileged benchmarks.

use std::process::Command;

const INSIDE: &str = "MOUNTHOST_BENCH_IN_NAMESPACE";

/// Re-run this benchmark in a private mount namespace (`unshare --mount --propagation
/// private`) unless already there; returns only inside it. Nothing it mounts is visible
/// outside, and everything dies with the namespace.
pub fn enter_private_namespace() {
    if std::env::var_os(INSIDE).is_some() {
        return;
    }
    let status = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--"])
        .arg(std::env::current_exe().unwrap())
        .args(std::env::args().skip(1))
        .env(INSIDE, "1")
        .status()
        .expect("running unshare (needs root and util-linux)");
    std::process::exit(status.code().unwrap_or(1));
}

/// Detach everything mounted below `dir` (deepest first), before its temporary directory goes.
pub fn unmount_below(dir: &std::path::Path) {
    let mut left: Vec<_> = mounthost::exec::mountinfo::read()
        .unwrap_or_default()
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(dir))
        .collect();
    left.sort();
    for m in left.iter().rev() {
        let _ = nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Remove the FUSE files directory (`/run/mounthost/fuse-<hash>`) a daemon with state directory
/// `state` made: a daemon killed with SIGKILL cannot. `/run` is the machine's, so the directory
/// outlives this namespace. The node's default directory is never touched.
#[allow(dead_code, reason = "publish.rs runs its daemon in this process, which makes no such directory")]
pub fn remove_fuse_files_dir(state: &std::path::Path) {
    let state = std::fs::canonicalize(state).unwrap_or_else(|_| state.to_path_buf());
    let dir = mounthost::config::Config::new(state).fuse_files();
    if dir != std::path::Path::new(mounthost::config::DEFAULT_FUSE_FILES_DIR) {
        let _ = mounthost::exec::Linux::remove_unused_root(&dir);
    }
}
