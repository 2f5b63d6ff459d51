//! OCI references (`registry[:port]/repository[:tag][@sha256:<hex>]`) and registry endpoints.
//!
//! The plugin parses the reference itself, so a StorageClass with a typo is refused at
//! CreateVolume, or at the first stage of an inline volume, with a message saying what is wrong,
//! rather than by a registry on every node. The grammar is the one registries enforce for
//! repository names, tags and digests, with one choice of ours: the registry is never implied.
//! `library/ubuntu` would mean Docker Hub to a container runtime; here the first component
//! must be a host (`docker.io/library/ubuntu`), so a reference always says where it pulls from.

use mounthost_plugin_sdk::BackendError;
use mounthost_plugin_sdk::net::{Port, check_host_port};
use mounthost_plugin_sdk::params::invalid;

/// The tag used when a reference has neither a tag nor a digest.
pub const DEFAULT_TAG: &str = "latest";

/// Longest `registry/repository`, as registries limit it.
pub const MAX_NAME: usize = 255;

/// Longest tag.
pub const MAX_TAG: usize = 128;

/// What the `reference` parameter accepts, for messages.
const ACCEPTED: &str = "registry[:port]/repository[:tag][@sha256:<64 hex>], such as \
                        registry.example.com/models/llama:3.1 or localhost:5000/bert@sha256:…; \
                        the registry is a DNS name with a dot, localhost, an IPv4 address or an \
                        [IPv6] address, with an optional port; repository components are lower-case \
                        letters and digits separated by ., _, __ or dashes; a tag is 1 to 128 of \
                        [A-Za-z0-9_.-], not starting with . or -";

/// A parsed, validated OCI reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// `host[:port]`, as given.
    pub registry: String,
    /// The repository path inside the registry (`models/llama`).
    pub repository: String,
    /// The tag, if given.
    pub tag: Option<String>,
    /// `sha256:<64 hex>`, if given.
    pub digest: Option<String>,
}

impl Reference {
    /// Parse `value`; `what` names its source in messages (`parameter "reference"`).
    pub fn parse(what: &str, value: &str) -> Result<Self, BackendError> {
        let bad = |why: &str| invalid(format!("{what} {value:?} is not an OCI reference ({why}); give {ACCEPTED}"));
        if value.is_empty() {
            return Err(bad("empty"));
        }
        if value.contains("://") {
            return Err(bad("no scheme: drop the http:// or https://; parameter \"insecure\" selects plain HTTP"));
        }
        if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(bad("it contains a space or a control character"));
        }
        let (name_tag, digest) = match value.split_once('@') {
            Some((n, d)) => (n, Some(d)),
            None => (value, None),
        };
        if let Some(d) = digest
            && !is_sha256_digest(d)
        {
            return Err(bad("the digest after @ must be sha256: and 64 lower-case hex digits"));
        }
        // A tag is after the last `:` that follows the last `/` (a `:` before it is a port).
        let last_slash = name_tag.rfind('/');
        let (name, tag) = match name_tag.rfind(':') {
            Some(colon) if last_slash.is_none_or(|s| colon > s) => (&name_tag[..colon], Some(&name_tag[colon + 1..])),
            _ => (name_tag, None),
        };
        let (registry, repository) =
            name.split_once('/').ok_or_else(|| bad("it needs a registry and a repository separated by /"))?;
        check_host_port(registry, Port::Optional).map_err(|why| bad(&format!("registry {registry:?}: {why}")))?;
        if !looks_like_registry(registry) {
            return Err(bad(&format!(
                "{registry:?} is not a registry host: it has no dot and no port and is not localhost; \
                 for Docker Hub write docker.io/{name}"
            )));
        }
        if repository.is_empty() {
            return Err(bad("the repository is empty"));
        }
        if let Some(c) = repository.split('/').find(|c| !is_path_component(c)) {
            return Err(bad(&format!(
                "repository component {c:?} is not lower-case letters and digits joined by ., _, __ or -"
            )));
        }
        if name.len() > MAX_NAME {
            return Err(bad(&format!("registry and repository are {} bytes, more than {MAX_NAME}", name.len())));
        }
        if let Some(t) = tag
            && !is_tag(t)
        {
            return Err(bad(&format!(
                "tag {t:?} is not 1 to {MAX_TAG} of [A-Za-z0-9_.-] starting with a letter, digit or _"
            )));
        }
        Ok(Reference {
            registry: registry.to_string(),
            repository: repository.to_string(),
            tag: tag.map(str::to_string),
            digest: digest.map(str::to_string),
        })
    }

    /// The reference as plans carry it: the tag defaults to [`DEFAULT_TAG`] unless a digest
    /// pins the content, so equal references give byte-identical plans.
    pub fn canonical(&self) -> String {
        let mut out = format!("{}/{}", self.registry, self.repository);
        match (&self.tag, &self.digest) {
            (Some(t), _) => out.push_str(&format!(":{t}")),
            (None, None) => out.push_str(&format!(":{DEFAULT_TAG}")),
            (None, Some(_)) => {}
        }
        if let Some(d) = &self.digest {
            out.push_str(&format!("@{d}"));
        }
        out
    }
}

/// `sha256:` and 64 lower-case hex digits.
pub fn is_sha256_digest(v: &str) -> bool {
    v.strip_prefix("sha256:")
        .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

/// A repository component: `[a-z0-9]+` runs joined by `.`, `_`, `__` or one or more `-`.
fn is_path_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        if !(sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-')) {
            return false;
        }
    }
    true
}

/// 1 to [`MAX_TAG`] of `[A-Za-z0-9_.-]`, the first a letter, digit or `_`.
fn is_tag(t: &str) -> bool {
    let ok = |x: u8| x.is_ascii_alphanumeric() || x == b'_' || x == b'.' || x == b'-';
    !t.is_empty()
        && t.len() <= MAX_TAG
        && (t.as_bytes()[0].is_ascii_alphanumeric() || t.as_bytes()[0] == b'_')
        && t.bytes().all(ok)
}

/// A registry host, as opposed to a Docker Hub namespace: it has a dot or a port, is
/// `localhost`, or is a bracketed IPv6 address.
fn looks_like_registry(registry: &str) -> bool {
    registry.contains('.') || registry.contains(':') || registry == "localhost" || registry.starts_with('[')
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[rstest]
    #[case("registry.example.com/models/llama:3.1", "registry.example.com", "models/llama", Some("3.1"), false)]
    #[case("localhost:5000/bert", "localhost:5000", "bert", None, false)]
    #[case("localhost/bert", "localhost", "bert", None, false)]
    #[case("127.0.0.1:5000/a/b-c__d.e:v1_X-y.z", "127.0.0.1:5000", "a/b-c__d.e", Some("v1_X-y.z"), false)]
    #[case("[::1]:5000/m:v1", "[::1]:5000", "m", Some("v1"), false)]
    #[case("[::1]/m", "[::1]", "m", None, false)]
    #[case("ghcr.io/org/a---b/c:_t", "ghcr.io", "org/a---b/c", Some("_t"), false)]
    fn good_references(
        #[case] v: &str,
        #[case] registry: &str,
        #[case] repository: &str,
        #[case] tag: Option<&str>,
        #[case] digest: bool,
    ) {
        let r = Reference::parse("p", v).unwrap();
        assert_eq!(r.registry, registry);
        assert_eq!(r.repository, repository);
        assert_eq!(r.tag.as_deref(), tag);
        assert_eq!(r.digest.is_some(), digest);
    }

    #[test]
    fn digests_and_the_default_tag() {
        let r = Reference::parse("p", &format!("reg.io:443/m/x@{D}")).unwrap();
        assert_eq!((r.tag.as_deref(), r.digest.as_deref()), (None, Some(D)));
        assert_eq!(r.canonical(), format!("reg.io:443/m/x@{D}"));
        let r = Reference::parse("p", &format!("reg.io/m:v2@{D}")).unwrap();
        assert_eq!(r.canonical(), format!("reg.io/m:v2@{D}"));
        assert_eq!(Reference::parse("p", "reg.io/m").unwrap().canonical(), "reg.io/m:latest");
        assert_eq!(Reference::parse("p", "reg.io/m:1").unwrap().canonical(), "reg.io/m:1");
    }

    #[rstest]
    #[case("", "empty")]
    #[case("https://reg.io/m", "no scheme")]
    #[case("reg.io/m :1", "space")]
    #[case("reg.io", "registry and a repository")]
    #[case("reg.io/", "repository is empty")]
    #[case("library/ubuntu", "docker.io/library/ubuntu")]
    #[case("reg.io/Models/x", "\"Models\"")]
    #[case("reg.io/a//b", "component \"\"")]
    #[case("reg.io/a/", "component \"\"")]
    #[case("reg.io/-a", "\"-a\"")]
    #[case("reg.io/a..b", "\"a..b\"")]
    #[case("reg.io/a___b", "\"a___b\"")]
    #[case("reg.io/m:", "tag \"\"")]
    #[case("reg.io/m:.x", "tag \".x\"")]
    #[case("reg.io/m:a/b", "component")]
    #[case("reg.io/m@sha256:abc", "digest")]
    #[case("reg.io/m@sha512:0123", "digest")]
    #[case("reg.io:0/m", "bad port")]
    #[case("reg.io:99999/m", "bad port")]
    #[case("reg.io:/m", "bad port")]
    #[case("re_g.io/m", "bad host name")]
    #[case("::1/m", "brackets")]
    #[case("[zz::1]:5000/m", "IPv6")]
    #[case("300.1.1.1/m", "IPv4")]
    fn bad_references(#[case] v: &str, #[case] says: &str) {
        let Err(BackendError::InvalidArgument(m)) = Reference::parse("parameter \"reference\"", v) else {
            panic!("{v:?} was accepted");
        };
        assert!(m.starts_with(&format!("parameter \"reference\" {v:?} is not an OCI reference")), "{m}");
        assert!(m.contains(says), "{v:?}: {m}");
    }

    #[test]
    fn long_names_are_refused() {
        let ok = format!("reg.io/{}", "a".repeat(MAX_NAME - 7));
        assert!(Reference::parse("p", &ok).is_ok());
        assert!(Reference::parse("p", &format!("{ok}b")).is_err());
        assert!(Reference::parse("p", &format!("reg.io/m:{}", "t".repeat(MAX_TAG))).is_ok());
        assert!(Reference::parse("p", &format!("reg.io/m:{}", "t".repeat(MAX_TAG + 1))).is_err());
    }
}
