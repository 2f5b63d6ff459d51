//! What a program's rule set and its own mount namespace cost a stage:
//! `cargo bench -p mounthost --bench confine` (root; runs in a private mount namespace).
//!
//! Starts the real `mounthost host` twice on the same node: with the defaults (each program
//! under its built-in rule set, each FUSE program in a mount namespace of its own), then with
//! both off (`--confine-programs=false`, `--program-rules PROGRAM=none`). Each stages and
//! unstages the same volumes one after the other: `bindfs` volumes of the `bindfs` test plugin
//! (a FUSE process per volume, cheap: this measures mounthost) and, when SeaweedFS's `weed` is
//! at hand (`MOUNTHOST_WEED`, `.local/venv/bin/weed` or PATH), `weed mount` volumes of the
//! stock plugin against a SeaweedFS started here. Printed for each: the stage's median and
//! 90th percentile with both on and both off, and their ratio. The two daemons alternate by
//! round, so a machine that slows down meanwhile slows both. `MOUNTHOST_BENCH_STAGES` changes
//! the number of stages per daemon (default 40 bindfs, a quarter of it weed).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mounthost::proto::csi;
use mounthost::proto::host::HealthRequest;
use mounthost::proto::host::host_client::HostClient;
use mounthost::unpriv::grpc::UnixChannel;

fn stages() -> usize {
    std::env::var("MOUNTHOST_BENCH_STAGES").ok().and_then(|v| v.parse().ok()).unwrap_or(40)
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The `weed` to use, if any.
fn weed() -> Option<PathBuf> {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.local/venv/bin/weed");
    std::env::var_os("MOUNTHOST_WEED").map(PathBuf::from).or_else(|| venv.is_file().then_some(venv)).or_else(|| {
        std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join("weed")).find(|w| w.is_file()))
    })
}

/// A SeaweedFS server (master, volume, filer) on free ports; its filer's address.
fn seaweed(dir: &Path, weed: &Path) -> (Child, String) {
    let port = |()| std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let filer = loop {
        let p = port(());
        if p < 55_000 && std::net::TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok() {
            break p;
        }
    };
    let (master, volume) = (port(()), port(()));
    std::fs::create_dir_all(dir.join("data")).unwrap();
    let child = Command::new(weed)
        .args(["-logtostderr", "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1"])
        .arg(format!("-dir={}", dir.join("data").display()))
        .arg(format!("-master.port={master}"))
        .arg(format!("-master.port.grpc={}", master + 10_000))
        .args(["-master.telemetry=false", "-master.resumeState=false", "-master.volumeSizeLimitMB=1024"])
        .arg(format!("-volume.port={volume}"))
        .arg(format!("-volume.port.grpc={}", volume + 10_000))
        .args(["-volume.max=0", "-volume.minFreeSpace=64MiB", "-filer"])
        .arg(format!("-filer.port={filer}"))
        .arg(format!("-filer.port.grpc={}", filer + 10_000))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let address = format!("127.0.0.1:{filer}");
    let started = Instant::now();
    // Ready once a directory can be made through the filer's HTTP API.
    while Command::new("curl")
        .args(["-sf", "-o", "/dev/null", "-X", "POST", &format!("http://{address}/buckets/bench/")])
        .status()
        .map_or(true, |s| !s.success())
    {
        assert!(started.elapsed() < Duration::from_secs(60), "weed server did not come up");
        std::thread::sleep(Duration::from_millis(200));
    }
    (child, address)
}

async fn start(root: &Path, name: &str, extra: &[String]) -> (Daemon, HostClient<UnixChannel>) {
    let sock = root.join(format!("{name}.sock"));
    let child = Command::new(env!("CARGO_BIN_EXE_mounthost"))
        .arg("--state-dir")
        .arg(root.join(name))
        .arg("--kubelet-dir")
        .arg(root.join("kubelet"))
        .arg("--host-socket")
        .arg(&sock)
        .arg("--plugin-dir")
        .arg(root.join("plugins"))
        .args(["--grant", "bindfs:fstype=fuse,bindfs:program=bindfs", "--program", "bindfs=/usr/bin/bindfs"])
        .args(extra)
        .args(["--cgroup-parent", &format!("mounthost-bench-{}-{name}", std::process::id()), "--log", "warn", "host"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let daemon = Daemon(child);
    let started = Instant::now();
    loop {
        if std::os::unix::net::UnixStream::connect(&sock).is_ok() {
            let mut client = HostClient::new(mounthost::unpriv::grpc::channel(&sock));
            if client.health(HealthRequest {}).await.is_ok() {
                return (daemon, client);
            }
        }
        assert!(started.elapsed() < Duration::from_secs(60), "the daemon did not come up");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Stage volume `id` at a fresh staging path below `kubelet`, then unstage it; the stage's time.
async fn stage_once(
    client: &mut HostClient<UnixChannel>,
    kubelet: &Path,
    id: &str,
    context: &[(&str, &str)],
) -> Duration {
    let staging = kubelet.join(format!("plugins/kubernetes.io/csi/csi.mounthost.dev/{id}/globalmount"));
    std::fs::create_dir_all(&staging).unwrap();
    let req = csi::NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(csi::VolumeCapability {
            access_mode: Some(csi::volume_capability::AccessMode { mode: 5 }),
            access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
        }),
        volume_context: context.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..Default::default()
    };
    let started = Instant::now();
    client.node_stage_volume(req).await.unwrap_or_else(|e| panic!("staging {id}: {e:?}"));
    let took = started.elapsed();
    let unstage =
        csi::NodeUnstageVolumeRequest { volume_id: id.into(), staging_target_path: staging.display().to_string() };
    client.node_unstage_volume(unstage).await.unwrap();
    took
}

fn quantile(mut v: Vec<Duration>, q: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn report(what: &str, on: Vec<Duration>, off: Vec<Duration>) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (on50, off50) = (quantile(on.clone(), 0.5), quantile(off.clone(), 0.5));
    let (on90, off90) = (quantile(on, 0.9), quantile(off, 0.9));
    println!(
        "{what}: rules and namespace on: median {:.1} ms, p90 {:.1} ms; off: median {:.1} ms, p90 {:.1} ms; on/off = {:.2}x (median), {:.2}x (p90)",
        ms(on50),
        ms(on90),
        ms(off50),
        ms(off90),
        ms(on50) / ms(off50),
        ms(on90) / ms(off90)
    );
}

fn main() {
    common::enter_private_namespace();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(run());
}

async fn run() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let kubelet = root.join("kubelet");
    std::fs::create_dir_all(&kubelet).unwrap();
    std::fs::create_dir_all(root.join("plugins")).unwrap();
    std::fs::copy(mounthost::stock::fixtures::path("bindfs"), root.join("plugins/bindfs.wasm")).unwrap();
    let weed = weed();
    let server = weed.as_ref().map(|w| seaweed(&root.join("seaweed"), w));
    let mut shared: Vec<String> = Vec::new();
    if let (Some(weed), Some((_, filer))) = (&weed, &server) {
        shared.extend([format!("--program=weed={}", weed.display()), format!("--grant=seaweedfs:host={filer}")]);
    }
    let off = [
        shared.clone(),
        vec![
            "--confine-programs=false".into(),
            "--program-rules=bindfs=none".into(),
            "--program-rules=weed=none".into(),
        ],
    ]
    .concat();
    let (_on_daemon, mut on) = start(root, "on", &shared).await;
    let (_off_daemon, mut plain) = start(root, "off", &off).await;
    let n = stages();
    let (mut bindfs_on, mut bindfs_off) = (Vec::new(), Vec::new());
    for i in 0..n {
        bindfs_on.push(stage_once(&mut on, &kubelet, &format!("bindfs~on-{i}"), &[("plugin", "bindfs")]).await);
        bindfs_off.push(stage_once(&mut plain, &kubelet, &format!("bindfs~off-{i}"), &[("plugin", "bindfs")]).await);
    }
    report(&format!("bindfs stage ({n} each)"), bindfs_on, bindfs_off);
    if let Some((mut server, filer)) = server {
        let (mut weed_on, mut weed_off) = (Vec::new(), Vec::new());
        let m = (n / 4).max(3);
        for i in 0..m {
            for (client, tag, into) in [(&mut on, "on", &mut weed_on), (&mut plain, "off", &mut weed_off)] {
                let path = format!("/buckets/bench{tag}{i}");
                let made = Command::new("curl")
                    .args(["-sf", "-o", "/dev/null", "-X", "POST", &format!("http://{filer}{path}/")])
                    .status()
                    .unwrap();
                assert!(made.success(), "making {path} in the filer");
                let ctx = [("plugin", "seaweedfs"), ("filer", filer.as_str()), ("path", path.as_str())];
                into.push(stage_once(client, &kubelet, &format!("seaweedfs~{tag}-{i}"), &ctx).await);
            }
        }
        report(&format!("weed mount stage ({m} each)"), weed_on, weed_off);
        let _ = server.kill();
        let _ = server.wait();
    } else {
        println!("weed mount stage: skipped (no weed binary; set MOUNTHOST_WEED)");
    }
    for name in ["on", "off"] {
        let cgroups = mounthost::exec::instance::daemon_cgroups(
            &root.join(name),
            &format!("mounthost-bench-{}-{name}", std::process::id()),
        );
        for group in cgroups.groups().unwrap_or_default() {
            let _ = cgroups.release(&group);
        }
        cgroups.remove_parent();
        common::remove_fuse_files_dir(&root.join(name));
    }
    common::unmount_below(root);
}
