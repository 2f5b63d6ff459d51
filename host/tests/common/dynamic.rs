//! Dynamic volumes in tests: a node whose host daemon may pull from a test registry, dynamic
//! model volumes staged and published kubelet's way, and raw HTTP to a volume's `csi.sock`.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mounthost::proto::csi::node_client::NodeClient;
use mounthost::unpriv::grpc::channel;
use serde_json::{Value, json};
use tonic::Code;

use super::registry::{Class, ModelBuilder, Packing, PushedModel, Registry};
use super::{NodeDirs, Proc, stage_req, wait_ready};

pub type Node = NodeClient<mounthost::unpriv::grpc::UnixChannel>;

/// A small model of four files.
pub fn tiny_model(registry: &Registry, repo: &str, tag: &str, weights: &[u8]) -> PushedModel {
    ModelBuilder::new()
        .file("config.json", format!(r#"{{"name":"{repo}"}}"#).into_bytes(), Class::Config, Packing::Tar)
        .file("README.md", format!("# {repo}\n").into_bytes(), Class::Doc, Packing::TarZstd)
        .file("model.safetensors", weights.to_vec(), Class::Weight, Packing::Raw)
        .push(registry, repo, tag)
}

/// Every entry below `dir` (links not followed), relative, with the sha256 of each file and
/// the target of each link: what "byte for byte unchanged" compares.
pub fn snapshot(dir: &Path) -> Vec<(String, String)> {
    pub fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
        let Ok(rd) = std::fs::read_dir(dir) else { return };
        for e in rd {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            if meta.is_symlink() {
                out.push((rel, format!("-> {}", std::fs::read_link(&p).unwrap().display())));
            } else if meta.is_dir() {
                out.push((rel, "dir".into()));
                walk(root, &p, out);
            } else if meta.is_file() {
                out.push((rel, super::registry::sha256_file(&p).0));
            } else {
                out.push((rel, "special".into()));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// The model's files as [`snapshot`] lists them below a mount.
pub fn files_of(model: &PushedModel) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = model.files.iter().map(|(p, h, _)| (p.clone(), h.clone())).collect();
    v.sort();
    v
}

pub fn regular_files(snap: &[(String, String)]) -> Vec<(String, String)> {
    snap.iter().filter(|(_, h)| h != "dir").cloned().collect()
}

/// A connection to `<dir>/csi.sock`, through `/proc/self/fd` of the directory: kubelet's paths
/// are longer than `sun_path`, as a pod's own short path to it would not be.
pub fn connect(dir: &Path) -> std::io::Result<UnixStream> {
    let d = std::fs::File::open(dir)?;
    UnixStream::connect(format!("/proc/self/fd/{}/csi.sock", d.as_raw_fd()))
}

/// Send raw bytes, read the whole answer; its status code (None: no HTTP answer) and body.
pub fn raw(dir: &Path, request: &[u8]) -> (Option<u16>, String) {
    let Ok(mut s) = connect(dir) else { return (None, String::new()) };
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = s.write_all(request);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text.strip_prefix("HTTP/1.1 ").and_then(|r| r.get(..3)).and_then(|c| c.parse().ok());
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

/// One API call: status and JSON body.
pub fn call(dir: &Path, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    try_call(dir, method, path, body).unwrap_or_else(|| panic!("{method} {path}: no HTTP answer"))
}

/// One API call, or None when nothing answered (the socket not served: a host daemon
/// restarting).
pub fn try_call(dir: &Path, method: &str, path: &str, body: Option<Value>) -> Option<(u16, Value)> {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: volume\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let (status, body) = raw(dir, req.as_bytes());
    Some((status?, serde_json::from_str(&body).unwrap_or(Value::Null)))
}

/// Create a mount and wait until it is ready.
pub fn mount(dir: &Path, id: &str, reference: &str) -> Value {
    let (status, v) = call(dir, "POST", "/mounts", Some(json!({"id": id, "parameters": {"reference": reference}})));
    assert!(matches!(status, 200..=202), "create {id}: {status} {v}");
    wait_state(dir, id, "ready")
}

pub fn wait_state(dir: &Path, id: &str, state: &str) -> Value {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, v) = call(dir, "GET", &format!("/mounts/{id}"), None);
        if status == 200 && v["state"] == state {
            return v;
        }
        assert!(Instant::now() < until && v["state"] != "failed", "{id} did not become {state}: {status} {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Does the socket answer within `limit`?
pub fn answers_within(dir: &Path, limit: Duration) -> bool {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if let (Some(200), _) = raw(dir, b"GET /mounts HTTP/1.1\r\nHost: v\r\nConnection: close\r\n\r\n") {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

pub struct DynNode {
    host: std::sync::Mutex<Option<Proc>>,
    args: Vec<String>,
    _front: Proc,
    /// Last: fields drop in order, so the daemons are dead before their directories are cleaned.
    pub dirs: NodeDirs,
}

impl DynNode {
    pub fn start(registry: &Registry) -> DynNode {
        DynNode::start_with(registry, &[])
    }

    /// Started with these host daemon arguments too.
    pub fn start_with(registry: &Registry, more: &[&str]) -> DynNode {
        let dirs = NodeDirs::new();
        let mut args = vec![format!("--insecure-registry={}", registry.host())];
        args.extend(more.iter().map(|a| a.to_string()));
        let host = dirs.start_host(&args);
        let front = dirs.start_front(&[]);
        DynNode { dirs, host: std::sync::Mutex::new(Some(host)), args, _front: front }
    }

    pub fn restart_host(&self) {
        self.restart_host_with(|| {});
    }

    /// Kill the host daemon (-9), run `meanwhile`, start it again.
    pub fn restart_host_with(&self, meanwhile: impl FnOnce()) {
        if let Some(mut h) = self.host.lock().unwrap().take() {
            h.kill9();
        }
        meanwhile();
        *self.host.lock().unwrap() = Some(self.dirs.start_host(&self.args));
    }

    /// Kill the host daemon (-9) and start it again with `more` instead of the arguments it was
    /// started with (the registry stays insecure).
    pub fn restart_host_instead(&self, more: &[&str]) {
        if let Some(mut h) = self.host.lock().unwrap().take() {
            h.kill9();
        }
        let mut args = vec![self.args[0].clone()];
        args.extend(more.iter().map(|a| a.to_string()));
        *self.host.lock().unwrap() = Some(self.dirs.start_host(&args));
    }

    /// The host daemon's pid.
    pub fn host_pid(&self) -> u32 {
        self.host.lock().unwrap().as_ref().expect("the host daemon runs").child.id()
    }

    pub fn host_alive(&self) -> bool {
        self.host.lock().unwrap().as_mut().is_some_and(|h| h.child.try_wait().unwrap().is_none())
    }

    pub async fn node(&self) -> Node {
        let ch = channel(&self.dirs.csi_sock);
        wait_ready(&ch).await;
        NodeClient::new(ch)
    }

    /// Stage (until the pull is done) and publish a dynamic model volume; its target.
    pub async fn dynamic_volume(&self, csi: &mut Node, pv: &str, pod: &str, ctx: &HashMap<String, String>) -> PathBuf {
        self.dynamic_volume_with(csi, pv, pod, ctx, HashMap::new(), HashMap::new()).await
    }

    /// [`DynNode::dynamic_volume`] with these stage and publish secrets.
    pub async fn dynamic_volume_with(
        &self,
        csi: &mut Node,
        pv: &str,
        pod: &str,
        ctx: &HashMap<String, String>,
        stage_secrets: HashMap<String, String>,
        publish_secrets: HashMap<String, String>,
    ) -> PathBuf {
        let staging = self.dirs.staging(pv);
        let mut req = stage_req(pv, &staging, ctx);
        req.secrets = stage_secrets;
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            match csi.node_stage_volume(req.clone()).await {
                Ok(_) => break,
                Err(s) if s.code() == Code::Unavailable && Instant::now() < until => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(s) => panic!("staging {pv}: {s:?}"),
            }
        }
        let target = self.dirs.target(pod, pv);
        let mut req = super::publish_req(pv, &staging, &target, true, ctx);
        req.secrets = publish_secrets;
        csi.node_publish_volume(req).await.unwrap();
        target
    }
}

pub fn dynamic_ctx(reference: &str) -> HashMap<String, String> {
    [("plugin", "model"), ("reference", reference), ("insecure", "true"), ("dynamic", "true")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
