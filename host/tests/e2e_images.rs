//! Ordinary container images as `model` volumes (issue 45), end to end, as root, in a private
//! mount namespace: images built with umoci, pushed with skopeo into a real `docker-registry` in
//! every shape a registry holds them (gzip, zstd and uncompressed layers, a Docker v2 manifest,
//! an OCI index and a Docker manifest list of two platforms), staged and published by
//! kubelet-shaped calls through the real front and host daemon, and compared entry by entry
//! with the tree `umoci unpack` makes of the same image (the fixtures: `common::image`; the
//! node and registry harness: `common::model`, `common::registry`).

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::image::{
    self, ESCAPE, Image, LAZY_DELETED, LAZY_KEPT, LAZY_SIZES, LINUX_AMD64, LINUX_ARM64_V8, OpenView, PRIVATE, Pushed,
    SET_UID, Variant, assert_same_tree, fixtures,
};
use common::model::{
    ModelNode, Node, Relay, lazy_ctx, model_ctx, progress, publish_req, run, stage_req, stage_until_done,
    until_progress,
};
use common::registry::{Registry, RegistryOptions};
use common::{in_private_namespace, mounts_below};
use mounthost::proto::csi;
use tonic::Code;

/// A node whose host may pull from `registry` (a `host:port`) over plain HTTP.
fn node_for(registry: &str) -> ModelNode {
    ModelNode::start(vec![format!("--insecure-registry={registry}")])
}

/// Stage `pv` with `ctx` until done (kubelet's retries while it pulls); its staging path.
async fn stage(node: &ModelNode, csi: &mut Node, pv: &str, ctx: &HashMap<String, String>) -> PathBuf {
    let staging = node.dirs.staging(pv);
    let (_, done) = stage_until_done(csi, &stage_req(pv, &staging, ctx), Duration::from_secs(60)).await;
    if let Err(e) = done {
        panic!("staging {pv} ({ctx:?}): {:?}: {}", e.code(), e.message());
    }
    staging
}

/// Stage `pv` with `ctx` until it stops pulling, expecting a refusal: the status.
async fn refused(node: &ModelNode, csi: &mut Node, pv: &str, ctx: &HashMap<String, String>) -> tonic::Status {
    let staging = node.dirs.staging(pv);
    let (_, done) = stage_until_done(csi, &stage_req(pv, &staging, ctx), Duration::from_secs(60)).await;
    let e = done.expect_err(&format!("{pv} ({ctx:?}) was staged"));
    assert_eq!(mounts_below(&staging), Vec::<PathBuf>::new(), "{pv}: refused, yet something is mounted");
    e
}

async fn unstage(csi: &mut Node, pv: &str, staging: &Path) {
    csi.node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: pv.into(),
        staging_target_path: staging.display().to_string(),
    })
    .await
    .unwrap_or_else(|e| panic!("unstaging {pv}: {e:?}"));
}

/// In a volume of the main image seen at `view` (its root the image's `prefix`: `""` or
/// `"models/"`): the 0600 file of 1000:1000 reads for uid 1000 and not for 1001, so do the files
/// of its 0750 directory of 1000, and its set-user-id file is 0755 (the bit cleared). What does
/// not hold.
fn owner_problems(view: &OpenView, prefix: &str, what: &str) -> Vec<String> {
    let at = |p: &str| view.path.join(p.strip_prefix(prefix).unwrap().trim_start_matches('/'));
    let mut out = Vec::new();
    for (file, want) in [(PRIVATE, "secret of 1000\n"), ("models/home/h.txt", "h\n")] {
        match read_text(image::read_as(1000, &at(file))) {
            Ok(got) if got == want => {}
            other => out.push(format!("{what}: uid 1000 reading {file}: {other:?}")),
        }
        match image::read_as(1001, &at(file)) {
            Err(e) if e.contains("Permission denied") => {}
            other => out.push(format!("{what}: uid 1001 reading {file}: {:?}, not EACCES", read_text(other))),
        }
    }
    match std::fs::symlink_metadata(at(SET_UID)) {
        Ok(m) if std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777 == 0o755 => {}
        other => out.push(format!("{what}: {SET_UID} is not 0755: {other:?}")),
    }
    out
}

/// [`owner_problems`], none.
#[track_caller]
fn owners_and_modes_hold(view: &OpenView, prefix: &str, what: &str) {
    let problems = owner_problems(view, prefix, what);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

fn read_text(r: Result<Vec<u8>, String>) -> Result<String, String> {
    r.map(|b| String::from_utf8_lossy(&b).into_owned())
}

fn read_text_io(r: std::io::Result<Vec<u8>>) -> Result<String, String> {
    read_text(r.map_err(|e| e.to_string()))
}

/// Push `variant` of the main image, stage it whole (and publish it) and by `path: /models`,
/// and compare both with umoci's tree.
fn eager_variant(test: &str, variant: Variant) {
    if !in_private_namespace(test) {
        return;
    }
    let fx = fixtures();
    let registry = Registry::start(RegistryOptions::default());
    let repo = format!("images/main-{variant:?}").to_lowercase();
    let pushed = image::push(&registry, &fx.variant(Image::Main, variant), &repo, "v1");
    assert!(pushed.layer_types.iter().all(|t| Some(t.as_str()) == variant.layer_type()), "{pushed:?}");
    let node = node_for(&registry.host());
    run(&node, &registry, async || {
        let mut csi = node.node().await;
        let expected = fx.expected(Image::Main);
        let t = Instant::now();
        let ctx = model_ctx(&pushed.reference, &[("insecure", "true")]);
        let staging = stage(&node, &mut csi, "pv-whole", &ctx).await;
        println!("checked: {variant:?}: staged in {:?}", t.elapsed());
        assert_same_tree(&expected, &staging, &format!("{variant:?}, whole image, staged"));
        let target = node.dirs.target("pod-1", "pv-whole");
        csi.node_publish_volume(publish_req("pv-whole", &staging, &target, &ctx)).await.unwrap();
        assert_same_tree(&expected, &target, &format!("{variant:?}, whole image, published"));
        let write = std::fs::write(target.join("models/new-file"), b"x").unwrap_err();
        assert_eq!(write.raw_os_error(), Some(nix::errno::Errno::EROFS as i32), "{write}");
        owners_and_modes_hold(&OpenView::of(&target), "", &format!("{variant:?}, whole image"));

        let ctx = model_ctx(&pushed.reference, &[("insecure", "true"), ("path", "/models")]);
        let models = stage(&node, &mut csi, "pv-models", &ctx).await;
        assert_same_tree(&expected.join("models"), &models, &format!("{variant:?}, path /models"));
        owners_and_modes_hold(&OpenView::of(&models), "models/", &format!("{variant:?}, path /models"));
        println!("checked: {variant:?}: the whole image and its /models are umoci's trees, owners and modes hold");

        csi.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: "pv-whole".into(),
            target_path: target.display().to_string(),
        })
        .await
        .unwrap();
        unstage(&mut csi, "pv-whole", &staging).await;
        unstage(&mut csi, "pv-models", &models).await;
        assert_eq!(mounts_below(node.dirs.root.path()), Vec::<PathBuf>::new());
    });
}

#[test]
fn an_image_of_gzip_layers_mounts_whole_and_by_path() {
    eager_variant("an_image_of_gzip_layers_mounts_whole_and_by_path", Variant::Gzip);
}

#[test]
fn an_image_of_zstd_layers_mounts_whole_and_by_path() {
    eager_variant("an_image_of_zstd_layers_mounts_whole_and_by_path", Variant::Zstd);
}

#[test]
fn an_image_of_uncompressed_layers_mounts_whole_and_by_path() {
    eager_variant("an_image_of_uncompressed_layers_mounts_whole_and_by_path", Variant::Tar);
}

#[test]
fn an_image_with_a_docker_v2_manifest_mounts_whole_and_by_path() {
    eager_variant("an_image_with_a_docker_v2_manifest_mounts_whole_and_by_path", Variant::V2s2);
}

/// An OCI index and a Docker manifest list of linux/arm64/v8 (listed first) and linux/amd64:
/// the node's platform by default, the other one when `platform` names it, a clear refusal
/// when it names one the index lacks.
#[test]
fn a_multi_platform_image_resolves_to_the_nodes_platform_or_the_named_one() {
    if !in_private_namespace("a_multi_platform_image_resolves_to_the_nodes_platform_or_the_named_one") {
        return;
    }
    let fx = fixtures();
    let registry = Registry::start(RegistryOptions::default());
    let repo = "images/multi";
    let push = |image, variant, tag| image::push(&registry, &fx.variant(image, variant), repo, tag);
    let (amd, arm) = (push(Image::Main, Variant::Gzip, "amd64"), push(Image::Arm64, Variant::Gzip, "arm64"));
    let (amd2, arm2) = (push(Image::Main, Variant::V2s2, "amd64-v2"), push(Image::Arm64, Variant::V2s2, "arm64-v2"));
    // The other platform first: taking the first entry is wrong.
    let oci = image::push_index(&registry, repo, "oci-index", false, &[(&arm, LINUX_ARM64_V8), (&amd, LINUX_AMD64)]);
    let docker =
        image::push_index(&registry, repo, "docker-list", true, &[(&arm2, LINUX_ARM64_V8), (&amd2, LINUX_AMD64)]);
    let node = node_for(&registry.host());
    run(&node, &registry, async || {
        let mut csi = node.node().await;
        for (kind, reference) in [("oci", &oci), ("docker", &docker)] {
            let default = model_ctx(reference, &[("insecure", "true")]);
            let pv = format!("pv-{kind}-default");
            let staging = stage(&node, &mut csi, &pv, &default).await;
            assert_same_tree(&fx.expected(Image::Main), &staging, &format!("{kind} index, the node's platform"));
            unstage(&mut csi, &pv, &staging).await;
            let named = model_ctx(reference, &[("insecure", "true"), ("platform", "linux/arm64/v8")]);
            let pv = format!("pv-{kind}-arm64");
            let staging = stage(&node, &mut csi, &pv, &named).await;
            assert_same_tree(&fx.expected(Image::Arm64), &staging, &format!("{kind} index, platform linux/arm64/v8"));
            unstage(&mut csi, &pv, &staging).await;
            println!("checked: {kind} index: linux/amd64 by default, linux/arm64/v8 when named");
        }
        let absent = model_ctx(&oci, &[("insecure", "true"), ("platform", "linux/s390x")]);
        let e = refused(&node, &mut csi, "pv-s390x", &absent).await;
        assert!(e.message().contains("linux/s390x"), "the refusal names the platform asked for: {e:?}");
        assert!(e.code() != Code::Internal && e.code() != Code::Unknown, "{e:?}");
        println!("checked: a platform the index lacks: {:?}: {}", e.code(), e.message());
    });
}

/// A stage that must be refused: the volume, the parameter, the code that must answer and what
/// the message must name.
type Refusal<'a> = (&'a str, (&'a str, &'a str), Code, &'a str);

/// `path` naming no directory of the image (missing, a file, a symlink, through a symlink to
/// the node's /etc: FailedPrecondition, the image lacks what the volume asks for; with `..`:
/// InvalidArgument), the ModelPack filters on an image and a malformed `platform`
/// (InvalidArgument) are refused, clearly (that code, a message naming the parameter or path),
/// the same when asked again, and nothing is mounted.
#[test]
fn bad_parameters_for_an_image_are_refused_clearly() {
    if !in_private_namespace("bad_parameters_for_an_image_are_refused_clearly") {
        return;
    }
    let fx = fixtures();
    let registry = Registry::start(RegistryOptions::default());
    let pushed = image::push(&registry, &fx.variant(Image::Main, Variant::Gzip), "images/bad", "v1");
    let node = node_for(&registry.host());
    // A well-formed path the image has no directory at: the image, not the parameter, is what
    // fails the volume (FailedPrecondition); a malformed parameter is InvalidArgument.
    let no_dir = Code::FailedPrecondition;
    let escape_ssl = format!("/{ESCAPE}/ssl");
    let cases: Vec<Refusal> = vec![
        ("pv-missing", ("path", "/models/missing"), no_dir, "models/missing"),
        ("pv-file", ("path", "/models/config.json"), no_dir, "models/config.json"),
        ("pv-symlink", ("path", "/models/dir-link"), no_dir, "models/dir-link"),
        ("pv-escape", ("path", "/models/escape"), no_dir, "models/escape"),
        ("pv-escape-ssl", ("path", escape_ssl.as_str()), no_dir, "models/escape"),
        ("pv-dotdot", ("path", "/models/../etc"), Code::InvalidArgument, "path"),
        ("pv-weights", ("weights", "only"), Code::InvalidArgument, "weights"),
        ("pv-types", ("types", "weight"), Code::InvalidArgument, "types"),
        ("pv-include", ("include", "*.json"), Code::InvalidArgument, "include"),
        ("pv-exclude", ("exclude", "*.bin"), Code::InvalidArgument, "exclude"),
        ("pv-platform", ("platform", "linux"), Code::InvalidArgument, "platform"),
    ];
    run(&node, &registry, async || {
        let mut csi = node.node().await;
        let mut wrong = Vec::new();
        for (pv, param, code, needle) in &cases {
            let ctx = model_ctx(&pushed.reference, &[("insecure", "true"), *param]);
            let e = refused(&node, &mut csi, pv, &ctx).await;
            println!("checked: {}={:?}: {:?}: {}", param.0, param.1, e.code(), e.message());
            if e.code() != *code || !e.message().contains(needle) {
                wrong.push(format!(
                    "{}={:?}: {:?} {:?} (want {code:?}, naming {needle:?})",
                    param.0,
                    param.1,
                    e.code(),
                    e.message()
                ));
            }
            // Asked again: the same answer.
            let again = refused(&node, &mut csi, pv, &ctx).await;
            if again.code() != e.code() {
                wrong.push(format!(
                    "{}={:?}: {:?} at first, {:?} when asked again",
                    param.0,
                    param.1,
                    e.code(),
                    again.code()
                ));
            }
        }
        assert!(wrong.is_empty(), "refused wrongly:\n{}", wrong.join("\n"));
        assert_eq!(mounts_below(node.dirs.root.path()), Vec::<PathBuf>::new());
    });
}

/// Lazy volumes (`lazy: "true"`) of the main image in every push variant, whole and by
/// `path: /models`, show umoci's trees, and a 0600 file stays its owner's.
#[test]
fn lazy_image_volumes_show_umocis_trees() {
    if !in_private_namespace("lazy_image_volumes_show_umocis_trees") {
        return;
    }
    let fx = fixtures();
    let registry = Registry::start(RegistryOptions::default());
    let variants = [Variant::Gzip, Variant::Zstd, Variant::Tar, Variant::V2s2];
    let pushed: Vec<Pushed> = variants
        .iter()
        .map(|v| {
            image::push(&registry, &fx.variant(Image::Main, *v), &format!("images/lazy-{v:?}").to_lowercase(), "v1")
        })
        .collect();
    let node = node_for(&registry.host());
    run(&node, &registry, async || {
        let mut csi = node.node().await;
        let expected = fx.expected(Image::Main);
        // Every difference of every volume, then one failure.
        let (mut staged, mut problems) = (Vec::new(), Vec::new());
        let mut compare = |expected: &Path, got: &Path, what: &str| {
            problems.extend(image::tree_differences(expected, got).into_iter().map(|d| format!("{what}: {d}")));
        };
        for (v, p) in variants.iter().zip(&pushed) {
            let pv = format!("pv-lazy-{v:?}").to_lowercase();
            let staging = stage(&node, &mut csi, &pv, &lazy_ctx(&p.reference)).await;
            compare(&expected, &staging, &format!("lazy, {v:?}, whole image"));
            staged.push((pv, staging));
        }
        let mut ctx = lazy_ctx(&pushed[0].reference);
        ctx.insert("path".into(), "/models".into());
        let models = stage(&node, &mut csi, "pv-lazy-models", &ctx).await;
        compare(&expected.join("models"), &models, "lazy, gzip, path /models");
        problems.extend(owner_problems(&OpenView::of(&staged[0].1), "", "lazy, gzip, whole image"));
        problems.extend(owner_problems(&OpenView::of(&models), "models/", "lazy, gzip, path /models"));
        assert!(problems.is_empty(), "lazy volumes differ from umoci's trees:\n{}", problems.join("\n"));
        println!("checked: lazy volumes of every variant, whole and /models, are umoci's trees, owners and modes hold");
        staged.push(("pv-lazy-models".into(), models));
        for (pv, staging) in &staged {
            unstage(&mut csi, pv, staging).await;
        }
        assert_eq!(mounts_below(node.dirs.root.path()), Vec::<PathBuf>::new());
    });
}

/// A lazy volume of an image whose upper, gzip layer deletes (whiteout) a file of its lower,
/// uncompressed layer: while the fill runs (throttled), checks made while the upper layer is
/// still pending included, the file is never there, by name or in its directory's listing,
/// and the files that stay read right (the lower layer's small file and the first bytes of its
/// large one); once filled, the tree is umoci's. An eager volume of the same image is too.
#[test]
fn a_lazy_image_never_serves_a_file_an_upper_layer_deleted_while_it_fills() {
    if !in_private_namespace("a_lazy_image_never_serves_a_file_an_upper_layer_deleted_while_it_fills") {
        return;
    }
    let fx = fixtures();
    let registry = Registry::start(RegistryOptions::default());
    let pushed = image::push(&registry, &fx.variant(Image::Lazy, Variant::Mixed), "images/whiteout", "v1");
    let relay = Relay::start(registry.host());
    relay.throttle(8 << 20);
    let reference = pushed.reference.replace(&registry.host(), &relay.host());
    let node = node_for(&relay.host());
    run(&node, &registry, async || {
        let mut csi = node.node().await;
        let expected = fx.expected(Image::Lazy);
        let t = Instant::now();
        let staging = stage(&node, &mut csi, "pv-whiteout", &lazy_ctx(&reference)).await;
        let staged_after = t.elapsed();
        // The checks begin once the volume's server is connected to the host daemon: before,
        // a reader's wish for the pending upper layer reaches no one and the layers are fetched
        // in their turn, the upper one last (the fill can then end before any read of it).
        let at_stage =
            until_progress(&node, "pv-whiteout", Duration::from_secs(10), |p| p.connected && p.layers > 0).await;
        println!("checked: staged after {staged_after:?}, {} bytes relayed, progress {at_stage:?}", relay.sent());
        let (doomed, kept) = (staging.join(LAZY_DELETED), staging.join(LAZY_KEPT));
        let (big, head_len) = ("models/big.bin", 64 << 10);
        let big_head = image::read_head(&expected.join(big), head_len);
        let models = staging.join("models");
        let (mut during_fill, mut upper_pending, mut checks) = (0u32, 0u32, 0u32);
        // Reads of files that stay, right, and of those the ones the fill had not ended after.
        let (mut reads_right, mut read_during_fill) = (0u32, 0u32);
        // What showed the deleted file, and errors other than its absence.
        let (mut served, mut failed) = (Vec::new(), Vec::new());
        // The evidence that the checks ran while the fill did: the relay had passed a small part
        // of the blobs when the first began (lookups may wait for the upper layer: one can take
        // most of the fill).
        let sent_at_first = relay.sent();
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let p = progress(&node, "pv-whiteout").await;
            // No progress reported yet: still starting.
            let filling = p.as_ref().is_none_or(|p| p.layers == 0 || p.layers_complete < p.layers);
            // A listing of models/ (which the pending upper layer may change) waits for that
            // layer, as a lookup of a name the served layers lack does.
            match std::fs::read_dir(&models) {
                Ok(entries) => {
                    let names: Vec<String> =
                        entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
                    if names.iter().any(|n| n == "doomed.bin" || n.starts_with(".wh.")) {
                        served.push(format!("{:?}: listed in {names:?}", t.elapsed()));
                    }
                }
                Err(e) => failed.push(format!("{:?}: listing models/ failed: {e}", t.elapsed())),
            }
            match std::fs::symlink_metadata(&doomed) {
                Ok(m) => served.push(format!("{:?}: lstat found it ({} bytes)", t.elapsed(), m.len())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => failed.push(format!("{:?}: lstat failed otherwise than ENOENT: {e}", t.elapsed())),
            }
            if let Ok(bytes) = std::fs::read(&doomed) {
                served.push(format!("{:?}: read {} bytes of it", t.elapsed(), bytes.len()));
            }
            // Files the volume must show while it fills: the lower layer's small file, and the
            // first bytes of its large one (fetched on demand ahead of the fill).
            let mut right = true;
            match std::fs::read(&kept) {
                Ok(b) if b == b"kept\n" => {}
                other => {
                    right = false;
                    failed.push(format!("{:?}: reading {LAZY_KEPT}: {:?}", t.elapsed(), read_text_io(other)));
                }
            }
            match image::try_read_head(&staging.join(big), head_len) {
                Ok(b) if b == big_head => {}
                Ok(b) => {
                    right = false;
                    failed.push(format!(
                        "{:?}: the first {} bytes of {big} read are not the image's",
                        t.elapsed(),
                        b.len()
                    ));
                }
                Err(e) => {
                    right = false;
                    failed.push(format!("{:?}: reading the head of {big}: {e}", t.elapsed()));
                }
            }
            if right {
                reads_right += 1;
                // Read during the fill: it had not ended once they were done.
                let after = progress(&node, "pv-whiteout").await;
                if after.as_ref().is_none_or(|p| p.layers == 0 || p.layers_complete < p.layers) {
                    read_during_fill += 1;
                }
            }
            checks += 1;
            // The window that matters: the upper layer (with the whiteout) not unpacked yet.
            if p.as_ref().is_some_and(|p| p.layers_pending > 0) {
                upper_pending += 1;
            }
            if filling {
                during_fill += 1;
            } else {
                break;
            }
            assert!(Instant::now() < until, "the fill did not end in 30 s ({} bytes relayed): {p:?}", relay.sent());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(served.is_empty(), "the deleted {LAZY_DELETED} was served:\n{}", served.join("\n"));
        assert!(
            failed.is_empty(),
            "looking for the deleted {LAZY_DELETED} or reading what stays failed:\n{}",
            failed.join("\n")
        );
        assert_eq!(std::fs::read_to_string(&kept).unwrap(), "kept\n");
        println!(
            "checked: staged after {staged_after:?}; {LAZY_DELETED} absent in {checks} checks, the first after {sent_at_first} bytes relayed, {during_fill} during the fill, {upper_pending} while the upper layer was pending; {LAZY_KEPT} and the head of {big} read right {reads_right} times, {read_during_fill} during the fill"
        );
        assert!(
            upper_pending > 0,
            "no check was made while the upper layer (the whiteout) was pending: the test proved nothing"
        );
        assert!(read_during_fill > 0, "no read of the files that stay was made during the fill");
        assert!(
            sent_at_first < LAZY_SIZES.0 / 2,
            "{sent_at_first} bytes had been relayed when the first check began: the fill was nearly over, the \
             test proved nothing"
        );
        assert_same_tree(&expected, &staging, "lazy, whiteout in a gzip layer above an uncompressed one");
        unstage(&mut csi, "pv-whiteout", &staging).await;

        let eager = model_ctx(&reference, &[("insecure", "true")]);
        relay.throttle(u64::MAX);
        let staging = stage(&node, &mut csi, "pv-whiteout-eager", &eager).await;
        assert_same_tree(&expected, &staging, "eager, whiteout in a gzip layer above an uncompressed one");
        unstage(&mut csi, "pv-whiteout-eager", &staging).await;
        assert_eq!(mounts_below(node.dirs.root.path()), Vec::<PathBuf>::new());
    });
}

/// Every path below `dir` (symbolic links not followed, errors skipped) whose name is one of
/// `names`.
fn find_named(dir: &Path, names: &[&str], depth: usize, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if names.iter().any(|n| e.file_name() == *n) {
            out.push(p.clone());
        }
        if depth < 64 && e.file_type().is_ok_and(|t| t.is_dir()) {
            find_named(&p, names, depth + 1, out);
        }
    }
}

/// [`image::tree_differences`], or the panic that listing the trees ended in.
fn differences(expected: &Path, got: &Path, what: &str) -> Vec<String> {
    match std::panic::catch_unwind(|| image::tree_differences(expected, got)) {
        Ok(diff) => diff.into_iter().map(|d| format!("{what}: {d}")).collect(),
        Err(e) => {
            let why = e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
            vec![format!("{what}: listing {} failed: {}", got.display(), why.unwrap_or_default())]
        }
    }
}

/// An image whose top layer is hostile ([`Image::Hostile`]: whiteouts of `.` and `..`, a file
/// below a symbolic link of its layer to /etc, a `..` entry of 2 MiB, a directory of a
/// whiteout's name with a child, files and directories named as the unpacker's own marker)
/// stages, eagerly (zstd layers) and lazily (gzip and uncompressed layers, each a blob the node
/// has not unpacked before): the volume is the lower layers' tree with the layer's legitimate
/// entries alone, nothing of the hostile ones is anywhere on the node (or at the node's /etc, or
/// above its state), and another volume of the main image, staged before, is still umoci's
/// tree after each.
#[test]
fn hostile_layer_entries_are_left_out_and_never_reach_outside_the_volume() {
    if !in_private_namespace("hostile_layer_entries_are_left_out_and_never_reach_outside_the_volume") {
        return;
    }
    let fx = fixtures();
    let registry = Registry::start(RegistryOptions::default());
    let main = image::push(&registry, &fx.variant(Image::Main, Variant::Gzip), "images/bystander", "v1");
    let push = |v: Variant| {
        image::push(&registry, &fx.variant(Image::Hostile, v), &format!("images/hostile-{v:?}").to_lowercase(), "v1")
    };
    let (zstd, gzip, tar) = (push(Variant::Zstd), push(Variant::Gzip), push(Variant::Tar));
    let node = node_for(&registry.host());
    // Outside the node's directories: above its root (where `..` of the root's children
    // leads), and the /etc the link names.
    let outside: Vec<PathBuf> = [node.dirs.root.path().parent().unwrap(), Path::new("/etc"), Path::new("/")]
        .iter()
        .flat_map(|d| image::HOSTILE_NEVER.iter().map(|n| d.join(n)))
        .collect();
    let stale: Vec<&PathBuf> = outside.iter().filter(|p| p.symlink_metadata().is_ok()).collect();
    assert!(stale.is_empty(), "left by an earlier run? {stale:?}");
    run(&node, &registry, async || {
        let mut csi = node.node().await;
        let (expected_main, expected) = (fx.expected(Image::Main), fx.expected(Image::Hostile));
        let bystander =
            stage(&node, &mut csi, "pv-bystander", &model_ctx(&main.reference, &[("insecure", "true")])).await;
        assert_same_tree(&expected_main, &bystander, "the bystander volume, staged");
        let rounds = [
            ("eager, zstd", "pv-hostile-eager", model_ctx(&zstd.reference, &[("insecure", "true")])),
            ("lazy, gzip", "pv-hostile-lazy-gzip", lazy_ctx(&gzip.reference)),
            ("lazy, uncompressed", "pv-hostile-lazy-tar", lazy_ctx(&tar.reference)),
        ];
        // Every problem of every round, then one failure.
        let mut problems = Vec::new();
        for (what, pv, ctx) in &rounds {
            let t = Instant::now();
            let staging = node.dirs.staging(pv);
            let (_, done) = stage_until_done(&mut csi, &stage_req(pv, &staging, ctx), Duration::from_secs(60)).await;
            match done {
                Err(e) => problems.push(format!("{what}: the stage failed: {:?}: {}", e.code(), e.message())),
                Ok(()) => {
                    if ctx.contains_key("lazy") {
                        // Compare once filled (a listing waits for pending layers anyway).
                        let until = Instant::now() + Duration::from_secs(20);
                        loop {
                            let p = progress(&node, pv).await;
                            if let Some(p) = &p
                                && !p.failed.is_empty()
                            {
                                problems.push(format!("{what}: the lazy volume failed: {}", p.failed));
                                break;
                            }
                            if p.as_ref().is_some_and(|p| p.layers > 0 && p.layers_complete == p.layers) {
                                break;
                            }
                            if Instant::now() > until {
                                problems.push(format!("{what}: the fill did not end in 20 s: {p:?}"));
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                    problems.extend(differences(&expected, &staging, &format!("{what}: the hostile volume")));
                    println!(
                        "checked: {what}: staged, compared with the tree of its legitimate entries, after {:?}",
                        t.elapsed()
                    );
                }
            }
            let mut found = Vec::new();
            find_named(node.dirs.root.path(), &image::HOSTILE_NEVER, 0, &mut found);
            found.extend(outside.iter().filter(|p| p.symlink_metadata().is_ok()).cloned());
            problems.extend(found.iter().map(|p| format!("{what}: {} exists", p.display())));
            problems.extend(differences(&expected_main, &bystander, &format!("{what}: the bystander volume")));
        }
        for p in &problems {
            println!("checked: PROBLEM: {p}");
        }
        assert!(problems.is_empty(), "the hostile layer had its way:\n{}", problems.join("\n"));
        println!(
            "checked: hostile layer: eager and lazy volumes hold its legitimate entries alone, none of {:?} exists on the node, the bystander volume is intact",
            image::HOSTILE_NEVER
        );
        for (_, pv, _) in &rounds {
            unstage(&mut csi, pv, &node.dirs.staging(pv)).await;
        }
        unstage(&mut csi, "pv-bystander", &bystander).await;
        assert_eq!(mounts_below(node.dirs.root.path()), Vec::<PathBuf>::new());
    });
}
