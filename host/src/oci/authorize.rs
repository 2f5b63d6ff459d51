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
use std::os::unix::fs::FileExt;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use sha2::Digest as _;

use super::cache::Core;
use super::error::{OciError, chain, note_refusal};
use super::registry::{Endpoint, Scope};
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
                None => self.store.partial_ranges(hex, size).is_some_and(|s| !s.ranges().is_empty()),
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
) -> (usize, String, Result<(), OciError>) {
    let result = prove(core, ep, &hex, b).await;
    (i, hex, result)
}

/// Ask `ep` for random ranges of the bytes the node has of `b`, and compare.
async fn prove(core: &Core, ep: &Endpoint, hex: &str, b: &BlobRef) -> Result<(), OciError> {
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
    let (path, have) = match held_bytes(core, hex, b.size, core.registries.config().stall).await {
        Held::Nothing => return Ok(()),
        Held::Bytes(path, have) => (path, have),
        Held::NotYet => {
            return Err(OciError::Registry {
                registry: ep.ctx.registry.clone(),
                reference: ep.ctx.reference.clone(),
                status: None,
                detail: format!(
                    "{} is downloading for another source and no byte of it is on the node yet to prove this source against; try again",
                    b.digest
                ),
                transient: true,
            });
        }
    };
    let picks = pick_ranges(&have, b.size, &random_words());
    for r in picks {
        let len = r.end - r.start;
        let mut local = vec![0u8; len as usize];
        let file = std::fs::File::open(&path).map_err(|e| OciError::local(&path, &e, &ep.ctx.reference, &b.digest))?;
        file.read_exact_at(&mut local, r.start)
            .map_err(|e| OciError::local(&path, &e, &ep.ctx.reference, &b.digest))?;
        let mut body = match ep.range(&b.digest, r.start, Some(len)).await {
            Ok(body) => body,
            Err(e) if e.is_transient() => return Err(e),
            // Said so by the registry: the clearest error, and a refusal all the same.
            Err(e @ (OciError::AuthMissing { .. } | OciError::AuthRefused { .. } | OciError::BlobNotFound { .. })) => {
                crate::metrics::global().registry_refusal("proof");
                tracing::warn!(refusal = "proof", registry = %ep.ctx.registry, digest = %b.digest, error = %e, "a cached blob was refused to this source");
                return Err(e);
            }
            Err(e) => return Err(failed(format!("asked for bytes {}..{} of it: {e}", r.start, r.end))),
        };
        if body.full {
            return whole(ep, b, &mut body).await.map_err(failed);
        }
        let mut got = Vec::with_capacity(len as usize);
        while let Some(chunk) = body.stream.next().await {
            let chunk = chunk.map_err(|e| OciError::Unreachable {
                registry: ep.ctx.registry.clone(),
                reference: ep.ctx.reference.clone(),
                detail: format!("the connection broke while proving {}: {}", b.digest, chain(&e)),
            })?;
            got.extend_from_slice(&chunk[..chunk.len().min(len as usize - got.len())]);
            if got.len() as u64 == len {
                break;
            }
        }
        if got != local {
            return Err(failed(format!("its bytes {}..{} differ from the node's", r.start, r.end)));
        }
    }
    Ok(())
}

/// A source that ignores `Range`: its whole blob, hashed as it arrives (never stored), must be
/// the digest. The error: what differs.
async fn whole(ep: &Endpoint, b: &BlobRef, body: &mut super::registry::Body) -> Result<(), String> {
    let mut h = sha2::Sha256::new();
    let mut n = 0u64;
    while let Some(chunk) = body.stream.next().await {
        let chunk = chunk.map_err(|e| format!("the connection broke while reading it whole: {}", chain(&e)))?;
        n += chunk.len() as u64;
        if n > b.size {
            return Err(format!("it sent more than the {} bytes the manifest says", b.size));
        }
        h.update(&chunk);
    }
    let actual = format!("sha256:{}", hex::encode(h.finalize()));
    if n != b.size || actual != b.digest {
        return Err(format!("it ignores Range, and the whole blob it sent ({n} bytes) hashes to {actual}"));
    }
    tracing::info!(registry = %ep.ctx.registry, digest = %b.digest, "the registry ignores Range: proved by reading the whole blob");
    Ok(())
}

/// What the node has of a blob to prove a source against.
enum Held {
    /// No byte, and no download running: nothing is handed over, nothing to prove.
    Nothing,
    /// The file, and the ranges of it written.
    Bytes(std::path::PathBuf, Vec<Range<u64>>),
    /// A download runs (with other credentials) that has written nothing yet.
    NotYet,
}

/// The file holding the node's bytes of blob `hex` and the ranges of it written: the whole
/// blob when it is complete, else what its download (or an earlier one) wrote. A download that
/// wrote nothing yet is waited for, up to `wait`.
#[allow(clippy::single_range_in_vec_init, reason = "the list of ranges a blob has, here all of it")]
async fn held_bytes(core: &Core, hex: &str, size: u64, wait: Duration) -> Held {
    let deadline = tokio::time::Instant::now() + wait;
    let mut changed = core.changed.subscribe();
    loop {
        if core.store.present(hex, size) {
            return Held::Bytes(core.store.blob(hex), vec![0..size]);
        }
        let (running, written): (bool, Vec<Range<u64>>) = {
            let inner = core.inner();
            match inner.flights.get(hex) {
                Some(f) => (true, super::live::lock(&f.live.segs).ranges().to_vec()),
                None => (false, core.store.partial_ranges(hex, size).map(|s| s.ranges().to_vec()).unwrap_or_default()),
            }
        };
        if !written.is_empty() {
            return Held::Bytes(core.store.partial(hex), written);
        }
        if !running {
            return Held::Nothing;
        }
        if tokio::time::timeout_at(deadline, changed.changed()).await.is_err() {
            return Held::NotYet;
        }
    }
}

/// Random 64-bit words from the kernel.
fn random_words() -> [u64; PROOF_RANGES] {
    let mut raw = [0u8; 8 * PROOF_RANGES];
    let mut filled = 0;
    while filled < raw.len() {
        match rustix::rand::getrandom(&mut raw[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            // The kernel's generator does not fail once booted; the clock is a poor second.
            Err(_) => {
                let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                raw[filled..].iter_mut().enumerate().for_each(|(i, b)| *b = (t.as_nanos() >> (i % 16)) as u8);
                filled = raw.len();
            }
        }
    }
    std::array::from_fn(|i| u64::from_le_bytes(raw[i * 8..i * 8 + 8].try_into().expect("8 bytes")))
}

/// [`PROOF_RANGES`] ranges of [`PROOF_LEN`] bytes (shorter where a written range is) inside
/// `have`, each at an offset drawn from `words` over all the bytes of `have`. A blob of at most
/// `PROOF_RANGES * PROOF_LEN` bytes held whole is compared whole.
#[allow(clippy::single_range_in_vec_init, reason = "a list of ranges that holds one")]
pub fn pick_ranges(have: &[Range<u64>], size: u64, words: &[u64; PROOF_RANGES]) -> Vec<Range<u64>> {
    if have.len() == 1 && have[0] == (0..size) && size <= PROOF_RANGES as u64 * PROOF_LEN {
        return if size == 0 { Vec::new() } else { vec![0..size] };
    }
    let total: u64 = have.iter().map(|r| r.end - r.start).sum();
    if total == 0 {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(PROOF_RANGES);
    for w in words {
        let mut at = w % total;
        for r in have {
            let len = r.end - r.start;
            if at < len {
                let start = (r.start + at).min(r.end.saturating_sub(PROOF_LEN)).max(r.start);
                out.push(start..(start + PROOF_LEN).min(r.end));
                break;
            }
            at -= len;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::single_range_in_vec_init, reason = "lists of ranges that hold one")]
    fn ranges_fall_inside_what_the_node_has() {
        let have = vec![0..100, 1000..1010, 5000..9000];
        for _ in 0..200 {
            let picks = pick_ranges(&have, 10_000, &random_words());
            assert_eq!(picks.len(), PROOF_RANGES);
            for p in &picks {
                assert!(have.iter().any(|h| h.start <= p.start && p.end <= h.end), "{p:?}");
                assert!(p.end > p.start && p.end - p.start <= PROOF_LEN);
            }
        }
        // A small blob held whole is compared whole; nothing held, nothing picked.
        assert_eq!(pick_ranges(&[0..100], 100, &[1, 2, 3, 4]), vec![0..100]);
        assert!(pick_ranges(&[], 100, &[1, 2, 3, 4]).is_empty());
    }

    #[test]
    #[allow(clippy::single_range_in_vec_init, reason = "a list of ranges that holds one")]
    fn offsets_spread_over_the_blob() {
        // Over many draws, ranges start in every tenth of a large blob.
        let mut tenths = [false; 10];
        for _ in 0..100 {
            for p in pick_ranges(&[0..1 << 30], 1 << 30, &random_words()) {
                tenths[((p.start * 10) >> 30) as usize] = true;
            }
        }
        assert!(tenths.iter().all(|t| *t), "{tenths:?}");
    }
}
