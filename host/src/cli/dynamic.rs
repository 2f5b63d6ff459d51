//! `mounthost dynamic`: a client for the HTTP/JSON API a dynamic volume serves on its socket
//! (`<published dir>/csi.sock`, [`api`]): create, list, get, delete and wait for the mounts
//! inside that one volume. It needs no host daemon socket and no root, only access to the
//! volume's socket.
//!
//! On a pipe it prints the server's JSON answers, one compact document per line; on a terminal
//! a short summary per mount. While `wait` (or `create --wait`) sees a mount pulling, progress
//! goes to stderr as `mounthost cache pull` shows it: a live bar on a terminal, a line a second
//! on a pipe.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use hyperlocal::UnixConnector;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::plugin::parse_kv;
use crate::daemon::dynamic::api::{self, ApiError, CreateMount, MOUNTS_PATH, MountList, MountState, MountView};

/// Largest answer body read, bytes.
const MAX_ANSWER: usize = 8 << 20;
/// How often `wait` asks.
const POLL: Duration = Duration::from_millis(200);
/// Longest one request may take (a server that accepts and never answers).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Arguments of `mounthost dynamic`.
#[derive(Debug, Args)]
pub struct DynamicArgs {
    /// The dynamic volume's socket: `csi.sock` in the directory the volume is published at.
    #[arg(long)]
    pub socket: PathBuf,
    #[command(subcommand)]
    pub command: DynamicCommand,
}

/// Calls on a dynamic volume's socket.
#[derive(Debug, Subcommand)]
pub enum DynamicCommand {
    /// Ask for a mount (POST /mounts); it lands read-only at `mounts/ID/` in the volume.
    Create {
        /// The mount's name: 1 to 63 lowercase letters, digits and dashes.
        id: String,
        /// The plugin that plans it [default: the volume's own plugin].
        #[arg(long)]
        plugin: Option<String>,
        /// What to mount, KEY=VALUE (repeatable; for the model plugin: `reference`, ...).
        #[arg(short = 'p', long = "param", value_parser = parse_kv)]
        params: Vec<(String, String)>,
        /// Then wait until the mount is ready or failed, as `wait` does.
        #[arg(long)]
        wait: bool,
        /// With --wait: give up after this many seconds.
        #[arg(long, default_value_t = 600, requires = "wait")]
        timeout: u64,
    },
    /// List the volume's mounts (GET /mounts).
    List,
    /// Show what counts against the volume's byte cap now (GET /usage).
    Usage,
    /// Show one mount (GET /mounts/ID).
    Get {
        /// The mount's name.
        id: String,
    },
    /// Unmount and forget a mount (DELETE /mounts/ID).
    Delete {
        /// The mount's name.
        id: String,
    },
    /// Wait until a mount is ready (exit 0) or failed (exit 2 with its reason), asking every
    /// 200 ms.
    Wait {
        /// The mount's name.
        id: String,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
}

/// A failed command: a local check, the socket, an error answer, or a mount that failed.
#[derive(Debug, thiserror::Error)]
#[error("{code}: {message}")]
pub struct DynamicError {
    /// The server's [`ApiError::code`], or one of this client's: `no_socket`, `refused`,
    /// `unreachable`, `bad_answer`, `http_NNN`, `mount_failed`, `mount_deleted`, `timeout` (and the
    /// server's `bad_id`, `invalid_parameters` for what is refused before sending).
    pub code: String,
    pub message: String,
    /// What to print on stdout all the same: the last view of a mount that failed, was deleted
    /// or was not ready in time.
    pub output: Option<String>,
}

impl DynamicError {
    fn new(code: &str, message: impl Into<String>) -> Self {
        DynamicError { code: code.into(), message: message.into(), output: None }
    }
}

/// Run one subcommand against `args.socket`; returns what to print on stdout. Answers are
/// shown as JSON unless stdout is a terminal.
pub async fn run(args: DynamicArgs) -> Result<String, DynamicError> {
    let human = std::io::stdout().is_terminal();
    let api = Api::new(args.socket);
    match args.command {
        DynamicCommand::Create { id, plugin, params, wait, timeout } => {
            check_id(&id)?;
            let mut parameters = BTreeMap::new();
            for (k, v) in params {
                if parameters.insert(k.clone(), v).is_some() {
                    return Err(DynamicError::new("invalid_parameters", format!("parameter {k:?} is given twice")));
                }
            }
            api::check_parameters(&parameters).map_err(|m| DynamicError::new("invalid_parameters", m))?;
            let body = CreateMount { id: id.clone(), plugin, parameters };
            let answer = api.call(Method::POST, MOUNTS_PATH, Some(&body)).await?;
            if wait {
                let view: MountView = typed(&answer)?;
                let view = api.wait(&id, view, Duration::from_secs(timeout), human).await?;
                Ok(api.show_view(&view, human))
            } else {
                api.show(&answer, human, Api::summary)
            }
        }
        DynamicCommand::List => {
            let answer = api.call(Method::GET, MOUNTS_PATH, None::<&()>).await?;
            api.show(&answer, human, |api, list: &MountList| {
                if list.mounts.is_empty() {
                    "no mounts".to_string()
                } else {
                    list.mounts.iter().map(|m| api.summary(m)).collect::<Vec<_>>().join("\n")
                }
            })
        }
        DynamicCommand::Usage => {
            let answer = api.call(Method::GET, api::USAGE_PATH, None::<&()>).await?;
            api.show(&answer, human, |_, u: &api::Usage| {
                let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64);
                format!(
                    "{} of {} (mounts {}, ending downloads {}, being admitted {}); {} of {} mounts",
                    mib(u.level_bytes),
                    u.max_bytes.map_or("no cap".to_string(), mib),
                    mib(u.held_bytes),
                    mib(u.ending_bytes),
                    mib(u.reserved_bytes),
                    u.mounts,
                    u.max_mounts
                )
            })
        }
        DynamicCommand::Get { id } => {
            check_id(&id)?;
            let answer = api.call(Method::GET, &mount_path(&id), None::<&()>).await?;
            api.show(&answer, human, Api::summary)
        }
        DynamicCommand::Delete { id } => {
            check_id(&id)?;
            let answer = api.call(Method::DELETE, &mount_path(&id), None::<&()>).await?;
            api.show(&answer, human, Api::summary)
        }
        DynamicCommand::Wait { id, timeout } => {
            check_id(&id)?;
            let first: MountView = typed(&api.call(Method::GET, &mount_path(&id), None::<&()>).await?)?;
            let view = api.wait(&id, first, Duration::from_secs(timeout), human).await?;
            Ok(api.show_view(&view, human))
        }
    }
}

fn check_id(id: &str) -> Result<(), DynamicError> {
    api::check_id(id).map_err(|m| DynamicError::new("bad_id", m))
}

fn mount_path(id: &str) -> String {
    format!("{MOUNTS_PATH}/{id}")
}

/// An answer as the type the API promises.
fn typed<T: DeserializeOwned>(answer: &Value) -> Result<T, DynamicError> {
    serde_json::from_value(answer.clone()).map_err(|e| {
        DynamicError::new("bad_answer", format!("the answer is not what the API promises ({e}): {answer}"))
    })
}

/// One volume's socket.
struct Api {
    socket: PathBuf,
    /// What is connected to: `socket`, or, when its path is longer than a unix socket address
    /// holds (kubelet's pod paths), `/proc/self/fd/N/csi.sock` through its open directory.
    address: PathBuf,
    _dir: Option<std::fs::File>,
    client: Client<UnixConnector, Full<Bytes>>,
}

/// Longest path a unix socket address holds (`sun_path`, with its NUL).
const SUN_PATH_MAX: usize = 107;

impl Api {
    fn new(socket: PathBuf) -> Self {
        let client = Client::builder(TokioExecutor::new()).build(UnixConnector);
        let dir = (socket.as_os_str().len() > SUN_PATH_MAX)
            .then(|| socket.parent().and_then(|d| std::fs::File::open(d).ok()))
            .flatten();
        let address = match (&dir, socket.file_name()) {
            (Some(d), Some(name)) => {
                use std::os::fd::AsRawFd;
                Path::new(&format!("/proc/self/fd/{}", d.as_raw_fd())).join(name)
            }
            _ => socket.clone(),
        };
        Api { socket, address, _dir: dir, client }
    }

    /// One request; the answer's JSON body when the status is 2xx, the [`ApiError`] otherwise.
    async fn call<B: serde::Serialize>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<Value, DynamicError> {
        let mut req = Request::builder().method(method.clone()).uri(hyperlocal::Uri::new(&self.address, path));
        let body = match body {
            Some(b) => {
                req = req.header(http::header::CONTENT_TYPE, "application/json");
                Bytes::from(serde_json::to_vec(b).expect("request bodies serialize"))
            }
            None => Bytes::new(),
        };
        let req = req.body(Full::new(body)).map_err(|e| DynamicError::new("bad_request", e.to_string()))?;
        let what = format!("{method} {path} on {}", self.socket.display());
        let exchange = async {
            let answer = self.client.request(req).await.map_err(|e| self.request_error(&what, &e))?;
            let status = answer.status();
            let body = Limited::new(answer.into_body(), MAX_ANSWER).collect().await.map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    DynamicError::new(
                        "bad_answer",
                        format!("{what}: the answer is larger than {} KiB", MAX_ANSWER >> 10),
                    )
                } else {
                    DynamicError::new("bad_answer", format!("{what}: reading the answer: {e}"))
                }
            })?;
            Ok::<_, DynamicError>((status, body.to_bytes()))
        };
        let (status, body) = tokio::time::timeout(REQUEST_TIMEOUT, exchange).await.map_err(|_| {
            DynamicError::new("timeout", format!("{what}: no answer within {} s", REQUEST_TIMEOUT.as_secs()))
        })??;
        if status.is_success() {
            return serde_json::from_slice(&body).map_err(|e| {
                DynamicError::new("bad_answer", format!("{what}: {status} with a body that is not JSON: {e}"))
            });
        }
        match serde_json::from_slice::<ApiError>(&body) {
            Ok(err) => Err(DynamicError::new(&err.code, err.message)),
            Err(_) => Err(DynamicError::new(&status_code(status), {
                let text: String = String::from_utf8_lossy(&body).chars().take(200).collect();
                format!("{what}: {status}: {}", text.trim())
            })),
        }
    }

    /// A request that got no answer, naming the socket and why: missing, refused or other.
    fn request_error(&self, what: &str, e: &hyper_util::client::legacy::Error) -> DynamicError {
        let socket = self.socket.display();
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
        let io = std::iter::from_fn(|| {
            let cur = source?;
            source = cur.source();
            Some(cur)
        })
        .find_map(|s| s.downcast_ref::<std::io::Error>());
        if e.is_connect() {
            return match io.map(std::io::Error::kind) {
                Some(std::io::ErrorKind::NotFound) => DynamicError::new(
                    "no_socket",
                    format!(
                        "no socket at {socket}: the file is missing (is the volume published there? its socket is `<published dir>/{}`)",
                        api::SOCKET_NAME
                    ),
                ),
                // Linux refuses a connection to a file that is no socket too.
                Some(std::io::ErrorKind::ConnectionRefused)
                    if std::fs::metadata(&self.socket).is_ok_and(|m| !m.file_type().is_socket()) =>
                {
                    DynamicError::new("unreachable", format!("{socket} is not a socket"))
                }
                Some(std::io::ErrorKind::ConnectionRefused) => DynamicError::new(
                    "refused",
                    format!(
                        "{socket} refused the connection: nothing serves the volume's API on it (is the host daemon running?)"
                    ),
                ),
                Some(std::io::ErrorKind::PermissionDenied) => {
                    DynamicError::new("unreachable", format!("no permission to connect to {socket}"))
                }
                _ => DynamicError::new(
                    "unreachable",
                    format!("connecting to {socket}: {}", io.map_or_else(|| e.to_string(), ToString::to_string)),
                ),
            };
        }
        let cause = io.map_or_else(|| format!("{e:#?}"), ToString::to_string);
        DynamicError::new("bad_answer", format!("{what}: the connection failed before an answer: {cause}"))
    }

    /// Poll `id` until it is ready (Ok), failed, deleted or out of time (Err, with its last
    /// view as the output). `view` is the first view already fetched.
    async fn wait(
        &self,
        id: &str,
        mut view: MountView,
        timeout: Duration,
        human: bool,
    ) -> Result<MountView, DynamicError> {
        let deadline = Instant::now() + timeout;
        let mut shown = Shown::new(id);
        loop {
            shown.update(&view);
            match view.state {
                MountState::Ready => {
                    shown.finish(true);
                    return Ok(view);
                }
                MountState::Failed => {
                    shown.finish(false);
                    let reason = view.reason.clone().unwrap_or_else(|| "no reason given".into());
                    return Err(DynamicError {
                        code: "mount_failed".into(),
                        message: format!("mount {id} failed: {reason}"),
                        output: Some(self.show_view(&view, human)),
                    });
                }
                MountState::Deleted => {
                    shown.finish(false);
                    return Err(DynamicError {
                        code: "mount_deleted".into(),
                        message: format!("mount {id} was deleted while waiting for it"),
                        output: Some(self.show_view(&view, human)),
                    });
                }
                MountState::Pending | MountState::Pulling => {}
            }
            let now = Instant::now();
            if now + POLL > deadline {
                shown.finish(false);
                let state = state_name(view.state);
                return Err(DynamicError {
                    code: "timeout".into(),
                    message: format!("mount {id} is still {state} after {} s", timeout.as_secs()),
                    output: Some(self.show_view(&view, human)),
                });
            }
            tokio::time::sleep(POLL).await;
            view = typed(&self.call(Method::GET, &mount_path(id), None::<&()>).await?)?;
        }
    }

    /// An answer as printed: the JSON itself (compact, one line), or `summary` on a terminal.
    fn show<T: DeserializeOwned>(
        &self,
        answer: &Value,
        human: bool,
        summary: impl FnOnce(&Self, &T) -> String,
    ) -> Result<String, DynamicError> {
        if human { Ok(summary(self, &typed(answer)?)) } else { Ok(answer.to_string()) }
    }

    fn show_view(&self, view: &MountView, human: bool) -> String {
        if human { self.summary(view) } else { serde_json::to_string(view).expect("views serialize") }
    }

    /// One line for a person: `ID: STATE`, then where it is, how far it got or why it failed.
    fn summary(&self, m: &MountView) -> String {
        let state = state_name(m.state);
        match m.state {
            MountState::Ready => format!("{}: {state} at {}", m.id, self.mount_dir(m).display()),
            MountState::Pulling => match (m.bytes_done, m.bytes_total) {
                (Some(done), Some(total)) => format!("{}: {state}, {}", m.id, super::progress::line(done, total)),
                _ => format!("{}: {state}", m.id),
            },
            MountState::Failed => {
                format!("{}: {state}: {}", m.id, m.reason.as_deref().unwrap_or("no reason given"))
            }
            MountState::Pending | MountState::Deleted => format!("{}: {state}", m.id),
        }
    }

    /// Where a mount is: its path is relative to the published directory, the socket's.
    fn mount_dir(&self, m: &MountView) -> PathBuf {
        self.socket.parent().unwrap_or(Path::new("")).join(&m.path)
    }
}

fn state_name(s: MountState) -> String {
    serde_json::to_value(s).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default()
}

fn status_code(status: StatusCode) -> String {
    format!("http_{}", status.as_u16())
}

/// How pulling is shown on stderr: nothing while the mount is pending.
struct Shown(super::progress::Shown);

impl Shown {
    fn new(id: &str) -> Self {
        Shown(super::progress::Shown::new(Some(id)))
    }

    fn update(&mut self, view: &MountView) {
        if view.state == MountState::Pulling {
            self.0.update(view.bytes_done.unwrap_or(0), view.bytes_total.unwrap_or(0));
        }
    }

    /// The mount is ready (`done`: the bar fills) or will not be.
    fn finish(&self, done: bool) {
        self.0.finish(done);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(state: MountState) -> MountView {
        MountView {
            id: "llama".into(),
            plugin: "model".into(),
            parameters: BTreeMap::new(),
            state,
            path: "mounts/llama".into(),
            bytes_done: None,
            bytes_total: None,
            reason: None,
            lazy: None,
        }
    }

    #[test]
    fn summaries_name_id_state_path_and_reason() {
        let api = Api::new(PathBuf::from("/pods/p/volumes/v/csi.sock"));
        assert_eq!(api.summary(&view(MountState::Ready)), "llama: ready at /pods/p/volumes/v/mounts/llama");
        assert_eq!(api.summary(&view(MountState::Pending)), "llama: pending");
        let pulling = MountView { bytes_done: Some(1 << 20), bytes_total: Some(4 << 20), ..view(MountState::Pulling) };
        assert_eq!(api.summary(&pulling), "llama: pulling, pulled 1.0 MiB of 4.0 MiB (25%)");
        let failed = MountView { reason: Some("manifest unknown".into()), ..view(MountState::Failed) };
        assert_eq!(api.summary(&failed), "llama: failed: manifest unknown");
        assert_eq!(state_name(MountState::Deleted), "deleted");
    }

    #[test]
    fn timeout_needs_wait() {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            args: DynamicArgs,
        }
        let parse = |a: &[&str]| T::try_parse_from([&["t", "--socket", "/s"], a].concat()).map(|t| t.args.command);
        assert!(parse(&["create", "x", "--timeout", "5"]).is_err());
        match parse(&["create", "x", "-p", "reference=r/m:v1", "--param", "k=v", "--wait", "--timeout", "5"]).unwrap() {
            DynamicCommand::Create { params, wait, timeout, .. } => {
                assert_eq!(params.len(), 2);
                assert!(wait && timeout == 5);
            }
            other => panic!("{other:?}"),
        }
    }
}
