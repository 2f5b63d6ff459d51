//! Restarts and reboots of the host daemon, with the `tmpfs` test plugin as the backend (no
//! process, so this exercises mounthost itself). Root, each test in a private mount namespace.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use common::{NodeDirs, guarded, in_private_namespace, mounts_below};
use mounthost::proto::csi;
use mounthost::proto::csi::identity_client::IdentityClient;
use mounthost::proto::csi::node_client::NodeClient;
use mounthost::proto::host::ListVolumesRequest;
use mounthost::proto::host::host_client::HostClient;
use mounthost::unpriv::grpc::channel;

fn tmpfs_args(dirs: &NodeDirs) -> Vec<String> {
    let plugins = dirs.root.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::copy(mounthost::stock::fixtures::path("tmpfs"), plugins.join("tmpfs.wasm")).unwrap();
    vec![format!("--plugin-dir={}", plugins.display()), "--grant=tmpfs:fstype=tmpfs".into()]
}

fn ctx() -> HashMap<String, String> {
    [("plugin".to_string(), "tmpfs".to_string()), ("sizeMiB".into(), "4".into())].into()
}

fn cap() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
    }
}

async fn stage_and_publish(
    node: &mut NodeClient<mounthost::unpriv::grpc::UnixChannel>,
    id: &str,
    staging: &Path,
    target: &Path,
) {
    let stage = csi::NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(cap()),
        volume_context: ctx(),
        ..Default::default()
    };
    node.node_stage_volume(stage).await.unwrap();
    let publish = csi::NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(cap()),
        volume_context: ctx(),
        ..Default::default()
    };
    node.node_publish_volume(publish).await.unwrap();
}

/// The host daemon's volumes, over its own socket.
async fn list(dirs: &NodeDirs) -> Vec<mounthost::proto::host::VolumeStatus> {
    HostClient::new(channel(&dirs.host_sock)).list_volumes(ListVolumesRequest {}).await.unwrap().into_inner().volumes
}

async fn ready(ch: &mounthost::unpriv::grpc::UnixChannel) {
    let mut id = IdentityClient::new(ch.clone());
    for _ in 0..400 {
        if id.probe(csi::ProbeRequest {}).await.is_ok_and(|r| r.into_inner().ready == Some(true)) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("never ready");
}

/// A simulated reboot: every process killed, every mount gone, and the state files' boot id is
/// not this boot's. The restarted daemon cleans the stale records, and kubelet's next
/// NodeStageVolume and NodePublishVolume rebuild every volume without manual steps.
#[test]
fn after_a_reboot_kubelet_calls_rebuild_every_volume() {
    if !in_private_namespace("after_a_reboot_kubelet_calls_rebuild_every_volume") {
        return;
    }
    let dirs = NodeDirs::new();
    let extra = tmpfs_args(&dirs);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut host = dirs.start_host(&extra);
    let mut front = dirs.start_front(&extra);
    guarded(&dirs, || {
        rt.block_on(async {
            let ch = channel(&dirs.csi_sock);
            ready(&ch).await;
            let mut node = NodeClient::new(ch.clone());
            let vols: Vec<(String, PathBuf, PathBuf)> = (0..3)
                .map(|i| {
                    (format!("tmpfs~pv-{i}"), dirs.staging(&format!("pv-{i}")), dirs.target("pod", &format!("pv-{i}")))
                })
                .collect();
            for (id, s, t) in &vols {
                stage_and_publish(&mut node, id, s, t).await;
            }
            assert_eq!(mounts_below(dirs.root.path()).len(), 6);

            // The reboot: processes and mounts gone, state files still there with the old boot.
            host.kill9();
            front.kill9();
            for m in mounts_below(dirs.root.path()).iter().rev() {
                nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH).unwrap();
            }
            let volumes = dirs.state.join("volumes");
            let mut rewritten = 0;
            // The records (each may have a spare beside it, `.<record>.spare`, swapped in on writes).
            for entry in std::fs::read_dir(&volumes)
                .unwrap()
                .flatten()
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            {
                let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(entry.path()).unwrap()).unwrap();
                v["bootId"] = "00000000-0000-0000-0000-000000000000".into();
                std::fs::write(entry.path(), v.to_string()).unwrap();
                rewritten += 1;
            }
            assert_eq!(rewritten, 3);

            host = dirs.start_host(&extra);
            front = dirs.start_front(&extra);
            ready(&ch).await;
            let listed = list(&dirs).await;
            assert!(listed.is_empty(), "stale records of the earlier boot are cleaned: {listed:?}");
            for (id, s, t) in &vols {
                stage_and_publish(&mut node, id, s, t).await;
                std::fs::write(t.join("after-reboot"), b"ok").unwrap();
                assert_eq!(std::fs::read(s.join("after-reboot")).unwrap(), b"ok");
            }
            let listed = list(&dirs).await;
            assert_eq!(listed.len(), 3);
            assert!(listed.iter().all(|v| v.healthy && v.targets.len() == 1), "{listed:?}");
            println!("checked: 3 stale records cleaned after the reboot, 3 volumes rebuilt by kubelet's calls");
            drop((host, front));
        })
    });
}
