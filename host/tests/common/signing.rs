//! Signed models for the tests (docs/signing.md): key pairs made by openssl, model directories
//! signed by the real OpenSSF `model_signing` CLI (installed in `.local/venv` by
//! scripts/test.sh), pushed as ModelPack models, and trust directories laid out as a ConfigMap
//! mounts them.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;
use tonic::Code;

use super::model::*;
use super::mounts_below;
use super::registry::{Class, Content, ModelBuilder, Packing, PushedModel, Registry, random_file};

/// The `model_signing` CLI scripts/test.sh installs.
pub fn model_signing() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.local/venv/bin/model_signing");
    assert!(p.exists(), "{} is missing: run scripts/test.sh, which installs model-signing", p.display());
    p
}

/// An ECDSA P-256 key pair made by openssl in `dir`: (private key, public key).
pub fn keypair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let key = dir.join(format!("{name}.key.pem"));
    let public = dir.join(format!("{name}.pub.pem"));
    let ok = |c: &mut Command| {
        let out = c.output().unwrap();
        assert!(out.status.success(), "{c:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    ok(Command::new("openssl").args(["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out"]).arg(&key));
    ok(Command::new("openssl").args(["ec", "-pubout", "-in"]).arg(&key).arg("-out").arg(&public));
    (key, public)
}

/// `model_signing sign key DIR`: the bundle it writes.
pub fn sign(dir: &Path, key: &Path, out: &Path) -> Vec<u8> {
    let run = Command::new(model_signing())
        .args(["sign", "key"])
        .arg(dir)
        .arg("--private_key")
        .arg(key)
        .arg("--signature")
        .arg(out)
        .output()
        .unwrap();
    assert!(run.status.success(), "model_signing sign: {}", String::from_utf8_lossy(&run.stderr));
    std::fs::read(out).unwrap()
}

/// A model directory: a config (tar), a tokenizer (tar+gzip), a README (tar+zstd) and weights
/// (raw) of `weights` bytes, as files in `dir`.
pub fn model_dir(dir: &Path, weights: u64) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), br#"{"architectures":["Test"]}"#).unwrap();
    std::fs::write(dir.join("tokenizer.json"), br#"{"version":"1.0","model":{"type":"BPE"}}"#).unwrap();
    std::fs::write(dir.join("README.md"), b"# a signed test model\n").unwrap();
    let (w, _) = random_file(dir, weights);
    std::fs::rename(w, dir.join("model.safetensors")).unwrap();
}

/// Push the files of `dir` (as [`model_dir`] lays them out) as a ModelPack model, with
/// `signature` as its `model.sig` layer when given.
pub fn push_dir(registry: &Registry, dir: &Path, repo: &str, signature: Option<&[u8]>) -> PushedModel {
    let f = |n: &str| Content::File(dir.join(n));
    let mut b = ModelBuilder::new()
        .file("config.json", f("config.json"), Class::Config, Packing::Tar)
        .file("tokenizer.json", f("tokenizer.json"), Class::Config, Packing::TarGzip)
        .file("README.md", f("README.md"), Class::Doc, Packing::TarZstd)
        .file("model.safetensors", f("model.safetensors"), Class::Weight, Packing::Raw);
    if let Some(sig) = signature {
        b = b.file("model.sig", sig, Class::Doc, Packing::Raw);
    }
    b.push(registry, repo, "v1")
}

/// A trust directory as a ConfigMap mounts it: the files in a timestamped directory, `..data`
/// linking to it, and each name a link through `..data`.
pub fn trust_dir(entries: &[(&str, &Path)]) -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("..2026_12_07_00_00_00.000000001");
    std::fs::create_dir(&data).unwrap();
    for (name, public) in entries {
        std::fs::copy(public, data.join(format!("{name}.pub"))).unwrap();
        std::os::unix::fs::symlink(format!("..data/{name}.pub"), dir.path().join(format!("{name}.pub"))).unwrap();
    }
    std::os::unix::fs::symlink(data.file_name().unwrap(), dir.path().join("..data")).unwrap();
    dir
}

pub fn signed_ctx(reference: &str, signed_by: &str, extra: &[(&str, &str)]) -> HashMap<String, String> {
    let mut ctx = model_ctx(reference, &[("insecure", "true")]);
    if !signed_by.is_empty() {
        ctx.insert("signedBy".into(), signed_by.into());
    }
    ctx.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    ctx
}

/// Stage `pv` (waiting out downloads); the final status.
pub async fn stage(
    node: &ModelNode,
    csi: &mut Node,
    pv: &str,
    ctx: &HashMap<String, String>,
) -> Result<(), tonic::Status> {
    let staging = node.dirs.staging(pv);
    stage_until_done(csi, &stage_req(pv, &staging, ctx), Duration::from_secs(60)).await.1
}

/// A refused stage: FAILED_PRECONDITION naming `reference` and containing each of `words`;
/// nothing mounted or left in the volume's state.
pub async fn refused(
    node: &ModelNode,
    csi: &mut Node,
    pv: &str,
    ctx: &HashMap<String, String>,
    words: &[&str],
) -> String {
    let err = stage(node, csi, pv, ctx).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    let msg = err.message().to_string();
    assert!(msg.starts_with("signature refused for "), "{msg}");
    assert!(msg.contains(ctx["reference"].as_str().split(':').next().unwrap()), "names the reference: {msg}");
    for w in words {
        assert!(msg.contains(w), "{w:?} in {msg}");
    }
    assert!(mounts_below(&node.dirs.staging(pv)).is_empty(), "nothing mounted");
    assert!(!node.volumes().await.iter().any(|v| v.volume_id == pv), "no record left");
    msg
}

/// Overwrite the referrers tag of `model`'s manifest with an empty list: the registry then
/// shows no referrer of it (its signatures and chunk indexes are gone).
pub fn drop_referrers(registry: &Registry, model: &PushedModel) {
    let empty = r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}"#;
    registry.push_manifest(&model.repo, &model.manifest_digest.replace(':', "-"), empty);
}

/// A CA (`NAME.ca.pem`, its key `NAME.ca.key`) and a code-signing leaf it issues
/// (`NAME.leaf.pem`, `NAME.leaf.key`) whose subjectAltName is `san` (e.g. `email:ml@corp.example`),
/// made by openssl in `dir`: (leaf key, leaf certificate, CA certificate).
pub fn ca_and_leaf(dir: &Path, name: &str, san: &str) -> (PathBuf, PathBuf, PathBuf) {
    let p = |s: &str| dir.join(format!("{name}.{s}"));
    let ok = |c: &mut Command| {
        let out = c.current_dir(dir).output().unwrap();
        assert!(out.status.success(), "{c:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    ok(Command::new("openssl").args(["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out"]).arg(p("ca.key")));
    ok(Command::new("openssl")
        .args(["req", "-x509", "-new", "-key"])
        .arg(p("ca.key"))
        .args(["-subj", &format!("/CN={name} test CA"), "-days", "30", "-out"])
        .arg(p("ca.pem"))
        .args(["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"]));
    ok(Command::new("openssl")
        .args(["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out"])
        .arg(p("leaf.key")));
    ok(Command::new("openssl")
        .args(["req", "-new", "-key"])
        .arg(p("leaf.key"))
        .args(["-subj", "/CN=model publisher", "-out"])
        .arg(p("leaf.csr")));
    std::fs::write(
        p("leaf.ext"),
        format!("keyUsage=critical,digitalSignature\nextendedKeyUsage=codeSigning\nsubjectAltName={san}\n"),
    )
    .unwrap();
    ok(Command::new("openssl")
        .args(["x509", "-req", "-in"])
        .arg(p("leaf.csr"))
        .arg("-CA")
        .arg(p("ca.pem"))
        .arg("-CAkey")
        .arg(p("ca.key"))
        .args(["-CAcreateserial", "-days", "2", "-out"])
        .arg(p("leaf.pem"))
        .arg("-extfile")
        .arg(p("leaf.ext")));
    (p("leaf.key"), p("leaf.pem"), p("ca.pem"))
}

/// `model_signing sign certificate DIR`: the bundle it writes.
pub fn sign_with_certificate(dir: &Path, key: &Path, leaf: &Path, chain: &Path, out: &Path) -> Vec<u8> {
    let run = Command::new(model_signing())
        .args(["sign", "certificate"])
        .arg(dir)
        .arg("--private_key")
        .arg(key)
        .arg("--signing_certificate")
        .arg(leaf)
        .arg("--certificate_chain")
        .arg(chain)
        .arg("--signature")
        .arg(out)
        .output()
        .unwrap();
    assert!(run.status.success(), "model_signing sign certificate: {}", String::from_utf8_lossy(&run.stderr));
    std::fs::read(out).unwrap()
}

/// Put `bytes` as file `file` in the ConfigMap-shaped trust directory `trust` ([`trust_dir`]),
/// linked through `..data` (an empty `bytes` removes it).
pub fn trust_file(trust: &Path, file: &str, bytes: &[u8]) {
    let data = trust.join("..2026_12_07_00_00_00.000000001");
    let link = trust.join(file);
    if bytes.is_empty() {
        let _ = std::fs::remove_file(&link);
        let _ = std::fs::remove_file(data.join(file));
        return;
    }
    std::fs::write(data.join(file), bytes).unwrap();
    if std::fs::symlink_metadata(&link).is_err() {
        std::os::unix::fs::symlink(format!("..data/{file}"), &link).unwrap();
    }
}

/// Push `model`'s manifest again to `repo:tag` with its layer `filepath` changed by `edit` (the
/// layer's JSON descriptor), as a registry writer could; returns the new reference.
pub fn tampered_manifest(
    registry: &Registry,
    model: &PushedModel,
    tag: &str,
    filepath: &str,
    edit: impl Fn(&mut serde_json::Value),
) -> String {
    let mut doc: serde_json::Value = serde_json::from_str(&model.manifest).unwrap();
    let layer = doc["layers"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|l| l["annotations"]["org.cncf.model.filepath"] == filepath)
        .unwrap_or_else(|| panic!("no layer {filepath}"));
    edit(layer);
    registry.push_manifest(&model.repo, tag, &doc.to_string());
    format!("{}/{}:{tag}", registry.host(), model.repo)
}

/// A plain tar holding one file `name` with `bytes`.
pub fn tar_of(name: &str, bytes: &[u8]) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(bytes.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    tar.append_data(&mut h, name, bytes).unwrap();
    tar.into_inner().unwrap()
}
