//! The control protocol between the host daemon and a lazy volume's FUSE server
//! (`mounthost lazyfs`, [`crate::lazyfs`]): length-prefixed JSON frames over a unix stream
//! socket, with descriptors (`SCM_RIGHTS`) attached to a frame where it hands files over.
//!
//! The server listens on the socket the host bound in the volume's runtime directory and passed
//! it at start (descriptor [`CONTROL_FD`]); the host connects whenever it has none (after the
//! spawn, after a restart of either). Each connection starts with [`ToServer::Hello`], zero or
//! more [`ToServer::Files`], then [`ToServer::Settled`], which the server answers with
//! [`ToHost::Ready`]; from then on the host sends what changes (bytes that became readable, a
//! layer complete with its passthrough backing ids, a layer's files added, a failure) and the
//! server asks for the byte ranges its readers wait for ([`ToHost::Need`]).
//!
//! The server trusts nothing it did not get this way: it serves exactly the files of the table
//! it was sent, reads only the descriptors it was handed, and answers a read only from ranges
//! the host declared readable.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
};
use serde::{Deserialize, Serialize};

pub use crate::plan::CONTROL_FD;
/// The largest frame the server accepts (a file table of some hundred thousand files).
pub const MAX_FRAME: usize = 64 << 20;
/// The largest frame the host accepts from a server ([`recv_from_server`]): its messages are a
/// few numbers.
pub const MAX_FROM_SERVER: usize = 4 << 10;
/// The most descriptors one frame carries (the kernel's `SCM_MAX_FD` is 253).
pub const MAX_FDS: usize = 200;

/// A half-open byte range `[start, end)` of a layer's blob.
pub type Span = (u64, u64);

/// What the host tells the server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum ToServer {
    /// The first frame of a connection: the whole table, and what the host knows now.
    Hello(Hello),
    /// The data descriptors of these layers (read-only files: a blob, partial or complete, or
    /// an unpacked tree's directory), one per layer, attached in this order.
    Files { layers: Vec<u32> },
    /// The end of a connection's opening: the server answers [`ToHost::Ready`].
    Settled,
    /// These ranges of a layer's blob can be read (replaces what was said before of that layer).
    Readable { layer: u32, ranges: Vec<Span> },
    /// The layer's blob is complete and verified: every byte can be read. Files (by path) with
    /// a backing id the host registered on the FUSE connection are opened with passthrough from
    /// now on (of an image layer, also those the table gets later: a lower layer's files join
    /// it once the layers above it are known).
    Complete { layer: u32, backing: Vec<(String, u32)> },
    /// A layer whose files were not known at the start (a compressed archive) is unpacked:
    /// its files, whose data is in the tree directory handed over with [`ToServer::Files`].
    /// For image layers ([`LayerState::image`]): the whole merged table again, now reaching
    /// down to the next layer still pending (paths already served keep what they are; new
    /// ones join, directories take their owners and whether they are still open).
    Added { layer: u32, files: Vec<FileEntry> },
    /// These ranges failed verification twice: reads of them fail (EIO).
    Bad { layer: u32, ranges: Vec<Span> },
    /// The volume failed verification: every read fails (EIO) from now on.
    Failed { reason: String },
}

/// The opening of a connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hello {
    /// The volume (for the server's log lines).
    pub volume: String,
    /// Every file and directory, in the order later layers replace earlier ones. An opening
    /// after the first (the host restarted) adds what the server lacks (a layer unpacked
    /// meanwhile); what it has stays as it is.
    pub files: Vec<FileEntry>,
    /// The layers, by index.
    pub layers: Vec<LayerState>,
    /// How long a read waits for bytes that are not there before it fails (EIO).
    pub read_wait_ms: u64,
    /// The chunk a read asks for at least (aligned), and the read-ahead's unit.
    pub chunk: u64,
    /// Set when the volume has failed already.
    pub failed: Option<String>,
}

/// One layer as the server sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LayerState {
    /// The blob's size.
    pub size: u64,
    /// Readable ranges now.
    pub readable: Vec<Span>,
    /// Ranges that failed verification twice.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bad: Vec<Span>,
    /// Complete and verified.
    pub complete: bool,
    /// A compressed layer whose files appear once it is fetched and unpacked: the path its
    /// files go below (`""`: the root), so a lookup there waits for them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<String>,
    /// A container image's layer (`plan::tar_rules::image_layer`): the table the server gets
    /// is the layers merged as the image spec applies them (whiteouts applied, every path
    /// once, owners and modes), of the layers above the highest one still pending only, and
    /// its directories say whether a pending layer may still add to them
    /// ([`FileEntry::open`]): lookups and listings there wait, and nowhere else.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub image: bool,
}

/// A file, directory or symbolic link of the table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileEntry {
    /// Its path from the root, `/`-separated, without `.`, `..` or empty components.
    pub path: String,
    /// What it is.
    pub kind: Kind,
    /// Modification time, seconds since the epoch.
    #[serde(default)]
    pub mtime: i64,
    /// Its owner and mode (an image layer's entry); without one, the server shows files 0444,
    /// directories 0555, owned by root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Owner>,
    /// A directory to which a layer still pending may add entries ([`LayerState::image`]): a
    /// lookup of a name it lacks, and its listing, wait for that layer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub open: bool,
    /// An image layer's file: where its data starts in its layer's (uncompressed) archive.
    /// Files of one layer with the same one are one inode, hard links of each other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inode: Option<u64>,
}

/// An entry's owner and mode, from its tar header: numeric ids, and the permission bits with
/// the sticky bit (never set-uid or set-gid).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
    /// `st_mode & 0o1777`.
    pub mode: u32,
}

impl Owner {
    /// What a directory no entry gave gets (an implicit parent, the volume's root): 0755, root.
    pub const DIR: Owner = Owner { uid: 0, gid: 0, mode: 0o755 };
}

/// What an entry is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file of `size` bytes.
    File { size: u64, data: Data },
    /// A symbolic link: relative and inside the tree (the host checked), or for an image
    /// layer's, any target (never followed by the server: the kernel resolves it).
    Symlink { target: String },
}

/// Where a file's bytes are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum Data {
    /// In the layer's blob from `offset` (a raw layer at 0, a tar member after its header).
    Blob { layer: u32, offset: u64 },
    /// In the layer's unpacked tree, at `rel` below the directory handed over for it.
    Tree { layer: u32, rel: String },
}

impl Data {
    /// The layer the bytes are in.
    pub fn layer(&self) -> u32 {
        match self {
            Data::Blob { layer, .. } | Data::Tree { layer, .. } => *layer,
        }
    }
}

/// What the server tells the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum ToHost {
    /// The opening was applied.
    Ready { files: u32 },
    /// A reader waits for (`urgent`), or a sequential reader will soon want, this range.
    Need { layer: u32, start: u64, end: u64, urgent: bool },
}

/// Send one frame, with `fds` attached (at most [`MAX_FDS`]), waiting for room (up to the
/// socket's write timeout; after a timeout the stream is out of step and is dropped).
pub fn send<T: Serialize>(sock: &UnixStream, msg: &T, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let flags = SendFlags::NOSIGNAL;
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} descriptors in one frame", fds.len())));
    }
    let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
    if body.len() > MAX_FRAME {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("a frame of {} bytes", body.len())));
    }
    let head = (body.len() as u32).to_le_bytes();
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("the descriptors do not fit the control buffer"));
    }
    // The descriptors travel with the frame's first bytes; what the first call did not take
    // follows without them.
    let sent = rustix::net::sendmsg(sock, &[IoSlice::new(&head), IoSlice::new(&body)], &mut control, flags)?;
    let mut rest: Vec<u8> = head.iter().chain(body.iter()).copied().skip(sent).collect();
    while !rest.is_empty() {
        let n = rustix::net::send(sock, &rest, flags)?;
        rest.drain(..n);
    }
    Ok(())
}

/// Receive one frame from a server, which is not trusted: at most [`MAX_FROM_SERVER`] bytes,
/// and no descriptors (the receive has no room for them, so the kernel closes any sent; a frame
/// that came with some ends the connection).
pub fn recv_from_server<T: for<'de> Deserialize<'de>>(sock: &UnixStream) -> io::Result<Option<T>> {
    let mut head = [0u8; 4];
    if !read_exact(sock, &mut head, None, true)? {
        return Ok(None);
    }
    let len = u32::from_le_bytes(head) as usize;
    if len > MAX_FROM_SERVER {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a frame of {len} bytes from the server")));
    }
    let mut body = vec![0u8; len];
    if !read_exact(sock, &mut body, None, false)? {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the stream ended inside a frame"));
    }
    serde_json::from_slice(&body).map(Some).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Receive one frame and the descriptors attached to it; `None` at the end of the stream.
pub fn recv<T: for<'de> Deserialize<'de>>(sock: &UnixStream) -> io::Result<Option<(T, Vec<OwnedFd>)>> {
    let mut fds = Vec::new();
    let mut head = [0u8; 4];
    if !read_exact(sock, &mut head, Some(&mut fds), true)? {
        return Ok(None);
    }
    let len = u32::from_le_bytes(head) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a frame of {len} bytes")));
    }
    let mut body = vec![0u8; len];
    if !read_exact(sock, &mut body, Some(&mut fds), false)? {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the stream ended inside a frame"));
    }
    let msg = serde_json::from_slice(&body).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok(Some((msg, fds)))
}

/// Fill `buf`, collecting any descriptors into `fds`; with no `fds`, the receive has no room
/// for any (the kernel closes them) and one that came with some is an error. False if the
/// stream ended before the first byte (when `at_start`).
fn read_exact(
    sock: &UnixStream,
    buf: &mut [u8],
    mut fds: Option<&mut Vec<OwnedFd>>,
    at_start: bool,
) -> io::Result<bool> {
    let room = if fds.is_some() { rustix::cmsg_space!(ScmRights(MAX_FDS)) } else { 0 };
    let mut at = 0;
    while at < buf.len() {
        let mut space = vec![MaybeUninit::uninit(); room];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let got = match rustix::net::recvmsg(
            sock.as_fd(),
            &mut [IoSliceMut::new(&mut buf[at..])],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(r) if fds.is_none() && r.flags.contains(rustix::net::ReturnFlags::CTRUNC) => {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "descriptors came where none are taken"));
            }
            Ok(r) => r.bytes,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        for m in control.drain() {
            if let (RecvAncillaryMessage::ScmRights(received), Some(fds)) = (m, fds.as_deref_mut()) {
                fds.extend(received);
            }
        }
        if got == 0 {
            if at == 0 && at_start {
                return Ok(false);
            }
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the stream ended inside a frame"));
        }
        at += got;
    }
    Ok(true)
}

/// `ranges` (sorted or not, overlapping or not) cover `[start, end)`?
pub fn covers(ranges: &[Span], start: u64, end: u64) -> bool {
    if start >= end {
        return true;
    }
    let mut sorted: Vec<Span> = ranges.iter().copied().filter(|(a, b)| a < b).collect();
    sorted.sort_unstable();
    let mut at = start;
    for (a, b) in sorted {
        if a > at {
            break;
        }
        at = at.max(b);
        if at >= end {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::FileExt;

    #[test]
    fn frames_carry_messages_and_descriptors_in_order() {
        let (a, b) = UnixStream::pair().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::File::create(&path).unwrap().write_all(b"payload").unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let hello = ToServer::Hello(Hello {
            volume: "v".into(),
            files: vec![FileEntry {
                path: "w.bin".into(),
                kind: Kind::File { size: 7, data: Data::Blob { layer: 0, offset: 0 } },
                mtime: 1,
                owner: None,
                open: false,
                inode: None,
            }],
            layers: vec![LayerState {
                size: 7,
                readable: vec![(0, 3)],
                bad: vec![],
                complete: false,
                pending: None,
                image: false,
            }],
            read_wait_ms: 1000,
            chunk: 4 << 20,
            failed: None,
        });
        send(&a, &hello, &[]).unwrap();
        send(&a, &ToServer::Files { layers: vec![0] }, &[file.as_fd()]).unwrap();
        send(&a, &ToServer::Settled, &[]).unwrap();
        drop(a);
        let (got, fds): (ToServer, _) = recv(&b).unwrap().unwrap();
        assert_eq!(got, hello);
        assert!(fds.is_empty());
        let (got, fds): (ToServer, _) = recv(&b).unwrap().unwrap();
        assert_eq!(got, ToServer::Files { layers: vec![0] });
        assert_eq!(fds.len(), 1);
        let mut buf = [0u8; 7];
        std::fs::File::from(fds.into_iter().next().unwrap()).read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"payload", "the descriptor is the file");
        let (got, _): (ToServer, _) = recv(&b).unwrap().unwrap();
        assert_eq!(got, ToServer::Settled);
        assert!(recv::<ToServer>(&b).unwrap().is_none(), "the end of the stream");
    }

    #[test]
    fn a_frame_cut_off_or_too_large_is_an_error() {
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(&100u32.to_le_bytes()).unwrap();
        (&a).write_all(b"{\"settled\"").unwrap();
        drop(a);
        assert!(recv::<ToServer>(&b).is_err());
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(&(MAX_FRAME as u32 + 1).to_le_bytes()).unwrap();
        assert_eq!(recv::<ToServer>(&b).unwrap_err().kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn what_a_server_sends_is_small_and_carries_no_descriptors() {
        let need = ToHost::Need { layer: 0, start: 0, end: 4096, urgent: true };
        let (a, b) = UnixStream::pair().unwrap();
        send(&a, &need, &[]).unwrap();
        assert_eq!(recv_from_server::<ToHost>(&b).unwrap(), Some(need.clone()));
        // A frame past the bound, and one with a descriptor attached, end the conversation.
        (&a).write_all(&(MAX_FROM_SERVER as u32 + 1).to_le_bytes()).unwrap();
        assert_eq!(recv_from_server::<ToHost>(&b).unwrap_err().kind(), io::ErrorKind::InvalidData);
        let (a, b) = UnixStream::pair().unwrap();
        let file = tempfile::tempfile().unwrap();
        send(&a, &need, &[file.as_fd(), file.as_fd()]).unwrap();
        let err = recv_from_server::<ToHost>(&b).unwrap_err();
        assert!(err.to_string().contains("descriptors"), "{err}");
        assert_eq!(count_fds_to(&file), 1, "the descriptors sent were not kept");
    }

    /// How many descriptors of this process name `file`'s inode.
    fn count_fds_to(file: &std::fs::File) -> usize {
        use std::os::unix::fs::MetadataExt;
        let ino = file.metadata().unwrap().ino();
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .filter(|e| std::fs::metadata(e.path()).is_ok_and(|m| m.ino() == ino))
            .count()
    }

    #[test]
    fn coverage_of_ranges() {
        assert!(covers(&[(0, 10)], 2, 5));
        assert!(covers(&[(5, 10), (0, 5)], 0, 10), "touching ranges join");
        assert!(!covers(&[(0, 4), (5, 10)], 0, 10), "a hole");
        assert!(covers(&[], 3, 3), "an empty range");
        assert!(!covers(&[(0, 10)], 5, 11));
    }
}
