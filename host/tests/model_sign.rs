//! `mounthost model sign` and `model index --sign-key` end to end: the real binary against a
//! real `docker-registry` (distribution 2.8, no referrers API, so the referrers tag schema's
//! index is what lists a model's referrers), with bundles made by the real OpenSSF
//! `model_signing` CLI (installed in .local/venv by scripts/test.sh) and keys made by openssl
//! at test time. Every claim is checked by reading the registry with curl.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use base64::Engine as _;
use common::registry::{
    Class, ModelBuilder, OCI_MANIFEST, Packing, PushedModel, Registry, RegistryOptions, sha256_digest,
};
use mounthost::oci::signing::{BUNDLE_MEDIA_TYPE, INDEX_PREDICATE, MODEL_PREDICATE};
use mounthost::oci::{INDEX_ARTIFACT_TYPE, PREDICATE_ANNOTATION};
use serde_json::Value;

const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";

/// The files of the test model, as they are on disk (what `model_signing` signs) and in the
/// registry (one layer each).
const FILES: &[(&str, &[u8])] = &[
    ("config.json", br#"{"architectures":["Test"]}"#),
    ("model.safetensors", b"not really weights, but bytes all the same"),
];

/// A registry holding the test model at `repo:v1`, and the model's files in `dir`.
fn model(registry: &Registry, repo: &str, dir: &Path) -> PushedModel {
    let mut builder = ModelBuilder::new();
    for (name, bytes) in FILES {
        std::fs::write(dir.join(name), bytes).unwrap();
        builder = builder.file(name, *bytes, Class::Config, Packing::Raw);
    }
    builder.push(registry, repo, "v1")
}

/// `mounthost --insecure-registry HOST model ARGS...`, with a state directory of its own.
fn mounthost(registry: &Registry, state: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mounthost"))
        .arg("--state-dir")
        .arg(state)
        .args(["--insecure-registry", &registry.host(), "model"])
        .args(args)
        .output()
        .unwrap()
}

/// Its JSON output, once it succeeded.
fn succeeded(out: &Output) -> Value {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "mounthost failed: {stderr}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {stderr}"))
}

/// The `model_signing` CLI scripts/test.sh installs.
fn model_signing() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.local/venv/bin/model_signing");
    assert!(path.is_file(), "{} is missing: run scripts/test.sh, which installs it", path.display());
    path
}

/// A fresh P-256 private key (PEM) at `dir/name`, and its public key at `dir/name.pub`.
fn p256_key(dir: &Path, name: &str) -> PathBuf {
    let key = dir.join(name);
    let run = |args: &[&str]| {
        let out = Command::new("openssl").args(args).output().expect("running openssl");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    run(&["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", key.to_str().unwrap()]);
    run(&["ec", "-in", key.to_str().unwrap(), "-pubout", "-out", &format!("{}.pub", key.display())]);
    key
}

/// `model_signing sign key` of the model in `model_dir` with a fresh key: the bundle's path.
fn model_signing_bundle(work: &Path, model_dir: &Path) -> PathBuf {
    let key = p256_key(work, "model-key.pem");
    let bundle = work.join("model.sig");
    let out = Command::new(model_signing())
        .args(["sign", "key", "--private_key"])
        .arg(&key)
        .arg("--signature")
        .arg(&bundle)
        .arg(model_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "model_signing: {}", String::from_utf8_lossy(&out.stderr));
    bundle
}

/// The referrers tag schema's index of `subject`: None when the tag does not exist.
fn referrers(registry: &Registry, repo: &str, subject: &str) -> Option<Value> {
    let tag = subject.replacen(':', "-", 1);
    let got = registry.request("GET", &format!("/v2/{repo}/manifests/{tag}"), &[("Accept", INDEX_MEDIA_TYPE)]);
    match got.status {
        404 => None,
        200 => Some(serde_json::from_slice(&got.body).unwrap()),
        s => panic!("GET the tag {tag}: HTTP {s}: {}", got.text()),
    }
}

/// The entries of `index` of artifact type `artifact_type`.
fn entries<'a>(index: &'a Value, artifact_type: &str) -> Vec<&'a Value> {
    index["manifests"].as_array().unwrap().iter().filter(|m| m["artifactType"] == artifact_type).collect()
}

fn get(registry: &Registry, repo: &str, what: &str, digest: &str) -> Vec<u8> {
    // distribution 2.8 serves an OCI manifest only to whoever accepts one.
    let got = registry.request("GET", &format!("/v2/{repo}/{what}/{digest}"), &[("Accept", OCI_MANIFEST)]);
    assert_eq!(got.status, 200, "GET {what} {digest}: {}", got.text());
    assert_eq!(sha256_digest(&got.body), digest, "the registry's {what} {digest}");
    got.body
}

/// The statement in a bundle's DSSE envelope.
fn statement(bundle: &[u8]) -> Value {
    let bundle: Value = serde_json::from_slice(bundle).unwrap();
    let payload = bundle["dsseEnvelope"]["payload"].as_str().expect("a DSSE payload");
    serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(payload).unwrap()).unwrap()
}

/// Requests that write to the registry so far (uploads and manifest PUTs), from its log.
fn writes(registry: &Registry) -> usize {
    registry
        .log()
        .lines()
        .filter(|l| l.contains("msg=\"response completed\""))
        .filter(|l| ["POST", "PUT", "PATCH", "DELETE"].iter().any(|m| l.contains(&format!("http.request.method={m} "))))
        .count()
}

#[test]
fn a_model_signing_bundle_is_attached_next_to_the_chunk_index_once() {
    let registry = Registry::start(RegistryOptions::default());
    let work = tempfile::tempdir().unwrap();
    let (dir, state) = (work.path().join("model"), work.path().join("state"));
    std::fs::create_dir_all(&dir).unwrap();
    let model = model(&registry, "models/signed", &dir);
    let indexed = succeeded(&mounthost(&registry, &state, &["index", &model.reference]));
    let bundle_file = model_signing_bundle(work.path(), &dir);
    let bundle = std::fs::read(&bundle_file).unwrap();

    let out = succeeded(&mounthost(
        &registry,
        &state,
        &["sign", &model.reference, "--signature", bundle_file.to_str().unwrap()],
    ));
    assert_eq!(out["subject"], model.manifest_digest.as_str(), "{out}");
    assert_eq!(out["bundle"], sha256_digest(&bundle).as_str(), "{out}");
    assert_eq!(out["predicateType"], MODEL_PREDICATE, "{out}");
    let signature = out["signatureManifest"].as_str().unwrap().to_string();

    // The tag lists it, with its artifact type and annotation, next to the chunk index.
    let index = referrers(&registry, &model.repo, &model.manifest_digest).expect("the referrers tag");
    let signed = entries(&index, BUNDLE_MEDIA_TYPE);
    assert_eq!(signed.len(), 1, "{index}");
    assert_eq!(signed[0]["digest"], signature.as_str());
    assert_eq!(signed[0]["annotations"][PREDICATE_ANNOTATION], MODEL_PREDICATE, "{index}");
    assert_eq!(entries(&index, INDEX_ARTIFACT_TYPE).len(), 1, "the chunk index's entry stays: {index}");
    // Its manifest names the model as its subject and the bundle, byte for byte, as its layer.
    let manifest: Value = serde_json::from_slice(&get(&registry, &model.repo, "manifests", &signature)).unwrap();
    assert_eq!(manifest["artifactType"], BUNDLE_MEDIA_TYPE);
    assert_eq!(manifest["subject"]["digest"], model.manifest_digest.as_str());
    assert_eq!(manifest["annotations"][PREDICATE_ANNOTATION], MODEL_PREDICATE);
    assert_eq!(manifest["layers"][0]["mediaType"], BUNDLE_MEDIA_TYPE);
    let layer = manifest["layers"][0]["digest"].as_str().unwrap();
    assert_eq!(get(&registry, &model.repo, "blobs", layer), bundle, "the blob is the file");

    // Again, by digest this time: the same referrer, listed once; the chunk index still there.
    let pinned = format!("{}/{}@{}", registry.host(), model.repo, model.manifest_digest);
    let again =
        succeeded(&mounthost(&registry, &state, &["sign", &pinned, "--signature", bundle_file.to_str().unwrap()]));
    assert_eq!(again, out);
    let index = referrers(&registry, &model.repo, &model.manifest_digest).unwrap();
    assert_eq!(index["manifests"].as_array().unwrap().len(), 2, "{index}");
    assert_eq!(entries(&index, BUNDLE_MEDIA_TYPE)[0]["digest"], signature.as_str());
    assert_eq!(entries(&index, INDEX_ARTIFACT_TYPE)[0]["digest"], indexed["indexManifest"], "{index}");
}

#[test]
fn a_file_that_is_no_model_signature_is_refused_and_nothing_is_pushed() {
    let registry = Registry::start(RegistryOptions::default());
    let work = tempfile::tempdir().unwrap();
    let (dir, state) = (work.path().join("model"), work.path().join("state"));
    std::fs::create_dir_all(&dir).unwrap();
    let model = model(&registry, "models/refused", &dir);
    let bundle: Value =
        serde_json::from_slice(&std::fs::read(model_signing_bundle(work.path(), &dir)).unwrap()).unwrap();
    let with = |edit: &dyn Fn(&mut Value)| {
        let mut b = bundle.clone();
        edit(&mut b);
        serde_json::to_vec(&b).unwrap()
    };
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("not JSON", b"-----BEGIN PGP SIGNATURE-----\n".to_vec(), "not JSON"),
        ("too large", vec![b' '; (16 << 20) + 1], "larger than"),
        (
            "an old bundle",
            with(&|b| b["mediaType"] = "application/vnd.dev.sigstore.bundle+json;version=0.2".into()),
            "mediaType",
        ),
        ("no mediaType", with(&|b| b["mediaType"] = Value::Null), "mediaType"),
        ("a message signature", with(&|b| b["dsseEnvelope"] = Value::Null), "dsseEnvelope"),
        ("a payload not base64", with(&|b| b["dsseEnvelope"]["payload"] = "not base64!".into()), "base64"),
        ("a payload not JSON", with(&|b| b["dsseEnvelope"]["payload"] = b64("<xml/>").into()), "not JSON"),
        (
            "no predicateType",
            with(&|b| b["dsseEnvelope"]["payload"] = b64(r#"{"_type":"https://in-toto.io/Statement/v1"}"#).into()),
            "predicateType",
        ),
    ];
    let before = writes(&registry);
    assert!(before > 0, "the model's pushes are in the log, so a push would be too:\n{}", registry.log());
    for (what, bytes, says) in cases {
        let file = work.path().join("bad.sig");
        std::fs::write(&file, &bytes).unwrap();
        let out = mounthost(&registry, &state, &["sign", &model.reference, "--signature", file.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: accepted");
        assert!(stderr.contains(says) && stderr.contains("nothing was pushed"), "{what}: {stderr}");
        assert!(out.stdout.is_empty(), "{what}: {}", String::from_utf8_lossy(&out.stdout));
    }
    assert!(referrers(&registry, &model.repo, &model.manifest_digest).is_none(), "no referrers tag");
    assert_eq!(writes(&registry), before, "nothing was written to the registry:\n{}", registry.log());
}

#[test]
fn model_index_with_a_sign_key_signs_the_index_it_pushed() {
    let registry = Registry::start(RegistryOptions::default());
    let work = tempfile::tempdir().unwrap();
    let (dir, state) = (work.path().join("model"), work.path().join("state"));
    std::fs::create_dir_all(&dir).unwrap();
    let model = model(&registry, "models/index-signed", &dir);
    let key = p256_key(work.path(), "index-key.pem");
    let key_pem = std::fs::read_to_string(&key).unwrap();

    // Refused before anything is pushed: a chain without a key, a key that cannot be read.
    let before = writes(&registry);
    let out = mounthost(&registry, &state, &["index", &model.reference, "--sign-cert", key.to_str().unwrap()]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--sign-key"));
    let missing = work.path().join("no-such-key.pem");
    let out = mounthost(&registry, &state, &["index", &model.reference, "--sign-key", missing.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains(missing.to_str().unwrap()), "{stderr}");
    let not_a_key = work.path().join("not-a-key.pem");
    std::fs::write(&not_a_key, "-----BEGIN PRIVATE KEY-----\nc2VjcmV0IHNhdWNl\n-----END PRIVATE KEY-----\n").unwrap();
    let out = mounthost(&registry, &state, &["index", &model.reference, "--sign-key", not_a_key.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains(not_a_key.to_str().unwrap()), "{stderr}");
    assert!(!stderr.contains("c2VjcmV0IHNhdWNl"), "the key's content is not printed: {stderr}");
    assert_eq!(writes(&registry), before, "nothing was written to the registry:\n{}", registry.log());

    let out = mounthost(&registry, &state, &["index", &model.reference, "--sign-key", key.to_str().unwrap()]);
    let printed = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    for line in key_pem.lines().filter(|l| !l.starts_with("-----")) {
        assert!(!printed.contains(line), "the key is printed: {printed}");
    }
    let out = succeeded(&out);
    assert_eq!(out["subject"], model.manifest_digest.as_str(), "{out}");
    let (index_digest, bundle_digest) = (out["index"].as_str().unwrap(), out["bundle"].as_str().unwrap());

    // The tag lists the index and its signature.
    let index = referrers(&registry, &model.repo, &model.manifest_digest).expect("the referrers tag");
    assert_eq!(entries(&index, INDEX_ARTIFACT_TYPE)[0]["digest"], out["indexManifest"], "{index}");
    let signed = entries(&index, BUNDLE_MEDIA_TYPE);
    assert_eq!(signed.len(), 1, "{index}");
    assert_eq!(signed[0]["digest"], out["signatureManifest"], "{index}");
    assert_eq!(signed[0]["annotations"][PREDICATE_ANNOTATION], INDEX_PREDICATE, "{index}");
    let manifest: Value =
        serde_json::from_slice(&get(&registry, &model.repo, "manifests", out["signatureManifest"].as_str().unwrap()))
            .unwrap();
    assert_eq!(manifest["subject"]["digest"], model.manifest_digest.as_str());
    assert_eq!(manifest["layers"][0]["digest"], bundle_digest);

    // Its statement names the model's manifest and the index pushed.
    let bundle = get(&registry, &model.repo, "blobs", bundle_digest);
    let statement = statement(&bundle);
    assert_eq!(statement["predicateType"], INDEX_PREDICATE, "{statement}");
    let text = statement.to_string();
    for digest in [&model.manifest_digest, index_digest] {
        assert!(text.contains(digest.trim_start_matches("sha256:")), "{digest} is not in {statement}");
    }
    get(&registry, &model.repo, "blobs", index_digest);
    // And it is signed with the key: openssl checks the DSSE signature over the envelope's PAE.
    let envelope = &serde_json::from_slice::<Value>(&bundle).unwrap()["dsseEnvelope"];
    let b64 = |v: &Value| base64::engine::general_purpose::STANDARD.decode(v.as_str().unwrap()).unwrap();
    let (payload_type, payload) = (envelope["payloadType"].as_str().unwrap(), b64(&envelope["payload"]));
    let mut pae = format!("DSSEv1 {} {payload_type} {} ", payload_type.len(), payload.len()).into_bytes();
    pae.extend_from_slice(&payload);
    let (pae_file, sig_file) = (work.path().join("pae"), work.path().join("sig.der"));
    std::fs::write(&pae_file, &pae).unwrap();
    std::fs::write(&sig_file, b64(&envelope["signatures"][0]["sig"])).unwrap();
    let verified = Command::new("openssl")
        .args(["dgst", "-sha256", "-verify", &format!("{}.pub", key.display()), "-signature"])
        .args([&sig_file, &pae_file])
        .output()
        .unwrap();
    assert!(verified.status.success(), "openssl: {}", String::from_utf8_lossy(&verified.stdout));
}
