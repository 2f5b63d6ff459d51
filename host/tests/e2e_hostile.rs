//! A hostile plugin against the real daemons (issue 32), with real FUSE processes (the `bindfs`
//! test plugin, whose `env` parameter sets whatever environment a test asks for). Root, each
//! test in a private mount namespace.
//!
//! - The environment is closed by default: a plan setting a variable of the deny list (`PATH`,
//!   `http_proxy`, `GIT_SSH_COMMAND`, ...) is refused at NodeStageVolume with nothing spawned
//!   or mounted, a harmless one reaches the program exactly, and host config allows a denied one
//!   by name (after which the program gets only the names its rules allow).
//! - What an unprivileged FUSE program can write is capped: a program (the `misbehave` test
//!   plugin's `host-fd` mode runs a script the test writes, as the volume's FUSE id) that tries
//!   to fill the disk stops at its RLIMIT_FSIZE with EFBIG and lives on, one that forks stops at
//!   its cgroup's `pids.max`, and its cgroup holds the configured block I/O throttle; the failed
//!   stage leaves no process, mount or group.

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::{NodeDirs, guarded, in_private_namespace, mounts_below, pids_of, stage_req};
use mounthost::proto::csi;
use mounthost::proto::csi::node_client::NodeClient;
use mounthost::unpriv::grpc::{UnixChannel, channel};
use tonic::Code;

fn ctx(env: &str) -> HashMap<String, String> {
    [("plugin".to_string(), "bindfs".to_string()), ("env".into(), env.into())].into()
}

/// The environment of process `pid`, sorted.
fn environ(pid: i32) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let mut vars: Vec<String> =
        raw.split(|b| *b == 0).filter(|s| !s.is_empty()).map(|s| String::from_utf8_lossy(s).into_owned()).collect();
    vars.sort();
    vars
}

async fn unstage(node: &mut NodeClient<UnixChannel>, id: &str, staging: &Path) {
    let req =
        csi::NodeUnstageVolumeRequest { volume_id: id.into(), staging_target_path: staging.display().to_string() };
    node.node_unstage_volume(req).await.unwrap();
}

/// Stage `id` with `env`, expecting INVALID_ARGUMENT (twice: kubelet retries) with nothing
/// spawned or mounted; returns the message.
async fn refused(node: &mut NodeClient<UnixChannel>, id: &str, staging: &Path, env: &str) -> String {
    std::fs::create_dir_all(staging).unwrap();
    let mut message = String::new();
    for _ in 0..2 {
        let status = node.node_stage_volume(stage_req(id, staging, &ctx(env))).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{env}: {status:?}");
        message = status.message().to_string();
        assert!(pids_of("bindfs", &staging.display().to_string()).is_empty(), "{env}: bindfs spawned");
        assert!(mounts_below(staging).is_empty(), "{env}: something mounted");
    }
    message
}

/// Stage `id` with `env`, and return the environment its bindfs runs with.
async fn staged_env(node: &mut NodeClient<UnixChannel>, id: &str, staging: &Path, env: &str) -> Vec<String> {
    std::fs::create_dir_all(staging).unwrap();
    node.node_stage_volume(stage_req(id, staging, &ctx(env))).await.unwrap();
    let pids = pids_of("bindfs", &staging.display().to_string());
    assert_eq!(pids.len(), 1, "{pids:?}");
    let seen = environ(pids[0]);
    unstage(node, id, staging).await;
    seen
}

#[test]
fn a_plans_environment_passes_the_deny_list_only_where_host_config_allows_it() {
    if !in_private_namespace("a_plans_environment_passes_the_deny_list_only_where_host_config_allows_it") {
        return;
    }
    let dirs = NodeDirs::new();
    // bindfs without its rule set (@bindfs allows no variable at all): the deny list's case.
    let mut args = dirs.bindfs_args();
    args.push("--program-rules=bindfs=none".into());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (id, staging) = ("bindfs~pv-env", dirs.staging("pv-env"));
    {
        let _host = dirs.start_host(&args);
        let _front = dirs.start_front(&args);
        guarded(&dirs, || {
            rt.block_on(async {
                let ch = channel(&dirs.csi_sock);
                common::wait_ready(&ch).await;
                let mut node = NodeClient::new(ch);
                for (env, name, why) in [
                    ("TZ=UTC;PATH=/tmp/evil-bin", "PATH", "names a program or library the program would run or load"),
                    ("http_proxy=http://10.0.0.1:3128", "http_proxy", "sends the program's connections"),
                    ("GIT_SSH_COMMAND=sh -c id", "GIT_SSH_COMMAND", "names a program or library"),
                    ("OPENSSL_CONF=/tmp/evil.cnf", "OPENSSL_CONF", "names a program or library"),
                    ("HOME=/tmp/pod-writable", "HOME", "moves where the program reads its configuration from"),
                    ("RCLONE_RC=true", "RCLONE_RC", "names a program or library"),
                ] {
                    let m = refused(&mut node, id, &staging, env).await;
                    assert!(m.contains("refused at step 2 (spawn-fuse)"), "{m}");
                    assert!(m.contains(&format!("program \"bindfs\": environment variable {name:?} {why}")), "{m}");
                    assert!(m.contains(&format!("(--program-args bindfs:env={name})")), "{m}");
                }
                // The loader's variables cannot be allowed at all; the message says so.
                let m = refused(&mut node, id, &staging, "LD_PRELOAD=/tmp/x.so").await;
                assert!(m.contains("would change what the dynamic loader runs"), "{m}");
                // A harmless variable reaches bindfs exactly, and nothing of the daemon's own but
                // the empty home of its mount namespace.
                assert_eq!(
                    staged_env(&mut node, id, &staging, "TZ=UTC;LANG=C.UTF-8").await,
                    ["HOME=/tmp/home", "LANG=C.UTF-8", "TZ=UTC"]
                );
            })
        });
    }
    // Host config allows PATH by name: it passes, and bindfs now has rules, so only the names
    // they allow pass.
    let mut allowing = args.clone();
    allowing.extend(["--program-args=bindfs:env=PATH".to_string(), "--program-args=bindfs:env=TZ".to_string()]);
    let _host = dirs.start_host(&allowing);
    let _front = dirs.start_front(&allowing);
    guarded(&dirs, || {
        rt.block_on(async {
            let ch = channel(&dirs.csi_sock);
            common::wait_ready(&ch).await;
            let mut node = NodeClient::new(ch);
            assert_eq!(
                staged_env(&mut node, id, &staging, "PATH=/usr/bin:/bin;TZ=UTC").await,
                ["HOME=/tmp/home", "PATH=/usr/bin:/bin", "TZ=UTC"]
            );
            let m = refused(&mut node, id, &staging, "LANG=C.UTF-8").await;
            assert!(
                m.contains("program \"bindfs\": environment variable \"LANG\" is not allowed by host config (allowed: PATH, TZ)"),
                "{m}"
            );
            assert!(mounts_below(&staging).is_empty());
        })
    });
}

/// The live processes whose real user id is `uid` (a zombie is dead: killed, and its reaping
/// is its parent's, PID 1's once its own parent exited).
fn processes_of(uid: u32) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else { continue };
        if status.lines().any(|l| l.starts_with("State:") && l.contains("zombie")) {
            continue;
        }
        let real = status.lines().find_map(|l| l.strip_prefix("Uid:")?.split_whitespace().next()?.parse::<u32>().ok());
        if real == Some(uid) {
            pids.push(pid);
        }
    }
    pids
}

/// The block device `path` lies on, `MAJ:MIN`, or another of the node's where that one is not a
/// block device (an overlay, a tmpfs): the throttle rule only has to name a real device.
fn block_device_of(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path).unwrap().dev();
    let own = format!("{}:{}", rustix::fs::major(dev), rustix::fs::minor(dev));
    let sys = Path::new("/sys/dev/block").join(&own);
    // A whole disk (I/O limits take no partition): the path's own, the disk of its partition,
    // or else the first the node has.
    if sys.exists() && !sys.join("partition").exists() {
        return own;
    }
    if sys.join("partition").exists() {
        return std::fs::read_to_string(sys.join("../dev")).unwrap().trim().to_string();
    }
    let mut all: Vec<String> = std::fs::read_dir("/sys/dev/block")
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|d| !Path::new("/sys/dev/block").join(d).join("partition").exists())
        .collect();
    all.sort();
    all.into_iter().next().expect("a block device")
}

/// Follow what the FUSE program `program` of the test's one volume writes on its output (its
/// log, which a failed stage removes): the most of it seen, once `done` is set.
fn follow_log(
    state: &Path,
    program: &str,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<String> {
    let run = state.join("run");
    let name = format!("{program}.log");
    std::thread::spawn(move || {
        let mut seen = String::new();
        while !done.load(std::sync::atomic::Ordering::SeqCst) {
            for entry in std::fs::read_dir(&run).into_iter().flatten().flatten() {
                if let Ok(text) = std::fs::read_to_string(entry.path().join(&name)) {
                    if text.len() > seen.len() {
                        seen = text;
                    }
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        seen
    })
}

#[test]
fn an_unprivileged_program_that_fills_the_disk_or_forks_stops_at_its_caps() {
    use std::os::unix::fs::PermissionsExt;
    if !in_private_namespace("an_unprivileged_program_that_fills_the_disk_or_forks_stops_at_its_caps") {
        return;
    }
    let dirs = NodeDirs::new();
    let open = tempfile::tempdir().unwrap();
    let device = block_device_of(open.path());
    let script = open.path().join("fusetest");
    // It never answers the kernel: it reports what it could do (on its output, the volume's
    // log, which the test reads), then exits, and the stage fails. It runs in its own mount
    // namespace, where the only place it may write is its home, a tmpfs: dd, which leaves
    // SIGXFSZ as it finds it, fills that; Python forks.
    std::fs::write(
        &script,
        r#"#!/bin/sh
exec 2>&1
dd if=/dev/zero of="$HOME/big" bs=65536 count=1024 2>&1 | head -n 1
echo "written $(stat -c %s "$HOME/big") bytes as uid $(id -u)"
exec /usr/bin/python3 - <<'PY'
import os, sys
cg = dict(line.split(":", 2)[1:] for line in open("/proc/self/cgroup").read().splitlines())
if "pids" in cg:
    pids, io = f"/sys/fs/cgroup/pids{cg['pids']}/pids.max", f"/sys/fs/cgroup/blkio{cg['blkio']}/blkio.throttle.write_bps_device"
else:
    pids, io = f"/sys/fs/cgroup{cg['']}/pids.max", f"/sys/fs/cgroup{cg['']}/io.max"
print("pids.max", open(pids).read().strip())
print("throttle", open(io).read().strip(), flush=True)
forked = 0
try:
    for _ in range(64):
        if os.fork() == 0:
            import time
            time.sleep(60)
            os._exit(0)
        forked += 1
except OSError as e:
    print(f"fork {forked + 1} failed: {e.strerror}")
print(f"forked {forked} of 64", flush=True)
import time
time.sleep(1)
PY
"#,
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let plugins = dirs.root.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::copy(mounthost::stock::fixtures::path("misbehave"), plugins.join("misbehave.wasm")).unwrap();
    let args = [
        format!("--plugin-dir={}", plugins.display()),
        format!("--program=fusetest={}", script.display()),
        "--grant=misbehave:program=fusetest".into(),
        "--grant=misbehave:fstype=fuse.test".into(),
        "--fuse-max-file-mib=1".into(),
        "--fuse-max-pids=8".into(),
        format!("--fuse-io-max={device} wbps=1048576 wiops=100"),
    ];
    let _host = dirs.start_host(&args);
    let _front = dirs.start_front(&args);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (id, staging) = ("misbehave~pv-fill", dirs.staging("pv-fill"));
    let ctx: HashMap<String, String> =
        [("plugin".to_string(), "misbehave".to_string()), ("mode".into(), "host-fd".into())].into();
    guarded(&dirs, || {
        rt.block_on(async {
            let ch = channel(&dirs.csi_sock);
            common::wait_ready(&ch).await;
            let mut node = NodeClient::new(ch);
            let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let log = follow_log(&dirs.state, "fusetest", done.clone());
            let status = node.node_stage_volume(stage_req(id, &staging, &ctx)).await.unwrap_err();
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            assert!(status.message().contains("exited before mounting"), "{status:?}");
            let m = &log.join().unwrap();
            // dd stopped at the cap with EFBIG (a SIGXFSZ would have killed it silently), as
            // the volume's FUSE id.
            assert!(m.contains("dd: error writing") && m.contains("File too large"), "{m}");
            let uid: u32 = m
                .split("written 1048576 bytes as uid ")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
                .unwrap_or_else(|| panic!("no uid in {m}"));
            assert!(uid >= 2147418112, "{m}");
            assert!(m.contains("pids.max 8\n"), "{m}");
            assert!(m.contains(&format!("throttle {device} ")) && m.contains("1048576"), "{m}");
            // Python and 7 children make 8: the eighth fork failed.
            assert!(m.contains("fork 8 failed: Resource temporarily unavailable"), "{m}");
            assert!(m.contains("forked 7 of 64"), "{m}");
            // Nothing is left: no mount, no process of that id, no group.
            assert!(mounts_below(&staging).is_empty());
            assert_eq!(processes_of(uid), Vec::<i32>::new());
            assert!(dirs.cgroups_left().is_empty(), "{:?}", dirs.cgroups_left());
        })
    });
}
