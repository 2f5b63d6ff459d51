//! CSI v1.12 rules of the controller and the seaweedfs plugin, end to end: as root, in a private
//! mount namespace, through the real `mounthost host` and `mounthost csi --mode all` processes,
//! against a real SeaweedFS started here (one per test: tests 4 and 5 need a filer that has no
//! `/buckets` yet, and the others check the whole filer did not change).
//!
//! 1. CreateVolume of names SeaweedFS would refuse (mixed case, 128 bytes) gives valid directories.
//! 2. CreateVolume of an existing name with a capacity range its size is not in, or with other
//!    parameters, is ALREADY_EXISTS and changes nothing; a compatible range is the same volume; an empty range is INVALID_ARGUMENT.
//! 3. DeleteVolume of ids this driver does not know (a plugin not loaded included) is OK and
//!    deletes nothing.
//! 4. A static volume under `/buckets` whose bucket name SeaweedFS refuses is INVALID_ARGUMENT
//!    before anything runs.
//! 5. When `weed mount` exits before mounting, the error quotes its cause, not its usage text.
//! 6. ValidateVolumeCapabilities confirms only what was checked: the host's own keys included.
//! 7. ValidateVolumeCapabilities of an id that names no volume of this driver is NOT_FOUND.
//! 8. ListVolumes lists what this controller created with a StorageClass of only `plugin` and
//!    `filer` (no grant), and no longer what it deleted, before and after the front restarts.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{
    NodeDirs, Seaweed, guarded, in_private_namespace, mounts_below, multi_writer, pids_of, stage_req, weed_binary,
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

/// What the seaweedfs plugin records for a volume of `bytes` at `/buckets/<name>` made by
/// [`create_req`]: its size and its parameters (the context but its path), keys sorted.
fn record_body(weed: &Seaweed, bytes: i64, dir: &str) -> String {
    let collection = dir.rsplit('/').next().unwrap();
    format!(
        "{{\"capacityBytes\":{bytes},\"parameters\":{{\"collection\":\"{collection}\",\"filer\":\"{}\"}}}}\n",
        weed.filer
    )
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

    async fn create_range(
        &mut self,
        name: &str,
        capacity_range: Option<csi::CapacityRange>,
    ) -> Result<csi::Volume, tonic::Status> {
        let req = csi::CreateVolumeRequest { capacity_range, ..create_req(self.weed, name, 0) };
        self.controller.create_volume(req).await.map(|r| r.into_inner().volume.unwrap())
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

/// 2. CreateVolume's capacity rows (CSI v1.12 CreateVolume): an existing name "compatible with
///    the specified capacity_range" (required <= size <= limit, 0 unspecified) is the same
///    volume with its recorded size; any other range is "Volume already exists but is
///    incompatible 6 ALREADY_EXISTS" and changes nothing in the filer, as are other parameters
///    with a compatible range; a range with required
///    above limit, or negative, is INVALID_ARGUMENT and creates nothing; a new volume with only
///    limit_bytes gets that size; after DeleteVolume the name takes a new size.
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
        assert_eq!(n.weed.file(&record), Some(record_body(n.weed, GIB, &dir)));
        // Data in the volume, written through the filer.
        assert_eq!(common::filer_put(&n.weed.filer, &format!("{dir}/data.txt"), "kept").unwrap(), 201);

        let whole = |w: &Seaweed| (w.listing("/buckets"), w.listing(&dir), w.listing("/.mounthost/capacity/buckets"));
        let before = whole(n.weed);
        let range =
            |required: i64, limit: i64| Some(csi::CapacityRange { required_bytes: required, limit_bytes: limit });
        // Compatible: the same volume, of its recorded 1 GiB, and the filer unchanged.
        for asked in [
            range(GIB, 0),
            range(GIB / 2, 0),
            range(0, 2 * GIB),
            range(GIB / 2, GIB),
            range(GIB, GIB),
            range(0, 0),
            None,
        ] {
            let again = n.create_range(pv, asked).await.unwrap_or_else(|e| panic!("{asked:?}: {e:?}"));
            assert_eq!(again, vol, "{asked:?}: the same volume, capacity included");
        }
        // Incompatible: ALREADY_EXISTS naming the name and the recorded size.
        for asked in [range(2 * GIB, 0), range(GIB + 1, 0), range(0, GIB / 2), range(GIB + 1, 4 * GIB)] {
            let e = n.create_range(pv, asked).await.unwrap_err();
            assert_eq!(e.code(), Code::AlreadyExists, "{asked:?}: {e:?}");
            assert!(e.message().contains(pv) && e.message().contains("1073741824 bytes"), "{}", e.message());
        }
        // Compatible capacity, other parameters: "Volume already exists but is incompatible"
        // too, naming what differs.
        let mut other = create_req(n.weed, pv, GIB);
        other.parameters.insert("replication".into(), "001".into());
        let e = n.controller.create_volume(other).await.unwrap_err();
        assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
        assert!(e.message().contains("replication: (unset) recorded, \"001\" asked"), "{}", e.message());
        assert_eq!(whole(n.weed), before, "no CreateVolume of an existing name changed the filer");
        assert_eq!(n.weed.file(&record), Some(record_body(n.weed, GIB, &dir)));
        assert_eq!(n.weed.file(&format!("{dir}/data.txt")).as_deref(), Some("kept"));

        // A range with nothing in it, or negative: INVALID_ARGUMENT, for an existing name or a new one.
        for name in [pv, "pvc-never-made"] {
            for (asked, says) in [
                (range(GIB, GIB / 2), "required_bytes 1073741824 is more than limit_bytes 536870912"),
                (range(-1, 0), "must not be negative"),
                (range(0, -GIB), "must not be negative"),
            ] {
                let e = n.create_range(name, asked).await.unwrap_err();
                assert_eq!(e.code(), Code::InvalidArgument, "{asked:?}: {e:?}");
                assert!(e.message().contains(says), "{}", e.message());
            }
        }
        assert_eq!(whole(n.weed), before, "nothing created");
        assert!(!n.weed.dir_exists("/buckets/pvc-never-made"));

        // A new volume asking for at most 512 MiB gets 512 MiB, recorded; one asking for no size
        // gets no fixed size (0) and no record.
        let limited = n.create_range("pvc-limited", range(0, GIB / 2)).await.unwrap();
        assert_eq!(limited.capacity_bytes, GIB / 2);
        assert_eq!(n.weed.file(&record_of(&dir_of(&limited))), Some(record_body(n.weed, GIB / 2, &dir_of(&limited))));
        assert_eq!(n.create_range("pvc-limited", range(GIB / 4, 0)).await.unwrap(), limited);
        assert_eq!(n.create_range("pvc-limited", range(GIB, 0)).await.unwrap_err().code(), Code::AlreadyExists);
        let sizeless = n.create_range("pvc-sizeless", None).await.unwrap();
        assert_eq!(sizeless.capacity_bytes, 0);
        assert_eq!(n.weed.file(&record_of(&dir_of(&sizeless))), None, "nothing recorded");
        for v in [&limited, &sizeless] {
            n.delete(&v.volume_id).await.unwrap();
        }

        n.delete(&vol.volume_id).await.unwrap();
        assert!(!n.weed.dir_exists(&dir));
        assert_eq!(n.weed.file(&record), None, "DeleteVolume removes the record");
        let bigger = n.create(pv, 2 * GIB).await.unwrap();
        assert_eq!((bigger.volume_id.as_str(), bigger.capacity_bytes), (vol.volume_id.as_str(), 2 * GIB));
        assert_eq!(n.weed.file(&record), Some(record_body(n.weed, 2 * GIB, &dir)));
        assert_eq!(n.weed.file(&format!("{dir}/data.txt")), None, "a new, empty volume");
        assert_eq!(n.create(pv, 3 * GIB).await.unwrap_err().code(), Code::AlreadyExists, "now 3 GiB is too much");
        assert_eq!(n.create(pv, GIB).await.unwrap().capacity_bytes, 2 * GIB, "and 1 GiB fits in it");
        n.delete(&bigger.volume_id).await.unwrap();
        assert!(n.weed.listing("/buckets").is_empty() && n.weed.listing("/.mounthost/capacity/buckets").is_empty());
        println!(
            "checked: 7 compatible ranges answered with the volume, 4 others ALREADY_EXISTS with the filer unchanged, \
             other parameters ALREADY_EXISTS, 6 invalid ranges INVALID_ARGUMENT, a limit-only volume of its limit, re-created at 2 GiB after delete"
        );
    });
}

/// 3. DeleteVolume of ids this driver never made, that name a plugin no loaded plugin is (and
///    of which the controller holds no note), or that its plugin does not know, is OK and
///    deletes nothing (CSI v1.12 DeleteVolume: "If a volume corresponding to the specified
///    volume_id does not exist or the artifacts associated with the volume do not exist
///    anymore, the Plugin MUST reply 0 OK"); a malformed id is INVALID_ARGUMENT.
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
            format!("nosuchplugin~{}{dir}", n.weed.filer),     // no plugin of that name, no note
            "seaweedfs~garbage".to_string(),                   // the plugin says: not mine
            format!("seaweedfs~{}/", n.weed.filer),            // the plugin never makes `/`
            format!("seaweedfs~{}/buckets/a b", n.weed.filer), // nor names with spaces
            format!("seaweedfs~{}", "x".repeat(110)),          // nor ids over 100 bytes
        ];
        for id in &unknown {
            n.delete(id).await.unwrap_or_else(|e| panic!("DeleteVolume {id:?}: {e:?}"));
            n.delete(id).await.unwrap_or_else(|e| panic!("DeleteVolume {id:?} again: {e:?}"));
        }
        assert_eq!(n.delete("").await.unwrap_err().code(), Code::InvalidArgument, "volume_id is required");
        let e = n.delete(&"x".repeat(200)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "over 128 bytes is a malformed field: {e:?}");

        assert_eq!(whole(n.weed), before, "nothing in the filer changed");
        assert_eq!(n.weed.file(&format!("{dir}/data.txt")).as_deref(), Some("kept"));
        let front_log = common::strip_ansi(&std::fs::read_to_string(n.dirs.root.path().join("front.log")).unwrap());
        assert!(front_log.contains("mounthost never makes"), "the front logs ids that are not its own");
        assert!(front_log.contains("does not know this volume id"), "and ids its plugin does not know");
        let warned =
            front_log.lines().find(|l| l.contains("no loaded plugin can have made") && l.contains("nosuchplugin"));
        assert!(
            warned.is_some_and(|l| l.contains("WARN")),
            "an id of a plugin not loaded here is a warning:\n{front_log}"
        );

        n.delete(&vol.volume_id).await.unwrap();
        assert!(!n.weed.dir_exists(&dir));
        println!(
            "checked: {} unknown ids (a plugin not loaded among them) deleted twice with OK and the filer unchanged",
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
///    summary of its log holds the cause; staged through the host (a provisioned volume whose
///    path holds a file, so `weed mount` cannot make its directory), the CSI error holds that
///    cause too.
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

        // Through the host: the id says the plugin provisioned /buckets/vol2, and the plugin's
        // check that the volume is there finds an entry: a file, put through the filer, so weed
        // cannot make the directory and exits the same way.
        assert_eq!(common::filer_put(&n.weed.filer, "/buckets/vol2", "not a directory").unwrap(), 201);
        let id = format!("seaweedfs~{}/buckets/vol2", n.weed.filer);
        let ctx: HashMap<String, String> =
            [("plugin", "seaweedfs"), ("filer", n.weed.filer.as_str()), ("path", "/buckets/vol2")]
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .into();
        let staging: PathBuf = n.dirs.staging("pv-v2");
        let e = n.node.node_stage_volume(stage_req(&id, &staging, &ctx)).await.unwrap_err();
        assert_eq!(e.code(), Code::Unavailable, "{e:?}");
        assert!(e.message().contains("exited before mounting"), "{}", e.message());
        assert!(
            e.message().contains("failed to create dir /buckets/vol2")
                && e.message().contains("existing entry is a file"),
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

/// 7. ValidateVolumeCapabilities rows (CSI v1.12): "Volume does not exist 5 NOT_FOUND" for ids
///    mounthost never makes and for ids of a plugin no loaded plugin is (of which the controller
///    holds no note); a missing field (volume id, capabilities) is INVALID_ARGUMENT; a
///    capability mounthost does not support (block) is answered without `confirmed` ("SHALL
///    return confirmed only if all the volume capabilities specified in the request are
///    supported"), naming it.
#[test]
fn validate_volume_capabilities_of_a_volume_that_does_not_exist_is_not_found() {
    if !in_private_namespace("validate_volume_capabilities_of_a_volume_that_does_not_exist_is_not_found") {
        return;
    }
    with_node(async |n| {
        let vol = n.create("pvc-validate-rows", GIB).await.unwrap();
        let dir = dir_of(&vol);
        let ask = |id: &str, caps: Vec<csi::VolumeCapability>| csi::ValidateVolumeCapabilitiesRequest {
            volume_id: id.into(),
            volume_context: vol.volume_context.clone(),
            volume_capabilities: caps,
            ..Default::default()
        };
        let unknown = [
            ("pvc-1234".to_string(), "never makes such an id"),
            ("~x".to_string(), "never makes such an id"),
            (format!("Seaweedfs~{}{dir}", n.weed.filer), "never makes such an id"),
            (format!("nosuchplugin~{}{dir}", n.weed.filer), "no plugin called nosuchplugin is loaded"),
        ];
        for (id, says) in &unknown {
            for _ in 0..2 {
                let e = n.controller.validate_volume_capabilities(ask(id, vec![multi_writer()])).await.unwrap_err();
                assert_eq!(e.code(), Code::NotFound, "{id}: {e:?}");
                assert!(e.message().contains(says), "{id}: {}", e.message());
            }
        }
        let e = n.controller.validate_volume_capabilities(ask("", vec![multi_writer()])).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "volume_id is required: {e:?}");
        let e = n.controller.validate_volume_capabilities(ask(&vol.volume_id, vec![])).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "volume_capabilities is required: {e:?}");
        let block = csi::VolumeCapability {
            access_mode: multi_writer().access_mode,
            access_type: Some(csi::volume_capability::AccessType::Block(Default::default())),
        };
        let v = n
            .controller
            .validate_volume_capabilities(ask(&vol.volume_id, vec![multi_writer(), block]))
            .await
            .unwrap()
            .into_inner();
        assert!(v.confirmed.is_none() && v.message.contains("block access is not supported"), "{v:?}");
        let v = n.controller.validate_volume_capabilities(ask(&vol.volume_id, vec![multi_writer()])).await.unwrap();
        assert!(v.into_inner().confirmed.is_some(), "the volume itself is confirmed");
        n.delete(&vol.volume_id).await.unwrap();
        println!(
            "checked: {} ids of no volume NOT_FOUND twice, 2 missing fields INVALID_ARGUMENT, block unconfirmed",
            unknown.len()
        );
    });
}

/// Every volume id ListVolumes answers, page by page with `max_entries`, and the number of pages.
async fn list_ids(c: &mut ControllerClient<UnixChannel>, max: i32) -> (Vec<String>, usize) {
    let (mut ids, mut pages, mut token) = (Vec::new(), 0, String::new());
    loop {
        let page = c
            .list_volumes(csi::ListVolumesRequest { max_entries: max, starting_token: token.clone() })
            .await
            .unwrap_or_else(|e| panic!("ListVolumes max_entries={max} token={token:?}: {e:?}"))
            .into_inner();
        pages += 1;
        if max > 0 {
            assert!(page.entries.len() <= max as usize, "a page holds at most max_entries");
        }
        ids.extend(page.entries.into_iter().map(|e| e.volume.unwrap().volume_id));
        if page.next_token.is_empty() {
            ids.sort();
            return (ids, pages);
        }
        token = page.next_token;
        assert!(pages < 100, "ListVolumes never ended");
    }
}

/// csi-sanity v5.5.0's "ListVolumes check the presence of new volumes and absence of deleted
/// ones in the volume list", step by step: list, create, list (one more, the new one among
/// them), delete, list (as before, the deleted one gone). `ListVolumesRequest {}` as it sends.
async fn sanity_presence_and_absence(c: &mut ControllerClient<UnixChannel>, weed: &Seaweed, name: &str) {
    let (before, _) = list_ids(c, 0).await;
    let vol = c.create_volume(create_req(weed, name, 0)).await.unwrap().into_inner().volume.unwrap();
    let (listed, _) = list_ids(c, 0).await;
    assert_eq!(listed.len(), before.len() + 1, "one volume more than before: {listed:?}");
    assert!(listed.contains(&vol.volume_id), "the new volume {} is listed: {listed:?}", vol.volume_id);
    c.delete_volume(delete_req(&vol.volume_id)).await.unwrap();
    let (after, _) = list_ids(c, 0).await;
    assert_eq!(after, before, "as before the create");
    assert!(!after.contains(&vol.volume_id), "the deleted volume is not listed");
}

/// 8. ListVolumes on a default configuration (no `--grant seaweedfs:host=`), StorageClasses of
///    only `plugin` and `filer`: csi-sanity's presence and absence spec on a fresh front; then
///    a volume on each of two filers, listed page by page (`max_entries` 1) across both; the
///    front killed (-9) and started again on the same state directory lists the same; the spec
///    again; once every volume is deleted nothing is listed, before and after another restart.
///    The controller's record of the backends it provisioned on is a small file it rewrote
///    atomically, naming no backend it no longer holds a volume on.
#[test]
fn list_volumes_lists_what_this_controller_created_without_a_grant() {
    if !in_private_namespace("list_volumes_lists_what_this_controller_created_without_a_grant") {
        return;
    }
    let (weed, other) = (Seaweed::start(), Seaweed::start());
    let dirs = NodeDirs::new();
    // The front's flags: a program for the node side, no grant of any filer.
    let args = [format!("--program=weed={}", common::weed_binary().display())];
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _host = dirs.start_host(&args);
    let mut front = dirs.start_front(&args);
    let record = dirs.state.join("controller/backends.json");
    guarded(&dirs, || {
        rt.block_on(async {
            let connect = async || {
                let ch = mounthost::unpriv::grpc::channel(&dirs.csi_sock);
                common::wait_ready(&ch).await;
                ControllerClient::new(ch)
            };
            let mut c = connect().await;
            let (none, _) = list_ids(&mut c, 0).await;
            assert!(none.is_empty(), "a new controller lists nothing: {none:?}");
            sanity_presence_and_absence(&mut c, &weed, "sanity-presence-1").await;
            println!("checked: csi-sanity's presence and absence spec, no grant");

            let a =
                c.create_volume(create_req(&weed, "pvc-list-on-a", GIB)).await.unwrap().into_inner().volume.unwrap();
            let b = c.create_volume(create_req(&other, "pvc-list-on-b", 0)).await.unwrap().into_inner().volume.unwrap();
            let mut both = vec![a.volume_id.clone(), b.volume_id.clone()];
            both.sort();
            for max in [1, 0] {
                let (ids, pages) = list_ids(&mut c, max).await;
                assert_eq!(ids, both, "max_entries {max}");
                if max == 1 {
                    assert!(pages >= 2, "one volume a page: {pages} pages");
                }
            }
            let text = std::fs::read_to_string(&record).unwrap();
            assert!(text.contains(&weed.filer) && text.contains(&other.filer), "both filers recorded: {text}");
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&record).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o644, "no secret in it: 0644");
            println!("checked: two volumes on two filers listed, one a page and all at once");

            // A controller process restarted (killed) on the same state lists the same.
            front.kill9();
            front = dirs.start_front(&args);
            let mut c = connect().await;
            for max in [1, 0] {
                assert_eq!(list_ids(&mut c, max).await.0, both, "after the restart, max_entries {max}");
            }
            // "Invalid starting_token": ABORTED, after a restart as before.
            let e = c
                .list_volumes(csi::ListVolumesRequest { max_entries: 0, starting_token: "seaweedfs:x".into() })
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::Aborted, "{e:?}");
            sanity_presence_and_absence(&mut c, &other, "sanity-presence-2").await;
            println!("checked: after a restart both volumes listed, and csi-sanity's spec again");

            c.delete_volume(delete_req(&a.volume_id)).await.unwrap();
            assert_eq!(list_ids(&mut c, 0).await.0, vec![b.volume_id.clone()], "a deleted volume is not listed");
            let text = std::fs::read_to_string(&record).unwrap();
            assert!(
                !text.contains(&weed.filer) && text.contains(&other.filer),
                "a filer with no volume left goes: {text}"
            );
            c.delete_volume(delete_req(&b.volume_id)).await.unwrap();
            assert!(list_ids(&mut c, 0).await.0.is_empty(), "nothing left");
            front.kill9();
            front = dirs.start_front(&args);
            let mut c = connect().await;
            assert!(list_ids(&mut c, 0).await.0.is_empty(), "nothing listed after another restart");
            let text = std::fs::read_to_string(&record).unwrap();
            assert!(!text.contains(&weed.filer) && !text.contains(&other.filer), "{text}");
            println!("checked: deleted volumes not listed, before and after another restart");
        })
    });
    drop(front);
}
