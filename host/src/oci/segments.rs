//! Which byte ranges of a partial blob are on disk: the bookkeeping that lets parallel range
//! downloads write at offsets and an interrupted pull resume without fetching twice.
//!
//! Saved beside the partial file as `<hex>.partial.json` (`{"version":1,"size":N,"have":[[a,b],…]}`,
//! half-open ranges). Nothing is trusted from it but positions: the bytes are re-hashed on
//! resume, so a file that lies (or data lost in a power cut) ends as a digest mismatch, never
//! as a wrong blob.

use std::ops::Range;

/// Disjoint, sorted, merged half-open ranges within `0..size`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Segments {
    have: Vec<Range<u64>>,
}

impl Segments {
    /// Record `r` as written.
    pub fn insert(&mut self, r: Range<u64>) {
        if r.start >= r.end {
            return;
        }
        // First range that ends at or after r.start (could touch or overlap).
        let i = self.have.partition_point(|h| h.end < r.start);
        let mut start = r.start;
        let mut end = r.end;
        let mut j = i;
        while j < self.have.len() && self.have[j].start <= end {
            start = start.min(self.have[j].start);
            end = end.max(self.have[j].end);
            j += 1;
        }
        self.have.splice(i..j, std::iter::once(start..end));
    }

    /// Record `r` and return the parts of it that were not recorded before, in order.
    pub fn claim(&mut self, r: Range<u64>) -> Vec<Range<u64>> {
        let mut out = Vec::new();
        let mut at = r.start;
        for h in self.have.iter().skip_while(|h| h.end <= r.start).take_while(|h| h.start < r.end) {
            if h.start > at {
                out.push(at..h.start);
            }
            at = at.max(h.end);
        }
        if at < r.end {
            out.push(at..r.end);
        }
        self.insert(r);
        out
    }

    /// The parts of `r` not recorded, in order (nothing is recorded).
    pub fn missing_in(&self, r: Range<u64>) -> Vec<Range<u64>> {
        let mut out = Vec::new();
        let mut at = r.start;
        for h in self.have.iter().skip_while(|h| h.end <= r.start).take_while(|h| h.start < r.end) {
            if h.start > at {
                out.push(at..h.start);
            }
            at = at.max(h.end);
        }
        if at < r.end {
            out.push(at..r.end);
        }
        out
    }

    /// The recorded parts of `r`, in order.
    pub fn within(&self, r: Range<u64>) -> Vec<Range<u64>> {
        self.have
            .iter()
            .skip_while(|h| h.end <= r.start)
            .take_while(|h| h.start < r.end)
            .map(|h| h.start.max(r.start)..h.end.min(r.end))
            .filter(|h| h.start < h.end)
            .collect()
    }

    /// Is all of `r` recorded?
    pub fn contains(&self, r: Range<u64>) -> bool {
        r.start >= r.end || self.missing_in(r).is_empty()
    }

    /// Forget `r` (bytes that failed verification, to be written again).
    pub fn remove(&mut self, r: Range<u64>) {
        if r.start >= r.end {
            return;
        }
        let mut out = Vec::with_capacity(self.have.len() + 1);
        for h in self.have.drain(..) {
            if h.end <= r.start || h.start >= r.end {
                out.push(h);
                continue;
            }
            if h.start < r.start {
                out.push(h.start..r.start);
            }
            if h.end > r.end {
                out.push(r.end..h.end);
            }
        }
        self.have = out;
    }

    /// The recorded ranges, as pairs.
    pub fn spans(&self) -> Vec<(u64, u64)> {
        self.have.iter().map(|r| (r.start, r.end)).collect()
    }

    /// The bytes from 0 that are all present.
    pub fn prefix(&self) -> u64 {
        match self.have.first() {
            Some(r) if r.start == 0 => r.end,
            _ => 0,
        }
    }

    /// How many bytes are present.
    pub fn covered(&self) -> u64 {
        self.have.iter().map(|r| r.end - r.start).sum()
    }

    /// The missing ranges of `0..size`.
    pub fn gaps(&self, size: u64) -> Vec<Range<u64>> {
        let mut out = Vec::new();
        let mut at = 0;
        for r in &self.have {
            if r.start > at {
                out.push(at..r.start.min(size));
            }
            at = at.max(r.end);
        }
        if at < size {
            out.push(at..size);
        }
        out.retain(|r| r.start < r.end);
        out
    }

    /// The sidecar's JSON.
    pub fn encode(&self, size: u64) -> String {
        let have: Vec<[u64; 2]> = self.have.iter().map(|r| [r.start, r.end]).collect();
        serde_json::json!({ "version": 1, "size": size, "have": have }).to_string()
    }

    /// Read a sidecar written for a blob of `size` bytes whose partial file is `file_len` long.
    /// Anything inconsistent (another size, ranges past the file's end, unsorted) gives `None`:
    /// the download then starts over.
    pub fn decode(text: &str, size: u64, file_len: u64) -> Option<Segments> {
        let doc: serde_json::Value = serde_json::from_str(text).ok()?;
        if doc.get("version")?.as_u64()? != 1 || doc.get("size")?.as_u64()? != size {
            return None;
        }
        let mut out = Segments::default();
        let mut last_end = 0;
        for pair in doc.get("have")?.as_array()? {
            let pair = pair.as_array()?;
            let (a, b) = (pair.first()?.as_u64()?, pair.get(1)?.as_u64()?);
            if a >= b || b > size || b > file_len || a < last_end {
                return None;
            }
            last_end = b;
            out.insert(a..b);
        }
        Some(out)
    }

    /// The recorded ranges.
    pub fn ranges(&self) -> &[Range<u64>] {
        &self.have
    }
}

/// Split `gaps` into pieces of at most `chunk` bytes, in file order.
pub(super) fn chunks(gaps: &[Range<u64>], chunk: u64) -> Vec<Range<u64>> {
    let chunk = chunk.max(1);
    let mut out = Vec::new();
    for g in gaps {
        let mut at = g.start;
        while at < g.end {
            let end = (at + chunk).min(g.end);
            out.push(at..end);
            at = end;
        }
    }
    out
}
