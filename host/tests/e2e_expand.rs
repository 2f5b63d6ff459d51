//! Expansion, GetCapacity, ListVolumes and ValidateVolumeCapabilities' NOT_FOUND end to end, as
//! root in a private mount namespace: CSI calls through the real front and host daemon
//! processes against a real SeaweedFS started here. Each check names the CSI spec row (v1.12)
//! it answers.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{NodeDirs, Seaweed, guarded, in_private_namespace, multi_writer, pids_with, publish_req, stage_req};
use mounthost::proto::csi;
use mounthost::proto::csi::controller_client::ControllerClient;
use mounthost::proto::csi::node_client::NodeClient;
use mounthost::unpriv::grpc::{UnixChannel, channel};
use tonic::Code;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

type Controller = ControllerClient<UnixChannel>;
type Node = NodeClient<UnixChannel>;

/// A node (host + front) granted the test's filer, with its clients.
fn with_node(test: &str, body: impl AsyncFnOnce(&Seaweed, &NodeDirs, Node, Controller)) {
    if !in_private_namespace(test) {
        return;
    }
    let weed = Seaweed::start();
    let dirs = NodeDirs::new();
    let program = format!("--program=weed={}", common::weed_binary().display());
    // ListVolumes carries no StorageClass: the filers it lists are the node's grants.
    let grant = format!("--grant=seaweedfs:host={}", weed.filer);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _host = dirs.start_host(std::slice::from_ref(&program));
    let _front = dirs.start_front(&[program, grant]);
    guarded(&dirs, || {
        rt.block_on(async {
            let ch = channel(&dirs.csi_sock);
            common::wait_ready(&ch).await;
            body(&weed, &dirs, NodeClient::new(ch.clone()), ControllerClient::new(ch)).await
        })
    });
}

fn range(required: u64, limit: u64) -> Option<csi::CapacityRange> {
    Some(csi::CapacityRange { required_bytes: required as i64, limit_bytes: limit as i64 })
}

async fn create(c: &mut Controller, weed: &Seaweed, name: &str, required: u64) -> csi::Volume {
    let req = csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: range(required, 0),
        parameters: [("plugin".to_string(), "seaweedfs".to_string()), ("filer".into(), weed.filer.clone())].into(),
        volume_capabilities: vec![multi_writer()],
        ..Default::default()
    };
    c.create_volume(req).await.unwrap().into_inner().volume.unwrap()
}

fn controller_expand(id: &str, required: u64, limit: u64) -> csi::ControllerExpandVolumeRequest {
    csi::ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: range(required, limit),
        volume_capability: Some(multi_writer()),
        ..Default::default()
    }
}

fn node_expand(id: &str, path: &Path, staging: &Path, required: u64) -> csi::NodeExpandVolumeRequest {
    csi::NodeExpandVolumeRequest {
        volume_id: id.into(),
        volume_path: path.display().to_string(),
        capacity_range: range(required, 0),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(multi_writer()),
        ..Default::default()
    }
}

/// A pod writing: 1 MiB writes appended to one file, counting the bytes each write took;
/// ENOSPC is noted with the count at that moment and retried every 100 ms.
struct Writer {
    written: Arc<AtomicU64>,
    refused: Arc<Mutex<Vec<(u64, Instant)>>>,
    other: Arc<Mutex<Option<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    fn start(path: PathBuf) -> Writer {
        let written = Arc::new(AtomicU64::new(0));
        let refused = Arc::new(Mutex::new(Vec::new()));
        let other = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let (w, r, o, s) = (written.clone(), refused.clone(), other.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&path).unwrap();
            let block: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8).collect();
            while !s.load(Ordering::Relaxed) {
                match file.write(&block) {
                    Ok(n) => {
                        w.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    Err(e) if e.raw_os_error() == Some(nix::errno::Errno::ENOSPC as i32) => {
                        r.lock().unwrap().push((w.load(Ordering::Relaxed), Instant::now()));
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    Err(e) => {
                        *o.lock().unwrap() = Some(e.to_string());
                        return;
                    }
                }
            }
        });
        Writer { written, refused, other, stop, thread: Some(thread) }
    }

    fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// The bytes written when a write was first refused after `since`.
    fn refused_after(&self, since: Instant) -> Option<u64> {
        self.refused.lock().unwrap().iter().find(|(_, at)| *at >= since).map(|(n, _)| *n)
    }

    fn check(&self) {
        if let Some(e) = self.other.lock().unwrap().as_ref() {
            panic!("the writer failed with something else than ENOSPC: {e}");
        }
    }

    async fn wait_refused(&self, since: Instant, limit: Duration) -> u64 {
        let until = Instant::now() + limit;
        loop {
            self.check();
            if let Some(n) = self.refused_after(since) {
                return n;
            }
            assert!(Instant::now() < until, "no write refused within {limit:?} ({} bytes written)", self.written());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap();
    }
}

fn weed_pids(staging: &Path) -> Vec<i32> {
    pids_with(&format!("-dir={}", staging.display()))
}

fn cmdline(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

fn gib(n: u64) -> String {
    format!("{:.3} GiB", n as f64 / GIB as f64)
}

#[test]
fn a_published_seaweedfs_volume_grows_from_1_to_2_gib_while_a_pod_writes() {
    with_node(
        "a_published_seaweedfs_volume_grows_from_1_to_2_gib_while_a_pod_writes",
        async |weed, dirs, mut node, mut controller| {
            let vol = create(&mut controller, weed, "pvc-grow", GIB).await;
            assert_eq!(vol.capacity_bytes, GIB as i64);
            let id = vol.volume_id.clone();
            let staging = dirs.staging("pvc-grow");
            let target = dirs.target("pod-grow", "pvc-grow");
            node.node_stage_volume(stage_req(&id, &staging, &vol.volume_context)).await.unwrap();
            node.node_publish_volume(publish_req(&id, &staging, &target, false, &vol.volume_context)).await.unwrap();
            let pids = weed_pids(&staging);
            assert_eq!(pids.len(), 1, "one weed mount: {pids:?}");
            assert!(cmdline(pids[0]).contains("-collectionQuotaMB=1024"), "{}", cmdline(pids[0]));

            // The pod writes until the volume is full: at its quota a write is refused with ENOSPC.
            let started = Instant::now();
            let writer = Writer::start(target.join("data"));
            let full = writer.wait_refused(started, Duration::from_secs(300)).await;
            println!(
                "checked: 1 GiB volume: {} written ({full} bytes) before ENOSPC, after {:?}",
                gib(full),
                started.elapsed()
            );
            assert!(full <= GIB + 16 * MIB, "the quota held: {full} bytes written");
            assert!(full >= GIB - 128 * MIB, "the volume took nearly its size: {full} bytes");
            tokio::time::sleep(Duration::from_secs(2)).await;
            let still = writer.written();
            assert!(still <= full + 2 * MIB, "still refused 2 s later ({still} bytes)");

            // ControllerExpandVolume: the record grows; the node must follow.
            let grown =
                controller.controller_expand_volume(controller_expand(&id, 2 * GIB, 0)).await.unwrap().into_inner();
            assert_eq!((grown.capacity_bytes, grown.node_expansion_required), (2 * GIB as i64, true));
            // NodeExpandVolume beyond what the controller granted: "Unsupported capacity": OUT_OF_RANGE.
            let over = node.node_expand_volume(node_expand(&id, &target, &staging, 3 * GIB)).await.unwrap_err();
            assert_eq!(over.code(), Code::OutOfRange, "{over:?}");
            assert!(over.message().contains("ControllerExpandVolume"), "{over:?}");
            // "Volume does not exist" on the specified volume_path: NOT_FOUND.
            let elsewhere = dirs.target("pod-other", "pvc-grow");
            let err = node.node_expand_volume(node_expand(&id, &elsewhere, &staging, 2 * GIB)).await.unwrap_err();
            assert_eq!(err.code(), Code::NotFound, "{err:?}");
            let err = node
                .node_expand_volume(node_expand("seaweedfs~no-such", &target, &staging, 2 * GIB))
                .await
                .unwrap_err();
            assert_eq!(err.code(), Code::NotFound, "{err:?}");
            // "Exceeds capabilities": another access mode than staged; block access.
            let mut reader = node_expand(&id, &target, &staging, 2 * GIB);
            reader.volume_capability =
                Some(common::capability(csi::volume_capability::access_mode::Mode::SingleNodeReaderOnly));
            let err = node.node_expand_volume(reader).await.unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
            assert!(err.message().contains("SINGLE_NODE_MULTI_WRITER"), "{err:?}");
            let mut block = controller_expand(&id, 2 * GIB, 0);
            block.volume_capability = Some(csi::VolumeCapability {
                access_type: Some(csi::volume_capability::AccessType::Block(Default::default())),
                ..multi_writer()
            });
            let err = controller.controller_expand_volume(block).await.unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");

            // Online: the running mount is told its new quota, on the pod's own target path.
            let told = Instant::now();
            let answer =
                node.node_expand_volume(node_expand(&id, &target, &staging, 2 * GIB)).await.unwrap().into_inner();
            assert_eq!(answer.capacity_bytes, 2 * GIB as i64);
            let until = Instant::now() + Duration::from_secs(60);
            while writer.written() <= full + MIB {
                writer.check();
                assert!(Instant::now() < until, "writes never resumed after the expansion");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            println!("checked: writes resumed {:?} after NodeExpandVolume", told.elapsed());
            // Refusals between the call and the resume were the old quota's (weed rereads its usage
            // every 5 s near the quota): the next one counts from the resume.
            let resumed = Instant::now();
            let second = writer.wait_refused(resumed, Duration::from_secs(300)).await;
            writer.stop();
            println!(
                "checked: 2 GiB volume: {} written ({second} bytes) before the next ENOSPC; {} beyond the first quota",
                gib(second),
                gib(second - full)
            );
            assert!(second > GIB + 512 * MIB, "the grown volume took writes beyond 1 GiB: {second}");
            assert!(second <= 2 * GIB + 16 * MIB, "the new quota held: {second}");
            assert_eq!(weed_pids(&staging), pids, "the same weed mount throughout: the volume was grown online");
            // NodeExpandVolume without capacity_range (OPTIONAL): the size the controller gave it.
            let mut no_range = node_expand(&id, &target, &staging, 0);
            no_range.capacity_range = None;
            let answer = node.node_expand_volume(no_range).await.unwrap().into_inner();
            assert_eq!(answer.capacity_bytes, 2 * GIB as i64, "{answer:?}");

            // What a restart runs now has the new size: weed killed, the host heals it with 2 GiB.
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pids[0]), nix::sys::signal::Signal::SIGKILL).unwrap();
            let until = Instant::now() + Duration::from_secs(60);
            let healed = loop {
                let now = weed_pids(&staging);
                // (The pod's file is not there: weed creates a file's entry when it is closed, and
                // refuses that over the quota. The mount itself answers again.)
                if now.len() == 1 && now != pids && std::fs::read_dir(&target).is_ok() {
                    break now[0];
                }
                assert!(
                    Instant::now() < until,
                    "weed mount was not restarted: {now:?} (was {pids:?}), {:?}",
                    std::fs::read_dir(&target).map(|_| ())
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
            assert!(cmdline(healed).contains("-collectionQuotaMB=2048"), "{}", cmdline(healed));
            println!("checked: the healed weed mount runs with -collectionQuotaMB=2048");

            // ControllerExpandVolume again to the size it has: OK, the same capacity (idempotent).
            let again =
                controller.controller_expand_volume(controller_expand(&id, 2 * GIB, 0)).await.unwrap().into_inner();
            assert_eq!(again.capacity_bytes, 2 * GIB as i64);
            // "Unsupported capacity": a limit below the size it has is OUT_OF_RANGE.
            let err = controller.controller_expand_volume(controller_expand(&id, 0, GIB)).await.unwrap_err();
            assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
            // "Volume does not exist": NOT_FOUND (an id mounthost never makes, one its plugin cannot
            // have made, one whose directory is gone).
            for missing in ["not-ours", "seaweedfs~no-slash", &format!("seaweedfs~{}/buckets/gone", weed.filer)] {
                let err =
                    controller.controller_expand_volume(controller_expand(missing, 2 * GIB, 0)).await.unwrap_err();
                assert_eq!(err.code(), Code::NotFound, "{missing}: {err:?}");
            }

            // Torn down as kubelet does, retried while the heal still holds the volume.
            let until = Instant::now() + Duration::from_secs(60);
            loop {
                let unpublish = csi::NodeUnpublishVolumeRequest {
                    volume_id: id.clone(),
                    target_path: target.display().to_string(),
                };
                let unstage = csi::NodeUnstageVolumeRequest {
                    volume_id: id.clone(),
                    staging_target_path: staging.display().to_string(),
                };
                let r = match node.node_unpublish_volume(unpublish).await {
                    Ok(_) => node.node_unstage_volume(unstage).await.map(|_| ()),
                    Err(e) => Err(e),
                };
                match r {
                    Ok(()) => break,
                    Err(e) if e.code() == Code::Aborted && Instant::now() < until => {
                        tokio::time::sleep(Duration::from_millis(200)).await
                    }
                    Err(e) => panic!("tearing down: {e:?}"),
                }
            }
            controller.delete_volume(csi::DeleteVolumeRequest { volume_id: id, ..Default::default() }).await.unwrap();
        },
    );
}

/// Every volume ListVolumes answers, page by page with `max_entries`.
async fn list_all(c: &mut Controller, max: i32) -> (Vec<csi::list_volumes_response::Entry>, usize) {
    let (mut all, mut pages, mut token) = (Vec::new(), 0, String::new());
    loop {
        let page = c
            .list_volumes(csi::ListVolumesRequest { max_entries: max, starting_token: token.clone() })
            .await
            .unwrap()
            .into_inner();
        pages += 1;
        if max > 0 {
            assert!(page.entries.len() <= max as usize, "a page holds at most max_entries");
        }
        all.extend(page.entries);
        if page.next_token.is_empty() {
            return (all, pages);
        }
        token = page.next_token;
        assert!(pages < 100, "ListVolumes never ended");
    }
}

fn master_free(weed: &Seaweed) -> u64 {
    let (status, body) = common::http("GET", &weed.master(), "/dir/status", &[], b"").unwrap();
    assert_eq!(status, 200, "{body}");
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    doc["Topology"]["Free"].as_u64().unwrap()
}

#[test]
fn list_volumes_get_capacity_and_validation_answer_as_the_spec_says() {
    with_node(
        "list_volumes_get_capacity_and_validation_answer_as_the_spec_says",
        async |weed, _dirs, _node, mut controller| {
            // ControllerGetCapabilities advertises what this test exercises.
            use csi::controller_service_capability::rpc::Type;
            let caps = controller.controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {}).await.unwrap();
            let caps: Vec<i32> = caps
                .into_inner()
                .capabilities
                .iter()
                .filter_map(|c| match &c.r#type {
                    Some(csi::controller_service_capability::Type::Rpc(r)) => Some(r.r#type),
                    _ => None,
                })
                .collect();
            for t in [Type::ExpandVolume, Type::GetCapacity, Type::ListVolumes, Type::ListVolumesPublishedNodes] {
                assert!(caps.contains(&(t as i32)), "{t:?} advertised: {caps:?}");
            }

            let mut made = Vec::new();
            for (name, size) in [("pvc-list-a", GIB), ("pvc-list-b", 0), ("pvc-list-c", 3 * GIB)] {
                made.push((create(&mut controller, weed, name, size).await.volume_id, size));
            }
            // Every volume once, with its capacity; pages of one, of two, and all at once.
            for max in [1, 2, 0] {
                let (entries, pages) = list_all(&mut controller, max).await;
                let mut got: Vec<(String, i64)> = entries
                    .iter()
                    .map(|e| e.volume.as_ref().map(|v| (v.volume_id.clone(), v.capacity_bytes)).unwrap())
                    .collect();
                got.sort();
                let mut want: Vec<(String, i64)> = made.iter().map(|(id, s)| (id.clone(), *s as i64)).collect();
                want.sort();
                assert_eq!(got, want, "max_entries {max}");
                // No controller publishing in mounthost: published on no node, as the spec defines it.
                assert!(entries.iter().all(|e| e.status.as_ref().is_some_and(|s| s.published_node_ids.is_empty())));
                if max == 1 {
                    assert!(pages >= 3, "one volume per page: {pages} pages");
                }
                println!("checked: ListVolumes max_entries={max}: {} volumes in {pages} pages", got.len());
            }
            let err = controller
                .list_volumes(csi::ListVolumesRequest { max_entries: -1, starting_token: String::new() })
                .await
                .unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
            // "Invalid starting_token": ABORTED.
            for token in ["garbage", "nosuchplugin:x", "seaweedfs:not-a-token"] {
                let err = controller
                    .list_volumes(csi::ListVolumesRequest { max_entries: 0, starting_token: token.into() })
                    .await
                    .unwrap_err();
                assert_eq!(err.code(), Code::Aborted, "{token}: {err:?}");
            }

            // GetCapacity: the master's free volume slots times their size (1024 MiB here).
            let params = |extra: &[(&str, &str)]| -> HashMap<String, String> {
                let mut p: HashMap<String, String> =
                    [("plugin".to_string(), "seaweedfs".to_string()), ("filer".into(), weed.filer.clone())].into();
                p.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
                p
            };
            let master = weed.master();
            let with_master = params(&[("master", &master), ("masterVolumeSizeLimitMB", "1024")]);
            let before = master_free(weed);
            let cap = controller
                .get_capacity(csi::GetCapacityRequest {
                    parameters: with_master.clone(),
                    volume_capabilities: vec![multi_writer()],
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            let after = master_free(weed);
            let free = cap.available_capacity as u64;
            assert!(
                (after.min(before) * GIB..=after.max(before) * GIB).contains(&free),
                "{free} vs {before}..{after} slots"
            );
            println!("checked: GetCapacity {} ({} free slots of 1 GiB)", gib(free), free / GIB);
            let mut replicated = with_master.clone();
            replicated.insert("replication".into(), "001".into());
            let half = controller
                .get_capacity(csi::GetCapacityRequest { parameters: replicated, ..Default::default() })
                .await
                .unwrap()
                .into_inner();
            assert!(half.available_capacity as u64 <= free / 2 + GIB, "two copies halve it: {half:?}");
            // No topology is advertised: a request naming one is refused.
            let err = controller
                .get_capacity(csi::GetCapacityRequest {
                    parameters: with_master.clone(),
                    accessible_topology: Some(csi::Topology {
                        segments: [("zone".to_string(), "a".to_string())].into(),
                    }),
                    ..Default::default()
                })
                .await
                .unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
            // Without a master the plugin cannot tell: a non-OK code (UNIMPLEMENTED), naming it.
            let err = controller
                .get_capacity(csi::GetCapacityRequest { parameters: params(&[]), ..Default::default() })
                .await
                .unwrap_err();
            assert_eq!(err.code(), Code::Unimplemented, "{err:?}");
            assert!(err.message().contains("seaweedfs"), "{err:?}");
            // No parameters: volumes CreateVolume refuses (no plugin), of which there is room for none.
            let none = controller.get_capacity(csi::GetCapacityRequest::default()).await.unwrap().into_inner();
            assert_eq!(none.available_capacity, 0);

            // ValidateVolumeCapabilities: confirmed while the volume exists; NOT_FOUND once deleted.
            let (id, _) = made[0].clone();
            let ctx: HashMap<String, String> = [
                ("plugin".to_string(), "seaweedfs".to_string()),
                ("filer".into(), weed.filer.clone()),
                ("path".into(), "/buckets/pvc-list-a".into()),
            ]
            .into();
            let validate = csi::ValidateVolumeCapabilitiesRequest {
                volume_id: id.clone(),
                volume_context: ctx,
                volume_capabilities: vec![multi_writer()],
                ..Default::default()
            };
            let ok = controller.validate_volume_capabilities(validate.clone()).await.unwrap().into_inner();
            assert!(ok.confirmed.is_some(), "{ok:?}");
            controller
                .delete_volume(csi::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() })
                .await
                .unwrap();
            let err = controller.validate_volume_capabilities(validate).await.unwrap_err();
            assert_eq!(err.code(), Code::NotFound, "{err:?}");
            // And it is listed no more.
            let (entries, _) = list_all(&mut controller, 0).await;
            assert!(entries.iter().all(|e| e.volume.as_ref().unwrap().volume_id != id));

            // A model volume cannot grow: "Unsupported capacity": OUT_OF_RANGE.
            let model = controller
                .create_volume(csi::CreateVolumeRequest {
                    name: "pvc-model".into(),
                    parameters: [
                        ("plugin".to_string(), "model".to_string()),
                        ("reference".into(), "registry.local/models/demo:1".into()),
                    ]
                    .into(),
                    volume_capabilities: vec![common::capability(
                        csi::volume_capability::access_mode::Mode::MultiNodeReaderOnly,
                    )],
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner()
                .volume
                .unwrap();
            let err =
                controller.controller_expand_volume(controller_expand(&model.volume_id, 2 * GIB, 0)).await.unwrap_err();
            assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
            assert!(err.message().contains("cannot be expanded"), "{err:?}");

            for (id, _) in &made[1..] {
                controller
                    .delete_volume(csi::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() })
                    .await
                    .unwrap();
            }
        },
    );
}
