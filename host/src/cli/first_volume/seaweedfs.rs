//! The private SeaweedFS of `mounthost local`'s demo volume: one `weed server` (master,
//! volume server and filer on 127.0.0.1), its data, config and log under
//! `<state-dir>/seaweedfs/`.
//!
//! [`SeaweedFs::start`] starts it (or adopts one an earlier run left running) and answers once a
//! write through its filer works; [`SeaweedFs::stop`] stops it. The ports of the last run are
//! tried first, so the filer keeps its address and the volume its id; then the usual ones, then
//! any free ones.
//!
//! The server runs in a session of its own, spawned and stopped through
//! [`crate::exec::process`] like a FUSE program, so the terminal's Ctrl-C reaches mounthost
//! alone. Its pid and ports are kept in `<state-dir>/seaweedfs/server.json`: a server left
//! running by a run that was killed is adopted, never started twice on the same data.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use serde::{Deserialize, Serialize};

use super::shown;
use crate::exec::process::{self, ProcessId, Spec};
use crate::unpriv::http::{Call, HttpClient, HttpError};

/// The usual ports of `weed server`: master, volume server, filer. Each gRPC port is its HTTP
/// port + 10000, as `weed` assumes (`weed mount` finds the filer's gRPC port that way).
const USUAL_PORTS: Ports = Ports { master: 9333, volume: 8080, filer: 8888 };
const GRPC_OFFSET: u16 = 10_000;
/// How long SeaweedFS may take to accept a write after it starts.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// SIGTERM → SIGKILL for `weed server`: its filer waits up to 15 s for gRPC streams to close.
const STOP_GRACE: Duration = Duration::from_secs(20);
/// Lines of weed's log shown when it fails.
const LOG_TAIL: usize = 25;

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
/// runs, with a schema `version` ([`RECORD_VERSION`]; 0.1.0 wrote none, read as the same).
#[derive(Debug, Default, Serialize, Deserialize)]
struct Record {
    #[serde(default)]
    version: u32,
    ports: Option<Ports>,
    process: Option<ProcessId>,
}

/// The schema version of `server.json`. A record of a newer one is ignored like an unreadable
/// one: its server is neither adopted nor stopped, and free ports are chosen if its are taken.
const RECORD_VERSION: u32 = 1;

/// The `weed server` of this run.
struct Server {
    id: ProcessId,
    ports: Ports,
}

/// The private SeaweedFS under `<state-dir>/seaweedfs/`, and its server once one is started or
/// adopted.
pub(super) struct SeaweedFs {
    dir: PathBuf,
    server: Option<Server>,
}

impl SeaweedFs {
    /// Nothing started yet.
    pub(super) fn new(state_dir: &Path) -> Self {
        SeaweedFs { dir: state_dir.join("seaweedfs"), server: None }
    }

    /// Where its data, config, log and `server.json` are.
    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// True while a server of this run is to be stopped: from its spawn (or adoption) until
    /// [`SeaweedFs::stop`], or until it exits at start.
    pub(super) fn is_running(&self) -> bool {
        self.server.is_some()
    }

    fn record_path(&self) -> PathBuf {
        self.dir.join("server.json")
    }

    /// The record, if readable; ports that leave no room for their gRPC port are dropped.
    fn read_record(&self) -> Record {
        let mut record: Record = std::fs::read(self.record_path())
            .ok()
            .and_then(|b| serde_json::from_slice::<Record>(&b).ok())
            .filter(|r| r.version <= RECORD_VERSION)
            .unwrap_or_default();
        let usable = |p: &Ports| [p.master, p.volume, p.filer].iter().all(|&x| x > 0 && x <= u16::MAX - GRPC_OFFSET);
        record.ports = record.ports.filter(usable);
        record
    }

    fn write_record(&self, ports: Option<Ports>, process: Option<ProcessId>) -> anyhow::Result<()> {
        let record = Record { version: RECORD_VERSION, ports, process };
        let bytes = serde_json::to_vec_pretty(&record).expect("the record serializes");
        crate::unpriv::private_files::write_atomic(&self.record_path(), &bytes, 0o600)
            .with_context(|| format!("writing {}", self.record_path().display()))
    }

    /// Start (or adopt) the private SeaweedFS with the program `weed` and wait until a write
    /// through its filer works; the filer's address (`127.0.0.1:<port>`). The server is recorded
    /// in `self` as soon as it is spawned, so [`SeaweedFs::stop`] stops it when this fails or is
    /// cancelled half-way.
    pub(super) async fn start(&mut self, weed: &Path) -> anyhow::Result<String> {
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
                self.server = Some(Server { id, ports });
                return Ok(ports.filer());
            }
            println!("mounthost local: stopping the SeaweedFS an earlier run left behind (pid {})", id.pid);
            self.server = Some(Server { id, ports });
            self.stop().await?;
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
            match self.spawn(weed, &data, &conf, ports).await {
                Ok(()) => return Ok(ports.filer()),
                Err(Failed::PortTaken(log)) => tracing::info!(?ports, "weed lost a port race: {log}"),
                Err(Failed::Other(e)) => return Err(e),
            }
        }
        bail!("SeaweedFS could not bind its ports (another process took them each time); see {}", self.log().display())
    }

    fn log(&self) -> PathBuf {
        self.dir.join("weed.log")
    }

    /// `weed server` on `ports`, up once a write through its filer works.
    async fn spawn(&mut self, weed: &Path, data: &Path, conf: &Path, ports: Ports) -> Result<(), Failed> {
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
        self.write_record(Some(ports), Some(id)).map_err(Failed::Other)?;
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
                return Ok(());
            }
            if !process::is_alive(&id) {
                self.server = None;
                self.write_record(None, None).map_err(Failed::Other)?;
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

    /// SIGTERM to the server's process group, SIGKILL after [`STOP_GRACE`] or at a second Ctrl-C;
    /// the record keeps its ports for the next run. Nothing to do when no server runs.
    pub(super) async fn stop(&mut self) -> anyhow::Result<()> {
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
        // A killed weed leaves its local sockets in /tmp behind (named by each server's own
        // gRPC port, and the filer's by its HTTP port); only those names, and only sockets.
        let p = server.ports;
        let names = [
            format!("master-grpc-{}", p.master + GRPC_OFFSET),
            format!("volume-grpc-{}", p.volume + GRPC_OFFSET),
            format!("filer-grpc-{}", p.filer + GRPC_OFFSET),
            format!("filer-{}", p.filer),
        ];
        for name in names {
            let path = PathBuf::from(format!("/tmp/seaweedfs-{name}.sock"));
            if std::fs::symlink_metadata(&path).is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
            {
                let _ = crate::unpriv::private_files::remove_file(&path);
            }
        }
        self.write_record(Some(server.ports), None)
    }
}

/// Why starting weed failed.
enum Failed {
    /// It lost a port to another process between the check and its bind: try other ports.
    PortTaken(String),
    Other(anyhow::Error),
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
pub(super) async fn check_filer(filer: &str) -> anyhow::Result<()> {
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
