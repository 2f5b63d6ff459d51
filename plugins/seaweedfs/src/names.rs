//! Names SeaweedFS accepts, and the directory a CSI volume name maps to.
//!
//! SeaweedFS treats each directory directly under `/buckets` as an S3 bucket. Measured on 4.48:
//! when the filer has to create a missing directory on the way to an entry (`/buckets` itself,
//! or `/buckets/<bucket>` for `/buckets/<bucket>/sub`) it checks `<bucket>` against S3's
//! naming rules (`s3bucket.VerifyS3BucketName`; names starting with `.` are exempt) and answers
//! 500 `invalid bucket name ...` — and `weed mount` of such a path exits with that message. A
//! CSI CreateVolume name is any string of up to 128 bytes, so it cannot be used as the
//! directory name as is: [`directory_name`] maps every name to a valid bucket name, keeping
//! the ones that already are one.

use sha2::{Digest, Sha256};

/// Longest bucket name.
pub const MAX_BUCKET: usize = 63;
/// Hex digits of the name's SHA-256 in a mapped directory name (64 bits).
const HASH_HEX: usize = 16;
/// Longest sanitised prefix in a mapped directory name: with `-` and the hash, 40 bytes, the
/// length of external-provisioner's `pvc-<uuid>` names.
const MAX_PREFIX: usize = 23;

/// SeaweedFS 4.48's bucket name rule (`VerifyS3BucketName`), with the filer's own messages.
/// Lengths are in bytes; Go's Unicode "lower case" and "number" classes are approximated by
/// [`char::is_lowercase`] and [`char::is_numeric`] (they differ only on rare non-ASCII letters).
pub fn bucket_rule(name: &str) -> Result<(), &'static str> {
    if name.len() < 3 || name.len() > MAX_BUCKET {
        return Err("bucket name must between [3, 63] characters");
    }
    if name == "filemeta" {
        return Err("bucket name \"filemeta\" is reserved");
    }
    if !name.chars().all(|c| c.is_lowercase() || c.is_numeric() || c == '.' || c == '-') {
        return Err("bucket name can only contain lower case characters, numbers, dots, and hyphens");
    }
    if name.contains("..") {
        return Err("bucket names must not contain two adjacent periods");
    }
    if name.starts_with(['.', '-']) {
        return Err("name must start with number or lower case character");
    }
    if name.ends_with(['.', '-']) {
        return Err("name must end with number or lower case character");
    }
    if name.starts_with("xn--") {
        return Err("prefix xn-- is reserved and not allowed in bucket prefix");
    }
    if name.ends_with("-s3alias") {
        return Err("suffix -s3alias is reserved and not allowed in bucket suffix");
    }
    if name.parse::<std::net::IpAddr>().is_ok() {
        return Err("bucket name cannot be ip addresses");
    }
    Ok(())
}

/// The bucket a remote path puts its files in, when SeaweedFS checks it: the component right
/// under `/buckets`, unless it starts with `.` (the filer exempts those). `None` for paths
/// outside `/buckets` and for `/buckets` itself.
pub fn bucket_of(path: &str) -> Option<&str> {
    let bucket = path.strip_prefix("/buckets/")?.split('/').next()?;
    (!bucket.starts_with('.')).then_some(bucket)
}

/// The directory name of the volume CSI calls `name`: `name` itself when it is a valid bucket
/// name (so `pvc-<uuid>` keeps its directory) and does not end like a mapped name; otherwise
/// its lower-cased, sanitised first characters, `-`, and 16 hex digits of its SHA-256, at most
/// 40 bytes. Always a valid bucket name and collection name; the same name always gives the
/// same directory, and different names give different ones (kept names never end in
/// `-<16 hex digits>`, mapped ones always do, and the hash tells mapped ones apart).
pub fn directory_name(name: &str) -> String {
    if bucket_rule(name).is_ok() && name.is_ascii() && !looks_mapped(name) {
        return name.to_string();
    }
    let mut prefix = String::new();
    for c in name.chars().map(|c| c.to_ascii_lowercase()) {
        if prefix.len() == MAX_PREFIX {
            break;
        }
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            prefix.push(c);
        } else if !prefix.is_empty() && !prefix.ends_with('-') {
            // Every run of other characters (dots included) becomes one `-`.
            prefix.push('-');
        }
    }
    let prefix = prefix.trim_end_matches('-');
    let prefix = if prefix.is_empty() { "vol" } else { prefix };
    let digest = Sha256::digest(name.as_bytes());
    let hash: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{prefix}-{}", &hash[..HASH_HEX])
}

/// `...-<16 lower-case hex digits>`: the shape of a mapped name.
fn looks_mapped(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() > HASH_HEX
        && b[b.len() - HASH_HEX - 1] == b'-'
        && b[b.len() - HASH_HEX..].iter().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    /// Names measured against the 4.48 filer (`POST /buckets/<name>/` with no `/buckets` yet):
    /// 500 with this message, or 201.
    #[rstest]
    #[case("a_b", Some("can only contain"))]
    #[case("Mixed-Case", Some("can only contain"))]
    #[case("-ab", Some("must start with"))]
    #[case("ab-", Some("must end with"))]
    #[case("ab.", Some("must end with"))]
    #[case("a..b", Some("two adjacent periods"))]
    #[case("192.168.1.1", Some("ip addresses"))]
    #[case("xn--abc", Some("prefix xn--"))]
    #[case("abc-s3alias", Some("-s3alias"))]
    #[case("filemeta", Some("reserved"))]
    #[case("ab", Some("[3, 63]"))]
    #[case("v1", Some("[3, 63]"))]
    #[case("abc", None)]
    #[case("aüb", None)]
    #[case("pvc-5f0c1d2e-3a4b-4c5d-8e9f-0a1b2c3d4e5f", None)]
    fn the_filers_bucket_rule(#[case] name: &str, #[case] refused: Option<&str>) {
        match (bucket_rule(name), refused) {
            (Ok(()), None) => {}
            (Err(why), Some(needle)) => assert!(why.contains(needle), "{name}: {why}"),
            (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
        }
        assert!(bucket_rule(&"a".repeat(63)).is_ok());
        assert!(bucket_rule(&"a".repeat(64)).is_err());
    }

    #[rstest]
    #[case("/buckets/v1", Some("v1"))]
    #[case("/buckets/v1/sub/dir", Some("v1"))]
    #[case("/buckets/.hidden", None)]
    #[case("/buckets", None)]
    #[case("/datasets/v1", None)]
    #[case("/bucketsx/v1", None)]
    fn the_bucket_of_a_path(#[case] path: &str, #[case] bucket: Option<&str>) {
        assert_eq!(bucket_of(path), bucket);
    }

    #[test]
    fn valid_names_keep_their_directory() {
        for name in ["pvc-5f0c1d2e-3a4b-4c5d-8e9f-0a1b2c3d4e5f", "data.set-1", "abc", &"a".repeat(63)] {
            assert_eq!(directory_name(name), name);
        }
    }

    #[rstest]
    #[case("Mixed-Case-PVC", "mixed-case-pvc-")]
    #[case("v1", "v1-")]
    #[case("a_b", "a-b-")]
    #[case("..", "vol-")]
    #[case("--ÄÖÜ--", "vol-")]
    #[case("xn--abc", "xn-abc-")]
    #[case("192.168.1.1", "192-168-1-1-")]
    #[case("filemeta", "filemeta-")]
    #[case("pvc-0123456789abcdef", "pvc-0123456789abcdef-")]
    fn other_names_get_a_sanitised_prefix_and_a_hash(#[case] name: &str, #[case] prefix: &str) {
        let dir = directory_name(name);
        assert!(dir.starts_with(prefix), "{name} -> {dir}");
        assert_eq!(dir.len(), prefix.len() + HASH_HEX, "{name} -> {dir}");
        assert!(bucket_rule(&dir).is_ok(), "{name} -> {dir}: {:?}", bucket_rule(&dir));
        assert!(looks_mapped(&dir));
        assert_eq!(directory_name(name), dir, "stable");
        assert_ne!(directory_name(&dir), dir, "a name shaped like a mapped one is mapped again");
    }

    #[test]
    fn long_names_fit_in_40_bytes_and_differ_by_their_hash() {
        let a = "A".repeat(128);
        let b = format!("{}B", "A".repeat(127));
        let (da, db) = (directory_name(&a), directory_name(&b));
        assert_eq!(da.len(), 40);
        assert!(da.starts_with(&"a".repeat(MAX_PREFIX)), "{da}");
        assert_ne!(da, db, "same prefix, different names");
        assert_ne!(directory_name("PVC-1"), directory_name("pvc-1"));
        assert_eq!(directory_name("pvc-1"), "pvc-1");
        // The first 16 hex digits of SHA-256("Mixed-Case-PVC"): the mapping must never change,
        // or a retried CreateVolume would make a second directory.
        assert_eq!(directory_name("Mixed-Case-PVC"), "mixed-case-pvc-e2ded2c820171ea2");
    }
}
