//! OCI references as plans and StorageClasses write them:
//! `registry[:port]/repository[:tag][@sha256:<64 hex>]`.
//!
//! The policy grants a `resolve` step by the reference's registry, so the registry must be
//! explicit: a first component that contains `.` or `:`, or is `localhost` (there is no
//! implicit Docker Hub here; write `docker.io/library/busybox`). The rest follows the
//! distribution spec's grammar, a little stricter: repository components are
//! `[a-z0-9]+([._-][a-z0-9]+)*`, a tag is `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`, and a digest
//! is sha256 in lowercase hex. IPv6 registry addresses are not accepted. Pure: no I/O.

use std::fmt;

/// Longest reference accepted (the distribution spec bounds a repository name to 255
/// characters; a registry, a tag and a digest add at most a few hundred).
pub const MAX_REFERENCE: usize = 1024;
/// Longest repository name (the distribution spec's limit).
const MAX_REPOSITORY: usize = 255;

/// A parsed reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciRef {
    registry: String,
    repository: String,
    tag: Option<String>,
    digest: Option<String>,
}

/// Why a reference does not parse. The messages do not repeat the reference; callers name it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OciRefError {
    /// Empty, too long, or with characters no reference has.
    #[error("it must be 1 to {MAX_REFERENCE} printable ASCII characters without spaces")]
    Characters,
    /// No `/` after the registry.
    #[error("it must start with a registry, as in registry.example/repository:tag")]
    NoRegistry,
    /// The first component is not a registry.
    #[error("its registry {0:?} must contain '.' or ':' or be localhost (write docker.io/library/NAME for Docker Hub)")]
    NotARegistry(String),
    /// The registry is not `host[:port]`.
    #[error("its registry {0:?} is not host[:port] (DNS labels of letters, digits and '-'; port 1-65535)")]
    Registry(String),
    /// A repository component breaks the grammar.
    #[error("its repository {0:?} must be lowercase components [a-z0-9]+([._-][a-z0-9]+)* separated by '/'")]
    Repository(String),
    /// The tag breaks the grammar.
    #[error("its tag {0:?} must be 1 to 128 of [A-Za-z0-9_.-], not starting with '.' or '-'")]
    Tag(String),
    /// The digest is not sha256 in lowercase hex.
    #[error("its digest {0:?} must be sha256:<64 lowercase hex digits>")]
    Digest(String),
}

impl OciRef {
    /// Parse `registry[:port]/repository[:tag][@sha256:<64 hex>]`.
    pub fn parse(input: &str) -> Result<OciRef, OciRefError> {
        if input.is_empty() || input.len() > MAX_REFERENCE || !input.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(OciRefError::Characters);
        }
        let (name, digest) = match input.split_once('@') {
            Some((name, digest)) => {
                if !is_sha256(digest) {
                    return Err(OciRefError::Digest(digest.into()));
                }
                (name, Some(digest.to_string()))
            }
            None => (input, None),
        };
        let (registry, rest) = name.split_once('/').ok_or(OciRefError::NoRegistry)?;
        if !(registry.contains(['.', ':']) || registry == "localhost") {
            return Err(OciRefError::NotARegistry(registry.into()));
        }
        if !is_host_port(registry) {
            return Err(OciRefError::Registry(registry.into()));
        }
        // The registry is split off, so a ':' left can only start the tag.
        let (repository, tag) = match rest.rsplit_once(':') {
            Some((repository, tag)) => {
                if !is_tag(tag) {
                    return Err(OciRefError::Tag(tag.into()));
                }
                (repository, Some(tag.to_string()))
            }
            None => (rest, None),
        };
        if repository.is_empty() || repository.len() > MAX_REPOSITORY || !repository.split('/').all(is_component) {
            return Err(OciRefError::Repository(repository.into()));
        }
        Ok(OciRef { registry: registry.into(), repository: repository.into(), tag, digest })
    }

    /// `host` or `host:port`, as written.
    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// The repository inside the registry, e.g. `org/model`.
    pub fn repository(&self) -> &str {
        &self.repository
    }

    /// The tag, when the reference names one (a reference with neither tag nor digest means
    /// `latest`).
    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    /// The manifest digest (`sha256:<hex>`), when the reference pins one.
    pub fn digest(&self) -> Option<&str> {
        self.digest.as_deref()
    }
}

impl fmt::Display for OciRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

/// `sha256:` and 64 lowercase hex digits.
pub fn is_sha256(s: &str) -> bool {
    s.strip_prefix("sha256:")
        .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

/// `host` or `host:port`: DNS labels of letters, digits and inner dashes; a decimal port
/// 1-65535 without a sign or leading zeros.
pub fn is_host_port(s: &str) -> bool {
    let (host, port) = match s.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (s, None),
    };
    let label = |l: &str| {
        (1..=63).contains(&l.len())
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    let port_ok = port.is_none_or(|p| {
        !p.starts_with('0') && p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>().is_ok_and(|n| n > 0)
    });
    host.len() <= 253 && host.split('.').all(label) && port_ok
}

/// One repository component: `[a-z0-9]+([._-][a-z0-9]+)*`.
fn is_component(c: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = c.as_bytes();
    let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) else { return false };
    // The distribution spec: `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`.
    alnum(first)
        && alnum(last)
        && c.split(|ch: char| ch.is_ascii_lowercase() || ch.is_ascii_digit())
            .filter(|sep| !sep.is_empty())
            .all(|sep| matches!(sep, "." | "_" | "__") || sep.bytes().all(|b| b == b'-'))
}

/// A tag: `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`.
fn is_tag(t: &str) -> bool {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    (1..=128).contains(&t.len())
        && t.bytes().next().is_some_and(word)
        && t.bytes().all(|b| word(b) || b == b'.' || b == b'-')
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    fn hex() -> String {
        "0123456789abcdef".repeat(4)
    }

    #[rstest]
    #[case::tag("ghcr.io/org/model:v1", "ghcr.io", "org/model", Some("v1"), false)]
    #[case::no_tag("registry.local/m", "registry.local", "m", None, false)]
    #[case::port("registry.local:5000/a/b/c:latest", "registry.local:5000", "a/b/c", Some("latest"), false)]
    #[case::localhost("localhost/m", "localhost", "m", None, false)]
    #[case::localhost_port("localhost:5000/m:1.0", "localhost:5000", "m", Some("1.0"), false)]
    #[case::ip("127.0.0.1:5000/m", "127.0.0.1:5000", "m", None, false)]
    #[case::separators("r.io/a.b_c-d/e_f:T_1.x-y", "r.io", "a.b_c-d/e_f", Some("T_1.x-y"), false)]
    // As the model plugin (and the distribution spec) read them.
    #[case::double_underscore_and_dash_runs("r.io/a/b-c__d.e/x---y", "r.io", "a/b-c__d.e/x---y", None, false)]
    #[case::upper_registry("Registry.Local/m", "Registry.Local", "m", None, false)]
    #[case::digest("r.io/m@sha256:HEX", "r.io", "m", None, true)]
    #[case::tag_and_digest("r.io/m:v2@sha256:HEX", "r.io", "m", Some("v2"), true)]
    fn good_references_parse(
        #[case] input: &str,
        #[case] registry: &str,
        #[case] repository: &str,
        #[case] tag: Option<&str>,
        #[case] has_digest: bool,
    ) {
        let input = input.replace("HEX", &hex());
        let r = OciRef::parse(&input).unwrap_or_else(|e| panic!("{input}: {e}"));
        assert_eq!((r.registry(), r.repository(), r.tag()), (registry, repository, tag), "{input}");
        let digest = format!("sha256:{}", hex());
        assert_eq!(r.digest(), has_digest.then_some(digest.as_str()), "{input}");
        assert_eq!(r.to_string(), input, "Display writes it back");
    }

    #[rstest]
    #[case::empty("", "printable ASCII")]
    #[case::space("r.io/m :1", "printable ASCII")]
    #[case::non_ascii("r.io/m\u{e9}", "printable ASCII")]
    #[case::no_registry("busybox", "must start with a registry")]
    #[case::implicit_hub("library/busybox:1", "must contain '.' or ':'")]
    #[case::bad_host("r_x.io/m", "is not host[:port]")]
    #[case::empty_label("r..io/m", "is not host[:port]")]
    #[case::dash_label("-r.io/m", "is not host[:port]")]
    #[case::port_zero("r.io:0/m", "is not host[:port]")]
    #[case::port_big("r.io:65536/m", "is not host[:port]")]
    #[case::port_empty("r.io:/m", "is not host[:port]")]
    #[case::port_leading_zero("r.io:080/m", "is not host[:port]")]
    #[case::ipv6("[::1]:5000/m", "is not host[:port]")]
    #[case::userinfo("user@r.io/m", "digest")]
    #[case::upper_repo("r.io/Model", "repository \"Model\"")]
    #[case::empty_repo("r.io/", "repository \"\"")]
    #[case::empty_component("r.io/a//b", "repository")]
    #[case::trailing_slash("r.io/a/", "repository")]
    #[case::double_separator("r.io/a..b", "repository")]
    #[case::triple_underscore("r.io/a___b", "repository")]
    #[case::mixed_separators("r.io/a-_b", "repository")]
    #[case::leading_separator("r.io/.a", "repository")]
    #[case::trailing_separator("r.io/a-", "repository")]
    #[case::dotdot("r.io/../etc", "repository")]
    #[case::empty_tag("r.io/m:", "tag \"\"")]
    #[case::tag_leading_dot("r.io/m:.x", "tag")]
    #[case::tag_leading_dash("r.io/m:-x", "tag")]
    #[case::tag_too_long(&format!("r.io/m:{}", "a".repeat(129)), "tag")]
    #[case::tag_slash("r.io/m:a/b", "tag \"a/b\"")]
    #[case::digest_upper("r.io/m@sha256:ABC", "digest")]
    #[case::digest_short("r.io/m@sha256:abc", "digest")]
    #[case::digest_algorithm("r.io/m@md5:abc", "digest")]
    #[case::two_ats("r.io/m@sha256:x@y", "digest")]
    fn bad_references_say_why(#[case] input: &str, #[case] reason: &str) {
        let err = OciRef::parse(input).unwrap_err();
        assert!(err.to_string().contains(reason), "{input:?}: {err}");
    }

    #[test]
    fn a_longest_tag_and_length_bounds() {
        assert!(OciRef::parse(&format!("r.io/m:_{}", "x".repeat(127))).is_ok());
        assert!(OciRef::parse(&format!("r.io/{}", "a".repeat(255))).is_ok());
        assert!(OciRef::parse(&format!("r.io/{}", "a".repeat(256))).is_err());
        assert_eq!(OciRef::parse(&format!("r.io/{}", "a/".repeat(600))), Err(OciRefError::Characters));
    }

    #[test]
    fn sha256_digests() {
        assert!(is_sha256(&format!("sha256:{}", hex())));
        assert!(!is_sha256(&format!("sha256:{}", hex().to_uppercase())));
        assert!(!is_sha256(&format!("sha512:{}", hex())));
        assert!(!is_sha256(&format!("sha256:{}0", hex())));
    }
}
