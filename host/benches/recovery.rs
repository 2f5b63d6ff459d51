//! Recovery benchmark: `cargo bench -p mounthost --bench recovery` (root; runs in a private
//! mount namespace).
//!
//! Starts the real `mounthost host` binary, stages 1,000 volumes with the `tmpfs` test plugin
//! (so this measures mounthost, not a backend), kills the daemon with SIGKILL and starts it
//! again. Printed: time from start to answering requests (reconciliation of every state file
//! against mountinfo and /proc included) and the daemon's RSS, next to the same daemon started
//! on an empty state directory in the same run. `MOUNTHOST_BENCH_VOLUMES` changes the count.
//!
//! `MOUNTHOST_BENCH_PLUGIN=bindfs` stages real FUSE processes instead (`bindfs`, one per volume,
//! each in its cgroup), so re-adoption checks 1,000 live processes (pid, start time,
//! executable) and the supervisor watches 1,000 pidfds; it also prints the daemon's CPU time
//! over 5 s of idle supervision afterwards.

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

/// The test plugin to stage with: `tmpfs` (kernel mounts only) or `bindfs` (FUSE processes).
fn plugin() -> String {
    std::env::var("MOUNTHOST_BENCH_PLUGIN").unwrap_or_else(|_| "tmpfs".into())
}

/// The host's cgroup parent for this run (removed at the end).
fn cgroup_parent() -> String {
    format!("mounthost-bench-{}", std::process::id())
}

/// CPU time (user + system) of `pid` so far, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    // After the command name: field 3 is index 0; utime (14) and stime (15) are 11 and 12.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
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
        .args(["--grant", "tmpfs:fstype=tmpfs", "--grant", "bindfs:fstype=fuse,bindfs:program=bindfs"])
        .args(["--program", "bindfs=/usr/bin/bindfs"])
        .args(["--cgroup-parent", &cgroup_parent(), "--log", "warn", "host"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let daemon = Daemon(child);
    loop {
        if std::os::unix::net::UnixStream::connect(&sock).is_ok() {
            let mut client = HostClient::new(mounthost::unpriv::grpc::channel(&sock));
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
    let plugin = plugin();
    std::fs::copy(mounthost::stock::fixtures::path(&plugin), root.join("plugins").join(format!("{plugin}.wasm")))
        .unwrap();

    let (empty, empty_ready, empty_rss) = start(root).await;
    let client = HostClient::new(mounthost::unpriv::grpc::channel(&root.join("host.sock")));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for chunk in (0..n).collect::<Vec<_>>().chunks(n.div_ceil(16).max(1)) {
        let (client, root, chunk, plugin) = (client.clone(), root.to_path_buf(), chunk.to_vec(), plugin.clone());
        tasks.push(tokio::spawn(async move {
            let mut client = client;
            for v in chunk {
                let staging = root.join(format!("kubelet/plugins/kubernetes.io/csi/csi.mounthost.dev/{v}/globalmount"));
                std::fs::create_dir_all(&staging).unwrap();
                let req = csi::NodeStageVolumeRequest {
                    volume_id: format!("{plugin}~vol-{v}"),
                    staging_target_path: staging.display().to_string(),
                    volume_capability: Some(csi::VolumeCapability {
                        access_mode: Some(csi::volume_capability::AccessMode { mode: 1 }),
                        access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
                    }),
                    volume_context: if plugin == "tmpfs" {
                        [("plugin".to_string(), plugin.clone()), ("sizeMiB".into(), "1".into())].into()
                    } else {
                        [("plugin".to_string(), plugin.clone())].into()
                    },
                    ..Default::default()
                };
                client.node_stage_volume(req).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    println!("staged {n} {plugin} volumes in {:.2} s", started.elapsed().as_secs_f64());
    drop(empty); // SIGKILL: mounts stay, state files stay.

    let (full, ready, rss) = start(root).await;
    let listed = HostClient::new(mounthost::unpriv::grpc::channel(&root.join("host.sock")))
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
    if plugin == "bindfs" {
        let pid = full.0.id();
        let before = cpu_ticks(pid);
        tokio::time::sleep(Duration::from_secs(5)).await;
        let ticks = cpu_ticks(pid) - before;
        let hz = 100.0; // USER_HZ on Linux
        println!(
            "idle supervision of {n} FUSE processes: {:.1} % of one core ({ticks} ticks in 5 s)",
            ticks as f64 / hz / 5.0 * 100.0
        );
    }
    drop(full);
    // The FUSE processes outlive the daemon by design: kill them with their groups.
    let cgroups = mounthost::exec::instance::daemon_cgroups(&root.join("state"), &cgroup_parent());
    for group in cgroups.groups().unwrap_or_default() {
        let _ = cgroups.release(&group);
    }
    cgroups.remove_parent();
    common::unmount_below(root);
    common::remove_fuse_files_dir(&root.join("state"));
}
