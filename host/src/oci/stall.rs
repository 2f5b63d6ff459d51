//! The stall rule (`--download-stall-secs`): every registry reply the host reads (a blob's
//! bytes, a manifest, a token, a proof's ranges) must bring [`super::STALL_BYTES`] in each
//! window, or its end; one that does not fails retriably with [`OciError::Stalled`], counted
//! and logged as a refusal.

use std::time::Duration;

use futures_util::StreamExt;

use super::error::{Ctx, OciError, note_refusal};

/// The stall rule (`--download-stall-secs`): each window must bring [`super::STALL_BYTES`] or
/// the end of the body.
pub struct Window {
    stall: Duration,
    opened: tokio::time::Instant,
    received: u64,
}

impl Window {
    /// A window opening now.
    pub fn new(stall: Duration) -> Window {
        Window { stall, opened: tokio::time::Instant::now(), received: 0 }
    }

    /// When the current window closes.
    pub fn deadline(&self) -> tokio::time::Instant {
        self.opened + self.stall
    }

    /// `n` bytes arrived; false: the window closed with less than its due.
    pub fn got(&mut self, n: u64) -> bool {
        self.received += n;
        if self.received >= super::STALL_BYTES {
            (self.opened, self.received) = (tokio::time::Instant::now(), 0);
            return true;
        }
        self.opened.elapsed() < self.stall
    }

    /// The stall error for `what`, counted and logged.
    pub fn stalled(&self, ctx: &Ctx, what: &str) -> OciError {
        let e = OciError::Stalled {
            registry: ctx.registry.clone(),
            reference: ctx.reference.clone(),
            what: what.to_string(),
            received: self.received,
            secs: self.stall.as_secs(),
        };
        note_refusal(&e);
        e
    }

    /// The next item of `stream`, or the stall error if the window closes first.
    pub async fn next<S: futures_util::Stream + Unpin>(
        &mut self,
        stream: &mut S,
        ctx: &Ctx,
        what: &str,
    ) -> Result<Option<S::Item>, OciError> {
        tokio::time::timeout_at(self.deadline(), stream.next()).await.map_err(|_| self.stalled(ctx, what))
    }
}
