//! An HTTP/1.1 server on a unix socket, bounded for clients that are not trusted (a pod on its
//! dynamic volume's socket, `daemon::dynamic`): connections per server and per process, head
//! and body sizes and times, a connection's lifetime. Each request reaches the handler with the
//! peer's credentials (SO_PEERCRED). The connections end with the server (its task aborted).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::UnixListener;
use tokio::sync::Semaphore;
use tokio::sync::mpsc::UnboundedReceiver;
use tracing::warn;

/// A listening unix socket.
pub type Listener = UnixListener;

/// Who is on the other end of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

/// Log lines a server writes about its clients, at most so many a second: a client that floods
/// a socket (a pod polling in a tight loop, or opening connection after connection) must not
/// flood the node's log. The lines left out are counted and the next line written says how many.
#[derive(Debug)]
pub struct LogBudget {
    per_second: u32,
    /// Start of the current second, lines written in it, lines left out since the last written.
    state: std::sync::Mutex<(std::time::Instant, u32, u64)>,
}

impl LogBudget {
    pub fn new(per_second: u32) -> Self {
        LogBudget { per_second, state: std::sync::Mutex::new((std::time::Instant::now(), 0, 0)) }
    }

    /// May a line be written now? `Some(n)`: yes, and `n` lines were left out since the last
    /// one written; `None`: leave this one out (it is counted).
    pub fn take(&self) -> Option<u64> {
        self.take_at(std::time::Instant::now())
    }

    fn take_at(&self, now: std::time::Instant) -> Option<u64> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (start, written, left_out) = &mut *st;
        if now.saturating_duration_since(*start) >= Duration::from_secs(1) {
            (*start, *written) = (now, 0);
        }
        if *written < self.per_second {
            *written += 1;
            Some(std::mem::take(left_out))
        } else {
            *left_out += 1;
            None
        }
    }
}

/// The bounds of one server.
#[derive(Debug, Clone)]
pub struct Bounds {
    /// Connections at once on this server.
    pub connections: usize,
    /// Connections at once on every server sharing this semaphore.
    pub shared: Arc<Semaphore>,
    /// Headers in one request.
    pub headers: usize,
    /// Bytes of a request head.
    pub head_bytes: usize,
    /// Time to read a request head.
    pub head_timeout: Duration,
    /// Longest a connection stays open.
    pub lifetime: Duration,
    /// The server's lines about its clients (connections refused here, requests in the handler).
    pub log: Arc<LogBudget>,
}

/// A `std` listener (non-blocking) as one this server takes.
pub fn from_std(l: std::os::unix::net::UnixListener) -> std::io::Result<Listener> {
    UnixListener::from_std(l)
}

/// Serve `listener` with `handler` until aborted, taking a fresh listener from `relisten`
/// (the socket was bound again). `name` goes into log lines.
pub async fn serve<H, F>(
    name: String,
    mut listener: Listener,
    mut relisten: UnboundedReceiver<Listener>,
    bounds: Bounds,
    handler: H,
) where
    H: Fn(Option<Peer>, Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(bounds.connections));
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let (Ok(slot), Ok(shared)) =
                        (slots.clone().try_acquire_owned(), bounds.shared.clone().try_acquire_owned())
                    else {
                        if let Some(skipped) = bounds.log.take() {
                            warn!(server = %name, skipped, "too many connections; closing one");
                        }
                        continue;
                    };
                    let peer = stream.peer_cred().ok().map(|c| Peer { pid: c.pid().unwrap_or(0), uid: c.uid(), gid: c.gid() });
                    let (handler, bounds) = (handler.clone(), bounds.clone());
                    connections.spawn(async move {
                        let service = hyper::service::service_fn(move |req| {
                            let handler = handler.clone();
                            async move { Ok::<_, Infallible>(handler(peer, req).await) }
                        });
                        let mut http = hyper::server::conn::http1::Builder::new();
                        http.timer(TokioTimer::new())
                            .half_close(true)
                            .header_read_timeout(bounds.head_timeout)
                            .max_buf_size(bounds.head_bytes)
                            .max_headers(bounds.headers);
                        let conn = http.serve_connection(TokioIo::new(stream), service);
                        let _ = tokio::time::timeout(bounds.lifetime, conn).await;
                        drop((slot, shared));
                    });
                }
                Err(e) => {
                    warn!(server = %name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(fresh) = relisten.recv() => listener = fresh,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::UnixStream;

    /// Serve `socket` with bounds of `per_server` connections, `shared` across servers and a
    /// `lifetime`; every request is answered "ok".
    fn start(
        socket: &std::path::Path,
        per_server: usize,
        shared: Arc<Semaphore>,
        lifetime: Duration,
    ) -> tokio::task::JoinHandle<()> {
        let listener = UnixListener::bind(socket).unwrap();
        let (_keep, relisten) = tokio::sync::mpsc::unbounded_channel();
        let bounds = Bounds {
            connections: per_server,
            shared,
            headers: 16,
            head_bytes: 16 << 10,
            head_timeout: Duration::from_secs(5),
            lifetime,
            log: Arc::new(LogBudget::new(100)),
        };
        tokio::spawn(async move {
            let _keep = _keep;
            serve("test".into(), listener, relisten, bounds, |_, _| async {
                Response::new(Full::new(Bytes::from("ok")))
            })
            .await
        })
    }

    /// Does a request on `conn` get an answer (false: the server closed it)?
    async fn answered(conn: &mut UnixStream) -> bool {
        let asked = conn.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.is_ok();
        let mut buf = [0u8; 256];
        asked && matches!(conn.read(&mut buf).await, Ok(n) if n > 0 && buf[..n].starts_with(b"HTTP/1.1 200"))
    }

    #[tokio::test]
    async fn connections_are_capped_per_server_and_across_servers_and_end_at_their_lifetime() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.sock"), dir.path().join("b.sock"));
        let shared = Arc::new(Semaphore::new(3));
        let servers = [
            start(&a, 2, shared.clone(), Duration::from_secs(60)),
            start(&b, 2, shared.clone(), Duration::from_millis(300)),
        ];
        // Two on a: both served; a third is closed at accept (the server's own cap).
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut c = UnixStream::connect(&a).await.unwrap();
            assert!(answered(&mut c).await);
            held.push(c);
        }
        let mut third = UnixStream::connect(&a).await.unwrap();
        assert!(!answered(&mut third).await, "a third connection on one server is closed");
        // One on b fits the shared cap of 3; a second on b does not (b's own cap is 2).
        let mut on_b = UnixStream::connect(&b).await.unwrap();
        assert!(answered(&mut on_b).await);
        let mut over = UnixStream::connect(&b).await.unwrap();
        assert!(!answered(&mut over).await, "the fourth connection across both servers is closed");
        // b's lifetime ends its idle connection (the server closes it: EOF), and its slot comes
        // back (released just after the close, so a few tries).
        let mut buf = [0u8; 16];
        let closed = tokio::time::timeout(Duration::from_secs(10), on_b.read(&mut buf)).await;
        assert!(matches!(closed, Ok(Ok(0))), "a connection past its lifetime is closed: {closed:?}");
        let mut back = false;
        for _ in 0..100 {
            let mut again = UnixStream::connect(&b).await.unwrap();
            if answered(&mut again).await {
                back = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(back, "the slot came back");
        for s in servers {
            s.abort();
        }
    }

    #[test]
    fn a_log_budget_writes_so_many_lines_a_second_and_counts_the_rest() {
        let budget = LogBudget::new(3);
        let t0 = std::time::Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let first: Vec<_> = (0..5).map(|i| budget.take_at(at(i))).collect();
        assert_eq!(first, vec![Some(0), Some(0), Some(0), None, None]);
        // The next second: the first line says how many were left out, the count starts over.
        assert_eq!(budget.take_at(at(1000)), Some(2));
        assert_eq!(budget.take_at(at(1001)), Some(0));
        assert_eq!(budget.take_at(at(1002)), Some(0));
        assert_eq!(budget.take_at(at(1500)), None);
        assert_eq!(budget.take_at(at(2600)), Some(1));
    }
}
