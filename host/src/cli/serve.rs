//! `mounthost host`, `mounthost csi` and `mounthost local`: the long-running processes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;

use crate::config::Config;
use crate::daemon::Node;
use crate::exec::Linux;
use crate::exec::cgroup::Cgroups;
use crate::exec::instance::{self, Claim, StateDirLock};
use crate::front::backends::Backends;
use crate::front::provision::Controller;
use crate::front::{self, Mode};
use crate::oci::{Artifacts, PluginPull, RegistryConfig};
use crate::plugin::PluginRuntime;

/// Arguments of `mounthost csi`.
#[derive(Debug, Args)]
pub struct CsiArgs {
    /// Which CSI services to serve.
    #[arg(long, env = "MOUNTHOST_CSI_MODE", value_enum, default_value = "node")]
    pub mode: Mode,
    /// kubelet's socket for this driver, unix:///path or a path.
    #[arg(long, env = "CSI_ENDPOINT", default_value = "unix:///csi/csi.sock")]
    pub endpoint: String,
}

/// Arguments of `mounthost local`.
#[derive(Debug, Args)]
pub struct LocalArgs {
    /// The CSI socket [default: <state-dir>/csi.sock].
    #[arg(long, env = "CSI_ENDPOINT")]
    pub endpoint: Option<String>,
    /// The demo volume (and the private SeaweedFS behind it) started once both servers are up.
    #[command(flatten)]
    pub first_volume: super::first_volume::FirstVolumeArgs,
}

/// Resolves when the process is asked to stop (SIGINT or SIGTERM). Mounts and FUSE processes
/// are left running: they outlive the daemon by design. One listener for the process's life,
/// installed at the first call: a signal that arrives between two waits (after a standby took
/// the state directory, before the server waits for it) is kept, not lost.
pub async fn stop_signal() {
    static STOP: std::sync::OnceLock<tokio::sync::watch::Receiver<bool>> = std::sync::OnceLock::new();
    let mut stopped = STOP
        .get_or_init(|| {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("installing a SIGTERM handler");
            let (tx, rx) = tokio::sync::watch::channel(false);
            tokio::spawn(async move {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
                tracing::info!("stopping; mounts and FUSE processes stay up");
                let _ = tx.send(true);
                // A second Ctrl-C or SIGTERM is `mounthost local`'s own business (it kills its
                // SeaweedFS at once); keep the sender, and with it the receivers, alive.
                std::future::pending::<()>().await;
            });
            rx
        })
        .clone();
    let _ = stopped.wait_for(|s| *s).await;
}

/// Keep the state directory's lock until the process exits (the kernel releases it then): a
/// daemon's blocking jobs may still be writing after its server has stopped, until the runtime
/// shuts down, and a standby must not take over before.
fn hold_until_exit(lock: StateDirLock) {
    static HELD: std::sync::OnceLock<StateDirLock> = std::sync::OnceLock::new();
    let _ = HELD.set(lock);
}

/// Create the state directory if missing (private) and make it canonical in `cfg`.
fn make_state_dir(cfg: &mut Config) -> anyhow::Result<()> {
    crate::unpriv::private_files::private_dir(&cfg.state_dir)?;
    cfg.state_dir = std::fs::canonicalize(&cfg.state_dir)?;
    Ok(())
}

/// Take the state directory for this daemon (`exec::instance`) and read its instance id into
/// `cfg`. While another daemon holds it, stand by: say so once in the log and on `/readyz`,
/// touch nothing, and take over as soon as it is free; `None` when `stop` came first.
async fn claim_state_dir(cfg: &mut Config, stop: impl Future<Output = ()>) -> anyhow::Result<Option<StateDirLock>> {
    let mut stop = std::pin::pin!(stop);
    let metrics = crate::metrics::global();
    let mut standing_by = false;
    loop {
        match instance::try_lock(&cfg.state_dir)? {
            Claim::Held(lock) => {
                if standing_by {
                    tracing::info!(lock = %lock.path().display(), "the state directory is free: taking over");
                    metrics.set_standby(None);
                }
                cfg.instance = Some(instance::instance_id(&lock, &cfg.state_dir)?);
                return Ok(Some(lock));
            }
            Claim::Busy { path, holder } => {
                if !standing_by {
                    let pid = holder.map_or("pid unknown".to_string(), |p| format!("pid {p}"));
                    tracing::warn!(lock = %path.display(), holder,
                        "standing by: another host daemon holds the state directory; taking over when it exits");
                    metrics.set_standby(Some(format!("another host daemon ({pid}) holds {}", path.display())));
                    standing_by = true;
                }
                tokio::select! {
                    _ = &mut stop => return Ok(None),
                    _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
                }
            }
        }
    }
}

/// [`claim_state_dir`] for `mounthost local`, which does not wait: another daemon on its state
/// directory is an error to show at once.
fn claim_state_dir_now(cfg: &mut Config) -> anyhow::Result<StateDirLock> {
    match instance::try_lock(&cfg.state_dir)? {
        Claim::Held(lock) => {
            cfg.instance = Some(instance::instance_id(&lock, &cfg.state_dir)?);
            Ok(lock)
        }
        Claim::Busy { path, holder } => anyhow::bail!(
            "another mounthost daemon ({}) holds {}: stop it, or give this one another --state-dir",
            holder.map_or("pid unknown".to_string(), |p| format!("pid {p}")),
            path.display()
        ),
    }
}

/// The real executor, with the node's cgroup layout detected (below the daemon's own parent),
/// anchored at the state directory and kubelet's directory. kubelet's is created if missing and
/// made canonical in `cfg`: below them every path is resolved without following links, so a
/// node whose `/var/lib/kubelet` is itself a link is resolved here, once.
/// The node cache's and each dynamic volume's byte cap, from the flags or measured from the
/// state directory's filesystem now (`Config::resolve_byte_caps`), logged with where each came
/// from.
fn byte_caps(cfg: &mut Config, exec: &Linux) {
    use crate::exec::Mounts;
    let total = match exec.usage(&cfg.state_dir) {
        Ok(u) => Some(u.total_bytes),
        Err(e) => {
            tracing::warn!(path = %cfg.state_dir.display(), error = %e, "the state directory's filesystem could not be measured");
            None
        }
    };
    let r = cfg.resolve_byte_caps(total);
    tracing::info!(
        cache_max = %crate::config::show_cap(r.cache),
        cache_max_from = %r.cache_from,
        dynamic_max = %crate::config::show_cap(r.dynamic),
        dynamic_max_from = %r.dynamic_from,
        "byte caps: the node's blob cache, and each dynamic volume's mounts"
    );
}

fn linux(cfg: &mut Config) -> anyhow::Result<(Arc<Linux>, Vec<PathBuf>)> {
    cfg.kubelet_dir = Linux::make_root(&cfg.kubelet_dir)?;
    // A confined program's own mount reaches the node through the directory of its mount point
    // being on a shared mount (exec::confine): kubelet's, as kubelet makes it, and the state
    // directory, which holds inline volumes' staging paths (both Bidirectional in the
    // DaemonSet). A node or test without kubelet gets the same here, the state directory first
    // (`mounthost local` keeps kubelet's directory inside it).
    // A program named otherwise than the binary a built-in rule set is for runs without it.
    for (name, path) in &cfg.programs {
        let binary = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if !cfg.program_rules.sets.contains_key(name) && crate::plan::rules::builtin(binary).is_some() {
            tracing::warn!(program = %name, binary = %path.display(),
                "this program runs without a rule set although its binary has a built-in one: --program-rules {name}=@{binary} applies it");
        }
    }
    let mut bound = Vec::new();
    if cfg.confine_programs {
        for dir in [&cfg.state_dir, &cfg.kubelet_dir] {
            match Linux::share_root(dir) {
                Ok(done) => {
                    tracing::debug!(path = %dir.display(), ?done, "a shared mount");
                    if done == crate::exec::confine::Shared::Bound {
                        bound.push(dir.clone());
                    }
                }
                Err(e) => tracing::warn!(path = %dir.display(), error = %e,
                    "not on a shared mount: programs that mount by themselves below it cannot be staged"),
            }
        }
    }
    for limit in &cfg.fuse_caps.io {
        let device = limit.device();
        let sys = Path::new("/sys/dev/block").join(&device);
        if !sys.exists() {
            anyhow::bail!(
                "--fuse-io-max names device {device}, which is not a block device of this node (/sys/dev/block/{device})"
            );
        }
        // The kernel takes I/O limits for whole disks only (a partition's write is ENODEV),
        // which would fail every volume's stage.
        if sys.join("partition").exists() {
            anyhow::bail!(
                "--fuse-io-max names device {device}, a partition; I/O limits apply to whole disks: name the disk it is on (/sys/dev/block/{device}/../dev)"
            );
        }
    }
    let cgroups = Cgroups::detect(&cfg.own_cgroup_parent()).with_caps(cfg.fuse_caps.clone());
    for missing in cgroups.unapplied() {
        tracing::warn!("{missing}: volumes run without it");
    }
    match (cgroups.version(), cgroups.parent_dir()) {
        (Some(v), Some(dir)) => tracing::info!(version = ?v, parent = %dir.display(), "per-volume cgroups"),
        _ => {
            tracing::warn!(
                "no memory cgroup controller found: FUSE processes run without per-volume cgroups, and plans with a memory limit are refused"
            );
            // The host's own lazy servers run without their --lazy-memory-mib then.
            if cfg.lazy.memory_limit.take().is_some() {
                tracing::warn!("lazy volumes' servers run without a memory limit (--lazy-memory-mib)");
            }
        }
    }
    let mut anchors = vec![cfg.state_dir.clone(), cfg.kubelet_dir.clone()];
    // Unprivileged FUSE programs' files (derived from the canonical state directory unless
    // configured): optional (a daemon that cannot make it, say an unprivileged local one,
    // refuses only the plans that need it). Its tmpfs is mounted at the first stage that needs it.
    let fuse_files = cfg.fuse_files();
    match Linux::make_root(&fuse_files) {
        Ok(dir) => {
            cfg.fuse_files_dir = Some(dir.clone());
            anchors.push(dir);
        }
        Err(e) => tracing::warn!(path = %fuse_files.display(), error = %e,
            "no directory for unprivileged FUSE programs' files; plans that give them secret files are refused"),
    }
    Ok((Arc::new(Linux::new(cgroups, anchors).with_max_file_bytes(cfg.fuse_max_file_bytes)), bound))
}

/// At the daemon's exit, the binds [`linux`] made to share its directories go when nothing is
/// mounted below them any more (an unmount refuses a busy one, which stays for the next start).
fn release_shared(bound: &[PathBuf]) {
    for dir in bound.iter().rev() {
        match Linux::release_root(dir) {
            Ok(()) => tracing::debug!(path = %dir.display(), "removed the bind that shared it"),
            Err(e) => tracing::debug!(path = %dir.display(), error = %e, "keeping the bind that shares it"),
        }
    }
}

/// At the daemon's exit, its FUSE files directory goes if it is unused: empty and no tmpfs on
/// it (`rmdir` refuses anything else). Every non-default state directory has one of its own
/// under `/run/mounthost`, which would otherwise stay after each `mounthost local`.
fn remove_unused_fuse_files_dir(cfg: &Config) {
    if let Some(dir) = &cfg.fuse_files_dir {
        match Linux::remove_unused_root(dir) {
            Ok(()) => tracing::debug!(path = %dir.display(), "removed the unused FUSE files directory"),
            Err(e) => tracing::debug!(path = %dir.display(), error = %e, "keeping the FUSE files directory"),
        }
    }
}

/// Serve `/metrics`, `/healthz` and `/readyz` when `--metrics-address` is set; `/readyz`
/// waits for each of `roles`.
async fn metrics_listener(cfg: &Config, roles: &[&'static str]) -> anyhow::Result<()> {
    for role in roles {
        crate::metrics::global().expect_role(role);
    }
    if let Some(addr) = cfg.metrics_address {
        crate::unpriv::metrics_http::serve(addr, crate::metrics::global()).await?;
    }
    Ok(())
}

/// `mounthost host`.
pub async fn host(mut cfg: Config) -> anyhow::Result<()> {
    metrics_listener(&cfg, &["host"]).await?;
    make_state_dir(&mut cfg)?;
    // Held until the process ends: nothing below runs beside another writer of this state.
    let Some(lock) = claim_state_dir(&mut cfg, stop_signal()).await? else { return Ok(()) };
    hold_until_exit(lock);
    let (exec, bound) = linux(&mut cfg)?;
    byte_caps(&mut cfg, &exec);
    let runtime = Arc::new(PluginRuntime::new(cfg.runtime())?);
    let socket = cfg.host_socket.clone();
    let node = Node::new(cfg.clone(), runtime, exec.clone())?;
    let served = crate::daemon::service::serve(node, &socket, stop_signal()).await;
    remove_unused_fuse_files_dir(&cfg);
    exec.remove_unused_cgroups();
    release_shared(&bound);
    served
}

/// `mounthost csi`.
pub async fn csi(cfg: Config, args: CsiArgs) -> anyhow::Result<()> {
    metrics_listener(&cfg, &["csi"]).await?;
    let socket = crate::unpriv::grpc::socket_path(&args.endpoint).map_err(anyhow::Error::msg)?;
    let host = matches!(args.mode, Mode::Node | Mode::All)
        .then(|| front::Host::new(crate::unpriv::grpc::channel(&cfg.host_socket)));
    let controller = if matches!(args.mode, Mode::Controller | Mode::All) {
        let controller = Controller::new(cfg.clone(), Arc::new(PluginRuntime::new(cfg.runtime())?))
            .with_backends(Backends::in_state_dir(&cfg.state_dir));
        Some(match front_puller(&cfg) {
            Ok(puller) => controller.with_puller(puller),
            Err(e) => {
                tracing::warn!(%e, "no blob cache: StorageClasses that select a plugin by OCI reference are refused");
                controller
            }
        })
    } else {
        None
    };
    front::serve(args.mode, &socket, host, controller, stop_signal()).await
}

/// `mounthost local`: host daemon and CSI front (all services) in one process, everything
/// under the state directory; `weed` is looked up on PATH if not configured.
pub async fn local(mut cfg: Config, args: LocalArgs) -> anyhow::Result<()> {
    metrics_listener(&cfg, &["host", "csi"]).await?;
    for (name, path) in cfg.programs.iter_mut() {
        if !path.exists() {
            let venv = cfg.state_dir.join("venv/bin").join(name.as_str());
            if let Some(found) = on_path(name).or_else(|| venv.is_file().then_some(venv)) {
                *path = found;
            }
        }
    }
    make_state_dir(&mut cfg)?;
    hold_until_exit(claim_state_dir_now(&mut cfg)?);
    super::first_volume::provide_weed(&mut cfg, &args.first_volume)?;
    let (exec, bound) = linux(&mut cfg)?;
    byte_caps(&mut cfg, &exec);
    let csi_socket = match &args.endpoint {
        Some(e) => crate::unpriv::grpc::socket_path(e).map_err(anyhow::Error::msg)?,
        None => cfg.state_dir.join("csi.sock"),
    };
    let runtime = Arc::new(PluginRuntime::new(cfg.runtime())?);
    let node = Node::new(cfg.clone(), runtime.clone(), exec.clone())?;
    // The controller pulls plugins by reference through the node's own blob cache.
    let puller = PluginPull::new(node.artifacts().clone(), Some(pulled_plugin_notes(&cfg)));
    let host_socket = cfg.host_socket.clone();
    let (tx, rx) = tokio::sync::watch::channel(false);
    let mut rx2 = rx.clone();
    let host_task = tokio::spawn(async move {
        let mut rx = rx;
        crate::daemon::service::serve(node, &host_socket, async move {
            let _ = rx.changed().await;
        })
        .await
    });
    let host = front::Host::new(crate::unpriv::grpc::channel(&cfg.host_socket));
    let controller = Controller::new(cfg.clone(), runtime)
        .with_puller(Arc::new(puller))
        .with_backends(Backends::in_state_dir(&cfg.state_dir));
    println!(
        "mounthost local: CSI socket {} (host daemon {}, kubelet dir {})",
        csi_socket.display(),
        cfg.host_socket.display(),
        cfg.kubelet_dir.display()
    );
    let demo_socket = csi_socket.clone();
    let front_task = tokio::spawn(async move {
        front::serve(Mode::All, &csi_socket, Some(host), Some(controller), async move {
            let _ = rx2.changed().await;
        })
        .await
    });
    let served = super::first_volume::run(&cfg, &args.first_volume, &demo_socket, stop_signal()).await;
    let _ = tx.send(true);
    host_task.await??;
    front_task.await??;
    remove_unused_fuse_files_dir(&cfg);
    exec.remove_unused_cgroups();
    release_shared(&bound);
    served
}

/// Where a controller notes which reference each pulled plugin came from (DeleteVolume knows
/// only the plugin's name).
fn pulled_plugin_notes(cfg: &Config) -> PathBuf {
    cfg.state_dir.join("cache").join("plugin-sources")
}

/// The CSI controller's own blob cache for plugins selected by OCI reference: `<state>/cache/front`
/// (apart from the host daemon's, which may share the state directory), with the node's
/// registry settings.
fn front_puller(cfg: &Config) -> anyhow::Result<Arc<PluginPull>> {
    let registries = RegistryConfig::of(&cfg.registries);
    let artifacts = Artifacts::new(cfg.state_dir.join("cache").join("front"), registries)?;
    Ok(Arc::new(PluginPull::new(Arc::new(artifacts), Some(pulled_plugin_notes(cfg)))))
}

/// `name` in a directory of `PATH`.
pub(super) fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| PathBuf::from(d).join(name)).find(|p| p.is_file())
}
