//! Per-call resource limits for plugins: a CPU deadline and a memory cap.
//!
//! Plugins are untrusted code run inside the privileged daemon. Each call gets a fresh
//! Store with these limits; exceeding one fails that call only (the Store is dropped).

use std::time::Duration;

use wasmtime::ResourceLimiter;

/// Default wall-clock deadline of one plugin call.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(1);
/// Default cap on a plugin instance's linear memory.
pub const DEFAULT_MEMORY_BYTES: u64 = 64 << 20;

/// Limits applied to every call of one plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock time one call may take, instantiation included.
    pub deadline: Duration,
    /// Bytes of linear memory (all memories of the component together).
    pub memory_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { deadline: DEFAULT_DEADLINE, memory_bytes: DEFAULT_MEMORY_BYTES }
    }
}

/// The memory cap was hit. Carried as the trap's error so the caller can tell it apart.
#[derive(Debug, thiserror::Error)]
#[error("plugin tried to grow its memory to {desired} bytes; its limit is {limit} bytes")]
pub struct MemoryCapExceeded {
    /// Bytes the guest asked for.
    pub desired: u64,
    /// The configured limit.
    pub limit: u64,
}

/// The deadline passed. Carried as the trap's error.
#[derive(Debug, thiserror::Error)]
#[error("plugin call exceeded its deadline of {0:?}")]
pub struct DeadlineExceeded(pub Duration);

/// Enforces [`Limits::memory_bytes`] across all memories of one Store, and bounds tables and
/// instance counts so a component cannot exhaust the host by other means.
#[derive(Debug)]
pub struct Limiter {
    limit: u64,
    /// Bytes currently held by all memories of the store.
    used: u64,
}

impl Limiter {
    /// A limiter for one Store.
    pub fn new(limit: u64) -> Self {
        Limiter { limit, used: 0 }
    }
}

/// Table elements one plugin may allocate.
const MAX_TABLE_ELEMENTS: usize = 100_000;

impl ResourceLimiter for Limiter {
    fn memory_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        let grow = (desired - current) as u64;
        let total = self.used.saturating_add(grow);
        if total > self.limit {
            // An error (not `Ok(false)`) traps at once: a planner that wants this much
            // memory is broken, and a trap names the cause precisely.
            return Err(MemoryCapExceeded { desired: total, limit: self.limit }.into());
        }
        self.used = total;
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }

    fn instances(&self) -> usize {
        32
    }

    fn tables(&self) -> usize {
        32
    }

    fn memories(&self) -> usize {
        8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_counted_across_memories() {
        let mut l = Limiter::new(100);
        assert!(l.memory_growing(0, 60, None).unwrap());
        let err = l.memory_growing(0, 41, None).unwrap_err();
        let cap = err.downcast_ref::<MemoryCapExceeded>().unwrap();
        assert_eq!((cap.desired, cap.limit), (101, 100));
        assert!(l.memory_growing(60, 100, None).unwrap());
    }
}
