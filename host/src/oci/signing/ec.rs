//! ECDSA keys of the curves model-signing signs with, P-256 and P-384, and the PEM blocks
//! they come in. The hash follows the curve as model_signing's `get_ec_key_hash` does: P-256 with
//! SHA-256, P-384 with SHA-384 (P-521 is not taken: no trust entry here can hold one).

use p256::pkcs8::der::pem;
use p256::pkcs8::spki::{DecodePublicKey as _, EncodePublicKey as _, SubjectPublicKeyInfoRef};
use p256::pkcs8::{DecodePrivateKey as _, LineEnding, ObjectIdentifier};
use sha2::Digest as _;

/// id-ecPublicKey: an elliptic-curve key, its curve named in the parameters.
const EC_PUBLIC_KEY: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
const P256_CURVE: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.3.1.7");
const P384_CURVE: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.132.0.34");

/// A public key that verifies model-signing signatures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PublicKey {
    P256(p256::ecdsa::VerifyingKey),
    P384(p384::ecdsa::VerifyingKey),
}

impl PublicKey {
    /// The key of a DER SubjectPublicKeyInfo; any other algorithm or curve is named in the error.
    pub(crate) fn from_spki_der(der: &[u8]) -> Result<PublicKey, String> {
        let spki = SubjectPublicKeyInfoRef::try_from(der).map_err(|e| format!("not a public key ({e})"))?;
        let alg = spki.algorithm.oid;
        if alg != EC_PUBLIC_KEY {
            return Err(format!("a {} key, not ECDSA P-256 or P-384", algorithm_name(&alg.to_string())));
        }
        let curve = spki.algorithm.parameters_oid().map_err(|_| "an EC key without a named curve".to_string())?;
        let bad = |e: p256::pkcs8::spki::Error| format!("a malformed EC public key ({e})");
        match curve {
            P256_CURVE => Ok(PublicKey::P256(p256::ecdsa::VerifyingKey::from_public_key_der(der).map_err(bad)?)),
            P384_CURVE => Ok(PublicKey::P384(p384::ecdsa::VerifyingKey::from_public_key_der(der).map_err(bad)?)),
            other => Err(format!("an ECDSA key on curve {}, not P-256 or P-384", algorithm_name(&other.to_string()))),
        }
    }

    /// The one `PUBLIC KEY` block of a PEM text.
    pub(crate) fn from_pem(text: &[u8]) -> Result<PublicKey, String> {
        let blocks = pem_blocks(text)?;
        match blocks.as_slice() {
            [(label, der)] if label == "PUBLIC KEY" => PublicKey::from_spki_der(der),
            [(label, _)] => Err(format!("a PEM {label}, not a PUBLIC KEY")),
            [] => Err("no PEM block".into()),
            _ => Err(format!("{} PEM blocks, not one PUBLIC KEY", blocks.len())),
        }
    }

    pub(crate) fn curve(&self) -> &'static str {
        match self {
            PublicKey::P256(_) => "P-256",
            PublicKey::P384(_) => "P-384",
        }
    }

    /// model_signing's key hint: the hex SHA-256 of the key's SubjectPublicKeyInfo PEM text
    /// (uncompressed point, 64-column lines, `\n` endings, as Python's cryptography writes it).
    pub(crate) fn hint(&self) -> String {
        let pem = match self {
            PublicKey::P256(k) => k.to_public_key_pem(LineEnding::LF),
            PublicKey::P384(k) => k.to_public_key_pem(LineEnding::LF),
        };
        // Encoding a valid key into a String cannot fail; an empty hint would match no bundle.
        hex::encode(sha2::Sha256::digest(pem.unwrap_or_default().as_bytes()))
    }

    /// Does `der_sig` (an ASN.1 DER ECDSA signature) sign `msg` under this key, with the curve's hash?
    pub(crate) fn verify(&self, msg: &[u8], der_sig: &[u8]) -> bool {
        use p256::ecdsa::signature::Verifier as _;
        match self {
            PublicKey::P256(k) => p256::ecdsa::Signature::from_der(der_sig).is_ok_and(|s| k.verify(msg, &s).is_ok()),
            PublicKey::P384(k) => p384::ecdsa::Signature::from_der(der_sig).is_ok_and(|s| k.verify(msg, &s).is_ok()),
        }
    }
}

/// A private key that signs as model_signing does.
pub(crate) enum PrivateKey {
    P256(p256::ecdsa::SigningKey),
    P384(p384::ecdsa::SigningKey),
}

impl PrivateKey {
    /// The private key of a PEM text: SEC1 (`EC PRIVATE KEY`, perhaps after an `EC PARAMETERS`
    /// block as `openssl ecparam -genkey` writes it) or PKCS#8 (`PRIVATE KEY`), P-256 or P-384.
    pub(crate) fn from_pem(text: &[u8]) -> Result<PrivateKey, String> {
        let blocks = pem_blocks(text)?;
        for (label, der) in &blocks {
            let key = match label.as_str() {
                "EC PRIVATE KEY" => p256::SecretKey::from_sec1_der(der)
                    .map(|k| PrivateKey::P256(k.into()))
                    .or_else(|_| p384::SecretKey::from_sec1_der(der).map(|k| PrivateKey::P384(k.into())))
                    .ok(),
                "PRIVATE KEY" => p256::SecretKey::from_pkcs8_der(der)
                    .map(|k| PrivateKey::P256(k.into()))
                    .or_else(|_| p384::SecretKey::from_pkcs8_der(der).map(|k| PrivateKey::P384(k.into())))
                    .ok(),
                "ENCRYPTED PRIVATE KEY" => {
                    return Err("the private key is encrypted; give it decrypted (openssl pkey -in KEY)".into());
                }
                _ => continue,
            };
            return key.ok_or_else(|| format!("the {label} is not an ECDSA P-256 or P-384 key"));
        }
        Err("no EC PRIVATE KEY or PRIVATE KEY PEM block".into())
    }

    pub(crate) fn public(&self) -> PublicKey {
        match self {
            PrivateKey::P256(k) => PublicKey::P256(*k.verifying_key()),
            PrivateKey::P384(k) => PublicKey::P384(*k.verifying_key()),
        }
    }

    /// The ASN.1 DER ECDSA signature of `msg`, hashed with the curve's hash (RFC 6979 nonces).
    pub(crate) fn sign(&self, msg: &[u8]) -> Vec<u8> {
        use p256::ecdsa::signature::Signer as _;
        match self {
            PrivateKey::P256(k) => {
                let s: p256::ecdsa::Signature = k.sign(msg);
                s.to_der().as_bytes().to_vec()
            }
            PrivateKey::P384(k) => {
                let s: p384::ecdsa::Signature = k.sign(msg);
                s.to_der().as_bytes().to_vec()
            }
        }
    }
}

/// Every PEM block of `text`, label and DER bytes, in order; text between blocks is ignored (as
/// openssl does with the `Bag Attributes` and comments some tools write).
pub(crate) fn pem_blocks(text: &[u8]) -> Result<Vec<(String, Vec<u8>)>, String> {
    const BEGIN: &[u8] = b"-----BEGIN ";
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = find(rest, BEGIN) {
        rest = &rest[start..];
        let label_end = find(&rest[BEGIN.len()..], b"-----").ok_or("a PEM BEGIN line without its end")?;
        let label = &rest[BEGIN.len()..BEGIN.len() + label_end];
        let mut end_line = b"-----END ".to_vec();
        end_line.extend_from_slice(label);
        end_line.extend_from_slice(b"-----");
        let end = find(rest, &end_line).ok_or_else(|| format!("PEM {} without its END line", show(label)))?;
        let block = &rest[..end + end_line.len()];
        let (label, der) = pem::decode_vec(block).map_err(|e| format!("PEM {}: {e}", show(label)))?;
        out.push((label.to_string(), der));
        rest = &rest[end + end_line.len()..];
    }
    Ok(out)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn show(label: &[u8]) -> String {
    String::from_utf8_lossy(label).chars().take(40).collect()
}

/// A person's name for the key algorithms and curves one meets instead of P-256 and P-384.
fn algorithm_name(oid: &str) -> String {
    match oid {
        "1.2.840.113549.1.1.1" => "RSA".into(),
        "1.2.840.113549.1.1.10" => "RSA-PSS".into(),
        "1.3.101.112" => "Ed25519".into(),
        "1.3.101.113" => "Ed448".into(),
        "1.3.132.0.35" => "P-521".into(),
        "1.3.132.0.10" => "secp256k1".into(),
        other => format!("OID {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p256_key() -> PrivateKey {
        PrivateKey::P256(p256::ecdsa::SigningKey::from_slice(&[7; 32]).unwrap())
    }

    #[test]
    fn signatures_verify_with_their_key_only() {
        let key = p256_key();
        let sig = key.sign(b"message");
        assert!(key.public().verify(b"message", &sig));
        assert!(!key.public().verify(b"messagf", &sig));
        let other = PrivateKey::P384(p384::ecdsa::SigningKey::from_slice(&[9; 48]).unwrap());
        assert!(!other.public().verify(b"message", &sig));
        assert!(other.public().verify(b"message", &other.sign(b"message")));
        assert!(!key.public().verify(b"message", b"not der"));
    }

    #[test]
    fn pem_blocks_skip_text_between_and_report_a_broken_block() {
        let text = b"Bag Attributes\n-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\nx\n";
        let blocks = pem_blocks(text).unwrap();
        assert_eq!(blocks.len(), 1);
        assert_eq!(blocks[0].0, "EC PARAMETERS");
        assert!(pem_blocks(b"-----BEGIN X-----\nAAAA\n").unwrap_err().contains("without its END"));
        assert!(pem_blocks(b"-----BEGIN X-----\n!!!!\n-----END X-----\n").is_err());
        assert!(pem_blocks(b"no pem here").unwrap().is_empty());
    }

    #[test]
    fn private_keys_refuse_encrypted_and_missing() {
        assert!(PrivateKey::from_pem(b"").err().unwrap().contains("no EC PRIVATE KEY"));
        let enc = b"-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n";
        assert!(PrivateKey::from_pem(enc).err().unwrap().contains("encrypted"));
    }
}
