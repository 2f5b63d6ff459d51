//! [`Core::authorize`]: the proof that a source may read the blobs the shared cache already
//! holds. The cache is node-wide and content-addressed, so without it a tenant who can push a
//! manifest listing someone else's private digest would be handed that blob from the cache,
//! never having shown a registry any right to it.
//!
//! Each blob that is in the cache (or partly there, or downloading with other credentials) is
//! asked for with a `HEAD` carrying this source's credentials, a few at a time. What a registry
//! allowed is remembered for the process's lifetime per host contacted, repository, sha256 of
//! the credentials and digest, so the next stage of the same volume costs no request. A blob not
//! in the cache needs no check: its download is made with this source's credentials.

use std::collections::HashSet;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

use super::cache::Core;
use super::error::OciError;
use super::registry::{Endpoint, Scope};
use super::store::hex_of;
use super::{BlobRef, Source};

/// Checks in flight at once for one call.
const CONCURRENT: usize = 8;

impl Core {
    pub async fn authorize(&self, src: &Source, blobs: &[BlobRef]) -> Result<(), OciError> {
        let mut wanted: Vec<(String, &BlobRef)> = Vec::with_capacity(blobs.len());
        for b in blobs {
            let hex = hex_of(&b.digest)?.to_string();
            if !wanted.iter().any(|(h, _)| *h == hex) {
                wanted.push((hex, b));
            }
        }
        let scope = self.registries.scope(src);
        let mut endpoint: Option<Endpoint> = None;
        let mut looked: HashSet<String> = HashSet::new();
        // A blob absent at first may land while the others are checked (another source's
        // download finishing): look again until a pass finds nothing new to check.
        loop {
            let need: Vec<(String, &BlobRef)> = wanted
                .iter()
                .filter(|(hex, b)| !looked.contains(hex) && self.needs_proof(&scope, hex, b.size))
                .map(|(hex, b)| (hex.clone(), *b))
                .collect();
            if need.is_empty() {
                return Ok(());
            }
            let ep = match &endpoint {
                Some(ep) => ep,
                None => endpoint.insert(self.registries.endpoint(src)?),
            };
            // A plain loop over named futures: closures returning borrowing futures inside
            // stream combinators make the whole future unusable in `tokio::spawn` (rustc's
            // "implementation of `FnOnce` is not general enough").
            let mut queue = need.into_iter().enumerate();
            let mut running = FuturesUnordered::new();
            let mut results = Vec::new();
            loop {
                while running.len() < CONCURRENT {
                    let Some((i, (hex, b))) = queue.next() else { break };
                    running.push(check(ep, i, hex, &b.digest));
                }
                match running.next().await {
                    Some(done) => results.push(done),
                    None => break,
                }
            }
            results.sort_by_key(|(i, _, _)| *i);
            let mut first = None;
            for (_, hex, result) in results {
                match result {
                    Ok(()) => self.prove(&ep.scope, &hex),
                    Err(e) => {
                        first.get_or_insert(e);
                    }
                }
                looked.insert(hex);
            }
            if let Some(e) = first {
                tracing::warn!(registry = %ep.ctx.registry, reference = %ep.ctx.reference, error = %e, "a cached blob was refused to this source");
                return Err(e);
            }
        }
    }

    /// Must `scope` show a registry it may read `hex` before the cache hands it over?
    fn needs_proof(&self, scope: &Scope, hex: &str, size: u64) -> bool {
        let held = self.store.present(hex, size)
            || match self.flight_scope(hex) {
                // Its download fetches with these credentials: that is the proof.
                Some(s) => s != *scope,
                // Bytes someone fetched: a resume may need no request at all.
                None => self.store.partial(hex).symlink_metadata().is_ok(),
            };
        held && !self.is_proven(scope, hex)
    }
}

/// One check, numbered to report the first failure in the caller's order.
async fn check(ep: &Endpoint, i: usize, hex: String, digest: &str) -> (usize, String, Result<(), OciError>) {
    (i, hex, ep.check_blob(digest).await)
}
