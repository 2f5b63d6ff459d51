//! The one wasmtime Engine of the process: pooling allocator, epoch interruption, and the
//! ticker thread that advances epochs while calls run.

#[cfg(test)]
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// How often the epoch advances. A call's deadline is checked at this granularity, and a
/// spinning guest yields to tokio this often so other calls keep running.
pub const EPOCH_TICK: Duration = Duration::from_millis(5);

/// Sizing of the engine.
#[derive(Debug, Clone, Copy)]
pub struct EngineOptions {
    /// Plugin calls in flight at once (the pool is sized for this many instances).
    pub concurrency: u32,
    /// The largest memory cap of any plugin, in bytes (the pool's hard per-memory cap).
    pub max_memory_bytes: u64,
}

/// Core instances, memories and tables one component may hold. A Rust `wasm32-wasip2`
/// planner has 3-5 core instances; these leave room for larger guests.
const CORE_INSTANCES_PER_COMPONENT: u32 = 16;
const MEMORIES_PER_COMPONENT: u32 = 4;
const TABLES_PER_COMPONENT: u32 = 16;

/// Bytes of each pooled linear memory kept resident between calls.
const KEEP_RESIDENT: usize = 2 << 20;

/// Build the engine.
pub fn build(opts: EngineOptions) -> wasmtime::Result<Engine> {
    let n = opts.concurrency.max(1);
    let mut pool = PoolingAllocationConfig::new();
    pool.total_component_instances(n)
        .total_core_instances(n * CORE_INSTANCES_PER_COMPONENT)
        .total_memories(n * MEMORIES_PER_COMPONENT)
        .total_tables(n * TABLES_PER_COMPONENT)
        .total_stacks(n)
        .max_core_instances_per_component(CORE_INSTANCES_PER_COMPONENT)
        .max_memories_per_component(MEMORIES_PER_COMPONENT)
        .max_tables_per_component(TABLES_PER_COMPONENT)
        .max_memory_size(usize::try_from(opts.max_memory_bytes).unwrap_or(usize::MAX))
        // Reset the first pages of a returned slot with memset instead of madvise, so the next
        // call does not page-fault its stack and heap back in. A planner touches ~1-2 MiB.
        .linear_memory_keep_resident(KEEP_RESIDENT)
        .table_keep_resident(64 << 10);

    let mut cfg = Config::new();
    cfg.wasm_component_model(true)
        .epoch_interruption(true)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    Engine::new(&cfg)
}

/// Advances the engine's epoch every [`EPOCH_TICK`] while at least one call holds a
/// [`Ticking`] guard, and waits otherwise (after at most one more tick): an idle daemon wakes
/// no CPU for it (a tick every 5 ms for ever cost each process 200 wake-ups a second). The
/// thread holds only a weak reference to the engine; it ends when the ticker is dropped, or at
/// its next tick once the engine is gone.
pub struct Ticker {
    shared: Arc<TickerShared>,
}

struct TickerShared {
    state: Mutex<TickerState>,
    wake: Condvar,
    /// Epochs advanced so far (what the tests watch).
    #[cfg(test)]
    ticks: AtomicU64,
}

#[derive(Default)]
struct TickerState {
    /// Guards held now.
    calls: usize,
    /// The ticker was dropped.
    stopped: bool,
    /// The thread waits for a call (a call then wakes it; otherwise no wake-up is needed).
    waiting: bool,
}

/// Held by a call while it runs: the epoch advances while any is held.
pub struct Ticking<'a> {
    ticker: &'a Ticker,
}

impl Ticker {
    /// Start the ticker thread of `engine`.
    pub fn start(engine: &Engine) -> Ticker {
        let shared = Arc::new(TickerShared {
            state: Mutex::new(TickerState::default()),
            wake: Condvar::new(),
            #[cfg(test)]
            ticks: AtomicU64::new(0),
        });
        let (weak, thread_shared) = (engine.weak(), shared.clone());
        thread::Builder::new()
            .name("mounthost-epoch".into())
            .spawn(move || thread_shared.run(weak))
            .expect("spawning the epoch ticker thread");
        Ticker { shared }
    }

    /// A guard for one call: the epoch advances from now until every guard is dropped.
    pub fn ticking(&self) -> Ticking<'_> {
        let waiting = {
            let mut state = self.shared.lock();
            state.calls += 1;
            state.waiting
        };
        if waiting {
            self.shared.wake.notify_one();
        }
        Ticking { ticker: self }
    }
}

impl Drop for Ticking<'_> {
    fn drop(&mut self) {
        self.ticker.shared.lock().calls -= 1;
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.shared.lock().stopped = true;
        self.shared.wake.notify_one();
    }
}

impl TickerShared {
    fn lock(&self) -> std::sync::MutexGuard<'_, TickerState> {
        // The counter stays consistent even if a holder panicked: no update spans a panic.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn run(&self, engine: wasmtime::EngineWeak) {
        loop {
            {
                let mut state = self.lock();
                while state.calls == 0 && !state.stopped {
                    state.waiting = true;
                    state = self.wake.wait(state).unwrap_or_else(|poisoned| poisoned.into_inner());
                    state.waiting = false;
                }
                if state.stopped {
                    return;
                }
            }
            thread::sleep(EPOCH_TICK);
            match engine.upgrade() {
                Some(engine) => engine.increment_epoch(),
                None => return,
            }
            #[cfg(test)]
            self.ticks.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine() -> Engine {
        build(EngineOptions { concurrency: 1, max_memory_bytes: 1 << 20 }).unwrap()
    }

    fn ticks(ticker: &Ticker) -> u64 {
        ticker.shared.ticks.load(Ordering::Relaxed)
    }

    /// Poll `done` for up to 10 s.
    fn within_10s(done: impl Fn() -> bool) -> bool {
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < until {
            if done() {
                return true;
            }
            thread::sleep(Duration::from_millis(5));
        }
        false
    }

    /// Wait up to 10 s for the ticker to reach `at_least` ticks.
    fn ticks_reach(ticker: &Ticker, at_least: u64) -> bool {
        within_10s(|| ticks(ticker) >= at_least)
    }

    /// Wait up to 10 s until the ticker's thread waits for a call (no tick can land then).
    fn waits(ticker: &Ticker) -> bool {
        within_10s(|| ticker.shared.lock().waiting)
    }

    /// No guard, no tick; a guard, ticks; all guards dropped, the ticks stop again (at most the
    /// tick already asleep lands).
    #[test]
    fn the_epoch_advances_only_while_a_call_runs() {
        let engine = engine();
        let ticker = Ticker::start(&engine);
        assert!(waits(&ticker), "the ticker never waited");
        thread::sleep(EPOCH_TICK * 10);
        assert_eq!(ticks(&ticker), 0, "ticked with no call running");

        let first = ticker.ticking();
        let second = ticker.ticking();
        assert!(ticks_reach(&ticker, 3), "only {} ticks while two calls ran", ticks(&ticker));
        drop(first);
        let before = ticks(&ticker);
        assert!(ticks_reach(&ticker, before + 2), "the ticks stopped while a call still ran");
        drop(second);
        assert!(waits(&ticker), "the ticker did not stop after every call ended");
        let stopped_at = ticks(&ticker);
        thread::sleep(EPOCH_TICK * 10);
        assert_eq!(ticks(&ticker), stopped_at, "ticked after every call ended");

        let _third = ticker.ticking();
        assert!(ticks_reach(&ticker, stopped_at + 2), "no tick after a new call started");
    }

    /// Dropping the ticker ends its thread, even while it waits for a call.
    #[test]
    fn a_dropped_ticker_ends_its_thread() {
        let engine = engine();
        let ticker = Ticker::start(&engine);
        assert!(waits(&ticker), "the ticker never waited");
        let shared = Arc::downgrade(&ticker.shared);
        drop(ticker);
        assert!(within_10s(|| shared.upgrade().is_none()), "the ticker thread still holds its state");
    }
}
