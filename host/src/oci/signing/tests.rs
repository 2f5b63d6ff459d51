//! Bundles made by the real `model_signing` CLI (testdata/make.sh), the key form signed and
//! verified here, each refusal with its label, and trust directories laid out as ConfigMaps.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use p256::pkcs8::{EncodePrivateKey as _, EncodePublicKey as _, LineEnding};
use sha2::Digest as _;

use super::*;

pub(super) const P256_SIG: &[u8] = include_bytes!("testdata/p256.sig");
pub(super) const P256_PUB: &[u8] = include_bytes!("testdata/p256.pub");
const P384_SIG: &[u8] = include_bytes!("testdata/p384.sig");
const P384_PUB: &[u8] = include_bytes!("testdata/p384.pub");
pub(super) const CHAIN_SIG: &[u8] = include_bytes!("testdata/chain.sig");
pub(super) const CHAIN_CA: &[u8] = include_bytes!("testdata/chain.ca.pem");

/// A P-521 key, which model_signing takes and this host does not.
const P521_PUB: &str = "-----BEGIN PUBLIC KEY-----
MIGbMBAGByqGSM49AgEGBSuBBAAjA4GGAAQAuGy7Ace8CQT/QckkWtajeTO3KNX6
+jZPpp3IpHQ/IijedqkrxsNIuyaWXcFznJ01fVzTbKB8jyxI+fzXpqwhMpgBaCJL
cxIxqKxbV8imcFTEESFjS/sxEoWrN6vmXUolWIuPiLUQmcZJB6t0QevqyCF64qmK
jJUG4LD96J9mlm1KYUQ=
-----END PUBLIC KEY-----
";

/// 2027-06-01, inside the fixture certificates' ten years.
pub(super) fn in_2027() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_811_808_000)
}

/// The files the fixtures signed (testdata/make.sh), path → sha256 hex.
fn fixture_files() -> BTreeMap<String, String> {
    let w: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
    let hex = |b: &[u8]| hex::encode(sha2::Sha256::digest(b));
    BTreeMap::from([("a.txt".to_string(), hex(b"hello model\n")), ("sub/w.bin".to_string(), hex(&w))])
}

pub(super) fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// A trust set of `files` (name, content) in a fresh directory.
pub(super) fn trust_of(files: &[(&str, &[u8])]) -> TrustSet {
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes) in files {
        std::fs::write(dir.path().join(name), bytes).unwrap();
    }
    TrustSet::load(dir.path())
}

/// A statement as model_signing writes it for `files` (path → content).
pub(super) fn model_statement(files: &[(&str, &[u8])], algorithm: &str, method: &str) -> Vec<u8> {
    let mut sorted = files.to_vec();
    sorted.sort();
    let mut root = sha2::Sha256::new();
    let resources: Vec<_> = sorted
        .iter()
        .map(|(name, content)| {
            let d = sha2::Sha256::digest(content);
            root.update(d);
            serde_json::json!({ "name": name, "algorithm": algorithm, "digest": hex::encode(d) })
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{ "name": "model", "digest": { "sha256": hex::encode(root.finalize()) } }],
        "predicateType": MODEL_PREDICATE,
        "predicate": {
            "serialization": { "method": method, "hash_type": "sha256", "allow_symlinks": false, "ignore_paths": [] },
            "resources": resources,
        },
    }))
    .unwrap()
}

/// A P-256 key (SEC1 PEM) and its public key PEM, from fixed bytes.
pub(super) fn p256_key(seed: u8) -> (Vec<u8>, Vec<u8>) {
    let k = p256::SecretKey::from_slice(&[seed; 32]).unwrap();
    (
        k.to_sec1_pem(LineEnding::LF).unwrap().as_bytes().to_vec(),
        public_pem(&k.public_key().to_public_key_pem(LineEnding::LF)),
    )
}

/// A P-384 key (PKCS#8 PEM) and its public key PEM, from fixed bytes.
fn p384_key(seed: u8) -> (Vec<u8>, Vec<u8>) {
    let k = p384::SecretKey::from_slice(&[seed; 48]).unwrap();
    (
        k.to_pkcs8_pem(LineEnding::LF).unwrap().as_bytes().to_vec(),
        public_pem(&k.public_key().to_public_key_pem(LineEnding::LF)),
    )
}

fn public_pem(pem: &Result<String, p256::pkcs8::spki::Error>) -> Vec<u8> {
    pem.as_ref().unwrap().as_bytes().to_vec()
}

/// `bundle` with its JSON changed by `edit`.
pub(super) fn edited(bundle: &[u8], edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    let mut v: serde_json::Value = serde_json::from_slice(bundle).unwrap();
    edit(&mut v);
    serde_json::to_vec(&v).unwrap()
}

/// `bundle` with its statement replaced by `payload`, the signature left as it was.
pub(super) fn with_payload(bundle: &[u8], payload: &[u8]) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD.encode(payload);
    edited(bundle, |v| v["dsseEnvelope"]["payload"] = b64.into())
}

fn refused(r: Result<Verified, Refusal>) -> Refusal {
    r.expect_err("the bundle verified")
}

#[test]
fn model_signing_key_bundles_verify_with_their_files() {
    for (name, sig, public) in [("p256", P256_SIG, P256_PUB), ("p384", P384_SIG, P384_PUB)] {
        let trust = trust_of(&[("team.pub", public)]);
        let v = verify(sig, &trust, &names(&["team"]), MODEL_PREDICATE, in_2027()).unwrap();
        assert_eq!(v.signer, "team", "{name}");
        assert_eq!(v.identity, None);
        assert_eq!(v.predicate_type, MODEL_PREDICATE);
        assert_eq!(v.files, fixture_files(), "{name}");
        let mut root = sha2::Sha256::new();
        for d in fixture_files().values() {
            root.update(hex::decode(d).unwrap());
        }
        assert_eq!(v.subjects, vec![("model".to_string(), hex::encode(root.finalize()))]);
        // The hint model_signing wrote is the one computed here.
        let hint =
            serde_json::from_slice::<serde_json::Value>(sig).unwrap()["verificationMaterial"]["publicKey"]["hint"]
                .as_str()
                .unwrap()
                .to_string();
        assert!(trust.describe("team").unwrap().ends_with(&format!("key sha256:{hint}")), "{name}");
    }
    let trust = trust_of(&[("team.pub", P384_PUB)]);
    assert!(trust.describe("team").unwrap().starts_with("ECDSA P-384 key"));
}

#[test]
fn model_signing_chain_bundle_verifies_with_its_identity() {
    let trust = trust_of(&[("corp.ca.pem", CHAIN_CA), ("corp.identity", b"# the release robot\nsigner@example.com\n")]);
    let v = verify(CHAIN_SIG, &trust, &names(&["corp"]), MODEL_PREDICATE, in_2027()).unwrap();
    assert_eq!((v.signer.as_str(), v.identity.as_deref()), ("corp", Some("signer@example.com")));
    assert_eq!(v.files, fixture_files());
    assert_eq!(
        trust.describe("corp").unwrap(),
        "CA (1 certificate: CN=fixture model-signing CA), identities signer@example.com"
    );
    // Without an identity file any identity the CA certified is taken.
    let trust = trust_of(&[("corp.ca.pem", CHAIN_CA)]);
    let v = verify(CHAIN_SIG, &trust, &names(&["corp"]), MODEL_PREDICATE, in_2027()).unwrap();
    assert_eq!(v.identity, None);
    // Checked at the time given, not at the certificate's notBefore as model_signing does.
    let r = refused(verify(
        CHAIN_SIG,
        &trust,
        &names(&["corp"]),
        MODEL_PREDICATE,
        UNIX_EPOCH + Duration::from_secs(2_127_427_200),
    ));
    assert_eq!(r.reason, "expired");
    assert!(r.detail.contains("expired at 2036-12-04") && r.detail.contains("no transparency log"), "{r}");
    let r = refused(verify(
        CHAIN_SIG,
        &trust,
        &names(&["corp"]),
        MODEL_PREDICATE,
        UNIX_EPOCH + Duration::from_secs(1_780_272_000),
    ));
    assert_eq!(r.reason, "expired");
    assert!(r.detail.contains("not valid before 2026-12-07"), "{r}");
}

#[test]
fn key_bundles_signed_here_verify_sec1_and_pkcs8() {
    for (key, public) in [p256_key(7), p384_key(9)] {
        let trust = trust_of(&[("ours.pub", &public)]);
        let statement = index_statement(&format!("sha256:{}", "a".repeat(64)), &format!("sha256:{}", "b".repeat(64)));
        let bundle = sign(&statement, &key, None).unwrap();
        let v = verify(&bundle, &trust, &names(&["ours"]), INDEX_PREDICATE, in_2027()).unwrap();
        assert_eq!(v.signer, "ours");
        assert_eq!(v.subjects, vec![("manifest".into(), "a".repeat(64)), ("index".into(), "b".repeat(64))]);
        assert!(v.files.is_empty());
        let files: [(&str, &[u8]); 2] = [("b/c", b"c"), ("a", b"a")];
        let bundle = sign(&model_statement(&files, "sha256", "files"), &key, None).unwrap();
        let v = verify(&bundle, &trust, &names(&["ours"]), MODEL_PREDICATE, in_2027()).unwrap();
        assert_eq!(v.files.keys().collect::<Vec<_>>(), ["a", "b/c"]);
    }
    // openssl ecparam -genkey writes an EC PARAMETERS block before the key.
    let (key, public) = p256_key(3);
    let mut with_params = b"-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n".to_vec();
    with_params.extend_from_slice(&key);
    let digest = format!("sha256:{}", "0".repeat(64));
    let bundle = sign(&index_statement(&digest, &digest), &with_params, None).unwrap();
    assert!(verify(&bundle, &trust_of(&[("k.pub", &public)]), &names(&["k"]), INDEX_PREDICATE, in_2027()).is_ok());
    assert!(sign(b"not json", &key, None).unwrap_err().contains("not JSON"));
    assert!(sign(b"{}", P256_PUB, None).unwrap_err().contains("no EC PRIVATE KEY"));
}

#[test]
fn an_index_statement_must_match_its_subjects() {
    let (key, public) = p256_key(7);
    let trust = trust_of(&[("k.pub", &public)]);
    let m = format!("sha256:{}", "a".repeat(64));
    let good = index_statement(&m, &format!("sha256:{}", "b".repeat(64)));
    assert!(verify(&sign(&good, &key, None).unwrap(), &trust, &names(&["k"]), INDEX_PREDICATE, in_2027()).is_ok());
    let mut bad: serde_json::Value = serde_json::from_slice(&good).unwrap();
    bad["predicate"]["index"] = format!("sha256:{}", "c".repeat(64)).into();
    let bad = sign(&serde_json::to_vec(&bad).unwrap(), &key, None).unwrap();
    let r = refused(verify(&bad, &trust, &names(&["k"]), INDEX_PREDICATE, in_2027()));
    assert_eq!(r.reason, "malformed");
    assert!(r.detail.contains("index digest"), "{r}");
}

#[test]
fn refusals_carry_their_labels() {
    let (key_a, pub_a) = p256_key(7);
    let (key_b, pub_b) = p256_key(8);
    let trust = trust_of(&[("a.pub", &pub_a), ("b.pub", &pub_b)]);
    let a = names(&["a"]);
    let now = in_2027();
    let statement = model_statement(&[("x", b"x")], "sha256", "files");
    let by_a = sign(&statement, &key_a, None).unwrap();
    let by_b = sign(&statement, &key_b, None).unwrap();
    assert!(verify(&by_a, &trust, &a, MODEL_PREDICATE, now).is_ok());

    let label =
        |bundle: &[u8], allowed: &[String], predicate: &str| refused(verify(bundle, &trust, allowed, predicate, now));

    // The statement changed after signing.
    let tampered = with_payload(&by_a, &model_statement(&[("x", b"y")], "sha256", "files"));
    assert_eq!(label(&tampered, &a, MODEL_PREDICATE).reason, "bad_signature");
    // Signed by b, claiming a's key.
    let a_hint = serde_json::from_slice::<serde_json::Value>(&by_a).unwrap()["verificationMaterial"].clone();
    let claims_a = edited(&by_b, |v| v["verificationMaterial"] = a_hint);
    assert_eq!(label(&claims_a, &a, MODEL_PREDICATE).reason, "bad_signature");
    // b is trusted on the node, and not by this volume.
    let r = label(&by_b, &a, MODEL_PREDICATE);
    assert_eq!(r.reason, "untrusted");
    assert!(r.detail.contains("hint"), "{r}");
    assert!(verify(&by_b, &trust, &names(&["a", "b"]), MODEL_PREDICATE, now).is_ok_and(|v| v.signer == "b"));
    // No hint: the key is tried, and is not the signer's.
    let no_hint = edited(&by_b, |v| v["verificationMaterial"]["publicKey"] = serde_json::json!({}));
    assert_eq!(label(&no_hint, &a, MODEL_PREDICATE).reason, "untrusted");
    assert!(verify(&no_hint, &trust, &names(&["b"]), MODEL_PREDICATE, now).is_ok());
    // Nothing allowed, or only entries this node lacks.
    let r = label(&by_a, &[], MODEL_PREDICATE);
    assert_eq!(r.reason, "untrusted");
    assert!(r.detail.contains("no trust entry named"), "{r}");
    let r = label(&by_a, &names(&["gone"]), MODEL_PREDICATE);
    assert_eq!(r.reason, "untrusted");
    assert!(r.detail.contains("no trust entry named gone exists on this node (usable: a, b)"), "{r}");

    // Keyless: a Fulcio certificate, or transparency-log entries.
    let fulcio =
        edited(&by_a, |v| v["verificationMaterial"]["certificate"] = serde_json::json!({ "rawBytes": "AA==" }));
    let r = label(&fulcio, &a, MODEL_PREDICATE);
    assert_eq!(r.reason, "keyless");
    assert!(r.detail.contains("Fulcio") && r.detail.contains("Rekor") && r.detail.contains("Sign with a key"), "{r}");
    let tlog = edited(&by_a, |v| v["verificationMaterial"]["tlogEntries"] = serde_json::json!([{ "logIndex": "1" }]));
    assert_eq!(label(&tlog, &a, MODEL_PREDICATE).reason, "keyless");

    // Digests and serializations not taken here, each named.
    for (statement, named) in [
        (model_statement(&[("x", b"x")], "sha512", "files"), "sha512"),
        (model_statement(&[("x", b"x")], "sha256", "shards"), "shards"),
        (
            String::from_utf8(statement.clone())
                .unwrap()
                .replace("\"hash_type\":\"sha256\"", "\"hash_type\":\"blake2\"")
                .into_bytes(),
            "blake2",
        ),
    ] {
        let r = label(&sign(&statement, &key_a, None).unwrap(), &a, MODEL_PREDICATE);
        assert_eq!(r.reason, "algorithm", "{named}");
        assert!(r.detail.contains(named), "{r}");
    }
    let p521 = trust_of(&[("big.pub", P521_PUB.as_bytes())]);
    assert!(p521.problems()[0].contains("P-521"), "{:?}", p521.problems());

    // Another predicate than the one asked for.
    let r = label(&by_a, &a, INDEX_PREDICATE);
    assert_eq!(r.reason, "predicate");
    assert!(r.detail.contains(MODEL_PREDICATE) && r.detail.contains(INDEX_PREDICATE), "{r}");

    // Not a bundle: JSON, base64, size.
    assert_eq!(label(b"{", &a, MODEL_PREDICATE).reason, "malformed");
    let bad_b64 = edited(&by_a, |v| v["dsseEnvelope"]["payload"] = "not base64!".into());
    assert_eq!(label(&bad_b64, &a, MODEL_PREDICATE).reason, "malformed");
    let bad_sig = edited(&by_a, |v| v["dsseEnvelope"]["signatures"][0]["sig"] = "AAAA".into());
    assert_eq!(label(&bad_sig, &a, MODEL_PREDICATE).reason, "bad_signature");
    let huge = vec![b' '; MAX_BUNDLE_BYTES as usize + 1];
    let r = label(&huge, &a, MODEL_PREDICATE);
    assert_eq!(r.reason, "malformed");
    assert!(r.detail.contains("more than the 16 MiB"), "{r}");
    let not_statement = sign(b"[1, 2]", &key_a, None).unwrap();
    assert_eq!(label(&not_statement, &a, MODEL_PREDICATE).reason, "malformed");
    // Display is the sentence.
    assert_eq!(label(b"{", &a, MODEL_PREDICATE).to_string(), label(b"{", &a, MODEL_PREDICATE).detail);
}

#[test]
fn a_key_entry_does_not_verify_a_chain_bundle_nor_a_ca_entry_a_key_bundle() {
    let trust = trust_of(&[("corp.ca.pem", CHAIN_CA), ("team.pub", P256_PUB)]);
    let r = refused(verify(P256_SIG, &trust, &names(&["corp"]), MODEL_PREDICATE, in_2027()));
    assert_eq!(r.reason, "untrusted");
    assert!(r.detail.contains("no certificate chain"), "{r}");
    let r = refused(verify(CHAIN_SIG, &trust, &names(&["team"]), MODEL_PREDICATE, in_2027()));
    assert_eq!(r.reason, "untrusted");
}

/// `dir/..2026_x/` holds the files, `..data -> ..2026_x`, and `NAME -> ..data/NAME`, as the
/// kubelet lays out a ConfigMap volume.
fn configmap(dir: &Path, files: &[(&str, &[u8])]) {
    let data = dir.join("..2026_12_07_17_00_00.123");
    std::fs::create_dir_all(&data).unwrap();
    std::os::unix::fs::symlink("..2026_12_07_17_00_00.123", dir.join("..data")).unwrap();
    for (name, bytes) in files {
        std::fs::write(data.join(name), bytes).unwrap();
        std::os::unix::fs::symlink(format!("..data/{name}"), dir.join(name)).unwrap();
    }
}

#[test]
fn trust_loads_a_configmap_mount_and_reports_bad_files() {
    let dir = tempfile::tempdir().unwrap();
    configmap(
        dir.path(),
        &[
            ("team.pub", P256_PUB),
            ("corp.ca.pem", CHAIN_CA),
            ("corp.identity", b"signer@example.com\n"),
            ("broken.pub", b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"),
            ("notes.txt", b"hello"),
            ("Upper.pub", P256_PUB),
            ("both.pub", P256_PUB),
            ("both.ca.pem", CHAIN_CA),
            ("lonely.identity", b"a@b\n"),
            ("pinned.ca.pem", CHAIN_CA),
            ("pinned.identity", b"# nothing\n"),
            ("cert.pub", CHAIN_CA),
        ],
    );
    let set = TrustSet::load(dir.path());
    assert_eq!(set.names(), ["corp", "team"]);
    assert!(set.contains("team") && !set.contains("broken") && !set.contains("pinned"));
    let problems = set.problems().join("\n");
    for expected in [
        "file broken.pub: not a public key",
        "file notes.txt: not NAME.pub",
        "file Upper.pub: entry name \"Upper\"",
        "entry both: both both.pub and both.ca.pem",
        "file lonely.identity: no lonely.ca.pem beside it",
        "file pinned.identity: lists no identity",
        "file cert.pub: a PEM CERTIFICATE, not a PUBLIC KEY",
    ] {
        assert!(problems.contains(expected), "{expected:?} not in\n{problems}");
    }
    assert_eq!(set.problems().len(), 7, "{problems}");
    assert_eq!(set.describe("broken"), None);
    // The entries work.
    let v = verify(CHAIN_SIG, &set, &names(&["corp"]), MODEL_PREDICATE, in_2027()).unwrap();
    assert_eq!(v.identity.as_deref(), Some("signer@example.com"));
}

#[test]
fn trust_of_a_missing_or_empty_directory_is_empty() {
    let dir = tempfile::tempdir().unwrap();
    for set in [TrustSet::load(&dir.path().join("absent")), TrustSet::load(dir.path()), TrustSet::empty()] {
        assert!(set.names().is_empty() && set.problems().is_empty());
        let r = refused(verify(P256_SIG, &set, &names(&["team"]), MODEL_PREDICATE, in_2027()));
        assert_eq!(r.reason, "untrusted");
        assert!(r.detail.contains("(usable: none)"), "{r}");
    }
    let file = dir.path().join("f");
    std::fs::write(&file, b"").unwrap();
    assert!(TrustSet::load(&file).problems()[0].starts_with("directory"));
}
