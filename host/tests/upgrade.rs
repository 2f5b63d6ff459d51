//! Upgrades, rollbacks and neighbours of the host daemon, with real daemons and real FUSE
//! processes (the `bindfs` test plugin). Root, each test in a private mount namespace.
//!
//! - A volume staged by mounthost 0.1.0 (its record, `tests/fixtures/state-v1/`, and its group
//!   where 0.1.0 put it) is adopted, migrated and unstaged by this daemon, leaving nothing.
//! - A record of a schema newer than this daemon's is refused and left as it is; the others
//!   are served (what an older daemon does with this one's records after a rollback).
//! - Two daemons with different state directories and the same `--cgroup-parent` never touch
//!   each other's FUSE processes, not at start, not at unstage.
//! - A second daemon on the same state directory (a rolling update's surge pod) stands by,
//!   ready, until the first exits, then adopts what it left.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{NodeDirs, Proc, guarded, in_private_namespace, mounts_below, pids_of, publish_req, stage_req};
use mounthost::proto::csi;
use mounthost::proto::csi::node_client::NodeClient;
use mounthost::proto::host::host_client::HostClient;
use mounthost::proto::host::{ListVolumesRequest, VolumeStatus};
use mounthost::unpriv::grpc::{UnixChannel, channel};

fn bindfs_ctx() -> HashMap<String, String> {
    [("plugin".to_string(), "bindfs".to_string()), ("memoryLimitMiB".into(), "64".into())].into()
}

/// The host daemon's volumes, over its own socket.
async fn list(dirs: &NodeDirs) -> Vec<VolumeStatus> {
    HostClient::new(channel(&dirs.host_sock)).list_volumes(ListVolumesRequest {}).await.unwrap().into_inner().volumes
}

/// Stage and publish a bindfs volume through the front, and write a file through the target.
async fn stage_and_publish(node: &mut NodeClient<UnixChannel>, id: &str, staging: &Path, target: &Path) {
    node.node_stage_volume(stage_req(id, staging, &bindfs_ctx())).await.unwrap();
    node.node_publish_volume(publish_req(id, staging, target, false, &bindfs_ctx())).await.unwrap();
    std::fs::write(target.join("kept"), id).unwrap();
}

async fn unpublish_and_unstage(node: &mut NodeClient<UnixChannel>, id: &str, staging: &Path, targets: &[&Path]) {
    for t in targets {
        let req = csi::NodeUnpublishVolumeRequest { volume_id: id.into(), target_path: t.display().to_string() };
        node.node_unpublish_volume(req).await.unwrap();
    }
    let req =
        csi::NodeUnstageVolumeRequest { volume_id: id.into(), staging_target_path: staging.display().to_string() };
    node.node_unstage_volume(req).await.unwrap();
}

/// The one state file in the daemon's folder, parsed.
fn record(dirs: &NodeDirs) -> (PathBuf, serde_json::Value) {
    let files: Vec<PathBuf> = std::fs::read_dir(dirs.state.join("volumes"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| !p.file_name().unwrap().to_string_lossy().starts_with('.'))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let v = serde_json::from_slice(&std::fs::read(&files[0]).unwrap()).unwrap();
    (files[0].clone(), v)
}

fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z ")
}

/// What a kubelet-like stop does first: SIGTERM.
fn sigterm(p: &Proc) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(p.child.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
}

/// `GET path` on the daemon's metrics listener: (status, body).
fn get(addr: &str, path: &str) -> (u16, String) {
    common::http("GET", addr, path, &[], b"").unwrap()
}

/// The cgroup parent 0.1.0 used (`--cgroup-parent` itself), removed with its groups on drop,
/// also when the test fails (the daemon's own parent is `NodeDirs`'s to remove).
struct LegacyParent(mounthost::exec::cgroup::Cgroups);

impl std::ops::Deref for LegacyParent {
    type Target = mounthost::exec::cgroup::Cgroups;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Drop for LegacyParent {
    fn drop(&mut self) {
        for g in self.0.groups().unwrap_or_default() {
            let _ = self.0.release(&g);
        }
        self.0.remove_parent();
    }
}

#[test]
fn a_volume_staged_by_0_1_0_is_adopted_migrated_and_unstaged_leaving_nothing() {
    if !in_private_namespace("a_volume_staged_by_0_1_0_is_adopted_migrated_and_unstaged_leaving_nothing") {
        return;
    }
    let dirs = NodeDirs::new();
    let extra = dirs.bindfs_args();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // The paths the fixture names (kubelet's, below the test's root).
    let id = "bindfs~pv-fixture";
    let staging = dirs.kubelet.join("plugins/kubernetes.io/csi/csi.mounthost.dev/0123abcd/globalmount");
    std::fs::create_dir_all(&staging).unwrap();
    let target = dirs.target("pod-1", "pv-fixture");
    let mut host = dirs.start_host(&extra);
    let _front = dirs.start_front(&extra);
    guarded(&dirs, || {
        rt.block_on(async {
            let ch = channel(&dirs.csi_sock);
            common::wait_ready(&ch).await;
            let mut node = NodeClient::new(ch.clone());
            // A real bindfs, mounted and published; then the node made to look as 0.1.0 left it.
            stage_and_publish(&mut node, id, &staging, &target).await;
            let (path, now) = record(&dirs);
            let (pid, start_time) = (now["process"]["pid"].as_i64().unwrap(), now["process"]["start_time"].as_u64().unwrap());
            let key = path.file_stem().unwrap().to_string_lossy().to_string();
            assert_eq!(key, "3a31b25e4368ee00", "the fixture's key");
            host.kill9();
            // 0.1.0 kept the group at `<cgroup-parent>/<key>` and had no instance id.
            let own = dirs.cgroups();
            let legacy = LegacyParent(mounthost::exec::cgroup::Cgroups::detect(&dirs.cgroup_parent));
            let legacy_group = legacy.group(&key);
            {
                // The memory hierarchy only, as 0.1.0 did (elsewhere it stays where it is).
                use std::io::Write;
                let joining = legacy.prepare(&legacy_group, Some(64 << 20)).unwrap().unwrap();
                (&joining.files()[0]).write_all(pid.to_string().as_bytes()).unwrap();
            }
            std::fs::remove_dir(own.parent_dir().unwrap().join(&key)).unwrap();
            // Elsewhere 0.1.0 left its processes in the daemon's own groups (here: the roots).
            for h in own.other_hierarchies() {
                std::fs::write(h.join("cgroup.procs"), pid.to_string()).unwrap();
                std::fs::remove_dir(h.join(own.group(&key))).unwrap();
            }
            own.remove_parent();
            std::fs::remove_file(dirs.state.join("instance.json")).unwrap();
            let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
            let fixture = include_str!("fixtures/state-v1/bindfs-staged-published.json")
                .replace("@ROOT@", &dirs.root.path().display().to_string())
                .replace("@BOOT_ID@", boot.trim())
                .replace("@PID@", &pid.to_string())
                .replace("@START_TIME@", &start_time.to_string());
            std::fs::write(&path, &fixture).unwrap();

            // The new daemon adopts it: same process, target still served.
            host = dirs.start_host(&extra);
            let listed = list(&dirs).await;
            assert_eq!(listed.len(), 1);
            assert!(listed[0].healthy, "{listed:?}");
            assert_eq!(listed[0].pid as i64, pid, "adopted, not restarted");
            assert_eq!(std::fs::read_to_string(target.join("kept")).unwrap(), id);
            let logs = common::strip_ansi(&dirs.logs());
            assert!(logs.contains("adopted=1"), "{logs}");
            // The next save writes schema 2, keeping the group where 0.1.0 put it.
            let second = dirs.target("pod-2", "pv-fixture");
            node.node_publish_volume(publish_req(id, &staging, &second, false, &bindfs_ctx())).await.unwrap();
            let (_, migrated) = record(&dirs);
            assert_eq!(migrated["version"], 2);
            assert_eq!(migrated["cgroup"], format!("{}/{key}", dirs.cgroup_parent));
            assert_eq!(migrated["process"]["pid"].as_i64(), Some(pid));
            assert_eq!(legacy.procs(&legacy_group).unwrap(), vec![pid as i32], "still in 0.1.0's group");
            // Adoption put it into that group in every other hierarchy too (cgroup v1), so a
            // stop of the daemon's container cannot take it.
            for h in legacy.other_hierarchies() {
                let members = std::fs::read_to_string(h.join(&legacy_group).join("cgroup.procs")).unwrap();
                assert!(members.lines().any(|l| l.trim() == pid.to_string()), "{}: {members:?}", h.display());
            }

            // Unstage leaves nothing: no process, no group (0.1.0's included), no mount, no record.
            unpublish_and_unstage(&mut node, id, &staging, &[&target, &second]).await;
            until("bindfs exits", || !alive(pid as i32));
            assert!(!legacy.parent_dir().unwrap().join(&key).exists(), "0.1.0's group is removed");
            assert!(dirs.cgroups_left().is_empty());
            assert!(mounts_below(dirs.root.path()).is_empty(), "{:?}", mounts_below(dirs.root.path()));
            assert!(list(&dirs).await.is_empty());
            println!("checked: a schema 1 record adopted (pid {pid}), migrated to schema 2 at its next save, unstaged leaving nothing");
        })
    });
}

/// A record written by a newer daemon, through the real daemon: its calls are refused naming
/// both schema versions, the file is left byte for byte, and another volume is served.
#[test]
fn a_record_of_a_newer_schema_is_refused_by_the_real_daemon_and_the_others_served() {
    if !in_private_namespace("a_record_of_a_newer_schema_is_refused_by_the_real_daemon_and_the_others_served") {
        return;
    }
    let dirs = NodeDirs::new();
    let extra = dirs.bindfs_args();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut host = dirs.start_host(&extra);
    let _front = dirs.start_front(&extra);
    guarded(&dirs, || {
        rt.block_on(async {
            let ch = channel(&dirs.csi_sock);
            common::wait_ready(&ch).await;
            let mut node = NodeClient::new(ch.clone());
            let (staging, target) = (dirs.staging("pv-a"), dirs.target("pod", "pv-a"));
            stage_and_publish(&mut node, "bindfs~pv-a", &staging, &target).await;
            host.kill9();
            // A record of the next schema for another volume, as a newer daemon would have left it.
            let (path, mut doc) = record(&dirs);
            let future = "bindfs~pv-newer";
            doc["version"] = (mounthost::volume::state::SCHEMA_VERSION + 1).into();
            doc["volumeId"] = future.into();
            doc["fieldOfSchema3"] = serde_json::json!({"kept": true});
            let future_path = path.with_file_name(format!("{}.json", mounthost::volume::dirs::volume_key(future)));
            let bytes = doc.to_string().into_bytes();
            std::fs::write(&future_path, &bytes).unwrap();

            host = dirs.start_host(&extra);
            let staging_b = dirs.staging("pv-newer");
            let err = node.node_stage_volume(stage_req(future, &staging_b, &bindfs_ctx())).await.unwrap_err();
            assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
            assert!(
                err.message().contains(&format!(
                    "schema version {}, written by a newer mounthost; this daemon reads versions 1 to {}",
                    mounthost::volume::state::SCHEMA_VERSION + 1,
                    mounthost::volume::state::SCHEMA_VERSION
                )),
                "{}",
                err.message()
            );
            let logs = common::strip_ansi(&dirs.logs());
            assert!(logs.contains("state file unreadable; left for inspection"), "{logs}");
            assert_eq!(std::fs::read(&future_path).unwrap(), bytes, "left byte for byte");
            let listed = list(&dirs).await;
            assert!(listed.len() == 1 && listed[0].healthy, "the other volume is adopted: {listed:?}");
            assert_eq!(std::fs::read_to_string(target.join("kept")).unwrap(), "bindfs~pv-a");
            unpublish_and_unstage(&mut node, "bindfs~pv-a", &staging, &[&target]).await;
            std::fs::remove_file(&future_path).unwrap();
            println!("checked: a record of the next schema refused with FAILED_PRECONDITION and left as it was; the other volume served");
        })
    });
}

/// Two daemons, two state directories, one `--cgroup-parent`, one volume id: each owns only
/// the groups below its own parent. A restart of one (reconciliation, orphan sweep) and an
/// unstage in one leave the other's FUSE process running and its volume readable.
#[test]
fn two_daemons_side_by_side_never_touch_each_others_processes() {
    if !in_private_namespace("two_daemons_side_by_side_never_touch_each_others_processes") {
        return;
    }
    let a = NodeDirs::new();
    let mut b = NodeDirs::new();
    b.cgroup_parent = a.cgroup_parent.clone();
    let (extra_a, extra_b) = (a.bindfs_args(), b.bindfs_args());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut host_a = a.start_host(&extra_a);
    let _front_a = a.start_front(&extra_a);
    let mut host_b = b.start_host(&extra_b);
    let _front_b = b.start_front(&extra_b);
    guarded(&a, || {
        rt.block_on(async {
            let (ch_a, ch_b) = (channel(&a.csi_sock), channel(&b.csi_sock));
            common::wait_ready(&ch_a).await;
            common::wait_ready(&ch_b).await;
            let (mut node_a, mut node_b) = (NodeClient::new(ch_a), NodeClient::new(ch_b));
            let id = "bindfs~pv-shared";
            let (sa, ta) = (a.staging("pv-shared"), a.target("pod-a", "pv-shared"));
            let (sb, tb) = (b.staging("pv-shared"), b.target("pod-b", "pv-shared"));
            stage_and_publish(&mut node_a, id, &sa, &ta).await;
            stage_and_publish(&mut node_b, id, &sb, &tb).await;
            let key = mounthost::volume::dirs::volume_key(id);
            let (pa, pb) = (pids_of("bindfs", &sa.display().to_string()), pids_of("bindfs", &sb.display().to_string()));
            assert_eq!((pa.len(), pb.len()), (1, 1), "{pa:?} {pb:?}");
            assert_ne!(a.cgroups().parent_dir(), b.cgroups().parent_dir(), "each daemon has a parent of its own");
            assert_eq!((a.group_procs(&key), b.group_procs(&key)), (pa.clone(), pb.clone()));

            // An orphan in A's parent (a process of a group no record of A's claims).
            let orphan_group = a.cgroups().group("00112233aabbccdd");
            let log = a.root.path().join("orphan.log");
            let procs = a.cgroups().prepare(&orphan_group, None).unwrap();
            let args = vec!["300".to_string()];
            let spec = mounthost::exec::process::Spec { executable: Path::new("/bin/sleep"), args: &args, env: &[], log: &log };
            let orphan = mounthost::exec::process::spawn(&spec, procs.as_ref()).unwrap();

            // B restarts (reconciles and sweeps its own parent) and unstages its volume.
            host_b.kill9();
            host_b = b.start_host(&extra_b);
            assert!(alive(pa[0]) && alive(orphan.pid), "B's start touched nothing of A's");
            unpublish_and_unstage(&mut node_b, id, &sb, &[&tb]).await;
            until("B's bindfs exits", || !alive(pb[0]));
            assert!(alive(pa[0]), "B's unstage of the same volume id left A's process");
            assert_eq!(std::fs::read_to_string(ta.join("kept")).unwrap(), id, "A's volume still reads");
            assert!(b.cgroups_left().is_empty());
            let mut left = a.cgroups_left();
            left.sort();
            let mut expected = vec!["00112233aabbccdd".to_string(), key.clone()];
            expected.sort();
            assert_eq!(left, expected);
            drop(host_b);

            // A's own restart sweeps the orphan in its parent and keeps its volume.
            host_a.kill9();
            host_a = a.start_host(&extra_a);
            until("A sweeps its orphan and its group", || {
                // The orphan is this test's child: reap it, as its parent would.
                let _ = nix::sys::wait::waitpid(
                    nix::unistd::Pid::from_raw(orphan.pid),
                    Some(nix::sys::wait::WaitPidFlag::WNOHANG),
                );
                !alive(orphan.pid) && a.cgroups_left() == vec![key.clone()]
            });
            assert!(alive(pa[0]));
            unpublish_and_unstage(&mut node_a, id, &sa, &[&ta]).await;
            drop(host_a);
            println!(
                "checked: daemons A (bindfs {}) and B (bindfs {}) on one cgroup parent: B's restart and unstage left A's process, A swept only its own orphan",
                pa[0], pb[0]
            );
        })
    });
}

/// The surge pod of a rolling update: a second daemon on the same state directory answers
/// `/readyz` with `standby`, leaves the socket to the first, and once the first is stopped the
/// way kubelet stops it (SIGTERM), takes over and adopts its FUSE process (same pid).
#[test]
fn a_second_daemon_on_the_same_state_directory_stands_by_then_takes_over() {
    if !in_private_namespace("a_second_daemon_on_the_same_state_directory_stands_by_then_takes_over") {
        return;
    }
    let dirs = NodeDirs::new();
    let extra = dirs.bindfs_args();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let old = dirs.start_host(&extra);
    let _front = dirs.start_front(&extra);
    guarded(&dirs, || {
        rt.block_on(async {
            let ch = channel(&dirs.csi_sock);
            common::wait_ready(&ch).await;
            let mut node = NodeClient::new(ch.clone());
            let (staging, target) = (dirs.staging("pv-1"), dirs.target("pod", "pv-1"));
            stage_and_publish(&mut node, "bindfs~pv-1", &staging, &target).await;
            let pid = list(&dirs).await[0].pid;

            let new = dirs.spawn_host("surge", &extra);
            until("the surge daemon stands by", || {
                std::fs::read_to_string(dirs.root.path().join("surge.log")).unwrap_or_default().contains("standing by")
            });
            let surge = dirs.metrics_address("surge");
            let (status, body) = get(&surge, "/readyz");
            assert_eq!(status, 200, "{body}");
            let holder = format!("standby: another host daemon (pid {}) holds ", old.child.id());
            assert!(body.starts_with(&holder), "{body}");
            // The first still serves: a second publish goes through it.
            let second = dirs.target("pod-2", "pv-1");
            node.node_publish_volume(publish_req("bindfs~pv-1", &staging, &second, false, &bindfs_ctx())).await.unwrap();
            let surge_log = std::fs::read_to_string(dirs.root.path().join("surge.log")).unwrap();
            assert!(!surge_log.contains("reconciled volume state"), "nothing reconciled beside a live daemon: {surge_log}");
            // Another one standing by that is told to stop (SIGTERM) ends at once, having
            // touched nothing.
            let mut third = dirs.spawn_host("third", &extra);
            until("the third daemon stands by", || {
                std::fs::read_to_string(dirs.root.path().join("third.log")).unwrap_or_default().contains("standing by")
            });
            sigterm(&third);
            let exited = Instant::now();
            let status = loop {
                if let Some(s) = third.child.try_wait().unwrap() {
                    break s;
                }
                assert!(exited.elapsed() < Duration::from_secs(5), "a standby did not stop on SIGTERM");
                std::thread::sleep(Duration::from_millis(10));
            };
            assert!(status.success(), "{status}");
            let third_log = common::strip_ansi(&std::fs::read_to_string(dirs.root.path().join("third.log")).unwrap());
            assert!(!third_log.contains("reconciled") && !third_log.contains("is free: taking over"), "{third_log}");

            sigterm(&old);
            until("the surge daemon is ready", || get(&surge, "/readyz") == (200, "ready\n".to_string()));
            let listed = list(&dirs).await;
            assert!(listed.len() == 1 && listed[0].healthy && listed[0].targets.len() == 2, "{listed:?}");
            assert_eq!(listed[0].pid, pid, "adopted, not restarted");
            let surge_log = common::strip_ansi(&std::fs::read_to_string(dirs.root.path().join("surge.log")).unwrap());
            assert!(surge_log.contains("taking over") && surge_log.contains("adopted=1"), "{surge_log}");
            assert_eq!(std::fs::read_to_string(second.join("kept")).unwrap(), "bindfs~pv-1");
            unpublish_and_unstage(&mut node, "bindfs~pv-1", &staging, &[&target, &second]).await;
            drop((old, new));
            println!("checked: the surge daemon stood by (/readyz 200 standby), took over on SIGTERM of the first, adopted bindfs {pid}");
        })
    });
}
