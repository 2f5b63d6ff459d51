//! Content digests of plugin components (`sha256:<64 hex>`), the identity a volume pins.

use std::fmt;

use sha2::{Digest as _, Sha256};

/// A sha256 digest in OCI notation.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Digest(Sha256::digest(bytes).into())
    }

    /// Parse `sha256:<64 lowercase hex>`.
    pub fn parse(s: &str) -> Option<Self> {
        let hex = s.strip_prefix("sha256:")?;
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return None;
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex, &mut out).ok()?;
        Some(Digest(out))
    }

    /// The hex part.
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejects() {
        let d = Digest::of(b"abc");
        assert_eq!(d.to_string(), "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(Digest::parse(&d.to_string()), Some(d.clone()));
        assert_eq!(Digest::parse(&d.hex()), None, "prefix required");
        assert_eq!(Digest::parse(&d.to_string().to_uppercase().replace("SHA256", "sha256")), None);
        assert_eq!(Digest::parse("sha256:abc"), None);
    }
}
