//! The HTTP server of one dynamic volume's socket ([`super::api`]). It holds the volume's id;
//! a request can name a mount of this volume and nothing else.
//!
//! Bounds: at most [`MAX_CONNECTIONS`] connections at once per volume and
//! [`MAX_NODE_CONNECTIONS`] on the node (more are closed at accept), request
//! heads of at most 16 KiB and [`MAX_HEADERS`] headers read within [`HEAD_TIMEOUT`], bodies of
//! at most [`api::MAX_BODY`] bytes read within [`BODY_TIMEOUT`], a connection open at most
//! [`CONNECTION_TIMEOUT`], and requests handled at most [`PACE_PER_SECOND`] a second after a
//! burst of [`PACE_BURST`] (one past it waits its turn; see [`Pacer`]). Every request is logged with the peer's pid, uid and gid (a
//! successful read at debug; the rest at info, at most [`LOG_LINES_PER_SECOND`] lines a second).

use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use tokio::sync::Semaphore;
use tokio::sync::mpsc::UnboundedReceiver;
use tracing::{debug, info};

use super::api::{self, ApiError, CreateMount, MountList};
use super::limits::{PACE_BURST, PACE_PER_SECOND, Pacer};
use super::{ApiErr, Node};
use crate::unpriv::unix_http::{self, Bounds, Listener, LogBudget, Peer};

/// Connections served at once per volume.
pub const MAX_CONNECTIONS: usize = 16;
/// Connections served at once on all the node's dynamic sockets.
pub const MAX_NODE_CONNECTIONS: usize = 1024;
/// Headers in one request.
pub const MAX_HEADERS: usize = 32;
/// Time to read a request's head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Time to read a request's body.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a connection stays open.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(300);
/// Lines a volume's server logs about its clients per second, at most (see [`LogBudget`]).
pub const LOG_LINES_PER_SECOND: u32 = 20;

/// Serve `listener` for `volume` until aborted, taking a fresh listener from `relisten` when
/// the sweeper bound the socket again. Its connections end with it.
pub async fn run(
    node: Node,
    volume: String,
    listener: Listener,
    relisten: UnboundedReceiver<Listener>,
    node_slots: Arc<Semaphore>,
) {
    let log = Arc::new(LogBudget::new(LOG_LINES_PER_SECOND));
    let bounds = Bounds {
        connections: MAX_CONNECTIONS,
        shared: node_slots,
        headers: MAX_HEADERS,
        head_bytes: 16 << 10,
        head_timeout: HEAD_TIMEOUT,
        lifetime: CONNECTION_TIMEOUT,
        log: log.clone(),
    };
    let name = format!("dynamic socket of volume {volume}");
    let pacer = Arc::new(std::sync::Mutex::new(Pacer::new(PACE_PER_SECOND, PACE_BURST)));
    let handler = move |peer: Option<Peer>, req: Request<Incoming>| {
        let (node, volume, log, pacer) = (node.clone(), volume.clone(), log.clone(), pacer.clone());
        async move {
            let at = pacer.lock().unwrap_or_else(|p| p.into_inner()).slot(std::time::Instant::now());
            tokio::time::sleep_until(at.into()).await;
            handle(&node, &volume, &log, peer, req).await
        }
    };
    unix_http::serve(name, listener, relisten, bounds, handler).await
}

type Answer = Response<Full<Bytes>>;

/// One request: routed, answered, logged with its peer. A request that changes something
/// (POST, DELETE) or fails is logged at info within the server's [`LogBudget`]; a read that
/// succeeds (a client polling `GET /mounts/{id}`) at debug.
async fn handle(node: &Node, volume: &str, log: &LogBudget, peer: Option<Peer>, req: Request<Incoming>) -> Answer {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let answer = route(node, volume, req).await;
    let Peer { pid, uid, gid } = peer.unwrap_or(Peer { pid: 0, uid: u32::MAX, gid: u32::MAX });
    let shown: String = path.chars().take(200).flat_map(char::escape_debug).collect();
    let status = answer.status().as_u16();
    if method == Method::GET && answer.status().is_success() {
        debug!(volume.id = %volume, peer.pid = pid, peer.uid = uid, peer.gid = gid, %method, path = %shown,
            status, "dynamic socket request");
    } else if let Some(skipped) = log.take() {
        info!(volume.id = %volume, peer.pid = pid, peer.uid = uid, peer.gid = gid, %method, path = %shown,
            status, skipped, "dynamic socket request");
    }
    answer
}

async fn route(node: &Node, volume: &str, req: Request<Incoming>) -> Answer {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let result = if path == api::MOUNTS_PATH {
        match method {
            Method::GET => node.dynamic_list(volume).map(|mounts| json(StatusCode::OK, &MountList { mounts })),
            Method::POST => create(node, volume, req).await,
            _ => Err(not_allowed("GET, POST")),
        }
    } else if let Some(id) = path.strip_prefix("/mounts/") {
        match method {
            Method::GET => node.dynamic_get(volume, id).map(|v| json(StatusCode::OK, &v)),
            Method::DELETE => node.dynamic_delete(volume, id).await.map(|v| json(StatusCode::OK, &v)),
            _ => Err(not_allowed("GET, DELETE")),
        }
    } else if path == api::USAGE_PATH {
        match method {
            Method::GET => node.dynamic_usage(volume).map(|u| json(StatusCode::OK, &u)),
            _ => Err(not_allowed("GET")),
        }
    } else {
        Err(ApiErr::new(
            404,
            "not_found",
            format!("no such path; the API is {}, {}/<id> and {}", api::MOUNTS_PATH, api::MOUNTS_PATH, api::USAGE_PATH),
        ))
    };
    result.unwrap_or_else(error)
}

async fn create(node: &Node, volume: &str, req: Request<Incoming>) -> Result<Answer, ApiErr> {
    if let Some(ct) = req.headers().get(header::CONTENT_TYPE)
        && !ct
            .to_str()
            .is_ok_and(|v| v.split(';').next().is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json")))
    {
        return Err(ApiErr::new(415, "bad_request", "the body must be application/json"));
    }
    let body = Limited::new(req.into_body(), api::MAX_BODY);
    let bytes = match tokio::time::timeout(BODY_TIMEOUT, body.collect()).await {
        Err(_) => return Err(ApiErr::new(408, "bad_request", "the body did not arrive in time")),
        Ok(Err(e)) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            return Err(ApiErr::new(413, "too_large", format!("the body is larger than {} bytes", api::MAX_BODY)));
        }
        Ok(Err(e)) => return Err(ApiErr::new(400, "bad_request", format!("reading the body: {e}"))),
        Ok(Ok(c)) => c.to_bytes(),
    };
    let ask: CreateMount = serde_json::from_slice(&bytes)
        .map_err(|e| ApiErr::new(400, "bad_json", format!("the body is not a mount request: {e}")))?;
    let (status, view) = node.dynamic_create(volume, ask).await?;
    Ok(json(StatusCode::from_u16(status).unwrap_or(StatusCode::OK), &view))
}

fn not_allowed(allowed: &str) -> ApiErr {
    ApiErr::new(405, "method_not_allowed", format!("allowed methods: {allowed}"))
}

fn json(status: StatusCode, body: &impl serde::Serialize) -> Answer {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut r = Response::new(Full::new(Bytes::from(bytes)));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
    r
}

fn error(e: ApiErr) -> Answer {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut answer = json(status, &ApiError { code: e.code.to_string(), message: e.message });
    if let Some(secs) = e.retry_after {
        answer.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
    }
    answer
}
