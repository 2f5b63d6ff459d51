//! [`Core::authorize`]: the proof that a source holds the blobs the shared cache already has.
//! The cache is node-wide and content-addressed, so without it a tenant who can push a manifest
//! listing someone else's private digest would be handed that blob from the cache, never having
//! shown a registry any right to it.
//!
//! A registry's word is not a proof (a hostile one answers 200 to every `HEAD`): its bytes are.
//! For each blob that is in the cache (or partly there, or downloading with other credentials)
//! the host asks this source, with its credentials, for [`PROOF_RANGES`] ranges of
//! [`PROOF_LEN`] bytes at offsets drawn at random from the bytes the node has (the whole blob
//! when it is that small), and compares them with the node's. A source that ignores `Range`
//! sends the whole blob: it is read (not stored) and must hash to its digest, so for such a
//! source dedup saves no transfer, but still no byte crosses. A few blobs are proven at a time.
//! What a source proved is remembered for the process's lifetime per host contacted,
//! repository, sha256 of the credentials and digest, so the next stage of the same volume
//! costs no request. A blob not in the cache needs no proof: its download is made with this
//! source's credentials, and its digest checked.

use std::collections::HashSet;
use std::ops::Range;
use std::os::unix::fs::FileExt as _;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use sha2::Digest as _;

use super::cache::Core;
use super::error::{OciError, chain, note_refusal};
use super::registry::{Endpoint, Scope};
use super::stall::Window;
use super::store::hex_of;
use super::{BlobRef, Source};

/// Blobs proven at once for one call.
const CONCURRENT: usize = 8;
/// Ranges asked for per blob.
pub const PROOF_RANGES: usize = 4;
/// Bytes per range.
pub const PROOF_LEN: u64 = 64;

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
                    running.push(check(self, ep, i, hex, b));
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
                    Ok(Proof::Verified) => self.prove(&ep.scope, &hex),
                    Ok(Proof::Provisional) => {}
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
                // Bytes someone fetched, unless this source did (its resume is the proof).
                None => {
                    self.store.partial_ranges(hex, size).is_some_and(|s| !s.ranges().is_empty())
                        && std::fs::read_to_string(self.store.writer(hex)).ok().as_deref() != Some(&scope.tag())
                }
            };
        held && !self.is_proven(scope, hex)
    }
}

/// One proof, numbered to report the first failure in the caller's order.
async fn check(
    core: &Core,
    ep: &Endpoint,
    i: usize,
    hex: String,
    b: &BlobRef,
) -> (usize, String, Result<Proof, OciError>) {
    let result = prove(core, ep, &hex, b).await;
    (i, hex, result)
}

/// What a proof showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Proof {
    /// The source sent the bytes of the complete, verified blob: remembered.
    Verified,
    /// The source agreed with bytes not verified yet (a download still writing), or the node
    /// has nothing to hand over: let through, not remembered (the check once the blob is
    /// complete proves it again).
    Provisional,
}

/// What the node has of a blob now, opened once: the handle reads the same bytes even if a
/// download renames the file meanwhile.
enum Held {
    /// The complete blob (renamed into place only once its digest was checked).
    Complete(std::fs::File),
    /// A partial file and the ranges of it written; `running`: a download writes it now;
    /// `read`: a lazy volume reads it.
    Partial { file: std::fs::File, have: Vec<Range<u64>>, running: bool, read: bool },
    /// Nothing on disk; `running`: a download will write it.
    Nothing { running: bool },
}

fn held(core: &Core, hex: &str, size: u64) -> Held {
    let open = |path: &std::path::Path| {
        use std::os::unix::fs::OpenOptionsExt as _;
        std::fs::OpenOptions::new().read(true).custom_flags(super::download::libc_flags()).open(path).ok()
    };
    if core.store.present(hex, size)
        && let Some(f) = open(&core.store.blob(hex))
    {
        return Held::Complete(f);
    }
    let inner = core.inner();
    let (running, have) = match inner.flights.get(hex) {
        Some(f) => (true, super::live::lock(&f.live.segs).ranges().to_vec()),
        None => (false, core.store.partial_ranges(hex, size).map(|s| s.ranges().to_vec()).unwrap_or_default()),
    };
    let read = inner.lives.contains_key(hex);
    drop(inner);
    match open(&core.store.partial(hex)) {
        Some(file) if !have.is_empty() => Held::Partial { file, have, running, read },
        _ => Held::Nothing { running },
    }
}

/// Ask `ep` for [`PROOF_RANGES`] ranges of `b` drawn at random over the whole blob, and compare
/// them with the node's bytes. Against a download still writing, the ranges are waited for (up
/// to the stall window); a match there is [`Proof::Provisional`]. A mismatch with verified
/// bytes is [`OciError::ProofFailed`]; with unverified ones, one of the two sources is wrong:
/// the node's partial file is dropped when nothing uses it (this source then downloads with its
/// own credentials), else the call fails retriably until the download ends.
async fn prove(core: &Core, ep: &Endpoint, hex: &str, b: &BlobRef) -> Result<Proof, OciError> {
    let failed = |detail: String| {
        let e = OciError::ProofFailed {
            registry: ep.ctx.registry.clone(),
            reference: ep.ctx.reference.clone(),
            digest: b.digest.clone(),
            detail,
        };
        note_refusal(&e);
        e
    };
    let again = |detail: String| OciError::Registry {
        registry: ep.ctx.registry.clone(),
        reference: ep.ctx.reference.clone(),
        status: None,
        detail,
        transient: true,
    };
    let words = random_words().ok_or_else(|| again("the kernel gave no random bytes to draw a proof with".into()))?;
    let picks = pick_ranges(b.size, &words);
    let stall = core.registries.config().stall;
    let deadline = tokio::time::Instant::now() + stall;
    let mut changed = core.changed.subscribe();
    let (file, verified, running, read) = loop {
        match held(core, hex, b.size) {
            Held::Complete(file) => break (file, true, false, false),
            Held::Partial { file, have, running, read } => {
                if picks.iter().all(|p| have.iter().any(|h| h.start <= p.start && p.end <= h.end)) {
                    break (file, false, running, read);
                }
                if !running {
                    // Bytes someone left, not those asked for, and nobody writing more: this
                    // source's own download (its credentials) takes over from nothing.
                    return drop_unused(core, hex, read).ok_or_else(|| {
                        again(format!(
                            "{} is partly on the node and read lazily; try again once it is complete",
                            b.digest
                        ))
                    });
                }
            }
            Held::Nothing { running: false } => return Ok(Proof::Provisional),
            Held::Nothing { running: true } => {}
        }
        if tokio::time::timeout_at(deadline, changed.changed()).await.is_err() {
            return Err(again(format!(
                "{} is downloading for another source and the bytes to prove this source against are not on the node yet; try again",
                b.digest
            )));
        }
    };
    for r in picks {
        let len = r.end - r.start;
        let mut local = vec![0u8; len as usize];
        file.read_exact_at(&mut local, r.start)
            .map_err(|e| OciError::local(&core.store.blob(hex), &e, &ep.ctx.reference, &b.digest))?;
        let mut body = match ep.range(&b.digest, r.start, Some(len)).await {
            Ok(body) => body,
            // Already counted where it was made (a redirect or a reply refused), or retriable.
            Err(e) if e.is_transient() || e.refusal().is_some() => return Err(e),
            // Said so by the registry: the clearest error, and a refusal all the same.
            Err(e @ (OciError::AuthMissing { .. } | OciError::AuthRefused { .. } | OciError::BlobNotFound { .. })) => {
                crate::metrics::global().registry_refusal("proof");
                tracing::warn!(refusal = "proof", registry = %ep.ctx.registry, digest = %b.digest, error = %e.clone().redacted(), "a cached blob was refused to this source");
                return Err(e);
            }
            Err(e) => return Err(failed(format!("asked for bytes {}..{} of it: {e}", r.start, r.end))),
        };
        if body.full {
            whole(ep, b, &mut body, stall).await.map_err(failed)?;
            return Ok(if verified { Proof::Verified } else { Proof::Provisional });
        }
        let mut got = Vec::with_capacity(len as usize);
        let mut window = Window::new(stall);
        while let Some(chunk) = window.next(&mut body.stream, &ep.ctx, &b.digest).await? {
            let chunk = chunk.map_err(|e| OciError::Unreachable {
                registry: ep.ctx.registry.clone(),
                reference: ep.ctx.reference.clone(),
                detail: format!("the connection broke while proving {}: {}", b.digest, chain(&e)),
            })?;
            got.extend_from_slice(&chunk[..chunk.len().min(len as usize - got.len())]);
            if got.len() as u64 == len {
                break;
            }
            if !window.got(chunk.len() as u64) {
                return Err(window.stalled(&ep.ctx, &b.digest));
            }
        }
        if got == local {
            continue;
        }
        if verified {
            return Err(failed(format!("its bytes {}..{} differ from the node's", r.start, r.end)));
        }
        // The node's bytes are not verified: they may be the wrong ones.
        if running {
            return Err(again(format!(
                "its bytes {}..{} of {} differ from those a download for another source is writing, not verified yet; try again once that download ends",
                r.start, r.end, b.digest
            )));
        }
        return drop_unused(core, hex, read).ok_or_else(|| {
            again(format!("{} is partly on the node, read lazily, and differs from this source's; try again", b.digest))
        });
    }
    Ok(if verified { Proof::Verified } else { Proof::Provisional })
}

/// Drop the partial file of `hex`, which no download writes, unless a lazy volume reads it
/// (`read`): nothing of it is handed over then. None: it is read, kept.
fn drop_unused(core: &Core, hex: &str, read: bool) -> Option<Proof> {
    let inner = core.inner();
    if read || inner.flights.contains_key(hex) || inner.lives.contains_key(hex) {
        return None;
    }
    core.store.drop_partial(hex);
    drop(inner);
    tracing::info!(digest = %format!("sha256:{hex}"), "dropped an unverified partial file another source left, which this source's bytes contradict or do not cover");
    Some(Proof::Provisional)
}

/// A source that ignores `Range`: its whole blob, hashed as it arrives (never stored), must be
/// the digest, each stall window bringing its due. The error: what differs.
async fn whole(ep: &Endpoint, b: &BlobRef, body: &mut super::registry::Body, stall: Duration) -> Result<(), String> {
    let mut h = sha2::Sha256::new();
    let mut n = 0u64;
    let mut window = Window::new(stall);
    loop {
        let next = window.next(&mut body.stream, &ep.ctx, &b.digest).await.map_err(|e| e.to_string())?;
        let Some(chunk) = next else { break };
        let chunk = chunk.map_err(|e| format!("the connection broke while reading it whole: {}", chain(&e)))?;
        n += chunk.len() as u64;
        if n > b.size {
            return Err(format!("it sent more than the {} bytes the manifest says", b.size));
        }
        h.update(&chunk);
        if !window.got(chunk.len() as u64) {
            return Err(window.stalled(&ep.ctx, &b.digest).to_string());
        }
    }
    let actual = format!("sha256:{}", hex::encode(h.finalize()));
    if n != b.size || actual != b.digest {
        return Err(format!("it ignores Range, and the whole blob it sent ({n} bytes) hashes to {actual}"));
    }
    tracing::info!(registry = %ep.ctx.registry, digest = %b.digest, "the registry ignores Range: proved by reading the whole blob");
    Ok(())
}

/// Random 64-bit words from the kernel; None if it has none to give.
fn random_words() -> Option<[u64; PROOF_RANGES]> {
    let mut raw = [0u8; 8 * PROOF_RANGES];
    let mut filled = 0;
    while filled < raw.len() {
        match rustix::rand::getrandom(&mut raw[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return None,
        }
    }
    Some(std::array::from_fn(|i| u64::from_le_bytes(raw[i * 8..i * 8 + 8].try_into().expect("8 bytes"))))
}

/// [`PROOF_RANGES`] ranges of [`PROOF_LEN`] bytes of a blob of `size` bytes, each starting at
/// an offset drawn from `words` over the whole blob; a blob of at most
/// `PROOF_RANGES * PROOF_LEN` bytes is compared whole.
pub fn pick_ranges(size: u64, words: &[u64; PROOF_RANGES]) -> Vec<Range<u64>> {
    if size == 0 {
        return Vec::new();
    }
    if size <= PROOF_RANGES as u64 * PROOF_LEN {
        return std::iter::once(0..size).collect();
    }
    let starts = size - PROOF_LEN + 1;
    words
        .iter()
        .map(|w| {
            let start = w % starts;
            start..start + PROOF_LEN
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_whole_and_inside_the_blob() {
        for _ in 0..200 {
            let picks = pick_ranges(10_000, &random_words().unwrap());
            assert_eq!(picks.len(), PROOF_RANGES);
            assert!(picks.iter().all(|p| p.end <= 10_000 && p.end - p.start == PROOF_LEN), "{picks:?}");
        }
        // A small blob is compared whole; an empty one not at all.
        assert_eq!(pick_ranges(100, &[1, 2, 3, 4]), std::iter::once(0..100).collect::<Vec<_>>());
        assert!(pick_ranges(0, &[1, 2, 3, 4]).is_empty());
        // The last byte can be drawn.
        assert_eq!(pick_ranges(1000, &[936, 0, 0, 0])[0], 936..1000);
    }

    #[test]
    fn offsets_spread_over_the_blob() {
        // Over many draws, ranges start in every tenth of a large blob.
        let mut tenths = [false; 10];
        for _ in 0..100 {
            for p in pick_ranges(1 << 30, &random_words().unwrap()) {
                tenths[((p.start * 10) >> 30) as usize] = true;
            }
        }
        assert!(tenths.iter().all(|t| *t), "{tenths:?}");
    }
}
