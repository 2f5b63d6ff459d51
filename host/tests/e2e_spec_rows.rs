//! CSI v1.12 error-table rows that need more than the SeaweedFS node of `e2e_csi_rules` and
//! `e2e_node_rules`: through the real `mounthost host` and `mounthost csi --mode all`
//! processes, as root in a private mount namespace (docs/csi.md, "Spec rows", lists every row
//! and its test).
//!
//! - Identity and the capability RPCs answer without a condition row; Probe of a node front
//!   whose host daemon is down is "Missing required dependency 9 FAILED_PRECONDITION", and
//!   ready again once the daemon is back.
//! - CreateVolume of a range the backend cannot give (the `tmpfs` test plugin, whose volumes are
//!   tmpfs mounts of a fixed size): "Unsupported capacity_range 11 OUT_OF_RANGE", from the host
//!   (limit_bytes below the size) and from the plugin (required_bytes above it), and nothing is
//!   created; a range that holds the size gives a volume whose staged tmpfs has that size.
//!   Requests with a content source, without a name or capabilities, or with a block
//!   capability are INVALID_ARGUMENT.
//! - The general "Operation pending for volume 10 ABORTED": a second CreateVolume (or a
//!   DeleteVolume or ControllerExpandVolume) of a volume whose CreateVolume is in flight (held at a filer of the test's
//!   that answers when told), and a second NodeStageVolume, NodePublishVolume,
//!   NodeUnpublishVolume, NodeUnstageVolume or NodeExpandVolume while the volume's `weed mount` is still starting (against a filer that
//!   never answers), whose stage then ends DEADLINE_EXCEEDED leaving nothing behind.
//! - "Call not implemented 12 UNIMPLEMENTED" for every RPC mounthost does not advertise.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::time::Duration;

use common::{NodeDirs, guarded, in_private_namespace, mounts_below, pids_of, wait_ready, weed_binary};
use mounthost::proto::csi;
use mounthost::proto::csi::controller_client::ControllerClient;
use mounthost::proto::csi::identity_client::IdentityClient;
use mounthost::proto::csi::node_client::NodeClient;
use mounthost::unpriv::grpc::{UnixChannel, channel};
use tonic::Code;

const MIB: i64 = 1 << 20;

#[track_caller]
fn code<T: std::fmt::Debug>(r: Result<T, tonic::Status>, want: Code) -> String {
    match r {
        Err(s) if s.code() == want => s.message().to_string(),
        other => panic!("expected {want:?}, got {other:?}"),
    }
}

/// Identity: GetPluginInfo, GetPluginCapabilities and Probe; the Node and Controller
/// capability RPCs and NodeGetInfo. Their tables have no condition of their own ("If the plugin
/// is unable to complete the call successfully, it MUST return a non-ok gRPC code"), except
/// Probe's: "Missing required dependency 9 FAILED_PRECONDITION". The host daemon is killed (-9)
/// and started again while the front keeps running.
#[test]
fn probe_of_a_node_front_without_its_host_daemon_is_failed_precondition() {
    if !in_private_namespace("probe_of_a_node_front_without_its_host_daemon_is_failed_precondition") {
        return;
    }
    let dirs = NodeDirs::new();
    let mut host = dirs.start_host(&[]);
    let _front = dirs.start_front(&[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    guarded(&dirs, || {
        rt.block_on(async {
            let ch = channel(&dirs.csi_sock);
            wait_ready(&ch).await;
            let mut identity = IdentityClient::new(ch.clone());
            let mut node = NodeClient::new(ch.clone());
            let mut controller = ControllerClient::new(ch.clone());
            let info = identity.get_plugin_info(csi::GetPluginInfoRequest {}).await.unwrap().into_inner();
            assert_eq!(
                (info.name.as_str(), info.vendor_version.as_str()),
                ("csi.mounthost.dev", env!("CARGO_PKG_VERSION"))
            );
            let caps =
                identity.get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {}).await.unwrap().into_inner();
            use csi::plugin_capability::service::Type as Service;
            let services: Vec<i32> = caps
                .capabilities
                .iter()
                .filter_map(|c| match &c.r#type {
                    Some(csi::plugin_capability::Type::Service(s)) => Some(s.r#type),
                    _ => None,
                })
                .collect();
            assert_eq!(services, vec![Service::ControllerService as i32], "--mode all serves the controller");
            let online = caps.capabilities.iter().any(|c| {
                matches!(&c.r#type, Some(csi::plugin_capability::Type::VolumeExpansion(e))
                    if e.r#type == csi::plugin_capability::volume_expansion::Type::Online as i32)
            });
            assert!(online, "online volume expansion: {caps:?}");
            let node_caps = node_rpcs(&mut node).await;
            use csi::node_service_capability::rpc::Type as N;
            let want = [
                N::StageUnstageVolume,
                N::GetVolumeStats,
                N::VolumeCondition,
                N::SingleNodeMultiWriter,
                N::ExpandVolume,
            ];
            assert_eq!(node_caps, want.map(|t| t as i32).to_vec());
            let info = node.node_get_info(csi::NodeGetInfoRequest {}).await.unwrap().into_inner();
            assert_eq!(info.node_id, "node-1", "the host's --node-id");
            let ctrl = controller
                .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
                .await
                .unwrap()
                .into_inner();
            use csi::controller_service_capability::rpc::Type as C;
            let ctrl: Vec<i32> = ctrl
                .capabilities
                .iter()
                .filter_map(|c| match &c.r#type {
                    Some(csi::controller_service_capability::Type::Rpc(r)) => Some(r.r#type),
                    _ => None,
                })
                .collect();
            let want_ctrl = [
                C::CreateDeleteVolume,
                C::SingleNodeMultiWriter,
                C::ExpandVolume,
                C::GetCapacity,
                C::ListVolumes,
                C::ListVolumesPublishedNodes,
            ];
            assert_eq!(ctrl, want_ctrl.map(|t| t as i32).to_vec());

            // The host daemon dies: Probe says why, NodeGetInfo cannot answer, and what the
            // front answers alone still answers.
            host.kill9();
            for _ in 0..2 {
                let m = code(identity.probe(csi::ProbeRequest {}).await, Code::FailedPrecondition);
                assert!(m.contains("host daemon") && m.contains(&dirs.host_sock.display().to_string()), "{m}");
            }
            code(node.node_get_info(csi::NodeGetInfoRequest {}).await, Code::Unavailable);
            identity.get_plugin_info(csi::GetPluginInfoRequest {}).await.unwrap();
            assert_eq!(node_rpcs(&mut node).await, want.map(|t| t as i32).to_vec());

            // Back: ready again, on the same front.
            host = dirs.start_host(&[]);
            let mut ready = false;
            for _ in 0..200 {
                if let Ok(r) = identity.probe(csi::ProbeRequest {}).await {
                    ready = r.into_inner().ready == Some(true);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            assert!(ready, "Probe is ready once the host daemon answers again");
            assert_eq!(node.node_get_info(csi::NodeGetInfoRequest {}).await.unwrap().into_inner().node_id, "node-1");
        })
    });
    drop(host);
    println!(
        "checked: identity and capability RPCs answer; Probe FAILED_PRECONDITION while the host is down, ready after"
    );
}

async fn node_rpcs(node: &mut NodeClient<UnixChannel>) -> Vec<i32> {
    let caps = node.node_get_capabilities(csi::NodeGetCapabilitiesRequest {}).await.unwrap().into_inner();
    caps.capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(csi::node_service_capability::Type::Rpc(r)) => Some(r.r#type),
            _ => None,
        })
        .collect()
}

/// CreateVolume of the `tmpfs` test plugin with `sizeMiB: 8`: its volumes are 8 MiB, so
/// limit_bytes 4 MiB (the host's check) and required_bytes 16 MiB (the plugin's own) are
/// "Unsupported capacity_range 11 OUT_OF_RANGE", as is a plugin answering less than
/// required_bytes (the host's check, with the `misbehave` fixture); required and limit 8 MiB gives the volume,
/// whose stage is a tmpfs of 8 MiB (NodeGetVolumeStats). The request rows of the general
/// error scheme and "Source incompatible or not supported" are INVALID_ARGUMENT. Refused calls
/// leave no note, no state and no mount.
#[test]
fn create_volume_of_a_range_the_backend_cannot_give_is_out_of_range() {
    if !in_private_namespace("create_volume_of_a_range_the_backend_cannot_give_is_out_of_range") {
        return;
    }
    let dirs = NodeDirs::new();
    let plugins = dirs.root.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::copy(mounthost::stock::fixtures::path("tmpfs"), plugins.join("tmpfs.wasm")).unwrap();
    std::fs::copy(mounthost::stock::fixtures::path("misbehave"), plugins.join("misbehave.wasm")).unwrap();
    let args = [format!("--plugin-dir={}", plugins.display()), "--grant=tmpfs:fstype=tmpfs".to_string()];
    let _host = dirs.start_host(&args);
    let _front = dirs.start_front(&args);
    let rt = tokio::runtime::Runtime::new().unwrap();
    guarded(&dirs, || {
        rt.block_on(async {
            let ch = channel(&dirs.csi_sock);
            wait_ready(&ch).await;
            let mut controller = ControllerClient::new(ch.clone());
            let mut node = NodeClient::new(ch);
            let req = |name: &str, required: i64, limit: i64| csi::CreateVolumeRequest {
                name: name.into(),
                parameters: [("plugin".to_string(), "tmpfs".to_string()), ("sizeMiB".into(), "8".into())].into(),
                volume_capabilities: vec![common::multi_writer()],
                capacity_range: Some(csi::CapacityRange { required_bytes: required, limit_bytes: limit }),
                ..Default::default()
            };
            for (required, limit, says) in [
                (0, 4 * MIB, "would give the volume 8388608 bytes, more than capacity_range.limit_bytes 4194304"),
                (MIB, 4 * MIB, "more than capacity_range.limit_bytes"),
                (16 * MIB, 0, "more than the volume's size, 8388608 bytes"),
                (16 * MIB, 32 * MIB, "more than the volume's size"),
            ] {
                for _ in 0..2 {
                    let m = code(controller.create_volume(req("pvc-tmpfs", required, limit)).await, Code::OutOfRange);
                    assert!(m.contains(says), "{required}..{limit}: {m}");
                }
            }
            // A plugin that answers less than required_bytes (the misbehave fixture's `short`
            // mode: half of it) is refused by the host itself, with nothing created.
            let short = csi::CreateVolumeRequest {
                name: "pvc-short".into(),
                parameters: [("plugin".to_string(), "misbehave".to_string()), ("mode".into(), "short".into())].into(),
                volume_capabilities: vec![common::multi_writer()],
                capacity_range: Some(csi::CapacityRange { required_bytes: 2 * MIB, limit_bytes: 0 }),
                ..Default::default()
            };
            let m = code(controller.create_volume(short).await, Code::OutOfRange);
            assert!(m.contains("1048576 bytes, less than capacity_range.required_bytes 2097152"), "{m}");

            // The request's own rows: missing or unsupported fields.
            let mut sourced = req("pvc-tmpfs", 0, 0);
            sourced.volume_content_source = Some(csi::VolumeContentSource {
                r#type: Some(csi::volume_content_source::Type::Volume(csi::volume_content_source::VolumeSource {
                    volume_id: "tmpfs~pvc-other".into(),
                })),
            });
            let m = code(controller.create_volume(sourced).await, Code::InvalidArgument);
            assert!(m.contains("volume_content_source"), "{m}");
            let m = code(controller.create_volume(req("", 0, 0)).await, Code::InvalidArgument);
            assert!(m.contains("name"), "{m}");
            let m = code(
                controller
                    .create_volume(csi::CreateVolumeRequest { volume_capabilities: vec![], ..req("pvc-tmpfs", 0, 0) })
                    .await,
                Code::InvalidArgument,
            );
            assert!(m.contains("volume_capabilities is required"), "{m}");
            let block = csi::VolumeCapability {
                access_mode: common::multi_writer().access_mode,
                access_type: Some(csi::volume_capability::AccessType::Block(Default::default())),
            };
            let m = code(
                controller
                    .create_volume(csi::CreateVolumeRequest {
                        volume_capabilities: vec![common::multi_writer(), block],
                        ..req("pvc-tmpfs", 0, 0)
                    })
                    .await,
                Code::InvalidArgument,
            );
            assert!(m.contains("block access is not supported"), "{m}");

            // A range that holds 8 MiB: the volume, and its stage is a real tmpfs of that size.
            for (required, limit) in [(8 * MIB, 8 * MIB), (0, 8 * MIB), (MIB, 0), (0, 0)] {
                let vol = controller.create_volume(req("pvc-tmpfs", required, limit)).await.unwrap();
                let vol = vol.into_inner().volume.unwrap();
                assert_eq!((vol.volume_id.as_str(), vol.capacity_bytes), ("tmpfs~pvc-tmpfs", 8 * MIB));
            }
            let staging = dirs.staging("pvc-tmpfs");
            let ctx = [("plugin".to_string(), "tmpfs".to_string()), ("sizeMiB".into(), "8".into())].into();
            node.node_stage_volume(common::stage_req("tmpfs~pvc-tmpfs", &staging, &ctx)).await.unwrap();
            let stats = node
                .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                    volume_id: "tmpfs~pvc-tmpfs".into(),
                    volume_path: staging.display().to_string(),
                    staging_target_path: staging.display().to_string(),
                })
                .await
                .unwrap()
                .into_inner();
            let bytes = stats.usage.iter().find(|u| u.unit == csi::volume_usage::Unit::Bytes as i32).unwrap();
            assert_eq!(bytes.total, 8 * MIB, "the staged tmpfs has the size CreateVolume reported");
            node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: "tmpfs~pvc-tmpfs".into(),
                staging_target_path: staging.display().to_string(),
            })
            .await
            .unwrap();
            controller
                .delete_volume(csi::DeleteVolumeRequest {
                    volume_id: "tmpfs~pvc-tmpfs".into(),
                    secrets: Default::default(),
                })
                .await
                .unwrap();
            assert!(common::mounts_below(dirs.root.path()).is_empty());
        })
    });
    println!(
        "checked: 4 ranges OUT_OF_RANGE twice, a short answer OUT_OF_RANGE, 4 bad requests INVALID_ARGUMENT, 4 ranges \
         holding 8 MiB answered, staged at 8 MiB"
    );
}

/// A filer of the test's own: it answers every request with an empty body, GET with 404 (no
/// capacity record yet), a HEAD of a capacity record with `head` once told to (at once when
/// started released), any other HEAD with 200, PUT and POST with 201; it reports each request
/// as `<METHOD> <path>` when it arrives.
struct HeldFiler {
    addr: String,
    seen: mpsc::Receiver<String>,
    release: Arc<(Mutex<bool>, Condvar)>,
}

impl HeldFiler {
    fn start() -> HeldFiler {
        Self::answering("404 Not Found", false)
    }

    fn answering(head: &'static str, released: bool) -> HeldFiler {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (tx, seen) = mpsc::channel();
        let release = Arc::new((Mutex::new(released), Condvar::new()));
        let held = release.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (tx, held) = (tx.clone(), held.clone());
                std::thread::spawn(move || Self::answer(conn, &tx, &held, head));
            }
        });
        HeldFiler { addr, seen, release }
    }

    fn answer(conn: TcpStream, tx: &mpsc::Sender<String>, held: &(Mutex<bool>, Condvar), head: &str) {
        let mut reader = BufReader::new(conn.try_clone().unwrap());
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
                break;
            }
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        let _ = reader.read_exact(&mut body);
        let mut words = line.split_whitespace();
        let (method, path) = (words.next().unwrap_or("").to_string(), words.next().unwrap_or("").to_string());
        let _ = tx.send(format!("{method} {path}"));
        let status = match method.as_str() {
            "GET" => "404 Not Found",
            // Only the capacity record's HEAD is held; a directory is there.
            "HEAD" if !path.starts_with("/.mounthost/") => "200 OK",
            "HEAD" => {
                let (lock, cv) = held;
                let _released = cv.wait_while(lock.lock().unwrap(), |released| !*released).unwrap();
                head
            }
            _ => "201 Created",
        };
        let _ = (&conn)
            .write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes());
    }

    /// Wait for a request starting with `prefix`, returning every request seen until then.
    fn wait_for(&self, prefix: &str) -> Vec<String> {
        let mut got = Vec::new();
        loop {
            let r = self.seen.recv_timeout(Duration::from_secs(20)).unwrap_or_else(|_| panic!("no {prefix}: {got:?}"));
            got.push(r.clone());
            if r.starts_with(prefix) {
                return got;
            }
        }
    }

    fn release(&self) {
        let (lock, cv) = &*self.release;
        *lock.lock().unwrap() = true;
        cv.notify_all();
    }
}

/// A TCP port that accepts connections and never answers, and port + 10000 likewise (the gRPC
/// port `weed mount` derives from a filer's): `weed mount` against it waits without mounting.
fn silent_filer() -> (String, Vec<TcpListener>) {
    for _ in 0..50 {
        let http = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = http.local_addr().unwrap().port();
        let Some(grpc) = port.checked_add(10000).and_then(|p| TcpListener::bind(("127.0.0.1", p)).ok()) else {
            continue;
        };
        let held: Vec<TcpListener> = vec![http, grpc];
        for l in &held {
            let l = l.try_clone().unwrap();
            std::thread::spawn(move || {
                let mut open = Vec::new();
                for conn in l.incoming().flatten() {
                    open.push(conn);
                }
            });
        }
        return (format!("127.0.0.1:{port}"), held);
    }
    panic!("no free port pair for a silent filer");
}

/// "Operation pending for volume 10 ABORTED" through the real front, on the controller (a
/// CreateVolume held at its filer's HEAD: a second CreateVolume of the name, a DeleteVolume and
/// a ControllerExpandVolume of its id are ABORTED, write nothing, and the first completes once
/// the filer answers) and on the node (a static volume's stage waiting for a `weed mount` that
/// cannot mount: a second stage, a publish, an unpublish, an unstage and a NodeExpandVolume are
/// ABORTED; the
/// stage ends with "FUSE program did not mount within its ready timeout",
/// DEADLINE_EXCEEDED, and leaves no process, mount or state behind).
/// RPCs mounthost does not advertise are UNIMPLEMENTED.
#[test]
fn a_call_on_a_volume_with_another_in_flight_is_aborted() {
    if !in_private_namespace("a_call_on_a_volume_with_another_in_flight_is_aborted") {
        return;
    }
    let dirs = NodeDirs::new();
    let program = format!("--program=weed={}", weed_binary().display());
    let _host = dirs.start_host(std::slice::from_ref(&program));
    let _front = dirs.start_front(std::slice::from_ref(&program));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let filer = HeldFiler::start();
    let (silent, _held) = silent_filer();
    guarded(&dirs, || {
        rt.block_on(async {
            let ch = channel(&dirs.csi_sock);
            wait_ready(&ch).await;
            let mut controller = ControllerClient::new(ch.clone());
            let mut node = NodeClient::new(ch.clone());

            // The controller: CreateVolume in flight, held at the filer.
            let create = csi::CreateVolumeRequest {
                name: "pvc-busy".into(),
                parameters: [("plugin".to_string(), "seaweedfs".to_string()), ("filer".into(), filer.addr.clone())]
                    .into(),
                volume_capabilities: vec![common::multi_writer()],
                capacity_range: Some(csi::CapacityRange { required_bytes: 1 << 30, limit_bytes: 0 }),
                ..Default::default()
            };
            let first = tokio::spawn({
                let (mut c, req) = (controller.clone(), create.clone());
                async move { c.create_volume(req).await }
            });
            let before = tokio::task::block_in_place(|| filer.wait_for("HEAD"));
            assert_eq!(
                before,
                ["GET /.mounthost/capacity/buckets/pvc-busy", "HEAD /.mounthost/capacity/buckets/pvc-busy"]
            );
            let m = code(controller.create_volume(create.clone()).await, Code::Aborted);
            assert!(m.contains("pvc-busy"), "{m}");
            let id = format!("seaweedfs~{}/buckets/pvc-busy", filer.addr);
            let delete = csi::DeleteVolumeRequest { volume_id: id.clone(), secrets: HashMap::new() };
            code(controller.delete_volume(delete.clone()).await, Code::Aborted);
            let expand = csi::ControllerExpandVolumeRequest {
                volume_id: id.clone(),
                capacity_range: Some(csi::CapacityRange { required_bytes: 2 << 30, limit_bytes: 0 }),
                ..Default::default()
            };
            code(controller.controller_expand_volume(expand).await, Code::Aborted);
            filer.release();
            let vol = first.await.unwrap().expect("the first CreateVolume completes").into_inner().volume.unwrap();
            assert_eq!((vol.volume_id.as_str(), vol.capacity_bytes), (id.as_str(), 1 << 30));
            let mut rest = Vec::new();
            while let Ok(r) = filer.seen.recv_timeout(Duration::from_millis(200)) {
                rest.push(r);
            }
            // The refused CreateVolume read the record (planning) and wrote nothing.
            let writes: Vec<&String> = rest.iter().filter(|r| r.starts_with("PUT") || r.starts_with("POST")).collect();
            assert_eq!(writes.len(), 3, "the first call's record, directory and list entry only: {rest:?}");

            // The node: a static volume whose `weed mount` never mounts.
            let ctx: HashMap<String, String> = [
                ("plugin", "seaweedfs"),
                ("filer", silent.as_str()),
                ("path", "/buckets/busy-static"),
                ("readyTimeoutSec", "6"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into();
            let sid = "seaweedfs~busy-static";
            let staging = dirs.staging("busy-static");
            let target = dirs.target("pod-busy", "busy-static");
            let stage = common::stage_req(sid, &staging, &ctx);
            let t0 = std::time::Instant::now();
            let first = tokio::spawn({
                let (mut n, req) = (node.clone(), stage.clone());
                async move { n.node_stage_volume(req).await }
            });
            let needle = staging.display().to_string();
            while pids_of("weed", &needle).is_empty() {
                assert!(t0.elapsed() < Duration::from_secs(5), "weed mount never started");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            code(node.node_stage_volume(stage.clone()).await, Code::Aborted);
            code(
                node.node_publish_volume(common::publish_req(sid, &staging, &target, false, &ctx)).await,
                Code::Aborted,
            );
            let unstage = csi::NodeUnstageVolumeRequest {
                volume_id: sid.into(),
                staging_target_path: staging.display().to_string(),
            };
            code(node.node_unstage_volume(unstage.clone()).await, Code::Aborted);
            let unpublish =
                csi::NodeUnpublishVolumeRequest { volume_id: sid.into(), target_path: target.display().to_string() };
            code(node.node_unpublish_volume(unpublish).await, Code::Aborted);
            // NodeExpandVolume of the volume meanwhile: the same row.
            let grow = csi::NodeExpandVolumeRequest {
                volume_id: sid.into(),
                volume_path: staging.display().to_string(),
                staging_target_path: staging.display().to_string(),
                capacity_range: Some(csi::CapacityRange { required_bytes: 2 << 30, limit_bytes: 0 }),
                volume_capability: Some(common::multi_writer()),
                ..Default::default()
            };
            code(node.node_expand_volume(grow).await, Code::Aborted);
            let m = code(first.await.unwrap(), Code::DeadlineExceeded);
            assert!(t0.elapsed() >= Duration::from_secs(5), "the stage waited its ready timeout: {m}");
            assert!(pids_of("weed", &needle).is_empty(), "the weed mount that did not mount was stopped");
            assert!(mounts_below(dirs.root.path()).is_empty());
            assert!(!target.exists(), "the refused publish made no target");
            node.node_unstage_volume(unstage).await.expect("nothing is staged: OK");

            // Every RPC mounthost does not advertise.
            let unimplemented = [
                controller.controller_publish_volume(csi::ControllerPublishVolumeRequest::default()).await.err(),
                controller.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest::default()).await.err(),
                controller.create_snapshot(csi::CreateSnapshotRequest::default()).await.err(),
                controller.delete_snapshot(csi::DeleteSnapshotRequest::default()).await.err(),
                controller.list_snapshots(csi::ListSnapshotsRequest::default()).await.err(),
                controller.get_snapshot(csi::GetSnapshotRequest::default()).await.err(),
                controller.controller_get_volume(csi::ControllerGetVolumeRequest::default()).await.err(),
                controller.controller_modify_volume(csi::ControllerModifyVolumeRequest::default()).await.err(),
            ];
            for e in &unimplemented {
                assert_eq!(e.as_ref().map(tonic::Status::code), Some(Code::Unimplemented), "{e:?}");
            }
            println!(
                "checked: 3 controller calls and 5 node calls ABORTED while one was in flight, the stage \
                 DEADLINE_EXCEEDED after {:?}, {} RPCs UNIMPLEMENTED",
                t0.elapsed(),
                unimplemented.len()
            );
        })
    });
}

/// The general rows "Not authenticated 16 UNAUTHENTICATED" and "Permission denied 7
/// PERMISSION_DENIED": a backend that answers a step of CreateVolume's plan 401 or 403 (the
/// call's secrets are not valid there, or their identity may not do it), and nothing after that
/// step runs.
#[test]
fn a_backend_refusing_the_calls_credentials_is_unauthenticated_or_permission_denied() {
    if !in_private_namespace("a_backend_refusing_the_calls_credentials_is_unauthenticated_or_permission_denied") {
        return;
    }
    let dirs = NodeDirs::new();
    let _host = dirs.start_host(&[]);
    let _front = dirs.start_front(&[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    guarded(&dirs, || {
        rt.block_on(async {
            let ch = channel(&dirs.csi_sock);
            wait_ready(&ch).await;
            let mut controller = ControllerClient::new(ch);
            for (status, want) in
                [("401 Unauthorized", Code::Unauthenticated), ("403 Forbidden", Code::PermissionDenied)]
            {
                let filer = HeldFiler::answering(status, true);
                let create = csi::CreateVolumeRequest {
                    name: "pvc-refused".into(),
                    parameters: [("plugin".to_string(), "seaweedfs".to_string()), ("filer".into(), filer.addr.clone())]
                        .into(),
                    volume_capabilities: vec![common::multi_writer()],
                    capacity_range: Some(csi::CapacityRange { required_bytes: 1 << 30, limit_bytes: 0 }),
                    ..Default::default()
                };
                let m = code(controller.create_volume(create).await, want);
                assert!(m.contains(&status[..3]), "{m}");
                let mut seen = Vec::new();
                while let Ok(r) = filer.seen.recv_timeout(Duration::from_millis(200)) {
                    seen.push(r);
                }
                assert_eq!(
                    seen,
                    ["GET /.mounthost/capacity/buckets/pvc-refused", "HEAD /.mounthost/capacity/buckets/pvc-refused"],
                    "nothing after the refused step"
                );
            }
            println!("checked: a step answered 401 UNAUTHENTICATED, 403 PERMISSION_DENIED, nothing after it");
        })
    });
}
