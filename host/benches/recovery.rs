//! Recovery benchmark: `cargo bench -p mounthost --bench recovery` (root; runs in a private
//! mount namespace).
//!
//! Starts the real `mounthost host` binary, stages 1,000 volumes with the `tmpfs` test plugin
//! (so this measures mounthost, not a backend), kills the daemon with SIGKILL and starts it
//! again. Printed: time from start to answering requests (reconciliation of every state file
//! against mountinfo and /proc included) and the daemon's RSS, next to the same daemon started
//! on an empty state directory in the same run. `MOUNTHOST_BENCH_VOLUMES` changes the count.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mounthost::proto::csi;
use mounthost::proto::host::host_client::HostClient;
use mounthost::proto::host::{HealthRequest, ListVolumesRequest};

fn volumes() -> usize {
    std::env::var("MOUNTHOST_BENCH_VOLUMES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000)
}

fn main() {
    common::enter_private_namespace();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(run());
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start the daemon; returns it, the time until Health answered, and its RSS then.
async fn start(root: &Path) -> (Daemon, Duration, u64) {
    let sock = root.join("host.sock");
    let started = Instant::now();
    let child = Command::new(env!("CARGO_BIN_EXE_mounthost"))
        .arg("--state-dir")
        .arg(root.join("state"))
        .arg("--kubelet-dir")
        .arg(root.join("kubelet"))
        .arg("--host-socket")
        .arg(&sock)
        .arg("--plugin-dir")
        .arg(root.join("plugins"))
        .args(["--grant", "tmpfs:fstype=tmpfs", "--log", "warn", "host"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let daemon = Daemon(child);
    loop {
        if std::os::unix::net::UnixStream::connect(&sock).is_ok() {
            let mut client = HostClient::new(mounthost::grpc::channel(&sock));
            if client.health(HealthRequest {}).await.is_ok() {
                break;
            }
        }
        assert!(started.elapsed() < Duration::from_secs(60), "the daemon did not come up");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let ready = started.elapsed();
    let rss = rss_kib(daemon.0.id());
    (daemon, ready, rss)
}

async fn run() {
    let n = volumes();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("kubelet")).unwrap();
    std::fs::create_dir_all(root.join("plugins")).unwrap();
    std::fs::copy(mounthost::stock::fixtures::path("tmpfs"), root.join("plugins/tmpfs.wasm")).unwrap();

    let (empty, empty_ready, empty_rss) = start(root).await;
    let client = HostClient::new(mounthost::grpc::channel(&root.join("host.sock")));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for chunk in (0..n).collect::<Vec<_>>().chunks(n.div_ceil(16).max(1)) {
        let (client, root, chunk) = (client.clone(), root.to_path_buf(), chunk.to_vec());
        tasks.push(tokio::spawn(async move {
            let mut client = client;
            for v in chunk {
                let staging = root.join(format!("kubelet/plugins/kubernetes.io/csi/csi.mounthost.dev/{v}/globalmount"));
                std::fs::create_dir_all(&staging).unwrap();
                let req = csi::NodeStageVolumeRequest {
                    volume_id: format!("tmpfs~vol-{v}"),
                    staging_target_path: staging.display().to_string(),
                    volume_capability: Some(csi::VolumeCapability {
                        access_mode: Some(csi::volume_capability::AccessMode { mode: 1 }),
                        access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
                    }),
                    volume_context: [("plugin".to_string(), "tmpfs".to_string()), ("sizeMiB".into(), "1".into())]
                        .into(),
                    ..Default::default()
                };
                client.node_stage_volume(req).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    println!("staged {n} volumes in {:.2} s", started.elapsed().as_secs_f64());
    drop(empty); // SIGKILL: mounts stay, state files stay.

    let (full, ready, rss) = start(root).await;
    let listed = HostClient::new(mounthost::grpc::channel(&root.join("host.sock")))
        .list_volumes(ListVolumesRequest {})
        .await
        .unwrap()
        .into_inner()
        .volumes;
    let healthy = listed.iter().filter(|v| v.healthy).count();
    println!(
        "baseline: start on an empty state dir        ready {:>7.1} ms   RSS {:>6.1} MiB",
        empty_ready.as_secs_f64() * 1e3,
        empty_rss as f64 / 1024.0
    );
    println!(
        "restart after SIGKILL with {n} staged volumes  ready {:>7.1} ms   RSS {:>6.1} MiB   ({healthy}/{} re-adopted healthy)",
        ready.as_secs_f64() * 1e3,
        rss as f64 / 1024.0,
        listed.len()
    );
    println!(
        "ratio ready time / empty start = {:.1}x (target ≤ 1 s absolute); RSS target ≤ 64 MiB",
        ready.as_secs_f64() / empty_ready.as_secs_f64()
    );
    drop(full);
    common::unmount_below(root);
}
