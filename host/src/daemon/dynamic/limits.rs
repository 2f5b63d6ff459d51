//! The rate limits of one dynamic volume's socket.
//!
//! [`Bucket`]: its POST and DELETE requests, a token bucket of `burst` tokens refilled at
//! `per_minute` tokens a minute. A request takes one token or is answered 429 with the time
//! until the next one (its `Retry-After`). GETs take none: reading changes nothing.
//!
//! [`Pacer`]: every request, whatever it asks, is handled at most at a steady rate after a
//! burst; one past it waits (the connection is not read meanwhile) rather than being refused,
//! so a pod that floods its socket slows its own answers and costs the daemon little.

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

/// Requests of one volume's socket handled per second at most, after a burst of [`PACE_BURST`].
pub const PACE_PER_SECOND: u32 = 100;
/// Requests handled at once after a quiet while.
pub const PACE_BURST: u32 = 200;

/// The pace of one volume's requests (a virtual-time scheduler: each request reserves the
/// next slot, `1 / per_second` after the one before, and may run up to `burst` slots early).
#[derive(Debug, Clone)]
pub struct Pacer {
    interval: Duration,
    /// How far ahead of its slot a request may run: `burst - 1` slots.
    early: Duration,
    /// The slot the next request gets, unless it comes later.
    next: Option<Instant>,
}

impl Pacer {
    pub fn new(per_second: u32, burst: u32) -> Pacer {
        let interval = Duration::from_secs(1) / per_second.max(1);
        Pacer { interval, early: interval * (burst.max(1) - 1), next: None }
    }

    /// When the request arriving at `now` may be handled: `now`, or later (reserved for it).
    pub fn slot(&mut self, now: Instant) -> Instant {
        let slot = self.next.map_or(now, |n| n.max(now));
        self.next = Some(slot + self.interval);
        slot.checked_sub(self.early).map_or(now, |at| at.max(now))
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
    fn a_pacer_lets_a_burst_through_then_spaces_requests() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut p = Pacer::new(100, 3);
        for _ in 0..3 {
            assert_eq!(p.slot(t0), t0);
        }
        // Past the burst, one every 10 ms: each later request waits longer.
        assert_eq!(p.slot(t0), t0 + ms(10));
        assert_eq!(p.slot(t0), t0 + ms(20));
        // Arriving on time, it waits no more than its slot.
        assert_eq!(p.slot(t0 + ms(20)), t0 + ms(30));
        // A quiet second gives the burst back, and no more.
        let later = t0 + ms(1000);
        for _ in 0..3 {
            assert_eq!(p.slot(later), later);
        }
        assert_eq!(p.slot(later), later + ms(10));
    }
}
