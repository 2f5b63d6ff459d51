//! NodePublishVolume benchmark: `cargo bench -p mounthost --bench publish` (root; it re-runs
//! itself in a private mount namespace, so nothing it mounts is visible outside).
//!
//! The host daemon and the CSI front (node mode) run in this process on their real unix
//! sockets; every publish goes kubelet → front → host → plugin → policy → bind(2) → state file
//! replaced atomically, and back. A tmpfs test plugin stages the volumes, so this measures mounthost, not a
//! backend. Printed, each against baselines measured in the same run:
//! 1. publish latency p50/p99 over 500 publishes of one staged volume into fresh targets,
//!    vs the raw bind syscall and vs `mount --bind` run as a child process (what drivers built
//!    on the common Go mount library do), with and without the `mkdir` of the target; the child
//!    baselines are measured in a helper process, interleaved with the publishes; before each
//!    publish this process times a `mkdir` beside its target (what creating a target costs on
//!    that filesystem then); then the same publishes back to back, without the child runs
//!    between them, and the same each after the CPUs idled as long as the two child runs take
//!    (no child run), as references; and what a round trip to a thread on another CPU costs on
//!    this machine, busy and after the same idle time;
//! 2. 200 concurrent publishes of 200 distinct staged volumes (errors, wall time) vs the same
//!    publishes one by one.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mounthost::config::Config;
use mounthost::daemon::Node;
use mounthost::exec::Linux;
use mounthost::front::{self, Mode};
use mounthost::plan::policy::Grant;
use mounthost::plugin::PluginRuntime;
use mounthost::proto::csi;
use mounthost::proto::csi::node_client::NodeClient;
use mounthost::unpriv::grpc::UnixChannel;

fn iterations() -> usize {
    std::env::var("MOUNTHOST_BENCH_PUBLISHES").ok().and_then(|v| v.parse().ok()).unwrap_or(500)
}

/// Set in the helper process that runs the child-process baselines (see [`ChildBaselines`]).
const HELPER: &str = "MOUNTHOST_BENCH_CHILD_HELPER";

fn main() {
    common::enter_private_namespace();
    if let Some(base) = std::env::var_os(HELPER) {
        return child_helper(Path::new(&base));
    }
    if let Ok(filter) = std::env::var("MOUNTHOST_BENCH_LOG") {
        mounthost::telemetry::init(mounthost::telemetry::LogFormat::Text, &filter);
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(run());
}

fn capability() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: csi::volume_capability::access_mode::Mode::SingleNodeMultiWriter as i32,
        }),
        access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
    }
}

fn ctx() -> std::collections::HashMap<String, String> {
    [("plugin".to_string(), "tmpfs".to_string()), ("sizeMiB".into(), "1".into())].into()
}

fn publish(id: &str, staging: &Path, target: &Path) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(capability()),
        volume_context: ctx(),
        ..Default::default()
    }
}

/// Publish the staged volume `bench-0` at `target`, then unpublish it: the publish's time.
async fn publish_then_unpublish(client: &NodeClient<UnixChannel>, staging: &Path, target: &Path) -> Duration {
    let started = Instant::now();
    client.clone().node_publish_volume(publish("bench-0", staging, target)).await.unwrap();
    let took = started.elapsed();
    let unpublish =
        csi::NodeUnpublishVolumeRequest { volume_id: "bench-0".into(), target_path: target.display().to_string() };
    client.clone().node_unpublish_volume(unpublish).await.unwrap();
    took
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn summary(name: &str, mut v: Vec<Duration>) -> Duration {
    v.sort();
    let (p50, p99) = (pct(&v, 0.5), pct(&v, 0.99));
    println!("{name:<44} p50 {:>9.1} µs   p99 {:>9.1} µs", p50.as_secs_f64() * 1e6, p99.as_secs_f64() * 1e6);
    p50
}

async fn run() {
    let root = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(root.path()).unwrap();
    let kubelet = base.join("kubelet");
    let state = base.join("state");
    let plugins = root.path().join("plugins");
    std::fs::create_dir_all(&kubelet).unwrap();
    std::fs::create_dir_all(&state).unwrap();
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::copy(mounthost::stock::fixtures::path("tmpfs"), plugins.join("tmpfs.wasm")).unwrap();
    let n = iterations();
    // In-process baselines first: a bind of a tmpfs like the one the plugin stages. The
    // child-process baselines run in a helper process started now, before the daemon runs in
    // this one (its reaper waits for every child of the process, `mount` included), and are
    // measured interleaved with the publishes, so both see the same machine.
    let (raw, floor) = baselines(&base, n);
    let mut helper = ChildBaselines::start(&base.join("baseline"));
    let mut cfg = Config::new(state.clone());
    cfg.kubelet_dir = kubelet.clone();
    cfg.plugin_dir = plugins;
    cfg.cgroup_parent = "mounthost-bench".into();
    cfg.grants.insert("tmpfs".into(), Grant { fstypes: ["tmpfs".to_string()].into(), ..Grant::default() });
    let runtime = Arc::new(PluginRuntime::new(cfg.runtime()).unwrap());
    let node = Node::new(
        cfg.clone(),
        runtime,
        Arc::new(Linux::new(
            mounthost::exec::cgroup::Cgroups::detect(&cfg.own_cgroup_parent()),
            [state.clone(), kubelet.clone()],
        )),
    )
    .unwrap();
    let host_sock = root.path().join("host.sock");
    let csi_sock = root.path().join("csi.sock");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (mut r1, mut r2) = (stop_rx.clone(), stop_rx);
    let hs = host_sock.clone();
    let host_task = tokio::spawn(async move {
        mounthost::daemon::service::serve(node, &hs, async move {
            let _ = r1.changed().await;
        })
        .await
    });
    wait(&host_sock).await;
    let host = front::Host::new(mounthost::unpriv::grpc::channel(&host_sock));
    let cs = csi_sock.clone();
    let front_task = tokio::spawn(async move {
        front::serve(Mode::Node, &cs, Some(host), None, async move {
            let _ = r2.changed().await;
        })
        .await
    });
    wait(&csi_sock).await;
    let client = NodeClient::new(mounthost::unpriv::grpc::channel(&csi_sock));

    // One staged volume.
    let stage = |id: &str, staging: &Path| csi::NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(capability()),
        volume_context: ctx(),
        ..Default::default()
    };
    let staging = kubelet.join("plugins/kubernetes.io/csi/csi.mounthost.dev/bench/globalmount");
    std::fs::create_dir_all(&staging).unwrap();
    client.clone().node_stage_volume(stage("bench-0", &staging)).await.unwrap();
    let target = |i: usize| -> PathBuf {
        let parent = kubelet.join(format!("pods/pod-{i}/volumes/kubernetes.io~csi/pv"));
        std::fs::create_dir_all(&parent).unwrap();
        parent.join("mount")
    };
    // Warm up (plugin instance pool, connections).
    for i in 0..20 {
        publish_then_unpublish(&client, &staging, &target(i)).await;
    }

    // Where the time of a call goes besides the work: one gRPC hop (answered by the front) and two
    // (the front asks the host daemon).
    let (mut one_hop, mut two_hops) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let started = Instant::now();
        client.clone().node_get_capabilities(csi::NodeGetCapabilitiesRequest {}).await.unwrap();
        one_hop.push(started.elapsed());
        let started = Instant::now();
        client.clone().node_get_info(csi::NodeGetInfoRequest {}).await.unwrap();
        two_hops.push(started.elapsed());
    }
    println!("NodePublishVolume after stage, {n} publishes (front → host → plugin → bind → state file replaced)");
    let mut ours = Vec::with_capacity(n);
    let (mut child, mut mkdir_child) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let mut mkdir = Vec::with_capacity(n);
    for i in 0..n {
        child.push(helper.time("bind", i));
        mkdir_child.push(helper.time("mkdir-bind", i));
        let t = target(i);
        // What creating the target costs on this filesystem, right now: a sibling of it.
        let sibling = t.with_file_name("sibling");
        let started = Instant::now();
        std::fs::create_dir(&sibling).unwrap();
        mkdir.push(started.elapsed());
        ours.push(publish_then_unpublish(&client, &staging, &t).await);
    }
    // The same publishes back to back, with no child process run between them: what the
    // interleaved runs above lose to caches and predictors the child evicts and to waking idle
    // CPUs (the target's ratio is the interleaved one).
    let mut warm = Vec::with_capacity(n);
    for i in 0..n {
        warm.push(publish_then_unpublish(&client, &staging, &target(n + i)).await);
    }
    // The same again, each after the CPUs were left idle for as long as the two child runs of a
    // round take (the sum of their p50s), with no child run: which of the two the interleaved
    // runs lose to.
    let idle_for = median(&child) + median(&mkdir_child);
    let mut idle = Vec::with_capacity(n);
    for i in 0..n {
        std::thread::sleep(idle_for);
        idle.push(publish_then_unpublish(&client, &staging, &target(2 * n + i)).await);
    }
    let p_ours = summary("mounthost NodePublishVolume", ours);
    let p_warm = summary("reference: the same, back to back", warm);
    let idle_ms = idle_for.as_secs_f64() * 1e3;
    let p_idle = summary(&format!("reference: the same, each after {idle_ms:.1} ms idle"), idle);
    summary("reference: NodeGetCapabilities (front only)", one_hop);
    summary("reference: NodeGetInfo (front → host)", two_hops);
    summary("reference: mkdir beside each target", mkdir);
    let p_floor = summary("reference: fsync'd atomic write of 2 KiB", floor);
    let p_raw = summary("baseline: bind syscall", raw);
    let p_child = summary("baseline: `mount --bind` child process", child);
    let p_mkdir_child = summary("baseline: mkdir + `mount --bind` child", mkdir_child);
    println!(
        "ratio p50 mounthost / child process = {:.2} (target ≤ 0.4); mounthost / raw syscall = {:.0}x",
        p_ours.as_secs_f64() / p_child.as_secs_f64(),
        p_ours.as_secs_f64() / p_raw.as_secs_f64()
    );
    println!(
        "ratio p50 mounthost / (mkdir + child process) = {:.2} (both create the target)",
        p_ours.as_secs_f64() / p_mkdir_child.as_secs_f64()
    );
    println!(
        "ratio p50 back-to-back mounthost / child process = {:.2} (not the target's measure: no child runs between)",
        p_warm.as_secs_f64() / p_child.as_secs_f64()
    );
    println!(
        "ratio p50 after-idle mounthost / child process = {:.2} (no child runs between, the CPUs idle as long)",
        p_idle.as_secs_f64() / p_child.as_secs_f64()
    );
    match cross_cpu_wake(n, idle_for) {
        Some((busy, after_idle)) => println!(
            "this machine: a round trip to a thread on another CPU (socket pair, both pinned) p50 {:.1} µs busy, {:.1} µs \
             after {idle_ms:.1} ms idle; a call here crosses threads several times",
            busy.as_secs_f64() * 1e6,
            after_idle.as_secs_f64() * 1e6
        ),
        None => println!("this machine: fewer than two usable CPUs (or no affinity), no cross-CPU wake-up measured"),
    }
    println!(
        "an fsync'd state write would add about {:.1} µs to the p50 (ratio then {:.2})",
        p_floor.as_secs_f64() * 1e6,
        (p_ours.as_secs_f64() + p_floor.as_secs_f64()) / p_child.as_secs_f64()
    );

    // 200 distinct volumes, staged, then published all at once vs one by one.
    let volumes = 200;
    let mut vols = Vec::new();
    for v in 0..volumes {
        let id = format!("bench-v{v}");
        let s = kubelet.join(format!("plugins/kubernetes.io/csi/csi.mounthost.dev/v{v}/globalmount"));
        std::fs::create_dir_all(&s).unwrap();
        client.clone().node_stage_volume(stage(&id, &s)).await.unwrap();
        let parent = kubelet.join(format!("pods/cpod-{v}/volumes/kubernetes.io~csi/pv"));
        std::fs::create_dir_all(&parent).unwrap();
        vols.push((id, s, parent.join("mount")));
    }
    let unpublish_all = |vols: Vec<(String, PathBuf, PathBuf)>| {
        let client = client.clone();
        async move {
            for (id, _, t) in &vols {
                client
                    .clone()
                    .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                        volume_id: id.clone(),
                        target_path: t.display().to_string(),
                    })
                    .await
                    .unwrap();
            }
        }
    };
    let started = Instant::now();
    let mut serial_errors = 0;
    for (id, s, t) in &vols {
        if client.clone().node_publish_volume(publish(id, s, t)).await.is_err() {
            serial_errors += 1;
        }
    }
    let serial = started.elapsed();
    unpublish_all(vols.clone()).await;
    let started = Instant::now();
    let tasks: Vec<_> = vols
        .iter()
        .map(|(id, s, t)| {
            let mut c = client.clone();
            let req = publish(id, s, t);
            tokio::spawn(async move { c.node_publish_volume(req).await })
        })
        .collect();
    let mut errors = 0;
    for t in tasks {
        if !matches!(t.await, Ok(Ok(_))) {
            errors += 1;
        }
    }
    let concurrent = started.elapsed();
    let published = mounthost::exec::mountinfo::read()
        .unwrap()
        .iter()
        .filter(|m| m.mount_point.starts_with(kubelet.join("pods")))
        .count();
    println!(
        "{volumes} distinct volumes: concurrent {:.1} ms ({errors} errors, {published} targets mounted), serial {:.1} ms ({serial_errors} errors); throughput concurrent/serial = {:.2}x",
        concurrent.as_secs_f64() * 1e3,
        serial.as_secs_f64() * 1e3,
        serial.as_secs_f64() / concurrent.as_secs_f64()
    );
    unpublish_all(vols.clone()).await;
    let _ = stop_tx.send(true);
    let _ = host_task.await;
    let _ = front_task.await;
    common::unmount_below(root.path());
}

/// The p50 of `v`.
fn median(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    pct(&v, 0.5)
}

/// What waking a thread on another CPU costs on this machine, busy and after `idle`: p50 of
/// `n` one-byte round trips over a socket pair between two threads pinned to two CPUs this
/// process may use (`None` with fewer than two, or when the affinity cannot be read). On a
/// virtual machine an idle virtual CPU is halted, and waking it goes through the hypervisor.
fn cross_cpu_wake(n: usize, idle: Duration) -> Option<(Duration, Duration)> {
    use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};
    use std::io::{Read, Write};
    let allowed = sched_getaffinity(None).ok()?;
    let mut cpus = (0..CpuSet::MAX_CPU).filter(|&c| allowed.is_set(c));
    let (a, b) = (cpus.next()?, cpus.next()?);
    let pin = |cpu: usize| {
        let mut set = CpuSet::new();
        set.set(cpu);
        sched_setaffinity(None, &set).unwrap();
    };
    let (mut near, mut far) = std::os::unix::net::UnixStream::pair().unwrap();
    let echo = std::thread::spawn(move || {
        pin(b);
        let mut byte = [0u8];
        while far.read_exact(&mut byte).is_ok() {
            far.write_all(&byte).unwrap();
        }
    });
    let timed = std::thread::spawn(move || {
        pin(a);
        let mut round = |byte: &mut [u8; 1]| {
            let started = Instant::now();
            near.write_all(byte).unwrap();
            near.read_exact(byte).unwrap();
            started.elapsed()
        };
        let mut byte = [0u8];
        let busy: Vec<_> = (0..n).map(|_| round(&mut byte)).collect();
        let after_idle: Vec<_> = (0..n)
            .map(|_| {
                std::thread::sleep(idle);
                round(&mut byte)
            })
            .collect();
        (median(&busy), median(&after_idle))
    });
    let result = timed.join().unwrap();
    echo.join().unwrap();
    Some(result)
}

/// The raw bind syscall, `n` times onto fresh targets from a tmpfs; and, for reference, what
/// one fsync'd atomic write of a state-sized file (temporary file, fsync, rename, fsync of the
/// directory) costs on the state directory's filesystem. The state is not fsync'd
/// (docs/node-lifecycle.md says why); this shows what doing so would add.
fn baselines(base: &Path, n: usize) -> (Vec<Duration>, Vec<Duration>) {
    let source = base.join("baseline/raw-source");
    std::fs::create_dir_all(&source).unwrap();
    nix::mount::mount(Some("tmpfs"), &source, Some("tmpfs"), nix::mount::MsFlags::empty(), Some("size=1m")).unwrap();
    let (mut raw, mut floor) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        let t = base.join(format!("baseline/raw/pod-{i}/mount"));
        std::fs::create_dir_all(&t).unwrap();
        let started = Instant::now();
        nix::mount::mount(Some(&source), &t, None::<&str>, nix::mount::MsFlags::MS_BIND, None::<&str>).unwrap();
        raw.push(started.elapsed());
        nix::mount::umount2(&t, nix::mount::MntFlags::empty()).unwrap();
    }
    let blob = vec![b'x'; 2048];
    for _ in 0..n {
        let started = Instant::now();
        mounthost::unpriv::private_files::write_atomic(&base.join("state/floor.json"), &blob, 0o600).unwrap();
        floor.push(started.elapsed());
    }
    nix::mount::umount2(&source, nix::mount::MntFlags::empty()).unwrap();
    (raw, floor)
}

/// The child-process baselines, timed in a helper process (this benchmark re-run with
/// [`HELPER`] set; same mount namespace) that reaps its own children:
/// - `bind`: `mount --bind` as a child process onto an existing target (what drivers built on
///   the common Go mount library exec);
/// - `mkdir-bind`: `mkdir` of the target plus that child, with the target's parents made untimed
///   just before, as the publish loop does (CSI makes creating the target the driver's job, and
///   mounthost's publish includes it).
struct ChildBaselines {
    child: std::process::Child,
    to: std::process::ChildStdin,
    from: std::io::BufReader<std::process::ChildStdout>,
}

impl ChildBaselines {
    fn start(dir: &Path) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env(HELPER, dir)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let to = child.stdin.take().unwrap();
        let from = std::io::BufReader::new(child.stdout.take().unwrap());
        ChildBaselines { child, to, from }
    }

    /// One measurement, as the helper timed it.
    fn time(&mut self, what: &str, i: usize) -> Duration {
        use std::io::{BufRead, Write};
        writeln!(self.to, "{what} {i}").unwrap();
        let mut line = String::new();
        self.from.read_line(&mut line).unwrap();
        Duration::from_nanos(line.trim().parse().unwrap_or_else(|_| panic!("helper said {line:?}")))
    }
}

impl Drop for ChildBaselines {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

/// The helper's side of [`ChildBaselines`]: a tmpfs source, then one timed child per request.
fn child_helper(dir: &Path) {
    use std::io::BufRead;
    let source = dir.join("source");
    std::fs::create_dir_all(&source).unwrap();
    nix::mount::mount(Some("tmpfs"), &source, Some("tmpfs"), nix::mount::MsFlags::empty(), Some("size=1m")).unwrap();
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let (what, i) = line.split_once(' ').unwrap();
        let t = dir.join(format!("{what}/pod-{i}/volumes/kubernetes.io~csi/pv/mount"));
        std::fs::create_dir_all(t.parent().unwrap()).unwrap();
        let mkdir = what == "mkdir-bind";
        if !mkdir {
            std::fs::create_dir(&t).unwrap();
        }
        let started = Instant::now();
        if mkdir {
            std::fs::create_dir(&t).unwrap();
        }
        let st = Command::new("mount").arg("--bind").arg(&source).arg(&t).status().unwrap();
        let took = started.elapsed();
        assert!(st.success());
        nix::mount::umount2(&t, nix::mount::MntFlags::empty()).unwrap();
        println!("{}", took.as_nanos());
    }
    nix::mount::umount2(&source, nix::mount::MntFlags::MNT_DETACH).unwrap();
}

async fn wait(p: &Path) {
    for _ in 0..500 {
        if std::os::unix::net::UnixStream::connect(p).is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} never came up", p.display());
}
