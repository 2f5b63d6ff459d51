//! CSI v1.12 rules of the controller and the seaweedfs plugin, end to end: as root, in a private
//! mount namespace, through the real `mounthost host` and `mounthost csi --mode all` processes,
//! against a real SeaweedFS started here (one per test: tests 4 and 5 need a filer that has no
//! `/buckets` yet, and the others check the whole filer did not change).
//!
//! 1. CreateVolume of names SeaweedFS would refuse (mixed case, 128 bytes) gives valid directories.
//! 2. CreateVolume of an existing name with another capacity is ALREADY_EXISTS and changes nothing.
//! 3. DeleteVolume of ids this driver does not know is OK and deletes nothing.
//! 4. A static volume under `/buckets` whose bucket name SeaweedFS refuses is INVALID_ARGUMENT
//!    before anything runs.
//! 5. When `weed mount` exits before mounting, the error quotes its cause, not its usage text.
//! 6. ValidateVolumeCapabilities confirms only what was checked: the host's own keys included.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{
    NodeDirs, Seaweed, in_private_namespace, mounts_below, multi_writer, pids_of, stage_req, weed_binary,
    with_seaweed_node,
};
use mounthost::proto::csi;
use mounthost::proto::csi::controller_client::ControllerClient;
use mounthost::proto::csi::node_client::NodeClient;
use mounthost::unpriv::grpc::UnixChannel;
use tonic::Code;

const GIB: i64 = 1 << 30;

fn create_req(weed: &Seaweed, name: &str, bytes: i64) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.into(),
        parameters: [("plugin".to_string(), "seaweedfs".to_string()), ("filer".into(), weed.filer.clone())].into(),
        volume_capabilities: vec![multi_writer()],
        capacity_range: Some(csi::CapacityRange { required_bytes: bytes, limit_bytes: 0 }),
        ..Default::default()
    }
}

fn unstage_req(id: &str, staging: &Path) -> csi::NodeUnstageVolumeRequest {
    csi::NodeUnstageVolumeRequest { volume_id: id.into(), staging_target_path: staging.display().to_string() }
}

fn delete_req(id: &str) -> csi::DeleteVolumeRequest {
    csi::DeleteVolumeRequest { volume_id: id.into(), secrets: HashMap::new() }
}

/// The volume's directory in the filer, from its context.
fn dir_of(vol: &csi::Volume) -> String {
    vol.volume_context["path"].clone()
}

/// The capacity record of the volume at `dir`.
fn record_of(dir: &str) -> String {
    format!("/.mounthost/capacity{dir}")
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

/// `weed mount` processes of this test's node.
fn weed_mounts(dirs: &NodeDirs) -> Vec<i32> {
    pids_of("weed", &dirs.root.path().display().to_string())
}

/// The clients of one node: SeaweedFS, `mounthost host` and `mounthost csi --mode all` running.
struct Node<'a> {
    weed: &'a Seaweed,
    dirs: &'a NodeDirs,
    node: NodeClient<UnixChannel>,
    controller: ControllerClient<UnixChannel>,
}

/// Start SeaweedFS, the host and the front (real processes), wait until the front is ready, and
/// run `body`; on a panic everything of the node is killed and the daemons' logs are printed.
fn with_node(body: impl AsyncFnOnce(&mut Node<'_>)) {
    with_seaweed_node(async |weed, dirs, (node, controller)| body(&mut Node { weed, dirs, node, controller }).await);
}

impl Node<'_> {
    async fn create(&mut self, name: &str, bytes: i64) -> Result<csi::Volume, tonic::Status> {
        self.controller.create_volume(create_req(self.weed, name, bytes)).await.map(|r| r.into_inner().volume.unwrap())
    }

    async fn delete(&mut self, id: &str) -> Result<(), tonic::Status> {
        self.controller.delete_volume(delete_req(id)).await.map(|_| ())
    }

    /// Stage, publish into one pod, write a file there and read it back through the filer's
    /// HTTP API; then unpublish, unstage, and check nothing of the node is left.
    async fn use_volume(&mut self, vol: &csi::Volume, pv: &str) {
        let (id, ctx) = (&vol.volume_id, &vol.volume_context);
        let staging = self.dirs.staging(pv);
        let target = self.dirs.target("pod-1", pv);
        self.node.node_stage_volume(stage_req(id, &staging, ctx)).await.unwrap();
        self.node.node_stage_volume(stage_req(id, &staging, ctx)).await.expect("stage repeated: same answer");
        assert_eq!(pids_of("weed", &staging.display().to_string()).len(), 1, "one weed mount for the volume");
        let publish = csi::NodePublishVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(multi_writer()),
            volume_context: ctx.clone(),
            ..Default::default()
        };
        self.node.node_publish_volume(publish.clone()).await.unwrap();
        self.node.node_publish_volume(publish).await.expect("publish repeated: same answer");
        std::fs::write(target.join("hello.txt"), format!("written into {pv}\n")).unwrap();
        let through_filer = self.weed.file(&format!("{}/hello.txt", dir_of(vol)));
        assert_eq!(
            through_filer.as_deref(),
            Some(format!("written into {pv}\n").as_str()),
            "visible through the filer"
        );

        let unpublish =
            csi::NodeUnpublishVolumeRequest { volume_id: id.clone(), target_path: target.display().to_string() };
        self.node.node_unpublish_volume(unpublish).await.unwrap();
        self.node.node_unstage_volume(unstage_req(id, &staging)).await.unwrap();
        self.assert_node_is_clean();
    }

    /// No `weed mount`, no mount, no state file of any volume on the node.
    fn assert_node_is_clean(&self) {
        assert!(weed_mounts(self.dirs).is_empty(), "weed mount processes left: {:?}", weed_mounts(self.dirs));
        let mounts = mounts_below(self.dirs.root.path());
        assert!(mounts.is_empty(), "mounts left: {mounts:?}");
        let states = entries(&self.dirs.state.join("volumes"));
        assert!(states.is_empty(), "state files left: {states:?}");
    }
}

/// A directory name SeaweedFS takes as an S3 bucket (4.48's rule, written out again here).
fn is_valid_bucket(name: &str) -> bool {
    (3..=63).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
        && !name.contains("..")
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && !name.starts_with("xn--")
        && !name.ends_with("-s3alias")
        && name.parse::<std::net::IpAddr>().is_err()
}

/// 1. A mixed-case name and a 128-byte name, on a filer that has no `/buckets` yet (where
///    SeaweedFS 4.48 answers a mixed-case bucket with 500): each gets a valid directory under
///    `/buckets`, the same id twice, mounts, takes a write visible through the filer, and is
///    gone from the filer after DeleteVolume.
#[test]
fn create_volume_accepts_any_name_the_co_may_send() {
    if !in_private_namespace("create_volume_accepts_any_name_the_co_may_send") {
        return;
    }
    with_node(async |n| {
        assert!(n.weed.listing("/buckets").is_empty(), "a fresh filer: no /buckets yet");
        let long = format!("PVC-Nightly-Build-{}", "Ab9".repeat(40));
        let long = &long[..128];
        assert_eq!(long.len(), 128);
        let mut checked = Vec::new();
        for (pv, prefix) in [("PVC-Team-A-Data", "pvc-team-a-data-"), (long, "pvc-nightly-build-ab9ab-")] {
            let vol = n.create(pv, GIB).await.unwrap_or_else(|e| panic!("CreateVolume {pv:?}: {e:?}"));
            let again = n.create(pv, GIB).await.unwrap();
            assert_eq!(vol, again, "CreateVolume {pv:?} is idempotent");
            let dir = dir_of(&vol);
            let leaf = dir.strip_prefix("/buckets/").unwrap();
            assert!(is_valid_bucket(leaf) && leaf.starts_with(prefix) && leaf.len() <= 40, "{pv:?} -> {leaf:?}");
            assert_eq!(vol.volume_id, format!("seaweedfs~{}{dir}", n.weed.filer));
            assert!(vol.volume_id.len() <= 128, "{}", vol.volume_id);
            assert_eq!(vol.volume_context["collection"], leaf, "the collection is the directory name");
            assert_eq!(vol.capacity_bytes, GIB);
            assert!(n.weed.dir_exists(&dir), "{dir} exists in the filer");
            assert!(n.weed.file(&record_of(&dir)).is_some(), "its capacity record exists");
            n.use_volume(&vol, pv).await;

            n.delete(&vol.volume_id).await.unwrap();
            n.delete(&vol.volume_id).await.expect("delete of a gone volume: OK");
            assert!(!n.weed.dir_exists(&dir), "{dir} is gone from the filer");
            assert_eq!(n.weed.file(&record_of(&dir)), None, "its capacity record is gone");
            checked.push(leaf.to_string());
        }
        assert!(n.weed.listing("/buckets").is_empty(), "nothing left under /buckets");
        println!(
            "checked: directories {checked:?}, each created twice, mounted, written, read through the filer, deleted"
        );
    });
}

/// 2. CreateVolume of an existing name: the same capacity is OK, another is ALREADY_EXISTS and
///    changes nothing in the filer; after DeleteVolume the name takes the new capacity.
#[test]
fn create_volume_with_another_capacity_is_already_exists() {
    if !in_private_namespace("create_volume_with_another_capacity_is_already_exists") {
        return;
    }
    with_node(async |n| {
        let pv = "pvc-3c1e2f4a-0b6d-4e8f-9a1b-2c3d4e5f6a7b";
        let vol = n.create(pv, GIB).await.unwrap();
        assert_eq!(n.create(pv, GIB).await.unwrap(), vol, "same capacity twice: the same volume");
        let dir = dir_of(&vol);
        assert_eq!(dir, format!("/buckets/{pv}"), "a pvc-<uuid> name keeps its directory");
        let record = record_of(&dir);
        assert_eq!(n.weed.file(&record).as_deref(), Some("{\"capacityBytes\":1073741824}\n"));
        // Data in the volume, written through the filer.
        assert_eq!(common::filer_put(&n.weed.filer, &format!("{dir}/data.txt"), "kept").unwrap(), 201);

        let before = (n.weed.listing("/buckets"), n.weed.listing(&dir), n.weed.listing("/.mounthost/capacity/buckets"));
        for bytes in [2 * GIB, GIB / 2, GIB + 1] {
            let e = n.create(pv, bytes).await.unwrap_err();
            assert_eq!(e.code(), Code::AlreadyExists, "{bytes} bytes: {e:?}");
            assert!(e.message().contains(pv) && e.message().contains("412"), "{}", e.message());
        }
        let after = (n.weed.listing("/buckets"), n.weed.listing(&dir), n.weed.listing("/.mounthost/capacity/buckets"));
        assert_eq!(before, after, "a refused CreateVolume changed nothing in the filer");
        assert_eq!(n.weed.file(&record).as_deref(), Some("{\"capacityBytes\":1073741824}\n"));
        assert_eq!(n.weed.file(&format!("{dir}/data.txt")).as_deref(), Some("kept"));
        assert_eq!(n.create(pv, GIB).await.unwrap(), vol, "the original capacity still answers OK");
        let sizeless = n.create(pv, 0).await.expect("no capacity asked for: compatible with any");
        assert_eq!((sizeless.volume_id.as_str(), sizeless.capacity_bytes), (vol.volume_id.as_str(), 0));
        assert_eq!(n.weed.file(&record).as_deref(), Some("{\"capacityBytes\":1073741824}\n"), "and not recorded");

        n.delete(&vol.volume_id).await.unwrap();
        assert!(!n.weed.dir_exists(&dir));
        assert_eq!(n.weed.file(&record), None, "DeleteVolume removes the record");
        let bigger = n.create(pv, 2 * GIB).await.unwrap();
        assert_eq!((bigger.volume_id.as_str(), bigger.capacity_bytes), (vol.volume_id.as_str(), 2 * GIB));
        assert_eq!(n.weed.file(&record).as_deref(), Some("{\"capacityBytes\":2147483648}\n"));
        assert_eq!(n.weed.file(&format!("{dir}/data.txt")), None, "a new, empty volume");
        assert_eq!(n.create(pv, GIB).await.unwrap_err().code(), Code::AlreadyExists, "now 1 GiB is the other capacity");
        n.delete(&bigger.volume_id).await.unwrap();
        assert!(n.weed.listing("/buckets").is_empty() && n.weed.listing("/.mounthost/capacity/buckets").is_empty());
        println!(
            "checked: same capacity OK twice, 3 other capacities ALREADY_EXISTS with the filer unchanged, \
             no capacity OK, re-created at 2 GiB after delete"
        );
    });
}

/// 3. DeleteVolume of ids this driver never made, or that its plugin does not know, is OK and
///    deletes nothing; an id naming a plugin that is not loaded is FAILED_PRECONDITION.
#[test]
fn delete_volume_of_an_id_this_driver_does_not_know_is_ok() {
    if !in_private_namespace("delete_volume_of_an_id_this_driver_does_not_know_is_ok") {
        return;
    }
    with_node(async |n| {
        let pv = "pvc-7d8e9f0a-1b2c-4d3e-8f4a-5b6c7d8e9f0a";
        let vol = n.create(pv, GIB).await.unwrap();
        let dir = dir_of(&vol);
        assert_eq!(common::filer_put(&n.weed.filer, &format!("{dir}/data.txt"), "kept").unwrap(), 201);
        let whole = |w: &Seaweed| (w.listing("/buckets"), w.listing(&dir), w.listing("/.mounthost/capacity/buckets"));
        let before = whole(n.weed);

        let unknown = [
            "pvc-1234".to_string(),                            // no `~`: not a mounthost id
            "vol-9f8e7d6c-5b4a".to_string(),                   // another driver's handle
            "~x".to_string(),                                  // empty plugin part
            format!("Seaweedfs~{}{dir}", n.weed.filer),        // not a plugin name
            "seaweedfs~garbage".to_string(),                   // the plugin says: not mine
            format!("seaweedfs~{}/", n.weed.filer),            // the plugin never makes `/`
            format!("seaweedfs~{}/buckets/a b", n.weed.filer), // nor names with spaces
            format!("seaweedfs~{}", "x".repeat(110)),          // nor ids over 100 bytes
        ];
        for id in &unknown {
            n.delete(id).await.unwrap_or_else(|e| panic!("DeleteVolume {id:?}: {e:?}"));
            n.delete(id).await.unwrap_or_else(|e| panic!("DeleteVolume {id:?} again: {e:?}"));
        }
        let missing = format!("nosuchplugin~{}{dir}", n.weed.filer);
        let e = n.delete(&missing).await.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains("nosuchplugin") && e.message().contains("cannot be loaded"), "{}", e.message());
        assert_eq!(n.delete("").await.unwrap_err().code(), Code::InvalidArgument, "volume_id is required");
        let e = n.delete(&"x".repeat(200)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "over 128 bytes is a malformed field: {e:?}");

        assert_eq!(whole(n.weed), before, "nothing in the filer changed");
        assert_eq!(n.weed.file(&format!("{dir}/data.txt")).as_deref(), Some("kept"));
        let front_log = std::fs::read_to_string(n.dirs.root.path().join("front.log")).unwrap();
        assert!(front_log.contains("mounthost never makes"), "the front logs ids that are not its own");
        assert!(front_log.contains("does not know this volume id"), "and ids its plugin does not know");

        n.delete(&vol.volume_id).await.unwrap();
        assert!(!n.weed.dir_exists(&dir));
        println!(
            "checked: {} unknown ids deleted twice with OK and the filer unchanged, a missing plugin refused",
            unknown.len()
        );
    });
}

/// 4. Static volumes under `/buckets` whose bucket SeaweedFS refuses: NodeStageVolume is
///    INVALID_ARGUMENT naming the rule, ValidateVolumeCapabilities does not confirm, and
///    nothing runs: no `weed mount`, no mount, no state, nothing in the filer. A valid bucket
///    name next to them mounts.
#[test]
fn a_static_volume_under_buckets_with_a_refused_name_is_invalid_argument() {
    if !in_private_namespace("a_static_volume_under_buckets_with_a_refused_name_is_invalid_argument") {
        return;
    }
    with_node(async |n| {
        let ctx = |path: &str| -> HashMap<String, String> {
            [("plugin", "seaweedfs"), ("filer", n.weed.filer.as_str()), ("path", path)]
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .into()
        };
        let refused = [
            ("/buckets/v1", "bucket name must between [3, 63] characters"),
            ("/buckets/Datasets/imagenet", "can only contain lower case characters"),
            ("/buckets/my_data", "can only contain lower case characters"),
            ("/buckets/10.0.0.1", "cannot be ip addresses"),
        ];
        for (i, (path, rule)) in refused.iter().enumerate() {
            let pv = format!("static-{i}");
            let id = format!("seaweedfs~{pv}");
            let staging = n.dirs.staging(&pv);
            for _ in 0..2 {
                let e = n.node.node_stage_volume(stage_req(&id, &staging, &ctx(path))).await.unwrap_err();
                assert_eq!(e.code(), Code::InvalidArgument, "{path}: {e:?}");
                assert!(e.message().contains("\"path\"") && e.message().contains(rule), "{path}: {}", e.message());
            }
            let v = n
                .controller
                .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
                    volume_id: id.clone(),
                    volume_context: ctx(path),
                    volume_capabilities: vec![multi_writer()],
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            assert!(v.confirmed.is_none() && v.message.contains(rule), "{path}: {v:?}");
            n.assert_node_is_clean();
            assert!(entries(&staging).is_empty(), "nothing in the staging directory");
        }
        assert!(n.weed.listing("/buckets").is_empty(), "nothing was created in the filer");
        assert!(!n.weed.dir_exists("/buckets/v1"));

        // The same request with a bucket name SeaweedFS takes mounts (and creates it).
        let vol = csi::Volume {
            volume_id: "seaweedfs~static-ok".into(),
            volume_context: ctx("/buckets/datasets-v1"),
            ..Default::default()
        };
        n.use_volume(&vol, "static-ok").await;
        assert!(n.weed.dir_exists("/buckets/datasets-v1"));
        println!(
            "checked: {} refused static paths, 0 weed mount processes, 0 mounts, 0 state files; a valid one mounted",
            refused.len()
        );
    });
}

/// 5. `weed mount` of `/buckets/v1` on a filer without `/buckets` exits with its cause a few lines
///    above ~150 lines of usage text. Run by hand (output to a file, as the host does), the
///    summary of its log holds the cause; staged through the host (a volume an earlier version
///    provisioned with such a name, which the plugin lets through), the CSI error holds it too.
#[test]
fn a_weed_mount_failure_shows_its_cause() {
    if !in_private_namespace("a_weed_mount_failure_shows_its_cause") {
        return;
    }
    with_node(async |n| {
        let work = n.dirs.root.path().join("by-hand");
        let (mnt, cache, log) = (work.join("mnt"), work.join("cache"), work.join("weed.log"));
        std::fs::create_dir_all(&mnt).unwrap();
        std::fs::create_dir_all(&cache).unwrap();
        let out = std::fs::File::create(&log).unwrap();
        let mut child = std::process::Command::new(weed_binary())
            .arg("-logtostderr")
            .arg("mount")
            .arg(format!("-filer={}", n.weed.filer))
            .arg("-filer.path=/buckets/v1")
            .arg(format!("-dir={}", mnt.display()))
            .arg(format!("-cacheDir={}", cache.display()))
            // Otherwise it leaves /tmp/seaweedfs-mount-<hash>.sock behind.
            .arg(format!("-localSocket={}", work.join("weed.sock").display()))
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        let until = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > until {
                let _ = child.kill();
                panic!("weed mount of /buckets/v1 did not exit within 30 s; mounts: {:?}", mounts_below(&work));
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(!status.success(), "weed mount failed: {status}");
        let text = std::fs::read_to_string(&log).unwrap();
        let cause = "invalid bucket name v1: bucket name must between [3, 63] characters";
        assert!(text.contains(cause), "weed's log holds the cause: {text}");
        let last8: Vec<&str> = text.lines().rev().take(8).collect();
        assert!(!last8.iter().any(|l| l.contains("invalid bucket name")), "its last lines do not: {last8:?}");
        let summary = mounthost::exec::fuse_log::summary(&text);
        assert!(summary.contains(cause), "{summary}");
        assert!(!summary.contains("allowOthers"), "no usage text: {summary}");
        assert!(summary.len() <= 2100, "bounded: {} bytes", summary.len());
        assert_eq!(
            mounthost::exec::fuse_log::tail_of(&std::fs::File::open(&log).unwrap()),
            summary,
            "the host reads the same"
        );
        println!("checked: {} log lines summarised to {} bytes: {summary}", text.lines().count(), summary.len());

        // Through the host: the id says the plugin provisioned /buckets/v2 (so the plugin lets
        // it through); the filer still has no /buckets, so weed exits the same way.
        let id = format!("seaweedfs~{}/buckets/v2", n.weed.filer);
        let ctx: HashMap<String, String> =
            [("plugin", "seaweedfs"), ("filer", n.weed.filer.as_str()), ("path", "/buckets/v2")]
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .into();
        let staging: PathBuf = n.dirs.staging("pv-v2");
        let e = n.node.node_stage_volume(stage_req(&id, &staging, &ctx)).await.unwrap_err();
        assert_eq!(e.code(), Code::Unavailable, "{e:?}");
        assert!(e.message().contains("exited before mounting"), "{}", e.message());
        assert!(
            e.message().contains("invalid bucket name v2: bucket name must between [3, 63] characters"),
            "the CSI error holds the cause: {}",
            e.message()
        );
        assert!(!e.message().contains("allowOthers"), "and no usage text: {}", e.message());
        n.node.node_unstage_volume(unstage_req(&id, &staging)).await.unwrap();
        n.assert_node_is_clean();
        println!("checked: NodeStageVolume answered UNAVAILABLE: {}", e.message());
    });
}

/// 6. ValidateVolumeCapabilities confirms a context only when every key was checked: the
///    plugin checks its own, the controller the host's (`plugin`, `pluginDigest`, `dynamic`,
///    `dynamicPlugins`), in the volume context and in the parameters. Anything it cannot confirm
///    is an answer without `confirmed` and with a message naming the key, never an error.
#[test]
fn validate_volume_capabilities_confirms_only_what_it_checked() {
    if !in_private_namespace("validate_volume_capabilities_confirms_only_what_it_checked") {
        return;
    }
    with_node(async |n| {
        let vol = n.create("pvc-validate", GIB).await.unwrap();
        let list = std::process::Command::new(env!("CARGO_BIN_EXE_mounthost"))
            .args(["--state-dir", &n.dirs.state.display().to_string(), "plugin", "list"])
            .output()
            .unwrap();
        let list: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
        let digest = list.as_array().unwrap().iter().find(|p| p["name"] == "seaweedfs").unwrap()["digest"]
            .as_str()
            .unwrap()
            .to_string();
        let validate = |context: &[(&str, &str)], parameters: &[(&str, &str)]| {
            let mut volume_context = vol.volume_context.clone();
            volume_context.extend(context.iter().map(|(k, v)| (k.to_string(), v.to_string())));
            csi::ValidateVolumeCapabilitiesRequest {
                volume_id: vol.volume_id.clone(),
                volume_context,
                parameters: parameters.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                volume_capabilities: vec![multi_writer()],
                ..Default::default()
            }
        };
        let zeros = format!("sha256:{}", "0".repeat(64));
        let refused: [(&str, csi::ValidateVolumeCapabilitiesRequest, &str); 6] = [
            ("another plugin named", validate(&[("plugin", "tmpfs")], &[]), "names plugin \"tmpfs\""),
            ("a build nobody has", validate(&[("pluginDigest", &zeros)], &[]), "cannot confirm"),
            ("a digest that is not one", validate(&[("pluginDigest", "latest")], &[]), "cannot confirm"),
            (
                "dynamic not a boolean",
                validate(&[("dynamic", "banana")], &[]),
                "volume_context: volume attribute dynamic",
            ),
            ("dynamicPlugins alone", validate(&[("dynamicPlugins", "model")], &[]), "dynamicPlugins is set"),
            ("dynamic in the parameters", validate(&[], &[("dynamic", "yes")]), "parameters: volume attribute dynamic"),
        ];
        for (what, req, says) in refused {
            for _ in 0..2 {
                let v = n.controller.validate_volume_capabilities(req.clone()).await.unwrap().into_inner();
                assert!(v.confirmed.is_none() && v.message.contains(says), "{what}: {v:?}");
            }
        }
        for (what, req) in [
            ("the volume's own context", validate(&[], &[])),
            ("its build pinned", validate(&[("pluginDigest", &digest)], &[])),
            ("dynamic", validate(&[("dynamic", "true"), ("dynamicPlugins", "seaweedfs,model")], &[])),
        ] {
            let v = n.controller.validate_volume_capabilities(req.clone()).await.unwrap().into_inner();
            let confirmed = v.confirmed.unwrap_or_else(|| panic!("{what}: {}", v.message));
            assert_eq!(confirmed.volume_context, req.volume_context, "{what}");
        }
        n.delete(&vol.volume_id).await.unwrap();
        println!(
            "checked: 6 host keys ValidateVolumeCapabilities cannot confirm, each unconfirmed; 3 valid contexts confirmed"
        );
    });
}
