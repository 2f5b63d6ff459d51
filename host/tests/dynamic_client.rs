//! `mounthost dynamic`, run as a user runs it (the real binary, stdout a pipe, so JSON) against
//! a small in-memory server of the dynamic-volume API on a unix socket: answers, exit codes,
//! what is refused before any request is sent, and what a missing or dead socket says.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use mounthost::daemon::dynamic::api::{ApiError, CreateMount, MOUNTS_PATH, MountList, MountState, MountView};
use serde_json::Value;

/// One mount the fake server holds, and how many times it was asked for since created.
struct Held {
    view: MountView,
    gets: u32,
}

/// The fake server's memory. A created mount is `pending`; the first GET shows it `pulling`,
/// the next ones `ready` (or `failed` when its parameters hold `fail=REASON`; it stays `pending`
/// with `stuck=...`).
#[derive(Default)]
struct Server {
    mounts: Mutex<BTreeMap<String, Held>>,
    requests: AtomicUsize,
}

fn view(id: &str, parameters: BTreeMap<String, String>, state: MountState) -> MountView {
    MountView {
        id: id.into(),
        plugin: "model".into(),
        parameters,
        state,
        path: format!("mounts/{id}"),
        bytes_done: None,
        bytes_total: None,
        reason: None,
        lazy: None,
    }
}

fn answer(status: StatusCode, body: &impl serde::Serialize) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(body).unwrap())))
        .unwrap()
}

fn error(status: StatusCode, code: &str, message: &str) -> Response<Full<Bytes>> {
    answer(status, &ApiError { code: code.into(), message: message.into() })
}

impl Server {
    async fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        let (parts, body) = req.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        let path = parts.uri.path().to_string();
        let mut mounts = self.mounts.lock().unwrap();
        if path == MOUNTS_PATH {
            return match parts.method {
                Method::GET => {
                    answer(StatusCode::OK, &MountList { mounts: mounts.values().map(|h| h.view.clone()).collect() })
                }
                Method::POST => {
                    let Ok(req) = serde_json::from_slice::<CreateMount>(&body) else {
                        return error(StatusCode::BAD_REQUEST, "bad_json", "the body is not a CreateMount");
                    };
                    if let Some(held) = mounts.get(&req.id) {
                        return if held.view.parameters == req.parameters {
                            answer(StatusCode::OK, &held.view)
                        } else {
                            error(StatusCode::CONFLICT, "conflict", "a mount of that id with other parameters exists")
                        };
                    }
                    let v = view(&req.id, req.parameters, MountState::Pending);
                    mounts.insert(req.id, Held { view: v.clone(), gets: 0 });
                    answer(StatusCode::ACCEPTED, &v)
                }
                _ => error(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "GET or POST"),
            };
        }
        let Some(id) = path.strip_prefix("/mounts/") else {
            return error(StatusCode::NOT_FOUND, "not_found", "no such path");
        };
        let Some(held) = mounts.get_mut(id) else {
            return error(StatusCode::NOT_FOUND, "not_found", &format!("no mount {id:?} in this volume"));
        };
        match parts.method {
            Method::GET => {
                held.gets += 1;
                let params = &held.view.parameters;
                if held.view.state == MountState::Pending && !params.contains_key("stuck") {
                    held.view.state = MountState::Pulling;
                    (held.view.bytes_done, held.view.bytes_total) = (Some(512), Some(1024));
                } else if held.view.state == MountState::Pulling {
                    (held.view.bytes_done, held.view.bytes_total) = (None, None);
                    if let Some(reason) = params.get("fail") {
                        held.view.state = MountState::Failed;
                        held.view.reason = Some(reason.clone());
                    } else {
                        held.view.state = MountState::Ready;
                    }
                }
                answer(StatusCode::OK, &held.view)
            }
            Method::DELETE => {
                let mut v = mounts.remove(id).unwrap().view;
                v.state = MountState::Deleted;
                answer(StatusCode::OK, &v)
            }
            _ => error(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "GET or DELETE"),
        }
    }
}

/// A fake server on `<tempdir>/csi.sock`, holding one ready mount `base`; it runs until the
/// test ends.
struct Fixture {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    server: Arc<Server>,
}

fn serve() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let server = Arc::new(Server::default());
    let base = view("base", BTreeMap::from([("reference".into(), "r/base:v1".into())]), MountState::Ready);
    server.mounts.lock().unwrap().insert("base".into(), Held { view: base, gets: 0 });
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let listener = rt.block_on(async { tokio::net::UnixListener::bind(&socket) }).unwrap();
    let s = server.clone();
    std::thread::spawn(move || {
        rt.block_on(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let s = s.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let s = s.clone();
                        async move { Ok::<_, Infallible>(s.handle(req).await) }
                    });
                    let _ =
                        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
                });
            }
        })
    });
    Fixture { _dir: dir, socket, server }
}

fn dynamic(socket: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mounthost"))
        .args(["--log", "warn", "dynamic", "--socket"])
        .arg(socket)
        .args(args)
        .output()
        .expect("running mounthost")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The one JSON document on stdout of a command that succeeded.
fn json(out: &Output) -> Value {
    assert!(out.status.success(), "exit {:?}, stderr: {}", out.status.code(), stderr(out));
    one_line(out)
}

/// stdout as one compact JSON document on one line.
fn one_line(out: &Output) -> Value {
    let text = String::from_utf8(out.stdout.clone()).unwrap();
    assert_eq!(text.lines().count(), 1, "one JSON document per line: {text:?}");
    serde_json::from_str(&text).expect("stdout is JSON")
}

/// A command that failed: exit 2, nothing on stdout unless said, and `code` on stderr.
fn failed(out: &Output, code: &str) -> String {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "stdout: {}, stderr: {err}", String::from_utf8_lossy(&out.stdout));
    assert!(err.contains(&format!("error ({code}): ")), "{err}");
    err
}

#[test]
fn create_list_get_wait_delete() {
    let f = serve();
    let created = json(&dynamic(&f.socket, &["create", "llama", "-p", "reference=r/llama:v1", "--param", "k=v"]));
    assert_eq!(created["id"], "llama");
    assert_eq!(created["state"], "pending");
    assert_eq!(created["parameters"], serde_json::json!({"reference": "r/llama:v1", "k": "v"}));

    // The same request again is answered with the mount as it is.
    assert_eq!(
        json(&dynamic(&f.socket, &["create", "llama", "-p", "reference=r/llama:v1", "-p", "k=v"]))["id"],
        "llama"
    );

    let list = json(&dynamic(&f.socket, &["list"]));
    let ids: Vec<&str> = list["mounts"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["base", "llama"]);

    let got = json(&dynamic(&f.socket, &["get", "llama"]));
    assert_eq!(
        (got["state"].as_str(), got["bytesDone"].as_u64(), got["bytesTotal"].as_u64()),
        (Some("pulling"), Some(512), Some(1024))
    );

    let ready = json(&dynamic(&f.socket, &["wait", "llama", "--timeout", "5"]));
    assert_eq!(ready["state"], "ready");
    assert_eq!(ready["path"], "mounts/llama");

    let deleted = json(&dynamic(&f.socket, &["delete", "llama"]));
    assert_eq!(deleted["state"], "deleted");
    let err = failed(&dynamic(&f.socket, &["get", "llama"]), "not_found");
    assert!(err.contains("no mount \"llama\""), "the server's message is shown: {err}");
}

#[test]
fn create_wait_ends_ready_or_failed_with_the_reason() {
    let f = serve();
    let out = dynamic(&f.socket, &["create", "qwen", "-p", "reference=r/qwen:v1", "--wait", "--timeout", "5"]);
    let ready = json(&out);
    assert_eq!(ready["state"], "ready");
    assert!(stderr(&out).contains("qwen: pulled 512 B of 1.0 KiB (50%)"), "progress on stderr: {}", stderr(&out));

    let out = dynamic(&f.socket, &["create", "broken", "-p", "fail=manifest unknown", "--wait"]);
    let err = failed(&out, "mount_failed");
    assert!(err.contains("manifest unknown"), "{err}");
    let last = one_line(&out);
    assert_eq!((last["state"].as_str(), last["reason"].as_str()), (Some("failed"), Some("manifest unknown")));

    let out = dynamic(&f.socket, &["create", "stuck", "-p", "stuck=1", "--wait", "--timeout", "0"]);
    let err = failed(&out, "timeout");
    assert!(err.contains("still pending"), "{err}");
    assert_eq!(one_line(&out)["state"], "pending");
}

#[test]
fn error_answers_exit_non_zero_with_their_code() {
    let f = serve();
    let out = dynamic(&f.socket, &["create", "base", "-p", "reference=r/other:v2"]);
    let err = failed(&out, "conflict");
    assert!(out.stdout.is_empty());
    assert!(err.contains("other parameters"), "{err}");
    failed(&dynamic(&f.socket, &["delete", "nope"]), "not_found");
    failed(&dynamic(&f.socket, &["wait", "nope", "--timeout", "1"]), "not_found");
}

#[test]
fn bad_ids_and_parameters_never_reach_the_server() {
    let f = serve();
    for args in [
        &["get", "../etc"][..],
        &["get", "a/b"],
        &["delete", "Upper"],
        &["wait", "--", "-lead"],
        &["create", "a.b", "-p", "reference=r/m:v1"],
        &["create", &"x".repeat(64)],
    ] {
        let err = failed(&dynamic(&f.socket, args), "bad_id");
        assert!(err.contains("lowercase letters, digits and dashes"), "{args:?}: {err}");
    }
    failed(&dynamic(&f.socket, &["create", "ok", "-p", "bad key=v"]), "invalid_parameters");
    failed(&dynamic(&f.socket, &["create", "ok", "-p", "k=1", "-p", "k=2"]), "invalid_parameters");
    assert_eq!(f.server.requests.load(Ordering::SeqCst), 0, "a refused call sent a request");
}

#[test]
fn a_missing_or_dead_socket_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("csi.sock");
    let err = failed(&dynamic(&missing, &["list"]), "no_socket");
    assert!(err.contains(&missing.display().to_string()) && err.contains("missing"), "{err}");

    // A socket file nobody listens on any more.
    let dead = dir.path().join("dead.sock");
    drop(std::os::unix::net::UnixListener::bind(&dead).unwrap());
    let err = failed(&dynamic(&dead, &["get", "x"]), "refused");
    assert!(err.contains(&dead.display().to_string()) && err.contains("refused"), "{err}");

    let err = failed(&dynamic(dir.path(), &["list"]), "unreachable");
    assert!(err.contains("is not a socket"), "{err}");
}
