//! End to end, as root, in a private mount namespace: the example plugin of
//! `examples/plugins/sshfs` stages a volume through the real front and host daemon against a
//! real `sshd` started here (loopback, generated host and user keys), with the FUSE server run
//! unprivileged on a connection the host mounted (WIT `fuse-mount.host-fd`).
//!
//! Checked: a file written on the SSH side reads through the staging path and the pod's
//! target, and one written through the target arrives there; `sshfs` runs as the volume's own
//! FUSE id (the lowest of the default `--fuse-ids`; a second volume gets the next) with no
//! capabilities, `no_new_privs`, in the volume's cgroup, and holds only stdin, stdout, stderr,
//! the connection (`/dev/fuse` at 3) and the sockets to its own `ssh`; its key files are
//! root's, readable by its group only (`ssh` takes a key file it does not own), on a tmpfs
//! mounted exactly at the FUSE files directory, outside the state directory; a host restart
//! re-adopts it; SIGKILL makes the host detach the dead mount and mount, spawn and bind again,
//! as the same id; unstage leaves no mount, no process, no file and no cgroup.
//!
//! OpenSSH's `ssh` refuses to run as a uid without a passwd entry, so the test gives the first
//! ids of the range entries in its private mount namespace (copies of `/etc/passwd` and
//! `/etc/group` bound over them), as a node running sshfs volumes must.
//!
//! Needs `sshfs`, `sshd` and `ssh-keygen`: skipped without them, except under `CI=true`, where
//! a missing binary fails the test (scripts/test.sh installs them).

mod common;

use std::collections::{BTreeSet, HashMap};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{NodeDirs, guarded, in_private_namespace, multi_writer, pids_of, publish_req};
use mounthost::proto::csi;
use mounthost::proto::csi::node_client::NodeClient;
use tonic::Code;

use common::sshd::{FUSE_ID, SSHFS, Sshd, binaries_present, provide_fuse_users};

/// The uid, gid, groups, effective capabilities and no_new_privs of `pid`.
fn credentials(pid: i32) -> (Vec<u32>, Vec<u32>, String, String, String) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim().to_string()).unwrap_or_default()
    };
    let ids = |v: String| v.split_whitespace().map(|n| n.parse().unwrap()).collect::<Vec<u32>>();
    (ids(field("Uid:")), ids(field("Gid:")), field("Groups:"), field("CapEff:"), field("NoNewPrivs:"))
}

/// The descriptors of `pid`: number → what it points at.
fn descriptors(pid: i32) -> Vec<(i32, String)> {
    let mut fds: Vec<(i32, String)> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().parse().ok()?;
            Some((n, std::fs::read_link(e.path()).ok()?.display().to_string()))
        })
        .collect();
    fds.sort();
    fds
}

/// The socket inodes `pid` holds (none once it is gone).
fn sockets(pid: i32) -> BTreeSet<String> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return BTreeSet::new() };
    dir.flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|t| t.display().to_string())
        .filter(|t| t.starts_with("socket:"))
        .collect()
}

/// Every pid.
fn all_pids() -> Vec<i32> {
    std::fs::read_dir("/proc").unwrap().flatten().filter_map(|e| e.file_name().to_string_lossy().parse().ok()).collect()
}

/// The processes of the session `sid` (a FUSE program's session holds it and its helpers).
fn session_members(sid: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                let rest = s.rsplit_once(')').map(|(_, r)| r.to_string()).unwrap_or_default();
                // Fields after the command: state ppid pgrp session. Zombies are gone already.
                let fields: Vec<&str> = rest.split_whitespace().collect();
                fields.first() != Some(&"Z") && fields.get(3).and_then(|v| v.parse::<i32>().ok()) == Some(sid)
            })
        })
        .collect()
}

/// The one live sshfs process serving `data`, waiting up to 30 s for it to be a new one.
fn sshfs_pid(data: &Path, not: Option<i32>) -> i32 {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let pids = pids_of("sshfs", &data.display().to_string());
        if let [pid] = pids[..]
            && Some(pid) != not
        {
            return pid;
        }
        assert!(Instant::now() < until, "sshfs processes serving {}: {pids:?}", data.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Read `path` until it holds `want` (a healing mount answers ENOTCONN for a moment).
fn read_eventually(path: &Path, want: &str, what: &str) {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        match std::fs::read_to_string(path) {
            Ok(got) if got == want => return,
            other => assert!(Instant::now() < until, "{what}: {} gives {other:?}", path.display()),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn stage_req(id: &str, staging: &Path, ctx: &HashMap<String, String>, sshd: &Sshd) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(multi_writer()),
        volume_context: ctx.clone(),
        secrets: [
            ("sshPrivateKey".to_string(), sshd.user_key.clone()),
            ("sshKnownHosts".to_string(), sshd.known_hosts.clone()),
        ]
        .into(),
        ..Default::default()
    }
}

/// Retry a call like kubelet while the volume is busy (the supervisor may be restarting it).
async fn retrying<T, F: std::future::Future<Output = Result<T, tonic::Status>>>(mut call: impl FnMut() -> F) -> T {
    for attempt in 0.. {
        match call().await {
            Ok(v) => return v,
            Err(e) if e.code() == Code::Aborted && attempt < 300 => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    unreachable!()
}

/// `--program-args=<values>` of docs/policy.md's "Recommended for `sshfs`" block (the same
/// block tests/cli.rs checks at plan level), so the real sshfs runs under exactly those rules.
fn recommended_sshfs_rules() -> String {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/policy.md")).unwrap();
    let section = &doc[doc.find("### Recommended for `sshfs`").expect("the section")..];
    let block = section.split("```").nth(1).expect("a code block");
    let values: Vec<&str> = block.split_whitespace().filter(|w| *w != "--program-args" && *w != "\\").collect();
    assert!(
        values.contains(&"sshfs:deny=@sshfs") && values.iter().any(|v| v.starts_with("sshfs:allow=")),
        "{values:?}"
    );
    format!("--program-args={}", values.join(","))
}

#[test]
fn sshfs_runs_unprivileged_on_a_host_mounted_connection_and_heals() {
    if !binaries_present() || !in_private_namespace("sshfs_runs_unprivileged_on_a_host_mounted_connection_and_heals") {
        return;
    }
    let sshd = Sshd::start();
    std::fs::write(sshd.data.join("hello.txt"), "written over ssh\n").unwrap();
    let dirs = NodeDirs::new();
    provide_fuse_users(dirs.root.path(), 4);
    // The FUSE user reaches its files directory through the test's root (0700 by default).
    std::fs::set_permissions(dirs.root.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let fuse_files = dirs.root.path().join("fuse");
    let plugins = dirs.root.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::copy(mounthost::stock::fixtures::path("sshfs"), plugins.join("sshfs.wasm")).unwrap();
    let args = vec![
        format!("--plugin-dir={}", plugins.display()),
        format!("--program=sshfs={SSHFS}"),
        "--grant=sshfs:program=sshfs".into(),
        "--grant=sshfs:fstype=fuse.sshfs".into(),
        // The SSH server: @sshfs judges the remote's host (the example's host parameter is no
        // endpoint, so the node grants it).
        "--grant=sshfs:host=127.0.0.1".into(),
        // The program-argument rules docs/policy.md recommends for sshfs (its code block).
        recommended_sshfs_rules(),
        format!("--fuse-files-dir={}", fuse_files.display()),
    ];
    let mut host = dirs.start_host(&args);
    let _front = dirs.start_front(&args);
    let rt = tokio::runtime::Runtime::new().unwrap();
    guarded(&dirs, || {
        rt.block_on(async {
            let ch = mounthost::unpriv::grpc::channel(&dirs.csi_sock);
            common::wait_ready(&ch).await;
            let mut node = NodeClient::new(ch);
            let id = "sshfs-pv-1";
            let ctx: HashMap<String, String> = [
                ("plugin", "sshfs".to_string()),
                ("host", "127.0.0.1".into()),
                ("port", sshd.port.to_string()),
                ("user", "root".into()),
                ("path", sshd.data.display().to_string()),
                ("options", "cache=yes,Compression=no".into()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
            let staging = dirs.staging(id);
            let target = dirs.target("pod-1", id);

            // An option that runs a command as the FUSE user is refused by the host's rules,
            // naming it, before anything is made: by @sshfs (which names no such option) before
            // the recommended --program-args rules would deny it.
            let mut evil = ctx.clone();
            evil.insert("options".into(), "cache=yes,ssh_command=/bin/sh -c id".replace(' ', "\\040"));
            let evil_staging = dirs.staging("sshfs-evil");
            let err = node.node_stage_volume(stage_req("sshfs-evil", &evil_staging, &evil, &sshd)).await.unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
            assert!(
                err.message().contains("ssh_command") && err.message().contains("(rule set @sshfs, rule "),
                "{}",
                err.message()
            );
            assert!(!evil_staging.exists() || std::fs::read_dir(&evil_staging).unwrap().next().is_none());

            // Stage (twice: idempotent) and publish.
            for _ in 0..2 {
                node.node_stage_volume(stage_req(id, &staging, &ctx, &sshd)).await.unwrap();
            }
            node.node_publish_volume(publish_req(id, &staging, &target, false, &ctx)).await.unwrap();
            read_eventually(&staging.join("hello.txt"), "written over ssh\n", "staging");
            read_eventually(&target.join("hello.txt"), "written over ssh\n", "target");
            std::fs::write(target.join("from-pod.txt"), "written by a pod\n").unwrap();
            assert_eq!(std::fs::read_to_string(sshd.data.join("from-pod.txt")).unwrap(), "written by a pod\n");
            let entry = mounthost::exec::mountinfo::read()
                .unwrap()
                .into_iter()
                .find(|m| m.mount_point == staging)
                .expect("the staging mount");
            assert_eq!(entry.fstype, "fuse.sshfs");
            assert_eq!(entry.source, format!("root@127.0.0.1:{}", sshd.data.display()));
            for opt in [&format!("user_id={FUSE_ID}"), &format!("group_id={FUSE_ID}"), "allow_other"] {
                assert!(entry.super_options.contains(opt), "{opt} in {:?}", entry.super_options);
            }

            // The FUSE server: unprivileged, in the volume's cgroup, with only its descriptors.
            let pid = sshfs_pid(&sshd.data, None);
            let (uid, gid, groups, cap_eff, no_new_privs) = credentials(pid);
            assert_eq!((uid, gid), (vec![FUSE_ID; 4], vec![FUSE_ID; 4]));
            assert_eq!((groups.as_str(), no_new_privs.as_str()), ("", "1"));
            assert_eq!(u64::from_str_radix(&cap_eff, 16).unwrap(), 0, "no capabilities");
            let fds = descriptors(pid);
            let log = |t: &str| t.ends_with("/sshfs.log");
            let [(0, stdin), (1, out), (2, err), (3, dev), rest @ ..] = &fds[..] else { panic!("{fds:?}") };
            assert_eq!((stdin.as_str(), dev.as_str()), ("/dev/null", "/dev/fuse"), "{fds:?}");
            assert!(log(out) && log(err), "{fds:?}");
            // Anything else is a socket sshfs made itself (its end of the pair to its ssh): held
            // by no other process, so nothing the daemon had open was inherited.
            assert!(session_members(pid).len() >= 2, "sshfs and its ssh: {:?}", session_members(pid));
            for (n, t) in rest {
                assert!(t.starts_with("socket:"), "descriptor {n} -> {t}: {fds:?}");
                let holders: Vec<i32> =
                    all_pids().into_iter().filter(|p| *p != pid && sockets(*p).contains(t)).collect();
                assert!(holders.is_empty(), "descriptor {n} ({t}) is shared with {holders:?}");
            }
            if dirs.cgroups().version().is_some() {
                let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
                let key = mounthost::volume::dirs::volume_key(id);
                assert!(cgroup.contains(&key), "{cgroup}");
            }
            // Its key files: root's, readable by its group only, on a tmpfs of their own exactly
            // at the FUSE files directory, outside the state directory.
            let tmpfs = mounthost::exec::mountinfo::read()
                .unwrap()
                .into_iter()
                .rfind(|m| m.mount_point == fuse_files)
                .expect("a tmpfs at the FUSE files directory");
            assert_eq!((tmpfs.fstype.as_str(), tmpfs.source.as_str()), ("tmpfs", "mounthost-fuse"));
            assert!(tmpfs.super_options.contains("size=65536k"), "{}", tmpfs.super_options);
            let files = fuse_files.join(mounthost::volume::dirs::volume_key(id));
            let meta = std::fs::metadata(&files).unwrap();
            assert_eq!((meta.uid(), meta.gid(), meta.mode() & 0o777), (0, FUSE_ID, 0o710));
            let keys: Vec<PathBuf> = std::fs::read_dir(&files).unwrap().flatten().map(|e| e.path()).collect();
            assert_eq!(keys.len(), 2, "{keys:?}");
            for k in &keys {
                let m = std::fs::metadata(k).unwrap();
                assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (0, FUSE_ID, 0o640), "{}", k.display());
            }

            // A second volume's server runs as the next id, and cannot enter the first's files.
            let second = sshd.data.with_file_name("second");
            std::fs::create_dir(&second).unwrap();
            let mut ctx2 = ctx.clone();
            ctx2.insert("path".into(), second.display().to_string());
            let (id2, staging2) = ("sshfs-pv-2", dirs.staging("sshfs-pv-2"));
            node.node_stage_volume(stage_req(id2, &staging2, &ctx2, &sshd)).await.unwrap();
            let pid2 = sshfs_pid(&second, None);
            assert_eq!(credentials(pid2).0, vec![FUSE_ID + 1; 4]);
            let files2 = fuse_files.join(mounthost::volume::dirs::volume_key(id2));
            assert_eq!(std::fs::metadata(&files2).unwrap().gid(), FUSE_ID + 1);
            let peek = Command::new("setpriv")
                .args([format!("--reuid={}", FUSE_ID + 1), format!("--regid={}", FUSE_ID + 1), "--clear-groups".into()])
                .arg("ls")
                .arg(&files)
                .output()
                .unwrap();
            assert!(!peek.status.success(), "volume 2's id lists volume 1's files");
            let unstage2 = csi::NodeUnstageVolumeRequest {
                volume_id: id2.into(),
                staging_target_path: staging2.display().to_string(),
            };
            retrying(|| {
                let (mut n, r) = (node.clone(), unstage2.clone());
                async move { n.node_unstage_volume(r).await }
            })
            .await;
            assert!(!files2.exists(), "{} left", files2.display());
            let argv = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap();
            assert!(!argv.contains("PRIVATE KEY") && argv.contains("/dev/fd/3"), "{argv:?}");

            // A host restart re-adopts the running server.
            host.kill9();
            host = dirs.start_host(&args);
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert_eq!(sshfs_pid(&sshd.data, None), pid, "re-adopted, not restarted");
            read_eventually(&target.join("hello.txt"), "written over ssh\n", "after a host restart");

            // SIGKILL: the host detaches the dead mount, mounts, spawns and binds again.
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
            let healed = sshfs_pid(&sshd.data, Some(pid));
            std::fs::write(sshd.data.join("after.txt"), "after the restart\n").unwrap();
            read_eventually(&staging.join("after.txt"), "after the restart\n", "staging after SIGKILL");
            read_eventually(&target.join("after.txt"), "after the restart\n", "target after SIGKILL");
            assert_eq!(credentials(healed).0, vec![FUSE_ID; 4]);
            let stacked: Vec<_> = mounthost::exec::mountinfo::read()
                .unwrap()
                .into_iter()
                .filter(|m| m.mount_point == staging || m.mount_point == target)
                .collect();
            assert_eq!(stacked.len(), 2, "one mount each, the dead ones detached: {stacked:?}");

            // Unpublish and unstage (twice: idempotent) leave nothing behind.
            let unpublish =
                csi::NodeUnpublishVolumeRequest { volume_id: id.into(), target_path: target.display().to_string() };
            retrying(|| {
                let (mut n, r) = (node.clone(), unpublish.clone());
                async move { n.node_unpublish_volume(r).await }
            })
            .await;
            let unstage = csi::NodeUnstageVolumeRequest {
                volume_id: id.into(),
                staging_target_path: staging.display().to_string(),
            };
            for _ in 0..2 {
                retrying(|| {
                    let (mut n, r) = (node.clone(), unstage.clone());
                    async move { n.node_unstage_volume(r).await }
                })
                .await;
            }
            // The FUSE files tmpfs stays for the next volume; it is empty.
            assert_eq!(common::mounts_below(dirs.root.path()), vec![fuse_files.clone()]);
            assert_eq!(std::fs::read_dir(&fuse_files).unwrap().count(), 0);
            assert_eq!(pids_of("sshfs", &sshd.data.display().to_string()), Vec::<i32>::new());
            let until = Instant::now() + Duration::from_secs(5);
            while !session_members(healed).is_empty() {
                assert!(Instant::now() < until, "ssh of the last sshfs: {:?}", session_members(healed));
                std::thread::sleep(Duration::from_millis(50));
            }
            assert!(!files.exists(), "{} left", files.display());
            assert_eq!(dirs.cgroups_left(), Vec::<String>::new());
            assert_eq!(std::fs::read_to_string(sshd.data.join("hello.txt")).unwrap(), "written over ssh\n");
            println!("checked: sshfs uid {FUSE_ID}, {} descriptors, healed pid {pid} -> {healed}", fds.len());
        })
    });
    drop(host);
}
