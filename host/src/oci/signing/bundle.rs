//! The Sigstore bundle (v0.3, JSON) that model-signing writes: a DSSE envelope around an in-toto
//! statement, and the verification material that says which key or certificate chain signed it.
//! Read here without trusting any of it; [`super::verify`] decides.

use base64::Engine as _;
use serde::Deserialize;

use super::{BUNDLE_MEDIA_TYPE, MAX_BUNDLE_BYTES, Refusal};

/// The DSSE payload type of an in-toto statement.
pub(crate) const IN_TOTO_PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// The same bundle format under the media type newer Sigstore clients write.
const BUNDLE_MEDIA_TYPE_PARAM: &str = "application/vnd.dev.sigstore.bundle+json;version=0.3";
/// The most certificates read from one bundle's chain.
const MAX_CHAIN: usize = 10;

/// What a bundle says, not yet believed.
#[derive(Debug)]
pub(crate) struct Envelope {
    /// `verificationMaterial.publicKey.hint`, lowercased, when the bundle names its key.
    pub hint: Option<String>,
    /// `verificationMaterial.x509CertificateChain`: DER certificates, the signing one first.
    pub chain: Option<Vec<Vec<u8>>>,
    /// The statement's bytes (the decoded DSSE payload).
    pub payload: Vec<u8>,
    /// The one DSSE signature, DER.
    pub signature: Vec<u8>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Bundle {
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    verification_material: Option<VerificationMaterial>,
    #[serde(default)]
    dsse_envelope: Option<Dsse>,
    #[serde(default)]
    message_signature: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct VerificationMaterial {
    #[serde(default)]
    public_key: Option<KeyId>,
    #[serde(default)]
    x509_certificate_chain: Option<Chain>,
    /// A single Fulcio certificate: Sigstore keyless (bundle v0.3).
    #[serde(default)]
    certificate: Option<serde_json::Value>,
    #[serde(default)]
    tlog_entries: Option<Vec<serde_json::Value>>,
}

#[derive(Deserialize)]
struct KeyId {
    #[serde(default)]
    hint: Option<String>,
}

#[derive(Deserialize)]
struct Chain {
    #[serde(default)]
    certificates: Vec<Cert>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Cert {
    raw_bytes: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Dsse {
    payload: String,
    payload_type: String,
    #[serde(default)]
    signatures: Vec<Sig>,
}

#[derive(Deserialize)]
struct Sig {
    sig: String,
}

fn malformed(detail: impl Into<String>) -> Refusal {
    Refusal { reason: "malformed", detail: detail.into() }
}

/// Read `bytes` as a model-signing bundle: keyless bundles and anything but one DSSE signature
/// over an in-toto statement are refused.
pub(crate) fn parse(bytes: &[u8]) -> Result<Envelope, Refusal> {
    if bytes.len() as u64 > MAX_BUNDLE_BYTES {
        return Err(malformed(format!(
            "the signature bundle is {} bytes, more than the {} MiB read; a model-signing bundle is a few KiB \
             (is this the model itself?)",
            bytes.len(),
            MAX_BUNDLE_BYTES >> 20
        )));
    }
    let b: Bundle = serde_json::from_slice(bytes)
        .map_err(|e| malformed(format!("the signature bundle is not Sigstore bundle JSON: {e}")))?;
    let material = b.verification_material.ok_or_else(|| malformed("the bundle has no verificationMaterial"))?;
    let tlog = material.tlog_entries.as_ref().map_or(0, Vec::len);
    if material.certificate.is_some() || tlog > 0 {
        let what = if material.certificate.is_some() { "a Fulcio certificate" } else { "transparency-log entries" };
        return Err(Refusal {
            reason: "keyless",
            detail: format!(
                "the bundle is a Sigstore keyless signature (it carries {what}); verifying one needs Fulcio's root \
                 and Rekor, which this host does not reach. Sign with a key or a certificate chain instead \
                 (model_signing sign key / sign certificate)"
            ),
        });
    }
    match b.media_type.as_deref() {
        Some(BUNDLE_MEDIA_TYPE | BUNDLE_MEDIA_TYPE_PARAM) => {}
        Some(other) => {
            return Err(malformed(format!(
                "the bundle's mediaType is {other:?}; model-signing bundles are {BUNDLE_MEDIA_TYPE}"
            )));
        }
        None => return Err(malformed("the bundle has no mediaType")),
    }
    let Some(dsse) = b.dsse_envelope else {
        let why = if b.message_signature.is_some() { " (it signs a message digest instead)" } else { "" };
        return Err(malformed(format!("the bundle carries no DSSE envelope{why}; model signatures are DSSE")));
    };
    if dsse.payload_type != IN_TOTO_PAYLOAD_TYPE {
        return Err(malformed(format!(
            "the envelope's payloadType is {:?}, not {IN_TOTO_PAYLOAD_TYPE}",
            dsse.payload_type
        )));
    }
    let [sig] = dsse.signatures.as_slice() else {
        return Err(malformed(format!(
            "the envelope carries {} signatures; a model-signing bundle carries one",
            dsse.signatures.len()
        )));
    };
    let payload = base64_field(&dsse.payload, "dsseEnvelope.payload")?;
    let signature = base64_field(&sig.sig, "dsseEnvelope.signatures[0].sig")?;
    let hint = material.public_key.and_then(|k| k.hint).filter(|h| !h.is_empty()).map(|h| h.to_ascii_lowercase());
    let chain = match material.x509_certificate_chain {
        None => None,
        Some(c) if c.certificates.is_empty() => return Err(malformed("the bundle's certificate chain is empty")),
        Some(c) if c.certificates.len() > MAX_CHAIN => {
            return Err(malformed(format!(
                "the bundle's certificate chain has {} certificates, more than the {MAX_CHAIN} read",
                c.certificates.len()
            )));
        }
        Some(c) => Some(
            c.certificates
                .iter()
                .enumerate()
                .map(|(i, c)| base64_field(&c.raw_bytes, &format!("certificates[{i}].rawBytes")))
                .collect::<Result<_, _>>()?,
        ),
    };
    Ok(Envelope { hint, chain, payload, signature })
}

/// A bytes field of the bundle: protobuf JSON writes standard base64, and its readers take the
/// URL-safe alphabet and missing padding as well.
fn base64_field(text: &str, field: &str) -> Result<Vec<u8>, Refusal> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    let config = GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    let standard = GeneralPurpose::new(&base64::alphabet::STANDARD, config);
    let url = GeneralPurpose::new(&base64::alphabet::URL_SAFE, config);
    standard
        .decode(text)
        .or_else(|_| url.decode(text))
        .map_err(|e| malformed(format!("the bundle's {field} is not base64: {e}")))
}

/// DSSE's pre-authentication encoding, what the signature signs (DSSE v1.0 protocol). Not the
/// "pae_compat" form of model_signing before 1.0, which this host does not take.
pub(crate) fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!("DSSEv1 {} {payload_type} {} ", payload_type.len(), payload.len()).into_bytes();
    out.extend_from_slice(payload);
    out
}

/// How a bundle written here names its signer.
pub(crate) enum Material<'a> {
    /// model_signing's hint of the signing key.
    Hint(String),
    /// DER certificates, the signing one first.
    Chain(&'a [Vec<u8>]),
}

/// The bundle JSON of `payload` (an in-toto statement) signed with `signature`.
pub(crate) fn write(payload: &[u8], signature: &[u8], material: Material<'_>) -> Vec<u8> {
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let material = match material {
        Material::Hint(hint) => serde_json::json!({ "publicKey": { "hint": hint }, "tlogEntries": [] }),
        Material::Chain(certs) => serde_json::json!({
            "x509CertificateChain": {
                "certificates": certs.iter().map(|c| serde_json::json!({ "rawBytes": b64(c) })).collect::<Vec<_>>()
            },
            "tlogEntries": [],
        }),
    };
    let bundle = serde_json::json!({
        "mediaType": BUNDLE_MEDIA_TYPE,
        "verificationMaterial": material,
        "dsseEnvelope": {
            "payload": b64(payload),
            "payloadType": IN_TOTO_PAYLOAD_TYPE,
            "signatures": [{ "sig": b64(signature), "keyid": "" }],
        },
    });
    serde_json::to_vec(&bundle).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pae_is_dsse_v1() {
        assert_eq!(pae("t/x", b"ab c"), b"DSSEv1 3 t/x 4 ab c".to_vec());
        assert_eq!(pae(IN_TOTO_PAYLOAD_TYPE, b""), b"DSSEv1 28 application/vnd.in-toto+json 0 ".to_vec());
    }

    #[test]
    fn written_bundles_read_back() {
        let b = write(b"{}", b"sig", Material::Hint("ABCD".into()));
        let e = parse(&b).unwrap();
        assert_eq!(
            (e.hint.as_deref(), e.chain, e.payload, e.signature),
            (Some("abcd"), None, b"{}".to_vec(), b"sig".to_vec())
        );
        let certs = vec![b"leaf".to_vec(), b"ca".to_vec()];
        let e = parse(&write(b"{}", b"sig", Material::Chain(&certs))).unwrap();
        assert_eq!((e.hint, e.chain), (None, Some(certs)));
    }

    #[test]
    fn base64_takes_both_alphabets_with_or_without_padding() {
        for text in ["+/8=", "+/8", "-_8=", "-_8"] {
            assert_eq!(base64_field(text, "f").unwrap(), vec![0xfb, 0xff], "{text}");
        }
        assert_eq!(base64_field("%%%", "f").unwrap_err().reason, "malformed");
    }

    #[test]
    fn envelopes_other_than_one_in_toto_signature_are_malformed() {
        let mut v: serde_json::Value = serde_json::from_slice(&write(b"{}", b"s", Material::Hint("a".into()))).unwrap();
        v["dsseEnvelope"]["signatures"] = serde_json::json!([]);
        assert!(parse(v.to_string().as_bytes()).unwrap_err().detail.contains("0 signatures"));
        v["dsseEnvelope"]["payloadType"] = "text/plain".into();
        assert!(parse(v.to_string().as_bytes()).unwrap_err().detail.contains("payloadType"));
        v["mediaType"] = "application/vnd.dev.sigstore.bundle+json;version=0.1".into();
        assert!(parse(v.to_string().as_bytes()).unwrap_err().detail.contains("mediaType"));
        v["verificationMaterial"]["x509CertificateChain"] = serde_json::json!({ "certificates": [] });
        v["mediaType"] = BUNDLE_MEDIA_TYPE.into();
        v["dsseEnvelope"]["payloadType"] = IN_TOTO_PAYLOAD_TYPE.into();
        v["dsseEnvelope"]["signatures"] = serde_json::json!([{ "sig": "AA==" }]);
        assert!(parse(v.to_string().as_bytes()).unwrap_err().detail.contains("chain is empty"));
    }
}
