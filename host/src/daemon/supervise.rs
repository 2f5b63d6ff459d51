//! The host's supervisor: watches every staged volume's FUSE process through a pidfd, and
//! restarts broken volumes ([`super::heal`]), each on a blocking thread of its own so one slow
//! backend never delays another volume's restart.
//!
//! - A process exit wakes the supervisor at once (the pidfd becomes readable) for a survey of
//!   every volume; so does a process start (a stage or a restart), so it is watched at once.
//! - Without a wake-up it surveys every 5 s, for what no pidfd reports (a mount that vanished
//!   while its process lives), and whenever a failed restart's backoff has expired.
//! - Every second it reaps FUSE programs that were this daemon's children, so none stays a
//!   zombie.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tracing::debug;

use crate::daemon::Node;
use crate::exec::process::ProcessId;

/// How often the supervisor reaps and checks for due retries.
const TICK: Duration = Duration::from_secs(1);
/// How often it surveys every volume without being woken (a mount lost under a live process is
/// found within this; a process exit wakes it at once).
const SURVEY: Duration = Duration::from_secs(5);

/// Run until the task is dropped or aborted.
pub async fn run(node: Node) {
    let (exited_tx, mut exited) = mpsc::unbounded_channel::<String>();
    let mut watched: HashMap<String, ProcessId> = HashMap::new();
    let mut tick = tokio::time::interval(TICK);
    let mut last_survey: Option<Instant> = None;
    loop {
        let woken = tokio::select! {
            _ = tick.tick() => false,
            Some(id) = exited.recv() => {
                debug!(volume.id = %id, "a supervised process exited");
                true
            }
            () = node.spawned() => true,
        };
        let reaped = node.executor().reap();
        if reaped > 0 {
            // Processes an unstage stopped end here too; a volume whose process died is
            // reported (and restarted) by the survey below.
            debug!(reaped, "reaped exited child processes");
        }
        let due = woken || last_survey.is_none_or(|t| t.elapsed() >= SURVEY) || node.retry_due();
        if !due {
            continue;
        }
        last_survey = Some(Instant::now());
        let n = node.clone();
        let Ok(survey) = tokio::task::spawn_blocking(move || {
            // Every staged lazy volume has its session (one a restart re-adopted, say).
            n.lazy_sweep();
            n.survey()
        })
        .await
        else {
            continue;
        };
        for id in survey.broken {
            let n = node.clone();
            // The volume's lock keeps a second restart of the same volume out.
            tokio::task::spawn_blocking(move || n.heal_one(&id));
        }
        watched.retain(|id, p| survey.watch.iter().any(|(i, q)| i == id && q == p));
        for (id, p) in survey.watch {
            if watched.get(&id) == Some(&p) {
                continue;
            }
            match node.executor().watch(&p) {
                Ok(exit) => {
                    let tx = exited_tx.clone();
                    let volume = id.clone();
                    tokio::spawn(async move {
                        exit.await;
                        let _ = tx.send(volume);
                    });
                    watched.insert(id, p);
                }
                // Gone already: the next survey restarts it.
                Err(e) => debug!(volume.id = %id, error = %e, "cannot watch the FUSE process"),
            }
        }
    }
}
