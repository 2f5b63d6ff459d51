//! Prometheus metrics of this process: one registry, filled by the host daemon, the CSI front
//! and the plugin runtime, encoded in the OpenMetrics text format by
//! [`crate::unpriv::metrics_http`]. Pure data: recording a value has no effect on the node.
//!
//! Label values come only from the code (RPC names, gRPC codes, outcomes) or from what the host
//! has already checked (the name of a loaded plugin; the registry of a pull, which reaches the
//! blob cache only once the policy found it granted, or from the operator's `cache pull`),
//! never from a raw request field, so a client cannot blow up the number of series. No
//! repository, tag or digest is ever a label.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// The content type of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// One host daemon operation: which RPC, for which plugin, answered with which gRPC code.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    rpc: String,
    plugin: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcPlugin {
    rpc: String,
    plugin: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcCode {
    rpc: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Rpc {
    rpc: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginLabel {
    plugin: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginCall {
    plugin: String,
    call: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginOutcome {
    plugin: String,
    call: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VolumeLabels {
    plugin: String,
    phase: String,
    health: String,
}

/// A program rule: the program's name (one the node grants) and the rule's (from a rule set or
/// host config), never text of a plan.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProgramRule {
    program: String,
    rule: String,
}

/// A kind of registry refusal (a fixed word, never a registry's text).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalKind {
    kind: String,
}

/// A signature check: of a model or of a chunk index, and its result (`verified`, or the
/// refusal's reason: fixed words from the code).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SignatureLabels {
    kind: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheResult {
    result: String,
}

/// A lazy volume (its id: a volume staged on this node, whose series go at unstage) and one of
/// its quantities.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LazyLabels {
    volume: String,
    what: String,
}

/// A lazy volume's state, as its session last saw it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LazyVolume {
    pub total_bytes: u64,
    pub verified_bytes: u64,
    pub present_bytes: u64,
    pub demand_requests: u64,
    pub demand_bytes: u64,
    pub fill_bytes: u64,
    pub passthrough_files: u64,
    pub failed: bool,
    pub stalled: bool,
}

/// The registry a pull contacted, `host[:port]` as references spell it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RegistryLabel {
    registry: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RegistryFound {
    registry: String,
    found: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RegistryOutcome {
    registry: String,
    outcome: String,
}

/// How a pull found a blob it needed already on the node, as counted by
/// `mounthost_oci_blobs_deduplicated_total{found}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dedup {
    /// Complete in the node's cache.
    Cached,
    /// Being downloaded for another pull, which this one joined.
    Downloading,
}

/// How a pull ended, as counted by `mounthost_oci_pull_duration_seconds{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullOutcome {
    /// Every blob is in the cache.
    Ok,
    /// A blob's download failed for good (or the download could not start), and the pull was
    /// told so.
    Failed,
}

impl PullOutcome {
    fn label(self) -> &'static str {
        match self {
            PullOutcome::Ok => "ok",
            PullOutcome::Failed => "failed",
        }
    }
}

/// The blob bytes received from one registry: adding is one atomic add, for a download's hot
/// path.
#[derive(Clone, Debug, Default)]
pub struct ByteCounter(Counter);

impl ByteCounter {
    /// `n` more bytes.
    pub fn add(&self, n: u64) {
        self.0.inc_by(n);
    }
}

/// How a plugin call ended, as counted by `mounthost_plugin_calls_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOutcome {
    /// The planner answered.
    Ok,
    /// The planner answered with an error of its own (bad parameters, ...).
    BackendError,
    /// The guest trapped (a panic, an out-of-bounds access, ...).
    Trap,
    /// The guest hit its memory cap.
    Memory,
    /// The guest ran past its deadline.
    Deadline,
}

impl CallOutcome {
    fn label(self) -> &'static str {
        match self {
            CallOutcome::Ok => "ok",
            CallOutcome::BackendError => "backend_error",
            CallOutcome::Trap => "trap",
            CallOutcome::Memory => "memory",
            CallOutcome::Deadline => "deadline",
        }
    }
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Latency buckets from 0.5 ms to ~16 s: a publish is sub-millisecond, a stage waits for a FUSE
/// mount for seconds.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// Pull duration buckets from 10 ms (a model already in the cache) doubling to ~87 minutes (a
/// multi-GB model over a slow link): 0.01, 0.02, 0.04, ... 5242.88 s.
fn pull_time() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 20))
}

/// One live volume as the host reports it at a scrape.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct LiveVolume {
    pub plugin: String,
    /// `staging`, `staged`, `unstaging`, ... (the state file's phase).
    pub phase: String,
    pub healthy: bool,
}

/// Work a scrape awaits before encoding, such as reading the live volumes.
pub type Refresh = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// The process's metrics.
pub struct Metrics {
    registry: Registry,
    host_operations: Family<OperationLabels, Counter>,
    host_duration: Histograms<RpcPlugin>,
    csi_requests: Family<RpcCode, Counter>,
    csi_duration: Histograms<Rpc>,
    fuse_restarts: Family<PluginLabel, Counter>,
    policy_refusals: Family<ProgramRule, Counter>,
    registry_refusals: Family<RefusalKind, Counter>,
    signature_checks: Family<SignatureLabels, Counter>,
    image_left_out: Family<RefusalKind, Counter>,
    fuse_oom_kills: Family<PluginLabel, Counter>,
    volumes: Family<VolumeLabels, Gauge>,
    plugin_calls: Family<PluginOutcome, Counter>,
    plugin_duration: Histograms<PluginCall>,
    plugin_compiles: Family<CacheResult, Counter>,
    oci_fetched: Family<RegistryLabel, Counter>,
    oci_from_cache: Family<RegistryLabel, Counter>,
    oci_deduplicated: Family<RegistryFound, Counter>,
    oci_pull_duration: Histograms<RegistryOutcome>,
    oci_pulls: Family<RegistryLabel, Gauge>,
    lazy_bytes: Family<LazyLabels, Gauge>,
    lazy_fetched: Family<LazyLabels, Gauge>,
    lazy_state: Family<LazyLabels, Gauge>,
    /// Roles this process serves (`host`, `csi`) and whether each is ready.
    ready: Mutex<BTreeMap<&'static str, bool>>,
    /// Why the host daemon stands by instead of serving (another daemon holds its state
    /// directory), while it does.
    standby: Mutex<Option<String>>,
    /// One refresh per role, run before a scrape.
    refresh: Mutex<BTreeMap<&'static str, Refresh>>,
    /// When the refreshes last ran: scrapes run one at a time, and refresh at most once a
    /// second (a flood of scrapes reads the node's volumes once a second, not once each).
    refreshed: tokio::sync::Mutex<Option<std::time::Instant>>,
    /// Names of the plugins loaded so far: the values a `plugin` label may take.
    plugins: Mutex<BTreeSet<String>>,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// This process's metrics.
pub fn global() -> &'static Metrics {
    &METRICS
}

impl Metrics {
    pub(crate) fn new() -> Metrics {
        let mut registry = Registry::default();
        let host_operations = Family::<OperationLabels, Counter>::default();
        registry.register(
            "mounthost_host_operations",
            "Host daemon operations by RPC, plugin and gRPC code (code != OK is an error)",
            host_operations.clone(),
        );
        let host_duration: Histograms<RpcPlugin> = Family::new_with_constructor(latency);
        registry.register_with_unit(
            "mounthost_host_operation_duration",
            "Time the host daemon spent on one operation, by RPC and plugin",
            Unit::Seconds,
            host_duration.clone(),
        );
        let csi_requests = Family::<RpcCode, Counter>::default();
        registry.register(
            "mounthost_csi_requests",
            "CSI calls answered by the front, by RPC and gRPC code",
            csi_requests.clone(),
        );
        let csi_duration: Histograms<Rpc> = Family::new_with_constructor(latency);
        registry.register_with_unit(
            "mounthost_csi_request_duration",
            "Time the CSI front spent on one call, host daemon included, by RPC",
            Unit::Seconds,
            csi_duration.clone(),
        );
        let fuse_restarts = Family::<PluginLabel, Counter>::default();
        registry.register(
            "mounthost_fuse_restarts",
            "FUSE processes the host restarted after they died or lost their mount",
            fuse_restarts.clone(),
        );
        let policy_refusals = Family::<ProgramRule, Counter>::default();
        registry.register(
            "mounthost_policy_refusals",
            "Plans refused by a program rule (a rule set's or host config's), by program and rule",
            policy_refusals.clone(),
        );
        let registry_refusals = Family::<RefusalKind, Counter>::default();
        registry.register(
            "mounthost_registry_refusals",
            "Registry replies refused, by kind: reply_too_large, stall, realm, redirect, proof",
            registry_refusals.clone(),
        );
        let signature_checks = Family::<SignatureLabels, Counter>::default();
        registry.register(
            "mounthost_signature_checks",
            "Signature checks of models and chunk indexes (docs/signing.md), by kind (model, index) and result: verified, or the refusal's reason",
            signature_checks.clone(),
        );
        let image_left_out = Family::<RefusalKind, Counter>::default();
        registry.register(
            "mounthost_image_entries_left_out",
            "Entries of container image layers left out when unpacked (docs/plugins/model.md), by kind: device, fifo, hard_link, other; and set_id_cleared, entries kept without their set-id bits",
            image_left_out.clone(),
        );
        let fuse_oom_kills = Family::<PluginLabel, Counter>::default();
        registry.register(
            "mounthost_fuse_oom_kills",
            "OOM kills in a volume's cgroup, seen when its FUSE process was restarted",
            fuse_oom_kills.clone(),
        );
        let volumes = Family::<VolumeLabels, Gauge>::default();
        registry.register(
            "mounthost_volumes",
            "Volumes the host daemon holds, by plugin, phase and health",
            volumes.clone(),
        );
        let plugin_calls = Family::<PluginOutcome, Counter>::default();
        registry.register(
            "mounthost_plugin_calls",
            "Plugin planner calls by plugin, export and outcome (ok, backend_error, trap, memory, deadline)",
            plugin_calls.clone(),
        );
        let plugin_duration: Histograms<PluginCall> = Family::new_with_constructor(latency);
        registry.register_with_unit(
            "mounthost_plugin_call_duration",
            "Wall time of one plugin planner call, instantiation included",
            Unit::Seconds,
            plugin_duration.clone(),
        );
        let plugin_compiles = Family::<CacheResult, Counter>::default();
        registry.register(
            "mounthost_plugin_compile_cache",
            "Plugin loads by compile cache result (hit: loaded compiled code; miss: compiled)",
            plugin_compiles.clone(),
        );
        let oci_fetched = Family::<RegistryLabel, Counter>::default();
        registry.register_with_unit(
            "mounthost_oci_blob_fetched",
            "Bytes of OCI blobs received from registries into the node's cache, by registry contacted",
            Unit::Bytes,
            oci_fetched.clone(),
        );
        let oci_from_cache = Family::<RegistryLabel, Counter>::default();
        registry.register_with_unit(
            "mounthost_oci_blob_served_from_cache",
            "Bytes of OCI blobs a pull found complete in the node's cache and used without fetching, by registry",
            Unit::Bytes,
            oci_from_cache.clone(),
        );
        let oci_deduplicated = Family::<RegistryFound, Counter>::default();
        registry.register(
            "mounthost_oci_blobs_deduplicated",
            "Blobs a pull needed and found on the node: complete in the cache (cached) or being downloaded for another pull (downloading)",
            oci_deduplicated.clone(),
        );
        let oci_pull_duration: Histograms<RegistryOutcome> = Family::new_with_constructor(pull_time);
        registry.register_with_unit(
            "mounthost_oci_pull_duration",
            "Time from a pull's first request for its blobs until all were in the cache (ok) or one failed (failed)",
            Unit::Seconds,
            oci_pull_duration.clone(),
        );
        let oci_pulls = Family::<RegistryLabel, Gauge>::default();
        registry.register(
            "mounthost_oci_pulls_in_progress",
            "Pulls waiting for blobs now, by registry",
            oci_pulls.clone(),
        );
        let lazy_bytes = Family::<LazyLabels, Gauge>::default();
        registry.register_with_unit(
            "mounthost_lazy_volume",
            "A lazy volume's bytes: what=total (its layers), verified (complete blobs and chunks that matched the index), present (on the node, verified or not)",
            Unit::Bytes,
            lazy_bytes.clone(),
        );
        let lazy_fetched = Family::<LazyLabels, Gauge>::default();
        registry.register_with_unit(
            "mounthost_lazy_volume_fetched",
            "Bytes fetched for a lazy volume's blobs since the host daemon started: what=demand (for readers, ahead of the fill) or fill (the background fill)",
            Unit::Bytes,
            lazy_fetched.clone(),
        );
        let lazy_state = Family::<LazyLabels, Gauge>::default();
        registry.register(
            "mounthost_lazy_volume_state",
            "A lazy volume's counts and flags: what=demand_requests (ranges fetched for readers), passthrough_files, failed (1: a blob failed verification, every read fails), stalled (1: the fill stopped for now)",
            lazy_state.clone(),
        );
        Metrics {
            registry,
            host_operations,
            host_duration,
            csi_requests,
            csi_duration,
            fuse_restarts,
            policy_refusals,
            registry_refusals,
            signature_checks,
            image_left_out,
            fuse_oom_kills,
            volumes,
            plugin_calls,
            plugin_duration,
            plugin_compiles,
            oci_fetched,
            oci_from_cache,
            oci_deduplicated,
            oci_pull_duration,
            oci_pulls,
            lazy_bytes,
            lazy_fetched,
            lazy_state,
            ready: Mutex::new(BTreeMap::new()),
            standby: Mutex::new(None),
            refresh: Mutex::new(BTreeMap::new()),
            refreshed: tokio::sync::Mutex::new(None),
            plugins: Mutex::new(BTreeSet::new()),
        }
    }

    /// The counter of blob bytes received from `registry` (`host[:port]`, the host contacted).
    pub fn oci_fetched(&self, registry: &str) -> ByteCounter {
        ByteCounter(self.oci_fetched.get_or_create(&registry_label(registry)).clone())
    }

    /// A pull found a blob of `bytes` complete in the cache and used it without fetching.
    pub fn oci_served_from_cache(&self, registry: &str, bytes: u64) {
        self.oci_from_cache.get_or_create(&registry_label(registry)).inc_by(bytes);
    }

    /// A pull found a blob it needed already on the node.
    pub fn oci_deduplicated(&self, registry: &str, found: Dedup) {
        let found = match found {
            Dedup::Cached => "cached",
            Dedup::Downloading => "downloading",
        };
        self.oci_deduplicated.get_or_create(&RegistryFound { registry: registry.into(), found: found.into() }).inc();
    }

    /// A pull from `registry` began: it is in progress until it finishes or is abandoned. Its
    /// registry's byte and blob counters exist (at 0) from now on.
    pub fn oci_pull_started(&self, registry: &str) {
        let label = registry_label(registry);
        self.oci_pulls.get_or_create(&label).inc();
        let _ = self.oci_fetched.get_or_create(&label);
        let _ = self.oci_from_cache.get_or_create(&label);
        for found in ["cached", "downloading"] {
            let _ =
                self.oci_deduplicated.get_or_create(&RegistryFound { registry: registry.into(), found: found.into() });
        }
    }

    /// A pull from `registry` ended after `took`.
    pub fn oci_pull_finished(&self, registry: &str, outcome: PullOutcome, took: Duration) {
        self.oci_pulls.get_or_create(&registry_label(registry)).dec();
        self.oci_pull_duration
            .get_or_create(&RegistryOutcome { registry: registry.into(), outcome: outcome.label().into() })
            .observe(took.as_secs_f64());
    }

    /// A pull from `registry` stopped waiting before it ended (its volume was unstaged, its
    /// operator went away, it asked for other blobs): no longer in progress, and not timed.
    pub fn oci_pull_abandoned(&self, registry: &str) {
        self.oci_pulls.get_or_create(&registry_label(registry)).dec();
    }

    /// A host daemon operation finished.
    pub fn host_operation(&self, rpc: &str, plugin: &str, code: tonic::Code, took: Duration) {
        self.host_operations
            .get_or_create(&OperationLabels { rpc: rpc.into(), plugin: plugin.into(), code: code_name(code) })
            .inc();
        self.host_duration
            .get_or_create(&RpcPlugin { rpc: rpc.into(), plugin: plugin.into() })
            .observe(took.as_secs_f64());
    }

    /// A CSI call finished at the front.
    pub fn csi_request(&self, rpc: &str, code: tonic::Code, took: Duration) {
        self.csi_requests.get_or_create(&RpcCode { rpc: rpc.into(), code: code_name(code) }).inc();
        self.csi_duration.get_or_create(&Rpc { rpc: rpc.into() }).observe(took.as_secs_f64());
    }

    /// A lazy volume's state now.
    pub fn lazy_volume(&self, volume: &str, v: &LazyVolume) {
        let label = |what: &str| LazyLabels { volume: volume.into(), what: what.into() };
        let set = |f: &Family<LazyLabels, Gauge>, what: &str, n: u64| {
            f.get_or_create(&label(what)).set(i64::try_from(n).unwrap_or(i64::MAX));
        };
        set(&self.lazy_bytes, "total", v.total_bytes);
        set(&self.lazy_bytes, "verified", v.verified_bytes);
        set(&self.lazy_bytes, "present", v.present_bytes);
        set(&self.lazy_fetched, "demand", v.demand_bytes);
        set(&self.lazy_fetched, "fill", v.fill_bytes);
        set(&self.lazy_state, "demand_requests", v.demand_requests);
        set(&self.lazy_state, "passthrough_files", v.passthrough_files);
        set(&self.lazy_state, "failed", u64::from(v.failed));
        set(&self.lazy_state, "stalled", u64::from(v.stalled));
    }

    /// A lazy volume is gone (unstaged): its series go.
    pub fn lazy_volume_gone(&self, volume: &str) {
        for what in ["total", "verified", "present"] {
            self.lazy_bytes.remove(&LazyLabels { volume: volume.into(), what: what.into() });
        }
        for what in ["demand", "fill"] {
            self.lazy_fetched.remove(&LazyLabels { volume: volume.into(), what: what.into() });
        }
        for what in ["demand_requests", "passthrough_files", "failed", "stalled"] {
            self.lazy_state.remove(&LazyLabels { volume: volume.into(), what: what.into() });
        }
    }

    /// The host restarted a volume's FUSE process; `oom_kills` new OOM kills were seen.
    pub fn fuse_restart(&self, plugin: &str, oom_kills: u64) {
        let label = PluginLabel { plugin: plugin.into() };
        self.fuse_restarts.get_or_create(&label).inc();
        if oom_kills > 0 {
            self.fuse_oom_kills.get_or_create(&label).inc_by(oom_kills);
        } else {
            // The series exists (at 0) once its plugin has had a restart.
            let _ = self.fuse_oom_kills.get_or_create(&label);
        }
    }

    /// A registry's reply was refused (`kind`: reply_too_large, stall, realm, redirect, proof).
    pub fn registry_refusal(&self, kind: &str) {
        self.registry_refusals.get_or_create(&RefusalKind { kind: kind.into() }).inc();
    }

    /// A signature check of `kind` (`model`, `index`) ended with `result` (`verified`, or a
    /// refusal's reason).
    pub fn signature_check(&self, kind: &str, result: &str) {
        self.signature_checks.get_or_create(&SignatureLabels { kind: kind.into(), result: result.into() }).inc();
    }

    /// `n` entries of an image layer were left out (`kind`: device, fifo, hard_link, other) or
    /// kept without their set-id bits (`set_id_cleared`).
    pub fn image_entries_left_out(&self, kind: &str, n: u64) {
        if n > 0 {
            self.image_left_out.get_or_create(&RefusalKind { kind: kind.into() }).inc_by(n);
        }
    }

    /// A plan was refused by `program`'s rule `rule`.
    pub fn policy_refusal(&self, program: &str, rule: &str) {
        self.policy_refusals.get_or_create(&ProgramRule { program: program.into(), rule: rule.into() }).inc();
    }

    /// A plugin planner call finished.
    pub fn plugin_call(&self, plugin: &str, call: &str, outcome: CallOutcome, took: Duration) {
        self.plugin_calls
            .get_or_create(&PluginOutcome { plugin: plugin.into(), call: call.into(), outcome: outcome.label().into() })
            .inc();
        self.plugin_duration
            .get_or_create(&PluginCall { plugin: plugin.into(), call: call.into() })
            .observe(took.as_secs_f64());
    }

    /// Plugin `name` was loaded, from compiled code (`cached`) or compiled now. Its name becomes
    /// a `plugin` label value.
    pub fn plugin_loaded(&self, name: &str, cached: bool) {
        self.plugin_compiles.get_or_create(&CacheResult { result: if cached { "hit" } else { "miss" }.into() }).inc();
        self.plugins.lock().unwrap_or_else(|e| e.into_inner()).insert(name.to_string());
    }

    /// `candidate` if it names a plugin this process has loaded, else `unknown`: a request
    /// naming a made-up plugin adds no series.
    pub fn plugin_label(&self, candidate: Option<&str>) -> String {
        let plugins = self.plugins.lock().unwrap_or_else(|e| e.into_inner());
        match candidate {
            Some(p) if plugins.contains(p) => p.to_string(),
            _ => "unknown".to_string(),
        }
    }

    /// Replace the live-volume gauge with what the host holds now.
    pub fn set_volumes(&self, volumes: &[LiveVolume]) {
        let mut counts: BTreeMap<&LiveVolume, i64> = BTreeMap::new();
        for v in volumes {
            *counts.entry(v).or_default() += 1;
        }
        self.volumes.clear();
        for (v, n) in counts {
            let health = if v.healthy { "healthy" } else { "unhealthy" };
            self.volumes
                .get_or_create(&VolumeLabels {
                    plugin: v.plugin.clone(),
                    phase: v.phase.clone(),
                    health: health.into(),
                })
                .set(n);
        }
    }

    /// This process serves `role` (`host` or `csi`); it is not ready until [`Self::set_ready`].
    pub fn expect_role(&self, role: &'static str) {
        self.ready.lock().unwrap_or_else(|e| e.into_inner()).entry(role).or_insert(false);
    }

    /// `role` is ready (the host daemon after reconciling, the front once it listens).
    pub fn set_ready(&self, role: &'static str) {
        self.ready.lock().unwrap_or_else(|e| e.into_inner()).insert(role, true);
    }

    /// The host daemon stands by for `why` (`None`: no longer). `/readyz` answers 200
    /// `standby: <why>` while the host is the only role not ready, so the surge pod of a
    /// rolling update becomes available and the old pod is stopped.
    pub fn set_standby(&self, why: Option<String>) {
        *self.standby.lock().unwrap_or_else(|e| e.into_inner()) = why;
    }

    /// Why the host daemon stands by, while it does.
    pub fn standby(&self) -> Option<String> {
        self.standby.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Roles not ready yet (empty: ready).
    pub fn not_ready(&self) -> Vec<&'static str> {
        let ready = self.ready.lock().unwrap_or_else(|e| e.into_inner());
        ready.iter().filter(|(_, ok)| !**ok).map(|(role, _)| *role).collect()
    }

    /// Run `refresh` before every scrape (one per role; a later one replaces it).
    pub fn on_scrape(&self, role: &'static str, refresh: Refresh) {
        self.refresh.lock().unwrap_or_else(|e| e.into_inner()).insert(role, refresh);
    }

    /// Refresh what is read at scrape time (unless that happened within the last second),
    /// then encode; one scrape at a time.
    pub async fn scrape(&self) -> String {
        let mut refreshed = self.refreshed.lock().await;
        if refreshed.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
            let refresh: Vec<Refresh> =
                self.refresh.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
            for r in refresh {
                r().await;
            }
            *refreshed = Some(std::time::Instant::now());
        }
        self.encode()
    }

    /// The registry in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String never fails");
        out
    }
}

fn registry_label(registry: &str) -> RegistryLabel {
    RegistryLabel { registry: registry.to_string() }
}

/// `OK`, `NOT_FOUND`, ...: the names the gRPC spec gives the codes.
fn code_name(code: tonic::Code) -> String {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_openmetrics_with_the_recorded_values() {
        let m = Metrics::new();
        m.host_operation("NodeStageVolume", "seaweedfs", tonic::Code::Ok, Duration::from_millis(3));
        m.host_operation("NodeStageVolume", "seaweedfs", tonic::Code::InvalidArgument, Duration::from_millis(1));
        m.plugin_call("seaweedfs", "stage", CallOutcome::Deadline, Duration::from_secs(1));
        m.set_volumes(&[
            LiveVolume { plugin: "seaweedfs".into(), phase: "staged".into(), healthy: true },
            LiveVolume { plugin: "seaweedfs".into(), phase: "staged".into(), healthy: true },
        ]);
        let text = m.encode();
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(
            text.contains(
                "mounthost_host_operations_total{rpc=\"NodeStageVolume\",plugin=\"seaweedfs\",code=\"INVALID_ARGUMENT\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("# UNIT mounthost_host_operation_duration_seconds seconds"), "{text}");
        assert!(
            text.contains("mounthost_plugin_calls_total{plugin=\"seaweedfs\",call=\"stage\",outcome=\"deadline\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("mounthost_volumes{plugin=\"seaweedfs\",phase=\"staged\",health=\"healthy\"} 2"),
            "{text}"
        );
        // A new snapshot replaces the old one: gone volumes leave no stale series.
        m.set_volumes(&[]);
        assert!(!m.encode().contains("mounthost_volumes{"));
    }

    /// docs/metrics.md lists exactly the metrics the registry has, with their types.
    #[test]
    fn the_docs_list_every_metric() {
        let m = Metrics::new();
        m.host_operation("NodeStageVolume", "p", tonic::Code::Ok, Duration::ZERO);
        m.csi_request("Probe", tonic::Code::Ok, Duration::ZERO);
        m.fuse_restart("p", 1);
        m.policy_refusal("weed", "subcommand");
        m.registry_refusal("stall");
        m.signature_check("model", "verified");
        m.image_entries_left_out("device", 2);
        m.plugin_call("p", "stage", CallOutcome::Ok, Duration::ZERO);
        m.plugin_loaded("p", true);
        m.set_volumes(&[LiveVolume { plugin: "p".into(), phase: "staged".into(), healthy: true }]);
        m.oci_pull_started("r");
        m.oci_pull_finished("r", PullOutcome::Ok, Duration::ZERO);
        m.lazy_volume("v", &LazyVolume::default());
        let registered: BTreeSet<(String, String)> = m
            .encode()
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| {
                let (name, kind) = l.split_once(' ').unwrap();
                let name = if kind == "counter" { format!("{name}_total") } else { name.to_string() };
                (name, kind.to_string())
            })
            .collect();
        let docs = include_str!("../../docs/metrics.md");
        let documented: BTreeSet<(String, String)> = docs
            .lines()
            .filter_map(|l| l.strip_prefix("| `mounthost_"))
            .map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                (format!("mounthost_{}", cells[0].trim_end_matches('`')), cells[1].to_string())
            })
            .collect();
        assert_eq!(registered.len(), 22, "{registered:?}");
        assert_eq!(documented, registered);
    }

    #[test]
    fn pulls_are_counted_by_registry() {
        let m = Metrics::new();
        let fetched = m.oci_fetched("reg.example:5000");
        m.oci_pull_started("reg.example:5000");
        m.oci_pull_started("reg.example:5000");
        m.oci_pull_started("other.example");
        fetched.add(700);
        fetched.clone().add(300);
        m.oci_served_from_cache("reg.example:5000", 42);
        m.oci_deduplicated("reg.example:5000", Dedup::Cached);
        m.oci_deduplicated("reg.example:5000", Dedup::Downloading);
        m.oci_deduplicated("reg.example:5000", Dedup::Downloading);
        m.oci_pull_finished("reg.example:5000", PullOutcome::Ok, Duration::from_millis(30));
        m.oci_pull_finished("other.example", PullOutcome::Failed, Duration::from_secs(3));
        let text = m.encode();
        for line in [
            "mounthost_oci_blob_fetched_bytes_total{registry=\"reg.example:5000\"} 1000",
            "mounthost_oci_blob_fetched_bytes_total{registry=\"other.example\"} 0",
            "mounthost_oci_blob_served_from_cache_bytes_total{registry=\"reg.example:5000\"} 42",
            "mounthost_oci_blobs_deduplicated_total{registry=\"reg.example:5000\",found=\"cached\"} 1",
            "mounthost_oci_blobs_deduplicated_total{registry=\"reg.example:5000\",found=\"downloading\"} 2",
            "mounthost_oci_blobs_deduplicated_total{registry=\"other.example\",found=\"cached\"} 0",
            "mounthost_oci_pulls_in_progress{registry=\"reg.example:5000\"} 1",
            "mounthost_oci_pulls_in_progress{registry=\"other.example\"} 0",
            "mounthost_oci_pull_duration_seconds_count{registry=\"reg.example:5000\",outcome=\"ok\"} 1",
            "mounthost_oci_pull_duration_seconds_bucket{le=\"0.04\",registry=\"reg.example:5000\",outcome=\"ok\"} 1",
            "mounthost_oci_pull_duration_seconds_bucket{le=\"0.02\",registry=\"reg.example:5000\",outcome=\"ok\"} 0",
            "mounthost_oci_pull_duration_seconds_count{registry=\"other.example\",outcome=\"failed\"} 1",
            "mounthost_oci_pull_duration_seconds_bucket{le=\"5242.88\",registry=\"other.example\",outcome=\"failed\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "no line {line}:\n{text}");
        }
        // An abandoned pull leaves progress and is not timed.
        m.oci_pull_abandoned("reg.example:5000");
        let text = m.encode();
        assert!(text.contains("mounthost_oci_pulls_in_progress{registry=\"reg.example:5000\"} 0"), "{text}");
        assert!(
            text.contains("mounthost_oci_pull_duration_seconds_count{registry=\"reg.example:5000\",outcome=\"ok\"} 1")
        );
    }

    #[test]
    fn readiness_waits_for_every_role() {
        let m = Metrics::new();
        assert!(m.not_ready().is_empty());
        m.expect_role("host");
        m.expect_role("csi");
        m.set_ready("csi");
        assert_eq!(m.not_ready(), ["host"]);
        m.set_ready("host");
        assert!(m.not_ready().is_empty());
    }

    #[test]
    fn a_lazy_volume_has_its_series_until_it_is_gone() {
        let m = Metrics::new();
        let v = LazyVolume { total_bytes: 10, verified_bytes: 4, demand_bytes: 3, failed: true, ..Default::default() };
        m.lazy_volume("pv-1", &v);
        let text = m.encode();
        assert!(text.contains(r#"mounthost_lazy_volume_bytes{volume="pv-1",what="total"} 10"#), "{text}");
        assert!(text.contains(r#"mounthost_lazy_volume_bytes{volume="pv-1",what="verified"} 4"#), "{text}");
        assert!(text.contains(r#"mounthost_lazy_volume_fetched_bytes{volume="pv-1",what="demand"} 3"#), "{text}");
        assert!(text.contains(r#"mounthost_lazy_volume_state{volume="pv-1",what="failed"} 1"#), "{text}");
        m.lazy_volume_gone("pv-1");
        assert!(!m.encode().contains("pv-1"), "no series left");
    }
}
