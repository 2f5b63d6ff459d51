//! OpenSSF model-signing signatures, verified offline against the node's trust set, and made for
//! our own statements (a chunk index's).
//!
//! A signature is a Sigstore bundle (v0.3 JSON) as `model_signing sign key` and `model_signing
//! sign certificate` write it: a DSSE envelope around an in-toto v1 statement, signed with ECDSA
//! over DSSE's pre-authentication encoding, and a key hint or a certificate chain. This host
//! reaches no Fulcio and no Rekor, so it takes the two forms that need neither:
//!
//! - **key**: a trust entry `NAME.pub` holds the public key (P-256 or P-384); the bundle's hint,
//!   when present, must be that key's.
//! - **certificate chain**: a trust entry `NAME.ca.pem` holds CAs; the bundle's chain must lead to
//!   one of them for code signing, at the current time (not at the certificate's notBefore as
//!   model_signing checks it: see `cert.rs`), and `NAME.identity` may pin the signer's
//!   subjectAltName.
//!
//! Sigstore keyless bundles (a Fulcio certificate, transparency-log entries) are refused with a
//! reason that says so, as are model_signing's pre-1.0 "pae_compat" signatures, shard-serialized
//! models and any digest but SHA-256. Trust directory layout: [`TrustSet::load`].

mod bundle;
mod cert;
mod ec;
mod statement;
mod trust;

/// The parsers of signature bytes, for the fuzz targets in `host/fuzz`; not an API.
#[doc(hidden)]
pub mod fuzzing {
    /// The files a bundle's statement lists, read as `predicate` (no signature checked).
    pub fn read_bundle(bundle: &[u8], predicate: &str) -> Result<Vec<String>, super::Refusal> {
        let env = super::bundle::parse(bundle)?;
        read_statement(&env.payload, predicate)
    }

    /// The files an in-toto statement lists, read as `predicate`.
    pub fn read_statement(payload: &[u8], predicate: &str) -> Result<Vec<String>, super::Refusal> {
        Ok(super::statement::read(payload, predicate)?.files.into_keys().collect())
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_chain;

use std::collections::BTreeMap;
use std::time::SystemTime;

use trust::Entry;
pub use trust::TrustSet;

/// The media type of the bundles read and written here.
pub const BUNDLE_MEDIA_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
/// The predicate type of model_signing's statements: a model's files and their digests.
pub const MODEL_PREDICATE: &str = "https://model_signing/signature/v1.0";
/// The predicate type of a chunk index's statement ([`index_statement`]).
pub const INDEX_PREDICATE: &str = "https://mounthost.dev/chunk-index/v1";
/// The largest bundle read.
pub const MAX_BUNDLE_BYTES: u64 = 16 << 20;

/// Who signed, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The trust entry whose key or CA verified it.
    pub signer: String,
    /// The leaf's subjectAltName that matched the entry's identity list (certificate entries with one).
    pub identity: Option<String>,
    /// The statement's predicateType.
    pub predicate_type: String,
    /// The statement's subjects: name → sha256 hex (lowercase).
    pub subjects: Vec<(String, String)>,
    /// For [`MODEL_PREDICATE`] statements: every resource, path → sha256 hex (lowercase). Empty for others.
    pub files: BTreeMap<String, String>,
}

/// Why a bundle was refused. `reason` is a short stable label for metrics:
///
/// - `malformed`: not a model-signing bundle or statement (JSON, base64, fields, size);
/// - `keyless`: a Sigstore keyless signature, which needs Fulcio and Rekor;
/// - `untrusted`: no allowed trust entry's key or CA is the signer's;
/// - `bad_signature`: the signer is an allowed entry, and the signature does not verify;
/// - `algorithm`: a curve, hash or serialization method not taken here (P-521, sha512, shards);
/// - `expired`: the certificate chain is not valid now;
/// - `identity`: the certificate names none of the entry's accepted identities;
/// - `predicate`: the statement is of another predicate type than asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The label, one of those above.
    pub reason: &'static str,
    /// A sentence a person can act on.
    pub detail: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for Refusal {}

/// How far an entry got with a bundle: the refusal of the entry that got furthest is reported.
fn rank(reason: &str) -> u8 {
    match reason {
        "bad_signature" => 4,
        "identity" | "expired" | "algorithm" => 3,
        "untrusted" => 1,
        _ => 2,
    }
}

/// Verify `bundle` (bytes of a bundle JSON) against the entries of `trust` named in `allowed` (the
/// volume's `signedBy` list) at time `now`. Entries named there but absent from `trust` simply
/// don't verify; an empty `allowed` verifies nothing (reason "untrusted"). The statement must have
/// `predicate` as its predicateType. Each allowed entry is tried: a key entry when the bundle's
/// hint, if any, is that key's; a CA entry with the bundle's certificate chain.
pub fn verify(
    bundle: &[u8],
    trust: &TrustSet,
    allowed: &[String],
    predicate: &str,
    now: SystemTime,
) -> Result<Verified, Refusal> {
    let env = bundle::parse(bundle)?;
    let untrusted = |detail: String| Refusal { reason: "untrusted", detail };
    if allowed.is_empty() {
        return Err(untrusted("no trust entry named: the volume lists no signer (signedBy is empty)".into()));
    }
    let pae = bundle::pae(bundle::IN_TOTO_PAYLOAD_TYPE, &env.payload);
    let mut best: Option<Refusal> = None;
    let mut missing = Vec::new();
    let mut tried = std::collections::BTreeSet::new();
    for name in allowed {
        if !tried.insert(name) {
            continue;
        }
        let outcome = match trust.entry(name) {
            None => {
                missing.push(name.as_str());
                continue;
            }
            Some(Entry::Key(key)) => {
                let named = env.hint.as_ref().map(|h| *h == key.hint());
                match (named, named != Some(false) && key.verify(&pae, &env.signature)) {
                    (_, true) => Ok(None),
                    (Some(false), _) => Err(untrusted(format!(
                        "the bundle was signed with the key whose hint is {}, and trust entry {name} is the key {}",
                        env.hint.as_deref().unwrap_or_default(),
                        key.hint()
                    ))),
                    (Some(true), false) => Err(Refusal {
                        reason: "bad_signature",
                        detail: format!(
                            "the bundle names the key of trust entry {name}, and its signature does not verify with \
                             it: the statement was altered or signed with another key"
                        ),
                    }),
                    (None, false) => Err(untrusted(format!(
                        "the signature does not verify with the key of trust entry {name} (the bundle names no key)"
                    ))),
                }
            }
            Some(Entry::Ca(ca)) => match &env.chain {
                None => Err(untrusted(format!(
                    "trust entry {name} is a CA, and the bundle carries no certificate chain (it was signed with a key)"
                ))),
                Some(chain) => cert::check(name, chain, ca, now).and_then(|leaf| {
                    if !leaf.key.verify(&pae, &env.signature) {
                        return Err(Refusal {
                            reason: "bad_signature",
                            detail: format!(
                                "the bundle's certificate chain leads to trust entry {name}, and the signature does \
                                 not verify with its signing certificate: the statement was altered or signed with \
                                 another key"
                            ),
                        });
                    }
                    cert::identity(name, &leaf.names, ca)
                }),
            },
        };
        match outcome {
            Ok(identity) => {
                let read = statement::read(&env.payload, predicate)?;
                return Ok(Verified {
                    signer: name.clone(),
                    identity,
                    predicate_type: read.predicate_type,
                    subjects: read.subjects,
                    files: read.files,
                });
            }
            Err(r) if best.as_ref().is_none_or(|b| rank(r.reason) > rank(b.reason)) => best = Some(r),
            Err(_) => {}
        }
    }
    let absent = if missing.is_empty() {
        String::new()
    } else {
        let usable = trust.names();
        let usable = if usable.is_empty() { "none".to_string() } else { usable.join(", ") };
        format!("no trust entry named {} exists on this node (usable: {usable})", missing.join(", "))
    };
    Err(match best {
        Some(mut r) if !absent.is_empty() => {
            r.detail = format!("{}; {absent}", r.detail);
            r
        }
        Some(r) => r,
        None => untrusted(absent),
    })
}

/// A bundle of `statement` (the in-toto statement's JSON bytes) signed with the private key in
/// `key_pem` (SEC1 or PKCS#8 PEM, P-256 or P-384); with `chain_pem` (the signing certificate first,
/// then intermediates) the bundle carries x509CertificateChain, else a publicKey hint as
/// model_signing writes it.
pub fn sign(statement: &[u8], key_pem: &[u8], chain_pem: Option<&[u8]>) -> Result<Vec<u8>, String> {
    serde_json::from_slice::<serde_json::Value>(statement).map_err(|e| format!("the statement is not JSON: {e}"))?;
    let key = ec::PrivateKey::from_pem(key_pem)?;
    let signature = key.sign(&bundle::pae(bundle::IN_TOTO_PAYLOAD_TYPE, statement));
    let Some(chain_pem) = chain_pem else {
        return Ok(bundle::write(statement, &signature, bundle::Material::Hint(key.public().hint())));
    };
    let mut certs = Vec::new();
    for (label, der) in ec::pem_blocks(chain_pem)? {
        if label != "CERTIFICATE" {
            return Err(format!("the certificate chain holds a PEM {label}, not only CERTIFICATEs"));
        }
        certs.push(der);
    }
    let leaf = certs.first().ok_or("the certificate chain holds no PEM CERTIFICATE")?;
    use x509_cert::der::{Decode as _, Encode as _};
    let leaf = x509_cert::Certificate::from_der(leaf).map_err(|e| format!("the signing certificate: {e}"))?;
    let spki = leaf.tbs_certificate.subject_public_key_info.to_der().map_err(|e| e.to_string())?;
    if ec::PublicKey::from_spki_der(&spki).ok() != Some(key.public()) {
        return Err("the signing certificate (the chain's first) is not for the private key given".into());
    }
    Ok(bundle::write(statement, &signature, bundle::Material::Chain(&certs)))
}

/// The in-toto statement of a chunk index: predicate [`INDEX_PREDICATE`], subjects
/// `{"name":"manifest","digest":{"sha256":<hex of manifest_digest>}}` and `{"name":"index",...}`,
/// predicate `{"manifest": manifest_digest, "index": index_digest}` (both `sha256:<hex>`).
pub fn index_statement(manifest_digest: &str, index_digest: &str) -> Vec<u8> {
    let hex = |d: &str| d.strip_prefix("sha256:").unwrap_or(d).to_string();
    serde_json::to_vec(&serde_json::json!({
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [
            { "name": "manifest", "digest": { "sha256": hex(manifest_digest) } },
            { "name": "index", "digest": { "sha256": hex(index_digest) } },
        ],
        "predicateType": INDEX_PREDICATE,
        "predicate": { "manifest": manifest_digest, "index": index_digest },
    }))
    .unwrap_or_default()
}
