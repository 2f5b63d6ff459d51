//! The metrics listener (`--metrics-address`): `GET /metrics` (OpenMetrics text), `/healthz`
//! (the process answers) and `/readyz` (every role of the process is ready: the host daemon has
//! reconciled, the front listens on its socket; or the host daemon stands by for the daemon that
//! holds its state directory). HTTP/1.1 on TCP, no privilege needed.

use std::convert::Infallible;
use std::net::SocketAddr;

use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::metrics::{self, Metrics};

/// Connections served at once.
const CONNECTIONS: usize = 16;

/// Bind `addr` now (so a taken port fails the start) and serve in the background until the
/// process exits. Returns the bound address (port 0 picks one).
pub async fn serve(addr: SocketAddr, metrics: &'static Metrics) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("metrics listener on {addr}: {e}")))?;
    let bound = listener.local_addr()?;
    tracing::info!(address = %bound, "metrics, /healthz and /readyz");
    // Scrapers and probes need a few connections; more are closed at once.
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(CONNECTIONS));
    tokio::spawn(async move {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics listener: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                drop(stream);
                continue;
            };
            tokio::spawn(async move {
                let _slot = slot;
                let service = service_fn(move |req| async move { Ok::<_, Infallible>(answer(&req, metrics).await) });
                let _ = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(std::time::Duration::from_secs(10))
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(bound)
}

async fn answer(req: &Request<Incoming>, metrics: &Metrics) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, content_type: &str, body: String| {
        Response::builder()
            .status(status)
            .header(header::CONTENT_TYPE, content_type)
            .body(Full::new(Bytes::from(body)))
            .expect("a static response is valid")
    };
    let text = "text/plain; charset=utf-8";
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, text, "only GET\n".into());
    }
    match req.uri().path() {
        "/metrics" => reply(StatusCode::OK, metrics::CONTENT_TYPE, metrics.scrape().await),
        "/healthz" => reply(StatusCode::OK, text, "ok\n".into()),
        "/readyz" => match (metrics.not_ready().as_slice(), metrics.standby()) {
            ([], _) => reply(StatusCode::OK, text, "ready\n".into()),
            (["host"], Some(why)) => reply(StatusCode::OK, text, format!("standby: {why}\n")),
            (waiting, _) => {
                reply(StatusCode::SERVICE_UNAVAILABLE, text, format!("not ready: {}\n", waiting.join(", ")))
            }
        },
        _ => reply(StatusCode::NOT_FOUND, text, "not found: try /metrics, /healthz or /readyz\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    fn get(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(s, "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let status = out.split_whitespace().nth(1).unwrap().parse().unwrap();
        (status, out.split_once("\r\n\r\n").unwrap().1.to_string())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn probes_follow_the_roles_and_metrics_are_openmetrics() {
        let metrics: &'static Metrics = Box::leak(Box::new(Metrics::new()));
        metrics.expect_role("host");
        let addr = serve("127.0.0.1:0".parse().unwrap(), metrics).await.unwrap();
        let call = move |method: &'static str, path: &'static str| {
            tokio::task::spawn_blocking(move || get(addr, method, path))
        };
        assert_eq!(call("GET", "/healthz").await.unwrap(), (200, "ok\n".into()));
        assert_eq!(call("GET", "/readyz").await.unwrap(), (503, "not ready: host\n".into()));
        metrics.set_standby(Some("pid 7 holds /s/host.lock".into()));
        assert_eq!(call("GET", "/readyz").await.unwrap(), (200, "standby: pid 7 holds /s/host.lock\n".into()));
        metrics.set_standby(None);
        assert_eq!(call("GET", "/readyz").await.unwrap(), (503, "not ready: host\n".into()));
        metrics.set_ready("host");
        assert_eq!(call("GET", "/readyz").await.unwrap(), (200, "ready\n".into()));
        metrics.csi_request("Probe", tonic::Code::Ok, std::time::Duration::from_millis(1));
        let (status, body) = call("GET", "/metrics").await.unwrap();
        assert_eq!(status, 200);
        assert!(body.contains("mounthost_csi_requests_total{rpc=\"Probe\",code=\"OK\"} 1"), "{body}");
        assert!(body.ends_with("# EOF\n"), "{body}");
        assert_eq!(call("POST", "/metrics").await.unwrap().0, 405);
        assert_eq!(call("GET", "/other").await.unwrap().0, 404);
        // A taken address fails the start with a message naming it.
        let err = serve(addr, metrics).await.unwrap_err();
        assert!(err.to_string().contains(&format!("metrics listener on {addr}")), "{err}");
    }
}
