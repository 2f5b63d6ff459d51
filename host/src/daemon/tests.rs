//! The node pipeline end to end against the [`Recording`] executor: real plugin calls (the
//! `tmpfs` test fixture, loaded from the plugin folder), real policy checks and real state
//! files, with the kernel simulated. Each test asserts what was executed, what the simulated
//! mount table holds and what the state file says.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::errno::Errno;

use super::Node;
use crate::config::Config;
use crate::error::{Error, ErrorKind};
use crate::exec::recording::{Recording, mount_points};
use crate::exec::{Files, Groups, Mounts, Processes};
use crate::plan::policy::Grant;
use crate::plugin::PluginRuntime;
use crate::proto::csi;
use crate::volume::dirs::volume_key;
use crate::volume::state::{Phase, VolumeState};

const VOL: &str = "tmpfs~pvc-1";

/// A node over a recording executor, with its state and kubelet directories in a temp dir.
struct Env {
    _dir: tempfile::TempDir,
    config: Config,
    runtime: Arc<PluginRuntime>,
    rec: Arc<Recording>,
    node: Node,
    kubelet: PathBuf,
}

impl Env {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        // Canonical, so the paths built here are the ones the root check compares against.
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let kubelet = root.join("kubelet");
        let mut config = Config::new(root.join("state"));
        config.kubelet_dir = kubelet.clone();
        config.plugin_concurrency = 4;
        config.grants.insert("tmpfs".into(), Grant { fstypes: ["tmpfs".to_string()].into(), ..Grant::default() });
        // The filer of the tests' inline volumes, whose attributes (a pod's) grant no host: the
        // node grants it, or @weed refuses its -filer.
        config.grants.get_mut("seaweedfs").expect("a stock grant").hosts.insert("127.0.0.1:8888".into());
        std::fs::create_dir_all(&config.plugin_dir).unwrap();
        std::fs::copy(crate::stock::fixtures::path("tmpfs"), config.plugin_dir.join("tmpfs.wasm")).unwrap();
        let runtime = Arc::new(PluginRuntime::new(config.runtime()).unwrap());
        // The node as kubelet prepares it: its directory, the staging path's parent and the
        // pods' volume directories (the CO creates a target's parent).
        let rec = Arc::new(Recording::new());
        rec.add_dir(&kubelet.join("plugins/kubernetes.io/csi/csi.mounthost.dev/0a1b"));
        for pod in ["pod-a", "pod-b", "pod-c", "pod-e", "pod-x"] {
            rec.add_dir(&kubelet.join(format!("pods/{pod}/volumes/kubernetes.io~csi/pvc-1")));
        }
        let node = Node::new(config.clone(), runtime.clone(), rec.clone()).unwrap();
        rec.clear_calls();
        Env { _dir: dir, config, runtime, rec, node, kubelet }
    }

    /// A second daemon on the same state directory and machine (a restart).
    fn restarted(&self) -> Node {
        Node::new(self.config.clone(), self.runtime.clone(), self.rec.clone()).unwrap()
    }

    fn staging(&self) -> PathBuf {
        self.kubelet.join("plugins/kubernetes.io/csi/csi.mounthost.dev/0a1b/globalmount")
    }

    fn target(&self, pod: &str) -> PathBuf {
        self.kubelet.join(format!("pods/{pod}/volumes/kubernetes.io~csi/pvc-1/mount"))
    }

    fn stage_req(&self) -> csi::NodeStageVolumeRequest {
        csi::NodeStageVolumeRequest {
            volume_id: VOL.into(),
            staging_target_path: s(&self.staging()),
            volume_capability: Some(mount_cap()),
            volume_context: ctx(&[("plugin", "tmpfs")]),
            ..Default::default()
        }
    }

    fn publish_req(&self, target: &Path, readonly: bool) -> csi::NodePublishVolumeRequest {
        csi::NodePublishVolumeRequest {
            volume_id: VOL.into(),
            staging_target_path: s(&self.staging()),
            target_path: s(target),
            volume_capability: Some(mount_cap()),
            readonly,
            volume_context: ctx(&[("plugin", "tmpfs")]),
            ..Default::default()
        }
    }

    fn unpublish_req(&self, target: &Path) -> csi::NodeUnpublishVolumeRequest {
        csi::NodeUnpublishVolumeRequest { volume_id: VOL.into(), target_path: s(target) }
    }

    fn unstage_req(&self) -> csi::NodeUnstageVolumeRequest {
        csi::NodeUnstageVolumeRequest { volume_id: VOL.into(), staging_target_path: s(&self.staging()) }
    }

    /// NodeUnstageVolume succeeds and leaves no mount and no state.
    async fn unstage_leaves_nothing(&self) {
        self.node.unstage(self.unstage_req()).await.unwrap();
        assert_eq!(mount_points(&self.rec), Vec::<PathBuf>::new());
        assert!(self.node.store().load(VOL).unwrap().is_none());
    }

    /// The volume's record as a daemon started now would read it from the state directory.
    fn on_disk(&self) -> Option<VolumeState> {
        self.restarted().store().load(VOL).unwrap()
    }

    /// Recorded calls of one kind (`mount`, `bind`, `unmount`, ...).
    fn calls(&self, op: &str) -> Vec<String> {
        let prefix = format!("{op} ");
        self.rec.calls().into_iter().filter(|c| c.starts_with(&prefix)).collect()
    }
}

/// The cgroup of volume `id` (a unit test's daemon has no instance id: `mounthost/<key>`).
fn group(id: &str) -> String {
    format!("{}/{}", crate::config::DEFAULT_CGROUP_PARENT, volume_key(id))
}

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

fn ctx(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn mount_cap() -> csi::VolumeCapability {
    use csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
    csi::VolumeCapability {
        access_mode: Some(AccessMode { mode: Mode::SingleNodeMultiWriter as i32 }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

fn tmpfs_mount(at: &Path, size_mib: u32) -> String {
    format!("mount tmpfs tmpfs {} [size={size_mib}m,mode=0755]", at.display())
}

/// The error of `r`, which must be of class `kind`.
#[track_caller]
fn err_of<T: std::fmt::Debug>(r: Result<T, Error>, kind: ErrorKind) -> Error {
    match r {
        Ok(v) => panic!("expected {kind:?}, got Ok({v:?})"),
        Err(e) => {
            assert_eq!(e.kind, kind, "{}", e.message);
            e
        }
    }
}

#[tokio::test]
async fn stage_mounts_a_tmpfs_once_and_restage_is_a_no_op() {
    let e = Env::new();
    e.node.stage(e.stage_req()).await.unwrap();
    assert_eq!(e.calls("mount"), vec![tmpfs_mount(&e.staging(), 16)]);
    assert_eq!(mount_points(&e.rec), vec![e.staging()]);
    let st = e.node.store().load(VOL).unwrap().expect("state after stage");
    assert_eq!(st.phase, Phase::Staged);
    assert_eq!((st.plugin.as_str(), st.staging_path.as_path(), st.ephemeral), ("tmpfs", e.staging().as_path(), false));
    assert!(st.process.is_none() && st.published.is_empty());
    assert!(!st.context.contains_key("plugin"), "reserved keys are not recorded as plugin context");

    e.rec.clear_calls();
    e.node.stage(e.stage_req()).await.unwrap();
    assert_eq!(e.rec.calls(), Vec::<String>::new(), "a healthy staged volume is left alone");
    assert_eq!(mount_points(&e.rec), vec![e.staging()]);

    // The same volume at another staging path is refused, and nothing runs.
    let mut other = e.stage_req();
    other.staging_target_path = s(&e.kubelet.join("plugins/elsewhere/globalmount"));
    err_of(e.node.stage(other).await, ErrorKind::FailedPrecondition);
    assert_eq!(e.rec.calls(), Vec::<String>::new());
}

#[tokio::test]
async fn the_size_parameter_reaches_the_mount_and_unknown_ones_are_refused() {
    let e = Env::new();
    let mut req = e.stage_req();
    // The host strips its reserved keys and kubelet's before the plugin sees the context.
    req.volume_context = ctx(&[("plugin", "tmpfs"), ("sizeMiB", "64"), ("csi.storage.k8s.io/pod.name", "p")]);
    e.node.stage(req).await.unwrap();
    assert_eq!(e.calls("mount"), vec![tmpfs_mount(&e.staging(), 64)]);

    let e = Env::new();
    let mut req = e.stage_req();
    req.volume_context = ctx(&[("plugin", "tmpfs"), ("size", "64")]);
    let err = err_of(e.node.stage(req).await, ErrorKind::InvalidArgument);
    assert!(err.message.contains("\"size\"") && err.message.contains("sizeMiB"), "{}", err.message);
    // The plugin reads no secret, so a StorageClass that sends one is wrong.
    let mut req = e.stage_req();
    req.secrets = ctx(&[("token", "hunter22")]);
    let err = err_of(e.node.stage(req).await, ErrorKind::InvalidArgument);
    assert!(!err.message.contains("hunter22"), "{}", err.message);
    assert_eq!(e.rec.calls(), Vec::<String>::new());
    assert!(e.node.store().load(VOL).unwrap().is_none());
}

#[tokio::test]
async fn publish_binds_each_target_once_with_its_own_flags() {
    let e = Env::new();
    let (a, b) = (e.target("pod-a"), e.target("pod-b"));
    e.node.stage(e.stage_req()).await.unwrap();
    e.rec.clear_calls();

    e.node.publish(e.publish_req(&a, false)).await.unwrap();
    e.node.publish(e.publish_req(&b, true)).await.unwrap();
    let staging = e.staging().display().to_string();
    assert_eq!(
        e.calls("bind"),
        vec![format!("bind {staging} {}", a.display()), format!("bind {staging} {} ro", b.display())]
    );
    let st = e.node.store().load(VOL).unwrap().unwrap();
    let published: Vec<(PathBuf, bool)> = st.published.iter().map(|(t, p)| (t.clone(), p.readonly)).collect();
    assert_eq!(published, vec![(a.clone(), false), (b.clone(), true)]);
    let table = e.rec.mounts().unwrap();
    let at = |p: &Path| table.iter().find(|m| m.mount_point == p).unwrap().clone();
    assert_eq!(at(&a).device, at(&e.staging()).device, "the target shows the staged filesystem");
    assert!(!at(&a).is_readonly() && at(&b).is_readonly());

    e.rec.clear_calls();
    e.node.publish(e.publish_req(&a, false)).await.unwrap();
    e.node.publish(e.publish_req(&b, true)).await.unwrap();
    assert_eq!(e.calls("bind"), Vec::<String>::new(), "republishing the same way binds nothing");

    let err = err_of(e.node.publish(e.publish_req(&a, true)).await, ErrorKind::AlreadyExists);
    assert!(err.message.contains("read-write"), "{}", err.message);
    assert_eq!(e.calls("bind"), Vec::<String>::new());
    assert!(!e.node.store().load(VOL).unwrap().unwrap().published[&a].readonly);
}

#[tokio::test]
async fn publish_needs_a_staged_volume_and_a_free_target() {
    let e = Env::new();
    let a = e.target("pod-a");
    err_of(e.node.publish(e.publish_req(&a, false)).await, ErrorKind::FailedPrecondition);
    assert_eq!(e.rec.calls(), Vec::<String>::new());

    e.node.stage(e.stage_req()).await.unwrap();
    e.rec.add_mount("tmpfs", "other", &a);
    e.rec.clear_calls();
    let err = err_of(e.node.publish(e.publish_req(&a, false)).await, ErrorKind::AlreadyExists);
    assert!(err.message.contains("another mount"), "{}", err.message);
    assert_eq!(e.calls("bind"), Vec::<String>::new());
    assert!(e.node.store().load(VOL).unwrap().unwrap().published.is_empty());

    // Publishing onto the staging path itself is a bad request.
    err_of(e.node.publish(e.publish_req(&e.staging(), false)).await, ErrorKind::InvalidArgument);
}

#[tokio::test]
async fn unstage_waits_for_unpublish_then_tears_everything_down() {
    let e = Env::new();
    let (a, b) = (e.target("pod-a"), e.target("pod-b"));
    e.node.stage(e.stage_req()).await.unwrap();
    e.node.publish(e.publish_req(&a, false)).await.unwrap();
    e.node.publish(e.publish_req(&b, true)).await.unwrap();

    e.rec.clear_calls();
    let err = err_of(e.node.unstage(e.unstage_req()).await, ErrorKind::FailedPrecondition);
    assert!(err.message.contains(&s(&a)) && err.message.contains(&s(&b)), "{}", err.message);
    assert_eq!(e.calls("unmount"), Vec::<String>::new());
    assert_eq!(e.node.store().load(VOL).unwrap().unwrap().phase, Phase::Staged);

    for target in [&a, &a, &b, &b] {
        e.node.unpublish(e.unpublish_req(target)).await.unwrap();
    }
    assert_eq!(e.calls("unmount"), vec![format!("unmount {}", a.display()), format!("unmount {}", b.display())]);
    assert_eq!(mount_points(&e.rec), vec![e.staging()]);
    assert!(e.node.store().load(VOL).unwrap().unwrap().published.is_empty());

    e.rec.clear_calls();
    e.node.unstage(e.unstage_req()).await.unwrap();
    assert_eq!(e.calls("unmount"), vec![format!("unmount {}", e.staging().display())]);
    assert_eq!(mount_points(&e.rec), Vec::<PathBuf>::new());
    assert!(e.node.store().load(VOL).unwrap().is_none());
    assert!(!e.rec.exists(&e.node.store().path(VOL)));

    e.rec.clear_calls();
    e.node.unstage(e.unstage_req()).await.unwrap();
    assert_eq!(e.calls("unmount"), Vec::<String>::new(), "a second unstage has nothing to do");
}

#[tokio::test]
async fn unpublish_clears_only_targets_no_record_holds() {
    let e = Env::new();
    let a = e.target("pod-a");
    e.node.stage(e.stage_req()).await.unwrap();
    e.node.publish(e.publish_req(&a, false)).await.unwrap();
    e.rec.add_dir(&e.staging().join("data"));
    e.rec.clear_calls();
    let before = e.rec.mounts().unwrap();
    // Paths a record holds, asked for by a volume not published there: another volume's
    // publication, this volume's own staging path, a directory inside the staged volume, and a
    // directory above a publication.
    let other =
        |target: &Path| csi::NodeUnpublishVolumeRequest { volume_id: "tmpfs~other".into(), target_path: s(target) };
    let asks = [
        other(&a),
        e.unpublish_req(&e.staging()),
        other(&e.staging().join("data")),
        e.unpublish_req(a.parent().unwrap()),
    ];
    for ask in asks {
        let path = ask.target_path.clone();
        e.node.unpublish(ask).await.unwrap_or_else(|err| panic!("unpublish at {path}: {err:?}"));
        assert_eq!(e.rec.calls(), Vec::<String>::new(), "unpublish at {path} touched something");
    }
    assert_eq!(e.rec.mounts().unwrap(), before);
    assert!(e.rec.exists(&e.staging().join("data")) && e.rec.exists(&a));
    assert_eq!(e.node.store().load(VOL).unwrap().unwrap().published.len(), 1);

    // A target no record holds is cleared (a bind whose record a crash lost), and so is the
    // volume's own publication.
    let b = e.target("pod-b");
    e.rec.add_dir(&b);
    e.rec.add_mount("tmpfs", "lost", &b);
    e.node.unpublish(e.unpublish_req(&b)).await.unwrap();
    e.node.unpublish(e.unpublish_req(&a)).await.unwrap();
    assert_eq!(e.calls("unmount"), vec![format!("unmount {}", b.display()), format!("unmount {}", a.display())]);
    assert_eq!(mount_points(&e.rec), vec![e.staging()]);
    assert!(!e.rec.exists(&a) && !e.rec.exists(&b));
}

#[tokio::test]
async fn unstage_of_an_unknown_volume_leaves_paths_a_record_holds() {
    let e = Env::new();
    let (a, b) = (e.target("pod-a"), e.target("pod-b"));
    e.node.stage(e.stage_req()).await.unwrap();
    e.node.publish(e.publish_req(&a, false)).await.unwrap();
    e.rec.add_dir(&e.staging().join("data"));
    e.rec.clear_calls();
    let before = e.rec.mounts().unwrap();
    let recorded = e.node.store().load(VOL).unwrap();
    // An id with no record, at paths the volume's record holds: its staging path, its pod's
    // target, a directory inside the stage and the directory above it. CSI: "not staged to the
    // staging_target_path ... MUST reply 0 OK", and nothing is touched.
    let unknown =
        |path: &Path| csi::NodeUnstageVolumeRequest { volume_id: "tmpfs~other".into(), staging_target_path: s(path) };
    for path in [e.staging(), a.clone(), e.staging().join("data"), e.staging().parent().unwrap().to_path_buf()] {
        e.node.unstage(unknown(&path)).await.unwrap_or_else(|err| panic!("unstage at {}: {err:?}", path.display()));
        assert_eq!(e.rec.calls(), Vec::<String>::new(), "unstage at {} touched something", path.display());
    }
    assert_eq!(e.rec.mounts().unwrap(), before);
    assert_eq!(e.node.store().load(VOL).unwrap(), recorded);
    // The volume is still staged and publishes.
    e.node.publish(e.publish_req(&b, true)).await.unwrap();
    assert_eq!(e.calls("bind"), vec![format!("bind {} {} ro", e.staging().display(), b.display())]);

    // A staging path no record holds is cleared (what a crash left there).
    let lost = e.kubelet.join("plugins/kubernetes.io/csi/csi.mounthost.dev/lost/globalmount");
    e.rec.add_dir(&lost);
    e.rec.add_mount("tmpfs", "lost", &lost);
    e.rec.clear_calls();
    e.node.unstage(unknown(&lost)).await.unwrap();
    assert_eq!(e.calls("unmount"), vec![format!("unmount {}", lost.display())]);
    assert_eq!(mount_points(&e.rec), vec![e.staging(), a.clone(), b.clone()]);
}

#[tokio::test]
async fn a_read_only_publish_refuses_a_plan_that_leaves_the_pod_a_writable_target() {
    use crate::plugin::bindings::types as wit;
    use crate::volume::request;
    let e = Env::new();
    let a = e.target("pod-a");
    // Read-only is asked by the CO's flag, or by a read-only access mode with the flag false
    // (what kubelet sends for a ReadOnlyMany volume in a pod that does not say readOnly); the
    // volume is staged with the capability it is published with.
    let asks = [
        (e.stage_req(), e.publish_req(&a, true), "the publish asked for read-only"),
        (
            reader_only_stage(e.stage_req()),
            reader_only(e.publish_req(&a, false)),
            "its access mode is MULTI_NODE_READER_ONLY",
        ),
    ];
    for (stage, req, why) in asks {
        e.node.stage(stage).await.unwrap();
        // No fixture plugin answers a read-only publish with a writable plan: the node's plan
        // memo is handed the plans such a plugin could answer with, under this request's key.
        let asked = wit::PublishRequest {
            volume_id: VOL.into(),
            context: request::kvs(&request::plugin_attrs(&req.volume_context)),
            secrets: Vec::new(),
            capability: request::capability(req.volume_capability.as_ref()).unwrap(),
            readonly: req.readonly,
            recorded: Vec::new(),
        };
        let key = super::publish::publish_key(&e.current_digest().await, &asked);
        let path = |root, rel: &str| wit::PathRef { root, rel: rel.into() };
        let bind = |rel: &str, readonly| {
            wit::Step::Bind(wit::Bind {
                source: path(wit::DirRoot::Staging, ""),
                target: path(wit::DirRoot::Target, rel),
                readonly,
                options: Vec::new(),
            })
        };
        let sub = a.join("sub");
        let cases = [
            (vec![bind("", false)], format!("a read-write bind at {}", a.display())),
            (vec![wit::Step::Mkdir(path(wit::DirRoot::Target, ""))], format!("no mount or bind at {}", a.display())),
            (vec![bind("", true), bind("sub", false)], format!("a read-write bind at {}", sub.display())),
        ];
        e.rec.clear_calls();
        for (steps, says) in cases {
            e.node.inner.plans.lock().unwrap().insert(key, wit::Plan { steps, attributes: Vec::new() });
            let err = err_of(e.node.publish(req.clone()).await, ErrorKind::InvalidArgument);
            let m = &err.message;
            assert!(m.contains("plugin tmpfs") && m.contains(&says) && m.contains(why), "{m}");
            assert_eq!(e.rec.calls(), Vec::<String>::new(), "refused before anything ran: {says}");
            assert!(!e.rec.exists(&a));
            assert!(e.node.store().load(VOL).unwrap().unwrap().published.is_empty());
        }
        // The fixture's own plan, a read-only bind, passes.
        e.node.inner.plans.lock().unwrap().clear();
        e.node.publish(req).await.unwrap();
        assert_eq!(e.calls("bind"), vec![format!("bind {} {} ro", e.staging().display(), a.display())]);
        e.node.unpublish(e.unpublish_req(&a)).await.unwrap();
        e.node.unstage(e.unstage_req()).await.unwrap();
    }
}

#[tokio::test]
async fn bad_requests_are_refused_before_anything_runs() {
    let e = Env::new();
    let kubelet = e.kubelet.display().to_string();
    type Stage = fn(&mut csi::NodeStageVolumeRequest, &str);
    let stage_cases: &[(&str, Stage)] = &[
        ("empty volume id", |r, _| r.volume_id.clear()),
        ("100 KB volume id", |r, _| r.volume_id = "x".repeat(100_000)),
        ("control character in the id", |r, _| r.volume_id = "a\nb".into()),
        ("relative staging path", |r, _| r.staging_target_path = "kubelet/plugins/x/globalmount".into()),
        ("`..` in the staging path", |r, k| r.staging_target_path = format!("{k}/plugins/../../../etc")),
        ("staging path outside kubelet's dir", |r, _| r.staging_target_path = "/etc/mounthost-test".into()),
        ("the kubelet dir itself", |r, k| r.staging_target_path = k.to_string()),
        ("NUL in the staging path", |r, k| r.staging_target_path = format!("{k}/plugins/a\0b")),
        ("missing capability", |r, _| r.volume_capability = None),
        ("block capability", |r, _| {
            r.volume_capability.as_mut().unwrap().access_type =
                Some(csi::volume_capability::AccessType::Block(Default::default()))
        }),
        ("unknown access mode", |r, _| r.volume_capability.as_mut().unwrap().access_mode = None),
        ("no plugin named", |r, _| {
            r.volume_id = "pvc-1".into();
            r.volume_context.clear()
        }),
        ("NUL in a context value", |r, _| {
            r.volume_context.insert("sizeMiB".into(), "1\0".into());
        }),
    ];
    for (what, edit) in stage_cases {
        let mut req = e.stage_req();
        edit(&mut req, &kubelet);
        let err = err_of(e.node.stage(req).await, ErrorKind::InvalidArgument);
        assert!(err.message.len() < 1000, "{what}: the message is bounded: {} bytes", err.message.len());
        assert_eq!(e.rec.calls(), Vec::<String>::new(), "{what}");
    }

    // The host's own ephemeral staging directories are not a caller's to name.
    let own = e.config.state_dir.join("ephemeral").join(volume_key("pvc-1")).join("mount");
    let mut req = e.stage_req();
    req.staging_target_path = own.to_str().unwrap().into();
    let err = err_of(e.node.stage(req).await, ErrorKind::InvalidArgument);
    assert!(err.message.contains("outside the directories"), "{}", err.message);
    let mut req = e.publish_req(&own, false);
    req.staging_target_path = own.to_str().unwrap().into();
    err_of(e.node.publish(req).await, ErrorKind::InvalidArgument);
    assert_eq!(e.rec.calls(), Vec::<String>::new());

    let mut req = e.stage_req();
    req.volume_context = ctx(&[("plugin", "nope")]);
    let err = err_of(e.node.stage(req).await, ErrorKind::InvalidArgument);
    assert!(err.message.contains("\"nope\"") && err.message.contains("seaweedfs, tmpfs"), "{}", err.message);
    assert_eq!(e.rec.calls(), Vec::<String>::new());

    type Publish = fn(&mut csi::NodePublishVolumeRequest, &str);
    let publish_cases: &[(&str, Publish)] = &[
        ("empty volume id", |r, _| r.volume_id.clear()),
        ("100 KB volume id", |r, _| r.volume_id = "x".repeat(100_000)),
        ("relative target", |r, _| r.target_path = "pods/a/mount".into()),
        ("`..` in the target", |r, k| r.target_path = format!("{k}/pods/../../../etc")),
        ("target outside kubelet's dir", |r, _| r.target_path = "/etc/mounthost-test".into()),
        ("NUL in the target", |r, k| r.target_path = format!("{k}/pods/a\0b")),
        ("missing capability", |r, _| r.volume_capability = None),
        ("block capability", |r, _| {
            r.volume_capability.as_mut().unwrap().access_type =
                Some(csi::volume_capability::AccessType::Block(Default::default()))
        }),
        ("ephemeral with a staging path", |r, _| {
            r.volume_context.insert("csi.storage.k8s.io/ephemeral".into(), "true".into());
        }),
    ];
    for (what, edit) in publish_cases {
        let mut req = e.publish_req(&e.target("pod-a"), false);
        edit(&mut req, &kubelet);
        err_of(e.node.publish(req).await, ErrorKind::InvalidArgument);
        assert_eq!(e.rec.calls(), Vec::<String>::new(), "{what}");
    }
    // CSI's table: "Staging target path not set" is FAILED_PRECONDITION.
    let mut req = e.publish_req(&e.target("pod-a"), false);
    req.staging_target_path.clear();
    let err = err_of(e.node.publish(req).await, ErrorKind::FailedPrecondition);
    assert!(err.message.contains("staging_target_path is required"), "{}", err.message);
    assert_eq!(e.rec.calls(), Vec::<String>::new());

    let bad_targets = ["", "pods/a", "/etc/x", "/a/../b"];
    for t in bad_targets {
        let req = csi::NodeUnpublishVolumeRequest { volume_id: VOL.into(), target_path: t.into() };
        err_of(e.node.unpublish(req).await, ErrorKind::InvalidArgument);
        let req = csi::NodeUnstageVolumeRequest { volume_id: VOL.into(), staging_target_path: t.into() };
        err_of(e.node.unstage(req).await, ErrorKind::InvalidArgument);
    }
    assert_eq!(e.rec.calls(), Vec::<String>::new());
    assert!(e.node.store().list().unwrap().is_empty());
}

#[tokio::test]
async fn a_failed_mount_leaves_nothing_behind_and_a_retry_works() {
    let e = Env::new();
    e.rec.fail_next("mount", Errno::EIO);
    let err = err_of(e.node.stage(e.stage_req()).await, ErrorKind::Internal);
    assert!(err.message.contains("I/O error"), "{}", err.message);
    assert_eq!(e.calls("mount"), vec![tmpfs_mount(&e.staging(), 16)]);
    assert!(e.node.store().load(VOL).unwrap().is_none(), "no state after a failed stage");
    assert_eq!(mount_points(&e.rec), Vec::<PathBuf>::new());

    e.rec.clear_calls();
    e.node.stage(e.stage_req()).await.unwrap();
    assert_eq!(e.calls("mount"), vec![tmpfs_mount(&e.staging(), 16)]);
    assert_eq!(e.node.store().load(VOL).unwrap().unwrap().phase, Phase::Staged);
}

#[tokio::test]
async fn a_second_call_on_a_busy_volume_is_aborted() {
    let e = Env::new();
    let guard = e.node.inner.locks.try_lock(VOL).unwrap();
    err_of(e.node.stage(e.stage_req()).await, ErrorKind::Aborted);
    err_of(e.node.publish(e.publish_req(&e.target("pod-a"), false)).await, ErrorKind::Aborted);
    err_of(e.node.unpublish(e.unpublish_req(&e.target("pod-a"))).await, ErrorKind::Aborted);
    err_of(e.node.unstage(e.unstage_req()).await, ErrorKind::Aborted);
    assert_eq!(e.rec.calls(), Vec::<String>::new());
    drop(guard);
    e.node.stage(e.stage_req()).await.unwrap();
}

/// NodePublishVolume of an inline (ephemeral) volume `id` at `target`, with context `attrs` and
/// the ephemeral flag.
fn ephemeral_req(id: &str, target: &Path, attrs: &[(&str, &str)]) -> csi::NodePublishVolumeRequest {
    let mut volume_context = ctx(attrs);
    volume_context.insert("csi.storage.k8s.io/ephemeral".into(), "true".into());
    csi::NodePublishVolumeRequest {
        volume_id: id.into(),
        target_path: s(target),
        volume_capability: Some(mount_cap()),
        volume_context,
        ..Default::default()
    }
}

#[tokio::test]
async fn an_ephemeral_volume_lives_from_publish_to_unpublish() {
    let e = Env::new();
    let target = e.target("pod-e");
    let id = "csi-4f2a9c";
    let req =
        ephemeral_req(id, &target, &[("plugin", "tmpfs"), ("sizeMiB", "4"), ("csi.storage.k8s.io/pod.name", "pod-e")]);
    e.node.publish(req.clone()).await.unwrap();
    let dir = e.config.state_dir.join("ephemeral").join(volume_key(id));
    let staging = dir.join("mount");
    assert_eq!(e.calls("mount"), vec![tmpfs_mount(&staging, 4)]);
    assert_eq!(e.calls("bind"), vec![format!("bind {} {}", staging.display(), target.display())]);
    assert_eq!(mount_points(&e.rec), vec![staging.clone(), target.clone()]);
    let st = e.node.store().load(id).unwrap().unwrap();
    assert!(st.ephemeral && st.phase == Phase::Staged && st.staging_path == staging);
    assert_eq!(st.published.keys().collect::<Vec<_>>(), vec![&target]);

    e.rec.clear_calls();
    e.node.publish(req).await.unwrap();
    assert_eq!(e.calls("mount").len() + e.calls("bind").len(), 0, "kubelet's retry changes nothing");

    let unpublish = csi::NodeUnpublishVolumeRequest { volume_id: id.into(), target_path: s(&target) };
    e.node.unpublish(unpublish.clone()).await.unwrap();
    assert_eq!(mount_points(&e.rec), Vec::<PathBuf>::new());
    assert!(e.node.store().load(id).unwrap().is_none());
    assert!(e.rec.calls().contains(&format!("remove-tree {}", dir.display())), "{:?}", e.rec.calls());

    e.rec.clear_calls();
    e.node.unpublish(unpublish).await.unwrap();
    assert_eq!(e.calls("unmount"), Vec::<String>::new());
}

#[tokio::test]
async fn an_inline_volume_whose_publish_fails_is_not_left_staged() {
    let e = Env::new();
    // "pod-n" has no volumes directory: the target's parent is missing, which fails the publish
    // after the host staged the volume. kubelet sends no NodeUnpublishVolume for a publish that
    // never succeeded, so nothing else would ever unstage it.
    let target = e.kubelet.join("pods/pod-n/volumes/kubernetes.io~csi/pvc-1/mount");
    let id = "csi-77e0b1";
    let req = ephemeral_req(id, &target, &[("plugin", "tmpfs"), ("sizeMiB", "2")]);
    let dir = e.config.state_dir.join("ephemeral").join(volume_key(id));
    let staging = dir.join("mount");
    for attempt in 0..2 {
        e.rec.clear_calls();
        let err = e.node.publish(req.clone()).await.unwrap_err();
        assert!(err.message.contains("pod-n"), "attempt {attempt}: {err:?}");
        assert_eq!(e.calls("mount"), vec![tmpfs_mount(&staging, 2)], "attempt {attempt}: staged");
        assert_eq!(e.calls("unmount"), vec![format!("unmount {}", staging.display())], "attempt {attempt}");
        assert_eq!(mount_points(&e.rec), Vec::<PathBuf>::new(), "attempt {attempt}: nothing left mounted");
        assert!(e.node.store().load(id).unwrap().is_none(), "attempt {attempt}: no record left");
        assert!(!e.rec.exists(&dir), "attempt {attempt}: the host's staging directory is gone");
    }
    // Once kubelet has made the parent, the retry stages and publishes.
    e.rec.add_dir(target.parent().unwrap());
    e.node.publish(req).await.unwrap();
    assert_eq!(mount_points(&e.rec), vec![staging.clone(), target.clone()]);

    // A publish that fails while the volume is published elsewhere leaves it as it is.
    let other = e.kubelet.join("pods/pod-m/volumes/kubernetes.io~csi/pvc-1/mount");
    e.node.publish(ephemeral_req(id, &other, &[("plugin", "tmpfs"), ("sizeMiB", "2")])).await.unwrap_err();
    assert_eq!(mount_points(&e.rec), vec![staging, target.clone()]);
    assert_eq!(e.node.store().load(id).unwrap().unwrap().published.keys().collect::<Vec<_>>(), vec![&target]);
}

#[tokio::test]
async fn a_restarted_daemon_adopts_healthy_volumes_and_flags_lost_ones() {
    let e = Env::new();
    let a = e.target("pod-a");
    e.node.stage(e.stage_req()).await.unwrap();
    e.node.publish(e.publish_req(&a, false)).await.unwrap();

    let node = e.restarted();
    let report = node.reconcile().unwrap();
    assert_eq!((report.adopted, report.unhealthy, report.cleaned, report.unreadable), (1, 0, 0, 0));
    assert_eq!(node.store().load(VOL).unwrap().unwrap().phase, Phase::Staged);

    // The staging mount disappears behind the daemon's back.
    Mounts::unmount(&*e.rec, &e.staging(), false).unwrap();
    let node = e.restarted();
    let report = node.reconcile().unwrap();
    assert_eq!((report.adopted, report.unhealthy, report.cleaned), (0, 1, 0));
    assert!(node.store().load(VOL).unwrap().is_some(), "an unhealthy volume is kept for NodeStage to rebuild");

    // kubelet's next NodeStage rebuilds it and moves the published target onto the new mount.
    e.rec.clear_calls();
    node.stage(e.stage_req()).await.unwrap();
    assert_eq!(e.calls("mount"), vec![tmpfs_mount(&e.staging(), 16)]);
    assert_eq!(e.calls("bind"), vec![format!("bind {} {}", e.staging().display(), a.display())]);
    let table = e.rec.mounts().unwrap();
    let at = |p: &Path| table.iter().rev().find(|m| m.mount_point == p).unwrap().device.clone();
    assert_eq!(at(&a), at(&e.staging()));
    assert_eq!(e.restarted().reconcile().unwrap().adopted, 1);
}

#[tokio::test]
async fn reconcile_rolls_back_an_interrupted_stage() {
    let e = Env::new();
    e.node.stage(e.stage_req()).await.unwrap();
    let mut st = e.node.store().load(VOL).unwrap().unwrap();
    st.phase = Phase::Staging;
    e.node.store().save(&st).unwrap();

    let report = e.restarted().reconcile().unwrap();
    assert_eq!((report.adopted, report.cleaned), (0, 1));
    assert_eq!(mount_points(&e.rec), Vec::<PathBuf>::new());
    assert!(e.on_disk().is_none());
}

#[tokio::test]
async fn stats_report_usage_and_condition() {
    let e = Env::new();
    e.node.stage(e.stage_req()).await.unwrap();
    let req = |path: &Path| csi::NodeGetVolumeStatsRequest {
        volume_id: VOL.into(),
        volume_path: s(path),
        staging_target_path: String::new(),
    };
    let out = e.node.stats(req(&e.staging())).await.unwrap();
    assert_eq!(out.usage.len(), 2);
    assert!(!out.volume_condition.unwrap().abnormal);
    err_of(e.node.stats(req(&e.target("pod-x"))).await, ErrorKind::NotFound);

    Mounts::unmount(&*e.rec, &e.staging(), false).unwrap();
    let out = e.node.stats(req(&e.staging())).await.unwrap();
    let condition = out.volume_condition.unwrap();
    assert!(condition.abnormal && condition.message.contains("nothing is mounted"), "{}", condition.message);
}

/// A read-only access mode makes the SDK's publish plan a read-only bind even when the CO's
/// `readonly` flag is false (kubelet leaves it false unless the pod or PV says readOnly).
fn reader_only(mut req: csi::NodePublishVolumeRequest) -> csi::NodePublishVolumeRequest {
    use csi::volume_capability::access_mode::Mode;
    req.volume_capability.as_mut().unwrap().access_mode =
        Some(csi::volume_capability::AccessMode { mode: Mode::MultiNodeReaderOnly as i32 });
    req
}

/// The stage of a volume published as [`reader_only`] says: MULTI_NODE_READER_ONLY.
fn reader_only_stage(mut req: csi::NodeStageVolumeRequest) -> csi::NodeStageVolumeRequest {
    use csi::volume_capability::access_mode::Mode;
    req.volume_capability.as_mut().unwrap().access_mode =
        Some(csi::volume_capability::AccessMode { mode: Mode::MultiNodeReaderOnly as i32 });
    req
}

#[tokio::test]
async fn a_read_only_access_mode_stays_read_only_across_a_restage() {
    let e = Env::new();
    let a = e.target("pod-a");
    e.node.stage(reader_only_stage(e.stage_req())).await.unwrap();
    e.node.publish(reader_only(e.publish_req(&a, false))).await.unwrap();
    assert_eq!(e.calls("bind"), vec![format!("bind {} {} ro", e.staging().display(), a.display())]);

    Mounts::unmount(&*e.rec, &e.staging(), false).unwrap();
    e.rec.clear_calls();
    e.node.stage(reader_only_stage(e.stage_req())).await.unwrap();
    assert_eq!(
        e.calls("bind"),
        vec![format!("bind {} {} ro", e.staging().display(), a.display())],
        "the target was published read-only and must come back read-only"
    );
}

#[tokio::test]
async fn a_read_only_bind_is_compatible_with_a_read_only_republish() {
    let e = Env::new();
    let a = e.target("pod-a");
    e.node.stage(reader_only_stage(e.stage_req())).await.unwrap();
    e.node.publish(reader_only(e.publish_req(&a, false))).await.unwrap();
    e.rec.clear_calls();
    // The target holds a read-only bind of this volume; asking for exactly that is OK (CSI:
    // "published at the specified target_path, and is compatible ... MUST reply 0 OK").
    e.node.publish(reader_only(e.publish_req(&a, true))).await.unwrap();
    assert_eq!(e.calls("bind"), Vec::<String>::new());
}

#[tokio::test]
async fn a_failed_restage_keeps_the_publications_and_the_next_one_rebinds_them() {
    let e = Env::new();
    let a = e.target("pod-a");
    e.node.stage(e.stage_req()).await.unwrap();
    e.node.publish(e.publish_req(&a, false)).await.unwrap();
    Mounts::unmount(&*e.rec, &e.staging(), false).unwrap();

    e.rec.fail_next("mount", Errno::EIO);
    err_of(e.node.stage(e.stage_req()).await, ErrorKind::Internal);
    let st = e.node.store().load(VOL).unwrap().expect("the publications are still recorded");
    assert_eq!((st.phase, st.published.len()), (Phase::Staging, 1));
    err_of(e.node.publish(e.publish_req(&e.target("pod-b"), false)).await, ErrorKind::FailedPrecondition);
    assert_eq!(e.restarted().reconcile().unwrap().unhealthy, 1);

    e.rec.clear_calls();
    e.node.stage(e.stage_req()).await.unwrap();
    assert_eq!(e.calls("mount"), vec![tmpfs_mount(&e.staging(), 16)]);
    assert_eq!(e.calls("bind"), vec![format!("bind {} {}", e.staging().display(), a.display())]);
    assert_eq!(e.node.store().load(VOL).unwrap().unwrap().phase, Phase::Staged);
}

#[tokio::test]
async fn a_failed_bind_records_no_publication_and_a_retry_works() {
    let e = Env::new();
    let a = e.target("pod-a");
    e.node.stage(e.stage_req()).await.unwrap();
    e.rec.fail_next("bind", Errno::EPERM);
    err_of(e.node.publish(e.publish_req(&a, false)).await, ErrorKind::Internal);
    assert!(e.node.store().load(VOL).unwrap().unwrap().published.is_empty());
    assert_eq!(mount_points(&e.rec), vec![e.staging()]);
    e.node.publish(e.publish_req(&a, false)).await.unwrap();
    assert_eq!(mount_points(&e.rec), vec![e.staging(), a.clone()]);
}

#[tokio::test]
async fn a_busy_target_is_detached_lazily_and_a_target_kubelet_removed_is_forgotten() {
    let e = Env::new();
    let (a, b) = (e.target("pod-a"), e.target("pod-b"));
    e.node.stage(e.stage_req()).await.unwrap();
    e.node.publish(e.publish_req(&a, false)).await.unwrap();
    e.node.publish(e.publish_req(&b, false)).await.unwrap();

    e.rec.clear_calls();
    e.rec.fail_next("unmount", Errno::EBUSY);
    e.node.unpublish(e.unpublish_req(&a)).await.unwrap();
    let a_shown = a.display();
    assert_eq!(e.calls("unmount"), vec![format!("unmount {a_shown}"), format!("unmount {a_shown} lazy")]);
    assert!(!mount_points(&e.rec).contains(&a));

    // The bind at B went away without NodeUnpublishVolume (a reboot of the pod's mounts, a
    // manual umount): unstage no longer waits for it.
    Mounts::unmount(&*e.rec, &b, false).unwrap();
    e.unstage_leaves_nothing().await;
}

#[tokio::test]
async fn reconcile_cleans_state_from_an_earlier_boot() {
    let e = Env::new();
    let a = e.target("pod-a");
    e.node.stage(e.stage_req()).await.unwrap();
    e.node.publish(e.publish_req(&a, false)).await.unwrap();
    let mut st = e.node.store().load(VOL).unwrap().unwrap();
    st.boot_id = "an-earlier-boot".into();
    e.node.store().save(&st).unwrap();

    let report = e.restarted().reconcile().unwrap();
    assert_eq!((report.adopted, report.unhealthy, report.cleaned), (0, 0, 1));
    assert_eq!(mount_points(&e.rec), Vec::<PathBuf>::new(), "stale staging and target mounts are cleared");
    assert!(e.on_disk().is_none());
}

#[tokio::test]
async fn an_unreadable_state_file_is_reported_and_left_alone() {
    let e = Env::new();
    e.node.stage(e.stage_req()).await.unwrap();
    let path = e.node.store().path(VOL);
    e.rec.add_file(&path, b"{ not json", None);
    let report = e.restarted().reconcile().unwrap();
    assert_eq!((report.adopted, report.unreadable), (0, 1));
    assert!(e.rec.exists(&path));
    assert_eq!(mount_points(&e.rec), vec![e.staging()]);
}

#[tokio::test]
async fn a_torn_state_file_of_an_earlier_boot_is_removed() {
    let e = Env::new();
    e.node.stage(e.stage_req()).await.unwrap();
    let path = e.node.store().path(VOL);
    let long_ago = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000);
    e.rec.add_file(&path, b"", Some(long_ago));
    let report = e.restarted().reconcile().unwrap();
    assert_eq!((report.cleaned, report.unreadable), (1, 0));
    assert!(!e.rec.exists(&path), "nothing of an earlier boot survives, so its torn record goes");
}

#[tokio::test]
async fn host_directories_no_volume_claims_are_swept_at_start() {
    let e = Env::new();
    e.node.stage(e.stage_req()).await.unwrap();
    let orphan = e.config.state_dir.join("cache/volumes/0123456789abcdef");
    e.rec.add_dir(&orphan);
    // The FUSE files directory (this daemon's own: derived from its state directory) too.
    let fuse_files = e.config.fuse_files();
    assert!(fuse_files.to_string_lossy().starts_with("/run/mounthost/fuse-"), "{}", fuse_files.display());
    let fuse_orphan = fuse_files.join("fedcba9876543210");
    e.rec.add_dir(&fuse_orphan);
    e.rec.add_dir(&fuse_files.join(crate::volume::dirs::volume_key(VOL)));
    e.rec.clear_calls();
    let report = e.restarted().reconcile().unwrap();
    assert_eq!((report.adopted, report.orphans), (1, 2));
    let removed: Vec<String> = e.rec.calls().into_iter().filter(|c| c.starts_with("remove-tree")).collect();
    let want = [&orphan, &fuse_orphan].map(|p| format!("remove-tree {}", p.display()));
    assert_eq!(removed, want, "only the unclaimed directories");
}

/// What the daemon's supervisor does in one wake-up, serially: restart every broken volume.
/// Returns (healed, failed).
fn heal_all(node: &Node) -> (usize, usize) {
    let outcomes: Vec<Option<bool>> = node.broken().iter().map(|id| node.heal_one(id)).collect();
    let count = |want: bool| outcomes.iter().filter(|o| **o == Some(want)).count();
    (count(true), count(false))
}

/// A seaweedfs volume: its plan spawns `weed mount` (simulated by the recording executor).
fn weed_stage_req(e: &Env) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_context: ctx(&[("plugin", "seaweedfs"), ("filer", "127.0.0.1:8888"), ("path", "/buckets/vol")]),
        ..e.stage_req()
    }
}

#[tokio::test]
async fn a_fuse_process_runs_in_its_volume_cgroup_and_unstage_removes_it() {
    let e = Env::new();
    e.node.stage(weed_stage_req(&e)).await.unwrap();
    let st = e.node.store().load(VOL).unwrap().unwrap();
    let pid = st.process.unwrap();
    assert_eq!(e.rec.groups().unwrap(), vec![group(VOL)]);
    assert_eq!(e.rec.executable(&pid).unwrap(), Path::new(crate::config::DEFAULT_WEED));
    e.node.unstage(e.unstage_req()).await.unwrap();
    assert!(e.rec.groups().unwrap().is_empty(), "the cgroup goes with the volume");
    assert!(!e.rec.is_alive(&pid));
}

#[tokio::test]
async fn reconcile_kills_processes_in_cgroups_no_volume_claims() {
    let e = Env::new();
    e.node.stage(weed_stage_req(&e)).await.unwrap();
    // A daemon killed between spawning a FUSE process and recording its volume.
    let orphan = e.rec.orphan_in_group("mounthost/00112233aabbccdd");
    // Another daemon's group (its own parent) and a group no parent of this daemon holds.
    let others = [e.rec.orphan_in_group("mounthost-0123456789abcdef/00112233aabbccdd"), e.rec.orphan_in_group("x")];
    let report = e.restarted().reconcile().unwrap();
    assert_eq!((report.adopted, report.orphan_processes), (1, 1));
    assert!(!e.rec.is_alive(&crate::exec::process::ProcessId { pid: orphan, start_time: 1 }));
    assert_eq!(e.rec.groups().unwrap(), vec![group(VOL)], "the claimed group stays");
    for pid in others {
        assert!(e.rec.is_alive(&crate::exec::process::ProcessId { pid, start_time: 1 }), "not this daemon's to kill");
    }
}

#[tokio::test]
async fn rolling_back_an_interrupted_stage_kills_the_process_it_never_recorded() {
    let e = Env::new();
    e.node.stage(weed_stage_req(&e)).await.unwrap();
    let mut st = e.node.store().load(VOL).unwrap().unwrap();
    let pid = st.process.take().unwrap();
    st.phase = Phase::Staging;
    e.node.store().save(&st).unwrap();
    let report = e.restarted().reconcile().unwrap();
    assert_eq!(report.cleaned, 1);
    assert!(!e.rec.is_alive(&pid), "the kernel's cgroup named the unrecorded process");
    assert!(e.rec.groups().unwrap().is_empty());
    assert_eq!(mount_points(&e.rec), Vec::<PathBuf>::new());
}

#[tokio::test]
async fn a_recorded_pid_running_another_program_is_forgotten_not_signalled() {
    let e = Env::new();
    e.node.stage(weed_stage_req(&e)).await.unwrap();
    let mut st = e.node.store().load(VOL).unwrap().unwrap();
    let pid = st.process.unwrap();
    for step in &mut st.plan.steps {
        if let crate::plan::Step::SpawnFuse { executable, .. } = step {
            *executable = "/usr/local/bin/another-weed".into();
        }
    }
    e.node.store().save(&st).unwrap();
    e.rec.clear_calls();
    let report = e.restarted().reconcile().unwrap();
    assert_eq!((report.adopted, report.unhealthy), (0, 1));
    assert_eq!(e.on_disk().unwrap().process, None);
    assert!(e.calls("stop").is_empty(), "never signal a pid that runs something else");
    assert!(e.rec.is_alive(&pid));
}

#[tokio::test]
async fn the_supervisor_restarts_a_dead_fuse_process_into_a_fresh_group() {
    let e = Env::new();
    let a = e.target("pod-a");
    e.node.stage(weed_stage_req(&e)).await.unwrap();
    e.node.publish(e.publish_req(&a, false)).await.unwrap();
    let old = e.node.store().load(VOL).unwrap().unwrap().process.unwrap();
    assert_eq!(e.node.survey().watch, vec![(VOL.to_string(), old)]);
    assert!(e.node.broken().is_empty());
    e.rec.kill(old.pid);
    assert_eq!(e.node.broken(), vec![VOL.to_string()]);
    e.rec.clear_calls();
    assert_eq!(heal_all(&e.node), (1, 0));
    let st = e.node.store().load(VOL).unwrap().unwrap();
    let new = st.process.unwrap();
    assert_ne!(new, old);
    assert_eq!((st.restarts, st.phase), (1, Phase::Staged));
    assert_eq!(e.rec.groups().unwrap(), vec![group(VOL)]);
    assert!(e.calls("bind").iter().any(|c| c.contains(&s(&a))), "the target is bound again: {:?}", e.rec.calls());
    assert!(e.node.broken().is_empty());
}

#[tokio::test]
async fn a_call_whose_caller_goes_away_still_finishes_under_its_lock() {
    let e = Env::new();
    // The caller gives up at once (kubelet's deadline, a killed front).
    let gone = tokio::time::timeout(std::time::Duration::from_micros(1), e.node.stage(e.stage_req())).await;
    assert!(gone.is_err(), "the caller left before the stage could finish");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let st = e.node.store().load(VOL).unwrap();
        if st.is_some_and(|st| st.phase == Phase::Staged) {
            break;
        }
        assert!(std::time::Instant::now() < until, "the abandoned stage never finished");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(e.calls("mount"), vec![tmpfs_mount(&e.staging(), 16)]);
    // The record is saved an instant before the lock is released: like kubelet, retry Aborted.
    loop {
        match e.node.stage(e.stage_req()).await {
            Ok(()) => break,
            Err(err) if err.kind == ErrorKind::Aborted && std::time::Instant::now() < until => {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await
            }
            Err(err) => panic!("the retry finds the finished stage: {err:?}"),
        }
    }
    assert_eq!(e.calls("mount").len(), 1, "and runs nothing again");
}

#[tokio::test]
async fn temporary_files_of_a_killed_writer_are_removed_at_start() {
    let e = Env::new();
    e.node.stage(e.stage_req()).await.unwrap();
    let volumes = e.node.store().path(VOL).parent().unwrap().to_path_buf();
    let stray = volumes.join(format!(".{}.json.tmp.4242.7", volume_key(VOL)));
    e.rec.add_file(&stray, b"{\"half", None);
    let report = e.restarted().reconcile().unwrap();
    assert_eq!((report.adopted, report.cleaned), (1, 1));
    assert!(!e.rec.exists(&stray));
}

#[tokio::test]
async fn a_restage_that_cannot_rebind_its_targets_is_not_recorded_staged() {
    let e = Env::new();
    let a = e.target("pod-a");
    e.node.stage(weed_stage_req(&e)).await.unwrap();
    e.node.publish(e.publish_req(&a, false)).await.unwrap();
    let old = e.node.store().load(VOL).unwrap().unwrap().process.unwrap();
    e.rec.kill(old.pid);
    // The re-bind fails (as if the daemon died there): the record must not claim `staged`, or a
    // restarted daemon would adopt a volume whose pod target still holds the dead mount.
    e.rec.fail_next("bind", Errno::EIO);
    assert_eq!(heal_all(&e.node), (0, 1));
    let st = e.node.store().load(VOL).unwrap().unwrap();
    assert_eq!(st.phase, Phase::Staging);
    assert!(st.published.contains_key(&a));
    assert!(!e.node.health(&st).healthy);
    assert_eq!(e.restarted().reconcile().unwrap().unhealthy, 1);
    assert_eq!(e.node.heal_one(VOL), Some(true), "the next restart finishes the job");
    let st = e.node.store().load(VOL).unwrap().unwrap();
    assert_eq!(st.phase, Phase::Staged);
    assert!(mount_points(&e.rec).contains(&a));
}

#[tokio::test]
async fn after_giving_up_a_kubelet_restage_puts_the_volume_back_under_supervision() {
    let e = Env::new();
    e.node.stage(weed_stage_req(&e)).await.unwrap();
    e.rec.kill(e.node.store().load(VOL).unwrap().unwrap().process.unwrap().pid);
    for _ in 0..super::heal::MAX_FAILURES {
        e.rec.fail_next("spawn-fuse", Errno::ENOENT);
        assert_eq!(e.node.heal_one(VOL), Some(false));
    }
    assert!(e.node.gave_up(VOL).is_some());
    assert!(e.node.broken().is_empty(), "given up: no more restarts");
    e.node.stage(weed_stage_req(&e)).await.expect("kubelet's NodeStageVolume rebuilds it");
    assert_eq!(e.node.gave_up(VOL), None);
    e.rec.kill(e.node.store().load(VOL).unwrap().unwrap().process.unwrap().pid);
    assert_eq!(e.node.broken(), vec![VOL.to_string()], "a later crash is restarted again");
}

#[tokio::test]
async fn the_recording_sees_every_effect_of_a_volume_s_life_state_and_secrets_included() {
    let e = Env::new();
    let key = volume_key(VOL);
    let state = e.config.state_dir.clone();
    let (cache, run) = (state.join(format!("cache/volumes/{key}")), state.join(format!("run/{key}")));
    let (record, kept) = (state.join(format!("volumes/{key}.json")), state.join(format!("secrets/{key}.json")));
    let a = e.target("pod-a");
    let mut stage = weed_stage_req(&e);
    stage.secrets = [("jwtSigningKey".to_string(), "s3cr3t-signing-key".to_string())].into();
    e.node.stage(stage).await.unwrap();
    let pid = e.node.store().load(VOL).unwrap().unwrap().process.unwrap().pid;
    e.node.publish(e.publish_req(&a, true)).await.unwrap();
    e.node.unpublish(e.unpublish_req(&a)).await.unwrap();
    e.node.unstage(e.unstage_req()).await.unwrap();
    let weed = crate::config::DEFAULT_WEED;
    let staging = e.staging();
    let d = |p: &Path| p.display().to_string();
    let calls = e.rec.calls();
    let spawn = calls.iter().find(|c| c.starts_with("spawn-fuse")).expect("a spawn").clone();
    assert!(
        spawn.starts_with(&format!("spawn-fuse {weed} ")) && spawn.ends_with(&format!("-> {}", d(&staging))),
        "{spawn}"
    );
    assert!(!calls.iter().any(|c| c.contains("s3cr3t")), "no secret value in any recorded effect: {calls:#?}");
    let want = vec![
        // NodeStageVolume: the record and the kept secret before the first syscall.
        format!("write {}", d(&record)),
        format!("private-dir {}", d(&state.join("secrets"))),
        format!("write-secret {}", d(&kept)),
        format!("mkdir {}", d(&staging)),
        format!("private-dir {}", d(&cache)),
        format!("private-dir {}", d(&run)),
        format!("write {}", d(&run.join("weed.log"))),
        spawn,
        format!("write {}", d(&record)),
        // NodePublishVolume: one bind, one write.
        format!("mkdir {}", d(&a)),
        format!("bind {} {} ro", d(&staging), d(&a)),
        format!("write {}", d(&record)),
        // NodeUnpublishVolume.
        format!("unmount {}", d(&a)),
        format!("remove {}", d(&a)),
        format!("write {}", d(&record)),
        // NodeUnstageVolume: `unstaging` first, then the tear-down, then the record and secrets go.
        format!("write {}", d(&record)),
        format!("stop {pid}"),
        format!("release-group mounthost/{key}"),
        format!("unmount {}", d(&staging)),
        format!("remove-tree {}", d(&cache)),
        format!("remove-tree {}", d(&run)),
        format!("remove {}", d(&kept)),
        format!("remove {}", d(&record)),
    ];
    assert_eq!(calls, want);
    // And nothing is left of the volume in the simulated node.
    for p in [&cache, &run, &record, &kept, &a] {
        assert!(!e.rec.exists(p), "{} is gone", p.display());
    }
    assert!(mount_points(&e.rec).is_empty() && e.rec.groups().unwrap().is_empty());
}

#[tokio::test]
async fn an_ephemeral_volume_left_without_targets_by_a_crash_is_unstaged_at_start() {
    let e = Env::new();
    let target = e.target("pod-e");
    let id = "csi-crashed";
    let req = ephemeral_req(id, &target, &[("plugin", "tmpfs")]);
    e.node.publish(req).await.unwrap();
    // The last unpublish recorded no targets, then the daemon died before its unstage.
    Mounts::unmount(&*e.rec, &target, false).unwrap();
    let mut st = e.node.store().load(id).unwrap().unwrap();
    st.published.clear();
    e.node.store().save(&st).unwrap();
    let node = e.restarted();
    let report = node.reconcile().unwrap();
    assert_eq!((report.adopted, report.cleaned), (0, 1));
    assert!(node.store().load(id).unwrap().is_none());
    assert_eq!(mount_points(&e.rec), Vec::<PathBuf>::new(), "its staging mount is gone");
    assert!(!e.rec.exists(&e.config.state_dir.join("ephemeral").join(volume_key(id))));
}

#[tokio::test]
async fn a_restart_skips_and_forgets_targets_whose_pod_is_gone() {
    let e = Env::new();
    let (a, b) = (e.target("pod-a"), e.target("pod-b"));
    e.node.stage(weed_stage_req(&e)).await.unwrap();
    e.node.publish(e.publish_req(&a, false)).await.unwrap();
    e.node.publish(e.publish_req(&b, false)).await.unwrap();
    e.rec.kill(e.node.store().load(VOL).unwrap().unwrap().process.unwrap().pid);
    // Pod a went away while the FUSE process was dead: kubelet unmounted and removed its dir.
    Mounts::unmount(&*e.rec, &a, false).unwrap();
    let pod_a = e.kubelet.join("pods/pod-a");
    crate::exec::Files::remove_tree(&*e.rec, &pod_a).unwrap();
    assert_eq!(heal_all(&e.node), (1, 0), "pod a's absence does not keep the volume broken");
    let st = e.node.store().load(VOL).unwrap().unwrap();
    assert_eq!(st.phase, Phase::Staged);
    assert_eq!(st.published.keys().collect::<Vec<_>>(), vec![&b], "a is forgotten");
    assert!(mount_points(&e.rec).contains(&b), "b is bound to the new mount");
    assert!(!e.rec.exists(&pod_a), "nothing is made again for the gone pod");
    assert!(e.node.health(&st).healthy);
}

#[tokio::test]
async fn an_ephemeral_volume_whose_pods_are_all_gone_is_unstaged_by_its_restart() {
    let e = Env::new();
    let target = e.target("pod-e");
    let id = "csi-weed-inline";
    let req = ephemeral_req(
        id,
        &target,
        &[("plugin", "seaweedfs"), ("filer", "127.0.0.1:8888"), ("path", "/buckets/inline")],
    );
    e.node.publish(req).await.unwrap();
    let pid = e.node.store().load(id).unwrap().unwrap().process.unwrap();
    e.rec.kill(pid.pid);
    Mounts::unmount(&*e.rec, &target, false).unwrap();
    crate::exec::Files::remove_tree(&*e.rec, &e.kubelet.join("pods/pod-e")).unwrap();
    assert_eq!(heal_all(&e.node), (1, 0));
    assert!(e.node.store().load(id).unwrap().is_none(), "the record goes");
    assert_eq!(mount_points(&e.rec), Vec::<PathBuf>::new(), "its staging mount is gone");
    assert!(e.rec.groups().unwrap().is_empty(), "its cgroup and the restarted process are gone");
    assert!(!e.rec.exists(&e.config.state_dir.join("ephemeral").join(volume_key(id))));
}

/// A digest no plugin on the node has.
fn gone_digest() -> String {
    format!("sha256:{}", "0".repeat(64))
}

impl Env {
    /// The digest of the tmpfs build the node has now.
    async fn current_digest(&self) -> String {
        self.runtime.resolve("tmpfs", None).await.unwrap().digest.to_string()
    }

    /// What an image upgrade that rebuilt the plugin looks like to a staged volume: its record
    /// names a build the node no longer has.
    fn forget_recorded_build(&self) -> VolumeState {
        let mut st = self.node.store().load(VOL).unwrap().unwrap();
        st.digest = gone_digest();
        st.plan.digest = gone_digest();
        self.node.store().save(&st).unwrap();
        st
    }
}

#[tokio::test]
async fn a_volume_whose_recorded_build_is_gone_publishes_with_the_current_build_unless_pinned() {
    let e = Env::new();
    let (a, b) = (e.target("pod-a"), e.target("pod-b"));
    let current = e.current_digest().await;
    e.node.stage(e.stage_req()).await.unwrap();
    let st = e.node.store().load(VOL).unwrap().unwrap();
    assert_eq!((st.digest.as_str(), st.pinned), (current.as_str(), false), "recorded, not pinned");
    e.node.publish(e.publish_req(&a, false)).await.unwrap();
    e.forget_recorded_build();

    // A second pod after the upgrade: the current build plans, and its digest is recorded with
    // the new target (the one state write publish makes anyway).
    e.rec.clear_calls();
    e.node.publish(e.publish_req(&b, false)).await.unwrap();
    assert_eq!(e.calls("bind"), vec![format!("bind {} {}", e.staging().display(), b.display())]);
    let st = e.on_disk().unwrap();
    assert_eq!((st.digest.as_str(), st.pinned), (current.as_str(), false));
    assert_eq!(st.published.keys().collect::<Vec<_>>(), vec![&a, &b]);
    assert_eq!(st.plan.digest, gone_digest(), "the stage plan is what the old build made");

    // Unstage after the upgrade asks the current build too (the lookup it makes), and tears
    // everything down.
    let st = e.forget_recorded_build();
    let build = e.node.resolve_build(VOL, &st.plugin, Some(&st.digest), st.pinned).await.unwrap();
    assert_eq!(build.digest.to_string(), current);
    for t in [&a, &b] {
        e.node.unpublish(e.unpublish_req(t)).await.unwrap();
    }
    e.unstage_leaves_nothing().await;
}

#[tokio::test]
async fn a_volume_pinned_to_a_build_the_node_lacks_is_refused_and_left_as_it_is() {
    let e = Env::new();
    let a = e.target("pod-a");
    let current = e.current_digest().await;
    let pin = |mut req: csi::NodeStageVolumeRequest| {
        req.volume_context.insert("pluginDigest".into(), current.clone());
        req
    };
    e.node.stage(pin(e.stage_req())).await.unwrap();
    assert!(e.node.store().load(VOL).unwrap().unwrap().pinned, "the attribute pins the build");
    let before = e.forget_recorded_build();

    e.rec.clear_calls();
    let mut publish = e.publish_req(&a, false);
    publish.volume_context.insert("pluginDigest".into(), gone_digest());
    for req in [e.publish_req(&a, false), publish] {
        let err = err_of(e.node.publish(req).await, ErrorKind::FailedPrecondition);
        for part in [VOL, "pinned", &gone_digest(), "not installed on this node", &current, &s(&e.config.plugin_dir)] {
            assert!(err.message.contains(part), "{part:?} missing in {}", err.message);
        }
    }
    assert_eq!(e.rec.calls(), Vec::<String>::new(), "nothing mounted, nothing written");
    assert_eq!(e.on_disk(), Some(before.clone()));

    // A record from before the flag existed is pinned by the attribute kubelet sends again.
    let mut legacy = before.clone();
    legacy.pinned = false;
    e.node.store().save(&legacy).unwrap();
    let mut publish = e.publish_req(&a, false);
    publish.volume_context.insert("pluginDigest".into(), gone_digest());
    err_of(e.node.publish(publish).await, ErrorKind::FailedPrecondition);
    assert_eq!(e.on_disk(), Some(legacy));

    // Unstage never depends on a plugin: the host tears down alone.
    e.unstage_leaves_nothing().await;
}

#[tokio::test]
async fn a_restage_after_the_recorded_build_is_gone_uses_the_current_build() {
    let e = Env::new();
    let a = e.target("pod-a");
    let current = e.current_digest().await;
    e.node.stage(e.stage_req()).await.unwrap();
    e.node.publish(e.publish_req(&a, false)).await.unwrap();
    e.forget_recorded_build();

    // Healthy: kubelet's restage is a no-op and asks no plugin.
    e.rec.clear_calls();
    e.node.stage(e.stage_req()).await.unwrap();
    assert_eq!(e.rec.calls(), Vec::<String>::new());
    assert_eq!(e.on_disk().unwrap().digest, gone_digest());

    // Broken (its mount went): the restage plans with the current build and records it.
    Mounts::unmount(&*e.rec, &e.staging(), false).unwrap();
    e.rec.clear_calls();
    e.node.stage(e.stage_req()).await.unwrap();
    assert_eq!(e.calls("mount"), vec![tmpfs_mount(&e.staging(), 16)]);
    assert_eq!(e.calls("bind"), vec![format!("bind {} {}", e.staging().display(), a.display())]);
    let st = e.on_disk().unwrap();
    assert_eq!(
        (st.phase, st.digest.as_str(), st.plan.digest.as_str(), st.pinned),
        (Phase::Staged, current.as_str(), current.as_str(), false)
    );

    // The same restage of a pinned volume is refused and changes nothing.
    let e = Env::new();
    let mut pinned = e.stage_req();
    pinned.volume_context.insert("pluginDigest".into(), current.clone());
    e.node.stage(pinned).await.unwrap();
    let before = e.forget_recorded_build();
    Mounts::unmount(&*e.rec, &e.staging(), false).unwrap();
    e.rec.clear_calls();
    let mut restage = e.stage_req();
    restage.volume_context.insert("pluginDigest".into(), gone_digest());
    let err = err_of(e.node.stage(restage).await, ErrorKind::FailedPrecondition);
    assert!(err.message.contains("not installed on this node"), "{}", err.message);
    assert_eq!(e.rec.calls(), Vec::<String>::new());
    assert_eq!(e.on_disk(), Some(before));
}

/// After a rollback: a record written by a newer daemon (the next schema, with a field this
/// daemon does not know) is refused by every call naming both versions and never rewritten, while the
/// other volumes are adopted and served as usual.
#[tokio::test]
async fn a_record_of_a_newer_schema_is_refused_left_as_it_is_and_the_others_served() {
    let e = Env::new();
    e.node.stage(e.stage_req()).await.unwrap();
    let future_id = "tmpfs~pvc-future";
    let mut doc: serde_json::Value = serde_json::to_value(e.node.store().load(VOL).unwrap().unwrap()).unwrap();
    doc["version"] = (crate::volume::state::SCHEMA_VERSION + 1).into();
    doc["volumeId"] = future_id.into();
    doc["aFieldOfSchema3"] = serde_json::json!({"kept": true});
    let path = e.node.store().path(future_id);
    let bytes = doc.to_string().into_bytes();
    e.rec.add_file(&path, &bytes, None);

    let node = e.restarted();
    let report = node.reconcile().unwrap();
    assert_eq!((report.adopted, report.unreadable), (1, 1), "{report:?}");
    let stage = csi::NodeStageVolumeRequest { volume_id: future_id.into(), ..e.stage_req() };
    let unstage = csi::NodeUnstageVolumeRequest { volume_id: future_id.into(), ..e.unstage_req() };
    for err in [node.stage(stage).await.unwrap_err(), node.unstage(unstage).await.unwrap_err()] {
        assert_eq!(err.kind, ErrorKind::FailedPrecondition, "{}", err.message);
        assert!(
            err.message.contains(&format!(
                "schema version {}, written by a newer mounthost; this daemon reads versions 1 to {}",
                crate::volume::state::SCHEMA_VERSION + 1,
                crate::volume::state::SCHEMA_VERSION
            )),
            "{}",
            err.message
        );
    }
    assert_eq!(e.rec.read_file(&path).unwrap().unwrap(), bytes, "never rewritten, never removed");
    // What it mentions stays taken: no prune evicts a blob it names.
    let digest = doc["digest"].as_str().unwrap().to_string();
    assert!(node.cache_in_use().unwrap().contains_key(&digest), "{digest}");
    node.publish(e.publish_req(&e.target("pod-a"), false)).await.unwrap();
    assert_eq!(node.store().load(VOL).unwrap().unwrap().published.len(), 1, "the other volume is served");
}

/// The node's mirror (`--registry-mirror`) for a volume that names none: credentials given for
/// the registry the reference names never reach it (a dockerconfigjson entry for the mirror's
/// own host does), and plain HTTP to it (listed insecure) only when no credentials cross it or
/// the volume asked for plain HTTP itself.
#[tokio::test]
async fn a_node_mirror_gets_only_its_own_credentials_and_plain_http_only_without_them() {
    use crate::oci::Credentials;
    use crate::plan::{RegistryAuth, Step};
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(std::fs::canonicalize(dir.path()).unwrap().join("state"));
    config.registries.mirrors = [("registry.example.com".to_string(), "mirror.local:5000".to_string())].into();
    config.registries.insecure = ["mirror.local:5000".to_string(), "own.local:5000".to_string()].into();
    let runtime = Arc::new(PluginRuntime::new(config.runtime()).unwrap());
    let node = Node::new(config, runtime, Arc::new(Recording::new())).unwrap();
    let basic = RegistryAuth::Basic { username_key: "username".into(), password_key: "password".into() };
    let docker = RegistryAuth::DockerConfig(".dockerconfigjson".into());
    let secrets: crate::secrets::Secrets = [
        ("username".to_string(), "registry-user".to_string()),
        ("password".to_string(), "registry-password".to_string()),
        (
            ".dockerconfigjson".to_string(),
            r#"{"auths":{"mirror.local:5000":{"username":"m","password":"mp"}}}"#.to_string(),
        ),
    ]
    .into_iter()
    .collect();
    let step = |reference: &str, mirror: Option<&str>, auth: &RegistryAuth, insecure: bool| Step::Resolve {
        reference: reference.into(),
        mirror: mirror.map(str::to_string),
        auth: auth.clone(),
        insecure,
    };
    // The registry's username and password are not sent to the node's mirror: anonymous, and
    // then plain HTTP to it is fine.
    let src = node.source(&step("registry.example.com/m/x:v1", None, &basic, false), &secrets).unwrap();
    assert_eq!(src.mirror.as_deref(), Some("mirror.local:5000"));
    assert_eq!(src.credentials, Credentials::Anonymous);
    assert!(src.insecure);
    // The mirror's own dockerconfigjson entry is sent, over TLS: the volume asked for none.
    let src = node.source(&step("registry.example.com/m/x:v1", None, &docker, false), &secrets).unwrap();
    assert_eq!(src.credentials, Credentials::Basic { username: "m".into(), password: "mp".into() });
    assert!(!src.insecure, "credentials never cross plain HTTP the volume did not ask for");
    // A volume's own mirror gets its credentials as before (the volume named it).
    let src =
        node.source(&step("registry.example.com/m/x:v1", Some("own.local:5000"), &basic, true), &secrets).unwrap();
    assert_eq!(src.mirror.as_deref(), Some("own.local:5000"));
    assert_eq!(
        src.credentials,
        Credentials::Basic { username: "registry-user".into(), password: "registry-password".into() }
    );
    // Another registry: no mirror, its own credentials.
    let src = node.source(&step("other.example.com/m/x:v1", None, &basic, false), &secrets).unwrap();
    assert_eq!((src.mirror, src.insecure), (None, false));
    assert!(matches!(src.credentials, Credentials::Basic { .. }));
}
