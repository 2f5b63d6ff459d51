//! The host's side of the conversation, as the server takes it: each connection opens with the
//! table and the layers' descriptors, then brings what changes. Connections are served at once
//! (the host's readiness check and its running session may overlap); requests for bytes go to
//! the newest.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::Duration;

use super::state::Shared;
use super::table::Table;
use crate::unpriv::lazy_wire::{self, ToHost, ToServer};

/// Take connections for the life of the process.
pub fn accept(listener: UnixListener, shared: Arc<Shared>, notifier: fuser::Notifier) {
    let notifier = Arc::new(notifier);
    for conn in listener.incoming() {
        match conn {
            Ok(conn) => {
                let (shared, notifier) = (shared.clone(), notifier.clone());
                let _ =
                    std::thread::Builder::new().name("lazy-host".into()).spawn(move || serve(conn, &shared, &notifier));
            }
            Err(e) => {
                tracing::warn!(error = %e, "accepting the host's connection failed");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// One connection, until it ends.
fn serve(conn: UnixStream, shared: &Arc<Shared>, notifier: &fuser::Notifier) {
    loop {
        let (msg, fds) = match lazy_wire::recv::<ToServer>(&conn) {
            Ok(Some(m)) => m,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "the host's connection failed");
                return;
            }
        };
        if let Err(e) = apply(&conn, shared, notifier, msg, fds) {
            tracing::warn!(error = %e, "a message of the host could not be applied; dropping its connection");
            return;
        }
    }
}

fn apply(
    conn: &UnixStream,
    shared: &Arc<Shared>,
    notifier: &fuser::Notifier,
    msg: ToServer,
    fds: Vec<OwnedFd>,
) -> std::io::Result<()> {
    let mut g = shared.lock();
    // Inodes whose attributes changed (an image's directory a lower layer gave its owner).
    let mut changed = Vec::new();
    match msg {
        ToServer::Hello(hello) => {
            let image = hello.layers.iter().any(|l| l.image);
            match g.table.as_mut() {
                None => {
                    tracing::info!(volume = %hello.volume, entries = hello.files.len(), layers = hello.layers.len(), "table received");
                    g.table = Some(Table::new(&hello.files));
                }
                // A later opening (the host restarted): what the kernel may hold stays as it is,
                // files the server lacks (a layer unpacked meanwhile) join; an image's
                // directories take what the host says of them now.
                Some(t) if image => changed = t.refresh(&hello.files),
                Some(t) => {
                    let new: Vec<_> = hello.files.iter().filter(|e| t.by_path(&e.path).is_none()).cloned().collect();
                    if !new.is_empty() {
                        tracing::info!(volume = %hello.volume, entries = new.len(), "entries added");
                        t.add(&new);
                    }
                }
            }
            Shared::set_layers(&mut g, hello.layers);
            g.place_unplaced();
            g.read_wait = Duration::from_millis(hello.read_wait_ms.clamp(100, 600_000));
            g.chunk = hello.chunk.clamp(4096, 256 << 20);
            if let Some(reason) = hello.failed {
                g.failed = Some(reason);
            }
            g.asked.clear();
        }
        ToServer::Files { layers } => {
            if layers.len() != fds.len() {
                return Err(std::io::Error::other(format!("{} layers named, {} descriptors", layers.len(), fds.len())));
            }
            for (layer, fd) in layers.into_iter().zip(fds) {
                match g.layers.get_mut(layer as usize) {
                    Some(l) => l.file = Some(Arc::new(File::from(fd))),
                    None => return Err(std::io::Error::other(format!("layer {layer} is not in the table"))),
                }
            }
        }
        ToServer::Settled => {
            let files = g.table.as_ref().map(|t| t.entries()).unwrap_or(0);
            drop(g);
            lazy_wire::send(conn, &ToHost::Ready { files }, &[])?;
            shared.add_writer(conn.try_clone()?);
            shared.changed.notify_all();
            return Ok(());
        }
        ToServer::Readable { layer, ranges } => {
            if let Some(l) = g.layers.get_mut(layer as usize) {
                l.readable = ranges;
            }
        }
        ToServer::Complete { layer, backing } => {
            if let Some(l) = g.layers.get_mut(layer as usize) {
                l.complete = true;
                l.bad.clear();
            }
            // Only the files this layer serves: a path a later layer gave again is that
            // layer's file, and its bytes are not these.
            g.place_backing(backing.into_iter().map(|(path, id)| (layer, path, id)).collect());
        }
        ToServer::Added { layer, files } => {
            let image = g.image;
            if let Some(t) = g.table.as_mut() {
                if image {
                    changed = t.refresh(&files);
                } else {
                    t.add(&files);
                }
            }
            if let Some(l) = g.layers.get_mut(layer as usize) {
                l.pending = None;
                l.complete = true;
            }
            g.place_unplaced();
        }
        ToServer::Bad { layer, ranges } => {
            if let Some(l) = g.layers.get_mut(layer as usize) {
                l.bad = ranges;
            }
        }
        ToServer::Failed { reason } => {
            tracing::error!(reason, "the volume failed verification: every read fails from now on");
            g.failed = Some(reason);
            // What the kernel cached of the files is dropped, so no later read is answered
            // without asking this process.
            let inodes: Vec<u64> = g.table.as_ref().map(|t| t.file_inodes().collect()).unwrap_or_default();
            drop(g);
            for ino in inodes {
                let _ = notifier.inval_inode(fuser::INodeNo(ino), 0, 0);
            }
            shared.changed.notify_all();
            return Ok(());
        }
    }
    drop(g);
    for ino in changed {
        let _ = notifier.inval_inode(fuser::INodeNo(ino), -1, 0);
    }
    shared.changed.notify_all();
    Ok(())
}
