//! End to end, as root, in a private mount namespace: dynamic volumes. Model volumes with
//! `dynamic: "true"` are staged and published through the real front and host daemon, with
//! kubelet's real path lengths (longer than a unix socket path may be), and a pod's requests go
//! to the socket in its own volume; models come from a real `docker-registry`.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::dynamic::*;
use common::registry::{PushedModel, Registry, RegistryOptions};
use common::{guarded, in_private_namespace, mounts_below};
use mounthost::proto::csi;
use serde_json::{Value, json};

/// kubelet-shaped names: a pod uid and a PV name as long as real ones.
const POD_A: &str = "5b0d5f8e-1c2a-4f3b-9d8e-7a6b5c4d3e2f";
const POD_B: &str = "9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b";
const PV_A: &str = "pvc-0f3c2a4e-8b1d-4c55-9e7a-3d2b1c0a9f81";
const PV_B: &str = "pvc-7a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";

fn run(node: &DynNode, body: impl AsyncFnOnce()) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    guarded(&node.dirs, || rt.block_on(body()));
}

/// A process in a mount namespace of its own with slave propagation, started now (a stand-in
/// for a container whose volume mount has `mountPropagation: HostToContainer`): on a line on
/// its stdin it lists the files below `dir` as it sees them.
struct Container {
    child: std::process::Child,
}

impl Container {
    fn start(dir: &Path) -> Container {
        let script =
            format!("while read x; do find {} -type f | sort; echo END; done", shell_quote(&dir.display().to_string()));
        let child = std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "slave", "--", "sh", "-c", &script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        Container { child }
    }

    fn files(&mut self) -> Vec<String> {
        self.child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
        let out = self.child.stdout.as_mut().unwrap();
        let mut text = Vec::new();
        let mut byte = [0u8; 1];
        while !text.ends_with(b"END\n") {
            assert_eq!(out.read(&mut byte).unwrap(), 1, "the container stand-in ended");
            text.push(byte[0]);
        }
        String::from_utf8(text).unwrap().lines().filter(|l| *l != "END").map(str::to_string).collect()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[test]
fn a_pod_mounts_models_into_its_own_volume_and_nothing_else() {
    if !in_private_namespace("a_pod_mounts_models_into_its_own_volume_and_nothing_else") {
        return;
    }
    let registry = Registry::start(RegistryOptions::default());
    let base = tiny_model(&registry, "models/base", "v1", b"base weights");
    let extra = tiny_model(&registry, "models/extra", "v1", &vec![7u8; 3 << 20]);
    let other = tiny_model(&registry, "models/other", "v1", b"other weights");
    let node = DynNode::start(&registry);
    run(&node, async || {
        let mut csi = node.node().await;
        let a = node.dynamic_volume(&mut csi, PV_A, POD_A, &dynamic_ctx(&base.reference)).await;
        let b = node.dynamic_volume(&mut csi, PV_B, POD_B, &dynamic_ctx(&base.reference)).await;
        assert!(a.join("csi.sock").as_os_str().len() > 108, "the test uses kubelet-length paths");

        // The published directory: the volume's own files, the socket, the mounts folder.
        let meta = std::fs::symlink_metadata(a.join("csi.sock")).unwrap();
        assert!(std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()));
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777, 0o666);
        assert!(a.join("mounts").is_dir());
        assert_eq!(regular_files(&snapshot(&a.join("volume"))), files_of(&base));

        // CreateVolume carries the dynamic settings from the StorageClass into the volume's
        // context, and refuses bad ones.
        let mut controller = mounthost::proto::csi::controller_client::ControllerClient::new(
            mounthost::unpriv::grpc::channel(&node.dirs.csi_sock),
        );
        let create = |params: &[(&str, &str)]| csi::CreateVolumeRequest {
            name: "pvc-dynamic".into(),
            volume_capabilities: vec![common::multi_writer()],
            parameters: dynamic_ctx(&base.reference)
                .into_iter()
                .chain(params.iter().map(|(k, v)| (k.to_string(), v.to_string())))
                .collect(),
            ..Default::default()
        };
        let vol = controller.create_volume(create(&[("dynamicPlugins", "model")])).await.unwrap().into_inner();
        let ctx = vol.volume.unwrap().volume_context;
        assert_eq!((ctx["dynamic"].as_str(), ctx["dynamicPlugins"].as_str()), ("true", "model"), "{ctx:?}");
        // A pinned build travels with the volume too.
        let list = std::process::Command::new(env!("CARGO_BIN_EXE_mounthost"))
            .args(["--state-dir", &node.dirs.state.display().to_string(), "plugin", "list"])
            .output()
            .unwrap();
        let list: Value = serde_json::from_slice(&list.stdout).unwrap();
        let digest = list.as_array().unwrap().iter().find(|p| p["name"] == "model").unwrap()["digest"].clone();
        let pinned = create(&[("pluginDigest", digest.as_str().unwrap())]);
        let vol = controller.create_volume(pinned).await.unwrap().into_inner();
        assert_eq!(vol.volume.unwrap().volume_context["pluginDigest"], digest.as_str().unwrap());
        for bad in [("dynamic", "yes"), ("dynamicPlugins", "Not A Plugin")] {
            let err = controller.create_volume(create(&[bad])).await.unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{bad:?}: {err:?}");
        }

        // One pod per dynamic volume: a second target is refused.
        let second = node.dirs.target(POD_B, PV_A);
        let req = common::publish_req(PV_A, &node.dirs.staging(PV_A), &second, true, &dynamic_ctx(&base.reference));
        let err = csi.node_publish_volume(req).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
        assert!(!second.exists());

        // A "container" started before the mount sees it.
        let mut container = Container::start(&a.join("mounts"));
        assert_eq!(container.files(), Vec::<String>::new());

        let v = mount(&a, "extra", &extra.reference);
        assert_eq!(v["path"], "mounts/extra", "{v}");
        assert_eq!(regular_files(&snapshot(&a.join("mounts/extra"))), files_of(&extra));
        let write = std::fs::write(a.join("mounts/extra/config.json"), b"x").unwrap_err();
        assert_eq!(write.raw_os_error(), Some(libc_erofs()), "{write}");
        let seen = container.files();
        let mut want: Vec<String> =
            extra.files.iter().map(|(p, _, _)| a.join("mounts/extra").join(p).display().to_string()).collect();
        want.sort();
        assert_eq!(seen, want, "the container sees the mount made after it started");
        println!("checked: a container started before the mount sees its {} files", seen.len());

        // The same request again is fine; other parameters under the same id are not.
        let (status, v) =
            call(&a, "POST", "/mounts", Some(json!({"id": "extra", "parameters": {"reference": extra.reference}})));
        assert_eq!((status, v["state"].as_str()), (200, Some("ready")), "{v}");
        let (status, v) =
            call(&a, "POST", "/mounts", Some(json!({"id": "extra", "parameters": {"reference": other.reference}})));
        assert_eq!((status, v["code"].as_str()), (409, Some("conflict")), "{v}");

        // B gets a mount of its own; what B has is then fixed, byte for byte.
        mount(&b, "b-model", &other.reference);
        let (_, list) = call(&a, "GET", "/mounts", None);
        let ids: Vec<&str> = list["mounts"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["extra"], "A lists its own mounts only: {list}");
        let b_before = snapshot(&b);
        let b_list = call(&b, "GET", "/mounts", None);

        // A directory standing for /etc, with a file in it.
        let etc = node.dirs.root.path().join("etc-standin");
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::write(etc.join("passwd"), b"root:x:0:0\n").unwrap();
        let etc_before = snapshot(&etc);

        // Isolation: each attempt from A's socket, with the answer it must get.
        let long = "a".repeat(5000);
        let create = |id: &str| Some(json!({"id": id, "parameters": {"reference": other.reference}}));
        let attempts: Vec<(&str, &str, String, Option<Value>, u16)> = vec![
            ("id ..", "GET", "/mounts/..".into(), None, 400),
            ("id ../..", "GET", "/mounts/../../pods".into(), None, 400),
            ("path climbing out", "DELETE", "/mounts/../../../".into(), None, 400),
            ("encoded slash", "GET", "/mounts/..%2f..%2fb".into(), None, 400),
            ("encoded dots", "DELETE", "/mounts/%2e%2e".into(), None, 400),
            ("absolute path as id", "POST", "/mounts".into(), create("/etc"), 400),
            ("slash in id", "POST", "/mounts".into(), create("a/b"), 400),
            ("dots as id", "POST", "/mounts".into(), create(".."), 400),
            ("NUL in id", "POST", "/mounts".into(), create("a\u{0}b"), 400),
            ("very long id", "POST", "/mounts".into(), create(&long), 400),
            ("very long id in the path", "GET", format!("/mounts/{long}"), None, 400),
            ("B's mount id", "GET", "/mounts/b-model".into(), None, 404),
            ("delete B's mount id", "DELETE", "/mounts/b-model".into(), None, 404),
            (
                "a volume named in the body",
                "POST",
                "/mounts".into(),
                Some(json!({"id": "x", "volume": PV_B, "parameters": {"reference": other.reference}})),
                400,
            ),
            (
                "a plugin the volume does not allow",
                "POST",
                "/mounts".into(),
                Some(json!({"id": "x", "plugin": "seaweedfs", "parameters": {}})),
                403,
            ),
            (
                "a registry setting from the pod",
                "POST",
                "/mounts".into(),
                Some(json!({"id": "x", "parameters": {"reference": other.reference, "mirror": "evil:5000"}})),
                400,
            ),
            (
                "a registry the StorageClass does not grant",
                "POST",
                "/mounts".into(),
                Some(json!({"id": "x", "parameters": {"reference": "evil.example:5000/m:v1"}})),
                400,
            ),
            ("another path", "GET", "/volumes".into(), None, 404),
            ("a method the API has not", "PUT", "/mounts/extra".into(), None, 405),
        ];
        for (what, method, path, body, want) in &attempts {
            let (status, v) = call(&a, method, path, body.clone());
            assert_eq!(status, *want, "{what}: {method} {path}: {v}");
            assert!(v["code"].is_string() && v["message"].is_string(), "{what}: an error body: {v}");
            println!("checked: {what}: {method} {} -> {status} {}", &path[..path.len().min(40)], v["code"]);
        }

        // Links a pod plants in its own directory: where a mount goes, and instead of `mounts/`.
        std::os::unix::fs::symlink(&b, a.join("mounts/to-b")).unwrap();
        let v = mount(&a, "to-b", &other.reference);
        assert!(std::fs::symlink_metadata(a.join("mounts/to-b")).unwrap().is_dir(), "{v}");
        println!("checked: a link to B where a mount goes was replaced; the mount stayed in A");
        call(&a, "DELETE", "/mounts/to-b", None);
        // `mounts/` itself cannot be moved while it holds a mount; emptied, it can.
        call(&a, "DELETE", "/mounts/extra", None);
        std::fs::remove_dir(a.join("mounts")).unwrap();
        std::os::unix::fs::symlink(&etc, a.join("mounts")).unwrap();
        let v = mount(&a, "etc-link", &other.reference);
        assert!(std::fs::symlink_metadata(a.join("mounts")).unwrap().is_dir(), "{v}");
        assert_eq!(regular_files(&snapshot(&a.join("mounts/etc-link"))), files_of(&other));
        println!("checked: mounts/ replaced by a link to an /etc stand-in was made again; the mount stayed in A");
        std::fs::remove_dir_all(a.join("mounts")).unwrap_err();
        call(&a, "DELETE", "/mounts/etc-link", None);
        std::fs::remove_dir(a.join("mounts")).unwrap();
        std::fs::write(a.join("mounts"), b"a file").unwrap();
        mount(&a, "extra", &extra.reference);
        assert!(a.join("mounts/extra/config.json").is_file());
        println!("checked: mounts/ replaced by a file was made again");

        // `csi.sock` replaced by a regular file: the host serves it again.
        std::fs::remove_file(a.join("csi.sock")).unwrap();
        std::fs::write(a.join("csi.sock"), b"not a socket").unwrap();
        assert!(answers_within(&a, Duration::from_secs(10)), "the socket is served again");
        println!("checked: csi.sock replaced by a file is a socket again");

        // A pod renames `mounts/`, with a mount in it, away: DELETE finds the mount where it
        // went, by what it shows.
        call(&a, "DELETE", "/mounts/extra", None);
        mount(&a, "moved", &other.reference);
        std::fs::rename(a.join("mounts"), a.join("elsewhere")).unwrap();
        let (status, v) = call(&a, "DELETE", "/mounts/moved", None);
        assert_eq!(status, 200, "{v}");
        assert_eq!(mounts_below(&a.join("elsewhere")), Vec::<PathBuf>::new(), "the moved mount is gone");
        println!("checked: a mount moved away with mounts/ is still unmounted by DELETE");
        // Files the pod wrote where a mount goes do not stop its DELETE.
        std::fs::create_dir_all(a.join("mounts/y")).unwrap();
        std::fs::write(a.join("mounts/y/pod-file"), b"x").unwrap();
        mount(&a, "y", &other.reference);
        let (status, v) = call(&a, "DELETE", "/mounts/y", None);
        assert_eq!(status, 200, "{v}");
        assert!(!a.join("mounts/y").exists());
        // A directory holding a mount moved onto `csi.sock`: the socket is served again, and
        // the mount is still found by DELETE.
        mount(&a, "z", &other.reference);
        std::fs::remove_file(a.join("csi.sock")).unwrap();
        std::fs::rename(a.join("mounts"), a.join("csi.sock")).unwrap();
        assert!(answers_within(&a, Duration::from_secs(10)), "the socket is served again");
        let (status, v) = call(&a, "DELETE", "/mounts/z", None);
        assert_eq!(status, 200, "{v}");
        assert_eq!(mounts_below(&a.join("mounts")), Vec::<PathBuf>::new());
        let left: Vec<PathBuf> =
            mounts_below(&a).into_iter().filter(|m| *m != a && !m.starts_with(a.join("volume"))).collect();
        assert_eq!(left, Vec::<PathBuf>::new(), "no mount of A's mounts is left anywhere below it");
        mount(&a, "extra", &extra.reference);
        println!("checked: a directory with a mount in it moved onto csi.sock: served again, the mount deleted");

        assert_eq!(snapshot(&b), b_before, "B is byte for byte unchanged");
        assert_eq!(call(&b, "GET", "/mounts", None), b_list);
        assert_eq!(snapshot(&etc), etc_before, "the /etc stand-in is unchanged");

        // Host killed (-9) and started again: A's socket answers, its mount is intact.
        let before = snapshot(&a.join("mounts"));
        let old_metrics = node.dirs.host_metrics();
        node.restart_host();
        // Once the restarted daemon says it is ready, A's socket answers at the first try.
        let until = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let log = std::fs::read_to_string(node.dirs.root.path().join("host.log")).unwrap_or_default();
            let addr = common::strip_ansi(&log)
                .lines()
                .rev()
                .filter(|l| l.contains("metrics, /healthz and /readyz"))
                .find_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("address=")).map(str::to_string))
                .unwrap_or_default();
            if !addr.is_empty()
                && addr != old_metrics
                && common::http("GET", &addr, "/readyz", &[], b"").is_ok_and(|r| r.0 == 200)
            {
                break;
            }
            assert!(std::time::Instant::now() < until, "the restarted host daemon never became ready");
            std::thread::sleep(Duration::from_millis(20));
        }
        let (status, _) = raw(&a, b"GET /mounts HTTP/1.1\r\nHost: v\r\nConnection: close\r\n\r\n");
        assert_eq!(status, Some(200), "A's socket answers as soon as the daemon is ready");
        assert!(node.host_alive());
        let (_, list) = call(&a, "GET", "/mounts", None);
        assert_eq!(list["mounts"][0]["state"], "ready", "{list}");
        assert_eq!(snapshot(&a.join("mounts")), before);
        assert!(container.files().iter().any(|f| f.ends_with("mounts/extra/model.safetensors")));
        println!("checked: after kill -9 and restart the socket answers and the mount is intact");
        drop(container);

        // The tmpfs detached behind the daemon's back while it was down: the next start
        // publishes the volume again from its record and mounts the pod's mount again.
        node.restart_host_with(|| nix::mount::umount2(&a, nix::mount::MntFlags::MNT_DETACH).unwrap());
        assert!(answers_within(&a, Duration::from_secs(10)), "A's socket answers again");
        assert_eq!(regular_files(&snapshot(&a.join("volume"))), files_of(&base));
        assert_eq!(snapshot(&a.join("mounts")), before, "the mount is back");
        assert!(std::fs::symlink_metadata(a.join("csi.sock")).is_ok());
        println!("checked: a dynamic volume whose tmpfs vanished is published again at start, its mount too");

        // The client a pod runs, on the socket at its kubelet-length path.
        let cli = |args: &[&str]| {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_mounthost"))
                .arg("dynamic")
                .arg("--socket")
                .arg(a.join("csi.sock"))
                .args(args)
                .output()
                .unwrap();
            assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
            let stdout = String::from_utf8(out.stdout).unwrap();
            serde_json::from_str::<Value>(stdout.lines().last().unwrap()).unwrap()
        };
        let reference = format!("reference={}", other.reference);
        assert_eq!(cli(&["create", "cli-model", "-p", &reference, "--wait"])["state"], "ready");
        assert_eq!(regular_files(&snapshot(&a.join("mounts/cli-model"))), files_of(&other));
        let listed = cli(&["list"]);
        assert!(listed["mounts"].as_array().unwrap().iter().any(|m| m["id"] == "cli-model"), "{listed}");
        assert_eq!(cli(&["delete", "cli-model"])["state"], "deleted");
        println!("checked: mounthost dynamic create --wait, list and delete on the real socket");

        // Delete: unmounted and gone.
        let (status, v) = call(&a, "DELETE", "/mounts/extra", None);
        assert_eq!((status, v["state"].as_str()), (200, Some("deleted")), "{v}");
        assert!(!a.join("mounts/extra").exists());
        assert_eq!(call(&a, "GET", "/mounts/extra", None).0, 404);
        assert_eq!(mounts_below(&a.join("mounts")), Vec::<PathBuf>::new());

        // Unpublish A with a mount in it: everything of A is gone, B is untouched.
        mount(&a, "extra", &extra.reference);
        csi.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: PV_A.into(),
            target_path: a.display().to_string(),
        })
        .await
        .unwrap();
        assert!(!a.exists(), "the target is gone");
        assert_eq!(mounts_below(&a), Vec::<PathBuf>::new());
        assert!(!node.dirs.state.join("cache/volumes").join(volume_key(PV_A)).join("dynamic").exists());
        assert_eq!(snapshot(&b), b_before, "B is byte for byte unchanged");
        assert_eq!(call(&b, "GET", "/mounts", None), b_list);

        csi.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: PV_B.into(),
            target_path: b.display().to_string(),
        })
        .await
        .unwrap();
        for pv in [PV_A, PV_B] {
            csi.node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: pv.into(),
                staging_target_path: node.dirs.staging(pv).display().to_string(),
            })
            .await
            .unwrap();
        }
        assert_eq!(mounts_below(node.dirs.root.path()), Vec::<PathBuf>::new());
    });
}

/// Pod A with a dynamic volume of a small model published, on a node whose host daemon runs
/// with `host_args` too: what the tests below start from.
struct PodA<'a> {
    /// To push more models.
    registry: &'a Registry,
    /// The volume's own model.
    base: &'a PushedModel,
    node: &'a DynNode,
    csi: Node,
    /// The published directory (the target).
    dir: PathBuf,
}

/// Run `body` on a [`PodA`] (in the private namespace of the test called `test`).
fn with_pod_a(test: &str, host_args: &[&str], body: impl AsyncFnOnce(&mut PodA<'_>)) {
    with_pod_a_ctx(test, host_args, &[], body)
}

/// [`with_pod_a`], with more attributes on the volume.
fn with_pod_a_ctx(test: &str, host_args: &[&str], attrs: &[(&str, &str)], body: impl AsyncFnOnce(&mut PodA<'_>)) {
    if !in_private_namespace(test) {
        return;
    }
    let registry = Registry::start(RegistryOptions::default());
    let base = tiny_model(&registry, "models/base", "v1", b"base weights");
    let node = DynNode::start_with(&registry, host_args);
    run(&node, async || {
        let mut csi = node.node().await;
        let mut ctx = dynamic_ctx(&base.reference);
        ctx.extend(attrs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let dir = node.dynamic_volume(&mut csi, PV_A, POD_A, &ctx).await;
        body(&mut PodA { registry: &registry, base: &base, node: &node, csi, dir }).await
    });
}

/// A dynamic mount adds to the node's blob cache like a stage does, so it keeps the cache
/// under `--cache-max-mib` too: what no volume uses is evicted once the mount is ready.
#[test]
fn a_dynamic_mount_keeps_the_cache_under_its_cap() {
    // The volume's own cap is given: by default it is half the cache's, 1 MiB here.
    with_pod_a(
        "a_dynamic_mount_keeps_the_cache_under_its_cap",
        &["--cache-max-mib=3", "--dynamic-max-mib=64"],
        async |p| {
            let (a, node) = (p.dir.clone(), p.node);
            let old = tiny_model(p.registry, "models/old", "v1", &vec![1u8; 2 << 20]);
            let new = tiny_model(p.registry, "models/new", "v1", &vec![2u8; 2 << 20]);
            let cached = |model: &PushedModel| model.cached(&node.dirs.state, "model.safetensors");
            // Another volume brings `old` into the cache and goes: its weights are used by nobody.
            let b = node.dynamic_volume(&mut p.csi, PV_B, POD_B, &dynamic_ctx(&old.reference)).await;
            let staging = node.dirs.staging(PV_B).display().to_string();
            p.csi
                .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                    volume_id: PV_B.into(),
                    target_path: b.display().to_string(),
                })
                .await
                .unwrap();
            p.csi
                .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                    volume_id: PV_B.into(),
                    staging_target_path: staging,
                })
                .await
                .unwrap();
            assert!(cached(&old), "nothing added to the cache since, so nothing was evicted");
            // A's pod mounts `new`: 2 MiB more, over the 3 MiB cap.
            mount(&a, "new", &new.reference);
            assert_eq!(regular_files(&snapshot(&a.join("mounts/new"))), files_of(&new));
            assert!(!cached(&old), "the weights no volume uses were evicted");
            assert!(cached(&new) && cached(p.base), "what A uses stays");
            println!("checked: a dynamic mount over the cache cap evicted what no volume uses, and only that");
        },
    );
}

/// A pod moves a dynamic mount deeper than PATH_MAX inside its volume (a chain of 255-byte
/// directories made relative to each other, `mounts/` renamed into it): DELETE still finds it
/// by what it shows, unmounts it and answers 200; NodeUnpublishVolume is clean afterwards.
#[test]
fn a_mount_moved_deeper_than_path_max_is_still_deleted() {
    with_pod_a("a_mount_moved_deeper_than_path_max_is_still_deleted", &[], async |p| {
        let a = p.dir.clone();
        let other = tiny_model(p.registry, "models/other", "v1", b"other weights");
        mount(&a, "deep", &other.reference);
        let (chain, deep) = common::deep_chain(&a, 17);
        rustix::fs::renameat(&chain[0], "mounts", &chain[17], "mounts").unwrap();
        drop(chain);
        let moved = deep.join("mounts/deep");
        assert!(moved.as_os_str().len() - a.as_os_str().len() > 4096);
        assert!(mounts_below(&a).contains(&moved), "the pod moved the mount out of reach of one path");

        let (status, v) = call(&a, "DELETE", "/mounts/deep", None);
        assert_eq!(status, 200, "{v}");
        let left: Vec<PathBuf> =
            mounts_below(&a).into_iter().filter(|m| *m != a && !m.starts_with(a.join("volume"))).collect();
        assert_eq!(left, Vec::<PathBuf>::new(), "the moved mount is gone");
        assert_eq!(call(&a, "GET", "/mounts/deep", None).0, 404);
        p.csi
            .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                volume_id: PV_A.into(),
                target_path: a.display().to_string(),
            })
            .await
            .unwrap();
        assert_eq!(mounts_below(&a), Vec::<PathBuf>::new());
        println!("checked: a mount moved {} bytes deep was deleted", moved.as_os_str().len() - a.as_os_str().len());
    });
}

/// kubelet (or anything else) unmounts a dynamic volume's target behind the daemon's back, and
/// NodeUnstageVolume then forgets that publication: the volume's server stops with it. A pod's
/// container keeps its own copy of the target, socket included, so a server left running would
/// keep answering it for the daemon's lifetime.
#[test]
fn an_unstage_that_forgets_a_dynamic_publication_stops_its_server() {
    with_pod_a("an_unstage_that_forgets_a_dynamic_publication_stops_its_server", &[], async |p| {
        let a = p.dir.clone();
        // The container's copy of the target: a descriptor of its directory, held from now on.
        let copy = std::fs::File::open(&a).unwrap();
        let socket = format!("/proc/self/fd/{}/csi.sock", std::os::fd::AsRawFd::as_raw_fd(&copy));
        let ask = || -> std::io::Result<String> {
            let mut s = std::os::unix::net::UnixStream::connect(&socket)?;
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            s.write_all(b"GET /mounts HTTP/1.1\r\nHost: v\r\nConnection: close\r\n\r\n")?;
            let mut out = String::new();
            s.read_to_string(&mut out)?;
            Ok(out)
        };
        assert!(ask().unwrap().starts_with("HTTP/1.1 200"), "served through the copy");
        nix::mount::umount2(&a, nix::mount::MntFlags::MNT_DETACH).unwrap();
        assert!(ask().unwrap().starts_with("HTTP/1.1 200"), "still served: nothing told the daemon yet");
        p.csi
            .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: PV_A.into(),
                staging_target_path: p.node.dirs.staging(PV_A).display().to_string(),
            })
            .await
            .expect("the publication kubelet unmounted is forgotten, and the volume unstages");
        let err = ask().expect_err("the server stopped with the publication");
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
        println!("checked: unstage forgot a publication unmounted behind its back and stopped its server");
    });
}

/// A pod that polls its socket in a tight loop, or floods it with bad requests, does not flood
/// the node's log: successful reads are debug lines, and the info lines of a volume's server
/// (requests that change something or fail) come at most 20 a second, the next one saying how
/// many were left out.
#[test]
fn a_pod_that_floods_its_socket_does_not_flood_the_log() {
    with_pod_a("a_pod_that_floods_its_socket_does_not_flood_the_log", &[], async |p| {
        let a = p.dir.clone();
        let info_lines = || -> Vec<String> {
            let log = std::fs::read_to_string(p.node.dirs.root.path().join("host.log")).unwrap_or_default();
            common::strip_ansi(&log)
                .lines()
                .filter(|l| l.contains(" INFO ") && l.contains("dynamic socket request"))
                .map(str::to_string)
                .collect()
        };
        let before = info_lines().len();
        let started = std::time::Instant::now();
        for _ in 0..300 {
            assert_eq!(call(&a, "GET", "/mounts", None).0, 200);
        }
        assert_eq!(info_lines().len(), before, "a successful read is not an info line");
        for _ in 0..300 {
            assert_eq!(call(&a, "GET", "/nope", None).0, 404);
        }
        let seconds = started.elapsed().as_secs() + 1;
        let flood = info_lines().len() - before;
        assert!((1..=20 * seconds as usize).contains(&flood), "{flood} info lines in about {seconds} s");
        std::thread::sleep(Duration::from_millis(1100));
        assert_eq!(call(&a, "DELETE", "/mounts/none", None).0, 404);
        // Every line left out is counted by a later one (the last: this DELETE's).
        let lines = info_lines();
        let skipped: u64 = lines[before..]
            .iter()
            .map(|l| l.split("skipped=").nth(1).unwrap().split_whitespace().next().unwrap().parse::<u64>().unwrap())
            .sum();
        assert_eq!(lines.len() - before, flood + 1);
        assert_eq!(skipped as usize + flood, 300, "written and left out: {:?}", lines.last());
        println!("checked: 300 reads, 0 info lines; 300 bad requests, {flood} info lines and {skipped} counted");
    });
}

/// A volume's caps on its mounts: the bytes they fetch (a mount that would pass the cap is
/// answered 507 naming it, with nothing recorded and nothing fetched) and how many there are
/// (409); a deleted mount makes room again.
#[test]
fn a_dynamic_volume_holds_only_what_its_caps_allow() {
    with_pod_a_ctx(
        "a_dynamic_volume_holds_only_what_its_caps_allow",
        &["--dynamic-max-mib=64"],
        &[("dynamicMaxMiB", "1"), ("dynamicMaxMounts", "2")],
        async |p| {
            let a = p.dir.clone();
            let big = |n: u8| tiny_model(p.registry, &format!("models/big{n}"), "v1", &vec![n; 600 << 10]);
            let (one, two) = (big(1), big(2));
            let small = tiny_model(p.registry, "models/small", "v1", b"small weights");
            mount(&a, "one", &one.reference);
            let log_from = p.registry.log().len();
            let (status, v) =
                call(&a, "POST", "/mounts", Some(json!({"id": "two", "parameters": {"reference": two.reference}})));
            assert_eq!((status, v["code"].as_str()), (507, Some("resource_exhausted")), "{v}");
            let m = v["message"].as_str().unwrap();
            assert!(m.contains("mount two fetches") && m.contains("volume attribute dynamicMaxMiB 1 MiB"), "{m}");
            // Nothing recorded, nothing fetched: not in the cache, and the registry was never
            // asked for its weights.
            assert_eq!(call(&a, "GET", "/mounts/two", None).0, 404);
            assert!(!two.cached(&p.node.dirs.state, "model.safetensors"));
            let weights = &two.layer("model.safetensors").digest;
            assert!(
                !p.registry.log()[log_from..]
                    .lines()
                    .any(|l| l.contains("GET ") && l.contains(&format!("/blobs/{weights}"))),
                "the registry served the refused weights"
            );
            // Under the byte cap but over the count.
            mount(&a, "small", &small.reference);
            let (status, v) =
                call(&a, "POST", "/mounts", Some(json!({"id": "three", "parameters": {"reference": small.reference}})));
            assert_eq!((status, v["code"].as_str()), (409, Some("too_many_mounts")), "{v}");
            assert!(v["message"].as_str().unwrap().contains("(volume attribute dynamicMaxMounts 2)"), "{v}");
            // A deleted mount's bytes and place are free again.
            assert_eq!(call(&a, "DELETE", "/mounts/one", None).0, 200);
            mount(&a, "two", &two.reference);
            assert_eq!(regular_files(&snapshot(&a.join("mounts/two"))), files_of(&two));
            println!(
                "checked: 507 past dynamicMaxMiB with nothing fetched, 409 past dynamicMaxMounts, room again after a delete"
            );
        },
    );
}

/// A pod floods its socket (8 connections at once, each sending GET and DELETE in turn as fast
/// as the answers come) for at least 3 s, while volume B's pod mounts a model: every request is
/// answered, with a status of its kind (200 for a read, 404 for a DELETE that got a token, 429
/// past the bucket), at most as many as the pace lets through (a burst of 200, then 100 a
/// second: `dynamic::limits::Pacer`), the DELETEs at most as many as the bucket holds (20, then
/// 2 a second) and the rest 429, and B's mount is ready meanwhile. The benchmark with timings
/// is `flood_benchmark` (`bench/dynamic-flood.sh`).
#[test]
fn a_pod_flooding_its_socket_is_paced_and_another_volume_still_mounts() {
    with_pod_a("a_pod_flooding_its_socket_is_paced_and_another_volume_still_mounts", &[], async |p| {
        let b = p.node.dynamic_volume(&mut p.csi, PV_B, POD_B, &dynamic_ctx(&p.base.reference)).await;
        let other = tiny_model(p.registry, "models/other", "v1", &vec![3u8; 1 << 20]);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let started = std::time::Instant::now();
        // Each answer with when it came (since `started`).
        let flooders: Vec<_> = (0..8)
            .map(|_| {
                let (dir, stop) = (p.dir.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut answers: Vec<(&'static str, Option<u16>, Duration)> = Vec::new();
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        for (kind, method, path) in [("read", "GET", "/mounts"), ("delete", "DELETE", "/mounts/none")] {
                            let status = try_call(&dir, method, path, None).map(|(s, _)| s);
                            answers.push((kind, status, started.elapsed()));
                        }
                    }
                    answers
                })
            })
            .collect();
        // B's pod mounts a model meanwhile.
        let v = mount(&b, "other", &other.reference);
        let b_ready = started.elapsed();
        assert_eq!(v["state"], "ready");
        assert_eq!(regular_files(&snapshot(&b.join("mounts/other"))), files_of(&other));
        while started.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let flood_ended = started.elapsed();
        let answers: Vec<_> = flooders.into_iter().flat_map(|t| t.join().unwrap()).collect();
        assert!(b_ready < flood_ended, "B's mount was ready while A flooded");
        let mut by = std::collections::BTreeMap::<(&str, Option<u16>), usize>::new();
        for (kind, status, _) in &answers {
            *by.entry((*kind, *status)).or_default() += 1;
        }
        let unexpected: Vec<_> = by
            .iter()
            .filter(|((kind, status), _)| {
                !matches!((*kind, *status), ("read", Some(200)) | ("delete", Some(404 | 429)))
            })
            .collect();
        assert!(unexpected.is_empty(), "every request answered by its kind: {by:?}");
        // What was answered while the flood ran: at most the pace's burst plus its rate.
        let window = flood_ended.as_secs_f64();
        let within = answers.iter().filter(|(_, _, at)| *at <= flood_ended).count();
        let paced = 200 + (100.0 * (window + 0.1)) as usize + 2;
        assert!((200..=paced).contains(&within), "{within} answers in {window:.2} s (the pace allows {paced}): {by:?}");
        // DELETEs: the bucket's 20, then 2 a second; the rest 429.
        let tokens = by.get(&("delete", Some(404))).copied().unwrap_or(0);
        let refused = by.get(&("delete", Some(429))).copied().unwrap_or(0);
        let bucket = 20 + (2.0 * (answers.iter().map(|a| a.2).max().unwrap().as_secs_f64() + 0.1)) as usize + 1;
        assert!((20..=bucket).contains(&tokens), "{tokens} DELETEs took a token (the bucket allows {bucket}): {by:?}");
        assert!(refused > 0, "DELETEs past the bucket are 429: {by:?}");
        println!(
            "checked: {within} answers in {window:.2} s (pace allows {paced}), {tokens} DELETEs took a token and {refused} got 429; B's mount ready after {b_ready:?}"
        );
    });
}

/// The whole answer to one request, head and body.
fn whole_answer(dir: &Path, method: &str, path: &str) -> String {
    let mut s = connect(dir).unwrap();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: v\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// POST and DELETE come out of a token bucket per volume: past it, 429 with Retry-After
/// (seconds to the next token) and nothing done; reads are not limited; another volume's
/// bucket is its own. A volume attribute above the node's cap is refused at publish.
#[test]
fn a_dynamic_volume_past_its_rate_gets_429_with_retry_after() {
    with_pod_a_ctx(
        "a_dynamic_volume_past_its_rate_gets_429_with_retry_after",
        &["--dynamic-burst=3"],
        &[("dynamicRequestsPerMinute", "6")],
        async |p| {
            let a = p.dir.clone();
            for _ in 0..3 {
                assert_eq!(call(&a, "DELETE", "/mounts/none", None).0, 404);
            }
            let answer = whole_answer(&a, "DELETE", "/mounts/none");
            assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
            let retry: u64 = answer
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("retry-after: ").map(|v| v.trim().parse().unwrap()))
                .unwrap_or_else(|| panic!("no Retry-After in {answer}"));
            assert!((1..=10).contains(&retry), "one token every 10 s: {answer}");
            assert!(
                answer.contains("too_many_requests")
                    && answer
                        .contains("6 POST and DELETE requests a minute (volume attribute dynamicRequestsPerMinute)"),
                "{answer}"
            );
            let (status, v) =
                call(&a, "POST", "/mounts", Some(json!({"id": "m", "parameters": {"reference": p.base.reference}})));
            assert_eq!(status, 429, "{v}");
            assert_eq!(call(&a, "GET", "/mounts/m", None).0, 404, "the refused POST recorded nothing");
            for _ in 0..20 {
                assert_eq!(call(&a, "GET", "/mounts", None).0, 200);
            }
            // Another volume asks for more than the node allows: refused at publish, by name.
            let staging = p.node.dirs.staging(PV_B);
            let mut ctx = dynamic_ctx(&p.base.reference);
            ctx.insert("dynamicMaxMounts".into(), "100".into());
            p.csi.node_stage_volume(common::stage_req(PV_B, &staging, &ctx)).await.unwrap();
            let target = p.node.dirs.target(POD_B, PV_B);
            for _ in 0..2 {
                let err = p
                    .csi
                    .node_publish_volume(common::publish_req(PV_B, &staging, &target, true, &ctx))
                    .await
                    .unwrap_err();
                assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
                assert!(
                    err.message().contains(
                        "volume attribute dynamicMaxMounts is 100, above this node's cap of 64 (--dynamic-max-mounts)"
                    ),
                    "{err:?}"
                );
            }
            // Within the cap it is published, with a bucket of its own: full while A's is empty.
            ctx.insert("dynamicMaxMounts".into(), "8".into());
            p.csi.node_publish_volume(common::publish_req(PV_B, &staging, &target, true, &ctx)).await.unwrap();
            for _ in 0..3 {
                assert_eq!(call(&target, "DELETE", "/mounts/none", None).0, 404);
            }
            // A's bucket is still (nearly) empty: a token every 10 s came back at most once
            // or twice while B was published, and then A is refused again.
            let a_answers: Vec<u16> = (0..3).map(|_| call(&a, "DELETE", "/mounts/none", None).0).collect();
            assert!(a_answers.contains(&429), "A's bucket is its own: {a_answers:?}");
            p.csi
                .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                    volume_id: PV_B.into(),
                    target_path: target.display().to_string(),
                })
                .await
                .unwrap();
            p.csi
                .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                    volume_id: PV_B.into(),
                    staging_target_path: staging.display().to_string(),
                })
                .await
                .unwrap();
            println!(
                "checked: 3 requests, then 429 with Retry-After {retry}; reads unlimited; a cap above the node's refused at publish"
            );
        },
    );
}

/// The node lowers its caps under a published dynamic volume (the host daemon restarted with
/// lower `--dynamic-max-*` flags than the volume's attributes): kubelet's next
/// NodePublishVolume of it succeeds, with a warning in the host's log, and the volume gets the
/// lower caps; a new publication above them is still INVALID_ARGUMENT.
#[test]
fn a_published_volume_stays_published_when_the_node_lowers_its_caps() {
    with_pod_a_ctx(
        "a_published_volume_stays_published_when_the_node_lowers_its_caps",
        &["--dynamic-max-mounts=8", "--dynamic-max-mib=64"],
        &[("dynamicMaxMounts", "6"), ("dynamicMaxMiB", "32")],
        async |p| {
            let a = p.dir.clone();
            mount(&a, "one", &p.base.reference);
            p.node.restart_host_instead(&["--dynamic-max-mounts=2", "--dynamic-max-mib=16"]);
            let staging = p.node.dirs.staging(PV_A);
            let mut ctx = dynamic_ctx(&p.base.reference);
            ctx.extend(
                [("dynamicMaxMounts", "6"), ("dynamicMaxMiB", "32")].map(|(k, v)| (k.to_string(), v.to_string())),
            );
            let republish = common::publish_req(PV_A, &staging, &a, true, &ctx);
            let until = std::time::Instant::now() + Duration::from_secs(30);
            loop {
                match p.csi.node_publish_volume(republish.clone()).await {
                    Ok(_) => break,
                    Err(s) if s.code() == tonic::Code::Unavailable && std::time::Instant::now() < until => {
                        tokio::time::sleep(Duration::from_millis(100)).await
                    }
                    Err(s) => panic!("the republish under lower caps: {s:?}\n{}", p.node.dirs.logs()),
                }
            }
            // Twice: kubelet publishes again whenever it syncs the pod.
            p.csi.node_publish_volume(republish).await.unwrap();
            let log = common::strip_ansi(&std::fs::read_to_string(p.node.dirs.root.path().join("host.log")).unwrap());
            let warned: Vec<&str> =
                log.lines().filter(|l| l.contains(" WARN ") && l.contains("lowered since it was published")).collect();
            assert_eq!(warned.len(), 2, "one warning per publish:\n{log}");
            assert!(
                warned[0].contains(
                    "volume attribute dynamicMaxMounts is 6, above this node's cap of 2 (--dynamic-max-mounts)"
                ),
                "{}",
                warned[0]
            );
            // The mount is still there, and the node's lower cap holds: 2 mounts, not 6.
            assert_eq!(call(&a, "GET", "/mounts/one", None).1["state"], "ready");
            mount(&a, "two", &p.base.reference);
            let (status, v) = call(
                &a,
                "POST",
                "/mounts",
                Some(json!({"id": "three", "parameters": {"reference": p.base.reference}})),
            );
            assert_eq!((status, v["code"].as_str()), (409, Some("too_many_mounts")), "{v}");
            assert!(v["message"].as_str().unwrap().contains("the node's --dynamic-max-mounts 2"), "{v}");
            // A volume published for the first time above the node's caps is still refused.
            let staging_b = p.node.dirs.staging(PV_B);
            p.csi.node_stage_volume(common::stage_req(PV_B, &staging_b, &ctx)).await.unwrap();
            let target_b = p.node.dirs.target(POD_B, PV_B);
            let err = p
                .csi
                .node_publish_volume(common::publish_req(PV_B, &staging_b, &target_b, true, &ctx))
                .await
                .unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
            p.csi
                .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                    volume_id: PV_B.into(),
                    staging_target_path: staging_b.display().to_string(),
                })
                .await
                .unwrap();
            println!(
                "checked: republished under lowered caps with a warning, the lower cap applied; a new publish above it refused"
            );
        },
    );
}

/// A POST whose registry never answers plans and resolves without the volume's lock: the
/// pod's other requests (a mount of another model, a delete) are answered meanwhile.
#[test]
fn a_mount_waiting_for_its_registry_holds_no_lock() {
    let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hole_host = hole.local_addr().unwrap().to_string();
    let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = held.clone();
    std::thread::spawn(move || {
        for c in hole.incoming().flatten() {
            keep.lock().unwrap().push(c);
        }
    });
    let insecure = format!("--insecure-registry={hole_host}");
    let grant = format!("--grant=model:host={hole_host}");
    with_pod_a("a_mount_waiting_for_its_registry_holds_no_lock", &[&insecure, &grant], async |p| {
        let a = p.dir.clone();
        let stuck_dir = a.clone();
        let stuck_ref = format!("{hole_host}/models/never:v1");
        let stuck = std::thread::spawn(move || {
            call(&stuck_dir, "POST", "/mounts", Some(json!({"id": "stuck", "parameters": {"reference": stuck_ref}})))
        });
        // The registry has the connection: the POST is resolving.
        let until = std::time::Instant::now() + Duration::from_secs(20);
        while held.lock().unwrap().is_empty() {
            assert!(std::time::Instant::now() < until, "the POST never reached the registry");
            if stuck.is_finished() {
                panic!("the POST was answered without reaching the registry: {:?}", stuck.join().unwrap());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let other = tiny_model(p.registry, "models/other", "v1", b"other weights");
        mount(&a, "other", &other.reference);
        assert_eq!(call(&a, "DELETE", "/mounts/other", None).0, 200);
        assert!(!stuck.is_finished(), "the stuck POST is still waiting for its registry");
        assert_eq!(call(&a, "GET", "/mounts/stuck", None).0, 404, "nothing is recorded while it resolves");
        println!("checked: a mount and a delete were answered while another POST waited for its registry");
    });
}

fn volume_key(id: &str) -> String {
    mounthost::volume::dirs::volume_key(id)
}

fn libc_erofs() -> i32 {
    nix::errno::Errno::EROFS as i32
}

/// The flood benchmark (`bench/dynamic-flood.sh`, not part of the suite): volume B's pod
/// mounts a fresh model (`FLOOD_MIB` MiB of weights, default 8) `FLOOD_ROUNDS` times (default
/// 7) in each of three conditions, in turn: a quiet node; volume A's pod burning its CPU
/// without touching its socket (the baseline for what a busy pod costs the node anyway); and
/// volume A's pod flooding its own socket (`bench/flood.py`, `FLOOD_THREADS` connections,
/// default 16). A's processes run in a cgroup of one CPU, like a pod's limit, when the v1 cpu
/// hierarchy is there. It prints the median times, their ratios, the host daemon's CPU time
/// per second while B mounts under the flood (B's mount included), and what the flooder was
/// answered.
#[test]
#[ignore = "a benchmark: bench/dynamic-flood.sh"]
fn flood_benchmark() {
    let env = |k: &str, d: usize| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let (rounds, mib, threads) = (env("FLOOD_ROUNDS", 7), env("FLOOD_MIB", 8), env("FLOOD_THREADS", 16));
    with_pod_a("flood_benchmark", &[], async |p| {
        let b = p.node.dynamic_volume(&mut p.csi, PV_B, POD_B, &dynamic_ctx(&p.base.reference)).await;
        let models: Vec<PushedModel> = (0..3 * rounds)
            .map(|i| {
                let weights: Vec<u8> =
                    (0..mib << 20).map(|j| (j as u32).wrapping_mul(2654435761).wrapping_add(i as u32) as u8).collect();
                tiny_model(p.registry, &format!("models/fresh{i}"), "v1", &weights)
            })
            .collect();
        let cgroup = Path::new("/sys/fs/cgroup/cpu").join(format!("mounthost-bench-flood-{}", std::process::id()));
        let limited = std::fs::create_dir(&cgroup).is_ok()
            && std::fs::write(cgroup.join("cpu.cfs_period_us"), "100000").is_ok()
            && std::fs::write(cgroup.join("cpu.cfs_quota_us"), "100000").is_ok();
        let flooder = concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/flood.py");
        let host_pid = p.node.host_pid();
        // The host daemon's CPU time so far (user and system, all its threads).
        let host_cpu = || {
            let stat = std::fs::read_to_string(format!("/proc/{host_pid}/stat")).unwrap();
            let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
            let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
            Duration::from_millis(ticks * 10)
        };
        // One mount of B: POST to ready, polled every 2 ms; then deleted (not timed).
        let time_mount = |i: usize| {
            let id = format!("m{i}");
            let started = std::time::Instant::now();
            let body = json!({"id": id, "parameters": {"reference": models[i].reference}});
            let (status, v) = call(&b, "POST", "/mounts", Some(body));
            assert!(matches!(status, 200..=202), "{status} {v}");
            loop {
                let (status, v) = call(&b, "GET", &format!("/mounts/{id}"), None);
                if status == 200 && v["state"] == "ready" {
                    break;
                }
                assert!(v["state"] != "failed" && started.elapsed() < Duration::from_secs(120), "{status} {v}");
                std::thread::sleep(Duration::from_millis(2));
            }
            let took = started.elapsed();
            while call(&b, "DELETE", &format!("/mounts/{id}"), None).0 == 429 {
                std::thread::sleep(Duration::from_millis(200));
            }
            took
        };
        // Volume A's pod: a process in the CPU-limited cgroup; it prints one line when it runs
        // and one when it ends (SIGTERM).
        let pod_a = |args: &[&std::ffi::OsStr]| {
            let mut child = std::process::Command::new("python3")
                .args(args)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("python3");
            if limited {
                std::fs::write(cgroup.join("cgroup.procs"), child.id().to_string()).unwrap();
            }
            let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
            let mut line = String::new();
            std::io::BufRead::read_line(&mut out, &mut line).unwrap();
            std::thread::sleep(Duration::from_secs(1));
            (child, out)
        };
        let stop = |(mut child, mut out): (std::process::Child, std::io::BufReader<std::process::ChildStdout>)| {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM)
                .unwrap();
            let mut line = String::new();
            std::io::BufRead::read_line(&mut out, &mut line).unwrap();
            child.wait().unwrap();
            line.trim().to_string()
        };
        let burner = "import signal, sys\nsignal.signal(signal.SIGTERM, lambda *_: (print('done', flush=True), sys.exit(0)))\nprint('burning', flush=True)\nwhile True: pass";
        let (mut quiet, mut busy, mut flooded) = (Vec::new(), Vec::new(), Vec::new());
        let (mut flood_cpu, mut flood_wall) = (Duration::ZERO, Duration::ZERO);
        for r in 0..rounds {
            quiet.push(time_mount(3 * r));
            let burning = pod_a(&["-c".as_ref(), burner.as_ref()]);
            busy.push(time_mount(3 * r + 1));
            stop(burning);
            let flooding =
                pod_a(&[flooder.as_ref(), p.dir.as_os_str(), p.base.reference.as_ref(), threads.to_string().as_ref()]);
            let (cpu0, t0) = (host_cpu(), std::time::Instant::now());
            flooded.push(time_mount(3 * r + 2));
            let (cpu1, t1) = (host_cpu(), std::time::Instant::now());
            let report = stop(flooding);
            flood_cpu += cpu1 - cpu0;
            flood_wall += t1 - t0;
            println!(
                "bench: round {r}: quiet {:?}, busy {:?}, flooded {:?}, host daemon CPU during that mount (its own work included) {:?}, flooder {report}",
                quiet[r],
                busy[r],
                flooded[r],
                cpu1 - cpu0
            );
        }
        if limited {
            let _ = std::fs::remove_dir(&cgroup);
        }
        let median = |v: &mut Vec<Duration>| {
            v.sort();
            v[v.len() / 2]
        };
        let (q, u, f) = (median(&mut quiet), median(&mut busy), median(&mut flooded));
        let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
        println!(
            "bench: volume B mounts a fresh {mib} MiB model, median of {rounds}: quiet {q:?}, A busy {u:?}, A flooding {f:?}"
        );
        println!(
            "bench: flooding/quiet {:.2}, busy/quiet {:.2}, flooding/busy {:.2} (target <= 1.20); host daemon CPU {:.2} s per second of a flooded mount (its own work included); A {} with {threads} connections",
            ratio(f, q),
            ratio(u, q),
            ratio(f, u),
            ratio(flood_cpu, flood_wall),
            if limited { "in a cgroup of 1 CPU" } else { "unlimited (no v1 cpu hierarchy)" },
        );
    });
}
