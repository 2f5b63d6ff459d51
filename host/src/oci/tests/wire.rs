//! The pull client's replies against a registry of the test's own that answers on a raw socket:
//! a bearer token fetched from the registry's own realm and used, and every reply a registry
//! can make endless or huge (token, error body, referrers list) read no further than its cap.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use super::super::registry::Registries;
use super::super::{Credentials, OciError, RegistryConfig, Source};

/// How the registry answers a request line (`GET /path?query`) with an `Authorization` header
/// or none: the bytes written back (the connection is closed after them; `None`: an endless
/// chunked body follows the head).
type Answer = dyn Fn(&str, Option<&str>) -> (String, Option<()>) + Send + Sync;

/// A registry answering with `answer`; its `host:port`, and the request lines it received.
fn serve(answer: Arc<Answer>) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let host = listener.local_addr().unwrap().to_string();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let (answer, log) = (answer.clone(), log.clone());
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    return;
                }
                let mut auth = None;
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                        break;
                    }
                    if let Some(v) = h.strip_prefix("authorization: ").or_else(|| h.strip_prefix("Authorization: ")) {
                        auth = Some(v.trim().to_string());
                    }
                }
                let target = line.split_whitespace().nth(1).unwrap_or("").to_string();
                log.lock().unwrap().push(target.clone());
                let (head, endless) = answer(&target, auth.as_deref());
                let mut conn = conn;
                if conn.write_all(head.as_bytes()).is_err() {
                    return;
                }
                if endless.is_some() {
                    let chunk = format!("{:x}\r\n{}\r\n", 64 << 10, " ".repeat(64 << 10));
                    while conn.write_all(chunk.as_bytes()).is_ok() {}
                }
            });
        }
    });
    (host, seen)
}

fn source(host: &str) -> Source {
    Source {
        registry: host.into(),
        repository: "org/model".into(),
        reference: "v1".into(),
        mirror: None,
        credentials: Credentials::Anonymous,
        insecure: true,
        platform: None,
    }
}

fn registries(host: &str) -> Registries {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Registries::new(RegistryConfig { insecure: [host.to_string()].into(), ..Default::default() }).unwrap()
}

const CHUNKED: &str = "Transfer-Encoding: chunked\r\nConnection: close\r\n";

#[tokio::test]
async fn a_token_from_the_registrys_own_realm_is_fetched_and_used() {
    let realm = Arc::new(Mutex::new(String::new()));
    let r = realm.clone();
    let (host, seen) = serve(Arc::new(move |target, auth| {
        let manifest = r#"{"schemaVersion":2,"config":{"digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2},"layers":[]}"#;
        let head = if target.starts_with("/token") {
            let body = r#"{"token":"tok-1","expires_in":300}"#;
            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
        } else if auth != Some("Bearer tok-1") {
            format!(
                "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer realm=\"{}\",service=\"s\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                r.lock().unwrap()
            )
        } else if target.contains("/manifests/") {
            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{manifest}", manifest.len())
        } else {
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}".to_string()
        };
        (head, None)
    }));
    *realm.lock().unwrap() = format!("http://{host}/token");
    let ep = registries(&host).endpoint(&source(&host)).unwrap();
    let resolved = ep.resolve().await.unwrap();
    assert_eq!(resolved.config, "{}");
    let seen = seen.lock().unwrap().clone();
    assert!(seen.iter().any(|t| t.starts_with("/token?scope=repository%3Aorg%2Fmodel%3Apull&service=s")), "{seen:?}");
    // Once: the token is kept for the repository.
    assert_eq!(seen.iter().filter(|t| t.starts_with("/token")).count(), 1, "{seen:?}");
}

#[tokio::test]
async fn no_reply_is_read_past_its_cap() {
    let (host, _) = serve(Arc::new(|target, _| {
        if target.contains("/manifests/") {
            // An error reply without end: its first 64 KiB are read, no more.
            (format!("HTTP/1.1 500 Internal Server Error\r\n{CHUNKED}\r\n"), Some(()))
        } else {
            // A referrers list without end.
            (format!("HTTP/1.1 200 OK\r\n{CHUNKED}\r\n"), Some(()))
        }
    }));
    // A token reply without end, from a realm on the registry itself (the only one allowed).
    let (host2, _) = {
        let realm = Arc::new(Mutex::new(String::new()));
        let r = realm.clone();
        let served = serve(Arc::new(move |target, _| {
            if target.starts_with("/token") {
                (format!("HTTP/1.1 200 OK\r\n{CHUNKED}\r\n"), Some(()))
            } else {
                let realm = r.lock().unwrap().clone();
                (
                    format!(
                        "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer realm=\"{realm}\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    ),
                    None,
                )
            }
        }));
        *realm.lock().unwrap() = format!("http://{}/token", served.0);
        served
    };
    let e = registries(&host2).endpoint(&source(&host2)).unwrap().resolve().await.unwrap_err();
    assert!(
        matches!(&e, OciError::TooLarge { what, cap, .. } if what == "the token reply" && *cap == 1 << 20),
        "{e:?}"
    );

    let regs = registries(&host);
    let e = regs.endpoint(&source(&host)).unwrap().resolve().await.unwrap_err();
    assert!(matches!(e, OciError::Registry { status: Some(500), transient: true, .. }), "{e:?}");
    let e = regs
        .endpoint(&source(&host))
        .unwrap()
        .referrers(&format!("sha256:{}", "a".repeat(64)), "x/y")
        .await
        .unwrap_err();
    assert!(
        matches!(&e, OciError::TooLarge { what, cap, .. } if what == "the referrers list" && *cap == 4 << 20),
        "{e:?}"
    );
}
