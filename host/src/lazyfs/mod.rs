//! `mounthost lazyfs`: the FUSE server of a lazy model volume, the host's own (docs/lazy.md).
//!
//! The host daemon opens `/dev/fuse`, mounts the connection read-only at the volume's
//! directory and starts this program as the volume's unprivileged FUSE user, in the volume's
//! cgroup, with two descriptors: the connection ([`crate::plan::FUSE_FD`]) and a listening unix
//! socket in the volume's runtime directory ([`CONTROL_FD`]). Over that socket the host sends
//! the file table, read-only descriptors of the layers' blobs (partial while the fill goes on)
//! and, as it learns them, which byte ranges can be read; this process answers the kernel's
//! requests from them and asks the host for the ranges its readers wait for
//! ([`crate::unpriv::lazy_wire`]).
//!
//! It has no network, no credentials and no path into the node's cache: it reads only the
//! descriptors it was handed, and only the ranges the host declared readable (a compressed
//! layer's unpacked tree is handed as a directory descriptor: a container image's tree keeps
//! the image's modes, so an entry the image made world-writable is writable through it). A
//! read whose
//! bytes do not arrive within the read wait fails with EIO instead of hanging. Once a file's
//! blob is complete and verified, the host registers it as the file's passthrough backing on
//! this connection, and the kernel serves later opens of it without this process.
//!
//! The process may be killed at any time: the kernel connection dies with it, the host sees
//! the exit, mounts a new connection, starts it again and tells it everything again; nothing
//! it holds is lost.

mod control;
mod fs;
mod state;
mod table;

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixListener;

pub use crate::unpriv::lazy_wire::CONTROL_FD;

/// FUSE worker threads: readers blocked on bytes still coming hold one each.
const THREADS: usize = 16;

/// Serve the lazy filesystem on the connection `fuse` (already mounted by the host), taking
/// the host's connections on `control`. Returns when the connection ends (unmounted).
pub fn serve(fuse: OwnedFd, control: OwnedFd) -> io::Result<()> {
    let listener = UnixListener::from(control);
    let shared = state::Shared::new();
    let mut config = fuser::Config::default();
    config.n_threads = Some(THREADS);
    let session = fuser::Session::from_fd(fs::LazyFs::new(shared.clone()), fuse, fuser::SessionACL::All, config)?;
    let notifier = session.notifier();
    std::thread::Builder::new()
        .name("lazy-control".into())
        .spawn(move || control::accept(listener, shared, notifier))?;
    session.run()
}
