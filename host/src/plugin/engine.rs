//! The one wasmtime Engine of the process: pooling allocator, epoch interruption, and the
//! ticker thread that advances epochs.

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

/// Start the thread that advances the engine's epoch. It holds only a weak reference and
/// ends by itself once the engine is dropped.
pub fn start_ticker(engine: &Engine) {
    let weak = engine.weak();
    thread::Builder::new()
        .name("mounthost-epoch".into())
        .spawn(move || {
            loop {
                thread::sleep(EPOCH_TICK);
                match weak.upgrade() {
                    Some(engine) => engine.increment_epoch(),
                    None => break,
                }
            }
        })
        .expect("spawning the epoch ticker thread");
}
