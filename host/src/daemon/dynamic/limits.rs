//! The rate limit of one dynamic volume's POST and DELETE requests: a token bucket of `burst`
//! tokens refilled at `per_minute` tokens a minute. A request takes one token or is answered
//! 429 with the time until the next one (its `Retry-After`). GETs take none: reading costs the
//! host a state file read and changes nothing.

use std::time::{Duration, Instant};

/// One volume's bucket.
#[derive(Debug, Clone)]
pub struct Bucket {
    /// Tokens now (fractions accrue between requests).
    tokens: f64,
    /// When `tokens` was last brought up to date.
    at: Option<Instant>,
    burst: u64,
    per_minute: u64,
}

impl Bucket {
    /// A full bucket.
    pub fn new(burst: u64, per_minute: u64) -> Bucket {
        Bucket { tokens: burst.max(1) as f64, at: None, burst: burst.max(1), per_minute: per_minute.max(1) }
    }

    /// Follow a changed configuration (a lower rate, a smaller bucket) from now on.
    pub fn set_rate(&mut self, burst: u64, per_minute: u64) {
        self.burst = burst.max(1);
        self.per_minute = per_minute.max(1);
        self.tokens = self.tokens.min(self.burst as f64);
    }

    /// Take a token at `now`, or say how long until one is there.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let per_second = self.per_minute as f64 / 60.0;
        if let Some(at) = self.at {
            let elapsed = now.saturating_duration_since(at).as_secs_f64();
            self.tokens = (self.tokens + elapsed * per_second).min(self.burst as f64);
        }
        self.at = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / per_second))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_the_rate_holds_and_a_refusal_says_when_to_retry() {
        let t0 = Instant::now();
        let mut b = Bucket::new(3, 60);
        for _ in 0..3 {
            assert_eq!(b.take(t0), Ok(()));
        }
        let wait = b.take(t0).unwrap_err();
        assert!((wait.as_secs_f64() - 1.0).abs() < 1e-6, "{wait:?}");
        // Refusals take nothing: half a second later half a token is there, not less.
        let wait = b.take(t0 + Duration::from_millis(500)).unwrap_err();
        assert!((wait.as_secs_f64() - 0.5).abs() < 1e-6, "{wait:?}");
        assert_eq!(b.take(t0 + Duration::from_secs(1)), Ok(()));
        // A long quiet while fills it to its size, no more.
        let later = t0 + Duration::from_secs(3600);
        for _ in 0..3 {
            assert_eq!(b.take(later), Ok(()));
        }
        assert!(b.take(later).is_err());
    }

    #[test]
    fn a_lower_rate_applies_at_once() {
        let t0 = Instant::now();
        let mut b = Bucket::new(10, 600);
        b.set_rate(2, 6);
        assert_eq!(b.take(t0), Ok(()));
        assert_eq!(b.take(t0), Ok(()));
        let wait = b.take(t0).unwrap_err();
        assert!((wait.as_secs_f64() - 10.0).abs() < 1e-6, "{wait:?}");
    }
}
