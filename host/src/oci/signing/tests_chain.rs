//! The certificate form with CAs and leaves made by the `openssl` CLI at test time: an
//! intermediate, validity, extended key usage, key usage and identity pins. And bundles signed
//! here checked by the real `model_signing` CLI, when it is installed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use super::tests::{edited, model_statement, names, trust_of, with_payload};
use super::*;

/// A scratch PKI in a temp dir, driven through `openssl`.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        Pki { dir: tempfile::tempdir().unwrap() }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    fn read(&self, file: &str) -> Vec<u8> {
        std::fs::read(self.path(file)).unwrap()
    }

    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl").args(args).current_dir(self.dir.path()).output().expect("openssl runs");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// `NAME.key`: SEC1 for P-256 (as `openssl ecparam -genkey` writes it), PKCS#8 for P-384.
    fn key(&self, name: &str, curve: &str) {
        let key = format!("{name}.key");
        if curve == "prime256v1" {
            self.openssl(&["ecparam", "-name", curve, "-genkey", "-out", &key]);
        } else {
            self.openssl(&[
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                &format!("ec_paramgen_curve:{curve}"),
                "-out",
                &key,
            ]);
        }
    }

    /// A self-signed root CA, `NAME.pem`, valid ten years from now.
    fn root(&self, name: &str) {
        self.key(name, "secp384r1");
        self.openssl(&[
            "req",
            "-x509",
            "-new",
            "-key",
            &format!("{name}.key"),
            "-subj",
            &format!("/CN={name}"),
            "-days",
            "3650",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-out",
            &format!("{name}.pem"),
        ]);
    }

    /// `NAME.pem` issued by `issuer` with the extensions `ext` (one per line), valid `days` from now.
    fn issue(&self, name: &str, issuer: &str, curve: &str, ext: &[&str], days: u32) {
        self.key(name, curve);
        std::fs::write(self.path(&format!("{name}.ext")), ext.join("\n")).unwrap();
        self.openssl(&[
            "req",
            "-new",
            "-key",
            &format!("{name}.key"),
            "-subj",
            &format!("/CN={name}"),
            "-out",
            &format!("{name}.csr"),
        ]);
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{issuer}.pem"),
            "-CAkey",
            &format!("{issuer}.key"),
            "-CAserial",
            "serial",
            "-CAcreateserial",
            "-days",
            &days.to_string(),
            "-extfile",
            &format!("{name}.ext"),
            "-out",
            &format!("{name}.pem"),
        ]);
    }

    /// A code-signing leaf with subjectAltNames `san` (openssl syntax).
    fn signer(&self, name: &str, issuer: &str, curve: &str, san: &str, days: u32) {
        let san = format!("subjectAltName={san}");
        self.issue(
            name,
            issuer,
            curve,
            &[LEAF, "keyUsage=critical,digitalSignature", "extendedKeyUsage=codeSigning", &san],
            days,
        );
    }

    /// `statement` signed with `leaf`'s key, the chain `leaf` then `rest`.
    fn sign(&self, statement: &[u8], leaf: &str, rest: &[&str]) -> Vec<u8> {
        let mut chain = self.read(&format!("{leaf}.pem"));
        for c in rest {
            chain.extend(self.read(&format!("{c}.pem")));
        }
        sign(statement, &self.read(&format!("{leaf}.key")), Some(&chain)).unwrap()
    }
}

const LEAF: &str = "basicConstraints=critical,CA:FALSE";
const INTERMEDIATE: [&str; 2] =
    ["basicConstraints=critical,CA:TRUE,pathlen:0", "keyUsage=critical,keyCertSign,cRLSign"];

fn statement() -> Vec<u8> {
    model_statement(&[("weights.bin", b"w"), ("config.json", b"{}")], "sha256", "files")
}

#[test]
fn chains_signed_here_verify_through_an_intermediate_with_identity_pins() {
    let pki = Pki::new();
    pki.root("root");
    pki.issue("inter", "root", "prime256v1", &INTERMEDIATE, 3650);
    pki.signer(
        "robot",
        "inter",
        "secp384r1",
        "email:robot@example.com,URI:https://ci.example.com/release,DNS:signer.example.com",
        30,
    );
    let bundle = pki.sign(&statement(), "robot", &["inter"]);
    let root = pki.read("root.pem");
    let now = SystemTime::now();
    let corp = names(&["corp"]);

    let v = verify(&bundle, &trust_of(&[("corp.ca.pem", &root)]), &corp, MODEL_PREDICATE, now).unwrap();
    assert_eq!((v.signer.as_str(), v.identity), ("corp", None));
    assert_eq!(v.files.keys().collect::<Vec<_>>(), ["config.json", "weights.bin"]);
    for pin in ["robot@example.com", "https://ci.example.com/release", "signer.example.com"] {
        let trust =
            trust_of(&[("corp.ca.pem", &root), ("corp.identity", format!("other@example.com\n{pin}\n").as_bytes())]);
        let v = verify(&bundle, &trust, &corp, MODEL_PREDICATE, now).unwrap();
        assert_eq!(v.identity.as_deref(), Some(pin));
    }
    let trust = trust_of(&[("corp.ca.pem", &root), ("corp.identity", b"other@example.com\n")]);
    let r = verify(&bundle, &trust, &corp, MODEL_PREDICATE, now).unwrap_err();
    assert_eq!(r.reason, "identity");
    assert!(r.detail.contains("robot@example.com, https://ci.example.com/release, signer.example.com"), "{r}");
    assert!(r.detail.contains("accepts only other@example.com (corp.identity)"), "{r}");

    // Without the intermediate the chain leads nowhere; with the intermediate as the anchor it verifies.
    let bare = pki.sign(&statement(), "robot", &[]);
    let r = verify(&bare, &trust_of(&[("corp.ca.pem", &root)]), &corp, MODEL_PREDICATE, now).unwrap_err();
    assert_eq!(r.reason, "untrusted");
    assert!(r.detail.contains("does not lead to a CA of trust entry corp (CN=root)"), "{r}");
    assert!(verify(&bare, &trust_of(&[("corp.ca.pem", &pki.read("inter.pem"))]), &corp, MODEL_PREDICATE, now).is_ok());

    // The statement changed after signing.
    let tampered = with_payload(&bundle, &model_statement(&[("weights.bin", b"W")], "sha256", "files"));
    let r = verify(&tampered, &trust_of(&[("corp.ca.pem", &root)]), &corp, MODEL_PREDICATE, now).unwrap_err();
    assert_eq!(r.reason, "bad_signature");
}

#[test]
fn a_leaf_is_checked_at_the_time_given() {
    let pki = Pki::new();
    pki.root("root");
    pki.signer("robot", "root", "prime256v1", "email:robot@example.com", 1);
    let bundle = pki.sign(&statement(), "robot", &["root"]);
    let trust = trust_of(&[("corp.ca.pem", &pki.read("root.pem"))]);
    let corp = names(&["corp"]);
    let now = SystemTime::now();
    assert!(verify(&bundle, &trust, &corp, MODEL_PREDICATE, now).is_ok());
    let r = verify(&bundle, &trust, &corp, MODEL_PREDICATE, now + Duration::from_secs(3 * 86400)).unwrap_err();
    assert_eq!(r.reason, "expired");
    assert!(r.detail.starts_with("the signing certificate (CN=robot) expired at "), "{r}");
    assert!(r.detail.contains("no transparency log to give a trusted signing time"), "{r}");
    let r = verify(&bundle, &trust, &corp, MODEL_PREDICATE, now - Duration::from_secs(86400)).unwrap_err();
    assert_eq!(r.reason, "expired");
    assert!(r.detail.contains("(CN=robot) is not valid before "), "{r}");
}

#[test]
fn a_leaf_must_be_for_code_signing() {
    let pki = Pki::new();
    pki.root("root");
    let trust = trust_of(&[("corp.ca.pem", &pki.read("root.pem"))]);
    let corp = names(&["corp"]);
    // Now, after the leaf was made (its notBefore is the second openssl made it in).
    let outcome =
        |leaf: &str| verify(&pki.sign(&statement(), leaf, &[]), &trust, &corp, MODEL_PREDICATE, SystemTime::now());

    pki.issue("web", "root", "prime256v1", &[LEAF, "extendedKeyUsage=serverAuth"], 30);
    let r = outcome("web").unwrap_err();
    assert_eq!(r.reason, "untrusted");
    assert!(r.detail.contains("not for code signing: its extended key usage lists serverAuth"), "{r}");

    pki.issue("agree", "root", "prime256v1", &[LEAF, "keyUsage=critical,keyAgreement"], 30);
    let r = outcome("agree").unwrap_err();
    assert_eq!(r.reason, "untrusted");
    assert!(r.detail.contains("without digitalSignature"), "{r}");

    // No extended key usage at all: any use, code signing included (RFC 5280 4.2.1.12).
    pki.issue("plain", "root", "prime256v1", &[LEAF], 30);
    assert!(outcome("plain").is_ok());

    // The CA itself may not sign models.
    let r = outcome("root").unwrap_err();
    assert_eq!(r.reason, "untrusted");
    assert!(r.detail.contains("CA certificate"), "{r}");

    // A chain that does not start with the signing key's certificate is not signed with.
    let mut chain = pki.read("plain.pem");
    chain.extend(pki.read("root.pem"));
    assert!(sign(&statement(), &pki.read("web.key"), Some(&chain)).unwrap_err().contains("not for the private key"));
}

#[test]
fn a_chain_from_another_ca_is_untrusted() {
    let pki = Pki::new();
    pki.root("root");
    pki.root("other");
    pki.signer("robot", "other", "prime256v1", "email:robot@example.com", 30);
    let bundle = pki.sign(&statement(), "robot", &["other"]);
    let trust = trust_of(&[("corp.ca.pem", &pki.read("root.pem"))]);
    let r = verify(&bundle, &trust, &names(&["corp"]), MODEL_PREDICATE, SystemTime::now()).unwrap_err();
    assert_eq!(r.reason, "untrusted");
    assert!(r.detail.contains("issued by CN=other"), "{r}");
    // A chain bundle cannot pass itself off as keyless or key-signed.
    let hinted = edited(&bundle, |v| v["verificationMaterial"]["publicKey"] = serde_json::json!({ "hint": "00" }));
    assert_eq!(
        verify(&hinted, &trust, &names(&["corp"]), MODEL_PREDICATE, SystemTime::now()).unwrap_err().reason,
        "untrusted"
    );
}

/// The real model_signing CLI: `MOUNTHOST_MODEL_SIGNING`, or the repository's `.local/venv`
/// (scripts/test.sh installs it there).
fn model_signing() -> PathBuf {
    let path = std::env::var_os("MOUNTHOST_MODEL_SIGNING")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.local/venv/bin/model_signing"));
    assert!(path.exists(), "{} is missing: run scripts/test.sh, which installs model-signing", path.display());
    path
}

#[test]
fn model_signing_verifies_bundles_signed_here() {
    let cli = model_signing();
    let pki = Pki::new();
    let files: [(&str, &[u8]); 2] = [("a.txt", b"hello model\n"), ("sub/w.bin", &[1, 2, 3])];
    for (name, bytes) in files {
        let path = pki.path("model").join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
    let statement = model_statement(&files, "sha256", "files");
    pki.root("root");
    pki.signer("robot", "root", "prime256v1", "email:robot@example.com", 30);
    pki.key("solo", "secp384r1");
    pki.openssl(&["pkey", "-in", "solo.key", "-pubout", "-out", "solo.pub"]);
    std::fs::write(pki.path("chain.sig"), pki.sign(&statement, "robot", &["root"])).unwrap();
    std::fs::write(pki.path("key.sig"), sign(&statement, &pki.read("solo.key"), None).unwrap()).unwrap();
    for args in [
        &["verify", "key", "model", "--signature", "key.sig", "--public_key", "solo.pub"][..],
        &["verify", "certificate", "model", "--signature", "chain.sig", "--certificate_chain", "root.pem"][..],
    ] {
        let out = Command::new(&cli).args(args).current_dir(pki.dir.path()).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && text.contains("Verification succeeded"), "model_signing {args:?}: {text}");
    }
}
