//! A real OCI registry for the `model` plugin's tests, and ModelPack artifacts pushed into it.
//!
//! [`Registry`] runs CNCF distribution 2.8 (`docker-registry serve`, Debian's package) on
//! 127.0.0.1 with a config, storage and log of its own in a temp dir (never the packaged
//! service config, which listens on every interface), optionally behind TLS signed by a test CA
//! made with openssl and behind htpasswd (bcrypt) basic auth. It pushes through the registry's
//! plain HTTP API with `curl` (credentials and CA in a 0600 `--config` file, never in argv), so
//! the tests need no client crate of their own. [`ModelBuilder`] packs files as model-spec v1
//! layers (one file per tar, or raw), writes the model config and the OCI manifest, and pushes
//! them; large files are streamed from disk, never held whole in memory.
#![allow(dead_code)]

use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::free_port;

/// `mediaType` of the manifests [`ModelBuilder`] pushes (an OCI image manifest).
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// `artifactType` of a ModelPack manifest.
pub const MODEL_ARTIFACT_TYPE: &str = "application/vnd.cncf.model.manifest.v1+json";
/// Media type of the ModelPack config blob.
pub const MODEL_CONFIG: &str = "application/vnd.cncf.model.config.v1+json";
/// The layer annotation giving the file's path in the model.
pub const FILEPATH_ANNOTATION: &str = "org.cncf.model.filepath";

/// How to start a [`Registry`].
#[derive(Clone, Debug, Default)]
pub struct RegistryOptions {
    /// Serve HTTPS with a certificate for 127.0.0.1 signed by a fresh test CA ([`Registry::ca_pem`]).
    pub tls: bool,
    /// Require basic auth with this user and password (an htpasswd file, bcrypt).
    pub htpasswd: Option<(String, String)>,
}

/// A blob in the registry: its digest (`sha256:<hex>`) and size in bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Descriptor {
    pub digest: String,
    pub size: u64,
}

/// What to push: bytes in memory, or a file streamed from disk.
#[derive(Clone, Debug)]
pub enum Content {
    Bytes(Vec<u8>),
    File(PathBuf),
}

impl From<&[u8]> for Content {
    fn from(b: &[u8]) -> Content {
        Content::Bytes(b.to_vec())
    }
}

impl<const N: usize> From<&[u8; N]> for Content {
    fn from(b: &[u8; N]) -> Content {
        Content::Bytes(b.to_vec())
    }
}

impl From<Vec<u8>> for Content {
    fn from(b: Vec<u8>) -> Content {
        Content::Bytes(b)
    }
}

impl From<&Path> for Content {
    fn from(p: &Path) -> Content {
        Content::File(p.to_path_buf())
    }
}

impl From<PathBuf> for Content {
    fn from(p: PathBuf) -> Content {
        Content::File(p)
    }
}

impl From<&PathBuf> for Content {
    fn from(p: &PathBuf) -> Content {
        Content::File(p.clone())
    }
}

impl Content {
    /// A reader over the content and its length.
    fn open(&self) -> (Box<dyn Read + '_>, u64) {
        match self {
            Content::Bytes(b) => (Box::new(b.as_slice()), b.len() as u64),
            Content::File(p) => {
                let f = File::open(p).unwrap_or_else(|e| panic!("opening {}: {e}", p.display()));
                let len = f.metadata().unwrap().len();
                (Box::new(BufReader::with_capacity(1 << 20, f)), len)
            }
        }
    }
}

/// One answer of `curl --include`: the final status line's code, headers and body.
#[derive(Clone, Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The first header called `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// curl could not complete the exchange (no HTTP answer): its exit code and stderr.
#[derive(Clone, Debug)]
pub struct CurlError {
    /// curl's exit code: 7 connection refused, 60 certificate not trusted, ...
    pub code: i32,
    pub stderr: String,
}

/// Run `cmd` (a curl command line) with `--include` and parse what it printed. Interim answers
/// (`100 Continue`) are skipped.
pub fn run_curl(cmd: &mut Command) -> Result<Response, CurlError> {
    let out = cmd.arg("--include").stdin(Stdio::null()).output().expect("running curl");
    if !out.status.success() {
        return Err(CurlError {
            code: out.status.code().unwrap_or(-1),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let mut rest: &[u8] = &out.stdout;
    loop {
        let end = rest.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4).unwrap_or(rest.len());
        let head = String::from_utf8_lossy(&rest[..end]).into_owned();
        let body = &rest[end..];
        let mut lines = head.lines();
        let status: u16 =
            lines.next().and_then(|l| l.split_whitespace().nth(1)).and_then(|c| c.parse().ok()).unwrap_or(0);
        if (100..200).contains(&status) && body.starts_with(b"HTTP/") {
            rest = body;
            continue;
        }
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        return Ok(Response { status, headers, body: body.to_vec() });
    }
}

/// `sha256:<hex>` of bytes.
/// The referrers tag schema's index (at tag `sha256-<hex>` of the subject) listing one chunk
/// index artifact, whose manifest `artifact` is at `artifact_digest`.
pub fn chunk_index_referrers(artifact_digest: &str, artifact: &str) -> String {
    serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": artifact_digest,
            "size": artifact.len(),
            "artifactType": mounthost::oci::INDEX_ARTIFACT_TYPE,
        }],
    })
    .to_string()
}

pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The sha256 (hex) and size of a file, read in 1 MiB pieces.
pub fn sha256_file(path: &Path) -> (String, u64) {
    let mut f = File::open(path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
        size += n as u64;
    }
    (hex::encode(hash.finalize()), size)
}

/// A real `docker-registry` on 127.0.0.1, killed (SIGKILL) and reaped on drop.
pub struct Registry {
    child: Option<Child>,
    port: u16,
    opts: RegistryOptions,
    dir: tempfile::TempDir,
}

impl Registry {
    /// Write its config, TLS material and htpasswd file into a temp dir, start it on a free port
    /// and wait until `GET /v2/` answers 200 (with the credentials, when auth is on). The port
    /// is picked free just before the registry binds it, so a parallel test can take it in
    /// between: the registry then exits with "address already in use" and starts on another.
    pub fn start(opts: RegistryOptions) -> Registry {
        let dir = tempfile::Builder::new().prefix("mounthost-registry-").tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("data")).unwrap();
        std::fs::create_dir_all(dir.path().join("uploads")).unwrap();
        if opts.tls {
            make_tls(dir.path());
        }
        if let Some((user, password)) = &opts.htpasswd {
            let out = Command::new("htpasswd")
                .args(["-Bbn", user, password])
                .output()
                .expect("running htpasswd (apt-get install apache2-utils)");
            assert!(out.status.success(), "htpasswd: {}", String::from_utf8_lossy(&out.stderr));
            std::fs::write(dir.path().join("htpasswd"), &out.stdout).unwrap();
        }
        let mut registry = Registry { child: None, port: 0, opts, dir };
        registry.write_curl_config();
        let mut attempt = 0;
        loop {
            attempt += 1;
            registry.port = free_port();
            match registry.launch() {
                Ok(()) => return registry,
                Err(log) if attempt < 4 && log.contains("address already in use") => {
                    eprintln!("docker-registry lost a port race (attempt {attempt}); starting it on another port");
                }
                Err(log) => panic!("docker-registry did not start: {log}"),
            }
        }
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `http(s)://127.0.0.1:PORT` followed by `path`.
    pub fn url(&self, path: &str) -> String {
        let scheme = if self.opts.tls { "https" } else { "http" };
        format!("{scheme}://{}{path}", self.host())
    }

    /// `127.0.0.1:PORT/repo:tag`.
    pub fn reference(&self, repo: &str, tag: &str) -> String {
        format!("{}/{repo}:{tag}", self.host())
    }

    /// The test CA's certificate (PEM) that signed the server's. Panics without `tls`.
    pub fn ca_pem(&self) -> PathBuf {
        assert!(self.opts.tls, "this registry was started without tls");
        self.dir.path().join("ca.pem")
    }

    /// The user and password basic auth accepts, when auth is on.
    pub fn credentials(&self) -> Option<(&str, &str)> {
        self.opts.htpasswd.as_ref().map(|(u, p)| (u.as_str(), p.as_str()))
    }

    /// The registry's own temp dir (config, storage under `data/`, log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The registry's log file (all its starts, appended).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("registry.log")
    }

    /// The registry's log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Where distribution 2.8's filesystem driver keeps the data of blob `digest`
    /// (`sha256:<hex>` or `<hex>`), so a test can corrupt or remove it.
    pub fn blob_storage_path(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        self.dir.path().join(format!("data/docker/registry/v2/blobs/sha256/{}/{hex}/data", &hex[..2]))
    }

    /// Bytes written in the bodies of completed blob GETs (full and ranged), summed from the
    /// registry's "response completed" log lines across restarts. A line is written just after
    /// its response ends, so poll briefly after a pull rather than reading once.
    pub fn served_bytes(&self) -> u64 {
        self.log()
            .lines()
            .filter(|l| {
                l.contains("msg=\"response completed\"")
                    && l.contains("http.request.method=GET ")
                    && l.contains("/blobs/sha256:")
            })
            .filter_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("http.response.written=")))
            .filter_map(|n| n.parse::<u64>().ok())
            .sum()
    }

    /// A `curl` command that trusts the test CA, sends the credentials (both from a 0600 config
    /// file), ignores any proxy and is silent except for errors. Add the method and URL.
    pub fn curl(&self) -> Command {
        let mut cmd = Command::new("curl");
        cmd.arg("--config").arg(self.dir.path().join("curl.conf"));
        cmd
    }

    /// One request without a body through [`Registry::curl`]; panics when curl gets no answer.
    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
        let mut cmd = self.curl();
        if method == "HEAD" {
            cmd.arg("--head");
        } else {
            cmd.args(["--request", method]);
        }
        for (k, v) in headers {
            cmd.arg("--header").arg(format!("{k}: {v}"));
        }
        cmd.arg(self.url(path));
        run_curl(&mut cmd).unwrap_or_else(|e| panic!("curl {method} {path}: {e:?}\n{}", self.log()))
    }

    /// Push a blob (POST an upload, PUT its content with the digest; a file is streamed by
    /// curl from disk). A blob the repository already has is not sent again.
    pub fn push_blob(&self, repo: &str, content: impl Into<Content>) -> Descriptor {
        match content.into() {
            Content::File(path) => {
                let (hex, size) = sha256_file(&path);
                let desc = Descriptor { digest: format!("sha256:{hex}"), size };
                self.upload(repo, &path, &desc);
                desc
            }
            Content::Bytes(bytes) => {
                let desc = Descriptor { digest: sha256_digest(&bytes), size: bytes.len() as u64 };
                let tmp = tempfile::NamedTempFile::new_in(self.dir.path().join("uploads")).unwrap();
                std::fs::write(tmp.path(), &bytes).unwrap();
                self.upload(repo, tmp.path(), &desc);
                desc
            }
        }
    }

    /// Push a file whose digest and size are already known.
    fn upload(&self, repo: &str, path: &Path, desc: &Descriptor) {
        let blob = format!("/v2/{repo}/blobs/{}", desc.digest);
        if self.request("HEAD", &blob, &[]).status == 200 {
            return;
        }
        let post = self.request("POST", &format!("/v2/{repo}/blobs/uploads/"), &[]);
        assert_eq!(post.status, 202, "starting an upload to {repo}: {}\n{}", post.text(), self.log());
        let location = post.header("location").expect("an upload answer without Location");
        let mut url = if location.starts_with('/') { self.url(location) } else { location.to_string() };
        url.push(if url.contains('?') { '&' } else { '?' });
        url.push_str(&format!("digest={}", desc.digest));
        let mut cmd = self.curl();
        cmd.args(["--request", "PUT", "--header", "Content-Type: application/octet-stream", "--header", "Expect:"])
            .arg("--upload-file")
            .arg(path)
            .arg(&url);
        let put = run_curl(&mut cmd).unwrap_or_else(|e| panic!("uploading {}: {e:?}", path.display()));
        assert_eq!(put.status, 201, "uploading {} to {repo}: {}\n{}", path.display(), put.text(), self.log());
        assert_eq!(put.header("docker-content-digest"), Some(desc.digest.as_str()));
    }

    /// PUT a manifest under `tag` (its `Content-Type` is the JSON's `mediaType`, else an OCI image
    /// manifest) and return its digest, checked against the bytes sent.
    pub fn push_manifest(&self, repo: &str, tag: &str, json: &str) -> String {
        let media_type = serde_json::from_str::<serde_json::Value>(json)
            .ok()
            .and_then(|v| v["mediaType"].as_str().map(str::to_string))
            .unwrap_or_else(|| OCI_MANIFEST.to_string());
        let tmp = tempfile::NamedTempFile::new_in(self.dir.path().join("uploads")).unwrap();
        std::fs::write(tmp.path(), json).unwrap();
        let mut cmd = self.curl();
        cmd.args(["--request", "PUT", "--header"])
            .arg(format!("Content-Type: {media_type}"))
            .arg("--data-binary")
            .arg(format!("@{}", tmp.path().display()))
            .arg(self.url(&format!("/v2/{repo}/manifests/{tag}")));
        let put = run_curl(&mut cmd).unwrap_or_else(|e| panic!("pushing the manifest {repo}:{tag}: {e:?}"));
        assert_eq!(put.status, 201, "pushing the manifest {repo}:{tag}: {}\n{}", put.text(), self.log());
        let digest = sha256_digest(json.as_bytes());
        assert_eq!(put.header("docker-content-digest"), Some(digest.as_str()), "the registry rewrote the manifest");
        digest
    }

    /// Flip the byte at `at` of blob `digest` in the registry's storage (it then serves the
    /// blob corrupted, under the same digest).
    pub fn corrupt(&self, digest: &str, at: usize) {
        let stored = self.blob_storage_path(digest);
        let mut bytes = std::fs::read(&stored).unwrap();
        bytes[at] ^= 0xff;
        std::fs::write(&stored, &bytes).unwrap();
    }

    /// SIGKILL the registry and reap it (no-op when it is not running).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kill it if it runs, then start it again on the same port with the same storage, and wait
    /// until it answers.
    pub fn restart(&mut self) {
        self.kill();
        if let Err(log) = self.launch() {
            panic!("docker-registry did not restart on {}: {log}", self.host());
        }
    }

    /// Start `docker-registry serve` on `self.port` and wait for `GET /v2/`; on failure the
    /// child is reaped and the log of this start returned.
    fn launch(&mut self) -> Result<(), String> {
        self.write_config();
        let log_path = self.log_path();
        let from = std::fs::metadata(&log_path).map(|m| m.len()).unwrap_or(0);
        let log_since = |from: u64| {
            let log = std::fs::read(&log_path).unwrap_or_default();
            String::from_utf8_lossy(log.get(from as usize..).unwrap_or_default()).into_owned()
        };
        let log = OpenOptions::new().create(true).append(true).open(&log_path).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(self.dir.path().join("config.yml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting docker-registry (apt-get install docker-registry)");
        self.child = Some(child);
        let until = Instant::now() + Duration::from_secs(30);
        let exited = |me: &mut Registry| -> Option<String> {
            let status = me.child.as_mut()?.try_wait().ok()??;
            me.child = None;
            Some(format!("docker-registry exited ({status}): {}", log_since(from)))
        };
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(e) = exited(self) {
                return Err(e);
            }
            if Instant::now() > until {
                self.kill();
                return Err(format!("docker-registry not listening in 30 s: {}", log_since(from)));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Listening; but someone else may hold the port: check who answers.
        let mut cmd = self.curl();
        cmd.arg(self.url("/v2/"));
        let answer = run_curl(&mut cmd);
        if let Some(e) = exited(self) {
            return Err(e);
        }
        match answer {
            Ok(r) if r.status == 200 && r.header("docker-distribution-api-version") == Some("registry/2.0") => Ok(()),
            other => {
                self.kill();
                Err(format!("GET /v2/ answered {other:?}: {}", log_since(from)))
            }
        }
    }

    fn write_config(&self) {
        let dir = self.dir.path();
        let q = |p: PathBuf| format!("'{}'", p.display().to_string().replace('\'', "''"));
        let mut config = format!(
            "version: 0.1\n\
             log:\n  level: info\n  formatter: text\n\
             storage:\n  filesystem:\n    rootdirectory: {data}\n  delete:\n    enabled: true\n\
             \x20 maintenance:\n    uploadpurging:\n      enabled: false\n\
             http:\n  addr: 127.0.0.1:{port}\n  secret: mounthost-test-secret\n",
            data = q(dir.join("data")),
            port = self.port,
        );
        if self.opts.tls {
            config.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                q(dir.join("server.pem")),
                q(dir.join("server.key"))
            ));
        }
        if self.opts.htpasswd.is_some() {
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: mounthost-test\n    path: {}\n",
                q(dir.join("htpasswd"))
            ));
        }
        std::fs::write(dir.join("config.yml"), config).unwrap();
    }

    /// curl's options for this registry, in a file only root can read.
    fn write_curl_config(&self) {
        let quote = |s: &str| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
        let mut conf = String::from("silent\nshow-error\nnoproxy = \"*\"\nconnect-timeout = 10\n");
        if let Some((user, password)) = &self.opts.htpasswd {
            conf.push_str(&format!("user = {}\n", quote(&format!("{user}:{password}"))));
        }
        if self.opts.tls {
            conf.push_str(&format!("cacert = {}\n", quote(&self.ca_pem().display().to_string())));
        }
        let mut f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(self.dir.path().join("curl.conf"))
            .unwrap();
        f.write_all(conf.as_bytes()).unwrap();
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A test CA (`ca.pem`, `ca.key`) and a server certificate for IP 127.0.0.1 signed by it
/// (`server.pem`, `server.key`), P-256 keys, in `dir`.
pub fn make_tls(dir: &Path) {
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl").args(args).current_dir(dir).output().expect("running openssl");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    let ca_subject = format!("/CN=mounthost test CA {}", dir.file_name().unwrap().to_string_lossy());
    openssl(
        &[
            &["req", "-x509"][..],
            &ec,
            &["-keyout", "ca.key", "-out", "ca.pem", "-days", "7", "-subj", &ca_subject],
            &["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        ]
        .concat(),
    );
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName = IP:127.0.0.1\nbasicConstraints = critical, CA:FALSE\n\
         keyUsage = critical, digitalSignature\nextendedKeyUsage = serverAuth\n",
    )
    .unwrap();
    openssl(
        &[&["req", "-new"][..], &ec, &["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"]]
            .concat(),
    );
    let sign = "x509 -req -in server.csr -CA ca.pem -CAkey ca.key -days 7 -extfile server.ext -out server.pem";
    let serial = format!("0x{:016x}", seed());
    openssl(&[sign.split_whitespace().collect::<Vec<_>>(), vec!["-set_serial", &serial]].concat());
}

/// A different seed at every call (time, pid and a counter, mixed).
fn seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let mut s = nanos ^ (u64::from(std::process::id()) << 32) ^ COUNTER.fetch_add(1, Ordering::Relaxed).rotate_left(17);
    splitmix64(&mut s)
}

/// One step of SplitMix64: a fast generator that is good enough for incompressible test data.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A new file of `size` pseudo-random (incompressible, different at every call) bytes in `dir`,
/// written 1 MiB at a time, and its sha256 (hex). About 3 s per GiB in a debug build, hashing
/// and writing included.
pub fn random_file(dir: &Path, size: u64) -> (PathBuf, String) {
    let mut state = seed();
    let (path, mut file) = loop {
        let path = dir.join(format!("random-{:016x}.bin", splitmix64(&mut state)));
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(f) => break (path, f),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => panic!("creating {}: {e}", path.display()),
        }
    };
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut x = splitmix64(&mut state) | 1;
    let mut left = size;
    while left > 0 {
        // xorshift64 with plain operators in a `while` loop: test code is built unoptimised, where
        // every iterator step or `wrapping_*` call would be a real call (4x slower).
        let b: &mut [u8] = &mut buf;
        let mut i = 0;
        while i < b.len() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b[i..i + 8].copy_from_slice(&x.to_le_bytes());
            i += 8;
        }
        let n = left.min(buf.len() as u64) as usize;
        hash.update(&buf[..n]);
        file.write_all(&buf[..n]).unwrap();
        left -= n as u64;
    }
    (path, hex::encode(hash.finalize()))
}

/// What a model file is, by model-spec's layer media types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Weights: `...model.weight.v1.*`.
    Weight,
    /// Configuration of the weights (`config.json`, `tokenizer.json`): `...model.weight.config.v1.*`.
    Config,
    /// Documentation: `...model.doc.v1.*`.
    Doc,
    /// Code: `...model.code.v1.*`.
    Code,
    /// Datasets: `...model.dataset.v1.*`.
    Dataset,
}

impl Class {
    /// The part of the media type that names the class.
    pub fn name(self) -> &'static str {
        match self {
            Class::Weight => "weight",
            Class::Config => "weight.config",
            Class::Doc => "doc",
            Class::Code => "code",
            Class::Dataset => "dataset",
        }
    }
}

/// How a model file is packed into its layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Packing {
    /// A tar archive holding the one file at its path.
    Tar,
    /// The same tar, gzip-compressed.
    TarGzip,
    /// The same tar, zstd-compressed.
    TarZstd,
    /// The file's bytes as they are.
    Raw,
}

impl Packing {
    /// The media type's suffix.
    pub fn suffix(self) -> &'static str {
        match self {
            Packing::Tar => "tar",
            Packing::TarGzip => "tar+gzip",
            Packing::TarZstd => "tar+zstd",
            Packing::Raw => "raw",
        }
    }
}

/// `application/vnd.cncf.model.<class>.v1.<packing>`.
pub fn layer_media_type(class: Class, packing: Packing) -> String {
    format!("application/vnd.cncf.model.{}.v1.{}", class.name(), packing.suffix())
}

/// One file of a [`ModelBuilder`].
#[derive(Clone, Debug)]
pub struct ModelFile {
    pub path: String,
    pub content: Content,
    pub class: Class,
    pub packing: Packing,
}

/// A ModelPack artifact to push: files, each one layer.
#[derive(Clone, Debug, Default)]
pub struct ModelBuilder {
    pub files: Vec<ModelFile>,
}

/// A pushed layer.
#[derive(Clone, Debug)]
pub struct PushedLayer {
    pub descriptor: Descriptor,
    pub media_type: String,
    /// The `org.cncf.model.filepath` annotation.
    pub filepath: String,
    /// `sha256:<hex>` of the uncompressed layer (the config's `modelfs.diffIds` entry).
    pub diff_id: String,
}

/// What [`ModelBuilder::push`] pushed.
#[derive(Clone, Debug)]
pub struct PushedModel {
    /// `127.0.0.1:PORT/repo:tag`.
    pub reference: String,
    pub repo: String,
    pub tag: String,
    pub manifest_digest: String,
    /// The manifest exactly as pushed.
    pub manifest: String,
    pub config: Descriptor,
    /// Each file's path, sha256 (hex) and size, in the builder's order.
    pub files: Vec<(String, String, u64)>,
    /// The layers, in the manifest's order (the builder's).
    pub layers: Vec<PushedLayer>,
}

impl PushedModel {
    /// The descriptor of the layer holding `filepath`.
    pub fn layer(&self, filepath: &str) -> &Descriptor {
        &self.layers.iter().find(|l| l.filepath == filepath).unwrap_or_else(|| panic!("no layer {filepath}")).descriptor
    }

    /// Is the blob of the layer holding `filepath` in the node-wide cache below `state`?
    pub fn cached(&self, state: &Path, filepath: &str) -> bool {
        state.join("cache/blobs/sha256").join(self.layer(filepath).digest.trim_start_matches("sha256:")).exists()
    }

    /// A file's sha256 (hex) and size.
    pub fn file(&self, path: &str) -> Option<(&str, u64)> {
        self.files.iter().find(|(p, _, _)| p == path).map(|(_, h, s)| (h.as_str(), *s))
    }
}

impl ModelBuilder {
    pub fn new() -> ModelBuilder {
        ModelBuilder::default()
    }

    /// Add a file at `path` in the model (e.g. `model.safetensors`, `tokenizer/vocab.json`).
    pub fn file(mut self, path: &str, content: impl Into<Content>, class: Class, packing: Packing) -> ModelBuilder {
        self.files.push(ModelFile { path: path.to_string(), content: content.into(), class, packing });
        self
    }

    /// Pack every file (tar layers are written to a temp file as they are compressed), push the
    /// layers, the config and the manifest to `repo:tag`.
    pub fn push(&self, registry: &Registry, repo: &str, tag: &str) -> PushedModel {
        let work = tempfile::Builder::new().prefix("mounthost-model-").tempdir().unwrap();
        let mut files = Vec::new();
        let mut layers = Vec::new();
        for (i, f) in self.files.iter().enumerate() {
            let (descriptor, diff_id, file_sha, file_size) = match (&f.packing, &f.content) {
                (Packing::Raw, content) => {
                    let d = registry.push_blob(repo, content.clone());
                    let hex = d.digest.trim_start_matches("sha256:").to_string();
                    (d.clone(), d.digest, hex, d.size)
                }
                (packing, content) => {
                    let out = work.path().join(format!("layer-{i}"));
                    let (d, diff_id, file_sha, file_size) = pack_tar(&out, &f.path, content, *packing);
                    registry.upload(repo, &out, &d);
                    std::fs::remove_file(&out).unwrap();
                    (d, diff_id, file_sha, file_size)
                }
            };
            files.push((f.path.clone(), file_sha, file_size));
            layers.push(PushedLayer {
                descriptor,
                media_type: layer_media_type(f.class, f.packing),
                filepath: f.path.clone(),
                diff_id,
            });
        }
        let config = serde_json::json!({
            "descriptor": { "name": repo, "version": tag, "family": "mounthost-test" },
            "config": { "format": "test" },
            "modelfs": { "type": "layers", "diffIds": layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>() },
        });
        let config = registry.push_blob(repo, serde_json::to_vec(&config).unwrap());
        let manifest = model_manifest(&config, &layers);
        let manifest_digest = registry.push_manifest(repo, tag, &manifest);
        PushedModel {
            reference: registry.reference(repo, tag),
            repo: repo.to_string(),
            tag: tag.to_string(),
            manifest_digest,
            manifest,
            config,
            files,
            layers,
        }
    }
}

/// A writer that hashes (sha256) and counts what goes through it.
struct Hashing<W> {
    inner: W,
    hash: Sha256,
    len: u64,
}

impl<W: Write> Hashing<W> {
    fn new(inner: W) -> Hashing<W> {
        Hashing { inner, hash: Sha256::new(), len: 0 }
    }

    /// The inner writer, and the digest and size of what was written.
    fn finish(self) -> (W, Descriptor) {
        (self.inner, Descriptor { digest: format!("sha256:{}", hex::encode(self.hash.finalize())), size: self.len })
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A reader that hashes (sha256) and counts what it reads.
struct HashingReader<R> {
    inner: R,
    hash: Sha256,
    len: u64,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }
}

/// Write a tar of the one file `content` at `path` into `out`, returning the writer once the
/// archive is finished, and the file's sha256 (hex) and size.
fn tar_one<W: Write>(out: W, path: &str, content: &Content) -> (W, String, u64) {
    let (reader, size) = content.open();
    let mut reader = HashingReader { inner: reader, hash: Sha256::new(), len: 0 };
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(size);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_uid(0);
    header.set_gid(0);
    let mut builder = tar::Builder::new(out);
    builder.append_data(&mut header, path, &mut reader).unwrap_or_else(|e| panic!("packing {path}: {e}"));
    let out = builder.into_inner().unwrap();
    assert_eq!(reader.len, size, "{path} changed while it was packed");
    (out, hex::encode(reader.hash.finalize()), size)
}

/// Pack one file into the layer file `out` (tar, compressed as `packing` says) in one pass;
/// returns the layer's descriptor and diff ID, and the file's sha256 (hex) and size.
fn pack_tar(out: &Path, path: &str, content: &Content, packing: Packing) -> (Descriptor, String, String, u64) {
    let file = Hashing::new(BufWriter::with_capacity(1 << 20, File::create(out).unwrap()));
    let (file, diff, sha, size) = match packing {
        Packing::Tar => {
            let (tar, sha, size) = tar_one(Hashing::new(file), path, content);
            let (file, diff) = tar.finish();
            (file, diff, sha, size)
        }
        Packing::TarGzip => {
            let gz = flate2::write::GzEncoder::new(file, flate2::Compression::fast());
            let (tar, sha, size) = tar_one(Hashing::new(gz), path, content);
            let (gz, diff) = tar.finish();
            (gz.finish().unwrap(), diff, sha, size)
        }
        Packing::TarZstd => {
            let zst = zstd::stream::write::Encoder::new(file, 1).unwrap();
            let (tar, sha, size) = tar_one(Hashing::new(zst), path, content);
            let (zst, diff) = tar.finish();
            (zst.finish().unwrap(), diff, sha, size)
        }
        Packing::Raw => unreachable!("raw layers are pushed as they are"),
    };
    let (mut buffered, blob) = file.finish();
    buffered.flush().unwrap();
    (blob, diff.digest, sha, size)
}

/// The manifest of a ModelPack model with `config` and `layers`.
pub fn model_manifest(config: &Descriptor, layers: &[PushedLayer]) -> String {
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": MODEL_ARTIFACT_TYPE,
        "config": { "mediaType": MODEL_CONFIG, "digest": config.digest, "size": config.size },
        "layers": layers.iter().map(|l| serde_json::json!({
            "mediaType": l.media_type,
            "digest": l.descriptor.digest,
            "size": l.descriptor.size,
            "annotations": { FILEPATH_ANNOTATION: l.filepath },
        })).collect::<Vec<_>>(),
    });
    serde_json::to_string_pretty(&manifest).unwrap()
}
