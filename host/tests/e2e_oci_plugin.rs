//! Plugins by OCI reference, end to end: `mounthost plugin push` publishes test plugins into a
//! real `docker-registry` (Debian's package, its own config on 127.0.0.1, basic auth where a
//! test needs it), and volumes whose context says `plugin: oci://…@sha256:…` are staged and
//! published by kubelet-shaped calls through the real front and host daemon processes, as root
//! in a private mount namespace. The compile cache is checked in process too.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::registry::{OCI_MANIFEST, Registry, RegistryOptions};
use common::{
    NodeDirs, Proc, guarded, in_private_namespace, mounts_below, publish_req, stage_req, strip_ansi, wait_ready,
};
use mounthost::config::Config;
use mounthost::oci::{Artifacts, Credentials, PluginPull, RegistryConfig, push_plugin};
use mounthost::plan::oci_ref::OciRef;
use mounthost::plugin::PluginRuntime;
use mounthost::plugin::cache::Obtained;
use mounthost::plugin::pulled::{self, ARTIFACT_TYPE, AUTH_SECRET_KEY, LAYER_MEDIA_TYPE};
use mounthost::proto::csi;
use mounthost::proto::csi::controller_client::ControllerClient;
use mounthost::proto::csi::node_client::NodeClient;
use mounthost::secrets::Secrets;
use mounthost::unpriv::grpc::channel;
use tonic::Code;

type Node = NodeClient<mounthost::unpriv::grpc::UnixChannel>;

/// A fixture component built with the plugins.
fn fixture(name: &str) -> PathBuf {
    mounthost::stock::fixtures::path(name)
}

/// `sha256:<hex>` of a file.
fn file_digest(path: &Path) -> String {
    common::registry::sha256_digest(&std::fs::read(path).unwrap())
}

/// `mounthost plugin push FILE REF` against `registry` (plain HTTP), from a state directory of
/// its own (so it compiles nothing into a node's cache), with `user`'s password in the
/// environment when given.
fn push(registry: &Registry, file: &Path, reference: &str, user: Option<(&str, &str)>) -> Output {
    let state = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mounthost"));
    cmd.arg("--state-dir")
        .arg(state.path())
        .arg(format!("--insecure-registry={}", registry.host()))
        .args(["plugin", "push"])
        .arg(file)
        .arg(reference)
        .env_remove("DOCKER_CONFIG")
        .env("HOME", state.path())
        .env("NO_PROXY", "*");
    if let Some((name, password)) = user {
        cmd.args(["--username", name]).env("MOUNTHOST_REGISTRY_PASSWORD", password);
    }
    cmd.output().unwrap()
}

/// Push and return the printed reference, checked for its form.
fn pushed(registry: &Registry, file: &Path, repo_tag: &str, user: Option<(&str, &str)>) -> String {
    let out = push(registry, file, &format!("{}/{repo_tag}", registry.host()), user);
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(out.status.success(), "push {}: {stdout}\n{}", file.display(), String::from_utf8_lossy(&out.stderr));
    let repo = repo_tag.split(':').next().unwrap();
    let prefix = format!("oci://{}/{repo}@sha256:", registry.host());
    assert!(stdout.starts_with(&prefix) && stdout.len() == prefix.len() + 64, "{stdout}");
    stdout
}

/// The manifest digest of a pinned reference.
fn manifest_digest(reference: &str) -> &str {
    reference.rsplit_once('@').unwrap().1
}

/// A node: host daemon and front (`--mode all`), both with `args`.
struct PluginNode {
    host: Option<Proc>,
    front: Option<Proc>,
    /// Last: fields drop in order, so the daemons are dead before their directories are cleaned.
    dirs: NodeDirs,
}

impl PluginNode {
    fn start(dirs: NodeDirs, args: &[String]) -> PluginNode {
        let host = dirs.start_host(args);
        let front = dirs.start_front(args);
        PluginNode { dirs, host: Some(host), front: Some(front) }
    }

    /// Kill both daemons (-9) and start them again with `args`.
    fn restart(&mut self, args: &[String]) {
        for mut p in [self.host.take(), self.front.take()].into_iter().flatten() {
            p.kill9();
        }
        let _ = std::fs::remove_file(&self.dirs.csi_sock);
        self.host = Some(self.dirs.start_host(args));
        self.front = Some(self.dirs.start_front(args));
    }

    async fn clients(&self) -> (Node, ControllerClient<mounthost::unpriv::grpc::UnixChannel>) {
        let ch = channel(&self.dirs.csi_sock);
        wait_ready(&ch).await;
        (NodeClient::new(ch.clone()), ControllerClient::new(ch))
    }

    fn host_log(&self) -> String {
        strip_ansi(&std::fs::read_to_string(self.dirs.root.path().join("host.log")).unwrap_or_default())
    }

    /// The state file of volume `id`, as JSON.
    fn state_of(&self, id: &str) -> serde_json::Value {
        for e in std::fs::read_dir(self.dirs.state.join("volumes")).unwrap() {
            let path = e.unwrap().path();
            if path.extension().is_some_and(|x| x == "json") {
                let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
                if v["volumeId"] == id {
                    return v;
                }
            }
        }
        panic!("no state file for {id}");
    }

    /// The compiled-artifact cache files of the layer `digest`.
    fn compiled(&self, digest: &str) -> Vec<PathBuf> {
        let hex = digest.trim_start_matches("sha256:");
        std::fs::read_dir(self.dirs.state.join("cache/plugins"))
            .map(|d| d.map(|e| e.unwrap().path()).filter(|p| p.to_string_lossy().contains(hex)).collect())
            .unwrap_or_default()
    }
}

fn ctx(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn unstage(id: &str, staging: &Path) -> csi::NodeUnstageVolumeRequest {
    csi::NodeUnstageVolumeRequest { volume_id: id.into(), staging_target_path: staging.display().to_string() }
}

fn unpublish(id: &str, target: &Path) -> csi::NodeUnpublishVolumeRequest {
    csi::NodeUnpublishVolumeRequest { volume_id: id.into(), target_path: target.display().to_string() }
}

/// Stage, retrying while the answer is UNAVAILABLE (a pull in progress), as kubelet does.
async fn stage(node: &mut Node, req: csi::NodeStageVolumeRequest) -> Result<(), tonic::Status> {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        match node.node_stage_volume(req.clone()).await {
            Err(s) if s.code() == Code::Unavailable && Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            other => return other.map(|_| ()),
        }
    }
}

/// Blob bytes the registry has served, once its log has settled.
fn served(registry: &Registry) -> u64 {
    std::thread::sleep(Duration::from_millis(300));
    registry.served_bytes()
}

#[test]
fn a_pushed_plugin_stages_a_real_volume_and_a_restarted_host_reloads_it_compiled() {
    if !in_private_namespace("a_pushed_plugin_stages_a_real_volume_and_a_restarted_host_reloads_it_compiled") {
        return;
    }
    let (user, password) = ("pusher", "pw-7Hq!x");
    let registry =
        Registry::start(RegistryOptions { htpasswd: Some((user.into(), password.into())), ..Default::default() });
    let tmpfs = fixture("tmpfs");

    // Push: refused without credentials, then published with them.
    let refused = push(&registry, &tmpfs, &format!("{}/plugins/tmpfs:v1", registry.host()), None);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("requires authentication"), "{stderr}");
    let reference = pushed(&registry, &tmpfs, "plugins/tmpfs:v1", Some((user, password)));
    let manifest = registry.request(
        "GET",
        &format!("/v2/plugins/tmpfs/manifests/{}", manifest_digest(&reference)),
        &[("Accept", OCI_MANIFEST)],
    );
    assert_eq!(manifest.status, 200, "{}", manifest.text());
    let m: serde_json::Value = serde_json::from_slice(&manifest.body).unwrap();
    assert_eq!(m["artifactType"], ARTIFACT_TYPE);
    assert_eq!(m["config"]["mediaType"], "application/vnd.oci.empty.v1+json");
    assert_eq!(m["layers"][0]["mediaType"], LAYER_MEDIA_TYPE);
    let layer = file_digest(&tmpfs);
    assert_eq!(m["layers"][0]["digest"], layer.as_str(), "the layer is the component itself");
    assert_eq!(m["annotations"][pulled::NAME_ANNOTATION], "tmpfs");
    let by_tag = registry.request("HEAD", "/v2/plugins/tmpfs/manifests/v1", &[("Accept", OCI_MANIFEST)]);
    assert_eq!(by_tag.header("docker-content-digest"), Some(manifest_digest(&reference)));

    let args = vec![format!("--insecure-registry={}", registry.host()), "--grant=tmpfs:fstype=tmpfs".to_string()];
    let mut node = PluginNode::start(NodeDirs::new(), &args);
    let auth = format!(r#"{{"auths":{{"{}":{{"username":"{user}","password":"{password}"}}}}}}"#, registry.host());
    let rt = tokio::runtime::Runtime::new().unwrap();
    guarded(&node.dirs, || {
        rt.block_on(async {
            let (mut csi, _) = node.clients().await;
            let vctx = ctx(&[("plugin", &reference), ("sizeMiB", "8")]);
            let staging = node.dirs.staging("pv-oci");
            let mut req = stage_req("pv-oci", &staging, &vctx);

            // The registry wants credentials; they come from the stage secret the host keeps to itself.
            let e = csi.node_stage_volume(req.clone()).await.unwrap_err();
            assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
            assert!(e.message().contains(&registry.host()), "{e:?}");
            req.secrets = [(AUTH_SECRET_KEY.to_string(), auth.clone())].into();
            // (The tmpfs fixture refuses any secret: it never sees this one.)
            stage(&mut csi, req.clone()).await.unwrap();
            assert_eq!(mounts_below(&staging), vec![staging.clone()], "a real tmpfs at the staging path");
            stage(&mut csi, req.clone()).await.unwrap();
            let st = node.state_of("pv-oci");
            assert_eq!(st["plugin"], "tmpfs", "grants and labels go by the name the plugin reports");
            assert_eq!(st["digest"], layer.as_str());
            assert_eq!(st["source"], reference.as_str(), "pinned to the manifest it was staged with");
            assert_eq!(st["pinned"], true);
            // A pulled build is selected by its reference only: by name and digest, a volume would
            // record no source and find no plugin after a restart.
            let by_name = ctx(&[("plugin", "tmpfs"), ("pluginDigest", &layer), ("sizeMiB", "8")]);
            let staging_n = node.dirs.staging("pv-by-name");
            let e = csi.node_stage_volume(stage_req("pv-by-name", &staging_n, &by_name)).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
            assert!(e.message().contains("selected only by its reference"), "{e:?}");
            println!("checked: {}", e.message());
            let target = node.dirs.target("pod-1", "pv-oci");
            csi.node_publish_volume(publish_req("pv-oci", &staging, &target, false, &vctx)).await.unwrap();
            std::fs::write(target.join("hello"), b"from a pulled plugin").unwrap();
            assert_eq!(std::fs::read(staging.join("hello")).unwrap(), b"from a pulled plugin");
        })
    });
    let compiled = node.compiled(&layer);
    assert_eq!(compiled.len(), 1, "compiled once, cached on disk: {compiled:?}");
    let written = std::fs::metadata(&compiled[0]).unwrap().modified().unwrap();

    // A second start over the same state: the build comes from the node's blob cache and its
    // compiled form from the compile cache, and the registry is not asked for the blob again.
    let served_before = served(&registry);
    node.restart(&args);
    guarded(&node.dirs, || {
        rt.block_on(async {
            let (mut csi, _) = node.clients().await;
            let vctx = ctx(&[("plugin", &reference), ("sizeMiB", "8")]);
            let staging = node.dirs.staging("pv-oci");
            let target2 = node.dirs.target("pod-2", "pv-oci");
            csi.node_publish_volume(publish_req("pv-oci", &staging, &target2, true, &vctx)).await.unwrap();
            assert_eq!(std::fs::read(target2.join("hello")).unwrap(), b"from a pulled plugin");
            let log = node.host_log();
            let reloaded = log.lines().find(|l| l.contains("plugin reloaded from the node's cache"));
            let reloaded = reloaded.unwrap_or_else(|| panic!("no reload in the host log:\n{log}"));
            assert!(reloaded.contains("compiled=Cached"), "not recompiled: {reloaded}");
            let compiled = node.compiled(&layer);
            assert_eq!(compiled.len(), 1, "{compiled:?}");
            assert_eq!(std::fs::metadata(&compiled[0]).unwrap().modified().unwrap(), written, "not rewritten");
            assert_eq!(served(&registry), served_before, "no blob fetched from the registry after the restart");
            println!("checked: a restarted host reloaded {reference} from its caches: {reloaded}");

            // Restaging with the reference as the CO sends it is idempotent; another plugin is not.
            let mut req = stage_req("pv-oci", &staging, &vctx);
            req.secrets = [(AUTH_SECRET_KEY.to_string(), auth.clone())].into();
            stage(&mut csi, req).await.unwrap();
            let other = ctx(&[("plugin", "tmpfs"), ("sizeMiB", "8")]);
            let e = csi.node_stage_volume(stage_req("pv-oci", &staging, &other)).await.unwrap_err();
            assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
            assert!(e.message().contains(&reference), "{e:?}");

            for pod in ["pod-1", "pod-2"] {
                csi.node_unpublish_volume(unpublish("pv-oci", &node.dirs.target(pod, "pv-oci"))).await.unwrap();
            }
            csi.node_unstage_volume(unstage("pv-oci", &staging)).await.unwrap();
            assert_eq!(mounts_below(node.dirs.root.path()), Vec::<PathBuf>::new(), "nothing left mounted");
        })
    });
}

#[test]
fn wrong_digests_tags_and_stolen_names_are_refused_clearly() {
    if !in_private_namespace("wrong_digests_tags_and_stolen_names_are_refused_clearly") {
        return;
    }
    let registry = Registry::start(RegistryOptions::default());
    let host = registry.host();
    let tmpfs = fixture("tmpfs");
    let reference = pushed(&registry, &tmpfs, "plugins/tmpfs:v1", None);
    let layer = file_digest(&tmpfs);
    // A second plugin whose layer the registry then serves corrupted.
    let corrupt = pushed(&registry, &fixture("bindfs"), "plugins/corrupt", None);
    let corrupt_layer = file_digest(&fixture("bindfs"));
    let blob = registry.blob_storage_path(&corrupt_layer);
    let len = std::fs::metadata(&blob).unwrap().len() as usize;
    std::fs::write(&blob, vec![0x5a; len]).unwrap();
    let garbage = common::registry::sha256_digest(&vec![0x5a; len]);
    // The stock seaweedfs plugin, published under another repository: it would take the stock
    // plugin's grants (`weed` as root).
    let work = tempfile::tempdir().unwrap();
    let stock = work.path().join("seaweedfs.wasm");
    std::fs::write(&stock, another_build(mounthost::stock::SEAWEEDFS)).unwrap();
    let impostor = pushed(&registry, &stock, "plugins/not-seaweedfs", None);

    let mut args = vec![format!("--insecure-registry={host}"), "--grant=tmpfs:fstype=tmpfs".to_string()];
    let mut node = PluginNode::start(NodeDirs::new(), &args);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let tagged = format!("oci://{host}/plugins/tmpfs:v1");
    guarded(&node.dirs, || {
        rt.block_on(async {
            let (mut csi, mut controller) = node.clients().await;
            let staging = node.dirs.staging("pv-bad");
            let refused = async |csi: &mut Node, pairs: &[(&str, &str)], code: Code, needles: &[&str]| {
                let e = csi.node_stage_volume(stage_req("pv-bad", &staging, &ctx(pairs))).await.unwrap_err();
                assert_eq!(e.code(), code, "{pairs:?}: {e:?}");
                for n in needles {
                    assert!(e.message().contains(n), "{pairs:?}: {:?} lacks {n:?}", e.message());
                }
                println!("checked: {code:?}: {}", e.message());
            };
            // A tag alone: refused unless the host allows tags.
            refused(
                &mut csi,
                &[("plugin", &tagged)],
                Code::InvalidArgument,
                &["without a digest", "--allow-plugin-tags"],
            )
            .await;
            // A manifest digest the registry does not have: a bad argument (NOT_FOUND would say
            // the volume does not exist), on the node and at CreateVolume alike.
            let missing = format!("oci://{host}/plugins/tmpfs@sha256:{}", "0".repeat(64));
            refused(&mut csi, &[("plugin", &missing)], Code::InvalidArgument, &["manifest not found", &missing[6..]])
                .await;
            let e = controller.create_volume(create_req("pvc-missing", &missing)).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
            let unknown_repo = format!("oci://{host}/plugins/no-such-repo@sha256:{}", "0".repeat(64));
            refused(&mut csi, &[("plugin", &unknown_repo)], Code::InvalidArgument, &["not found"]).await;
            // A layer that does not hash to its digest: expected and actual named.
            refused(&mut csi, &[("plugin", &corrupt)], Code::DataLoss, &["digest mismatch", &corrupt_layer, &garbage])
                .await;
            // pluginDigest pins another build than the reference holds.
            let other = format!("sha256:{}", "1".repeat(64));
            let pairs = [("plugin", reference.as_str()), ("pluginDigest", other.as_str())];
            refused(&mut csi, &pairs, Code::InvalidArgument, &["digest mismatch", &other, &layer]).await;
            // A pulled plugin calling itself like a stock plugin would get its grants.
            refused(&mut csi, &[("plugin", &impostor)], Code::InvalidArgument, &["\"seaweedfs\"", "stock plugin"])
                .await;
            assert_eq!(mounts_below(node.dirs.root.path()), Vec::<PathBuf>::new(), "nothing mounted");

            // An inline volume's attributes are the pod author's: no plugin by reference.
            let target = node.dirs.target("pod-inline", "inline");
            let mut inline = publish_req(
                "csi-inline-1",
                Path::new(""),
                &target,
                false,
                &ctx(&[("plugin", &reference), ("csi.storage.k8s.io/ephemeral", "true")]),
            );
            inline.staging_target_path.clear();
            let e = csi.node_publish_volume(inline).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
            assert!(e.message().contains("inline (ephemeral)"), "{e:?}");

            // CreateVolume: a tag alone is refused there too.
            let e = controller.create_volume(create_req("pvc-tagged", &tagged)).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
            assert!(e.message().contains("without a digest"), "{e:?}");
        })
    });

    // With tags allowed, a tag is resolved once, and the volume stays on that build when the
    // tag moves.
    args.push("--allow-plugin-tags".into());
    node.restart(&args);
    guarded(&node.dirs, || {
        rt.block_on(async {
            let (mut csi, mut controller) = node.clients().await;
            let staging = node.dirs.staging("pv-tag");
            let vctx = ctx(&[("plugin", &tagged)]);
            stage(&mut csi, stage_req("pv-tag", &staging, &vctx)).await.unwrap();
            let st = node.state_of("pv-tag");
            let pinned = format!("oci://{host}/plugins/tmpfs:v1@{}", manifest_digest(&reference));
            assert_eq!((st["source"].as_str(), st["digest"].as_str()), (Some(pinned.as_str()), Some(layer.as_str())));
            // The tag moves to another plugin; the staged volume keeps its build.
            pushed(&registry, &fixture("paths"), "plugins/tmpfs:v1", None);
            stage(&mut csi, stage_req("pv-tag", &staging, &vctx)).await.unwrap();
            let target = node.dirs.target("pod-t", "pv-tag");
            csi.node_publish_volume(publish_req("pv-tag", &staging, &target, false, &vctx)).await.unwrap();
            assert_eq!(node.state_of("pv-tag")["digest"], layer.as_str(), "pinned for the volume's life");
            csi.node_unpublish_volume(unpublish("pv-tag", &target)).await.unwrap();
            csi.node_unstage_volume(unstage("pv-tag", &staging)).await.unwrap();

            // CreateVolume resolves the tag once and pins the volume to it.
            pushed(&registry, &tmpfs, "plugins/tmpfs:v2", None);
            let v2 = format!("oci://{host}/plugins/tmpfs:v2");
            let created = controller.create_volume(create_req("pvc-1", &v2)).await.unwrap().into_inner();
            let volume = created.volume.unwrap();
            assert_eq!(volume.volume_id, "tmpfs~pvc-1");
            let want = format!("{v2}@{}", manifest_digest(&reference));
            assert_eq!(volume.volume_context.get("plugin"), Some(&want), "{:?}", volume.volume_context);
            assert_eq!(volume.volume_context.get("pluginDigest"), Some(&layer));
            let staging = node.dirs.staging("pvc-1");
            stage(&mut csi, stage_req(&volume.volume_id, &staging, &volume.volume_context)).await.unwrap();
            assert_eq!(mounts_below(&staging), vec![staging.clone()]);
            csi.node_unstage_volume(unstage(&volume.volume_id, &staging)).await.unwrap();
            controller
                .delete_volume(csi::DeleteVolumeRequest { volume_id: volume.volume_id.clone(), ..Default::default() })
                .await
                .unwrap();
            assert_eq!(mounts_below(node.dirs.root.path()), Vec::<PathBuf>::new(), "nothing left mounted");
        })
    });
}

/// The same component with a custom section appended: another digest, the same behaviour (so
/// it is not simply the stock build the host already has).
fn another_build(wasm: &[u8]) -> Vec<u8> {
    let (name, payload) = (b"mounthost-test", b"another build");
    let mut out = wasm.to_vec();
    out.push(0); // custom section
    out.push((1 + name.len() + payload.len()) as u8);
    out.push(name.len() as u8);
    out.extend_from_slice(name);
    out.extend_from_slice(payload);
    out
}

fn create_req(name: &str, plugin: &str) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.into(),
        volume_capabilities: vec![common::multi_writer()],
        parameters: [("plugin".to_string(), plugin.to_string())].into(),
        ..Default::default()
    }
}

/// In process, no root: a runtime started twice over one state directory compiles a pulled
/// plugin once; the second start loads the compiled form from the cache.
#[test]
fn the_compiled_form_is_cached_across_runtime_starts() {
    let registry = Registry::start(RegistryOptions::default());
    let state = tempfile::tempdir().unwrap();
    let mut cfg = Config::new(state.path().to_path_buf());
    cfg.registries.insecure.insert(registry.host());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let rc = RegistryConfig { insecure: cfg.registries.insecure.clone(), ..Default::default() };
        // Published with the library's push, as the CLI does.
        let target = OciRef::parse(&format!("{}/plugins/tmpfs:cache", registry.host())).unwrap();
        let wasm = std::fs::read(fixture("tmpfs")).unwrap();
        let pushed = push_plugin(rc.clone(), &target, &Credentials::Anonymous, wasm, "tmpfs.wasm", &Default::default())
            .await
            .unwrap();
        let artifacts = Arc::new(Artifacts::new(state.path().join("cache"), rc.clone()).unwrap());
        let puller = PluginPull::new(artifacts, None);
        let none = Secrets::default();

        let first = PluginRuntime::new(cfg.runtime()).unwrap();
        let a = pulled::select(&first, &puller, &pushed.reference, false, &none, "v1").await.unwrap();
        assert_eq!(a.plugin.obtained, Obtained::Compiled);
        assert_eq!((a.plugin.info.name.as_str(), a.plugin.digest.to_string()), ("tmpfs", pushed.layer_digest.clone()));
        assert_eq!(a.source, pushed.reference);

        let second = PluginRuntime::new(cfg.runtime()).unwrap();
        let b = pulled::select(&second, &puller, &pushed.reference, false, &none, "v2").await.unwrap();
        assert_eq!(b.plugin.obtained, Obtained::Cached, "a second start does not recompile");

        // Reloading a staged volume's build reads the node's cache, not the registry.
        let served = served(&registry);
        let third = PluginRuntime::new(cfg.runtime()).unwrap();
        let c = pulled::reload(&third, &puller, &pushed.reference, &pushed.layer_digest, &none, "v3").await.unwrap();
        assert_eq!(c.obtained, Obtained::Cached);
        assert_eq!(self::served(&registry), served, "no registry request for a cached build");

        // A pulled plugin may not take a stock plugin's name.
        let target = OciRef::parse(&format!("{}/plugins/model", registry.host())).unwrap();
        let stock = another_build(mounthost::stock::MODEL);
        let model =
            push_plugin(rc, &target, &Credentials::Anonymous, stock, "model.wasm", &Default::default()).await.unwrap();
        let e = pulled::select(&third, &puller, &model.reference, false, &none, "v4").await.unwrap_err();
        assert_eq!(e.kind, mounthost::error::ErrorKind::InvalidArgument, "{e}");
        assert!(e.message.contains("\"model\", the name of a stock plugin"), "{e}");
        println!("checked: compiled once, then from the cache; {e}");

        // A pulled build is never found by name, even with its digest.
        let target = OciRef::parse(&format!("{}/plugins/tmpfs-variant", registry.host())).unwrap();
        let variant = another_build(&std::fs::read(fixture("tmpfs")).unwrap());
        let rc = RegistryConfig { insecure: cfg.registries.insecure.clone(), ..Default::default() };
        let variant = push_plugin(rc, &target, &Credentials::Anonymous, variant, "tmpfs.wasm", &Default::default())
            .await
            .unwrap();
        let loaded = pulled::select(&third, &puller, &variant.reference, false, &none, "v5").await.unwrap();
        assert_eq!(loaded.plugin.info.name, "tmpfs");
        for digest in [None, Some(variant.layer_digest.as_str())] {
            let e = third.resolve("tmpfs", digest).await.unwrap_err();
            assert!(e.to_string().contains("selected only by its reference"), "{digest:?}: {e}");
        }

        // Nor a folder plugin's: the folder's `tmpfs` is the operator's, with its grants. A build
        // pulled before the folder had it is refused from then on, loaded or not.
        let folder = state.path().join("plugins");
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::copy(fixture("tmpfs"), folder.join("tmpfs.wasm")).unwrap();
        let e = pulled::select(&third, &puller, &variant.reference, false, &none, "v5").await.unwrap_err();
        assert!(e.message.contains("\"tmpfs\", the name of the plugin folder's"), "loaded before: {e}");
        let e =
            pulled::reload(&third, &puller, &variant.reference, &variant.layer_digest, &none, "v5").await.unwrap_err();
        assert!(e.message.contains("\"tmpfs\", the name of the plugin folder's"), "a staged volume's build: {e}");
        // The folder's build, pulled before the folder had it, is now that plugin, found by name.
        let by_name = third.resolve("tmpfs", Some(&pushed.layer_digest)).await.unwrap();
        assert_eq!(by_name.digest.to_string(), pushed.layer_digest);
        let with_folder = PluginRuntime::new(cfg.runtime()).unwrap();
        let e = pulled::select(&with_folder, &puller, &variant.reference, false, &none, "v5").await.unwrap_err();
        assert_eq!(e.kind, mounthost::error::ErrorKind::InvalidArgument, "{e}");
        assert!(e.message.contains("\"tmpfs\", the name of the plugin folder's"), "{e}");
        // The very build the folder holds is that plugin, not an impostor.
        let same = pulled::select(&with_folder, &puller, &pushed.reference, false, &none, "v6").await.unwrap();
        assert!(same.plugin.origin.ends_with("tmpfs.wasm"), "{}", same.plugin.origin);
        println!("checked: {e}");
    });
}

/// In process, no root: two StorageClasses' plugins reporting the same name (team-a/tmpfs,
/// team-b/tmpfs, in registries of their own). DeleteVolume of each volume runs the build that
/// volume was created with, pulled with that call's credentials, after a controller restart
/// that lost every loaded build and blob; a repeated DeleteVolume is OK; so is one of a volume
/// with no note (this controller does not know it).
#[test]
fn delete_volume_runs_the_build_that_volume_was_created_with() {
    use mounthost::front::provision::Controller;
    let (user, password) = ("team-a", "pw-a");
    let team_a =
        Registry::start(RegistryOptions { htpasswd: Some((user.into(), password.into())), ..Default::default() });
    let mut team_b = Registry::start(RegistryOptions::default());
    let state = tempfile::tempdir().unwrap();
    let mut cfg = Config::new(state.path().to_path_buf());
    cfg.registries.insecure.extend([team_a.host(), team_b.host()]);
    let a_ref = pushed(&team_a, &fixture("tmpfs"), "team-a/tmpfs:v1", Some((user, password)));
    let work = tempfile::tempdir().unwrap();
    let b_file = work.path().join("tmpfs.wasm");
    std::fs::write(&b_file, another_build(&std::fs::read(fixture("tmpfs")).unwrap())).unwrap();
    let b_ref = pushed(&team_b, &b_file, "team-b/tmpfs:v1", None);
    let auth = format!(r#"{{"auths":{{"{}":{{"username":"{user}","password":"{password}"}}}}}}"#, team_a.host());
    let a_secrets: HashMap<String, String> = [(AUTH_SECRET_KEY.to_string(), auth)].into();
    let notes = state.path().join("cache/plugin-sources");
    // A controller as `mounthost csi` makes it, over a blob cache of its own.
    let controller = |cache: &str| {
        let rc = RegistryConfig { insecure: cfg.registries.insecure.clone(), ..Default::default() };
        let artifacts = Arc::new(Artifacts::new(state.path().join(cache), rc).unwrap());
        let runtime = Arc::new(PluginRuntime::new(cfg.runtime()).unwrap());
        Controller::new(cfg.clone(), runtime).with_puller(Arc::new(PluginPull::new(artifacts, Some(notes.clone()))))
    };
    let delete = |id: &str, secrets: &HashMap<String, String>| csi::DeleteVolumeRequest {
        volume_id: id.into(),
        secrets: secrets.clone(),
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let first = controller("cache-1");
        let mut req = create_req("pvc-a", &a_ref);
        req.secrets = a_secrets.clone();
        let a = first.create(req).await.unwrap().volume.unwrap();
        let b = first.create(create_req("pvc-b", &b_ref)).await.unwrap().volume.unwrap();
        assert_eq!((a.volume_id.as_str(), b.volume_id.as_str()), ("tmpfs~pvc-a", "tmpfs~pvc-b"));
        let files: Vec<_> = std::fs::read_dir(&notes).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(files.len(), 2, "one note per volume: {files:?}");

        // A new controller (nothing loaded, an empty blob cache), with team B's registry gone:
        // deleting team A's volume pulls team A's build, with team A's credentials, only.
        team_b.kill();
        let second = controller("cache-2");
        let served_a = served(&team_a);
        let e = second.delete(delete(&a.volume_id, &HashMap::new())).await.unwrap_err();
        assert_eq!(e.kind, mounthost::error::ErrorKind::FailedPrecondition, "no credentials: {e}");
        assert!(e.message.contains(&team_a.host()), "{e}");
        second.delete(delete(&a.volume_id, &a_secrets)).await.unwrap();
        assert!(served(&team_a) > served_a, "team A's build was pulled from team A's registry");
        second.delete(delete(&a.volume_id, &a_secrets)).await.expect("deleting again is OK");
        // Team B's volume needs team B's build: its registry is down, so not yet.
        let e = second.delete(delete(&b.volume_id, &HashMap::new())).await.unwrap_err();
        assert_eq!(e.kind, mounthost::error::ErrorKind::Unavailable, "{e}");
        team_b.restart();
        second.delete(delete(&b.volume_id, &HashMap::new())).await.unwrap();

        // No note for a volume of a plugin this controller does not have (never noted, or its
        // state was lost): a volume this controller does not know, which CSI answers with OK.
        second.delete(delete("tmpfs~pvc-lost", &HashMap::new())).await.expect("an id this controller does not know");
        println!("checked: both volumes deleted with the build each was made with; an id with no note OK");
    });
}

/// DeleteVolume after the controller lost its notes, through the real front (CSI v1.12
/// DeleteVolume: "If a volume corresponding to the specified volume_id does not exist or the
/// artifacts associated with the volume do not exist anymore, the Plugin MUST reply 0 OK"): a
/// volume created with a plugin pulled by reference (`tmpfs`, which no folder or stock plugin
/// is) is noted at CreateVolume; with the controller's state directory of notes removed and the
/// daemons restarted, its id names a plugin this controller does not know, so DeleteVolume is
/// OK (twice, with a warning in the front's log), and ValidateVolumeCapabilities of it without
/// its reference is NOT_FOUND, with it confirmed.
#[test]
fn delete_volume_after_the_controller_lost_its_notes_is_ok() {
    if !in_private_namespace("delete_volume_after_the_controller_lost_its_notes_is_ok") {
        return;
    }
    let registry = Registry::start(RegistryOptions::default());
    let reference = pushed(&registry, &fixture("tmpfs"), "plugins/tmpfs:v1", None);
    let args = vec![format!("--insecure-registry={}", registry.host()), "--grant=tmpfs:fstype=tmpfs".to_string()];
    let mut node = PluginNode::start(NodeDirs::new(), &args);
    let notes = node.dirs.state.join("cache/plugin-sources");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut req = create_req("pvc-noted", &reference);
    req.parameters.insert("sizeMiB".into(), "8".into());
    let validate = |context: HashMap<String, String>| csi::ValidateVolumeCapabilitiesRequest {
        volume_id: "tmpfs~pvc-noted".into(),
        volume_context: context,
        volume_capabilities: vec![common::multi_writer()],
        ..Default::default()
    };
    let mut created = None;
    guarded(&node.dirs, || {
        rt.block_on(async {
            let (_, mut controller) = node.clients().await;
            let vol = controller.create_volume(req.clone()).await.unwrap().into_inner().volume.unwrap();
            assert_eq!(vol.volume_id, "tmpfs~pvc-noted");
            assert_eq!(vol.volume_context["plugin"], reference, "the pinned reference travels with the volume");
            assert_eq!(std::fs::read_dir(&notes).unwrap().count(), 1, "one note");
            let v = controller.validate_volume_capabilities(validate(vol.volume_context.clone())).await.unwrap();
            assert!(v.into_inner().confirmed.is_some());
            created = Some(vol);
        })
    });
    let vol = created.unwrap();
    // The controller's state is lost (a replaced pod whose state was an emptyDir).
    std::fs::remove_dir_all(&notes).unwrap();
    node.restart(&args);
    guarded(&node.dirs, || {
        rt.block_on(async {
            let (_, mut controller) = node.clients().await;
            let delete = csi::DeleteVolumeRequest { volume_id: vol.volume_id.clone(), secrets: HashMap::new() };
            for _ in 0..2 {
                controller.delete_volume(delete.clone()).await.expect("an id this controller does not know: OK");
            }
            assert!(!notes.exists() || std::fs::read_dir(&notes).unwrap().count() == 0, "no note was made up");
            let front = strip_ansi(&std::fs::read_to_string(node.dirs.root.path().join("front.log")).unwrap());
            let warned =
                front.lines().find(|l| l.contains("no loaded plugin can have made") && l.contains("tmpfs~pvc-noted"));
            assert!(warned.is_some_and(|l| l.contains("WARN")), "a warning names the volume:\n{front}");
            let mut without = vol.volume_context.clone();
            without.remove("plugin");
            without.remove("pluginDigest");
            let e = controller.validate_volume_capabilities(validate(without)).await.unwrap_err();
            assert_eq!(e.code(), Code::NotFound, "{e:?}");
            assert!(e.message().contains("no plugin called tmpfs is loaded"), "{e:?}");
            let v = controller.validate_volume_capabilities(validate(vol.volume_context.clone())).await.unwrap();
            assert!(v.into_inner().confirmed.is_some(), "its reference still names its build");
        })
    });
    println!("checked: DeleteVolume OK twice after the notes were lost; Validate NOT_FOUND without the reference");
}
