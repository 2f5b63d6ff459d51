//! Clients other than Go (docs/csi.md, "Clients other than Go"): a Python client on grpcio
//! (grpc C-core) against the real `mounthost host` and `mounthost csi --mode all`.
//!
//! C-core sends the unix socket's path, percent-encoded, as the HTTP/2 `:authority`; the `h2`
//! crate under tonic resets such a stream with PROTOCOL_ERROR before any of our code sees the
//! request (hyperium/h2 pull 487, unmerged). The first test shows that limitation is real and
//! that the documented channel option `("grpc.default_authority", "localhost")` makes every call
//! work. The second drives a volume's whole life from Python, as root in a private mount
//! namespace against a real SeaweedFS: every RPC the driver advertises, each answer checked.
//! Both need grpcio and grpcio-tools in `.local/venv` (scripts/test.sh installs them) and fail,
//! never skip, without them.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use common::{NodeDirs, Proc, Seaweed, guarded, in_private_namespace, pids_with, wait_socket};
use serde_json::Value;

/// The venv's Python (`$MOUNTHOST_PYTHON` overrides).
fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("MOUNTHOST_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.local/venv/bin/python");
    assert!(
        venv.exists(),
        "{} is missing: run scripts/test.sh (it installs grpcio into .local/venv) or set MOUNTHOST_PYTHON",
        venv.display()
    );
    venv
}

/// `mounthost csi --mode all` like [`NodeDirs::start_front`], but with h2's debug log on, so its
/// log says why a stream was reset.
fn start_front_logging_h2(dirs: &NodeDirs) -> Proc {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(dirs.root.path().join("front.log")).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_mounthost"))
        .arg("--state-dir")
        .arg(&dirs.state)
        .arg("--kubelet-dir")
        .arg(&dirs.kubelet)
        .arg("--host-socket")
        .arg(&dirs.host_sock)
        .args(["--node-id", "node-1", "--log", "info,mounthost=debug,h2=debug"])
        .args(["csi", "--mode", "all", "--endpoint"])
        .arg(format!("unix://{}", dirs.csi_sock.display()))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("starting mounthost csi");
    wait_socket(&dirs.csi_sock);
    Proc { child, name: "front" }
}

/// What C-core puts in `:authority` for `unix:///<path>`: the path without its leading slash,
/// every byte but RFC 3986's unreserved ones percent-encoded.
fn c_core_authority(sock: &Path) -> String {
    let path = sock.to_str().unwrap().trim_start_matches('/');
    path.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The one JSON line the script printed for `call` with (`localhost`) or without the option.
fn result<'a>(lines: &'a [Value], call: &str, localhost: bool) -> &'a Value {
    lines
        .iter()
        .find(|l| l["call"] == call && l["options"].get("grpc.default_authority").is_some() == localhost)
        .unwrap_or_else(|| panic!("no result for {call} (localhost: {localhost}) in {lines:?}"))
}

#[test]
fn python_grpcio_reaches_both_sockets_with_a_localhost_authority() {
    let dirs = NodeDirs::new();
    guarded(&dirs, || {
        let _host = dirs.start_host(&[]);
        let _front = start_front_logging_h2(&dirs);
        let stubs = tempfile::tempdir().unwrap();
        let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/grpc_clients.py");
        let started = Instant::now();
        let out = Command::new(python())
            .arg(&script)
            .arg("authority")
            .arg(&proto)
            .arg(stubs.path())
            .arg(&dirs.csi_sock)
            .arg(&dirs.host_sock)
            .output()
            .expect("running the venv's python");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "the Python client failed (is grpcio installed?):\n{stdout}\n{stderr}");
        let lines: Vec<Value> =
            stdout.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect();
        println!("checked: grpcio {} against both sockets in {:?}", lines[0]["grpcio"], started.elapsed());
        println!("{stdout}");

        // Without the option: the stream is reset before tonic sees it, on both sockets.
        for (call, sock) in [("Probe", &dirs.csi_sock), ("Health", &dirs.host_sock)] {
            let r = result(&lines, call, false);
            assert!(r.get("ok").is_none(), "{call} over {} without the option succeeded: {r}", sock.display());
            assert_eq!(r["code"], "INTERNAL", "{r}");
            // HTTP/2 error code 1 is PROTOCOL_ERROR.
            assert!(r["details"].as_str().unwrap().contains("Received RST_STREAM with error code 1"), "{r}");
        }
        // ... and h2 says why: the percent-encoded socket path is not an authority.
        let front_log = std::fs::read_to_string(dirs.root.path().join("front.log")).unwrap();
        let why = format!("malformed headers: malformed authority (b\"{}\")", c_core_authority(&dirs.csi_sock));
        assert!(front_log.contains(&why), "front.log lacks h2's {why:?}:\n{front_log}");

        // With ("grpc.default_authority", "localhost"): real answers.
        let probe = result(&lines, "Probe", true);
        assert_eq!(probe["ok"]["ready"], true, "Probe (ready only when the host answers): {probe}");
        let info = result(&lines, "GetPluginInfo", true);
        assert_eq!(info["ok"]["name"], "csi.mounthost.dev", "{info}");
        assert_eq!(info["ok"]["vendor_version"], env!("CARGO_PKG_VERSION"), "{info}");
        let health = result(&lines, "Health", true);
        assert_eq!(health["ok"]["node_id"], "node-1", "{health}");
        assert_eq!(health["ok"]["version"], env!("CARGO_PKG_VERSION"), "{health}");
        assert_eq!(health["ok"]["volumes"], 0, "{health}");
    });
}

/// Every RPC the driver advertises (Identity; Controller and Node per their capabilities): the
/// script prints `checked: grpcio <RPC>: ...` for each, and one missing fails the test.
const CYCLE_RPCS: &[&str] = &[
    "GetPluginInfo",
    "GetPluginCapabilities",
    "Probe",
    "ControllerGetCapabilities",
    "CreateVolume",
    "ValidateVolumeCapabilities",
    "ListVolumes",
    "GetCapacity",
    "ControllerExpandVolume",
    "DeleteVolume",
    "NodeGetCapabilities",
    "NodeGetInfo",
    "NodeStageVolume",
    "NodePublishVolume",
    "NodeGetVolumeStats",
    "NodeExpandVolume",
    "NodeUnpublishVolume",
    "NodeUnstageVolume",
];

#[test]
fn python_grpcio_drives_a_seaweedfs_volume_through_every_advertised_rpc() {
    if !in_private_namespace("python_grpcio_drives_a_seaweedfs_volume_through_every_advertised_rpc") {
        return;
    }
    let weed = Seaweed::start();
    let dirs = NodeDirs::new();
    let program = format!("--program=weed={}", common::weed_binary().display());
    // ListVolumes carries no StorageClass: the filers it lists are the node's grants.
    let grant = format!("--grant=seaweedfs:host={}", weed.filer);
    let _host = dirs.start_host(std::slice::from_ref(&program));
    let _front = dirs.start_front(&[program, grant]);
    guarded(&dirs, || {
        let name = "pvc-grpcio";
        let staging = dirs.staging(name);
        let target = dirs.target("pod-grpcio", name);
        let nothing = dirs.target("pod-without-volumes", name);
        let stubs = tempfile::tempdir().unwrap();
        let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/grpc_clients.py");
        let started = Instant::now();
        let out = Command::new(python())
            .arg(&script)
            .arg("cycle")
            .arg(&proto)
            .arg(stubs.path())
            .arg(&dirs.csi_sock)
            .args(["--filer", &weed.filer, "--master", &weed.master(), "--name", name])
            .arg("--staging")
            .arg(&staging)
            .arg("--target")
            .arg(&target)
            .arg("--nothing")
            .arg(&nothing)
            .args(["--node-id", "node-1", "--version", env!("CARGO_PKG_VERSION")])
            .output()
            .expect("running the venv's python");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        println!("{stdout}");
        assert!(out.status.success(), "the Python client's cycle failed:\n{stdout}\n{stderr}");
        let missing: Vec<&str> = CYCLE_RPCS
            .iter()
            .copied()
            .filter(|rpc| !stdout.lines().any(|l| l.starts_with(&format!("checked: grpcio {rpc}: "))))
            .collect();
        assert!(missing.is_empty(), "the script checked no answer of {missing:?}:\n{stdout}");
        assert!(stdout.lines().any(|l| l == "cycle: done"), "the script stopped early:\n{stdout}\n{stderr}");

        // What the cycle left, seen from here: nothing mounted, no weed mount, no volume directory.
        let mounted = common::mounts_below(dirs.root.path());
        assert!(mounted.is_empty(), "still mounted after NodeUnstageVolume: {mounted:?}");
        let weeds = pids_with(&format!("-dir={}", staging.display()));
        assert!(weeds.is_empty(), "weed mount still runs after NodeUnstageVolume: {weeds:?}");
        assert!(!weed.dir_exists(&format!("/buckets/{name}")), "the volume's directory outlived DeleteVolume");
        println!(
            "checked: grpcio {} drove {} RPCs through a SeaweedFS volume's life in {:?}",
            stdout.lines().find_map(|l| l.strip_prefix("grpcio ")).unwrap_or("?"),
            CYCLE_RPCS.len(),
            started.elapsed()
        );
    });
}
