//! End to end, as root, in a private mount namespace: kubelet-shaped CSI calls through the
//! real front and host daemon processes, against a real SeaweedFS started here, with kubelet's
//! real path layout under a temporary root.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use common::{
    NodeDirs, Scrape, Seaweed, guarded, in_private_namespace, mounts_below, multi_writer, pids_with, publish_req,
    stage_req, weed_binary, with_seaweed_node,
};
use mounthost::proto::csi;
use mounthost::proto::csi::controller_client::ControllerClient;
use mounthost::proto::csi::identity_client::IdentityClient;
use mounthost::proto::csi::node_client::NodeClient;
use mounthost::unpriv::grpc::channel;
use tonic::Code;

fn unpublish_req(id: &str, target: &Path) -> csi::NodeUnpublishVolumeRequest {
    csi::NodeUnpublishVolumeRequest { volume_id: id.into(), target_path: target.display().to_string() }
}

/// CreateVolume (seaweedfs, the test's filer), NodeStage, NodePublish into `pod`.
async fn create_stage_publish(
    controller: &mut ControllerClient<mounthost::unpriv::grpc::UnixChannel>,
    node: &mut NodeClient<mounthost::unpriv::grpc::UnixChannel>,
    weed: &Seaweed,
    dirs: &NodeDirs,
    pv: &str,
    pod: &str,
    params: &[(&str, &str)],
) -> (csi::Volume, std::path::PathBuf, std::path::PathBuf) {
    let mut parameters: HashMap<String, String> =
        [("plugin".to_string(), "seaweedfs".to_string()), ("filer".into(), weed.filer.clone())].into();
    parameters.extend(params.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let create = csi::CreateVolumeRequest {
        name: pv.into(),
        parameters,
        volume_capabilities: vec![multi_writer()],
        ..Default::default()
    };
    let vol = controller.create_volume(create).await.unwrap().into_inner().volume.unwrap();
    let staging = dirs.staging(pv);
    let target = dirs.target(pod, pv);
    node.node_stage_volume(stage_req(&vol.volume_id, &staging, &vol.volume_context)).await.unwrap();
    node.node_publish_volume(publish_req(&vol.volume_id, &staging, &target, false, &vol.volume_context)).await.unwrap();
    (vol, staging, target)
}

/// The host daemon's volumes, over its own socket.
async fn host_volumes(dirs: &NodeDirs) -> Vec<mounthost::proto::host::VolumeStatus> {
    mounthost::proto::host::host_client::HostClient::new(channel(&dirs.host_sock))
        .list_volumes(mounthost::proto::host::ListVolumesRequest {})
        .await
        .unwrap()
        .into_inner()
        .volumes
}

/// NodeUnpublishVolume then NodeUnstageVolume, retried like kubelet while the volume is busy
/// (the host may be restarting its FUSE process).
async fn unpublish_and_unstage(
    node: &mut NodeClient<mounthost::unpriv::grpc::UnixChannel>,
    volume_id: &str,
    staging: &Path,
    target: &Path,
) {
    let unstage = csi::NodeUnstageVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: staging.display().to_string(),
    };
    for attempt in 0.. {
        let r = match node.node_unpublish_volume(unpublish_req(volume_id, target)).await {
            Ok(_) => node.node_unstage_volume(unstage.clone()).await.map(|_| ()),
            Err(e) => Err(e),
        };
        match r {
            Ok(()) => return,
            Err(e) if e.code() == Code::Aborted && attempt < 600 => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("tearing down {volume_id}: {e:?}"),
        }
    }
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

async fn wait_ready(id: &mut IdentityClient<mounthost::unpriv::grpc::UnixChannel>) {
    for _ in 0..200 {
        if let Ok(r) = id.probe(csi::ProbeRequest {}).await
            && r.into_inner().ready == Some(true)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the front never became ready");
}

#[test]
fn kubelet_lifecycle_on_real_seaweedfs() {
    if !in_private_namespace("kubelet_lifecycle_on_real_seaweedfs") {
        return;
    }
    let weed = Seaweed::start();
    let dirs = NodeDirs::new();
    let program = format!("--program=weed={}", weed_binary().display());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _host = dirs.start_host(std::slice::from_ref(&program));
    let mut front = dirs.start_front(std::slice::from_ref(&program));
    guarded(&dirs, || rt.block_on(lifecycle(&weed, &dirs, &mut front, &program)));
}

async fn lifecycle(weed: &Seaweed, dirs: &NodeDirs, front: &mut common::Proc, program: &str) {
    let ch = channel(&dirs.csi_sock);
    let mut identity = IdentityClient::new(ch.clone());
    let mut node = NodeClient::new(ch.clone());
    let mut controller = ControllerClient::new(ch.clone());
    wait_ready(&mut identity).await;
    let info = identity.get_plugin_info(csi::GetPluginInfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.name, "csi.mounthost.dev");
    assert_eq!(node.node_get_info(csi::NodeGetInfoRequest {}).await.unwrap().into_inner().node_id, "node-1");

    // CreateVolume: a directory per volume in the filer; the same request twice, the same volume.
    let pv = "pvc-5f0c1d2e-3a4b-4c5d-8e9f-0a1b2c3d4e5f";
    let create = csi::CreateVolumeRequest {
        name: pv.into(),
        parameters: [("plugin".to_string(), "seaweedfs".to_string()), ("filer".into(), weed.filer.clone())].into(),
        volume_capabilities: vec![multi_writer()],
        ..Default::default()
    };
    let vol = controller.create_volume(create.clone()).await.unwrap().into_inner().volume.unwrap();
    let again = controller.create_volume(create).await.unwrap().into_inner().volume.unwrap();
    assert_eq!(vol, again, "CreateVolume is idempotent");
    assert_eq!(vol.volume_id, format!("seaweedfs~{}/buckets/{pv}", weed.filer));
    assert!(weed.dir_exists(&format!("/buckets/{pv}")), "the volume's directory exists in the filer");
    let id = vol.volume_id.clone();
    let ctx = vol.volume_context.clone();

    // NodeStageVolume, twice.
    let staging = dirs.staging(pv);
    node.node_stage_volume(stage_req(&id, &staging, &ctx)).await.unwrap();
    node.node_stage_volume(stage_req(&id, &staging, &ctx)).await.expect("stage repeated: same answer");
    let weeds = pids_with(&staging.display().to_string());
    assert_eq!(weeds.len(), 1, "one weed mount process for the volume, not one per call");
    let key = mounthost::volume::dirs::volume_key(&id);
    assert_eq!(dirs.cgroups_left(), vec![key.clone()], "the volume has a cgroup of its own");
    assert_eq!(dirs.group_procs(&key), weeds, "weed runs in the volume's cgroup");
    let m = mounthost::exec::mountinfo::read().unwrap();
    assert_eq!(mounthost::exec::mountinfo::at(&m, &staging).unwrap().fstype, "fuse.seaweedfs");

    // Publish into two pods read-write and one read-only; each twice.
    let (a, b, c) = (dirs.target("pod-a", pv), dirs.target("pod-b", pv), dirs.target("pod-c", pv));
    for (t, ro) in [(&a, false), (&b, false), (&c, true)] {
        node.node_publish_volume(publish_req(&id, &staging, t, ro, &ctx)).await.unwrap();
        node.node_publish_volume(publish_req(&id, &staging, t, ro, &ctx)).await.expect("publish repeated: same answer");
    }
    let e = node.node_publish_volume(publish_req(&id, &staging, &a, true, &ctx)).await.unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");

    // Write in one pod, read in the other and through the filer's HTTP API.
    std::fs::write(a.join("hello.txt"), b"written in pod a\n").unwrap();
    assert_eq!(std::fs::read_to_string(b.join("hello.txt")).unwrap(), "written in pod a\n");
    let (status, body) = weed.read(&format!("/buckets/{pv}/hello.txt"));
    assert_eq!((status, body.as_str()), (200, "written in pod a\n"), "visible through the filer");
    assert_eq!(std::fs::read_to_string(c.join("hello.txt")).unwrap(), "written in pod a\n");
    let err = std::fs::write(c.join("nope.txt"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc_erofs()), "a read-only publish rejects writes: {err}");
    // A ReadOnlyMany volume in a pod that does not say readOnly: the access mode alone keeps it
    // read-only. A volume is published with the capability it was staged with, so this is a
    // static volume of the same directory, staged and published MULTI_NODE_READER_ONLY.
    let rox_id = "seaweedfs~rox-view";
    let rox_staging = dirs.staging("rox-view");
    let d = dirs.target("pod-d", "rox-view");
    let rox_mode = Some(csi::volume_capability::AccessMode {
        mode: csi::volume_capability::access_mode::Mode::MultiNodeReaderOnly as i32,
    });
    let mut rox_stage = stage_req(rox_id, &rox_staging, &ctx);
    rox_stage.volume_capability.as_mut().unwrap().access_mode = rox_mode;
    node.node_stage_volume(rox_stage).await.unwrap();
    let mut rox = publish_req(rox_id, &rox_staging, &d, false, &ctx);
    rox.volume_capability.as_mut().unwrap().access_mode = rox_mode;
    node.node_publish_volume(rox).await.unwrap();
    assert_eq!(std::fs::read_to_string(d.join("hello.txt")).unwrap(), "written in pod a\n");
    let err = std::fs::write(d.join("nope.txt"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc_erofs()), "MULTI_NODE_READER_ONLY rejects writes: {err}");
    node.node_unpublish_volume(unpublish_req(rox_id, &d)).await.unwrap();
    let rox_unstage = csi::NodeUnstageVolumeRequest {
        volume_id: rox_id.into(),
        staging_target_path: rox_staging.display().to_string(),
    };
    node.node_unstage_volume(rox_unstage).await.unwrap();
    assert!(!d.exists(), "the read-only view is gone");

    // Stats: bytes and inodes, healthy; repeated.
    for _ in 0..2 {
        let stats = node
            .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                volume_id: id.clone(),
                volume_path: a.display().to_string(),
                staging_target_path: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(stats.usage.len(), 2);
        assert!(!stats.volume_condition.unwrap().abnormal);
    }

    // kill -9 of the front mid-way: mounts stay, a new front answers from the host's state.
    front.kill9();
    assert_eq!(std::fs::read_to_string(b.join("hello.txt")).unwrap(), "written in pod a\n", "mounts survive the front");
    std::fs::write(b.join("while-front-down.txt"), b"ok").unwrap();
    *front = dirs.start_front(&[program.to_string()]);
    wait_ready(&mut identity).await;
    node.node_publish_volume(publish_req(&id, &staging, &b, false, &ctx))
        .await
        .expect("the restarted front answers from the host's state");
    node.node_stage_volume(stage_req(&id, &staging, &ctx)).await.unwrap();
    assert_eq!(pids_with(&staging.display().to_string()), weeds, "no new weed process after the front restarted");
    assert_eq!(std::fs::read_to_string(a.join("while-front-down.txt")).unwrap(), "ok");

    // Unstage while published: refused.
    let unstage =
        csi::NodeUnstageVolumeRequest { volume_id: id.clone(), staging_target_path: staging.display().to_string() };
    assert_eq!(node.node_unstage_volume(unstage.clone()).await.unwrap_err().code(), Code::FailedPrecondition);

    // Tear down, each call twice.
    for t in [&a, &b, &c] {
        node.node_unpublish_volume(unpublish_req(&id, t)).await.unwrap();
        node.node_unpublish_volume(unpublish_req(&id, t)).await.expect("unpublish of a gone target: OK");
        assert!(!t.exists(), "the target directory is removed");
    }
    node.node_unstage_volume(unstage.clone()).await.unwrap();
    node.node_unstage_volume(unstage).await.expect("unstage of a gone volume: OK");
    let delete = csi::DeleteVolumeRequest { volume_id: id.clone(), secrets: HashMap::new() };
    controller.delete_volume(delete.clone()).await.unwrap();
    controller.delete_volume(delete).await.expect("delete of a gone volume: OK");

    // Nothing left: process, mount, socket, state file, cache dir, filer directory.
    let procs = pids_with(&dirs.root.path().display().to_string());
    let weed_procs: Vec<_> = procs
        .iter()
        .filter(|p| {
            let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            cmd.contains("weed") && cmd.contains(" mount ")
        })
        .collect();
    assert!(weed_procs.is_empty(), "weed mount processes left: {weed_procs:?}");
    let mounts = mounts_below(dirs.root.path());
    assert!(mounts.is_empty(), "mounts left: {mounts:?}");
    let state_files = entries(&dirs.state.join("volumes"));
    assert!(state_files.is_empty(), "state files left: {state_files:?}");
    let caches = entries(&dirs.state.join("cache/volumes"));
    assert!(caches.is_empty(), "cache dirs left: {caches:?}");
    let runtime = entries(&dirs.state.join("run"));
    assert!(runtime.is_empty(), "runtime dirs or sockets left: {runtime:?}");
    let groups = dirs.cgroups_left();
    assert!(groups.is_empty(), "cgroups left: {groups:?}");
    assert!(!weed.dir_exists(&format!("/buckets/{pv}")), "the directory is gone from the filer");
    println!(
        "checked: 0 weed mount processes, 0 mounts, {} state files, {} cache dirs, {} runtime entries, {} cgroups, filer directory gone",
        state_files.len(),
        caches.len(),
        runtime.len(),
        groups.len()
    );
}

fn libc_erofs() -> i32 {
    nix::errno::Errno::EROFS as i32
}

#[test]
fn bad_input_gets_the_right_code_and_changes_nothing() {
    if !in_private_namespace("bad_input_gets_the_right_code_and_changes_nothing") {
        return;
    }
    let dirs = NodeDirs::new();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let program = format!("--program=weed={}", weed_binary().display());
    let _host = dirs.start_host(std::slice::from_ref(&program));
    let _front = dirs.start_front(&[program]);
    rt.block_on(async {
        let ch = channel(&dirs.csi_sock);
        let mut node = NodeClient::new(ch.clone());
        let mut controller = ControllerClient::new(ch.clone());
        wait_ready(&mut IdentityClient::new(ch.clone())).await;
        let pv = "pvc-bad";
        let staging = dirs.staging(pv);
        let target = dirs.target("pod-x", pv);
        let ctx: HashMap<String, String> = [
            ("plugin".to_string(), "seaweedfs".to_string()),
            ("filer".into(), "127.0.0.1:1".into()),
            ("path".into(), "/buckets/x".into()),
        ]
        .into();
        let ok_id = "seaweedfs~127.0.0.1:1/buckets/x";
        let outside = dirs.root.path().join("elsewhere/mount");
        let with = |f: &dyn Fn(&mut csi::NodePublishVolumeRequest)| {
            let mut r = publish_req(ok_id, &staging, &target, false, &ctx);
            f(&mut r);
            r
        };
        let cases: Vec<(&str, csi::NodePublishVolumeRequest, Code, &str)> = vec![
            ("empty id", with(&|r| r.volume_id.clear()), Code::InvalidArgument, "volume_id is required"),
            ("100 KB id", with(&|r| r.volume_id = "v".repeat(100_000)), Code::InvalidArgument, "too long"),
            ("relative target", with(&|r| r.target_path = "pods/x/mount".into()), Code::InvalidArgument, "absolute"),
            (
                "dot-dot target",
                with(&|r| r.target_path = format!("{}/../../../etc", target.display())),
                Code::InvalidArgument,
                "..",
            ),
            (
                "target outside kubelet",
                with(&|r| r.target_path = outside.display().to_string()),
                Code::InvalidArgument,
                "outside the directories",
            ),
            (
                "NUL in target",
                with(&|r| r.target_path = format!("{}\0x", target.display())),
                Code::InvalidArgument,
                "NUL",
            ),
            (
                "no capability",
                with(&|r| r.volume_capability = None),
                Code::InvalidArgument,
                "volume_capability is required",
            ),
            ("empty target", with(&|r| r.target_path.clear()), Code::InvalidArgument, "target_path is required"),
            ("not staged", with(&|_| {}), Code::FailedPrecondition, "not staged"),
        ];
        let mut checked = 0;
        for (what, req, code, needle) in cases {
            let e = node.node_publish_volume(req).await.unwrap_err();
            assert_eq!(e.code(), code, "{what}: {e:?}");
            assert!(e.message().contains(needle), "{what}: {:?} lacks {needle:?}", e.message());
            assert!(e.message().len() < 1024, "{what}: message is bounded");
            checked += 1;
        }
        let mut stage = stage_req(ok_id, &staging, &ctx);
        stage.volume_context.insert("plugin".into(), "nosuchplugin".into());
        let e = node.node_stage_volume(stage).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(
            e.message().contains("nosuchplugin") && e.message().contains("seaweedfs"),
            "names the known plugins: {}",
            e.message()
        );
        let mut stage = stage_req(ok_id, &staging, &ctx);
        stage.volume_context.insert("cacheCapacityMB".into(), "lots".into());
        let e = node.node_stage_volume(stage).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains("cacheCapacityMB"), "names the parameter: {}", e.message());
        let mut stage = stage_req("", &staging, &ctx);
        stage.staging_target_path = "/etc".into();
        assert_eq!(node.node_stage_volume(stage).await.unwrap_err().code(), Code::InvalidArgument);
        let e = controller
            .create_volume(csi::CreateVolumeRequest {
                name: "pvc-x".into(),
                volume_capabilities: vec![multi_writer()],
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains("seaweedfs"), "names the known plugins: {}", e.message());
        let e = controller.delete_volume(csi::DeleteVolumeRequest::default()).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        let e = node
            .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                volume_id: ok_id.into(),
                volume_path: target.display().to_string(),
                staging_target_path: String::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
        node.node_unpublish_volume(unpublish_req(ok_id, &target)).await.expect("unpublish of nothing: OK");
        node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: ok_id.into(),
            staging_target_path: staging.display().to_string(),
        })
        .await
        .expect("unstage of nothing: OK");
        checked += 8;
        let mounts = mounts_below(dirs.root.path());
        assert!(mounts.is_empty(), "nothing mounted: {mounts:?}");
        assert!(entries(&dirs.state.join("volumes")).is_empty(), "no state written");
        assert!(!outside.exists(), "nothing created outside kubelet's dir");
        println!("checked: {checked} bad requests, 0 mounts, 0 state files");
    });
}

/// kill -9 of the host daemon with three volumes staged and published: every pod target keeps
/// working while it is down, and the restarted daemon re-adopts the three `weed mount`
/// processes (none is started anew); unstage then leaves nothing.
#[test]
fn host_kill9_keeps_mounts_and_readopts_them() {
    if !in_private_namespace("host_kill9_keeps_mounts_and_readopts_them") {
        return;
    }
    let weed = Seaweed::start();
    let dirs = NodeDirs::new();
    let program = format!("--program=weed={}", weed_binary().display());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut host = dirs.start_host(std::slice::from_ref(&program));
    let _front = dirs.start_front(std::slice::from_ref(&program));
    guarded(&dirs, || {
        rt.block_on(async {
            let ch = channel(&dirs.csi_sock);
            let mut node = NodeClient::new(ch.clone());
            let mut controller = ControllerClient::new(ch.clone());
            wait_ready(&mut IdentityClient::new(ch.clone())).await;
            let mut vols = Vec::new();
            for i in 0..3 {
                vols.push(
                    create_stage_publish(
                        &mut controller,
                        &mut node,
                        &weed,
                        &dirs,
                        &format!("pvc-restart-{i}"),
                        &format!("pod-{i}"),
                        &[],
                    )
                    .await,
                );
            }
            let weeds: Vec<Vec<i32>> = vols.iter().map(|(_, s, _)| pids_with(&s.display().to_string())).collect();
            assert!(weeds.iter().all(|w| w.len() == 1), "one weed per volume: {weeds:?}");

            host.kill9();
            for (i, (_, _, target)) in vols.iter().enumerate() {
                std::fs::write(target.join("during-outage.txt"), format!("volume {i}")).unwrap();
                assert_eq!(std::fs::read_to_string(target.join("during-outage.txt")).unwrap(), format!("volume {i}"));
            }
            let e =
                node.node_stage_volume(stage_req(&vols[0].0.volume_id, &vols[0].1, &vols[0].0.volume_context)).await;
            assert_eq!(e.unwrap_err().code(), Code::Unavailable, "the front reports the host as unavailable");

            host = dirs.start_host(std::slice::from_ref(&program));
            let listed = host_volumes(&dirs).await;
            assert_eq!(listed.len(), 3);
            assert!(listed.iter().all(|v| v.healthy && v.phase == "staged"), "re-adopted: {listed:?}");
            for ((vol, staging, target), before) in vols.iter().zip(&weeds) {
                assert_eq!(&pids_with(&staging.display().to_string()), before, "no new weed process");
                node.node_stage_volume(stage_req(&vol.volume_id, staging, &vol.volume_context)).await.unwrap();
                node.node_publish_volume(publish_req(&vol.volume_id, staging, target, false, &vol.volume_context))
                    .await
                    .unwrap();
                assert_eq!(
                    &pids_with(&staging.display().to_string()),
                    before,
                    "stage after restart reuses the process"
                );
            }
            for (vol, staging, target) in &vols {
                unpublish_and_unstage(&mut node, &vol.volume_id, staging, target).await;
                assert!(pids_with(&staging.display().to_string()).is_empty(), "the adopted weed was stopped");
            }
            let mounts = mounts_below(dirs.root.path());
            assert!(mounts.is_empty(), "mounts left: {mounts:?}");
            assert!(entries(&dirs.state.join("volumes")).is_empty());
            println!("checked: 3 volumes re-adopted with their 3 weed processes, I/O during the outage, 0 mounts left");
        })
    });
}

/// Start SeaweedFS, the host and the front (real processes), wait until the front is ready, and
/// run `body` with CSI node and controller clients; on a panic everything of the node is killed.
/// kill -9 of one `weed mount`: the host restarts it with the recorded plan, detaches the dead
/// mount and re-binds the pod targets; they work again within 5 s with the same data, the other
/// volume is untouched, and the restart is counted.
#[test]
fn a_killed_weed_mount_is_restarted_and_its_targets_rebound() {
    if !in_private_namespace("a_killed_weed_mount_is_restarted_and_its_targets_rebound") {
        return;
    }
    with_seaweed_node(async |weed, dirs, (mut node, mut controller)| {
        let mut vols = Vec::new();
        for i in 0..2 {
            vols.push(
                create_stage_publish(&mut controller, &mut node, weed, dirs, &format!("pvc-heal-{i}"), "pod", &[])
                    .await,
            );
            std::fs::write(vols[i].2.join("data.txt"), format!("volume {i}")).unwrap();
        }
        let victim = pids_with(&vols[0].1.display().to_string());
        let bystander = pids_with(&vols[1].1.display().to_string());
        assert_eq!((victim.len(), bystander.len()), (1, 1));
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(victim[0]), nix::sys::signal::Signal::SIGKILL).unwrap();
        let killed = std::time::Instant::now();
        let target = &vols[0].2;
        loop {
            if std::fs::read_to_string(target.join("data.txt")).is_ok_and(|s| s == "volume 0") {
                break;
            }
            assert!(killed.elapsed() < Duration::from_secs(5), "the target did not come back within 5 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let back = killed.elapsed();
        std::fs::write(target.join("after-heal.txt"), b"ok").unwrap();
        let healed = pids_with(&vols[0].1.display().to_string());
        assert_eq!(healed.len(), 1);
        assert_ne!(healed, victim, "a new weed process serves the volume");
        assert_eq!(pids_with(&vols[1].1.display().to_string()), bystander, "the other volume is untouched");
        assert_eq!(std::fs::read_to_string(vols[1].2.join("data.txt")).unwrap(), "volume 1");
        let listed = host_volumes(dirs).await;
        let restarts: Vec<(String, u32)> = listed.iter().map(|v| (v.volume_id.clone(), v.restarts)).collect();
        assert!(restarts.contains(&(vols[0].0.volume_id.clone(), 1)), "{restarts:?}");
        assert!(restarts.contains(&(vols[1].0.volume_id.clone(), 0)), "{restarts:?}");
        // One refused call, so the error counts have something to show.
        let refused = node.node_stage_volume(stage_req("", &vols[0].1, &HashMap::new())).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument);
        check_metrics(dirs);
        for (vol, staging, target) in &vols {
            unpublish_and_unstage(&mut node, &vol.volume_id, staging, target).await;
        }
        let mounts = mounts_below(dirs.root.path());
        assert!(mounts.is_empty(), "mounts left: {mounts:?}");
        assert!(entries(&dirs.state.join("volumes")).is_empty());
        assert!(entries(&dirs.state.join("secrets")).is_empty(), "kept secrets are removed with the volume");
        println!("checked: target back after {back:?} with the same data, restart counted, bystander untouched");
    });
}

/// What the host's and the front's `/metrics` show after two volumes were created, staged and
/// published, one `weed mount` was killed and restarted, and one call was refused.
fn check_metrics(dirs: &NodeDirs) {
    let host = Scrape::of(&dirs.host_metrics());
    let front = Scrape::of(&dirs.front_metrics());
    let ops = "mounthost_host_operations_total";
    let sw = ("plugin", "seaweedfs");
    let checks: Vec<(&str, f64, f64)> = vec![
        ("host: stages OK", host.value(ops, &[("rpc", "NodeStageVolume"), sw, ("code", "OK")]), 2.0),
        ("host: publishes OK", host.value(ops, &[("rpc", "NodePublishVolume"), sw, ("code", "OK")]), 2.0),
        (
            "host: the refused stage",
            host.value(ops, &[("rpc", "NodeStageVolume"), ("plugin", "unknown"), ("code", "INVALID_ARGUMENT")]),
            1.0,
        ),
        (
            "host: timed stages",
            host.value("mounthost_host_operation_duration_seconds_count", &[("rpc", "NodeStageVolume"), sw]),
            2.0,
        ),
        ("host: FUSE restarts", host.value("mounthost_fuse_restarts_total", &[sw]), 1.0),
        ("host: live volumes", host.value("mounthost_volumes", &[sw, ("phase", "staged"), ("health", "healthy")]), 2.0),
        (
            "front: CreateVolume OK",
            front.value("mounthost_csi_requests_total", &[("rpc", "CreateVolume"), ("code", "OK")]),
            2.0,
        ),
        (
            "front: the refused stage",
            front.value("mounthost_csi_requests_total", &[("rpc", "NodeStageVolume"), ("code", "INVALID_ARGUMENT")]),
            1.0,
        ),
        (
            "front: timed publishes",
            front.value("mounthost_csi_request_duration_seconds_count", &[("rpc", "NodePublishVolume")]),
            2.0,
        ),
    ];
    // The series exists once its plugin had a restart, at 0 without an OOM kill.
    assert_eq!(host.get("mounthost_fuse_oom_kills_total", &[sw]), Some(0.0), "{}", host.dump());
    for (what, got, want) in &checks {
        assert_eq!(got, want, "{what}\n--- host\n{}--- front\n{}", host.dump(), front.dump());
    }
    // Plugin calls: every stage planned by the stock plugin (the restart replays the recorded
    // plan), the front's controller planned the two provisions.
    let planned = host.value("mounthost_plugin_calls_total", &[sw, ("call", "stage"), ("outcome", "ok")]);
    assert!(planned >= 2.0, "host: stage plans {planned}\n{}", host.dump());
    // Two rounds each: the capacity record's lookup, then the plan with its answer.
    let provisions = front.value("mounthost_plugin_calls_total", &[sw, ("call", "provision"), ("outcome", "ok")]);
    assert_eq!(provisions, 4.0, "front: provision plans\n{}", front.dump());
    assert!(host.value("mounthost_plugin_call_duration_seconds_count", &[sw]) >= 2.0);
    assert!(host.value("mounthost_plugin_compile_cache_total", &[]) >= 1.0);
    for addr in [dirs.host_metrics(), dirs.front_metrics()] {
        assert_eq!(common::http("GET", &addr, "/healthz", &[], b"").unwrap().0, 200);
        assert_eq!(common::http("GET", &addr, "/readyz", &[], b"").unwrap(), (200, "ready\n".to_string()));
    }
}

/// A volume whose `weed mount` outgrows its memory limit is OOM-killed inside its own cgroup:
/// the other volume's process and data are untouched, and the host counts the OOM kills and
/// names them in the volume's condition.
#[test]
fn an_oom_kill_stays_inside_its_volume() {
    if !in_private_namespace("an_oom_kill_stays_inside_its_volume") {
        return;
    }
    with_seaweed_node(async |weed, dirs, (mut node, mut controller)| {
        let limit_mb = 64;
        let limited = create_stage_publish(
            &mut controller,
            &mut node,
            weed,
            dirs,
            "pvc-oom-limited",
            "pod",
            &[("memoryLimitMB", &limit_mb.to_string())],
        )
        .await;
        let other = create_stage_publish(&mut controller, &mut node, weed, dirs, "pvc-oom-other", "pod", &[]).await;
        std::fs::write(other.2.join("data.txt"), b"untouched").unwrap();
        let other_pid = pids_with(&other.1.display().to_string());
        let key = mounthost::volume::dirs::volume_key(&limited.0.volume_id);
        let limit_file = ["memory.max", "memory.limit_in_bytes"]
            .iter()
            .map(|f| dirs.cgroups().parent_dir().unwrap().join(&key).join(f))
            .find(|p| p.exists())
            .unwrap();
        assert_eq!(std::fs::read_to_string(&limit_file).unwrap().trim(), (limit_mb << 20).to_string());

        // Writes buffered by weed push it past its limit.
        let target = limited.2.clone();
        // Four writers at once: weed holds every file's unflushed chunks in memory.
        let writers: Vec<_> = (0..4)
            .map(|w| {
                let target = target.clone();
                std::thread::spawn(move || {
                    use std::io::Write;
                    let chunk = vec![7u8; 8 << 20];
                    for i in 0..32 {
                        let Ok(mut f) = std::fs::File::create(target.join(format!("big-{w}-{i}"))) else { break };
                        if (0..8).any(|_| f.write_all(&chunk).is_err()) {
                            break;
                        }
                    }
                })
            })
            .collect();
        let started = std::time::Instant::now();
        let oom = loop {
            let listed = host_volumes(dirs).await;
            let v = listed.iter().find(|v| v.volume_id == limited.0.volume_id).unwrap();
            // Counted when the host restarts the killed process.
            if v.oom_kills > 0 && v.restarts > 0 {
                break v.clone();
            }
            assert!(started.elapsed() < Duration::from_secs(60), "no OOM kill within 60 s: {v:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        for w in writers {
            let _ = w.join();
        }
        let listed = host_volumes(dirs).await;
        let o = listed.iter().find(|v| v.volume_id == other.0.volume_id).unwrap();
        assert_eq!((o.oom_kills, o.restarts, o.healthy), (0, 0, true), "{o:?}");
        assert_eq!(pids_with(&other.1.display().to_string()), other_pid, "the other volume's weed lives on");
        assert_eq!(std::fs::read_to_string(other.2.join("data.txt")).unwrap(), "untouched");
        let scrape = Scrape::of(&dirs.host_metrics());
        let counted = scrape.value("mounthost_fuse_oom_kills_total", &[("plugin", "seaweedfs")]);
        assert!(counted >= f64::from(oom.oom_kills), "OOM kills in /metrics: {counted}\n{}", scrape.dump());
        for (vol, staging, target) in [&limited, &other] {
            unpublish_and_unstage(&mut node, &vol.volume_id, staging, target).await;
        }
        let groups = dirs.cgroups_left();
        assert!(groups.is_empty(), "cgroups left: {groups:?}");
        assert!(mounts_below(dirs.root.path()).is_empty());
        println!(
            "checked: limit {limit_mb} MiB, {} OOM kill(s) and {} restart(s) in the limited volume, 0 in the other, 0 cgroups left",
            oom.oom_kills, oom.restarts
        );
    });
}
