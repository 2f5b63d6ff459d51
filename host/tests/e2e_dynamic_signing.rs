//! Signed models through a dynamic volume (docs/signing.md, docs/dynamic-mounts.md), as root,
//! in a private mount namespace: a dynamic model volume staged with `signedBy: corp` against a
//! trust directory laid out as a ConfigMap mounts it, and the pod's mounts POSTed to the socket
//! in its volume. Every mount inherits the volume's policy; a mount's own `signedBy` may narrow
//! it, never widen it. Models are signed by the real OpenSSF `model_signing` CLI with keys
//! openssl makes, and pushed into a real `docker-registry`. Each refusal is shown first as an
//! attack that mounts on a dynamic volume without the policy.

mod common;

use std::path::Path;

use common::dynamic::{DynNode, call, dynamic_ctx, wait_state};
use common::model::{expected, tree};
use common::registry::{PushedModel, Registry, RegistryOptions};
use common::signing::{keypair, model_dir, push_dir, sign, trust_dir};
use common::{guarded, in_private_namespace, mounts_below};
use serde_json::{Value, json};

fn run(node: &DynNode, registry: &Registry, body: impl AsyncFnOnce()) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let log = registry.log_path();
    guarded(&node.dirs, || {
        if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.block_on(body()))) {
            eprintln!(
                "--- registry log (tail)\n{}",
                common::model::tail(&std::fs::read_to_string(log).unwrap_or_default(), 40)
            );
            std::panic::resume_unwind(e);
        }
    });
}

/// POST a mount of `reference` with `more` parameters: status and body.
fn post(dir: &Path, id: &str, reference: &str, more: &[(&str, &str)]) -> (u16, Value) {
    let mut parameters = json!({"reference": reference});
    for (k, v) in more {
        parameters[*k] = json!(v);
    }
    call(dir, "POST", "/mounts", Some(json!({"id": id, "parameters": parameters})))
}

/// A POST answered 403 with `code`, leaving nothing mounted or listed: its message.
fn forbidden(dir: &Path, id: &str, reference: &str, more: &[(&str, &str)], code: &str) -> String {
    let (status, v) = post(dir, id, reference, more);
    assert_eq!((status, v["code"].as_str()), (403, Some(code)), "{v}");
    let (status, one) = call(dir, "GET", &format!("/mounts/{id}"), None);
    assert_eq!(status, 404, "no record of the refused mount: {one}");
    nothing_of(dir, id);
    v["message"].as_str().unwrap().to_string()
}

/// Nothing of mount `id` is mounted or left below the volume's mounts directory.
fn nothing_of(dir: &Path, id: &str) {
    let at = dir.join("mounts").join(id);
    assert!(mounts_below(&at).is_empty(), "nothing mounted at {}", at.display());
    let left = std::fs::read_dir(&at).map(|d| d.count()).unwrap_or(0);
    assert_eq!(left, 0, "nothing left at {}", at.display());
}

/// A mount's files, each read byte for byte and compared with what was pushed.
fn reads(dir: &Path, id: &str, model: &PushedModel) {
    let at = dir.join("mounts").join(id);
    assert_eq!(tree(&at), expected(model, |_| true), "every file, byte for byte");
    assert!(!mounts_below(&at).is_empty(), "{} is a mount", at.display());
}

#[test]
fn a_dynamic_volume_under_signed_by_mounts_only_models_its_trust_entries_signed() {
    if !in_private_namespace("a_dynamic_volume_under_signed_by_mounts_only_models_its_trust_entries_signed") {
        return;
    }
    let registry = Registry::start(RegistryOptions::default());
    let work = tempfile::tempdir().unwrap();
    let (corp_key, corp_pub) = keypair(work.path(), "corp");
    let (other_key, other_pub) = keypair(work.path(), "other");
    let (stranger_key, _) = keypair(work.path(), "stranger");
    // `other` is a trust entry of the node, but not one the volume lists; `stranger` is neither.
    let trust = trust_dir(&[("corp", &corp_pub), ("other", &other_pub)]);
    let signed_by = |name: &str, dir: &Path, key: &Path, repo: &str| {
        model_dir(dir, 1 << 20);
        let sig = sign(dir, key, &work.path().join(format!("{name}.sig")));
        push_dir(&registry, dir, repo, Some(&sig))
    };
    let base = signed_by("base", &work.path().join("base"), &corp_key, "models/base");
    let second = signed_by("second", &work.path().join("second"), &corp_key, "models/second");
    let plain_dir = work.path().join("plain");
    model_dir(&plain_dir, 1 << 20);
    let unsigned = push_dir(&registry, &plain_dir, "models/unsigned", None);
    let foreign = signed_by("foreign", &work.path().join("foreign"), &other_key, "models/foreign");
    let stranger = signed_by("stranger", &work.path().join("stranger"), &stranger_key, "models/stranger");

    let node = DynNode::start_with(&registry, &[&format!("--trust-dir={}", trust.path().display())]);
    run(&node, &registry, async || {
        let mut csi = node.node().await;

        // The attack without a policy: on a dynamic volume without signedBy, the pod mounts an
        // unsigned model.
        let open = node.dynamic_volume(&mut csi, "pv-open", "pod-open", &dynamic_ctx(&base.reference)).await;
        let (status, v) = post(&open, "plain", &unsigned.reference, &[]);
        assert!(matches!(status, 200..=202), "{status} {v}");
        wait_state(&open, "plain", "ready");
        reads(&open, "plain", &unsigned);
        println!("checked: without signedBy the pod mounted the unsigned {}", unsigned.reference);

        // The volume under signedBy: corp, its own model signed by corp.
        let mut ctx = dynamic_ctx(&base.reference);
        ctx.insert("signedBy".into(), "corp".into());
        let dir = node.dynamic_volume(&mut csi, "pv-signed", "pod-signed", &ctx).await;

        // A second model signed by corp mounts, byte for byte.
        let (status, v) = post(&dir, "second", &second.reference, &[]);
        assert!(matches!(status, 200..=202), "{status} {v}");
        let v = wait_state(&dir, "second", "ready");
        assert_eq!(v["path"], "mounts/second", "{v}");
        reads(&dir, "second", &second);
        println!("checked: a second model signed by corp mounted through the pod's socket: {}", second.reference);

        // The unsigned model is refused at the POST.
        let msg = forbidden(&dir, "plain", &unsigned.reference, &[], "signature_refused");
        let repo = unsigned.reference.split(':').next().unwrap();
        assert!(msg.starts_with("signature refused for "), "{msg}");
        assert!(msg.contains(repo) && msg.contains("not signed"), "{msg}");
        println!("checked: unsigned refused 403 signature_refused: {msg}");

        // Signed by a key outside the trust set, and by a trust entry the volume does not list.
        let msg = forbidden(&dir, "stranger", &stranger.reference, &[], "signature_refused");
        assert!(msg.starts_with("signature refused for "), "{msg}");
        assert!(msg.contains(stranger.reference.split(':').next().unwrap()) && msg.contains("corp"), "{msg}");
        println!("checked: signed by a key outside the trust set refused 403 signature_refused: {msg}");
        let msg = forbidden(&dir, "foreign", &foreign.reference, &[], "signature_refused");
        assert!(msg.starts_with("signature refused for "), "{msg}");
        assert!(msg.contains(foreign.reference.split(':').next().unwrap()), "{msg}");
        println!("checked: signed by trust entry other, which the volume does not list, refused: {msg}");

        // A mount asking for a trust entry its volume does not list: widening is refused.
        let msg = forbidden(&dir, "wider", &foreign.reference, &[("signedBy", "other")], "permission_denied");
        assert!(msg.contains("other") && msg.contains("narrow") && msg.contains("never widen"), "{msg}");
        println!("checked: signedBy other on a corp volume refused 403 permission_denied: {msg}");

        // Only the signed mount is there; the volume's own files are untouched.
        let (_, list) = call(&dir, "GET", "/mounts", None);
        let ids: Vec<&str> = list["mounts"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["second"], "{list}");
        let names: Vec<String> = std::fs::read_dir(dir.join("mounts"))
            .unwrap()
            .map(|e| e.unwrap().file_name().display().to_string())
            .collect();
        assert_eq!(names, ["second"], "the mounts directory holds the signed mount only");
        assert_eq!(tree(&dir.join("volume")), expected(&base, |_| true));
        println!("checked: after the refusals the volume's mounts directory holds only {names:?}");
    });
    let log = common::strip_ansi(&node.dirs.logs());
    let warned = log.lines().filter(|l| l.contains("WARN") && l.contains("signature refused")).count();
    assert!(warned >= 3, "a warn line per signature refusal: {warned}");
}

#[test]
fn a_dynamic_mount_whose_config_changed_after_signing_fails_after_the_pull() {
    if !in_private_namespace("a_dynamic_mount_whose_config_changed_after_signing_fails_after_the_pull") {
        return;
    }
    let registry = Registry::start(RegistryOptions::default());
    let work = tempfile::tempdir().unwrap();
    let (corp_key, corp_pub) = keypair(work.path(), "corp");
    let trust = trust_dir(&[("corp", &corp_pub)]);
    let base_dir = work.path().join("base");
    model_dir(&base_dir, 1 << 20);
    let base =
        push_dir(&registry, &base_dir, "models/base", Some(&sign(&base_dir, &corp_key, &work.path().join("b.sig"))));
    // The config (a tar layer) changed after signing: the signature holds, the file does not.
    let tampered = work.path().join("tampered");
    model_dir(&tampered, 1 << 20);
    let sig = sign(&tampered, &corp_key, &work.path().join("t.sig"));
    std::fs::write(tampered.join("config.json"), br#"{"architectures":["Evil"]}"#).unwrap();
    let changed = push_dir(&registry, &tampered, "models/tampered-config", Some(&sig));

    let node = DynNode::start_with(&registry, &[&format!("--trust-dir={}", trust.path().display())]);
    run(&node, &registry, async || {
        let mut csi = node.node().await;
        // The attack without a policy: it mounts, the changed config with it.
        let open = node.dynamic_volume(&mut csi, "pv-open", "pod-open", &dynamic_ctx(&base.reference)).await;
        let (status, v) = post(&open, "changed", &changed.reference, &[]);
        assert!(matches!(status, 200..=202), "{status} {v}");
        wait_state(&open, "changed", "ready");
        reads(&open, "changed", &changed);
        println!("checked: without signedBy the pod mounted the model whose config changed after signing");

        let mut ctx = dynamic_ctx(&base.reference);
        ctx.insert("signedBy".into(), "corp".into());
        let dir = node.dynamic_volume(&mut csi, "pv-signed", "pod-signed", &ctx).await;
        // The signature and the raw weights check out at the POST; the config only once pulled.
        // Accepted: 202 while it pulls, or 200 with the mount already failed (docs/dynamic-mounts.md).
        let (status, v) = post(&dir, "changed", &changed.reference, &[]);
        assert!(matches!((status, v["state"].as_str()), (202, _) | (200, Some("failed"))), "{status} {v}");
        let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let v = loop {
            let (status, v) = call(&dir, "GET", "/mounts/changed", None);
            assert_eq!(status, 200, "{v}");
            if v["state"] == "failed" {
                break v;
            }
            assert!(v["state"] != "ready", "a changed config mounted: {v}");
            assert!(std::time::Instant::now() < until, "never failed: {v}");
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        let reason = v["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("config.json"), "{v}");
        assert!(reason.contains("signature refused"), "{v}");
        nothing_of(&dir, "changed");
        println!("checked: a config changed after signing was accepted {status}, then failed: {reason}");
    });
}
