//! Dynamic volumes benchmark: `cargo bench -p mounthost --bench dynamic` (root; it re-runs
//! itself in a private mount namespace, so nothing it mounts is visible outside).
//!
//! Runs the real `mounthost host` binary as a process of its own (its RSS and descriptors are
//! read from /proc) and talks to it over its host socket, kubelet's way: volumes are staged,
//! then published at kubelet-length targets (longer than a unix socket path may be, so every
//! volume's `csi.sock` is reached through `/proc/self/fd/N/csi.sock` of its opened directory).
//! The volumes use the `tmpfs` test plugin (kernel mounts only), so this measures mounthost.
//! Printed, each against a baseline measured in the same run:
//!
//! 1. the daemon's RSS and open descriptors with 1,000 published dynamic volumes, once every
//!    socket answers `GET /mounts`, and per volume (past the first 16, which compile the plugin
//!    and fill pools), vs a daemon of its own, on a fresh state directory, with 1,000 published
//!    plain volumes of the same plugin; also threads and CPU time over a few idle seconds (one
//!    sweeper checks every volume's socket and `mounts/` every 2 s);
//! 2. after `kill -9` and a new start: the time from spawn until every one of the 1,000 sockets
//!    answers `GET /mounts` with 200 (all polled from the spawn on), vs the time until the
//!    daemon's own host socket answers `Health`;
//! 3. the client-side latency (p50/p99) of `POST /mounts` (which answers 201 once mounted) and
//!    `DELETE` of a model already in the node's cache, with the real `model` plugin and a real
//!    `docker-registry` on 127.0.0.1 (the volume's stage pulls the model; each measured mount
//!    resolves the tag again and binds the cached files read-only), vs `mount --bind` run as a
//!    child process; on a daemon with only that volume, and on the restarted daemon of 2.
//!
//! `MOUNTHOST_BENCH_DYNAMIC_VOLUMES` (default 1000) and `MOUNTHOST_BENCH_DYNAMIC_MOUNTS`
//! (default 200) change the counts, `MOUNTHOST_BENCH_IDLE_SECS` (default 4) the idle windows.
//! `MOUNTHOST_BENCH_LOG=<filter>` sets the daemons' `--log` (default `warn`) and keeps their
//! logs (copied to `$TMPDIR`; the paths are printed).

mod common;
#[path = "../tests/common/registry.rs"]
mod registry;

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mounthost::proto::csi;
use mounthost::proto::host::HealthRequest;
use mounthost::proto::host::host_client::HostClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use registry::{Class, ModelBuilder, Packing, Registry, RegistryOptions};

type Client = HostClient<mounthost::unpriv::grpc::UnixChannel>;

/// RSS target of the issue, MiB.
const RSS_TARGET_MIB: f64 = 64.0;
/// Target for every socket to answer after a restart.
const RESTART_TARGET: Duration = Duration::from_secs(1);
/// Target p50 of a dynamic mount of a cached model.
const MOUNT_TARGET: Duration = Duration::from_millis(20);
/// How often the restart poller sweeps the sockets that have not answered yet.
const SWEEP_EVERY: Duration = Duration::from_millis(2);

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn volumes() -> usize {
    env_count("MOUNTHOST_BENCH_DYNAMIC_VOLUMES", 1000)
}

fn mounts() -> usize {
    env_count("MOUNTHOST_BENCH_DYNAMIC_MOUNTS", 200).max(1)
}

fn idle() -> Duration {
    Duration::from_secs(env_count("MOUNTHOST_BENCH_IDLE_SECS", 4) as u64)
}

/// The daemon's `--log` filter: `MOUNTHOST_BENCH_LOG`, or warnings only.
fn log_filter() -> String {
    std::env::var("MOUNTHOST_BENCH_LOG").unwrap_or_else(|_| "warn".into())
}

/// A free TCP port on 127.0.0.1 (for the registry harness).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn main() {
    common::enter_private_namespace();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(run());
}

// ---------------------------------------------------------------------------------------------
// The daemon as a process, and what /proc says about it.

/// What /proc says about a process at one moment.
#[derive(Clone, Copy, Debug)]
struct Usage {
    rss_kib: u64,
    /// Of which anonymous memory (heap, stacks) and file pages (mostly the binary's code).
    anon_kib: u64,
    file_kib: u64,
    fds: usize,
    threads: u64,
}

impl Usage {
    fn of(pid: u32) -> Usage {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
        };
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count();
        Usage {
            rss_kib: field("VmRSS:"),
            anon_kib: field("RssAnon:"),
            file_kib: field("RssFile:"),
            fds,
            threads: field("Threads:"),
        }
    }

    fn mib(&self) -> f64 {
        self.rss_kib as f64 / 1024.0
    }

    /// `RSS 74.2 MiB (anon 52.1, file 21.0)   fds 1016   threads 56`.
    fn show(&self) -> String {
        format!(
            "RSS {:>5.1} MiB (anon {:>5.1}, file {:>4.1})   fds {:>5}   threads {:>3}",
            self.mib(),
            self.anon_kib as f64 / 1024.0,
            self.file_kib as f64 / 1024.0,
            self.fds,
            self.threads
        )
    }
}

/// CPU time (user + system) of `pid` so far, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// A node: kubelet's tree and the host daemon's state under one directory.
struct Node {
    root: PathBuf,
    kubelet: PathBuf,
    host_sock: PathBuf,
    registry: String,
}

impl Node {
    fn new(root: PathBuf, registry: &Registry) -> Node {
        let kubelet = root.join("kubelet");
        std::fs::create_dir_all(&kubelet).unwrap();
        std::fs::create_dir_all(root.join("plugins")).unwrap();
        std::fs::copy(mounthost::stock::fixtures::path("tmpfs"), root.join("plugins/tmpfs.wasm")).unwrap();
        let host_sock = root.join("host.sock");
        Node { root, kubelet, host_sock, registry: registry.host() }
    }

    fn cgroup_parent(&self) -> String {
        format!("mounthost-bench-dynamic-{}", std::process::id())
    }

    /// Spawn `mounthost host` (without waiting for it).
    fn spawn(&self) -> Daemon {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.root.join("host.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_mounthost"))
            .arg("--state-dir")
            .arg(self.root.join("state"))
            .arg("--kubelet-dir")
            .arg(&self.kubelet)
            .arg("--host-socket")
            .arg(&self.host_sock)
            .arg("--plugin-dir")
            .arg(self.root.join("plugins"))
            .args(["--grant", "tmpfs:fstype=tmpfs"])
            .arg(format!("--insecure-registry={}", self.registry))
            .args(["--cgroup-parent", &self.cgroup_parent(), "--log", &log_filter(), "host"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        Daemon(child)
    }

    /// Start the daemon and wait until it answers `Health`.
    async fn start(&self) -> (Daemon, Duration) {
        let started = Instant::now();
        let daemon = self.spawn();
        wait_health(&self.host_sock, started, &daemon).await;
        (daemon, started.elapsed())
    }

    fn client(&self) -> Client {
        HostClient::new(mounthost::unpriv::grpc::channel(&self.host_sock))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.root.join("host.log")).unwrap_or_default()
    }

    fn staging(&self, pv: &str) -> PathBuf {
        use sha2::Digest;
        let hash = hex::encode(sha2::Sha256::digest(pv.as_bytes()));
        let p = self.kubelet.join(format!("plugins/kubernetes.io/csi/csi.mounthost.dev/{hash}/globalmount"));
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    fn target(&self, pod: &str, pv: &str) -> PathBuf {
        let parent = self.kubelet.join(format!("pods/{pod}/volumes/kubernetes.io~csi/{pv}"));
        std::fs::create_dir_all(&parent).unwrap();
        parent.join("mount")
    }

    /// Kill whatever runs, detach everything mounted below the root, and remove the daemon's
    /// FUSE files directory.
    fn clean_up(&self, daemon: Option<Daemon>) {
        drop(daemon);
        common::unmount_below(&self.root);
        common::remove_fuse_files_dir(&self.root.join("state"));
        let cgroups = mounthost::exec::instance::daemon_cgroups(&self.root.join("state"), &self.cgroup_parent());
        for group in cgroups.groups().unwrap_or_default() {
            let _ = cgroups.release(&group);
        }
        cgroups.remove_parent();
    }
}

/// The daemon's process, killed (SIGKILL) and reaped on drop.
struct Daemon(Child);

impl Daemon {
    fn pid(&self) -> u32 {
        self.0.id()
    }

    fn alive(&mut self) -> bool {
        self.0.try_wait().unwrap().is_none()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Wait until the host socket answers `Health` (the daemon has reconciled and serves).
async fn wait_health(sock: &Path, started: Instant, daemon: &Daemon) {
    loop {
        if std::os::unix::net::UnixStream::connect(sock).is_ok() {
            let mut client = HostClient::new(mounthost::unpriv::grpc::channel(sock));
            let call = tokio::time::timeout(Duration::from_secs(30), client.health(HealthRequest {}));
            if matches!(call.await, Ok(Ok(_))) {
                return;
            }
        }
        assert!(started.elapsed() < Duration::from_secs(60), "the daemon (pid {}) did not come up", daemon.pid());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// CSI requests, as kubelet sends them.

fn capability() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: csi::volume_capability::access_mode::Mode::SingleNodeMultiWriter as i32,
        }),
        access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
    }
}

fn context(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// One volume: its id, staging path and target.
#[derive(Clone)]
struct Volume {
    id: String,
    staging: PathBuf,
    target: PathBuf,
}

/// Kubelet-shaped names for volume `v`: a PV name and a pod uid as long as real ones.
fn tmpfs_volume(node: &Node, v: usize) -> Volume {
    let pv = format!("pvc-{v:08x}-8b1d-4c55-9e7a-3d2b1c0a9f81");
    let pod = format!("{v:08x}-1c2a-4f3b-9d8e-7a6b5c4d3e2f");
    Volume { id: format!("tmpfs~{pv}"), staging: node.staging(&pv), target: node.target(&pod, &pv) }
}

async fn stage_and_publish(
    client: &mut Client,
    vol: &Volume,
    ctx: &HashMap<String, String>,
    readonly: bool,
) -> Result<(), tonic::Status> {
    let stage = csi::NodeStageVolumeRequest {
        volume_id: vol.id.clone(),
        staging_target_path: vol.staging.display().to_string(),
        volume_capability: Some(capability()),
        volume_context: ctx.clone(),
        ..Default::default()
    };
    // A model is pulled first: Unavailable until it is in the cache.
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        match client.node_stage_volume(stage.clone()).await {
            Ok(_) => break,
            Err(s) if s.code() == tonic::Code::Unavailable && Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(s) => return Err(s),
        }
    }
    client
        .node_publish_volume(csi::NodePublishVolumeRequest {
            volume_id: vol.id.clone(),
            staging_target_path: vol.staging.display().to_string(),
            target_path: vol.target.display().to_string(),
            volume_capability: Some(capability()),
            readonly,
            volume_context: ctx.clone(),
            ..Default::default()
        })
        .await
        .map(|_| ())
}

/// Stage and publish `vols` (16 at a time); the time it took.
async fn publish_all(client: &Client, vols: &[Volume], ctx: &HashMap<String, String>) -> Duration {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for chunk in vols.chunks(vols.len().div_ceil(16).max(1)) {
        let (mut client, chunk, ctx) = (client.clone(), chunk.to_vec(), ctx.clone());
        tasks.push(tokio::spawn(async move {
            for v in &chunk {
                stage_and_publish(&mut client, v, &ctx, false)
                    .await
                    .unwrap_or_else(|e| panic!("staging and publishing {}: {e:?}", v.id));
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    started.elapsed()
}

// ---------------------------------------------------------------------------------------------
// HTTP to a volume's `csi.sock`.

/// A published directory held open, so its socket is reached at `/proc/self/fd/N/csi.sock`
/// whatever the length of its path.
struct Sock {
    _dir: std::fs::File,
    path: String,
}

impl Sock {
    fn open(target: &Path) -> Sock {
        let dir = std::fs::File::open(target).unwrap_or_else(|e| panic!("opening {}: {e}", target.display()));
        let path = format!("/proc/self/fd/{}/csi.sock", dir.as_raw_fd());
        Sock { _dir: dir, path }
    }

    /// One request (`Connection: close`); the status and body.
    async fn call(&self, method: &str, path: &str, body: Option<&str>) -> std::io::Result<(u16, String)> {
        let stream = UnixStream::connect(&self.path).await?;
        Self::exchange(stream, method, path, body).await
    }

    async fn exchange(
        mut stream: UnixStream,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> std::io::Result<(u16, String)> {
        let body = body.unwrap_or_default();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: volume\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let answer = async {
            stream.write_all(req.as_bytes()).await?;
            let mut out = Vec::new();
            stream.read_to_end(&mut out).await?;
            Ok::<_, std::io::Error>(out)
        };
        let out = tokio::time::timeout(Duration::from_secs(30), answer)
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer in 30 s"))??;
        let text = String::from_utf8_lossy(&out);
        let status = text.strip_prefix("HTTP/1.1 ").and_then(|r| r.get(..3)).and_then(|c| c.parse().ok()).unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        Ok((status, body))
    }
}

/// Poll every socket from `started` on until each answers `GET /mounts` with 200: in sweeps
/// every [`SWEEP_EVERY`] over those that have not (a refused connect costs microseconds), each
/// connection that succeeds asking in a task of its own. When each answered, since `started`.
async fn wait_all_answer(socks: &[Sock], started: Instant, limit: Duration) -> Result<Vec<Duration>, usize> {
    let mut answered: Vec<Option<Duration>> = vec![None; socks.len()];
    let mut pending: Vec<usize> = (0..socks.len()).collect();
    let mut asking = tokio::task::JoinSet::new();
    while answered.iter().any(Option::is_none) {
        if started.elapsed() > limit {
            return Err(answered.iter().filter(|a| a.is_none()).count());
        }
        let mut refused = Vec::new();
        for i in pending.drain(..) {
            match UnixStream::connect(&socks[i].path).await {
                Ok(stream) => {
                    asking.spawn(async move {
                        let r = Sock::exchange(stream, "GET", "/mounts", None).await;
                        (i, matches!(r, Ok((200, _))), started.elapsed())
                    });
                }
                Err(_) => refused.push(i),
            }
        }
        pending = refused;
        while let Some(done) = asking.try_join_next() {
            let (i, ok, at) = done.unwrap();
            if ok {
                answered[i] = Some(at);
            } else {
                pending.push(i);
            }
        }
        if answered.iter().any(Option::is_none) {
            if pending.is_empty() {
                // Only answers outstanding: wait for the next one.
                if let Some(done) = asking.join_next().await {
                    let (i, ok, at) = done.unwrap();
                    if ok {
                        answered[i] = Some(at);
                    } else {
                        pending.push(i);
                    }
                }
            } else {
                tokio::time::sleep(SWEEP_EVERY).await;
            }
        }
    }
    Ok(answered.into_iter().map(Option::unwrap).collect())
}

// ---------------------------------------------------------------------------------------------
// Reporting.

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn verdict(ok: bool) -> &'static str {
    if ok { "meets the target" } else { "MISSES the target" }
}

/// What one daemon with `n` published volumes cost: empty, after the first [`WARM`] volumes
/// (a plugin compiled, pools and caches made), with all, and after an idle window.
struct Footprint {
    n: usize,
    empty: Usage,
    warm: Usage,
    full: Usage,
    after_idle: Usage,
    idle_cpu_pct: f64,
}

/// Volumes published before the "warm" measurement.
const WARM: usize = 16;

impl Footprint {
    /// RSS (KiB) and descriptors per volume past the first [`WARM`].
    fn per_volume(&self, u: &Usage) -> (f64, f64) {
        let k = self.n.saturating_sub(WARM).max(1) as f64;
        ((u.rss_kib as f64 - self.warm.rss_kib as f64) / k, (u.fds as f64 - self.warm.fds as f64) / k)
    }

    fn print(&self, name: &str) {
        println!("{name}");
        println!("  empty daemon                   {}", self.empty.show());
        println!("  after {WARM:>3} volumes              {}", self.warm.show());
        let (kib, fds) = self.per_volume(&self.full);
        println!(
            "  all {:>5} published            {}   → {kib:>5.1} KiB, {fds:.2} fds per volume",
            self.n,
            self.full.show()
        );
        let (kib, fds) = self.per_volume(&self.after_idle);
        println!(
            "  after {:>2} s idle                {}   → {kib:>5.1} KiB, {fds:.2} fds per volume; idle CPU {:.1} % of a core",
            idle().as_secs(),
            self.after_idle.show(),
            self.idle_cpu_pct
        );
    }

    /// The larger RSS of the two measured with every volume published, MiB.
    fn worst_mib(&self) -> f64 {
        self.full.mib().max(self.after_idle.mib())
    }
}

/// Measure an idle window of the daemon: its CPU use and its usage at the end.
async fn idle_window(pid: u32) -> (f64, Usage) {
    let before = cpu_ticks(pid);
    tokio::time::sleep(idle()).await;
    let ticks = cpu_ticks(pid) - before;
    // USER_HZ is 100 on Linux.
    (ticks as f64 / 100.0 / idle().as_secs_f64().max(0.001) * 100.0, Usage::of(pid))
}

/// Start a daemon on `node`, publish `vols` with `ctx` and measure what they cost. With
/// `dynamic`, "published" waits until every socket answers. The daemon is returned running.
async fn footprint(node: &Node, vols: &[Volume], ctx: &HashMap<String, String>, dynamic: bool) -> (Daemon, Footprint) {
    let (daemon, _) = node.start().await;
    let empty = Usage::of(daemon.pid());
    let client = node.client();
    let warm = WARM.min(vols.len());
    let mut took = publish_all(&client, &vols[..warm], ctx).await;
    if dynamic {
        answer_all(node, &vols[..warm]).await;
    }
    let warm_usage = Usage::of(daemon.pid());
    took += publish_all(&client, &vols[warm..], ctx).await;
    if dynamic {
        answer_all(node, vols).await;
    }
    let full = Usage::of(daemon.pid());
    println!(
        "staged and published {} {} tmpfs volumes in {:.2} s{}",
        vols.len(),
        if dynamic { "dynamic" } else { "plain" },
        took.as_secs_f64(),
        if dynamic { "; every socket answers GET /mounts" } else { "" }
    );
    let (idle_cpu_pct, after_idle) = idle_window(daemon.pid()).await;
    let fp = Footprint { n: vols.len(), empty, warm: warm_usage, full, after_idle, idle_cpu_pct };
    (daemon, fp)
}

/// Wait until every volume's socket answers (a minute at most).
async fn answer_all(node: &Node, vols: &[Volume]) {
    let socks: Vec<Sock> = vols.iter().map(|v| Sock::open(&v.target)).collect();
    wait_all_answer(&socks, Instant::now(), Duration::from_secs(60))
        .await
        .unwrap_or_else(|left| panic!("{left} sockets never answered:\n{}", node.log()));
}

/// Copy the daemon's log out of the temporary directory when `MOUNTHOST_BENCH_LOG` is set
/// (it is then the daemon's `--log` filter), and say where.
fn keep_log(node: &Node, name: &str) {
    if std::env::var_os("MOUNTHOST_BENCH_LOG").is_some() {
        let to = std::env::temp_dir().join(format!("mounthost-bench-dynamic-{}-{name}.log", std::process::id()));
        if std::fs::copy(node.root.join("host.log"), &to).is_ok() {
            println!("  (the daemon's log: {})", to.display())
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 3. Dynamic mounts.

/// What a run of mounts measured, sorted.
struct Latencies {
    posts: Vec<Duration>,
    deletes: Vec<Duration>,
    binds: Vec<Duration>,
    not_ready: usize,
    /// Reading `/proc/self/mountinfo` once (what the daemon does once per DELETE; a POST into
    /// a fresh directory reads none), in this namespace at this moment: entries, p50.
    mountinfo: (usize, Duration),
}

/// On `node`'s running daemon: stage and publish a dynamic model volume of `model` (its pull
/// puts the model in the cache), mount the model a few times unmeasured (plugin instances,
/// registry connection), then `count` times `POST /mounts` (timed) and `DELETE` (timed), each
/// after one `mount --bind` child (timed); unpublish and unstage the volume at the end.
async fn mount_latency(node: &Node, model: &registry::PushedModel, count: usize, base: &Path) -> Latencies {
    let model_ctx =
        context(&[("plugin", "model"), ("reference", &model.reference), ("insecure", "true"), ("dynamic", "true")]);
    let pv = "pvc-7a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";
    let vol = Volume {
        id: format!("model~{pv}"),
        staging: node.staging(pv),
        target: node.target("9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b", pv),
    };
    stage_and_publish(&mut node.client(), &vol, &model_ctx, true)
        .await
        .unwrap_or_else(|e| panic!("staging the model volume: {e:?}\n{}", node.log()));
    let sock = Sock::open(&vol.target);
    let create = |id: &str| format!(r#"{{"id":"{id}","parameters":{{"reference":"{}"}}}}"#, model.reference);
    for i in 0..5 {
        let id = format!("warm-{i}");
        let (status, body) = sock.call("POST", "/mounts", Some(&create(&id))).await.unwrap();
        assert!(matches!(status, 200..=202), "POST /mounts: {status} {body}\n{}", node.log());
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let (status, body) = sock.call("GET", &format!("/mounts/{id}"), None).await.unwrap();
            if status == 200 && body.contains(r#""state":"ready""#) {
                break;
            }
            assert!(
                Instant::now() < until && !body.contains(r#""state":"failed""#),
                "{id}: {status} {body}\n{}",
                node.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (status, body) = sock.call("DELETE", &format!("/mounts/{id}"), None).await.unwrap();
        assert_eq!(status, 200, "DELETE: {body}");
    }
    let bind_dir = base.join("bind-baseline");
    let source = bind_dir.join("source");
    std::fs::create_dir_all(&source).unwrap();
    std::fs::write(source.join("model.safetensors"), b"x").unwrap();
    let mut out = Latencies {
        posts: Vec::with_capacity(count),
        deletes: Vec::with_capacity(count),
        binds: Vec::with_capacity(count),
        not_ready: 0,
        mountinfo: (0, Duration::ZERO),
    };
    let mut reads = Vec::new();
    for _ in 0..21 {
        let started = Instant::now();
        out.mountinfo.0 = mounthost::exec::mountinfo::read().unwrap().len();
        reads.push(started.elapsed());
    }
    reads.sort();
    out.mountinfo.1 = pct(&reads, 0.5);
    for i in 0..count {
        // The baseline first, interleaved, so both see the same machine.
        let t = bind_dir.join(format!("t-{i}"));
        std::fs::create_dir(&t).unwrap();
        let started = Instant::now();
        let st = Command::new("mount").arg("--bind").arg(&source).arg(&t).status().unwrap();
        out.binds.push(started.elapsed());
        assert!(st.success());
        nix::mount::umount2(&t, nix::mount::MntFlags::empty()).unwrap();
        std::fs::remove_dir(&t).unwrap();

        let id = format!("m-{i}");
        let started = Instant::now();
        let (status, body) = sock.call("POST", "/mounts", Some(&create(&id))).await.unwrap();
        out.posts.push(started.elapsed());
        match status {
            201 => {}
            202 => out.not_ready += 1,
            _ => panic!("POST /mounts {id}: {status} {body}\n{}", node.log()),
        }
        if i == 0 {
            let got = std::fs::read_dir(vol.target.join("mounts").join(&id)).map(|d| d.count()).unwrap_or(0);
            assert_eq!(got, model.files.len(), "the mount holds the model's files");
        }
        let started = Instant::now();
        let (status, body) = sock.call("DELETE", &format!("/mounts/{id}"), None).await.unwrap();
        out.deletes.push(started.elapsed());
        assert_eq!(status, 200, "DELETE /mounts/{id}: {body}");
    }
    drop(sock);
    let mut client = node.client();
    let unpublished = client
        .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: vol.id.clone(),
            target_path: vol.target.display().to_string(),
        })
        .await;
    let unstaged = client
        .node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: vol.id.clone(),
            staging_target_path: vol.staging.display().to_string(),
        })
        .await;
    if let Err(e) = unpublished.and(unstaged) {
        eprintln!("cleaning up the model volume: {e:?}");
    }
    for v in [&mut out.posts, &mut out.deletes, &mut out.binds] {
        v.sort();
    }
    out
}

impl Latencies {
    fn print(&self, name: &str) {
        let row = |what: &str, v: &[Duration]| {
            println!("  {what:<34} p50 {:>7.2} ms   p99 {:>7.2} ms", ms(pct(v, 0.5)), ms(pct(v, 0.99)));
        };
        println!("{name}");
        row("POST /mounts (201 when mounted)", &self.posts);
        row("DELETE /mounts/<id>", &self.deletes);
        row("baseline: `mount --bind` child", &self.binds);
        println!(
            "  reference: one read of /proc/self/mountinfo ({} entries) p50 {:.2} ms (the daemon reads it once per DELETE, not for a POST into a fresh directory)",
            self.mountinfo.0,
            ms(self.mountinfo.1)
        );
        let p50 = pct(&self.posts, 0.5);
        println!(
            "  POST p50 {:.2} ms: {} (≤ {} ms); ratio p50 POST / `mount --bind` child = {:.1}x{}",
            ms(p50),
            verdict(p50 <= MOUNT_TARGET),
            MOUNT_TARGET.as_millis(),
            p50.as_secs_f64() / pct(&self.binds, 0.5).as_secs_f64(),
            if self.not_ready > 0 {
                format!(" ({} answered 202: not ready in 2 s)", self.not_ready)
            } else {
                String::new()
            }
        );
    }
}

// ---------------------------------------------------------------------------------------------

async fn run() {
    let n = volumes();
    let count = mounts();
    let tmp = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(tmp.path()).unwrap();

    let registry = Registry::start(RegistryOptions::default());
    let model = ModelBuilder::new()
        .file("config.json", br#"{"name":"bench"}"#.to_vec(), Class::Config, Packing::Tar)
        .file("README.md", b"# bench\n".to_vec(), Class::Doc, Packing::TarZstd)
        .file("tokenizer.json", vec![b'{'; 64 << 10], Class::Config, Packing::TarGzip)
        .file("model.safetensors", vec![7u8; 4 << 20], Class::Weight, Packing::Raw)
        .push(&registry, "models/bench", "v1");
    println!("docker-registry on {} holds {} ({} files)", registry.host(), model.reference, model.files.len());

    // 3a, first while the machine is quiet: dynamic mounts on a daemon with nothing else.
    let alone = Node::new(base.join("alone"), &registry);
    let (daemon, fresh_start) = alone.start().await;
    let quiet = mount_latency(&alone, &model, count, &alone.root).await;
    keep_log(&alone, "alone");
    alone.clean_up(Some(daemon));

    // 1a. Baseline: plain (non-dynamic) volumes of the same plugin, on a daemon of their own.
    let plain = Node::new(base.join("plain"), &registry);
    let vols: Vec<Volume> = (0..n).map(|v| tmpfs_volume(&plain, v)).collect();
    let (daemon, plain_cost) =
        footprint(&plain, &vols, &context(&[("plugin", "tmpfs"), ("sizeMiB", "1")]), false).await;
    keep_log(&plain, "plain");
    plain.clean_up(Some(daemon));

    // 1b. Dynamic volumes: each a host tmpfs with the volume's bind, its socket and mounts/.
    let node = Node::new(base.join("dynamic"), &registry);
    let vols: Vec<Volume> = (0..n).map(|v| tmpfs_volume(&node, v)).collect();
    let dyn_ctx = context(&[("plugin", "tmpfs"), ("sizeMiB", "1"), ("dynamic", "true")]);
    let (daemon, dyn_cost) = footprint(&node, &vols, &dyn_ctx, true).await;
    if let Some(v) = vols.first() {
        println!(
            "  (a target's socket path is {} bytes long, sun_path holds 108: clients use /proc/self/fd/N/csi.sock)",
            v.target.join("csi.sock").as_os_str().len()
        );
    }
    println!();
    println!("1. footprint of {n} published volumes of the tmpfs test plugin, one daemon each");
    plain_cost.print("baseline: plain volumes");
    dyn_cost.print("dynamic volumes");
    let worst = dyn_cost.worst_mib();
    println!(
        "RSS with {n} dynamic volumes {worst:.1} MiB: {} (≤ {RSS_TARGET_MIB} MiB); ratio dynamic / plain = {:.2}x",
        verdict(worst <= RSS_TARGET_MIB),
        worst / plain_cost.worst_mib()
    );
    let ((dyn_kib, dyn_fds), (plain_kib, plain_fds)) =
        (dyn_cost.per_volume(&dyn_cost.full), plain_cost.per_volume(&plain_cost.full));
    println!(
        "per volume: dynamic {dyn_kib:.1} KiB and {dyn_fds:.2} fds vs plain {plain_kib:.1} KiB and {plain_fds:.2} fds (ratio RSS {:.2}x)",
        dyn_kib / plain_kib
    );

    // 2. kill -9, start again: every socket polled from the spawn on.
    let socks: Vec<Sock> = vols.iter().map(|v| Sock::open(&v.target)).collect();
    drop(daemon);
    let started = Instant::now();
    let mut daemon = node.spawn();
    let health = {
        let sock = node.host_sock.clone();
        tokio::spawn(async move {
            loop {
                if std::os::unix::net::UnixStream::connect(&sock).is_ok() {
                    let mut client = HostClient::new(mounthost::unpriv::grpc::channel(&sock));
                    if let Ok(Ok(_)) =
                        tokio::time::timeout(Duration::from_secs(30), client.health(HealthRequest {})).await
                    {
                        return started.elapsed();
                    }
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    let answered = wait_all_answer(&socks, started, Duration::from_secs(60)).await;
    let health = tokio::time::timeout(Duration::from_secs(60), health).await.expect("Health never answered").unwrap();
    let mut answered = answered.unwrap_or_else(|left| panic!("{left} sockets never answered:\n{}", node.log()));
    assert!(daemon.alive(), "the daemon died:\n{}", node.log());
    answered.sort();
    let restarted = Usage::of(daemon.pid());
    let (idle_cpu, restarted_idle) = idle_window(daemon.pid()).await;
    println!();
    println!("2. kill -9 and start again with {n} published dynamic volumes (times from spawn)");
    println!("  reference: a fresh daemon on an empty state dir answered Health in {:.1} ms", ms(fresh_start));
    println!("  baseline: host socket answers Health   {:>8.1} ms", ms(health));
    if let (Some(first), Some(all)) = (answered.first().copied(), answered.last().copied()) {
        println!(
            "  dynamic sockets answer GET /mounts:    first {:>7.1} ms   p50 {:>7.1} ms   all {n}: {:>7.1} ms",
            ms(first),
            ms(pct(&answered, 0.5)),
            ms(all)
        );
        println!(
            "  all sockets answer in {:.1} ms: {} (≤ {} ms); ratio all sockets / Health = {:.2}",
            ms(all),
            verdict(all <= RESTART_TARGET),
            RESTART_TARGET.as_millis(),
            all.as_secs_f64() / health.as_secs_f64()
        );
    }
    println!("  restarted daemon, all answered       {}", restarted.show());
    println!(
        "  restarted daemon, after {:>2} s idle     {}   idle CPU {idle_cpu:.1} % of a core",
        idle().as_secs(),
        restarted_idle.show()
    );

    // 3b. Dynamic mounts on the restarted daemon, its dynamic volumes beside them.
    let loaded = mount_latency(&node, &model, count, &node.root).await;
    keep_log(&node, "dynamic");
    println!();
    println!(
        "3. dynamic mount of a model already in the node's cache: {count} POST /mounts, each resolving the tag at the registry (model plugin, docker-registry on 127.0.0.1)"
    );
    quiet.print("on a daemon with only this volume");
    loaded.print(&format!("on the restarted daemon, {n} dynamic volumes beside it"));

    // Clean up: everything mounted dies with the namespace; detached here before the
    // temporary directory goes.
    drop(socks);
    node.clean_up(Some(daemon));
    drop(registry);
}
