//! What the pull metrics count (`docs/metrics.md`), kept beside the single-flight map and
//! under its lock.
//!
//! A *pull* is one waiter (a volume's stage, a dynamic mount, a `mounthost cache pull`, a plugin
//! pulled by OCI reference) asking [`super::Artifacts::ensure`] for one set of blobs from one
//! registry: it begins at the first `ensure` and ends when the last of its blobs lands in the
//! cache (the download that brings it, or the `ensure` that finds them all there: `ok`) or at
//! the `ensure` that reports a failure (`failed`). kubelet's retries of one stage are one
//! pull, and so is asking again once it ended `ok` (the waiter keeps its blobs until it is
//! forgotten). A waiter that is forgotten ([`super::Artifacts::forget`]) or asks for another set
//! abandons a pull that has not ended: it is no longer in progress and is not timed.
//!
//! The first time a pull sees each of its blobs, it says how the blob was found: complete in
//! the cache (*served from cache*, and *deduplicated*), being downloaded for another waiter
//! (*deduplicated*: it joined that download), or missing (this pull's download fetches it).
//! Each blob counts once per pull, whatever happens to it later.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Instant;

use crate::metrics::{Dedup, Metrics, PullOutcome};

/// How a pull's `ensure` found one of its blobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sight {
    /// Complete in the cache, of this many bytes.
    Cached(u64),
    /// Being downloaded for another waiter: joined.
    Joined,
    /// Missing: this pull started its download.
    Started,
}

/// One waiter's pull.
struct Pull {
    /// The host contacted (the mirror when there is one).
    registry: String,
    /// Hex digests of the blobs asked for.
    blobs: BTreeSet<String>,
    /// Blobs already seen (and counted).
    seen: HashSet<String>,
    started: Instant,
    /// Ended `ok`: kept so that asking again for the same blobs counts nothing.
    done: bool,
}

/// The pulls of every waiter, by waiter.
#[derive(Default)]
pub(super) struct Pulls(HashMap<String, Pull>);

impl Pulls {
    /// `waiter` asked for `blobs` (hex digests) from `registry`, and found them as `sights` say
    /// (a blob not in `sights` was not looked at yet, e.g. its download waits to be retried).
    /// Begins the pull unless it is the one the waiter has; counts each blob's first sight.
    pub fn saw(
        &mut self,
        m: &Metrics,
        waiter: &str,
        registry: &str,
        blobs: BTreeSet<String>,
        sights: &[(String, Sight)],
    ) {
        if blobs.is_empty() {
            return;
        }
        let same = self.0.get(waiter).is_some_and(|p| p.registry == registry && p.blobs == blobs);
        if !same {
            if let Some(old) = self.0.remove(waiter)
                && !old.done
            {
                m.oci_pull_abandoned(&old.registry);
            }
            m.oci_pull_started(registry);
            let pull = Pull {
                registry: registry.to_string(),
                blobs,
                seen: HashSet::new(),
                started: Instant::now(),
                done: false,
            };
            self.0.insert(waiter.to_string(), pull);
        }
        let pull = self.0.get_mut(waiter).expect("inserted above");
        if pull.done {
            return;
        }
        for (hex, sight) in sights {
            if !pull.blobs.contains(hex) || !pull.seen.insert(hex.clone()) {
                continue;
            }
            match sight {
                Sight::Cached(bytes) => {
                    m.oci_served_from_cache(registry, *bytes);
                    m.oci_deduplicated(registry, Dedup::Cached);
                }
                Sight::Joined => m.oci_deduplicated(registry, Dedup::Downloading),
                Sight::Started => {}
            }
        }
    }

    /// The pull of `waiter` ended (every blob there, or a failure reported to it). A failed pull
    /// is dropped (the waiter's next `ensure` starts over); one that ended `ok` is kept, done.
    pub fn end(&mut self, m: &Metrics, waiter: &str, outcome: PullOutcome) {
        let Some(pull) = self.0.get_mut(waiter) else { return };
        if pull.done {
            return;
        }
        m.oci_pull_finished(&pull.registry, outcome, pull.started.elapsed());
        match outcome {
            PullOutcome::Ok => pull.done = true,
            PullOutcome::Failed => {
                self.0.remove(waiter);
            }
        }
    }

    /// `waiter` stopped waiting: a pull that has not ended is abandoned.
    pub fn forget(&mut self, m: &Metrics, waiter: &str) {
        if let Some(pull) = self.0.remove(waiter)
            && !pull.done
        {
            m.oci_pull_abandoned(&pull.registry);
        }
    }

    /// Pulls begun and not ended, by registry (for tests).
    #[cfg(test)]
    pub fn in_progress(&self) -> std::collections::BTreeMap<String, usize> {
        let mut out = std::collections::BTreeMap::new();
        for p in self.0.values().filter(|p| !p.done) {
            *out.entry(p.registry.clone()).or_default() += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(hex: &[&str]) -> BTreeSet<String> {
        hex.iter().map(|h| h.to_string()).collect()
    }

    fn line(m: &Metrics, prefix: &str) -> String {
        let text = m.encode();
        text.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix} in:\n{text}")).to_string()
    }

    /// The sample value of the line starting with `prefix` (labels included).
    fn value(m: &Metrics, prefix: &str) -> f64 {
        line(m, prefix).rsplit(' ').next().unwrap().parse().unwrap()
    }

    const R: &str = "reg.test:5000";

    #[test]
    fn retries_are_one_pull_and_each_blob_counts_once() {
        let m = Metrics::new();
        let mut p = Pulls::default();
        let blobs = set(&["aa", "bb", "cc"]);
        // First ask: aa cached (10 bytes), bb being downloaded for someone else, cc started here.
        let first = [("aa".into(), Sight::Cached(10)), ("bb".into(), Sight::Joined), ("cc".into(), Sight::Started)];
        p.saw(&m, "vol", R, blobs.clone(), &first);
        assert_eq!(p.in_progress(), [(R.to_string(), 1)].into());
        // Retries: bb and cc are complete now, which counts nothing more (they came for this pull).
        let later =
            [("aa".into(), Sight::Cached(10)), ("bb".into(), Sight::Cached(20)), ("cc".into(), Sight::Cached(30))];
        p.saw(&m, "vol", R, blobs.clone(), &later);
        p.end(&m, "vol", PullOutcome::Ok);
        // Asking again once done (kubelet retrying while the layers unpack) is still the same pull.
        p.saw(&m, "vol", R, blobs.clone(), &later);
        p.end(&m, "vol", PullOutcome::Ok);
        let r = format!("{{registry=\"{R}\"}}");
        assert_eq!(value(&m, &format!("mounthost_oci_blob_served_from_cache_bytes_total{r}")), 10.0);
        assert_eq!(
            value(&m, &format!("mounthost_oci_blobs_deduplicated_total{{registry=\"{R}\",found=\"cached\"}}")),
            1.0
        );
        assert_eq!(
            value(&m, &format!("mounthost_oci_blobs_deduplicated_total{{registry=\"{R}\",found=\"downloading\"}}")),
            1.0
        );
        assert_eq!(
            value(&m, &format!("mounthost_oci_pull_duration_seconds_count{{registry=\"{R}\",outcome=\"ok\"}}")),
            1.0
        );
        assert_eq!(value(&m, &format!("mounthost_oci_pulls_in_progress{r}")), 0.0);
        assert!(p.in_progress().is_empty());
        // Forgotten (unstaged), the volume's next stage is a new pull: all from the cache.
        p.forget(&m, "vol");
        p.saw(&m, "vol", R, blobs, &later);
        p.end(&m, "vol", PullOutcome::Ok);
        assert_eq!(value(&m, &format!("mounthost_oci_blob_served_from_cache_bytes_total{r}")), 70.0);
        assert_eq!(
            value(&m, &format!("mounthost_oci_pull_duration_seconds_count{{registry=\"{R}\",outcome=\"ok\"}}")),
            2.0
        );
    }

    #[test]
    fn failed_and_abandoned_pulls() {
        let m = Metrics::new();
        let mut p = Pulls::default();
        p.saw(&m, "a", R, set(&["aa"]), &[("aa".into(), Sight::Started)]);
        p.saw(&m, "b", R, set(&["bb"]), &[]);
        p.saw(&m, "c", "mirror.test", set(&["cc"]), &[]);
        assert_eq!(p.in_progress(), [(R.to_string(), 2), ("mirror.test".to_string(), 1)].into());
        // A failure ends the pull; the next ask starts over.
        p.end(&m, "a", PullOutcome::Failed);
        p.saw(&m, "a", R, set(&["aa"]), &[]);
        // Another set of blobs abandons the pull it replaces.
        p.saw(&m, "b", R, set(&["bb", "dd"]), &[]);
        // Forgotten before the end: abandoned, not timed.
        p.forget(&m, "c");
        assert_eq!(p.in_progress(), [(R.to_string(), 2)].into());
        assert_eq!(value(&m, &format!("mounthost_oci_pulls_in_progress{{registry=\"{R}\"}}")), 2.0);
        assert_eq!(value(&m, "mounthost_oci_pulls_in_progress{registry=\"mirror.test\"}"), 0.0);
        assert_eq!(
            value(&m, &format!("mounthost_oci_pull_duration_seconds_count{{registry=\"{R}\",outcome=\"failed\"}}")),
            1.0
        );
        assert!(!m.encode().contains("registry=\"mirror.test\",outcome="), "an abandoned pull is not timed");
        // Nothing asked, nothing counted.
        p.saw(&m, "e", "empty.test", BTreeSet::new(), &[]);
        assert!(!m.encode().contains("empty.test"));
    }
}
