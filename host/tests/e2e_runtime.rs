//! The image under a real container runtime, run the way a node runs the DaemonSets.
//!
//! - **The runtime.** containerd (Debian's 1.6, with runc) runs inside the test's private mount
//!   namespace with a root, state, socket and config file of its own in the run's directory
//!   (`$TMPDIR/mounthost-e2e-runtime-<pid>-<start time>`, see [`RUN_PREFIX`]), and a tmpfs on
//!   `/run` of that namespace (containerd 1.6 keeps its shims' sockets and runc's state below
//!   `/run/containerd` whatever it is told). Nothing it makes reaches the machine, and the guard
//!   of [`Node`] stops it and removes every container, mount and cgroup at the end, also when
//!   the test fails.
//! - **A killed run** (a CI timeout, `kill -9` of the test) runs no guard: its containerd, the
//!   shims, the containers and FUSE processes, the backends, the cgroups and the directories
//!   stay. Each test first removes what earlier runs of this file left whose test process is
//!   gone ([`sweep_killed_runs`]: matched on the run's name only, never anything else), and
//!   prints what it removed.
//! - **The image.** `scripts/image.sh` builds it once, from the binary `cargo test` built
//!   (`--binary`: a cold release build would add 7.5 minutes on 2 cores to CI; everything else
//!   is built as for the release image), with the first version string; the second version is
//!   that image with another version label (`umoci config --tag`: a new config and manifest, the
//!   same layer blobs, nothing compressed again). One archive holds both; the tests' processes
//!   build it one at a time and share it ([`image_archive`]), and `ctr image import` imports both
//!   images from it. Each image's config has the Dockerfile's `USER` and `ENTRYPOINT`, and each
//!   container's init runs that entrypoint, the binary `cargo test` built.
//! - **The containers.** The host daemon and the node front run as two containers whose OCI
//!   specs [`oci_spec`] makes from the rendered manifests (`kubectl kustomize
//!   deploy/overlays/seaweedfs`) and the image's config, with the rules kubelet and containerd's
//!   CRI plugin apply to the fields the manifests use: user and groups, privileged or the
//!   dropped capabilities, read-only root, hostPID and hostNetwork (no pid, network or UTS
//!   namespace), every hostPath volume bind-mounted with its `mountPropagation`
//!   (`Bidirectional` is `rshared` with an `rshared` root), `args` after the image's entrypoint
//!   with `$(VAR)` expanded, `env`, `envFrom` and the downward API. They run with `ctr run
//!   --config`, because Debian's ctr 1.6 has no flag for a user (the host container overrides
//!   the image's 65532 with `runAsUser: 0`) nor for supplementary groups; with `--config` ctr
//!   takes the root filesystem from the spec, so the test prepares and mounts the image's
//!   containerd snapshot itself, as containerd's shim does for a container it creates.
//! - **The node.** kubelet's directory and the state directory are shared mount points inside
//!   the test's namespace (as `/` is on a systemd node), so mounts the host container makes
//!   below its `/var/lib/kubelet` reach the test, which plays kubelet and the pods: it drives
//!   CSI calls through the front's socket with kubelet's path layout and reads and writes the
//!   published targets. Every hostPath below the node's `/` is a directory below the test's
//!   temporary root; `/dev/fuse` and `/sys/fs/cgroup` are the machine's. `weed` (a static
//!   binary from `.local/venv`) is bind-mounted where the seaweedfs overlay's init container
//!   copies it, and the socket directory is chowned as the front's init container does.
//! - **Stopping a container** is what kubelet asks containerd for when it deletes a pod: SIGTERM
//!   to the container's init, up to the pod's `terminationGracePeriodSeconds`, then SIGKILL to
//!   every process in the container's cgroup (`ctr task kill --all`), then the task and the
//!   container are deleted. For the host container (hostPID) containerd's shim already kills
//!   everything in the container's cgroup when the init exits.
//!
//! What the tests check: in a rolling update of the host container (maxUnavailable) and of the
//! front, the FUSE processes keep their pids and start times and live outside the container's
//! cgroup, a reader loop on every pod target sees no error, and the new host daemon adopts every
//! volume (its log's "reconciled volume state", `mounthost client list` through the sockets); a
//! surge update (a second host container while the first runs: the rendered host container with
//! its metrics port moved in its arguments, ports and probes, [`with_port`], as an overlay for
//! surge updates must move it) stands by until the first is stopped, then adopts; after a
//! simulated node reboot the host container cleans up and kubelet's calls rebuild the volumes.
//!
//! Not covered: kubelet and the CRI plugin themselves (no pod sandbox, pause container or CNI:
//! the front's container gets a network namespace with loopback only), the node front's
//! seccomp profile `RuntimeDefault` (ctr 1.6 can make containerd's default profile only for
//! containers it specifies itself) and AppArmor, the sidecars (node-driver-registrar,
//! livenessprobe) and the init containers (the test does their work), kubelet's `/etc/hosts`,
//! `/etc/resolv.conf` and service variables, resource requests. A real node reboot is not
//! possible here: [`Node::reboot`] says what the simulation does.
//!
//! Skipped, with the reason printed, only when the runtime (`containerd`, `ctr`, `runc`, the runc
//! shim) or the image tools (`mmdebstrap`, `umoci`) are not installed; `scripts/test.sh`
//! installs them, so CI runs these tests.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::registry::{Class, ModelBuilder, Packing, PushedModel, Registry, RegistryOptions, random_file};
use common::{NodeDirs, Seaweed, http, in_private_namespace, pids_of, publish_req, stage_req, weed_binary};
use mounthost::proto::csi;
use mounthost::proto::csi::node_client::NodeClient;
use mounthost::unpriv::grpc::{UnixChannel, channel};
use nix::mount::{MntFlags, MsFlags};
use serde_json::{Value, json};
use sha2::Digest;

/// The image's repository, as every manifest names it.
const REPOSITORY: &str = "ghcr.io/mounthost/mounthost";
/// The containerd namespace of the tests' images and containers.
const NAMESPACE: &str = "mounthost-e2e";
/// `spec.nodeName` of the pods.
const NODE_NAME: &str = "node-1";
/// The first and the second image's version strings (a rolling update goes from one to the other).
const OLD: usize = 0;
const NEW: usize = 1;

fn versions() -> [String; 2] {
    let v = env!("CARGO_PKG_VERSION");
    [format!("{v}-e2e-old"), format!("{v}-e2e-new")]
}

fn workspace() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).canonicalize().expect("the workspace root")
}

// ---------------------------------------------------------------------------------------------
// Skipping

/// Why the tests cannot run here (a runtime or image tool is not installed), or `None`.
fn missing_tools() -> Option<String> {
    let on_path = |tool: &str| {
        std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
    };
    let missing: Vec<&str> = ["containerd", "ctr", "containerd-shim-runc-v2", "runc", "mmdebstrap", "umoci"]
        .into_iter()
        .filter(|t| !on_path(t))
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "{} not installed (apt-get install -y containerd runc mmdebstrap umoci; scripts/test.sh does)",
            missing.join(", ")
        )
    })
}

/// True when the test should run its body here: the tools are installed and this is the
/// re-executed test in its private mount namespace.
fn runs_here(test: &str) -> bool {
    if let Some(why) = missing_tools() {
        println!("skipped {test}: {why}");
        return false;
    }
    in_private_namespace(test)
}

// ---------------------------------------------------------------------------------------------
// Small helpers

fn output(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

/// Run `cmd`; its stdout, or a failure naming the command and its stderr.
fn ok(cmd: &mut Command) -> String {
    let out = output(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn until<T>(what: &str, limit: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + limit;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(Instant::now() < end, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `/proc/<pid>/stat`'s start time (clock ticks after boot), `None` when the process is gone or
/// a zombie: with the pid it names one process for good.
fn start_time(pid: i32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    (fields.first() != Some(&"Z")).then(|| fields.get(19)?.parse().ok())?
}

/// Every mounted cgroup hierarchy (v1 controllers, the v2 one).
fn cgroup_hierarchies() -> Vec<PathBuf> {
    mounthost::exec::mountinfo::read()
        .unwrap()
        .into_iter()
        .filter(|m| m.fstype == "cgroup" || m.fstype == "cgroup2")
        .map(|m| m.mount_point)
        .collect()
}

/// Kill whatever runs in the cgroups whose top-level directory starts with `prefix`, in every
/// hierarchy, and remove those cgroups, deepest first.
fn remove_cgroups(prefix: &str) {
    for top in cgroups_named(prefix) {
        remove_cgroup_tree(&top);
    }
}

/// Kill whatever runs in cgroup `top` and every group below it, and remove them, deepest first.
/// Quiet about what is already gone.
fn remove_cgroup_tree(top: &Path) {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        if let Ok(rd) = fs::read_dir(dir) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&e.path(), out);
                }
            }
        }
        out.push(dir.to_path_buf());
    }
    let mut groups = Vec::new();
    walk(top, &mut groups);
    for group in groups {
        for _ in 0..200 {
            let procs = fs::read_to_string(group.join("cgroup.procs")).unwrap_or_default();
            let pids: Vec<i32> = procs.lines().filter_map(|l| l.trim().parse().ok()).collect();
            if (pids.is_empty() && fs::remove_dir(&group).is_ok()) || !group.exists() {
                break;
            }
            for pid in pids {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The cgroups in every hierarchy whose top-level directory starts with `prefix`.
fn cgroups_named(prefix: &str) -> Vec<PathBuf> {
    cgroup_hierarchies()
        .into_iter()
        .flat_map(|h| fs::read_dir(h).into_iter().flatten().flatten())
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// What a killed run left

/// The name every run of these tests gives what it makes on the machine: its directory in the
/// temporary directory, the top-level cgroups of its containers and volumes (the name and a
/// suffix) and the source of the tmpfs on `/run` of its mount namespace. It ends in the pid and
/// start time (`/proc/<pid>/stat`) of the test process that owns them: while a process with
/// that pid and start time lives the run is its, and once none does (a CI timeout, `kill -9`)
/// the run is dead for certain.
const RUN_PREFIX: &str = "mounthost-e2e-runtime-";

/// The name of this process's run.
fn run_name() -> String {
    let pid = std::process::id();
    format!("{RUN_PREFIX}{pid}-{}", start_time(pid as i32).expect("this process's start time"))
}

/// The run `name` belongs to (a run's name, or one followed by `-` and a suffix) and whether it
/// is dead; `None` for any other name.
fn run_of(name: &str) -> Option<(String, bool)> {
    let rest = name.strip_prefix(RUN_PREFIX)?;
    let mut parts = rest.splitn(3, '-');
    let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    let (pid, start) = (parts.next().filter(|p| digits(p))?, parts.next().filter(|p| digits(p))?);
    let dead = start_time(pid.parse().ok()?) != Some(start.parse().ok()?);
    Some((format!("{RUN_PREFIX}{pid}-{start}"), dead))
}

/// The directory of a run: `<temporary directory>/<run name>`. Its `made` file lists the other
/// directories the run made in the temporary directory (the node's root, the backends'), one a
/// line, so that a sweep can remove them too.
struct RunDir {
    path: PathBuf,
}

impl RunDir {
    fn create(name: &str) -> RunDir {
        let path = std::env::temp_dir().join(name);
        fs::create_dir(&path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        RunDir { path }
    }

    /// Note that the run made `dir` in the temporary directory.
    fn made(&self, dir: &Path) {
        let mut f = fs::OpenOptions::new().create(true).append(true).open(self.path.join("made")).unwrap();
        std::io::Write::write_all(&mut f, format!("{}\n", dir.display()).as_bytes()).unwrap();
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// What [`sweep_killed_runs`] removed.
#[derive(Debug, Default)]
struct Swept {
    runs: BTreeSet<String>,
    /// `pid comm: why`.
    processes: Vec<String>,
    cgroups: Vec<PathBuf>,
    mounts: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
}

/// The directory where `weed server` of this namespace, listening on `filer`, keeps its data
/// (the parent of its `-dir=`): the server is started by the test harness in a temporary
/// directory it does not name.
fn weed_server_dir(filer: &str) -> Option<PathBuf> {
    let port = filer.rsplit_once(':')?.1;
    let own = fs::read_link("/proc/self/ns/mnt").ok()?;
    pids_of("weed", &format!("-filer.port={port}"))
        .into_iter()
        .filter(|pid| fs::read_link(format!("/proc/{pid}/ns/mnt")).ok().as_ref() == Some(&own))
        .find_map(|pid| {
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args = String::from_utf8_lossy(&cmdline).into_owned();
            let data = args.split('\0').find_map(|a| a.strip_prefix("-dir="))?;
            Some(Path::new(data).parent()?.to_path_buf())
        })
}

/// Remove what runs of this test file killed before they could clean up left on the machine,
/// and nothing else: everything is matched on a run's name ([`RUN_PREFIX`]) whose owner is dead.
///
/// - Processes: every containerd and containerd shim whose command line names a dead run's
///   directory (`--config <dir>/...`, `-address <dir>/containerd.sock`), and every process in a
///   dead run's mount namespace, known by the tmpfs on its `/run` named after the run (the
///   backends the run started, `weed server` and the registry, and anything else it started).
///   Never one in this process's namespace, in pid 1's or in the one the tests were started
///   from.
/// - Cgroups: every top-level cgroup of a dead run in every mounted hierarchy (v1 controllers,
///   `name=systemd`, the unified one), with what still runs there (the containers, the FUSE
///   processes).
/// - Mounts of this namespace below a dead run's directory (this namespace is a copy of the one
///   the tests were started from).
/// - A dead run's directory, and the directories its `made` file lists.
///
/// Fails when a process of a dead run does not exit, or a cgroup or directory of one is still
/// there afterwards.
fn sweep_killed_runs() -> Swept {
    // One sweep at a time: the tests start in parallel.
    let lock_dir = workspace().join(".local/image/e2e");
    fs::create_dir_all(&lock_dir).unwrap();
    let lock = File::create(lock_dir.join(".sweep.lock")).unwrap();
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).unwrap();

    let tmp = std::env::temp_dir();
    let mut swept = Swept::default();
    let dead = |name: &str, swept: &mut Swept| -> bool {
        match run_of(name) {
            Some((run, true)) => {
                swept.runs.insert(run);
                true
            }
            _ => false,
        }
    };

    // Processes, until none is found (a dying containerd may have started one more).
    let ns = |pid: &str| fs::read_link(format!("/proc/{pid}/ns/mnt")).ok();
    let mut spared: BTreeSet<PathBuf> = ["self", "1"].into_iter().filter_map(ns).collect();
    // The namespace the tests were started from, as `common::in_private_namespace` passes it.
    spared.extend(std::env::var_os("MOUNTHOST_TEST_OUTER_MNT_NS").map(PathBuf::from));
    let own = std::process::id() as i32;
    let mut namespaces: HashMap<PathBuf, bool> = HashMap::new();
    for _ in 0..5 {
        let mut victims: BTreeMap<i32, String> = BTreeMap::new();
        for entry in fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
            if pid == own || start_time(pid).is_none() {
                continue;
            }
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<String> =
                cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
            let program = args.first().map(|a| a.rsplit('/').next().unwrap_or(a).to_string()).unwrap_or_default();
            let named = (program == "containerd" || program.starts_with("containerd-shim"))
                .then(|| {
                    args.iter().find_map(|a| {
                        let name = a.strip_prefix(&format!("{}/", tmp.display()))?.split('/').next()?;
                        dead(name, &mut swept).then(|| format!("its command line names {}", tmp.join(name).display()))
                    })
                })
                .flatten();
            let in_namespace = ns(&pid.to_string()).filter(|n| !spared.contains(n)).and_then(|n| {
                let of_dead_run = *namespaces.entry(n).or_insert_with(|| {
                    let mountinfo = fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
                    // After the " - " separator: the file system type, then the source.
                    mountinfo.lines().filter_map(|l| l.split_once(" - ")?.1.split(' ').nth(1)).any(|source| {
                        run_of(source).is_some_and(|(run, dead)| dead && run == source) && dead(source, &mut swept)
                    })
                });
                of_dead_run.then(|| "in a killed run's mount namespace".to_string())
            });
            if let Some(why) = named.or(in_namespace) {
                let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                victims.insert(pid, format!("{pid} {}: {why}", comm.trim()));
            }
        }
        if victims.is_empty() {
            break;
        }
        for pid in victims.keys() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), nix::sys::signal::SIGKILL);
        }
        for pid in victims.keys() {
            until(&format!("process {pid} of a killed run exits"), Duration::from_secs(10), || {
                start_time(*pid).is_none().then_some(())
            });
        }
        swept.processes.extend(victims.into_values());
    }

    // Cgroups: first everything in them killed (a container's init could start a FUSE process
    // again while its volume's group is removed), then the groups removed.
    let groups: Vec<PathBuf> = cgroup_hierarchies()
        .into_iter()
        .flat_map(|h| fs::read_dir(h).into_iter().flatten().flatten())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()) && dead(&e.file_name().to_string_lossy(), &mut swept))
        .map(|e| e.path())
        .collect();
    let pids_in = |dir: &Path| -> Vec<i32> {
        let mut pids = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            let procs = fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
            pids.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            stack.extend(
                fs::read_dir(&d)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
        pids
    };
    for _ in 0..500 {
        let pids: BTreeSet<i32> = groups.iter().flat_map(|g| pids_in(g)).collect();
        if pids.is_empty() {
            break;
        }
        for pid in &pids {
            let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            let line = format!("{pid} {}: in a killed run's cgroup", comm.trim());
            if !swept.processes.contains(&line) {
                swept.processes.push(line);
            }
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), nix::sys::signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for g in &groups {
        remove_cgroup_tree(g);
    }
    swept.cgroups = groups;

    // Mounts of this namespace, deepest first.
    let below_dead_dir = |p: &Path, swept: &mut Swept| {
        p.strip_prefix(&tmp)
            .ok()
            .and_then(|r| r.components().next())
            .is_some_and(|c| dead(&c.as_os_str().to_string_lossy(), swept))
    };
    let mut mounts: Vec<PathBuf> = mounthost::exec::mountinfo::read()
        .unwrap()
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| below_dead_dir(p, &mut swept))
        .collect();
    mounts.sort();
    for m in mounts.iter().rev() {
        let _ = nix::mount::umount2(m, MntFlags::MNT_DETACH);
    }
    swept.mounts = mounts;

    // Directories.
    for e in fs::read_dir(&tmp).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !(run_of(&name).is_some_and(|(run, _)| run == name) && dead(&name, &mut swept)) {
            continue;
        }
        let made = fs::read_to_string(e.path().join("made")).unwrap_or_default();
        for dir in made.lines().map(PathBuf::from) {
            // Only what the run made directly in the temporary directory.
            if dir.parent() == Some(tmp.as_path()) && dir.is_dir() {
                fs::remove_dir_all(&dir).unwrap_or_else(|err| panic!("removing {}: {err}", dir.display()));
                swept.dirs.push(dir);
            }
        }
        fs::remove_dir_all(e.path()).unwrap_or_else(|err| panic!("removing {}: {err}", e.path().display()));
        swept.dirs.push(e.path());
    }

    // Nothing of a dead run is left.
    let left_cgroups: Vec<PathBuf> = cgroup_hierarchies()
        .into_iter()
        .flat_map(|h| fs::read_dir(h).into_iter().flatten().flatten())
        .filter(|e| run_of(&e.file_name().to_string_lossy()).is_some_and(|(_, dead)| dead))
        .map(|e| e.path())
        .collect();
    assert!(left_cgroups.is_empty(), "cgroups of killed runs are left after the sweep: {left_cgroups:?}");
    let left_dirs: Vec<PathBuf> = fs::read_dir(&tmp)
        .unwrap()
        .flatten()
        .filter(|e| run_of(&e.file_name().to_string_lossy()).is_some_and(|(_, dead)| dead))
        .map(|e| e.path())
        .collect();
    assert!(left_dirs.is_empty(), "directories of killed runs are left after the sweep: {left_dirs:?}");
    swept
}

// ---------------------------------------------------------------------------------------------
// The manifests

/// The objects of `kubectl kustomize deploy/overlays/seaweedfs`, as JSON.
fn rendered_manifests() -> Vec<Value> {
    let venv = workspace().join(".local/venv/bin");
    for tool in ["kubectl", "python"] {
        assert!(venv.join(tool).is_file(), "{} is missing: run scripts/test.sh", venv.join(tool).display());
    }
    let yaml =
        ok(Command::new(venv.join("kubectl")).arg("kustomize").arg(workspace().join("deploy/overlays/seaweedfs")));
    let mut py = Command::new(venv.join("python"))
        .args(["-c", "import yaml,json,sys; print(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d]))"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut py.stdin.take().unwrap(), yaml.as_bytes()).unwrap();
    let out = py.wait_with_output().unwrap();
    assert!(out.status.success(), "PyYAML could not read the rendered manifests");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A DaemonSet's pod spec and its container called `container`.
fn pod_and_container(objects: &[Value], daemonset: &str, container: &str) -> (Value, Value) {
    let ds = objects
        .iter()
        .find(|o| o["kind"] == "DaemonSet" && o["metadata"]["name"] == daemonset)
        .unwrap_or_else(|| panic!("no DaemonSet {daemonset} in deploy/overlays/seaweedfs"));
    let pod = ds["spec"]["template"]["spec"].clone();
    let c = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == container)
        .unwrap_or_else(|| panic!("DaemonSet {daemonset} has no container {container}"))
        .clone();
    (pod, c)
}

// ---------------------------------------------------------------------------------------------
// The image

/// An imported image: its reference, its OCI config, the digests of its layers (compressed, as
/// the manifest names them) and the chain id of its layers (the key of its top snapshot in
/// containerd).
struct Image {
    reference: String,
    config: Value,
    layers: Vec<String>,
    chain_id: String,
}

/// The cached OCI archive of both images, held with a shared lock while a test reads it: a
/// rebuild (an exclusive lock) waits until no test imports it.
struct Archive {
    path: PathBuf,
    _lock: File,
}

/// The OCI archive with both images, [`OLD`] and [`NEW`]. `scripts/image.sh --binary` builds
/// the old one from the binary `cargo test` built; the new one is derived from it by a change of
/// its config only (`umoci config --tag --no-history`: its version label, a new config and
/// manifest, the same layer blobs, none compressed again), and both are tagged in one archive.
/// Builds are one at a time across the tests' processes (an exclusive flock on the cache
/// directory's `.lock`), and an archive built from the same binary, script and versions is
/// reused. The script's and the derivation's temporary files are in the run's directory, so a
/// killed build leaves them to the sweep.
fn image_archive(run: &RunDir) -> Archive {
    use rustix::fs::FlockOperation::{LockExclusive, LockShared};
    let dir = workspace().join(".local/image/e2e");
    fs::create_dir_all(&dir).unwrap();
    let lock = File::create(dir.join(".lock")).unwrap();
    rustix::fs::flock(&lock, LockExclusive).unwrap();
    let [old, new] = versions();
    let binary = Path::new(env!("CARGO_BIN_EXE_mounthost"));
    let archive = dir.join("mounthost-e2e.oci.tar");
    let meta = fs::metadata(binary).unwrap();
    let script = workspace().join("scripts/image.sh");
    let key = format!(
        "{} {} {:?} {} {old} {new}\n",
        binary.display(),
        meta.len(),
        meta.modified().unwrap(),
        hex::encode(sha2::Sha256::digest(fs::read(&script).unwrap()))
    );
    let key_file = dir.join("mounthost-e2e.key");
    if archive.is_file() && fs::read_to_string(&key_file).is_ok_and(|k| k == key) {
        println!("checked: images {old} and {new}: reused {} (same binary and script)", archive.display());
    } else {
        // Whatever else is here is an earlier build's (this directory is the cache of these tests).
        for e in fs::read_dir(&dir).unwrap().flatten() {
            if !e.file_name().to_string_lossy().starts_with('.') {
                let _ = fs::remove_dir_all(e.path()).or_else(|_| fs::remove_file(e.path()));
            }
        }
        let work = run.path.join("image");
        fs::create_dir_all(&work).unwrap();
        let t = Instant::now();
        let base = work.join("base.oci.tar");
        let out = ok(Command::new(&script)
            .env("TMPDIR", &work)
            .arg("--binary")
            .arg(binary)
            .args(["--version", &old])
            .arg("--out")
            .arg(&base));
        let built = t.elapsed();
        let size = out
            .lines()
            .filter(|l| l.contains("archive (") || l.contains("unpacked ("))
            .map(str::trim)
            .collect::<Vec<_>>();
        let t = Instant::now();
        let layout = work.join("oci");
        fs::create_dir(&layout).unwrap();
        ok(Command::new("tar").arg("--extract").arg("--file").arg(&base).arg("--directory").arg(&layout));
        ok(Command::new("umoci")
            .arg("config")
            .arg("--image")
            .arg(format!("{}:{old}", layout.display()))
            .args(["--tag", &new, "--no-history", "--config.label"])
            .arg(format!("org.opencontainers.image.version={new}")));
        let tmp = dir.join("mounthost-e2e.oci.tar.tmp");
        ok(Command::new("tar").arg("--create").arg("--file").arg(&tmp).arg("--directory").arg(&layout).args([
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "--sort=name",
            "oci-layout",
            "index.json",
            "blobs",
        ]));
        fs::rename(&tmp, &archive).unwrap();
        fs::write(&key_file, key).unwrap();
        fs::remove_dir_all(&work).unwrap();
        println!(
            "checked: image {old} built by scripts/image.sh in {:.1} s ({}); {new} derived from it in {:.1} s \
             (umoci config --tag: its version label)",
            built.as_secs_f64(),
            size.join("; ").trim(),
            t.elapsed().as_secs_f64()
        );
    }
    // Readers share the archive; a rebuild waits for them.
    rustix::fs::flock(&lock, LockShared).unwrap();
    Archive { path: archive, _lock: lock }
}

/// The `USER` and the `ENTRYPOINT` (JSON form) of the Dockerfile's last stage: as whom and what
/// the image must run.
fn dockerfile_user_and_entrypoint() -> (String, Value) {
    let text = fs::read_to_string(workspace().join("Dockerfile")).unwrap();
    let last_stage = text.rsplit_once("\nFROM ").expect("a Dockerfile with a FROM").1;
    let field = |keyword: &str| {
        last_stage
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix(keyword))
            .unwrap_or_else(|| panic!("no {keyword}in the Dockerfile's last stage"))
            .trim()
            .to_string()
    };
    let entrypoint = serde_json::from_str(&field("ENTRYPOINT ")).expect("the Dockerfile's ENTRYPOINT in JSON form");
    (field("USER "), entrypoint)
}

/// Whether files `a` and `b` hold the same bytes.
fn same_bytes(a: &Path, b: &Path) -> bool {
    let (mut fa, mut fb) = (File::open(a).unwrap(), File::open(b).unwrap());
    if fa.metadata().unwrap().len() != fb.metadata().unwrap().len() {
        return false;
    }
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let n = fa.read(&mut ba).unwrap();
        if n == 0 {
            return true;
        }
        fb.read_exact(&mut bb[..n]).unwrap();
        if ba[..n] != bb[..n] {
            return false;
        }
    }
}

/// The small files of an OCI archive (index, manifests, configs), by path.
fn archive_metadata(archive: &Path) -> HashMap<String, Vec<u8>> {
    let mut files = HashMap::new();
    let mut tar = tar::Archive::new(File::open(archive).unwrap());
    for entry in tar.entries().unwrap() {
        let mut entry = entry.unwrap();
        if entry.header().size().unwrap() < 64 << 10 {
            let path = entry.path().unwrap().display().to_string();
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).unwrap();
            files.insert(path, bytes);
        }
    }
    files
}

/// The chain id of layers with these diff ids (OCI image spec: each is the digest of the
/// previous one, a space and the next diff id).
fn chain_id(diff_ids: &[Value]) -> String {
    let mut chain = diff_ids[0].as_str().unwrap().to_string();
    for d in &diff_ids[1..] {
        chain = format!("sha256:{}", hex::encode(sha2::Sha256::digest(format!("{chain} {}", d.as_str().unwrap()))));
    }
    chain
}

// ---------------------------------------------------------------------------------------------
// containerd

/// containerd with its own root, state, socket and config under `dir`, killed on drop.
struct Containerd {
    dir: PathBuf,
    address: PathBuf,
    child: Child,
    /// The cgroup below every hierarchy's root that holds the containers' cgroups.
    cgroup_parent: String,
    /// Containers that may still exist (removed again on drop).
    live: Mutex<Vec<Container>>,
    exec_ids: AtomicU64,
}

/// A running container.
#[derive(Clone, Debug)]
struct Container {
    id: String,
    /// The image reference it was started from.
    image: String,
    /// Its init process (in the machine's pid namespace: the pid ctr reports).
    pid: i32,
    /// `linux.cgroupsPath`: its cgroup below every hierarchy's root.
    cgroups_path: String,
    rootfs: PathBuf,
    snapshot: String,
    log: PathBuf,
}

/// How a container stopped.
#[derive(Debug)]
struct Stopped {
    /// SIGTERM to the end of the task.
    took: Duration,
    /// Whether the grace period ran out and the runtime killed the container's cgroup.
    killed_after_grace: bool,
    /// The processes in the container's cgroup just before SIGTERM.
    processes: Vec<i32>,
}

impl Containerd {
    fn start(dir: &Path, cgroup_parent: String) -> Containerd {
        fs::create_dir_all(dir.join("rootfs")).unwrap();
        fs::create_dir_all(dir.join("logs")).unwrap();
        let address = dir.join("containerd.sock");
        let d = dir.display();
        // The CRI plugin would start its own pod machinery; the snapshotters that cannot work
        // here only clutter the log. Every directory containerd writes is below `dir`.
        let config = format!(
            "version = 2\nroot = \"{d}/root\"\nstate = \"{d}/state\"\n\
             disabled_plugins = [\"io.containerd.grpc.v1.cri\", \"io.containerd.snapshotter.v1.aufs\", \
             \"io.containerd.snapshotter.v1.btrfs\", \"io.containerd.snapshotter.v1.devmapper\", \
             \"io.containerd.snapshotter.v1.zfs\"]\n\
             [grpc]\n  address = \"{d}/containerd.sock\"\n\
             [ttrpc]\n  address = \"{d}/containerd.sock.ttrpc\"\n\
             [plugins.\"io.containerd.internal.v1.opt\"]\n  path = \"{d}/opt\"\n"
        );
        fs::write(dir.join("config.toml"), config).unwrap();
        let log = File::create(dir.join("containerd.log")).unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(dir.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting containerd");
        let c = Containerd {
            dir: dir.to_path_buf(),
            address,
            child,
            cgroup_parent,
            live: Mutex::new(Vec::new()),
            exec_ids: AtomicU64::new(0),
        };
        until("containerd answers", Duration::from_secs(30), || c.output(&["version"]).status.success().then_some(()));
        c
    }

    fn ctr(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("ctr");
        cmd.arg("--address").arg(&self.address).args(["--namespace", NAMESPACE]).args(args);
        cmd
    }

    fn output(&self, args: &[&str]) -> Output {
        output(&mut self.ctr(args))
    }

    fn ok(&self, args: &[&str]) -> String {
        ok(&mut self.ctr(args))
    }

    /// `ctr image import` of an OCI archive: every image it tags, by tag.
    fn import(&self, archive: &Path) -> BTreeMap<String, Image> {
        self.ok(&["images", "import", "--base-name", REPOSITORY, &archive.display().to_string()]);
        let files = archive_metadata(archive);
        let json = |path: &str| -> Value {
            serde_json::from_slice(files.get(path).unwrap_or_else(|| panic!("{}: no {path}", archive.display())))
                .unwrap()
        };
        let blob =
            |digest: &Value| json(&format!("blobs/sha256/{}", digest.as_str().unwrap().trim_start_matches("sha256:")));
        let listed = self.ok(&["images", "ls", "--quiet"]);
        let mut images = BTreeMap::new();
        for m in json("index.json")["manifests"].as_array().unwrap() {
            let manifest = blob(&m["digest"]);
            let config = blob(&manifest["config"]["digest"]);
            let tag = m["annotations"]["org.opencontainers.image.ref.name"].as_str().unwrap();
            let reference = format!("{REPOSITORY}:{tag}");
            assert!(listed.lines().any(|l| l == reference), "ctr image import did not give {reference}: {listed}");
            let layers = manifest["layers"].as_array().unwrap().iter().map(|l| l["digest"].as_str().unwrap().into());
            let chain_id = chain_id(config["rootfs"]["diff_ids"].as_array().unwrap());
            images.insert(tag.to_string(), Image { reference, config, layers: layers.collect(), chain_id });
        }
        images
    }

    /// The task's pid and status (`RUNNING`, `STOPPED`, ...), `None` when there is no task.
    fn task(&self, id: &str) -> Option<(i32, String)> {
        let out = self.ok(&["tasks", "ls"]);
        out.lines().skip(1).find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 3 && f[0] == id).then(|| (f[1].parse().unwrap_or(0), f[2].to_string()))
        })
    }

    /// Run a container of `image` with `spec` (its `root.path` is filled in here): a new
    /// snapshot of the image, mounted as its root filesystem, and `ctr run --config`.
    fn run(&self, id: &str, image: &Image, mut spec: Value) -> Container {
        let snapshot = format!("{id}-rootfs");
        let mounts: Value =
            serde_json::from_str(&self.ok(&["snapshots", "prepare", "--mounts", &snapshot, &image.chain_id])).unwrap();
        let rootfs = self.dir.join("rootfs").join(id);
        fs::create_dir_all(&rootfs).unwrap();
        for m in mounts.as_array().unwrap() {
            let options: Vec<&str> = m["Options"].as_array().unwrap().iter().map(|o| o.as_str().unwrap()).collect();
            let fstype = m["Type"].as_str().unwrap();
            let (flags, fstype) = if fstype == "bind" {
                (MsFlags::MS_BIND | MsFlags::MS_REC, None)
            } else {
                (MsFlags::empty(), Some(fstype))
            };
            let data: Vec<&str> = options.iter().copied().filter(|o| !matches!(*o, "rbind" | "bind" | "rw")).collect();
            nix::mount::mount(m["Source"].as_str(), &rootfs, fstype, flags, Some(data.join(",").as_str()))
                .unwrap_or_else(|e| panic!("mounting the snapshot of {id} ({m}): {e}"));
        }
        spec["root"]["path"] = json!(rootfs.display().to_string());
        let cgroups_path = spec["linux"]["cgroupsPath"].as_str().unwrap().to_string();
        let spec_file = self.dir.join(format!("{id}.json"));
        fs::write(&spec_file, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
        let log = self.dir.join("logs").join(format!("{id}.log"));
        let container = Container {
            id: id.to_string(),
            image: image.reference.clone(),
            pid: 0,
            cgroups_path,
            rootfs,
            snapshot,
            log: log.clone(),
        };
        self.live.lock().unwrap().push(container.clone());
        self.ok(&[
            "run",
            "--detach",
            "--log-uri",
            &format!("file://{}", log.display()),
            "--config",
            &spec_file.display().to_string(),
            id,
        ]);
        let (pid, _) = self.task(id).unwrap_or_else(|| panic!("{id} has no task after ctr run"));
        Container { pid, ..container }
    }

    /// Run `args` in `c` (`ctr task exec`, the container's user and environment); its stdout.
    fn exec(&self, c: &Container, args: &[&str]) -> String {
        let exec_id = format!("exec-{}", self.exec_ids.fetch_add(1, Ordering::SeqCst));
        let mut all = vec!["tasks", "exec", "--exec-id", &exec_id, &c.id];
        all.extend_from_slice(args);
        self.ok(&all)
    }

    /// The processes in the container's cgroup, in any hierarchy (on v1, runc lists and kills
    /// those of its `devices` group; on v2 it has one group).
    fn processes(&self, c: &Container) -> Vec<i32> {
        cgroup_hierarchies()
            .into_iter()
            .map(|h| h.join(c.cgroups_path.trim_start_matches('/')).join("cgroup.procs"))
            .filter_map(|p| fs::read_to_string(p).ok())
            .flat_map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect::<Vec<i32>>())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }

    /// Stop `c` as kubelet does when its pod is deleted or replaced: SIGTERM to the init, wait up
    /// to `grace`, then SIGKILL to every process in the container's cgroup; then delete the task
    /// and the container (and its snapshot).
    fn stop_like_kubelet(&self, c: &Container, grace: Duration) -> Stopped {
        let processes = self.processes(c);
        let t = Instant::now();
        self.ok(&["tasks", "kill", "--signal", "SIGTERM", &c.id]);
        let stopped = || self.task(&c.id).is_none_or(|(_, status)| status == "STOPPED");
        while !stopped() && t.elapsed() < grace {
            std::thread::sleep(Duration::from_millis(20));
        }
        let killed_after_grace = !stopped();
        if killed_after_grace {
            self.ok(&["tasks", "kill", "--all", "--signal", "SIGKILL", &c.id]);
            until(&format!("{} stops after SIGKILL", c.id), Duration::from_secs(10), || stopped().then_some(()));
        }
        let took = t.elapsed();
        self.remove(&c.id);
        Stopped { took, killed_after_grace, processes }
    }

    /// SIGKILL everything in the container's cgroup, delete its task and the container, unmount
    /// and remove its snapshot. Quiet about what is already gone.
    fn remove(&self, id: &str) {
        let c = {
            let mut live = self.live.lock().unwrap();
            let Some(pos) = live.iter().position(|c| c.id == id) else { return };
            live.remove(pos)
        };
        if self.task(id).is_some_and(|(_, s)| s != "STOPPED") {
            let _ = self.output(&["tasks", "kill", "--all", "--signal", "SIGKILL", id]);
            let end = Instant::now() + Duration::from_secs(10);
            while self.task(id).is_some_and(|(_, s)| s != "STOPPED") && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.output(&["tasks", "delete", id]);
        let _ = self.output(&["containers", "delete", id]);
        let _ = nix::mount::umount2(&c.rootfs, MntFlags::MNT_DETACH);
        let _ = self.output(&["snapshots", "rm", &c.snapshot]);
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let ids: Vec<String> = self.live.lock().unwrap().iter().map(|c| c.id.clone()).collect();
        for id in ids {
            self.remove(&id);
        }
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), nix::sys::signal::SIGTERM);
        let end = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The shims, which outlive containerd by design.
        for pid in common::pids_with(&self.address.display().to_string()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
        }
        remove_cgroups(&self.cgroup_parent);
        for m in common::all_mounts_below(&self.dir).iter().rev() {
            let _ = nix::mount::umount2(m, MntFlags::MNT_DETACH);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A pod's container as an OCI spec

/// What a pod's container needs from the node it runs on.
struct PodNode<'a> {
    /// The node's `/`, for hostPath volumes (except `/dev` and `/sys`, which are the machine's).
    root: &'a Path,
    /// `status.hostIP` (and the pod's IP with hostNetwork).
    host_ip: &'a str,
    /// The data of the ConfigMaps `envFrom` names, by name.
    config_maps: &'a BTreeMap<String, BTreeMap<String, String>>,
}

impl PodNode<'_> {
    fn host_path(&self, path: &str) -> PathBuf {
        if path.starts_with("/dev/") || path.starts_with("/sys/") {
            PathBuf::from(path)
        } else {
            self.root.join(path.trim_start_matches('/'))
        }
    }
}

/// The capabilities a privileged container gets: what the runtime itself holds (containerd's
/// `WithPrivileged` takes its own bounding set), which is this process's.
fn all_capabilities() -> Vec<String> {
    const NAMES: &str = "CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP LINUX_IMMUTABLE \
        NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE \
        SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE \
        AUDIT_CONTROL SETFCAP MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF \
        CHECKPOINT_RESTORE";
    let status = fs::read_to_string("/proc/self/status").unwrap();
    let bounding = status.lines().find_map(|l| l.strip_prefix("CapBnd:")).expect("CapBnd in /proc/self/status");
    let bits = u64::from_str_radix(bounding.trim(), 16).unwrap();
    NAMES
        .split_whitespace()
        .enumerate()
        .filter(|(i, _)| bits & (1 << i) != 0)
        .map(|(_, n)| format!("CAP_{n}"))
        .collect()
}

/// containerd's default capabilities of an unprivileged container.
const DEFAULT_CAPABILITIES: &str = "CAP_CHOWN CAP_DAC_OVERRIDE CAP_FSETID CAP_FOWNER CAP_MKNOD CAP_NET_RAW CAP_SETGID \
    CAP_SETUID CAP_SETFCAP CAP_SETPCAP CAP_NET_BIND_SERVICE CAP_SYS_CHROOT CAP_KILL CAP_AUDIT_WRITE";

/// kubelet's `$(VAR)` expansion in `command` and `args`: a defined variable is replaced, `$$`
/// is a `$`, anything else stays as written.
fn expand(text: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(r) = after.strip_prefix('$') {
            out.push('$');
            rest = r;
        } else if let Some((name, r)) = after.strip_prefix('(').and_then(|a| a.split_once(')'))
            && let Some((_, v)) = env.iter().rev().find(|(k, _)| k == name)
        {
            out.push_str(v);
            rest = r;
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().map(|a| a.iter().map(|s| s.as_str().unwrap().to_string()).collect()).unwrap_or_default()
}

/// The OCI spec of container `c` of pod `pod` on `node`, from image config `image`: the rules
/// of kubelet and containerd's CRI plugin for the fields the mounthost manifests use. A field
/// the manifests use that this does not know fails the test, so a manifest change cannot be
/// silently ignored here.
fn oci_spec(pod: &Value, c: &Value, image: &Value, node: &PodNode, cgroups_path: &str) -> Value {
    let sc = &c["securityContext"];
    let psc = &pod["securityContext"];
    let privileged = sc["privileged"] == true;
    let host_network = pod["hostNetwork"] == true;

    // Environment: the image's, then envFrom, then env (a later one wins).
    let mut env: Vec<(String, String)> = strings(&image["config"]["Env"])
        .into_iter()
        .map(|e| e.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).unwrap())
        .collect();
    fn set(env: &mut Vec<(String, String)>, k: &str, v: String) {
        env.retain(|(x, _)| x != k);
        env.push((k.to_string(), v));
    }
    for from in c["envFrom"].as_array().into_iter().flatten() {
        let name = from["configMapRef"]["name"].as_str().expect("envFrom: only configMapRef is known here");
        let data = node.config_maps.get(name).unwrap_or_else(|| panic!("envFrom names ConfigMap {name}, not rendered"));
        for (k, v) in data {
            set(&mut env, k, v.clone());
        }
    }
    for e in c["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().unwrap();
        let value = match (&e["value"], e["valueFrom"]["fieldRef"]["fieldPath"].as_str()) {
            (Value::String(v), _) => v.clone(),
            (_, Some("status.hostIP")) => node.host_ip.to_string(),
            (_, Some("status.podIP")) if host_network => node.host_ip.to_string(),
            (_, Some("spec.nodeName")) => NODE_NAME.to_string(),
            _ => panic!("env {name}: {e} is not known here"),
        };
        let value = expand(&value, &env);
        set(&mut env, name, value);
    }

    // Command line: `command` or the image's entrypoint, then `args` or (without a command) the
    // image's Cmd.
    let mut args =
        if c["command"].is_array() { strings(&c["command"]) } else { strings(&image["config"]["Entrypoint"]) };
    if c["args"].is_array() {
        args.extend(strings(&c["args"]));
    } else if !c["command"].is_array() {
        args.extend(strings(&image["config"]["Cmd"]));
    }
    let args: Vec<String> = args.iter().map(|a| expand(a, &env)).collect();

    // User and groups: the container's securityContext, the pod's, then the image's `uid:gid`.
    let image_user = image["config"]["User"].as_str().unwrap_or("0:0");
    let (image_uid, image_gid) = image_user.split_once(':').unwrap_or((image_user, "0"));
    let id = |key: &str, fallback: &str| -> u64 {
        sc[key].as_u64().or(psc[key].as_u64()).unwrap_or_else(|| fallback.parse().expect("a numeric image user"))
    };
    let (uid, gid) = (id("runAsUser", image_uid), id("runAsGroup", image_gid));
    let mut groups: Vec<u64> =
        psc["supplementalGroups"].as_array().into_iter().flatten().filter_map(|g| g.as_u64()).collect();
    groups.extend(psc["fsGroup"].as_u64());

    let caps: Vec<String> = if privileged {
        all_capabilities()
    } else {
        let drop = strings(&sc["capabilities"]["drop"]);
        let add = strings(&sc["capabilities"]["add"]);
        let mut caps: Vec<String> = if drop.iter().any(|d| d == "ALL") {
            Vec::new()
        } else {
            DEFAULT_CAPABILITIES
                .split_whitespace()
                .map(String::from)
                .filter(|c| !drop.iter().any(|d| c == &format!("CAP_{d}")))
                .collect()
        };
        caps.extend(add.iter().map(|a| format!("CAP_{a}")));
        caps
    };

    // Mounts: containerd's defaults (rw /sys and cgroups when privileged), then each volume
    // mount; a volume mount at a default's destination replaces it.
    let ro = if privileged { "rw" } else { "ro" };
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]}),
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}),
        json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", ro]}),
        json!({"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup", "options": ["nosuid", "noexec", "nodev", "relatime", ro]}),
    ];
    let volumes = pod["volumes"].as_array().cloned().unwrap_or_default();
    let mut root_propagation = None;
    for vm in c["volumeMounts"].as_array().into_iter().flatten() {
        let name = vm["name"].as_str().unwrap();
        let dest = vm["mountPath"].as_str().unwrap();
        let volume = volumes.iter().find(|v| v["name"] == name).unwrap_or_else(|| panic!("no volume {name}"));
        // An optional ConfigMap no overlay made (the rule sets' one): kubelet mounts an empty
        // directory for it.
        if volume["configMap"]["optional"] == true {
            let source = node.root.join("empty-config-maps").join(name);
            fs::create_dir_all(&source).unwrap();
            mounts.retain(|m| m["destination"] != dest);
            mounts.push(json!({"destination": dest, "type": "bind", "source": source.display().to_string(), "options": ["rbind", "ro", "rprivate"]}));
            continue;
        }
        let host_path = volume["hostPath"]["path"]
            .as_str()
            .unwrap_or_else(|| panic!("volume {name}: only hostPath and optional ConfigMaps are known here"));
        let source = node.host_path(host_path);
        match volume["hostPath"]["type"].as_str().unwrap_or("") {
            "DirectoryOrCreate" => fs::create_dir_all(&source).unwrap(),
            "Directory" => assert!(source.is_dir(), "hostPath {} (type Directory) does not exist", source.display()),
            "CharDevice" => assert!(
                fs::metadata(&source).is_ok_and(|m| m.file_type().is_char_device()),
                "{} is no character device",
                source.display()
            ),
            t => panic!("volume {name}: hostPath type {t:?} is not known here"),
        }
        let propagation = match vm["mountPropagation"].as_str().unwrap_or("None") {
            "None" => "rprivate",
            "HostToContainer" => {
                root_propagation = root_propagation.or(Some("rslave"));
                "rslave"
            }
            "Bidirectional" => {
                assert!(privileged, "Bidirectional propagation needs a privileged container");
                root_propagation = Some("rshared");
                "rshared"
            }
            p => panic!("mountPropagation {p} is not known"),
        };
        let mode = if vm["readOnly"] == true { "ro" } else { "rw" };
        mounts.retain(|m| m["destination"] != dest);
        mounts.push(json!({"destination": dest, "type": "bind", "source": source.display().to_string(), "options": ["rbind", mode, propagation]}));
    }

    let mut namespaces = vec![json!({"type": "mount"}), json!({"type": "ipc"})];
    if pod["hostPID"] != true {
        namespaces.push(json!({"type": "pid"}));
    }
    if !host_network {
        namespaces.extend([json!({"type": "network"}), json!({"type": "uts"})]);
    }
    let mut linux = json!({
        "namespaces": namespaces,
        "cgroupsPath": cgroups_path,
        "resources": {"devices": [{"allow": privileged, "access": "rwm"}]},
    });
    if let Some(p) = root_propagation {
        linux["rootfsPropagation"] = json!(p);
    }
    if !privileged {
        // containerd's defaults for an unprivileged container.
        let masked = "/proc/acpi /proc/asound /proc/kcore /proc/keys /proc/latency_stats /proc/timer_list \
            /proc/timer_stats /proc/sched_debug /sys/firmware /proc/scsi";
        linux["maskedPaths"] = json!(masked.split_whitespace().collect::<Vec<_>>());
        linux["readonlyPaths"] = json!(["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]);
    }
    let mut spec = json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": uid, "gid": gid, "additionalGids": groups},
            "args": args,
            "env": env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
            "cwd": image["config"]["WorkingDir"].as_str().filter(|w| !w.is_empty()).unwrap_or("/"),
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            "noNewPrivileges": !privileged && sc["allowPrivilegeEscalation"] == false,
        },
        "root": {"path": "", "readonly": sc["readOnlyRootFilesystem"] == true},
        "mounts": mounts,
        "linux": linux,
    });
    if !host_network {
        spec["hostname"] = json!(format!("{}-e2e", c["name"].as_str().unwrap()));
    }
    spec
}

// ---------------------------------------------------------------------------------------------
// The node

/// Volumes staged and published by [`Node::stage_and_publish`]: for each, its id, and its
/// staging path and pod target as kubelet names them (the containers' paths) and as the test
/// reaches them.
struct Volumes {
    weed: Volume,
    model: Volume,
}

struct Volume {
    id: String,
    ctx: HashMap<String, String>,
    staging: PathBuf,
    target: PathBuf,
    /// The target in the test's view of the node.
    local_target: PathBuf,
}

/// A node: kubelet's and the driver's directories under a temporary root, containerd with the
/// two images, the rendered manifests, and the backends (a real SeaweedFS and registry, which
/// live outside the node and survive its reboot). Dropped, it removes every container, kills
/// every FUSE process, and leaves no mount or cgroup.
struct Node {
    runtime: Containerd,
    images: [Image; 2],
    manifests: Vec<Value>,
    config_maps: BTreeMap<String, BTreeMap<String, String>>,
    host_ip: String,
    /// Every cgroup this node makes is named this, a `-` and a suffix (the containers' and the
    /// volumes'): the run's name.
    cgroup_prefix: String,
    weed: Seaweed,
    registry: Registry,
    model: PushedModel,
    _work: tempfile::TempDir,
    /// Dropped after the containers are gone, it detaches every mount below the root.
    dirs: NodeDirs,
    /// Last: the run's directory (containerd's, the image build's), removed once the rest is gone.
    _run: RunDir,
}

impl Node {
    fn start() -> Node {
        // First what an earlier run killed before its cleanup left.
        let swept = sweep_killed_runs();
        if swept.runs.is_empty() {
            println!("checked: sweep: no killed run left anything");
        } else {
            // Each cgroup once, with the number of hierarchies it was removed from.
            let mut cgroups: BTreeMap<String, usize> = BTreeMap::new();
            for g in &swept.cgroups {
                *cgroups.entry(g.file_name().unwrap().to_string_lossy().into_owned()).or_default() += 1;
            }
            println!(
                "checked: sweep of killed runs {:?}: {} processes killed {:?}; cgroups removed (in how many \
                 hierarchies) {cgroups:?}; {} mounts detached {:?}; {} directories removed {:?}",
                swept.runs,
                swept.processes.len(),
                swept.processes,
                swept.mounts.len(),
                swept.mounts,
                swept.dirs.len(),
                swept.dirs
            );
        }
        let name = run_name();
        let run = RunDir::create(&name);
        // containerd 1.6 puts its shims' sockets below /run/containerd and runc's state below
        // /run/containerd/runc whatever its config says: a tmpfs on /run of this namespace keeps
        // them off the machine. Its source is the run's name, by which a sweep knows the
        // namespace's processes once the run is killed.
        nix::mount::mount(Some(name.as_str()), "/run", Some("tmpfs"), MsFlags::empty(), Some("mode=755")).unwrap();
        let dirs = NodeDirs::new();
        run.made(dirs.root.path());
        let root = dirs.root.path().to_path_buf();
        // kubelet's directory and the state directory are shared mount points, as on a node
        // whose `/` is shared: Bidirectional mounts of them carry mounts both ways.
        for dir in [&dirs.kubelet, &dirs.state] {
            fs::create_dir_all(dir).unwrap();
            nix::mount::mount(Some(dir.as_path()), dir.as_path(), None::<&str>, MsFlags::MS_BIND, None::<&str>)
                .unwrap();
            nix::mount::mount(None::<&str>, dir.as_path(), None::<&str>, MsFlags::MS_SHARED, None::<&str>).unwrap();
        }
        // What the seaweedfs overlay's init container does: weed at /var/lib/mounthost-programs/weed.
        let programs = root.join("var/lib/mounthost-programs");
        fs::create_dir_all(&programs).unwrap();
        File::create(programs.join("weed")).unwrap();
        nix::mount::mount(
            Some(weed_binary().as_path()),
            &programs.join("weed"),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap();
        // What the node front's init container does: the socket directory owned by 65532.
        let socket_dir = dirs.kubelet.join("plugins/csi.mounthost.dev");
        fs::create_dir_all(&socket_dir).unwrap();
        nix::unistd::chown(&socket_dir, Some(65532.into()), Some(65532.into())).unwrap();

        let weed = Seaweed::start();
        run.made(&weed_server_dir(&weed.filer).expect("the weed server's data directory"));
        let registry = Registry::start(RegistryOptions::default());
        run.made(registry.dir());
        let work = tempfile::tempdir_in(&run.path).unwrap();
        let (weights, _) = random_file(work.path(), 4 << 20);
        let model = ModelBuilder::new()
            .file("config.json", br#"{"architectures":["Test"]}"#.as_slice(), Class::Config, Packing::Tar)
            .file("model.safetensors", common::registry::Content::File(weights), Class::Weight, Packing::Raw)
            .push(&registry, "models/rolling", "v1");

        let manifests = rendered_manifests();
        // The run's name for this test's cgroups, and a loopback address of its own as the
        // node's IP, so the host's fixed metrics port cannot collide with another test's.
        let cgroup_prefix = name;
        let pid = std::process::id();
        let host_ip = format!("127.{}.{}.{}", 100 + pid % 100, (pid / 100) % 250 + 1, (pid / 25_000) % 250 + 1);

        // The ConfigMaps as the kustomization renders them, with what an overlay of the node's
        // would set: this test's filer granted, its plain-HTTP registry, its own cgroup parent.
        let mut config_maps: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for cm in manifests.iter().filter(|o| o["kind"] == "ConfigMap") {
            let mut data: BTreeMap<String, String> =
                serde_json::from_value(cm["data"].clone()).expect("ConfigMap data are strings");
            if data.contains_key("MOUNTHOST_CGROUP_PARENT") {
                data.insert("MOUNTHOST_CGROUP_PARENT".into(), format!("{cgroup_prefix}-volumes"));
                data.insert("MOUNTHOST_GRANTS".into(), format!("seaweedfs:host={}", weed.filer));
                data.insert("MOUNTHOST_INSECURE_REGISTRIES".into(), registry.host());
            }
            config_maps.insert(cm["metadata"]["name"].as_str().unwrap().to_string(), data);
        }

        let archive = image_archive(&run);
        let runtime = Containerd::start(&run.path.join("containerd"), format!("{cgroup_prefix}-pods"));
        let mut imported = runtime.import(&archive.path);
        drop(archive);
        let images = versions().map(|v| imported.remove(&v).unwrap_or_else(|| panic!("no image {v} imported")));
        assert!(imported.is_empty(), "images imported besides the two: {:?}", imported.keys());
        // Each is the Dockerfile's image: its user and entrypoint; the two differ in their
        // version label only, with the same layers.
        let (user, entrypoint) = dockerfile_user_and_entrypoint();
        for (image, version) in images.iter().zip(versions()) {
            let labels = &image.config["config"]["Labels"];
            assert_eq!(labels["org.opencontainers.image.version"], version.as_str(), "{}", image.config);
            assert_eq!(image.config["config"]["User"], user.as_str(), "the Dockerfile's USER: {}", image.config);
            assert_eq!(
                image.config["config"]["Entrypoint"], entrypoint,
                "the Dockerfile's ENTRYPOINT: {}",
                image.config
            );
        }
        assert_eq!(images[OLD].layers, images[NEW].layers, "the new image has the old one's layers");
        let mut relabelled = images[OLD].config.clone();
        relabelled["config"]["Labels"]["org.opencontainers.image.version"] = json!(versions()[NEW]);
        assert_eq!(relabelled, images[NEW].config, "the images' configs differ in the version label only");
        Node {
            runtime,
            images,
            manifests,
            config_maps,
            host_ip,
            cgroup_prefix,
            weed,
            registry,
            model,
            _work: work,
            dirs,
            _run: run,
        }
    }

    /// The node's path `p` (as kubelet and the containers name it) in the test's view.
    fn local(&self, p: &Path) -> PathBuf {
        self.dirs.root.path().join(p.strip_prefix("/").unwrap())
    }

    /// The test's path `p` below the node's root as kubelet and the containers name it.
    fn on_node(&self, p: &Path) -> PathBuf {
        Path::new("/").join(p.strip_prefix(self.dirs.root.path()).unwrap())
    }

    /// The pod's `terminationGracePeriodSeconds` (Kubernetes' default is 30).
    fn grace(&self, daemonset: &str) -> Duration {
        let ds =
            self.manifests.iter().find(|o| o["kind"] == "DaemonSet" && o["metadata"]["name"] == daemonset).unwrap();
        Duration::from_secs(ds["spec"]["template"]["spec"]["terminationGracePeriodSeconds"].as_u64().unwrap_or(30))
    }

    /// The host DaemonSet's pod and its `host` container, as rendered.
    fn host_template(&self) -> (Value, Value) {
        pod_and_container(&self.manifests, "mounthost-host", "host")
    }

    /// Start container `template.1` of pod `template.0` from image `image`.
    fn run_container(&self, template: &(Value, Value), id: &str, image: usize) -> Container {
        let node = PodNode { root: self.dirs.root.path(), host_ip: &self.host_ip, config_maps: &self.config_maps };
        let cgroups_path = format!("/{}/{id}", self.runtime.cgroup_parent);
        let spec = oci_spec(&template.0, &template.1, &self.images[image].config, &node, &cgroups_path);
        self.runtime.run(id, &self.images[image], spec)
    }

    /// Container `c`'s readiness probe, as kubelet makes it: its `httpGet` path and port on the
    /// pod's IP, the node's with hostNetwork.
    fn readyz(&self, c: &Value) -> Option<(u16, String)> {
        let probe = &c["readinessProbe"]["httpGet"];
        let port = probe["port"].as_u64().expect("the readiness probe names its port by number");
        http("GET", &format!("{}:{port}", self.host_ip), probe["path"].as_str().unwrap(), &[], b"").ok()
    }

    /// Fail with the container's log if it is not running.
    fn assert_running(&self, c: &Container) {
        let status = self.runtime.task(&c.id);
        assert!(
            status.as_ref().is_some_and(|(_, s)| s == "RUNNING"),
            "container {} is {status:?}:\n{}",
            c.id,
            tail(&fs::read_to_string(&c.log).unwrap_or_default(), 40)
        );
    }

    /// Fail unless container `c` runs image `image`'s entrypoint: its init's `argv[0]` is the
    /// entrypoint's, and the init's executable is the file at that path in the container's root
    /// filesystem, with the bytes of the binary `cargo test` built.
    fn assert_runs_entrypoint(&self, c: &Container, image: usize) {
        let entrypoint = strings(&self.images[image].config["config"]["Entrypoint"]);
        let cmdline = fs::read(format!("/proc/{}/cmdline", c.pid)).unwrap();
        let argv: Vec<String> = cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        assert_eq!(argv[..entrypoint.len()], entrypoint[..], "{}'s init runs {argv:?}", c.id);
        let exe = fs::metadata(format!("/proc/{}/exe", c.pid)).unwrap();
        let in_root = PathBuf::from(format!("/proc/{}/root{}", c.pid, entrypoint[0]));
        let file = fs::metadata(&in_root).unwrap();
        assert_eq!((exe.dev(), exe.ino()), (file.dev(), file.ino()), "{}'s init executes {}", c.id, in_root.display());
        let built = Path::new(env!("CARGO_BIN_EXE_mounthost"));
        assert!(same_bytes(&in_root, built), "{} in {} is not {}", entrypoint[0], c.id, built.display());
    }

    /// Start a host container and wait until `/readyz` says ready.
    fn start_host(&self, id: &str, image: usize) -> Container {
        let template = self.host_template();
        let c = self.run_container(&template, id, image);
        until(&format!("{id} ready"), Duration::from_secs(60), || {
            self.assert_running(&c);
            self.readyz(&template.1).filter(|(status, body)| *status == 200 && body.starts_with("ready")).map(|_| ())
        });
        self.assert_runs_entrypoint(&c, image);
        c
    }

    /// Start a node front container and wait until CSI Probe through its socket says ready.
    async fn start_front(&self, id: &str, image: usize) -> Container {
        let c = self.run_container(&pod_and_container(&self.manifests, "mounthost-node", "node"), id, image);
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            self.assert_running(&c);
            if self.dirs.csi_sock.exists() {
                let mut identity = csi::identity_client::IdentityClient::new(channel(&self.dirs.csi_sock));
                if identity.probe(csi::ProbeRequest {}).await.is_ok_and(|r| r.into_inner().ready == Some(true)) {
                    self.assert_runs_entrypoint(&c, image);
                    return c;
                }
            }
            assert!(
                Instant::now() < end,
                "{id} not ready in 60 s:\n{}",
                tail(&fs::read_to_string(&c.log).unwrap_or_default(), 40)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn csi(&self) -> NodeClient<UnixChannel> {
        NodeClient::new(channel(&self.dirs.csi_sock))
    }

    /// kubelet's NodeStageVolume and NodePublishVolume of a SeaweedFS volume and a model volume,
    /// through the front's socket, with a file written into the SeaweedFS one.
    async fn stage_and_publish(&self, csi: &mut NodeClient<UnixChannel>) -> Volumes {
        let weed_ctx: HashMap<String, String> = [
            ("plugin".to_string(), "seaweedfs".to_string()),
            ("filer".into(), self.weed.filer.clone()),
            ("path".into(), "/e2e-runtime".into()),
        ]
        .into();
        let weed = Volume {
            id: "seaweedfs~e2e-runtime".into(),
            staging: self.on_node(&self.dirs.staging("pv-weed")),
            target: self.on_node(&self.dirs.target("pod-a", "pv-weed")),
            local_target: self.dirs.target("pod-a", "pv-weed"),
            ctx: weed_ctx,
        };
        let model_ctx: HashMap<String, String> = [
            ("plugin".to_string(), "model".to_string()),
            ("reference".into(), self.model.reference.clone()),
            ("insecure".into(), "true".into()),
        ]
        .into();
        let model = Volume {
            id: "pv-model".into(),
            staging: self.on_node(&self.dirs.staging("pv-model")),
            target: self.on_node(&self.dirs.target("pod-b", "pv-model")),
            local_target: self.dirs.target("pod-b", "pv-model"),
            ctx: model_ctx,
        };
        let vols = Volumes { weed, model };
        self.publish(csi, &vols).await;
        fs::write(vols.weed.local_target.join("before-update.txt"), b"written before the update").unwrap();
        vols
    }

    /// Stage (retrying while the model downloads, as kubelet does) and publish both volumes, the
    /// model MULTI_NODE_READER_ONLY (staged with the capability it is published with).
    async fn publish(&self, csi: &mut NodeClient<UnixChannel>, vols: &Volumes) {
        let reader = || Some(common::capability(csi::volume_capability::access_mode::Mode::MultiNodeReaderOnly));
        for (v, capability) in [(&vols.weed, Some(common::multi_writer())), (&vols.model, reader())] {
            let end = Instant::now() + Duration::from_secs(120);
            let req =
                csi::NodeStageVolumeRequest { volume_capability: capability, ..stage_req(&v.id, &v.staging, &v.ctx) };
            loop {
                match csi.node_stage_volume(req.clone()).await {
                    Ok(_) => break,
                    Err(s) if s.code() == tonic::Code::Unavailable && Instant::now() < end => {
                        tokio::time::sleep(Duration::from_millis(100)).await
                    }
                    Err(s) => panic!("NodeStageVolume {}: {s:?}", v.id),
                }
            }
        }
        csi.node_publish_volume(publish_req(
            &vols.weed.id,
            &vols.weed.staging,
            &vols.weed.target,
            false,
            &vols.weed.ctx,
        ))
        .await
        .unwrap();
        let mut req = publish_req(&vols.model.id, &vols.model.staging, &vols.model.target, true, &vols.model.ctx);
        req.volume_capability = reader();
        csi.node_publish_volume(req).await.unwrap();
    }

    async fn unpublish_and_unstage(&self, csi: &mut NodeClient<UnixChannel>, vols: &Volumes) {
        for v in [&vols.weed, &vols.model] {
            csi.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                volume_id: v.id.clone(),
                target_path: v.target.display().to_string(),
            })
            .await
            .unwrap();
            csi.node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: v.id.clone(),
                staging_target_path: v.staging.display().to_string(),
            })
            .await
            .unwrap();
        }
    }

    /// A reader loop on each pod target: the SeaweedFS one reads the file written before the
    /// update and writes and reads back one of its own, the model one reads its config.
    fn readers(&self, vols: &Volumes) -> Vec<Reader> {
        let model_config = fs::read(vols.model.local_target.join("config.json")).unwrap();
        vec![
            Reader::start(
                "seaweedfs",
                vols.weed.local_target.clone(),
                "before-update.txt",
                b"written before the update".to_vec(),
                true,
            ),
            Reader::start("model", vols.model.local_target.clone(), "config.json", model_config, false),
        ]
    }

    /// The live `weed mount` processes of this node's volumes, with their start times.
    fn fuse_processes(&self) -> BTreeMap<i32, u64> {
        pids_of("weed", &format!("-filer={}", self.weed.filer))
            .into_iter()
            .filter_map(|pid| Some((pid, start_time(pid)?)))
            .collect()
    }

    /// Fail unless every one of `pids` lives outside `c`'s cgroup in every hierarchy: the
    /// runtime kills what is inside it when the container stops.
    fn assert_outside(&self, pids: &BTreeMap<i32, u64>, c: &Container) {
        for pid in pids.keys() {
            let cgroups = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            let inside: Vec<&str> = cgroups
                .lines()
                .filter(|l| {
                    l.splitn(3, ':')
                        .nth(2)
                        .is_some_and(|p| p == c.cgroups_path || p.starts_with(&format!("{}/", c.cgroups_path)))
                })
                .collect();
            assert!(
                inside.is_empty(),
                "FUSE process {pid} is inside container {}'s cgroup {} in {} hierarchies, so the runtime kills it \
                 with the container: {inside:?}\n(all of /proc/{pid}/cgroup:\n{cgroups})",
                c.id,
                c.cgroups_path,
                inside.len()
            );
        }
    }

    /// The `report` of the host daemon's "reconciled volume state" line in `c`'s log.
    fn reconciled(&self, c: &Container) -> String {
        until(&format!("{}: \"reconciled volume state\" in its log", c.id), Duration::from_secs(30), || {
            let log = fs::read_to_string(&c.log).unwrap_or_default();
            log.lines().rfind(|l| l.contains("reconciled volume state")).map(|l| {
                let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("a JSON log line ({e}): {l}"));
                v["fields"]["report"].as_str().unwrap_or(l).to_string()
            })
        })
    }

    /// `mounthost client list` in the front container (`kubectl exec` of docs/install.md): what
    /// the host daemon holds, through its socket.
    fn client_list(&self, front: &Container) -> Vec<Value> {
        let entrypoint = self.images[0].config["config"]["Entrypoint"][0].as_str().unwrap().to_string();
        let out = self.runtime.exec(front, &[&entrypoint, "--host-socket=/run/mounthost/host.sock", "client", "list"]);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("client list printed no JSON ({e}): {out}"))
    }

    /// The containers' logs and containerd's, for a failure.
    fn logs(&self) -> String {
        let mut out = String::new();
        for e in fs::read_dir(self.runtime.dir.join("logs")).into_iter().flatten().flatten() {
            out += &format!(
                "--- {}\n{}\n",
                e.path().display(),
                tail(&fs::read_to_string(e.path()).unwrap_or_default(), 60)
            );
        }
        out + &format!(
            "--- containerd.log\n{}\n",
            tail(&fs::read_to_string(self.runtime.dir.join("containerd.log")).unwrap_or_default(), 30)
        )
    }

    /// Run `body` on a tokio runtime; on a panic print the logs first.
    fn run(&self, body: impl AsyncFnOnce()) {
        let rt = tokio::runtime::Runtime::new().unwrap();
        if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.block_on(body()))) {
            eprintln!("{}", self.logs());
            std::panic::resume_unwind(e);
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Every container and the runtime first (fields drop in order, but the FUSE processes
        // must go before the mounts they serve are detached).
        let ids: Vec<String> = self.runtime.live.lock().unwrap().iter().map(|c| c.id.clone()).collect();
        for id in ids {
            self.runtime.remove(&id);
        }
        for pid in self.fuse_processes().keys() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), nix::sys::signal::SIGKILL);
        }
        remove_cgroups(&format!("{}-", self.cgroup_prefix));
    }
}

// ---------------------------------------------------------------------------------------------
// The reader loop

/// A thread reading (and writing) a pod target in a loop until stopped, counting what failed.
struct Reader {
    name: &'static str,
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<ReaderLog>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Debug, Default, Clone)]
struct ReaderLog {
    reads: u64,
    writes: u64,
    errors: u64,
    /// The first errors, with the time since the loop started.
    first_errors: Vec<String>,
    /// The longest single operation.
    longest: Duration,
}

impl Reader {
    fn start(name: &'static str, dir: PathBuf, file: &str, expected: Vec<u8>, write: bool) -> Reader {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(ReaderLog::default()));
        let (s, l, file) = (stop.clone(), log.clone(), file.to_string());
        let thread = std::thread::spawn(move || {
            let started = Instant::now();
            let mut n = 0u64;
            while !s.load(Ordering::SeqCst) {
                n += 1;
                let t = Instant::now();
                let read = fs::read(dir.join(&file)).map_err(|e| e.to_string()).and_then(|got| {
                    (got == expected)
                        .then_some(())
                        .ok_or_else(|| format!("{file}: {} bytes, not the {} written", got.len(), expected.len()))
                });
                let wrote = write.then(|| {
                    let mine = format!("reader {n}");
                    fs::write(dir.join("reader.txt"), &mine)
                        .and_then(|()| fs::read(dir.join("reader.txt")))
                        .map_err(|e| e.to_string())
                        .and_then(|got| {
                            (got == mine.as_bytes()).then_some(()).ok_or("reader.txt read back other bytes".into())
                        })
                });
                let took = t.elapsed();
                let mut log = l.lock().unwrap();
                log.reads += 1;
                log.writes += u64::from(wrote.is_some());
                log.longest = log.longest.max(took);
                for e in [read.err(), wrote.and_then(Result::err)].into_iter().flatten() {
                    log.errors += 1;
                    if log.first_errors.len() < 10 {
                        log.first_errors.push(format!("+{:.3} s: {e}", started.elapsed().as_secs_f64()));
                    }
                }
                drop(log);
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        Reader { name, stop, log, thread: Some(thread) }
    }

    fn snapshot(&self) -> ReaderLog {
        self.log.lock().unwrap().clone()
    }

    /// Stop the loop (waiting at most 10 s for the operation in flight) and return its log.
    fn finish(mut self) -> ReaderLog {
        self.stop.store(true, Ordering::SeqCst);
        let t = self.thread.take().unwrap();
        let end = Instant::now() + Duration::from_secs(10);
        while !t.is_finished() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut log = self.snapshot();
        if t.is_finished() {
            t.join().unwrap();
        } else {
            log.errors += 1;
            log.first_errors.push(format!("{}: an operation has hung for more than 10 s", self.name));
        }
        log
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Stop the readers and fail unless none saw an error; a line for each.
fn finish_readers(readers: Vec<Reader>) -> String {
    let mut lines = Vec::new();
    for r in readers {
        let name = r.name;
        let log = r.finish();
        assert_eq!(log.errors, 0, "the {name} reader loop saw errors: {:?}", log.first_errors);
        assert!(log.reads > 10, "the {name} reader loop barely ran: {log:?}");
        lines.push(format!(
            "{name}: {} reads, {} writes, 0 errors, longest {} ms",
            log.reads,
            log.writes,
            log.longest.as_millis()
        ));
    }
    lines.join("; ")
}

/// The `adopted: N` of a reconcile report.
fn count(report: &str, field: &str) -> usize {
    report
        .split_once(&format!("{field}: "))
        .and_then(|(_, r)| r.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in the reconcile report {report:?}"))
}

/// Every volume `client list` shows healthy, with its FUSE pid and no restart.
fn assert_listed(listed: &[Value], vols: &Volumes, weed_pid: i32) {
    let ids: BTreeSet<&str> = listed.iter().filter_map(|v| v["volumeId"].as_str()).collect();
    assert_eq!(ids, BTreeSet::from([vols.weed.id.as_str(), vols.model.id.as_str()]), "{listed:?}");
    for v in listed {
        assert_eq!(v["healthy"], true, "{v}");
        assert_eq!(v["restarts"], 0, "a FUSE process was restarted: {v}");
        assert_eq!(v["targets"].as_array().map(Vec::len), Some(1), "{v}");
    }
    let weed = listed.iter().find(|v| v["volumeId"] == vols.weed.id.as_str()).unwrap();
    assert_eq!(weed["pid"], weed_pid, "{weed}");
}

// ---------------------------------------------------------------------------------------------
// The tests

/// A rolling update of the host container (the DaemonSet's maxUnavailable: the old container
/// stopped the kubelet way, then a new one from the other image), then of the front's: the
/// FUSE process keeps its pid and start time, outside the container's cgroup, every pod target
/// keeps working (the reader loops see no error), and the new host daemon adopts both volumes.
#[test]
fn rolling_updates_of_the_host_and_the_front_keep_every_volume() {
    if !runs_here("rolling_updates_of_the_host_and_the_front_keep_every_volume") {
        return;
    }
    let node = Node::start();
    node.run(async || {
        let host1 = node.start_host("host-1", OLD);
        let front1 = node.start_front("front-1", OLD).await;
        let mut csi = node.csi();
        let vols = node.stage_and_publish(&mut csi).await;
        let before = node.fuse_processes();
        assert_eq!(before.len(), 1, "one weed mount for the SeaweedFS volume: {before:?}");
        let weed_pid = *before.keys().next().unwrap();
        node.assert_outside(&before, &host1);
        assert_listed(&node.client_list(&front1), &vols, weed_pid);
        let readers = node.readers(&vols);
        std::thread::sleep(Duration::from_millis(500));

        // The host: stopped the kubelet way, then the new version.
        let stopped = node.runtime.stop_like_kubelet(&host1, node.grace("mounthost-host"));
        assert!(
            !stopped.killed_after_grace,
            "the host daemon did not exit on SIGTERM within the grace period: {stopped:?}"
        );
        assert!(stopped.processes.contains(&host1.pid), "{stopped:?}");
        assert_eq!(node.fuse_processes(), before, "the FUSE process outlives the host container");
        for pid in &stopped.processes {
            assert!(start_time(*pid).is_none(), "process {pid} of the stopped host container still runs");
        }
        std::thread::sleep(Duration::from_millis(500));
        let host2 = node.start_host("host-2", NEW);
        let report = node.reconciled(&host2);
        assert_eq!(count(&report, "adopted"), 2, "{report}");
        assert_eq!(node.fuse_processes(), before, "the new host daemon adopted the same process");
        node.assert_outside(&before, &host2);
        assert_listed(&node.client_list(&front1), &vols, weed_pid);
        let during = readers.iter().map(|r| (r.name, r.snapshot().errors)).collect::<Vec<_>>();
        println!(
            "checked: host rolling update {} -> {}: SIGTERM to exit {} ms, {} container processes gone; \
             weed pids before {:?}, after {:?}; adopted: {report}; reader errors so far {during:?}",
            host1.image,
            host2.image,
            stopped.took.as_millis(),
            stopped.processes.len(),
            before.keys().collect::<Vec<_>>(),
            node.fuse_processes().keys().collect::<Vec<_>>()
        );

        // The front: stopped the kubelet way, then the new version; kubelet's calls work again.
        let stopped = node.runtime.stop_like_kubelet(&front1, node.grace("mounthost-node"));
        assert!(!stopped.killed_after_grace, "the front did not exit on SIGTERM within the grace period: {stopped:?}");
        let front2 = node.start_front("front-2", NEW).await;
        let mut csi = node.csi();
        for v in [&vols.weed, &vols.model] {
            let stats = csi
                .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                    volume_id: v.id.clone(),
                    volume_path: v.target.display().to_string(),
                    staging_target_path: String::new(),
                })
                .await
                .unwrap()
                .into_inner();
            assert!(!stats.volume_condition.unwrap_or_default().abnormal, "{}", v.id);
        }
        assert_eq!(node.fuse_processes(), before, "the front's update touches no FUSE process");
        assert_listed(&node.client_list(&front2), &vols, weed_pid);
        std::thread::sleep(Duration::from_millis(500));
        let readers = finish_readers(readers);
        println!(
            "checked: front rolling update {} -> {}: SIGTERM to exit {} ms; weed pids {:?}; reader loops: {readers}",
            front1.image,
            front2.image,
            stopped.took.as_millis(),
            node.fuse_processes().keys().collect::<Vec<_>>()
        );

        // Pods gone: kubelet's unpublish and unstage leave nothing mounted and no FUSE process.
        node.unpublish_and_unstage(&mut csi, &vols).await;
        until("the weed mount exits after unstage", Duration::from_secs(20), || {
            node.fuse_processes().is_empty().then_some(())
        });
        let left: Vec<PathBuf> =
            common::mounts_below(&node.dirs.kubelet).into_iter().filter(|m| m != &node.dirs.kubelet).collect();
        assert!(left.is_empty(), "mounts left below kubelet's directory: {left:?}");
    });
}

/// A surge update (maxSurge: 1): a second host container started while the first runs waits for
/// the state directory's lock as a standby (ready, touching nothing), and when the first is
/// stopped the kubelet way it takes over and adopts every volume with the same FUSE process.
#[test]
fn a_surge_host_container_stands_by_then_adopts() {
    if !runs_here("a_surge_host_container_stands_by_then_adopts") {
        return;
    }
    let node = Node::start();
    node.run(async || {
        let host1 = node.start_host("host-1", OLD);
        let front = node.start_front("front-1", OLD).await;
        let mut csi = node.csi();
        let vols = node.stage_and_publish(&mut csi).await;
        let before = node.fuse_processes();
        assert_eq!(before.len(), 1, "{before:?}");
        let readers = node.readers(&vols);
        let records = node.dirs.state.join("volumes");
        let state_before = listing(&records);
        let socket_before = fs::metadata(node.local(Path::new("/run/mounthost/host.sock"))).unwrap().ino();

        // The surge container: the rendered host container with its metrics port moved, as an
        // overlay for surge updates must move it (the shipped DaemonSet declares 9810 on the host
        // network, which a second pod on the node cannot bind as well; docs/install.md, "Upgrades
        // and rollbacks"). It stands by, ready, and touches nothing.
        let surge = (node.host_template().0, with_port(&node.host_template().1, SURGE_PORT));
        let host2 = node.run_container(&surge, "host-2", NEW);
        let standby = until("host-2 says it stands by", Duration::from_secs(30), || {
            node.assert_running(&host2);
            let log = fs::read_to_string(&host2.log).unwrap_or_default();
            log.lines().find(|l| l.contains("standing by")).map(String::from)
        });
        node.assert_runs_entrypoint(&host2, NEW);
        assert!(
            standby.contains(&host1.pid.to_string()),
            "the standby names the holder's pid {}: {standby}",
            host1.pid
        );
        let (status, body) = until("/readyz of the standby", Duration::from_secs(30), || {
            node.readyz(&surge.1).filter(|(_, b)| b.starts_with("standby"))
        });
        assert_eq!(status, 200, "{body}");
        std::thread::sleep(Duration::from_secs(1));
        assert_eq!(listing(&records), state_before, "the standby touched no record");
        assert_eq!(fs::metadata(node.local(Path::new("/run/mounthost/host.sock"))).unwrap().ino(), socket_before);
        assert!(!fs::read_to_string(&host2.log).unwrap_or_default().contains("reconciled volume state"));

        // The old one stopped the kubelet way: the standby takes over and adopts.
        node.assert_outside(&before, &host1);
        let stopped = node.runtime.stop_like_kubelet(&host1, node.grace("mounthost-host"));
        assert!(!stopped.killed_after_grace, "{stopped:?}");
        let report = node.reconciled(&host2);
        assert_eq!(count(&report, "adopted"), 2, "{report}");
        until("host-2 ready", Duration::from_secs(30), || {
            node.readyz(&surge.1).filter(|(s, b)| *s == 200 && b.starts_with("ready")).map(|_| ())
        });
        assert_eq!(node.fuse_processes(), before, "the surge daemon adopted the same FUSE process");
        assert_listed(&node.client_list(&front), &vols, *before.keys().next().unwrap());
        let readers = finish_readers(readers);
        println!(
            "checked: surge update {} -> {}: standby {:?}; after the old one stopped ({} ms): {report}; \
             weed pids before {:?} after {:?}; reader loops: {readers}",
            host1.image,
            host2.image,
            body.trim(),
            stopped.took.as_millis(),
            before.keys().collect::<Vec<_>>(),
            node.fuse_processes().keys().collect::<Vec<_>>()
        );
        node.unpublish_and_unstage(&mut csi, &vols).await;
    });
}

/// Bytes of `model`'s layers the registry has served (its log's completed blob GETs).
fn layer_bytes_served(registry: &Registry, model: &PushedModel) -> u64 {
    registry
        .log()
        .lines()
        .filter(|l| l.contains("msg=\"response completed\"") && l.contains("http.request.method=GET "))
        .filter(|l| model.layers.iter().any(|layer| l.contains(&format!("/blobs/{}", layer.descriptor.digest))))
        .filter_map(|l| {
            l.split_whitespace().find_map(|w| w.strip_prefix("http.response.written="))?.parse::<u64>().ok()
        })
        .sum()
}

/// The port the surge host container gets instead of the manifest's (what an overlay for surge
/// updates would set).
const SURGE_PORT: u64 = 9820;

/// Container `c` with its metrics port (the readiness probe's) moved to `port`: in the
/// `--metrics-address` argument, the declared ports and the probes.
fn with_port(c: &Value, port: u64) -> Value {
    let mut c = c.clone();
    let old = c["readinessProbe"]["httpGet"]["port"].as_u64().expect("a readiness probe on a numbered port");
    let mut moved = 0;
    for arg in c["args"].as_array_mut().into_iter().flatten() {
        let text = arg.as_str().unwrap().to_string();
        if let Some(address) = text.strip_prefix("--metrics-address=")
            && let Some(host) = address.strip_suffix(&format!(":{old}"))
        {
            *arg = json!(format!("--metrics-address={host}:{port}"));
            moved += 1;
        }
    }
    assert_eq!(moved, 1, "one --metrics-address on port {old} in {}", c["args"]);
    for probe in ["readinessProbe", "livenessProbe"] {
        if c[probe]["httpGet"]["port"] == old {
            c[probe]["httpGet"]["port"] = json!(port);
        }
    }
    for p in c["ports"].as_array_mut().into_iter().flatten() {
        if p["containerPort"] == old {
            p["containerPort"] = json!(port);
        }
    }
    c
}

/// Names, sizes and modification times of the files in `dir`.
fn listing(dir: &Path) -> BTreeMap<String, (u64, i64)> {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            Some((e.file_name().to_string_lossy().into_owned(), (m.len(), m.mtime_nsec() + m.mtime() * 1_000_000_000)))
        })
        .collect()
}

/// The paths below `dir` at most `depth` levels deep, relative, directories marked with a `/`,
/// sorted.
fn tree(dir: &Path, depth: usize) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, depth: usize, out: &mut Vec<String>) {
        for e in fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.push(format!("{rel}/"));
                if depth > 1 {
                    walk(root, &p, depth - 1, out);
                }
            } else {
                out.push(rel);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, depth, &mut out);
    out.sort();
    out
}

/// The entries of a [`tree`] that hold nothing listed (files, empty or deepest directories).
fn leaves(tree: &[String]) -> Vec<&str> {
    tree.iter().filter(|p| !tree.iter().any(|q| q != *p && q.starts_with(p.as_str()))).map(String::as_str).collect()
}

impl Node {
    /// A simulated node reboot (no kernel reboot is possible here). What it does: SIGKILL of
    /// every process of the node (both containers, every FUSE process); its cgroups removed (they
    /// live in the kernel); every mount below kubelet's and the state directory detached (the
    /// kernel forgets them); `/run/mounthost` emptied (a tmpfs on a node); the records' boot id
    /// replaced by another boot's. What it does not: reboot the kernel (the boot id of
    /// `/proc/sys/kernel/random/boot_id` stays the same; the records say otherwise), lose data
    /// not yet written back (the test's writes are synced), restart the backends (they are not on
    /// the node). Returns the records it rewrote.
    fn reboot(&self) -> Vec<String> {
        let ids: Vec<String> = self.runtime.live.lock().unwrap().iter().map(|c| c.id.clone()).collect();
        for id in ids {
            self.runtime.remove(&id);
        }
        for pid in self.fuse_processes().keys() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), nix::sys::signal::SIGKILL);
        }
        let node_groups = format!("{}-", self.cgroup_prefix);
        remove_cgroups(&node_groups);
        assert!(cgroups_named(&node_groups).is_empty(), "{:?}", cgroups_named(&node_groups));
        for dir in [&self.dirs.kubelet, &self.dirs.state] {
            let mut below: Vec<PathBuf> = common::all_mounts_below(dir).into_iter().filter(|m| m != dir).collect();
            below.sort();
            for m in below.iter().rev() {
                nix::mount::umount2(m, MntFlags::MNT_DETACH)
                    .unwrap_or_else(|e| panic!("detaching {}: {e}", m.display()));
            }
        }
        let run = self.local(Path::new("/run/mounthost"));
        for e in fs::read_dir(&run).unwrap().flatten() {
            let _ = fs::remove_dir_all(e.path()).or_else(|_| fs::remove_file(e.path()));
        }
        let mut rewritten = Vec::new();
        for e in fs::read_dir(self.dirs.state.join("volumes")).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let mut v: Value = serde_json::from_slice(&fs::read(e.path()).unwrap()).unwrap();
            v["bootId"] = json!("00000000-0000-0000-0000-000000000000");
            fs::write(e.path(), v.to_string()).unwrap();
            rewritten.push(name);
        }
        rewritten.sort();
        rewritten
    }
}

/// After a node reboot the host container starts again, discards every record of the earlier
/// boot and clears what they left; kubelet's NodeStageVolume and NodePublishVolume then build
/// both volumes again (the model from the blob cache, which survives on disk).
#[test]
fn after_a_reboot_the_host_container_cleans_up_and_kubelet_rebuilds() {
    if !runs_here("after_a_reboot_the_host_container_cleans_up_and_kubelet_rebuilds") {
        return;
    }
    let node = Node::start();
    node.run(async || {
        let _host = node.start_host("host-1", OLD);
        let _front = node.start_front("front-1", OLD).await;
        let mut csi = node.csi();
        let vols = node.stage_and_publish(&mut csi).await;
        File::open(vols.weed.local_target.join("before-update.txt")).unwrap().sync_all().unwrap();
        let served = layer_bytes_served(&node.registry, &node.model);

        let rewritten = node.reboot();
        assert_eq!(rewritten.len(), 2, "{rewritten:?}");
        assert!(node.fuse_processes().is_empty());
        let kubelet_left = tree(&node.dirs.kubelet, 8);
        let state_left = tree(&node.dirs.state, 3);

        let host = node.start_host("host-2", NEW);
        let front = node.start_front("front-2", NEW).await;
        let report = node.reconciled(&host);
        assert_eq!(count(&report, "adopted"), 0, "{report}");
        assert_eq!(count(&report, "cleaned"), 2, "{report}");
        let listed = node.client_list(&front);
        assert!(listed.is_empty(), "records of the earlier boot are gone: {listed:?}");
        let records: Vec<String> =
            listing(&node.dirs.state.join("volumes")).into_keys().filter(|n| !n.starts_with('.')).collect();
        assert!(records.is_empty(), "{records:?}");
        let mounts: Vec<PathBuf> =
            common::mounts_below(&node.dirs.kubelet).into_iter().filter(|m| m != &node.dirs.kubelet).collect();
        assert!(mounts.is_empty(), "{mounts:?}");
        assert!(node.fuse_processes().is_empty());
        let volume_groups = cgroups_named(&format!("{}-volumes", node.cgroup_prefix));
        assert!(volume_groups.is_empty(), "no volume, no volume cgroup: {volume_groups:?}");
        let kubelet_after = tree(&node.dirs.kubelet, 8);
        let state_after = tree(&node.dirs.state, 3);
        let cleaned: Vec<&String> = state_left.iter().filter(|p| !state_after.contains(p)).collect();
        let kubelet_cleaned: Vec<&String> = kubelet_left.iter().filter(|p| !kubelet_after.contains(p)).collect();
        // The volumes' own directories went with their records; the node-wide blob cache stays.
        for record in &rewritten {
            let key = record.trim_end_matches(".json");
            assert!(!state_after.iter().any(|p| p.contains(key)), "{key} left in the state directory: {state_after:?}");
        }
        assert!(state_after.iter().any(|p| p == "cache/blobs/"), "the blob cache survives: {state_after:?}");

        // kubelet's calls build both volumes again.
        let mut csi = node.csi();
        node.publish(&mut csi, &vols).await;
        assert_eq!(fs::read(vols.weed.local_target.join("before-update.txt")).unwrap(), b"written before the update");
        let (hash, _) = common::registry::sha256_file(&vols.model.local_target.join("model.safetensors"));
        assert_eq!(Some(hash.as_str()), node.model.file("model.safetensors").map(|(h, _)| h));
        std::thread::sleep(Duration::from_millis(500));
        // The new daemon proves the cached layers by a few of their bytes (4 ranges of 64 bytes
        // each, docs/model-cache.md): no more came from the registry.
        let again = layer_bytes_served(&node.registry, &node.model) - served;
        let proofs = 256 * node.model.layers.len() as u64;
        assert!(again <= proofs, "the model's layers came from the blob cache, not the registry: {again} bytes served");
        println!(
            "checked: reboot: records rewritten {rewritten:?}; the new host daemon: {report}; client list empty; \
             cleaned in the state directory {:?}; cleaned below kubelet's directory {kubelet_cleaned:?}; \
             left there {:?}; no volume cgroup; \
             rebuilt by kubelet's calls: weed pid {:?}, the model from the cache",
            leaves(&cleaned.into_iter().cloned().collect::<Vec<_>>()),
            leaves(&kubelet_after),
            node.fuse_processes().keys().collect::<Vec<_>>()
        );
        node.unpublish_and_unstage(&mut csi, &vols).await;
    });
}
