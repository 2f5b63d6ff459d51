//! Signed models end to end (docs/signing.md), as root, in a private mount namespace: models
//! signed by the real OpenSSF `model_signing` CLI (installed in `.local/venv` by
//! scripts/test.sh) with keys openssl makes, pushed into a real `docker-registry`, staged
//! through the real front and host daemon against a trust directory laid out as a ConfigMap
//! mounts it. Each refusal is shown first as an attack that would mount without the policy.

mod common;

use std::time::Duration;

use tonic::Code;

use common::model::*;
use common::registry::{Class, Content, ModelBuilder, Packing, PushedModel, Registry, RegistryOptions};
use common::signing::*;
use common::{in_private_namespace, mounts_below};
use mounthost::proto::csi;

#[test]
fn only_a_model_signed_by_a_trusted_key_mounts_and_a_staged_one_survives_its_signature_going() {
    if !in_private_namespace(
        "only_a_model_signed_by_a_trusted_key_mounts_and_a_staged_one_survives_its_signature_going",
    ) {
        return;
    }
    let registry = Registry::start(RegistryOptions::default());
    let work = tempfile::tempdir().unwrap();
    let keys = work.path().join("keys");
    std::fs::create_dir(&keys).unwrap();
    let (corp_key, corp_pub) = keypair(&keys, "corp");
    let (rogue_key, _) = keypair(&keys, "rogue");
    let trust = trust_dir(&[("corp", &corp_pub)]);

    // A model signed by corp's key, its signature a layer of the artifact.
    let good = work.path().join("good");
    model_dir(&good, 3 << 20);
    let sig = sign(&good, &corp_key, &work.path().join("good.sig"));
    let signed = push_dir(&registry, &good, "models/signed", Some(&sig));
    // The same files, unsigned.
    let unsigned = push_dir(&registry, &good, "models/unsigned", None);
    // Signed by a key outside the trust set.
    let rogue_sig = sign(&good, &rogue_key, &work.path().join("rogue.sig"));
    let foreign = push_dir(&registry, &good, "models/foreign", Some(&rogue_sig));
    // Weights changed after signing (a raw layer: refused before it is fetched).
    let tampered_w = work.path().join("tampered-w");
    model_dir(&tampered_w, 3 << 20);
    let sig_w = sign(&tampered_w, &corp_key, &work.path().join("tw.sig"));
    std::fs::write(tampered_w.join("model.safetensors"), b"other weights").unwrap();
    let tampered_weights = push_dir(&registry, &tampered_w, "models/tampered-weights", Some(&sig_w));
    // The config changed after signing (a tar layer: refused once unpacked, before it is linked).
    let tampered_c = work.path().join("tampered-c");
    model_dir(&tampered_c, 1 << 20);
    let sig_c = sign(&tampered_c, &corp_key, &work.path().join("tc.sig"));
    std::fs::write(tampered_c.join("config.json"), br#"{"architectures":["Evil"]}"#).unwrap();
    let tampered_config = push_dir(&registry, &tampered_c, "models/tampered-config", Some(&sig_c));
    // A signed file the artifact lacks.
    let extra = work.path().join("extra");
    model_dir(&extra, 1 << 20);
    std::fs::write(extra.join("safety.json"), b"{}").unwrap();
    let sig_x = sign(&extra, &corp_key, &work.path().join("x.sig"));
    let lacking = push_dir(&registry, &extra, "models/lacking", Some(&sig_x));
    // Signed, its signature attached as a referrer by `mounthost model sign`.
    let referred = push_dir(&registry, &good, "models/referred", None);

    let node = ModelNode::start(vec![
        format!("--insecure-registry={}", registry.host()),
        format!("--trust-dir={}", trust.path().display()),
    ]);
    run(&node, &registry, async || {
        let mut csi = node.node().await;
        // The attack without a policy: every one of them mounts.
        for (pv, m) in [("pv-open-1", &unsigned), ("pv-open-2", &tampered_config)] {
            stage(&node, &mut csi, pv, &signed_ctx(&m.reference, "", &[])).await.unwrap();
            let staging = node.dirs.staging(pv);
            csi.node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: pv.into(),
                staging_target_path: staging.display().to_string(),
            })
            .await
            .unwrap();
        }
        println!("checked: without signedBy an unsigned and a tampered model both mount");

        // A key-signed model mounts, byte for byte, and ListVolumes says who signed it.
        let ctx = signed_ctx(&signed.reference, "corp", &[]);
        stage(&node, &mut csi, "pv-signed", &ctx).await.unwrap();
        let staging = node.dirs.staging("pv-signed");
        let target = node.dirs.target("pod-signed", "pv-signed");
        csi.node_publish_volume(publish_req("pv-signed", &staging, &target, &ctx)).await.unwrap();
        assert_eq!(tree(&target), expected(&signed, |_| true), "every file, model.sig included");
        let v = node.volumes().await.into_iter().find(|v| v.volume_id == "pv-signed").unwrap();
        let t = v.verification.clone().expect("a verification");
        assert_eq!((t.signer.as_str(), t.found_in.as_str()), ("corp", "model.sig"), "{t:?}");
        assert_eq!(t.manifest, signed.manifest_digest);
        assert_eq!(t.signed_by, ["corp"]);
        let listed = node.cli(&["client", "list"]);
        let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
        let mine = listed.as_array().unwrap().iter().find(|v| v["volumeId"] == "pv-signed").unwrap();
        assert_eq!(mine["trust"]["signed"]["by"], "corp", "{mine}");
        assert!(mine["trust"]["indexed"].is_null(), "{mine}");
        println!("checked: a model signed by trust entry corp mounted: {}", mine["trust"]);

        // Refusals, each naming the reference, the file and the reason.
        let msg = refused(
            &node,
            &mut csi,
            "pv-unsigned",
            &signed_ctx(&unsigned.reference, "corp", &[]),
            &["not signed", &unsigned.manifest_digest],
        )
        .await;
        println!("checked: unsigned refused: {msg}");
        let msg = refused(&node, &mut csi, "pv-foreign", &signed_ctx(&foreign.reference, "corp", &[]), &["corp"]).await;
        println!("checked: signed by a key outside the trust set refused: {msg}");
        let msg = refused(
            &node,
            &mut csi,
            "pv-tw",
            &signed_ctx(&tampered_weights.reference, "corp", &[]),
            &["model.safetensors", "sha256"],
        )
        .await;
        assert!(!tampered_weights.cached(&node.dirs.state, "model.safetensors"), "the weights were never fetched");
        println!("checked: weights changed after signing refused before a byte of them was fetched: {msg}");
        let msg =
            refused(&node, &mut csi, "pv-tc", &signed_ctx(&tampered_config.reference, "corp", &[]), &["config.json"])
                .await;
        // Its blobs stay in the cache (verified by digest), and a retry fetches nothing more.
        assert!(tampered_config.cached(&node.dirs.state, "config.json"));
        let before = node.fetched();
        refused(&node, &mut csi, "pv-tc", &signed_ctx(&tampered_config.reference, "corp", &[]), &["config.json"]).await;
        assert_eq!(node.fetched(), before, "the retry fetched nothing");
        println!("checked: a config changed after signing refused once unpacked: {msg}");
        let msg = refused(
            &node,
            &mut csi,
            "pv-lacking",
            &signed_ctx(&lacking.reference, "corp", &[]),
            &["safety.json", "lacks"],
        )
        .await;
        println!("checked: a signed file the artifact lacks refused: {msg}");
        // A registry writer drops a signed file: its layer repacked without it (annotation kept),
        // or its layer given a media type the plugin skips. Both mount without a policy.
        // (The repacked layer holds a signed file with its signed bytes: nothing unlisted is served.)
        let config = std::fs::read(good.join("config.json")).unwrap();
        let other = registry.push_blob(&signed.repo, tar_of("config.json", &config).as_slice());
        let emptied = tampered_manifest(&registry, &signed, "emptied", "tokenizer.json", |l| {
            l["digest"] = other.digest.clone().into();
            l["size"] = other.size.into();
            l["mediaType"] = "application/vnd.cncf.model.weight.config.v1.tar".into();
        });
        let skipped = tampered_manifest(&registry, &signed, "skipped", "tokenizer.json", |l| {
            l["mediaType"] = "application/vnd.cncf.model.weight.config.v9.tar".into();
        });
        for (pv, reference) in [("pv-open-3", &emptied), ("pv-open-4", &skipped)] {
            stage(&node, &mut csi, pv, &signed_ctx(reference, "", &[])).await.unwrap();
        }
        let msg = refused(&node, &mut csi, "pv-emptied", &signed_ctx(&emptied, "corp", &[]), &["tokenizer.json"]).await;
        println!("checked: a signed file's layer repacked without it refused: {msg}");
        let msg =
            refused(&node, &mut csi, "pv-skipped", &signed_ctx(&skipped, "corp", &[]), &["tokenizer.json", "v9"]).await;
        println!("checked: a signed file's layer given a media type no filter selects refused: {msg}");

        // signedBy naming an entry the trust set does not have.
        refused(&node, &mut csi, "pv-nobody", &signed_ctx(&signed.reference, "nobody", &[]), &["nobody"]).await;

        // Counted by reason, and logged at warn once each.
        let scrape = node.scrape();
        let count =
            |result: &str| scrape.value("mounthost_signature_checks_total", &[("kind", "model"), ("result", result)]);
        assert!(count("verified") >= 1.0, "{}", scrape.dump());
        for reason in ["unsigned", "untrusted", "mismatch", "missing"] {
            assert!(count(reason) >= 1.0, "{reason}: {}", scrape.dump());
        }
        let logged = node
            .dirs
            .logs()
            .lines()
            .filter(|l| l.contains("WARN mounthost::daemon::signed: signature refused"))
            .count();
        assert!(logged >= 7, "a log line per refusal: {logged}");

        // Filters: the README is signed, and left out by `types`, so not required.
        let ctx_f = signed_ctx(&signed.reference, "corp", &[("types", "weight,config")]);
        stage(&node, &mut csi, "pv-filtered", &ctx_f).await.unwrap();
        let target_f = node.dirs.target("pod-filtered", "pv-filtered");
        csi.node_publish_volume(publish_req("pv-filtered", &node.dirs.staging("pv-filtered"), &target_f, &ctx_f))
            .await
            .unwrap();
        let names: Vec<String> = tree(&target_f).into_iter().map(|(p, _)| p).collect();
        assert_eq!(names, ["config.json", "model.safetensors", "tokenizer.json"]);
        unstage(&mut csi, "pv-filtered", &node.dirs.staging("pv-filtered"), &target_f).await;

        // The signature as a referrer, attached by `mounthost model sign`.
        let out = node.cli(&[
            "--insecure-registry",
            &registry.host(),
            "model",
            "sign",
            &referred.reference,
            "--signature",
            &work.path().join("good.sig").display().to_string(),
        ]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let ctx_r = signed_ctx(&referred.reference, "corp", &[]);
        stage(&node, &mut csi, "pv-referred", &ctx_r).await.unwrap();
        let v = node.volumes().await.into_iter().find(|v| v.volume_id == "pv-referred").unwrap();
        assert_eq!(v.verification.as_ref().unwrap().found_in, "referrer", "{v:?}");

        // The signature deleted from the registry: nothing changes for the staged volume, through a
        // restage, an unhealthy volume's restage, and a killed and restarted host daemon.
        drop_referrers(&registry, &referred);
        let staging_r = node.dirs.staging("pv-referred");
        csi.node_stage_volume(stage_req("pv-referred", &staging_r, &ctx_r)).await.unwrap();
        nix::mount::umount2(&staging_r, nix::mount::MntFlags::MNT_DETACH).unwrap();
        stage(&node, &mut csi, "pv-referred", &ctx_r).await.unwrap();
        assert!(!mounts_below(&staging_r).is_empty(), "restaged");
        node.restart_host(vec![
            format!("--insecure-registry={}", registry.host()),
            format!("--trust-dir={}", trust.path().display()),
        ]);
        let mut csi = node.node().await;
        csi.node_stage_volume(stage_req("pv-referred", &staging_r, &ctx_r)).await.unwrap();
        let v = node.volumes().await.into_iter().find(|v| v.volume_id == "pv-referred").unwrap();
        assert_eq!(v.verification.as_ref().unwrap().signer, "corp", "{v:?}");
        // A new volume of it is refused now: the registry has no signature of it any more.
        refused(&node, &mut csi, "pv-referred-2", &signed_ctx(&referred.reference, "corp", &[]), &["not signed"]).await;
        println!("checked: a signature deleted after the first stage changed nothing for the staged volume");

        // A restage must ask for the same policy.
        let err = csi
            .node_stage_volume(stage_req("pv-referred", &staging_r, &signed_ctx(&referred.reference, "", &[])))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");

        unstage(&mut csi, "pv-signed", &staging, &target).await;
        csi.node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: "pv-referred".into(),
            staging_target_path: staging_r.display().to_string(),
        })
        .await
        .unwrap();
    });
    let log = node.dirs.logs();
    assert!(
        log.lines().filter(|l| l.contains("WARN") && l.contains("signature refused")).count() >= 6,
        "a log line per refusal"
    );
}

#[test]
fn the_node_requires_a_signature_for_every_model_and_a_storage_class_cannot_turn_it_off() {
    if !in_private_namespace("the_node_requires_a_signature_for_every_model_and_a_storage_class_cannot_turn_it_off") {
        return;
    }
    let registry = Registry::start(RegistryOptions::default());
    let work = tempfile::tempdir().unwrap();
    let (corp_key, corp_pub) = keypair(work.path(), "corp");
    let (team_key, team_pub) = keypair(work.path(), "team");
    let trust = trust_dir(&[("corp", &corp_pub)]);
    let dir = work.path().join("m");
    model_dir(&dir, 1 << 20);
    let signed = push_dir(&registry, &dir, "models/corp", Some(&sign(&dir, &corp_key, &work.path().join("c.sig"))));
    let team = push_dir(&registry, &dir, "models/team", Some(&sign(&dir, &team_key, &work.path().join("t.sig"))));
    let unsigned = push_dir(&registry, &dir, "models/plain", None);
    let flags = |required: bool| {
        let mut f =
            vec![format!("--insecure-registry={}", registry.host()), format!("--trust-dir={}", trust.path().display())];
        f.extend(required.then(|| "--require-signature".to_string()));
        f
    };
    // A model whose tag later moves to a signed model with fewer files.
    let moving = push_dir(&registry, &dir, "models/moving", Some(&sign(&dir, &corp_key, &work.path().join("v1.sig"))));
    let node = ModelNode::start(flags(false));
    run(&node, &registry, async || {
        let mut csi = node.node().await;
        // Staged before the node required signatures: an unsigned volume, and the moving one.
        stage(&node, &mut csi, "pv-before", &signed_ctx(&unsigned.reference, "", &[])).await.unwrap();
        stage(&node, &mut csi, "pv-moving", &signed_ctx(&moving.reference, "", &[])).await.unwrap();
        node.restart_host(flags(true));
        let mut csi = node.node().await;
        // Its restage (the staging mount lost) is checked against the policy now in force.
        let staging = node.dirs.staging("pv-before");
        nix::mount::umount2(&staging, nix::mount::MntFlags::MNT_DETACH).unwrap();
        let err = stage(&node, &mut csi, "pv-before", &signed_ctx(&unsigned.reference, "", &[])).await.unwrap_err();
        assert!(err.code() == Code::FailedPrecondition && err.message().contains("not signed"), "{err:?}");
        assert!(mounts_below(&staging).is_empty());
        // The tag moved to a signed model without the README: a restage serves that model's
        // files only, nothing its earlier stage left.
        std::fs::remove_file(dir.join("README.md")).unwrap();
        let fewer = ModelBuilder::new()
            .file("config.json", Content::File(dir.join("config.json")), Class::Config, Packing::Tar)
            .file("tokenizer.json", Content::File(dir.join("tokenizer.json")), Class::Config, Packing::TarGzip)
            .file("model.safetensors", Content::File(dir.join("model.safetensors")), Class::Weight, Packing::Raw)
            .file("model.sig", sign(&dir, &corp_key, &work.path().join("v2.sig")).as_slice(), Class::Doc, Packing::Raw)
            .push(&registry, "models/moving", "v1");
        let staging_m = node.dirs.staging("pv-moving");
        assert!(staging_m.join("README.md").exists());
        nix::mount::umount2(&staging_m, nix::mount::MntFlags::MNT_DETACH).unwrap();
        stage(&node, &mut csi, "pv-moving", &signed_ctx(&moving.reference, "", &[])).await.unwrap();
        assert_eq!(tree(&staging_m), expected(&fewer, |_| true), "the new manifest's files, and no other");
        println!("checked: volumes staged before --require-signature were checked again at their restage");
        // No signedBy: any entry of the trust set.
        stage(&node, &mut csi, "pv-any", &signed_ctx(&signed.reference, "", &[])).await.unwrap();
        refused(&node, &mut csi, "pv-plain", &signed_ctx(&unsigned.reference, "", &[]), &["not signed"]).await;
        // Nothing in a volume's attributes turns it off.
        for (k, v) in [("signedBy", ""), ("signedBy", "none"), ("requireSignature", "false")] {
            let mut ctx = signed_ctx(&unsigned.reference, "", &[]);
            ctx.insert(k.into(), v.into());
            let err = stage(&node, &mut csi, "pv-off", &ctx).await.unwrap_err();
            assert!(
                matches!(err.code(), Code::InvalidArgument | Code::FailedPrecondition),
                "{k}={v:?} did not turn the requirement off: {err:?}"
            );
        }
        // A new entry in the ConfigMap applies at the next stage, without a restart.
        refused(&node, &mut csi, "pv-team", &signed_ctx(&team.reference, "", &[]), &[]).await;
        let data = trust.path().join("..2026_12_07_00_00_00.000000001");
        std::fs::copy(&team_pub, data.join("team.pub")).unwrap();
        std::os::unix::fs::symlink("..data/team.pub", trust.path().join("team.pub")).unwrap();
        stage(&node, &mut csi, "pv-team", &signed_ctx(&team.reference, "", &[])).await.unwrap();
        // And its removal refuses the next new volume, while the staged one stays.
        std::fs::remove_file(trust.path().join("team.pub")).unwrap();
        refused(&node, &mut csi, "pv-team-2", &signed_ctx(&team.reference, "", &[]), &[]).await;
        assert!(node.volumes().await.iter().any(|v| v.volume_id == "pv-team" && v.healthy));
        println!(
            "checked: --require-signature held for a volume without signedBy; a trust entry added and removed applied without a restart"
        );
    });
}

#[test]
fn a_lazy_volume_under_a_policy_needs_a_signed_index_and_never_serves_a_corrupted_chunk() {
    if !in_private_namespace("a_lazy_volume_under_a_policy_needs_a_signed_index_and_never_serves_a_corrupted_chunk") {
        return;
    }
    let registry = Registry::start(RegistryOptions::default());
    let work = tempfile::tempdir().unwrap();
    let (corp_key, corp_pub) = keypair(work.path(), "corp");
    let (rogue_key, _) = keypair(work.path(), "rogue");
    let trust = trust_dir(&[("corp", &corp_pub)]);
    let dir = work.path().join("m");
    model_dir(&dir, 32 << 20);
    let model =
        push_dir(&registry, &dir, "models/lazy-signed", Some(&sign(&dir, &corp_key, &work.path().join("s.sig"))));
    let plain = push_dir(&registry, &dir, "models/lazy-plain", None);
    let relay = Relay::start(registry.host());
    let through = |m: &PushedModel| m.reference.replace(&registry.host(), &relay.host());
    let reference = through(&model);
    let node = ModelNode::start(vec![
        format!("--insecure-registry={}", relay.host()),
        format!("--trust-dir={}", trust.path().display()),
    ]);
    let index = |extra: &[&str]| {
        let mut args = vec![
            "--insecure-registry",
            relay.host().leak(),
            "model",
            "index",
            reference.as_str().to_owned().leak(),
            "--chunk-mib",
            "1",
        ];
        args.extend_from_slice(extra);
        let out = node.cli(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let ctx = {
        let mut c = lazy_ctx(&reference);
        c.insert("signedBy".into(), "corp".into());
        c
    };
    run(&node, &registry, async || {
        let mut csi = node.node().await;
        // `chunkIndex: required` without an index fails closed, naming the reference.
        let mut required = lazy_ctx(&through(&plain));
        required.insert("chunkIndex".into(), "required".into());
        let err = stage(&node, &mut csi, "pv-noindex", &required).await.unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
        assert!(err.message().contains(&through(&plain)) && err.message().contains("no chunk index"), "{err:?}");
        // Under a policy: no index, an unsigned index, and one signed by a key outside the set are refused.
        refused(&node, &mut csi, "pv-lazy", &ctx, &["chunk index signed by corp"]).await;
        index(&[]);
        refused(&node, &mut csi, "pv-lazy", &ctx, &["chunk index"]).await;
        index(&["--sign-key", rogue_key.to_str().unwrap()]);
        refused(&node, &mut csi, "pv-lazy", &ctx, &["chunk index"]).await;
        println!("checked: a lazy volume under a policy without an index signed by a trusted key was refused");
        // Signed by corp: it stages, and every chunk is checked against that index.
        let pushed = index(&["--sign-key", corp_key.to_str().unwrap()]);
        // One chunk of the weights is corrupted in the registry, after the index was made.
        let digest = model.layer("model.safetensors").digest.clone();
        registry.corrupt(&digest, (9 << 20) + 7);
        relay.throttle(2 << 20);
        stage(&node, &mut csi, "pv-lazy", &ctx).await.unwrap();
        let staging = node.dirs.staging("pv-lazy");
        let target = node.dirs.target("pod-lazy", "pv-lazy");
        csi.node_publish_volume(publish_req("pv-lazy", &staging, &target, &ctx)).await.unwrap();
        let v = node.volumes().await.into_iter().find(|v| v.volume_id == "pv-lazy").unwrap();
        let t = v.verification.clone().unwrap();
        assert_eq!((t.signer.as_str(), t.index_signer.as_str()), ("corp", "corp"), "{t:?}");
        assert_eq!(t.chunk_index, pushed["index"].as_str().unwrap(), "{t:?} {pushed}");
        let p = until_progress(&node, "pv-lazy", Duration::from_secs(30), |p| p.connected).await;
        assert!(p.indexed, "{p:?}");
        let config = std::fs::read(target.join("config.json")).unwrap_or_else(|e| {
            panic!(
                "{e}: {:?}",
                std::fs::read_dir(&target).map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
            )
        });
        assert_eq!(config, std::fs::read(dir.join("config.json")).unwrap(), "the checked config reads");
        let weights = dir.join("model.safetensors");
        let weights_at = target.join("model.safetensors");
        assert_eq!(read_range(&weights_at, 20 << 20, 1 << 20), read_range(&weights, 20 << 20, 1 << 20));
        assert_eq!(
            read_errno(&weights_at, 9 << 20, 4096),
            Some(nix::libc::EIO),
            "the corrupted chunk never reaches a reader"
        );
        println!("checked: a lazy volume under a policy refused a corrupted chunk: {}", t.chunk_index);
        unstage(&mut csi, "pv-lazy", &staging, &target).await;

        // The index and the signatures deleted from the registry after a first stage of an
        // intact model: the staged volume keeps its pinned index through a host restart.
        relay.throttle(u64::MAX);
        let dir2 = work.path().join("m2");
        model_dir(&dir2, 4 << 20);
        let fine =
            push_dir(&registry, &dir2, "models/lazy-fine", Some(&sign(&dir2, &corp_key, &work.path().join("f.sig"))));
        let fine_ref = through(&fine);
        let out = node.cli(&[
            "--insecure-registry",
            &relay.host(),
            "model",
            "index",
            &fine_ref,
            "--sign-key",
            corp_key.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let mut ctx2 = lazy_ctx(&fine_ref);
        ctx2.insert("signedBy".into(), "corp".into());
        stage(&node, &mut csi, "pv-pinned", &ctx2).await.unwrap();
        let before =
            node.volumes().await.into_iter().find(|v| v.volume_id == "pv-pinned").unwrap().verification.unwrap();
        drop_referrers(&registry, &fine);
        node.restart_host(vec![
            format!("--insecure-registry={}", relay.host()),
            format!("--trust-dir={}", trust.path().display()),
        ]);
        let mut csi = node.node().await;
        let staging2 = node.dirs.staging("pv-pinned");
        csi.node_stage_volume(stage_req("pv-pinned", &staging2, &ctx2)).await.unwrap();
        // The staging mount lost: the restage plans again, and uses the recorded index (the
        // registry has no index or signature of it any more).
        nix::mount::umount2(&staging2, nix::mount::MntFlags::MNT_DETACH).unwrap();
        stage(&node, &mut csi, "pv-pinned", &ctx2).await.unwrap();
        assert!(!mounts_below(&staging2).is_empty(), "restaged");
        let target2 = node.dirs.target("pod-pinned", "pv-pinned");
        csi.node_publish_volume(publish_req("pv-pinned", &staging2, &target2, &ctx2)).await.unwrap();
        let after =
            node.volumes().await.into_iter().find(|v| v.volume_id == "pv-pinned").unwrap().verification.unwrap();
        assert_eq!(after, before, "the pinned index and signer stay");
        // A killed lazy server is healed with the same index.
        let pid = node.volumes().await.into_iter().find(|v| v.volume_id == "pv-pinned").unwrap().pid;
        assert!(pid > 0);
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
        let until = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let v = node.volumes().await.into_iter().find(|v| v.volume_id == "pv-pinned").unwrap();
            if v.pid != pid && v.pid > 0 && v.healthy && v.lazy.as_ref().is_some_and(|l| l.connected) {
                assert_eq!(v.verification.unwrap(), before, "the healed server checks against the pinned index");
                break;
            }
            assert!(std::time::Instant::now() < until, "not healed: {v:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let p = until_progress(&node, "pv-pinned", Duration::from_secs(60), |p| {
            p.connected && p.layers_complete == p.layers
        })
        .await;
        assert!(p.indexed && p.failed.is_empty(), "{p:?}");
        assert_eq!(tree(&target2), expected(&fine, |_| true));
        println!(
            "checked: the index deleted from the registry changed nothing for the staged lazy volume, through a restart, a restage and a heal: {}",
            after.chunk_index
        );
        unstage(&mut csi, "pv-pinned", &staging2, &target2).await;
    });
}

#[test]
fn a_model_signed_with_a_certificate_mounts_for_its_pinned_identity_only() {
    if !in_private_namespace("a_model_signed_with_a_certificate_mounts_for_its_pinned_identity_only") {
        return;
    }
    let registry = Registry::start(RegistryOptions::default());
    let work = tempfile::tempdir().unwrap();
    let (leaf_key, leaf, ca) = ca_and_leaf(work.path(), "corp", "email:ml@corp.example");
    let dir = work.path().join("m");
    model_dir(&dir, 1 << 20);
    let sig = sign_with_certificate(&dir, &leaf_key, &leaf, &ca, &work.path().join("c.sig"));
    let model = push_dir(&registry, &dir, "models/certified", Some(&sig));
    let trust = trust_dir(&[]);
    trust_file(trust.path(), "corp-ca.ca.pem", &std::fs::read(&ca).unwrap());
    trust_file(trust.path(), "corp-ca.identity", b"# the ML team's release identity\nml@corp.example\n");
    let node = ModelNode::start(vec![
        format!("--insecure-registry={}", registry.host()),
        format!("--trust-dir={}", trust.path().display()),
    ]);
    run(&node, &registry, async || {
        let mut csi = node.node().await;
        let ctx = signed_ctx(&model.reference, "corp-ca", &[]);
        stage(&node, &mut csi, "pv-cert", &ctx).await.unwrap();
        let v = node.volumes().await.into_iter().find(|v| v.volume_id == "pv-cert").unwrap();
        let t = v.verification.unwrap();
        assert_eq!((t.signer.as_str(), t.identity.as_str()), ("corp-ca", "ml@corp.example"), "{t:?}");
        println!("checked: a certificate-signed model mounted for CA entry corp-ca, identity {}", t.identity);
        // The entry now pins another identity: the next new volume is refused, the staged one stays.
        trust_file(trust.path(), "corp-ca.identity", b"release@corp.example\n");
        let msg =
            refused(&node, &mut csi, "pv-cert-2", &signed_ctx(&model.reference, "corp-ca", &[]), &["ml@corp.example"])
                .await;
        assert!(node.volumes().await.iter().any(|v| v.volume_id == "pv-cert" && v.healthy));
        println!("checked: another pinned identity refused it: {msg}");
        // A key entry of the same name space does not stand in for the CA.
        refused(&node, &mut csi, "pv-cert-3", &signed_ctx(&model.reference, "nobody", &[]), &["nobody"]).await;
    });
}
