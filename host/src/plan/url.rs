//! The one URL parser of plans. The policy judges a URL's host by what [`parse`] returns, and
//! the controller's HTTP client builds its request from the same [`Target`]
//! ([`Target::uri`]), so the host and port the policy approved are by construction the ones
//! the client connects to. Two parsers that disagree (one splitting strings, one parsing a
//! URI) let a plan get one host approved and reach another: `http://granted@evil/` is such a
//! URL.
//!
//! Syntax is `http::Uri`'s (the type hyper's connector reads the address from); on top of it
//! this module refuses what is ambiguous or dangerous instead of guessing:
//!
//! - userinfo (`user@`, `user:pw@`, `a@b@c`): credentials travel in headers with secret
//!   references, and `@` in the authority is where parsers disagree;
//! - backslashes, whitespace, control and non-ASCII characters anywhere in the URL (some
//!   parsers read `\` as `/`; host names are written in punycode, paths percent-encoded);
//! - empty hosts, percent-encoded hosts and IPv6 zone ids, and host names whose last label is
//!   a number (`127.1`, `0x7f.1`, `2130706433`): the resolver reads those as IPv4 addresses
//!   other than the text suggests; only dotted-decimal IPv4 addresses are taken as addresses;
//! - ports that are empty, signed, zero, above 65535 or followed by anything.
//!
//! Normalisation: scheme and host are lower-cased, IPv6 addresses written canonically
//! (`[0:0::1]` is `[::1]`), and the port made explicit (`http://h` is `http://h:80`). A
//! trailing dot is kept and is significant: `filer.` is the absolute DNS name, while `filer`
//! may be expanded through the pod's search domains, so each is granted only by itself. The
//! fragment is dropped (it is never sent), and an empty path becomes `/`.
//!
//! Pure: no I/O, no name resolution. A granted *name* still resolves through DNS when the
//! client connects; this module cannot and does not pin the address.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use http::Uri;
use http::uri::{Authority, PathAndQuery};

/// The schemes plans may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scheme {
    /// `http`, port 80 by default.
    Http,
    /// `https`, port 443 by default.
    Https,
}

impl Scheme {
    /// The port used when the URL names none.
    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }

    /// `http` or `https`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

/// A normalised host.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Host {
    /// A DNS name: lower case, labels of `[a-z0-9_-]`, a trailing dot kept.
    Name(String),
    /// A dotted-decimal IPv4 address.
    V4(Ipv4Addr),
    /// An IPv6 address (written in brackets).
    V6(Ipv6Addr),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::V4(a) => write!(f, "{a}"),
            Host::V6(a) => write!(f, "[{a}]"),
        }
    }
}

/// Where a URL goes: what the policy judges and what the client requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    scheme: Scheme,
    host: Host,
    port: u16,
    path_and_query: PathAndQuery,
}

impl Target {
    /// The scheme.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The normalised host.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The effective port (the scheme's default if the URL names none).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// What goes into the request line: path and query, without the fragment.
    pub fn path_and_query(&self) -> &str {
        self.path_and_query.as_str()
    }

    /// `host:port`, as judged by the policy and connected to by the client.
    pub fn authority(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// The request URI, with the port always explicit, so the connector needs no default.
    pub fn uri(&self) -> Uri {
        Uri::builder()
            .scheme(self.scheme.as_str())
            .authority(self.authority())
            .path_and_query(self.path_and_query.clone())
            .build()
            .expect("the parts of a parsed target form a URI")
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.uri())
    }
}

/// A grant of HTTP access: `host` (any port) or `host:port`, normalised like URL hosts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostGrant {
    host: Host,
    port: Option<u16>,
}

impl HostGrant {
    /// Parse `host`, `host:port`, `[v6]` or `[v6]:port` (config grants, endpoint values).
    pub fn parse(input: &str) -> Result<Self, UrlError> {
        characters(input)?;
        let authority =
            Authority::from_str(input).map_err(|e| UrlError::Syntax { input: input.into(), reason: e.to_string() })?;
        let (host, port) = host_port(input, &authority)?;
        Ok(HostGrant { host, port })
    }

    /// Whether this grant lets a plan reach `target`.
    pub fn allows(&self, target: &Target) -> bool {
        self.host == target.host && self.port.is_none_or(|p| p == target.port)
    }

    /// Whether this grant covers `asked`, a `host[:port]` a program argument names: the same
    /// host, and the same port unless this grant names none. A `host` asked without a port is
    /// judged by its name alone (its port, if any, is another argument's, judged by its own
    /// rule).
    pub fn covers(&self, asked: &HostGrant) -> bool {
        self.host == asked.host && (self.port.is_none() || asked.port.is_none() || self.port == asked.port)
    }
}

impl fmt::Display for HostGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(p) => write!(f, "{}:{p}", self.host),
            None => write!(f, "{}", self.host),
        }
    }
}

/// Why a URL or host was refused. Each variant names the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// A character no URL here may contain.
    #[error("{input:?} contains {what}; URLs must be printable ASCII without spaces or backslashes")]
    Character { input: String, what: &'static str },
    /// Not `http://` or `https://`.
    #[error("URL {input:?} must start with http:// or https://")]
    Scheme { input: String },
    /// `user@` or `user:password@` before the host.
    #[error("{input:?} carries userinfo (user@ or user:password@); use a header with a secret reference")]
    Userinfo { input: String },
    /// No host at all.
    #[error("{input:?} has no host")]
    EmptyHost { input: String },
    /// `%` in the host (percent-encoding, IPv6 zone ids).
    #[error("{input:?} has a percent-encoded host or an IPv6 zone id; write the host plainly")]
    PercentHost { input: String },
    /// A host that is not a plain name or address.
    #[error("{input:?} has an invalid host {host:?}: {why}")]
    Host { input: String, host: String, why: &'static str },
    /// A port that is not 1-65535 in decimal right after the host.
    #[error("{input:?} has an invalid port {port:?}; a port is 1-65535 in decimal")]
    Port { input: String, port: String },
    /// Not a URI at all.
    #[error("{input:?} is not a valid URL: {reason}")]
    Syntax { input: String, reason: String },
}

/// Parse an `http://` or `https://` URL into the target the policy judges and the client
/// requests, or refuse it (see the module documentation for the rules).
pub fn parse(input: &str) -> Result<Target, UrlError> {
    characters(input)?;
    let prefixed = |p: &str| input.get(..p.len()).is_some_and(|s| s.eq_ignore_ascii_case(p));
    if !(prefixed("http://") || prefixed("https://")) {
        return Err(UrlError::Scheme { input: input.into() });
    }
    let uri = Uri::from_str(input).map_err(|e| UrlError::Syntax { input: input.into(), reason: e.to_string() })?;
    let scheme = match uri.scheme_str() {
        Some("http") => Scheme::Http,
        Some("https") => Scheme::Https,
        _ => return Err(UrlError::Scheme { input: input.into() }),
    };
    let authority = uri.authority().ok_or_else(|| UrlError::EmptyHost { input: input.into() })?;
    let (host, port) = host_port(input, authority)?;
    let path_and_query = match uri.path_and_query() {
        Some(pq) if pq.as_str().starts_with('/') => pq.clone(),
        // `http://h?q` has a query but no path; the request line needs `/?q`.
        pq => PathAndQuery::from_str(&format!("/{}", pq.map_or("", PathAndQuery::as_str)))
            .map_err(|e| UrlError::Syntax { input: input.into(), reason: e.to_string() })?,
    };
    Ok(Target { scheme, host, port: port.unwrap_or(scheme.default_port()), path_and_query })
}

/// Refuse characters that parsers read differently or that have no place in a URL.
fn characters(input: &str) -> Result<(), UrlError> {
    let what = if input.contains('\\') {
        "a backslash"
    } else if input.chars().any(|c| c.is_whitespace() || c.is_control()) {
        "whitespace or a control character"
    } else if !input.is_ascii() {
        "a non-ASCII character (write host names in punycode and percent-encode paths)"
    } else {
        return Ok(());
    };
    Err(UrlError::Character { input: input.into(), what })
}

/// Host and explicit port of an authority, validated and normalised.
fn host_port(input: &str, authority: &Authority) -> Result<(Host, Option<u16>), UrlError> {
    let raw = authority.as_str();
    if raw.contains('@') {
        return Err(UrlError::Userinfo { input: input.into() });
    }
    if raw.contains('%') {
        return Err(UrlError::PercentHost { input: input.into() });
    }
    // Without userinfo the authority is `host` followed by the port part, if any.
    let text = authority.host();
    let rest = &raw[text.len()..];
    let port = match rest.strip_prefix(':') {
        None if rest.is_empty() => None,
        Some(p) if (1..=5).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()) => match p.parse::<u16>() {
            Ok(n) if n != 0 => Some(n),
            _ => return Err(UrlError::Port { input: input.into(), port: p.into() }),
        },
        _ => return Err(UrlError::Port { input: input.into(), port: rest.trim_start_matches(':').into() }),
    };
    Ok((host(input, text)?, port))
}

fn host(input: &str, text: &str) -> Result<Host, UrlError> {
    let bad = |why| UrlError::Host { input: input.into(), host: text.into(), why };
    if text.is_empty() {
        return Err(UrlError::EmptyHost { input: input.into() });
    }
    if let Some(v6) = text.strip_prefix('[') {
        let v6 = v6.strip_suffix(']').ok_or_else(|| bad("unbalanced brackets"))?;
        return v6.parse().map(Host::V6).map_err(|_| bad("not an IPv6 address"));
    }
    let name = text.to_ascii_lowercase();
    if let Ok(v4) = name.parse() {
        return Ok(Host::V4(v4));
    }
    let bare = name.strip_suffix('.').unwrap_or(&name);
    if bare.len() > 253 {
        return Err(bad("longer than 253 characters"));
    }
    for label in bare.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(bad("labels are 1-63 characters"));
        }
        if !label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            return Err(bad("host names are letters, digits, '-' and '_' in dot-separated labels"));
        }
    }
    let last = bare.rsplit('.').next().unwrap_or_default();
    let numeric = last.bytes().all(|b| b.is_ascii_digit())
        || last.strip_prefix("0x").is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
    if numeric {
        return Err(bad("it reads as a number; IPv4 addresses are accepted only in dotted-decimal form"));
    }
    Ok(Host::Name(name))
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    #[rstest]
    #[case::name("http://Filer.Example:8888/a?b#c", Scheme::Http, "filer.example", 8888, "/a?b")]
    #[case::default_http("HTTP://filer", Scheme::Http, "filer", 80, "/")]
    #[case::default_https("https://filer?x=1", Scheme::Https, "filer", 443, "/?x=1")]
    #[case::v6_canonical("http://[0:0::1]:8888/x", Scheme::Http, "[::1]", 8888, "/x")]
    #[case::v6_upper("http://[FE80::A]/", Scheme::Http, "[fe80::a]", 80, "/")]
    #[case::trailing_dot_kept("http://filer.example./", Scheme::Http, "filer.example.", 80, "/")]
    #[case::leading_zeros_in_port("http://filer:0080/", Scheme::Http, "filer", 80, "/")]
    fn urls_are_normalised(
        #[case] input: &str,
        #[case] scheme: Scheme,
        #[case] host: &str,
        #[case] port: u16,
        #[case] pq: &str,
    ) {
        let t = parse(input).unwrap();
        assert_eq!((t.scheme(), t.host().to_string(), t.port(), t.path_and_query()), (scheme, host.into(), port, pq));
        assert_eq!(t.uri().to_string(), format!("{}://{host}:{port}{pq}", scheme.as_str()));
        assert_eq!(parse(&t.to_string()).unwrap(), t, "parsing the canonical form gives the same target");
    }

    #[rstest]
    #[case::plus_port("http://h:+80/", "invalid port")]
    #[case::empty_port("http://h:/", "invalid port")]
    #[case::zero_port("http://h:0/", "invalid port")]
    #[case::big_port("http://h:99999/", "invalid port")]
    #[case::junk_after_v6("http://[::1]x/", "invalid port")]
    #[case::zone_id("http://[fe80::1%25eth0]/", "zone id")]
    #[case::octal_ipv4("http://0177.0.0.1/", "reads as a number")]
    #[case::short_ipv4("http://127.1/", "reads as a number")]
    #[case::hex_ipv4("http://0x7f.0.0.1/", "reads as a number")]
    #[case::integer_ipv4("http://2130706433/", "reads as a number")]
    #[case::ipv4_trailing_dot("http://127.0.0.1./", "reads as a number")]
    #[case::empty_label("http://a..b/", "labels are 1-63")]
    #[case::only_dot("http://./", "labels are 1-63")]
    #[case::sub_delims("http://a!b/", "letters, digits")]
    #[case::idn("http://b\u{fc}cher.example/", "non-ASCII")]
    #[case::tab("http://fil\ter/", "control character")]
    #[case::no_authority("http:/filer/", "must start with http://")]
    #[case::scheme_only("http:filer", "must start with http://")]
    fn odd_urls_are_refused(#[case] input: &str, #[case] reason: &str) {
        let err = parse(input).unwrap_err();
        assert!(err.to_string().contains(reason), "{input}: {err}");
    }

    #[rstest]
    #[case::any_port("Filer", "filer", "http://filer:1234/", true)]
    #[case::same_port("filer:8888", "filer:8888", "http://FILER:8888/", true)]
    #[case::other_port("filer:8888", "filer:8888", "http://filer/", false)]
    #[case::default_port("filer:80", "filer:80", "http://filer/", true)]
    #[case::v6("[0::1]:2", "[::1]:2", "http://[::1]:2/", true)]
    #[case::dot_differs("filer", "filer", "http://filer./", false)]
    #[case::dot_granted("filer.", "filer.", "http://filer./", true)]
    fn grants_match_normalised_targets(
        #[case] grant: &str,
        #[case] shown: &str,
        #[case] url: &str,
        #[case] allowed: bool,
    ) {
        let g = HostGrant::parse(grant).unwrap();
        assert_eq!(g.to_string(), shown);
        assert_eq!(g.allows(&parse(url).unwrap()), allowed, "{grant} / {url}");
    }

    #[rstest]
    #[case("user@filer")]
    #[case("filer:8888/x")]
    #[case("::1")]
    #[case("filer:")]
    #[case("")]
    #[case("http://filer")]
    fn bad_grants_grant_nothing(#[case] grant: &str) {
        assert!(HostGrant::parse(grant).is_err(), "{grant}");
    }
}
