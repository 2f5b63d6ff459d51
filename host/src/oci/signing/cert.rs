//! The certificate form of a model signature: the bundle's chain must lead, for code signing, to
//! a CA of the trust entry, and its signing certificate's key then verifies the envelope.
//!
//! Deviation from model_signing, stated openly: its verifier checks the chain at the signing
//! certificate's notBefore, so an expired certificate verifies forever. Without a transparency
//! log there is no trusted signing time, so this host checks the chain at the current time and
//! refuses an expired (or not yet valid) certificate.

use std::time::{Duration, SystemTime};

use rustls::pki_types::{CertificateDer, UnixTime};
use webpki::{EndEntityCert, KeyUsage};
use x509_cert::der::{Decode as _, Encode as _};
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::{KeyUsage as KeyUsageExt, SubjectAltName};

use super::Refusal;
use super::ec::PublicKey;
use super::trust::Ca;

/// id-kp-codeSigning (1.3.6.1.5.5.7.3.3), DER contents.
const CODE_SIGNING: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x03];

/// The signing certificate of a chain that verified.
pub(crate) struct Leaf {
    pub key: PublicKey,
    /// Its subjectAltNames: emails, URIs and DNS names.
    pub names: Vec<String>,
}

/// Does `chain` (DER, the signing certificate first) lead to one of `ca`'s anchors at `now`, for
/// code signing (an extended key usage, when present, must list it; a key usage, when present,
/// must allow digital signatures)?
pub(crate) fn check(entry: &str, chain: &[Vec<u8>], ca: &Ca, now: SystemTime) -> Result<Leaf, Refusal> {
    let malformed = |d: String| Refusal { reason: "malformed", detail: d };
    let untrusted = |d: String| Refusal { reason: "untrusted", detail: d };
    let [leaf_der, rest @ ..] = chain else {
        return Err(malformed("the bundle's certificate chain is empty".into()));
    };
    let leaf = x509_cert::Certificate::from_der(leaf_der)
        .map_err(|e| malformed(format!("the bundle's signing certificate does not parse: {e}")))?;
    let leaf_cert = CertificateDer::from(leaf_der.as_slice());
    let ee = EndEntityCert::try_from(&leaf_cert)
        .map_err(|e| malformed(format!("the bundle's signing certificate does not parse: {e}")))?;
    let intermediates: Vec<CertificateDer<'_>> = rest.iter().map(|c| CertificateDer::from(c.as_slice())).collect();
    let time = UnixTime::since_unix_epoch(now.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default());
    let usage = KeyUsage::required_if_present(CODE_SIGNING);
    ee.verify_for_usage(webpki::ALL_VERIFICATION_ALGS, &ca.anchors, &intermediates, time, usage, None, None)
        .map_err(|e| chain_refusal(entry, &leaf, ca, e))?;
    match leaf.tbs_certificate.get::<KeyUsageExt>() {
        Ok(Some((_, ku))) if !ku.digital_signature() => {
            return Err(untrusted(format!(
                "the signing certificate ({}) has a key usage without digitalSignature, so it may not sign",
                leaf.tbs_certificate.subject
            )));
        }
        Ok(_) => {}
        Err(e) => return Err(malformed(format!("the signing certificate's key usage does not parse: {e}"))),
    }
    let spki = leaf.tbs_certificate.subject_public_key_info.to_der().unwrap_or_default();
    let key = PublicKey::from_spki_der(&spki).map_err(|why| Refusal {
        reason: "algorithm",
        detail: format!("the signing certificate holds {why}; model signatures are verified here with those only"),
    })?;
    let mut names = Vec::new();
    for found in leaf.tbs_certificate.filter::<SubjectAltName>() {
        let (_, san) =
            found.map_err(|e| malformed(format!("the signing certificate's subjectAltName does not parse: {e}")))?;
        names.extend(san.0.iter().filter_map(|n| match n {
            GeneralName::Rfc822Name(s) | GeneralName::DnsName(s) | GeneralName::UniformResourceIdentifier(s) => {
                Some(s.to_string())
            }
            _ => None,
        }));
    }
    Ok(Leaf { key, names })
}

/// The name among `names` that entry `entry`'s identity list accepts: `None` when the entry pins
/// no identity.
pub(crate) fn identity(entry: &str, names: &[String], ca: &Ca) -> Result<Option<String>, Refusal> {
    let Some(accepted) = &ca.identities else { return Ok(None) };
    if let Some(n) = names.iter().find(|n| accepted.contains(n)) {
        return Ok(Some(n.clone()));
    }
    let carried = if names.is_empty() { "no email, URI or DNS name".to_string() } else { names.join(", ") };
    Err(Refusal {
        reason: "identity",
        detail: format!(
            "the signing certificate names {carried}; trust entry {entry} accepts only {} ({entry}.identity)",
            accepted.join(", ")
        ),
    })
}

/// A person's sentence for why the chain did not verify.
fn chain_refusal(entry: &str, leaf: &x509_cert::Certificate, ca: &Ca, e: webpki::Error) -> Refusal {
    let subject = &leaf.tbs_certificate.subject;
    let when = |t: UnixTime| {
        x509_cert::der::DateTime::from_unix_duration(Duration::from_secs(t.as_secs()))
            .map_or_else(|_| format!("{} s after 1970", t.as_secs()), |d| d.to_string())
    };
    let leaf_secs = |t: &x509_cert::time::Time| t.to_unix_duration().as_secs();
    let validity = &leaf.tbs_certificate.validity;
    let why_now = "with no transparency log to give a trusted signing time, certificates are checked at the current \
                   time; re-sign with a certificate valid now";
    let (reason, detail) = match e {
        webpki::Error::CertExpired { time, not_after } => {
            let which = if leaf_secs(&validity.not_after) == not_after.as_secs() {
                format!("the signing certificate ({subject})")
            } else {
                format!("an issuer in the chain of the signing certificate ({subject})")
            };
            ("expired", format!("{which} expired at {} (now {}): {why_now}", when(not_after), when(time)))
        }
        webpki::Error::CertNotValidYet { time, not_before } => {
            let which = if leaf_secs(&validity.not_before) == not_before.as_secs() {
                format!("the signing certificate ({subject})")
            } else {
                format!("an issuer in the chain of the signing certificate ({subject})")
            };
            ("expired", format!("{which} is not valid before {} (now {}): {why_now}", when(not_before), when(time)))
        }
        webpki::Error::UnknownIssuer => (
            "untrusted",
            format!(
                "the bundle's certificate chain ({subject}, issued by {}) does not lead to a CA of trust entry {entry} \
                 ({})",
                leaf.tbs_certificate.issuer,
                ca.subjects.join("; ")
            ),
        ),
        webpki::Error::RequiredEkuNotFoundContext(ctx) => {
            let present: Vec<String> = ctx.present.iter().map(|oid| eku_name(oid)).collect();
            (
                "untrusted",
                format!(
                    "the signing certificate ({subject}) is not for code signing: its extended key usage lists {}, \
                     and a model signature needs codeSigning",
                    present.join(", ")
                ),
            )
        }
        webpki::Error::CaUsedAsEndEntity => {
            ("untrusted", format!("the signing certificate ({subject}) is a CA certificate, which may not sign models"))
        }
        webpki::Error::UnsupportedSignatureAlgorithmContext(_)
        | webpki::Error::UnsupportedSignatureAlgorithmForPublicKeyContext(_) => (
            "algorithm",
            format!("a certificate of the bundle's chain ({subject}) is signed with an algorithm not taken here: {e}"),
        ),
        other => (
            "untrusted",
            format!("the bundle's certificate chain ({subject}) does not verify to trust entry {entry}: {other}"),
        ),
    };
    Refusal { reason, detail }
}

fn eku_name(oid: &[usize]) -> String {
    match oid {
        [1, 3, 6, 1, 5, 5, 7, 3, 1] => "serverAuth".into(),
        [1, 3, 6, 1, 5, 5, 7, 3, 2] => "clientAuth".into(),
        [1, 3, 6, 1, 5, 5, 7, 3, 3] => "codeSigning".into(),
        [1, 3, 6, 1, 5, 5, 7, 3, 4] => "emailProtection".into(),
        [1, 3, 6, 1, 5, 5, 7, 3, 8] => "timeStamping".into(),
        other => other.iter().map(usize::to_string).collect::<Vec<_>>().join("."),
    }
}
