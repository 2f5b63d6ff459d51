//! Typed access to the `list<kv>` maps the host sends (parameters, context, secrets), and the
//! table of keys a plugin documents.
//!
//! Every error is `invalid-argument` and names the key and what would be accepted, because
//! the person reading it is writing a StorageClass.
//!
//! A plugin lists every key it reads once, as a `&[ParamSpec]` table: [`param_docs`] turns it
//! into what `info()` returns and [`known`] into what [`Params::check_known`] accepts, so the
//! documentation and the behaviour cannot drift apart.

use crate::{BackendError, Kv, ParamDoc, ParamKind, ParamSource};

/// Build an `invalid-argument` error.
pub fn invalid(message: impl Into<String>) -> BackendError {
    BackendError::InvalidArgument(message.into())
}

/// The longest URL [`Params::url`] accepts, in bytes.
pub const MAX_URL: usize = 2048;

/// A read-only view of one key/value list.
#[derive(Debug, Clone)]
pub struct Params<'a> {
    /// What the list is, for messages: "parameter", "secret", ...
    what: &'static str,
    kvs: &'a [Kv],
}

impl<'a> Params<'a> {
    /// Wrap a list; a key given twice is an error.
    pub fn new(what: &'static str, kvs: &'a [Kv]) -> Result<Self, BackendError> {
        for (i, kv) in kvs.iter().enumerate() {
            if kvs[..i].iter().any(|earlier| earlier.key == kv.key) {
                return Err(invalid(format!("{what} {:?} is given twice", kv.key)));
            }
        }
        Ok(Params { what, kvs })
    }

    /// The raw value, if the key is present.
    pub fn get(&self, key: &str) -> Option<&'a str> {
        self.kvs.iter().find(|kv| kv.key == key).map(|kv| kv.value.as_str())
    }

    /// True if the key is present.
    pub fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// A non-empty text value.
    pub fn text(&self, key: &str) -> Result<Option<&'a str>, BackendError> {
        match self.get(key) {
            None => Ok(None),
            Some("") => {
                Err(invalid(format!("{} {key:?} is empty; remove it to use the default or give a value", self.what)))
            }
            Some(v) if v.chars().any(char::is_control) => {
                Err(invalid(format!("{} {key:?} contains a control character", self.what)))
            }
            Some(v) => Ok(Some(v)),
        }
    }

    /// A required non-empty text value.
    pub fn required(&self, key: &str) -> Result<&'a str, BackendError> {
        self.text(key)?.ok_or_else(|| invalid(format!("{} {key:?} is required", self.what)))
    }

    /// `true` or `false` (exactly, lowercase, as Kubernetes writes them).
    pub fn boolean(&self, key: &str) -> Result<Option<bool>, BackendError> {
        match self.text(key)? {
            None => Ok(None),
            Some("true") => Ok(Some(true)),
            Some("false") => Ok(Some(false)),
            Some(v) => Err(invalid(format!("{} {key:?} must be \"true\" or \"false\", not {v:?}", self.what))),
        }
    }

    /// A whole decimal number within `min..=max`.
    pub fn integer(&self, key: &str, min: u64, max: u64) -> Result<Option<u64>, BackendError> {
        let Some(v) = self.text(key)? else { return Ok(None) };
        let n = if v.bytes().all(|b| b.is_ascii_digit()) { v.parse::<u64>().ok() } else { None };
        match n {
            Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ => Err(invalid(format!("{} {key:?} must be a whole number from {min} to {max}, not {v:?}", self.what))),
        }
    }

    /// One of `allowed`.
    pub fn choice(&self, key: &str, allowed: &[&str]) -> Result<Option<&'a str>, BackendError> {
        match self.text(key)? {
            None => Ok(None),
            Some(v) if allowed.contains(&v) => Ok(Some(v)),
            Some(v) => Err(invalid(format!("{} {key:?} must be one of {}, not {v:?}", self.what, allowed.join(", ")))),
        }
    }

    /// An `http://` or `https://` URL (kind [`ParamKind::Url`]): a host (a DNS name, a
    /// dotted IPv4 address or a bracketed IPv6 one) and an optional port, then an optional path
    /// and query; no credentials (`user@`: give them as secrets), no fragment, no backslash, no
    /// space, control or non-ASCII character (percent-encode them), at most 2048 bytes. The host
    /// judges a URL again with its own parser before a step uses it.
    pub fn url(&self, key: &str) -> Result<Option<&'a str>, BackendError> {
        let Some(v) = self.text(key)? else { return Ok(None) };
        let bad =
            |why: &str| invalid(format!("{} {key:?} must be an http:// or https:// URL {why}, not {v:?}", self.what));
        if v.len() > MAX_URL {
            return Err(bad(&format!("of at most {MAX_URL} bytes")));
        }
        if !v.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(bad("without spaces, control or non-ASCII characters (percent-encode them)"));
        }
        let rest = v
            .strip_prefix("http://")
            .or_else(|| v.strip_prefix("https://"))
            .ok_or_else(|| bad("(it starts with neither, in lower case)"))?;
        let (authority, tail) = rest.split_at(rest.find(['/', '?', '#']).unwrap_or(rest.len()));
        if authority.contains('@') {
            return Err(bad("without credentials (user@): give them as secrets"));
        }
        if tail.contains('#') || tail.contains('\\') {
            return Err(bad("without a fragment (#) or a backslash"));
        }
        crate::net::check_host_port(authority, crate::net::Port::Optional)
            .map_err(|e| bad(&format!("whose host[:port] is valid ({e})")))?;
        Ok(Some(v))
    }

    /// Reject keys that are not documented for `source`. `known` lists each documented key
    /// with where it may come from (a static table, so this allocates nothing on success).
    /// Keys with a `/` belong to the container orchestrator (`csi.storage.k8s.io/pvc/name`,
    /// ...) and are ignored.
    pub fn check_known<'n, I>(&self, known: I, source: ParamSource) -> Result<(), BackendError>
    where
        I: IntoIterator<Item = (&'n str, ParamSource)>,
        I::IntoIter: Clone,
    {
        let known = known.into_iter();
        for kv in self.kvs {
            if kv.key.contains('/') {
                continue;
            }
            if !known.clone().any(|(name, from)| name == kv.key && accepts(from, source)) {
                let mut names: Vec<&str> =
                    known.clone().filter(|(_, from)| accepts(*from, source)).map(|(n, _)| n).collect();
                names.sort_unstable();
                return Err(invalid(format!("unknown {} {:?}; accepted: {}", self.what, kv.key, names.join(", "))));
            }
        }
        Ok(())
    }
}

/// One documented key: a row of a plugin's parameter table.
///
/// The constructors and setters are `const`, so a table is a `const` slice:
/// `ParamSpec::parameter("filer", ParamKind::Endpoint, None, "Filer.").required()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ParamSpec {
    /// The exact key.
    pub name: &'static str,
    /// What the value holds.
    pub kind: ParamKind,
    /// Where it may come from.
    pub source: ParamSource,
    /// Whether a request without it is refused.
    pub required: bool,
    /// The value used when it is absent, as text.
    pub default: Option<&'static str>,
    /// One line of documentation.
    pub doc: &'static str,
}

impl ParamSpec {
    /// An optional StorageClass parameter (also accepted in the volume context).
    pub const fn parameter(
        name: &'static str,
        kind: ParamKind,
        default: Option<&'static str>,
        doc: &'static str,
    ) -> Self {
        ParamSpec { name, kind, source: ParamSource::Parameter, required: false, default, doc }
    }

    /// An optional text secret.
    pub const fn secret(name: &'static str, doc: &'static str) -> Self {
        ParamSpec { name, kind: ParamKind::Text, source: ParamSource::Secret, required: false, default: None, doc }
    }

    /// The same key, required.
    #[must_use]
    pub const fn required(mut self) -> Self {
        self.required = true;
        self
    }

    /// The same key, from `source`.
    #[must_use]
    pub const fn from_source(mut self, source: ParamSource) -> Self {
        self.source = source;
        self
    }

    /// The same key, holding a `kind`.
    #[must_use]
    pub const fn with_kind(mut self, kind: ParamKind) -> Self {
        self.kind = kind;
        self
    }
}

/// The table as the WIT `param-doc` records `info()` returns, in table order.
pub fn param_docs(specs: &[ParamSpec]) -> Vec<ParamDoc> {
    specs
        .iter()
        .map(|s| ParamDoc {
            name: s.name.into(),
            doc: s.doc.into(),
            kind: s.kind,
            source: s.source,
            required: s.required,
            default_value: s.default.map(Into::into),
        })
        .collect()
}

/// Every documented key with its source, as [`Params::check_known`] takes them.
pub fn known(specs: &[ParamSpec]) -> impl Iterator<Item = (&'static str, ParamSource)> + Clone + '_ {
    specs.iter().map(|s| (s.name, s.source))
}

/// Parameters documented as StorageClass parameters may also arrive through the volume context
/// (provisioning copies them there), so a context list accepts both.
fn accepts(doc: ParamSource, list: ParamSource) -> bool {
    doc == list || (list == ParamSource::Context && doc == ParamSource::Parameter)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv;

    #[test]
    fn duplicate_keys_are_rejected() {
        let kvs = [kv("a", "1"), kv("a", "2")];
        let err = Params::new("parameter", &kvs).unwrap_err();
        assert_eq!(err, invalid("parameter \"a\" is given twice"));
    }

    #[test]
    fn typed_values() {
        let kvs = [kv("b", "true"), kv("n", "12"), kv("bad", "1x"), kv("c", "x"), kv("e", "")];
        let p = Params::new("parameter", &kvs).unwrap();
        assert_eq!(p.boolean("b").unwrap(), Some(true));
        assert_eq!(p.boolean("missing").unwrap(), None);
        assert!(p.boolean("n").is_err());
        assert_eq!(p.integer("n", 1, 12).unwrap(), Some(12));
        assert!(p.integer("n", 1, 11).is_err());
        assert!(p.integer("bad", 0, 100).is_err());
        assert_eq!(p.choice("c", &["x", "y"]).unwrap(), Some("x"));
        assert!(p.choice("c", &["y"]).is_err());
        assert!(p.text("e").is_err());
        assert!(p.required("missing").is_err());
    }

    #[test]
    fn urls_are_http_with_a_host_and_nothing_ambiguous() {
        let ok =
            ["http://dav.example:8080/remote.php/dav", "https://10.0.0.1", "http://[::1]:9000/b?x=1", "https://s3.io/"];
        for v in ok {
            let kvs = [kv("u", v)];
            assert_eq!(Params::new("parameter", &kvs).unwrap().url("u").unwrap(), Some(v), "{v}");
        }
        let long = format!("http://h/{}", "a".repeat(MAX_URL));
        let bad = [
            ("ftp://h/", "neither"),
            ("HTTP://h/", "neither"),
            ("h:80", "neither"),
            ("http://user:pw@h/", "credentials"),
            ("http://h/x#frag", "fragment"),
            ("http://h/a b", "spaces"),
            ("http://h/é", "non-ASCII"),
            ("http://h\\evil/", "host[:port]"),
            ("http:///x", "host[:port]"),
            ("http://h:0/", "host[:port]"),
            ("http://h:99999/", "host[:port]"),
            ("http://1.2.3/", "host[:port]"),
            (long.as_str(), "at most"),
        ];
        for (v, says) in bad {
            let kvs = [kv("u", v)];
            let err = Params::new("parameter", &kvs).unwrap().url("u").unwrap_err();
            assert!(
                matches!(&err, BackendError::InvalidArgument(m) if m.contains(says) && m.contains("\"u\"")),
                "{v}: {err:?}"
            );
        }
        assert_eq!(Params::new("parameter", &[]).unwrap().url("u").unwrap(), None);
    }

    #[test]
    fn unknown_keys_name_the_accepted_ones() {
        let docs = [("filer", ParamSource::Parameter), ("key", ParamSource::Secret)];
        let kvs = [kv("filer", "x"), kv("csi.storage.k8s.io/pvc/name", "p"), kv("filr", "y")];
        let p = Params::new("parameter", &kvs).unwrap();
        let err = p.check_known(docs, ParamSource::Parameter).unwrap_err();
        assert_eq!(err, invalid("unknown parameter \"filr\"; accepted: filer"));
        let ctx = [kv("filer", "x")];
        assert!(Params::new("context", &ctx).unwrap().check_known(docs, ParamSource::Context).is_ok());
    }

    const SPECS: &[ParamSpec] = &[
        ParamSpec::parameter("filer", ParamKind::Endpoint, None, "Filer.").required(),
        ParamSpec::parameter("path", ParamKind::RemotePath, None, "Path.").from_source(ParamSource::Context),
        ParamSpec::parameter("umask", ParamKind::Text, Some("022"), "Umask."),
        ParamSpec::secret("key", "Key."),
    ];

    #[test]
    fn a_table_documents_and_checks_the_same_keys() {
        let docs = param_docs(SPECS);
        let rows: Vec<_> =
            docs.iter().map(|d| (d.name.as_str(), d.source, d.required, d.default_value.as_deref())).collect();
        assert_eq!(
            rows,
            [
                ("filer", ParamSource::Parameter, true, None),
                ("path", ParamSource::Context, false, None),
                ("umask", ParamSource::Parameter, false, Some("022")),
                ("key", ParamSource::Secret, false, None),
            ]
        );
        assert_eq!((docs[3].kind, docs[3].doc.as_str()), (ParamKind::Text, "Key."));

        let sc = [kv("filer", "a:1"), kv("path", "/p")];
        let err = Params::new("parameter", &sc).unwrap().check_known(known(SPECS), ParamSource::Parameter).unwrap_err();
        assert_eq!(err, invalid("unknown parameter \"path\"; accepted: filer, umask"));
        let ctx = Params::new("context", &sc).unwrap();
        assert!(ctx.check_known(known(SPECS), ParamSource::Context).is_ok());
        let secrets = [kv("key", "k")];
        assert!(Params::new("secret", &secrets).unwrap().check_known(known(SPECS), ParamSource::Secret).is_ok());
    }
}
