//! Chaos: 50 volumes served by real FUSE processes (the `bindfs` test plugin) driven the way
//! kubelet drives them, several operations at once, every call retried until it succeeds,
//! while the host daemon and the CSI front are each killed (-9) at random moments, with calls
//! in flight, several times. At the end every volume that should be published is (and its data
//! flows between its targets and its backing directory), every one that should be gone is
//! gone, and after the final tear-down nothing is left: no mount, process, cgroup, socket,
//! state file or kept secret. Root, in a private mount namespace.
//!
//! The kill schedule comes from a seed, printed first; `MOUNTHOST_CHAOS_SEED=<n>` replays it
//! (the interleaving with the calls depends on timing, so a replay is close, not exact).

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::{NodeDirs, Proc, guarded, in_private_namespace, mounts_below, pids_of, pids_with};
use mounthost::exec::cgroup::Cgroups;
use mounthost::proto::csi;
use mounthost::proto::csi::controller_client::ControllerClient;
use mounthost::proto::csi::identity_client::IdentityClient;
use mounthost::proto::csi::node_client::NodeClient;
use mounthost::proto::host::{ListVolumesRequest, VolumeStatus, host_client::HostClient};
use mounthost::unpriv::grpc::UnixChannel;
use mounthost::unpriv::grpc::channel;
use mounthost::volume::dirs::volume_key;
use tonic::{Code, Status};

/// Volumes in the test; those with `i % 5 < 3` end published, the others end gone.
const VOLUMES: usize = 50;
/// kubelet's operation executor runs operations of different volumes at once.
const WORKERS: usize = 6;
/// Per call, like kubelet's CSI call timeout (shorter: bindfs is ready in milliseconds).
const CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// A volume that has not reached its state this long after its first attempt is stuck.
const STUCK: Duration = Duration::from_secs(40);
/// The kills, shuffled: which daemon, and which call it waits for to be in flight. The host is
/// killed while it spawns bindfs for a stage (before or after recording the process), while it
/// stops one at an unstage, or at any call; the front while it forwards. `fuse` kills the bindfs
/// of a volume that ends published (the host must restart it and re-bind its targets).
const KILLS: [(&str, Op); 14] = [
    ("host", Op::Stage),
    ("host", Op::Stage),
    ("host", Op::Unstage),
    ("host", Op::Unstage),
    ("host", Op::Any),
    ("front", Op::Stage),
    ("front", Op::Unstage),
    ("front", Op::Publish),
    ("front", Op::Any),
    ("front", Op::Any),
    ("both", Op::Stage),
    ("fuse", Op::Any),
    ("fuse", Op::Stage),
    ("fuse", Op::Any),
];

/// The calls, for counting them in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Create,
    Stage,
    Publish,
    Unpublish,
    Unstage,
    Delete,
    /// Any of them (kill targets only).
    Any,
}

/// xorshift64: the kill schedule and the backoff jitter, from the printed seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A duration in `lo..hi` milliseconds.
    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next() % (hi - lo))
    }
}

fn seed() -> u64 {
    match std::env::var("MOUNTHOST_CHAOS_SEED") {
        Ok(s) => s.trim().parse().unwrap_or_else(|_| panic!("MOUNTHOST_CHAOS_SEED={s:?} is not a number")),
        Err(_) => {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
            (now.as_nanos() as u64 ^ u64::from(std::process::id())) % 1_000_000_007
        }
    }
}

/// One volume and where it must end.
struct Vol {
    pv: String,
    /// Published at the end (else unpublished, unstaged and deleted during the chaos).
    end_published: bool,
    staging: PathBuf,
    /// Pod targets and whether each is published read-only.
    targets: Vec<(PathBuf, bool)>,
    /// Volume id and context from CreateVolume.
    created: OnceLock<(String, HashMap<String, String>)>,
}

impl Vol {
    fn id(&self) -> &str {
        &self.created.get().expect("created").0
    }
}

/// Where a kill landed.
struct Kill {
    what: &'static str,
    /// The call it waited for, and whether that call was in flight at the kill.
    target: Op,
    hit: bool,
    at: Duration,
    calls_in_flight: usize,
}

/// What the workers and the chaos thread share.
struct Shared<'a> {
    dirs: &'a NodeDirs,
    vols: Vec<Vol>,
    start: Instant,
    chaos_done: AtomicBool,
    failed: Mutex<Option<String>>,
    aborted: AtomicBool,
    calls: AtomicUsize,
    /// Calls in flight, by `Op` (`Any`: all of them).
    in_flight: [AtomicUsize; 7],
    cycles: AtomicUsize,
    /// Failed attempts that were retried, by gRPC code.
    retries: Mutex<BTreeMap<String, usize>>,
    /// Every failed attempt and every kill, with the time since the start.
    events: Mutex<Vec<String>>,
}

impl Shared<'_> {
    fn note(&self, line: String) {
        let t = self.start.elapsed().as_millis();
        self.events.lock().unwrap().push(format!("{t:>6} ms {line}"));
    }

    /// Stop everything; the first failure is the one reported.
    fn fail(&self, why: String) {
        self.note(format!("FAILED: {why}"));
        self.failed.lock().unwrap().get_or_insert(why);
        self.aborted.store(true, SeqCst);
    }

    fn in_flight(&self, op: Op) -> usize {
        self.in_flight[op as usize].load(SeqCst)
    }

    fn retried(&self) -> usize {
        self.retries.lock().unwrap().values().sum()
    }
}

/// Sets `aborted` when the thread holding it unwinds, so the others stop waiting.
struct AbortOnPanic<'a, 'b>(&'a Shared<'b>);

impl Drop for AbortOnPanic<'_, '_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.fail("a test thread panicked (see its message above)".into());
        }
    }
}

/// What kubelet retries: the daemon or the connection is away, the volume is busy, or the call
/// failed or timed out. Anything else from these well-formed calls is a wrong answer.
fn retryable(s: &Status) -> bool {
    match s.code() {
        Code::Unavailable | Code::Aborted | Code::Internal | Code::DeadlineExceeded | Code::Cancelled => true,
        // A connection cut mid-call (the process was killed) surfaces as Unknown from hyper/h2.
        Code::Unknown => {
            let m = s.message().to_lowercase();
            ["transport", "connection", "broken pipe", "h2 protocol", "stream", "reset", "closed"]
                .iter()
                .any(|w| m.contains(w))
        }
        _ => false,
    }
}

/// One CSI call through the front, on a fresh connection each attempt (kubelet dials the
/// driver per operation), retried with a short exponential backoff until it succeeds. `None`
/// when the test is aborting.
async fn call<T, Fut>(
    sh: &Shared<'_>,
    rng: &mut Rng,
    op: Op,
    what: &str,
    pv: &str,
    mut attempt: impl FnMut(UnixChannel) -> Fut,
) -> Option<T>
where
    Fut: Future<Output = Result<tonic::Response<T>, Status>>,
{
    let first = Instant::now();
    let mut backoff = Duration::from_millis(20);
    loop {
        if sh.aborted.load(SeqCst) {
            return None;
        }
        sh.calls.fetch_add(1, SeqCst);
        for counter in [op, Op::Any] {
            sh.in_flight[counter as usize].fetch_add(1, SeqCst);
        }
        let out = tokio::time::timeout(CALL_TIMEOUT, attempt(channel(&sh.dirs.csi_sock))).await;
        for counter in [op, Op::Any] {
            sh.in_flight[counter as usize].fetch_sub(1, SeqCst);
        }
        let status = match out {
            Ok(Ok(reply)) => return Some(reply.into_inner()),
            Ok(Err(s)) => s,
            Err(_) => Status::deadline_exceeded(format!("no reply within {CALL_TIMEOUT:?}")),
        };
        sh.note(format!("{pv} {what}: {:?}: {}", status.code(), status.message()));
        if !retryable(&status) {
            sh.fail(format!("{what} of {pv} answered {:?}: {}", status.code(), status.message()));
            return None;
        }
        *sh.retries.lock().unwrap().entry(format!("{:?}", status.code())).or_default() += 1;
        if first.elapsed() > STUCK {
            sh.fail(format!(
                "{what} of {pv} still fails after {STUCK:?} of retries: {:?}: {}",
                status.code(),
                status.message()
            ));
            return None;
        }
        tokio::time::sleep(backoff + rng.ms(0, 20)).await;
        backoff = (backoff * 2).min(Duration::from_millis(400));
    }
}

fn capability() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: csi::volume_capability::access_mode::Mode::SingleNodeMultiWriter as i32,
        }),
        access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
    }
}

/// CreateVolume (once), NodeStageVolume, NodePublishVolume of every target, and a file
/// written through the first target. False when aborting.
async fn bring_up(sh: &Shared<'_>, v: &Vol, rng: &mut Rng) -> bool {
    if v.created.get().is_none() {
        let req = csi::CreateVolumeRequest {
            name: v.pv.clone(),
            parameters: [("plugin".to_string(), "bindfs".to_string()), ("memoryLimitMiB".into(), "64".into())].into(),
            volume_capabilities: vec![capability()],
            ..Default::default()
        };
        let Some(out) = call(sh, rng, Op::Create, "create", &v.pv, |ch| {
            let req = req.clone();
            async move { ControllerClient::new(ch).create_volume(req).await }
        })
        .await
        else {
            return false;
        };
        let vol = out.volume.expect("CreateVolume returns a volume");
        assert_eq!(vol.volume_id, format!("bindfs~{}", v.pv));
        let _ = v.created.set((vol.volume_id, vol.volume_context));
    }
    let (id, ctx) = v.created.get().unwrap().clone();
    // kubelet makes the staging directory and each target's parent before calling.
    let staging = sh.dirs.staging(&v.pv);
    assert_eq!(staging, v.staging);
    let stage = csi::NodeStageVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: v.staging.display().to_string(),
        volume_capability: Some(capability()),
        volume_context: ctx.clone(),
        ..Default::default()
    };
    if call(sh, rng, Op::Stage, "stage", &v.pv, |ch| {
        let req = stage.clone();
        async move { NodeClient::new(ch).node_stage_volume(req).await }
    })
    .await
    .is_none()
    {
        return false;
    }
    for (t, (target, readonly)) in v.targets.iter().enumerate() {
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        let publish = csi::NodePublishVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: v.staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(capability()),
            readonly: *readonly,
            volume_context: ctx.clone(),
            ..Default::default()
        };
        if call(sh, rng, Op::Publish, &format!("publish#{t}"), &v.pv, |ch| {
            let req = publish.clone();
            async move { NodeClient::new(ch).node_publish_volume(req).await }
        })
        .await
        .is_none()
        {
            return false;
        }
    }
    // The pod writes: the FUSE mount serves it whatever happens to the daemons meanwhile. Only a
    // crash of the volume's own bindfs (a `fuse` kill) interrupts it, until the host restarts it
    // and re-binds the target (ENOTCONN in between, as a pod would see).
    let marker = v.targets[0].0.join("marker");
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        match std::fs::write(&marker, &v.pv) {
            Ok(()) => return true,
            Err(e) if e.raw_os_error() == Some(nix::errno::Errno::ENOTCONN as i32) && Instant::now() < until => {
                sh.note(format!("{}: ENOTCONN while its bindfs is restarted", v.pv));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => {
                sh.fail(format!("writing through {} of {}: {e}", v.targets[0].0.display(), v.pv));
                return false;
            }
        }
    }
}

/// NodeUnpublishVolume of every target, then NodeUnstageVolume. False when aborting.
async fn take_down(sh: &Shared<'_>, v: &Vol, rng: &mut Rng) -> bool {
    let id = v.id().to_string();
    for (t, (target, _)) in v.targets.iter().enumerate() {
        let req = csi::NodeUnpublishVolumeRequest { volume_id: id.clone(), target_path: target.display().to_string() };
        if call(sh, rng, Op::Unpublish, &format!("unpublish#{t}"), &v.pv, |ch| {
            let req = req.clone();
            async move { NodeClient::new(ch).node_unpublish_volume(req).await }
        })
        .await
        .is_none()
        {
            return false;
        }
    }
    let req =
        csi::NodeUnstageVolumeRequest { volume_id: id.clone(), staging_target_path: v.staging.display().to_string() };
    call(sh, rng, Op::Unstage, "unstage", &v.pv, |ch| {
        let req = req.clone();
        async move { NodeClient::new(ch).node_unstage_volume(req).await }
    })
    .await
    .is_some()
}

async fn delete(sh: &Shared<'_>, v: &Vol, rng: &mut Rng) -> bool {
    let req = csi::DeleteVolumeRequest { volume_id: v.id().to_string(), ..Default::default() };
    call(sh, rng, Op::Delete, "delete", &v.pv, |ch| {
        let req = req.clone();
        async move { ControllerClient::new(ch).delete_volume(req).await }
    })
    .await
    .is_some()
}

/// One of kubelet's operation workers: brings its volumes up, then, while the chaos lasts,
/// cycles its should-be-gone volumes (pods come and go), and finally takes those down for
/// good and deletes them.
fn worker(sh: &Shared<'_>, w: usize, seed: u64) {
    let _abort = AbortOnPanic(sh);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut rng = Rng::new(seed ^ (w as u64 + 1) << 32);
        let mine: Vec<&Vol> = sh.vols.iter().skip(w).step_by(WORKERS).collect();
        for v in &mine {
            if !bring_up(sh, v, &mut rng).await {
                return;
            }
        }
        let churn: Vec<&Vol> = mine.iter().copied().filter(|v| !v.end_published).collect();
        if churn.is_empty() {
            return;
        }
        loop {
            for v in &churn {
                if !take_down(sh, v, &mut rng).await {
                    return;
                }
            }
            if sh.chaos_done.load(SeqCst) {
                break;
            }
            tokio::time::sleep(rng.ms(0, 50)).await;
            for v in &churn {
                if !bring_up(sh, v, &mut rng).await {
                    return;
                }
            }
            sh.cycles.fetch_add(1, SeqCst);
        }
        for v in &churn {
            if !delete(sh, v, &mut rng).await {
                return;
            }
        }
    });
}

/// Wait (at most `bound`) until `ready` holds; false if it never did or the test is aborting.
fn wait_until(sh: &Shared<'_>, bound: Duration, ready: impl Fn() -> bool) -> bool {
    let until = Instant::now() + bound;
    while Instant::now() < until && !sh.aborted.load(SeqCst) {
        if ready() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

/// kill -9 the host daemon, the front, or both, in the order [`KILLS`] shuffled by the seed: each
/// after a random pause, as soon as its target call is in flight (a stage: bindfs processes being
/// spawned and recorded; an unstage: one being stopped), then start them again after another
/// random pause. Returns the running daemons and where each kill landed.
fn chaos(
    sh: &Shared<'_>,
    seed: u64,
    host_args: &[String],
    front_args: &[String],
    mut host: Proc,
    mut front: Proc,
) -> (Proc, Proc, Vec<Kill>) {
    let _abort = AbortOnPanic(sh);
    let mut rng = Rng::new(seed);
    let mut schedule = KILLS.to_vec();
    for i in (1..schedule.len()).rev() {
        schedule.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    let mut kills = Vec::new();
    for (what, target) in schedule {
        std::thread::sleep(rng.ms(100, 600));
        if sh.aborted.load(SeqCst) {
            break;
        }
        wait_until(sh, Duration::from_secs(3), || sh.in_flight(target) > 0);
        let (hit, calls_in_flight) = (sh.in_flight(target) > 0, sh.in_flight(Op::Any));
        let by_op = [Op::Create, Op::Stage, Op::Publish, Op::Unpublish, Op::Unstage, Op::Delete]
            .map(|op| format!("{op:?} {}", sh.in_flight(op)))
            .join(", ");
        if what == "fuse" {
            let victims = || -> Vec<i32> {
                sh.vols
                    .iter()
                    .filter(|v| v.end_published)
                    .flat_map(|v| pids_of("bindfs", &v.staging.display().to_string()))
                    .collect()
            };
            wait_until(sh, Duration::from_secs(5), || !victims().is_empty());
            let victims = victims();
            let victim = (!victims.is_empty()).then(|| victims[(rng.next() % victims.len() as u64) as usize]);
            if let Some(pid) = victim {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
            let at = sh.start.elapsed();
            sh.note(format!("KILL -9 bindfs {victim:?} of a published volume ({calls_in_flight} calls in flight)"));
            kills.push(Kill { what, target, hit: hit && victim.is_some(), at, calls_in_flight });
            continue;
        }
        if what != "front" {
            host.kill9();
        }
        if what != "host" {
            front.kill9();
        }
        let at = sh.start.elapsed();
        sh.note(format!(
            "KILL -9 {what} waiting for {target:?}: {} ({calls_in_flight} calls in flight: {by_op})",
            if hit { "in flight" } else { "none came" },
        ));
        kills.push(Kill { what, target, hit, at, calls_in_flight });
        std::thread::sleep(rng.ms(0, 400));
        if what != "front" {
            host = sh.dirs.start_host(host_args);
        }
        if what != "host" {
            front = sh.dirs.start_front(front_args);
        }
        sh.note(format!("restarted {what}"));
    }
    sh.chaos_done.store(true, SeqCst);
    (host, front, kills)
}

async fn host_volumes(dirs: &NodeDirs) -> Vec<VolumeStatus> {
    HostClient::new(channel(&dirs.host_sock)).list_volumes(ListVolumesRequest {}).await.unwrap().into_inner().volumes
}

async fn wait_ready(dirs: &NodeDirs) {
    let mut id = IdentityClient::new(channel(&dirs.csi_sock));
    for _ in 0..400 {
        if id.probe(csi::ProbeRequest {}).await.is_ok_and(|r| r.into_inner().ready == Some(true)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the front never became ready");
}

/// Entries directly in `dir` (none when it does not exist).
fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

/// Every file and directory below `dir`, at any depth (sockets, logs, per-volume folders).
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        out.push(e.path());
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(tree(&e.path()));
        }
    }
    out
}

/// The per-volume cgroups under the daemon's own parent (`NodeDirs` gives the host a parent of
/// its own and removes it on drop), by volume key.
fn cgroups_left(cgroups: &Cgroups) -> Vec<String> {
    let own = cgroups.group("");
    let groups = cgroups.groups().expect("listing the cgroup parent");
    groups.into_iter().map(|g| g.strip_prefix(&own).unwrap_or(&g).to_string()).collect()
}

/// Pids in one per-volume cgroup, read from the kernel (not through the daemon's code).
fn cgroup_procs(cgroups: &Cgroups, key: &str) -> Vec<i32> {
    let Some(dir) = cgroups.parent_dir().map(|p| p.join(key)) else { return Vec::new() };
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// The text of a log without its colour codes.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ ... final byte in @..~
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) && c != '[' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn is_mounted(path: &Path) -> bool {
    mounthost::exec::mountinfo::read().unwrap().iter().any(|m| m.mount_point == path)
}

#[test]
fn fifty_volumes_reach_their_state_while_host_and_front_are_killed() {
    if !in_private_namespace("fifty_volumes_reach_their_state_while_host_and_front_are_killed") {
        return;
    }
    let seed = seed();
    println!("chaos seed {seed} (replay: MOUNTHOST_CHAOS_SEED={seed})");
    let dirs = NodeDirs::new();
    let front_args = dirs.bindfs_args();
    let mut host_args = front_args.clone();
    host_args.push("--fuse-stop-grace-secs=5".into());
    guarded(&dirs, || {
        let host = dirs.start_host(&host_args);
        let front = dirs.start_front(&front_args);
        run(&dirs, seed, &host_args, &front_args, host, front)
    });
}

fn run(dirs: &NodeDirs, seed: u64, host_args: &[String], front_args: &[String], host: Proc, front: Proc) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(wait_ready(dirs));
    let vols: Vec<Vol> = (0..VOLUMES)
        .map(|i| {
            let pv = format!("pvc-chaos-{i:02}");
            // A third have a second pod; every other one of those mounts it read-only.
            let pods = if i % 3 == 0 { 2 } else { 1 };
            let targets =
                (0..pods).map(|p| (dirs.target(&format!("pod-{i:02}-{p}"), &pv), p == 1 && i % 2 == 0)).collect();
            Vol { staging: dirs.staging(&pv), pv, end_published: i % 5 < 3, targets, created: OnceLock::new() }
        })
        .collect();
    let sh = Shared {
        dirs,
        vols,
        start: Instant::now(),
        chaos_done: AtomicBool::new(false),
        failed: Mutex::new(None),
        aborted: AtomicBool::new(false),
        calls: AtomicUsize::new(0),
        in_flight: Default::default(),
        cycles: AtomicUsize::new(0),
        retries: Mutex::new(BTreeMap::new()),
        events: Mutex::new(Vec::new()),
    };

    let (host, front, kills) = std::thread::scope(|s| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                s.spawn({
                    let sh = &sh;
                    move || worker(sh, w, seed)
                })
            })
            .collect();
        let chaos = s.spawn(|| chaos(&sh, seed, host_args, front_args, host, front));
        for w in workers {
            let _ = w.join();
        }
        chaos.join()
    })
    .unwrap_or_else(|_| panic!("the chaos thread panicked; seed {seed}"));
    let chaos_secs = sh.start.elapsed().as_secs_f64();
    let events = sh.events.lock().unwrap().join("\n");
    if let Some(why) = sh.failed.lock().unwrap().clone() {
        panic!("seed {seed}: {why}\n--- calls and kills\n{events}");
    }
    let ctx = |what: String| format!("seed {seed}: {what}\n--- calls and kills\n{events}");

    // Every kill happened, each while the call it waited for was in flight.
    let host_kills = kills.iter().filter(|k| k.what == "host" || k.what == "both").count();
    let front_kills = kills.iter().filter(|k| k.what == "front" || k.what == "both").count();
    let fuse_kills = kills.iter().filter(|k| k.what == "fuse").count();
    assert_eq!(kills.len(), KILLS.len(), "{}", ctx("every kill happened".into()));
    assert!(host_kills >= 3 && front_kills >= 3);
    for k in &kills {
        assert!(
            k.hit && k.calls_in_flight > 0,
            "{}",
            ctx(format!("the {} kill at {:?} found no {:?} call in flight", k.what, k.at, k.target))
        );
    }

    // A killed bindfs is restarted by the host's supervisor, not by kubelet: give it its moment.
    let all_healthy = || rt.block_on(host_volumes(dirs)).iter().all(|s| s.healthy && s.phase == "staged");
    let until = Instant::now() + Duration::from_secs(30);
    while !all_healthy() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }

    // End state, checked against the kernel first, then against what the daemon says.
    let published: Vec<&Vol> = sh.vols.iter().filter(|v| v.end_published).collect();
    let gone: Vec<&Vol> = sh.vols.iter().filter(|v| !v.end_published).collect();
    let mut targets_checked = 0;
    let mut readonly_checked = 0;
    let mut bindfs_pids = BTreeSet::new();
    for v in &published {
        let key = volume_key(v.id());
        let backing = dirs.state.join("cache/volumes").join(&key).join("data");
        assert!(is_mounted(&v.staging), "{}", ctx(format!("{} is not staged", v.pv)));
        let pids = pids_of("bindfs", &v.staging.display().to_string());
        assert_eq!(pids.len(), 1, "{}", ctx(format!("bindfs processes of {}: {pids:?}", v.pv)));
        assert_eq!(cgroup_procs(&dirs.cgroups(), &key), pids, "{}", ctx(format!("{}'s bindfs is in its cgroup", v.pv)));
        bindfs_pids.insert(pids[0]);
        // The file written right after the first publish survived every kill.
        let marker = std::fs::read_to_string(backing.join("marker"));
        assert_eq!(marker.as_deref().ok(), Some(v.pv.as_str()), "{}", ctx(format!("{}'s marker", v.pv)));
        let (writer, _) = &v.targets[0];
        std::fs::write(writer.join("end.txt"), format!("end of {}", v.pv)).unwrap();
        let expect = format!("end of {}", v.pv);
        for (target, readonly) in &v.targets {
            assert!(is_mounted(target), "{}", ctx(format!("{} is not mounted", target.display())));
            assert_eq!(std::fs::read_to_string(target.join("end.txt")).unwrap(), expect, "{}", target.display());
            targets_checked += 1;
            if *readonly {
                let err = std::fs::write(target.join("refused.txt"), b"x").unwrap_err();
                assert_eq!(err.raw_os_error(), Some(nix::errno::Errno::EROFS as i32), "{}", target.display());
                readonly_checked += 1;
            }
        }
        assert_eq!(std::fs::read_to_string(backing.join("end.txt")).unwrap(), expect, "backing dir of {}", v.pv);
        assert_eq!(std::fs::read_to_string(v.staging.join("end.txt")).unwrap(), expect);
    }
    for v in &gone {
        let key = volume_key(v.id());
        assert!(!dirs.state.join("volumes").join(format!("{key}.json")).exists(), "{}", ctx(format!("{} state", v.pv)));
        assert!(!is_mounted(&v.staging), "{}", ctx(format!("{} still staged", v.pv)));
        for (target, _) in &v.targets {
            assert!(!is_mounted(target) && !target.exists(), "{}", ctx(format!("{} left", target.display())));
        }
        let pids = pids_of("bindfs", &v.staging.display().to_string());
        assert!(pids.is_empty(), "{}", ctx(format!("bindfs of gone {}: {pids:?}", v.pv)));
        assert!(!dirs.state.join("cache/volumes").join(&key).exists(), "{}", ctx(format!("{} cache", v.pv)));
        assert!(!dirs.state.join("run").join(&key).exists(), "{}", ctx(format!("{} runtime dir", v.pv)));
    }
    // Nothing else: exactly the expected mounts, processes, groups and records.
    let expected_mounts = published.len() + published.iter().map(|v| v.targets.len()).sum::<usize>();
    let mounts = mounts_below(dirs.root.path());
    assert_eq!(mounts.len(), expected_mounts, "{}", ctx(format!("mounts: {mounts:#?}")));
    let all_bindfs: BTreeSet<i32> = pids_of("bindfs", &dirs.root.path().display().to_string()).into_iter().collect();
    assert_eq!(all_bindfs, bindfs_pids, "{}", ctx("stray bindfs processes".into()));
    let keys: BTreeSet<String> = published.iter().map(|v| volume_key(v.id())).collect();
    let groups: BTreeSet<String> = cgroups_left(&dirs.cgroups()).into_iter().collect();
    assert_eq!(groups, keys, "{}", ctx("cgroups are exactly the published volumes'".into()));
    // Records, and each record's spare (the executor swaps state in through it), nothing else.
    let (spares, records): (BTreeSet<String>, BTreeSet<String>) =
        entries(&dirs.state.join("volumes")).into_iter().partition(|n| n.starts_with('.'));
    let expected: BTreeSet<String> = keys.iter().map(|k| format!("{k}.json")).collect();
    assert_eq!(records, expected, "{}", ctx("state files are exactly the published volumes'".into()));
    let spares_of: BTreeSet<String> = expected.iter().map(|r| format!(".{r}.spare")).collect();
    assert!(spares.is_subset(&spares_of), "{}", ctx(format!("only spares of live records: {spares:?}")));
    // The host's own directories: the same listings that must be empty after the tear-down.
    let runtime: BTreeSet<String> = entries(&dirs.state.join("run")).into_iter().collect();
    assert_eq!(runtime, keys, "{}", ctx("runtime dirs are exactly the published volumes'".into()));
    let caches: BTreeSet<String> = entries(&dirs.state.join("cache/volumes")).into_iter().collect();
    assert_eq!(caches, keys, "{}", ctx("cache dirs are exactly the published volumes'".into()));
    let secrets = entries(&dirs.state.join("secrets"));
    assert!(secrets.is_empty(), "{}", ctx(format!("the bindfs plugin has no secrets to keep: {secrets:?}")));
    let listed = rt.block_on(host_volumes(dirs));
    assert_eq!(listed.len(), published.len(), "{}", ctx(format!("{listed:#?}")));
    for v in &published {
        let s = listed.iter().find(|s| s.volume_id == v.id()).unwrap_or_else(|| panic!("{} not listed", v.pv));
        let want: BTreeSet<String> = v.targets.iter().map(|(t, _)| t.display().to_string()).collect();
        assert!(s.healthy && s.phase == "staged", "{}", ctx(format!("{s:?}")));
        assert_eq!(s.targets.iter().cloned().collect::<BTreeSet<_>>(), want, "{}", ctx(format!("{s:?}")));
        assert!(bindfs_pids.contains(&s.pid), "{}", ctx(format!("{s:?} does not name its bindfs")));
    }

    // Tear down everything the way kubelet does (retried, no more chaos), then count leftovers.
    std::thread::scope(|s| {
        for w in 0..WORKERS {
            let sh = &sh;
            s.spawn(move || {
                let _abort = AbortOnPanic(sh);
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                rt.block_on(async {
                    let mut rng = Rng::new(seed ^ 0xDEAD ^ w as u64);
                    for v in sh.vols.iter().skip(w).step_by(WORKERS).filter(|v| v.end_published) {
                        if !take_down(sh, v, &mut rng).await || !delete(sh, v, &mut rng).await {
                            return;
                        }
                    }
                });
            });
        }
    });
    if let Some(why) = sh.failed.lock().unwrap().clone() {
        panic!("{}", ctx(format!("tear-down: {why}")));
    }
    let listed = rt.block_on(host_volumes(dirs));
    let mounts = mounts_below(dirs.root.path());
    let processes = pids_of("bindfs", &dirs.root.path().display().to_string());
    let groups = cgroups_left(&dirs.cgroups());
    let sockets = tree(&dirs.state.join("run"));
    let states = entries(&dirs.state.join("volumes"));
    let secrets = entries(&dirs.state.join("secrets"));
    let caches = entries(&dirs.state.join("cache/volumes"));
    let targets_left: Vec<&PathBuf> =
        sh.vols.iter().flat_map(|v| v.targets.iter().map(|(t, _)| t)).filter(|t| t.exists()).collect();
    assert!(listed.is_empty(), "{}", ctx(format!("the host still lists {listed:#?}")));
    assert!(mounts.is_empty(), "{}", ctx(format!("mounts left: {mounts:#?}")));
    assert!(processes.is_empty(), "{}", ctx(format!("bindfs processes left: {processes:?}")));
    assert!(groups.is_empty(), "{}", ctx(format!("cgroups left under {:?}: {groups:?}", dirs.cgroups().parent_dir())));
    assert!(sockets.is_empty(), "{}", ctx(format!("left in <state>/run: {sockets:#?}")));
    assert!(states.is_empty(), "{}", ctx(format!("state files left: {states:?}")));
    assert!(secrets.is_empty(), "{}", ctx(format!("kept secrets left: {secrets:?}")));
    assert!(caches.is_empty(), "{}", ctx(format!("cache dirs left: {caches:?}")));
    assert!(targets_left.is_empty(), "{}", ctx(format!("target dirs left: {targets_left:?}")));
    // And with the daemons gone too, nothing of this node runs any more.
    drop((host, front));
    let survivors = pids_with(&dirs.root.path().display().to_string());
    assert!(survivors.is_empty(), "{}", ctx(format!("processes left: {survivors:?}")));

    let retries = sh.retries.lock().unwrap().clone();
    let in_flight: usize = kills.iter().map(|k| k.calls_in_flight).sum();
    let mut during: BTreeMap<String, usize> = BTreeMap::new();
    for k in &kills {
        *during.entry(format!("{:?}", k.target).to_lowercase()).or_default() += 1;
    }
    let verbose = std::env::var_os("MOUNTHOST_CHAOS_VERBOSE").is_some();
    for line in events.lines().filter(|l| verbose || l.contains("KILL") || l.contains("restarted")) {
        println!("{line}");
    }
    // What the restarted host daemons found and repaired, from their log.
    let log = strip_ansi(&std::fs::read_to_string(dirs.root.path().join("host.log")).unwrap_or_default());
    let count = |what: &str| log.lines().filter(|l| l.contains(what)).count();
    let repaired = format!(
        "{} volumes adopted, {} interrupted stages rolled back, {} interrupted unstages finished, {} unclaimed \
         dirs and {} unclaimed cgroups removed, {} FUSE restarts",
        count("reconcile: adopted"),
        count("rolling back an interrupted stage"),
        count("finishing an interrupted unstage"),
        count("removing a host directory no volume claims"),
        count("removed a cgroup no volume claims"),
        count("FUSE process or mount lost"),
    );
    println!(
        "chaos checked: seed {seed}, {VOLUMES} volumes: {} published ({targets_checked} targets, {readonly_checked} \
         read-only refusing writes, data through every target and the backing dir) and {} gone after {} churn \
         cycles; {host_kills} host kills, {front_kills} front kills (one of both) and {fuse_kills} bindfs kills, each during its \
         target call {during:?}, {in_flight} calls in flight in all; restarted hosts: {repaired}; {} calls, \
         {} retries {retries:?}; chaos phase {chaos_secs:.1} s; leaked after tear-down: {} mounts, {} processes, \
         {} cgroups, {} sockets/runtime entries, {} state files, {} secrets, {} cache dirs",
        published.len(),
        gone.len(),
        sh.cycles.load(SeqCst),
        sh.calls.load(SeqCst),
        sh.retried(),
        mounts.len(),
        processes.len() + survivors.len(),
        groups.len(),
        sockets.len(),
        states.len(),
        secrets.len(),
        caches.len(),
    );
}
