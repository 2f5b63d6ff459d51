//! End to end, as root, in a private mount namespace: dynamic mounts of private models. The
//! volume's CSI secrets (its NodePublishVolume's, else its NodeStageVolume's) are the
//! credentials of its dynamic mounts for the registries its StorageClass names, and for no
//! other. Real front and host daemon, real `docker-registry`s behind htpasswd, each reached
//! through a relay of the test's that records the credentials every request carried.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::dynamic::*;
use common::registry::{PushedModel, Registry, RegistryOptions};
use common::{guarded, in_private_namespace};
use mounthost::volume::dirs::volume_key;
use serde_json::json;

const POD_A: &str = "3c1e0a52-6f7b-4d2e-9a1c-5b4d3e2f1a0b";
const POD_B: &str = "8f7e6d5c-4b3a-4c2d-9e1f-0a9b8c7d6e5f";
const PV_A: &str = "pvc-1d2c3b4a-5e6f-4a7b-8c9d-0e1f2a3b4c5d";
const PV_B: &str = "pvc-6a5b4c3d-2e1f-4a0b-9c8d-7e6f5a4b3c2d";

/// One request as the relay saw it.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    path: String,
    /// `-` without an `Authorization` header; `basic:<user>` for HTTP basic; else its scheme.
    auth: String,
}

/// A relay in front of a registry that reads each request's head on its way (HTTP/1.1, kept
/// alive or not) and records its method, path and credentials; requests whose path holds the
/// `held` text wait until it is cleared.
struct Recorder {
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    held: Arc<Mutex<Vec<String>>>,
}

impl Recorder {
    fn start(upstream: String) -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let r = Recorder { port, seen: Arc::default(), held: Arc::default() };
        let (seen, held) = (r.seen.clone(), r.held.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(&upstream) else { continue };
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (seen, held) = (seen.clone(), held.clone());
                std::thread::spawn(move || requests(c2, s2, seen, held));
                std::thread::spawn(move || common::model::pipe(server, client, None));
            }
        });
        r
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The credentials the requests whose path holds `part` carried, each once.
    fn auths(&self, part: &str) -> Vec<String> {
        let mut v: Vec<String> = self.seen().into_iter().filter(|s| s.path.contains(part)).map(|s| s.auth).collect();
        v.sort();
        v.dedup();
        v
    }

    /// Requests whose path holds one of `parts` wait (recorded as they arrive) until released.
    fn hold(&self, parts: &[&str]) {
        *self.held.lock().unwrap() = parts.iter().map(|p| p.to_string()).collect();
    }

    fn log(&self) -> String {
        self.seen().iter().map(|s| format!("{} {} {}\n", s.method, s.path, s.auth)).collect()
    }
}

/// Client to registry: each request head is read, recorded and passed on, then its body.
fn requests(mut from: TcpStream, mut to: TcpStream, seen: Arc<Mutex<Vec<Seen>>>, held: Arc<Mutex<Vec<String>>>) {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    'conn: loop {
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            match from.read(&mut chunk) {
                Ok(0) | Err(_) => break 'conn,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_string();
        let mut lines = head.lines();
        let mut first = lines.next().unwrap_or_default().split_whitespace();
        let (method, path) =
            (first.next().unwrap_or_default().to_string(), first.next().unwrap_or_default().to_string());
        let header = |name: &str| {
            head.lines()
                .skip(1)
                .find_map(|l| l.split_once(':').filter(|(k, _)| k.trim().eq_ignore_ascii_case(name)))
                .map(|(_, v)| v.trim().to_string())
        };
        let auth = match header("authorization") {
            None => "-".to_string(),
            Some(v) => match v.split_once(' ') {
                Some((scheme, b64)) if scheme.eq_ignore_ascii_case("basic") => {
                    let plain = String::from_utf8_lossy(&base64_decode(b64.trim())).to_string();
                    format!("basic:{}", plain.split(':').next().unwrap_or_default())
                }
                _ => v.split_whitespace().next().unwrap_or_default().to_ascii_lowercase(),
            },
        };
        let length: usize = header("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
        let chunked = header("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
        seen.lock().unwrap().push(Seen { method, path: path.clone(), auth });
        while held.lock().unwrap().iter().any(|h| path.contains(h.as_str())) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if to.write_all(&buf[..end]).is_err() {
            break;
        }
        buf.drain(..end);
        if chunked {
            // Not sent by a pull: pass the rest through unread.
            let _ = to.write_all(&buf);
            common::model::pipe(from, to, None);
            return;
        }
        let mut left = length;
        while left > 0 {
            if buf.is_empty() {
                match from.read(&mut chunk) {
                    Ok(0) | Err(_) => break 'conn,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let n = left.min(buf.len());
            if to.write_all(&buf[..n]).is_err() {
                break 'conn;
            }
            buf.drain(..n);
            left -= n;
        }
    }
    let _ = from.shutdown(std::net::Shutdown::Both);
    let _ = to.shutdown(std::net::Shutdown::Both);
}

fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let (mut out, mut acc, mut bits) = (Vec::new(), 0u32, 0);
    for v in s.bytes().filter_map(val) {
        acc = (acc << 6) | v as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

fn secrets(user: &str, password: &str) -> HashMap<String, String> {
    [("username", user), ("password", password)].into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Users and passwords of the private registry.
const STAGER: (&str, &str) = ("stager", "stager-pw-5b1e");
const ALICE: (&str, &str) = ("alice", "alice-pw-93c7");
const BOB: (&str, &str) = ("bob", "bob-pw-1f64");
const CAROL: (&str, &str) = ("carol", "carol-pw-7d20");

/// `htpasswd -Bbn` line of one user.
fn htpasswd_line(user: &str, password: &str) -> Vec<u8> {
    let out = std::process::Command::new("htpasswd").args(["-Bbn", user, password]).output().unwrap();
    assert!(out.status.success());
    out.stdout
}

/// A model pushed to `registry`, with its reference through `relay`.
fn through(registry: &Registry, relay: &Recorder, repo: &str, weights: &[u8]) -> (PushedModel, String) {
    let model = tiny_model(registry, repo, "v1", weights);
    let reference = model.reference.replace(&registry.host(), &relay.host());
    (model, reference)
}

/// Every file below `dir` (links not followed), with its content.
fn contents(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else { return out };
    for e in rd.flatten() {
        let p = e.path();
        let Ok(meta) = std::fs::symlink_metadata(&p) else { continue };
        if meta.is_dir() {
            out.extend(contents(&p));
        } else if meta.is_file() {
            out.push((p.clone(), std::fs::read(&p).unwrap_or_default()));
        }
    }
    out
}

fn holds(bytes: &[u8], needle: &str) -> bool {
    bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
}

fn create(dir: &Path, id: &str, reference: &str, lazy: bool) -> serde_json::Value {
    let mut parameters = json!({"reference": reference});
    if lazy {
        parameters["lazy"] = json!("true");
    }
    let (status, v) = call(dir, "POST", "/mounts", Some(json!({"id": id, "parameters": parameters})));
    assert!(matches!(status, 200..=202), "create {id}: {status} {v}");
    v
}

/// Wait until mount `id` leaves `pending` (and `pulling`); its view.
fn settled(dir: &Path, id: &str) -> serde_json::Value {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, v) = call(dir, "GET", &format!("/mounts/{id}"), None);
        if v["state"] == "ready" || v["state"] == "failed" {
            return v;
        }
        assert!(Instant::now() < until, "{id} did not settle: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The kept credentials of the node's dynamic volumes: `<state-dir>/secrets/*.dynamic.json`.
fn kept_files(state: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(state.join("secrets")) else { return Vec::new() };
    let mut v: Vec<PathBuf> =
        rd.flatten().map(|e| e.path()).filter(|p| p.to_string_lossy().ends_with(".dynamic.json")).collect();
    v.sort();
    v
}

#[test]
fn a_dynamic_volume_pulls_private_models_with_its_secrets_and_only_from_its_registry() {
    if !in_private_namespace("a_dynamic_volume_pulls_private_models_with_its_secrets_and_only_from_its_registry") {
        return;
    }
    // P: the StorageClass's registry, private (stager, alice, bob). Q: another private registry
    // (carol) that the node grants. O: an open registry the node grants.
    let private =
        |who: (&str, &str)| RegistryOptions { htpasswd: Some((who.0.into(), who.1.into())), ..Default::default() };
    let mut p = Registry::start(private(ALICE));
    let q = Registry::start(private(CAROL));
    let o = Registry::start(RegistryOptions::default());
    let (rp, rq, ro) = (Recorder::start(p.host()), Recorder::start(q.host()), Recorder::start(o.host()));
    let (_base, base) = through(&p, &rp, "models/base", b"base weights");
    let (private_model, private_ref) = through(&p, &rp, "models/private", b"private weights");
    let (lazy_model, lazy_ref) = through(&p, &rp, "models/lazy", &vec![5u8; 2 << 20]);
    let (pending_model, pending_ref) = through(&p, &rp, "models/pending", &vec![6u8; 1 << 20]);
    let (_rotated, rotated_ref) = through(&p, &rp, "models/rotated", b"rotated weights");
    let (_staged, staged_ref) = through(&p, &rp, "models/staged", b"staged weights");
    let (_restaged, restaged_ref) = through(&p, &rp, "models/restaged", b"restaged weights");
    let (_q_model, q_ref) = through(&q, &rq, "models/q", b"q weights");
    let (open_model, open_ref) = through(&o, &ro, "models/open", b"open weights");
    // Three users: written once the models are pushed (alice pushed them), read at the restart.
    let htpasswd = p.dir().join("htpasswd");
    for (user, password) in [STAGER, BOB] {
        let mut f = std::fs::OpenOptions::new().append(true).open(&htpasswd).unwrap();
        f.write_all(&htpasswd_line(user, password)).unwrap();
    }
    p.restart();

    let more: Vec<String> = [&rp, &rq, &ro]
        .iter()
        .flat_map(|r| [format!("--insecure-registry={}", r.host()), format!("--grant=model:host={}", r.host())])
        .collect();
    let more: Vec<&str> = more.iter().map(String::as_str).collect();
    let node = DynNode::start_with(&p, &more);
    let rt = tokio::runtime::Runtime::new().unwrap();
    guarded(&node.dirs, || {
        let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rt.block_on(body(
                &node,
                &rp,
                &rq,
                &ro,
                Models {
                    base,
                    private_ref,
                    private_model,
                    lazy_ref,
                    lazy_model,
                    pending_ref,
                    pending_model,
                    rotated_ref,
                    staged_ref,
                    restaged_ref,
                    q_ref,
                    open_ref,
                    open_model,
                },
            ))
        }));
        if let Err(e) = failed {
            eprintln!("--- P through its relay\n{}--- Q\n{}--- O\n{}", rp.log(), rq.log(), ro.log());
            std::panic::resume_unwind(e);
        }
    });
}

struct Models {
    base: String,
    private_ref: String,
    private_model: PushedModel,
    lazy_ref: String,
    lazy_model: PushedModel,
    pending_ref: String,
    pending_model: PushedModel,
    rotated_ref: String,
    staged_ref: String,
    restaged_ref: String,
    q_ref: String,
    open_ref: String,
    open_model: PushedModel,
}

async fn body(node: &DynNode, rp: &Recorder, rq: &Recorder, ro: &Recorder, m: Models) {
    let mut csi = node.node().await;
    let ctx = dynamic_ctx(&m.base);
    // The volume's own model is private too: its stage pulls with the stage secrets.
    let a = node
        .dynamic_volume_with(&mut csi, PV_A, POD_A, &ctx, secrets(STAGER.0, STAGER.1), secrets(ALICE.0, ALICE.1))
        .await;
    assert_eq!(rp.auths("models/base/manifests"), ["-", "basic:stager"], "{}", rp.log());

    // A private model from the StorageClass's registry: with the publish secrets.
    create(&a, "private", &m.private_ref, false);
    let v = settled(&a, "private");
    assert_eq!(v["state"], "ready", "{v}");
    assert_eq!(regular_files(&snapshot(&a.join("mounts/private"))), files_of(&m.private_model));
    let seen = rp.auths("models/private/");
    assert!(seen.contains(&"basic:alice".to_string()), "{}", rp.log());
    assert!(seen.iter().all(|a| a == "-" || a == "basic:alice"), "only alice's credentials went to P: {seen:?}");
    println!("checked: a private model from the StorageClass's registry is ready; P saw {seen:?}");

    // Another registry the node grants but the StorageClass does not name: no credentials,
    // even when it asks for them (401 with a Basic challenge): the POST is refused.
    let (status, v) = call(&a, "POST", "/mounts", Some(json!({"id": "from-q", "parameters": {"reference": m.q_ref}})));
    assert_eq!((status, v["code"].as_str()), (401, Some("unauthenticated")), "{v}");
    assert!(!rq.seen().is_empty(), "Q was asked");
    assert_eq!(rq.auths(""), ["-"], "Q saw no Authorization header at all: {}", rq.log());
    println!(
        "checked: a mount from Q (not named) sent no credentials ({} requests, none with Authorization): {status} {}",
        rq.seen().len(),
        v["message"]
    );
    // An open registry the node grants: pulled anonymously, ready.
    create(&a, "open", &m.open_ref, false);
    let v = settled(&a, "open");
    assert_eq!(v["state"], "ready", "{v}");
    assert_eq!(regular_files(&snapshot(&a.join("mounts/open"))), files_of(&m.open_model));
    assert_eq!(ro.auths(""), ["-"], "O saw no Authorization header at all: {}", ro.log());
    println!("checked: a mount from O (not named) is ready, pulled anonymously ({} requests)", ro.seen().len());

    // A lazy private mount, its weights held at the relay: ready once its tables are known.
    let weights = m.lazy_model.layer("model.safetensors").digest.clone();
    rp.hold(&[&weights]);
    create(&a, "lazy", &m.lazy_ref, true);
    let v = settled(&a, "lazy");
    assert_eq!(v["state"], "ready", "{v}");
    // A mount whose weights are held too: recorded, still pulling when the daemon dies.
    let pending_weights = m.pending_model.layer("model.safetensors").digest.clone();
    rp.hold(&[&weights, &pending_weights]);
    let v = create(&a, "pending", &m.pending_ref, false);
    assert_ne!(v["state"], "ready", "{v}");
    let before_restart = rp.seen().len();
    node.restart_host_with(|| rp.hold(&[]));
    assert!(answers_within(&a, Duration::from_secs(30)), "the socket answers again");
    // Planned again once the restarted daemon is ready: with the kept publish secrets.
    let v = settled(&a, "pending");
    assert_eq!(v["state"], "ready", "{v}");
    let after: Vec<Seen> = rp.seen()[before_restart..].to_vec();
    let pending_auth: Vec<&str> =
        after.iter().filter(|s| s.path.contains("models/pending/") && s.auth != "-").map(|s| s.auth.as_str()).collect();
    assert!(!pending_auth.is_empty() && pending_auth.iter().all(|a| *a == "basic:alice"), "{}", rp.log());
    assert!(after.iter().any(|s| s.path.contains(&pending_weights) && s.auth == "basic:alice"), "{}", rp.log());
    // The lazy mount's weights read after the restart: fetched with the kept secrets.
    let read = std::fs::read(a.join("mounts/lazy/model.safetensors")).unwrap();
    assert_eq!(read, vec![5u8; 2 << 20]);
    // (A new client's first request goes without credentials; the registry's Basic challenge
    // gets them.)
    let lazy_after: Vec<Seen> =
        rp.seen()[before_restart..].iter().filter(|s| s.path.contains(&weights) && s.auth != "-").cloned().collect();
    assert!(!lazy_after.is_empty(), "the lazy weights were fetched after the restart: {}", rp.log());
    assert!(lazy_after.iter().all(|s| s.auth == "basic:alice"), "{}", rp.log());
    println!(
        "checked: after kill -9 and a restart, a pending mount and a lazy mount pulled with the kept publish secrets ({} and {} requests as alice)",
        pending_auth.len(),
        lazy_after.len()
    );

    // The pod sees no credential: not in the API's answers, not in any file below its volume.
    let (_, list) = call(&a, "GET", "/mounts", None);
    let text = list.to_string();
    for (what, password) in [("alice", ALICE.1), ("stager", STAGER.1)] {
        assert!(!text.contains(password), "GET /mounts shows {what}'s password");
        for (path, bytes) in contents(&a) {
            assert!(!holds(&bytes, password), "{} holds {what}'s password", path.display());
        }
        let logs = node.dirs.logs();
        assert!(!logs.contains(password), "a daemon's log holds {what}'s password");
        let argv = std::fs::read(format!("/proc/{}/cmdline", node.host_pid())).unwrap();
        assert!(!holds(&argv, password));
    }
    // Kept for restarts: 0600, in a 0700 directory of the state dir.
    let kept = kept_files(&node.dirs.state);
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(std::fs::metadata(&kept[0]).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(node.dirs.state.join("secrets")).unwrap().permissions().mode() & 0o777, 0o700);
    println!(
        "checked: no password in GET /mounts, below the volume, in the logs or argv; kept 0600 in a 0700 directory"
    );

    // Rotation: kubelet publishes again with the Secret's new content (requiresRepublish, or
    // a new pod): the publish succeeds and the next mount carries the new credentials.
    let mut again = common::publish_req(PV_A, &node.dirs.staging(PV_A), &a, true, &ctx);
    again.secrets = secrets(BOB.0, BOB.1);
    csi.node_publish_volume(again).await.unwrap();
    create(&a, "rotated", &m.rotated_ref, false);
    let v = settled(&a, "rotated");
    assert_eq!(v["state"], "ready", "{v}");
    let seen = rp.auths("models/rotated/");
    assert!(seen.contains(&"basic:bob".to_string()) && !seen.contains(&"basic:alice".to_string()), "{seen:?}");
    let file = std::fs::read(&kept[0]).unwrap();
    assert!(holds(&file, BOB.1) && !holds(&file, ALICE.1), "the kept secrets are the new ones only");
    println!("checked: a republish with rotated secrets succeeds; the next mount carried {seen:?}");

    // A second volume with stage secrets only: its mounts carry those.
    let b = node.dynamic_volume_with(&mut csi, PV_B, POD_B, &ctx, secrets(STAGER.0, STAGER.1), HashMap::new()).await;
    create(&b, "staged", &m.staged_ref, false);
    let v = settled(&b, "staged");
    assert_eq!(v["state"], "ready", "{v}");
    let seen = rp.auths("models/staged/");
    assert!(
        seen.contains(&"basic:stager".to_string()) && seen.iter().all(|a| a == "-" || a == "basic:stager"),
        "{seen:?}"
    );
    println!("checked: a volume with stage secrets only pulls its mounts with them: {seen:?}");
    // NodeStageVolume again, with the stage Secret rotated: the next mount carries the new ones.
    let mut restage = common::stage_req(PV_B, &node.dirs.staging(PV_B), &ctx);
    restage.secrets = secrets(BOB.0, BOB.1);
    csi.node_stage_volume(restage).await.unwrap();
    create(&b, "restaged", &m.restaged_ref, false);
    let v = settled(&b, "restaged");
    assert_eq!(v["state"], "ready", "{v}");
    let seen = rp.auths("models/restaged/");
    assert!(seen.contains(&"basic:bob".to_string()) && !seen.contains(&"basic:stager".to_string()), "{seen:?}");
    println!("checked: a NodeStageVolume with rotated stage secrets: the next mount carried {seen:?}");

    // Unpublish forgets the publish secrets, unstage the rest.
    let unpublish = |pv: &str, target: &Path| mounthost::proto::csi::NodeUnpublishVolumeRequest {
        volume_id: pv.into(),
        target_path: target.display().to_string(),
    };
    csi.node_unpublish_volume(unpublish(PV_A, &a)).await.unwrap();
    let file_a = node.dirs.state.join("secrets").join(format!("{}.dynamic.json", volume_key(PV_A)));
    let bytes = std::fs::read(&file_a).unwrap();
    assert!(!holds(&bytes, BOB.1) && !holds(&bytes, ALICE.1), "the publish secrets are forgotten");
    assert!(holds(&bytes, STAGER.1), "the stage secrets stay while the volume is staged");
    csi.node_unpublish_volume(unpublish(PV_B, &b)).await.unwrap();
    for pv in [PV_A, PV_B] {
        let req = mounthost::proto::csi::NodeUnstageVolumeRequest {
            volume_id: pv.into(),
            staging_target_path: node.dirs.staging(pv).display().to_string(),
        };
        csi.node_unstage_volume(req).await.unwrap();
    }
    assert_eq!(kept_files(&node.dirs.state), Vec::<PathBuf>::new(), "nothing kept after unstage");
    println!("checked: unpublish forgets the publish secrets, unstage the stage secrets");
}
