//! The host's supervisor: watches every staged volume's FUSE process through a pidfd, and
//! restarts broken volumes (node/heal.rs), each on a blocking thread of its own so one slow
//! backend never delays another volume's restart.
//!
//! - A process exit wakes the supervisor at once (the pidfd becomes readable).
//! - A tick every second catches what no pidfd reports: a mount that vanished while its
//!   process lives, a restart waiting out its backoff, a process adopted from state at start.
//! - Each tick first reaps FUSE programs that were this daemon's children, so none stays a
//!   zombie.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::exec::process::{self, ProcessId};
use crate::node::Node;

/// How often the supervisor looks without being woken.
const TICK: Duration = Duration::from_secs(1);

/// Run until the task is dropped or aborted.
pub async fn run(node: Node) {
    let (exited_tx, mut exited) = mpsc::unbounded_channel::<String>();
    let mut watched: HashMap<String, ProcessId> = HashMap::new();
    let mut tick = tokio::time::interval(TICK);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            Some(id) = exited.recv() => debug!(volume.id = %id, "a supervised process exited"),
        }
        let reaped = process::reap_exited_children();
        if reaped > 0 {
            warn!(reaped, "FUSE processes exited on their own");
        }
        let n = node.clone();
        let Ok((broken, supervised)) = tokio::task::spawn_blocking(move || (n.broken(), n.supervised())).await else {
            continue;
        };
        for id in broken {
            let n = node.clone();
            // The volume's lock keeps a second restart of the same volume out.
            tokio::task::spawn_blocking(move || n.heal_one(&id));
        }
        watched.retain(|id, p| supervised.iter().any(|(i, q)| i == id && q == p));
        for (id, p) in supervised {
            if watched.get(&id) == Some(&p) {
                continue;
            }
            match process::exited(&p) {
                Ok(exit) => {
                    let tx = exited_tx.clone();
                    let volume = id.clone();
                    tokio::spawn(async move {
                        exit.await;
                        let _ = tx.send(volume);
                    });
                    watched.insert(id, p);
                }
                // Gone already: the next pass restarts it.
                Err(e) => debug!(volume.id = %id, error = %e, "cannot watch the FUSE process"),
            }
        }
    }
}
