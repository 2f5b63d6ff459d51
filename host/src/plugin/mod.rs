//! The plugin runtime: loads WebAssembly planner components and calls them under limits.
//!
//! One [`wasmtime::Engine`] for the process. Each component is compiled once per sha256
//! digest (and cached on disk, see [`cache`]), checked for forbidden imports, and kept as an
//! `InstancePre`. Every call gets a fresh Store with a deadline and a memory cap; a trap,
//! a timeout or a memory failure fails that call only, because the Store is dropped with it.
//! Calls in flight are bounded by a semaphore sized to the instance pool.
//!
//! Components of every released contract version load side by side: the version a component
//! exports is read from its type ([`Contract::detect`]), it is pre-instantiated with that
//! version's bindings, and calls to an older one go through [`adapter_v040`] (then, for 0.3.0,
//! [`adapter_v030`], for 0.2.0 [`adapter_v020`], and for 0.1.0 [`adapter`] too).

pub mod adapter;
pub mod adapter_v020;
pub mod adapter_v030;
pub mod adapter_v040;
pub mod bindings;
pub mod bindings_v010;
pub mod bindings_v020;
pub mod bindings_v030;
pub mod bindings_v040;
pub mod cache;
pub mod calls;
pub mod contract;
pub mod digest;
pub mod engine;
pub mod file_access;
pub mod imports;
pub mod info;
pub mod limits;
pub mod plugin_error;
pub mod pulled;
pub mod registry;
pub mod store;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::sync::{Mutex, Semaphore};
use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Engine, Store, Trap, UpdateDeadline};

pub use calls::PlannerCall;
pub use contract::Contract;
pub use digest::Digest;
pub use info::PluginInfo;
pub use limits::Limits;
use limits::{DeadlineExceeded, Limiter, MemoryCapExceeded};
pub use plugin_error::{BackendError, PluginError};
use store::CallState;

use crate::metrics::CallOutcome;

/// A plugin compiled into the binary.
#[derive(Debug, Clone, Copy)]
pub struct StockPlugin {
    /// The name its `info` must report.
    pub name: &'static str,
    /// The component.
    pub wasm: &'static [u8],
}

/// How the runtime is set up. `Default` (in `config.rs`) reads files from disk.
#[derive(Clone)]
pub struct RuntimeConfig {
    /// Folder of `.wasm` plugins, rescanned at a lookup by name when it changed (new or changed
    /// files are picked up without a restart; a file with the name of a stock plugin overrides
    /// it).
    pub plugin_dir: Option<PathBuf>,
    /// Folder for compiled artifacts (private, 0700), or none to always compile.
    pub cache_dir: Option<PathBuf>,
    /// Plugin calls in flight at once; further calls wait.
    pub concurrency: u32,
    /// Limits for plugins without their own entry.
    pub default_limits: Limits,
    /// Limits by plugin name.
    pub limits: BTreeMap<String, Limits>,
    /// Plugins compiled into the binary.
    pub stock: Vec<StockPlugin>,
    /// The runtime's only way to the filesystem: the plugin folder and the compile cache.
    pub files: std::sync::Arc<dyn file_access::PluginFiles>,
}

impl std::fmt::Debug for RuntimeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeConfig")
            .field("plugin_dir", &self.plugin_dir)
            .field("cache_dir", &self.cache_dir)
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

/// A loaded plugin: one component at one digest.
pub struct LoadedPlugin {
    /// What the plugin said about itself.
    pub info: PluginInfo,
    /// Its content digest.
    pub digest: Digest,
    /// Where it came from (`stock:<name>` or a file path), for messages.
    pub origin: String,
    /// The limits its calls run under.
    pub limits: Limits,
    /// Whether the compiled form came from the cache.
    pub obtained: cache::Obtained,
    pre: PlannerPre,
}

impl LoadedPlugin {
    /// The contract version the component implements.
    pub fn contract(&self) -> Contract {
        self.pre.contract()
    }

    /// The names of what the component imports and exports, in its own order.
    pub fn interfaces(&self, engine: &Engine) -> (Vec<String>, Vec<String>) {
        let ty = self.pre.component().component_type();
        let imports = ty.imports(engine).map(|(n, _)| n.to_string()).collect();
        (imports, ty.exports(engine).map(|(n, _)| n.to_string()).collect())
    }
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("name", &self.info.name)
            .field("digest", &self.digest)
            .field("origin", &self.origin)
            .field("contract", &self.contract())
            .finish_non_exhaustive()
    }
}

/// A component pre-instantiated with the bindings of the contract it exports.
enum PlannerPre {
    /// `mounthost:plugin@0.1.0`, called through both adapters.
    V010(bindings_v010::PluginPre<CallState>),
    /// `mounthost:plugin@0.2.0`, called through [`adapter_v030`] and [`adapter_v020`].
    V020(bindings_v020::PluginPre<CallState>),
    /// `mounthost:plugin@0.3.0`, called through [`adapter_v040`] and [`adapter_v030`].
    V030(bindings_v030::PluginPre<CallState>),
    /// `mounthost:plugin@0.4.0`, called through [`adapter_v040`].
    V040(bindings_v040::PluginPre<CallState>),
    /// `mounthost:plugin@0.5.0`, the host's own terms.
    V050(bindings::PluginPre<CallState>),
}

impl PlannerPre {
    /// `pre` with the bindings of `contract`.
    fn new(contract: Contract, pre: wasmtime::component::InstancePre<CallState>) -> wasmtime::Result<Self> {
        Ok(match contract {
            Contract::V010 => PlannerPre::V010(bindings_v010::PluginPre::new(pre)?),
            Contract::V020 => PlannerPre::V020(bindings_v020::PluginPre::new(pre)?),
            Contract::V030 => PlannerPre::V030(bindings_v030::PluginPre::new(pre)?),
            Contract::V040 => PlannerPre::V040(bindings_v040::PluginPre::new(pre)?),
            Contract::V050 => PlannerPre::V050(bindings::PluginPre::new(pre)?),
        })
    }

    fn component(&self) -> &wasmtime::component::Component {
        match self {
            PlannerPre::V010(p) => p.instance_pre().component(),
            PlannerPre::V020(p) => p.instance_pre().component(),
            PlannerPre::V030(p) => p.instance_pre().component(),
            PlannerPre::V040(p) => p.instance_pre().component(),
            PlannerPre::V050(p) => p.instance_pre().component(),
        }
    }

    fn contract(&self) -> Contract {
        match self {
            PlannerPre::V010(_) => Contract::V010,
            PlannerPre::V020(_) => Contract::V020,
            PlannerPre::V030(_) => Contract::V030,
            PlannerPre::V040(_) => Contract::V040,
            PlannerPre::V050(_) => Contract::V050,
        }
    }
}

/// The runtime. Cheap to share behind an `Arc`.
pub struct PluginRuntime {
    engine: Engine,
    ticker: engine::Ticker,
    linker: Linker<CallState>,
    cache: cache::ArtifactCache,
    permits: Semaphore,
    config: RuntimeConfig,
    index: Mutex<registry::Index>,
}

/// Extra wall-clock time allowed past a deadline before the call's future is dropped. The
/// epoch check normally stops a guest within one tick; this only guards against a stuck host
/// function.
const BACKSTOP: Duration = Duration::from_millis(250);

impl PluginRuntime {
    /// Build the engine and linker. Loads nothing yet.
    pub fn new(config: RuntimeConfig) -> Result<Self, PluginError> {
        let max_memory = config
            .limits
            .values()
            .map(|l| l.memory_bytes)
            .chain([config.default_limits.memory_bytes])
            .max()
            .unwrap_or(limits::DEFAULT_MEMORY_BYTES);
        let setup =
            |reason: wasmtime::Error| PluginError::Load { origin: "runtime".into(), reason: format!("{reason:#}") };
        let engine =
            engine::build(engine::EngineOptions { concurrency: config.concurrency, max_memory_bytes: max_memory })
                .map_err(setup)?;
        let ticker = engine::Ticker::start(&engine);
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(setup)?;
        // Every contract's `host` interface: their names differ by version, so they coexist.
        bindings::Plugin::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s).map_err(setup)?;
        bindings_v040::Plugin::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s).map_err(setup)?;
        bindings_v030::Plugin::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s).map_err(setup)?;
        bindings_v020::Plugin::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s).map_err(setup)?;
        bindings_v010::Plugin::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s).map_err(setup)?;
        Ok(PluginRuntime {
            engine,
            ticker,
            linker,
            cache: cache::ArtifactCache::new(config.cache_dir.clone(), config.files.clone()),
            permits: Semaphore::new(config.concurrency.max(1) as usize),
            config,
            index: Mutex::new(registry::Index::default()),
        })
    }

    /// The engine (for benchmarks and tests).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Call one planner export of `plugin` under its limits. `volume` tags its log lines.
    pub async fn call<C: PlannerCall>(
        &self,
        plugin: &LoadedPlugin,
        volume: &str,
        req: C,
    ) -> Result<C::Output, PluginError> {
        self.invoke(&plugin.pre, &plugin.info.name, plugin.limits, volume, req).await
    }

    async fn invoke<C: PlannerCall>(
        &self,
        pre: &PlannerPre,
        plugin: &str,
        limits: Limits,
        volume: &str,
        req: C,
    ) -> Result<C::Output, PluginError> {
        let _permit = self.permits.acquire().await.expect("the semaphore is never closed");
        // Held from before any guest code runs until the call ends: the epoch (deadline checks,
        // yields) advances only while a call holds one.
        let _ticking = self.ticker.ticking();
        let state = CallState::new(plugin, volume, req.secrets(), Limiter::new(limits.memory_bytes));
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        let deadline = Instant::now() + limits.deadline;
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            if Instant::now() >= deadline {
                Err(DeadlineExceeded(limits.deadline).into())
            } else {
                // Let other calls run while this one computes, then check again next tick.
                Ok(UpdateDeadline::Yield(1))
            }
        });
        let run = async {
            match pre {
                PlannerPre::V050(pre) => {
                    let instance = pre.instantiate_async(&mut store).await?;
                    req.invoke(instance.mounthost_plugin_planner(), &mut store).await
                }
                PlannerPre::V040(pre) => {
                    let instance = pre.instantiate_async(&mut store).await?;
                    req.invoke_v040(instance.mounthost_plugin_planner(), &mut store).await
                }
                PlannerPre::V030(pre) => {
                    let instance = pre.instantiate_async(&mut store).await?;
                    req.invoke_v030(instance.mounthost_plugin_planner(), &mut store).await
                }
                PlannerPre::V020(pre) => {
                    let instance = pre.instantiate_async(&mut store).await?;
                    req.invoke_v020(instance.mounthost_plugin_planner(), &mut store).await
                }
                PlannerPre::V010(pre) => {
                    let instance = pre.instantiate_async(&mut store).await?;
                    req.invoke_v010(instance.mounthost_plugin_planner(), &mut store).await
                }
            }
        };
        let started = Instant::now();
        let outcome = match tokio::time::timeout(limits.deadline + BACKSTOP, run).await {
            Ok(outcome) => outcome,
            Err(_) => Err(DeadlineExceeded(limits.deadline).into()),
        };
        let secrets = &store.data().secrets;
        let result = match outcome {
            Ok(Ok(out)) => Ok(out),
            Ok(Err(e)) => Err(PluginError::Backend {
                plugin: plugin.to_string(),
                call: C::NAME,
                error: calls::backend_error(e, secrets),
            }),
            Err(e) => Err(classify(e, plugin, C::NAME, limits)),
        };
        let counted = match &result {
            Ok(_) => CallOutcome::Ok,
            Err(PluginError::Backend { .. }) => CallOutcome::BackendError,
            Err(PluginError::Deadline { .. }) => CallOutcome::Deadline,
            Err(PluginError::Memory { .. }) => CallOutcome::Memory,
            Err(_) => CallOutcome::Trap,
        };
        // `plugin` is a loaded plugin's name, or the file it is being loaded from (info call).
        let label = if info::valid_name(plugin) { plugin } else { "loading" };
        crate::metrics::global().plugin_call(label, C::NAME, counted, started.elapsed());
        result
    }
}

/// Turn a failed call into the error that says why.
fn classify(err: wasmtime::Error, plugin: &str, call: &'static str, limits: Limits) -> PluginError {
    let plugin = plugin.to_string();
    if err.downcast_ref::<DeadlineExceeded>().is_some() {
        PluginError::Deadline { plugin, call, deadline: limits.deadline }
    } else if let Some(m) = err.downcast_ref::<MemoryCapExceeded>() {
        PluginError::Memory { plugin, call, detail: m.to_string() }
    } else if let Some(trap) = err.downcast_ref::<Trap>() {
        PluginError::Trap { plugin, call, detail: trap.to_string() }
    } else {
        PluginError::Trap { plugin, call, detail: err.root_cause().to_string() }
    }
}
