//! The plugin runtime against real components: the misbehaving fixture, the filesystem
//! importer and the stock plugins. Each failure must be contained to its own call, with a
//! precise error, and a healthy call must succeed right after it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mounthost::config::Config;
use mounthost::error::ErrorKind;
use mounthost::plan::policy::{self, Context, Grant, Operation};
use mounthost::plugin::bindings::types as wit;
use mounthost::plugin::cache::Obtained;
use mounthost::plugin::{BackendError, Contract, Limits, LoadedPlugin, PluginError, PluginRuntime, RuntimeConfig};
use mounthost::secrets::Secrets;
use mounthost::stock::fixtures;
use mounthost::telemetry::Captured;
use mounthost::volume::VolumeDirs;

struct Env {
    _dir: tempfile::TempDir,
    plugin_dir: PathBuf,
    cache_dir: PathBuf,
    runtime: PluginRuntime,
}

fn config(plugin_dir: &Path, cache_dir: &Path, misbehave: Limits) -> RuntimeConfig {
    RuntimeConfig {
        plugin_dir: Some(plugin_dir.to_path_buf()),
        cache_dir: Some(cache_dir.to_path_buf()),
        limits: [("misbehave".to_string(), misbehave)].into(),
        ..RuntimeConfig::default()
    }
}

/// A runtime whose plugin folder holds the misbehave fixture.
fn env(misbehave: Limits) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let plugin_dir = dir.path().join("plugins");
    let cache_dir = dir.path().join("cache");
    std::fs::create_dir(&plugin_dir).unwrap();
    std::fs::copy(fixtures::path("misbehave"), plugin_dir.join("misbehave.wasm")).unwrap();
    let runtime = PluginRuntime::new(config(&plugin_dir, &cache_dir, misbehave)).unwrap();
    Env { _dir: dir, plugin_dir, cache_dir, runtime }
}

fn fast() -> Limits {
    Limits { deadline: Duration::from_millis(300), memory_bytes: 64 << 20 }
}

fn stage_request(mode: &str) -> wit::StageRequest {
    wit::StageRequest {
        volume_id: "vol-1".into(),
        context: vec![wit::Kv { key: "mode".into(), value: mode.into() }],
        secrets: vec![wit::Kv { key: "token".into(), value: "hunter22".into() }],
        capability: wit::VolumeCapability {
            access_mode: wit::AccessMode::SingleNodeWriter,
            fs_type: String::new(),
            mount_flags: vec![],
        },
        ephemeral: false,
        resolved: None,
        looked_up: vec![],
        node_id: "node-1".into(),
    }
}

async fn stage(rt: &PluginRuntime, p: &LoadedPlugin, mode: &str) -> Result<wit::Plan, PluginError> {
    rt.call(p, "vol-1", stage_request(mode)).await
}

/// The healthy call that must work after every failure.
async fn assert_healthy(rt: &PluginRuntime, p: &LoadedPlugin) {
    let plan = stage(rt, p, "ok").await.expect("a healthy call right after a failure");
    assert_eq!(plan.steps.len(), 1);
    assert_eq!(plan.attributes, vec![wit::Kv { key: "mode".into(), value: "planned".into() }]);
}

/// `mounthost_plugin_calls_total` of the misbehave plugin's stage calls ending in `outcome`, from
/// this process's registry (tests run in parallel: counts only grow).
fn counted(outcome: &str) -> u64 {
    let line = format!("mounthost_plugin_calls_total{{plugin=\"misbehave\",call=\"stage\",outcome=\"{outcome}\"}} ");
    let text = mounthost::metrics::global().encode();
    text.lines().find_map(|l| l.strip_prefix(&line)).map_or(0, |n| n.parse().unwrap())
}

#[tokio::test]
async fn an_endless_loop_is_stopped_at_its_deadline() {
    let e = env(fast());
    let p = e.runtime.resolve("misbehave", None).await.unwrap();
    let started = Instant::now();
    let err = stage(&e.runtime, &p, "spin").await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, PluginError::Deadline { call: "stage", .. }), "{err}");
    assert_eq!(err.kind(), ErrorKind::DeadlineExceeded);
    assert!(err.to_string().contains("within its deadline of 300ms"), "{err}");
    assert!(took >= Duration::from_millis(300), "stopped before its deadline: {took:?}");
    assert!(counted("deadline") >= 1, "deadline hits are counted");
    assert_healthy(&e.runtime, &p).await;
}

#[tokio::test]
async fn a_one_gib_allocation_is_refused() {
    let e = env(fast());
    let p = e.runtime.resolve("misbehave", None).await.unwrap();
    let err = stage(&e.runtime, &p, "alloc").await.unwrap_err();
    assert!(matches!(err, PluginError::Memory { .. }), "{err}");
    assert!(err.to_string().contains("its limit is 67108864 bytes"), "{err}");
    assert!(counted("memory") >= 1, "memory cap hits are counted");
    assert_healthy(&e.runtime, &p).await;
}

#[tokio::test]
async fn a_trap_fails_only_its_call() {
    let e = env(fast());
    let p = e.runtime.resolve("misbehave", None).await.unwrap();
    let err = stage(&e.runtime, &p, "trap").await.unwrap_err();
    assert!(matches!(err, PluginError::Trap { .. }), "{err}");
    assert_eq!(err.kind(), ErrorKind::Internal);
    assert!(err.to_string().contains("unreachable"), "{err}");
    assert!(counted("trap") >= 1, "traps are counted");
    assert_healthy(&e.runtime, &p).await;
}

#[tokio::test]
async fn a_backend_error_keeps_its_class() {
    let e = env(fast());
    let p = e.runtime.resolve("misbehave", None).await.unwrap();
    let err = stage(&e.runtime, &p, "error").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert_eq!(err.to_string(), "plugin misbehave refused stage: not found: the thing is not there");
    let err = stage(&e.runtime, &p, "no-such-mode").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert_healthy(&e.runtime, &p).await;
}

#[tokio::test]
async fn a_log_flood_is_capped_and_the_call_succeeds() {
    let e = env(fast());
    let p = e.runtime.resolve("misbehave", None).await.unwrap();
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).finish();
    // The test runtime is single-threaded, so the call's events go to this thread's subscriber.
    let plan = {
        let _guard = tracing::subscriber::set_default(subscriber);
        stage(&e.runtime, &p, "log-flood").await.unwrap()
    };
    assert_eq!(plan.steps.len(), 1);
    let text = captured.text();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("mounthost::plugin")).collect();
    assert_eq!(lines.len(), 64 + 1, "64 lines kept plus one warning");
    assert!(
        lines[0].contains("line 0") && lines[0].contains("plugin=misbehave") && lines[0].contains("volume.id=vol-1"),
        "{}",
        lines[0]
    );
    assert!(lines[64].contains("log limit of 64 lines reached"), "{}", lines[64]);
}

#[tokio::test]
async fn a_component_importing_the_filesystem_is_refused_at_load() {
    let e = env(fast());
    let err = e.runtime.load_file(&fixtures::path("fs-reader")).await.unwrap_err();
    let PluginError::ForbiddenImports { imports, .. } = &err else { panic!("{err}") };
    assert!(imports.iter().any(|i| i.starts_with("wasi:filesystem/")), "{imports:?}");
    assert_eq!(err.kind(), ErrorKind::FailedPrecondition);
    // The same file dropped into the plugin folder is skipped, and the folder keeps working.
    std::fs::copy(fixtures::path("fs-reader"), e.plugin_dir.join("fs-reader.wasm")).unwrap();
    let err = e.runtime.resolve("fs-reader", None).await.unwrap_err();
    assert!(matches!(err, PluginError::UnknownPlugin { .. }), "{err}");
    let p = e.runtime.resolve("misbehave", None).await.unwrap();
    assert_healthy(&e.runtime, &p).await;
}

/// The policy the host applies to the misbehave fixture in these tests.
struct Policy {
    grant: Grant,
    programs: std::collections::BTreeMap<String, PathBuf>,
    dirs: VolumeDirs,
    secrets: Secrets,
}

impl Policy {
    fn new() -> Self {
        let mut cfg = Config::new("/var/lib/mounthost".into());
        cfg.programs.insert("fusetest".into(), "/usr/bin/true".into());
        let mut dirs = VolumeDirs::host_owned(&cfg.state_dir, "vol-1");
        dirs.staging = Some("/var/lib/kubelet/plugins/kubernetes.io/csi/csi.mounthost.dev/h/globalmount".into());
        Policy {
            grant: Grant {
                programs: ["fusetest".to_string()].into(),
                fstypes: ["tmpfs".to_string(), "fuse.test".to_string()].into(),
                hosts: Default::default(),
            },
            programs: cfg.programs,
            dirs,
            secrets: [("token".to_string(), "hunter22".to_string())].into_iter().collect(),
        }
    }

    fn check(&self, p: &LoadedPlugin, plan: wit::Plan) -> Result<mounthost::plan::Plan, policy::PolicyError> {
        let ctx = Context {
            operation: Operation::Stage,
            plugin: &p.info.name,
            digest: p.digest.to_string(),
            grant: &self.grant,
            programs: &self.programs,
            program_args: &Default::default(),
            rules: &Default::default(),
            endpoint_hosts: Default::default(),
            dirs: &self.dirs,
            secrets: &self.secrets,
        };
        policy::check(&ctx, plan)
    }
}

#[tokio::test]
async fn plans_that_overstep_are_refused_by_policy() {
    let e = env(fast());
    let p = e.runtime.resolve("misbehave", None).await.unwrap();
    let policy = Policy::new();
    for (mode, reason) in [
        ("escape", "would leave the volume's directory"),
        ("program-path", "\"/bin/sh\" is a path"),
        ("absolute", "is absolute"),
        ("argv-secret", "contains the value of secret \"token\""),
        ("bad-fstype", "fstype \"ext4\" is not allowed"),
        ("bad-env", "must match [A-Za-z_][A-Za-z0-9_]*"),
    ] {
        let plan = stage(&e.runtime, &p, mode).await.unwrap();
        let err = policy.check(&p, plan).unwrap_err();
        assert_eq!(err.index, 1, "{mode}: {err}");
        assert!(err.reason.contains(reason), "{mode}: {err}");
        let ok = policy.check(&p, stage(&e.runtime, &p, "ok").await.unwrap()).unwrap();
        assert_eq!(ok.steps[0].kind(), "mount");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spinning_call_does_not_hold_up_others() {
    let e = Arc::new(env(Limits { deadline: Duration::from_secs(3), memory_bytes: 64 << 20 }));
    let p = e.runtime.resolve("misbehave", None).await.unwrap();
    let spin_done = Arc::new(AtomicBool::new(false));
    let spinner = {
        let (e, p, done) = (e.clone(), p.clone(), spin_done.clone());
        tokio::spawn(async move {
            let r = stage(&e.runtime, &p, "spin").await;
            done.store(true, Ordering::SeqCst);
            r
        })
    };
    let healthy: Vec<_> = (0..200)
        .map(|_| {
            let (e, p, done) = (e.clone(), p.clone(), spin_done.clone());
            tokio::spawn(async move {
                stage(&e.runtime, &p, "ok").await.unwrap();
                done.load(Ordering::SeqCst)
            })
        })
        .collect();
    for h in healthy {
        assert!(!h.await.unwrap(), "a healthy call waited for the spinning one to be stopped");
    }
    assert!(matches!(spinner.await.unwrap(), Err(PluginError::Deadline { .. })));
}

/// The same component with an extra custom section: same behaviour, different digest.
fn variant_of(wasm: &[u8], tag: &str) -> Vec<u8> {
    let mut out = wasm.to_vec();
    let name = b"mounthost-test";
    let payload_len = 1 + name.len() + tag.len();
    out.push(0); // custom section
    out.push(u8::try_from(payload_len).unwrap());
    out.push(u8::try_from(name.len()).unwrap());
    out.extend_from_slice(name);
    out.extend_from_slice(tag.as_bytes());
    out
}

#[tokio::test]
async fn the_folder_is_watched_and_digests_can_be_pinned() {
    let e = env(fast());
    let first = e.runtime.resolve("misbehave", None).await.unwrap();
    // Replace the file in place: the next lookup uses the new version, the old stays pinnable.
    let wasm = std::fs::read(fixtures::path("misbehave")).unwrap();
    std::fs::write(e.plugin_dir.join("misbehave.wasm"), variant_of(&wasm, "v2")).unwrap();
    let second = e.runtime.resolve("misbehave", None).await.unwrap();
    assert_ne!(first.digest, second.digest);
    let pinned = e.runtime.resolve("misbehave", Some(&first.digest.to_string())).await.unwrap();
    assert_eq!(pinned.digest, first.digest);
    assert_healthy(&e.runtime, &pinned).await;

    let other = format!("sha256:{}", "0".repeat(64));
    let err = e.runtime.resolve("misbehave", Some(&other)).await.unwrap_err();
    assert!(matches!(err, PluginError::UnknownDigest { .. }), "{err}");
    assert!(err.to_string().contains(&second.digest.to_string()), "lists the loaded digests: {err}");
    assert_eq!(err.kind(), ErrorKind::FailedPrecondition);
    let err = e.runtime.resolve("misbehave", Some("sha256:xyz")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);

    // A new file is picked up without a restart; a removed one is forgotten.
    std::fs::copy(fixtures::path("misbehave"), e.plugin_dir.join("zz-copy.wasm")).unwrap();
    std::fs::remove_file(e.plugin_dir.join("misbehave.wasm")).unwrap();
    let third = e.runtime.resolve("misbehave", None).await.unwrap();
    assert_eq!(third.digest, first.digest);
    std::fs::remove_file(e.plugin_dir.join("zz-copy.wasm")).unwrap();
    let err = e.runtime.resolve("misbehave", None).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(err.to_string().contains("known plugins: model, seaweedfs"), "{err}");
}

#[tokio::test]
async fn compiled_plugins_are_cached_on_disk_privately() {
    use std::os::unix::fs::PermissionsExt;
    let e = env(fast());
    let p = e.runtime.resolve("misbehave", None).await.unwrap();
    assert_eq!(p.obtained, Obtained::Compiled);
    let files: Vec<_> = std::fs::read_dir(&e.cache_dir).unwrap().map(|f| f.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].file_name().unwrap().to_string_lossy().starts_with(&p.digest.hex()));
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode(&e.cache_dir), mode(&files[0])), (0o700, 0o600));

    // A restarted runtime loads the compiled form instead of compiling.
    let again = PluginRuntime::new(config(&e.plugin_dir, &e.cache_dir, fast())).unwrap();
    let p2 = again.resolve("misbehave", None).await.unwrap();
    assert_eq!((p2.obtained, &p2.digest), (Obtained::Cached, &p.digest));
    assert_healthy(&again, &p2).await;

    // An artifact someone else could have written is never trusted: it is recompiled.
    std::fs::set_permissions(&files[0], std::fs::Permissions::from_mode(0o666)).unwrap();
    let third = PluginRuntime::new(config(&e.plugin_dir, &e.cache_dir, fast())).unwrap();
    let p3 = third.resolve("misbehave", None).await.unwrap();
    assert_eq!(p3.obtained, Obtained::Compiled);
    assert_eq!(mode(&files[0]), 0o600, "the untrusted artifact was replaced");
}

#[tokio::test]
async fn stock_plugins_resolve_by_name() {
    let e = env(fast());
    let p = e.runtime.resolve("seaweedfs", None).await.unwrap();
    assert_eq!(p.origin, "stock:seaweedfs");
    assert!(p.info.programs.contains(&"weed".to_string()));
    let names: Vec<_> = e.runtime.list().await.iter().map(|p| p.info.name.clone()).collect();
    assert_eq!(names, ["misbehave", "model", "seaweedfs"]);
    let err = e.runtime.resolve("nfs", None).await.unwrap_err();
    assert_eq!(err.to_string(), "unknown plugin \"nfs\"; known plugins: misbehave, model, seaweedfs");
}

/// A stage request for the legacy (contract 0.1.0) fixture.
fn legacy_request(context: &[(&str, &str)]) -> wit::StageRequest {
    let kvs = context.iter().map(|(k, v)| wit::Kv { key: k.to_string(), value: v.to_string() }).collect();
    wit::StageRequest { context: kvs, ..stage_request("ok") }
}

#[tokio::test]
async fn a_contract_0_1_0_plugin_loads_and_plans_through_the_adapter() {
    let e = env(fast());
    let legacy = e.runtime.load_file(&fixtures::path("legacy")).await.unwrap();
    assert_eq!(legacy.contract(), Contract::V010);
    assert_eq!(legacy.contract().to_string(), "0.1.0");
    assert_eq!(
        (legacy.info.name.as_str(), legacy.info.fstypes.as_slice()),
        ("legacy", ["tmpfs".to_string()].as_slice())
    );
    let kinds: Vec<_> = legacy.info.parameters.iter().map(|p| (p.name.as_str(), p.kind)).collect();
    assert_eq!(kinds, [("sizeMiB", "integer"), ("pathOption", "text"), ("fail", "choice")]);
    let current = e.runtime.resolve("misbehave", None).await.unwrap();
    assert_eq!(current.contract(), Contract::CURRENT, "SDK plugins speak the current contract");

    // The plan comes back in current terms (through both adapters): a 0.1.0 path argument has an
    // empty suffix.
    let plan =
        e.runtime.call(&legacy, "vol-1", legacy_request(&[("sizeMiB", "8"), ("pathOption", "x")])).await.unwrap();
    let cache = wit::PathRef { root: wit::DirRoot::Cache, rel: String::new() };
    let expected = wit::Step::Mount(wit::Mount {
        fstype: "tmpfs".into(),
        source: wit::MountSource::Named("tmpfs".into()),
        target: wit::PathRef { root: wit::DirRoot::Staging, rel: String::new() },
        options: vec![
            wit::Arg::Literal("size=8m".into()),
            wit::Arg::Literal("mode=0755".into()),
            wit::Arg::Path(wit::PathArg { prefix: "x=".into(), path: cache, suffix: String::new() }),
        ],
        readonly: false,
    });
    assert_eq!(plan.steps, [expected]);
    assert_eq!(plan.attributes, [wit::Kv { key: "contract".into(), value: "0.1.0".into() }]);
    // And the host's policy takes it like any other.
    let checked = Policy::new().check(&legacy, plan).unwrap();
    let mounthost::plan::Step::Mount { options, .. } = &checked.steps[0] else { panic!("{checked:?}") };
    assert!(matches!(&options[2], mounthost::plan::MountOption::Path { prefix, .. } if prefix == "x="), "{options:?}");

    let publish = wit::PublishRequest {
        volume_id: "vol-1".into(),
        context: vec![],
        secrets: vec![],
        capability: stage_request("ok").capability,
        readonly: true,
        recorded: vec![],
    };
    let plan = e.runtime.call(&legacy, "vol-1", publish).await.unwrap();
    assert!(matches!(&plan.steps[..], [wit::Step::Bind(b)] if b.readonly), "{plan:?}");
}

#[tokio::test]
async fn a_contract_0_1_0_plugin_errors_map_and_are_scrubbed() {
    let e = env(fast());
    let legacy = e.runtime.load_file(&fixtures::path("legacy")).await.unwrap();
    for (fail, kind) in [
        ("invalid-argument", ErrorKind::InvalidArgument),
        ("not-found", ErrorKind::NotFound),
        ("unavailable", ErrorKind::Unavailable),
        ("internal", ErrorKind::Internal),
    ] {
        let err = e.runtime.call(&legacy, "vol-1", legacy_request(&[("fail", fail)])).await.unwrap_err();
        assert_eq!(err.kind(), kind, "{fail}: {err}");
        let PluginError::Backend { call: "stage", error, .. } = &err else { panic!("{err}") };
        let message = match error {
            BackendError::InvalidArgument(m)
            | BackendError::NotFound(m)
            | BackendError::Unavailable(m)
            | BackendError::Internal(m)
            | BackendError::OutOfRange(m)
            | BackendError::AlreadyExists(m)
            | BackendError::Unsupported(m) => m,
        };
        assert_eq!(message, "asked to fail (token <redacted:token>)", "{fail}");
    }
}

#[tokio::test]
async fn a_resolved_stage_request_never_reaches_a_contract_0_1_0_plugin() {
    let e = env(fast());
    let legacy = e.runtime.load_file(&fixtures::path("legacy")).await.unwrap();
    let resolved = wit::Resolved {
        reference: "registry.local/m:1".into(),
        manifest_digest: format!("sha256:{}", "a".repeat(64)),
        manifest: "{}".into(),
        config: "{}".into(),
    };
    let req = wit::StageRequest { resolved: Some(resolved), ..legacy_request(&[]) };
    let err = e.runtime.call(&legacy, "vol-1", req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Internal, "{err}");
    assert!(err.to_string().contains("0.1.0 plans cannot ask to resolve"), "{err}");
}

/// A component built against the frozen 0.3.0 contract (the last before 0.4.0): detected as
/// 0.3.0, its plans come back in current terms (a 0.3.0 path argument keeps its suffix, which
/// the policy then sees), its errors map, and the policy takes its plans.
#[tokio::test]
async fn a_contract_0_3_0_plugin_loads_and_plans_through_the_adapter() {
    let e = env(fast());
    let v030 = e.runtime.load_file(&fixtures::path("legacy030")).await.unwrap();
    assert_eq!((v030.contract(), v030.contract().to_string()), (Contract::V030, "0.3.0".to_string()));
    assert_eq!(
        (v030.info.name.as_str(), v030.info.fstypes.as_slice()),
        ("legacy030", ["tmpfs".to_string()].as_slice())
    );
    let plan = e.runtime.call(&v030, "vol-1", legacy_request(&[("sizeMiB", "8"), ("pathOption", "x")])).await.unwrap();
    let cache = wit::PathRef { root: wit::DirRoot::Cache, rel: String::new() };
    let expected = wit::Step::Mount(wit::Mount {
        fstype: "tmpfs".into(),
        source: wit::MountSource::Named("tmpfs".into()),
        target: wit::PathRef { root: wit::DirRoot::Staging, rel: String::new() },
        options: vec![
            wit::Arg::Literal("size=8m".into()),
            wit::Arg::Literal("mode=0755".into()),
            wit::Arg::Path(wit::PathArg { prefix: "x=".into(), path: cache, suffix: "/.".into() }),
        ],
        readonly: false,
    });
    assert_eq!(plan.steps, [expected]);
    assert_eq!(plan.attributes, [wit::Kv { key: "contract".into(), value: "0.3.0".into() }]);
    // The policy sees the suffix (a mount option takes none), and takes the plan without it.
    let refused = Policy::new().check(&v030, plan).unwrap_err();
    assert!(refused.to_string().contains("suffix"), "{refused}");
    let plain = e.runtime.call(&v030, "vol-1", legacy_request(&[("sizeMiB", "8")])).await.unwrap();
    Policy::new().check(&v030, plain).unwrap();
    let err = e.runtime.call(&v030, "vol-1", legacy_request(&[("fail", "not-found")])).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    let publish = wit::PublishRequest {
        volume_id: "vol-1".into(),
        context: vec![],
        secrets: vec![],
        capability: stage_request("ok").capability,
        readonly: true,
        recorded: vec![],
    };
    let plan = e.runtime.call(&v030, "vol-1", publish).await.unwrap();
    assert!(matches!(&plan.steps[..], [wit::Step::Bind(b)] if b.readonly), "{plan:?}");
}

#[tokio::test]
async fn exports_added_in_0_4_0_are_answered_by_the_host_for_earlier_plugins_and_by_sdk_defaults() {
    let e = env(fast());
    let legacy = e.runtime.load_file(&fixtures::path("legacy")).await.unwrap();
    let v030 = e.runtime.load_file(&fixtures::path("legacy030")).await.unwrap();
    // A 0.4.0 plugin (SDK 1.0.0) has these exports: called through the adapter, its SDK default
    // answers, not the host.
    let v040 = e.runtime.load_file(&fixtures::path("sdk1-frozen")).await.unwrap();
    assert_eq!(v040.contract(), Contract::V040);
    let current = e.runtime.resolve("misbehave", None).await.unwrap();
    let expand = wit::ExpandRequest {
        volume_id: "vol-1".into(),
        side: wit::ExpandSide::Controller,
        required_bytes: 2 << 30,
        limit_bytes: 0,
        secrets: vec![],
        capability: None,
        context: vec![],
        recorded: vec![],
        looked_up: vec![],
    };
    for (plugin, says) in [
        (&legacy, "older than 0.4.0"),
        (&v030, "older than 0.4.0"),
        (&v040, "plugin sdk1's volumes cannot be expanded"),
        (&current, "cannot be expanded"),
    ] {
        let err = e.runtime.call(plugin, "vol-1", expand.clone()).await.unwrap_err();
        assert!(
            matches!(&err, PluginError::Backend { error: BackendError::OutOfRange(m), .. } if m.contains(says)),
            "{}: {err}",
            plugin.info.name
        );
        assert_eq!(err.kind(), ErrorKind::OutOfRange, "{err}");
        let capacity = wit::CapacityRequest { parameters: vec![], capabilities: vec![], looked_up: vec![] };
        let answer = e.runtime.call(plugin, "capacity", capacity).await.unwrap();
        assert_eq!((answer.available_bytes, answer.maximum_volume_bytes, answer.steps.len()), (None, None, 0));
        let list = wit::ListRequest {
            hosts: vec!["127.0.0.1:8888".into()],
            starting_token: String::new(),
            max_entries: 10,
            looked_up: vec![],
        };
        let answer = e.runtime.call(plugin, "list", list).await.unwrap();
        assert!(answer.volumes.is_empty() && answer.steps.is_empty(), "{answer:?}");
        let describe =
            wit::DescribeRequest { volume_id: "vol-1".into(), context: vec![], secrets: vec![], looked_up: vec![] };
        let answer = e.runtime.call(plugin, "vol-1", describe).await.unwrap();
        assert_eq!(answer.existence, wit::Existence::Unknown);
    }
}
