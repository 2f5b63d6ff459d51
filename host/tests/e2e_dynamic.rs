//! End to end, as root, in a private mount namespace: dynamic volumes. Model volumes with
//! `dynamic: "true"` are staged and published through the real front and host daemon, with
//! kubelet's real path lengths (longer than a unix socket path may be), and a pod's requests go
//! to the socket in its own volume; models come from a real `docker-registry`.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::registry::{Class, ModelBuilder, Packing, PushedModel, Registry, RegistryOptions};
use common::{NodeDirs, Proc, guarded, in_private_namespace, mounts_below, stage_req, wait_ready};
use mounthost::proto::csi;
use mounthost::proto::csi::node_client::NodeClient;
use mounthost::unpriv::grpc::channel;
use serde_json::{Value, json};
use tonic::Code;

type Node = NodeClient<tonic::transport::Channel>;

/// kubelet-shaped names: a pod uid and a PV name as long as real ones.
const POD_A: &str = "5b0d5f8e-1c2a-4f3b-9d8e-7a6b5c4d3e2f";
const POD_B: &str = "9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b";
const PV_A: &str = "pvc-0f3c2a4e-8b1d-4c55-9e7a-3d2b1c0a9f81";
const PV_B: &str = "pvc-7a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";

/// A small model of four files.
fn tiny_model(registry: &Registry, repo: &str, tag: &str, weights: &[u8]) -> PushedModel {
    ModelBuilder::new()
        .file("config.json", format!(r#"{{"name":"{repo}"}}"#).into_bytes(), Class::Config, Packing::Tar)
        .file("README.md", format!("# {repo}\n").into_bytes(), Class::Doc, Packing::TarZstd)
        .file("model.safetensors", weights.to_vec(), Class::Weight, Packing::Raw)
        .push(registry, repo, tag)
}

/// Every entry below `dir` (links not followed), relative, with the sha256 of each file and
/// the target of each link: what "byte for byte unchanged" compares.
fn snapshot(dir: &Path) -> Vec<(String, String)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
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
                out.push((rel, common::registry::sha256_file(&p).0));
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
fn files_of(model: &PushedModel) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = model.files.iter().map(|(p, h, _)| (p.clone(), h.clone())).collect();
    v.sort();
    v
}

fn regular_files(snap: &[(String, String)]) -> Vec<(String, String)> {
    snap.iter().filter(|(_, h)| h != "dir").cloned().collect()
}

/// A connection to `<dir>/csi.sock`, through `/proc/self/fd` of the directory: kubelet's paths
/// are longer than `sun_path`, as a pod's own short path to it would not be.
fn connect(dir: &Path) -> std::io::Result<UnixStream> {
    let d = std::fs::File::open(dir)?;
    UnixStream::connect(format!("/proc/self/fd/{}/csi.sock", d.as_raw_fd()))
}

/// Send raw bytes, read the whole answer; its status code (None: no HTTP answer) and body.
fn raw(dir: &Path, request: &[u8]) -> (Option<u16>, String) {
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
fn call(dir: &Path, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: volume\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let (status, body) = raw(dir, req.as_bytes());
    let status = status.unwrap_or_else(|| panic!("{method} {path}: no HTTP answer"));
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// Create a mount and wait until it is ready.
fn mount(dir: &Path, id: &str, reference: &str) -> Value {
    let (status, v) = call(dir, "POST", "/mounts", Some(json!({"id": id, "parameters": {"reference": reference}})));
    assert!(matches!(status, 200..=202), "create {id}: {status} {v}");
    wait_state(dir, id, "ready")
}

fn wait_state(dir: &Path, id: &str, state: &str) -> Value {
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
fn answers_within(dir: &Path, limit: Duration) -> bool {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if let (Some(200), _) = raw(dir, b"GET /mounts HTTP/1.1\r\nHost: v\r\nConnection: close\r\n\r\n") {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

struct DynNode {
    dirs: NodeDirs,
    host: std::sync::Mutex<Option<Proc>>,
    args: Vec<String>,
    _front: Proc,
}

impl DynNode {
    fn start(registry: &Registry) -> DynNode {
        let dirs = NodeDirs::new();
        let args = vec![format!("--insecure-registry={}", registry.host())];
        let host = dirs.start_host(&args);
        let front = dirs.start_front(&[]);
        DynNode { dirs, host: std::sync::Mutex::new(Some(host)), args, _front: front }
    }

    fn restart_host(&self) {
        if let Some(mut h) = self.host.lock().unwrap().take() {
            h.kill9();
        }
        *self.host.lock().unwrap() = Some(self.dirs.start_host(&self.args));
    }

    fn host_alive(&self) -> bool {
        self.host.lock().unwrap().as_mut().is_some_and(|h| h.child.try_wait().unwrap().is_none())
    }

    async fn node(&self) -> Node {
        let ch = channel(&self.dirs.csi_sock);
        wait_ready(&ch).await;
        NodeClient::new(ch)
    }

    /// Stage (until the pull is done) and publish a dynamic model volume; its target.
    async fn dynamic_volume(&self, csi: &mut Node, pv: &str, pod: &str, ctx: &HashMap<String, String>) -> PathBuf {
        let staging = self.dirs.staging(pv);
        let req = stage_req(pv, &staging, ctx);
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
        csi.node_publish_volume(publish_req(pv, &staging, &target, ctx)).await.unwrap();
        target
    }
}

fn publish_req(
    id: &str,
    staging: &Path,
    target: &Path,
    ctx: &HashMap<String, String>,
) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(common::multi_writer()),
        readonly: true,
        volume_context: ctx.clone(),
        ..Default::default()
    }
}

fn dynamic_ctx(reference: &str) -> HashMap<String, String> {
    [("plugin", "model"), ("reference", reference), ("insecure", "true"), ("dynamic", "true")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn run(node: &DynNode, body: impl AsyncFnOnce()) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    guarded(&node.dirs, || rt.block_on(body()));
}

/// A process in a mount namespace of its own with slave propagation, started now (a stand-in
/// for a container whose volume mount has `mountPropagation: HostToContainer`): on a line on
/// its stdin it lists the files below `dir` as it sees them.
struct Container {
    child: std::process::Child,
}

impl Container {
    fn start(dir: &Path) -> Container {
        let script =
            format!("while read x; do find {} -type f | sort; echo END; done", shell_quote(&dir.display().to_string()));
        let child = std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "slave", "--", "sh", "-c", &script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        Container { child }
    }

    fn files(&mut self) -> Vec<String> {
        self.child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
        let out = self.child.stdout.as_mut().unwrap();
        let mut text = Vec::new();
        let mut byte = [0u8; 1];
        while !text.ends_with(b"END\n") {
            assert_eq!(out.read(&mut byte).unwrap(), 1, "the container stand-in ended");
            text.push(byte[0]);
        }
        String::from_utf8(text).unwrap().lines().filter(|l| *l != "END").map(str::to_string).collect()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[test]
fn a_pod_mounts_models_into_its_own_volume_and_nothing_else() {
    if !in_private_namespace("a_pod_mounts_models_into_its_own_volume_and_nothing_else") {
        return;
    }
    let registry = Registry::start(RegistryOptions::default());
    let base = tiny_model(&registry, "models/base", "v1", b"base weights");
    let extra = tiny_model(&registry, "models/extra", "v1", &vec![7u8; 3 << 20]);
    let other = tiny_model(&registry, "models/other", "v1", b"other weights");
    let node = DynNode::start(&registry);
    run(&node, async || {
        let mut csi = node.node().await;
        let a = node.dynamic_volume(&mut csi, PV_A, POD_A, &dynamic_ctx(&base.reference)).await;
        let b = node.dynamic_volume(&mut csi, PV_B, POD_B, &dynamic_ctx(&base.reference)).await;
        assert!(a.join("csi.sock").as_os_str().len() > 108, "the test uses kubelet-length paths");

        // The published directory: the volume's own files, the socket, the mounts folder.
        let meta = std::fs::symlink_metadata(a.join("csi.sock")).unwrap();
        assert!(std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()));
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777, 0o666);
        assert!(a.join("mounts").is_dir());
        assert_eq!(regular_files(&snapshot(&a.join("volume"))), files_of(&base));

        // A "container" started before the mount sees it.
        let mut container = Container::start(&a.join("mounts"));
        assert_eq!(container.files(), Vec::<String>::new());

        let v = mount(&a, "extra", &extra.reference);
        assert_eq!(v["path"], "mounts/extra", "{v}");
        assert_eq!(regular_files(&snapshot(&a.join("mounts/extra"))), files_of(&extra));
        let write = std::fs::write(a.join("mounts/extra/config.json"), b"x").unwrap_err();
        assert_eq!(write.raw_os_error(), Some(libc_erofs()), "{write}");
        let seen = container.files();
        let mut want: Vec<String> =
            extra.files.iter().map(|(p, _, _)| a.join("mounts/extra").join(p).display().to_string()).collect();
        want.sort();
        assert_eq!(seen, want, "the container sees the mount made after it started");
        println!("checked: a container started before the mount sees its {} files", seen.len());

        // The same request again is fine; other parameters under the same id are not.
        let (status, v) =
            call(&a, "POST", "/mounts", Some(json!({"id": "extra", "parameters": {"reference": extra.reference}})));
        assert_eq!((status, v["state"].as_str()), (200, Some("ready")), "{v}");
        let (status, v) =
            call(&a, "POST", "/mounts", Some(json!({"id": "extra", "parameters": {"reference": other.reference}})));
        assert_eq!((status, v["code"].as_str()), (409, Some("conflict")), "{v}");

        // B gets a mount of its own; what B has is then fixed, byte for byte.
        mount(&b, "b-model", &other.reference);
        let (_, list) = call(&a, "GET", "/mounts", None);
        let ids: Vec<&str> = list["mounts"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["extra"], "A lists its own mounts only: {list}");
        let b_before = snapshot(&b);
        let b_list = call(&b, "GET", "/mounts", None);

        // A directory standing for /etc, with a file in it.
        let etc = node.dirs.root.path().join("etc-standin");
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::write(etc.join("passwd"), b"root:x:0:0\n").unwrap();
        let etc_before = snapshot(&etc);

        // Isolation: each attempt from A's socket, with the answer it must get.
        let long = "a".repeat(5000);
        let create = |id: &str| Some(json!({"id": id, "parameters": {"reference": other.reference}}));
        let attempts: Vec<(&str, &str, String, Option<Value>, u16)> = vec![
            ("id ..", "GET", "/mounts/..".into(), None, 400),
            ("id ../..", "GET", "/mounts/../../pods".into(), None, 400),
            ("path climbing out", "DELETE", "/mounts/../../../".into(), None, 400),
            ("encoded slash", "GET", "/mounts/..%2f..%2fb".into(), None, 400),
            ("encoded dots", "DELETE", "/mounts/%2e%2e".into(), None, 400),
            ("absolute path as id", "POST", "/mounts".into(), create("/etc"), 400),
            ("slash in id", "POST", "/mounts".into(), create("a/b"), 400),
            ("dots as id", "POST", "/mounts".into(), create(".."), 400),
            ("NUL in id", "POST", "/mounts".into(), create("a\u{0}b"), 400),
            ("very long id", "POST", "/mounts".into(), create(&long), 400),
            ("very long id in the path", "GET", format!("/mounts/{long}"), None, 400),
            ("B's mount id", "GET", "/mounts/b-model".into(), None, 404),
            ("delete B's mount id", "DELETE", "/mounts/b-model".into(), None, 404),
            (
                "a volume named in the body",
                "POST",
                "/mounts".into(),
                Some(json!({"id": "x", "volume": PV_B, "parameters": {"reference": other.reference}})),
                400,
            ),
            (
                "a plugin the volume does not allow",
                "POST",
                "/mounts".into(),
                Some(json!({"id": "x", "plugin": "seaweedfs", "parameters": {}})),
                403,
            ),
            (
                "a registry setting from the pod",
                "POST",
                "/mounts".into(),
                Some(json!({"id": "x", "parameters": {"reference": other.reference, "mirror": "evil:5000"}})),
                400,
            ),
            (
                "a registry the StorageClass does not grant",
                "POST",
                "/mounts".into(),
                Some(json!({"id": "x", "parameters": {"reference": "evil.example:5000/m:v1"}})),
                400,
            ),
            ("another path", "GET", "/volumes".into(), None, 404),
            ("a method the API has not", "PUT", "/mounts/extra".into(), None, 405),
        ];
        for (what, method, path, body, want) in &attempts {
            let (status, v) = call(&a, method, path, body.clone());
            assert_eq!(status, *want, "{what}: {method} {path}: {v}");
            assert!(v["code"].is_string() && v["message"].is_string(), "{what}: an error body: {v}");
            println!("checked: {what}: {method} {} -> {status} {}", &path[..path.len().min(40)], v["code"]);
        }

        // Links a pod plants in its own directory: where a mount goes, and instead of `mounts/`.
        std::os::unix::fs::symlink(&b, a.join("mounts/to-b")).unwrap();
        let v = mount(&a, "to-b", &other.reference);
        assert!(std::fs::symlink_metadata(a.join("mounts/to-b")).unwrap().is_dir(), "{v}");
        println!("checked: a link to B where a mount goes was replaced; the mount stayed in A");
        call(&a, "DELETE", "/mounts/to-b", None);
        // `mounts/` itself cannot be moved while it holds a mount; emptied, it can.
        call(&a, "DELETE", "/mounts/extra", None);
        std::fs::remove_dir(a.join("mounts")).unwrap();
        std::os::unix::fs::symlink(&etc, a.join("mounts")).unwrap();
        let v = mount(&a, "etc-link", &other.reference);
        assert!(std::fs::symlink_metadata(a.join("mounts")).unwrap().is_dir(), "{v}");
        assert_eq!(regular_files(&snapshot(&a.join("mounts/etc-link"))), files_of(&other));
        println!("checked: mounts/ replaced by a link to an /etc stand-in was made again; the mount stayed in A");
        std::fs::remove_dir_all(a.join("mounts")).unwrap_err();
        call(&a, "DELETE", "/mounts/etc-link", None);
        std::fs::remove_dir(a.join("mounts")).unwrap();
        std::fs::write(a.join("mounts"), b"a file").unwrap();
        mount(&a, "extra", &extra.reference);
        assert!(a.join("mounts/extra/config.json").is_file());
        println!("checked: mounts/ replaced by a file was made again");

        // `csi.sock` replaced by a regular file: the host serves it again.
        std::fs::remove_file(a.join("csi.sock")).unwrap();
        std::fs::write(a.join("csi.sock"), b"not a socket").unwrap();
        assert!(answers_within(&a, Duration::from_secs(10)), "the socket is served again");
        println!("checked: csi.sock replaced by a file is a socket again");

        assert_eq!(snapshot(&b), b_before, "B is byte for byte unchanged");
        assert_eq!(call(&b, "GET", "/mounts", None), b_list);
        assert_eq!(snapshot(&etc), etc_before, "the /etc stand-in is unchanged");

        // Host killed (-9) and started again: A's socket answers, its mount is intact.
        let before = snapshot(&a.join("mounts"));
        node.restart_host();
        assert!(answers_within(&a, Duration::from_secs(1)), "A's socket answers once the daemon is up");
        assert!(node.host_alive());
        let (_, list) = call(&a, "GET", "/mounts", None);
        assert_eq!(list["mounts"][0]["state"], "ready", "{list}");
        assert_eq!(snapshot(&a.join("mounts")), before);
        assert!(container.files().iter().any(|f| f.ends_with("mounts/extra/model.safetensors")));
        println!("checked: after kill -9 and restart the socket answers and the mount is intact");

        // Delete: unmounted and gone.
        let (status, v) = call(&a, "DELETE", "/mounts/extra", None);
        assert_eq!((status, v["state"].as_str()), (200, Some("deleted")), "{v}");
        assert!(!a.join("mounts/extra").exists());
        assert_eq!(call(&a, "GET", "/mounts/extra", None).0, 404);
        assert_eq!(mounts_below(&a.join("mounts")), Vec::<PathBuf>::new());

        // Unpublish A with a mount in it: everything of A is gone, B is untouched.
        mount(&a, "extra", &extra.reference);
        drop(container);
        csi.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: PV_A.into(),
            target_path: a.display().to_string(),
        })
        .await
        .unwrap();
        assert!(!a.exists(), "the target is gone");
        assert_eq!(mounts_below(&a), Vec::<PathBuf>::new());
        assert!(!node.dirs.state.join("cache/volumes").join(volume_key(PV_A)).join("dynamic").exists());
        assert_eq!(snapshot(&b), b_before, "B is byte for byte unchanged");
        assert_eq!(call(&b, "GET", "/mounts", None), b_list);

        csi.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: PV_B.into(),
            target_path: b.display().to_string(),
        })
        .await
        .unwrap();
        for pv in [PV_A, PV_B] {
            csi.node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: pv.into(),
                staging_target_path: node.dirs.staging(pv).display().to_string(),
            })
            .await
            .unwrap();
        }
        assert_eq!(mounts_below(node.dirs.root.path()), Vec::<PathBuf>::new());
    });
}

fn volume_key(id: &str) -> String {
    mounthost::volume::dirs::volume_key(id)
}

fn libc_erofs() -> i32 {
    nix::errno::Errno::EROFS as i32
}
