//! The model tests' shared harness: a node of real host and front daemons, kubelet-shaped
//! stage and publish requests for model volumes, the files a volume shows, and a throttling
//! TCP relay between the host and the registry (`Relay`), which makes "in the middle of a
//! download" a moment a test can reach on purpose: it counts the bytes the registry sent, slows
//! them to a rate the test sets, and can be cut.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mounthost::proto::csi;
use mounthost::proto::csi::node_client::NodeClient;
use mounthost::proto::host::host_client::HostClient;
use mounthost::proto::host::{LazyProgress, VolumeStatus};
use mounthost::unpriv::grpc::channel;
use tonic::Code;

use super::registry::{Class, ModelBuilder, Packing, PushedModel, Registry, random_file};
use super::{NodeDirs, Proc, Scrape, guarded, wait_ready};

pub type Node = NodeClient<mounthost::unpriv::grpc::UnixChannel>;

/// A running node: host daemon and front, and a runtime to drive them.
pub struct ModelNode {
    pub host: std::sync::Mutex<Option<Proc>>,
    pub _front: Proc,
    /// Last: fields drop in order, so the daemons are dead before their directories are cleaned.
    pub dirs: NodeDirs,
}

impl ModelNode {
    pub fn start(host_args: Vec<String>) -> ModelNode {
        ModelNode::start_in(NodeDirs::new(), host_args)
    }

    pub fn start_in(dirs: NodeDirs, host_args: Vec<String>) -> ModelNode {
        let host = dirs.start_host(&host_args);
        let front = dirs.start_front(&[]);
        ModelNode { dirs, host: std::sync::Mutex::new(Some(host)), _front: front }
    }

    /// Kill the host daemon (-9) and start it again with `host_args` (the front stays).
    pub fn restart_host(&self, host_args: Vec<String>) {
        self.kill_host();
        *self.host.lock().unwrap() = Some(self.dirs.start_host(&host_args));
    }

    pub fn kill_host(&self) {
        if let Some(mut h) = self.host.lock().unwrap().take() {
            h.kill9();
        }
    }

    pub async fn node(&self) -> Node {
        let ch = channel(&self.dirs.csi_sock);
        wait_ready(&ch).await;
        NodeClient::new(ch)
    }

    pub async fn volumes(&self) -> Vec<VolumeStatus> {
        let mut host = HostClient::new(channel(&self.dirs.host_sock));
        host.list_volumes(mounthost::proto::host::ListVolumesRequest {}).await.unwrap().into_inner().volumes
    }

    /// Bytes the host's blob cache received from every registry, from its metrics (counted as
    /// they arrive).
    pub fn fetched(&self) -> f64 {
        self.scrape().value("mounthost_oci_blob_fetched_bytes_total", &[])
    }

    /// The host daemon's `/metrics`, parsed.
    pub fn scrape(&self) -> Scrape {
        Scrape::of(&self.dirs.host_metrics())
    }

    /// Run `mounthost <args>` against this node's host daemon.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new(env!("CARGO_BIN_EXE_mounthost"))
            .arg("--state-dir")
            .arg(&self.dirs.state)
            .arg("--host-socket")
            .arg(&self.dirs.host_sock)
            .args(args)
            .output()
            .unwrap()
    }
}

/// The pull metrics of one registry in a scrape.
#[derive(Debug, PartialEq)]
pub struct Pulls {
    pub fetched: f64,
    pub from_cache: f64,
    pub dedup_cached: f64,
    pub dedup_downloading: f64,
    pub in_progress: f64,
    pub ok: f64,
    pub failed: f64,
}

impl Pulls {
    pub fn of(scrape: &Scrape, registry: &str) -> Pulls {
        let r = ("registry", registry);
        let v = |name: &str, more: &[(&str, &str)]| {
            let labels: Vec<(&str, &str)> = std::iter::once(r).chain(more.iter().copied()).collect();
            scrape.get(name, &labels).unwrap_or_else(|| panic!("no {name}{labels:?} in:\n{}", scrape.dump()))
        };
        Pulls {
            fetched: v("mounthost_oci_blob_fetched_bytes_total", &[]),
            from_cache: v("mounthost_oci_blob_served_from_cache_bytes_total", &[]),
            dedup_cached: v("mounthost_oci_blobs_deduplicated_total", &[("found", "cached")]),
            dedup_downloading: v("mounthost_oci_blobs_deduplicated_total", &[("found", "downloading")]),
            in_progress: v("mounthost_oci_pulls_in_progress", &[]),
            // A histogram's series appear with its first observation.
            ok: scrape.value("mounthost_oci_pull_duration_seconds_count", &[r, ("outcome", "ok")]),
            failed: scrape.value("mounthost_oci_pull_duration_seconds_count", &[r, ("outcome", "failed")]),
        }
    }

    /// The scraped samples of `registry`'s pull metrics but the buckets, on one line (the
    /// test's output shows `checked:` lines only).
    pub fn line(scrape: &Scrape, registry: &str) -> String {
        let mine = format!("\"registry\": \"{registry}\"");
        let dump = scrape.dump();
        let samples: Vec<&str> = dump
            .lines()
            .filter(|l| l.starts_with("mounthost_oci_") && l.contains(&mine) && !l.contains("_bucket"))
            .collect();
        samples.join("; ")
    }
}

/// A model volume's context.
pub fn model_ctx(reference: &str, extra: &[(&str, &str)]) -> HashMap<String, String> {
    let mut ctx: HashMap<String, String> =
        [("plugin".to_string(), "model".to_string()), ("reference".into(), reference.to_string())].into();
    ctx.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    ctx
}

/// Stage until it stops answering UNAVAILABLE (kubelet's retry loop, faster); returns the
/// UNAVAILABLE messages seen and the final outcome.
pub async fn stage_until_done(
    node: &mut Node,
    req: &csi::NodeStageVolumeRequest,
    limit: Duration,
) -> (Vec<String>, Result<(), tonic::Status>) {
    let until = Instant::now() + limit;
    let mut waits = Vec::new();
    loop {
        match node.node_stage_volume(req.clone()).await {
            Ok(_) => return (waits, Ok(())),
            Err(s) if s.code() == Code::Unavailable && Instant::now() < until => {
                waits.push(s.message().to_string());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(s) => return (waits, Err(s)),
        }
    }
}

/// NodeStageVolume of a model volume, MULTI_NODE_READER_ONLY: the capability it is published
/// with ([`publish_req`]).
pub fn stage_req(id: &str, staging: &Path, ctx: &HashMap<String, String>) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_capability: Some(super::capability(csi::volume_capability::access_mode::Mode::MultiNodeReaderOnly)),
        ..super::stage_req(id, staging, ctx)
    }
}

pub fn publish_req(
    id: &str,
    staging: &Path,
    target: &Path,
    ctx: &HashMap<String, String>,
) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(super::capability(csi::volume_capability::access_mode::Mode::MultiNodeReaderOnly)),
        readonly: true,
        volume_context: ctx.clone(),
        ..Default::default()
    }
}

/// Every regular file below `dir`, relative, with its sha256 (hex).
pub fn tree(dir: &Path) -> Vec<(String, String)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            if meta.is_dir() {
                walk(root, &p, out);
            } else {
                let (hex, _) = super::registry::sha256_file(&p);
                out.push((p.strip_prefix(root).unwrap().display().to_string(), hex));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// The files of `model` whose paths pass `keep`, as [`tree`] lists them.
pub fn expected(model: &PushedModel, keep: impl Fn(&str) -> bool) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> =
        model.files.iter().filter(|(p, _, _)| keep(p)).map(|(p, h, _)| (p.clone(), h.clone())).collect();
    v.sort();
    v
}

/// Partial downloads left in the node's blob cache.
pub fn partials(state: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.to_string_lossy().contains("partial") {
                out.push(p);
            }
        }
    }
    walk(&state.join("cache/blobs"), &mut out);
    out
}

/// A small model: a config and a tokenizer (tar, tar+gzip), a README (tar+zstd) and weights
/// (raw) of `weights` bytes.
pub fn small_model(registry: &Registry, work: &Path, repo: &str, weights: u64) -> PushedModel {
    small_model_with_weights(registry, work, repo, weights).0
}

/// [`small_model`], and the file of its weights (in `work`).
pub fn small_model_with_weights(registry: &Registry, work: &Path, repo: &str, weights: u64) -> (PushedModel, PathBuf) {
    let (w, _) = random_file(work, weights);
    let model = ModelBuilder::new()
        .file("config.json", br#"{"architectures":["Test"]}"#.as_slice(), Class::Config, Packing::Tar)
        .file(
            "tokenizer.json",
            br#"{"version":"1.0","model":{"type":"BPE"}}"#.as_slice(),
            Class::Config,
            Packing::TarGzip,
        )
        .file("README.md", b"# a test model\n".as_slice(), Class::Doc, Packing::TarZstd)
        .file("model.safetensors", super::registry::Content::File(w.clone()), Class::Weight, Packing::Raw)
        .push(registry, repo, "v1");
    (model, w)
}

/// A TCP relay to `upstream` that counts and throttles what the upstream sends back.
pub struct Relay {
    pub port: u16,
    sent: Arc<AtomicU64>,
    rate: Arc<AtomicU64>,
    cut: Arc<AtomicBool>,
}

impl Relay {
    pub fn start(upstream: String) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let relay = Relay { port, sent: Arc::default(), rate: Arc::new(AtomicU64::new(u64::MAX)), cut: Arc::default() };
        let (sent, rate, cut) = (relay.sent.clone(), relay.rate.clone(), relay.cut.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(&upstream) else { continue };
                cut.store(false, Ordering::SeqCst);
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || pipe(c2, s2, None));
                let (sent, rate, cut) = (sent.clone(), rate.clone(), cut.clone());
                std::thread::spawn(move || pipe(server, client, Some((sent, rate, cut))));
            }
        });
        relay
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Bytes per second the upstream's answers are slowed to.
    pub fn throttle(&self, bytes_per_sec: u64) {
        self.rate.store(bytes_per_sec, Ordering::SeqCst);
    }

    /// Close every connection now open.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }

    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }
}

pub type Meter = (Arc<AtomicU64>, Arc<AtomicU64>, Arc<AtomicBool>);

pub fn pipe(mut from: TcpStream, mut to: TcpStream, meter: Option<Meter>) {
    let mut buf = vec![0u8; 64 << 10];
    let mut started = Instant::now();
    let mut moved = 0u64;
    let mut paced = u64::MAX;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some((sent, rate, cut)) = &meter {
            if cut.load(Ordering::SeqCst) {
                break;
            }
            let rate = rate.load(Ordering::SeqCst);
            if rate != paced {
                // A new rate counts from now (a kept-alive connection's past is not owed).
                (paced, moved, started) = (rate, 0, Instant::now());
            }
            moved += n as u64;
            if rate != u64::MAX {
                let due = Duration::from_secs_f64(moved as f64 / rate as f64);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
            sent.fetch_add(n as u64, Ordering::SeqCst);
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(std::net::Shutdown::Both);
    let _ = to.shutdown(std::net::Shutdown::Both);
}

/// Run `body` on a tokio runtime; on a panic print the node's and the registry's logs.
pub fn run(node: &ModelNode, registry: &Registry, body: impl AsyncFnOnce()) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let log = registry.log_path();
    guarded(&node.dirs, || {
        if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.block_on(body()))) {
            eprintln!("--- registry log (tail)\n{}", tail(&std::fs::read_to_string(log).unwrap_or_default(), 40));
            std::panic::resume_unwind(e);
        }
    });
}

pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The lazy progress of volume `id` as ListVolumes reports it.
pub async fn progress(node: &ModelNode, id: &str) -> Option<LazyProgress> {
    node.volumes().await.into_iter().find(|v| v.volume_id == id).and_then(|v| v.lazy)
}

/// `len` bytes at `at` of `file`.
pub fn read_range(file: &Path, at: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    std::fs::File::open(file).unwrap().read_exact_at(&mut buf, at).unwrap();
    buf
}

pub fn lazy_ctx(reference: &str) -> HashMap<String, String> {
    model_ctx(reference, &[("insecure", "true"), ("lazy", "true")])
}

/// NodeGetVolumeStats of `id` at `path`: its VolumeCondition (abnormal, message).
pub async fn condition(csi: &mut Node, id: &str, path: &Path) -> (bool, String) {
    let r = csi
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: id.into(),
            volume_path: path.display().to_string(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let c = r.volume_condition.unwrap_or_default();
    (c.abnormal, c.message)
}

/// Wait until `id`'s progress passes `test` (at most `limit`).
pub async fn until_progress(
    node: &ModelNode,
    id: &str,
    limit: Duration,
    test: impl Fn(&LazyProgress) -> bool,
) -> LazyProgress {
    let until = Instant::now() + limit;
    loop {
        let p = progress(node, id).await;
        if let Some(p) = &p
            && test(p)
        {
            return p.clone();
        }
        assert!(Instant::now() < until, "not reached: {p:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The errno a read of `len` bytes at `at` of `file` failed with (None: it succeeded).
pub fn read_errno(file: &Path, at: u64, len: usize) -> Option<i32> {
    let mut buf = vec![0u8; len];
    match std::fs::File::open(file).and_then(|f| f.read_exact_at(&mut buf, at)) {
        Ok(()) => None,
        Err(e) => Some(e.raw_os_error().unwrap_or(-1)),
    }
}

/// The node's staging, target and a stage of `pv` of `reference` with `ctx`, published.
pub async fn staged_and_published(
    node: &ModelNode,
    csi: &mut Node,
    pv: &str,
    ctx: &HashMap<String, String>,
) -> (PathBuf, PathBuf) {
    let staging = node.dirs.staging(pv);
    csi.node_stage_volume(stage_req(pv, &staging, ctx)).await.unwrap();
    let target = node.dirs.target(&format!("pod-{pv}"), pv);
    csi.node_publish_volume(publish_req(pv, &staging, &target, ctx)).await.unwrap();
    (staging, target)
}

pub async fn unstage(csi: &mut Node, pv: &str, staging: &Path, target: &Path) {
    csi.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
        volume_id: pv.into(),
        target_path: target.display().to_string(),
    })
    .await
    .unwrap();
    csi.node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: pv.into(),
        staging_target_path: staging.display().to_string(),
    })
    .await
    .unwrap();
}
