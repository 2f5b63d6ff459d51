//! The CSI spec v1.12 error rows of the node RPCs, through the real front and host daemon
//! processes against a real SeaweedFS (root, private mount namespace, kubelet's path layout):
//!
//! - NodeStageVolume of a staged volume with another volume context or an incompatible
//!   capability: ALREADY_EXISTS ("volume_id has already been staged ... but is incompatible");
//!   the same request: OK.
//! - NodePublishVolume of a SINGLE_NODE_WRITER / SINGLE_NODE_SINGLE_WRITER volume at a second
//!   target: FAILED_PRECONDITION ("exceeds capabilities").
//! - NodePublishVolume whose target's parent does not exist (the CO's job): FAILED_PRECONDITION
//!   naming the parent; a target reached through a symbolic link: FAILED_PRECONDITION naming it.
//! - NodeGetVolumeStats at a path that does not hold the volume, a relative one included:
//!   NOT_FOUND.
//! - NodeUnpublishVolume at a path the volume is not published at but a record holds (another
//!   volume's target, its own staging path, a directory above or inside a publication): OK,
//!   and nothing is unmounted or removed.
//! - NodeUnstageVolume of a volume id the node has no record of, at another volume's staging
//!   path: OK ("not staged to the staging_target_path"), and that volume's stage stays mounted
//!   and still publishes.
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
        volume_capabilities: vec![capability(Mode::SingleNodeWriter)],
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
    let before = snapshot(dirs).await;
    assert_eq!(before.weed_pids.len(), 1, "{before:?}");

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

    // A target whose parent kubelet has not created.
    let orphan = dirs.kubelet.join("pods/pod-missing/volumes/kubernetes.io~csi/pvc-rules/mount");
    let m = code(
        node.node_publish_volume(publish(&id, &staging, &orphan, false, Mode::MultiNodeMultiWriter)).await,
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
    let through = pod_c.join("volumes/kubernetes.io~csi/pvc-rules/mount");
    let m = code(
        node.node_publish_volume(publish(&id, &staging, &through, false, Mode::MultiNodeMultiWriter)).await,
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
    controller.delete_volume(csi::DeleteVolumeRequest { volume_id: id, secrets: Default::default() }).await.unwrap();
    assert_eq!(mounts_below(dirs.root.path()), Vec::<PathBuf>::new());
    assert!(pids_of("weed", &dirs.root.path().display().to_string()).is_empty());
    println!("checked: {} node rules: {}", checked.len(), checked.join("; "));
}
