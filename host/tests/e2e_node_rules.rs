//! The CSI spec v1.12 error rows of the node RPCs, through the real front and host daemon
//! processes against a real SeaweedFS (root, private mount namespace, kubelet's path layout):
//!
//! - NodeStageVolume of a staged volume with another volume context or an incompatible
//!   capability: ALREADY_EXISTS ("volume_id has already been staged ... but is incompatible");
//!   the same request: OK.
//! - NodeStageVolume with a block or no capability: INVALID_ARGUMENT; at a second staging path:
//!   FAILED_PRECONDITION; of a volume deleted in the filer: NOT_FOUND, and its directory is not
//!   made again.
//! - NodePublishVolume of a SINGLE_NODE_WRITER / SINGLE_NODE_SINGLE_WRITER volume at a second
//!   target: FAILED_PRECONDITION ("exceeds capabilities"); of a SINGLE_NODE_READER_ONLY volume
//!   too, read-only or not, and its one target is read-only.
//! - NodePublishVolume at a target already published with another capability or readonly flag:
//!   ALREADY_EXISTS ("published but is incompatible"); at a new target with a capability the
//!   volume was not staged with: FAILED_PRECONDITION; a MULTI_NODE volume read-write and
//!   read-only at two targets: OK. Without a staging path, or of a volume not staged here:
//!   FAILED_PRECONDITION.
//! - NodePublishVolume whose target's parent does not exist (the CO's job): FAILED_PRECONDITION
//!   naming the parent; a target reached through a symbolic link: FAILED_PRECONDITION naming it.
//! - NodeGetVolumeStats at a path that does not hold the volume, a relative one included:
//!   NOT_FOUND.
//! - NodeUnpublishVolume at a path the volume is not published at but a record holds (another
//!   volume's target, its own staging path, a directory above or inside a publication): OK,
//!   and nothing is unmounted or removed.
//! - NodeUnstageVolume of a volume id the node has no record of, at another volume's staging
//!   path: OK ("not staged to the staging_target_path"), and that volume's stage stays mounted
//!   and still publishes; of a staged volume at a path it is not staged at: OK, and nothing
//!   changes.
//!
//! Each refused call is checked to have changed nothing: same weed process, same publications,
//! nothing mounted or created.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use common::{NodeDirs, Seaweed, in_private_namespace, mounts_below, pids_of, with_seaweed_node};
use mounthost::proto::csi;
use mounthost::proto::csi::controller_client::ControllerClient;
use mounthost::proto::csi::node_client::NodeClient;
use mounthost::proto::csi::volume_capability::access_mode::Mode;
use mounthost::unpriv::grpc::UnixChannel;
use mounthost::unpriv::grpc::channel;
use tonic::Code;

fn capability(mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
        access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
    }
}

fn stage(id: &str, staging: &Path, ctx: &HashMap<String, String>, mode: Mode) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(capability(mode)),
        volume_context: ctx.clone(),
        ..Default::default()
    }
}

fn publish(id: &str, staging: &Path, target: &Path, readonly: bool, mode: Mode) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(capability(mode)),
        readonly,
        ..Default::default()
    }
}

fn stats(id: &str, path: &str) -> csi::NodeGetVolumeStatsRequest {
    csi::NodeGetVolumeStatsRequest {
        volume_id: id.into(),
        volume_path: path.into(),
        staging_target_path: String::new(),
    }
}

#[track_caller]
fn code<T: std::fmt::Debug>(r: Result<T, tonic::Status>, want: Code) -> String {
    match r {
        Err(s) if s.code() == want => s.message().to_string(),
        other => panic!("expected {want:?}, got {other:?}"),
    }
}

/// What must not change across a refused call.
#[derive(Debug, PartialEq)]
struct Snapshot {
    weed_pids: Vec<i32>,
    mounts: Vec<PathBuf>,
    published: Vec<(String, Vec<String>)>,
}

async fn snapshot(dirs: &NodeDirs) -> Snapshot {
    let mut weed_pids = pids_of("weed", &dirs.root.path().display().to_string());
    weed_pids.sort();
    let mut mounts = mounts_below(dirs.root.path());
    mounts.sort();
    let list = mounthost::proto::host::host_client::HostClient::new(channel(&dirs.host_sock))
        .list_volumes(mounthost::proto::host::ListVolumesRequest {})
        .await
        .unwrap()
        .into_inner()
        .volumes;
    let published = list.into_iter().map(|v| (v.volume_id, v.targets)).collect();
    Snapshot { weed_pids, mounts, published }
}

async fn create(controller: &mut ControllerClient<UnixChannel>, weed: &Seaweed, name: &str) -> csi::Volume {
    let req = csi::CreateVolumeRequest {
        name: name.into(),
        parameters: [("plugin".to_string(), "seaweedfs".to_string()), ("filer".into(), weed.filer.clone())].into(),
        volume_capabilities: vec![capability(Mode::SingleNodeWriter), capability(Mode::MultiNodeMultiWriter)],
        ..Default::default()
    };
    controller.create_volume(req).await.unwrap().into_inner().volume.unwrap()
}

#[test]
fn node_rpcs_answer_the_spec_codes_and_change_nothing() {
    if !in_private_namespace("node_rpcs_answer_the_spec_codes_and_change_nothing") {
        return;
    }
    with_seaweed_node(async |weed, dirs, (node, controller)| rules(weed, dirs, node, controller).await);
}

async fn rules(
    weed: &Seaweed,
    dirs: &NodeDirs,
    mut node: NodeClient<UnixChannel>,
    mut controller: ControllerClient<UnixChannel>,
) {
    let mut checked = Vec::new();

    // One volume staged SINGLE_NODE_WRITER and published read-write in pod a.
    let vol = create(&mut controller, weed, "pvc-rules").await;
    let id = vol.volume_id.clone();
    let ctx = vol.volume_context.clone();
    let staging = dirs.staging("pvc-rules");
    let (a, b) = (dirs.target("pod-a", "pvc-rules"), dirs.target("pod-b", "pvc-rules"));
    node.node_stage_volume(stage(&id, &staging, &ctx, Mode::SingleNodeWriter)).await.unwrap();
    node.node_publish_volume(publish(&id, &staging, &a, false, Mode::SingleNodeWriter)).await.unwrap();
    std::fs::write(a.join("marker"), b"in the volume").unwrap();
    // A second volume, staged MULTI_NODE_MULTI_WRITER and published nowhere yet.
    let multi = create(&mut controller, weed, "pvc-multi").await;
    let id2 = multi.volume_id.clone();
    let staging2 = dirs.staging("pvc-multi");
    node.node_stage_volume(stage(&id2, &staging2, &multi.volume_context, Mode::MultiNodeMultiWriter)).await.unwrap();
    let before = snapshot(dirs).await;
    assert_eq!(before.weed_pids.len(), 2, "{before:?}");

    // Restage: the same request is OK; another context or capability is ALREADY_EXISTS.
    node.node_stage_volume(stage(&id, &staging, &ctx, Mode::SingleNodeWriter)).await.unwrap();
    let mut other_ctx = ctx.clone();
    other_ctx.insert("readOnly".into(), "true".into());
    let m = code(
        node.node_stage_volume(stage(&id, &staging, &other_ctx, Mode::SingleNodeWriter)).await,
        Code::AlreadyExists,
    );
    assert!(m.contains("another volume context") && m.contains("readOnly"), "{m}");
    let m =
        code(node.node_stage_volume(stage(&id, &staging, &ctx, Mode::MultiNodeReaderOnly)).await, Code::AlreadyExists);
    assert!(m.contains("capability") && m.contains("MULTI_NODE_READER_ONLY"), "{m}");
    assert_eq!(snapshot(dirs).await, before, "a refused restage changes nothing");
    checked.push("restage: same OK, other context and other capability ALREADY_EXISTS");

    // A second target of a single-writer volume: FAILED_PRECONDITION, read-write or read-only.
    for readonly in [false, true] {
        let m = code(
            node.node_publish_volume(publish(&id, &staging, &b, readonly, Mode::SingleNodeWriter)).await,
            Code::FailedPrecondition,
        );
        assert!(m.contains("SINGLE_NODE_WRITER") && m.contains(&a.display().to_string()), "{m}");
    }
    assert!(!b.exists(), "the second target was not even created");
    assert_eq!(snapshot(dirs).await, before);
    // The same target again is still fine (kubelet retries).
    node.node_publish_volume(publish(&id, &staging, &a, false, Mode::SingleNodeWriter)).await.unwrap();
    checked.push("single writer: second target FAILED_PRECONDITION (rw and ro), same target OK");

    // NodePublishVolume "Volume published but is incompatible 6 ALREADY_EXISTS": the same
    // target with another capability or another readonly flag (T1=T2, P1!=P2).
    let m = code(
        node.node_publish_volume(publish(&id, &staging, &a, false, Mode::MultiNodeMultiWriter)).await,
        Code::AlreadyExists,
    );
    assert!(m.contains("already published at") && m.contains("MULTI_NODE_MULTI_WRITER"), "{m}");
    let m = code(
        node.node_publish_volume(publish(&id, &staging, &a, true, Mode::SingleNodeWriter)).await,
        Code::AlreadyExists,
    );
    assert!(m.contains("already published at") && m.contains("read-write"), "{m}");
    // "COs SHOULD NOT call NodePublishVolume a second time with a different volume_capability. If
    // this happens, the Plugin SHOULD return FAILED_PRECONDITION": a capability the volume was not
    // staged with, at a new target, for either volume.
    for (who, from, to, mode) in [
        (&id, &staging, &b, Mode::MultiNodeMultiWriter),
        (&id2, &staging2, &b, Mode::SingleNodeWriter),
        (&id2, &staging2, &b, Mode::MultiNodeReaderOnly),
    ] {
        let m = code(node.node_publish_volume(publish(who, from, to, false, mode)).await, Code::FailedPrecondition);
        assert!(m.contains("is staged with capability") && m.contains(mode.as_str_name()), "{m}");
    }
    assert!(!b.exists(), "the second target was not even created");
    assert_eq!(snapshot(dirs).await, before, "a refused publish changes nothing");
    // A MULTI_NODE volume at two targets, read-write and read-only (T1!=T2, P1!=P2): OK; then
    // its read-only target asked read-write: ALREADY_EXISTS.
    let (c, d) = (dirs.target("pod-m1", "pvc-multi"), dirs.target("pod-m2", "pvc-multi"));
    node.node_publish_volume(publish(&id2, &staging2, &c, false, Mode::MultiNodeMultiWriter)).await.unwrap();
    node.node_publish_volume(publish(&id2, &staging2, &d, true, Mode::MultiNodeMultiWriter)).await.unwrap();
    std::fs::write(c.join("shared"), b"written in c").unwrap();
    assert_eq!(std::fs::read(d.join("shared")).unwrap(), b"written in c");
    let refused = std::fs::write(d.join("nope"), b"x").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(nix::libc::EROFS), "d is read-only: {refused}");
    let m = code(
        node.node_publish_volume(publish(&id2, &staging2, &d, false, Mode::MultiNodeMultiWriter)).await,
        Code::AlreadyExists,
    );
    assert!(m.contains("read-only"), "{m}");
    for t in [&c, &d] {
        node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: id2.clone(),
            target_path: t.display().to_string(),
        })
        .await
        .unwrap();
    }
    assert_eq!(snapshot(dirs).await, before);
    checked.push("publish: same target other capability or readonly ALREADY_EXISTS, capability not staged FAILED_PRECONDITION, multi-node ro+rw OK");

    // SINGLE_NODE_READER_ONLY: "Can only be published once as readonly on a single node, at any
    // given time": read-only at its target, the same target again OK, a second target
    // FAILED_PRECONDITION whatever its readonly flag.
    let reader = create(&mut controller, weed, "pvc-reader").await;
    let id3 = reader.volume_id.clone();
    let staging3 = dirs.staging("pvc-reader");
    node.node_stage_volume(stage(&id3, &staging3, &reader.volume_context, Mode::SingleNodeReaderOnly)).await.unwrap();
    let (e1, e2) = (dirs.target("pod-r1", "pvc-reader"), dirs.target("pod-r2", "pvc-reader"));
    for _ in 0..2 {
        node.node_publish_volume(publish(&id3, &staging3, &e1, false, Mode::SingleNodeReaderOnly)).await.unwrap();
    }
    let refused = std::fs::write(e1.join("nope"), b"x").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(nix::libc::EROFS), "published read-only: {refused}");
    for readonly in [true, false] {
        let m = code(
            node.node_publish_volume(publish(&id3, &staging3, &e2, readonly, Mode::SingleNodeReaderOnly)).await,
            Code::FailedPrecondition,
        );
        assert!(m.contains("SINGLE_NODE_READER_ONLY") && m.contains(&e1.display().to_string()), "{m}");
    }
    assert!(!e2.exists(), "the second target was not created");
    node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
        volume_id: id3.clone(),
        target_path: e1.display().to_string(),
    })
    .await
    .unwrap();
    node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: id3.clone(),
        staging_target_path: staging3.display().to_string(),
    })
    .await
    .unwrap();
    controller.delete_volume(csi::DeleteVolumeRequest { volume_id: id3, secrets: Default::default() }).await.unwrap();
    assert_eq!(snapshot(dirs).await, before);
    checked.push("single reader: read-only at one target, a second target FAILED_PRECONDITION (ro and rw)");

    // SINGLE_NODE_SINGLE_WRITER (kubelet's ReadWriteOncePod): a second target is refused while
    // either publication is read-write.
    let sole = create(&mut controller, weed, "pvc-sole").await;
    let id4 = sole.volume_id.clone();
    let staging4 = dirs.staging("pvc-sole");
    node.node_stage_volume(stage(&id4, &staging4, &sole.volume_context, Mode::SingleNodeSingleWriter)).await.unwrap();
    let (s1, s2) = (dirs.target("pod-s1", "pvc-sole"), dirs.target("pod-s2", "pvc-sole"));
    node.node_publish_volume(publish(&id4, &staging4, &s1, false, Mode::SingleNodeSingleWriter)).await.unwrap();
    for readonly in [true, false] {
        let m = code(
            node.node_publish_volume(publish(&id4, &staging4, &s2, readonly, Mode::SingleNodeSingleWriter)).await,
            Code::FailedPrecondition,
        );
        assert!(m.contains("SINGLE_NODE_SINGLE_WRITER") && m.contains(&s1.display().to_string()), "{m}");
    }
    assert!(!s2.exists(), "the second target was not created");
    node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
        volume_id: id4.clone(),
        target_path: s1.display().to_string(),
    })
    .await
    .unwrap();
    node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: id4.clone(),
        staging_target_path: staging4.display().to_string(),
    })
    .await
    .unwrap();
    controller.delete_volume(csi::DeleteVolumeRequest { volume_id: id4, secrets: Default::default() }).await.unwrap();
    assert_eq!(snapshot(dirs).await, before);
    checked.push("single-node single writer: a second target FAILED_PRECONDITION (ro and rw)");

    // "Staging target path not set 9 FAILED_PRECONDITION", and a volume not staged on this node.
    let mut unstaged = publish(&id, &staging, &b, false, Mode::SingleNodeWriter);
    unstaged.staging_target_path.clear();
    let m = code(node.node_publish_volume(unstaged).await, Code::FailedPrecondition);
    assert!(m.contains("staging_target_path is required"), "{m}");
    let never = dirs.staging("pvc-never-staged");
    let m = code(
        node.node_publish_volume(publish("seaweedfs~never-staged", &never, &b, false, Mode::SingleNodeWriter)).await,
        Code::FailedPrecondition,
    );
    assert!(m.contains("is not staged on this node"), "{m}");
    assert!(!b.exists());
    checked.push("publish without a staging path or before stage: FAILED_PRECONDITION");

    // A target whose parent kubelet has not created.
    let orphan = dirs.kubelet.join("pods/pod-missing/volumes/kubernetes.io~csi/pvc-multi/mount");
    let m = code(
        node.node_publish_volume(publish(&id2, &staging2, &orphan, false, Mode::MultiNodeMultiWriter)).await,
        Code::FailedPrecondition,
    );
    assert!(m.contains(&orphan.parent().unwrap().display().to_string()) && m.contains("does not exist"), "{m}");
    assert!(!dirs.kubelet.join("pods/pod-missing").exists(), "nothing was created on the way");
    checked.push("missing target parent FAILED_PRECONDITION naming it");

    // A pod directory swapped for a link to a directory standing for /etc.
    let etc = dirs.root.path().join("etc");
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::write(etc.join("passwd"), b"root:x:0:0").unwrap();
    let pod_c = dirs.kubelet.join("pods/pod-c");
    std::os::unix::fs::symlink(&etc, &pod_c).unwrap();
    let through = pod_c.join("volumes/kubernetes.io~csi/pvc-multi/mount");
    let m = code(
        node.node_publish_volume(publish(&id2, &staging2, &through, false, Mode::MultiNodeMultiWriter)).await,
        Code::FailedPrecondition,
    );
    assert!(m.contains("symbolic link") && m.contains(&pod_c.display().to_string()), "{m}");
    assert_eq!(std::fs::read_dir(&etc).unwrap().count(), 1, "nothing created in the link's target");
    assert_eq!(snapshot(dirs).await, before);
    checked.push("target through a link FAILED_PRECONDITION naming it");

    // Stats: the staging path and the target hold the volume; other paths are NOT_FOUND.
    for p in [&staging, &a] {
        let r = node.node_get_volume_stats(stats(&id, p.to_str().unwrap())).await.unwrap().into_inner();
        assert!(!r.volume_condition.unwrap().abnormal);
    }
    let other = dirs.staging("pvc-other");
    for p in [other.display().to_string(), b.display().to_string(), "pods/pod-a/mount".into(), "/etc".into()] {
        let m = code(node.node_get_volume_stats(stats(&id, &p)).await, Code::NotFound);
        assert!(m.contains("neither staged nor published"), "{m}");
    }
    code(node.node_get_volume_stats(stats("seaweedfs~nowhere", staging.to_str().unwrap())).await, Code::NotFound);
    checked.push("stats of foreign, relative and unknown paths NOT_FOUND");

    // Unpublish at a path the volume is not published at, which a record holds (pod a's target
    // for another volume id, the volume's own staging path, the pod's directory above its
    // target, a directory inside the volume): OK (not published there), and nothing changes.
    std::fs::create_dir(a.join("inside")).unwrap();
    let unpublish = |who: &str, p: &Path| csi::NodeUnpublishVolumeRequest {
        volume_id: who.into(),
        target_path: p.display().to_string(),
    };
    let asks = [
        unpublish("seaweedfs~other", &a),
        unpublish(&id, &staging),
        unpublish(&id, a.parent().unwrap()),
        unpublish("seaweedfs~other", &a.join("inside")),
    ];
    for ask in asks {
        node.node_unpublish_volume(ask).await.unwrap();
    }
    assert_eq!(snapshot(dirs).await, before, "an unpublish elsewhere changes nothing");
    assert_eq!(std::fs::read(a.join("marker")).unwrap(), b"in the volume");
    assert!(a.join("inside").is_dir() && staging.is_dir());
    checked.push("unpublish at a path another record holds: OK, nothing changed");

    // Unstage of an id with no record at this volume's staging path: OK, and nothing changes.
    let weed_mount = |p: &Path| {
        mounthost::exec::mountinfo::read()
            .unwrap()
            .into_iter()
            .any(|m| m.mount_point == p && m.fstype == "fuse.seaweedfs")
    };
    assert!(weed_mount(&staging));
    node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: "seaweedfs~unknown".into(),
        staging_target_path: staging.display().to_string(),
    })
    .await
    .unwrap();
    assert!(weed_mount(&staging), "the stage is still mounted (/proc/self/mountinfo)");
    assert_eq!(snapshot(dirs).await, before, "an unstage of an unknown id changes nothing");
    // The volume still publishes: a fresh bind from its stage shows its file.
    node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
        volume_id: id.clone(),
        target_path: a.display().to_string(),
    })
    .await
    .unwrap();
    node.node_publish_volume(publish(&id, &staging, &a, false, Mode::SingleNodeWriter)).await.unwrap();
    assert_eq!(std::fs::read(a.join("marker")).unwrap(), b"in the volume");
    assert_eq!(snapshot(dirs).await, before);
    checked.push("unstage of an unknown id at another volume's staging path: OK, nothing changed");

    // NodeUnstageVolume of a staged volume at a path it is not staged at: "If the volume
    // corresponding to the volume_id is not staged to the staging_target_path, the Plugin MUST
    // reply 0 OK"; its stage, publication and the path asked stay as they are.
    let elsewhere = dirs.staging("pvc-elsewhere");
    for (who, at) in [(&id, &elsewhere), (&id, &staging2), (&id2, &staging)] {
        node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: who.clone(),
            staging_target_path: at.display().to_string(),
        })
        .await
        .unwrap_or_else(|e| panic!("unstage {who} at {}: {e:?}", at.display()));
    }
    assert!(weed_mount(&staging) && weed_mount(&staging2), "both stages are still mounted");
    assert!(elsewhere.is_dir(), "the path asked is left as it is");
    assert_eq!(snapshot(dirs).await, before, "an unstage at another path changes nothing");
    assert_eq!(std::fs::read(a.join("marker")).unwrap(), b"in the volume");
    checked.push("unstage of a staged volume at another path: OK, nothing changed");

    // NodeStageVolume: a capability mounthost never supports is an "unsupported field"
    // (INVALID_ARGUMENT), as is a missing one; a second staging path for a staged volume, which
    // the CO "SHALL ensure" never happens, is FAILED_PRECONDITION naming the first.
    let mut block = stage(&id, &staging, &ctx, Mode::SingleNodeWriter);
    block.volume_capability.as_mut().unwrap().access_type =
        Some(csi::volume_capability::AccessType::Block(Default::default()));
    let m = code(node.node_stage_volume(block).await, Code::InvalidArgument);
    assert!(m.contains("block access is not supported"), "{m}");
    let mut missing = stage(&id, &staging, &ctx, Mode::SingleNodeWriter);
    missing.volume_capability = None;
    code(node.node_stage_volume(missing).await, Code::InvalidArgument);
    let m = code(
        node.node_stage_volume(stage(&id, &elsewhere, &ctx, Mode::SingleNodeWriter)).await,
        Code::FailedPrecondition,
    );
    assert!(m.contains(&staging.display().to_string()), "{m}");
    assert_eq!(snapshot(dirs).await, before);
    checked.push("stage: block or no capability INVALID_ARGUMENT, a second staging path FAILED_PRECONDITION");

    // NodeStageVolume "Volume does not exist 5 NOT_FOUND": a volume deleted in the filer (its
    // directory gone), twice; `weed mount` would have made an empty directory.
    let gone = create(&mut controller, weed, "pvc-gone").await;
    let gone_dir = gone.volume_context["path"].clone();
    controller
        .delete_volume(csi::DeleteVolumeRequest { volume_id: gone.volume_id.clone(), secrets: Default::default() })
        .await
        .unwrap();
    let gone_staging = dirs.staging("pvc-gone");
    for _ in 0..2 {
        let m = code(
            node.node_stage_volume(stage(&gone.volume_id, &gone_staging, &gone.volume_context, Mode::SingleNodeWriter))
                .await,
            Code::NotFound,
        );
        assert!(m.contains(&gone_dir) && m.contains("not in the filer"), "{m}");
    }
    assert!(!weed.dir_exists(&gone_dir), "the deleted volume's directory was not made again");
    assert_eq!(snapshot(dirs).await, before, "a stage of a deleted volume changes nothing");
    checked.push("stage of a deleted volume: NOT_FOUND, nothing made");

    // Tear down: nothing left.
    node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
        volume_id: id.clone(),
        target_path: a.display().to_string(),
    })
    .await
    .unwrap();
    node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.display().to_string(),
    })
    .await
    .unwrap();
    node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: id2.clone(),
        staging_target_path: staging2.display().to_string(),
    })
    .await
    .unwrap();
    for v in [id, id2] {
        controller.delete_volume(csi::DeleteVolumeRequest { volume_id: v, secrets: Default::default() }).await.unwrap();
    }
    assert_eq!(mounts_below(dirs.root.path()), Vec::<PathBuf>::new());
    assert!(pids_of("weed", &dirs.root.path().display().to_string()).is_empty());
    println!("checked: {} node rules: {}", checked.len(), checked.join("; "));
}
