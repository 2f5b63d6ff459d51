//! The host's side of a lazy volume's FUSE server (`mounthost lazyfs`, docs/lazy.md): what it
//! sends the server over its control socket ([`crate::unpriv::lazy_wire`]), and the one
//! privileged act of the conversation, registering a complete file as a passthrough backing
//! file on the server's FUSE connection ([`backing_open`]), which needs CAP_SYS_ADMIN.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use super::process::{self, ProcessId};
use crate::unpriv::lazy_wire::{self, Hello, MAX_FDS, ToHost, ToServer};

/// The opening of a conversation: the table and what is known, and one read-only descriptor
/// per layer that has one.
#[derive(Debug)]
pub struct Opening {
    pub hello: Hello,
    /// `(layer, its data)`: a blob (partial or complete) or an unpacked tree's directory.
    pub files: Vec<(u32, File)>,
}

impl Opening {
    /// [`Opening::send`] as the executor's spawn takes it ([`super::Control::opening`]).
    pub fn sender(&self) -> impl Fn(&UnixStream) -> io::Result<()> + Sync + '_ {
        move |conn| self.send(conn)
    }

    /// Send it on `conn` and wait for the server's readiness (the connection's timeouts bound
    /// the wait).
    pub fn send(&self, conn: &UnixStream) -> io::Result<()> {
        lazy_wire::send(conn, &ToServer::Hello(self.hello.clone()), &[])?;
        for batch in self.files.chunks(MAX_FDS) {
            let layers: Vec<u32> = batch.iter().map(|(l, _)| *l).collect();
            let fds: Vec<BorrowedFd<'_>> = batch.iter().map(|(_, f)| f.as_fd()).collect();
            lazy_wire::send(conn, &ToServer::Files { layers }, &fds)?;
        }
        lazy_wire::send(conn, &ToServer::Settled, &[])?;
        loop {
            match lazy_wire::recv_from_server::<ToHost>(conn)? {
                Some(ToHost::Ready { .. }) => return Ok(()),
                // A reader's request before the answer: the session asks again for it.
                Some(ToHost::Need { .. }) => {}
                None => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the server closed the connection")),
            }
        }
    }
}

/// A file handed to a server with a message (an unpacked tree's directory).
pub type Handed = File;

/// An open conversation with a server (after its opening). Clones share the connection.
#[derive(Debug, Clone)]
pub struct Link {
    conn: std::sync::Arc<UnixStream>,
}

/// How long one message may wait for a server to take it; past it the conversation ends.
const SEND_WAIT: Duration = Duration::from_secs(10);

impl Link {
    /// Take over a connection `opening` was sent on.
    pub fn new(conn: UnixStream) -> io::Result<Link> {
        conn.set_read_timeout(None)?;
        conn.set_write_timeout(Some(SEND_WAIT))?;
        Ok(Link { conn: std::sync::Arc::new(conn) })
    }

    /// Send one message, with `files` attached. Blocking, for up to [`SEND_WAIT`] when the
    /// server does not read; after any error the caller ends the conversation (the stream may
    /// be out of step).
    pub fn send(&self, msg: &ToServer, files: &[&File]) -> io::Result<()> {
        let fds: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
        lazy_wire::send(&self.conn, msg, &fds)
    }

    /// [`Link::send`] on the blocking pool, for the async side: a server that does not read
    /// holds up only its own conversation.
    pub async fn send_later(&self, msg: ToServer, files: Vec<Handed>) -> io::Result<()> {
        let link = self.clone();
        tokio::task::spawn_blocking(move || {
            let refs: Vec<&File> = files.iter().collect();
            link.send(&msg, &refs)
        })
        .await
        .map_err(io::Error::other)?
    }

    /// Read the server's messages on a thread of their own, handing each to `each` until the
    /// connection ends or breaks the protocol (then `each` gets `None`). `each` may block: the
    /// server then waits to send more.
    pub fn read_on_thread(&self, each: impl Fn(Option<ToHost>) + Send + 'static) -> io::Result<()> {
        let conn = self.conn.try_clone()?;
        std::thread::Builder::new().name("mh-lazy-read".into()).spawn(move || {
            loop {
                match lazy_wire::recv_from_server::<ToHost>(&conn) {
                    Ok(Some(m)) => each(Some(m)),
                    Ok(None) | Err(_) => {
                        each(None);
                        let _ = conn.shutdown(std::net::Shutdown::Both);
                        return;
                    }
                }
            }
        })?;
        Ok(())
    }

    /// End the conversation (the reading thread gets `None`).
    pub fn close(&self) {
        let _ = self.conn.shutdown(std::net::Shutdown::Both);
    }
}

/// `FUSE_DEV_IOC_BACKING_OPEN`: `_IOW(229, 1, struct fuse_backing_map)` (16 bytes).
const BACKING_OPEN: u64 = 0x4010_E501;
/// `/dev/fuse`'s device number (major 10, minor 229).
const FUSE_DEV: (u32, u32) = (10, 229);

/// The kernel's `struct fuse_backing_map`.
#[repr(C)]
struct BackingMap {
    fd: i32,
    flags: u32,
    padding: u64,
}

/// Register each of `files` as a passthrough backing file on the FUSE connection of the
/// server `server` (its descriptor [`crate::plan::FUSE_FD`], taken with `pidfd_getfd`), and
/// return their backing ids in order. The server answers an open of the file with its id
/// (`FOPEN_PASSTHROUGH`), and the kernel reads the file itself from then on. Ids live as long
/// as the connection. Fails when the process is not the one recorded any more, its descriptor
/// is not a FUSE connection, or the kernel refuses (no passthrough: before Linux 6.9, or not
/// accepted at the connection's start).
pub fn backing_open(server: &ProcessId, files: &[&File]) -> io::Result<Vec<u32>> {
    let pid = rustix::process::Pid::from_raw(server.pid)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "pid 0"))?;
    let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())?;
    // The pidfd pins this very process; it is the recorded one if its start time still is.
    if !process::is_alive(server) {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("process {} is not the lazy server any more", server.pid),
        ));
    }
    let dev: OwnedFd =
        rustix::process::pidfd_getfd(&pidfd, crate::plan::FUSE_FD, rustix::process::PidfdGetfdFlags::empty())?;
    let st = rustix::fs::fstat(&dev)?;
    let rdev = (rustix::fs::major(st.st_rdev), rustix::fs::minor(st.st_rdev));
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::CharacterDevice || rdev != FUSE_DEV {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("descriptor {} of process {} is not a FUSE connection", crate::plan::FUSE_FD, server.pid),
        ));
    }
    files.iter().map(|f| open_one(&dev, f)).collect()
}

#[allow(unsafe_code)]
fn open_one(dev: &OwnedFd, file: &File) -> io::Result<u32> {
    let map = BackingMap { fd: file.as_raw_fd(), flags: 0, padding: 0 };
    // SAFETY: FUSE_DEV_IOC_BACKING_OPEN reads a `struct fuse_backing_map` (16 bytes, laid out
    // as `BackingMap`) through the pointer, which stays valid for the call; `dev` is a FUSE
    // device (checked by the caller) and `file` an open descriptor, both borrowed for the call.
    let id = unsafe { nix::libc::ioctl(dev.as_raw_fd(), BACKING_OPEN as _, &map as *const BackingMap) };
    if id < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(id as u32)
}
